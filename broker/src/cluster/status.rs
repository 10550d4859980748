//! What `shardlog cluster status` shows, read straight from ZooKeeper:
//! cluster id, controller and epoch, live brokers with their addresses,
//! shards and partition counts, the partitions without a live leader, the
//! under-replicated ones and a reassignment in progress.

use super::controller::{self, ControllerError, PartitionState};
use super::zk::paths;
use super::{BrokerRegistration, ControllerInfo};
use serde::Serialize;
use std::collections::BTreeMap;
use zookeeper_client as zkc;

#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub cluster_id: Option<String>,
    pub controller: Option<ControllerInfo>,
    pub brokers: Vec<BrokerStatus>,
    pub topics: usize,
    pub partitions: usize,
    pub offline_partitions: Vec<OfflinePartition>,
    /// Online partitions whose ISR is smaller than their replica set.
    pub under_replicated_partitions: Vec<PartitionStatus>,
    /// Online partitions led by a replica other than their first (the
    /// preferred one): `cluster elect-leaders` moves them back.
    pub not_led_by_preferred_replica: usize,
    /// The partitions of a reassignment in progress, with their next step.
    pub reassignments: Vec<ReassignmentStatus>,
}

/// One partition being reassigned.
#[derive(Debug, Clone, Serialize)]
pub struct ReassignmentStatus {
    pub topic: String,
    pub partition: u32,
    pub target: Vec<i32>,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader: i32,
    /// What the controller does next (`reassign::Step`, in words).
    pub step: String,
}

/// One partition as ZooKeeper has it.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionStatus {
    pub topic: String,
    pub partition: u32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader: i32,
    pub leader_epoch: i32,
    pub state: PartitionState,
}

#[derive(Debug, Clone, Serialize)]
pub struct BrokerStatus {
    #[serde(flatten)]
    pub registration: BrokerRegistration,
    /// Partitions placed on this broker.
    pub partitions: usize,
    /// Partitions whose state names it leader.
    pub leading: usize,
    /// In controlled shutdown (leadership moving away).
    pub shutting_down: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct OfflinePartition {
    pub topic: String,
    pub partition: u32,
    pub replicas: Vec<i32>,
    pub state: PartitionState,
}

fn absent_is_empty<T: Default>(r: Result<T, zkc::Error>) -> Result<T, zkc::Error> {
    match r {
        Err(zkc::Error::NoNode) => Ok(T::default()),
        other => other,
    }
}

/// Reads the whole status (no watches).
pub async fn read_status(client: &zkc::Client) -> Result<ClusterStatus, ControllerError> {
    let cluster_id = match client.get_data(paths::CLUSTER_ID).await {
        Ok((id, _)) => Some(String::from_utf8_lossy(&id).into_owned()),
        Err(zkc::Error::NoNode) => None,
        Err(e) => return Err(e.into()),
    };
    let controller = controller::read_controller(client).await?;
    let mut brokers = BTreeMap::new();
    for id in absent_is_empty(client.list_children(paths::BROKER_IDS).await)? {
        let Ok(n) = id.parse::<i32>() else { continue };
        let path = paths::broker(n);
        match client.get_data(&path).await {
            Ok((data, _)) => {
                let registration: BrokerRegistration =
                    serde_json::from_slice(&data).map_err(|source| ControllerError::Json { path, source })?;
                brokers.insert(
                    n,
                    BrokerStatus { registration, partitions: 0, leading: 0, shutting_down: false },
                );
            }
            Err(zkc::Error::NoNode) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let all = read_partitions(client).await?;
    let topics: std::collections::BTreeSet<&str> = all.iter().map(|p| p.topic.as_str()).collect();
    let (mut offline_partitions, mut under_replicated, mut not_preferred) = (Vec::new(), Vec::new(), 0);
    for p in &all {
        for r in &p.replicas {
            if let Some(b) = brokers.get_mut(r) {
                b.partitions += 1;
            }
        }
        match brokers.get_mut(&p.leader) {
            Some(b) if p.state == PartitionState::Online => {
                b.leading += 1;
                if p.isr.len() < p.replicas.len() {
                    under_replicated.push(p.clone());
                }
                if p.replicas.first() != Some(&p.leader) {
                    not_preferred += 1;
                }
            }
            _ => offline_partitions.push(OfflinePartition {
                topic: p.topic.clone(),
                partition: p.partition,
                replicas: p.replicas.clone(),
                state: p.state,
            }),
        }
    }
    for id in absent_is_empty(client.list_children(paths::SHUTTING_DOWN).await)? {
        if let Some(b) = id.parse::<i32>().ok().and_then(|n| brokers.get_mut(&n)) {
            b.shutting_down = true;
        }
    }
    let live: std::collections::BTreeSet<i32> =
        brokers.values().filter(|b| !b.shutting_down).map(|b| b.registration.id).collect();
    let reassignments = super::reassign::progress(client, &live)
        .await?
        .into_iter()
        .map(|(m, replicas, state, step)| ReassignmentStatus {
            topic: m.topic,
            partition: m.partition,
            target: m.replicas,
            isr: if state.isr.is_empty() { replicas.clone() } else { state.isr },
            replicas,
            leader: state.leader,
            step: step.to_string(),
        })
        .collect();
    Ok(ClusterStatus {
        cluster_id,
        controller,
        brokers: brokers.into_values().collect(),
        topics: topics.len(),
        partitions: all.len(),
        offline_partitions,
        under_replicated_partitions: under_replicated,
        not_led_by_preferred_replica: not_preferred,
        reassignments,
    })
}

/// Every partition's assignment and state, by topic and partition.
pub async fn read_partitions(client: &zkc::Client) -> Result<Vec<PartitionStatus>, ControllerError> {
    let mut out = Vec::new();
    for topic in absent_is_empty(client.list_children(paths::TOPICS).await)? {
        let assignment = controller::read_topic(client, &topic).await?;
        let mut parts: Vec<(u32, &Vec<i32>)> =
            assignment.partitions.iter().filter_map(|(p, r)| Some((p.parse().ok()?, r))).collect();
        parts.sort_unstable();
        for (p, replicas) in parts {
            let (state, _) = controller::read_partition_state(client, &topic, p).await?;
            out.push(PartitionStatus {
                topic: topic.clone(),
                partition: p,
                replicas: replicas.clone(),
                isr: if state.isr.is_empty() { replicas.clone() } else { state.isr.clone() },
                leader: state.leader,
                leader_epoch: state.leader_epoch,
                state: state.state,
            });
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(out)
}
