//! Per-acquisition tokens and per-client ids, and where a client's random
//! bits come from ([`Random`]).

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

/// Where a client's random bits come from: the operating system (see
/// [`random`], [`Batch`]), or, with the `simulation` feature and
/// `Config::random_seed`, a generator seeded by the harness, so that the
/// same seed gives the same ids, tokens and pauses (docs/design.md §10).
/// Cheap to clone; clones draw from one sequence.
#[derive(Clone, Default)]
pub(crate) struct Random {
    #[cfg(feature = "simulation")]
    seeded: Option<std::sync::Arc<std::sync::Mutex<SplitMix>>>,
}

impl Random {
    /// A generator whose bits are a function of `seed`.
    #[cfg(feature = "simulation")]
    pub(crate) fn seeded(seed: u64) -> Random {
        Random {
            seeded: Some(std::sync::Arc::new(std::sync::Mutex::new(SplitMix(seed)))),
        }
    }

    /// The seeded generator's next bytes, if there is one.
    #[inline]
    fn drawn<const N: usize>(&self) -> Option<[u8; N]> {
        #[cfg(feature = "simulation")]
        if let Some(seeded) = &self.seeded {
            let mut generator = seeded
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut bytes = [0u8; N];
            for chunk in bytes.chunks_mut(8) {
                chunk.copy_from_slice(&generator.next().to_be_bytes()[..chunk.len()]);
            }
            return Some(bytes);
        }
        None
    }

    fn bytes<const N: usize>(&self) -> Result<[u8; N], LockError> {
        match self.drawn() {
            Some(bytes) => Ok(bytes),
            None => random(),
        }
    }

    /// A client's id: 64 random bits as 16 hex digits, drawn once when the
    /// client is built. It ends every token the client hands out and names
    /// the client's holder record (`<prefix>client:{<id>}`, docs/design.md
    /// §1).
    pub(crate) fn client_id(&self) -> Result<String, LockError> {
        let mut id = String::with_capacity(CLIENT_ID_LEN);
        push_hex(&mut id, &self.bytes::<8>()?);
        Ok(id)
    }

    /// A fresh token for one acquisition: 64 random bits (from the
    /// operating system, read in batches, see [`Batch`]), then the
    /// client's id (`client_id`, 16 hex digits): 32 hex digits in all. The
    /// random half tells one client's holds apart (and heads lockctl's
    /// listing); the id half names the holder's client, whose record says
    /// which process it is, at no cost to the acquisition.
    pub(crate) fn token(&self, client_id: &str) -> Result<String, LockError> {
        let head = match self.drawn() {
            Some(bytes) => bytes,
            None => random_8()?,
        };
        let mut token = String::with_capacity(TOKEN_LEN);
        push_hex(&mut token, &head);
        token.push_str(client_id);
        Ok(token)
    }

    /// A fresh random id of `TOKEN_LEN` hex digits, owned by nobody's
    /// client (a notifier's channel).
    pub(crate) fn random_id(&self) -> Result<String, LockError> {
        let mut id = String::with_capacity(TOKEN_LEN);
        push_hex(&mut id, &self.bytes::<16>()?);
        Ok(id)
    }

    /// A number below `most` (0 if `most` is 0, or if the operating
    /// system's source failed: used for pauses, never for tokens).
    pub(crate) fn below(&self, most: u64) -> u64 {
        let bytes = self.bytes::<8>().unwrap_or_default();
        u64::from_be_bytes(bytes) % most.max(1)
    }
}

/// SplitMix64 (Steele, Lea and Flood): a small generator whose whole
/// sequence follows from its seed; for simulation only, never for real
/// tokens.
#[cfg(feature = "simulation")]
struct SplitMix(u64);

#[cfg(feature = "simulation")]
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The length of a client id, in hex digits.
pub(crate) const CLIENT_ID_LEN: usize = 16;

/// The length of a token, in hex digits.
pub(crate) const TOKEN_LEN: usize = 32;

/// Random bytes read from the operating system 256 at a time and handed out
/// 8 per token, by the thread that read them: one getrandom(2) call per 32
/// acquisitions instead of one each (the call was 2-3 % of the client CPU
/// of an uncontended acquire and release). Each byte is handed out once.
/// A process forked from this one starts with a copy of the thread's
/// batch: the batch remembers how many forks this process had come from
/// when it was read ([`forks`]), and a batch read before a fork is thrown
/// away, so parent and child never hand out the same bytes.
struct Batch {
    forks: u64,
    bytes: [u8; 256],
    next: usize,
}

