//! Sparse segment indexes: pure data and search, no I/O.
//!
//! ```text
//! <base>.index      entries, then a trailer
//!   entry   8 B    rel_offset u32 | position u32           (batch start, LE)
//!   trailer 48 B   magic u32 "SLIX" | version u32 | log_bytes u64 | next_offset u64
//!                  | max_timestamp i64 | index_entries u32 | time_entries u32
//!                  | reserved u32 | crc32c u32 (of the 44 bytes before it)
//! <base>.timeindex entries only
//!   entry   16 B   max_ts_before i64 | rel_offset u32 | position u32
//! ```
//!
//! An offset entry is added at a batch start once `index_interval_bytes` have
//! passed since the previous entry (position 0 is implicit), so a lookup
//! scans at most one interval plus one batch. A time entry is added at the
//! same points and records the largest timestamp of every batch *before* it;
//! that running maximum never decreases, so the last entry below a target
//! timestamp is a safe place to start scanning for it.
//!
//! The trailer is the sealed segment's summary: recovery trusts a segment
//! whose trailer is intact and whose `log_bytes` equals the `.log` size, and
//! rescans it otherwise. The index is written once, when a segment is sealed
//! (roll or clean close); the active segment's index lives in memory.
//!
//! The rescan's per-batch step ([`scan_step`], driven over a file by the
//! log's `recover_scan` and over a buffer by [`scan_bytes`]) is here too:
//! it is pure, and it is what rebuilds these indexes.

use shardlog_schema::batch::{self, BatchError};

/// Bytes of one offset-index entry.
pub const INDEX_ENTRY_BYTES: usize = 8;
/// Bytes of one time-index entry.
pub const TIME_ENTRY_BYTES: usize = 16;
/// Bytes of the `.index` trailer.
pub const TRAILER_BYTES: usize = 48;
/// Entries read per index page on a lookup in a sealed segment.
pub const INDEX_PAGE_ENTRIES: usize = 512;

const TRAILER_MAGIC: u32 = u32::from_le_bytes(*b"SLIX");
const TRAILER_VERSION: u32 = 1;

/// Offset-index entry: a batch starting at `pos` with base `base + rel_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub rel_offset: u32,
    pub pos: u32,
}

/// Time-index entry: every batch before `pos` has a max timestamp at most
/// `max_ts_before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub max_ts_before: i64,
    pub rel_offset: u32,
    pub pos: u32,
}

/// What a sealed segment's trailer records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    pub log_bytes: u64,
    pub next_offset: u64,
    /// `i64::MIN` for an empty segment.
    pub max_timestamp: i64,
    pub index_entries: u32,
    pub time_entries: u32,
}

impl IndexEntry {
    #[must_use]
    pub fn decode(b: &[u8]) -> IndexEntry {
        IndexEntry { rel_offset: u32_at(b, 0), pos: u32_at(b, 4) }
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rel_offset.to_le_bytes());
        out.extend_from_slice(&self.pos.to_le_bytes());
    }
}

impl TimeEntry {
    #[must_use]
    pub fn decode(b: &[u8]) -> TimeEntry {
        TimeEntry {
            max_ts_before: i64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            rel_offset: u32_at(b, 8),
            pos: u32_at(b, 12),
        }
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.max_ts_before.to_le_bytes());
        out.extend_from_slice(&self.rel_offset.to_le_bytes());
        out.extend_from_slice(&self.pos.to_le_bytes());
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encodes a whole `.index` file: entries then trailer.
#[must_use]
pub fn encode_index(entries: &[IndexEntry], summary: &SegmentSummary) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * INDEX_ENTRY_BYTES + TRAILER_BYTES);
    for e in entries {
        e.encode(&mut out);
    }
    let start = out.len();
    out.extend_from_slice(&TRAILER_MAGIC.to_le_bytes());
    out.extend_from_slice(&TRAILER_VERSION.to_le_bytes());
    out.extend_from_slice(&summary.log_bytes.to_le_bytes());
    out.extend_from_slice(&summary.next_offset.to_le_bytes());
    out.extend_from_slice(&summary.max_timestamp.to_le_bytes());
    out.extend_from_slice(&summary.index_entries.to_le_bytes());
    out.extend_from_slice(&summary.time_entries.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, TRAILER_BYTES);
    out
}

/// Encodes a whole `.timeindex` file.
#[must_use]
pub fn encode_time_index(entries: &[TimeEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * TIME_ENTRY_BYTES);
    for e in entries {
        e.encode(&mut out);
    }
    out
}

