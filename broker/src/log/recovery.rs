//! Opening a log: creation of a new one, recovery of segments after a
//! clean or unclean shutdown; and `truncate_to`, which reuses the same scan.

use super::*;
use producers::BatchSeq;
use segment::{recover_scan, recover_scan_from, SegmentFile};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

/// Whether `dir` is on tmpfs (no O_DIRECT; glommio silently falls back).
fn is_tmpfs(dir: &Path) -> Result<bool, LogError> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| LogError::io("statfs", dir, std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call and `buf`
    // points to writable memory of the struct's size; statfs only writes it.
    let rc = unsafe { libc::statfs(c.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(LogError::io("statfs", dir, std::io::Error::last_os_error()));
    }
    // SAFETY: statfs returned 0, so it filled the whole struct.
    let buf = unsafe { buf.assume_init() };
    Ok(buf.f_type == libc::TMPFS_MAGIC)
}

/// Says once per shard and data directory (not once per partition) that
/// its logs have no O_DIRECT.
fn warn_tmpfs(dir: &Path) {
    thread_local!(static WARNED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) });
    let parent = dir.parent().unwrap_or(dir).to_path_buf();
    if WARNED.with(|w| w.borrow().contains(&parent)) {
        return;
    }
    tracing::warn!(
        dir = %parent.display(),
        "data directory is on tmpfs, which has no O_DIRECT: its logs fall back to buffered I/O \
         (page cache); fdatasync is a no-op there and nothing survives a reboot"
    );
    WARNED.with(|w| w.borrow_mut().push(parent));
}

/// Reads or creates `partition.metadata`.
async fn check_metadata(dir: &Path) -> Result<(), LogError> {
    let path = dir.join(METADATA_FILE);
    // One-off small read at open.
    match std::fs::read(&path) {
        // A creation that crashed before its files were made durable can
        // leave the file empty (delayed allocation): written again.
        Ok(bytes) if bytes.is_empty() => {
            tracing::info!(path = %path.display(), "empty partition metadata (an interrupted creation): rewriting it");
            write_metadata_durably(dir).await
        }
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| LogError::Corrupt { path: path.clone(), what: format!("not JSON: {e}") })?;
            match v.get("version").and_then(serde_json::Value::as_u64) {
                Some(METADATA_VERSION) => Ok(()),
                other => Err(LogError::Corrupt {
                    path,
                    what: format!("unsupported partition metadata version {other:?}"),
                }),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_metadata_durably(dir).await,
        Err(e) => Err(LogError::io("reading", &path, e)),
    }
}

fn metadata_json() -> Vec<u8> {
    serde_json::json!({ "version": METADATA_VERSION }).to_string().into_bytes()
}

async fn write_metadata_durably(dir: &Path) -> Result<(), LogError> {
    segment::write_file_durably(&dir.join(METADATA_FILE), metadata_json()).await?;
    sync_dir(dir).await
}

