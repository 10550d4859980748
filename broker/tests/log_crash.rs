//! Crash test: a real child process appends with flush `always` and is
//! SIGKILLed; after restart every acknowledged batch is intact and nothing
//! after a torn batch is served.
//!
//! The test re-executes its own binary (`--exact crash_child --nocapture`)
//! with `SHARDLOG_LOG_CRASH_CHILD=<dir>`; the child prints `ACK base last tag`
//! per acknowledged append.

mod log_support;

use log_support::*;
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::Log;
use shardlog_schema::batch;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SHARDLOG_LOG_CRASH_CHILD";

fn config() -> TopicConfig {
    small_config(256 << 10, 1024, FlushPolicy::Always)
}

/// Batch shape from its tag, so the parent can rebuild the exact bytes.
fn batch_for(tag: u64) -> Vec<u8> {
    make_batch(1 + (tag % 5) as usize, 50 + ((tag * 37) % 3000) as usize, 1_000 + tag as i64, tag)
}

/// The appender. A no-op unless started by the parent test.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let first_tag: u64 = std::env::var("SHARDLOG_LOG_CRASH_FIRST_TAG").unwrap().parse().unwrap();
    run(async move {
        let log = Rc::new(Log::open(dir.into(), config()).await.unwrap());
        println!("READY");
        let next_tag = Rc::new(std::cell::Cell::new(first_tag));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (log, next_tag) = (log.clone(), next_tag.clone());
            tasks.push(glommio::spawn_local(async move {
                loop {
                    let tag = next_tag.get();
                    next_tag.set(tag + 1);
                    let info = log.append(&batch_for(tag), 7).await.unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {} {} {tag}", info.base_offset.0, info.last_offset.0).unwrap();
                    out.flush().unwrap();
                }
            }));
        }
        for t in tasks {
            t.await;
        }
    });
}

struct Ack {
    base: u64,
    last: u64,
    tag: u64,
}

/// Runs a child until it acknowledged `acks_min` appends, then SIGKILLs it.
fn run_child_and_kill(dir: &std::path::Path, first_tag: u64, acks_min: usize) -> Vec<Ack> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env("SHARDLOG_LOG_CRASH_FIRST_TAG", first_tag.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while acks.len() < acks_min {
        assert!(Instant::now() < deadline, "child too slow: {} acks", acks.len());
        let Some(line) = lines.next() else { panic!("child exited early after {} acks", acks.len()) };
        if let Some(rest) = line.unwrap().strip_prefix("ACK ") {
            let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            acks.push(Ack { base: v[0], last: v[1], tag: v[2] });
        }
    }
    child.kill().unwrap(); // SIGKILL
                           // Acks printed before the kill are still in the pipe.
    for line in lines {
        if let Some(rest) = line.unwrap().strip_prefix("ACK ") {
            let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            if v.len() == 3 {
                acks.push(Ack { base: v[0], last: v[1], tag: v[2] });
            }
        }
    }
    child.wait().unwrap();
    acks
}

#[test]
fn sigkill_during_appends_keeps_every_acknowledged_batch() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let rounds = if std::env::var_os("SHARDLOG_SLOW_TESTS").is_some() { 6 } else { 2 };
    let mut acked: Vec<Ack> = Vec::new();
    let mut next_tag = 0;
    for round in 0..rounds {
        let acks = run_child_and_kill(&dir, next_tag, 300 + 200 * round);
        next_tag = acks.iter().map(|a| a.tag).max().unwrap() + 1_000_000;
        acked.extend(acks);
        let checked = run(async {
            let log = Log::open(dir.clone(), config()).await.unwrap();
            let got = read_all(&log, 0, 1 << 20).await;
            let end = log.end_offset().0;
            // Every batch served is valid (split_batches checks CRCs) and
            // offsets are contiguous: nothing after a torn batch is served.
            let mut next = 0;
            for (base, bytes) in &got {
                assert_eq!(*base, next, "contiguous offsets");
                next = batch::BatchHeader::parse(bytes).unwrap().next_offset();
            }
            assert_eq!(next, end);
            let by_base: std::collections::HashMap<u64, &Vec<u8>> =
                got.iter().map(|(b, v)| (*b, v)).collect();
            for a in &acked {
                let mut want = batch_for(a.tag);
                batch::stamp(&mut want, a.base, 7);
                let have = by_base.get(&a.base).unwrap_or_else(|| panic!("acked batch at {} lost", a.base));
                assert!(**have == want, "acked batch at {} (tag {}) differs", a.base, a.tag);
                assert!(a.last < end);
            }
            log.close().await.unwrap();
            got.len()
        });
        assert!(checked >= acked.len());
    }
}
