//! The consumer's group membership (see `group/mod.rs` for the state
//! machine): subscribe; join and sync on a task of their own, started and
//! applied by `poll`; heartbeats on a task; commits; leaving on close.

use crate::cluster::Cluster;
use crate::config::OffsetReset;
use crate::consumer::{Consumer, SeekTo};
use crate::error::{ClientError, Result};
use crate::group::assignor::{
    self, decode_assignment, encode_assignment, hold_back_transfers, Assignment, MemberSubscription,
    Subscription,
};
use crate::group::wire::{CommittedOffset, GroupClient};
use crate::group::{GroupSettings, RebalanceListener};
use shardlog_schema::ErrorCode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What the heartbeat task tells `poll`.
#[derive(Default)]
pub(crate) struct Signal {
    /// Rejoin at the next poll.
    needs_join: AtomicBool,
    /// The member was expelled: its partitions are lost, not revoked.
    lost: AtomicBool,
    /// Another incarnation took this static member's place.
    fenced: Mutex<Option<String>>,
}

pub(crate) struct Member {
    client: Arc<GroupClient>,
    settings: GroupSettings,
    topics: Vec<String>,
    member_id: String,
    generation: i32,
    /// The assignor the coordinator chose for `generation`; whether it is
    /// cooperative decides how the next rebalance starts.
    protocol: Option<String>,
    /// The join and sync in flight; `poll` keeps fetching what the member
    /// kept meanwhile and applies the outcome when it arrives.
    pub(crate) joining: Option<tokio::task::JoinHandle<Result<Joined>>>,
    signal: Arc<Signal>,
    heartbeat: Option<HeartbeatTask>,
    next_auto_commit: Option<Instant>,
    listener: Option<Box<dyn RebalanceListener>>,
}

impl Member {
    /// Whether the current generation's protocol is incremental: the member
    /// keeps its partitions while it rejoins and lists them as owned.
    fn cooperative(&self) -> bool {
        self.protocol.as_deref().and_then(assignor::by_name).is_some_and(|a| a.cooperative())
    }
}

/// A generation's heartbeat task; stopped when dropped (a finished join
/// that was never applied must not leave one running).
pub(crate) struct HeartbeatTask(tokio::task::JoinHandle<()>);

impl HeartbeatTask {
    /// The task ended: it flagged a rejoin, a loss or a fence.
    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for HeartbeatTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.heartbeat.take();
        if let Some(j) = self.joining.take() {
            j.abort();
        }
    }
}

/// How a join task ended.
pub(crate) enum Joined {
    /// A generation completed; this is the member's part of it. Its
    /// heartbeats started when the sync answered, not when `poll` applies
    /// this: a member that polls late is not expelled meanwhile.
    Generation {
        member_id: String,
        generation: i32,
        protocol: String,
        assignment: Assignment,
        heartbeat: HeartbeatTask,
    },
    /// The coordinator no longer knows the member or its generation
    /// (`UnknownMemberId`, `IllegalGeneration`) while it still holds
    /// partitions: they are lost, and the member joins again owning none.
    Lost { member_id: String },
}

/// A join task's outcome as `poll` receives it.
pub(crate) type JoinResult = std::result::Result<Result<Joined>, tokio::task::JoinError>;

/// What a join task needs (it owns copies: `poll` goes on meanwhile).
struct JoinRequest {
    client: Arc<GroupClient>,
    cluster: Arc<Cluster>,
    settings: GroupSettings,
    topics: Vec<String>,
    member_id: String,
    /// Listed in the subscription: what the member keeps fetching.
    owned: Assignment,
    /// For the new generation's heartbeat task.
    signal: Arc<Signal>,
}

/// Pause between attempts after a retriable group error.
const GROUP_RETRY_BACKOFF: Duration = Duration::from_millis(100);

fn code(e: &ClientError) -> Option<ErrorCode> {
    e.code()
}

