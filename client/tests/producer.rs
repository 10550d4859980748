//! Producer against a real in-process broker: delivery, offsets, batching,
//! partitioning, errors, acks=0, back-pressure and retries across a restart.

mod common;

use common::{b, client, consume, create, producer_config, TestBroker, DEADLINE};
use shardlog_broker::fault::{self, Fault, FaultPoint};
use shardlog_client::{
    Acks, Admin, ClientError, DefaultPartitioner, Producer, ProducerConfig, ProducerRecord, OFFSET_UNKNOWN,
};
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_then_consume_round_trips_in_order() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 3).await;
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
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
        assert_eq!((&*md.topic, md.partition), ("t", i as u32 % 3));
        assert_eq!(md.offset, next[md.partition as usize], "offsets are dense and in send order");
        next[md.partition as usize] += 1;
    }
    producer.close().await.expect("close");
    let parts: Vec<(String, u32)> = (0..3).map(|p| ("t".to_string(), p)).collect();
    let got = consume(&broker, &parts, 3000).await;
    assert_eq!(got.len(), 3000);
    let mut seen = [0u64; 3];
    for r in &got {
        assert_eq!(r.offset, seen[r.partition as usize], "consumed in offset order");
        seen[r.partition as usize] += 1;
        let i = r.offset as u32 * 3 + r.partition;
        assert_eq!(r.value, format!("v{i}").as_bytes());
        if i.is_multiple_of(2) {
            assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert_eq!(r.headers, vec![("h".to_string(), b("x"))]);
        } else {
            assert_eq!((r.key.as_deref(), r.headers.len()), (None, 0));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_batched_and_keys_hash_stably() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 4).await;
    let before = broker.metric("shardlog_produce_requests_total").await;
    let config = ProducerConfig { linger_ms: 200, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    let mut futures = Vec::new();
    for i in 0..2000u32 {
        let r = ProducerRecord::new("t", b("v")).with_key(format!("key{}", i % 10));
        futures.push(producer.send(r).await.expect("send"));
    }
    producer.flush().await.expect("flush");
    let mut next = [0u64; 4];
    for (i, f) in futures.into_iter().enumerate() {
        let md = f.await.expect("delivered");
        let key = format!("key{}", i % 10);
        assert_eq!(md.partition, DefaultPartitioner::for_key(key.as_bytes(), 4));
        assert_eq!(md.offset, next[md.partition as usize]);
        next[md.partition as usize] += 1;
    }
    // 2000 records flushed together: a handful of produce requests, not 2000
    // (one per owner shard per flush or linger window).
    let requests = broker.metric("shardlog_produce_requests_total").await - before;
    assert!((1..=8).contains(&requests), "{requests} produce requests for 2000 records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_records_stick_to_one_partition_per_batch() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 4).await;
    // A long linger: the 100 records are sealed by the flush, as one batch.
    let config = ProducerConfig { linger_ms: 60_000, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    let mut futures = Vec::new();
    for _ in 0..100 {
        futures.push(producer.send(ProducerRecord::new("t", b("v"))).await.expect("send"));
    }
    producer.flush().await.expect("flush");
    let mut partitions = BTreeSet::new();
    for f in futures {
        partitions.insert(f.await.expect("delivered").partition);
    }
    assert_eq!(partitions.len(), 1, "one batch on one partition");
    // The next batch goes elsewhere: stickiness moves on when a batch is sealed.
    let next = producer.send(ProducerRecord::new("t", b("w"))).await.expect("send");
    producer.flush().await.expect("flush");
    let next = next.await.expect("delivered");
    assert!(!partitions.contains(&next.partition), "sticky partition moved on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topic_and_partition_fail_at_once() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    let err = producer.send_and_wait(ProducerRecord::new("nope", b("c"))).await.expect_err("unknown topic");
    assert!(matches!(err, ClientError::UnknownTopic(ref t) if t == "nope"), "{err}");
    let err = producer
        .send_and_wait(ProducerRecord::new("t", b("c")).with_partition(9))
        .await
        .expect_err("bad partition");
    assert!(matches!(err, ClientError::UnknownPartition { partition: 9, .. }), "{err}");
    let md = producer.send_and_wait(ProducerRecord::new("t", b("ok"))).await.expect("still works");
    assert_eq!(md.offset, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_none_gets_no_offset_but_data_lands() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    let config = ProducerConfig { acks: Acks::None, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    for i in 0..10 {
        let md = producer.send_and_wait(ProducerRecord::new("t", format!("a{i}"))).await.expect("written");
        assert_eq!(md.offset, OFFSET_UNKNOWN);
    }
    producer.close().await.expect("close");
    let got = consume(&broker, &[("t".to_string(), 0)], 10).await;
    let values: Vec<_> = got.iter().map(|r| r.value.clone()).collect();
    assert_eq!(values, (0..10).map(|i| bytes::Bytes::from(format!("a{i}"))).collect::<Vec<_>>());
}

/// Polls a future once (outside tokio's co-operative budget, so `Pending`
/// really means "waiting").
fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// The broker goes away: records stay buffered while the producer retries,
/// `send` blocks once `buffer_bytes_max` is reached, and everything is
/// delivered (offsets continuing the log) once the broker is back on its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_blocks_while_the_broker_is_down_and_retries_deliver_after_restart() {
    let mut broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    // `BrokerHandle::shutdown` leaves accepted sockets open (a stopped
    // in-process broker never answers nor closes them), so requests on the
    // old connections end by timeout, which makes the client reconnect.
    let mut client = client(&broker);
    client.request_timeout_ms = 500;
    let config = ProducerConfig {
        client,
        buffer_bytes_max: 64 << 10,
        batch_bytes: 16 << 10,
        retries: 100_000,
        ..producer_config(&broker)
    };
    let producer = Producer::new(config).await.expect("producer");
    let first = producer.send_and_wait(ProducerRecord::new("t", b("before"))).await.expect("send");
    assert_eq!(first.offset, 0);
    broker.stop().await;

    let value = bytes::Bytes::from(vec![7u8; 1000]);
    let record = ProducerRecord::new("t", value.clone());
    let fit = (64 << 10) / record.size_estimate();
    let mut futures = Vec::new();
    for _ in 0..fit {
        let mut send = pin!(tokio::task::unconstrained(producer.send(record.clone())));
        match poll_once(send.as_mut()) {
            Poll::Ready(f) => futures.push(f.expect("send")),
            Poll::Pending => panic!("blocked after {} records, below the buffer limit", futures.len()),
        }
    }
    let mut blocked = pin!(tokio::task::unconstrained(producer.send(record.clone())));
    assert!(poll_once(blocked.as_mut()).is_pending(), "send must wait once the buffer is full");
    let err = producer.send(ProducerRecord::new("t", vec![0u8; 100 << 10])).await.err().expect("too large");
    assert!(matches!(err, ClientError::RecordTooLarge { .. }), "{err}");

    broker.restart().await;
    let last = tokio::time::timeout(DEADLINE, blocked).await.expect("unblocked").expect("send");
    futures.push(last);
    let mut offsets = BTreeSet::new();
    for f in futures {
        let md = tokio::time::timeout(DEADLINE, f).await.expect("in time").expect("delivered after restart");
        offsets.insert(md.offset);
    }
    // Retried batches may land in any order, but every record lands once.
    assert_eq!(offsets, (1..=fit as u64 + 1).collect::<BTreeSet<_>>());
    producer.flush().await.expect("flush");
    let got = consume(&broker, &[("t".to_string(), 0)], fit + 2).await;
    assert_eq!(got[0].value, b("before"));
    assert!(got[1..].iter().all(|r| r.value == value));
}

/// A topic deleted and created again under a running producer: its records
/// go into the new, empty log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_writes_into_a_recreated_topic() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    let producer = Producer::new(producer_config(&broker)).await.expect("producer");
    for i in 0..3 {
        producer.send_and_wait(ProducerRecord::new("t", format!("old{i}"))).await.expect("send");
    }
    let admin = Admin::connect(client(&broker)).await.expect("admin");
    admin.delete_topic("t").await.expect("delete");
    admin.create_topic("t", 2, &[]).await.expect("recreate");
    let md =
        producer.send_and_wait(ProducerRecord::new("t", b("new")).with_partition(0)).await.expect("send");
    assert_eq!(md.offset, 0, "the new topic starts empty");
    let got = consume(&broker, &[("t".to_string(), 0)], 1).await;
    assert_eq!(got.iter().map(|r| r.value.clone()).collect::<Vec<_>>(), vec![b("new")]);
}

/// `flush` returns only once every record sent before it is acknowledged,
/// and with `linger_ms = 0` records sent while requests are in flight share
/// batches (far fewer produce requests than records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_every_record_and_linger_zero_still_batches() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 2).await;
    let before = broker.metric("shardlog_produce_requests_total").await;
    let config = ProducerConfig { linger_ms: 0, max_in_flight: 1, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    let mut futures = Vec::new();
    for i in 0..5000u32 {
        let r = ProducerRecord::new("t", format!("v{i}")).with_partition(i % 2);
        futures.push(producer.send(r).await.expect("send"));
    }
    producer.flush().await.expect("flush");
    let mut pending = futures.iter_mut().map(|f| poll_once(std::pin::Pin::new(f)));
    assert!(pending.all(|p| p.is_ready()), "flush returned before every record was acknowledged");
    let mut next = [0u64; 2];
    for (i, f) in futures.into_iter().enumerate() {
        let md = f.await.expect("delivered");
        assert_eq!(md.partition, i as u32 % 2);
        assert_eq!(md.offset, next[md.partition as usize], "offsets dense and in send order");
        next[md.partition as usize] += 1;
    }
    let requests = broker.metric("shardlog_produce_requests_total").await - before;
    assert!(requests < 1000, "{requests} produce requests for 5000 records with linger_ms = 0");
    producer.close().await.expect("close");
    assert!(matches!(producer_send_after_close(&broker).await, ClientError::Closed));
}

/// Sending through a closed producer fails with `Closed`.
async fn producer_send_after_close(broker: &TestBroker) -> ClientError {
    let producer = Producer::new(producer_config(broker)).await.expect("producer");
    let other = producer.clone();
    producer.close().await.expect("close");
    other.send(ProducerRecord::new("t", b("late"))).await.err().expect("closed")
}

/// Dropping every handle without `close` still delivers what was buffered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_producer_sends_what_is_buffered() {
    let broker = TestBroker::start().await;
    create(&broker, "t", 1).await;
    let config = ProducerConfig { linger_ms: 60_000, ..producer_config(&broker) };
    let producer = Producer::new(config).await.expect("producer");
    let mut futures = Vec::new();
    for i in 0..10 {
        futures.push(producer.send(ProducerRecord::new("t", format!("d{i}"))).await.expect("send"));
    }
    drop(producer);
    for (i, f) in futures.into_iter().enumerate() {
        let md = tokio::time::timeout(DEADLINE, f).await.expect("in time").expect("delivered");
        assert_eq!(md.offset, i as u64);
    }
}

/// With `enable_idempotence`, batches retried across a broker restart land
/// in send order, each once: the broker refuses a batch that does not
/// follow its partition's last one (the producer retries it after the one
/// before) and answers a batch it already stored with its first offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retries_across_a_restart_keep_send_order_and_store_each_record_once() {
    let mut broker = TestBroker::start().await;
    create(&broker, "t", 2).await;
    let mut client = client(&broker);
    client.request_timeout_ms = 500;
    let config = ProducerConfig {
        client,
        batch_bytes: 4 << 10,
        max_in_flight: 4,
        retries: 100_000,
        enable_idempotence: true,
        ..producer_config(&broker)
    };
    let producer = Producer::new(config).await.expect("producer");
    let record = |i: usize| {
        ProducerRecord::new("t", format!("{i:05}{}", "x".repeat(500))).with_partition((i % 2) as u32)
    };
    let mut futures = Vec::new();
    for i in 0..200 {
        futures.push(producer.send(record(i)).await.expect("send"));
    }
    broker.stop().await;
    for i in 200..400 {
        futures.push(producer.send(record(i)).await.expect("send"));
    }
    broker.restart().await;
    for f in futures {
        tokio::time::timeout(DEADLINE, f).await.expect("in time").expect("delivered");
    }
    for p in 0..2u32 {
        let got = consume(&broker, &[("t".to_string(), p)], 200).await;
        let sent: Vec<String> = (0..400).filter(|i| i % 2 == p as usize).map(|i| format!("{i:05}")).collect();
        let seen: Vec<String> =
            got.iter().map(|r| String::from_utf8_lossy(&r.value[..5]).into_owned()).collect();
        assert_eq!(seen, sent, "partition {p}: every record once, in send order");
        assert_eq!(got.last().map(|r| r.offset), Some(199), "partition {p}: nothing stored twice");
    }
}

/// With idempotence, batches the broker stored but whose answers timed out
/// (its writes slowed past the request timeout) are retried while later
/// batches land, and every retry is answered as the duplicate it is, with
/// the offsets it was first given: no batch goes more than the broker's
/// memory of a producer's batches per partition (8) past its partition's
/// oldest unfinished one. Before, requests carried any number of batches
/// of a partition, and the retries of the first ones were refused as out
/// of order until their delivery timeout, although they were stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retries_of_stored_batches_whose_answers_timed_out_are_answered_as_duplicates() {
    let broker = TestBroker::start().await;
    create(&broker, "slow", 1).await;
    let filter = broker.dir.path().join("slow-0").to_string_lossy().into_owned();
    let mut client = client(&broker);
    client.request_timeout_ms = 300;
    let config = ProducerConfig {
        client,
        batch_bytes: 1 << 10,
        linger_ms: 0,
        max_in_flight: 8,
        retries: 100_000,
        enable_idempotence: true,
        ..producer_config(&broker)
    };
    let producer = Producer::new(config).await.expect("producer");
    // Every write of the partition's log waits 600 ms: requests are stored
    // at once and answered after their 300 ms timeout.
    fault::arm(FaultPoint::AppendWrite, &filter, Fault::Delay(std::time::Duration::from_millis(600)));
    let value = |i: usize| format!("{i:05}{}", "x".repeat(500));
    let mut futures = Vec::new();
    for i in 0..300 {
        futures.push(producer.send(ProducerRecord::new("slow", value(i))).await.expect("send"));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    fault::disarm(&filter);
    for (i, f) in futures.into_iter().enumerate() {
        let md = tokio::time::timeout(DEADLINE, f).await.expect("in time").expect("delivered");
        assert_eq!(md.offset, i as u64, "record {i}: stored once, in send order, at the offset it was given");
    }
    let got = consume(&broker, &[("slow".to_string(), 0)], 300).await;
    let seen: Vec<String> = got.iter().map(|r| String::from_utf8_lossy(&r.value).into_owned()).collect();
    assert_eq!(seen, (0..300).map(value).collect::<Vec<_>>(), "every record once, in send order");
}
