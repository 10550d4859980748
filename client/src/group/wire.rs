//! The group APIs on the wire: one call per request, sent to the group's
//! coordinator (found with FindCoordinator and cached; a retriable answer
//! such as `NotCoordinator` forgets it so the next call finds it again).

use crate::cluster::Cluster;
use crate::conn::Connection;
use crate::error::{ClientError, Result};
use crate::protocol::{envelope, missing_body, string_vector};
use flatbuffers::FlatBufferBuilder;
use shardlog_schema::wire::{self, ApiKey};
use shardlog_schema::ErrorCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A JoinGroup answer.
#[derive(Debug, Clone)]
pub struct JoinAnswer {
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// The leader only: (member id, instance id, metadata).
    pub members: Vec<(String, Option<String>, Vec<u8>)>,
    pub skip_assignment: bool,
}

/// A committed offset as OffsetFetch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: u32,
    /// `None`: nothing committed.
    pub offset: Option<u64>,
    pub metadata: String,
    /// The partition's high watermark as the coordinator saw it.
    pub log_end_offset: Option<u64>,
    pub error: ErrorCode,
}

/// A group as ListGroups names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: String,
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Vec<u8>,
    pub assignment: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub generation: i32,
    pub leader: String,
    pub members: Vec<MemberDescription>,
}

fn check(code: ErrorCode, message: Option<&str>) -> Result<()> {
    if code == ErrorCode::None {
        Ok(())
    } else {
        Err(ClientError::broker(code, message))
    }
}

fn s(v: Option<&str>) -> String {
    v.unwrap_or_default().to_string()
}

fn opt(v: Option<&str>) -> Option<String> {
    v.filter(|v| !v.is_empty()).map(str::to_string)
}

/// Group requests for one group id.
pub struct GroupClient {
    cluster: Arc<Cluster>,
    pub group_id: String,
    coordinator: Mutex<Option<Connection>>,
}

impl GroupClient {
    pub(crate) fn new(cluster: Arc<Cluster>, group_id: String) -> GroupClient {
        GroupClient { cluster, group_id, coordinator: Mutex::new(None) }
    }

    fn client_id(&self) -> String {
        self.cluster.config.client_id.clone()
    }

    fn cached(&self) -> Option<Connection> {
        self.coordinator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .filter(|c| !c.is_closed())
    }

