//! The typed report of one workload run (all its repetitions), its files in
//! `perf-reports/`, and the `index.ndjson` line that points at it.
//!
//! ```text
//! perf-reports/
//!   <date>-<sha>-<workload>.json            Report (this module's types)
//!   <date>-<sha>-<workload>.md              Markdown summary
//!   <date>-<sha>-<workload>-throughput.svg  per-second rates (median repetition)
//!   <date>-<sha>-<workload>-latency.svg     latency percentile curves
//!   index.ndjson                            one IndexLine per run, append-only
//! ```

use crate::env::{Environment, MachineSummary, ProcSample, ProcSummary};
use crate::hist::LatencySummary;
use crate::limits::Limits;
use crate::order::OrderSummary;
use crate::workload::Workload;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bumped when a field changes meaning or disappears (adding is compatible).
pub const REPORT_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub tool: String,
    pub started_at_unix_s: u64,
    /// UTC date, `YYYY-MM-DD`.
    pub date: String,
    pub quick: bool,
    pub environment: Environment,
    pub limits: Option<Limits>,
    pub broker: BrokerInfo,
    pub load_generator: LoadGenInfo,
    pub workload: Workload,
    pub repetitions: Vec<RunResult>,
    pub aggregate: Aggregate,
    pub ratios: Ratios,
    /// `Some(why)` when a repetition broke order (`crate::order`): the run's
    /// figures are not a result. `None`: valid (or, in reports older than
    /// the check, not checked: their repetitions have no `order`).
    #[serde(default)]
    pub invalid: Option<String>,
}

/// Why a run is invalid, if it is: every repetition with order violations.
#[must_use]
pub fn invalid_reason(runs: &[RunResult]) -> Option<String> {
    let bad: Vec<String> = runs
        .iter()
        .filter_map(|r| r.order.filter(|o| o.violations > 0).map(|o| (r.repetition, o)))
        .map(|(rep, o)| format!("repetition {rep}: {}", o.describe()))
        .collect();
    (!bad.is_empty()).then(|| bad.join("; "))
}

/// How the broker under test was run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BrokerInfo {
    /// `spawned` or `external`.
    pub mode: String,
    pub bootstrap: String,
    pub binary: Option<String>,
    pub args: Vec<String>,
    pub cpus: Option<String>,
    pub data_dir: Option<String>,
    pub shard_ports: Vec<u16>,
    /// Topic configs the workload created its topics with.
    pub topic_configs: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadGenInfo {
    pub cpus: Option<String>,
    pub threads: usize,
}

/// Messages and bytes over the measurement window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub msgs: u64,
    pub bytes: u64,
    pub window_s: f64,
    pub msgs_per_s: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
}

impl Throughput {
    #[must_use]
    pub fn new(msgs: u64, bytes: u64, window_s: f64) -> Throughput {
        let w = window_s.max(1e-9);
        Throughput { msgs, bytes, window_s, msgs_per_s: msgs as f64 / w, mb_per_s: bytes as f64 / w / 1e6 }
    }
}

/// Per-second series over the whole run, warm-up included (index = second).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub warmup_s: u64,
    pub sent_msgs: Vec<u64>,
    pub sent_bytes: Vec<u64>,
    pub acked_msgs: Vec<u64>,
    pub recv_msgs: Vec<u64>,
    pub recv_bytes: Vec<u64>,
}

/// The backlog phase of a drain workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BacklogResult {
    pub write: Throughput,
    pub drain: Throughput,
}

/// One repetition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub repetition: u32,
    /// `closed-loop` or `open-loop`.
    pub mode: String,
    /// Open loop: the fixed rate, msgs/s over all producers.
    pub target_rate_msgs_per_s: Option<f64>,
    /// The closed-loop probe that set the rate, if any.
    pub probed_max_msgs_per_s: Option<f64>,
    pub publish: Throughput,
    pub consume: Throughput,
    pub send_errors: u64,
    pub publish_latency: LatencySummary,
    pub e2e_latency: LatencySummary,
    pub backlog: Option<BacklogResult>,
    pub series: Series,
    pub broker_samples: Vec<ProcSample>,
    pub broker: ProcSummary,
    pub load_generator: ProcSummary,
    /// The whole machine's idle and stolen CPU over the window; `None` in
    /// older reports.
    #[serde(default)]
    pub machine: Option<MachineSummary>,
    /// Broker CPU seconds per GB published plus consumed.
    pub broker_cpu_s_per_gb: Option<f64>,
    /// The consumers' order check; `None` only in reports older than it.
    #[serde(default)]
    pub order: Option<OrderSummary>,
    /// Open-loop runs against a broker with an admin listener: where the
    /// latency goes (`breakdown`); `None` otherwise and in older reports.
    #[serde(default)]
    pub breakdown: Option<crate::breakdown::Breakdown>,
}

