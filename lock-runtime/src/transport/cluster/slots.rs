//! Redis Cluster hash slots: which slot a key is in, and a short hash tag
//! for each slot (so that a client's per-slot notification channel can be
//! put in the slot of the locks whose releases publish on it).

use std::sync::LazyLock;

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// text between the first `{` and the next `}`, if not empty) or of the
/// whole key, modulo 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS as u16
}

/// A hash tag (at most 3 characters of `[0-9a-zA-Z]`) whose slot is `slot`:
/// a key or channel containing `{<tag>}` is in that slot.
pub(crate) fn tag(slot: u16) -> &'static str {
    &TAGS[usize::from(slot) % SLOTS]
}

/// The first tag found for each slot, trying 1-, 2- then 3-character tags
/// (about 240,000 CRC16s of 3 bytes, once per process, and only on a
/// cluster). Every slot has one (a unit test checks it); the 4-character
/// pass below is never reached in practice.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut tags = vec![String::new(); SLOTS];
    let mut missing = SLOTS;
    let mut candidate = Vec::with_capacity(4);
    for length in 1..=4 {
        let mut digits = vec![0usize; length];
        'candidates: loop {
            candidate.clear();
            candidate.extend(digits.iter().map(|&digit| ALPHABET[digit]));
            let found = &mut tags[usize::from(crc16(&candidate)) % SLOTS];
            if found.is_empty() {
                *found = String::from_utf8_lossy(&candidate).into_owned();
                missing -= 1;
                if missing == 0 {
                    return tags;
                }
            }
            // The next candidate of this length (an odometer).
            for digit in digits.iter_mut().rev() {
                *digit += 1;
                if *digit < ALPHABET.len() {
                    continue 'candidates;
                }
                *digit = 0;
            }
            break;
        }
    }
    tags
});

/// CRC16-CCITT (XMODEM), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::{slot, tag, SLOTS};

    #[test]
    fn slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(slot("lock:{order:42}:queue"), slot("order:42"));
    }

    #[test]
    fn every_slot_has_a_short_tag() {
        for s in 0..SLOTS as u16 {
            let tag = tag(s);
            assert!(!tag.is_empty() && tag.len() <= 3, "slot {s}: {tag:?}");
            assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()));
            assert_eq!(slot(&format!("lock-waiters:x:{{{tag}}}")), s);
        }
    }
}
