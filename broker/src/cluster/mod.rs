//! Cluster membership and the controller (issue 11).
//!
//! [`Membership`] is what the broker knows about the cluster: which brokers
//! are alive, who the controller is and with which epoch. Two backends:
//! [`StaticMembership`] (one broker, no ZooKeeper: the default and today's
//! behaviour) and [`zk::ZkMembership`] (ZooKeeper, through the
//! `zookeeper-client` crate on a control thread of its own with a small
//! tokio runtime, never on a shard executor).
//!
//! `placement` (which broker gets which partition) and `controller` (the
//! election, epoch fencing and the partition state machine) are the
//! controller's logic; `zk` holds the ZooKeeper layout and the session loop.
//! The layout (all under `/shardlog`, after an optional chroot):
//!
//! | path | kind | content |
//! |---|---|---|
//! | `/shardlog/cluster/id` | persistent | the cluster id, created once |
//! | `/shardlog/brokers/ids/<id>` | ephemeral | [`BrokerRegistration`] JSON |
//! | `/shardlog/controller` | ephemeral | [`ControllerInfo`] JSON |
//! | `/shardlog/controller_epoch` | persistent | the last controller epoch, decimal |
//! | `/shardlog/topics/<topic>` | persistent | [`controller::TopicAssignment`] JSON |
//! | `/shardlog/topics/<topic>/partitions/<p>/state` | persistent | [`controller::PartitionStateZnode`] JSON |
//! | `/shardlog/admin/create_topics/<topic>` | persistent | [`controller::CreateTopicRequest`] JSON, for the controller |
//! | `/shardlog/admin/delete_topics/<topic>` | persistent | empty: a deletion for the controller |
//! | `/shardlog/admin/shutting_down/<id>` | ephemeral | empty: a broker in controlled shutdown |
//! | `/shardlog/admin/preferred_election` | persistent | [`controller::PreferredElectionRequest`] JSON |
//! | `/shardlog/admin/reassign_partitions` | persistent | [`reassign::ReassignmentRequest`] JSON (see `reassign`) |
//!
//! `metadata` is the snapshot brokers serve from (published by the control
//! thread to every shard); `request` is what shards ask of the control
//! thread (topic creation and deletion).

pub mod controller;
pub mod metadata;
pub mod placement;
pub mod reassign;
pub mod request;
pub mod status;
pub mod zk;

pub use request::ClusterLink;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `--zookeeper` and friends: present means cluster mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Kafka's `zookeeper.connect`: `HOST:PORT[,HOST:PORT...][/chroot]`.
    pub zookeeper: String,
    /// `zookeeper.session.timeout.ms` (the server clamps it to 2 to 20 ticks).
    pub session_timeout: Duration,
    /// `broker.rack`, for rack-aware placement.
    pub rack: Option<String>,
    /// `replica.lag.time.max.ms`: a follower not caught up for this long
    /// leaves the ISR.
    pub replica_lag_time_max: Duration,
    /// How the controller elects leaders (when this broker is controller).
    pub election: controller::ElectionPolicy,
    /// Controlled shutdown (Kafka's `controlled.shutdown.enable`): at a
    /// clean stop the broker first has the controller move its leaderships
    /// to other in-sync replicas, waiting this long at most; zero stops
    /// without it (partitions it leads wait for its session to end).
    pub controlled_shutdown_timeout: Duration,
}

/// Default `--controlled-shutdown-timeout-ms`.
pub const CONTROLLED_SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Default `--zookeeper-session-timeout-ms`, as Kafka's 18 s.
pub const SESSION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(18);

/// What a broker registers (`/shardlog/brokers/ids/<id>`, ephemeral).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub id: i32,
    pub host: String,
    /// The public port (every shard accepts there).
    pub port: u16,
    pub shards: usize,
    /// Shard i's own port.
    pub shard_ports: Vec<u16>,
    /// The broker's software version.
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// The Kafka nodes this broker advertises (`--kafka-listen`): one port
    /// per shard, or the one shared port (`--kafka-advertise shared`);
    /// empty without a Kafka listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka_ports: Vec<u16>,
}

