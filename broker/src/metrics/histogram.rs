//! Fixed-bucket latency histograms in `Cell`s: one per shard and use, so
//! recording is a search over 16 bounds and two adds, never shared.

use super::add;
use std::cell::Cell;

/// Upper bounds (µs) of the request latency buckets; one more bucket, +Inf,
/// follows the last.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];
pub(super) const BUCKETS: usize = LATENCY_BUCKETS_US.len() + 1;

/// A shard's request latency histogram for one API: fixed buckets in
/// `Cell`s (recording is a search over 16 bounds and two adds).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [Cell<u64>; BUCKETS],
    sum_us: Cell<u64>,
}

impl LatencyHistogram {
    pub fn record(&self, elapsed: std::time::Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        add(&self.buckets[LATENCY_BUCKETS_US.partition_point(|b| *b < us)], 1);
        self.sum_us.set(self.sum_us.get().saturating_add(us));
    }

    #[must_use]
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].get()),
            sum_us: self.sum_us.get(),
        }
    }
}

/// A copy of a [`LatencyHistogram`]: per-bucket (not cumulative) counts.
#[derive(Debug, Clone, Default)]
pub struct HistogramSnapshot {
    pub buckets: [u64; BUCKETS],
    pub sum_us: u64,
}

/// Bounds of the stage histograms' buckets: four per octave from 1 µs to
/// about 3.7 s (1, 1.25, 1.5, 1.75, 2, 2.5 ... µs), so a quantile read from
/// them is off by at most a quarter of its octave (less, interpolated).
pub const STAGE_BUCKETS: usize = 88;

/// Upper bound of stage bucket `i`, in nanoseconds.
#[must_use]
pub const fn stage_bound_ns(i: usize) -> u64 {
    (1000u64 << (i / 4)) * (4 + (i % 4) as u64) / 4
}

const STAGE_BOUNDS_NS: [u64; STAGE_BUCKETS] = {
    let mut b = [0u64; STAGE_BUCKETS];
    let mut i = 0;
    while i < STAGE_BUCKETS {
        b[i] = stage_bound_ns(i);
        i += 1;
    }
    b
};

/// Fine-grained durations of one step of the data path, counted per record
/// (`record_n`): what `/metrics` shows as `shardlog_stage_duration_seconds`
/// and `shardlog-bench` reads back as the latency breakdown.
#[derive(Debug)]
pub struct StageHistogram {
    buckets: [Cell<u64>; STAGE_BUCKETS + 1],
    sum_ns: Cell<u64>,
}

impl Default for StageHistogram {
    fn default() -> Self {
        StageHistogram { buckets: std::array::from_fn(|_| Cell::new(0)), sum_ns: Cell::new(0) }
    }
}

impl StageHistogram {
    /// Counts `n` records that each spent `elapsed` in this stage.
    pub fn record_n(&self, elapsed: std::time::Duration, n: u64) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        add(&self.buckets[STAGE_BOUNDS_NS.partition_point(|b| *b < ns)], n);
        self.sum_ns.set(self.sum_ns.get().saturating_add(ns.saturating_mul(n)));
    }

    #[must_use]
    pub fn snapshot(&self) -> StageSnapshot {
        StageSnapshot { buckets: self.buckets.iter().map(Cell::get).collect(), sum_ns: self.sum_ns.get() }
    }
}

/// A copy of a [`StageHistogram`]: per-bucket (not cumulative) counts,
/// `STAGE_BUCKETS + 1` of them (the last is +Inf).
#[derive(Debug, Clone, Default)]
pub struct StageSnapshot {
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

#[cfg(test)]
mod stage_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stage_bounds_grow_by_quarter_octaves() {
        assert_eq!(stage_bound_ns(0), 1_000);
        assert_eq!(stage_bound_ns(1), 1_250);
        assert_eq!(stage_bound_ns(3), 1_750);
        assert_eq!(stage_bound_ns(4), 2_000);
        assert_eq!(stage_bound_ns(41), 1_000 * 1024 * 5 / 4);
        assert!(STAGE_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
        assert!(stage_bound_ns(STAGE_BUCKETS - 1) > 3_500_000_000, "the last bound is about 3.7 s");
    }

    #[test]
    fn records_are_counted_with_their_weight() {
        let h = StageHistogram::default();
        h.record_n(Duration::from_nanos(1_100), 3); // (1.0, 1.25] µs
        h.record_n(Duration::from_nanos(1_000), 1); // exactly on a bound: that bucket
        h.record_n(Duration::from_secs(60), 2);
        let s = h.snapshot();
        assert_eq!(s.buckets.len(), STAGE_BUCKETS + 1);
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 3);
        assert_eq!(s.buckets[STAGE_BUCKETS], 2);
        assert_eq!(s.sum_ns, 3 * 1_100 + 1_000 + 2 * 60_000_000_000);
    }
}
