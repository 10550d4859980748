//! The accumulator: partitions records and appends them into open batches,
//! right inside `send` (under one short-held mutex, never across an `.await`).
//!
//! A batch is sealed (its bytes finished, its CRC computed):
//! - in `send`, when the next record would push it past `batch_bytes` or it
//!   reached `batch_bytes`;
//! - by the sender task of its owner-shard address, once the batch is *ready*
//!   (`linger_ms` old; at once with `linger_ms = 0`) and the connection has a
//!   free in-flight slot. While every slot is busy, ready batches keep
//!   growing, so batches form naturally under load even without a linger;
//! - on flush or when the last producer handle goes away.
//!
//! Sealed batches wait in their address's queue until the sender takes them.
//!
//! With idempotence two rules keep every batch of a partition landing once
//! and in order across retries:
//! - **Window.** A batch goes on the wire only while it is within
//!   [`IDEMPOTENT_WINDOW_BATCHES`] of the oldest unfinished batch of its
//!   partition. The broker remembers the last that many batches of a
//!   producer per partition and answers a retry of one of them as the
//!   duplicate it is; a retry of an older one it can only refuse as out of
//!   order. Without the window, batches landing while one whose answer was
//!   lost (a broker restart) waits for its retry push it out of the
//!   broker's memory, and its retries are refused until its delivery
//!   timeout, although it is stored.
//! - **In order, on one path.** A broker that does not know the producer
//!   on a partition (its first batches there were lost) accepts any
//!   sequence, as Kafka's does (KIP-360): a later batch that overtakes an
//!   earlier one is stored, and the earlier one is refused as out of order
//!   for ever. So a batch goes only when it is the oldest of its partition
//!   waiting in any sender queue (after a leader move a partition can wait
//!   in two), when what of its partition is on the wire went on the same
//!   connection (one connection keeps order; a second one to the same
//!   address, after the first was given up, does not), and when no earlier batch of
//!   its partition is to be retried. A retry goes only when it is the
//!   partition's oldest unfinished batch and nothing else of the partition
//!   is on the wire ([`Core::until_retry_turn`]).

use super::completion::{Completion, DeliveryFuture};
use super::sender::{self, SealedBatch, SenderCtx};
use super::ProducerRecord;
use crate::clock::now_ms;
use crate::cluster::Cluster;
use crate::config::ProducerConfig;
use crate::error::ClientError;
use crate::producer::Partitioner;
use shardlog_schema::batch::{self, BatchBuilder, HeaderRef, BATCH_HEADER_BYTES};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};

/// How long "topic does not exist" is remembered before asking again.
const UNKNOWN_TOPIC_TTL: Duration = Duration::from_millis(500);
/// Smallest initial builder capacity.
const BUILDER_BYTES_MIN: usize = 4 << 10;
/// Idempotence: how far past its partition's oldest unfinished batch a
/// batch may be sent (what the broker remembers per producer and
/// partition, see the module docs).
pub(crate) const IDEMPOTENT_WINDOW_BATCHES: u64 = batch::IDEMPOTENT_BATCHES_REMEMBERED as u64;

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
    builder: BatchBuilder,
    completion: Completion,
    record_count: u32,
    buffer_bytes: usize,
    /// Tells this batch from a later one of the same partition.
    id: u64,
}

#[derive(Default)]
struct PartitionSlot {
    open: Option<OpenBatch>,
    /// Idempotence: the sequence of the next batch's first record.
    next_sequence: i32,
    /// Size of the last sealed batch: the next builder starts this big.
    last_batch_bytes: usize,
    /// Idempotence: batches sealed so far (each batch's ordinal).
    sealed: u64,
    /// Idempotence: bumped by each rewind.
    generation: u64,
    /// Idempotence: batches that failed without being written, while later
    /// ones were already numbered (cleared once none is outstanding).
    rewinds: Vec<Rewind>,
    /// Sealed batches not yet completed.
    outstanding: usize,
    /// Idempotence: the ordinals of those batches, and of those among them
    /// waiting in a sender queue and to be retried. The rest are on the
    /// wire.
    unfinished: BTreeSet<u64>,
    queued: BTreeSet<u64>,
    retrying: BTreeSet<u64>,
    /// Idempotence: the connection the batches on the wire went on.
    wire_conn: Option<u64>,
    /// Idempotence: a batch waits in its sender's queue for the window to
    /// move or the retries before it to land (its sender is woken when a
    /// batch of the partition completes).
    held: bool,
}

