//! Per-partition idempotent-producer state: pure sequence-window logic, no
//! I/O, no runtime (so it is unit-tested without a shard).
//!
//! For each producer id the partition keeps its epoch and the last
//! [`BATCHES_CACHED_MAX`] appended batches (first/last sequence, base/last
//! offset), as Kafka's ProducerStateManager does. `Log::append` checks each
//! idempotent batch (producer id >= 0) where offsets are assigned, in
//! admission order, and records it in the same step; a rolled-back write and
//! `truncate_to` forget what they removed ([`ProducerStates::truncate_from`]).
//! The state is snapshotted at each segment roll and at a clean close
//! ([`ProducerStates::encode_snapshot`]) and rebuilt at open from the
//! snapshot plus the batches recovery scans after it.
//!
//! Rules ([`ProducerStates::check`]):
//! - epoch older than known: [`SeqError::InvalidEpoch`] (Kafka 47);
//! - same epoch, sequence range equal to a cached batch: duplicate, answered
//!   with the original base offset, not appended;
//! - same epoch, first sequence not last + 1 (wrapping at `i32::MAX` to 0):
//!   [`SeqError::OutOfOrder`] (Kafka 45);
//! - a newer epoch must start at sequence 0, else `OutOfOrder`;
//! - a producer id the partition does not know (new, expired, or its
//!   batches removed by retention or truncation) may start at any sequence,
//!   as in Kafka since 2.5 (KIP-360): its state is rebuilt from there.
//!
//! A producer not seen for [`PRODUCER_EXPIRATION_MS`] is forgotten
//! ([`ProducerStates::expire`], Kafka's `producer.id.expiration.ms`).

use shardlog_schema::batch::{BatchHeader, IDEMPOTENT_BATCHES_REMEMBERED};
use std::collections::{HashMap, VecDeque};

/// Batches remembered per producer: the protocol's
/// [`IDEMPOTENT_BATCHES_REMEMBERED`] (Kafka keeps 5). Shardlog's client
/// sends no batch further than that past its partition's oldest unfinished
/// one, so each retry it makes is of a batch remembered here. A retry of
/// one older than the cache (another client's) is refused as out of order,
/// never stored twice.
pub const BATCHES_CACHED_MAX: usize = IDEMPOTENT_BATCHES_REMEMBERED;
/// A producer unseen this long is forgotten (Kafka's default
/// `producer.id.expiration.ms`, one day).
pub const PRODUCER_EXPIRATION_MS: i64 = 86_400_000;
const SNAPSHOT_VERSION: u64 = 1;

/// One appended batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchSeq {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

impl BatchSeq {
    /// The sequences and offsets of a stored (offset-stamped) idempotent
    /// batch; `None` when it has no producer id or a negative sequence.
    #[must_use]
    pub fn of(h: &BatchHeader) -> Option<BatchSeq> {
        (h.producer_id >= 0 && h.base_sequence >= 0 && h.record_count > 0).then(|| BatchSeq {
            first_seq: h.base_sequence,
            last_seq: seq_last(h.base_sequence, h.record_count),
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
        })
    }
}

#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Entry {
    epoch: i16,
    batches: VecDeque<BatchSeq>,
    /// When its last batch was appended (ms since the epoch).
    last_ms: i64,
}

/// The snapshot file's contents: the state as of `offset` (every batch
/// below it counted, none at or after it).
#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    version: u64,
    offset: u64,
    producers: Vec<(i64, Entry)>,
}

/// What to do with a batch that passed the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it, then [`ProducerStates::record`] it.
    Append,
    /// Already appended at this base offset: answer success, do not append.
    Duplicate { base_offset: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SeqError {
    #[error("producer {producer_id}: epoch {epoch} older than {known}")]
    InvalidEpoch { producer_id: i64, epoch: i16, known: i16 },
    #[error("producer {producer_id}: sequence {first_seq}, expected {expected}")]
    OutOfOrder { producer_id: i64, first_seq: i32, expected: i32 },
    #[error("producer {producer_id}: negative base sequence {first_seq}")]
    NegativeSequence { producer_id: i64, first_seq: i32 },
    #[error(
        "producer {producer_id}: sequence {first_seq} is already in the log; a retried batch must be \
         sent on its own"
    )]
    RetryNotAlone { producer_id: i64, first_seq: i32 },
}