/// Decodes a trailer (the last [`TRAILER_BYTES`] of an `.index` file) and
/// checks it against the file's size. `None` when anything is off.
#[must_use]
pub fn decode_trailer(trailer: &[u8], index_file_bytes: u64) -> Option<SegmentSummary> {
    if trailer.len() != TRAILER_BYTES {
        return None;
    }
    let crc = u32_at(trailer, 44);
    if crc32c::crc32c(&trailer[..44]) != crc
        || u32_at(trailer, 0) != TRAILER_MAGIC
        || u32_at(trailer, 4) != TRAILER_VERSION
    {
        return None;
    }
    let summary = SegmentSummary {
        log_bytes: u64_at(trailer, 8),
        next_offset: u64_at(trailer, 16),
        max_timestamp: u64_at(trailer, 24) as i64,
        index_entries: u32_at(trailer, 32),
        time_entries: u32_at(trailer, 36),
    };
    let expect = u64::from(summary.index_entries) * INDEX_ENTRY_BYTES as u64 + TRAILER_BYTES as u64;
    (expect == index_file_bytes).then_some(summary)
}

/// Index of the last element whose key is `<= target`, if any. `keys`
/// must be sorted (non-decreasing).
pub fn floor_by<T>(items: &[T], target: u64, key: impl Fn(&T) -> u64) -> Option<usize> {
    let n = items.partition_point(|e| key(e) <= target);
    n.checked_sub(1)
}

/// Builds the indexes of the active segment as batches are written.
#[derive(Debug, Clone)]
pub struct IndexBuilder {
    interval_bytes: u64,
    pub entries: Vec<IndexEntry>,
    pub times: Vec<TimeEntry>,
    last_entry_pos: u64,
    /// Largest batch max timestamp so far (`i64::MIN` when empty).
    pub max_timestamp: i64,
    /// First batch's first timestamp, for age-based rolling.
    pub first_timestamp: Option<i64>,
}

impl IndexBuilder {
    #[must_use]
    pub fn new(interval_bytes: u32) -> Self {
        IndexBuilder {
            interval_bytes: u64::from(interval_bytes.max(1)),
            entries: Vec::new(),
            times: Vec::new(),
            last_entry_pos: 0,
            max_timestamp: i64::MIN,
            first_timestamp: None,
        }
    }

    /// Rebuilds a builder from a sealed segment's index files.
    #[must_use]
    pub fn from_parts(
        interval_bytes: u32,
        entries: Vec<IndexEntry>,
        times: Vec<TimeEntry>,
        max_ts: i64,
    ) -> Self {
        let last_entry_pos = entries.last().map_or(0, |e| u64::from(e.pos));
        IndexBuilder {
            interval_bytes: u64::from(interval_bytes.max(1)),
            entries,
            times,
            last_entry_pos,
            max_timestamp: max_ts,
            first_timestamp: None,
        }
    }

    /// (largest, first) batch timestamps so far, `i64::MIN` when none.
    #[must_use]
    pub fn timestamps(&self) -> (i64, i64) {
        (self.max_timestamp, self.first_timestamp.unwrap_or(i64::MIN))
    }

    /// Records a batch written at `pos` (batches arrive in position order).
    pub fn on_batch(&mut self, rel_offset: u32, pos: u64, first_ts: i64, max_ts: i64) {
        if pos > 0 && pos - self.last_entry_pos >= self.interval_bytes {
            let pos32 = u32::try_from(pos).expect("segment positions fit u32");
            if let Some(last) = self.entries.last() {
                assert!(last.rel_offset < rel_offset && u64::from(last.pos) < pos, "index goes forward");
            }
            self.entries.push(IndexEntry { rel_offset, pos: pos32 });
            self.times.push(TimeEntry { max_ts_before: self.max_timestamp, rel_offset, pos: pos32 });
            self.last_entry_pos = pos;
        }
        self.first_timestamp.get_or_insert(first_ts);
        self.max_timestamp = self.max_timestamp.max(max_ts);
    }

    /// The entry to start scanning from for `rel_offset`.
    #[must_use]
    pub fn lookup_offset(&self, rel_offset: u32) -> IndexEntry {
        floor_by(&self.entries, u64::from(rel_offset), |e| u64::from(e.rel_offset))
            .map_or(IndexEntry { rel_offset: 0, pos: 0 }, |i| self.entries[i])
    }

