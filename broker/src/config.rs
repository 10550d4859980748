//! Broker and topic configuration, with defaults and bounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// When appended data is made durable with fdatasync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fdatasync before an append is acknowledged; concurrent appends share one.
    Always,
    /// fdatasync every `ms` milliseconds or `bytes` bytes, whichever first.
    Interval { ms: u64, bytes: u64 },
    /// Never fdatasync explicitly (replicated topics rely on replicas).
    Never,
}

pub const FLUSH_INTERVAL_MS_DEFAULT: u64 = 1000;
pub const FLUSH_INTERVAL_BYTES_DEFAULT: u64 = 64 << 20;

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy::Interval { ms: FLUSH_INTERVAL_MS_DEFAULT, bytes: FLUSH_INTERVAL_BYTES_DEFAULT }
    }
}

/// What happens to old data [`cleanup.policy`]: Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Whole old segments are deleted by `retention.ms` / `retention.bytes`.
    #[default]
    Delete,
    /// Keyed compaction keeps the latest record per key (`log::compact`);
    /// retention deletes nothing.
    Compact,
    /// Both: compaction, and retention by time and size (`compact,delete`).
    CompactDelete,
}

impl CleanupPolicy {
    /// Whether keyed compaction runs.
    #[must_use]
    pub fn compacts(self) -> bool {
        matches!(self, CleanupPolicy::Compact | CleanupPolicy::CompactDelete)
    }

    /// Whether retention by time and size deletes old segments.
    #[must_use]
    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::CompactDelete)
    }

    /// Kafka's spelling (`delete`, `compact`, `compact,delete`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::CompactDelete => "compact,delete",
        }
    }

    /// Parses a comma-separated list of `delete` / `compact` (either order,
    /// spaces allowed), as Kafka does.
    fn parse(value: &str) -> Option<CleanupPolicy> {
        let (mut delete, mut compact) = (false, false);
        for part in value.split(',') {
            match part.trim() {
                "delete" => delete = true,
                "compact" => compact = true,
                _ => return None,
            }
        }
        match (compact, delete) {
            (true, true) => Some(CleanupPolicy::CompactDelete),
            (true, false) => Some(CleanupPolicy::Compact),
            (false, true) => Some(CleanupPolicy::Delete),
            (false, false) => None,
        }
    }
}

/// Per-topic settings (Kafka's names in `TopicConfig::set`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub flush: FlushPolicy,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// `None`: unbounded.
    pub retention_bytes: Option<u64>,
    /// `None`: unbounded.
    pub retention_ms: Option<u64>,
    pub index_interval_bytes: u32,
    pub batch_bytes_max: u32,
    /// [`cleanup.policy`]: retention applies only when it includes `delete`,
    /// keyed compaction only when it includes `compact`.
    pub cleanup_policy: CleanupPolicy,
    /// How long a tombstone survives once compaction has cleaned it
    /// [`delete.retention.ms`] (see `log::compact` for the exact rule).
    pub delete_retention_ms: u64,
    /// Compaction runs when the dirty share of the sealed bytes reaches this
    /// many thousandths [`min.cleanable.dirty.ratio`, a fraction in Kafka;
    /// kept in per-mille so the config stays `Eq`].
    pub min_cleanable_dirty_permille: u16,
    /// A sealed segment is compacted only once its newest record is this old
    /// [`min.compaction.lag.ms`].
    pub min_compaction_lag_ms: u64,
    /// `acks=all` fails with `NotEnoughReplicas` while fewer replicas than
    /// this are in sync [`min.insync.replicas`, default 1].
    pub min_insync_replicas: u16,
}

