//! The Shardlog broker: a thread-per-core server over partitioned commit logs.
//!
//! Modules follow the data path (see ARCHITECTURE.md):
//! `net` → `dispatch` → `shard` → `partition` → `log`, plus `cluster`
//! (membership and controller, ZooKeeper or static),
//! plus `group` (consumer-group coordinator), `config` and `topics` (topic
//! metadata store).
//!
//! [`start`] brings a broker up and returns a handle; [`run`] is what
//! `shardlog serve` calls: start, wait for SIGINT/SIGTERM, stop gracefully.

pub mod cluster;
pub mod config;
pub mod dispatch;
pub mod fault;
pub mod group;
pub mod io;
pub mod join;
pub mod kafka;
pub mod log;
pub mod metrics;
pub mod net;
pub mod partition;
pub mod producer_ids;
pub mod replica;
pub mod shard;
mod signals;
pub mod topic_error;
pub mod topics;

use crate::config::BrokerConfig;
use crate::shard::{Endpoints, ShardContext, ShardMsg, MESH_CHANNEL_CAPACITY};
use crate::topics::{FileTopicStore, TopicStore, TopicTable};
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::ExecutorJoinHandle;
use glommio::{LocalExecutorBuilder, Placement};
use shardlog_schema::ShardId;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Why the broker could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Topics(#[from] topics::TopicsError),
    #[error("cannot listen on {addr} for {wanted_for}: {source}")]
    Listen {
        addr: SocketAddr,
        wanted_for: net::PortUse,
        #[source]
        source: std::io::Error,
    },
    /// Two uses of the broker ask for the same port.
    #[error("port {port} is wanted twice: by {first} and by {second}; give one of them another port")]
    PortCollision { port: u16, first: net::PortUse, second: net::PortUse },
    /// Another socket (another process, or another broker) listens there.
    #[error(
        "cannot listen on {addr} for {wanted_for}: port {} is already in use by {}",
        addr.port(),
        holder.as_deref().unwrap_or("another socket on this host")
    )]
    PortInUse { addr: SocketAddr, wanted_for: net::PortUse, holder: Option<String> },
    #[error("shard {shard} failed to start: {message}")]
    Shard { shard: usize, message: String },
    #[error("cannot start shard thread: {0}")]
    Thread(String),
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// How long shutdown waits for in-flight requests.
pub const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(10);
/// How often a shard checks for shutdown.
const SHUTDOWN_POLL: Duration = Duration::from_millis(50);

/// Where a started broker listens.
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    pub listen: SocketAddr,
    pub shard_ports: Vec<u16>,
    pub data_dir: PathBuf,
    /// The `/metrics` listener, when enabled.
    pub admin: Option<SocketAddr>,
    /// The Kafka listener, when enabled, and each shard's own Kafka port.
    pub kafka: Option<SocketAddr>,
    pub kafka_ports: Vec<u16>,
}

impl ReadyInfo {
    /// The line `shardlog serve` prints on stdout once it serves; scripts and
    /// tests parse it.
    #[must_use]
    pub fn ready_line(&self) -> String {
        let ports: Vec<String> = self.shard_ports.iter().map(u16::to_string).collect();
        let mut line = format!(
            "shardlog ready: listen={} shard_ports={} data_dir={}",
            self.listen,
            ports.join(","),
            self.data_dir.display()
        );
        if let Some(admin) = self.admin {
            line.push_str(&format!(" admin={admin}"));
        }
        if let Some(kafka) = self.kafka {
            let ports: Vec<String> = self.kafka_ports.iter().map(u16::to_string).collect();
            line.push_str(&format!(" kafka={kafka} kafka_ports={}", ports.join(",")));
        }
        line
    }
}

/// A running broker.
pub struct BrokerHandle {
    pub ready: ReadyInfo,
    stop: Arc<AtomicBool>,
    threads: Vec<ExecutorJoinHandle<Result<(), String>>>,
    membership: Box<dyn cluster::Membership>,
    /// Cluster mode: the controlled-shutdown wait at [`Self::shutdown`].
    controlled_shutdown: Option<Duration>,
}

