//! Idempotent appends: a retried batch is answered with its first offsets
//! and stored once; gaps and stale epochs get typed errors; the state
//! survives a clean close, a crash, a roll and a truncation.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogError};
use shardlog_schema::batch::BatchBuilder;
use shardlog_schema::ErrorCode;
use std::path::Path;

/// A batch of `records` records from producer `pid` at `epoch`, first
/// sequence `seq`.
fn idem_batch(pid: i64, epoch: i16, seq: i32, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(records * 64 + 128);
    b.set_producer(pid, epoch, seq);
    for i in 0..records {
        b.push(None, format!("p{pid}-e{epoch}-s{}", seq as usize + i).as_bytes(), &[], 1_000 + i as i64);
    }
    b.finish()
}

fn code(e: &LogError) -> ErrorCode {
    e.error_code()
}

async fn records(log: &Log) -> usize {
    read_all(log, 0, 1 << 20).await.len()
}

#[test]
fn a_retried_batch_gets_its_first_offsets_and_is_stored_once() {
    run_in_tempdir(|dir| async move {
        let log = Log::open(dir.clone(), small_config(1 << 20, 4096, FlushPolicy::Always)).await.unwrap();
        let first = log.append(&idem_batch(7, 0, 0, 3), 1).await.unwrap();
        let second = log.append(&idem_batch(7, 0, 3, 2), 1).await.unwrap();
        assert_eq!((first.base_offset.0, second.base_offset.0), (0, 3));
        // Retries of either batch (the client lost the answer).
        let again = log.append(&idem_batch(7, 0, 0, 3), 1).await.unwrap();
        assert_eq!((again.base_offset.0, again.last_offset.0), (0, 2));
        let again = log.append(&idem_batch(7, 0, 3, 2), 1).await.unwrap();
        assert_eq!((again.base_offset.0, again.last_offset.0), (3, 4));
        assert_eq!(log.end_offset().0, 5, "nothing appended twice");
        assert_eq!(records(&log).await, 2, "two batches stored");
        // Batches without a producer id are never checked.
        log.append(&make_batch(2, 10, 5, 1), 1).await.unwrap();
        log.append(&make_batch(2, 10, 5, 1), 1).await.unwrap();
        assert_eq!(log.end_offset().0, 9);
        log.close().await.unwrap();
    });
}

#[test]
fn gaps_and_stale_epochs_are_refused_with_typed_errors() {
    run_in_tempdir(|dir| async move {
        let log = Log::open(dir.clone(), small_config(1 << 20, 4096, FlushPolicy::Never)).await.unwrap();
        log.append(&idem_batch(9, 2, 0, 4), 1).await.unwrap();
        let gap = log.append(&idem_batch(9, 2, 5, 1), 1).await.unwrap_err();
        assert_eq!(code(&gap), ErrorCode::OutOfOrderSequence, "{gap}");
        let stale = log.append(&idem_batch(9, 1, 4, 1), 1).await.unwrap_err();
        assert_eq!(code(&stale), ErrorCode::InvalidProducerEpoch, "{stale}");
        let new_epoch_mid = log.append(&idem_batch(9, 3, 4, 1), 1).await.unwrap_err();
        assert_eq!(code(&new_epoch_mid), ErrorCode::OutOfOrderSequence, "a new epoch starts at 0");
        // Several batches in one append must follow on, and hold no retry.
        let mut gap = idem_batch(9, 2, 4, 1);
        gap.extend(idem_batch(9, 2, 6, 1));
        assert_eq!(code(&log.append(&gap, 1).await.unwrap_err()), ErrorCode::OutOfOrderSequence);
        let mut with_retry = idem_batch(9, 2, 0, 4);
        with_retry.extend(idem_batch(9, 2, 4, 1));
        let e = log.append(&with_retry, 1).await.unwrap_err();
        assert_eq!(code(&e), ErrorCode::InvalidRequest, "{e}");
        // The refused appends left no trace: the next in sequence goes on,
        // two batches at once.
        let mut two = idem_batch(9, 2, 4, 1);
        two.extend(idem_batch(9, 2, 5, 2));
        let next = log.append(&two, 1).await.unwrap();
        assert_eq!((next.base_offset.0, next.last_offset.0), (4, 6));
        // Both are remembered: a retry of the second alone is a duplicate.
        assert_eq!(log.append(&idem_batch(9, 2, 5, 2), 1).await.unwrap().base_offset.0, 5);
        log.append(&idem_batch(9, 3, 0, 1), 1).await.unwrap();
        assert_eq!(log.end_offset().0, 8);
        log.close().await.unwrap();
    });
}

/// Appends batches 0..n of producer 5 (2 records each), rolling segments often.
async fn fill(log: &Log, n: i32) {
    for i in 0..n {
        let a = log.append(&idem_batch(5, 0, i * 2, 2), 1).await.unwrap();
        assert_eq!(a.base_offset.0, i as u64 * 2);
    }
}

