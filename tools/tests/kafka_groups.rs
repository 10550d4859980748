//! Kafka consumer groups of two members, as real processes of each client
//! (confluent-kafka, kafka-python, kcat `-G`), on the same coordinator as
//! native groups: the members split the partitions, every record is read,
//! offsets are committed, and a restarted member resumes after them. Also
//! offsets by timestamp from the Python clients.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{have, start_kafka as start, Broker};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One group member: consumes topic `t` in group `g2` until it has seen no
/// record for `idle` seconds (after its first), commits on every revoke
/// and at the end, then prints `partition value` per record and a last
/// line `assigned p,p,...`.
const MEMBER: &str = r#"
import sys, time
kafka, which, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])
got, assigned = [], set()
if which == "confluent":
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": kafka, "group.id": "g2", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    def on_assign(cons, parts):
        assigned.clear(); assigned.update(p.partition for p in parts)
    def on_revoke(cons, parts):
        if got:
            try: cons.commit(asynchronous=False)
            except Exception: pass
    c.subscribe(["t"], on_assign=on_assign, on_revoke=on_revoke)
    last = time.time()
    while time.time() - last < idle:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.value().decode()))
            last = time.time()
    try:
        c.commit(asynchronous=False)
    except Exception as e:  # nothing consumed since the last commit
        assert "No offset stored" in str(e), e
    c.close()
