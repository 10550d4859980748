//! Partition assignors, and the member metadata and assignments they
//! exchange in Kafka's ConsumerProtocol layout (big-endian; subscription v1:
//! version, topics, user data, owned partitions; assignment v1: version,
//! partitions, user data), so Kafka tools can read what the broker shows.
//!
//! The group leader runs the assignor the coordinator chose (Kafka's vote
//! among the protocols every member supports) over every member's
//! subscription; the broker never looks inside.
//!
//! `range` and `roundrobin` are eager: members revoke everything before
//! they rejoin, so nobody claims anything. `cooperative-sticky` is
//! incremental: members keep fetching through the rebalance and list what
//! they own; the assignor leaves owned partitions in place as far as
//! balance allows, and a partition that has to change hands moves in two
//! generations:
//!
//! ```text
//!   generation N:   a owns {0,1,2} ── assign ──> a {0,1}     d {}     (2 held back)
//!                   a revokes 2 (commit, on_revoked) and rejoins at once
//!   generation N+1: a owns {0,1}   ── assign ──> a {0,1}     d {2}
//! ```
//!
//! So no partition is ever handed to a member while another one still
//! claims it (`hold_back_transfers`, which the leader applies to every
//! assignor's answer).

use std::collections::{BTreeMap, BTreeSet};

/// Topic → partitions.
pub type Assignment = BTreeMap<String, Vec<u32>>;

/// What a member subscribes to, as sent in JoinGroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    pub topics: Vec<String>,
    pub user_data: Option<Vec<u8>>,
    /// What the member owns now (for sticky assignors).
    pub owned: Assignment,
}

/// A member as the leader sees it.
#[derive(Debug, Clone)]
pub struct MemberSubscription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub subscription: Subscription,
}

/// Computes the group's assignment on the leader.
pub trait Assignor: Send + Sync {
    /// The protocol name members advertise (`range`, `roundrobin`,
    /// `cooperative-sticky`).
    fn name(&self) -> &'static str;
    /// Members keep their partitions through a rebalance and revoke only
    /// what they lose (incremental cooperative rebalancing); else they
    /// revoke everything before rejoining (eager).
    fn cooperative(&self) -> bool {
        false
    }
    /// `partitions`: topic → partition count, for every subscribed topic.
    fn assign(
        &self,
        members: &[MemberSubscription],
        partitions: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, Assignment>;
}

/// Members in a stable order: static members by instance id, then the
/// others by member id (as Kafka sorts).
fn sorted(members: &[MemberSubscription]) -> Vec<&MemberSubscription> {
    let mut ms: Vec<&MemberSubscription> = members.iter().collect();
    ms.sort_by(|a, b| {
        let key = |m: &MemberSubscription| {
            (m.instance_id.clone().unwrap_or_else(|| m.member_id.clone()), m.member_id.clone())
        };
        key(a).cmp(&key(b))
    });
    ms
}

/// Kafka's range assignor: per topic, the members subscribed to it split
/// its partitions into contiguous ranges, the first ones one larger.
pub struct Range;

impl Assignor for Range {
    fn name(&self) -> &'static str {
        "range"
    }

    fn assign(
        &self,
        members: &[MemberSubscription],
        partitions: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, Assignment> {
        let mut out: BTreeMap<String, Assignment> =
            members.iter().map(|m| (m.member_id.clone(), Assignment::new())).collect();
        for (topic, &count) in partitions {
            let subs: Vec<&MemberSubscription> =
                sorted(members).into_iter().filter(|m| m.subscription.topics.contains(topic)).collect();
            if subs.is_empty() {
                continue;
            }
            let n = subs.len() as u32;
            let (each, extra) = (count / n, count % n);
            let mut next = 0;
            for (i, m) in subs.iter().enumerate() {
                let take = each + u32::from((i as u32) < extra);
                if take > 0 {
                    let a = out.entry(m.member_id.clone()).or_default();
                    a.entry(topic.clone()).or_default().extend(next..next + take);
                }
                next += take;
            }
        }
        out
    }
}

/// Kafka's round-robin assignor: every (topic, partition), in order, goes
/// to the next member (in order) subscribed to its topic.
pub struct RoundRobin;

impl Assignor for RoundRobin {
    fn name(&self) -> &'static str {
        "roundrobin"
    }

