//! Newtypes for the ids and positions that flow through every layer.

use std::fmt;

/// A record's position in a partition log. Offsets start at 0 and only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    #[must_use]
    pub fn next(self) -> Offset {
        Offset(self.0 + 1)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A partition number inside a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PartitionId(pub u32);

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A shard (one pinned executor thread) inside a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ShardId(pub u16);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The pure partition → shard function. Documented in ARCHITECTURE.md and
/// used by broker and client alike: partitions of one topic go round-robin
/// over the shards, starting at a shard chosen by a hash of the topic name
/// (FNV-1a), so that many single-partition topics still spread out.
#[must_use]
pub fn shard_for(topic: &str, partition: PartitionId, shard_count: u16) -> ShardId {
    assert!(shard_count > 0, "a broker has at least one shard");
    let start = fnv1a(topic.as_bytes()) % u64::from(shard_count);
    ShardId(((start + u64::from(partition.0)) % u64::from(shard_count)) as u16)
}

/// The internal topic that holds every consumer group's state and offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The `__consumer_offsets` partition that holds group `group` (whose owner
/// coordinates the group): `fnv1a(group) % partitions`. Pure and stable, like
/// [`shard_for`]; `partitions` is `offsets.topic.num.partitions`, fixed when
/// the topic is first created.
#[must_use]
pub fn group_partition(group: &str, partitions: u32) -> PartitionId {
    assert!(partitions > 0, "the offsets topic has at least one partition");
    PartitionId((fnv1a(group.as_bytes()) % u64::from(partitions)) as u32)
}

/// 64-bit FNV-1a, stable across versions and platforms.
#[must_use]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_spread_round_robin() {
        let shards: Vec<u16> = (0..8).map(|p| shard_for("t", PartitionId(p), 4).0).collect();
        for w in shards.windows(2) {
            assert_eq!((w[0] + 1) % 4, w[1]);
        }
        assert_eq!(shard_for("anything", PartitionId(7), 1), ShardId(0));
    }

    #[test]
    fn group_partition_is_stable() {
        // Part of the on-disk contract: changing it moves every group.
        assert_eq!(group_partition("g", 16), PartitionId((fnv1a(b"g") % 16) as u32));
        assert_eq!(group_partition("anything", 1), PartitionId(0));
        let spread: std::collections::HashSet<u32> =
            (0..200).map(|i| group_partition(&format!("group-{i}"), 16).0).collect();
        assert_eq!(spread.len(), 16);
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
