//! The consumer: assigned partitions, explicit positions, long-polling
//! fetches sent straight to each partition's owner shard.
//!
//! Each owner-shard address has one fetch task while partitions it owns are
//! assigned. The task long-polls every assigned partition of that shard and,
//! as soon as an answer arrives, works out the next offsets from the batch
//! headers alone and sends the next fetch, before the consumer decodes the
//! answer: the broker serves the next fetch while the application works. At
//! most [`FETCHES_AHEAD_MAX`] answers per task wait unconsumed. A task stops
//! after an error (the consumer starts a fresh one on the next `poll`) and is
//! stopped by `seek` and `assign`; answers of a stopped task, and answers
//! that predate a `seek` (a per-partition generation), are dropped.
//!
//! A position outside the log (past its end, or deleted by retention) gets
//! `OffsetOutOfRange` from the broker: the consumer moves it as
//! `ConsumerConfig::offset_reset` says and records the move for
//! [`Consumer::take_resets`], or (`OffsetReset::Error`) `poll` returns
//! [`ClientError::OffsetOutOfRange`].

use crate::cluster::Cluster;
use crate::config::{ConsumerConfig, OffsetReset};
use crate::error::{ClientError, Result};
use crate::protocol::{self, FetchParams, FetchResult, FetchTarget, OffsetQuery};
use bytes::Bytes;
use shardlog_schema::batch::{peek_total_bytes, BatchError, BatchHeader, BatchIter, BATCH_HEADER_BYTES};
use shardlog_schema::wire;
use shardlog_schema::ErrorCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Largest batch the consumer accepts (a bound against a corrupt length).
const BATCH_BYTES_MAX: usize = 256 << 20;
/// Answers one fetch task may have waiting for the consumer (fetch-ahead depth).
pub const FETCHES_AHEAD_MAX: usize = 2;

/// Where to start reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTo {
    /// The first offset still in the log.
    Earliest,
    /// The log end: only records written from now on.
    Latest,
    Offset(u64),
    /// The first record whose timestamp is >= this (ms); the log end when none.
    Timestamp(i64),
}

/// A position the consumer moved by its `offset_reset` policy because the
/// broker answered `OffsetOutOfRange` (see [`Consumer::take_resets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionReset {
    pub topic: String,
    pub partition: u32,
    /// The position that was out of range.
    pub from: u64,
    /// The position it was reset to.
    pub to: u64,
    pub policy: OffsetReset,
    /// The log start and high watermark the broker reported with the error
    /// (-1: unknown): the readable offsets were `log_start..high_watermark`.
    pub log_start: i64,
    pub high_watermark: i64,
}

/// A record read from a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    pub topic: Arc<str>,
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Vec<(String, Bytes)>,
}

struct PartState {
    topic: Arc<str>,
    /// Next offset to return.
    position: u64,
    /// Changes on every seek/assign; fetch answers carry the one they were sent with.
    generation: u64,
    /// Owner-shard address; `None` until (re)resolved from metadata.
    leader: Option<String>,
    /// Set by `OffsetOutOfRange`: resolve the position again before
    /// fetching. Holds the log start and high watermark the broker reported.
    needs_reset: Option<(i64, i64)>,
    high_watermark: i64,
}

/// What a fetch task fetched for one partition: (topic, partition, generation, offset).
type Sent = (Arc<str>, u32, u64, u64);

struct FetchOutcome {
    addr: String,
    /// The task that fetched (answers of a stopped task are dropped).
    task: u64,
    sent: Vec<Sent>,
    result: Result<Vec<FetchResult>>,
    /// The task ended after this answer.
    last: bool,
    /// Held until the answer is consumed: bounds the answers waiting.
    _slot: OwnedSemaphorePermit,
}

/// A running fetch task.
struct FetchTask {
    id: u64,
    stop: Arc<AtomicBool>,
}

