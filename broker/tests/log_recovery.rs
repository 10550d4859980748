//! Recovery: torn tails cut at every byte, flipped bytes, lost indexes.

mod log_support;

use log_support::*;
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::Log;
use std::path::{Path, PathBuf};

/// Builds a cleanly closed log of several segments; returns the expected batches.
fn build(dir: &Path, config: &TopicConfig, batches: u64) -> Vec<Appended> {
    run(async {
        let log = Log::open(dir.to_path_buf(), config.clone()).await.unwrap();
        let mut out = Vec::new();
        for i in 0..batches {
            out.push(
                append_one(&log, &make_batch(1 + i as usize % 4, 40 + (i as usize * 13) % 300, 100, i), 2)
                    .await,
            );
        }
        log.close().await.unwrap();
        out
    })
}

/// Opens a damaged copy and checks that exactly `keep` batches survive, all
/// intact, and that the log takes appends again right after them.
fn check_recovers_to(dir: &Path, config: &TopicConfig, expected: &[Appended], keep: usize) {
    run(async {
        let log = Log::open(dir.to_path_buf(), config.clone()).await.unwrap();
        let next = expected[..keep].last().map_or(0, |a| a.last + 1);
        assert_eq!(log.end_offset().0, next, "next offset restored");
        check_against(&expected[..keep], &read_all(&log, 0, 1 << 20).await, 0);
        let a = append_one(&log, &make_batch(2, 10, 5, 999), 3).await;
        assert_eq!(a.base, next);
        let got = read_all(&log, a.base, 1 << 20).await;
        assert_eq!(got.len(), 1);
        assert!(got[0].1 == a.bytes);
        log.close().await.unwrap();
    });
}

#[test]
fn torn_tail_at_every_byte_of_the_last_batch() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(8 << 10, 256, FlushPolicy::Never);
    let orig = tmp.path().join("orig");
    let expected = build(&orig, &config, 120);
    let last = expected.last().unwrap();
    let seg = last_log_file(&orig);
    let seg_len = std::fs::metadata(&seg).unwrap().len();
    let batch_start = seg_len - last.bytes.len() as u64;
    // Every byte of the header and the first record; then a stride (every
    // byte with SHARDLOG_SLOW_TESTS=1).
    let slow = std::env::var_os("SHARDLOG_SLOW_TESTS").is_some();
    let mut cut = batch_start;
    while cut < seg_len {
        let step = if slow || cut < batch_start + 80 { 1 } else { 29 };
        let work = tmp.path().join(format!("cut-{cut}"));
        copy_dir(&orig, &work);
        std::fs::remove_file(work.join(".clean_shutdown")).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(work.join(seg.file_name().unwrap())).unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        check_recovers_to(&work, &config, &expected, expected.len() - 1);
        std::fs::remove_dir_all(&work).unwrap();
        cut += step;
    }
    // Uncut, without the marker: everything survives a full rescan.
    let work = tmp.path().join("uncut");
    copy_dir(&orig, &work);
    std::fs::remove_file(work.join(".clean_shutdown")).unwrap();
    check_recovers_to(&work, &config, &expected, expected.len());
}

#[test]
fn flipped_byte_in_the_last_batch_truncates_it() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(8 << 10, 256, FlushPolicy::Never);
    let orig = tmp.path().join("orig");
    let expected = build(&orig, &config, 60);
    let last = expected.last().unwrap();
    let seg = last_log_file(&orig);
    let seg_len = std::fs::metadata(&seg).unwrap().len();
    let batch_start = seg_len - last.bytes.len() as u64;
    for at in (0..last.bytes.len()).step_by(31).chain([0, 9, 13, 16, 17, 21, last.bytes.len() - 1]) {
        let work = tmp.path().join(format!("flip-{at}"));
        copy_dir(&orig, &work);
        std::fs::remove_file(work.join(".clean_shutdown")).unwrap();
        let path = work.join(seg.file_name().unwrap());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(batch_start as usize) + at] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        // The leader epoch (bytes 12..16) is stamped by the broker and is not
        // covered by the CRC: flipping it changes the epoch, not validity.
        if (12..16).contains(&at) {
            run(async {
                let log = Log::open(work.clone(), config.clone()).await.unwrap();
                assert_eq!(log.end_offset().0, last.last + 1);
                log.close().await.unwrap();
            });
        } else {
            check_recovers_to(&work, &config, &expected, expected.len() - 1);
        }
        std::fs::remove_dir_all(&work).unwrap();
    }
}

#[test]
fn lost_or_damaged_indexes_are_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(8 << 10, 256, FlushPolicy::Never);
    let orig = tmp.path().join("orig");
    let expected = build(&orig, &config, 150);
    let mut indexes: Vec<PathBuf> = std::fs::read_dir(&orig)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "index" || x == "timeindex"))
        .collect();
    indexes.sort();
    assert!(indexes.len() >= 6, "several sealed segments");
    std::fs::remove_file(&indexes[0]).unwrap();
    std::fs::write(&indexes[2], b"garbage").unwrap();
    let mut b = std::fs::read(&indexes[4]).unwrap();
    let n = b.len();
    b[n - 5] ^= 1;
    std::fs::write(&indexes[4], b).unwrap();
    std::fs::remove_file(orig.join(".clean_shutdown")).unwrap();
    check_recovers_to(&orig, &config, &expected, expected.len());
    // The rebuilt indexes are trusted on the next open.
    run(async {
        let log = Log::open(orig.clone(), config.clone()).await.unwrap();
        let mut all = expected.clone();
        all.push(
            read_all(&log, expected.last().unwrap().last + 1, 1 << 20)
                .await
                .pop()
                .map(|(base, bytes)| Appended { base, last: base + 1, bytes })
                .unwrap(),
        );
        for from in [0, 37, 150, 300] {
            check_against(&all, &read_all(&log, from, 3000).await, from);
        }
        log.close().await.unwrap();
    });
}

#[test]
fn damaged_sealed_segment_ends_the_log_there() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(8 << 10, 256, FlushPolicy::Never);
    let dir = tmp.path().join("d");
    let expected = build(&dir, &config, 150);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    // Cut the second segment in half and drop its index so it is rescanned.
    let victim = &logs[1];
    let len = std::fs::metadata(victim).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(victim).unwrap().set_len(len / 2).unwrap();
    std::fs::remove_file(victim.with_extension("index")).unwrap();
    std::fs::remove_file(dir.join(".clean_shutdown")).unwrap();
    run(async {
        let log = Log::open(dir.clone(), config.clone()).await.unwrap();
        assert_eq!(log.segment_count(), 2);
        let end = log.end_offset().0;
        let keep = expected.iter().take_while(|a| a.last < end).count();
        assert!(keep > 0 && keep < expected.len());
        check_against(&expected[..keep], &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
    });
}
