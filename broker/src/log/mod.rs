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
//! before it started), so a write and a sync overlap.
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

pub mod dump;
mod error;
mod files;
mod hot;
pub mod index;
mod notify;
mod segment;

pub use error::LogError;
pub use files::{
    process_files_limit, shard_files_max, FileBudget, OPEN_FILES_RESERVE_FRACTION, OPEN_FILES_RESERVE_MIN,
    OPEN_FILES_SHARD_MIN,
};
pub use hot::{HotTailBudget, HOT_TAIL_LOG_BYTES_DEFAULT, HOT_TAIL_SHARD_BYTES_DEFAULT};
pub use segment::SegmentFile;

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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
            direct_reads: false,
        }
    }
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
    st: RefCell<State>,
    changed: Notify,
    /// The hot tail window over the active segment (its own cell: the
    /// shard budget evicts from it while another log's state is borrowed).
    hot: Rc<RefCell<hot::HotWindow>>,
    open_readers_max: usize,
    /// The shard's open-file budget; this log's write fd has an LRU place
    /// at `write_tick` while it is open.
    files: Rc<FileBudget>,
    write_tick: Cell<Option<u64>>,
}

type AppendSlot = Slot<Result<(), LogError>>;

struct Waiter {
    end_pos: u64,
    durable: bool,
    slot: Rc<AppendSlot>,
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
    /// Sealed segments with an open read handle, oldest first: `(base, is_index)`.
    /// Bounded by [`LogOptions::open_readers_max`] so thousands of segments do not hold
    /// thousands of fds.
    open_readers: VecDeque<(u64, bool)>,
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
    buf: Rc<DmaBuffer>,
    pos: u64,
    /// End of the real data in `buf` (the rest is padding).
    data_end: u64,
    prealloc_to: Option<u64>,
    seq: u64,
    generation: u64,
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
        recovery::open(dir, config, LogOptions::default()).await
    }

    /// [`Log::open`] with shard-level options (the shard's hot-tail budget).
    pub async fn open_with(dir: PathBuf, config: TopicConfig, options: LogOptions) -> Result<Log, LogError> {
        recovery::open(dir, config, options).await
    }

    /// Bytes of this log held in its hot tail window now.
    #[must_use]
    pub fn hot_tail_bytes(&self) -> u64 {
        self.sh.hot.borrow().held_bytes()
    }

    /// Appends whole batches. See the module docs for the write path.
    pub async fn append(&self, batches: &[u8], leader_epoch: i32) -> Result<AppendInfo, LogError> {
        let sh = &self.sh;
        if batches.len() > APPEND_BYTES_MAX {
            return Err(LogError::BatchTooLarge { bytes: batches.len(), max: APPEND_BYTES_MAX });
        }
        let headers = validate_all(batches, sh.config.batch_bytes_max as usize)?;
        let durable = sh.config.flush == FlushPolicy::Always;
        let mut waited_roll: Option<u64> = None;
        loop {
            let listen = sh.changed.listen();
            let mut start_roll = false;
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
                if st.rolling {
                    waited_roll = Some(st.roll_gen);
                    None
                } else if st.needs_roll(&sh.config, batches.len(), &headers) {
                    st.rolling = true;
                    waited_roll = Some(st.roll_gen);
                    start_roll = true;
                    None
                } else if st.active.end_pos - st.active.written_pos + batches.len() as u64
                    > UNWRITTEN_BYTES_MAX
                    && st.active.end_pos > st.active.written_pos
                {
                    None // back-pressure: wait for the write in flight
                } else {
                    Some(st.enqueue(batches, &headers, leader_epoch, durable))
                }
            };
            match slot_and_info {
                Some((slot, info)) => {
                    kick_write(sh);
                    slot.wait().await?;
                    return Ok(info);
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

    /// Deletes whole sealed segments beyond `retention.bytes` or older than
    /// `retention.ms` (by their largest timestamp). Never the active one.
    pub async fn enforce_retention(&self, now_ms: i64) -> Result<RetentionOutcome, LogError> {
        let sh = &self.sh;
        let victims = {
            let mut st = sh.st.borrow_mut();
            let mut total = st.closed_bytes + st.active.end_pos;
            let mut victims = Vec::new();
            while let Some(seg) = st.closed.front() {
                let by_bytes = sh.config.retention_bytes.is_some_and(|rb| total - seg.size() >= rb);
                let by_age = sh
                    .config
                    .retention_ms
                    .is_some_and(|ms| seg.summary.max_timestamp < now_ms.saturating_sub(ms as i64));
                if !(by_bytes || by_age) {
                    break;
                }
                total -= seg.size();
                let seg = st.closed.pop_front().expect("front exists");
                st.closed_bytes -= seg.size();
                victims.push(seg);
            }
            victims
        };
        let mut outcome = RetentionOutcome::default();
        for seg in victims {
            tracing::info!(
                dir = %sh.dir.display(), base = seg.base, next = seg.summary.next_offset,
                bytes = seg.size(), "retention deletes segment"
            );
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += seg.size();
            remove_segment_files(&sh.dir, seg.base).await?;
        }
        Ok(outcome)
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<(), LogError> {
        flush_inner(&self.sh).await
    }

    /// Flushes, seals the active segment's indexes, truncates preallocation
    /// and writes the clean-shutdown marker. Appends fail afterwards.
    pub async fn close(&self) -> Result<(), LogError> {
        let sh = &self.sh;
        if sh.st.borrow().shut {
            return Ok(());
        }
        wait_not_rolling(sh).await;
        sh.st.borrow_mut().shut = true;
        flush_inner(sh).await?;
        let (base, end_pos, next) = {
            let st = sh.st.borrow();
            let a = &st.active;
            (a.base, a.end_pos, a.next_offset)
        };
        let file = write_file(sh, base).await?;
        seal_active(sh, &file).await?;
        let marker = CleanMarker { next_offset: next, active_base: base, active_bytes: end_pos };
        let json = serde_json::to_vec(&marker).expect("marker serializes");
        segment::write_file_durably(&sh.dir.join(CLEAN_SHUTDOWN_FILE), json).await?;
        sync_dir(&sh.dir).await?;
        sh.changed.notify_all();
        tracing::debug!(dir = %sh.dir.display(), next_offset = next, "log closed cleanly");
        Ok(())
    }

    /// Drops every batch at or after `offset` (a batch boundary).
    pub async fn truncate_to(&self, offset: Offset) -> Result<(), LogError> {
        recovery::truncate_to(&self.sh, offset.0).await
    }

    /// Removes all files and the directory (topic deletion).
    pub async fn delete(&self) -> Result<(), LogError> {
        let sh = &self.sh;
        wait_not_rolling(sh).await;
        sh.st.borrow_mut().shut = true;
        // Let in-flight writes finish so no task touches the files afterwards;
        // their errors do not matter any more.
        if let Err(e) = flush_inner(sh).await {
            tracing::debug!(dir = %sh.dir.display(), error = %e, "flush before delete failed");
        }
        // One-off directory listing at topic deletion (glommio has no readdir).
        let entries = std::fs::read_dir(&sh.dir).map_err(|e| LogError::io("listing", &sh.dir, e))?;
        for entry in entries {
            let path = entry.map_err(|e| LogError::io("listing", &sh.dir, e))?.path();
            glommio::io::remove(&path).await.map_err(|e| LogError::glommio("removing", &path, e))?;
        }
        // One-off rmdir (glommio has no async rmdir).
        std::fs::remove_dir(&sh.dir).map_err(|e| LogError::io("removing directory", &sh.dir, e))?;
        Ok(())
    }
}

/// Validates each batch's header and CRC; returns their headers.
fn validate_all(batches: &[u8], batch_bytes_max: usize) -> Result<Vec<BatchHeader>, LogError> {
    let mut headers = Vec::new();
    let mut at = 0;
    while at < batches.len() {
        let h = batch::validate(&batches[at..], batch_bytes_max)?;
        at += h.total_bytes();
        headers.push(h);
    }
    if headers.is_empty() {
        return Err(LogError::InvalidBatch(batch::BatchError::Empty));
    }
    Ok(headers)
}

impl State {
    fn check_writable(&self, dir: &Path) -> Result<(), LogError> {
        if let Some(reason) = &self.failed {
            return Err(LogError::Failed { dir: dir.to_path_buf(), reason: reason.clone() });
        }
        if self.shut {
            return Err(LogError::Closed { dir: dir.to_path_buf() });
        }
        Ok(())
    }

    /// Records an open sealed-segment handle; closes the oldest beyond the
    /// bound (reads still holding one keep its fd until they finish).
    fn note_open_reader(&mut self, base: u64, index: bool, max: usize) {
        self.open_readers.push_back((base, index));
        while self.open_readers.len() > max {
            let (old, old_index) = self.open_readers.pop_front().expect("non-empty");
            if let Ok(j) = self.closed.binary_search_by_key(&old, |s| s.base) {
                let s = &self.closed[j];
                if old_index { &s.index_reader } else { &s.reader }.clear();
            }
        }
    }

    /// Whether the active segment's write handle may be closed: nothing
    /// issued or queued, and everything the flush policy promises synced.
    fn write_file_idle(&self, config: &TopicConfig) -> bool {
        let a = &self.active;
        !self.rolling
            && self.writes_in_flight == 0
            && !self.sync_busy
            && self.unwritten.is_empty()
            && self.unsynced.is_empty()
            && a.end_pos == a.written_pos
            && (a.durable_pos == a.written_pos || config.flush == FlushPolicy::Never)
    }

    fn start_offset(&self) -> u64 {
        self.closed.front().map_or(self.active.base, |s| s.base)
    }

    /// (offset, position in the active segment) readers may see.
    fn high_watermark(&self, config: &TopicConfig) -> (u64, u64) {
        let a = &self.active;
        if config.flush == FlushPolicy::Always {
            (a.durable_next, a.durable_pos)
        } else {
            (a.written_next, a.written_pos)
        }
    }

    fn needs_roll(&self, config: &TopicConfig, bytes: usize, headers: &[BatchHeader]) -> bool {
        let a = &self.active;
        if a.end_pos == 0 {
            return false;
        }
        let records: u64 = headers.iter().map(|h| u64::from(h.record_count)).sum();
        let segment_bytes = config.segment_bytes.min(SEGMENT_BYTES_CAP);
        a.end_pos + bytes as u64 > segment_bytes
            || now_ms() - a.created_ms >= config.segment_ms as i64
            || a.next_offset - a.base + records >= u64::from(u32::MAX)
    }

    /// Copies and stamps the batches into the fill buffer, assigns offsets
    /// and queues the caller's slot.
    fn enqueue(
        &mut self,
        batches: &[u8],
        headers: &[BatchHeader],
        leader_epoch: i32,
        durable: bool,
    ) -> (Rc<AppendSlot>, AppendInfo) {
        let start_offset = self.start_offset();
        let a = &mut self.active;
        let start = a.fill_len;
        a.fill_copy(start, batches);
        let base_offset = a.next_offset;
        let (mut offset, mut at) = (base_offset, 0usize);
        for h in headers {
            let len = h.total_bytes();
            // Stamp the copy: the stamped fields sit in the first 16 bytes,
            // which may straddle two chunks.
            let mut head = [0u8; 16];
            head.copy_from_slice(&batches[at..at + 16]);
            batch::stamp(&mut head, offset, leader_epoch);
            a.fill_copy(start + at, &head);
            let next = offset + u64::from(h.last_offset_delta) + 1;
            a.unwritten_batches.push_back(BatchMeta {
                rel_offset: u32::try_from(offset - a.base).expect("roll keeps relative offsets in u32"),
                pos: a.end_pos + at as u64,
                end: a.end_pos + (at + len) as u64,
                next,
                first_ts: h.first_timestamp,
                max_ts: h.max_timestamp,
            });
            offset = next;
            at += len;
        }
        assert!(offset > a.next_offset, "offsets only grow");
        a.fill_len = start + batches.len();
        a.end_pos += batches.len() as u64;
        a.next_offset = offset;
        self.stats.appends += 1;
        let slot = Rc::new(Slot::new());
        self.unwritten.push_back(Waiter { end_pos: a.end_pos, durable, slot: slot.clone() });
        let info = AppendInfo {
            base_offset: Offset(base_offset),
            last_offset: Offset(offset - 1),
            append_time_ms: now_ms(),
            log_start_offset: Offset(start_offset),
        };
        (slot, info)
    }

    /// Takes the next aligned write: the first chunk when it is full and more
    /// follows, otherwise the last, partial chunk padded to the block size
    /// (its partial last block is carried over and rewritten next time).
    fn take_write_job(&mut self, sh: &Shared) -> Option<WriteJob> {
        if self.failed.is_some() {
            return None;
        }
        let block = sh.block;
        let a = &mut self.active;
        // `fill_len == 0`: everything is issued (a write in flight ended on a
        // block boundary and carried nothing over).
        if a.unwritten_batches.is_empty() || a.fill_len == 0 || self.writes_in_flight >= WRITES_IN_FLIGHT_MAX
        {
            return None;
        }
        // A write may not touch a block an earlier write still in flight
        // owns: with one in flight, only a write that starts where it ends.
        if self.writes_in_flight > 0 && a.fill_start < self.issued_end {
            return None;
        }
        let pos = a.fill_start;
        let (buf, len, data_len) = if a.fill_len >= CHUNK_BYTES {
            let buf = a.fill.pop_front().expect("a full chunk");
            a.fill_start += CHUNK_BYTES as u64;
            a.fill_len -= CHUNK_BYTES;
            (buf, CHUNK_BYTES, CHUNK_BYTES)
        } else {
            // Less than a chunk: the data goes out in a buffer of its own
            // aligned size, and the fill chunk stays, its partial last block
            // moved to the front. Handing the chunk itself to the write (and
            // a fresh 1 MiB chunk to the carry) made every small write free
            // and allocate a whole chunk: with many partitions the allocator
            // kept every freed chunk resident (5 GB RSS at 1,000 partitions).
            let data_len = a.fill_len;
            let len = align_up(data_len as u64, block) as usize;
            let front = a.fill.front_mut().expect("the fill holds the unwritten data");
            let mut buf = glommio::allocate_dma_buffer(len);
            buf.as_bytes_mut()[..data_len].copy_from_slice(&front.as_bytes()[..data_len]);
            buf.as_bytes_mut()[data_len..].fill(0);
            let keep_from = align_down(data_len as u64, block) as usize;
            let carry = data_len - keep_from;
            front.as_bytes_mut().copy_within(keep_from..data_len, 0);
            a.fill_start += keep_from as u64;
            a.fill_len = carry;
            (buf, len, data_len)
        };
        let write_end = pos + len as u64;
        let prealloc_to = (write_end > a.allocated).then(|| {
            let segment_bytes = align_up(sh.config.segment_bytes.min(SEGMENT_BYTES_CAP), block);
            let step = a.allocated.clamp(PREALLOC_BYTES_STEP_MIN, PREALLOC_BYTES_STEP);
            (a.allocated + step).min(segment_bytes).max(write_end)
        });
        if let Some(to) = prealloc_to {
            // Claimed now so a second write in flight does not repeat it.
            a.allocated = a.allocated.max(to);
        }
        self.writes_in_flight += 1;
        self.issued_end = write_end;
        let seq = self.write_seq_issue;
        self.write_seq_issue += 1;
        Some(WriteJob {
            base: a.base,
            file: a.file.clone(),
            path: a.path.clone(),
            buf: Rc::new(buf),
            pos,
            data_end: pos + data_len as u64,
            prealloc_to,
            seq,
            generation: self.write_gen,
        })
    }

    fn complete_write(&mut self, sh: &Shared, job: WriteJob) {
        let block = sh.block;
        let a = &mut self.active;
        assert_eq!(a.base, job.base, "a write completes on the segment it was issued for");
        let before = a.written_pos;
        // Whole batches now on disk advance the written position.
        while let Some(m) = a.unwritten_batches.front() {
            if m.end > job.data_end {
                break;
            }
            assert!(m.end > a.written_pos, "written position goes forward");
            a.index.on_batch(m.rel_offset, m.pos, m.first_ts, m.max_ts);
            a.written_pos = m.end;
            a.written_next = m.next;
            a.unwritten_batches.pop_front();
        }
        let bytes = job.buf.as_bytes();
        if sh.hot.borrow().enabled() {
            a.stage_hot(&sh.hot, before, &job);
        }
        if a.written_pos != before {
            a.tail_start = align_down(a.written_pos, block);
            assert!(a.tail_start >= job.pos, "the new partial block is in this write");
            a.tail.clear();
            a.tail.extend_from_slice(
                &bytes[(a.tail_start - job.pos) as usize..(a.written_pos - job.pos) as usize],
            );
        }
        self.stats.writes += 1;
        self.stats.bytes_written += bytes.len() as u64;
        self.bytes_since_sync += a.written_pos - before;
        // A whole chunk (a full one, or a partial one padded to its size) is kept for reuse.
        if job.buf.len() == CHUNK_BYTES && a.spare.len() < SPARE_CHUNKS_MAX {
            if let Ok(buf) = Rc::try_unwrap(job.buf) {
                a.spare.push(buf);
            }
        }
        let written = a.written_pos;
        while self.unwritten.front().is_some_and(|w| w.end_pos <= written) {
            let w = self.unwritten.pop_front().expect("front exists");
            if w.durable {
                self.unsynced.push_back(w);
            } else {
                w.slot.resolve(Ok(()));
            }
        }
    }

    /// A write failed: forget everything not yet written and fail its appends.
    fn fail_write(&mut self, sh: &Shared, job: WriteJob, err: LogError) {
        let a = &mut self.active;
        assert_eq!(a.base, job.base, "a write fails on the segment it was issued for");
        if err.is_out_of_files() {
            // Said once per shard already (`LogError::io`); not once per append.
            tracing::debug!(path = %job.path.display(), error = %err, "segment write failed");
        } else {
            tracing::warn!(
                path = %job.path.display(), position = job.pos, lost_from_offset = a.written_next,
                lost_to_offset = a.next_offset, error = %err,
                "segment write failed; unwritten appends are rolled back and fail"
            );
        }
        a.end_pos = a.written_pos;
        a.next_offset = a.written_next;
        a.unwritten_batches.clear();
        a.hot_staged.clear();
        // A later write still in flight writes bytes past the rolled-back end:
        // its completion is ignored, and `issued_end` (left as is) holds new
        // writes back until it has landed, so it cannot overwrite them.
        self.write_gen += 1;
        a.fill.clear();
        let mut first = a.chunk();
        first.as_bytes_mut()[..a.tail.len()].copy_from_slice(&a.tail);
        a.fill.push_back(first);
        a.fill_start = a.tail_start;
        a.fill_len = a.tail.len();
        for w in self.unwritten.drain(..) {
            w.slot.resolve(Err(err.duplicate()));
        }
        // Out of space or of file descriptors: nothing is lost, the log
        // takes appends again once the resource returns.
        if !err.is_no_space() && !err.is_out_of_files() {
            self.poison(&sh.dir, format!("write failed: {err}"));
        }
    }

    /// Marks the log failed and fails everyone waiting.
    fn poison(&mut self, dir: &Path, reason: String) {
        tracing::error!(dir = %dir.display(), %reason, "log failed; it takes no more appends");
        let e = LogError::Failed { dir: dir.to_path_buf(), reason: reason.clone() };
        self.failed.get_or_insert(reason);
        for w in self.unwritten.drain(..).chain(self.unsynced.drain(..)) {
            w.slot.resolve(Err(e.duplicate()));
        }
    }

    fn sync_wanted(&self, config: &TopicConfig) -> bool {
        let a = &self.active;
        if self.failed.is_some() || a.written_pos <= a.durable_pos {
            return false;
        }
        if !self.unsynced.is_empty() {
            return true;
        }
        match config.flush {
            FlushPolicy::Interval { ms, bytes } => {
                self.bytes_since_sync >= bytes || now_ms() - self.last_sync_ms >= ms as i64
            }
            FlushPolicy::Always => true,
            FlushPolicy::Never => false,
        }
    }
}

// Tasks are spawned after the state borrow ends: a spawned task may be
// polled before `spawn_local` returns.
fn kick_write(sh: &Rc<Shared>) {
    loop {
        let job = {
            let mut st = sh.st.borrow_mut();
            if st.active.end_pos <= st.active.written_pos {
                return;
            }
            st.take_write_job(sh)
        };
        match job {
            Some(job) => {
                glommio::spawn_local(write_task(sh.clone(), job)).detach();
            }
            None => return,
        }
    }
}

fn kick_sync(sh: &Rc<Shared>) {
    let start = {
        let mut st = sh.st.borrow_mut();
        let start = !st.sync_busy && st.sync_wanted(&sh.config);
        st.sync_busy |= start;
        start
    };
    if start {
        glommio::spawn_local(sync_task(sh.clone())).detach();
    }
}

/// Runs one write as its own task (so a cancelled append never leaves a
/// write half-accounted), then completes finished writes in issue order and
/// issues the next ones.
async fn write_task(sh: Rc<Shared>, job: WriteJob) {
    let result = run_write(&sh, &job).await;
    {
        let mut st = sh.st.borrow_mut();
        st.write_done.insert(job.seq, (job, result));
        loop {
            let seq = st.write_seq_complete;
            let Some((job, result)) = st.write_done.remove(&seq) else { break };
            st.write_seq_complete += 1;
            st.writes_in_flight -= 1;
            if job.generation != st.write_gen || st.active.base != job.base {
                continue; // rolled back by an earlier failed write
            }
            match result {
                Ok(()) => st.complete_write(&sh, job),
                Err(e) => st.fail_write(&sh, job, e),
            }
        }
    }
    let budget = sh.hot.borrow().budget().clone();
    budget.enforce();
    sh.changed.notify_all();
    kick_write(&sh);
    kick_sync(&sh);
}

async fn run_write(sh: &Rc<Shared>, job: &WriteJob) -> Result<(), LogError> {
    let file = match &job.file {
        Some(f) => f.clone(),
        None => write_file(sh, job.base).await?,
    };
    if let Some(target) = job.prealloc_to {
        match file.pre_allocate(target, false).await {
            Ok(()) => {
                let mut st = sh.st.borrow_mut();
                if st.active.base == job.base {
                    st.active.allocated = target;
                }
            }
            Err(e) => {
                let e = error::unwrap_glommio(e);
                if !error::is_no_space(&e) {
                    return Err(LogError::io("fallocate", &job.path, e));
                }
                // Writing in place may still fit; the write reports ENOSPC if not.
                tracing::debug!(path = %job.path.display(), "fallocate: no space; writing without it");
            }
        }
    }
    let len = job.buf.len();
    let n = file
        .write_rc_at(job.buf.clone(), job.pos)
        .await
        .map_err(|e| LogError::glommio("writing segment", &job.path, e))?;
    if n != len {
        return Err(LogError::NoSpace {
            op: "writing segment (short write)",
            path: job.path.clone(),
            source: std::io::ErrorKind::StorageFull.into(),
        });
    }
    Ok(())
}

/// Issues fdatasyncs while one is wanted. A failure poisons the log.
async fn sync_task(sh: Rc<Shared>) {
    loop {
        let (base, path, pos, next) = {
            let mut st = sh.st.borrow_mut();
            if !st.sync_wanted(&sh.config) {
                st.sync_busy = false;
                drop(st);
                sh.changed.notify_all();
                return;
            }
            st.bytes_since_sync = 0;
            st.last_sync_ms = now_ms();
            let a = &st.active;
            (a.base, a.path.clone(), a.written_pos, a.written_next)
        };
        let result = match write_file(&sh, base).await {
            Ok(file) => file.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", &path, e)),
            Err(e) => Err(e),
        };
        {
            let mut st = sh.st.borrow_mut();
            st.stats.fdatasyncs += 1;
            match result {
                Ok(()) if st.active.base == base => {
                    let a = &mut st.active;
                    assert!(pos >= a.durable_pos, "durable position goes forward");
                    a.durable_pos = pos;
                    a.durable_next = next;
                    while st.unsynced.front().is_some_and(|w| w.end_pos <= pos) {
                        st.unsynced.pop_front().expect("front exists").slot.resolve(Ok(()));
                    }
                }
                Ok(()) => {}
                Err(e) if e.is_out_of_files() => {
                    // The write fd could not be reopened: nothing was synced
                    // and nothing is lost; fail the waiters, a later flush retries.
                    for w in st.unsynced.drain(..) {
                        w.slot.resolve(Err(e.duplicate()));
                    }
                    st.sync_busy = false;
                    drop(st);
                    sh.changed.notify_all();
                    return;
                }
                Err(e) => {
                    st.poison(&sh.dir, format!("fdatasync failed: {e}"));
                }
            }
        }
        sh.changed.notify_all();
    }
}

/// Periodic fdatasync for `flush.policy=interval`; ends with the log.
async fn flush_timer(weak: Weak<Shared>, every: Duration) {
    loop {
        glommio::timer::sleep(every).await;
        let Some(sh) = weak.upgrade() else { return };
        if sh.st.borrow().shut {
            return;
        }
        kick_sync(&sh);
    }
}

/// Waits until everything appended before the call is written and durable.
async fn flush_inner(sh: &Rc<Shared>) -> Result<(), LogError> {
    let slot = {
        let mut st = sh.st.borrow_mut();
        if let Some(reason) = &st.failed {
            return Err(LogError::Failed { dir: sh.dir.clone(), reason: reason.clone() });
        }
        let a = &st.active;
        if a.end_pos <= a.durable_pos {
            return Ok(());
        }
        let slot = Rc::new(Slot::new());
        let w = Waiter { end_pos: a.end_pos, durable: true, slot: slot.clone() };
        if a.end_pos <= a.written_pos {
            st.unsynced.push_back(w);
        } else {
            st.unwritten.push_back(w);
        }
        slot
    };
    kick_write(sh);
    kick_sync(sh);
    slot.wait().await
}

async fn wait_not_rolling(sh: &Shared) {
    loop {
        let listen = sh.changed.listen();
        if !sh.st.borrow().rolling {
            return;
        }
        listen.await;
    }
}

async fn roll_task(sh: Rc<Shared>) {
    let result = roll(&sh).await;
    {
        let mut st = sh.st.borrow_mut();
        st.rolling = false;
        st.roll_gen += 1;
        if let Err(e) = &result {
            tracing::warn!(dir = %sh.dir.display(), error = %e, "segment roll failed; the active segment stays");
        } else {
            st.stats.rolls += 1;
        }
        st.roll_error = result.err();
    }
    sh.changed.notify_all();
}

/// Seals the active segment and starts a new one at the next offset.
async fn roll(sh: &Rc<Shared>) -> Result<(), LogError> {
    flush_inner(sh).await?;
    let base = sh.st.borrow().active.base;
    let file = write_file(sh, base).await?;
    let summary = seal_active(sh, &file).await?;
    let next = summary.next_offset;
    let new = new_active(sh, next).await?;
    let old = {
        let mut st = sh.st.borrow_mut();
        let old = std::mem::replace(&mut st.active, new);
        assert!(
            old.next_offset == next && old.end_pos == summary.log_bytes,
            "nothing appended while rolling"
        );
        st.closed_bytes += summary.log_bytes;
        let reader_open = old.reader.is_open();
        st.closed.push_back(ClosedSegment::new(old.base, summary, old.reader.clone(), &sh.files));
        if reader_open {
            st.note_open_reader(old.base, false, sh.open_readers_max);
        }
        old
    };
    touch_write_file(sh);
    sh.hot.borrow_mut().reset(next, 0);
    tracing::debug!(dir = %sh.dir.display(), sealed = old.base, next, "rolled segment");
    drop(file);
    match old.file {
        Some(f) => close_dma(f, &old.path).await,
        None => Ok(()),
    }
}

/// Closes a write handle if this is its last user (else the last one's drop does).
async fn close_dma(file: Rc<WriteFile>, path: &Path) -> Result<(), LogError> {
    if let Ok(f) = Rc::try_unwrap(file) {
        f.file.close().await.map_err(|e| LogError::glommio("closing segment", path, e))?;
    }
    Ok(())
}

/// The active segment's write handle: the open one, or reopened (counted in
/// the shard's file budget) after the budget closed it.
async fn write_file(sh: &Rc<Shared>, base: u64) -> Result<Rc<WriteFile>, LogError> {
    // A sealed segment is never written again (a write left over from a
    // rolled-back write may still ask; its result is ignored).
    let sealed = || LogError::Closed { dir: sh.dir.clone() };
    let cached = {
        let st = sh.st.borrow();
        if st.active.base != base {
            return Err(sealed());
        }
        st.active.file.clone()
    };
    let file = match cached {
        Some(f) => f,
        None => {
            sh.files.admit();
            let path = segment::segment_path(&sh.dir, base, LOG_EXT);
            let f = counted_write_file(open_dma(&path, false).await?, &sh.files);
            let mut st = sh.st.borrow_mut();
            if st.active.base != base {
                return Err(sealed());
            }
            st.active.file.get_or_insert(f).clone()
        }
    };
    touch_write_file(sh);
    Ok(file)
}

/// Marks the active segment's write handle as just used in the file budget.
fn touch_write_file(sh: &Rc<Shared>) {
    sh.files.touch(&sh.write_tick, Rc::downgrade(sh) as std::rc::Weak<dyn Evict>);
}

fn counted_write_file(file: DmaFile, files: &Rc<FileBudget>) -> Rc<WriteFile> {
    Rc::new(WriteFile { file, _token: files.token() })
}

/// The file budget closes an idle log's write handle; the next write,
/// sync or seal reopens it.
impl Evict for Shared {
    fn evict(&self) -> bool {
        let Ok(mut st) = self.st.try_borrow_mut() else { return false };
        if !st.write_file_idle(&self.config) {
            return false;
        }
        let Some(file) = st.active.file.take() else { return true };
        let path = st.active.path.clone();
        drop(st);
        glommio::spawn_local(async move {
            if let Err(e) = close_dma(file, &path).await {
                tracing::warn!(path = %path.display(), error = %e, "closing an idle segment failed");
            }
        })
        .detach();
        true
    }

    fn tick(&self) -> &Cell<Option<u64>> {
        &self.write_tick
    }
}

/// Writes the active segment's `.index`/`.timeindex`, truncates its `.log` to
/// the logical end and syncs. Requires everything appended to be durable.
async fn seal_active(sh: &Shared, file: &DmaFile) -> Result<SegmentSummary, LogError> {
    let (base, path, summary, index_bytes, time_bytes) = {
        let st = sh.st.borrow();
        let a = &st.active;
        assert!(a.end_pos == a.durable_pos, "sealing needs a durable segment");
        let summary = a.index.summary(a.end_pos, a.next_offset);
        let index_bytes = index::encode_index(&a.index.entries, &summary);
        let time_bytes = index::encode_time_index(&a.index.times);
        (a.base, a.path.clone(), summary, index_bytes, time_bytes)
    };
    segment::write_file_durably(&segment::segment_path(&sh.dir, base, TIME_INDEX_EXT), time_bytes).await?;
    segment::write_file_durably(&segment::segment_path(&sh.dir, base, INDEX_EXT), index_bytes).await?;
    file.truncate(summary.log_bytes).await.map_err(|e| LogError::glommio("truncating segment", &path, e))?;
    file.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", &path, e))?;
    {
        let mut st = sh.st.borrow_mut();
        if st.active.base == base {
            st.active.allocated = summary.log_bytes;
        }
    }
    Ok(summary)
}

/// Creates a fresh active segment at `base`.
async fn new_active(sh: &Shared, base: u64) -> Result<Active, LogError> {
    // Stale indexes of an earlier failed roll must not describe the new file.
    for ext in [INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(&sh.dir, base, ext)).await?;
    }
    let path = segment::segment_path(&sh.dir, base, LOG_EXT);
    sh.files.admit();
    let file = counted_write_file(open_dma(&path, true).await?, &sh.files);
    let scan = Scan::empty(base, sh.config.index_interval_bytes);
    let active = Active::new(base, path, file, ReaderSlot::new(&sh.files), scan, Vec::new());
    sync_dir(&sh.dir).await?;
    Ok(active)
}

async fn open_dma(path: &Path, truncate: bool) -> Result<DmaFile, LogError> {
    OpenOptions::new().read(true).write(true).create(true).truncate(truncate).dma_open(path).await.map_err(
        |e| {
            let e = error::unwrap_glommio(e);
            if e.raw_os_error() == Some(libc::EINVAL) {
                LogError::io(
                    "opening with O_DIRECT (the filesystem does not support it; only tmpfs falls back)",
                    path,
                    e,
                )
            } else {
                LogError::io("opening segment", path, e)
            }
        },
    )
}

impl Active {
    /// Builds the active state for a segment whose first `scan.valid_bytes`
    /// bytes hold valid batches; `tail` is the partial last block.
    fn new(
        base: u64,
        path: PathBuf,
        file: Rc<WriteFile>,
        reader: Rc<ReaderSlot<SegmentFile>>,
        scan: Scan,
        tail: Vec<u8>,
    ) -> Active {
        let end = scan.valid_bytes;
        let block = BLOCK_BYTES_MIN.max(file.alignment());
        let tail_start = align_down(end, block);
        assert_eq!(tail.len() as u64, end - tail_start, "tail is the partial last block");
        let mut first = glommio::allocate_dma_buffer(CHUNK_BYTES);
        first.as_bytes_mut()[..tail.len()].copy_from_slice(&tail);
        let fill = VecDeque::from([first]);
        Active {
            base,
            path,
            file: Some(file),
            reader,
            created_ms: now_ms(),
            end_pos: end,
            next_offset: scan.next_offset,
            written_pos: end,
            written_next: scan.next_offset,
            durable_pos: end,
            durable_next: scan.next_offset,
            allocated: end,
            fill_len: tail.len(),
            fill,
            fill_start: tail_start,
            spare: Vec::new(),
            unwritten_batches: VecDeque::new(),
            index: scan.index,
            tail,
            tail_start,
            hot_staged: Vec::new(),
        }
    }
}

impl Active {
    /// Hands the whole batches this write completed (`[before, written_pos)`)
    /// to the hot tail window, directly from the write buffer when they all
    /// lie in it, else through `hot_staged` (a batch that spans writes).
    fn stage_hot(&mut self, hot: &RefCell<hot::HotWindow>, before: u64, job: &WriteJob) {
        let bytes = job.buf.as_bytes();
        let at = |p: u64| (p - job.pos) as usize;
        let staged_end = before + self.hot_staged.len() as u64;
        assert!(job.pos <= staged_end, "writes are contiguous");
        if self.hot_staged.is_empty() {
            if self.written_pos > before {
                hot.borrow_mut().push(self.base, before, &bytes[at(before)..at(self.written_pos)]);
            }
            if job.data_end > self.written_pos {
                self.hot_staged.extend_from_slice(&bytes[at(self.written_pos)..at(job.data_end)]);
            }
        } else {
            if job.data_end > staged_end {
                self.hot_staged.extend_from_slice(&bytes[at(staged_end)..at(job.data_end)]);
            }
            if self.written_pos > before {
                let n = (self.written_pos - before) as usize;
                hot.borrow_mut().push(self.base, before, &self.hot_staged[..n]);
                self.hot_staged.drain(..n);
            }
        }
    }

    /// A chunk for the fill buffer, reused when possible.
    fn chunk(&mut self) -> DmaBuffer {
        self.spare.pop().unwrap_or_else(|| glommio::allocate_dma_buffer(CHUNK_BYTES))
    }

    /// Copies `bytes` into the fill buffer at fill offset `at`, adding chunks.
    fn fill_copy(&mut self, mut at: usize, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (i, off) = (at / CHUNK_BYTES, at % CHUNK_BYTES);
            while self.fill.len() <= i {
                let c = self.chunk();
                self.fill.push_back(c);
            }
            let n = (CHUNK_BYTES - off).min(bytes.len());
            self.fill[i].as_bytes_mut()[off..off + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            at += n;
        }
    }
}

impl Scan {
    fn empty(base: u64, interval: u32) -> Scan {
        Scan {
            valid_bytes: 0,
            next_offset: base,
            index: IndexBuilder::new(interval),
            stop: ScanStop::Clean,
            batches: 0,
        }
    }
}

async fn remove_if_exists(path: &Path) -> Result<(), LogError> {
    match glommio::io::remove(path).await {
        Ok(()) => Ok(()),
        Err(e) => {
            let e = error::unwrap_glommio(e);
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(LogError::io("removing", path, e))
            }
        }
    }
}

async fn remove_segment_files(dir: &Path, base: u64) -> Result<(), LogError> {
    for ext in [LOG_EXT, INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(dir, base, ext)).await?;
    }
    Ok(())
}

async fn sync_dir(dir: &Path) -> Result<(), LogError> {
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| LogError::glommio("opening directory", dir, e))?;
    d.sync().await.map_err(|e| LogError::glommio("syncing directory", dir, e))?;
    d.close().await.map_err(|e| LogError::glommio("closing directory", dir, e))?;
    Ok(())
}

mod read;
mod recovery;
