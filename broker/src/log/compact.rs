//! Keyed compaction (`cleanup.policy=compact`): sealed segments are
//! rewritten keeping only the latest record of each key, so a log of keyed
//! updates (the offsets topic, a changelog) stays proportional to its number
//! of live keys, not to its history.
//!
//! A pass (`Log::compact`, run by the shard's retention loop):
//! 1. **Cleanable range**: the sealed segments, oldest first, up to the
//!    first whose newest record is younger than `min.compaction.lag.ms`.
//!    The active segment is never touched. The pass runs when the dirty
//!    bytes (segments at or after `cleaned_upto`, the end of the previous
//!    pass) are at least `min.cleanable.dirty.ratio` of the range.
//! 2. **Key map**: one read of the range records, per key, the offset of
//!    its latest record (full key bytes, no hashing: a collision would drop
//!    a live record).
//! 3. **Rewrite**: consecutive segments are grouped while their original
//!    sizes fit `segment.bytes` (and their offsets a u32); each group is
//!    written as one segment named by its first base. A record stays if it
//!    has no key, or it is its key's latest and not a tombstone, or it is a
//!    latest tombstone whose timestamp is within `delete.retention.ms` (so a
//!    consumer that is behind still sees the delete). Batches keep their
//!    base offset, `last_offset_delta`, producer fields and timestamps
//!    (`batch::filter_records`); an emptied batch disappears, so offsets may
//!    have gaps between and inside batches. A group's `next_offset` stays
//!    the next segment's base, so reads and recovery see the same ranges.
//! 4. **Swap**, crash-safe: write `B.log.cleaned` and its indexes, fdatasync,
//!    rename the indexes to `.swap`, then `B.log.cleaned` to `B.log.swap`
//!    (the commit point), fsync the directory; swap the segments in memory
//!    (the new read handles open on the `.swap` files and are pinned); remove
//!    the replaced segments' files; rename the `.swap` files to their names;
//!    fsync the directory; unpin. `recovery::finish_swaps` completes a swap
//!    interrupted after the commit point (the `.index.swap` trailer says
//!    which offsets it replaces) and removes `.cleaned` leftovers of one
//!    interrupted before it.
//!
//! Reads during a pass see the old segments until the in-memory swap and
//! the new one after it; an in-flight read keeps its own fd on the old
//! file. Retention (for `compact,delete`), deletion and close wait for a
//! running pass or make it stop at the next group.

use super::*;
use segment::SegmentFile;
use std::collections::HashMap;

/// Suffix of a rewritten segment's files before the commit rename.
pub(super) const CLEANED_SUFFIX: &str = "cleaned";
/// Suffix after the commit rename, until the replaced files are gone.
pub(super) const SWAP_SUFFIX: &str = "swap";
/// Bytes read per step when compaction streams a segment.
const READ_WINDOW_BYTES: usize = 1 << 20;
/// Bytes buffered before each write of the rewritten segment.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// What a compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactOutcome {
    /// Sealed segments rewritten (0: nothing was due).
    pub segments_in: usize,
    pub segments_out: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
}

/// `B.<ext>.<suffix>`.
pub(super) fn temp_path(dir: &Path, base: u64, ext: &str, suffix: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}.{suffix}"))
}

/// One sealed segment in the cleanable range.
#[derive(Clone, Copy)]
struct Input {
    base: u64,
    bytes: u64,
    next_offset: u64,
}

