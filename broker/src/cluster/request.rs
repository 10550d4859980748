//! Shards and the control thread: what crosses between them.
//!
//! A shard never touches ZooKeeper. It holds a [`ClusterLink`]: a
//! `tokio::sync::watch` receiver of the latest [`ClusterMetadata`] and an
//! unbounded sender of [`ControlRequest`]s, whose answers come back on a
//! oneshot channel. Both are runtime-agnostic futures; glommio wakes a task
//! woken from another thread through its foreign-wake queue, so a shard
//! awaits them without blocking its reactor.
//!
//! A topic creation on any broker: the shard validates what it can (name,
//! partition count, replication factor, settings), the control thread
//! leaves a request znode for the controller, waits for the controller to
//! answer it (the request znode goes, the topic's znodes appear in the same
//! multi-op), then for the published metadata to show every partition
//! placed and out of state `New`. Deletion goes the same way.

use super::controller::{self, ControllerError, CreateTopicRequest, PartitionState};
use super::metadata::ClusterMetadata;
use super::zk::paths;
use crate::topic_error::TopicOpError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use zookeeper_client as zkc;

/// How long a topic creation or deletion waits for the controller.
pub const TOPIC_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A shard's handle on the cluster (cluster mode only).
#[derive(Debug, Clone)]
pub struct ClusterLink {
    pub broker_id: i32,
    pub metadata: watch::Receiver<Arc<ClusterMetadata>>,
    pub control: tokio::sync::mpsc::UnboundedSender<ControlRequest>,
}

/// The answer to a [`ControlRequest`].
pub type ControlReply = oneshot::Sender<Result<(), TopicOpError>>;