/// The consumer. Not `Clone`: it owns its positions.
pub struct Consumer {
    cluster: Arc<Cluster>,
    config: ConsumerConfig,
    parts: HashMap<(Arc<str>, u32), PartState>,
    /// The fetch task of each owner-shard address that has one.
    tasks: HashMap<String, FetchTask>,
    next_generation: u64,
    next_task: u64,
    results_tx: mpsc::UnboundedSender<FetchOutcome>,
    results_rx: mpsc::UnboundedReceiver<FetchOutcome>,
    /// Resets not yet taken by [`Consumer::take_resets`] (bounded: one
    /// per assigned partition and poll at most, see `take_resets`).
    resets: Vec<PositionReset>,
    /// The group membership, once subscribed (`consumer_group.rs`).
    pub(crate) member: Option<crate::consumer_group::Member>,
}

/// What `poll` woke up for.
enum Wake {
    Fetched(std::result::Result<Option<FetchOutcome>, tokio::time::error::Elapsed>),
    Joined(crate::consumer_group::JoinResult),
}

/// Resets kept for `take_resets` at most; older ones are dropped.
const RESETS_KEPT_MAX: usize = 1024;

fn seek_timestamp(to: SeekTo) -> Option<i64> {
    match to {
        SeekTo::Earliest => Some(protocol::LIST_OFFSETS_EARLIEST),
        SeekTo::Latest => Some(protocol::LIST_OFFSETS_LATEST),
        SeekTo::Timestamp(ts) => Some(ts),
        SeekTo::Offset(_) => None,
    }
}

impl Consumer {
    pub async fn new(config: ConsumerConfig) -> Result<Consumer> {
        let cluster = Cluster::connect(config.client.clone(), Some(&[])).await?;
        let (results_tx, results_rx) = mpsc::unbounded_channel();
        Ok(Consumer {
            cluster,
            config,
            parts: HashMap::new(),
            tasks: HashMap::new(),
            next_generation: 1,
            next_task: 1,
            results_tx,
            results_rx,
            resets: Vec::new(),
            member: None,
        })
    }

    /// Replaces the assignment with `partitions`, each starting at `start`.
    /// (A subscribed consumer's assignment belongs to its group.)
    pub async fn assign(&mut self, partitions: &[(String, u32)], start: SeekTo) -> Result<()> {
        if self.member.is_some() {
            return Err(ClientError::Config(
                "the consumer is subscribed: its group assigns its partitions".into(),
            ));
        }
        self.assign_at(partitions, &vec![None; partitions.len()], start).await
    }

    /// Replaces the assignment: each partition starts at its given offset,
    /// or at `start` when it has none.
    pub(crate) async fn assign_at(
        &mut self,
        partitions: &[(String, u32)],
        given: &[Option<u64>],
        start: SeekTo,
    ) -> Result<()> {
        let states = self.start_states(partitions, given, start).await?;
        self.stop_all_tasks();
        self.parts = states.into_iter().collect();
        Ok(())
    }

    /// Adds `partitions` (not assigned yet) to the assignment, each at its
    /// given offset or at `start`; the assigned ones keep their positions.
    pub(crate) async fn add_at(
        &mut self,
        partitions: &[(String, u32)],
        given: &[Option<u64>],
        start: SeekTo,
    ) -> Result<()> {
        for (key, state) in self.start_states(partitions, given, start).await? {
            // The shard's fetch task restarts with the new set at the next send.
            if let Some(addr) = &state.leader {
                self.stop_task(addr);
            }
            let (t, p) = (key.0.clone(), key.1);
            assert!(self.parts.insert(key, state).is_none(), "{t}/{p} was added while assigned");
        }
        Ok(())
    }

    /// Takes `partitions` out of the assignment; the others keep their
    /// positions (a fetch task that served one restarts without it).
    pub(crate) fn unassign(&mut self, partitions: &[(String, u32)]) {
        for (t, p) in partitions {
            if let Some(addr) = self.parts.remove(&(Arc::from(t.as_str()), *p)).and_then(|s| s.leader) {
                self.stop_task(&addr);
            }
        }
    }

