//! Fetch-path benchmark (issue 4): splice against read + send.
//!
//! For each fetch path it spawns a real `shardlog serve --shards 1
//! --fetch-path P`, writes a backlog with the real producer, then drains it
//! with a raw fetch loop (one request in flight, response bytes discarded so
//! the client costs almost nothing), cold (page cache dropped first) and warm.
//! It reports MB/s and broker CPU seconds per GB served (from
//! `/proc/<pid>/stat`), next to fio's O_DIRECT sequential read bandwidth
//! measured in the same run.
//!
//! Then the hot tail: a backlog small enough to stay in the broker's
//! in-memory hot tail is fetched over and over for a few seconds by the same
//! raw loop, next to iperf3's single-stream loopback bandwidth measured in
//! the same run; the broker's `/metrics` counters prove which path served the
//! bytes.
//!
//! ```text
//! cargo build --release -p shardlog -p shardlog-bench
//! target/release/fetch_bench --gib 2 --out perf-reports
//! ```

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::json;
use shardlog_client::protocol::{encode_fetch, FetchParams, FetchTarget};
use shardlog_client::{Acks, Admin, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use shardlog_schema::frame::FrameLimits;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Debug)]
struct Args {
    /// Backlog size per path, GiB.
    #[arg(long, default_value_t = 2.0)]
    gib: f64,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Bytes asked for per fetch.
    #[arg(long, default_value_t = 8 << 20)]
    fetch_bytes: u32,
    /// The broker binary (default: `shardlog` next to this binary).
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    /// Where the brokers keep their data (removed afterwards).
    #[arg(long, default_value = "target/fetch-bench-data")]
    data_dir: PathBuf,
    /// Which cases to run: `splice`, `plain` (cold + warm each) and `hot`.
    #[arg(long, value_delimiter = ',', default_value = "splice,plain,hot")]
    cases: Vec<String>,
    /// Hot-tail case: backlog size, MiB (below the broker's default
    /// per-partition hot-tail budget of 8 MiB).
    #[arg(long, default_value_t = 6)]
    hot_mib: u64,
    /// Hot-tail case: how long to fetch the hot tail, seconds.
    #[arg(long, default_value_t = 5)]
    hot_seconds: u64,
    /// Directory for the Markdown and JSON report; none: print only.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The harness's broker launcher (spawn, ready line, SIGTERM on drop).
#[path = "../broker.rs"]
#[allow(dead_code, reason = "shared with the harness; this binary uses part of it")]
mod broker;

/// The harness's machine-limit probes (iperf3 here).
#[path = "../limits.rs"]
#[allow(dead_code, reason = "shared with the harness; this binary uses part of it")]
mod limits;

use broker::{Broker, SpawnOptions};

fn spawn(bin: &Path, dir: &Path, path: &str) -> Result<Broker> {
    Broker::spawn(&SpawnOptions {
        binary: bin.to_path_buf(),
        data_dir: dir.to_path_buf(),
        shards: Some(1),
        cpus: None,
        extra_args: vec!["--fetch-path".into(), path.into(), "--admin-listen".into(), "127.0.0.1:0".into()],
    })
}

/// `shardlog_fetch_bytes_total` of every shard for `path`, from `/metrics`.
fn served_bytes(broker: &Broker, path: &str) -> Result<u64> {
    let admin = broker.ready.admin.as_deref().context("broker printed no admin address")?;
    let mut s = std::net::TcpStream::connect(admin).with_context(|| format!("connect {admin}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let label = format!("path=\"{path}\"}}");
    let mut total = 0;
    for line in text.lines().filter(|l| l.starts_with("shardlog_fetch_bytes_total{") && l.contains(&label)) {
        total += line.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()).context("metrics value")?;
    }
    Ok(total)
}

/// Fetches the whole (hot) partition again and again for `seconds`.
fn hot_loop(port: u16, records: u64, fetch_bytes: u32, seconds: u64) -> Result<(u64, f64)> {
    let started = Instant::now();
    let mut bytes = 0;
    while started.elapsed().as_secs() < seconds {
        bytes += drain(port, records, fetch_bytes)?;
    }
    Ok((bytes, started.elapsed().as_secs_f64()))
}

/// utime + stime of the broker process, seconds.
fn cpu_seconds(broker: &Broker) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", broker.pid()))?;
    let after = stat.rsplit_once(')').context("stat format")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf reads a constant; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

fn drop_caches() -> Result<()> {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("drop page cache (needs root)")
}

async fn write_backlog(bootstrap: &str, total_bytes: u64, value_bytes: usize) -> Result<u64> {
    let admin = Admin::connect(ClientConfig::new(bootstrap)).await?;
    admin.create_topic("fetchbench", 1, &[("segment.bytes".into(), (256u64 << 20).to_string())]).await?;
    let producer = Producer::new(ProducerConfig {
        client: ClientConfig::new(bootstrap),
        acks: Acks::Leader,
        ..Default::default()
    })
    .await?;
    let value = bytes::Bytes::from(vec![b'x'; value_bytes]);
    let count = total_bytes / value_bytes as u64;
    let mut pending = std::collections::VecDeque::new();
    for _ in 0..count {
        pending.push_back(
            producer.send(ProducerRecord::new("fetchbench", value.clone()).with_partition(0)).await?,
        );
        if pending.len() > 100_000 {
            pending.pop_front().expect("queued").await?;
        }
    }
    for d in pending {
        d.await?;
    }
    producer.close().await?;
    Ok(count)
}

/// Drains the partition from offset 0 with raw fetches; returns bytes read.
fn drain(port: u16, records: u64, fetch_bytes: u32) -> Result<u64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let limits = FrameLimits { header_bytes_max: 1 << 20, payload_bytes_max: u32::MAX };
    let params = FetchParams { max_wait_ms: 0, min_bytes: 1, max_bytes: fetch_bytes };
    let mut payload = vec![0u8; fetch_bytes as usize * 2];
    let (mut next, mut total, mut corr) = (0u64, 0u64, 0u32);
    while next < records {
        corr += 1;
        let target =
            FetchTarget { topic: "fetchbench".into(), partition: 0, offset: next, max_bytes: fetch_bytes };
        s.write_all(&encode_fetch(corr, "fetch-bench", params, &[target]))?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix)?;
        let mut header = vec![0u8; u32::from_le_bytes(prefix) as usize];
        s.read_exact(&mut header)?;
        let frame = limits.verify_response(&header)?;
        let n = frame.payload_bytes() as usize;
        let part = frame.body_as_fetch_response().and_then(|b| b.partitions()).context("fetch body")?.get(0);
        if part.error() != shardlog_schema::ErrorCode::None || part.last_offset() < 0 {
            bail!("fetch at {next} failed: {:?} {:?}", part.error(), part.error_message());
        }
        if payload.len() < n {
            payload.resize(n, 0);
        }
        s.read_exact(&mut payload[..n])?;
        total += n as u64;
        next = part.last_offset() as u64 + 1;
    }
    Ok(total)
}

