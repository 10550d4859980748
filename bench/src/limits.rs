//! The machine's physical limits, measured with public tools so that every
//! figure a report gives is also a fraction of what the hardware can do.
//!
//! - fio, O_DIRECT sequential write and read (io_uring, 1 MiB blocks, depth 1)
//! - fio, 4 KiB write + fdatasync latency (p50, p99)
//! - iperf3, single-stream loopback TCP
//! - memcpy of a 256 MiB buffer
//!
//! Nothing is installed: a missing tool is named in `missing_tools` and its
//! figures stay `None`.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Measured limits. Bandwidths in bytes per second.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Unix time in seconds of the measurement.
    pub measured_at_unix_s: u64,
    /// Where the fio files were written.
    pub disk_path: String,
    pub disk_write_bytes_per_s: Option<f64>,
    pub disk_read_bytes_per_s: Option<f64>,
    pub fdatasync_p50_us: Option<f64>,
    pub fdatasync_p99_us: Option<f64>,
    pub loopback_bytes_per_s: Option<f64>,
    pub memcpy_bytes_per_s: Option<f64>,
    pub missing_tools: Vec<String>,
    /// How each figure was obtained (the exact commands).
    pub methods: Vec<String>,
    pub quick: bool,
}

/// Durations and sizes of the measurements.
#[derive(Debug, Clone, Copy)]
pub struct LimitsPlan {
    pub seq_size: &'static str,
    pub seq_runtime_s: u32,
    pub sync_runtime_s: u32,
    pub iperf_s: u32,
}

