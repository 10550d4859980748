//! Sender tasks: one per owner-shard address. Each waits for a free
//! in-flight slot on its connection, then seals its ready batches, turns its
//! sealed batches into one pipelined produce request, and completes each
//! batch's records from the response.
//!
//! A request left unanswered for [`LEADER_CHECK_INTERVAL`] makes its
//! completion task look where its partitions lead now (metadata asked of
//! another broker first), then again an interval after each answer. A
//! leader frozen past its ZooKeeper session (a zombie) holds its requests
//! until the request timeout; once the cluster has elected other leaders
//! for every partition of a request, the request is given up as
//! `NotLeaderOrFollower`, its connection is not trusted again (as after a
//! timeout), and its batches are retried there. Batches still queued for
//! the zombie (its sender waits for an in-flight slot) move to the new
//! leader's queue once nothing earlier of their partition is in flight or
//! being retried (`Core::move_off`), so they never overtake it. The zombie
//! cannot acknowledge anything (its followers follow the new leader, which
//! truncates it when it comes back); with idempotence a batch the new
//! leader already holds is answered as the duplicate it is.

use super::accumulator::{Core, Numbering, Work};
use super::completion::{Completion, Landed};
use crate::cluster::Cluster;
use crate::config::{Acks, ProducerConfig};
use crate::conn::ResponseFuture;
use crate::error::{ClientError, Result};
use crate::protocol::RawResponse;
use crate::protocol::{self, ProduceEntry, ProduceResult};
use bytes::Bytes;
use shardlog_schema::{batch, ErrorCode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// How long a produce request may go unanswered before its partitions'
/// leaders are looked up again, and how often after that.
pub(crate) const LEADER_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What every sender and completion task needs besides the accumulator.
pub(crate) struct SenderCtx {
    pub cluster: Arc<Cluster>,
    /// Buffer-bytes semaphore of the producer; completed batches give back.
    pub buffer: Arc<Semaphore>,
    acks: i8,
    timeout_ms: u32,
    retries: u32,
    delivery_timeout: Duration,
    backoff: Duration,
    pub request_bytes_max: usize,
    /// Batches carry a producer id and sequences: the broker stores a
    /// retried batch once and refuses one that does not follow on
    /// (`OutOfOrderSequence`), which then waits for the batch before it.
    idempotent: bool,
}

impl SenderCtx {
    pub fn new(
        cluster: Arc<Cluster>,
        config: &ProducerConfig,
        buffer: Arc<Semaphore>,
        idempotent: bool,
    ) -> Self {
        SenderCtx {
            idempotent,
            acks: config.acks.wire(),
            timeout_ms: u32::try_from(config.client.request_timeout_ms).unwrap_or(u32::MAX),
            retries: config.retries,
            delivery_timeout: Duration::from_millis(config.delivery_timeout_ms),
            backoff: Duration::from_millis(config.client.retry_backoff_ms),
            request_bytes_max: config.request_bytes_max.max(1),
            buffer,
            cluster,
        }
    }

    fn expects_response(&self) -> bool {
        self.acks != Acks::None.wire()
    }

    /// Whether a failed batch is sent again. With idempotence an
    /// out-of-order refusal is too: an earlier batch of its partition failed
    /// and is being retried, and this one follows it once it lands.
    fn retriable(&self, e: &ClientError) -> bool {
        e.is_retriable()
            || (self.idempotent
                && matches!(e, ClientError::Broker { code, .. } if *code == ErrorCode::OutOfOrderSequence))
    }
}

/// A finished batch on its way to the broker.
pub(crate) struct SealedBatch {
    pub id: u64,
    pub topic: Arc<str>,
    pub partition: u32,
    pub data: Bytes,
    pub record_count: u32,
    /// Resolves every record's future at once.
    pub completion: Completion,
    pub buffer_bytes: usize,
    pub attempts: u32,
    /// When the batch was sealed: retries stop `delivery_timeout` after.
    pub sealed_at: std::time::Instant,
    /// When the last request carrying it was handed to its connection.
    pub requested_at: Option<std::time::Instant>,
    /// Idempotence: its place in the partition's sequence numbering.
    pub numbering: Option<Numbering>,
}

impl SealedBatch {
    /// Resolves every record's future, gives back the buffer bytes and tells
    /// the accumulator (for flush). `outcome` is (base offset, log append time).
    fn finish(self, core: &Core, outcome: Result<(i64, i64)>) {
        if let Err(e) = &outcome {
            tracing::debug!(topic = %self.topic, partition = self.partition, error = %e, "batch failed");
            if let (Some(numbering), true) = (self.numbering, not_written(e)) {
                core.give_back_sequences(&self.topic, self.partition, numbering, self.record_count);
            }
        }
        let acknowledged_at = std::time::Instant::now();
        let (sealed_at, requested_at) = (self.sealed_at, self.requested_at.unwrap_or(acknowledged_at));
        self.completion.complete(outcome.map(|(base_offset, append_time_ms)| Landed {
            base_offset,
            append_time_ms,
            acknowledged_at,
            sealed_at,
            requested_at,
        }));
        core.ctx.buffer.add_permits(self.buffer_bytes);
        core.batch_done(self.id, &self.topic, self.partition, self.numbering.map(|n| n.ordinal));
    }

    /// Idempotence: gives the batch the base sequence it must carry now
    /// (batches before it may have failed unwritten since it was numbered).
    fn renumber(&mut self, core: &Core) {
        let Some(numbering) = self.numbering else { return };
        if let Some(now) = core.renumber(&self.topic, self.partition, numbering) {
            tracing::debug!(
                topic = %self.topic, partition = self.partition, from = numbering.base_sequence,
                to = now.base_sequence, "renumbering a batch after earlier ones failed unwritten"
            );
            self.data = Bytes::from(batch::with_base_sequence(&self.data, now.base_sequence));
            self.numbering = Some(now);
        }
    }
}

/// Whether the broker's answer says the batch was not written: refused
/// whole before its append (too large, corrupt) or rolled back because the
/// disk is full. Any other failure (a timeout, a lost connection, a log
/// failed after writing) may have left it in the log, so its sequences are
/// never given to another batch.
fn not_written(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Broker { code, .. }
            if matches!(*code, ErrorCode::StorageFull | ErrorCode::MessageTooLarge | ErrorCode::CorruptMessage)
    )
}

