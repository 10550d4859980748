//! Spawning the broker under test: `shardlog serve` in a fresh data
//! directory, optionally pinned with `taskset`, ready once it prints
//!
//! ```text
//! shardlog ready: listen=IP:PORT shard_ports=P0,P1,... data_dir=DIR
//! ```

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a broker may take to print its ready line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a broker may take to exit after SIGTERM before it is killed.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The parsed ready line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub listen: String,
    pub shard_ports: Vec<u16>,
    pub data_dir: String,
    /// The admin (`/metrics`) listener, when the broker has one.
    pub admin: Option<String>,
}

/// Parses `shardlog ready: listen=... shard_ports=... data_dir=...`.
#[must_use]
pub fn parse_ready(line: &str) -> Option<Ready> {
    let rest = line.trim().strip_prefix("shardlog ready:")?;
    let mut ready =
        Ready { listen: String::new(), shard_ports: Vec::new(), data_dir: String::new(), admin: None };
    for field in rest.split_whitespace() {
        match field.split_once('=')? {
            ("listen", v) => ready.listen = v.to_owned(),
            ("shard_ports", v) => {
                ready.shard_ports =
                    v.split(',').filter(|p| !p.is_empty()).map(str::parse).collect::<Result<_, _>>().ok()?;
            }
            ("data_dir", v) => ready.data_dir = v.to_owned(),
            ("admin", v) => ready.admin = Some(v.to_owned()),
            _ => {}
        }
    }
    (!ready.listen.is_empty()).then_some(ready)
}

/// Options for spawning.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    pub binary: PathBuf,
    pub data_dir: PathBuf,
    pub shards: Option<u32>,
    /// `taskset -c` CPU list for the broker.
    pub cpus: Option<String>,
    /// Extra arguments after `serve ...`.
    pub extra_args: Vec<String>,
}

/// A running broker, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Broker {
    child: Child,
    pub ready: Ready,
    pub args: Vec<String>,
    pub log_path: PathBuf,
}

/// Default location: `shardlog` next to this binary (target/<profile>/).
pub fn default_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locate shardlog-bench")?;
    Ok(exe.parent().context("shardlog-bench has no parent directory")?.join("shardlog"))
}

impl Broker {
    pub fn spawn(opts: &SpawnOptions) -> anyhow::Result<Broker> {
        if !opts.binary.is_file() {
            bail!(
                "broker binary {} not found: build it with `cargo build --release -p shardlog` or pass --broker-bin",
                opts.binary.display()
            );
        }
        std::fs::create_dir_all(&opts.data_dir)
            .with_context(|| format!("create {}", opts.data_dir.display()))?;
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--data-dir".into(),
            opts.data_dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        if let Some(n) = opts.shards {
            args.extend(["--shards".into(), n.to_string()]);
        }
        args.extend(opts.extra_args.iter().cloned());
        let log_path = opts.data_dir.with_extension("broker.log");
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
        let mut cmd = match &opts.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus]).arg(&opts.binary);
                c
            }
            None => Command::new(&opts.binary),
        };
        die_with_parent(&mut cmd);
        let mut child = cmd
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("spawn {}", opts.binary.display()))?;
        let stdout = child.stdout.take().context("broker stdout")?;
        // Read stdout on a thread so that a silent broker cannot hang us and
        // later output never blocks the broker on a full pipe.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(r) = parse_ready(&line) {
                        sent = tx.send(r).is_ok();
                    }
                }
            }
        });
        let mut broker = Broker {
            child,
            ready: Ready { listen: String::new(), shard_ports: vec![], data_dir: String::new(), admin: None },
            args,
            log_path,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(ready) => {
                    broker.ready = ready;
                    return Ok(broker);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Some(status) = broker.child.try_wait()? {
                        bail!("broker exited with {status} before ready; log: {}", broker.tail_log());
                    }
                }
                Err(_) => bail!("broker not ready within {READY_TIMEOUT:?}; log: {}", broker.tail_log()),
            }
        }
    }

    /// PID of the broker (taskset execs it, so the pid is the broker's).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn tail_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGKILL (a crash: nothing is flushed, no clean-shutdown marker) and
    /// reap.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.child.kill()?;
            self.child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM and wait for a clean exit; SIGKILL after the timeout.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    eprintln!("shardlog-bench: broker exited with {status}");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("shardlog-bench: broker ignored SIGTERM for {SHUTDOWN_TIMEOUT:?}; killing it");
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

/// Makes the child get SIGKILL when the thread that spawns it ends, so a
/// harness killed mid-run (its `Drop` never runs) leaves no broker behind:
/// orphaned brokers kept burning up to 1.7 of these 2 cores and spoiled the
/// runs after them. The kernel ties this to the spawning *thread*, not the
/// process: brokers are spawned from the harness's main thread (`block_on`
/// runs there), which outlives them. It survives `taskset`'s exec.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the child between fork and exec and only calls
    // prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("shardlog-bench: stopping broker: {e:#}");
        }
    }
}

/// Removes a data directory that this harness created.
pub fn remove_data_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!("shardlog-bench: cannot remove {}: {e}", dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ready_line() {
        let r = parse_ready("shardlog ready: listen=127.0.0.1:4000 shard_ports=4001,4002 data_dir=/tmp/x\n")
            .unwrap();
        assert_eq!(r.listen, "127.0.0.1:4000");
        assert_eq!(r.shard_ports, vec![4001, 4002]);
        assert_eq!(r.data_dir, "/tmp/x");
        assert_eq!(r.admin, None);
        let r = parse_ready(
            "shardlog ready: listen=127.0.0.1:4000 shard_ports=4001 data_dir=/d admin=127.0.0.1:9\n",
        );
        assert_eq!(r.unwrap().admin.as_deref(), Some("127.0.0.1:9"));
        assert!(parse_ready("INFO starting").is_none());
        assert!(parse_ready("shardlog ready: shard_ports=x").is_none());
    }

    /// A child spawned from a thread that then ends is killed (what
    /// happens to a broker whose harness dies), through `taskset` too.
    #[test]
    fn a_child_dies_with_the_thread_that_spawned_it() {
        use std::os::unix::process::ExitStatusExt;
        for wrapped in [false, true] {
            let mut child = std::thread::spawn(move || {
                let mut cmd = if wrapped {
                    let mut c = Command::new("taskset");
                    c.args(["-c", "0", "sleep", "30"]);
                    c
                } else {
                    let mut c = Command::new("sleep");
                    c.arg("30");
                    c
                };
                super::die_with_parent(&mut cmd);
                cmd.spawn().expect("spawn sleep")
            })
            .join()
            .expect("spawning thread");
            let t0 = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait().expect("wait") {
                    break status;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    panic!("the child outlived its spawning thread by 10 s (taskset: {wrapped})");
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            assert_eq!(status.signal(), Some(libc::SIGKILL), "taskset: {wrapped}");
        }
    }

    #[test]
    fn a_missing_binary_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SpawnOptions {
            binary: dir.path().join("nope"),
            data_dir: dir.path().join("d"),
            shards: None,
            cpus: None,
            extra_args: vec![],
        };
        let e = Broker::spawn(&opts).err().unwrap().to_string();
        assert!(e.contains("cargo build --release -p shardlog"), "{e}");
    }
}
