//! Segment files: names, the shared read handle, sealed-segment metadata,
//! and the batch scans used by reads and recovery.

use super::error::LogError;
use super::files::{FileBudget, FileToken, ReaderSlot};
use super::index::{self, IndexEntry, SegmentSummary, TimeEntry, INDEX_ENTRY_BYTES};
use glommio::io::{BufferedFile, DmaFile, OpenOptions, ReadResult};
use shardlog_schema::batch::{self, BatchError, BatchHeader, BATCH_HEADER_BYTES};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub const LOG_EXT: &str = "log";
pub const INDEX_EXT: &str = "index";
pub const TIME_INDEX_EXT: &str = "timeindex";

/// `<dir>/<20-digit base>.<ext>`.
#[must_use]
pub fn segment_path(dir: &Path, base: u64, ext: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

/// The base offset of a `.log` file name, if it is one.
#[must_use]
pub fn parse_log_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".log")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
}

/// A buffered (page-cache) read handle on a segment's `.log`, shared by the
/// log and by every in-flight read that returned a range of it. Its fd can
/// be spliced from at any offset and length.
#[derive(Debug)]
pub struct SegmentFile {
    file: Handle,
    path: PathBuf,
    /// Counts the fd in the shard's file budget (long-lived handles only).
    _token: Option<FileToken>,
}

/// How a segment file is read: through the page cache (splice needs it;
/// small index reads benefit from it) or with O_DIRECT (bulk reads of data
/// the O_DIRECT appender never put in the page cache: large aligned reads
/// straight from the device, without the page cache's CPU cost).
#[derive(Debug)]
enum Handle {
    Buffered(BufferedFile),
    Direct(DmaFile),
}

impl Handle {
    async fn file_size(&self) -> glommio::Result<u64, ()> {
        match self {
            Handle::Buffered(f) => f.file_size().await,
            Handle::Direct(f) => f.file_size().await,
        }
    }

    async fn close(self) -> glommio::Result<(), ()> {
        match self {
            Handle::Buffered(f) => f.close().await,
            Handle::Direct(f) => f.close().await,
        }
    }
}

impl SegmentFile {
    /// Opens a short-lived handle (recovery, index loads), not counted.
    pub(crate) async fn open(path: &Path) -> Result<SegmentFile, LogError> {
        let file = OpenOptions::new()
            .read(true)
            .buffered_open(path)
            .await
            .map_err(|e| LogError::glommio("opening segment for reading", path, e))?;
        Ok(SegmentFile { file: Handle::Buffered(file), path: path.to_path_buf(), _token: None })
    }

    /// Opens a handle a log caches: makes room in the budget, then counts it.
    /// `direct`: read with O_DIRECT (not for splice: see [`Self::is_direct`]).
    pub(crate) async fn open_counted(
        path: &Path,
        files: &Rc<FileBudget>,
        direct: bool,
    ) -> Result<SegmentFile, LogError> {
        files.admit();
        let mut f = if direct {
            let file = OpenOptions::new()
                .read(true)
                .dma_open(path)
                .await
                .map_err(|e| LogError::glommio("opening segment for direct reading", path, e))?;
            SegmentFile { file: Handle::Direct(file), path: path.to_path_buf(), _token: None }
        } else {
            SegmentFile::open(path).await?
        };
        f._token = Some(files.token());
        Ok(f)
    }

    /// The fd for splice(2) or pread(2). Splicing from an O_DIRECT fd needs
    /// block-aligned ranges; the broker splices only from buffered handles.
    #[must_use]
    pub fn raw_fd(&self) -> RawFd {
        match &self.file {
            Handle::Buffered(f) => f.as_raw_fd(),
            Handle::Direct(f) => f.as_raw_fd(),
        }
    }

    /// Whether this handle reads with O_DIRECT.
    #[must_use]
    pub fn is_direct(&self) -> bool {
        matches!(self.file, Handle::Direct(_))
    }

    async fn read_at(&self, pos: u64, len: usize) -> Result<ReadResult, LogError> {
        match &self.file {
            Handle::Buffered(f) => f.read_at(pos, len).await,
            Handle::Direct(f) => f.read_at(pos, len).await,
        }
        .map_err(|e| LogError::glommio("reading segment", &self.path, e))
    }

