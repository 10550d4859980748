//! Consumer-group coordinator.
//!
//! The coordinator of group `G` is the owner of partition
//! `group_partition(G, N)` = `fnv1a(G) % N` of the internal topic
//! `__consumer_offsets` (`N` = its partition count, fixed at its creation;
//! `shardlog_schema::types::group_partition`). That shard runs the group's
//! state machine (`state.rs`) on its own thread, with no locks; requests that
//! reach another shard are forwarded over the mesh (`dispatch/group.rs`). In
//! a cluster the coordinator will be the leader of that partition, and the
//! state moves with leadership (rebuilt from the replicated log).
//!
//! Durability: every committed offset and every completed rebalance is a
//! keyed record in the group's offsets partition (`records.rs`), appended
//! through the normal log path before the request is answered; memory holds
//! the latest value per key. At start-up each owned offsets partition is
//! read from its start and the groups rebuilt; until that is done the
//! partition's groups answer `CoordinatorNotAvailable`. The partition is
//! kept bounded by keyed compaction (`cleanup.policy=compact`): the latest
//! record per key survives, a tombstone (deleted group) removes the key.
//!
//! **Invariants**: a group's state is touched only by its coordinating
//! shard; an offset is served from memory only after its record was
//! appended; memory applies records in log order (a later record wins even
//! if its append completed first).

pub mod api;
pub mod records;
pub mod state;

use crate::shard::{ShardContext, ShardOp, ShardReply};
use api::*;
use records::{GroupValue, OffsetValue, RecordKey};
use shardlog_schema::batch::{self, BatchBuilder, BatchIter};
use shardlog_schema::types::{group_partition, OFFSETS_TOPIC};
use shardlog_schema::{ErrorCode, ShardId};
use state::{now_ms, Committed, Group, GroupState, JoinStep, SyncStep};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often each shard checks sessions and rebalance deadlines.
pub const TICK: Duration = Duration::from_millis(50);
/// Longest group id accepted.
pub const GROUP_ID_BYTES_MAX: usize = 255;

/// The groups one shard coordinates.
#[derive(Default)]
pub struct Coordinator {
    groups: RefCell<HashMap<String, Group>>,
    /// Offsets partitions owned here whose groups are loaded.
    loaded: RefCell<HashSet<u32>>,
}

fn gerr<T>(code: ErrorCode, message: impl Into<String>) -> GroupResult<T> {
    Err(GroupError::new(code, message))
}

/// The partition count of `__consumer_offsets`, if it exists.
pub fn offsets_partitions(ctx: &ShardContext) -> Option<u32> {
    ctx.topics.borrow().get(OFFSETS_TOPIC).map(|t| t.partitions)
}

/// Settings of `__consumer_offsets` when the broker creates it: the topic
/// defaults, its own segment size, keyed compaction (the latest record per
/// group and per committed partition stays; a deleted group's tombstones
/// go after `delete.retention.ms`) and no time or size retention (an idle
/// group's offsets must not age out with old segments).
#[must_use]
pub fn offsets_topic_config(config: &crate::config::BrokerConfig) -> crate::config::TopicConfig {
    let mut c = config.topic_defaults.clone();
    c.segment_bytes = config.group.offsets_topic_segment_bytes;
    c.retention_ms = None;
    c.retention_bytes = None;
    c.cleanup_policy = crate::config::CleanupPolicy::Compact;
    c
}

/// The offsets partition and the shard that coordinate `group`.
pub fn coordinator_of(ctx: &ShardContext, group: &str) -> GroupResult<(u32, ShardId)> {
    if group.is_empty() || group.len() > GROUP_ID_BYTES_MAX {
        return gerr(ErrorCode::InvalidGroupId, format!("a group id has 1 to {GROUP_ID_BYTES_MAX} bytes"));
    }
    let Some(n) = offsets_partitions(ctx) else {
        // In a cluster the first group request has it created (as Kafka).
        ctx.request_offsets_topic();
        return gerr(ErrorCode::CoordinatorNotAvailable, "the offsets topic does not exist (yet)");
    };
    let p = group_partition(group, n).0;
    Ok((p, ctx.owner(OFFSETS_TOPIC, p)))
}

