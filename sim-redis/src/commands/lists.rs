//! Lists: `RPUSH`, `LPUSH`, `LPOP`, `RPOP`, `LREM`, `LINDEX`, `LRANGE`,
//! `LLEN`.

use std::collections::VecDeque;

use super::{int_arg, wrongtype};
use crate::ctx::Ctx;
use crate::keyspace::{Data, Entry};
use crate::reply::Reply;

/// The list at `key`: `Ok(None)` if there is no key, `Err` for another type.
fn list<'a>(ctx: &'a mut Ctx, key: &[u8]) -> Result<Option<&'a mut VecDeque<Vec<u8>>>, Reply> {
    match ctx.entry(key) {
        None => Ok(None),
        Some(Entry {
            data: Data::List(list),
            ..
        }) => Ok(Some(list)),
        Some(_) => Err(wrongtype()),
    }
}

fn push(ctx: &mut Ctx, args: &[Vec<u8>], front: bool) -> Reply {
    let key = &args[1];
    let len = match list(ctx, key) {
        Err(error) => return error,
        Ok(Some(list)) => {
            for value in &args[2..] {
                if front {
                    list.push_front(value.clone());
                } else {
                    list.push_back(value.clone());
                }
            }
            list.len()
        }
        Ok(None) => {
            let mut list = VecDeque::with_capacity(args.len() - 2);
            for value in &args[2..] {
                if front {
                    list.push_front(value.clone());
                } else {
                    list.push_back(value.clone());
                }
            }
            let len = list.len();
            ctx.insert(
                key,
                Entry {
                    data: Data::List(list),
                    expire_ms: None,
                },
            );
            len
        }
    };
    ctx.propagate(args.to_vec());
    Reply::Int(len as i64)
}

pub(super) fn rpush(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    push(ctx, args, false)
}

pub(super) fn lpush(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    push(ctx, args, true)
}

fn pop(ctx: &mut Ctx, args: &[Vec<u8>], front: bool) -> Reply {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    if args.len() > 3 {
        return Reply::Error(crate::reply::errors::arity(&name));
    }
    let count = match args.get(2) {
        None => None,
        // getPositiveLongFromObjectOrReply: one error for both
        Some(arg) => match int_arg(arg) {
            Ok(count) if count >= 0 => Some(count as usize),
            _ => return Reply::err("ERR value is out of range, must be positive"),
        },
    };
    let key = &args[1];
    let list = match list(ctx, key) {
        Err(error) => return error,
        Ok(None) if count.is_some() => return Reply::NilArray,
        Ok(None) => return Reply::Nil,
        Ok(Some(list)) => list,
    };
    if count == Some(0) {
        return Reply::Array(Vec::new());
    }
    let take = count.unwrap_or(1).min(list.len());
    let mut popped = Vec::with_capacity(take);
    for _ in 0..take {
        let value = if front {
            list.pop_front()
        } else {
            list.pop_back()
        };
        popped.extend(value.map(Reply::Bulk));
    }
    let empty = list.is_empty();
    if empty {
        ctx.db().remove(key);
    }
    // Propagated as sent (the count, if any, is part of it).
    ctx.propagate(args.to_vec());
    match count {
        None => popped.pop().unwrap_or(Reply::Nil),
        Some(_) => Reply::Array(popped),
    }
}

pub(super) fn lpop(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    pop(ctx, args, true)
}

pub(super) fn rpop(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    pop(ctx, args, false)
}

pub(super) fn lrem(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let count = match int_arg(&args[2]) {
        Ok(count) => count,
        Err(error) => return error,
    };
    let key = &args[1];
    let value = &args[3];
    let list = match list(ctx, key) {
        Err(error) => return error,
        Ok(None) => return Reply::Int(0),
        Ok(Some(list)) => list,
    };
    let limit = count.unsigned_abs() as usize;
    let mut removed = 0usize;
    if count >= 0 {
        let mut i = 0;
        while i < list.len() {
            if list[i] == *value && (limit == 0 || removed < limit) {
                list.remove(i);
                removed += 1;
            } else {
                i += 1;
            }
        }
    } else {
        let mut i = list.len();
        while i > 0 && removed < limit {
            i -= 1;
            if list[i] == *value {
                list.remove(i);
                removed += 1;
            }
        }
    }
    let empty = list.is_empty();
    if empty {
        ctx.db().remove(key);
    }
    if removed > 0 {
        ctx.propagate(args.to_vec());
    }
    Reply::Int(removed as i64)
}

pub(super) fn lindex(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    // the key first, then the index (Redis 7.0's order)
    let list = match list(ctx, &args[1]) {
        Err(error) => return error,
        Ok(None) => return Reply::Nil,
        Ok(Some(list)) => list,
    };
    let index = match int_arg(&args[2]) {
        Ok(index) => index,
        Err(error) => return error,
    };
    let len = list.len() as i64;
    let at = if index < 0 { len + index } else { index };
    if at < 0 || at >= len {
        return Reply::Nil;
    }
    Reply::Bulk(list[at as usize].clone())
}

pub(super) fn lrange(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (start, end) = match (int_arg(&args[2]), int_arg(&args[3])) {
        (Ok(start), Ok(end)) => (start, end),
        (Err(error), _) | (_, Err(error)) => return error,
    };
    let list = match list(ctx, &args[1]) {
        Err(error) => return error,
        Ok(None) => return Reply::Array(Vec::new()),
        Ok(Some(list)) => list,
    };
    let len = list.len() as i64;
    let (mut start, mut end) = (start, end);
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return Reply::Array(Vec::new());
    }
    if end >= len {
        end = len - 1;
    }
    Reply::Array(
        list.range(start as usize..=end as usize)
            .map(|value| Reply::Bulk(value.clone()))
            .collect(),
    )
}

pub(super) fn llen(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match list(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Int(0),
        Ok(Some(list)) => Reply::Int(list.len() as i64),
    }
}
