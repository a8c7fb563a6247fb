//! `Lock::holder` on one server or a Redis Cluster: the lock key's value
//! and PTTL, read by `peek.lua` (one round trip, on the key's node).

use redis::Value;

use super::RedisBackend;
use crate::backend::scripts::{evalsha, run, PEEK};
use crate::backend::Peeked;
use crate::error::LockError;
use crate::keys::LockKeys;

impl RedisBackend {
    /// One `peek.lua` call on the lock's key.
    pub(crate) async fn peek_lock(&self, keys: &LockKeys) -> Result<Peeked, LockError> {
        let key = keys.lock.as_str();
        let mut cmd = evalsha(&PEEK, 1, 1, key.len());
        cmd.arg(key);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        let reply: Value = self
            .call(
                keys.name(),
                "read of the holder",
                |mut connection, _| async move { run(&PEEK, cmd, &mut connection, scripts).await },
            )
            .await?;
        decode(&reply).ok_or_else(|| {
            LockError::redis(
                keys.name(),
                "read of the holder",
                redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "unexpected reply to the peek script",
                    format!("{reply:?}"),
                )),
            )
        })
    }
}

/// `{value or nil, pttl}`.
fn decode(reply: &Value) -> Option<Peeked> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [value, pttl] = parts.as_slice() else {
        return None;
    };
    let value = match value {
        Value::Nil => None,
        Value::BulkString(bytes) => Some(String::from_utf8(bytes.clone()).ok()?),
        Value::SimpleString(text) => Some(text.clone()),
        _ => return None,
    };
    let Value::Int(pttl_ms) = pttl else {
        return None;
    };
    Some(Peeked {
        value,
        pttl_ms: *pttl_ms,
    })
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::decode;
    use crate::backend::Peeked;

    #[test]
    fn replies_decode() {
        assert_eq!(
            decode(&Value::Array(vec![
                Value::BulkString(b"abc".to_vec()),
                Value::Int(1200)
            ])),
            Some(Peeked {
                value: Some("abc".to_owned()),
                pttl_ms: 1200
            })
        );
        assert_eq!(
            decode(&Value::Array(vec![Value::Nil, Value::Int(-2)])),
            Some(Peeked {
                value: None,
                pttl_ms: -2
            })
        );
        assert_eq!(decode(&Value::Int(1)), None);
        assert_eq!(decode(&Value::Array(vec![Value::Nil])), None);
    }
}
