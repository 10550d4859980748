//! Consumer groups end to end against a real in-process broker: members
//! split partitions, groups each see everything, commits survive restarts,
//! a member that vanishes is expelled and its partitions move; with
//! cooperative-sticky, members that join or leave move only the partitions
//! that have to move while the others keep consuming.

mod common;

use common::*;
use shardlog_client::{
    Admin, Consumer, ConsumerConfig, GroupSettings, OffsetReset, Producer, ProducerRecord, RebalanceListener,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

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

/// What a member task saw: (partition, offset) of every record (and when
/// it arrived), the assignments it had, its generation, and the calls of
/// its rebalance listener.
#[derive(Default)]
struct Seen {
    records: Vec<(u32, u64)>,
    arrived: Vec<(Instant, u32)>,
    assignments: Vec<Vec<(String, u32)>>,
    generation: Option<i32>,
    calls: Vec<Call>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Revoked(Vec<(String, u32)>),
    Assigned(Vec<(String, u32)>),
    Lost(Vec<(String, u32)>),
}

/// Records the listener's calls into the member's `Seen`.
struct Recorder(Arc<Mutex<Seen>>);

impl RebalanceListener for Recorder {
    fn on_revoked(&mut self, partitions: &[(String, u32)]) {
        self.0.lock().unwrap().calls.push(Call::Revoked(partitions.to_vec()));
    }
    fn on_assigned(&mut self, partitions: &[(String, u32)]) {
        self.0.lock().unwrap().calls.push(Call::Assigned(partitions.to_vec()));
    }
    fn on_lost(&mut self, partitions: &[(String, u32)]) {
        self.0.lock().unwrap().calls.push(Call::Lost(partitions.to_vec()));
    }
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
        c.set_rebalance_listener(Box::new(Recorder(seen.clone()))).expect("listener");
        while !stop.load(Ordering::Relaxed) {
            let records = c.poll(Duration::from_millis(100)).await.expect("poll");
            let now = Instant::now();
            let mut s = seen.lock().unwrap();
            let a = c.assignment();
            if s.assignments.last() != Some(&a) {
                s.assignments.push(a);
            }
            s.generation = c.group_member().map(|(g, _)| g);
            s.records.extend(records.iter().map(|r| (r.partition, r.offset)));
            s.arrived.extend(records.iter().map(|r| (now, r.partition)));
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
    broker.restart_on_new_ports().await;
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

fn cooperative(group: &str) -> GroupSettings {
    GroupSettings { assignors: vec!["cooperative-sticky".into()], ..settings(group) }
}

/// Sends to every partition in turn until `stop`; returns the (partition,
/// offset) of every acknowledged record.
fn spawn_producer(
    broker: &TestBroker,
    topic: &str,
    partitions: u32,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(u32, u64)>> {
    let (config, topic) = (producer_config(broker), topic.to_string());
    tokio::spawn(async move {
        let producer = Producer::new(config).await.expect("producer");
        let mut acked = Vec::new();
        for i in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let record =
                ProducerRecord::new(topic.as_str(), b(&format!("r{i}"))).with_partition(i % partitions);
            let meta = producer.send_and_wait(record).await.expect("acknowledged");
            acked.push((meta.partition, meta.offset));
            if i % partitions == partitions - 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        acked
    })
}

type Partitions = BTreeSet<(String, u32)>;

fn last_assignment(seen: &Arc<Mutex<Seen>>) -> Partitions {
    seen.lock().unwrap().assignments.last().cloned().unwrap_or_default().into_iter().collect()
}

/// Every member in one generation, holding `counts` partitions (sorted),
/// all of them different.
fn settled(seen: &[Arc<Mutex<Seen>>], counts: &[usize]) -> bool {
    let assignments: Vec<BTreeSet<(String, u32)>> = seen.iter().map(last_assignment).collect();
    let mut sizes: Vec<usize> = assignments.iter().map(BTreeSet::len).collect();
    sizes.sort_unstable();
    let generations: BTreeSet<Option<i32>> = seen.iter().map(|s| s.lock().unwrap().generation).collect();
    let distinct: BTreeSet<&(String, u32)> = assignments.iter().flatten().collect();
    sizes == counts && generations.len() == 1 && distinct.len() == counts.iter().sum::<usize>()
}

fn calls_so_far(seen: &[Arc<Mutex<Seen>>]) -> Vec<usize> {
    seen.iter().map(|s| s.lock().unwrap().calls.len()).collect()
}

/// The partitions given to and taken from a member by its listener calls
/// `calls` (indices); panics on a lost partition.
fn moves(seen: &Arc<Mutex<Seen>>, calls: std::ops::Range<usize>) -> (Partitions, Partitions) {
    let (mut assigned, mut revoked) = (BTreeSet::new(), BTreeSet::new());
    for call in &seen.lock().unwrap().calls[calls] {
        match call {
            Call::Assigned(ps) => assigned.extend(ps.iter().cloned()),
            Call::Revoked(ps) => revoked.extend(ps.iter().cloned()),
            Call::Lost(ps) => panic!("partitions lost: {ps:?}"),
        }
    }
    (assigned, revoked)
}

/// The records `seen` received on `partition` between `from` and `to`.
fn arrived_between(seen: &Arc<Mutex<Seen>>, partition: u32, from: Instant, to: Instant) -> usize {
    seen.lock().unwrap().arrived.iter().filter(|(at, p)| *p == partition && (from..=to).contains(at)).count()
}

/// The longest stretch between `from` and `to` in which `seen` received no
/// record on `partitions`.
fn longest_silence(
    seen: &Arc<Mutex<Seen>>,
    partitions: &BTreeSet<(String, u32)>,
    from: Instant,
    to: Instant,
) -> Duration {
    let mut times: Vec<Instant> = seen
        .lock()
        .unwrap()
        .arrived
        .iter()
        .filter(|(at, p)| (from..=to).contains(at) && partitions.iter().any(|(_, q)| q == p))
        .map(|(at, _)| *at)
        .collect();
    times.insert(0, from);
    times.push(to);
    times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

/// Waits until the group consumed every acknowledged record (at least once).
async fn drain(seen: &[Arc<Mutex<Seen>>], acked: &[(u32, u64)]) {
    wait_until("every acknowledged record consumed", || {
        let consumed: BTreeSet<(u32, u64)> =
            seen.iter().flat_map(|s| s.lock().unwrap().records.clone()).collect();
        acked.iter().all(|r| consumed.contains(r))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_a_joining_member_takes_only_what_moves_while_the_others_keep_consuming() {
    let broker = TestBroker::start().await;
    create(&broker, "flow", 6).await;
    let (stop_members, stop_producer) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let producer = spawn_producer(&broker, "flow", 6, stop_producer.clone());
    let seen: Vec<Arc<Mutex<Seen>>> = (0..4).map(|_| Arc::default()).collect();
    let mut tasks: Vec<_> = seen[..3]
        .iter()
        .map(|s| {
            let config = member_config(&broker, cooperative("coop"));
            spawn_member(config, "flow", stop_members.clone(), s.clone(), true)
        })
        .collect();
    wait_until("three members with two partitions each", || settled(&seen[..3], &[2, 2, 2])).await;
    let before: Vec<BTreeSet<(String, u32)>> = seen[..3].iter().map(last_assignment).collect();
    let marks = calls_so_far(&seen[..3]);

    let joined_at = Instant::now();
    let config = member_config(&broker, cooperative("coop"));
    tasks.push(spawn_member(config, "flow", stop_members.clone(), seen[3].clone(), true));
    wait_until("four members holding 2, 2, 1, 1", || settled(&seen, &[1, 1, 2, 2])).await;
    let settled_at = Instant::now();
    // (Closing at the end moves partitions again: look at what is settled now.)
    let (after, ends): (Vec<_>, _) = (seen.iter().map(last_assignment).collect(), calls_so_far(&seen));
    wait_until("every member consuming after the rebalance", || {
        seen.iter().all(|s| s.lock().unwrap().arrived.iter().any(|(at, _)| *at > settled_at))
    })
    .await;
    stop_producer.store(true, Ordering::Relaxed);
    let acked = producer.await.expect("producer");
    drain(&seen, &acked).await;
    stop_members.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("member task");
    }

    let mut moved = BTreeSet::new();
    for (i, s) in seen[..3].iter().enumerate() {
        let (assigned, revoked) = moves(s, marks[i]..ends[i]);
        assert!(
            after[i].is_subset(&before[i]),
            "member {i} only gave up partitions: {before:?} -> {after:?}"
        );
        let gave_up: BTreeSet<(String, u32)> = before[i].difference(&after[i]).cloned().collect();
        assert_eq!(revoked, gave_up, "member {i} revoked exactly what moved, never a kept partition");
        assert_eq!(assigned, BTreeSet::new(), "member {i} was given nothing new");
        for (_, p) in &after[i] {
            let n = arrived_between(s, *p, joined_at, settled_at);
            assert!(
                n > 0,
                "member {i} kept consuming {p} during the rebalance ({:?})",
                settled_at - joined_at
            );
        }
        // An eager member would stop for the whole join; this one fetches on.
        let (silence, took) = (longest_silence(s, &after[i], joined_at, settled_at), settled_at - joined_at);
        assert!(silence * 2 < took, "member {i} stopped consuming for {silence:?} of the {took:?} rebalance");
        moved.extend(gave_up);
    }
    assert_eq!(moved.len(), 1, "6 over 4 needs one partition to move: {moved:?}");
    assert_eq!(after[3], moved, "the newcomer got what the others gave up");
    let (assigned, revoked) = moves(&seen[3], 0..ends[3]);
    assert_eq!((assigned, revoked), (moved, BTreeSet::new()));
    eprintln!("rebalance took {:?}; {} records produced", settled_at - joined_at, acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_a_leaving_member_s_partitions_move_and_nothing_is_revoked() {
    let broker = TestBroker::start().await;
    create(&broker, "flow", 6).await;
    let stop_producer = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(&broker, "flow", 6, stop_producer.clone());
    let seen: Vec<Arc<Mutex<Seen>>> = (0..3).map(|_| Arc::default()).collect();
    let stops: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::default()).collect();
    let mut tasks: Vec<_> = seen
        .iter()
        .zip(&stops)
        .map(|(s, stop)| {
            let config = member_config(&broker, cooperative("leave"));
            spawn_member(config, "flow", stop.clone(), s.clone(), true)
        })
        .collect();
    wait_until("three members with two partitions each", || settled(&seen, &[2, 2, 2])).await;
    let before: Vec<BTreeSet<(String, u32)>> = seen.iter().map(last_assignment).collect();
    let marks = calls_so_far(&seen);

    // The first member closes: it commits and leaves the group.
    stops[0].store(true, Ordering::Relaxed);
    tasks.remove(0).await.expect("leaving member");
    let left_at = Instant::now();
    wait_until("two members holding three each", || settled(&seen[1..], &[3, 3])).await;
    let settled_at = Instant::now();
    let (after, ends): (Vec<_>, _) = (seen.iter().map(last_assignment).collect(), calls_so_far(&seen));
    stop_producer.store(true, Ordering::Relaxed);
    let acked = producer.await.expect("producer");
    drain(&seen, &acked).await;
    for stop in &stops[1..] {
        stop.store(true, Ordering::Relaxed);
    }
    for t in tasks {
        t.await.expect("member task");
    }

    let mut taken_over = BTreeSet::new();
    for i in 1..3 {
        let (assigned, revoked) = moves(&seen[i], marks[i]..ends[i]);
        assert_eq!(revoked, BTreeSet::new(), "member {i} revoked nothing");
        assert!(before[i].is_subset(&after[i]), "member {i} kept its partitions");
        assert_eq!(assigned, after[i].difference(&before[i]).cloned().collect(), "member {i}");
        for (_, p) in &before[i] {
            assert!(
                arrived_between(&seen[i], *p, left_at, settled_at + Duration::from_millis(200)) > 0,
                "member {i} kept consuming {p}"
            );
        }
        taken_over.extend(assigned);
    }
    assert_eq!(taken_over, before[0], "the survivors took over exactly what the leaver had");
}

/// A member whose join completes while the application is not polling
/// still heartbeats (the heartbeats start when the sync answers, not at the
/// next poll): a late poll finds it in its generation, not expelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_polls_late_after_its_join_is_not_expelled() {
    let broker = TestBroker::start().await;
    create(&broker, "late", 2).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut c = Consumer::new(member_config(&broker, settings("late-poll"))).await.expect("consumer");
    c.subscribe(&["late".to_string()]).await.expect("subscribe");
    c.set_rebalance_listener(Box::new(Recorder(seen.clone()))).expect("listener");
    // One short poll starts the join on its task; the join completes
    // (after the 200 ms initial rebalance delay) while nothing polls for
    // twice the 1.5 s session timeout.
    c.poll(Duration::from_millis(10)).await.expect("poll");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut first = None;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        c.poll(Duration::from_millis(100)).await.expect("poll");
        if let Some((g, _)) = c.group_member() {
            first.get_or_insert(g);
        }
    }
    let first = first.expect("joined");
    assert_eq!(c.group_member().map(|(g, _)| g), Some(first), "no rebalance after the late poll");
    assert_eq!(c.assignment().len(), 2, "holds both partitions");
    let calls = seen.lock().unwrap().calls.clone();
    assert!(!calls.iter().any(|c| matches!(c, Call::Lost(_))), "expelled meanwhile: {calls:?}");
    c.close().await.expect("close");
}
