//! Replication of one partition (issue 12): the leader's view of its
//! followers (log ends, ISR, the high watermark) and the follower's role
//! (a fetcher task, `fetcher`).
//!
//! A partition's [`Replica`] is in one of three roles, set by the shard
//! that owns it from each cluster metadata snapshot (`apply_role`):
//! - **Alone** (no cluster): the high watermark is the log's own (written,
//!   or durable under `flush.policy=always`), as before replication;
//! - **Leader** of an epoch: appends come from producers; each follower's
//!   fetch offset is its log end; the high watermark is the smallest log
//!   end in the ISR (the leader's own being its log's high watermark), and
//!   never goes down while the leader leads;
//! - **Follower** of a leader and epoch: a fetcher task copies the leader's
//!   batches unchanged (`Log::append_replica`) after truncating its log to
//!   where its last epoch ends on the leader (`OffsetsForLeaderEpoch`); its
//!   high watermark is the leader's, bounded by its own log end.
//!
//! Invariants:
//! - consumers (fetches without a replica id, ListOffsets) never see past
//!   the high watermark; followers read up to the leader's log end;
//! - the ISR this leader applies is the one in ZooKeeper (the snapshot);
//!   a change it wants is a version-checked write of the partition state
//!   through the control thread (`AlterIsr`), applied when the next
//!   snapshot shows it. A leader whose write is rejected (the controller or
//!   another leader changed the state) waits for the snapshot that says why;
//! - `acks=all` is answered when the high watermark passes the batch, so
//!   every ISR member had it; `min.insync.replicas` is checked first;
//! - while an ISR change is asked for, the high watermark counts the larger
//!   of the two ISRs (Kafka's KIP-497): a follower being added may be
//!   elected as soon as the write is in ZooKeeper, before this leader sees
//!   the snapshot, so it must already hold everything acknowledged.

pub mod checkpoint;
pub mod fetcher;

use crate::cluster::metadata::PartitionInfo;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Kafka's `replica.lag.time.max.ms` default.
pub const REPLICA_LAG_TIME_MAX_DEFAULT: Duration = Duration::from_secs(10);

/// A follower as its leader sees it.
#[derive(Debug, Clone, Copy)]
pub struct FollowerProgress {
    /// Its log end (the last fetch offset); `None` before its first fetch
    /// in this epoch.
    pub log_end: Option<u64>,
    /// Last time it had everything the leader had (Kafka's
    /// `lastCaughtUpTimeMs`).
    pub caught_up_at: Instant,
    last_fetch_at: Instant,
    /// The leader's log end at its previous fetch.
    leader_end_at_last_fetch: u64,
}

/// The leader's side.
#[derive(Debug, Clone)]
pub struct LeaderState {
    pub epoch: i32,
    /// The ISR as ZooKeeper has it (leader included).
    pub isr: Vec<i32>,
    /// The partition state znode's version that ISR came with.
    pub state_version: i32,
    pub replicas: Vec<i32>,
    pub followers: BTreeMap<i32, FollowerProgress>,
    /// An ISR change was asked for and not yet answered.
    pub isr_pending: bool,
    /// The ISR asked for while `isr_pending`. The high watermark counts
    /// its members too (the larger ISR, Kafka's KIP-497): once the write
    /// is in ZooKeeper the controller may elect an added follower, so it
    /// must already hold everything acknowledged.
    pub isr_asked: Vec<i32>,
}

/// The follower's side.
#[derive(Debug)]
pub struct FollowerState {
    pub leader: i32,
    pub epoch: i32,
    /// Set to stop the fetcher task.
    pub stop: Rc<Cell<bool>>,
}

#[derive(Debug, Default)]
pub enum Role {
    #[default]
    Alone,
    Leader(LeaderState),
    Follower(FollowerState),
}

/// A partition's replication state (see the module docs).
#[derive(Debug, Default)]
pub struct Replica {
    pub role: RefCell<Role>,
    /// The high watermark of a leader or follower (not used alone).
    hw: Cell<u64>,
}

