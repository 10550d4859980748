//! The cluster's data plane with real `shardlog serve` processes on a real
//! 3-node ZooKeeper ensemble (skipped, loudly, without ZooKeeper): topics
//! created through any broker are placed over all of them and served
//! everywhere; clients that know one bootstrap address move every message
//! with per-key order kept; a dead broker's partitions show offline and
//! come back with their data; a broker that joins gets partitions of the
//! topics created after it; a ZooKeeper node lost changes nothing.
//!
//! Each test starts its own ensemble and brokers (one shard each).

#[allow(dead_code)]
mod common;
#[path = "../../broker/tests/common/zk.rs"]
mod zk;

use common::cluster::{admin, rt, Node, SESSION_MS};
use common::{wait_for, BIN};
use shardlog_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, ErrorCode, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// Leader broker per partition as `bootstrap` describes the topic (-1: offline).
fn leaders(rt: &tokio::runtime::Runtime, bootstrap: &str, topic: &str) -> Option<Vec<i32>> {
    let d = rt.block_on(async { admin_quiet(bootstrap).await?.describe_topic(topic).await.ok() })?;
    Some(d.partitions.iter().map(|p| if p.offline { -1 } else { p.leader_broker }).collect())
}

async fn admin_quiet(bootstrap: &str) -> Option<Admin> {
    Admin::connect(ClientConfig::new(bootstrap)).await.ok()
}

/// Creates `topic` through `via` and waits until `check` describes every
/// partition with a live leader (describe asks each leader, so every leader
/// then serves it).
fn create_servable(rt: &tokio::runtime::Runtime, via: &str, check: &str, topic: &str, partitions: u32) {
    rt.block_on(admin(rt, via).create_topic(topic, partitions, &[]))
        .unwrap_or_else(|e| panic!("create {topic}: {e}"));
    wait_for("servable", Duration::from_secs(10), || {
        leaders(rt, check, topic).filter(|l| l.len() == partitions as usize && l.iter().all(|&x| x > 0))
    });
}

fn cli(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf8")
}

/// Produces `per_key` records for each of `keys` keys (value `key:seq`)
/// through `bootstrap` only; returns how many were acknowledged.
fn produce_keyed(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    topic: &str,
    keys: u32,
    per_key: u32,
    from: u32,
) -> u64 {
    rt.block_on(async {
        let producer = Producer::new(ProducerConfig {
            client: ClientConfig::new(bootstrap),
            acks: Acks::Leader,
            ..Default::default()
        })
        .await
        .expect("producer");
        let mut deliveries = Vec::new();
        for seq in from..from + per_key {
            for k in 0..keys {
                let rec = ProducerRecord::new(topic, format!("k{k}:{seq}")).with_key(format!("k{k}"));
                deliveries.push(producer.send(rec).await.expect("enqueue"));
            }
        }
        let mut acked = 0;
        for d in deliveries {
            d.await.expect("acknowledged");
            acked += 1;
        }
        producer.close().await.expect("close");
        acked
    })
}

/// Reads every partition from the start through `bootstrap` until `expect`
/// records came; returns the values per key in the order read.
fn consume_keyed(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    expect: u64,
) -> BTreeMap<String, Vec<u32>> {
    rt.block_on(async {
        let mut consumer =
            Consumer::new(ConsumerConfig { client: ClientConfig::new(bootstrap), ..Default::default() })
                .await
                .expect("consumer");
        let parts: Vec<(String, u32)> = (0..partitions).map(|p| (topic.to_string(), p)).collect();
        consumer.assign(&parts, SeekTo::Earliest).await.expect("assign");
        let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut total = 0u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while total < expect {
            assert!(Instant::now() < deadline, "consumed only {total} of {expect}");
            for r in consumer.poll(Duration::from_millis(500)).await.expect("poll") {
                let v = String::from_utf8(r.value.to_vec()).expect("utf8");
                let (k, seq) = v.split_once(':').expect("key:seq");
                by_key.entry(k.to_string()).or_default().push(seq.parse().expect("seq"));
                total += 1;
            }
        }
        by_key
    })
}

fn check_order(by_key: &BTreeMap<String, Vec<u32>>, keys: u32, per_key: u32) {
    assert_eq!(by_key.len(), keys as usize);
    for (k, seqs) in by_key {
        let want: Vec<u32> = (0..per_key).collect();
        assert_eq!(seqs, &want, "key {k}: every record once, in order");
    }
}

