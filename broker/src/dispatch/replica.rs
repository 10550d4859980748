//! OffsetsForLeaderEpoch: where an epoch ends on this leader, for a
//! follower about to truncate (`replica::fetcher`). Replica fetches
//! themselves are Fetch requests with a replica id (`fetch`).

use super::response;
use crate::partition::{Partition, PartitionError};
use crate::shard::ShardContext;
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

/// A replica request's epoch check: `None` when `asked` (-1: unchecked)
/// is the epoch this leader leads.
pub(crate) fn check_epoch(p: &Partition, asked: i32) -> Option<PartitionError> {
    let ours = p.replica.epoch();
    if asked < 0 || ours == Some(asked) {
        return None;
    }
    let ours = ours.map_or_else(|| "none".to_string(), |e| e.to_string());
    Some(PartitionError::new(
        ErrorCode::FencedLeaderEpoch,
        format!(
            "partition {}-{}: the request names leader epoch {asked}, this broker has {ours}",
            p.topic, p.id
        ),
    ))
}

/// The owner's answer for one partition: (epoch, end offset).
fn epoch_end(ctx: &Rc<ShardContext>, q: &wire::EpochQuery<'_>) -> Result<(i32, i64), PartitionError> {
    let topic = q.topic().unwrap_or("");
    if let Some(e) = ctx.check_served(topic, q.partition()) {
        return Err(e);
    }
    let p = ctx.local(topic, q.partition())?;
    if let Some(e) = check_epoch(&p, q.current_leader_epoch()) {
        return Err(e);
    }
    Ok(p.log.epoch_end_offset(q.leader_epoch()).map_or((-1, -1), |(e, o)| (e, o.0 as i64)))
}

pub(super) fn offsets_for_leader_epoch(
    ctx: &Rc<ShardContext>,
    corr: u32,
    req: Option<wire::OffsetsForLeaderEpochRequest<'_>>,
) -> Vec<u8> {
    let queries: Vec<_> = req.and_then(|r| r.partitions()).map(|v| v.iter().collect()).unwrap_or_default();
    let mut fbb = FlatBufferBuilder::with_capacity(64 + 96 * queries.len());
    let answers: Vec<_> = queries
        .iter()
        .map(|q| {
            let topic = fbb.create_string(q.topic().unwrap_or(""));
            // A follower connects to the owner shard: no forwarding here.
            let (error, message, leader_epoch, end_offset) = match epoch_end(ctx, q) {
                Ok((e, o)) => (ErrorCode::None, None, e, o),
                Err(e) => (e.code, Some(fbb.create_string(&e.message)), -1, -1),
            };
            wire::EpochEndOffset::create(
                &mut fbb,
                &wire::EpochEndOffsetArgs {
                    topic: Some(topic),
                    partition: q.partition(),
                    error,
                    error_message: message,
                    leader_epoch,
                    end_offset,
                },
            )
        })
        .collect();
    let partitions = fbb.create_vector(&answers);
    let body = wire::OffsetsForLeaderEpochResponse::create(
        &mut fbb,
        &wire::OffsetsForLeaderEpochResponseArgs { partitions: Some(partitions) },
    );
    response(
        &mut fbb,
        corr,
        ApiKey::OffsetsForLeaderEpoch,
        wire::ResponseBody::OffsetsForLeaderEpochResponse,
        body,
        0,
    )
}
