//! Per-shard counters and the Prometheus `/metrics` endpoint.
//!
//! Each shard counts into its own `Cell`s (no atomics, no sharing). A scrape
//! arrives at the admin listener on shard 0, which asks every shard for a
//! snapshot over the mesh and renders Prometheus text format. The data path
//! only ever does `cell.set(cell.get() + n)` on its own shard.

mod histogram;
mod http;
pub mod probe;
mod render;

pub use histogram::{
    stage_bound_ns, HistogramSnapshot, LatencyHistogram, StageHistogram, StageSnapshot, LATENCY_BUCKETS_US,
    STAGE_BUCKETS,
};
pub use http::{admin_loop, Health};
pub use render::render;

use crate::shard::ShardContext;
use std::cell::Cell;

/// How fetched bytes left the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServePath {
    Splice,
    HotTail,
    Plain,
}

/// The APIs with a latency histogram, and their `api` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiClass {
    Produce,
    /// Includes the long-poll wait.
    Fetch,
    /// ApiVersions, Metadata, ListOffsets.
    Metadata,
    /// CreateTopics, DeleteTopics.
    Admin,
    /// FindCoordinator and the consumer-group APIs (JoinGroup and SyncGroup
    /// include their wait for the rebalance).
    Group,
}

impl ApiClass {
    pub const ALL: [ApiClass; 5] =
        [ApiClass::Produce, ApiClass::Fetch, ApiClass::Metadata, ApiClass::Admin, ApiClass::Group];

    fn label(self) -> &'static str {
        match self {
            ApiClass::Produce => "produce",
            ApiClass::Fetch => "fetch",
            ApiClass::Metadata => "metadata",
            ApiClass::Admin => "admin",
            ApiClass::Group => "group",
        }
    }
}

/// The steps of the data path a record's latency is broken down into, in
/// the order a record passes them (`/metrics`:
/// `shardlog_stage_duration_seconds{stage}`; `shardlog-bench` reports them).
/// All but `FetchWake` count each record once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// From the owner shard's start on a produce (after the request was read
    /// and routed) to the append taking its place in the log: validation,
    /// CRC, the admission order, a roll or back-pressure.
    ProduceIn,
    /// From the append's place in the log to the issue of the O_DIRECT write
    /// that completes it: the wait for the write in flight (group commit).
    WriteQueue,
    /// The O_DIRECT write that completes the append, issue to completion.
    Write,
    /// From that completion to the produce's answer on the owner shard:
    /// waking the append's task and, with `acks=all`, the followers'
    /// fetches (with `flush=always`, also the fdatasync).
    ProduceOut,
    /// From the completion of the write that brought new data to a fetch
    /// that was waiting for it having its answer (counted per such fetch).
    FetchWake,
}

impl Stage {
    pub const ALL: [Stage; 5] =
        [Stage::ProduceIn, Stage::WriteQueue, Stage::Write, Stage::ProduceOut, Stage::FetchWake];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Stage::ProduceIn => "produce_in",
            Stage::WriteQueue => "write_queue",
            Stage::Write => "write",
            Stage::ProduceOut => "produce_out",
            Stage::FetchWake => "fetch_wake",
        }
    }
}

/// One shard's stage histograms, by [`Stage::ALL`].
#[derive(Debug, Default)]
pub struct Stages([StageHistogram; 5]);

impl Stages {
    pub fn record(&self, stage: Stage, elapsed: std::time::Duration, records: u64) {
        self.0[stage as usize].record_n(elapsed, records);
    }

    #[must_use]
    pub fn snapshot(&self) -> Vec<StageSnapshot> {
        self.0.iter().map(StageHistogram::snapshot).collect()
    }
}

