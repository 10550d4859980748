//! The hot tail: reads at the end of the log are answered from memory
//! (`ReadChunk::Memory`) with the same bytes the file holds; after eviction
//! the same reads come from the file; the shard budget and the per-log cap
//! hold.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{HotTailBudget, Log, LogOptions, LogRead, ReadChunk};
use shardlog_schema::Offset;
use std::rc::Rc;

const BLOCK: usize = 4096;

fn options(budget: &Rc<HotTailBudget>, log_cap: u64) -> LogOptions {
    LogOptions { hot_tail: budget.clone(), hot_tail_log_bytes_max: log_cap, ..LogOptions::default() }
}

/// (bytes served from memory, bytes served from files) of a read.
fn sources(r: &LogRead) -> (usize, usize) {
    let mut mem = 0;
    let mut file = 0;
    for c in &r.chunks {
        match c {
            ReadChunk::Memory(b) => mem += b.len(),
            ReadChunk::File { len, .. } => file += len,
        }
    }
    (mem, file)
}

/// Reads `[from, ..)` with `max_bytes`, checks the bytes against what was
/// appended and returns (memory bytes, file bytes).
async fn read_check(log: &Log, expected: &[Appended], from: u64, max_bytes: usize) -> (usize, usize) {
    let r = log.read(Offset(from), max_bytes).await.expect("read");
    let src = sources(&r);
    assert_eq!(src.0 + src.1, r.bytes, "chunks add up to the read");
    let (first, last) = (r.first_offset.0, r.last_offset.0);
    let got = split_batches(&r.clone_bytes().await);
    assert_eq!(got.first().map(|b| b.0), Some(first));
    let want: Vec<&Appended> = expected.iter().filter(|a| a.last >= from && a.base <= last).collect();
    assert_eq!(got.len(), want.len(), "batch count of the read from {from}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.0, w.base);
        assert!(g.1 == w.bytes, "bytes of batch {}", w.base);
    }
    src
}

async fn append_n(log: &Log, n: usize, tag0: u64, out: &mut Vec<Appended>) {
    for i in 0..n {
        let b = make_batch(3, 700, 1_000 + i as i64, tag0 + i as u64);
        out.push(append_one(log, &b, 1).await);
    }
}

#[test]
fn tail_reads_come_from_memory_with_identical_bytes() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(64 << 20);
        let cfg = small_config(1 << 30, 4096, FlushPolicy::default());
        let log = Log::open_with(tmp.path().join("p"), cfg, options(&budget, 8 << 20)).await.expect("open");
        let mut exp = Vec::new();
        append_n(&log, 200, 0, &mut exp).await;
        assert!(log.hot_tail_bytes() > 0);
        assert_eq!(budget.used_bytes(), log.hot_tail_bytes());
        // From every 7th batch: whole answers from memory, at several sizes.
        for (i, a) in exp.iter().enumerate().step_by(7) {
            for max in [1, 5000, 1 << 20] {
                let (mem, file) = read_check(&log, &exp, a.base + (i as u64 % 3), max).await;
                assert_eq!(file, 0, "read from {} (max {max}) touches no file", a.base);
                assert!(mem > 0);
            }
        }
        // The end of the log: empty.
        let end = log.high_watermark().0;
        assert!(log.read(Offset(end), 1 << 20).await.expect("read").is_empty());
        log.close().await.expect("close");
    });
}

#[test]
fn evicted_tail_is_read_from_the_file_with_identical_bytes() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        // Room for about one log's tail: the second log's appends evict the first.
        let budget = HotTailBudget::new(256 << 10);
        let cfg = small_config(1 << 30, 4096, FlushPolicy::default());
        let a =
            Log::open_with(tmp.path().join("a"), cfg.clone(), options(&budget, 256 << 10)).await.expect("a");
        let b = Log::open_with(tmp.path().join("b"), cfg, options(&budget, 256 << 10)).await.expect("b");
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        append_n(&a, 40, 0, &mut ea).await;
        let from = ea[30].base;
        let (mem, file) = read_check(&a, &ea, from, 1 << 20).await;
        assert_eq!((file, mem > 0), (0, true), "before eviction: memory only");
        append_n(&b, 200, 1000, &mut eb).await;
        assert!(budget.used_bytes() <= budget.bytes_max(), "{budget:?}");
        assert_eq!(a.hot_tail_bytes(), 0, "the least recently used log was evicted");
        assert!(budget.evicted_bytes() > 0);
        let (mem, file) = read_check(&a, &ea, from, 1 << 20).await;
        assert!(file > 0, "after eviction the read comes from the file");
        assert!(mem < BLOCK, "only the partial last block may still come from memory");
        // A range that ends before the last block: file chunks only.
        let (mem, file) = read_check(&a, &ea, ea[0].base, 1).await;
        assert_eq!((mem, file > 0), (0, true));
        // New appends make `a` hot again.
        append_n(&a, 5, 500, &mut ea).await;
        let (mem, file) = read_check(&a, &ea, ea[41].base, 1 << 20).await;
        assert_eq!((file, mem > 0), (0, true));
        assert!(budget.used_bytes() <= budget.bytes_max());
        a.close().await.expect("close a");
        b.close().await.expect("close b");
    });
}