/// min / median / max over repetitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Stat {
    #[must_use]
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let median =
            if v.len() % 2 == 1 { v[v.len() / 2] } else { (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0 };
        Stat { min: v[0], median, max: v[v.len() - 1] }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub repetitions: u32,
    pub publish_msgs_per_s: Stat,
    pub publish_mb_per_s: Stat,
    pub consume_msgs_per_s: Stat,
    pub consume_mb_per_s: Stat,
    pub publish_p50_us: Stat,
    pub publish_p99_us: Stat,
    pub publish_p999_us: Stat,
    pub publish_p9999_us: Stat,
    pub publish_max_us: Stat,
    pub e2e_p50_us: Stat,
    pub e2e_p99_us: Stat,
    pub e2e_p999_us: Stat,
    pub e2e_p9999_us: Stat,
    pub e2e_max_us: Stat,
    pub drain_mb_per_s: Option<Stat>,
    pub broker_rss_bytes_max: Stat,
    pub broker_cpu_s_per_gb: Stat,
    /// Index of the repetition whose publish rate is the median (plots).
    pub median_repetition: usize,
    /// Order violations summed over the repetitions; `None`: not checked.
    #[serde(default)]
    pub order_violations: Option<u64>,
}

impl Aggregate {
    #[must_use]
    pub fn of(runs: &[RunResult]) -> Aggregate {
        let s = |f: &dyn Fn(&RunResult) -> f64| Stat::of(runs.iter().map(f));
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by(|&a, &b| runs[a].publish.msgs_per_s.total_cmp(&runs[b].publish.msgs_per_s));
        let drains: Vec<f64> = runs.iter().filter_map(|r| r.backlog.map(|b| b.drain.mb_per_s)).collect();
        Aggregate {
            repetitions: runs.len() as u32,
            publish_msgs_per_s: s(&|r| r.publish.msgs_per_s),
            publish_mb_per_s: s(&|r| r.publish.mb_per_s),
            consume_msgs_per_s: s(&|r| r.consume.msgs_per_s),
            consume_mb_per_s: s(&|r| r.consume.mb_per_s),
            publish_p50_us: s(&|r| r.publish_latency.p50_us),
            publish_p99_us: s(&|r| r.publish_latency.p99_us),
            publish_p999_us: s(&|r| r.publish_latency.p999_us),
            publish_p9999_us: s(&|r| r.publish_latency.p9999_us),
            publish_max_us: s(&|r| r.publish_latency.max_us),
            e2e_p50_us: s(&|r| r.e2e_latency.p50_us),
            e2e_p99_us: s(&|r| r.e2e_latency.p99_us),
            e2e_p999_us: s(&|r| r.e2e_latency.p999_us),
            e2e_p9999_us: s(&|r| r.e2e_latency.p9999_us),
            e2e_max_us: s(&|r| r.e2e_latency.max_us),
            drain_mb_per_s: (!drains.is_empty()).then(|| Stat::of(drains)),
            broker_rss_bytes_max: s(&|r| r.broker.rss_bytes_max as f64),
            broker_cpu_s_per_gb: s(&|r| r.broker_cpu_s_per_gb.unwrap_or(f64::NAN)),
            median_repetition: order.get(order.len() / 2).copied().unwrap_or(0),
            order_violations: runs.iter().map(|r| r.order.map(|o| o.violations)).sum(),
        }
    }
}

/// Median figures as fractions of the machine's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub publish_vs_disk_write: Option<f64>,
    pub consume_vs_disk_read: Option<f64>,
    pub consume_vs_loopback: Option<f64>,
    pub drain_vs_disk_read: Option<f64>,
    pub publish_vs_memcpy: Option<f64>,
}

