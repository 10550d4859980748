//! Requests other brokers and `shardlog cluster` leave for the controller
//! under `/shardlog/admin/` (topic creation and deletion, preferred-leader
//! election), and the controller's service of them.

use super::*;

/// A preferred-leader election asked for by `cluster elect-leaders`
/// (`/shardlog/admin/preferred_election`): the partitions named, or every
/// partition when `partitions` is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreferredElectionRequest {
    #[serde(default)]
    pub partitions: Vec<(String, u32)>,
}

/// Asks the controller for a preferred-leader election (any broker or tool
/// may call this); `Err(Conflict)` while an earlier one is pending.
pub async fn request_preferred_election(
    client: &zkc::Client,
    request: &PreferredElectionRequest,
) -> Result<(), ControllerError> {
    let path = paths::PREFERRED_ELECTION;
    let data = json(path, request)?;
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match client.create(path, &data, &persistent).await {
        Ok(_) => Ok(()),
        Err(zkc::Error::NodeExists) => Err(ControllerError::Conflict { path: path.to_string() }),
        Err(e) => Err(e.into()),
    }
}

/// The controller's side of [`request_preferred_election`]: each named
/// partition whose first replica is live and in the ISR is led by it (the
/// leader epoch bumped), whatever `auto.leader.rebalance.enable` says; the
/// request goes in the last fenced write. Partitions it cannot move are
/// logged (`cluster status` shows who leads).
pub async fn serve_preferred_election(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    live: &BTreeSet<i32>,
    policy: ElectionPolicy,
) -> Result<usize, ControllerError> {
    let path = paths::PREFERRED_ELECTION;
    let request: PreferredElectionRequest = match client.get_data(path).await {
        Ok((data, _)) => serde_json::from_slice(&data).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "unreadable preferred-election request: electing every partition");
            PreferredElectionRequest::default()
        }),
        Err(zkc::Error::NoNode) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let wanted = |topic: &str, p: u32| {
        request.partitions.is_empty() || request.partitions.iter().any(|(t, q)| t == topic && *q == p)
    };
    let preferred = ElectionPolicy { preferred: true, ..policy };
    let mut writes = Vec::new();
    for topic in read_all(client).await? {
        for (p, (current, version)) in topic.states.iter().enumerate() {
            let p = p as u32;
            if !wanted(&topic.name, p) {
                continue;
            }
            match next_state(current, topic.replicas(p), live, epoch.epoch, preferred) {
                Some(next) => {
                    let path = paths::partition_state(&topic.name, p);
                    let data = json(&path, &next)?;
                    tracing::info!(topic = %topic.name, partition = p, leader = next.leader, leader_epoch = next.leader_epoch, "preferred leader elected");
                    writes.push(Write::Set { path, data, version: *version });
                }
                None if current.leader != topic.replicas(p).first().copied().unwrap_or(-1) => tracing::info!(
                    topic = %topic.name, partition = p, leader = current.leader,
                    "preferred replica not live or not in sync: leadership stays"
                ),
                None => {}
            }
        }
    }
    let elected = writes.len();
    writes.push(Write::Delete { path: path.to_string(), version: -1 });
    for chunk in writes.chunks(RECONCILE_WRITES_PER_COMMIT) {
        fenced_write(client, epoch, chunk).await?;
    }
    Ok(elected)
}

/// A request to create a topic, left by any broker (or tool) in
/// `/shardlog/admin/create_topics/<topic>` for the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopicRequest {
    pub partitions: u32,
    pub replication_factor: u16,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

/// Hands a topic creation to the controller (any broker may call this).
pub async fn request_topic(
    client: &zkc::Client,
    topic: &str,
    request: &CreateTopicRequest,
) -> Result<(), ControllerError> {
    let path = paths::create_topic_request(topic);
    let data = json(&path, request)?;
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match client.create(&path, &data, &persistent).await {
        Ok(_) => Ok(()),
        Err(zkc::Error::NodeExists) => Err(ControllerError::TopicExists(topic.into())),
        Err(e) => Err(e.into()),
    }
}

