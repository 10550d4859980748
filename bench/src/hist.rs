//! Latency histograms: one `hdrhistogram` per task (no sharing on the hot
//! path), merged once at the end of a run.
//!
//! Values are nanoseconds with 3 significant digits, bounded at one hour; a
//! value above the bound is clamped to it (and counted), never dropped, so a
//! stall can never disappear from the tail.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency a histogram tracks exactly: one hour, in nanoseconds.
pub const LATENCY_NS_MAX: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits kept by every histogram.
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// A latency recorder owned by one task.
#[derive(Clone)]
pub struct LatencyHist {
    hist: Histogram<u64>,
}

impl Default for LatencyHist {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHist {
    #[must_use]
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, LATENCY_NS_MAX, SIGNIFICANT_DIGITS)
            .expect("static histogram bounds are valid");
        LatencyHist { hist }
    }

    /// Records one latency in nanoseconds (zero is recorded as 1 ns).
    pub fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHist) {
        self.hist.add(&other.hist).expect("histograms share bounds, so add cannot fail");
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The summary a report keeps: the standard percentiles, in microseconds.
    #[must_use]
    pub fn summary(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1_000.0;
        let q = |p: f64| if self.hist.is_empty() { 0.0 } else { us(self.hist.value_at_quantile(p)) };
        LatencySummary {
            count: self.hist.len(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            p9999_us: q(0.9999),
            max_us: if self.hist.is_empty() { 0.0 } else { us(self.hist.max()) },
            mean_us: if self.hist.is_empty() { 0.0 } else { self.hist.mean() / 1_000.0 },
            curve: self.curve(),
        }
    }

    /// Percentile curve for plotting: (percentile, microseconds) at
    /// 1 - 10^-k steps, log-spaced toward the tail.
    fn curve(&self) -> Vec<(f64, f64)> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        let mut points = Vec::new();
        // 0, 10, 20, ... 90 then 90..99, 99..99.9, ... down to 99.9999.
        let mut p = 0.0_f64;
        while p < 90.0 {
            points.push(p);
            p += 10.0;
        }
        for decade in 1..=5 {
            let base = 100.0 - 10.0_f64.powi(2 - decade);
            let step = 10.0_f64.powi(1 - decade);
            for i in 0..9 {
                // Rounded so that the value survives a JSON round trip unchanged.
                points.push(((base + f64::from(i) * step) * 1e6).round() / 1e6);
            }
        }
        points.push(100.0);
        points.into_iter().map(|p| (p, self.hist.value_at_quantile(p / 100.0) as f64 / 1_000.0)).collect()
    }
}

/// Latency percentiles in microseconds. The mean is kept for completeness,
/// never shown alone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// (percentile, microseconds), ascending in percentile.
    pub curve: Vec<(f64, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_every_value_and_the_tail() {
        let mut a = LatencyHist::new();
        let mut b = LatencyHist::new();
        for i in 1..=1_000u64 {
            a.record_ns(i * 1_000); // 1 us .. 1 ms
        }
        b.record_ns(5_000_000_000); // one 5 s stall in another task
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 1_001);
        assert!((s.max_us - 5_000_000.0).abs() / 5_000_000.0 < 0.001, "max {}", s.max_us);
        assert!((s.p50_us - 500.0).abs() / 500.0 < 0.01, "p50 {}", s.p50_us);
        assert!(s.p99_us < 1_001.0, "p99 {}", s.p99_us);
        assert!(s.p9999_us > 1_000_000.0, "the stall is in p99.99: {}", s.p9999_us);
        assert_eq!(s.curve.last().map(|p| p.0), Some(100.0));
        assert!(s.curve.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "curve is monotone");
    }

    #[test]
    fn merge_of_empty_is_identity_and_huge_values_clamp() {
        let mut a = LatencyHist::new();
        a.merge(&LatencyHist::new());
        assert_eq!(a.summary(), LatencySummary::default());
        a.record_ns(u64::MAX);
        a.record_ns(0);
        assert_eq!(a.count(), 2);
        assert!(a.summary().max_us >= LATENCY_NS_MAX as f64 / 1_000.0 * 0.999);
    }
}
