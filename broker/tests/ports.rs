//! Port collisions fail start-up with an error naming both uses of the port:
//! two uses of one broker (public, shard ports, admin) asking for the same
//! port, and a port another socket already listens on (a plain listener, or
//! another broker sharing it through SO_REUSEPORT).

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::net::{PortUse, ShardPortRule};
use shardlog_broker::{start, BrokerError};
use std::net::{SocketAddr, TcpListener};

/// Two shards on 127.0.0.1:`port`, data in `dir`.
fn config(dir: &tempfile::TempDir, port: u16) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.path().to_path_buf(), SocketAddr::from(([127, 0, 0, 1], port)));
    config.shards = 2;
    config.pin_cores = false;
    config
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A port nothing listens on right now, with the next two free as well.
fn free_ports() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = l.local_addr().expect("addr").port();
        if p < 65000 && (1..3).all(|i| TcpListener::bind(local(p + i)).is_ok()) {
            return p;
        }
    }
}

fn start_err(config: BrokerConfig) -> BrokerError {
    match start(config) {
        Ok(b) => {
            let ready = b.ready.ready_line();
            b.shutdown().expect("shutdown");
            panic!("the broker started: {ready}");
        }
        Err(e) => e,
    }
}

fn shard(shard: usize, rule: ShardPortRule) -> PortUse {
    PortUse::Shard { shard, rule }
}

#[test]
fn two_uses_of_one_port_fail_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = free_ports();
    // The case: the admin port is shard 0's (public + 1).
    let mut c = config(&dir, p);
    c.admin_listen = Some(local(p + 1));
    let e = start_err(c);
    assert!(
        matches!(e, BrokerError::PortCollision { port, first, second: PortUse::Admin }
            if port == p + 1 && first == shard(0, ShardPortRule::AfterPublic)),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains(&format!("port {} is wanted twice", p + 1)), "{text}");
    assert!(text.contains("shard 0's port (public port + 1)") && text.contains("admin listener"), "{text}");

    let mut c = config(&dir, p);
    c.admin_listen = Some(SocketAddr::from(([0, 0, 0, 0], p)));
    let e = start_err(c);
    assert!(
        matches!(e, BrokerError::PortCollision { first: PortUse::Public, second: PortUse::Admin, .. }),
        "an unspecified admin address covers the public one: {e:?}"
    );

    let mut c = config(&dir, p);
    c.shard_port_base = Some(p - 1);
    let e = start_err(c);
    assert!(
        matches!(e, BrokerError::PortCollision { port, first: PortUse::Public, second }
            if port == p && second == shard(1, ShardPortRule::Base)),
        "{e:?}"
    );
    assert!(e.to_string().contains("shard 1's port (--shard-port-base + 1)"), "{e}");

    // Nothing stayed bound after the failures.
    TcpListener::bind(local(p)).expect("public port free again");
    TcpListener::bind(local(p + 1)).expect("shard port free again");
}

#[test]
fn shard_ports_past_65535_are_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(&dir, 0);
    c.shard_port_base = Some(65535);
    let e = start_err(c);
    assert!(
        matches!(&e, BrokerError::Config(m) if m.contains("shard 1's port") && m.contains("65536")),
        "{e}"
    );
    let e = start_err(config(&dir, 65535));
    assert!(matches!(&e, BrokerError::Config(m) if m.contains("shard 0's port")), "{e}");
}

#[test]
fn a_port_another_socket_listens_on_is_reported_with_its_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let holder = TcpListener::bind("127.0.0.1:0").expect("bind");
    let q = holder.local_addr().expect("addr").port();
    let pid = std::process::id();
    type Tweak = fn(&mut BrokerConfig, u16);
    let cases: [(Tweak, PortUse); 3] = [
        (|c, q| c.listen = local(q), PortUse::Public),
        (|c, q| c.admin_listen = Some(local(q)), PortUse::Admin),
        (|c, q| c.shard_port_base = Some(q), shard(0, ShardPortRule::Base)),
    ];
    for (tweak, want) in cases {
        let mut c = config(&dir, 0);
        tweak(&mut c, q);
        let e = start_err(c);
        assert!(
            matches!(&e, BrokerError::PortInUse { addr, wanted_for, .. } if addr.port() == q && *wanted_for == want),
            "{want}: {e:?}"
        );
        let text = e.to_string();
        assert!(text.contains(&format!("port {q} is already in use by process {pid} (")), "{text}");
        assert!(text.contains(&want.to_string()), "{text}");
    }
    drop(holder);
}

#[test]
fn a_second_broker_on_the_same_public_port_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(&dir, 0);
    c.shards = 1;
    let first = start(c).expect("first broker starts");
    let other_dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(&other_dir, first.ready.listen.port());
    c.shard_port_base = Some(free_ports());
    let e = start_err(c);
    assert!(
        matches!(e, BrokerError::PortInUse { wanted_for: PortUse::Public, holder: Some(_), .. }),
        "SO_REUSEPORT must not let two brokers share a public port: {e:?}"
    );
    first.shutdown().expect("shutdown");
}