impl BrokerHandle {
    /// What this broker knows of its cluster (itself alone without ZooKeeper).
    #[must_use]
    pub fn cluster_view(&self) -> cluster::ClusterView {
        self.membership.view()
    }

    /// Whether this broker is the controller now.
    #[must_use]
    pub fn is_controller(&self) -> bool {
        self.membership.is_controller()
    }

    /// Stops accepting, drains in-flight requests, flushes and closes every
    /// log (writing the clean-shutdown markers), and joins the shards.
    pub fn shutdown(self) -> Result<(), BrokerError> {
        // In a cluster, leaderships move to other in-sync replicas first.
        if let Some(timeout) = self.controlled_shutdown.filter(|t| !t.is_zero()) {
            let t0 = Instant::now();
            match self.membership.controlled_shutdown(timeout) {
                Ok(()) => tracing::info!(
                    took_ms = t0.elapsed().as_millis() as u64,
                    "controlled shutdown: this broker leads no partition now"
                ),
                Err(e) => tracing::warn!(error = %e, "controlled shutdown incomplete; stopping anyway"),
            }
        }
        self.stop.store(true, Ordering::Release);
        let mut first_error = None;
        for (shard, t) in self.threads.into_iter().enumerate() {
            let result = t.join().map_err(|e| format!("shard thread failed: {e}")).and_then(|r| r);
            if let Err(message) = result {
                tracing::error!(shard, error = %message, "shard stopped with an error");
                first_error.get_or_insert(BrokerError::Shard { shard, message });
            }
        }
        // Leave the cluster last: the session closes and the registration
        // (and the controller znode, if held) goes at once.
        self.membership.shutdown();
        first_error.map_or(Ok(()), Err)
    }
}

/// `shardlog serve`: starts, prints the ready line, serves until SIGINT or
/// SIGTERM, then shuts down gracefully. A second signal during the shutdown
/// exits at once (`_exit`, status 128 + the signal: 130 for SIGINT, 143 for
/// SIGTERM), as a SIGKILL would: what was acknowledged is kept and the next
/// start recovers (`log::recovery`).
pub fn run(config: BrokerConfig) -> Result<(), BrokerError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(BrokerError::Signals)?;
    let handle = start(config)?;
    println!("{}", handle.ready.ready_line());
    // SAFETY: `_exit` ends the process without running exit handlers or
    // destructors while the shard threads still run: like a SIGKILL.
    signals::until_signalled(signals, || handle.shutdown(), |signal| unsafe { libc::_exit(128 + signal) })?;
    tracing::info!("stopped cleanly");
    Ok(())
}

fn check_config(config: &BrokerConfig) -> Result<(), BrokerError> {
    let l = &config.limits;
    if config.shards == 0 || config.shards > 256 {
        return Err(BrokerError::Config(format!("shards must be 1 to 256, not {}", config.shards)));
    }
    if l.request_payload_bytes_max as usize > l.shard_buffered_bytes_max {
        return Err(BrokerError::Config(format!(
            "request payload limit ({}) must not exceed the shard buffer budget ({})",
            l.request_payload_bytes_max, l.shard_buffered_bytes_max
        )));
    }
    if l.in_flight_per_connection_max == 0 || l.connections_max == 0 {
        return Err(BrokerError::Config("connection and in-flight limits must be at least 1".into()));
    }
    let g = &config.group;
    if g.session_timeout_min > g.session_timeout_max || g.members_max == 0 {
        return Err(BrokerError::Config(format!(
            "group.min.session.timeout.ms ({} ms) must not exceed group.max.session.timeout.ms ({} ms), and group.max.size must be at least 1",
            g.session_timeout_min.as_millis(),
            g.session_timeout_max.as_millis()
        )));
    }
    Ok(())
}

enum Startup {
    Serving,
    Failed { shard: usize, message: String },
}