impl Log {
    /// Runs one compaction pass if one is due (see the module docs).
    /// Returns what it did; a topic without `compact` does nothing.
    pub async fn compact(&self, now_ms: i64) -> Result<CompactOutcome, LogError> {
        let sh = &self.sh;
        if !sh.config.cleanup_policy.compacts() {
            return Ok(CompactOutcome::default());
        }
        let inputs = {
            let mut st = sh.st.borrow_mut();
            if st.shut || st.compacting {
                return Ok(CompactOutcome::default());
            }
            let lag = i64::try_from(sh.config.min_compaction_lag_ms).unwrap_or(i64::MAX);
            let inputs: Vec<Input> = st
                .closed
                .iter()
                .take_while(|s| s.summary.max_timestamp <= now_ms.saturating_sub(lag))
                .map(|s| Input { base: s.base, bytes: s.size(), next_offset: s.summary.next_offset })
                .collect();
            let total: u64 = inputs.iter().map(|i| i.bytes).sum();
            let dirty: u64 = inputs.iter().filter(|i| i.base >= st.cleaned_upto).map(|i| i.bytes).sum();
            let ratio = u64::from(sh.config.min_cleanable_dirty_permille);
            if inputs.is_empty() || dirty == 0 || dirty * 1000 < total * ratio {
                return Ok(CompactOutcome::default());
            }
            st.compacting = true;
            inputs
        };
        let result = compact_range(sh, &inputs, now_ms).await;
        sh.st.borrow_mut().compacting = false;
        sh.changed.notify_all();
        result
    }
}

/// Waits until no compaction pass runs.
pub(super) async fn wait_not_compacting(sh: &Shared) {
    roll::wait_while(sh, |st| st.compacting).await;
}

async fn compact_range(sh: &Shared, inputs: &[Input], now_ms: i64) -> Result<CompactOutcome, LogError> {
    let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
    for input in inputs {
        for_each_batch(sh, input, |batch| {
            for r in batch::records(batch)? {
                if let Some(key) = r.key {
                    match latest.get_mut(key) {
                        Some(o) => *o = (*o).max(r.offset),
                        None => {
                            latest.insert(key.to_vec(), r.offset);
                        }
                    }
                }
            }
            Ok(())
        })
        .await?;
    }
    let tombstone_horizon =
        now_ms.saturating_sub(i64::try_from(sh.config.delete_retention_ms).unwrap_or(i64::MAX));
    let keep = |r: &batch::RecordView<'_>| match r.key {
        None => true,
        Some(k) => latest.get(k) == Some(&r.offset) && (!r.tombstone || r.timestamp_ms >= tombstone_horizon),
    };
    let mut outcome = CompactOutcome::default();
    let mut i = 0;
    while i < inputs.len() && !sh.st.borrow().shut {
        // A group takes the next inputs while what is written so far plus
        // the next input's original size fits a segment.
        let mut rewrite = Rewrite::start(sh, inputs[i].base).await?;
        let mut end = i;
        while end < inputs.len()
            && (end == i
                || (rewrite.bytes() + inputs[end].bytes <= sh.config.segment_bytes
                    && inputs[end].next_offset - inputs[i].base < u64::from(u32::MAX)))
        {
            rewrite.add(sh, &inputs[end], &keep).await?;
            end += 1;
        }
        let group = &inputs[i..end];
        let removed = rewrite.removed;
        let summary = rewrite.finish(sh, group.last().expect("a group has an input").next_offset).await?;
        swap_group(sh, group, summary).await?;
        outcome.segments_in += group.len();
        outcome.segments_out += 1;
        outcome.bytes_before += group.iter().map(|i| i.bytes).sum::<u64>();
        outcome.bytes_after += summary.log_bytes;
        outcome.records_removed += removed;
        let mut st = sh.st.borrow_mut();
        st.cleaned_upto = st.cleaned_upto.max(summary.next_offset);
        i = end;
    }
    if outcome.segments_in > 0 {
        tracing::info!(
            dir = %sh.dir.display(), segments_in = outcome.segments_in, segments_out = outcome.segments_out,
            bytes_before = outcome.bytes_before, bytes_after = outcome.bytes_after,
            records_removed = outcome.records_removed, "compacted"
        );
    }
    Ok(outcome)
}

