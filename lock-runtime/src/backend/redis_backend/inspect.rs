//! The admin calls on one server or a Redis Cluster: listing keys by `SCAN`
//! (on every primary of a cluster) and reading one name's locks with
//! `inspect.lua`, decoded into a [`Snapshot`].

use std::collections::BTreeSet;

use redis::Value;

use super::RedisBackend;
use crate::backend::scripts::{evalsha, run, INSPECT};
use crate::backend::{ExclusiveState, RwState, SemaphoreState, Snapshot};
use crate::error::LockError;

impl RedisBackend {
    /// Every key matching `pattern`: `SCAN 0 MATCH pattern COUNT count`
    /// to the end, on the server or on every primary of a cluster (one
    /// slot of each routes the calls). Each step is one call, retried
    /// within its own deadline.
    pub(crate) async fn scan_keys(
        &self,
        pattern: &str,
        count: u32,
    ) -> Result<Vec<String>, LockError> {
        let routes = if self.cluster {
            self.primary_routes(pattern).await?
        } else {
            vec![None]
        };
        let mut keys = BTreeSet::new();
        for route in routes {
            let mut cursor = String::from("0");
            loop {
                let mut pipe = redis::pipe();
                pipe.cmd("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(count);
                let pipe = &pipe;
                let reply = self
                    .call(pattern, "scan", |mut connection, _| async move {
                        let mut values = connection.pipeline_to(pipe, route).await?;
                        decode_scan(values.pop().unwrap_or(Value::Nil))
                    })
                    .await?;
                keys.extend(reply.1);
                cursor = reply.0;
                if cursor == "0" {
                    break;
                }
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// One slot of each primary of the cluster: where its `SCAN`s go.
    async fn primary_routes(&self, pattern: &str) -> Result<Vec<Option<u16>>, LockError> {
        let ranges = self
            .call(pattern, "scan", |connection, _| async move {
                connection.slot_map().await.ok_or_else(|| {
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "no node of the cluster answered CLUSTER SLOTS",
                    ))
                })
            })
            .await?;
        let mut seen = BTreeSet::new();
        Ok(ranges
            .iter()
            .filter(|(_, _, primary)| seen.insert(primary.clone()))
            .map(|(start, _, _)| Some(*start))
            .collect())
    }

    /// The three locks of one name, read by one `inspect.lua` call.
    /// `keys`: the script's nine keys (see its header).
    pub(crate) async fn snapshot(
        &self,
        name: &str,
        keys: &[String],
    ) -> Result<Snapshot, LockError> {
        let bytes = keys.iter().map(String::len).sum::<usize>() + 16;
        let mut cmd = evalsha(&INSPECT, keys.len(), keys.len(), bytes);
        for key in keys {
            cmd.arg(key);
        }
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        let reply: Value = self
            .call(name, "inspect", |mut connection, _| async move {
                run(&INSPECT, cmd, &mut connection, scripts).await
            })
            .await?;
        decode_snapshot(&reply).ok_or_else(|| {
            LockError::redis(
                name,
                "inspect",
                redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "unexpected reply to the inspect script",
                    format!("{reply:?}"),
                )),
            )
        })
    }
}

/// `SCAN`'s `[cursor, [key, ...]]`; keys that are not UTF-8 are left out
/// (no lock name of this crate makes one).
fn decode_scan(reply: Value) -> redis::RedisResult<(String, Vec<String>)> {
    let unexpected = || {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to SCAN",
        ))
    };
    let Value::Array(mut parts) = reply.extract_error()? else {
        return Err(unexpected());
    };
    if parts.len() != 2 {
        return Err(unexpected());
    }
    let keys = parts.pop().unwrap_or(Value::Nil);
    let cursor = text(parts.first()).ok_or_else(unexpected)?;
    let Value::Array(keys) = keys else {
        return Err(unexpected());
    };
    Ok((
        cursor,
        keys.iter().filter_map(|key| text(Some(key))).collect(),
    ))
}

