//! The recovery point: an unclean open trusts the active segment's bytes
//! below the last point and validates only what follows; a point for
//! another segment, a point a truncation overtook, or a damaged point is
//! not trusted; idempotent producers' state comes back through it.

mod log_support;

use log_support::*;
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::Log;
use shardlog_schema::batch::BatchBuilder;
use shardlog_schema::{ErrorCode, Offset};
use std::path::Path;

const POINT: &str = "recovery.point";

fn config() -> TopicConfig {
    small_config(64 << 20, 1024, FlushPolicy::Never)
}

fn batch(tag: u64) -> Vec<u8> {
    make_batch(1 + tag as usize % 3, 1500 + (tag as usize * 7) % 900, 10_000 + tag as i64 * 10, tag)
}

async fn append_tags(log: &Log, tags: std::ops::Range<u64>) -> Vec<Appended> {
    let mut out = Vec::new();
    for tag in tags {
        out.push(append_one(log, &batch(tag), 3).await);
    }
    out
}

/// A log of `before` batches, a recovery point, then `after` batches, left
/// as a SIGKILL leaves it (no close). Returns what was appended and the
/// point's position in the segment (the end of the first `before` batches).
fn crashed_log(dir: &Path, before: u64, after: u64) -> (Vec<Appended>, u64) {
    run(async {
        let log = Log::open(dir.to_path_buf(), config()).await.unwrap();
        let mut all = append_tags(&log, 0..before).await;
        assert!(log.write_recovery_point().await.unwrap(), "over 1 MiB was written: a point is due");
        assert!(!log.write_recovery_point().await.unwrap(), "nothing written since: no new point");
        all.extend(append_tags(&log, before..before + after).await);
        std::mem::forget(log);
        let pos = all[..before as usize].iter().map(|a| a.bytes.len() as u64).sum();
        (all, pos)
    })
}

/// What a reopened log holds: its end offset, every record read back
/// (offset, value), and the offset `offset_for_timestamp` finds for every
/// 17th batch's first timestamp.
type Reopened = (u64, Vec<(u64, Vec<u8>)>, Vec<Option<u64>>);

/// Opens `dir` and returns what it holds; checks the log takes an append
/// right after.
fn reopen(dir: &Path, expected: &[Appended]) -> Reopened {
    run(async {
        let log = Log::open(dir.to_path_buf(), config()).await.unwrap();
        let end = log.end_offset().0;
        let read = read_all(&log, 0, 1 << 20).await;
        let mut found = Vec::new();
        for tag in (0..expected.len() as u64).step_by(17) {
            found.push(log.offset_for_timestamp(10_000 + tag as i64 * 10).await.unwrap().map(|(o, _)| o.0));
        }
        let next = append_one(&log, &batch(9_999), 4).await;
        assert_eq!(next.base, end, "appends go on at the recovered end");
        log.close().await.unwrap();
        (end, read, found)
    })
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn an_unclean_open_trusts_the_bytes_below_the_point_and_validates_the_rest() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let orig = tmp.path().join("orig");
    let (expected, point_pos) = crashed_log(&orig, 400, 60);
    assert!(orig.join(POINT).exists());
    assert!(!orig.join(".clean_shutdown").exists());
    let seg = last_log_file(&orig);
    let copy = |name: &str, with_point: bool| {
        let work = tmp.path().join(name);
        copy_dir(&orig, &work);
        if !with_point {
            std::fs::remove_file(work.join(POINT)).unwrap();
        }
        work
    };

    // Intact: the same log with and without the point (offsets, bytes, time lookups).
    let with = reopen(&copy("intact", true), &expected);
    let without = reopen(&copy("intact-no-point", false), &expected);
    check_against(&expected, &with.1, 0);
    assert_eq!(with.0, expected.last().unwrap().last + 1);
    assert_eq!(with, without, "a point changes nothing a full scan would find");

    // A byte flipped below the point is not looked at again (that is what
    // the point saves); without the point the scan cuts the log there.
    let victim = &expected[10];
    let victim_pos: u64 = expected[..10].iter().map(|a| a.bytes.len() as u64).sum::<u64>() + 100;
    assert!(victim_pos < point_pos);
    for (name, with_point, end) in
        [("flip-below", true, expected.last().unwrap().last + 1), ("flip-below-no-point", false, victim.base)]
    {
        let work = copy(name, with_point);
        flip(&work.join(seg.file_name().unwrap()), victim_pos);
        let got = run(async {
            let log = Log::open(work.clone(), config()).await.unwrap();
            let end = log.end_offset().0;
            log.close().await.unwrap();
            end
        });
        assert_eq!(got, end, "{name}");
    }

    // Torn or damaged after the point: validated and cut as ever.
    let torn_batch = 430;
    let torn_at: u64 = expected[..torn_batch].iter().map(|a| a.bytes.len() as u64).sum::<u64>() + 37;
    assert!(torn_at > point_pos);
    let work = copy("torn-after", true);
    let f = std::fs::OpenOptions::new().write(true).open(work.join(seg.file_name().unwrap())).unwrap();
    f.set_len(torn_at).unwrap();
    drop(f);
    let (end, read, _) = reopen(&work, &expected);
    assert_eq!(end, expected[torn_batch].base);
    check_against(&expected[..torn_batch], &read, 0);
    let work = copy("flip-after", true);
    flip(&work.join(seg.file_name().unwrap()), torn_at - 37 + 200);
    let (end, _, _) = reopen(&work, &expected);
    assert_eq!(end, expected[torn_batch].base);
}

