//! I/O helpers owned by the shard: the io_uring splice engine.

pub mod splice;
