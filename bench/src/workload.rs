//! Workload files: TOML with OpenMessaging Benchmark's parameters, in
//! snake_case (`partitions_per_topic`, `producer_rate`, ...).
//!
//! A `[quick]` table overrides fields for the `--quick` suite so that one
//! file describes both the full and the short variant.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Smallest message: the payload carries the 8-byte send timestamp and the
/// 8-byte order word (stream id, sequence number; see `crate::order`).
pub const MESSAGE_BYTES_MIN: usize = 16;
pub const MESSAGE_BYTES_MAX: usize = 1 << 20;
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 100_000;
pub const PRODUCERS_MAX: u32 = 256;
pub const CONSUMERS_MAX: u32 = 256;

/// How producers choose record keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDistribution {
    /// No key: the client's sticky partitioner spreads batches.
    #[default]
    None,
    /// A uniformly random key among `key_count`.
    Random,
    /// Keys `0..key_count` in turn.
    RoundRobin,
    /// No key, explicit partition chosen round-robin by the harness (every
    /// partition receives the same load; used for many-partition runs).
    PartitionRoundRobin,
}

/// Where the consumers of a backlog workload start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ConsumerStart {
    /// Every subscription drains the whole backlog from the earliest offset.
    #[default]
    Earliest,
    /// The backlog of each partition is cut into as many contiguous slices
    /// as there are consumers; consumer `j` starts at slice `j` and stops at
    /// its end, so all of them read one partition at once from different
    /// offsets and the backlog is read exactly once in total.
    Spread,
}

/// Producer tuning passed to the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProducerTuning {
    pub linger_ms: u64,
    pub batch_bytes: usize,
    pub buffer_bytes_max: usize,
    pub max_in_flight: usize,
    /// Acks the harness awaits concurrently per producer.
    pub outstanding_max: usize,
}

impl Default for ProducerTuning {
    fn default() -> Self {
        ProducerTuning {
            linger_ms: 1,
            batch_bytes: 256 * 1024,
            buffer_bytes_max: 16 << 20,
            max_in_flight: 8,
            outstanding_max: 500_000,
        }
    }
}

/// Consumer tuning passed to the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerTuning {
    pub fetch_max_wait_ms: u64,
    pub fetch_min_bytes: usize,
    pub fetch_max_bytes: usize,
    pub partition_max_bytes: usize,
}

impl Default for ConsumerTuning {
    fn default() -> Self {
        ConsumerTuning {
            fetch_max_wait_ms: 100,
            fetch_min_bytes: 1,
            fetch_max_bytes: 16 << 20,
            partition_max_bytes: 8 << 20,
        }
    }
}

/// Fields a `[quick]` table may override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickOverrides {
    pub duration_s: Option<u64>,
    pub warmup_s: Option<u64>,
    pub partitions_per_topic: Option<u32>,
    pub consumer_backlog_size_gb: Option<f64>,
    pub max_rate_probe_s: Option<u64>,
    pub producer_rate: Option<f64>,
}

/// One workload, as in OpenMessaging Benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "one")]
    pub topics: u32,
    #[serde(default = "one")]
    pub partitions_per_topic: u32,
    pub message_size: usize,
    /// Payload read from this file (cut or repeated to `message_size`);
    /// random bytes when absent.
    #[serde(default)]
    pub payload_file: Option<String>,
    #[serde(default = "one")]
    pub producers_per_topic: u32,
    #[serde(default = "one")]
    pub subscriptions_per_topic: u32,
    #[serde(default = "one")]
    pub consumer_per_subscription: u32,
    /// Total messages per second over all producers; 0 = as fast as possible
    /// (closed loop).
    #[serde(default)]
    pub producer_rate: f64,
    /// When set (0 < f <= 1): first probe the maximum rate of this workload in
    /// closed loop for `max_rate_probe_s`, then run open loop at `f` times it.
    #[serde(default)]
    pub producer_rate_fraction_of_max: Option<f64>,
    #[serde(default = "ten")]
    pub max_rate_probe_s: u64,
    #[serde(default = "sixty")]
    pub duration_s: u64,
    #[serde(default = "ten")]
    pub warmup_s: u64,
    #[serde(default)]
    pub key_distribution: KeyDistribution,
    #[serde(default = "thousand")]
    pub key_count: u32,
    /// 0 = fire and forget, 1 = leader, -1 = all replicas.
    #[serde(default = "one_i")]
    pub acks: i32,
    /// `flush.policy` of the topics: always, interval or never.
    #[serde(default = "never")]
    pub flush_policy: String,
    /// Write this much first with no consumer, then drain it.
    #[serde(default)]
    pub consumer_backlog_size_gb: f64,
    /// Where backlog consumers start (backlog workloads only).
    #[serde(default)]
    pub consumer_start: ConsumerStart,
    /// Extra topic configs (Kafka names: `segment.bytes`, `retention.bytes`, ...).
    #[serde(default)]
    pub topic_config: BTreeMap<String, String>,
    /// Consumers join consumer groups instead of being assigned partitions
    /// by the harness: subscription `s` of topic `t` is group
    /// `<group>-<t>-<s>` (the broker's coordinator splits the partitions,
    /// the members auto-commit). Not with a backlog.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub producer: ProducerTuning,
    #[serde(default)]
    pub consumer: ConsumerTuning,
    #[serde(default)]
    pub quick: Option<QuickOverrides>,
}