impl BrokerRegistration {
    /// The Kafka node (id, port) serving what `shard` of this broker owns.
    #[must_use]
    pub fn kafka_node(&self, shard: u16) -> Option<(i32, u16)> {
        match self.kafka_ports.as_slice() {
            [] => None,
            [shared] => Some((crate::kafka::node_id(self.id, 0), *shared)),
            ports => ports.get(usize::from(shard)).map(|p| (crate::kafka::node_id(self.id, shard), *p)),
        }
    }
}

/// Who the controller is (`/shardlog/controller`, ephemeral).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerInfo {
    pub broker_id: i32,
    pub epoch: i32,
}

/// A broker's picture of the cluster. Control plane only: it is published
/// by the membership backend and read by start-up, tests and status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub cluster_id: Option<String>,
    /// Live (registered) brokers by id.
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    pub controller: Option<ControllerInfo>,
}

/// Why cluster membership failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Another live broker holds the id (its ephemeral znode exists).
    #[error("broker id {id} is already registered in ZooKeeper (by {holder}); give this broker another --broker-id or stop the other one")]
    DuplicateBrokerId { id: i32, holder: String },
    #[error("invalid --zookeeper `{0}`: expected HOST:PORT[,HOST:PORT...][/chroot]")]
    ConnectString(String),
    #[error("ZooKeeper: {0}")]
    ZooKeeper(#[from] zookeeper_client::Error),
    #[error("cannot start the ZooKeeper control thread: {0}")]
    Thread(String),
    #[error("the ZooKeeper control thread stopped during start-up")]
    Stopped,
}

/// The broker's view of cluster membership, behind which backend it uses.
pub trait Membership: Send {
    /// This broker's id.
    fn broker_id(&self) -> i32;
    /// The latest picture of the cluster.
    fn view(&self) -> ClusterView;
    /// Whether this broker is the controller now.
    fn is_controller(&self) -> bool {
        self.view().controller.is_some_and(|c| c.broker_id == self.broker_id())
    }
    /// The shards' handle on the cluster's metadata and controller; `None`
    /// for a broker alone (its shards keep `topics.json`).
    fn link(&self) -> Option<ClusterLink> {
        None
    }
    /// Controlled shutdown, before the shards stop: marks this broker as
    /// shutting down, so that the controller moves every leadership it
    /// holds to another in-sync replica (and takes it out of every ISR),
    /// and waits until the metadata shows it leads nothing, `timeout` at
    /// most. Alone: nothing to do.
    fn controlled_shutdown(&self, _timeout: Duration) -> Result<(), String> {
        Ok(())
    }
    /// Leaves the cluster (closes the session: ephemerals go at once).
    fn shutdown(self: Box<Self>);
}

/// One broker, no ZooKeeper: it is the whole cluster and its own controller
/// (epoch 0). Today's behaviour.
pub struct StaticMembership {
    view: ClusterView,
}

impl StaticMembership {
    #[must_use]
    pub fn new(me: BrokerRegistration) -> Self {
        let id = me.id;
        let view = ClusterView {
            cluster_id: None,
            brokers: BTreeMap::from([(id, me)]),
            controller: Some(ControllerInfo { broker_id: id, epoch: 0 }),
        };
        StaticMembership { view }
    }
}

impl Membership for StaticMembership {
    fn broker_id(&self) -> i32 {
        self.view.controller.map_or(0, |c| c.broker_id)
    }
    fn view(&self) -> ClusterView {
        self.view.clone()
    }
    fn shutdown(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_membership_is_its_own_controller() {
        let me = BrokerRegistration {
            id: 7,
            host: "h".into(),
            port: 1,
            shards: 1,
            shard_ports: vec![2],
            version: "v".into(),
            rack: None,
            kafka_ports: vec![],
        };
        let m: Box<dyn Membership> = Box::new(StaticMembership::new(me.clone()));
        assert_eq!(m.broker_id(), 7);
        assert!(m.is_controller());
        assert_eq!(m.view().brokers.get(&7), Some(&me));
        let json = serde_json::to_string(&me).expect("json");
        assert!(!json.contains("rack"), "{json}");
        assert_eq!(serde_json::from_str::<BrokerRegistration>(&json).expect("back"), me);
    }
}
