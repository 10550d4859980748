//! Client tests against the in-memory mock broker (`testing.rs`).

use crate::conn::{ConnOptions, Connection};
use crate::protocol::{self, OffsetQuery};
use crate::testing::{b, MockBroker};
use crate::*;
use shardlog_schema::frame::FrameLimits;
use std::time::Duration;

fn client(mock: &MockBroker) -> ClientConfig {
    ClientConfig { request_timeout_ms: 5_000, retry_backoff_ms: 10, ..ClientConfig::new(mock.addr.clone()) }
}

fn producer_config(mock: &MockBroker) -> ProducerConfig {
    ProducerConfig { client: client(mock), linger_ms: 1, ..ProducerConfig::default() }
}

async fn consume_all(mock: &MockBroker, parts: &[(String, u32)], expect: usize) -> Vec<ConsumerRecord> {
    let mut c = Consumer::new(ConsumerConfig { client: client(mock), ..ConsumerConfig::default() })
        .await
        .expect("consumer");
    c.assign(parts, SeekTo::Earliest).await.expect("assign");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < expect {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {expect} records", out.len());
        out.extend(c.poll(Duration::from_millis(200)).await.expect("poll"));
    }
    out
}

#[tokio::test]
async fn produce_then_consume_round_trips_in_order() {
    let mock = MockBroker::start().await;
    mock.create("t", 3);
    let producer = Producer::new(producer_config(&mock)).await.expect("producer");
    let mut futures = Vec::new();
    for i in 0..3000u32 {
        let mut r = ProducerRecord::new("t", format!("v{i}")).with_partition(i % 3);
        if i.is_multiple_of(2) {
            r = r.with_key(format!("k{i}")).with_header("h", b("x"));
        }
        futures.push(producer.send(r).await.expect("send"));
    }
    let mut next = [0u64; 3];
    for (i, f) in futures.into_iter().enumerate() {
        let md = f.await.expect("delivered");
        assert_eq!(md.partition, i as u32 % 3);
        assert_eq!(md.offset, next[md.partition as usize], "offsets are dense and in send order");
        next[md.partition as usize] += 1;
    }
    let parts: Vec<(String, u32)> = (0..3).map(|p| ("t".to_string(), p)).collect();
    let got = consume_all(&mock, &parts, 3000).await;
    assert_eq!(got.len(), 3000);
    let mut seen = [0u64; 3];
    for r in &got {
        assert_eq!(r.offset, seen[r.partition as usize]);
        seen[r.partition as usize] += 1;
        let i = r.offset as u32 * 3 + r.partition;
        assert_eq!(r.value, format!("v{i}").as_bytes());
        if i.is_multiple_of(2) {
            assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert_eq!(r.headers, vec![("h".to_string(), b("x"))]);
        } else {
            assert_eq!(r.key, None);
        }
    }
    producer.close().await.expect("close");
}

#[tokio::test]
async fn records_are_batched_and_keys_hash_stably() {
    let mock = MockBroker::start().await;
    mock.create("t", 4);
    let config = ProducerConfig { linger_ms: 50, ..producer_config(&mock) };
    let producer = Producer::new(config).await.expect("producer");
    let mut futures = Vec::new();
    for i in 0..2000u32 {
        futures.push(
            producer
                .send(ProducerRecord::new("t", b("v")).with_key(format!("key{}", i % 10)))
                .await
                .expect("send"),
        );
    }
    producer.flush().await.expect("flush");
    for (i, f) in futures.into_iter().enumerate() {
        let md = f.await.expect("delivered");
        let key = format!("key{}", i % 10);
        assert_eq!(md.partition, DefaultPartitioner::for_key(key.as_bytes(), 4));
    }
    // 2000 records in a 50 ms linger window: a handful of requests, not 2000.
    assert!(mock.with(|s| s.produce_requests) <= 8, "{} requests", mock.with(|s| s.produce_requests));
}

#[tokio::test]
async fn keyless_records_stick_to_one_partition_per_batch() {
    let mock = MockBroker::start().await;
    mock.create("t", 4);
    let producer =
        Producer::new(ProducerConfig { linger_ms: 20, ..producer_config(&mock) }).await.expect("producer");
    let mut futures = Vec::new();
    for _ in 0..100 {
        futures.push(producer.send(ProducerRecord::new("t", b("v"))).await.expect("send"));
    }
    let mut partitions = std::collections::BTreeSet::new();
    for f in futures {
        partitions.insert(f.await.expect("delivered").partition);
    }
    assert_eq!(partitions.len(), 1, "one linger window forms one batch on one partition");
}

