//! `shardlog-bench cluster`: the cluster benchmarks of issue 11, against a
//! real 3-node ZooKeeper ensemble (Debian's package) and real `shardlog
//! serve` processes on this one machine.
//!
//! 1. **Metadata propagation**: a topic is created through a broker that
//!    is not the controller; the time runs from the CreateTopics request to
//!    the moment every broker's Metadata lists each partition with a live
//!    leader (each broker polled every millisecond). Median and max of
//!    `propagation_rounds`.
//! 2. **Produce throughput**: the same closed loop (one producer, acks=1,
//!    `record_bytes` records with keys, `partitions` partitions) for
//!    `seconds` against 3 brokers of one shard each and against 1 broker
//!    with 3 shards: what the cluster layer costs. Client and broker CPU
//!    per record apart, and memcpy bandwidth measured in the same run.
//! 3. **Controller failover**: the controller is SIGKILLed (its session
//!    lives until the timeout) or SIGTERMed (it closes its session), and
//!    the time runs to the moment another broker holds `/shardlog/controller`
//!    (polled every 5 ms). The killed broker restarts between rounds.

#[path = "../../broker/tests/common/zk.rs"]
pub(crate) mod zk;

use crate::broker::{self, Broker, SpawnOptions};
use crate::env;
use anyhow::{bail, Context};
use clap::Args;
use shardlog_broker::cluster::controller;
use shardlog_broker::cluster::zk as zkm;
use shardlog_client::{Acks, Admin, ClientConfig, ErrorCode, Producer, ProducerConfig, ProducerRecord};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[arg(long, default_value_t = 10)]
    propagation_rounds: usize,
    /// Rounds of each failover kind (SIGKILL, SIGTERM).
    #[arg(long, default_value_t = 5)]
    failover_rounds: usize,
    /// `--zookeeper-session-timeout-ms` of every broker.
    #[arg(long, default_value_t = 2000)]
    session_ms: u64,
    /// Seconds of each throughput measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 12)]
    partitions: u32,
    #[arg(long, default_value_t = 1024)]
    record_bytes: usize,
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    #[arg(long, default_value = "perf-reports")]
    out: PathBuf,
}

/// Three brokers of one cluster and how to restart each.
struct Cluster {
    connect: String,
    brokers: BTreeMap<i32, (Broker, SpawnOptions)>,
}

