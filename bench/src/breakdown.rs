//! The latency breakdown (issue 14.6): where a record's time goes between
//! its intended send and its acknowledgement or its consumer, from
//! timestamps.
//!
//! - The client's steps, per measured message, from the instants the client
//!   reports with each delivery (`RecordMetadata::{sealed_at,
//!   requested_at, acknowledged_at}`): `accumulate` (intended send -> batch
//!   sealed), `slot_wait` (sealed -> request handed to the connection),
//!   `round_trip` (handed over -> acknowledgement taken). They add up to the
//!   publish latency of each message exactly.
//! - The broker's stages, from its `shardlog_stage_duration_seconds`
//!   histograms (`/metrics`, quarter-octave buckets) scraped at the start and
//!   the end of the measured window and subtracted: `produce_in`,
//!   `write_queue`, `write`, `produce_out` (per record) and `fetch_wake` (per
//!   fetch woken by new data). They are distributions of the same records,
//!   not a per-record join: means add up, percentiles do not.
//! - The write pattern the disk saw in the window (O_DIRECT writes and their
//!   bytes), replayed by fio after the run at the same block size and rate:
//!   the floor the issue compares e2e p99 against.

use crate::hist::LatencyHist;
use crate::sched::ClientSteps;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a report keeps of the breakdown of one repetition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// `accumulate`, `slot_wait`, `round_trip`: every measured message.
    pub client: Vec<StepSummary>,
    /// The broker's stages over the window, all shards together.
    pub broker: Vec<StepSummary>,
    /// The broker's O_DIRECT writes over the window.
    pub writes: Option<WritePattern>,
    /// fio replaying that pattern after the run (`None`: no fio, or not run).
    pub fio: Option<FioPattern>,
}

/// One step's distribution, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    pub step: String,
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WritePattern {
    pub writes: u64,
    pub bytes: u64,
    pub secs: f64,
}

impl WritePattern {
    /// The mean write, rounded up to 4 KiB (fio's block size for it).
    #[must_use]
    pub fn block_bytes(&self) -> u64 {
        let mean = self.bytes.checked_div(self.writes).unwrap_or(0);
        mean.div_ceil(4096).max(1) * 4096
    }

    #[must_use]
    pub fn bytes_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// fio's completion latency for the broker's write pattern.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FioPattern {
    pub block_bytes: u64,
    pub rate_bytes_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub method: String,
}

impl StepSummary {
    fn of_hist(step: &str, h: &LatencyHist) -> StepSummary {
        let s = h.summary();
        StepSummary {
            step: step.into(),
            count: s.count,
            mean_us: s.mean_us,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            p999_us: s.p999_us,
        }
    }
}

/// The client's steps as report rows.
#[must_use]
pub fn client_rows(steps: &ClientSteps) -> Vec<StepSummary> {
    vec![
        StepSummary::of_hist("accumulate", &steps.accumulate),
        StepSummary::of_hist("slot_wait", &steps.slot_wait),
        StepSummary::of_hist("round_trip", &steps.round_trip),
    ]
}

/// The broker's figures at one instant, all shards summed.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Per stage: cumulative count per upper bound in ns (`u64::MAX`: +Inf).
    stages: BTreeMap<String, BTreeMap<u64, u64>>,
    sums_s: BTreeMap<String, f64>,
    writes: u64,
    write_bytes: u64,
    at: Option<Instant>,
}

