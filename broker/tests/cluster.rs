//! Cluster membership and the controller against a real 3-node ZooKeeper
//! ensemble (skipped, loudly, where ZooKeeper is not installed): in-process
//! brokers with one shard each, and raw controller operations for fencing.

mod common;

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
    config.cluster =
        Some(ClusterConfig { zookeeper: zookeeper.to_string(), session_timeout: SESSION, rack: None });
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
        assert_eq!(controller::reconcile(&a, &ea, &live).await.expect("reconcile"), 4);
        let (s, version) = controller::read_partition_state(&a, "t", 1).await.expect("state");
        assert_eq!((s.state, s.leader, s.controller_epoch), (PartitionState::Online, 2, ea.epoch));

        // a loses its controller znode (as when its session expires) and b is elected.
        b.delete(paths::CONTROLLER, None).await.expect("drop a's znode");
        let eb = controller::elect(&b, 2).await.expect("elect").expect("b wins");
        assert_eq!(eb.epoch, ea.epoch + 1);

        // a, unaware, writes with its old epoch: rejected, nothing changes.
        let stale = controller::PartitionStateZnode { leader: 1, ..s };
        let path = paths::partition_state("t", 1);
        let write = [Write::Set { path: path.clone(), data: serde_json::to_vec(&stale).unwrap(), version }];
        let err = controller::fenced_write(&a, &ea, &write).await.expect_err("fenced");
        assert!(matches!(err, ControllerError::Fenced { epoch } if epoch == ea.epoch), "{err}");
        assert!(matches!(
            controller::reconcile(&a, &ea, &BTreeSet::from([1])).await,
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
        assert_eq!(controller::reconcile(&b, &eb, &BTreeSet::from([1])).await.expect("reconcile"), 2);
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
