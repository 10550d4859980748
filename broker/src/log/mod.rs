//! Partition log storage: segments, sparse indexes, group-commit appends,
//! recovery and retention.
//!
//! A [`Log`] owns one partition directory and lives on one shard. Its state
//! sits in a `RefCell` that is never borrowed across an `.await`, so many
//! connection tasks share it as `Rc<Log>`.
//!
//! ```text
//! <dir>/partition.metadata             {"version":1}
//!       00000000000000000000.log       batches, back to back (schema::batch format)
//!       00000000000000000000.index     sparse offset -> position, + trailer (sealed only)
//!       00000000000000000000.timeindex running max timestamp -> offset/position
//!       00000000000000004242.log       the active segment (the last one)
//!       .clean_shutdown                written by close(), removed by open()
//! ```
//!
//! Write path (group commit). `append` validates, stamps and copies the
//! batches into the active segment's fill buffer (a queue of 1 MiB aligned
//! `DmaBuffer` chunks that starts with the partial last block already on
//! disk), queues a slot and waits on it. One write task at a time takes the
//! first chunk when it is full, or else copies the partial chunk into a
//! buffer of its block-aligned size (the chunk stays, so a partition that
//! writes little holds one chunk, not a new one per write), and writes it
//! with one O_DIRECT write at its block-aligned position; a partial last
//! block is carried to the front of the chunk and rewritten by the next
//! write. Up to [`WRITES_IN_FLIGHT_MAX`] writes are in flight: a second one starts only where the first ends (a full chunk never
//! shares a block with the next), and completions are applied in issue
//! order, so `written_pos` only covers bytes every earlier write has landed.
//! Appends that arrive while writes are in flight fill the next chunks.
//! A separate sync task issues `fdatasync` (one covers every append written
//! before it started), so a write and a sync overlap. A write of less than a
//! chunk that goes straight to the device also needs a place at the shard's
//! [`WriteGate`] (`gate`): while the shard's places are taken, its log
//! gathers appends and writes them together when its turn comes.
//!
//! ```text
//!   positions in the active segment, each only grows (except rollback):
//!   0 ....... durable_pos ....... written_pos ....... end_pos
//!             fdatasync'ed        write completed     assigned (in the fill buffer)
//! ```
//!
//! The high watermark is `written` (flush `interval` / `never`) or `durable`
//! (flush `always`); reads never go past it, so they only touch bytes the
//! file has. A failed write (disk full) rolls `end_pos` back to
//! `written_pos` and fails exactly the appends that were not written; a
//! failed fdatasync poisons the log.
//!
//! Reads binary-search the segments by base offset, look the offset up in
//! the sparse index (in memory for the active segment, a page at a time from
//! disk for sealed ones) and scan at most one index interval of headers. They
//! return file ranges of a buffered fd (for splice) plus, for the last
//! partial block, a copy from memory.
//!
//! Open files (`files`): the active segment's write fd, its read fd (opened
//! by the first read the hot tail cannot answer) and sealed segments' read
//! fds are counted in the shard's [`FileBudget`] and closed least recently
//! used first beyond it; the write fd only while the log is idle. They
//! reopen on the next append, sync, seal or read.
//!
//! Hot tail (`hot`): every completed write also copies its new whole
//! batches into a per-log window of `Bytes` over the end of the active
//! segment, bounded per log and by a per-shard [`HotTailBudget`] with LRU
//! eviction across logs. A read whose whole answer lies in the window is
//! answered from it synchronously as [`ReadChunk::Memory`] slices (no file
//! access); otherwise it takes the file path above.

mod admit;
mod checked;
mod compact;
pub mod dump;
mod epochs;
mod error;
mod files;
mod gate;
mod hot;
pub mod index;
mod notify;
pub mod producers;
mod segment;

mod options;
use checked::check_append_bytes;
pub use checked::{CheckError, CheckedBatches};
pub use compact::CompactOutcome;
pub use epochs::LeaderEpochs;
pub(crate) use error::is_no_space;
pub use error::LogError;
pub use files::{
    process_files_limit, shard_files_max, FileBudget, OPEN_FILES_RESERVE_FRACTION, OPEN_FILES_RESERVE_MIN,
    OPEN_FILES_SHARD_MIN,
};
pub use gate::{WriteGate, SMALL_WRITES_IN_FLIGHT_DEFAULT};
pub use hot::{HotTailBudget, HOT_TAIL_LOG_BYTES_DEFAULT, HOT_TAIL_SHARD_BYTES_DEFAULT};
pub use options::{IoStats, LogOptions};
pub use segment::SegmentFile;
use state::{remove_if_exists, remove_segment_files, sync_dir, sync_filesystem};

