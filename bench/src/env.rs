//! What a report records about where it ran: the builds measured, build
//! profile, kernel, CPU, disk; and per-process resource use sampled from
//! `/proc`.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// The machine and build a report was produced on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// The commit the broker under test was built from (its `--version`),
    /// or this harness's own build when no broker binary is known.
    pub git_sha: String,
    /// Whether that build had uncommitted changes.
    pub git_dirty: bool,
    /// The commit this harness was built from (`-dirty` when it had
    /// uncommitted changes); empty in reports made before it was kept.
    #[serde(default)]
    pub harness_sha: String,
    pub build_profile: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub hostname: String,
    pub disk: DiskInfo,
}

/// The filesystem and block device under the broker's data directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskInfo {
    pub path: String,
    pub mount_point: String,
    pub device: String,
    pub fs_type: String,
    pub rotational: Option<bool>,
    pub model: String,
}

fn read_text(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

impl Environment {
    /// Collects everything; `broker` is the broker binary under test (its
    /// build names the report), `data_dir` selects the disk reported.
    #[must_use]
    pub fn collect(broker: Option<&Path>, data_dir: &Path) -> Environment {
        let (git_sha, git_dirty) = split_dirty(&broker.map_or_else(|| HARNESS_SHA.to_owned(), binary_sha));
        let cpuinfo = read_text("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim()))
            .unwrap_or("unknown")
            .to_owned();
        let memory_bytes = read_text("/proc/meminfo")
            .and_then(|m| {
                m.lines().find_map(|l| l.strip_prefix("MemTotal:").map(|v| parse_kb(v).unwrap_or(0)))
            })
            .unwrap_or(0);
        Environment {
            git_sha,
            git_dirty,
            harness_sha: HARNESS_SHA.to_owned(),
            build_profile: build_profile().into(),
            kernel: read_text("/proc/sys/kernel/osrelease").unwrap_or_default(),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            memory_bytes,
            hostname: read_text("/proc/sys/kernel/hostname").unwrap_or_default(),
            disk: DiskInfo::for_path(data_dir),
        }
    }
}

/// Where a report's files go and what its title names.
pub struct ReportName {
    /// `<out>/<date>-<sha>-<name>`, without an extension.
    pub base: std::path::PathBuf,
    pub date: String,
    /// The broker build measured.
    pub sha: String,
}

/// A report's [`ReportName`], creating `out`; the build is `broker`'s, or
/// the default broker binary's beside this harness.
pub fn report_base(
    out: &Path,
    name: &str,
    broker: Option<&Path>,
    data_dir: &Path,
) -> anyhow::Result<ReportName> {
    use anyhow::Context;
    let binary = broker.map_or_else(crate::broker::default_binary, |b| Ok(b.to_path_buf()))?;
    let sha = Environment::collect(Some(&binary), data_dir).git_sha;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let date = crate::report::utc_date(now);
    // Reports are append-only: a second run of the day gets `-2`, and so on.
    let stem = format!("{date}-{sha}-{name}");
    let mut base = out.join(&stem);
    let mut n = 2;
    while base.with_extension("json").exists() {
        base = out.join(format!("{stem}-{n}"));
        n += 1;
    }
    Ok(ReportName { base, date, sha })
}

/// The commit this harness was built from (see `ops/build/git_sha.rs`).
pub const HARNESS_SHA: &str = env!("SHARDLOG_BUILD_SHA");

/// The build a `shardlog` binary names in `--version` (`shardlog 0.1.0
/// (0123456789ab)`); `unknown` when it names none (built before it did, or
/// not a `shardlog` binary).
fn binary_sha(binary: &Path) -> String {
    let text = Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    parse_version_sha(&text).unwrap_or("unknown").to_owned()
}

fn parse_version_sha(version: &str) -> Option<&str> {
    let (_, rest) = version.trim().rsplit_once('(')?;
    let sha = rest.strip_suffix(')')?;
    (!sha.is_empty() && sha.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')).then_some(sha)
}

/// `abc-dirty` as (`abc`, true).
fn split_dirty(sha: &str) -> (String, bool) {
    match sha.strip_suffix("-dirty") {
        Some(clean) => (clean.to_owned(), true),
        None => (sha.to_owned(), false),
    }
}

/// The profile this binary was built with.
#[must_use]
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

fn parse_kb(v: &str) -> Option<u64> {
    v.trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k * 1024)
}

impl DiskInfo {
    /// The longest mount point in `/proc/mounts` that contains `path`.
    #[must_use]
    pub fn for_path(path: &Path) -> DiskInfo {
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mounts = read_text("/proc/mounts").unwrap_or_default();
        let best = mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?, f.next()?, f.next()?))
            })
            .filter(|(_, mp, _)| abs.starts_with(mp))
            .max_by_key(|(_, mp, _)| mp.len());
        let Some((device, mount_point, fs_type)) = best else {
            return DiskInfo { path: abs.display().to_string(), ..DiskInfo::default() };
        };
        let dev_name = device.rsplit('/').next().unwrap_or("");
        // A partition (vda1) reports through its parent (vda).
        let block = [dev_name.to_owned(), dev_name.trim_end_matches(|c: char| c.is_ascii_digit()).to_owned()]
            .into_iter()
            .find(|d| !d.is_empty() && Path::new(&format!("/sys/block/{d}")).exists());
        let (rotational, model) = match &block {
            Some(b) => (
                read_text(format!("/sys/block/{b}/queue/rotational")).map(|r| r == "1"),
                read_text(format!("/sys/block/{b}/device/model"))
                    .or_else(|| read_text(format!("/sys/block/{b}/device/vendor")))
                    .unwrap_or_else(|| if b.starts_with("vd") { "virtio".into() } else { String::new() }),
            ),
            None => (None, String::new()),
        };
        DiskInfo {
            path: abs.display().to_string(),
            mount_point: mount_point.to_owned(),
            device: device.to_owned(),
            fs_type: fs_type.to_owned(),
            rotational,
            model,
        }
    }
}