fn fio_read(dir: &Path, gib: f64) -> Result<f64> {
    let file = dir.join("fio-read.dat");
    let size = format!("{}m", (gib * 1024.0) as u64);
    let out = Command::new("fio")
        .args(["--name=r", "--ioengine=io_uring", "--direct=1", "--rw=read", "--bs=1M", "--iodepth=1"])
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--size={size}"))
        .args(["--runtime=20", "--output-format=json"])
        .output()
        .context("run fio (apt-get install fio)")?;
    std::fs::remove_file(&file).ok();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("fio json")?;
    let bw_kib = v["jobs"][0]["read"]["bw"].as_f64().context("fio read bw")?;
    Ok(bw_kib * 1024.0 / 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let bin = match &args.broker_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("shardlog"),
    };
    if let Some(c) = args.cases.iter().find(|c| !["splice", "plain", "hot"].contains(&c.as_str())) {
        bail!("unknown case {c:?}: splice, plain or hot");
    }
    std::fs::create_dir_all(&args.data_dir)?;
    let fio_mb_s = fio_read(&args.data_dir, args.gib)?;
    println!("fio O_DIRECT sequential read: {fio_mb_s:.0} MB/s");
    let total_bytes = (args.gib * (1u64 << 30) as f64) as u64;
    let mut rows = Vec::new();
    for path in ["splice", "plain"].into_iter().filter(|p| args.cases.iter().any(|c| c == p)) {
        let dir = args.data_dir.join(path);
        std::fs::remove_dir_all(&dir).ok();
        let broker = spawn(&bin, &dir, path)?;
        eprintln!("[{path}] writing {:.2} GiB backlog", args.gib);
        let records = write_backlog(&broker.ready.listen, total_bytes, args.value_bytes).await?;
        eprintln!("[{path}] {records} records written; draining");
        for cache in ["cold", "warm"] {
            if cache == "cold" {
                drop_caches()?;
            }
            let cpu0 = cpu_seconds(&broker)?;
            let started = Instant::now();
            let port = broker.ready.shard_ports[0];
            let fetch_bytes = args.fetch_bytes;
            let bytes = tokio::task::spawn_blocking(move || drain(port, records, fetch_bytes)).await??;
            let secs = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds(&broker)? - cpu0;
            let mb_s = bytes as f64 / secs / 1e6;
            let row = json!({
                "path": path, "cache": cache, "bytes": bytes, "seconds": secs, "mb_per_s": mb_s,
                "broker_cpu_s_per_gb": cpu / (bytes as f64 / 1e9), "ratio_to_fio_read": mb_s / fio_mb_s,
            });
            println!("{row}");
            rows.push(row);
        }
        drop(broker);
        std::fs::remove_dir_all(&dir).ok();
    }
    if args.cases.iter().any(|c| c == "hot") {
        let hot = hot_tail(&bin, &args).await?;
        println!("{hot}");
        rows.push(hot);
    }
    if let Some(out) = &args.out {
        write_report(out, fio_mb_s, &args, &rows)?;
    }
    Ok(())
}

