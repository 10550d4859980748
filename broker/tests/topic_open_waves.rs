//! A shard opens a topic's partitions in concurrent waves (creation and
//! start-up). Every partition of a many-partition topic is then served, and
//! a creation that fails on one partition in the middle of a wave leaves
//! nothing behind: no directory of the topic and no topic, so creating it
//! again succeeds.

mod wire_support;

use shardlog_broker::fault::{self, Fault, FaultPoint};
use shardlog_schema::wire::ErrorCode;
use wire_support::{batch_of, broker, values, Conn};

const PARTITIONS: u32 = 300;

fn topic_dirs(dir: &std::path::Path, topic: &str) -> usize {
    let prefix = format!("{topic}-");
    std::fs::read_dir(dir)
        .expect("list data dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .count()
}

#[test]
fn many_partitions_open_in_waves_and_a_failed_one_rolls_the_topic_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 1);
    let mut conn = Conn::open(handle.ready.listen.port());
    assert_eq!(conn.create_topic("many", PARTITIONS), ErrorCode::None);
    assert_eq!(topic_dirs(dir.path(), "many"), PARTITIONS as usize);
    for p in [0, 63, 64, 200, PARTITIONS - 1] {
        let (code, _) = conn.produce("many", p, &batch_of(&[&format!("v{p}")]));
        assert_eq!(code, ErrorCode::None, "partition {p}");
    }

    // Partition 150 of a second topic cannot be opened: 150 is in the
    // middle of the third wave, after two waves opened fine.
    let bad = dir.path().join("bad-150").to_string_lossy().to_string();
    fault::arm(FaultPoint::RecoveryRead, &bad, Fault::Fail(libc::EIO));
    assert_ne!(conn.create_topic("bad", PARTITIONS), ErrorCode::None);
    fault::disarm(&bad);
    assert_eq!(topic_dirs(dir.path(), "bad"), 0, "a failed creation leaves no partition directory");
    assert_eq!(conn.create_topic("bad", 2), ErrorCode::None, "nothing of the failed topic is left");
    handle.shutdown().expect("clean shutdown");

    // A restart opens them in waves too, with their data.
    let handle = broker(dir.path(), 1);
    let mut conn = Conn::open(handle.ready.listen.port());
    assert_eq!(conn.create_topic("many", 1), ErrorCode::TopicAlreadyExists);
    for p in [0, 63, 64, 200, PARTITIONS - 1] {
        let (code, data, _) = conn.fetch("many", p, 0, 0);
        assert_eq!(code, ErrorCode::None, "partition {p}");
        assert_eq!(values(&data), vec![(0, format!("v{p}").into_bytes())], "partition {p}");
    }
    handle.shutdown().expect("clean shutdown");
}
