//! Topic and group administration: create, delete, list, describe,
//! metadata; groups: list, describe, offsets, reset, delete.

use crate::cluster::Cluster;
use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::group::wire::{CommittedOffset, GroupClient, GroupDescription, GroupListing};
use crate::protocol::{self, ClusterMetadata, NewTopic, OffsetQuery, TopicResult};
use shardlog_schema::ErrorCode;
use std::sync::Arc;

/// One partition of [`TopicDescription`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: u32,
    pub leader_broker: i32,
    pub leader_host: String,
    pub leader_shard: u16,
    pub leader_port: u16,
    pub leader_epoch: i32,
    /// First offset still in the log.
    pub start_offset: u64,
    /// Next offset to be written (log end / high watermark).
    pub end_offset: u64,
    /// The partition has no live leader (its broker is down): the leader is
    /// -1 and the offsets are unknown (0).
    pub offline: bool,
    /// Brokers holding a replica, the preferred leader first.
    pub replicas: Vec<i32>,
    /// The in-sync replicas (leader included).
    pub isr: Vec<i32>,
}

/// What `describe_topic` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partitions: Vec<PartitionDescription>,
    pub configs: Vec<(String, String)>,
}

/// The admin client.
pub struct Admin {
    cluster: Arc<Cluster>,
    /// Per group id, its client (which caches the coordinator's connection).
    groups: std::sync::Mutex<std::collections::HashMap<String, Arc<GroupClient>>>,
}

fn check_results(results: Vec<TopicResult>, name: &str) -> Result<()> {
    let r = results
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| ClientError::Protocol(format!("no result for topic `{name}`")))?;
    if r.error == ErrorCode::None {
        return Ok(());
    }
    if r.error == ErrorCode::UnknownTopicOrPartition {
        return Err(ClientError::UnknownTopic(name.to_string()));
    }
    Err(ClientError::broker(r.error, r.message.as_deref()))
}

impl Admin {
    pub async fn connect(config: ClientConfig) -> Result<Admin> {
        Ok(Admin { cluster: Cluster::connect(config, None).await?, groups: Default::default() })
    }

    /// Creates a topic with `partitions` partitions and `name=value` settings
    /// (Kafka's names: `segment.bytes`, `retention.ms`, `flush.policy`...).
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        configs: &[(String, String)],
    ) -> Result<()> {
        self.create_topic_replicated(name, partitions, 1, configs).await
    }

    /// [`Self::create_topic`] with a replication factor (the broker refuses
    /// any but 1 until replication exists).
    pub async fn create_topic_replicated(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u16,
        configs: &[(String, String)],
    ) -> Result<()> {
        let topic =
            NewTopic { name: name.to_string(), partitions, replication_factor, configs: configs.to_vec() };
        let client_id = &self.cluster.config.client_id;
        let topic = &topic;
        // Not sent again to another broker once sent: a creation that timed
        // out may still happen, and a second would answer "already exists".
        let conn = self.cluster.bootstrap().await?;
        let raw = conn
            .call(
                |corr| protocol::encode_create_topics(corr, client_id, std::slice::from_ref(topic)),
                Vec::new(),
            )
            .await?;
        check_results(protocol::decode_create_topics(&raw)?, name)
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let client_id = &self.cluster.config.client_id;
        let names = &[name.to_string()];
        let conn = self.cluster.bootstrap().await?;
        let raw =
            conn.call(|corr| protocol::encode_delete_topics(corr, client_id, names), Vec::new()).await?;
        check_results(protocol::decode_delete_topics(&raw)?, name)
    }

    /// Names of all topics, sorted.
    pub async fn list_topics(&self) -> Result<Vec<String>> {
        let mut names = self.list_all_topics().await?;
        names.retain(|n| !is_internal_topic(n));
        Ok(names)
    }

    /// Every topic, the broker's internal ones (`__consumer_offsets`) too.
    pub async fn list_all_topics(&self) -> Result<Vec<String>> {
        let md = self.cluster.fetch_metadata(None).await?;
        let mut names: Vec<String> =
            md.topics.into_iter().filter(|t| t.error == ErrorCode::None).map(|t| t.name).collect();
        names.sort();
        Ok(names)
    }

    /// Partitions with their leaders (broker, shard, port) and offset range, plus settings.
    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription> {
        let md = self.cluster.refresh(Some(&[name.to_string()])).await?;
        let topic = md.topic(name).ok_or_else(|| ClientError::UnknownTopic(name.to_string()))?;
        let mut queries = Vec::with_capacity(topic.partitions.len() * 2);
        let (online, offline): (Vec<_>, Vec<_>) =
            topic.partitions.iter().partition(|p| p.error != ErrorCode::LeaderNotAvailable);
        for p in &online {
            for timestamp in [protocol::LIST_OFFSETS_EARLIEST, protocol::LIST_OFFSETS_LATEST] {
                queries.push(OffsetQuery { topic: name.to_string(), partition: p.partition, timestamp });
            }
        }
        let answers = self.cluster.list_offsets(&queries).await?;
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (p, pair) in online.iter().zip(answers.chunks(2)) {
            for a in pair {
                if a.error != ErrorCode::None {
                    return Err(ClientError::broker(a.error, Some("list offsets")));
                }
            }
            partitions.push(PartitionDescription {
                partition: p.partition,
                leader_broker: p.leader_broker,
                leader_host: md.broker(p.leader_broker).map(|b| b.host.clone()).unwrap_or_default(),
                leader_shard: p.leader_shard,
                leader_port: p.leader_port,
                leader_epoch: p.leader_epoch,
                start_offset: pair[0].offset.max(0) as u64,
                end_offset: pair[1].offset.max(0) as u64,
                offline: false,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
            });
        }
        for p in offline {
            partitions.push(PartitionDescription {
                partition: p.partition,
                leader_broker: -1,
                leader_host: String::new(),
                leader_shard: 0,
                leader_port: 0,
                leader_epoch: p.leader_epoch,
                start_offset: 0,
                end_offset: 0,
                offline: true,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
            });
        }
        partitions.sort_by_key(|p| p.partition);
        Ok(TopicDescription { name: name.to_string(), partitions, configs: topic.configs.clone() })
    }

    /// Raw cluster metadata for `topics` (all when `None`).
    pub async fn metadata(&self, topics: Option<&[String]>) -> Result<ClusterMetadata> {
        self.cluster.fetch_metadata(topics).await
    }
}