/// One shard's counters.
#[derive(Debug, Default)]
pub struct ShardMetrics {
    /// Request latency by [`ApiClass`] (index = position in `ApiClass::ALL`).
    pub request_latency: [LatencyHistogram; 5],
    pub produce_requests: Cell<u64>,
    pub produce_bytes: Cell<u64>,
    pub produce_errors: Cell<u64>,
    pub fetch_requests: Cell<u64>,
    pub fetch_bytes_splice: Cell<u64>,
    pub fetch_bytes_hot_tail: Cell<u64>,
    pub fetch_bytes_plain: Cell<u64>,
    pub forwarded_requests: Cell<u64>,
    pub rejected_frames: Cell<u64>,
    /// Connections closed by a deadline (idle, slow request, unread responses).
    pub connections_timed_out: Cell<u64>,
    /// ISR changes applied to partitions this shard leads.
    pub isr_shrinks: Cell<u64>,
    pub isr_expands: Cell<u64>,
    /// How late the shard's probe timer fires (`probe`): the time a task
    /// that became ready waits for the reactor.
    pub scheduling_delay: LatencyHistogram,
    /// Probe wake-ups at least [`probe::STALL`] late.
    pub stalls: Cell<u64>,
}

fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

impl ShardMetrics {
    pub fn count_produce(&self, bytes: usize, ok: bool) {
        add(&self.produce_requests, 1);
        add(&self.produce_bytes, bytes as u64);
        if !ok {
            add(&self.produce_errors, 1);
        }
    }

    pub fn count_fetch_bytes(&self, path: ServePath, bytes: usize) {
        let c = match path {
            ServePath::Splice => &self.fetch_bytes_splice,
            ServePath::HotTail => &self.fetch_bytes_hot_tail,
            ServePath::Plain => &self.fetch_bytes_plain,
        };
        add(c, bytes as u64);
    }

    /// A leader's ISR went from `before` to `after` members.
    pub fn count_isr_change(&self, before: usize, after: usize) {
        match after.cmp(&before) {
            std::cmp::Ordering::Less => add(&self.isr_shrinks, 1),
            std::cmp::Ordering::Greater => add(&self.isr_expands, 1),
            std::cmp::Ordering::Equal => {}
        }
    }

    pub fn inc(c: &Cell<u64>) {
        add(c, 1);
    }

    pub fn record_latency(&self, api: ApiClass, elapsed: std::time::Duration) {
        let i = ApiClass::ALL.iter().position(|a| *a == api).expect("every class is listed");
        self.request_latency[i].record(elapsed);
    }

    /// A plain-data copy, sendable to another shard.
    #[must_use]
    pub fn snapshot(&self, ctx: &ShardContext) -> MetricsSnapshot {
        MetricsSnapshot {
            request_latency: self.request_latency.iter().map(LatencyHistogram::snapshot).collect(),
            produce_requests: self.produce_requests.get(),
            produce_bytes: self.produce_bytes.get(),
            produce_errors: self.produce_errors.get(),
            fetch_requests: self.fetch_requests.get(),
            fetch_bytes_splice: self.fetch_bytes_splice.get(),
            fetch_bytes_hot_tail: self.fetch_bytes_hot_tail.get(),
            fetch_bytes_plain: self.fetch_bytes_plain.get(),
            forwarded_requests: self.forwarded_requests.get(),
            rejected_frames: self.rejected_frames.get(),
            connections_timed_out: self.connections_timed_out.get(),
            connections: ctx.connections.get() as u64,
            partitions: ctx.owned_partitions().len() as u64,
            log_open_files: ctx.log_files().open_files() as u64,
            log_open_files_max: ctx.log_files().files_max() as u64,
            log_file_evictions: ctx.log_files().evictions(),
            isr_shrinks: self.isr_shrinks.get(),
            isr_expands: self.isr_expands.get(),
            hot_tail_hits: ctx.log_io_stats().hot_tail_hits.get(),
            hot_tail_misses: ctx.log_io_stats().hot_tail_misses.get(),
            hot_tail_bytes: ctx.hot_tail().used_bytes(),
            hot_tail_bytes_max: ctx.hot_tail().bytes_max(),
            hot_tail_evicted_bytes: ctx.hot_tail().evicted_bytes(),
            fdatasync: ctx.log_io_stats().fdatasync.snapshot(),
            stages: ctx.log_io_stats().stages.snapshot(),
            log_writes: ctx.log_io_stats().writes.get(),
            log_write_bytes: ctx.log_io_stats().write_bytes.get(),
            log_write_gate_waits: ctx.log_write_gate().waits(),
            scheduling_delay: self.scheduling_delay.snapshot(),
            stalls: self.stalls.get(),
            logs: {
                // The first `metrics_partitions_max` in name order, the
                // internal topics (`__consumer_offsets`) after the others.
                let mut v: Vec<LogSample> = ctx
                    .owned_partitions()
                    .iter()
                    .map(|p| LogSample {
                        topic: p.topic.to_string(),
                        partition: p.id,
                        start_offset: p.log.start_offset().0,
                        end_offset: p.log.end_offset().0,
                        size_bytes: p.log.size_bytes(),
                        segments: p.log.segment_count() as u64,
                    })
                    .collect();
                v.sort_by(|a, b| {
                    (a.topic.starts_with("__"), &a.topic, a.partition).cmp(&(
                        b.topic.starts_with("__"),
                        &b.topic,
                        b.partition,
                    ))
                });
                let shown = ctx.config.metrics_partitions_max;
                let omitted = v.len().saturating_sub(shown) as u64;
                v.truncate(shown);
                (v, omitted)
            },
            high_watermarks: {
                // Followers' are the leader's, shown by the leader.
                let mut hw: Vec<(String, u32, u64)> = ctx
                    .owned_partitions()
                    .iter()
                    .filter(|p| p.replica.leads())
                    .map(|p| (p.topic.to_string(), p.id, p.high_watermark()))
                    .collect();
                hw.sort();
                hw
            },
            leaders: {
                let mut v: Vec<LeaderSample> = ctx
                    .owned_partitions()
                    .iter()
                    .filter_map(|p| {
                        let status = p.replica.leader_status(p.log.end_offset().0)?;
                        Some(LeaderSample { topic: p.topic.to_string(), partition: p.id, status })
                    })
                    .collect();
                v.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                v
            },
            group_offsets: ctx.groups.committed_offsets(),
        }
    }
}

