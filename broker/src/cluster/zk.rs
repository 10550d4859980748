//! The ZooKeeper membership backend.
//!
//! A control thread of its own (`zk-control`, a current-thread tokio
//! runtime) owns the `zookeeper-client` session; shards never touch it.
//! What it learns is published as a [`ClusterView`] (behind a mutex that
//! only the control plane reads, never the data path).
//!
//! Session loop, one turn per ZooKeeper session:
//! 1. connect (retrying every second with a log line while no ensemble
//!    member answers; the client itself moves between ensemble members
//!    when a connection is lost and the session lives on);
//! 2. make the layout's persistent znodes (`/shardlog/...`, the cluster id);
//! 3. register `/shardlog/brokers/ids/<id>` (ephemeral). Held by another
//!    session: at start-up the broker refuses to start
//!    ([`ClusterError::DuplicateBrokerId`]); after an expiry it retries
//!    until the old registration is gone;
//! 4. loop: read the brokers and the controller with watches, run for
//!    controller when there is none, reconcile partition states while
//!    controller, publish the view, and wait for a watch, a session state
//!    change or the stop signal.
//!
//! The crate does not start a new session after expiry: on `Expired` the
//! loop drops the client and goes back to 1 (new client, ephemerals
//! re-created, state re-read, watches re-installed). `Disconnected` is only
//! logged: the client reconnects within the session by itself.

use super::controller::{self, ControllerEpoch};
use super::metadata::{self, ClusterMetadata};
use super::placement::Candidate;
use super::request::{ClusterLink, ControlRequest};
use super::{BrokerRegistration, ClusterConfig, ClusterError, ClusterView, Membership};
use std::collections::BTreeSet;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use zookeeper_client as zkc;

/// The ZooKeeper client type this backend uses (for tests and tools).
pub use zookeeper_client::Client;

/// The layout (see the module docs of `cluster`).
pub mod paths {
    pub const ROOT: &str = "/shardlog";
    pub const CLUSTER_ID: &str = "/shardlog/cluster/id";
    pub const BROKER_IDS: &str = "/shardlog/brokers/ids";
    pub const CONTROLLER: &str = "/shardlog/controller";
    pub const CONTROLLER_EPOCH: &str = "/shardlog/controller_epoch";
    pub const TOPICS: &str = "/shardlog/topics";
    /// Requests for the controller (creations, deletions).
    pub const ADMIN: &str = "/shardlog/admin";
    /// Topic creations waiting for the controller.
    pub const CREATE_TOPIC_REQUESTS: &str = "/shardlog/admin/create_topics";
    /// Topic deletions waiting for the controller.
    pub const DELETE_TOPIC_REQUESTS: &str = "/shardlog/admin/delete_topics";
    /// Brokers in controlled shutdown (ephemeral children named by id).
    pub const SHUTTING_DOWN: &str = "/shardlog/admin/shutting_down";
    /// A preferred-leader election asked for (`cluster elect-leaders`).
    pub const PREFERRED_ELECTION: &str = "/shardlog/admin/preferred_election";
    /// A partition reassignment in progress (`cluster reassign`, `cluster rebalance`).
    pub const REASSIGNMENT: &str = "/shardlog/admin/reassign_partitions";

    #[must_use]
    pub fn shutting_down(id: i32) -> String {
        format!("{SHUTTING_DOWN}/{id}")
    }

    #[must_use]
    pub fn broker(id: i32) -> String {
        format!("{BROKER_IDS}/{id}")
    }
    #[must_use]
    pub fn create_topic_request(topic: &str) -> String {
        format!("{CREATE_TOPIC_REQUESTS}/{topic}")
    }
    #[must_use]
    pub fn delete_topic_request(topic: &str) -> String {
        format!("{DELETE_TOPIC_REQUESTS}/{topic}")
    }
    #[must_use]
    pub fn topic(topic: &str) -> String {
        format!("{TOPICS}/{topic}")
    }
    #[must_use]
    pub fn partition_state(topic: &str, partition: u32) -> String {
        format!("{TOPICS}/{topic}/partitions/{partition}/state")
    }
}

