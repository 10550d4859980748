//! The Kafka wire-protocol listener (`--kafka-listen`): existing Kafka
//! clients (librdkafka, kafka-python, the Java client, kcat) talk to the
//! same shards, logs and group coordinator as native clients.
//!
//! **Nodes**: each shard is its own Kafka node. Every shard accepts on the
//! Kafka port (SO_REUSEPORT: any shard answers the bootstrap Metadata), and
//! shard `i` also on its own Kafka port (Kafka port + 1 + i). Metadata names
//! node [`node_id`]`(broker, i)` at that port as the leader of the
//! partitions shard `i` owns, so Kafka clients, like native ones, reach the
//! owning shard with no cross-core hop. A request that still reaches another
//! shard (a client with stale metadata) is served through the mesh.
//! `--kafka-advertise shared` names one node at the shared port instead
//! ([`advertised_node`]): every request is served where it was accepted,
//! forwarding the parts of other shards' partitions (measured against the
//! default in ARCHITECTURE.md).
//!
//! **Per connection, one request at a time, in order**: as Kafka's own
//! broker does, a connection's next request is read only once the previous
//! one is answered, so a producer's batches reach each partition in the
//! order it sent them and responses go out in request order.
//!
//! **Bad input**: a frame over the size limit, a header that does not
//! decode, or an API or version outside [`SUPPORTED`] closes the connection
//! with a warning naming the peer and why; ApiVersions at a version we do
//! not speak gets the v0-format `UNSUPPORTED_VERSION` answer listing our
//! APIs (clients retry lower). Nothing here panics on network input.

mod api;
mod configs;
pub mod decompress;
mod group;
pub mod records;
pub mod request;

use crate::config::KafkaAdvertise;
use crate::shard::ShardContext;
use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use shardlog_schema::wire::ErrorCode;
use std::rc::Rc;
use std::time::Duration;

/// Kafka node ids per broker: shard `s` of broker `b` is node `b * 1024 + s`.
pub const NODES_PER_BROKER: i32 = 1024;

/// The Kafka node id of a broker's shard.
#[must_use]
pub fn node_id(broker_id: i32, shard: u16) -> i32 {
    broker_id.saturating_mul(NODES_PER_BROKER).saturating_add(i32::from(shard))
}

/// The Kafka node (id, port) Metadata and FindCoordinator name for what
/// `shard` owns: the shard's own node, or with `--kafka-advertise shared`
/// the broker's one node at the shared port.
pub(crate) fn advertised_node(ctx: &ShardContext, shard: u16) -> (i32, u16) {
    match ctx.config.kafka_advertise {
        KafkaAdvertise::PerShard => (
            node_id(ctx.config.broker_id, shard),
            ctx.endpoints.kafka_ports.get(usize::from(shard)).copied().unwrap_or_default(),
        ),
        KafkaAdvertise::Shared => (node_id(ctx.config.broker_id, 0), ctx.endpoints.kafka_port),
    }
}

/// The Kafka node (id, host, port) coordinating `group`: this broker's node
/// for the coordinating shard, or in a cluster the node of the offsets
/// partition's leader (from its registration).
pub(crate) fn coordinator_node(
    ctx: &ShardContext,
    group: &str,
) -> Result<(i32, String, u16), crate::group::api::GroupError> {
    let c = crate::group::locate_coordinator(ctx, group)?;
    let Some(md) = ctx.cluster_metadata() else {
        let (node, port) = advertised_node(ctx, c.shard);
        return Ok((node, ctx.endpoints.host.clone(), port));
    };
    md.brokers
        .get(&c.broker_id)
        .and_then(|b| b.kafka_node(c.shard).map(|(node, port)| (node, b.host.clone(), port)))
        .ok_or_else(|| {
            crate::group::api::GroupError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("broker {} coordinates group `{group}` but has no Kafka listener", c.broker_id),
            )
        })
}

/// The APIs and version ranges the listener answers (ApiVersions lists them).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::InitProducerId, 0, 4),
];

/// The supported version range of `key`, if any.
fn supported(key: i16) -> Option<(ApiKey, i16, i16)> {
    SUPPORTED.iter().copied().find(|(k, _, _)| *k as i16 == key)
}

/// Kafka's error code for ours (`kafka_protocol::ResponseError` numbering).
#[must_use]
pub fn error_code(code: ErrorCode) -> i16 {
    match code {
        ErrorCode::None => 0,
        ErrorCode::OffsetOutOfRange => 1,
        ErrorCode::CorruptMessage => 2,
        ErrorCode::UnknownTopicOrPartition => 3,
        ErrorCode::LeaderNotAvailable => 5,
        ErrorCode::NotEnoughReplicas => 19,
        ErrorCode::FencedLeaderEpoch => 74,
        // Not the leader: the client refreshes metadata and retries, which
        // is what a shard that is shutting down wants too.
        ErrorCode::NotLeaderOrFollower | ErrorCode::BrokerShuttingDown => 6,
        // Retriable: the client backs off and sends again.
        ErrorCode::RequestTimedOut | ErrorCode::TooManyInFlight | ErrorCode::ResourceLimit => 7,
        ErrorCode::MessageTooLarge | ErrorCode::RequestTooLarge => 10,
        ErrorCode::OffsetMetadataTooLarge => 12,
        ErrorCode::CoordinatorNotAvailable => 15,
        ErrorCode::NotCoordinator => 16,
        ErrorCode::InvalidTopicName => 17,
        ErrorCode::IllegalGeneration => 22,
        ErrorCode::InconsistentGroupProtocol => 23,
        ErrorCode::InvalidGroupId => 24,
        ErrorCode::UnknownMemberId => 25,
        ErrorCode::InvalidSessionTimeout => 26,
        ErrorCode::RebalanceInProgress => 27,
        ErrorCode::UnsupportedVersion | ErrorCode::UnsupportedApi => 35,
        ErrorCode::TopicAlreadyExists => 36,
        ErrorCode::InvalidPartitions => 37,
        ErrorCode::InvalidConfig => 40,
        ErrorCode::InvalidRequest => 42,
        ErrorCode::OutOfOrderSequence => 45,
        ErrorCode::InvalidProducerEpoch => 47,
        ErrorCode::StorageError | ErrorCode::StorageFull => 56,
        ErrorCode::NonEmptyGroup => 68,
        ErrorCode::GroupIdNotFound => 69,
        ErrorCode::GroupMaxSizeReached => 81,
        ErrorCode::FencedInstanceId => 82,
        _ => -1,
    }
}