/// Next sequence after `seq` (wraps at `i32::MAX` to 0).
pub fn seq_next(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

/// Last sequence of a batch of `records` records starting at `first_seq`.
pub fn seq_last(first_seq: i32, records: u32) -> i32 {
    assert!(records > 0);
    let last = i64::from(first_seq) + i64::from(records) - 1;
    (last % (i64::from(i32::MAX) + 1)) as i32
}

#[derive(Debug, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, Entry>,
}

impl ProducerStates {
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> Result<Verdict, SeqError> {
        assert!(producer_id >= 0);
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(Verdict::Append); // unknown: any sequence (KIP-360)
        };
        if epoch < entry.epoch {
            return Err(SeqError::InvalidEpoch { producer_id, epoch, known: entry.epoch });
        }
        if epoch > entry.epoch {
            return Self::fresh(producer_id, first_seq);
        }
        let Some(last) = entry.batches.back() else {
            return Ok(Verdict::Append); // its batches were removed: unknown again
        };
        let expected = seq_next(last.last_seq);
        if first_seq == expected {
            // The common case, and never a remembered batch: those end at
            // or before `last` (a wrap back to it would take 2^31 records).
            return Ok(Verdict::Append);
        }
        match entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            Some(b) => Ok(Verdict::Duplicate { base_offset: b.base_offset }),
            None => Err(SeqError::OutOfOrder { producer_id, first_seq, expected }),
        }
    }

    /// Checks several batches appended at once (in order): each must be new
    /// and follow the one before it of its producer (in the log or earlier
    /// in the run). A duplicate in a run is refused: retries come alone.
    pub fn check_run(&self, run: &[(i64, i16, i32, i32)]) -> Result<(), SeqError> {
        for (i, &(producer_id, epoch, first_seq, last_seq)) in run.iter().enumerate() {
            let earlier = run[..i].iter().rev().find(|b| b.0 == producer_id);
            match earlier {
                Some(&(_, e, _, last)) if e == epoch => {
                    let expected = seq_next(last);
                    if first_seq != expected {
                        return Err(SeqError::OutOfOrder { producer_id, first_seq, expected });
                    }
                }
                Some(&(_, e, _, _)) if epoch < e => {
                    return Err(SeqError::InvalidEpoch { producer_id, epoch, known: e });
                }
                Some(_) => Self::fresh(producer_id, first_seq).map(|_| ())?,
                None => match self.check(producer_id, epoch, first_seq, last_seq)? {
                    Verdict::Append => {}
                    Verdict::Duplicate { .. } => {
                        return Err(SeqError::RetryNotAlone { producer_id, first_seq })
                    }
                },
            }
        }
        Ok(())
    }

    /// A new epoch of a known producer starts at sequence 0.
    fn fresh(producer_id: i64, first_seq: i32) -> Result<Verdict, SeqError> {
        if first_seq != 0 {
            return Err(SeqError::OutOfOrder { producer_id, first_seq, expected: 0 });
        }
        Ok(Verdict::Append)
    }

    /// Records an appended batch (after `check` said `Append`, or when
    /// recovery rescans the log's headers) at `now_ms`.
    pub fn record(&mut self, producer_id: i64, epoch: i16, batch: BatchSeq, now_ms: i64) {
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch || entry.batches.is_empty() {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == BATCHES_CACHED_MAX {
            entry.batches.pop_front();
        }
        entry.batches.push_back(batch);
        entry.last_ms = entry.last_ms.max(now_ms);
    }

    /// Records a batch read back from the log (recovery, truncation), unless
    /// the state already knows it or something newer of its producer.
    pub fn replay(&mut self, producer_id: i64, epoch: i16, batch: BatchSeq, now_ms: i64) {
        if let Some(e) = self.producers.get(&producer_id) {
            let newer = e.batches.back().is_some_and(|b| b.last_offset >= batch.last_offset);
            if epoch < e.epoch || newer {
                return;
            }
        }
        self.record(producer_id, epoch, batch, now_ms);
    }

    /// Producers `truncate_from(offset)` would leave with no batch.
    #[must_use]
    pub fn emptied_by(&self, offset: u64) -> Vec<i64> {
        let emptied =
            self.producers.iter().filter(|(_, e)| e.batches.front().is_some_and(|b| b.last_offset >= offset));
        emptied.map(|(id, _)| *id).collect()
    }

    /// Forgets batches at or after `offset` (a rolled-back write, a
    /// truncation). A producer left without batches keeps its epoch, so an
    /// older epoch is still refused, and may go on at any sequence.
    pub fn truncate_from(&mut self, offset: u64) {
        for entry in self.producers.values_mut() {
            while entry.batches.back().is_some_and(|b| b.last_offset >= offset) {
                entry.batches.pop_back();
            }
        }
    }

    /// Forgets producers whose last append is older than `now_ms - ttl_ms`;
    /// returns how many.
    pub fn expire(&mut self, now_ms: i64, ttl_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| e.last_ms >= now_ms.saturating_sub(ttl_ms));
        before - self.producers.len()
    }

    /// Producers known.
    #[must_use]
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// A snapshot as of `offset` of a state that may hold batches past it:
    /// those are left out (what `truncate_from(offset)` would leave).
    #[must_use]
    pub fn encode_snapshot_before(&self, offset: u64) -> Vec<u8> {
        let producers: Vec<(i64, Entry)> = self
            .producers
            .iter()
            .map(|(id, e)| {
                let mut e = e.clone();
                while e.batches.back().is_some_and(|b| b.last_offset >= offset) {
                    e.batches.pop_back();
                }
                (*id, e)
            })
            .collect();
        Self::encode_entries(producers, offset)
    }

    /// The snapshot of this state as of `offset` (the log's end).
    #[must_use]
    pub fn encode_snapshot(&self, offset: u64) -> Vec<u8> {
        Self::encode_entries(self.producers.iter().map(|(id, e)| (*id, e.clone())).collect(), offset)
    }

    fn encode_entries(mut producers: Vec<(i64, Entry)>, offset: u64) -> Vec<u8> {
        producers.sort_unstable_by_key(|(id, _)| *id);
        let snap = Snapshot { version: SNAPSHOT_VERSION, offset, producers };
        serde_json::to_vec(&snap).expect("a producer snapshot serializes")
    }

    /// Reads a snapshot: the state and the offset it holds up to.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(ProducerStates, u64), String> {
        let snap: Snapshot =
            serde_json::from_slice(bytes).map_err(|e| format!("not a producer snapshot: {e}"))?;
        if snap.version != SNAPSHOT_VERSION {
            return Err(format!("unsupported producer snapshot version {}", snap.version));
        }
        let producers = snap
            .producers
            .into_iter()
            .map(|(id, mut e)| {
                // A snapshot written by a hostile or damaged file must not
                // make the window longer than the append path keeps it.
                while e.batches.len() > BATCHES_CACHED_MAX {
                    e.batches.pop_front();
                }
                (id, e)
            })
            .collect();
        Ok((ProducerStates { producers }, snap.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(first_seq: i32, last_seq: i32, base_offset: u64) -> BatchSeq {
        BatchSeq { first_seq, last_seq, base_offset, last_offset: base_offset + 9 }
    }

    #[test]
    fn in_order_duplicate_out_of_order_and_epochs() {
        let mut s = ProducerStates::default();
        assert_eq!(s.check(7, 0, 0, 9), Ok(Verdict::Append));
        assert_eq!(s.check(7, 0, 3, 9), Ok(Verdict::Append), "an unknown producer may start anywhere");
        s.record(7, 0, b(0, 9, 100), 0);
        assert_eq!(s.check(7, 0, 0, 9), Ok(Verdict::Duplicate { base_offset: 100 }));
        assert_eq!(s.check(7, 0, 10, 19), Ok(Verdict::Append));
        assert!(matches!(s.check(7, 0, 11, 19), Err(SeqError::OutOfOrder { expected: 10, .. })));
        s.record(7, 1, b(0, 9, 200), 0);
        assert!(matches!(s.check(7, 0, 10, 19), Err(SeqError::InvalidEpoch { known: 1, .. })));
        assert!(s.check(7, 2, 5, 9).is_err(), "a new epoch starts at 0");
        assert_eq!(s.check(7, 2, 0, 9), Ok(Verdict::Append));
    }

    #[test]
    fn window_keeps_the_last_batches_and_sequences_wrap() {
        let mut s = ProducerStates::default();
        for i in 0..=BATCHES_CACHED_MAX as u64 {
            s.record(1, 0, b(i as i32 * 10, i as i32 * 10 + 9, i * 10), 0);
        }
        assert!(s.check(1, 0, 0, 9).is_err(), "evicted batch is no longer a duplicate");
        assert_eq!(s.check(1, 0, 10, 19), Ok(Verdict::Duplicate { base_offset: 10 }));
        assert_eq!(seq_next(i32::MAX), 0);
        assert_eq!(seq_last(i32::MAX - 1, 3), 0);
        s.record(1, 0, b(i32::MAX - 9, i32::MAX, 60), 0);
        assert_eq!(s.check(1, 0, 0, 4), Ok(Verdict::Append));
    }

    #[test]
    fn truncation_forgets_batches_but_keeps_the_epoch() {
        let mut s = ProducerStates::default();
        s.record(4, 2, b(0, 9, 0), 0);
        s.record(4, 2, b(10, 19, 10), 0);
        s.truncate_from(10);
        assert_eq!(s.check(4, 2, 10, 19), Ok(Verdict::Append), "the removed batch is not a duplicate");
        assert_eq!(s.check(4, 2, 0, 9), Ok(Verdict::Duplicate { base_offset: 0 }));
        s.truncate_from(0);
        assert_eq!(s.check(4, 2, 30, 39), Ok(Verdict::Append), "no batches left: any sequence");
        s.replay(4, 2, b(0, 9, 0), 0);
        s.replay(4, 1, b(10, 19, 10), 0);
        assert_eq!(s.check(4, 2, 0, 9), Ok(Verdict::Duplicate { base_offset: 0 }), "replayed");
        assert_eq!(s.check(4, 2, 10, 19), Ok(Verdict::Append), "an older epoch is not replayed");
        assert!(matches!(s.check(4, 1, 0, 9), Err(SeqError::InvalidEpoch { known: 2, .. })));
    }

    #[test]
    fn expiry_and_snapshot_round_trip() {
        let mut s = ProducerStates::default();
        s.record(1, 0, b(0, 9, 0), 1_000);
        s.record(2, 3, b(0, 9, 10), 5_000);
        let (back, offset) = ProducerStates::decode_snapshot(&s.encode_snapshot(20)).expect("decodes");
        assert_eq!((back.producers.clone(), offset), (s.producers.clone(), 20));
        assert_eq!(back.check(2, 3, 0, 9), Ok(Verdict::Duplicate { base_offset: 10 }));
        assert!(ProducerStates::decode_snapshot(b"{}").is_err());
        assert_eq!(s.expire(6_000, 2_000), 1, "producer 1 was last seen at 1000");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_run_of_batches_must_follow_on_and_hold_no_retry() {
        let mut s = ProducerStates::default();
        s.record(1, 0, b(0, 9, 0), 0);
        assert_eq!(s.check_run(&[(1, 0, 10, 19), (2, 0, 5, 5), (1, 0, 20, 29)]), Ok(()));
        assert!(matches!(s.check_run(&[(1, 0, 10, 19), (1, 0, 21, 29)]), Err(SeqError::OutOfOrder { .. })));
        assert!(matches!(s.check_run(&[(1, 0, 0, 9), (1, 0, 10, 19)]), Err(SeqError::RetryNotAlone { .. })));
        assert!(matches!(s.check_run(&[(1, 0, 10, 19), (1, 1, 3, 4)]), Err(SeqError::OutOfOrder { .. })));
    }

    proptest::proptest! {
        #[test]
        fn retry_of_any_cached_batch_is_a_duplicate(
            sizes in proptest::collection::vec(1u32..50, 1..20),
            back in 0usize..BATCHES_CACHED_MAX,
        ) {
            let mut s = ProducerStates::default();
            let mut seq = 0i32;
            let mut offset = 0u64;
            let mut done = Vec::new();
            for n in &sizes {
                let last = seq_last(seq, *n);
                proptest::prop_assert_eq!(s.check(3, 0, seq, last), Ok(Verdict::Append));
                let batch = BatchSeq { first_seq: seq, last_seq: last, base_offset: offset, last_offset: offset + u64::from(*n) - 1 };
                s.record(3, 0, batch, 0);
                done.push(batch);
                seq = seq_next(last);
                offset += u64::from(*n);
            }
            if back < done.len() {
                let b = done[done.len() - 1 - back];
                proptest::prop_assert_eq!(s.check(3, 0, b.first_seq, b.last_seq), Ok(Verdict::Duplicate { base_offset: b.base_offset }));
            }
        }
    }
}
