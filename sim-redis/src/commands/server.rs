//! Keyless commands that any client (a script's too) may send: `PING`,
//! `ECHO`, `TIME`, `SELECT`, `PUBLISH`, `SPUBLISH`.

use crate::ctx::Ctx;
use crate::number::parse_i64;
use crate::pubsub::MessageKind;
use crate::reply::{errors, Reply};

/// The number of databases of a node.
pub(crate) const DATABASES: usize = 16;

pub(super) fn ping(_ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match args.len() {
        1 => Reply::Status("PONG".to_owned()),
        2 => Reply::Bulk(args[1].clone()),
        _ => Reply::Error(errors::arity("ping")),
    }
}

pub(super) fn echo(_ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Bulk(args[1].clone())
}

/// The node's clock: seconds and microseconds.
pub(super) fn time(ctx: &mut Ctx, _args: &[Vec<u8>]) -> Reply {
    let now = ctx.clock.now_us;
    Reply::Array(vec![
        Reply::Bulk(now.div_euclid(1_000_000).to_string().into_bytes()),
        Reply::Bulk(now.rem_euclid(1_000_000).to_string().into_bytes()),
    ])
}

pub(super) fn select(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(db) = parse_i64(&args[1]).filter(|db| i32::try_from(*db).is_ok()) else {
        return Reply::err(errors::NOT_INTEGER);
    };
    if ctx.cluster && db != 0 {
        return Reply::err("ERR SELECT is not allowed in cluster mode");
    }
    if db < 0 || db as usize >= DATABASES {
        return Reply::err("ERR DB index is out of range");
    }
    *ctx.db = db as usize;
    Reply::Ok
}

pub(super) fn publish(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(ctx.publish(MessageKind::Message, &args[1], &args[2]))
}

pub(super) fn spublish(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    Reply::Int(ctx.publish(MessageKind::SMessage, &args[1], &args[2]))
}