use crate::config::{FlushPolicy, TopicConfig};
use bytes::Bytes;
use files::{Evict, FileToken, ReaderSlot};
use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use index::{IndexBuilder, IndexEntry, SegmentSummary};
use notify::{Notify, Slot};
use segment::{ClosedSegment, Scan, ScanStop, INDEX_EXT, LOG_EXT, TIME_INDEX_EXT};
use shardlog_schema::batch::{self, BatchHeader};
use shardlog_schema::Offset;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Alignment of every O_DIRECT write (at least the device's logical block).
const BLOCK_BYTES_MIN: u64 = 4096;
/// The fill buffer is a queue of aligned chunks of this size. A write takes
/// one full chunk (or the last, partial one), so while it is in flight the
/// next chunks keep filling and the next write is ready when it completes.
const CHUNK_BYTES: usize = 1 << 20;
/// Written chunks kept for reuse (no fresh allocation, no page faults).
const SPARE_CHUNKS_MAX: usize = 4;
/// Appends wait (back-pressure) while this many bytes are not yet written.
const UNWRITTEN_BYTES_MAX: u64 = 32 << 20;
/// Largest single `append` call.
pub const APPEND_BYTES_MAX: usize = 64 << 20;
/// Largest fallocate step for the active segment. Large, so the fallocate (a
/// journaled metadata operation that waits for in-flight direct I/O) is rare
/// on a busy partition.
const PREALLOC_BYTES_STEP: u64 = 256 << 20;
/// First fallocate step. Steps double with the space already allocated, so a
/// quiet partition holds about twice its data, not 256 MiB: a broker with
/// thousands of partitions must not reserve the disk up front.
const PREALLOC_BYTES_STEP_MIN: u64 = 1 << 20;
/// O_DIRECT writes in flight per log. A second write may only start where
/// the first ends (full chunks), never in a block another write still owns.
const WRITES_IN_FLIGHT_MAX: usize = 2;
/// Positions in a segment are u32 in the index; keep clear of the edge.
const SEGMENT_BYTES_CAP: u64 = (1 << 31) - APPEND_BYTES_MAX as u64;
/// Default bound on read handles of sealed segments kept open per log (the
/// `.log` and `.index` each count); see [`LogOptions::open_readers_max`].
pub const OPEN_READERS_DEFAULT: usize = 1024;
const CLEAN_SHUTDOWN_FILE: &str = ".clean_shutdown";
const METADATA_FILE: &str = "partition.metadata";
const METADATA_VERSION: u64 = 1;

const _: () = assert!(APPEND_BYTES_MAX as u64 <= SEGMENT_BYTES_CAP);
const _: () = assert!(CHUNK_BYTES as u64 <= UNWRITTEN_BYTES_MAX);
const _: () = assert!(CHUNK_BYTES & (BLOCK_BYTES_MIN as usize - 1) == 0);

/// What an append was assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub append_time_ms: i64,
    pub log_start_offset: Offset,
    /// When the append took its place in the log and when its bytes were
    /// written (both the answer's instant for a duplicate): the latency
    /// breakdown's `produce_in` ends and `produce_out` starts there.
    pub enqueued_at: Instant,
    pub written_at: Instant,
}

/// Whole batches returned by [`Log::read`].
#[derive(Debug)]
pub struct LogRead {
    /// Base offset of the first batch (may be below the offset asked for).
    pub first_offset: Offset,
    /// Last offset of the last batch (inclusive); meaningless when empty.
    pub last_offset: Offset,
    pub bytes: usize,
    pub chunks: Vec<ReadChunk>,
}

/// A piece of a read result.
#[derive(Debug)]
pub enum ReadChunk {
    /// A byte range of a segment file; `file` keeps the fd open.
    File { file: Rc<SegmentFile>, position: u64, len: usize },
    /// Bytes from memory: the hot tail window, or the partial last block of
    /// the active segment.
    Memory(Bytes),
}

