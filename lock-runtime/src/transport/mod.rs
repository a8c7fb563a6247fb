//! How the client reaches Redis: connections to one node (`node`), a Redis
//! Cluster's nodes by its slot map (`cluster`), the primary Redis Sentinel
//! names (`sentinel`).

pub(crate) mod cluster;
pub(crate) mod node;
pub(crate) mod sentinel;
