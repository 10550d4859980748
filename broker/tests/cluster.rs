//! Cluster membership and the controller against a real 3-node ZooKeeper
//! ensemble (skipped, loudly, where ZooKeeper is not installed): in-process
//! brokers with one shard each, and raw controller operations for fencing.

mod common;
#[path = "wire_support/mod.rs"]
mod wire_support;

use common::zk::Ensemble;
use shardlog_broker::cluster::controller::{self, ControllerError, PartitionState, Write};
use shardlog_broker::cluster::placement::{self, Candidate};
use shardlog_broker::cluster::zk::{self as zkm, paths};
use shardlog_broker::cluster::{BrokerRegistration, ClusterConfig, ControllerInfo};
use shardlog_broker::config::BrokerConfig;
use shardlog_broker::{BrokerError, BrokerHandle};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const SESSION: Duration = Duration::from_millis(2000);

fn broker_config(dir: &std::path::Path, id: i32, zookeeper: &str) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 1;
    config.pin_cores = false;
    config.broker_id = id;
    config.group.offsets_topic_partitions = 1;
    config.cluster = Some(ClusterConfig {
        zookeeper: zookeeper.to_string(),
        session_timeout: SESSION,
        rack: None,
        replica_lag_time_max: shardlog_broker::replica::REPLICA_LAG_TIME_MAX_DEFAULT,
        election: Default::default(),
        controlled_shutdown_timeout: shardlog_broker::cluster::CONTROLLED_SHUTDOWN_TIMEOUT_DEFAULT,
    });
    config
}