/// Batches of one partition inside one request (payload order = entry order).
struct Entry {
    topic: Arc<str>,
    partition: u32,
    batches: Vec<SealedBatch>,
}

fn group(mut batches: Vec<SealedBatch>) -> Vec<Entry> {
    // Stable: batches of one partition keep their order.
    batches.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let mut entries: Vec<Entry> = Vec::new();
    for b in batches {
        match entries.last_mut() {
            Some(e) if e.topic == b.topic && e.partition == b.partition => e.batches.push(b),
            _ => entries.push(Entry { topic: b.topic.clone(), partition: b.partition, batches: vec![b] }),
        }
    }
    entries
}

fn encode(ctx: &SenderCtx, client_id: &str, corr: u32, entries: &[Entry]) -> Vec<u8> {
    let wire_entries: Vec<ProduceEntry<'_>> = entries
        .iter()
        .map(|e| ProduceEntry {
            topic: &e.topic,
            partition: e.partition,
            batch_bytes: e.batches.iter().map(|b| b.data.len() as u32).sum(),
        })
        .collect();
    protocol::encode_produce(corr, client_id, ctx.acks, ctx.timeout_ms, &wire_entries)
}

/// The sender task of `addr`: runs until the producer shuts down and its
/// queue is empty.
pub(crate) async fn send_loop(core: Arc<Core>, addr: String, wake: Arc<Notify>) {
    let ctx = &core.ctx;
    let shared_addr: Arc<str> = addr.as_str().into();
    loop {
        match core.work(&addr, ctx.cluster.live_connection_id(&addr)) {
            Work::Some => {}
            Work::Idle => {
                // `notify_one` leaves a permit when nobody waits: no wake-up is lost.
                wake.notified().await;
                continue;
            }
            Work::Done => return,
        }
        let conn = match ctx.cluster.connection(&addr).await {
            Ok(c) => c,
            Err(e) => {
                let batches = core.take_request(&addr, None);
                core.enter_retry(&batches);
                tokio::spawn(retry_batches(core.clone(), batches, Some(e)));
                continue;
            }
        };
        if ctx.expects_response() {
            // Ready batches keep growing while every in-flight slot is busy.
            // A broker that holds every slot this long may be frozen: what
            // waits for it and now leads elsewhere goes there.
            while tokio::time::timeout(LEADER_CHECK_INTERVAL, conn.wait_for_slot()).await.is_err() {
                let moved = core.move_off(&addr);
                if moved > 0 {
                    tracing::debug!(addr = %addr, moved, "batches moved to their partitions' new leaders");
                }
            }
        }
        let mut batches = core.take_request(&addr, Some(conn.id()));
        if batches.is_empty() {
            continue;
        }
        for b in &mut batches {
            b.renumber(&core);
        }
        let mut entries = group(batches);
        let payload: Vec<Bytes> =
            entries.iter().flat_map(|e| e.batches.iter().map(|b| b.data.clone())).collect();
        let client_id = ctx.cluster.config.client_id.clone();
        let submitted = conn
            .submit(|corr| encode(ctx, &client_id, corr, &entries), payload, ctx.expects_response())
            .await;
        let requested_at = std::time::Instant::now();
        for b in entries.iter_mut().flat_map(|e| &mut e.batches) {
            b.requested_at = Some(requested_at);
        }
        match submitted {
            Ok(_) if !ctx.expects_response() => {
                for b in flatten(entries) {
                    b.finish(&core, Ok((-1, -1)));
                }
            }
            Ok(response) => {
                tokio::spawn(complete(core.clone(), response, shared_addr.clone(), entries));
            }
            Err(e) => {
                let batches = flatten(entries);
                core.enter_retry(&batches);
                tokio::spawn(retry_batches(core.clone(), batches, Some(e)));
            }
        }
    }
}

