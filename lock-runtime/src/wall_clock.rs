//! The wall clock the client reads: the times of its holder record
//! (docs/design.md §1). The system's, or, with the `simulation` feature and
//! `Config::wall_clock`, the harness's virtual one (docs/design.md §10).
//! Nothing else in the crate reads the wall clock: every deadline runs on
//! `tokio::time::Instant`.

use std::time::SystemTime;

/// A reading of the wall clock; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct WallClock {
    #[cfg(feature = "simulation")]
    hook: Option<std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>>,
}

impl WallClock {
    /// The harness's clock instead of the system's.
    #[cfg(feature = "simulation")]
    pub(crate) fn from_hook(hook: std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        WallClock { hook: Some(hook) }
    }

    /// The time now.
    pub(crate) fn now(&self) -> SystemTime {
        #[cfg(feature = "simulation")]
        if let Some(hook) = &self.hook {
            return hook();
        }
        SystemTime::now()
    }
}
