//! One group's state machine: Kafka's classic group protocol.
//!
//! ```text
//!            join (first member)            all rejoined / deadline
//!   Empty ─────────────────────> Preparing ────────────────────────> Completing
//!     ^                          Rebalance <──────┐                  Rebalance
//!     │ last member leaves /        ^  join, leave, expiry,          │ leader's SyncGroup
//!     │ expires (rebalance ends     │  new metadata                  │ (persisted first)
//!     │ with no members)            │                                v
//!     └─────────────────────────────┴─────────────────────────────  Stable
//! ```
//!
//! Everything here is synchronous and runs on the coordinating shard's
//! thread: requests mutate the group and answer the members waiting in
//! JoinGroup or SyncGroup through their one-shot channels. Only persistence
//! (the group's record in `__consumer_offsets`) awaits, in `group/mod.rs`,
//! between `sync` returning [`SyncStep::Persist`] and `assignment_persisted`.
//!
//! **Invariants**: the generation only grows; a member id names one member
//! of one generation line (a rejoining static member gets a new id and the
//! old one is fenced); a member that is not waiting in a join and has not
//! heartbeated for its session timeout is removed by `expire`; a rebalance
//! ends by its deadline (the longest rebalance timeout of the members, or
//! the initial delay for a group that was empty), dropping members that did
//! not rejoin.

use super::api::*;
use super::records::{GroupValue, MemberValue};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use shardlog_schema::ErrorCode;
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod join;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    /// Deleted; the coordinator drops it.
    Dead,
}

impl GroupState {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A one-shot answer to a member waiting in JoinGroup or SyncGroup.
pub type Waiter<T> = LocalSender<GroupResult<T>>;

/// A channel for one answer.
#[must_use]
pub fn waiter<T>() -> (Waiter<T>, LocalReceiver<GroupResult<T>>) {
    local_channel::new_bounded(1)
}

fn answer<T>(w: Option<Waiter<T>>, result: GroupResult<T>) {
    if let Some(w) = w {
        // The member may have gone away (connection closed): nothing to do.
        let _gone = w.try_send(result);
    }
}

pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<Protocol>,
    pub assignment: Vec<u8>,
    /// Last heartbeat (or join/sync): the session runs from here.
    pub last_seen: Instant,
    /// Waiting in JoinGroup: it has joined the rebalance in progress.
    join: Option<Waiter<Joined>>,
    sync: Option<Waiter<Synced>>,
    /// Order of arrival, for choosing a leader.
    seq: u64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Vec<u8> {
        self.protocols.iter().find(|p| p.name == protocol).map(|p| p.metadata.clone()).unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol)
    }
}

/// A committed offset held in memory (the log has the durable copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_time_ms: i64,
    /// Where its record is in the offsets partition: a later record wins,
    /// whatever order appends complete in.
    pub record_offset: u64,
}

/// What the coordinator must do after a SyncGroup.
pub enum SyncStep {
    /// Wait for the leader (the member's answer comes through its channel).
    Wait(LocalReceiver<GroupResult<Synced>>),
    /// Answered now.
    Done(GroupResult<Synced>),
    /// The leader assigned: persist this, then `assignment_persisted`
    /// (the leader's answer comes through the returned channel).
    Persist(GroupValue, LocalReceiver<GroupResult<Synced>>),
}

pub enum JoinStep {
    Wait(LocalReceiver<GroupResult<Joined>>),
    /// A static member came back: answered at once, and the group's record
    /// (its new member id) must be persisted.
    Rejoined(Joined, GroupValue),
    Done(GroupResult<Joined>),
}

pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: HashMap<String, Member>,
    /// Static members: instance id → member id.
    statics: HashMap<String, String>,
    rebalance_deadline: Option<Instant>,
    /// A rebalance of an empty group waits the initial delay, not for "all".
    initial_rebalance: bool,
    pub offsets: HashMap<(String, u32), Committed>,
    next_seq: u64,
    next_member: u64,
}

fn err<T>(code: ErrorCode, message: impl Into<String>) -> GroupResult<T> {
    Err(GroupError::new(code, message))
}

/// Knobs `Group` needs from `GroupConfig`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub initial_rebalance_delay: Duration,
    pub members_max: usize,
}

impl Group {
    #[must_use]
    pub fn new(id: String) -> Group {
        Group {
            id,
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: HashMap::new(),
            statics: HashMap::new(),
            rebalance_deadline: None,
            initial_rebalance: false,
            offsets: HashMap::new(),
            next_seq: 0,
            next_member: 0,
        }
    }

