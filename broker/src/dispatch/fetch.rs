//! Fetch with long polling: reads each partition on its owner, waits on
//! the partitions' data notifications until `min_bytes` or `max_wait_ms`.

use super::{response, DataChunk, Outgoing};
use crate::partition::PartitionError;
use crate::shard::{ShardContext, ShardOp, ShardReply};
use bytes::Bytes;
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One partition's part of a fetch response.
struct FetchPart {
    topic: String,
    partition: u32,
    offset: u64,
    max_bytes: u32,
    /// Rejected while decoding (negative offset): never read.
    rejected: bool,
    /// A follower's fetch: this broker id (else -1), and the epoch it follows.
    replica_id: i32,
    /// A follower's written log end: `offset` unless it fetches ahead (see
    /// `replica::fetcher`), never past it.
    replica_log_end: u64,
    leader_epoch: i32,
    error: Option<PartitionError>,
    high_watermark: i64,
    log_start_offset: i64,
    first_offset: i64,
    last_offset: i64,
    bytes: usize,
    chunks: Vec<DataChunk>,
}

impl FetchPart {
    fn reset(&mut self) {
        self.error = None;
        self.bytes = 0;
        self.chunks.clear();
        self.first_offset = -1;
        self.last_offset = -1;
    }
}

/// Reads one partition of a fetch, inside a `partition` span.
async fn read_part(ctx: &Rc<ShardContext>, part: &mut FetchPart, max_bytes: u32) {
    use tracing::Instrument;
    let span = tracing::info_span!("partition", topic = %part.topic, partition = part.partition);
    read_part_in_span(ctx, part, max_bytes).instrument(span).await
}

async fn read_part_in_span(ctx: &Rc<ShardContext>, part: &mut FetchPart, max_bytes: u32) {
    part.reset();
    if let Some(e) = ctx.check_served(&part.topic, part.partition) {
        part.error = Some(e);
        return;
    }
    let owner = ctx.owner(&part.topic, part.partition);
    if part.replica_id >= 0 && owner != ctx.id {
        part.error = Some(PartitionError::new(
            ErrorCode::NotLeaderOrFollower,
            format!("replica fetches of {}-{} go to its owner shard {owner}", part.topic, part.partition),
        ));
        return;
    }
    if owner == ctx.id {
        let p = match ctx.local(&part.topic, part.partition) {
            Ok(p) => p,
            Err(e) => {
                part.error = Some(e);
                return;
            }
        };
        if part.replica_id >= 0 {
            if let Some(e) = super::replica::check_epoch(&p, part.leader_epoch) {
                part.error = Some(e);
                return;
            }
        }
        part.high_watermark = p.high_watermark() as i64;
        part.log_start_offset = p.log.start_offset().0 as i64;
        let read = if part.replica_id >= 0 {
            p.read_replica(part.offset, max_bytes as usize).await
        } else {
            p.read(part.offset, max_bytes as usize).await
        };
        match read {
            Ok(read) if read.is_empty() => {}
            Ok(read) => {
                part.first_offset = read.first_offset.0 as i64;
                part.last_offset = read.last_offset.0 as i64;
                part.bytes = read.bytes;
                part.chunks = read.chunks.into_iter().map(DataChunk::Log).collect();
            }
            Err(e) => part.error = Some(e),
        }
        return;
    }
    crate::metrics::ShardMetrics::inc(&ctx.metrics.forwarded_requests);
    let op = ShardOp::Fetch {
        topic: part.topic.clone(),
        partition: part.partition,
        offset: part.offset,
        max_bytes,
    };
    match ctx.call(owner, op).await {
        ShardReply::Fetch(Ok(r)) => {
            part.high_watermark = r.high_watermark;
            part.log_start_offset = r.log_start_offset;
            part.first_offset = r.first_offset;
            part.last_offset = r.last_offset;
            part.bytes = r.bytes.len();
            if !r.bytes.is_empty() {
                part.chunks.push(DataChunk::Bytes(Bytes::from(r.bytes)));
            }
        }
        ShardReply::Fetch(Err((e, hw, lso))) => {
            part.error = Some(e);
            part.high_watermark = hw;
            part.log_start_offset = lso;
        }
        _ => part.error = Some(PartitionError::new(ErrorCode::BrokerShuttingDown, "owner shard unavailable")),
    }
}

