//! Appends enter the log in the order `Log::append` is called, whatever
//! each of them waits for (back-pressure, a segment roll), and an append
//! whose future is dropped while it waits does not block the ones after it.

mod log_support;

use futures_lite::future::poll_once;
use log_support::{make_batch, read_all, run_in_tempdir, small_config};
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{AppendInfo, Log, LogError};
use std::future::Future;
use std::pin::Pin;

type AppendFuture<'a> = Pin<Box<dyn Future<Output = Result<AppendInfo, LogError>> + 'a>>;

/// Polls every future until all are done; the appends' outcomes in order.
async fn join_in_order(futures: Vec<AppendFuture<'_>>) -> Vec<AppendInfo> {
    shardlog_broker::join::join_all(futures).await.into_iter().map(|r| r.expect("append")).collect()
}

/// An append of `batches` batches of `records` records of `value_bytes`,
/// values tagged from `tag`.
fn payload(batches: u64, records: usize, value_bytes: usize, tag: u64) -> Vec<u8> {
    (0..batches).flat_map(|b| make_batch(records, value_bytes, 1, tag * 100 + b)).collect()
}

fn assert_call_order(infos: &[AppendInfo]) {
    for (i, w) in infos.windows(2).enumerate() {
        assert!(
            w[0].last_offset < w[1].base_offset,
            "append {} got offsets {}..={} but append {} (called later) got {}..={}",
            i,
            w[0].base_offset.0,
            w[0].last_offset.0,
            i + 1,
            w[1].base_offset.0,
            w[1].last_offset.0
        );
    }
}

/// Pipelined appends of mixed sizes: the second large append must wait for
/// the unwritten bytes to drain (back-pressure), and the small appends
/// called after it must not overtake it (they did: 20 MiB + 100 B still fit).
#[test]
fn back_pressure_keeps_call_order() {
    run_in_tempdir(|dir| async move {
        let log =
            Log::open(dir, small_config(1 << 30, 4096, FlushPolicy::Interval { ms: 1000, bytes: 1 << 40 }))
                .await
                .expect("open");
        // 20 MiB appends (two 10 MiB batches), each followed by small ones.
        let mut payloads = Vec::new();
        for i in 0..4u64 {
            payloads.push(payload(2, 10, 1 << 20, i * 10));
            for j in 1..4u64 {
                payloads.push(payload(1, 1, 100, i * 10 + j));
            }
        }
        let futures: Vec<AppendFuture<'_>> =
            payloads.iter().map(|p| Box::pin(log.append(p, 0)) as _).collect();
        let infos = join_in_order(futures).await;
        assert_call_order(&infos);
        let stored = read_all(&log, 0, 8 << 20).await;
        let expected: usize = infos.len() + 4; // the large appends hold two batches
        assert_eq!(stored.len(), expected);
        log.close().await.expect("close");
    });
}

/// Appends that arrive while a segment rolls wait behind the one that
/// started the roll, and enqueue in call order after it.
#[test]
fn segment_rolls_keep_call_order() {
    run_in_tempdir(|dir| async move {
        let log = Log::open(dir, small_config(1 << 20, 4096, FlushPolicy::Always)).await.expect("open");
        let mut payloads = Vec::new();
        for i in 0..40u64 {
            // 300 KB then three small appends: a roll about every fourth large one.
            payloads.push(payload(1, 3, 100_000, i * 10));
            for j in 1..4u64 {
                payloads.push(payload(1, 2, 40 + j as usize, i * 10 + j));
            }
        }
        let futures: Vec<AppendFuture<'_>> =
            payloads.iter().map(|p| Box::pin(log.append(p, 0)) as _).collect();
        let infos = join_in_order(futures).await;
        assert_call_order(&infos);
        assert!(log.segment_count() > 5, "the appends rolled segments ({})", log.segment_count());
        let stored = read_all(&log, 0, 1 << 20).await;
        assert_eq!(stored.len(), infos.len());
        log.close().await.expect("close");
    });
}

/// An append dropped while it waits for its turn (its connection went away)
/// lets the appends called after it through.
#[test]
fn a_dropped_waiting_append_does_not_block_later_ones() {
    run_in_tempdir(|dir| async move {
        let log =
            Log::open(dir, small_config(1 << 30, 4096, FlushPolicy::Interval { ms: 1000, bytes: 1 << 40 }))
                .await
                .expect("open");
        let big = payload(2, 10, 1 << 20, 1);
        let big2 = payload(2, 10, 1 << 20, 2);
        let small = payload(1, 1, 100, 3);
        let mut first = Box::pin(log.append(&big, 0));
        let mut waiting = Box::pin(log.append(&big2, 0));
        let mut after = Box::pin(log.append(&small, 0));
        assert!(poll_once(first.as_mut()).await.is_none(), "the first append waits for its write");
        assert!(poll_once(waiting.as_mut()).await.is_none(), "the second waits for back-pressure");
        assert!(poll_once(after.as_mut()).await.is_none(), "the third waits for its turn");
        drop(waiting);
        let a = first.await.expect("first");
        let c = after.await.expect("third");
        assert!(a.last_offset < c.base_offset);
        log.close().await.expect("close");
    });
}
