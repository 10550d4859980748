//! A shard in a cluster: applying the control thread's metadata snapshots
//! and routing by them.
//!
//! Each shard follows the published [`ClusterMetadata`] on its own (a task
//! per shard, `follow_cluster`): it adds every topic of the cluster to its
//! table, opens the partitions placed on this broker that it owns (their
//! logs recover as at any start), and deletes the local partitions of
//! topics the controller deleted. Requests are then routed by the snapshot
//! the shard last applied (`check_served`): a partition led elsewhere gets
//! `NotLeaderOrFollower` naming its leader, one without a live leader gets
//! `LeaderNotAvailable`. **Invariant**: a snapshot is stored only after its
//! partitions are open, so a shard never routes a request to a partition it
//! has not opened yet.

use super::ShardContext;
use crate::cluster::controller::CreateTopicRequest;
use crate::cluster::controller::PartitionState;
use crate::cluster::metadata::{ClusterMetadata, ClusterTopic, Route};
use crate::cluster::request::ControlRequest;
use crate::cluster::ClusterLink;
use crate::config::TopicConfig;
use crate::partition::PartitionError;
use crate::replica::checkpoint;
use crate::topic_error::TopicOpError;
use crate::topics::TopicMeta;
use shardlog_schema::types::OFFSETS_TOPIC;
use shardlog_schema::ErrorCode;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a topic change waits to show in this shard's table after the
/// controller made it (the snapshot is published at the same moment; this
/// is the shard's own apply).
const LOCAL_APPLY_WAIT: Duration = Duration::from_secs(5);
/// How often a shard looks for ISR changes its partitions want.
const ISR_CHECK_INTERVAL: Duration = Duration::from_millis(250);

impl ShardContext {
    /// The cluster link, in cluster mode.
    pub fn cluster_link(&self) -> Option<&ClusterLink> {
        self.cluster.as_ref()
    }

    /// The snapshot this shard last applied (cluster mode).
    pub fn cluster_metadata(&self) -> Option<Arc<ClusterMetadata>> {
        self.cluster_md.borrow().clone()
    }

    /// This broker's settings for a cluster topic: its defaults (the offsets
    /// topic's for `__consumer_offsets`) with the topic's overrides.
    fn cluster_topic_meta(&self, name: &str, topic: &ClusterTopic) -> Result<TopicMeta, TopicOpError> {
        let mut config: TopicConfig = if name == OFFSETS_TOPIC {
            crate::group::offsets_topic_config(&self.config)
        } else {
            self.config.topic_defaults.clone()
        };
        for (k, v) in &topic.config {
            config.set(k, v).map_err(|source| TopicOpError::BadConfig { topic: name.to_string(), source })?;
        }
        Ok(TopicMeta { name: name.to_string(), partitions: topic.partitions.len() as u32, config })
    }

