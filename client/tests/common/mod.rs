//! A real broker started in-process for the client's integration tests: two
//! unpinned shards on 127.0.0.1, a temporary data directory, `/metrics` on.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::BrokerHandle;
use shardlog_client::{ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, ProducerConfig, SeekTo};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long any test waits for something it expects to happen.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct TestBroker {
    pub dir: tempfile::TempDir,
    pub handle: Option<BrokerHandle>,
    /// The public address (stable across `restart`).
    pub listen: SocketAddr,
}

fn config(dir: &std::path::Path, listen: SocketAddr) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.to_path_buf(), listen);
    config.shards = 2;
    config.pin_cores = false;
    config.admin_listen = Some("127.0.0.1:0".parse().expect("addr"));
    // Group tests form generations quickly and expire members fast.
    config.group.initial_rebalance_delay = Duration::from_millis(200);
    config.group.session_timeout_min = Duration::from_millis(300);
    config
}

impl TestBroker {
    /// Starts a broker (on a blocking thread: start-up blocks until every
    /// shard serves). Its public port and the shard ports after it lie below
    /// the kernel's ephemeral range (32768 and up by default), so that when
    /// a test restarts it on the same ports, none of them can meanwhile be
    /// the source port of some connection of this test process: that held
    /// restarts back until their deadline under a full test run.
    pub async fn start() -> TestBroker {
        // `RUST_LOG=shardlog_client=debug` shows the client's side of a failure.
        let _already = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").subsec_nanos()
                as u64
                ^ u64::from(std::process::id()) << 20;
        for _ in 0..50 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let port = 20_000 + ((seed >> 33) % 12_000) as u16;
            let cfg = config(dir.path(), SocketAddr::from(([127, 0, 0, 1], port)));
            match tokio::task::spawn_blocking(move || shardlog_broker::start(cfg)).await.expect("join") {
                Ok(handle) => {
                    let listen = handle.ready.listen;
                    return TestBroker { dir, handle: Some(handle), listen };
                }
                // Taken (another test, another process): try another.
                Err(
                    shardlog_broker::BrokerError::PortInUse { .. }
                    | shardlog_broker::BrokerError::PortCollision { .. },
                ) => {}
                Err(e) => panic!("broker starts: {e:?}"),
            }
        }
        panic!("no free port range found for a test broker");
    }

    pub fn addr(&self) -> String {
        self.listen.to_string()
    }

    pub fn shard_ports(&self) -> Vec<u16> {
        self.handle.as_ref().expect("running").ready.shard_ports.clone()
    }

    /// Graceful shutdown (drains in-flight requests, flushes logs).
    pub async fn stop(&mut self) {
        let handle = self.handle.take().expect("running");
        tokio::task::spawn_blocking(move || handle.shutdown()).await.expect("join").expect("clean shutdown");
    }

    /// Starts again on the same public port and data directory. The ports
    /// the stopped broker released are free for anyone: another test's
    /// listener or outgoing connection may hold one of them for a moment, so
    /// a start refused with `PortInUse` is retried for a while.
    pub async fn restart(&mut self) {
        assert!(self.handle.is_none(), "stop first");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let cfg = config(self.dir.path(), self.listen);
            match tokio::task::spawn_blocking(move || shardlog_broker::start(cfg)).await.expect("join") {
                Ok(handle) => {
                    self.handle = Some(handle);
                    return;
                }
                Err(e @ shardlog_broker::BrokerError::PortInUse { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    eprintln!("restart: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("broker restarts: {e:?}"),
            }
        }
    }

    /// Starts again on the same data directory and fresh ephemeral ports, for
    /// tests whose clients connect anew after the restart.
    pub async fn restart_on_new_ports(&mut self) {
        assert!(self.handle.is_none(), "stop first");
        let cfg = config(self.dir.path(), "127.0.0.1:0".parse().expect("addr"));
        let handle = tokio::task::spawn_blocking(move || shardlog_broker::start(cfg))
            .await
            .expect("join")
            .expect("broker restarts");
        self.listen = handle.ready.listen;
        self.handle = Some(handle);
    }

    /// Sum of a counter over all shards, read from the real `/metrics` endpoint.
    pub async fn metric(&self, name: &str) -> u64 {
        let admin = self.handle.as_ref().expect("running").ready.admin.expect("metrics enabled");
        let mut s = tokio::net::TcpStream::connect(admin).await.expect("connect metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await.expect("request");
        let mut text = String::new();
        s.read_to_string(&mut text).await.expect("response");
        let prefix = format!("{name}{{");
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit(' ').next().expect("value").parse::<u64>().expect("integer"))
            .sum()
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // A failed test: stop the shards anyway so the process can exit.
            drop(std::thread::spawn(move || h.shutdown()));
        }
    }
}

pub fn client(broker: &TestBroker) -> ClientConfig {
    ClientConfig { request_timeout_ms: 10_000, retry_backoff_ms: 10, ..ClientConfig::new(broker.addr()) }
}

pub fn producer_config(broker: &TestBroker) -> ProducerConfig {
    ProducerConfig { client: client(broker), linger_ms: 1, ..ProducerConfig::default() }
}

pub fn consumer_config(broker: &TestBroker) -> ConsumerConfig {
    ConsumerConfig { client: client(broker), fetch_max_wait_ms: 100, ..ConsumerConfig::default() }
}

pub async fn create(broker: &TestBroker, topic: &str, partitions: u32) {
    let admin = shardlog_client::Admin::connect(client(broker)).await.expect("admin");
    admin.create_topic(topic, partitions, &[]).await.expect("create topic");
}

/// Polls from the earliest offset until `expect` records arrived (or fails at the deadline).
pub async fn consume(broker: &TestBroker, parts: &[(String, u32)], expect: usize) -> Vec<ConsumerRecord> {
    let mut c = Consumer::new(consumer_config(broker)).await.expect("consumer");
    c.assign(parts, SeekTo::Earliest).await.expect("assign");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut out = Vec::new();
    while out.len() < expect {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {expect} records", out.len());
        out.extend(c.poll(Duration::from_millis(200)).await.expect("poll"));
    }
    out
}

pub fn b(s: &str) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(s.as_bytes())
}
