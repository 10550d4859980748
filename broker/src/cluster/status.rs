//! What `shardlog cluster status` shows, read straight from ZooKeeper:
//! cluster id, controller and epoch, live brokers with their addresses,
//! shards and partition counts, and the partitions without a live leader.

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
}

#[derive(Debug, Clone, Serialize)]
pub struct BrokerStatus {
    #[serde(flatten)]
    pub registration: BrokerRegistration,
    /// Partitions placed on this broker.
    pub partitions: usize,
    /// Partitions whose state names it leader.
    pub leading: usize,
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
                brokers.insert(n, BrokerStatus { registration, partitions: 0, leading: 0 });
            }
            Err(zkc::Error::NoNode) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let topics = absent_is_empty(client.list_children(paths::TOPICS).await)?;
    let (mut partitions, mut offline_partitions) = (0, Vec::new());
    for topic in &topics {
        let assignment = controller::read_topic(client, topic).await?;
        for (p, replicas) in &assignment.partitions {
            let Ok(p) = p.parse::<u32>() else { continue };
            partitions += 1;
            for r in replicas {
                if let Some(b) = brokers.get_mut(r) {
                    b.partitions += 1;
                }
            }
            let (state, _) = controller::read_partition_state(client, topic, p).await?;
            match brokers.get_mut(&state.leader) {
                Some(b) if state.state == PartitionState::Online => b.leading += 1,
                _ => offline_partitions.push(OfflinePartition {
                    topic: topic.clone(),
                    partition: p,
                    replicas: replicas.clone(),
                    state: state.state,
                }),
            }
        }
    }
    Ok(ClusterStatus {
        cluster_id,
        controller,
        brokers: brokers.into_values().collect(),
        topics: topics.len(),
        partitions,
        offline_partitions,
    })
}
