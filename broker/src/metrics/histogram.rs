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
