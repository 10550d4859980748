//! The records a coordinator writes to its `__consumer_offsets` partition.
//!
//! Keys decide what compaction keeps (the latest record per key), so a key
//! names exactly one thing: a committed offset (group, topic, partition) or a
//! group's metadata (group). A tombstone (null value) deletes the key.
//! All integers little-endian; strings and byte strings are a `u32` length
//! then the bytes; an absent string is length `u32::MAX`.
//!
//! ```text
//! offset key : u8 0 | group | topic | u32 partition
//! offset value: u8 version 0 | i64 offset | i32 leader epoch | i64 commit time ms | metadata
//! group key  : u8 1 | group
//! group value: u8 version 0 | protocol type | i32 generation | protocol? | leader? | i64 time ms
//!              | u32 members | per member: id | instance id? | client id | client host
//!              | u32 session ms | u32 rebalance ms | metadata | assignment
//! ```
//! Every field decoded is bounds-checked: a record that does not parse is
//! an error (logged and skipped by the loader), never a panic.

/// What a record's key names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecordKey {
    Offset { group: String, topic: String, partition: u32 },
    Group { group: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub commit_time_ms: i64,
    pub metadata: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub metadata: Vec<u8>,
    pub assignment: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub time_ms: i64,
    pub members: Vec<MemberValue>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record ends early at byte {0}")]
    Truncated(usize),
    #[error("unknown record key type {0}")]
    KeyType(u8),
    #[error("unknown record value version {0}")]
    Version(u8),
    #[error("a string is not UTF-8 at byte {0}")]
    Utf8(usize),
    #[error("{0} bytes left after the record")]
    Trailing(usize),
}

const KEY_OFFSET: u8 = 0;
const KEY_GROUP: u8 = 1;
const VALUE_VERSION: u8 = 0;
const ABSENT: u32 = u32::MAX;

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // Callers bound what they store (frames are at most a few MiB).
        self.u32(u32::try_from(v.len()).unwrap_or(ABSENT - 1));
        self.0.extend_from_slice(v);
        self
    }
    fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    fn opt(&mut self, v: Option<&str>) -> &mut Self {
        match v {
            Some(s) => self.str(s),
            None => self.u32(ABSENT),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(RecordError::Truncated(self.pos))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        self.array().map(u32::from_le_bytes)
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        self.array().map(i32::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        self.array().map(i64::from_le_bytes)
    }
    fn bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let n = self.u32()?;
        self.take(n as usize)
    }
    fn string(&mut self) -> Result<String, RecordError> {
        let at = self.pos;
        let b = self.bytes()?;
        std::str::from_utf8(b).map(str::to_string).map_err(|_| RecordError::Utf8(at))
    }
    fn opt(&mut self) -> Result<Option<String>, RecordError> {
        let at = self.pos;
        if self.u32()? == ABSENT {
            return Ok(None);
        }
        self.pos = at;
        self.string().map(Some)
    }
    fn end(&self) -> Result<(), RecordError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(RecordError::Trailing(n)),
        }
    }
}

impl RecordKey {
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        match self {
            RecordKey::Offset { group, topic, partition } => {
                w.u8(KEY_OFFSET).str(group).str(topic).u32(*partition);
            }
            RecordKey::Group { group } => {
                w.u8(KEY_GROUP).str(group);
            }
        }
        w.0
    }

    pub fn decode(buf: &[u8]) -> Result<RecordKey, RecordError> {
        let mut r = Reader { buf, pos: 0 };
        let key = match r.u8()? {
            KEY_OFFSET => RecordKey::Offset { group: r.string()?, topic: r.string()?, partition: r.u32()? },
            KEY_GROUP => RecordKey::Group { group: r.string()? },
            other => return Err(RecordError::KeyType(other)),
        };
        r.end()?;
        Ok(key)
    }

    #[must_use]
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group { group } => group,
        }
    }
}