    /// Forgets the coordinator (after `NotCoordinator` or a closed connection).
    pub fn forget_coordinator(&self) {
        *self.coordinator.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The coordinator's connection: FindCoordinator on the bootstrap
    /// broker, then its shard's own port.
    pub(crate) async fn coordinator(&self) -> Result<Connection> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let (group, client_id) = (self.group_id.clone(), self.client_id());
        let raw = self
            .cluster
            .bootstrap()
            .await?
            .call(
                move |corr| {
                    let mut fbb = FlatBufferBuilder::new();
                    let key = fbb.create_string(&group);
                    let body = wire::FindCoordinatorRequest::create(
                        &mut fbb,
                        &wire::FindCoordinatorRequestArgs { key: Some(key), key_type: 0 },
                    );
                    envelope(
                        fbb,
                        corr,
                        &client_id,
                        ApiKey::FindCoordinator,
                        wire::RequestBody::FindCoordinatorRequest,
                        body.as_union_value(),
                        0,
                    )
                },
                Vec::new(),
            )
            .await?;
        let frame = raw.frame(ApiKey::FindCoordinator)?;
        let r = frame.body_as_find_coordinator_response().ok_or_else(|| missing_body("FindCoordinator"))?;
        check(r.error(), r.error_message())?;
        let addr = format!("{}:{}", r.host().unwrap_or("127.0.0.1"), r.shard_port());
        let conn = self.cluster.connection(&addr).await?;
        *self.coordinator.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// Sends one request to the coordinator; `extra` is added to the
    /// request timeout (JoinGroup waits for the rebalance). A retriable
    /// failure forgets the coordinator and is returned.
    async fn call(
        &self,
        extra: Duration,
        encode: impl FnOnce(u32, &str) -> Vec<u8>,
    ) -> Result<crate::protocol::RawResponse> {
        let conn = self.coordinator().await?;
        let client_id = self.client_id();
        let result = match conn.submit(move |corr| encode(corr, &client_id), Vec::new(), true).await {
            Ok(p) => p.wait(extra).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            if e.is_retriable() {
                self.forget_coordinator();
            }
        }
        result
    }

    fn retriable_forget(&self, code: ErrorCode) {
        if matches!(code, ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable) {
            self.forget_coordinator();
        }
    }

    #[allow(clippy::too_many_arguments, reason = "one argument per JoinGroup field")]
    pub async fn join(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        session: Duration,
        rebalance: Duration,
        protocols: &[(String, Vec<u8>)],
    ) -> Result<JoinAnswer> {
        let group = self.group_id.clone();
        let (member_id, instance_id) = (member_id.to_string(), instance_id.map(str::to_string));
        let protocols = protocols.to_vec();
        // The coordinator holds a join until the rebalance completes (up to
        // the rebalance timeout, plus the initial delay of an empty group).
        let raw = self
            .call(rebalance + Duration::from_secs(5), move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let ps: Vec<_> = protocols
                    .iter()
                    .map(|(name, metadata)| {
                        let args = wire::GroupProtocolArgs {
                            name: Some(fbb.create_string(name)),
                            metadata: Some(fbb.create_vector(metadata)),
                        };
                        wire::GroupProtocol::create(&mut fbb, &args)
                    })
                    .collect();
                let args = wire::JoinGroupRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    session_timeout_ms: session.as_millis().try_into().unwrap_or(i32::MAX),
                    rebalance_timeout_ms: rebalance.as_millis().try_into().unwrap_or(i32::MAX),
                    member_id: Some(fbb.create_string(&member_id)),
                    group_instance_id: instance_id.as_deref().map(|i| fbb.create_string(i)),
                    protocol_type: Some(fbb.create_string("consumer")),
                    protocols: Some(fbb.create_vector(&ps)),
                    reason: None,
                };
                let body = wire::JoinGroupRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::JoinGroup,
                    wire::RequestBody::JoinGroupRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::JoinGroup)?;
        let r = frame.body_as_join_group_response().ok_or_else(|| missing_body("JoinGroup"))?;
        self.retriable_forget(r.error());
        check(r.error(), r.error_message())?;
        Ok(JoinAnswer {
            generation: r.generation_id(),
            protocol: s(r.protocol_name()),
            leader: s(r.leader()),
            member_id: s(r.member_id()),
            members: r
                .members()
                .map(|ms| {
                    ms.iter()
                        .map(|m| {
                            (
                                s(m.member_id()),
                                opt(m.group_instance_id()),
                                m.metadata().map(|b| b.bytes().to_vec()).unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            skip_assignment: r.skip_assignment(),
        })
    }

    /// SyncGroup: the leader passes every member's assignment; everyone
    /// gets their own. Waits (a follower) for the leader's.
    pub async fn sync(
        &self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        assignments: &[(String, Vec<u8>)],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        let group = self.group_id.clone();
        let (member_id, instance_id) = (member_id.to_string(), instance_id.map(str::to_string));
        let assignments = assignments.to_vec();
        let raw = self
            .call(wait, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let xs: Vec<_> = assignments
                    .iter()
                    .map(|(m, a)| {
                        let args = wire::SyncGroupAssignmentArgs {
                            member_id: Some(fbb.create_string(m)),
                            assignment: Some(fbb.create_vector(a)),
                        };
                        wire::SyncGroupAssignment::create(&mut fbb, &args)
                    })
                    .collect();
                let args = wire::SyncGroupRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    generation_id: generation,
                    member_id: Some(fbb.create_string(&member_id)),
                    group_instance_id: instance_id.as_deref().map(|i| fbb.create_string(i)),
                    protocol_type: Some(fbb.create_string("consumer")),
                    protocol_name: None,
                    assignments: Some(fbb.create_vector(&xs)),
                };
                let body = wire::SyncGroupRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::SyncGroup,
                    wire::RequestBody::SyncGroupRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::SyncGroup)?;
        let r = frame.body_as_sync_group_response().ok_or_else(|| missing_body("SyncGroup"))?;
        self.retriable_forget(r.error());
        check(r.error(), r.error_message())?;
        Ok(r.assignment().map(|a| a.bytes().to_vec()).unwrap_or_default())
    }

    pub async fn heartbeat(&self, generation: i32, member_id: &str, instance_id: Option<&str>) -> Result<()> {
        let group = self.group_id.clone();
        let (member_id, instance_id) = (member_id.to_string(), instance_id.map(str::to_string));
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let args = wire::HeartbeatRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    generation_id: generation,
                    member_id: Some(fbb.create_string(&member_id)),
                    group_instance_id: instance_id.as_deref().map(|i| fbb.create_string(i)),
                };
                let body = wire::HeartbeatRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::Heartbeat,
                    wire::RequestBody::HeartbeatRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::Heartbeat)?;
        let r = frame.body_as_heartbeat_response().ok_or_else(|| missing_body("Heartbeat"))?;
        self.retriable_forget(r.error());
        check(r.error(), r.error_message())
    }

    pub async fn leave(&self, member_id: &str, instance_id: Option<&str>) -> Result<()> {
        let group = self.group_id.clone();
        let (member_id, instance_id) = (member_id.to_string(), instance_id.map(str::to_string));
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let m = wire::LeaveGroupMemberArgs {
                    member_id: Some(fbb.create_string(&member_id)),
                    group_instance_id: instance_id.as_deref().map(|i| fbb.create_string(i)),
                    reason: None,
                };
                let m = wire::LeaveGroupMember::create(&mut fbb, &m);
                let args = wire::LeaveGroupRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    members: Some(fbb.create_vector(&[m])),
                };
                let body = wire::LeaveGroupRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::LeaveGroup,
                    wire::RequestBody::LeaveGroupRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::LeaveGroup)?;
        let r = frame.body_as_leave_group_response().ok_or_else(|| missing_body("LeaveGroup"))?;
        check(r.error(), r.error_message())?;
        match r.members().and_then(|ms| ms.iter().next()) {
            Some(m) => check(m.error(), Some("leave group")),
            None => Ok(()),
        }
    }

