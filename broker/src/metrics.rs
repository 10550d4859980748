//! Per-shard counters and the Prometheus `/metrics` endpoint.
//!
//! Each shard counts into its own `Cell`s (no atomics, no sharing). A scrape
//! arrives at the admin listener on shard 0, which asks every shard for a
//! snapshot over the mesh and renders Prometheus text format. The data path
//! only ever does `cell.set(cell.get() + n)` on its own shard.

use crate::net::{accept_next, AcceptFailures};
use crate::shard::{ShardContext, ShardOp, ShardReply};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpListener;
use shardlog_schema::ShardId;
use std::cell::Cell;
use std::fmt::Write as _;
use std::rc::Rc;

/// How fetched bytes left the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServePath {
    Splice,
    HotTail,
    Plain,
}

/// Upper bounds (µs) of the request latency buckets; one more bucket, +Inf,
/// follows the last.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];
const BUCKETS: usize = LATENCY_BUCKETS_US.len() + 1;

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

/// A shard's request latency histogram for one API: fixed buckets in
/// `Cell`s (recording is a search over 16 bounds and two adds).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [Cell<u64>; BUCKETS],
    sum_us: Cell<u64>,
}

impl LatencyHistogram {
    pub fn record(&self, elapsed: std::time::Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        add(&self.buckets[LATENCY_BUCKETS_US.partition_point(|b| *b < us)], 1);
        self.sum_us.set(self.sum_us.get().saturating_add(us));
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].get()),
            sum_us: self.sum_us.get(),
        }
    }
}

/// A copy of a [`LatencyHistogram`]: per-bucket (not cumulative) counts.
#[derive(Debug, Clone, Default)]
pub struct HistogramSnapshot {
    pub buckets: [u64; BUCKETS],
    pub sum_us: u64,
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
    /// (topic, partition, high watermark) of every partition this shard
    /// serves consumers from (alone or leading).
    pub high_watermarks: Vec<(String, u32, u64)>,
    /// Every partition this shard leads in a cluster.
    pub leaders: Vec<LeaderSample>,
    /// Committed offsets of the groups this shard coordinates.
    pub group_offsets: Vec<crate::group::api::GroupLag>,
}

/// Renders snapshots (index = shard) in Prometheus text format.
#[must_use]
pub fn render(shards: &[MetricsSnapshot]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&MetricsSnapshot) -> u64| {
        let _ = writeln!(out, "# HELP shardlog_{name} {help}\n# TYPE shardlog_{name} {kind}");
        for (shard, s) in shards.iter().enumerate() {
            let _ = writeln!(out, "shardlog_{name}{{shard=\"{shard}\"}} {}", value(s));
        }
    };
    family("produce_requests_total", "counter", "Produce requests handled.", &|s| s.produce_requests);
    family("produce_bytes_total", "counter", "Record batch bytes produced.", &|s| s.produce_bytes);
    family("produce_errors_total", "counter", "Produce partition results with an error.", &|s| {
        s.produce_errors
    });
    family("fetch_requests_total", "counter", "Fetch requests handled.", &|s| s.fetch_requests);
    family("forwarded_requests_total", "counter", "Partition operations forwarded to another shard.", &|s| {
        s.forwarded_requests
    });
    family("rejected_frames_total", "counter", "Frames rejected (size, verification).", &|s| {
        s.rejected_frames
    });
    family(
        "connections_timed_out_total",
        "counter",
        "Connections closed by a deadline (idle, slow request, unread responses).",
        &|s| s.connections_timed_out,
    );
    family("isr_shrinks_total", "counter", "Followers that left the ISR of a partition led here.", &|s| {
        s.isr_shrinks
    });
    family(
        "isr_expands_total",
        "counter",
        "Followers that rejoined the ISR of a partition led here.",
        &|s| s.isr_expands,
    );
    family(
        "under_replicated_partitions",
        "gauge",
        "Partitions led here whose ISR is smaller than their replica set.",
        &|s| s.leaders.iter().filter(|l| l.status.isr < l.status.replicas).count() as u64,
    );
    family("connections", "gauge", "Open client connections.", &|s| s.connections);
    family("partitions", "gauge", "Partitions owned.", &|s| s.partitions);
    family("log_open_files", "gauge", "Partition log files open (counted in the file budget).", &|s| {
        s.log_open_files
    });
    family("log_open_files_max", "gauge", "The shard's open-file budget for partition logs.", &|s| {
        s.log_open_files_max
    });
    family("log_file_evictions_total", "counter", "Log files closed to stay within the budget.", &|s| {
        s.log_file_evictions
    });
    render_latency(&mut out, shards);
    render_partitions(&mut out, shards);
    let _ = writeln!(
        out,
        "# HELP shardlog_fetch_bytes_total Record bytes served to fetches, by path.\n# TYPE shardlog_fetch_bytes_total counter"
    );
    for (shard, s) in shards.iter().enumerate() {
        for (path, v) in [
            ("splice", s.fetch_bytes_splice),
            ("hot_tail", s.fetch_bytes_hot_tail),
            ("plain", s.fetch_bytes_plain),
        ] {
            let _ = writeln!(out, "shardlog_fetch_bytes_total{{shard=\"{shard}\",path=\"{path}\"}} {v}");
        }
    }
    out
}

