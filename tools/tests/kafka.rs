//! The Kafka listener against real Kafka clients nobody here wrote: `kcat`
//! (librdkafka, Debian), `confluent-kafka` (librdkafka in its wheel) and
//! `kafka-python`, as processes, against a real `shardlog serve`. `.ci/run`
//! installs them; a test whose client is missing says so and skips.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{have, kcat, start_kafka as start, Broker};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

#[test]
fn kcat_lists_every_shard_as_a_node_and_each_partition_s_owner_as_leader() {
    if !have("kcat", &["-V"]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "4"], "");
    let out = kcat(&kafka, &["-L", "-J"], "");
    let meta: serde_json::Value = serde_json::from_str(&out).expect("kcat -J prints JSON");
    let brokers = meta["brokers"].as_array().expect("brokers");
    assert_eq!(brokers.len(), 2, "one node per shard: {out}");
    let topic =
        meta["topics"].as_array().expect("topics").iter().find(|t| t["topic"] == "t").expect("topic t");
    let leaders: Vec<i64> = topic["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["leader"].as_i64().expect("leader"))
        .collect();
    // Partition → shard is the documented function; both shards lead some.
    assert_eq!(leaders.len(), 4);
    assert!(leaders.contains(&0) && leaders.contains(&1), "{leaders:?}");
}

#[test]
fn kafka_advertise_shared_presents_one_node_and_forwards_to_the_owning_shards() {
    if !have("kcat", &["-V"]) {
        return;
    }
    let broker = Broker::start_with(&["--kafka-listen", "127.0.0.1:0", "--kafka-advertise", "shared"]);
    let kafka = broker.kafka.clone().expect("kafka= in the ready line");
    broker.ok(&["topic", "create", "t", "--partitions", "4"], "");
    let out = kcat(&kafka, &["-L", "-J"], "");
    let meta: serde_json::Value = serde_json::from_str(&out).expect("kcat -J prints JSON");
    let brokers = meta["brokers"].as_array().expect("brokers");
    assert_eq!(brokers.len(), 1, "one node: {out}");
    let port = kafka.rsplit(':').next().expect("port");
    assert!(brokers[0]["name"].as_str().is_some_and(|n| n.ends_with(&format!(":{port}"))), "{out}");
    // Every partition, whichever shard owns it, goes through the one node.
    for p in 0..4 {
        kcat(&kafka, &["-P", "-t", "t", "-p", &p.to_string()], &format!("r{p}\n"));
    }
    let out = kcat(&kafka, &["-C", "-t", "t", "-e", "-q", "-f", "%p:%o:%s\n"], "");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["0:0:r0", "1:0:r1", "2:0:r2", "3:0:r3"]);
    let native = broker.ok(&["consume", "t", "--partition", "3", "--offset", "0", "--max-messages", "1"], "");
    assert_eq!(native.trim(), "r3");
}

#[test]
fn kcat_and_the_native_cli_read_each_other_s_records_with_keys_headers_and_every_codec() {
    if !have("kcat", &["-V"]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "2"], "");
    kcat(&kafka, &["-P", "-t", "t", "-p", "0", "-K", ":", "-H", "h1=v1"], "k1:one\nk2:two\n");
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        kcat(&kafka, &["-P", "-t", "t", "-p", "0", "-z", codec], &format!("{codec}\n"));
    }
    broker.ok(&["produce", "t", "--partition", "1"], "native-a\nnative-b\n");

    // The native consumer sees the Kafka producer's records, keys and headers.
    let out = broker.ok(
        &["consume", "t", "--partition", "0", "--offset", "0", "--format", "json", "--max-messages", "6"],
        "",
    );
    let records: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    let values: Vec<&str> = records.iter().map(|r| r["value"].as_str().expect("value")).collect();
    assert_eq!(values, ["one", "two", "gzip", "snappy", "lz4", "zstd"]);
    assert_eq!(records[0]["key"], "k1");
    assert_eq!(records[0]["headers"]["h1"], "v1");

    // kcat sees both, at the same offsets.
    let out = kcat(&kafka, &["-C", "-t", "t", "-e", "-q", "-f", "%p:%o:%k:%s:%h\n"], "");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "0:0:k1:one:h1=v1",
            "0:1:k2:two:h1=v1",
            "0:2::gzip:",
            "0:3::snappy:",
            "0:4::lz4:",
            "0:5::zstd:",
            "1:0::native-a:",
            "1:1::native-b:"
        ]
    );
}

