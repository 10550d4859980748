//! Helpers shared by the broker's integration tests.
pub mod zk;
