//! Request encoding and response decoding: pure functions over bytes, no I/O.
//!
//! Requests are encoded straight into the frame bytes (`[u32 len][envelope]`);
//! the raw record batches of a produce request travel as separate buffers
//! after it (see [`crate::conn`]). Responses arrive as a verified envelope plus
//! the raw payload and are decoded into owned types here.

use crate::error::{ClientError, Result};
use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardlog_schema::frame::FrameLimits;
use shardlog_schema::{wire, ErrorCode};

/// ListOffsets sentinel: the first offset still in the log.
pub const LIST_OFFSETS_EARLIEST: i64 = -2;
/// ListOffsets sentinel: the next offset to be written (log end).
pub const LIST_OFFSETS_LATEST: i64 = -1;

/// One response as read off the socket: the envelope flatbuffer (already
/// verified once by the connection reader) and the raw payload after it.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub header: Bytes,
    pub payload: Bytes,
    pub limits: FrameLimits,
}

impl RawResponse {
    /// The verified envelope, checked for a whole-request error and the
    /// expected API key.
    pub fn frame(&self, api_key: wire::ApiKey) -> Result<wire::ResponseFrame<'_>> {
        let frame = self
            .limits
            .verify_response(&self.header)
            .map_err(|e| ClientError::Protocol(format!("response failed verification: {e}")))?;
        if frame.error() != ErrorCode::None {
            return Err(ClientError::broker(frame.error(), frame.error_message()));
        }
        if frame.api_key() != api_key {
            return Err(ClientError::Protocol(format!(
                "expected a {api_key:?} response, got {:?}",
                frame.api_key()
            )));
        }
        Ok(frame)
    }
}

pub(crate) fn missing_body(api: &str) -> ClientError {
    ClientError::Protocol(format!("{api} response has no body"))
}

pub(crate) use shardlog_schema::frame::request_envelope as envelope;

fn config_entries<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    configs: &[(String, String)],
) -> WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::ConfigEntry<'a>>>> {
    let entries: Vec<_> = configs
        .iter()
        .map(|(k, v)| {
            let name = fbb.create_string(k);
            let value = fbb.create_string(v);
            wire::ConfigEntry::create(fbb, &wire::ConfigEntryArgs { name: Some(name), value: Some(value) })
        })
        .collect();
    fbb.create_vector(&entries)
}

pub(crate) fn string_vector<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    items: &[String],
) -> WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<&'a str>>> {
    let offsets: Vec<_> = items.iter().map(|s| fbb.create_string(s)).collect();
    fbb.create_vector(&offsets)
}

// ------------------------------------------------------------------ Metadata

/// A broker as named in metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: i32,
    pub host: String,
    /// Public port (any shard accepts, forwarding as needed).
    pub port: u16,
    /// `(shard, port)` for every shard.
    pub shard_ports: Vec<(u16, u16)>,
}

/// A partition as named in metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: u32,
    pub error: ErrorCode,
    pub leader_broker: i32,
    pub leader_shard: u16,
    pub leader_port: u16,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// A topic as named in metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    pub name: String,
    pub error: ErrorCode,
    pub partitions: Vec<PartitionInfo>,
    pub configs: Vec<(String, String)>,
}

impl TopicMetadata {
    /// Partition `partition`: at its index, where brokers list them (in
    /// order, none missing), else found by a scan. A producer asks once per
    /// batch; at 1,000 partitions the scan alone was 2.5 % of its CPU.
    #[must_use]
    pub fn partition(&self, partition: u32) -> Option<&PartitionInfo> {
        match self.partitions.get(partition as usize) {
            Some(p) if p.partition == partition => Some(p),
            _ => self.partitions.iter().find(|p| p.partition == partition),
        }
    }
}

/// A Metadata response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterMetadata {
    pub brokers: Vec<BrokerInfo>,
    pub controller_id: i32,
    pub topics: Vec<TopicMetadata>,
}

impl ClusterMetadata {
    #[must_use]
    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.iter().find(|t| t.name == name && t.error == ErrorCode::None)
    }

    #[must_use]
    pub fn broker(&self, id: i32) -> Option<&BrokerInfo> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// `host:port` of the shard that owns `topic`/`partition`: the leader
    /// broker's host with the leader shard's port (the broker's public port
    /// when metadata names no shard port).
    pub fn leader_addr(&self, topic: &str, partition: u32) -> Result<String> {
        let t = self.topic(topic).ok_or_else(|| ClientError::UnknownTopic(topic.to_string()))?;
        let p = t
            .partition(partition)
            .ok_or_else(|| ClientError::UnknownPartition { topic: topic.to_string(), partition })?;
        if p.error != ErrorCode::None {
            return Err(ClientError::broker(p.error, Some("partition metadata")));
        }
        let b = self.broker(p.leader_broker).ok_or_else(|| {
            ClientError::Protocol(format!(
                "leader broker {} of {topic}/{partition} not listed",
                p.leader_broker
            ))
        })?;
        let port = if p.leader_port != 0 { p.leader_port } else { b.port };
        Ok(format!("{}:{port}", b.host))
    }
}

