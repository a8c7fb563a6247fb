//! Who holds a lock, and until when, cheaply: [`Lock::holder`]. One
//! script reading the lock key's value and `PTTL` (`lua/peek.lua`), with
//! the commands of the lock's own ACL rule; the admin API
//! ([`Client::lock_info`](crate::Client::lock_info)) reads more (waiters,
//! the holder's record) and needs more.

use std::time::Duration;

use crate::backend::{Kind, Peeked};
use crate::client::global_client;
use crate::error::LockError;
use crate::fronts::lock::Lock;
use crate::keys::LockKeys;
use crate::token::client_of;

/// Who holds an exclusive lock, as [`Lock::holder`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The holder's client: its [`Client::id`](crate::Client::id), the last
    /// 16 hex digits of its token. `lockctl show` (or
    /// [`Client::lock_info`](crate::Client::lock_info)) names its instance,
    /// host, process and function.
    pub client_id: String,
    /// The holder is this client (this process; maybe another of its tasks).
    pub this_client: bool,
    /// The first 16 hex digits of the holder's token: the `lock.holder`
    /// field of its spans, and what `lockctl` shows.
    pub token_head: String,
    /// How long the key lives from when it was read (its `PTTL`; over a
    /// quorum, until fewer than a majority of the nodes hold it).
    pub expires_in: Duration,
    /// Released by a holder that took it with
    /// [`hold_at_least`](Lock::hold_at_least) and kept until it expires:
    /// nobody runs under it, and nobody can take it before then.
    pub kept: bool,
}

impl Lock {
    /// Who holds this lock, and until when: `None` when it is free. One
    /// round trip (over a quorum, one to each node, in parallel), reads
    /// only, and needs no more of the Redis user than taking the lock does
    /// (`get`, `pttl`, `evalsha`; the admin API's `lock_info` also needs
    /// `zcount`).
    ///
    /// What it says may be out of date as soon as it is read: to act on a
    /// free lock, take it ([`try_acquire`](Lock::try_acquire)), do not ask
    /// first. Over a quorum, a lock is held when a majority of the nodes
    /// hold the same token; a token on fewer is an attempt under way or
    /// being given back, and the lock reads as free.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::Lock;
    ///
    /// match Lock::new("report:2024-06-01").holder().await? {
    ///     Some(holder) if holder.kept => println!("ran; kept for {:?} more", holder.expires_in),
    ///     Some(holder) => println!("held by client {} for {:?} more", holder.client_id, holder.expires_in),
    ///     None => println!("free"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Redis`] when Redis did not answer (over a quorum: fewer
    /// than a majority of the nodes); [`LockError::Config`] for a name that
    /// cannot be a lock's, or no client.
    pub async fn holder(&self) -> Result<Option<LockHolder>, LockError> {
        let client = match self.client_ref() {
            Some(client) => client.clone(),
            None => global_client()?,
        };
        let core = client.core();
        let keys = LockKeys::new(core.key_prefix(), self.name(), Kind::Exclusive.key_suffix())?;
        let readings = core.backend().peek(&keys).await?;
        let Some((owner, expires_in)) = decide(&readings).map_err(|reason| {
            LockError::redis(
                self.name(),
                "read of the holder",
                redis::RedisError::from((redis::ErrorKind::Io, reason)),
            )
        })?
        else {
            return Ok(None);
        };
        let (token, kept) = match owner.strip_prefix("kept:") {
            Some(token) => (token, true),
            None => (owner.as_str(), false),
        };
        let client_id = client_of(token).unwrap_or(token).to_owned();
        Ok(Some(LockHolder {
            this_client: client_id == core.client_id(),
            client_id,
            token_head: token.chars().take(16).collect(),
            expires_in,
            kept,
        }))
    }
}

/// The holder the nodes' readings agree on (its value before any wake or
/// attempt mark, `kept:` kept) and how long it holds: on one node, its
/// value and PTTL; over N nodes, a value found on a majority, until fewer
/// than a majority still have it. `Err` when too few nodes answered to
/// tell.
fn decide(readings: &[Option<Peeked>]) -> Result<Option<(String, Duration)>, &'static str> {
    let majority = readings.len() / 2 + 1;
    let answered = readings.iter().flatten().count();
    let mut owners: Vec<(&str, Vec<i64>)> = Vec::new();
    for reading in readings.iter().flatten() {
        let Some(value) = &reading.value else {
            continue;
        };
        let owner = value.split('|').next().unwrap_or(value);
        match owners.iter_mut().find(|(known, _)| *known == owner) {
            Some((_, pttls)) => pttls.push(reading.pttl_ms),
            None => owners.push((owner, vec![reading.pttl_ms])),
        }
    }
    for (owner, mut pttls) in owners {
        if pttls.len() >= majority {
            pttls.sort_unstable_by(|a, b| b.cmp(a));
            let ms = pttls[majority - 1].max(0) as u64;
            return Ok(Some((owner.to_owned(), Duration::from_millis(ms))));
        }
    }
    if answered < majority {
        return Err("fewer than a majority of the nodes answered: who holds the lock is unknown");
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::decide;
    use crate::backend::Peeked;

    fn node(value: Option<&str>, pttl_ms: i64) -> Option<Peeked> {
        Some(Peeked {
            value: value.map(str::to_owned),
            pttl_ms,
        })
    }

    #[test]
    fn one_node() {
        assert_eq!(decide(&[node(None, -2)]), Ok(None));
        assert_eq!(
            decide(&[node(Some("t1|lock-waiters:x|t2"), 1500)]),
            Ok(Some(("t1".to_owned(), Duration::from_millis(1500))))
        );
        assert_eq!(
            decide(&[node(Some("kept:t1"), 20)]),
            Ok(Some(("kept:t1".to_owned(), Duration::from_millis(20))))
        );
    }

    #[test]
    fn a_quorum_agrees_by_majority() {
        // Held on 3 of 5: until the third-longest of them expires.
        let readings = [
            node(Some("t1|q1"), 900),
            node(Some("t1|q1"), 1000),
            node(Some("t2|q1"), 5000),
            node(Some("t1|q2"), 800),
            node(None, -2),
        ];
        assert_eq!(
            decide(&readings),
            Ok(Some(("t1".to_owned(), Duration::from_millis(800))))
        );
        // On 2 of 5: not held.
        let readings = [
            node(Some("t1|q1"), 900),
            node(Some("t1|q1"), 1000),
            node(None, -2),
            node(None, -2),
            None,
        ];
        assert_eq!(decide(&readings), Ok(None));
        // 2 of 5 answered: unknown.
        let readings = [node(None, -2), node(None, -2), None, None, None];
        assert!(decide(&readings).is_err());
        // Held by a majority although the others did not answer.
        let readings = [node(Some("t1"), 700), node(Some("t1"), 600), None];
        assert_eq!(
            decide(&readings),
            Ok(Some(("t1".to_owned(), Duration::from_millis(600))))
        );
    }
}
