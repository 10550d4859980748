//! Replication with real `shardlog serve` processes on a real 3-node
//! ZooKeeper ensemble (skipped, loudly, without ZooKeeper):
//! - an idempotent `acks=all` producer at load while partition leaders are
//!   SIGKILLed (and, every other time, frozen with SIGSTOP past their
//!   session, then resumed: a zombie) and brought back: every acknowledged
//!   record is read back once, at its offset, in order, and every replica's
//!   log is byte-identical at the end;
//! - a follower cut off leaves the ISR, `acks=all` goes on with the smaller
//!   ISR, `min.insync.replicas=2` refuses with a typed error, and the
//!   follower catches up and rejoins;
//! - a SIGTERMed leader hands its leaderships off before it exits (controlled
//!   shutdown) and checkpoints its high watermarks; with automatic
//!   rebalance off, `cluster elect-leaders` gives leadership back to the
//!   preferred replicas;
//! - a partition reassigned under load (new replicas caught up, leadership
//!   moved, old replicas dropped and deleted), then `cluster rebalance` onto
//!   a broker that joined (its controller SIGKILLed midway: the next one
//!   finishes it) and off a decommissioned one: nothing acknowledged
//!   lost or reordered, and the moved replicas byte-identical;
//! - a leader that lost its data directory comes back empty, copies
//!   everything before it rejoins the ISR, and alone serves every
//!   acknowledged record;
//! - followers of a leader frozen past its session close their fetch
//!   connections to it as soon as leadership moves (not after their I/O
//!   timeout).
//!
//! `SHARDLOG_SLOW_TESTS=1` runs 20 leader failures instead of 4.

#[allow(dead_code)]
mod common;
#[path = "../../broker/tests/common/zk.rs"]
mod zk;

use common::cluster::{rt, Node, SESSION_MS};
use common::wait_for;
use shardlog_client::admin::PartitionDescription;
use shardlog_client::{
    Acks, Admin, ClientConfig, ClientError, Consumer, ConsumerConfig, ErrorCode, Producer, ProducerConfig,
    ProducerRecord, SeekTo,
};
use shardlog_schema::batch::BatchIter;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LAG_MS: &str = "1500";

fn start_cluster(connect: &str) -> Vec<Node> {
    let nodes: Vec<Node> =
        (1..=3).map(|id| Node::start_with(id, connect, &["--replica-lag-time-max-ms", LAG_MS])).collect();
    wait_registered(connect, 3);
    nodes
}

/// Waits until `n` brokers are registered (placement counts only those).
fn wait_registered(connect: &str, n: usize) {
    wait_for(&format!("{n} brokers registered"), Duration::from_secs(20), || {
        let (ok, text) = cluster_cli(connect, &["status"]);
        (ok && text.contains(&format!("brokers: {n},"))).then_some(())
    });
}

fn bootstrap(nodes: &[Node]) -> String {
    nodes.iter().filter(|n| n.child.is_some()).map(|n| n.listen.as_str()).collect::<Vec<_>>().join(",")
}

fn describe(rt: &tokio::runtime::Runtime, bootstrap: &str, topic: &str) -> Option<Vec<PartitionDescription>> {
    rt.block_on(async {
        // Short: a frozen broker accepts connections and never answers.
        let config = ClientConfig {
            request_timeout_ms: 1500,
            connect_timeout_ms: 1500,
            ..ClientConfig::new(bootstrap)
        };
        let admin = Admin::connect(config).await.ok()?;
        admin.describe_topic(topic).await.ok().map(|d| d.partitions)
    })
}

/// Waits until every partition of `topic` is led and its ISR holds `isr` replicas.
fn wait_isr(rt: &tokio::runtime::Runtime, nodes: &[Node], topic: &str, isr: usize, within: Duration) {
    let (_, took) = wait_for(&format!("{topic}: every ISR of {isr}"), within, || {
        describe(rt, &bootstrap(nodes), topic)
            .filter(|ps| ps.iter().all(|p| !p.offline && p.isr.len() == isr))
            .map(|_| ())
    });
    eprintln!("{topic}: ISR of {isr} everywhere after {took:?}");
}

