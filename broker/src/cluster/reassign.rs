//! Partition reassignment and rebalancing (issue 12): moving a partition's
//! replica set while producers and consumers go on, as Kafka's controller
//! does it.
//!
//! A reassignment is a request in `/shardlog/admin/reassign_partitions`
//! ([`ReassignmentRequest`], left by `shardlog cluster reassign` or
//! `cluster rebalance`; one at a time). The controller moves each partition
//! of it from its current replicas `R` to the target `T` in steps, one
//! fenced, version-checked write per step ([`next_step`], a pure function
//! of what ZooKeeper holds):
//! 1. **expand**: the assignment becomes `T` followed by what of `R` is not
//!    in `T`. The new replicas' brokers open the partition and fetch from
//!    the leader; the leader adds each to the ISR once it has caught up
//!    (the ISR machinery of `replica`, nothing special);
//! 2. **wait** until every replica of `T` is in the ISR;
//! 3. **move leadership** when the leader is not in `T`: the first live
//!    replica of `T` (in the ISR by step 2) leads, the epoch bumped;
//! 4. **shrink**: the assignment becomes `T` and the ISR loses the replicas
//!    outside `T` (one multi-op); their brokers close and delete their copy.
//!
//! Once the assignment is `T` and all of `T` is in the ISR the move is done
//! and leaves the request; the request goes when empty. Each step is decided anew from ZooKeeper every
//! controller round, so a reassignment survives a controller failover (the
//! next controller takes it up where the znodes say it is). Producers see
//! at most one leadership change per partition (a retriable
//! `NotLeaderOrFollower`, then the new leader); `acks=all` records are on
//! every ISR member before they are acknowledged, so none is lost.
//!
//! [`plan_rebalance`] computes the moves that even out replicas and
//! preferred leaders over a set of brokers (all live ones, or all but those
//! being decommissioned); the preferred-leader election
//! (`auto.leader.rebalance.enable`, or `cluster elect-leaders`) then moves
//! leadership to each partition's new first replica.

use super::controller::{
    self, fenced_write, ControllerEpoch, ControllerError, PartitionState, PartitionStateZnode, Write,
};
use super::zk::paths;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use zookeeper_client as zkc;

/// One partition's target replica set (the first is the preferred leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMove {
    pub topic: String,
    pub partition: u32,
    pub replicas: Vec<i32>,
}

/// `/shardlog/admin/reassign_partitions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentRequest {
    pub moves: Vec<PartitionMove>,
}

/// Where one move stands, and what the controller does next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "step")]
pub enum Step {
    /// Write this replica list (the target, then the replicas leaving).
    Expand {
        replicas: Vec<i32>,
    },
    /// New replicas are catching up: these are not in the ISR yet.
    CatchUp {
        missing: Vec<i32>,
    },
    /// The leader leaves: this replica of the target takes over.
    MoveLeader {
        to: i32,
    },
    /// No replica of the target is live to lead: wait for one.
    NoLiveLeader,
    /// Write the target as the replica list and this ISR.
    Shrink {
        isr: Vec<i32>,
    },
    Done,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Expand { replicas } => write!(f, "adding replicas (replica list becomes {replicas:?})"),
            Step::CatchUp { missing } => {
                write!(f, "new replicas catching up: {missing:?} not in the ISR yet")
            }
            Step::MoveLeader { to } => write!(f, "moving leadership to broker {to}"),
            Step::NoLiveLeader => write!(f, "waiting for a live replica of the target to lead"),
            Step::Shrink { isr } => write!(f, "dropping the old replicas (ISR becomes {isr:?})"),
            Step::Done => write!(f, "done"),
        }
    }
}

/// The next step of moving a partition with `current` replicas and
/// `state` to `target` (see the module docs). `live`: the brokers that may
/// lead (registered and not shutting down).
#[must_use]
pub fn next_step(current: &[i32], state: &PartitionStateZnode, target: &[i32], live: &BTreeSet<i32>) -> Step {
    let full: Vec<i32> =
        target.iter().chain(current.iter().filter(|r| !target.contains(r))).copied().collect();
    if current != full {
        return Step::Expand { replicas: full };
    }
    let isr = if state.isr.is_empty() { current } else { &state.isr };
    let missing: Vec<i32> = target.iter().copied().filter(|r| !isr.contains(r)).collect();
    if !missing.is_empty() {
        return Step::CatchUp { missing };
    }
    if current == target {
        return Step::Done;
    }
    let leads = state.state == PartitionState::Online && target.contains(&state.leader);
    if !leads {
        return match target.iter().copied().find(|r| live.contains(r)) {
            Some(to) => Step::MoveLeader { to },
            None => Step::NoLiveLeader,
        };
    }
    Step::Shrink { isr: isr.iter().copied().filter(|r| target.contains(r)).collect() }
}