pub(crate) fn spawn_member(
    bin: &Path,
    root: &Path,
    id: i32,
    connect: &str,
    session_ms: u64,
) -> anyhow::Result<(Broker, SpawnOptions)> {
    let opts = SpawnOptions {
        binary: bin.to_path_buf(),
        data_dir: root.join(format!("broker-{id}")),
        shards: Some(1),
        cpus: None,
        extra_args: [
            "--no-pin-cores",
            "--broker-id",
            &id.to_string(),
            "--zookeeper",
            connect,
            "--advertised-host",
            "127.0.0.1",
            "--zookeeper-session-timeout-ms",
            &session_ms.to_string(),
            "--offsets-topic-partitions",
            "3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    Ok((Broker::spawn(&opts)?, opts))
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn cpu_s(pid: u32) -> f64 {
    env::sample_proc(pid, 0.0).map_or(0.0, |s| s.cpu_user_s + s.cpu_sys_s)
}

/// Whether `bootstrap` serves `topic` with a live leader for every partition.
async fn servable(admin: &Admin, topic: &str) -> bool {
    match admin.metadata(Some(&[topic.to_string()])).await {
        Ok(md) => md.topic(topic).is_some_and(|t| {
            !t.partitions.is_empty()
                && t.partitions.iter().all(|p| p.error == ErrorCode::None && p.leader_broker >= 0)
        }),
        Err(_) => false,
    }
}

/// Propagation rounds: (CreateTopics answered, servable on every broker), ms.
async fn propagation(cluster: &Cluster, rounds: usize, partitions: u32) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut admins = Vec::new();
    for (b, _) in cluster.brokers.values() {
        admins.push(Admin::connect(ClientConfig::new(&b.ready.listen)).await?);
    }
    let mut out = Vec::new();
    for i in 0..rounds {
        let name = format!("propagation-{i}");
        let t0 = Instant::now();
        admins[1].create_topic(&name, partitions, &[]).await.with_context(|| format!("create {name}"))?;
        let answered = t0.elapsed();
        let mut pending: Vec<usize> = (0..admins.len()).collect();
        while !pending.is_empty() {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("{name} not servable on every broker within 30 s");
            }
            let mut still = Vec::new();
            for i in pending {
                if !servable(&admins[i], &name).await {
                    still.push(i);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        out.push((answered.as_secs_f64() * 1e3, t0.elapsed().as_secs_f64() * 1e3));
    }
    Ok(out)
}

/// What one throughput measurement gives.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Throughput {
    pub records_per_s: f64,
    pub bytes_per_s: f64,
    pub client_cpu_us_per_record: f64,
    pub broker_cpu_us_per_record: f64,
}

/// A closed loop of keyed records through `bootstrap` for `seconds`.
pub(crate) async fn produce(
    bootstrap: &str,
    topic: &str,
    seconds: u64,
    record_bytes: usize,
    pids: &[u32],
    acks: Acks,
) -> anyhow::Result<Throughput> {
    let producer =
        Producer::new(ProducerConfig { client: ClientConfig::new(bootstrap), acks, ..Default::default() })
            .await?;
    let value = bytes::Bytes::from(vec![b'x'; record_bytes]);
    // Warm-up: connections, metadata, first batches.
    for i in 0..10_000u64 {
        producer.send(ProducerRecord::new(topic, value.clone()).with_key(i.to_string())).await?.await?;
        if i >= 100 {
            break;
        }
    }
    let (client0, brokers0) = (cpu_s(std::process::id()), pids.iter().map(|p| cpu_s(*p)).sum::<f64>());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(seconds);
    let mut pending = VecDeque::new();
    let mut acked = 0u64;
    let mut i = 0u64;
    while Instant::now() < deadline {
        pending.push_back(
            producer.send(ProducerRecord::new(topic, value.clone()).with_key(i.to_string())).await?,
        );
        i += 1;
        if pending.len() > 50_000 {
            pending.pop_front().expect("pending").await?;
            acked += 1;
        }
    }
    for d in pending {
        d.await?;
        acked += 1;
    }
    let took = t0.elapsed().as_secs_f64();
    let client = cpu_s(std::process::id()) - client0;
    let broker = pids.iter().map(|p| cpu_s(*p)).sum::<f64>() - brokers0;
    producer.close().await?;
    let n = acked as f64;
    Ok(Throughput {
        records_per_s: n / took,
        bytes_per_s: n * record_bytes as f64 / took,
        client_cpu_us_per_record: client * 1e6 / n,
        broker_cpu_us_per_record: broker * 1e6 / n,
    })
}

/// Failover rounds of one kind: ms from the signal to a new controller.
fn failover(
    cluster: &mut Cluster,
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    signal: i32,
) -> anyhow::Result<Vec<f64>> {
    let client = rt.block_on(zkm::connect(&cluster.connect, Duration::from_secs(6)))?;
    let controller_now = || rt.block_on(controller::read_controller(&client)).ok().flatten();
    let mut out = Vec::new();
    for _ in 0..rounds {
        let Some(current) = controller_now() else { bail!("no controller") };
        let (mut b, opts) = cluster.brokers.remove(&current.broker_id).context("controller broker")?;
        let t0 = Instant::now();
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(b.pid() as i32, signal) };
        loop {
            if controller_now().is_some_and(|c| c.broker_id != current.broker_id) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("no new controller within 60 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        out.push(t0.elapsed().as_secs_f64() * 1e3);
        b.stop()?;
        drop(b);
        // Back for the next round, on its data.
        let again = Broker::spawn(&opts)?;
        cluster.brokers.insert(current.broker_id, (again, opts));
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(out)
}

/// What every cluster benchmark starts from: the broker binary, a running
/// 3-node ensemble, a data root, a client runtime, the brokers' connect string.
pub(crate) struct Setup {
    pub bin: PathBuf,
    pub ensemble: zk::Ensemble,
    pub root: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
    pub connect: String,
}

pub(crate) fn setup(broker_bin: Option<&Path>) -> anyhow::Result<Setup> {
    let bin = match broker_bin {
        Some(b) => b.to_path_buf(),
        None => broker::default_binary()?,
    };
    let Some(ensemble) = zk::Ensemble::start() else {
        bail!("ZooKeeper is not installed (apt-get install zookeeper)");
    };
    let root = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let connect = format!("{}/bench", ensemble.connect_string());
    Ok(Setup { bin, ensemble, root, rt, connect })
}

pub fn run(a: &ClusterArgs) -> anyhow::Result<()> {
    let Setup { bin, ensemble, root, rt, connect } = setup(a.broker_bin.as_deref())?;
    let mut cluster = Cluster { connect: connect.clone(), brokers: BTreeMap::new() };
    for id in 1..=3 {
        cluster.brokers.insert(id, spawn_member(&bin, root.path(), id, &connect, a.session_ms)?);
    }
    eprintln!("cluster: metadata propagation, {} rounds", a.propagation_rounds);
    let prop = rt.block_on(propagation(&cluster, a.propagation_rounds, a.partitions))?;
    let memcpy = crate::limits::memcpy_bytes_per_s(64 << 20, 5);

    eprintln!("cluster: produce throughput, 3 brokers x 1 shard");
    let bootstrap: Vec<String> = cluster.brokers.values().map(|(b, _)| b.ready.listen.clone()).collect();
    let bootstrap = bootstrap.join(",");
    rt.block_on(async {
        Admin::connect(ClientConfig::new(&bootstrap))
            .await?
            .create_topic("throughput", a.partitions, &[])
            .await
    })?;
    let pids: Vec<u32> = cluster.brokers.values().map(|(b, _)| b.pid()).collect();
    let three =
        rt.block_on(produce(&bootstrap, "throughput", a.seconds, a.record_bytes, &pids, Acks::Leader))?;

    eprintln!("cluster: controller failover, {} rounds each of SIGKILL and SIGTERM", a.failover_rounds);
    let killed = failover(&mut cluster, &rt, a.failover_rounds, libc::SIGKILL)?;
    let stopped = failover(&mut cluster, &rt, a.failover_rounds, libc::SIGTERM)?;
    drop(cluster);
    drop(ensemble);

    eprintln!("cluster: produce throughput, 1 broker x 3 shards (no ZooKeeper)");
    let single_opts = SpawnOptions {
        binary: bin.clone(),
        data_dir: root.path().join("single"),
        shards: Some(3),
        cpus: None,
        extra_args: vec!["--no-pin-cores".into()],
    };
    let single = Broker::spawn(&single_opts)?;
    let one = rt.block_on(async {
        Admin::connect(ClientConfig::new(&single.ready.listen))
            .await?
            .create_topic("throughput", a.partitions, &[])
            .await?;
        produce(&single.ready.listen, "throughput", a.seconds, a.record_bytes, &[single.pid()], Acks::Leader)
            .await
    })?;
    drop(single);

    write_report(a, root.path(), &prop, &killed, &stopped, three, one, memcpy)
}

#[allow(clippy::too_many_arguments)]
fn write_report(
    a: &ClusterArgs,
    data_dir: &Path,
    prop: &[(f64, f64)],
    killed: &[f64],
    stopped: &[f64],
    three: Throughput,
    one: Throughput,
    memcpy: f64,
) -> anyhow::Result<()> {
    let env::ReportName { base, date, sha } =
        env::report_base(&a.out, "cluster", a.broker_bin.as_deref(), data_dir)?;
    let answered: Vec<f64> = prop.iter().map(|p| p.0).collect();
    let everywhere: Vec<f64> = prop.iter().map(|p| p.1).collect();
    let json = serde_json::json!({
        "brokers": 3, "shards_per_broker": 1, "session_timeout_ms": a.session_ms, "partitions": a.partitions,
        "record_bytes": a.record_bytes, "seconds": a.seconds, "memcpy_bytes_per_s": memcpy,
        "propagation_ms": { "create_answered": answered, "servable_everywhere": everywhere },
        "controller_failover_ms": { "sigkill": killed, "sigterm": stopped },
        "produce": { "three_brokers_one_shard_each": three, "one_broker_three_shards": one },
    });
    std::fs::write(base.with_extension("json"), serde_json::to_string_pretty(&json)?)?;
    let row = |name: &str, t: &Throughput| {
        format!(
            "| {name} | {:.0} | {:.1} MB/s ({:.4} of memcpy) | {:.2} us | {:.2} us |\n",
            t.records_per_s,
            t.bytes_per_s / 1e6,
            t.bytes_per_s / memcpy,
            t.client_cpu_us_per_record,
            t.broker_cpu_us_per_record
        )
    };
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ");
    let md = format!(
        "# Cluster: metadata propagation, controller failover, what the cluster layer costs ({date}, {sha})\n\n\
         `shardlog-bench cluster`: a real 3-node ZooKeeper ensemble (Debian's package, 128 MiB heaps, tick 500 ms) and \
         3 `shardlog serve` brokers of one shard each, session timeout {} ms, all on this 2-core machine with the \
         load generator.\n\n\
         ## Metadata propagation ({} rounds, {} partitions, created through a broker that is not the controller)\n\n\
         | | median | max | all (ms) |\n|---|---|---|---|\n\
         | CreateTopics answered | {:.1} ms | {:.1} ms | {} |\n\
         | servable on every broker (every partition with a live leader in each broker's Metadata) | {:.1} ms | {:.1} ms | {} |\n\n\
         ## Controller failover ({} rounds each)\n\n\
         | | median | max | all (ms) |\n|---|---|---|---|\n\
         | controller SIGKILLed (its session lives until the timeout) | {:.0} ms | {:.0} ms | {} |\n\
         | controller SIGTERMed (it closes its session) | {:.0} ms | {:.0} ms | {} |\n\n\
         The bound of the SIGKILL case is the session timeout ({} ms) plus the ensemble's session tick and one round \
         of the next broker's control thread.\n\n\
         ## Produce throughput: 3 brokers against 1 broker with the same total shards\n\n\
         One producer, acks=1, {} B records with keys over {} partitions, closed loop for {} s; memcpy measured in \
         the same run: {:.1} GB/s.\n\n\
         | | records/s | bytes/s | client CPU per record | broker CPU per record (all brokers) |\n|---|---|---|---|---|\n\
         {}{}\n\
         The cluster moves {:.2}x the single broker's records per second here. Both set-ups share 2 cores with the \
         client, so this measures the cost of the layer (three processes, three reactors, three connections from the \
         client, ZooKeeper's JVMs idle beside them), not what three machines would do.\n",
        a.session_ms,
        prop.len(),
        a.partitions,
        median(&answered),
        max(&answered),
        list(&answered),
        median(&everywhere),
        max(&everywhere),
        list(&everywhere),
        a.failover_rounds,
        median(killed),
        max(killed),
        list(killed),
        median(stopped),
        max(stopped),
        list(stopped),
        a.session_ms,
        a.record_bytes,
        a.partitions,
        a.seconds,
        memcpy / 1e9,
        row("3 brokers x 1 shard (ZooKeeper)", &three),
        row("1 broker x 3 shards (no ZooKeeper)", &one),
        three.records_per_s / one.records_per_s,
    );
    std::fs::write(base.with_extension("md"), md)?;
    println!("{}", base.with_extension("md").display());
    Ok(())
}
