//! A writer of the `RecordSet` flatbuffer (the records of a batch) that
//! knows the schema, in place of the generic `FlatBufferBuilder`.
//!
//! The bytes are an ordinary flatbuffer of `fbs/shardlog.fbs`: every reader,
//! old or new, reads them with the generated code and the verifier. What is
//! different is how they are made. The generic builder tracks each field,
//! trims defaults, and looks every new table's vtable up among those already
//! written (a binary search with a `memcmp` per step): per 100 B record that
//! was a fifth of the producer's CPU. Here a record's table has a fixed
//! shape per combination of present fields (key, value, headers), its
//! scalars are always written (default or not), and each shape's vtable is
//! written once per record set and shared by every record of that shape.
//!
//! Like the builder, the writer works back to front: `buf[head..]` holds the
//! bytes written so far, and an object is named by its *revpos*, its distance
//! from the end of the buffer. Objects are aligned relative to the end, and
//! `finish` pads the whole to a multiple of [`MIN_ALIGN`], so they are
//! aligned relative to the start as the verifier wants.
//!
//! ```text
//!  record table (revpos a multiple of 8):
//!    +0  soffset to the shape's vtable   (i32)
//!    +4  offset_delta                    (u32)
//!    +8  uoffsets of the present fields of value, key, headers, in that order
//!    ..  padding to 8
//!    +t  timestamp_delta                 (i64)
//!  vtable: [vtable bytes, table bytes, offset_delta, timestamp_delta, key, value, headers] (u16 each, 0 = absent)
//! ```

use crate::batch::{HeaderRef, BATCH_HEADER_BYTES};
use std::mem::MaybeUninit;

/// Largest alignment of any scalar in a record set (`timestamp_delta`).
const MIN_ALIGN: usize = 8;
/// Record fields of the schema, in field-id order.
const RECORD_FIELDS: usize = 5;
const RECORD_VTABLE_BYTES: usize = 4 + 2 * RECORD_FIELDS;
/// `RecordHeader`: soffset, key (string), value ([ubyte]).
const HEADER_TABLE_BYTES: usize = 12;
const HEADER_VTABLE: [u16; 4] = [8, HEADER_TABLE_BYTES as u16, 4, 8];
/// `RecordSet`: soffset, records ([Record]).
const SET_TABLE_BYTES: usize = 8;
const SET_VTABLE: [u16; 3] = [6, SET_TABLE_BYTES as u16, 4];

/// Which of a record's optional fields are present: one vtable per shape.
#[derive(Clone, Copy)]
struct Shape {
    value: bool,
    key: bool,
    headers: bool,
}

impl Shape {
    fn index(self) -> usize {
        usize::from(self.value) | usize::from(self.key) << 1 | usize::from(self.headers) << 2
    }

    fn fields(self) -> usize {
        usize::from(self.value) + usize::from(self.key) + usize::from(self.headers)
    }

    /// Where `timestamp_delta` sits in the table, and the table's size.
    fn layout(self) -> (usize, usize) {
        let ts = (8 + 4 * self.fields()).next_multiple_of(8);
        (ts, ts + 8)
    }
}

/// Zeros for padding.
const ZEROS: [u8; MIN_ALIGN] = [0; MIN_ALIGN];

/// Builds one `RecordSet` flatbuffer. See the module docs.
///
/// The buffer is not zeroed when allocated: `put` is the only way bytes are
/// added, and it writes every byte it adds (padding included), so
/// `buf[head..]` is always initialized and `buf[..head]` never read. That
/// spares a `memset` of every batch buffer (7 % of the producer's CPU at
/// 100 B records when it was `vec![0; n]`).
pub(crate) struct RecordSetWriter {
    buf: Box<[MaybeUninit<u8>]>,
    head: usize,
    /// Revpos of each record's table, in push order.
    records: Vec<u32>,
    /// Revpos of each shape's vtable once written (0: not yet).
    vtables: [u32; 8],
    header_vtable: u32,
}

/// The bytes a writer wrote: `buf[head..]`.
pub(crate) struct Written {
    buf: Box<[MaybeUninit<u8>]>,
    head: usize,
}

impl AsRef<[u8]> for Written {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `buf[head..]` was written by `RecordSetWriter::put` (the
        // writer's invariant, carried over unchanged by `finish`).
        unsafe { self.buf[self.head..].assume_init_ref() }
    }
}

