//! Retention by size and age, reads below the start, truncation.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogError};
use shardlog_schema::{ErrorCode, Offset};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn retention_by_size_keeps_the_newest_and_never_the_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let mut config = small_config(8 << 10, 512, FlushPolicy::Never);
        config.retention_bytes = Some(40 << 10);
        let path = dir.path().join("t-0");
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..400 {
            expected.push(append_one(&log, &make_batch(2, 200, now_ms(), i), 0).await);
        }
        let before = log.size_bytes();
        let segments = log.segment_count();
        let out = log.enforce_retention(now_ms()).await.unwrap();
        assert!(out.segments_deleted > 0);
        assert_eq!(log.size_bytes(), before - out.bytes_deleted);
        assert!(log.size_bytes() >= 40 << 10 && log.size_bytes() < (40 << 10) + (8 << 10) + 1024);
        assert_eq!(log.segment_count(), segments - out.segments_deleted);
        let start = log.start_offset().0;
        assert!(start > 0);
        let err = log.read(Offset(start - 1), 1000).await.unwrap_err();
        match &err {
            LogError::OffsetOutOfRange { requested, start: s, end } => {
                assert_eq!((requested.0, s.0, end.0), (start - 1, start, log.end_offset().0));
            }
            other => panic!("expected OffsetOutOfRange, got {other}"),
        }
        assert_eq!(err.error_code(), ErrorCode::OffsetOutOfRange);
        check_against(&expected, &read_all(&log, start, 5000).await, start);
        // A tiny limit deletes every sealed segment but keeps the active one.
        log.close().await.unwrap();
        config.retention_bytes = Some(1);
        let log = Log::open(path, config).await.unwrap();
        assert_eq!(log.start_offset().0, start, "start offset survives a restart");
        log.enforce_retention(now_ms()).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        let start = log.start_offset().0;
        check_against(&expected, &read_all(&log, start, 5000).await, start);
        log.close().await.unwrap();
    });
}

#[test]
fn retention_by_age_uses_the_largest_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let mut config = small_config(8 << 10, 512, FlushPolicy::Never);
        config.retention_ms = Some(3_600_000);
        let log = Log::open(dir.path().join("t-0"), config).await.unwrap();
        let old = now_ms() - 10 * 3_600_000;
        for i in 0..100 {
            append_one(&log, &make_batch(2, 200, old, i), 0).await;
        }
        let first_new = append_one(&log, &make_batch(2, 200, now_ms(), 100), 0).await;
        for i in 101..200 {
            append_one(&log, &make_batch(2, 200, now_ms(), i), 0).await;
        }
        let out = log.enforce_retention(now_ms()).await.unwrap();
        assert!(out.segments_deleted > 0);
        // Segments holding only old batches are gone; the one with the first new batch stays.
        assert!(log.start_offset().0 <= first_new.base);
        assert!(log.start_offset().0 > first_new.base.saturating_sub(100), "old segments deleted");
        let again = log.enforce_retention(now_ms()).await.unwrap();
        assert_eq!(again.segments_deleted, 0);
        log.close().await.unwrap();
    });
}

#[test]
fn truncate_to_drops_the_suffix_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let config = small_config(8 << 10, 512, FlushPolicy::Always);
        let path = dir.path().join("t-0");
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..200 {
            expected.push(append_one(&log, &make_batch(2, 150, 1, i), 0).await);
        }
        // Inside the active segment.
        let cut = expected[195].base;
        log.truncate_to(Offset(cut)).await.unwrap();
        assert_eq!(log.end_offset().0, cut);
        expected.truncate(195);
        check_against(&expected, &read_all(&log, 0, 4000).await, 0);
        // Inside an older, sealed segment, then keep appending.
        let cut = expected[40].base;
        let err = log.truncate_to(Offset(cut + 1)).await.unwrap_err();
        assert!(matches!(err, LogError::NotBatchBoundary { .. }), "{err}");
        log.truncate_to(Offset(cut)).await.unwrap();
        expected.truncate(40);
        assert_eq!(log.end_offset().0, cut);
        for i in 0..30 {
            expected.push(append_one(&log, &make_batch(1, 500, 2, 1000 + i), 5).await);
        }
        check_against(&expected, &read_all(&log, 0, 4000).await, 0);
        log.close().await.unwrap();
        let log = Log::open(path, config).await.unwrap();
        check_against(&expected, &read_all(&log, 0, 4000).await, 0);
        log.delete().await.unwrap();
        assert!(!dir.path().join("t-0").exists());
    });
}