/// Calls `f` with every batch of segment `input`, in order, reading the file
/// a window at a time.
async fn for_each_batch(
    sh: &Shared,
    input: &Input,
    mut f: impl FnMut(&[u8]) -> Result<(), batch::BatchError>,
) -> Result<(), LogError> {
    let path = segment::segment_path(&sh.dir, input.base, LOG_EXT);
    let file = SegmentFile::open(&path).await?;
    let corrupt = |pos: u64, what: String| LogError::Corrupt {
        path: path.clone(),
        what: format!("compaction at position {pos}: {what}"),
    };
    let mut pos = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    let mut at = 0usize;
    while pos < input.bytes {
        let rest = &buf[at..];
        let need = batch::peek_total_bytes(rest).unwrap_or(batch::BATCH_HEADER_BYTES);
        if rest.len() < need {
            let want = READ_WINDOW_BYTES.max(need).min((input.bytes - pos) as usize);
            buf = file.read_bytes(pos, want).await?;
            at = 0;
            if buf.len() < need {
                return Err(corrupt(pos, "the segment ends inside a batch".into()));
            }
            continue;
        }
        let header = batch::validate_stored(rest, segment::RECOVERY_BATCH_BYTES_MAX)
            .map_err(|e| corrupt(pos, e.to_string()))?;
        let len = header.total_bytes();
        f(&rest[..len]).map_err(|e| corrupt(pos, e.to_string()))?;
        pos += len as u64;
        at += len;
        glommio::yield_if_needed().await;
    }
    Ok(())
}

/// A group's rewrite in progress: the kept records of its inputs go to
/// `B.log.cleaned`; `finish` writes its indexes to `B.index.cleaned` and
/// `B.timeindex.cleaned`, all fdatasynced.
struct Rewrite {
    base: u64,
    path: PathBuf,
    out: glommio::io::BufferedFile,
    index: IndexBuilder,
    pending: Vec<u8>,
    written: u64,
    removed: u64,
}

impl Rewrite {
    async fn start(sh: &Shared, base: u64) -> Result<Rewrite, LogError> {
        let path = temp_path(&sh.dir, base, LOG_EXT, CLEANED_SUFFIX);
        let out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(&path)
            .await
            .map_err(|e| LogError::glommio("creating", &path, e))?;
        Ok(Rewrite {
            base,
            path,
            out,
            index: IndexBuilder::new(sh.config.index_interval_bytes),
            pending: Vec::with_capacity(WRITE_CHUNK_BYTES),
            written: 0,
            removed: 0,
        })
    }

    /// Bytes of the rewritten segment so far.
    fn bytes(&self) -> u64 {
        self.written + self.pending.len() as u64
    }