impl Admin {
    /// The group's client, kept so that repeated calls reuse the
    /// coordinator connection (one FindCoordinator per group, again only
    /// after `NotCoordinator`).
    fn group(&self, group: &str) -> Arc<GroupClient> {
        let mut groups = self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        groups
            .entry(group.to_string())
            .or_insert_with(|| Arc::new(GroupClient::new(self.cluster.clone(), group.to_string())))
            .clone()
    }

    /// Every consumer group, sorted by id.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        crate::group::wire::list_groups(&self.cluster).await
    }

    /// A group's state, protocol, members and their (opaque) assignments;
    /// `GroupIdNotFound` for a group that does not exist.
    pub async fn describe_group(&self, group: &str) -> Result<GroupDescription> {
        self.group(group).describe().await
    }

    /// The group's committed offsets (with each partition's log end).
    pub async fn group_offsets(&self, group: &str) -> Result<Vec<CommittedOffset>> {
        self.group(group).fetch_offsets(None).await
    }

    /// The group's committed offsets of `partitions` only.
    pub async fn group_offsets_of(
        &self,
        group: &str,
        partitions: &[(String, u32)],
    ) -> Result<Vec<CommittedOffset>> {
        self.group(group).fetch_offsets(Some(partitions)).await
    }

    /// Sets committed offsets of a group from outside it: the coordinator
    /// accepts it only while the group has no members.
    pub async fn alter_group_offsets(&self, group: &str, offsets: &[(String, u32, u64)]) -> Result<()> {
        let refused = self.group(group).commit(-1, "", None, offsets).await?;
        match refused.first() {
            None => Ok(()),
            Some((t, p, code)) => Err(ClientError::broker(*code, Some(&format!("offset of {t}/{p}")))),
        }
    }

    /// Per partition of `topic`: the first offset whose record's timestamp
    /// is at or after `timestamp_ms` (the log end when none is).
    pub async fn offsets_for_time(&self, topic: &str, timestamp_ms: i64) -> Result<Vec<(u32, u64)>> {
        let d = self.describe_topic(topic).await?;
        let queries: Vec<OffsetQuery> = d
            .partitions
            .iter()
            .map(|p| OffsetQuery {
                topic: topic.to_string(),
                partition: p.partition,
                timestamp: timestamp_ms.max(0),
            })
            .collect();
        let answers = self.cluster.list_offsets(&queries).await?;
        d.partitions
            .iter()
            .zip(answers)
            .map(|(p, a)| {
                if a.error != ErrorCode::None {
                    return Err(ClientError::broker(a.error, Some("list offsets")));
                }
                Ok((p.partition, u64::try_from(a.offset).unwrap_or(p.end_offset)))
            })
            .collect()
    }

    /// Deletes an empty group and its offsets (`NonEmptyGroup` otherwise).
    pub async fn delete_group(&self, group: &str) -> Result<()> {
        self.group(group).delete().await
    }
}

/// Whether a topic is one the broker keeps for itself (its name starts with
/// `__`, as `__consumer_offsets`); `list_topics` leaves these out, as
/// Kafka's admin client does.
#[must_use]
pub fn is_internal_topic(name: &str) -> bool {
    name.starts_with("__")
}