/// A leader's replica set and ISR sizes and its followers' lags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderStatus {
    pub replicas: usize,
    pub isr: usize,
    /// (follower, records behind the leader's log end).
    pub lags: Vec<(i32, u64)>,
}

/// What a leader wants done to its ISR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    pub isr: Vec<i32>,
    pub leader_epoch: i32,
    pub state_version: i32,
}

impl Replica {
    /// The high watermark given the log's own (`log_hw`, what this replica
    /// has written) — see the module docs.
    #[must_use]
    pub fn high_watermark(&self, log_hw: u64) -> u64 {
        match &*self.role.borrow() {
            Role::Alone => log_hw,
            Role::Leader(_) | Role::Follower(_) => self.hw.get().min(log_hw),
        }
    }

    /// Whether this replica leads (or is alone): producers and consumers go here.
    #[must_use]
    pub fn leads(&self) -> bool {
        matches!(&*self.role.borrow(), Role::Alone | Role::Leader(_))
    }

    /// The leader epoch this replica leads or follows (`None` alone).
    #[must_use]
    pub fn epoch(&self) -> Option<i32> {
        match &*self.role.borrow() {
            Role::Alone => None,
            Role::Leader(l) => Some(l.epoch),
            Role::Follower(f) => Some(f.epoch),
        }
    }

    /// In-sync replicas now (1 alone).
    #[must_use]
    pub fn isr_len(&self) -> usize {
        match &*self.role.borrow() {
            Role::Leader(l) => l.isr.len(),
            _ => 1,
        }
    }

    /// A follower's fetch at `offset` (its log end) reached the leader,
    /// whose log end is `leader_end` and high watermark `log_hw`. Returns
    /// whether the high watermark moved (the caller wakes waiters).
    pub fn on_follower_fetch(
        &self,
        replica: i32,
        offset: u64,
        leader_end: u64,
        log_hw: u64,
        now: Instant,
    ) -> bool {
        {
            let mut role = self.role.borrow_mut();
            let Role::Leader(l) = &mut *role else { return false };
            let Some(f) = l.followers.get_mut(&replica) else { return false };
            if offset >= leader_end {
                f.caught_up_at = now;
            } else if offset >= f.leader_end_at_last_fetch {
                f.caught_up_at = f.caught_up_at.max(f.last_fetch_at);
            }
            f.last_fetch_at = now;
            f.leader_end_at_last_fetch = leader_end;
            f.log_end = Some(offset);
        }
        self.advance_hw(log_hw)
    }

    /// Recomputes a leader's high watermark (it only grows); returns
    /// whether it moved.
    pub fn advance_hw(&self, log_hw: u64) -> bool {
        let role = self.role.borrow();
        let Role::Leader(l) = &*role else { return false };
        let mut hw = log_hw;
        let asked = l.isr_asked.iter().filter(|id| l.isr_pending && !l.isr.contains(id));
        for id in l.isr.iter().chain(asked) {
            if let Some(f) = l.followers.get(id) {
                hw = hw.min(f.log_end.unwrap_or(0));
            }
        }
        if hw > self.hw.get() {
            self.hw.set(hw);
            true
        } else {
            false
        }
    }

    /// The high watermark a checkpoint kept (start-up, before any role).
    pub fn restore_hw(&self, hw: u64) {
        self.hw.set(hw);
    }

    /// A follower's high watermark from its leader's fetch answer. Ignored
    /// unless this replica follows: a fetcher finishing its last append
    /// after the replica became leader must not move the leader's high
    /// watermark (which never goes down while it leads).
    pub fn set_follower_hw(&self, leader_hw: u64, log_end: u64) {
        if matches!(&*self.role.borrow(), Role::Follower(_)) {
            self.hw.set(leader_hw.min(log_end));
        }
    }

