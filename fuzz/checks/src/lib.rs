//! The properties the fuzz targets check, one function per target, on
//! stable Rust. `fuzz/fuzz_targets/<target>.rs` (cargo-fuzz, nightly) calls
//! `<target>(data)` on every input libFuzzer makes; `tests/corpus.rs`
//! replays the committed corpus (`fuzz/corpus/<target>/*`) and minimised
//! crashes (`fuzz/regressions/<target>/*`) through the same function in the
//! normal `cargo test` run. See `fuzz/README.md`.
//!
//! Each function takes arbitrary bytes, feeds them to a decoder that reads
//! bytes from outside (a socket, a file, the command line), and panics
//! (`assert!`) when a property the decoder promises does not hold. Beyond
//! "does not panic", they check what the decoder's answer implies: lengths
//! within the input, offsets that do not wrap, a rescan that agrees, a
//! parse that survives a round trip. Where a checksum would stop almost
//! every mutated input at the door, a flag byte at the front of the input
//! asks the check to fix the checksum up first, so the fuzzer gets past it.

use shardlog_broker::config::{TopicConfig, MIN_CLEANABLE_DIRTY_PERMILLE_MAX, SEGMENT_BYTES_MIN};
use shardlog_broker::kafka::records::{kafka_to_native, TranslateError, DECODER_PANICKED};
use shardlog_broker::log::index::{
    self, IndexBuilder, IndexEntry, Scan, ScanStop, TimeEntry, INDEX_ENTRY_BYTES, RECOVERY_BATCH_BYTES_MAX,
    TIME_ENTRY_BYTES, TRAILER_BYTES,
};
use shardlog_schema::batch::{self, BatchHeader, BatchIter, BATCH_HEADER_BYTES, OFFSET_MAX};
use shardlog_schema::frame::{self, FrameLimits, HEADER_BYTES_MIN, LENGTH_PREFIX_BYTES};
use shardlog_schema::wire;
use std::fmt::Write as _;

/// The CLI's TOML settings file and `--config name=value` splitter: the
/// `shardlog` crate is a binary, so its (dependency-free) module is
/// compiled in here as it is.
#[allow(dead_code, reason = "only the parsers are used here, not Settings::load")]
#[path = "../../../tools/src/settings.rs"]
pub mod settings;

/// A target's check: panics when a property does not hold for the input.
pub type Check = fn(&[u8]);

/// The targets, by name: the directories under `fuzz/corpus/` and
/// `fuzz/regressions/`, the binaries of the fuzz crate.
pub const TARGETS: &[(&str, Check)] = &[
    ("frame", frame),
    ("request_body", request_body),
    ("batch", batch),
    ("index", index),
    ("recovery_scan", recovery_scan),
    ("settings_toml", settings_toml),
    ("topic_config", topic_config),
    ("kafka_records", kafka_records),
    ("kafka_request", kafka_request),
];

/// Takes fixed-size fields off the front of the input (zeros once it runs
/// out), for the parameters a check derives from its input.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// Formats into nothing: `Debug` of a verified flatbuffer reads every field
/// (and every nested table, vector and string) of it.
struct Sink;

impl std::fmt::Write for Sink {
    fn write_str(&mut self, _: &str) -> std::fmt::Result {
        Ok(())
    }
}

fn read_every_field(value: &impl std::fmt::Debug) {
    write!(Sink, "{value:?}").expect("the sink takes everything");
}

/// The request bodies the verifier matches against the api key, and the
/// union member each needs.
const CHECKED_BODIES: &[(wire::ApiKey, wire::RequestBody)] = &[
    (wire::ApiKey::ApiVersions, wire::RequestBody::ApiVersionsRequest),
    (wire::ApiKey::Metadata, wire::RequestBody::MetadataRequest),
    (wire::ApiKey::CreateTopics, wire::RequestBody::CreateTopicsRequest),
    (wire::ApiKey::DeleteTopics, wire::RequestBody::DeleteTopicsRequest),
    (wire::ApiKey::Produce, wire::RequestBody::ProduceRequest),
    (wire::ApiKey::Fetch, wire::RequestBody::FetchRequest),
    (wire::ApiKey::ListOffsets, wire::RequestBody::ListOffsetsRequest),
];