    /// Appends up to `len` bytes from `pos` to `out` (fewer only at end of
    /// file); returns how many it appended. One copy, from the read buffer
    /// into `out`.
    pub async fn read_into(&self, pos: u64, len: usize, out: &mut Vec<u8>) -> Result<usize, LogError> {
        out.reserve(len);
        let mut done = 0;
        while done < len {
            let got = self.read_at(pos + done as u64, len - done).await?;
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
            done += got.len();
        }
        Ok(done)
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads exactly `len` bytes at `pos` (fewer only at end of file).
    pub async fn read_bytes(&self, pos: u64, len: usize) -> Result<Vec<u8>, LogError> {
        let mut out = Vec::new();
        self.read_into(pos, len, &mut out).await?;
        Ok(out)
    }
}

/// A sealed segment: a few words of metadata. Its index stays on disk and is
/// searched a page at a time; its read handles open on first use and the
/// shard's file budget may close them.
pub(crate) struct ClosedSegment {
    pub base: u64,
    pub summary: SegmentSummary,
    pub reader: Rc<ReaderSlot<SegmentFile>>,
    pub index_reader: Rc<ReaderSlot<SegmentFile>>,
}

impl ClosedSegment {
    pub(crate) fn new(
        base: u64,
        summary: SegmentSummary,
        reader: Rc<ReaderSlot<SegmentFile>>,
        files: &Rc<FileBudget>,
    ) -> Self {
        ClosedSegment { base, summary, reader, index_reader: ReaderSlot::new(files) }
    }

    pub(crate) fn size(&self) -> u64 {
        self.summary.log_bytes
    }
}

/// Last entry with key `<= target` in a sealed segment's on-disk index,
/// reading one page of entries per step: an interpolated first probe, then
/// binary search over pages. `range` is the key range (for interpolation).
pub(crate) async fn search_index_file(
    file: &SegmentFile,
    entries: u32,
    target: u64,
    range: u64,
    key: impl Fn(&IndexEntry) -> u64,
) -> Result<IndexEntry, LogError> {
    let start = IndexEntry { rel_offset: 0, pos: 0 };
    if entries == 0 {
        return Ok(start);
    }
    let n = entries as usize;
    let pages = n.div_ceil(index::INDEX_PAGE_ENTRIES);
    let (mut lo, mut hi) = (0usize, pages);
    let mut best = start;
    let mut first = true;
    while lo < hi {
        let p = if first {
            first = false;
            let guess = (u128::from(target) * pages as u128 / u128::from(range.max(1))) as usize;
            guess.clamp(lo, hi - 1)
        } else {
            lo + (hi - lo) / 2
        };
        let from = p * index::INDEX_PAGE_ENTRIES;
        let count = index::INDEX_PAGE_ENTRIES.min(n - from);
        let bytes = file.read_bytes((from * INDEX_ENTRY_BYTES) as u64, count * INDEX_ENTRY_BYTES).await?;
        if bytes.len() != count * INDEX_ENTRY_BYTES {
            return Err(LogError::Corrupt {
                path: file.path().to_path_buf(),
                what: "index shorter than its trailer says".into(),
            });
        }
        let page: Vec<IndexEntry> = bytes.chunks_exact(INDEX_ENTRY_BYTES).map(IndexEntry::decode).collect();
        match index::floor_by(&page, target, &key) {
            None => hi = p,
            Some(i) => {
                best = page[i];
                if i + 1 < page.len() || p + 1 == pages {
                    return Ok(best);
                }
                lo = p + 1;
            }
        }
    }
    Ok(best)
}

/// One batch header seen by a scan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScannedBatch {
    pub pos: u64,
    pub header: BatchHeader,
}

/// Bytes read per step by header scans.
const SCAN_WINDOW_BYTES: usize = 16 << 10;

/// Walks batch headers from `pos` (a batch start) while `pos < end`, calling
/// `visit` for each; stops when `visit` returns false. Reads only headers
/// (one small window per step), never whole large batches.
pub(crate) async fn scan_headers(
    file: &SegmentFile,
    mut pos: u64,
    end: u64,
    mut visit: impl FnMut(ScannedBatch) -> bool,
) -> Result<(), LogError> {
    while pos < end {
        let want = SCAN_WINDOW_BYTES.min((end - pos) as usize).max(BATCH_HEADER_BYTES);
        let buf = file.read_bytes(pos, want).await?;
        let mut at = 0usize;
        loop {
            if pos >= end {
                return Ok(());
            }
            if buf.len() - at < BATCH_HEADER_BYTES {
                if at == 0 {
                    return Err(corrupt_at(file.path(), pos, "a batch header runs past the end of the data"));
                }
                break;
            }
            let header = BatchHeader::parse(&buf[at..])
                .map_err(|e| corrupt_at(file.path(), pos, &format!("bad batch header: {e}")))?;
            if !visit(ScannedBatch { pos, header }) {
                return Ok(());
            }
            pos += header.total_bytes() as u64;
            at += header.total_bytes();
            if at >= buf.len() {
                break;
            }
        }
    }
    Ok(())
}