#[test]
fn kcat_finds_offsets_by_timestamp() {
    if !have("kcat", &["-V"]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "1"], "");
    kcat(&kafka, &["-P", "-t", "t"], "early\n");
    std::thread::sleep(Duration::from_millis(50));
    let between =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    std::thread::sleep(Duration::from_millis(50));
    kcat(&kafka, &["-P", "-t", "t"], "late\n");
    let out = kcat(&kafka, &["-Q", "-t", &format!("t:0:{between}")], "");
    assert!(out.contains("offset 1"), "{out}");
}

const PYTHON_CLIENTS: &str = r#"
import sys
kafka, which = sys.argv[1], sys.argv[2]
if which == "confluent":
    from confluent_kafka import Producer, Consumer, TopicPartition
    p = Producer({"bootstrap.servers": kafka, "acks": "all", "compression.type": "lz4"})
    for i in range(100):
        p.produce("t", key=b"k%d" % (i % 7), value=b"c%d" % i, headers=[("n", str(i).encode())])
    assert p.flush(20) == 0, "undelivered records"
    c = Consumer({"bootstrap.servers": kafka, "group.id": "unused", "enable.auto.commit": False})
    got = []
    c.assign([TopicPartition("t", p_, 0) for p_ in range(3)])
    while len(got) < 100:
        m = c.poll(10)
        assert m is not None, "timed out after %d records" % len(got)
        assert m.error() is None, m.error()
        got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
else:
    from kafka import KafkaProducer, KafkaConsumer, TopicPartition
    p = KafkaProducer(bootstrap_servers=kafka, acks="all", compression_type="gzip")
    fs = [p.send("t", key=b"k%d" % (i % 7), value=b"p%d" % i, headers=[("n", str(i).encode())]) for i in range(100)]
    p.flush(20)
    [f.get(timeout=20) for f in fs]
    c = KafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False, consumer_timeout_ms=10000)
    c.assign([TopicPartition("t", p_) for p_ in range(3)])
    c.seek_to_beginning()
    got = [(m.partition, m.offset, m.key, m.value, m.headers) for m in c]
# Per key, values arrive in the order they were sent, on one partition.
by_key = {}
for part, off, key, value, headers in got:
    by_key.setdefault(key, []).append((part, off, int(value[1:]), headers))
for key, seen in by_key.items():
    assert len({s[0] for s in seen}) == 1, "key %r on several partitions" % key
    nums = [s[2] for s in sorted(seen)]
    assert nums == sorted(nums), "key %r out of order: %r" % (key, nums)
    assert all(dict(s[3])["n"] == str(s[2]).encode() for s in seen)
print(len(got))
"#;

fn python_client(which: &str, module: &str) {
    let probe = format!("import {module}");
    if !have("python3", &["-c", &probe]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "3"], "");
    let out = Command::new("python3").args(["-c", PYTHON_CLIENTS, &kafka, which]).output().expect("python3");
    assert!(out.status.success(), "{which}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "100");
    // The native consumer counts the same records.
    let native = broker.ok(&["consume", "t", "--from-beginning", "--max-messages", "100"], "");
    assert_eq!(native.lines().count(), 100);
}

#[test]
fn confluent_kafka_produces_compressed_keyed_records_and_reads_them_back() {
    python_client("confluent", "confluent_kafka");
}

#[test]
fn kafka_python_produces_compressed_keyed_records_and_reads_them_back() {
    python_client("kafka-python", "kafka");
}

/// Sends one raw frame; the response bytes (empty if the broker closed).
fn raw(kafka: &str, frame: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(kafka).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(frame).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn request(key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    let len = 8 + 2 + body.len();
    f.extend_from_slice(&(len as i32).to_be_bytes());
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    f.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    f.extend_from_slice(body);
    f
}

#[test]
fn bad_frames_close_only_their_connection_and_a_too_new_api_versions_gets_error_35() {
    let (broker, kafka) = start();
    // ApiVersions v99: a v0 answer with UNSUPPORTED_VERSION and our table.
    let mut s = TcpStream::connect(&kafka).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(&request(18, 99, &[])).expect("send");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("an answer");
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).expect("body");
    assert_eq!(&body[..4], &7i32.to_be_bytes(), "correlation id");
    assert_eq!(i16::from_be_bytes([body[4], body[5]]), 35, "UNSUPPORTED_VERSION");
    let apis = i32::from_be_bytes([body[6], body[7], body[8], body[9]]);
    assert!(apis >= 5, "lists the supported APIs");
    drop(s);

    // An unknown API key, a frame over the limit, junk: closed, no answer.
    assert!(raw(&kafka, &request(9999, 0, &[])).is_empty());
    assert!(raw(&kafka, &[0x7f, 0xff, 0xff, 0xff, 0, 0]).is_empty());
    // Metadata claiming 2^31-1 topics in a 4-byte body: refused, nothing allocated for them.
    assert!(raw(&kafka, &request(3, 1, &[0x7f, 0xff, 0xff, 0xff])).is_empty(), "Metadata with a lying body");
    // And the broker serves everyone else as before.
    broker.ok(&["topic", "create", "t", "--partitions", "1"], "");
    if have("kcat", &["-V"]) {
        assert!(kcat(&kafka, &["-L"], "").contains("topic \"t\""));
    }
}

