//! The controller: election through the ephemeral `/shardlog/controller`,
//! the epoch in `/shardlog/controller_epoch`, fenced writes, and the
//! partition state machine (Kafka's partition states).
//!
//! **Election**: one multi-op creates `/shardlog/controller` (ephemeral,
//! `{broker_id, epoch}`) and sets `/shardlog/controller_epoch` to the epoch
//! read plus one, with that read's znode version. Either both happen or
//! neither: `NodeExists` means another broker is controller; a version
//! mismatch means another election won in between (read again).
//!
//! **Fencing**: every controller write is a multi-op whose first operation
//! checks that `/shardlog/controller_epoch` still has the version this
//! controller's election left on it. A controller that lost its session
//! (or its znode) and goes on writing finds the version bumped by its
//! successor's election, and the whole multi-op is rejected
//! ([`ControllerError::Fenced`]). Partition state znodes are moreover
//! changed only with the version last read (a conflicting writer is
//! rejected: [`ControllerError::Conflict`]).
//!
//! **Partition states** ([`PartitionState`]): `NonExistent → New` (topic
//! created, znodes written), `New → Online | Offline` (its replica is live
//! or not), `Online → Offline` (its broker left), `Offline → Online` (it
//! came back; the leader epoch is bumped), `Online → Online` (a new leader,
//! elected from the ISR, or the ISR shrunk), `New | Offline → NonExistent`
//! (deletion). Every change goes through [`check_transition`];
//! [`next_state`] decides it from the replica list, the ISR and the live
//! brokers, purely (Kafka's election rules, see there). The ISR is also
//! written by each partition's leader (`replica`, `AlterIsr`): both
//! writers go through the znode's version, so neither overwrites a state
//! it has not read.

use super::{zk::paths, ControllerInfo};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use zookeeper_client as zkc;

mod admin;
pub use admin::*;

/// Kafka's partition states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    NonExistent,
    New,
    Online,
    Offline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid partition state transition {from:?} -> {to:?}")]
pub struct InvalidTransition {
    pub from: PartitionState,
    pub to: PartitionState,
}

/// The state machine: which transitions are allowed.
pub fn check_transition(from: PartitionState, to: PartitionState) -> Result<(), InvalidTransition> {
    use PartitionState::*;
    let ok = matches!(
        (from, to),
        (NonExistent, New)
            | (New, Online | Offline | NonExistent)
            | (Online, Online | Offline)
            | (Offline, Online | NonExistent)
    );
    if ok {
        Ok(())
    } else {
        Err(InvalidTransition { from, to })
    }
}

/// `/shardlog/topics/<t>/partitions/<p>/state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStateZnode {
    pub state: PartitionState,
    /// The leading broker, -1 when none is live.
    pub leader: i32,
    /// Bumped whenever a (new) leader takes the partition.
    pub leader_epoch: i32,
    /// The epoch of the controller that wrote this.
    pub controller_epoch: i32,
    /// The in-sync replicas (leader included). Written by the controller at
    /// creation and election, and by the leader as followers fall behind
    /// and catch up. Absent in znodes written before replication: read as
    /// the replica list.
    #[serde(default)]
    pub isr: Vec<i32>,
}

/// How the controller elects leaders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionPolicy {
    /// `unclean.leader.election.enable`: a live replica outside the ISR may
    /// lead when no ISR member is live (acknowledged records may be lost).
    pub unclean: bool,
    /// `auto.leader.rebalance.enable`: leadership goes back to the first
    /// (preferred) replica once it is live and in sync.
    pub preferred: bool,
}

impl Default for ElectionPolicy {
    fn default() -> Self {
        ElectionPolicy { unclean: false, preferred: true }
    }
}

/// `/shardlog/topics/<t>`: the replica list of each partition and the
/// topic's settings (Kafka names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicAssignment {
    pub version: u32,
    /// Partition number (as a string key, as Kafka writes it) → replicas.
    pub partitions: BTreeMap<String, Vec<i32>>,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