fn corrupt_at(path: &Path, pos: u64, what: &str) -> LogError {
    LogError::Corrupt { path: path.to_path_buf(), what: format!("at position {pos}: {what}") }
}

// The scan's state and its pure per-batch step live in `index` (public, so
// the fuzz targets reach them); re-exported under their old paths.
pub(crate) use super::index::{Scan, ScanStop, RECOVERY_BATCH_BYTES_MAX};

/// Reads per step during recovery.
const RECOVERY_WINDOW_BYTES: usize = 1 << 20;

/// Validates every batch (length, CRC, offset continuity) from the start of
/// a segment and rebuilds its indexes. Stops at the first bad batch, at
/// `file_len`, or at the batch whose base is `>= stop_at_offset`.
///
/// Offsets must follow on batch after batch, except that a batch starting
/// below `gaps_below` may start after a gap: compaction removed the records
/// between (`log::compact`). Offsets still never go backwards.
pub(crate) async fn recover_scan(
    file: &SegmentFile,
    base: u64,
    file_len: u64,
    interval_bytes: u32,
    stop_at_offset: Option<u64>,
    gaps_below: u64,
) -> Result<Scan, LogError> {
    recover_scan_from(file, base, Scan::start(base, interval_bytes), file_len, stop_at_offset, gaps_below)
        .await
}

/// [`recover_scan`] resumed from `scan`, what an earlier scan (or a
/// recovery point) found in the segment's first `scan.valid_bytes` bytes.
pub(crate) async fn recover_scan_from(
    file: &SegmentFile,
    base: u64,
    mut scan: Scan,
    file_len: u64,
    stop_at_offset: Option<u64>,
    gaps_below: u64,
) -> Result<Scan, LogError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_pos = 0u64; // file position of buf[0]
    loop {
        let pos = scan.valid_bytes;
        if pos >= file_len {
            scan.stop = ScanStop::Clean;
            return Ok(scan);
        }
        let at = (pos - buf_pos) as usize;
        let rest: &[u8] = if at <= buf.len() { &buf[at..] } else { &[] };
        let need = batch::peek_total_bytes(rest).unwrap_or(BATCH_HEADER_BYTES).max(BATCH_HEADER_BYTES);
        let file_rest = file_len - pos;
        if need <= RECOVERY_BATCH_BYTES_MAX && rest.len() < need && (rest.len() as u64) < file_rest {
            let len = (RECOVERY_WINDOW_BYTES.max(need) as u64).min(file_rest) as usize;
            buf = file.read_bytes(pos, len).await?;
            buf_pos = pos;
            if buf.is_empty() {
                scan.stop = ScanStop::Bad(BatchError::Truncated { need, have: 0 });
                return Ok(scan);
            }
            glommio::yield_if_needed().await;
            continue;
        }
        if !index::scan_step(&mut scan, rest, base, pos, stop_at_offset, gaps_below) {
            return Ok(scan);
        }
    }
}

/// Reads a whole `.timeindex` file.
pub(crate) async fn read_time_index(path: &Path, entries: u32) -> Result<Vec<TimeEntry>, LogError> {
    let f = SegmentFile::open(path).await?;
    let bytes = f.read_bytes(0, entries as usize * index::TIME_ENTRY_BYTES).await?;
    close_quietly(f).await;
    Ok(bytes.chunks_exact(index::TIME_ENTRY_BYTES).map(TimeEntry::decode).collect())
}

/// Reads a whole `.index` file's entries.
pub(crate) async fn read_index(path: &Path, entries: u32) -> Result<Vec<IndexEntry>, LogError> {
    let f = SegmentFile::open(path).await?;
    let bytes = f.read_bytes(0, entries as usize * INDEX_ENTRY_BYTES).await?;
    close_quietly(f).await;
    Ok(bytes.chunks_exact(INDEX_ENTRY_BYTES).map(IndexEntry::decode).collect())
}

