//! The guide: how the attribute and the manual API behave, how to configure,
//! observe and operate them, and what they guarantee. Each page is a module
//! with no items; the API reference is on the items themselves.
//!
//! - [`attribute`], the attribute: compile-time checks, what is returned
//!   when the lock is not acquired, renewal, waiting and hand-off,
//!   reentrancy, fencing tokens, after the body, the expansion.
//! - [`manual`], the manual API: `Lock`, guards, read/write locks and
//!   semaphores.
//! - [`configuration`], configuration: `init`, `Config`, the ACL rule, Redis Cluster,
//!   quorum, acknowledged mode, TLS.
//! - [`observability`], tracing spans and metrics.
//! - [`operating`], operating with lockctl.
//! - [`guarantees`], what it guarantees, each line with its test.
//! - [`coming_from`], coming from Redisson, rslock, redsync or ShedLock: their
//!   calls and ours, and what has no counterpart.
//!
//! The pages are Markdown files in `lock-runtime/src/guide/`, readable on
//! the repository's web pages too. A link between pages is written as a
//! reference (`[text][guide-tls]`), defined at the page's end for the
//! repository (`configuration.md#tls`) and in `links.md` for rustdoc
//! (`crate::guide::configuration#tls`), whose definitions come first and so
//! win here.

// Every page: rustdoc's link definitions first (the first definition of a
// label wins), then the page.
macro_rules! page {
    ($(#[$meta:meta])* $name:ident, $file:literal) => {
        $(#[$meta])*
        #[doc = include_str!("links.md")]
        #[doc = include_str!($file)]
        pub mod $name {}
    };
}

page!(attribute, "attribute.md");
page!(manual, "manual.md");
page!(configuration, "configuration.md");
page!(observability, "observability.md");
page!(operating, "operating.md");
page!(guarantees, "guarantees.md");
page!(coming_from, "coming_from.md");
