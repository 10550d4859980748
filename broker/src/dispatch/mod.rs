//! Request → owning shard. Decodes a verified request envelope, runs each
//! partition's part on its owner (locally, or over the mesh), and builds the
//! response.
//!
//! **Invariant**: a produce for a partition reaches its log in the order the
//! connection sent it. Handlers are spawned in arrival order and reach
//! `Log::append` (which fixes the order appends enter the log) before
//! their first suspension point: on the local path directly, for every
//! partition of a multi-partition request (`spawn_in_order` polls each part
//! once, in request order, before waiting on any), and on the forwarded
//! path through the shard's per-destination outbox (`ShardContext::call`
//! queues in call order) and the owner's in-order handling of mesh requests.
//! **API boundary**: `dispatch` never touches sockets or files.

use crate::log::ReadChunk;
use crate::shard::ShardContext;
use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardlog_schema::frame::{error_response, finish_into};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

/// The highest version of each API this broker speaks.
pub const API_VERSIONS: &[(ApiKey, u16, u16)] = &[
    (ApiKey::ApiVersions, 0, 0),
    (ApiKey::Metadata, 0, 0),
    (ApiKey::CreateTopics, 0, 0),
    (ApiKey::DeleteTopics, 0, 0),
    (ApiKey::Produce, 0, 0),
    (ApiKey::Fetch, 0, 0),
    (ApiKey::ListOffsets, 0, 0),
    (ApiKey::FindCoordinator, 0, 0),
    (ApiKey::JoinGroup, 0, 0),
    (ApiKey::SyncGroup, 0, 0),
    (ApiKey::Heartbeat, 0, 0),
    (ApiKey::LeaveGroup, 0, 0),
    (ApiKey::OffsetCommit, 0, 0),
    (ApiKey::OffsetFetch, 0, 0),
    (ApiKey::ListGroups, 0, 0),
    (ApiKey::DescribeGroups, 0, 0),
    (ApiKey::DeleteGroups, 0, 0),
    (ApiKey::InitProducerId, 0, 0),
    (ApiKey::OffsetsForLeaderEpoch, 0, 0),
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
    use crate::metrics::ApiClass;
    let class = match frame.api_key() {
        ApiKey::Produce | ApiKey::InitProducerId => ApiClass::Produce,
        ApiKey::Fetch | ApiKey::OffsetsForLeaderEpoch => ApiClass::Fetch,
        ApiKey::CreateTopics | ApiKey::DeleteTopics => ApiClass::Admin,
        k if k.0 >= ApiKey::FindCoordinator.0 => ApiClass::Group,
        _ => ApiClass::Metadata,
    };
    let started = std::time::Instant::now();
    let out = handle_api(ctx, frame, payload).await;
    ctx.metrics.record_latency(class, started.elapsed());
    out
}

async fn handle_api(ctx: &Rc<ShardContext>, frame: wire::RequestFrame<'_>, payload: &[u8]) -> Outgoing {
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
        ApiKey::ApiVersions => Outgoing::Frame(metadata::api_versions(corr)),
        ApiKey::Metadata => Outgoing::Frame(metadata::metadata(ctx, corr, frame.body_as_metadata_request())),
        ApiKey::CreateTopics => {
            Outgoing::Frame(admin::create_topics(ctx, corr, frame.body_as_create_topics_request()).await)
        }
        ApiKey::DeleteTopics => {
            Outgoing::Frame(admin::delete_topics(ctx, corr, frame.body_as_delete_topics_request()).await)
        }
        ApiKey::Produce => match frame.body_as_produce_request() {
            Some(req) => produce::produce(ctx, corr, req, payload).await,
            None => request_error(corr, key, ErrorCode::InvalidRequest, "missing body"),
        },
        ApiKey::Fetch => match frame.body_as_fetch_request() {
            Some(req) => fetch::fetch(ctx, corr, req).await,
            None => request_error(corr, key, ErrorCode::InvalidRequest, "missing body"),
        },
        ApiKey::ListOffsets => {
            Outgoing::Frame(offsets::list_offsets(ctx, corr, frame.body_as_list_offsets_request()).await)
        }
        ApiKey::FindCoordinator
        | ApiKey::JoinGroup
        | ApiKey::SyncGroup
        | ApiKey::Heartbeat
        | ApiKey::LeaveGroup
        | ApiKey::OffsetCommit
        | ApiKey::OffsetFetch
        | ApiKey::ListGroups
        | ApiKey::DescribeGroups
        | ApiKey::DeleteGroups => group::handle(ctx, corr, frame).await,
        ApiKey::InitProducerId => Outgoing::Frame(
            produce::init_producer_id(ctx, corr, frame.body_as_init_producer_id_request()).await,
        ),
        ApiKey::OffsetsForLeaderEpoch => Outgoing::Frame(replica::offsets_for_leader_epoch(
            ctx,
            corr,
            frame.body_as_offsets_for_leader_epoch_request(),
        )),
        _ => request_error(corr, key, ErrorCode::UnsupportedApi, "unsupported api"),
    }
}

/// Runs futures concurrently and returns their outputs in order. Each is
/// polled once here, in order, before any is waited for, so whatever a
/// future does before its first suspension point happens in iteration
/// order; the ones not finished then go on as tasks of their own.
pub(crate) async fn spawn_in_order<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    enum Part<T> {
        Done(T),
        Running(glommio::task::JoinHandle<T>),
    }
    let mut parts = Vec::new();
    for f in futures {
        let mut f = Box::pin(f);
        parts.push(match futures_lite::future::poll_once(f.as_mut()).await {
            Some(v) => Part::Done(v),
            None => Part::Running(glommio::spawn_local(f).detach()),
        });
    }
    let mut outputs = Vec::with_capacity(parts.len());
    for p in parts {
        outputs.push(match p {
            Part::Done(v) => v,
            Part::Running(task) => task.await.expect("a produce part is never cancelled"),
        });
    }
    outputs
}

pub(crate) mod admin;
pub(crate) mod fetch;
mod group;
mod metadata;
mod offsets;
pub(crate) mod produce;
mod replica;