const KAFKA_GROUP: &str = r#"
import sys, time
from confluent_kafka import Consumer
kafka, want = sys.argv[1], int(sys.argv[2])
c = Consumer({"bootstrap.servers": kafka, "group.id": "kg", "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe(["t"])
got, t = [], time.time()
while len(got) < want and time.time() - t < 30:
    m = c.poll(1)
    if m is not None and m.error() is None:
        got.append(m.value())
c.commit(asynchronous=False)
c.close()
print(len(got))
"#;

/// A Kafka consumer group (subscribe, rebalance, commit) through the same
/// coordinator as native groups: `shardlog group describe` shows its
/// offsets, and a restarted member resumes after them.
#[test]
fn a_confluent_kafka_group_commits_and_a_restarted_member_resumes_from_its_offsets() {
    if !have("python3", &["-c", "import confluent_kafka"]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "4"], "");
    let lines: String = (0..40).map(|i| format!("v{i}\n")).collect();
    broker.ok(&["produce", "t"], &lines);
    let run = |want: &str| {
        let out = Command::new("python3").args(["-c", KAFKA_GROUP, &kafka, want]).output().expect("python3");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(run("40"), "40");
    let described = broker.ok(&["group", "describe", "kg", "--output", "json"], "");
    let d: serde_json::Value = serde_json::from_str(&described).expect("json");
    assert!(d.to_string().contains("\"lag\":0"), "every partition committed to its end: {described}");
    broker.ok(&["produce", "t"], "after\n");
    assert_eq!(run("1"), "1", "resumes after the committed offsets");
}

/// Describes topic `t`'s configs with confluent-kafka's and kafka-python's
/// admin clients; prints `name=value:default|topic` lines, then (confluent)
/// the error of an unknown topic.
const DESCRIBE_CONFIGS: &str = r#"
import sys
bootstrap, which = sys.argv[1], sys.argv[2]
if which == "confluent":
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, "t")
    configs = admin.describe_configs([res])[res].result(timeout=30)
    for name, e in sorted(configs.items()):
        print(f"{name}={e.value}:{'default' if e.is_default else 'topic'}")
    try:
        bad = ConfigResource(ConfigResource.Type.TOPIC, "nope")
        admin.describe_configs([bad])[bad].result(timeout=30)
        print("unknown topic: no error")
    except Exception as e:
        print("unknown topic:", e.args[0].name())
else:
    from kafka.admin import KafkaAdminClient, ConfigResource, ConfigResourceType
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    # kafka-python 3 answers {"topic": {name: {config: {...}}}}, leaving out
    # the entries whose source is the default.
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "t")])["topic"]["t"]
    for name, e in sorted(configs.items()):
        kind = "default" if e["config_source"] == "DEFAULT_CONFIG" else "topic"
        print(f"{name}={e['value']}:{kind}")
"#;

fn describe_configs_with(which: &str, module: &str) {
    if !have("python3", &["-c", &format!("import {module}")]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "1", "--config", "retention.ms=3600000"], "");
    let out =
        Command::new("python3").args(["-c", DESCRIBE_CONFIGS, &kafka, which]).output().expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{which}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.contains(&"retention.ms=3600000:topic"), "{which}: {stdout}");
    assert!(lines.iter().all(|l| !l.starts_with("retention.ms=") || l.ends_with(":topic")), "{stdout}");
    if which == "confluent" {
        assert!(lines.contains(&"segment.bytes=1073741824:default"), "{stdout}");
        assert!(lines.contains(&"cleanup.policy=delete:default"), "{stdout}");
        assert!(lines.contains(&"unknown topic: UNKNOWN_TOPIC_OR_PART"), "{stdout}");
    }
}

#[test]
fn confluent_kafka_describes_a_topic_s_configs() {
    describe_configs_with("confluent", "confluent_kafka");
}

#[test]
fn kafka_python_describes_a_topic_s_configs() {
    describe_configs_with("kafka-python", "kafka");
}