else:
    from kafka import KafkaConsumer, ConsumerRebalanceListener
    c = KafkaConsumer(bootstrap_servers=kafka, group_id="g2", auto_offset_reset="earliest",
                      enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
    class L(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            if got:
                try: c.commit()
                except Exception: pass
        def on_partitions_assigned(self, parts):
            assigned.clear(); assigned.update(p.partition for p in parts)
    c.subscribe(["t"], listener=L())
    last = time.time()
    while time.time() - last < idle:
        for recs in c.poll(timeout_ms=500).values():
            for m in recs:
                got.append((m.partition, m.value.decode()))
                last = time.time()
    c.commit()
    c.close()
for p, v in got:
    print(p, v)
print("assigned", ",".join(str(p) for p in sorted(assigned)))
"#;

fn spawn_member(kafka: &str, which: &str, idle_s: &str) -> Child {
    Command::new("python3")
        .args(["-c", MEMBER, kafka, which, idle_s])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3")
}

/// (records as (partition, value), final assignment) of a finished member.
fn member_output(child: Child) -> (Vec<(u32, String)>, BTreeSet<u32>) {
    let out = wait_with_deadline(child);
    assert!(out.status.success(), "member failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut records = Vec::new();
    let mut assigned = BTreeSet::new();
    for line in text.lines() {
        let (a, b) = line.split_once(' ').unwrap_or((line, ""));
        if a == "assigned" {
            assigned =
                b.split(',').filter(|s| !s.is_empty()).map(|p| p.parse().expect("partition")).collect();
        } else {
            records.push((a.parse().expect("partition"), b.to_string()));
        }
    }
    (records, assigned)
}

fn wait_with_deadline(child: Child) -> std::process::Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(Duration::from_secs(90)).expect("member finished in time").expect("member ran")
}

/// `n` records `{prefix}{p}-{i}` into each of partitions 0..4 of `t`.
fn produce_to_each_partition(broker: &Broker, prefix: &str, n: usize) {
    for p in 0..4 {
        let lines: String = (0..n).map(|i| format!("{prefix}{p}-{i}\n")).collect();
        broker.ok(&["produce", "t", "--partition", &p.to_string()], &lines);
    }
}

fn partitions(records: &[(u32, String)]) -> BTreeSet<u32> {
    records.iter().map(|(p, _)| *p).collect()
}

fn two_members_split_and_resume(which: &str, module: &str) {
    if !have("python3", &["-c", &format!("import {module}")]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "4"], "");
    produce_to_each_partition(&broker, "v", 100);
    // Both join within the group's initial rebalance delay (3 s), so the
    // first generation has both members.
    let (a, b) = (spawn_member(&kafka, which, "8"), spawn_member(&kafka, which, "8"));
    let ((ra, _), (rb, _)) = (member_output(a), member_output(b));
    // They split the partitions: each read some, none read by both.
    let (pa, pb) = (partitions(&ra), partitions(&rb));
    assert!(!pa.is_empty() && !pb.is_empty(), "{which}: both members read: {pa:?} {pb:?}");
    assert!(pa.is_disjoint(&pb), "{which}: {pa:?} and {pb:?} overlap");
    assert_eq!(pa.union(&pb).count(), 4, "{which}: every partition read");
    // Every record read exactly once.
    let mut values: Vec<&str> = ra.iter().chain(&rb).map(|(_, v)| v.as_str()).collect();
    values.sort_unstable();
    let before = values.len();
    values.dedup();
    assert_eq!((before, values.len()), (400, 400), "{which}: every record read once");
    // The committed offsets are the log ends: a member that restarts alone
    // reads only what was produced after.
    let described = broker.ok(&["group", "describe", "g2", "--output", "json"], "");
    assert!(!described.contains("\"lag\":1") && described.contains("\"lag\":0"), "{which}: {described}");
    produce_to_each_partition(&broker, "late", 5);
    let (rc, ac) = member_output(spawn_member(&kafka, which, "5"));
    assert_eq!(ac.len(), 4, "{which}: alone, it holds every partition");
    let mut got: Vec<&str> = rc.iter().map(|(_, v)| v.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<String> = (0..4).flat_map(|p| (0..5).map(move |i| format!("late{p}-{i}"))).collect();
    want.sort_unstable();
    assert_eq!(got, want, "{which}: resumed from the committed offsets");
}

#[test]
fn two_confluent_kafka_members_split_partitions_commit_and_resume() {
    two_members_split_and_resume("confluent", "confluent_kafka");
}

#[test]
fn two_kafka_python_members_split_partitions_commit_and_resume() {
    two_members_split_and_resume("kafka-python", "kafka");
}

/// kcat's balanced consumer (`-G`, librdkafka's group protocol with
/// auto-commit): two members split the partitions and together read every
/// record; a third run of the group reads only what came after.
#[test]
fn two_kcat_members_split_partitions_commit_and_resume() {
    if !have("kcat", &["-V"]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "4"], "");
    produce_to_each_partition(&broker, "v", 50);
    let member = || {
        Command::new("kcat")
            // No `-o`: with -G kcat applies it to every assignment, over the
            // committed offsets.
            .args(["-b", &kafka, "-G", "kg2", "-f", "%p %s\\n", "-q", "-X", "auto.offset.reset=earliest"])
            .args(["-X", "auto.commit.interval.ms=200", "-X", "session.timeout.ms=6000", "t"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kcat")
    };
    let stop_after = |mut child: Child, secs: u64| {
        std::thread::sleep(Duration::from_secs(secs));
        // SIGTERM: kcat leaves the group and commits on the way out.
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        let _ = child.stdin.take();
        wait_with_deadline(child)
    };
    let (a, b) = (member(), member());
    let b_out = stop_after(b, 10);
    let a_out = stop_after(a, 1);
    let parse = |out: &std::process::Output| -> Vec<(u32, String)> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(p, v)| (p.parse().expect("partition"), v.to_string()))
            .collect()
    };
    let (ra, rb) = (parse(&a_out), parse(&b_out));
    let values: BTreeSet<&str> = ra.iter().chain(&rb).map(|(_, v)| v.as_str()).collect();
    assert_eq!(values.len(), 200, "every record read: a {} b {}", ra.len(), rb.len());
    let (pa, pb) = (partitions(&ra), partitions(&rb));
    assert!(!pa.is_empty() && !pb.is_empty(), "both members read: {pa:?} {pb:?}");
    assert!(pa.is_disjoint(&pb), "split: {pa:?} {pb:?}");
    broker.ok(&["produce", "t"], "after\n");
    let c_out = stop_after(member(), 6);
    let rc = parse(&c_out);
    assert_eq!(rc, vec![(rc.first().map_or(0, |r| r.0), "after".to_string())], "resumed: {rc:?}");
}

/// Offsets by timestamp (ListOffsets with a time) from the Python clients.
const BY_TIME: &str = r#"
import sys
kafka, which, ts = sys.argv[1], sys.argv[2], int(sys.argv[3])
if which == "confluent":
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": kafka, "group.id": "unused"})
    print(c.offsets_for_times([TopicPartition("t", 0, ts)], timeout=20)[0].offset)
else:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=kafka)
    print(c.offsets_for_times({TopicPartition("t", 0): ts})[TopicPartition("t", 0)].offset)
"#;

fn offsets_by_time(which: &str, module: &str) {
    if !have("python3", &["-c", &format!("import {module}")]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "1"], "");
    broker.ok(&["produce", "t"], "early\n");
    std::thread::sleep(Duration::from_millis(30));
    let between =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    std::thread::sleep(Duration::from_millis(30));
    broker.ok(&["produce", "t"], "late\n");
    let out = Command::new("python3")
        .args(["-c", BY_TIME, &kafka, which, &between.to_string()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{which}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{which}: the first record at or after");
}

#[test]
fn confluent_kafka_finds_offsets_by_timestamp() {
    offsets_by_time("confluent", "confluent_kafka");
}

#[test]
fn kafka_python_finds_offsets_by_timestamp() {
    offsets_by_time("kafka-python", "kafka");
}