impl Consumer {
    /// Joins `ConsumerConfig::group`'s group, subscribed to `topics`: the
    /// group splits their partitions among its members (on the next `poll`).
    pub async fn subscribe(&mut self, topics: &[String]) -> Result<()> {
        let Some(settings) = self.config().group.clone() else {
            return Err(ClientError::Config("subscribe needs ConsumerConfig::group (a group id)".into()));
        };
        if topics.is_empty() {
            return Err(ClientError::Config("subscribe to at least one topic".into()));
        }
        if settings.assignors.iter().all(|a| assignor::by_name(a).is_none()) {
            return Err(ClientError::Config(format!(
                "no known assignor in {:?} (range, roundrobin, cooperative-sticky)",
                settings.assignors
            )));
        }
        let client = Arc::new(GroupClient::new(self.cluster().clone(), settings.group_id.clone()));
        let signal = Arc::new(Signal::default());
        signal.needs_join.store(true, Ordering::Relaxed);
        let listener = self.member.take().and_then(|mut m| m.listener.take());
        self.member = Some(Member {
            client,
            settings,
            topics: topics.to_vec(),
            member_id: String::new(),
            generation: -1,
            protocol: None,
            joining: None,
            signal,
            heartbeat: None,
            next_auto_commit: None,
            listener,
        });
        Ok(())
    }

    /// Told of assignments and revocations (call after `subscribe`).
    pub fn set_rebalance_listener(&mut self, listener: Box<dyn RebalanceListener>) -> Result<()> {
        match &mut self.member {
            Some(m) => {
                m.listener = Some(listener);
                Ok(())
            }
            None => Err(ClientError::Config("subscribe first".into())),
        }
    }

    /// The group generation and member id (`None` before the first join).
    #[must_use]
    pub fn group_member(&self) -> Option<(i32, String)> {
        self.member.as_ref().filter(|m| m.generation >= 0).map(|m| (m.generation, m.member_id.clone()))
    }

    /// Applies a finished join, starts one when the heartbeat task (or a
    /// revocation) asked for it, and auto-commits when due and no join is
    /// in flight (a commit of the old generation may be refused then).
    pub(crate) async fn maintain_group(&mut self) -> Result<()> {
        let m = self.member.as_mut().expect("subscribed");
        if let Some(why) = m.signal.fenced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone() {
            return Err(ClientError::broker(ErrorCode::FencedInstanceId, Some(&why)));
        }
        if let Some(join) = m.joining.take_if(|j| j.is_finished()) {
            let joined = join.await;
            self.joined(joined).await?;
        }
        let m = self.member.as_ref().expect("subscribed");
        if m.joining.is_none() && m.signal.needs_join.swap(false, Ordering::AcqRel) {
            self.start_join().await?;
        }
        let m = self.member.as_mut().expect("subscribed");
        if let (Some(interval), Some(due), None) =
            (m.settings.auto_commit_interval, m.next_auto_commit, &m.joining)
        {
            if Instant::now() >= due {
                m.next_auto_commit = Some(Instant::now() + interval);
                if let Err(e) = self.commit_sync().await {
                    tracing::warn!(error = %e, "auto-commit failed");
                }
            }
        }
        Ok(())
    }

    /// Starts a rebalance: loses the assignment (expelled), or revokes all
    /// of it (eager protocols), or keeps it (cooperative); then joins on a
    /// task, listing what it kept as owned.
    async fn start_join(&mut self) -> Result<()> {
        let m = self.member.as_mut().expect("subscribed");
        m.heartbeat.take();
        let held = self.assignment();
        let m = self.member.as_mut().expect("subscribed");
        if m.signal.lost.swap(false, Ordering::AcqRel) {
            if !held.is_empty() {
                if let Some(l) = m.listener.as_mut() {
                    l.on_lost(&held);
                }
            }
            self.unassign(&held);
        } else if !m.cooperative() {
            self.revoke(&held).await;
        }
        let mut owned = Assignment::new();
        for (t, p) in self.assignment() {
            owned.entry(t).or_default().push(p);
        }
        let cluster = self.cluster().clone();
        let m = self.member.as_mut().expect("subscribed");
        let request = JoinRequest {
            client: m.client.clone(),
            cluster,
            settings: m.settings.clone(),
            topics: m.topics.clone(),
            member_id: m.member_id.clone(),
            owned,
            signal: m.signal.clone(),
        };
        m.joining = Some(tokio::spawn(join_and_sync(request)));
        Ok(())
    }

