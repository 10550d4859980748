//! `shardlog-bench recovery`: how long a broker takes to be ready again
//! after a clean stop and after a crash, against the data it holds
//! (issue 15, "recovery time after a crash").
//!
//! For each `PARTITIONSxMIB` case a fresh broker gets a topic of that many
//! partitions and about that many MiB of 1 KB records in each (all in the
//! active segment: the topic's `segment.bytes` is set above the data). Once every partition's
//! recovery point has caught up with its data, the broker is restarted
//! `rounds` times in each of three ways, and the time from spawn to the
//! ready line is measured:
//!
//! 1. **clean**: SIGTERM; the next open trusts the clean-shutdown marker;
//! 2. **crash, recovery points**: SIGKILL; the open validates only the bytes
//!    after each partition's point (here: none, the points are current;
//!    in service, at most what one point interval wrote);
//! 3. **crash, no points**: SIGKILL and the `recovery.point` files deleted:
//!    the open scans every active segment whole (what every crash cost
//!    before the points).
//!
//! The full scan's rate is stated as a ratio to fio's sequential O_DIRECT
//! read measured in the same run. After the last restart every partition's
//! end offset must be what was produced.

use crate::broker::{self, Broker, SpawnOptions};
use crate::cluster::median;
use crate::env;
use anyhow::{bail, Context};
use clap::Args;
use shardlog_client::{Acks, Admin, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct RecoveryArgs {
    /// Cases as PARTITIONSxMIB (MiB of records per partition), comma-separated.
    #[arg(long, default_value = "1x1024,4x512,16x128,64x32", value_delimiter = ',')]
    cases: Vec<String>,
    /// Restarts measured per case and kind.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value_t = 1000)]
    record_bytes: usize,
    /// `--recovery-point-interval-ms` of the broker.
    #[arg(long, default_value_t = 1000)]
    point_interval_ms: u64,
    #[arg(long, default_value_t = 1)]
    shards: u32,
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    /// Parent of the brokers' data directories (default: the repo's
    /// target/, on the disk the reports measure).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where the Markdown and JSON reports go.
    #[arg(long)]
    out: PathBuf,
}

/// One case's figures.
#[derive(serde::Serialize)]
struct Case {
    partitions: u32,
    mib_per_partition: u64,
    records: u64,
    /// Bytes of the active segments (file sizes after a clean close).
    segment_bytes: u64,
    /// Bytes the recovery points covered when the broker was killed.
    trusted_bytes: u64,
    clean_ready_ms: Vec<f64>,
    crash_points_ready_ms: Vec<f64>,
    crash_full_scan_ready_ms: Vec<f64>,
}

fn parse_case(s: &str) -> anyhow::Result<(u32, u64)> {
    let (p, m) = s.split_once('x').with_context(|| format!("case {s:?} is not PARTITIONSxMIB"))?;
    Ok((p.trim().parse().context("partitions")?, m.trim().parse().context("MiB")?))
}

/// The files of the partitions' directories named `name` or ending in `.log`.
fn partition_files(data: &Path, topic: &str, partitions: u32, pick: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    (0..partitions)
        .flat_map(|p| std::fs::read_dir(data.join(format!("{topic}-{p}"))).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&pick))
        .collect()
}

/// Sum of the positions the partitions' recovery points name (the header:
/// magic, version, base, pos, all little-endian).
fn trusted_bytes(data: &Path, topic: &str, partitions: u32) -> u64 {
    partition_files(data, topic, partitions, |n| n == "recovery.point")
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter_map(|b| b.get(16..24).map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes"))))
        .sum()
}

fn segment_bytes(data: &Path, topic: &str, partitions: u32) -> u64 {
    partition_files(data, topic, partitions, |n| n.ends_with(".log"))
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

async fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    records: u64,
    bytes: usize,
) -> anyhow::Result<()> {
    let producer = Producer::new(ProducerConfig {
        client: ClientConfig::new(bootstrap),
        acks: Acks::Leader,
        linger_ms: 5,
        ..Default::default()
    })
    .await?;
    let value = bytes::Bytes::from(vec![b'r'; bytes]);
    let mut pending = std::collections::VecDeque::new();
    for i in 0..records {
        let record =
            ProducerRecord::new(topic, value.clone()).with_partition((i % u64::from(partitions)) as u32);
        pending.push_back(producer.send(record).await?);
        if pending.len() > 50_000 {
            pending.pop_front().expect("pending").await?;
        }
    }
    for d in pending {
        d.await?;
    }
    producer.close().await?;
    Ok(())
}

/// Spawns a broker and times it to its ready line, from a cold page cache:
/// a crashed broker's O_DIRECT writes never went through the cache, and a
/// rebooted machine has none, so the recovery scan reads the disk.
fn spawn_timed(opts: &SpawnOptions) -> anyhow::Result<(Broker, f64)> {
    drop_page_cache();
    let t = Instant::now();
    let b = Broker::spawn(opts)?;
    Ok((b, t.elapsed().as_secs_f64() * 1e3))
}

/// `sync; echo 1 > /proc/sys/vm/drop_caches` (root only; says once when it cannot).
fn drop_page_cache() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "1") {
        WARNED.call_once(|| {
            eprintln!("shardlog-bench recovery: cannot drop the page cache ({e}): scans may read cached data")
        });
    }
}

