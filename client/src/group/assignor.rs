//! Partition assignors, and the member metadata and assignments they
//! exchange in Kafka's ConsumerProtocol layout (big-endian; subscription v1:
//! version, topics, user data, owned partitions; assignment v1: version,
//! partitions, user data), so Kafka tools can read what the broker shows.
//!
//! The group leader runs the assignor the coordinator chose (the first of
//! the members' preferences that all support) over every member's
//! subscription; the broker never looks inside.

use std::collections::BTreeMap;

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
    /// The protocol name members advertise (`range`, `roundrobin`).
    fn name(&self) -> &'static str;
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

/// The assignor named `name` among the built-in ones.
#[must_use]
pub fn by_name(name: &str) -> Option<Box<dyn Assignor>> {
    match name {
        "range" => Some(Box::new(Range)),
        "roundrobin" => Some(Box::new(RoundRobin)),
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
}