    /// Commits `offsets` (topic, partition, next offset to read). Generation
    /// -1 and an empty member id commit from outside the group (only while
    /// it is empty). Returns a per-partition error for partitions refused.
    pub async fn commit(
        &self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: &[(String, u32, u64)],
    ) -> Result<Vec<(String, u32, ErrorCode)>> {
        let group = self.group_id.clone();
        let (member_id, instance_id) = (member_id.to_string(), instance_id.map(str::to_string));
        let offsets = offsets.to_vec();
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let ps: Vec<_> = offsets
                    .iter()
                    .map(|(t, p, o)| {
                        let args = wire::OffsetCommitPartitionArgs {
                            topic: Some(fbb.create_string(t)),
                            partition: *p,
                            offset: i64::try_from(*o).unwrap_or(i64::MAX),
                            leader_epoch: -1,
                            metadata: None,
                        };
                        wire::OffsetCommitPartition::create(&mut fbb, &args)
                    })
                    .collect();
                let args = wire::OffsetCommitRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    generation_id: generation,
                    member_id: Some(fbb.create_string(&member_id)),
                    group_instance_id: instance_id.as_deref().map(|i| fbb.create_string(i)),
                    partitions: Some(fbb.create_vector(&ps)),
                };
                let body = wire::OffsetCommitRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::OffsetCommit,
                    wire::RequestBody::OffsetCommitRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::OffsetCommit)?;
        let r = frame.body_as_offset_commit_response().ok_or_else(|| missing_body("OffsetCommit"))?;
        self.retriable_forget(r.error());
        check(r.error(), r.error_message())?;
        Ok(r.partitions()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p.error() != ErrorCode::None)
                    .map(|p| (s(p.topic()), p.partition(), p.error()))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Committed offsets of `partitions` (or of every partition with one).
    pub async fn fetch_offsets(&self, partitions: Option<&[(String, u32)]>) -> Result<Vec<CommittedOffset>> {
        let group = self.group_id.clone();
        let partitions = partitions.map(<[_]>::to_vec);
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let ps = partitions.as_ref().map(|ps| {
                    let ps: Vec<_> = ps
                        .iter()
                        .map(|(t, p)| {
                            let args = wire::OffsetFetchPartitionArgs {
                                topic: Some(fbb.create_string(t)),
                                partition: *p,
                            };
                            wire::OffsetFetchPartition::create(&mut fbb, &args)
                        })
                        .collect();
                    fbb.create_vector(&ps)
                });
                let args = wire::OffsetFetchRequestArgs {
                    group_id: Some(fbb.create_string(&group)),
                    partitions: ps,
                };
                let body = wire::OffsetFetchRequest::create(&mut fbb, &args);
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::OffsetFetch,
                    wire::RequestBody::OffsetFetchRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::OffsetFetch)?;
        let r = frame.body_as_offset_fetch_response().ok_or_else(|| missing_body("OffsetFetch"))?;
        self.retriable_forget(r.error());
        check(r.error(), r.error_message())?;
        Ok(r.partitions()
            .map(|ps| {
                ps.iter()
                    .map(|p| CommittedOffset {
                        topic: s(p.topic()),
                        partition: p.partition(),
                        offset: u64::try_from(p.offset()).ok(),
                        metadata: s(p.metadata()),
                        log_end_offset: u64::try_from(p.log_end_offset()).ok(),
                        error: p.error(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    pub async fn describe(&self) -> Result<GroupDescription> {
        let group = self.group_id.clone();
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let groups = string_vector(&mut fbb, &[group]);
                let body = wire::DescribeGroupsRequest::create(
                    &mut fbb,
                    &wire::DescribeGroupsRequestArgs { groups: Some(groups) },
                );
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::DescribeGroups,
                    wire::RequestBody::DescribeGroupsRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::DescribeGroups)?;
        let r = frame.body_as_describe_groups_response().ok_or_else(|| missing_body("DescribeGroups"))?;
        let g = r.groups().and_then(|gs| gs.iter().next()).ok_or_else(|| missing_body("DescribeGroups"))?;
        check(g.error(), g.error_message())?;
        Ok(GroupDescription {
            group_id: s(g.group_id()),
            state: s(g.state()),
            protocol_type: s(g.protocol_type()),
            protocol: s(g.protocol()),
            generation: g.generation_id(),
            leader: s(g.leader()),
            members: g
                .members()
                .map(|ms| {
                    ms.iter()
                        .map(|m| MemberDescription {
                            member_id: s(m.member_id()),
                            instance_id: opt(m.group_instance_id()),
                            client_id: s(m.client_id()),
                            client_host: s(m.client_host()),
                            metadata: m.metadata().map(|b| b.bytes().to_vec()).unwrap_or_default(),
                            assignment: m.assignment().map(|b| b.bytes().to_vec()).unwrap_or_default(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    pub async fn delete(&self) -> Result<()> {
        let group = self.group_id.clone();
        let raw = self
            .call(Duration::ZERO, move |corr, client_id| {
                let mut fbb = FlatBufferBuilder::new();
                let groups = string_vector(&mut fbb, &[group]);
                let body = wire::DeleteGroupsRequest::create(
                    &mut fbb,
                    &wire::DeleteGroupsRequestArgs { groups: Some(groups) },
                );
                envelope(
                    fbb,
                    corr,
                    client_id,
                    ApiKey::DeleteGroups,
                    wire::RequestBody::DeleteGroupsRequest,
                    body.as_union_value(),
                    0,
                )
            })
            .await?;
        let frame = raw.frame(ApiKey::DeleteGroups)?;
        let r = frame.body_as_delete_groups_response().ok_or_else(|| missing_body("DeleteGroups"))?;
        let g = r.results().and_then(|gs| gs.iter().next()).ok_or_else(|| missing_body("DeleteGroups"))?;
        check(g.error(), g.message())
    }
}

/// Every group the broker coordinates (ListGroups; any shard answers for all).
pub(crate) async fn list_groups(cluster: &Cluster) -> Result<Vec<GroupListing>> {
    let client_id = cluster.config.client_id.clone();
    let raw = cluster
        .bootstrap()
        .await?
        .call(
            move |corr| {
                let mut fbb = FlatBufferBuilder::new();
                let body = wire::ListGroupsRequest::create(
                    &mut fbb,
                    &wire::ListGroupsRequestArgs { states_filter: None },
                );
                envelope(
                    fbb,
                    corr,
                    &client_id,
                    ApiKey::ListGroups,
                    wire::RequestBody::ListGroupsRequest,
                    body.as_union_value(),
                    0,
                )
            },
            Vec::new(),
        )
        .await?;
    let frame = raw.frame(ApiKey::ListGroups)?;
    let r = frame.body_as_list_groups_response().ok_or_else(|| missing_body("ListGroups"))?;
    check(r.error(), r.error_message())?;
    Ok(r.groups()
        .map(|gs| {
            gs.iter()
                .map(|g| GroupListing {
                    group_id: s(g.group_id()),
                    protocol_type: s(g.protocol_type()),
                    state: s(g.state()),
                })
                .collect()
        })
        .unwrap_or_default())
}
