//! One producer, default settings (8 requests in flight), one partition:
//! records of mixed sizes land in `send` order. Shaped like the report of
//! issue 16: bursts of 2,000 records of 8,000 B, then 2,000 of 50 B, each
//! value starting with its sequence number; only the last delivery is
//! awaited, so the producer pipelines as deep as it may and the broker's
//! log applies back-pressure.

mod common;

use common::{consume, create, producer_config, TestBroker};
use shardlog_client::{Producer, ProducerRecord};

const BURST: u64 = 2_000;

fn value(seq: u64) -> Vec<u8> {
    let len = if (seq / BURST).is_multiple_of(2) { 8_000 } else { 50 };
    let mut v = format!("{seq:012}").into_bytes();
    v.resize(len, b'.');
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_sizes_pipelined_keep_send_order() {
    let slow = std::env::var_os("SHARDLOG_SLOW_TESTS").is_some();
    let records: u64 = if slow { 600_000 } else { 40_000 };
    let broker = TestBroker::start().await;
    create(&broker, "ordered", 1).await;
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    let mut last = None;
    for seq in 0..records {
        last = Some(producer.send(ProducerRecord::new("ordered", value(seq))).await.expect("send"));
    }
    let md = last.expect("sent").await.expect("last record delivered");
    assert_eq!(md.offset, records - 1, "every record landed exactly once");
    producer.close().await.expect("close");
    let got = consume(&broker, &[("ordered".to_string(), 0)], records as usize).await;
    let mut inversions = Vec::new();
    for (i, r) in got.iter().enumerate() {
        let seq: u64 = std::str::from_utf8(&r.value[..12]).expect("ascii").parse().expect("sequence");
        assert_eq!(r.value.len(), value(seq).len(), "record {seq} has its own size");
        if seq != i as u64 {
            inversions.push((r.offset, seq));
        }
    }
    assert!(
        inversions.is_empty(),
        "{} records out of send order, first (offset, sequence): {:?}",
        inversions.len(),
        &inversions[..inversions.len().min(5)]
    );
}