/// **frame**: a connection's bytes, `[u32 LE length][envelope]...`, as the
/// broker (requests) and the client (responses) read them.
///
/// - `decode_prefix` is the little-endian length, and `check_header_len`
///   accepts exactly `[HEADER_BYTES_MIN, header_bytes_max]`;
/// - a request that verifies has the body its api key needs (for the keys
///   the verifier judges), every field of it reads, and its envelope
///   rebuilt with `finish_into` verifies again with the same fields and a
///   length prefix equal to the bytes that follow it;
/// - a response that verifies reads in full.
///
/// The envelope is taken both as the prefix says (when it fits) and as the
/// whole input after the prefix, so the verifier is fuzzed whether or not
/// the fuzzer has got the prefix right.
pub fn frame(data: &[u8]) {
    let limits = FrameLimits::default();
    let Some((prefix, rest)) = data.split_first_chunk::<LENGTH_PREFIX_BYTES>() else {
        return;
    };
    let len = frame::decode_prefix(*prefix);
    assert_eq!(len, u32::from_le_bytes(*prefix));
    let accepted = limits.check_header_len(len).is_ok();
    assert_eq!(accepted, (HEADER_BYTES_MIN..=limits.header_bytes_max).contains(&len), "length {len}");
    if accepted {
        if let Some(header) = rest.get(..len as usize) {
            check_request(&limits, header);
            check_response(&limits, header);
        }
    }
    check_request(&limits, rest);
    check_response(&limits, rest);
}

fn check_request(limits: &FrameLimits, buf: &[u8]) {
    let Ok(f) = limits.verify_request(buf) else {
        return;
    };
    if let Some((_, body)) = CHECKED_BODIES.iter().find(|(key, _)| *key == f.api_key()) {
        assert_eq!(f.body_type(), *body, "api key {:?} verified with another body", f.api_key());
    }
    let _ = limits.check_payload_len(f.payload_bytes());
    read_every_field(&f);
    // The envelope again, with an empty body table of the same type.
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let client_id = f.client_id().map(|c| fbb.create_string(c));
    let body = (f.body_type() != wire::RequestBody::NONE).then(|| {
        let start = fbb.start_table();
        fbb.end_table(start).as_union_value()
    });
    let root = wire::RequestFrame::create(
        &mut fbb,
        &wire::RequestFrameArgs {
            correlation_id: f.correlation_id(),
            api_key: f.api_key(),
            api_version: f.api_version(),
            client_id,
            payload_bytes: f.payload_bytes(),
            body_type: f.body_type(),
            body,
        },
    );
    let mut out = Vec::new();
    frame::finish_into(&mut fbb, root, &mut out);
    let (prefix, rest) = out.split_first_chunk::<LENGTH_PREFIX_BYTES>().expect("a prefix");
    assert_eq!(frame::decode_prefix(*prefix) as usize, rest.len(), "the prefix counts the envelope");
    let g = limits.verify_request(rest).expect("a rebuilt envelope verifies");
    assert_eq!(
        (g.correlation_id(), g.api_key(), g.api_version(), g.client_id(), g.payload_bytes(), g.body_type()),
        (f.correlation_id(), f.api_key(), f.api_version(), f.client_id(), f.payload_bytes(), f.body_type())
    );
}

fn check_response(limits: &FrameLimits, buf: &[u8]) {
    if let Ok(f) = limits.verify_response(buf) {
        let _ = limits.check_payload_len(f.payload_bytes());
        read_every_field(&f);
    }
}

/// Verifies `buf` as a root `T` with the frame verifier's options and, when
/// it verifies, reads all of it.
fn verify_alone<'a, T>(limits: &FrameLimits, buf: &'a [u8])
where
    T: flatbuffers::Follow<'a> + flatbuffers::Verifiable + 'a,
    T::Inner: std::fmt::Debug,
{
    if let Ok(t) = flatbuffers::root_with_opts::<T>(&limits.verifier_options(), buf) {
        read_every_field(&t);
    }
}

/// The number of request body types [`request_body`] chooses from.
pub const REQUEST_BODIES: u8 = 17;

