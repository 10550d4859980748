//! Running workloads against a broker with the real client: topics, the
//! phases of a repetition (probe, backlog, measured run), consumers, /proc
//! sampling and progress, then the report.
//!
//! Phases of one repetition:
//!
//! ```text
//!  create topics ─┬─ [probe: closed loop, no consumers]   only with producer_rate_fraction_of_max
//!                 ├─ [backlog: write N GB, then drain]     only with consumer_backlog_size_gb
//!                 └─ warm-up ── measured window ── grace (consumers catch up)
//! ```

use crate::breakdown::{self, Breakdown};
use crate::broker::{self, Broker, SpawnOptions};
use crate::env::{self, Environment, ProcSample};
use crate::hist::LatencyHist;
use crate::limits::Limits;
use crate::order::{self, FailedSend, FailedSends, OrderChecker, OrderSummary, SeqScope, Sequencer};
use crate::report::{
    Aggregate, BacklogResult, BrokerInfo, LoadGenInfo, Ratios, Report, RunResult, Series, Throughput,
    REPORT_SCHEMA_VERSION,
};
use crate::sched::{self, Acked, ClientSteps, Clock, Counters, LoopConfig, Schedule, Sender};
use crate::workload::{ConsumerStart, KeyDistribution, Workload};
use crate::RunArgs;
use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use shardlog_client::{
    Acks, Admin, ClientConfig, ClientError, Consumer, ConsumerConfig, DefaultPartitioner, DeliveryFuture,
    Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use std::future::Future;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time consumers get after the producers stop to receive what was acked.
const GRACE_MAX: Duration = Duration::from_secs(15);
/// Chunk from which payloads are cut (amortizes allocation).
const PAYLOAD_CHUNK_BYTES: usize = 1 << 20;
/// Period of the /proc samples of the broker and the load generator.
const SAMPLE_INTERVAL_MS: u64 = 500;

/// Runs every workload of `args` and writes their reports.
pub fn run_all(args: &RunArgs) -> anyhow::Result<()> {
    if args.bootstrap.is_none() && !args.spawn_broker {
        bail!("say where the broker is: --spawn-broker or --bootstrap HOST:PORT");
    }
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let workloads = args
        .workloads
        .iter()
        .map(|p| {
            let mut w = Workload::load(p)?;
            if args.quick {
                w = w.quick();
            }
            if let Some(d) = args.duration_s {
                w.duration_s = d;
            }
            w.validate().map(|()| w)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bench_cpus = match &args.bench_cpus {
        Some(list) => Some(pin_process(&crate::parse_cpu_list(list)?)?),
        None => None,
    };
    let threads = args.client_threads.unwrap_or_else(|| {
        bench_cpus
            .as_ref()
            .map_or_else(|| std::thread::available_parallelism().map_or(2, usize::from), Vec::len)
    });
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all().build()?;
    let data_parent =
        args.data_dir.clone().unwrap_or_else(|| crate::repo_dir().join("target").join("bench-data"));
    let limits = if args.measure_limits {
        Some(crate::measure_and_save_limits(&data_parent, args.quick, &args.out)?)
    } else if let Some(p) = &args.limits {
        Some(crate::load_limits(p)?)
    } else {
        let l = crate::latest_limits(&args.out)?;
        if l.is_none() {
            eprintln!(
                "shardlog-bench: no limits in {}/limits; run `shardlog-bench limits` for ratios",
                args.out.display()
            );
        }
        l
    };
    let lg = LoadGenInfo { cpus: args.bench_cpus.clone(), threads };
    let mut invalid = Vec::new();
    for w in &workloads {
        let report = run_workload(&rt, args, w, limits.clone(), &lg, &data_parent)
            .with_context(|| format!("workload {}", w.name))?;
        let path = report.write(&args.out)?;
        let a = &report.aggregate;
        println!(
            "{}: publish {:.0} msgs/s {:.1} MB/s · consume {:.1} MB/s · publish p99 {:.0} us p99.9 {:.0} us · e2e p99 {:.0} us -> {}",
            w.name,
            a.publish_msgs_per_s.median,
            a.publish_mb_per_s.median,
            a.consume_mb_per_s.median,
            a.publish_p99_us.median,
            a.publish_p999_us.median,
            a.e2e_p99_us.median,
            path.display()
        );
        match &report.invalid {
            Some(why) => {
                println!("{}: INVALID, not a result: {why}", w.name);
                invalid.push(w.name.clone());
            }
            None => {
                println!("{}: order checked: {} order violations", w.name, a.order_violations.unwrap_or(0))
            }
        }
    }
    if !args.no_readme {
        crate::update_readme(&args.out)?;
    }
    if !invalid.is_empty() {
        bail!(
            "{} of {} workloads INVALID (order violations; a fast run that reorders is not a result): {}",
            invalid.len(),
            workloads.len(),
            invalid.join(", ")
        );
    }
    Ok(())
}

/// Restricts this process (and the threads it creates later) to `cpus`.
fn pin_process(cpus: &[usize]) -> anyhow::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        anyhow::ensure!(c < libc::CPU_SETSIZE as usize, "CPU {c} out of range");
        // SAFETY: c < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 = the calling thread; `set` is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("sched_setaffinity for --bench-cpus");
    }
    Ok(cpus.to_vec())
}

fn run_workload(
    rt: &tokio::runtime::Runtime,
    args: &RunArgs,
    w: &Workload,
    limits: Option<Limits>,
    lg: &LoadGenInfo,
    data_parent: &Path,
) -> anyhow::Result<Report> {
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut runs = Vec::new();
    let mut broker_info = BrokerInfo { topic_configs: w.topic_configs(), ..BrokerInfo::default() };
    for rep in 0..args.repetitions {
        let data_dir = data_parent.join(format!("{}-{}-{}", w.name, std::process::id(), rep));
        let mut spawned = None;
        let mut admin = None;
        let (bootstrap, pid) = if args.spawn_broker {
            broker::remove_data_dir(&data_dir);
            let binary = match &args.broker_bin {
                Some(b) => b.clone(),
                None => broker::default_binary()?,
            };
            // With --bench-cpus the broker would inherit our mask: give it all CPUs unless told.
            let cpus = args.broker_cpus.clone().or_else(|| {
                args.bench_cpus.as_ref().map(|_| format!("0-{}", num_cpus_online().saturating_sub(1)))
            });
            // An admin listener for the latency breakdown, unless one was given.
            let mut extra_args = args.broker_args.clone();
            if !extra_args.iter().any(|a| a.starts_with("--admin-listen")) {
                extra_args.push("--admin-listen=127.0.0.1:0".into());
            }
            let opts = SpawnOptions {
                binary: binary.clone(),
                data_dir: data_dir.clone(),
                shards: args.shards,
                cpus: cpus.clone(),
                extra_args,
            };
            let b = Broker::spawn(&opts)?;
            broker_info.mode = "spawned".into();
            broker_info.binary = Some(binary.display().to_string());
            broker_info.args.clone_from(&b.args);
            broker_info.cpus = cpus;
            broker_info.data_dir = Some(data_dir.display().to_string());
            broker_info.shard_ports.clone_from(&b.ready.shard_ports);
            let r = (b.ready.listen.clone(), Some(b.pid()));
            admin.clone_from(&b.ready.admin);
            spawned = Some(b);
            r
        } else {
            broker_info.mode = "external".into();
            (args.bootstrap.clone().unwrap_or_default(), args.broker_pid)
        };
        broker_info.bootstrap.clone_from(&bootstrap);
        eprintln!(
            "shardlog-bench: {} repetition {}/{} against {bootstrap}",
            w.name,
            rep + 1,
            args.repetitions
        );
        let result = rt.block_on(run_once(&bootstrap, admin, args.breakdown, w, rep, pid));
        let spawned_here = spawned.is_some();
        if let Some(mut b) = spawned {
            b.stop()?;
            if !args.keep_data && result.is_ok() {
                broker::remove_data_dir(&data_dir);
                if let Err(e) = std::fs::remove_file(&b.log_path) {
                    eprintln!("shardlog-bench: cannot remove {}: {e}", b.log_path.display());
                }
            }
        }
        let mut result = result?;
        // The floor: fio replays the window's write pattern on the data
        // disk, once a broker this run started has stopped (nothing else
        // writes there then).
        if let Some(b) = result.breakdown.as_mut().filter(|_| spawned_here) {
            if let Some(p) = b.writes.filter(|p| p.writes > 0) {
                let secs = if args.quick { 5 } else { w.duration_s.min(20) };
                match breakdown::fio_write_pattern(data_parent, &p, secs) {
                    Ok(f) => b.fio = Some(f),
                    Err(e) => eprintln!("shardlog-bench: fio replay of the write pattern failed: {e:#}"),
                }
            }
        }
        runs.push(result);
    }
    let env_dir = if data_parent.exists() { data_parent.to_path_buf() } else { crate::repo_dir() };
    let binary = match &args.broker_bin {
        Some(b) => Some(b.clone()),
        None => args.spawn_broker.then(broker::default_binary).transpose()?,
    };
    let environment = Environment::collect(binary.as_deref(), &env_dir);
    let aggregate = Aggregate::of(&runs);
    Ok(Report {
        invalid: crate::report::invalid_reason(&runs),
        schema_version: REPORT_SCHEMA_VERSION,
        tool: format!("shardlog-bench {}", env!("CARGO_PKG_VERSION")),
        started_at_unix_s: started,
        date: crate::report::utc_date(started),
        quick: args.quick,
        environment,
        ratios: Ratios::of(&aggregate, limits.as_ref()),
        limits,
        broker: broker_info,
        load_generator: lg.clone(),
        workload: w.clone(),
        repetitions: runs,
        aggregate,
    })
}

fn num_cpus_online() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Shared state of one repetition.
struct Run {
    w: Workload,
    bootstrap: String,
    topics: Vec<String>,
    clock: Clock,
    /// Next order stream id (one per producer instance, every phase).
    next_stream: AtomicU32,
    /// Records whose send failed, to excuse their gaps in the order check.
    /// Locked only when a send fails.
    failed: Arc<Mutex<Vec<FailedSend>>>,
    /// The broker's `/metrics` listener, for the latency breakdown.
    admin: Option<String>,
    /// Record the breakdown in closed loop too (`--breakdown`).
    breakdown: bool,
}

async fn run_once(
    bootstrap: &str,
    admin: Option<String>,
    breakdown: bool,
    w: &Workload,
    rep: u32,
    broker_pid: Option<u32>,
) -> anyhow::Result<RunResult> {
    let nonce = rand::thread_rng().next_u32();
    let topics: Vec<String> =
        (0..w.topics).map(|t| format!("bench-{}-{rep}-{t}-{nonce:08x}", w.name)).collect();
    let run = Arc::new(Run {
        w: w.clone(),
        bootstrap: bootstrap.to_owned(),
        topics,
        clock: Clock::new(),
        next_stream: AtomicU32::new(0),
        failed: Arc::default(),
        admin,
        breakdown,
    });
    create_topics(&run).await?;
    let mut result = RunResult { repetition: rep, ..RunResult::default() };
    let sampler = Sampler::start(broker_pid);
    let mut target = (w.producer_rate > 0.0).then_some(w.producer_rate);
    if let Some(f) = w.producer_rate_fraction_of_max {
        let probe =
            produce_phase(&run, Schedule::ClosedLoop, w.max_rate_probe_s, 0, u64::MAX, "probe").await?;
        let max = probe.acked as f64 / w.max_rate_probe_s as f64;
        eprintln!("shardlog-bench: probed max {max:.0} msgs/s; running open loop at {:.0}", max * f);
        result.probed_max_msgs_per_s = Some(max);
        target = Some((max * f).max(1.0));
    }
    result.mode = if target.is_some() { "open-loop" } else { "closed-loop" }.into();
    result.target_rate_msgs_per_s = target;
    let window = if w.backlog_bytes() > 0 {
        backlog(&run, &mut result).await?
    } else {
        measured(&run, target, &mut result).await?
    };
    let samples = sampler.stop().await;
    let rel = |v: &[(Instant, ProcSample)]| -> Vec<ProcSample> {
        v.iter().map(|(at, s)| ProcSample { t_s: signed_secs(*at, window.0), ..*s }).collect()
    };
    let (broker_all, harness_all) = (rel(&samples.broker), rel(&samples.harness));
    let span = window.1.saturating_duration_since(window.0).as_secs_f64();
    // CPU over the window: from the last sample at or before its start to the first at or after its end.
    let in_window = |s: &[ProcSample]| {
        let first = s.iter().rposition(|x| x.t_s <= 0.0).unwrap_or(0);
        let last = s.iter().position(|x| x.t_s >= span).unwrap_or(s.len().saturating_sub(1));
        s.get(first..=last).map(<[ProcSample]>::to_vec).unwrap_or_default()
    };
    result.broker = env::summarize(&in_window(&broker_all));
    result.broker.rss_bytes_max = broker_all.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    result.load_generator = env::summarize(&in_window(&harness_all));
    // The same window for the whole machine.
    let (from, to) = window;
    let first = samples.machine.iter().rev().find(|(at, _)| *at <= from).or(samples.machine.first());
    let last = samples.machine.iter().find(|(at, _)| *at >= to).or(samples.machine.last());
    result.machine = first.zip(last).and_then(|((_, a), (_, b))| env::summarize_machine(*a, *b));
    result.broker_samples = broker_all;
    let gb = (result.publish.bytes + result.consume.bytes) as f64 / 1e9;
    result.broker_cpu_s_per_gb = (broker_pid.is_some() && gb > 0.0).then(|| result.broker.cpu_s / gb);
    delete_topics(&run).await;
    Ok(result)
}

fn client_config(run: &Run, id: &str) -> ClientConfig {
    ClientConfig { client_id: format!("shardlog-bench-{id}"), ..ClientConfig::new(run.bootstrap.clone()) }
}

/// Creating thousands of partitions may take the broker a while.
const ADMIN_TIMEOUT_MS: u64 = 600_000;

async fn create_topics(run: &Run) -> anyhow::Result<()> {
    let cfg = ClientConfig { request_timeout_ms: ADMIN_TIMEOUT_MS, ..client_config(run, "admin") };
    let admin = Admin::connect(cfg).await.context("connect admin")?;
    let t0 = Instant::now();
    let configs = run.w.topic_configs();
    for t in &run.topics {
        admin
            .create_topic(t, run.w.partitions_per_topic, &configs)
            .await
            .with_context(|| format!("create topic {t}"))?;
    }
    if t0.elapsed() > Duration::from_secs(5) {
        eprintln!("shardlog-bench: creating the topics took {:.1} s", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

async fn delete_topics(run: &Run) {
    let cfg = ClientConfig { request_timeout_ms: ADMIN_TIMEOUT_MS, ..client_config(run, "admin") };
    let Ok(admin) = Admin::connect(cfg).await else { return };
    for t in &run.topics {
        if let Err(e) = admin.delete_topic(t).await {
            eprintln!("shardlog-bench: delete topic {t}: {e:#}");
        }
    }
}

/// Everything producers of one phase return.
struct PhaseResult {
    acked: u64,
    errors: u64,
    publish: LatencyHist,
    steps: Option<ClientSteps>,
    counters: Arc<Counters>,
}

/// Runs every producer of the workload for `secs` (or `msgs_max` each).
async fn produce_phase(
    run: &Arc<Run>,
    schedule: Schedule,
    secs: u64,
    warmup_s: u64,
    msgs_max: u64,
    label: &str,
) -> anyhow::Result<PhaseResult> {
    let start = Instant::now();
    let counters = Arc::new(Counters::new(start));
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::start(label, secs + warmup_s, counters.clone());
    let producers = spawn_producers(run, schedule, start, secs, warmup_s, msgs_max, &counters, &stop).await?;
    let r = join_producers(producers, counters).await;
    progress.finish();
    r
}

#[allow(clippy::too_many_arguments, reason = "one call site; the phase's settings")]
async fn spawn_producers(
    run: &Arc<Run>,
    schedule: Schedule,
    start: Instant,
    secs: u64,
    warmup_s: u64,
    msgs_max: u64,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<sched::LoopResult>>>> {
    let w = &run.w;
    let total = (w.topics * w.producers_per_topic) as usize;
    let mut handles = Vec::with_capacity(total);
    for (ti, topic) in run.topics.iter().enumerate() {
        for pi in 0..w.producers_per_topic {
            let index = ti * w.producers_per_topic as usize + pi as usize;
            let sender = ClientSender::new(run, topic, index).await?;
            let schedule = match schedule {
                Schedule::OpenLoop { start, rate_per_s } => {
                    Schedule::OpenLoop { start, rate_per_s: rate_per_s / total as f64 }
                }
                Schedule::ClosedLoop => Schedule::ClosedLoop,
            };
            let cfg = LoopConfig {
                schedule,
                measure_from: start + Duration::from_secs(warmup_s),
                stop_at: start + Duration::from_secs(warmup_s + secs),
                msgs_max,
                outstanding_max: w.producer.outstanding_max,
                steps: run.breakdown || matches!(schedule, Schedule::OpenLoop { .. }),
            };
            handles.push(tokio::spawn(sched::run_producer(
                sender,
                cfg,
                run.clock,
                counters.clone(),
                stop.clone(),
            )));
        }
    }
    Ok(handles)
}

async fn join_producers(
    handles: Vec<tokio::task::JoinHandle<anyhow::Result<sched::LoopResult>>>,
    counters: Arc<Counters>,
) -> anyhow::Result<PhaseResult> {
    let mut r = PhaseResult { acked: 0, errors: 0, publish: LatencyHist::new(), steps: None, counters };
    for h in handles {
        let l = h.await.context("producer task")??;
        assert_eq!(l.sent, l.acked + l.errors, "every sent message is acked or failed");
        r.acked += l.acked;
        r.errors += l.errors;
        r.publish.merge(&l.publish);
        if let Some(s) = &l.steps {
            r.steps.get_or_insert_with(ClientSteps::default).merge(s);
        }
    }
    Ok(r)
}

/// A measured window: its start and end.
type Window = (Instant, Instant);

fn signed_secs(at: Instant, origin: Instant) -> f64 {
    match at.checked_duration_since(origin) {
        Some(d) => d.as_secs_f64(),
        None => -(origin - at).as_secs_f64(),
    }
}

/// The measured run: consumers at the log end, producers for warm-up +
/// duration, consumers catch up, series and throughput over the window.
async fn measured(run: &Arc<Run>, target: Option<f64>, result: &mut RunResult) -> anyhow::Result<Window> {
    let w = &run.w;
    let stop = Arc::new(AtomicBool::new(false));
    // Consumers are assigned (at the log end) before the clock starts.
    let consumers = unbounded(make_consumers(run, SeekTo::Latest).await?);
    let start = Instant::now() + Duration::from_millis(50);
    let counters = Arc::new(Counters::new(start));
    let measure_from_ns = run.clock.ns(start + Duration::from_secs(w.warmup_s));
    // Assigned at the (empty) log end before any producer of this phase exists: from the start.
    let check = (SeqScope::of(w), true);
    let consumer_tasks = spawn_consumers(consumers, &counters, &stop, measure_from_ns, true, check);
    let schedule = match target {
        Some(rate_per_s) => Schedule::OpenLoop { start, rate_per_s },
        None => Schedule::ClosedLoop,
    };
    let progress = Progress::start("run", w.warmup_s + w.duration_s, counters.clone());
    tokio::time::sleep_until(start.into()).await;
    // The broker's side of the breakdown: its stage histograms when the
    // measured window opens, and again once the consumers are done.
    let from = start + Duration::from_secs(w.warmup_s);
    let scrape_admin = run.admin.clone().filter(|_| run.breakdown || target.is_some());
    let first_scrape = scrape_admin.clone().map(|admin| {
        tokio::spawn(async move {
            tokio::time::sleep_until(from.into()).await;
            tokio::task::spawn_blocking(move || breakdown::scrape(&admin)).await
        })
    });
    let producers =
        spawn_producers(run, schedule, start, w.duration_s, w.warmup_s, u64::MAX, &counters, &stop).await?;
    let phase = join_producers(producers, counters.clone()).await?;
    // Grace: until every subscription received what was acked.
    let expected = phase.acked * u64::from(w.subscriptions_per_topic);
    let deadline = Instant::now() + GRACE_MAX;
    while Counters::total(&counters.recv_msgs) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (e2e, order) = join_consumers(consumer_tasks, &failed_sends(run)).await?;
    progress.finish();
    if let (Some(first), Some(admin)) = (first_scrape, scrape_admin) {
        let last = tokio::task::spawn_blocking(move || breakdown::scrape(&admin)).await?;
        match (first.await??, last) {
            (Ok(before), Ok(after)) => {
                let (broker, writes) = breakdown::between(&before, &after);
                let client = phase.steps.as_ref().map(breakdown::client_rows).unwrap_or_default();
                result.breakdown = Some(Breakdown { client, broker, writes: Some(writes), fio: None });
            }
            (Err(e), _) | (_, Err(e)) => eprintln!("shardlog-bench: no latency breakdown: {e:#}"),
        }
    }
    result.order = Some(order);
    fill(result, w, &counters, w.warmup_s, w.duration_s);
    result.publish_latency = phase.publish.summary();
    result.e2e_latency = e2e.summary();
    result.send_errors = phase.errors;
    Ok((from, from + Duration::from_secs(w.duration_s)))
}

/// Backlog workloads: write `consumer_backlog_size_gb` with no consumer,
/// then drain it from the earliest offset.
async fn backlog(run: &Arc<Run>, result: &mut RunResult) -> anyhow::Result<Window> {
    let w = &run.w;
    let producers = u64::from(w.topics * w.producers_per_topic);
    let per_producer = w.backlog_bytes() / w.message_size as u64 / producers;
    // Generous bound: even 20 MB/s finishes.
    let secs_max = (w.backlog_bytes() / 20_000_000).max(60);
    let t = Instant::now();
    let write = produce_phase(run, Schedule::ClosedLoop, secs_max, 0, per_producer, "backlog write").await?;
    let write_s = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        write.acked == per_producer * producers,
        "backlog: {} of {} acked",
        write.acked,
        per_producer * producers
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (consumers, expected) = match w.consumer_start {
        ConsumerStart::Earliest => (
            unbounded(make_consumers(run, SeekTo::Earliest).await?),
            write.acked * u64::from(w.subscriptions_per_topic),
        ),
        // The slices cover the backlog once.
        ConsumerStart::Spread => {
            (spread(run, make_consumers(run, SeekTo::Latest).await?).await?, write.acked)
        }
    };
    let start = Instant::now();
    let counters = Arc::new(Counters::new(start));
    let progress = Progress::start("drain", secs_max, counters.clone());
    // Spread consumers start in the middle of each log.
    let check = (SeqScope::of(w), w.consumer_start == ConsumerStart::Earliest);
    let tasks = spawn_consumers(consumers, &counters, &stop, u64::MAX, false, check);
    let deadline = start + Duration::from_secs(secs_max);
    while Counters::total(&counters.recv_msgs) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain_s = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (_, order) = join_consumers(tasks, &failed_sends(run)).await?;
    progress.finish();
    result.order = Some(order);
    let received = Counters::total(&counters.recv_msgs);
    anyhow::ensure!(received >= expected, "drain: received {received} of {expected} within {secs_max} s");
    let msg = w.message_size as u64;
    let b = BacklogResult {
        write: Throughput::new(write.acked, write.acked * msg, write_s),
        drain: Throughput::new(received, Counters::total(&counters.recv_bytes), drain_s),
    };
    result.backlog = Some(b);
    result.publish = b.write;
    result.consume = b.drain;
    result.publish_latency = write.publish.summary();
    result.send_errors = write.errors;
    result.series = Series {
        warmup_s: 0,
        sent_msgs: Counters::snapshot(&write.counters.sent_msgs, write_s.ceil() as usize),
        sent_bytes: Counters::snapshot(&write.counters.sent_bytes, write_s.ceil() as usize),
        acked_msgs: Counters::snapshot(&write.counters.acked_msgs, write_s.ceil() as usize),
        recv_msgs: Counters::snapshot(&counters.recv_msgs, drain_s.ceil() as usize),
        recv_bytes: Counters::snapshot(&counters.recv_bytes, drain_s.ceil() as usize),
    };
    Ok((t, Instant::now()))
}

/// Throughput over the measured window and the whole series.
fn fill(result: &mut RunResult, w: &Workload, c: &Counters, warmup_s: u64, duration_s: u64) {
    let secs = (warmup_s + duration_s) as usize + (GRACE_MAX.as_secs() as usize);
    let window = |v: &[u64]| v[warmup_s as usize..(warmup_s + duration_s) as usize].iter().sum::<u64>();
    let series = Series {
        warmup_s,
        sent_msgs: Counters::snapshot(&c.sent_msgs, secs),
        sent_bytes: Counters::snapshot(&c.sent_bytes, secs),
        acked_msgs: Counters::snapshot(&c.acked_msgs, secs),
        recv_msgs: Counters::snapshot(&c.recv_msgs, secs),
        recv_bytes: Counters::snapshot(&c.recv_bytes, secs),
    };
    let acked = window(&series.acked_msgs);
    result.publish = Throughput::new(acked, acked * w.message_size as u64, duration_s as f64);
    result.consume =
        Throughput::new(window(&series.recv_msgs), window(&series.recv_bytes), duration_s as f64);
    // Trim the trailing empty seconds of the grace period.
    let mut series = series;
    let last = [&series.sent_msgs, &series.recv_msgs]
        .iter()
        .filter_map(|v| v.iter().rposition(|x| *x > 0))
        .max()
        .map_or(0, |i| i + 1)
        .max((warmup_s + duration_s) as usize);
    for v in [
        &mut series.sent_msgs,
        &mut series.sent_bytes,
        &mut series.acked_msgs,
        &mut series.recv_msgs,
        &mut series.recv_bytes,
    ] {
        v.truncate(last);
    }
    result.series = series;
}

/// The producer side of the client, as the timing core sees it.
struct ClientSender {
    producer: Producer,
    topic: Arc<str>,
    partitions: u32,
    template: Bytes,
    chunk: BytesMut,
    keys: KeyDistribution,
    key_pool: Vec<Bytes>,
    rng: StdRng,
    /// First partition of this producer for `PartitionRoundRobin`.
    offset: u32,
    seq: Sequencer,
    failed: Arc<Mutex<Vec<FailedSend>>>,
    /// Wall-clock milliseconds at `mono_ns()` 0: a record's create time is
    /// its intended send instant, read once by the timing core, so the
    /// client does not read the clock again for it.
    wall_ms_at_mono_zero: i64,
}

impl ClientSender {
    async fn new(run: &Run, topic: &str, index: usize) -> anyhow::Result<ClientSender> {
        let w = &run.w;
        let cfg = ProducerConfig {
            client: client_config(run, &format!("producer-{index}")),
            acks: match w.acks {
                0 => Acks::None,
                -1 => Acks::All,
                _ => Acks::Leader,
            },
            linger_ms: w.producer.linger_ms,
            batch_bytes: w.producer.batch_bytes,
            buffer_bytes_max: w.producer.buffer_bytes_max,
            max_in_flight: w.producer.max_in_flight,
            ..ProducerConfig::default()
        };
        let producer = Producer::new(cfg).await.context("create producer")?;
        let template = payload_template(w, index)?;
        let key_pool = (0..w.key_count).map(|k| Bytes::from(format!("key-{k}"))).collect();
        let stream = run.next_stream.fetch_add(1, Ordering::Relaxed);
        anyhow::ensure!(
            stream < order::STREAMS_MAX,
            "more than {} producers in one repetition",
            order::STREAMS_MAX
        );
        Ok(ClientSender {
            producer,
            topic: Arc::from(topic),
            partitions: w.partitions_per_topic,
            template,
            chunk: BytesMut::new(),
            keys: w.key_distribution,
            key_pool,
            rng: StdRng::seed_from_u64(index as u64),
            offset: (index as u32).wrapping_mul(7919),
            seq: Sequencer::new(stream as u16, SeqScope::of(w), w.partitions_per_topic),
            failed: run.failed.clone(),
            wall_ms_at_mono_zero: wall_ms_at_mono_zero(),
        })
    }

    /// The payload: the template with the send timestamp in its first 8
    /// bytes and the order word in the next 8 (`crate::order`).
    fn payload(&mut self, intended_ns: u64, seq: u64) -> Bytes {
        let n = self.template.len();
        if self.chunk.capacity() < n {
            self.chunk = BytesMut::with_capacity(PAYLOAD_CHUNK_BYTES.max(n));
        }
        self.chunk.extend_from_slice(&intended_ns.to_le_bytes());
        self.chunk.extend_from_slice(&order::encode(self.seq.stream(), seq));
        self.chunk.extend_from_slice(&self.template[order::ORDER_PAYLOAD_BYTES_MIN..]);
        self.chunk.split_to(n).freeze()
    }
}

/// Wall-clock milliseconds minus `mono_ns()` in milliseconds, now.
fn wall_ms_at_mono_zero() -> i64 {
    let wall =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    wall as i64 - (sched::mono_ns() / 1_000_000) as i64
}

/// A record's delivery and the id the order check knows it by.
struct ClientAck {
    delivery: DeliveryFuture,
    id: FailedSend,
}

impl Future for ClientAck {
    type Output = Result<Acked, (FailedSend, ClientError)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let id = self.id;
        Pin::new(&mut self.delivery).poll(cx).map(|r| {
            r.map(|md| Acked { at: md.acknowledged_at, steps: Some((md.sealed_at, md.requested_at)) })
                .map_err(|e| (id, e))
        })
    }
}

impl Sender for ClientSender {
    type Ack = ClientAck;
    type Failure = (FailedSend, ClientError);

    fn failed(&mut self, (id, e): (FailedSend, ClientError)) -> anyhow::Error {
        self.failed.lock().expect("failed-send list lock").push(id);
        anyhow::Error::new(e).context("delivery")
    }

    fn send(
        &mut self,
        seq: u64,
        intended_ns: u64,
    ) -> impl Future<Output = anyhow::Result<(ClientAck, u64)>> + Send {
        let (key, partition) = match self.keys {
            KeyDistribution::None => (None, None),
            KeyDistribution::Random => {
                (Some(self.key_pool[self.rng.gen_range(0..self.key_pool.len())].clone()), None)
            }
            KeyDistribution::RoundRobin => {
                (Some(self.key_pool[(seq % self.key_pool.len() as u64) as usize].clone()), None)
            }
            KeyDistribution::PartitionRoundRobin => {
                (None, Some(((seq + u64::from(self.offset)) % u64::from(self.partitions)) as u32))
            }
        };
        // The partition the client will choose, where the harness can know it.
        let known = partition
            .or_else(|| key.as_ref().map(|k| DefaultPartitioner::for_key(k, self.partitions)))
            .or((self.partitions == 1).then_some(0));
        let record_seq = self.seq.next(known);
        let value = self.payload(intended_ns, record_seq);
        let bytes = value.len() as u64;
        let id = (self.seq.stream(), known.unwrap_or(u32::MAX), record_seq);
        let record = ProducerRecord {
            topic: self.topic.clone(),
            partition,
            key,
            value,
            headers: Vec::new(),
            timestamp_ms: Some(self.wall_ms_at_mono_zero + (intended_ns / 1_000_000) as i64),
        };
        let producer = &self.producer;
        async move {
            let delivery = producer.send(record).await.context("send")?;
            Ok((ClientAck { delivery, id }, bytes))
        }
    }
}

/// `message_size` bytes: from `payload_file` (cut or repeated) or random.
fn payload_template(w: &Workload, index: usize) -> anyhow::Result<Bytes> {
    let mut v = match &w.payload_file {
        Some(p) => {
            let path = resolve(p);
            let data = std::fs::read(&path).with_context(|| format!("payload file {}", path.display()))?;
            anyhow::ensure!(!data.is_empty(), "payload file {} is empty", path.display());
            data.iter().copied().cycle().take(w.message_size).collect::<Vec<u8>>()
        }
        None => {
            let mut v = vec![0u8; w.message_size];
            StdRng::seed_from_u64(0x5eed ^ index as u64).fill_bytes(&mut v);
            v
        }
    };
    v.truncate(w.message_size);
    Ok(Bytes::from(v))
}

fn resolve(p: &str) -> PathBuf {
    let path = PathBuf::from(p);
    if path.is_absolute() || path.exists() {
        path
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads").join(path)
    }
}

/// The workload's consumer tuning, named `name`.
fn consumer_config(run: &Run, name: &str) -> ConsumerConfig {
    let c = &run.w.consumer;
    ConsumerConfig {
        client: client_config(run, name),
        fetch_max_wait_ms: c.fetch_max_wait_ms as u32,
        fetch_min_bytes: c.fetch_min_bytes as u32,
        fetch_max_bytes: c.fetch_max_bytes as u32,
        partition_max_bytes: c.partition_max_bytes as u32,
        ..ConsumerConfig::default()
    }
}

/// One consumer per (topic, subscription, member), each with its share of
/// the partitions; returned with its subscription index.
async fn make_consumers(run: &Run, seek: SeekTo) -> anyhow::Result<Vec<(Consumer, u32)>> {
    let w = &run.w;
    if let Some(group) = &w.group {
        return make_group_consumers(run, group).await;
    }
    let mut out = Vec::new();
    for topic in &run.topics {
        for s in 0..w.subscriptions_per_topic {
            for m in 0..w.consumer_per_subscription {
                let parts: Vec<(String, u32)> = (0..w.partitions_per_topic)
                    .filter(|p| p % w.consumer_per_subscription == m)
                    .map(|p| (topic.clone(), p))
                    .collect();
                if parts.is_empty() {
                    continue;
                }
                let cfg = consumer_config(run, &format!("consumer-{s}-{m}"));
                let mut c = Consumer::new(cfg).await.context("create consumer")?;
                c.assign(&parts, seek).await.context("assign partitions")?;
                out.push((c, s));
            }
        }
    }
    Ok(out)
}

/// `Workload::group`: every consumer subscribes; returns once each group
/// is stable (one generation, every partition assigned), so the clock
/// starts with the partitions split. Records produced before the start
/// would be missed, and there are none: this runs before the producers.
async fn make_group_consumers(run: &Run, group: &str) -> anyhow::Result<Vec<(Consumer, u32)>> {
    let w = &run.w;
    let mut joining = Vec::new();
    for topic in &run.topics {
        for s in 0..w.subscriptions_per_topic {
            let group_id = format!("{group}-{topic}-{s}");
            let state = Arc::new(Mutex::new(vec![None; w.consumer_per_subscription as usize]));
            for m in 0..w.consumer_per_subscription {
                let cfg = ConsumerConfig {
                    offset_reset: shardlog_client::OffsetReset::Latest,
                    group: Some(shardlog_client::GroupSettings::new(group_id.clone())),
                    ..consumer_config(run, &format!("consumer-{s}-{m}"))
                };
                let mut c = Consumer::new(cfg).await.context("create consumer")?;
                c.subscribe(std::slice::from_ref(topic)).await.context("subscribe")?;
                let (state, partitions, group_id) =
                    (state.clone(), w.partitions_per_topic as usize, group_id.clone());
                joining.push(tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    loop {
                        let records =
                            c.poll(Duration::from_millis(20)).await.context("poll while joining")?;
                        if !records.is_empty() {
                            bail!("records arrived before the producers started");
                        }
                        let me = c.group_member().map(|(g, _)| (g, c.assignment().len()));
                        let stable = {
                            let mut st = state.lock().expect("join state");
                            st[m as usize] = me;
                            let gens: Vec<i32> = st.iter().flatten().map(|(g, _)| *g).collect();
                            gens.len() == st.len()
                                && gens.iter().all(|g| *g == gens[0])
                                && st.iter().flatten().map(|(_, n)| n).sum::<usize>() == partitions
                        };
                        if stable {
                            return Ok((c, s));
                        }
                        if Instant::now() > deadline {
                            bail!("group {group_id} did not become stable in 120 s");
                        }
                    }
                }));
            }
        }
    }
    let mut out = Vec::new();
    for j in joining {
        out.push(j.await.context("joining task")??);
    }
    Ok(out)
}

/// Where a consumer stops: (topic, partition, first offset not to read).
/// Empty: it reads until told to stop.
type Bounds = Vec<(String, u32, u64)>;

fn unbounded(consumers: Vec<(Consumer, u32)>) -> Vec<(Consumer, Bounds)> {
    consumers.into_iter().map(|(c, _)| (c, Bounds::new())).collect()
}

/// `ConsumerStart::Spread`: consumers assigned at the log end are moved to
/// their slice of each partition's backlog: subscription `s` of `S` reads
/// `[lo + s * n / S, lo + (s + 1) * n / S)` where `[lo, lo + n)` is the log.
async fn spread(run: &Run, consumers: Vec<(Consumer, u32)>) -> anyhow::Result<Vec<(Consumer, Bounds)>> {
    let slices = u64::from(run.w.subscriptions_per_topic);
    let mut out = Vec::with_capacity(consumers.len());
    for (mut c, s) in consumers {
        let mut bounds = Bounds::new();
        for topic in &run.topics {
            for p in 0..run.w.partitions_per_topic {
                let Some(end) = c.position(topic, p) else { continue };
                c.seek(topic, p, SeekTo::Earliest).await.context("seek to the earliest offset")?;
                let lo = c.position(topic, p).context("assigned partition has a position")?;
                let n = end.saturating_sub(lo);
                let (from, to) = (lo + n * u64::from(s) / slices, lo + n * (u64::from(s) + 1) / slices);
                c.seek(topic, p, SeekTo::Offset(from)).await.context("seek to the slice")?;
                bounds.push((topic.clone(), p, to));
            }
        }
        out.push((c, bounds));
    }
    Ok(out)
}

/// What a consumer task hands back: its latencies and its order check.
type ConsumerTask = tokio::task::JoinHandle<anyhow::Result<(LatencyHist, OrderChecker)>>;

/// `check`: the sequence scope and whether the consumers read from before
/// the first record of every stream (see `OrderChecker::new`).
fn spawn_consumers(
    consumers: Vec<(Consumer, Bounds)>,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
    measure_from_ns: u64,
    e2e: bool,
    check: (SeqScope, bool),
) -> Vec<ConsumerTask> {
    consumers
        .into_iter()
        .map(|(mut c, bounds)| {
            let (counters, stop) = (counters.clone(), stop.clone());
            tokio::spawn(async move {
                let mut hist = LatencyHist::new();
                let mut order = OrderChecker::new(check.0, check.1);
                let past_bound = |r: &shardlog_client::ConsumerRecord| {
                    bounds.iter().any(|(t, p, to)| r.partition == *p && r.offset >= *to && *r.topic == **t)
                };
                while !stop.load(Ordering::Relaxed) {
                    let records = c.poll(Duration::from_millis(100)).await.context("poll")?;
                    let now = sched::mono_ns();
                    let (mut msgs, mut bytes) = (0u64, 0u64);
                    for r in &records {
                        if !bounds.is_empty() && past_bound(r) {
                            continue;
                        }
                        msgs += 1;
                        bytes += r.value.len() as u64;
                        order.check(r.partition, &r.value);
                        if e2e && r.value.len() >= 8 {
                            let sent = u64::from_le_bytes(r.value[..8].try_into().expect("8 bytes"));
                            if sent >= measure_from_ns {
                                hist.record_ns(now.saturating_sub(sent));
                            }
                        }
                    }
                    if msgs > 0 {
                        counters.on_received(msgs, bytes);
                    }
                    let done =
                        |(t, p, to): &(String, u32, u64)| c.position(t, *p).is_some_and(|at| at >= *to);
                    if !bounds.is_empty() && bounds.iter().all(done) {
                        break;
                    }
                }
                Ok((hist, order))
            })
        })
        .collect()
}

async fn join_consumers(
    tasks: Vec<ConsumerTask>,
    failed: &FailedSends,
) -> anyhow::Result<(LatencyHist, OrderSummary)> {
    let mut all = LatencyHist::new();
    let mut order: Option<OrderSummary> = None;
    for t in tasks {
        let (hist, checker) = t.await.context("consumer task")??;
        all.merge(&hist);
        let o = checker.finish(failed);
        order.get_or_insert(OrderSummary { scope: o.scope, ..OrderSummary::default() }).add(&o);
    }
    Ok((all, order.unwrap_or_default()))
}

/// The sends of this repetition that failed so far.
fn failed_sends(run: &Run) -> FailedSends {
    let failed = run.failed.lock().expect("failed-send list lock");
    FailedSends::new(failed.iter().copied(), run.w.acks == 0)
}

/// Live rates on a progress bar (hidden when stderr is not a terminal).
struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    fn start(label: &str, secs: u64, counters: Arc<Counters>) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            ProgressBar::with_draw_target(Some(secs), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos:>4}/{len}s {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_owned());
        let b = bar.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let el = counters.start().elapsed();
                let s = el.as_secs() as usize;
                // Rates of the last complete second.
                let prev = s.saturating_sub(1).min(sched::SERIES_SECONDS_MAX - 1);
                let g = |v: &[std::sync::atomic::AtomicU64]| v[prev].load(Ordering::Relaxed);
                b.set_position(el.as_secs());
                b.set_message(format!(
                    "pub {:>9} msg/s {:>7.1} MB/s | con {:>9} msg/s {:>7.1} MB/s | err {}",
                    g(&counters.acked_msgs),
                    g(&counters.sent_bytes) as f64 / 1e6,
                    g(&counters.recv_msgs),
                    g(&counters.recv_bytes) as f64 / 1e6,
                    counters.errors.load(Ordering::Relaxed)
                ));
            }
        });
        Progress { bar, task }
    }

    fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// Samples the broker's and our own /proc every second.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    out: Arc<Mutex<Samples>>,
}