async fn check_retries_after_reopen(dir: &Path, n: i32) {
    let log = Log::open(dir.to_path_buf(), small_config(2048, 256, FlushPolicy::Always)).await.unwrap();
    assert_eq!(log.end_offset().0, n as u64 * 2);
    // The last 5 batches are remembered: their retries are duplicates.
    for i in n - 5..n {
        let a = log.append(&idem_batch(5, 0, i * 2, 2), 1).await.unwrap();
        assert_eq!(a.base_offset.0, i as u64 * 2, "batch {i} is a duplicate after reopening");
    }
    assert_eq!(log.end_offset().0, n as u64 * 2, "no retry appended");
    let gap = log.append(&idem_batch(5, 0, n * 2 + 1, 1), 1).await.unwrap_err();
    assert_eq!(gap.error_code(), ErrorCode::OutOfOrderSequence);
    let next = log.append(&idem_batch(5, 0, n * 2, 2), 1).await.unwrap();
    assert_eq!(next.base_offset.0, n as u64 * 2);
    log.close().await.unwrap();
}

#[test]
fn producer_state_survives_a_clean_close_across_rolls() {
    run_in_tempdir(|dir| async move {
        let log = Log::open(dir.clone(), small_config(2048, 256, FlushPolicy::Always)).await.unwrap();
        fill(&log, 40).await;
        assert!(log.stats().rolls >= 3, "small segments rolled: {:?}", log.stats());
        log.close().await.unwrap();
        drop(log);
        check_retries_after_reopen(&dir, 40).await;
    });
}

#[test]
fn producer_state_survives_a_crash_from_the_roll_snapshot_and_the_scan() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    run(async {
        let log = Log::open(dir.clone(), small_config(2048, 256, FlushPolicy::Always)).await.unwrap();
        fill(&log, 40).await;
        assert!(log.stats().rolls >= 3);
        // No close: as after SIGKILL, the last roll's snapshot and the
        // active segment's scan must give the state back.
        std::mem::forget(log);
    });
    assert!(!dir.join(".clean_shutdown").exists());
    assert!(dir.join("producers.snapshot").exists(), "a roll wrote a snapshot");
    run(check_retries_after_reopen(&dir, 40));
}

#[test]
fn a_truncated_batch_is_no_longer_a_duplicate_and_appends_after_it_survive_a_crash() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    run(async {
        let log = Log::open(dir.clone(), small_config(2048, 256, FlushPolicy::Always)).await.unwrap();
        fill(&log, 30).await;
        // Into a sealed segment: later snapshots described what is now gone.
        log.truncate_to(shardlog_schema::Offset(20)).await.unwrap();
        // Batch 10 (offsets 20-21) is gone: its resend is appended again,
        // where it was; batch 9 is still a duplicate.
        let dup = log.append(&idem_batch(5, 0, 18, 2), 1).await.unwrap();
        assert_eq!(dup.base_offset.0, 18);
        for i in 10..16 {
            let a = log.append(&idem_batch(5, 0, i * 2, 2), 1).await.unwrap();
            assert_eq!(a.base_offset.0, i as u64 * 2);
        }
        std::mem::forget(log);
    });
    // The batches appended after the truncation are remembered after a crash.
    run(check_retries_after_reopen(&dir, 16));
}

#[test]
fn a_cut_on_a_segment_boundary_still_knows_the_batch_before_it() {
    trace();
    run_in_tempdir(|dir| async move {
        let log = Log::open(dir.clone(), small_config(2048, 256, FlushPolicy::Always)).await.unwrap();
        fill(&log, 30).await;
        // The base offsets of the sealed segments, from their file names.
        let mut bases: Vec<u64> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".log")?.parse().ok())
            .collect();
        bases.sort_unstable();
        assert!(bases.len() >= 3, "small segments rolled: {bases:?}");
        // A cut exactly at the second segment's start: the cut segment
        // keeps nothing, so the producer's last batch below the cut is in
        // the segment before.
        let cut = bases[1];
        log.truncate_to(shardlog_schema::Offset(cut)).await.unwrap();
        assert_eq!(log.end_offset().0, cut);
        let last = (cut / 2 - 1) as i32;
        let dup = log.append(&idem_batch(5, 0, last * 2, 2), 1).await.unwrap();
        assert_eq!(dup.base_offset.0, cut - 2, "the batch just below the cut is a duplicate");
        assert_eq!(log.end_offset().0, cut, "nothing appended");
        let gap = log.append(&idem_batch(5, 0, last * 2 + 3, 2), 1).await.unwrap_err();
        assert_eq!(code(&gap), ErrorCode::OutOfOrderSequence);
        let next = log.append(&idem_batch(5, 0, last * 2 + 2, 2), 1).await.unwrap();
        assert_eq!(next.base_offset.0, cut);
        log.close().await.unwrap();
    });
}
