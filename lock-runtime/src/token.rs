//! Per-acquisition tokens and per-client ids.

use crate::error::{ConfigError, LockError};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hex digits, appended to `out`.
fn push_hex(out: &mut String, bytes: &[u8]) {
    for &byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
}

/// `N` bytes from the operating system's random source (getrandom(2) on
/// Linux). Never a timestamp or a thread id, and safe across `fork`: no
/// user-space generator state is involved that a child process could share
/// with its parent.
fn random<const N: usize>() -> Result<[u8; N], LockError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|error| ConfigError::NoRandomSource {
        reason: error.to_string(),
    })?;
    Ok(bytes)
}

/// A client's id: 64 random bits as 16 hex digits, drawn once when the
/// client is built. It ends every token the client hands out and names the
/// client's holder record (`<prefix>client:{<id>}`, docs/design.md §1).
pub(crate) fn new_client_id() -> Result<String, LockError> {
    let mut id = String::with_capacity(CLIENT_ID_LEN);
    push_hex(&mut id, &random::<8>()?);
    Ok(id)
}

/// The length of a client id, in hex digits.
pub(crate) const CLIENT_ID_LEN: usize = 16;

/// The length of a token, in hex digits.
pub(crate) const TOKEN_LEN: usize = 32;

/// A fresh token for one acquisition: 64 bits read from the operating
/// system's random source for every acquisition, then the client's id
/// (`client_id`, 16 hex digits): 32 hex digits in all, as before the id was
/// part of it. The random half tells one client's holds apart (and heads
/// lockctl's listing); the id half names the holder's client, whose record
/// says which process it is, at no cost to the acquisition.
pub(crate) fn new_token(client_id: &str) -> Result<String, LockError> {
    let mut token = String::with_capacity(TOKEN_LEN);
    push_hex(&mut token, &random::<8>()?);
    token.push_str(client_id);
    Ok(token)
}

/// A fresh random id of `TOKEN_LEN` hex digits, owned by nobody's client
/// (a notifier's channel).
pub(crate) fn new_random_id() -> Result<String, LockError> {
    let mut id = String::with_capacity(TOKEN_LEN);
    push_hex(&mut id, &random::<16>()?);
    Ok(id)
}

/// The client id a token ends with, if it is one of this crate's tokens
/// (32 hex digits; a value may follow it after `|`).
pub(crate) fn client_of(token: &str) -> Option<&str> {
    let token = token.split('|').next().unwrap_or(token);
    (token.len() == TOKEN_LEN && token.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| &token[TOKEN_LEN - CLIENT_ID_LEN..])
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_are_long_distinct_and_end_with_the_client_id() {
        let client = super::new_client_id().unwrap();
        assert_eq!(client.len(), 16);
        let a = super::new_token(&client).unwrap();
        let b = super::new_token(&client).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_ne!(a[..16], b[..16], "64 random bits per acquisition");
        assert_eq!(super::client_of(&a), Some(client.as_str()));
        assert_eq!(
            super::client_of(&format!("{a}|q0123")),
            Some(client.as_str())
        );
        assert_eq!(super::client_of("abc"), None);
        assert_ne!(super::new_client_id().unwrap(), client);
        assert_eq!(super::new_random_id().unwrap().len(), 32);
    }
}