/// The batches of a partition's log on one broker, back to back, as stored.
fn stored_log(dir: &Path, topic: &str, partition: u32) -> Vec<u8> {
    let pdir = dir.join(format!("{topic}-{partition}"));
    let mut segments: Vec<_> = std::fs::read_dir(&pdir)
        .unwrap_or_else(|e| panic!("{}: {e}", pdir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let mut out = Vec::new();
    for s in segments {
        let bytes = std::fs::read(&s).expect("segment");
        let mut it = BatchIter::new(&bytes, 64 << 20);
        for b in it.by_ref() {
            let Ok((_, raw)) = b else { break };
            out.extend_from_slice(raw);
        }
    }
    out
}

/// What the producer thread saw acknowledged: (partition, offset, value).
type Acked = Arc<Mutex<Vec<(u32, u64, String)>>>;

/// One cluster test at a time: each runs a 3-node ensemble and 3 or 4
/// brokers with 2 s sessions, and two at once on 2 cores starve sessions.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Samples how many records are acknowledged every 5 ms from its start (the
/// moment of the failure): the end of the longest time the count stood
/// still, counted from the start, is when the producer got going again
/// (failover as the application sees it; the test's own metadata polling,
/// whose requests to a frozen broker wait out a 1.5 s timeout, comes later).
struct StallWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl StallWatch {
    fn start(acked: Acked) -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let count = || acked.lock().expect("acked").len();
            let (mut last_len, mut since) = (count(), started);
            let (mut longest, mut resumed) = (Duration::ZERO, Duration::ZERO);
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let len = count();
                if len != last_len {
                    if since.elapsed() > longest {
                        longest = since.elapsed();
                        resumed = started.elapsed();
                    }
                    (last_len, since) = (len, Instant::now());
                }
                if stopping {
                    return resumed;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        StallWatch { stop, thread }
    }

    /// From the start to the first acknowledgement after the longest stall.
    fn resumed_after(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("stall watch")
    }
}

fn producer_config(bootstrap: &str) -> ProducerConfig {
    ProducerConfig {
        // A request to a frozen leader fails after 5 s (not 30) and is
        // retried on the new one.
        client: ClientConfig { request_timeout_ms: 5_000, ..ClientConfig::new(bootstrap) },
        acks: Acks::All,
        enable_idempotence: true,
        retries: 1_000_000,
        delivery_timeout_ms: 60_000,
        linger_ms: 2,
        ..Default::default()
    }
}

/// Sends `k{p}:{seq}` to partition `p` of `partitions` in a loop until
/// `stop`, awaiting each delivery in a window; records what was acknowledged.
fn spawn_producer(
    bootstrap: String,
    topic: &'static str,
    partitions: u32,
    stop: Arc<AtomicBool>,
    acked: Acked,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let rt = rt();
        rt.block_on(async move {
            let producer = Producer::new(producer_config(&bootstrap)).await.expect("producer");
            let mut seq = 0u64;
            let mut window = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                for p in 0..partitions {
                    let value = format!("p{p}:{seq}");
                    let rec = ProducerRecord::new(topic, value.clone()).with_partition(p);
                    window.push_back((p, value, producer.send(rec).await.expect("enqueue")));
                }
                seq += 1;
                while window.len() > 2_000 {
                    let (p, value, d) = window.pop_front().expect("window");
                    let md = d.await.unwrap_or_else(|e| panic!("{value} not acknowledged: {e}"));
                    acked.lock().expect("acked").push((p, md.offset, value));
                }
            }
            for (p, value, d) in window {
                let md = d.await.unwrap_or_else(|e| panic!("{value} not acknowledged: {e}"));
                acked.lock().expect("acked").push((p, md.offset, value));
            }
            producer.close().await.expect("close");
            seq
        })
    })
}

/// Reads partition `p` from the start to its end; (offset, value) in order.
fn read_partition(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    topic: &str,
    p: u32,
    end: u64,
) -> Vec<(u64, String)> {
    rt.block_on(async {
        let mut consumer =
            Consumer::new(ConsumerConfig { client: ClientConfig::new(bootstrap), ..Default::default() })
                .await
                .expect("consumer");
        consumer.assign(&[(topic.to_string(), p)], SeekTo::Earliest).await.expect("assign");
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.last().map_or(0, |(o, _): &(u64, String)| o + 1) < end {
            assert!(Instant::now() < deadline, "partition {p}: read {} of {end}", out.len());
            for r in consumer.poll(Duration::from_millis(500)).await.expect("poll") {
                out.push((r.offset, String::from_utf8(r.value.to_vec()).expect("utf8")));
            }
        }
        out
    })
}

/// Every acknowledged record once, at its offset, in send order (read
/// through `bootstrap` from offset 0 to each partition's end).
fn check_acknowledged(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    acked: &[(u32, u64, String)],
) {
    let ps = describe(rt, bootstrap, topic).expect("describe");
    let mut want: BTreeMap<u32, BTreeMap<u64, String>> = BTreeMap::new();
    for (p, offset, value) in acked {
        let prev = want.entry(*p).or_default().insert(*offset, value.clone());
        assert!(prev.is_none(), "two acknowledgements at {p}/{offset}");
    }
    for p in 0..partitions {
        let got = read_partition(rt, bootstrap, topic, p, ps[p as usize].end_offset);
        let values: Vec<&String> = got.iter().map(|(_, v)| v).collect();
        let mut seen = std::collections::HashSet::new();
        for v in &values {
            assert!(seen.insert(*v), "partition {p}: {v} stored twice");
        }
        let seqs: Vec<u64> =
            values.iter().map(|v| v.split_once(':').expect("p:seq").1.parse().expect("seq")).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "partition {p}: out of order");
        let at: BTreeMap<u64, &String> = got.iter().map(|(o, v)| (*o, v)).collect();
        let mine = want.remove(&p).unwrap_or_default();
        for (offset, value) in &mine {
            assert_eq!(
                at.get(offset).copied(),
                Some(value),
                "partition {p}: acknowledged {value} at {offset}"
            );
        }
        eprintln!("partition {p}: {} records, {} acknowledged, all there", got.len(), mine.len());
    }
}

