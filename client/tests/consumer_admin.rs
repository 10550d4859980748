//! Consumer and admin against a real in-process broker: seeks, long polling,
//! topic management, owner-shard ports.

mod common;

use common::{b, client, consumer_config, create, producer_config, TestBroker, DEADLINE};
use shardlog_client::{
    Admin, ClientError, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_seeks_by_offset_timestamp_latest_and_earliest() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    // A long linger and a flush: the ten records form one batch.
    let config = ProducerConfig { linger_ms: 60_000, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    let mut fs = Vec::new();
    for i in 0..10i64 {
        let r = ProducerRecord::new("t", format!("{i}")).with_timestamp(1000 + i * 10);
        fs.push(producer.send(r).await.expect("send"));
    }
    producer.flush().await.expect("flush");
    for f in fs {
        f.await.expect("delivered");
    }
    let mut c = Consumer::new(consumer_config(&broker)).await.expect("consumer");
    // Offset 4 sits in the middle of the batch: records below it are skipped.
    c.assign(&[("t".into(), 0)], SeekTo::Offset(4)).await.expect("assign");
    let got = c.poll(DEADLINE).await.expect("poll");
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), (4..10).collect::<Vec<_>>());
    assert_eq!((got[0].timestamp_ms, &got[0].value[..]), (1040, &b"4"[..]));
    assert_eq!(c.position("t", 0), Some(10));
    assert_eq!(c.high_watermark("t", 0), Some(10));
    c.seek("t", 0, SeekTo::Timestamp(1071)).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(8), "first record at or after the timestamp");
    c.seek("t", 0, SeekTo::Timestamp(999_999)).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(10), "past the last timestamp means the log end");
    c.seek("t", 0, SeekTo::Latest).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(10));
    assert!(c.poll(Duration::from_millis(50)).await.expect("poll").is_empty());
    // A fetch may still be outstanding from the empty poll; its answer must not count.
    c.seek("t", 0, SeekTo::Earliest).await.expect("seek");
    assert_eq!(c.position("t", 0), Some(0));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < 10 {
        assert!(tokio::time::Instant::now() < deadline, "only {} records", got.len());
        got.extend(c.poll(Duration::from_millis(500)).await.expect("poll"));
    }
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    let err = c.assign(&[("missing".into(), 0)], SeekTo::Earliest).await.expect_err("unknown topic");
    assert!(matches!(err, ClientError::UnknownTopic(_)), "{err}");
}

/// A fetch parked at the broker (long `max_wait`) returns as soon as a record
/// is produced, not when its wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_produce() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    let max_wait = Duration::from_secs(15);
    let config =
        ConsumerConfig { fetch_max_wait_ms: max_wait.as_millis() as u32, ..consumer_config(&broker) };
    let mut c = Consumer::new(config).await.expect("consumer");
    c.assign(&[("t".into(), 0)], SeekTo::Latest).await.expect("assign");
    // Sends the fetch, which the broker parks; it stays outstanding.
    assert!(c.poll(Duration::from_millis(50)).await.expect("poll").is_empty());
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    let started = tokio::time::Instant::now();
    producer.send_and_wait(ProducerRecord::new("t", b("wake"))).await.expect("send");
    let got = c.poll(max_wait * 2).await.expect("poll");
    assert_eq!(got.iter().map(|r| r.value.clone()).collect::<Vec<_>>(), vec![b("wake")]);
    assert!(started.elapsed() < max_wait, "woken by the produce after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_creates_lists_describes_and_deletes() {
    let broker = TestBroker::start().await;
    let admin = Admin::connect(client(&broker)).await.expect("admin");
    admin.create_topic("b", 2, &[]).await.expect("create");
    admin.create_topic("a", 1, &[("segment.bytes".into(), "1048576".into())]).await.expect("create");
    let err = admin.create_topic("a", 1, &[]).await.expect_err("exists");
    assert_eq!(err.code(), Some(shardlog_client::ErrorCode::TopicAlreadyExists));
    assert_eq!(admin.list_topics().await.expect("list"), vec!["a".to_string(), "b".to_string()]);
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    producer.send_and_wait(ProducerRecord::new("b", b("x")).with_partition(1)).await.expect("send");
    let d = admin.describe_topic("b").await.expect("describe");
    assert_eq!(d.partitions.len(), 2);
    assert_eq!((d.partitions[0].start_offset, d.partitions[0].end_offset), (0, 0));
    assert_eq!((d.partitions[1].start_offset, d.partitions[1].end_offset), (0, 1));
    // Every partition names its owner shard and that shard's own port.
    let ports = broker.shard_ports();
    for p in &d.partitions {
        assert_eq!(ports.get(usize::from(p.leader_shard)), Some(&p.leader_port), "{p:?}");
    }
    assert!(matches!(admin.describe_topic("zz").await, Err(ClientError::UnknownTopic(_))));
    let a = admin.describe_topic("a").await.expect("describe");
    assert!(a.configs.contains(&("segment.bytes".to_string(), "1048576".to_string())), "{:?}", a.configs);
    admin.delete_topic("a").await.expect("delete");
    assert_eq!(admin.list_topics().await.expect("list"), vec!["b".to_string()]);
    assert!(matches!(admin.delete_topic("a").await, Err(ClientError::UnknownTopic(_))));
}

