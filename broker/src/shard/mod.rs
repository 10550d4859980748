//! A shard: one pinned glommio executor that owns a set of partitions.
//!
//! ```text
//!   main thread ── spawns ──> shard 0 ... shard N-1   (one per core, pinned)
//!                               │   full channel mesh   │
//!                               └──── ShardMsg ─────────┘
//! ```
//!
//! **Invariants**: a partition is owned by exactly one shard
//! (`shardlog_schema::types::shard_for`), and all its state lives on that
//! shard's thread. Shards share nothing mutable; they talk only through the
//! bounded channel mesh wired at start-up. Shard 0 is the topic-metadata
//! writer ("controller shard"); every shard keeps its own copy of the table.
//! **API boundary**: `shard` never parses frames (that is `net`/`dispatch`).

mod cluster;

use crate::cluster::metadata::ClusterMetadata;
use crate::cluster::ClusterLink;
use crate::config::{BrokerConfig, TopicConfig};
use crate::join::join_all;
use crate::metrics::Stage;
use crate::partition::{Partition, PartitionError};
use crate::topic_error::{TopicOpError, TopicOutcome};
use crate::topics::{partition_dir, TopicMeta, TopicStore, TopicTable};
use glommio::channels::channel_mesh::{Receivers, Senders};
use glommio::channels::local_channel;
use glommio::sync::Semaphore;
use shardlog_schema::types::shard_for;
use shardlog_schema::{ErrorCode, PartitionId, ShardId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Capacity of each mesh channel (messages, per direction, per pair).
pub const MESH_CHANNEL_CAPACITY: usize = 1024;

/// Data returned by a partition read that crossed the mesh (it is copied,
/// since file handles cannot leave their shard).
#[derive(Debug)]
pub struct RemoteRead {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub bytes: Vec<u8>,
}

/// A topic to create, as asked by a client.
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub configs: Vec<(String, String)>,
}

/// Owned partitions: topic → slot per partition number (`None`: another shard's).
type PartitionTable = HashMap<Rc<str>, Vec<Option<Rc<Partition>>>>;

/// What a produce waits for before it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// The leader's append (acks 0 and 1).
    Leader,
    /// Every in-sync replica (acks -1), `timeout` at most.
    All { timeout: std::time::Duration },
}

impl Acks {
    /// From a request's `acks` and `timeout_ms`.
    #[must_use]
    pub fn from_request(acks: i16, timeout_ms: u64) -> Acks {
        if acks < 0 {
            Acks::All { timeout: std::time::Duration::from_millis(timeout_ms) }
        } else {
            Acks::Leader
        }
    }
}

/// A request from one shard to another.
#[derive(Debug)]
pub enum ShardOp {
    Produce {
        topic: String,
        partition: u32,
        batches: Vec<u8>,
        acks: Acks,
    },
    Fetch {
        topic: String,
        partition: u32,
        offset: u64,
        max_bytes: u32,
    },
    /// Completes when the partition's end passes `offset` or after `timeout`.
    WaitData {
        topic: String,
        partition: u32,
        offset: u64,
        timeout: Duration,
    },
    ListOffset {
        topic: String,
        partition: u32,
        timestamp: i64,
    },
    /// To shard 0: validate, persist and broadcast.
    CreateTopics(Vec<TopicSpec>),
    /// To shard 0: persist and broadcast.
    DeleteTopics(Vec<String>),
    /// To every shard: add a topic and open the partitions it owns.
    ApplyTopic(TopicMeta),
    /// To every shard: close and delete the partitions it owns.
    RemoveTopic(String),
    /// A snapshot of the shard's counters.
    Metrics,
    /// To a group's coordinating shard (`group::route`).
    Group(Box<crate::group::api::GroupRequest>),
    /// The groups this shard coordinates.
    ListGroups,
    /// To shard 0: a new idempotent producer id (`producer_ids`).
    InitProducerId,
}

/// Produce outcome across the mesh.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub base_offset: u64,
    pub log_start_offset: u64,
    pub append_time_ms: i64,
}

