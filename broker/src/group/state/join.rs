//! The join half of a group's state machine (see `state`): members joining
//! and rejoining (static members fenced by instance id), the start of a
//! rebalance, and its completion with the protocol the members vote for.

use super::*;

impl Group {
    pub(super) fn new_member_id(&mut self, client_id: &str, shard: u16) -> String {
        self.next_member += 1;
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let prefix = if client_id.is_empty() { "member" } else { client_id };
        format!("{prefix}-{shard}-{nanos:x}-{}", self.next_member)
    }

    /// Whether every member supports some protocol `protocols` also names.
    pub(super) fn protocols_fit(
        &self,
        protocol_type: &str,
        protocols: &[Protocol],
        except: Option<&str>,
    ) -> bool {
        if self.members.values().all(|m| Some(m.id.as_str()) == except) {
            return true;
        }
        if self.protocol_type.as_deref().is_some_and(|t| t != protocol_type) {
            return false;
        }
        protocols
            .iter()
            .any(|p| self.members.values().all(|m| Some(m.id.as_str()) == except || m.supports(&p.name)))
    }

    pub fn join(&mut self, req: JoinGroup, now: Instant, limits: Limits, shard: u16) -> JoinStep {
        if self.state == GroupState::Dead {
            return JoinStep::Done(err(ErrorCode::CoordinatorNotAvailable, "the group is being deleted"));
        }
        let existing = (!req.member_id.is_empty()).then(|| req.member_id.clone());
        if !self.protocols_fit(&req.protocol_type, &req.protocols, existing.as_deref()) {
            return JoinStep::Done(err(
                ErrorCode::InconsistentGroupProtocol,
                format!(
                    "none of the protocols {:?} (type `{}`) is supported by every member of group `{}`",
                    req.protocols.iter().map(|p| &p.name).collect::<Vec<_>>(),
                    req.protocol_type,
                    self.id
                ),
            ));
        }
        match existing {
            None => match req.instance_id.clone().and_then(|i| self.statics.get(&i).cloned()) {
                Some(old) => self.rejoin_static(req, old, now, limits, shard),
                None => self.join_new(req, now, limits, shard),
            },
            Some(id) => self.rejoin(req, id, now, limits),
        }
    }

    pub(super) fn join_new(&mut self, req: JoinGroup, now: Instant, limits: Limits, shard: u16) -> JoinStep {
        if self.members.len() >= limits.members_max {
            return JoinStep::Done(err(
                ErrorCode::GroupMaxSizeReached,
                format!(
                    "group `{}` has {} members, the most group.max.size allows",
                    self.id, limits.members_max
                ),
            ));
        }
        let id = self.new_member_id(&req.client_id, shard);
        if let Some(i) = &req.instance_id {
            self.statics.insert(i.clone(), id.clone());
        }
        let (tx, rx) = waiter();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.members.insert(
            id.clone(),
            Member {
                id,
                instance_id: req.instance_id,
                client_id: req.client_id,
                client_host: req.client_host,
                session_timeout: req.session_timeout,
                rebalance_timeout: req.rebalance_timeout,
                protocols: req.protocols,
                assignment: Vec::new(),
                last_seen: now,
                join: Some(tx),
                sync: None,
                seq,
            },
        );
        if self.protocol_type.is_none() {
            self.protocol_type = Some(req.protocol_type);
        }
        self.prepare_rebalance(now, limits);
        self.try_complete_join(now);
        JoinStep::Wait(rx)
    }

