//! The record batch: the unit of append, replication, fetch and storage.
//! The same bytes travel on the wire and sit in segment files.
//!
//! ```text
//!  off size field               notes
//!    0   8  base_offset   u64   stamped by the broker on append
//!    8   4  batch_length  u32   bytes after this field (total = 12 + batch_length)
//!   12   4  leader_epoch  i32   stamped by the broker on append
//!   16   1  magic         u8    BATCH_MAGIC
//!   17   4  crc           u32   CRC32C of bytes [21, total)
//!   21   2  attributes    u16   bits 0-2 codec, bit 3 timestamp type, bit 4 transactional, bit 5 control
//!   23   4  last_offset_delta u32  record_count - 1
//!   27   8  first_timestamp   i64  ms since the Unix epoch
//!   35   8  max_timestamp     i64
//!   43   8  producer_id       i64  -1 when not idempotent
//!   51   2  producer_epoch    i16
//!   53   4  base_sequence     i32
//!   57   4  record_count      u32
//!   61   .. records: a `RecordSet` flatbuffer (compressed as a whole when codec != 0)
//! ```
//!
//! All integers are little-endian. The layout is a superset of Kafka's v2 batch
//! header (same fields, same order), so a Kafka-protocol gateway can translate
//! losslessly. The CRC covers everything after the CRC field; the fields the
//! broker stamps (base offset, leader epoch) sit before it, so stamping never
//! recomputes the CRC.

use crate::record_set::RecordSetWriter;
use crate::wire;
use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, InvalidFlatbuffer};

/// Size of the fixed batch header.
pub const BATCH_HEADER_BYTES: usize = 61;
/// Bytes before `batch_length`'s coverage starts (base offset + length field).
pub const BATCH_LENGTH_PREFIX_BYTES: usize = 12;
/// Format marker. Kafka's v2 is 2 (big-endian); ours is little-endian, so it
/// gets its own value.
pub const BATCH_MAGIC: u8 = 0x53;
/// First byte covered by the CRC.
pub const CRC_START: usize = 21;

const OFF_BASE_OFFSET: usize = 0;
const OFF_BATCH_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_FIRST_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORD_COUNT: usize = 57;

/// Idempotence: the batches a partition leader remembers per producer (to
/// answer a retry of one as the duplicate it is), and so how far past its
/// partition's oldest unfinished batch a Shardlog producer sends one. A
/// contract between the broker and the client, hence here. Kafka keeps 5,
/// its clients' `max.in.flight.requests.per.connection` bound with
/// idempotence; Shardlog's producer sends several batches of a partition in
/// one request, and with 8 (its earlier value) a producer of one partition
/// with 256 KiB batches could keep only 2 MiB in flight: its throughput
/// followed the round trip (2.2 M records/s of 100 B at a 5.7 ms round trip
/// on the machine of `perf-reports/`). A remembered batch costs the leader
/// 24 bytes.
pub const IDEMPOTENT_BATCHES_REMEMBERED: usize = 32;

/// Attribute bits.
pub const ATTR_CODEC_MASK: u16 = 0b111;
pub const ATTR_TIMESTAMP_LOG_APPEND: u16 = 1 << 3;
pub const ATTR_TRANSACTIONAL: u16 = 1 << 4;
pub const ATTR_CONTROL: u16 = 1 << 5;

/// What went wrong with a batch. Each variant carries enough to log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    #[error("batch truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("bad batch magic {0:#04x}, expected {BATCH_MAGIC:#04x}")]
    BadMagic(u8),
    #[error("bad batch length {length} (header needs {min}, limit {max})")]
    BadLength { length: u64, min: usize, max: usize },
    #[error("batch CRC mismatch: header says {stored:#010x}, bytes give {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("batch record count {header} does not match {actual} records")]
    RecordCountMismatch { header: u32, actual: usize },
    #[error("batch uses compression codec {0}, which this version does not support")]
    UnsupportedCodec(u16),
    #[error("batch records are not a valid record set: {0}")]
    Records(RecordSetError),
    #[error("batch has no records")]
    Empty,
}

/// What is wrong with a batch's record set (inside [`BatchError::Records`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RecordSetError {
    /// The record set flatbuffer failed verification.
    #[error(transparent)]
    Invalid(#[from] InvalidFlatbuffer),
    /// Offset deltas must rise strictly and stay within `last_offset_delta`.
    #[error("record {index} has offset delta {offset_delta}, after {previous:?} (last_offset_delta {last_offset_delta})")]
    OffsetDelta { index: usize, offset_delta: u32, previous: Option<u32>, last_offset_delta: u32 },
    /// `first_timestamp + timestamp_delta` does not fit an `i64`.
    #[error("record {index} has timestamp delta {timestamp_delta}, which overflows first_timestamp {first_timestamp}")]
    TimestampOverflow { index: usize, timestamp_delta: i64, first_timestamp: i64 },
}

impl From<InvalidFlatbuffer> for BatchError {
    fn from(e: InvalidFlatbuffer) -> Self {
        BatchError::Records(RecordSetError::Invalid(e))
    }
}

impl From<RecordSetError> for BatchError {
    fn from(e: RecordSetError) -> Self {
        BatchError::Records(e)
    }
}

