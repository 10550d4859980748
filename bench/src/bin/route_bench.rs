//! Routing benchmark (issue 3): produce straight to the owner shard's port
//! against the same load sent to another shard, which forwards every request
//! over the shard mesh.
//!
//! It spawns a real `shardlog serve --shards 2`, creates a one-partition
//! topic, and pushes pre-built 1 MiB batches of 1 KB records with a window
//! of requests in flight over a raw connection (acks = 1), alternating owner
//! and forwarded runs so both see the same machine noise.
//!
//! ```text
//! cargo build --release -p shardlog -p shardlog-bench
//! target/release/route_bench --mib 512 --rounds 2 --out perf-reports
//! ```

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::json;
use shardlog_client::protocol::{encode_produce, ProduceEntry};
use shardlog_client::{Admin, ClientConfig};
use shardlog_schema::batch::BatchBuilder;
use shardlog_schema::frame::FrameLimits;
use shardlog_schema::types::shard_for;
use shardlog_schema::PartitionId;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Debug)]
struct Args {
    /// Data produced per run, MiB.
    #[arg(long, default_value_t = 512)]
    mib: u64,
    /// Owner / forwarded run pairs.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Produce requests in flight.
    #[arg(long, default_value_t = 8)]
    window: usize,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    #[arg(long, default_value = "target/route-bench-data")]
    data_dir: PathBuf,
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The harness's broker launcher (spawn, ready line, SIGTERM on drop).
#[path = "../broker.rs"]
#[allow(dead_code, reason = "shared with the harness; this binary uses part of it")]
mod broker;

fn spawn(bin: &Path, dir: &Path) -> Result<broker::Broker> {
    broker::Broker::spawn(&broker::SpawnOptions {
        binary: bin.to_path_buf(),
        data_dir: dir.to_path_buf(),
        shards: Some(2),
        cpus: None,
        extra_args: Vec::new(),
    })
}

/// One produce request: envelope + a 1 MiB batch of `value_bytes` records.
fn request(value_bytes: usize) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(1 << 20);
    let value = vec![b'r'; value_bytes];
    while b.estimated_bytes() + value_bytes + 64 < 1 << 20 {
        b.push(None, &value, &[], 1_700_000_000_000);
    }
    let batch = b.finish();
    let entry = ProduceEntry { topic: "route", partition: 0, batch_bytes: batch.len() as u32 };
    let mut out = encode_produce(0, "route-bench", 1, 30_000, &[entry]);
    out.extend_from_slice(&batch);
    out
}

fn read_response(s: &mut std::net::TcpStream, limits: &FrameLimits) -> Result<()> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix)?;
    let mut header = vec![0u8; u32::from_le_bytes(prefix) as usize];
    s.read_exact(&mut header)?;
    let frame = limits.verify_response(&header)?;
    let part = frame.body_as_produce_response().and_then(|b| b.partitions()).context("produce body")?.get(0);
    if part.error() != shardlog_schema::ErrorCode::None {
        bail!("produce failed: {:?} {:?}", part.error(), part.error_message());
    }
    Ok(())
}

/// Sends `count` copies of `req` with `window` in flight; returns seconds.
fn run(port: u16, req: &[u8], count: u64, window: usize) -> Result<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let limits = FrameLimits::default();
    let started = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < count {
        while sent < count && sent - acked < window as u64 {
            s.write_all(req)?;
            sent += 1;
        }
        read_response(&mut s, &limits)?;
        acked += 1;
    }
    Ok(started.elapsed().as_secs_f64())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let bin = args.broker_bin.clone().unwrap_or(std::env::current_exe()?.with_file_name("shardlog"));
    std::fs::remove_dir_all(&args.data_dir).ok();
    let broker = spawn(&bin, &args.data_dir)?;
    Admin::connect(ClientConfig::new(&broker.ready.listen)).await?.create_topic("route", 1, &[]).await?;
    let owner = shard_for("route", PartitionId(0), 2).0 as usize;
    let (own_port, other_port) = (broker.ready.shard_ports[owner], broker.ready.shard_ports[1 - owner]);
    let req = request(args.value_bytes);
    let count = (args.mib << 20) / req.len() as u64;
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for (route, port) in [("owner", own_port), ("forwarded", other_port)] {
            let secs = run(port, &req, count, args.window)?;
            let mb_s = (count * req.len() as u64) as f64 / secs / 1e6;
            let row =
                json!({"round": round, "route": route, "mb_per_s": mb_s, "seconds": secs, "requests": count});
            println!("{row}");
            rows.push(row);
        }
    }
    drop(broker);
    std::fs::remove_dir_all(&args.data_dir).ok();
    if let Some(out) = &args.out {
        let median = |route: &str| {
            let mut v: Vec<f64> =
                rows.iter().filter(|r| r["route"] == route).filter_map(|r| r["mb_per_s"].as_f64()).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (own, fwd) = (median("owner"), median("forwarded"));
        let date =
            String::from_utf8_lossy(&Command::new("date").arg("+%F").output()?.stdout).trim().to_string();
        let report = json!({"bench": "route_bench", "date": date, "mib_per_run": args.mib, "window": args.window,
            "value_bytes": args.value_bytes, "rows": rows, "median_owner_mb_s": own, "median_forwarded_mb_s": fwd});
        std::fs::write(out.join(format!("route-{date}.json")), serde_json::to_string_pretty(&report)?)?;
        let mut md = format!(
            "# Shard-aware routing vs forced forwarding ({date})\n\nOne broker with 2 shards, one partition, \
             acks 1, 1 MiB batches of {} B records, {} requests in flight on one raw connection, {} MiB per run, \
             owner and forwarded runs alternating.\n\n| round | route | MB/s |\n|---|---|---|\n",
            args.value_bytes, args.window, args.mib
        );
        for r in &rows {
            md.push_str(&format!(
                "| {} | {} | {:.0} |\n",
                r["round"],
                r["route"].as_str().unwrap_or(""),
                r["mb_per_s"].as_f64().unwrap_or(0.0)
            ));
        }
        md.push_str(&format!(
            "\nMedian: owner {own:.0} MB/s, forwarded {fwd:.0} MB/s (forwarded / owner = {:.2}).\n",
            fwd / own
        ));
        std::fs::write(out.join(format!("route-{date}.md")), md)?;
    }
    Ok(())
}
