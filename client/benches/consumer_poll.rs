//! CPU per record delivered by the public `Consumer::poll` API (issue 14,
//! target 2: at most 0.2 CPU µs per 100 B record), against a real broker
//! started in-process.
//!
//! The measure is the CPU time of the bench thread: the consumer runs on a
//! current-thread tokio runtime, so `poll`, its fetch tasks and its
//! connection's reader and writer all run on this one thread, while the
//! broker's shards run on threads of their own and are not counted. One
//! iteration = one 100 B record handed to the application (the bench reads
//! its value's length, as an application that looks at each record would).
//!
//! The topic (one partition) is filled once with `RECORDS` records. Each
//! sample reads on from where the last one stopped and seeks back to the
//! start at the end of the log, so most reads come from the disk (page
//! cache or not), some from the hot tail; records a poll returned beyond
//! the iteration's count are credited to the next one.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlog_client::consumer::SeekTo;
use shardlog_client::{ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord};
use std::sync::Arc;
use std::time::Duration;
use support::{thread_cpu_ns, ThreadCpu};

mod support;

const VALUE_BYTES: usize = 100;
const RECORDS: u64 = 2_000_000;
const TOPIC: &str = "bench";

struct Setup {
    consumer: Consumer,
    /// Records polled but not yet counted by an iteration.
    carried: u64,
    /// Where the consumer stands in the log.
    position: u64,
    _broker: shardlog_broker::BrokerHandle,
    _dir: tempfile::TempDir,
}

fn setup() -> (tokio::runtime::Runtime, Setup) {
    let support::Bench { rt, addr, broker, dir } = support::start(TOPIC);
    let consumer = rt.block_on(async {
        let producer =
            Producer::new(ProducerConfig { client: ClientConfig::new(addr.clone()), ..Default::default() })
                .await
                .expect("producer");
        let topic: Arc<str> = Arc::from(TOPIC);
        let value = bytes::Bytes::from(vec![b'x'; VALUE_BYTES]);
        let mut last = None;
        for _ in 0..RECORDS {
            last =
                Some(producer.send(ProducerRecord::new(topic.clone(), value.clone())).await.expect("send"));
        }
        producer.flush().await.expect("flush");
        last.expect("records sent").await.expect("delivered");
        let mut consumer =
            Consumer::new(ConsumerConfig { client: ClientConfig::new(addr), ..Default::default() })
                .await
                .expect("consumer");
        consumer.assign(&[(TOPIC.to_string(), 0)], SeekTo::Earliest).await.expect("assign");
        consumer
    });
    (rt, Setup { consumer, carried: 0, position: 0, _broker: broker, _dir: dir })
}

/// Polls until `n` records were delivered (counting those carried over).
async fn consume(s: &mut Setup, n: u64) {
    let mut got = std::mem::take(&mut s.carried);
    let mut bytes = 0usize;
    while got < n {
        if s.position >= RECORDS {
            s.consumer.seek(TOPIC, 0, SeekTo::Earliest).await.expect("seek");
            s.position = 0;
        }
        let records = s.consumer.poll(Duration::from_secs(5)).await.expect("poll");
        assert!(!records.is_empty(), "records at {} of {RECORDS}", s.position);
        for r in &records {
            bytes += r.value.len();
        }
        s.position = records.last().map_or(s.position, |r| r.offset + 1);
        got += records.len() as u64;
    }
    s.carried = got - n;
    std::hint::black_box(bytes);
}

fn consumer_poll(c: &mut Criterion<ThreadCpu>) {
    let (rt, mut s) = setup();
    let mut g = c.benchmark_group("consumer_poll_100b");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("one_partition", |b| {
        b.iter_custom(|n| {
            let start = thread_cpu_ns();
            rt.block_on(consume(&mut s, n));
            thread_cpu_ns() - start
        });
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = consumer_poll
}
criterion_main!(benches);