impl LogRead {
    fn empty(at: Offset) -> LogRead {
        LogRead { first_offset: at, last_offset: at, bytes: 0, chunks: Vec::new() }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The batch bytes, concatenated.
    pub async fn into_bytes(self) -> Result<Vec<u8>, LogError> {
        let mut out = Vec::with_capacity(self.bytes);
        for c in self.chunks {
            match c {
                ReadChunk::File { file, position, len } => {
                    let got = file.read_bytes(position, len).await?;
                    if got.len() != len {
                        return Err(LogError::Corrupt {
                            path: file.path().to_path_buf(),
                            what: format!("segment ends before position {}", position + len as u64),
                        });
                    }
                    out.extend_from_slice(&got);
                }
                ReadChunk::Memory(b) => out.extend_from_slice(&b),
            }
        }
        Ok(out)
    }
}

/// What `enforce_retention` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
}

/// Counters, for benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub appends: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub fdatasyncs: u64,
    pub rolls: u64,
}

/// A partition log. See the module docs.
pub struct Log {
    sh: Rc<Shared>,
}

struct Shared {
    dir: PathBuf,
    config: TopicConfig,
    direct_io: bool,
    /// `.log` read handles open with O_DIRECT (see [`LogOptions::direct_reads`]).
    direct_reads: bool,
    block: u64,
    /// The order appends enqueue in: call order (see `admit`).
    admission: admit::Admission,
    st: RefCell<State>,
    changed: Notify,
    /// The hot tail window over the active segment (its own cell: the
    /// shard budget evicts from it while another log's state is borrowed).
    hot: Rc<RefCell<hot::HotWindow>>,
    open_readers_max: usize,
    /// The shard's open-file budget; this log's write fd has an LRU place
    /// at `write_tick` while it is open.
    files: Rc<FileBudget>,
    io_stats: Rc<IoStats>,
    /// The shard's gate on small writes (`gate`).
    gate: Rc<WriteGate>,
    write_tick: Cell<Option<u64>>,
    /// A leader-epoch checkpoint write is in progress (`epochs`).
    epochs_writing: Cell<bool>,
    /// A recovery point is being written (`recovery_point`).
    recovery_point_writing: Cell<bool>,
}

/// Resolves with the instant the append's bytes were written (for the
/// latency breakdown), or its failure.
type AppendSlot = Slot<Result<Instant, LogError>>;

struct Waiter {
    end_pos: u64,
    durable: bool,
    slot: Rc<AppendSlot>,
    /// An append's: when it took its place, and its record count (a flush
    /// has neither and is not counted in the stage histograms).
    enqueued: Option<(Instant, u64)>,
    /// Set when its bytes are written, for a durable waiter that then waits
    /// for the fdatasync.
    written_at: Option<Instant>,
}

struct State {
    closed: VecDeque<ClosedSegment>,
    closed_bytes: u64,
    active: Active,
    failed: Option<String>,
    shut: bool,
    rolling: bool,
    roll_gen: u64,
    roll_error: Option<LogError>,
    /// Writes issued and not yet completed in order.
    writes_in_flight: usize,
    /// Queued at the shard's gate for a small write (`gate`).
    gate_queued: bool,

    /// End (block-aligned) of the last write issued; the next may start there.
    issued_end: u64,
    /// Sequence numbers: next to issue, next to complete (in issue order).
    write_seq_issue: u64,
    write_seq_complete: u64,
    /// Finished writes waiting for an earlier one, by sequence number.
    write_done: std::collections::BTreeMap<u64, (WriteJob, Result<(), LogError>)>,
    /// Bumped when a failed write rolls back; older writes are then ignored.
    write_gen: u64,
    sync_busy: bool,
    /// Appends (and flushes) waiting for their bytes to be written, by end_pos.
    unwritten: VecDeque<Waiter>,
    /// Written, waiting for an fdatasync, by end_pos.
    unsynced: VecDeque<Waiter>,
    last_sync_ms: i64,
    bytes_since_sync: u64,
    stats: LogStats,
    /// A compaction pass runs (`compact`): retention and deletion wait.
    compacting: bool,
    /// Where the last compaction pass ended: segments from here are dirty.
    cleaned_upto: u64,
    /// Sealed segments with an open read handle, oldest first: `(base, is_index)`.
    /// Bounded by [`LogOptions::open_readers_max`] so thousands of segments do not hold
    /// thousands of fds.
    open_readers: VecDeque<(u64, bool)>,
    /// Idempotent producers' sequence windows (`idempotence`).
    producers: producers::ProducerStates,
    /// The leader-epoch history (`epochs`).
    epochs: LeaderEpochs,
    /// The last recovery point written (`recovery_point`).
    recovery_point: recovery_point::Written,
}

