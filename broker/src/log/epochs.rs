//! The leader-epoch history of a partition: for each leader epoch that
//! wrote to the log, the first offset it wrote. A replica that becomes a
//! follower asks the new leader where its own last epoch ends there
//! (`OffsetsForLeaderEpoch`) and truncates to that offset before fetching;
//! this is what keeps replicas identical after any sequence of failovers.
//!
//! Kept in `leader-epoch-checkpoint` in the partition directory, Kafka's
//! text format (`0\n<count>\n<epoch> <start offset>\n...`), rewritten
//! (temporary file, synced, renamed) whenever an entry is added or
//! truncation removes one. Invariants: epochs and start offsets both
//! strictly grow along the list; no entry starts at or after the log end
//! (open and truncation drop them). A lost last entry (a crash before the
//! rewrite) only makes a follower truncate further than it had to: what it
//! removes it fetches again.

use super::*;

pub(super) const EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
const EPOCH_CHECKPOINT_TMP: &str = "leader-epoch-checkpoint.tmp";
const FORMAT_VERSION: u32 = 0;

/// The history: `(epoch, start offset)`, both strictly increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochs {
    entries: Vec<(i32, u64)>,
}

impl LeaderEpochs {
    /// Notes a batch of `epoch` written at `offset`. Returns whether this
    /// started a new epoch (the history changed). Batches of an epoch older
    /// than the latest (possible only from a leader that has not learnt of
    /// its successor) are not recorded.
    pub fn assign(&mut self, epoch: i32, offset: u64) -> bool {
        if epoch < 0 {
            return false;
        }
        match self.entries.last() {
            Some(&(last, _)) if epoch <= last => false,
            _ => {
                self.entries.push((epoch, offset));
                true
            }
        }
    }

    /// The latest epoch that wrote to the log.
    #[must_use]
    pub fn latest(&self) -> Option<i32> {
        self.entries.last().map(|e| e.0)
    }

    /// Kafka's `OffsetsForLeaderEpoch` answer for `epoch` on a log ending at
    /// `log_end`: the largest epoch at most `epoch` this log knows, and
    /// where it ends (the start of the next epoch, or the log end for the
    /// latest). `None` when every known epoch is later (or none is known):
    /// the asker has nothing in common with this log by epochs.
    #[must_use]
    pub fn end_offset_for(&self, epoch: i32, log_end: u64) -> Option<(i32, u64)> {
        let i = self.entries.partition_point(|&(e, _)| e <= epoch);
        let found = self.entries.get(i.checked_sub(1)?)?.0;
        let end = self.entries.get(i).map_or(log_end, |&(_, start)| start);
        Some((found, end))
    }

    /// Forgets the epochs that start at or after `offset` (a truncation).
    /// Returns whether anything was removed.
    pub fn truncate_from(&mut self, offset: u64) -> bool {
        let keep = self.entries.partition_point(|&(_, start)| start < offset);
        let changed = keep < self.entries.len();
        self.entries.truncate(keep);
        changed
    }

    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!("{FORMAT_VERSION}\n{}\n", self.entries.len());
        for (epoch, start) in &self.entries {
            out.push_str(&format!("{epoch} {start}\n"));
        }
        out.into_bytes()
    }

    /// Parses a checkpoint; `None` if it is not one (ordering included).
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<LeaderEpochs> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()?.trim().parse::<u32>().ok()? != FORMAT_VERSION {
            return None;
        }
        let count: usize = lines.next()?.trim().parse().ok()?;
        let mut entries = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let mut fields = lines.next()?.split_whitespace();
            let epoch: i32 = fields.next()?.parse().ok()?;
            let start: u64 = fields.next()?.parse().ok()?;
            if fields.next().is_some() || epoch < 0 {
                return None;
            }
            if entries.last().is_some_and(|&(e, s)| epoch <= e || start <= s) {
                return None;
            }
            entries.push((epoch, start));
        }
        Some(LeaderEpochs { entries })
    }

    /// The history at open: the checkpoint (if readable), without entries
    /// at or past the recovered log end `end`.
    pub(super) fn load(dir: &Path, end: u64) -> LeaderEpochs {
        let path = dir.join(EPOCH_CHECKPOINT_FILE);
        // One-off small read at open, like the producer snapshot.
        let mut epochs = match std::fs::read(&path) {
            Ok(bytes) => LeaderEpochs::decode(&bytes).unwrap_or_else(|| {
                tracing::warn!(path = %path.display(), "ignoring an unreadable leader-epoch checkpoint");
                LeaderEpochs::default()
            }),
            Err(_) => LeaderEpochs::default(),
        };
        epochs.truncate_from(end);
        epochs
    }
}

