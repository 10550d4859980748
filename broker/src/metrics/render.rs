//! Prometheus text format of the shards' snapshots.

use super::histogram::{stage_bound_ns, HistogramSnapshot, LATENCY_BUCKETS_US, STAGE_BUCKETS};
use super::{ApiClass, LogSample, MetricsSnapshot, Stage};
use std::fmt::Write as _;

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
    family("produce_requests_total", "counter", "Partition appends of produce requests handled (one per partition of each request; a request to 500 partitions counts 500).", &|s| s.produce_requests);
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
    family("log_writes_total", "counter", "O_DIRECT segment writes completed.", &|s| s.log_writes);
    family(
        "log_write_bytes_total",
        "counter",
        "Bytes of completed O_DIRECT segment writes (padding and rewritten partial blocks included).",
        &|s| s.log_write_bytes,
    );
    family(
        "log_write_gate_waits_total",
        "counter",
        "Times a partition's small write found the shard's write gate full and queued (its appends then go out together).",
        &|s| s.log_write_gate_waits,
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
    family("hot_tail_bytes", "gauge", "Bytes the shard's hot tail windows hold.", &|s| s.hot_tail_bytes);
    family("hot_tail_bytes_max", "gauge", "The shard's hot tail budget.", &|s| s.hot_tail_bytes_max);
    family(
        "hot_tail_evicted_bytes_total",
        "counter",
        "Hot tail bytes dropped to stay within the shard's budget.",
        &|s| s.hot_tail_evicted_bytes,
    );
    family(
        "shard_stalls_total",
        "counter",
        "Scheduling probe wake-ups at least 20 ms late: something held the shard's thread.",
        &|s| s.stalls,
    );
    family(
        "metrics_partitions_omitted",
        "gauge",
        "Partitions of the shard beyond metrics_partitions_max, without per-partition log series.",
        &|s| s.logs.1,
    );
    let _ = writeln!(
        out,
        "# HELP shardlog_hot_tail_reads_total Log reads answered whole from the hot tail (hit) or from segment files (miss).\n# TYPE shardlog_hot_tail_reads_total counter"
    );
    for (shard, s) in shards.iter().enumerate() {
        for (result, v) in [("hit", s.hot_tail_hits), ("miss", s.hot_tail_misses)] {
            let _ =
                writeln!(out, "shardlog_hot_tail_reads_total{{shard=\"{shard}\",result=\"{result}\"}} {v}");
        }
    }
    render_latency(&mut out, shards);
    render_histogram(
        &mut out,
        "log_fdatasync_duration_seconds",
        "Time of each fdatasync of segment data (flush policy, recovery points).",
        shards.iter().enumerate().map(|(shard, s)| (format!("shard=\"{shard}\""), &s.fdatasync)),
    );
    render_histogram(
        &mut out,
        "shard_scheduling_delay_seconds",
        "How late the shard's 10 ms probe timer fires: what a ready task waits for the reactor.",
        shards.iter().enumerate().map(|(shard, s)| (format!("shard=\"{shard}\""), &s.scheduling_delay)),
    );
    render_stages(&mut out, shards);
    render_logs(&mut out, shards);
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
    render_histogram(
        out,
        "request_duration_seconds",
        "Time from a request's arrival to its response, by API (fetch includes the long-poll wait).",
        shards.iter().enumerate().flat_map(|(shard, s)| {
            ApiClass::ALL
                .iter()
                .zip(&s.request_latency)
                .map(move |(api, h)| (format!("shard=\"{shard}\",api=\"{}\"", api.label()), h))
        }),
    );
}

