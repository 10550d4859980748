//! The consumer-group APIs: decode into `group::api` values, run on the
//! group's coordinating shard (`group::route`, over the mesh when it is
//! another shard), encode the answer. FindCoordinator and ListGroups are
//! answered here.

use super::{request_error, response, Outgoing};
use crate::group;
use crate::group::api::*;
use crate::shard::ShardContext;
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::rc::Rc;
use std::time::Duration;

fn opt_string(s: Option<&str>) -> Option<String> {
    s.filter(|s| !s.is_empty()).map(str::to_string)
}

fn ms(v: i32) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

/// Decodes a group request's body; `None` when it has none.
fn decode(frame: &wire::RequestFrame<'_>) -> Option<GroupRequest> {
    let client_id = frame.client_id().unwrap_or_default().to_string();
    Some(match frame.api_key() {
        ApiKey::JoinGroup => {
            let r = frame.body_as_join_group_request()?;
            let session = ms(r.session_timeout_ms());
            GroupRequest::Join(JoinGroup {
                group_id: r.group_id().unwrap_or_default().to_string(),
                member_id: r.member_id().unwrap_or_default().to_string(),
                instance_id: opt_string(r.group_instance_id()),
                client_id,
                client_host: String::new(),
                session_timeout: session,
                rebalance_timeout: if r.rebalance_timeout_ms() < 0 {
                    session
                } else {
                    ms(r.rebalance_timeout_ms())
                },
                protocol_type: r.protocol_type().unwrap_or_default().to_string(),
                protocols: r
                    .protocols()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| Protocol {
                                name: p.name().unwrap_or_default().to_string(),
                                metadata: p.metadata().map(|m| m.bytes().to_vec()).unwrap_or_default(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        ApiKey::SyncGroup => {
            let r = frame.body_as_sync_group_request()?;
            GroupRequest::Sync(SyncGroup {
                group_id: r.group_id().unwrap_or_default().to_string(),
                generation: r.generation_id(),
                member_id: r.member_id().unwrap_or_default().to_string(),
                instance_id: opt_string(r.group_instance_id()),
                assignments: r
                    .assignments()
                    .map(|xs| {
                        xs.iter()
                            .map(|a| {
                                (
                                    a.member_id().unwrap_or_default().to_string(),
                                    a.assignment().map(|b| b.bytes().to_vec()).unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        ApiKey::Heartbeat => {
            let r = frame.body_as_heartbeat_request()?;
            GroupRequest::Heartbeat(Heartbeat {
                group_id: r.group_id().unwrap_or_default().to_string(),
                generation: r.generation_id(),
                member_id: r.member_id().unwrap_or_default().to_string(),
                instance_id: opt_string(r.group_instance_id()),
            })
        }
        ApiKey::LeaveGroup => {
            let r = frame.body_as_leave_group_request()?;
            GroupRequest::Leave(LeaveGroup {
                group_id: r.group_id().unwrap_or_default().to_string(),
                members: r
                    .members()
                    .map(|ms| {
                        ms.iter()
                            .map(|m| LeaveMember {
                                member_id: m.member_id().unwrap_or_default().to_string(),
                                instance_id: opt_string(m.group_instance_id()),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        ApiKey::OffsetCommit => {
            let r = frame.body_as_offset_commit_request()?;
            GroupRequest::Commit(OffsetCommit {
                group_id: r.group_id().unwrap_or_default().to_string(),
                generation: r.generation_id(),
                member_id: r.member_id().unwrap_or_default().to_string(),
                instance_id: opt_string(r.group_instance_id()),
                partitions: r
                    .partitions()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| CommitPartition {
                                topic: p.topic().unwrap_or_default().to_string(),
                                partition: p.partition(),
                                offset: p.offset(),
                                leader_epoch: p.leader_epoch(),
                                metadata: p.metadata().unwrap_or_default().to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        ApiKey::OffsetFetch => {
            let r = frame.body_as_offset_fetch_request()?;
            GroupRequest::FetchOffsets(OffsetFetch {
                group_id: r.group_id().unwrap_or_default().to_string(),
                partitions: r.partitions().map(|ps| {
                    ps.iter().map(|p| (p.topic().unwrap_or_default().to_string(), p.partition())).collect()
                }),
            })
        }
        _ => return None,
    })
}

/// Handles FindCoordinator, the group APIs and List/Describe/DeleteGroups.
pub(super) async fn handle(ctx: &Rc<ShardContext>, corr: u32, frame: wire::RequestFrame<'_>) -> Outgoing {
    let key = frame.api_key();
    let missing = || request_error(corr, key, ErrorCode::InvalidRequest, "missing body");
    match key {
        ApiKey::FindCoordinator => match frame.body_as_find_coordinator_request() {
            Some(r) => Outgoing::Frame(find_coordinator(ctx, corr, r)),
            None => missing(),
        },
        ApiKey::ListGroups => match frame.body_as_list_groups_request() {
            Some(r) => {
                let states: Vec<String> =
                    r.states_filter().map(|s| s.iter().map(str::to_string).collect()).unwrap_or_default();
                Outgoing::Frame(list_groups(corr, group::list_all(ctx).await, &states))
            }
            None => missing(),
        },
        ApiKey::DescribeGroups => match frame.body_as_describe_groups_request() {
            Some(r) => {
                let out = per_group(ctx, r.groups(), GroupRequest::Describe, |resp| match resp {
                    GroupResponse::Describe(d) => d,
                    other => Err(unexpected(&other)),
                })
                .await;
                Outgoing::Frame(describe_groups(corr, &out))
            }
            None => missing(),
        },
        ApiKey::DeleteGroups => match frame.body_as_delete_groups_request() {
            Some(r) => {
                let out = per_group(ctx, r.groups(), GroupRequest::Delete, |resp| match resp {
                    GroupResponse::Delete(d) => d,
                    other => Err(unexpected(&other)),
                })
                .await;
                Outgoing::Frame(delete_groups(corr, &out))
            }
            None => missing(),
        },
        _ => match decode(&frame) {
            Some(req) => Outgoing::Frame(encode(corr, group::route(ctx, req).await)),
            None => missing(),
        },
    }
}

/// Runs one request per named group on its coordinator, in order.
async fn per_group<T>(
    ctx: &Rc<ShardContext>,
    groups: Option<flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<&str>>>,
    request: fn(String) -> GroupRequest,
    answer: fn(GroupResponse) -> GroupResult<T>,
) -> Vec<(String, GroupResult<T>)> {
    let ids: Vec<String> = groups.map(|g| g.iter().map(str::to_string).collect()).unwrap_or_default();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let result = answer(group::route(ctx, request(id.clone())).await);
        out.push((id, result));
    }
    out
}

fn unexpected(r: &GroupResponse) -> GroupError {
    GroupError::new(ErrorCode::Unknown, format!("unexpected coordinator answer {r:?}"))
}

fn find_coordinator(ctx: &ShardContext, corr: u32, r: wire::FindCoordinatorRequest<'_>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let group = r.key().unwrap_or_default();
    let args = if r.key_type() != 0 {
        let msg = fbb.create_string(&format!("key type {} is not supported (0: group)", r.key_type()));
        wire::FindCoordinatorResponseArgs {
            error: ErrorCode::InvalidRequest,
            error_message: Some(msg),
            ..Default::default()
        }
    } else {
        match group::locate_coordinator(ctx, group) {
            Ok(c) => {
                let host = fbb.create_string(&c.host);
                wire::FindCoordinatorResponseArgs {
                    error: ErrorCode::None,
                    error_message: None,
                    broker_id: c.broker_id,
                    host: Some(host),
                    port: c.port,
                    shard: c.shard,
                    shard_port: c.shard_port,
                    partition: c.partition,
                }
            }
            Err(e) => {
                let msg = fbb.create_string(&e.message);
                wire::FindCoordinatorResponseArgs {
                    error: e.code,
                    error_message: Some(msg),
                    ..Default::default()
                }
            }
        }
    };
    let body = wire::FindCoordinatorResponse::create(&mut fbb, &args);
    response(&mut fbb, corr, ApiKey::FindCoordinator, wire::ResponseBody::FindCoordinatorResponse, body, 0)
}

/// The code and message of a result, for a response's error fields.
fn code_of<'a, T>(
    fbb: &mut FlatBufferBuilder<'a>,
    r: &GroupResult<T>,
) -> (ErrorCode, Option<WIPOffset<&'a str>>) {
    match r {
        Ok(_) => (ErrorCode::None, None),
        Err(e) => (e.code, Some(fbb.create_string(&e.message))),
    }
}

fn bytes<'a>(fbb: &mut FlatBufferBuilder<'a>, b: &[u8]) -> Option<WIPOffset<flatbuffers::Vector<'a, u8>>> {
    Some(fbb.create_vector(b))
}

fn string<'a>(fbb: &mut FlatBufferBuilder<'a>, s: &str) -> Option<WIPOffset<&'a str>> {
    Some(fbb.create_string(s))
}

fn opt<'a>(fbb: &mut FlatBufferBuilder<'a>, s: Option<&str>) -> Option<WIPOffset<&'a str>> {
    s.map(|s| fbb.create_string(s))
}

/// Encodes a coordinator's answer to Join, Sync, Heartbeat, Leave,
/// OffsetCommit or OffsetFetch.
fn encode(corr: u32, resp: GroupResponse) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(512);
    let fbb = &mut fbb;
    match resp {
        GroupResponse::Join(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let args = match &r {
                Ok(j) => {
                    let members: Vec<_> = j
                        .members
                        .iter()
                        .map(|m| {
                            let args = wire::JoinGroupMemberArgs {
                                member_id: string(fbb, &m.member_id),
                                group_instance_id: opt(fbb, m.instance_id.as_deref()),
                                metadata: bytes(fbb, &m.metadata),
                            };
                            wire::JoinGroupMember::create(fbb, &args)
                        })
                        .collect();
                    wire::JoinGroupResponseArgs {
                        error,
                        error_message,
                        generation_id: j.generation,
                        protocol_type: string(fbb, &j.protocol_type),
                        protocol_name: string(fbb, &j.protocol),
                        leader: string(fbb, &j.leader),
                        member_id: string(fbb, &j.member_id),
                        members: Some(fbb.create_vector(&members)),
                        skip_assignment: j.skip_assignment,
                    }
                }
                Err(_) => wire::JoinGroupResponseArgs {
                    error,
                    error_message,
                    generation_id: -1,
                    ..Default::default()
                },
            };
            let body = wire::JoinGroupResponse::create(fbb, &args);
            response(fbb, corr, ApiKey::JoinGroup, wire::ResponseBody::JoinGroupResponse, body, 0)
        }
        GroupResponse::Sync(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let args = match &r {
                Ok(s) => wire::SyncGroupResponseArgs {
                    error,
                    error_message,
                    protocol_type: string(fbb, &s.protocol_type),
                    protocol_name: string(fbb, &s.protocol),
                    assignment: bytes(fbb, &s.assignment),
                },
                Err(_) => wire::SyncGroupResponseArgs { error, error_message, ..Default::default() },
            };
            let body = wire::SyncGroupResponse::create(fbb, &args);
            response(fbb, corr, ApiKey::SyncGroup, wire::ResponseBody::SyncGroupResponse, body, 0)
        }
        GroupResponse::Heartbeat(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let body =
                wire::HeartbeatResponse::create(fbb, &wire::HeartbeatResponseArgs { error, error_message });
            response(fbb, corr, ApiKey::Heartbeat, wire::ResponseBody::HeartbeatResponse, body, 0)
        }
        GroupResponse::Leave(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let members = r.as_ref().ok().map(|ms| {
                let ms: Vec<_> = ms
                    .iter()
                    .map(|(m, result)| {
                        let args = wire::LeaveGroupMemberResponseArgs {
                            member_id: string(fbb, &m.member_id),
                            group_instance_id: opt(fbb, m.instance_id.as_deref()),
                            error: result.as_ref().err().map_or(ErrorCode::None, |e| e.code),
                        };
                        wire::LeaveGroupMemberResponse::create(fbb, &args)
                    })
                    .collect();
                fbb.create_vector(&ms)
            });
            let body = wire::LeaveGroupResponse::create(
                fbb,
                &wire::LeaveGroupResponseArgs { error, error_message, members },
            );
            response(fbb, corr, ApiKey::LeaveGroup, wire::ResponseBody::LeaveGroupResponse, body, 0)
        }
        GroupResponse::Commit(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let partitions = r.as_ref().ok().map(|ps| {
                let ps: Vec<_> = ps
                    .iter()
                    .map(|p| {
                        let (error, error_message) = code_of(fbb, &p.result);
                        let args = wire::OffsetCommitPartitionResponseArgs {
                            topic: string(fbb, &p.topic),
                            partition: p.partition,
                            error,
                            error_message,
                        };
                        wire::OffsetCommitPartitionResponse::create(fbb, &args)
                    })
                    .collect();
                fbb.create_vector(&ps)
            });
            let args = wire::OffsetCommitResponseArgs { error, error_message, partitions };
            let body = wire::OffsetCommitResponse::create(fbb, &args);
            response(fbb, corr, ApiKey::OffsetCommit, wire::ResponseBody::OffsetCommitResponse, body, 0)
        }
        GroupResponse::FetchOffsets(r) => {
            let (error, error_message) = code_of(fbb, &r);
            let partitions = r.as_ref().ok().map(|ps| {
                let ps: Vec<_> = ps
                    .iter()
                    .map(|p| {
                        let args = wire::OffsetFetchPartitionResponseArgs {
                            topic: string(fbb, &p.topic),
                            partition: p.partition,
                            offset: p.offset,
                            leader_epoch: p.leader_epoch,
                            metadata: (!p.metadata.is_empty()).then(|| fbb.create_string(&p.metadata)),
                            error: p.error.as_ref().map_or(ErrorCode::None, |e| e.code),
                            log_end_offset: p.log_end_offset,
                        };
                        wire::OffsetFetchPartitionResponse::create(fbb, &args)
                    })
                    .collect();
                fbb.create_vector(&ps)
            });
            let args = wire::OffsetFetchResponseArgs { error, error_message, partitions };
            let body = wire::OffsetFetchResponse::create(fbb, &args);
            response(fbb, corr, ApiKey::OffsetFetch, wire::ResponseBody::OffsetFetchResponse, body, 0)
        }
        GroupResponse::Describe(_) | GroupResponse::Delete(_) => {
            let mut out = Vec::new();
            shardlog_schema::frame::error_response(
                corr,
                ApiKey::DescribeGroups,
                ErrorCode::Unknown,
                "misrouted",
                &mut out,
            );
            out
        }
    }
}

fn list_groups(corr: u32, groups: GroupResult<Vec<ListedGroup>>, states: &[String]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(512);
    let fbb = &mut fbb;
    let (error, error_message) = code_of(fbb, &groups);
    let listed = groups.as_ref().ok().map(|gs| {
        let gs: Vec<_> = gs
            .iter()
            .filter(|g| states.is_empty() || states.iter().any(|s| s.eq_ignore_ascii_case(g.state)))
            .map(|g| {
                let args = wire::ListedGroupArgs {
                    group_id: string(fbb, &g.group_id),
                    protocol_type: string(fbb, &g.protocol_type),
                    state: string(fbb, g.state),
                };
                wire::ListedGroup::create(fbb, &args)
            })
            .collect();
        fbb.create_vector(&gs)
    });
    let body = wire::ListGroupsResponse::create(
        fbb,
        &wire::ListGroupsResponseArgs { error, error_message, groups: listed },
    );
    response(fbb, corr, ApiKey::ListGroups, wire::ResponseBody::ListGroupsResponse, body, 0)
}

fn describe_groups(corr: u32, groups: &[(String, GroupResult<DescribedGroup>)]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(1024);
    let fbb = &mut fbb;
    let gs: Vec<_> = groups
        .iter()
        .map(|(id, r)| {
            let (error, error_message) = code_of(fbb, r);
            let args = match r {
                Ok(g) => {
                    let members: Vec<_> = g
                        .members
                        .iter()
                        .map(|m| {
                            let args = wire::DescribedMemberArgs {
                                member_id: string(fbb, &m.member_id),
                                group_instance_id: opt(fbb, m.instance_id.as_deref()),
                                client_id: string(fbb, &m.client_id),
                                client_host: string(fbb, &m.client_host),
                                metadata: bytes(fbb, &m.metadata),
                                assignment: bytes(fbb, &m.assignment),
                            };
                            wire::DescribedMember::create(fbb, &args)
                        })
                        .collect();
                    wire::DescribedGroupArgs {
                        group_id: string(fbb, id),
                        error,
                        error_message,
                        state: string(fbb, g.state),
                        protocol_type: string(fbb, &g.protocol_type),
                        protocol: string(fbb, &g.protocol),
                        generation_id: g.generation,
                        leader: string(fbb, &g.leader),
                        members: Some(fbb.create_vector(&members)),
                    }
                }
                Err(_) => wire::DescribedGroupArgs {
                    group_id: string(fbb, id),
                    error,
                    error_message,
                    state: string(fbb, "Dead"),
                    generation_id: -1,
                    ..Default::default()
                },
            };
            wire::DescribedGroup::create(fbb, &args)
        })
        .collect();
    let gs = fbb.create_vector(&gs);
    let body =
        wire::DescribeGroupsResponse::create(fbb, &wire::DescribeGroupsResponseArgs { groups: Some(gs) });
    response(fbb, corr, ApiKey::DescribeGroups, wire::ResponseBody::DescribeGroupsResponse, body, 0)
}

fn delete_groups(corr: u32, groups: &[(String, GroupResult<()>)]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let fbb = &mut fbb;
    let rs: Vec<_> = groups
        .iter()
        .map(|(id, r)| {
            let (error, message) = code_of(fbb, r);
            let args = wire::GroupResultArgs { group_id: string(fbb, id), error, message };
            wire::GroupResult::create(fbb, &args)
        })
        .collect();
    let rs = fbb.create_vector(&rs);
    let body = wire::DeleteGroupsResponse::create(fbb, &wire::DeleteGroupsResponseArgs { results: Some(rs) });
    response(fbb, corr, ApiKey::DeleteGroups, wire::ResponseBody::DeleteGroupsResponse, body, 0)
}