#[test]
fn a_point_overtaken_by_a_truncation_or_damaged_or_for_another_segment_is_not_trusted() {
    trace();
    let tmp = tempfile::tempdir().unwrap();

    // Truncated below the point, then rewritten with other batch sizes: a
    // stale point would start the scan mid-batch and lose the new batches.
    let dir = tmp.path().join("truncated");
    let kept = run(async {
        let log = Log::open(dir.clone(), config()).await.unwrap();
        let mut all = append_tags(&log, 0..400).await;
        assert!(log.write_recovery_point().await.unwrap());
        log.truncate_to(Offset(all[100].base)).await.unwrap();
        assert!(!dir.join(POINT).exists(), "the truncation removed the point");
        all.truncate(100);
        for tag in 5_000..6_000 {
            all.push(append_one(&log, &make_batch(2, 900 + tag as usize % 400, 7, tag), 3).await);
        }
        std::mem::forget(log);
        all
    });
    let (end, read, _) = reopen(&dir, &kept);
    assert_eq!(end, kept.last().unwrap().last + 1);
    check_against(&kept, &read, 0);

    // A damaged point is ignored: a full scan finds everything.
    let dir = tmp.path().join("damaged");
    let (expected, _) = crashed_log(&dir, 400, 20);
    flip(&dir.join(POINT), 30);
    let (end, read, _) = reopen(&dir, &expected);
    assert_eq!(end, expected.last().unwrap().last + 1);
    check_against(&expected, &read, 0);

    // A point of a segment that has since rolled is ignored.
    let dir = tmp.path().join("rolled");
    let small = small_config(3 << 20, 1024, FlushPolicy::Never);
    let expected = run(async {
        let log = Log::open(dir.clone(), small.clone()).await.unwrap();
        let mut all = append_tags(&log, 0..500).await;
        assert!(log.write_recovery_point().await.unwrap());
        all.extend(append_tags(&log, 500..1_600).await);
        assert!(log.stats().rolls >= 1, "the point's segment rolled");
        std::mem::forget(log);
        all
    });
    run(async {
        let log = Log::open(dir.clone(), small).await.unwrap();
        assert_eq!(log.end_offset().0, expected.last().unwrap().last + 1);
        check_against(&expected, &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
    });
}

/// An idempotent batch of `records` records of 4 KiB each.
fn idem(pid: i64, seq: i32, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(records * 4200 + 128);
    b.set_producer(pid, 0, seq);
    for i in 0..records {
        b.push(None, &vec![b'a' + (seq as usize + i) as u8 % 26; 4096], &[], 1_000 + i as i64);
    }
    b.finish()
}

#[test]
fn producer_state_below_the_point_comes_back_from_the_point() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    // Producer 5 only before the point, producer 6 only after it: no roll
    // wrote a producer snapshot, and the scan from the point never sees 5.
    let (last5, last6) = run(async {
        let log = Log::open(dir.clone(), config()).await.unwrap();
        let mut last5 = None;
        for i in 0..300 {
            last5 = Some(log.append(&idem(5, i * 2, 2), 1).await.unwrap());
        }
        assert!(log.write_recovery_point().await.unwrap());
        let mut last6 = None;
        for i in 0..20 {
            last6 = Some(log.append(&idem(6, i, 1), 1).await.unwrap());
        }
        std::mem::forget(log);
        (last5.unwrap(), last6.unwrap())
    });
    assert!(!dir.join("producers.snapshot").exists(), "no roll: only the point holds producer 5");
    run(async {
        let log = Log::open(dir.clone(), config()).await.unwrap();
        let end = log.end_offset().0;
        let again5 = log.append(&idem(5, 598, 2), 1).await.unwrap();
        assert_eq!(again5.base_offset, last5.base_offset, "producer 5's last batch is a duplicate");
        let again6 = log.append(&idem(6, 19, 1), 1).await.unwrap();
        assert_eq!(again6.base_offset, last6.base_offset, "producer 6's last batch is a duplicate");
        assert_eq!(log.end_offset().0, end, "no retry appended");
        let gap = log.append(&idem(5, 605, 1), 1).await.unwrap_err();
        assert_eq!(gap.error_code(), ErrorCode::OutOfOrderSequence);
        assert_eq!(log.append(&idem(5, 600, 1), 1).await.unwrap().base_offset.0, end);
        log.close().await.unwrap();
    });
}
