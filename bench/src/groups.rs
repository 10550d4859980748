//! `shardlog-bench groups`: the consumer-group benchmarks of issue 10,
//! against a real `shardlog serve` process.
//!
//! 1. **Rebalance**: `members` consumers (one process, one tokio runtime)
//!    form a group over a topic of `partitions` partitions; then a member
//!    joins, and later one leaves, `rounds` times each. A rebalance's time
//!    runs from the join (or the leave) to the moment every member polls
//!    with the new generation and the partitions are all assigned again.
//!    Members learn of a rebalance from their next heartbeat, so the
//!    heartbeat interval bounds it from below; it is a flag and is printed.
//! 2. **Commits**: `tasks` concurrent tasks commit one offset each per
//!    request (simple commits of an empty group) to one coordinator shard
//!    for `seconds`; next to it, in the same run, the same tasks send
//!    OffsetFetch to the same shard (the request path without the append):
//!    the ratio is the append's cost. Broker CPU per commit from /proc.
//! 3. **Compaction**: the commits go on until `total_commits` (default one
//!    million) over `tasks` keys, then the group's `__consumer_offsets`
//!    partition is measured on disk (after the compaction check), the
//!    broker restarts, and the group's offsets must be the last ones
//!    committed.

use crate::broker::{self, Broker, SpawnOptions};
use crate::env;
use anyhow::{bail, Context};
use clap::Args;
use shardlog_client::{Admin, ClientConfig, Consumer, ConsumerConfig, GroupSettings, OffsetReset};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct GroupsArgs {
    #[arg(long, default_value_t = 100)]
    members: usize,
    #[arg(long, default_value_t = 1000)]
    partitions: u32,
    /// Joins and leaves measured (each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Members' heartbeat interval, ms (Kafka's default is 3000).
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// Seconds of each commit and fetch measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Commits in total before the compaction check (0: skip it).
    #[arg(long, default_value_t = 1_000_000)]
    total_commits: u64,
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// `--offsets-topic-segment-bytes` of the broker: compaction rewrites
    /// sealed segments only, so this is the uncompacted part's size.
    #[arg(long, default_value_t = 16 << 20)]
    offsets_segment_bytes: u64,
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where the Markdown and JSON reports go.
    #[arg(long)]
    out: PathBuf,
}

/// Per member: (generation, partitions assigned) as of its last poll.
type Views = Arc<Mutex<Vec<Option<(i32, usize)>>>>;