#[test]
fn acks_all_loses_nothing_while_leaders_die_and_return() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/replication", zk.connect_string());
    let rt = rt();
    let mut nodes = start_cluster(&connect);
    let topic = "ledger";
    let partitions = 2u32;
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin
            .create_topic_replicated(topic, partitions, 3, &[("min.insync.replicas".into(), "2".into())])
            .await
            .expect("create RF 3");
    });
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(20));

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let producer = spawn_producer(bootstrap(&nodes), topic, partitions, stop.clone(), acked.clone());
    let failures = if std::env::var_os("SHARDLOG_SLOW_TESTS").is_some() { 20 } else { 4 };
    let mut failover_times = Vec::new();
    for round in 0..failures {
        std::thread::sleep(Duration::from_millis(700));
        let ps = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
        let p = (round % partitions) as usize;
        let leader = ps[p].leader_broker;
        let epoch = ps[p].leader_epoch;
        let node = nodes.iter_mut().find(|n| n.id == leader).expect("leader node");
        let zombie = round % 2 == 1;
        let stall = StallWatch::start(acked.clone());
        let killed = Instant::now();
        if zombie {
            node.signal("STOP");
        } else {
            node.kill();
        }
        let others =
            nodes.iter().filter(|n| n.id != leader).map(|n| n.listen.as_str()).collect::<Vec<_>>().join(",");
        // A new leader from the ISR, with a newer epoch.
        let (new_leader, _) = wait_for("a new leader", Duration::from_secs(SESSION_MS / 1000 + 15), || {
            describe(&rt, &others, topic).and_then(|ps| {
                (!ps[p].offline && ps[p].leader_broker != leader && ps[p].leader_epoch > epoch)
                    .then_some(ps[p].leader_broker)
            })
        });
        // Acknowledgements flowing again after the failure: records
        // acknowledged before it have long been counted by now.
        let seen = acked.lock().expect("acked").len();
        let (_, _) = wait_for("acks=all after failover", Duration::from_secs(20), || {
            (acked.lock().expect("acked").len() > seen + 100).then_some(())
        });
        let took = killed.elapsed();
        let resumed = stall.resumed_after();
        failover_times.push(resumed);
        eprintln!(
            "round {round}: {} broker {leader} (epoch {epoch}) -> {new_leader}; acknowledgements flowed again \
             after {resumed:?} (the test saw the new leader and them after {took:?})",
            if zombie { "froze" } else { "killed" }
        );
        let node = nodes.iter_mut().find(|n| n.id == leader).expect("leader node");
        if zombie {
            node.signal("CONT");
        } else {
            node.spawn();
        }
        wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(30));
    }
    stop.store(true, Ordering::Relaxed);
    let sent_rounds = producer.join().expect("producer thread");
    let acked = acked.lock().expect("acked").clone();
    eprintln!("{} records acknowledged over {sent_rounds} rounds; failovers {failover_times:?}", acked.len());
    assert!(acked.len() > 1000, "the producer made progress: {}", acked.len());

    check_acknowledged(&rt, &bootstrap(&nodes), topic, partitions, &acked);
    // Every replica byte-identical (stopped cleanly first).
    for n in &mut nodes {
        n.stop();
    }
    for p in 0..partitions {
        let logs: Vec<Vec<u8>> = nodes.iter().map(|n| stored_log(n.dir.path(), topic, p)).collect();
        assert!(!logs[0].is_empty());
        for (n, log) in nodes.iter().zip(&logs) {
            assert!(
                log == &logs[0],
                "partition {p}: broker {}'s log differs ({} vs {} bytes)",
                n.id,
                log.len(),
                logs[0].len()
            );
        }
    }
}

