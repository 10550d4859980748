//! A failing `accept` on the admin (`/metrics`) listener backs off as the
//! data listeners' does (10 ms doubling to 1 s) instead of retrying at once,
//! and the listener serves again once descriptors return.
//!
//! Its own test binary: it lowers the process's open-files limit.

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::start;
use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Runs `f` with the process's soft open-files limit at `limit`, then puts
/// the old limit back.
fn with_soft_fd_limit<T>(limit: libc::rlim_t, f: impl FnOnce() -> T) -> T {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    let new = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: `old` is a valid rlimit to fill; the new one only lowers the
    // soft limit (the hard limit is read back and kept), which needs no privilege.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &libc::rlimit { rlim_max: old.rlim_max, ..new }), 0);
    }
    let out = f();
    // SAFETY: `old` is the limit read above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    out
}

/// CPU time (user + system) this process has used.
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage for getrusage to fill.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Fills every free descriptor number below the highest open one, so that
/// with the limit at `highest + 1` no new descriptor can be made.
fn fill_fd_holes() -> (Vec<File>, libc::rlim_t) {
    let highest = std::fs::read_dir("/proc/self/fd")
        .expect("procfs")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .max()
        .expect("some fd");
    let mut holes = Vec::new();
    loop {
        let f = File::open("/dev/null").expect("open /dev/null");
        if f.as_raw_fd() > highest {
            return (holes, (highest + 1) as libc::rlim_t);
        }
        holes.push(f);
    }
}

fn get_metrics(stream: &mut std::net::TcpStream) -> String {
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("read response");
    body
}

#[test]
fn admin_accept_out_of_descriptors_backs_off_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = BrokerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 1;
    config.pin_cores = false;
    config.admin_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let broker = start(config).expect("broker starts");
    let admin: SocketAddr = broker.ready.admin.expect("admin listener");
    let mut first = std::net::TcpStream::connect(admin).expect("connect");
    assert!(get_metrics(&mut first).contains("200 OK"), "admin serves before the test");

    // The client socket is made while descriptors remain; its connection is
    // queued by the kernel, and the broker's accept fails with EMFILE.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let (holes, limit) = fill_fd_holes();
    let spent = with_soft_fd_limit(limit, || {
        socket.connect(&admin.into()).expect("connect: the kernel completes the handshake");
        // A measurement window, not synchronisation: without back-off the
        // admin loop retries accept in a tight loop and burns a core for all
        // of it; with back-off it makes about 7 attempts in 1.5 s.
        let before = cpu_time();
        std::thread::sleep(Duration::from_millis(1500));
        cpu_time() - before
    });
    drop(holes);
    assert!(spent < Duration::from_millis(300), "admin accept spun: {spent:?} of CPU in 1.5 s");

    // Descriptors are back: the queued connection is accepted and served.
    let mut stream: std::net::TcpStream = socket.into();
    let body = get_metrics(&mut stream);
    assert!(body.contains("200 OK") && body.contains("shardlog_connections"), "{body}");
    broker.shutdown().expect("clean shutdown");
}