fn one() -> u32 {
    1
}
fn one_i() -> i32 {
    1
}
fn ten() -> u64 {
    10
}
fn sixty() -> u64 {
    60
}
fn thousand() -> u32 {
    1_000
}
fn never() -> String {
    "never".to_owned()
}

impl Workload {
    pub fn load(path: &Path) -> anyhow::Result<Workload> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read workload {}", path.display()))?;
        let w: Workload =
            toml::from_str(&text).with_context(|| format!("parse workload {}", path.display()))?;
        w.validate().with_context(|| format!("workload {}", path.display()))?;
        Ok(w)
    }

    /// Applies the `[quick]` overrides.
    #[must_use]
    pub fn quick(mut self) -> Workload {
        if let Some(q) = self.quick.take() {
            self.duration_s = q.duration_s.unwrap_or(self.duration_s);
            self.warmup_s = q.warmup_s.unwrap_or(self.warmup_s);
            self.partitions_per_topic = q.partitions_per_topic.unwrap_or(self.partitions_per_topic);
            self.consumer_backlog_size_gb =
                q.consumer_backlog_size_gb.unwrap_or(self.consumer_backlog_size_gb);
            self.max_rate_probe_s = q.max_rate_probe_s.unwrap_or(self.max_rate_probe_s);
            self.producer_rate = q.producer_rate.unwrap_or(self.producer_rate);
        }
        self
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.name.is_empty()
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!("name {:?} must be non-empty [A-Za-z0-9_-]", self.name);
        }
        if !(MESSAGE_BYTES_MIN..=MESSAGE_BYTES_MAX).contains(&self.message_size) {
            bail!("message_size {} outside [{MESSAGE_BYTES_MIN}, {MESSAGE_BYTES_MAX}]", self.message_size);
        }
        if self.topics == 0
            || self.partitions_per_topic == 0
            || self.partitions_per_topic > PARTITIONS_PER_TOPIC_MAX
        {
            bail!("topics and partitions_per_topic must be in 1..={PARTITIONS_PER_TOPIC_MAX}");
        }
        if self.producers_per_topic == 0 || self.topics * self.producers_per_topic > PRODUCERS_MAX {
            bail!("producers: 1..={PRODUCERS_MAX} in total");
        }
        if self.topics * self.subscriptions_per_topic * self.consumer_per_subscription > CONSUMERS_MAX {
            bail!("consumers: at most {CONSUMERS_MAX} in total");
        }
        if !(self.producer_rate >= 0.0 && self.producer_rate.is_finite()) {
            bail!("producer_rate must be >= 0");
        }
        if let Some(f) = self.producer_rate_fraction_of_max {
            if !(f > 0.0 && f <= 1.0) {
                bail!("producer_rate_fraction_of_max must be in (0, 1]");
            }
        }
        if self.duration_s == 0 {
            bail!("duration_s must be > 0");
        }
        if !["always", "interval", "never"].contains(&self.flush_policy.as_str()) {
            bail!("flush_policy must be always, interval or never");
        }
        if ![0, 1, -1].contains(&self.acks) {
            bail!("acks must be 0, 1 or -1");
        }
        if matches!(self.key_distribution, KeyDistribution::Random | KeyDistribution::RoundRobin)
            && self.key_count == 0
        {
            bail!("key_count must be > 0");
        }
        if self.group.is_some() && self.backlog_bytes() > 0 {
            bail!("group consumers are measured from the log end: no consumer_backlog_size_gb with a group");
        }
        if self.consumer_start == ConsumerStart::Spread && self.backlog_bytes() == 0 {
            bail!("consumer_start = \"spread\" needs consumer_backlog_size_gb > 0");
        }
        Ok(())
    }

    #[must_use]
    pub fn backlog_bytes(&self) -> u64 {
        (self.consumer_backlog_size_gb * 1e9) as u64
    }

    /// Topic configs sent with CreateTopics.
    #[must_use]
    pub fn topic_configs(&self) -> Vec<(String, String)> {
        let mut c: Vec<(String, String)> = vec![("flush.policy".into(), self.flush_policy.clone())];
        c.extend(self.topic_config.iter().map(|(k, v)| (k.clone(), v.clone())));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_standard_workload_parses_and_validates_in_both_variants() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let w = Workload::load(&path).unwrap();
                assert_eq!(path.file_stem().unwrap().to_str().unwrap(), w.name, "file name == workload name");
                let q = w.clone().quick();
                q.validate().unwrap();
                assert!(q.duration_s + q.warmup_s <= w.duration_s + w.warmup_s);
                n += 1;
            }
        }
        assert!(n >= 8, "standard suite has {n} workloads");
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        let bad = "name = \"x\"\nmessage_size = 4\n";
        let w: Workload = toml::from_str(bad).unwrap();
        assert!(w.validate().unwrap_err().to_string().contains("message_size"));
        assert!(toml::from_str::<Workload>("name = \"x\"\nmessage_size = 100\nbogus = 1\n").is_err());
        let spread = "name = \"x\"\nmessage_size = 100\nconsumer_start = \"spread\"\n";
        let w: Workload = toml::from_str(spread).unwrap();
        assert!(w.validate().unwrap_err().to_string().contains("consumer_backlog_size_gb"));
    }
}
