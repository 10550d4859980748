//! CreateTopics and DeleteTopics: forwarded to shard 0, the only writer
//! of topic metadata.

use super::response;
use crate::shard::{ShardContext, ShardOp, ShardReply, TopicSpec};
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

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

pub(super) async fn create_topics(
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

pub(super) async fn delete_topics(
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
