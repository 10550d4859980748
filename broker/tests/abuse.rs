//! Abuse limits against a real broker (in-process, real sockets): idle
//! connection floods, slow senders, clients that never read, produce floods,
//! huge fetches and topic-creation storms. In each case other clients keep
//! being served and the process's RSS stays under a stated bound; the
//! figures are printed (`--nocapture`) for docs/reliability.md.

mod wire_support;

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::{start, BrokerHandle};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use wire_support::{batch_of, Conn};

fn broker(dir: &std::path::Path, tune: impl FnOnce(&mut BrokerConfig)) -> BrokerHandle {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 2;
    config.pin_cores = false;
    tune(&mut config);
    start(config).expect("broker starts")
}

/// This process's resident set in MiB (broker and test share it).
/// The tests that measure the process's RSS run one at a time: the test
/// harness runs tests on threads of one process, so a flood in one test
/// showed up as growth in another (a full run failed so).
static RSS_MEASURED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rss_measured() -> std::sync::MutexGuard<'static, ()> {
    RSS_MEASURED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb / 1024
}

/// A produce and a fetch on a fresh connection work: the broker still serves.
fn still_serves(port: u16, topic: &str) {
    let mut c = Conn::open(port);
    let (e, base) = c.produce(topic, 0, &batch_of(&["alive"]));
    assert_eq!(e, ErrorCode::None);
    let (e, bytes, _) = c.fetch(topic, 0, base, 0);
    assert_eq!(e, ErrorCode::None);
    assert!(!bytes.is_empty());
}

/// Reads until the peer closes; `Err` if it is still open after `limit`.
fn wait_closed(s: &mut TcpStream, limit: Duration) -> Result<usize, String> {
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let started = Instant::now();
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(total),
            Err(_) if started.elapsed() > limit => return Err(format!("still open after {limit:?}")),
            Err(_) => {}
        }
    }
}

#[test]
fn five_thousand_idle_connections_cost_little_and_others_are_served() {
    let _one_at_a_time = rss_measured();
    const IDLE: usize = 5_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), |_| {});
    let port = handle.ready.listen.port();
    assert_eq!(Conn::open(port).create_topic("t", 1), ErrorCode::None);
    still_serves(port, "t");
    let before = rss_mib();
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        idle.push(s);
    }
    // Let the broker accept them all.
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    still_serves(port, "t");
    let served_in = started.elapsed();
    let after = rss_mib();
    println!("idle connections: {IDLE}, RSS {before} -> {after} MiB, a produce+fetch took {served_in:?}");
    assert!(after.saturating_sub(before) < 150, "{IDLE} idle connections grew RSS by {} MiB", after - before);
    drop(idle);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn slow_senders_and_idle_connections_are_closed_at_their_deadlines() {
    let _one_at_a_time = rss_measured();
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), |c| {
        c.limits.request_read_timeout = Duration::from_millis(700);
        c.limits.connection_idle_max = Duration::from_millis(1500);
    });
    let port = handle.ready.listen.port();
    assert_eq!(Conn::open(port).create_topic("t", 1), ErrorCode::None);

    // 500 slow senders at once, each partway through a request that
    // announces 4 MiB: the envelope buffer grows only as bytes arrive, so
    // they cost little; all are closed by the read timeout.
    let before = rss_mib();
    let mut crowd: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.write_all(&(4u32 << 20).to_le_bytes()).expect("prefix");
            s.write_all(&[0u8; 100]).expect("some of the envelope");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let crowd_rss = rss_mib().saturating_sub(before);
    still_serves(port, "t");
    for s in &mut crowd {
        wait_closed(s, Duration::from_secs(5)).expect("every slow sender is disconnected");
    }
    println!("500 slow senders: RSS +{crowd_rss} MiB while they trickled");
    assert!(crowd_rss < 64, "500 slow senders cost {crowd_rss} MiB (bound 64 MiB)");

    // One byte every 200 ms of a frame announcing 4 MiB: closed once the read timeout passes.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let started = Instant::now();
    let prefix = (4u32 << 20).to_le_bytes();
    let mut closed = false;
    for (i, byte) in prefix.into_iter().chain(std::iter::repeat(0)).take(40).enumerate() {
        if slow.write_all(&[byte]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        if i == 6 {
            still_serves(port, "t");
        }
    }
    if !closed {
        wait_closed(&mut slow, Duration::from_secs(3)).expect("the slow sender is disconnected");
    }
    let slow_closed = started.elapsed();
    assert!(slow_closed < Duration::from_secs(4), "slow sender lived {slow_closed:?}");

    // A connection that sends nothing: closed after the idle limit, not before.
    let mut quiet = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let started = Instant::now();
    wait_closed(&mut quiet, Duration::from_secs(5)).expect("the idle connection is closed");
    let idle_closed = started.elapsed();
    assert!(
        idle_closed >= Duration::from_millis(1400),
        "closed after {idle_closed:?}, before the idle limit"
    );

    // A connection that keeps sending requests is never idle.
    let mut busy = Conn::open(port);
    for _ in 0..6 {
        assert_eq!(busy.produce("t", 0, &batch_of(&["x"])).0, ErrorCode::None);
        std::thread::sleep(Duration::from_millis(400));
    }
    println!("slow sender closed after {slow_closed:?}; idle connection after {idle_closed:?}");
    handle.shutdown().expect("clean shutdown");
}

