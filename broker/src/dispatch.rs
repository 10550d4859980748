//! Request → owning shard. Decodes a verified request envelope, runs each
//! partition's part on its owner (locally, or over the mesh), and builds the
//! response.
//!
//! **Invariant**: a produce for a partition reaches its log in the order the
//! connection sent it (handlers are spawned in arrival order and call the log
//! before their first suspension point on the local path).
//! **API boundary**: `dispatch` never touches sockets or files.

use crate::log::ReadChunk;
use crate::partition::PartitionError;
use crate::shard::{ShardContext, ShardOp, ShardReply, TopicSpec};
use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardlog_schema::frame::{error_response, finish_into};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The highest version of each API this broker speaks.
pub const API_VERSIONS: &[(ApiKey, u16, u16)] = &[
    (ApiKey::ApiVersions, 0, 0),
    (ApiKey::Metadata, 0, 0),
    (ApiKey::CreateTopics, 0, 0),
    (ApiKey::DeleteTopics, 0, 0),
    (ApiKey::Produce, 0, 0),
    (ApiKey::Fetch, 0, 0),
    (ApiKey::ListOffsets, 0, 0),
];

/// Record data that follows a response envelope.
pub enum DataChunk {
    /// A range of this shard's log, served from file or memory.
    Log(ReadChunk),
    /// Bytes copied from another shard.
    Bytes(Bytes),
}

/// What a handler hands to the connection's writer.
pub enum Outgoing {
    /// A whole frame.
    Frame(Vec<u8>),
    /// An envelope followed by record data.
    Data { header: Vec<u8>, chunks: Vec<DataChunk> },
    /// Nothing to send (acks = 0).
    Nothing,
}

fn response<'a, T>(
    fbb: &mut FlatBufferBuilder<'a>,
    correlation_id: u32,
    api_key: ApiKey,
    body_type: wire::ResponseBody,
    body: WIPOffset<T>,
    payload_bytes: u32,
) -> Vec<u8> {
    let root = wire::ResponseFrame::create(
        fbb,
        &wire::ResponseFrameArgs {
            correlation_id,
            api_key,
            error: ErrorCode::None,
            error_message: None,
            payload_bytes,
            body_type,
            body: Some(body.as_union_value()),
        },
    );
    let mut out = Vec::with_capacity(fbb.unfinished_data().len() + 64);
    finish_into(fbb, root, &mut out);
    out
}

/// A whole-request error frame.
pub fn request_error(correlation_id: u32, api_key: ApiKey, code: ErrorCode, message: &str) -> Outgoing {
    let mut out = Vec::new();
    error_response(correlation_id, api_key, code, message, &mut out);
    Outgoing::Frame(out)
}

/// Handles one verified request. `header` is the envelope (already verified
/// by the reader), `payload` the raw bytes that followed it.
pub async fn handle(ctx: &Rc<ShardContext>, frame: wire::RequestFrame<'_>, payload: &[u8]) -> Outgoing {
    let corr = frame.correlation_id();
    let key = frame.api_key();
    let Some((_, _, max_version)) = API_VERSIONS.iter().find(|(k, _, _)| *k == key) else {
        return request_error(
            corr,
            key,
            ErrorCode::UnsupportedApi,
            &format!("api key {} is not supported", key.0),
        );
    };
    if frame.api_version() > *max_version {
        return request_error(
            corr,
            key,
            ErrorCode::UnsupportedVersion,
            &format!("{key:?} version {} is not supported (max {max_version})", frame.api_version()),
        );
    }
    if key != ApiKey::Produce && !payload.is_empty() {
        return request_error(corr, key, ErrorCode::InvalidRequest, "only produce requests carry a payload");
    }
    match key {
        ApiKey::ApiVersions => Outgoing::Frame(api_versions(corr)),
        ApiKey::Metadata => Outgoing::Frame(metadata(ctx, corr, frame.body_as_metadata_request())),
        ApiKey::CreateTopics => {
            Outgoing::Frame(create_topics(ctx, corr, frame.body_as_create_topics_request()).await)
        }
        ApiKey::DeleteTopics => {
            Outgoing::Frame(delete_topics(ctx, corr, frame.body_as_delete_topics_request()).await)
        }
        ApiKey::Produce => match frame.body_as_produce_request() {
            Some(req) => produce(ctx, corr, req, payload).await,
            None => request_error(corr, key, ErrorCode::InvalidRequest, "missing body"),
        },
        ApiKey::Fetch => match frame.body_as_fetch_request() {
            Some(req) => fetch(ctx, corr, req).await,
            None => request_error(corr, key, ErrorCode::InvalidRequest, "missing body"),
        },
        ApiKey::ListOffsets => {
            Outgoing::Frame(list_offsets(ctx, corr, frame.body_as_list_offsets_request()).await)
        }
        _ => request_error(corr, key, ErrorCode::UnsupportedApi, "unsupported api"),
    }
}