/// Starts a broker and returns once every shard serves.
///
/// Every port (public, one per shard, admin) is bound by this thread before
/// any shard starts (`net::bind_ports`): two uses asking for one port, or a
/// port another process listens on, fail here with an error naming both.
pub fn start(config: BrokerConfig) -> Result<BrokerHandle, BrokerError> {
    check_config(&config)?;
    raise_open_files_limit();
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|source| BrokerError::DataDir { path: config.data_dir.clone(), source })?;
    let data_dir = config
        .data_dir
        .canonicalize()
        .map_err(|source| BrokerError::DataDir { path: config.data_dir.clone(), source })?;
    let config = BrokerConfig { data_dir, ..config };
    // In a cluster, topics come from ZooKeeper (`shard::cluster`), not
    // from `topics.json`.
    let topics = match &config.cluster {
        None => with_offsets_topic(&config, FileTopicStore::new(&config.data_dir))?,
        Some(_) => {
            let local = FileTopicStore::new(&config.data_dir).load()?;
            if !local.is_empty() {
                tracing::warn!(
                    topics = local.len(),
                    "{} lists topics of a broker that ran alone; in a cluster they are not served (their data stays on disk)",
                    topics::TOPICS_FILE
                );
            }
            TopicTable::new()
        }
    };
    // Replicated partitions' high watermarks as they were (a hint, read
    // before any shard runs; see `replica::checkpoint`).
    let restored_hw = match &config.cluster {
        Some(_) => Arc::new(replica::checkpoint::load(&config.data_dir, config.shards)),
        None => Arc::default(),
    };
    let bound = net::bind_ports_settling(&config)?;
    let (public, shards) = (bound.public_addr, config.shards);
    let shard_ports: Vec<u16> = bound.shards.iter().map(|(_, port)| *port).collect();
    let admin = bound.admin.as_ref().map(|(_, addr)| *addr);
    let mut admin_socket = bound.admin.map(|(socket, _)| socket);
    let kafka_addr = bound.kafka.as_ref().map(|k| k.addr);
    let kafka_ports: Vec<u16> =
        bound.kafka.as_ref().map(|k| k.shards.iter().map(|(_, p)| *p).collect()).unwrap_or_default();
    let mut kafka_sockets: Vec<Option<(socket2::Socket, socket2::Socket)>> = match bound.kafka {
        Some(k) => k.shared.into_iter().zip(k.shards).map(|(shared, (own, _))| Some((shared, own))).collect(),
        None => (0..shards).map(|_| None).collect(),
    };
    let host = config.advertised_host.clone().unwrap_or_else(|| match public.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        ip => ip.to_string(),
    });
    let me = cluster::BrokerRegistration {
        id: config.broker_id,
        host: host.clone(),
        port: public.port(),
        shards,
        shard_ports: shard_ports.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        rack: config.cluster.as_ref().and_then(|c| c.rack.clone()),
        kafka_ports: match (kafka_addr, config.kafka_advertise) {
            (None, _) => Vec::new(),
            (Some(_), config::KafkaAdvertise::PerShard) => kafka_ports.clone(),
            (Some(shared), config::KafkaAdvertise::Shared) => vec![shared.port()],
        },
    };
    // Registered before any shard starts: a duplicate id refuses to start.
    let membership: Box<dyn cluster::Membership> = match &config.cluster {
        None => Box::new(cluster::StaticMembership::new(me)),
        Some(c) => {
            tracing::info!(zookeeper = %c.zookeeper, broker = config.broker_id, "joining the cluster");
            Box::new(cluster::zk::ZkMembership::start(c, me)?)
        }
    };
    let link = membership.link();
    let stop = Arc::new(AtomicBool::new(false));
    let health = metrics::Health::new(config.shards);
    let mesh = MeshBuilder::full(shards, MESH_CHANNEL_CAPACITY);
    let (status_tx, status_rx) = mpsc::channel::<Startup>();
    let mut threads = Vec::with_capacity(shards);
    // Each shard joins the mesh only once all are spawned: if spawning one
    // fails, dropping these senders releases the others.
    let mut go_txs = Vec::with_capacity(shards);
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    for (i, (public_socket, (own_socket, _))) in bound.public.into_iter().zip(bound.shards).enumerate() {
        let (go_tx, go) = mpsc::channel::<()>();
        go_txs.push(go_tx);
        let placement = match cores.get(i % cores.len().max(1)) {
            Some(core) if config.pin_cores => Placement::Fixed(core.id),
            _ => Placement::Unbound,
        };
        let spec = ShardSpec {
            id: i,
            config: config.clone(),
            public_port: public.port(),
            shard_ports: shard_ports.clone(),
            listeners: Listeners {
                public: public_socket,
                own: own_socket,
                admin: if i == 0 { admin_socket.take() } else { None },
                kafka: kafka_sockets[i].take(),
            },
            kafka_ports: kafka_ports.clone(),
            kafka_port: kafka_addr.map_or(0, |a| a.port()),
            host: host.clone(),
            topics: topics.clone(),
            restored_hw: restored_hw.clone(),
            cluster: link.clone(),
            mesh: mesh.clone(),
            status: status_tx.clone(),
            go,
            stop: stop.clone(),
            health: health.clone(),
        };
        let status = status_tx.clone();
        let t = LocalExecutorBuilder::new(placement)
            .name(&format!("shard-{i}"))
            .spawn(move || async move {
                let r = shard_main(spec).await;
                if let Err(message) = &r {
                    let _gone = status.send(Startup::Failed { shard: i, message: message.clone() });
                }
                r
            })
            .map_err(|e| BrokerError::Thread(executor_error_hint(&e)))?;
        threads.push(t);
    }
    drop(status_tx);
    for tx in go_txs {
        let _exited = tx.send(());
    }
    if let Err(e) = wait_serving(&status_rx, shards) {
        // Tell the shards that did start to stop, and join them all.
        stop.store(true, Ordering::Release);
        for t in threads {
            let _ignored = t.join();
        }
        return Err(e);
    }
    let ready = ReadyInfo {
        listen: public,
        shard_ports,
        data_dir: config.data_dir.clone(),
        admin,
        kafka: kafka_addr,
        kafka_ports,
    };
    tracing::info!(listen = %public, shard_ports = ?ready.shard_ports, shards, topics = topics.len(), "broker serving");
    let controlled_shutdown = config.cluster.as_ref().map(|c| c.controlled_shutdown_timeout);
    Ok(BrokerHandle { ready, stop, threads, membership, controlled_shutdown })
}