impl PartitionSlot {
    /// Idempotence: batches taken by a sender and not yet answered.
    fn on_wire(&self) -> usize {
        self.unfinished.len().saturating_sub(self.queued.len() + self.retrying.len())
    }
}

/// The slot of `b`'s partition.
fn slot_of<'t>(
    topics: &'t mut HashMap<Arc<str>, TopicState, FnvBuild>,
    b: &SealedBatch,
) -> Option<&'t mut PartitionSlot> {
    topics.get_mut(&b.topic).and_then(|t| t.partitions.get_mut(b.partition as usize))
}

/// Idempotence: whether `b` may go on connection `conn` now (see the module
/// docs: within the window, the oldest queued of its partition, on the
/// connection its partition's batches on the wire went on, behind no
/// retry); marks the partition held when it may not.
fn may_send(
    topics: &mut HashMap<Arc<str>, TopicState, FnvBuild>,
    b: &SealedBatch,
    conn: Option<u64>,
) -> bool {
    let Some(numbering) = b.numbering else { return true };
    let Some(slot) = slot_of(topics, b) else { return true };
    let ordinal = numbering.ordinal;
    let in_window =
        slot.unfinished.first().is_none_or(|&oldest| ordinal < oldest + IDEMPOTENT_WINDOW_BATCHES);
    let oldest_queued = slot.queued.first().is_none_or(|&q| q == ordinal);
    let same_path = slot.on_wire() == 0 || (conn.is_some() && slot.wire_conn == conn);
    let behind_retry = slot.retrying.first().is_some_and(|&first| first < ordinal);
    let may = in_window && oldest_queued && same_path && !behind_retry;
    slot.held |= !may;
    may
}

/// A batch of `records` records, the `ordinal`-th of its partition, failed
/// for good and was not written; `generation` is the partition's after it.
/// Later batches numbered before the rewind give its records' sequences back.
struct Rewind {
    ordinal: u64,
    records: u32,
    generation: u64,
}

/// Where an idempotent batch stands in its partition's numbering.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Numbering {
    pub ordinal: u64,
    pub base_sequence: i32,
    /// The partition's generation when `base_sequence` was given.
    pub generation: u64,
}

/// `sequence - back`, wrapping at `i32::MAX` as sequences do.
fn sequence_back(sequence: i32, back: u64) -> i32 {
    let modulus = i64::from(i32::MAX) + 1;
    (i64::from(sequence) - (back % modulus as u64) as i64).rem_euclid(modulus) as i32
}

struct TopicState {
    name: Arc<str>,
    partitions: Vec<PartitionSlot>,
    /// Where keyless records go until that partition's batch is sealed.
    sticky: u32,
}