/// [`coordinator_of`], on this broker: in a cluster a group is coordinated
/// by the leader of its offsets partition, so another broker's group gets
/// `NotCoordinator` (find it again) and one whose partition has no live
/// leader `CoordinatorNotAvailable`.
pub fn coordinator_here(ctx: &ShardContext, group: &str) -> GroupResult<(u32, ShardId)> {
    let (p, shard) = coordinator_of(ctx, group)?;
    match ctx.check_served(OFFSETS_TOPIC, p) {
        None => Ok((p, shard)),
        Some(e) if e.code == ErrorCode::NotLeaderOrFollower => gerr(ErrorCode::NotCoordinator, e.message),
        Some(e) => gerr(ErrorCode::CoordinatorNotAvailable, e.message),
    }
}

/// Where a group's coordinator is, as FindCoordinator answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorAddr {
    pub partition: u32,
    pub broker_id: i32,
    pub host: String,
    pub port: u16,
    pub shard: u16,
    pub shard_port: u16,
}

/// Locates `group`'s coordinator: this broker's shard alone; in a cluster
/// the leader of its offsets partition.
pub fn locate_coordinator(ctx: &ShardContext, group: &str) -> GroupResult<CoordinatorAddr> {
    use crate::cluster::metadata::{ClusterMetadata, Route};
    let (partition, shard) = coordinator_of(ctx, group)?;
    let Some(md) = ctx.cluster_metadata() else {
        return Ok(CoordinatorAddr {
            partition,
            broker_id: ctx.config.broker_id,
            host: ctx.endpoints.host.clone(),
            port: ctx.endpoints.public_port,
            shard: shard.0,
            shard_port: ctx.endpoints.shard_ports.get(shard.0 as usize).copied().unwrap_or_default(),
        });
    };
    match md.route(OFFSETS_TOPIC, partition) {
        Route::Leader { leader, broker: Some(b), .. } => {
            let (shard, shard_port) = ClusterMetadata::leader_endpoint(b, OFFSETS_TOPIC, partition);
            Ok(CoordinatorAddr {
                partition,
                broker_id: leader,
                host: b.host.clone(),
                port: b.port,
                shard,
                shard_port,
            })
        }
        _ => gerr(
            ErrorCode::CoordinatorNotAvailable,
            format!("{OFFSETS_TOPIC}-{partition}, which holds group `{group}`, has no live leader"),
        ),
    }
}

/// Runs a group request on its coordinating shard (here or over the mesh).
pub async fn route(ctx: &Rc<ShardContext>, req: GroupRequest) -> GroupResponse {
    let shard = match coordinator_here(ctx, req.group_id()) {
        Ok((_, shard)) => shard,
        Err(e) => return GroupResponse::error(req.api(), e),
    };
    let api = req.api();
    match ctx.call(shard, ShardOp::Group(Box::new(req))).await {
        ShardReply::Group(resp) => *resp,
        other => GroupResponse::error(
            api,
            GroupError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("coordinator shard {shard} did not answer: {other:?}"),
            ),
        ),
    }
}

/// Every group of every shard (ListGroups).
pub async fn list_all(ctx: &Rc<ShardContext>) -> GroupResult<Vec<ListedGroup>> {
    let mut all = Vec::new();
    for s in 0..ctx.shard_count {
        match ctx.call(ShardId(s), ShardOp::ListGroups).await {
            ShardReply::Groups(gs) => all.extend(gs),
            _ => return gerr(ErrorCode::CoordinatorNotAvailable, format!("shard {s} did not answer")),
        }
    }
    all.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    Ok(all)
}

impl Coordinator {
    fn limits(ctx: &ShardContext) -> state::Limits {
        state::Limits {
            initial_rebalance_delay: ctx.config.group.initial_rebalance_delay,
            members_max: ctx.config.group.members_max,
        }
    }

