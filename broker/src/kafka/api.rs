//! The Kafka APIs, each answered from the same shards and logs as the
//! native protocol (`dispatch`), with Kafka's message types from
//! `kafka-protocol` and its error codes ([`super::error_code`]).

use super::records::{kafka_to_native, native_to_kafka};
use super::{advertised_node, error_code, node_id, SUPPORTED};
use crate::cluster::metadata::{ClusterMetadata, Route};
use crate::dispatch::produce::{produce_one, ProduceOutcome};
use crate::metrics::ApiClass;
use crate::partition::PartitionError;
use crate::shard::{RemoteRead, ShardContext, ShardOp, ShardReply, TopicSpec};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use shardlog_schema::types::OFFSETS_TOPIC;
use shardlog_schema::wire::ErrorCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Which latency histogram an API's requests go to (`/metrics`).
pub(super) fn class(api: ApiKey) -> ApiClass {
    match api {
        ApiKey::Produce => ApiClass::Produce,
        ApiKey::Fetch => ApiClass::Fetch,
        ApiKey::CreateTopics | ApiKey::DeleteTopics | ApiKey::DescribeConfigs => ApiClass::Admin,
        ApiKey::InitProducerId => ApiClass::Produce,
        ApiKey::ApiVersions | ApiKey::Metadata | ApiKey::ListOffsets => ApiClass::Metadata,
        _ => ApiClass::Group,
    }
}

pub(super) type Answer = anyhow::Result<Option<BytesMut>>;

pub(super) fn encoded<T: Encodable>(body: &T, version: i16) -> Answer {
    let mut out = BytesMut::new();
    body.encode(&mut out, version)?;
    Ok(Some(out))
}

pub(super) fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

pub(super) fn name(topic: &str) -> TopicName {
    TopicName(s(topic))
}

/// Answers one decoded request: the encoded response body, or `None` when
/// the request has no response (acks=0 produce). An error closes the
/// connection (the body did not decode).
pub(super) async fn handle(
    ctx: &Rc<ShardContext>,
    api: ApiKey,
    version: i16,
    header: &RequestHeader,
    peer: &str,
    mut body: Bytes,
) -> anyhow::Result<Option<Vec<u8>>> {
    use super::group;
    use super::request::Request;
    let out = match Request::decode(api, version, &mut body)? {
        Request::ApiVersions => encoded(&api_versions(0), version),
        Request::Metadata(r) => metadata(ctx, r, version),
        Request::Produce(r) => produce(ctx, r, version).await,
        Request::Fetch(r) => fetch(ctx, r, version).await,
        Request::ListOffsets(r) => list_offsets(ctx, r, version).await,
        Request::CreateTopics(r) => create_topics(ctx, r, version).await,
        Request::DeleteTopics(r) => delete_topics(ctx, r, version).await,
        Request::DescribeConfigs(r) => super::configs::describe_configs(ctx, r, version),
        Request::InitProducerId(r) => init_producer_id(ctx, r, version, peer).await,
        Request::FindCoordinator(r) => group::find_coordinator(ctx, r, version),
        Request::JoinGroup(r) => {
            let client_id = header.client_id.as_ref().map_or(String::new(), |c| c.to_string());
            let host = peer.rsplit_once(':').map_or(peer, |(h, _)| h).to_string();
            group::join(ctx, r, version, client_id, host).await
        }
        Request::SyncGroup(r) => group::sync(ctx, r, version).await,
        Request::Heartbeat(r) => group::heartbeat(ctx, r, version).await,
        Request::LeaveGroup(r) => group::leave(ctx, r, version).await,
        Request::OffsetCommit(r) => group::offset_commit(ctx, r, version).await,
        Request::OffsetFetch(r) => group::offset_fetch(ctx, r, version).await,
        Request::ListGroups(r) => group::list_groups(ctx, r, version).await,
        Request::DescribeGroups(r) => group::describe_groups(ctx, r, version).await,
        Request::DeleteGroups(r) => group::delete_groups(ctx, r, version).await,
    }?;
    Ok(out.map(|b| b.to_vec()))
}

fn api_versions(error: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error;
    r.api_keys = SUPPORTED
        .iter()
        .map(|(key, min, max)| {
            let mut v = api_versions_response::ApiVersion::default();
            v.api_key = *key as i16;
            v.min_version = *min;
            v.max_version = *max;
            v
        })
        .collect();
    r
}