struct Member {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

fn settings(group: &str, heartbeat_ms: u64) -> GroupSettings {
    let mut s = GroupSettings::new(group);
    s.heartbeat_interval = Duration::from_millis(heartbeat_ms);
    s.session_timeout = Duration::from_secs(10);
    s.rebalance_timeout = Duration::from_secs(30);
    s.auto_commit_interval = None;
    s
}

async fn spawn_member(
    bootstrap: &str,
    topic: &str,
    group: &GroupSettings,
    views: &Views,
) -> anyhow::Result<Member> {
    let slot = {
        let mut v = views.lock().expect("views");
        v.push(None);
        v.len() - 1
    };
    let cfg = ConsumerConfig {
        client: ClientConfig { bootstrap: bootstrap.to_string(), ..ClientConfig::default() },
        offset_reset: OffsetReset::Latest,
        group: Some(group.clone()),
        ..ConsumerConfig::default()
    };
    let mut c = Consumer::new(cfg).await.context("create consumer")?;
    c.subscribe(&[topic.to_string()]).await.context("subscribe")?;
    let stop = Arc::new(AtomicBool::new(false));
    let (views, flag) = (views.clone(), stop.clone());
    let task = tokio::spawn(async move {
        while !flag.load(Ordering::Relaxed) {
            c.poll(Duration::from_millis(10)).await.context("poll")?;
            let me = c.group_member().map(|(g, _)| (g, c.assignment().len()));
            views.lock().expect("views")[slot] = me;
        }
        views.lock().expect("views")[slot] = None;
        c.close().await.context("close")?;
        Ok(())
    });
    Ok(Member { stop, task })
}

/// Waits until `live` members share one generation above `after` and hold
/// `partitions` partitions between them; returns the generation.
async fn stable(views: &Views, live: usize, partitions: usize, after: i32) -> anyhow::Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let v = views.lock().expect("views");
            let present: Vec<(i32, usize)> = v.iter().flatten().copied().collect();
            if present.len() == live
                && present.iter().all(|(g, _)| *g == present[0].0 && *g > after)
                && present.iter().map(|(_, n)| n).sum::<usize>() == partitions
            {
                return Ok(present[0].0);
            }
        }
        if Instant::now() > deadline {
            bail!("the group did not settle in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

struct Rebalances {
    initial_s: f64,
    joins_ms: Vec<f64>,
    leaves_ms: Vec<f64>,
}

async fn rebalances(a: &GroupsArgs, bootstrap: &str) -> anyhow::Result<Rebalances> {
    let admin =
        Admin::connect(ClientConfig { bootstrap: bootstrap.to_string(), ..ClientConfig::default() }).await?;
    admin.create_topic("rebalance", a.partitions, &[]).await.context("create topic")?;
    let group = settings("rebalancing", a.heartbeat_ms);
    let views: Views = Arc::default();
    let started = Instant::now();
    let mut members = Vec::new();
    for _ in 0..a.members {
        members.push(spawn_member(bootstrap, "rebalance", &group, &views).await?);
    }
    let mut gen = stable(&views, a.members, a.partitions as usize, 0).await?;
    let initial_s = started.elapsed().as_secs_f64();
    let (mut joins_ms, mut leaves_ms) = (Vec::new(), Vec::new());
    for _ in 0..a.rounds {
        let t = Instant::now();
        members.push(spawn_member(bootstrap, "rebalance", &group, &views).await?);
        gen = stable(&views, members.len(), a.partitions as usize, gen).await?;
        joins_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let leaving = members.remove(0);
        leaving.stop.store(true, Ordering::Relaxed);
        leaving.task.await.context("member task")??;
        gen = stable(&views, members.len(), a.partitions as usize, gen).await?;
        leaves_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for m in members {
        m.stop.store(true, Ordering::Relaxed);
        m.task.await.context("member task")??;
    }
    Ok(Rebalances { initial_s, joins_ms, leaves_ms })
}

/// Requests per second of `op` from `tasks` tasks for `seconds`, and the
/// broker's CPU seconds over the window.
async fn rate<F, Fut>(tasks: usize, seconds: u64, pid: u32, op: F) -> anyhow::Result<(f64, f64)>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_s(pid)?;
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (op, done, stop) = (op.clone(), done.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                op(task, n).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.context("request task")??;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((done.load(Ordering::Relaxed) as f64 / secs, cpu_s(pid)? - cpu0))
}

fn cpu_s(pid: u32) -> anyhow::Result<f64> {
    let s = env::sample_proc(pid, 0.0).context("broker process is gone")?;
    Ok(s.cpu_user_s + s.cpu_sys_s)
}

/// Disk space the files of `dir` occupy (allocated blocks: the active
/// segment is preallocated ahead of its data).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|es| es.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.blocks() * 512).sum())
        .unwrap_or(0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(a: &GroupsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run_async(a))
}

async fn run_async(a: &GroupsArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data_dir = a.data_dir.clone().unwrap_or_else(|| tmp.path().join("data"));
    let opts = SpawnOptions {
        binary: a.broker_bin.clone().map_or_else(broker::default_binary, Ok)?,
        data_dir: data_dir.clone(),
        shards: Some(a.shards),
        cpus: None,
        extra_args: vec![
            "--retention-check-interval-ms".into(),
            "1000".into(),
            "--offsets-topic-segment-bytes".into(),
            a.offsets_segment_bytes.to_string(),
        ],
    };
    let mut b = Broker::spawn(&opts)?;
    let bootstrap = b.ready.listen.clone();
    eprintln!(
        "shardlog-bench groups: broker at {bootstrap}; {} members over {} partitions",
        a.members, a.partitions
    );
    let rb = rebalances(a, &bootstrap).await?;
    eprintln!(
        "rebalance: join median {:.0} ms, leave median {:.0} ms (heartbeat {} ms)",
        median(&rb.joins_ms),
        median(&rb.leaves_ms),
        a.heartbeat_ms
    );

    let admin = Arc::new(
        Admin::connect(ClientConfig { bootstrap: bootstrap.clone(), ..ClientConfig::default() }).await?,
    );
    admin.create_topic("committed", a.tasks as u32, &[]).await.context("create topic")?;
    let last = Arc::new(Mutex::new(vec![0u64; a.tasks]));
    let commit = {
        let (admin, last) = (admin.clone(), last.clone());
        move |task: usize, n: u64| {
            let (admin, last) = (admin.clone(), last.clone());
            async move {
                admin.alter_group_offsets("committer", &[("committed".to_string(), task as u32, n)]).await?;
                last.lock().expect("last")[task] = n;
                anyhow::Ok(())
            }
        }
    };
    let pid = b.pid();
    let (commits_per_s, commit_cpu) = rate(a.tasks, a.seconds, pid, commit.clone()).await?;
    let fetch = {
        let admin = admin.clone();
        move |task: usize, _: u64| {
            let admin = admin.clone();
            async move {
                admin.group_offsets_of("committer", &[("committed".to_string(), task as u32)]).await?;
                anyhow::Ok(())
            }
        }
    };
    let (fetches_per_s, fetch_cpu) = rate(a.tasks, a.seconds, pid, fetch).await?;
    let commit_cpu_us = commit_cpu / (commits_per_s * a.seconds as f64) * 1e6;
    let fetch_cpu_us = fetch_cpu / (fetches_per_s * a.seconds as f64) * 1e6;
    eprintln!(
        "commits: {commits_per_s:.0}/s ({commit_cpu_us:.1} broker CPU us each); fetches {fetches_per_s:.0}/s"
    );

    let offsets_dir = data_dir.join(format!(
        "{}-{}",
        shardlog_schema::types::OFFSETS_TOPIC,
        shardlog_schema::types::group_partition("committer", 16)
    ));
    let mut compaction = None;
    let so_far = (commits_per_s * a.seconds as f64) as u64;
    if a.total_commits > so_far {
        let per_task = (a.total_commits - so_far).div_ceil(a.tasks as u64);
        let t = Instant::now();
        let mut handles = Vec::new();
        for task in 0..a.tasks {
            let (commit, start) = (commit.clone(), last.lock().expect("last")[task]);
            handles.push(tokio::spawn(async move {
                for n in start + 1..=start + per_task {
                    commit(task, n).await?;
                }
                anyhow::Ok(())
            }));
        }
        for h in handles {
            h.await.context("commit task")??;
        }
        let total = so_far + per_task * a.tasks as u64;
        eprintln!("{total} commits in all ({:.1} s for the rest)", t.elapsed().as_secs_f64());
        let before = dir_bytes(&offsets_dir);
        let p = shardlog_schema::types::group_partition("committer", 16);
        let d = admin.describe_topic(shardlog_schema::types::OFFSETS_TOPIC).await?;
        let log_end = d.partitions.iter().find(|x| x.partition == p.0).map_or(0, |x| x.end_offset);
        // The broker's compaction check runs every second.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = dir_bytes(&offsets_dir);
        drop(admin);
        b.stop()?;
        let b2 = Broker::spawn(&opts)?;
        let admin2 =
            Admin::connect(ClientConfig { bootstrap: b2.ready.listen.clone(), ..ClientConfig::default() })
                .await?;
        let got = admin2.group_offsets("committer").await?;
        let want = last.lock().expect("last").clone();
        let ok = want
            .iter()
            .enumerate()
            .all(|(p, n)| got.iter().any(|c| c.partition == p as u32 && c.offset == Some(*n)));
        if !ok {
            bail!("after the restart the group's offsets are not the last ones committed");
        }
        compaction = Some((total, before, after, log_end));
        b = b2;
    }
    drop(b);

    let env::ReportName { base, date, sha } =
        env::report_base(&a.out, "groups", a.broker_bin.as_deref(), &data_dir)?;
    let json = serde_json::json!({
        "members": a.members, "partitions": a.partitions, "heartbeat_ms": a.heartbeat_ms,
        "initial_join_s": rb.initial_s, "join_rebalance_ms": rb.joins_ms, "leave_rebalance_ms": rb.leaves_ms,
        "tasks": a.tasks, "seconds": a.seconds, "shards": a.shards, "offsets_segment_bytes": a.offsets_segment_bytes,
        "commits_per_s": commits_per_s, "commit_broker_cpu_us": commit_cpu_us,
        "offset_fetches_per_s": fetches_per_s, "offset_fetch_broker_cpu_us": fetch_cpu_us,
        "compaction": compaction.map(|(n, before, after, log_end)| serde_json::json!({
            "commits": n, "offsets_partition_log_end": log_end, "keys": a.tasks, "offsets_partition_bytes_before_check": before,
            "offsets_partition_bytes_after_check": after, "restart_recovered_latest": true,
        })),
    });
    std::fs::write(base.with_extension("json"), serde_json::to_string_pretty(&json)?)?;
    let mut md = format!(
        "# Consumer groups: rebalance, commits, compaction ({date}, {sha})\n\n\
         `shardlog-bench groups` against `shardlog serve --shards {}` on this machine; client and broker share its 2 cores.\n\n\
         ## Rebalance: {} members, {} partitions, eager protocol, heartbeat {} ms\n\n\
         | | median | all |\n|---|---|---|\n\
         | a member joins | {:.0} ms | {:?} |\n| a member leaves | {:.0} ms | {:?} |\n\n\
         The first join of the {} members took {:.2} s (it includes the group's initial rebalance delay, 3 s).\n\
         A rebalance's time runs until every member polls with the new generation; members learn of it from \
         their next heartbeat, so the heartbeat interval is a floor of the join figure.\n\n\
         ## Offset commits: one coordinator shard, {} tasks, one offset per request\n\n\
         | | per second | broker CPU per request |\n|---|---|---|\n\
         | OffsetCommit (append to `__consumer_offsets`) | {:.0} | {:.1} us |\n\
         | OffsetFetch of one partition (same path, no append: the request path's limit here) | {:.0} | {:.1} us |\n\n\
         Commits reach {:.0} % of the fetch rate measured in the same run.\n",
        a.shards, a.members, a.partitions, a.heartbeat_ms,
        median(&rb.joins_ms), rb.joins_ms.iter().map(|v| v.round()).collect::<Vec<_>>(),
        median(&rb.leaves_ms), rb.leaves_ms.iter().map(|v| v.round()).collect::<Vec<_>>(),
        a.members, rb.initial_s, a.tasks,
        commits_per_s, commit_cpu_us, fetches_per_s, fetch_cpu_us, 100.0 * commits_per_s / fetches_per_s,
    );
    if let Some((n, before, after, log_end)) = compaction {
        md.push_str(&format!(
            "\n## Compaction\n\n{n} commits over {} keys, offsets topic segments of {} bytes: the group's offsets \
             partition occupied {before} bytes on disk right after the last commit and {after} bytes once the compaction check had run, for a log of {log_end} records (its end offset: every commit \
             appended); after a broker restart the group's offsets were the last ones \
             committed.\n",
            a.tasks,
            a.offsets_segment_bytes,
        ));
    }
    std::fs::write(base.with_extension("md"), md)?;
    println!("{}", base.with_extension("md").display());
    Ok(())
}
