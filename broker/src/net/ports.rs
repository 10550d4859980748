//! The broker's ports: what each is for, the plan (fixed before
//! ephemeral), collision checks naming both uses, and binding (SO_REUSEPORT
//! only on the public port; a port held by no process is waited for).

use crate::config::BrokerConfig;
use crate::BrokerError;
use std::net::SocketAddr;

/// What one of the broker's ports is for; start-up errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortUse {
    /// The public port every shard accepts on (SO_REUSEPORT).
    Public,
    /// Shard `shard`'s own port, chosen as `rule` says.
    Shard { shard: usize, rule: ShardPortRule },
    /// The admin (`/metrics`) listener.
    Admin,
    /// The Kafka-protocol port every shard accepts on (SO_REUSEPORT), `--kafka-listen`.
    Kafka,
    /// Shard `shard`'s own Kafka-protocol port: the Kafka port + 1 + shard
    /// (ephemeral when the Kafka port is 0).
    KafkaShard { shard: usize },
}

/// How a shard's own port is chosen (`BrokerConfig::shard_port_base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardPortRule {
    /// `--shard-port-base` + shard index.
    Base,
    /// The public port + 1 + shard index (the default with a fixed public port).
    AfterPublic,
    /// Picked by the kernel (public port 0).
    Ephemeral,
}

impl std::fmt::Display for PortUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortUse::Public => write!(f, "the public listener (--listen)"),
            PortUse::Shard { shard, rule: ShardPortRule::Base } => {
                write!(f, "shard {shard}'s port (--shard-port-base + {shard})")
            }
            PortUse::Shard { shard, rule: ShardPortRule::AfterPublic } => {
                write!(f, "shard {shard}'s port (public port + {})", shard + 1)
            }
            PortUse::Shard { shard, rule: ShardPortRule::Ephemeral } => write!(f, "shard {shard}'s port"),
            PortUse::Admin => write!(f, "the admin listener (--admin-listen)"),
            PortUse::Kafka => write!(f, "the Kafka listener (--kafka-listen)"),
            PortUse::KafkaShard { shard } => {
                write!(f, "shard {shard}'s Kafka port (Kafka port + {})", shard + 1)
            }
        }
    }
}

/// Every listening socket of a broker, bound and listening before any shard
/// starts. Plain sockets (`Send`): each shard turns its own into glommio
/// listeners ([`into_listener`]).
#[derive(Debug)]
pub struct BoundPorts {
    pub public_addr: std::net::SocketAddr,
    /// One SO_REUSEPORT socket on the public port per shard.
    pub public: Vec<socket2::Socket>,
    /// Each shard's own socket and its port.
    pub shards: Vec<(socket2::Socket, u16)>,
    pub admin: Option<(socket2::Socket, std::net::SocketAddr)>,
    /// With `--kafka-listen`: the shared Kafka port's sockets (one per shard)
    /// and each shard's own Kafka socket and port.
    pub kafka: Option<KafkaPorts>,
}

/// The Kafka listener's sockets (`BrokerConfig::kafka_listen`).
#[derive(Debug)]
pub struct KafkaPorts {
    pub addr: std::net::SocketAddr,
    pub shared: Vec<socket2::Socket>,
    pub shards: Vec<(socket2::Socket, u16)>,
}

/// Whether every shard accepts on this port (SO_REUSEPORT).
fn shared_port(use_: PortUse) -> bool {
    matches!(use_, PortUse::Public | PortUse::Kafka)
}