/// The answer to an ApiVersions request at a version we do not speak: v0
/// format (what every client can read), error 35, our table, so that the
/// client retries with a version from it.
pub(super) fn unsupported_api_versions(correlation_id: i32) -> Vec<u8> {
    let mut body = BytesMut::new();
    api_versions(35).encode(&mut body, 0).expect("ApiVersions v0 always encodes");
    super::response_frame(correlation_id, 0, &body)
}

/// Every Kafka node of this broker ([`advertised_node`]: one per shard, or
/// the shared one); in a cluster, of every broker with a Kafka listener.
fn brokers(
    ctx: &ShardContext,
    cluster: Option<&ClusterMetadata>,
) -> Vec<metadata_response::MetadataResponseBroker> {
    let mut nodes: Vec<(i32, String, u16)> = match cluster {
        None => (0..ctx.shard_count)
            .map(|shard| {
                let (node, port) = advertised_node(ctx, shard);
                (node, ctx.endpoints.host.clone(), port)
            })
            .collect(),
        Some(md) => md
            .brokers
            .values()
            .flat_map(|b| {
                (0..b.shards as u16)
                    .filter_map(|shard| b.kafka_node(shard).map(|(n, p)| (n, b.host.clone(), p)))
            })
            .collect(),
    };
    nodes.dedup();
    nodes
        .into_iter()
        .map(|(node, host, port)| {
            let mut b = metadata_response::MetadataResponseBroker::default();
            b.node_id = BrokerId(node);
            b.host = s(&host);
            b.port = i32::from(port);
            b
        })
        .collect()
}

/// A partition's leader node and epoch for Kafka clients: `None` when it has
/// no live leader with a Kafka listener.
fn kafka_leader(
    ctx: &ShardContext,
    cluster: Option<&ClusterMetadata>,
    topic: &str,
    p: u32,
) -> Option<(i32, i32)> {
    let Some(md) = cluster else {
        return Some((advertised_node(ctx, ctx.owner(topic, p).0).0, 0));
    };
    match md.route(topic, p) {
        Route::Leader { leader_epoch, broker: Some(b), .. } => {
            let (shard, _) = ClusterMetadata::leader_endpoint(b, topic, p);
            b.kafka_node(shard).map(|(node, _)| (node, leader_epoch))
        }
        _ => None,
    }
}

fn metadata(ctx: &Rc<ShardContext>, req: MetadataRequest, version: i16) -> Answer {
    let topics = ctx.topics.borrow();
    // v0: an empty list means every topic; v1 and later: null does.
    let wanted: Vec<String> = match req.topics {
        Some(list) if !(list.is_empty() && version == 0) => {
            list.into_iter().filter_map(|t| t.name.map(|n| n.0.to_string())).collect()
        }
        _ => topics.keys().filter(|t| t.as_str() != OFFSETS_TOPIC).cloned().collect(),
    };
    let cluster = ctx.cluster_metadata();
    let cluster = cluster.as_deref();
    let mut r = MetadataResponse::default();
    r.brokers = brokers(ctx, cluster);
    // Fields a version does not have must keep their defaults (the encoder
    // refuses them).
    if version >= 2 {
        r.cluster_id = Some(s("shardlog"));
    }
    if version >= 1 {
        let controller = match cluster {
            None => Some(ctx.config.broker_id),
            Some(md) => md.controller.map(|c| c.broker_id),
        };
        r.controller_id = BrokerId(controller.map_or(-1, |id| node_id(id, 0)));
    }
    for topic in wanted {
        let mut t = metadata_response::MetadataResponseTopic::default();
        t.name = Some(name(&topic));
        t.is_internal = version >= 1 && topic == OFFSETS_TOPIC;
        match topics.get(&topic) {
            None => t.error_code = error_code(ErrorCode::UnknownTopicOrPartition),
            Some(meta) => {
                t.partitions = (0..meta.partitions)
                    .map(|p| {
                        let mut part = metadata_response::MetadataResponsePartition::default();
                        part.partition_index = p as i32;
                        match kafka_leader(ctx, cluster, &topic, p) {
                            Some((node, epoch)) => {
                                let leader = BrokerId(node);
                                part.leader_id = leader;
                                if version >= 7 {
                                    part.leader_epoch = epoch;
                                }
                                part.replica_nodes = vec![leader];
                                part.isr_nodes = vec![leader];
                            }
                            None => {
                                part.error_code = error_code(ErrorCode::LeaderNotAvailable);
                                part.leader_id = BrokerId(-1);
                            }
                        }
                        part
                    })
                    .collect();
            }
        }
        r.topics.push(t);
    }
    encoded(&r, version)
}