#[test]
fn a_cut_off_follower_leaves_the_isr_and_min_insync_refuses() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/isr", zk.connect_string());
    let rt = rt();
    let nodes = start_cluster(&connect);
    let topic = "pairs";
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin.create_topic_replicated(topic, 1, 2, &[]).await.expect("create RF 2");
        admin
            .create_topic_replicated("strict", 1, 2, &[("min.insync.replicas".into(), "2".into())])
            .await
            .expect("create strict");
    });
    wait_isr(&rt, &nodes, topic, 2, Duration::from_secs(20));
    wait_isr(&rt, &nodes, "strict", 2, Duration::from_secs(20));
    let ps = describe(&rt, &bootstrap(&nodes), "strict").expect("describe");
    let follower = *ps[0].replicas.iter().find(|&&r| r != ps[0].leader_broker).expect("follower");
    let send = |topic: &str, value: &str| -> Result<u64, ClientError> {
        rt.block_on(async {
            let mut config = producer_config(&bootstrap(&nodes));
            config.retries = 0;
            config.enable_idempotence = false;
            let producer = Producer::new(config).await.expect("producer");
            let d = producer.send(ProducerRecord::new(topic, value.to_string()).with_partition(0)).await?;
            let r = d.await.map(|m| m.offset);
            producer.close().await.ok();
            r
        })
    };
    assert!(send("strict", "before").is_ok());
    // Cut the follower off (frozen, within its session: it stays registered).
    let f = nodes.iter().find(|n| n.id == follower).expect("follower node");
    f.signal("STOP");
    let (_, took) = wait_for("the strict ISR shrinks to the leader", Duration::from_secs(15), || {
        describe(&rt, &bootstrap(&nodes), "strict").filter(|ps| ps[0].isr.len() == 1).map(|_| ())
    });
    eprintln!("ISR shrank {took:?} after the follower stopped");
    // The leader's metrics say so.
    let leader = nodes.iter().find(|n| n.id == ps[0].leader_broker).expect("leader node");
    let strict = "topic=\"strict\",partition=\"0\"";
    assert_eq!(leader.metric("shardlog_partition_in_sync_replicas", strict), Some(1));
    assert!(leader.metric("shardlog_under_replicated_partitions", "shard=\"0\"").is_some_and(|n| n >= 1));
    assert!(leader.metric("shardlog_isr_shrinks_total", "shard=\"0\"").is_some_and(|n| n >= 1));
    let lag_label = format!("{strict},replica=\"{follower}\"");
    assert!(leader.metric("shardlog_follower_lag_records", &lag_label).is_some(), "{}", leader.metrics());
    match send("strict", "refused") {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::NotEnoughReplicas), "{e}"),
        Ok(o) => panic!("acks=all with 1 in-sync replica of min 2 was accepted at {o}"),
    }
    // A topic without the minimum goes on with the smaller ISR.
    let pairs = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    if pairs[0].leader_broker != follower && pairs[0].replicas.contains(&follower) {
        wait_for("the ISR of `pairs` shrinks", Duration::from_secs(15), || {
            describe(&rt, &bootstrap(&nodes), topic).filter(|ps| ps[0].isr.len() == 1).map(|_| ())
        });
        assert!(send(topic, "smaller isr").is_ok());
    }
    f.signal("CONT");
    wait_isr(&rt, &nodes, "strict", 2, Duration::from_secs(30));
    assert!(send("strict", "after").is_ok(), "accepted again once the follower is back in sync");
    assert_eq!(leader.metric("shardlog_partition_in_sync_replicas", strict), Some(2));
    assert!(leader.metric("shardlog_isr_expands_total", "shard=\"0\"").is_some_and(|n| n >= 1));
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: u32) -> std::collections::BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Default::default() };
    fds.filter_map(|fd| {
        let link = std::fs::read_link(fd.ok()?.path()).ok()?;
        link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
    })
    .collect()
}

/// Established TCP connections (IPv4) from process `from` to any port
/// process `to` listens on, from `/proc/net/tcp`.
fn connections_between(from: u32, to: u32) -> usize {
    let (mine, theirs) = (socket_inodes(from), socket_inodes(to));
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    // (local port, remote port, state, inode) of each socket.
    let rows: Vec<(u16, u16, String, u64)> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
            Some((port(f.get(1)?)?, port(f.get(2)?)?, f.get(3)?.to_string(), f.get(9)?.parse().ok()?))
        })
        .collect();
    let listening: Vec<u16> =
        rows.iter().filter(|r| r.2 == "0A" && theirs.contains(&r.3)).map(|r| r.0).collect();
    rows.iter().filter(|r| r.2 == "01" && mine.contains(&r.3) && listening.contains(&r.1)).count()
}

#[test]
fn followers_let_go_of_a_frozen_leader_as_soon_as_leadership_moves() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/zombie-fetch", zk.connect_string());
    let rt = rt();
    let nodes = start_cluster(&connect);
    let topic = "held";
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin.create_topic_replicated(topic, 1, 3, &[]).await.expect("create RF 3");
    });
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(20));
    let leader_id = describe(&rt, &bootstrap(&nodes), topic).expect("describe")[0].leader_broker;
    let leader = nodes.iter().find(|n| n.id == leader_id).expect("leader node");
    let pid = |n: &Node| n.child.as_ref().expect("running").id();
    let followers: Vec<&Node> = nodes.iter().filter(|n| n.id != leader_id).collect();
    let held = || followers.iter().map(|f| connections_between(pid(f), pid(leader))).sum::<usize>();
    wait_for("both followers fetch from the leader", Duration::from_secs(10), || (held() >= 2).then_some(()));
    // Frozen past its session: the controller moves leadership, while each
    // follower's fetch waits on the zombie (its I/O timeout is 10 s).
    leader.signal("STOP");
    let live = followers.iter().map(|n| n.listen.as_str()).collect::<Vec<_>>().join(",");
    let (_, took) = wait_for("leadership moves off the frozen broker", Duration::from_secs(20), || {
        describe(&rt, &live, topic)
            .filter(|ps| ps[0].leader_broker != leader_id && ps[0].leader_broker >= 0)
            .map(|_| ())
    });
    eprintln!("leadership moved {took:?} after the freeze");
    let (_, let_go) =
        wait_for("no follower holds a connection to the frozen broker", Duration::from_secs(3), || {
            (held() == 0).then_some(())
        });
    eprintln!("the followers let go {let_go:?} after leadership moved");
    leader.signal("CONT");
}