pub const SEGMENT_BYTES_DEFAULT: u64 = 1 << 30;
/// Kafka's `log.flush.offset.checkpoint.interval.ms` is 60 s; a shorter
/// interval bounds recovery tighter at the cost of one flush per busy
/// partition per interval.
pub const RECOVERY_POINT_INTERVAL_S_DEFAULT: u64 = 10;
pub const SEGMENT_BYTES_MIN: u64 = 64 << 10;
/// Per-partition series cost a scrape about 4 lines per partition.
pub const METRICS_PARTITIONS_MAX_DEFAULT: usize = 1000;
pub const SEGMENT_MS_DEFAULT: u64 = 7 * 24 * 3600 * 1000;
pub const RETENTION_MS_DEFAULT: u64 = 7 * 24 * 3600 * 1000;
pub const INDEX_INTERVAL_BYTES_DEFAULT: u32 = 4096;
pub const BATCH_BYTES_MAX_DEFAULT: u32 = 16 << 20;
pub const DELETE_RETENTION_MS_DEFAULT: u64 = 24 * 3600 * 1000;
pub const MIN_CLEANABLE_DIRTY_PERMILLE_DEFAULT: u16 = 500;
pub const MIN_CLEANABLE_DIRTY_PERMILLE_MAX: u16 = 1000;

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            flush: FlushPolicy::default(),
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            segment_ms: SEGMENT_MS_DEFAULT,
            retention_bytes: None,
            retention_ms: Some(RETENTION_MS_DEFAULT),
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            batch_bytes_max: BATCH_BYTES_MAX_DEFAULT,
            cleanup_policy: CleanupPolicy::Delete,
            delete_retention_ms: DELETE_RETENTION_MS_DEFAULT,
            min_cleanable_dirty_permille: MIN_CLEANABLE_DIRTY_PERMILLE_DEFAULT,
            min_compaction_lag_ms: 0,
            min_insync_replicas: 1,
        }
    }
}

/// A bad topic setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("unknown topic config `{0}`")]
    Unknown(String),
    #[error("invalid value `{value}` for `{name}`: {why}")]
    Invalid { name: String, value: String, why: &'static str },
}

fn parse_u64(name: &str, value: &str) -> Result<u64, ConfigError> {
    value.parse::<u64>().map_err(|_| ConfigError::Invalid {
        name: name.into(),
        value: value.into(),
        why: "expected a non-negative integer",
    })
}

/// A fraction in `[0, 1]` (at most three decimals count) as per-mille.
fn parse_permille(name: &str, value: &str) -> Result<u16, ConfigError> {
    let invalid = |why| ConfigError::Invalid { name: name.into(), value: value.into(), why };
    let v: f64 = value.trim().parse().map_err(|_| invalid("expected a number between 0 and 1"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid("expected a number between 0 and 1"));
    }
    // In [0, 1000] after the check above, so the cast cannot truncate.
    Ok((v * f64::from(MIN_CLEANABLE_DIRTY_PERMILLE_MAX)).round() as u16)
}

/// Per-mille as the shortest decimal fraction (`500` -> `0.5`).
fn format_permille(permille: u16) -> String {
    (f64::from(permille) / f64::from(MIN_CLEANABLE_DIRTY_PERMILLE_MAX)).to_string()
}

/// `-1` means unbounded, as in Kafka.
fn parse_bound(name: &str, value: &str) -> Result<Option<u64>, ConfigError> {
    if value.trim() == "-1" {
        return Ok(None);
    }
    parse_u64(name, value).map(Some)
}