    /// Applies a finished join. A new generation: revoke what the member no
    /// longer has (commit first, then `on_revoked`), keep fetching what it
    /// kept, start what it was given at the committed offsets. Having
    /// revoked anything, it rejoins at once so the next generation can hand
    /// those partitions on (Kafka's rule).
    pub(crate) async fn joined(&mut self, joined: JoinResult) -> Result<()> {
        let m = self.member.as_mut().expect("subscribed");
        let joined = match joined {
            Ok(Ok(j)) => j,
            Ok(Err(e)) => {
                m.signal.needs_join.store(true, Ordering::Release); // the next poll tries again
                return Err(e);
            }
            // Join tasks are aborted only with their member.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let (member_id, generation, protocol, assignment, heartbeat) = match joined {
            Joined::Generation { member_id, generation, protocol, assignment, heartbeat } => {
                (member_id, generation, protocol, assignment, heartbeat)
            }
            Joined::Lost { member_id } => {
                tracing::warn!(group = %m.settings.group_id, "the coordinator forgot this member: partitions lost");
                (m.member_id, m.generation, m.protocol) = (member_id, -1, None);
                m.signal.lost.store(true, Ordering::Release);
                m.signal.needs_join.store(true, Ordering::Release);
                return Ok(());
            }
        };
        (m.member_id, m.generation, m.protocol) = (member_id, generation, Some(protocol));
        // A commit refused while the group rebalanced asked for the join
        // that just ended; but a heartbeat task that already stopped asked
        // for the next one.
        if !heartbeat.is_finished() {
            m.signal.needs_join.store(false, Ordering::Release);
        }
        let given: Vec<(String, u32)> =
            assignment.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p))).collect();
        let held = self.assignment();
        let revoked: Vec<(String, u32)> = held.iter().filter(|tp| !given.contains(tp)).cloned().collect();
        let added: Vec<(String, u32)> = given.iter().filter(|tp| !held.contains(tp)).cloned().collect();
        self.revoke(&revoked).await;
        self.start_at_committed(&added).await?;
        let m = self.member.as_mut().expect("subscribed");
        if let Some(l) = m.listener.as_mut() {
            l.on_assigned(&added);
        }
        m.next_auto_commit = m.settings.auto_commit_interval.map(|i| Instant::now() + i);
        m.heartbeat = Some(heartbeat);
        if !revoked.is_empty() {
            m.signal.needs_join.store(true, Ordering::Release);
        }
        tracing::info!(
            group = %m.settings.group_id,
            generation = m.generation,
            partitions = given.len(),
            added = added.len(),
            revoked = revoked.len(),
            "joined"
        );
        Ok(())
    }

    /// Gives `partitions` back: commits their positions first (with
    /// `commit_on_revoke`), tells the listener, stops fetching them.
    async fn revoke(&mut self, partitions: &[(String, u32)]) {
        if partitions.is_empty() {
            return;
        }
        if self.member.as_ref().is_some_and(|m| m.settings.commit_on_revoke) {
            let offsets: Vec<(String, u32, u64)> = self
                .positions()
                .into_iter()
                .filter(|(t, p, _)| partitions.iter().any(|(rt, rp)| rt == t && rp == p))
                .collect();
            if let Err(e) = self.commit_offsets(&offsets).await {
                tracing::warn!(error = %e, "commit before revoking failed");
            }
        }
        if let Some(l) = self.member.as_mut().and_then(|m| m.listener.as_mut()) {
            l.on_revoked(partitions);
        }
        self.unassign(partitions);
    }

    /// Starts fetching `partitions` at the group's committed offsets (else
    /// as `offset_reset` says).
    async fn start_at_committed(&mut self, partitions: &[(String, u32)]) -> Result<()> {
        if partitions.is_empty() {
            return Ok(());
        }
        let m = self.member.as_ref().expect("subscribed");
        let committed = m.client.fetch_offsets(Some(partitions)).await?;
        let given: Vec<Option<u64>> = partitions
            .iter()
            .map(|(t, p)| {
                committed.iter().find(|c| &c.topic == t && c.partition == *p).and_then(|c| c.offset)
            })
            .collect();
        let start = match self.config().offset_reset {
            OffsetReset::Earliest => SeekTo::Earliest,
            OffsetReset::Latest => SeekTo::Latest,
            OffsetReset::Error => {
                if let Some(((t, p), _)) = partitions.iter().zip(&given).find(|(_, g)| g.is_none()) {
                    return Err(ClientError::Config(format!(
                        "{t}/{p} has no committed offset and offset_reset is Error"
                    )));
                }
                SeekTo::Latest
            }
        };
        self.add_at(partitions, &given, start).await
    }

    /// Commits the consumed positions of every assigned partition.
    pub async fn commit_sync(&mut self) -> Result<()> {
        let offsets = self.positions();
        self.commit_offsets(&offsets).await
    }

    /// Commits the consumed positions on a task of its own; the handle says
    /// how it went.
    pub fn commit_async(&self) -> Result<tokio::task::JoinHandle<Result<()>>> {
        let m = self.member.as_ref().ok_or_else(|| ClientError::Config("subscribe first".into()))?;
        let (client, gen, id, inst) =
            (m.client.clone(), m.generation, m.member_id.clone(), m.settings.instance_id.clone());
        let signal = m.signal.clone();
        let offsets = self.positions();
        Ok(tokio::spawn(async move { commit(&client, &signal, gen, &id, inst.as_deref(), &offsets).await }))
    }

    /// Commits the given (topic, partition, next offset to read).
    pub async fn commit_offsets(&mut self, offsets: &[(String, u32, u64)]) -> Result<()> {
        let m = self.member.as_ref().ok_or_else(|| ClientError::Config("subscribe first".into()))?;
        if offsets.is_empty() || m.generation < 0 {
            return Ok(());
        }
        commit(&m.client, &m.signal, m.generation, &m.member_id, m.settings.instance_id.as_deref(), offsets)
            .await
    }

    /// The group's committed offsets of `partitions`.
    pub async fn committed(&self, partitions: &[(String, u32)]) -> Result<Vec<CommittedOffset>> {
        let m = self.member.as_ref().ok_or_else(|| ClientError::Config("subscribe first".into()))?;
        m.client.fetch_offsets(Some(partitions)).await
    }

    /// Leaves the group cleanly: commits the positions (with auto-commit on)
    /// and, for a dynamic member, sends LeaveGroup so the others rebalance
    /// at once. A static member stays, to come back within its session.
    /// A join in flight is finished first, so that what the member holds is
    /// committed with a generation the coordinator accepts.
    pub async fn close(mut self) -> Result<()> {
        if let Some(join) = self.member.as_mut().and_then(|m| m.joining.take()) {
            let joined = join.await;
            self.joined(joined).await?;
        }
        let Some(m) = self.member.as_ref() else { return Ok(()) };
        if m.generation < 0 {
            return Ok(());
        }
        let auto = m.settings.auto_commit_interval.is_some();
        if auto {
            self.commit_sync().await?;
        }
        let mut m = self.member.take().expect("checked");
        m.heartbeat.take();
        if m.settings.instance_id.is_none() {
            m.client.leave(&m.member_id, None).await?;
        }
        Ok(())
    }
}