/// Reads and checks the trailer of `<base>.index` against `log_bytes`.
pub(crate) async fn read_summary(dir: &Path, base: u64, log_bytes: u64) -> Option<SegmentSummary> {
    read_summary_at(
        &segment_path(dir, base, INDEX_EXT),
        &segment_path(dir, base, TIME_INDEX_EXT),
        base,
        log_bytes,
    )
    .await
}

/// [`read_summary`] of index files at any path (compaction's `.swap` files).
pub(crate) async fn read_summary_at(
    index_path: &Path,
    time_index_path: &Path,
    base: u64,
    log_bytes: u64,
) -> Option<SegmentSummary> {
    let f = SegmentFile::open(index_path).await.ok()?;
    let len = f.file.file_size().await.ok()?;
    let trailer = if len >= index::TRAILER_BYTES as u64 {
        f.read_bytes(len - index::TRAILER_BYTES as u64, index::TRAILER_BYTES).await.ok()
    } else {
        None
    };
    close_quietly(f).await;
    let summary = index::decode_trailer(&trailer?, len)?;
    let time_len = std::fs::metadata(time_index_path).ok()?.len();
    let time_ok = time_len == u64::from(summary.time_entries) * index::TIME_ENTRY_BYTES as u64;
    (summary.log_bytes == log_bytes && time_ok && summary.next_offset >= base).then_some(summary)
}

/// Makes glommio's once-per-thread-and-device choice of ring for O_DIRECT
/// I/O from a real read. glommio 0.9 probes with a read on the first
/// `DmaFile` a thread opens on a device: on an empty file (a new segment)
/// that read succeeds at end of file whatever the device, the device is then
/// taken for one with poll queues, and every later O_DIRECT read on it fails
/// with EOPNOTSUPP. So, once per thread and device, the first `DmaFile` opened
/// is a one-block probe file in `dir`, removed again.
pub(crate) async fn settle_iopoll_probe(dir: &Path) -> Result<(), LogError> {
    use std::os::unix::fs::MetadataExt;
    thread_local!(static SETTLED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) });
    let dev = std::fs::metadata(dir).map_err(|e| LogError::io("reading metadata", dir, e))?.dev();
    if SETTLED.with(|s| s.borrow().contains(&dev)) {
        return Ok(());
    }
    let path = dir.join(".io-probe");
    // One-off blocking write of one block, once per thread and device.
    std::fs::write(&path, [0u8; 4096]).map_err(|e| LogError::io("writing the I/O probe file", &path, e))?;
    let opened = OpenOptions::new().read(true).dma_open(&path).await;
    let _ = std::fs::remove_file(&path);
    let file = opened.map_err(|e| LogError::glommio("opening the I/O probe file", &path, e))?;
    if let Err(e) = file.close().await {
        tracing::debug!(path = %path.display(), error = %e, "closing the I/O probe file failed");
    }
    SETTLED.with(|s| s.borrow_mut().push(dev));
    Ok(())
}

/// Closing a read-only handle cannot lose data; a failure is only logged.
async fn close_quietly(f: SegmentFile) {
    let path = f.path.clone();
    if let Err(e) = f.file.close().await {
        tracing::debug!(path = %path.display(), error = %e, "closing a read-only file failed");
    }
}

/// Writes `bytes` as the whole content of `path` and fdatasyncs it.
pub(crate) async fn write_file_durably(path: &Path, bytes: Vec<u8>) -> Result<(), LogError> {
    write_file(path, bytes, true).await
}

/// Writes `bytes` as the whole content of `path`, through io_uring (new
/// files are made in parallel, not one after another on the blocking
/// thread); fdatasyncs it when `durable`.
pub(crate) async fn write_file(path: &Path, bytes: Vec<u8>, durable: bool) -> Result<(), LogError> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(path)
        .await
        .map_err(|e| LogError::glommio("creating", path, e))?;
    let len = bytes.len();
    if len > 0 {
        let n = f.write_at(bytes, 0).await.map_err(|e| LogError::glommio("writing", path, e))?;
        if n != len {
            return Err(LogError::io("writing (short write)", path, std::io::ErrorKind::StorageFull.into()));
        }
    }
    if durable {
        f.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", path, e))?;
    }
    f.close().await.map_err(|e| LogError::glommio("closing", path, e))?;
    Ok(())
}
