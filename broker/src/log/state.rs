//! The log state's own methods (writability, readers, roll and retention
//! predicates) and the active segment's constructor, with the small file
//! helpers the log's modules share.

use super::*;

impl State {
    pub(super) fn check_writable(&self, dir: &Path) -> Result<(), LogError> {
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
    pub(super) fn note_open_reader(&mut self, base: u64, index: bool, max: usize) {
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
    pub(super) fn write_file_idle(&self, config: &TopicConfig) -> bool {
        let a = &self.active;
        !self.rolling
            && self.writes_in_flight == 0
            && !self.sync_busy
            && self.unwritten.is_empty()
            && self.unsynced.is_empty()
            && a.end_pos == a.written_pos
            && (a.durable_pos == a.written_pos || config.flush == FlushPolicy::Never)
    }

    pub(super) fn start_offset(&self) -> u64 {
        self.closed.front().map_or(self.active.base, |s| s.base)
    }

    /// (offset, position in the active segment) readers may see.
    pub(super) fn high_watermark(&self, config: &TopicConfig) -> (u64, u64) {
        let a = &self.active;
        if config.flush == FlushPolicy::Always {
            (a.durable_next, a.durable_pos)
        } else {
            (a.written_next, a.written_pos)
        }
    }

    pub(super) fn needs_roll(&self, config: &TopicConfig, bytes: usize, headers: &[BatchHeader]) -> bool {
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
}

impl Active {
    /// Builds the active state for a segment whose first `scan.valid_bytes`
    /// bytes hold valid batches; `tail` is the partial last block.
    pub(super) fn new(
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
            durable_index: (scan.index.entries.len(), scan.index.times.len()),
            durable_max_ts: scan.index.timestamps(),
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

pub(super) async fn remove_if_exists(path: &Path) -> Result<(), LogError> {
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

pub(super) async fn remove_segment_files(dir: &Path, base: u64) -> Result<(), LogError> {
    for ext in [LOG_EXT, INDEX_EXT, TIME_INDEX_EXT] {
        remove_if_exists(&segment::segment_path(dir, base, ext)).await?;
    }
    Ok(())
}

pub(super) async fn sync_dir(dir: &Path) -> Result<(), LogError> {
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| LogError::glommio("opening directory", dir, e))?;
    d.sync().await.map_err(|e| LogError::glommio("syncing directory", dir, e))?;
    d.close().await.map_err(|e| LogError::glommio("closing directory", dir, e))?;
    Ok(())
}

/// Makes everything written so far to the filesystem holding `dir` durable
/// (`syncfs(2)`, which reports writeback errors since Linux 5.8): new logs'
/// directories, directory entries and small files, one call for a whole
/// wave of them instead of an fsync of each.
pub(super) async fn sync_filesystem(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = dir.to_path_buf();
    glommio::executor()
        .spawn_blocking(move || {
            let d = std::fs::File::open(&dir)?;
            // SAFETY: `d` is an open descriptor for the whole call.
            if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .await
}