    /// A leader's wanted ISR change, if any and none is pending: followers
    /// not caught up within `lag_max` leave, those that reached the high
    /// watermark (and so everything acknowledged) come back.
    pub fn wanted_isr_change(&self, me: i32, now: Instant, lag_max: Duration) -> Option<IsrChange> {
        let mut role = self.role.borrow_mut();
        let Role::Leader(l) = &mut *role else { return None };
        if l.isr_pending {
            return None;
        }
        let hw = self.hw.get();
        let mut isr: Vec<i32> = Vec::with_capacity(l.replicas.len());
        for &r in &l.replicas {
            let keep = if r == me {
                true
            } else {
                match l.followers.get(&r) {
                    None => false,
                    Some(f) if l.isr.contains(&r) => now.saturating_duration_since(f.caught_up_at) <= lag_max,
                    Some(f) => {
                        f.log_end.is_some_and(|end| end >= hw)
                            && now.saturating_duration_since(f.caught_up_at) <= lag_max
                    }
                }
            };
            if keep {
                isr.push(r);
            }
        }
        let mut current = l.isr.clone();
        current.sort_unstable();
        let mut wanted = isr.clone();
        wanted.sort_unstable();
        if current == wanted {
            return None;
        }
        l.isr_pending = true;
        l.isr_asked.clone_from(&isr);
        Some(IsrChange { isr, leader_epoch: l.epoch, state_version: l.state_version })
    }

    /// The ISR change was answered (either way): another may be asked.
    pub fn isr_answered(&self) {
        if let Role::Leader(l) = &mut *self.role.borrow_mut() {
            l.isr_pending = false;
            l.isr_asked.clear();
        }
    }

    /// Becomes (or stays) leader as `info` says. Returns `true` when this
    /// is a new epoch (the caller records it in the log's history).
    pub fn lead(&self, me: i32, info: &PartitionInfo, state_version: i32, now: Instant) -> bool {
        let mut role = self.role.borrow_mut();
        if let Role::Leader(l) = &mut *role {
            if l.epoch == info.leader_epoch {
                if l.state_version != state_version {
                    l.isr_pending = false;
                    l.isr_asked.clear();
                }
                l.isr.clone_from(&info.isr);
                l.state_version = state_version;
                l.replicas.clone_from(&info.replicas);
                for &r in &info.replicas {
                    if r != me {
                        l.followers.entry(r).or_insert_with(|| new_progress(now));
                    }
                }
                l.followers.retain(|r, _| info.replicas.contains(r));
                return false;
            }
        }
        if let Role::Follower(f) = &*role {
            f.stop.set(true);
        }
        let followers = info.replicas.iter().filter(|&&r| r != me).map(|&r| (r, new_progress(now))).collect();
        *role = Role::Leader(LeaderState {
            epoch: info.leader_epoch,
            isr: info.isr.clone(),
            state_version,
            replicas: info.replicas.clone(),
            followers,
            isr_pending: false,
            isr_asked: Vec::new(),
        });
        true
    }

    /// Becomes a follower of `leader` in `epoch` unless it already is one;
    /// returns the new fetcher's stop flag when a fetcher must start.
    pub fn follow(&self, leader: i32, epoch: i32) -> Option<Rc<Cell<bool>>> {
        let mut role = self.role.borrow_mut();
        match &*role {
            Role::Follower(f) if f.leader == leader && f.epoch == epoch => return None,
            Role::Follower(f) => f.stop.set(true),
            Role::Leader(_) | Role::Alone => {}
        }
        let stop = Rc::new(Cell::new(false));
        *role = Role::Follower(FollowerState { leader, epoch, stop: stop.clone() });
        (leader >= 0).then_some(stop)
    }

    /// Stops whatever runs (the partition is closed or deleted).
    pub fn stop(&self) {
        if let Role::Follower(f) = &*self.role.borrow() {
            f.stop.set(true);
        }
    }