impl TopicConfig {
    /// Applies one `name=value` setting with Kafka's names.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let invalid = |why| ConfigError::Invalid { name: name.into(), value: value.into(), why };
        match name {
            "flush.policy" => {
                self.flush = match value {
                    "always" => FlushPolicy::Always,
                    "never" => FlushPolicy::Never,
                    "interval" => match self.flush {
                        FlushPolicy::Interval { .. } => self.flush,
                        _ => FlushPolicy::default(),
                    },
                    _ => return Err(invalid("expected always, interval or never")),
                }
            }
            "flush.ms" => {
                let ms = parse_u64(name, value)?;
                self.flush = match self.flush {
                    FlushPolicy::Interval { bytes, .. } => FlushPolicy::Interval { ms, bytes },
                    _ => FlushPolicy::Interval { ms, bytes: FLUSH_INTERVAL_BYTES_DEFAULT },
                };
            }
            "flush.bytes" | "flush.messages.bytes" => {
                let bytes = parse_u64(name, value)?;
                self.flush = match self.flush {
                    FlushPolicy::Interval { ms, .. } => FlushPolicy::Interval { ms, bytes },
                    _ => FlushPolicy::Interval { ms: FLUSH_INTERVAL_MS_DEFAULT, bytes },
                };
            }
            "segment.bytes" => {
                let v = parse_u64(name, value)?;
                if v < SEGMENT_BYTES_MIN {
                    return Err(invalid("must be at least 65536"));
                }
                self.segment_bytes = v;
            }
            "segment.ms" => self.segment_ms = parse_u64(name, value)?.max(1),
            "retention.bytes" => self.retention_bytes = parse_bound(name, value)?,
            "retention.ms" => self.retention_ms = parse_bound(name, value)?,
            "index.interval.bytes" => {
                self.index_interval_bytes =
                    u32::try_from(parse_u64(name, value)?.max(1)).map_err(|_| invalid("too large"))?;
            }
            "max.message.bytes" => {
                self.batch_bytes_max =
                    u32::try_from(parse_u64(name, value)?).map_err(|_| invalid("too large"))?;
            }
            "cleanup.policy" => {
                self.cleanup_policy = CleanupPolicy::parse(value)
                    .ok_or_else(|| invalid("expected delete, compact or compact,delete"))?;
            }
            "delete.retention.ms" => self.delete_retention_ms = parse_u64(name, value)?,
            "min.cleanable.dirty.ratio" => self.min_cleanable_dirty_permille = parse_permille(name, value)?,
            "min.compaction.lag.ms" => self.min_compaction_lag_ms = parse_u64(name, value)?,
            "min.insync.replicas" => {
                let v = parse_u64(name, value)?;
                if v == 0 {
                    return Err(invalid("must be at least 1"));
                }
                self.min_insync_replicas = u16::try_from(v).map_err(|_| invalid("too large"))?;
            }
            _ => return Err(ConfigError::Unknown(name.into())),
        }
        Ok(())
    }

    /// The settings as `name=value` pairs (Kafka's names), for describe and
    /// for persisting topic metadata.
    #[must_use]
    pub fn entries(&self) -> Vec<(String, String)> {
        let bound = |v: Option<u64>| v.map_or("-1".to_string(), |v| v.to_string());
        let mut out = Vec::new();
        match self.flush {
            FlushPolicy::Always => out.push(("flush.policy".into(), "always".into())),
            FlushPolicy::Never => out.push(("flush.policy".into(), "never".into())),
            FlushPolicy::Interval { ms, bytes } => {
                out.push(("flush.policy".into(), "interval".into()));
                out.push(("flush.ms".into(), ms.to_string()));
                out.push(("flush.bytes".into(), bytes.to_string()));
            }
        }
        out.push(("segment.bytes".into(), self.segment_bytes.to_string()));
        out.push(("segment.ms".into(), self.segment_ms.to_string()));
        out.push(("retention.bytes".into(), bound(self.retention_bytes)));
        out.push(("retention.ms".into(), bound(self.retention_ms)));
        out.push(("index.interval.bytes".into(), self.index_interval_bytes.to_string()));
        out.push(("max.message.bytes".into(), self.batch_bytes_max.to_string()));
        out.push(("cleanup.policy".into(), self.cleanup_policy.as_str().into()));
        out.push(("delete.retention.ms".into(), self.delete_retention_ms.to_string()));
        out.push(("min.cleanable.dirty.ratio".into(), format_permille(self.min_cleanable_dirty_permille)));
        out.push(("min.compaction.lag.ms".into(), self.min_compaction_lag_ms.to_string()));
        out.push(("min.insync.replicas".into(), self.min_insync_replicas.to_string()));
        out
    }

    /// Builds a config from defaults plus `name=value` settings.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<TopicConfig, ConfigError> {
        let mut config = TopicConfig::default();
        for (k, v) in entries {
            config.set(k, v)?;
        }
        Ok(config)
    }
}