thread_local! {
    static BATCH: std::cell::RefCell<Batch> = const {
        std::cell::RefCell::new(Batch { forks: 0, bytes: [0; 256], next: 256 })
    };
}

/// 8 bytes of the operating system's random source, from this thread's
/// batch.
fn random_8() -> Result<[u8; 8], LockError> {
    BATCH.with(|batch| {
        let mut batch = batch.borrow_mut();
        let forks = forks();
        if batch.next + 8 > batch.bytes.len() || batch.forks != forks {
            batch.bytes = random::<256>()?;
            batch.forks = forks;
            batch.next = 0;
        }
        let at = batch.next;
        batch.next += 8;
        let mut out = [0u8; 8];
        out.copy_from_slice(&batch.bytes[at..at + 8]);
        // Not kept once handed out.
        batch.bytes[at..at + 8].fill(0);
        Ok(out)
    })
}

/// How many `fork`s this process is from the one that first asked: a
/// handler registered with `pthread_atfork` adds one in each child. An
/// atomic load per token where `getpid(2)` was a system call per token
/// (1 of the 6 system calls per pair a quorum's W1 made more than rslock,
/// issue 40).
#[cfg(unix)]
fn forks() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FORKS: AtomicU64 = AtomicU64::new(0);
    static REGISTER: std::sync::Once = std::sync::Once::new();
    extern "C" fn in_child() {
        // Only what is safe in a child of a threaded process: an atomic add.
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only adds to an atomic; it
        // cannot fail but for lack of memory, when the process-id check
        // below stands in.
        let registered = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if registered != 0 {
            FORKS.store(u64::MAX, Ordering::Relaxed);
        }
    });
    match FORKS.load(Ordering::Relaxed) {
        // Not registered: the process id tells a child from its parent.
        u64::MAX => u64::from(std::process::id()) | (1 << 63),
        forks => forks,
    }
}

#[cfg(not(unix))]
fn forks() -> u64 {
    0
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
        let client = super::Random::default().client_id().unwrap();
        assert_eq!(client.len(), 16);
        let a = super::Random::default().token(&client).unwrap();
        let b = super::Random::default().token(&client).unwrap();
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
        assert_ne!(super::Random::default().client_id().unwrap(), client);
        assert_eq!(super::Random::default().random_id().unwrap().len(), 32);
    }

    /// A child forked after this thread read a batch does not hand out the
    /// parent's next bytes (without the fork count it would: the child
    /// starts with a copy of the batch).
    #[cfg(unix)]
    #[test]
    fn a_forked_child_never_hands_out_the_parents_bytes() {
        super::random_8().unwrap(); // this thread has a batch now
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // Only what is safe after fork in a threaded process: no
            // allocation, a write, _exit.
            let bytes = super::random_8().unwrap_or([0; 8]);
            unsafe {
                libc::write(fds[1], bytes.as_ptr().cast(), 8);
                libc::_exit(0);
            }
        }
        let mut childs = [0u8; 8];
        let read = unsafe { libc::read(fds[0], childs.as_mut_ptr().cast(), 8) };
        unsafe {
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(read, 8);
        let parents = super::random_8().unwrap();
        assert_ne!(parents, childs);
    }

    #[test]
    fn a_thousand_tokens_of_one_thread_are_distinct() {
        let client = super::Random::default().client_id().unwrap();
        let heads: std::collections::HashSet<String> = (0..1000)
            .map(|_| super::Random::default().token(&client).unwrap()[..16].to_owned())
            .collect();
        assert_eq!(heads.len(), 1000);
    }

    /// The same seed gives the same ids and tokens; another seed others.
    #[cfg(feature = "simulation")]
    #[test]
    fn a_seeded_source_repeats_itself() {
        let draw = |seed| {
            let random = super::Random::seeded(seed);
            let id = random.client_id().unwrap();
            let tokens: Vec<String> = (0..3).map(|_| random.token(&id).unwrap()).collect();
            (id, tokens, random.random_id().unwrap(), random.below(1000))
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let (id, tokens, _, _) = draw(7);
        assert_eq!(id.len(), 16);
        assert!(tokens
            .iter()
            .all(|token| token.len() == 32 && token.ends_with(&id)));
        assert_ne!(tokens[0], tokens[1]);
    }
}
