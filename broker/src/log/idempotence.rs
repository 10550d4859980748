//! The log's side of idempotent producing: the sequence check where an
//! append is assigned its offsets, the producer-state snapshot written at
//! each roll and clean close, and its rebuild at open. The sequence rules
//! themselves are in `producers`.
//!
//! Invariants:
//! - the check and the recording of a batch happen in one borrow of the
//!   state, in admission order, together with the offset assignment
//!   (`enqueue`): no other append can slip between them;
//! - the state never names offsets the log does not hold: a rolled-back
//!   write (`fail_write`) and `truncate_to` forget what they removed;
//! - a snapshot holds the state as of an offset `S` (every batch below `S`,
//!   none at or after it); at open the batches recovery scanned at or after
//!   `S` are replayed on top of it. A clean close writes `S` = the log end,
//!   a roll `S` = the new segment's base, so the batches to replay are
//!   always in the active segment, which an unclean open scans anyway.

use super::producers::{seq_last, BatchSeq, ProducerStates, SeqError, Verdict};
use super::*;

/// The snapshot's file name in the partition directory.
pub(super) const PRODUCER_SNAPSHOT_FILE: &str = "producers.snapshot";
const SNAPSHOT_TMP_FILE: &str = "producers.snapshot.tmp";

/// A retried batch already in the log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Duplicate {
    pub base_offset: u64,
    pub last_offset: u64,
}

impl State {
    /// Checks the append's idempotent batches. A single batch may be a
    /// retry (answered as a duplicate); several batches in one append (the
    /// native client coalesces a partition's batches) must all be new and in
    /// sequence (`ProducerStates::check_run`).
    pub(super) fn check_sequences(&self, headers: &[BatchHeader]) -> Result<Option<Duplicate>, LogError> {
        if let Some(h) = headers.iter().find(|h| h.producer_id >= 0 && h.base_sequence < 0) {
            return Err(SeqError::NegativeSequence {
                producer_id: h.producer_id,
                first_seq: h.base_sequence,
            }
            .into());
        }
        let seq = |h: &BatchHeader| {
            (h.producer_id, h.producer_epoch, h.base_sequence, seq_last(h.base_sequence, h.record_count))
        };
        match headers {
            [h] if h.producer_id >= 0 => {
                let (producer_id, epoch, first, last) = seq(h);
                match self.producers.check(producer_id, epoch, first, last)? {
                    Verdict::Append => Ok(None),
                    Verdict::Duplicate { base_offset } => Ok(Some(Duplicate {
                        base_offset,
                        last_offset: base_offset + u64::from(h.last_offset_delta),
                    })),
                }
            }
            _ => {
                let run: Vec<_> = headers.iter().filter(|h| h.producer_id >= 0).map(seq).collect();
                if !run.is_empty() {
                    self.producers.check_run(&run)?;
                }
                Ok(None)
            }
        }
    }

    /// Records the idempotent batches of an append just enqueued at `base_offset`.
    pub(super) fn record_sequences(&mut self, headers: &[BatchHeader], base_offset: u64) {
        let now = now_ms();
        let mut offset = base_offset;
        for h in headers {
            let stamped = BatchHeader { base_offset: offset, ..*h };
            if let Some(seq) = BatchSeq::of(&stamped) {
                self.producers.record(h.producer_id, h.producer_epoch, seq, now);
            }
            offset = stamped.next_offset();
        }
    }
}

impl Log {
    /// A retried idempotent batch: answered with the offsets it was first
    /// given, once they are as safe as a new append's would be (below the
    /// high watermark), without appending it again.
    pub(super) async fn answer_duplicate(&self, dup: Duplicate) -> Result<AppendInfo, LogError> {
        let sh = &self.sh;
        loop {
            let listen = sh.changed.listen();
            {
                let st = sh.st.borrow();
                st.check_writable(&sh.dir)?;
                if st.high_watermark(&sh.config).0 > dup.last_offset {
                    return Ok(AppendInfo {
                        base_offset: Offset(dup.base_offset),
                        last_offset: Offset(dup.last_offset),
                        append_time_ms: now_ms(),
                        log_start_offset: Offset(st.start_offset()),
                        enqueued_at: Instant::now(),
                        written_at: Instant::now(),
                    });
                }
            }
            kick_write(sh);
            listen.await;
        }
    }
}

/// Writes the producer state as of the log's end, replacing the last
/// snapshot (a temporary file, synced, renamed, directory synced). Callers
/// hold appends back (a roll or a close in progress).
pub(super) async fn write_snapshot(sh: &Shared) -> Result<(), LogError> {
    let bytes = {
        let mut st = sh.st.borrow_mut();
        st.producers.expire(now_ms(), producers::PRODUCER_EXPIRATION_MS);
        let end = st.active.next_offset;
        st.producers.encode_snapshot(end)
    };
    let tmp = sh.dir.join(SNAPSHOT_TMP_FILE);
    let path = sh.dir.join(PRODUCER_SNAPSHOT_FILE);
    segment::write_file_durably(&tmp, bytes).await?;
    glommio::io::rename(&tmp, &path).await.map_err(|e| LogError::glommio("renaming", &tmp, e))?;
    sync_dir(&sh.dir).await
}

/// Rebuilds the producer state at open: the snapshot (if any, and readable)
/// plus the idempotent batches `scan` found at or after its offset; nothing
/// past `end` (the recovered log end) is kept.
/// `snapshot` replaces the file's: a recovery point's, as of where the scan
/// resumed (`recovery_point`).
pub(super) fn rebuild(dir: &Path, scan: &Scan, end: u64, snapshot: Option<Vec<u8>>) -> ProducerStates {
    let path = dir.join(PRODUCER_SNAPSHOT_FILE);
    // One-off small read at open, like the clean-shutdown marker.
    let (mut states, from) = match snapshot.map_or_else(|| std::fs::read(&path), Ok) {
        Ok(bytes) => match ProducerStates::decode_snapshot(&bytes) {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::warn!(
                    path = %path.display(), error = %e,
                    "ignoring an unreadable producer snapshot: retries of batches written before it \
                     may be appended twice"
                );
                (ProducerStates::default(), 0)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (ProducerStates::default(), 0),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the producer snapshot; ignoring it");
            (ProducerStates::default(), 0)
        }
    };
    states.truncate_from(end);
    let now = now_ms();
    for (producer_id, epoch, seq) in scan.producers.iter().filter(|(_, _, s)| s.base_offset >= from) {
        states.replay(*producer_id, *epoch, *seq, now);
    }
    states
}

impl State {
    /// After `truncate_to(offset)`: forgets what is gone and replays what the
    /// truncation's scan read of the segment it cut (`scan`, up to `offset`),
    /// so the batches just before the cut are remembered again.
    pub(super) fn producers_truncated(&mut self, offset: u64, scan: &[(i64, i16, BatchSeq)]) {
        self.producers.truncate_from(offset);
        let now = now_ms();
        for (producer_id, epoch, seq) in scan {
            self.producers.replay(*producer_id, *epoch, *seq, now);
        }
    }
}
