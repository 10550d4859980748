//! Keyed compaction (`cleanup.policy=compact`): the latest record per key
//! stays at its offset, tombstones go after `delete.retention.ms`, reads at
//! any offset work across the gaps, and a pass interrupted at any step of
//! its swap leaves a log that reopens with nothing acknowledged lost.

mod log_support;

use log_support::*;
use shardlog_broker::config::{CleanupPolicy, FlushPolicy, TopicConfig};
use shardlog_broker::fault::{self, Fault, FaultPoint};
use shardlog_broker::log::Log;
use shardlog_schema::batch::{self, BatchBuilder};
use shardlog_schema::Offset;
use std::collections::{BTreeMap, HashMap};

const HOUR_MS: i64 = 3_600_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn compact_config() -> TopicConfig {
    let mut c = small_config(16 << 10, 1024, FlushPolicy::Never);
    c.cleanup_policy = CleanupPolicy::Compact;
    c.min_cleanable_dirty_permille = 0;
    c.delete_retention_ms = HOUR_MS as u64;
    c
}

/// One record as appended: key, value (`None`: tombstone), timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    ts: i64,
}

/// Appends `batches` batches of 1 to 4 records with keys out of `keys`
/// (some unkeyed, some tombstones, a few old tombstones); returns the model.
async fn append_updates(
    log: &Log,
    model: &mut BTreeMap<u64, Rec>,
    seed: &mut u64,
    batches: usize,
    keys: u64,
) {
    for _ in 0..batches {
        let mut b = BatchBuilder::with_capacity(4096);
        let mut recs = Vec::new();
        let n = 1 + (next(seed) % 4) as usize;
        for _ in 0..n {
            let r = next(seed);
            let key = format!("key-{}", r % keys).into_bytes();
            let rec = match (r >> 32) % 20 {
                0 => Rec { key: None, value: Some(format!("unkeyed-{r}").into_bytes()), ts: now_ms() },
                1 => Rec { key: Some(key), value: None, ts: now_ms() },
                2 => Rec { key: Some(key), value: None, ts: now_ms() - 2 * HOUR_MS },
                _ => Rec {
                    key: Some(key),
                    value: Some(vec![(r % 251) as u8; 40 + (r % 200) as usize]),
                    ts: now_ms(),
                },
            };
            match &rec.value {
                Some(v) => b.push(rec.key.as_deref(), v, &[("h", b"x")], rec.ts),
                None => b.push_tombstone(rec.key.as_deref().expect("keyed"), &[], rec.ts),
            }
            recs.push(rec);
        }
        let info = log.append(&b.finish(), 0).await.expect("append");
        for (i, rec) in recs.into_iter().enumerate() {
            model.insert(info.base_offset.0 + i as u64, rec);
        }
    }
}

fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// What compaction must leave of `model` when it cleaned everything below
/// `cleaned_below`.
fn expected_after(model: &BTreeMap<u64, Rec>, cleaned_below: u64, now: i64) -> BTreeMap<u64, Rec> {
    let mut latest: HashMap<&[u8], u64> = HashMap::new();
    for (o, r) in model.range(..cleaned_below) {
        if let Some(k) = &r.key {
            latest.insert(k, *o);
        }
    }
    model
        .iter()
        .filter(|(o, r)| {
            **o >= cleaned_below
                || match &r.key {
                    None => true,
                    Some(k) => latest[k.as_slice()] == **o && (r.value.is_some() || r.ts >= now - HOUR_MS),
                }
        })
        .map(|(o, r)| (*o, r.clone()))
        .collect()
}

/// Every record of the log, read in `max_bytes` steps, by offset.
async fn records_of(log: &Log, max_bytes: usize) -> BTreeMap<u64, Rec> {
    let mut out = BTreeMap::new();
    for (_, b) in read_all(log, log.start_offset().0, max_bytes).await {
        for r in batch::records(&b).expect("records") {
            let prev = out.insert(
                r.offset,
                Rec {
                    key: r.key.map(<[u8]>::to_vec),
                    value: (!r.tombstone).then(|| r.value.to_vec()),
                    ts: r.timestamp_ms,
                },
            );
            assert!(prev.is_none(), "offset {} read twice", r.offset);
        }
    }
    out
}

/// A consumer positioned at any offset gets the first surviving record at
/// or after it next: a read returns the batch covering the offset (whose
/// kept records may all lie below it: the batch keeps its offset range),
/// and the consumer moves on past the batch's last offset.
async fn check_reads_at_every_offset(log: &Log, want: &BTreeMap<u64, Rec>) {
    for at in (log.start_offset().0..log.high_watermark().0).step_by(3) {
        let first_kept = want.range(at..).next().map(|(o, _)| *o);
        let mut pos = at;
        let first = loop {
            let r = log.read(Offset(pos), 1).await.expect("read");
            if r.is_empty() {
                break None;
            }
            let last = r.last_offset.0;
            assert!(last >= pos, "a read at {pos} ends at {last}");
            let bytes = r.into_bytes().await.expect("bytes");
            let got = batch::records(&bytes).expect("records");
            if let Some(x) = got.iter().find(|x| x.offset >= at) {
                break Some(x.offset);
            }
            pos = last + 1;
        };
        assert_eq!(first, first_kept, "first record at or after {at}");
    }
}