/// A bulk or simple string reply as UTF-8 text; `None` for nil, false or
/// another type.
fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Int(n) => Some(*n),
        other => text(Some(other))?.parse().ok(),
    }
}

/// A `ZRANGE ... WITHSCORES` reply inside the script's: member, score
/// pairs (`inf` for the semaphore's capacity member).
fn scored(value: Option<&Value>) -> Option<Vec<(String, f64)>> {
    let Value::Array(flat) = value? else {
        return None;
    };
    flat.chunks(2)
        .map(|pair| {
            let member = text(pair.first())?;
            let score = text(pair.get(1))?.parse::<f64>().ok()?;
            Some((member, score))
        })
        .collect()
}

/// `inspect.lua`'s reply, decoded.
pub(super) fn decode_snapshot(reply: &Value) -> Option<Snapshot> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let part = |i: usize| match parts.get(i) {
        Some(Value::Array(fields)) => Some(fields.as_slice()),
        _ => None,
    };
    let (exclusive, rw, semaphore) = (part(1)?, part(2)?, part(3)?);
    let fence = |value: Option<&Value>| text(value).and_then(|fence| fence.parse().ok());
    Some(Snapshot {
        now_ms: int(parts.first())?,
        exclusive: ExclusiveState {
            value: text(exclusive.first()),
            pttl_ms: int(exclusive.get(1))?,
            fence: fence(exclusive.get(2)),
            waiters: int(exclusive.get(3))?.max(0) as u64,
        },
        rw: RwState {
            writer: text(rw.first()),
            pttl_ms: int(rw.get(1))?,
            readers: scored(rw.get(2))?,
            fence: fence(rw.get(3)),
            waiters: int(rw.get(4))?.max(0) as u64,
        },
        semaphore: SemaphoreState {
            pttl_ms: int(semaphore.first())?,
            members: scored(semaphore.get(1))?,
            waiters: int(semaphore.get(2))?.max(0) as u64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn decodes_the_inspect_reply() {
        let reply = Value::Array(vec![
            Value::Int(1_000),
            Value::Array(vec![
                bulk("abc|lock-waiters:x|def"),
                Value::Int(2_500),
                bulk("17"),
                Value::Int(1),
            ]),
            Value::Array(vec![
                Value::Nil,
                Value::Int(-2),
                Value::Array(vec![bulk("r1"), bulk("1500"), bulk("r2"), bulk("900")]),
                Value::Nil,
                Value::Int(0),
            ]),
            Value::Array(vec![
                Value::Int(-1),
                Value::Array(vec![
                    bulk("2|t"),
                    bulk("3000"),
                    bulk("#capacity:5"),
                    bulk("inf"),
                ]),
                Value::Int(2),
            ]),
        ]);
        let snapshot = decode_snapshot(&reply).unwrap();
        assert_eq!(snapshot.now_ms, 1_000);
        assert_eq!(
            snapshot.exclusive.value.as_deref(),
            Some("abc|lock-waiters:x|def")
        );
        assert_eq!(snapshot.exclusive.pttl_ms, 2_500);
        assert_eq!(snapshot.exclusive.fence, Some(17));
        assert_eq!(snapshot.exclusive.waiters, 1);
        assert_eq!(snapshot.rw.writer, None);
        assert_eq!(snapshot.rw.readers.len(), 2);
        assert_eq!(snapshot.semaphore.members[1].1, f64::INFINITY);
        assert_eq!(snapshot.semaphore.waiters, 2);
        assert!(decode_snapshot(&Value::Array(vec![Value::Int(1)])).is_none());
    }

    #[test]
    fn decodes_a_scan_step() {
        let reply = Value::Array(vec![
            bulk("42"),
            Value::Array(vec![bulk("lock:{a}"), Value::BulkString(vec![0xff])]),
        ]);
        let (cursor, keys) = decode_scan(reply).unwrap();
        assert_eq!(cursor, "42");
        assert_eq!(keys, ["lock:{a}"]);
    }
}
