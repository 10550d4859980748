//! `shardlog serve`: builds the broker configuration and runs the broker.

use crate::settings::Settings;
use anyhow::{bail, Context};
use clap::Args;
use shardlog_broker::cluster::{ClusterConfig, SESSION_TIMEOUT_DEFAULT};
use shardlog_broker::config::BrokerConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The default public address.
const LISTEN_DEFAULT: &str = "127.0.0.1:9092";
/// The default data directory.
const DATA_DIR_DEFAULT: &str = "./shardlog-data";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where partition logs and topic metadata live.
    #[arg(long, env = "SHARDLOG_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Public address every shard accepts on (port 0 picks one).
    #[arg(long, env = "SHARDLOG_LISTEN", value_name = "HOST:PORT")]
    listen: Option<SocketAddr>,
    /// Number of shards (pinned executor threads); default: one per core.
    #[arg(long, env = "SHARDLOG_SHARDS")]
    shards: Option<usize>,
    /// Prometheus /metrics listener. Its port must differ from the public
    /// and the shard ports: a collision fails start-up.
    #[arg(long, env = "SHARDLOG_ADMIN_LISTEN", value_name = "HOST:PORT")]
    admin_listen: Option<SocketAddr>,
    /// Most topic-partitions per shard with per-partition log series on
    /// /metrics (the first in name order, internal topics last; the rest are counted, not shown)
    /// [default: 1000].
    #[arg(long)]
    metrics_partitions_max: Option<usize>,
    /// Kafka wire-protocol listener, so Kafka clients and tools work
    /// unchanged (off unless given). Shard i also listens on its port + 1 + i,
    /// which Metadata gives Kafka clients as node i.
    #[arg(long, env = "SHARDLOG_KAFKA_LISTEN", value_name = "HOST:PORT")]
    kafka_listen: Option<SocketAddr>,
    /// How Metadata presents the shards to Kafka clients: `per-shard` (each
    /// shard a node at its own port, the default) or `shared` (one node at
    /// the --kafka-listen port; other shards' partitions are forwarded).
    #[arg(long, env = "SHARDLOG_KAFKA_ADVERTISE", value_name = "per-shard|shared")]
    kafka_advertise: Option<String>,
    /// TOML settings file ([serve] section); flags and env vars win over it.
    #[arg(long = "config", env = "SHARDLOG_CONFIG", value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// First per-shard port (shard i listens on base + i). Default: the
    /// public port + 1 + i, or ephemeral ports when the public port is 0.
    /// A port wanted twice or already in use fails start-up, naming both uses.
    #[arg(long)]
    shard_port_base: Option<u16>,
    /// Host name clients are told to connect to.
    #[arg(long)]
    advertised_host: Option<String>,
    /// This broker's id in a cluster [broker.id]; required with --zookeeper.
    #[arg(long)]
    broker_id: Option<i32>,
    /// Run as a cluster member coordinated by ZooKeeper [zookeeper.connect]:
    /// `HOST:PORT[,HOST:PORT...][/chroot]`. Without it the broker is a
    /// single node (no ZooKeeper).
    #[arg(long, env = "SHARDLOG_ZOOKEEPER", value_name = "HOST:PORT[,..][/chroot]")]
    zookeeper: Option<String>,
    /// ZooKeeper session timeout [zookeeper.session.timeout.ms; 18000]: how
    /// long a dead broker (or controller) stays registered. The server
    /// clamps it to 2 to 20 of its ticks.
    #[arg(long, value_name = "MS")]
    zookeeper_session_timeout_ms: Option<u64>,
    /// This broker's rack [broker.rack], for rack-aware partition placement.
    #[arg(long)]
    rack: Option<String>,
    /// A follower not caught up for this long leaves the ISR
    /// [replica.lag.time.max.ms; 10000].
    #[arg(long, value_name = "MS")]
    replica_lag_time_max_ms: Option<u64>,
    /// Let a live replica outside the ISR lead when no in-sync one is live:
    /// availability over durability (acknowledged records may be lost)
    /// [unclean.leader.election.enable; false]. Read by the controller.
    #[arg(long)]
    unclean_leader_election: bool,
    /// Do not move leadership back to each partition's first (preferred)
    /// replica once it is in sync [auto.leader.rebalance.enable; true].
    /// Read by the controller.
    #[arg(long)]
    no_auto_leader_rebalance: bool,
    /// At SIGTERM or SIGINT, wait this long at most for the controller to
    /// move this broker's leaderships to other in-sync replicas before
    /// stopping; 0 stops at once [controlled.shutdown; 30000].
    #[arg(long, value_name = "MS")]
    controlled_shutdown_timeout_ms: Option<u64>,
    /// Do not pin shards to cores.
    #[arg(long)]
    no_pin_cores: bool,
    /// Largest request envelope (flatbuffer) in bytes.
    #[arg(long)]
    header_bytes_max: Option<u32>,
    /// Largest raw payload (record batches) of one request in bytes.
    #[arg(long)]
    request_payload_bytes_max: Option<u32>,
    #[arg(long)]
    connections_max: Option<usize>,
    #[arg(long)]
    in_flight_per_connection_max: Option<usize>,
    #[arg(long)]
    partitions_max: Option<usize>,
    /// Produce bytes a shard holds in flight before pushing back.
    #[arg(long)]
    shard_buffered_bytes_max: Option<usize>,
    /// Longest fetch long-poll a client may ask for.
    #[arg(long)]
    fetch_wait_ms_max: Option<u32>,
    #[arg(long)]
    retention_check_interval_ms: Option<u64>,
    /// How often each partition records how much of its active segment is
    /// durable, so a restart after a crash validates only what came after
    /// (0: never; then it validates whole active segments).
    #[arg(long)]
    recovery_point_interval_ms: Option<u64>,
    /// How fetches send segment bytes: `splice` (io_uring zero-copy; falls
    /// back to plain with a warning where unavailable) or `plain` (read + send).
    #[arg(long, env = "SHARDLOG_FETCH_PATH", value_name = "splice|plain")]
    fetch_path: Option<String>,
    /// Memory per shard for recently appended batches served to consumers at
    /// the log end (hot tail); 0 turns it off.
    #[arg(long)]
    hot_tail_shard_bytes: Option<u64>,
    /// Most hot-tail bytes of one partition.
    #[arg(long)]
    hot_tail_partition_bytes: Option<u64>,
    /// Writes of less than a 1 MiB chunk each shard keeps in flight; a busy
    /// partition that finds them all taken gathers its appends into its next
    /// write (group commit across partitions; at least 1).
    #[arg(long, env = "SHARDLOG_SMALL_WRITES_IN_FLIGHT_SHARD")]
    small_writes_in_flight_shard: Option<usize>,
    /// Files each shard's partition logs keep open at most (least recently
    /// used ones are closed and reopened on demand); default: the open-files
    /// limit less a quarter (at least 1024) for sockets, split over the shards.
    #[arg(long)]
    open_files_shard_max: Option<usize>,
    /// Default topic setting `name=value` (Kafka names), repeatable.
    #[arg(long = "topic-default", value_name = "KEY=VALUE")]
    topic_defaults: Vec<String>,
    /// Most record bytes in one fetch answer [fetch.max.bytes; 67108864].
    #[arg(long)]
    fetch_bytes_max: Option<u32>,
    /// Fetch answer bytes one connection may have waiting to be sent
    /// [134217728]; further fetches of that connection wait.
    #[arg(long)]
    connection_fetch_bytes_max: Option<u64>,
    /// A request must arrive whole within this once its first byte has [30000].
    #[arg(long)]
    request_read_timeout_ms: Option<u64>,
    /// Connections without a request for this long are closed
    /// [connections.max.idle.ms; 600000].
    #[arg(long)]
    connection_idle_max_ms: Option<u64>,
    /// A response write that makes no progress for this long drops the
    /// connection (a client that does not read) [30000].
    #[arg(long)]
    response_write_timeout_ms: Option<u64>,
    /// Partitions of the internal `__consumer_offsets` topic, used when it
    /// is first created [offsets.topic.num.partitions; 16].
    #[arg(long)]
    offsets_topic_partitions: Option<u32>,
    /// Segment size of `__consumer_offsets` when it is first created
    /// [offsets.topic.segment.bytes; 104857600]; compaction rewrites
    /// sealed segments only, so this bounds the uncompacted tail.
    #[arg(long)]
    offsets_topic_segment_bytes: Option<u64>,
    /// How long the first rebalance of an empty group waits for more
    /// members [group.initial.rebalance.delay.ms; 3000].
    #[arg(long)]
    group_initial_rebalance_delay_ms: Option<u64>,
    /// Shortest session timeout a group member may ask for
    /// [group.min.session.timeout.ms; 1000].
    #[arg(long)]
    group_min_session_timeout_ms: Option<u64>,
    /// Longest session timeout a group member may ask for
    /// [group.max.session.timeout.ms; 1800000].
    #[arg(long)]
    group_max_session_timeout_ms: Option<u64>,
    /// Most members of one group [group.max.size; 10000].
    #[arg(long)]
    group_max_size: Option<usize>,
}