#[test]
fn per_log_cap_and_reads_across_the_window_start() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(64 << 20);
        let cap = 64 << 10;
        let cfg = small_config(1 << 30, 4096, FlushPolicy::default());
        let log = Log::open_with(tmp.path().join("p"), cfg, options(&budget, cap)).await.expect("open");
        let mut exp = Vec::new();
        append_n(&log, 300, 0, &mut exp).await;
        assert!(log.hot_tail_bytes() <= cap && log.hot_tail_bytes() > 0);
        let mut saw = (false, false);
        for a in &exp {
            let (mem, file) = read_check(&log, &exp, a.base, 16 << 10).await;
            saw.0 |= file == 0;
            saw.1 |= file > 0 && mem < BLOCK;
        }
        assert_eq!(saw, (true, true), "both memory-only and file reads happened");
        // Everything, in small steps, through both paths.
        check_against(&exp, &read_all(&log, 0, 10_000).await, 0);
        log.close().await.expect("close");
    });
}

#[test]
fn hot_tail_across_rolls_truncation_and_reopen() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(64 << 20);
        let cfg = small_config(48 << 10, 4096, FlushPolicy::default());
        let dir = tmp.path().join("p");
        let log = Log::open_with(dir.clone(), cfg.clone(), options(&budget, 1 << 20)).await.expect("open");
        let mut exp = Vec::new();
        append_n(&log, 120, 0, &mut exp).await;
        assert!(log.segment_count() > 3);
        let last = exp.last().expect("appended").base;
        let (_, file) = read_check(&log, &exp, last, 1 << 20).await;
        assert_eq!(file, 0, "the newest batch is hot after rolls");
        check_against(&exp, &read_all(&log, 0, 7000).await, 0);
        // Truncate inside the active segment: no stale bytes from memory.
        let cut = exp[exp.len() - 3].base;
        log.truncate_to(Offset(cut)).await.expect("truncate");
        exp.truncate(exp.len() - 3);
        append_n(&log, 3, 9000, &mut exp).await;
        check_against(&exp, &read_all(&log, 0, 7000).await, 0);
        let (_, file) = read_check(&log, &exp, exp.last().expect("x").base, 1 << 20).await;
        assert_eq!(file, 0);
        log.close().await.expect("close");
        drop(log);
        assert_eq!(budget.used_bytes(), 0, "a dropped log gives its bytes back");
        let log = Log::open_with(dir, cfg, options(&budget, 1 << 20)).await.expect("reopen");
        check_against(&exp, &read_all(&log, 0, 1 << 20).await, 0);
        append_n(&log, 2, 7000, &mut exp).await;
        let (_, file) = read_check(&log, &exp, exp.last().expect("x").base, 1 << 20).await;
        assert_eq!(file, 0);
        log.close().await.expect("close");
    });
}

#[test]
fn flush_always_serves_only_durable_bytes_and_disabled_tail_uses_files() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(64 << 20);
        let cfg = small_config(1 << 30, 4096, FlushPolicy::Always);
        let log =
            Log::open_with(tmp.path().join("p"), cfg.clone(), options(&budget, 1 << 20)).await.expect("open");
        let mut exp = Vec::new();
        append_n(&log, 30, 0, &mut exp).await;
        let (_, file) = read_check(&log, &exp, exp[10].base, 1 << 20).await;
        assert_eq!(file, 0);
        log.close().await.expect("close");
        // Per-log cap 0: no hot tail.
        let off = Log::open_with(tmp.path().join("q"), cfg, options(&budget, 0)).await.expect("open");
        let mut exp = Vec::new();
        append_n(&off, 30, 0, &mut exp).await;
        assert_eq!(off.hot_tail_bytes(), 0);
        let (mem, file) = read_check(&off, &exp, exp[10].base, 1 << 20).await;
        assert!(file > 0 && mem < BLOCK);
        off.close().await.expect("close");
    });
}

#[test]
fn budget_holds_with_many_logs() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(200 << 10);
        let cfg = small_config(1 << 30, 4096, FlushPolicy::Never);
        let mut logs = Vec::new();
        let mut exps = Vec::new();
        for p in 0..6 {
            let dir = tmp.path().join(format!("p{p}"));
            logs.push(Log::open_with(dir, cfg.clone(), options(&budget, 100 << 10)).await.expect("open"));
            exps.push(Vec::new());
        }
        for round in 0..30u64 {
            for (p, log) in logs.iter().enumerate() {
                append_n(log, 2, round * 100 + p as u64 * 10, &mut exps[p]).await;
                assert!(budget.used_bytes() <= budget.bytes_max(), "{budget:?}");
                assert!(log.hot_tail_bytes() <= 100 << 10);
            }
        }
        let held: u64 = logs.iter().map(Log::hot_tail_bytes).sum();
        assert_eq!(held, budget.used_bytes());
        for (log, exp) in logs.iter().zip(&exps) {
            check_against(exp, &read_all(log, 0, 9000).await, 0);
            log.close().await.expect("close");
        }
    });
}

#[test]
fn batches_spanning_writes_are_hot_with_identical_bytes() {
    run(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = HotTailBudget::new(64 << 20);
        let cfg = small_config(1 << 30, 4096, FlushPolicy::default());
        let log = Rc::new(
            Log::open_with(tmp.path().join("p"), cfg, options(&budget, 16 << 20)).await.expect("open"),
        );
        let exp = append_straddling_concurrently(&log).await;
        let s = log.stats();
        assert!(s.writes > 4, "several writes: {s:?}");
        for a in &exp {
            let (_, file) = read_check(&log, &exp, a.base, 300 << 10).await;
            assert_eq!(file, 0, "batch {} is hot", a.base);
        }
        log.close().await.expect("close");
    });
}