/// Bounds on everything a peer can make the broker hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest envelope flatbuffer of a request.
    pub header_bytes_max: u32,
    /// Largest raw payload (record batches) of one request.
    pub request_payload_bytes_max: u32,
    pub connections_max: usize,
    pub in_flight_per_connection_max: usize,
    pub partitions_max: usize,
    /// Bytes of produce data a shard holds in flight before it pushes back.
    pub shard_buffered_bytes_max: usize,
    /// Longest `max_wait_ms` a fetch may ask for.
    pub fetch_wait_ms_max: u32,
    /// Most record bytes one fetch response carries, whatever `max_bytes`
    /// and `partition_max_bytes` ask for (Kafka's `fetch.max.bytes`).
    pub fetch_bytes_max: u32,
    /// Record bytes of fetch answers one connection may have prepared but
    /// not yet sent; further fetches wait (a client that does not read its
    /// answers holds at most this, then `response_write_timeout` drops it).
    pub connection_fetch_bytes_max: u64,
    /// A frame whose first byte has arrived must arrive whole within this
    /// (slow or stalled senders are disconnected).
    pub request_read_timeout: Duration,
    /// A connection with no request for this long is closed
    /// (Kafka's `connections.max.idle.ms`).
    pub connection_idle_max: Duration,
    /// A response write that makes no progress for this long closes the
    /// connection (a client that does not read its responses).
    pub response_write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_bytes_max: shardlog_schema::frame::HEADER_BYTES_MAX_DEFAULT,
            request_payload_bytes_max: shardlog_schema::frame::PAYLOAD_BYTES_MAX_DEFAULT,
            connections_max: 10_000,
            in_flight_per_connection_max: 256,
            partitions_max: 100_000,
            shard_buffered_bytes_max: 512 << 20,
            fetch_wait_ms_max: 60_000,
            fetch_bytes_max: 64 << 20,
            connection_fetch_bytes_max: 128 << 20,
            request_read_timeout: Duration::from_secs(30),
            connection_idle_max: Duration::from_secs(600),
            response_write_timeout: Duration::from_secs(30),
        }
    }
}

/// Consumer-group coordinator settings (Kafka's names in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// Partitions of `__consumer_offsets` [`offsets.topic.num.partitions`];
    /// used when the topic is first created, fixed after that (the group →
    /// partition function depends on it).
    pub offsets_topic_partitions: u32,
    /// Segment size of `__consumer_offsets` [`offsets.topic.segment.bytes`]:
    /// compaction works on sealed segments, so this bounds what it leaves.
    pub offsets_topic_segment_bytes: u64,
    /// How long the first rebalance of an empty group waits for more members
    /// [`group.initial.rebalance.delay.ms`].
    pub initial_rebalance_delay: Duration,
    /// Bounds on a member's session timeout [`group.min.session.timeout.ms`,
    /// `group.max.session.timeout.ms`].
    pub session_timeout_min: Duration,
    pub session_timeout_max: Duration,
    /// Most members of one group [`group.max.size`].
    pub members_max: usize,
    /// Longest metadata string of an offset commit [`offset.metadata.max.bytes`].
    pub offset_metadata_bytes_max: usize,
}

pub const OFFSETS_TOPIC_PARTITIONS_DEFAULT: u32 = 16;

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            offsets_topic_partitions: OFFSETS_TOPIC_PARTITIONS_DEFAULT,
            offsets_topic_segment_bytes: 100 << 20,
            initial_rebalance_delay: Duration::from_millis(3000),
            session_timeout_min: Duration::from_millis(1000),
            session_timeout_max: Duration::from_secs(1800),
            members_max: 10_000,
            offset_metadata_bytes_max: 4096,
        }
    }
}

/// How fetch responses send segment-file bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchPath {
    /// io_uring splice file -> pipe -> socket (zero-copy; about half the CPU
    /// per GB of `Plain`); falls back to `Plain` at start-up, with one log
    /// line, where splice is unavailable.
    Splice,
    /// read into memory, then send. The default: faster on cold reads here.
    Plain,
}

impl std::str::FromStr for FetchPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "splice" => Ok(FetchPath::Splice),
            "plain" => Ok(FetchPath::Plain),
            _ => Err(format!("unknown fetch path `{s}`: expected splice or plain")),
        }
    }
}