#[derive(Debug)]
pub enum ShardReply {
    Produce(Result<Appended, PartitionError>),
    Fetch(Result<RemoteRead, (PartitionError, i64, i64)>),
    Waited,
    ListOffset(Result<(i64, i64), PartitionError>),
    TopicResults(Vec<TopicOutcome>),
    Done(Result<(), TopicOpError>),
    // Boxed: a snapshot is most of a reply's size, and it is rare.
    Metrics(Box<crate::metrics::MetricsSnapshot>),
    Group(Box<crate::group::api::GroupResponse>),
    Groups(Vec<crate::group::api::ListedGroup>),
    ProducerId(Result<i64, PartitionError>),
    /// The receiving shard is stopping.
    Unavailable,
}

#[derive(Debug)]
pub enum ShardMsg {
    Request { id: u64, from: usize, op: ShardOp },
    Reply { id: u64, reply: ShardReply },
}

/// Addresses the broker advertises.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub host: String,
    pub public_port: u16,
    pub shard_ports: Vec<u16>,
    /// Each shard's own Kafka port (empty without `--kafka-listen`).
    pub kafka_ports: Vec<u16>,
    /// The Kafka port every shard accepts on (0 without `--kafka-listen`).
    pub kafka_port: u16,
}

/// Everything one shard owns. Shared as `Rc` by the tasks of that shard only.
pub struct ShardContext {
    pub id: ShardId,
    pub shard_count: u16,
    pub config: Rc<BrokerConfig>,
    pub endpoints: Endpoints,
    pub topics: RefCell<TopicTable>,
    /// Partitions this shard owns: topic → index by partition number.
    partitions: RefCell<PartitionTable>,
    mesh: Senders<ShardMsg>,
    /// Requests to each shard (by shard id), queued in call order and sent
    /// by one pump task per destination (`spawn_mesh_receivers`): a full
    /// mesh channel makes callers wait in line, never overtake each other.
    outbox: Vec<local_channel::LocalSender<(u64, ShardOp)>>,
    outbox_rx: RefCell<Vec<local_channel::LocalReceiver<(u64, ShardOp)>>>,
    pending: RefCell<HashMap<u64, local_channel::LocalSender<ShardReply>>>,
    next_request_id: Cell<u64>,
    /// Requests of this shard's connections not yet answered: being
    /// handled, or their answer not yet written (`net::Unanswered`).
    pub in_flight: Cell<usize>,
    pub connections: Cell<usize>,
    /// Sockets of open connections, shut down when the shard stops so that
    /// peers see the connection end even if the process lives on.
    pub sockets: RefCell<HashMap<u64, std::os::fd::RawFd>>,
    next_socket_id: Cell<u64>,
    pub shutting_down: Cell<bool>,
    /// Produce payload bytes held by this shard's connections.
    pub buffered_bytes: Rc<Semaphore>,
    pub metrics: crate::metrics::ShardMetrics,
    /// The consumer groups this shard coordinates (`group/`).
    pub groups: crate::group::Coordinator,
    /// Shard-wide log settings: the hot-tail budget shared by all its logs.
    log_options: crate::log::LogOptions,
    /// The splice engine, when fetches splice (see `config::FetchPath`).
    pub splicer: Option<Rc<crate::io::splice::Splicer>>,
    /// Only on shard 0.
    store: Option<Box<dyn TopicStore>>,
    /// Shard 0: one topic change at a time, so that a change read-modify-
    /// writes the table while no other persists or broadcasts (both await).
    topic_changes: Semaphore,
    /// Used on shard 0 only (`producer_ids`).
    pub producer_ids: crate::producer_ids::Allocator,
    /// Cluster mode: the control thread's metadata and requests.
    cluster: Option<ClusterLink>,
    /// Cluster mode: the snapshot last applied here (`shard::cluster`).
    cluster_md: RefCell<Option<Arc<ClusterMetadata>>>,
    /// Cluster mode: an `__consumer_offsets` creation is being asked for.
    requested_offsets_topic: Rc<Cell<bool>>,
    /// Cluster mode: high watermarks from the checkpoint, taken by each
    /// partition as it opens at start-up (`replica::checkpoint`).
    pub restored_hw: RefCell<crate::replica::checkpoint::HighWatermarks>,
    /// Cluster mode: the checkpoint this shard wrote last.
    pub written_hw: RefCell<Vec<(String, u32, u64)>>,
}

