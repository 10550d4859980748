//! The shard's gate on small writes (`log::gate`): logs that find it full
//! gather their appends and write them together once let through, every
//! append completes, and what each log holds is what was appended to it,
//! in order.

mod log_support;

use log_support::{make_batch, read_all, run_in_tempdir, small_config};
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{AppendInfo, IoStats, Log, LogError, LogOptions, WriteGate};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

type AppendFuture<'a> = Pin<Box<dyn Future<Output = Result<AppendInfo, LogError>> + 'a>>;

const LOGS: usize = 8;
const APPENDS: usize = 20;

/// Opens `LOGS` logs sharing one gate of `limit` places and one set of
/// counters, appends one batch to each in turn, then `APPENDS` one-record
/// batches to each, all at once, checks every log's contents; returns the
/// segment writes issued after the first appends and the times a log queued
/// at the gate.
async fn append_everywhere(dir: std::path::PathBuf, limit: usize, flush: FlushPolicy) -> (u64, u64) {
    let gate = Rc::new(WriteGate::new(limit));
    let io_stats = Rc::new(IoStats::default());
    let options = LogOptions { gate: gate.clone(), io_stats: io_stats.clone(), ..LogOptions::default() };
    let mut logs = Vec::new();
    for i in 0..LOGS {
        let log =
            Log::open_with(dir.join(format!("p-{i}")), small_config(1 << 30, 4096, flush), options.clone())
                .await
                .expect("open");
        logs.push(log);
    }
    let payloads: Vec<Vec<Vec<u8>>> = (0..LOGS)
        .map(|l| (0..=APPENDS).map(|a| make_batch(1, 1000, 1, (l * (APPENDS + 1) + a) as u64)).collect())
        .collect();
    // Each log's first write also creates its file's first extent.
    for (log, p) in logs.iter().zip(&payloads) {
        log.append(&p[0], 0).await.expect("first append");
    }
    let first_writes = io_stats.writes.get();
    // Append number `a` of every log before number `a + 1` of any.
    let mut futures: Vec<AppendFuture<'_>> = Vec::new();
    for a in 1..=APPENDS {
        for (log, p) in logs.iter().zip(&payloads) {
            futures.push(Box::pin(log.append(&p[a], 0)));
        }
    }
    let infos: Vec<AppendInfo> = shardlog_broker::join::join_all(futures)
        .await
        .into_iter()
        .map(|r| r.expect("every append completes"))
        .collect();
    for (l, log) in logs.iter().enumerate() {
        let offsets: Vec<u64> = infos.iter().skip(l).step_by(LOGS).map(|i| i.base_offset.0).collect();
        assert_eq!(offsets, (1..=APPENDS as u64).collect::<Vec<_>>(), "log {l}: offsets in call order");
        let stored = read_all(log, 0, 1 << 20).await;
        assert_eq!(stored.len(), APPENDS + 1, "log {l}: every append stored");
        for (a, (offset, bytes)) in stored.iter().enumerate() {
            let mut want = payloads[l][a].clone();
            shardlog_schema::batch::stamp(&mut want, *offset, 0);
            assert!(bytes == &want, "log {l}: batch {a} as appended");
        }
    }
    for log in &logs {
        log.close().await.expect("close");
    }
    (io_stats.writes.get() - first_writes, gate.waits())
}

/// With one place, the first log writes its first append alone; every
/// other log queues with its first append and, once let through, writes
/// all twenty in one go. A gate that is never full lets each log write its
/// first append alone and the rest after it.
#[test]
fn a_full_gate_gathers_each_logs_appends_into_one_write() {
    run_in_tempdir(|dir| async move {
        let (open_writes, open_waits) = append_everywhere(dir.join("open"), 1000, FlushPolicy::Never).await;
        assert_eq!(open_waits, 0, "a gate with room queues no log");
        assert_eq!(open_writes, 2 * LOGS as u64, "first append alone, then the rest, per log");

        let (writes, waits) = append_everywhere(dir.join("one"), 1, FlushPolicy::Never).await;
        assert!(waits >= LOGS as u64 - 1, "every log but the first queued: {waits}");
        assert!(
            writes <= LOGS as u64 + 2,
            "{writes} writes for {} appends over {LOGS} logs through a gate of one",
            LOGS * APPENDS
        );
    });
}

/// Durable appends (flush policy `always`) through a gate of two: each
/// completes after its write and fdatasync, none is lost or reordered.
#[test]
fn durable_appends_through_a_narrow_gate_all_complete_in_order() {
    run_in_tempdir(|dir| async move {
        let (writes, waits) = append_everywhere(dir, 2, FlushPolicy::Always).await;
        assert!(waits > 0, "the gate was full at times");
        assert!(writes < (LOGS * APPENDS) as u64, "{writes} writes: appends were gathered");
    });
}
