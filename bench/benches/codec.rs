//! Micro-benchmarks of the wire codec: frame encode / verify+decode, record
//! batch build / validate+parse, CRC32C. Each checks the result of the path it
//! measures, so a benchmark of a no-op cannot pass for a fast codec.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardlog_client::protocol::{encode_produce, ProduceEntry};
use shardlog_schema::batch::{self, BatchBuilder, BatchIter};
use shardlog_schema::frame::{self, FrameLimits, LENGTH_PREFIX_BYTES};
use std::hint::black_box;

const BATCH_BYTES_MAX: usize = 16 << 20;

fn produce_frame(partitions: u32) -> Vec<u8> {
    let topics: Vec<String> = (0..partitions).map(|p| format!("topic-{}", p % 4)).collect();
    let entries: Vec<ProduceEntry<'_>> = topics
        .iter()
        .enumerate()
        .map(|(i, t)| ProduceEntry { topic: t, partition: i as u32, batch_bytes: 16_384 })
        .collect();
    encode_produce(7, "bench", 1, 30_000, &entries)
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    for partitions in [1u32, 16, 256] {
        g.bench_with_input(BenchmarkId::new("encode_produce", partitions), &partitions, |b, &n| {
            b.iter(|| {
                let f = produce_frame(black_box(n));
                assert!(f.len() > LENGTH_PREFIX_BYTES + 16 * n as usize, "frame holds every partition");
                f
            });
        });
        let encoded = produce_frame(partitions);
        let limits = FrameLimits::default();
        g.bench_with_input(BenchmarkId::new("verify_decode_produce", partitions), &encoded, |b, f| {
            b.iter(|| {
                let len = frame::decode_prefix(f[..LENGTH_PREFIX_BYTES].try_into().unwrap()) as usize;
                let env = limits
                    .verify_request(black_box(&f[LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + len]))
                    .unwrap();
                let body = env.body_as_produce_request().expect("produce body");
                let parts = body.partitions().expect("partitions");
                let total: u64 = parts.iter().map(|p| u64::from(p.batch_bytes())).sum();
                assert_eq!(total, 16_384 * u64::from(partitions), "decoded every partition");
                assert_eq!(u64::from(env.payload_bytes()), total);
            });
        });
    }
    g.finish();
}

fn build(records: usize, value: &[u8]) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(records * (value.len() + 32));
    for i in 0..records {
        b.push(None, value, &[], 1_700_000_000_000 + i as i64);
    }
    b.finish()
}

fn batches(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch");
    for (records, size) in [(1_000usize, 100usize), (256, 1_024)] {
        let value = vec![0xabu8; size];
        let id = format!("{records}x{size}B");
        g.throughput(Throughput::Elements(records as u64));
        g.bench_function(BenchmarkId::new("build", &id), |b| {
            b.iter(|| {
                let out = build(records, black_box(&value));
                let h = batch::BatchHeader::parse(&out).unwrap();
                assert_eq!(h.record_count as usize, records);
                out
            });
        });
        let built = build(records, &value);
        g.bench_function(BenchmarkId::new("validate_parse", &id), |b| {
            b.iter(|| {
                let h = batch::validate_with_records(black_box(&built), BATCH_BYTES_MAX).unwrap();
                let recs = batch::records(&built).unwrap();
                assert_eq!(recs.len(), h.record_count as usize);
                assert_eq!(recs[records - 1].value.len(), size);
            });
        });
        // Ten batches back to back: the framing walk a fetch reader does.
        let records_per_batch = records;
        let mut ten = Vec::new();
        for _ in 0..10 {
            ten.extend_from_slice(&built);
        }
        g.throughput(Throughput::Bytes(ten.len() as u64));
        g.bench_function(BenchmarkId::new("iter_validate_10", &id), |b| {
            b.iter(|| {
                let mut records = 0u32;
                for r in BatchIter::new(black_box(&ten), BATCH_BYTES_MAX) {
                    records += r.unwrap().0.record_count;
                }
                assert_eq!(records as usize, 10 * records_per_batch);
            });
        });
    }
    g.finish();
}

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for size in [1_024usize, 65_536, 1 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
        let expected = crc32c::crc32c(&data);
        // A one-bit change must change the checksum: the path really reads the data.
        let mut flipped = data.clone();
        flipped[size / 2] ^= 1;
        assert_ne!(crc32c::crc32c(&flipped), expected);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, d| {
            b.iter(|| assert_eq!(crc32c::crc32c(black_box(d)), expected));
        });
    }
    let built = build(256, &[7u8; 1_024]);
    let h = batch::BatchHeader::parse(&built).unwrap();
    g.throughput(Throughput::Bytes(built.len() as u64));
    g.bench_function("batch_compute_crc", |b| {
        b.iter(|| assert_eq!(batch::compute_crc(black_box(&built)), h.crc));
    });
    g.finish();
}

criterion_group!(benches, frames, batches, crc);
criterion_main!(benches);
