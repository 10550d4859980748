//! Per-partition idempotent-producer state: pure sequence-window logic, no
//! I/O, no runtime (so it is unit-tested without a shard).
//!
//! For each producer id the partition keeps its epoch and the last
//! [`BATCHES_CACHED_MAX`] appended batches (first/last sequence, base/last
//! offset), as Kafka's ProducerStateManager does. NOT YET WIRED into
//! `Log::append`: the check must run where offsets are assigned (in
//! admission order) — see the report of the `idem` branch.
//!
//! Rules ([`ProducerStates::check`]):
//! - epoch older than known: [`SeqError::InvalidEpoch`] (Kafka 47);
//! - same epoch, sequence range equal to a cached batch: duplicate, answered
//!   with the original base offset, not appended;
//! - same epoch, first sequence not last + 1 (wrapping at `i32::MAX` to 0):
//!   [`SeqError::OutOfOrder`] (Kafka 45);
//! - newer epoch, or an unknown producer id: must start at sequence 0, else
//!   `OutOfOrder` (a conservative choice, to be checked against Kafka 2.5+).

use std::collections::{HashMap, VecDeque};

/// Batches remembered per producer (Kafka keeps 5, the client's
/// `max.in.flight.requests.per.connection` limit for idempotence).
pub const BATCHES_CACHED_MAX: usize = 5;

/// One appended batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSeq {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

#[derive(Debug, Default)]
struct Entry {
    epoch: i16,
    batches: VecDeque<BatchSeq>,
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
            return Self::fresh(producer_id, first_seq);
        };
        if epoch < entry.epoch {
            return Err(SeqError::InvalidEpoch { producer_id, epoch, known: entry.epoch });
        }
        if epoch > entry.epoch {
            return Self::fresh(producer_id, first_seq);
        }
        if let Some(b) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            return Ok(Verdict::Duplicate { base_offset: b.base_offset });
        }
        let expected = entry.batches.back().map_or(0, |b| seq_next(b.last_seq));
        if first_seq != expected {
            return Err(SeqError::OutOfOrder { producer_id, first_seq, expected });
        }
        Ok(Verdict::Append)
    }

    fn fresh(producer_id: i64, first_seq: i32) -> Result<Verdict, SeqError> {
        if first_seq != 0 {
            return Err(SeqError::OutOfOrder { producer_id, first_seq, expected: 0 });
        }
        Ok(Verdict::Append)
    }

    /// Records an appended batch (after `check` said `Append`, or when
    /// recovery rescans the log's headers).
    pub fn record(&mut self, producer_id: i64, epoch: i16, batch: BatchSeq) {
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == BATCHES_CACHED_MAX {
            entry.batches.pop_front();
        }
        entry.batches.push_back(batch);
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
        assert!(s.check(7, 0, 3, 9).is_err(), "unknown producer must start at 0");
        s.record(7, 0, b(0, 9, 100));
        assert_eq!(s.check(7, 0, 0, 9), Ok(Verdict::Duplicate { base_offset: 100 }));
        assert_eq!(s.check(7, 0, 10, 19), Ok(Verdict::Append));
        assert!(matches!(s.check(7, 0, 11, 19), Err(SeqError::OutOfOrder { expected: 10, .. })));
        s.record(7, 1, b(0, 9, 200));
        assert!(matches!(s.check(7, 0, 10, 19), Err(SeqError::InvalidEpoch { known: 1, .. })));
        assert!(s.check(7, 2, 5, 9).is_err(), "a new epoch starts at 0");
        assert_eq!(s.check(7, 2, 0, 9), Ok(Verdict::Append));
    }

    #[test]
    fn window_keeps_last_five_and_sequences_wrap() {
        let mut s = ProducerStates::default();
        for i in 0..6u64 {
            s.record(1, 0, b(i as i32 * 10, i as i32 * 10 + 9, i * 10));
        }
        assert!(s.check(1, 0, 0, 9).is_err(), "evicted batch is no longer a duplicate");
        assert_eq!(s.check(1, 0, 10, 19), Ok(Verdict::Duplicate { base_offset: 10 }));
        assert_eq!(seq_next(i32::MAX), 0);
        assert_eq!(seq_last(i32::MAX - 1, 3), 0);
        s.record(1, 0, b(i32::MAX - 9, i32::MAX, 60));
        assert_eq!(s.check(1, 0, 0, 4), Ok(Verdict::Append));
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
                s.record(3, 0, batch);
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