    /// A static member with a known instance id joined with no member id:
    /// it restarted. It takes over the old member's place under a new id;
    /// the old id is fenced. In a stable group with unchanged metadata it
    /// gets its old assignment back without a rebalance.
    pub(super) fn rejoin_static(
        &mut self,
        req: JoinGroup,
        old: String,
        now: Instant,
        limits: Limits,
        shard: u16,
    ) -> JoinStep {
        let Some(mut member) = self.members.remove(&old) else {
            // The mapping outlived its member: treat as new.
            self.statics.remove(req.instance_id.as_deref().unwrap_or_default());
            return self.join_new(req, now, limits, shard);
        };
        let fenced = || {
            GroupError::new(
                ErrorCode::FencedInstanceId,
                "another member with the same group instance id joined",
            )
        };
        answer(member.join.take(), Err(fenced()));
        answer(member.sync.take(), Err(fenced()));
        let id = self.new_member_id(&req.client_id, shard);
        let unchanged = member.protocols == req.protocols;
        member.id = id.clone();
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        member.session_timeout = req.session_timeout;
        member.rebalance_timeout = req.rebalance_timeout;
        member.protocols = req.protocols.clone();
        member.last_seen = now;
        if let Some(i) = &req.instance_id {
            self.statics.insert(i.clone(), id.clone());
        }
        let was_leader = self.leader.as_deref() == Some(old.as_str());
        if was_leader {
            self.leader = Some(id.clone());
        }
        self.members.insert(id.clone(), member);
        match self.state {
            GroupState::Stable if unchanged => {
                let protocol = self.protocol.clone().unwrap_or_default();
                let joined = Joined {
                    generation: self.generation,
                    protocol_type: self.protocol_type.clone().unwrap_or_default(),
                    protocol: protocol.clone(),
                    leader: self.leader.clone().unwrap_or_default(),
                    member_id: id,
                    members: if was_leader { self.join_members(&protocol) } else { Vec::new() },
                    skip_assignment: was_leader,
                };
                JoinStep::Rejoined(joined, self.record(now_ms()))
            }
            _ => {
                let (tx, rx) = waiter();
                if let Some(m) = self.members.get_mut(&id) {
                    m.join = Some(tx);
                }
                self.prepare_rebalance(now, limits);
                self.try_complete_join(now);
                JoinStep::Wait(rx)
            }
        }
    }

    pub(super) fn rejoin(&mut self, req: JoinGroup, id: String, now: Instant, limits: Limits) -> JoinStep {
        if let Err(e) = self.check_member(&id, req.instance_id.as_deref()) {
            return JoinStep::Done(Err(e));
        }
        let leader = self.leader.as_deref() == Some(id.as_str());
        let state = self.state;
        let Some(m) = self.members.get_mut(&id) else {
            return JoinStep::Done(err(ErrorCode::UnknownMemberId, "unknown member"));
        };
        let changed = m.protocols != req.protocols;
        m.protocols = req.protocols;
        m.session_timeout = req.session_timeout;
        m.rebalance_timeout = req.rebalance_timeout;
        m.last_seen = now;
        let (tx, rx) = waiter();
        if let Some(old) = m.join.replace(tx) {
            answer(Some(old), err(ErrorCode::RebalanceInProgress, "the member joined again"));
        }
        if state == GroupState::Stable && !changed && !leader {
            // Nothing new: answer with the current generation.
            let protocol = self.protocol.clone().unwrap_or_default();
            let joined = Joined {
                generation: self.generation,
                protocol_type: self.protocol_type.clone().unwrap_or_default(),
                protocol,
                leader: self.leader.clone().unwrap_or_default(),
                member_id: id.clone(),
                members: Vec::new(),
                skip_assignment: false,
            };
            if let Some(m) = self.members.get_mut(&id) {
                m.join = None;
            }
            return JoinStep::Done(Ok(joined));
        }
        self.prepare_rebalance(now, limits);
        self.try_complete_join(now);
        JoinStep::Wait(rx)
    }