impl RecordSetWriter {
    pub(crate) fn with_capacity(bytes: usize) -> RecordSetWriter {
        let bytes = bytes.max(64);
        RecordSetWriter {
            buf: Box::new_uninit_slice(bytes),
            head: bytes,
            records: Vec::new(),
            vtables: [0; 8],
            header_vtable: 0,
        }
    }

    /// Records pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes written so far (the records, not yet their vector and root).
    pub(crate) fn used(&self) -> usize {
        self.buf.len() - self.head
    }

    fn written(&self) -> &[u8] {
        // SAFETY: `buf[head..]` was written by `put` (see the type's docs).
        unsafe { self.buf[self.head..].assume_init_ref() }
    }

    /// Makes room for `n` more bytes in front of `head`.
    #[inline]
    fn reserve(&mut self, n: usize) {
        if self.head < n {
            self.grow(n);
        }
    }

    /// Doubles the buffer (at least).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let used = self.used();
        let len = (self.buf.len() * 2).max(used + n);
        let mut grown = Box::new_uninit_slice(len);
        grown[len - used..].write_copy_of_slice(self.written());
        self.buf = grown;
        self.head = len - used;
    }

    /// Writes `bytes` in front of the data; returns the new revpos.
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> u32 {
        self.reserve(bytes.len());
        self.head -= bytes.len();
        self.buf[self.head..self.head + bytes.len()].write_copy_of_slice(bytes);
        self.revpos()
    }

    /// Pads so that after `then` more bytes the revpos is a multiple of `align`.
    fn align(&mut self, align: usize, then: usize) {
        let pad = (align - (self.used() + then) % align) % align;
        self.put(&ZEROS[..pad]);
    }

    fn revpos(&self) -> u32 {
        u32::try_from(self.used()).expect("a record set is smaller than 4 GiB")
    }

    /// A `[ubyte]` vector (or, with `nul`, a string: its bytes and a NUL the
    /// length does not count); returns its revpos.
    fn push_bytes(&mut self, data: &[u8], nul: bool) -> u32 {
        let body = data.len() + usize::from(nul);
        self.align(4, body + 4);
        self.reserve(body + 4);
        if nul {
            self.put(&[0]);
        }
        self.put(data);
        self.put(&u32::try_from(data.len()).expect("under 4 GiB").to_le_bytes())
    }

    /// A vector of tables at `targets` (revposes); returns its revpos.
    fn push_offsets(&mut self, targets: &[u32]) -> u32 {
        self.align(4, 4 * (targets.len() + 1));
        self.reserve(4 * (targets.len() + 1));
        // Last element first. A uoffset counts forward from itself to its
        // target, which sits at a smaller revpos.
        for &target in targets.iter().rev() {
            let at = self.revpos() + 4;
            self.put(&(at - target).to_le_bytes());
        }
        self.put(&u32::try_from(targets.len()).expect("under 4 GiB").to_le_bytes())
    }

    /// Puts `table`, whose first four bytes are its soffset to
    /// `vtable` (revpos; `None`: `entries` are written right after it, at
    /// lower addresses) and whose uoffset `slots` point at their targets;
    /// returns the table's and the vtable's revpos.
    fn put_table(
        &mut self,
        table: &mut [u8],
        slots: &[(usize, u32)],
        vtable: Option<u32>,
        entries: &[u16],
    ) -> (u32, u32) {
        let at = self.revpos() + table.len() as u32;
        for &(slot, target) in slots {
            // The field sits at revpos `at - slot`.
            let uoffset = at - slot as u32 - target;
            table[slot..slot + 4].copy_from_slice(&uoffset.to_le_bytes());
        }
        // Every table is 2-aligned, so a vtable right after needs no padding.
        let vtable = vtable.unwrap_or(at + 2 * entries.len() as u32);
        // vtable address = table address - soffset, and address = len - revpos.
        let soffset = i32::try_from(i64::from(vtable) - i64::from(at)).expect("under 2 GiB");
        table[..4].copy_from_slice(&soffset.to_le_bytes());
        self.put(table);
        if vtable > at {
            for e in entries.iter().rev() {
                self.put(&e.to_le_bytes());
            }
        }
        (at, vtable)
    }

    fn push_headers(&mut self, headers: &[HeaderRef<'_>]) -> u32 {
        let mut tables = Vec::with_capacity(headers.len());
        for (key, value) in headers {
            let value = self.push_bytes(value, false);
            let key = self.push_bytes(key.as_bytes(), true);
            self.align(4, HEADER_TABLE_BYTES);
            let known = (self.header_vtable != 0).then_some(self.header_vtable);
            let (table, vtable) = self.put_table(
                &mut [0u8; HEADER_TABLE_BYTES],
                &[(4, key), (8, value)],
                known,
                &HEADER_VTABLE,
            );
            self.header_vtable = vtable;
            tables.push(table);
        }
        self.push_offsets(&tables)
    }

    /// Adds a record (null key or value: `None`).
    pub(crate) fn push(
        &mut self,
        offset_delta: u32,
        timestamp_delta: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[HeaderRef<'_>],
    ) {
        let shape = Shape { value: value.is_some(), key: key.is_some(), headers: !headers.is_empty() };
        let headers = shape.headers.then(|| self.push_headers(headers));
        let key = key.map(|k| self.push_bytes(k, false));
        let value = value.map(|v| self.push_bytes(v, false));
        let (ts_at, size) = shape.layout();
        self.align(MIN_ALIGN, size);
        let mut table = [0u8; 32];
        table[4..8].copy_from_slice(&offset_delta.to_le_bytes());
        table[ts_at..ts_at + 8].copy_from_slice(&timestamp_delta.to_le_bytes());
        // Slots after offset_delta, in the order value, key, headers.
        let mut slots = [(0usize, 0u32); 3];
        let mut entries = [0u16; 3];
        let mut n = 0;
        for (i, target) in [value, key, headers].into_iter().enumerate() {
            if let Some(target) = target {
                slots[n] = (8 + 4 * n, target);
                entries[i] = (8 + 4 * n) as u16;
                n += 1;
            }
        }
        let [value_at, key_at, headers_at] = entries;
        let entries =
            [RECORD_VTABLE_BYTES as u16, size as u16, 4, ts_at as u16, key_at, value_at, headers_at];
        let known = match self.vtables[shape.index()] {
            0 => None,
            v => Some(v),
        };
        let (record, vtable) = self.put_table(&mut table[..size], &slots[..n], known, &entries);
        self.vtables[shape.index()] = vtable;
        self.records.push(record);
    }

    /// Writes the records vector, the `RecordSet` table and the root offset,
    /// then `prefix` in front of it all (the batch header); returns the
    /// bytes. `prefix` is given the finished record set to fill itself in.
    pub(crate) fn finish(mut self, prefix: impl FnOnce(&[u8]) -> [u8; BATCH_HEADER_BYTES]) -> Written {
        let records = std::mem::take(&mut self.records);
        let vector = self.push_offsets(&records);
        self.align(4, SET_TABLE_BYTES);
        let (set, _) = self.put_table(&mut [0u8; SET_TABLE_BYTES], &[(4, vector)], None, &SET_VTABLE);
        self.align(MIN_ALIGN, 4);
        let root = self.revpos() + 4;
        self.put(&(root - set).to_le_bytes());
        let header = prefix(self.written());
        self.put(&header);
        Written { buf: self.buf, head: self.head }
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::{self, BatchBuilder, RecordView};
    use crate::wire;
    use flatbuffers::FlatBufferBuilder;
    use proptest::prelude::*;

    /// key, value (None: null), headers, timestamp delta from the first.
    type Rec = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>, i64);

    fn rec() -> impl Strategy<Value = Rec> {
        (
            prop::option::of(prop::collection::vec(any::<u8>(), 0..12)),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
            prop::collection::vec(("[a-z]{0,7}", prop::collection::vec(any::<u8>(), 0..9)), 0..3),
            prop_oneof![Just(0i64), 0i64..10_000, Just(-5)],
        )
    }

    fn headers(r: &Rec) -> Vec<(&str, &[u8])> {
        r.2.iter().map(|(k, v)| (k.as_str(), &v[..])).collect()
    }

    /// The record set as `FlatBufferBuilder` writes it: the encoder this
    /// writer replaced, kept as the reference.
    fn reference_record_set(recs: &[Rec]) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::new();
        let mut tables = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            let key = r.0.as_ref().map(|k| fbb.create_vector(k));
            let value = r.1.as_ref().map(|v| fbb.create_vector(v));
            let hs = (!r.2.is_empty()).then(|| {
                let hs: Vec<_> =
                    r.2.iter()
                        .map(|(k, v)| {
                            let (key, value) = (fbb.create_string(k), fbb.create_vector(v));
                            wire::RecordHeader::create(
                                &mut fbb,
                                &wire::RecordHeaderArgs { key: Some(key), value: Some(value) },
                            )
                        })
                        .collect();
                fbb.create_vector(&hs)
            });
            let args =
                wire::RecordArgs { offset_delta: i as u32, timestamp_delta: r.3, key, value, headers: hs };
            tables.push(wire::Record::create(&mut fbb, &args));
        }
        let records = fbb.create_vector(&tables);
        let set = wire::RecordSet::create(&mut fbb, &wire::RecordSetArgs { records: Some(records) });
        fbb.finish_minimal(set);
        fbb.finished_data().to_vec()
    }

    /// offset delta, timestamp delta, key, value, headers.
    type Decoded = (u32, i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

    /// What a reader sees in a record set: every field of every record.
    fn decode(set: &[u8]) -> Vec<Decoded> {
        let set = flatbuffers::root::<wire::RecordSet>(set).expect("a valid record set");
        set.records()
            .expect("records present")
            .iter()
            .map(|r| {
                let hs = r
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| {
                                (h.key().expect("key").to_owned(), h.value().expect("value").bytes().to_vec())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    r.offset_delta(),
                    r.timestamp_delta(),
                    r.key().map(|k| k.bytes().to_vec()),
                    r.value().map(|v| v.bytes().to_vec()),
                    hs,
                )
            })
            .collect()
    }

    proptest! {
        /// Whatever mix of null keys and values, headers and timestamps, and
        /// from however small a starting buffer: the record set verifies and
        /// reads back field for field as the generic builder's does, and the
        /// whole batch passes the broker's full check.
        #[test]
        fn reads_back_as_the_builders_record_set(recs in prop::collection::vec(rec(), 1..40), capacity in 0usize..512) {
            let first_ts = 1_700_000_000_000i64;
            let mut b = BatchBuilder::with_capacity(capacity);
            for r in &recs {
                b.push_record(r.0.as_deref(), r.1.as_deref(), &headers(r), first_ts + r.3);
            }
            let estimate = b.estimated_bytes();
            let batch = b.finish();
            prop_assert!(batch.len() <= estimate, "estimate {} under {}", estimate, batch.len());
            // The first record sets first_timestamp, so deltas are relative to it.
            let expected: Vec<Rec> = recs.iter().map(|r| (r.0.clone(), r.1.clone(), r.2.clone(), r.3 - recs[0].3)).collect();
            let ours = &batch[batch::BATCH_HEADER_BYTES..];
            prop_assert_eq!(ours.len() % 8, 0);
            prop_assert_eq!(decode(ours), decode(&reference_record_set(&expected)));
            let header = batch::validate_with_records(&batch, 1 << 20).expect("valid batch");
            prop_assert_eq!(header.record_count as usize, recs.len());
            let views: Vec<RecordView<'_>> = batch::records(&batch).expect("records");
            for (i, (v, r)) in views.iter().zip(&recs).enumerate() {
                prop_assert_eq!(v.offset, i as u64);
                prop_assert_eq!(v.timestamp_ms, first_ts + r.3);
                prop_assert_eq!(v.tombstone, r.1.is_none());
            }
        }
    }

    #[test]
    fn records_of_one_shape_share_one_vtable() {
        let mut b = BatchBuilder::with_capacity(0);
        for i in 0..100u8 {
            b.push(None, &[i; 100], &[], 1_000);
        }
        let batch = b.finish();
        // Per record: a 24-byte table, a 104-byte value vector, a 4-byte
        // slot in the records vector; once: vtables, set table, root.
        let per_record = 24 + 104 + 4;
        let overhead = batch.len() - batch::BATCH_HEADER_BYTES - 100 * per_record;
        assert!(overhead <= 48, "{overhead} bytes beyond the records");
        assert!(batch::validate_with_records(&batch, 1 << 20).is_ok());
    }
}
