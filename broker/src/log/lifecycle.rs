//! Whole-log and whole-segment operations: retention, clean close, and
//! deletion of a partition's files.

use super::*;

impl Log {
    /// Deletes whole sealed segments beyond `retention.bytes` or older than
    /// `retention.ms` (by their largest timestamp). Never the active one.
    pub async fn enforce_retention(&self, now_ms: i64) -> Result<RetentionOutcome, LogError> {
        let sh = &self.sh;
        let expired = sh.st.borrow_mut().producers.expire(now_ms, producers::PRODUCER_EXPIRATION_MS);
        if expired > 0 {
            tracing::debug!(dir = %sh.dir.display(), expired, "forgot idle idempotent producers");
        }
        if !sh.config.cleanup_policy.deletes() {
            return Ok(RetentionOutcome::default());
        }
        let victims = {
            let mut st = sh.st.borrow_mut();
            if st.compacting {
                return Ok(RetentionOutcome::default());
            }
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

    /// Flushes, seals the active segment's indexes, truncates preallocation
    /// and writes the clean-shutdown marker. Appends fail afterwards.
    pub async fn close(&self) -> Result<(), LogError> {
        let sh = &self.sh;
        if sh.st.borrow().shut {
            return Ok(());
        }
        wait_not_rolling(sh).await;
        sh.st.borrow_mut().shut = true;
        // A running compaction pass stops after its current group.
        compact::wait_not_compacting(sh).await;
        recovery_point::wait_idle(sh).await;
        flush_inner(sh).await?;
        let (base, end_pos, next) = {
            let st = sh.st.borrow();
            let a = &st.active;
            (a.base, a.end_pos, a.next_offset)
        };
        let file = write_file(sh, base).await?;
        seal_active(sh, &file).await?;
        idempotence::write_snapshot(sh).await?;
        let marker = CleanMarker { next_offset: next, active_base: base, active_bytes: end_pos };
        let json = serde_json::to_vec(&marker).expect("marker serializes");
        segment::write_file_durably(&sh.dir.join(CLEAN_SHUTDOWN_FILE), json).await?;
        sync_dir(&sh.dir).await?;
        sh.changed.notify_all();
        tracing::debug!(dir = %sh.dir.display(), next_offset = next, "log closed cleanly");
        Ok(())
    }

    /// Removes all files and the directory (topic deletion).
    pub async fn delete(&self) -> Result<(), LogError> {
        let sh = &self.sh;
        wait_not_rolling(sh).await;
        sh.st.borrow_mut().shut = true;
        compact::wait_not_compacting(sh).await;
        recovery_point::wait_idle(sh).await;
        // Let in-flight writes finish so no task touches the files afterwards;
        // their errors do not matter any more.
        if let Err(e) = flush_inner(sh).await {
            tracing::debug!(dir = %sh.dir.display(), error = %e, "flush before delete failed");
        }
        // Glommio has no readdir or rmdir: list and remove the directory on
        // its blocking thread pool, off the shard's reactor (a deletion or a
        // replica moving away runs while the shard serves).
        let listed: std::io::Result<Vec<std::path::PathBuf>> = {
            let dir = sh.dir.clone();
            glommio::executor()
                .spawn_blocking(move || std::fs::read_dir(&dir)?.map(|e| e.map(|e| e.path())).collect())
                .await
        };
        let paths = listed.map_err(|e| LogError::io("listing", &sh.dir, e))?;
        for path in paths {
            glommio::io::remove(&path).await.map_err(|e| LogError::glommio("removing", &path, e))?;
        }
        let dir = sh.dir.clone();
        glommio::executor()
            .spawn_blocking(move || std::fs::remove_dir(&dir))
            .await
            .map_err(|e| LogError::io("removing directory", &sh.dir, e))?;
        Ok(())
    }
}
