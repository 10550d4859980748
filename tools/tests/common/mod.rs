//! Shared by the end-to-end tests: start the real `shardlog serve` on
//! 127.0.0.1 port 0 and read its ready line.

pub mod cluster;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_shardlog");
/// How long one client command may take.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

/// What the ready line says.
pub struct Ready {
    pub listen: String,
    pub shard_ports: Vec<u16>,
    /// The Kafka listener, with `--kafka-listen`.
    pub kafka: Option<String>,
}

/// Spawns `shardlog serve` with `shards` unpinned shards on `dir` and waits
/// for its ready line.
pub fn serve(dir: &Path, shards: usize) -> (Child, Ready) {
    serve_with(dir, shards, &[])
}

/// `serve` with `extra` flags after the usual ones.
pub fn serve_with(dir: &Path, shards: usize, extra: &[&str]) -> (Child, Ready) {
    let child =
        serve_command(dir, shards, extra).stderr(Stdio::inherit()).spawn().expect("spawn shardlog serve");
    wait_ready(child)
}

/// The `shardlog serve` command of [`serve_with`], stdout piped for the
/// ready line, to spawn with changes (environment, stderr).
pub fn serve_command(dir: &Path, shards: usize, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve");
    // An ephemeral port unless `extra` names one (to restart on the same).
    if !extra.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    cmd.args(["--no-pin-cores", "--shards", &shards.to_string(), "--data-dir"])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped());
    cmd
}

/// Waits for a spawned broker's ready line.
pub fn wait_ready(child: Child) -> (Child, Ready) {
    match try_wait_ready(child) {
        Ok(ready) => ready,
        Err(line) => panic!("unexpected first line {line:?}"),
    }
}

/// [`wait_ready`], or the first line when it is not the ready line (the
/// broker failed to start; it is reaped).
pub fn try_wait_ready(mut child: Child) -> Result<(Child, Ready), String> {
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("ready line");
    if !line.starts_with("shardlog ready: ") {
        let _ = child.kill();
        let _ = child.wait();
        return Err(line);
    }
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in ready line {line:?}"))
            .to_string()
    };
    let listen = field("listen=");
    let shard_ports = field("shard_ports=").split(',').map(|p| p.parse().expect("port")).collect();
    let kafka = line.split_whitespace().find_map(|w| w.strip_prefix("kafka=")).map(str::to_string);
    Ok((child, Ready { listen, shard_ports, kafka }))
}

/// A broker process on a temp directory, with helpers that run the same
/// binary's client commands against it.
pub struct Broker {
    pub child: Child,
    pub listen: String,
    /// The Kafka listener, with `--kafka-listen`.
    pub kafka: Option<String>,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Broker {
    /// Two shards; `extra` serve flags.
    pub fn start_with(extra: &[&str]) -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let (child, ready) = serve_with(dir.path(), 2, extra);
        let (listen, kafka) = (ready.listen, ready.kafka);
        Broker { child, listen, kafka, dir, extra: extra.iter().map(|s| s.to_string()).collect() }
    }

    /// SIGKILLs the broker and starts it again on the same data directory
    /// with the same flags (new ports: `listen` changes).
    pub fn kill_and_restart(&mut self) {
        self.child.kill().expect("SIGKILL the broker");
        self.child.wait().expect("reap the broker");
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        // With a fixed `--listen`, the port may be refused for a moment after
        // the kill (sockets of the old process still closing): retry.
        let deadline = std::time::Instant::now() + COMMAND_DEADLINE;
        let (child, ready) = loop {
            let child = serve_command(self.dir.path(), 2, &extra)
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn shardlog serve");
            match try_wait_ready(child) {
                Ok(ready) => break ready,
                Err(line) if std::time::Instant::now() < deadline => {
                    eprintln!("restart refused ({line:?}); retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(line) => panic!("the broker did not restart: {line:?}"),
            }
        };
        self.child = child;
        self.listen = ready.listen;
        self.kafka = ready.kafka;
    }

    pub fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env("SHARDLOG_BOOTSTRAP", &self.listen).env_remove("SHARDLOG_CONFIG");
        cmd
    }

    /// Runs a client command to completion (bounded by a deadline).
    pub fn run(&self, args: &[&str], stdin: impl AsRef<[u8]>) -> Output {
        let mut child = self
            .cli(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shardlog");
        let mut input = child.stdin.take().expect("stdin");
        let bytes = stdin.as_ref().to_vec();
        let writer = std::thread::spawn(move || {
            input.write_all(&bytes).expect("write stdin");
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        let out = rx
            .recv_timeout(COMMAND_DEADLINE)
            .unwrap_or_else(|_| panic!("`shardlog {}` did not finish", args.join(" ")))
            .expect("wait");
        writer.join().expect("stdin writer");
        out
    }

    pub fn ok(&self, args: &[&str], stdin: impl AsRef<[u8]>) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.status.success(),
            "`shardlog {}` failed: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf8 stdout")
    }
}

impl Broker {
    pub fn start() -> Broker {
        Broker::start_with(&[])
    }

    /// Runs a client command that must fail; its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args, "");
        assert!(!out.status.success(), "`shardlog {}` should fail", args.join(" "));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines a child writes to `pipe`, as they come.
pub fn lines_of(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            if tx.send(line.expect("line")).is_err() {
                return;
            }
        }
    });
    rx
}

/// Sends `signal` (`-INT`, `-TERM`) to `child` and waits up to 15 s for a
/// successful exit.
pub fn signal_and_wait(child: &mut Child, signal: &str, what: &str) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args([signal, &pid]).status().expect("kill").success());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "{what}: exit {status}");
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `cmd probe...` runs and succeeds; says SKIPPED when not (the
/// Kafka clients' tests skip where `.ci/run` did not install them).
pub fn have(cmd: &str, probe: &[&str]) -> bool {
    let ok = Command::new(cmd)
        .args(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: `{cmd}` is not installed here (.ci/run installs it)");
    }
    ok
}

/// A 2-shard broker with a Kafka listener; its Kafka address.
pub fn start_kafka() -> (Broker, String) {
    let broker = Broker::start_with(&["--kafka-listen", "127.0.0.1:0"]);
    let kafka = broker.kafka.clone().expect("kafka= in the ready line");
    (broker, kafka)
}

/// Polls `f` every 20 ms until it gives a value; fails the test after
/// `within`. Returns the value and how long it took.
pub fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return (v, started.elapsed());
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs kcat with a deadline; its stdout.
pub fn kcat(kafka: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("kcat")
        .arg("-b")
        .arg(kafka)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kcat");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = rx.recv_timeout(COMMAND_DEADLINE).expect("kcat finished in time").expect("kcat ran");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kcat {args:?} failed: {stderr}");
    stdout.into_owned()
}

impl Broker {
    /// A broker the test spawned itself ([`serve_command`], [`wait_ready`])
    /// on `dir`, a data directory it set up (on a filesystem of its own, say);
    /// `extra` are the serve flags it used, for [`Broker::kill_and_restart`].
    pub fn adopt(child: Child, ready: Ready, dir: tempfile::TempDir, extra: &[&str]) -> Broker {
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Broker { child, listen: ready.listen, kafka: ready.kafka, dir, extra }
    }
}
