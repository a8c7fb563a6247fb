//! Generic key commands: `DEL`/`UNLINK`, `EXISTS`, `TYPE`, `TTL`/`PTTL`,
//! the `EXPIRE` family, `PERSIST`, `SCAN`, `DBSIZE`, `FLUSHALL`/`FLUSHDB`.

use super::{int_arg, is};
use crate::ctx::Ctx;
use crate::glob;
use crate::keyspace::ExpireMode;
use crate::number::parse_i64;
use crate::reply::{errors, Reply};

pub(super) fn del(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let mut deleted = 0;
    for key in &args[1..] {
        if ctx.delete(key) {
            deleted += 1;
        }
    }
    if deleted > 0 {
        ctx.propagate(args.to_vec());
    }
    Reply::Int(deleted)
}

pub(super) fn exists(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let mut found = 0;
    for key in &args[1..] {
        if ctx.entry(key).is_some() {
            found += 1;
        }
    }
    Reply::Int(found)
}

pub(super) fn type_of(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let name = ctx
        .entry(&args[1])
        .map_or("none", |entry| entry.data.type_name());
    Reply::Status(name.to_owned())
}

fn ttl_generic(ctx: &mut Ctx, args: &[Vec<u8>], ms: bool) -> Reply {
    let now = ctx.clock.now_ms();
    let Some(entry) = ctx.entry(&args[1]) else {
        return Reply::Int(-2);
    };
    match entry.expire_ms {
        None => Reply::Int(-1),
        Some(when) => {
            let ttl = (when - now).max(0);
            Reply::Int(if ms { ttl } else { (ttl + 500) / 1000 })
        }
    }
}

pub(super) fn ttl(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ttl_generic(ctx, args, false)
}

pub(super) fn pttl(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    ttl_generic(ctx, args, true)
}

/// `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT` (with NX, XX, GT, LT):
/// `relative` adds the node's time; `seconds` multiplies by 1000.
/// Propagated as `PEXPIREAT`, or as `DEL` when the time is already past.
fn expire_generic(ctx: &mut Ctx, args: &[Vec<u8>], relative: bool, seconds: bool) -> Reply {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &args[3..] {
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            return Reply::err(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(opt)
            ));
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::err("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::err("ERR GT and LT options at the same time are not compatible");
    }
    let mut when = match int_arg(&args[2]) {
        Ok(when) => when,
        Err(error) => return error,
    };
    let invalid = || Reply::err(format!("ERR invalid expire time in '{name}' command"));
    if seconds {
        if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
            return invalid();
        }
        when *= 1000;
    }
    let base = if relative { ctx.clock.now_ms() } else { 0 };
    if when > i64::MAX - base {
        return invalid();
    }
    when += base;
    let key = &args[1];
    let clock = ctx.clock;
    let Some(entry) = ctx.entry(key) else {
        return Reply::Int(0);
    };
    let current = entry.expire_ms;
    if (nx && current.is_some())
        || (xx && current.is_none())
        || (gt && current.is_none_or(|current| when <= current))
        || (lt && current.is_some_and(|current| when >= current))
    {
        return Reply::Int(0);
    }
    // On a primary a time already past deletes the key (a replica keeps
    // it, expired, until its primary's DEL).
    if when <= clock.now_ms() && clock.mode == ExpireMode::Delete {
        ctx.db().remove(key);
        ctx.propagate(vec![b"DEL".to_vec(), key.clone()]);
        return Reply::Int(1);
    }
    if let Some(entry) = ctx.entry(key) {
        entry.expire_ms = Some(when);
    }
    let mut effect = vec![
        b"PEXPIREAT".to_vec(),
        key.clone(),
        when.to_string().into_bytes(),
    ];
    effect.extend(args[3..].iter().cloned());
    ctx.propagate(effect);
    Reply::Int(1)
}

pub(super) fn expire(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    expire_generic(ctx, args, true, true)
}

pub(super) fn pexpire(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    expire_generic(ctx, args, true, false)
}

pub(super) fn expireat(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    expire_generic(ctx, args, false, true)
}