fn start(dir: &std::path::Path, id: i32, zookeeper: &str) -> Result<BrokerHandle, BrokerError> {
    shardlog_broker::start(broker_config(dir, id, zookeeper))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// Polls `cond` every 20 ms for up to `within`.
fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

/// Polls `f` every 20 ms for up to `within` until it gives a value.
fn wait_some<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn brokers_register_duplicates_are_refused_and_the_controller_moves_on() {
    let Some(zk) = Ensemble::start() else { return };
    let connect = format!("{}/test-chroot", zk.connect_string());
    let (d1, d2, d3) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b1 = start(d1.path(), 1, &connect).expect("broker 1 starts");
    assert!(b1.is_controller(), "the first broker becomes controller: {:?}", b1.cluster_view());

    // The registration is in ZooKeeper, under the chroot.
    let rt = rt();
    let client = rt.block_on(zkm::connect(&zk.connect_string(), SESSION)).expect("zk");
    let (data, stat) = rt
        .block_on(client.get_data(&format!("/test-chroot{}", paths::broker(1))))
        .expect("broker 1 registered");
    let reg: BrokerRegistration = serde_json::from_slice(&data).expect("json");
    assert_eq!(reg.port, b1.ready.listen.port());
    assert_eq!(reg.shard_ports, b1.ready.shard_ports);
    assert_eq!((reg.id, reg.shards, reg.host.as_str()), (1, 1, "127.0.0.1"));
    assert_ne!(stat.ephemeral_owner, 0, "ephemeral");
    let (data, _) = rt.block_on(client.get_data("/test-chroot/shardlog/controller")).expect("controller");
    let info: ControllerInfo = serde_json::from_slice(&data).expect("json");
    assert_eq!(info.broker_id, 1);

    // A second broker with id 1 refuses to start, naming the id.
    let err = start(d2.path(), 1, &connect).err().expect("duplicate id refused");
    let text = err.to_string();
    assert!(text.contains("broker id 1 is already registered"), "{text}");

    let b2 = start(d2.path(), 2, &connect).expect("broker 2 starts");
    let b3 = start(d3.path(), 3, &connect).expect("broker 3 starts");
    wait_for("everyone sees three brokers", Duration::from_secs(10), || {
        [&b1, &b2, &b3].iter().all(|b| b.cluster_view().brokers.len() == 3)
    });
    assert!(!b2.is_controller() && !b3.is_controller());
    let epoch = b2.cluster_view().controller.expect("controller").epoch;

    // The controller leaves (a clean shutdown closes its session): another takes over.
    let left = Instant::now();
    b1.shutdown().expect("clean shutdown");
    let took =
        wait_for("a new controller", Duration::from_secs(10), || b2.is_controller() || b3.is_controller());
    // Broker 2's view may show the winner (broker 3) a moment later.
    wait_for("broker 2 sees the new controller", Duration::from_secs(10), || {
        b2.cluster_view().controller.is_some_and(|c| c.broker_id != 1)
    });
    let view = b2.cluster_view();
    eprintln!(
        "controller moved from 1 to {:?} in {took:?} after a clean shutdown ({:?} since the stop began)",
        view.controller,
        left.elapsed()
    );
    let next = view.controller.expect("controller");
    assert!(next.epoch > epoch, "the epoch grows: {epoch} -> {}", next.epoch);
    wait_for("broker 1 gone from the view", Duration::from_secs(10), || {
        !b3.cluster_view().brokers.contains_key(&1)
    });
    b2.shutdown().expect("shutdown");
    b3.shutdown().expect("shutdown");
}

#[test]
fn a_stale_controller_cannot_overwrite_its_successor() {
    let Some(zk) = Ensemble::start() else { return };
    let rt = rt();
    rt.block_on(async {
        let a = zkm::connect(&zk.connect_string(), SESSION).await.expect("zk a");
        let b = zkm::connect(&zk.connect_string(), SESSION).await.expect("zk b");
        zkm::ensure_layout(&a).await.expect("layout");
        let ea = controller::elect(&a, 1).await.expect("elect").expect("a wins");
        assert!(controller::elect(&b, 2).await.expect("elect").is_none(), "one controller at a time");

        let brokers = [Candidate { id: 1, rack: None }, Candidate { id: 2, rack: None }];
        let replicas = placement::place(4, 1, &brokers, &BTreeMap::new()).expect("placed");
        controller::create_topic(&a, &ea, "t", &replicas, BTreeMap::new()).await.expect("created");
        assert!(matches!(
            controller::create_topic(&a, &ea, "t", &replicas, BTreeMap::new()).await,
            Err(ControllerError::TopicExists(_))
        ));
        let live = BTreeSet::from([1, 2]);
        assert_eq!(controller::reconcile(&a, &ea, &live, Default::default()).await.expect("reconcile"), 4);
        let (s, version) = controller::read_partition_state(&a, "t", 1).await.expect("state");
        assert_eq!((s.state, s.leader, s.controller_epoch), (PartitionState::Online, 2, ea.epoch));

        // a loses its controller znode (as when its session expires) and b is elected.
        b.delete(paths::CONTROLLER, None).await.expect("drop a's znode");
        let eb = controller::elect(&b, 2).await.expect("elect").expect("b wins");
        assert_eq!(eb.epoch, ea.epoch + 1);

        // a, unaware, writes with its old epoch: rejected, nothing changes.
        let stale = controller::PartitionStateZnode { leader: 1, ..s.clone() };
        let path = paths::partition_state("t", 1);
        let write = [Write::Set { path: path.clone(), data: serde_json::to_vec(&stale).unwrap(), version }];
        let err = controller::fenced_write(&a, &ea, &write).await.expect_err("fenced");
        assert!(matches!(err, ControllerError::Fenced { epoch } if epoch == ea.epoch), "{err}");
        assert!(matches!(
            controller::reconcile(&a, &ea, &BTreeSet::from([1]), Default::default()).await,
            Err(ControllerError::Fenced { .. })
        ));
        assert!(matches!(
            controller::create_topic(&a, &ea, "u", &replicas, BTreeMap::new()).await,
            Err(ControllerError::Fenced { .. })
        ));
        assert!(a.check_stat(&paths::topic("u")).await.expect("stat").is_none());
        let (now, _) = controller::read_partition_state(&b, "t", 1).await.expect("state");
        assert_eq!(now, s, "the stale controller changed nothing");

        // b's writes go through; a state write with a stale version does not.
        assert_eq!(
            controller::reconcile(&b, &eb, &BTreeSet::from([1]), Default::default())
                .await
                .expect("reconcile"),
            2
        );
        let (off, _) = controller::read_partition_state(&b, "t", 1).await.expect("state");
        assert_eq!((off.state, off.leader, off.controller_epoch), (PartitionState::Offline, -1, eb.epoch));
        let err = controller::fenced_write(&b, &eb, &write).await.expect_err("stale version");
        assert!(matches!(err, ControllerError::Conflict { .. }), "{err}");
    });
}

#[test]
fn one_zookeeper_node_of_three_killed_the_cluster_keeps_working() {
    let Some(mut zk) = Ensemble::start() else { return };
    let connect = zk.connect_string();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b1 = start(d1.path(), 1, &connect).expect("broker 1");
    let leader = (0..3).find(|&i| zk.mode(i).as_deref() == Some("leader")).expect("a leader");
    zk.kill(leader);
    // Broker 1's session lives on and a new broker can still join.
    let b2 = start(d2.path(), 2, &connect).expect("broker 2 joins with two nodes of three");
    wait_for("broker 1 sees broker 2", Duration::from_secs(15), || b1.cluster_view().brokers.len() == 2);
    assert!(b1.is_controller(), "{:?}", b1.cluster_view());
    zk.restart(leader);
    b2.shutdown().expect("shutdown");
    wait_for("broker 1 sees broker 2 leave", Duration::from_secs(15), || {
        b1.cluster_view().brokers.len() == 1
    });
    b1.shutdown().expect("shutdown");
}

#[test]
fn zookeeper_unreachable_at_start_is_retried_until_it_comes() {
    let Some(mut zk) = Ensemble::planned() else { return };
    let connect = zk.connect_string();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let starting = std::thread::spawn(move || start(&path, 1, &connect));
    std::thread::sleep(Duration::from_secs(2));
    assert!(!starting.is_finished(), "the broker waits for ZooKeeper instead of failing");
    zk.launch();
    let b = starting.join().expect("thread").expect("starts once ZooKeeper serves");
    assert!(b.cluster_view().brokers.contains_key(&1));
    b.shutdown().expect("shutdown");
}

#[test]
fn the_controller_places_requested_topics_and_tracks_brokers_leaving_and_returning() {
    use shardlog_broker::cluster::controller::CreateTopicRequest;
    use shardlog_broker::cluster::status;
    let Some(zk) = Ensemble::start() else { return };
    let connect = zk.connect_string();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut brokers: BTreeMap<i32, BrokerHandle> =
        (1..=3).map(|id| (id, start(dirs[id as usize - 1].path(), id, &connect).expect("broker"))).collect();
    let rt = rt();
    let client = rt.block_on(zkm::connect(&connect, SESSION)).expect("zk");
    let status = || rt.block_on(status::read_status(&client)).expect("status");
    let request = |topic: &str, partitions: u32, replication_factor: u16| {
        let r = CreateTopicRequest { partitions, replication_factor, config: BTreeMap::new() };
        rt.block_on(controller::request_topic(&client, topic, &r)).expect("request");
    };
    let led = |s: &status::ClusterStatus| -> BTreeMap<i32, usize> {
        s.brokers.iter().map(|b| (b.registration.id, b.leading)).collect()
    };

    // Asked of the cluster (not of the controller), placed 4 per broker, all online.
    let asked = Instant::now();
    request("t", 12, 1);
    wait_for("t placed and online", Duration::from_secs(10), || {
        let s = status();
        s.partitions == 12 && s.offline_partitions.is_empty()
    });
    eprintln!("topic t (12 partitions) placed and online {:?} after the request", asked.elapsed());
    assert_eq!(led(&status()), BTreeMap::from([(1, 4), (2, 4), (3, 4)]));

    // A broker that joins later gets the partitions of a topic created after it.
    brokers.insert(4, start(dirs[3].path(), 4, &connect).expect("broker 4"));
    wait_for("the controller sees broker 4", Duration::from_secs(10), || status().brokers.len() == 4);
    request("u", 4, 1);
    wait_for("u placed", Duration::from_secs(10), || status().partitions == 16);
    wait_for("u online", Duration::from_secs(10), || status().offline_partitions.is_empty());
    assert_eq!(led(&status()), BTreeMap::from([(1, 4), (2, 4), (3, 4), (4, 4)]));
    for p in 0..4 {
        let (s, _) = rt.block_on(controller::read_partition_state(&client, "u", p)).expect("state");
        assert_eq!(s.leader, 4, "u/{p}");
    }

    // Refused requests (more replicas than live brokers) are dropped, not retried forever.
    request("r3", 2, 5);
    wait_for("the refused request is dropped", Duration::from_secs(10), || {
        rt.block_on(client.check_stat(&paths::create_topic_request("r3"))).expect("stat").is_none()
    });
    assert!(rt.block_on(client.check_stat(&paths::topic("r3"))).expect("stat").is_none());

    // Broker 2 leaves: its partitions go offline; it returns: online again, new leader epoch.
    brokers.remove(&2).expect("broker 2").shutdown().expect("shutdown");
    let s = wait_some("broker 2's partitions offline", Duration::from_secs(10), || {
        // Status counts a partition offline as soon as its leader is gone;
        // wait for the controller to have written the Offline states too.
        Some(status()).filter(|s| {
            s.offline_partitions.len() == 4
                && s.offline_partitions.iter().all(|p| p.state == PartitionState::Offline)
        })
    });
    assert!(s.offline_partitions.iter().all(|p| p.replicas == vec![2]), "{:?}", s.offline_partitions);
    brokers.insert(2, start(dirs[1].path(), 2, &connect).expect("broker 2 again"));
    wait_for("broker 2's partitions back online", Duration::from_secs(10), || {
        status().offline_partitions.is_empty()
    });
    let back = s.offline_partitions[0].clone();
    let (state, _) =
        rt.block_on(controller::read_partition_state(&client, &back.topic, back.partition)).expect("state");
    assert_eq!((state.state, state.leader, state.leader_epoch), (PartitionState::Online, 2, 2));
    for (_, b) in brokers {
        b.shutdown().expect("shutdown");
    }
}

#[test]
fn requests_for_partitions_led_elsewhere_or_offline_get_typed_errors() {
    use shardlog_schema::types::shard_for;
    use shardlog_schema::{ErrorCode, PartitionId};
    let Some(zk) = Ensemble::start() else { return };
    let connect = zk.connect_string();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b1 = start(d1.path(), 1, &connect).expect("broker 1");
    let b2 = start(d2.path(), 2, &connect).expect("broker 2");
    let port1 = b1.ready.shard_ports[0];
    let mut conn = wire_support::Conn::open(port1);
    // Created through broker 1, placed over both: partitions 0..4 alternate.
    assert_eq!(conn.create_topic("routed", 4), ErrorCode::None);
    assert_eq!(conn.create_topic("routed", 4), ErrorCode::TopicAlreadyExists);
    let batch = wire_support::batch_of(&["x"]);
    let led = |conn: &mut wire_support::Conn, p: u32| {
        conn.send_produce(&[("routed", p, &batch)]);
        conn.recv_produce_errors().swap_remove(0)
    };
    let mut elsewhere = None;
    for p in 0..4 {
        let (code, message) = led(&mut conn, p);
        match code {
            ErrorCode::None => {}
            ErrorCode::NotLeaderOrFollower => {
                assert!(message.contains("led by broker 2 at 127.0.0.1:"), "{message}");
                elsewhere = Some(p);
            }
            other => panic!("partition {p}: {other:?} {message}"),
        }
    }
    let p = elsewhere.expect("broker 2 leads some partition");
    assert_eq!(shard_for("routed", PartitionId(p), 1).0, 0);
    // Broker 2 leaves: its partitions are offline, typed and retriable.
    b2.shutdown().expect("shutdown");
    let (code, message) = wait_some("offline", Duration::from_secs(10), || {
        Some(led(&mut conn, p)).filter(|(c, _)| *c != ErrorCode::NotLeaderOrFollower)
    });
    assert_eq!(code, ErrorCode::LeaderNotAvailable, "{message}");
    assert!(message.contains("no live leader"), "{message}");
    assert!(shardlog_schema::error::is_retriable(code));
    b1.shutdown().expect("shutdown");
}