/// One sample of a process's resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// Seconds since the start of the run.
    pub t_s: f64,
    pub rss_bytes: u64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
}

/// A block device's cumulative I/O, from `/proc/diskstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiskCounters {
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Time the device had I/O in flight (`io_ticks`), ms.
    pub busy_ms: u64,
}

impl DiskCounters {
    /// The counters of `device` (`/dev/vda` or `vda`) now; `None` when
    /// `/proc/diskstats` does not list it (tmpfs, overlay, ...).
    #[must_use]
    pub fn read(device: &str) -> Option<DiskCounters> {
        parse_diskstats(&read_text("/proc/diskstats")?, device.rsplit('/').next()?)
    }

    /// What happened between `earlier` and `self`.
    #[must_use]
    pub fn since(self, earlier: DiskCounters) -> DiskCounters {
        DiskCounters {
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            written_bytes: self.written_bytes.saturating_sub(earlier.written_bytes),
            busy_ms: self.busy_ms.saturating_sub(earlier.busy_ms),
        }
    }
}

fn parse_diskstats(text: &str, name: &str) -> Option<DiskCounters> {
    // After the name: reads, merged, sectors read, ms, writes, merged,
    // sectors written, ms, in flight, io_ticks, ...
    let fields: Vec<u64> = text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.nth(2) == Some(name)).then(|| f.map(|v| v.parse().unwrap_or(0)).collect())
    })?;
    Some(DiskCounters {
        read_bytes: *fields.get(2)? * 512,
        written_bytes: *fields.get(6)? * 512,
        busy_ms: *fields.get(9)?,
    })
}

/// Reads `/proc/<pid>/stat` (CPU time) and `/proc/<pid>/statm` (RSS).
/// `None` when the process is gone.
#[must_use]
pub fn sample_proc(pid: u32, t_s: f64) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (user, sys) = parse_stat_cpu(&stat)?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let rss_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Some(ProcSample {
        t_s,
        rss_bytes: rss_pages * page.max(4096) as u64,
        cpu_user_s: user as f64 / ticks,
        cpu_sys_s: sys as f64 / ticks,
    })
}

/// utime and stime (fields 14 and 15) in clock ticks. The command name
/// (field 2) may contain spaces and parentheses, so parsing starts after the
/// last `)`.
fn parse_stat_cpu(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// The whole machine's CPU time, cumulative clock ticks of every CPU from
/// the first line of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineSample {
    pub total: u64,
    /// idle + iowait.
    pub idle: u64,
    /// Taken by the hypervisor for other guests while this one wanted to run.
    pub steal: u64,
}

/// `/proc/stat` now, or `None` where it cannot be read.
#[must_use]
pub fn sample_machine() -> Option<MachineSample> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_proc_stat(text: &str) -> Option<MachineSample> {
    let line = text.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let v: Vec<u64> = fields.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
    (v.len() == 8).then(|| MachineSample { total: v.iter().sum(), idle: v[3] + v[4], steal: v[7] })
}

/// The machine's CPU over a window: what a reader needs to tell a slow
/// run on a busy or shared host from a slow program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineSummary {
    /// Fraction of all CPUs' time idle (or waiting for I/O).
    pub idle_fraction: f64,
    /// Fraction of all CPUs' time stolen by the hypervisor.
    pub steal_fraction: f64,
}

#[must_use]
pub fn summarize_machine(first: MachineSample, last: MachineSample) -> Option<MachineSummary> {
    let total = last.total.checked_sub(first.total).filter(|t| *t > 0)? as f64;
    Some(MachineSummary {
        idle_fraction: last.idle.saturating_sub(first.idle) as f64 / total,
        steal_fraction: last.steal.saturating_sub(first.steal) as f64 / total,
    })
}

