//! The shared-holder kinds on one node: read/write locks and semaphores,
//! their scripts' arguments and the decoding of their replies.

use crate::backend::connection::Link;

use super::RedisBackend;
use crate::backend::scripts::{
    evalsha, run, Told, RW_ACQUIRE, RW_LEAVE, RW_RELEASE, SEMAPHORE_ACQUIRE, SEMAPHORE_LEAVE,
    SEMAPHORE_RELEASE,
};
use crate::backend::{Acquire, AcquireRequest, Found, Kind};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use redis::Cmd;
use std::time::Duration;

impl RedisBackend {
    /// One attempt for a read share, the write side or semaphore permits.
    pub(super) async fn acquire_shared(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Acquire, LockError> {
        let reply: Vec<i64> = self
            .call_until(
                request.keys.name(),
                "acquire",
                request.until,
                |mut connection, attempt| async move {
                    // A retry: the attempt before it may have taken the lock.
                    let mine = request.mine || attempt > 0;
                    self.shared_acquire_script(&mut connection, request, mine)
                        .await
                },
            )
            .await?;
        let at = |i: usize| reply.get(i).copied().unwrap_or(-1);
        let name = request.keys.name();
        match (at(0), request.kind) {
            (-3, Kind::Semaphore { capacity, .. }) => Err(ConfigError::PermitsMismatch {
                name: name.to_owned(),
                held: at(1).max(0) as u64,
                asked: u64::from(capacity),
            }
            .into()),
            (
                -4,
                Kind::Semaphore {
                    capacity, permits, ..
                },
            ) => Err(ConfigError::InvalidLockOption {
                name: name.to_owned(),
                option: "permits",
                reason: format!(
                    "the semaphore has {capacity} permits; {permits} can never be taken at once"
                ),
            }
            .into()),
            _ => Ok(rw_outcome(request, &reply)),
        }
    }

    /// The uncontended read: `SET <writer key> r:<token> NX PX ttl` (the
    /// lone reader) with `EXISTS <queue>` in the same round trip. `None`
    /// when the key was taken, or when waiters are queued: a writer key
    /// that ended by its ttl (a writer's, a kept one's, a dead lone
    /// reader's) leaves the queue without its gate until the next script,
    /// and a reader must not pass a waiting writer through that gap; the
    /// share is then given back at once (the release, which closes the
    /// gate and wakes), and the caller runs the acquire script. A retry
    /// (the first attempt's outcome unknown) is the acquire script with
    /// `mine`, which recognises a share the first attempt took.
    pub(super) async fn lone_reader(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquire>, LockError> {
        let keys = request.keys;
        let value = format!("r:{}", request.token);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.lock)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(request.ttl_ms)
            .cmd("EXISTS")
            .arg(keys.queue());
        let pipe = &pipe;
        let (set, queued) = self
            .call_until(
                keys.name(),
                "acquire",
                request.until,
                |mut connection, attempt| async move {
                    if attempt > 0 {
                        let retry = AcquireRequest {
                            mine: true,
                            ..*request
                        };
                        let reply = self.shared_acquire_script(&mut connection, &retry, true);
                        return Ok(match rw_outcome(&retry, &reply.await?) {
                            acquired @ Acquire::Acquired { .. } => (Some(acquired), false),
                            Acquire::Busy { .. } => (None, false),
                        });
                    }
                    let (set, queued): (Option<String>, bool) =
                        pipe.query_async(&mut connection).await?;
                    let acquired = Acquire::Acquired {
                        fence: None,
                        found: None,
                        holds: None,
                    };
                    Ok((set.map(|_| acquired), queued))
                },
            )
            .await?;
        if set.is_some() && queued {
            let give_back = |mut connection, _| async move {
                self.release_shared(Kind::Read, keys, request.token, 0, &mut connection)
                    .await
            };
            self.call_until(keys.name(), "acquire", request.until, give_back)
                .await?;
            return Ok(None);
        }
        Ok(set)
    }

    /// The uncontended write: `SET <writer key> <token> NX PX ttl` with
    /// `EXISTS <readers> <queue>` in the same round trip (2 commands where
    /// the acquire script runs 6). The `SET` alone does not decide: reader
    /// shares in the readers set do not occupy the writer key (only a
    /// lone reader and the gate do). From the `SET` on, no reader can
    /// enter (the scripts see a writer, the plain read `SET` fails), so
    /// `EXISTS` answering 0 means no share is live and nobody waits: the
    /// caller holds the write side. Otherwise (`None`) the key is given back
    /// at once (the write release, which wakes the waiters it blocked and
    /// puts the gate back) and the caller runs the acquire script. A retry
    /// (the first attempt's outcome unknown) gives back whatever that
    /// attempt may have set, then runs the script without `mine`: the
    /// token in the key proves nothing about the readers.
    pub(super) async fn lone_writer(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<Option<Acquire>, LockError> {
        let keys = request.keys;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.lock)
            .arg(request.token)
            .arg("NX")
            .arg("PX")
            .arg(request.ttl_ms)
            .cmd("EXISTS")
            .arg(keys.readers())
            .arg(keys.queue());
        let pipe = &pipe;
        let taken = self
            .call_until(
                keys.name(),
                "acquire",
                request.until,
                |mut connection, attempt| async move {
                    if attempt > 0 {
                        self.release_shared(Kind::Write, keys, request.token, 0, &mut connection)
                            .await?;
                        let reply = self.shared_acquire_script(&mut connection, request, false);
                        return Ok(Taken::Decided(rw_outcome(request, &reply.await?)));
                    }
                    let (set, others): (Option<String>, u32) =
                        pipe.query_async(&mut connection).await?;
                    Ok(match (set, others) {
                        (None, _) => Taken::No,
                        (Some(_), 0) => Taken::Decided(Acquire::Acquired {
                            fence: None,
                            found: None,
                            holds: None,
                        }),
                        (Some(_), _) => Taken::GiveBack,
                    })
                },
            )
            .await?;
        match taken {
            Taken::Decided(decided) => Ok(Some(decided)),
            Taken::No => Ok(None),
            Taken::GiveBack => {
                let give_back = |mut connection, _| async move {
                    self.release_shared(Kind::Write, keys, request.token, 0, &mut connection)
                        .await
                };
                self.call_until(keys.name(), "acquire", request.until, give_back)
                    .await?;
                Ok(None)
            }
        }
    }

    async fn shared_acquire_script(
        &self,
        connection: &mut Link,
        request: &AcquireRequest<'_>,
        mine: bool,
    ) -> redis::RedisResult<Vec<i64>> {
        let keys = request.keys;
        let bytes = 5 * keys.lock.len() + 48 + 2 * request.token.len() + request.member.len();
        let scripts = self.connection.scripts();
        if let Kind::Semaphore {
            capacity, permits, ..
        } = request.kind
        {
            let mut cmd = evalsha(&SEMAPHORE_ACQUIRE, 3, 12, bytes);
            cmd.arg(&keys.lock)
                .arg(keys.queue())
                .arg(keys.waiters())
                .arg(request.token)
                .arg(request.ttl_ms)
                .arg(permits)
                .arg(capacity)
                .arg(request.waiter_timeout_ms)
                .arg(u8::from(request.join))
                .arg(u8::from(request.respect.any()))
                .arg(request.member)
                .arg(u8::from(mine));
            return run(&SEMAPHORE_ACQUIRE, &cmd, connection, scripts).await;
        }
        let mut cmd = evalsha(&RW_ACQUIRE, 5, 14, bytes);
        rw_keys(&mut cmd, keys)
            .arg(if request.kind == Kind::Write {
                "w"
            } else {
                "r"
            })
            .arg(request.token)
            .arg(request.ttl_ms)
            .arg(request.fence_retention_ms.unwrap_or(0))
            .arg(request.waiter_timeout_ms)
            .arg(u8::from(request.join))
            .arg(u8::from(request.respect.any()))
            .arg(request.member)
            .arg(u8::from(mine));
        run(&RW_ACQUIRE, &cmd, connection, scripts).await
    }

    /// Ends a share (`keep_ms` > 0: a writer's `hold_at_least`); returns
    /// what it found.
    pub(super) async fn release_shared(
        &self,
        kind: Kind,
        keys: &LockKeys,
        token: &str,
        keep_ms: u64,
        connection: &mut Link,
    ) -> redis::RedisResult<Found> {
        Ok(self
            .release_shared_waking(kind, keys, token, keep_ms, connection)
            .await?
            .0)
    }

    /// [`release_shared`](Self::release_shared), and whether the release
    /// woke a waiter: then the releaser's next attempt lets the waiters go
    /// first, as after an exclusive lock's hand-over (a contender that
    /// releases and asks again at once would otherwise take back the share
    /// or permit it just freed, before the waiter it woke arrives).
    pub(super) async fn release_shared_waking(
        &self,
        kind: Kind,
        keys: &LockKeys,
        token: &str,
        keep_ms: u64,
        connection: &mut Link,
    ) -> redis::RedisResult<(Found, bool)> {
        let scripts = self.connection.scripts();
        let bytes = 5 * keys.lock.len() + 48 + token.len();
        let told: Told = if let Kind::Semaphore { permits, fair, .. } = kind {
            let mut cmd = evalsha(&SEMAPHORE_RELEASE, 3, 6, bytes);
            cmd.arg(&keys.lock)
                .arg(keys.queue())
                .arg(keys.waiters())
                .arg(token)
                .arg(permits)
                .arg(u8::from(fair));
            run(&SEMAPHORE_RELEASE, &cmd, connection, scripts).await?
        } else {
            let mut cmd = evalsha(&RW_RELEASE, 5, 8, bytes);
            rw_keys(&mut cmd, keys)
                .arg(if kind == Kind::Write { "w" } else { "r" })
                .arg(token)
                .arg(keep_ms);
            run(&RW_RELEASE, &cmd, connection, scripts).await?
        };
        Ok(match self.told(told) {
            2 => (Found::Mine, true),
            1 => (Found::Mine, false),
            0 => (Found::Gone, false),
            _ => (Found::Other, false),
        })
    }

    /// A waiter of a shared kind gives up its place.
    pub(super) async fn leave_shared(
        &self,
        kind: Kind,
        keys: &LockKeys,
        member: &str,
    ) -> Result<(), LockError> {
        let bytes = 5 * keys.lock.len() + 48 + member.len();
        let cmd = if let Kind::Semaphore { capacity, fair, .. } = kind {
            let mut cmd = evalsha(&SEMAPHORE_LEAVE, 3, 6, bytes);
            cmd.arg(&keys.lock)
                .arg(keys.queue())
                .arg(keys.waiters())
                .arg(member)
                .arg(capacity)
                .arg(u8::from(fair));
            cmd
        } else {
            let mut cmd = evalsha(&RW_LEAVE, 5, 6, bytes);
            rw_keys(&mut cmd, keys).arg(member);
            cmd
        };
        let script = if matches!(kind, Kind::Semaphore { .. }) {
            &*SEMAPHORE_LEAVE
        } else {
            &*RW_LEAVE
        };
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(
            keys.name(),
            "leave the queue",
            |mut connection, _| async move {
                run::<Told>(script, cmd, &mut connection, scripts)
                    .await
                    .map(|told| self.told(told))
            },
        )
        .await
        .map(|_| ())
    }
}

/// What the plain write's round trip found.
enum Taken {
    /// The key was taken (nobody else could enter): the caller holds; or a
    /// retry's script decided.
    Decided(Acquire),
    /// The `SET` failed: the key is held (a writer, a lone reader, the gate).
    No,
    /// The `SET` succeeded beside reader shares or queued waiters.
    GiveBack,
}

/// A read/write lock's five keys: writer, readers, queue, waiters, fence.
fn rw_keys<'c>(cmd: &'c mut Cmd, keys: &LockKeys) -> &'c mut Cmd {
    cmd.arg(&keys.lock)
        .arg(keys.readers())
        .arg(keys.queue())
        .arg(keys.waiters())
        .arg(keys.fence())
}

/// An acquire script's `{1, fence[, remaining_ms]}` (acquired) or
/// `{0, hint_ms}` (busy) reply, decoded.
pub(super) fn rw_outcome(request: &AcquireRequest<'_>, reply: &[i64]) -> Acquire {
    let at = |i: usize| reply.get(i).copied().unwrap_or(-1);
    let millis = |value: i64| u64::try_from(value).ok().map(Duration::from_millis);
    if at(0) == 1 {
        Acquire::Acquired {
            fence: request.fence_retention_ms.map(|_| at(1) as u64),
            found: (reply.len() > 2).then(|| millis(at(2)).unwrap_or(Duration::ZERO)),
            holds: None,
        }
    } else {
        Acquire::Busy {
            expires_in: millis(at(1)),
        }
    }
}
