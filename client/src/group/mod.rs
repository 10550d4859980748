//! Consumer groups, client side: the group member the consumer runs when
//! it subscribes (`Consumer::subscribe`), the assignors, and the wire calls.
//!
//! ```text
//!   subscribe ─> [needs join] ── poll ──> JoinGroup ──> (leader: assign) ──> SyncGroup
//!                    ^                                                          │
//!                    │ heartbeat task: RebalanceInProgress,                     v
//!                    │ UnknownMemberId, IllegalGeneration            assigned: fetch from
//!                    └──────────────────────────────────────────── committed offsets
//! ```
//!
//! The membership runs inside `poll` (the application's task, as Kafka's
//! consumer does): joins, syncs, revocation (commit, then the listener's
//! `on_revoked`), assignment (`on_assigned`, positions from committed
//! offsets or `offset_reset`) and auto-commit. A tokio task sends
//! heartbeats every `heartbeat_interval` and flags a rejoin; so a member
//! that processes slowly between polls keeps its session. Protocols are
//! eager (range, roundrobin): every rebalance revokes the whole assignment
//! first. Cooperative-sticky is not built yet.

pub mod assignor;
pub mod wire;

use std::time::Duration;

/// Group membership settings of a consumer (`ConsumerConfig::group`).
#[derive(Debug, Clone)]
pub struct GroupSettings {
    pub group_id: String,
    /// Static membership: a stable id kept across restarts; a restart
    /// within the session timeout gets the old assignment back without a
    /// rebalance. A static member does not leave the group on close.
    pub instance_id: Option<String>,
    /// The coordinator expels a member silent for this long (Kafka's
    /// `session.timeout.ms`; the broker bounds it).
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    /// How long a rebalance waits for members to rejoin.
    pub rebalance_timeout: Duration,
    /// Assignor names in preference order (`range`, `roundrobin`).
    pub assignors: Vec<String>,
    /// Commit consumed positions this often; `None`: only explicit commits.
    pub auto_commit_interval: Option<Duration>,
    /// Commit consumed positions before partitions are revoked.
    pub commit_on_revoke: bool,
}

pub const SESSION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(3);
pub const REBALANCE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
pub const AUTO_COMMIT_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

impl GroupSettings {
    /// Kafka-like defaults for `group_id`.
    #[must_use]
    pub fn new(group_id: impl Into<String>) -> GroupSettings {
        GroupSettings {
            group_id: group_id.into(),
            instance_id: None,
            session_timeout: SESSION_TIMEOUT_DEFAULT,
            heartbeat_interval: HEARTBEAT_INTERVAL_DEFAULT,
            rebalance_timeout: REBALANCE_TIMEOUT_DEFAULT,
            assignors: vec!["range".into(), "roundrobin".into()],
            auto_commit_interval: Some(AUTO_COMMIT_INTERVAL_DEFAULT),
            commit_on_revoke: true,
        }
    }
}

/// Told when the group hands partitions to this member or takes them away.
/// Called from `Consumer::poll`, on the application's task.
pub trait RebalanceListener: Send + Sync {
    /// Partitions taken away in a rebalance; positions were committed just
    /// before (when `commit_on_revoke`).
    fn on_revoked(&mut self, _partitions: &[(String, u32)]) {}
    /// Partitions given to this member; fetching starts at their committed
    /// offsets.
    fn on_assigned(&mut self, _partitions: &[(String, u32)]) {}
    /// Partitions lost without a chance to commit (the member was expelled).
    fn on_lost(&mut self, _partitions: &[(String, u32)]) {}
}
