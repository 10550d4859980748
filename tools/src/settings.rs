//! The optional TOML settings file. Precedence: flags, then environment
//! variables (both via clap), then this file, then built-in defaults.
//! `shardlog.example.toml` at the repository root names every setting with
//! its default (tested in `serve.rs`); in short:
//!
//! ```toml
//! bootstrap = "127.0.0.1:9092"
//! client_id = "ops"
//! request_timeout_ms = 30000
//!
//! [serve]
//! data_dir = "/var/lib/shardlog"
//! listen = "0.0.0.0:9092"
//! shards = 4
//! # cluster mode (omit for a single broker without ZooKeeper)
//! broker_id = 1
//! zookeeper = "zk1:2181,zk2:2181,zk3:2181/shardlog-prod"
//! zookeeper_session_timeout_ms = 18000
//! rack = "eu-1a"
//! replica_lag_time_max_ms = 10000
//! unclean_leader_election = false
//! auto_leader_rebalance = true
//! controlled_shutdown_timeout_ms = 30000
//! [serve.topic_defaults]          # Kafka names, as for `topic create --config`
//! "retention.ms" = "86400000"
//!
//! [producer]
//! acks = "leader"                 # none | leader | all
//! linger_ms = 5
//!
//! [consumer]
//! fetch_max_wait_ms = 500
//! ```

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub bootstrap: Option<String>,
    pub client_id: Option<String>,
    pub request_timeout_ms: Option<u64>,
    #[serde(default)]
    pub serve: ServeSettings,
    #[serde(default)]
    pub producer: ProducerSettings,
    #[serde(default)]
    pub consumer: ConsumerSettings,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSettings {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub shards: Option<usize>,
    pub admin_listen: Option<SocketAddr>,
    pub metrics_partitions_max: Option<usize>,
    pub kafka_listen: Option<SocketAddr>,
    pub kafka_advertise: Option<String>,
    pub shard_port_base: Option<u16>,
    pub advertised_host: Option<String>,
    pub broker_id: Option<i32>,
    pub zookeeper: Option<String>,
    pub zookeeper_session_timeout_ms: Option<u64>,
    pub rack: Option<String>,
    pub replica_lag_time_max_ms: Option<u64>,
    pub unclean_leader_election: Option<bool>,
    pub auto_leader_rebalance: Option<bool>,
    pub controlled_shutdown_timeout_ms: Option<u64>,
    pub pin_cores: Option<bool>,
    pub header_bytes_max: Option<u32>,
    pub request_payload_bytes_max: Option<u32>,
    pub connections_max: Option<usize>,
    pub in_flight_per_connection_max: Option<usize>,
    pub partitions_max: Option<usize>,
    pub shard_buffered_bytes_max: Option<usize>,
    pub fetch_wait_ms_max: Option<u32>,
    pub retention_check_interval_ms: Option<u64>,
    pub recovery_point_interval_ms: Option<u64>,
    pub fetch_path: Option<String>,
    pub hot_tail_shard_bytes: Option<u64>,
    pub hot_tail_partition_bytes: Option<u64>,
    pub small_writes_in_flight_shard: Option<usize>,
    pub open_files_shard_max: Option<usize>,
    pub fetch_bytes_max: Option<u32>,
    pub connection_fetch_bytes_max: Option<u64>,
    pub request_read_timeout_ms: Option<u64>,
    pub connection_idle_max_ms: Option<u64>,
    pub response_write_timeout_ms: Option<u64>,
    pub offsets_topic_partitions: Option<u32>,
    pub offsets_topic_segment_bytes: Option<u64>,
    pub group_initial_rebalance_delay_ms: Option<u64>,
    pub group_min_session_timeout_ms: Option<u64>,
    pub group_max_session_timeout_ms: Option<u64>,
    pub group_max_size: Option<usize>,
    #[serde(default)]
    pub topic_defaults: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerSettings {
    pub acks: Option<String>,
    pub linger_ms: Option<u64>,
    pub batch_bytes: Option<usize>,
    pub buffer_bytes_max: Option<usize>,
    pub max_in_flight: Option<usize>,
    pub retries: Option<u32>,
    pub delivery_timeout_ms: Option<u64>,
    pub enable_idempotence: Option<bool>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    pub fetch_max_wait_ms: Option<u32>,
    pub fetch_min_bytes: Option<u32>,
    pub fetch_max_bytes: Option<u32>,
    pub partition_max_bytes: Option<u32>,
}

impl Settings {
    /// Loads the file when one is given; defaults otherwise.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Settings> {
        let Some(path) = path else { return Ok(Settings::default()) };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

/// Splits a `--config name=value` setting (`topic create`, `serve`).
pub fn parse_kv(s: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => bail!("expected KEY=VALUE, got `{s}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_section() {
        let s: Settings = toml::from_str(
            r#"
            bootstrap = "h:1"
            [serve]
            shards = 2
            listen = "127.0.0.1:0"
            [serve.topic_defaults]
            "retention.ms" = "1000"
            [producer]
            acks = "all"
            [consumer]
            fetch_max_wait_ms = 10
            "#,
        )
        .expect("valid");
        assert_eq!(s.bootstrap.as_deref(), Some("h:1"));
        assert_eq!(s.serve.shards, Some(2));
        assert_eq!(s.serve.topic_defaults.get("retention.ms").map(String::as_str), Some("1000"));
        assert_eq!(s.producer.acks.as_deref(), Some("all"));
        assert_eq!(s.consumer.fetch_max_wait_ms, Some(10));
        assert!(toml::from_str::<Settings>("nonsense = 1").is_err());
    }
}
