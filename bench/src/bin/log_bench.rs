//! Storage-engine benchmarks for `shardlog_broker::log`, each figure next to
//! the machine limit measured in the same run with fio.
//!
//! ```text
//! cargo run --release -p shardlog-bench --bin log_bench -- --dir /var/tmp/sl-bench
//! ```
//!
//! Sections (each bounded to seconds; files are removed afterwards):
//! 1. append throughput, flush=interval, vs fio O_DIRECT sequential write at
//!    queue depth 1 and 8 (the appender keeps up to 2 writes in flight), per GiB of a multi-GiB
//!    log (first vs last GiB: the O(1) check, scaled down from 20 GiB);
//! 2. flush=always with 64 concurrent appenders: fdatasyncs per append and
//!    p99 append latency vs fio's fdatasync p99;
//! 3. read (index lookup) latency with 1 .. 10,000 segments;
//! 4. heap cost of 100 closed segments.

use anyhow::{bail, Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;
use shardlog_broker::config::{FlushPolicy, TopicConfig};
use shardlog_broker::log::{Log, LogOptions};
use shardlog_schema::batch::BatchBuilder;
use shardlog_schema::Offset;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes, for the memory section.
struct Counting;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(Parser, Debug)]
struct Args {
    /// Scratch directory on the disk under test.
    #[arg(long, default_value = "/var/tmp/shardlog-log-bench")]
    dir: PathBuf,
    /// GiB appended in the throughput section.
    #[arg(long, default_value_t = 4)]
    append_gib: u64,
    /// Batch size of the throughput section.
    #[arg(long, default_value_t = 256 << 10)]
    batch_bytes: usize,
    /// Concurrent appenders in the throughput section.
    #[arg(long, default_value_t = 16)]
    appenders: usize,
    /// Throughput section with flush=never instead of interval (diagnostics).
    #[arg(long)]
    flush_never: bool,
    /// Seconds of the flush=always section.
    #[arg(long, default_value_t = 8)]
    always_secs: u64,
    /// Open read-handle bound per log in the lookup section
    /// (`LogOptions::open_readers_max`).
    #[arg(long, default_value_t = shardlog_broker::log::OPEN_READERS_DEFAULT)]
    open_readers_max: usize,
    /// Largest segment count of the lookup section.
    #[arg(long, default_value_t = 10_000)]
    segments_max: usize,
    /// Where the Markdown and JSON reports go (`storage-<date>.{md,json}`).
    #[arg(long, default_value = "perf-reports")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir)?;
    let mut report = serde_json::json!({
        "kind": "storage",
        "date": today(),
        "git": cmd_out("git", &["rev-parse", "--short", "HEAD"]),
        "kernel": cmd_out("uname", &["-r"]),
        "cpu": cpu_model(),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "dir": args.dir.display().to_string(),
        "filesystem": cmd_out("stat", &["-f", "-c", "%T", &args.dir.display().to_string()]),
    });
    let fio_path = args.dir.join("fio.dat");
    eprintln!("[1/6] fio O_DIRECT sequential write, iodepth 1 and 8");
    let fio_w1 = fio_write(&fio_path, 1)?;
    let fio_w8 = fio_write(&fio_path, 8)?;
    report["fio_write_iodepth1_mb_s"] = fio_w1.into();
    report["fio_write_iodepth8_mb_s"] = fio_w8.into();
    eprintln!("      fio: {fio_w1:.0} MB/s (qd1), {fio_w8:.0} MB/s (qd8)");

    eprintln!("[2/6] append throughput, flush=interval, {} GiB", args.append_gib);
    let t = append_throughput(&args)?;
    eprintln!("      {:.0} MB/s overall, per GiB {:?}", t.overall_mb_s, t.per_gib_mb_s);
    report["append_interval"] = serde_json::to_value(&t)?;
    report["append_interval"]["ratio_to_fio_qd1"] = (t.overall_mb_s / fio_w1).into();

    eprintln!("[3/6] fio 4 KiB write + fdatasync");
    let fio_sync = fio_fdatasync(&fio_path)?;
    eprintln!("      fio fdatasync p50 {} us p99 {} us", fio_sync.0, fio_sync.1);
    report["fio_fdatasync_p50_us"] = fio_sync.0.into();
    report["fio_fdatasync_p99_us"] = fio_sync.1.into();
    report["fio_write_plus_fdatasync_p99_us"] = fio_sync.2.into();

    eprintln!("[4/6] flush=always, 64 appenders, {} s", args.always_secs);
    let a = always_64(&args)?;
    eprintln!(
        "      {} appends, {} fdatasyncs ({:.3}/append), p50 {} us p99 {} us",
        a.appends, a.fdatasyncs, a.fdatasyncs_per_append, a.p50_us, a.p99_us
    );
    report["always_64"] = serde_json::to_value(&a)?;
    report["always_64"]["p99_ratio_to_fio_write_plus_fdatasync_p99"] =
        (a.p99_us as f64 / fio_sync.2 as f64).into();

