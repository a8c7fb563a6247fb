//! Hashes: `HSET`, `HDEL`, `HGETALL`, `HGET`, `HLEN`.

use super::wrongtype;
use crate::ctx::Ctx;
use crate::keyspace::{Data, Entry, Hash};
use crate::reply::{errors, Reply};

fn hash<'a>(ctx: &'a mut Ctx, key: &[u8]) -> Result<Option<&'a mut Hash>, Reply> {
    match ctx.entry(key) {
        None => Ok(None),
        Some(Entry {
            data: Data::Hash(hash),
            ..
        }) => Ok(Some(hash)),
        Some(_) => Err(wrongtype()),
    }
}

pub(super) fn hset(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    if args.len() % 2 == 1 {
        return Reply::Error(errors::arity("hset"));
    }
    let key = &args[1];
    let exists = match hash(ctx, key) {
        Err(error) => return error,
        Ok(found) => found.is_some(),
    };
    if !exists {
        ctx.insert(
            key,
            Entry {
                data: Data::Hash(Hash::default()),
                expire_ms: None,
            },
        );
    }
    let Ok(Some(hash)) = hash(ctx, key) else {
        unreachable!("the hash was just found or made");
    };
    let mut created = 0;
    for pair in args[2..].chunks(2) {
        if hash.set(&pair[0], &pair[1]) {
            created += 1;
        }
    }
    ctx.propagate(args.to_vec());
    Reply::Int(created)
}

pub(super) fn hdel(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let hash = match hash(ctx, key) {
        Err(error) => return error,
        Ok(None) => return Reply::Int(0),
        Ok(Some(hash)) => hash,
    };
    let mut deleted = 0;
    for field in &args[2..] {
        if hash.remove(field) {
            deleted += 1;
        }
    }
    let empty = hash.is_empty();
    if empty {
        ctx.db().remove(key);
    }
    if deleted > 0 {
        ctx.propagate(args.to_vec());
    }
    Reply::Int(deleted)
}

pub(super) fn hgetall(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match hash(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Map(Vec::new()),
        Ok(Some(hash)) => Reply::Map(
            hash.iter()
                .map(|(field, value)| (Reply::Bulk(field.clone()), Reply::Bulk(value.clone())))
                .collect(),
        ),
    }
}

pub(super) fn hget(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match hash(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Nil,
        Ok(Some(hash)) => hash
            .get(&args[2])
            .map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
    }
}

pub(super) fn hlen(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match hash(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Int(0),
        Ok(Some(hash)) => Reply::Int(hash.len() as i64),
    }
}
