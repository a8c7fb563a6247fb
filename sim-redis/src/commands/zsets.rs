//! Sorted sets: `ZADD` (NX, XX, GT, LT, CH, INCR), `ZREM`, `ZRANGE` (by
//! rank or `BYSCORE`, `REV`, `LIMIT`, `WITHSCORES`), `ZRANGEBYSCORE`,
//! `ZSCORE`, `ZREMRANGEBYSCORE`, `ZCARD`, `ZCOUNT`. (`BYLEX` is not
//! modelled.)

use super::{int_arg, is, wrongtype};
use crate::ctx::Ctx;
use crate::keyspace::{Data, Entry, ZSet};
use crate::number::{parse_f64, parse_score_bound};
use crate::reply::{errors, Reply};

fn zset<'a>(ctx: &'a mut Ctx, key: &[u8]) -> Result<Option<&'a mut ZSet>, Reply> {
    match ctx.entry(key) {
        None => Ok(None),
        Some(Entry {
            data: Data::ZSet(zset),
            ..
        }) => Ok(Some(zset)),
        Some(_) => Err(wrongtype()),
    }
}

pub(super) fn zadd(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut ch, mut incr, mut gt, mut lt) =
        (false, false, false, false, false, false);
    let mut at = 2;
    while at < args.len() {
        let opt = &args[at];
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "ch") {
            ch = true;
        } else if is(opt, "incr") {
            incr = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            break;
        }
        at += 1;
    }
    let pairs = &args[at..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Reply::err(errors::SYNTAX);
    }
    if nx && xx {
        return Reply::err("ERR XX and NX options at the same time are not compatible");
    }
    if ((gt || lt) && nx) || (gt && lt) {
        return Reply::err("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if incr && pairs.len() > 2 {
        return Reply::err("ERR INCR option supports a single increment-element pair");
    }
    let mut scores = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        match parse_f64(&pair[0]) {
            Some(score) => scores.push(score),
            None => return Reply::err(errors::NOT_FLOAT),
        }
    }
    let key = &args[1];
    let exists = match zset(ctx, key) {
        Err(error) => return error,
        Ok(found) => found.is_some(),
    };
    if !exists {
        if xx {
            return if incr { Reply::Nil } else { Reply::Int(0) };
        }
        ctx.insert(
            key,
            Entry {
                data: Data::ZSet(ZSet::default()),
                expire_ms: None,
            },
        );
    }
    let Ok(Some(set)) = zset(ctx, key) else {
        unreachable!("the sorted set was just found or made");
    };
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last_score = 0.0;
    for (pair, &score) in pairs.chunks(2).zip(&scores) {
        let member = &pair[1];
        match set.score(member) {
            Some(current) => {
                if nx {
                    continue;
                }
                let new = if incr { current + score } else { score };
                if new.is_nan() {
                    return Reply::err("ERR resulting score is not a number (NaN)");
                }
                if (gt && new <= current) || (lt && new >= current) {
                    continue;
                }
                last_score = new;
                processed += 1;
                if new != current {
                    set.insert(member, new);
                    updated += 1;
                }
            }
            None => {
                if xx {
                    continue;
                }
                set.insert(member, score);
                last_score = score;
                added += 1;
                processed += 1;
            }
        }
    }
    let empty = set.is_empty();
    if empty {
        // XX or NX kept every member out of a set made for them
        ctx.db().remove(key);
    }
    if added + updated > 0 {
        ctx.propagate(args.to_vec());
    }
    if incr {
        if processed > 0 {
            Reply::Double(last_score)
        } else {
            Reply::Nil
        }
    } else {
        Reply::Int(if ch { added + updated } else { added })
    }
}

pub(super) fn zrem(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let set = match zset(ctx, key) {
        Err(error) => return error,
        Ok(None) => return Reply::Int(0),
        Ok(Some(set)) => set,
    };
    let mut removed = 0;
    for member in &args[2..] {
        if set.remove(member) {
            removed += 1;
        }
    }
    let empty = set.is_empty();
    if empty {
        ctx.db().remove(key);
    }
    if removed > 0 {
        ctx.propagate(args.to_vec());
    }
    Reply::Int(removed)
}

pub(super) fn zscore(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match zset(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Nil,
        Ok(Some(set)) => set.score(&args[2]).map_or(Reply::Nil, Reply::Double),
    }
}

pub(super) fn zcard(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    match zset(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Int(0),
        Ok(Some(set)) => Reply::Int(set.len() as i64),
    }
}

/// A score range: `[min, max]`, either end exclusive.
#[derive(Clone, Copy)]
struct Range {
    min: f64,
    min_ex: bool,
    max: f64,
    max_ex: bool,
}

impl Range {
    fn parse(min: &[u8], max: &[u8]) -> Option<Range> {
        let (min, min_ex) = parse_score_bound(min)?;
        let (max, max_ex) = parse_score_bound(max)?;
        Some(Range {
            min,
            min_ex,
            max,
            max_ex,
        })
    }

    fn above_min(&self, score: f64) -> bool {
        if self.min_ex {
            score > self.min
        } else {
            score >= self.min
        }
    }

    fn below_max(&self, score: f64) -> bool {
        if self.max_ex {
            score < self.max
        } else {
            score <= self.max
        }
    }

    fn contains(&self, score: f64) -> bool {
        self.above_min(score) && self.below_max(score)
    }
}

pub(super) fn zcount(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(range) = Range::parse(&args[2], &args[3]) else {
        return Reply::err(errors::MIN_MAX_NOT_FLOAT);
    };
    match zset(ctx, &args[1]) {
        Err(error) => error,
        Ok(None) => Reply::Int(0),
        Ok(Some(set)) => Reply::Int(
            set.iter()
                .skip_while(|(_, score)| !range.above_min(*score))
                .take_while(|(_, score)| range.below_max(*score))
                .count() as i64,
        ),
    }
}

