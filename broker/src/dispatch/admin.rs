//! CreateTopics and DeleteTopics: forwarded to shard 0, the only writer
//! of topic metadata.

use super::response;
use crate::shard::{ShardContext, ShardOp, ShardReply, TopicSpec};
use crate::topic_error::{TopicOpError, TopicOutcome};
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey};
use std::rc::Rc;

fn topic_results(corr: u32, key: ApiKey, results: &[TopicOutcome], create: bool) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let rs: Vec<_> = results
        .iter()
        .map(|outcome| {
            let (code, msg) = outcome.code_and_message();
            let name = fbb.create_string(&outcome.name);
            let msg = (!msg.is_empty()).then(|| fbb.create_string(&msg));
            wire::TopicResult::create(
                &mut fbb,
                &wire::TopicResultArgs { name: Some(name), error: code, message: msg },
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

/// Asks shard 0 to create or delete `names`; a reply other than results
/// fails every topic with a typed error.
pub(crate) async fn topic_admin(ctx: &Rc<ShardContext>, op: ShardOp, names: &[String]) -> Vec<TopicOutcome> {
    let fail_all = |error: &dyn Fn(String) -> TopicOpError| {
        names.iter().map(|n| TopicOutcome { name: n.clone(), result: Err(error(n.clone())) }).collect()
    };
    match ctx.call(shardlog_schema::ShardId(0), op).await {
        ShardReply::TopicResults(r) => r,
        ShardReply::Unavailable => fail_all(&|topic| TopicOpError::ShardUnavailable { topic, shard: 0 }),
        other => {
            let reply = format!("{other:?}");
            fail_all(&|topic| TopicOpError::UnexpectedReply { topic, shard: 0, reply: reply.clone() })
        }
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
    let results = topic_admin(ctx, ShardOp::CreateTopics(specs), &names).await;
    for outcome in &results {
        match &outcome.result {
            Ok(()) => tracing::info!(topic = %outcome.name, "topic created"),
            Err(e) => {
                tracing::info!(topic = %outcome.name, error = ?e.error_code(), msg = %e, "topic not created")
            }
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
    let results = topic_admin(ctx, ShardOp::DeleteTopics(names.clone()), &names).await;
    topic_results(corr, ApiKey::DeleteTopics, &results, false)
}
