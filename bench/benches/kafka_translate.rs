//! Cost of the Kafka listener's record translation (`kafka::records`):
//! Kafka v2 batches to Shardlog batches on produce, and back on fetch, per
//! record and per byte, for small and 1 KB records, beside a copy of the
//! same bytes (`memcpy_reference`, the limit to state them against). Each
//! iteration checks what it produced, so a no-op cannot pass for a fast path.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use shardlog_broker::kafka::records::{kafka_to_native, native_to_kafka};
use std::hint::black_box;

const RECORDS: usize = 1000;
const LIMIT: usize = 64 << 20;

fn kafka_batch(value_bytes: usize) -> Bytes {
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(format!("key-{}", i % 64))),
            value: Some(Bytes::from(vec![b'x'; value_bytes])),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        &records,
        &RecordEncodeOptions { version: 2, compression: Compression::None },
    )
    .expect("encode");
    out.freeze()
}

fn translate(c: &mut Criterion) {
    let mut g = c.benchmark_group("kafka_translate");
    for value_bytes in [100usize, 1024] {
        let kafka = kafka_batch(value_bytes);
        let mut native = Vec::new();
        kafka_to_native(kafka.clone(), &mut native, LIMIT).expect("translate");
        g.throughput(Throughput::Elements(RECORDS as u64));
        g.bench_with_input(
            BenchmarkId::new("produce_kafka_to_native_records", value_bytes),
            &kafka,
            |b, k| {
                b.iter(|| {
                    let mut out = Vec::with_capacity(k.len() + 128);
                    assert_eq!(kafka_to_native(black_box(k.clone()), &mut out, LIMIT).unwrap(), RECORDS);
                    out
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fetch_native_to_kafka_records", value_bytes),
            &native,
            |b, n| {
                b.iter(|| {
                    let mut out = BytesMut::with_capacity(n.len() + n.len() / 8);
                    native_to_kafka(black_box(n), LIMIT, &mut out).unwrap();
                    assert!(out.len() > RECORDS * value_bytes);
                    out
                });
            },
        );
        g.bench_with_input(BenchmarkId::new("memcpy_reference", value_bytes), &native, |b, n| {
            b.iter(|| {
                let mut out = Vec::with_capacity(n.len());
                out.extend_from_slice(black_box(n));
                assert_eq!(out.len(), n.len());
                out
            });
        });
    }
    g.finish();
}

criterion_group!(benches, translate);
criterion_main!(benches);
