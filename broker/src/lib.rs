//! The Shardlog broker: a thread-per-core server over partitioned commit logs.
//!
//! Modules follow the data path (see ARCHITECTURE.md):
//! `net` → `dispatch` → `shard` → `partition` → `log` → `io`,
//! plus `config`, `topics` (topic metadata store) and `metrics`.

pub mod config;
pub mod log;