#[test]
fn three_brokers_place_route_and_serve_a_topic_created_anywhere() {
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/data", zk.connect_string());
    let rt = rt();
    let brokers: Vec<Node> = (1..=3).map(|id| Node::start(id, &connect)).collect();
    let bootstrap_list = brokers.iter().map(|b| b.listen.as_str()).collect::<Vec<_>>().join(",");

    // Created through broker 2 (broker 1 is the controller).
    let created = Instant::now();
    rt.block_on(admin(&rt, &brokers[1].listen).create_topic("orders", 12, &[])).expect("create");
    // Every broker serves it, with the same leaders.
    let mut seen = Vec::new();
    for b in &brokers {
        let (l, took) = wait_for("metadata on every broker", Duration::from_secs(10), || {
            leaders(&rt, &b.listen, "orders").filter(|l| l.len() == 12 && l.iter().all(|&x| x > 0))
        });
        eprintln!(
            "broker {}: topic servable {took:?} after its creation returned ({:?} since asked)",
            b.id,
            created.elapsed()
        );
        seen.push(l);
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    for id in 1..=3 {
        assert_eq!(
            seen[0].iter().filter(|&&l| l == id).count(),
            4,
            "4 partitions on broker {id}: {:?}",
            seen[0]
        );
    }
    // Describe shows each partition's broker, shard and port.
    let d: serde_json::Value = serde_json::from_str(&cli(&[
        "topic",
        "describe",
        "orders",
        "--bootstrap",
        &brokers[2].listen,
        "--output",
        "json",
    ]))
    .expect("json");
    for p in d["partitions"].as_array().expect("partitions") {
        let leader = p["leader_broker"].as_i64().expect("leader");
        let owner = &brokers[leader as usize - 1];
        let port = p["leader_port"].as_u64().expect("port");
        assert_ne!(format!("127.0.0.1:{port}"), owner.listen, "the shard's own port, not the public one");
        assert_eq!(p["replicas"], serde_json::json!([leader]));
    }
    let status: serde_json::Value =
        serde_json::from_str(&cli(&["cluster", "status", "--zookeeper", &connect, "--output", "json"]))
            .expect("json");
    let counts: Vec<i64> = status["brokers"]
        .as_array()
        .expect("brokers")
        .iter()
        .map(|b| b["partitions"].as_i64().unwrap())
        .collect();
    assert_eq!(counts, vec![4, 4, 4], "{status}");

    // A producer and a consumer that each know one broker move every record.
    let (keys, per_key) = (40, 250);
    assert_eq!(produce_keyed(&rt, &brokers[0].listen, "orders", keys, per_key, 0), u64::from(keys * per_key));
    check_order(
        &consume_keyed(&rt, &brokers[2].listen, "orders", 12, u64::from(keys * per_key)),
        keys,
        per_key,
    );
    // A bootstrap list whose first broker is down works too.
    let dead_first = format!("127.0.0.1:1,{bootstrap_list}");
    check_order(&consume_keyed(&rt, &dead_first, "orders", 12, u64::from(keys * per_key)), keys, per_key);

    // A consumer group: the first group request has `__consumer_offsets`
    // created through the controller; the coordinator is its partition's
    // leader, whichever broker the consumer bootstraps from. Committed
    // offsets hold across consumers bootstrapped at different brokers.
    let half = keys * per_key / 2;
    let group = |bootstrap: &str, n: u32| {
        let n = n.to_string();
        cli(&[
            "consume",
            "orders",
            "--group",
            "g1",
            "--from-beginning",
            "--max-messages",
            &n,
            "--bootstrap",
            bootstrap,
        ])
    };
    let first = group(&brokers[0].listen, half);
    let second = group(&brokers[2].listen, keys * per_key - half);
    let mut values: Vec<&str> = first.lines().chain(second.lines()).collect();
    assert_eq!(values.len() as u32, keys * per_key);
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len() as u32, keys * per_key, "each record once across the two consumers");
    let d = admin(&rt, &brokers[1].listen);
    let offsets = rt.block_on(d.describe_topic("__consumer_offsets")).expect("offsets topic");
    assert_eq!(offsets.partitions.len(), 3);

    // A replication factor above the live brokers is refused clearly.
    let out = Command::new(BIN)
        .args(["topic", "create", "rf4", "--replication-factor", "4", "--bootstrap", &brokers[0].listen])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("replication factor 4"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Deleted through broker 3: gone everywhere.
    rt.block_on(admin(&rt, &brokers[2].listen).delete_topic("orders")).expect("delete");
    for b in &brokers {
        wait_for("deletion everywhere", Duration::from_secs(10), || {
            let names = rt.block_on(async { admin_quiet(&b.listen).await?.list_topics().await.ok() })?;
            (!names.contains(&"orders".to_string())).then_some(())
        });
    }
}

#[test]
fn a_dead_brokers_partitions_go_offline_and_come_back_with_their_data() {
    let Some(mut zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/faults", zk.connect_string());
    let rt = rt();
    let mut brokers: Vec<Node> = (1..=3).map(|id| Node::start(id, &connect)).collect();
    // CreateTopics answers once the broker asked has the topic; the leaders
    // on other brokers follow within milliseconds. A plain (not idempotent)
    // producer that meets that window retries its first batches, which may
    // then land after later ones: wait until every leader serves (describe
    // asks each one).
    create_servable(&rt, &brokers[0].listen, &brokers[0].listen, "events", 6);
    let (keys, per_key) = (12, 100);
    produce_keyed(&rt, &brokers[0].listen, "events", keys, per_key, 0);

    // Broker 3 dies: after its session times out its partitions are offline.
    let killed = Instant::now();
    brokers[2].kill();
    let (l, took) = wait_for("offline partitions", Duration::from_millis(SESSION_MS * 3 + 5000), || {
        leaders(&rt, &brokers[0].listen, "events").filter(|l| l.contains(&-1))
    });
    eprintln!("broker 3's partitions offline {took:?} after SIGKILL (session {SESSION_MS} ms)");
    assert_eq!(l.iter().filter(|&&x| x == -1).count(), 2, "{l:?}");
    let offline = l.iter().position(|&x| x == -1).expect("one") as u32;
    let text = cli(&["topic", "describe", "events", "--bootstrap", &brokers[1].listen]);
    assert!(text.contains("OFFLINE"), "{text}");
    let status = cli(&["cluster", "status", "--zookeeper", &connect]);
    assert!(status.contains("offline partitions: 2"), "{status}");
    // Producing to an offline partition fails with a typed, retriable error.
    let err = rt.block_on(async {
        let producer = Producer::new(ProducerConfig {
            client: ClientConfig { retry_backoff_ms: 50, ..ClientConfig::new(&brokers[1].listen) },
            retries: 2,
            ..Default::default()
        })
        .await
        .expect("producer");
        let d =
            producer.send(ProducerRecord::new("events", "x").with_partition(offline)).await.expect("enqueue");
        d.await.expect_err("offline partition")
    });
    assert_eq!(err.code(), Some(ErrorCode::LeaderNotAvailable), "{err}");

    // One ZooKeeper node of three lost: the cluster keeps serving.
    zk.kill(0);
    create_servable(&rt, &brokers[1].listen, &brokers[0].listen, "after-zk-loss", 2);
    produce_keyed(&rt, &brokers[0].listen, "after-zk-loss", 2, 10, 0);
    check_order(&consume_keyed(&rt, &brokers[1].listen, "after-zk-loss", 2, 20), 2, 10);

    // Broker 3 back on its data: online again, every record there.
    brokers[2].spawn();
    let (_, took) = wait_for("partitions back online", Duration::from_secs(20), || {
        leaders(&rt, &brokers[0].listen, "events").filter(|l| !l.contains(&-1))
    });
    eprintln!(
        "broker 3's partitions online {took:?} after its restart ({:?} since the kill)",
        killed.elapsed()
    );
    check_order(
        &consume_keyed(&rt, &brokers[0].listen, "events", 6, u64::from(keys * per_key)),
        keys,
        per_key,
    );

    // A fourth broker joins: topics created after it get partitions on it.
    brokers.push(Node::start(4, &connect));
    rt.block_on(admin(&rt, &brokers[3].listen).create_topic("later", 8, &[])).expect("create");
    let (l, _) = wait_for("placement over four", Duration::from_secs(10), || {
        leaders(&rt, &brokers[0].listen, "later").filter(|l| l.iter().all(|&x| x > 0))
    });
    // Placement balances leaders across topics: the newcomer, leading
    // nothing, takes the most; every broker then leads 4 partitions.
    assert!(l.iter().filter(|&&x| x == 4).count() >= 2, "{l:?}");
    let status: serde_json::Value =
        serde_json::from_str(&cli(&["cluster", "status", "--zookeeper", &connect, "--output", "json"]))
            .expect("json");
    let leading: Vec<i64> = status["brokers"]
        .as_array()
        .expect("brokers")
        .iter()
        .map(|b| b["leading"].as_i64().unwrap())
        .collect();
    assert_eq!(leading, vec![4, 4, 4, 4], "{status}");
}

#[test]
fn kafka_clients_see_the_whole_cluster_through_any_broker() {
    if !common::have("kcat", &["-V"]) {
        return;
    }
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/kafka", zk.connect_string());
    let rt = rt();
    let brokers: Vec<Node> = (1..=3).map(|id| Node::start(id, &connect)).collect();
    create_servable(&rt, &brokers[0].listen, &brokers[2].listen, "kt", 6);
    // Metadata from one broker's Kafka listener names every broker's node.
    let md: serde_json::Value =
        serde_json::from_str(&common::kcat(&brokers[1].kafka, &["-L", "-J", "-t", "kt"], "")).expect("json");
    let nodes: Vec<i64> =
        md["brokers"].as_array().expect("brokers").iter().map(|b| b["id"].as_i64().unwrap()).collect();
    assert_eq!(nodes, vec![1024, 2048, 3072], "{md}");
    let leaders: Vec<i64> = md["topics"][0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["leader"].as_i64().unwrap())
        .collect();
    assert_eq!(leaders.iter().filter(|&&l| l == 2048).count(), 2, "{md}");
    // Produced through broker 1's listener, consumed through broker 3's.
    let input: String = (0..300).map(|i| format!("k{}:{i}\n", i % 10)).collect();
    common::kcat(&brokers[0].kafka, &["-P", "-t", "kt", "-K", ":"], &input);
    let out =
        common::kcat(&brokers[2].kafka, &["-C", "-t", "kt", "-o", "beginning", "-e", "-f", "%k:%s\n"], "");
    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for line in out.lines() {
        let (k, v) = line.split_once(':').expect("key:value");
        by_key.entry(k.to_string()).or_default().push(v.parse().expect("number"));
    }
    assert_eq!(by_key.values().map(Vec::len).sum::<usize>(), 300, "{out}");
    for (k, vs) in &by_key {
        assert!(vs.windows(2).all(|w| w[0] < w[1]), "key {k} out of order: {vs:?}");
    }
}

#[test]
fn a_producer_rides_out_a_broker_restart_within_its_delivery_timeout() {
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/restart", zk.connect_string());
    let rt = rt();
    let mut brokers: Vec<Node> = (1..=3).map(|id| Node::start(id, &connect)).collect();
    create_servable(&rt, &brokers[0].listen, &brokers[0].listen, "steady", 6);
    let (keys, per_key) = (12u32, 400u32);
    let bootstrap = brokers[0].listen.clone();
    let producing = rt.spawn(async move {
        let producer = Producer::new(ProducerConfig {
            client: ClientConfig { retry_backoff_ms: 100, ..ClientConfig::new(&bootstrap) },
            retries: u32::MAX,
            delivery_timeout_ms: 30_000,
            // Retries of batches that landed before the kill are stored once.
            enable_idempotence: true,
            ..Default::default()
        })
        .await
        .expect("producer");
        let mut deliveries = Vec::new();
        for seq in 0..per_key {
            for k in 0..keys {
                let rec = ProducerRecord::new("steady", format!("k{k}:{seq}")).with_key(format!("k{k}"));
                deliveries.push(producer.send(rec).await.expect("enqueue"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for d in deliveries {
            d.await.expect("acknowledged within the delivery timeout");
        }
        producer.close().await.expect("close");
    });
    // Broker 3 dies mid-stream and comes back on its data 3 s later.
    std::thread::sleep(Duration::from_millis(500));
    brokers[2].kill();
    std::thread::sleep(Duration::from_secs(3));
    brokers[2].spawn();
    rt.block_on(producing).expect("producer task");
    let total = u64::from(keys * per_key);
    check_order(&consume_keyed(&rt, &brokers[1].listen, "steady", 6, total), keys, per_key);
}