#[tokio::test]
async fn retriable_errors_are_retried_and_others_fail() {
    let mock = MockBroker::start().await;
    mock.create("t", 1);
    let producer = Producer::new(producer_config(&mock)).await.expect("producer");
    mock.with(|s| s.fail_next_produce = vec![shardlog_schema::ErrorCode::NotLeaderOrFollower]);
    let md = producer.send_and_wait(ProducerRecord::new("t", b("a"))).await.expect("retried");
    assert_eq!(md.offset, 0);
    assert_eq!(mock.with(|s| s.produce_requests), 2);
    mock.with(|s| s.fail_next_produce = vec![shardlog_schema::ErrorCode::CorruptMessage]);
    let err = producer.send_and_wait(ProducerRecord::new("t", b("b"))).await.expect_err("not retriable");
    assert_eq!(err.code(), Some(shardlog_schema::ErrorCode::CorruptMessage));
    let err = producer.send_and_wait(ProducerRecord::new("nope", b("c"))).await.expect_err("unknown topic");
    assert!(matches!(err, ClientError::UnknownTopic(ref t) if t == "nope"), "{err}");
    let err = producer
        .send_and_wait(ProducerRecord::new("t", b("c")).with_partition(9))
        .await
        .expect_err("bad partition");
    assert!(matches!(err, ClientError::UnknownPartition { partition: 9, .. }), "{err}");
}

#[tokio::test]
async fn acks_none_gets_no_response_but_data_lands() {
    let mock = MockBroker::start().await;
    mock.create("t", 1);
    let producer =
        Producer::new(ProducerConfig { acks: Acks::None, ..producer_config(&mock) }).await.expect("producer");
    let md = producer.send_and_wait(ProducerRecord::new("t", b("a"))).await.expect("written");
    assert_eq!(md.offset, OFFSET_UNKNOWN);
    producer.flush().await.expect("flush");
    let got = consume_all(&mock, &[("t".to_string(), 0)], 1).await;
    assert_eq!(got[0].value, b("a"));
    assert_eq!(mock.with(|s| s.produce_acks.clone()), vec![0]);
}

#[tokio::test]
async fn send_blocks_when_the_buffer_is_full() {
    let mock = MockBroker::start().await;
    mock.create("t", 1);
    mock.with(|s| s.stall_produce = true);
    let config =
        ProducerConfig { buffer_bytes_max: 64 << 10, batch_bytes: 16 << 10, ..producer_config(&mock) };
    let producer = Producer::new(config).await.expect("producer");
    let value = bytes::Bytes::from(vec![7u8; 1000]);
    let mut sent = 0usize;
    loop {
        let send = producer.send(ProducerRecord::new("t", value.clone()));
        match tokio::time::timeout(Duration::from_millis(300), send).await {
            Ok(r) => {
                drop(r.expect("send"));
                sent += 1;
            }
            Err(_) => break,
        }
        assert!(sent < 1000, "send never pushed back");
    }
    // Each record counts value + overhead; the buffer holds 64 KiB of them.
    assert!((55..=64).contains(&sent), "blocked after {sent} records");
    let err = producer.send(ProducerRecord::new("t", vec![0u8; 100 << 10])).await.err().expect("too large");
    assert!(matches!(err, ClientError::RecordTooLarge { .. }));
}

#[tokio::test]
async fn responses_out_of_order_reach_their_callers() {
    let mock = MockBroker::start().await;
    mock.create("t", 4);
    let producer = Producer::new(producer_config(&mock)).await.expect("producer");
    for p in 0..4u32 {
        for _ in 0..=p {
            producer.send_and_wait(ProducerRecord::new("t", b("x")).with_partition(p)).await.expect("send");
        }
    }
    mock.with(|s| s.reverse_batch = 4);
    let opts = ConnOptions {
        max_in_flight: 8,
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        limits: FrameLimits::default(),
    };
    let conn = Connection::connect(&mock.addr, opts).await.expect("connect");
    let mut waits = Vec::new();
    for p in 0..4u32 {
        let q = [OffsetQuery { topic: "t".into(), partition: p, timestamp: protocol::LIST_OFFSETS_LATEST }];
        waits.push(
            conn.submit(|c| protocol::encode_list_offsets(c, "test", &q), Vec::new(), true)
                .await
                .expect("submit"),
        );
    }
    for (p, w) in waits.into_iter().enumerate() {
        let answers =
            protocol::decode_list_offsets(&w.wait(Duration::ZERO).await.expect("response")).expect("decode");
        assert_eq!(answers[0].partition, p as u32);
        assert_eq!(answers[0].offset, p as i64 + 1);
    }
}

