//! The accumulator task: assigns partitions and builds batches.
//!
//! It owns every open batch, so appending a record takes no lock. A batch is
//! sealed when the next record would push it past `batch_bytes`, when it is
//! `linger_ms` old, or on flush; sealed batches go to the sender task of the
//! partition's owner-shard address.

use super::sender::{self, SealedBatch, SenderCtx};
use super::{Command, Delivered, DeliveryReply, QueuedRecord};
use crate::cluster::Cluster;
use crate::config::ProducerConfig;
use crate::error::ClientError;
use shardlog_schema::batch::{BatchBuilder, HeaderRef};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Commands taken from the channel per wake-up.
const COMMANDS_PER_WAKE_MAX: usize = 4096;
/// How long "topic does not exist" is remembered before asking again.
const UNKNOWN_TOPIC_TTL: Duration = Duration::from_millis(500);
/// Smallest initial builder capacity.
const BUILDER_BYTES_MIN: usize = 4 << 10;

/// FNV-1a for the per-record topic lookup: topic names are short and
/// trusted, and SipHash showed up at ~10% of producer CPU.
#[derive(Default)]
struct FnvHasher(u64);

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

type FnvBuild = std::hash::BuildHasherDefault<FnvHasher>;

struct OpenBatch {
    builder: BatchBuilder<'static>,
    replies: Vec<(DeliveryReply, i64)>,
    buffer_bytes: usize,
    /// Identifies this batch in the linger queue.
    id: u64,
}

struct PartitionSlot {
    open: Option<OpenBatch>,
    /// Size of the last sealed batch: the next builder starts this big.
    last_batch_bytes: usize,
}

struct TopicState {
    name: Arc<str>,
    partitions: Vec<PartitionSlot>,
    /// Where keyless records go until that partition's batch is sealed.
    sticky: u32,
}

pub(super) fn spawn(
    cluster: Arc<Cluster>,
    config: ProducerConfig,
    buffer: Arc<Semaphore>,
    rx: mpsc::UnboundedReceiver<Command>,
) {
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let ctx = Arc::new(SenderCtx::new(cluster.clone(), &config, buffer, done_tx));
    let acc = Accumulator {
        ctx,
        linger: Duration::from_millis(config.linger_ms),
        config,
        topics: HashMap::default(),
        unknown: HashMap::new(),
        senders: HashMap::new(),
        linger_queue: VecDeque::new(),
        next_id: 0,
        outstanding: BTreeSet::new(),
        flush_waiters: Vec::new(),
    };
    tokio::spawn(acc.run(rx, done_rx));
}