/// Summary of a sampled series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSummary {
    pub rss_bytes_max: u64,
    pub rss_bytes_last: u64,
    /// CPU seconds (user + system) used between the first and last sample.
    pub cpu_s: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// Average cores busy over the sampled window.
    pub cpu_cores_avg: f64,
}

#[must_use]
pub fn summarize(samples: &[ProcSample]) -> ProcSummary {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return ProcSummary::default();
    };
    let user = last.cpu_user_s - first.cpu_user_s;
    let sys = last.cpu_sys_s - first.cpu_sys_s;
    let wall = last.t_s - first.t_s;
    ProcSummary {
        rss_bytes_max: samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0),
        rss_bytes_last: last.rss_bytes,
        cpu_s: user + sys,
        cpu_user_s: user,
        cpu_sys_s: sys,
        cpu_cores_avg: if wall > 0.0 { (user + sys) / wall } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_cpu_is_split_into_idle_and_stolen() {
        let a = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let b = parse_proc_stat("cpu  200 0 100 900 100 0 0 100 0 0\n").unwrap();
        assert_eq!(a, MachineSample { total: 1000, idle: 850, steal: 0 });
        let m = summarize_machine(a, b).unwrap();
        assert!((m.idle_fraction - 0.375).abs() < 1e-9, "{m:?}");
        assert!((m.steal_fraction - 0.25).abs() < 1e-9, "{m:?}");
        assert_eq!(summarize_machine(b, b), None, "no time passed");
        assert_eq!(parse_proc_stat("intr 1 2 3\n"), None);
        assert!(sample_machine().is_some(), "this is Linux");
    }

    #[test]
    fn parses_stat_with_a_hostile_command_name() {
        let stat = "1234 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 4 0 100 0 0";
        assert_eq!(parse_stat_cpu(stat), Some((250, 75)));
    }

    #[test]
    fn samples_this_process() {
        let s = sample_proc(std::process::id(), 0.0).unwrap();
        assert!(s.rss_bytes > 1 << 20, "rss {}", s.rss_bytes);
        assert!(sample_proc(u32::MAX - 1, 0.0).is_none());
        let sum = summarize(&[
            ProcSample { t_s: 0.0, rss_bytes: 10, cpu_user_s: 1.0, cpu_sys_s: 0.5 },
            ProcSample { t_s: 2.0, rss_bytes: 30, cpu_user_s: 2.0, cpu_sys_s: 1.5 },
        ]);
        assert_eq!(sum.rss_bytes_max, 30);
        assert!((sum.cpu_s - 2.0).abs() < 1e-9 && (sum.cpu_cores_avg - 1.0).abs() < 1e-9);
    }

    #[test]
    fn disk_counters_come_from_diskstats() {
        let text = " 254       0 vda 132414 11646 78478394 306854 440406 81318 164028496 469246 0 94176 792450 12142 51\n\
                    254       1 vda1 10 0 80 1 20 0 160 2 0 3 4\n";
        let c = parse_diskstats(text, "vda").expect("vda");
        assert_eq!(
            c,
            DiskCounters { read_bytes: 78478394 * 512, written_bytes: 164028496 * 512, busy_ms: 94176 }
        );
        assert_eq!(parse_diskstats(text, "vda1").map(|c| c.busy_ms), Some(3));
        assert_eq!(parse_diskstats(text, "sda"), None);
        let later = DiskCounters { read_bytes: c.read_bytes + 10, ..c };
        assert_eq!(later.since(c), DiskCounters { read_bytes: 10, written_bytes: 0, busy_ms: 0 });
    }

    #[test]
    fn a_broker_build_is_read_off_its_version_line() {
        assert_eq!(parse_version_sha("shardlog 0.1.0 (0123456789ab)\n"), Some("0123456789ab"));
        assert_eq!(parse_version_sha("shardlog 0.1.0 (0123456789ab-dirty)"), Some("0123456789ab-dirty"));
        assert_eq!(parse_version_sha("shardlog 0.1.0"), None, "an older build names no commit");
        assert_eq!(parse_version_sha("shardlog 0.1.0 ()"), None);
        assert_eq!(split_dirty("0123456789ab-dirty"), ("0123456789ab".to_owned(), true));
        assert_eq!(split_dirty("0123456789ab"), ("0123456789ab".to_owned(), false));
        assert_eq!(binary_sha(Path::new("/nonexistent/shardlog")), "unknown");
    }

    #[test]
    fn environment_names_the_disk_and_cpu() {
        let env = Environment::collect(None, Path::new("/"));
        assert_eq!(env.harness_sha, HARNESS_SHA);
        assert!(!env.git_sha.is_empty());
        assert!(env.cores >= 1);
        assert!(!env.kernel.is_empty());
        assert_eq!(env.disk.mount_point, "/");
    }
}