/// Metadata of a batch copied into the fill buffer but not yet written.
struct BatchMeta {
    rel_offset: u32,
    pos: u64,
    end: u64,
    /// Offset after the batch.
    next: u64,
    first_ts: i64,
    max_ts: i64,
}

/// The active segment's O_DIRECT write handle, counted in the file budget.
struct WriteFile {
    file: DmaFile,
    _token: FileToken,
}

impl std::ops::Deref for WriteFile {
    type Target = DmaFile;

    fn deref(&self) -> &DmaFile {
        &self.file
    }
}

struct Active {
    base: u64,
    path: PathBuf,
    /// `None` while closed by the file budget (an idle log); reopened by the
    /// next write, sync or seal ([`write_file`]).
    file: Option<Rc<WriteFile>>,
    /// Opened by the first read that misses the hot tail.
    reader: Rc<ReaderSlot<SegmentFile>>,
    created_ms: i64,
    end_pos: u64,
    next_offset: u64,
    written_pos: u64,
    written_next: u64,
    durable_pos: u64,
    durable_next: u64,
    /// The index's (entries, time entries) and (max, first) timestamps
    /// when it covered exactly `[0, durable_pos)`, for the recovery point.
    durable_index: (usize, usize),
    durable_max_ts: (i64, i64),
    /// File size after preallocation.
    allocated: u64,
    /// Bytes `[fill_start, fill_start + fill_len)` of the segment, in
    /// `CHUNK_BYTES` chunks (chunk `i` starts at `fill_start + i * CHUNK_BYTES`);
    /// `fill_start` is block-aligned and `fill_start + fill_len == end_pos`.
    /// The first bytes may be the already-written partial last block.
    fill: VecDeque<DmaBuffer>,
    fill_start: u64,
    fill_len: usize,
    spare: Vec<DmaBuffer>,
    unwritten_batches: VecDeque<BatchMeta>,
    index: IndexBuilder,
    /// Copy of `[tail_start, written_pos)`, the written partial last block.
    tail: Vec<u8>,
    tail_start: u64,
    /// Written bytes `[written_pos, written_pos + len)` of a batch that is
    /// not yet whole on disk (it spans writes), for the hot tail. At most one
    /// batch; empty when the hot tail is off.
    hot_staged: Vec<u8>,
}

struct WriteJob {
    base: u64,
    /// The write handle when it was open at issue; else opened by the write.
    file: Option<Rc<WriteFile>>,
    path: PathBuf,
    buf: write::WriteBuf,
    pos: u64,
    /// End of the real data in `buf` (the rest is padding).
    data_end: u64,
    prealloc_to: Option<u64>,
    seq: u64,
    generation: u64,
    issued_at: Instant,
    /// Its place at the shard's gate (a small write).
    place: Option<gate::Place>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CleanMarker {
    next_offset: u64,
    active_base: u64,
    active_bytes: u64,
}

#[must_use]
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn align_down(v: u64, block: u64) -> u64 {
    v & !(block - 1)
}

fn align_up(v: u64, block: u64) -> u64 {
    align_down(v + block - 1, block)
}

impl Log {
    /// Opens (creating if needed) the log in `dir` and recovers it, with
    /// [`LogOptions::default`] (the thread's shared hot-tail budget).
    pub async fn open(dir: PathBuf, config: TopicConfig) -> Result<Log, LogError> {
        Log::open_with(dir, config, LogOptions::default()).await
    }