#[tokio::test]
async fn consumer_seeks_by_offset_timestamp_and_latest() {
    let mock = MockBroker::start().await;
    mock.create("t", 1);
    let producer =
        Producer::new(ProducerConfig { linger_ms: 20, ..producer_config(&mock) }).await.expect("producer");
    let mut fs = Vec::new();
    for i in 0..10i64 {
        fs.push(
            producer
                .send(ProducerRecord::new("t", format!("{i}")).with_timestamp(1000 + i * 10))
                .await
                .expect("send"),
        );
    }
    for f in fs {
        f.await.expect("delivered");
    }
    let mut c = Consumer::new(ConsumerConfig { client: client(&mock), ..ConsumerConfig::default() })
        .await
        .expect("c");
    // Offset 4 sits in the middle of the single batch: records below it are skipped.
    c.assign(&[("t".into(), 0)], SeekTo::Offset(4)).await.expect("assign");
    let got = c.poll(Duration::from_secs(2)).await.expect("poll");
    assert_eq!(got.first().map(|r| r.offset), Some(4));
    assert_eq!(got.len(), 6);
    assert_eq!(got[0].timestamp_ms, 1040);
    assert_eq!(c.position("t", 0), Some(10));
    c.seek("t", 0, SeekTo::Timestamp(1071)).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(8));
    c.seek("t", 0, SeekTo::Latest).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(10));
    assert!(c.poll(Duration::from_millis(100)).await.expect("poll").is_empty());
    c.seek("t", 0, SeekTo::Timestamp(999_999)).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(10), "past the last timestamp means the log end");
    // A fetch may still be outstanding from the empty poll; its answer must not count.
    c.seek("t", 0, SeekTo::Offset(2)).await.expect("seek");
    let mut got = Vec::new();
    while got.len() < 8 {
        got.extend(c.poll(Duration::from_secs(2)).await.expect("poll"));
    }
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), (2..10).collect::<Vec<_>>());
    let err = c.assign(&[("missing".into(), 0)], SeekTo::Earliest).await.expect_err("unknown");
    assert!(matches!(err, ClientError::UnknownTopic(_)), "{err}");
}

#[tokio::test]
async fn admin_creates_lists_and_describes() {
    let mock = MockBroker::start().await;
    let admin = Admin::connect(client(&mock)).await.expect("admin");
    admin.create_topic("b", 2, &[]).await.expect("create");
    admin.create_topic("a", 1, &[("retention.ms".into(), "1".into())]).await.expect("create");
    let err = admin.create_topic("a", 1, &[]).await.expect_err("exists");
    assert_eq!(err.code(), Some(shardlog_schema::ErrorCode::TopicAlreadyExists));
    assert_eq!(admin.list_topics().await.expect("list"), vec!["a".to_string(), "b".to_string()]);
    let producer = Producer::new(producer_config(&mock)).await.expect("producer");
    producer.send_and_wait(ProducerRecord::new("b", b("x")).with_partition(1)).await.expect("send");
    let d = admin.describe_topic("b").await.expect("describe");
    assert_eq!(d.partitions.len(), 2);
    assert_eq!((d.partitions[1].start_offset, d.partitions[1].end_offset), (0, 1));
    assert_eq!(d.partitions[0].end_offset, 0);
    assert_eq!(d.partitions[0].leader_port.to_string(), mock.addr.rsplit(':').next().expect("port"));
    assert!(matches!(admin.describe_topic("zz").await, Err(ClientError::UnknownTopic(_))));
    let a = admin.describe_topic("a").await.expect("describe");
    assert_eq!(a.configs, vec![("retention.ms".to_string(), "1".to_string())]);
    admin.delete_topic("a").await.expect("delete");
    assert_eq!(admin.list_topics().await.expect("list"), vec!["b".to_string()]);
    assert!(matches!(admin.delete_topic("a").await, Err(ClientError::UnknownTopic(_))));
}

#[test]
fn handles_are_thread_safe() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Producer>();
    send_sync::<Admin>();
    send::<Consumer>();
    send::<DeliveryFuture>();
    send_sync::<ClientError>();
}
