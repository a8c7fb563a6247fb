//! Strings: `GET`, `SET` (every option of 7.0), and the conditional deletes
//! of newer servers (`DELIFEQ`, `DELEX ... IFEQ`).

use super::{int_arg, is, wrongtype};
use crate::config::Flavour;
use crate::ctx::Ctx;
use crate::keyspace::{Data, Entry};
use crate::reply::{errors, Reply};

pub(super) fn get(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match ctx.entry(&args[1]) {
        None => Reply::Nil,
        Some(Entry {
            data: Data::Str(value),
            ..
        }) => Reply::Bulk(value.clone()),
        Some(_) => wrongtype(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expire {
    Ex,
    Px,
    ExAt,
    PxAt,
}

pub(super) fn set(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut get_old, mut keepttl) = (false, false, false, false);
    let mut expire: Option<(Expire, &[u8])> = None;
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let next = args.get(j + 1);
        let kind = expire.map(|(kind, _)| kind);
        let other_expire = |this: Expire| kind.is_some_and(|k| k != this);
        if is(opt, "nx") && !xx {
            nx = true;
        } else if is(opt, "xx") && !nx {
            xx = true;
        } else if is(opt, "get") {
            get_old = true;
        } else if is(opt, "keepttl") && kind.is_none() {
            keepttl = true;
        } else if let (Some(this), Some(next)) = (expire_word(opt), next) {
            if keepttl || other_expire(this) {
                return Reply::err(errors::SYNTAX);
            }
            expire = Some((this, next));
            j += 1;
        } else {
            return Reply::err(errors::SYNTAX);
        }
        j += 1;
    }
    let mut when_ms = None;
    if let Some((kind, arg)) = expire {
        let value = match int_arg(arg) {
            Ok(value) => value,
            Err(error) => return error,
        };
        let seconds = matches!(kind, Expire::Ex | Expire::ExAt);
        if value <= 0 || (seconds && value > i64::MAX / 1000) {
            return Reply::err("ERR invalid expire time in 'set' command");
        }
        let mut ms = if seconds { value * 1000 } else { value };
        if matches!(kind, Expire::Ex | Expire::Px) {
            ms = ms.wrapping_add(ctx.clock.now_ms());
        }
        if ms <= 0 {
            return Reply::err("ERR invalid expire time in 'set' command");
        }
        when_ms = Some(ms);
    }
    let key = &args[1];
    let mut old = Reply::Nil;
    let found = match ctx.entry(key) {
        None => false,
        Some(Entry {
            data: Data::Str(value),
            ..
        }) => {
            if get_old {
                old = Reply::Bulk(value.clone());
            }
            true
        }
        Some(_) if get_old => return wrongtype(),
        Some(_) => true,
    };
    if (nx && found) || (xx && !found) {
        return if get_old { old } else { Reply::Nil };
    }
    let kept = if keepttl {
        ctx.entry(key).and_then(|entry| entry.expire_ms)
    } else {
        None
    };
    ctx.insert(
        key,
        Entry {
            data: Data::Str(args[2].clone()),
            expire_ms: when_ms.or(kept),
        },
    );
    // Propagated as `SET key value PXAT <ms>` when an expiry was given;
    // otherwise as sent, without GET.
    let effect = match when_ms {
        Some(ms) => vec![
            b"SET".to_vec(),
            key.clone(),
            args[2].clone(),
            b"PXAT".to_vec(),
            ms.to_string().into_bytes(),
        ],
        None => args
            .iter()
            .enumerate()
            .filter(|(at, arg)| *at < 3 || !is(arg, "get"))
            .map(|(_, arg)| arg.clone())
            .collect(),
    };
    ctx.propagate(effect);
    if get_old {
        old
    } else {
        Reply::Ok
    }
}

fn expire_word(opt: &[u8]) -> Option<Expire> {
    if is(opt, "ex") {
        Some(Expire::Ex)
    } else if is(opt, "px") {
        Some(Expire::Px)
    } else if is(opt, "exat") {
        Some(Expire::ExAt)
    } else if is(opt, "pxat") {
        Some(Expire::PxAt)
    } else {
        None
    }
}

/// Deletes `key` if it holds the string `value`: 1 if it did, 0 if not,
/// `WRONGTYPE` for another type.
fn delete_if_equal(ctx: &mut Ctx, key: &[u8], value: &[u8], equal: bool) -> Reply {
    let matched = match ctx.entry(key) {
        None => return Reply::Int(0),
        Some(Entry {
            data: Data::Str(held),
            ..
        }) => (held.as_slice() == value) == equal,
        Some(_) => return wrongtype(),
    };
    if !matched {
        return Reply::Int(0);
    }
    ctx.delete(key);
    ctx.propagate(vec![b"DEL".to_vec(), key.to_vec()]);
    Reply::Int(1)
}

/// Valkey 9's `DELIFEQ key value`.
pub(super) fn delifeq(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if ctx.flavour != Flavour::Valkey9 {
        return super::unknown_command(args);
    }
    delete_if_equal(ctx, &args[1], &args[2], true)
}

/// Redis 8.4's `DELEX key [IFEQ value | IFNE value]` (the digest forms,
/// `IFDEQ`/`IFDNE`, are not modelled).
pub(super) fn delex(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if ctx.flavour != Flavour::Redis84 {
        return super::unknown_command(args);
    }
    match args.len() {
        2 => {
            let deleted = ctx.delete(&args[1]);
            if deleted {
                ctx.propagate(vec![b"DEL".to_vec(), args[1].clone()]);
            }
            Reply::Int(deleted as i64)
        }
        4 if is(&args[2], "ifeq") => delete_if_equal(ctx, &args[1], &args[3], true),
        4 if is(&args[2], "ifne") => delete_if_equal(ctx, &args[1], &args[3], false),
        _ => Reply::err(errors::SYNTAX),
    }
}