/// What the state of a partition with `replicas` should become, given the
/// live brokers; `None` when it stays as it is.
///
/// Kafka's rules: a live leader in the ISR keeps leading (unless the
/// preferred replica is live and in sync and `policy.preferred`), and dead
/// members leave the ISR; otherwise the first replica (in replica order)
/// that is live and in the ISR leads, with the leader epoch bumped; with
/// none, the partition is offline and keeps its ISR (so its last leader
/// can lead again when it returns), unless `policy.unclean` lets any live
/// replica lead.
#[must_use]
pub fn next_state(
    current: &PartitionStateZnode,
    replicas: &[i32],
    live: &BTreeSet<i32>,
    controller_epoch: i32,
    policy: ElectionPolicy,
) -> Option<PartitionStateZnode> {
    let isr: Vec<i32> = if current.isr.is_empty() { replicas.to_vec() } else { current.isr.clone() };
    let live_isr: Vec<i32> = isr.iter().copied().filter(|r| live.contains(r)).collect();
    let in_sync = |r: &i32| live_isr.contains(r);
    let preferred = replicas.first().copied().filter(|p| policy.preferred && in_sync(p));
    let keeps = current.state == PartitionState::Online && current.leader >= 0 && in_sync(&current.leader);
    let (state, leader, new_isr) = if keeps && preferred.is_none_or(|p| p == current.leader) {
        (PartitionState::Online, current.leader, live_isr)
    } else if let Some(l) = preferred.or_else(|| replicas.iter().copied().find(|r| in_sync(r))) {
        (PartitionState::Online, l, live_isr)
    } else if let Some(l) = replicas.iter().copied().find(|r| policy.unclean && live.contains(r)) {
        tracing::warn!(leader = l, ?isr, "unclean leader election: acknowledged records may be lost");
        (PartitionState::Online, l, vec![l])
    } else {
        (PartitionState::Offline, -1, isr.clone())
    };
    if current.state == state && current.leader == leader && current.isr == new_isr {
        return None;
    }
    check_transition(current.state, state).ok()?;
    let new_leader = leader >= 0 && (leader != current.leader || current.state != PartitionState::Online);
    let leader_epoch = if new_leader { current.leader_epoch + 1 } else { current.leader_epoch };
    Some(PartitionStateZnode { state, leader, leader_epoch, controller_epoch, isr: new_isr })
}

/// Why a controller operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A newer controller was elected: this one must stop writing.
    #[error("controller epoch {epoch} is stale: a newer controller was elected; write rejected")]
    Fenced { epoch: i32 },
    /// A znode changed since it was read (a version-checked write failed).
    #[error("{path} changed since it was read; write rejected")]
    Conflict { path: String },
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    #[error(transparent)]
    Placement(#[from] super::placement::PlacementError),
    #[error("bad JSON in {path}: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("ZooKeeper: {0}")]
    ZooKeeper(#[from] zkc::Error),
}

/// An elected controller's epoch and the version its election left on
/// `/shardlog/controller_epoch` (what every fenced write checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerEpoch {
    pub broker_id: i32,
    pub epoch: i32,
    pub epoch_zk_version: i32,
}

/// Tries to become controller. `Ok(None)`: another broker is.
pub async fn elect(client: &zkc::Client, broker_id: i32) -> Result<Option<ControllerEpoch>, ControllerError> {
    loop {
        let (data, stat) = client.get_data(paths::CONTROLLER_EPOCH).await?;
        let current: i32 = std::str::from_utf8(&data).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let epoch = current + 1;
        let info = serde_json::to_vec(&ControllerInfo { broker_id, epoch })
            .map_err(|source| ControllerError::Json { path: paths::CONTROLLER.into(), source })?;
        let ephemeral = zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all());
        let mut multi = client.new_multi_writer();
        multi.add_create(paths::CONTROLLER, &info, &ephemeral)?;
        multi.add_set_data(paths::CONTROLLER_EPOCH, epoch.to_string().as_bytes(), Some(stat.version))?;
        match multi.commit().await {
            Ok(results) => {
                let version = match results.get(1) {
                    Some(zkc::MultiWriteResult::SetData { stat }) => stat.version,
                    _ => stat.version + 1,
                };
                return Ok(Some(ControllerEpoch { broker_id, epoch, epoch_zk_version: version }));
            }
            Err(zkc::MultiWriteError::OperationFailed { index: 0, source: zkc::Error::NodeExists }) => {
                return Ok(None)
            }
            Err(zkc::MultiWriteError::OperationFailed { index: 1, source: zkc::Error::BadVersion }) => {
                continue
            }
            Err(e) => return Err(zkc::Error::from(e).into()),
        }
    }
}

