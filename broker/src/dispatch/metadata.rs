//! ApiVersions and Metadata: what this broker speaks, and which broker,
//! shard and port own each partition.

use super::{response, API_VERSIONS};
use crate::shard::ShardContext;
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;

pub(super) fn api_versions(corr: u32) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let ranges: Vec<_> =
        API_VERSIONS.iter().map(|(k, min, max)| wire::ApiVersionRange::new(*k, *min, *max)).collect();
    let apis = fbb.create_vector(&ranges);
    let body =
        wire::ApiVersionsResponse::create(&mut fbb, &wire::ApiVersionsResponseArgs { apis: Some(apis) });
    response(&mut fbb, corr, ApiKey::ApiVersions, wire::ResponseBody::ApiVersionsResponse, body, 0)
}

pub(super) fn metadata(ctx: &Rc<ShardContext>, corr: u32, req: Option<wire::MetadataRequest<'_>>) -> Vec<u8> {
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
