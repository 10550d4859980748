//! `shardlog serve` processes as a cluster on a real 3-node ZooKeeper
//! ensemble (skipped, loudly, without ZooKeeper): a duplicate id refused,
//! the controller SIGKILLed and replaced (timed), a broker whose session
//! expired (SIGSTOPped past its session timeout) re-registering.

#[allow(dead_code)]
mod common;
#[path = "../../broker/tests/common/zk.rs"]
mod zk;

use common::{wait_for, BIN};
use shardlog_broker::cluster::controller;
use shardlog_broker::cluster::zk::{self as zkm, paths};
use shardlog_broker::cluster::ControllerInfo;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SESSION_MS: u64 = 2000;

struct Proc {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_command(dir: &std::path::Path, id: i32, zookeeper: &str) -> Command {
    let mut cmd = common::serve_command(dir, 1, &["--offsets-topic-partitions", "1"]);
    cmd.args(["--broker-id", &id.to_string(), "--zookeeper", zookeeper, "--advertised-host", "127.0.0.1"])
        .args(["--zookeeper-session-timeout-ms", &SESSION_MS.to_string()]);
    cmd
}

/// Starts broker `id` and waits for its ready line.
fn serve(id: i32, zookeeper: &str) -> Proc {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = serve_command(dir.path(), id, zookeeper).stderr(Stdio::inherit()).spawn().expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready line");
    assert!(line.starts_with("shardlog ready: "), "broker {id}: {line:?}");
    Proc { child, _dir: dir }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn controller_now(rt: &tokio::runtime::Runtime, client: &zkm::Client) -> Option<ControllerInfo> {
    rt.block_on(controller::read_controller(client)).expect("read controller")
}

fn registered(rt: &tokio::runtime::Runtime, client: &zkm::Client, id: i32) -> Option<i64> {
    rt.block_on(client.check_stat(&paths::broker(id))).expect("stat").map(|s| s.ephemeral_owner)
}

#[test]
fn a_second_broker_with_a_registered_id_refuses_to_start() {
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = zk.connect_string();
    let _b1 = serve(1, &connect);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = serve_command(dir.path(), 1, &connect).output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broker id 1 is already registered"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "no ready line");
}

#[test]
fn controller_killed_another_takes_over_and_an_expired_broker_re_registers() {
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = zk.connect_string();
    let rt = rt();
    let client = rt.block_on(zkm::connect(&connect, Duration::from_secs(6))).expect("zk");
    let mut brokers: Vec<(i32, Proc)> = (1..=3).map(|id| (id, serve(id, &connect))).collect();
    let first = controller_now(&rt, &client).expect("a controller");
    assert_eq!(first.broker_id, 1, "the first broker up is elected");

    // SIGKILL the controller: its session lives until the timeout.
    let killed = Instant::now();
    brokers.retain(|(id, _)| *id != first.broker_id);
    let (next, took) = wait_for("a new controller", Duration::from_millis(SESSION_MS * 3 + 5000), || {
        controller_now(&rt, &client).filter(|c| c.broker_id != first.broker_id)
    });
    eprintln!(
        "controller failover after SIGKILL: broker {} -> broker {} (epoch {} -> {}) in {took:?} \
         (session timeout {SESSION_MS} ms; {:?} since the kill)",
        first.broker_id,
        next.broker_id,
        first.epoch,
        next.epoch,
        killed.elapsed()
    );
    assert!(next.epoch > first.epoch);
    assert!(registered(&rt, &client, first.broker_id).is_none(), "the dead broker's registration is gone");

    // The new controller stops (SIGSTOP) past its session timeout: its session
    // expires, the third broker takes over; resumed, it starts a new session and
    // registers again, and is no longer controller.
    let (stopped_id, stopped) =
        brokers.iter().find(|(id, _)| *id == next.broker_id).expect("controller process");
    let old_owner = registered(&rt, &client, *stopped_id).expect("registered");
    let pid = stopped.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().expect("kill").success());
    let (third, took) =
        wait_for("the third broker takes over", Duration::from_millis(SESSION_MS * 3 + 5000), || {
            controller_now(&rt, &client).filter(|c| c.broker_id != next.broker_id)
        });
    eprintln!(
        "controller failover after SIGSTOP: broker {} -> {} in {took:?}",
        next.broker_id, third.broker_id
    );
    assert!(Command::new("kill").args(["-CONT", &pid]).status().expect("kill").success());
    let (new_owner, took) = wait_for("re-registration after expiry", Duration::from_secs(15), || {
        registered(&rt, &client, *stopped_id).filter(|owner| *owner != old_owner)
    });
    eprintln!("broker {stopped_id} re-registered with a new session {new_owner:#x} {took:?} after SIGCONT");
    let now = controller_now(&rt, &client).expect("controller");
    assert_eq!(now, third, "the resumed broker did not take the controller back");
}

fn status(connect: &str, json: bool) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["cluster", "status", "--zookeeper", connect]);
    if json {
        cmd.args(["--output", "json"]);
    }
    let out = cmd.output().expect("run cluster status");
    assert!(out.status.success(), "cluster status failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf8")
}

#[test]
fn cluster_status_lists_brokers_controller_and_offline_partitions() {
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/status", zk.connect_string());
    let _b1 = serve(1, &connect);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = serve_command(dir.path(), 2, &connect)
        .args(["--rack", "r2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready");
    let _b2 = Proc { child, _dir: dir };

    let s: serde_json::Value = serde_json::from_str(&status(&connect, true)).expect("json");
    assert_eq!(s["controller"]["broker_id"], 1, "{s}");
    let ids: Vec<i64> =
        s["brokers"].as_array().expect("brokers").iter().map(|b| b["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(s["brokers"][1]["rack"], "r2");
    assert_eq!(s["brokers"][0]["shards"], 1);
    assert_eq!(s["offline_partitions"].as_array().map(Vec::len), Some(0));
    let text = status(&connect, false);
    assert!(text.contains("controller: broker 1 (epoch 1)"), "{text}");

    // A topic placed on brokers that are not live shows as offline.
    let rt = rt();
    let other = format!("{}/no-brokers", zk.connect_string());
    rt.block_on(async {
        let c = zkm::connect(&other, Duration::from_secs(6)).await.expect("zk");
        zkm::ensure_layout(&c).await.expect("layout");
        let epoch = controller::elect(&c, 9).await.expect("elect").expect("won");
        controller::create_topic(&c, &epoch, "t", &[vec![1], vec![2]], Default::default())
            .await
            .expect("topic");
        controller::reconcile(&c, &epoch, &Default::default(), Default::default()).await.expect("reconcile");
    });
    let s: serde_json::Value = serde_json::from_str(&status(&other, true)).expect("json");
    assert_eq!((s["topics"].as_i64(), s["partitions"].as_i64()), (Some(1), Some(2)), "{s}");
    assert_eq!(s["offline_partitions"][1]["state"], "offline");
    assert!(status(&other, false).contains("offline partitions: 2"));
}