    /// The state of each of `partitions` at its given offset or at `start`
    /// (checks that each has a leader).
    async fn start_states(
        &mut self,
        partitions: &[(String, u32)],
        given: &[Option<u64>],
        start: SeekTo,
    ) -> Result<Vec<((Arc<str>, u32), PartState)>> {
        let mut topics: Vec<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
        topics.sort();
        topics.dedup();
        let md = if topics.is_empty() {
            self.cluster.metadata()
        } else {
            self.cluster.refresh(Some(&topics)).await?
        };
        for (t, p) in partitions {
            md.leader_addr(t, *p)?;
        }
        let unknown: Vec<(String, u32)> =
            partitions.iter().zip(given).filter(|(_, g)| g.is_none()).map(|(p, _)| p.clone()).collect();
        let mut resolved = self.resolve(&unknown, start).await?.into_iter();
        let positions: Vec<u64> =
            given.iter().map(|g| g.or_else(|| resolved.next()).unwrap_or_default()).collect();
        let mut states = Vec::with_capacity(partitions.len());
        for ((t, p), position) in partitions.iter().zip(positions) {
            let topic: Arc<str> = Arc::from(t.as_str());
            let state = PartState {
                topic: topic.clone(),
                position,
                generation: self.bump(),
                leader: md.leader_addr(t, *p).ok(),
                needs_reset: None,
                high_watermark: -1,
            };
            states.push(((topic, *p), state));
        }
        Ok(states)
    }