/// Largest offset a record may have: offsets are `i64` on the wire (as in
/// Kafka), so a batch whose records would pass it is impossible.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// The parsed fixed header of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: u64,
    pub batch_length: u32,
    pub leader_epoch: i32,
    pub magic: u8,
    pub crc: u32,
    pub attributes: u16,
    pub last_offset_delta: u32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: u32,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl BatchHeader {
    /// Parses the fixed header. Checks only that the bytes are there and the
    /// magic is right; see [`validate`] for the full check.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < BATCH_HEADER_BYTES {
            return Err(BatchError::Truncated { need: BATCH_HEADER_BYTES, have: buf.len() });
        }
        let magic = buf[OFF_MAGIC];
        if magic != BATCH_MAGIC {
            return Err(BatchError::BadMagic(magic));
        }
        Ok(BatchHeader {
            base_offset: u64_at(buf, OFF_BASE_OFFSET),
            batch_length: u32_at(buf, OFF_BATCH_LENGTH),
            leader_epoch: u32_at(buf, OFF_LEADER_EPOCH) as i32,
            magic,
            crc: u32_at(buf, OFF_CRC),
            attributes: u16_at(buf, OFF_ATTRIBUTES),
            last_offset_delta: u32_at(buf, OFF_LAST_OFFSET_DELTA),
            first_timestamp: u64_at(buf, OFF_FIRST_TIMESTAMP) as i64,
            max_timestamp: u64_at(buf, OFF_MAX_TIMESTAMP) as i64,
            producer_id: u64_at(buf, OFF_PRODUCER_ID) as i64,
            producer_epoch: u16_at(buf, OFF_PRODUCER_EPOCH) as i16,
            base_sequence: u32_at(buf, OFF_BASE_SEQUENCE) as i32,
            record_count: u32_at(buf, OFF_RECORD_COUNT),
        })
    }

    /// Total size of the batch in bytes, header included.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        BATCH_LENGTH_PREFIX_BYTES.saturating_add(self.batch_length as usize)
    }

    /// Offset of the last record in the batch. Exact for a header that
    /// passed [`validate`] with its real base offset; on a header from
    /// [`BatchHeader::parse`] alone it saturates instead of overflowing.
    #[must_use]
    pub fn last_offset(&self) -> u64 {
        self.base_offset.saturating_add(u64::from(self.last_offset_delta))
    }

    /// Offset after the batch (saturating, as [`BatchHeader::last_offset`]).
    #[must_use]
    pub fn next_offset(&self) -> u64 {
        self.last_offset().saturating_add(1)
    }

    /// Offset after the batch, or `None` when its records would pass
    /// [`OFFSET_MAX`] (a corrupt or hostile header).
    #[must_use]
    pub fn checked_next_offset(&self) -> Option<u64> {
        let next = self.base_offset.checked_add(u64::from(self.last_offset_delta))?.checked_add(1)?;
        (next <= OFFSET_MAX.saturating_add(1)).then_some(next)
    }

    /// The absolute offset and timestamp of a record of this batch, from its
    /// deltas, checked: the offset delta must not pass `last_offset_delta`
    /// nor the offset [`OFFSET_MAX`], and the timestamp must fit an `i64`.
    pub fn record_position(
        &self,
        index: usize,
        offset_delta: u32,
        timestamp_delta: i64,
    ) -> Result<(u64, i64), RecordSetError> {
        let offset = self
            .base_offset
            .checked_add(u64::from(offset_delta))
            .filter(|o| offset_delta <= self.last_offset_delta && *o <= OFFSET_MAX)
            .ok_or(RecordSetError::OffsetDelta {
                index,
                offset_delta,
                previous: None,
                last_offset_delta: self.last_offset_delta,
            })?;
        let timestamp =
            self.first_timestamp.checked_add(timestamp_delta).ok_or(RecordSetError::TimestampOverflow {
                index,
                timestamp_delta,
                first_timestamp: self.first_timestamp,
            })?;
        Ok((offset, timestamp))
    }

    #[must_use]
    pub fn codec(&self) -> u16 {
        self.attributes & ATTR_CODEC_MASK
    }
}

/// Reads the total length of the batch starting at `buf[0]` from its first
/// 12 bytes, or `None` when fewer than 12 bytes are there.
#[must_use]
pub fn peek_total_bytes(buf: &[u8]) -> Option<usize> {
    if buf.len() < BATCH_LENGTH_PREFIX_BYTES {
        return None;
    }
    Some(BATCH_LENGTH_PREFIX_BYTES.saturating_add(u32_at(buf, OFF_BATCH_LENGTH) as usize))
}

/// CRC32C of a batch's covered bytes (everything after the CRC field).
#[must_use]
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_START..])
}

/// Validates the batch at the start of `buf` as a producer sends it:
/// [`validate_stored`] plus `last_offset_delta == record_count - 1` (every
/// offset of the batch holds a record). The base offset is not judged here
/// (the broker stamps it after this check on produce; recovery and readers
/// compare it with the offset they expect): [`BatchHeader::checked_next_offset`]
/// says whether it leaves room for the records.
/// Returns the header; the batch is `buf[..header.total_bytes()]`.
///
/// Every field it reads comes from outside (a socket, a file): nothing here
/// does arithmetic that can overflow on any value.
pub fn validate(buf: &[u8], batch_bytes_max: usize) -> Result<BatchHeader, BatchError> {
    let header = validate_stored(buf, batch_bytes_max)?;
    // `record_count >= 1` here, so `record_count - 1` cannot underflow
    // (`last_offset_delta + 1` would overflow for u32::MAX).
    if header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::RecordCountMismatch {
            header: header.record_count,
            actual: usize::try_from(u64::from(header.last_offset_delta) + 1).unwrap_or(usize::MAX),
        });
    }
    Ok(header)
}

