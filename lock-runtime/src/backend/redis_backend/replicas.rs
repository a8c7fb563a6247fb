//! Acknowledged mode's view of the primary's replicas (issue 38).
//!
//! A write fewer replicas confirmed than asked is refused; the client then
//! asks the primary how many replicas it has connected (`ROLE`, one round
//! trip on the refusal's path only), so that the error says why, and warns
//! once per change of that number while it is below what each write must
//! be confirmed by: after a failover the promoted replica often has no
//! replica of its own, and every acquisition is refused until one follows
//! it (a full outage, silent before). The first write confirmed again is
//! said too. The number seen is a metric (`distributed_lock_acknowledged_replicas`).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis::Value;

use super::RedisBackend;

/// What acknowledged mode last saw of the primary's replicas.
#[derive(Default)]
pub(super) struct ReplicaWatch {
    /// The number of replicas the primary had connected when last asked
    /// (-1: not asked yet).
    connected: AtomicI64,
    /// A shortage was warned of and no write has been confirmed since.
    short: AtomicBool,
}

impl ReplicaWatch {
    pub(super) fn new() -> ReplicaWatch {
        ReplicaWatch {
            connected: AtomicI64::new(-1),
            short: AtomicBool::new(false),
        }
    }

    /// The primary has `connected` replicas; each write must be confirmed by
    /// `wanted`: warned once per change while that is too few.
    fn seen(&self, connected: u32, wanted: u32) {
        crate::observe::acknowledged_replicas(connected);
        let before = self.connected.swap(i64::from(connected), Ordering::AcqRel);
        if connected >= wanted || before == i64::from(connected) {
            return;
        }
        self.short.store(true, Ordering::Release);
        tracing::warn!(
            connected,
            wanted,
            "acknowledged mode: the Redis primary has {connected} connected replica(s), fewer than \
             the {wanted} each acquisition and renewal must be confirmed by: every acquisition is \
             refused (`NotReplicated`) and renewed locks are lost at the end of their validity \
             until {} more replica(s) connect (after a failover the promoted replica has none until another \
             replica, or the old primary restarted, follows it); bring a replica back, or size \
             the setup: `acknowledged(n, ..)` needs n + 1 replicas to go on through the loss of \
             one node",
            wanted - connected
        );
    }

    /// A write was confirmed: after a shortage warned of, said once.
    pub(super) fn confirmed(&self) {
        if self.short.load(Ordering::Acquire) && self.short.swap(false, Ordering::AcqRel) {
            self.connected.store(-1, Ordering::Release);
            tracing::info!(
                "acknowledged mode: the Redis primary's replicas confirm writes again; \
                 acquisitions are granted"
            );
        }
    }
}

impl RedisBackend {
    /// After a write of slot `slot` (on a cluster; `None` elsewhere) fewer
    /// replicas confirmed than asked: how many replicas its primary has
    /// connected (`ROLE`), warned of when too few. `None` if it cannot be
    /// told (not in acknowledged mode, no answer, the node no longer a
    /// primary).
    pub(super) async fn replicas_after_refusal(&self, slot: Option<u16>) -> Option<u32> {
        let ack = self.ack?;
        let connected = self
            .connection
            .call(|mut link, _| async move {
                let mut role = redis::pipe();
                role.cmd("ROLE");
                let values = link.pipeline_to(&role, slot).await?;
                Ok(values.first().and_then(replicas_of_primary))
            })
            .await
            .ok()
            .flatten()?;
        self.replicas.seen(connected, ack.replicas);
        Some(connected)
    }
}

/// The number of connected replicas in a primary's `ROLE` reply
/// (`["master", offset, [[ip, port, offset], ...]]`); `None` for another
/// role.
fn replicas_of_primary(role: &Value) -> Option<u32> {
    let Value::Array(fields) = role else {
        return None;
    };
    let is_primary = match fields.first() {
        Some(Value::BulkString(name)) => name == b"master",
        Some(Value::SimpleString(name)) => name == "master",
        _ => false,
    };
    match (is_primary, fields.get(2)) {
        (true, Some(Value::Array(replicas))) => u32::try_from(replicas.len()).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_replicas_of_a_primary_only() {
        let replica = |port: &str| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::BulkString(port.as_bytes().to_vec()),
                Value::BulkString(b"100".to_vec()),
            ])
        };
        let primary = Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(100),
            Value::Array(vec![replica("7001"), replica("7002")]),
        ]);
        assert_eq!(replicas_of_primary(&primary), Some(2));
        let alone = Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(100),
            Value::Array(vec![]),
        ]);
        assert_eq!(replicas_of_primary(&alone), Some(0));
        let demoted = Value::Array(vec![
            Value::BulkString(b"slave".to_vec()),
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(7000),
            Value::BulkString(b"connected".to_vec()),
            Value::Int(100),
        ]);
        assert_eq!(replicas_of_primary(&demoted), None);
    }
}
