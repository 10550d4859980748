//! Append/read round trips across segment rolls and index boundaries.

mod log_support;

use log_support::*;
use proptest::prelude::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogError, ReadChunk};
use shardlog_schema::{ErrorCode, Offset};
use std::rc::Rc;

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_across_rolls(
        batches in prop::collection::vec((1usize..6, 0usize..3000), 1..80),
        interval in prop::sample::select(vec![1u32, 256, 4096]),
        max_bytes in prop::sample::select(vec![1usize, 700, 5000, 1 << 20]),
        probes in prop::collection::vec(any::<u64>(), 4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        run(async {
            let path = dir.path().join("t-0");
            let config = small_config(16 << 10, interval, FlushPolicy::default());
            let log = Log::open(path.clone(), config.clone()).await.unwrap();
            let mut expected = Vec::new();
            for (i, (records, value)) in batches.iter().enumerate() {
                let b = make_batch(*records, *value, 1_000 + i as i64 * 10, i as u64);
                expected.push(append_one(&log, &b, 3).await);
            }
            let end = expected.last().unwrap().last + 1;
            assert_eq!(log.end_offset().0, end);
            assert_eq!(log.high_watermark().0, end);
            check_against(&expected, &read_all(&log, 0, max_bytes).await, 0);
            for p in &probes {
                let from = p % end;
                check_against(&expected, &read_all(&log, from, max_bytes).await, from);
            }
            // A clean reopen serves the same bytes.
            log.close().await.unwrap();
            let log = Log::open(path, config).await.unwrap();
            assert_eq!(log.end_offset().0, end);
            check_against(&expected, &read_all(&log, 0, max_bytes).await, 0);
            let from = probes[0] % end;
            check_against(&expected, &read_all(&log, from, max_bytes).await, from);
            log.close().await.unwrap();
        });
    }
}

#[test]
fn concurrent_appends_are_group_committed_in_order() {
    trace();
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let config = small_config(256 << 10, 1024, FlushPolicy::Always);
        let log = Rc::new(Log::open(dir.path().join("t-0"), config).await.unwrap());
        let mut tasks = Vec::new();
        for t in 0..32u64 {
            let log = log.clone();
            tasks.push(glommio::spawn_local(async move {
                let mut got = Vec::new();
                for i in 0..20u64 {
                    let b = make_batch(3, 100 + (t * 7 + i) as usize % 900, 5, t * 100 + i);
                    got.push(append_one(&log, &b, 1).await);
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await);
        }
        all.sort_by_key(|a| a.base);
        for w in all.windows(2) {
            assert_eq!(w[0].last + 1, w[1].base, "offsets are consecutive, no gaps or overlaps");
        }
        let stats = log.stats();
        assert_eq!(stats.appends, 640);
        assert!(stats.fdatasyncs < stats.appends, "concurrent appends share fdatasyncs: {stats:?}");
        assert!(stats.writes < stats.appends, "concurrent appends share writes: {stats:?}");
        assert!(log.segment_count() > 1, "rolled");
        assert_eq!(log.durable_offset(), log.end_offset());
        check_against(&all, &read_all(&log, 0, 64 << 10).await, 0);
        log.close().await.unwrap();
    });
}

#[test]
fn reads_out_of_range_and_at_end() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let log = Log::open(dir.path().join("t-0"), small_config(64 << 10, 4096, FlushPolicy::Never))
            .await
            .unwrap();
        assert!(log.read(Offset(0), 100).await.unwrap().is_empty());
        let a = append_one(&log, &make_batch(5, 10, 1, 1), 0).await;
        assert_eq!((a.base, a.last), (0, 4));
        // Mid-batch offsets return the whole batch.
        let r = log.read(Offset(3), 1).await.unwrap();
        assert_eq!(r.first_offset, Offset(0));
        assert_eq!(r.last_offset, Offset(4));
        assert_eq!(r.clone_bytes().await, a.bytes);
        assert!(log.read(Offset(5), 100).await.unwrap().is_empty());
        let err = log.read(Offset(6), 100).await.unwrap_err();
        assert!(
            matches!(
                err,
                LogError::OffsetOutOfRange { requested: Offset(6), start: Offset(0), end: Offset(5) }
            ),
            "{err}"
        );
        assert_eq!(err.error_code(), ErrorCode::OffsetOutOfRange);
        // Corrupt input is refused before anything is assigned.
        let mut bad = make_batch(1, 10, 1, 2);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let err = log.append(&bad, 0).await.unwrap_err();
        assert_eq!(err.error_code(), ErrorCode::CorruptMessage);
        assert_eq!(log.end_offset(), Offset(5));
        log.close().await.unwrap();
    });
}

#[test]
fn file_chunks_expose_a_spliceable_fd() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let log = Log::open(dir.path().join("t-0"), small_config(64 << 10, 4096, FlushPolicy::Never))
            .await
            .unwrap();
        let mut expected = Vec::new();
        for i in 0..40 {
            expected.push(append_one(&log, &make_batch(2, 300, 1, i), 0).await);
        }
        let r = log.read(Offset(0), 1 << 20).await.unwrap();
        let mut bytes = Vec::new();
        for c in &r.chunks {
            match c {
                ReadChunk::File { file, position, len } => {
                    let mut buf = vec![0u8; *len];
                    // SAFETY: `buf` is valid for `len` bytes and the fd is open (held by `file`).
                    let n = unsafe {
                        libc::pread(file.raw_fd(), buf.as_mut_ptr().cast(), *len, *position as libc::off_t)
                    };
                    assert_eq!(n as usize, *len);
                    bytes.extend_from_slice(&buf);
                }
                ReadChunk::Memory(b) => bytes.extend_from_slice(b),
            }
        }
        assert_eq!(bytes.len(), r.bytes);
        check_against(&expected, &split_batches(&bytes), 0);
        log.close().await.unwrap();
    });
}

#[test]
fn offset_for_timestamp_uses_record_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let log = Log::open(dir.path().join("t-0"), small_config(64 << 10, 512, FlushPolicy::default()))
            .await
            .unwrap();
        // Batch i holds 4 records with timestamps 10_000 + 10 i + {0,1,2,3}.
        for i in 0..300u64 {
            append_one(&log, &make_batch(4, 200, 10_000 + 10 * i as i64, i), 0).await;
        }
        assert!(log.segment_count() > 2);
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some((Offset(0), 10_000)));
        assert_eq!(log.offset_for_timestamp(10_002).await.unwrap(), Some((Offset(2), 10_002)));
        assert_eq!(log.offset_for_timestamp(10_005).await.unwrap(), Some((Offset(4), 10_010)));
        assert_eq!(log.offset_for_timestamp(12_001).await.unwrap(), Some((Offset(801), 12_001)));
        assert_eq!(log.offset_for_timestamp(12_993).await.unwrap(), Some((Offset(1199), 12_993)));
        assert_eq!(log.offset_for_timestamp(12_994).await.unwrap(), None);
        log.close().await.unwrap();
    });
}

#[test]
fn large_concurrent_appends_span_write_chunks() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let config = small_config(64 << 20, 4096, FlushPolicy::default());
        let path = dir.path().join("t-0");
        let log = Rc::new(Log::open(path.clone(), config.clone()).await.unwrap());
        let all = append_straddling_concurrently(&log).await;
        let s = log.stats();
        assert!(s.bytes_written / s.writes > 256 << 10, "writes are large: {s:?}");
        check_against(&all, &read_all(&log, 0, 300_000).await, 0);
        log.close().await.unwrap();
        let log = Log::open(path, config).await.unwrap();
        check_against(&all, &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
    });
}
