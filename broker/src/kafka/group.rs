//! The Kafka group APIs, mapped one to one onto the group coordinator
//! (`group::route`): Kafka consumers join, rebalance, heartbeat, commit and
//! fetch offsets through the same state machines and `__consumer_offsets`
//! records as native consumers, so `shardlog group describe` shows them.
//! The coordinator of a group is the Kafka node of the shard that owns the
//! group's offsets partition (`group::coordinator_of`).
//!
//! Fields a request version lacks keep their defaults in the response (the
//! encoder refuses them otherwise), hence the version checks below.

use super::api::{encoded, name, s, Answer};
use super::error_code;
use crate::group;
use crate::group::api::*;
use crate::shard::ShardContext;
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use shardlog_schema::wire::ErrorCode;
use std::rc::Rc;
use std::time::Duration;

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|v| v.to_string())
}

fn ms(v: i32) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

fn code<T>(r: &Result<T, GroupError>) -> i16 {
    r.as_ref().err().map_or(0, |e| error_code(e.code))
}

fn unexpected(r: &GroupResponse) -> GroupError {
    GroupError::new(ErrorCode::Unknown, format!("unexpected coordinator answer {r:?}"))
}

pub(super) fn find_coordinator(ctx: &ShardContext, req: FindCoordinatorRequest, version: i16) -> Answer {
    let mut r = FindCoordinatorResponse::default();
    let locate = |key: &str| -> Result<(i32, String, i32), GroupError> {
        if req.key_type != 0 {
            return Err(GroupError::new(ErrorCode::InvalidRequest, "only group coordinators (key type 0)"));
        }
        let (node, host, port) = super::coordinator_node(ctx, key)?;
        Ok((node, host, i32::from(port)))
    };
    if version >= 4 {
        for key in &req.coordinator_keys {
            let mut c = find_coordinator_response::Coordinator::default();
            c.key = key.clone();
            match locate(key) {
                Ok((node, host, port)) => {
                    c.node_id = BrokerId(node);
                    c.host = s(&host);
                    c.port = port;
                }
                Err(e) => {
                    c.error_code = error_code(e.code);
                    c.error_message = Some(s(&e.message));
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                }
            }
            r.coordinators.push(c);
        }
    } else {
        match locate(&req.key) {
            Ok((node, host, port)) => {
                r.node_id = BrokerId(node);
                r.host = s(&host);
                r.port = port;
            }
            Err(e) => {
                r.error_code = error_code(e.code);
                if version >= 1 {
                    r.error_message = Some(s(&e.message));
                }
                r.node_id = BrokerId(-1);
                r.port = -1;
            }
        }
    }
    encoded(&r, version)
}

pub(super) async fn join(
    ctx: &Rc<ShardContext>,
    req: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> Answer {
    let join = JoinGroup {
        group_id: req.group_id.0.to_string(),
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
        client_id,
        client_host,
        session_timeout: ms(req.session_timeout_ms),
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout: ms(if version >= 1 { req.rebalance_timeout_ms } else { req.session_timeout_ms }),
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| Protocol { name: p.name.to_string(), metadata: p.metadata.to_vec() })
            .collect(),
    };
    let mut r = JoinGroupResponse::default();
    match group::route(ctx, GroupRequest::Join(join)).await {
        GroupResponse::Join(Ok(j)) => {
            r.generation_id = j.generation;
            if version >= 7 {
                r.protocol_type = Some(s(&j.protocol_type));
            }
            r.protocol_name = Some(s(&j.protocol));
            r.leader = s(&j.leader);
            r.member_id = s(&j.member_id);
            if version >= 9 {
                r.skip_assignment = j.skip_assignment;
            }
            r.members = j
                .members
                .into_iter()
                .map(|m| {
                    let mut out = join_group_response::JoinGroupResponseMember::default();
                    out.member_id = s(&m.member_id);
                    if version >= 5 {
                        out.group_instance_id = m.instance_id.as_deref().map(s);
                    }
                    out.metadata = Bytes::from(m.metadata);
                    out
                })
                .collect();
        }
        other => {
            let e = match other {
                GroupResponse::Join(Err(e)) => e,
                other => unexpected(&other),
            };
            r.error_code = error_code(e.code);
            r.generation_id = -1;
            // Kafka's clients keep the member id they sent.
            r.member_id = req.member_id.clone();
            if version < 7 {
                r.protocol_name = Some(StrBytes::default());
            }
        }
    }
    encoded(&r, version)
}