    fn assign(
        &self,
        members: &[MemberSubscription],
        partitions: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, Assignment> {
        let ms = sorted(members);
        let mut out: BTreeMap<String, Assignment> =
            members.iter().map(|m| (m.member_id.clone(), Assignment::new())).collect();
        if ms.is_empty() {
            return out;
        }
        let mut turn = 0usize;
        for (topic, &count) in partitions {
            for p in 0..count {
                // The next member in the ring that subscribes to `topic`.
                for _ in 0..ms.len() {
                    let m = ms[turn % ms.len()];
                    turn += 1;
                    if m.subscription.topics.contains(topic) {
                        out.entry(m.member_id.clone()).or_default().entry(topic.clone()).or_default().push(p);
                        break;
                    }
                }
            }
        }
        out
    }
}

/// Kafka's cooperative-sticky assignor: sticky and balanced (below), then
/// the cooperative rule (`hold_back_transfers`).
pub struct CooperativeSticky;

impl Assignor for CooperativeSticky {
    fn name(&self) -> &'static str {
        "cooperative-sticky"
    }

    fn cooperative(&self) -> bool {
        true
    }

    fn assign(
        &self,
        members: &[MemberSubscription],
        partitions: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, Assignment> {
        let mut out = sticky_balanced(members, partitions);
        hold_back_transfers(members, &mut out);
        out
    }
}

/// A (topic, partition) inside the assignors.
type Tp<'a> = (&'a str, u32);

/// The sticky assignment before the cooperative rule:
///
/// 1. A partition claimed (`Subscription::owned`) by exactly one member
///    that still subscribes to its topic stays with it. One claimed by
///    several (a generation conflict), or by nobody, is free.
/// 2. Free partitions, the most constrained first (fewest members
///    subscribed to their topic), go one by one to the least-loaded member
///    subscribed to their topic.
/// 3. While some member holds at least two more partitions than a member
///    that could take one of them, one moves (preferring partitions it got
///    in step 2 over those it owned, so the fewest have to be revoked).
///    Each move lowers the sum of the squared counts, so this ends; when it
///    has, members subscribed to the same topics differ by at most one.
fn sticky_balanced(
    members: &[MemberSubscription],
    partitions: &BTreeMap<String, u32>,
) -> BTreeMap<String, Assignment> {
    let ms = sorted(members);
    let mut eligible: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, m) in ms.iter().enumerate() {
        for t in &m.subscription.topics {
            if partitions.contains_key(t) && !eligible.get(t.as_str()).is_some_and(|e| e.contains(&i)) {
                eligible.entry(t.as_str()).or_default().push(i);
            }
        }
    }
    let claims = valid_claims(&ms, partitions, &eligible);
    let mut held: Vec<Vec<Tp>> = vec![Vec::new(); ms.len()];
    let mut kept: BTreeSet<(usize, Tp)> = BTreeSet::new();
    let mut free: Vec<Tp> = Vec::new();
    // Every topic in `eligible` exists and has a subscriber.
    for &topic in eligible.keys() {
        for p in 0..partitions[topic] {
            match claims.get(&(topic, p)).map(Vec::as_slice) {
                Some(&[owner]) => {
                    held[owner].push((topic, p));
                    kept.insert((owner, (topic, p)));
                }
                _ => free.push((topic, p)),
            }
        }
    }
    free.sort_by_key(|&(t, p)| (eligible[t].len(), t, p));
    for tp in free {
        let to = least_loaded(&held, &eligible[tp.0]);
        held[to].push(tp);
    }
    while let Some((from, tp, to)) = next_move(&held, &kept, &eligible) {
        held[from].retain(|q| *q != tp);
        held[to].push(tp);
    }
    let mut out: BTreeMap<String, Assignment> =
        members.iter().map(|m| (m.member_id.clone(), Assignment::new())).collect();
    for (i, tps) in held.into_iter().enumerate() {
        let a = out.entry(ms[i].member_id.clone()).or_default();
        for (t, p) in tps {
            a.entry(t.to_string()).or_default().push(p);
        }
        a.values_mut().for_each(|ps| ps.sort_unstable());
    }
    out
}