    /// Applies one snapshot (see the module docs). A topic whose partitions
    /// cannot be opened is left out and tried again with the next snapshot.
    pub(crate) async fn apply_cluster(self: &Rc<Self>, md: Arc<ClusterMetadata>) {
        let me = self.config.broker_id;
        let gone: Vec<String> =
            self.topics.borrow().keys().filter(|n| !md.topics.contains_key(*n)).cloned().collect();
        for name in gone {
            match self.remove_topic(&name).await {
                Ok(()) => tracing::info!(topic = %name, shard = %self.id, "topic deleted by the controller"),
                Err(e) => {
                    tracing::error!(topic = %name, error = %e, "cannot delete a deleted topic's partitions")
                }
            }
        }
        let mut opened_offsets = Vec::new();
        for (name, topic) in &md.topics {
            if self.topics.borrow().contains_key(name) {
                continue;
            }
            let meta = match self.cluster_topic_meta(name, topic) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(topic = %name, error = %e, "topic has settings this broker refuses");
                    continue;
                }
            };
            let hosted: Vec<u32> = md.hosted(name, me).collect();
            if let Err(e) = self.open_topic(meta, false, |p| hosted.contains(&p)).await {
                tracing::error!(topic = %name, error = %e, "cannot open a topic's partitions; retried at the next change");
                continue;
            }
            if name == OFFSETS_TOPIC {
                opened_offsets = hosted.into_iter().filter(|p| self.partition(name, *p).is_some()).collect();
            }
        }
        self.sync_hosted(&md).await;
        self.apply_roles(&md).await;
        *self.cluster_md.borrow_mut() = Some(md);
        for p in opened_offsets {
            self.groups.load_partition(self, p).await;
        }
    }

    /// Reassignment (`cluster::reassign`): opens the replicas of open topics
    /// placed on this broker since, and closes and deletes those moved away
    /// (their fetchers stop first; waiting consumers are woken and find the
    /// partition gone, a retriable `NotLeaderOrFollower`).
    async fn sync_hosted(&self, md: &ClusterMetadata) {
        let me = self.config.broker_id;
        for (name, topic) in &md.topics {
            let Some(meta) = self.topics.borrow().get(name).cloned() else { continue };
            let Some(key) = self.partitions.borrow().get_key_value(name.as_str()).map(|(k, _)| k.clone())
            else {
                continue;
            };
            for (i, info) in topic.partitions.iter().enumerate() {
                let p = i as u32;
                if self.owner(name, p) != self.id {
                    continue;
                }
                match (self.partition(name, p), info.replicas.contains(&me)) {
                    (None, true) => match self.open_partition(&meta, key.clone(), p).await {
                        Ok(part) => {
                            if let Some(slot) =
                                self.partitions.borrow_mut().get_mut(name.as_str()).and_then(|s| s.get_mut(i))
                            {
                                *slot = Some(part);
                            }
                            tracing::info!(topic = %name, partition = p, "replica placed here: opened");
                        }
                        Err(e) => {
                            tracing::error!(topic = %name, partition = p, error = %e, "cannot open a replica placed here; retried at the next change")
                        }
                    },
                    (Some(part), false) => {
                        if let Some(slot) =
                            self.partitions.borrow_mut().get_mut(name.as_str()).and_then(|s| s.get_mut(i))
                        {
                            *slot = None;
                        }
                        part.replica.stop();
                        part.data.notify();
                        match part.log.delete().await {
                            Ok(()) => {
                                tracing::info!(topic = %name, partition = p, "replica moved away: deleted")
                            }
                            Err(e) => {
                                tracing::warn!(topic = %name, partition = p, error = %e, "cannot delete a replica moved away")
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Sets each owned partition's replica role from the snapshot: leader
    /// of its epoch (a new epoch is recorded in the log's history before
    /// the first append of it), or follower of its leader (a fetcher task
    /// starts; the previous one is told to stop). See `replica`.
    async fn apply_roles(self: &Rc<Self>, md: &ClusterMetadata) {
        let me = self.config.broker_id;
        let now = Instant::now();
        for (name, topic) in &md.topics {
            for (i, info) in topic.partitions.iter().enumerate() {
                let Some(p) = self.partition(name, i as u32) else { continue };
                if info.leader == me && info.state == PartitionState::Online {
                    let isr_before = p.replica.leader_isr_len();
                    let new_epoch = p.replica.lead(me, info, info.state_version, now);
                    if let (Some(before), false) = (isr_before, new_epoch) {
                        self.metrics.count_isr_change(before, info.isr.len());
                    }
                    if new_epoch {
                        p.leader_epoch.set(info.leader_epoch);
                        if let Err(e) = p.log.begin_epoch(info.leader_epoch).await {
                            tracing::warn!(topic = %name, partition = i, error = %e, "cannot record the new leader epoch");
                        }
                        tracing::info!(topic = %name, partition = i, epoch = info.leader_epoch, isr = ?info.isr, end = %p.log.end_offset(), "leading");
                    }
                    p.replica.advance_hw(p.log.high_watermark().0);
                } else if info.replicas.contains(&me) {
                    // In controlled shutdown this broker is in no ISR:
                    // its fetchers stop (leader -1 starts none).
                    let leader = if md.shutting_down.contains(&me) { -1 } else { info.leader };
                    if let Some(stop) = p.replica.follow(leader, info.leader_epoch) {
                        p.leader_epoch.set(info.leader_epoch);
                        let task = crate::replica::fetcher::run(
                            self.clone(),
                            p.clone(),
                            leader,
                            info.leader_epoch,
                            stop,
                        );
                        glommio::spawn_local(task).detach();
                    }
                }
                // Waiting `acks=all` producers and consumers look again.
                p.data.notify();
            }
        }
    }

    /// Follows the published snapshots until the link closes, and keeps the
    /// ISR of the partitions this shard leads (`isr_loop`).
    pub(crate) async fn follow_cluster(self: Rc<Self>) {
        let Some(mut rx) = self.cluster.as_ref().map(|l| l.metadata.clone()) else { return };
        let follow = async {
            loop {
                if rx.changed().await.is_err() {
                    return;
                }
                let md = rx.borrow_and_update().clone();
                self.apply_cluster(md).await;
            }
        };
        let keep = futures_lite::future::zip(self.clone().isr_loop(), self.clone().hw_checkpoint_loop());
        futures_lite::future::zip(follow, keep).await;
    }

    /// Every [`checkpoint::CHECKPOINT_INTERVAL`], writes this shard's
    /// high-watermark checkpoint if it changed.
    async fn hw_checkpoint_loop(self: Rc<Self>) {
        loop {
            glommio::timer::sleep(checkpoint::CHECKPOINT_INTERVAL).await;
            if let Err(e) = self.write_hw_checkpoint().await {
                tracing::warn!(shard = %self.id, error = %e, "cannot write the high-watermark checkpoint");
            }
        }
    }

    /// Writes the high watermarks of this shard's replicated partitions,
    /// unless they are what it wrote last.
    pub(crate) async fn write_hw_checkpoint(&self) -> Result<(), String> {
        let mut entries: Vec<(String, u32, u64)> = self
            .owned_partitions()
            .iter()
            .filter(|p| p.replica.epoch().is_some())
            .map(|p| (p.topic.to_string(), p.id, p.high_watermark()))
            .collect();
        entries.sort_unstable();
        if *self.written_hw.borrow() == entries {
            return Ok(());
        }
        checkpoint::write(self.config.data_dir.clone(), usize::from(self.id.0), &entries).await?;
        *self.written_hw.borrow_mut() = entries;
        Ok(())
    }

    /// Every [`ISR_CHECK_INTERVAL`], asks for the ISR changes the partitions
    /// this shard leads want (followers out of sync leave, caught-up ones
    /// return): version-checked writes through the control thread.
    async fn isr_loop(self: Rc<Self>) {
        let Some(link) = self.cluster.clone() else { return };
        let lag_max = self
            .config
            .cluster
            .as_ref()
            .map_or(crate::replica::REPLICA_LAG_TIME_MAX_DEFAULT, |c| c.replica_lag_time_max);
        let me = self.config.broker_id;
        loop {
            glommio::timer::sleep(ISR_CHECK_INTERVAL).await;
            let now = Instant::now();
            for p in self.owned_partitions() {
                let Some(change) = p.replica.wanted_isr_change(me, now, lag_max) else { continue };
                let link = link.clone();
                glommio::spawn_local(async move {
                    tracing::info!(topic = %p.topic, partition = p.id, isr = ?change.isr, "asking for an ISR change");
                    if let Err(e) = link.alter_isr(&p.topic, p.id, change).await {
                        tracing::info!(topic = %p.topic, partition = p.id, error = %e, "ISR change not written");
                        p.replica.isr_answered();
                    }
                })
                .detach();
            }
        }
    }

    /// Applies the snapshot published now (start-up, before serving).
    pub(crate) async fn apply_current_cluster(self: &Rc<Self>) {
        let Some(md) = self.cluster.as_ref().map(|l| l.metadata.borrow().clone()) else { return };
        self.apply_cluster(md).await;
    }

    /// Whether this broker serves `topic`/`partition` now: `None` when it
    /// does (alone, a partition that exists; in a cluster, one it leads).
    pub fn check_served(&self, topic: &str, partition: u32) -> Option<PartitionError> {
        if let Some(e) = self.check_partition(topic, partition) {
            return Some(e);
        }
        let md = self.cluster_md.borrow();
        let md = md.as_ref()?;
        let me = self.config.broker_id;
        match md.route(topic, partition) {
            Route::Leader { leader, .. } if leader == me => None,
            Route::Leader { leader, broker, .. } => {
                let at = broker.map(|b| format!(" at {}:{}", b.host, b.port)).unwrap_or_default();
                Some(PartitionError::new(
                    ErrorCode::NotLeaderOrFollower,
                    format!("partition {topic}-{partition} is led by broker {leader}{at}, not by broker {me}: refresh metadata"),
                ))
            }
            Route::Offline { replicas } => Some(PartitionError::new(
                ErrorCode::LeaderNotAvailable,
                format!(
                    "partition {topic}-{partition} has no live leader: its replica on broker {replicas:?} is down"
                ),
            )),
            Route::Unknown => Some(PartitionError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("partition {topic}-{partition} is not in the cluster metadata yet"),
            )),
        }
    }

    /// Cluster mode: hands a validated creation to the controller and waits
    /// until this shard's table has the topic.
    pub(super) async fn create_in_cluster(
        &self,
        link: &ClusterLink,
        name: &str,
        request: CreateTopicRequest,
    ) -> Result<(), TopicOpError> {
        let topic = name.to_string();
        link.ask(|reply| ControlRequest::CreateTopic { name: topic, request, reply }, name).await?;
        self.wait_local(name, true).await
    }

    /// Cluster mode: hands a deletion to the controller and waits until this
    /// shard's table no longer has the topic.
    pub(super) async fn delete_in_cluster(&self, link: &ClusterLink, name: &str) -> Result<(), TopicOpError> {
        let topic = name.to_string();
        link.ask(|reply| ControlRequest::DeleteTopic { name: topic, reply }, name).await?;
        self.wait_local(name, false).await
    }

    /// Waits until the topic is (or is no longer) in this shard's table.
    async fn wait_local(&self, name: &str, present: bool) -> Result<(), TopicOpError> {
        let deadline = Instant::now() + LOCAL_APPLY_WAIT;
        // Both the opened topics and the published snapshot: `check_served`
        // routes by the snapshot, which `apply_cluster` sets last.
        let applied = || {
            self.topics.borrow().contains_key(name) == present
                && self.cluster_md.borrow().as_ref().is_some_and(|md| md.topics.contains_key(name) == present)
        };
        while !applied() {
            if Instant::now() > deadline {
                return Err(TopicOpError::ControllerTimeout {
                    topic: name.to_string(),
                    waited_ms: LOCAL_APPLY_WAIT.as_millis() as u64,
                });
            }
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Cluster mode: asks for `__consumer_offsets` when the cluster has none
    /// yet (the first group request does, as in Kafka); the caller answers
    /// `CoordinatorNotAvailable` meanwhile and the client retries.
    pub fn request_offsets_topic(&self) {
        let Some(link) = self.cluster.clone() else { return };
        if self.requested_offsets_topic.replace(true) {
            return;
        }
        let request = CreateTopicRequest {
            partitions: self.config.group.offsets_topic_partitions,
            replication_factor: 1,
            config: Default::default(),
        };
        let asking = self.requested_offsets_topic.clone();
        glommio::spawn_local(async move {
            let name = OFFSETS_TOPIC.to_string();
            let asked = link.ask(|reply| ControlRequest::CreateTopic { name, request, reply }, OFFSETS_TOPIC).await;
            match asked {
                Ok(()) | Err(TopicOpError::AlreadyExists { .. }) => {}
                Err(e) => tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}; the next group request asks again"),
            }
            asking.set(false);
        })
        .detach();
    }
}
