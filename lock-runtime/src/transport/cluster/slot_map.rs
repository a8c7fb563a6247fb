//! The slot map of a Redis Cluster: which primary serves which slot, as
//! `CLUSTER SLOTS` answers it (kept by the router, `mod.rs`, which routes each call
//! by it; renewals are grouped by it into one pipeline per primary).

use redis::Value;

/// Slot ranges (sorted by start) and the address (`host:port`) of the
/// primary serving each.
pub(crate) type Ranges = Vec<(u16, u16, String)>;

/// The primary serving `slot` in `ranges` (sorted by start).
pub(crate) fn primary_of(ranges: &Ranges, slot: u16) -> Option<&str> {
    let at = ranges.partition_point(|(start, _, _)| *start <= slot);
    let (start, end, address) = ranges.get(at.checked_sub(1)?)?;
    (*start <= slot && slot <= *end).then_some(address.as_str())
}

/// Decodes a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ...],
/// replicas...], ...]`, as the node at `asked` (its host) answered it: an
/// empty host (a node that never learnt its own address, as a one-node
/// cluster), a null one (`cluster-preferred-endpoint-type
/// unknown-endpoint`: "the address you asked") or `?` (hostname mode, no
/// hostname set) mean that host. `None` if it is not such a reply.
pub(crate) fn parse_cluster_slots(reply: &Value, asked: &str) -> Option<Ranges> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut parsed = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let int = |value: Option<&Value>| match value {
            Some(Value::Int(n)) => u16::try_from(*n).ok(),
            _ => None,
        };
        let (start, end) = (int(fields.first())?, int(fields.get(1))?);
        let Some(Value::Array(primary)) = fields.get(2) else {
            return None;
        };
        let host = match primary.first()? {
            Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
            Value::SimpleString(host) => host.clone(),
            Value::Nil => String::new(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked.to_owned()
        } else {
            host
        };
        let port = int(primary.get(1))?;
        parsed.push((start, end, format!("{host}:{port}")));
    }
    parsed.sort();
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::{parse_cluster_slots, primary_of};
    use redis::Value;

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn finds_the_primary_of_a_slot() {
        let reply = Value::Array(vec![
            range(10923, 16383, 7002),
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
        ]);
        let ranges = parse_cluster_slots(&reply, "10.0.0.1").unwrap();
        assert_eq!(primary_of(&ranges, 0), Some("127.0.0.1:7000"));
        assert_eq!(primary_of(&ranges, 5461), Some("127.0.0.1:7001"));
        assert_eq!(primary_of(&ranges, 16383), Some("127.0.0.1:7002"));
        let partial =
            parse_cluster_slots(&Value::Array(vec![range(100, 200, 7000)]), "10.0.0.1").unwrap();
        assert_eq!(primary_of(&partial, 99), None);
        assert_eq!(primary_of(&partial, 201), None);
        assert!(parse_cluster_slots(&Value::Int(1), "10.0.0.1").is_none());
        // A node that does not know its own address: the host asked.
        let unknown = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![Value::BulkString(Vec::new()), Value::Int(7000)]),
        ])]);
        let ranges = parse_cluster_slots(&unknown, "10.0.0.1").unwrap();
        assert_eq!(primary_of(&ranges, 5), Some("10.0.0.1:7000"));
        let null = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![Value::Nil, Value::Int(7001)]),
        ])]);
        let ranges = parse_cluster_slots(&null, "10.0.0.1").unwrap();
        assert_eq!(primary_of(&ranges, 5), Some("10.0.0.1:7001"));
    }
}