/// How Metadata presents this broker to Kafka clients (`--kafka-advertise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KafkaAdvertise {
    /// Every shard is its own Kafka node at its own port, leader of the
    /// partitions it owns: clients reach the owner with no cross-core hop.
    /// The default (measured: ARCHITECTURE.md, `broker/src/kafka/`).
    #[default]
    PerShard,
    /// One node at the shared Kafka port for all partitions: a request is
    /// served by whichever shard accepted the connection, and the parts of
    /// partitions it does not own are forwarded over the mesh.
    Shared,
}

impl std::str::FromStr for KafkaAdvertise {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "per-shard" => Ok(KafkaAdvertise::PerShard),
            "shared" => Ok(KafkaAdvertise::Shared),
            _ => Err(format!("unknown Kafka advertise mode `{s}`: expected per-shard or shared")),
        }
    }
}

/// Everything `shardlog serve` needs.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    /// The public address all shards accept on (SO_REUSEPORT). Port 0 picks one.
    pub listen: SocketAddr,
    /// First per-shard port; shard `i` listens on `base + i`. `None` (or 0):
    /// the public port + 1 + i when it is fixed, ephemeral ports when it is
    /// 0. Start-up fails if any of these ports collides with another use
    /// (`BrokerError::PortCollision`) or is in use (`PortInUse`).
    pub shard_port_base: Option<u16>,
    /// Host name put in metadata; defaults to the listen IP.
    pub advertised_host: Option<String>,
    /// Number of shards (executor threads); defaults to the core count.
    pub shards: usize,
    /// Pin each shard to a core.
    pub pin_cores: bool,
    pub broker_id: i32,
    pub limits: Limits,
    /// Defaults for topics created without explicit settings.
    pub topic_defaults: TopicConfig,
    pub retention_check_interval: Duration,
    /// How often each partition's recovery point is written (`log::recovery_point`):
    /// an unclean restart validates only what was written after it. Zero: never.
    pub recovery_point_interval: Duration,
    /// Prometheus `/metrics` listener.
    pub admin_listen: Option<SocketAddr>,
    /// Most topic-partitions per shard with per-partition log series on
    /// `/metrics` (the first in topic and partition order, internal topics last; the rest are
    /// counted in `shardlog_metrics_partitions_omitted`).
    pub metrics_partitions_max: usize,
    /// The Kafka-protocol listener (`--kafka-listen`; off when `None`).
    /// Every shard accepts on it, and shard `i` also on its port + 1 + i,
    /// which Metadata names as Kafka node `i` (`kafka` module).
    pub kafka_listen: Option<SocketAddr>,
    /// How Metadata presents the shards to Kafka clients.
    pub kafka_advertise: KafkaAdvertise,
    pub fetch_path: FetchPath,
    /// Memory each shard keeps for recently appended batches (the hot tail
    /// served to consumers at the end of the log); 0 turns it off.
    pub hot_tail_shard_bytes: u64,
    /// Most hot-tail bytes of one partition.
    pub hot_tail_partition_bytes: u64,
    /// Writes of less than a chunk each shard's logs keep in flight at
    /// once; a busy log that finds them all taken gathers its appends until
    /// a place frees (`log::gate`).
    pub small_writes_in_flight_shard: usize,
    /// Files each shard's partition logs may keep open (segment write and
    /// read handles); least recently used ones are closed beyond it. `None`:
    /// the open-files limit less a reserve for sockets, split over the
    /// shards (`log::shard_files_max`).
    pub open_files_shard_max: Option<usize>,
    /// Consumer groups: the offsets topic and the coordinator's bounds.
    pub group: GroupConfig,
    /// `--zookeeper` and friends: `None` runs the static single-node
    /// membership (no ZooKeeper), as before clusters existed.
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