pub(super) async fn fetch(ctx: &Rc<ShardContext>, corr: u32, req: wire::FetchRequest<'_>) -> Outgoing {
    crate::metrics::ShardMetrics::inc(&ctx.metrics.fetch_requests);
    let wait = Duration::from_millis(u64::from(req.max_wait_ms().min(ctx.config.limits.fetch_wait_ms_max)));
    let deadline = Instant::now() + wait;
    // One response carries at most `fetch_bytes_max`, whatever was asked.
    let cap = ctx.config.limits.fetch_bytes_max;
    let (min_bytes, max_bytes) = (req.min_bytes() as usize, req.max_bytes().min(cap));
    let mut parts: Vec<FetchPart> = req
        .partitions()
        .map(|ps| {
            ps.iter()
                .map(|p| FetchPart {
                    topic: p.topic().unwrap_or("").to_string(),
                    partition: p.partition(),
                    offset: p.fetch_offset().max(0) as u64,
                    max_bytes: p.partition_max_bytes().min(cap),
                    rejected: p.fetch_offset() < 0,
                    replica_id: req.replica_id().max(-1),
                    replica_log_end: replica_log_end(p.fetch_offset(), p.replica_log_end()),
                    leader_epoch: p.current_leader_epoch(),
                    error: (p.fetch_offset() < 0).then(|| {
                        PartitionError::new(ErrorCode::OffsetOutOfRange, "fetch offset must not be negative")
                    }),
                    high_watermark: -1,
                    log_start_offset: -1,
                    first_offset: -1,
                    last_offset: -1,
                    bytes: 0,
                    chunks: Vec::new(),
                })
                .collect()
        })
        .unwrap_or_default();
    if req.replica_id() >= 0 {
        note_follower_fetches(ctx, req.replica_id(), &parts);
    }
    let mut waited = false;
    loop {
        // Remember where the local partitions stood before reading, so data
        // arriving between the read and the wait is never missed.
        let watched: Vec<(&str, u32, u64)> =
            parts.iter().map(|p| (p.topic.as_str(), p.partition, p.offset)).collect();
        let generations = data_generations(ctx, &watched);
        let mut total = 0usize;
        let mut any_error = false;
        for part in &mut parts {
            if part.rejected {
                any_error = true;
                continue;
            }
            let budget = max_bytes.saturating_sub(total as u32).min(part.max_bytes);
            if budget == 0 {
                part.reset();
                continue;
            }
            read_part(ctx, part, budget).await;
            // A batch is never split, so a read returns at least one whole
            // batch; as in Kafka only the first partition with data may go
            // past `max_bytes` that way, the others wait for the next fetch.
            if total > 0 && part.bytes > budget as usize {
                part.reset();
            }
            total += part.bytes;
            any_error |= part.error.is_some();
        }
        let now = Instant::now();
        if total >= min_bytes || any_error || now >= deadline || ctx.shutting_down.get() {
            if waited && total > 0 {
                note_fetch_wake(ctx, &parts, now);
            }
            return fetch_response(corr, parts);
        }
        let watched: Vec<(&str, u32, u64)> =
            parts.iter().map(|p| (p.topic.as_str(), p.partition, p.offset)).collect();
        wait_for_data(ctx, &watched, generations, deadline - now).await;
        waited = true;
    }
}

/// A fetch that waited has data: the latency breakdown's `fetch_wake`, from
/// the newest write of its local partitions that returned some.
fn note_fetch_wake(ctx: &ShardContext, parts: &[FetchPart], now: Instant) {
    let newest = parts
        .iter()
        .filter(|p| p.bytes > 0)
        .filter_map(|p| ctx.partition(&p.topic, p.partition)?.data.written_at())
        .max();
    if let Some(at) = newest {
        ctx.log_io_stats().stages.record(
            crate::metrics::Stage::FetchWake,
            now.saturating_duration_since(at),
            1,
        );
    }
}

/// A follower's fetch offsets are its log ends: the leader's high
/// watermark may move (waking consumers and `acks=all` producers).
fn note_follower_fetches(ctx: &ShardContext, replica: i32, parts: &[FetchPart]) {
    let now = Instant::now();
    for part in parts.iter().filter(|p| !p.rejected) {
        let Some(p) = ctx.partition(&part.topic, part.partition) else { continue };
        if super::replica::check_epoch(&p, part.leader_epoch).is_some() {
            continue;
        }
        // What this leader has written is what a follower can have: caught
        // up means reaching it.
        let written = p.log.high_watermark().0;
        if p.replica.on_follower_fetch(replica, part.replica_log_end, written, written, now) {
            p.data.notify();
        }
    }
}

