//! `shardlog-bench`: the end-to-end benchmark harness.
//!
//! ```text
//! shardlog-bench run WORKLOAD.toml... [--spawn-broker | --bootstrap HOST:PORT] [--quick] [-n 3]
//! shardlog-bench limits [--quick]          # fio, iperf3, memcpy -> perf-reports/limits/
//! shardlog-bench readme                    # regenerate the table in perf-reports/README.md
//! shardlog-bench validate REPORT.json      # check a report (CI smoke run)
//! shardlog-bench groups --out perf-reports # rebalance, commits/s, offsets compaction
//! shardlog-bench cluster --out perf-reports # metadata propagation, controller failover, 3 brokers vs 1
//! shardlog-bench recovery --out perf-reports # ready time after SIGTERM / SIGKILL, with and without recovery points
//! ```
//!
//! Module map, in the order a run uses them: `workload` (TOML) → `broker`
//! (spawn) → `runner` (client tasks, phases) built on `sched` (open/closed
//! loop timing, ack collection), `hist` (latency) and `order` (sequence
//! numbers in the payload, checked by every consumer) → `env` (machine,
//! /proc sampling) and `limits` → `report` (typed JSON, index) → `plot`,
//! `summary` (SVG, Markdown).

mod breakdown;
mod broker;
mod cluster;
mod env;
mod groups;
mod hist;
mod limits;
mod order;
mod pacer;
mod plot;
mod recovery;
mod replication;
mod report;
mod runner;
mod sched;
mod summary;
mod workload;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(name = "shardlog-bench", version, about = "Shardlog benchmark harness")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run workloads and write reports.
    Run(Box<RunArgs>),
    /// Measure the machine's limits (fio, iperf3, memcpy) and save them.
    Limits(LimitsArgs),
    /// Regenerate the table of perf-reports/README.md from index.ndjson.
    Readme(ReadmeArgs),
    /// Check that a report file parses and holds sane results.
    Validate { report: PathBuf },
    /// Consumer-group benchmarks: rebalance time, commits per second,
    /// compaction of the offsets topic.
    Groups(groups::GroupsArgs),
    /// Cluster benchmarks (ZooKeeper): metadata propagation, controller
    /// failover, produce throughput of 3 brokers against 1.
    Cluster(cluster::ClusterArgs),
    /// Replication benchmarks (ZooKeeper): RF 1 against RF 3 with acks=1
    /// and acks=all, acknowledgement latency, follower catch-up.
    Replication(replication::ReplicationArgs),
    /// Recovery time after a clean stop and after SIGKILL, with and without
    /// recovery points, against data size and partition count.
    Recovery(recovery::RecoveryArgs),
}

/// Options of `run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Workload TOML files (bench/workloads/*.toml).
    #[arg(required = true)]
    pub workloads: Vec<PathBuf>,
    /// Use each workload's `[quick]` overrides (short runs).
    #[arg(long)]
    pub quick: bool,
    /// Repetitions per workload; the report gives min / median / max.
    #[arg(short = 'n', long, default_value_t = 3)]
    pub repetitions: u32,
    /// A running broker's public address.
    #[arg(long, conflicts_with = "spawn_broker")]
    pub bootstrap: Option<String>,
    /// PID of the `--bootstrap` broker, to sample its RSS and CPU time.
    #[arg(long, requires = "bootstrap")]
    pub broker_pid: Option<u32>,
    /// Start a fresh broker for every repetition.
    #[arg(long)]
    pub spawn_broker: bool,
    /// The `shardlog` binary (default: next to this binary).
    #[arg(long)]
    pub broker_bin: Option<PathBuf>,
    /// `--shards N` for the spawned broker.
    #[arg(long)]
    pub shards: Option<u32>,
    /// Extra argument for `shardlog serve` (repeatable), e.g. `--broker-arg=--admin-listen=127.0.0.1:0`.
    #[arg(long = "broker-arg", allow_hyphen_values = true)]
    pub broker_args: Vec<String>,
    /// Pin the spawned broker with `taskset -c LIST`.
    #[arg(long)]
    pub broker_cpus: Option<String>,
    /// Pin the load generator's threads to these CPUs (`0-1,3`).
    #[arg(long)]
    pub bench_cpus: Option<String>,
    /// Tokio worker threads of the load generator (default: CPUs it may use).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Record the latency breakdown (client steps, broker stage histograms)
    /// in closed-loop runs too; open-loop runs always record it. It costs a
    /// few clock reads per batch and two `/metrics` scrapes.
    #[arg(long)]
    pub breakdown: bool,
    /// Parent directory of the spawned brokers' data directories.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the spawned broker's data directory after the run.
    #[arg(long)]
    pub keep_data: bool,
    /// Where reports go.
    #[arg(long, default_value_os_t = default_reports_dir())]
    pub out: PathBuf,
    /// Limits file to record (default: the newest in <out>/limits/).
    #[arg(long, conflicts_with = "measure_limits")]
    pub limits: Option<PathBuf>,
    /// Measure the limits now, before the workloads (and save them).
    #[arg(long)]
    pub measure_limits: bool,
    /// Override every workload's duration (seconds).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Print the report path but do not update README.md.
    #[arg(long)]
    pub no_readme: bool,
}

