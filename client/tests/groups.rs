//! Consumer groups end to end against a real in-process broker: members
//! split partitions, groups each see everything, commits survive restarts,
//! a member that vanishes is expelled and its partitions move.

mod common;

use common::*;
use shardlog_client::{
    Admin, Consumer, ConsumerConfig, GroupSettings, OffsetReset, Producer, ProducerRecord,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn settings(group: &str) -> GroupSettings {
    GroupSettings {
        session_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(200),
        rebalance_timeout: Duration::from_secs(3),
        auto_commit_interval: Some(Duration::from_millis(300)),
        ..GroupSettings::new(group)
    }
}

fn member_config(broker: &TestBroker, group: GroupSettings) -> ConsumerConfig {
    ConsumerConfig { group: Some(group), offset_reset: OffsetReset::Earliest, ..consumer_config(broker) }
}

async fn produce(broker: &TestBroker, topic: &str, partitions: u32, per_partition: usize, tag: &str) {
    let producer = Producer::new(producer_config(broker)).await.expect("producer");
    for p in 0..partitions {
        for i in 0..per_partition {
            producer
                .send(ProducerRecord::new(topic, b(&format!("{tag}-{p}-{i}"))).with_partition(p))
                .await
                .expect("send");
        }
    }
    producer.flush().await.expect("flush");
}

/// What a member task saw: (partition, offset) of every record, and the
/// assignments it had.
#[derive(Default)]
struct Seen {
    records: Vec<(u32, u64)>,
    assignments: Vec<Vec<(String, u32)>>,
}

/// Polls as a group member until `stop`; `close` at the end leaves cleanly
/// (otherwise the consumer is dropped, as a crashed process would be).
fn spawn_member(
    config: ConsumerConfig,
    topic: &str,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    close: bool,
) -> tokio::task::JoinHandle<()> {
    let topic = topic.to_string();
    tokio::spawn(async move {
        let mut c = Consumer::new(config).await.expect("consumer");
        c.subscribe(&[topic]).await.expect("subscribe");
        while !stop.load(Ordering::Relaxed) {
            let records = c.poll(Duration::from_millis(100)).await.expect("poll");
            let mut s = seen.lock().unwrap();
            let a = c.assignment();
            if s.assignments.last() != Some(&a) {
                s.assignments.push(a);
            }
            s.records.extend(records.iter().map(|r| (r.partition, r.offset)));
        }
        if close {
            c.close().await.expect("close");
        }
    })
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !ok() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn total(seen: &[Arc<Mutex<Seen>>]) -> usize {
    seen.iter().map(|s| s.lock().unwrap().records.len()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_split_six_partitions_and_two_groups_each_see_everything() {
    let broker = TestBroker::start().await;
    create(&broker, "events", 6).await;
    produce(&broker, "events", 6, 50, "a").await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut seen = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let s = Arc::new(Mutex::new(Seen::default()));
        tasks.push(spawn_member(
            member_config(&broker, settings("split")),
            "events",
            stop.clone(),
            s.clone(),
            true,
        ));
        seen.push(s);
    }
    // A second group on the same topic.
    let other = Arc::new(Mutex::new(Seen::default()));
    tasks.push(spawn_member(
        member_config(&broker, settings("audit")),
        "events",
        stop.clone(),
        other.clone(),
        true,
    ));
    wait_until("both groups to read all 300 records", || {
        total(&seen) >= 300 && total(std::slice::from_ref(&other)) >= 300
    })
    .await;
    // Give any late rebalance a moment, then check the final split.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("member task");
    }
    let mut all: Vec<(u32, u64)> = seen.iter().flat_map(|s| s.lock().unwrap().records.clone()).collect();
    all.sort();
    let unique: BTreeSet<(u32, u64)> = all.iter().copied().collect();
    assert_eq!(unique.len(), 300, "every record reached the group");
    assert_eq!(all.len(), 300, "no record went to two members of one group");
    for s in &seen {
        let s = s.lock().unwrap();
        assert_eq!(
            s.assignments.last().map(Vec::len),
            Some(2),
            "each of 3 members owns 2 of 6: {:?}",
            s.assignments
        );
    }
    let mut audit: Vec<(u32, u64)> = other.lock().unwrap().records.clone();
    audit.sort();
    audit.dedup();
    assert_eq!(audit.len(), 300, "the other group saw every record too");

    let admin = Admin::connect(client(&broker)).await.expect("admin");
    let groups: Vec<String> =
        admin.list_groups().await.expect("list").into_iter().map(|g| g.group_id).collect();
    assert_eq!(groups, ["audit", "split"]);
    let offsets = admin.group_offsets("split").await.expect("offsets");
    assert_eq!(offsets.len(), 6);
    assert!(offsets.iter().all(|o| o.offset == Some(50) && o.log_end_offset == Some(50)), "{offsets:?}");
    assert_eq!(
        admin.describe_group("split").await.expect("describe").state,
        "Empty",
        "members left on close"
    );
    admin.delete_group("split").await.expect("delete");
    assert_eq!(
        admin.describe_group("split").await.expect_err("gone").code(),
        Some(shardlog_client::ErrorCode::GroupIdNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_a_restart_and_consumption_resumes_there() {
    let mut broker = TestBroker::start().await;
    create(&broker, "log", 2).await;
    produce(&broker, "log", 2, 30, "first").await;
    let mut c = Consumer::new(member_config(
        &broker,
        GroupSettings { auto_commit_interval: None, ..settings("resume") },
    ))
    .await
    .expect("consumer");
    c.subscribe(&["log".to_string()]).await.expect("subscribe");
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while got < 60 {
        assert!(tokio::time::Instant::now() < deadline);
        got += c.poll(Duration::from_millis(100)).await.expect("poll").len();
    }
    c.commit_sync().await.expect("commit");
    let committed = c.committed(&[("log".into(), 0), ("log".into(), 1)]).await.expect("committed");
    assert_eq!(committed.iter().map(|o| o.offset).collect::<Vec<_>>(), [Some(30), Some(30)]);
    c.close().await.expect("close");

    broker.stop().await;
    broker.restart().await;
    produce(&broker, "log", 2, 5, "second").await;
    let mut c = Consumer::new(member_config(&broker, settings("resume"))).await.expect("consumer");
    c.subscribe(&["log".to_string()]).await.expect("subscribe");
    let mut records = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while records.len() < 10 {
        assert!(tokio::time::Instant::now() < deadline, "got {records:?}");
        records.extend(c.poll(Duration::from_millis(100)).await.expect("poll"));
    }
    assert!(records.iter().all(|r| r.offset >= 30), "resumed at the committed offsets: {records:?}");
    assert!(records.iter().all(|r| r.value.starts_with(b"second")));
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_vanishes_is_expelled_and_its_partitions_move_without_loss() {
    let broker = TestBroker::start().await;
    create(&broker, "work", 4).await;
    let stop_a = Arc::new(AtomicBool::new(false));
    let stop_b = Arc::new(AtomicBool::new(false));
    let (a, b_seen) = (Arc::new(Mutex::new(Seen::default())), Arc::new(Mutex::new(Seen::default())));
    let ta =
        spawn_member(member_config(&broker, settings("crash")), "work", stop_a.clone(), a.clone(), false);
    let tb =
        spawn_member(member_config(&broker, settings("crash")), "work", stop_b.clone(), b_seen.clone(), true);
    wait_until("two members with 2 partitions each", || {
        [&a, &b_seen].iter().all(|s| s.lock().unwrap().assignments.last().map(Vec::len) == Some(2))
    })
    .await;
    produce(&broker, "work", 4, 20, "before").await;
    wait_until("the first 80 records", || total(&[a.clone(), b_seen.clone()]) >= 80).await;
    // A disappears without leaving (as a killed process: no LeaveGroup).
    stop_a.store(true, Ordering::Relaxed);
    ta.await.expect("member a");
    let vanished = tokio::time::Instant::now();
    wait_until("b to own all 4 partitions", || {
        b_seen.lock().unwrap().assignments.last().map(Vec::len) == Some(4)
    })
    .await;
    let moved_after = vanished.elapsed();
    produce(&broker, "work", 4, 20, "after").await;
    wait_until("every record", || {
        let mut all: Vec<(u32, u64)> =
            [&a, &b_seen].iter().flat_map(|s| s.lock().unwrap().records.clone()).collect();
        all.sort();
        all.dedup();
        all.len() >= 160
    })
    .await;
    stop_b.store(true, Ordering::Relaxed);
    tb.await.expect("member b");
    // Session 1.5 s, plus the rebalance: well under the 5 s bound.
    assert!(moved_after < Duration::from_secs(5), "partitions moved after {moved_after:?}");
    let mut per_partition: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for (p, o) in [&a, &b_seen].iter().flat_map(|s| s.lock().unwrap().records.clone()) {
        per_partition.entry(p).or_default().insert(o);
    }
    for (p, offsets) in &per_partition {
        assert_eq!(offsets.len(), 40, "partition {p}: nothing lost");
    }
}
