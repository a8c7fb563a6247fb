//! Per-acquisition tokens.

use crate::error::{ConfigError, LockError};

/// A fresh token: 128 bits read from the operating system's random source
/// (getrandom(2) on Linux) for every acquisition, as 32 hex digits. Never a
/// timestamp or a thread id, and safe across `fork`: no user-space generator
/// state is involved that a child process could share with its parent.
pub(crate) fn new_token() -> Result<String, LockError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|error| ConfigError::NoRandomSource {
        reason: error.to_string(),
    })?;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut token = String::with_capacity(32);
    for byte in bytes {
        token.push(char::from(HEX[usize::from(byte >> 4)]));
        token.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_are_long_and_distinct() {
        let a = super::new_token().unwrap();
        let b = super::new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