/// Reads a broker's high-watermark checkpoint: (topic, partition) -> hw.
fn checkpoint(dir: &Path) -> BTreeMap<(String, u32), u64> {
    let text = std::fs::read_to_string(dir.join("high-watermark.shard-0")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split(' ');
            Some(((w.next()?.to_string(), w.next()?.parse().ok()?), w.next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_clean_stop_hands_leadership_off_and_elect_leaders_brings_it_back() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/handoff", zk.connect_string());
    let rt = rt();
    let mut nodes: Vec<Node> = (1..=3)
        .map(|id| {
            Node::start_with(
                id,
                &connect,
                &["--replica-lag-time-max-ms", LAG_MS, "--no-auto-leader-rebalance"],
            )
        })
        .collect();
    wait_registered(&connect, 3);
    let topic = "handoff";
    let partitions = 3u32;
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin.create_topic_replicated(topic, partitions, 3, &[]).await.expect("create RF 3");
    });
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(20));
    let before = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    let leaving = before[0].leader_broker;
    let led: Vec<usize> = (0..before.len()).filter(|&p| before[p].leader_broker == leaving).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let producer = spawn_producer(bootstrap(&nodes), topic, partitions, stop.clone(), acked.clone());
    wait_for("the producer gets going", Duration::from_secs(20), || {
        (acked.lock().expect("acked").len() > 5_000).then_some(())
    });

    // SIGTERM the leader of partition 0: it hands its leaderships off
    // before it stops, so when it has exited none names it leader.
    // A watcher notes when the other brokers first show the hand-off.
    let others: String =
        nodes.iter().filter(|n| n.id != leaving).map(|n| n.listen.as_str()).collect::<Vec<_>>().join(",");
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (others, watching, led) = (others.clone(), watching.clone(), led.clone());
        std::thread::spawn(move || {
            let rt = common::cluster::rt();
            while watching.load(Ordering::Relaxed) {
                let moved = describe(&rt, &others, topic)
                    .is_some_and(|ps| led.iter().all(|&p| ps[p].leader_broker != leaving));
                if moved {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            None
        })
    };
    let node = nodes.iter_mut().find(|n| n.id == leaving).expect("leaving node");
    let t0 = Instant::now();
    node.stop();
    let exited = Instant::now();
    let stopped_in = exited - t0;
    std::thread::sleep(Duration::from_millis(500));
    watching.store(false, Ordering::Relaxed);
    let moved = watcher.join().expect("watcher").expect("the hand-off shows within 500 ms of the exit");
    // Handed off while the broker still ran (a stop without controlled
    // shutdown closes the session last: the controller moves leadership
    // only after that).
    assert!(moved <= exited, "leadership moved {:?} after the broker exited", moved - exited);
    // The other brokers' metadata follows ZooKeeper within milliseconds.
    let (after, _) = wait_for("the hand-off in the metadata", Duration::from_secs(1), || {
        describe(&rt, &others, topic).filter(|ps| led.iter().all(|&p| ps[p].leader_broker != leaving))
    });
    for &p in &led {
        assert_ne!(after[p].leader_broker, leaving, "partition {p} still led by the stopped broker");
        assert!(after[p].leader_epoch > before[p].leader_epoch, "partition {p}: a new epoch");
        assert!(!after[p].isr.contains(&leaving), "partition {p}: the stopped broker left the ISR");
    }
    // Producing never paused for long (no session timeout to wait out).
    let n_before = acked.lock().expect("acked").len();
    let (_, resumed) = wait_for("acks=all after the hand-off", Duration::from_secs(10), || {
        (acked.lock().expect("acked").len() > n_before + 100).then_some(())
    });
    eprintln!(
        "broker {leaving} stopped in {stopped_in:?}, its leaderships moved {:?} before it exited; producing again {resumed:?} after",
        exited - moved
    );
    assert!(resumed < Duration::from_millis(SESSION_MS), "acks resumed only after {resumed:?}");
    // Its clean stop checkpointed every replicated partition's high watermark.
    let node = nodes.iter_mut().find(|n| n.id == leaving).expect("leaving node");
    let hw = checkpoint(node.dir.path());
    for p in 0..partitions {
        let v = hw.get(&(topic.to_string(), p)).copied();
        assert!(v.is_some_and(|v| v > 0), "partition {p}: checkpointed high watermark {v:?}: {hw:?}");
    }

    // Back: it rejoins every ISR, but (no auto rebalance) leads nothing
    // until `cluster elect-leaders` puts preferred replicas back in charge.
    node.spawn();
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(30));
    let rejoined = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    assert!(rejoined.iter().all(|p| p.leader_broker != leaving), "no automatic rebalance: {rejoined:?}");
    let out = std::process::Command::new(common::BIN)
        .args(["cluster", "elect-leaders", "--zookeeper", &connect, "--topic", topic])
        .output()
        .expect("elect-leaders");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!("{partitions} of {partitions} partition(s) led by their preferred replica")),
        "{text}"
    );
    let (_, took) = wait_for("preferred leaders in the metadata", Duration::from_secs(10), || {
        describe(&rt, &bootstrap(&nodes), topic)
            .filter(|ps| ps.iter().all(|p| !p.offline && p.leader_broker == p.replicas[0]))
            .map(|_| ())
    });
    eprintln!("preferred leaders back {took:?} after elect-leaders answered");
    let bad = std::process::Command::new(common::BIN)
        .args(["cluster", "elect-leaders", "--zookeeper", &connect, "--topic", "nope"])
        .output()
        .expect("elect-leaders");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("topic `nope` does not exist"));

    // Nothing acknowledged was lost through the hand-off and the return.
    stop.store(true, Ordering::Relaxed);
    producer.join().expect("producer thread");
    let acked = acked.lock().expect("acked").clone();
    let ps = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    for p in 0..partitions {
        let got: BTreeMap<u64, String> =
            read_partition(&rt, &bootstrap(&nodes), topic, p, ps[p as usize].end_offset)
                .into_iter()
                .collect();
        let mine: Vec<&(u32, u64, String)> = acked.iter().filter(|(q, _, _)| *q == p).collect();
        for (_, offset, value) in &mine {
            assert_eq!(got.get(offset), Some(value), "partition {p}: acknowledged {value} at {offset}");
        }
        assert_eq!(got.len() as u64, ps[p as usize].end_offset, "partition {p}: no gaps or duplicates");
        eprintln!("partition {p}: {} acknowledged records all there", mine.len());
    }
}