    eprintln!("[5/6] read/index lookup latency vs segment count");
    let l = lookup_flatness(&args)?;
    report["lookup"] = serde_json::to_value(&l)?;

    eprintln!("[6/6] heap cost of closed segments");
    let m = memory(&args)?;
    eprintln!("      {m:?}");
    report["memory"] = serde_json::to_value(&m)?;

    let _ignored = std::fs::remove_file(&fio_path);
    std::fs::create_dir_all(&args.out)?;
    let base = args.out.join(format!("storage-{}", today()));
    std::fs::write(base.with_extension("json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(base.with_extension("md"), markdown(&report))?;
    eprintln!("wrote {}.{{json,md}}", base.display());
    Ok(())
}

/// Runs a future built by `f` on a fresh glommio executor thread.
fn run_glommio<T, Fut>(f: impl FnOnce() -> Fut + Send + 'static) -> T
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(f)
        .expect("executor")
        .join()
        .expect("join")
}

/// A pool of distinct, valid batches of about `bytes` each.
fn batch_pool(bytes: usize, count: usize, ts: i64) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let records = (bytes / 1024).max(1);
            let mut b = BatchBuilder::with_capacity(bytes + 4096);
            let value: Vec<u8> = (0..1000).map(|j| (i * 31 + j) as u8).collect();
            for _ in 0..records {
                b.push(None, &value, &[], ts);
            }
            b.finish()
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[derive(serde::Serialize, Debug)]
struct Throughput {
    batch_bytes: usize,
    appenders: usize,
    bytes: u64,
    secs: f64,
    overall_mb_s: f64,
    per_gib_mb_s: Vec<f64>,
    last_vs_first_gib: f64,
    writes: u64,
    avg_write_kib: f64,
    fdatasyncs: u64,
}

fn append_throughput(args: &Args) -> Result<Throughput> {
    let dir = args.dir.join("append");
    let _ignored = std::fs::remove_dir_all(&dir);
    let (total_gib, batch_bytes, appenders) = (args.append_gib, args.batch_bytes, args.appenders);
    let flush_never = args.flush_never;
    let t = run_glommio(move || async move {
        let mut config = TopicConfig { retention_ms: None, ..TopicConfig::default() };
        if flush_never {
            config.flush = FlushPolicy::Never;
        }
        let log = Rc::new(Log::open(dir.clone(), config).await.expect("open"));
        assert!(log.direct_io(), "the throughput section needs O_DIRECT");
        let pool = Rc::new(batch_pool(batch_bytes, 16, now_ms()));
        let gib = 1u64 << 30;
        let total = total_gib * gib;
        let written = Rc::new(Cell::new(0u64));
        let marks = Rc::new(std::cell::RefCell::new(Vec::new()));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for a in 0..appenders {
            let (log, pool, written, marks) = (log.clone(), pool.clone(), written.clone(), marks.clone());
            tasks.push(glommio::spawn_local(async move {
                let mut i = a;
                while written.get() < total {
                    let b = &pool[i % pool.len()];
                    i += 1;
                    let before = written.get();
                    written.set(before + b.len() as u64);
                    log.append(b, 0).await.expect("append");
                    if (before + b.len() as u64) / gib > before / gib {
                        marks.borrow_mut().push(start.elapsed());
                    }
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        let secs = start.elapsed().as_secs_f64();
        let stats = log.stats();
        let mut per = Vec::new();
        let mut prev = Duration::ZERO;
        for m in marks.borrow().iter() {
            per.push(gib as f64 / 1e6 / (*m - prev).as_secs_f64());
            prev = *m;
        }
        log.delete().await.expect("delete");
        let bytes = written.get();
        Throughput {
            batch_bytes,
            appenders,
            bytes,
            secs,
            overall_mb_s: bytes as f64 / 1e6 / secs,
            last_vs_first_gib: per.last().copied().unwrap_or(0.0) / per.first().copied().unwrap_or(1.0),
            per_gib_mb_s: per,
            writes: stats.writes,
            avg_write_kib: stats.bytes_written as f64 / stats.writes.max(1) as f64 / 1024.0,
            fdatasyncs: stats.fdatasyncs,
        }
    });
    Ok(t)
}

#[derive(serde::Serialize, Debug)]
struct Always {
    appenders: usize,
    batch_bytes: usize,
    appends: u64,
    fdatasyncs: u64,
    fdatasyncs_per_append: f64,
    appends_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

fn always_64(args: &Args) -> Result<Always> {
    let dir = args.dir.join("always");
    let _ignored = std::fs::remove_dir_all(&dir);
    let secs = args.always_secs;
    let r = run_glommio(move || async move {
        let config = TopicConfig { flush: FlushPolicy::Always, retention_ms: None, ..TopicConfig::default() };
        let log = Rc::new(Log::open(dir, config).await.expect("open"));
        let pool = Rc::new(batch_pool(1024, 64, now_ms()));
        let hist = Rc::new(std::cell::RefCell::new(Histogram::<u64>::new(3).expect("hist")));
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for a in 0..64 {
            let (log, pool, hist) = (log.clone(), pool.clone(), hist.clone());
            tasks.push(glommio::spawn_local(async move {
                while Instant::now() < deadline {
                    let t = Instant::now();
                    log.append(&pool[a], 0).await.expect("append");
                    hist.borrow_mut().record(t.elapsed().as_micros() as u64).expect("record");
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        let s = log.stats();
        log.delete().await.expect("delete");
        let h = hist.borrow();
        Always {
            appenders: 64,
            batch_bytes: pool[0].len(),
            appends: s.appends,
            fdatasyncs: s.fdatasyncs,
            fdatasyncs_per_append: s.fdatasyncs as f64 / s.appends.max(1) as f64,
            appends_per_sec: s.appends as f64 / secs as f64,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    });
    Ok(r)
}

#[derive(serde::Serialize, Debug)]
struct Lookup {
    filesystem: String,
    segment_bytes: u64,
    open_readers_max: usize,
    points: Vec<LookupPoint>,
    p50_ratio_last_to_first: f64,
}

#[derive(serde::Serialize, Debug)]
struct LookupPoint {
    segments: usize,
    reads: usize,
    p50_us: f64,
    p99_us: f64,
}

/// Builds one log up to `segments_max` segments and, at each power of ten,
/// times random single-batch reads spread over all retained data.
fn lookup_flatness(args: &Args) -> Result<Lookup> {
    // Building 10,000 segments on disk costs ~5 fsyncs per roll; on tmpfs the
    // build takes seconds. The lookup path (segment binary search, index page
    // reads, header scan) is the same code either way; data is in page cache.
    let shm = Path::new("/dev/shm");
    let on_shm = cmd_out("stat", &["-f", "-c", "%T", "/dev/shm"]) == "tmpfs";
    let root = if on_shm { shm.join("shardlog-lookup-bench") } else { args.dir.join("lookup") };
    let _ignored = std::fs::remove_dir_all(&root);
    let fs = if on_shm { "tmpfs (/dev/shm)".to_string() } else { "disk".to_string() };
    let segments_max = args.segments_max;
    let open_readers_max = args.open_readers_max;
    let segment_bytes: u64 = 64 << 10;
    let points = run_glommio(move || async move {
        let config = TopicConfig {
            flush: FlushPolicy::Never,
            segment_bytes,
            retention_ms: None,
            index_interval_bytes: 4096,
            ..TopicConfig::default()
        };
        // The file path is measured: no hot tail (it would serve the
        // 1-segment point from memory and hide the lookup cost).
        let options = LogOptions { hot_tail_log_bytes_max: 0, open_readers_max, ..LogOptions::default() };
        let log = Log::open_with(root.clone(), config, options).await.expect("open");
        let pool = batch_pool(1024, 32, now_ms());
        let mut points = Vec::new();
        let mut target = 1;
        let mut i = 0usize;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        while target <= segments_max {
            while log.segment_count() < target {
                log.append(&pool[i % pool.len()], 0).await.expect("append");
                i += 1;
            }
            // Fill the target segment a bit so the active one is not empty.
            for _ in 0..8 {
                log.append(&pool[i % pool.len()], 0).await.expect("append");
                i += 1;
            }
            let end = log.high_watermark().0;
            let reads = 4000;
            let mut hist = Histogram::<u64>::new(3).expect("hist");
            for pass in 0..2 {
                for _ in 0..reads {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let at = rng % end;
                    let t = Instant::now();
                    let r = log.read(Offset(at), 1).await.expect("read");
                    let bytes = r.into_bytes().await.expect("bytes");
                    assert!(!bytes.is_empty());
                    if pass == 1 {
                        hist.record(t.elapsed().as_nanos() as u64).expect("record");
                    }
                }
            }
            let p = LookupPoint {
                segments: log.segment_count(),
                reads,
                p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
                p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
            };
            eprintln!("      {p:?}");
            points.push(p);
            target *= 10;
        }
        log.delete().await.expect("delete");
        points
    });
    let ratio = points.last().map_or(0.0, |l| l.p50_us) / points.first().map_or(1.0, |f| f.p50_us);
    Ok(Lookup { filesystem: fs, segment_bytes, open_readers_max, points, p50_ratio_last_to_first: ratio })
}

#[derive(serde::Serialize, Debug)]
struct Memory {
    heap_bytes_open_1_closed: i64,
    heap_bytes_open_100_closed: i64,
    heap_bytes_per_closed_segment: f64,
    heap_bytes_100_closed_beyond_1: i64,
    note: &'static str,
}

fn memory(args: &Args) -> Result<Memory> {
    let root = args.dir.join("memory");
    let _ignored = std::fs::remove_dir_all(&root);
    let m = run_glommio(move || async move {
        let config = TopicConfig {
            flush: FlushPolicy::Never,
            segment_bytes: 256 << 10,
            retention_ms: None,
            ..TopicConfig::default()
        };
        let pool = batch_pool(16 << 10, 8, now_ms());
        let mut deltas = Vec::new();
        for closed in [1usize, 100] {
            let dir = root.join(format!("p{closed}"));
            let log = Log::open(dir.clone(), config.clone()).await.expect("open");
            let mut i = 0;
            while log.segment_count() < closed + 1 {
                log.append(&pool[i % pool.len()], 0).await.expect("append");
                i += 1;
            }
            log.close().await.expect("close");
            drop(log);
            glommio::timer::sleep(Duration::from_millis(20)).await;
            let before = LIVE_BYTES.load(Ordering::Relaxed);
            let log = Log::open(dir, config.clone()).await.expect("open");
            // One read in the newest sealed segment, as a live partition would.
            let _r = log.read(Offset(0), 1).await.expect("read");
            let after = LIVE_BYTES.load(Ordering::Relaxed);
            deltas.push(after - before);
            log.close().await.expect("close");
        }
        let _ignored = std::fs::remove_dir_all(&root);
        Memory {
            heap_bytes_open_1_closed: deltas[0],
            heap_bytes_open_100_closed: deltas[1],
            heap_bytes_per_closed_segment: (deltas[1] - deltas[0]) as f64 / 99.0,
            heap_bytes_100_closed_beyond_1: deltas[1] - deltas[0],
            note: "live heap delta of Log::open (+ one read); includes the 1 MiB active fill buffer \
                       when glommio allocates it from the heap rather than its registered pool",
        }
    });
    Ok(m)
}

fn fio_json(args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new("fio").args(args).arg("--output-format=json").output().context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// fio O_DIRECT sequential write bandwidth in MB/s at `depth`.
fn fio_write(file: &Path, depth: u32) -> Result<f64> {
    let v = fio_json(&[
        "--name=w",
        &format!("--filename={}", file.display()),
        "--ioengine=io_uring",
        "--direct=1",
        "--rw=write",
        "--bs=1M",
        &format!("--iodepth={depth}"),
        "--size=2g",
        "--runtime=15",
    ])?;
    let _ignored = std::fs::remove_file(file);
    Ok(v["jobs"][0]["write"]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6)
}

/// fio 4 KiB write + fdatasync: (sync p50 µs, sync p99 µs, write+sync p99 µs).
fn fio_fdatasync(file: &Path) -> Result<(u64, u64, u64)> {
    let v = fio_json(&[
        "--name=s",
        &format!("--filename={}", file.display()),
        "--ioengine=psync",
        "--direct=1",
        "--rw=write",
        "--bs=4k",
        "--fdatasync=1",
        "--size=256m",
        "--runtime=10",
    ])?;
    let _ignored = std::fs::remove_file(file);
    let job = &v["jobs"][0];
    let pct = |section: &serde_json::Value, p: &str| {
        section["lat_ns"]["percentile"][p].as_u64().unwrap_or(0) / 1000
    };
    let sync_p50 = pct(&job["sync"], "50.000000");
    let sync_p99 = pct(&job["sync"], "99.000000");
    let write_p99 = job["write"]["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap_or(0) / 1000;
    Ok((sync_p50, sync_p99, sync_p99 + write_p99))
}

fn cmd_out(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}

/// `YYYY-MM-DD` (UTC) without a date crate.
fn today() -> String {
    let days = now_ms() / 86_400_000;
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn markdown(r: &serde_json::Value) -> String {
    let mut s = String::new();
    s.push_str(&format!("# Storage engine benchmark, {}\n\n", r["date"].as_str().unwrap_or("")));
    s.push_str(&format!(
        "git {} · {} build · kernel {} · {} · scratch dir `{}` ({})\n\n",
        r["git"].as_str().unwrap_or(""),
        r["profile"].as_str().unwrap_or(""),
        r["kernel"].as_str().unwrap_or(""),
        r["cpu"].as_str().unwrap_or(""),
        r["dir"].as_str().unwrap_or(""),
        r["filesystem"].as_str().unwrap_or(""),
    ));
    s.push_str("Raw figures: the JSON file next to this one.\n\n");
    s.push_str(&format!("```json\n{}\n```\n", serde_json::to_string_pretty(r).unwrap_or_default()));
    s
}
