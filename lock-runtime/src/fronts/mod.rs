//! The public fronts: thin typed builders and guards over the lease
//! machinery (`lease`).

pub(crate) mod lock;