pub(super) async fn sync(ctx: &Rc<ShardContext>, req: SyncGroupRequest, version: i16) -> Answer {
    let sync = SyncGroup {
        group_id: req.group_id.0.to_string(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
        assignments: req
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.to_vec()))
            .collect(),
    };
    let mut r = SyncGroupResponse::default();
    match group::route(ctx, GroupRequest::Sync(sync)).await {
        GroupResponse::Sync(Ok(synced)) => {
            if version >= 5 {
                r.protocol_type = Some(s(&synced.protocol_type));
                r.protocol_name = Some(s(&synced.protocol));
            }
            r.assignment = Bytes::from(synced.assignment);
        }
        GroupResponse::Sync(Err(e)) => r.error_code = error_code(e.code),
        other => r.error_code = error_code(unexpected(&other).code),
    }
    encoded(&r, version)
}

pub(super) async fn heartbeat(ctx: &Rc<ShardContext>, req: HeartbeatRequest, version: i16) -> Answer {
    let hb = Heartbeat {
        group_id: req.group_id.0.to_string(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
    };
    let mut r = HeartbeatResponse::default();
    r.error_code = match group::route(ctx, GroupRequest::Heartbeat(hb)).await {
        GroupResponse::Heartbeat(result) => code(&result),
        other => error_code(unexpected(&other).code),
    };
    encoded(&r, version)
}

pub(super) async fn leave(ctx: &Rc<ShardContext>, req: LeaveGroupRequest, version: i16) -> Answer {
    // v0-2 name one member; v3 and later a list (static members by instance id).
    let members: Vec<LeaveMember> = if version >= 3 {
        req.members
            .iter()
            .map(|m| LeaveMember {
                member_id: m.member_id.to_string(),
                instance_id: opt(&m.group_instance_id),
            })
            .collect()
    } else {
        vec![LeaveMember { member_id: req.member_id.to_string(), instance_id: None }]
    };
    let leave = LeaveGroup { group_id: req.group_id.0.to_string(), members };
    let mut r = LeaveGroupResponse::default();
    match group::route(ctx, GroupRequest::Leave(leave)).await {
        GroupResponse::Leave(Ok(results)) => {
            if version >= 3 {
                for (m, result) in results {
                    let mut out = leave_group_response::MemberResponse::default();
                    out.member_id = s(&m.member_id);
                    out.group_instance_id = m.instance_id.as_deref().map(s);
                    out.error_code = code(&result);
                    r.members.push(out);
                }
            } else if let Some((_, result)) = results.first() {
                r.error_code = code(result);
            }
        }
        GroupResponse::Leave(Err(e)) => r.error_code = error_code(e.code),
        other => r.error_code = error_code(unexpected(&other).code),
    }
    encoded(&r, version)
}

pub(super) async fn offset_commit(ctx: &Rc<ShardContext>, req: OffsetCommitRequest, version: i16) -> Answer {
    let mut partitions = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            partitions.push(CommitPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index as u32,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map_or(String::new(), |m| m.to_string()),
            });
        }
    }
    let commit = OffsetCommit {
        group_id: req.group_id.0.to_string(),
        generation: req.generation_id_or_member_epoch,
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
        partitions: partitions.clone(),
    };
    let outcomes: Vec<(String, u32, i16)> = match group::route(ctx, GroupRequest::Commit(commit)).await {
        GroupResponse::Commit(Ok(outcomes)) => {
            outcomes.into_iter().map(|o| (o.topic, o.partition, code(&o.result))).collect()
        }
        other => {
            let e = match other {
                GroupResponse::Commit(Err(e)) => e,
                other => unexpected(&other),
            };
            partitions.into_iter().map(|p| (p.topic, p.partition, error_code(e.code))).collect()
        }
    };
    let mut r = OffsetCommitResponse::default();
    for (topic, partition, error) in outcomes {
        let mut p = offset_commit_response::OffsetCommitResponsePartition::default();
        p.partition_index = partition as i32;
        p.error_code = error;
        match r.topics.last_mut() {
            Some(t) if t.name.0.as_str() == topic => t.partitions.push(p),
            _ => {
                let mut t = offset_commit_response::OffsetCommitResponseTopic::default();
                t.name = name(&topic);
                t.partitions.push(p);
                r.topics.push(t);
            }
        }
    }
    encoded(&r, version)
}

