//! Produce: each partition's batches go to the owner shard's log.

use super::{request_error, response, Outgoing};
use crate::partition::PartitionError;
use crate::shard::{Acks, ShardContext, ShardOp, ShardReply};
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

/// One partition's part of a produce, as its owner answered it.
pub(crate) struct ProduceOutcome {
    pub(crate) topic: String,
    pub(crate) partition: u32,
    pub(crate) result: Result<crate::shard::Appended, PartitionError>,
}

/// Appends `data` (whole batches) to a partition on its owner shard. The
/// append takes its place in the log's order before the first suspension
/// on the local path (see the module invariant); the Kafka listener uses it too.
pub(crate) async fn produce_one(
    ctx: &Rc<ShardContext>,
    topic: &str,
    partition: u32,
    data: &[u8],
    acks: Acks,
) -> ProduceOutcome {
    use tracing::Instrument;
    produce_in_partition(ctx, topic, partition, data, acks)
        .instrument(tracing::info_span!("partition", topic, partition))
        .await
}

/// [`produce_one`] inside its `partition` span.
async fn produce_in_partition(
    ctx: &Rc<ShardContext>,
    topic: &str,
    partition: u32,
    data: &[u8],
    acks: Acks,
) -> ProduceOutcome {
    let result = if let Some(e) = ctx.check_served(topic, partition) {
        Err(e)
    } else if topic == shardlog_schema::types::OFFSETS_TOPIC {
        Err(PartitionError::new(
            ErrorCode::InvalidTopicName,
            format!("`{topic}` is internal: only the group coordinator writes to it"),
        ))
    } else {
        let owner = ctx.owner(topic, partition);
        if owner == ctx.id {
            ctx.produce_local(topic, partition, data, acks).await
        } else {
            crate::metrics::ShardMetrics::inc(&ctx.metrics.forwarded_requests);
            let op = ShardOp::Produce { topic: topic.to_string(), partition, batches: data.to_vec(), acks };
            match ctx.call(owner, op).await {
                ShardReply::Produce(r) => r,
                _ => Err(PartitionError::new(ErrorCode::BrokerShuttingDown, "owner shard unavailable")),
            }
        }
    };
    ProduceOutcome { topic: topic.to_string(), partition, result }
}

pub(super) async fn produce(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: wire::ProduceRequest<'_>,
    payload: &[u8],
) -> Outgoing {
    let acks = req.acks();
    let waits = Acks::from_request(i16::from(acks), u64::from(req.timeout_ms()));
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
    let outcomes = if let [p] = &parts[..] {
        vec![produce_one(ctx, p.topic().unwrap_or(""), p.partition(), payload, waits).await]
    } else {
        // Partitions run concurrently (each owner group-commits on its own),
        // but each one's first step runs now, in request order: that is
        // where the log takes the append's place in line, so a later
        // request of this connection for the same partition cannot get in
        // ahead (spawned tasks could: they first ran after it).
        let payload: Rc<[u8]> = Rc::from(payload);
        let mut pos = 0usize;
        let parts_in_order = parts.iter().map(|p| {
            let (ctx, payload, topic) = (ctx.clone(), payload.clone(), p.topic().unwrap_or("").to_string());
            let (partition, range) = (p.partition(), pos..pos + p.batch_bytes() as usize);
            pos = range.end;
            async move { produce_one(&ctx, &topic, partition, &payload[range], waits).await }
        });
        super::spawn_in_order(parts_in_order).await
    };
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

/// InitProducerId: an id (and epoch) for an idempotent producer
/// (`producer_ids::init`).
pub(super) async fn init_producer_id(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: Option<wire::InitProducerIdRequest<'_>>,
) -> Vec<u8> {
    let (id, epoch) = req.map_or((-1, -1), |r| (r.producer_id(), r.producer_epoch()));
    let outcome = crate::producer_ids::init(ctx, id, epoch).await;
    let mut fbb = FlatBufferBuilder::with_capacity(128);
    let args = match outcome {
        Ok((producer_id, producer_epoch)) => wire::InitProducerIdResponseArgs {
            error: ErrorCode::None,
            error_message: None,
            producer_id,
            producer_epoch,
        },
        Err(e) => {
            let msg = fbb.create_string(&e.message);
            wire::InitProducerIdResponseArgs {
                error: e.code,
                error_message: Some(msg),
                producer_id: -1,
                producer_epoch: -1,
            }
        }
    };
    let body = wire::InitProducerIdResponse::create(&mut fbb, &args);
    response(&mut fbb, corr, ApiKey::InitProducerId, wire::ResponseBody::InitProducerIdResponse, body, 0)
}