/// Loads the topic table, creating the internal `__consumer_offsets` topic
/// (compacted; `offsets.topic.num.partitions` partitions) on first start.
fn with_offsets_topic(config: &BrokerConfig, store: FileTopicStore) -> Result<TopicTable, BrokerError> {
    use shardlog_schema::types::OFFSETS_TOPIC;
    let mut topics = store.load()?;
    if let Some(meta) = topics.get_mut(OFFSETS_TOPIC) {
        // Created by a version without compaction: compact it from now on.
        if !meta.config.cleanup_policy.compacts() {
            meta.config.cleanup_policy = config::CleanupPolicy::Compact;
            store.store_blocking(&topics)?;
            tracing::info!("{OFFSETS_TOPIC} now has cleanup.policy=compact");
        }
        return Ok(topics);
    }
    let partitions = config.group.offsets_topic_partitions;
    if partitions == 0 || partitions > topics::TOPIC_PARTITIONS_MAX {
        return Err(BrokerError::Config(format!(
            "offsets.topic.num.partitions must be 1 to {}, not {partitions}",
            topics::TOPIC_PARTITIONS_MAX
        )));
    }
    let segment_bytes = config.group.offsets_topic_segment_bytes;
    if segment_bytes < config::SEGMENT_BYTES_MIN {
        return Err(BrokerError::Config(format!(
            "offsets.topic.segment.bytes must be at least {}, not {segment_bytes}",
            config::SEGMENT_BYTES_MIN
        )));
    }
    topics.insert(
        OFFSETS_TOPIC.to_string(),
        topics::TopicMeta {
            name: OFFSETS_TOPIC.to_string(),
            partitions,
            config: group::offsets_topic_config(config),
        },
    );
    store.store_blocking(&topics)?;
    tracing::info!(partitions, "created the internal topic {OFFSETS_TOPIC}");
    Ok(topics)
}