/// Runs `shardlog cluster ARGS --zookeeper CONNECT`; (success, stdout + stderr).
fn cluster_cli(connect: &str, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::BIN)
        .arg("cluster")
        .args(args)
        .args(["--zookeeper", connect])
        .output()
        .expect("shardlog cluster");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Waits until `dir` no longer holds a copy of `topic`-`p`.
fn wait_deleted(dir: &Path, topic: &str, p: u32) {
    let pdir = dir.join(format!("{topic}-{p}"));
    wait_for(&format!("{} deleted", pdir.display()), Duration::from_secs(10), || {
        (!pdir.exists()).then_some(())
    });
}

/// Waits until the metadata of `topic` satisfies `want` (a reassignment
/// done in ZooKeeper reaches the brokers' snapshots a moment later).
fn settled(
    rt: &tokio::runtime::Runtime,
    nodes: &[Node],
    topic: &str,
    want: impl Fn(&[PartitionDescription]) -> bool,
) -> Vec<PartitionDescription> {
    wait_for("the metadata shows the move", Duration::from_secs(10), || {
        describe(rt, &bootstrap(nodes), topic).filter(|ps| want(ps))
    })
    .0
}

#[test]
fn reassignment_and_rebalance_move_replicas_under_load_and_lose_nothing() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/reassign", zk.connect_string());
    let rt = rt();
    let mut nodes = start_cluster(&connect);
    let topic = "moving";
    let partitions = 2u32;
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin.create_topic_replicated(topic, partitions, 2, &[]).await.expect("create RF 2");
    });
    wait_isr(&rt, &nodes, topic, 2, Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let producer = spawn_producer(bootstrap(&nodes), topic, partitions, stop.clone(), acked.clone());
    let acked_past = |n: usize| {
        let (_, took) = wait_for(&format!("over {n} acknowledged"), Duration::from_secs(90), || {
            let now = acked.lock().expect("acked").len();
            (now > n).then_some(())
        });
        eprintln!("over {n} acknowledged after {took:?}");
    };
    acked_past(5_000);

    // Bad requests are refused with a reason, before the controller sees them.
    let (ok, text) =
        cluster_cli(&connect, &["reassign", "--topic", topic, "--partition", "0", "--replicas", "1,9"]);
    assert!(!ok && text.contains("broker 9 is not registered"), "{text}");
    let (ok, text) =
        cluster_cli(&connect, &["reassign", "--topic", topic, "--partition", "7", "--replicas", "1"]);
    assert!(!ok && text.contains("moving-7: no such partition"), "{text}");
    let (ok, text) = cluster_cli(
        &connect,
        &["reassign", "--topic", "__consumer_offsets", "--partition", "0", "--replicas", "1"],
    );
    assert!(!ok && text.contains("cannot be reassigned"), "{text}");

    // 1. Partition 0 to a new pair: the broker without it takes the lead,
    //    its preferred (and likely leading) replica leaves.
    let before = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    let old = before[0].replicas.clone();
    let spare = (1..=3).find(|b| !old.contains(b)).expect("a broker without partition 0");
    let target = vec![spare, old[1]];
    let list = format!("{},{}", target[0], target[1]);
    let n = acked.lock().expect("acked").len();
    let (ok, text) =
        cluster_cli(&connect, &["reassign", "--topic", topic, "--partition", "0", "--replicas", &list]);
    assert!(ok && text.contains("reassignment done"), "{text}");
    // Done in ZooKeeper: the brokers' metadata follows within milliseconds.
    let after = settled(&rt, &nodes, topic, |ps: &[PartitionDescription]| {
        ps[0].replicas == target && ps[0].isr.len() == target.len()
    });
    assert_eq!(after[0].replicas, target);
    let mut isr = after[0].isr.clone();
    isr.sort_unstable();
    let mut want = target.clone();
    want.sort_unstable();
    assert_eq!(isr, want, "{after:?}");
    assert!(target.contains(&after[0].leader_broker), "{after:?}");
    assert_eq!(after[1].replicas, before[1].replicas, "partition 1 untouched");
    let dropped = nodes.iter().find(|n| n.id == old[0]).expect("old replica");
    wait_deleted(dropped.dir.path(), topic, 0);
    acked_past(n + 2_000);
    let (ok, text) =
        cluster_cli(&connect, &["reassign", "--topic", topic, "--partition", "0", "--replicas", &list]);
    assert!(ok && text.contains("nothing to move"), "{text}");

    // 2. A fourth broker joins: `rebalance` gives it its share.
    nodes.push(Node::start_with(4, &connect, &["--replica-lag-time-max-ms", LAG_MS]));
    wait_registered(&connect, 4);
    let (ok, text) = cluster_cli(&connect, &["rebalance", "--dry-run"]);
    assert!(ok && text.contains("partition(s) to move"), "{text}");
    let unchanged = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    assert!(unchanged.iter().all(|p| !p.replicas.contains(&4)), "a dry run moves nothing");
    let n = acked.lock().expect("acked").len();
    // Handed over, then the controller is SIGKILLed: its successor finishes it.
    let (ok, text) = cluster_cli(&connect, &["rebalance", "--no-wait"]);
    assert!(ok && text.contains("handed to the controller"), "{text}");
    let controller = |text: &str| -> Option<i32> {
        let line = text.lines().find(|l| l.starts_with("controller: broker "))?;
        line["controller: broker ".len()..].split(' ').next()?.parse().ok()
    };
    let (_, status) = cluster_cli(&connect, &["status"]);
    let killed = controller(&status).expect("a controller");
    nodes.iter_mut().find(|n| n.id == killed).expect("controller node").kill();
    wait_for("a new controller", Duration::from_secs(SESSION_MS / 1000 + 15), || {
        let (_, status) = cluster_cli(&connect, &["status"]);
        controller(&status).filter(|c| *c != killed).map(|_| ())
    });
    nodes.iter_mut().find(|n| n.id == killed).expect("controller node").spawn();
    wait_for("the rebalance completes under the new controller", Duration::from_secs(60), || {
        let (ok, text) = cluster_cli(&connect, &["status", "--output", "json"]);
        (ok && text.contains("\"reassignments\":[]")).then_some(())
    });
    let spread = settled(&rt, &nodes, topic, |ps: &[PartitionDescription]| {
        ps.iter().all(|p| p.replicas.len() == 2 && p.isr.len() == 2)
            && (1..=4).all(|b| ps.iter().any(|p| p.replicas.contains(&b)))
    });
    for b in 1..=4 {
        let held = spread.iter().filter(|p| p.replicas.contains(&b)).count();
        assert_eq!(held, 1, "broker {b} holds {held} of 4 replicas: {spread:?}");
    }
    acked_past(n + 2_000);

    // 3. Decommissioning: every replica off broker 1.
    let (ok, text) = cluster_cli(&connect, &["rebalance", "--exclude-broker", "1"]);
    assert!(ok && text.contains("reassignment done"), "{text}");
    let off = settled(&rt, &nodes, topic, |ps: &[PartitionDescription]| {
        ps.iter().all(|p| !p.replicas.contains(&1) && p.isr.len() == 2)
    });
    assert!(off.iter().all(|p| !p.replicas.contains(&1) && p.leader_broker != 1), "{off:?}");
    for p in 0..partitions {
        wait_deleted(nodes[0].dir.path(), topic, p);
    }
    let (ok, text) = cluster_cli(&connect, &["status", "--output", "json"]);
    assert!(ok && text.contains("\"reassignments\":[]"), "{text}");
    let n = acked.lock().expect("acked").len();
    acked_past(n + 2_000);

    stop.store(true, Ordering::Relaxed);
    producer.join().expect("producer thread");
    let acked = acked.lock().expect("acked").clone();
    eprintln!("{} records acknowledged through three reassignments", acked.len());
    check_acknowledged(&rt, &bootstrap(&nodes), topic, partitions, &acked);
    // The replicas that moved hold the same bytes as those that stayed.
    let layout = describe(&rt, &bootstrap(&nodes), topic).expect("describe");
    for n in &mut nodes {
        n.stop();
    }
    for (p, d) in layout.iter().enumerate() {
        let logs: Vec<(i32, Vec<u8>)> = d
            .replicas
            .iter()
            .map(|b| {
                (*b, stored_log(nodes.iter().find(|n| n.id == *b).expect("node").dir.path(), topic, p as u32))
            })
            .collect();
        assert!(!logs[0].1.is_empty());
        for (b, log) in &logs {
            assert!(
                log == &logs[0].1,
                "partition {p}: broker {b}'s copy differs from broker {}'s",
                logs[0].0
            );
        }
    }
}