/// `shardlog_stage_duration_seconds`: per shard and [`Stage`], in the stage
/// histograms' quarter-octave buckets.
fn render_stages(out: &mut String, shards: &[MetricsSnapshot]) {
    let _ = writeln!(
        out,
        "# HELP shardlog_stage_duration_seconds Time records spend in each step of the data path (per record; fetch_wake per woken fetch).\n# TYPE shardlog_stage_duration_seconds histogram"
    );
    for (shard, s) in shards.iter().enumerate() {
        for (stage, h) in Stage::ALL.iter().zip(&s.stages) {
            let labels = format!("shard=\"{shard}\",stage=\"{}\"", stage.label());
            let bound_s = |i: usize| (i < STAGE_BUCKETS).then(|| stage_bound_ns(i) as f64 / 1e9);
            let name = "stage_duration_seconds";
            render_series(out, name, &labels, &h.buckets, bound_s, h.sum_ns as f64 / 1e9);
        }
    }
}

/// One Prometheus histogram family `shardlog_{name}`, a series per labels.
fn render_histogram<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (String, &'a HistogramSnapshot)>,
) {
    let _ = writeln!(out, "# HELP shardlog_{name} {help}\n# TYPE shardlog_{name} histogram");
    for (labels, h) in series {
        let bound_s = |i: usize| LATENCY_BUCKETS_US.get(i).map(|us| *us as f64 / 1e6);
        render_series(out, name, &labels, &h.buckets, bound_s, h.sum_us as f64 / 1e6);
    }
}

/// One series of a histogram family: cumulative buckets (`bound_s(i)` is
/// bucket `i`'s upper bound in seconds, `None` for the last, +Inf), sum and count.
fn render_series(
    out: &mut String,
    name: &str,
    labels: &str,
    buckets: &[u64],
    bound_s: impl Fn(usize) -> Option<f64>,
    sum_s: f64,
) {
    let mut cumulative = 0u64;
    for (i, n) in buckets.iter().enumerate() {
        cumulative += n;
        let le = bound_s(i).map_or("+Inf".to_string(), |b| b.to_string());
        let _ = writeln!(out, "shardlog_{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "shardlog_{name}_sum{{{labels}}} {sum_s}");
    let _ = writeln!(out, "shardlog_{name}_count{{{labels}}} {cumulative}");
}

/// Per partition log (at most `metrics_partitions_max` per shard): its
/// start and end offsets, size and segment count.
fn render_logs(out: &mut String, shards: &[MetricsSnapshot]) {
    type Field = fn(&LogSample) -> u64;
    let families: [(&str, &str, Field); 4] = [
        ("partition_log_start_offset", "The first offset still in the partition's log.", |l| l.start_offset),
        ("partition_log_end_offset", "The offset the partition's next record gets.", |l| l.end_offset),
        ("partition_log_size_bytes", "Bytes of the partition's segments.", |l| l.size_bytes),
        ("partition_log_segments", "Segments of the partition's log.", |l| l.segments),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP shardlog_{name} {help}\n# TYPE shardlog_{name} gauge");
        for l in shards.iter().flat_map(|s| &s.logs.0) {
            let _ = writeln!(
                out,
                "shardlog_{name}{{topic=\"{}\",partition=\"{}\"}} {}",
                label(&l.topic),
                l.partition,
                value(l)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{LatencyHistogram, ShardMetrics};
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
    fn stage_histograms_render_cumulative_quarter_octave_buckets() {
        let stages = crate::metrics::Stages::default();
        stages.record(Stage::Write, Duration::from_nanos(1_100), 4);
        stages.record(Stage::Write, Duration::from_micros(30), 1);
        let snap = MetricsSnapshot { stages: stages.snapshot(), ..MetricsSnapshot::default() };
        let text = render(&[snap]);
        let line = |l: &str| text.lines().any(|x| x == l);
        let w = r#"shardlog_stage_duration_seconds_bucket{shard="0",stage="write""#;
        assert!(line(&format!(r#"{w},le="0.000001"}} 0"#)), "{text}");
        assert!(line(&format!(r#"{w},le="0.00000125"}} 4"#)));
        assert!(line(&format!(r#"{w},le="0.000032"}} 5"#)));
        assert!(line(&format!(r#"{w},le="+Inf"}} 5"#)));
        assert!(line(r#"shardlog_stage_duration_seconds_count{shard="0",stage="write"} 5"#));
        assert!(line(r#"shardlog_stage_duration_seconds_count{shard="0",stage="fetch_wake"} 0"#));
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