impl ShardContext {
    pub fn new(
        id: ShardId,
        config: Rc<BrokerConfig>,
        endpoints: Endpoints,
        mesh: Senders<ShardMsg>,
        store: Option<Box<dyn TopicStore>>,
        splicer: Option<Rc<crate::io::splice::Splicer>>,
        cluster: Option<ClusterLink>,
    ) -> Rc<ShardContext> {
        let shard_count = u16::try_from(config.shards).expect("shard count fits u16");
        let limit = crate::log::process_files_limit();
        let files_max =
            config.open_files_shard_max.unwrap_or_else(|| crate::log::shard_files_max(limit, config.shards));
        if id.0 == 0 {
            tracing::info!(
                open_files_limit = limit,
                open_files_shard_max = files_max,
                shards = config.shards,
                "partition files per shard beyond this budget are closed least recently used first"
            );
        }
        let log_options = crate::log::LogOptions {
            hot_tail: crate::log::HotTailBudget::new(config.hot_tail_shard_bytes),
            hot_tail_log_bytes_max: config.hot_tail_partition_bytes,
            files: crate::log::FileBudget::new(files_max),
            direct_reads: splicer.is_none(),
            gate: Rc::new(crate::log::WriteGate::new(config.small_writes_in_flight_shard)),
            ..Default::default()
        };
        let (outbox, outbox_rx) = (0..config.shards).map(|_| local_channel::new_unbounded()).unzip();
        let (config_data_dir, config_broker_id) = (config.data_dir.clone(), config.broker_id);
        Rc::new(ShardContext {
            id,
            shard_count,
            buffered_bytes: Rc::new(Semaphore::new(config.limits.shard_buffered_bytes_max as u64)),
            config,
            endpoints,
            topics: RefCell::default(),
            partitions: RefCell::default(),
            mesh,
            outbox,
            outbox_rx: RefCell::new(outbox_rx),
            pending: RefCell::default(),
            next_request_id: Cell::new(0),
            in_flight: Cell::new(0),
            connections: Cell::new(0),
            sockets: RefCell::default(),
            next_socket_id: Cell::new(0),
            shutting_down: Cell::new(false),
            metrics: crate::metrics::ShardMetrics::default(),
            groups: crate::group::Coordinator::default(),
            splicer,
            log_options,
            store,
            topic_changes: Semaphore::new(1),
            producer_ids: crate::producer_ids::Allocator::new(&config_data_dir, config_broker_id),
            cluster,
            cluster_md: RefCell::default(),
            requested_offsets_topic: Rc::default(),
            restored_hw: RefCell::default(),
            written_hw: RefCell::default(),
        })
    }

    /// Registers an open connection's socket; returns its id.
    pub fn track_socket(&self, fd: std::os::fd::RawFd) -> u64 {
        let id = self.next_socket_id.get();
        self.next_socket_id.set(id + 1);
        self.sockets.borrow_mut().insert(id, fd);
        id
    }

    /// Shuts down every open connection (both directions).
    pub fn shutdown_sockets(&self) {
        for fd in self.sockets.borrow().values() {
            // SAFETY: the fd is registered only while its connection task
            // owns the socket (`net::TrackedSocket` unregisters it when the
            // task ends or is dropped unfinished); shutdown passes no memory.
            unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
        }
    }

    /// The open-file budget shared by this shard's partition logs.
    pub fn log_files(&self) -> &Rc<crate::log::FileBudget> {
        &self.log_options.files
    }

