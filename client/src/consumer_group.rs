//! The consumer's group membership (see `group/mod.rs` for the state
//! machine): subscribe, join and sync inside `poll`, heartbeats on a task,
//! commits, and leaving on close.

use crate::config::OffsetReset;
use crate::consumer::{Consumer, SeekTo};
use crate::error::{ClientError, Result};
use crate::group::assignor::{self, decode_assignment, encode_assignment, MemberSubscription, Subscription};
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
    signal: Arc<Signal>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    next_auto_commit: Option<Instant>,
    listener: Option<Box<dyn RebalanceListener>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
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
                "no known assignor in {:?} (range, roundrobin)",
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

    /// Rejoins when the heartbeat task asked for it; auto-commits when due.
    pub(crate) async fn maintain_group(&mut self) -> Result<()> {
        let m = self.member.as_ref().expect("subscribed");
        if let Some(why) = m.signal.fenced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone() {
            return Err(ClientError::broker(ErrorCode::FencedInstanceId, Some(&why)));
        }
        if m.signal.needs_join.swap(false, Ordering::AcqRel) {
            self.rebalance().await?;
        }
        let m = self.member.as_mut().expect("subscribed");
        if let (Some(interval), Some(due)) = (m.settings.auto_commit_interval, m.next_auto_commit) {
            if Instant::now() >= due {
                m.next_auto_commit = Some(Instant::now() + interval);
                if let Err(e) = self.commit_sync().await {
                    tracing::warn!(error = %e, "auto-commit failed");
                }
            }
        }
        Ok(())
    }

    /// Revokes (or loses) the assignment, joins and syncs until a
    /// generation is complete, then starts fetching what it was given.
    async fn rebalance(&mut self) -> Result<()> {
        let m = self.member.as_mut().expect("subscribed");
        if let Some(h) = m.heartbeat.take() {
            h.abort();
        }
        let owned = self.assignment();
        let lost = self.member.as_ref().is_some_and(|m| m.signal.lost.swap(false, Ordering::AcqRel));
        if !owned.is_empty() {
            if lost {
                if let Some(l) = self.member.as_mut().and_then(|m| m.listener.as_mut()) {
                    l.on_lost(&owned);
                }
            } else {
                if self.member.as_ref().is_some_and(|m| m.settings.commit_on_revoke) {
                    if let Err(e) = self.commit_sync().await {
                        tracing::warn!(error = %e, "commit before revoking failed");
                    }
                }
                if let Some(l) = self.member.as_mut().and_then(|m| m.listener.as_mut()) {
                    l.on_revoked(&owned);
                }
            }
            self.assign_at(&[], &[], SeekTo::Latest).await?;
        }
        let assignment = self.join_and_sync().await?;
        let parts: Vec<(String, u32)> =
            assignment.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p))).collect();
        let m = self.member.as_ref().expect("subscribed");
        let committed =
            if parts.is_empty() { Vec::new() } else { m.client.fetch_offsets(Some(&parts)).await? };
        let given: Vec<Option<u64>> = parts
            .iter()
            .map(|(t, p)| {
                committed.iter().find(|c| &c.topic == t && c.partition == *p).and_then(|c| c.offset)
            })
            .collect();
        let start = match self.config().offset_reset {
            OffsetReset::Earliest => SeekTo::Earliest,
            OffsetReset::Latest => SeekTo::Latest,
            OffsetReset::Error => {
                if let Some(((t, p), _)) = parts.iter().zip(&given).find(|(_, g)| g.is_none()) {
                    return Err(ClientError::Config(format!(
                        "{t}/{p} has no committed offset and offset_reset is Error"
                    )));
                }
                SeekTo::Latest
            }
        };
        self.assign_at(&parts, &given, start).await?;
        let m = self.member.as_mut().expect("subscribed");
        if let Some(l) = m.listener.as_mut() {
            l.on_assigned(&parts);
        }
        m.next_auto_commit = m.settings.auto_commit_interval.map(|i| Instant::now() + i);
        m.heartbeat = Some(spawn_heartbeats(m));
        tracing::info!(group = %m.settings.group_id, generation = m.generation, partitions = parts.len(), "joined");
        Ok(())
    }

    /// JoinGroup and SyncGroup until one generation completes; returns this
    /// member's assignment.
    async fn join_and_sync(&mut self) -> Result<assignor::Assignment> {
        let cluster = self.cluster().clone();
        let m = self.member.as_mut().expect("subscribed");
        let s = m.settings.clone();
        let deadline = Instant::now() + s.rebalance_timeout * 2 + s.session_timeout;
        let metadata = Subscription { topics: m.topics.clone(), ..Default::default() }.encode();
        let protocols: Vec<(String, Vec<u8>)> = s
            .assignors
            .iter()
            .filter(|a| assignor::by_name(a).is_some())
            .map(|a| (a.clone(), metadata.clone()))
            .collect();
        loop {
            let retry = |e: ClientError, member_id: &mut String| -> Result<()> {
                match code(&e) {
                    Some(ErrorCode::UnknownMemberId) => member_id.clear(),
                    Some(ErrorCode::RebalanceInProgress | ErrorCode::IllegalGeneration) => {}
                    _ if e.is_retriable() => {}
                    _ => return Err(e),
                }
                if Instant::now() >= deadline {
                    return Err(e);
                }
                Ok(())
            };
            let joined = m
                .client
                .join(
                    &m.member_id,
                    s.instance_id.as_deref(),
                    s.session_timeout,
                    s.rebalance_timeout,
                    &protocols,
                )
                .await;
            let j = match joined {
                Ok(j) => j,
                Err(e) => {
                    retry(e, &mut m.member_id)?;
                    tokio::time::sleep(GROUP_RETRY_BACKOFF).await;
                    continue;
                }
            };
            m.member_id = j.member_id.clone();
            m.generation = j.generation;
            let assignments = if j.leader == j.member_id && !j.skip_assignment {
                assign_as_leader(&cluster, &j.protocol, &j.members).await?
            } else {
                Vec::new()
            };
            match m
                .client
                .sync(j.generation, &m.member_id, s.instance_id.as_deref(), &assignments, s.rebalance_timeout)
                .await
            {
                Ok(bytes) => {
                    return decode_assignment(&bytes).map_err(|e| ClientError::Protocol(e.to_string()));
                }
                Err(e) => {
                    retry(e, &mut m.member_id)?;
                    tokio::time::sleep(GROUP_RETRY_BACKOFF).await;
                }
            }
        }
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
    pub async fn close(mut self) -> Result<()> {
        let Some(m) = self.member.as_ref() else { return Ok(()) };
        if m.generation < 0 {
            return Ok(());
        }
        let auto = m.settings.auto_commit_interval.is_some();
        if auto {
            self.commit_sync().await?;
        }
        let mut m = self.member.take().expect("checked");
        if let Some(h) = m.heartbeat.take() {
            h.abort();
        }
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

/// The leader's part: decode every member's subscription, look up the
/// partition counts, run the chosen assignor, encode the result.
async fn assign_as_leader(
    cluster: &Arc<crate::cluster::Cluster>,
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
    let out = assignor.assign(&subs, &counts);
    Ok(subs
        .iter()
        .map(|m| (m.member_id.clone(), encode_assignment(out.get(&m.member_id).unwrap_or(&BTreeMap::new()))))
        .collect())
}

/// Heartbeats every `heartbeat_interval` until told otherwise by the coordinator.
fn spawn_heartbeats(m: &Member) -> tokio::task::JoinHandle<()> {
    let (client, signal) = (m.client.clone(), m.signal.clone());
    let (generation, member_id, instance) =
        (m.generation, m.member_id.clone(), m.settings.instance_id.clone());
    let interval = m.settings.heartbeat_interval;
    tokio::spawn(async move {
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
    })
}