pub(super) fn pexpireat(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    expire_generic(ctx, args, false, false)
}

pub(super) fn persist(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(entry) = ctx.entry(&args[1]) else {
        return Reply::Int(0);
    };
    if entry.expire_ms.take().is_none() {
        return Reply::Int(0);
    }
    ctx.propagate(args.to_vec());
    Reply::Int(1)
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`. The cursor
/// is the simulator's own (a resume point kept by the database): the keys
/// come in byte order, `count` of them looked at per call; a key present
/// during the whole iteration is returned once. An expired key met on the
/// way is deleted, as Redis does.
pub(super) fn scan(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(cursor) = std::str::from_utf8(&args[1])
        .ok()
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<u64>().ok())
    else {
        return Reply::err("ERR invalid cursor");
    };
    let mut count: i64 = 10;
    let mut pattern: Option<&[u8]> = None;
    let mut type_filter: Option<String> = None;
    let mut i = 2;
    while i < args.len() {
        let left = args.len() - i;
        if is(&args[i], "count") && left >= 2 {
            count = match parse_i64(&args[i + 1]) {
                Some(count) => count,
                None => return Reply::err(errors::NOT_INTEGER),
            };
            if count < 1 {
                return Reply::err(errors::SYNTAX);
            }
        } else if is(&args[i], "match") && left >= 2 {
            pattern = Some(&args[i + 1])
                .map(|p| p.as_slice())
                .filter(|p| *p != b"*");
        } else if is(&args[i], "type") && left >= 2 {
            type_filter = Some(String::from_utf8_lossy(&args[i + 1]).to_ascii_lowercase());
        } else {
            return Reply::err(errors::SYNTAX);
        }
        i += 2;
    }
    let start = if cursor == 0 {
        Some(Vec::new())
    } else {
        ctx.db().cursor(cursor)
    };
    let Some(start) = start else {
        // A cursor never handed out (or forgotten): nothing more.
        return Reply::Array(vec![Reply::bulk(*b"0"), Reply::Array(Vec::new())]);
    };
    let batch = ctx.db().raw_keys_from(&start, count as usize + 1);
    let (visit, next) = if batch.len() > count as usize {
        (
            &batch[..count as usize],
            Some(batch[count as usize].clone()),
        )
    } else {
        (&batch[..], None)
    };
    let mut found = Vec::new();
    for key in visit {
        let Some(entry) = ctx.entry(key) else {
            continue;
        };
        if type_filter
            .as_deref()
            .is_some_and(|wanted| entry.data.type_name() != wanted)
        {
            continue;
        }
        if pattern.is_some_and(|pattern| !glob::matches(pattern, key)) {
            continue;
        }
        found.push(Reply::Bulk(key.clone()));
    }
    let next = match next {
        Some(resume) => ctx.db().add_cursor(resume),
        None => 0,
    };
    Reply::Array(vec![
        Reply::Bulk(next.to_string().into_bytes()),
        Reply::Array(found),
    ])
}

/// The number of live keys (Redis 7.0 counts keys whose time has passed
/// until its active expiry reclaims them, within about a second).
pub(super) fn dbsize(ctx: &mut Ctx, _args: &[Vec<u8>]) -> Reply {
    let clock = ctx.clock;
    Reply::Int(ctx.db().live(&clock).count() as i64)
}

fn flush_mode(args: &[Vec<u8>]) -> Result<(), Reply> {
    match args.len() {
        1 => Ok(()),
        2 if is(&args[1], "sync") || is(&args[1], "async") => Ok(()),
        _ => Err(Reply::err(errors::SYNTAX)),
    }
}

pub(super) fn flushall(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if let Err(error) = flush_mode(args) {
        return error;
    }
    for db in ctx.dbs.iter_mut() {
        db.clear();
    }
    ctx.propagate(args.to_vec());
    Reply::Ok
}

pub(super) fn flushdb(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if let Err(error) = flush_mode(args) {
        return error;
    }
    ctx.db().clear();
    ctx.propagate(args.to_vec());
    Reply::Ok
}