/// The ports a configuration asks for, in use order: public, shards,
/// Kafka and Kafka shards, admin.
/// Port 0 means ephemeral.
fn plan_ports(config: &BrokerConfig) -> Result<Vec<(PortUse, SocketAddr)>, BrokerError> {
    let public = config.listen;
    let mut plan = vec![(PortUse::Public, public)];
    for i in 0..config.shards {
        let (first, rule) = match (config.shard_port_base, public.port()) {
            (Some(base), _) if base != 0 => (u32::from(base), ShardPortRule::Base),
            (Some(_), _) | (None, 0) => (0, ShardPortRule::Ephemeral),
            (None, p) => (u32::from(p) + 1, ShardPortRule::AfterPublic),
        };
        let port = if first == 0 { 0 } else { first + i as u32 };
        let port = u16::try_from(port).map_err(|_| {
            BrokerError::Config(format!(
                "{} would be {port}, past 65535: choose a lower --shard-port-base or --listen port",
                PortUse::Shard { shard: i, rule }
            ))
        })?;
        plan.push((PortUse::Shard { shard: i, rule }, SocketAddr::new(public.ip(), port)));
    }
    if let Some(kafka) = config.kafka_listen {
        plan.push((PortUse::Kafka, kafka));
        for i in 0..config.shards {
            let port = match kafka.port() {
                0 => 0,
                p => u16::try_from(u32::from(p) + 1 + i as u32).map_err(|_| {
                    BrokerError::Config(format!(
                        "{} would be past 65535: choose a lower --kafka-listen port",
                        PortUse::KafkaShard { shard: i }
                    ))
                })?,
            };
            plan.push((PortUse::KafkaShard { shard: i }, SocketAddr::new(kafka.ip(), port)));
        }
    }
    if let Some(admin) = config.admin_listen {
        plan.push((PortUse::Admin, admin));
    }
    Ok(plan)
}

/// Whether two addresses with the same port would take the same socket
/// (an unspecified address covers its family, and `[::]` IPv4 too).
fn addrs_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() {
        return false;
    }
    match (a.is_ipv4(), b.is_ipv4()) {
        (x, y) if x == y => a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified(),
        (true, false) => b.ip().is_unspecified(),
        _ => a.ip().is_unspecified(),
    }
}

/// The first two planned uses that ask for the same fixed port.
fn check_collisions(plan: &[(PortUse, SocketAddr)]) -> Result<(), BrokerError> {
    for (i, &(first, a)) in plan.iter().enumerate() {
        for &(second, b) in &plan[i + 1..] {
            if a.port() != 0 && addrs_overlap(a, b) {
                return Err(BrokerError::PortCollision { port: a.port(), first, second });
            }
        }
    }
    Ok(())
}

/// Binds a listening socket. Only the public port sets SO_REUSEPORT (every
/// shard accepts on it); a shard's own port and the admin port have one
/// socket each, so the kernel refuses any other socket already listening
/// there. SO_REUSEADDR on all: a restart or a port that just served
/// short-lived connections must not fail because of TIME_WAIT.
fn listen_socket(addr: SocketAddr, reuse_port: bool, listen: bool) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    if listen {
        socket.listen(1024)?;
    }
    Ok(socket)
}

