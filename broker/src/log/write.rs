//! The write path: copying appends into the fill buffer, aligned O_DIRECT
//! writes completed in issue order, `fdatasync`s, and the active segment's
//! write handle (reopened after the file budget closed it). See the module
//! docs of `log` for the positions and the group commit.

use super::*;
use crate::fault::FaultPoint;
use crate::metrics::Stage;
use gate::{let_through, GateFull};

impl State {
    /// Copies and stamps the batches into the fill buffer, assigns offsets
    /// and queues the caller's slot.
    pub(super) fn enqueue(
        &mut self,
        batches: &[u8],
        headers: &[BatchHeader],
        stamp: Stamp,
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
            if let Stamp::Leader(leader_epoch) = stamp {
                let mut head = [0u8; 16];
                head.copy_from_slice(&batches[at..at + 16]);
                batch::stamp(&mut head, offset, leader_epoch);
                a.fill_copy(start + at, &head);
            }
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
        let now = Instant::now();
        self.unwritten.push_back(Waiter {
            end_pos: a.end_pos,
            durable,
            slot: slot.clone(),
            enqueued: Some((now, offset - base_offset)),
            written_at: None,
        });
        let info = AppendInfo {
            base_offset: Offset(base_offset),
            last_offset: Offset(offset - 1),
            append_time_ms: now_ms(),
            log_start_offset: Offset(start_offset),
            enqueued_at: now,
            written_at: now,
        };
        (slot, info)
    }

    /// Notes the leader epochs of an append just enqueued at `base_offset`
    /// in the history; returns whether a new epoch started (the checkpoint
    /// must be rewritten).
    pub(super) fn note_epochs(&mut self, headers: &[BatchHeader], stamp: Stamp, base_offset: u64) -> bool {
        let mut offset = base_offset;
        let mut changed = false;
        for h in headers {
            let epoch = match stamp {
                Stamp::Leader(e) => e,
                Stamp::Replica => h.leader_epoch,
            };
            changed |= self.epochs.assign(epoch, offset);
            offset += u64::from(h.last_offset_delta) + 1;
        }
        changed
    }

