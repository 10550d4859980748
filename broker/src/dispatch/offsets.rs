//! ListOffsets: earliest, latest or by timestamp, answered by the owner.

use super::response;
use crate::partition::PartitionError;
use crate::shard::{ShardContext, ShardOp, ShardReply};
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

pub(super) async fn list_offsets(
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
        let r = if let Some(e) = ctx.check_served(&topic, partition) {
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
