//! Segment roll: seal the active segment (indexes written, preallocation
//! truncated, synced) and start the next one at the next offset.

use super::*;

pub(super) async fn wait_not_rolling(sh: &Shared) {
    wait_while(sh, |st| st.rolling).await;
}

/// Waits until `busy` is false (re-checked at each change of the log).
pub(super) async fn wait_while(sh: &Shared, busy: impl Fn(&State) -> bool) {
    loop {
        let listen = sh.changed.listen();
        if !busy(&sh.st.borrow()) {
            return;
        }
        listen.await;
    }
}

pub(super) async fn roll_task(sh: Rc<Shared>) {
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
pub(super) async fn roll(sh: &Rc<Shared>) -> Result<(), LogError> {
    crate::fault::hit(crate::fault::FaultPoint::SegmentRoll, &sh.dir)
        .await
        .map_err(|e| LogError::io("rolling segment", &sh.dir, e))?;
    flush_inner(sh).await?;
    // The producer state as of the new segment's base: what recovery of the
    // new active segment replays on top of (`idempotence`).
    idempotence::write_snapshot(sh).await?;
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

/// Writes the active segment's `.index`/`.timeindex`, truncates its `.log` to
/// the logical end and syncs. Requires everything appended to be durable.
pub(super) async fn seal_active(sh: &Shared, file: &DmaFile) -> Result<SegmentSummary, LogError> {
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
pub(super) async fn new_active(sh: &Shared, base: u64) -> Result<Active, LogError> {
    // Stale indexes of an earlier failed roll must not describe the new file.
    for ext in [INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(&sh.dir, base, ext)).await?;
    }
    let path = segment::segment_path(&sh.dir, base, LOG_EXT);
    sh.files.admit();
    let file = counted_write_file(open_dma(&path, true).await?, &sh.files);
    let scan = Scan::start(base, sh.config.index_interval_bytes);
    let active = Active::new(base, path, file, ReaderSlot::new(&sh.files), scan, Vec::new());
    sync_dir(&sh.dir).await?;
    Ok(active)
}