pub(super) async fn offset_fetch(ctx: &Rc<ShardContext>, req: OffsetFetchRequest, version: i16) -> Answer {
    let partitions = req.topics.as_ref().map(|ts| {
        ts.iter()
            .flat_map(|t| t.partition_indexes.iter().map(|p| (t.name.0.to_string(), *p as u32)))
            .collect::<Vec<_>>()
    });
    let fetch = OffsetFetch { group_id: req.group_id.0.to_string(), partitions };
    let mut r = OffsetFetchResponse::default();
    match group::route(ctx, GroupRequest::FetchOffsets(fetch)).await {
        GroupResponse::FetchOffsets(Ok(offsets)) => {
            for o in offsets {
                let mut p = offset_fetch_response::OffsetFetchResponsePartition::default();
                p.partition_index = o.partition as i32;
                p.committed_offset = o.offset;
                if version >= 5 {
                    p.committed_leader_epoch = o.leader_epoch;
                }
                p.metadata = Some(s(&o.metadata));
                p.error_code = o.error.as_ref().map_or(0, |e| error_code(e.code));
                match r.topics.last_mut() {
                    Some(t) if t.name.0.as_str() == o.topic => t.partitions.push(p),
                    _ => {
                        let mut t = offset_fetch_response::OffsetFetchResponseTopic::default();
                        t.name = name(&o.topic);
                        t.partitions.push(p);
                        r.topics.push(t);
                    }
                }
            }
        }
        other => {
            let e = match other {
                GroupResponse::FetchOffsets(Err(e)) => e,
                other => unexpected(&other),
            };
            if version >= 2 {
                r.error_code = error_code(e.code);
            } else {
                // v1 has only per-partition errors.
                for t in req.topics.iter().flatten() {
                    let mut out = offset_fetch_response::OffsetFetchResponseTopic::default();
                    out.name = t.name.clone();
                    for p in &t.partition_indexes {
                        let mut part = offset_fetch_response::OffsetFetchResponsePartition::default();
                        part.partition_index = *p;
                        part.committed_offset = -1;
                        part.error_code = error_code(e.code);
                        out.partitions.push(part);
                    }
                    r.topics.push(out);
                }
            }
        }
    }
    encoded(&r, version)
}

pub(super) async fn list_groups(ctx: &Rc<ShardContext>, req: ListGroupsRequest, version: i16) -> Answer {
    let mut r = ListGroupsResponse::default();
    match group::list_all(ctx).await {
        Ok(groups) => {
            for g in groups {
                if !req.states_filter.is_empty()
                    && !req.states_filter.iter().any(|f| f.eq_ignore_ascii_case(g.state))
                {
                    continue;
                }
                let mut out = list_groups_response::ListedGroup::default();
                out.group_id = GroupId(s(&g.group_id));
                out.protocol_type = s(&g.protocol_type);
                if version >= 4 {
                    out.group_state = s(g.state);
                }
                if version >= 5 {
                    out.group_type = s("classic");
                }
                r.groups.push(out);
            }
        }
        Err(e) => r.error_code = error_code(e.code),
    }
    encoded(&r, version)
}

pub(super) async fn describe_groups(
    ctx: &Rc<ShardContext>,
    req: DescribeGroupsRequest,
    version: i16,
) -> Answer {
    let mut r = DescribeGroupsResponse::default();
    for id in req.groups {
        let mut out = describe_groups_response::DescribedGroup::default();
        out.group_id = id.clone();
        match group::route(ctx, GroupRequest::Describe(id.0.to_string())).await {
            GroupResponse::Describe(Ok(g)) => {
                out.group_state = s(g.state);
                out.protocol_type = s(&g.protocol_type);
                out.protocol_data = s(&g.protocol);
                out.members = g
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut dm = describe_groups_response::DescribedGroupMember::default();
                        dm.member_id = s(&m.member_id);
                        if version >= 4 {
                            dm.group_instance_id = m.instance_id.as_deref().map(s);
                        }
                        dm.client_id = s(&m.client_id);
                        dm.client_host = s(&m.client_host);
                        dm.member_metadata = Bytes::from(m.metadata);
                        dm.member_assignment = Bytes::from(m.assignment);
                        dm
                    })
                    .collect();
            }
            GroupResponse::Describe(Err(e)) if e.code == ErrorCode::GroupIdNotFound => {
                // Kafka describes an unknown group as Dead, without an error.
                out.group_state = s("Dead");
            }
            GroupResponse::Describe(Err(e)) => out.error_code = error_code(e.code),
            other => out.error_code = error_code(unexpected(&other).code),
        }
        r.groups.push(out);
    }
    encoded(&r, version)
}

pub(super) async fn delete_groups(ctx: &Rc<ShardContext>, req: DeleteGroupsRequest, version: i16) -> Answer {
    let mut r = DeleteGroupsResponse::default();
    for id in req.groups_names {
        let mut out = delete_groups_response::DeletableGroupResult::default();
        out.error_code = match group::route(ctx, GroupRequest::Delete(id.0.to_string())).await {
            GroupResponse::Delete(result) => code(&result),
            other => error_code(unexpected(&other).code),
        };
        out.group_id = id;
        r.results.push(out);
    }
    encoded(&r, version)
}
