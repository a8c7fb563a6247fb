//! Renewals: many locks per script call, many calls per round trip.
//!
//! Locks held by a token (exclusive locks, writers) are renewed by
//! `renew.lua`, shares (read shares, permits: members of a sorted set) by
//! `renew_shares.lua`, at most [`LOCKS_PER_CALL`] per call, every call of a
//! batch in one pipeline.
//!
//! On a Redis Cluster a pipeline goes to each primary (one round trip per
//! primary), with the calls of all the slots it serves. A script may touch
//! keys of several slots of its node only when it says so: the cluster's
//! calls run the same scripts under `#!lua flags=allow-cross-slot-keys`
//! (Redis 7), so a call still renews up to 100 locks whatever their slots.
//! When the slot map proves stale (a redirection, a key of another node, a
//! slot in migration) the batch is sent again call by call, one slot per
//! call, each routed by its keys (the `ASK` of a slot in migration followed
//! by the router), and the map is fetched again.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, FromRedisValue};

use super::RedisBackend;
use crate::backend::ack_pool::on_borrowed;
use crate::backend::connection::{replicas_confirmed, Link};
use crate::backend::scripts::{
    as_eval, is_noscript, run, LuaScript, RENEW, RENEW_ANY_SLOT, RENEW_SHARES,
    RENEW_SHARES_ANY_SLOT,
};
use crate::backend::{Found, Kind, RenewItem};
use crate::transport::cluster::slot_map::primary_of;
use crate::transport::cluster::slots::slot;

/// Locks per renewal script call (a script blocks Redis while it runs).
const LOCKS_PER_CALL: usize = 100;

/// The renewals sent in one pipeline: to one server, or to one primary of
/// a cluster (`route`: one of its slots), the items of each slot apart.
pub(super) struct RenewGroup {
    route: Option<u16>,
    /// The items of each slot (on one server: one list of every item).
    pub(super) slots: Vec<Vec<usize>>,
}

