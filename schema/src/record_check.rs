//! The broker's fast check of a produced record set: one pass over the
//! `RecordSet` flatbuffer that knows the schema, in front of the generic
//! flatbuffers verifier.
//!
//! At 100 B records the generic verifier was a third of the broker's CPU:
//! it builds an error trace detail for every field it visits, even on
//! success, and passes results of a hundred bytes by value. This check reads
//! the same structure directly and answers only "certainly valid" or "not
//! sure". **Invariant**: it answers "valid" only for a record set that the
//! generic verifier accepts and whose record count and deltas
//! `validate_with_records` accepts. For anything else, including every
//! record with headers and every vtable longer than the schema's, it says
//! "not sure", and the caller runs the generic path, which gives the
//! accepted result or the precise error. The check may be stricter than the
//! verifier, never looser. A proptest mutates valid record sets and holds
//! it to that (`tests` below).
//!
//! What it checks, in the verifier's own terms (`flatbuffers::Verifier`):
//! every scalar, offset and vtable in the buffer and aligned to its size
//! relative to the buffer's start; every soffset to a vtable in the buffer;
//! every vtable of even length and in the buffer; every vector's length
//! prefix aligned and its bytes in the buffer; the number of tables and the
//! "apparent size" (bytes of all ranges checked, a bound against DAGs that
//! point many times at one large vector) under the verifier's defaults.

use crate::batch::BatchHeader;

/// `VerifierOptions::default().max_tables`.
const MAX_TABLES: u64 = 1_000_000;
/// `VerifierOptions::default().max_apparent_size`.
const MAX_APPARENT_SIZE: u64 = 1 << 31;
/// An upper bound of the bytes the verifier counts per record besides its
/// key's and value's bytes: the element's uoffset, the table's soffset, the
/// vtable (at most 14 bytes here), five voffsets, two scalars, two uoffsets
/// and two length prefixes come to 82.
const APPARENT_BYTES_PER_RECORD: u64 = 128;

/// Schema slots (voffset of the vtable entry) of `Record`'s fields.
const SLOT_OFFSET_DELTA: usize = 4;
const SLOT_TIMESTAMP_DELTA: usize = 6;
const SLOT_KEY: usize = 8;
const SLOT_VALUE: usize = 10;
const SLOT_HEADERS: usize = 12;
/// Length of a vtable that has every field of `Record` and no more.
const RECORD_VTABLE_MAX: usize = 14;

/// "Not sure": the caller runs the generic verifier.
pub(crate) struct Unsure;

struct Buf<'a>(&'a [u8]);