/// Partition → the members (indices into `ms`) that claim it and may keep
/// it: the partition exists and the member still subscribes to its topic.
fn valid_claims<'a>(
    ms: &[&'a MemberSubscription],
    partitions: &BTreeMap<String, u32>,
    eligible: &BTreeMap<&str, Vec<usize>>,
) -> BTreeMap<Tp<'a>, Vec<usize>> {
    let mut claims: BTreeMap<Tp<'a>, Vec<usize>> = BTreeMap::new();
    for (i, m) in ms.iter().enumerate() {
        for (t, ps) in &m.subscription.owned {
            let (Some(&count), Some(subs)) = (partitions.get(t), eligible.get(t.as_str())) else { continue };
            if !subs.contains(&i) {
                continue;
            }
            for &p in ps.iter().filter(|&&p| p < count) {
                let c = claims.entry((t.as_str(), p)).or_default();
                if !c.contains(&i) {
                    c.push(i);
                }
            }
        }
    }
    claims
}

/// The member of `candidates` holding the fewest partitions (the first on ties).
fn least_loaded(held: &[Vec<Tp>], candidates: &[usize]) -> usize {
    *candidates
        .iter()
        .min_by_key(|&&i| (held[i].len(), i))
        .expect("a topic with partitions to assign has subscribers")
}

/// One balancing move (from, partition, to), the most loaded member first;
/// `None` once no move narrows a gap of two or more.
fn next_move<'a>(
    held: &[Vec<Tp<'a>>],
    kept: &BTreeSet<(usize, Tp<'a>)>,
    eligible: &BTreeMap<&str, Vec<usize>>,
) -> Option<(usize, Tp<'a>, usize)> {
    let mut order: Vec<usize> = (0..held.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(held[i].len()), i));
    order.into_iter().find_map(|from| {
        // Partitions it did not own before first (moving them revokes
        // nothing), the last taken first.
        let (fresh, owned): (Vec<Tp>, Vec<Tp>) =
            held[from].iter().rev().partition(|tp| !kept.contains(&(from, **tp)));
        fresh.into_iter().chain(owned).find_map(|tp| {
            let to = least_loaded(held, &eligible[tp.0]);
            (held[to].len() + 2 <= held[from].len()).then_some((from, tp, to))
        })
    })
}

/// The cooperative rule, applied by the leader to every assignor's answer:
/// a partition that another member still claims (lists in `owned`) is
/// taken out of its new owner's assignment for this generation. The
/// claimant, not given it, revokes it and rejoins; the next generation
/// hands it on. Returns how many partitions were held back.
pub fn hold_back_transfers(members: &[MemberSubscription], out: &mut BTreeMap<String, Assignment>) -> usize {
    let mut claimants: BTreeMap<Tp, Vec<&str>> = BTreeMap::new();
    for m in members {
        for (t, ps) in &m.subscription.owned {
            for &p in ps {
                claimants.entry((t.as_str(), p)).or_default().push(m.member_id.as_str());
            }
        }
    }
    let mut held_back = 0;
    for (member, a) in out.iter_mut() {
        for (t, ps) in a.iter_mut() {
            let before = ps.len();
            ps.retain(|&p| {
                claimants.get(&(t.as_str(), p)).is_none_or(|c| c.iter().all(|id| *id == member.as_str()))
            });
            held_back += before - ps.len();
        }
        a.retain(|_, ps| !ps.is_empty());
    }
    held_back
}

