//! A set taken key by key, and a switch of primary its client learned of
//! before the set was handed out (design §15, "Acquisitions, held back").
//!
//! A single lock's attempt that learns of a switch while it runs waits out
//! the hold-back and asks again where calls go now
//! (`RedisBackend::acquire`). A set taken key by key can learn of a switch
//! after one of its keys' attempts ended: while it takes its later keys, or
//! from the `MOVED` its fencing write-back got. The key taken before it may
//! be missing on the promoted replica (lock-sim cluster seed 30151: a fenced
//! set learned of the switch from its write-back, returned 10 ms later, and
//! its renewal found the key lost 3 ms after that). So before the set is
//! handed out, each key a switch learned since the round's start concerns
//! waits out the hold-back, then is renewed where calls go now: the set is
//! handed out only if each such key still holds the set's token there.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::backend::{Found, RenewItem};
use crate::error::LockError;
use crate::lease::acquire::Acquisition;
use crate::lease::guard::LockGuard;
use crate::transport::cluster::slots::slot;
use crate::transport::switches::Switches;

/// The client's count of switches when a round of the set's attempts
/// starts (`None`: its deployment has no switches of primary).
pub(super) fn switches_seen(first: &Acquisition<'_>) -> Option<u64> {
    first
        .core
        .backend()
        .switches()
        .map(|switches| switches.current())
}

/// `None` if every key of the set is known to be held where calls go now
/// (no switch concerning one of them was learned since `seen`, or each such
/// key, renewed after the hold-back, still held the set's token). Otherwise
/// the set is not to be handed out: `Some((index, error))`, the member at
/// `index` not found there, or not checked (the hold-back or the renewals
/// would end past `until`, or a renewal was not answered).
pub(super) async fn confirm_after_switch(
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    seen: Option<u64>,
    until: Instant,
) -> Option<(usize, LockError)> {
    let first = members[0];
    let (Some(seen), Some(switches)) = (seen, first.core.backend().switches()) else {
        return None;
    };
    confirm(members, guards, seen, until, &switches).await.err()
}

/// [`confirm_after_switch`], its outcome as an error: the member's index
/// and what it found.
async fn confirm(
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    mut seen: u64,
    until: Instant,
    switches: &Arc<Switches>,
) -> Result<(), (usize, LockError)> {
    // Again while a renewal learns of a further switch (a failover and
    // the one back), bounded by `until`.
    loop {
        // The common case: one atomic load.
        let current = switches.current();
        if current == seen {
            return Ok(());
        }
        let learned = switches.since(seen);
        // A switch learned from here on (during the hold-back below, say,
        // concerning another key of the set) is looked at by the next turn.
        seen = current;
        let concerned: Vec<usize> = guards
            .iter()
            .enumerate()
            .filter(|(_, guard)| {
                let keys = &guard.hold().keys;
                learned
                    .iter()
                    .any(|switch| switch.concerns(switch.slots.is_some().then(|| slot(&keys.lock))))
            })
            .map(|(index, _)| index)
            .collect();
        if concerned.is_empty() {
            continue;
        }
        for &index in &concerned {
            wait_out_hold_back(switches, members, guards, index, until).await?;
        }
        renew_each(members, guards, &concerned, until).await?;
    }
}

/// Waits until acquisitions of the key at `index` are no longer held back.
async fn wait_out_hold_back(
    switches: &Arc<Switches>,
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    index: usize,
    until: Instant,
) -> Result<(), (usize, LockError)> {
    let keys = &guards[index].hold().keys;
    while let Some(end) = switches.held_back(|| Some(slot(&keys.lock))) {
        if end > until {
            tokio::time::sleep_until(until).await;
            return Err(timed_out(members, guards, index));
        }
        tokio::time::sleep_until(end).await;
    }
    Ok(())
}

/// Renews each key of `concerned` with its hold's ttl where calls go now,
/// extending the hold's validity from the send when it is found.
async fn renew_each(
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    concerned: &[usize],
    until: Instant,
) -> Result<(), (usize, LockError)> {
    // A key whose renewal driver already found it gone (on a switch, it
    // renews at once every lock the switch concerns) is not asked again,
    // whichever switch it was.
    if let Some(index) = guards
        .iter()
        .position(|guard| guard.hold().reported_loss().is_some())
    {
        let (member, name) = member_of(members, guards, index);
        return Err((member, missing(name)));
    }
    let backend = members[0].core.backend();
    let round_trips = AtomicU64::new(0);
    let sent_at = Instant::now();
    // One renewal per key: the keys can be in different slots.
    let renewals = concerned.iter().map(|&index| {
        let hold = guards[index].hold();
        let items = [RenewItem {
            kind: hold.kind,
            keys: &hold.keys,
            token: &hold.token,
            ttl_ms: u64::try_from(hold.ttl.as_millis()).unwrap_or(u64::MAX),
        }];
        let round_trips = &round_trips;
        async move { backend.renew(&items, round_trips).await }
    });
    let Ok(found) = tokio::time::timeout_at(until, join_all(renewals)).await else {
        return Err(timed_out(members, guards, concerned[0]));
    };
    for (&index, found) in concerned.iter().zip(found) {
        let hold = guards[index].hold();
        let (member, name) = member_of(members, guards, index);
        match found {
            Ok(found) => match found.first().copied().flatten() {
                Some(Found::Mine) => hold.extend_for(sent_at, hold.ttl),
                Some(_) => return Err((member, missing(name))),
                None => return Err((member, unconfirmed(name))),
            },
            Err(source) => return Err((member, LockError::redis(name, "acquire", source))),
        }
    }
    Ok(())
}

/// The index and name of the member whose key the guard at `index` holds
/// (a round's guards need not be in the members' order).
fn member_of<'a>(
    members: &[&'a Acquisition<'_>],
    guards: &[LockGuard],
    index: usize,
) -> (usize, &'a str) {
    let lock = &guards[index].hold().keys.lock;
    let member = members
        .iter()
        .position(|member| &member.keys.lock == lock)
        .unwrap_or(0);
    (member, members[member].name)
}

fn timed_out(
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    index: usize,
) -> (usize, LockError) {
    let (member, name) = member_of(members, guards, index);
    let deadline = members[0].core.call_deadline();
    let error = LockError::redis(name, "acquire", crate::transport::timed_out(deadline));
    (member, error)
}

fn missing(name: &str) -> LockError {
    // A cluster (or Sentinel's primary) in transition: Redis's `TRYAGAIN`
    // kind, whose advice says it usually passes.
    let source = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
        "a switch of primary lost the key",
        format!(
            "`{name}` was taken on its primary before this client learned that a replica took \
             over, and the new primary does not hold it: the set is not acquired, and its keys \
             are released"
        ),
    ));
    LockError::redis(name, "acquire", source)
}

fn unconfirmed(name: &str) -> LockError {
    LockError::redis(
        name,
        "acquire",
        redis::RedisError::from((
            redis::ErrorKind::Io,
            "the key could not be checked on its new primary after a switch",
        )),
    )
}