/// Accepts Kafka connections until the shard stops (same limits and
/// back-off as the native listeners: `net::accept_next`).
pub async fn accept_loop(ctx: Rc<ShardContext>, listener: TcpListener, name: &'static str) {
    crate::net::accept_connections(ctx, listener, name, |ctx, stream| Box::pin(serve(ctx, stream))).await;
}

/// Why a connection ends.
enum Close {
    /// The peer closed, or a socket operation failed: nothing to say.
    Quiet,
    /// The peer broke the protocol or a limit: log it.
    Warn(String),
}

async fn serve(ctx: Rc<ShardContext>, mut stream: TcpStream) {
    let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    match serve_requests(&ctx, &mut stream, &peer).await {
        Close::Quiet => {}
        Close::Warn(why) => {
            crate::metrics::ShardMetrics::inc(&ctx.metrics.rejected_frames);
            tracing::warn!(%peer, listener = "kafka", why, "closing Kafka connection");
        }
    }
    let _closed = stream.shutdown(std::net::Shutdown::Both).await;
}

/// Runs a socket operation under a deadline.
async fn timed<T>(limit: Duration, op: impl std::future::Future<Output = std::io::Result<T>>) -> Option<T> {
    let op = async { op.await.ok() };
    let deadline = async {
        glommio::timer::sleep(limit).await;
        None
    };
    futures_lite::future::or(op, deadline).await
}

async fn serve_requests(ctx: &Rc<ShardContext>, stream: &mut TcpStream, peer: &str) -> Close {
    let limits = &ctx.config.limits;
    let frame_max = u64::from(limits.header_bytes_max) + u64::from(limits.request_payload_bytes_max);
    loop {
        let mut len = [0u8; 4];
        match timed(limits.connection_idle_max, stream.read_exact(&mut len)).await {
            Some(()) => {}
            None => return Close::Quiet,
        }
        let len = i32::from_be_bytes(len);
        if len < 8 || len as u64 > frame_max {
            return Close::Warn(format!("request frame of {len} bytes (allowed: 8 to {frame_max})"));
        }
        let mut frame = vec![0u8; len as usize];
        if timed(limits.request_read_timeout, stream.read_exact(&mut frame)).await.is_none() {
            return Close::Warn("request frame did not arrive in time".into());
        }
        let out = match answer(ctx, Bytes::from(frame), peer).await {
            Ok(Some(out)) => out,
            Ok(None) => continue, // acks=0 produce
            Err(why) => return Close::Warn(why),
        };
        if timed(limits.response_write_timeout, stream.write_all(&out)).await.is_none() {
            return Close::Quiet;
        }
    }
}

/// Decodes one request frame and answers it: the whole response frame
/// (length prefix included), `None` for a request without a response, or
/// why the connection must close.
async fn answer(ctx: &Rc<ShardContext>, mut frame: Bytes, peer: &str) -> Result<Option<Vec<u8>>, String> {
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Some((api, min, max)) = supported(key) else {
        return Err(format!("API key {key} (version {version}) is not supported"));
    };
    if version < min || version > max {
        if api == ApiKey::ApiVersions {
            return Ok(Some(api::unsupported_api_versions(correlation_id)));
        }
        return Err(format!("{api:?} version {version} is not supported (supported: {min} to {max})"));
    }
    let header = RequestHeader::decode(&mut frame, api.request_header_version(version))
        .map_err(|e| format!("{api:?} v{version}: bad request header: {e}"))?;
    let started = std::time::Instant::now();
    let body = api::handle(ctx, api, version, &header, peer, frame)
        .await
        .map_err(|e| format!("{api:?} v{version}: {e}"))?;
    ctx.metrics.record_latency(api::class(api), started.elapsed());
    let Some(body) = body else {
        return Ok(None);
    };
    Ok(Some(response_frame(correlation_id, api.response_header_version(version), &body)))
}

/// A response frame: length, response header, body.
fn response_frame(correlation_id: i32, header_version: i16, body: &[u8]) -> Vec<u8> {
    let mut head = BytesMut::with_capacity(16);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header.encode(&mut head, header_version).expect("a response header always encodes");
    let len = (head.len() + body.len()) as u32;
    let mut out = Vec::with_capacity(4 + len as usize);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    out
}
