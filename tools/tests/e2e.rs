//! End to end: the real `shardlog` binary on 127.0.0.1 with a temp data
//! directory, driven by the real Rust client.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use shardlog_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use shardlog_schema::types::shard_for;
use shardlog_schema::PartitionId;
use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Broker {
    child: Child,
    listen: String,
    shard_ports: Vec<u16>,
}

impl Broker {
    fn start(dir: &std::path::Path, shards: usize) -> Broker {
        let (child, ready) = common::serve(dir, shards);
        Broker { child, listen: ready.listen, shard_ports: ready.shard_ports }
    }

    /// SIGTERM and wait: a graceful stop must exit 0.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "broker exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "broker did not stop within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PARTITIONS: u32 = 8;
const MESSAGES: u64 = 100_000;

async fn consume_all(bootstrap: &str, topic: &str, expect: u64) -> BTreeMap<u32, Vec<(u64, String)>> {
    let mut consumer =
        Consumer::new(ConsumerConfig { client: ClientConfig::new(bootstrap), ..Default::default() })
            .await
            .expect("consumer");
    let parts: Vec<(String, u32)> = (0..PARTITIONS).map(|p| (topic.to_string(), p)).collect();
    consumer.assign(&parts, SeekTo::Earliest).await.expect("assign");
    let mut got: BTreeMap<u32, Vec<(u64, String)>> = BTreeMap::new();
    let mut total = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while total < expect {
        assert!(Instant::now() < deadline, "consumed only {total} of {expect}");
        for r in consumer.poll(Duration::from_millis(500)).await.expect("poll") {
            got.entry(r.partition)
                .or_default()
                .push((r.offset, String::from_utf8(r.value.to_vec()).expect("utf8")));
            total += 1;
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_messages_over_eight_partitions_survive_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path(), 2);
    let bootstrap = broker.listen.clone();
    let admin = Admin::connect(ClientConfig::new(&bootstrap)).await.expect("admin");
    admin.create_topic("e2e", PARTITIONS, &[]).await.expect("create");

    // Metadata sends clients to the owner shard's own port.
    let desc = admin.describe_topic("e2e").await.expect("describe");
    for p in &desc.partitions {
        let owner = shard_for("e2e", PartitionId(p.partition), 2).0;
        assert_eq!(p.leader_shard, owner);
        assert_eq!(p.leader_port, broker.shard_ports[owner as usize]);
    }

    let producer = Producer::new(ProducerConfig {
        client: ClientConfig::new(&bootstrap),
        acks: Acks::Leader,
        ..Default::default()
    })
    .await
    .expect("producer");
    let mut deliveries = Vec::with_capacity(MESSAGES as usize);
    for i in 0..MESSAGES {
        let p = (i % u64::from(PARTITIONS)) as u32;
        let seq = i / u64::from(PARTITIONS);
        let rec = ProducerRecord::new("e2e", format!("p{p}-{seq}")).with_partition(p);
        deliveries.push(producer.send(rec).await.expect("enqueue"));
    }
    let mut acked: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for d in deliveries {
        let md = d.await.expect("acknowledged");
        acked.entry(md.partition).or_default().push(md.offset);
    }
    for (p, offsets) in &acked {
        let want: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, &want, "partition {p} offsets are dense and in send order");
    }
    producer.close().await.expect("close");

    let check = |got: &BTreeMap<u32, Vec<(u64, String)>>| {
        assert_eq!(got.len(), PARTITIONS as usize);
        for (p, records) in got {
            assert_eq!(records.len() as u64, MESSAGES / u64::from(PARTITIONS));
            for (seq, (offset, value)) in records.iter().enumerate() {
                assert_eq!(*offset, seq as u64);
                assert_eq!(value, &format!("p{p}-{seq}"));
            }
        }
    };
    check(&consume_all(&bootstrap, "e2e", MESSAGES).await);
    broker.stop();

    // A restart keeps topics and data.
    let broker = Broker::start(dir.path(), 2);
    let admin = Admin::connect(ClientConfig::new(&broker.listen)).await.expect("admin");
    assert!(admin.list_topics().await.expect("list").contains(&"e2e".to_string()));
    check(&consume_all(&broker.listen, "e2e", MESSAGES).await);
    broker.stop();
}
