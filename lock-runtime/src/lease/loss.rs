//! Why a hold is lost, told truly: what Redis showed, read against the
//! holder's own validity.
//!
//! A key found gone (or holding another token) by a call answered while the
//! holder's validity still had time cannot have expired: Redis started the
//! key's ttl after the acquire or renewal that the validity counts from, and
//! the validity ends a drift margin before the ttl would. Something removed
//! it: a forced release, `FLUSHALL`, eviction, a restart without
//! persistence, a failover to a replica that never had it. Only once the
//! validity has run out is "expired" (or "taken over") the likely story.
//!
//! Renewals (`renewal.rs`), releases (`release.rs`) and hand-offs
//! (`local_handoff.rs`) all name a loss here, whatever the deployment (one
//! server, a cluster, a quorum: the backend says only what it found).

use tokio::time::Instant;

use crate::backend::Found;
use crate::error::LostCause;
use crate::lease::hold::Hold;

/// The cause of a loss Redis showed: `found` (gone, or another's) in a
/// reply that arrived at `answered`.
pub(crate) fn shown(hold: &Hold, found: Found, answered: Instant) -> LostCause {
    let valid = answered < hold.valid_until();
    match (found, valid) {
        (Found::Gone, true) => LostCause::Deleted,
        (Found::Gone, false) => LostCause::Expired,
        (_, true) => LostCause::Replaced,
        (_, false) => LostCause::TakenOver,
    }
}

/// The loss that a renewal refused by Redis means, if `error` is a refusal
/// (not a fault of the connection): the Redis user lacks a permission, or
/// the script failed. Either is answered the same way every time, so the
/// lock cannot be kept.
pub(crate) fn refused(error: &redis::RedisError) -> Option<LostCause> {
    if !crate::backend::is_refusal(error) {
        None
    } else if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        Some(LostCause::PermissionDenied)
    } else {
        Some(LostCause::Refused)
    }
}
