//! Produce requests pipelined on one connection reach each partition's log
//! in the order they were sent, whatever their sizes: with writes slowed by
//! an injected delay, large requests make the log apply back-pressure (more
//! than 32 MiB not yet written) while the small ones behind them would
//! still fit. Over the owner's port, over the
//! public port (parts owned by the other shard cross the mesh), and with
//! several partitions in one request.

mod wire_support;

use shardlog_broker::fault::{self, Fault, FaultPoint};
use shardlog_broker::BrokerHandle;
use shardlog_schema::batch::BatchBuilder;
use shardlog_schema::types::shard_for;
use shardlog_schema::wire::ErrorCode;
use shardlog_schema::PartitionId;
use std::collections::HashMap;
use std::time::Duration;
use wire_support::{broker, values, Conn};

const TOPIC: &str = "ordered";
const PARTITIONS: u32 = 3;

/// Sequence numbers of records produced so far, per partition.
#[derive(Default)]
struct Sequencer {
    next: HashMap<u32, u64>,
}

impl Sequencer {
    /// A batch for `partition` of `records` records of `value_bytes`, each
    /// value starting with its sequence number in the partition.
    fn batch(&mut self, partition: u32, records: usize, value_bytes: usize) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(records * (value_bytes + 32) + 128);
        for _ in 0..records {
            let seq = self.next.entry(partition).or_default();
            let mut v = vec![b'.'; value_bytes.max(12)];
            v[..12].copy_from_slice(format!("{:012}", *seq).as_bytes());
            *seq += 1;
            b.push(None, &v, &[], 1_700_000_000_000);
        }
        b.finish()
    }
}

/// Runs of six requests for one partition: three of 15 MiB (45 MiB, more
/// than the log lets wait unwritten), then three small ones.
fn size_of_request(i: usize) -> (usize, usize) {
    if i % 6 < 3 {
        (15, 1 << 20)
    } else {
        (20, 50)
    }
}

/// Reads `partition` from offset 0 and checks that the sequence numbers
/// are 0, 1, 2, ... in offset order.
fn check_order(conn: &mut Conn, partition: u32, expected: u64) {
    let mut at = 0i64;
    let mut want = 0u64;
    while want < expected {
        let (err, data, _) = conn.fetch(TOPIC, partition, at, 1000);
        assert_eq!(err, ErrorCode::None);
        let records = values(&data);
        assert!(!records.is_empty(), "partition {partition} ends early at {at} (want {expected} records)");
        let from = at;
        for (offset, value) in records.into_iter().filter(|(o, _)| *o as i64 >= from) {
            let seq: u64 = std::str::from_utf8(&value[..12]).expect("ascii").parse().expect("sequence");
            assert_eq!(seq, want, "partition {partition} offset {offset}: record {seq} where {want} belongs");
            want += 1;
            at = offset as i64 + 1;
        }
    }
}

/// Pipelines `requests` produce requests of mixed sizes on one connection
/// (`parts_per_request` partitions in every other one), then checks every
/// partition.
fn pipelined_mixed_sizes(port_of: impl Fn(&BrokerHandle) -> u16, parts_per_request: u32) {
    let dir = tempfile::tempdir().expect("tempdir");
    // Slow writes (each O_DIRECT write of at most 1 MiB waits 15 ms), so the
    // large requests pile up unwritten and the log applies back-pressure.
    let slow = dir.path().to_string_lossy().to_string();
    fault::arm(FaultPoint::AppendWrite, &slow, Fault::Delay(Duration::from_millis(15)));
    let handle = broker(dir.path(), 2);
    let mut conn = Conn::open(port_of(&handle));
    assert_eq!(conn.create_topic(TOPIC, PARTITIONS), ErrorCode::None);
    let mut seq = Sequencer::default();
    let requests = 18;
    // Writes from a thread of their own: the broker answers while we send.
    let mut writer = conn.try_clone();
    let sent: Vec<Vec<(u32, Vec<u8>)>> = (0..requests)
        .map(|i| {
            let (records, value_bytes) = size_of_request(i);
            let first = (i / 6) as u32 % PARTITIONS;
            // Multi-partition requests alternate with single-partition ones.
            let parts = if i % 2 == 0 { parts_per_request } else { 1 };
            (0..parts)
                .map(|k| {
                    let partition = (first + k) % PARTITIONS;
                    (partition, seq.batch(partition, records, value_bytes))
                })
                .collect()
        })
        .collect();
    let sender = std::thread::spawn(move || {
        for parts in &sent {
            let parts: Vec<(&str, u32, &[u8])> = parts.iter().map(|(p, b)| (TOPIC, *p, &b[..])).collect();
            writer.send_produce(&parts);
        }
    });
    for _ in 0..requests {
        for (_, partition, error, _) in conn.recv_produce() {
            assert_eq!(error, ErrorCode::None, "partition {partition}");
        }
    }
    sender.join().expect("sender");
    for p in 0..PARTITIONS {
        check_order(&mut conn, p, seq.next.get(&p).copied().unwrap_or(0));
    }
    fault::disarm(&slow);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn pipelined_produces_keep_order_on_the_owner_port() {
    // Every partition on one connection: the owner of partition 0 serves
    // its own partitions and forwards the rest.
    let owner = shard_for(TOPIC, PartitionId(0), 2).0 as usize;
    pipelined_mixed_sizes(|b| b.ready.shard_ports[owner], 1);
}

/// Small requests that arrive in one segment, a multi-partition request
/// followed by a single-partition one for the same partition, many times.
/// (The old code ran a multi-partition request's parts as spawned tasks;
/// this test did not catch that, because the connection reader yields
/// between requests and those tasks ran first; the fix no longer depends
/// on that scheduling detail: `dispatch::spawn_in_order`.)
#[test]
fn small_requests_read_together_keep_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 1);
    let mut conn = Conn::open(handle.ready.listen.port());
    assert_eq!(conn.create_topic(TOPIC, PARTITIONS), ErrorCode::None);
    let mut seq = Sequencer::default();
    let rounds = 200;
    for _ in 0..5 {
        conn.cork();
        for _ in 0..rounds / 5 {
            let (a0, a1, b0) = (seq.batch(0, 2, 20), seq.batch(1, 2, 20), seq.batch(0, 2, 20));
            conn.send_produce(&[(TOPIC, 0, &a0[..]), (TOPIC, 1, &a1[..])]);
            conn.send_produce(&[(TOPIC, 0, &b0[..])]);
        }
        conn.uncork();
        for _ in 0..2 * rounds / 5 {
            for (_, partition, error, _) in conn.recv_produce() {
                assert_eq!(error, ErrorCode::None, "partition {partition}");
            }
        }
    }
    for p in 0..2 {
        check_order(&mut conn, p, seq.next[&p]);
    }
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn pipelined_multi_partition_produces_keep_order() {
    pipelined_mixed_sizes(|b| b.ready.listen.port(), 2);
}