/// **request_body**: each request table of the union on its own. The
/// first byte picks the table (`% 17`, in union order: ApiVersions,
/// Metadata, CreateTopics, DeleteTopics, Produce, Fetch, ListOffsets,
/// FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
/// OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups);
/// the rest is verified as that table, and, when it verifies, every field
/// of it reads without panic.
pub fn request_body(data: &[u8]) {
    let Some((&which, buf)) = data.split_first() else {
        return;
    };
    let l = &FrameLimits::default();
    match which % REQUEST_BODIES {
        0 => verify_alone::<wire::ApiVersionsRequest>(l, buf),
        1 => verify_alone::<wire::MetadataRequest>(l, buf),
        2 => verify_alone::<wire::CreateTopicsRequest>(l, buf),
        3 => verify_alone::<wire::DeleteTopicsRequest>(l, buf),
        4 => verify_alone::<wire::ProduceRequest>(l, buf),
        5 => verify_alone::<wire::FetchRequest>(l, buf),
        6 => verify_alone::<wire::ListOffsetsRequest>(l, buf),
        7 => verify_alone::<wire::FindCoordinatorRequest>(l, buf),
        8 => verify_alone::<wire::JoinGroupRequest>(l, buf),
        9 => verify_alone::<wire::SyncGroupRequest>(l, buf),
        10 => verify_alone::<wire::HeartbeatRequest>(l, buf),
        11 => verify_alone::<wire::LeaveGroupRequest>(l, buf),
        12 => verify_alone::<wire::OffsetCommitRequest>(l, buf),
        13 => verify_alone::<wire::OffsetFetchRequest>(l, buf),
        14 => verify_alone::<wire::ListGroupsRequest>(l, buf),
        15 => verify_alone::<wire::DescribeGroupsRequest>(l, buf),
        _ => verify_alone::<wire::DeleteGroupsRequest>(l, buf),
    }
}

/// Flag bits of the first input byte of [`batch`] and [`recovery_scan`].
pub const FIX_LENGTH: u8 = 1;
pub const FIX_CRC: u8 = 2;

/// Field offsets of the batch header (`schema/src/batch.rs`).
const OFF_BATCH_LENGTH: usize = 8;
const OFF_CRC: usize = 17;

