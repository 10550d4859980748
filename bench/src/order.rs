//! Order as a checked property of every run: producers number their records,
//! consumers check that, per partition and per producer, the numbers only
//! increase. A fast run that reorders is not a result (issue 16).
//!
//! Payload layout (the rest of the payload is the workload's template):
//!
//! ```text
//!  0               8                              16
//!  | send time, ns | stream (16 bits) | seq (48 bits) | template ...
//!  |  u64 LE       |  u64 LE: stream << 48 | seq      |
//! ```
//!
//! A **stream** is one producer instance of one phase of a repetition (the
//! probe, the backlog write and the measured run get fresh ids), so records
//! of different phases never compare against each other.
//!
//! **Scope** of the sequence number, fixed per workload ([`SeqScope::of`]):
//! - `per-partition`: when the harness knows the partition at send time (one
//!   partition, an explicit partition, or a key hashed with the client's
//!   [`shardlog_client::DefaultPartitioner`]), each (stream, partition) counts
//!   0, 1, 2, ... with no gap. The checker then also finds the records that
//!   never arrived: a gap is allowed only where the send failed, or for
//!   `acks = 0`, where nothing is acknowledged.
//! - `per-producer`: keyless records over several partitions (the client's
//!   sticky partitioner decides inside `send`), one counter per stream. The
//!   records of one stream in one partition must still increase strictly,
//!   but the gaps are the records that went to other partitions, so losses
//!   are not detected here (the received-vs-acknowledged counts still are).
//!
//! What counts as a **violation**: a record whose number is not above the
//! highest seen before in its (partition, stream) — reordered (it fills a
//! gap left earlier) or duplicated — and, in `per-partition` scope, every
//! acknowledged record of a gap that never arrived. A reorder that moves one
//! record back by `k` places shows as `k` decreases, not one.
//!
//! Cost: producers write one more `u64` into the payload they build anyway
//! (and keep a counter per partition in their own task); each consumer task
//! owns its checker (no lock, no sharing); the lock on the failed-send list
//! is taken only when a send fails.

use crate::workload::{KeyDistribution, Workload, MESSAGE_BYTES_MIN, PRODUCERS_MAX};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// Bits of the sequence number in the order word; the stream id takes the rest.
pub const SEQ_BITS: u32 = 48;
/// Largest sequence number a stream can carry.
pub const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;
/// Stream ids per repetition (every producer of every phase needs one).
pub const STREAMS_MAX: u32 = 1 << (64 - SEQ_BITS);
/// Where the order word sits in a payload: right after the send timestamp.
pub const ORDER_WORD_AT: usize = 8;
/// A payload shorter than this carries no order word and is not checked.
pub const ORDER_PAYLOAD_BYTES_MIN: usize = ORDER_WORD_AT + 8;
/// Open gaps remembered per (partition, stream); beyond it the oldest is
/// given up (counted in `gap_records_untracked`) so a pathological run cannot
/// grow a consumer's memory without bound.
pub const GAPS_PER_STREAM_MAX: usize = 1024;

const _: () = assert!(ORDER_PAYLOAD_BYTES_MIN <= MESSAGE_BYTES_MIN);
// Probe, backlog write and measured run: at most three phases of producers.
const _: () = assert!(3 * PRODUCERS_MAX <= STREAMS_MAX);

/// The 8 bytes that follow the send timestamp.
#[must_use]
pub fn encode(stream: u16, seq: u64) -> [u8; 8] {
    assert!(seq <= SEQ_MAX, "stream {stream} ran out of sequence numbers");
    ((u64::from(stream) << SEQ_BITS) | seq).to_le_bytes()
}

/// `(stream, seq)` of a payload, `None` if it is too short to carry them.
#[must_use]
pub fn decode(value: &[u8]) -> Option<(u16, u64)> {
    let word = value.get(ORDER_WORD_AT..ORDER_PAYLOAD_BYTES_MIN)?;
    let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
    Some(((w >> SEQ_BITS) as u16, w & SEQ_MAX))
}

/// What a sequence number counts (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SeqScope {
    /// One gap-free counter per (producer, partition).
    #[default]
    PerPartition,
    /// One counter per producer, shared by the partitions it writes.
    PerProducer,
}