/// Segment base offsets in `dir`, sorted, with each `.log` size. Removes
/// index files whose `.log` is gone.
fn list_segments(dir: &Path) -> Result<Vec<(u64, u64)>, LogError> {
    // One-off directory listing and stats at open: glommio has no async readdir.
    let mut logs = Vec::new();
    let mut others = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io("listing", dir, e))? {
        let entry = entry.map_err(|e| LogError::io("listing", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(base) = segment::parse_log_name(&name) {
            let len = entry.metadata().map_err(|e| LogError::io("stat", &entry.path(), e))?.len();
            logs.push((base, len));
        } else if let Some(stem) = name.strip_suffix(".index").or_else(|| name.strip_suffix(".timeindex")) {
            others.push((stem.to_string(), entry.path()));
        }
    }
    logs.sort_unstable();
    for (stem, path) in others {
        let has_log = stem.parse::<u64>().is_ok_and(|b| logs.binary_search_by_key(&b, |l| l.0).is_ok());
        if !has_log {
            tracing::info!(path = %path.display(), "removing an index without its segment");
            std::fs::remove_file(&path).map_err(|e| LogError::io("removing", &path, e))?;
        }
    }
    Ok(logs)
}

/// Completes what a crash interrupted in a compaction pass (`compact`):
/// a `B.log.swap` is a committed rewrite, whose `.index.swap` trailer says
/// which offsets it replaces (`[B, next_offset)`): the replaced segments
/// still there are removed and the `.swap` files take their names. Files
/// ending in `.cleaned` are a rewrite that never committed: removed.
async fn finish_swaps(dir: &Path) -> Result<(), LogError> {
    // One-off directory listing at open: glommio has no async readdir.
    let (mut swaps, mut cleaned, mut logs) = (Vec::new(), Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io("listing", dir, e))? {
        let entry = entry.map_err(|e| LogError::io("listing", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let swap_suffix = format!(".{LOG_EXT}.{}", compact::SWAP_SUFFIX);
        if let Some(base) = name.strip_suffix(&swap_suffix).and_then(|stem| stem.parse::<u64>().ok()) {
            swaps.push((base, entry.metadata().map_err(|e| LogError::io("stat", &entry.path(), e))?.len()));
        } else if name.ends_with(&format!(".{}", compact::CLEANED_SUFFIX)) {
            cleaned.push(entry.path());
        } else if let Some(base) = segment::parse_log_name(&name) {
            logs.push(base);
        }
    }
    for path in cleaned {
        tracing::info!(path = %path.display(), "removing the leftover of an interrupted compaction");
        remove_if_exists(&path).await?;
    }
    for (base, log_bytes) in swaps {
        let swap = |ext| compact::temp_path(dir, base, ext, compact::SWAP_SUFFIX);
        let Some(summary) =
            segment::read_summary_at(&swap(INDEX_EXT), &swap(TIME_INDEX_EXT), base, log_bytes).await
        else {
            return Err(LogError::Corrupt {
                path: swap(LOG_EXT),
                what: "a committed compaction rewrite without a readable .index.swap".into(),
            });
        };
        for &b in logs.iter().filter(|&&b| b >= base && b < summary.next_offset) {
            remove_segment_files(dir, b).await?;
        }
        for ext in [INDEX_EXT, TIME_INDEX_EXT, LOG_EXT] {
            glommio::io::rename(swap(ext), segment::segment_path(dir, base, ext))
                .await
                .map_err(|e| LogError::glommio("renaming", &swap(ext), e))?;
        }
        tracing::info!(dir = %dir.display(), segment = base, next_offset = summary.next_offset, "finished an interrupted compaction swap");
    }
    sync_dir(dir).await
}

fn read_marker(dir: &Path) -> Option<CleanMarker> {
    let path = dir.join(CLEAN_SHUTDOWN_FILE);
    let bytes = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable clean-shutdown marker");
            None
        }
    }
}

fn warn_scan(path: &Path, size: u64, scan: &Scan) {
    let (pos, next) = (scan.valid_bytes, scan.next_offset);
    match &scan.stop {
        ScanStop::Clean | ScanStop::Limit => {}
        ScanStop::ZeroTail => tracing::info!(
            path = %path.display(), position = pos, next_offset = next, file_bytes = size,
            "segment data ends before preallocated zeros; truncating them"
        ),
        ScanStop::Bad(e) => tracing::warn!(
            path = %path.display(), position = pos, next_offset = next, dropped_bytes = size - pos,
            error = %e, "torn or corrupt batch; truncating the segment here"
        ),
        ScanStop::OffsetGap { expected, found } => tracing::warn!(
            path = %path.display(), position = pos, expected_offset = expected, found_offset = found,
            dropped_bytes = size - pos, "batch offsets do not follow on; truncating the segment here"
        ),
        ScanStop::OffsetOverflow { base_offset, last_offset_delta } => tracing::warn!(
            path = %path.display(), position = pos, base_offset, last_offset_delta,
            dropped_bytes = size - pos, "batch offsets pass the largest offset; truncating the segment here"
        ),
    }
}

/// Scans sealed segment `base`; `next_base` is the next segment's base
/// (compaction may have left gaps below it).
async fn scan_segment(
    dir: &Path,
    base: u64,
    size: u64,
    next_base: u64,
    config: &TopicConfig,
) -> Result<Scan, LogError> {
    let path = segment::segment_path(dir, base, LOG_EXT);
    let reader = SegmentFile::open(&path).await?;
    let scan = recover_scan(&reader, base, size, config.index_interval_bytes, None, next_base).await?;
    warn_scan(&path, size, &scan);
    Ok(scan)
}

/// What opening a log found on disk, before its state is assembled.
struct Found {
    closed: VecDeque<ClosedSegment>,
    closed_bytes: u64,
    base: u64,
    file: DmaFile,
    scan: Scan,
    /// The active segment's bytes after its last whole block.
    tail: Vec<u8>,
    point_written: recovery_point::Written,
    producers: producers::ProducerStates,
    epochs: epochs::LeaderEpochs,
    /// A clean-shutdown marker was read (removed once the log is open).
    marker: bool,
}

/// Opens the log in `dir`, creating it when the directory does not exist.
/// Returns whether it was created: a new directory and its files are not
/// yet durable, and the caller makes them so (`sync_filesystem`) before
/// it hands the log out.
pub(super) async fn open(
    dir: PathBuf,
    config: TopicConfig,
    options: LogOptions,
) -> Result<(Log, bool), LogError> {
    crate::fault::hit(crate::fault::FaultPoint::RecoveryRead, &dir)
        .await
        .map_err(|e| LogError::io("opening log", &dir, e))?;
    // Blocking metadata calls (mkdir, statfs, readdir) that glommio has no
    // async versions of run on its blocking thread pool: a topic created
    // while the shard serves opens its logs without stalling the reactor.
    let (direct_io, created) = {
        let dir = dir.clone();
        glommio::executor()
            .spawn_blocking(move || {
                let created = make_dir(&dir)?;
                Ok::<_, LogError>((!is_tmpfs(&dir)?, created))
            })
            .await?
    };
    if created {
        // Not yet durable (see above).
        segment::write_file(&dir.join(METADATA_FILE), metadata_json(), false).await?;
    }
    if direct_io {
        segment::settle_iopoll_probe(&dir).await?;
    } else {
        warn_tmpfs(&dir);
    }
    let found = if created {
        create(&dir, &config, &options).await?
    } else {
        recover(&dir, &config, &options).await?
    };
    let Found { closed, closed_bytes, base, file, scan, tail, point_written, producers, epochs, marker } =
        found;
    let block = BLOCK_BYTES_MIN.max(file.alignment());
    let path = segment::segment_path(&dir, base, LOG_EXT);
    let file = counted_write_file(file, &options.files);
    let active = Active::new(base, path, file, ReaderSlot::new(&options.files), scan, tail);
    let hot =
        hot::HotWindow::new(options.hot_tail.clone(), options.hot_tail_log_bytes_max, base, active.end_pos);
    let interval = match config.flush {
        FlushPolicy::Interval { ms, .. } => Some(Duration::from_millis(ms.max(1))),
        _ => None,
    };
    let sh = Rc::new(Shared {
        dir,
        config,
        direct_io,
        direct_reads: options.direct_reads && direct_io,
        block,
        admission: admit::Admission::default(),
        st: RefCell::new(State {
            closed,
            closed_bytes,
            active,
            failed: None,
            shut: false,
            rolling: false,
            roll_gen: 0,
            roll_error: None,
            writes_in_flight: 0,
            gate_queued: false,
            issued_end: 0,
            write_seq_issue: 0,
            write_seq_complete: 0,
            write_done: std::collections::BTreeMap::new(),
            write_gen: 0,
            sync_busy: false,
            unwritten: VecDeque::new(),
            unsynced: VecDeque::new(),
            last_sync_ms: now_ms(),
            bytes_since_sync: 0,
            stats: LogStats::default(),
            open_readers: VecDeque::new(),
            compacting: false,
            cleaned_upto: 0,
            producers,
            epochs,
            recovery_point: point_written,
        }),
        changed: Notify::default(),
        hot,
        open_readers_max: options.open_readers_max.max(2),
        files: options.files,
        io_stats: options.io_stats,
        gate: options.gate,
        write_tick: Cell::new(None),
        epochs_writing: Cell::new(false),
        recovery_point_writing: Cell::new(false),
    });
    touch_write_file(&sh);
    if marker {
        remove_if_exists(&sh.dir.join(CLEAN_SHUTDOWN_FILE)).await?;
    }
    if !created {
        sync_dir(&sh.dir).await?;
    }
    if let Some(every) = interval {
        glommio::spawn_local(flush_timer(Rc::downgrade(&sh), every)).detach();
    }
    Ok((Log { sh }, created))
}

/// Makes `dir` (and its parent when missing); whether it was new.
fn make_dir(dir: &Path) -> Result<bool, LogError> {
    let made = match std::fs::create_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| LogError::io("creating directory", parent, e))?;
            }
            std::fs::create_dir(dir)
        }
        other => other,
    };
    match made {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(LogError::io("creating directory", dir, e)),
    }
}