/// What a shard asks of the control thread.
#[derive(Debug)]
pub enum ControlRequest {
    CreateTopic {
        name: String,
        request: CreateTopicRequest,
        reply: ControlReply,
    },
    DeleteTopic {
        name: String,
        reply: ControlReply,
    },
    /// A leader's ISR change: the partition state rewritten with `isr`,
    /// if its znode still has `state_version` and `leader_epoch`.
    AlterIsr {
        topic: String,
        partition: u32,
        change: crate::replica::IsrChange,
        reply: IsrReply,
    },
    /// This broker's controlled shutdown (see `Membership::controlled_shutdown`).
    ControlledShutdown {
        broker: i32,
        timeout: Duration,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// The answer to an ISR change.
pub type IsrReply = oneshot::Sender<Result<(), IsrError>>;

/// Why an ISR change was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsrError {
    /// The state changed since the leader read it (an election, another
    /// change): the leader waits for the metadata that shows it.
    #[error("partition state changed since it was read (now leader {leader}, epoch {leader_epoch})")]
    Stale { leader: i32, leader_epoch: i32 },
    #[error("ZooKeeper: {0}")]
    ZooKeeper(String),
    #[error("the control thread stopped")]
    Stopped,
}

impl ClusterLink {
    /// Asks the control thread and waits for its answer.
    pub async fn ask(
        &self,
        make: impl FnOnce(ControlReply) -> ControlRequest,
        topic: &str,
    ) -> Result<(), TopicOpError> {
        let (tx, rx) = oneshot::channel();
        let stopped = || TopicOpError::ZooKeeper {
            topic: topic.to_string(),
            message: "the control thread stopped".into(),
        };
        self.control.send(make(tx)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

impl ControlRequest {
    /// Serves the request on the control thread (a task of its own).
    pub async fn serve(self, client: zkc::Client, metadata: watch::Receiver<Arc<ClusterMetadata>>) {
        let deadline = Instant::now() + TOPIC_REQUEST_TIMEOUT;
        match self {
            ControlRequest::CreateTopic { name, request, reply } => {
                let r = create(&client, metadata, &name, &request, deadline).await;
                let _gone = reply.send(r);
            }
            ControlRequest::DeleteTopic { name, reply } => {
                let r = delete(&client, metadata, &name, deadline).await;
                let _gone = reply.send(r);
            }
            ControlRequest::AlterIsr { topic, partition, change, reply } => {
                let _gone = reply.send(alter_isr(&client, &topic, partition, &change).await);
            }
            ControlRequest::ControlledShutdown { broker, timeout, reply } => {
                let _gone = reply.send(controlled_shutdown(&client, metadata, broker, timeout).await);
            }
        }
    }
}

/// Marks `broker` as shutting down (an ephemeral znode: it goes with the
/// session) and waits until the published metadata shows the controller
/// saw it and `broker` leads no partition.
async fn controlled_shutdown(
    client: &zkc::Client,
    metadata: watch::Receiver<Arc<ClusterMetadata>>,
    broker: i32,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let ephemeral = zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all());
    let path = paths::shutting_down(broker);
    let mark = client.create(&path, b"", &ephemeral);
    match tokio::time::timeout(timeout, mark).await {
        Ok(Ok(_) | Err(zkc::Error::NodeExists)) => {}
        Ok(Err(e)) => return Err(format!("cannot mark the broker as shutting down: {e}")),
        Err(_) => return Err(format!("ZooKeeper did not answer within {} ms", timeout.as_millis())),
    }
    let leads = |md: &ClusterMetadata| {
        md.topics
            .values()
            .flat_map(|t| &t.partitions)
            .filter(|p| p.leader == broker && p.state == PartitionState::Online)
            .count()
    };
    let done = |md: &ClusterMetadata| md.shutting_down.contains(&broker) && leads(md) == 0;
    if wait_metadata(metadata.clone(), done, deadline).await.is_some() {
        return Ok(());
    }
    Err(format!(
        "still leading {} partition(s) after {} ms (is a controller running?)",
        leads(&metadata.borrow()),
        timeout.as_millis()
    ))
}

impl ClusterLink {
    /// Asks for an ISR change and waits for the answer.
    pub async fn alter_isr(
        &self,
        topic: &str,
        partition: u32,
        change: crate::replica::IsrChange,
    ) -> Result<(), IsrError> {
        let (tx, rx) = oneshot::channel();
        let request = ControlRequest::AlterIsr { topic: topic.to_string(), partition, change, reply: tx };
        self.control.send(request).map_err(|_| IsrError::Stopped)?;
        rx.await.map_err(|_| IsrError::Stopped)?
    }
}

/// The version-checked write of a leader's ISR change (Kafka's ZooKeeper
/// mode: the leader writes the partition state itself, conditionally).
async fn alter_isr(
    client: &zkc::Client,
    topic: &str,
    partition: u32,
    change: &crate::replica::IsrChange,
) -> Result<(), IsrError> {
    let zk = |e: ControllerError| IsrError::ZooKeeper(e.to_string());
    let (mut state, version) =
        controller::read_partition_state(client, topic, partition).await.map_err(zk)?;
    if version != change.state_version || state.leader_epoch != change.leader_epoch {
        return Err(IsrError::Stale { leader: state.leader, leader_epoch: state.leader_epoch });
    }
    state.isr.clone_from(&change.isr);
    let path = paths::partition_state(topic, partition);
    let data = serde_json::to_vec(&state).map_err(|e| IsrError::ZooKeeper(e.to_string()))?;
    match client.set_data(&path, &data, Some(version)).await {
        Ok(_) => {
            tracing::info!(topic, partition, isr = ?change.isr, leader_epoch = change.leader_epoch, "ISR changed");
            Ok(())
        }
        Err(zkc::Error::BadVersion) => {
            Err(IsrError::Stale { leader: state.leader, leader_epoch: state.leader_epoch })
        }
        Err(e) => Err(IsrError::ZooKeeper(e.to_string())),
    }
}

fn zk_error(topic: &str) -> impl Fn(ControllerError) -> TopicOpError + '_ {
    move |e| match e {
        ControllerError::TopicExists(_) => TopicOpError::AlreadyExists { topic: topic.to_string() },
        e => TopicOpError::ZooKeeper { topic: topic.to_string(), message: e.to_string() },
    }
}

fn timed_out(topic: &str) -> TopicOpError {
    TopicOpError::ControllerTimeout {
        topic: topic.to_string(),
        waited_ms: TOPIC_REQUEST_TIMEOUT.as_millis() as u64,
    }
}

async fn create(
    client: &zkc::Client,
    metadata: watch::Receiver<Arc<ClusterMetadata>>,
    topic: &str,
    request: &CreateTopicRequest,
    deadline: Instant,
) -> Result<(), TopicOpError> {
    if topic_exists(client, topic).await? {
        return Err(TopicOpError::AlreadyExists { topic: topic.to_string() });
    }
    controller::request_topic(client, topic, request).await.map_err(zk_error(topic))?;
    answered(client, &paths::create_topic_request(topic), topic, deadline).await?;
    if !topic_exists(client, topic).await? {
        return Err(TopicOpError::Refused {
            topic: topic.to_string(),
            reason: "the topic was not created (the controller's log says why)".into(),
        });
    }
    let placed = |md: &ClusterMetadata| {
        md.topics.get(topic).is_some_and(|t| t.partitions.iter().all(|p| p.state != PartitionState::New))
    };
    wait_metadata(metadata, placed, deadline).await.ok_or_else(|| timed_out(topic))
}

async fn delete(
    client: &zkc::Client,
    metadata: watch::Receiver<Arc<ClusterMetadata>>,
    topic: &str,
    deadline: Instant,
) -> Result<(), TopicOpError> {
    if !topic_exists(client, topic).await? {
        return Err(TopicOpError::Unknown { topic: topic.to_string() });
    }
    controller::request_topic_deletion(client, topic).await.map_err(zk_error(topic))?;
    answered(client, &paths::delete_topic_request(topic), topic, deadline).await?;
    wait_metadata(metadata, |md| !md.topics.contains_key(topic), deadline)
        .await
        .ok_or_else(|| timed_out(topic))
}

/// Whether `/shardlog/topics/<topic>` exists.
async fn topic_exists(client: &zkc::Client, topic: &str) -> Result<bool, TopicOpError> {
    let stat = client.check_stat(&paths::topic(topic)).await.map_err(|e| zk_error(topic)(e.into()))?;
    Ok(stat.is_some())
}

/// Waits until the controller answered the request znode `path` (it is
/// gone); `ControllerTimeout` at the deadline.
async fn answered(
    client: &zkc::Client,
    path: &str,
    topic: &str,
    deadline: Instant,
) -> Result<(), TopicOpError> {
    wait_gone(client, path, deadline).await.map_err(zk_error(topic))?.ok_or_else(|| timed_out(topic))
}

/// Waits until `path` does not exist; `Ok(None)` at the deadline.
async fn wait_gone(
    client: &zkc::Client,
    path: &str,
    deadline: Instant,
) -> Result<Option<()>, ControllerError> {
    loop {
        let (stat, watcher) = client.check_and_watch_stat(path).await?;
        if stat.is_none() {
            return Ok(Some(()));
        }
        let until = tokio::time::Instant::from_std(deadline);
        if tokio::time::timeout_at(until, watcher.changed()).await.is_err() {
            return Ok(None);
        }
    }
}

/// Waits until the published metadata satisfies `done`; `None` at the deadline.
async fn wait_metadata(
    mut metadata: watch::Receiver<Arc<ClusterMetadata>>,
    done: impl Fn(&ClusterMetadata) -> bool,
    deadline: Instant,
) -> Option<()> {
    let until = tokio::time::Instant::from_std(deadline);
    let wait = metadata.wait_for(|md| done(md));
    match tokio::time::timeout_at(until, wait).await {
        Ok(Ok(_)) => Some(()),
        _ => None,
    }
}
