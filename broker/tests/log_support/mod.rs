//! Helpers shared by the `log_*` integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::{Log, LogRead};
use shardlog_schema::batch::{self, BatchBuilder, BatchIter};
use shardlog_schema::Offset;
use std::future::Future;

/// Runs a future on a fresh single-thread glommio executor.
pub fn run<T>(fut: impl Future<Output = T>) -> T {
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("glommio executor (io_uring) is available");
    ex.run(fut)
}

/// Runs `test` on a fresh executor with a temp directory (removed after),
/// logging to stderr when RUST_LOG is set.
pub fn run_in_tempdir<Fut: Future<Output = ()>>(test: impl FnOnce(std::path::PathBuf) -> Fut) {
    trace();
    let dir = tempfile::tempdir().expect("tempdir");
    run(test(dir.path().to_path_buf()));
}

/// Logs to stderr when RUST_LOG is set.
pub fn trace() {
    let _ignored = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A batch of `records` records of `value_bytes` each; values encode `tag`.
pub fn make_batch(records: usize, value_bytes: usize, ts_ms: i64, tag: u64) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(records * (value_bytes + 32) + 128);
    for i in 0..records {
        let mut v = vec![0u8; value_bytes.max(8)];
        v[..8].copy_from_slice(&(tag * 1000 + i as u64).to_le_bytes());
        for (j, x) in v.iter_mut().enumerate().skip(8) {
            *x = (tag as usize + j) as u8;
        }
        b.push(Some(&tag.to_le_bytes()), &v, &[], ts_ms + i as i64);
    }
    b.finish()
}

/// A small-segment config for tests.
pub fn small_config(segment_bytes: u64, index_interval: u32, flush: FlushPolicy) -> TopicConfig {
    TopicConfig {
        flush,
        segment_bytes,
        index_interval_bytes: index_interval,
        retention_bytes: None,
        retention_ms: None,
        ..TopicConfig::default()
    }
}

/// What the test expects at an offset range.
#[derive(Clone, Debug)]
pub struct Appended {
    pub base: u64,
    pub last: u64,
    /// The batch as stored: stamped with base offset and epoch.
    pub bytes: Vec<u8>,
}

/// Appends one batch and returns its stored form.
pub async fn append_one(log: &Log, batch: &[u8], epoch: i32) -> Appended {
    let info = log.append(batch, epoch).await.expect("append");
    let mut stored = batch.to_vec();
    batch::stamp(&mut stored, info.base_offset.0, epoch);
    Appended { base: info.base_offset.0, last: info.last_offset.0, bytes: stored }
}

/// Splits read bytes into (base offset, batch bytes), checking every CRC.
pub fn split_batches(bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut it = BatchIter::new(bytes, 1 << 30);
    for b in it.by_ref() {
        let (h, raw) = b.expect("every batch read back is valid");
        out.push((h.base_offset, raw.to_vec()));
    }
    assert_eq!(it.position(), bytes.len(), "a read returns whole batches only");
    out
}

/// Reads everything from `from` to the high watermark in `max_bytes` steps.
pub async fn read_all(log: &Log, from: u64, max_bytes: usize) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let r: LogRead = log.read(Offset(at), max_bytes).await.expect("read");
        if r.is_empty() {
            assert!(at >= log.high_watermark().0, "empty read only at the high watermark");
            return out;
        }
        let (first, last) = (r.first_offset.0, r.last_offset.0);
        let batches = split_batches(&r.clone_bytes().await);
        assert_eq!(batches.first().map(|b| b.0), Some(first));
        assert_eq!(batches.last().map(|b| b.0 <= last), Some(true));
        out.extend(batches);
        at = last + 1;
    }
}

/// `LogRead::into_bytes` on a borrowed read.
pub trait CloneBytes {
    fn clone_bytes(self) -> impl Future<Output = Vec<u8>>;
}

impl CloneBytes for LogRead {
    async fn clone_bytes(self) -> Vec<u8> {
        let n = self.bytes;
        let b = self.into_bytes().await.expect("read bytes");
        assert_eq!(b.len(), n);
        b
    }
}

/// Checks that `got` equals the expected batches from offset `from` on.
pub fn check_against(expected: &[Appended], got: &[(u64, Vec<u8>)], from: u64) {
    let want: Vec<&Appended> = expected.iter().filter(|a| a.last >= from).collect();
    assert_eq!(got.len(), want.len(), "batch count from offset {from}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.0, w.base, "base offset");
        assert!(g.1 == w.bytes, "bytes of batch at {}", w.base);
    }
}

/// 16 tasks each append 6 batches of odd sizes (so batches straddle the
/// 1 MiB write chunks) concurrently; returns what was acknowledged, by offset.
pub async fn append_straddling_concurrently(log: &std::rc::Rc<Log>) -> Vec<Appended> {
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let log = log.clone();
        tasks.push(glommio::spawn_local(async move {
            let mut got = Vec::new();
            for i in 0..6u64 {
                let b = make_batch(
                    1 + (t + i) as usize % 3,
                    50_001 + (t * 977 + i * 131) as usize,
                    1,
                    t * 10 + i,
                );
                got.push(append_one(&log, &b, 4).await);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await);
    }
    all.sort_by_key(|a| a.base);
    all
}

/// Copies a partition directory (flat: a log has no subdirectories).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The newest `.log` file in a partition directory.
pub fn last_log_file(dir: &std::path::Path) -> std::path::PathBuf {
    let mut logs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    logs.pop().unwrap()
}