/// A new log: an empty first segment, nothing to recover or probe for.
async fn create(dir: &Path, config: &TopicConfig, options: &LogOptions) -> Result<Found, LogError> {
    options.files.admit();
    let file = open_dma(&segment::segment_path(dir, 0, LOG_EXT), false).await?;
    Ok(Found {
        closed: VecDeque::new(),
        closed_bytes: 0,
        base: 0,
        file,
        scan: Scan::start(0, config.index_interval_bytes),
        tail: Vec::new(),
        point_written: recovery_point::Written::default(),
        producers: producers::ProducerStates::default(),
        epochs: epochs::LeaderEpochs::default(),
        marker: false,
    })
}

/// An existing log: finishes interrupted compactions, checks sealed
/// segments and recovers the active one (`open_last`).
async fn recover(dir: &Path, config: &TopicConfig, options: &LogOptions) -> Result<Found, LogError> {
    check_metadata(dir).await?;
    finish_swaps(dir).await?;
    let marker = read_marker(dir);
    let mut segments = {
        let dir = dir.to_path_buf();
        glommio::executor().spawn_blocking(move || list_segments(&dir)).await?
    };
    let mut closed = VecDeque::new();
    let mut closed_bytes = 0;
    let mut i = 0;
    while i + 1 < segments.len() {
        let (base, size) = segments[i];
        let next_base = segments[i + 1].0;
        let summary = match segment::read_summary(dir, base, size).await {
            Some(s) if s.next_offset <= next_base => s,
            _ => {
                let scan = scan_segment(dir, base, size, next_base, config).await?;
                if scan.valid_bytes != size || scan.next_offset > next_base {
                    tracing::warn!(
                        dir = %dir.display(), segment = base, next_offset = scan.next_offset,
                        dropped_segments = segments.len() - i - 1,
                        "damaged sealed segment: the log ends here; later segments are removed"
                    );
                    for &(b, _) in segments[i + 1..].iter().rev() {
                        remove_segment_files(dir, b).await?;
                    }
                    segments.truncate(i + 1);
                    break;
                }
                let s = scan.index.summary(size, scan.next_offset);
                let ix = index::encode_index(&scan.index.entries, &s);
                let tx = index::encode_time_index(&scan.index.times);
                segment::write_file_durably(&segment::segment_path(dir, base, TIME_INDEX_EXT), tx).await?;
                segment::write_file_durably(&segment::segment_path(dir, base, INDEX_EXT), ix).await?;
                tracing::info!(dir = %dir.display(), segment = base, "rebuilt segment indexes");
                s
            }
        };
        closed.push_back(ClosedSegment::new(base, summary, ReaderSlot::new(&options.files), &options.files));
        closed_bytes += size;
        i += 1;
    }
    let (base, size) = segments.last().copied().unwrap_or((0, 0));
    options.files.admit();
    let (file, reader, scan, resumed) = open_last(dir, base, size, config, marker.as_ref()).await?;
    let block = BLOCK_BYTES_MIN.max(file.alignment());
    assert!(block.is_power_of_two(), "block size is a power of two");
    let tail_start = align_down(scan.valid_bytes, block);
    let tail = if scan.valid_bytes == tail_start {
        Vec::new()
    } else {
        reader.read_bytes(tail_start, (scan.valid_bytes - tail_start) as usize).await?
    };
    // The recovery read handle is not kept: reads at the log end come from
    // memory, and the first one that does not reopens it lazily.
    drop(reader);
    let (point_written, point_producers) = match resumed {
        Some((w, producers)) => (w, Some(producers)),
        None => (recovery_point::Written::default(), None),
    };
    let producers = idempotence::rebuild(dir, &scan, scan.next_offset, point_producers);
    let epochs = epochs::LeaderEpochs::load(dir, scan.next_offset);
    Ok(Found {
        closed,
        closed_bytes,
        base,
        file,
        scan,
        tail,
        point_written,
        producers,
        epochs,
        marker: marker.is_some(),
    })
}