/// `GET /metrics` from the broker's admin listener.
pub fn scrape(admin: &str) -> anyhow::Result<Scrape> {
    let mut s = std::net::TcpStream::connect(admin).with_context(|| format!("connect {admin}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map_or(text.as_str(), |(_, b)| b);
    let mut scrape = parse(body);
    scrape.at = Some(Instant::now());
    Ok(scrape)
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Parses the families the breakdown needs from Prometheus text.
#[must_use]
pub fn parse(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(v) = value.parse::<f64>() else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        match name {
            "shardlog_stage_duration_seconds_bucket" => {
                let (Some(stage), Some(le)) = (label(labels, "stage"), label(labels, "le")) else { continue };
                let bound = if le == "+Inf" {
                    u64::MAX
                } else {
                    match le.parse::<f64>() {
                        Ok(x) => (x * 1e9).round() as u64,
                        Err(_) => continue,
                    }
                };
                *s.stages.entry(stage.into()).or_default().entry(bound).or_default() += v as u64;
            }
            "shardlog_stage_duration_seconds_sum" => {
                let Some(stage) = label(labels, "stage") else { continue };
                *s.sums_s.entry(stage.into()).or_default() += v;
            }
            "shardlog_log_writes_total" => s.writes += v as u64,
            "shardlog_log_write_bytes_total" => s.write_bytes += v as u64,
            _ => {}
        }
    }
    s
}

/// The broker's stages and writes between two scrapes.
#[must_use]
pub fn between(before: &Scrape, after: &Scrape) -> (Vec<StepSummary>, WritePattern) {
    let mut rows = Vec::new();
    for (stage, buckets) in &after.stages {
        let earlier = before.stages.get(stage);
        // Per-bucket (not cumulative) counts over the window.
        let mut prev = 0u64;
        let counts: Vec<(u64, u64)> = buckets
            .iter()
            .map(|(bound, cum)| {
                let cum = cum.saturating_sub(earlier.and_then(|e| e.get(bound)).copied().unwrap_or(0));
                let n = cum.saturating_sub(prev);
                prev = cum;
                (*bound, n)
            })
            .collect();
        let total: u64 = counts.iter().map(|(_, n)| n).sum();
        let sum_s = after.sums_s.get(stage).copied().unwrap_or(0.0)
            - before.sums_s.get(stage).copied().unwrap_or(0.0);
        rows.push(StepSummary {
            step: stage.clone(),
            count: total,
            mean_us: if total > 0 { sum_s * 1e6 / total as f64 } else { 0.0 },
            p50_us: quantile_us(&counts, total, 0.5),
            p99_us: quantile_us(&counts, total, 0.99),
            p999_us: quantile_us(&counts, total, 0.999),
        });
    }
    // The data path's order, not the alphabet's.
    let order = ["produce_in", "write_queue", "write", "produce_out", "fetch_wake"];
    rows.sort_by_key(|r| order.iter().position(|o| *o == r.step).unwrap_or(order.len()));
    let secs = match (before.at, after.at) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let writes = WritePattern {
        writes: after.writes.saturating_sub(before.writes),
        bytes: after.write_bytes.saturating_sub(before.write_bytes),
        secs,
    };
    (rows, writes)
}

/// The `q` quantile of bucketed counts (upper bounds in ns), interpolated
/// linearly inside its bucket; in the +Inf bucket, the last finite bound.
fn quantile_us(counts: &[(u64, u64)], total: u64, q: f64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let (mut seen, mut lower) = (0u64, 0u64);
    for &(upper, n) in counts {
        if n > 0 && (seen + n) as f64 >= rank {
            if upper == u64::MAX {
                return lower as f64 / 1e3;
            }
            let within = (rank - seen as f64).max(0.0) / n as f64;
            return (lower as f64 + (upper - lower) as f64 * within) / 1e3;
        }
        seen += n;
        if upper != u64::MAX {
            lower = upper;
        }
    }
    lower as f64 / 1e3
}

/// fio's completion latency for the broker's write pattern (issue 14.6's
/// floor): O_DIRECT sequential writes of `pattern`'s mean size at its rate,
/// io_uring, one in flight, for `secs`, into a file under `dir`. The file is
/// new and sized for the whole run (fio preallocates it, as the broker does
/// its segments), so every write lands on fresh blocks as the broker's do:
/// a file that wraps would have fio overwrite written blocks, which ext4
/// completes faster (no unwritten-extent conversion; p50 45 against 77 us
/// at 80 KB and 430 MB/s here).
pub fn fio_write_pattern(dir: &Path, pattern: &WritePattern, secs: u64) -> anyhow::Result<FioPattern> {
    let (bs, rate) = (pattern.block_bytes(), pattern.bytes_per_s().ceil() as u64);
    anyhow::ensure!(rate > 0, "the broker wrote nothing in the window");
    let file = dir.join(format!(".shardlog-bench-fio-pattern-{}", std::process::id()));
    let args = vec![
        "--name=pattern".to_string(),
        format!("--filename={}", file.display()),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--rw=write".into(),
        format!("--bs={bs}"),
        "--iodepth=1".into(),
        format!("--rate={rate}"),
        format!("--size={}", (rate * secs).div_ceil(1 << 20).max(64) << 20),
        format!("--runtime={secs}"),
        "--percentile_list=50:99:99.9".into(),
    ];
    let result = crate::limits::fio(&args);
    if let Err(e) = std::fs::remove_file(&file) {
        eprintln!("shardlog-bench: cannot remove {}: {e}", file.display());
    }
    let j = result?;
    let p = &crate::limits::fio_job(&j)?["write"]["clat_ns"]["percentile"];
    let us = |k: &str| p[k].as_f64().map(|ns| ns / 1e3).with_context(|| format!("fio clat {k}"));
    Ok(FioPattern {
        block_bytes: bs,
        rate_bytes_per_s: rate as f64,
        p50_us: us("50.000000")?,
        p99_us: us("99.000000")?,
        p999_us: us("99.900000")?,
        method: format!("fio {} --output-format=json: write.clat_ns", args.join(" ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE shardlog_stage_duration_seconds histogram
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"0.00001\"} 0
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"0.00002\"} 10
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"+Inf\"} 10
shardlog_stage_duration_seconds_sum{shard=\"0\",stage=\"write\"} 0.00015
shardlog_log_writes_total{shard=\"0\"} 4
shardlog_log_write_bytes_total{shard=\"0\"} 16384
";

    const AFTER: &str = "\
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"0.00001\"} 0
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"0.00002\"} 60
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"write\",le=\"+Inf\"} 110
shardlog_stage_duration_seconds_sum{shard=\"0\",stage=\"write\"} 0.05015
shardlog_stage_duration_seconds_bucket{shard=\"1\",stage=\"write\",le=\"0.00001\"} 0
shardlog_stage_duration_seconds_bucket{shard=\"1\",stage=\"write\",le=\"0.00002\"} 0
shardlog_stage_duration_seconds_bucket{shard=\"1\",stage=\"write\",le=\"+Inf\"} 0
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"produce_in\",le=\"0.00001\"} 2
shardlog_stage_duration_seconds_bucket{shard=\"0\",stage=\"produce_in\",le=\"+Inf\"} 2
shardlog_log_writes_total{shard=\"0\"} 14
shardlog_log_write_bytes_total{shard=\"0\"} 16384
shardlog_log_write_bytes_total{shard=\"1\"} 90000
";

    #[test]
    fn the_window_is_the_difference_of_two_scrapes_over_all_shards() {
        let (mut b, mut a) = (parse(BEFORE), parse(AFTER));
        let t = Instant::now();
        (b.at, a.at) = (Some(t), Some(t + Duration::from_secs(2)));
        let (rows, writes) = between(&b, &a);
        assert_eq!(rows.iter().map(|r| r.step.as_str()).collect::<Vec<_>>(), ["produce_in", "write"]);
        let w = &rows[1];
        assert_eq!(w.count, 100, "110 - 10 records");
        assert!((w.mean_us - 500.0).abs() < 1e-6, "(0.05015 - 0.00015) s / 100 = 500 us: {}", w.mean_us);
        // 50 in (10, 20] us, 50 beyond: the median is the top of the first.
        assert!((w.p50_us - 20.0).abs() < 1e-9, "{}", w.p50_us);
        assert!((w.p99_us - 20.0).abs() < 1e-9, "+Inf bucket: the last finite bound");
        assert_eq!(rows[0].count, 2);
        assert_eq!(writes, WritePattern { writes: 10, bytes: 90_000, secs: 2.0 });
        assert_eq!(writes.block_bytes(), 12_288, "9,000 B a write, rounded up to 4 KiB");
        assert!((writes.bytes_per_s() - 45_000.0).abs() < 1e-9);
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket() {
        // 100 records in (1000, 2000] ns.
        let counts = [(1_000, 0), (2_000, 100), (u64::MAX, 0)];
        assert!((quantile_us(&counts, 100, 0.5) - 1.5).abs() < 1e-9);
        assert!((quantile_us(&counts, 100, 0.99) - 1.99).abs() < 1e-9);
        assert_eq!(quantile_us(&counts, 0, 0.5), 0.0);
    }
}