fn partition_index(index: i32) -> Option<u32> {
    u32::try_from(index).ok()
}

async fn produce(ctx: &Rc<ShardContext>, req: ProduceRequest, version: i16) -> Answer {
    let acks = req.acks;
    let waits = crate::shard::Acks::from_request(acks, u64::try_from(req.timeout_ms).unwrap_or(0));
    // Translate first (no suspension), then append every partition's part
    // in request order (`spawn_in_order`): the order the client sent them.
    let mut parts: Vec<(String, i32, Result<Vec<u8>, PartitionError>)> = Vec::new();
    for t in req.topic_data {
        let topic = t.name.0.to_string();
        // Records are stored uncompressed: a batch whose records inflate past
        // what the topic takes is refused while decompressing, not after.
        let decompressed_max = ctx
            .topics
            .borrow()
            .get(&topic)
            .map_or(ctx.config.topic_defaults.batch_bytes_max, |m| m.config.batch_bytes_max)
            as usize;
        for p in t.partition_data {
            let native = match (partition_index(p.index), p.records) {
                (None, _) => {
                    Err(PartitionError::new(ErrorCode::UnknownTopicOrPartition, "negative partition"))
                }
                (Some(_), None) => Err(PartitionError::new(ErrorCode::CorruptMessage, "no records")),
                (Some(_), Some(records)) => {
                    let mut out = Vec::with_capacity(records.len() + 128);
                    kafka_to_native(records, &mut out, decompressed_max)
                        .map(|_| out)
                        .map_err(|e| PartitionError::new(e.error_code(), e.to_string()))
                }
            };
            parts.push((topic.clone(), p.index, native));
        }
    }
    // A negative index stays distinguishable: `partition as i32` gives it back.
    let appends = parts.into_iter().map(|(topic, index, native)| {
        let ctx = ctx.clone();
        async move {
            match native {
                Ok(data) => produce_one(&ctx, &topic, index as u32, &data, waits).await,
                Err(e) => ProduceOutcome { topic, partition: index as u32, result: Err(e) },
            }
        }
    });
    let outcomes = crate::dispatch::spawn_in_order(appends).await;
    if acks == 0 {
        return Ok(None);
    }
    let mut r = ProduceResponse::default();
    for o in outcomes {
        let mut p = produce_response::PartitionProduceResponse::default();
        p.index = o.partition as i32;
        p.log_append_time_ms = -1;
        match o.result {
            Ok(a) => {
                p.base_offset = a.base_offset as i64;
                if version >= 5 {
                    p.log_start_offset = a.log_start_offset as i64;
                }
            }
            Err(e) => {
                p.error_code = error_code(e.code);
                if version >= 8 {
                    p.error_message = Some(s(&e.message));
                }
                p.base_offset = -1;
            }
        }
        match r.responses.last_mut() {
            Some(t) if t.name.0.as_str() == o.topic => t.partition_responses.push(p),
            _ => {
                let mut t = produce_response::TopicProduceResponse::default();
                t.name = name(&o.topic);
                t.partition_responses.push(p);
                r.responses.push(t);
            }
        }
    }
    encoded(&r, version)
}

/// What a transactional id gets: INVALID_REQUEST (no transactions here).
const TRANSACTIONAL_ID_NOT_SUPPORTED: i16 = 42;

/// A producer id for an idempotent producer (`producer_ids::init`: a new
/// one, or with the producer's id and epoch, v3+, the next epoch).
/// Transactions are not supported: a transactional id is refused.
async fn init_producer_id(
    ctx: &Rc<ShardContext>,
    req: InitProducerIdRequest,
    version: i16,
    peer: &str,
) -> Answer {
    let mut r = InitProducerIdResponse::default();
    r.producer_id = ProducerId(-1);
    r.producer_epoch = -1;
    if let Some(tid) = &req.transactional_id {
        tracing::warn!(peer, transactional_id = %tid.0, "InitProducerId: transactions are not supported");
        r.error_code = TRANSACTIONAL_ID_NOT_SUPPORTED;
        return encoded(&r, version);
    }
    match crate::producer_ids::init(ctx, req.producer_id.0, req.producer_epoch).await {
        Ok((id, epoch)) => {
            r.producer_id = ProducerId(id);
            r.producer_epoch = epoch;
        }
        Err(e) => r.error_code = error_code(e.code),
    }
    encoded(&r, version)
}

