//! The admin port's `/healthz` and `/readyz`: `/readyz` answers 503 while
//! the shards are still recovering their logs (slowed here by an injected
//! delay at log open) and 200 once every shard serves.

mod wire_support;

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::fault::{self, Fault, FaultPoint};
use shardlog_broker::start;
use shardlog_schema::wire::ErrorCode;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use wire_support::Conn;

fn config(dir: &std::path::Path, admin: SocketAddr) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 2;
    config.pin_cores = false;
    config.admin_listen = Some(admin);
    config
}

/// (status code, body) of `GET path`, or `None` while nothing answers.
fn get(admin: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    Some((code, text.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()))
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[test]
fn readyz_is_503_until_every_shard_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = free_port();
    let handle = start(config(dir.path(), admin)).expect("broker starts");
    assert_eq!(get(admin, "/healthz"), Some((200, "ok\n".to_string())));
    assert_eq!(get(admin, "/readyz"), Some((200, "ready\n".to_string())));
    assert_eq!(get(admin, "/nope").map(|r| r.0), Some(404));
    let mut conn = Conn::open(handle.ready.listen.port());
    assert_eq!(conn.create_topic("slow", 2), ErrorCode::None);
    handle.shutdown().expect("clean shutdown");

    // Restart with each partition's log open delayed by 1.5 s.
    let filter = dir.path().to_string_lossy().to_string();
    fault::arm(FaultPoint::RecoveryRead, &filter, Fault::Delay(Duration::from_millis(1500)));
    let cfg = config(dir.path(), admin);
    let starting = std::thread::spawn(move || start(cfg).expect("broker starts"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut saw_503 = false;
    while !starting.is_finished() && Instant::now() < deadline {
        if let Some((code, body)) = get(admin, "/readyz") {
            if code == 503 {
                assert!(body.starts_with("not ready: "), "{body}");
                assert_eq!(get(admin, "/healthz").map(|r| r.0), Some(200), "alive while recovering");
                saw_503 = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let handle = starting.join().expect("start-up thread");
    fault::disarm(&filter);
    assert!(saw_503, "/readyz never said 503 while the logs were being opened");
    assert_eq!(get(admin, "/readyz"), Some((200, "ready\n".to_string())));
    handle.shutdown().expect("clean shutdown");
}
