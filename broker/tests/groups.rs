//! The group coordinator over real sockets, in raw frames (no client crate):
//! joins, syncs, heartbeats, expiry, commits, restarts, static members,
//! administration and the typed errors of each.

mod wire_support;

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::{start, BrokerHandle};
use shardlog_schema::types::OFFSETS_TOPIC;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::time::{Duration, Instant};
use wire_support::Conn;

fn broker(dir: &std::path::Path) -> BrokerHandle {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 2;
    config.pin_cores = false;
    config.group.initial_rebalance_delay = Duration::from_millis(200);
    config.group.session_timeout_min = Duration::from_millis(300);
    start(config).expect("broker starts")
}

#[derive(Debug, Clone)]
struct Joined {
    error: ErrorCode,
    generation: i32,
    leader: String,
    member_id: String,
    protocol: String,
    members: Vec<String>,
    skip_assignment: bool,
}

fn join(
    c: &mut Conn,
    group: &str,
    member: &str,
    instance: Option<&str>,
    protocols: &[&str],
    session_ms: i32,
) -> Joined {
    c.send(
        ApiKey::JoinGroup,
        |fbb| {
            let ps: Vec<_> = protocols
                .iter()
                .map(|p| {
                    let name = fbb.create_string(p);
                    let metadata = fbb.create_vector(format!("meta-{p}").as_bytes());
                    wire::GroupProtocol::create(
                        fbb,
                        &wire::GroupProtocolArgs { name: Some(name), metadata: Some(metadata) },
                    )
                })
                .collect();
            let args = wire::JoinGroupRequestArgs {
                group_id: Some(fbb.create_string(group)),
                session_timeout_ms: session_ms,
                rebalance_timeout_ms: 3000,
                member_id: Some(fbb.create_string(member)),
                group_instance_id: instance.map(|i| fbb.create_string(i)),
                protocol_type: Some(fbb.create_string("consumer")),
                protocols: Some(fbb.create_vector(&ps)),
                reason: None,
            };
            let body = wire::JoinGroupRequest::create(fbb, &args);
            (wire::RequestBody::JoinGroupRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_join_group_response().expect("join response");
    Joined {
        error: r.error(),
        generation: r.generation_id(),
        leader: r.leader().unwrap_or_default().to_string(),
        member_id: r.member_id().unwrap_or_default().to_string(),
        protocol: r.protocol_name().unwrap_or_default().to_string(),
        members: r
            .members()
            .map(|ms| ms.iter().map(|m| m.member_id().unwrap_or_default().to_string()).collect())
            .unwrap_or_default(),
        skip_assignment: r.skip_assignment(),
    }
}

fn sync(
    c: &mut Conn,
    group: &str,
    generation: i32,
    member: &str,
    assignments: &[(&str, &[u8])],
) -> (ErrorCode, Vec<u8>) {
    c.send(
        ApiKey::SyncGroup,
        |fbb| {
            let xs: Vec<_> = assignments
                .iter()
                .map(|(m, a)| {
                    let args = wire::SyncGroupAssignmentArgs {
                        member_id: Some(fbb.create_string(m)),
                        assignment: Some(fbb.create_vector(a)),
                    };
                    wire::SyncGroupAssignment::create(fbb, &args)
                })
                .collect();
            let args = wire::SyncGroupRequestArgs {
                group_id: Some(fbb.create_string(group)),
                generation_id: generation,
                member_id: Some(fbb.create_string(member)),
                assignments: Some(fbb.create_vector(&xs)),
                ..Default::default()
            };
            let body = wire::SyncGroupRequest::create(fbb, &args);
            (wire::RequestBody::SyncGroupRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_sync_group_response().expect("sync response");
    (r.error(), r.assignment().map(|a| a.bytes().to_vec()).unwrap_or_default())
}

fn heartbeat(c: &mut Conn, group: &str, generation: i32, member: &str) -> ErrorCode {
    c.send(
        ApiKey::Heartbeat,
        |fbb| {
            let args = wire::HeartbeatRequestArgs {
                group_id: Some(fbb.create_string(group)),
                generation_id: generation,
                member_id: Some(fbb.create_string(member)),
                group_instance_id: None,
            };
            let body = wire::HeartbeatRequest::create(fbb, &args);
            (wire::RequestBody::HeartbeatRequest, body.as_union_value())
        },
        &[],
    );
    c.recv().frame().body_as_heartbeat_response().expect("heartbeat response").error()
}

fn leave(c: &mut Conn, group: &str, member: &str) -> ErrorCode {
    c.send(
        ApiKey::LeaveGroup,
        |fbb| {
            let m = wire::LeaveGroupMemberArgs {
                member_id: Some(fbb.create_string(member)),
                ..Default::default()
            };
            let m = wire::LeaveGroupMember::create(fbb, &m);
            let args = wire::LeaveGroupRequestArgs {
                group_id: Some(fbb.create_string(group)),
                members: Some(fbb.create_vector(&[m])),
            };
            let body = wire::LeaveGroupRequest::create(fbb, &args);
            (wire::RequestBody::LeaveGroupRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_leave_group_response().expect("leave response");
    if r.error() != ErrorCode::None {
        return r.error();
    }
    r.members().map_or(ErrorCode::Unknown, |ms| ms.get(0).error())
}

/// Whole-request error, then per partition (topic, partition, error).
fn commit(
    c: &mut Conn,
    group: &str,
    generation: i32,
    member: &str,
    parts: &[(&str, u32, i64)],
) -> (ErrorCode, Vec<(String, u32, ErrorCode)>) {
    c.send(
        ApiKey::OffsetCommit,
        |fbb| {
            let ps: Vec<_> = parts
                .iter()
                .map(|(t, p, o)| {
                    let args = wire::OffsetCommitPartitionArgs {
                        topic: Some(fbb.create_string(t)),
                        partition: *p,
                        offset: *o,
                        leader_epoch: -1,
                        metadata: None,
                    };
                    wire::OffsetCommitPartition::create(fbb, &args)
                })
                .collect();
            let args = wire::OffsetCommitRequestArgs {
                group_id: Some(fbb.create_string(group)),
                generation_id: generation,
                member_id: Some(fbb.create_string(member)),
                group_instance_id: None,
                partitions: Some(fbb.create_vector(&ps)),
            };
            let body = wire::OffsetCommitRequest::create(fbb, &args);
            (wire::RequestBody::OffsetCommitRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_offset_commit_response().expect("commit response");
    let parts = r
        .partitions()
        .map(|ps| {
            ps.iter().map(|p| (p.topic().unwrap_or_default().to_string(), p.partition(), p.error())).collect()
        })
        .unwrap_or_default();
    (r.error(), parts)
}

/// (topic, partition, committed offset, log end offset) of every offset.
fn fetch_offsets(c: &mut Conn, group: &str) -> Vec<(String, u32, i64, i64)> {
    c.send(
        ApiKey::OffsetFetch,
        |fbb| {
            let args =
                wire::OffsetFetchRequestArgs { group_id: Some(fbb.create_string(group)), partitions: None };
            let body = wire::OffsetFetchRequest::create(fbb, &args);
            (wire::RequestBody::OffsetFetchRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_offset_fetch_response().expect("offset fetch response");
    assert_eq!(r.error(), ErrorCode::None);
    r.partitions()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (p.topic().unwrap_or_default().to_string(), p.partition(), p.offset(), p.log_end_offset())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Sends DescribeGroups for one group and hands its answer to `read`.
fn describe_with<T>(c: &mut Conn, group: &str, read: impl FnOnce(wire::DescribedGroup<'_>) -> T) -> T {
    c.send(
        ApiKey::DescribeGroups,
        |fbb| {
            let g = fbb.create_string(group);
            let args = wire::DescribeGroupsRequestArgs { groups: Some(fbb.create_vector(&[g])) };
            let body = wire::DescribeGroupsRequest::create(fbb, &args);
            (wire::RequestBody::DescribeGroupsRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_describe_groups_response().expect("describe response");
    read(r.groups().expect("groups").get(0))
}

/// (error, state, members, generation) of a group.
fn describe(c: &mut Conn, group: &str) -> (ErrorCode, String, usize, i32) {
    describe_with(c, group, |g| {
        (
            g.error(),
            g.state().unwrap_or_default().to_string(),
            g.members().map_or(0, |m| m.len()),
            g.generation_id(),
        )
    })
}

fn delete_group(c: &mut Conn, group: &str) -> ErrorCode {
    c.send(
        ApiKey::DeleteGroups,
        |fbb| {
            let g = fbb.create_string(group);
            let args = wire::DeleteGroupsRequestArgs { groups: Some(fbb.create_vector(&[g])) };
            let body = wire::DeleteGroupsRequest::create(fbb, &args);
            (wire::RequestBody::DeleteGroupsRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    resp.frame()
        .body_as_delete_groups_response()
        .expect("delete response")
        .results()
        .expect("results")
        .get(0)
        .error()
}

fn list_groups(c: &mut Conn) -> Vec<(String, String)> {
    c.send(
        ApiKey::ListGroups,
        |fbb| {
            let body =
                wire::ListGroupsRequest::create(fbb, &wire::ListGroupsRequestArgs { states_filter: None });
            (wire::RequestBody::ListGroupsRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_list_groups_response().expect("list response");
    r.groups()
        .map(|gs| {
            gs.iter()
                .map(|g| {
                    (g.group_id().unwrap_or_default().to_string(), g.state().unwrap_or_default().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// (error, shard, shard port) of FindCoordinator.
fn find_coordinator(c: &mut Conn, group: &str) -> (ErrorCode, u16, u16) {
    c.send(
        ApiKey::FindCoordinator,
        |fbb| {
            let args = wire::FindCoordinatorRequestArgs { key: Some(fbb.create_string(group)), key_type: 0 };
            let body = wire::FindCoordinatorRequest::create(fbb, &args);
            (wire::RequestBody::FindCoordinatorRequest, body.as_union_value())
        },
        &[],
    );
    let resp = c.recv();
    let r = resp.frame().body_as_find_coordinator_response().expect("find response");
    (r.error(), r.shard(), r.shard_port())
}

/// Two members join at once; the leader assigns; both get their share.
fn two_member_group(port: u16, group: &str) -> (Joined, Joined) {
    let g = group.to_string();
    let other = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        join(&mut c, &g, "", None, &["range"], 1000)
    });
    let mut c = Conn::open(port);
    let a = join(&mut c, group, "", None, &["range", "roundrobin"], 1000);
    let b = other.join().expect("member thread");
    assert_eq!((a.error, b.error), (ErrorCode::None, ErrorCode::None));
    (a, b)
}

#[test]
fn members_join_sync_commit_expire_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path());
    let port = handle.ready.listen.port();
    let mut c = Conn::open(port);
    assert_eq!(c.create_topic("events", 4), ErrorCode::None);

    // FindCoordinator names a shard and its own port, as group_partition says.
    let (e, shard, shard_port) = find_coordinator(&mut c, "g1");
    assert_eq!(e, ErrorCode::None);
    let p = shardlog_schema::types::group_partition("g1", 16);
    assert_eq!(shard, shardlog_schema::types::shard_for(OFFSETS_TOPIC, p, 2).0);
    assert_eq!(shard_port, handle.ready.shard_ports[shard as usize]);

    let (a, b) = two_member_group(port, "g1");
    assert_eq!(a.generation, 1);
    assert_eq!(b.generation, 1);
    assert_eq!(a.leader, b.leader);
    assert_eq!(a.protocol, "range", "the only protocol both support");
    let (leader, follower) = if a.leader == a.member_id { (a, b) } else { (b, a) };
    assert_eq!(leader.members.len(), 2);
    assert!(follower.members.is_empty(), "only the leader sees the members");

    // A follower's sync waits for the leader's assignment.
    let (g, f_id, gen) = ("g1".to_string(), follower.member_id.clone(), follower.generation);
    let waiting = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        sync(&mut c, &g, gen, &f_id, &[])
    });
    std::thread::sleep(Duration::from_millis(100));
    let (e, mine) = sync(
        &mut c,
        "g1",
        leader.generation,
        &leader.member_id,
        &[(&leader.member_id, b"L"), (&follower.member_id, b"F")],
    );
    assert_eq!((e, mine.as_slice()), (ErrorCode::None, &b"L"[..]));
    assert_eq!(waiting.join().expect("sync thread"), (ErrorCode::None, b"F".to_vec()));
    assert_eq!(heartbeat(&mut c, "g1", 1, &leader.member_id), ErrorCode::None);
    assert_eq!(describe(&mut c, "g1"), (ErrorCode::None, "Stable".into(), 2, 1));
    assert!(list_groups(&mut c).contains(&("g1".to_string(), "Stable".to_string())));

    // Commits: typed errors for a stale generation, a stranger and a partition that is not there.
    assert_eq!(
        commit(&mut c, "g1", 0, &leader.member_id, &[("events", 0, 5)]).0,
        ErrorCode::IllegalGeneration
    );
    assert_eq!(commit(&mut c, "g1", 1, "stranger", &[("events", 0, 5)]).0, ErrorCode::UnknownMemberId);
    assert_eq!(
        commit(&mut c, "g1", -1, "", &[("events", 0, 5)]).0,
        ErrorCode::UnknownMemberId,
        "not while members exist"
    );
    let (e, parts) =
        commit(&mut c, "g1", 1, &leader.member_id, &[("events", 0, 5), ("events", 9, 1), ("nope", 0, 1)]);
    assert_eq!(e, ErrorCode::None);
    assert_eq!(
        parts.iter().map(|p| p.2).collect::<Vec<_>>(),
        [ErrorCode::None, ErrorCode::UnknownTopicOrPartition, ErrorCode::UnknownTopicOrPartition]
    );
    assert_eq!(commit(&mut c, "g1", 1, &follower.member_id, &[("events", 1, 7)]).0, ErrorCode::None);
    assert_eq!(commit(&mut c, "g1", 1, &leader.member_id, &[("events", 0, 6)]).0, ErrorCode::None);
    assert_eq!(
        c.produce("events", 0, &wire_support::batch_of(&["x", "y", "z", "w", "v", "u", "t", "s"])).0,
        ErrorCode::None
    );
    assert_eq!(
        fetch_offsets(&mut c, "g1"),
        [("events".to_string(), 0, 6, 8), ("events".to_string(), 1, 7, 0)],
        "latest commit per partition, with the log end"
    );

    // The follower stops heartbeating: within its session (1 s) the leader
    // hears of a rebalance and, rejoining, is alone in generation 2.
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        match heartbeat(&mut c, "g1", 1, &leader.member_id) {
            ErrorCode::None => {
                assert!(started.elapsed() < Duration::from_secs(3), "the silent member was never expelled")
            }
            ErrorCode::RebalanceInProgress => break,
            other => panic!("heartbeat: {other:?}"),
        }
    }
    let again = join(&mut c, "g1", &leader.member_id, None, &["range"], 1000);
    assert_eq!((again.error, again.generation, again.members.len()), (ErrorCode::None, 2, 1));
    assert_eq!(sync(&mut c, "g1", 2, &leader.member_id, &[(&leader.member_id, b"all")]).0, ErrorCode::None);
    assert_eq!(heartbeat(&mut c, "g1", 1, &follower.member_id), ErrorCode::UnknownMemberId, "expelled");
    drop(c);
    handle.shutdown().expect("clean shutdown");

    // After a restart: offsets and the group (its generation and member) are back.
    let handle = broker(dir.path());
    let mut c = Conn::open(handle.ready.listen.port());
    assert_eq!(
        fetch_offsets(&mut c, "g1"),
        [("events".to_string(), 0, 6, 8), ("events".to_string(), 1, 7, 0)]
    );
    assert_eq!(describe(&mut c, "g1"), (ErrorCode::None, "Stable".into(), 1, 2));
    assert_eq!(heartbeat(&mut c, "g1", 2, &leader.member_id), ErrorCode::None);
    assert_eq!(sync(&mut c, "g1", 2, &leader.member_id, &[]), (ErrorCode::None, b"all".to_vec()));

    // Administration: an active group cannot be deleted; an empty one can.
    assert_eq!(delete_group(&mut c, "g1"), ErrorCode::NonEmptyGroup);
    assert_eq!(leave(&mut c, "g1", &leader.member_id), ErrorCode::None);
    assert_eq!(describe(&mut c, "g1").1, "Empty");
    assert_eq!(
        commit(&mut c, "g1", -1, "", &[("events", 0, 0)]).0,
        ErrorCode::None,
        "a reset of an empty group"
    );
    assert_eq!(fetch_offsets(&mut c, "g1")[0].2, 0);
    assert_eq!(delete_group(&mut c, "g1"), ErrorCode::None);
    assert_eq!(describe(&mut c, "g1").0, ErrorCode::GroupIdNotFound);
    assert_eq!(delete_group(&mut c, "g1"), ErrorCode::GroupIdNotFound);
    drop(c);
    handle.shutdown().expect("clean shutdown");

    // Deleted stays deleted after a restart (tombstones).
    let handle = broker(dir.path());
    let mut c = Conn::open(handle.ready.listen.port());
    assert_eq!(describe(&mut c, "g1").0, ErrorCode::GroupIdNotFound);
    assert!(fetch_offsets(&mut c, "g1").is_empty());
    drop(c);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn a_static_member_restarting_in_time_keeps_its_place_without_a_rebalance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path());
    let port = handle.ready.listen.port();
    let g = "static".to_string();
    let other = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        join(&mut c, &g, "", Some("worker-b"), &["range"], 2000)
    });
    let mut c = Conn::open(port);
    let a = join(&mut c, "static", "", Some("worker-a"), &["range"], 2000);
    let b = other.join().expect("thread");
    let (leader, follower) = if a.leader == a.member_id { (a, b) } else { (b, a) };
    let g = "static".to_string();
    let (f, gen) = (follower.member_id.clone(), follower.generation);
    let waiting = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        sync(&mut c, &g, gen, &f, &[])
    });
    std::thread::sleep(Duration::from_millis(100));
    let assignments = [(leader.member_id.as_str(), &b"L"[..]), (follower.member_id.as_str(), &b"F"[..])];
    assert_eq!(sync(&mut c, "static", leader.generation, &leader.member_id, &assignments).0, ErrorCode::None);
    assert_eq!(waiting.join().expect("thread").1, b"F");

    // The follower "restarts": a new connection, no member id, same instance id.
    let which = describe_instance(&mut c, "static", &follower.member_id);
    let mut c2 = Conn::open(port);
    let back = join(&mut c2, "static", "", Some(&which), &["range"], 2000);
    assert_eq!(back.error, ErrorCode::None);
    assert_eq!(back.generation, leader.generation, "no rebalance");
    assert_ne!(back.member_id, follower.member_id, "a new member id");
    assert!(!back.skip_assignment, "only a returning leader skips assigning");
    assert_eq!(
        sync(&mut c2, "static", back.generation, &back.member_id, &[]),
        (ErrorCode::None, b"F".to_vec())
    );
    assert_eq!(
        heartbeat(&mut c, "static", leader.generation, &leader.member_id),
        ErrorCode::None,
        "the leader saw no rebalance"
    );
    // The old incarnation is fenced.
    assert_eq!(
        heartbeat_static(&mut c, "static", leader.generation, &follower.member_id, &which),
        ErrorCode::FencedInstanceId
    );
    drop((c, c2));
    handle.shutdown().expect("clean shutdown");
}

/// The instance id of a member (from DescribeGroups).
fn describe_instance(c: &mut Conn, group: &str, member: &str) -> String {
    describe_with(c, group, |g| {
        let m = g
            .members()
            .expect("members")
            .iter()
            .find(|m| m.member_id() == Some(member))
            .expect("member listed");
        m.group_instance_id().expect("static").to_string()
    })
}

fn heartbeat_static(c: &mut Conn, group: &str, generation: i32, member: &str, instance: &str) -> ErrorCode {
    c.send(
        ApiKey::Heartbeat,
        |fbb| {
            let args = wire::HeartbeatRequestArgs {
                group_id: Some(fbb.create_string(group)),
                generation_id: generation,
                member_id: Some(fbb.create_string(member)),
                group_instance_id: Some(fbb.create_string(instance)),
            };
            let body = wire::HeartbeatRequest::create(fbb, &args);
            (wire::RequestBody::HeartbeatRequest, body.as_union_value())
        },
        &[],
    );
    c.recv().frame().body_as_heartbeat_response().expect("heartbeat response").error()
}

#[test]
fn bad_group_requests_get_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path());
    let mut c = Conn::open(handle.ready.listen.port());
    assert_eq!(join(&mut c, "g", "", None, &["range"], 10).error, ErrorCode::InvalidSessionTimeout);
    assert_eq!(join(&mut c, "g", "ghost", None, &["range"], 1000).error, ErrorCode::UnknownMemberId);
    assert_eq!(join(&mut c, "", "", None, &["range"], 1000).error, ErrorCode::InvalidGroupId);
    assert_eq!(join(&mut c, "g", "", None, &[], 1000).error, ErrorCode::InconsistentGroupProtocol);
    assert_eq!(find_coordinator(&mut c, "").0, ErrorCode::InvalidGroupId);
    let first = join(&mut c, "g", "", None, &["range"], 1000);
    assert_eq!(first.error, ErrorCode::None);
    let mut c2 = Conn::open(handle.ready.listen.port());
    assert_eq!(
        join(&mut c2, "g", "", None, &["roundrobin"], 1000).error,
        ErrorCode::InconsistentGroupProtocol,
        "no protocol in common"
    );
    assert_eq!(sync(&mut c, "g", 99, &first.member_id, &[]).0, ErrorCode::IllegalGeneration);
    assert_eq!(heartbeat(&mut c, "nosuch", 1, "m"), ErrorCode::UnknownMemberId);
    assert_eq!(describe(&mut c, "nosuch").0, ErrorCode::GroupIdNotFound);
    assert_eq!(delete_group(&mut c, "nosuch"), ErrorCode::GroupIdNotFound);
    // The internal topic is the coordinator's alone.
    assert_eq!(c.produce(OFFSETS_TOPIC, 0, &wire_support::batch_of(&["x"])).0, ErrorCode::InvalidTopicName);
    assert_eq!(c.delete_topic(OFFSETS_TOPIC), ErrorCode::InvalidTopicName);
    drop((c, c2));
    handle.shutdown().expect("clean shutdown");
}

/// `__consumer_offsets` is compacted: committing the same offsets over and
/// over keeps its partition near one segment of live keys, not the history,
/// and a restart still serves the latest commit of each partition.
#[test]
fn the_offsets_topic_stays_bounded_under_repeated_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let start_broker = || {
        let mut config = BrokerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
        config.shards = 1;
        config.pin_cores = false;
        config.group.offsets_topic_partitions = 1;
        config.group.offsets_topic_segment_bytes = 64 << 10;
        config.retention_check_interval = Duration::from_millis(100);
        start(config).expect("broker starts")
    };
    let partition_dir = dir.path().join(format!("{OFFSETS_TOPIC}-0"));
    let dir_bytes = || -> u64 {
        std::fs::read_dir(&partition_dir)
            .expect("offsets partition directory")
            .map(|e| e.expect("entry").metadata().expect("stat").len())
            .sum()
    };
    let handle = start_broker();
    let mut c = Conn::open(handle.ready.listen.port());
    assert_eq!(c.create_topic("busy", 4), ErrorCode::None);
    let rounds = 3000i64;
    for round in 1..=rounds {
        let parts: Vec<(&str, u32, i64)> = (0..4).map(|p| ("busy", p, round * 10 + i64::from(p))).collect();
        let (e, errs) = commit(&mut c, "steady", -1, "", &parts);
        assert_eq!(e, ErrorCode::None);
        assert!(errs.iter().all(|(_, _, e)| *e == ErrorCode::None), "{errs:?}");
    }
    // Every commit is a record of about 100 bytes: 3000 x 4 of them is
    // over 1 MiB of history; compaction keeps the live keys plus at most
    // the active segment and a sealed one not yet cleaned.
    let deadline = Instant::now() + Duration::from_secs(20);
    while dir_bytes() > 3 * (64 << 10) {
        assert!(Instant::now() < deadline, "offsets partition still {} bytes", dir_bytes());
        std::thread::sleep(Duration::from_millis(100));
    }
    let expect: Vec<(String, u32, i64)> =
        (0..4).map(|p| ("busy".to_string(), p, rounds * 10 + i64::from(p))).collect();
    let got: Vec<(String, u32, i64)> =
        fetch_offsets(&mut c, "steady").into_iter().map(|(t, p, o, _)| (t, p, o)).collect();
    assert_eq!(got, expect);
    drop(c);
    handle.shutdown().expect("clean shutdown");
    let handle = start_broker();
    let mut c = Conn::open(handle.ready.listen.port());
    let got: Vec<(String, u32, i64)> =
        fetch_offsets(&mut c, "steady").into_iter().map(|(t, p, o, _)| (t, p, o)).collect();
    assert_eq!(got, expect, "the latest commits survive compaction and a restart");
    drop(c);
    handle.shutdown().expect("clean shutdown");
}