pub fn encode_metadata(corr: u32, client_id: &str, topics: Option<&[String]>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let topics = topics.map(|t| string_vector(&mut fbb, t));
    let body = wire::MetadataRequest::create(&mut fbb, &wire::MetadataRequestArgs { topics });
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::Metadata,
        wire::RequestBody::MetadataRequest,
        body.as_union_value(),
        0,
    )
}

pub fn decode_metadata(raw: &RawResponse) -> Result<ClusterMetadata> {
    let frame = raw.frame(wire::ApiKey::Metadata)?;
    let body = frame.body_as_metadata_response().ok_or_else(|| missing_body("Metadata"))?;
    let brokers = body
        .brokers()
        .map(|bs| {
            bs.iter()
                .map(|b| BrokerInfo {
                    id: b.broker_id(),
                    host: b.host().unwrap_or("127.0.0.1").to_string(),
                    port: b.port(),
                    shard_ports: b
                        .shards()
                        .map(|s| s.iter().map(|e| (e.shard(), e.port())).collect())
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let topics = body
        .topics()
        .map(|ts| {
            ts.iter()
                .map(|t| TopicMetadata {
                    name: t.name().unwrap_or_default().to_string(),
                    error: t.error(),
                    partitions: t
                        .partitions()
                        .map(|ps| ps.iter().map(partition_info).collect())
                        .unwrap_or_default(),
                    configs: t
                        .configs()
                        .map(|cs| {
                            cs.iter()
                                .map(|c| {
                                    (
                                        c.name().unwrap_or_default().to_string(),
                                        c.value().unwrap_or_default().to_string(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(ClusterMetadata { brokers, controller_id: body.controller_id(), topics })
}

fn partition_info(p: wire::PartitionMetadata<'_>) -> PartitionInfo {
    PartitionInfo {
        partition: p.partition(),
        error: p.error(),
        leader_broker: p.leader_broker(),
        leader_shard: p.leader_shard(),
        leader_port: p.leader_port(),
        leader_epoch: p.leader_epoch(),
        replicas: p.replicas().map(|v| v.iter().collect()).unwrap_or_default(),
        isr: p.isr().map(|v| v.iter().collect()).unwrap_or_default(),
    }
}

// ------------------------------------------------------------------ Create / Delete topics

/// The outcome for one topic of CreateTopics / DeleteTopics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicResult {
    pub name: String,
    pub error: ErrorCode,
    pub message: Option<String>,
}

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub configs: Vec<(String, String)>,
}

pub fn encode_create_topics(corr: u32, client_id: &str, topics: &[NewTopic]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let items: Vec<_> = topics
        .iter()
        .map(|t| {
            let name = fbb.create_string(&t.name);
            let configs = config_entries(&mut fbb, &t.configs);
            wire::CreatableTopic::create(
                &mut fbb,
                &wire::CreatableTopicArgs {
                    name: Some(name),
                    partitions: t.partitions,
                    replication_factor: t.replication_factor,
                    configs: Some(configs),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&items);
    let body =
        wire::CreateTopicsRequest::create(&mut fbb, &wire::CreateTopicsRequestArgs { topics: Some(topics) });
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::CreateTopics,
        wire::RequestBody::CreateTopicsRequest,
        body.as_union_value(),
        0,
    )
}

pub fn encode_delete_topics(corr: u32, client_id: &str, topics: &[String]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let topics = string_vector(&mut fbb, topics);
    let body =
        wire::DeleteTopicsRequest::create(&mut fbb, &wire::DeleteTopicsRequestArgs { topics: Some(topics) });
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::DeleteTopics,
        wire::RequestBody::DeleteTopicsRequest,
        body.as_union_value(),
        0,
    )
}

fn topic_results<'a>(
    results: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>>,
) -> Vec<TopicResult> {
    results
        .map(|rs| {
            rs.iter()
                .map(|r| TopicResult {
                    name: r.name().unwrap_or_default().to_string(),
                    error: r.error(),
                    message: r.message().map(str::to_string),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn decode_create_topics(raw: &RawResponse) -> Result<Vec<TopicResult>> {
    let frame = raw.frame(wire::ApiKey::CreateTopics)?;
    let body = frame.body_as_create_topics_response().ok_or_else(|| missing_body("CreateTopics"))?;
    Ok(topic_results(body.results()))
}

pub fn decode_delete_topics(raw: &RawResponse) -> Result<Vec<TopicResult>> {
    let frame = raw.frame(wire::ApiKey::DeleteTopics)?;
    let body = frame.body_as_delete_topics_response().ok_or_else(|| missing_body("DeleteTopics"))?;
    Ok(topic_results(body.results()))
}

// ------------------------------------------------------------------ InitProducerId

/// Asks for a producer id (`-1, -1`), or the next epoch of `id`.
pub fn encode_init_producer_id(corr: u32, client_id: &str, id: i64, epoch: i16) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(64);
    let body = wire::InitProducerIdRequest::create(
        &mut fbb,
        &wire::InitProducerIdRequestArgs { producer_id: id, producer_epoch: epoch },
    );
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::InitProducerId,
        wire::RequestBody::InitProducerIdRequest,
        body.as_union_value(),
        0,
    )
}

/// The producer id and epoch granted.
pub fn decode_init_producer_id(raw: &RawResponse) -> Result<(i64, i16)> {
    let frame = raw.frame(wire::ApiKey::InitProducerId)?;
    let body = frame.body_as_init_producer_id_response().ok_or_else(|| missing_body("InitProducerId"))?;
    if body.error() != ErrorCode::None {
        return Err(ClientError::broker(body.error(), body.error_message()));
    }
    Ok((body.producer_id(), body.producer_epoch()))
}

// ------------------------------------------------------------------ Produce

/// One partition's data in a produce request: `batch_bytes` raw bytes of
/// whole batches follow the envelope in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceEntry<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub batch_bytes: u32,
}

pub fn encode_produce(
    corr: u32,
    client_id: &str,
    acks: i8,
    timeout_ms: u32,
    entries: &[ProduceEntry<'_>],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(128 + 48 * entries.len());
    let mut payload_bytes: u32 = 0;
    let items: Vec<_> = entries
        .iter()
        .map(|e| {
            payload_bytes += e.batch_bytes;
            let topic = fbb.create_string(e.topic);
            wire::ProducePartitionData::create(
                &mut fbb,
                &wire::ProducePartitionDataArgs {
                    topic: Some(topic),
                    partition: e.partition,
                    batch_bytes: e.batch_bytes,
                },
            )
        })
        .collect();
    let partitions = fbb.create_vector(&items);
    let body = wire::ProduceRequest::create(
        &mut fbb,
        &wire::ProduceRequestArgs { acks, timeout_ms, partitions: Some(partitions) },
    );
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::Produce,
        wire::RequestBody::ProduceRequest,
        body.as_union_value(),
        payload_bytes,
    )
}

/// One partition's outcome of a produce request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceResult {
    pub topic: String,
    pub partition: u32,
    pub error: ErrorCode,
    pub message: Option<String>,
    pub base_offset: i64,
    pub log_append_time_ms: i64,
}

pub fn decode_produce(raw: &RawResponse) -> Result<Vec<ProduceResult>> {
    let frame = raw.frame(wire::ApiKey::Produce)?;
    let body = frame.body_as_produce_response().ok_or_else(|| missing_body("Produce"))?;
    Ok(body
        .partitions()
        .map(|ps| {
            ps.iter()
                .map(|p| ProduceResult {
                    topic: p.topic().unwrap_or_default().to_string(),
                    partition: p.partition(),
                    error: p.error(),
                    message: p.error_message().map(str::to_string),
                    base_offset: p.base_offset(),
                    log_append_time_ms: p.log_append_time_ms(),
                })
                .collect()
        })
        .unwrap_or_default())
}

// ------------------------------------------------------------------ Fetch

/// One partition to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchTarget {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub max_bytes: u32,
}

/// Fetch-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchParams {
    pub max_wait_ms: u32,
    pub min_bytes: u32,
    pub max_bytes: u32,
}

pub fn encode_fetch(corr: u32, client_id: &str, params: FetchParams, targets: &[FetchTarget]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(128 + 48 * targets.len());
    let items: Vec<_> = targets
        .iter()
        .map(|t| {
            let topic = fbb.create_string(&t.topic);
            wire::FetchPartition::create(
                &mut fbb,
                &wire::FetchPartitionArgs {
                    topic: Some(topic),
                    partition: t.partition,
                    fetch_offset: t.offset as i64,
                    partition_max_bytes: t.max_bytes,
                    current_leader_epoch: -1,
                    replica_log_end: -1,
                },
            )
        })
        .collect();
    let partitions = fbb.create_vector(&items);
    let body = wire::FetchRequest::create(
        &mut fbb,
        &wire::FetchRequestArgs {
            replica_id: -1,
            max_wait_ms: params.max_wait_ms,
            min_bytes: params.min_bytes,
            max_bytes: params.max_bytes,
            partitions: Some(partitions),
        },
    );
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::Fetch,
        wire::RequestBody::FetchRequest,
        body.as_union_value(),
        0,
    )
}

/// One partition of a fetch response, with its raw batch bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResult {
    pub topic: String,
    pub partition: u32,
    pub error: ErrorCode,
    pub message: Option<String>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// Whole batches, possibly followed by a partial one (ignore it).
    pub data: Bytes,
}

pub fn decode_fetch(raw: &RawResponse) -> Result<Vec<FetchResult>> {
    let frame = raw.frame(wire::ApiKey::Fetch)?;
    let body = frame.body_as_fetch_response().ok_or_else(|| missing_body("Fetch"))?;
    let mut at = 0usize;
    let mut out = Vec::new();
    for p in body.partitions().iter().flatten() {
        let len = p.bytes() as usize;
        if at + len > raw.payload.len() {
            return Err(ClientError::Protocol(format!(
                "fetch response lists {} payload bytes but carries {}",
                at + len,
                raw.payload.len()
            )));
        }
        out.push(FetchResult {
            topic: p.topic().unwrap_or_default().to_string(),
            partition: p.partition(),
            error: p.error(),
            message: p.error_message().map(str::to_string),
            high_watermark: p.high_watermark(),
            log_start_offset: p.log_start_offset(),
            data: raw.payload.slice(at..at + len),
        });
        at += len;
    }
    Ok(out)
}

// ------------------------------------------------------------------ ListOffsets

/// One ListOffsets query: `timestamp` is [`LIST_OFFSETS_EARLIEST`],
/// [`LIST_OFFSETS_LATEST`] or a time in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetQuery {
    pub topic: String,
    pub partition: u32,
    pub timestamp: i64,
}

/// One ListOffsets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetAnswer {
    pub topic: String,
    pub partition: u32,
    pub error: ErrorCode,
    pub offset: i64,
    pub timestamp: i64,
}

pub fn encode_list_offsets(corr: u32, client_id: &str, queries: &[OffsetQuery]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(128 + 48 * queries.len());
    let items: Vec<_> = queries
        .iter()
        .map(|q| {
            let topic = fbb.create_string(&q.topic);
            wire::ListOffsetsPartition::create(
                &mut fbb,
                &wire::ListOffsetsPartitionArgs {
                    topic: Some(topic),
                    partition: q.partition,
                    timestamp: q.timestamp,
                },
            )
        })
        .collect();
    let partitions = fbb.create_vector(&items);
    let body = wire::ListOffsetsRequest::create(
        &mut fbb,
        &wire::ListOffsetsRequestArgs { partitions: Some(partitions) },
    );
    envelope(
        fbb,
        corr,
        client_id,
        wire::ApiKey::ListOffsets,
        wire::RequestBody::ListOffsetsRequest,
        body.as_union_value(),
        0,
    )
}

pub fn decode_list_offsets(raw: &RawResponse) -> Result<Vec<OffsetAnswer>> {
    let frame = raw.frame(wire::ApiKey::ListOffsets)?;
    let body = frame.body_as_list_offsets_response().ok_or_else(|| missing_body("ListOffsets"))?;
    Ok(body
        .partitions()
        .map(|ps| {
            ps.iter()
                .map(|p| OffsetAnswer {
                    topic: p.topic().unwrap_or_default().to_string(),
                    partition: p.partition(),
                    error: p.error(),
                    offset: p.offset(),
                    timestamp: p.timestamp(),
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(partition: u32) -> PartitionInfo {
        PartitionInfo {
            partition,
            error: ErrorCode::None,
            leader_broker: 1,
            leader_shard: 0,
            leader_port: 9000 + partition as u16,
            leader_epoch: 0,
            replicas: vec![1],
            isr: vec![1],
        }
    }

    fn topic(partitions: &[u32]) -> TopicMetadata {
        TopicMetadata {
            name: "t".into(),
            error: ErrorCode::None,
            partitions: partitions.iter().copied().map(part).collect(),
            configs: Vec::new(),
        }
    }

    #[test]
    fn partitions_are_found_in_order_out_of_order_and_not_when_missing() {
        let in_order = topic(&[0, 1, 2, 3]);
        assert_eq!(in_order.partition(2).map(|p| p.partition), Some(2));
        let shuffled = topic(&[3, 0, 2]);
        for p in [0, 2, 3] {
            assert_eq!(shuffled.partition(p).map(|x| x.partition), Some(p));
        }
        assert!(shuffled.partition(1).is_none());
        assert!(in_order.partition(4).is_none());
        let md = ClusterMetadata {
            brokers: vec![BrokerInfo { id: 1, host: "h".into(), port: 9092, shard_ports: Vec::new() }],
            controller_id: 1,
            topics: vec![shuffled],
        };
        assert_eq!(md.leader_addr("t", 2).unwrap(), "h:9002");
        assert!(matches!(md.leader_addr("t", 1), Err(ClientError::UnknownPartition { partition: 1, .. })));
    }
}