fn flatten(entries: Vec<Entry>) -> Vec<SealedBatch> {
    entries.into_iter().flat_map(|e| e.batches).collect()
}

fn partition_error(r: &ProduceResult) -> ClientError {
    ClientError::broker(r.error, r.message.as_deref())
}

/// Waits for one produce response and resolves its batches; retriable
/// failures (and a request given up because a leader moved) go to the
/// retry path.
async fn complete(core: Arc<Core>, response: ResponseFuture, addr: Arc<str>, entries: Vec<Entry>) {
    let answer = answer_unless_moved(&core, response, &addr, &entries).await;
    let results = match answer.and_then(|raw| protocol::decode_produce(&raw)) {
        Ok(r) => r,
        Err(e) if core.ctx.retriable(&e) => return retry_batches(core, flatten(entries), Some(e)).await,
        Err(e) => {
            for b in flatten(entries) {
                b.finish(&core, Err(e.clone()));
            }
            return;
        }
    };
    let mut retry = Vec::new();
    let mut retry_err = None;
    for entry in entries {
        let Some(r) = results.iter().find(|r| *r.topic == *entry.topic && r.partition == entry.partition)
        else {
            let e =
                ClientError::Protocol(format!("no produce result for {}/{}", entry.topic, entry.partition));
            for b in entry.batches {
                b.finish(&core, Err(e.clone()));
            }
            continue;
        };
        if r.error == ErrorCode::None {
            let mut base = r.base_offset;
            for b in entry.batches {
                let count = i64::from(b.record_count);
                b.finish(&core, Ok((base, r.log_append_time_ms)));
                if base >= 0 {
                    base += count;
                }
            }
        } else if core.ctx.retriable(&partition_error(r)) {
            retry_err = Some(partition_error(r));
            retry.extend(entry.batches);
        } else {
            let e = partition_error(r);
            for b in entry.batches {
                b.finish(&core, Err(e.clone()));
            }
        }
    }
    if !retry.is_empty() {
        retry_batches(core, retry, retry_err).await;
    }
}

/// The response to a request sent to `addr`, unless every one of its
/// partitions is found leading elsewhere while it goes unanswered (see the
/// module docs): then `NotLeaderOrFollower`, a retriable error, and the
/// connection is not trusted again (as after a timeout). A request with a
/// partition still led at `addr` waits for its answer or its timeout: that
/// broker may only be slow, and sending its batches again would duplicate
/// them.
async fn answer_unless_moved(
    core: &Core,
    response: ResponseFuture,
    addr: &str,
    entries: &[Entry],
) -> Result<RawResponse> {
    let distrust = response.distrust_handle();
    let answer = response.wait(Duration::ZERO);
    tokio::pin!(answer);
    loop {
        tokio::select! {
            biased;
            r = &mut answer => return r,
            () = tokio::time::sleep(LEADER_CHECK_INTERVAL) => {}
        }
        let mut topics: Vec<String> = entries.iter().map(|e| e.topic.to_string()).collect();
        topics.dedup();
        // Asked of another broker first: the one holding this request may
        // be frozen, and would hold the look-up too.
        let lookup = core.ctx.cluster.refresh_around(Some(&topics), addr);
        let md = tokio::select! {
            biased;
            r = &mut answer => return r,
            md = lookup => md,
        };
        match md {
            Ok(md) => {
                let moved = entries
                    .iter()
                    .all(|e| md.leader_addr(&e.topic, e.partition).is_ok_and(|now| now != addr));
                if moved {
                    let e = &entries[0];
                    tracing::debug!(topic = %e.topic, partition = e.partition, from = addr,
                        "every partition of an unanswered produce request leads elsewhere now; retrying there");
                    distrust();
                    return Err(ClientError::broker(
                        ErrorCode::NotLeaderOrFollower,
                        Some(&format!(
                            "{}/{} and the request's other partitions lead elsewhere now; the request to {addr} went unanswered",
                            e.topic, e.partition
                        )),
                    ));
                }
            }
            Err(e) => tracing::debug!(error = %e, "leader look-up for an unanswered request failed"),
        }
    }
}