/// How long to wait between attempts to reach the ensemble.
const RETRY: Duration = Duration::from_secs(1);

/// Splits Kafka's `zookeeper.connect` into hosts and chroot (`None` when
/// there is none or it is `/`).
pub fn split_connect(connect: &str) -> Result<(String, Option<String>), ClusterError> {
    let bad = || ClusterError::ConnectString(connect.to_string());
    let (hosts, chroot) = match connect.find('/') {
        Some(i) => (&connect[..i], Some(&connect[i..])),
        None => (connect, None),
    };
    if hosts.is_empty()
        || hosts
            .split(',')
            .any(|h| h.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
    {
        return Err(bad());
    }
    let chroot = chroot.map(|c| c.trim_end_matches('/')).filter(|c| !c.is_empty());
    if let Some(c) = chroot {
        if c.contains("//") {
            return Err(bad());
        }
    }
    Ok((hosts.to_string(), chroot.map(str::to_string)))
}

/// Connects a session (chroot created first when it does not exist).
pub async fn connect(connect_string: &str, session_timeout: Duration) -> Result<zkc::Client, ClusterError> {
    let (hosts, chroot) = split_connect(connect_string)?;
    let client = zkc::Client::connector().with_session_timeout(session_timeout).connect(&hosts).await?;
    let Some(chroot) = chroot else { return Ok(client) };
    let dir = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    match client.mkdir(&chroot, &dir).await {
        Ok(()) | Err(zkc::Error::NodeExists) => {}
        Err(e) => return Err(e.into()),
    }
    client.chroot(chroot).map_err(|_| ClusterError::ConnectString(connect_string.to_string()))
}

/// Creates the persistent znodes of the layout (idempotent).
pub async fn ensure_layout(client: &zkc::Client) -> Result<(), ClusterError> {
    let dir = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    for path in [
        paths::BROKER_IDS,
        paths::TOPICS,
        paths::CREATE_TOPIC_REQUESTS,
        paths::DELETE_TOPIC_REQUESTS,
        paths::SHUTTING_DOWN,
        "/shardlog/cluster",
    ] {
        match client.mkdir(path, &dir).await {
            Ok(()) | Err(zkc::Error::NodeExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let id = format!("{:016x}{:08x}", crate::now_ms(), std::process::id());
    for (path, data) in [(paths::CLUSTER_ID, id.as_str()), (paths::CONTROLLER_EPOCH, "0")] {
        match client.create(path, data.as_bytes(), &dir).await {
            Ok(_) | Err(zkc::Error::NodeExists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Registers this broker; `Err(DuplicateBrokerId)` when another session holds the id.
pub async fn register(client: &zkc::Client, me: &BrokerRegistration) -> Result<(), ClusterError> {
    let path = paths::broker(me.id);
    let data = serde_json::to_vec(me).map_err(|e| ClusterError::Thread(e.to_string()))?;
    let ephemeral = zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all());
    match client.create(&path, &data, &ephemeral).await {
        Ok(_) => Ok(()),
        Err(zkc::Error::NodeExists) => {
            let (held, stat) = client.get_data(&path).await?;
            if stat.ephemeral_owner == client.session_id().0 {
                return Ok(());
            }
            let holder = serde_json::from_slice::<BrokerRegistration>(&held)
                .map(|b| format!("{}:{}", b.host, b.port))
                .unwrap_or_else(|_| format!("session {:#x}", stat.ephemeral_owner));
            Err(ClusterError::DuplicateBrokerId { id: me.id, holder })
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the live brokers (watching the list) and the cluster id.
async fn read_brokers(
    client: &zkc::Client,
    view: &mut ClusterView,
) -> Result<zkc::OneshotWatcher, zkc::Error> {
    let (ids, watcher) = client.list_and_watch_children(paths::BROKER_IDS).await?;
    view.brokers.clear();
    for id in ids {
        let Ok(n) = id.parse::<i32>() else { continue };
        match client.get_data(&paths::broker(n)).await {
            Ok((data, _)) => match serde_json::from_slice::<BrokerRegistration>(&data) {
                Ok(b) => {
                    view.brokers.insert(n, b);
                }
                Err(e) => tracing::warn!(broker = n, error = %e, "unreadable broker registration"),
            },
            Err(zkc::Error::NoNode) => {}
            Err(e) => return Err(e),
        }
    }
    if view.cluster_id.is_none() {
        let (id, _) = client.get_data(paths::CLUSTER_ID).await?;
        view.cluster_id = Some(String::from_utf8_lossy(&id).into_owned());
    }
    Ok(watcher)
}

/// The ZooKeeper backend: the control thread and the view it publishes.
pub struct ZkMembership {
    id: i32,
    view: Arc<Mutex<ClusterView>>,
    link: ClusterLink,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ZkMembership {
    /// Starts the control thread and returns once this broker is registered
    /// and has read the cluster once (brokers, controller, elected if none,
    /// and every topic). Waits (logging every attempt) while no ensemble
    /// member answers; fails at once when the id is registered by another
    /// broker.
    pub fn start(config: &ClusterConfig, me: BrokerRegistration) -> Result<ZkMembership, ClusterError> {
        split_connect(&config.zookeeper)?;
        let view = Arc::new(Mutex::new(ClusterView::default()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (md_tx, md_rx) = watch::channel(Arc::new(ClusterMetadata::default()));
        let (control_tx, control_rx) = tokio::sync::mpsc::unbounded_channel();
        let link = ClusterLink { broker_id: me.id, metadata: md_rx, control: control_tx };
        let (config, id) = (config.clone(), me.id);
        let control = Control { view: view.clone(), metadata: md_tx, requests: control_rx };
        let thread = std::thread::Builder::new()
            .name("zk-control".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _gone = ready_tx.send(Err(ClusterError::Thread(e.to_string())));
                        return;
                    }
                };
                rt.block_on(session_loop(config, me, control, ready_tx, stop_rx));
            })
            .map_err(|e| ClusterError::Thread(e.to_string()))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(ZkMembership { id, view, link, stop: Some(stop_tx), thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(ClusterError::Stopped)
            }
        }
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _gone = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ZkMembership {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Membership for ZkMembership {
    fn broker_id(&self) -> i32 {
        self.id
    }
    fn view(&self) -> ClusterView {
        self.view.lock().map(|v| v.clone()).unwrap_or_default()
    }
    fn link(&self) -> Option<ClusterLink> {
        Some(self.link.clone())
    }
    fn controlled_shutdown(&self, timeout: Duration) -> Result<(), String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = ControlRequest::ControlledShutdown { broker: self.id, timeout, reply };
        self.link.control.send(request).map_err(|_| "the control thread stopped".to_string())?;
        // Waited for on a thread of its own: the caller may be inside a
        // tokio runtime, where `blocking_recv` must not run.
        std::thread::scope(|s| s.spawn(|| answer.blocking_recv()).join())
            .map_err(|_| "the controlled-shutdown wait panicked".to_string())?
            .map_err(|_| "the control thread stopped".to_string())?
    }
    fn shutdown(mut self: Box<Self>) {
        self.stop();
    }
}

type Ready = mpsc::Sender<Result<(), ClusterError>>;

/// What the control thread publishes and serves, across sessions.
struct Control {
    view: Arc<Mutex<ClusterView>>,
    metadata: watch::Sender<Arc<ClusterMetadata>>,
    requests: tokio::sync::mpsc::UnboundedReceiver<ControlRequest>,
}

/// How a session ended.
enum SessionEnd {
    Stop,
    /// Expired or closed: start a new one.
    Renew,
}

async fn session_loop(
    config: ClusterConfig,
    me: BrokerRegistration,
    mut control: Control,
    ready: Ready,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut ready = Some(ready);
    loop {
        let client = tokio::select! {
            _ = &mut stop => return,
            c = connect_retrying(&config) => c,
        };
        let setup = async {
            ensure_layout(&client).await?;
            register(&client, &me).await
        };
        match setup.await {
            Ok(()) => {
                tracing::info!(broker = me.id, session = %client.session_id(), "registered in ZooKeeper");
            }
            Err(e @ ClusterError::DuplicateBrokerId { .. }) if ready.is_some() => {
                if let Some(r) = ready.take() {
                    let _gone = r.send(Err(e));
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot register in ZooKeeper; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        match serve_session(&client, &me, config.election, &mut control, &mut stop, &mut ready).await {
            SessionEnd::Stop => return close_session(client).await,
            SessionEnd::Renew => {
                if let Ok(mut v) = control.view.lock() {
                    v.controller = None;
                }
                tracing::warn!(
                    broker = me.id,
                    "ZooKeeper session ended; starting a new one (re-registering)"
                );
            }
        }
    }
}

/// Closes the session, so that the ephemerals (registration, controller)
/// go at once rather than at the session timeout. The crate sends
/// CloseSession when the last handle drops, from a task of this runtime:
/// wait (briefly) for it to report the session closed before the runtime
/// goes.
async fn close_session(client: zkc::Client) {
    let mut states = client.state_watcher();
    drop(client);
    let closed = async { while !matches!(states.changed().await, zkc::SessionState::Closed) {} };
    if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
        tracing::warn!("ZooKeeper session not closed within {CLOSE_WAIT:?}; it ends at its timeout");
    }
}

/// How long a stopping broker waits for its session to close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Connects, retrying every second while no ensemble member answers.
async fn connect_retrying(config: &ClusterConfig) -> zkc::Client {
    let mut attempts = 0u64;
    loop {
        match connect(&config.zookeeper, config.session_timeout).await {
            Ok(c) => return c,
            Err(e) => {
                attempts += 1;
                tracing::warn!(zookeeper = %config.zookeeper, attempts, error = %e, "cannot reach ZooKeeper; retrying in 1 s");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Whether a session state ends the session.
fn terminal(state: zkc::SessionState) -> bool {
    !matches!(
        state,
        zkc::SessionState::Disconnected
            | zkc::SessionState::SyncConnected
            | zkc::SessionState::ConnectedReadOnly
    )
}

/// Waits for the next node event of a persistent watch, then gathers the
/// ones that follow within a moment (a topic creation is one multi-op but
/// many events), so one round answers them all. `Err` on a terminal session
/// state (the watcher must not be polled after one).
async fn next_events(watcher: &mut zkc::PersistentWatcher) -> Result<(), zkc::SessionState> {
    let mut event = watcher.changed().await;
    loop {
        if event.event_type == zkc::EventType::Session && terminal(event.session_state) {
            return Err(event.session_state);
        }
        match tokio::time::timeout(EVENT_GATHER, watcher.changed()).await {
            Ok(next) => event = next,
            Err(_) => return Ok(()),
        }
    }
}

/// How long events are gathered into one round.
const EVENT_GATHER: Duration = Duration::from_millis(5);

async fn serve_session(
    client: &zkc::Client,
    me: &BrokerRegistration,
    election: controller::ElectionPolicy,
    control: &mut Control,
    stop: &mut tokio::sync::oneshot::Receiver<()>,
    ready: &mut Option<Ready>,
) -> SessionEnd {
    let mut states = client.state_watcher();
    let mut epoch: Option<ControllerEpoch> = None;
    // (Re)installed before a round reads, so no change after it is missed.
    let mut persistent: Option<(zkc::PersistentWatcher, zkc::PersistentWatcher)> = None;
    loop {
        let (topics_watch, admin_watch) = match persistent.take() {
            Some(w) => w,
            None => match install_watches(client).await {
                Ok(w) => w,
                Err(zkc::Error::SessionExpired | zkc::Error::ClientClosed) => return SessionEnd::Renew,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch ZooKeeper; retrying");
                    tokio::select! {
                        _ = &mut *stop => return SessionEnd::Stop,
                        () = tokio::time::sleep(RETRY) => continue,
                    }
                }
            },
        };
        let (mut topics_watch, mut admin_watch) = (topics_watch, admin_watch);
        let mut view = ClusterView::default();
        let round = async {
            let brokers = read_brokers(client, &mut view).await?;
            let shutting_down = read_shutting_down(client).await?;
            let (exists, controller_watch) = client.check_and_watch_stat(paths::CONTROLLER).await?;
            if exists.is_none() {
                epoch = controller::elect(client, me.id).await?;
                if let Some(e) = epoch {
                    tracing::info!(broker = me.id, epoch = e.epoch, "elected controller");
                }
            }
            view.controller = controller::read_controller(client).await?;
            if view.controller.map(|c| c.broker_id) != Some(me.id)
                || view.controller.map(|c| c.epoch) != epoch.map(|e| e.epoch)
            {
                epoch = None;
            }
            if let Some(e) = &epoch {
                if let Err(err) = controller_round(client, e, &view, &shutting_down, election).await {
                    if matches!(err, controller::ControllerError::Fenced { .. }) {
                        tracing::warn!(broker = me.id, epoch = e.epoch, "fenced: a newer controller exists");
                        epoch = None;
                    } else {
                        tracing::warn!(error = %err, "controller round failed");
                    }
                }
            }
            let topics = metadata::read_topics(client).await?;
            Ok::<_, controller::ControllerError>((brokers, controller_watch, topics, shutting_down))
        };
        let watches = match round.await {
            Ok((brokers, controller_watch, topics, shutting_down)) => {
                let md = ClusterMetadata {
                    cluster_id: view.cluster_id.clone(),
                    brokers: view.brokers.clone(),
                    controller: view.controller,
                    topics,
                    shutting_down,
                };
                control.metadata.send_if_modified(|current| {
                    let changed = **current != md;
                    if changed {
                        *current = Arc::new(md);
                    }
                    changed
                });
                Some((brokers, controller_watch))
            }
            Err(controller::ControllerError::ZooKeeper(
                zkc::Error::SessionExpired | zkc::Error::ClientClosed,
            )) => return SessionEnd::Renew,
            Err(e) => {
                tracing::warn!(error = %e, "reading cluster state from ZooKeeper failed; retrying");
                None
            }
        };
        if let Ok(mut v) = control.view.lock() {
            *v = view;
        }
        // Start-up returns once the first view is published.
        if watches.is_some() {
            if let Some(r) = ready.take() {
                let _gone = r.send(Ok(()));
            }
        }
        let Some((brokers, controller_watch)) = watches else {
            persistent = Some((topics_watch, admin_watch));
            tokio::select! {
                _ = &mut *stop => return SessionEnd::Stop,
                () = tokio::time::sleep(RETRY) => continue,
            }
        };
        let mut rewatch = false;
        tokio::select! {
            _ = &mut *stop => return SessionEnd::Stop,
            _ = brokers.changed() => {}
            _ = controller_watch.changed() => {}
            r = next_events(&mut topics_watch) => if let Err(state) = r {
                tracing::warn!(broker = me.id, ?state, "ZooKeeper session lost");
                return SessionEnd::Renew;
            },
            r = next_events(&mut admin_watch) => if let Err(state) = r {
                tracing::warn!(broker = me.id, ?state, "ZooKeeper session lost");
                return SessionEnd::Renew;
            },
            Some(request) = control.requests.recv() => {
                // Served on a task of its own: waiting for the controller
                // must not hold up this loop (it may be the controller).
                tokio::spawn(request.serve(client.clone(), control.metadata.subscribe()));
            }
            change = session_change(&mut states) => match change {
                // Watch events can be lost while the connection moves to
                // another ensemble member (ZOOKEEPER-4698): read everything
                // again now that it is back.
                // The persistent watches are installed anew too.
                SessionChange::Reconnected => rewatch = true,
                SessionChange::Ended(state) => {
                    tracing::warn!(broker = me.id, ?state, "ZooKeeper session lost");
                    return SessionEnd::Renew;
                }
            },
            // A safety net under the watches: a full read now and then.
            () = tokio::time::sleep(RESYNC) => {}
        }
        if !rewatch {
            persistent = Some((topics_watch, admin_watch));
        }
    }
}

/// The persistent recursive watches on `/shardlog/topics` and `/shardlog/admin`.
async fn install_watches(
    client: &zkc::Client,
) -> Result<(zkc::PersistentWatcher, zkc::PersistentWatcher), zkc::Error> {
    let topics = client.watch(paths::TOPICS, zkc::AddWatchMode::PersistentRecursive).await?;
    let admin = client.watch(paths::ADMIN, zkc::AddWatchMode::PersistentRecursive).await?;
    Ok((topics, admin))
}

/// How often the control thread reads the whole cluster state without a
/// watch event.
const RESYNC: Duration = Duration::from_secs(30);

enum SessionChange {
    Reconnected,
    Ended(zkc::SessionState),
}

/// The brokers in controlled shutdown.
async fn read_shutting_down(client: &zkc::Client) -> Result<BTreeSet<i32>, controller::ControllerError> {
    match client.list_children(paths::SHUTTING_DOWN).await {
        Ok(ids) => Ok(ids.iter().filter_map(|id| id.parse().ok()).collect()),
        Err(zkc::Error::NoNode) => Ok(BTreeSet::new()),
        Err(e) => Err(e.into()),
    }
}

/// What the controller does each round: serve creation and deletion
/// requests, then move partition states to what the live brokers give
/// (a broker in controlled shutdown counts as gone: it neither leads nor
/// stays in an ISR, nor gets new replicas), then serve a preferred-leader
/// election asked for, then take a reassignment one step on.
async fn controller_round(
    client: &zkc::Client,
    epoch: &ControllerEpoch,
    view: &ClusterView,
    shutting_down: &BTreeSet<i32>,
    election: controller::ElectionPolicy,
) -> Result<(), controller::ControllerError> {
    let candidates: Vec<Candidate> = view
        .brokers
        .values()
        .filter(|b| !shutting_down.contains(&b.id))
        .map(|b| Candidate { id: b.id, rack: b.rack.clone() })
        .collect();
    controller::serve_topic_requests(client, epoch, &candidates).await?;
    controller::serve_delete_requests(client, epoch).await?;
    let live: BTreeSet<i32> = view.brokers.keys().copied().filter(|b| !shutting_down.contains(b)).collect();
    controller::reconcile(client, epoch, &live, election).await?;
    controller::serve_preferred_election(client, epoch, &live, election).await?;
    super::reassign::serve(client, epoch, &live).await?;
    Ok(())
}

/// Waits for the connection to come back after a loss (logging the loss),
/// or for the session to end.
async fn session_change(states: &mut zkc::StateWatcher) -> SessionChange {
    loop {
        let state = states.changed().await;
        match state {
            zkc::SessionState::Disconnected => {
                tracing::warn!("ZooKeeper connection lost; reconnecting within the session")
            }
            zkc::SessionState::SyncConnected | zkc::SessionState::ConnectedReadOnly => {
                tracing::info!(?state, "ZooKeeper connection back");
                return SessionChange::Reconnected;
            }
            ended => return SessionChange::Ended(ended),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_connect;

    #[test]
    fn connect_strings() {
        assert_eq!(split_connect("a:1").unwrap(), ("a:1".into(), None));
        assert_eq!(split_connect("a:1,b:2/kafka/x").unwrap(), ("a:1,b:2".into(), Some("/kafka/x".into())));
        assert_eq!(split_connect("a:1/").unwrap(), ("a:1".into(), None));
        for bad in ["", "a", "a:x", ":1", "a:1,", "/x", "a:1//x"] {
            assert!(split_connect(bad).is_err(), "{bad}");
        }
    }
}