/// The work waiting for one owner-shard address's sender task.
pub(super) struct SenderQueue {
    /// Sealed batches in seal order (per partition: send order).
    sealed: VecDeque<SealedBatch>,
    /// Open batches whose linger is over: (topic, partition, batch id).
    ready: Vec<(Arc<str>, u32, u64)>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct State {
    topics: HashMap<Arc<str>, TopicState, FnvBuild>,
    unknown: HashMap<String, (Instant, ClientError)>,
    senders: HashMap<String, SenderQueue>,
    /// Open batches in creation order, only with `linger_ms > 0`:
    /// (deadline, topic, partition, batch id).
    linger_queue: VecDeque<(Instant, Arc<str>, u32, u64)>,
    next_id: u64,
    /// Ids of sealed batches not yet completed.
    outstanding: BTreeSet<u64>,
    /// The last producer handle is gone: sender and linger tasks stop once idle.
    closing: bool,
}

impl State {
    /// Whether batch `id` is still the open batch of `topic`/`partition`.
    fn is_open(&self, topic: &str, partition: u32, id: u64) -> bool {
        let open = self.topics.get(topic).and_then(|t| t.partitions[partition as usize].open.as_ref());
        open.is_some_and(|b| b.id == id)
    }
}

/// Everything the producer handles, sender tasks and linger task share.
pub(crate) struct Core {
    pub ctx: SenderCtx,
    state: Mutex<State>,
    linger: Duration,
    batch_bytes: usize,
    partitioner: Option<Arc<dyn Partitioner>>,
    /// Wakes the linger task when the linger queue gets its first entry.
    linger_wake: Notify,
    /// Notified whenever a batch completes (flush waits on it).
    completed: Notify,
    runtime: tokio::runtime::Handle,
    /// Itself, for spawning tasks that own the core.
    me: Weak<Core>,
    /// Idempotence: the producer id and epoch every batch carries.
    producer: Option<(i64, i16)>,
    /// Partitions with rewinds to apply: while 0 (always, but after a batch
    /// failed unwritten) sending a batch takes no lock to renumber it.
    rewinding: AtomicUsize,
}

/// Appends `record` to `batch` and returns its future.
fn push_record(
    batch: &mut OpenBatch,
    record: &ProducerRecord,
    bytes: usize,
    timestamp_ms: i64,
) -> DeliveryFuture {
    if record.headers.is_empty() {
        batch.builder.push(record.key.as_deref(), &record.value, &[], timestamp_ms);
    } else {
        let headers: Vec<HeaderRef<'_>> = record.headers.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
        batch.builder.push(record.key.as_deref(), &record.value, &headers, timestamp_ms);
    }
    let future = batch.completion.future(batch.record_count, timestamp_ms);
    batch.record_count += 1;
    batch.buffer_bytes += bytes;
    future
}

/// What a sender task finds when it looks for work.
pub(super) enum Work {
    Some,
    Idle,
    /// Closing and nothing left: the task ends.
    Done,
}

impl Core {
    /// Creates the shared core and starts the linger task (when `linger_ms > 0`).
    pub fn start(
        cluster: Arc<Cluster>,
        config: &ProducerConfig,
        buffer: Arc<Semaphore>,
        producer: Option<(i64, i16)>,
    ) -> Arc<Core> {
        let core = Arc::new_cyclic(|me| Core {
            ctx: SenderCtx::new(cluster, config, buffer, producer.is_some()),
            producer,
            state: Mutex::new(State::default()),
            linger: Duration::from_millis(config.linger_ms),
            batch_bytes: config.batch_bytes,
            partitioner: config.partitioner.clone(),
            linger_wake: Notify::new(),
            completed: Notify::new(),
            runtime: tokio::runtime::Handle::current(),
            me: me.clone(),
            rewinding: AtomicUsize::new(0),
        });
        if !core.linger.is_zero() {
            core.runtime.spawn(linger_loop(core.clone()));
        }
        core
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a record whose buffer bytes are already taken; the future
    /// resolves when its batch completes. Waits only to load topic metadata
    /// the first time a topic is seen.
    pub async fn append(&self, record: ProducerRecord, bytes: usize) -> DeliveryFuture {
        let timestamp_ms = record.timestamp_ms.unwrap_or_else(now_ms);
        loop {
            if let Some(appended) = self.try_append(&record, bytes, timestamp_ms) {
                return appended.unwrap_or_else(|e| {
                    self.ctx.buffer.add_permits(bytes);
                    DeliveryFuture::failed(e)
                });
            }
            if let Err(e) = self.load_topic(&record.topic).await {
                self.ctx.buffer.add_permits(bytes);
                return DeliveryFuture::failed(e);
            }
        }
    }

    /// `None` when the topic is not loaded yet.
    fn try_append(
        &self,
        record: &ProducerRecord,
        bytes: usize,
        timestamp_ms: i64,
    ) -> Option<Result<DeliveryFuture, ClientError>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let topic = state.topics.get_mut(&*record.topic)?;
        let count = topic.partitions.len() as u32;
        let partition = match (record.partition, &self.partitioner, &record.key) {
            (Some(p), _, _) => p,
            (None, Some(custom), key) => custom.partition(&record.topic, key.as_deref(), count),
            (None, None, Some(key)) => super::DefaultPartitioner::for_key(key, count),
            (None, None, None) => topic.sticky,
        };
        if partition >= count {
            return Some(Err(ClientError::UnknownPartition { topic: record.topic.to_string(), partition }));
        }
        // Fast path, one map lookup per record: the partition has an open
        // batch with room for this record.
        if let Some(batch) = topic.partitions[partition as usize].open.as_mut() {
            let full = batch.record_count > 0 && batch.builder.estimated_bytes() + bytes > self.batch_bytes;
            if !full {
                let future = push_record(batch, record, bytes, timestamp_ms);
                if batch.builder.estimated_bytes() >= self.batch_bytes {
                    let name = topic.name.clone();
                    self.seal(state, &name, partition);
                }
                return Some(Ok(future));
            }
        }
        let name = topic.name.clone();
        let full = topic.partitions[partition as usize].open.is_some();
        if full {
            self.seal(state, &name, partition);
        }
        let batch = self.open_batch(state, &name, partition);
        let future = push_record(batch, record, bytes, timestamp_ms);
        if batch.builder.estimated_bytes() >= self.batch_bytes {
            self.seal(state, &name, partition);
        }
        Some(Ok(future))
    }