fn api_versions(corr: u32) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let ranges: Vec<_> =
        API_VERSIONS.iter().map(|(k, min, max)| wire::ApiVersionRange::new(*k, *min, *max)).collect();
    let apis = fbb.create_vector(&ranges);
    let body =
        wire::ApiVersionsResponse::create(&mut fbb, &wire::ApiVersionsResponseArgs { apis: Some(apis) });
    response(&mut fbb, corr, ApiKey::ApiVersions, wire::ResponseBody::ApiVersionsResponse, body, 0)
}

fn metadata(ctx: &Rc<ShardContext>, corr: u32, req: Option<wire::MetadataRequest<'_>>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(1024);
    let ep = &ctx.endpoints;
    let host = fbb.create_string(&ep.host);
    let shards: Vec<_> = ep
        .shard_ports
        .iter()
        .enumerate()
        .map(|(s, port)| {
            wire::ShardEndpoint::create(&mut fbb, &wire::ShardEndpointArgs { shard: s as u16, port: *port })
        })
        .collect();
    let shards = fbb.create_vector(&shards);
    let broker = wire::BrokerMetadata::create(
        &mut fbb,
        &wire::BrokerMetadataArgs {
            broker_id: ctx.config.broker_id,
            host: Some(host),
            port: ep.public_port,
            shards: Some(shards),
        },
    );
    let brokers = fbb.create_vector(&[broker]);
    let topics = ctx.topics.borrow();
    let wanted: Vec<String> = match req.and_then(|r| r.topics()) {
        Some(list) if !list.is_empty() => list.iter().map(str::to_string).collect(),
        _ => topics.keys().cloned().collect(),
    };
    let mut metas = Vec::with_capacity(wanted.len());
    for name in &wanted {
        let fb_name = fbb.create_string(name);
        let Some(meta) = topics.get(name) else {
            metas.push(wire::TopicMetadata::create(
                &mut fbb,
                &wire::TopicMetadataArgs {
                    name: Some(fb_name),
                    error: ErrorCode::UnknownTopicOrPartition,
                    partitions: None,
                    configs: None,
                },
            ));
            continue;
        };
        let id = ctx.config.broker_id;
        let parts: Vec<_> = (0..meta.partitions)
            .map(|p| {
                let shard = ctx.owner(name, p);
                let replicas = fbb.create_vector(&[id]);
                let isr = fbb.create_vector(&[id]);
                wire::PartitionMetadata::create(
                    &mut fbb,
                    &wire::PartitionMetadataArgs {
                        partition: p,
                        error: ErrorCode::None,
                        leader_broker: id,
                        leader_shard: shard.0,
                        leader_port: ep.shard_ports[shard.0 as usize],
                        leader_epoch: 0,
                        replicas: Some(replicas),
                        isr: Some(isr),
                    },
                )
            })
            .collect();
        let parts = fbb.create_vector(&parts);
        let configs: Vec<_> = meta
            .config
            .entries()
            .iter()
            .map(|(k, v)| {
                let (k, v) = (fbb.create_string(k), fbb.create_string(v));
                wire::ConfigEntry::create(&mut fbb, &wire::ConfigEntryArgs { name: Some(k), value: Some(v) })
            })
            .collect();
        let configs = fbb.create_vector(&configs);
        metas.push(wire::TopicMetadata::create(
            &mut fbb,
            &wire::TopicMetadataArgs {
                name: Some(fb_name),
                error: ErrorCode::None,
                partitions: Some(parts),
                configs: Some(configs),
            },
        ));
    }
    let metas = fbb.create_vector(&metas);
    let body = wire::MetadataResponse::create(
        &mut fbb,
        &wire::MetadataResponseArgs {
            brokers: Some(brokers),
            controller_id: ctx.config.broker_id,
            topics: Some(metas),
        },
    );
    response(&mut fbb, corr, ApiKey::Metadata, wire::ResponseBody::MetadataResponse, body, 0)
}

