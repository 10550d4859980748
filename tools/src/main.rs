//! `shardlog`: run a broker, manage topics, produce and consume from a shell.
//!
//! Scripts depend on these command and flag names; keep them stable.

mod client_cmds;
mod cluster_cmds;
mod group_cmds;
mod log_dump;
mod serve;
mod settings;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "shardlog", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SHARDLOG_BUILD_SHA"), ")"), about = "Shardlog: a partitioned, thread-per-core commit-log broker")]
struct Cli {
    /// Log lines on stderr: `text` (human, coloured on a terminal) or `json`
    /// (one object per line with the thread, e.g. `shard-0`, and the
    /// connection span's shard, listener and peer).
    /// The level comes from `RUST_LOG` (default `warn`).
    #[arg(long, global = true, env = "SHARDLOG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// Installs the process's log subscriber: `RUST_LOG` filters (default
/// `warn`), lines go to stderr (stdout carries data: consumed records,
/// the broker's ready line).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        // The thread name says the shard (`shard-3`) of lines outside a
        // connection's span.
        LogFormat::Json => {
            builder.json().with_thread_names(true).with_current_span(true).with_span_list(true).init()
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a broker until SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Create, list, describe and delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Send stdin to a topic, one message per line (bytes, not text).
    Produce(ProduceArgs),
    /// Print messages of a topic, one per line.
    Consume(ConsumeArgs),
    /// List, describe, reset the offsets of, and delete consumer groups.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Inspect on-disk data.
    #[command(subcommand)]
    Log(LogCommand),
    /// Cluster state from ZooKeeper (brokers, controller, offline partitions).
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Cluster id, controller and epoch, brokers with address, shards and
    /// partition counts, offline partitions (`--output json`: one object).
    Status {
        /// The cluster's ZooKeeper, as given to `serve --zookeeper`.
        #[arg(long, env = "SHARDLOG_ZOOKEEPER", value_name = "HOST:PORT[,..][/chroot]")]
        zookeeper: String,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Preferred-leader election: each partition whose first replica is
    /// live and in sync is led by it again (after a failover, with
    /// `--no-auto-leader-rebalance`). Every partition unless `--topic`.
    ElectLeaders {
        #[arg(long, env = "SHARDLOG_ZOOKEEPER", value_name = "HOST:PORT[,..][/chroot]")]
        zookeeper: String,
        #[arg(long)]
        topic: Option<String>,
        /// With --topic: only this partition.
        #[arg(long, requires = "topic")]
        partition: Option<u32>,
    },
    /// Moves one partition's replicas to the brokers given (the first is
    /// the preferred leader): new replicas are added and caught up, then
    /// leadership moves, then the old replicas are dropped, while producers
    /// and consumers go on. Waits until done unless `--no-wait`; `cluster
    /// status` shows the progress.
    Reassign {
        #[arg(long, env = "SHARDLOG_ZOOKEEPER", value_name = "HOST:PORT[,..][/chroot]")]
        zookeeper: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: u32,
        /// Broker ids, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<i32>,
        #[command(flatten)]
        wait: ReassignWait,
    },
    /// Evens out replicas and preferred leaders over the live brokers (after
    /// a broker joined, or with `--exclude-broker` before one is
    /// decommissioned) as one reassignment; `--dry-run` prints the plan only.
    Rebalance {
        #[arg(long, env = "SHARDLOG_ZOOKEEPER", value_name = "HOST:PORT[,..][/chroot]")]
        zookeeper: String,
        /// Brokers to move every replica off (repeat or comma-separate).
        #[arg(long = "exclude-broker", value_delimiter = ',')]
        exclude: Vec<i32>,
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        wait: ReassignWait,
    },
}

/// How `cluster reassign` and `cluster rebalance` wait.
#[derive(Args, Debug, Clone, Copy)]
pub struct ReassignWait {
    /// Return once the controller has the request.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting after this many seconds (the reassignment goes on).
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// Connection settings every client command takes.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Any broker's public address.
    #[arg(long, env = "SHARDLOG_BOOTSTRAP", value_name = "HOST:PORT")]
    pub bootstrap: Option<String>,
    /// TOML settings file (see `settings.rs`); flags and env vars win over it.
    #[arg(long = "config-file", env = "SHARDLOG_CONFIG", value_name = "FILE.toml")]
    pub config_file: Option<PathBuf>,
    #[arg(long, env = "SHARDLOG_CLIENT_ID")]
    pub client_id: Option<String>,
    #[arg(long, env = "SHARDLOG_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
}

/// `--config FILE.toml` for commands where `--config` is not taken.
#[derive(Args, Debug, Clone)]
pub struct ConfigFileArg {
    /// TOML settings file (same as --config-file).
    #[arg(long = "config", value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Copies of each partition, on distinct brokers (at most the live
        /// brokers; 1 on a broker without --zookeeper).
        #[arg(long, default_value_t = 1)]
        replication_factor: u16,
        /// Topic setting `name=value` (Kafka names: retention.ms, segment.bytes, flush.policy...).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List topic names, one per line (`--output json`: a JSON array).
    /// Internal topics (`__consumer_offsets`) only with `--include-internal`.
    List {
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        /// Also list the broker's internal topics (names starting with `__`).
        #[arg(long)]
        include_internal: bool,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
    /// Show partitions (leader broker, shard, port, start and end offsets) and
    /// settings (`--output json`: one JSON object with the same fields).
    Describe {
        name: String,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
    /// Delete a topic and its data.
    Delete {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
}

/// How a reading command prints its answer.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// For people: aligned text.
    Text,
    /// For scripts: JSON on one line.
    Json,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcksArg {
    #[value(name = "0", alias = "none")]
    None,
    #[value(name = "1", alias = "leader")]
    Leader,
    #[value(name = "all", alias = "-1")]
    All,
}

/// Stdin is read as bytes, as kcat does: each line (up to b'\n', which is
/// dropped; a '\r' before it is kept) is one message, whatever its bytes.
#[derive(Args, Debug)]
pub struct ProduceArgs {
    pub topic: String,
    /// Split each line at the first occurrence of S (as bytes) into key and value.
    #[arg(long, value_name = "S")]
    pub key_separator: Option<String>,
    /// Send every message to this partition (default: the partitioner decides).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Acknowledgements to wait for: 0, 1 (leader) or all.
    #[arg(long, env = "SHARDLOG_ACKS")]
    pub acks: Option<AcksArg>,
    #[arg(long)]
    pub linger_ms: Option<u64>,
    #[arg(long)]
    pub batch_bytes: Option<usize>,
    /// Idempotent producing, the default: each record stored once and in
    /// order across retries (the producer asks the broker for a producer id
    /// first). Kept for scripts written when it was off by default.
    #[arg(long, conflicts_with = "no_idempotence")]
    pub enable_idempotence: bool,
    /// Turn idempotent producing off [enable_idempotence = false].
    #[arg(long)]
    pub no_idempotence: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub file: ConfigFileArg,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The value only.
    Value,
    /// Key, separator, value.
    KeyValue,
    /// One JSON object per message: topic, partition, offset, timestamp_ms,
    /// key, value, headers. A key, value or header value that is UTF-8 is a
    /// string ("value": "..."); one that is not is base64 (standard, padded)
    /// under a `_base64` name instead ("value_base64": "...", "key_base64",
    /// "headers_base64": {name: ...}). "key" is null when there is no key.
    Json,
}

/// `--offset-reset`: the consumer's `auto.offset.reset`, with Kafka's names.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetResetArg {
    /// The first offset still in the log.
    Earliest,
    /// The log end: only records written from then on (the default, as in Kafka).
    Latest,
    /// No reset: fail.
    None,
}

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    pub topic: String,
    /// Start at the earliest offset (default: only new messages).
    #[arg(long, conflicts_with = "offset")]
    pub from_beginning: bool,
    /// Start at this offset. One outside the log (past its end, or before its
    /// start after retention) is handled by --offset-reset.
    #[arg(long)]
    pub offset: Option<u64>,
    /// What to do when the broker answers that a position is out of range
    /// (OffsetOutOfRange): start over at the earliest offset or the log end,
    /// saying so on stderr, or (none) fail with the error, exit status 1.
    #[arg(long, value_enum, default_value_t = OffsetResetArg::Latest)]
    pub offset_reset: OffsetResetArg,
    /// Read only this partition (default: all).
    #[arg(long, conflicts_with = "group")]
    pub partition: Option<u32>,
    /// Consume as a member of this consumer group: the group's members
    /// split the partitions; a partition starts at the group's committed
    /// offset (else the earliest with --from-beginning, the latest without);
    /// what was printed is committed every second and on SIGINT/SIGTERM,
    /// when the member leaves the group.
    #[arg(long, conflicts_with = "offset")]
    pub group: Option<String>,
    /// Static membership id (with --group): a restart within the session
    /// timeout gets the same partitions back with no rebalance.
    #[arg(long, requires = "group")]
    pub instance_id: Option<String>,
    /// Group session timeout in ms (with --group).
    #[arg(long, requires = "group")]
    pub session_timeout_ms: Option<u64>,
    /// Exit after printing this many messages.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Exit after this long without a message (default: follow forever).
    #[arg(long)]
    pub idle_timeout_ms: Option<u64>,
    #[arg(long, value_enum, default_value_t = Format::Value)]
    pub format: Format,
    /// Separator between key and value with `--format key-value`.
    #[arg(long, default_value = "\t")]
    pub key_separator: String,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub file: ConfigFileArg,
}

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// Group ids with their state, one per line.
    List {
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
    /// State and members, and per partition the committed offset, log end,
    /// lag and owning member.
    Describe {
        group: String,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
    /// Sets the group's committed offsets of a topic (every partition).
    /// Refused while the group has members: stop them first.
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        #[arg(long, group = "to")]
        to_earliest: bool,
        #[arg(long, group = "to")]
        to_latest: bool,
        #[arg(long, group = "to")]
        to_offset: Option<u64>,
        /// RFC 3339 time (2026-12-03T10:00:00Z) or milliseconds since the epoch.
        #[arg(long, group = "to")]
        to_datetime: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
    /// Deletes an empty group and its committed offsets.
    Delete {
        group: String,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        file: ConfigFileArg,
    },
}

#[derive(Subcommand, Debug)]
enum LogCommand {
    /// Print the batches (and with --records the records) of a segment file.
    Dump {
        file: PathBuf,
        #[arg(long)]
        records: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        // The broker runs its own threads; no tokio runtime around it.
        Command::Serve(args) => serve::run(*args),
        Command::Log(LogCommand::Dump { file, records }) => log_dump::run(&file, records),
        Command::Topic(cmd) => client_cmds::block_on(client_cmds::topic(cmd)),
        Command::Produce(args) => client_cmds::block_on(client_cmds::produce(args)),
        Command::Consume(args) => client_cmds::block_on(client_cmds::consume(args)),
        Command::Group(cmd) => client_cmds::block_on(group_cmds::group(cmd)),
        Command::Cluster(cmd) => client_cmds::block_on(cluster_cmds::cluster(cmd)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