    /// [`Log::open`] with shard-level options (the shard's hot-tail budget).
    /// A log it creates is durable (directory, entry, files) on return.
    pub async fn open_with(dir: PathBuf, config: TopicConfig, options: LogOptions) -> Result<Log, LogError> {
        let (log, created) = recovery::open(dir, config, options).await?;
        if created {
            sync_filesystem(&log.sh.dir).await.map_err(|e| LogError::io("syncfs", &log.sh.dir, e))?;
        }
        Ok(log)
    }

    /// [`Log::open_with`] for a wave of logs at once (a new topic's
    /// partitions): they open concurrently, and the ones created are made
    /// durable together by one `syncfs` before any is returned, instead of
    /// an fsync of each file and directory. The `dirs` must be on one
    /// filesystem (one data directory): `syncfs` covers the filesystem of
    /// the first log created. Keep a wave small (tens): each wake polls
    /// every open still running.
    pub async fn open_wave(
        dirs: Vec<PathBuf>,
        config: &TopicConfig,
        options: &LogOptions,
    ) -> Vec<Result<Log, LogError>> {
        let opens = dirs.into_iter().map(|dir| recovery::open(dir, config.clone(), options.clone()));
        let opened = crate::join::join_all(opens.collect()).await;
        let Some(dir) = opened.iter().find_map(|o| o.as_ref().ok().filter(|(_, created)| *created)) else {
            return opened.into_iter().map(|o| o.map(|(log, _)| log)).collect();
        };
        // One error, given to each log created (each names its own dir).
        let synced = sync_filesystem(&dir.0.sh.dir).await.map_err(|e| (e.raw_os_error(), e.kind()));
        opened
            .into_iter()
            .map(|o| match (o?, synced) {
                ((log, true), Err((code, kind))) => {
                    let e =
                        code.map_or_else(|| std::io::Error::from(kind), std::io::Error::from_raw_os_error);
                    Err(LogError::io("syncfs", &log.sh.dir, e))
                }
                ((log, _), _) => Ok(log),
            })
            .collect()
    }

    /// Bytes of this log held in its hot tail window now.
    #[must_use]
    pub fn hot_tail_bytes(&self) -> u64 {
        self.sh.hot.borrow().held_bytes()
    }

