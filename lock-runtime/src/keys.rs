//! Where a lock lives in Redis.
//!
//! A lock named `order:42` lives at `lock:{order:42}`. The braces are a Redis
//! Cluster hash tag: every key derived from the same name
//! (`lock:{order:42}:fence`, `:queue`, `:waiters`) hashes to the same slot,
//! so one Lua script may touch all of them on a cluster.

use crate::error::{ConfigError, LockError};

/// Longest lock name accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Every Redis name one lock uses. Only the lock key is stored (a held lock
/// keeps this for its lifetime); the others are derived when a script needs
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The lock itself: a string holding the holder's token, with the ttl.
    pub(crate) lock: String,
    /// Where the lock's name starts in `lock` (after the prefix and `{`).
    name_start: usize,
    /// Where it ends (before the `}` and the kind's suffix).
    name_end: usize,
}

impl LockKeys {
    /// The keys of the lock `name`; `suffix` follows the hash tag (the lock
    /// kind's, see `Kind::key_suffix`).
    pub(crate) fn new(prefix: &str, name: &str, suffix: &str) -> Result<LockKeys, LockError> {
        let mut lock = lock_key(prefix, name)?;
        let name_end = lock.len() - 1;
        lock.push_str(suffix);
        Ok(LockKeys {
            lock,
            name_start: prefix.len() + 1,
            name_end,
        })
    }

    /// Becomes a copy of `other`, in the memory it has (no allocation when
    /// its key fits: the failover log reuses its oldest entries).
    pub(crate) fn copy_from(&mut self, other: &LockKeys) {
        self.lock.clear();
        self.lock.push_str(&other.lock);
        self.name_start = other.name_start;
        self.name_end = other.name_end;
    }

    /// The lock's name, as given: the key without its prefix, hash tag and
    /// suffix.
    pub(crate) fn name(&self) -> &str {
        &self.lock[self.name_start..self.name_end]
    }

    /// A read/write lock's reader shares (a sorted set: token -> expiry).
    pub(crate) fn readers(&self) -> DerivedKey<'_> {
        DerivedKey(&self.lock, ":readers")
    }

    /// The last fencing token handed out (expires after a retention period).
    pub(crate) fn fence(&self) -> DerivedKey<'_> {
        DerivedKey(&self.lock, ":fence")
    }

    /// The waiters in arrival order (a list of `<channel>|<token>`).
    pub(crate) fn queue(&self) -> DerivedKey<'_> {
        DerivedKey(&self.lock, ":queue")
    }

    /// Over a quorum, the waiters in the order of their tickets (a sorted
    /// set: entry -> ticket).
    pub(crate) fn tickets(&self) -> DerivedKey<'_> {
        DerivedKey(&self.lock, ":tickets")
    }

    /// Each waiter's deadline to refresh its place (a sorted set).
    pub(crate) fn waiters(&self) -> DerivedKey<'_> {
        DerivedKey(&self.lock, ":waiters")
    }
}

/// A key derived from the lock key by a suffix, written straight into a
/// command's buffer (no string is built for it).
#[derive(Clone, Copy)]
pub(crate) struct DerivedKey<'a>(&'a str, &'static str);

impl redis::ToRedisArgs for DerivedKey<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's in-memory buffer cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(self.1.as_bytes());
    }
}

impl std::fmt::Display for DerivedKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.0, self.1)
    }
}

/// The Redis key of the lock called `name`.
pub(crate) fn lock_key(prefix: &str, name: &str) -> Result<String, LockError> {
    if name.is_empty() {
        return Err(ConfigError::InvalidName {
            name: String::new(),
            reason: "a lock name must not be empty: name the resource, e.g. `order:<id>`"
                .to_owned(),
        }
        .into());
    }
    if name.len() > MAX_KEY_LEN {
        return Err(ConfigError::InvalidName {
            name: format!("{}...", name.chars().take(32).collect::<String>()),
            reason: format!(
                "{} bytes long; the limit is {MAX_KEY_LEN}: hash long inputs first",
                name.len()
            ),
        }
        .into());
    }
    if name.starts_with('}') {
        // `lock:{}x}` would carry an empty hash tag: Redis Cluster would then
        // hash the whole key, and keys derived from the same name could land
        // in different slots.
        return Err(ConfigError::InvalidName {
            name: name.to_owned(),
            reason: "it starts with `}`, which would break its Redis Cluster hash tag: start it \
                     with another character"
                .to_owned(),
        }
        .into());
    }
    // Built in one allocation: `format!` costs several times more on a path
    // taken for every lock and unlock.
    // Room for a kind's suffix too (`:sem`).
    let mut key = String::with_capacity(prefix.len() + name.len() + 6);
    key.push_str(prefix);
    key.push('{');
    key.push_str(name);
    key.push('}');
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::lock_key;

    #[test]
    fn wraps_the_name_in_a_hash_tag() {
        assert_eq!(lock_key("lock:", "order:42").unwrap(), "lock:{order:42}");
    }

    #[test]
    fn derived_keys_share_the_hash_tag() {
        let keys = super::LockKeys::new("lock:", "order:42", "").unwrap();
        assert_eq!(keys.name(), "order:42");
        let rw = super::LockKeys::new("lock:", "order:42", ":rw").unwrap();
        assert_eq!(rw.name(), "order:42");
        assert_eq!(rw.readers().to_string(), "lock:{order:42}:rw:readers");
        for key in [keys.fence(), keys.queue(), keys.waiters()].map(|key| key.to_string()) {
            assert!(key.starts_with("lock:{order:42}:"), "{key}");
        }
    }

    #[test]
    fn rejects_empty_and_oversized_names() {
        assert!(lock_key("lock:", "").is_err());
        assert!(lock_key("lock:", &"x".repeat(2000)).is_err());
        assert!(lock_key("lock:", "}x").is_err());
        assert_eq!(lock_key("lock:", "a}b{c").unwrap(), "lock:{a}b{c}");
    }
}
