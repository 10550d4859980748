//! A cluster of `shardlog serve` processes for the cluster tests: one
//! broker per [`Node`], one shard each, on a ZooKeeper ensemble the test
//! started.

use shardlog_client::{Admin, ClientConfig};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

/// The brokers' ZooKeeper session timeout: failover tests wait for it.
pub const SESSION_MS: u64 = 2000;

/// One `shardlog serve` broker of a cluster, killed when dropped.
pub struct Node {
    pub id: i32,
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub listen: String,
    /// The Kafka listener's address.
    pub kafka: String,
    /// The admin (metrics) listener's address.
    pub admin: String,
    pub zookeeper: String,
    /// More `serve` arguments (for every start).
    pub extra: Vec<String>,
}

impl Node {
    pub fn start(id: i32, zookeeper: &str) -> Node {
        Node::start_with(id, zookeeper, &[])
    }

    pub fn start_with(id: i32, zookeeper: &str, extra: &[&str]) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut node = Node {
            id,
            child: None,
            dir,
            listen: String::new(),
            kafka: String::new(),
            admin: String::new(),
            zookeeper: zookeeper.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        node.spawn();
        node
    }

    pub fn spawn(&mut self) {
        let extra = [
            "--offsets-topic-partitions",
            "3",
            "--kafka-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ];
        let mut cmd = super::serve_command(self.dir.path(), 1, &extra);
        cmd.args(["--broker-id", &self.id.to_string(), "--zookeeper", &self.zookeeper])
            .args(["--advertised-host", "127.0.0.1"])
            .args(["--zookeeper-session-timeout-ms", &SESSION_MS.to_string()])
            .args(&self.extra)
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready line");
        assert!(line.starts_with("shardlog ready: "), "broker {}: {line:?}", self.id);
        let field =
            |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name)).map(str::to_string);
        self.listen = field("listen=").expect("listen");
        self.kafka = field("kafka=").expect("kafka");
        self.admin = field("admin=").expect("admin");
        self.child = Some(child);
    }

    /// `GET /metrics` from the admin listener.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.admin).expect("connect admin");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out
    }

    /// The value of the first sample of `name` whose line contains `labels`.
    pub fn metric(&self, name: &str, labels: &str) -> Option<u64> {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(labels))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to the broker.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok =
            std::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().expect("kill");
        assert!(ok.success(), "kill -{signal} {pid}");
    }

    /// Stops the broker with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id().to_string();
            let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
            let _ = c.wait();
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

pub fn admin(rt: &tokio::runtime::Runtime, bootstrap: &str) -> Admin {
    rt.block_on(Admin::connect(ClientConfig::new(bootstrap))).expect("admin")
}