/// Validates a batch as a log may hold it: header, length bounds, magic,
/// CRC, and at least one record and no more records than offsets. Keyed
/// compaction ([`filter_records`]) leaves batches whose records skip
/// offsets (`record_count <= last_offset_delta + 1`), as Kafka's do; readers
/// take each record's offset from its offset delta. Used by recovery and by
/// every reader of stored batches.
pub fn validate_stored(buf: &[u8], batch_bytes_max: usize) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf)?;
    let total = header.total_bytes();
    if total < BATCH_HEADER_BYTES || total > batch_bytes_max {
        return Err(BatchError::BadLength {
            length: total as u64,
            min: BATCH_HEADER_BYTES,
            max: batch_bytes_max,
        });
    }
    if buf.len() < total {
        return Err(BatchError::Truncated { need: total, have: buf.len() });
    }
    let computed = compute_crc(&buf[..total]);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch { stored: header.crc, computed });
    }
    if header.record_count == 0 {
        return Err(BatchError::Empty);
    }
    if u64::from(header.record_count) > u64::from(header.last_offset_delta) + 1 {
        return Err(BatchError::RecordCountMismatch {
            header: header.record_count,
            actual: usize::try_from(u64::from(header.last_offset_delta) + 1).unwrap_or(usize::MAX),
        });
    }
    Ok(header)
}

/// Keyed compaction's rewrite of one stored batch: keeps the records for
/// which `keep(record)` is true, each with its offset and timestamp (offset
/// and timestamp deltas unchanged), under the same header fields (base
/// offset, `last_offset_delta`, leader epoch, producer id, epoch and
/// sequence, attributes, first and max timestamp) with the new record count,
/// length and CRC. Returns `Ok(None)` when no record is kept, and the batch
/// unchanged (a copy) when every record is.
pub fn filter_records(
    batch: &[u8],
    mut keep: impl FnMut(&RecordView<'_>) -> bool,
) -> Result<Option<Vec<u8>>, BatchError> {
    let header = validate_stored(batch, batch.len())?;
    let batch = &batch[..header.total_bytes()];
    let views = records(batch)?;
    let kept: Vec<usize> = views.iter().enumerate().filter(|(_, r)| keep(r)).map(|(i, _)| i).collect();
    if kept.is_empty() {
        return Ok(None);
    }
    if kept.len() == views.len() {
        return Ok(Some(batch.to_vec()));
    }
    let set = flatbuffers::root::<wire::RecordSet>(&batch[BATCH_HEADER_BYTES..])?;
    let all = set.records().unwrap_or_default();
    let mut fbb = FlatBufferBuilder::with_capacity(batch.len());
    let mut out_records = Vec::with_capacity(kept.len());
    for i in kept {
        let r = all.get(i);
        let key = r.key().map(|k| fbb.create_vector(k.bytes()));
        let value = r.value().map(|v| fbb.create_vector(v.bytes()));
        let headers = r.headers().map(|hs| {
            let hs: Vec<_> = hs
                .iter()
                .map(|h| {
                    let key = h.key().map(|k| fbb.create_string(k));
                    let value = h.value().map(|v| fbb.create_vector(v.bytes()));
                    wire::RecordHeader::create(&mut fbb, &wire::RecordHeaderArgs { key, value })
                })
                .collect();
            fbb.create_vector(&hs)
        });
        out_records.push(wire::Record::create(
            &mut fbb,
            &wire::RecordArgs {
                offset_delta: r.offset_delta(),
                timestamp_delta: r.timestamp_delta(),
                key,
                value,
                headers,
            },
        ));
    }
    let count = out_records.len();
    let records = fbb.create_vector(&out_records);
    let set = wire::RecordSet::create(&mut fbb, &wire::RecordSetArgs { records: Some(records) });
    fbb.finish_minimal(set);
    let data = fbb.finished_data();
    let total = BATCH_HEADER_BYTES + data.len();
    let mut out = vec![0u8; BATCH_HEADER_BYTES];
    out.extend_from_slice(data);
    let new_header = BatchHeader {
        batch_length: u32::try_from(total - BATCH_LENGTH_PREFIX_BYTES).expect("smaller than the input batch"),
        record_count: u32::try_from(count).expect("fewer records than the input batch"),
        crc: 0,
        ..header
    };
    seal_header(new_header, &mut out);
    Ok(Some(out))
}

/// Validates a batch fully: [`validate`] plus verification of the record set
/// flatbuffer and its record count. Used by the broker on produce.
///
/// The record set goes through `record_check` first, a one-pass check that
/// knows the schema; only what it is not sure of goes through the generic
/// flatbuffers verifier, which decides (see `record_check` for why the
/// result is the same either way).
pub fn validate_with_records(buf: &[u8], batch_bytes_max: usize) -> Result<BatchHeader, BatchError> {
    let header = validate(buf, batch_bytes_max)?;
    if header.codec() != 0 {
        return Err(BatchError::UnsupportedCodec(header.codec()));
    }
    let set = &buf[BATCH_HEADER_BYTES..header.total_bytes()];
    if crate::record_check::check(set, &header).is_err() {
        check_record_set_generic(set, &header)?;
    }
    Ok(header)
}

/// The record set check of [`validate_with_records`] by the generic
/// flatbuffers verifier: the reference the fast check is held to.
pub(crate) fn check_record_set_generic(set: &[u8], header: &BatchHeader) -> Result<(), BatchError> {
    let set = flatbuffers::root::<wire::RecordSet>(set)?;
    let actual = set.records().map_or(0, |r| r.len());
    if actual != header.record_count as usize {
        return Err(BatchError::RecordCountMismatch { header: header.record_count, actual });
    }
    check_record_deltas(header, set)?;
    Ok(())
}

/// Each record's offset delta is above the previous one and at most
/// `last_offset_delta`, and its timestamp delta fits with `first_timestamp`.
/// The base offset is not involved: on produce the broker has yet to stamp it.
fn check_record_deltas(header: &BatchHeader, set: wire::RecordSet<'_>) -> Result<(), RecordSetError> {
    let mut previous: Option<u32> = None;
    for (index, r) in set.records().unwrap_or_default().iter().enumerate() {
        let offset_delta = r.offset_delta();
        if previous.is_some_and(|p| offset_delta <= p) || offset_delta > header.last_offset_delta {
            return Err(RecordSetError::OffsetDelta {
                index,
                offset_delta,
                previous,
                last_offset_delta: header.last_offset_delta,
            });
        }
        previous = Some(offset_delta);
        if header.first_timestamp.checked_add(r.timestamp_delta()).is_none() {
            return Err(RecordSetError::TimestampOverflow {
                index,
                timestamp_delta: r.timestamp_delta(),
                first_timestamp: header.first_timestamp,
            });
        }
    }
    Ok(())
}

/// Stamps the broker-assigned fields. The CRC does not cover them.
pub fn stamp(batch: &mut [u8], base_offset: u64, leader_epoch: i32) {
    batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_le_bytes());
    batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_le_bytes());
}

