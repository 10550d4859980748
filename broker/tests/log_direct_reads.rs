//! `direct_reads` (the plain fetch path's O_DIRECT segment reads): a brand
//! new log (its first file is empty, which used to make glommio route every
//! later O_DIRECT read to a polled ring that fails with EOPNOTSUPP) reads back
//! exactly the bytes appended, at unaligned positions and sizes, across
//! segment rolls, from the active segment's partial last block, and after a
//! reopen; every file chunk comes from an O_DIRECT handle.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogOptions, LogRead, ReadChunk};
use shardlog_schema::Offset;

fn direct_options() -> LogOptions {
    // No hot tail: every read goes to the segment files.
    LogOptions { hot_tail_log_bytes_max: 0, direct_reads: true, ..LogOptions::default() }
}

/// Bytes of a read that came from files, checking each file handle is O_DIRECT.
fn file_bytes_all_direct(r: &LogRead) -> usize {
    r.chunks
        .iter()
        .map(|c| match c {
            ReadChunk::File { file, len, .. } => {
                assert!(file.is_direct(), "file chunk from a buffered handle: {}", file.path().display());
                *len
            }
            ReadChunk::Memory(_) => 0,
        })
        .sum()
}

async fn check_reads(log: &Log, expected: &[Appended]) {
    let mut from_files = 0;
    for (i, a) in expected.iter().enumerate().step_by(5) {
        for max in [1, 3000, 70_000, 1 << 20] {
            let r = log.read(Offset(a.base + (i as u64 % 2)), max).await.expect("read");
            from_files += file_bytes_all_direct(&r);
        }
    }
    assert!(from_files > 0, "reads were served from files");
    for max in [1, 5000, 4 << 20] {
        check_against(expected, &read_all(log, 0, max).await, 0);
    }
}

#[test]
fn direct_reads_return_the_appended_bytes_across_rolls_and_reopen() {
    run_in_tempdir(|dir| async move {
        // 256 KiB segments: 600 batches of ~2.1 KB roll several times.
        let cfg = small_config(256 << 10, 4096, FlushPolicy::default());
        let log = Log::open_with(dir.join("p"), cfg.clone(), direct_options()).await.expect("open");
        assert!(log.direct_io(), "the test directory supports O_DIRECT");
        let mut exp = Vec::new();
        for i in 0..600u64 {
            // Odd sizes: batches straddle blocks and segment ends.
            let b = make_batch(1 + (i % 4) as usize, 333 + (i % 7) as usize * 101, 1_000 + i as i64, i);
            exp.push(append_one(&log, &b, 1).await);
        }
        assert!(log.segment_count() > 3, "the log rolled: {} segments", log.segment_count());
        check_reads(&log, &exp).await;
        log.close().await.expect("close");

        let log = Log::open_with(dir.join("p"), cfg, direct_options()).await.expect("reopen");
        check_reads(&log, &exp).await;
        // Appends after the reopen, read back from the active segment.
        for i in 600..650u64 {
            exp.push(append_one(&log, &make_batch(2, 900, 1_000 + i as i64, i), 1).await);
        }
        check_reads(&log, &exp).await;
        log.close().await.expect("close");
    });
}