    /// The open batch of a loaded topic's partition, opened when needed (a
    /// new batch starts its linger, or is ready at once with `linger_ms = 0`).
    fn open_batch<'s>(&self, state: &'s mut State, topic: &Arc<str>, partition: u32) -> &'s mut OpenBatch {
        let has_open = state.topics[topic].partitions[partition as usize].open.is_some();
        if !has_open {
            let id = state.next_id;
            state.next_id += 1;
            if self.linger.is_zero() {
                self.make_ready(state, topic, partition, id);
            } else {
                if state.linger_queue.is_empty() {
                    self.linger_wake.notify_one();
                }
                state.linger_queue.push_back((Instant::now() + self.linger, topic.clone(), partition, id));
            }
            let slot =
                &mut state.topics.get_mut(topic).expect("topic is loaded").partitions[partition as usize];
            // Room for the header in front of the records (see `seal`).
            let capacity =
                slot.last_batch_bytes.clamp(BUILDER_BYTES_MIN, self.batch_bytes + BUILDER_BYTES_MIN)
                    + BATCH_HEADER_BYTES;
            slot.open = Some(OpenBatch {
                builder: BatchBuilder::with_capacity(capacity),
                completion: Completion::new(topic.clone(), partition),
                record_count: 0,
                buffer_bytes: 0,
                id,
            });
        }
        let slot = &mut state.topics.get_mut(topic).expect("topic is loaded").partitions[partition as usize];
        slot.open.as_mut().expect("opened above")
    }

    /// Hands an open batch to its sender, to be sealed when a slot is free.
    fn make_ready(&self, state: &mut State, topic: &Arc<str>, partition: u32, id: u64) {
        match self.ctx.cluster.metadata().leader_addr(topic, partition) {
            Ok(addr) => {
                let q = self.queue(state, addr);
                q.ready.push((topic.clone(), partition, id));
                q.wake.notify_one();
            }
            // Metadata went stale: seal now; the retry path refreshes it.
            Err(_) => self.seal(state, topic, partition),
        }
    }

    /// The queue of `addr`, starting its sender task the first time.
    fn queue<'s>(self: &Core, state: &'s mut State, addr: String) -> &'s mut SenderQueue {
        state.senders.entry(addr).or_insert_with_key(|addr| {
            let wake = Arc::new(Notify::new());
            let core = self.arc();
            self.runtime.spawn(sender::send_loop(core, addr.clone(), wake.clone()));
            SenderQueue { sealed: VecDeque::new(), ready: Vec::new(), wake }
        })
    }

    async fn load_topic(&self, name: &str) -> Result<(), ClientError> {
        if let Some((at, e)) = self.lock().unknown.get(name) {
            if at.elapsed() < UNKNOWN_TOPIC_TTL {
                return Err(e.clone());
            }
        }
        let fetched = self.ctx.cluster.topic(name).await;
        let mut state = self.lock();
        match fetched {
            Ok(t) if !t.partitions.is_empty() => {
                state.unknown.remove(name);
                if !state.topics.contains_key(name) {
                    let count = t.partitions.len();
                    let name: Arc<str> = Arc::from(name);
                    let partitions = (0..count).map(|_| PartitionSlot::default()).collect();
                    // Spread keyless traffic of many producers over the partitions.
                    let sticky = (std::process::id() ^ now_ms() as u32) % count as u32;
                    state.topics.insert(name.clone(), TopicState { name, partitions, sticky });
                }
                Ok(())
            }
            Ok(_) => Err(ClientError::UnknownTopic(name.to_string())),
            Err(e) => {
                state.unknown.insert(name.to_string(), (Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Finishes the open batch of `topic`/`partition` (if any) and queues it
    /// for the sender of its owner shard.
    fn seal(&self, state: &mut State, topic: &Arc<str>, partition: u32) {
        let Some(t) = state.topics.get_mut(topic) else { return };
        let count = t.partitions.len() as u32;
        let slot = &mut t.partitions[partition as usize];
        let Some(batch) = slot.open.take() else { return };
        if t.sticky == partition {
            t.sticky = (partition + 1) % count;
        }
        let mut builder = batch.builder;
        let numbering = self.producer.map(|(id, epoch)| {
            // Sequences count records, wrapping at i32::MAX as Kafka's do.
            builder.set_producer(id, epoch, slot.next_sequence);
            let numbering = Numbering {
                ordinal: slot.sealed,
                base_sequence: slot.next_sequence,
                generation: slot.generation,
            };
            let next = i64::from(slot.next_sequence) + i64::from(batch.record_count);
            slot.next_sequence = (next % (i64::from(i32::MAX) + 1)) as i32;
            slot.sealed += 1;
            slot.unfinished.insert(numbering.ordinal);
            numbering
        });
        slot.outstanding += 1;
        // No copy of the records: the header goes in front of them.
        let data = builder.finish_bytes();
        slot.last_batch_bytes = data.len();
        let sealed = SealedBatch {
            id: batch.id,
            topic: t.name.clone(),
            partition,
            data,
            record_count: batch.record_count,
            completion: batch.completion,
            buffer_bytes: batch.buffer_bytes,
            attempts: 0,
            sealed_at: std::time::Instant::now(),
            requested_at: None,
            numbering,
        };
        state.outstanding.insert(sealed.id);
        let slot = &mut t.partitions[partition as usize];
        match self.ctx.cluster.metadata().leader_addr(topic, partition) {
            Ok(addr) => {
                if let Some(n) = sealed.numbering {
                    slot.queued.insert(n.ordinal);
                }
                let q = self.queue(state, addr);
                q.sealed.push_back(sealed);
                q.wake.notify_one();
            }
            Err(_) => {
                // Metadata went stale; the retry path refreshes it.
                if let Some(n) = sealed.numbering {
                    slot.retrying.insert(n.ordinal);
                }
                self.runtime.spawn(sender::retry_batches(self.arc(), vec![sealed], None));
            }
        }
    }

    /// Seals every open batch.
    fn seal_all(&self, state: &mut State) {
        state.linger_queue.clear();
        let open: Vec<(Arc<str>, u32)> = state
            .topics
            .values()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.open.is_some())
                    .map(|(p, _)| (t.name.clone(), p as u32))
            })
            .collect();
        for (topic, partition) in open {
            self.seal(state, &topic, partition);
        }
    }

    /// Moves what waits for `addr` (sealed batches, and open batches whose
    /// linger is over) to the queue of its partition's new leader when the
    /// cached metadata shows one elsewhere and nothing earlier of that
    /// partition is in flight or being retried (every outstanding batch of
    /// it waits here): moved batches go in front of that queue, in order, so
    /// no batch overtakes an earlier one of its partition. Returns how many
    /// moved.
    pub(super) fn move_off(&self, addr: &str) -> usize {
        let md = self.ctx.cluster.metadata();
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(q) = state.senders.get(addr) else { return 0 };
        let mut queued: HashMap<(Arc<str>, u32), usize> = HashMap::new();
        for b in &q.sealed {
            *queued.entry((b.topic.clone(), b.partition)).or_default() += 1;
        }
        let partitions =
            q.sealed.iter().map(|b| (&b.topic, b.partition)).chain(q.ready.iter().map(|(t, p, _)| (t, *p)));
        let mut homes: HashMap<(Arc<str>, u32), String> = HashMap::new();
        for (topic, partition) in partitions {
            let key = (topic.clone(), partition);
            if homes.contains_key(&key) {
                continue;
            }
            let outstanding =
                state.topics.get(topic).map_or(0, |t| t.partitions[partition as usize].outstanding);
            if outstanding != queued.get(&key).copied().unwrap_or(0) {
                continue; // an earlier batch is in flight or being retried
            }
            if let Some(home) = md.leader_addr(topic, partition).ok().filter(|a| a != addr) {
                homes.insert(key, home);
            }
        }
        if homes.is_empty() {
            return 0;
        }
        let q = state.senders.get_mut(addr).expect("looked up above");
        let mut sealed = Vec::new();
        for b in std::mem::take(&mut q.sealed) {
            match homes.get(&(b.topic.clone(), b.partition)) {
                Some(home) => sealed.push((home.clone(), b)),
                None => q.sealed.push_back(b),
            }
        }
        let mut ready = Vec::new();
        for r in std::mem::take(&mut q.ready) {
            match homes.get(&(r.0.clone(), r.1)) {
                Some(home) => ready.push((home.clone(), r)),
                None => q.ready.push(r),
            }
        }
        let moved = sealed.len() + ready.len();
        for (home, b) in sealed.into_iter().rev() {
            self.queue(state, home).sealed.push_front(b);
        }
        for (home, r) in ready {
            self.queue(state, home).ready.push(r);
        }
        for home in homes.values() {
            if let Some(q) = state.senders.get(home) {
                q.wake.notify_one();
            }
        }
        moved
    }

    /// Whether the sender of `addr` has something to send. Batches held
    /// back by the idempotence window are not: their sender waits for it
    /// to move.
    /// `conn` is the live connection to `addr`, if any.
    pub(super) fn work(&self, addr: &str, conn: Option<u64>) -> Work {
        let mut guard = self.lock();
        let State { topics, senders, closing, .. } = &mut *guard;
        match senders.get(addr) {
            Some(q) if !q.ready.is_empty() || q.sealed.iter().any(|b| may_send(topics, b, conn)) => {
                Work::Some
            }
            Some(q) if !q.sealed.is_empty() => Work::Idle,
            _ if *closing => Work::Done,
            _ => Work::Idle,
        }
    }

    /// Seals the ready batches of `addr` and takes one request's worth
    /// (at most `request_bytes_max`, at least one batch) of its sealed
    /// batches, to go on connection `conn` (`None`: to be retried).
    pub(super) fn take_request(&self, addr: &str, conn: Option<u64>) -> Vec<SealedBatch> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(q) = state.senders.get_mut(addr) else { return Vec::new() };
        let ready = std::mem::take(&mut q.ready);
        for (topic, partition, id) in ready {
            if state.is_open(&topic, partition, id) {
                self.seal(state, &topic, partition);
            }
        }
        let State { topics, senders, .. } = state;
        let Some(q) = senders.get_mut(addr) else { return Vec::new() };
        let mut bytes = 0usize;
        let mut taken = Vec::new();
        // Idempotence: batches held back by the window keep their place, and
        // so does every later batch of their partition.
        let mut held: Vec<SealedBatch> = Vec::new();
        while let Some(b) = q.sealed.pop_front() {
            if !taken.is_empty() && bytes + b.data.len() > self.ctx.request_bytes_max {
                q.sealed.push_front(b);
                break;
            }
            let behind = held.iter().any(|h| h.partition == b.partition && h.topic == b.topic);
            if behind || !may_send(topics, &b, conn) {
                held.push(b);
                continue;
            }
            if let Some(n) = b.numbering {
                if let Some(slot) = slot_of(topics, &b) {
                    slot.queued.remove(&n.ordinal);
                    slot.wire_conn = conn;
                }
            }
            bytes += b.data.len();
            taken.push(b);
        }
        for b in held.into_iter().rev() {
            q.sealed.push_front(b);
        }
        taken
    }

    /// A sealed batch completed (delivered or failed for good); `ordinal`
    /// is its place in its partition's numbering (idempotence).
    pub(super) fn batch_done(&self, id: u64, topic: &str, partition: u32, ordinal: Option<u64>) {
        let mut state = self.lock();
        state.outstanding.remove(&id);
        let mut released = false;
        if let Some(slot) = state.topics.get_mut(topic).and_then(|t| t.partitions.get_mut(partition as usize))
        {
            slot.outstanding -= 1;
            if slot.outstanding == 0 && !slot.rewinds.is_empty() {
                slot.rewinds.clear();
                self.rewinding.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(ordinal) = ordinal {
                slot.unfinished.remove(&ordinal);
                slot.retrying.remove(&ordinal);
                slot.queued.remove(&ordinal);
                released = std::mem::take(&mut slot.held);
            }
        }
        if released {
            for q in state.senders.values().filter(|q| !q.sealed.is_empty()) {
                q.wake.notify_one();
            }
        }
        drop(state);
        self.completed.notify_waiters();
    }

    /// Idempotence: an idempotent batch failed for good and the broker did
    /// not write it. Its sequences are given back: batches numbered after
    /// it are renumbered before they are sent again ([`Core::renumber`]),
    /// and the next batch sealed starts where it started (Kafka's
    /// `adjustSequencesDueToFailedBatch`). Without this every later batch
    /// of the partition is refused as out of order, for ever.
    pub(super) fn give_back_sequences(
        &self,
        topic: &str,
        partition: u32,
        numbering: Numbering,
        records: u32,
    ) {
        let mut state = self.lock();
        let Some(slot) = state.topics.get_mut(topic).and_then(|t| t.partitions.get_mut(partition as usize))
        else {
            return;
        };
        slot.generation += 1;
        if slot.rewinds.is_empty() {
            self.rewinding.fetch_add(1, Ordering::Relaxed);
        }
        slot.rewinds.push(Rewind { ordinal: numbering.ordinal, records, generation: slot.generation });
        slot.next_sequence = sequence_back(slot.next_sequence, u64::from(records));
    }

    /// Idempotence: `batches` (taken by a sender, or sealed) are to be
    /// retried: later batches of their partitions wait (see the module docs).
    pub(super) fn enter_retry(&self, batches: &[SealedBatch]) {
        if batches.iter().all(|b| b.numbering.is_none()) {
            return;
        }
        let mut state = self.lock();
        for b in batches {
            let Some(n) = b.numbering else { continue };
            if let Some(slot) = slot_of(&mut state.topics, b) {
                slot.retrying.insert(n.ordinal);
            }
        }
        drop(state);
        // Retries waiting for their turn look again (fewer batches on the wire).
        self.completed.notify_waiters();
    }

    /// Idempotence: waits until retried batch `b` may go: it is the oldest
    /// unfinished batch of its partition and nothing else of the partition
    /// is on the wire (an answer still to come might be that of a batch
    /// after it, stored first; see the module docs).
    pub(super) async fn until_retry_turn(&self, b: &SealedBatch) {
        let Some(numbering) = b.numbering else { return };
        loop {
            let completed = self.completed.notified();
            tokio::pin!(completed);
            completed.as_mut().enable();
            {
                let state = self.lock();
                let slot = state.topics.get(&b.topic).and_then(|t| t.partitions.get(b.partition as usize));
                let turn = slot.is_none_or(|s| {
                    s.unfinished.first().is_none_or(|&oldest| oldest == numbering.ordinal) && s.on_wire() == 0
                });
                if turn {
                    return;
                }
            }
            completed.await;
        }
    }

    /// Idempotence: the base sequence `numbering`'s batch must carry now,
    /// when batches before it failed unwritten after it was numbered; the
    /// numbering to record with it.
    pub(super) fn renumber(&self, topic: &str, partition: u32, numbering: Numbering) -> Option<Numbering> {
        if self.rewinding.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let state = self.lock();
        let slot = state.topics.get(topic).and_then(|t| t.partitions.get(partition as usize))?;
        let back: u64 = slot
            .rewinds
            .iter()
            .filter(|r| r.ordinal < numbering.ordinal && r.generation > numbering.generation)
            .map(|r| u64::from(r.records))
            .sum();
        (back > 0).then(|| Numbering {
            base_sequence: sequence_back(numbering.base_sequence, back),
            generation: slot.generation,
            ..numbering
        })
    }

    /// Seals every open batch and waits until every batch opened before this
    /// call has completed.
    pub async fn flush(&self) {
        let upto = {
            let mut state = self.lock();
            self.seal_all(&mut state);
            state.next_id
        };
        loop {
            let notified = self.completed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.lock().outstanding.first().is_none_or(|&id| id >= upto) {
                return;
            }
            notified.await;
        }
    }

    /// The last producer handle is gone: send what is left, then let the
    /// background tasks end once idle.
    pub fn shutdown(&self) {
        let mut state = self.lock();
        self.seal_all(&mut state);
        state.closing = true;
        for q in state.senders.values() {
            q.wake.notify_one();
        }
        self.linger_wake.notify_one();
    }

    /// Moves batches whose linger is over to their senders; returns the next
    /// deadline (`None` inside when none), or `None` once shutting down.
    fn expire_lingers(&self) -> Option<Option<Instant>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.closing {
            return None;
        }
        let now = Instant::now();
        while let Some((deadline, _, _, _)) = state.linger_queue.front() {
            if *deadline > now {
                return Some(Some(*deadline));
            }
            let (_, topic, partition, id) = state.linger_queue.pop_front().expect("front exists");
            if state.is_open(&topic, partition, id) {
                self.make_ready(state, &topic, partition, id);
            }
        }
        Some(None)
    }

    /// An owning handle to this core, for a task to keep.
    fn arc(&self) -> Arc<Core> {
        self.me.upgrade().expect("the core is alive while a method runs on it")
    }
}

/// Moves batches to their senders as their linger ends; ends on shutdown.
async fn linger_loop(core: Arc<Core>) {
    loop {
        match core.expire_lingers() {
            None => return,
            Some(Some(deadline)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline.into()) => {}
                    () = core.linger_wake.notified() => {}
                }
            }
            Some(None) => core.linger_wake.notified().await,
        }
    }
}