/// The hot-tail row: MB/s of fetches served from memory against iperf3.
async fn hot_tail(bin: &Path, args: &Args) -> Result<serde_json::Value> {
    let iperf_mb_s = limits::iperf3(5).context("iperf3 loopback (apt-get install iperf3)")? / 1e6;
    println!("iperf3 single-stream loopback: {iperf_mb_s:.0} MB/s");
    let dir = args.data_dir.join("hot");
    std::fs::remove_dir_all(&dir).ok();
    let broker = spawn(bin, &dir, "plain")?;
    let records = write_backlog(&broker.ready.listen, args.hot_mib << 20, args.value_bytes).await?;
    let (hot0, disk0) = (served_bytes(&broker, "hot_tail")?, disk_bytes(&broker)?);
    let cpu0 = cpu_seconds(&broker)?;
    let (port, fetch_bytes, seconds) = (broker.ready.shard_ports[0], args.fetch_bytes, args.hot_seconds);
    let (bytes, secs) =
        tokio::task::spawn_blocking(move || hot_loop(port, records, fetch_bytes, seconds)).await??;
    let cpu = cpu_seconds(&broker)? - cpu0;
    let (hot, disk) = (served_bytes(&broker, "hot_tail")? - hot0, disk_bytes(&broker)? - disk0);
    drop(broker);
    std::fs::remove_dir_all(&dir).ok();
    let mb_s = bytes as f64 / secs / 1e6;
    Ok(json!({
        "path": "hot_tail", "cache": "memory", "bytes": bytes, "seconds": secs, "mb_per_s": mb_s,
        "broker_cpu_s_per_gb": cpu / (bytes as f64 / 1e9), "iperf3_loopback_mb_s": iperf_mb_s,
        "ratio_to_iperf3": mb_s / iperf_mb_s, "hot_tail_bytes": hot, "segment_bytes": disk,
    }))
}

/// Bytes the broker served from segment files (splice + plain).
fn disk_bytes(broker: &Broker) -> Result<u64> {
    Ok(served_bytes(broker, "splice")? + served_bytes(broker, "plain")?)
}

fn write_report(out: &Path, fio_mb_s: f64, args: &Args, rows: &[serde_json::Value]) -> Result<()> {
    let date = Command::new("date").arg("+%F").output()?.stdout;
    let date = String::from_utf8_lossy(&date).trim().to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let report = json!({
        "bench": "fetch_bench", "date": date, "kernel": kernel, "gib": args.gib,
        "value_bytes": args.value_bytes, "fetch_bytes": args.fetch_bytes,
        "fio_o_direct_seq_read_mb_s": fio_mb_s, "rows": rows,
    });
    std::fs::write(out.join(format!("fetch-{date}.json")), serde_json::to_string_pretty(&report)?)?;
    let mut md = format!(
        "# Fetch paths: splice vs read + send ({date})\n\n{} GiB backlog of {} B records, one partition, one \
         shard, raw fetch loop with {} MiB per fetch. fio O_DIRECT sequential read in the same run: {fio_mb_s:.0} MB/s.\n\n\
         | path | cache | MB/s | x fio read | broker CPU s/GB |\n|---|---|---|---|---|\n",
        args.gib,
        args.value_bytes,
        args.fetch_bytes >> 20
    );
    for r in rows.iter().filter(|r| r["path"] != "hot_tail") {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.3} |\n",
            r["path"].as_str().unwrap_or(""),
            r["cache"].as_str().unwrap_or(""),
            r["mb_per_s"].as_f64().unwrap_or(0.0),
            r["ratio_to_fio_read"].as_f64().unwrap_or(0.0),
            r["broker_cpu_s_per_gb"].as_f64().unwrap_or(0.0),
        ));
    }
    for r in rows.iter().filter(|r| r["path"] == "hot_tail") {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        md.push_str(&format!(
            "\nHot tail: {} MiB backlog (inside the per-partition hot-tail budget) fetched again and again for \
             {} s: **{:.0} MB/s, {:.2}x iperf3's single-stream loopback** ({:.0} MB/s, same run), broker CPU \
             {:.3} s/GB. `/metrics`: {} bytes served by the hot tail, {} from segment files.\n",
            args.hot_mib,
            args.hot_seconds,
            f("mb_per_s"),
            f("ratio_to_iperf3"),
            f("iperf3_loopback_mb_s"),
            f("broker_cpu_s_per_gb"),
            r["hot_tail_bytes"],
            r["segment_bytes"],
        ));
    }
    std::fs::write(out.join(format!("fetch-{date}.md")), md)?;
    Ok(())
}
