//! `shardlog cluster status`, `elect-leaders`, `reassign` and `rebalance`:
//! straight to ZooKeeper (the cluster's record of membership, controller
//! and partition states; requests for the controller).

use crate::{ClusterCommand, OutputFormat, ReassignWait};
use anyhow::Context;
use shardlog_broker::cluster::reassign::{self, PartitionMove};
use shardlog_broker::cluster::{controller, status, zk};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Session timeout of the status reader's short-lived session.
const SESSION: Duration = Duration::from_secs(6);

/// How long `elect-leaders` waits for the controller to answer.
const ELECTION_WAIT: Duration = Duration::from_secs(30);

async fn connect(zookeeper: &str) -> anyhow::Result<zk::Client> {
    tokio::time::timeout(SESSION * 2, zk::connect(zookeeper, SESSION))
        .await
        .with_context(|| format!("cannot reach ZooKeeper at {zookeeper}"))?
        .with_context(|| format!("cannot reach ZooKeeper at {zookeeper}"))
}

pub async fn cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status { zookeeper, output } => {
            let client = connect(&zookeeper).await?;
            let s = status::read_status(&client).await.context("cannot read the cluster state")?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string(&s)?),
                OutputFormat::Text => print_text(&s),
            }
            Ok(())
        }
        ClusterCommand::ElectLeaders { zookeeper, topic, partition } => {
            elect_leaders(&connect(&zookeeper).await?, topic, partition).await
        }
        ClusterCommand::Reassign { zookeeper, topic, partition, replicas, wait } => {
            let client = connect(&zookeeper).await?;
            let moves = vec![PartitionMove { topic, partition, replicas }];
            submit(&client, moves, wait).await
        }
        ClusterCommand::Rebalance { zookeeper, exclude, dry_run, wait } => {
            let client = connect(&zookeeper).await?;
            let (partitions, brokers) = cluster_layout(&client).await?;
            if let Some(b) = exclude.iter().find(|b| !brokers.contains(b)) {
                anyhow::bail!("--exclude-broker {b}: no such live broker (live: {brokers:?})");
            }
            let eligible: BTreeSet<i32> = brokers.iter().copied().filter(|b| !exclude.contains(b)).collect();
            let movable = partitions
                .into_iter()
                .filter(|((t, _), _)| t != shardlog_schema::types::OFFSETS_TOPIC)
                .collect();
            let plan = reassign::plan_rebalance(&movable, &eligible)?;
            if plan.is_empty() {
                println!("balanced: nothing to move");
                return Ok(());
            }
            println!("{} partition(s) to move:", plan.len());
            for m in &plan {
                println!(
                    "  {}-{}: {:?} -> {:?}",
                    m.topic,
                    m.partition,
                    movable[&(m.topic.clone(), m.partition)],
                    m.replicas
                );
            }
            if dry_run {
                return Ok(());
            }
            submit(&client, plan, wait).await
        }
    }
}

/// Every partition's replicas, and the live brokers not shutting down.
async fn cluster_layout(
    client: &zk::Client,
) -> anyhow::Result<(BTreeMap<(String, u32), Vec<i32>>, BTreeSet<i32>)> {
    let s = status::read_status(client).await.context("cannot read the cluster state")?;
    let brokers = s.brokers.iter().filter(|b| !b.shutting_down).map(|b| b.registration.id).collect();
    let partitions = status::read_partitions(client)
        .await
        .context("cannot read the partitions")?
        .into_iter()
        .map(|p| ((p.topic, p.partition), p.replicas))
        .collect();
    Ok((partitions, brokers))
}

