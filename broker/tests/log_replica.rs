//! The log operations replication stands on: a follower's append of the
//! leader's batches unchanged, the leader-epoch history and its checkpoint,
//! truncation to at most an offset, and reads capped at a high watermark.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogError};
use shardlog_schema::Offset;

/// Every batch of `leader`, as stored, from `from` on.
async fn stored(leader: &Log, from: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (_, bytes) in read_all(leader, from, 1 << 20).await {
        out.extend(bytes);
    }
    out
}

#[test]
fn a_follower_holds_the_leaders_bytes_and_epochs() {
    run_in_tempdir(|dir| async move {
        let config = small_config(16 << 10, 512, FlushPolicy::Never);
        let leader = Log::open(dir.join("leader"), config.clone()).await.unwrap();
        let follower = Log::open(dir.join("follower"), config.clone()).await.unwrap();
        for i in 0..60 {
            let epoch = if i < 20 { 3 } else { 5 };
            append_one(&leader, &make_batch(3, 300, 1, i), epoch).await;
        }
        // In pieces, as fetches bring them.
        let mut at = 0;
        while at < leader.end_offset().0 {
            let r = leader.read(Offset(at), 4000).await.unwrap();
            let next = r.last_offset.0 + 1;
            let bytes = r.clone_bytes().await;
            let info = follower.append_replica(&bytes).await.unwrap();
            assert_eq!(info.base_offset.0, at);
            at = next;
        }
        assert_eq!(follower.end_offset(), leader.end_offset());
        assert!(stored(&follower, 0).await == stored(&leader, 0).await, "byte-identical");
        for log in [&leader, &follower] {
            assert_eq!(log.latest_epoch(), Some(5));
            assert_eq!(log.epoch_end_offset(3), Some((3, Offset(60))));
            assert_eq!(log.epoch_end_offset(4), Some((3, Offset(60))));
            assert_eq!(log.epoch_end_offset(5), Some((5, Offset(180))));
            assert_eq!(log.epoch_end_offset(2), None);
        }
        // A gap or an overlap is refused, and nothing is appended.
        let r = leader.read(Offset(0), 1).await.unwrap().clone_bytes().await;
        let err = follower.append_replica(&r).await.unwrap_err();
        assert!(matches!(err, LogError::ReplicaOffsetMismatch { .. }), "{err}");
        assert_eq!(follower.end_offset().0, 180);
        // The history survives a reopen.
        follower.close().await.unwrap();
        drop(follower);
        let follower = Log::open(dir.join("follower"), config).await.unwrap();
        assert_eq!(follower.epoch_end_offset(3), Some((3, Offset(60))));
        assert_eq!(follower.latest_epoch(), Some(5));
        follower.close().await.unwrap();
        leader.close().await.unwrap();
    });
}

#[test]
fn truncate_at_most_drops_a_batch_holding_the_offset() {
    run_in_tempdir(|dir| async move {
        let config = small_config(8 << 10, 512, FlushPolicy::Always);
        let log = Log::open(dir.join("t-0"), config.clone()).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..80 {
            expected.push(append_one(&log, &make_batch(4, 150, 1, i), if i < 50 { 1 } else { 2 }).await);
        }
        // Past the end: nothing changes.
        assert_eq!(log.truncate_at_most(Offset(10_000)).await.unwrap(), Offset(320));
        // Inside batch 60 (offsets 240..=243): it goes whole.
        assert_eq!(log.truncate_at_most(Offset(242)).await.unwrap(), Offset(240));
        expected.truncate(60);
        check_against(&expected, &read_all(&log, 0, 1 << 20).await, 0);
        assert_eq!(log.epoch_end_offset(2), Some((2, Offset(240))));
        // Below the second epoch's start: the history forgets it.
        assert_eq!(log.truncate_at_most(Offset(199)).await.unwrap(), Offset(196));
        assert_eq!(log.latest_epoch(), Some(1));
        assert_eq!(log.epoch_end_offset(2), Some((1, Offset(196))));
        // Appends continue at the new end, and a reopen agrees.
        let again = append_one(&log, &make_batch(2, 100, 1, 999), 7).await;
        assert_eq!(again.base, 196);
        log.close().await.unwrap();
        drop(log);
        let log = Log::open(dir.join("t-0"), config).await.unwrap();
        assert_eq!(log.end_offset().0, 198);
        assert_eq!(log.epoch_end_offset(1), Some((1, Offset(196))));
        assert_eq!(log.latest_epoch(), Some(7));
        log.close().await.unwrap();
    });
}

#[test]
fn reads_stop_before_the_cap() {
    run_in_tempdir(|dir| async move {
        // Small segments: the cap falls in sealed and active segments alike;
        // large hot tail by default: both the memory and the file path run.
        let config = small_config(8 << 10, 512, FlushPolicy::Never);
        let log = Log::open(dir.join("t-0"), config).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..100 {
            expected.push(append_one(&log, &make_batch(2, 200, 1, i), 0).await);
        }
        for cap_batch in [0usize, 1, 17, 40, 99, 100] {
            let cap = expected.get(cap_batch).map_or(log.end_offset().0, |a| a.base);
            for max_bytes in [1usize, 3000, 1 << 20] {
                let mut at = 0;
                let mut got = Vec::new();
                loop {
                    let r = log.read_upto(Offset(at), max_bytes, Offset(cap)).await.unwrap();
                    if r.is_empty() {
                        break;
                    }
                    at = r.last_offset.0 + 1;
                    got.extend(split_batches(&r.clone_bytes().await));
                }
                assert_eq!(got.len(), cap_batch, "cap at batch {cap_batch}, reads of {max_bytes} bytes");
                assert!(got.iter().all(|(base, _)| *base < cap));
            }
        }
        log.close().await.unwrap();
    });
}