impl Ratios {
    #[must_use]
    pub fn of(a: &Aggregate, l: Option<&Limits>) -> Ratios {
        let Some(l) = l else { return Ratios::default() };
        let r = |mb: f64, lim: Option<f64>| lim.filter(|x| *x > 0.0).map(|x| mb * 1e6 / x);
        Ratios {
            publish_vs_disk_write: r(a.publish_mb_per_s.median, l.disk_write_bytes_per_s),
            consume_vs_disk_read: r(a.consume_mb_per_s.median, l.disk_read_bytes_per_s),
            consume_vs_loopback: r(a.consume_mb_per_s.median, l.loopback_bytes_per_s),
            drain_vs_disk_read: a.drain_mb_per_s.and_then(|d| r(d.median, l.disk_read_bytes_per_s)),
            publish_vs_memcpy: r(a.publish_mb_per_s.median, l.memcpy_bytes_per_s),
        }
    }
}

/// One line of `index.ndjson`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexLine {
    pub date: String,
    pub started_at_unix_s: u64,
    pub git_sha: String,
    pub git_dirty: bool,
    pub build_profile: String,
    pub workload: String,
    pub quick: bool,
    pub repetitions: u32,
    pub report: String,
    pub publish_msgs_per_s: f64,
    pub publish_mb_per_s: f64,
    pub consume_mb_per_s: f64,
    pub publish_p99_us: f64,
    pub publish_p999_us: f64,
    pub e2e_p99_us: f64,
    pub e2e_p999_us: f64,
    pub drain_mb_per_s: Option<f64>,
    pub broker_rss_bytes_max: f64,
    pub ratios: Ratios,
    pub mode: String,
    /// `None` in lines older than the order check.
    #[serde(default)]
    pub order_violations: Option<u64>,
    /// The report says the run is not a result (order violations).
    #[serde(default)]
    pub invalid: bool,
}

impl Report {
    /// File stem `<date>-<sha>-<workload>`, with `-N` added when a report of
    /// that name exists already (reports are append-only).
    #[must_use]
    pub fn file_stem(&self, dir: &Path) -> String {
        let base = format!(
            "{}-{}-{}{}",
            self.date,
            self.environment.git_sha,
            self.workload.name,
            if self.quick { "-quick" } else { "" }
        );
        let mut stem = base.clone();
        let mut n = 2;
        while dir.join(format!("{stem}.json")).exists() {
            stem = format!("{base}-{n}");
            n += 1;
        }
        stem
    }

    #[must_use]
    pub fn index_line(&self, report_file: &str) -> IndexLine {
        let a = &self.aggregate;
        IndexLine {
            date: self.date.clone(),
            started_at_unix_s: self.started_at_unix_s,
            git_sha: self.environment.git_sha.clone(),
            git_dirty: self.environment.git_dirty,
            build_profile: self.environment.build_profile.clone(),
            workload: self.workload.name.clone(),
            quick: self.quick,
            repetitions: a.repetitions,
            report: report_file.to_owned(),
            publish_msgs_per_s: a.publish_msgs_per_s.median,
            publish_mb_per_s: a.publish_mb_per_s.median,
            consume_mb_per_s: a.consume_mb_per_s.median,
            publish_p99_us: a.publish_p99_us.median,
            publish_p999_us: a.publish_p999_us.median,
            e2e_p99_us: a.e2e_p99_us.median,
            e2e_p999_us: a.e2e_p999_us.median,
            drain_mb_per_s: a.drain_mb_per_s.map(|s| s.median),
            broker_rss_bytes_max: a.broker_rss_bytes_max.max,
            ratios: self.ratios,
            mode: self.repetitions.first().map(|r| r.mode.clone()).unwrap_or_default(),
            order_violations: a.order_violations,
            invalid: self.invalid.is_some(),
        }
    }

