//! The shard's open-file budget: many logs share a budget far smaller than
//! the files they would keep open, so their write and read handles are
//! closed (least recently used first) and reopened on the next append or
//! read. Bytes read back must be identical, across clean and unclean
//! restarts.

mod log_support;

use log_support::*;
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::{FileBudget, Log, LogOptions, OPEN_FILES_SHARD_MIN};
use std::path::Path;
use std::rc::Rc;

const LOGS: usize = 24;

fn options(files: &Rc<FileBudget>) -> LogOptions {
    LogOptions { files: files.clone(), ..LogOptions::default() }
}

/// Every third log under each flush policy; small segments so that logs
/// also hold sealed segments (more handles to close and reopen).
fn config_for(i: usize) -> TopicConfig {
    let flush = match i % 3 {
        0 => FlushPolicy::Never,
        1 => FlushPolicy::Always,
        _ => FlushPolicy::Interval { ms: 1, bytes: 1 << 20 },
    };
    small_config(64 << 10, 1024, flush)
}

/// A tiny budget and the logs under it, each with nothing appended yet.
async fn start(root: &Path) -> (Rc<FileBudget>, Vec<Log>, Vec<Vec<Appended>>) {
    let files = FileBudget::new(OPEN_FILES_SHARD_MIN);
    let logs = open_all(root, &files).await;
    (files, logs, vec![Vec::new(); LOGS])
}

async fn open_all(root: &Path, files: &Rc<FileBudget>) -> Vec<Log> {
    let mut logs = Vec::new();
    for i in 0..LOGS {
        let log =
            Log::open_with(root.join(format!("t-{i}")), config_for(i), options(files)).await.expect("open");
        logs.push(log);
    }
    logs
}

/// Appends `rounds` batches to every log in turn; returns what each acknowledged.
async fn append_rounds(logs: &[Log], expected: &mut [Vec<Appended>], rounds: u64, tag0: u64) {
    for r in 0..rounds {
        for (i, log) in logs.iter().enumerate() {
            let tag = tag0 + r * 1000 + i as u64;
            let b =
                make_batch(1 + (tag % 4) as usize, 300 + (tag * 37 % 2000) as usize, 1_000 + tag as i64, tag);
            expected[i].push(append_one(log, &b, 3).await);
        }
    }
}

async fn check_all(logs: &[Log], expected: &[Vec<Appended>]) {
    for (log, want) in logs.iter().zip(expected) {
        check_against(want, &read_all(log, 0, 7_000).await, 0);
    }
}

#[test]
fn logs_in_turn_read_back_identical_bytes_after_their_files_were_closed() {
    run_in_tempdir(|root| async move {
        let (files, logs, mut expected) = start(&root).await;
        for step in 0..6 {
            append_rounds(&logs, &mut expected, 10, step * 100_000).await;
            // Reads in turn reopen sealed and active read handles.
            check_all(&logs, &expected).await;
        }
        let segments: Vec<usize> = logs.iter().map(Log::segment_count).collect();
        assert!(segments.iter().sum::<usize>() > 2 * LOGS, "the logs rolled segments: {segments:?}");
        assert!(files.evictions() > 100, "handles were closed and reopened: {files:?}");
        // Logs under flush `interval` may hold their write fd until the
        // timer syncs; the rest keeps to the budget.
        assert!(files.open_files() <= OPEN_FILES_SHARD_MIN + LOGS / 3, "{files:?}");
        for log in &logs {
            log.close().await.expect("clean close");
        }
        drop(logs);
        assert_eq!(files.open_files(), 0, "every counted fd is closed with its log");

        // A clean restart under the same tiny budget, then more in turn.
        let logs = open_all(&root, &files).await;
        check_all(&logs, &expected).await;
        append_rounds(&logs, &mut expected, 5, 900_000).await;
        check_all(&logs, &expected).await;
    });
}

#[test]
fn unclean_stop_with_closed_files_recovers_every_acknowledged_batch() {
    run_in_tempdir(|root| async move {
        let (files, logs, mut expected) = start(&root).await;
        append_rounds(&logs, &mut expected, 30, 0).await;
        for log in &logs {
            // What `never` and `interval` acknowledged must survive a process
            // stop (not a machine crash); `flush` makes the test independent
            // of the interval timer.
            log.flush().await.expect("flush");
        }
        assert!(files.evictions() > 0, "{files:?}");
        // Unclean: no close, no clean-shutdown marker; recovery rescans.
        drop(logs);
        for i in 0..LOGS {
            assert!(!root.join(format!("t-{i}/.clean_shutdown")).exists());
        }
        let logs = open_all(&root, &files).await;
        check_all(&logs, &expected).await;
        append_rounds(&logs, &mut expected, 5, 500_000).await;
        check_all(&logs, &expected).await;
    });
}
