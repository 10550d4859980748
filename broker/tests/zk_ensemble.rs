//! The test ensemble itself: three real ZooKeeper nodes form a quorum, and
//! two of three keep it when one is killed.

mod common;

use common::zk::Ensemble;
use std::time::Instant;

#[test]
fn three_nodes_form_a_quorum_and_survive_one_kill() {
    let started = Instant::now();
    let Some(mut zk) = Ensemble::start() else { return };
    eprintln!("ensemble serving after {:?}: {}", started.elapsed(), zk.connect_string());
    let modes: Vec<String> = (0..3).map(|i| zk.mode(i).expect("serving")).collect();
    assert_eq!(modes.iter().filter(|m| *m == "leader").count(), 1, "modes {modes:?}");
    let leader = modes.iter().position(|m| m == "leader").expect("a leader");
    zk.kill(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &others {
        zk.wait_serving(i);
    }
    zk.restart(leader);
    assert!(zk.mode(leader).is_some());
}