impl Buf<'_> {
    /// `size` bytes at `pos`, aligned to `align`, inside the buffer.
    fn at(&self, pos: usize, size: usize, align: usize) -> Result<&[u8], Unsure> {
        if !pos.is_multiple_of(align) {
            return Err(Unsure);
        }
        let end = pos.checked_add(size).ok_or(Unsure)?;
        self.0.get(pos..end).ok_or(Unsure)
    }

    fn u16(&self, pos: usize) -> Result<u16, Unsure> {
        let b = self.at(pos, 2, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, pos: usize) -> Result<u32, Unsure> {
        let b = self.at(pos, 4, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&self, pos: usize) -> Result<i64, Unsure> {
        let b = self.at(pos, 8, 8)?;
        Ok(i64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// The target of the uoffset at `pos`.
    fn follow(&self, pos: usize) -> Result<usize, Unsure> {
        let offset = self.u32(pos)? as usize;
        pos.checked_add(offset).ok_or(Unsure)
    }

    /// The table at `pos`: its vtable's position and length.
    fn table(&self, pos: usize) -> Result<(usize, usize), Unsure> {
        let soffset = i32::from_le_bytes(self.at(pos, 4, 4)?.try_into().expect("4 bytes"));
        // The vtable sits at `pos - soffset`.
        let vtable = if soffset > 0 {
            pos.checked_sub(soffset.unsigned_abs() as usize)
        } else {
            pos.checked_add(soffset.unsigned_abs() as usize)
        }
        .ok_or(Unsure)?;
        let len = self.u16(vtable)? as usize;
        if !len.is_multiple_of(2) || len < 4 {
            return Err(Unsure);
        }
        self.at(vtable, len, 2)?;
        Ok((vtable, len))
    }

    /// The position of the field in `slot` of the table at `table`, or
    /// `None` when absent.
    fn field(
        &self,
        table: usize,
        (vtable, len): (usize, usize),
        slot: usize,
    ) -> Result<Option<usize>, Unsure> {
        if slot >= len {
            return Ok(None);
        }
        match self.u16(vtable + slot)? {
            0 => Ok(None),
            v => Ok(Some(table.checked_add(usize::from(v)).ok_or(Unsure)?)),
        }
    }

    /// The `[ubyte]` at the uoffset field `pos`: its length.
    fn bytes_vector(&self, pos: usize) -> Result<u64, Unsure> {
        let vector = self.follow(pos)?;
        let len = self.u32(vector)? as usize;
        self.at(vector + 4, len, 1)?;
        Ok(len as u64)
    }
}

/// Checks `set` (a batch's record set) against `header`: see the module
/// docs. `Ok` means the generic path would accept it.
pub(crate) fn check(set: &[u8], header: &BatchHeader) -> Result<(), Unsure> {
    let b = Buf(set);
    let root = b.follow(0)?;
    let root_vt = b.table(root)?;
    let vector = match b.field(root, root_vt, 4)? {
        Some(field) => b.follow(field)?,
        None => return Err(Unsure),
    };
    let count = b.u32(vector)? as usize;
    if count as u64 != u64::from(header.record_count) || count as u64 + 1 > MAX_TABLES {
        return Err(Unsure);
    }
    let elements = vector + 4;
    b.at(elements, count.checked_mul(4).ok_or(Unsure)?, 4)?;
    let mut apparent: u64 = 64 + root_vt.1 as u64;
    let mut previous: Option<u32> = None;
    for i in 0..count {
        let element = elements + 4 * i;
        let record = b.follow(element)?;
        let vt = b.table(record)?;
        if vt.1 > RECORD_VTABLE_MAX || b.field(record, vt, SLOT_HEADERS)?.is_some() {
            return Err(Unsure);
        }
        let offset_delta = match b.field(record, vt, SLOT_OFFSET_DELTA)? {
            Some(p) => b.u32(p)?,
            None => 0,
        };
        let timestamp_delta = match b.field(record, vt, SLOT_TIMESTAMP_DELTA)? {
            Some(p) => b.i64(p)?,
            None => 0,
        };
        for slot in [SLOT_KEY, SLOT_VALUE] {
            if let Some(p) = b.field(record, vt, slot)? {
                apparent += b.bytes_vector(p)?;
            }
        }
        apparent += APPARENT_BYTES_PER_RECORD;
        if previous.is_some_and(|p| offset_delta <= p) || offset_delta > header.last_offset_delta {
            return Err(Unsure);
        }
        previous = Some(offset_delta);
        if header.first_timestamp.checked_add(timestamp_delta).is_none() {
            return Err(Unsure);
        }
    }
    if apparent + 4 * count as u64 > MAX_APPARENT_SIZE {
        return Err(Unsure);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{self, BatchBuilder, BatchError, BATCH_HEADER_BYTES};
    use crate::wire;
    use flatbuffers::FlatBufferBuilder;
    use proptest::prelude::*;

    /// The generic path of `validate_with_records` on the record set.
    fn generic(set: &[u8], header: &BatchHeader) -> Result<(), BatchError> {
        batch::check_record_set_generic(set, header)
    }

    /// A record's key and value (`None`: null).
    type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

    fn batch_of(values: &[KeyValue], headers: bool) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(0);
        for (i, (k, v)) in values.iter().enumerate() {
            let hs: &[(&str, &[u8])] = if headers && i % 2 == 0 { &[("h", b"x")] } else { &[] };
            b.push_record(k.as_deref(), v.as_deref(), hs, 1_700_000_000_000 + i as i64);
        }
        b.finish()
    }

    fn values() -> impl Strategy<Value = Vec<KeyValue>> {
        prop::collection::vec(
            (
                prop::option::of(prop::collection::vec(any::<u8>(), 0..10)),
                prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
            ),
            1..12,
        )
    }

    #[test]
    fn takes_the_fast_path_for_what_producers_send() {
        let batch = batch_of(&[(None, Some(vec![1; 100])), (Some(vec![2; 8]), Some(vec![3; 100]))], false);
        let header = BatchHeader::parse(&batch).expect("header");
        assert!(check(&batch[BATCH_HEADER_BYTES..], &header).is_ok());
        // The generic builder's encoding (defaults left out, vtables shared
        // by search) is taken too: other clients and the Kafka gateway.
        let mut fbb = FlatBufferBuilder::new();
        let recs: Vec<_> = (0..3u32)
            .map(|i| {
                let value = fbb.create_vector(&[i as u8; 10]);
                let args = wire::RecordArgs {
                    offset_delta: i,
                    timestamp_delta: 0,
                    value: Some(value),
                    ..Default::default()
                };
                wire::Record::create(&mut fbb, &args)
            })
            .collect();
        let records = fbb.create_vector(&recs);
        let root = wire::RecordSet::create(&mut fbb, &wire::RecordSetArgs { records: Some(records) });
        fbb.finish_minimal(root);
        let header = BatchHeader { record_count: 3, last_offset_delta: 2, ..header };
        assert!(check(fbb.finished_data(), &header).is_ok());
        assert!(generic(fbb.finished_data(), &header).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// The invariant: whatever a valid batch's record set is mutated
        /// into (bytes flipped, set, cut short or extended; header counts
        /// changed), the fast check accepts only what the generic path
        /// accepts. Unmutated, it accepts every headerless batch.
        #[test]
        fn never_accepts_what_the_verifier_refuses(
            values in values(),
            headers in any::<bool>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..6),
            cut in prop::option::of(any::<prop::sample::Index>()),
            count_delta in prop_oneof![Just(0i64), -2i64..3],
        ) {
            let batch = batch_of(&values, headers);
            let header = BatchHeader::parse(&batch).expect("header");
            let mut set = batch[BATCH_HEADER_BYTES..].to_vec();
            if edits.is_empty() && cut.is_none() && count_delta == 0 && !headers {
                prop_assert!(check(&set, &header).is_ok(), "an unmutated headerless batch takes the fast path");
            }
            for (at, byte, how) in &edits {
                let i = at.index(set.len());
                match how {
                    0 => set[i] ^= 1 << (byte % 8),
                    1 => set[i] = *byte,
                    2 => set[i] = set[i].wrapping_add(4),
                    _ => set.push(*byte),
                }
            }
            if let Some(at) = cut {
                set.truncate(at.index(set.len() + 1));
            }
            let count = (i64::from(header.record_count) + count_delta).max(1) as u32;
            let header = BatchHeader { record_count: count, last_offset_delta: count - 1, ..header };
            if check(&set, &header).is_ok() {
                prop_assert!(generic(&set, &header).is_ok(), "fast check accepted what the verifier refuses");
            }
        }
    }
}