#[test]
fn a_broker_that_lost_its_data_directory_catches_up_and_then_alone_has_everything() {
    let _one = serial();
    let Some(zk) = zk::Ensemble::start() else { return };
    let connect = format!("{}/wiped", zk.connect_string());
    let rt = rt();
    let mut nodes = start_cluster(&connect);
    let topic = "wiped";
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(bootstrap(&nodes))).await.expect("admin");
        admin
            .create_topic_replicated(topic, 1, 3, &[("min.insync.replicas".into(), "2".into())])
            .await
            .expect("create RF 3");
    });
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let producer = spawn_producer(bootstrap(&nodes), topic, 1, stop.clone(), acked.clone());
    wait_for("the producer gets going", Duration::from_secs(20), || {
        (acked.lock().expect("acked").len() > 5_000).then_some(())
    });
    // The leader dies and its disk is lost.
    let leader = describe(&rt, &bootstrap(&nodes), topic).expect("describe")[0].leader_broker;
    let node = nodes.iter_mut().find(|n| n.id == leader).expect("leader node");
    node.kill();
    let others: String =
        nodes.iter().filter(|n| n.id != leader).map(|n| n.listen.as_str()).collect::<Vec<_>>().join(",");
    wait_for("the dead leader leaves the ISR", Duration::from_secs(SESSION_MS / 1000 + 15), || {
        describe(&rt, &others, topic).filter(|ps| !ps[0].isr.contains(&leader) && !ps[0].offline).map(|_| ())
    });
    let node = nodes.iter_mut().find(|n| n.id == leader).expect("leader node");
    for entry in std::fs::read_dir(node.dir.path()).expect("data dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).expect("wipe");
        } else {
            std::fs::remove_file(&path).expect("wipe");
        }
    }
    let n = acked.lock().expect("acked").len();
    node.spawn();
    // Empty, it is a follower that must copy everything before it is in sync.
    wait_isr(&rt, &nodes, topic, 3, Duration::from_secs(60));
    wait_for("acks=all go on", Duration::from_secs(20), || {
        (acked.lock().expect("acked").len() > n + 2_000).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    producer.join().expect("producer thread");
    let acked = acked.lock().expect("acked").clone();
    // Once it holds what the leader holds, the other two die: it alone
    // must serve every acknowledged record.
    let current = describe(&rt, &bootstrap(&nodes), topic).expect("describe")[0].leader_broker;
    let wiped_dir = nodes.iter().find(|n| n.id == leader).expect("wiped").dir.path().to_path_buf();
    let leader_dir = nodes.iter().find(|n| n.id == current).expect("leader").dir.path().to_path_buf();
    wait_for("the wiped replica holds the leader's bytes", Duration::from_secs(20), || {
        (stored_log(&wiped_dir, topic, 0) == stored_log(&leader_dir, topic, 0)).then_some(())
    });
    for n in nodes.iter_mut().filter(|n| n.id != leader) {
        n.kill();
    }
    let alone = nodes.iter().find(|n| n.id == leader).expect("wiped").listen.clone();
    // (Until both sessions have ended the ISR names a dead broker, and the
    // high watermark waits for it.)
    wait_for("the wiped broker leads alone", Duration::from_secs(SESSION_MS / 1000 + 15), || {
        describe(&rt, &alone, topic)
            .filter(|ps| ps[0].leader_broker == leader && !ps[0].offline && ps[0].isr == [leader])
            .map(|_| ())
    });
    eprintln!("{} acknowledged records; reading them from broker {leader} alone", acked.len());
    check_acknowledged(&rt, &alone, topic, 1, &acked);
}