    /// The last entry at or before position `pos`.
    #[must_use]
    pub fn lookup_pos(&self, pos: u64) -> IndexEntry {
        floor_by(&self.entries, pos, |e| u64::from(e.pos))
            .map_or(IndexEntry { rel_offset: 0, pos: 0 }, |i| self.entries[i])
    }

    #[must_use]
    pub fn summary(&self, log_bytes: u64, next_offset: u64) -> SegmentSummary {
        SegmentSummary {
            log_bytes,
            next_offset,
            max_timestamp: self.max_timestamp,
            index_entries: self.entries.len() as u32,
            time_entries: self.times.len() as u32,
        }
    }
}

/// Where to start scanning for the first batch with max timestamp `>= ts`.
#[must_use]
pub fn time_lookup(times: &[TimeEntry], ts: i64) -> (u32, u32) {
    // Entries are sorted by max_ts_before; want the last with max_ts_before < ts.
    let n = times.partition_point(|e| e.max_ts_before < ts);
    n.checked_sub(1).map_or((0, 0), |i| (times[i].rel_offset, times[i].pos))
}

/// Why a recovery scan stopped before the end of the file.
#[derive(Debug, PartialEq, Eq)]
pub enum ScanStop {
    /// Reached the end of the file on a batch boundary.
    Clean,
    /// Zeros where the next batch would start: preallocated, never written.
    ZeroTail,
    /// A batch that is cut short or fails its checks.
    Bad(BatchError),
    /// A batch whose base offset does not follow the previous one.
    OffsetGap { expected: u64, found: u64 },
    /// `stop_at_offset` reached (used by `truncate_to`).
    Limit,
    /// A batch whose records would pass the largest offset
    /// (`batch::OFFSET_MAX`): damage, whatever the offsets before it.
    OffsetOverflow { base_offset: u64, last_offset_delta: u32 },
}

/// Result of validating a segment batch by batch.
#[derive(Debug)]
pub struct Scan {
    pub valid_bytes: u64,
    pub next_offset: u64,
    pub index: IndexBuilder,
    pub stop: ScanStop,
    pub batches: u64,
    /// The idempotent batches seen, in log order (producer id, epoch,
    /// sequences and offsets), to rebuild the producer state from.
    pub producers: Vec<(i64, i16, super::producers::BatchSeq)>,
}

impl Scan {
    /// A scan about to start at the first byte of the segment based at `base`.
    #[must_use]
    pub fn start(base: u64, interval_bytes: u32) -> Scan {
        Scan {
            valid_bytes: 0,
            next_offset: base,
            index: IndexBuilder::new(interval_bytes),
            stop: ScanStop::Clean,
            batches: 0,
            producers: Vec::new(),
        }
    }
}

/// Recovery accepts batches up to this size whatever the topic limit is now
/// (the limit may have been lowered after they were written).
pub const RECOVERY_BATCH_BYTES_MAX: usize = 1 << 30;

/// One step of a recovery scan of the segment based at `base`: judges the
/// batch at file position `pos` (`pos == scan.valid_bytes`), whose bytes,
/// and whatever follows them, start `rest`. Either takes it into `scan`
/// (index, valid bytes, next offset) and returns true, or sets `scan.stop`
/// and returns false. `stop_at_offset` and `gaps_below` are as for the
/// log's `recover_scan`, which calls this once per batch.
#[doc(hidden)]
pub fn scan_step(
    scan: &mut Scan,
    rest: &[u8],
    base: u64,
    pos: u64,
    stop_at_offset: Option<u64>,
    gaps_below: u64,
) -> bool {
    if !rest.is_empty() && rest.iter().take(12).all(|&b| b == 0) {
        scan.stop = ScanStop::ZeroTail;
        return false;
    }
    let header = match batch::validate_stored(rest, RECOVERY_BATCH_BYTES_MAX) {
        Ok(h) => h,
        Err(e) => {
            scan.stop = ScanStop::Bad(e);
            return false;
        }
    };
    if let Some(limit) = stop_at_offset {
        // Only batches that end at or before the limit: a batch holding it
        // stops the scan too (a follower's truncation drops it whole).
        if header.base_offset >= limit || header.checked_next_offset().is_none_or(|n| n > limit) {
            scan.stop = ScanStop::Limit;
            return false;
        }
    }
    let gap_allowed = header.base_offset > scan.next_offset && header.base_offset < gaps_below;
    if header.base_offset != scan.next_offset && !gap_allowed {
        scan.stop = ScanStop::OffsetGap { expected: scan.next_offset, found: header.base_offset };
        return false;
    }
    // Offsets are `i64` on the wire. A batch passing the largest one would
    // leave the next offset saturated, not moving forward.
    let Some(next_offset) = header.checked_next_offset() else {
        scan.stop = ScanStop::OffsetOverflow {
            base_offset: header.base_offset,
            last_offset_delta: header.last_offset_delta,
        };
        return false;
    };
    // A segment spans fewer than 2^32 offsets (rolls and merges keep it
    // so); a base past that is damage, not a gap.
    let Ok(rel) = u32::try_from(header.base_offset - base) else {
        scan.stop = ScanStop::OffsetGap { expected: scan.next_offset, found: header.base_offset };
        return false;
    };
    scan.index.on_batch(rel, pos, header.first_timestamp, header.max_timestamp);
    if let Some(seq) = super::producers::BatchSeq::of(&header) {
        scan.producers.push((header.producer_id, header.producer_epoch, seq));
    }
    scan.valid_bytes += header.total_bytes() as u64;
    scan.next_offset = next_offset;
    scan.batches += 1;
    true
}