/// Writes the history as it is now (callers: a new epoch or a truncation).
/// Concurrent calls are serialised by `Shared::epochs_writing`; the last
/// writer writes the latest state.
pub(super) async fn write_checkpoint(sh: &Shared) -> Result<(), LogError> {
    while sh.epochs_writing.replace(true) {
        sh.changed.listen().await;
    }
    let bytes = sh.st.borrow().epochs.encode();
    let tmp = sh.dir.join(EPOCH_CHECKPOINT_TMP);
    let path = sh.dir.join(EPOCH_CHECKPOINT_FILE);
    let result = async {
        segment::write_file_durably(&tmp, bytes).await?;
        glommio::io::rename(&tmp, &path).await.map_err(|e| LogError::glommio("renaming", &tmp, e))?;
        sync_dir(&sh.dir).await
    }
    .await;
    sh.epochs_writing.set(false);
    sh.changed.notify_all();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assign_keeps_first_offset_of_each_newer_epoch() {
        let mut e = LeaderEpochs::default();
        assert!(e.assign(0, 0));
        assert!(!e.assign(0, 5));
        assert!(e.assign(2, 10));
        assert!(!e.assign(1, 12), "an older epoch never goes after a newer one");
        assert_eq!(e.entries, vec![(0, 0), (2, 10)]);
        assert_eq!(e.latest(), Some(2));
    }

    #[test]
    fn end_offsets_as_kafka_answers_them() {
        let mut e = LeaderEpochs::default();
        e.assign(1, 0);
        e.assign(3, 100);
        e.assign(4, 250);
        assert_eq!(e.end_offset_for(0, 300), None, "before the first known epoch");
        assert_eq!(e.end_offset_for(1, 300), Some((1, 100)));
        assert_eq!(e.end_offset_for(2, 300), Some((1, 100)), "an epoch this log never had: its predecessor");
        assert_eq!(e.end_offset_for(3, 300), Some((3, 250)));
        assert_eq!(e.end_offset_for(4, 300), Some((4, 300)), "the latest ends at the log end");
        assert_eq!(e.end_offset_for(9, 300), Some((4, 300)));
        assert_eq!(LeaderEpochs::default().end_offset_for(5, 0), None);
    }

    #[test]
    fn truncation_drops_epochs_starting_at_or_after() {
        let mut e = LeaderEpochs::default();
        e.assign(1, 0);
        e.assign(3, 100);
        assert!(!e.truncate_from(150));
        assert!(e.truncate_from(100));
        assert_eq!(e.entries, vec![(1, 0)]);
        assert!(e.truncate_from(0));
        assert_eq!(e.latest(), None);
    }

    #[test]
    fn checkpoint_round_trips_and_rejects_junk() {
        let mut e = LeaderEpochs::default();
        e.assign(0, 0);
        e.assign(7, 42);
        let bytes = e.encode();
        assert_eq!(bytes, b"0\n2\n0 0\n7 42\n");
        assert_eq!(LeaderEpochs::decode(&bytes), Some(e));
        for junk in
            [&b""[..], b"1\n0\n", b"0\n2\n0 0\n", b"0\n2\n3 10\n2 20\n", b"0\n1\n-1 0\n", b"0\n1\nx y\n"]
        {
            assert_eq!(LeaderEpochs::decode(junk), None, "{:?}", String::from_utf8_lossy(junk));
        }
    }
}
