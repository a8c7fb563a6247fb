//! The lease machinery every lock kind shares: taking a lease (one attempt,
//! or waiting woken by releases), what a holder knows about it (`hold`), the
//! renewal driver, the release, the in-process hand-off between tasks of one
//! client, and the scopes that run bodies under a lease (`watch`). It talks
//! to Redis only through the [`Backend`](crate::backend::Backend).

pub(crate) mod acquire;
pub(crate) mod cohort;
mod extend;
pub(crate) mod guard;
pub(crate) mod hold;
pub(crate) mod holders;
pub(crate) mod local_handoff;
pub(crate) mod loss;
pub(crate) mod multi;
pub(crate) mod release;
pub(crate) mod renewal;
pub(crate) mod replay;
pub(crate) mod set_by_key;
mod set_switch;
pub(crate) mod watch;
pub(crate) mod watch_set;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::backend::Notifier;
use crate::error::LockError;
use crate::token::Random;
use crate::wall_clock::WallClock;
use cohort::Cohorts;
use holders::{Holders, Identity};
use renewal::Renewer;
use replay::Replays;

/// The longest ttl, `max_hold` or `hold_at_least` accepted: a year (far
/// inside what Redis accepts for PX, and what an `Instant` can add). The
/// attribute checks the same limits at compile time.
pub(crate) const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;

/// What every lease of one client shares: the backend, the renewal driver,
/// the notifier its waiters are woken by, its in-process cohorts. A hold
/// keeps it (not the client that made it).
pub(crate) struct Core {
    backend: Arc<dyn Backend>,
    renewer: Arc<Renewer>,
    /// Its recent releases, made good on a new primary after a switch
    /// (Sentinel, a Redis Cluster; `None` elsewhere).
    replays: Option<Arc<Replays>>,
    notifier: Arc<Notifier>,
    cohorts: Cohorts,
    key_prefix: String,
    /// The client's identity, and its holds as its holder record has them.
    holders: Arc<Holders>,
    /// Keys this client released lately while a waiter queued: its next
    /// request for such a key lets that waiter go first.
    handed_over: Mutex<HashMap<String, Instant>>,
    /// Where its tokens' random bits come from.
    random: Random,
}

/// How long after handing a lock over to a waiter this client's own next
/// request for it lets the waiter go first.
const HAND_OVER_WINDOW: Duration = Duration::from_millis(50);

impl Core {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        notifier: Arc<Notifier>,
        key_prefix: String,
        identity: Identity,
        random: Random,
        clock: WallClock,
    ) -> Arc<Core> {
        let replays = Replays::new(&backend);
        Arc::new(Core {
            renewer: Renewer::new(Arc::clone(&backend), replays.clone()),
            replays,
            holders: Holders::new(Arc::clone(&backend), identity, &key_prefix, clock),
            backend,
            notifier,
            cohorts: Cohorts::default(),
            key_prefix,
            handed_over: Mutex::new(HashMap::new()),
            random,
        })
    }

    /// A fresh token for one acquisition of this client.
    pub(crate) fn new_token(&self) -> Result<String, LockError> {
        self.random.token(self.client_id())
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(crate) fn renewer(&self) -> &Arc<Renewer> {
        &self.renewer
    }

    pub(crate) fn replays(&self) -> Option<&Arc<Replays>> {
        self.replays.as_ref()
    }

    pub(crate) fn notifier(&self) -> &Arc<Notifier> {
        &self.notifier
    }

    pub(crate) fn cohorts(&self) -> &Cohorts {
        &self.cohorts
    }

    pub(crate) fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    pub(crate) fn holders(&self) -> &Arc<Holders> {
        &self.holders
    }

    /// This client's id: the end of each of its tokens.
    pub(crate) fn client_id(&self) -> &str {
        &self.holders.identity().client_id
    }

    /// The longest one Redis call may take before it fails with a timeout.
    pub(crate) fn call_deadline(&self) -> Duration {
        self.backend.call_deadline()
    }

    fn handed_over_keys(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.handed_over
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A release of `key` woke a waiter.
    pub(crate) fn handed_over(&self, key: &str) {
        let mut handed_over = self.handed_over_keys();
        let now = Instant::now();
        handed_over.retain(|_, at| now.duration_since(*at) < HAND_OVER_WINDOW);
        handed_over.insert(key.to_owned(), now);
    }

    /// Whether this client handed `key` over to a waiter just now; if so, its
    /// next request should queue behind that waiter rather than race it.
    pub(crate) fn just_handed_over(&self, key: &str) -> bool {
        let mut handed_over = self.handed_over_keys();
        // Mostly empty: no key to hash then.
        !handed_over.is_empty()
            && handed_over
                .remove(key)
                .is_some_and(|at| at.elapsed() < HAND_OVER_WINDOW)
    }
}
