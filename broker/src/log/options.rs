//! What a shard hands its logs: the shared budgets and settings
//! ([`LogOptions`]) and the storage counters they add to ([`IoStats`]).

use super::{FileBudget, HotTailBudget, WriteGate, HOT_TAIL_LOG_BYTES_DEFAULT, OPEN_READERS_DEFAULT};
use std::cell::Cell;
use std::rc::Rc;

/// A shard's storage counters for `/metrics`, shared by its logs
/// (`Cell`s: one thread, no sharing).
#[derive(Debug, Default)]
pub struct IoStats {
    /// Every fdatasync of segment data on the flush path (flush policy,
    /// recovery points), with how long it took (failed ones too); not the
    /// syncs of rolls, indexes or metadata files.
    pub fdatasync: crate::metrics::LatencyHistogram,
    /// Reads of records answered whole from the hot tail window...
    pub hot_tail_hits: Cell<u64>,
    /// ... and reads that went to the file path (segment files, perhaps
    /// with the newest part from memory).
    pub hot_tail_misses: Cell<u64>,
    /// The shard's data-path stage durations: the log's own (write queue,
    /// write) and the produce and fetch paths' around it.
    pub stages: crate::metrics::Stages,
    /// O_DIRECT segment writes completed and their bytes (padding and
    /// rewritten partial blocks included): the write pattern the disk sees.
    pub writes: Cell<u64>,
    pub write_bytes: Cell<u64>,
}

/// Shard-level settings of a log, given at open ([`Log::open_with`]).
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// The shard's hot-tail budget, shared by all logs of the shard.
    pub hot_tail: Rc<HotTailBudget>,
    /// Most bytes of this log's hot tail window (0: no hot tail).
    pub hot_tail_log_bytes_max: u64,
    /// Most read handles of sealed segments kept open (`.log` and `.index`
    /// each count); the oldest is closed beyond it.
    pub open_readers_max: usize,
    /// The shard's open-file budget, shared by all logs of the shard.
    pub files: Rc<FileBudget>,
    /// The shard's storage counters, shared by all logs of the shard.
    pub io_stats: Rc<IoStats>,
    /// The shard's gate on small writes, shared by all logs of the shard.
    pub gate: Rc<WriteGate>,
    /// Read `.log` segment files with O_DIRECT (on filesystems that support
    /// it) rather than through the page cache: for the plain fetch path,
    /// where cold reads are bulk reads of data the page cache never held.
    /// Off when fetches splice (splice needs page-cache-backed ranges).
    pub direct_reads: bool,
}

impl Default for LogOptions {
    /// The calling thread's (shard's) default hot-tail budget, the default
    /// per-log cap and the default open-handle bound.
    fn default() -> Self {
        LogOptions {
            hot_tail: HotTailBudget::thread_default(),
            hot_tail_log_bytes_max: HOT_TAIL_LOG_BYTES_DEFAULT,
            open_readers_max: OPEN_READERS_DEFAULT,
            files: FileBudget::thread_default(),
            io_stats: Rc::default(),
            gate: WriteGate::thread_default(),
            direct_reads: false,
        }
    }
}
