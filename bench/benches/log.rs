//! Criterion micro-benchmarks of the storage engine: sparse index lookup and
//! the append path (validate + stamp + copy + group-commit write). Each one
//! checks that the path it measures really ran.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::index::IndexBuilder;
use shardlog_broker::log::Log;
use shardlog_schema::batch::BatchBuilder;
use std::time::{Duration, Instant};

fn index_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("log/index_lookup");
    for entries in [1_000u32, 262_144] {
        let mut ix = IndexBuilder::new(4096);
        for i in 0..=entries {
            ix.on_batch(i * 4, u64::from(i) * 4096, 0, 0);
        }
        assert!(ix.entries.len() as u32 >= entries - 1, "index filled");
        let mut x = 12345u32;
        g.bench_with_input(BenchmarkId::from_parameter(entries), &entries, |b, &n| {
            b.iter(|| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let target = x % (n * 4);
                let e = ix.lookup_offset(black_box(target));
                assert!(e.rel_offset <= target);
                e
            });
        });
    }
    g.finish();
}

fn batch(bytes: usize) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(bytes + 256);
    b.push(None, &vec![7u8; bytes], &[], 1);
    b.finish()
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("log/append_flush_never");
    g.measurement_time(Duration::from_secs(5));
    for bytes in [1024usize, 64 << 10] {
        let payload = batch(bytes);
        g.throughput(Throughput::Bytes(payload.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(bytes), &payload, |b, payload| {
            b.iter_custom(|iters| {
                let payload = payload.clone();
                glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                    .spawn(move || async move {
                        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
                        let config = TopicConfig {
                            flush: FlushPolicy::Never,
                            retention_ms: None,
                            ..TopicConfig::default()
                        };
                        let log = Log::open(dir.path().join("p"), config).await.expect("open");
                        let start = Instant::now();
                        for _ in 0..iters {
                            log.append(&payload, 0).await.expect("append");
                        }
                        let elapsed = start.elapsed();
                        assert_eq!(log.end_offset().0, iters, "every append was assigned an offset");
                        log.delete().await.expect("delete");
                        elapsed
                    })
                    .expect("executor")
                    .join()
                    .expect("join")
            });
        });
    }
    g.finish();
}

criterion_group!(benches, index_lookup, append);
criterion_main!(benches);
