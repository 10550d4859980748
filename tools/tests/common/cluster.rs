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
            zookeeper: zookeeper.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        node.spawn();
        node
    }

    pub fn spawn(&mut self) {
        let extra = ["--offsets-topic-partitions", "3", "--kafka-listen", "127.0.0.1:0"];
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
        self.child = Some(child);
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