    /// Unknown member, or a static member whose id was replaced.
    pub(super) fn check_member(&self, member_id: &str, instance_id: Option<&str>) -> GroupResult<()> {
        if let Some(i) = instance_id {
            match self.statics.get(i) {
                Some(current) if current != member_id => {
                    return err(
                        ErrorCode::FencedInstanceId,
                        format!("instance id `{i}` now belongs to member `{current}`, not `{member_id}`"),
                    )
                }
                _ => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return err(
                ErrorCode::UnknownMemberId,
                format!("`{member_id}` is not a member of group `{}` (expired or left?)", self.id),
            );
        }
        Ok(())
    }

    pub(super) fn check_generation(&self, generation: i32) -> GroupResult<()> {
        if generation != self.generation {
            return err(
                ErrorCode::IllegalGeneration,
                format!(
                    "generation {generation} is not group `{}`'s current generation {}",
                    self.id, self.generation
                ),
            );
        }
        Ok(())
    }

    /// Starts a rebalance (or extends nothing if one is in progress).
    pub(super) fn prepare_rebalance(&mut self, now: Instant, limits: Limits) {
        match self.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                for m in self.members.values_mut() {
                    answer(
                        m.sync.take(),
                        err(ErrorCode::RebalanceInProgress, "the group is rebalancing again"),
                    );
                }
            }
            GroupState::Empty | GroupState::Stable => {}
        }
        let was_empty = self.state == GroupState::Empty;
        let longest = self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or_default();
        self.initial_rebalance = was_empty && !limits.initial_rebalance_delay.is_zero();
        let wait = if self.initial_rebalance { limits.initial_rebalance_delay.min(longest) } else { longest };
        self.rebalance_deadline = Some(now + wait);
        self.state = GroupState::PreparingRebalance;
        tracing::debug!(group = %self.id, generation = self.generation, members = self.members.len(), "rebalance");
    }

    /// Completes the join phase once every member has rejoined (not during
    /// an empty group's initial delay) or the deadline has passed.
    pub(super) fn try_complete_join(&mut self, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let due = self.rebalance_deadline.is_some_and(|d| now >= d);
        let all = self.members.values().all(|m| m.join.is_some());
        if !(due || (all && !self.initial_rebalance)) {
            return;
        }
        // Members that did not rejoin in time leave the group.
        let gone: Vec<String> =
            self.members.values().filter(|m| m.join.is_none()).map(|m| m.id.clone()).collect();
        for id in gone {
            tracing::info!(group = %self.id, member = %id, "member did not rejoin in time: removed");
            self.remove_member(&id);
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        self.rebalance_deadline = None;
        self.initial_rebalance = false;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            self.protocol_type = None;
            return;
        }
        self.protocol = self.vote();
        let keep_leader = self.leader.as_ref().is_some_and(|l| self.members.contains_key(l));
        if !keep_leader {
            self.leader = self.members.values().min_by_key(|m| m.seq).map(|m| m.id.clone());
        }
        self.state = GroupState::CompletingRebalance;
        let protocol = self.protocol.clone().unwrap_or_default();
        let all_members = self.join_members(&protocol);
        let leader = self.leader.clone().unwrap_or_default();
        let (generation, protocol_type) = (self.generation, self.protocol_type.clone().unwrap_or_default());
        for m in self.members.values_mut() {
            m.last_seen = now;
            let is_leader = m.id == leader;
            answer(
                m.join.take(),
                Ok(Joined {
                    generation,
                    protocol_type: protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: m.id.clone(),
                    members: if is_leader { all_members.clone() } else { Vec::new() },
                    skip_assignment: false,
                }),
            );
        }
    }

    pub(super) fn join_members(&self, protocol: &str) -> Vec<JoinMember> {
        let mut ms: Vec<&Member> = self.members.values().collect();
        ms.sort_by_key(|m| m.seq);
        ms.into_iter()
            .map(|m| JoinMember {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                metadata: m.metadata_for(protocol),
            })
            .collect()
    }

    /// Kafka's vote: among protocols every member supports, each member
    /// votes for the first in its own order; most votes wins (ties: the
    /// earliest member's preference).
    pub(super) fn vote(&self) -> Option<String> {
        let mut ms: Vec<&Member> = self.members.values().collect();
        ms.sort_by_key(|m| m.seq);
        let candidates: Vec<&str> = ms
            .first()?
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| ms.iter().all(|m| m.supports(name)))
            .collect();
        let mut votes: Vec<(&str, usize)> = candidates.iter().map(|c| (*c, 0)).collect();
        for m in &ms {
            if let Some(first) = m.protocols.iter().find(|p| candidates.contains(&p.name.as_str())) {
                if let Some(v) = votes.iter_mut().find(|(c, _)| *c == first.name) {
                    v.1 += 1;
                }
            }
        }
        let best = votes.iter().map(|(_, n)| *n).max()?;
        votes.into_iter().find(|(_, n)| *n == best).map(|(c, _)| c.to_string())
    }
}