    /// Restores a group from its record (at load). Members come back with a
    /// fresh session: they keep their generation if they heartbeat in time.
    pub fn restore(&mut self, v: GroupValue, now: Instant) {
        self.generation = v.generation;
        self.protocol_type = Some(v.protocol_type).filter(|t| !t.is_empty());
        self.protocol = v.protocol;
        self.leader = v.leader;
        self.members.clear();
        self.statics.clear();
        for m in v.members {
            if let Some(i) = &m.instance_id {
                self.statics.insert(i.clone(), m.member_id.clone());
            }
            let protocol = self.protocol.clone().unwrap_or_default();
            let seq = self.next_seq;
            self.next_seq += 1;
            self.members.insert(
                m.member_id.clone(),
                Member {
                    id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout: Duration::from_millis(u64::from(m.session_timeout_ms)),
                    rebalance_timeout: Duration::from_millis(u64::from(m.rebalance_timeout_ms)),
                    protocols: vec![Protocol { name: protocol, metadata: m.metadata }],
                    assignment: m.assignment,
                    last_seen: now,
                    join: None,
                    sync: None,
                    seq,
                },
            );
        }
        self.state = if self.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
    }

    /// The group's record as it stands.
    #[must_use]
    pub fn record(&self, time_ms: i64) -> GroupValue {
        let protocol = self.protocol.clone().unwrap_or_default();
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.seq);
        GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            time_ms,
            members: members
                .into_iter()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: u32::try_from(m.session_timeout.as_millis()).unwrap_or(u32::MAX),
                    rebalance_timeout_ms: u32::try_from(m.rebalance_timeout.as_millis()).unwrap_or(u32::MAX),
                    metadata: m.metadata_for(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    fn remove_member(&mut self, id: &str) {
        if let Some(m) = self.members.remove(id) {
            if let Some(i) = &m.instance_id {
                if self.statics.get(i).is_some_and(|cur| cur == id) {
                    self.statics.remove(i);
                }
            }
            answer(m.join, err(ErrorCode::UnknownMemberId, "the member was removed from the group"));
            answer(m.sync, err(ErrorCode::UnknownMemberId, "the member was removed from the group"));
        }
    }

    pub fn sync(&mut self, req: SyncGroup, now: Instant) -> SyncStep {
        if let Err(e) = self.check_member(&req.member_id, req.instance_id.as_deref()) {
            return SyncStep::Done(Err(e));
        }
        if let Err(e) = self.check_generation(req.generation) {
            return SyncStep::Done(Err(e));
        }
        match self.state {
            GroupState::PreparingRebalance => {
                SyncStep::Done(err(ErrorCode::RebalanceInProgress, "the group is rebalancing: rejoin"))
            }
            GroupState::Stable => {
                let m = &self.members[&req.member_id];
                SyncStep::Done(Ok(self.synced(m.assignment.clone())))
            }
            GroupState::CompletingRebalance => {
                let leader = self.leader.as_deref() == Some(req.member_id.as_str());
                let (tx, rx) = waiter();
                if let Some(m) = self.members.get_mut(&req.member_id) {
                    m.last_seen = now;
                    answer(
                        m.sync.replace(tx),
                        err(ErrorCode::RebalanceInProgress, "the member synced again"),
                    );
                }
                if !leader {
                    return SyncStep::Wait(rx);
                }
                for m in self.members.values_mut() {
                    m.assignment.clear();
                }
                for (id, a) in req.assignments {
                    if let Some(m) = self.members.get_mut(&id) {
                        m.assignment = a;
                    }
                }
                SyncStep::Persist(self.record(now_ms()), rx)
            }
            GroupState::Empty | GroupState::Dead => {
                SyncStep::Done(err(ErrorCode::UnknownMemberId, "the group has no members"))
            }
        }
    }

    fn synced(&self, assignment: Vec<u8>) -> Synced {
        Synced {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol: self.protocol.clone().unwrap_or_default(),
            assignment,
        }
    }

    /// The leader's assignment of `generation` is durable (or failed to be):
    /// answer every member waiting in SyncGroup.
    pub fn assignment_persisted(
        &mut self,
        generation: i32,
        result: GroupResult<()>,
        now: Instant,
        limits: Limits,
    ) {
        if self.generation != generation || self.state != GroupState::CompletingRebalance {
            return; // a newer rebalance took over; its waiters were answered
        }
        match result {
            Ok(()) => {
                self.state = GroupState::Stable;
                let (pt, p) = (
                    self.protocol_type.clone().unwrap_or_default(),
                    self.protocol.clone().unwrap_or_default(),
                );
                for m in self.members.values_mut() {
                    let synced = Synced {
                        protocol_type: pt.clone(),
                        protocol: p.clone(),
                        assignment: m.assignment.clone(),
                    };
                    answer(m.sync.take(), Ok(synced));
                }
            }
            Err(e) => {
                for m in self.members.values_mut() {
                    m.assignment.clear();
                    answer(m.sync.take(), Err(e.clone()));
                }
                self.prepare_rebalance(now, limits);
            }
        }
    }

    pub fn heartbeat(&mut self, req: &Heartbeat, now: Instant) -> GroupResult<()> {
        if self.state == GroupState::Empty || self.state == GroupState::Dead {
            return err(ErrorCode::UnknownMemberId, format!("group `{}` has no members", self.id));
        }
        self.check_member(&req.member_id, req.instance_id.as_deref())?;
        self.check_generation(req.generation)?;
        if let Some(m) = self.members.get_mut(&req.member_id) {
            m.last_seen = now;
        }
        match self.state {
            GroupState::PreparingRebalance => {
                err(ErrorCode::RebalanceInProgress, "the group is rebalancing: rejoin")
            }
            _ => Ok(()),
        }
    }

    pub fn leave(&mut self, who: &LeaveMember, now: Instant, limits: Limits) -> GroupResult<()> {
        let id = match (&who.member_id, &who.instance_id) {
            (id, Some(i)) => match self.statics.get(i) {
                Some(current) if id.is_empty() || current == id => current.clone(),
                Some(current) => {
                    return err(
                        ErrorCode::FencedInstanceId,
                        format!("instance id `{i}` belongs to `{current}`"),
                    )
                }
                None => return err(ErrorCode::UnknownMemberId, format!("no member with instance id `{i}`")),
            },
            (id, None) => id.clone(),
        };
        if !self.members.contains_key(&id) {
            return err(ErrorCode::UnknownMemberId, format!("`{id}` is not a member of group `{}`", self.id));
        }
        tracing::info!(group = %self.id, member = %id, "member left");
        self.remove_member(&id);
        self.members_changed(now, limits);
        Ok(())
    }

    /// After a member went away: rebalance the rest, or finish the one in
    /// progress if the others are all waiting.
    fn members_changed(&mut self, now: Instant, limits: Limits) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(now, limits),
            _ => {}
        }
        self.try_complete_join(now);
    }

    /// Removes members whose session expired and ends a rebalance at its
    /// deadline. Returns whether the group became empty (its record changes).
    pub fn expire(&mut self, now: Instant, limits: Limits) -> bool {
        let was_empty = self.state == GroupState::Empty;
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join.is_none() && now.saturating_duration_since(m.last_seen) > m.session_timeout)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            tracing::info!(group = %self.id, member = %id, "session expired: member removed");
            self.remove_member(id);
        }
        if !expired.is_empty() {
            self.members_changed(now, limits);
        }
        self.try_complete_join(now);
        !was_empty && self.state == GroupState::Empty
    }

    /// Checks a commit's member and generation (see `OffsetCommit`).
    pub fn check_commit(&self, req: &OffsetCommit) -> GroupResult<()> {
        if req.generation < 0 && req.member_id.is_empty() {
            if self.members.is_empty() {
                return Ok(());
            }
            return err(
                ErrorCode::UnknownMemberId,
                format!(
                    "group `{}` has {} active members: offsets can be committed from outside the group only while it is empty",
                    self.id,
                    self.members.len()
                ),
            );
        }
        self.check_member(&req.member_id, req.instance_id.as_deref())?;
        self.check_generation(req.generation)?;
        if self.state == GroupState::PreparingRebalance {
            // Kafka accepts commits of the previous assignment until the
            // member rejoins; we do too (the generation still matches).
            return Ok(());
        }
        if self.state == GroupState::CompletingRebalance {
            return err(ErrorCode::RebalanceInProgress, "the group is completing a rebalance: sync first");
        }
        Ok(())
    }

    pub fn describe(&self) -> DescribedGroup {
        let mut ms: Vec<&Member> = self.members.values().collect();
        ms.sort_by_key(|m| m.seq);
        let protocol = self.protocol.clone().unwrap_or_default();
        DescribedGroup {
            group_id: self.id.clone(),
            state: self.state.name(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol: protocol.clone(),
            generation: self.generation,
            leader: self.leader.clone().unwrap_or_default(),
            members: ms
                .into_iter()
                .map(|m| DescribedMember {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.metadata_for(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// Answers every member waiting in JoinGroup or SyncGroup (shutdown).
    pub fn abort_waiters(&mut self, e: &GroupError) {
        for m in self.members.values_mut() {
            answer(m.join.take(), Err(e.clone()));
            answer(m.sync.take(), Err(e.clone()));
        }
    }

    /// Whether nothing is left to keep: no members, no offsets.
    #[must_use]
    pub fn is_unused(&self) -> bool {
        self.members.is_empty() && self.offsets.is_empty() && self.state == GroupState::Empty
    }
}

/// Wall-clock milliseconds, for record timestamps.
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