fn topic_results(corr: u32, key: ApiKey, results: &[(String, ErrorCode, String)], create: bool) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let rs: Vec<_> = results
        .iter()
        .map(|(name, code, msg)| {
            let name = fbb.create_string(name);
            let msg = (!msg.is_empty()).then(|| fbb.create_string(msg));
            wire::TopicResult::create(
                &mut fbb,
                &wire::TopicResultArgs { name: Some(name), error: *code, message: msg },
            )
        })
        .collect();
    let rs = fbb.create_vector(&rs);
    if create {
        let body = wire::CreateTopicsResponse::create(
            &mut fbb,
            &wire::CreateTopicsResponseArgs { results: Some(rs) },
        );
        response(&mut fbb, corr, key, wire::ResponseBody::CreateTopicsResponse, body, 0)
    } else {
        let body = wire::DeleteTopicsResponse::create(
            &mut fbb,
            &wire::DeleteTopicsResponseArgs { results: Some(rs) },
        );
        response(&mut fbb, corr, key, wire::ResponseBody::DeleteTopicsResponse, body, 0)
    }
}

async fn topic_admin(
    ctx: &Rc<ShardContext>,
    op: ShardOp,
) -> Result<Vec<(String, ErrorCode, String)>, String> {
    match ctx.call(shardlog_schema::ShardId(0), op).await {
        ShardReply::TopicResults(r) => Ok(r),
        other => Err(format!("controller shard answered {other:?}")),
    }
}