/// What a follower has written, from its fetch: its `replica_log_end`,
/// or the fetch offset when it names none (-1) or names more.
fn replica_log_end(fetch_offset: i64, log_end: i64) -> u64 {
    let from = fetch_offset.max(0) as u64;
    if log_end < 0 {
        from
    } else {
        (log_end as u64).min(from)
    }
}

/// Where each local partition stands now: the generation its data
/// notification is at, for [`wait_for_data`] (`None` for partitions of other shards).
pub(crate) fn data_generations(
    ctx: &ShardContext,
    parts: &[(&str, u32, u64)],
) -> Vec<Option<(Rc<crate::partition::DataNotify>, u64)>> {
    parts
        .iter()
        .map(|(topic, partition, _)| {
            ctx.partition(topic, *partition).map(|l| (l.data.clone(), l.data.generation()))
        })
        .collect()
}

/// Waits until any partition of the fetch (topic, partition, offset) may
/// have new data, or `timeout`.
pub(crate) async fn wait_for_data(
    ctx: &Rc<ShardContext>,
    parts: &[(&str, u32, u64)],
    generations: Vec<Option<(Rc<crate::partition::DataNotify>, u64)>>,
    timeout: Duration,
) {
    use futures_lite::future::FutureExt;
    use std::future::Future;
    use std::pin::Pin;
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
    for (&(topic, partition, offset), local) in parts.iter().zip(generations) {
        if let Some((notify, seen)) = local {
            waits.push(Box::pin(async move { notify.changed(seen).await }));
        } else if ctx.check_served(topic, partition).is_none() {
            let owner = ctx.owner(topic, partition);
            let op = ShardOp::WaitData { topic: topic.to_string(), partition, offset, timeout };
            let ctx = ctx.clone();
            waits.push(Box::pin(async move {
                ctx.call(owner, op).await;
            }));
        }
    }
    let any = futures_lite::future::poll_fn(move |cx| {
        for w in &mut waits {
            if w.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    });
    any.or(async {
        glommio::timer::sleep(timeout).await;
    })
    .await;
}

fn fetch_response(corr: u32, parts: Vec<FetchPart>) -> Outgoing {
    let mut fbb = FlatBufferBuilder::with_capacity(128 * parts.len() + 64);
    let mut payload = 0u64;
    let mut chunks = Vec::new();
    let rs: Vec<_> = parts
        .into_iter()
        .map(|p| {
            let topic = fbb.create_string(&p.topic);
            let (error, msg) = match &p.error {
                Some(e) => (e.code, Some(fbb.create_string(&e.message))),
                None => (ErrorCode::None, None),
            };
            let bytes = if p.error.is_some() { 0 } else { p.bytes };
            if p.error.is_none() {
                chunks.extend(p.chunks);
            }
            payload += bytes as u64;
            wire::FetchPartitionResponse::create(
                &mut fbb,
                &wire::FetchPartitionResponseArgs {
                    topic: Some(topic),
                    partition: p.partition,
                    error,
                    error_message: msg,
                    high_watermark: p.high_watermark,
                    log_start_offset: p.log_start_offset,
                    first_offset: p.first_offset,
                    last_offset: p.last_offset,
                    bytes: bytes as u32,
                },
            )
        })
        .collect();
    let rs = fbb.create_vector(&rs);
    let body = wire::FetchResponse::create(&mut fbb, &wire::FetchResponseArgs { partitions: Some(rs) });
    let header =
        response(&mut fbb, corr, ApiKey::Fetch, wire::ResponseBody::FetchResponse, body, payload as u32);
    Outgoing::Data { header, chunks }
}

#[cfg(test)]
mod tests {
    use super::replica_log_end;

    #[test]
    fn a_follower_is_credited_with_what_it_has_written_never_more_than_it_asks_from() {
        assert_eq!(replica_log_end(500, -1), 500, "no log end named: the fetch offset, as before");
        assert_eq!(replica_log_end(500, 300), 300, "fetching ahead: only what it has written");
        assert_eq!(replica_log_end(500, 900), 500, "a log end past the fetch offset is not believed");
        assert_eq!(replica_log_end(-7, 3), 0, "a negative fetch offset counts as 0");
    }
}