/// Reads stored batches of one partition on its owner shard.
async fn read(
    ctx: &Rc<ShardContext>,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u32,
) -> Result<RemoteRead, (PartitionError, i64, i64)> {
    if let Some(e) = ctx.check_served(topic, partition) {
        return Err((e, -1, -1));
    }
    let owner = ctx.owner(topic, partition);
    if owner == ctx.id {
        return ctx.fetch_local_copy(topic, partition, offset, max_bytes).await;
    }
    crate::metrics::ShardMetrics::inc(&ctx.metrics.forwarded_requests);
    let op = ShardOp::Fetch { topic: topic.to_string(), partition, offset, max_bytes };
    match ctx.call(owner, op).await {
        ShardReply::Fetch(r) => r,
        _ => Err((PartitionError::new(ErrorCode::BrokerShuttingDown, "owner shard unavailable"), -1, -1)),
    }
}

struct Wanted {
    topic: String,
    index: i32,
    offset: i64,
    max_bytes: i32,
}

async fn fetch(ctx: &Rc<ShardContext>, req: FetchRequest, version: i16) -> Answer {
    crate::metrics::ShardMetrics::inc(&ctx.metrics.fetch_requests);
    let limits = &ctx.config.limits;
    let wait = Duration::from_millis(req.max_wait_ms.clamp(0, limits.fetch_wait_ms_max as i32) as u64);
    let deadline = Instant::now() + wait;
    let cap = limits.fetch_bytes_max;
    let max_bytes = (req.max_bytes.max(0) as u32).min(cap);
    let min_bytes = req.min_bytes.max(0) as usize;
    let wanted: Vec<Wanted> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Wanted {
                topic: t.topic.0.to_string(),
                index: p.partition,
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
            })
        })
        .collect();
    loop {
        let watched: Vec<(&str, u32, u64)> = wanted
            .iter()
            .filter_map(|w| Some((w.topic.as_str(), partition_index(w.index)?, w.offset.max(0) as u64)))
            .collect();
        let generations = crate::dispatch::fetch::data_generations(ctx, &watched);
        let mut total = 0usize;
        let mut any_error = false;
        let mut r = FetchResponse::default();
        for w in &wanted {
            let mut p = fetch_response::PartitionData::default();
            p.partition_index = w.index;
            p.aborted_transactions = Some(Vec::new());
            p.preferred_read_replica = BrokerId(-1);
            let budget = max_bytes.saturating_sub(total as u32).min(w.max_bytes.max(0) as u32);
            let result = match partition_index(w.index) {
                None => Err((
                    PartitionError::new(ErrorCode::UnknownTopicOrPartition, "negative partition"),
                    -1,
                    -1,
                )),
                Some(_) if w.offset < 0 => {
                    Err((PartitionError::new(ErrorCode::OffsetOutOfRange, "negative fetch offset"), -1, -1))
                }
                Some(_) if budget == 0 => Ok(None),
                Some(index) => read(ctx, &w.topic, index, w.offset as u64, budget).await.map(Some),
            };
            match result {
                Ok(got) => {
                    let (hw, lso, bytes) = match got {
                        Some(read) => (read.high_watermark, read.log_start_offset, read.bytes),
                        None => (-1, -1, Vec::new()),
                    };
                    p.high_watermark = hw;
                    p.last_stable_offset = hw;
                    if version >= 5 {
                        p.log_start_offset = lso;
                    }
                    // As in Kafka, only the first partition with data may go
                    // past the budget (a batch is never split).
                    let over_budget = total > 0 && bytes.len() > budget as usize;
                    if !bytes.is_empty() && !over_budget {
                        let mut records = BytesMut::with_capacity(bytes.len() + bytes.len() / 8);
                        if let Err(e) =
                            native_to_kafka(&bytes, limits.request_payload_bytes_max as usize, &mut records)
                        {
                            tracing::warn!(topic = %w.topic, partition = w.index, error = %e, "stored batch not translatable to Kafka");
                        }
                        total += bytes.len();
                        p.records = Some(records.freeze());
                    }
                }
                Err((e, hw, lso)) => {
                    any_error = true;
                    p.error_code = error_code(e.code);
                    p.high_watermark = hw;
                    p.last_stable_offset = hw;
                    if version >= 5 {
                        p.log_start_offset = lso;
                    }
                }
            }
            match r.responses.last_mut() {
                Some(t) if t.topic.0.as_str() == w.topic => t.partitions.push(p),
                _ => {
                    let mut t = fetch_response::FetchableTopicResponse::default();
                    t.topic = name(&w.topic);
                    t.partitions.push(p);
                    r.responses.push(t);
                }
            }
        }
        let now = Instant::now();
        if total >= min_bytes.max(1) || any_error || now >= deadline || ctx.shutting_down.get() {
            return encoded(&r, version);
        }
        crate::dispatch::fetch::wait_for_data(ctx, &watched, generations, deadline - now).await;
    }
}