    /// Handles a request for a group this shard coordinates.
    pub async fn handle(&self, ctx: &Rc<ShardContext>, req: GroupRequest) -> GroupResponse {
        let p = match coordinator_of(ctx, req.group_id()) {
            Ok((p, shard)) if shard == ctx.id => p,
            Ok((_, shard)) => {
                let e = GroupError::new(
                    ErrorCode::NotCoordinator,
                    format!("group is coordinated by shard {shard}"),
                );
                return GroupResponse::error(req.api(), e);
            }
            Err(e) => return GroupResponse::error(req.api(), e),
        };
        if !self.loaded.borrow().contains(&p) {
            let e = GroupError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("the coordinator is loading {OFFSETS_TOPIC}-{p}"),
            );
            return GroupResponse::error(req.api(), e);
        }
        if ctx.shutting_down.get() {
            let e = GroupError::new(ErrorCode::CoordinatorNotAvailable, "the broker is shutting down");
            return GroupResponse::error(req.api(), e);
        }
        match req {
            GroupRequest::Join(r) => GroupResponse::Join(self.join(ctx, p, r).await),
            GroupRequest::Sync(r) => GroupResponse::Sync(self.sync(ctx, p, r).await),
            GroupRequest::Heartbeat(r) => GroupResponse::Heartbeat(self.heartbeat(&r)),
            GroupRequest::Leave(r) => GroupResponse::Leave(self.leave(ctx, p, r).await),
            GroupRequest::Commit(r) => GroupResponse::Commit(self.commit(ctx, p, r).await),
            GroupRequest::FetchOffsets(r) => GroupResponse::FetchOffsets(self.fetch_offsets(ctx, r).await),
            GroupRequest::Describe(g) => GroupResponse::Describe(self.describe(&g)),
            GroupRequest::Delete(g) => GroupResponse::Delete(self.delete(ctx, p, &g).await),
        }
    }

    async fn join(&self, ctx: &Rc<ShardContext>, p: u32, r: JoinGroup) -> GroupResult<Joined> {
        let g = &ctx.config.group;
        if r.session_timeout < g.session_timeout_min || r.session_timeout > g.session_timeout_max {
            return gerr(
                ErrorCode::InvalidSessionTimeout,
                format!(
                    "session timeout {} ms is outside {}..={} ms (group.min/max.session.timeout.ms)",
                    r.session_timeout.as_millis(),
                    g.session_timeout_min.as_millis(),
                    g.session_timeout_max.as_millis()
                ),
            );
        }
        if r.protocol_type.is_empty() || r.protocols.is_empty() {
            return gerr(
                ErrorCode::InconsistentGroupProtocol,
                "a join names a protocol type and at least one protocol",
            );
        }
        let group_id = r.group_id.clone();
        let step = {
            let mut groups = self.groups.borrow_mut();
            if !r.member_id.is_empty() && !groups.contains_key(&group_id) {
                return gerr(
                    ErrorCode::UnknownMemberId,
                    format!("group `{group_id}` has no member `{}`", r.member_id),
                );
            }
            let group = groups.entry(group_id.clone()).or_insert_with(|| Group::new(group_id.clone()));
            group.join(r, Instant::now(), Self::limits(ctx), ctx.id.0)
        };
        match step {
            JoinStep::Done(result) => {
                self.drop_if_unused(&group_id);
                result
            }
            JoinStep::Wait(rx) => rx.recv().await.unwrap_or_else(|| {
                gerr(ErrorCode::RebalanceInProgress, "the join was superseded: join again")
            }),
            JoinStep::Rejoined(joined, record) => {
                self.persist_group(ctx, p, &group_id, record).await?;
                Ok(joined)
            }
        }
    }

    async fn sync(&self, ctx: &Rc<ShardContext>, p: u32, r: SyncGroup) -> GroupResult<Synced> {
        let group_id = r.group_id.clone();
        let generation = r.generation;
        let step = match self.groups.borrow_mut().get_mut(&group_id) {
            Some(group) => group.sync(r, Instant::now()),
            None => return gerr(ErrorCode::UnknownMemberId, format!("group `{group_id}` does not exist")),
        };
        let rx = match step {
            SyncStep::Done(result) => return result,
            SyncStep::Wait(rx) => rx,
            SyncStep::Persist(record, rx) => {
                let result = self.persist_group(ctx, p, &group_id, record).await;
                if let Some(group) = self.groups.borrow_mut().get_mut(&group_id) {
                    group.assignment_persisted(generation, result, Instant::now(), Self::limits(ctx));
                }
                rx
            }
        };
        rx.recv()
            .await
            .unwrap_or_else(|| gerr(ErrorCode::RebalanceInProgress, "the group rebalanced: rejoin"))
    }

    fn heartbeat(&self, r: &Heartbeat) -> GroupResult<()> {
        match self.groups.borrow_mut().get_mut(&r.group_id) {
            Some(group) => group.heartbeat(r, Instant::now()),
            None => gerr(ErrorCode::UnknownMemberId, format!("group `{}` does not exist", r.group_id)),
        }
    }

    async fn leave(
        &self,
        ctx: &Rc<ShardContext>,
        p: u32,
        r: LeaveGroup,
    ) -> GroupResult<Vec<(LeaveMember, GroupResult<()>)>> {
        if r.members.is_empty() {
            return gerr(ErrorCode::InvalidRequest, "a leave names at least one member");
        }
        let (results, emptied) = {
            let mut groups = self.groups.borrow_mut();
            let Some(group) = groups.get_mut(&r.group_id) else {
                return gerr(ErrorCode::UnknownMemberId, format!("group `{}` does not exist", r.group_id));
            };
            let was_empty = group.state == GroupState::Empty;
            let now = Instant::now();
            let results: Vec<_> = r
                .members
                .into_iter()
                .map(|m| {
                    let result = group.leave(&m, now, Self::limits(ctx));
                    (m, result)
                })
                .collect();
            let emptied = (!was_empty && group.state == GroupState::Empty).then(|| group.record(now_ms()));
            (results, emptied)
        };
        if let Some(record) = emptied {
            self.persist_group(ctx, p, &r.group_id, record).await?;
        }
        Ok(results)
    }

    async fn commit(
        &self,
        ctx: &Rc<ShardContext>,
        p: u32,
        r: OffsetCommit,
    ) -> GroupResult<Vec<CommitOutcome>> {
        {
            let mut groups = self.groups.borrow_mut();
            match groups.get(&r.group_id) {
                Some(group) => group.check_commit(&r)?,
                None if r.generation < 0 && r.member_id.is_empty() => {
                    groups.insert(r.group_id.clone(), Group::new(r.group_id.clone()));
                }
                None => {
                    return gerr(
                        ErrorCode::UnknownMemberId,
                        format!("group `{}` does not exist: join it first", r.group_id),
                    )
                }
            }
        }
        let metadata_max = ctx.config.group.offset_metadata_bytes_max;
        let time = now_ms();
        let mut outcomes = Vec::with_capacity(r.partitions.len());
        let mut records = Vec::new();
        for c in r.partitions {
            let check = if let Some(e) = ctx.check_partition(&c.topic, c.partition) {
                Err(GroupError::new(e.code, e.message))
            } else if c.metadata.len() > metadata_max {
                gerr(
                    ErrorCode::OffsetMetadataTooLarge,
                    format!(
                        "{} bytes of metadata; offset.metadata.max.bytes is {metadata_max}",
                        c.metadata.len()
                    ),
                )
            } else if c.offset < 0 {
                gerr(ErrorCode::InvalidRequest, format!("offset {} is negative", c.offset))
            } else {
                Ok(())
            };
            if check.is_ok() {
                let key = RecordKey::Offset {
                    group: r.group_id.clone(),
                    topic: c.topic.clone(),
                    partition: c.partition,
                };
                let value = OffsetValue {
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    commit_time_ms: time,
                    metadata: c.metadata.clone(),
                };
                records.push((key, Some(value.encode()), outcomes.len()));
            }
            outcomes.push((c, check));
        }
        let written = if records.is_empty() {
            Ok(0)
        } else {
            let kv: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                records.iter().map(|(k, v, _)| (k.encode(), v.clone())).collect();
            append(ctx, p, &kv).await
        };
        match written {
            Ok(base) => {
                if let Some(group) = self.groups.borrow_mut().get_mut(&r.group_id) {
                    for (i, (_, _, at)) in records.iter().enumerate() {
                        let (c, _) = &outcomes[*at];
                        let committed = Committed {
                            offset: c.offset,
                            leader_epoch: c.leader_epoch,
                            metadata: c.metadata.clone(),
                            commit_time_ms: time,
                            record_offset: base + i as u64,
                        };
                        apply_offset(group, (c.topic.clone(), c.partition), committed);
                    }
                }
            }
            Err(e) => {
                for (_, check) in &mut outcomes {
                    if check.is_ok() {
                        *check = Err(e.clone());
                    }
                }
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|(c, result)| CommitOutcome { topic: c.topic, partition: c.partition, result })
            .collect())
    }

    async fn fetch_offsets(&self, ctx: &Rc<ShardContext>, r: OffsetFetch) -> GroupResult<Vec<FetchedOffset>> {
        let mut out: Vec<FetchedOffset> = {
            let groups = self.groups.borrow();
            let group = groups.get(&r.group_id);
            let one = |topic: &str, partition: u32| {
                let c = group.and_then(|g| g.offsets.get(&(topic.to_string(), partition)));
                FetchedOffset {
                    topic: topic.to_string(),
                    partition,
                    offset: c.map_or(-1, |c| c.offset),
                    leader_epoch: c.map_or(-1, |c| c.leader_epoch),
                    metadata: c.map(|c| c.metadata.clone()).unwrap_or_default(),
                    log_end_offset: -1,
                    error: ctx.check_partition(topic, partition).map(|e| GroupError::new(e.code, e.message)),
                }
            };
            match &r.partitions {
                Some(parts) => parts.iter().map(|(t, p)| one(t, *p)).collect(),
                None => {
                    let mut keys: Vec<&(String, u32)> =
                        group.map(|g| g.offsets.keys().collect()).unwrap_or_default();
                    keys.sort();
                    keys.into_iter().map(|(t, p)| one(t, *p)).collect()
                }
            }
        };
        for f in out.iter_mut().filter(|f| f.error.is_none()) {
            f.log_end_offset = log_end(ctx, &f.topic, f.partition).await;
        }
        Ok(out)
    }

    fn describe(&self, group_id: &str) -> GroupResult<DescribedGroup> {
        match self.groups.borrow().get(group_id) {
            Some(g) => Ok(g.describe()),
            None => gerr(ErrorCode::GroupIdNotFound, format!("group `{group_id}` does not exist")),
        }
    }

    async fn delete(&self, ctx: &Rc<ShardContext>, p: u32, group_id: &str) -> GroupResult<()> {
        let keys: Vec<(Vec<u8>, Option<Vec<u8>>)> = {
            let groups = self.groups.borrow();
            let Some(g) = groups.get(group_id) else {
                return gerr(ErrorCode::GroupIdNotFound, format!("group `{group_id}` does not exist"));
            };
            if !g.members.is_empty() || g.state != GroupState::Empty {
                return gerr(
                    ErrorCode::NonEmptyGroup,
                    format!(
                        "group `{group_id}` has {} members: only an empty group can be deleted",
                        g.members.len()
                    ),
                );
            }
            let mut keys: Vec<_> = g
                .offsets
                .keys()
                .map(|(t, part)| {
                    RecordKey::Offset { group: group_id.to_string(), topic: t.clone(), partition: *part }
                        .encode()
                })
                .collect();
            keys.push(RecordKey::Group { group: group_id.to_string() }.encode());
            keys.into_iter().map(|k| (k, None)).collect()
        };
        if let Some(g) = self.groups.borrow_mut().get_mut(group_id) {
            g.state = GroupState::Dead;
        }
        let result = append(ctx, p, &keys).await;
        let mut groups = self.groups.borrow_mut();
        match result {
            Ok(_) => {
                groups.remove(group_id);
                Ok(())
            }
            Err(e) => {
                if let Some(g) = groups.get_mut(group_id) {
                    g.state = GroupState::Empty;
                }
                Err(e)
            }
        }
    }

    /// Shutdown: answers the members waiting in a join or sync now (they
    /// find the coordinator again), so that draining does not wait for them.
    pub fn stop(&self) {
        let e = GroupError::new(ErrorCode::CoordinatorNotAvailable, "the broker is shutting down");
        for g in self.groups.borrow_mut().values_mut() {
            g.abort_waiters(&e);
        }
    }

    /// This shard's groups, for ListGroups.
    pub fn list_local(&self) -> Vec<ListedGroup> {
        self.groups
            .borrow()
            .values()
            .map(|g| ListedGroup {
                group_id: g.id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
                state: g.state.name(),
            })
            .collect()
    }

    /// Committed offsets of this shard's groups, for `/metrics`.
    pub fn committed_offsets(&self) -> Vec<GroupLag> {
        let groups = self.groups.borrow();
        let mut out: Vec<GroupLag> = groups
            .values()
            .flat_map(|g| {
                g.offsets.iter().map(|((t, p), c)| GroupLag {
                    group_id: g.id.clone(),
                    topic: t.clone(),
                    partition: *p,
                    committed: c.offset,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.group_id, &a.topic, a.partition).cmp(&(&b.group_id, &b.topic, b.partition)));
        out
    }

    async fn persist_group(
        &self,
        ctx: &Rc<ShardContext>,
        p: u32,
        group_id: &str,
        v: GroupValue,
    ) -> GroupResult<()> {
        let key = RecordKey::Group { group: group_id.to_string() }.encode();
        append(ctx, p, &[(key, Some(v.encode()))]).await.map(|_| ())
    }

    fn drop_if_unused(&self, group_id: &str) {
        let mut groups = self.groups.borrow_mut();
        if groups.get(group_id).is_some_and(Group::is_unused) {
            groups.remove(group_id);
        }
    }

    /// Rebuilds the groups of every offsets partition this shard owns, then
    /// serves them. Runs at start-up before the shard accepts.
    pub async fn load_owned(&self, ctx: &Rc<ShardContext>) -> Result<(), String> {
        let Some(n) = offsets_partitions(ctx) else { return Ok(()) };
        for p in (0..n)
            .filter(|p| ctx.owner(OFFSETS_TOPIC, *p) == ctx.id && ctx.partition(OFFSETS_TOPIC, *p).is_some())
        {
            self.load_one(ctx, p).await.map_err(|e| format!("{OFFSETS_TOPIC}-{p}: {e}"))?;
        }
        Ok(())
    }

    /// Cluster mode: rebuilds the groups of an offsets partition this shard
    /// has just opened (a failure is logged; its groups then answer
    /// `CoordinatorNotAvailable`).
    pub async fn load_partition(&self, ctx: &Rc<ShardContext>, p: u32) {
        if self.loaded.borrow().contains(&p) {
            return;
        }
        if let Err(e) = self.load_one(ctx, p).await {
            tracing::error!(partition = p, error = %e, "cannot load the groups of {OFFSETS_TOPIC}-{p}");
        }
    }

    async fn load_one(&self, ctx: &Rc<ShardContext>, p: u32) -> Result<(), GroupError> {
        let started = Instant::now();
        let (records, groups) = self.load(ctx, p).await?;
        if records > 0 {
            tracing::info!(
                partition = p,
                records,
                groups,
                ms = started.elapsed().as_millis() as u64,
                "groups loaded"
            );
        }
        self.loaded.borrow_mut().insert(p);
        Ok(())
    }

    /// Applies partition `p`'s records in log order; returns (records, groups).
    async fn load(&self, ctx: &Rc<ShardContext>, p: u32) -> Result<(usize, usize), GroupError> {
        let part = ctx.partition(OFFSETS_TOPIC, p).ok_or_else(|| {
            GroupError::new(ErrorCode::CoordinatorNotAvailable, "offsets partition is not open here")
        })?;
        let end = part.log.high_watermark().0;
        let mut at = part.log.start_offset().0;
        let mut count = 0;
        let mut touched = HashSet::new();
        let batch_max = part.config.batch_bytes_max as usize;
        while at < end {
            let read = part.read(at, 4 << 20).await.map_err(|e| GroupError::new(e.code, e.message))?;
            if read.is_empty() {
                break;
            }
            let bytes =
                read.into_bytes().await.map_err(|e| GroupError::new(e.error_code(), e.to_string()))?;
            let mut next = at;
            for b in BatchIter::new(&bytes, batch_max) {
                let (header, one) =
                    b.map_err(|e| GroupError::new(ErrorCode::CorruptMessage, e.to_string()))?;
                next = next.max(header.next_offset());
                let records = batch::records(one)
                    .map_err(|e| GroupError::new(ErrorCode::CorruptMessage, e.to_string()))?;
                for r in records.into_iter().filter(|r| r.offset >= at) {
                    count += 1;
                    match self.apply_record(&r) {
                        Ok(Some(g)) => {
                            touched.insert(g);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(partition = p, offset = r.offset, error = %e, "skipping an unreadable group record")
                        }
                    }
                }
            }
            if next <= at {
                break;
            }
            at = next;
            glommio::yield_if_needed().await;
        }
        let mut groups = self.groups.borrow_mut();
        groups.retain(|_, g| !g.is_unused());
        Ok((count, touched.len()))
    }

    /// Applies one record read back from the log; returns its group.
    fn apply_record(&self, r: &batch::RecordView<'_>) -> Result<Option<String>, records::RecordError> {
        let Some(key) = r.key else { return Ok(None) };
        let key = RecordKey::decode(key)?;
        let mut groups = self.groups.borrow_mut();
        let group_id = key.group().to_string();
        let group = groups.entry(group_id.clone()).or_insert_with(|| Group::new(group_id.clone()));
        match key {
            RecordKey::Offset { topic, partition, .. } => {
                if r.tombstone {
                    group.offsets.remove(&(topic, partition));
                } else {
                    let v = OffsetValue::decode(r.value)?;
                    let committed = Committed {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata,
                        commit_time_ms: v.commit_time_ms,
                        record_offset: r.offset,
                    };
                    apply_offset(group, (topic, partition), committed);
                }
            }
            RecordKey::Group { .. } => {
                if r.tombstone {
                    groups.remove(&group_id);
                } else {
                    group.restore(GroupValue::decode(r.value)?, Instant::now());
                }
            }
        }
        Ok(Some(group_id))
    }

    /// Expires sessions and ends rebalances at their deadline; records
    /// groups that became empty.
    pub async fn tick(&self, ctx: &Rc<ShardContext>) {
        let now = Instant::now();
        let emptied: Vec<(String, GroupValue)> = {
            let mut groups = self.groups.borrow_mut();
            groups
                .values_mut()
                .filter_map(|g| g.expire(now, Self::limits(ctx)).then(|| (g.id.clone(), g.record(now_ms()))))
                .collect()
        };
        for (group_id, record) in emptied {
            let Ok((p, _)) = coordinator_of(ctx, &group_id) else { continue };
            if let Err(e) = self.persist_group(ctx, p, &group_id, record).await {
                tracing::warn!(group = %group_id, error = %e, "cannot record that the group is empty");
            }
        }
    }
}

/// Keeps the offset whose record is later in the log.
fn apply_offset(group: &mut Group, key: (String, u32), c: Committed) {
    match group.offsets.get(&key) {
        Some(old) if old.record_offset > c.record_offset => {}
        _ => {
            group.offsets.insert(key, c);
        }
    }
}

/// Appends keyed records (value `None`: a tombstone) to offsets partition
/// `p`, which this shard owns; returns the first record's offset.
async fn append(ctx: &Rc<ShardContext>, p: u32, records: &[(Vec<u8>, Option<Vec<u8>>)]) -> GroupResult<u64> {
    let part = ctx.partition(OFFSETS_TOPIC, p).ok_or_else(|| {
        GroupError::new(ErrorCode::CoordinatorNotAvailable, format!("{OFFSETS_TOPIC}-{p} is not open here"))
    })?;
    let mut b = BatchBuilder::with_capacity(
        records.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 32).sum(),
    );
    let time = now_ms();
    for (k, v) in records {
        match v {
            Some(v) => b.push(Some(k), v, &[], time),
            None => b.push_tombstone(k, &[], time),
        }
    }
    let bytes = b.finish();
    let info = part.append(&bytes).await.map_err(|e| {
        tracing::warn!(partition = p, error = %e.message, "cannot write group records");
        GroupError::new(
            if matches!(e.code, ErrorCode::StorageError | ErrorCode::StorageFull) {
                ErrorCode::CoordinatorNotAvailable
            } else {
                e.code
            },
            format!("cannot write to {OFFSETS_TOPIC}-{p}: {}", e.message),
        )
    })?;
    Ok(info.base_offset.0)
}

/// A partition's high watermark, -1 when it cannot be had.
async fn log_end(ctx: &Rc<ShardContext>, topic: &str, partition: u32) -> i64 {
    let owner = ctx.owner(topic, partition);
    if owner == ctx.id {
        return ctx.partition(topic, partition).map_or(-1, |p| p.log.high_watermark().0 as i64);
    }
    match ctx.call(owner, ShardOp::ListOffset { topic: topic.to_string(), partition, timestamp: -1 }).await {
        ShardReply::ListOffset(Ok((offset, _))) => offset,
        _ => -1,
    }
}