async fn create_topics(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: Option<wire::CreateTopicsRequest<'_>>,
) -> Vec<u8> {
    let specs: Vec<_> = req
        .and_then(|r| r.topics())
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    let configs = t
                        .configs()
                        .map(|cs| {
                            cs.iter()
                                .map(|c| {
                                    (c.name().unwrap_or("").to_string(), c.value().unwrap_or("").to_string())
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    TopicSpec {
                        name: t.name().unwrap_or("").to_string(),
                        partitions: t.partitions(),
                        replication_factor: t.replication_factor(),
                        configs,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let names: Vec<String> = specs.iter().map(|s: &TopicSpec| s.name.clone()).collect();
    let results = topic_admin(ctx, ShardOp::CreateTopics(specs)).await.unwrap_or_else(|e| {
        names.into_iter().map(|n| (n, ErrorCode::BrokerShuttingDown, e.clone())).collect()
    });
    for (name, code, msg) in &results {
        if *code == ErrorCode::None {
            tracing::info!(topic = %name, "topic created");
        } else {
            tracing::info!(topic = %name, error = ?code, %msg, "topic not created");
        }
    }
    topic_results(corr, ApiKey::CreateTopics, &results, true)
}

async fn delete_topics(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: Option<wire::DeleteTopicsRequest<'_>>,
) -> Vec<u8> {
    let names: Vec<String> =
        req.and_then(|r| r.topics()).map(|ts| ts.iter().map(str::to_string).collect()).unwrap_or_default();
    let results = topic_admin(ctx, ShardOp::DeleteTopics(names.clone())).await.unwrap_or_else(|e| {
        names.into_iter().map(|n| (n, ErrorCode::BrokerShuttingDown, e.clone())).collect()
    });
    topic_results(corr, ApiKey::DeleteTopics, &results, false)
}

struct ProduceOutcome {
    topic: String,
    partition: u32,
    result: Result<crate::shard::Appended, PartitionError>,
}

async fn produce_one(ctx: &Rc<ShardContext>, topic: &str, partition: u32, data: &[u8]) -> ProduceOutcome {
    let result = if let Some(e) = ctx.check_partition(topic, partition) {
        Err(e)
    } else {
        let owner = ctx.owner(topic, partition);
        if owner == ctx.id {
            ctx.produce_local(topic, partition, data).await
        } else {
            crate::metrics::ShardMetrics::inc(&ctx.metrics.forwarded_requests);
            let op = ShardOp::Produce { topic: topic.to_string(), partition, batches: data.to_vec() };
            match ctx.call(owner, op).await {
                ShardReply::Produce(r) => r,
                _ => Err(PartitionError::new(ErrorCode::BrokerShuttingDown, "owner shard unavailable")),
            }
        }
    };
    ProduceOutcome { topic: topic.to_string(), partition, result }
}

async fn produce(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: wire::ProduceRequest<'_>,
    payload: &[u8],
) -> Outgoing {
    let acks = req.acks();
    let parts = req.partitions().map(|v| v.iter().collect::<Vec<_>>()).unwrap_or_default();
    let declared: u64 = parts.iter().map(|p| u64::from(p.batch_bytes())).sum();
    if declared != payload.len() as u64 {
        return request_error(
            corr,
            ApiKey::Produce,
            ErrorCode::InvalidRequest,
            &format!("partitions declare {declared} batch bytes but the payload has {}", payload.len()),
        );
    }
    let mut outcomes = Vec::with_capacity(parts.len());
    let mut pos = 0usize;
    if parts.len() == 1 {
        let p = &parts[0];
        outcomes.push(produce_one(ctx, p.topic().unwrap_or(""), p.partition(), payload).await);
    } else {
        // Run partitions concurrently: each owner group-commits independently.
        let payload: Rc<[u8]> = Rc::from(payload);
        let mut tasks = Vec::with_capacity(parts.len());
        for p in &parts {
            let (ctx, payload, topic) = (ctx.clone(), payload.clone(), p.topic().unwrap_or("").to_string());
            let (partition, range) = (p.partition(), pos..pos + p.batch_bytes() as usize);
            pos = range.end;
            tasks.push(glommio::spawn_local(async move {
                produce_one(&ctx, &topic, partition, &payload[range]).await
            }));
        }
        for t in tasks {
            outcomes.push(t.await);
        }
    }
    if acks == 0 {
        for o in &outcomes {
            if let Err(e) = &o.result {
                tracing::debug!(topic = %o.topic, partition = o.partition, error = %e.message, "acks=0 produce failed");
            }
        }
        return Outgoing::Nothing;
    }
    let mut fbb = FlatBufferBuilder::with_capacity(128 * outcomes.len() + 64);
    let rs: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let topic = fbb.create_string(&o.topic);
            let (error, msg, base, lso, time) = match &o.result {
                Ok(a) => {
                    (ErrorCode::None, None, a.base_offset as i64, a.log_start_offset as i64, a.append_time_ms)
                }
                Err(e) => (e.code, Some(fbb.create_string(&e.message)), -1, -1, -1),
            };
            wire::ProducePartitionResponse::create(
                &mut fbb,
                &wire::ProducePartitionResponseArgs {
                    topic: Some(topic),
                    partition: o.partition,
                    error,
                    error_message: msg,
                    base_offset: base,
                    log_start_offset: lso,
                    log_append_time_ms: time,
                },
            )
        })
        .collect();
    let rs = fbb.create_vector(&rs);
    let body = wire::ProduceResponse::create(&mut fbb, &wire::ProduceResponseArgs { partitions: Some(rs) });
    Outgoing::Frame(response(&mut fbb, corr, ApiKey::Produce, wire::ResponseBody::ProduceResponse, body, 0))
}

/// One partition's part of a fetch response.
struct FetchPart {
    topic: String,
    partition: u32,
    offset: u64,
    max_bytes: u32,
    /// Rejected while decoding (negative offset): never read.
    rejected: bool,
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

async fn read_part(ctx: &Rc<ShardContext>, part: &mut FetchPart, max_bytes: u32) {
    part.reset();
    if let Some(e) = ctx.check_partition(&part.topic, part.partition) {
        part.error = Some(e);
        return;
    }
    let owner = ctx.owner(&part.topic, part.partition);
    if owner == ctx.id {
        let p = match ctx.local(&part.topic, part.partition) {
            Ok(p) => p,
            Err(e) => {
                part.error = Some(e);
                return;
            }
        };
        part.high_watermark = p.log.high_watermark().0 as i64;
        part.log_start_offset = p.log.start_offset().0 as i64;
        match p.read(part.offset, max_bytes as usize).await {
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

async fn fetch(ctx: &Rc<ShardContext>, corr: u32, req: wire::FetchRequest<'_>) -> Outgoing {
    crate::metrics::ShardMetrics::inc(&ctx.metrics.fetch_requests);
    let wait = Duration::from_millis(u64::from(req.max_wait_ms().min(ctx.config.limits.fetch_wait_ms_max)));
    let deadline = Instant::now() + wait;
    let (min_bytes, max_bytes) = (req.min_bytes() as usize, req.max_bytes());
    let mut parts: Vec<FetchPart> = req
        .partitions()
        .map(|ps| {
            ps.iter()
                .map(|p| FetchPart {
                    topic: p.topic().unwrap_or("").to_string(),
                    partition: p.partition(),
                    offset: p.fetch_offset().max(0) as u64,
                    max_bytes: p.partition_max_bytes(),
                    rejected: p.fetch_offset() < 0,
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
    loop {
        // Remember where the local partitions stood before reading, so data
        // arriving between the read and the wait is never missed.
        let generations: Vec<Option<(Rc<crate::partition::DataNotify>, u64)>> = parts
            .iter()
            .map(|p| ctx.partition(&p.topic, p.partition).map(|l| (l.data.clone(), l.data.generation())))
            .collect();
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
            total += part.bytes;
            any_error |= part.error.is_some();
        }
        let now = Instant::now();
        if total >= min_bytes || any_error || now >= deadline || ctx.shutting_down.get() {
            return fetch_response(corr, parts);
        }
        wait_for_data(ctx, &parts, generations, deadline - now).await;
    }
}

/// Waits until any partition of the fetch may have new data, or `timeout`.
async fn wait_for_data(
    ctx: &Rc<ShardContext>,
    parts: &[FetchPart],
    generations: Vec<Option<(Rc<crate::partition::DataNotify>, u64)>>,
    timeout: Duration,
) {
    use futures_lite::future::FutureExt;
    use std::future::Future;
    use std::pin::Pin;
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
    for (part, local) in parts.iter().zip(generations) {
        if let Some((notify, seen)) = local {
            waits.push(Box::pin(async move { notify.changed(seen).await }));
        } else if ctx.check_partition(&part.topic, part.partition).is_none() {
            let owner = ctx.owner(&part.topic, part.partition);
            let op = ShardOp::WaitData {
                topic: part.topic.clone(),
                partition: part.partition,
                offset: part.offset,
                timeout,
            };
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

async fn list_offsets(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: Option<wire::ListOffsetsRequest<'_>>,
) -> Vec<u8> {
    let asks: Vec<(String, u32, i64)> = req
        .and_then(|r| r.partitions())
        .map(|ps| {
            ps.iter().map(|p| (p.topic().unwrap_or("").to_string(), p.partition(), p.timestamp())).collect()
        })
        .unwrap_or_default();
    let mut results = Vec::with_capacity(asks.len());
    for (topic, partition, timestamp) in asks {
        let r = if let Some(e) = ctx.check_partition(&topic, partition) {
            Err(e)
        } else {
            let op = ShardOp::ListOffset { topic: topic.clone(), partition, timestamp };
            match ctx.call(ctx.owner(&topic, partition), op).await {
                ShardReply::ListOffset(r) => r,
                _ => Err(PartitionError::new(ErrorCode::BrokerShuttingDown, "owner shard unavailable")),
            }
        };
        results.push((topic, partition, r));
    }
    let mut fbb = FlatBufferBuilder::with_capacity(128 * results.len() + 64);
    let rs: Vec<_> = results
        .iter()
        .map(|(topic, partition, r)| {
            let topic = fbb.create_string(topic);
            let (error, offset, timestamp) = match r {
                Ok((o, t)) => (ErrorCode::None, *o, *t),
                Err(e) => (e.code, -1, -1),
            };
            wire::ListOffsetsPartitionResponse::create(
                &mut fbb,
                &wire::ListOffsetsPartitionResponseArgs {
                    topic: Some(topic),
                    partition: *partition,
                    error,
                    offset,
                    timestamp,
                },
            )
        })
        .collect();
    let rs = fbb.create_vector(&rs);
    let body =
        wire::ListOffsetsResponse::create(&mut fbb, &wire::ListOffsetsResponseArgs { partitions: Some(rs) });
    response(&mut fbb, corr, ApiKey::ListOffsets, wire::ResponseBody::ListOffsetsResponse, body, 0)
}