#[derive(Default, Clone)]
struct Samples {
    broker: Vec<(Instant, ProcSample)>,
    harness: Vec<(Instant, ProcSample)>,
    machine: Vec<(Instant, env::MachineSample)>,
}

impl Sampler {
    fn start(broker_pid: Option<u32>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let out = Arc::new(Mutex::new(Samples::default()));
        let (s, o) = (stop.clone(), out.clone());
        let me = std::process::id();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                let now = Instant::now();
                let broker = broker_pid.and_then(|p| env::sample_proc(p, 0.0));
                let harness = env::sample_proc(me, 0.0);
                let machine = env::sample_machine();
                let mut g = o.lock().expect("sampler lock");
                g.broker.extend(broker.map(|x| (now, x)));
                g.harness.extend(harness.map(|x| (now, x)));
                g.machine.extend(machine.map(|x| (now, x)));
            }
        });
        Sampler { stop, task, out }
    }

    async fn stop(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        // Take one last sample so that the window's end is covered.
        tokio::time::sleep(Duration::from_millis(SAMPLE_INTERVAL_MS + 50)).await;
        self.task.abort();
        if let Err(e) = self.task.await {
            assert!(e.is_cancelled(), "sampler task failed: {e}");
        }
        let g = self.out.lock().expect("sampler lock");
        g.clone()
    }
}