/// Validates and leaves a reassignment for the controller, then (unless
/// `--no-wait`) prints its progress until it is done.
async fn submit(client: &zk::Client, moves: Vec<PartitionMove>, wait: ReassignWait) -> anyhow::Result<()> {
    let (partitions, brokers) = cluster_layout(client).await?;
    let moves = match reassign::validate(moves, &partitions, &brokers) {
        Err(reassign::ReassignError::Empty) => {
            println!("nothing to move: the replicas are already as asked");
            return Ok(());
        }
        other => other?,
    };
    reassign::request(client, &moves).await?;
    println!("reassignment of {} partition(s) handed to the controller", moves.len());
    if wait.no_wait {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(wait.timeout_s);
    let mut last = String::new();
    loop {
        let (stat, watcher) = client.check_and_watch_stat(zk::paths::REASSIGNMENT).await?;
        if stat.is_none() {
            break;
        }
        let now = status::read_status(client).await.context("cannot read the cluster state")?;
        let line: Vec<String> =
            now.reassignments.iter().map(|r| format!("{}-{}: {}", r.topic, r.partition, r.step)).collect();
        let line = line.join("; ");
        if line != last && !line.is_empty() {
            println!("  {line}");
            last = line;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            anyhow::bail!("not done within {} s; it goes on (see `shardlog cluster status`)", wait.timeout_s);
        }
        // Progress shows in the partition states, not in the request: look
        // again at least every second.
        let _ = tokio::time::timeout(left.min(Duration::from_secs(1)), watcher.changed()).await;
    }
    println!("reassignment done");
    Ok(())
}

/// Leaves the request for the controller, waits until it is answered, then
/// says where each partition asked for stands.
async fn elect_leaders(
    client: &zk::Client,
    topic: Option<String>,
    partition: Option<u32>,
) -> anyhow::Result<()> {
    let all = status::read_partitions(client).await.context("cannot read the partitions")?;
    let asked: Vec<&status::PartitionStatus> = all
        .iter()
        .filter(|p| {
            topic.as_ref().is_none_or(|t| *t == p.topic) && partition.is_none_or(|q| q == p.partition)
        })
        .collect();
    if asked.is_empty() {
        match (&topic, partition) {
            (Some(t), Some(p)) => anyhow::bail!("partition {t}-{p} does not exist"),
            (Some(t), None) => anyhow::bail!("topic `{t}` does not exist"),
            _ => anyhow::bail!("the cluster has no partitions"),
        }
    }
    let request = controller::PreferredElectionRequest {
        partitions: match &topic {
            None => Vec::new(),
            Some(_) => asked.iter().map(|p| (p.topic.clone(), p.partition)).collect(),
        },
    };
    match controller::request_preferred_election(client, &request).await {
        Ok(()) => {}
        Err(controller::ControllerError::Conflict { .. }) => {
            anyhow::bail!("an earlier preferred-leader election is still pending: try again shortly")
        }
        Err(e) => return Err(e).context("cannot leave the election request"),
    }
    let deadline = Instant::now() + ELECTION_WAIT;
    loop {
        let (stat, watcher) = client.check_and_watch_stat(zk::paths::PREFERRED_ELECTION).await?;
        if stat.is_none() {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, watcher.changed()).await.is_err() {
            anyhow::bail!(
                "no controller answered within {} s (the request stays for the next controller)",
                ELECTION_WAIT.as_secs()
            );
        }
    }
    let now = status::read_partitions(client).await.context("cannot read the partitions")?;
    let (mut preferred, mut others) = (0, Vec::new());
    for p in now.iter().filter(|p| asked.iter().any(|a| a.topic == p.topic && a.partition == p.partition)) {
        if p.replicas.first() == Some(&p.leader) {
            preferred += 1;
        } else {
            others.push(p);
        }
    }
    println!("{preferred} of {} partition(s) led by their preferred replica", preferred + others.len());
    for p in others {
        let why = if p.isr.contains(&p.replicas[0]) { "not live" } else { "not in sync" };
        println!(
            "  {}-{}: leader {} (epoch {}), preferred replica {} is {why}",
            p.topic, p.partition, p.leader, p.leader_epoch, p.replicas[0]
        );
    }
    Ok(())
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
    let stopping: Vec<String> =
        s.brokers.iter().filter(|b| b.shutting_down).map(|b| b.registration.id.to_string()).collect();
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
    if !stopping.is_empty() {
        println!("in controlled shutdown: broker {}", stopping.join(", "));
    }
    if s.under_replicated_partitions.is_empty() {
        println!("under-replicated partitions: none");
    } else {
        println!("under-replicated partitions: {}", s.under_replicated_partitions.len());
        for p in &s.under_replicated_partitions {
            println!(
                "  {}/{} leader {} epoch {} replicas {:?} isr {:?}",
                p.topic, p.partition, p.leader, p.leader_epoch, p.replicas, p.isr
            );
        }
    }
    println!("partitions not led by their preferred replica: {}", s.not_led_by_preferred_replica);
    if !s.reassignments.is_empty() {
        println!("reassignment in progress: {} partition(s)", s.reassignments.len());
        for r in &s.reassignments {
            println!(
                "  {}/{} replicas {:?} -> {:?} isr {:?} leader {}: {}",
                r.topic, r.partition, r.replicas, r.target, r.isr, r.leader, r.step
            );
        }
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