#[test]
fn compaction_keeps_the_latest_record_per_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let path = dir.path().join("t-0");
        let config = compact_config();
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let (mut model, mut seed) = (BTreeMap::new(), 0x9e37_79b9_7f4a_7c15u64);
        append_updates(&log, &mut model, &mut seed, 1500, 60).await;
        let (before_bytes, before_segments) = (log.size_bytes(), log.segment_count());
        assert!(before_segments > 10, "{before_segments} segments");
        let cleaned_below = log.active_base().0;
        let now = now_ms();
        let out = log.compact(now).await.unwrap();
        assert_eq!(out.segments_in, before_segments - 1, "every sealed segment is cleanable");
        assert!(out.segments_out < out.segments_in, "small outputs are merged: {out:?}");
        assert!(out.records_removed > 0);
        assert_eq!(log.size_bytes(), before_bytes - out.bytes_before + out.bytes_after);
        assert!(log.size_bytes() * 3 < before_bytes, "{} of {before_bytes} bytes left", log.size_bytes());
        let want = expected_after(&model, cleaned_below, now);
        assert_eq!(records_of(&log, 1 << 20).await, want);
        assert_eq!(records_of(&log, 1).await, want, "one batch per read");
        check_reads_at_every_offset(&log, &want).await;
        assert_eq!(log.start_offset().0, 0, "the log start does not move");
        assert_eq!(log.end_offset().0, *model.keys().last().unwrap() + 1);

        // Nothing new is dirty: the next pass does nothing.
        assert_eq!(log.compact(now_ms()).await.unwrap().segments_in, 0);

        // Survives a clean restart, and a restart whose indexes are gone
        // (recovery rescans the compacted segments, gaps and all).
        log.close().await.unwrap();
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        assert_eq!(records_of(&log, 4096).await, want);
        log.close().await.unwrap();
        for e in std::fs::read_dir(&path).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "index" || x == "timeindex") {
                std::fs::remove_file(p).unwrap();
            }
        }
        std::fs::remove_file(path.join(".clean_shutdown")).unwrap();
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        assert_eq!(records_of(&log, 4096).await, want);
        check_reads_at_every_offset(&log, &want).await;

        // More updates, a second pass over cleaned and dirty segments.
        append_updates(&log, &mut model, &mut seed, 800, 60).await;
        let cleaned_below = log.active_base().0;
        let now = now_ms();
        let out = log.compact(now).await.unwrap();
        assert!(out.segments_in > 0);
        let want = expected_after(&model, cleaned_below, now);
        assert_eq!(records_of(&log, 1 << 16).await, want);
        log.close().await.unwrap();
        drop(log);
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
    });
}

#[test]
fn a_topic_without_compact_is_never_compacted_and_lag_holds_back_young_segments() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let mut config = compact_config();
        config.cleanup_policy = CleanupPolicy::Delete;
        let log = Log::open(dir.path().join("d-0"), config).await.unwrap();
        let (mut model, mut seed) = (BTreeMap::new(), 7u64);
        append_updates(&log, &mut model, &mut seed, 400, 5).await;
        assert_eq!(log.compact(now_ms()).await.unwrap().segments_in, 0);
        assert_eq!(records_of(&log, 1 << 20).await, model, "nothing removed");
        log.close().await.unwrap();

        let mut config = compact_config();
        config.min_compaction_lag_ms = HOUR_MS as u64;
        let log = Log::open(dir.path().join("l-0"), config.clone()).await.unwrap();
        append_updates(&log, &mut model.clone(), &mut seed, 400, 5).await;
        assert_eq!(
            log.compact(now_ms()).await.unwrap().segments_in,
            0,
            "every segment is younger than the lag"
        );
        let out = log.compact(now_ms() + 2 * HOUR_MS).await.unwrap();
        assert!(out.segments_in > 0, "old enough an hour later");
        log.close().await.unwrap();
        drop(log);
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
    });
}

/// A pass that stops right after its commit rename (as a crash would)
/// leaves `.swap` files; reopening finishes the swap. A `.cleaned` leftover
/// of a pass that never committed is removed.
#[test]
fn an_interrupted_swap_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swap-me-0");
    let filter = path.to_string_lossy().into_owned();
    run(async {
        let config = compact_config();
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let (mut model, mut seed) = (BTreeMap::new(), 42u64);
        append_updates(&log, &mut model, &mut seed, 600, 30).await;
        let cleaned_below = log.active_base().0;
        fault::arm(FaultPoint::CompactSwap, &filter, Fault::Fail(libc::EIO));
        let now = now_ms();
        let err = log.compact(now).await.unwrap_err();
        assert!(err.to_string().contains("compaction swap"), "{err}");
        fault::disarm(&filter);
        // The failed pass changed nothing readable.
        assert_eq!(records_of(&log, 1 << 20).await, model);
        let swaps = std::fs::read_dir(&path)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".swap"))
            .count();
        assert_eq!(swaps, 3, "log, index and time index of the committed rewrite");
        log.close().await.unwrap();
        drop(log);
        std::fs::write(path.join("00000000000000000000.log.cleaned"), b"half a rewrite").unwrap();

        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let left: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".swap") || n.ends_with(".cleaned"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // The first group was swapped in; the rest is as it was.
        let got = records_of(&log, 1 << 20).await;
        let compacted = expected_after(&model, cleaned_below, now);
        for (o, r) in &model {
            if compacted.contains_key(o) {
                assert_eq!(got.get(o), Some(r), "latest record at {o} kept");
            }
        }
        assert!(got.len() < model.len(), "the swapped group is compacted");
        // A full pass now gives exactly the compacted log.
        log.compact(now).await.unwrap();
        assert_eq!(records_of(&log, 1 << 20).await, compacted);
        log.close().await.unwrap();
        drop(log);
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
    });
}