/// Sets the CRC of the batch at the start of `buf` (its length as its
/// header says, cut at the end of `buf`) to the one its bytes give.
fn fix_crc(buf: &mut [u8]) {
    if buf.len() < BATCH_HEADER_BYTES {
        return;
    }
    let total = batch::peek_total_bytes(buf).unwrap_or(0).clamp(BATCH_HEADER_BYTES, buf.len());
    let crc = batch::compute_crc(&buf[..total]);
    buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

/// **batch**: one record batch, as a producer sends it or a log holds it.
/// Input: a flag byte (`FIX_LENGTH`: set `batch_length` to the input's
/// length; `FIX_CRC`: recompute the CRC), a byte choosing the batch size
/// limit, then the batch.
///
/// - `BatchHeader::parse`: the offsets it derives never wrap (`last_offset`
///   and `next_offset` saturate, `checked_next_offset` refuses past
///   `OFFSET_MAX`);
/// - `validate_stored` / `validate` / `validate_with_records`: each accepts
///   only what the weaker one accepts, with the length within the input and
///   the limit, a CRC that matches, and `record_count` within the offsets
///   (`== last_offset_delta + 1` for a producer's batch);
/// - a batch `validate_with_records` accepts decodes (`records`) to
///   `record_count` records, offsets rising within `[base, last_offset]`,
///   timestamps `first_timestamp + delta`, once stamped with any base that
///   leaves room; keyed compaction's `filter_records` keeps it whole when
///   keeping every record, and keeping some gives a valid stored batch with
///   exactly those records;
/// - `records` never yields an offset past `last_offset` or `OFFSET_MAX`;
/// - `BatchIter` yields batches that tile a prefix of its input.
pub fn batch(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let limit_choice = input.u8();
    let mut buf = input.rest().to_vec();
    if buf.len() >= BATCH_HEADER_BYTES {
        if flags & FIX_LENGTH != 0 {
            let len = u32::try_from(buf.len() - batch::BATCH_LENGTH_PREFIX_BYTES).unwrap_or(u32::MAX);
            buf[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_le_bytes());
        }
        if flags & FIX_CRC != 0 {
            fix_crc(&mut buf);
        }
    }
    let limit = match limit_choice % 4 {
        0 => 1 << 20,
        1 => buf.len(),
        2 => usize::from(limit_choice) * 4,
        _ => usize::MAX,
    };
    check_batch(&buf, limit);
    let mut pos = 0;
    let mut batches = 0;
    for item in BatchIter::new(&buf, limit) {
        match item {
            Ok((h, bytes)) => {
                assert_eq!(bytes.len(), h.total_bytes());
                assert_eq!(bytes.as_ptr(), buf[pos..].as_ptr(), "batches follow on");
                assert_eq!(batch::validate_stored(bytes, limit), Ok(h));
                pos += bytes.len();
                batches += 1;
            }
            Err(_) => break,
        }
    }
    assert!(pos <= buf.len() && batches <= buf.len() / BATCH_HEADER_BYTES);
}

fn check_batch(buf: &[u8], limit: usize) {
    let parsed = BatchHeader::parse(buf);
    if let Ok(h) = &parsed {
        assert!(buf.len() >= BATCH_HEADER_BYTES && h.magic == batch::BATCH_MAGIC);
        assert_eq!(batch::peek_total_bytes(buf), Some(h.total_bytes()));
        assert!(h.base_offset <= h.last_offset() && h.last_offset() <= h.next_offset());
        let exact = u128::from(h.base_offset) + u128::from(h.last_offset_delta) + 1;
        match h.checked_next_offset() {
            Some(next) => {
                assert_eq!(u128::from(next), exact);
                assert!(next <= OFFSET_MAX + 1);
                assert_eq!(next, h.next_offset());
            }
            None => assert!(exact > u128::from(OFFSET_MAX) + 1),
        }
    }
    let stored = batch::validate_stored(buf, limit);
    let producer = batch::validate(buf, limit);
    let full = batch::validate_with_records(buf, limit);
    if let Ok(h) = &stored {
        assert_eq!(Ok(h), parsed.as_ref());
        let total = h.total_bytes();
        assert!((BATCH_HEADER_BYTES..=limit.min(buf.len())).contains(&total), "length {total}");
        assert_eq!(batch::compute_crc(&buf[..total]), h.crc);
        assert!(h.record_count >= 1);
        assert!(u64::from(h.record_count) <= u64::from(h.last_offset_delta) + 1);
    }
    if let Ok(h) = &producer {
        assert_eq!(Ok(h), stored.as_ref());
        assert_eq!(u64::from(h.record_count), u64::from(h.last_offset_delta) + 1);
    }
    if let Ok(h) = &full {
        assert_eq!(Ok(h), producer.as_ref());
        assert_eq!(h.codec(), 0);
        check_valid_batch(&buf[..h.total_bytes()], h);
    }
    // Whatever the input, decoded offsets stay within the batch.
    if let (Ok(h), Ok(records)) = (&parsed, batch::records(buf)) {
        for r in &records {
            assert!(r.offset >= h.base_offset && r.offset <= h.last_offset() && r.offset <= OFFSET_MAX);
        }
    }
    if stored.is_ok() {
        let _ = batch::filter_records(buf, |r| r.offset % 2 == 0);
    }
}

/// What `records` gives for a batch `validate_with_records` accepted,
/// under the base offset it has and under base 0 (which always fits).
fn check_valid_batch(one: &[u8], h: &BatchHeader) {
    let mut at_zero = one.to_vec();
    batch::stamp(&mut at_zero, 0, 0);
    let h0 = batch::validate_with_records(&at_zero, usize::MAX).expect("stamping keeps a batch valid");
    assert_eq!(h0.base_offset, 0);
    for (bytes, header) in [(one, *h), (&at_zero[..], h0)] {
        let records = batch::records(bytes);
        if header.checked_next_offset().is_none() {
            continue; // a base offset that leaves no room: refused, never wrapped
        }
        let records = records.expect("a valid batch with room for its offsets decodes");
        assert_eq!(records.len(), header.record_count as usize);
        let mut previous = None;
        for r in &records {
            assert!(previous.is_none_or(|p| r.offset > p), "offsets rise");
            assert!(r.offset >= header.base_offset && r.offset <= header.last_offset());
            previous = Some(r.offset);
        }
        let whole = batch::filter_records(bytes, |_| true).expect("valid").expect("records kept");
        assert_eq!(whole, bytes, "keeping every record keeps the batch");
        let kept_offsets: Vec<u64> = records.iter().map(|r| r.offset).filter(|o| o % 2 == 0).collect();
        match batch::filter_records(bytes, |r| r.offset % 2 == 0).expect("valid") {
            None => assert!(kept_offsets.is_empty()),
            Some(kept) => {
                let k =
                    batch::validate_stored(&kept, kept.len()).expect("a filtered batch is a stored batch");
                assert_eq!(
                    (k.base_offset, k.last_offset_delta, k.record_count as usize),
                    (header.base_offset, header.last_offset_delta, kept_offsets.len())
                );
                let got = batch::records(&kept).expect("a filtered batch decodes");
                let want: Vec<_> = records.iter().filter(|r| r.offset % 2 == 0).cloned().collect();
                assert_eq!(got, want);
            }
        }
    }
}

/// Flag bits of the first input byte of [`index`].
pub const INDEX_FIX_CRC: u8 = 1;
pub const INDEX_FIX_MAGIC: u8 = 2;
pub const INDEX_ANY_FILE_SIZE: u8 = 4;

/// **index**: a sealed segment's `.index` file (entries, then the 48-byte
/// trailer) and `.timeindex` file (entries). Input: a flag byte
/// (`INDEX_FIX_CRC`, `INDEX_FIX_MAGIC`: make the trailer's CRC, magic and
/// version right; `INDEX_ANY_FILE_SIZE`: judge the trailer against the
/// file size in the next 8 bytes rather than the input's), then the file.
///
/// - `IndexEntry::decode` / `TimeEntry::decode` read every 8 / 16 bytes,
///   and encoding the entry gives back the same bytes;
/// - `decode_trailer` accepts only a trailer of 48 bytes, and only with a
///   file size of `index_entries * 8 + 48`; what it accepts encodes back
///   (`encode_index` over the file's entries) to the same file, but for the
///   reserved field, and decodes again to the same summary;
/// - lookups over the decoded entries (`IndexBuilder::from_parts`, as
///   after a clean shutdown, `lookup_offset`, `lookup_pos`, `time_lookup`)
///   answer an entry of the file or the implicit start, and on sorted
///   entries the last one at or before the target.
pub fn index(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let claimed_size = if flags & INDEX_ANY_FILE_SIZE != 0 { Some(input.u64()) } else { None };
    let probe = input.u64();
    let mut file = input.rest().to_vec();
    if file.len() >= TRAILER_BYTES {
        let t = file.len() - TRAILER_BYTES;
        if flags & INDEX_FIX_MAGIC != 0 {
            file[t..t + 4].copy_from_slice(b"SLIX");
            file[t + 4..t + 8].copy_from_slice(&1u32.to_le_bytes());
        }
        if flags & INDEX_FIX_CRC != 0 {
            let crc = crc32c::crc32c(&file[t..t + 44]);
            file[t + 44..].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let entries: Vec<IndexEntry> = file.chunks_exact(INDEX_ENTRY_BYTES).map(IndexEntry::decode).collect();
    for (e, chunk) in entries.iter().zip(file.chunks_exact(INDEX_ENTRY_BYTES)) {
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(out, chunk);
    }
    let times: Vec<TimeEntry> = file.chunks_exact(TIME_ENTRY_BYTES).map(TimeEntry::decode).collect();
    for (e, chunk) in times.iter().zip(file.chunks_exact(TIME_ENTRY_BYTES)) {
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(out, chunk);
    }
    assert_eq!(index::encode_time_index(&times), file[..times.len() * TIME_ENTRY_BYTES]);
    check_trailer(&file, claimed_size);
    check_lookups(&entries, &times, probe);
}

fn check_trailer(file: &[u8], claimed_size: Option<u64>) {
    let size = claimed_size.unwrap_or(file.len() as u64);
    if file.len() < TRAILER_BYTES {
        assert_eq!(index::decode_trailer(file, size), None);
        return;
    }
    let t = file.len() - TRAILER_BYTES;
    let trailer = &file[t..];
    assert_eq!(index::decode_trailer(&trailer[1..], size), None, "47 bytes are no trailer");
    let Some(s) = index::decode_trailer(trailer, size) else {
        return;
    };
    assert_eq!(size, u64::from(s.index_entries) * INDEX_ENTRY_BYTES as u64 + TRAILER_BYTES as u64);
    let encoded = index::encode_index(&[], &s);
    assert_eq!(
        index::decode_trailer(&encoded, TRAILER_BYTES as u64 + 8 * u64::from(s.index_entries)),
        Some(s)
    );
    if size == file.len() as u64 {
        let entries: Vec<IndexEntry> =
            file[..t].chunks_exact(INDEX_ENTRY_BYTES).map(IndexEntry::decode).collect();
        assert_eq!(entries.len(), s.index_entries as usize);
        let again = index::encode_index(&entries, &s);
        assert_eq!(again.len(), file.len());
        // The reserved field (4 bytes before the CRC) is written as zero and
        // not judged on reading; everything else comes back.
        assert_eq!(again[..t + 40], file[..t + 40]);
        if file[t + 40..t + 44] == [0; 4] {
            assert_eq!(again, file);
        }
        assert_eq!(index::decode_trailer(&again[t..], size), Some(s));
    }
}

fn check_lookups(entries: &[IndexEntry], times: &[TimeEntry], probe: u64) {
    let builder = IndexBuilder::from_parts(4096, entries.to_vec(), times.to_vec(), i64::MAX);
    let start = IndexEntry { rel_offset: 0, pos: 0 };
    let target = probe as u32;
    let by_offset = builder.lookup_offset(target);
    let by_pos = builder.lookup_pos(probe);
    assert!(by_offset == start || entries.contains(&by_offset));
    assert!(by_pos == start || entries.contains(&by_pos));
    if entries.windows(2).all(|w| w[0].rel_offset <= w[1].rel_offset) {
        let want = entries.iter().rev().find(|e| e.rel_offset <= target).copied().unwrap_or(start);
        assert_eq!(by_offset.rel_offset, want.rel_offset);
    }
    if entries.windows(2).all(|w| w[0].pos <= w[1].pos) {
        let want = entries.iter().rev().find(|e| u64::from(e.pos) <= probe).copied().unwrap_or(start);
        assert_eq!(by_pos.pos, want.pos);
    }
    let ts = probe as i64;
    let (rel, pos) = index::time_lookup(times, ts);
    assert!((rel, pos) == (0, 0) || times.iter().any(|e| (e.rel_offset, e.pos) == (rel, pos)));
    if times.windows(2).all(|w| w[0].max_ts_before <= w[1].max_ts_before) {
        let want =
            times.iter().rev().find(|e| e.max_ts_before < ts).map_or((0, 0), |e| (e.rel_offset, e.pos));
        assert_eq!((rel, pos), want);
    }
}

/// Flag bits of the first input byte of [`recovery_scan`].
pub const SCAN_FIX_CRC: u8 = 1;
pub const SCAN_FIX_OFFSETS: u8 = 2;
pub const SCAN_STOP_AT: u8 = 4;
pub const SCAN_GAPS: u8 = 8;
pub const SCAN_BASE_HIGH: u8 = 16;

/// **recovery_scan**: the rescan of a segment after a crash
/// (`log::index::scan_bytes`, the per-batch step the log's `recover_scan`
/// runs over the file). Input: a flag byte, the segment base (u32; near
/// `u64::MAX` with `SCAN_BASE_HIGH`), the index interval (u16),
/// `stop_at_offset` and `gaps_below` (u32, above the base; used with
/// `SCAN_STOP_AT` / `SCAN_GAPS`), then the `.log` bytes. `SCAN_FIX_CRC`
/// recomputes each batch's CRC and `SCAN_FIX_OFFSETS` makes each base
/// offset follow on from the previous batch, so that the fuzzer reaches
/// the offset and index logic.
///
/// - the valid prefix is at most the input, ends on a batch boundary, and
///   covers `batches` batches that `BatchIter` finds there too;
/// - `Clean` means the whole input is valid; `ZeroTail` means zeros follow;
/// - offsets never go backwards and never wrap: `next_offset >= base`,
///   and past a batch it is at most `OFFSET_MAX + 1`;
/// - the rebuilt index goes strictly forward, inside the valid prefix;
/// - rescanning the valid prefix gives the same result, stopping `Clean`.
pub fn recovery_scan(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let base_raw = u64::from(input.u32());
    let base = if flags & SCAN_BASE_HIGH != 0 { u64::MAX - base_raw } else { base_raw };
    let interval = u32::from(input.u16());
    let stop_at = base.saturating_add(u64::from(input.u32()));
    let gaps = base.saturating_add(u64::from(input.u32()));
    let stop_at = (flags & SCAN_STOP_AT != 0).then_some(stop_at);
    let gaps_below = if flags & SCAN_GAPS != 0 { gaps } else { 0 };
    let mut buf = input.rest().to_vec();
    if flags & (SCAN_FIX_CRC | SCAN_FIX_OFFSETS) != 0 {
        let mut pos = 0;
        let mut next = base;
        while let Some(total) = batch::peek_total_bytes(&buf[pos..]) {
            if total < BATCH_HEADER_BYTES || buf.len() - pos < total {
                break;
            }
            let one = &mut buf[pos..pos + total];
            if flags & SCAN_FIX_OFFSETS != 0 {
                one[..8].copy_from_slice(&next.to_le_bytes());
            }
            if flags & SCAN_FIX_CRC != 0 {
                fix_crc(one);
            }
            next = BatchHeader::parse(one).map_or(next, |h| h.next_offset());
            pos += total;
        }
    }
    let scan = index::scan_bytes(&buf, base, interval, stop_at, gaps_below);
    check_scan(&buf, base, &scan);
    assert!(scan.next_offset <= OFFSET_MAX + 1 || scan.batches == 0, "offsets stay i64");
    let again = index::scan_bytes(&buf[..scan.valid_bytes as usize], base, interval, stop_at, gaps_below);
    assert_eq!(again.stop, ScanStop::Clean, "the valid prefix rescans clean");
    assert_eq!(
        (again.valid_bytes, again.next_offset, again.batches),
        (scan.valid_bytes, scan.next_offset, scan.batches)
    );
    assert_eq!(again.index.entries, scan.index.entries);
    assert_eq!(again.index.times, scan.index.times);
    assert_eq!(again.index.max_timestamp, scan.index.max_timestamp);
}

fn check_scan(buf: &[u8], base: u64, scan: &Scan) {
    let valid = usize::try_from(scan.valid_bytes).expect("within the input");
    assert!(valid <= buf.len(), "valid prefix {valid} of {} bytes", buf.len());
    assert!(scan.next_offset >= base);
    match &scan.stop {
        ScanStop::Clean => assert_eq!(valid, buf.len()),
        ScanStop::ZeroTail => assert!(buf[valid..].iter().take(12).all(|&b| b == 0) && valid < buf.len()),
        ScanStop::Limit | ScanStop::Bad(_) | ScanStop::OffsetGap { .. } | ScanStop::OffsetOverflow { .. } => {
            assert!(valid < buf.len());
        }
    }
    let mut tiled = 0;
    let mut count = 0;
    for item in BatchIter::new(&buf[..valid], RECOVERY_BATCH_BYTES_MAX) {
        let (_, bytes) = item.expect("the valid prefix holds only valid batches");
        tiled += bytes.len();
        count += 1;
    }
    assert_eq!((tiled, count), (valid, scan.batches), "the valid prefix is whole batches");
    let e = &scan.index.entries;
    assert!(e.windows(2).all(|w| w[0].rel_offset < w[1].rel_offset && w[0].pos < w[1].pos));
    assert!(e.iter().all(|x| (x.pos as usize) < valid.max(1) && x.pos > 0));
    let t = &scan.index.times;
    assert_eq!(t.len(), e.len());
    assert!(t.iter().zip(e).all(|(t, e)| (t.rel_offset, t.pos) == (e.rel_offset, e.pos)));
    assert!(t.windows(2).all(|w| w[0].max_ts_before <= w[1].max_ts_before));
}

/// **settings_toml**: the CLI's TOML settings file (`--config-file`,
/// `shardlog.example.toml`). Either the text is refused, or the settings
/// it gives serialize back to TOML that parses to the same settings and
/// serializes the same again.
pub fn settings_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = toml::from_str::<settings::Settings>(text) else {
        return;
    };
    let out = toml::to_string(&parsed).expect("parsed settings serialize");
    let back: settings::Settings = toml::from_str(&out).expect("serialized settings parse");
    assert_eq!(format!("{back:?}"), format!("{parsed:?}"), "settings survive a round trip:\n{out}");
    assert_eq!(toml::to_string(&back).expect("serialize"), out);
}

/// **topic_config**: `--config name=value` topic settings, one per line
/// of the input: split by `parse_kv` (the CLI's splitter), applied by
/// `TopicConfig::from_entries` (the broker's parser, also used for stored
/// topic metadata). A split key is non-empty and trimmed. The settings are
/// either refused with an error naming one of the given pairs, or give a
/// config within its bounds whose own `entries()` parse back to it.
pub fn topic_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut pairs = Vec::new();
    for line in text.lines() {
        match settings::parse_kv(line) {
            Ok((k, v)) => {
                assert!(!k.is_empty() && k == k.trim() && v == v.trim());
                pairs.push((k, v));
            }
            Err(_) => assert!(line.split_once('=').is_none_or(|(k, _)| k.trim().is_empty())),
        }
    }
    let config = match TopicConfig::from_entries(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        Ok(c) => c,
        Err(shardlog_broker::config::ConfigError::Unknown(name)) => {
            assert!(pairs.iter().any(|(k, _)| *k == name));
            return;
        }
        Err(shardlog_broker::config::ConfigError::Invalid { name, value, .. }) => {
            assert!(pairs.iter().any(|(k, v)| *k == name && *v == value));
            return;
        }
    };
    assert!(config.segment_bytes >= SEGMENT_BYTES_MIN && config.segment_ms >= 1);
    assert!(config.index_interval_bytes >= 1);
    assert!(config.min_cleanable_dirty_permille <= MIN_CLEANABLE_DIRTY_PERMILLE_MAX);
    let entries = config.entries();
    let again = TopicConfig::from_entries(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .expect("a config's own entries parse");
    assert_eq!(again, config);
    assert_eq!(again.entries(), entries);
}

/// **kafka_records**: the record batches of a Kafka produce request
/// (Kafka's v2 format, big-endian, maybe compressed), translated into
/// Shardlog batches by `kafka::records::kafka_to_native`. Input: a flag
/// byte (`FIX_LENGTH`, `FIX_CRC`: make the first Kafka batch's length and
/// CRC right), then the Kafka bytes. Either the bytes are refused (and
/// not by a panic of the decoder, which runs under `catch_unwind`), or the
/// translation is whole valid Shardlog batches (`validate_with_records`)
/// holding exactly the records counted, which translate back to Kafka.
pub fn kafka_records(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if buf.len() >= BATCH_HEADER_BYTES {
        if flags & FIX_LENGTH != 0 {
            let len = u32::try_from(buf.len() - batch::BATCH_LENGTH_PREFIX_BYTES).unwrap_or(u32::MAX);
            buf[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
        }
        if flags & FIX_CRC != 0 {
            let total = (12 + u32::from_be_bytes(buf[8..12].try_into().expect("4")) as usize).min(buf.len());
            if total >= batch::CRC_START {
                let crc = crc32c::crc32c(&buf[batch::CRC_START..total]);
                buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
            }
        }
    }
    let mut out = Vec::new();
    // The topic default batch limit bounds decompression, as on produce.
    let limit = shardlog_broker::config::BATCH_BYTES_MAX_DEFAULT as usize;
    let count = match kafka_to_native(bytes::Bytes::from(buf), &mut out, limit) {
        Ok(count) => count,
        // The decoder runs under `catch_unwind` as a last defence; a panic
        // in it is a bug all the same (and in a release build, where
        // overflow does not panic, a wrapped value instead).
        Err(TranslateError::Decode(why)) => {
            assert_ne!(why, DECODER_PANICKED, "the Kafka record decoder panicked");
            return;
        }
        Err(_) => return,
    };
    let (mut records, mut tiled) = (0usize, 0usize);
    for item in BatchIter::new(&out, usize::MAX) {
        let (h, bytes) = item.expect("translated batches are valid stored batches");
        assert_eq!(batch::validate_with_records(bytes, usize::MAX), Ok(h), "a producer's batch");
        records += h.record_count as usize;
        tiled += bytes.len();
    }
    assert_eq!((tiled, records), (out.len(), count));
    let mut back = bytes::BytesMut::new();
    shardlog_broker::kafka::records::native_to_kafka(&out, usize::MAX, &mut back)
        .expect("translated batches translate back");
}

/// **kafka_request**: a Kafka request frame (without its length prefix),
/// decoded as the Kafka listener does before serving it
/// (`kafka::request::decode_frame`: the API key and version words, the
/// request header, the body of every supported API). Either it is refused
/// with a reason, not a panic (the vendored `kafka-protocol` decoders run
/// under `catch_unwind` here), or it decoded as a supported API and version
/// whose header names the same API and version.
pub fn kafka_request(data: &[u8]) {
    use shardlog_broker::kafka::{request::decode_frame, SUPPORTED};
    let frame = bytes::Bytes::copy_from_slice(data);
    let decoded = std::panic::catch_unwind(move || decode_frame(frame).map(|(api, v, h, _)| (api, v, h)));
    let Ok(decoded) = decoded else {
        panic!("the Kafka request decoder panicked");
    };
    if let Ok((api, version, header)) = decoded {
        assert!(SUPPORTED.iter().any(|(k, min, max)| *k == api && (*min..=*max).contains(&version)));
        assert_eq!((header.request_api_key, header.request_api_version), (api as i16, version));
    }
}