impl LimitsPlan {
    pub const FULL: LimitsPlan =
        LimitsPlan { seq_size: "4g", seq_runtime_s: 20, sync_runtime_s: 10, iperf_s: 10 };
    pub const QUICK: LimitsPlan =
        LimitsPlan { seq_size: "1g", seq_runtime_s: 4, sync_runtime_s: 3, iperf_s: 3 };
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Measures everything it can; errors of one measurement are reported and
/// leave that figure empty.
pub fn measure(dir: &Path, plan: LimitsPlan, quick: bool) -> Limits {
    let mut l = Limits {
        measured_at_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        disk_path: dir.display().to_string(),
        quick,
        ..Limits::default()
    };
    if have("fio") {
        let file = dir.join(format!(".shardlog-bench-fio-{}", std::process::id()));
        let f = file.display().to_string();
        let seq = |rw: &str| {
            vec![
                format!("--name=seq{rw}"),
                format!("--filename={f}"),
                "--ioengine=io_uring".into(),
                "--direct=1".into(),
                format!("--rw={rw}"),
                "--bs=1M".into(),
                "--iodepth=1".into(),
                format!("--size={}", plan.seq_size),
                format!("--runtime={}", plan.seq_runtime_s),
            ]
        };
        record(&mut l, "fio seq write", seq("write"), |l, j| {
            l.disk_write_bytes_per_s = Some(fio_job(j)?["write"]["bw_bytes"].as_f64().context("bw_bytes")?);
            Ok(())
        });
        record(&mut l, "fio seq read", seq("read"), |l, j| {
            l.disk_read_bytes_per_s = Some(fio_job(j)?["read"]["bw_bytes"].as_f64().context("bw_bytes")?);
            Ok(())
        });
        let sync = vec![
            "--name=fdatasync".into(),
            format!("--filename={f}"),
            "--ioengine=psync".into(),
            "--direct=1".into(),
            "--rw=write".into(),
            "--bs=4k".into(),
            "--fdatasync=1".into(),
            "--size=256m".into(),
            format!("--runtime={}", plan.sync_runtime_s),
        ];
        record(&mut l, "fio fdatasync", sync, |l, j| {
            let p = &fio_job(j)?["sync"]["lat_ns"]["percentile"];
            l.fdatasync_p50_us = Some(p["50.000000"].as_f64().context("p50")? / 1e3);
            l.fdatasync_p99_us = Some(p["99.000000"].as_f64().context("p99")? / 1e3);
            Ok(())
        });
        if let Err(e) = std::fs::remove_file(&file) {
            eprintln!("shardlog-bench limits: cannot remove {}: {e}", file.display());
        }
    } else {
        l.missing_tools.push("fio (apt-get install -y fio)".into());
    }
    if have("iperf3") {
        match iperf3(plan.iperf_s) {
            Ok(bps) => l.loopback_bytes_per_s = Some(bps),
            Err(e) => eprintln!("shardlog-bench limits: iperf3 failed: {e:#}"),
        }
        l.methods.push(format!(
            "iperf3 -s -1 -p PORT / iperf3 -c 127.0.0.1 -p PORT -t {} -J: end.sum_received",
            plan.iperf_s
        ));
    } else {
        l.missing_tools.push("iperf3 (apt-get install -y iperf3)".into());
    }
    l.memcpy_bytes_per_s = Some(memcpy_bytes_per_s(256 << 20, if quick { 4 } else { 10 }));
    l.methods.push("memcpy: copy_from_slice of 256 MiB, best of N rounds".into());
    for t in &l.missing_tools {
        eprintln!("shardlog-bench limits: missing tool {t}; its figures are left empty");
    }
    l
}

fn record(
    l: &mut Limits,
    what: &str,
    args: Vec<String>,
    parse: impl FnOnce(&mut Limits, &serde_json::Value) -> anyhow::Result<()>,
) {
    l.methods.push(format!("fio {} --output-format=json", args.join(" ")));
    let result = fio(&args).and_then(|j| parse(l, &j));
    if let Err(e) = result {
        eprintln!("shardlog-bench limits: {what} failed: {e:#}");
    }
}

pub(crate) fn fio(args: &[String]) -> anyhow::Result<serde_json::Value> {
    let out = Command::new("fio").args(args).arg("--output-format=json").output().context("run fio")?;
    if !out.status.success() {
        bail!("fio exited with {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    // fio may print notes before the JSON document.
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&text[start..]).context("parse fio JSON")
}

pub(crate) fn fio_job(j: &serde_json::Value) -> anyhow::Result<&serde_json::Value> {
    j["jobs"].get(0).context("fio JSON has no job")
}

/// iperf3's single-stream loopback bandwidth, bytes/s.
pub fn iperf3(seconds: u32) -> anyhow::Result<f64> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn iperf3 server")?;
    // The server's stdout is block-buffered in a pipe, so readiness is
    // probed by the client itself: a refused connection never reaches the
    // one-shot (-1) server, so retrying is harmless.
    let deadline = Instant::now() + Duration::from_secs(10);
    let result = loop {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", &seconds.to_string(), "-J"])
            .output()
            .context("run iperf3 client");
        match out {
            Ok(o) if !o.status.success() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => break other,
        }
    };
    // The server exits after one test (-1); make sure it is gone either way.
    if server.try_wait()?.is_none() {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    }
    server.wait().context("wait for iperf3 server")?;
    let out = result?;
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).context("parse iperf3 JSON")?;
    let bits =
        j["end"]["sum_received"]["bits_per_second"].as_f64().context("end.sum_received.bits_per_second")?;
    Ok(bits / 8.0)
}

/// Best-of-`rounds` bandwidth of copying `bytes` between two buffers.
#[must_use]
pub fn memcpy_bytes_per_s(bytes: usize, rounds: u32) -> f64 {
    let src: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut dst = vec![0u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert_eq!(dst[bytes - 1], src[bytes - 1], "the copy really ran");
    bytes as f64 / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_measures_a_plausible_bandwidth() {
        let bps = memcpy_bytes_per_s(8 << 20, 3);
        assert!(bps > 100e6 && bps < 1e12, "{bps}");
    }

    #[test]
    fn limits_round_trip_through_json() {
        let l = Limits {
            disk_write_bytes_per_s: Some(6.6e8),
            missing_tools: vec!["x".into()],
            ..Limits::default()
        };
        let back: Limits = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(l, back);
    }
}