// In `settings` (no crate dependencies there), which the fuzz checks include.
pub use crate::settings::parse_kv;

pub fn build_config(args: ServeArgs) -> anyhow::Result<BrokerConfig> {
    let file = Settings::load(args.config.as_deref())?.serve;
    let data_dir = args.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT));
    let listen = match args.listen.or(file.listen) {
        Some(l) => l,
        None => LISTEN_DEFAULT.parse().context("default listen address")?,
    };
    let mut config = BrokerConfig::new(data_dir, listen);
    if let Some(n) = args.shards.or(file.shards) {
        config.shards = n;
    }
    config.admin_listen = args.admin_listen.or(file.admin_listen);
    if let Some(n) = args.metrics_partitions_max.or(file.metrics_partitions_max) {
        config.metrics_partitions_max = n;
    }
    config.kafka_listen = args.kafka_listen.or(file.kafka_listen);
    if let Some(mode) = args.kafka_advertise.or(file.kafka_advertise) {
        config.kafka_advertise = mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    }
    if let Some(b) = args.hot_tail_shard_bytes.or(file.hot_tail_shard_bytes) {
        config.hot_tail_shard_bytes = b;
    }
    if let Some(b) = args.hot_tail_partition_bytes.or(file.hot_tail_partition_bytes) {
        config.hot_tail_partition_bytes = b;
    }
    if let Some(n) = args.small_writes_in_flight_shard.or(file.small_writes_in_flight_shard) {
        anyhow::ensure!(n > 0, "small_writes_in_flight_shard must be at least 1");
        config.small_writes_in_flight_shard = n;
    }
    config.open_files_shard_max = args.open_files_shard_max.or(file.open_files_shard_max);
    if let Some(path) = args.fetch_path.or(file.fetch_path) {
        config.fetch_path = path.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    }
    config.shard_port_base = args.shard_port_base.or(file.shard_port_base);
    config.advertised_host = args.advertised_host.or(file.advertised_host);
    if let Some(id) = args.broker_id.or(file.broker_id) {
        config.broker_id = id;
    }
    if let Some(zookeeper) = args.zookeeper.or(file.zookeeper) {
        if args.broker_id.or(file.broker_id).is_none() {
            bail!("--zookeeper needs --broker-id N (each broker of a cluster has its own id)");
        }
        let session_ms = args.zookeeper_session_timeout_ms.or(file.zookeeper_session_timeout_ms);
        let lag_ms = args.replica_lag_time_max_ms.or(file.replica_lag_time_max_ms);
        config.cluster = Some(ClusterConfig {
            zookeeper,
            session_timeout: session_ms.map_or(SESSION_TIMEOUT_DEFAULT, Duration::from_millis),
            rack: args.rack.or(file.rack),
            replica_lag_time_max: lag_ms
                .map_or(shardlog_broker::replica::REPLICA_LAG_TIME_MAX_DEFAULT, Duration::from_millis),
            election: shardlog_broker::cluster::controller::ElectionPolicy {
                unclean: args.unclean_leader_election || file.unclean_leader_election.unwrap_or(false),
                preferred: !args.no_auto_leader_rebalance && file.auto_leader_rebalance.unwrap_or(true),
            },
            controlled_shutdown_timeout: args
                .controlled_shutdown_timeout_ms
                .or(file.controlled_shutdown_timeout_ms)
                .map_or(shardlog_broker::cluster::CONTROLLED_SHUTDOWN_TIMEOUT_DEFAULT, Duration::from_millis),
        });
    } else if args.zookeeper_session_timeout_ms.is_some()
        || args.rack.is_some()
        || args.replica_lag_time_max_ms.is_some()
        || args.unclean_leader_election
        || args.no_auto_leader_rebalance
        || args.controlled_shutdown_timeout_ms.is_some()
    {
        bail!(
            "--zookeeper-session-timeout-ms, --rack, --replica-lag-time-max-ms, --unclean-leader-election, \
             --no-auto-leader-rebalance and --controlled-shutdown-timeout-ms need --zookeeper"
        );
    }
    config.pin_cores = !args.no_pin_cores && file.pin_cores.unwrap_or(true);
    let l = &mut config.limits;
    macro_rules! limit {
        ($field:ident) => {
            if let Some(v) = args.$field.or(file.$field) {
                l.$field = v;
            }
        };
    }
    limit!(header_bytes_max);
    limit!(request_payload_bytes_max);
    limit!(connections_max);
    limit!(in_flight_per_connection_max);
    limit!(partitions_max);
    limit!(shard_buffered_bytes_max);
    limit!(fetch_wait_ms_max);
    limit!(fetch_bytes_max);
    limit!(connection_fetch_bytes_max);
    for (flag, file_value, field) in [
        (args.request_read_timeout_ms, file.request_read_timeout_ms, &mut l.request_read_timeout),
        (args.connection_idle_max_ms, file.connection_idle_max_ms, &mut l.connection_idle_max),
        (args.response_write_timeout_ms, file.response_write_timeout_ms, &mut l.response_write_timeout),
    ] {
        if let Some(ms) = flag.or(file_value) {
            *field = Duration::from_millis(ms.max(1));
        }
    }
    let g = &mut config.group;
    if let Some(n) = args.offsets_topic_partitions.or(file.offsets_topic_partitions) {
        g.offsets_topic_partitions = n;
    }
    if let Some(n) = args.offsets_topic_segment_bytes.or(file.offsets_topic_segment_bytes) {
        g.offsets_topic_segment_bytes = n;
    }
    if let Some(ms) = args.group_initial_rebalance_delay_ms.or(file.group_initial_rebalance_delay_ms) {
        g.initial_rebalance_delay = Duration::from_millis(ms);
    }
    if let Some(ms) = args.group_min_session_timeout_ms.or(file.group_min_session_timeout_ms) {
        g.session_timeout_min = Duration::from_millis(ms);
    }
    if let Some(ms) = args.group_max_session_timeout_ms.or(file.group_max_session_timeout_ms) {
        g.session_timeout_max = Duration::from_millis(ms);
    }
    if let Some(n) = args.group_max_size.or(file.group_max_size) {
        g.members_max = n;
    }
    if let Some(ms) = args.retention_check_interval_ms.or(file.retention_check_interval_ms) {
        config.retention_check_interval = Duration::from_millis(ms);
    }
    if let Some(ms) = args.recovery_point_interval_ms.or(file.recovery_point_interval_ms) {
        config.recovery_point_interval = Duration::from_millis(ms);
    }
    // File entries first, then flags, so flags win.
    for (k, v) in &file.topic_defaults {
        config.topic_defaults.set(k, v).with_context(|| format!("topic default `{k}` in config file"))?;
    }
    for kv in &args.topic_defaults {
        let (k, v) = parse_kv(kv)?;
        config.topic_defaults.set(&k, &v).with_context(|| format!("--topic-default {kv}"))?;
    }
    Ok(config)
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = build_config(args)?;
    shardlog_broker::run(config).context("broker failed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::BTreeSet;

    /// The repository's commented example settings file.
    const EXAMPLE: &str = include_str!("../../shardlog.example.toml");

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn config_from(text: &str) -> anyhow::Result<BrokerConfig> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("shardlog.toml");
        std::fs::write(&path, text)?;
        build_config(Serve::try_parse_from(["serve", "--config", path.to_str().expect("utf-8")])?.args)
    }

    /// The example with its commented-out settings (`# key = value`) set.
    fn every_setting_on() -> String {
        fn uncomment(l: &str) -> &str {
            l.strip_prefix("# ")
                .filter(|rest| {
                    rest.split_once(" = ")
                        .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                })
                .unwrap_or(l)
        }
        EXAMPLE.lines().map(uncomment).collect::<Vec<_>>().join("\n")
    }

    /// `section.key` for every key of the tables in `v` (one level down).
    fn keys(v: &serde_json::Value) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (k, v) in v.as_object().expect("table") {
            match v.as_object() {
                Some(inner) if k != "topic_defaults" => out.extend(inner.keys().map(|i| format!("{k}.{i}"))),
                _ => {
                    out.insert(k.clone());
                }
            }
        }
        out
    }

    #[test]
    fn the_example_settings_file_states_the_defaults() {
        let example = config_from(EXAMPLE).expect("the example builds a config");
        let defaults = config_from("").expect("defaults");
        assert_eq!(example.limits, defaults.limits);
        assert_eq!(example.group, defaults.group);
        assert_eq!(example.topic_defaults, defaults.topic_defaults);
        assert_eq!(example.hot_tail_shard_bytes, defaults.hot_tail_shard_bytes);
        assert_eq!(example.hot_tail_partition_bytes, defaults.hot_tail_partition_bytes);
        assert_eq!(example.small_writes_in_flight_shard, defaults.small_writes_in_flight_shard);
        assert_eq!(example.retention_check_interval, defaults.retention_check_interval);
        assert_eq!(example.recovery_point_interval, defaults.recovery_point_interval);
        assert_eq!(example.metrics_partitions_max, defaults.metrics_partitions_max);
        assert_eq!(example.fetch_path, defaults.fetch_path);
        assert_eq!((example.listen, &example.data_dir), (defaults.listen, &defaults.data_dir));
        assert_eq!(example.pin_cores, defaults.pin_cores);
        // Every topic default is written out, with its default value.
        let file: Settings = toml::from_str(EXAMPLE).expect("parses");
        let written: Vec<(String, String)> = file.serve.topic_defaults.into_iter().collect();
        let mut expected = defaults.topic_defaults.entries();
        expected.sort();
        assert_eq!(written, expected);
    }

    #[test]
    fn the_example_settings_file_names_every_setting() {
        let on = every_setting_on();
        let config = config_from(&on).expect("every setting on builds a config");
        assert!(config.cluster.is_some() && config.kafka_listen.is_some() && config.admin_listen.is_some());
        let table: toml::Table = toml::from_str(&on).expect("parses");
        let named = keys(&serde_json::to_value(table).expect("json"));
        let all = keys(&serde_json::to_value(Settings::default()).expect("json"));
        assert_eq!(named, all, "settings missing from or unknown to shardlog.example.toml");
    }

    #[test]
    fn a_bad_setting_is_named() {
        let err = config_from("[serve]\nshardz = 2\n").expect_err("unknown key");
        assert!(format!("{err:#}").contains("shardz"), "{err:#}");
        let err = config_from("[serve]\nshards = \"two\"\n").expect_err("bad value");
        assert!(format!("{err:#}").contains("shards"), "{err:#}");
        let err = config_from("[serve.topic_defaults]\n\"retention.ms\" = \"soon\"\n")
            .expect_err("bad topic value");
        assert!(
            format!("{err:#}").contains("retention.ms") && format!("{err:#}").contains("soon"),
            "{err:#}"
        );
    }
}
