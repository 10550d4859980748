//! A real ZooKeeper ensemble for tests: three `QuorumPeerMain` JVMs from
//! Debian's `zookeeper` package on 127.0.0.1, each with its own free ports
//! and temp data dir, `tickTime=500` (sessions of 1 to 10 s) and small heaps.
//! Dropping the ensemble kills every node.
//!
//! Tests that need it call [`Ensemble::start`], which returns `None` (after a
//! loud line on stderr) when java or zookeeper.jar are missing; CI installs
//! both (`.ci/run`).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const ZK_JUTE_JAR: &str = "/usr/share/java/zookeeper-jute.jar";
/// ZooKeeper logs nothing without an slf4j binding; the simple one writes to stderr.
const SLF4J_JARS: &[&str] = &["/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-simple.jar"];
const TICK_MS: u64 = 500;
/// How long a node may take to serve (a JVM start on a loaded 2-core box).
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// One ensemble member.
pub struct Node {
    pub id: usize,
    pub client_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// A running 3-node ensemble.
pub struct Ensemble {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

/// Whether java and the ZooKeeper jars are installed; says loudly why not.
pub fn available() -> bool {
    let java = Command::new("java").arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !matches!(java, Ok(s) if s.success()) {
        eprintln!(
            "\n!!!! SKIPPED: no `java` on PATH; install Debian's `zookeeper` package (.ci/run does) !!!!\n"
        );
        return false;
    }
    if !Path::new(ZK_JAR).exists() {
        eprintln!("\n!!!! SKIPPED: {ZK_JAR} is missing; `apt-get install zookeeper` (.ci/run does) !!!!\n");
        return false;
    }
    true
}

/// Ports nobody listens on now (bound at once, then released).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("local addr").port()).collect()
}

impl Ensemble {
    /// Starts three nodes and waits until each serves (`srvr` answers with a
    /// `Mode:` line). `None` when ZooKeeper is not installed.
    pub fn start() -> Option<Ensemble> {
        let mut ensemble = Ensemble::planned()?;
        ensemble.launch();
        Some(ensemble)
    }

    /// Starts every node of a [`planned`](Ensemble::planned) ensemble and
    /// waits until each serves.
    pub fn launch(&mut self) {
        for i in 0..self.nodes.len() {
            self.spawn(i);
        }
        for i in 0..self.nodes.len() {
            self.wait_serving(i);
        }
    }

    /// Ports and configs of three nodes, none started yet (for tests of a
    /// broker that starts before ZooKeeper does).
    pub fn planned() -> Option<Ensemble> {
        if !available() {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = free_ports(9);
        let servers: String = (0..3)
            .map(|i| format!("server.{}=127.0.0.1:{}:{}\n", i + 1, ports[3 + i], ports[6 + i]))
            .collect();
        let mut nodes = Vec::new();
        for (i, &client_port) in ports.iter().enumerate().take(3) {
            let node_dir = dir.path().join(format!("zk{}", i + 1));
            std::fs::create_dir_all(node_dir.join("data")).expect("node dir");
            std::fs::write(node_dir.join("data/myid"), format!("{}\n", i + 1)).expect("myid");
            let cfg = format!(
                "tickTime={TICK_MS}\ninitLimit=20\nsyncLimit=10\ndataDir={}\nclientPort={}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxSessionTimeout=10000\n{servers}",
                node_dir.join("data").display(),
                client_port
            );
            std::fs::write(node_dir.join("zoo.cfg"), cfg).expect("zoo.cfg");
            nodes.push(Node { id: i + 1, client_port, dir: node_dir, child: None });
        }
        Some(Ensemble { nodes, _dir: dir })
    }

    /// The connect string of every node (`127.0.0.1:P1,127.0.0.1:P2,...`).
    pub fn connect_string(&self) -> String {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.client_port)).collect::<Vec<_>>().join(",")
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut cp = vec![ZK_JAR, ZK_JUTE_JAR];
        cp.extend(SLF4J_JARS);
        let log = std::fs::File::create(node.dir.join("zk.log")).expect("zk log");
        let child = Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(cp.join(":"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(node.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn java");
        node.child = Some(child);
    }

    /// Waits until node `i` answers `srvr` with its `Mode:` (leader or
    /// follower: it is part of a quorum).
    pub fn wait_serving(&self, i: usize) {
        let node = &self.nodes[i];
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(mode) = four_letter(node.client_port, "srvr").and_then(|s| mode_of(&s)) {
                if mode != "standalone" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "ZooKeeper node {} (port {}) not serving after {READY_DEADLINE:?}; log:\n{}",
                node.id,
                node.client_port,
                std::fs::read_to_string(node.dir.join("zk.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Node `i`'s `Mode:` (`leader`, `follower`), if it serves.
    pub fn mode(&self, i: usize) -> Option<String> {
        four_letter(self.nodes[i].client_port, "srvr").and_then(|s| mode_of(&s))
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its data and waits until it serves.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_serving(i);
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Sends a four-letter word and reads the whole answer.
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn mode_of(srvr: &str) -> Option<String> {
    srvr.lines().find_map(|l| l.strip_prefix("Mode: ")).map(|m| m.trim().to_string())
}