    /// Takes the next aligned write: the first chunk when it is full and more
    /// follows, otherwise the last, partial chunk padded to the block size
    /// (its partial last block is carried over and rewritten next time),
    /// when the shard's gate has a place for it (`Err`: it has none; see
    /// `gate`).
    pub(super) fn take_write_job(&mut self, sh: &Shared) -> Result<Option<WriteJob>, GateFull> {
        if self.failed.is_some() {
            return Ok(None);
        }
        let block = sh.block;
        let a = &mut self.active;
        // `fill_len == 0`: everything is issued (a write in flight ended on a
        // block boundary and carried nothing over).
        if a.unwritten_batches.is_empty() || a.fill_len == 0 || self.writes_in_flight >= WRITES_IN_FLIGHT_MAX
        {
            return Ok(None);
        }
        // A write may not touch a block an earlier write still in flight
        // owns: with one in flight, only a write that starts where it ends.
        if self.writes_in_flight > 0 && a.fill_start < self.issued_end {
            return Ok(None);
        }
        let pos = a.fill_start;
        // Only a write that goes straight to the device waits at the gate
        // (see `gate`): one that must first open its file or preallocate
        // would hold a place through that too.
        let small = a.fill_len < CHUNK_BYTES;
        let ready =
            a.file.is_some() && (!sh.direct_io || pos + align_up(a.fill_len as u64, block) <= a.allocated);
        let place = if small && ready { Some(sh.gate.try_take().ok_or(GateFull)?) } else { None };
        let (buf, len, data_len) = if a.fill_len >= CHUNK_BYTES {
            let buf = a.fill.pop_front().expect("a full chunk");
            a.fill_start += CHUNK_BYTES as u64;
            a.fill_len -= CHUNK_BYTES;
            (WriteBuf::whole(buf), CHUNK_BYTES, CHUNK_BYTES)
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
            // A write that starts by rewriting the partial block an earlier
            // write ended in goes out as two: that block, and the rest. ext4
            // issues an O_DIRECT write without blocking (no io_uring worker,
            // no thread hop) only when one extent maps its whole range, and
            // the rewritten block is written while the rest is still
            // preallocated (unwritten).
            let head = (a.written_pos > pos && len > block as usize).then_some(block as usize);
            let buf = WriteBuf::copied(&front.as_bytes()[..data_len], len, head);
            let keep_from = align_down(data_len as u64, block) as usize;
            let carry = data_len - keep_from;
            front.as_bytes_mut().copy_within(keep_from..data_len, 0);
            a.fill_start += keep_from as u64;
            a.fill_len = carry;
            (buf, len, data_len)
        };
        let write_end = pos + len as u64;
        // On tmpfs (no direct I/O) nothing is preallocated: there are no
        // extents to keep contiguous, and fallocate there allocates and
        // zeroes every page up front (80 ms for a 256 MiB step on these
        // machines) while the write behind it waits. Measured at 300 k
        // records/s of 1 KB: publish p99 1.6 ms without, 67-100 ms with
        // 32-256 MiB steps.
        let prealloc_to = (sh.direct_io && write_end > a.allocated).then(|| {
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
        Ok(Some(WriteJob {
            base: a.base,
            file: a.file.clone(),
            path: a.path.clone(),
            buf,
            pos,
            data_end: pos + data_len as u64,
            prealloc_to,
            seq,
            generation: self.write_gen,
            issued_at: Instant::now(),
            place,
        }))
    }

    pub(super) fn complete_write(&mut self, sh: &Shared, job: WriteJob) {
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
        if sh.hot.borrow().enabled() {
            a.stage_hot(&sh.hot, before, &job);
        }
        if a.written_pos != before {
            a.tail_start = align_down(a.written_pos, block);
            assert!(a.tail_start >= job.pos, "the new partial block is in this write");
            a.tail.clear();
            for part in job.buf.slices((a.tail_start - job.pos) as usize, (a.written_pos - job.pos) as usize)
            {
                a.tail.extend_from_slice(part);
            }
        }
        let len = job.buf.len() as u64;
        self.stats.writes += 1;
        self.stats.bytes_written += len;
        sh.io_stats.writes.set(sh.io_stats.writes.get() + 1);
        sh.io_stats.write_bytes.set(sh.io_stats.write_bytes.get() + len);
        self.bytes_since_sync += a.written_pos - before;
        // A whole chunk (a full one, or a partial one padded to its size) is kept for reuse.
        if a.spare.len() < SPARE_CHUNKS_MAX {
            if let Some(buf) = job.buf.into_chunk() {
                a.spare.push(buf);
            }
        }
        let written = a.written_pos;
        let now = Instant::now();
        while self.unwritten.front().is_some_and(|w| w.end_pos <= written) {
            let mut w = self.unwritten.pop_front().expect("front exists");
            if let Some((enqueued_at, records)) = w.enqueued {
                let stages = &sh.io_stats.stages;
                stages.record(
                    Stage::WriteQueue,
                    job.issued_at.saturating_duration_since(enqueued_at),
                    records,
                );
                stages.record(Stage::Write, now.saturating_duration_since(job.issued_at), records);
            }
            if w.durable {
                w.written_at = Some(now);
                self.unsynced.push_back(w);
            } else {
                w.slot.resolve(Ok(now));
            }
        }
    }

    /// A write failed: forget everything not yet written and fail its appends.
    pub(super) fn fail_write(&mut self, sh: &Shared, job: WriteJob, err: LogError) {
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
        let rolled_back_from = a.next_offset;
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
        self.producers.truncate_from(rolled_back_from);
        self.epochs.truncate_from(rolled_back_from);
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
    pub(super) fn poison(&mut self, dir: &Path, reason: String) {
        tracing::error!(dir = %dir.display(), %reason, "log failed; it takes no more appends");
        let e = LogError::Failed { dir: dir.to_path_buf(), reason: reason.clone() };
        self.failed.get_or_insert(reason);
        for w in self.unwritten.drain(..).chain(self.unsynced.drain(..)) {
            w.slot.resolve(Err(e.duplicate()));
        }
    }

    pub(super) fn sync_wanted(&self, config: &TopicConfig) -> bool {
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
pub(super) fn kick_write(sh: &Rc<Shared>) {
    loop {
        let job = {
            let mut st = sh.st.borrow_mut();
            if st.active.end_pos <= st.active.written_pos {
                return;
            }
            match st.take_write_job(sh) {
                Ok(job) => job,
                Err(GateFull) => {
                    if !st.gate_queued {
                        st.gate_queued = true;
                        sh.gate.wait(sh);
                    }
                    None
                }
            }
        };
        match job {
            Some(job) => {
                glommio::spawn_local(write_task(sh.clone(), job)).detach();
            }
            None => return,
        }
    }
}

pub(super) fn kick_sync(sh: &Rc<Shared>) {
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
pub(super) async fn write_task(sh: Rc<Shared>, mut job: WriteJob) {
    let result = run_write(&sh, &job).await;
    let place = job.place.take();
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
    if let Some(place) = place {
        drop(place);
        let_through(&sh.gate);
    }
    kick_sync(&sh);
}

pub(super) async fn run_write(sh: &Rc<Shared>, job: &WriteJob) -> Result<(), LogError> {
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
    crate::fault::hit(FaultPoint::AppendWrite, &job.path)
        .await
        .map_err(|e| LogError::io("writing segment", &job.path, e))?;
    let len = job.buf.len();
    let n = job
        .buf
        .write(&file, job.pos)
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
pub(super) async fn sync_task(sh: Rc<Shared>) {
    loop {
        let (base, path, pos, next, index, stamps) = {
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
            // The index covers exactly the written batches: what it holds
            // now is what `[0, pos)` holds, for the recovery point.
            let index = (a.index.entries.len(), a.index.times.len());
            (a.base, a.path.clone(), a.written_pos, a.written_next, index, a.index.timestamps())
        };
        let result = match write_file(&sh, base).await {
            Ok(file) => {
                let started = std::time::Instant::now();
                let synced = match crate::fault::hit(FaultPoint::Fdatasync, &path).await {
                    Ok(()) => file.fdatasync().await.map_err(|e| LogError::glommio("fdatasync", &path, e)),
                    Err(e) => Err(LogError::io("fdatasync", &path, e)),
                };
                sh.io_stats.fdatasync.record(started.elapsed());
                synced
            }
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
                    a.durable_index = index;
                    a.durable_max_ts = stamps;
                    let now = Instant::now();
                    while st.unsynced.front().is_some_and(|w| w.end_pos <= pos) {
                        let w = st.unsynced.pop_front().expect("front exists");
                        w.slot.resolve(Ok(w.written_at.unwrap_or(now)));
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
pub(super) async fn flush_timer(weak: Weak<Shared>, every: Duration) {
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
pub(super) async fn flush_inner(sh: &Rc<Shared>) -> Result<(), LogError> {
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
        let w = Waiter {
            end_pos: a.end_pos,
            durable: true,
            slot: slot.clone(),
            enqueued: None,
            written_at: None,
        };
        if a.end_pos <= a.written_pos {
            st.unsynced.push_back(w);
        } else {
            st.unwritten.push_back(w);
        }
        slot
    };
    kick_write(sh);
    kick_sync(sh);
    slot.wait().await.map(|_| ())
}

/// Closes a write handle if this is its last user (else the last one's drop does).
pub(super) async fn close_dma(file: Rc<WriteFile>, path: &Path) -> Result<(), LogError> {
    if let Ok(f) = Rc::try_unwrap(file) {
        f.file.close().await.map_err(|e| LogError::glommio("closing segment", path, e))?;
    }
    Ok(())
}

/// The active segment's write handle: the open one, or reopened (counted in
/// the shard's file budget) after the budget closed it.
pub(super) async fn write_file(sh: &Rc<Shared>, base: u64) -> Result<Rc<WriteFile>, LogError> {
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
pub(super) fn touch_write_file(sh: &Rc<Shared>) {
    sh.files.touch(&sh.write_tick, Rc::downgrade(sh) as std::rc::Weak<dyn Evict>);
}

pub(super) fn counted_write_file(file: DmaFile, files: &Rc<FileBudget>) -> Rc<WriteFile> {
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

pub(super) async fn open_dma(path: &Path, truncate: bool) -> Result<DmaFile, LogError> {
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
    /// Hands the whole batches this write completed (`[before, written_pos)`)
    /// to the hot tail window, directly from the write buffer when they all
    /// lie in it, else through `hot_staged` (a batch that spans writes).
    pub(super) fn stage_hot(&mut self, hot: &RefCell<hot::HotWindow>, before: u64, job: &WriteJob) {
        let bytes = |from: u64, to: u64| job.buf.slices((from - job.pos) as usize, (to - job.pos) as usize);
        let staged_end = before + self.hot_staged.len() as u64;
        assert!(job.pos <= staged_end, "writes are contiguous");
        if self.hot_staged.is_empty() {
            if self.written_pos > before {
                hot.borrow_mut().push_parts(self.base, before, bytes(before, self.written_pos));
            }
            if job.data_end > self.written_pos {
                for part in bytes(self.written_pos, job.data_end) {
                    self.hot_staged.extend_from_slice(part);
                }
            }
        } else {
            if job.data_end > staged_end {
                for part in bytes(staged_end, job.data_end) {
                    self.hot_staged.extend_from_slice(part);
                }
            }
            if self.written_pos > before {
                let n = (self.written_pos - before) as usize;
                hot.borrow_mut().push(self.base, before, &self.hot_staged[..n]);
                self.hot_staged.drain(..n);
            }
        }
    }

    /// A chunk for the fill buffer, reused when possible.
    pub(super) fn chunk(&mut self) -> DmaBuffer {
        self.spare.pop().unwrap_or_else(|| glommio::allocate_dma_buffer(CHUNK_BYTES))
    }

    /// Copies `bytes` into the fill buffer at fill offset `at`, adding chunks.
    pub(super) fn fill_copy(&mut self, mut at: usize, mut bytes: &[u8]) {
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

/// The bytes of one O_DIRECT write: one aligned buffer, or (`head`) its first
/// block apart from the rest, written as two writes in flight together.
pub(super) struct WriteBuf {
    head: Option<Rc<DmaBuffer>>,
    body: Rc<DmaBuffer>,
}

impl WriteBuf {
    pub(super) fn whole(buf: DmaBuffer) -> Self {
        Self { head: None, body: Rc::new(buf) }
    }

    /// `data` copied into `len` aligned bytes (zero padded); the first
    /// `head` bytes in a buffer of their own when given.
    pub(super) fn copied(data: &[u8], len: usize, head: Option<usize>) -> Self {
        let fill = |data: &[u8], len: usize| {
            let mut buf = glommio::allocate_dma_buffer(len);
            let n = data.len().min(len);
            buf.as_bytes_mut()[..n].copy_from_slice(&data[..n]);
            buf.as_bytes_mut()[n..].fill(0);
            Rc::new(buf)
        };
        match head {
            Some(h) => {
                let (front, rest) = data.split_at(h.min(data.len()));
                Self { head: Some(fill(front, h)), body: fill(rest, len - h) }
            }
            None => Self { head: None, body: fill(data, len) },
        }
    }

    pub(super) fn len(&self) -> usize {
        self.head.as_ref().map_or(0, |h| h.len()) + self.body.len()
    }

    /// Bytes `[from, to)` of the write, as up to two slices in order.
    pub(super) fn slices(&self, from: usize, to: usize) -> [&[u8]; 2] {
        let head = self.head.as_ref().map_or(&[][..], |h| h.as_bytes());
        let h = head.len();
        let body = self.body.as_bytes();
        [&head[from.min(h)..to.min(h)], &body[from.max(h) - h..to.max(h) - h]]
    }

    /// Writes it at `pos`; the two parts of a split write are in flight
    /// together. The bytes written (all, unless the disk is full).
    pub(super) async fn write(&self, file: &DmaFile, pos: u64) -> glommio::Result<usize, ()> {
        match &self.head {
            None => file.write_rc_at(self.body.clone(), pos).await,
            Some(head) => {
                let (h, b) = futures_lite::future::zip(
                    file.write_rc_at(head.clone(), pos),
                    file.write_rc_at(self.body.clone(), pos + head.len() as u64),
                )
                .await;
                let h = h?;
                // A short first part leaves a hole: count only what is contiguous.
                Ok(if h < head.len() { h } else { h + b? })
            }
        }
    }

    /// The buffer back for reuse as a fill chunk, when it is a whole one.
    pub(super) fn into_chunk(self) -> Option<DmaBuffer> {
        if self.head.is_some() || self.body.len() != CHUNK_BYTES {
            return None;
        }
        Rc::try_unwrap(self.body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_write_buffer_reads_as_one() {
        let ex = glommio::LocalExecutorBuilder::default().make().expect("executor");
        ex.run(async {
            let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
            let whole = WriteBuf::copied(&data, 12_288, None);
            let split = WriteBuf::copied(&data, 12_288, Some(4096));
            assert!(split.head.is_some() && whole.head.is_none());
            assert_eq!((whole.len(), split.len()), (12_288, 12_288));
            let joined = |b: &WriteBuf, from, to| b.slices(from, to).concat();
            for (from, to) in
                [(0, 12_288), (0, 4096), (4096, 4096), (100, 4096), (4000, 4200), (5000, 10_000)]
            {
                assert_eq!(joined(&split, from, to), joined(&whole, from, to), "{from}..{to}");
            }
            assert_eq!(joined(&split, 0, 10_000), data);
            assert!(joined(&split, 10_000, 12_288).iter().all(|&b| b == 0), "padding is zeros");
            // A head longer than the data: the rest is all padding.
            let short = WriteBuf::copied(&data[..100], 8192, Some(4096));
            assert_eq!(&joined(&short, 0, 100)[..], &data[..100]);
            assert!(joined(&short, 100, 8192).iter().all(|&b| b == 0));
            assert!(split.into_chunk().is_none(), "a split buffer is not a fill chunk");
        });
    }
}