/// The controller's side: places and creates every requested topic over
/// the live brokers (`placement::place`, leaders balanced against what
/// each broker leads already), deleting each request in the same fenced
/// multi-op. A request that cannot be met (a topic that exists, a
/// replication factor above the live brokers, no live broker) is deleted
/// with a log line.
pub async fn serve_topic_requests(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    live: &[crate::cluster::placement::Candidate],
) -> Result<usize, ControllerError> {
    let mut created = 0;
    for topic in client.list_children(paths::CREATE_TOPIC_REQUESTS).await? {
        let path = paths::create_topic_request(&topic);
        let (data, stat) = match client.get_data(&path).await {
            Ok(d) => d,
            Err(zkc::Error::NoNode) => continue,
            Err(e) => return Err(e.into()),
        };
        let request: Result<CreateTopicRequest, _> = serde_json::from_slice(&data);
        let done = Write::Delete { path: path.clone(), version: stat.version };
        let outcome = match request {
            Err(source) => Err(ControllerError::Json { path: path.clone(), source }),
            Ok(r) => match crate::cluster::placement::place(
                r.partitions,
                r.replication_factor,
                live,
                &leader_counts(client).await?,
            ) {
                Ok(replicas) => {
                    create_topic_with(client, epoch, &topic, &replicas, r.config, vec![done.clone()]).await
                }
                Err(e) => Err(e.into()),
            },
        };
        match outcome {
            Ok(()) => {
                tracing::info!(%topic, epoch = epoch.epoch, "controller created topic");
                created += 1;
            }
            Err(e @ ControllerError::Fenced { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(%topic, error = %e, "topic creation request refused");
                fenced_write(client, epoch, &[done]).await?;
            }
        }
    }
    Ok(created)
}

/// Hands a topic deletion to the controller (any broker may call this).
pub async fn request_topic_deletion(client: &zkc::Client, topic: &str) -> Result<(), ControllerError> {
    let persistent = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match client.create(&paths::delete_topic_request(topic), &[], &persistent).await {
        Ok(_) | Err(zkc::Error::NodeExists) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The controller's side of deletions: every partition goes to
/// `NonExistent` (through `Offline` when online, as Kafka's machine has it)
/// and the topic's znodes and the request go in one fenced multi-op. A
/// request for a topic that does not exist is deleted with a log line.
pub async fn serve_delete_requests(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
) -> Result<usize, ControllerError> {
    let mut deleted = 0;
    for topic in client.list_children(paths::DELETE_TOPIC_REQUESTS).await? {
        let path = paths::delete_topic_request(&topic);
        let stat = match client.check_stat(&path).await? {
            Some(s) => s,
            None => continue,
        };
        let done = Write::Delete { path: path.clone(), version: stat.version };
        let mut writes = match topic_deletion_writes(client, &topic).await {
            Ok(w) => w,
            Err(ControllerError::ZooKeeper(zkc::Error::NoNode)) => {
                tracing::warn!(%topic, "deletion requested for a topic that does not exist");
                fenced_write(client, epoch, &[done]).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        writes.push(done);
        match fenced_write(client, epoch, &writes).await {
            Ok(()) => {
                tracing::info!(%topic, epoch = epoch.epoch, "controller deleted topic");
                deleted += 1;
            }
            Err(e @ ControllerError::Fenced { .. }) => return Err(e),
            // Changed meanwhile (a state written by a reconcile): next round.
            Err(e) => tracing::warn!(%topic, error = %e, "topic deletion deferred"),
        }
    }
    Ok(deleted)
}

/// The version-checked deletes that remove a topic, children first.
async fn topic_deletion_writes(client: &zkc::Client, topic: &str) -> Result<Vec<Write>, ControllerError> {
    let topic_path = paths::topic(topic);
    let assignment = read_topic(client, topic).await?;
    let mut writes = Vec::new();
    for p in 0..assignment.partitions.len() as u32 {
        let (state, version) = read_partition_state(client, topic, p).await?;
        if state.state == PartitionState::Online {
            check_transition(state.state, PartitionState::Offline)?;
            check_transition(PartitionState::Offline, PartitionState::NonExistent)?;
        } else {
            check_transition(state.state, PartitionState::NonExistent)?;
        }
        writes.push(Write::Delete { path: paths::partition_state(topic, p), version });
        writes.push(Write::Delete { path: format!("{topic_path}/partitions/{p}"), version: -1 });
    }
    writes.push(Write::Delete { path: format!("{topic_path}/partitions"), version: -1 });
    let stat = client.check_stat(&topic_path).await?.ok_or(zkc::Error::NoNode)?;
    writes.push(Write::Delete { path: topic_path, version: stat.version });
    Ok(writes)
}
