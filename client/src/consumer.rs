//! The consumer: assigned partitions, explicit positions, long-polling
//! fetches sent straight to each partition's owner shard.
//!
//! At most one fetch is outstanding per owner-shard address; it carries
//! every assigned partition that shard owns. Fetches to different shards run
//! concurrently, and the next fetch to a shard is sent as soon as its
//! previous answer is consumed (before `poll` returns), so the network works
//! while the application processes records. A fetch still outstanding when
//! `poll`'s timeout ends is picked up by the next `poll`. Answers that
//! predate a `seek` are dropped by comparing a per-partition generation.

use crate::cluster::Cluster;
use crate::config::{ConsumerConfig, OffsetReset};
use crate::error::{ClientError, Result};
use crate::protocol::{self, FetchParams, FetchResult, FetchTarget, OffsetQuery};
use bytes::Bytes;
use shardlog_schema::batch::{records, BatchIter};
use shardlog_schema::ErrorCode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Largest batch the consumer accepts (a bound against a corrupt length).
const BATCH_BYTES_MAX: usize = 256 << 20;

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
    in_flight: bool,
    /// Owner-shard address; `None` until (re)resolved from metadata.
    leader: Option<String>,
    /// Set by `OffsetOutOfRange`: resolve the position again before fetching.
    needs_reset: bool,
    high_watermark: i64,
}

struct FetchOutcome {
    addr: String,
    /// (topic, partition, generation) of each partition fetched.
    sent: Vec<(Arc<str>, u32, u64)>,
    result: Result<Vec<FetchResult>>,
}

/// The consumer. Not `Clone`: it owns its positions.
pub struct Consumer {
    cluster: Arc<Cluster>,
    config: ConsumerConfig,
    parts: HashMap<(Arc<str>, u32), PartState>,
    busy: HashMap<String, bool>,
    next_generation: u64,
    results_tx: mpsc::UnboundedSender<FetchOutcome>,
    results_rx: mpsc::UnboundedReceiver<FetchOutcome>,
}

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
            busy: HashMap::new(),
            next_generation: 1,
            results_tx,
            results_rx,
        })
    }

    /// Replaces the assignment with `partitions`, each starting at `start`.
    pub async fn assign(&mut self, partitions: &[(String, u32)], start: SeekTo) -> Result<()> {
        let mut topics: Vec<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
        topics.sort();
        topics.dedup();
        let md = self.cluster.refresh(Some(&topics)).await?;
        for (t, p) in partitions {
            md.leader_addr(t, *p)?;
        }
        let positions = self.resolve(partitions, start).await?;
        self.parts.clear();
        for ((t, p), position) in partitions.iter().zip(positions) {
            let generation = self.bump();
            self.parts.insert(
                (Arc::from(t.as_str()), *p),
                PartState {
                    topic: Arc::from(t.as_str()),
                    position,
                    generation,
                    in_flight: false,
                    leader: md.leader_addr(t, *p).ok(),
                    needs_reset: false,
                    high_watermark: -1,
                },
            );
        }
        Ok(())
    }

    fn bump(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Offsets for `partitions` at `to` (ListOffsets unless an explicit offset).
    async fn resolve(&self, partitions: &[(String, u32)], to: SeekTo) -> Result<Vec<u64>> {
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
        state.needs_reset = false;
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
            self.send_fetches().await?;
            let outcome = match tokio::time::timeout_at(deadline, self.results_rx.recv()).await {
                Ok(Some(o)) => o,
                Ok(None) => return Err(ClientError::Closed),
                Err(_) => return Ok(out),
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
                    s.leader = Some(md.leader_addr(t, *p)?);
                }
            }
        }
        let mut by_addr: HashMap<String, Vec<FetchTarget>> = HashMap::new();
        let mut sent: HashMap<String, Vec<(Arc<str>, u32, u64)>> = HashMap::new();
        for ((t, p), s) in &mut self.parts {
            let addr = s.leader.clone().expect("resolved above");
            if s.in_flight || self.busy.get(&addr).copied().unwrap_or(false) {
                continue;
            }
            s.in_flight = true;
            by_addr.entry(addr.clone()).or_default().push(FetchTarget {
                topic: t.to_string(),
                partition: *p,
                offset: s.position,
                max_bytes: self.config.partition_max_bytes,
            });
            sent.entry(addr).or_default().push((t.clone(), *p, s.generation));
        }
        let params = FetchParams {
            max_wait_ms: self.config.fetch_max_wait_ms,
            min_bytes: self.config.fetch_min_bytes,
            max_bytes: self.config.fetch_max_bytes,
        };
        for (addr, targets) in by_addr {
            self.busy.insert(addr.clone(), true);
            let sent = sent.remove(&addr).unwrap_or_default();
            let cluster = self.cluster.clone();
            let tx = self.results_tx.clone();
            tokio::spawn(async move {
                let result = fetch(&cluster, &addr, params, &targets).await;
                if result.as_ref().is_err_and(ClientError::is_retriable) {
                    tokio::time::sleep(Duration::from_millis(cluster.config.retry_backoff_ms)).await;
                }
                let _ = tx.send(FetchOutcome { addr, sent, result });
            });
        }
        Ok(())
    }

    async fn reset_positions(&mut self) -> Result<()> {
        let to = match self.config.offset_reset {
            OffsetReset::Earliest => SeekTo::Earliest,
            OffsetReset::Latest => SeekTo::Latest,
            OffsetReset::Error => return Ok(()),
        };
        let stale: Vec<(String, u32)> =
            self.parts.iter().filter(|(_, s)| s.needs_reset).map(|((t, p), _)| (t.to_string(), *p)).collect();
        for (t, p) in stale {
            tracing::info!(topic = %t, partition = p, ?to, "offset out of range; resetting");
            self.seek(&t, p, to).await?;
        }
        Ok(())
    }

    /// Takes one fetch answer: appends its records to `out`, advances positions.
    async fn absorb(&mut self, outcome: FetchOutcome, out: &mut Vec<ConsumerRecord>) -> Result<()> {
        self.busy.insert(outcome.addr.clone(), false);
        let mut current = Vec::with_capacity(outcome.sent.len());
        for (t, p, generation) in &outcome.sent {
            if let Some(s) = self.parts.get_mut(&(t.clone(), *p)) {
                // This partition's fetch is over either way; an answer from
                // before a seek is dropped (its generation is stale).
                s.in_flight = false;
                if s.generation == *generation {
                    current.push((t.clone(), *p));
                }
            }
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
                ErrorCode::OffsetOutOfRange if self.config.offset_reset != OffsetReset::Error => {
                    s.needs_reset = true;
                }
                code if shardlog_schema::error::is_retriable(code) => s.leader = None,
                code => return Err(ClientError::broker(code, r.message.as_deref())),
            }
        }
        Ok(())
    }
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
        if header.last_offset() < position {
            continue;
        }
        let views = records(bytes).map_err(|e| {
            ClientError::Protocol(format!(
                "corrupt records in {topic}/{partition} at {}: {e}",
                header.base_offset
            ))
        })?;
        for r in views {
            if r.offset < position {
                continue;
            }
            out.push(ConsumerRecord {
                topic: topic.clone(),
                partition,
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key.map(|k| data.slice_ref(k)),
                value: data.slice_ref(r.value),
                headers: r.headers.iter().map(|(k, v)| ((*k).to_string(), data.slice_ref(v))).collect(),
            });
        }
        position = position.max(header.next_offset());
    }
    Ok(position)
}
