//! CI smoke run: `shardlog-bench run` executes the 5-second smoke workload
//! against a broker it spawns (the real `shardlog` binary), and the report it
//! writes is validated: schema, throughput, latency, /proc samples, files.
//!
//! The `shardlog` binary must be built first; `cargo test --workspace` does
//! that (it builds every workspace binary before running tests). The binary
//! is looked up next to `shardlog-bench` (same target/<profile>/ directory),
//! then in `../target/{debug,release}/`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn shardlog_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_shardlog-bench"));
    let beside = bench.parent().expect("binary has a directory").join("shardlog");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    let candidates = [beside, target.join("debug/shardlog"), target.join("release/shardlog")];
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "the smoke test needs the broker binary; looked at {candidates:?}. \
             Build it first with `cargo build -p shardlog` (cargo test --workspace does this)"
        )
    })
}

#[test]
fn smoke_workload_against_a_spawned_broker_writes_a_valid_report() {
    let broker = shardlog_binary();
    let out = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")).unwrap();
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/ci/smoke.toml");
    let status = Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
        .arg("run")
        .arg(&workload)
        .args(["--spawn-broker", "-n", "1", "--shards", "2"])
        .arg("--broker-bin")
        .arg(&broker)
        .arg("--data-dir")
        .arg(data.path())
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("run shardlog-bench");
    assert!(status.success(), "shardlog-bench run failed: {status}");

    let index = std::fs::read_to_string(out.path().join("index.ndjson")).unwrap();
    let lines: Vec<Value> = index.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "one index line per run");
    let report_name = lines[0]["report"].as_str().unwrap();
    let report_path = out.path().join(report_name);

    let validate = Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
        .arg("validate")
        .arg(&report_path)
        .output()
        .unwrap();
    assert!(validate.status.success(), "validate: {}", String::from_utf8_lossy(&validate.stderr));

    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(r["workload"]["name"], "smoke");
    assert_eq!(r["broker"]["mode"], "spawned");
    assert!(!r["environment"]["kernel"].as_str().unwrap().is_empty());
    let run = &r["repetitions"][0];
    assert_eq!(run["mode"], "open-loop");
    // 2,000 msgs/s for 5 s: the window holds about 10,000 acknowledged messages.
    let published = run["publish"]["msgs"].as_u64().unwrap();
    assert!((8_000..=12_000).contains(&published), "published {published}");
    assert_eq!(run["send_errors"], 0);
    // Every message sent in the window was consumed and timed end to end.
    let e2e = run["e2e_latency"]["count"].as_u64().unwrap();
    assert!(e2e >= 9_000, "end-to-end samples {e2e}");
    assert!(run["e2e_latency"]["p99_us"].as_f64().unwrap() > 0.0);
    let recv: u64 = run["series"]["recv_msgs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    let acked: u64 =
        run["series"]["acked_msgs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(recv, acked, "the consumer received every acknowledged message");
    // Order is checked on every received record: keyless over 2 partitions
    // numbers per producer.
    let order = &run["order"];
    assert_eq!(order["scope"], "per-producer");
    assert_eq!(order["checked_records"].as_u64().unwrap(), recv, "every received record checked");
    assert_eq!(order["violations"], 0, "order: {order}");
    assert!(r["invalid"].is_null(), "a run without violations is valid");
    assert!(!run["broker_samples"].as_array().unwrap().is_empty(), "broker /proc was sampled");
    assert!(run["broker"]["rss_bytes_max"].as_u64().unwrap() > 1 << 20);
    // The latency breakdown: the client's three steps of every measured
    // message add up to its publish latency; the broker's stages counted the
    // window's records.
    let b = &run["breakdown"];
    let rows = |side: &str| b[side].as_array().unwrap_or_else(|| panic!("breakdown.{side}: {b}")).clone();
    let client = rows("client");
    let steps: Vec<&str> = client.iter().map(|x| x["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["accumulate", "slot_wait", "round_trip"]);
    let measured = run["publish_latency"]["count"].as_u64().unwrap();
    assert!(client.iter().all(|x| x["count"].as_u64() == Some(measured)), "{b}");
    let sum: f64 = client.iter().map(|x| x["mean_us"].as_f64().unwrap()).sum();
    let mean = run["publish_latency"]["mean_us"].as_f64().unwrap();
    assert!((sum - mean).abs() <= 0.02 * mean, "steps add up to {sum} us, publish mean {mean} us");
    let broker = rows("broker");
    let stage =
        |s: &str| broker.iter().find(|x| x["step"] == s).unwrap_or_else(|| panic!("{s}: {b}")).clone();
    for s in ["produce_in", "write_queue", "write", "produce_out"] {
        let n = stage(s)["count"].as_u64().unwrap();
        assert!((8_000..=14_000).contains(&n), "{s} counted {n} records");
    }
    assert!(stage("write")["p50_us"].as_f64().unwrap() > 0.0);
    assert!(stage("fetch_wake")["count"].as_u64().unwrap() > 0, "the consumer waited at the tail");
    assert!(b["writes"]["writes"].as_u64().unwrap() > 0);

    let stem = report_name.trim_end_matches(".json");
    for f in [format!("{stem}.md"), format!("{stem}-throughput.svg"), format!("{stem}-latency.svg")] {
        assert!(out.path().join(&f).is_file(), "{f} written");
    }
    let readme = std::fs::read_to_string(out.path().join("README.md")).unwrap();
    assert!(readme.contains("shardlog-bench table"), "README table generated");
}