impl OffsetValue {
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(32 + self.metadata.len()));
        w.u8(VALUE_VERSION)
            .i64(self.offset)
            .i32(self.leader_epoch)
            .i64(self.commit_time_ms)
            .str(&self.metadata);
        w.0
    }

    pub fn decode(buf: &[u8]) -> Result<OffsetValue, RecordError> {
        let mut r = Reader { buf, pos: 0 };
        let v = r.u8()?;
        if v != VALUE_VERSION {
            return Err(RecordError::Version(v));
        }
        let value = OffsetValue {
            offset: r.i64()?,
            leader_epoch: r.i32()?,
            commit_time_ms: r.i64()?,
            metadata: r.string()?,
        };
        r.end()?;
        Ok(value)
    }
}

impl GroupValue {
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(128));
        w.u8(VALUE_VERSION)
            .str(&self.protocol_type)
            .i32(self.generation)
            .opt(self.protocol.as_deref())
            .opt(self.leader.as_deref())
            .i64(self.time_ms)
            .u32(u32::try_from(self.members.len()).unwrap_or(u32::MAX));
        for m in &self.members {
            w.str(&m.member_id)
                .opt(m.instance_id.as_deref())
                .str(&m.client_id)
                .str(&m.client_host)
                .u32(m.session_timeout_ms)
                .u32(m.rebalance_timeout_ms)
                .bytes(&m.metadata)
                .bytes(&m.assignment);
        }
        w.0
    }

    pub fn decode(buf: &[u8]) -> Result<GroupValue, RecordError> {
        let mut r = Reader { buf, pos: 0 };
        let v = r.u8()?;
        if v != VALUE_VERSION {
            return Err(RecordError::Version(v));
        }
        let protocol_type = r.string()?;
        let generation = r.i32()?;
        let protocol = r.opt()?;
        let leader = r.opt()?;
        let time_ms = r.i64()?;
        let count = r.u32()?;
        // Each member takes at least 32 bytes: a corrupt count cannot make
        // this allocate more than the record holds.
        let mut members = Vec::with_capacity((count as usize).min(buf.len() / 32));
        for _ in 0..count {
            members.push(MemberValue {
                member_id: r.string()?,
                instance_id: r.opt()?,
                client_id: r.string()?,
                client_host: r.string()?,
                session_timeout_ms: r.u32()?,
                rebalance_timeout_ms: r.u32()?,
                metadata: r.bytes()?.to_vec(),
                assignment: r.bytes()?.to_vec(),
            });
        }
        r.end()?;
        Ok(GroupValue { protocol_type, generation, protocol, leader, time_ms, members })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_and_values_round_trip() {
        let k = RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 7 };
        assert_eq!(RecordKey::decode(&k.encode()), Ok(k));
        let k = RecordKey::Group { group: "grüppe".into() };
        assert_eq!(RecordKey::decode(&k.encode()), Ok(k));
        let v = OffsetValue { offset: 42, leader_epoch: -1, commit_time_ms: 5, metadata: "m".into() };
        assert_eq!(OffsetValue::decode(&v.encode()), Ok(v));
        let g = GroupValue {
            protocol_type: "consumer".into(),
            generation: 3,
            protocol: Some("range".into()),
            leader: None,
            time_ms: 9,
            members: vec![MemberValue {
                member_id: "a-1".into(),
                instance_id: Some("i".into()),
                client_id: "a".into(),
                client_host: "/127.0.0.1".into(),
                session_timeout_ms: 10_000,
                rebalance_timeout_ms: 60_000,
                metadata: vec![1, 2],
                assignment: vec![],
            }],
        };
        assert_eq!(GroupValue::decode(&g.encode()), Ok(g));
    }

    #[test]
    fn damage_is_an_error() {
        let k = RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 7 }.encode();
        assert_eq!(RecordKey::decode(&k[..k.len() - 1]), Err(RecordError::Truncated(k.len() - 4)));
        assert_eq!(RecordKey::decode(&[9]), Err(RecordError::KeyType(9)));
        let mut long = k.clone();
        long.push(0);
        assert_eq!(RecordKey::decode(&long), Err(RecordError::Trailing(1)));
        assert_eq!(OffsetValue::decode(&[1]), Err(RecordError::Version(1)));
    }

    proptest! {
        /// No input makes a decoder panic or over-allocate.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = RecordKey::decode(&bytes);
            let _ = OffsetValue::decode(&bytes);
            let _ = GroupValue::decode(&bytes);
        }
    }
}