fn run_case(a: &RecoveryArgs, rt: &tokio::runtime::Runtime, root: &Path, case: &str) -> anyhow::Result<Case> {
    let (partitions, mib) = parse_case(case)?;
    let data = root.join(format!("recovery-{partitions}x{mib}"));
    broker::remove_data_dir(&data);
    let opts = SpawnOptions {
        binary: a.broker_bin.clone().map_or_else(broker::default_binary, Ok)?,
        data_dir: data.clone(),
        shards: Some(a.shards),
        cpus: None,
        extra_args: vec!["--recovery-point-interval-ms".into(), a.point_interval_ms.to_string()],
    };
    let topic = "recovery";
    let records = mib * (1 << 20) * u64::from(partitions) / a.record_bytes as u64;
    let mut b = Broker::spawn(&opts)?;
    let t = Instant::now();
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(&b.ready.listen)).await?;
        // Segments larger than the data: all of it stays in the active one.
        let segment = ((2 * mib) << 20).max(1 << 30);
        admin.create_topic(topic, partitions, &[("segment.bytes".into(), segment.to_string())]).await?;
        produce(&b.ready.listen, topic, partitions, records, a.record_bytes).await
    })?;
    eprintln!("recovery {case}: {records} records produced in {:.1} s", t.elapsed().as_secs_f64());
    // The points advance every interval while a partition grew by 1 MiB
    // since its last: wait until they stop moving.
    let interval = Duration::from_millis(a.point_interval_ms.max(10));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut trusted = trusted_bytes(&data, topic, partitions);
    loop {
        std::thread::sleep(3 * interval);
        let now = trusted_bytes(&data, topic, partitions);
        if (now == trusted && now > 0) || Instant::now() > deadline {
            break;
        }
        trusted = now;
    }
    // A clean close trims the active segments' preallocation: their sizes
    // are then the data's.
    b.stop()?;
    let segments = segment_bytes(&data, topic, partitions);
    b = Broker::spawn(&opts)?;
    eprintln!("recovery {case}: points cover {trusted} of {segments} segment bytes");

    let mut out = Case {
        partitions,
        mib_per_partition: mib,
        records,
        segment_bytes: segments,
        trusted_bytes: trusted,
        clean_ready_ms: Vec::new(),
        crash_points_ready_ms: Vec::new(),
        crash_full_scan_ready_ms: Vec::new(),
    };
    for _ in 0..a.rounds {
        b.stop()?;
        let (next, ms) = spawn_timed(&opts)?;
        b = next;
        out.clean_ready_ms.push(ms);
    }
    for _ in 0..a.rounds {
        b.kill()?;
        let (next, ms) = spawn_timed(&opts)?;
        b = next;
        out.crash_points_ready_ms.push(ms);
    }
    for _ in 0..a.rounds {
        b.kill()?;
        for p in partition_files(&data, topic, partitions, |n| n == "recovery.point") {
            std::fs::remove_file(&p).with_context(|| format!("remove {}", p.display()))?;
        }
        let (next, ms) = spawn_timed(&opts)?;
        b = next;
        out.crash_full_scan_ready_ms.push(ms);
    }
    let end: u64 = rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(&b.ready.listen)).await?;
        anyhow::Ok(admin.describe_topic(topic).await?.partitions.iter().map(|p| p.end_offset).sum())
    })?;
    if end != records {
        bail!("after the restarts the topic ends at {end} records in all; {records} were acknowledged");
    }
    drop(b);
    broker::remove_data_dir(&data);
    eprintln!(
        "recovery {case}: ready after clean {:.0} ms, crash with points {:.0} ms, crash full scan {:.0} ms",
        median(&out.clean_ready_ms),
        median(&out.crash_points_ready_ms),
        median(&out.crash_full_scan_ready_ms)
    );
    Ok(out)
}