/// Sends a fetch of `partitions` partitions of `topic` from offset 0 asking
/// for `max_bytes` (and as much per partition), without reading the answer.
fn send_fetch(c: &mut Conn, topic: &str, partitions: u32, max_bytes: u32) {
    c.send(
        ApiKey::Fetch,
        |fbb| {
            let ps: Vec<_> = (0..partitions)
                .map(|p| {
                    let t = fbb.create_string(topic);
                    wire::FetchPartition::create(
                        fbb,
                        &wire::FetchPartitionArgs {
                            topic: Some(t),
                            partition: p,
                            fetch_offset: 0,
                            partition_max_bytes: max_bytes,
                            current_leader_epoch: -1,
                            replica_log_end: -1,
                        },
                    )
                })
                .collect();
            let ps = fbb.create_vector(&ps);
            let args = wire::FetchRequestArgs {
                replica_id: -1,
                max_wait_ms: 0,
                min_bytes: 1,
                max_bytes,
                partitions: Some(ps),
            };
            let b = wire::FetchRequest::create(fbb, &args);
            (wire::RequestBody::FetchRequest, b.as_union_value())
        },
        &[],
    );
}

/// Fills `partitions` partitions with about `mib` MiB each.
fn fill(port: u16, topic: &str, partitions: u32, mib: usize) {
    let mut c = Conn::open(port);
    let value = "v".repeat(1000);
    let batch = batch_of(&vec![value.as_str(); 1000]);
    for p in 0..partitions {
        for _ in 0..mib {
            assert_eq!(c.produce(topic, p, &batch).0, ErrorCode::None);
        }
    }
}

