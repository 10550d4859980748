//! Where the controller puts a new topic's partitions: a pure function of
//! the live brokers, their racks and the partitions each already leads.
//!
//! The first replica of a partition is its preferred leader. Brokers are
//! ordered rack by rack alternately (Kafka's rack-alternating list: the
//! first broker of each rack, then the second of each, ...), and each
//! partition's leader is the least-loaded broker, ties broken by that order
//! starting after the previous choice; its followers are the brokers after
//! it in that order. So a new topic spreads evenly (counts differ by at
//! most one), a partition's replicas and consecutive partitions land on
//! different racks where there are racks, and a new topic fills the brokers
//! that lead less, which balances leaders across topics (a broker that
//! joined later gets the partitions of new topics).

use std::collections::BTreeMap;

/// A live broker, as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i32,
    pub rack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("no live broker to place partitions on")]
    NoBrokers,
    #[error("replication factor {factor} is larger than the {live} live broker(s): every replica needs a broker of its own")]
    ReplicationFactor { factor: u16, live: usize },
    #[error("replication factor must be at least 1")]
    NoReplicas,
    #[error("a topic needs at least one partition")]
    NoPartitions,
}

/// The rack-alternating order of `brokers` (by id within a rack; brokers
/// without a rack form one group of their own, listed after the racks).
#[must_use]
pub fn rack_alternating(brokers: &[Candidate]) -> Vec<i32> {
    let mut by_rack: BTreeMap<(bool, &str), Vec<i32>> = BTreeMap::new();
    for b in brokers {
        let key = (b.rack.is_none(), b.rack.as_deref().unwrap_or(""));
        by_rack.entry(key).or_default().push(b.id);
    }
    for ids in by_rack.values_mut() {
        ids.sort_unstable();
        ids.dedup();
    }
    let longest = by_rack.values().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(brokers.len());
    for i in 0..longest {
        order.extend(by_rack.values().filter_map(|ids| ids.get(i).copied()));
    }
    order
}

/// The replica list of each of `partitions` new partitions. `leading`:
/// how many partitions each broker leads already (absent: none).
pub fn place(
    partitions: u32,
    replication_factor: u16,
    brokers: &[Candidate],
    leading: &BTreeMap<i32, usize>,
) -> Result<Vec<Vec<i32>>, PlacementError> {
    if replication_factor == 0 {
        return Err(PlacementError::NoReplicas);
    }
    if partitions == 0 {
        return Err(PlacementError::NoPartitions);
    }
    let order = rack_alternating(brokers);
    if order.is_empty() {
        return Err(PlacementError::NoBrokers);
    }
    if usize::from(replication_factor) > order.len() {
        return Err(PlacementError::ReplicationFactor { factor: replication_factor, live: order.len() });
    }
    let mut load: Vec<usize> = order.iter().map(|id| leading.get(id).copied().unwrap_or(0)).collect();
    let mut next = 0;
    let mut out = Vec::with_capacity(partitions as usize);
    for _ in 0..partitions {
        let n = order.len();
        let pick = (0..n).map(|k| (next + k) % n).min_by_key(|&i| load[i]).unwrap_or(0);
        load[pick] += 1;
        out.push((0..usize::from(replication_factor)).map(|j| order[(pick + j) % n]).collect());
        next = (pick + 1) % n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(spec: &[(i32, Option<&str>)]) -> Vec<Candidate> {
        spec.iter().map(|(id, rack)| Candidate { id: *id, rack: rack.map(str::to_string) }).collect()
    }

    fn counts(placed: &[Vec<i32>]) -> BTreeMap<i32, usize> {
        let mut c = BTreeMap::new();
        for r in placed {
            *c.entry(r[0]).or_insert(0) += 1;
        }
        c
    }

    #[test]
    fn spreads_evenly_round_robin() {
        let b = brokers(&[(3, None), (1, None), (2, None)]);
        let placed = place(12, 1, &b, &BTreeMap::new()).expect("placed");
        assert_eq!(counts(&placed), BTreeMap::from([(1, 4), (2, 4), (3, 4)]));
        let firsts: Vec<i32> = placed.iter().take(3).map(|r| r[0]).collect();
        assert_eq!(firsts, vec![1, 2, 3]);
        let placed = place(7, 1, &b, &BTreeMap::new()).expect("placed");
        let c = counts(&placed);
        assert!(c.values().max().unwrap() - c.values().min().unwrap() <= 1, "{c:?}");
    }

    #[test]
    fn new_topics_go_to_brokers_that_lead_less() {
        let b = brokers(&[(1, None), (2, None), (3, None)]);
        // Broker 3 joined after a 6-partition topic went to 1 and 2.
        let leading = BTreeMap::from([(1, 3), (2, 3)]);
        let placed = place(3, 1, &b, &leading).expect("placed");
        assert_eq!(counts(&placed), BTreeMap::from([(3, 3)]));
        let placed = place(6, 1, &b, &leading).expect("placed");
        assert_eq!(counts(&placed), BTreeMap::from([(1, 1), (2, 1), (3, 4)]));
    }

    #[test]
    fn consecutive_partitions_alternate_racks() {
        let b = brokers(&[(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b")), (5, None)]);
        assert_eq!(rack_alternating(&b), vec![1, 3, 5, 2, 4]);
        let two_racks = brokers(&[(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b"))]);
        let placed = place(8, 1, &two_racks, &BTreeMap::new()).expect("placed");
        let rack = |id: i32| if id <= 2 { "a" } else { "b" };
        for w in placed.windows(2) {
            assert_ne!(rack(w[0][0]), rack(w[1][0]), "{placed:?}");
        }
        assert_eq!(counts(&placed).values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2]);
    }

    #[test]
    fn replicas_go_to_distinct_brokers_and_racks() {
        let b = brokers(&[(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b"))]);
        let placed = place(8, 3, &b, &BTreeMap::new()).expect("placed");
        let rack = |id: i32| if id <= 2 { "a" } else { "b" };
        for r in &placed {
            assert_eq!(r.len(), 3);
            let mut ids = r.clone();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 3, "distinct brokers: {r:?}");
            assert_ne!(rack(r[0]), rack(r[1]), "leader and first follower on different racks: {r:?}");
        }
        assert_eq!(counts(&placed).values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2], "leaders spread");
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let b = brokers(&[(1, None)]);
        assert_eq!(
            place(1, 3, &b, &BTreeMap::new()),
            Err(PlacementError::ReplicationFactor { factor: 3, live: 1 })
        );
        assert_eq!(place(1, 0, &b, &BTreeMap::new()), Err(PlacementError::NoReplicas));
        assert_eq!(place(1, 1, &[], &BTreeMap::new()), Err(PlacementError::NoBrokers));
        assert_eq!(place(0, 1, &b, &BTreeMap::new()), Err(PlacementError::NoPartitions));
    }
}