/// One renewal script call: its script, the call, the items it renews.
type RenewCall = (&'static LuaScript, Cmd, Vec<usize>);

impl RedisBackend {
    /// Extends every lock of `items` that still holds its token (see
    /// [`Backend::renew`](crate::backend::Backend::renew)).
    pub(super) async fn renew_all(
        &self,
        items: &[RenewItem<'_>],
        round_trips: &AtomicU64,
    ) -> redis::RedisResult<Vec<Found>> {
        let groups = if self.cluster {
            self.cluster_groups(items).await
        } else {
            vec![RenewGroup {
                route: None,
                slots: vec![(0..items.len()).collect()],
            }]
        };
        let sent = groups
            .iter()
            .map(|group| self.renew_group(items, group, round_trips));
        let replies = futures_util::future::join_all(sent).await;
        let mut found = vec![Found::Gone; items.len()];
        for replies in replies {
            for (script, chunk, codes) in replies? {
                let shares = std::ptr::eq(script, &*RENEW_SHARES)
                    || std::ptr::eq(script, &*RENEW_SHARES_ANY_SLOT);
                for (&i, code) in chunk.iter().zip(codes) {
                    found[i] = match code {
                        // A share is only ever its holder's, or gone.
                        1 if shares => Found::Mine,
                        _ if shares => Found::Gone,
                        code => super::found(code),
                    };
                }
            }
        }
        Ok(found)
    }

    /// `items` grouped by the primary that serves their slots (by slot
    /// alone for slots the slot map does not place, or without a map).
    pub(super) async fn cluster_groups(&self, items: &[RenewItem<'_>]) -> Vec<RenewGroup> {
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            by_slot.entry(slot(&item.keys.lock)).or_default().push(i);
        }
        let ranges = self.connection.link().slot_map().await;
        let mut groups: Vec<RenewGroup> = Vec::new();
        let mut of_node: HashMap<&str, usize> = HashMap::new();
        for (slot, items) in by_slot {
            let node = ranges
                .as_deref()
                .and_then(|ranges| primary_of(ranges, slot));
            let at = match node.and_then(|node| of_node.get(node)) {
                Some(&at) => at,
                None => {
                    groups.push(RenewGroup {
                        route: Some(slot),
                        slots: Vec::new(),
                    });
                    if let Some(node) = node {
                        of_node.insert(node, groups.len() - 1);
                    }
                    groups.len() - 1
                }
            };
            groups[at].slots.push(items);
        }
        groups
    }

    /// Renews one group: one pipeline (one round trip) to its server or
    /// primary, retried on a fresh connection within the call deadline; on
    /// a cluster, call by call after the slot map proved stale. The codes
    /// of each call, with its script and items.
    async fn renew_group(
        &self,
        items: &[RenewItem<'_>],
        group: &RenewGroup,
        round_trips: &AtomicU64,
    ) -> redis::RedisResult<Vec<(&'static LuaScript, Vec<usize>, Vec<i64>)>> {
        let calls = renew_calls(items, &group.slots, self.cluster);
        let scripts = self.connection.scripts();
        // EVALSHA for the scripts this client has run; EVAL (which caches
        // them) for the others, or for all after a NOSCRIPT.
        let pipeline = |all_eval: bool| {
            let mut pipe = redis::pipe();
            for (script, call, _) in &calls {
                if all_eval || !scripts.has(script) {
                    pipe.add_command(as_eval(script, call));
                } else {
                    pipe.add_command(call.clone());
                }
            }
            pipe
        };
        let query = |mut connection: Link, pipe: redis::Pipeline| async move {
            let values = connection.pipeline_to(&pipe, group.route).await?;
            values
                .iter()
                .map(|value| Vec::<i64>::from_redis_value_ref(value).map_err(Into::into))
                .collect::<redis::RedisResult<Vec<Vec<i64>>>>()
        };
        let with_items = |calls: &[RenewCall], codes: Vec<Vec<i64>>| {
            calls
                .iter()
                .zip(codes)
                .map(|((script, _, chunk), codes)| (*script, chunk.clone(), codes))
                .collect::<Vec<_>>()
        };
        let renewed = self
            .connection
            .call(|connection, attempt| {
                let (pipeline, query, calls, with_items) = (&pipeline, &query, &calls, &with_items);
                let (connection, borrowed) = self.for_call(connection, self.ack);
                let call = async move {
                    round_trips.fetch_add(1, Ordering::Relaxed);
                    crate::observe::renewal_round_trip();
                    if attempt == 0 || !self.cluster {
                        let result = match query(connection.clone(), pipeline(false)).await {
                            Err(error) if is_noscript(&error) => {
                                // Redis restarted, failed over or flushed its
                                // script cache: the same calls as EVAL.
                                round_trips.fetch_add(1, Ordering::Relaxed);
                                crate::observe::renewal_round_trip();
                                query(connection.clone(), pipeline(true)).await
                            }
                            result => result,
                        };
                        match result {
                            Ok(codes) => {
                                for (script, _, _) in calls {
                                    scripts.add(script);
                                }
                                return Ok(with_items(calls, codes));
                            }
                            // A connection that failed: retried (below,
                            // call by call on a cluster).
                            Err(error) if !self.cluster || connection_failed(&error) => {
                                return Err(error)
                            }
                            // The slot map was stale: call by call now.
                            Err(_) => {}
                        }
                    }
                    connection.forget_slot_map();
                    let by_slot = renew_calls(items, &group.slots, false);
                    let codes = self.renew_one_by_one(&by_slot, &connection).await?;
                    Ok(with_items(&by_slot, codes))
                };
                on_borrowed(borrowed, call)
            })
            .await;
        // Acknowledged mode: too few replicas confirmed. Why: the replicas
        // the primary has (warned of when too few, `replicas.rs`).
        match &renewed {
            Err(error) if replicas_confirmed(error).is_some() => {
                Box::pin(self.replicas_after_refusal(group.route)).await;
            }
            Ok(_) if self.ack.is_some() => self.replicas.confirmed(),
            _ => {}
        }
        renewed
    }

    /// The renewal `calls` (one slot each), each sent by itself (routed by
    /// its keys), all at once.
    async fn renew_one_by_one(
        &self,
        calls: &[RenewCall],
        connection: &Link,
    ) -> redis::RedisResult<Vec<Vec<i64>>> {
        let scripts = self.connection.scripts();
        let sent = calls.iter().map(|(script, call, _)| {
            let mut connection = connection.clone();
            async move { run::<Vec<i64>>(script, call, &mut connection, scripts).await }
        });
        futures_util::future::join_all(sent)
            .await
            .into_iter()
            .collect()
    }
}

/// Whether a call failed on its connection (a retry on a fresh one may
/// succeed), rather than by a reply.
fn connection_failed(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
}

/// The renewal script calls for the items of `slots`: each slot's apart
/// (one server, or a call per slot), or all together in calls that may
/// touch any slot of their node (`any_slot`, on a cluster).
fn renew_calls(items: &[RenewItem<'_>], slots: &[Vec<usize>], any_slot: bool) -> Vec<RenewCall> {
    let mut calls = Vec::new();
    if any_slot {
        renew_calls_of(items, &slots.concat(), true, &mut calls);
    } else {
        for slot in slots {
            renew_calls_of(items, slot, false, &mut calls);
        }
    }
    calls
}

fn renew_calls_of(
    items: &[RenewItem<'_>],
    group: &[usize],
    any_slot: bool,
    calls: &mut Vec<RenewCall>,
) {
    let (tokens, shares): (Vec<usize>, Vec<usize>) = group
        .iter()
        .partition(|&&i| matches!(items[i].kind, Kind::Exclusive | Kind::Write));
    let (renew, renew_shares) = if any_slot {
        (&*RENEW_ANY_SLOT, &*RENEW_SHARES_ANY_SLOT)
    } else {
        (&*RENEW, &*RENEW_SHARES)
    };
    for chunk in tokens.chunks(LOCKS_PER_CALL) {
        let first = &items[chunk[0]].keys.lock;
        let mut call = script_call(renew, first, chunk.len(), any_slot);
        for &i in chunk {
            call.arg(&items[i].keys.lock);
        }
        for &i in chunk {
            call.arg(items[i].ttl_ms).arg(items[i].token);
        }
        calls.push((renew, call, chunk.to_vec()));
    }
    for chunk in shares.chunks(LOCKS_PER_CALL) {
        // A read share: the writer key (a lone reader's) and the readers
        // ZSET; a permit: the semaphore ZSET.
        let keys: usize = chunk
            .iter()
            .map(|&i| 1 + usize::from(items[i].kind == Kind::Read))
            .sum();
        let first = &items[chunk[0]].keys.lock;
        let mut call = script_call(renew_shares, first, keys, any_slot);
        for &i in chunk {
            let keys = items[i].keys;
            if items[i].kind == Kind::Read {
                call.arg(&keys.lock).arg(keys.readers());
            } else {
                call.arg(&keys.lock);
            }
        }
        for &i in chunk {
            let item = &items[i];
            match item.kind {
                Kind::Semaphore { permits, .. } => call.arg(format!("{permits}|{}", item.token)),
                _ => call.arg(item.token),
            };
            call.arg(item.ttl_ms)
                .arg(1 + u8::from(item.kind == Kind::Read));
        }
        calls.push((renew_shares, call, chunk.to_vec()));
    }
}

/// `EVALSHA script` before its `keys` keys (for the caller to add, then
/// the arguments): declared as KEYS, or (`any_slot`) `first` declared (it
/// routes the call) and all of them at the head of ARGV, after their count
/// (`any_slot.lua`).
fn script_call(script: &LuaScript, first: &str, keys: usize, any_slot: bool) -> Cmd {
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.hash());
    if any_slot {
        call.arg(1).arg(first).arg(keys);
    } else {
        call.arg(keys);
    }
    call
}