/// A recovery point an unclean open resumed from: where it stands, and
/// its producer snapshot.
type Resumed = (recovery_point::Written, Vec<u8>);

/// Opens the last segment for appending: trusts its sealed index after a
/// clean shutdown, otherwise validates it batch by batch (from its recovery
/// point, when one names it) and truncates at the first bad batch.
async fn open_last(
    dir: &Path,
    base: u64,
    size: u64,
    config: &TopicConfig,
    marker: Option<&CleanMarker>,
) -> Result<(DmaFile, Rc<SegmentFile>, Scan, Option<Resumed>), LogError> {
    let path = segment::segment_path(dir, base, LOG_EXT);
    let file = open_dma(&path, false).await?;
    let reader = Rc::new(SegmentFile::open(&path).await?);
    let clean = marker.is_some_and(|m| m.active_base == base && m.active_bytes == size);
    let trusted = if clean { segment::read_summary(dir, base, size).await } else { None };
    let mut resumed = None;
    let scan = match trusted.filter(|s| marker.is_some_and(|m| m.next_offset == s.next_offset)) {
        Some(s) => {
            let entries =
                segment::read_index(&segment::segment_path(dir, base, INDEX_EXT), s.index_entries).await?;
            let times =
                segment::read_time_index(&segment::segment_path(dir, base, TIME_INDEX_EXT), s.time_entries)
                    .await?;
            Scan {
                valid_bytes: size,
                next_offset: s.next_offset,
                index: IndexBuilder::from_parts(config.index_interval_bytes, entries, times, s.max_timestamp),
                stop: ScanStop::Clean,
                batches: 0,
                producers: Vec::new(),
            }
        }
        None => {
            let start = match recovery_point::read(dir, base, size).await {
                Some(point) => {
                    let written = recovery_point::Written {
                        base,
                        pos: point.pos,
                        file_bytes: point.file_bytes() as u64,
                    };
                    let (scan, producers) = point.into_scan(config.index_interval_bytes);
                    resumed = Some((written, producers));
                    scan
                }
                None => Scan::start(base, config.index_interval_bytes),
            };
            let trusted = start.valid_bytes;
            let scan = recover_scan_from(&reader, base, start, size, None, 0).await?;
            warn_scan(&path, size, &scan);
            // Says where the open resumed and what it had to validate
            // (`validated_bytes`: batches checked past the point); a new,
            // empty segment (a partition just created) has nothing to say.
            if size > 0 {
                tracing::info!(
                path = %path.display(), trusted_bytes = trusted, validated_bytes = scan.valid_bytes - trusted,
                file_bytes = size, from_recovery_point = resumed.is_some(),
                "unclean shutdown: recovered the active segment"
                );
            }
            scan
        }
    };
    if scan.valid_bytes != size {
        file.truncate(scan.valid_bytes)
            .await
            .map_err(|e| LogError::glommio("truncating segment", &path, e))?;
    }
    // After a crash of the process (not the machine) recovered bytes may sit
    // only in the page cache; make them durable before calling them so.
    file.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", &path, e))?;
    // The active segment's index lives in memory; stale files must not be
    // trusted later (their trailer no longer matches the growing .log anyway).
    for ext in [INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(dir, base, ext)).await?;
    }
    Ok((file, reader, scan, resumed))
}

