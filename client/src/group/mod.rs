//! Consumer groups, client side: the group member the consumer runs when
//! it subscribes (`Consumer::subscribe`), the assignors, and the wire calls.
//!
//! ```text
//!   subscribe ─> [needs join] ── poll ──> join task: JoinGroup ──> (leader: assign) ──> SyncGroup
//!                    ^                                                                      │
//!                    │ heartbeat task: RebalanceInProgress,                                 v
//!                    │ UnknownMemberId, IllegalGeneration;                 poll applies the generation:
//!                    │ a cooperative member that revoked something         revoke what is gone, start
//!                    └──────────────────────────────────────────────────── what is new at committed offsets
//! ```
//!
//! The membership runs inside `poll` (the application's task, as Kafka's
//! consumer does): it starts a rebalance, applies its outcome (revocation:
//! commit, then the listener's `on_revoked`; assignment: `on_assigned`,
//! positions from committed offsets or `offset_reset`) and auto-commits.
//! The JoinGroup/SyncGroup exchange itself runs on a task, so `poll` keeps
//! fetching whatever the member holds until the new generation arrives. A
//! tokio task sends heartbeats every `heartbeat_interval` and flags a
//! rejoin; so a member that processes slowly between polls keeps its
//! session. It starts when the SyncGroup answers, on the join's task, not
//! when `poll` applies the new generation: a member that polls late after
//! its join is not expelled meanwhile.
//!
//! How a rebalance starts depends on the protocol of the generation the
//! member is leaving:
//!
//! | previous protocol       | before joining     | owned in JoinGroup | after SyncGroup                |
//! |-------------------------|--------------------|--------------------|--------------------------------|
//! | none, range, roundrobin | revoke everything  | nothing            | start all it was given         |
//! | cooperative-sticky      | keep fetching      | what it holds      | revoke what it lost, start     |
//! |                         |                    |                    | what is new; rejoin at once    |
//! |                         |                    |                    | if it revoked anything         |
//! | any, but expelled       | `on_lost`, drop it | nothing            | start all it was given         |
//!
//! The coordinator picks the protocol (Kafka's vote among the assignors
//! every member lists). Whichever it picks, the leader never hands a
//! partition to a member while another one lists it as owned
//! (`assignor::hold_back_transfers`), so a group that turns from
//! cooperative to eager (a member that knows only `range` joins) does not
//! give one partition to two members either.

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
    /// Assignor names in preference order (`range`, `roundrobin`,
    /// `cooperative-sticky`). The coordinator picks one that every member
    /// lists; `cooperative-sticky` rebalances incrementally.
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
    /// Kafka-like defaults for `group_id`. The assignors stay eager
    /// (`range`, `roundrobin`): cooperative-sticky is opt-in until it has
    /// been through the fault tests the eager path has (broker kills,
    /// coordinator moves, static members restarting).
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
    /// Partitions taken away in a rebalance (eager protocols: all of them,
    /// before rejoining; cooperative: only those the member lost, after the
    /// new generation); positions were committed just before (when
    /// `commit_on_revoke`). Not called with nothing.
    fn on_revoked(&mut self, _partitions: &[(String, u32)]) {}
    /// Partitions newly given to this member (cooperative: not those it
    /// kept), once per generation, possibly none; fetching starts at their
    /// committed offsets.
    fn on_assigned(&mut self, _partitions: &[(String, u32)]) {}
    /// Partitions lost without a chance to commit (the member was expelled).
    fn on_lost(&mut self, _partitions: &[(String, u32)]) {}
}
