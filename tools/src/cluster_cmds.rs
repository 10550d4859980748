//! `shardlog cluster status`: read from ZooKeeper (the cluster's record of
//! membership, controller and partition states).

use crate::{ClusterCommand, OutputFormat};
use anyhow::Context;
use shardlog_broker::cluster::{status, zk};
use std::time::Duration;

/// Session timeout of the status reader's short-lived session.
const SESSION: Duration = Duration::from_secs(6);

pub async fn cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status { zookeeper, output } => {
            let connect = tokio::time::timeout(SESSION * 2, zk::connect(&zookeeper, SESSION))
                .await
                .with_context(|| format!("cannot reach ZooKeeper at {zookeeper}"))?
                .with_context(|| format!("cannot reach ZooKeeper at {zookeeper}"))?;
            let s = status::read_status(&connect).await.context("cannot read the cluster state")?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string(&s)?),
                OutputFormat::Text => print_text(&s),
            }
            Ok(())
        }
    }
}

fn print_text(s: &status::ClusterStatus) {
    println!("cluster id: {}", s.cluster_id.as_deref().unwrap_or("(none)"));
    match s.controller {
        Some(c) => println!("controller: broker {} (epoch {})", c.broker_id, c.epoch),
        None => println!("controller: none"),
    }
    println!("brokers: {}, topics: {}, partitions: {}", s.brokers.len(), s.topics, s.partitions);
    println!(
        "{:>6}  {:<24}  {:>6}  {:<20}  {:>10}  {:>7}  rack",
        "id", "address", "shards", "shard ports", "partitions", "leading"
    );
    for b in &s.brokers {
        let r = &b.registration;
        let ports: Vec<String> = r.shard_ports.iter().map(u16::to_string).collect();
        println!(
            "{:>6}  {:<24}  {:>6}  {:<20}  {:>10}  {:>7}  {}",
            r.id,
            format!("{}:{}", r.host, r.port),
            r.shards,
            ports.join(","),
            b.partitions,
            b.leading,
            r.rack.as_deref().unwrap_or("-")
        );
    }
    if s.offline_partitions.is_empty() {
        println!("offline partitions: none");
    } else {
        println!("offline partitions: {}", s.offline_partitions.len());
        for p in &s.offline_partitions {
            println!("  {}/{} replicas {:?} ({:?})", p.topic, p.partition, p.replicas, p.state);
        }
    }
}