/// Truncates to `offset`, which must be a batch boundary when `exact`;
/// otherwise to the last boundary at or below it. Returns the new end.
pub(super) async fn truncate_to(sh: &Rc<Shared>, offset: u64, exact: bool) -> Result<u64, LogError> {
    loop {
        wait_not_rolling(sh).await;
        let mut st = sh.st.borrow_mut();
        if !st.rolling {
            st.rolling = true;
            break;
        }
    }
    let result = truncate_inner(sh, offset, exact).await;
    {
        let mut st = sh.st.borrow_mut();
        st.rolling = false;
        st.roll_gen += 1;
        st.roll_error = None;
    }
    sh.changed.notify_all();
    result
}

/// `replay` (the idempotent batches of the cut segment below the cut, in
/// log order) preceded by those of earlier segments, read back one segment
/// at a time, newest first, until each producer of `emptied` (producers the
/// cut leaves with no batch remembered) shows up or the log's first segment
/// is read. Without this, a cut at or near a segment's start made such a
/// producer unknown, and the retry of its last batch below the cut was
/// appended a second time (found by `log_idempotence.rs` when batches
/// changed size and a cut fell on a segment boundary).
async fn history_before(
    sh: &Rc<Shared>,
    seg_base: u64,
    mut emptied: Vec<i64>,
    mut replay: Vec<(i64, i16, BatchSeq)>,
) -> Result<Vec<(i64, i16, BatchSeq)>, LogError> {
    let interval = sh.config.index_interval_bytes;
    let mut before = seg_base;
    let mut seen = 0;
    loop {
        if !emptied.is_empty() {
            // Only the batches read since the last look can name a new producer.
            let found: std::collections::HashSet<i64> =
                replay[..replay.len() - seen].iter().map(|b| b.0).collect();
            emptied.retain(|id| !found.contains(id));
        }
        if emptied.is_empty() {
            return Ok(replay);
        }
        seen = replay.len();
        let (base, size, gaps_below) = {
            let st = sh.st.borrow();
            let i = st.closed.partition_point(|s| s.base < before);
            if i == 0 {
                return Ok(replay);
            }
            let s = &st.closed[i - 1];
            (s.base, s.size(), st.closed.get(i).map_or(st.active.base, |n| n.base))
        };
        let reader = read::segment_reader(sh, base, false).await?;
        let mut earlier = recover_scan(&reader, base, size, interval, None, gaps_below).await?.producers;
        earlier.append(&mut replay);
        replay = earlier;
        before = base;
    }
}