    async fn add(
        &mut self,
        sh: &Shared,
        input: &Input,
        keep: &impl Fn(&batch::RecordView<'_>) -> bool,
    ) -> Result<(), LogError> {
        let mut batches: Vec<Vec<u8>> = Vec::new();
        let mut removed = 0u64;
        for_each_batch(sh, input, |b| {
            let before = batch::BatchHeader::parse(b)?.record_count;
            match batch::filter_records(b, keep)? {
                Some(kept) => {
                    removed += u64::from(before - batch::BatchHeader::parse(&kept)?.record_count);
                    batches.push(kept);
                }
                None => removed += u64::from(before),
            }
            Ok(())
        })
        .await?;
        self.removed += removed;
        for b in batches {
            let h = batch::BatchHeader::parse(&b).expect("filter_records returns a valid batch");
            let rel = u32::try_from(h.base_offset - self.base).expect("groups span less than 2^32 offsets");
            self.index.on_batch(rel, self.bytes(), h.first_timestamp, h.max_timestamp);
            self.pending.extend_from_slice(&b);
            if self.pending.len() >= WRITE_CHUNK_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), LogError> {
        let bytes = std::mem::replace(&mut self.pending, Vec::with_capacity(WRITE_CHUNK_BYTES));
        self.written += write_all(&self.out, &self.path, bytes, self.written).await?;
        Ok(())
    }

    async fn finish(mut self, sh: &Shared, next_offset: u64) -> Result<SegmentSummary, LogError> {
        if !self.pending.is_empty() {
            self.flush().await?;
        }
        let path = &self.path;
        self.out.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", path, e))?;
        self.out.close().await.map_err(|e| LogError::glommio("closing", path, e))?;
        let summary = self.index.summary(self.written, next_offset);
        let ix = index::encode_index(&self.index.entries, &summary);
        let tx = index::encode_time_index(&self.index.times);
        segment::write_file_durably(&temp_path(&sh.dir, self.base, TIME_INDEX_EXT, CLEANED_SUFFIX), tx)
            .await?;
        segment::write_file_durably(&temp_path(&sh.dir, self.base, INDEX_EXT, CLEANED_SUFFIX), ix).await?;
        Ok(summary)
    }
}

async fn write_all(
    out: &glommio::io::BufferedFile,
    path: &Path,
    bytes: Vec<u8>,
    pos: u64,
) -> Result<u64, LogError> {
    let len = bytes.len();
    let n = out.write_at(bytes, pos).await.map_err(|e| LogError::glommio("writing", path, e))?;
    if n != len {
        return Err(LogError::io("writing (short write)", path, std::io::ErrorKind::StorageFull.into()));
    }
    Ok(len as u64)
}

async fn rename(from: &Path, to: &Path) -> Result<(), LogError> {
    glommio::io::rename(from, to).await.map_err(|e| LogError::glommio("renaming", from, e))
}

/// Commits the rewritten group and puts it in the log's place of the
/// segments it replaces (steps in the module docs).
async fn swap_group(sh: &Shared, group: &[Input], summary: SegmentSummary) -> Result<(), LogError> {
    let base = group[0].base;
    let dir = &sh.dir;
    for ext in [INDEX_EXT, TIME_INDEX_EXT, LOG_EXT] {
        rename(&temp_path(dir, base, ext, CLEANED_SUFFIX), &temp_path(dir, base, ext, SWAP_SUFFIX)).await?;
    }
    sync_dir(dir).await?;
    let log_swap = temp_path(dir, base, LOG_EXT, SWAP_SUFFIX);
    crate::fault::hit(crate::fault::FaultPoint::CompactSwap, &log_swap)
        .await
        .map_err(|e| LogError::io("compaction swap", &log_swap, e))?;
    let reader = Rc::new(SegmentFile::open_counted(&log_swap, &sh.files, sh.direct_reads).await?);
    let index_reader = Rc::new(
        SegmentFile::open_counted(&temp_path(dir, base, INDEX_EXT, SWAP_SUFFIX), &sh.files, false).await?,
    );
    let (slot, index_slot) =
        (ReaderSlot::pinned(&sh.files, reader), ReaderSlot::pinned(&sh.files, index_reader));
    {
        let mut st = sh.st.borrow_mut();
        let first = st.closed.binary_search_by_key(&base, |s| s.base).expect("compaction holds the range");
        let mut seg = ClosedSegment::new(base, summary, slot.clone(), &sh.files);
        seg.index_reader = index_slot.clone();
        let replaced: Vec<ClosedSegment> = st.closed.drain(first..first + group.len()).collect();
        debug_assert!(replaced.iter().zip(group).all(|(s, i)| s.base == i.base));
        st.closed.insert(first, seg);
        st.closed_bytes = st.closed_bytes - group.iter().map(|i| i.bytes).sum::<u64>() + summary.log_bytes;
        for s in replaced {
            s.reader.clear();
            s.index_reader.clear();
        }
    }
    for input in group {
        remove_segment_files(dir, input.base).await?;
    }
    for ext in [INDEX_EXT, TIME_INDEX_EXT, LOG_EXT] {
        rename(&temp_path(dir, base, ext, SWAP_SUFFIX), &segment::segment_path(dir, base, ext)).await?;
    }
    sync_dir(dir).await?;
    slot.unpin();
    index_slot.unpin();
    Ok(())
}