async fn commit(
    client: &GroupClient,
    signal: &Signal,
    generation: i32,
    member_id: &str,
    instance_id: Option<&str>,
    offsets: &[(String, u32, u64)],
) -> Result<()> {
    match client.commit(generation, member_id, instance_id, offsets).await {
        Ok(refused) => match refused.first() {
            None => Ok(()),
            Some((t, p, code)) => Err(ClientError::broker(*code, Some(&format!("commit of {t}/{p}")))),
        },
        Err(e) => {
            if matches!(
                code(&e),
                Some(
                    ErrorCode::RebalanceInProgress
                        | ErrorCode::IllegalGeneration
                        | ErrorCode::UnknownMemberId
                )
            ) {
                signal.needs_join.store(true, Ordering::Release);
            }
            Err(e)
        }
    }
}

/// JoinGroup and SyncGroup until one generation completes (or, for a member
/// that holds partitions, until the coordinator says it forgot the member).
async fn join_and_sync(r: JoinRequest) -> Result<Joined> {
    let s = &r.settings;
    let deadline = Instant::now() + s.rebalance_timeout * 2 + s.session_timeout;
    // Every protocol gets the same subscription, as Kafka sends: eager
    // members revoked everything first, so they own nothing.
    let metadata =
        Subscription { topics: r.topics.clone(), user_data: None, owned: r.owned.clone() }.encode();
    let protocols: Vec<(String, Vec<u8>)> = s
        .assignors
        .iter()
        .filter(|a| assignor::by_name(a).is_some())
        .map(|a| (a.clone(), metadata.clone()))
        .collect();
    let mut member_id = r.member_id.clone();
    // `Some`: give up (the member lost what it holds); `None`: try again.
    let retry = |e: ClientError, member_id: &mut String| -> Result<Option<Joined>> {
        match code(&e) {
            Some(c @ (ErrorCode::UnknownMemberId | ErrorCode::IllegalGeneration)) => {
                if c == ErrorCode::UnknownMemberId {
                    member_id.clear();
                }
                if !r.owned.is_empty() {
                    return Ok(Some(Joined::Lost { member_id: member_id.clone() }));
                }
            }
            Some(ErrorCode::RebalanceInProgress) => {}
            _ if e.is_retriable() => {}
            _ => return Err(e),
        }
        if Instant::now() >= deadline {
            return Err(e);
        }
        Ok(None)
    };
    loop {
        let joined = r
            .client
            .join(&member_id, s.instance_id.as_deref(), s.session_timeout, s.rebalance_timeout, &protocols)
            .await;
        let j = match joined {
            Ok(j) => j,
            Err(e) => {
                if let Some(lost) = retry(e, &mut member_id)? {
                    return Ok(lost);
                }
                tokio::time::sleep(GROUP_RETRY_BACKOFF).await;
                continue;
            }
        };
        member_id.clone_from(&j.member_id);
        let assignments = if j.leader == j.member_id && !j.skip_assignment {
            assign_as_leader(&r.cluster, &j.protocol, &j.members).await?
        } else {
            Vec::new()
        };
        match r
            .client
            .sync(j.generation, &member_id, s.instance_id.as_deref(), &assignments, s.rebalance_timeout)
            .await
        {
            Ok(bytes) => {
                let assignment =
                    decode_assignment(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let heartbeat = spawn_heartbeats(&r, j.generation, &member_id);
                return Ok(Joined::Generation {
                    member_id,
                    generation: j.generation,
                    protocol: j.protocol,
                    assignment,
                    heartbeat,
                });
            }
            Err(e) => {
                if let Some(lost) = retry(e, &mut member_id)? {
                    return Ok(lost);
                }
                tokio::time::sleep(GROUP_RETRY_BACKOFF).await;
            }
        }
    }
}

/// The leader's part: decode every member's subscription, look up the
/// partition counts, run the chosen assignor, hold back what members still
/// claim (so no partition has two owners, whichever assignor ran), encode
/// the result.
async fn assign_as_leader(
    cluster: &Arc<Cluster>,
    protocol: &str,
    members: &[(String, Option<String>, Vec<u8>)],
) -> Result<Vec<(String, Vec<u8>)>> {
    let assignor = assignor::by_name(protocol).ok_or_else(|| {
        ClientError::Protocol(format!("the group chose assignor `{protocol}`, which this client lacks"))
    })?;
    let mut subs = Vec::with_capacity(members.len());
    for (id, instance, metadata) in members {
        let subscription =
            Subscription::decode(metadata).map_err(|e| ClientError::Protocol(e.to_string()))?;
        subs.push(MemberSubscription { member_id: id.clone(), instance_id: instance.clone(), subscription });
    }
    let mut topics: Vec<String> = subs.iter().flat_map(|m| m.subscription.topics.clone()).collect();
    topics.sort();
    topics.dedup();
    let md = cluster.refresh(Some(&topics)).await?;
    // Topics that do not exist (yet) get no partitions: nothing to assign.
    let counts: BTreeMap<String, u32> = topics
        .iter()
        .filter_map(|t| {
            md.topic(t).filter(|m| m.error == ErrorCode::None).map(|m| (t.clone(), m.partitions.len() as u32))
        })
        .collect();
    let mut out = assignor.assign(&subs, &counts);
    let held_back = hold_back_transfers(&subs, &mut out);
    tracing::debug!(protocol, held_back, "assigned as leader");
    Ok(subs
        .iter()
        .map(|m| (m.member_id.clone(), encode_assignment(out.get(&m.member_id).unwrap_or(&BTreeMap::new()))))
        .collect())
}

/// Heartbeats for `generation` every `heartbeat_interval` until told
/// otherwise by the coordinator.
fn spawn_heartbeats(r: &JoinRequest, generation: i32, member_id: &str) -> HeartbeatTask {
    let (client, signal) = (r.client.clone(), r.signal.clone());
    let (member_id, instance) = (member_id.to_string(), r.settings.instance_id.clone());
    let interval = r.settings.heartbeat_interval;
    HeartbeatTask(tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let Err(e) = client.heartbeat(generation, &member_id, instance.as_deref()).await else {
                continue;
            };
            match code(&e) {
                Some(ErrorCode::RebalanceInProgress) => {}
                Some(ErrorCode::UnknownMemberId | ErrorCode::IllegalGeneration) => {
                    tracing::warn!(error = %e, "expelled from the group: partitions lost");
                    signal.lost.store(true, Ordering::Release);
                }
                Some(ErrorCode::FencedInstanceId) => {
                    *signal.fenced.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some(e.to_string());
                    return;
                }
                _ => continue, // retriable: the session has some slack
            }
            signal.needs_join.store(true, Ordering::Release);
            return;
        }
    }))
}
