//! Partition log storage. See `LogHelper` task.