/// Waits until every shard serves, or for the first that failed.
fn wait_serving(status_rx: &mpsc::Receiver<Startup>, shards: usize) -> Result<(), BrokerError> {
    for _ in 0..shards {
        match status_rx.recv() {
            Ok(Startup::Serving) => {}
            Ok(Startup::Failed { shard, message }) => return Err(BrokerError::Shard { shard, message }),
            Err(_) => return Err(BrokerError::Thread("a shard exited during start-up".into())),
        }
    }
    Ok(())
}

/// A shard's listening sockets, bound by `start` (`net::bind_ports`).
struct Listeners {
    public: socket2::Socket,
    own: socket2::Socket,
    /// Shard 0 only, with `--admin-listen`.
    admin: Option<socket2::Socket>,
    /// With `--kafka-listen`: the shared Kafka socket and the shard's own.
    kafka: Option<(socket2::Socket, socket2::Socket)>,
}

struct ShardSpec {
    id: usize,
    config: BrokerConfig,
    public_port: u16,
    shard_ports: Vec<u16>,
    /// Each shard's own Kafka port (empty without `--kafka-listen`).
    kafka_ports: Vec<u16>,
    /// The shared Kafka port (0 without `--kafka-listen`).
    kafka_port: u16,
    listeners: Listeners,
    host: String,
    topics: TopicTable,
    /// Cluster mode: the high-watermark checkpoint as loaded.
    restored_hw: Arc<replica::checkpoint::HighWatermarks>,
    /// Cluster mode: the control thread's metadata and requests.
    cluster: Option<cluster::ClusterLink>,
    mesh: MeshBuilder<ShardMsg, glommio::channels::channel_mesh::Full>,
    status: mpsc::Sender<Startup>,
    /// Start-up only: every shard was spawned (closed: start-up aborted).
    go: mpsc::Receiver<()>,
    stop: Arc<AtomicBool>,
    /// Shards serving, for the admin port's `/readyz`.
    health: metrics::Health,
}