#[test]
fn huge_fetches_are_capped_and_a_client_that_never_reads_is_dropped() {
    let _one_at_a_time = rss_measured();
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), |c| {
        c.limits.fetch_bytes_max = 4 << 20;
        c.limits.response_write_timeout = Duration::from_millis(800);
    });
    let port = handle.ready.listen.port();
    assert_eq!(Conn::open(port).create_topic("big", 4), ErrorCode::None);
    fill(port, "big", 4, 6);

    // max_bytes = u32::MAX over every partition: one answer of at most fetch_bytes_max.
    let mut c = Conn::open(port);
    send_fetch(&mut c, "big", 4, u32::MAX);
    let r = c.recv();
    let parts = r.frame().body_as_fetch_response().expect("fetch").partitions().expect("parts");
    let total: u64 = parts.iter().map(|p| u64::from(p.bytes())).sum();
    assert!(total <= 4 << 20, "a fetch answered {total} bytes, over fetch_bytes_max");
    assert!(total > 0);

    // A client that pipelines fetches and never reads: dropped once its
    // writes stall, while others are served.
    let before = rss_mib();
    let mut sink = Conn::open(port);
    for _ in 0..200 {
        send_fetch(&mut sink, "big", 4, u32::MAX);
    }
    std::thread::sleep(Duration::from_millis(300));
    still_serves(port, "big");
    std::thread::sleep(Duration::from_secs(2));
    let peak = rss_mib();
    let read =
        wait_closed(&mut sink.stream, Duration::from_secs(10)).expect("the non-reading client is dropped");
    println!(
        "non-reading client: dropped after {} KiB of 200 x 4 MiB answers; RSS {before} -> {peak} MiB",
        read >> 10
    );
    assert!(read < 200 * (4 << 20), "every answer was delivered: nothing was dropped");
    // The connection's fetch budget (128 MiB by default) bounds what it holds.
    assert!(peak.saturating_sub(before) < 200, "RSS grew {} MiB", peak - before);
    still_serves(port, "big");
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn a_produce_flood_past_the_buffer_budget_is_held_back_not_buffered() {
    let _one_at_a_time = rss_measured();
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), |c| {
        c.limits.shard_buffered_bytes_max = 16 << 20;
        c.limits.request_payload_bytes_max = 4 << 20;
    });
    let port = handle.ready.listen.port();
    assert_eq!(Conn::open(port).create_topic("flood", 2), ErrorCode::None);
    let before = rss_mib();
    let value = "f".repeat(1000);
    let batch = batch_of(&vec![value.as_str(); 1000]);
    // 8 connections x 40 pipelined 1 MB requests: 320 MB offered at once against a 16 MiB budget per shard.
    let senders: Vec<_> = (0..8u32)
        .map(|i| {
            let batch = batch.clone();
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let mut reader = c.try_clone();
                let n = 40;
                let acks = std::thread::spawn(move || {
                    (0..n).filter(|_| reader.recv_produce()[0].2 == ErrorCode::None).count()
                });
                for _ in 0..n {
                    c.send_produce(&[("flood", i % 2, &batch)]);
                }
                acks.join().expect("reader")
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    still_serves(port, "flood");
    let acked: usize = senders.into_iter().map(|t| t.join().expect("sender")).sum();
    let after = rss_mib();
    println!("produce flood: {acked} of 320 requests acknowledged; RSS {before} -> {after} MiB");
    assert_eq!(acked, 320, "back-pressure, not errors");
    // Data lands on disk through O_DIRECT; what stays is the hot tail
    // (128 MiB per shard at most) and write chunks.
    assert!(after.saturating_sub(before) < 400, "RSS grew {} MiB", after - before);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn a_topic_creation_storm_is_served_in_turn_within_the_partition_limit() {
    let _one_at_a_time = rss_measured();
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), |c| c.limits.partitions_max = 16 + 300);
    let port = handle.ready.listen.port();
    assert_eq!(Conn::open(port).create_topic("t", 1), ErrorCode::None);
    let before = rss_mib();
    let started = Instant::now();
    let storms: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                (0..60).map(|j| c.create_topic(&format!("storm-{i}-{j}"), 1)).collect::<Vec<_>>()
            })
        })
        .collect();
    still_serves(port, "t");
    let results: Vec<ErrorCode> = storms.into_iter().flat_map(|t| t.join().expect("storm")).collect();
    let created = results.iter().filter(|e| **e == ErrorCode::None).count();
    let refused = results
        .iter()
        .filter(|e| **e == ErrorCode::InvalidPartitions || **e == ErrorCode::ResourceLimit)
        .count();
    let grown = rss_mib().saturating_sub(before);
    println!(
        "topic storm: {} requests in {:?}: {created} created, {refused} refused by partitions_max; RSS +{grown} MiB",
        results.len(),
        started.elapsed()
    );
    // Empty partitions hold no write buffers or hot tail yet: an open log
    // is its metadata, one file and small indexes.
    assert!(grown < 128, "299 new partitions cost {grown} MiB (bound 128 MiB)");
    assert_eq!(created, 299, "the limit counts the offsets topic and `t`");
    assert_eq!(created + refused, results.len(), "every refusal is the typed limit error: {results:?}");
    still_serves(port, "t");
    handle.shutdown().expect("clean shutdown");
}