async fn list_offsets(ctx: &Rc<ShardContext>, req: ListOffsetsRequest, version: i16) -> Answer {
    let mut r = ListOffsetsResponse::default();
    for t in req.topics {
        let topic = t.name.0.to_string();
        let mut out = list_offsets_response::ListOffsetsTopicResponse::default();
        out.name = t.name.clone();
        for p in t.partitions {
            let mut part = list_offsets_response::ListOffsetsPartitionResponse::default();
            part.partition_index = p.partition_index;
            let answer = match partition_index(p.partition_index) {
                None => Err(PartitionError::new(ErrorCode::UnknownTopicOrPartition, "negative partition")),
                Some(index) => match ctx.check_served(&topic, index) {
                    Some(e) => Err(e),
                    None => {
                        let op = ShardOp::ListOffset {
                            topic: topic.clone(),
                            partition: index,
                            timestamp: p.timestamp,
                        };
                        match ctx.call(ctx.owner(&topic, index), op).await {
                            ShardReply::ListOffset(r) => r,
                            _ => Err(PartitionError::new(
                                ErrorCode::BrokerShuttingDown,
                                "owner shard unavailable",
                            )),
                        }
                    }
                },
            };
            match answer {
                Ok((offset, timestamp)) => {
                    part.offset = offset;
                    part.timestamp = timestamp;
                    if version >= 4 {
                        part.leader_epoch = 0;
                    }
                }
                Err(e) => {
                    part.error_code = error_code(e.code);
                    part.offset = -1;
                    part.timestamp = -1;
                }
            }
            out.partitions.push(part);
        }
        r.topics.push(out);
    }
    encoded(&r, version)
}

async fn create_topics(ctx: &Rc<ShardContext>, req: CreateTopicsRequest, version: i16) -> Answer {
    let specs: Vec<TopicSpec> = req
        .topics
        .iter()
        .map(|t| TopicSpec {
            name: t.name.0.to_string(),
            // -1: the broker's default (Kafka's num.partitions: 1 here).
            partitions: if t.num_partitions < 0 { 1 } else { t.num_partitions as u32 },
            replication_factor: if t.replication_factor < 0 { 1 } else { t.replication_factor as u16 },
            configs: t
                .configs
                .iter()
                .map(|c| (c.name.to_string(), c.value.as_ref().map_or(String::new(), |v| v.to_string())))
                .collect(),
        })
        .collect();
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let mut r = CreateTopicsResponse::default();
    let results = if req.validate_only {
        Vec::new()
    } else {
        crate::dispatch::admin::topic_admin(ctx, ShardOp::CreateTopics(specs.clone()), &names).await
    };
    for (spec, outcome) in specs.iter().zip(results.iter().map(Some).chain(std::iter::repeat(None))) {
        let mut t = create_topics_response::CreatableTopicResult::default();
        t.name = name(&spec.name);
        if version >= 5 {
            t.num_partitions = spec.partitions as i32;
            t.replication_factor = spec.replication_factor as i16;
        }
        if let Some(outcome) = outcome {
            let (code, message) = outcome.code_and_message();
            t.error_code = error_code(code);
            t.error_message = (!message.is_empty()).then(|| s(&message));
        }
        r.topics.push(t);
    }
    encoded(&r, version)
}

async fn delete_topics(ctx: &Rc<ShardContext>, req: DeleteTopicsRequest, version: i16) -> Answer {
    // v0-5 name topics in `topic_names`, v6 in `topics`.
    let mut names: Vec<String> = req.topic_names.iter().map(|n| n.0.to_string()).collect();
    names.extend(req.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.to_string())));
    let results =
        crate::dispatch::admin::topic_admin(ctx, ShardOp::DeleteTopics(names.clone()), &names).await;
    let mut r = DeleteTopicsResponse::default();
    for outcome in results {
        let mut t = delete_topics_response::DeletableTopicResult::default();
        let (code, message) = outcome.code_and_message();
        t.name = Some(name(&outcome.name));
        t.error_code = error_code(code);
        if version >= 5 {
            t.error_message = (!message.is_empty()).then(|| s(&message));
        }
        r.responses.push(t);
    }
    encoded(&r, version)
}