impl SeqScope {
    /// `PerPartition` whenever the harness can know a record's partition
    /// before the client does.
    #[must_use]
    pub fn of(w: &Workload) -> SeqScope {
        if w.partitions_per_topic == 1 || w.key_distribution != KeyDistribution::None {
            SeqScope::PerPartition
        } else {
            SeqScope::PerProducer
        }
    }
}

/// The producer side: hands out the next number of one stream.
#[derive(Debug)]
pub struct Sequencer {
    stream: u16,
    scope: SeqScope,
    /// Next number per partition (`PerPartition`) or `[next]` (`PerProducer`).
    next: Vec<u64>,
}

impl Sequencer {
    #[must_use]
    pub fn new(stream: u16, scope: SeqScope, partitions: u32) -> Sequencer {
        let slots = match scope {
            SeqScope::PerPartition => partitions.max(1) as usize,
            SeqScope::PerProducer => 1,
        };
        Sequencer { stream, scope, next: vec![0; slots] }
    }

    #[must_use]
    pub fn stream(&self) -> u16 {
        self.stream
    }

    /// The number of the next record, sent to `partition` when the harness
    /// knows it. `PerPartition` requires the partition.
    pub fn next(&mut self, partition: Option<u32>) -> u64 {
        let slot = match self.scope {
            SeqScope::PerPartition => {
                partition.expect("per-partition sequence numbers need the partition at send time") as usize
            }
            SeqScope::PerProducer => 0,
        };
        let n = self.next[slot];
        self.next[slot] = n + 1;
        n
    }
}

/// A record the harness sent and saw fail: (stream, partition, seq).
pub type FailedSend = (u16, u32, u64);

/// What the producers know was not acknowledged, to excuse gaps.
#[derive(Debug, Default)]
pub struct FailedSends {
    /// `acks = 0`: nothing is acknowledged, so every gap is excused.
    nothing_acknowledged: bool,
    by_stream: HashMap<(u16, u32), Vec<u64>>,
}

impl FailedSends {
    #[must_use]
    pub fn new(failed: impl IntoIterator<Item = FailedSend>, nothing_acknowledged: bool) -> FailedSends {
        let mut by_stream: HashMap<(u16, u32), Vec<u64>> = HashMap::new();
        for (stream, partition, seq) in failed {
            by_stream.entry((stream, partition)).or_default().push(seq);
        }
        for v in by_stream.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        FailedSends { nothing_acknowledged, by_stream }
    }

    /// How many of `[from, to)` of this stream and partition failed.
    fn count(&self, stream: u16, partition: u32, from: u64, to: u64) -> u64 {
        if self.nothing_acknowledged {
            return to - from;
        }
        self.by_stream
            .get(&(stream, partition))
            .map_or(0, |v| (v.partition_point(|&s| s < to) - v.partition_point(|&s| s < from)) as u64)
    }
}

/// The result of the check, per repetition (and summed over consumers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderSummary {
    pub scope: SeqScope,
    /// Records whose order word was checked.
    pub checked_records: u64,
    /// `decreases + duplicates + missing_acked_records`; 0 or the run is invalid.
    pub violations: u64,
    /// Records that arrived after a record with a higher number of their
    /// (partition, stream): reordered (or, in `per-producer` scope, possibly
    /// a duplicate of an older record).
    pub decreases: u64,
    /// Records whose number was seen before in their (partition, stream).
    pub duplicates: u64,
    /// `per-partition` scope: records in a gap that never arrived although
    /// their send did not fail.
    pub missing_acked_records: u64,
    /// Records in gaps excused because their send failed (or `acks = 0`).
    pub gap_records_failed: u64,
    /// Records in gaps given up beyond `GAPS_PER_STREAM_MAX` (not judged).
    pub gap_records_untracked: u64,
    /// Payloads too short to carry an order word (not judged).
    pub unchecked_records: u64,
}

impl OrderSummary {
    pub fn add(&mut self, o: &OrderSummary) {
        self.checked_records += o.checked_records;
        self.violations += o.violations;
        self.decreases += o.decreases;
        self.duplicates += o.duplicates;
        self.missing_acked_records += o.missing_acked_records;
        self.gap_records_failed += o.gap_records_failed;
        self.gap_records_untracked += o.gap_records_untracked;
        self.unchecked_records += o.unchecked_records;
    }