/// A copy of `batch` with another idempotent base sequence (and its CRC
/// recomputed): an idempotent producer renumbers a batch when one before it
/// failed without being written. `batch` must hold a whole header.
#[must_use]
pub fn with_base_sequence(batch: &[u8], base_sequence: i32) -> Vec<u8> {
    let mut out = batch.to_vec();
    out[OFF_BASE_SEQUENCE..][..4].copy_from_slice(&base_sequence.to_le_bytes());
    let crc = compute_crc(&out);
    out[OFF_CRC..][..4].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Builds one batch from records. The batch is built with base offset 0; the
/// broker stamps the real one. The record set is written by
/// [`RecordSetWriter`](crate::record_set) (see there why not by
/// `FlatBufferBuilder`).
pub struct BatchBuilder {
    records: RecordSetWriter,
    first_timestamp: i64,
    max_timestamp: i64,
    /// Producer id, epoch and base sequence (-1, -1, -1: not idempotent).
    producer: (i64, i16, i32),
    /// Timestamp type and transactional bits (never the codec).
    attributes: u16,
}

/// A record header as given to the builder.
pub type HeaderRef<'a> = (&'a str, &'a [u8]);

impl BatchBuilder {
    #[must_use]
    pub fn with_capacity(bytes: usize) -> Self {
        BatchBuilder {
            records: RecordSetWriter::with_capacity(bytes),
            first_timestamp: 0,
            max_timestamp: i64::MIN,
            producer: (-1, -1, -1),
            attributes: 0,
        }
    }

    /// Marks the batch as written by an idempotent producer: its id, epoch
    /// and the sequence number of the first record (a gateway translating
    /// another protocol's batch keeps them).
    pub fn set_producer(&mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) {
        self.producer = (producer_id, producer_epoch, base_sequence);
    }

    /// Sets the attribute bits [`ATTR_TIMESTAMP_LOG_APPEND`] and
    /// [`ATTR_TRANSACTIONAL`]; the codec and control bits are not settable.
    pub fn set_attributes(&mut self, attributes: u16) {
        self.attributes = attributes & (ATTR_TIMESTAMP_LOG_APPEND | ATTR_TRANSACTIONAL);
    }

    /// Adds a record. `timestamp_ms` is the create time.
    pub fn push(&mut self, key: Option<&[u8]>, value: &[u8], headers: &[HeaderRef<'_>], timestamp_ms: i64) {
        self.push_record(key, Some(value), headers, timestamp_ms);
    }

    /// Adds a tombstone: a record with a key and a null value, which tells
    /// keyed compaction (`cleanup.policy=compact`) to delete the key.
    pub fn push_tombstone(&mut self, key: &[u8], headers: &[HeaderRef<'_>], timestamp_ms: i64) {
        self.push_record(Some(key), None, headers, timestamp_ms);
    }

    /// Adds a record whose key and value may each be null (`push` and
    /// `push_tombstone` are the common cases; a Kafka record may have both null).
    pub fn push_record(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[HeaderRef<'_>],
        timestamp_ms: i64,
    ) {
        if self.records.is_empty() {
            self.first_timestamp = timestamp_ms;
        }
        self.max_timestamp = self.max_timestamp.max(timestamp_ms);
        let offset_delta = u32::try_from(self.records.len()).expect("a batch holds under 2^32 records");
        self.records.push(offset_delta, timestamp_ms - self.first_timestamp, key, value, headers);
    }

    /// Number of records pushed so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes the finished batch will take, give or take the vector of offsets.
    #[must_use]
    pub fn estimated_bytes(&self) -> usize {
        BATCH_HEADER_BYTES + self.records.used() + 4 * self.records.len() + 32
    }

    /// Finishes the batch: the header is written in front of the record set
    /// (no copy of the records), and the whole batch is returned.
    ///
    /// # Panics
    /// When no record was pushed: an empty batch is a caller bug.
    #[must_use]
    pub fn finish_bytes(self) -> Bytes {
        self.finish_parts().1
    }

    /// The finished batch and the header it carries (with its CRC).
    fn finish_parts(self) -> (BatchHeader, Bytes) {
        let count = self.records.len();
        assert!(count > 0, "a batch has at least one record");
        let mut header = BatchHeader {
            base_offset: 0,
            batch_length: 0,
            leader_epoch: -1,
            magic: BATCH_MAGIC,
            crc: 0,
            attributes: self.attributes,
            last_offset_delta: (count - 1) as u32,
            first_timestamp: self.first_timestamp,
            max_timestamp: self.max_timestamp,
            producer_id: self.producer.0,
            producer_epoch: self.producer.1,
            base_sequence: self.producer.2,
            record_count: count as u32,
        };
        let written = self.records.finish(|set| {
            header.batch_length = (BATCH_HEADER_BYTES + set.len() - BATCH_LENGTH_PREFIX_BYTES) as u32;
            let mut head = [0u8; BATCH_HEADER_BYTES];
            write_header(&header, &mut head);
            header.crc = crc32c::crc32c_append(crc32c::crc32c(&head[CRC_START..]), set);
            head[OFF_CRC..OFF_CRC + 4].copy_from_slice(&header.crc.to_le_bytes());
            head
        });
        (header, Bytes::from_owner(written))
    }

    /// Finishes the batch into `out` (appended) and returns its header.
    ///
    /// # Panics
    /// When no record was pushed: an empty batch is a caller bug.
    pub fn finish_into(self, out: &mut Vec<u8>) -> BatchHeader {
        let (header, batch) = self.finish_parts();
        out.extend_from_slice(&batch);
        header
    }

    /// Finishes the batch into a new vector.
    #[must_use]
    pub fn finish(self) -> Vec<u8> {
        self.finish_bytes().to_vec()
    }
}

/// Writes `header` into the first bytes of `batch` (whose records follow),
/// then its CRC; returns the header with the CRC.
fn seal_header(header: BatchHeader, batch: &mut [u8]) -> BatchHeader {
    write_header(&header, batch);
    let crc = compute_crc(batch);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    BatchHeader { crc, ..header }
}

fn write_header(h: &BatchHeader, b: &mut [u8]) {
    b[OFF_BASE_OFFSET..][..8].copy_from_slice(&h.base_offset.to_le_bytes());
    b[OFF_BATCH_LENGTH..][..4].copy_from_slice(&h.batch_length.to_le_bytes());
    b[OFF_LEADER_EPOCH..][..4].copy_from_slice(&h.leader_epoch.to_le_bytes());
    b[OFF_MAGIC] = h.magic;
    b[OFF_CRC..][..4].copy_from_slice(&h.crc.to_le_bytes());
    b[OFF_ATTRIBUTES..][..2].copy_from_slice(&h.attributes.to_le_bytes());
    b[OFF_LAST_OFFSET_DELTA..][..4].copy_from_slice(&h.last_offset_delta.to_le_bytes());
    b[OFF_FIRST_TIMESTAMP..][..8].copy_from_slice(&h.first_timestamp.to_le_bytes());
    b[OFF_MAX_TIMESTAMP..][..8].copy_from_slice(&h.max_timestamp.to_le_bytes());
    b[OFF_PRODUCER_ID..][..8].copy_from_slice(&h.producer_id.to_le_bytes());
    b[OFF_PRODUCER_EPOCH..][..2].copy_from_slice(&h.producer_epoch.to_le_bytes());
    b[OFF_BASE_SEQUENCE..][..4].copy_from_slice(&h.base_sequence.to_le_bytes());
    b[OFF_RECORD_COUNT..][..4].copy_from_slice(&h.record_count.to_le_bytes());
}

/// One record read back from a batch, with absolute offset and timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    /// Empty for a tombstone (see `tombstone`).
    pub value: &'a [u8],
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// The value is null: a tombstone for its key (`BatchBuilder::push_tombstone`).
    pub tombstone: bool,
}

/// Decodes the records of one validated batch (`batch` is exactly one batch).
/// A record whose deltas put it outside the batch or past [`OFFSET_MAX`] is
/// an error, not a wrapped offset.
pub fn records(batch: &[u8]) -> Result<Vec<RecordView<'_>>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if header.codec() != 0 {
        return Err(BatchError::UnsupportedCodec(header.codec()));
    }
    let end = header.total_bytes().clamp(BATCH_HEADER_BYTES, batch.len());
    let set = flatbuffers::root::<wire::RecordSet>(&batch[BATCH_HEADER_BYTES..end])?;
    let Some(records) = set.records() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(records.len());
    for (index, r) in records.iter().enumerate() {
        let (offset, timestamp_ms) = header.record_position(index, r.offset_delta(), r.timestamp_delta())?;
        let headers = r
            .headers()
            .map(|hs| {
                hs.iter().map(|h| (h.key().unwrap_or(""), h.value().map_or(&[][..], |v| v.bytes()))).collect()
            })
            .unwrap_or_default();
        out.push(RecordView {
            offset,
            timestamp_ms,
            key: r.key().map(|k| k.bytes()),
            value: r.value().map_or(&[][..], |v| v.bytes()),
            headers,
            tombstone: r.value().is_none(),
        });
    }
    Ok(out)
}

/// Iterates over the whole batches in a buffer of concatenated batches
/// (a fetch response's partition data, a segment file's bytes). Stops at the
/// first incomplete batch at the end; yields an error for a corrupt one and
/// then stops.
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
    batch_bytes_max: usize,
    failed: bool,
}