pub fn run(a: &RecoveryArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let root = a.data_dir.clone().unwrap_or_else(|| crate::repo_dir().join("target").join("bench-recovery"));
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    let cases = a.cases.iter().map(|c| run_case(a, &rt, &root, c)).collect::<anyhow::Result<Vec<_>>>()?;
    // fio's sequential read, after the brokers stopped, on the same disk.
    let limits = crate::limits::measure(&root, crate::limits::LimitsPlan::QUICK, true);
    write_report(a, &root, &cases, limits.disk_read_bytes_per_s)
}

fn write_report(a: &RecoveryArgs, root: &Path, cases: &[Case], disk_read: Option<f64>) -> anyhow::Result<()> {
    let env::ReportName { base, date, sha } =
        env::report_base(&a.out, "recovery", a.broker_bin.as_deref(), root)?;
    let json = serde_json::json!({
        "shards": a.shards, "record_bytes": a.record_bytes, "point_interval_ms": a.point_interval_ms,
        "rounds": a.rounds, "disk_read_bytes_per_s": disk_read, "cases": cases,
    });
    std::fs::write(base.with_extension("json"), serde_json::to_string_pretty(&json)?)?;
    let mut md = format!(
        "# Recovery time after a clean stop and after a crash ({date}, {sha})\n\n\
         `shardlog-bench recovery` against `shardlog serve --shards {} --recovery-point-interval-ms {}` on this \
         machine. Each case is a fresh broker with one topic of {}-byte records, spread evenly over its \
         partitions, all in the active segments; once the recovery points had caught up the broker was \
         restarted {} times in each way. Time is from spawning the process to its ready line (logs recovered, \
         listeners bound); medians, with every round in the JSON. The page cache was dropped before each \
         start (a crashed broker's O_DIRECT writes never passed through it).\n\n\
         | partitions × MiB | active segment bytes | clean stop | SIGKILL, recovery points | SIGKILL, no points (full scan) | full scan rate |\n\
         |---|---|---|---|---|---|\n",
        a.shards, a.point_interval_ms, a.record_bytes, a.rounds,
    );
    for c in cases {
        let (clean, points, full) = (
            median(&c.clean_ready_ms),
            median(&c.crash_points_ready_ms),
            median(&c.crash_full_scan_ready_ms),
        );
        // The scan's share of the full-scan restart: what it adds to a clean one.
        let scan_s = (full - clean).max(1.0) / 1e3;
        let rate = c.segment_bytes as f64 / scan_s;
        let ratio = disk_read.map_or_else(String::new, |d| format!(" ({:.2} of fio's read)", rate / d));
        md.push_str(&format!(
            "| {} × {} | {:.2} GB | {clean:.0} ms | {points:.0} ms | {full:.0} ms | {:.0} MB/s{ratio} |\n",
            c.partitions,
            c.mib_per_partition,
            c.segment_bytes as f64 / 1e9,
            rate / 1e6,
        ));
    }
    md.push_str(&format!(
        "\nfio's sequential O_DIRECT read on the same disk, measured after the brokers stopped: {}.\n\n\
         - The points covered {} of the segment bytes when the brokers were killed: a crash with current points \
         costs what a clean start costs, plus reading each point file. In service a crash also scans what was \
         written after the last point: at most one interval's worth per partition (the point is rewritten \
         once at least 1 MiB, and 16× its own size, was written since the last one).\n\
         - The full-scan rate is the segment bytes over the time a full-scan restart took beyond a clean one; \
         it validates every batch's CRC as it reads.\n",
        disk_read.map_or_else(|| "not measured (fio missing)".to_string(), |d| format!("{:.0} MB/s", d / 1e6)),
        {
            let (t, s): (u64, u64) = cases.iter().fold((0, 0), |(t, s), c| (t + c.trusted_bytes, s + c.segment_bytes));
            format!("{:.2} %", 100.0 * t as f64 / s.max(1) as f64)
        },
    ));
    std::fs::write(base.with_extension("md"), md)?;
    println!("{}", base.with_extension("md").display());
    Ok(())
}