/// The assignor named `name` among the built-in ones.
#[must_use]
pub fn by_name(name: &str) -> Option<Box<dyn Assignor>> {
    match name {
        "range" => Some(Box::new(Range)),
        "roundrobin" => Some(Box::new(RoundRobin)),
        "cooperative-sticky" => Some(Box::new(CooperativeSticky)),
        _ => None,
    }
}

// ------------------------------------------------------------------ encoding

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed consumer protocol data: {0}")]
pub struct DecodeError(&'static str);

struct W(Vec<u8>);

impl W {
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn str(&mut self, s: &str) {
        self.i16(i16::try_from(s.len()).unwrap_or(i16::MAX));
        self.0.extend_from_slice(&s.as_bytes()[..s.len().min(i16::MAX as usize)]);
    }
    fn bytes(&mut self, b: Option<&[u8]>) {
        match b {
            None => self.i32(-1),
            Some(b) => {
                self.i32(i32::try_from(b.len()).unwrap_or(i32::MAX));
                self.0.extend_from_slice(b);
            }
        }
    }
    fn partitions(&mut self, a: &Assignment) {
        self.i32(a.len() as i32);
        for (t, ps) in a {
            self.str(t);
            self.i32(ps.len() as i32);
            for p in ps {
                self.i32(*p as i32);
            }
        }
    }
}

struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().map_err(|_| DecodeError("truncated"))?))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().map_err(|_| DecodeError("truncated"))?))
    }
    fn count(&mut self) -> Result<usize, DecodeError> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(0);
        }
        // Each element takes at least 2 bytes: a corrupt count cannot allocate past the input.
        Ok((n as usize).min(self.0.len() / 2 + 1))
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| DecodeError("negative string length"))?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError("string is not UTF-8"))
    }
    fn bytes(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }
    fn partitions(&mut self) -> Result<Assignment, DecodeError> {
        let mut a = Assignment::new();
        for _ in 0..self.count()? {
            let t = self.str()?;
            let mut ps = Vec::new();
            for _ in 0..self.count()? {
                ps.push(u32::try_from(self.i32()?).map_err(|_| DecodeError("negative partition"))?);
            }
            a.entry(t).or_default().extend(ps);
        }
        Ok(a)
    }
}

impl Subscription {
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::new());
        w.i16(1);
        w.i32(self.topics.len() as i32);
        for t in &self.topics {
            w.str(t);
        }
        w.bytes(self.user_data.as_deref());
        w.partitions(&self.owned);
        w.0
    }

    pub fn decode(b: &[u8]) -> Result<Subscription, DecodeError> {
        let mut r = R(b);
        let version = r.i16()?;
        let mut topics = Vec::new();
        for _ in 0..r.count()? {
            topics.push(r.str()?);
        }
        let user_data = r.bytes()?;
        let owned = if version >= 1 && !r.0.is_empty() { r.partitions()? } else { Assignment::new() };
        Ok(Subscription { topics, user_data, owned })
    }
}

/// Encodes a member's assignment (ConsumerProtocolAssignment v1).
#[must_use]
pub fn encode_assignment(a: &Assignment) -> Vec<u8> {
    let mut w = W(Vec::new());
    w.i16(1);
    w.partitions(a);
    w.bytes(None);
    w.0
}