impl BrokerConfig {
    #[must_use]
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Self {
        BrokerConfig {
            data_dir,
            listen,
            shard_port_base: None,
            advertised_host: None,
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pin_cores: true,
            broker_id: 0,
            limits: Limits::default(),
            topic_defaults: TopicConfig::default(),
            retention_check_interval: Duration::from_secs(30),
            recovery_point_interval: Duration::from_secs(RECOVERY_POINT_INTERVAL_S_DEFAULT),
            admin_listen: None,
            metrics_partitions_max: METRICS_PARTITIONS_MAX_DEFAULT,
            kafka_listen: None,
            kafka_advertise: KafkaAdvertise::PerShard,
            // Measured faster for cold (on-disk) reads, the ones that reach
            // files once the hot tail serves the log end: perf-reports/fetch-*.
            fetch_path: FetchPath::Plain,
            hot_tail_shard_bytes: crate::log::HOT_TAIL_SHARD_BYTES_DEFAULT,
            hot_tail_partition_bytes: crate::log::HOT_TAIL_LOG_BYTES_DEFAULT,
            small_writes_in_flight_shard: crate::log::SMALL_WRITES_IN_FLIGHT_DEFAULT,
            open_files_shard_max: None,
            group: GroupConfig::default(),
            cluster: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_names_round_trip() {
        let c = TopicConfig::from_entries([
            ("flush.policy", "always"),
            ("segment.bytes", "1048576"),
            ("retention.bytes", "-1"),
            ("retention.ms", "60000"),
        ])
        .expect("valid");
        assert_eq!(c.flush, FlushPolicy::Always);
        assert_eq!(c.retention_bytes, None);
        let entries = c.entries();
        let back = TopicConfig::from_entries(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .expect("round trip");
        assert_eq!(back, c);
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let mut c = TopicConfig::default();
        assert_eq!(c.set("no.such", "1"), Err(ConfigError::Unknown("no.such".into())));
        assert!(matches!(c.set("segment.bytes", "12"), Err(ConfigError::Invalid { .. })));
        assert!(matches!(c.set("flush.policy", "sometimes"), Err(ConfigError::Invalid { .. })));
        c.set("flush.ms", "5").expect("valid");
        assert_eq!(c.flush, FlushPolicy::Interval { ms: 5, bytes: FLUSH_INTERVAL_BYTES_DEFAULT });
    }

    #[test]
    fn compaction_settings_round_trip_and_reject_bad_values() {
        let d = TopicConfig::default();
        assert_eq!(d.cleanup_policy, CleanupPolicy::Delete);
        assert_eq!(
            (d.delete_retention_ms, d.min_cleanable_dirty_permille, d.min_compaction_lag_ms),
            (86_400_000, 500, 0)
        );
        for (text, policy) in [
            ("delete", CleanupPolicy::Delete),
            ("compact", CleanupPolicy::Compact),
            ("compact,delete", CleanupPolicy::CompactDelete),
            ("delete, compact", CleanupPolicy::CompactDelete),
        ] {
            let mut c = TopicConfig::default();
            c.set("cleanup.policy", text).expect("valid policy");
            assert_eq!(c.cleanup_policy, policy, "{text}");
        }
        let c = TopicConfig::from_entries([
            ("cleanup.policy", "compact"),
            ("delete.retention.ms", "10"),
            ("min.cleanable.dirty.ratio", "0.125"),
            ("min.compaction.lag.ms", "7"),
        ])
        .expect("valid");
        assert!(c.cleanup_policy.compacts() && !c.cleanup_policy.deletes());
        assert_eq!(
            (c.delete_retention_ms, c.min_cleanable_dirty_permille, c.min_compaction_lag_ms),
            (10, 125, 7)
        );
        let entries = c.entries();
        assert!(entries.contains(&("min.cleanable.dirty.ratio".into(), "0.125".into())));
        let back = TopicConfig::from_entries(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .expect("round trip");
        assert_eq!(back, c);
        let mut c = TopicConfig::default();
        for (name, value) in [
            ("cleanup.policy", "purge"),
            ("cleanup.policy", ""),
            ("cleanup.policy", "compact,"),
            ("delete.retention.ms", "-5"),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("min.cleanable.dirty.ratio", "-0.1"),
            ("min.cleanable.dirty.ratio", "NaN"),
            ("min.cleanable.dirty.ratio", "half"),
            ("min.compaction.lag.ms", "soon"),
        ] {
            assert!(
                matches!(c.set(name, value), Err(ConfigError::Invalid { name: ref n, .. }) if n == name),
                "{name}={value}"
            );
        }
        assert_eq!(c, TopicConfig::default(), "a rejected value changes nothing");
    }
}