    /// Writes the JSON report, the Markdown summary and the plots, and
    /// appends the index line. Returns the JSON path.
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let stem = self.file_stem(dir);
        let json_path = dir.join(format!("{stem}.json"));
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(&json_path, json).with_context(|| format!("write {}", json_path.display()))?;
        let plots = crate::plot::write_plots(self, dir, &stem)?;
        let md = crate::summary::report_markdown(self, &plots);
        std::fs::write(dir.join(format!("{stem}.md")), md)?;
        let line = serde_json::to_string(&self.index_line(&format!("{stem}.json")))?;
        let index = dir.join("index.ndjson");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&index)
            .with_context(|| format!("open {}", index.display()))?;
        writeln!(f, "{line}")?;
        f.sync_all().with_context(|| format!("fsync {}", index.display()))?;
        Ok(json_path)
    }
}

/// `YYYY-MM-DD` (UTC) of a Unix time (Howard Hinnant's civil_from_days).
#[must_use]
pub fn utc_date(unix_s: u64) -> String {
    let z = (unix_s / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Reads and checks a report file (used by the smoke test and `validate`).
pub fn load_and_validate(path: &Path) -> anyhow::Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let r: Report = serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    anyhow::ensure!(r.schema_version == REPORT_SCHEMA_VERSION, "schema version {}", r.schema_version);
    anyhow::ensure!(!r.repetitions.is_empty(), "no repetitions");
    anyhow::ensure!(r.aggregate.repetitions as usize == r.repetitions.len(), "aggregate count");
    if let Some(why) = &r.invalid {
        anyhow::bail!("INVALID run: {why}");
    }
    for run in &r.repetitions {
        anyhow::ensure!(run.publish.msgs > 0, "repetition {} published nothing", run.repetition);
        anyhow::ensure!(
            run.send_errors == 0,
            "repetition {} had {} send errors",
            run.repetition,
            run.send_errors
        );
        anyhow::ensure!(run.publish_latency.count > 0, "no publish latency recorded");
        if let Some(o) = &run.order {
            anyhow::ensure!(
                o.violations == 0,
                "repetition {}: {} (the report does not say INVALID)",
                run.repetition,
                o.describe()
            );
        }
        let l = &run.publish_latency;
        anyhow::ensure!(
            l.p50_us <= l.p99_us && l.p99_us <= l.p999_us && l.p999_us <= l.max_us,
            "percentiles"
        );
    }
    Ok(r)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::hist::LatencyHist;

    pub fn sample_report() -> Report {
        let mut h = LatencyHist::new();
        for i in 1..=10_000u64 {
            h.record_ns(i * 10_000);
        }
        let run = |rep: u32, rate: f64| RunResult {
            repetition: rep,
            mode: "closed-loop".into(),
            publish: Throughput::new((rate * 10.0) as u64, (rate * 10_240.0) as u64, 10.0),
            consume: Throughput::new((rate * 10.0) as u64, (rate * 10_240.0) as u64, 10.0),
            publish_latency: h.summary(),
            e2e_latency: h.summary(),
            series: Series {
                warmup_s: 1,
                sent_msgs: vec![1, 2, 3],
                sent_bytes: vec![10, 20, 30],
                ..Series::default()
            },
            broker_samples: vec![ProcSample {
                t_s: 1.0,
                rss_bytes: 1 << 20,
                cpu_user_s: 0.5,
                cpu_sys_s: 0.25,
            }],
            broker_cpu_s_per_gb: Some(1.5),
            order: Some(OrderSummary { checked_records: (rate * 10.0) as u64, ..OrderSummary::default() }),
            ..RunResult::default()
        };
        let runs = vec![run(0, 1_000.0), run(1, 3_000.0), run(2, 2_000.0)];
        let aggregate = Aggregate::of(&runs);
        let limits = Limits { disk_write_bytes_per_s: Some(100e6), ..Limits::default() };
        Report {
            schema_version: REPORT_SCHEMA_VERSION,
            tool: "shardlog-bench".into(),
            started_at_unix_s: 1_700_000_000,
            date: utc_date(1_700_000_000),
            quick: false,
            environment: Environment { git_sha: "abc123".into(), ..Environment::default() },
            ratios: Ratios::of(&aggregate, Some(&limits)),
            limits: Some(limits),
            broker: BrokerInfo { mode: "spawned".into(), ..BrokerInfo::default() },
            load_generator: LoadGenInfo { cpus: Some("1".into()), threads: 2 },
            workload: toml::from_str("name = \"w\"\nmessage_size = 1024\n").unwrap(),
            repetitions: runs,
            aggregate,
            invalid: None,
        }
    }

    /// The sample with one repetition that reordered two records.
    pub fn invalid_sample_report() -> Report {
        let mut r = sample_report();
        let o = r.repetitions[1].order.as_mut().unwrap();
        (o.decreases, o.violations) = (2, 2);
        r.aggregate = Aggregate::of(&r.repetitions);
        r.invalid = invalid_reason(&r.repetitions);
        r
    }

    #[test]
    fn report_round_trips_through_json_and_validates() {
        let r = sample_report();
        let json = serde_json::to_string_pretty(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(r, back);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, json).unwrap();
        load_and_validate(&p).unwrap();
    }

    #[test]
    fn order_violations_make_the_report_invalid_and_fail_validation() {
        let good = sample_report();
        assert_eq!(good.aggregate.order_violations, Some(0));
        assert_eq!(good.invalid, None);
        let r = invalid_sample_report();
        assert_eq!(r.aggregate.order_violations, Some(2));
        let why = r.invalid.clone().unwrap();
        assert!(why.starts_with("repetition 1: 2 order violations (2 decreases"), "{why}");
        let line = r.index_line("x.json");
        assert_eq!((line.order_violations, line.invalid), (Some(2), true));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, serde_json::to_string(&r).unwrap()).unwrap();
        let err = load_and_validate(&p).unwrap_err().to_string();
        assert!(err.contains("INVALID") && err.contains("2 order violations"), "{err}");
    }

    #[test]
    fn reports_and_index_lines_from_before_the_order_check_still_parse() {
        let mut v = serde_json::to_value(sample_report()).unwrap();
        v.as_object_mut().unwrap().remove("invalid");
        v["aggregate"].as_object_mut().unwrap().remove("order_violations");
        for run in v["repetitions"].as_array_mut().unwrap() {
            run.as_object_mut().unwrap().remove("order");
        }
        let old: Report = serde_json::from_value(v).unwrap();
        assert_eq!((old.invalid, old.aggregate.order_violations), (None, None));
        assert_eq!(Aggregate::of(&old.repetitions).order_violations, None, "not checked, not 0");
        let mut line = serde_json::to_value(sample_report().index_line("x.json")).unwrap();
        line.as_object_mut().unwrap().remove("order_violations");
        line.as_object_mut().unwrap().remove("invalid");
        let old: IndexLine = serde_json::from_value(line).unwrap();
        assert_eq!((old.order_violations, old.invalid), (None, false));
    }

    #[test]
    fn aggregate_takes_min_median_max_and_ratios() {
        let r = sample_report();
        let a = &r.aggregate;
        assert_eq!(a.publish_msgs_per_s, Stat { min: 1_000.0, median: 2_000.0, max: 3_000.0 });
        assert_eq!(a.median_repetition, 2);
        // 2,000 msgs/s * 1,024 B = 2.048 MB/s of a 100 MB/s disk.
        assert!((r.ratios.publish_vs_disk_write.unwrap() - 0.02048).abs() < 1e-9);
        assert_eq!(Stat::of([4.0, 1.0]).median, 2.5);
    }

    #[test]
    fn write_produces_json_markdown_plots_and_one_index_line_per_run() {
        let dir = tempfile::tempdir().unwrap();
        let r = sample_report();
        let p1 = r.write(dir.path()).unwrap();
        let p2 = r.write(dir.path()).unwrap();
        assert_ne!(p1, p2, "a second run never overwrites the first");
        assert!(p1.file_name().unwrap().to_str().unwrap().starts_with("2023-11-14-abc123-w"));
        let index = std::fs::read_to_string(dir.path().join("index.ndjson")).unwrap();
        let lines: Vec<IndexLine> = index.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].publish_msgs_per_s, 2_000.0);
        let stem = p1.file_stem().unwrap().to_str().unwrap();
        let svg = std::fs::read_to_string(dir.path().join(format!("{stem}-latency.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("polyline"), "latency plot has curves");
        let md = std::fs::read_to_string(dir.path().join(format!("{stem}.md"))).unwrap();
        assert!(md.contains("p99.9") && md.contains(&format!("{stem}-throughput.svg")));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14");
    }
}
