//! Replies as the server builds them ([`Reply`]), independent of the
//! protocol, and their conversion to the `redis` crate's [`Value`] for a
//! RESP2 or a RESP3 connection (as a `MultiplexedConnection` would parse
//! them off the wire).

use redis::{PushKind, Value};

use crate::number::format_double;

/// A reply of the server, before it is shaped for a protocol.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reply {
    /// `+OK`.
    Ok,
    /// A simple string other than `OK` (`+PONG`).
    Status(String),
    /// An error: its whole text without the leading `-`, code first
    /// (`ERR syntax error`).
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// The null bulk string (RESP3: null).
    Nil,
    /// The null array (RESP3: null).
    NilArray,
    Array(Vec<Reply>),
    /// RESP3 map; a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 double; a bulk string (`%.17g`) in RESP2.
    Double(f64),
    /// A pub/sub message or subscription change: a RESP3 push, an array in
    /// RESP2.
    Push(PushKind, Vec<Reply>),
}

impl Reply {
    /// An error reply with the given text (code first, no leading `-`).
    pub(crate) fn err(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    pub(crate) fn bulk(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(bytes.into())
    }

    pub(crate) fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The reply in RESP2 terms: what a script's `redis.call` sees (the
    /// script's client speaks RESP2).
    pub(crate) fn into_resp2(self) -> Reply {
        match self {
            Reply::Map(pairs) => Reply::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k.into_resp2(), v.into_resp2()])
                    .collect(),
            ),
            Reply::Double(d) => Reply::Bulk(format_double(d).into_bytes()),
            Reply::Push(_, items) | Reply::Array(items) => {
                Reply::Array(items.into_iter().map(Reply::into_resp2).collect())
            }
            other => other,
        }
    }

    /// The reply as the `redis` crate parses it on a connection speaking
    /// RESP3 (`resp3`) or RESP2.
    pub(crate) fn into_value(self, resp3: bool) -> Value {
        match self {
            Reply::Ok => Value::Okay,
            Reply::Status(s) => Value::SimpleString(s),
            Reply::Error(text) => error_value(&text),
            Reply::Int(i) => Value::Int(i),
            Reply::Bulk(b) => Value::BulkString(b),
            Reply::Nil | Reply::NilArray => Value::Nil,
            Reply::Array(items) => {
                Value::Array(items.into_iter().map(|r| r.into_value(resp3)).collect())
            }
            Reply::Map(pairs) if resp3 => Value::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into_value(true), v.into_value(true)))
                    .collect(),
            ),
            Reply::Map(pairs) => Value::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k.into_value(false), v.into_value(false)])
                    .collect(),
            ),
            Reply::Double(d) if resp3 => Value::Double(d),
            Reply::Double(d) => Value::BulkString(format_double(d).into_bytes()),
            Reply::Push(kind, items) if resp3 => Value::Push {
                kind,
                data: items.into_iter().map(|r| r.into_value(true)).collect(),
            },
            Reply::Push(kind, items) => {
                let mut array = Vec::with_capacity(items.len() + 1);
                array.push(Value::BulkString(kind.to_string().into_bytes()));
                array.extend(items.into_iter().map(|r| r.into_value(false)));
                Value::Array(array)
            }
        }
    }
}

/// The `redis` crate's value for the error reply `-<text>`, parsed the way
/// the crate parses it off the wire (so that its kind and code are those
/// of a real reply).
pub(crate) fn error_value(text: &str) -> Value {
    let mut line = Vec::with_capacity(text.len() + 3);
    line.push(b'-');
    // A reply line cannot hold a line break: Redis never sends one.
    line.extend(
        text.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    line.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&line) {
        Ok(value) => value,
        Err(_) => Value::SimpleString(format!("-{text}")),
    }
}

/// The errors Redis 7.0 words the same way in many commands.
pub(crate) mod errors {
    pub(crate) const SYNTAX: &str = "ERR syntax error";
    pub(crate) const WRONGTYPE: &str =
        "WRONGTYPE Operation against a key holding the wrong kind of value";
    pub(crate) const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
    pub(crate) const NOT_FLOAT: &str = "ERR value is not a valid float";
    pub(crate) const MIN_MAX_NOT_FLOAT: &str = "ERR min or max is not a float";
    pub(crate) const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
    pub(crate) const READONLY: &str = "READONLY You can't write against a read only replica.";
    pub(crate) const NOAUTH: &str = "NOAUTH Authentication required.";
    pub(crate) const WRONGPASS: &str =
        "WRONGPASS invalid username-password pair or user is disabled.";
    pub(crate) const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

    /// `ERR wrong number of arguments for '<name>' command` (`name` as
    /// Redis spells the command: lowercase, `container|sub`).
    pub(crate) fn arity(name: &str) -> String {
        format!("ERR wrong number of arguments for '{name}' command")
    }
}
