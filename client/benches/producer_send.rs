//! CPU per record of the public `Producer::send` path (issue 14, target 1),
//! against a real broker started in-process.
//!
//! The measure is the **CPU time of the bench thread**
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the producer runs on a
//! current-thread tokio runtime, so `send`, the sender task, the connection's
//! writer and reader tasks and the completion tasks all run on this one
//! thread, while the broker's shards run on threads of their own and are not
//! counted. One iteration = one 100 B record. Cases:
//! - `not_awaited`: `send` in a loop, only the last delivery awaited at the
//!   end of each sample (`produce_rate`'s pattern);
//! - `awaited`: every record's `DeliveryFuture` is awaited (in send order,
//!   with up to `WINDOW` records in flight, as an application that keeps a
//!   window of pending deliveries does).
//!
//! Keyed records use 8-byte keys over one partition's topic, so both cases
//! hit one partition and compare like with like.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlog_client::{ClientConfig, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use support::{thread_cpu_ns, ThreadCpu};

mod support;

const VALUE_BYTES: usize = 100;
/// Deliveries pending at once in the awaited case.
const WINDOW: usize = 4096;
const TOPIC: &str = "bench";

struct Setup {
    rt: tokio::runtime::Runtime,
    producer: Producer,
    _broker: shardlog_broker::BrokerHandle,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let support::Bench { rt, addr, broker, dir } = support::start(TOPIC);
    let producer = rt
        .block_on(Producer::new(ProducerConfig { client: ClientConfig::new(addr), ..Default::default() }))
        .expect("producer");
    Setup { rt, producer, _broker: broker, _dir: dir }
}

/// The topic as an application sending in a loop holds it: an `Arc<str>`
/// cloned per record (a reference count; a `&str` literal would allocate a
/// new `Arc<str>` per record: 18 ns against 10 for the clone, measured
/// alone in a loop).
fn topic() -> &'static Arc<str> {
    static TOPIC_NAME: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    TOPIC_NAME.get_or_init(|| Arc::from(TOPIC))
}

fn record(value: &bytes::Bytes, key: Option<u64>) -> ProducerRecord {
    let r = ProducerRecord::new(topic().clone(), value.clone());
    match key {
        Some(k) => r.with_key(bytes::Bytes::copy_from_slice(&k.to_le_bytes())),
        None => r,
    }
}

async fn not_awaited(producer: &Producer, value: &bytes::Bytes, keyed: bool, n: u64) {
    let mut last = None;
    for i in 0..n {
        last = Some(producer.send(record(value, keyed.then_some(i))).await.expect("send"));
    }
    producer.flush().await.expect("flush");
    last.expect("at least one").await.expect("delivered");
}

async fn awaited(producer: &Producer, value: &bytes::Bytes, keyed: bool, n: u64) {
    let mut pending: VecDeque<DeliveryFuture> = VecDeque::with_capacity(WINDOW);
    for i in 0..n {
        if pending.len() == WINDOW {
            pending.pop_front().expect("full").await.expect("delivered");
        }
        pending.push_back(producer.send(record(value, keyed.then_some(i))).await.expect("send"));
    }
    for f in pending {
        f.await.expect("delivered");
    }
}

fn producer_send(c: &mut Criterion<ThreadCpu>) {
    let s = setup();
    let value = bytes::Bytes::from(vec![b'x'; VALUE_BYTES]);
    let mut g = c.benchmark_group("producer_send_100b");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    for keyed in [false, true] {
        let kind = if keyed { "keyed" } else { "unkeyed" };
        g.bench_function(format!("not_awaited/{kind}"), |b| {
            b.iter_custom(|n| {
                let start = thread_cpu_ns();
                s.rt.block_on(not_awaited(&s.producer, &value, keyed, n));
                thread_cpu_ns() - start
            });
        });
        g.bench_function(format!("awaited/{kind}"), |b| {
            b.iter_custom(|n| {
                let start = thread_cpu_ns();
                s.rt.block_on(awaited(&s.producer, &value, keyed, n));
                thread_cpu_ns() - start
            });
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = producer_send
}
criterion_main!(benches);