    fn bump(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Offsets for `partitions` at `to` (ListOffsets unless an explicit offset).
    async fn resolve(&self, partitions: &[(String, u32)], to: SeekTo) -> Result<Vec<u64>> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let Some(timestamp) = seek_timestamp(to) else {
            let SeekTo::Offset(o) = to else { unreachable!("only Offset has no timestamp") };
            return Ok(vec![o; partitions.len()]);
        };
        let queries: Vec<OffsetQuery> = partitions
            .iter()
            .map(|(t, p)| OffsetQuery { topic: t.clone(), partition: *p, timestamp })
            .collect();
        let answers = self.cluster.list_offsets(&queries).await?;
        let mut out = Vec::with_capacity(answers.len());
        let mut latest = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            if a.error != ErrorCode::None {
                return Err(ClientError::broker(a.error, Some("list offsets")));
            }
            if a.offset < 0 {
                latest.push(i); // no record at or after the timestamp: the log end
            }
            out.push(a.offset.max(0) as u64);
        }
        if !latest.is_empty() {
            let end: Vec<(String, u32)> = latest.iter().map(|&i| partitions[i].clone()).collect();
            let ends = Box::pin(self.resolve(&end, SeekTo::Latest)).await?;
            for (&i, o) in latest.iter().zip(ends) {
                out[i] = o;
            }
        }
        Ok(out)
    }

    /// Moves one assigned partition's position.
    pub async fn seek(&mut self, topic: &str, partition: u32, to: SeekTo) -> Result<()> {
        let key = (Arc::from(topic), partition);
        if !self.parts.contains_key(&key) {
            return Err(ClientError::Config(format!("{topic}/{partition} is not assigned")));
        }
        let position = self.resolve(&[(topic.to_string(), partition)], to).await?[0];
        let generation = self.bump();
        let state = self.parts.get_mut(&key).expect("checked above");
        state.position = position;
        state.generation = generation;
        state.needs_reset = None;
        if let Some(addr) = state.leader.clone() {
            self.stop_task(&addr);
        }
        Ok(())
    }

    /// The next offset `poll` returns for an assigned partition.
    #[must_use]
    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        self.parts.get(&(Arc::from(topic), partition)).map(|s| s.position)
    }

    /// The high watermark the last fetch reported (`None` before any fetch).
    #[must_use]
    pub fn high_watermark(&self, topic: &str, partition: u32) -> Option<u64> {
        self.parts.get(&(Arc::from(topic), partition)).and_then(|s| u64::try_from(s.high_watermark).ok())
    }

    /// Long-polls every assigned partition. Returns as soon as some records
    /// arrive, or an empty vector once `timeout` passes.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            // `out` is empty here: what an auto-commit commits was returned.
            if self.member.is_some() {
                self.maintain_group().await?;
            }
            self.send_fetches().await?;
            let fetched = tokio::time::timeout_at(deadline, self.results_rx.recv());
            // A join in flight (the group rebalances): fetching what the
            // member kept goes on until the new generation is applied.
            let wake = match self.member.as_mut().and_then(|m| m.joining.as_mut()) {
                None => Wake::Fetched(fetched.await),
                Some(join) => tokio::select! {
                    f = fetched => Wake::Fetched(f),
                    j = join => Wake::Joined(j),
                },
            };
            let outcome = match wake {
                Wake::Fetched(Ok(Some(o))) => o,
                Wake::Fetched(Ok(None)) => return Err(ClientError::Closed),
                Wake::Fetched(Err(_)) => return Ok(out),
                Wake::Joined(j) => {
                    self.member.as_mut().expect("joining").joining = None;
                    self.joined(j).await?;
                    continue;
                }
            };
            self.absorb(outcome, &mut out).await?;
            while let Ok(o) = self.results_rx.try_recv() {
                self.absorb(o, &mut out).await?;
            }
            if !out.is_empty() {
                // Prefetch while the caller works on these records.
                self.send_fetches().await?;
                return Ok(out);
            }
        }
    }

    /// Sends a fetch to every owner shard that has none outstanding.
    async fn send_fetches(&mut self) -> Result<()> {
        self.reset_positions().await?;
        if self.parts.values().any(|s| s.leader.is_none()) {
            let mut topics: Vec<String> =
                self.parts.values().filter(|s| s.leader.is_none()).map(|s| s.topic.to_string()).collect();
            topics.sort();
            topics.dedup();
            let md = self.cluster.refresh(Some(&topics)).await?;
            for ((t, p), s) in &mut self.parts {
                if s.leader.is_none() {
                    match md.leader_addr(t, *p) {
                        Ok(addr) => s.leader = Some(addr),
                        // No live leader (its broker is down): skipped
                        // until a later poll finds one.
                        Err(e) if e.is_retriable() => {
                            tracing::debug!(topic = %t, partition = p, error = %e, "partition not fetched");
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        let mut by_addr: HashMap<String, (Vec<FetchTarget>, Vec<Sent>)> = HashMap::new();
        for ((t, p), s) in &self.parts {
            let Some(addr) = s.leader.as_ref() else { continue };
            if self.tasks.contains_key(addr) {
                continue;
            }
            let (targets, sent) = by_addr.entry(addr.clone()).or_default();
            targets.push(FetchTarget {
                topic: t.to_string(),
                partition: *p,
                offset: s.position,
                max_bytes: self.config.partition_max_bytes,
            });
            sent.push((t.clone(), *p, s.generation, s.position));
        }
        let params = FetchParams {
            max_wait_ms: self.config.fetch_max_wait_ms,
            min_bytes: self.config.fetch_min_bytes,
            max_bytes: self.config.fetch_max_bytes,
        };
        for (addr, (targets, sent)) in by_addr {
            let id = self.next_task;
            self.next_task += 1;
            let stop = Arc::new(AtomicBool::new(false));
            self.tasks.insert(addr.clone(), FetchTask { id, stop: stop.clone() });
            let task = FetchLoop {
                cluster: self.cluster.clone(),
                addr,
                id,
                params,
                targets,
                sent,
                tx: self.results_tx.clone(),
                stop,
            };
            tokio::spawn(task.run());
        }
        Ok(())
    }

    /// Stops the fetch task of `addr`; its unconsumed answers are dropped.
    fn stop_task(&mut self, addr: &str) {
        if let Some(t) = self.tasks.remove(addr) {
            t.stop.store(true, Ordering::Relaxed);
        }
    }

    /// The assigned partitions.
    #[must_use]
    pub fn assignment(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self.parts.keys().map(|(t, p)| (t.to_string(), *p)).collect();
        v.sort();
        v
    }

    /// (topic, partition, position) of every assigned partition.
    pub(crate) fn positions(&self) -> Vec<(String, u32, u64)> {
        let mut v: Vec<(String, u32, u64)> =
            self.parts.iter().map(|((t, p), s)| (t.to_string(), *p, s.position)).collect();
        v.sort();
        v
    }

    /// Records between the position and the high watermark of each assigned
    /// partition (`None` before its first fetch answer).
    #[must_use]
    pub fn lag(&self) -> Vec<(String, u32, Option<u64>)> {
        let mut v: Vec<(String, u32, Option<u64>)> = self
            .parts
            .iter()
            .map(|((t, p), s)| {
                (
                    t.to_string(),
                    *p,
                    u64::try_from(s.high_watermark).ok().map(|h| h.saturating_sub(s.position)),
                )
            })
            .collect();
        v.sort();
        v
    }

    pub(crate) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub(crate) fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    fn stop_all_tasks(&mut self) {
        for (_, t) in self.tasks.drain() {
            t.stop.store(true, Ordering::Relaxed);
        }
    }

    /// The positions moved by the `offset_reset` policy since the last call
    /// (oldest first), so that an application can say so: a reset skips or
    /// repeats records. At most the last 1,024 are kept.
    pub fn take_resets(&mut self) -> Vec<PositionReset> {
        std::mem::take(&mut self.resets)
    }

    async fn reset_positions(&mut self) -> Result<()> {
        let policy = self.config.offset_reset;
        let to = match policy {
            OffsetReset::Earliest => SeekTo::Earliest,
            OffsetReset::Latest => SeekTo::Latest,
            OffsetReset::Error => return Ok(()),
        };
        let stale: Vec<(String, u32, u64, (i64, i64))> = self
            .parts
            .iter()
            .filter_map(|((t, p), s)| Some((t.to_string(), *p, s.position, s.needs_reset?)))
            .collect();
        for (topic, partition, from, (log_start, high_watermark)) in stale {
            self.seek(&topic, partition, to).await?;
            let to = self.position(&topic, partition).expect("assigned");
            tracing::info!(%topic, partition, from, to, ?policy, "offset out of range; reset");
            if self.resets.len() >= RESETS_KEPT_MAX {
                self.resets.remove(0);
            }
            self.resets.push(PositionReset { topic, partition, from, to, policy, log_start, high_watermark });
        }
        Ok(())
    }

    /// Takes one fetch answer: appends its records to `out`, advances positions.
    async fn absorb(&mut self, outcome: FetchOutcome, out: &mut Vec<ConsumerRecord>) -> Result<()> {
        if self.tasks.get(&outcome.addr).is_none_or(|t| t.id != outcome.task) {
            return Ok(()); // from a stopped task
        }
        if outcome.last {
            self.tasks.remove(&outcome.addr);
        }
        let mut current = std::collections::HashSet::with_capacity(outcome.sent.len());
        let mut diverged = false;
        for (t, p, generation, offset) in &outcome.sent {
            if let Some(s) = self.parts.get(&(t.clone(), *p)) {
                // An answer from before a seek is dropped (its generation is
                // stale); one fetched from another offset means the task's
                // idea of the position went astray: restart it.
                if s.generation == *generation && s.position == *offset {
                    current.insert((t.clone(), *p));
                } else if s.generation == *generation {
                    diverged = true;
                }
            }
        }
        if diverged {
            self.stop_task(&outcome.addr);
        }
        let results = match outcome.result {
            Ok(r) => r,
            Err(e) if e.is_retriable() => {
                for key in &current {
                    if let Some(s) = self.parts.get_mut(key) {
                        s.leader = None;
                    }
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for r in results {
            let key = (Arc::<str>::from(r.topic.as_str()), r.partition);
            if !current.contains(&key) {
                continue;
            }
            let s = self.parts.get_mut(&key).expect("current partitions are assigned");
            match r.error {
                ErrorCode::None => {
                    s.high_watermark = r.high_watermark;
                    s.position = decode_records(&s.topic, r.partition, s.position, &r.data, out)?;
                }
                ErrorCode::OffsetOutOfRange => {
                    if self.config.offset_reset == OffsetReset::Error {
                        return Err(ClientError::OffsetOutOfRange {
                            topic: r.topic,
                            partition: r.partition,
                            offset: s.position,
                            log_start: r.log_start_offset,
                            high_watermark: r.high_watermark,
                        });
                    }
                    s.needs_reset = Some((r.log_start_offset, r.high_watermark));
                }
                code if shardlog_schema::error::is_retriable(code) => s.leader = None,
                code => return Err(ClientError::broker(code, r.message.as_deref())),
            }
        }
        Ok(())
    }
}

/// One owner shard's fetch task (see the module docs).
struct FetchLoop {
    cluster: Arc<Cluster>,
    addr: String,
    id: u64,
    params: FetchParams,
    targets: Vec<FetchTarget>,
    sent: Vec<Sent>,
    tx: mpsc::UnboundedSender<FetchOutcome>,
    stop: Arc<AtomicBool>,
}

impl FetchLoop {
    async fn run(mut self) {
        let slots = Arc::new(Semaphore::new(FETCHES_AHEAD_MAX));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            // Stopped, or the consumer is gone (its answers were dropped).
            if self.stop.load(Ordering::Relaxed) || self.tx.is_closed() {
                return;
            }
            let result = fetch(&self.cluster, &self.addr, self.params, &self.targets).await;
            if result.as_ref().is_err_and(ClientError::is_retriable) {
                tokio::time::sleep(Duration::from_millis(self.cluster.config.retry_backoff_ms)).await;
            }
            let sent = self.sent.clone();
            let had_data = result.as_ref().ok().and_then(|rs| advance(&mut self.targets, rs));
            let last = had_data.is_none() || self.stop.load(Ordering::Relaxed);
            let outcome =
                FetchOutcome { addr: self.addr.clone(), task: self.id, sent, result, last, _slot: slot };
            if self.tx.send(outcome).is_err() || last {
                return;
            }
            for (s, t) in self.sent.iter_mut().zip(&self.targets) {
                s.3 = t.offset;
            }
            if let Some(had_data) = had_data {
                rotate_fetched(&mut self.targets, &mut self.sent, &had_data);
            }
        }
    }
}

/// Moves each target past the whole batches of its answer; `false` when a
/// partition answered with an error (the task then stops). Returns, per
/// target, whether its answer carried data. The broker answers in request
/// order, so answer `i` is looked for at target `i` first.
fn advance(targets: &mut [FetchTarget], results: &[FetchResult]) -> Option<Vec<bool>> {
    let mut had_data = vec![false; targets.len()];
    for (i, r) in results.iter().enumerate() {
        if r.error != ErrorCode::None {
            return None;
        }
        let is = |t: &FetchTarget| t.partition == r.partition && t.topic == r.topic;
        let at = if targets.get(i).is_some_and(is) { Some(i) } else { targets.iter().position(is) };
        if let Some(at) = at {
            let t = &mut targets[at];
            let next = next_position(t.offset, &r.data);
            had_data[at] = next > t.offset;
            t.offset = next;
        }
    }
    Some(had_data)
}

/// Puts the partitions that just returned data behind the others, each
/// group in its order (Kafka's fetch-order rotation, KIP-74). The broker
/// fills a fetch's byte budget in request order, so without this the
/// partitions at the front would take the budget every time and those at
/// the back starve; with it, every partition with data is read within a
/// few fetches however many share the budget. `sent` stays aligned.
fn rotate_fetched(targets: &mut Vec<FetchTarget>, sent: &mut Vec<Sent>, had_data: &[bool]) {
    if !had_data.iter().any(|&d| d) || had_data.iter().all(|&d| d) {
        return;
    }
    let (idle, fetched): (Vec<_>, Vec<_>) =
        targets.drain(..).zip(sent.drain(..)).zip(had_data).partition(|(_, &data)| !data);
    for ((t, s), _) in idle.into_iter().chain(fetched) {
        targets.push(t);
        sent.push(s);
    }
}

/// The position after the whole batches in `data`, from their headers alone
/// (the same position `decode_records` reaches when every batch is sound).
fn next_position(mut position: u64, data: &[u8]) -> u64 {
    let mut at = 0;
    while let Some(total) = peek_total_bytes(&data[at..]) {
        if !(BATCH_HEADER_BYTES..=BATCH_BYTES_MAX).contains(&total) || data.len() - at < total {
            break;
        }
        let Ok(header) = BatchHeader::parse(&data[at..]) else { break };
        // A header past the largest offset is corrupt: `decode_records`
        // reports it; the walk stops before it.
        let Some(next) = header.checked_next_offset() else { break };
        position = position.max(next);
        at += total;
    }
    position
}

async fn fetch(
    cluster: &Cluster,
    addr: &str,
    params: FetchParams,
    targets: &[FetchTarget],
) -> Result<Vec<FetchResult>> {
    let conn = cluster.connection(addr).await?;
    let client_id = &cluster.config.client_id;
    let response = conn
        .submit(|corr| protocol::encode_fetch(corr, client_id, params, targets), Vec::new(), true)
        .await?;
    let raw = response.wait(Duration::from_millis(u64::from(params.max_wait_ms))).await?;
    protocol::decode_fetch(&raw)
}

/// Appends the records at or after `position` from concatenated batches;
/// returns the new position. A partial trailing batch is ignored (the next
/// fetch starts at it).
///
/// Each batch is checked (length, CRC) and its record set verified, then its
/// records are read straight from the flatbuffer into `out`: keys and values
/// are slices of `data`, never copies, and nothing is collected in between.
pub(crate) fn decode_records(
    topic: &Arc<str>,
    partition: u32,
    mut position: u64,
    data: &Bytes,
    out: &mut Vec<ConsumerRecord>,
) -> Result<u64> {
    for item in BatchIter::new(data, BATCH_BYTES_MAX) {
        let (header, bytes) = item.map_err(|e| {
            ClientError::Protocol(format!("corrupt batch in {topic}/{partition} near offset {position}: {e}"))
        })?;
        let corrupt = |e: &dyn std::fmt::Display| {
            ClientError::Protocol(format!(
                "corrupt records in {topic}/{partition} at {}: {e}",
                header.base_offset
            ))
        };
        let Some(next) = header.checked_next_offset() else {
            return Err(corrupt(&format_args!("{} records pass the largest offset", header.record_count)));
        };
        if header.last_offset() < position {
            continue;
        }
        if header.codec() != 0 {
            return Err(corrupt(&BatchError::UnsupportedCodec(header.codec())));
        }
        let set =
            flatbuffers::root::<wire::RecordSet>(&bytes[BATCH_HEADER_BYTES..]).map_err(|e| corrupt(&e))?;
        let records = set.records().unwrap_or_default();
        out.reserve(records.len());
        for (index, r) in records.iter().enumerate() {
            let (offset, timestamp_ms) = header
                .record_position(index, r.offset_delta(), r.timestamp_delta())
                .map_err(|e| corrupt(&e))?;
            if offset < position {
                continue;
            }
            out.push(ConsumerRecord {
                topic: topic.clone(),
                partition,
                offset,
                timestamp_ms,
                key: r.key().map(|k| data.slice_ref(k.bytes())),
                value: r.value().map_or_else(Bytes::new, |v| data.slice_ref(v.bytes())),
                headers: r.headers().map_or_else(Vec::new, |hs| {
                    hs.iter()
                        .map(|h| {
                            let value = h.value().map_or_else(Bytes::new, |v| data.slice_ref(v.bytes()));
                            (h.key().unwrap_or_default().to_string(), value)
                        })
                        .collect()
                }),
            });
        }
        position = position.max(next);
    }
    Ok(position)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlog_schema::batch::{stamp, BatchBuilder};

    fn target(p: u32, offset: u64) -> FetchTarget {
        FetchTarget { topic: "t".into(), partition: p, offset, max_bytes: 1 << 20 }
    }

    fn answer(p: u32, data: Vec<u8>) -> FetchResult {
        FetchResult {
            topic: "t".into(),
            partition: p,
            error: ErrorCode::None,
            message: None,
            high_watermark: 100,
            log_start_offset: 0,
            data: Bytes::from(data),
        }
    }

    /// Partitions that returned data go behind the others, so a byte budget
    /// filled in request order reaches every partition in turn.
    #[test]
    fn partitions_that_returned_data_move_to_the_back() {
        let mut targets: Vec<FetchTarget> = (0..5).map(|p| target(p, 10)).collect();
        let mut sent: Vec<Sent> = (0..5).map(|p| (Arc::from("t"), p, 0, 10)).collect();
        // Answers in another order than asked: matched by name, not place.
        let results =
            vec![answer(3, batch(10, &["a"])), answer(1, batch(10, &["a", "b"])), answer(0, vec![])];
        let had = advance(&mut targets, &results).expect("no error");
        assert_eq!(had, [false, true, false, true, false]);
        assert_eq!((targets[1].offset, targets[3].offset, targets[0].offset), (12, 11, 10));
        rotate_fetched(&mut targets, &mut sent, &had);
        let order: Vec<u32> = targets.iter().map(|t| t.partition).collect();
        assert_eq!(order, [0, 2, 4, 1, 3]);
        let sent_order: Vec<u32> = sent.iter().map(|s| s.1).collect();
        assert_eq!(sent_order, order, "sent stays aligned with targets");
        // An error stops the task.
        let mut failed = answer(2, vec![]);
        failed.error = ErrorCode::NotLeaderOrFollower;
        assert!(advance(&mut targets, &[failed]).is_none());
    }

    fn batch(base: u64, values: &[&str]) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(256);
        for v in values {
            b.push(None, v.as_bytes(), &[("h", b"x")], 1000);
        }
        let mut out = b.finish();
        stamp(&mut out, base, 0);
        out
    }

    /// A broker (or a corrupt file) handing out a batch at the top of the
    /// offset space gets a protocol error, not an overflow.
    #[test]
    fn batch_past_the_largest_offset_is_an_error() {
        let topic: Arc<str> = Arc::from("t");
        for base in [u64::MAX, u64::MAX - 1, shardlog_schema::batch::OFFSET_MAX] {
            let data = Bytes::from(batch(base, &["a", "b"]));
            let mut out = Vec::new();
            let err = decode_records(&topic, 0, 0, &data, &mut out).expect_err("corrupt");
            assert!(matches!(err, ClientError::Protocol(_)), "{err}");
            assert_eq!(next_position(5, &data), 5, "the walk stops before the batch");
        }
    }

    /// The fetch task's header-only walk lands where decoding does, and both
    /// skip records before the position and a partial trailing batch.
    #[test]
    fn header_walk_and_decode_agree() {
        let mut data = batch(10, &["a", "b", "c"]);
        data.extend(batch(13, &["d"]));
        let whole = data.len();
        data.extend(&batch(14, &["e", "f"])[..20]);
        let data = Bytes::from(data);
        let topic: Arc<str> = Arc::from("t");
        let mut out = Vec::new();
        let pos = decode_records(&topic, 1, 11, &data, &mut out).expect("decodes");
        assert_eq!(pos, 14);
        assert_eq!(next_position(11, &data), 14);
        assert_eq!(next_position(11, &data[..whole - 1]), 13, "a cut batch is not counted");
        let got: Vec<(u64, &[u8])> = out.iter().map(|r| (r.offset, &r.value[..])).collect();
        assert_eq!(got, vec![(11, &b"b"[..]), (12, b"c"), (13, b"d")]);
        assert_eq!(out[0].headers, vec![("h".to_string(), Bytes::from_static(b"x"))]);
        assert_eq!((out[0].timestamp_ms, &*out[0].topic, out[0].partition), (1000, "t", 1));
    }
}
