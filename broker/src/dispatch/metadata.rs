//! ApiVersions and Metadata: what this broker speaks, and which broker,
//! shard and port own each partition (in a cluster: every broker, and each
//! partition's leader from the snapshot this shard applied; a partition
//! without a live leader carries `LeaderNotAvailable`).

use super::{response, API_VERSIONS};
use crate::cluster::metadata::{ClusterMetadata, Route};
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

/// One broker as Metadata lists it.
struct BrokerRow<'a> {
    id: i32,
    host: &'a str,
    port: u16,
    shard_ports: &'a [u16],
}

/// One partition as Metadata lists it.
struct PartitionRow {
    error: ErrorCode,
    leader: i32,
    shard: u16,
    port: u16,
    leader_epoch: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
}

/// A partition of a broker alone: it leads everything, at epoch 0.
fn partition_alone(ctx: &ShardContext, topic: &str, p: u32) -> PartitionRow {
    let shard = ctx.owner(topic, p);
    let id = ctx.config.broker_id;
    PartitionRow {
        error: ErrorCode::None,
        leader: id,
        shard: shard.0,
        port: ctx.endpoints.shard_ports[shard.0 as usize],
        leader_epoch: 0,
        replicas: vec![id],
        isr: vec![id],
    }
}

/// A partition of the cluster, from the snapshot this shard applied.
fn partition_in(md: &ClusterMetadata, topic: &str, p: u32) -> PartitionRow {
    let (replicas, isr) = md
        .topics
        .get(topic)
        .and_then(|t| t.partitions.get(p as usize))
        .map(|i| (i.replicas.clone(), i.isr.clone()))
        .unwrap_or_default();
    let unavailable = |leader_epoch| PartitionRow {
        error: ErrorCode::LeaderNotAvailable,
        leader: -1,
        shard: 0,
        port: 0,
        leader_epoch,
        replicas: replicas.clone(),
        isr: isr.clone(),
    };
    match md.route(topic, p) {
        Route::Leader { leader, leader_epoch, broker: Some(b) } => {
            let (shard, port) = ClusterMetadata::leader_endpoint(b, topic, p);
            PartitionRow {
                error: ErrorCode::None,
                leader,
                shard,
                port,
                leader_epoch,
                replicas: replicas.clone(),
                isr: isr.clone(),
            }
        }
        Route::Leader { leader_epoch, broker: None, .. } => unavailable(leader_epoch),
        Route::Offline { .. } | Route::Unknown => unavailable(-1),
    }
}

pub(super) fn metadata(ctx: &Rc<ShardContext>, corr: u32, req: Option<wire::MetadataRequest<'_>>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(1024);
    let ep = &ctx.endpoints;
    let cluster = ctx.cluster_metadata();
    let rows: Vec<BrokerRow<'_>> = match &cluster {
        None => vec![BrokerRow {
            id: ctx.config.broker_id,
            host: &ep.host,
            port: ep.public_port,
            shard_ports: &ep.shard_ports,
        }],
        Some(md) => md
            .brokers
            .values()
            .map(|b| BrokerRow { id: b.id, host: &b.host, port: b.port, shard_ports: &b.shard_ports })
            .collect(),
    };
    let brokers: Vec<_> = rows
        .iter()
        .map(|row| {
            let host = fbb.create_string(row.host);
            let shards: Vec<_> = row
                .shard_ports
                .iter()
                .enumerate()
                .map(|(s, port)| {
                    wire::ShardEndpoint::create(
                        &mut fbb,
                        &wire::ShardEndpointArgs { shard: s as u16, port: *port },
                    )
                })
                .collect();
            let shards = fbb.create_vector(&shards);
            wire::BrokerMetadata::create(
                &mut fbb,
                &wire::BrokerMetadataArgs {
                    broker_id: row.id,
                    host: Some(host),
                    port: row.port,
                    shards: Some(shards),
                },
            )
        })
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let controller_id = match &cluster {
        None => ctx.config.broker_id,
        Some(md) => md.controller.map_or(-1, |c| c.broker_id),
    };
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
        let parts: Vec<_> = (0..meta.partitions)
            .map(|p| {
                let row = match &cluster {
                    None => partition_alone(ctx, name, p),
                    Some(md) => partition_in(md, name, p),
                };
                let replicas = fbb.create_vector(&row.replicas);
                let isr = fbb.create_vector(&row.isr);
                wire::PartitionMetadata::create(
                    &mut fbb,
                    &wire::PartitionMetadataArgs {
                        partition: p,
                        error: row.error,
                        leader_broker: row.leader,
                        leader_shard: row.shard,
                        leader_port: row.port,
                        leader_epoch: row.leader_epoch,
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
        &wire::MetadataResponseArgs { brokers: Some(brokers), controller_id, topics: Some(metas) },
    );
    response(&mut fbb, corr, ApiKey::Metadata, wire::ResponseBody::MetadataResponse, body, 0)
}