/// Label values are quoted Prometheus strings.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Per partition: the high watermark; per group and partition: the
/// committed offset and the lag behind the high watermark, joined here from
/// the coordinators' offsets and the owners' log ends.
fn render_partitions(out: &mut String, shards: &[MetricsSnapshot]) {
    let _ = writeln!(
        out,
        "# HELP shardlog_partition_high_watermark The offset after the last record consumers can read.\n# TYPE shardlog_partition_high_watermark gauge"
    );
    let mut ends = std::collections::HashMap::new();
    for s in shards {
        for (topic, partition, hw) in &s.high_watermarks {
            let _ = writeln!(
                out,
                "shardlog_partition_high_watermark{{topic=\"{}\",partition=\"{partition}\"}} {hw}",
                label(topic)
            );
            ends.insert((topic.as_str(), *partition), *hw);
        }
    }
    render_replication(out, shards);
    // Each family's samples together, as the text format wants.
    let mut lags = String::new();
    let _ = writeln!(
        out,
        "# HELP shardlog_group_committed_offset The group's committed offset.\n# TYPE shardlog_group_committed_offset gauge"
    );
    for s in shards {
        for g in &s.group_offsets {
            let labels = format!(
                "group=\"{}\",topic=\"{}\",partition=\"{}\"",
                label(&g.group_id),
                label(&g.topic),
                g.partition
            );
            let _ = writeln!(out, "shardlog_group_committed_offset{{{labels}}} {}", g.committed);
            if let Some(hw) = ends.get(&(g.topic.as_str(), g.partition)) {
                let lag = (*hw as i64).saturating_sub(g.committed).max(0);
                let _ = writeln!(lags, "shardlog_group_lag{{{labels}}} {lag}");
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP shardlog_group_lag Records between the group's committed offset and the high watermark.\n# TYPE shardlog_group_lag gauge"
    );
    out.push_str(&lags);
}

/// Per partition led here: its ISR size and each follower's lag.
fn render_replication(out: &mut String, shards: &[MetricsSnapshot]) {
    let _ = writeln!(
        out,
        "# HELP shardlog_partition_in_sync_replicas In-sync replicas (leader included) of a partition led here.\n# TYPE shardlog_partition_in_sync_replicas gauge"
    );
    for l in shards.iter().flat_map(|s| &s.leaders) {
        let _ = writeln!(
            out,
            "shardlog_partition_in_sync_replicas{{topic=\"{}\",partition=\"{}\"}} {}",
            label(&l.topic),
            l.partition,
            l.status.isr
        );
    }
    let _ = writeln!(
        out,
        "# HELP shardlog_follower_lag_records Records a follower is behind this leader's log end.\n# TYPE shardlog_follower_lag_records gauge"
    );
    for l in shards.iter().flat_map(|s| &s.leaders) {
        for (replica, lag) in &l.status.lags {
            let _ = writeln!(
                out,
                "shardlog_follower_lag_records{{topic=\"{}\",partition=\"{}\",replica=\"{replica}\"}} {lag}",
                label(&l.topic),
                l.partition
            );
        }
    }
}

/// `shardlog_request_duration_seconds`, a Prometheus histogram per shard and API.
fn render_latency(out: &mut String, shards: &[MetricsSnapshot]) {
    let _ = writeln!(
        out,
        "# HELP shardlog_request_duration_seconds Time from a request's arrival to its response, by API (fetch includes the long-poll wait).\n# TYPE shardlog_request_duration_seconds histogram"
    );
    for (shard, s) in shards.iter().enumerate() {
        for (api, h) in ApiClass::ALL.iter().zip(&s.request_latency) {
            let api = api.label();
            let mut cumulative = 0u64;
            for (i, n) in h.buckets.iter().enumerate() {
                cumulative += n;
                let le =
                    LATENCY_BUCKETS_US.get(i).map_or("+Inf".to_string(), |us| (*us as f64 / 1e6).to_string());
                let _ = writeln!(
                    out,
                    "shardlog_request_duration_seconds_bucket{{shard=\"{shard}\",api=\"{api}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let sum = h.sum_us as f64 / 1e6;
            let _ = writeln!(
                out,
                "shardlog_request_duration_seconds_sum{{shard=\"{shard}\",api=\"{api}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "shardlog_request_duration_seconds_count{{shard=\"{shard}\",api=\"{api}\"}} {cumulative}"
            );
        }
    }
}

/// Largest HTTP request head the admin listener reads.
const HTTP_HEAD_BYTES_MAX: usize = 8 << 10;

/// Whether every shard serves, for `/readyz`. Shared by the shard threads
/// (each counts itself in once it accepts, out when it stops) and read only
/// by the admin listener: never touched on the data path.
#[derive(Clone)]
pub struct Health {
    serving: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    shards: usize,
}

impl Health {
    #[must_use]
    pub fn new(shards: usize) -> Health {
        Health { serving: std::sync::Arc::default(), shards }
    }

    /// This shard has recovered its logs and accepts connections.
    pub fn shard_serving(&self) {
        self.serving.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// This shard is shutting down.
    pub fn shard_stopping(&self) {
        self.serving.fetch_sub(1, std::sync::atomic::Ordering::Release);
    }

    /// `Ok` when every shard serves, else how many do.
    pub fn ready(&self) -> Result<(), String> {
        let serving = self.serving.load(std::sync::atomic::Ordering::Acquire);
        if serving == self.shards {
            Ok(())
        } else {
            Err(format!("{serving} of {} shards serving (recovering logs, or stopping)", self.shards))
        }
    }
}

/// The admin port's answer to one request line: (status, body).
async fn route(ctx: &Rc<ShardContext>, health: &Health, line: &[u8]) -> (&'static str, String) {
    let path =
        line.strip_prefix(b"GET ").and_then(|rest| rest.split(|b| *b == b' ').next()).unwrap_or_default();
    let path = path.split(|b| *b == b'?').next().unwrap_or_default();
    match path {
        b"/metrics" => ("200 OK", render(&collect(ctx).await)),
        // The process is alive and its admin listener answers.
        b"/healthz" => ("200 OK", "ok\n".to_string()),
        b"/readyz" => match health.ready() {
            Ok(()) => ("200 OK", "ready\n".to_string()),
            Err(why) => ("503 Service Unavailable", format!("not ready: {why}\n")),
        },
        _ => ("404 Not Found", "try GET /metrics, /healthz or /readyz\n".to_string()),
    }
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` (runs on shard 0, from
/// before its logs are recovered). A failing accept backs off as the data
/// listeners' do (`net::accept_next`).
pub async fn admin_loop(ctx: Rc<ShardContext>, listener: TcpListener, health: Health) {
    let mut failures = AcceptFailures::default();
    loop {
        let Some(mut stream) = accept_next(&ctx, &listener, "admin", &mut failures).await else {
            return;
        };
        let (ctx, health) = (ctx.clone(), health.clone());
        glommio::spawn_local(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HTTP_HEAD_BYTES_MAX {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
            let (status, body) = route(&ctx, &health, line).await;
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _gone = stream.write_all(resp.as_bytes()).await;
            let _gone = stream.close().await;
        })
        .detach();
    }
}

async fn collect(ctx: &Rc<ShardContext>) -> Vec<MetricsSnapshot> {
    let mut out = Vec::with_capacity(ctx.shard_count as usize);
    for s in 0..ctx.shard_count {
        match ctx.call(ShardId(s), ShardOp::Metrics).await {
            ShardReply::Metrics(m) => out.push(m),
            _ => out.push(MetricsSnapshot::default()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_buckets_are_cumulative_with_inf_last() {
        let m = ShardMetrics::default();
        m.record_latency(ApiClass::Produce, Duration::from_micros(80));
        m.record_latency(ApiClass::Produce, Duration::from_micros(100));
        m.record_latency(ApiClass::Produce, Duration::from_micros(101));
        m.record_latency(ApiClass::Produce, Duration::from_secs(60));
        m.record_latency(ApiClass::Fetch, Duration::from_millis(3));
        let snap = MetricsSnapshot {
            request_latency: m.request_latency.iter().map(LatencyHistogram::snapshot).collect(),
            ..MetricsSnapshot::default()
        };
        let text = render(&[snap]);
        let line = |l: &str| text.lines().any(|x| x == l);
        assert!(
            line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="produce",le="0.0001"} 2"#),
            "{text}"
        );
        assert!(line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="produce",le="0.00025"} 3"#));
        assert!(line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="produce",le="10"} 3"#));
        assert!(line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="produce",le="+Inf"} 4"#));
        assert!(line(r#"shardlog_request_duration_seconds_count{shard="0",api="produce"} 4"#));
        assert!(line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="fetch",le="0.0025"} 0"#));
        assert!(line(r#"shardlog_request_duration_seconds_bucket{shard="0",api="fetch",le="0.005"} 1"#));
        assert!(line(r#"shardlog_request_duration_seconds_count{shard="0",api="admin"} 0"#));
    }

    #[test]
    fn renders_labels_per_path() {
        let s = MetricsSnapshot {
            fetch_bytes_splice: 7,
            produce_requests: 3,
            log_open_files: 5,
            ..Default::default()
        };
        let text = render(&[s, MetricsSnapshot::default()]);
        assert!(text.contains("shardlog_log_open_files{shard=\"0\"} 5"));
        assert!(text.contains("shardlog_fetch_bytes_total{shard=\"0\",path=\"splice\"} 7"));
        assert!(text.contains("shardlog_produce_requests_total{shard=\"0\"} 3"));
        assert!(text.contains("shardlog_produce_requests_total{shard=\"1\"} 0"));
    }
}