    /// Appends whole batches. See the module docs for the write path.
    ///
    /// Appends enter the log in the order this method is *called*, whatever
    /// each of them then waits for (a roll, back-pressure): the ticket is
    /// taken here, before the returned future is first polled (`admit`).
    pub fn append<'a>(
        &'a self,
        batches: &'a [u8],
        leader_epoch: i32,
    ) -> impl std::future::Future<Output = Result<AppendInfo, LogError>> + 'a {
        self.append_as(self.check_stored(batches), Stamp::Leader(leader_epoch))
    }

    /// [`Self::append`] of batches already checked (a produce request's,
    /// by the partition): nothing is validated again, so each produced byte
    /// is CRC'd once.
    pub fn append_checked<'a>(
        &'a self,
        checked: CheckedBatches<'a>,
        leader_epoch: i32,
    ) -> impl std::future::Future<Output = Result<AppendInfo, LogError>> + 'a {
        self.append_as(Ok(checked), Stamp::Leader(leader_epoch))
    }

    /// A follower's append: the leader's batches unchanged (their offsets,
    /// leader epochs and bytes), which must start at this log's end and be
    /// contiguous ([`LogError::ReplicaOffsetMismatch`] otherwise). Idempotent
    /// producers' sequences are recorded (not checked: the leader did), so
    /// a follower that becomes leader knows them.
    pub fn append_replica<'a>(
        &'a self,
        batches: &'a [u8],
    ) -> impl std::future::Future<Output = Result<AppendInfo, LogError>> + 'a {
        self.append_as(self.check_stored(batches), Stamp::Replica)
    }

    fn check_stored<'a>(&self, batches: &'a [u8]) -> Result<CheckedBatches<'a>, LogError> {
        check_append_bytes(batches.len())?;
        Ok(CheckedBatches::stored(batches, self.sh.config.batch_bytes_max as usize)?)
    }

    fn append_as<'a>(
        &'a self,
        checked: Result<CheckedBatches<'a>, LogError>,
        stamp: Stamp,
    ) -> impl std::future::Future<Output = Result<AppendInfo, LogError>> + 'a {
        let checked = checked.and_then(|c| check_append_bytes(c.bytes().len()).map(|()| c));
        let ticket = checked.is_ok().then(|| Ticket::take(&self.sh));
        async move {
            let checked = checked?;
            let ticket = ticket.expect("a ticket is taken for every valid append");
            self.append_in_turn(checked.bytes(), checked.headers(), stamp, ticket).await
        }
    }

    async fn append_in_turn(
        &self,
        batches: &[u8],
        headers: &[BatchHeader],
        stamp: Stamp,
        ticket: Ticket<'_>,
    ) -> Result<AppendInfo, LogError> {
        let sh = &self.sh;
        let durable = sh.config.flush == FlushPolicy::Always;
        let mut waited_roll: Option<u64> = None;
        loop {
            let listen = sh.changed.listen();
            let mut start_roll = false;
            let mut duplicate = None;
            let mut new_epoch = false;
            let slot_and_info = {
                let mut st = sh.st.borrow_mut();
                st.check_writable(&sh.dir)?;
                if let Some(generation) = waited_roll {
                    if st.roll_gen != generation {
                        waited_roll = None;
                        if let Some(e) = &st.roll_error {
                            return Err(e.duplicate());
                        }
                    }
                }
                if !sh.admission.is_turn(ticket.number) {
                    None // an earlier append waits: it goes first
                } else if st.rolling {
                    waited_roll = Some(st.roll_gen);
                    None
                } else if st.needs_roll(&sh.config, batches.len(), headers) {
                    st.rolling = true;
                    waited_roll = Some(st.roll_gen);
                    start_roll = true;
                    None
                } else if st.active.end_pos - st.active.written_pos + batches.len() as u64
                    > UNWRITTEN_BYTES_MAX
                    && st.active.end_pos > st.active.written_pos
                {
                    None // back-pressure: wait for the write in flight
                } else if stamp == Stamp::Replica {
                    check_replica_offsets(headers, st.active.next_offset)?;
                    let (slot, info) = st.enqueue(batches, headers, stamp, durable);
                    st.record_sequences(headers, info.base_offset.0);
                    new_epoch = st.note_epochs(headers, stamp, info.base_offset.0);
                    Some((slot, info))
                } else if let Some(dup) = st.check_sequences(headers)? {
                    duplicate = Some(dup);
                    None
                } else {
                    let (slot, info) = st.enqueue(batches, headers, stamp, durable);
                    st.record_sequences(headers, info.base_offset.0);
                    new_epoch = st.note_epochs(headers, stamp, info.base_offset.0);
                    Some((slot, info))
                }
            };
            if new_epoch {
                let sh = sh.clone();
                glommio::spawn_local(async move {
                    if let Err(e) = epochs::write_checkpoint(&sh).await {
                        tracing::warn!(dir = %sh.dir.display(), error = %e, "cannot write the leader-epoch checkpoint");
                    }
                })
                .detach();
            }
            if let Some(dup) = duplicate {
                drop(ticket);
                return self.answer_duplicate(dup).await;
            }
            match slot_and_info {
                Some((slot, info)) => {
                    drop(ticket);
                    kick_write(sh);
                    let written_at = slot.wait().await?;
                    return Ok(AppendInfo { written_at, ..info });
                }
                None => {
                    if start_roll {
                        glommio::spawn_local(roll_task(sh.clone())).detach();
                    }
                    kick_write(sh);
                    listen.await;
                }
            }
        }
    }

    /// Whole batches from the one holding `from`, up to the high watermark
    /// and about `max_bytes` (always at least one batch when there is one).
    pub async fn read(&self, from: Offset, max_bytes: usize) -> Result<LogRead, LogError> {
        read::read(&self.sh, from, max_bytes).await
    }

    #[must_use]
    pub fn start_offset(&self) -> Offset {
        Offset(self.sh.st.borrow().start_offset())
    }

    #[must_use]
    pub fn end_offset(&self) -> Offset {
        Offset(self.sh.st.borrow().active.next_offset)
    }

    #[must_use]
    pub fn high_watermark(&self) -> Offset {
        Offset(self.sh.st.borrow().high_watermark(&self.sh.config).0)
    }

    #[must_use]
    pub fn durable_offset(&self) -> Offset {
        Offset(self.sh.st.borrow().active.durable_next)
    }

    #[must_use]
    pub fn size_bytes(&self) -> u64 {
        let st = self.sh.st.borrow();
        st.closed_bytes + st.active.end_pos
    }

    /// Base offset of the active segment: compaction and retention touch
    /// only offsets below it.
    #[must_use]
    pub fn active_base(&self) -> Offset {
        Offset(self.sh.st.borrow().active.base)
    }

    #[must_use]
    pub fn segment_count(&self) -> usize {
        self.sh.st.borrow().closed.len() + 1
    }

    #[must_use]
    pub fn direct_io(&self) -> bool {
        self.sh.direct_io
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.sh.dir
    }

    #[must_use]
    pub fn stats(&self) -> LogStats {
        self.sh.st.borrow().stats
    }

    /// First offset whose record timestamp is `>= ts_ms`, with that timestamp.
    pub async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<(Offset, i64)>, LogError> {
        read::offset_for_timestamp(&self.sh, ts_ms).await
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<(), LogError> {
        flush_inner(&self.sh).await
    }

    /// Drops every batch at or after `offset` (a batch boundary).
    pub async fn truncate_to(&self, offset: Offset) -> Result<(), LogError> {
        recovery::truncate_to(&self.sh, offset.0, true).await.map(|_| ())
    }

    /// A follower's truncation: drops every batch that ends after `offset`
    /// (so a batch holding `offset` goes too) and returns the new log end,
    /// at most `offset`. An `offset` at or past the end changes nothing.
    pub async fn truncate_at_most(&self, offset: Offset) -> Result<Offset, LogError> {
        let end = self.end_offset();
        if offset >= end {
            return Ok(end);
        }
        let start = self.start_offset();
        recovery::truncate_to(&self.sh, offset.0.max(start.0), false).await.map(Offset)
    }

    /// [`Log::read`] that also stops before `cap` (the replicated high
    /// watermark a consumer may see): no batch ending at or after `cap`.
    pub async fn read_upto(&self, from: Offset, max_bytes: usize, cap: Offset) -> Result<LogRead, LogError> {
        read::read_capped(&self.sh, from, max_bytes, cap.0).await
    }

    /// The latest leader epoch that wrote to this log.
    #[must_use]
    pub fn latest_epoch(&self) -> Option<i32> {
        self.sh.st.borrow().epochs.latest()
    }

    /// Where `epoch` ends in this log (see [`LeaderEpochs::end_offset_for`]).
    #[must_use]
    pub fn epoch_end_offset(&self, epoch: i32) -> Option<(i32, Offset)> {
        let st = self.sh.st.borrow();
        st.epochs.end_offset_for(epoch, st.active.next_offset).map(|(e, o)| (e, Offset(o)))
    }

    /// Records that `epoch` starts at the log end now (a replica becoming
    /// leader), so the history knows it before its first batch arrives, and
    /// writes the checkpoint.
    pub async fn begin_epoch(&self, epoch: i32) -> Result<(), LogError> {
        let changed = {
            let mut st = self.sh.st.borrow_mut();
            let end = st.active.next_offset;
            st.epochs.assign(epoch, end)
        };
        if changed {
            epochs::write_checkpoint(&self.sh).await?;
        }
        Ok(())
    }
}

/// How an append's batches get their offsets and leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// A leader's append: offsets from the log end, this epoch.
    Leader(i32),
    /// A follower's: as the leader stamped them.
    Replica,
}

/// A follower's batches must continue this log exactly.
fn check_replica_offsets(headers: &[BatchHeader], end: u64) -> Result<(), LogError> {
    let mut expected = end;
    for h in headers {
        if h.base_offset != expected {
            return Err(LogError::ReplicaOffsetMismatch {
                expected: Offset(expected),
                got: Offset(h.base_offset),
            });
        }
        expected = h.checked_next_offset().ok_or(LogError::InvalidBatch(batch::BatchError::Empty))?;
    }
    Ok(())
}

mod idempotence;
mod lifecycle;
mod read;
mod recovery;
mod recovery_point;
mod roll;
mod state;
mod write;

use admit::Ticket;
use roll::{roll_task, seal_active, wait_not_rolling};
use write::{
    close_dma, counted_write_file, flush_inner, flush_timer, kick_write, open_dma, touch_write_file,
    write_file,
};