/// One partition log's figures, as `/metrics` shows them.
#[derive(Debug, Clone)]
pub struct LogSample {
    pub topic: String,
    pub partition: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub size_bytes: u64,
    pub segments: u64,
}

/// A partition led here, as `/metrics` shows it.
#[derive(Debug, Clone)]
pub struct LeaderSample {
    pub topic: String,
    pub partition: u32,
    pub status: crate::replica::LeaderStatus,
}

#[derive(Debug, Clone, Default)]
pub struct MetricsSnapshot {
    /// By `ApiClass::ALL` (boxed in a `Vec`: it is most of the snapshot's
    /// size, and snapshots travel in mesh messages).
    pub request_latency: Vec<HistogramSnapshot>,
    pub produce_requests: u64,
    pub produce_bytes: u64,
    pub produce_errors: u64,
    pub fetch_requests: u64,
    pub fetch_bytes_splice: u64,
    pub fetch_bytes_hot_tail: u64,
    pub fetch_bytes_plain: u64,
    pub forwarded_requests: u64,
    pub rejected_frames: u64,
    pub connections_timed_out: u64,
    pub connections: u64,
    pub partitions: u64,
    pub log_open_files: u64,
    pub log_open_files_max: u64,
    pub log_file_evictions: u64,
    pub isr_shrinks: u64,
    pub isr_expands: u64,
    pub hot_tail_hits: u64,
    pub hot_tail_misses: u64,
    pub hot_tail_bytes: u64,
    pub hot_tail_bytes_max: u64,
    pub hot_tail_evicted_bytes: u64,
    pub fdatasync: HistogramSnapshot,
    /// By `Stage::ALL` (empty in snapshots built without a shard).
    pub stages: Vec<StageSnapshot>,
    pub log_writes: u64,
    pub log_write_bytes: u64,
    pub log_write_gate_waits: u64,
    pub scheduling_delay: HistogramSnapshot,
    pub stalls: u64,
    /// The shard's partition logs in name order, at most
    /// `metrics_partitions_max`, and how many more it owns.
    pub logs: (Vec<LogSample>, u64),
    /// (topic, partition, high watermark) of every partition this shard
    /// serves consumers from (alone or leading).
    pub high_watermarks: Vec<(String, u32, u64)>,
    /// Every partition this shard leads in a cluster.
    pub leaders: Vec<LeaderSample>,
    /// Committed offsets of the groups this shard coordinates.
    pub group_offsets: Vec<crate::group::api::GroupLag>,
}