async fn truncate_inner(sh: &Rc<Shared>, offset: u64, exact: bool) -> Result<u64, LogError> {
    flush_inner(sh).await?;
    let (start, end, active_base) = {
        let st = sh.st.borrow();
        (st.start_offset(), st.active.next_offset, st.active.base)
    };
    if offset < start || offset > end {
        return Err(LogError::OffsetOutOfRange {
            requested: Offset(offset),
            start: Offset(start),
            end: Offset(end),
        });
    }
    if offset == end {
        return Ok(end);
    }
    // The point may name bytes the cut removes and later appends rewrite.
    recovery_point::remove(sh).await?;
    let interval = sh.config.index_interval_bytes;
    let seg_base = if offset >= active_base {
        active_base
    } else {
        let st = sh.st.borrow();
        st.closed[st.closed.partition_point(|s| s.base <= offset) - 1].base
    };
    // A sealed segment may have compaction gaps below the next one's base.
    let (size, gaps_below) = {
        let st = sh.st.borrow();
        match st.closed.binary_search_by_key(&seg_base, |s| s.base) {
            Ok(i) => (st.closed[i].size(), st.closed.get(i + 1).map_or(st.active.base, |s| s.base)),
            Err(_) => (st.active.written_pos, 0),
        }
    };
    let reader = read::segment_reader(sh, seg_base, false).await?;
    let mut scan = recover_scan(&reader, seg_base, size, interval, Some(offset), gaps_below).await?;
    if exact && scan.next_offset != offset {
        return Err(LogError::NotBatchBoundary { dir: sh.dir.clone(), offset: Offset(offset) });
    }
    let offset = scan.next_offset;
    // Remove later segments, newest first, so a crash midway leaves a prefix.
    let later: Vec<u64> = {
        let st = sh.st.borrow();
        st.closed.iter().map(|s| s.base).chain([st.active.base]).filter(|&b| b > seg_base).collect()
    };
    for &b in later.iter().rev() {
        remove_segment_files(&sh.dir, b).await?;
    }
    let path = segment::segment_path(&sh.dir, seg_base, LOG_EXT);
    sh.files.admit();
    let file = counted_write_file(open_dma(&path, false).await?, &sh.files);
    file.truncate(scan.valid_bytes).await.map_err(|e| LogError::glommio("truncating segment", &path, e))?;
    file.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", &path, e))?;
    for ext in [INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(&sh.dir, seg_base, ext)).await?;
    }
    let scan_end = scan.valid_bytes;
    let mut replay = std::mem::take(&mut scan.producers);
    let emptied = sh.st.borrow().producers.emptied_by(offset);
    replay = history_before(sh, seg_base, emptied, replay).await?;
    let tail_start = align_down(scan.valid_bytes, sh.block);
    let tail = reader.read_bytes(tail_start, (scan.valid_bytes - tail_start) as usize).await?;
    let slot = ReaderSlot::new(&sh.files);
    slot.put(reader);
    let new = Active::new(seg_base, path, file, slot, scan, tail);
    let old = {
        let mut st = sh.st.borrow_mut();
        while st.closed.back().is_some_and(|s| s.base >= seg_base) {
            let s = st.closed.pop_back().expect("back exists");
            st.closed_bytes -= s.size();
        }
        st.producers_truncated(offset, &replay);
        st.epochs.truncate_from(offset);
        std::mem::replace(&mut st.active, new)
    };
    touch_write_file(sh);
    sh.hot.borrow_mut().reset(seg_base, scan_end);
    if let Some(f) = old.file {
        close_dma(f, &old.path).await?;
    }
    // The last snapshot may be from past `offset`: appends from here would
    // fall before its offset and not be replayed at open (`idempotence`).
    idempotence::write_snapshot(sh).await?;
    epochs::write_checkpoint(sh).await?;
    tracing::info!(dir = %sh.dir.display(), offset, "log truncated");
    sync_dir(&sh.dir).await?;
    Ok(offset)
}