async fn shard_main(spec: ShardSpec) -> Result<(), String> {
    let id = spec.id;
    let public = net::into_listener(spec.listeners.public);
    let own = net::into_listener(spec.listeners.own);
    let shard_ports = spec.shard_ports;
    // Start-up only: wait (blocking this not-yet-serving thread) until every
    // shard exists, so that joining the mesh cannot wait for one never spawned.
    spec.go.recv().map_err(|_| "start-up aborted".to_string())?;
    let (senders, receivers) =
        spec.mesh.join().await.map_err(|e| format!("cannot join the shard mesh: {e}"))?;
    let store: Option<Box<dyn TopicStore>> =
        (id == 0).then(|| Box::new(FileTopicStore::new(&spec.config.data_dir)) as Box<dyn TopicStore>);
    let endpoints = Endpoints {
        host: spec.host,
        public_port: spec.public_port,
        shard_ports,
        kafka_ports: spec.kafka_ports,
        kafka_port: spec.kafka_port,
    };
    let config = Rc::new(spec.config);
    let splicer = match config.fetch_path {
        config::FetchPath::Plain => None,
        config::FetchPath::Splice => match io::splice::Splicer::new() {
            Ok(s) => Some(s),
            Err(e) => {
                if id == 0 {
                    tracing::warn!(error = %e, "io_uring splice unavailable: fetches use read + send");
                }
                None
            }
        },
    };
    let ctx = ShardContext::new(
        ShardId(id as u16),
        config.clone(),
        endpoints,
        senders,
        store,
        splicer,
        spec.cluster,
    );
    ctx.spawn_mesh_receivers(receivers);
    *ctx.restored_hw.borrow_mut() = spec
        .restored_hw
        .iter()
        .filter(|((topic, p), _)| ctx.owner(topic, *p) == ctx.id)
        .map(|(k, hw)| (k.clone(), *hw))
        .collect();
    // The admin port answers from the start: `/readyz` says 503 until every
    // shard has recovered its logs and accepts.
    let admin = spec.listeners.admin.map(|socket| {
        glommio::spawn_local(metrics::admin_loop(
            ctx.clone(),
            net::into_listener(socket),
            spec.health.clone(),
        ))
    });
    for meta in spec.topics.into_values() {
        ctx.apply_topic(meta, false).await.map_err(|e| e.to_string())?;
    }
    // A cluster's partitions placed here open (and recover) before serving.
    ctx.apply_current_cluster().await;
    ctx.groups.load_owned(&ctx).await?;
    let follow = glommio::spawn_local(ctx.clone().follow_cluster());
    let groups = glommio::spawn_local(group_loop(ctx.clone()));
    let accept_public = glommio::spawn_local(net::accept_loop(ctx.clone(), public, "public"));
    let accept_own = glommio::spawn_local(net::accept_loop(ctx.clone(), own, "shard"));
    let retention = glommio::spawn_local(retention_loop(ctx.clone()));
    let recovery_points = glommio::spawn_local(recovery_point_loop(ctx.clone()));
    let probe = glommio::spawn_local(metrics::probe::run(ctx.clone()));
    let kafka = spec.listeners.kafka.map(|(shared, own)| {
        let (shared, own) = (net::into_listener(shared), net::into_listener(own));
        glommio::spawn_local(futures_lite::future::zip(
            kafka::accept_loop(ctx.clone(), shared, "kafka"),
            kafka::accept_loop(ctx.clone(), own, "kafka-shard"),
        ))
    });
    spec.health.shard_serving();
    spec.status.send(Startup::Serving).map_err(|e| e.to_string())?;
    while !spec.stop.load(Ordering::Acquire) {
        glommio::timer::sleep(SHUTDOWN_POLL).await;
    }
    spec.health.shard_stopping();
    if let Some(admin) = admin {
        admin.cancel().await;
    }
    if let Some(kafka) = kafka {
        kafka.cancel().await;
    }
    shutdown_shard(&ctx, [accept_public, accept_own, retention, recovery_points, probe, groups, follow]).await
}

/// Expires group members and ends rebalances at their deadlines.
async fn group_loop(ctx: Rc<ShardContext>) {
    loop {
        glommio::timer::sleep(group::TICK).await;
        ctx.groups.tick(&ctx).await;
    }
}

