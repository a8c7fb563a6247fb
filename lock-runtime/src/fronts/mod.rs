//! The public fronts: thin typed builders and guards over the lease
//! machinery (`lease`).

pub(crate) mod lock;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;