    /// The shard's storage counters (fdatasync latency).
    pub fn log_io_stats(&self) -> &crate::log::IoStats {
        &self.log_options.io_stats
    }

    /// The shard's gate on small segment writes.
    pub fn log_write_gate(&self) -> &crate::log::WriteGate {
        &self.log_options.gate
    }

    /// The shard's hot-tail budget.
    pub fn hot_tail(&self) -> &crate::log::HotTailBudget {
        &self.log_options.hot_tail
    }

    /// The shard that owns a partition.
    pub fn owner(&self, topic: &str, partition: u32) -> ShardId {
        shard_for(topic, PartitionId(partition), self.shard_count)
    }

    /// A partition this shard owns.
    pub fn partition(&self, topic: &str, partition: u32) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(topic)?.get(partition as usize)?.clone()
    }

    /// All owned partitions (for retention, shutdown, metrics).
    pub fn owned_partitions(&self) -> Vec<Rc<Partition>> {
        self.partitions.borrow().values().flatten().flatten().cloned().collect()
    }

    /// Whether the topic exists and has this partition: `None` when fine.
    pub fn check_partition(&self, topic: &str, partition: u32) -> Option<PartitionError> {
        match self.topics.borrow().get(topic) {
            None => Some(PartitionError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("topic `{topic}` does not exist"),
            )),
            Some(t) if partition >= t.partitions => Some(PartitionError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("topic `{topic}` has partitions 0..{}, not {partition}", t.partitions),
            )),
            Some(_) => None,
        }
    }

    /// Opens the partitions of `meta` this shard owns and records the topic.
    /// `created`: the topic is being created now, so a failure removes what
    /// this shard made of it (partition logs and directories); at start-up
    /// (`false`) a failure leaves every file as it is.
    pub async fn apply_topic(&self, meta: TopicMeta, created: bool) -> Result<(), TopicOpError> {
        self.open_topic(meta, created, |_| true).await
    }

    /// [`Self::apply_topic`] for the partitions `here` accepts (in a
    /// cluster, those placed on this broker).
    async fn open_topic(
        &self,
        meta: TopicMeta,
        created: bool,
        here: impl Fn(u32) -> bool,
    ) -> Result<(), TopicOpError> {
        let name: Rc<str> = Rc::from(meta.name.as_str());
        let mut slots: Vec<Option<Rc<Partition>>> = vec![None; meta.partitions as usize];
        let mine: Vec<u32> =
            (0..meta.partitions).filter(|&p| self.owner(&meta.name, p) == self.id && here(p)).collect();
        // Partitions open a wave at a time (`Log::open_wave`): their opens
        // overlap, and the new logs of a wave are made durable by one
        // syncfs, so a topic of many partitions is created (and a broker
        // with many starts) in a fraction of the one-by-one time.
        for wave in mine.chunks(OPEN_PARTITIONS_AT_ONCE) {
            let dirs = wave.iter().map(|&p| partition_dir(&self.config.data_dir, &meta.name, p)).collect();
            let results = crate::log::Log::open_wave(dirs, &meta.config, &self.log_options).await;
            let mut failed = None;
            for (&p, result) in wave.iter().zip(results) {
                let part = |log| Partition::with_log(log, name.clone(), p, meta.config.clone());
                match result.map(|log| self.restored(part(log))) {
                    Ok(part) => slots[p as usize] = Some(part),
                    Err(source) => {
                        if created {
                            self.remove_partition_dir(&meta.name, p).await;
                        }
                        failed.get_or_insert((p, source));
                    }
                }
            }
            if let Some((partition, source)) = failed {
                if created {
                    self.undo_partitions(&meta.name, slots).await;
                }
                return Err(TopicOpError::OpenPartition { topic: meta.name, partition, source });
            }
        }
        self.partitions.borrow_mut().insert(name, slots);
        self.topics.borrow_mut().insert(meta.name.clone(), meta);
        Ok(())
    }

    /// Opens (or creates) one partition's log, with the high watermark its
    /// checkpoint kept.
    pub(super) async fn open_partition(
        &self,
        meta: &TopicMeta,
        name: Rc<str>,
        p: u32,
    ) -> Result<Rc<Partition>, crate::log::LogError> {
        let dir = partition_dir(&self.config.data_dir, &meta.name, p);
        let part = Partition::open(dir, name, p, meta.config.clone(), self.log_options.clone()).await?;
        Ok(self.restored(part))
    }

    /// `part` with the high watermark its checkpoint kept.
    fn restored(&self, part: Partition) -> Rc<Partition> {
        let key = (part.topic.to_string(), part.id);
        if let Some(hw) = self.restored_hw.borrow_mut().remove(&key) {
            part.replica.restore_hw(hw.min(part.log.end_offset().0));
        }
        Rc::new(part)
    }

    /// Leaves nothing of a failed topic creation: deletes the logs this
    /// shard opened.
    async fn undo_partitions(&self, topic: &str, opened: Vec<Option<Rc<Partition>>>) {
        for part in opened.into_iter().flatten() {
            if let Err(e) = part.log.delete().await {
                tracing::warn!(topic, partition = part.id, error = %e, "cannot clean up");
            }
        }
    }

    /// Removes the directory of a partition whose open failed (the open may
    /// have made the directory and metadata file).
    async fn remove_partition_dir(&self, topic: &str, partition: u32) {
        let dir = partition_dir(&self.config.data_dir, topic, partition);
        // glommio has no rmdir: remove on its blocking thread pool.
        let removing = dir.clone();
        match glommio::executor().spawn_blocking(move || std::fs::remove_dir_all(removing)).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(topic, partition, dir = %dir.display(), error = %e, "cannot clean up")
            }
        }
    }

    async fn remove_topic(&self, name: &str) -> Result<(), TopicOpError> {
        self.topics.borrow_mut().remove(name);
        let slots = self.partitions.borrow_mut().remove(name).unwrap_or_default();
        for part in slots.into_iter().flatten() {
            part.replica.stop();
            part.data.notify();
            part.log.delete().await.map_err(|source| TopicOpError::DeletePartition {
                topic: name.to_string(),
                partition: part.id,
                source,
            })?;
        }
        Ok(())
    }

    /// Sends `op` to shard `to` and waits for its reply. Calls to this shard
    /// itself are handled in place.
    pub async fn call(self: &Rc<Self>, to: ShardId, op: ShardOp) -> ShardReply {
        if to == self.id {
            // Boxed: topic changes call back into `call` (broadcast).
            return Box::pin(self.handle_op(op)).await;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending.borrow_mut().insert(id, tx);
        // Queued now, in call order (see `outbox`).
        if self.outbox[to.0 as usize].try_send((id, op)).is_err() {
            self.pending.borrow_mut().remove(&id);
            return ShardReply::Unavailable;
        }
        rx.recv().await.unwrap_or(ShardReply::Unavailable)
    }

    /// Sends the requests queued for shard `to` in order; ends when the
    /// shard context goes away.
    async fn pump_outbox(
        ctx: std::rc::Weak<Self>,
        to: usize,
        rx: local_channel::LocalReceiver<(u64, ShardOp)>,
    ) {
        while let Some((id, op)) = rx.recv().await {
            let Some(ctx) = ctx.upgrade() else { return };
            let msg = ShardMsg::Request { id, from: ctx.id.0 as usize, op };
            if ctx.mesh.send_to(to, msg).await.is_err() {
                // The caller's reply channel closes: it answers Unavailable.
                ctx.pending.borrow_mut().remove(&id);
            }
        }
    }

    /// Serves the requests arriving from the other shards (in arrival
    /// order: each request's handler is spawned, and so first runs, in that
    /// order) and starts the outbox pumps; the receivers end when the mesh
    /// closes.
    pub fn spawn_mesh_receivers(self: &Rc<Self>, mut receivers: Receivers<ShardMsg>) {
        for (to, rx) in std::mem::take(&mut *self.outbox_rx.borrow_mut()).into_iter().enumerate() {
            if to != self.id.0 as usize {
                glommio::spawn_local(Self::pump_outbox(Rc::downgrade(self), to, rx)).detach();
            }
        }
        for (_, rx) in receivers.streams() {
            let ctx = self.clone();
            glommio::spawn_local(async move {
                while let Some(msg) = rx.recv().await {
                    match msg {
                        ShardMsg::Reply { id, reply } => {
                            if let Some(tx) = ctx.pending.borrow_mut().remove(&id) {
                                // The caller may have gone away (connection closed).
                                let _unused = tx.try_send(reply);
                            }
                        }
                        ShardMsg::Request { id, from, op } => {
                            let ctx = ctx.clone();
                            glommio::spawn_local(async move {
                                let reply = ctx.handle_op(op).await;
                                // The requester may be shutting down; nothing to do then.
                                let _unused = ctx.mesh.send_to(from, ShardMsg::Reply { id, reply }).await;
                            })
                            .detach();
                        }
                    }
                }
            })
            .detach();
        }
    }

    /// Executes an operation on this shard.
    pub async fn handle_op(self: &Rc<Self>, op: ShardOp) -> ShardReply {
        match op {
            ShardOp::Produce { topic, partition, batches, acks } => {
                ShardReply::Produce(self.produce_local(&topic, partition, &batches, acks).await)
            }
            ShardOp::Fetch { topic, partition, offset, max_bytes } => {
                ShardReply::Fetch(self.fetch_local_copy(&topic, partition, offset, max_bytes).await)
            }
            ShardOp::WaitData { topic, partition, offset, timeout } => {
                if let Some(p) = self.partition(&topic, partition) {
                    let seen = p.data.generation();
                    if p.log.high_watermark().0 <= offset {
                        let _timed_out = glommio::timer::timeout(timeout, async {
                            p.data.changed(seen).await;
                            Ok(())
                        })
                        .await;
                    }
                }
                ShardReply::Waited
            }
            ShardOp::ListOffset { topic, partition, timestamp } => {
                ShardReply::ListOffset(match self.local(&topic, partition) {
                    Ok(p) => p.list_offset(timestamp).await,
                    Err(e) => Err(e),
                })
            }
            ShardOp::CreateTopics(specs) => ShardReply::TopicResults(self.create_topics(specs).await),
            ShardOp::DeleteTopics(names) => ShardReply::TopicResults(self.delete_topics(names).await),
            ShardOp::ApplyTopic(meta) => ShardReply::Done(self.apply_topic(meta, true).await),
            ShardOp::RemoveTopic(name) => ShardReply::Done(self.remove_topic(&name).await),
            ShardOp::Metrics => ShardReply::Metrics(Box::new(self.metrics.snapshot(self))),
            ShardOp::Group(req) => ShardReply::Group(Box::new(self.groups.handle(self, *req).await)),
            ShardOp::ListGroups => ShardReply::Groups(self.groups.list_local()),
            ShardOp::InitProducerId => ShardReply::ProducerId(crate::producer_ids::allocate_here(self).await),
        }
    }

    /// The owned partition, or a typed error.
    pub fn local(&self, topic: &str, partition: u32) -> Result<Rc<Partition>, PartitionError> {
        if let Some(e) = self.check_partition(topic, partition) {
            return Err(e);
        }
        self.partition(topic, partition).ok_or_else(|| {
            PartitionError::new(
                ErrorCode::NotLeaderOrFollower,
                format!("partition {topic}-{partition} is not owned by shard {}", self.id),
            )
        })
    }

    pub async fn produce_local(
        &self,
        topic: &str,
        partition: u32,
        batches: &[u8],
        acks: Acks,
    ) -> Result<Appended, PartitionError> {
        if self.shutting_down.get() {
            return Err(PartitionError::new(ErrorCode::BrokerShuttingDown, "broker is shutting down"));
        }
        let started = std::time::Instant::now();
        let p = self.local(topic, partition)?;
        if let Acks::All { .. } = acks {
            p.check_min_insync()?;
        }
        let result = p.append(batches).await;
        self.metrics.count_produce(batches.len(), result.is_ok());
        let info = result?;
        if let Acks::All { timeout } = acks {
            p.wait_replicated(info.last_offset.0, timeout).await?;
        }
        let (stages, records) = (&self.log_io_stats().stages, info.last_offset.0 + 1 - info.base_offset.0);
        stages.record(Stage::ProduceIn, info.enqueued_at.saturating_duration_since(started), records);
        stages.record(Stage::ProduceOut, info.written_at.elapsed(), records);
        Ok(Appended {
            base_offset: info.base_offset.0,
            log_start_offset: info.log_start_offset.0,
            append_time_ms: info.append_time_ms,
        })
    }

    pub(crate) async fn fetch_local_copy(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
    ) -> Result<RemoteRead, (PartitionError, i64, i64)> {
        let p = self.local(topic, partition).map_err(|e| (e, -1, -1))?;
        let hw = p.log.high_watermark().0 as i64;
        let lso = p.log.start_offset().0 as i64;
        let read = p.read(offset, max_bytes as usize).await.map_err(|e| (e, hw, lso))?;
        let (first, last) =
            if read.is_empty() { (-1, -1) } else { (read.first_offset.0 as i64, read.last_offset.0 as i64) };
        let bytes = read.into_bytes().await.map_err(|e| (PartitionError::from(e), hw, lso))?;
        Ok(RemoteRead {
            high_watermark: hw,
            log_start_offset: lso,
            first_offset: first,
            last_offset: last,
            bytes,
        })
    }

    /// Shard 0 only: validates, persists, then applies on every shard.
    async fn create_topics(self: &Rc<Self>, specs: Vec<TopicSpec>) -> Vec<TopicOutcome> {
        let mut results = Vec::with_capacity(specs.len());
        for TopicSpec { name, partitions, replication_factor, configs } in specs {
            let _change = self.topic_change().await;
            let result = self.create_topic(&name, partitions, replication_factor, &configs).await;
            results.push(TopicOutcome { name, result });
        }
        results
    }

    async fn create_topic(
        self: &Rc<Self>,
        name: &str,
        partitions: u32,
        replication: u16,
        configs: &[(String, String)],
    ) -> Result<(), TopicOpError> {
        use crate::topics::{validate_topic_name, TOPIC_PARTITIONS_MAX};
        let topic = || name.to_string();
        validate_topic_name(name).map_err(|reason| TopicOpError::InvalidName { topic: topic(), reason })?;
        if self.topics.borrow().contains_key(name) {
            return Err(TopicOpError::AlreadyExists { topic: topic() });
        }
        if partitions == 0 || partitions > TOPIC_PARTITIONS_MAX {
            return Err(TopicOpError::InvalidPartitions {
                topic: topic(),
                partitions,
                max: TOPIC_PARTITIONS_MAX,
            });
        }
        let total: u64 = self.topics.borrow().values().map(|t| u64::from(t.partitions)).sum();
        // In a cluster the limit is per broker and placement spreads evenly:
        // the cluster holds at most the limit times its live brokers.
        let brokers = self.cluster_md.borrow().as_ref().map_or(1, |md| md.brokers.len().max(1)) as u64;
        let max = self.config.limits.partitions_max as u64 * brokers;
        if total + u64::from(partitions) > max {
            return Err(TopicOpError::PartitionLimit { topic: topic(), total, max });
        }
        if replication == 0 || u64::from(replication) > brokers {
            return Err(TopicOpError::Replication { topic: topic(), replication, live: brokers as usize });
        }
        let mut config: TopicConfig = self.config.topic_defaults.clone();
        for (k, v) in configs {
            config.set(k, v).map_err(|source| TopicOpError::BadConfig { topic: topic(), source })?;
        }
        if let Some(link) = &self.cluster {
            // The overrides as given: each broker applies them over its defaults.
            let config = configs.iter().cloned().collect();
            let request = crate::cluster::controller::CreateTopicRequest {
                partitions,
                replication_factor: replication,
                config,
            };
            return self.create_in_cluster(link, name, request).await;
        }
        let meta = TopicMeta { name: name.to_string(), partitions, config };
        let before = self.topics.borrow().clone();
        let mut table = before.clone();
        table.insert(name.to_string(), meta.clone());
        self.persist(name, &table).await?;
        let Err(e) = self.broadcast(name, || ShardOp::ApplyTopic(meta.clone())).await else {
            return Ok(());
        };
        // Some shard could not open its partitions (open-files limit, disk):
        // undo everywhere, so no shard serves half a topic and a restart does
        // not retry it.
        tracing::warn!(topic = name, error = %e, "topic creation failed; rolling back");
        if let Err(undo) = self.broadcast(name, || ShardOp::RemoveTopic(name.to_string())).await {
            tracing::error!(topic = name, error = %undo, "rollback of a failed topic creation failed");
        }
        self.persist(name, &before).await?;
        Err(TopicOpError::RolledBack { source: Box::new(e) })
    }

    async fn delete_topics(self: &Rc<Self>, names: Vec<String>) -> Vec<TopicOutcome> {
        let mut results = Vec::with_capacity(names.len());
        for name in names {
            let _change = self.topic_change().await;
            let result = if name == shardlog_schema::types::OFFSETS_TOPIC {
                Err(TopicOpError::Internal { topic: name.clone() })
            } else if let Some(link) = &self.cluster {
                self.delete_in_cluster(link, &name).await
            } else if self.topics.borrow().contains_key(&name) {
                let mut table = self.topics.borrow().clone();
                table.remove(&name);
                match self.persist(&name, &table).await {
                    Ok(()) => self.broadcast(&name, || ShardOp::RemoveTopic(name.clone())).await,
                    Err(e) => Err(e),
                }
            } else {
                Err(TopicOpError::Unknown { topic: name.clone() })
            };
            results.push(TopicOutcome { name, result });
        }
        results
    }

    /// Waits for the turn to change topic metadata (see `topic_changes`).
    async fn topic_change(&self) -> glommio::sync::Permit<'_> {
        self.topic_changes.acquire_permit(1).await.expect("the topic-change semaphore is never closed")
    }

    async fn persist(&self, topic: &str, table: &TopicTable) -> Result<(), TopicOpError> {
        let store = self.store.as_ref().expect("topic metadata is written by shard 0 only");
        store.store(table).await.map_err(|source| {
            tracing::error!(topic, error = %source, "cannot persist topic metadata");
            TopicOpError::Persist { topic: topic.to_string(), source: Box::new(source) }
        })
    }

    /// Sends a topic change to every shard; the first failure is returned
    /// (each is logged).
    async fn broadcast(self: &Rc<Self>, topic: &str, op: impl Fn() -> ShardOp) -> Result<(), TopicOpError> {
        // Every shard applies the change at once (a topic of many partitions
        // is created on all cores together, not one shard after another);
        // the replies are judged in shard order.
        let calls: Vec<_> = (0..self.shard_count).map(|s| self.call(ShardId(s), op())).collect();
        let mut first_error = None;
        for (s, reply) in (0..self.shard_count).zip(join_all(calls).await) {
            let err = match reply {
                ShardReply::Done(Ok(())) => continue,
                ShardReply::Done(Err(e)) => e,
                ShardReply::Unavailable => {
                    TopicOpError::ShardUnavailable { topic: topic.to_string(), shard: s }
                }
                other => TopicOpError::UnexpectedReply {
                    topic: topic.to_string(),
                    shard: s,
                    reply: format!("{other:?}"),
                },
            };
            tracing::error!(shard = s, error = %err, "topic change failed on a shard");
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Partitions a shard opens at once when it applies a topic.
const OPEN_PARTITIONS_AT_ONCE: usize = 64;