    /// A leader's ISR size (`None` unless this replica leads in a cluster).
    #[must_use]
    pub fn leader_isr_len(&self) -> Option<usize> {
        match &*self.role.borrow() {
            Role::Leader(l) => Some(l.isr.len()),
            _ => None,
        }
    }

    /// What `/metrics` shows of a leader; `None` unless this replica leads
    /// in a cluster.
    #[must_use]
    pub fn leader_status(&self, leader_end: u64) -> Option<LeaderStatus> {
        let (replicas, isr) = match &*self.role.borrow() {
            Role::Leader(l) => (l.replicas.len(), l.isr.len()),
            _ => return None,
        };
        Some(LeaderStatus { replicas, isr, lags: self.follower_lags(leader_end) })
    }

    /// Follower lag as the leader sees it: `(replica, leader end - its end)`.
    #[must_use]
    pub fn follower_lags(&self, leader_end: u64) -> Vec<(i32, u64)> {
        match &*self.role.borrow() {
            Role::Leader(l) => l
                .followers
                .iter()
                .map(|(&r, f)| (r, leader_end.saturating_sub(f.log_end.unwrap_or(0))))
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn new_progress(now: Instant) -> FollowerProgress {
    FollowerProgress { log_end: None, caught_up_at: now, last_fetch_at: now, leader_end_at_last_fetch: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::controller::PartitionState;

    fn info(replicas: &[i32], isr: &[i32], leader: i32, epoch: i32) -> PartitionInfo {
        PartitionInfo {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            state: PartitionState::Online,
            leader,
            leader_epoch: epoch,
            state_version: 0,
        }
    }

    #[test]
    fn high_watermark_is_the_smallest_isr_log_end_and_never_falls() {
        let r = Replica::default();
        let t0 = Instant::now();
        assert_eq!(r.high_watermark(50), 50, "alone: the log's own");
        assert!(r.lead(1, &info(&[1, 2, 3], &[1, 2, 3], 1, 4), 0, t0));
        assert_eq!(r.high_watermark(50), 0, "no follower has fetched yet");
        assert!(!r.on_follower_fetch(2, 30, 50, 50, t0));
        assert_eq!(r.high_watermark(50), 0, "3 is in the ISR and has not fetched");
        assert!(r.on_follower_fetch(3, 40, 50, 50, t0));
        assert_eq!(r.high_watermark(50), 30);
        assert!(r.on_follower_fetch(2, 50, 50, 50, t0));
        assert_eq!(r.high_watermark(50), 40);
        assert!(!r.on_follower_fetch(3, 20, 50, 50, t0), "a truncated follower never lowers it");
        assert_eq!(r.high_watermark(50), 40);
        assert_eq!(r.high_watermark(35), 35, "bounded by what the leader has written");
    }

    #[test]
    fn a_lagging_follower_leaves_the_isr_and_comes_back_once_caught_up() {
        let r = Replica::default();
        let t0 = Instant::now();
        let lag = Duration::from_secs(10);
        r.lead(1, &info(&[1, 2], &[1, 2], 1, 1), 7, t0);
        r.on_follower_fetch(2, 100, 100, 100, t0);
        assert_eq!(r.wanted_isr_change(1, t0 + Duration::from_secs(5), lag), None);
        // It fetches but stays behind a growing log for longer than the lag.
        r.on_follower_fetch(2, 100, 200, 200, t0 + Duration::from_secs(6));
        r.on_follower_fetch(2, 150, 300, 300, t0 + Duration::from_secs(12));
        let shrink = r.wanted_isr_change(1, t0 + Duration::from_secs(17), lag).expect("shrink");
        assert_eq!(shrink, IsrChange { isr: vec![1], leader_epoch: 1, state_version: 7 });
        assert_eq!(r.wanted_isr_change(1, t0 + Duration::from_secs(18), lag), None, "one pending at a time");
        // The snapshot shows the write: the leader applies it.
        assert!(!r.lead(1, &info(&[1, 2], &[1], 1, 1), 8, t0));
        assert_eq!(r.isr_len(), 1);
        // Caught up again: back in.
        let t1 = t0 + Duration::from_secs(20);
        r.on_follower_fetch(2, 300, 300, 300, t1);
        let expand = r.wanted_isr_change(1, t1, lag).expect("expand");
        assert_eq!(expand.isr, vec![1, 2]);
        assert_eq!(expand.state_version, 8);
    }

    #[test]
    fn an_asked_for_follower_counts_for_the_high_watermark_before_zookeeper_answers() {
        let r = Replica::default();
        let t0 = Instant::now();
        let lag = Duration::from_secs(10);
        // Replicas 1 (leader), 2 in sync, 3 new and catching up.
        r.lead(1, &info(&[1, 2, 3], &[1, 2], 1, 1), 5, t0);
        r.on_follower_fetch(2, 100, 100, 100, t0);
        r.on_follower_fetch(3, 100, 100, 100, t0);
        assert_eq!(r.high_watermark(100), 100);
        let expand = r.wanted_isr_change(1, t0, lag).expect("3 caught up");
        assert_eq!(expand.isr, vec![1, 2, 3]);
        // Appends go on; 2 has them, 3 not yet. Once the expansion is in
        // ZooKeeper 3 may be elected: nothing it lacks may be acknowledged,
        // whether or not the snapshot has come back.
        r.on_follower_fetch(2, 200, 200, 200, t0);
        assert_eq!(r.high_watermark(200), 100, "waits for the follower being added");
        r.on_follower_fetch(3, 200, 200, 200, t0);
        assert_eq!(r.high_watermark(200), 200);
        // A refused expansion stops counting it.
        let r = Replica::default();
        r.lead(1, &info(&[1, 2, 3], &[1, 2], 1, 1), 5, t0);
        r.on_follower_fetch(2, 100, 100, 100, t0);
        r.on_follower_fetch(3, 100, 100, 100, t0);
        r.wanted_isr_change(1, t0, lag).expect("expand");
        r.isr_answered();
        r.on_follower_fetch(2, 200, 200, 200, t0);
        assert_eq!(r.high_watermark(200), 200);
    }

    #[test]
    fn a_stopped_fetcher_cannot_move_a_new_leaders_high_watermark() {
        let r = Replica::default();
        let t0 = Instant::now();
        r.follow(2, 3).expect("a fetcher starts");
        r.set_follower_hw(80, 100);
        assert_eq!(r.high_watermark(100), 80, "a follower takes its leader's");
        assert!(r.lead(1, &info(&[1, 2], &[1, 2], 1, 4), 0, t0));
        r.on_follower_fetch(2, 100, 100, 100, t0);
        assert_eq!(r.high_watermark(100), 100);
        // The old fetcher's last append completes after the role changed.
        r.set_follower_hw(80, 100);
        assert_eq!(r.high_watermark(100), 100, "the leader's high watermark does not go down");
        r.set_follower_hw(500, 500);
        assert_eq!(r.high_watermark(500), 100, "nor up on a stale leader's word");
    }

    #[test]
    fn roles_change_with_the_epoch() {
        let r = Replica::default();
        let t0 = Instant::now();
        let stop = r.follow(2, 3).expect("a fetcher starts");
        assert!(r.follow(2, 3).is_none(), "same leader and epoch: nothing to do");
        assert!(!r.leads());
        let stop2 = r.follow(3, 4).expect("a new fetcher");
        assert!(stop.get(), "the old fetcher is told to stop");
        assert!(r.lead(1, &info(&[1, 2, 3], &[1, 3], 1, 5), 0, t0));
        assert!(stop2.get());
        assert!(r.leads());
        assert_eq!(r.epoch(), Some(5));
        assert!(!r.lead(1, &info(&[1, 2, 3], &[1, 3], 1, 5), 1, t0), "same epoch: not new");
        assert!(r.follow(-1, 6).is_none(), "no leader: no fetcher");
    }
}