async fn shutdown_shard(ctx: &Rc<ShardContext>, tasks: [glommio::Task<()>; 7]) -> Result<(), String> {
    ctx.shutting_down.set(true);
    for t in tasks {
        t.cancel().await;
    }
    ctx.groups.stop();
    for p in ctx.owned_partitions() {
        p.data.notify();
    }
    let deadline = Instant::now() + SHUTDOWN_DRAIN_MAX;
    while ctx.in_flight.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    if ctx.in_flight.get() > 0 {
        tracing::warn!(shard = %ctx.id, in_flight = ctx.in_flight.get(), "stopping with requests still in flight");
    }
    ctx.shutdown_sockets();
    if ctx.cluster_link().is_some() {
        if let Err(e) = ctx.write_hw_checkpoint().await {
            tracing::warn!(shard = %ctx.id, error = %e, "cannot write the high-watermark checkpoint");
        }
    }
    let mut first_error = None;
    for p in ctx.owned_partitions() {
        if let Err(e) = p.log.close().await {
            tracing::error!(topic = %p.topic, partition = p.id, error = %e, "cannot close partition log");
            first_error.get_or_insert(e.to_string());
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Enforces retention on every owned partition at the configured interval,
/// and compacts the partitions of `cleanup.policy=compact` topics when
/// their dirty share is due (`log::compact`).
async fn retention_loop(ctx: Rc<ShardContext>) {
    use tracing::Instrument;
    loop {
        glommio::timer::sleep(ctx.config.retention_check_interval).await;
        let now_ms = now_ms();
        for p in ctx.owned_partitions() {
            let span = tracing::info_span!("partition", topic = %p.topic, partition = p.id);
            match p.log.enforce_retention(now_ms).instrument(span.clone()).await {
                Ok(o) if o.segments_deleted > 0 => tracing::info!(
                    topic = %p.topic, partition = p.id, segments = o.segments_deleted, bytes = o.bytes_deleted,
                    start_offset = p.log.start_offset().0, "retention deleted segments"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(topic = %p.topic, partition = p.id, error = %e, "retention failed"),
            }
            if let Err(e) = p.log.compact(now_ms).instrument(span).await {
                tracing::error!(topic = %p.topic, partition = p.id, error = %e, "compaction failed");
            }
            glommio::yield_if_needed().await;
        }
    }
}

/// Writes each owned partition's recovery point at the configured interval
/// (`log::recovery_point`); a partition that wrote little since its last
/// one is skipped without I/O.
async fn recovery_point_loop(ctx: Rc<ShardContext>) {
    use tracing::Instrument;
    let every = ctx.config.recovery_point_interval;
    if every.is_zero() {
        return;
    }
    loop {
        glommio::timer::sleep(every).await;
        for p in ctx.owned_partitions() {
            let span = tracing::info_span!("partition", topic = %p.topic, partition = p.id);
            if let Err(e) = p.log.write_recovery_point().instrument(span).await {
                tracing::warn!(topic = %p.topic, partition = p.id, error = %e, "cannot write the recovery point");
            }
            glommio::yield_if_needed().await;
        }
    }
}

/// Partition logs keep files open (within each shard's file budget, which
/// is derived from this limit), so raise the open-files limit at start: to the kernel's maximum
/// (`fs.nr_open`, capped at 2^20) where privileges allow, else to the hard limit.
fn raise_open_files_limit() {
    const WANTED_MAX: libc::rlim_t = 1 << 20;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(lim.rlim_max);
    let target = nr_open.min(WANTED_MAX).max(lim.rlim_max);
    for to in [target, lim.rlim_max] {
        if to <= lim.rlim_cur {
            return;
        }
        let wanted = libc::rlimit { rlim_cur: to, rlim_max: to.max(lim.rlim_max) };
        // SAFETY: `wanted` is a valid rlimit; raising beyond the hard limit
        // needs CAP_SYS_RESOURCE and fails cleanly without it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            tracing::debug!(from = lim.rlim_cur, to, "raised the open-files limit");
            return;
        }
    }
    tracing::warn!(
        limit = lim.rlim_cur,
        "cannot raise the open-files limit; many partitions may fail to open"
    );
}

/// glommio registers its I/O buffers with io_uring, which counts against
/// `RLIMIT_MEMLOCK` for users without CAP_IPC_LOCK: say so when that fails
/// (ENOMEM, recognised by its OS error number, not by message text).
fn executor_error_hint(e: &glommio::GlommioError<()>) -> String {
    let out_of_memory = match e {
        glommio::GlommioError::IoError(io) | glommio::GlommioError::EnhancedIoError { source: io, .. } => {
            io.raw_os_error() == Some(libc::ENOMEM) || io.kind() == std::io::ErrorKind::OutOfMemory
        }
        _ => false,
    };
    if out_of_memory {
        format!(
            "{e} (each shard locks its io_uring buffers: run as root or raise the memlock limit, \
             `ulimit -l`, to at least 16 MiB per shard; see README Requirements)"
        )
    } else {
        e.to_string()
    }
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::executor_error_hint;

    #[test]
    fn executor_hint_by_error_number() {
        let enomem = glommio::GlommioError::IoError(std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(executor_error_hint(&enomem).contains("ulimit -l"));
        let eagain = glommio::GlommioError::IoError(std::io::Error::from_raw_os_error(libc::EAGAIN));
        assert!(!executor_error_hint(&eagain).contains("ulimit -l"));
    }
}