/// How long start-up waits for a port that is taken but held by no process
/// `/proc` shows: the sockets of a broker that just died, which the kernel
/// releases only when the dead process's io_uring rings are torn down (a
/// deferred kernel work item). A restart right after SIGKILL met that on
/// every try (tools/tests/crash_loop.rs); a port some process holds fails
/// at once.
pub const PORT_SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// [`bind_ports`], waiting up to [`PORT_SETTLE_MAX`] for ports held by no
/// process to be released.
pub fn bind_ports_settling(config: &BrokerConfig) -> Result<BoundPorts, BrokerError> {
    let deadline = std::time::Instant::now() + PORT_SETTLE_MAX;
    let mut said = false;
    loop {
        match bind_ports(config) {
            Err(BrokerError::PortInUse { addr, holder: None, .. })
                if std::time::Instant::now() < deadline =>
            {
                if !said {
                    tracing::info!(%addr, "port still held by no process (a broker that just stopped?); waiting for it");
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Binds every port of the broker: first the fixed ones, then the ephemeral
/// ones (so a kernel-picked port cannot take a fixed one from us), after
/// checking that no two uses ask for the same port. A port in use elsewhere
/// is reported with what it was wanted for and, when `/proc` shows it, the
/// process holding it.
pub fn bind_ports(config: &BrokerConfig) -> Result<BoundPorts, BrokerError> {
    let plan = plan_ports(config)?;
    check_collisions(&plan)?;
    let mut bound: Vec<Option<(socket2::Socket, SocketAddr)>> = plan.iter().map(|_| None).collect();
    // The other sockets of each shared port, by its index in the plan.
    let mut shared_more: Vec<Vec<socket2::Socket>> = plan.iter().map(|_| Vec::new()).collect();
    for fixed in [true, false] {
        for (i, &(wanted_for, addr)) in plan.iter().enumerate() {
            if (addr.port() != 0) != fixed {
                continue;
            }
            let shared = shared_port(wanted_for);
            if shared && fixed {
                // SO_REUSEPORT would share the port with another process's
                // SO_REUSEPORT listener (another broker): first bind it
                // without (and without listening), which any listener refuses.
                drop(bind_one(&plan, &bound, wanted_for, addr, Bind::Probe)?);
            }
            let how = if shared { Bind::Shared } else { Bind::Alone };
            let (socket, local) = bind_one(&plan, &bound, wanted_for, addr, how)?;
            if shared {
                for _ in 1..config.shards {
                    shared_more[i].push(bind_one(&plan, &bound, wanted_for, local, Bind::Shared)?.0);
                }
            }
            bound[i] = Some((socket, local));
        }
    }
    // Plan order: public, shards, [Kafka, Kafka shards], [admin].
    let mut bound = bound
        .into_iter()
        .zip(shared_more)
        .map(|(b, more)| {
            let (first, addr) = b.expect("every planned port is bound");
            let mut all = vec![first];
            all.extend(more);
            (all, addr)
        })
        .collect::<Vec<_>>()
        .into_iter();
    let one = |(mut sockets, addr): (Vec<socket2::Socket>, SocketAddr)| (sockets.remove(0), addr);
    let (public, public_addr) = bound.next().expect("the public port is planned first");
    let shards = bound.by_ref().take(config.shards).map(one).map(|(s, a)| (s, a.port())).collect();
    let kafka = config.kafka_listen.map(|_| {
        let (shared, addr) = bound.next().expect("the Kafka port is planned after the shards");
        let shards = bound.by_ref().take(config.shards).map(one).map(|(s, a)| (s, a.port())).collect();
        KafkaPorts { addr, shared, shards }
    });
    Ok(BoundPorts { public_addr, public, shards, admin: bound.next().map(one), kafka })
}

/// How [`bind_one`] binds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bind {
    /// SO_REUSEPORT, listening: one of the public port's sockets.
    Shared,
    /// Listening, the port's only socket.
    Alone,
    /// Bound only, to see whether anything listens there.
    Probe,
}

fn bind_one(
    plan: &[(PortUse, SocketAddr)],
    bound: &[Option<(socket2::Socket, SocketAddr)>],
    wanted_for: PortUse,
    addr: SocketAddr,
    how: Bind,
) -> Result<(socket2::Socket, SocketAddr), BrokerError> {
    let listen_error = |source| BrokerError::Listen { addr, wanted_for, source };
    let socket = match listen_socket(addr, how == Bind::Shared, how != Bind::Probe) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let ours = plan.iter().zip(bound).find_map(|(&(first, _), b)| {
                b.as_ref().filter(|(_, local)| addrs_overlap(*local, addr)).map(|_| first)
            });
            return Err(match ours {
                Some(first) => BrokerError::PortCollision { port: addr.port(), first, second: wanted_for },
                None => BrokerError::PortInUse { addr, wanted_for, holder: port_holder(addr.port()) },
            });
        }
        Err(e) => return Err(listen_error(e)),
    };
    let local = socket
        .local_addr()
        .map_err(listen_error)?
        .as_socket()
        .ok_or_else(|| listen_error(std::io::Error::other("not an IP socket address")))?;
    Ok((socket, local))
}

/// The process listening on TCP `port`, as "process PID (NAME)", when
/// `/proc` shows it (start-up only, on the main thread: blocking reads are
/// fine there).
fn port_holder(port: u16) -> Option<String> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    // sl local_address rem_address st ... inode: LISTEN is 0A.
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
                    (local_port == port && *f.get(3)? == "0A").then(|| f.get(9).map(|s| s.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for pid in std::fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Some(pid) = pid.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.filter_map(Result::ok) {
            let target = std::fs::read_link(fd.path()).ok();
            if target.is_some_and(|t| wanted.iter().any(|w| t.as_os_str() == w.as_str())) {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                return Some(format!("process {pid} ({})", name.trim()));
            }
        }
    }
    None
}