/// Retries batches one by one in their order; with idempotence each
/// partition's on their own, partitions side by side (a partition whose
/// retry waits for its turn, an earlier batch of it being in another retry,
/// holds back no other). Each batch gets up to `retries` attempts, no
/// later than `delivery_timeout` after it was sealed. An attempt waits out a backoff and refreshes the
/// metadata first, except right after the batch before it was delivered:
/// the path works again, and a request given up with many batches must not
/// pay a backoff for each of them.
pub(crate) async fn retry_batches(core: Arc<Core>, batches: Vec<SealedBatch>, err: Option<ClientError>) {
    core.enter_retry(&batches);
    if batches.iter().all(|b| b.numbering.is_none()) {
        return retry_in_order(core, batches, err).await;
    }
    let mut partitions: Vec<Vec<SealedBatch>> = Vec::new();
    for b in batches {
        match partitions.iter_mut().find(|p| p[0].partition == b.partition && p[0].topic == b.topic) {
            Some(p) => p.push(b),
            None => partitions.push(vec![b]),
        }
    }
    let mut partitions = partitions.into_iter();
    let first = partitions.next();
    for rest in partitions {
        tokio::spawn(retry_in_order(core.clone(), rest, err.clone()));
    }
    if let Some(first) = first {
        retry_in_order(core, first, err).await;
    }
}

/// [`retry_batches`] for the batches of one partition, in their order.
async fn retry_in_order(core: Arc<Core>, batches: Vec<SealedBatch>, err: Option<ClientError>) {
    let ctx = &core.ctx;
    let mut path_works = false;
    for mut b in batches {
        let mut last = err.clone();
        loop {
            if b.attempts >= ctx.retries || b.sealed_at.elapsed() >= ctx.delivery_timeout {
                let e = last.take().unwrap_or(ClientError::Protocol("batch could not be sent".into()));
                b.finish(&core, Err(e));
                break;
            }
            b.attempts += 1;
            if !path_works {
                tokio::time::sleep(ctx.backoff).await;
                if let Err(e) = ctx.cluster.refresh(Some(&[b.topic.to_string()])).await {
                    tracing::debug!(error = %e, "metadata refresh before retry failed");
                }
            }
            // Waiting for its turn counts against the delivery timeout.
            let deadline = tokio::time::Instant::from_std(b.sealed_at + ctx.delivery_timeout);
            if tokio::time::timeout_at(deadline, core.until_retry_turn(&b)).await.is_err() {
                last.get_or_insert(ClientError::Timeout);
                continue;
            }
            b.renumber(&core);
            match send_one(ctx, &b).await {
                Ok(offsets) => {
                    path_works = true;
                    b.finish(&core, Ok(offsets));
                    break;
                }
                Err(e) if ctx.retriable(&e) => {
                    path_works = false;
                    last = Some(e);
                }
                Err(e) => {
                    path_works = false;
                    b.finish(&core, Err(e));
                    break;
                }
            }
        }
    }
}

/// Sends one batch on its own and returns (base offset, log append time).
async fn send_one(ctx: &SenderCtx, b: &SealedBatch) -> Result<(i64, i64)> {
    let conn = ctx.cluster.leader(&b.topic, b.partition).await?;
    let entry = [ProduceEntry { topic: &b.topic, partition: b.partition, batch_bytes: b.data.len() as u32 }];
    let client_id = &ctx.cluster.config.client_id;
    let response = conn
        .submit(
            |corr| protocol::encode_produce(corr, client_id, ctx.acks, ctx.timeout_ms, &entry),
            vec![b.data.clone()],
            ctx.expects_response(),
        )
        .await?;
    if !ctx.expects_response() {
        return Ok((-1, -1));
    }
    let results = protocol::decode_produce(&response.wait(Duration::ZERO).await?)?;
    let r = results
        .iter()
        .find(|r| *r.topic == *b.topic && r.partition == b.partition)
        .ok_or_else(|| ClientError::Protocol(format!("no produce result for {}/{}", b.topic, b.partition)))?;
    if r.error != ErrorCode::None {
        return Err(partition_error(r));
    }
    Ok((r.base_offset, r.log_append_time_ms))
}