pub(super) fn zremrangebyscore(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    let Some(range) = Range::parse(&args[2], &args[3]) else {
        return Reply::err(errors::MIN_MAX_NOT_FLOAT);
    };
    let key = &args[1];
    let set = match zset(ctx, key) {
        Err(error) => return error,
        Ok(None) => return Reply::Int(0),
        Ok(Some(set)) => set,
    };
    let doomed: Vec<Vec<u8>> = set
        .iter()
        .skip_while(|(_, score)| !range.above_min(*score))
        .take_while(|(_, score)| range.below_max(*score))
        .map(|(member, _)| member.clone())
        .collect();
    for member in &doomed {
        set.remove(member);
    }
    let empty = set.is_empty();
    if empty {
        ctx.db().remove(key);
    }
    if !doomed.is_empty() {
        ctx.propagate(args.to_vec());
    }
    Reply::Int(doomed.len() as i64)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Rank,
    Score,
}

pub(super) fn zrange(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    range_generic(ctx, args, None)
}

pub(super) fn zrangebyscore(ctx: &mut Ctx, args: &[Vec<u8>]) -> Reply {
    range_generic(ctx, args, Some(By::Score))
}

/// `ZRANGE` (`by` unset: options decide) and `ZRANGEBYSCORE`.
fn range_generic(ctx: &mut Ctx, args: &[Vec<u8>], fixed: Option<By>) -> Reply {
    let mut withscores = false;
    let mut limit: Option<(i64, i64)> = None;
    let mut rev = false;
    let mut by = fixed;
    let mut j = 4;
    while j < args.len() {
        let left = args.len() - j - 1;
        let opt = &args[j];
        if is(opt, "withscores") {
            withscores = true;
        } else if is(opt, "limit") && left >= 2 {
            match (int_arg(&args[j + 1]), int_arg(&args[j + 2])) {
                (Ok(offset), Ok(count)) => limit = Some((offset, count)),
                (Err(error), _) | (_, Err(error)) => return error,
            }
            j += 2;
        } else if fixed.is_none() && !rev && is(opt, "rev") {
            rev = true;
        } else if by.is_none() && is(opt, "byscore") {
            by = Some(By::Score);
        } else {
            return Reply::err(errors::SYNTAX);
        }
        j += 1;
    }
    let by = by.unwrap_or(By::Rank);
    if limit.is_some() && by == By::Rank {
        return Reply::err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    let (lo, hi) = if rev && by == By::Score {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    enum Bounds {
        Rank(i64, i64),
        Score(Range),
    }
    let bounds = match by {
        By::Rank => match (int_arg(lo), int_arg(hi)) {
            (Ok(start), Ok(end)) => Bounds::Rank(start, end),
            (Err(error), _) | (_, Err(error)) => return error,
        },
        By::Score => match Range::parse(lo, hi) {
            Some(range) => Bounds::Score(range),
            None => return Reply::err(errors::MIN_MAX_NOT_FLOAT),
        },
    };
    let resp3 = ctx.resp3;
    let set = match zset(ctx, &args[1]) {
        Err(error) => return error,
        Ok(None) => return Reply::Array(Vec::new()),
        Ok(Some(set)) => set,
    };
    let picked: Vec<(Vec<u8>, f64)> = match bounds {
        Bounds::Rank(start, end) => {
            let len = set.len() as i64;
            let mut start = if start < 0 { start + len } else { start };
            let mut end = if end < 0 { end + len } else { end };
            if start < 0 {
                start = 0;
            }
            if start > end || start >= len {
                Vec::new()
            } else {
                if end >= len {
                    end = len - 1;
                }
                let take = (end - start + 1) as usize;
                let pick = |(member, score): (&Vec<u8>, f64)| (member.clone(), score);
                if rev {
                    set.iter()
                        .rev()
                        .skip(start as usize)
                        .take(take)
                        .map(pick)
                        .collect()
                } else {
                    set.iter()
                        .skip(start as usize)
                        .take(take)
                        .map(pick)
                        .collect()
                }
            }
        }
        Bounds::Score(range) => {
            let (offset, count) = limit.unwrap_or((0, -1));
            if offset < 0 || (offset > 0 && offset >= set.len() as i64) {
                Vec::new()
            } else {
                let matching: Box<dyn Iterator<Item = (&Vec<u8>, f64)>> = if rev {
                    Box::new(
                        set.iter()
                            .rev()
                            .skip_while(|(_, score)| !range.below_max(*score))
                            .take_while(|(_, score)| range.above_min(*score)),
                    )
                } else {
                    Box::new(
                        set.iter()
                            .skip_while(|(_, score)| !range.above_min(*score))
                            .take_while(|(_, score)| range.below_max(*score)),
                    )
                };
                let matching = matching
                    .filter(|(_, score)| range.contains(*score))
                    .skip(offset as usize);
                let pick = |(member, score): (&Vec<u8>, f64)| (member.clone(), score);
                if count < 0 {
                    matching.map(pick).collect()
                } else {
                    matching.take(count as usize).map(pick).collect()
                }
            }
        }
    };
    let mut items = Vec::with_capacity(picked.len() * if withscores { 2 } else { 1 });
    for (member, score) in picked {
        if !withscores {
            items.push(Reply::Bulk(member));
        } else if resp3 {
            items.push(Reply::Array(vec![
                Reply::Bulk(member),
                Reply::Double(score),
            ]));
        } else {
            items.push(Reply::Bulk(member));
            items.push(Reply::Double(score));
        }
    }
    Reply::Array(items)
}
