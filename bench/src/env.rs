//! What a report records about where it ran: git revision, build profile,
//! kernel, CPU, disk; and per-process resource use sampled from `/proc`.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// The machine and build a report was produced on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub git_sha: String,
    pub git_dirty: bool,
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

fn run_text(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn read_text(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

impl Environment {
    /// Collects everything; `data_dir` selects the disk reported.
    #[must_use]
    pub fn collect(repo: &Path, data_dir: &Path) -> Environment {
        let repo_s = repo.to_string_lossy();
        let git_sha =
            run_text("git", &["-C", &repo_s, "rev-parse", "--short=12", "HEAD"]).unwrap_or_default();
        let git_dirty = run_text("git", &["-C", &repo_s, "status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
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
            git_sha: if git_sha.is_empty() { "unknown".into() } else { git_sha },
            git_dirty,
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
    fn environment_names_the_disk_and_cpu() {
        let env = Environment::collect(Path::new(env!("CARGO_MANIFEST_DIR")), Path::new("/"));
        assert!(env.cores >= 1);
        assert!(!env.kernel.is_empty());
        assert_eq!(env.disk.mount_point, "/");
    }
}