/// The recovery scan of a whole segment held in memory (`buf` is the
/// `.log` file's bytes): what the log's `recover_scan` finds reading the
/// same bytes from a file. For tests and fuzzing.
#[doc(hidden)]
#[must_use]
pub fn scan_bytes(
    buf: &[u8],
    base: u64,
    interval_bytes: u32,
    stop_at_offset: Option<u64>,
    gaps_below: u64,
) -> Scan {
    let mut scan = Scan::start(base, interval_bytes);
    loop {
        let pos = scan.valid_bytes;
        let Some(rest) = usize::try_from(pos).ok().and_then(|p| buf.get(p..)).filter(|r| !r.is_empty())
        else {
            scan.stop = ScanStop::Clean;
            return scan;
        };
        if !scan_step(&mut scan, rest, base, pos, stop_at_offset, gaps_below) {
            return scan;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn trailer_round_trip_and_damage() {
        let entries = vec![IndexEntry { rel_offset: 3, pos: 4096 }, IndexEntry { rel_offset: 9, pos: 9000 }];
        let s = SegmentSummary {
            log_bytes: 12345,
            next_offset: 77,
            max_timestamp: 99,
            index_entries: 2,
            time_entries: 2,
        };
        let bytes = encode_index(&entries, &s);
        let t = &bytes[bytes.len() - TRAILER_BYTES..];
        assert_eq!(decode_trailer(t, bytes.len() as u64), Some(s));
        assert_eq!(decode_trailer(t, bytes.len() as u64 + 8), None);
        let mut bad = t.to_vec();
        bad[10] ^= 1;
        assert_eq!(decode_trailer(&bad, bytes.len() as u64), None);
        assert_eq!(IndexEntry::decode(&bytes[8..16]), entries[1]);
    }

    proptest! {
        #[test]
        fn builder_lookup_finds_a_start_at_or_before(sizes in prop::collection::vec(61u64..20_000, 1..200),
                                                      interval in 1u32..10_000, probe in any::<u64>()) {
            let mut b = IndexBuilder::new(interval);
            let mut pos = 0u64;
            let mut starts = Vec::new();
            for (i, s) in sizes.iter().enumerate() {
                b.on_batch(i as u32 * 2, pos, 0, i as i64);
                starts.push((i as u32 * 2, pos));
                pos += s;
            }
            let target = (probe % (sizes.len() as u64 * 2)) as u32;
            let e = b.lookup_offset(target);
            prop_assert!(e.rel_offset <= target);
            prop_assert!(starts.contains(&(e.rel_offset, u64::from(e.pos))));
            // No later entry is also <= target.
            let better = b.entries.iter().filter(|x| x.rel_offset <= target).count();
            prop_assert!(better == 0 || b.entries[better - 1] == e);
            // The scan distance is bounded by the interval plus one batch.
            let containing = starts.iter().rev().find(|(o, _)| *o <= target).unwrap();
            prop_assert!(containing.1 - u64::from(e.pos) < u64::from(interval) + 20_000);
            let (_, tpos) = time_lookup(&b.times, (target / 2) as i64);
            prop_assert!(u64::from(tpos) <= containing.1);
        }
    }
}
