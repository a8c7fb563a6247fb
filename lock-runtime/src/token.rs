//! Per-acquisition tokens.

/// A fresh token: 128 bits from the operating system's random source (through
/// `rand`'s thread-local generator, seeded by the OS), as 32 hex digits. Never
/// a timestamp or a thread id: two acquisitions never share one.
pub(crate) fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_are_long_and_distinct() {
        let a = super::new_token();
        let b = super::new_token();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
