//! Crash-restart loop (issue 15): an idempotent producer with acks=1 on a
//! `flush.policy=always` topic records every acknowledged offset while the
//! broker is SIGKILLed at random moments and restarted on the same ports,
//! 10 cycles (100 with `SHARDLOG_SLOW_TESTS=1`). Afterwards every
//! acknowledged record is in the log at its acknowledged offset, no record
//! is stored twice, and each partition holds its records in send order.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::Broker;
use shardlog_client::{Acks, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PARTITIONS: u32 = 2;

/// A public port whose two shard ports after it are free too, below the
/// kernel's ephemeral range (32768 and up by default): none of them can be
/// the source port of the producer's own connections when the broker
/// restarts on them.
fn free_port(rng: &mut Lcg) -> u16 {
    loop {
        let port = 20_000 + rng.next(12_000) as u16;
        if (0..=2).all(|i| std::net::TcpListener::bind(("127.0.0.1", port + i)).is_ok()) {
            return port;
        }
    }
}

/// A small deterministic generator for the kill times (seed printed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[test]
fn sigkill_loop_loses_and_duplicates_nothing_acknowledged() {
    let cycles = if std::env::var_os("SHARDLOG_SLOW_TESTS").is_some() { 100 } else { 10 };
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64;
    eprintln!("crash loop: {cycles} cycles, seed {seed}");
    let mut rng = Lcg(seed);
    let listen = format!("127.0.0.1:{}", free_port(&mut rng));
    // Recovery points every 50 ms: most restarts resume from one.
    let mut broker = Broker::start_with(&["--listen", &listen, "--recovery-point-interval-ms", "50"]);
    broker.ok(&["topic", "create", "crash", "--partitions", "2", "--config", "flush.policy=always"], "");

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let acked: Arc<Mutex<Vec<(u32, u64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (acked, stop, listen) = (acked.clone(), stop.clone(), listen.clone());
        rt.spawn(async move {
            let client = ClientConfig { request_timeout_ms: 1000, ..ClientConfig::new(listen) };
            let config = ProducerConfig {
                client,
                acks: Acks::Leader,
                linger_ms: 1,
                max_in_flight: 4,
                retries: 1_000_000,
                enable_idempotence: true,
                ..ProducerConfig::default()
            };
            let producer = Producer::new(config).await.expect("producer");
            let mut pending = VecDeque::new();
            let mut i = 0u64;
            let settle = |(i, f): (u64, shardlog_client::DeliveryFuture)| {
                let acked = acked.clone();
                async move {
                    let md = f.await.expect("delivered (retries outlast every restart)");
                    acked.lock().unwrap().push((md.partition, md.offset, i));
                }
            };
            while !stop.load(Ordering::Relaxed) {
                let record = ProducerRecord::new("crash", format!("{i}")).with_partition((i % 2) as u32);
                pending.push_back((i, producer.send(record).await.expect("send")));
                i += 1;
                if pending.len() > 500 {
                    settle(pending.pop_front().expect("non-empty")).await;
                }
            }
            while let Some(p) = pending.pop_front() {
                settle(p).await;
            }
            i
        })
    };

    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64;
    eprintln!("crash loop: {cycles} cycles, seed {seed}");
    let mut rng = Lcg(seed);
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(150 + rng.next(500)));
        broker.kill_and_restart();
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let sent = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), producer).await })
        .expect("the producer finished in time")
        .expect("producer task");
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len() as u64, sent, "every record was acknowledged");
    assert!(sent > 100, "the producer made progress: {sent}");

    let described = broker.ok(&["topic", "describe", "crash", "--output", "json"], "");
    let described: serde_json::Value = serde_json::from_str(&described).expect("json");
    // What the log holds, per partition: offset -> value.
    for p in 0..PARTITIONS {
        let end = described["partitions"][p as usize]["end_offset"].as_u64().expect("end_offset");
        let want: Vec<&(u32, u64, u64)> = acked.iter().filter(|a| a.0 == p).collect();
        let out = broker.ok(
            &[
                "consume",
                "crash",
                "--partition",
                &p.to_string(),
                "--offset",
                "0",
                "--max-messages",
                &want.len().to_string(),
                "--format",
                "json",
            ],
            "",
        );
        let stored: BTreeMap<u64, u64> = out
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                (
                    v["offset"].as_u64().expect("offset"),
                    v["value"].as_str().expect("value").parse().expect("number"),
                )
            })
            .collect();
        assert_eq!(end, want.len() as u64, "partition {p}: the log holds exactly the acknowledged records");
        assert_eq!(stored.len(), want.len(), "partition {p}: as many records as acknowledged, none twice");
        for (_, offset, i) in &want {
            assert_eq!(
                stored.get(offset),
                Some(i),
                "partition {p}: record {i} at its acknowledged offset {offset}"
            );
        }
        let values: Vec<u64> = stored.values().copied().collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "partition {p}: send order");
    }
    eprintln!("crash loop: {cycles} cycles, {sent} records acknowledged and found, none lost or duplicated");
}
