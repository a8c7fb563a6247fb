//! Where one reply ends in the bytes read from a server: the reader of a
//! caller-written connection cuts its buffer into whole replies with this,
//! and the `redis` crate's parser (`redis::parse_redis_value`) makes each
//! a `Value`, so the values are exactly the ones the crate's own
//! connections give.

/// The bytes read are not RESP.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotResp;

/// The length of the reply at the start of `bytes`: `Some` once all of it
/// has arrived, `None` while some is still to come. RESP2 and RESP3 alike
/// (a caller-written connection speaks RESP2, but a reply type it does not
/// expect is cut, not misread).
pub(crate) fn reply_length(bytes: &[u8]) -> Result<Option<usize>, NotResp> {
    let mut at = 0usize;
    // Values still to read: the reply, then the elements its aggregates
    // announced.
    let mut pending = 1usize;
    while pending > 0 {
        let Some(end) = line_end(&bytes[at..]) else {
            return Ok(None);
        };
        // Every line starts with its type.
        if end == 0 {
            return Err(NotResp);
        }
        let kind = bytes[at];
        let line = &bytes[at + 1..at + end];
        at += end + 2;
        pending -= 1;
        match kind {
            // Simple string, error, integer, double, boolean, null, big number.
            b'+' | b'-' | b':' | b',' | b'#' | b'_' | b'(' => {}
            // Bulk string, bulk error, verbatim string: a length (-1: nil),
            // then that many bytes and CRLF.
            b'$' | b'!' | b'=' => {
                if let Some(length) = count(line)? {
                    at = at
                        .checked_add(length)
                        .and_then(|at| at.checked_add(2))
                        .ok_or(NotResp)?;
                    if at > bytes.len() {
                        return Ok(None);
                    }
                    if &bytes[at - 2..at] != b"\r\n" {
                        return Err(NotResp);
                    }
                }
            }
            // Array, set, push: that many values (-1: nil).
            b'*' | b'~' | b'>' => {
                if let Some(elements) = count(line)? {
                    pending = pending.checked_add(elements).ok_or(NotResp)?;
                }
            }
            // Map: twice as many values.
            b'%' => {
                if let Some(pairs) = count(line)? {
                    pending = pairs
                        .checked_mul(2)
                        .and_then(|values| pending.checked_add(values))
                        .ok_or(NotResp)?;
                }
            }
            // Attributes: a map, then the value they describe.
            b'|' => {
                let pairs = count(line)?.ok_or(NotResp)?;
                pending = pairs
                    .checked_mul(2)
                    .and_then(|values| pending.checked_add(values + 1))
                    .ok_or(NotResp)?;
            }
            _ => return Err(NotResp),
        }
    }
    Ok(Some(at))
}

/// Where the first line of `bytes` ends (the index of its CR), if its CRLF
/// has arrived.
fn line_end(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(offset) = bytes[from..].iter().position(|&byte| byte == b'\r') {
        let cr = from + offset;
        match bytes.get(cr + 1) {
            Some(b'\n') => return Some(cr),
            Some(_) => from = cr + 1,
            None => return None,
        }
    }
    None
}

/// A length or count line: `None` for -1 (nil).
fn count(line: &[u8]) -> Result<Option<usize>, NotResp> {
    if line == b"-1" {
        return Ok(None);
    }
    let text = std::str::from_utf8(line).map_err(|_| NotResp)?;
    // At most 512 MB, Redis's own limit on a bulk string: a larger count
    // is garbage, not a reply to wait for.
    match text.parse::<usize>() {
        Ok(count) if count <= 512 * 1024 * 1024 => Ok(Some(count)),
        _ => Err(NotResp),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn whole_replies_are_measured() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR no such key\r\n",
            b":42\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n",
            b"%1\r\n+k\r\n:1\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
            b"_\r\n",
        ];
        for case in cases {
            assert_eq!(reply_length(case), Ok(Some(case.len())), "{case:?}");
            let mut longer = case.to_vec();
            longer.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(reply_length(&longer), Ok(Some(case.len())), "{case:?}");
            for cut in 0..case.len() {
                assert_eq!(
                    reply_length(&case[..cut]),
                    Ok(None),
                    "{case:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn bytes_that_are_not_resp_are_refused() {
        for case in [
            &b"hello\r\n"[..],
            b"$x\r\n",
            b"*-2\r\n",
            b"$3\r\nabcde\r\n",
            b"$99999999999999999999\r\n",
            b"\r\n",
            b"*1\r\n\r\n",
            b"*2\r\n:1\r\n\r\n",
        ] {
            assert_eq!(reply_length(case), Err(NotResp), "{case:?}");
        }
    }

    /// Replies as a server writes them (RESP2), built from a small tree.
    fn reply() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            "[a-zA-Z ]{0,8}".prop_map(|text| format!("+{text}\r\n").into_bytes()),
            "[A-Z]{1,6} [a-z ]{0,8}".prop_map(|text| format!("-{text}\r\n").into_bytes()),
            any::<i64>().prop_map(|number| format!(":{number}\r\n").into_bytes()),
            Just(b"$-1\r\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|data| {
                let mut bytes = format!("${}\r\n", data.len()).into_bytes();
                bytes.extend_from_slice(&data);
                bytes.extend_from_slice(b"\r\n");
                bytes
            }),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            proptest::collection::vec(inner, 0..4).prop_map(|elements| {
                let mut bytes = format!("*{}\r\n", elements.len()).into_bytes();
                for element in elements {
                    bytes.extend_from_slice(&element);
                }
                bytes
            })
        })
    }

    proptest! {
        /// Every reply is measured whole, and the `redis` crate parses
        /// exactly those bytes; no cut short of its end is taken for a
        /// reply.
        #[test]
        fn a_reply_is_measured_to_its_last_byte(reply in reply(), next in reply()) {
            let mut bytes = reply.clone();
            bytes.extend_from_slice(&next);
            prop_assert_eq!(reply_length(&bytes), Ok(Some(reply.len())));
            prop_assert!(redis::parse_redis_value(&reply).is_ok());
            for cut in 0..reply.len() {
                prop_assert_eq!(reply_length(&reply[..cut]), Ok(None));
            }
        }
    }
}
