//! The cluster's metadata as brokers serve it: live brokers, controller,
//! and every topic with each partition's replicas, state, leader and
//! leader epoch.
//!
//! The control thread reads it from ZooKeeper (`read_topics`, after every
//! change under `/shardlog/topics`, seen through one persistent recursive
//! watch, and after every membership change) and publishes it through a
//! `tokio::sync::watch` channel. Every shard holds a receiver: a task per
//! shard applies each new snapshot (opens the partitions placed on this
//! broker that it owns, removes deleted topics) and routes requests by it.
//! Brokers learn from ZooKeeper, not from controller RPCs: with one replica
//! per partition every decision the controller makes is in ZooKeeper, and
//! watches deliver it to every broker in one round trip, with no
//! controller-to-broker protocol to version (followers fetch from leaders,
//! but who leads and who is in sync is only ever read from here). Snapshots are immutable (`Arc`):
//! a shard swaps its pointer, nothing is shared mutably.

use super::controller::{self, ControllerError, PartitionState};
use super::{BrokerRegistration, ControllerInfo};
use shardlog_schema::types::shard_for;
use shardlog_schema::PartitionId;
use std::collections::BTreeMap;
use zookeeper_client as zkc;

/// One partition of a topic, as the controller last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub replicas: Vec<i32>,
    pub state: PartitionState,
    /// -1: no live leader.
    pub leader: i32,
    pub leader_epoch: i32,
    /// The in-sync replicas, leader included.
    pub isr: Vec<i32>,
    /// The state znode's version (a leader's ISR change is checked against it).
    pub state_version: i32,
}

/// A topic of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTopic {
    /// Settings overridden at creation (Kafka names); each broker applies
    /// them over its own defaults.
    pub config: BTreeMap<String, String>,
    pub partitions: Vec<PartitionInfo>,
}

/// A snapshot of the cluster (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMetadata {
    pub cluster_id: Option<String>,
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    pub controller: Option<ControllerInfo>,
    pub topics: BTreeMap<String, ClusterTopic>,
    /// Brokers in controlled shutdown: registered, but leading nothing and
    /// in no ISR; their followers stop fetching.
    pub shutting_down: std::collections::BTreeSet<i32>,
}

/// Where a partition is served, as a broker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    /// No such topic or partition.
    Unknown,
    /// Its leader is not live (or not yet chosen).
    Offline { replicas: &'a [i32] },
    /// Led by `leader`, whose registration is `broker` (`None`: the leader
    /// named in the state has no registration, which happens only in the
    /// moment between its session ending and the controller's reaction).
    Leader { leader: i32, leader_epoch: i32, broker: Option<&'a BrokerRegistration> },
}

impl ClusterMetadata {
    /// Where `topic`/`partition` is served.
    #[must_use]
    pub fn route(&self, topic: &str, partition: u32) -> Route<'_> {
        let Some(p) = self.topics.get(topic).and_then(|t| t.partitions.get(partition as usize)) else {
            return Route::Unknown;
        };
        if p.state != PartitionState::Online || p.leader < 0 {
            return Route::Offline { replicas: &p.replicas };
        }
        Route::Leader { leader: p.leader, leader_epoch: p.leader_epoch, broker: self.brokers.get(&p.leader) }
    }

    /// The leader's shard for a partition and that shard's port (from the
    /// leader's registration: its shard count decides the shard).
    #[must_use]
    pub fn leader_endpoint(broker: &BrokerRegistration, topic: &str, partition: u32) -> (u16, u16) {
        let shards = u16::try_from(broker.shards.max(1)).unwrap_or(u16::MAX);
        let shard = shard_for(topic, PartitionId(partition), shards).0;
        let port = broker.shard_ports.get(shard as usize).copied().unwrap_or(broker.port);
        (shard, port)
    }

    /// The partitions of `topic` placed on broker `id`.
    pub fn hosted(&self, topic: &str, id: i32) -> impl Iterator<Item = u32> + '_ {
        self.topics.get(topic).into_iter().flat_map(move |t| {
            t.partitions
                .iter()
                .enumerate()
                .filter(move |(_, p)| p.replicas.contains(&id))
                .map(|(i, _)| i as u32)
        })
    }
}

/// Reads every topic's assignment and partition states (no watches: the
/// caller holds a persistent recursive watch on `/shardlog/topics`; the
/// reads are pipelined, `controller::read_all`).
pub async fn read_topics(client: &zkc::Client) -> Result<BTreeMap<String, ClusterTopic>, ControllerError> {
    let mut topics = BTreeMap::new();
    for t in controller::read_all(client).await? {
        let partitions = t
            .states
            .iter()
            .enumerate()
            .map(|(p, (s, version))| {
                let replicas = t.replicas(p as u32).to_vec();
                PartitionInfo {
                    isr: if s.isr.is_empty() { replicas.clone() } else { s.isr.clone() },
                    replicas,
                    state: s.state,
                    leader: s.leader,
                    leader_epoch: s.leader_epoch,
                    state_version: *version,
                }
            })
            .collect();
        topics.insert(t.name, ClusterTopic { config: t.assignment.config, partitions });
    }
    Ok(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(id: i32, shards: usize) -> BrokerRegistration {
        BrokerRegistration {
            id,
            host: format!("h{id}"),
            port: 9000,
            shards,
            shard_ports: (0..shards as u16).map(|s| 9001 + s).collect(),
            version: "v".into(),
            rack: None,
            kafka_ports: vec![],
        }
    }

    #[test]
    fn routes_by_partition_state() {
        let online = PartitionInfo {
            replicas: vec![2],
            isr: vec![2],
            state: PartitionState::Online,
            leader: 2,
            leader_epoch: 3,
            state_version: 0,
        };
        let offline = PartitionInfo {
            replicas: vec![3],
            isr: vec![3],
            state: PartitionState::Offline,
            leader: -1,
            leader_epoch: 1,
            state_version: 0,
        };
        let md = ClusterMetadata {
            brokers: BTreeMap::from([(2, broker(2, 4))]),
            topics: BTreeMap::from([(
                "t".to_string(),
                ClusterTopic { config: BTreeMap::new(), partitions: vec![online, offline] },
            )]),
            ..ClusterMetadata::default()
        };
        match md.route("t", 0) {
            Route::Leader { leader: 2, leader_epoch: 3, broker: Some(b) } => {
                let (shard, port) = ClusterMetadata::leader_endpoint(b, "t", 0);
                assert_eq!(shard, shard_for("t", PartitionId(0), 4).0);
                assert_eq!(port, 9001 + shard);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(md.route("t", 1), Route::Offline { replicas: &[3] });
        assert_eq!(md.route("t", 2), Route::Unknown);
        assert_eq!(md.route("u", 0), Route::Unknown);
        assert_eq!(md.hosted("t", 3).collect::<Vec<_>>(), vec![1]);
        assert_eq!(md.hosted("t", 9).count(), 0);
    }
}