/// Why a reassignment request is refused before it reaches the controller.
#[derive(Debug, thiserror::Error)]
pub enum ReassignError {
    #[error("a reassignment is already in progress (see `shardlog cluster status`): wait for it to finish")]
    InProgress,
    #[error("nothing to move: every partition named already has the replicas asked for")]
    Empty,
    #[error("partition {topic}-{partition}: {reason}")]
    Invalid { topic: String, partition: u32, reason: String },
    #[error(transparent)]
    Controller(#[from] ControllerError),
}

/// Checks `moves` against the cluster (every partition exists, each target
/// is a non-empty list of distinct registered brokers, the internal offsets
/// topic is not moved) and drops the moves that change nothing.
pub fn validate(
    moves: Vec<PartitionMove>,
    partitions: &BTreeMap<(String, u32), Vec<i32>>,
    brokers: &BTreeSet<i32>,
) -> Result<Vec<PartitionMove>, ReassignError> {
    let mut kept = Vec::with_capacity(moves.len());
    let mut seen = BTreeSet::new();
    for m in moves {
        let invalid = |reason: String| ReassignError::Invalid {
            topic: m.topic.clone(),
            partition: m.partition,
            reason,
        };
        if m.topic == shardlog_schema::types::OFFSETS_TOPIC {
            return Err(invalid(format!(
                "the group coordinator's `{}` cannot be reassigned yet (its groups would have to move with it)",
                shardlog_schema::types::OFFSETS_TOPIC
            )));
        }
        let Some(current) = partitions.get(&(m.topic.clone(), m.partition)) else {
            return Err(invalid("no such partition".into()));
        };
        if m.replicas.is_empty() {
            return Err(invalid("the target replica list is empty".into()));
        }
        let distinct: BTreeSet<i32> = m.replicas.iter().copied().collect();
        if distinct.len() != m.replicas.len() {
            return Err(invalid(format!("replicas {:?} name a broker twice", m.replicas)));
        }
        if let Some(b) = m.replicas.iter().find(|b| !brokers.contains(b)) {
            return Err(invalid(format!("broker {b} is not registered (live brokers: {brokers:?})")));
        }
        if !seen.insert((m.topic.clone(), m.partition)) {
            return Err(invalid("named twice".into()));
        }
        if *current != m.replicas {
            kept.push(m);
        }
    }
    if kept.is_empty() {
        return Err(ReassignError::Empty);
    }
    Ok(kept)
}

/// Leaves a reassignment for the controller (any tool may call this).
pub async fn request(client: &zkc::Client, moves: &[PartitionMove]) -> Result<(), ReassignError> {
    let data = controller::json(paths::REASSIGNMENT, &ReassignmentRequest { moves: moves.to_vec() })?;
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match client.create(paths::REASSIGNMENT, &data, &persistent).await {
        Ok(_) => Ok(()),
        Err(zkc::Error::NodeExists) => Err(ReassignError::InProgress),
        Err(e) => Err(ControllerError::from(e).into()),
    }
}

/// The pending reassignment and its znode version, if any.
pub async fn read_request(
    client: &zkc::Client,
) -> Result<Option<(ReassignmentRequest, i32)>, ControllerError> {
    match client.get_data(paths::REASSIGNMENT).await {
        Ok((data, stat)) => {
            let r = serde_json::from_slice(&data)
                .map_err(|source| ControllerError::Json { path: paths::REASSIGNMENT.into(), source })?;
            Ok(Some((r, stat.version)))
        }
        Err(zkc::Error::NoNode) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Each pending move with its current replicas, state and next step (for
/// `cluster status` and the CLI's progress).
pub async fn progress(
    client: &zkc::Client,
    live: &BTreeSet<i32>,
) -> Result<Vec<(PartitionMove, Vec<i32>, PartitionStateZnode, Step)>, ControllerError> {
    let Some((request, _)) = read_request(client).await? else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(request.moves.len());
    for m in request.moves {
        let current = match controller::read_topic(client, &m.topic).await {
            Ok(a) => a.partitions.get(&m.partition.to_string()).cloned().unwrap_or_default(),
            Err(ControllerError::ZooKeeper(zkc::Error::NoNode)) => continue,
            Err(e) => return Err(e),
        };
        let (state, _) = controller::read_partition_state(client, &m.topic, m.partition).await?;
        let step = next_step(&current, &state, &m.replicas, live);
        out.push((m, current, state, step));
    }
    Ok(out)
}

/// The controller's side: one step for every pending move (see the module
/// docs), one fenced multi-op per topic (its assignment znode carries every
/// partition's replicas). A write that finds a znode changed (a leader's
/// ISR change) is retried at the next round. Returns how many moves are
/// still pending.
pub async fn serve(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    live: &BTreeSet<i32>,
) -> Result<usize, ControllerError> {
    let Some((request, version)) = read_request(client).await? else { return Ok(0) };
    let mut by_topic: BTreeMap<&str, Vec<&PartitionMove>> = BTreeMap::new();
    for m in &request.moves {
        by_topic.entry(m.topic.as_str()).or_default().push(m);
    }
    let mut finished: BTreeSet<(String, u32)> = BTreeSet::new();
    for (topic, moves) in by_topic {
        let path = paths::topic(topic);
        let (data, stat) = match client.get_data(&path).await {
            Ok(d) => d,
            Err(zkc::Error::NoNode) => {
                tracing::warn!(%topic, "reassignment of a topic that no longer exists dropped");
                finished.extend(moves.iter().map(|m| (m.topic.clone(), m.partition)));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut assignment: controller::TopicAssignment = serde_json::from_slice(&data)
            .map_err(|source| ControllerError::Json { path: path.clone(), source })?;
        let mut writes = Vec::new();
        let mut assignment_changed = false;
        for m in moves {
            let key = m.partition.to_string();
            let Some(current) = assignment.partitions.get(&key).cloned() else {
                tracing::warn!(%topic, partition = m.partition, "reassignment of a partition that does not exist dropped");
                finished.insert((m.topic.clone(), m.partition));
                continue;
            };
            let (state, state_version) = controller::read_partition_state(client, topic, m.partition).await?;
            let step = next_step(&current, &state, &m.replicas, live);
            tracing::info!(%topic, partition = m.partition, target = ?m.replicas, ?current, isr = ?state.isr, %step, "reassignment");
            let state_path = paths::partition_state(topic, m.partition);
            match step {
                Step::Expand { replicas } => {
                    assignment.partitions.insert(key, replicas);
                    assignment_changed = true;
                }
                Step::MoveLeader { to } => {
                    let next = PartitionStateZnode {
                        state: PartitionState::Online,
                        leader: to,
                        leader_epoch: state.leader_epoch + 1,
                        controller_epoch: epoch.epoch,
                        isr: state.isr.clone(),
                    };
                    controller::check_transition(state.state, next.state)?;
                    writes.push(Write::Set {
                        data: controller::json(&state_path, &next)?,
                        path: state_path,
                        version: state_version,
                    });
                }
                Step::Shrink { isr } => {
                    assignment.partitions.insert(key, m.replicas.clone());
                    assignment_changed = true;
                    if isr != state.isr {
                        let next = PartitionStateZnode { isr, controller_epoch: epoch.epoch, ..state };
                        writes.push(Write::Set {
                            data: controller::json(&state_path, &next)?,
                            path: state_path,
                            version: state_version,
                        });
                    }
                }
                Step::Done => {
                    finished.insert((m.topic.clone(), m.partition));
                }
                Step::CatchUp { .. } | Step::NoLiveLeader => {}
            }
        }
        if assignment_changed {
            writes.insert(
                0,
                Write::Set { data: controller::json(&path, &assignment)?, path, version: stat.version },
            );
        }
        if writes.is_empty() {
            continue;
        }
        match fenced_write(client, epoch, &writes).await {
            Ok(()) => {}
            Err(e @ ControllerError::Fenced { .. }) => return Err(e),
            Err(e) => tracing::info!(%topic, error = %e, "reassignment step deferred to the next round"),
        }
    }
    let pending: Vec<PartitionMove> = request
        .moves
        .iter()
        .filter(|m| !finished.contains(&(m.topic.clone(), m.partition)))
        .cloned()
        .collect();
    if pending.len() == request.moves.len() {
        return Ok(pending.len());
    }
    let write = if pending.is_empty() {
        tracing::info!("reassignment complete");
        Write::Delete { path: paths::REASSIGNMENT.into(), version }
    } else {
        let data = controller::json(paths::REASSIGNMENT, &ReassignmentRequest { moves: pending.clone() })?;
        Write::Set { path: paths::REASSIGNMENT.into(), data, version }
    };
    match fenced_write(client, epoch, &[write]).await {
        Ok(()) | Err(ControllerError::Conflict { .. }) => Ok(pending.len()),
        Err(e) => Err(e),
    }
}

/// Why no rebalance plan can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no broker is left to hold replicas")]
    NoBrokers,
    #[error(
        "partition {topic}-{partition} has {factor} replicas but only {brokers} broker(s) may hold them"
    )]
    TooFewBrokers { topic: String, partition: u32, factor: usize, brokers: usize },
}

/// The moves that even out replicas, then preferred leaders, over
/// `brokers`: replicas on other brokers (gone, or excluded to decommission
/// them) move to the least-loaded of `brokers` not already in the set;
/// then, while one broker holds two replicas more than another, one moves
/// from the most to the least loaded (same position in the list, so the
/// preferred leader moves with it); then, while one broker is the first
/// replica of two partitions more than another, the two swap places in a
/// partition both hold. Few moves: a balanced cluster gets an empty plan.
/// Pure and deterministic (ties go to the lower broker id).
pub fn plan_rebalance(
    partitions: &BTreeMap<(String, u32), Vec<i32>>,
    brokers: &BTreeSet<i32>,
) -> Result<Vec<PartitionMove>, PlanError> {
    if brokers.is_empty() {
        return Err(PlanError::NoBrokers);
    }
    let mut plan: BTreeMap<&(String, u32), Vec<i32>> =
        partitions.iter().map(|(k, v)| (k, v.clone())).collect();
    let mut load: BTreeMap<i32, usize> = brokers.iter().map(|&b| (b, 0)).collect();
    for replicas in plan.values() {
        for r in replicas {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
    }
    let least = |load: &BTreeMap<i32, usize>, not_in: &[i32]| {
        load.iter().filter(|(b, _)| !not_in.contains(b)).min_by_key(|&(&b, &n)| (n, b)).map(|(&b, _)| b)
    };
    // 1. Replicas off `brokers`.
    for (key, replicas) in &mut plan {
        for i in 0..replicas.len() {
            if brokers.contains(&replicas[i]) {
                continue;
            }
            let Some(to) = least(&load, replicas) else {
                return Err(PlanError::TooFewBrokers {
                    topic: key.0.clone(),
                    partition: key.1,
                    factor: replicas.len(),
                    brokers: brokers.len(),
                });
            };
            replicas[i] = to;
            *load.get_mut(&to).expect("a broker of the set") += 1;
        }
    }
    // 2. Replica counts within one of each other.
    let bound = plan.values().map(Vec::len).sum::<usize>() + 1;
    for _ in 0..bound {
        let (&most, &hi) = load.iter().max_by_key(|&(&b, &n)| (n, std::cmp::Reverse(b))).expect("brokers");
        let (&fewest, &lo) = load.iter().min_by_key(|&(&b, &n)| (n, b)).expect("brokers");
        if hi <= lo + 1 {
            break;
        }
        let Some(replicas) = plan.values_mut().find(|r| r.contains(&most) && !r.contains(&fewest)) else {
            break;
        };
        let i = replicas.iter().position(|&r| r == most).expect("holds it");
        replicas[i] = fewest;
        *load.get_mut(&most).expect("broker") -= 1;
        *load.get_mut(&fewest).expect("broker") += 1;
    }
    // 3. Preferred leaders within one of each other.
    let mut leading: BTreeMap<i32, usize> = brokers.iter().map(|&b| (b, 0)).collect();
    for replicas in plan.values() {
        if let Some(n) = replicas.first().and_then(|f| leading.get_mut(f)) {
            *n += 1;
        }
    }
    for _ in 0..bound {
        let (&most, &hi) = leading.iter().max_by_key(|&(&b, &n)| (n, std::cmp::Reverse(b))).expect("brokers");
        // The least-leading broker that shares a partition led by `most`.
        let swap = plan
            .values()
            .filter(|r| r.first() == Some(&most))
            .flat_map(|r| r.iter().skip(1).copied())
            .filter(|b| leading.get(b).is_some_and(|&n| n + 1 < hi))
            .min_by_key(|b| (leading[b], *b));
        let Some(to) = swap else { break };
        let replicas =
            plan.values_mut().find(|r| r.first() == Some(&most) && r.contains(&to)).expect("found above");
        let i = replicas.iter().position(|&r| r == to).expect("holds it");
        replicas.swap(0, i);
        *leading.get_mut(&most).expect("broker") -= 1;
        *leading.get_mut(&to).expect("broker") += 1;
    }
    Ok(plan
        .into_iter()
        .filter(|(key, replicas)| partitions.get(*key) != Some(replicas))
        .map(|(key, replicas)| PartitionMove { topic: key.0.clone(), partition: key.1, replicas })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(leader: i32, isr: &[i32]) -> PartitionStateZnode {
        PartitionStateZnode {
            state: PartitionState::Online,
            leader,
            leader_epoch: 4,
            controller_epoch: 1,
            isr: isr.to_vec(),
        }
    }

    fn live(ids: &[i32]) -> BTreeSet<i32> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_move_expands_waits_for_the_isr_moves_leadership_then_shrinks() {
        let all = live(&[1, 2, 3, 4]);
        let target = [3, 4];
        assert_eq!(
            next_step(&[1, 2], &state(1, &[1, 2]), &target, &all),
            Step::Expand { replicas: vec![3, 4, 1, 2] }
        );
        let current = [3, 4, 1, 2];
        assert_eq!(
            next_step(&current, &state(1, &[1, 2]), &target, &all),
            Step::CatchUp { missing: vec![3, 4] }
        );
        assert_eq!(
            next_step(&current, &state(1, &[1, 2, 4]), &target, &all),
            Step::CatchUp { missing: vec![3] }
        );
        assert_eq!(next_step(&current, &state(1, &[1, 2, 3, 4]), &target, &all), Step::MoveLeader { to: 3 });
        assert_eq!(
            next_step(&current, &state(1, &[1, 2, 3, 4]), &target, &live(&[1, 2, 4])),
            Step::MoveLeader { to: 4 }
        );
        assert_eq!(
            next_step(&current, &state(1, &[1, 2, 3, 4]), &target, &live(&[1, 2])),
            Step::NoLiveLeader
        );
        assert_eq!(
            next_step(&current, &state(3, &[1, 2, 3, 4]), &target, &all),
            Step::Shrink { isr: vec![3, 4] }
        );
        assert_eq!(next_step(&target, &state(3, &[3, 4]), &target, &all), Step::Done);
    }

    #[test]
    fn a_grown_or_reordered_set_still_waits_for_its_new_replicas() {
        let all = live(&[1, 2, 3]);
        // Adding a replica: the list is written first, the move is not done
        // until the new one is in the ISR.
        assert_eq!(
            next_step(&[1, 2], &state(1, &[1, 2]), &[1, 2, 3], &all),
            Step::Expand { replicas: vec![1, 2, 3] }
        );
        assert_eq!(
            next_step(&[1, 2, 3], &state(1, &[1, 2]), &[1, 2, 3], &all),
            Step::CatchUp { missing: vec![3] }
        );
        assert_eq!(next_step(&[1, 2, 3], &state(1, &[1, 2, 3]), &[1, 2, 3], &all), Step::Done);
        // Reordering only: one write.
        assert_eq!(
            next_step(&[1, 2], &state(1, &[1, 2]), &[2, 1], &all),
            Step::Expand { replicas: vec![2, 1] }
        );
        // An offline partition's leader is not "in the target".
        let offline =
            PartitionStateZnode { state: PartitionState::Offline, leader: -1, ..state(1, &[1, 2, 3]) };
        assert_eq!(next_step(&[3, 1, 2], &offline, &[3], &all), Step::MoveLeader { to: 3 });
    }

    fn parts(list: &[(&str, u32, &[i32])]) -> BTreeMap<(String, u32), Vec<i32>> {
        list.iter().map(|(t, p, r)| ((t.to_string(), *p), r.to_vec())).collect()
    }

    fn apply(
        mut parts: BTreeMap<(String, u32), Vec<i32>>,
        plan: &[PartitionMove],
    ) -> BTreeMap<(String, u32), Vec<i32>> {
        for m in plan {
            parts.insert((m.topic.clone(), m.partition), m.replicas.clone());
        }
        parts
    }

    fn counts(parts: &BTreeMap<(String, u32), Vec<i32>>, first_only: bool) -> BTreeMap<i32, usize> {
        let mut c = BTreeMap::new();
        for r in parts.values() {
            for b in if first_only { &r[..1] } else { &r[..] } {
                *c.entry(*b).or_insert(0) += 1;
            }
        }
        c
    }

    #[test]
    fn a_joined_broker_gets_its_share_of_replicas_and_leaders() {
        let before = parts(&[
            ("t", 0, &[1, 2]),
            ("t", 1, &[2, 3]),
            ("t", 2, &[3, 1]),
            ("t", 3, &[1, 2]),
            ("t", 4, &[2, 3]),
            ("t", 5, &[3, 1]),
        ]);
        let plan = plan_rebalance(&before, &live(&[1, 2, 3, 4])).unwrap();
        let after = apply(before.clone(), &plan);
        let replicas = counts(&after, false);
        assert_eq!(replicas.values().copied().collect::<Vec<_>>(), vec![3, 3, 3, 3], "{after:?}");
        let leaders = counts(&after, true);
        assert!(leaders.values().max().unwrap() - leaders.values().min().unwrap() <= 1, "{leaders:?}");
        assert!(after.values().all(|r| r.iter().collect::<BTreeSet<_>>().len() == r.len()), "{after:?}");
        // Few moves: 3 replicas go to broker 4, and no more.
        let moved: usize = plan
            .iter()
            .map(|m| {
                m.replicas.iter().filter(|r| !before[&(m.topic.clone(), m.partition)].contains(r)).count()
            })
            .sum();
        assert_eq!(moved, 3, "{plan:?}");
        // Balanced now: nothing more to do.
        assert_eq!(plan_rebalance(&after, &live(&[1, 2, 3, 4])).unwrap(), vec![]);
    }

    #[test]
    fn an_excluded_broker_is_emptied_and_too_few_brokers_are_refused() {
        let before = parts(&[("t", 0, &[1, 2]), ("t", 1, &[2, 3]), ("t", 2, &[3, 1]), ("u", 0, &[3])]);
        let plan = plan_rebalance(&before, &live(&[1, 2])).unwrap();
        let after = apply(before, &plan);
        assert!(after.values().all(|r| !r.contains(&3)), "{after:?}");
        assert_eq!(after[&("u".to_string(), 0)].len(), 1);
        let err = plan_rebalance(&after, &live(&[1])).unwrap_err();
        assert!(matches!(err, PlanError::TooFewBrokers { factor: 2, brokers: 1, .. }), "{err}");
        assert_eq!(plan_rebalance(&after, &live(&[])).unwrap_err(), PlanError::NoBrokers);
    }

    #[test]
    fn validation_names_the_partition_and_the_reason() {
        let known = parts(&[("t", 0, &[1, 2])]);
        let brokers = live(&[1, 2, 3]);
        let mv = |t: &str, p: u32, r: &[i32]| PartitionMove {
            topic: t.into(),
            partition: p,
            replicas: r.to_vec(),
        };
        let err = |m: PartitionMove| validate(vec![m], &known, &brokers).unwrap_err().to_string();
        assert!(err(mv("t", 1, &[1])).contains("t-1: no such partition"));
        assert!(err(mv("t", 0, &[])).contains("empty"));
        assert!(err(mv("t", 0, &[1, 1])).contains("twice"));
        assert!(err(mv("t", 0, &[1, 9])).contains("broker 9 is not registered"));
        assert!(matches!(validate(vec![mv("t", 0, &[1, 2])], &known, &brokers), Err(ReassignError::Empty)));
        assert_eq!(validate(vec![mv("t", 0, &[2, 3])], &known, &brokers).unwrap().len(), 1);
    }
}