    /// One line for people: the figure first.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{} order violations ({} decreases, {} duplicates, {} acknowledged records missing) \
             in {} records checked, sequence {}",
            self.violations,
            self.decreases,
            self.duplicates,
            self.missing_acked_records,
            self.checked_records,
            match self.scope {
                SeqScope::PerPartition => "per producer and partition",
                SeqScope::PerProducer => "per producer (gaps not judged)",
            }
        )
    }
}

/// Per (partition, stream): the next number expected and the open gaps,
/// as sorted, disjoint `[from, to)` ranges.
#[derive(Debug, Default)]
struct StreamState {
    next: u64,
    gaps: VecDeque<(u64, u64)>,
}

/// The consumer side: one per consumer task, fed every record it receives.
#[derive(Debug)]
pub struct OrderChecker {
    scope: SeqScope,
    from_start: bool,
    index: HashMap<(u32, u16), usize>,
    streams: Vec<((u32, u16), StreamState)>,
    /// The stream of the previous record: batches make runs of one stream.
    last: Option<((u32, u16), usize)>,
    sum: OrderSummary,
}

impl OrderChecker {
    /// `from_start`: the consumer reads each partition from before the
    /// streams' first record, so a stream's first number must be 0 (a
    /// consumer that starts in the middle of a log takes the first number it
    /// sees as the start instead).
    #[must_use]
    pub fn new(scope: SeqScope, from_start: bool) -> OrderChecker {
        OrderChecker {
            scope,
            from_start,
            index: HashMap::new(),
            streams: Vec::new(),
            last: None,
            sum: OrderSummary { scope, ..OrderSummary::default() },
        }
    }

    /// Checks one received record of `partition`.
    pub fn check(&mut self, partition: u32, value: &[u8]) {
        let Some((stream, seq)) = decode(value) else {
            self.sum.unchecked_records += 1;
            return;
        };
        self.sum.checked_records += 1;
        let key = (partition, stream);
        let i = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let start = if self.from_start { 0 } else { seq };
                let streams = &mut self.streams;
                let i = *self.index.entry(key).or_insert_with(|| {
                    streams.push((key, StreamState { next: start, gaps: VecDeque::new() }));
                    streams.len() - 1
                });
                self.last = Some((key, i));
                i
            }
        };
        let s = &mut self.streams[i].1;
        if seq >= s.next {
            if seq > s.next && self.scope == SeqScope::PerPartition {
                s.gaps.push_back((s.next, seq));
                self.sum.gap_records_untracked += bound_gaps(&mut s.gaps);
            }
            s.next = seq + 1;
            return;
        }
        match self.scope {
            SeqScope::PerPartition => {
                if fill_gap(&mut s.gaps, seq) {
                    self.sum.decreases += 1;
                    self.sum.gap_records_untracked += bound_gaps(&mut s.gaps);
                } else {
                    self.sum.duplicates += 1;
                }
            }
            SeqScope::PerProducer if seq + 1 == s.next => self.sum.duplicates += 1,
            SeqScope::PerProducer => self.sum.decreases += 1,
        }
    }

    /// The summary, with the gaps still open judged against what failed.
    #[must_use]
    pub fn finish(self, failed: &FailedSends) -> OrderSummary {
        let mut sum = self.sum;
        for ((partition, stream), s) in &self.streams {
            for &(from, to) in &s.gaps {
                let excused = failed.count(*stream, *partition, from, to);
                sum.gap_records_failed += excused;
                sum.missing_acked_records += (to - from) - excused;
            }
        }
        sum.violations = sum.decreases + sum.duplicates + sum.missing_acked_records;
        sum
    }
}

/// Removes `seq` from the gap that holds it; `false` if no gap does.
fn fill_gap(gaps: &mut VecDeque<(u64, u64)>, seq: u64) -> bool {
    let i = gaps.partition_point(|&(_, to)| to <= seq);
    let Some(&(from, to)) = gaps.get(i) else { return false };
    if seq < from {
        return false;
    }
    match (seq == from, seq + 1 == to) {
        (true, true) => {
            gaps.remove(i);
        }
        (true, false) => gaps[i].0 += 1,
        (false, true) => gaps[i].1 -= 1,
        (false, false) => {
            gaps[i].1 = seq;
            gaps.insert(i + 1, (seq + 1, to));
        }
    }
    true
}