impl<'a> BatchIter<'a> {
    #[must_use]
    pub fn new(buf: &'a [u8], batch_bytes_max: usize) -> Self {
        BatchIter { buf, pos: 0, batch_bytes_max, failed: false }
    }

    /// Byte position of the next batch.
    #[must_use]
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Result<(BatchHeader, &'a [u8]), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = &self.buf[self.pos..];
        let total = peek_total_bytes(rest)?;
        if rest.len() < total && total <= self.batch_bytes_max {
            return None; // incomplete tail
        }
        match validate_stored(rest, self.batch_bytes_max) {
            Ok(h) => {
                let bytes = &rest[..h.total_bytes()];
                self.pos += h.total_bytes();
                Some(Ok((h, bytes)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(records: &[(Option<Vec<u8>>, Vec<u8>)], ts: i64) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(1024);
        for (i, (k, v)) in records.iter().enumerate() {
            b.push(k.as_deref(), v, &[("h", b"x")], ts + i as i64);
        }
        b.finish()
    }

    #[test]
    fn a_renumbered_batch_validates_with_its_new_sequence_and_same_records() {
        let mut b = BatchBuilder::with_capacity(1024);
        b.set_producer(7, 2, 1200);
        for i in 0..3u8 {
            b.push(None, &[i; 8], &[], 1000);
        }
        let batch = b.finish();
        let renumbered = with_base_sequence(&batch, 1150);
        let h = validate_with_records(&renumbered, 1 << 20).expect("valid after renumbering");
        assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence), (7, 2, 1150));
        assert_eq!(renumbered[BATCH_HEADER_BYTES..], batch[BATCH_HEADER_BYTES..], "the records are the same");
        assert_eq!(renumbered.len(), batch.len());
        assert!(validate(&batch, 1 << 20).is_ok(), "the original is untouched");
    }

    #[test]
    fn filter_records_keeps_offsets_timestamps_and_producer_fields() {
        let mut b = BatchBuilder::with_capacity(1024);
        for i in 0..5u8 {
            b.push(Some(&[b'k', i]), &[i; 10], &[("h", &[i])], 1000 + i64::from(i));
        }
        b.push_tombstone(b"gone", &[], 2000);
        let mut batch = b.finish();
        stamp(&mut batch, 100, 3);
        let h = validate(&batch, 1 << 20).unwrap();
        let kept = filter_records(&batch, |r| r.offset % 2 == 1 || r.tombstone).unwrap().unwrap();
        let kh = validate_stored(&kept, 1 << 20).expect("a filtered batch is a valid stored batch");
        assert_eq!((kh.base_offset, kh.last_offset_delta, kh.record_count), (100, 5, 3));
        assert_eq!(
            (kh.leader_epoch, kh.first_timestamp, kh.max_timestamp),
            (3, h.first_timestamp, h.max_timestamp)
        );
        assert!(
            matches!(validate(&kept, 1 << 20), Err(BatchError::RecordCountMismatch { .. })),
            "not a producer batch"
        );
        let rs = records(&kept).unwrap();
        let got: Vec<(u64, i64, bool)> = rs.iter().map(|r| (r.offset, r.timestamp_ms, r.tombstone)).collect();
        assert_eq!(got, vec![(101, 1001, false), (103, 1003, false), (105, 2000, true)]);
        assert_eq!(rs[0].headers, vec![("h", &[1u8][..])]);
        assert_eq!(rs[1].value, &[3u8; 10]);
        assert_eq!(filter_records(&batch, |_| true).unwrap().unwrap(), batch, "all kept: unchanged");
        assert_eq!(filter_records(&batch, |_| false).unwrap(), None);
        // Filtering a filtered batch again works on its gaps.
        let again = filter_records(&kept, |r| r.offset == 105).unwrap().unwrap();
        assert_eq!(records(&again).unwrap().iter().map(|r| r.offset).collect::<Vec<_>>(), vec![105]);
        let mut it = BatchIter::new(&again, 1 << 20);
        assert!(it.next().unwrap().is_ok(), "readers accept compacted batches");
    }

    #[test]
    fn stamp_keeps_crc_valid() {
        let mut batch = build(&[(None, b"hello".to_vec()), (Some(b"k".to_vec()), b"w".to_vec())], 1000);
        stamp(&mut batch, 42, 7);
        let h = validate_with_records(&batch, 1 << 20).expect("valid");
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.leader_epoch, 7);
        assert_eq!(h.last_offset(), 43);
        let recs = records(&batch).expect("records");
        assert_eq!(recs[0].offset, 42);
        assert_eq!(recs[1].key, Some(&b"k"[..]));
        assert_eq!(recs[1].timestamp_ms, 1001);
        assert_eq!(recs[1].headers, vec![("h", &b"x"[..])]);
    }

    #[test]
    fn finish_bytes_gives_the_same_bytes_as_finish() {
        for (capacity, n) in [(16, 1), (64, 3), (1024, 40), (1 << 16, 500)] {
            let fill = |b: &mut BatchBuilder| {
                for i in 0..n {
                    b.push(Some(b"k"), format!("value {i}").as_bytes(), &[("h", b"x")], 1000 + i64::from(i));
                }
            };
            let mut a = BatchBuilder::with_capacity(capacity);
            fill(&mut a);
            let mut b = BatchBuilder::with_capacity(capacity);
            fill(&mut b);
            let bytes = b.finish_bytes();
            assert_eq!(&bytes[..], &a.finish()[..], "capacity {capacity}, {n} records");
            validate_with_records(&bytes, 1 << 20).expect("valid");
        }
    }

    #[test]
    fn finish_into_returns_the_header_it_wrote() {
        let mut b = BatchBuilder::with_capacity(0);
        b.set_producer(7, 1, 40);
        b.push(Some(b"k"), b"v", &[("h", b"x")], 1_000);
        b.push(None, b"w", &[], 1_005);
        let mut out = vec![9u8; 3];
        let header = b.finish_into(&mut out);
        assert_eq!(BatchHeader::parse(&out[3..]), Ok(header));
        assert_eq!(header.total_bytes(), out.len() - 3);
        assert_eq!(validate_with_records(&out[3..], 1 << 20), Ok(header));
    }

    #[test]
    fn flipped_byte_is_caught() {
        let batch = build(&[(None, b"hello".to_vec())], 1);
        for i in CRC_START..batch.len() {
            let mut bad = batch.clone();
            bad[i] ^= 0x40;
            assert!(validate(&bad, 1 << 20).is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn iter_stops_at_partial_tail() {
        let mut buf = build(&[(None, b"a".to_vec())], 1);
        let one = buf.len();
        buf.extend_from_slice(&build(&[(None, b"b".to_vec())], 2));
        buf.truncate(buf.len() - 3);
        let got: Vec<_> = BatchIter::new(&buf, 1 << 20).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().expect("ok").1.len(), one);
    }

    /// A sealed batch (valid CRC) with this header and these records'
    /// (offset delta, timestamp delta), built by hand so any values go.
    fn raw_batch(header: BatchHeader, deltas: &[(u32, i64)]) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::with_capacity(256);
        let records: Vec<_> = deltas
            .iter()
            .map(|&(offset_delta, timestamp_delta)| {
                let value = fbb.create_vector(b"v");
                wire::Record::create(
                    &mut fbb,
                    &wire::RecordArgs {
                        offset_delta,
                        timestamp_delta,
                        key: None,
                        value: Some(value),
                        headers: None,
                    },
                )
            })
            .collect();
        let records = fbb.create_vector(&records);
        let set = wire::RecordSet::create(&mut fbb, &wire::RecordSetArgs { records: Some(records) });
        fbb.finish_minimal(set);
        let mut out = vec![0u8; BATCH_HEADER_BYTES];
        out.extend_from_slice(fbb.finished_data());
        let header = BatchHeader { batch_length: (out.len() - BATCH_LENGTH_PREFIX_BYTES) as u32, ..header };
        seal_header(header, &mut out);
        out
    }

    fn header_of(batch: &[u8]) -> BatchHeader {
        BatchHeader::parse(batch).expect("parses")
    }

    #[test]
    fn last_offset_delta_u32_max_is_rejected_not_overflowed() {
        let good = build(&[(None, b"a".to_vec())], 1);
        for record_count in [0, 1, 2, u32::MAX] {
            let h = BatchHeader { last_offset_delta: u32::MAX, record_count, ..header_of(&good) };
            let batch = raw_batch(h, &[(0, 0)]);
            let err = validate(&batch, 1 << 20).expect_err("impossible counts are rejected");
            let want = if record_count == 0 {
                BatchError::Empty
            } else {
                BatchError::RecordCountMismatch { header: record_count, actual: 1 << 32 }
            };
            assert_eq!(err, want, "record_count {record_count}");
            assert!(validate_with_records(&batch, 1 << 20).is_err());
            assert_eq!(header_of(&batch).next_offset(), u64::from(u32::MAX) + 1);
        }
    }

    #[test]
    fn offsets_near_the_top_saturate_or_are_refused() {
        let good = build(&[(None, b"a".to_vec()), (None, b"b".to_vec())], 1);
        let h = BatchHeader { base_offset: u64::MAX, ..header_of(&good) };
        assert_eq!(h.last_offset(), u64::MAX);
        assert_eq!(h.next_offset(), u64::MAX);
        assert_eq!(h.checked_next_offset(), None);
        let h = BatchHeader { base_offset: OFFSET_MAX - 1, ..h };
        assert_eq!(h.checked_next_offset(), Some(OFFSET_MAX + 1), "the last record may sit at OFFSET_MAX");
        assert_eq!(h.record_position(1, 1, 0), Ok((OFFSET_MAX, 1)));
        assert!(matches!(
            h.record_position(1, 2, 0),
            Err(RecordSetError::OffsetDelta { offset_delta: 2, .. })
        ));
        let h = BatchHeader { base_offset: OFFSET_MAX, ..h };
        assert!(matches!(h.record_position(1, 1, 0), Err(RecordSetError::OffsetDelta { .. })));
        let mut stamped = good.clone();
        stamp(&mut stamped, OFFSET_MAX, 0);
        assert!(matches!(
            records(&stamped),
            Err(BatchError::Records(RecordSetError::OffsetDelta { index: 1, .. }))
        ));
    }

    #[test]
    fn record_deltas_are_checked_on_produce() {
        let good = build(&[(None, b"a".to_vec()), (None, b"b".to_vec())], 1);
        let h = header_of(&good);
        validate_with_records(&raw_batch(h, &[(0, 0), (1, 5)]), 1 << 20)
            .expect("sequential deltas are valid");
        for (deltas, index) in
            [([(1, 0), (1, 0)], 1), ([(0, 0), (0, 0)], 1), ([(0, 0), (2, 0)], 1), ([(5, 0), (6, 0)], 0)]
        {
            let err = validate_with_records(&raw_batch(h, &deltas), 1 << 20).expect_err("bad deltas");
            assert!(
                matches!(err, BatchError::Records(RecordSetError::OffsetDelta { index: i, .. }) if i == index),
                "{deltas:?}: {err}"
            );
        }
        let h = BatchHeader { first_timestamp: i64::MAX - 1, ..h };
        let err = validate_with_records(&raw_batch(h, &[(0, 0), (1, 2)]), 1 << 20).expect_err("overflow");
        assert_eq!(
            err,
            BatchError::Records(RecordSetError::TimestampOverflow {
                index: 1,
                timestamp_delta: 2,
                first_timestamp: i64::MAX - 1
            })
        );
        let h = BatchHeader { first_timestamp: i64::MIN, ..h };
        assert!(records(&raw_batch(h, &[(0, 0), (1, -1)])).is_err());
    }

    #[test]
    fn short_batch_length_does_not_slice_out_of_bounds() {
        let mut batch = build(&[(None, b"a".to_vec())], 1);
        batch[OFF_BATCH_LENGTH..][..4].copy_from_slice(&0u32.to_le_bytes());
        assert!(records(&batch).is_err());
        assert!(matches!(validate(&batch, 1 << 20), Err(BatchError::BadLength { .. })));
    }

    /// u32s near the edges, where arithmetic overflows, and some random ones.
    fn edge_u32() -> impl Strategy<Value = u32> {
        prop_oneof![Just(0), Just(1), Just(u32::MAX), Just(u32::MAX - 1), any::<u32>()]
    }

    proptest! {
        /// Any header bytes, with a record set or junk after them, a length
        /// that may or may not fit and a CRC recomputed so it matches: the
        /// checks and the decoders answer, never panic.
        #[test]
        fn any_header_with_a_valid_crc_never_panics(
            head in prop::collection::vec(any::<u8>(), BATCH_HEADER_BYTES),
            body_kind in 0u8..3,
            junk in prop::collection::vec(any::<u8>(), 0..64),
            length in prop_oneof![Just(None), (0u32..128).prop_map(Some), any::<u32>().prop_map(Some)],
            counts in prop_oneof![
                Just(None),
                (edge_u32(), edge_u32()).prop_map(Some),
            ],
            base_offset in prop_oneof![any::<u64>(), Just(u64::MAX), Just(OFFSET_MAX)],
            fix_magic in any::<bool>(),
            limit in prop_oneof![Just(1usize << 20), 0usize..128],
        ) {
            let mut batch = head;
            match body_kind {
                0 => {}
                1 => batch.extend_from_slice(&junk),
                _ => batch.extend_from_slice(&build(&[(None, junk.clone())], 0)[BATCH_HEADER_BYTES..]),
            }
            if fix_magic {
                batch[OFF_MAGIC] = BATCH_MAGIC;
            }
            let len = length.unwrap_or((batch.len() - BATCH_LENGTH_PREFIX_BYTES) as u32);
            batch[OFF_BATCH_LENGTH..][..4].copy_from_slice(&len.to_le_bytes());
            if let Some((last_offset_delta, record_count)) = counts {
                batch[OFF_LAST_OFFSET_DELTA..][..4].copy_from_slice(&last_offset_delta.to_le_bytes());
                batch[OFF_RECORD_COUNT..][..4].copy_from_slice(&record_count.to_le_bytes());
            }
            batch[OFF_BASE_OFFSET..][..8].copy_from_slice(&base_offset.to_le_bytes());
            let crc = compute_crc(&batch);
            batch[OFF_CRC..][..4].copy_from_slice(&crc.to_le_bytes());
            if let Ok(h) = BatchHeader::parse(&batch) {
                let _ = (h.total_bytes(), h.last_offset(), h.next_offset(), h.checked_next_offset());
                let _ = h.record_position(0, h.last_offset_delta, i64::MAX);
            }
            let checked = validate(&batch, limit);
            if let Ok(h) = &checked {
                prop_assert_eq!(u64::from(h.last_offset_delta) + 1, u64::from(h.record_count));
            }
            let _ = validate_with_records(&batch, limit);
            let _ = records(&batch);
            let _ = peek_total_bytes(&batch);
            let _: Vec<_> = BatchIter::new(&batch, limit).collect();
        }
    }

    proptest! {
        #[test]
        fn round_trip(recs in prop::collection::vec(
            (prop::option::of(prop::collection::vec(any::<u8>(), 0..16)), prop::collection::vec(any::<u8>(), 0..200)),
            1..50), ts in 0i64..1_000_000_000_000) {
            let batch = build(&recs, ts);
            let h = validate_with_records(&batch, 1 << 20).unwrap();
            prop_assert_eq!(h.record_count as usize, recs.len());
            let back = records(&batch).unwrap();
            for (i, (r, (k, v))) in back.iter().zip(recs.iter()).enumerate() {
                prop_assert_eq!(r.offset, i as u64);
                prop_assert_eq!(r.key, k.as_deref());
                prop_assert_eq!(r.value, &v[..]);
            }
        }
    }
}