#[derive(Args, Debug)]
struct LimitsArgs {
    /// Directory on the disk to measure (default: the reports' disk, i.e. the repo's target/).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_os_t = default_reports_dir())]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct ReadmeArgs {
    #[arg(long, default_value_os_t = default_reports_dir())]
    out: PathBuf,
}

/// The repository this binary was built from.
fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn default_reports_dir() -> PathBuf {
    repo_dir().join("perf-reports")
}

/// Workloads of the standard suite, in README order.
fn standard_workloads() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
                .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run(args) => runner::run_all(&args),
        Cmd::Limits(a) => {
            let dir = a.dir.unwrap_or_else(|| repo_dir().join("target"));
            let l = measure_and_save_limits(&dir, a.quick, &a.out)?;
            println!("{}", serde_json::to_string_pretty(&l)?);
            Ok(())
        }
        Cmd::Readme(a) => update_readme(&a.out),
        Cmd::Groups(a) => groups::run(&a),
        Cmd::Cluster(a) => cluster::run(&a),
        Cmd::Replication(a) => replication::run(&a),
        Cmd::Recovery(a) => recovery::run(&a),
        Cmd::Validate { report } => {
            let r = report::load_and_validate(&report)?;
            println!(
                "ok: {} ({} repetitions, publish median {:.0} msgs/s)",
                r.workload.name, r.aggregate.repetitions, r.aggregate.publish_msgs_per_s.median
            );
            Ok(())
        }
    }
}

/// Measures the limits with data on `dir`'s disk and writes them to
/// `<out>/limits/<date>-<sha>.json`.
pub fn measure_and_save_limits(dir: &Path, quick: bool, out: &Path) -> anyhow::Result<limits::Limits> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    eprintln!(
        "shardlog-bench: measuring machine limits on {} ({})",
        dir.display(),
        if quick { "quick" } else { "full" }
    );
    let plan = if quick { limits::LimitsPlan::QUICK } else { limits::LimitsPlan::FULL };
    let l = limits::measure(dir, plan, quick);
    let env = env::Environment::collect(None, dir);
    let ldir = out.join("limits");
    std::fs::create_dir_all(&ldir)?;
    let base = format!("{}-{}", report::utc_date(l.measured_at_unix_s), env.git_sha);
    let mut path = ldir.join(format!("{base}.json"));
    let mut n = 2;
    while path.exists() {
        path = ldir.join(format!("{base}-{n}.json"));
        n += 1;
    }
    let doc = serde_json::json!({ "environment": env, "limits": l });
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("write {}", path.display()))?;
    eprintln!("shardlog-bench: limits saved to {}", path.display());
    Ok(l)
}

/// The newest saved limits, if any.
pub fn latest_limits(out: &Path) -> anyhow::Result<Option<limits::Limits>> {
    let dir = out.join("limits");
    let Ok(rd) = std::fs::read_dir(&dir) else { return Ok(None) };
    let mut best: Option<(u64, PathBuf)> = None;
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let l = load_limits(&p)?;
            if best.as_ref().is_none_or(|(t, _)| l.measured_at_unix_s > *t) {
                best = Some((l.measured_at_unix_s, p));
            }
        }
    }
    best.map(|(_, p)| load_limits(&p)).transpose()
}

pub fn load_limits(path: &Path) -> anyhow::Result<limits::Limits> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let l = v.get("limits").cloned().unwrap_or(v);
    serde_json::from_value(l).with_context(|| format!("limits in {}", path.display()))
}

pub fn update_readme(out: &Path) -> anyhow::Result<()> {
    let index = out.join("index.ndjson");
    let text = match std::fs::read_to_string(&index) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("read {}", index.display())),
    };
    let mut lines = Vec::new();
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<report::IndexLine>(l) {
            Ok(line) => lines.push(line),
            Err(e) => eprintln!("shardlog-bench: {}:{}: skipped: {e}", index.display(), i + 1),
        }
    }
    let path = out.join("README.md");
    let readme = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Performance reports\n".to_owned(),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let table = summary::readme_table(&lines, &standard_workloads());
    std::fs::write(&path, summary::splice_readme(&readme, &table))
        .with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

/// Parses a CPU list such as `0-2,5`.
pub fn parse_cpu_list(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                if a > b {
                    bail!("bad CPU range {part}");
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse()?),
        }
    }
    if cpus.is_empty() {
        bail!("empty CPU list {s:?}");
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from([
            "shardlog-bench",
            "run",
            "a.toml",
            "--spawn-broker",
            "--broker-arg=--admin-listen=127.0.0.1:0",
            "--quick",
            "-n",
            "1",
        ])
        .unwrap();
        let Cmd::Run(r) = c.cmd else { panic!("run expected") };
        assert_eq!(r.broker_args, vec!["--admin-listen=127.0.0.1:0"]);
        assert!(Cli::try_parse_from([
            "shardlog-bench",
            "run",
            "a.toml",
            "--spawn-broker",
            "--bootstrap",
            "x:1"
        ])
        .is_err());
    }
}