/// Gives up the oldest gaps beyond the bound; returns their record count.
fn bound_gaps(gaps: &mut VecDeque<(u64, u64)>) -> u64 {
    let mut dropped = 0;
    while gaps.len() > GAPS_PER_STREAM_MAX {
        let (from, to) = gaps.pop_front().expect("non-empty");
        dropped += to - from;
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload of `len` bytes carrying `(stream, seq)` when long enough.
    fn payload(stream: u16, seq: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0xa5u8; len.max(ORDER_PAYLOAD_BYTES_MIN)];
        v[..8].copy_from_slice(&123u64.to_le_bytes());
        v[ORDER_WORD_AT..ORDER_PAYLOAD_BYTES_MIN].copy_from_slice(&encode(stream, seq));
        v.truncate(len);
        v
    }

    fn run(scope: SeqScope, records: &[(u32, u16, u64)], failed: &FailedSends) -> OrderSummary {
        let mut c = OrderChecker::new(scope, true);
        for &(p, s, q) in records {
            c.check(p, &payload(s, q, 64));
        }
        c.finish(failed)
    }

    fn none_failed() -> FailedSends {
        FailedSends::new([], false)
    }

    #[test]
    fn order_word_round_trips_and_keeps_the_timestamp_bytes() {
        let v = payload(65_535, SEQ_MAX, 32);
        assert_eq!(decode(&v), Some((65_535, SEQ_MAX)));
        assert_eq!(&v[..8], &123u64.to_le_bytes());
        assert_eq!(decode(&payload(7, 0, 16)), Some((7, 0)));
    }

    #[test]
    fn in_order_streams_pass() {
        let recs: Vec<_> = (0..1_000).map(|q| (0, 3, q)).collect();
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!(s.checked_records, 1_000);
        assert_eq!(s.violations, 0, "{s:?}");
        assert_eq!(s, OrderSummary { checked_records: 1_000, ..OrderSummary::default() });
    }

    #[test]
    fn a_reordered_record_counts_as_a_decrease_and_fills_its_gap() {
        // 0 1 3 2 4: 3 opens the gap [2, 3), 2 arrives late and fills it.
        let recs = [(0, 1, 0), (0, 1, 1), (0, 1, 3), (0, 1, 2), (0, 1, 4)];
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.missing_acked_records), (1, 0, 0));
        assert_eq!(s.violations, 1);
        // Moving one record back by three places costs three decreases.
        let recs = [(0, 1, 0), (0, 1, 4), (0, 1, 1), (0, 1, 2), (0, 1, 3), (0, 1, 5)];
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.missing_acked_records, s.violations), (3, 0, 0, 3));
    }

    #[test]
    fn a_duplicate_counts_once_and_is_told_apart_from_a_reorder() {
        let recs = [(0, 1, 0), (0, 1, 1), (0, 1, 1), (0, 1, 2), (0, 1, 0)];
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.violations), (0, 2, 2));
        // A gap filled once, then the same record again: a decrease, then a duplicate.
        let recs = [(0, 1, 0), (0, 1, 2), (0, 1, 1), (0, 1, 1)];
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.violations), (1, 1, 2));
    }

    #[test]
    fn per_producer_scope_allows_gaps_but_not_decreases_or_duplicates() {
        // Keyless over several partitions: the gaps went elsewhere.
        let ok = [(0, 1, 0), (0, 1, 5), (1, 1, 1), (0, 1, 9), (1, 1, 7)];
        let s = run(SeqScope::PerProducer, &ok, &none_failed());
        assert_eq!(s.violations, 0, "{s:?}");
        let bad = [(0, 1, 0), (0, 1, 5), (0, 1, 5), (0, 1, 3)];
        let s = run(SeqScope::PerProducer, &bad, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.missing_acked_records, s.violations), (1, 1, 0, 2));
    }

    #[test]
    fn partitions_and_producers_are_checked_independently() {
        // Interleaved streams, each in order on its own: no violation, even
        // though the numbers go down from one record to the next.
        let recs = [
            (0, 1, 0),
            (1, 1, 0),
            (0, 2, 0),
            (0, 1, 1),
            (1, 2, 0),
            (1, 1, 1),
            (0, 2, 1),
            (1, 2, 1),
            (0, 1, 2),
        ];
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!(s.violations, 0, "{s:?}");
        // A reorder in one (partition, producer) is charged to it alone.
        let mut bad = recs.to_vec();
        bad.extend([(1, 2, 3), (1, 2, 2), (0, 2, 2), (1, 1, 2)]);
        let s = run(SeqScope::PerPartition, &bad, &none_failed());
        assert_eq!((s.decreases, s.duplicates, s.missing_acked_records), (1, 0, 0));
    }

    #[test]
    fn gaps_are_excused_only_where_the_send_failed() {
        let recs = [(0, 1, 0), (0, 1, 3), (0, 1, 4), (2, 1, 0), (2, 1, 2)];
        // Nothing failed: seqs 1, 2 of partition 0 and 1 of partition 2 are lost.
        let s = run(SeqScope::PerPartition, &recs, &none_failed());
        assert_eq!((s.missing_acked_records, s.gap_records_failed, s.violations), (3, 0, 3));
        // 1 and 2 of partition 0 failed; the failed 1 on partition 2 was stream 2's, not 1's.
        let failed = FailedSends::new([(1, 0, 1), (1, 0, 2), (2, 2, 1)], false);
        let s = run(SeqScope::PerPartition, &recs, &failed);
        assert_eq!((s.missing_acked_records, s.gap_records_failed, s.violations), (1, 2, 1));
        // acks = 0: nothing was acknowledged, every gap is allowed.
        let s = run(SeqScope::PerPartition, &recs, &FailedSends::new([], true));
        assert_eq!((s.missing_acked_records, s.gap_records_failed, s.violations), (0, 3, 0));
        // Records missing at the start count when the consumer read from the start.
        let s = run(SeqScope::PerPartition, &[(0, 1, 2), (0, 1, 3)], &none_failed());
        assert_eq!(s.missing_acked_records, 2);
    }

    #[test]
    fn a_consumer_starting_mid_log_takes_the_first_number_as_the_start() {
        let mut c = OrderChecker::new(SeqScope::PerPartition, false);
        for q in 500..510 {
            c.check(0, &payload(1, q, 64));
        }
        let s = c.finish(&none_failed());
        assert_eq!((s.checked_records, s.violations), (10, 0));
    }

    #[test]
    fn a_payload_too_short_is_counted_and_not_judged() {
        let mut c = OrderChecker::new(SeqScope::PerPartition, true);
        c.check(0, &payload(1, 0, 64));
        c.check(0, &[]);
        c.check(0, &payload(1, 9, ORDER_PAYLOAD_BYTES_MIN - 1));
        c.check(0, &payload(1, 1, ORDER_PAYLOAD_BYTES_MIN));
        let s = c.finish(&none_failed());
        assert_eq!((s.checked_records, s.unchecked_records, s.violations), (2, 2, 0));
    }

    #[test]
    fn open_gaps_are_bounded_per_stream() {
        let mut c = OrderChecker::new(SeqScope::PerPartition, true);
        // Every other record missing: one gap each, more than the bound.
        let n = GAPS_PER_STREAM_MAX as u64 + 10;
        for q in 0..=n {
            c.check(0, &payload(1, 2 * q, 64));
        }
        let s = c.finish(&none_failed());
        assert_eq!(s.gap_records_untracked, 10);
        assert_eq!(s.missing_acked_records, GAPS_PER_STREAM_MAX as u64);
    }

    #[test]
    fn sequencer_counts_per_partition_or_per_producer() {
        let mut s = Sequencer::new(4, SeqScope::PerPartition, 3);
        assert_eq!([s.next(Some(0)), s.next(Some(2)), s.next(Some(0)), s.next(Some(2))], [0, 0, 1, 1]);
        let mut p = Sequencer::new(4, SeqScope::PerProducer, 3);
        assert_eq!([p.next(None), p.next(Some(2)), p.next(None)], [0, 1, 2]);
        assert_eq!(p.stream(), 4);
    }

    #[test]
    fn scope_follows_what_the_harness_knows_at_send_time() {
        let w = |extra: &str| -> Workload {
            toml::from_str(&format!("name = \"x\"\nmessage_size = 100\n{extra}")).unwrap()
        };
        assert_eq!(SeqScope::of(&w("")), SeqScope::PerPartition);
        assert_eq!(SeqScope::of(&w("partitions_per_topic = 4\n")), SeqScope::PerProducer);
        let rr = w("partitions_per_topic = 4\nkey_distribution = \"partition-round-robin\"\n");
        assert_eq!(SeqScope::of(&rr), SeqScope::PerPartition);
        let keyed = w("partitions_per_topic = 4\nkey_distribution = \"random\"\n");
        assert_eq!(SeqScope::of(&keyed), SeqScope::PerPartition);
    }
}