/// Who the controller is now, if anyone.
pub async fn read_controller(client: &zkc::Client) -> Result<Option<ControllerInfo>, ControllerError> {
    match client.get_data(paths::CONTROLLER).await {
        Ok((data, _)) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|source| ControllerError::Json { path: paths::CONTROLLER.into(), source }),
        Err(zkc::Error::NoNode) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// One write of a fenced multi-op.
#[derive(Debug, Clone)]
pub enum Write {
    Create {
        path: String,
        data: Vec<u8>,
    },
    /// Version-checked: rejected when the znode changed since it was read.
    Set {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    /// Version-checked delete (-1: any version).
    Delete {
        path: String,
        version: i32,
    },
}

/// Commits `writes` together, only while `epoch` is the newest controller
/// epoch (the first operation checks its version).
pub async fn fenced_write(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    writes: &[Write],
) -> Result<(), ControllerError> {
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    let mut multi = client.new_multi_writer();
    multi.add_check_version(paths::CONTROLLER_EPOCH, epoch.epoch_zk_version)?;
    for w in writes {
        match w {
            Write::Create { path, data } => multi.add_create(path, data, &persistent)?,
            Write::Set { path, data, version } => multi.add_set_data(path, data, Some(*version))?,
            Write::Delete { path, version } => multi.add_delete(path, (*version >= 0).then_some(*version))?,
        }
    }
    match multi.commit().await {
        Ok(_) => Ok(()),
        Err(zkc::MultiWriteError::OperationFailed { index: 0, .. }) => {
            Err(ControllerError::Fenced { epoch: epoch.epoch })
        }
        Err(zkc::MultiWriteError::OperationFailed { index, source }) => {
            let path = match &writes[index - 1] {
                Write::Create { path, .. } | Write::Set { path, .. } | Write::Delete { path, .. } => {
                    path.clone()
                }
            };
            match source {
                zkc::Error::NodeExists | zkc::Error::BadVersion | zkc::Error::NoNode => {
                    Err(ControllerError::Conflict { path })
                }
                other => Err(other.into()),
            }
        }
        Err(e) => Err(zkc::Error::from(e).into()),
    }
}

/// `value` as the JSON of znode `path` (the path names a failure).
pub(super) fn json<T: Serialize>(path: &str, value: &T) -> Result<Vec<u8>, ControllerError> {
    serde_json::to_vec(value).map_err(|source| ControllerError::Json { path: path.into(), source })
}

/// Creates a topic: its assignment and each partition's state znode, in
/// state `New`, in one fenced multi-op. The caller then moves the
/// partitions on with [`reconcile`].
pub async fn create_topic(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    topic: &str,
    replicas: &[Vec<i32>],
    config: BTreeMap<String, String>,
) -> Result<(), ControllerError> {
    create_topic_with(client, epoch, topic, replicas, config, Vec::new()).await
}

/// [`create_topic`] plus `also` in the same fenced multi-op (the request
/// znode it answers, deleted with it).
async fn create_topic_with(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    topic: &str,
    replicas: &[Vec<i32>],
    config: BTreeMap<String, String>,
    also: Vec<Write>,
) -> Result<(), ControllerError> {
    let topic_path = paths::topic(topic);
    if client.check_stat(&topic_path).await?.is_some() {
        return Err(ControllerError::TopicExists(topic.into()));
    }
    let assignment = TopicAssignment {
        version: 1,
        partitions: replicas.iter().enumerate().map(|(p, r)| (p.to_string(), r.clone())).collect(),
        config,
    };
    let mut writes = vec![
        Write::Create { path: topic_path.clone(), data: json(&topic_path, &assignment)? },
        Write::Create { path: format!("{topic_path}/partitions"), data: Vec::new() },
    ];
    for (p, isr) in replicas.iter().enumerate() {
        let state = PartitionStateZnode {
            state: PartitionState::New,
            leader: -1,
            leader_epoch: 0,
            controller_epoch: epoch.epoch,
            isr: isr.clone(),
        };
        writes.push(Write::Create { path: format!("{topic_path}/partitions/{p}"), data: Vec::new() });
        let path = paths::partition_state(topic, p as u32);
        writes.push(Write::Create { data: json(&path, &state)?, path });
    }
    writes.extend(also);
    match fenced_write(client, epoch, &writes).await {
        Err(ControllerError::Conflict { path }) if path == topic_path => {
            Err(ControllerError::TopicExists(topic.into()))
        }
        other => other,
    }
}

/// A topic's assignment.
pub async fn read_topic(client: &zkc::Client, topic: &str) -> Result<TopicAssignment, ControllerError> {
    let path = paths::topic(topic);
    let (data, _) = client.get_data(&path).await?;
    serde_json::from_slice(&data).map_err(|source| ControllerError::Json { path, source })
}

/// A partition's state and its znode version.
pub async fn read_partition_state(
    client: &zkc::Client,
    topic: &str,
    partition: u32,
) -> Result<(PartitionStateZnode, i32), ControllerError> {
    let path = paths::partition_state(topic, partition);
    let (data, stat) = client.get_data(&path).await?;
    let state = serde_json::from_slice(&data).map_err(|source| ControllerError::Json { path, source })?;
    Ok((state, stat.version))
}

/// Every topic's assignment and each partition's state with its znode
/// version. The reads are pipelined (every request is sent before the first
/// answer is awaited), so this costs about one round trip per pass, not one
/// per znode. A topic deleted while it is read is left out.
pub async fn read_all(client: &zkc::Client) -> Result<Vec<TopicState>, ControllerError> {
    let names = match client.list_children(paths::TOPICS).await {
        Ok(t) => t,
        Err(zkc::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let asked: Vec<_> = names
        .into_iter()
        .map(|n| {
            let f = client.get_data(&paths::topic(&n));
            (n, f)
        })
        .collect();
    let mut assignments = Vec::with_capacity(asked.len());
    for (name, answer) in asked {
        let path = paths::topic(&name);
        match answer.await {
            Ok((data, _)) => {
                let a: TopicAssignment =
                    serde_json::from_slice(&data).map_err(|source| ControllerError::Json { path, source })?;
                assignments.push((name, a));
            }
            Err(zkc::Error::NoNode) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let asked: Vec<_> = assignments
        .into_iter()
        .map(|(name, a)| {
            let states: Vec<_> = (0..a.partitions.len() as u32)
                .map(|p| client.get_data(&paths::partition_state(&name, p)))
                .collect();
            (name, a, states)
        })
        .collect();
    let mut topics = Vec::with_capacity(asked.len());
    'topics: for (name, assignment, answers) in asked {
        let mut states = Vec::with_capacity(answers.len());
        for (p, answer) in answers.into_iter().enumerate() {
            match answer.await {
                Ok((data, stat)) => {
                    let path = paths::partition_state(&name, p as u32);
                    let s = serde_json::from_slice(&data)
                        .map_err(|source| ControllerError::Json { path, source })?;
                    states.push((s, stat.version));
                }
                Err(zkc::Error::NoNode) => continue 'topics,
                Err(e) => return Err(e.into()),
            }
        }
        topics.push(TopicState { name, assignment, states });
    }
    Ok(topics)
}

/// One topic as [`read_all`] reads it.
#[derive(Debug, Clone)]
pub struct TopicState {
    pub name: String,
    pub assignment: TopicAssignment,
    /// Partition `p`'s state and znode version at index `p`.
    pub states: Vec<(PartitionStateZnode, i32)>,
}

impl TopicState {
    /// Partition `p`'s replicas.
    #[must_use]
    pub fn replicas(&self, p: u32) -> &[i32] {
        self.assignment.partitions.get(&p.to_string()).map_or(&[], Vec::as_slice)
    }
}

/// State changes per fenced multi-op in [`reconcile`] (ZooKeeper's request
/// size limit, `jute.maxbuffer`, is 1 MiB; a state write is under 200 bytes).
const RECONCILE_WRITES_PER_COMMIT: usize = 1000;

/// Moves every partition of every topic to the state the live brokers give
/// it ([`next_state`]), each write fenced and version-checked. Returns how
/// many partitions changed.
pub async fn reconcile(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    live: &BTreeSet<i32>,
    policy: ElectionPolicy,
) -> Result<usize, ControllerError> {
    let mut changed = 0;
    let mut writes = Vec::new();
    for topic in read_all(client).await? {
        for (p, (current, version)) in topic.states.iter().enumerate() {
            let p = p as u32;
            if let Some(next) = next_state(current, topic.replicas(p), live, epoch.epoch, policy) {
                let path = paths::partition_state(&topic.name, p);
                let data = json(&path, &next)?;
                writes.push(Write::Set { path, data, version: *version });
                tracing::info!(topic = %topic.name, partition = p, from = ?current.state, to = ?next.state, leader = next.leader, leader_epoch = next.leader_epoch, isr = ?next.isr, "partition state changed");
                changed += 1;
            }
        }
    }
    // A few fenced multi-ops rather than one per partition: each is one
    // quorum commit (and one fsync on every ensemble member).
    for chunk in writes.chunks(RECONCILE_WRITES_PER_COMMIT) {
        fenced_write(client, epoch, chunk).await?;
    }
    Ok(changed)
}

/// How many partitions each broker leads now (for placement).
pub async fn leader_counts(client: &zkc::Client) -> Result<BTreeMap<i32, usize>, ControllerError> {
    let mut counts = BTreeMap::new();
    for topic in read_all(client).await? {
        for replicas in topic.assignment.partitions.values() {
            if let Some(first) = replicas.first() {
                *counts.entry(*first).or_insert(0) += 1;
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::PartitionState::*;
    use super::*;

    #[test]
    fn state_machine_allows_kafkas_transitions_only() {
        let all = [NonExistent, New, Online, Offline];
        let allowed: Vec<(PartitionState, PartitionState)> = all
            .iter()
            .flat_map(|&f| all.iter().map(move |&t| (f, t)))
            .filter(|&(f, t)| check_transition(f, t).is_ok())
            .collect();
        assert_eq!(
            allowed,
            vec![
                (NonExistent, New),
                (New, NonExistent),
                (New, Online),
                (New, Offline),
                (Online, Online),
                (Online, Offline),
                (Offline, NonExistent),
                (Offline, Online),
            ]
        );
    }

    fn znode(state: PartitionState, leader: i32, leader_epoch: i32, isr: &[i32]) -> PartitionStateZnode {
        PartitionStateZnode { state, leader, leader_epoch, controller_epoch: 1, isr: isr.to_vec() }
    }

    fn next(
        current: &PartitionStateZnode,
        replicas: &[i32],
        live: &[i32],
        policy: ElectionPolicy,
    ) -> Option<PartitionStateZnode> {
        next_state(current, replicas, &live.iter().copied().collect(), 1, policy)
    }

    #[test]
    fn next_state_follows_the_replicas_broker() {
        let p = ElectionPolicy::default();
        let new = znode(New, -1, 0, &[2]);
        let online = next(&new, &[2], &[1, 2], p).expect("goes online");
        assert_eq!(online, znode(Online, 2, 1, &[2]));
        assert_eq!(next(&online, &[2], &[1, 2], p), None, "nothing to do");
        let offline = next(&online, &[2], &[1], p).expect("goes offline");
        assert_eq!(offline, znode(Offline, -1, 1, &[2]), "keeps its last ISR");
        let back = next(&offline, &[2], &[1, 2], p).expect("back online");
        assert_eq!((back.state, back.leader, back.leader_epoch), (Online, 2, 2));
        let never_live = next(&new, &[9], &[1, 2], p).expect("offline from new");
        assert_eq!(never_live.state, Offline);
        // Written before replication: no ISR field, read as the replicas.
        let old: PartitionStateZnode =
            serde_json::from_str(r#"{"state":"online","leader":2,"leader_epoch":3,"controller_epoch":1}"#)
                .expect("old znode");
        assert_eq!(next(&old, &[2], &[2], p), Some(znode(Online, 2, 3, &[2])), "ISR written, same epoch");
    }

    #[test]
    fn elections_come_from_the_isr() {
        let p = ElectionPolicy::default();
        let online = znode(Online, 1, 4, &[1, 2, 3]);
        // A follower dies: it leaves the ISR, the leader and epoch stay.
        assert_eq!(next(&online, &[1, 2, 3], &[1, 2], p), Some(znode(Online, 1, 4, &[1, 2])));
        // The leader dies: the next replica in the ISR leads, epoch bumped.
        assert_eq!(next(&online, &[1, 2, 3], &[2, 3], p), Some(znode(Online, 2, 5, &[2, 3])));
        // Only a replica outside the ISR is live: offline (clean), or it
        // leads when unclean election is on.
        let shrunk = znode(Online, 1, 4, &[1]);
        assert_eq!(next(&shrunk, &[1, 2, 3], &[2, 3], p), Some(znode(Offline, -1, 4, &[1])));
        let unclean = ElectionPolicy { unclean: true, ..p };
        assert_eq!(next(&shrunk, &[1, 2, 3], &[2, 3], unclean), Some(znode(Online, 2, 5, &[2])));
        // The last leader comes back: it leads again.
        let down = znode(Offline, -1, 4, &[1]);
        assert_eq!(next(&down, &[1, 2, 3], &[1, 2, 3], p), Some(znode(Online, 1, 5, &[1])));
    }

    #[test]
    fn leadership_returns_to_the_preferred_replica_once_in_sync() {
        let p = ElectionPolicy::default();
        // 1 is preferred, 2 leads; 1 is live but not in sync: nothing moves.
        let led_by_2 = znode(Online, 2, 6, &[2, 3]);
        assert_eq!(next(&led_by_2, &[1, 2, 3], &[1, 2, 3], p), None);
        // 1 caught up (the leader added it to the ISR): it leads again.
        let in_sync = znode(Online, 2, 6, &[2, 3, 1]);
        assert_eq!(next(&in_sync, &[1, 2, 3], &[1, 2, 3], p), Some(znode(Online, 1, 7, &[2, 3, 1])));
        let no_rebalance = ElectionPolicy { preferred: false, ..p };
        assert_eq!(next(&in_sync, &[1, 2, 3], &[1, 2, 3], no_rebalance), None);
    }
}