/// Many small fetches (the fetch task runs ahead of `poll`) deliver every
/// record once and in order over two partitions on two shards, and a seek
/// backwards in the middle restarts reading from the new position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_ahead_delivers_everything_in_order_and_seek_restarts_it() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 2).await;
    let config = ProducerConfig { batch_bytes: 4 << 10, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    for i in 0..4000u32 {
        drop(
            producer
                .send(ProducerRecord::new("t", format!("v{i}")).with_partition(i % 2))
                .await
                .expect("send"),
        );
    }
    producer.close().await.expect("close");
    // Small answers: about one 4 KiB batch per partition per fetch.
    let config = ConsumerConfig { partition_max_bytes: 4 << 10, ..consumer_config(&broker) };
    let mut c = Consumer::new(config).await.expect("consumer");
    c.assign(&[("t".into(), 0), ("t".into(), 1)], SeekTo::Earliest).await.expect("assign");
    let mut next = [0u64; 2];
    let mut seeked = false;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while next != [2000, 2000] {
        assert!(tokio::time::Instant::now() < deadline, "stuck at {next:?}");
        for r in c.poll(Duration::from_millis(200)).await.expect("poll") {
            let p = r.partition as usize;
            assert_eq!(r.offset, next[p], "partition {p} in order, no gaps or repeats");
            assert_eq!(r.value, format!("v{}", r.offset * 2 + u64::from(r.partition)).as_bytes());
            next[p] += 1;
        }
        if !seeked && next[0] >= 1000 {
            seeked = true;
            c.seek("t", 0, SeekTo::Offset(100)).await.expect("seek");
            next[0] = 100;
        }
    }
    assert!(seeked);
    assert_eq!((c.position("t", 0), c.position("t", 1)), (Some(2000), Some(2000)));
}

/// A position past the log end gets `OffsetOutOfRange` from the broker; the
/// consumer applies its `offset_reset` policy and reports the move through
/// `take_resets`, or returns the typed error under `OffsetReset::Error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_past_the_log_end_follows_the_offset_reset_policy() {
    use shardlog_client::{ErrorCode, OffsetReset};
    let broker = TestBroker::start().await;
    create(&broker, "end", 1).await;
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    producer.send(ProducerRecord::new("end", "only")).await.expect("send").await.expect("delivered");
    let part = [("end".to_string(), 0)];
    for (policy, to) in [(OffsetReset::Earliest, 0), (OffsetReset::Latest, 1)] {
        let config = ConsumerConfig { offset_reset: policy, ..consumer_config(&broker) };
        let mut c = Consumer::new(config).await.expect("consumer");
        c.assign(&part, SeekTo::Offset(1000)).await.expect("assign");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let (mut resets, mut seen) = (Vec::new(), Vec::new());
        // Earliest reads the record (in the reset poll or a later one);
        // latest waits at the log end and reads nothing.
        while resets.is_empty() || (policy == OffsetReset::Earliest && seen.is_empty()) {
            assert!(tokio::time::Instant::now() < deadline, "{policy:?}: {resets:?} {seen:?}");
            seen.extend(
                c.poll(Duration::from_millis(200)).await.expect("poll").into_iter().map(|r| r.offset),
            );
            resets.extend(c.take_resets());
        }
        assert_eq!(resets.len(), 1, "{resets:?}");
        let r = &resets[0];
        assert_eq!(
            (r.from, r.to, r.policy, r.log_start, r.high_watermark),
            (1000, to, policy, 0, 1),
            "{r:?}"
        );
        let want: &[u64] = if policy == OffsetReset::Earliest { &[0] } else { &[] };
        assert_eq!(seen, want, "{policy:?}");
        assert_eq!(c.position("end", 0), Some(1));
        assert!(c.take_resets().is_empty(), "taken once");
    }
    let config = ConsumerConfig { offset_reset: OffsetReset::Error, ..consumer_config(&broker) };
    let mut c = Consumer::new(config).await.expect("consumer");
    c.assign(&part, SeekTo::Offset(1000)).await.expect("assign");
    let err = c.poll(DEADLINE).await.expect_err("out of range");
    assert!(
        matches!(
            &err,
            ClientError::OffsetOutOfRange { offset: 1000, log_start: 0, high_watermark: 1, partition: 0, .. }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(ErrorCode::OffsetOutOfRange));
    assert!(!err.is_retriable());
}