struct Accumulator {
    ctx: Arc<SenderCtx>,
    config: ProducerConfig,
    linger: Duration,
    topics: HashMap<Arc<str>, TopicState, FnvBuild>,
    unknown: HashMap<String, (Instant, ClientError)>,
    senders: HashMap<String, mpsc::UnboundedSender<SealedBatch>>,
    /// Open batches in creation order: (deadline, topic, partition, batch id).
    linger_queue: VecDeque<(Instant, Arc<str>, u32, u64)>,
    next_id: u64,
    /// Ids of sealed batches not yet completed.
    outstanding: BTreeSet<u64>,
    /// Flushes waiting for every batch with id <= the given one.
    flush_waiters: Vec<(u64, oneshot::Sender<()>)>,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Accumulator {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Command>,
        mut done_rx: mpsc::UnboundedReceiver<u64>,
    ) {
        let mut commands = Vec::with_capacity(COMMANDS_PER_WAKE_MAX);
        let mut open = true;
        loop {
            let deadline = self.linger_queue.front().map(|e| e.0);
            tokio::select! {
                n = rx.recv_many(&mut commands, COMMANDS_PER_WAKE_MAX), if open => {
                    if n == 0 {
                        // Every producer handle is gone: send what is left, then stop.
                        open = false;
                        self.seal_all();
                    }
                    let now = now_ms();
                    for cmd in commands.drain(..) {
                        match cmd {
                            Command::Record(r) => self.append(r, now).await,
                            Command::Flush(reply) => {
                                self.seal_all();
                                self.flush_waiters.push((self.next_id, reply));
                            }
                        }
                    }
                    self.seal_expired();
                }
                Some(id) = done_rx.recv() => {
                    self.outstanding.remove(&id);
                    while let Ok(id) = done_rx.try_recv() {
                        self.outstanding.remove(&id);
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => self.seal_expired(),
            }
            self.answer_flushes();
            if !open && self.outstanding.is_empty() {
                return;
            }
        }
    }

    fn answer_flushes(&mut self) {
        // A flush waits for every batch opened before it (ids below `upto`).
        let lowest = self.outstanding.first().copied().unwrap_or(u64::MAX);
        let mut i = 0;
        while i < self.flush_waiters.len() {
            if self.flush_waiters[i].0 <= lowest {
                let (_, reply) = self.flush_waiters.swap_remove(i);
                let _ = reply.send(());
            } else {
                i += 1;
            }
        }
    }

    async fn append(&mut self, q: QueuedRecord, now: i64) {
        let QueuedRecord { record, bytes, reply } = q;
        if !self.topics.contains_key(record.topic.as_str()) {
            if let Err(e) = self.load_topic(&record.topic).await {
                self.fail(reply, bytes, e);
                return;
            }
        }
        let topic = self.topics.get_mut(record.topic.as_str()).expect("loaded above");
        let count = topic.partitions.len() as u32;
        let partition = match (record.partition, &self.config.partitioner, &record.key) {
            (Some(p), _, _) => p,
            (None, Some(custom), key) => custom.partition(&record.topic, key.as_deref(), count),
            (None, None, Some(key)) => super::DefaultPartitioner::for_key(key, count),
            (None, None, None) => topic.sticky,
        };
        if partition >= count {
            let e = ClientError::UnknownPartition { topic: record.topic.clone(), partition };
            self.fail(reply, bytes, e);
            return;
        }
        let full = topic.partitions[partition as usize].open.as_ref().is_some_and(|b| {
            !b.replies.is_empty() && b.builder.estimated_bytes() + bytes > self.config.batch_bytes
        });
        let name = topic.name.clone();
        if full {
            self.seal(&name, partition);
        }
        let ts = record.timestamp_ms.unwrap_or(now);
        let batch = self.open_batch(&name, partition);
        if record.headers.is_empty() {
            batch.builder.push(record.key.as_deref(), &record.value, &[], ts);
        } else {
            let headers: Vec<HeaderRef<'_>> =
                record.headers.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
            batch.builder.push(record.key.as_deref(), &record.value, &headers, ts);
        }
        batch.replies.push((reply, ts));
        batch.buffer_bytes += bytes;
        if batch.builder.estimated_bytes() >= self.config.batch_bytes {
            self.seal(&name, partition);
        }
    }

    /// The open batch of a loaded topic's partition, opened when needed.
    fn open_batch(&mut self, topic: &Arc<str>, partition: u32) -> &mut OpenBatch {
        let state = self.topics.get_mut(topic).expect("topic is loaded");
        let slot = &mut state.partitions[partition as usize];
        if slot.open.is_none() {
            let id = self.next_id;
            self.next_id += 1;
            self.linger_queue.push_back((Instant::now() + self.linger, topic.clone(), partition, id));
            let capacity =
                slot.last_batch_bytes.clamp(BUILDER_BYTES_MIN, self.config.batch_bytes + BUILDER_BYTES_MIN);
            slot.open = Some(OpenBatch {
                builder: BatchBuilder::with_capacity(capacity),
                replies: Vec::new(),
                buffer_bytes: 0,
                id,
            });
        }
        slot.open.as_mut().expect("opened above")
    }

    fn fail(&self, reply: DeliveryReply, bytes: usize, e: ClientError) {
        self.ctx.buffer.add_permits(bytes);
        let _ = reply.send(Err(e));
    }

    async fn load_topic(&mut self, name: &str) -> Result<(), ClientError> {
        if let Some((at, e)) = self.unknown.get(name) {
            if at.elapsed() < UNKNOWN_TOPIC_TTL {
                return Err(e.clone());
            }
        }
        match self.ctx.cluster.topic(name).await {
            Ok(t) if !t.partitions.is_empty() => {
                self.unknown.remove(name);
                let count = t.partitions.len();
                let name: Arc<str> = Arc::from(name);
                let partitions =
                    (0..count).map(|_| PartitionSlot { open: None, last_batch_bytes: 0 }).collect();
                // Spread keyless traffic of many producers over the partitions.
                let sticky = (std::process::id() ^ now_ms() as u32) % count as u32;
                self.topics.insert(name.clone(), TopicState { name, partitions, sticky });
                Ok(())
            }
            Ok(_) => Err(ClientError::UnknownTopic(name.to_string())),
            Err(e) => {
                self.unknown.insert(name.to_string(), (Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    fn seal_all(&mut self) {
        while let Some((_, topic, partition, _)) = self.linger_queue.pop_front() {
            self.seal(&topic, partition);
        }
    }

    fn seal_expired(&mut self) {
        let now = Instant::now();
        while let Some((deadline, _, _, _)) = self.linger_queue.front() {
            if *deadline > now {
                break;
            }
            let (_, topic, partition, id) = self.linger_queue.pop_front().expect("front exists");
            let still_open =
                self.topics.get(&topic).and_then(|t| t.partitions[partition as usize].open.as_ref());
            if still_open.is_some_and(|b| b.id == id) {
                self.seal(&topic, partition);
            }
        }
    }

    /// Finishes the open batch of `topic`/`partition` (if any) and hands it to
    /// the sender of its owner shard.
    fn seal(&mut self, topic: &Arc<str>, partition: u32) {
        let Some(state) = self.topics.get_mut(topic) else { return };
        let count = state.partitions.len() as u32;
        let slot = &mut state.partitions[partition as usize];
        let Some(batch) = slot.open.take() else { return };
        if state.sticky == partition {
            state.sticky = (partition + 1) % count;
        }
        let record_count = batch.replies.len() as u32;
        let data = batch.builder.finish();
        slot.last_batch_bytes = data.len();
        let sealed = SealedBatch {
            id: batch.id,
            topic: state.name.clone(),
            partition,
            data: data.into(),
            record_count,
            replies: batch.replies,
            buffer_bytes: batch.buffer_bytes,
            attempts: 0,
        };
        self.outstanding.insert(sealed.id);
        let addr = match self.ctx.cluster.metadata().leader_addr(topic, partition) {
            Ok(a) => a,
            Err(_) => {
                // Metadata went stale; the retry path refreshes it.
                let ctx = self.ctx.clone();
                tokio::spawn(async move { sender::retry_batches(ctx, vec![sealed], None).await });
                return;
            }
        };
        let tx = self.senders.entry(addr.clone()).or_insert_with(|| sender::spawn(self.ctx.clone(), addr));
        if let Err(mpsc::error::SendError(sealed)) = tx.send(sealed) {
            let ctx = self.ctx.clone();
            tokio::spawn(async move { sender::retry_batches(ctx, vec![sealed], None).await });
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Builds the value handed to each record's future.
pub(super) fn delivered(topic: &Arc<str>, partition: u32, offset: u64, timestamp_ms: i64) -> Delivered {
    Delivered { topic: topic.clone(), partition, offset, timestamp_ms }
}