/// Decodes an assignment; empty bytes are an empty assignment.
pub fn decode_assignment(b: &[u8]) -> Result<Assignment, DecodeError> {
    if b.is_empty() {
        return Ok(Assignment::new());
    }
    let mut r = R(b);
    r.i16()?;
    r.partitions()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, topics: &[&str]) -> MemberSubscription {
        MemberSubscription {
            member_id: id.into(),
            instance_id: None,
            subscription: Subscription {
                topics: topics.iter().map(|t| t.to_string()).collect(),
                ..Default::default()
            },
        }
    }

    fn all(out: &BTreeMap<String, Assignment>) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = out
            .values()
            .flat_map(|a| a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p))))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn three_members_six_partitions_two_each_every_partition_once() {
        let ms = [member("a", &["t"]), member("b", &["t"]), member("c", &["t"])];
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        for assignor in [&Range as &dyn Assignor, &RoundRobin] {
            let out = assignor.assign(&ms, &parts);
            for m in ["a", "b", "c"] {
                assert_eq!(out[m]["t"].len(), 2, "{}: {out:?}", assignor.name());
            }
            assert_eq!(all(&out), (0..6).map(|p| ("t".to_string(), p)).collect::<Vec<_>>());
        }
        assert_eq!(Range.assign(&ms, &parts)["a"]["t"], [0, 1]);
        assert_eq!(RoundRobin.assign(&ms, &parts)["a"]["t"], [0, 3]);
    }

    #[test]
    fn uneven_counts_and_partial_subscriptions() {
        let ms = [member("a", &["t", "u"]), member("b", &["t"])];
        let parts = BTreeMap::from([("t".to_string(), 3), ("u".to_string(), 2)]);
        let out = Range.assign(&ms, &parts);
        assert_eq!(out["a"]["t"], [0, 1]);
        assert_eq!(out["b"]["t"], [2]);
        assert_eq!(out["a"]["u"], [0, 1], "only a subscribes to u");
        let out = RoundRobin.assign(&ms, &parts);
        assert_eq!(all(&out).len(), 5);
        assert!(!out["b"].contains_key("u"));
    }

    #[test]
    fn encodings_round_trip_and_reject_damage() {
        let s = Subscription {
            topics: vec!["t".into(), "u".into()],
            user_data: Some(vec![1]),
            owned: BTreeMap::from([("t".to_string(), vec![0, 2])]),
        };
        assert_eq!(Subscription::decode(&s.encode()), Ok(s.clone()));
        let a = BTreeMap::from([("t".to_string(), vec![1, 3]), ("u".to_string(), vec![0])]);
        assert_eq!(decode_assignment(&encode_assignment(&a)), Ok(a));
        assert_eq!(decode_assignment(&[]), Ok(Assignment::new()));
        let bytes = s.encode();
        assert!(Subscription::decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(decode_assignment(&[0, 1, 0, 0, 0, 9]).is_err());
    }

    fn owning(id: &str, topics: &[&str], owned: &[(&str, &[u32])]) -> MemberSubscription {
        let mut m = member(id, topics);
        m.subscription.owned = owned.iter().map(|(t, ps)| (t.to_string(), ps.to_vec())).collect();
        m
    }

    /// The members again, each owning what `out` gave it (the next round).
    fn next_round(ms: &[MemberSubscription], out: &BTreeMap<String, Assignment>) -> Vec<MemberSubscription> {
        ms.iter()
            .map(|m| {
                let mut m = m.clone();
                m.subscription.owned = out[&m.member_id].clone();
                m
            })
            .collect()
    }

    fn counts(out: &BTreeMap<String, Assignment>) -> Vec<usize> {
        let mut c: Vec<usize> = out.values().map(|a| a.values().map(Vec::len).sum()).collect();
        c.sort_unstable();
        c
    }

    fn t(ps: &[u32]) -> Assignment {
        BTreeMap::from([("t".to_string(), ps.to_vec())])
    }

    #[test]
    fn cooperative_sticky_a_joining_member_takes_one_partition_in_two_generations() {
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        let ms = [
            owning("a", &["t"], &[("t", &[0, 1])]),
            owning("b", &["t"], &[("t", &[2, 3])]),
            owning("c", &["t"], &[("t", &[4, 5])]),
            member("d", &["t"]),
        ];
        let first = CooperativeSticky.assign(&ms, &parts);
        // One partition has to move to d: this generation only takes it from
        // its owner; the other five stay where they were.
        assert_eq!(all(&first).len(), 5, "{first:?}");
        assert_eq!(first["d"], Assignment::new());
        let mut lost = Vec::new();
        for m in &ms[..3] {
            let kept = &first[&m.member_id];
            assert!(kept["t"].iter().all(|p| m.subscription.owned["t"].contains(p)), "{first:?}");
            lost.extend(m.subscription.owned["t"].iter().filter(|p| !kept["t"].contains(p)));
        }
        assert_eq!(lost.len(), 1, "exactly one partition revoked: {first:?}");
        let second = CooperativeSticky.assign(&next_round(&ms, &first), &parts);
        assert_eq!(second["d"], t(&lost), "the next generation hands it on");
        for m in ["a", "b", "c"] {
            assert_eq!(second[m], first[m], "{m} keeps what it kept");
        }
        assert_eq!(counts(&second), [1, 1, 2, 2]);
    }

    #[test]
    fn cooperative_sticky_balances_a_fresh_group_over_two_topics() {
        let parts = BTreeMap::from([("t".to_string(), 4), ("u".to_string(), 3)]);
        let ms = [member("a", &["t", "u"]), member("b", &["t", "u"]), member("c", &["t", "u"])];
        let out = CooperativeSticky.assign(&ms, &parts);
        assert_eq!(all(&out).len(), 7, "nothing owned, nothing held back: {out:?}");
        assert_eq!(counts(&out), [2, 2, 3]);
        // Only b subscribes to u: it gets all of u, and a all of t.
        let ms = [member("a", &["t"]), member("b", &["t", "u"])];
        let out = CooperativeSticky.assign(&ms, &parts);
        assert_eq!(out["a"], t(&[0, 1, 2, 3]));
        assert_eq!(out["b"], BTreeMap::from([("u".to_string(), vec![0, 1, 2])]));
    }

    #[test]
    fn cooperative_sticky_a_leaving_member_s_partitions_go_to_the_others_and_nothing_is_revoked() {
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        // a (owning 0 and 1) has left.
        let ms = [
            owning("b", &["t"], &[("t", &[2, 3])]),
            owning("c", &["t"], &[("t", &[4])]),
            owning("d", &["t"], &[("t", &[5])]),
        ];
        let out = CooperativeSticky.assign(&ms, &parts);
        assert_eq!(out["b"], t(&[2, 3]));
        assert_eq!(out["c"], t(&[0, 4]));
        assert_eq!(out["d"], t(&[1, 5]));
    }

    #[test]
    fn cooperative_sticky_conflicting_and_stale_claims() {
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        // a and b both claim 0; c claims a partition that no longer exists
        // and one of a topic it no longer subscribes to.
        let ms = [
            owning("a", &["t"], &[("t", &[0, 1])]),
            owning("b", &["t"], &[("t", &[0, 2])]),
            owning("c", &["t"], &[("t", &[9]), ("gone", &[0])]),
        ];
        let first = CooperativeSticky.assign(&ms, &parts);
        assert!(first.values().all(|a| !a.get("t").is_some_and(|ps| ps.contains(&0))), "{first:?}");
        assert!(first["a"]["t"].contains(&1) && first["b"]["t"].contains(&2));
        let second = CooperativeSticky.assign(&next_round(&ms, &first), &parts);
        assert_eq!(all(&second).len(), 6, "{second:?}");
        assert_eq!(counts(&second), [2, 2, 2]);
    }

    #[test]
    fn the_leader_holds_back_what_an_eager_assignor_hands_over() {
        // A cooperative member kept 0..3 through the join; the group chose
        // range (a member that only knows range joined).
        let parts = BTreeMap::from([("t".to_string(), 4)]);
        let ms = [owning("a", &["t"], &[("t", &[0, 1, 2, 3])]), member("b", &["t"])];
        let mut out = Range.assign(&ms, &parts);
        assert_eq!(hold_back_transfers(&ms, &mut out), 2);
        assert_eq!(out["a"], t(&[0, 1]));
        assert_eq!(out["b"], Assignment::new());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        const TOPICS: [&str; 3] = ["t", "u", "v"];

        /// A member: a subscription mask over `TOPICS` and its claims
        /// (topic index, partition), some out of range, some shared with
        /// other members.
        type Member = (u8, Vec<(usize, u32)>);

        /// Partition counts per topic, and the members.
        fn group() -> impl Strategy<Value = (Vec<u32>, Vec<Member>)> {
            (
                prop::collection::vec(0..10u32, 3),
                prop::collection::vec((1..8u8, prop::collection::vec((0..3usize, 0..12u32), 0..8)), 1..7),
            )
        }

        fn build(
            counts: &[u32],
            members: &[Member],
            same_topics: bool,
        ) -> (Vec<MemberSubscription>, BTreeMap<String, u32>) {
            let parts = TOPICS.iter().zip(counts).map(|(t, c)| (t.to_string(), *c)).collect();
            let ms = members
                .iter()
                .enumerate()
                .map(|(i, (mask, claims))| {
                    let mask = if same_topics { 7 } else { *mask };
                    let topics: Vec<&str> = TOPICS
                        .iter()
                        .enumerate()
                        .filter(|(b, _)| mask & (1 << b) != 0)
                        .map(|(_, t)| *t)
                        .collect();
                    let mut m = member(&format!("m{i}"), &topics);
                    for (ti, p) in claims {
                        m.subscription.owned.entry(TOPICS[*ti].to_string()).or_default().push(*p);
                    }
                    m
                })
                .collect();
            (ms, parts)
        }

        /// Each assigned partition exists, goes to one member subscribed to
        /// its topic, and to none while another member claims it.
        fn check_sound(
            ms: &[MemberSubscription],
            parts: &BTreeMap<String, u32>,
            out: &BTreeMap<String, Assignment>,
        ) {
            let mut owner: BTreeMap<(String, u32), &str> = BTreeMap::new();
            for m in ms {
                for (t, ps) in &out[&m.member_id] {
                    assert!(
                        m.subscription.topics.contains(t),
                        "{t} to {} which does not subscribe",
                        m.member_id
                    );
                    for &p in ps {
                        assert!(p < parts[t], "{t}/{p} does not exist");
                        assert_eq!(
                            owner.insert((t.clone(), p), &m.member_id),
                            None,
                            "{t}/{p} twice: {out:?}"
                        );
                        for other in ms.iter().filter(|o| o.member_id != m.member_id) {
                            assert!(
                                !other.subscription.owned.get(t).is_some_and(|o| o.contains(&p)),
                                "{t}/{p} handed to {} while {} claims it",
                                m.member_id,
                                other.member_id
                            );
                        }
                    }
                }
            }
        }

        proptest! {
            #[test]
            fn every_round_is_sound_and_same_subscriptions_are_balanced((sizes, members) in group()) {
                let (ms, parts) = build(&sizes, &members, false);
                let out = CooperativeSticky.assign(&ms, &parts);
                check_sound(&ms, &parts, &out);
                let before = sticky_balanced(&ms, &parts);
                for a in &ms {
                    for b in ms.iter().filter(|b| b.subscription.topics == a.subscription.topics) {
                        let n = |m: &MemberSubscription| before[&m.member_id].values().map(Vec::len).sum::<usize>();
                        prop_assert!(n(a) <= n(b) + 1, "{} and {} subscribe alike: {before:?}", a.member_id, b.member_id);
                    }
                }
            }

            #[test]
            fn the_second_round_assigns_everything_balanced_and_revokes_nothing((sizes, members) in group()) {
                let (ms, parts) = build(&sizes, &members, true);
                let first = CooperativeSticky.assign(&ms, &parts);
                let ms2 = next_round(&ms, &first);
                let second = CooperativeSticky.assign(&ms2, &parts);
                check_sound(&ms2, &parts, &second);
                prop_assert_eq!(all(&second).len(), sizes.iter().sum::<u32>() as usize);
                let c = counts(&second);
                prop_assert!(c[c.len() - 1] <= c[0] + 1, "unbalanced: {second:?}");
                for m in &ms2 {
                    for (t, ps) in &m.subscription.owned {
                        let now = second[&m.member_id].get(t);
                        prop_assert!(ps.iter().all(|p| now.is_some_and(|n| n.contains(p))), "{} lost {t}", m.member_id);
                    }
                }
            }
        }
    }
}
