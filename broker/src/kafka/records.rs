//! Kafka record batches (v2, big-endian, optionally compressed) to and from
//! Shardlog batches (`shardlog_schema::batch`), through `kafka-protocol`'s
//! record codec.
//!
//! **Invariant (lossless)**: every field a Kafka v2 batch carries survives
//! the round trip Kafka → Shardlog → Kafka: offsets (deltas), create or
//! log-append timestamps, keys and values (null values stay tombstones),
//! headers, producer id, epoch and base sequence, the transactional bit.
//! Two things are not kept: a client's compression (batches are stored
//! uncompressed; fetches answer uncompressed) and the difference between a
//! null and an empty header value (both come back empty).

use bytes::{Buf, Bytes};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use shardlog_schema::batch::{self, BatchBuilder, BatchIter};

/// Why a Kafka client's records cannot be taken (answered `CORRUPT_MESSAGE`).
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    #[error("cannot decode the Kafka record batch: {0}")]
    Decode(String),
    #[error("a Kafka record batch without records")]
    Empty,
    #[error("header key is not UTF-8")]
    HeaderKey,
    #[error("control batches (transaction markers) are not supported")]
    Control,
    #[error(transparent)]
    TooLarge(#[from] super::decompress::TooLarge),
    /// Record timestamps further apart than an `i64` holds: neither our
    /// batch (a delta from the first) nor Kafka's (a delta from the
    /// smallest, on fetch) can carry them.
    #[error("record timestamps {min} and {max} are too far apart")]
    TimestampSpan { min: i64, max: i64 },
}

impl TranslateError {
    /// The client-visible code: MESSAGE_TOO_LARGE for an oversized batch,
    /// CORRUPT_MESSAGE otherwise.
    #[must_use]
    pub fn error_code(&self) -> shardlog_schema::ErrorCode {
        match self {
            TranslateError::TooLarge(_) => shardlog_schema::ErrorCode::MessageTooLarge,
            _ => shardlog_schema::ErrorCode::CorruptMessage,
        }
    }
}

/// What [`TranslateError::Decode`] says when the Kafka decoder panicked
/// (caught: it is foreign code fed with network input).
pub const DECODER_PANICKED: &str = "the decoder panicked";

/// Translates the record batches of one partition of a Kafka produce into
/// Shardlog batches (one per Kafka batch), appended to `out`. The Kafka
/// decoder checks each batch's CRC; `decompress` inflates compressed ones,
/// refusing any whose records pass `decompressed_max` bytes.
pub fn kafka_to_native(
    records: Bytes,
    out: &mut Vec<u8>,
    decompressed_max: usize,
) -> Result<usize, TranslateError> {
    let mut buf = records;
    let inflate = |b: &mut Bytes, c| super::decompress::decompress(b, c, decompressed_max);
    // The decoder is foreign code fed with network input: a panic in it
    // must not take the shard down.
    let sets = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sets = Vec::new();
        while buf.has_remaining() {
            sets.push(RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(inflate))?);
        }
        anyhow::Ok(sets)
    }))
    .map_err(|_| TranslateError::Decode(DECODER_PANICKED.into()))?
    .map_err(|e| match e.chain().find_map(|c| c.downcast_ref::<super::decompress::TooLarge>()) {
        Some(t) => TranslateError::TooLarge(super::decompress::TooLarge { codec: t.codec, limit: t.limit }),
        None => TranslateError::Decode(format!("{e:#}")),
    })?;
    let mut count = 0;
    for set in sets {
        let Some(first) = set.records.first() else {
            return Err(TranslateError::Empty);
        };
        if first.control {
            return Err(TranslateError::Control);
        }
        let bytes: usize = set.records.iter().map(|r| r.value.as_ref().map_or(0, Bytes::len) + 32).sum();
        let mut builder = BatchBuilder::with_capacity(bytes + 64);
        builder.set_producer(first.producer_id, first.producer_epoch, first.sequence);
        let mut attributes = 0;
        if first.timestamp_type == TimestampType::LogAppend {
            attributes |= batch::ATTR_TIMESTAMP_LOG_APPEND;
        }
        if first.transactional {
            attributes |= batch::ATTR_TRANSACTIONAL;
        }
        builder.set_attributes(attributes);
        let mut headers: Vec<(&str, &[u8])> = Vec::new();
        let min = set.records.iter().map(|r| r.timestamp).min().unwrap_or_default();
        let max = set.records.iter().map(|r| r.timestamp).max().unwrap_or_default();
        if max.checked_sub(min).is_none() {
            return Err(TranslateError::TimestampSpan { min, max });
        }
        for r in &set.records {
            headers.clear();
            for (k, v) in &r.headers {
                headers.push((k.as_str(), v.as_deref().unwrap_or(&[])));
            }
            builder.push_record(r.key.as_deref(), r.value.as_deref(), &headers, r.timestamp);
            count += 1;
        }
        builder.finish_into(out);
    }
    Ok(count)
}

/// Translates stored Shardlog batches (a fetch's bytes, whole batches) into
/// Kafka v2 batches, one per stored batch, appended to `out`. Stops at the
/// first batch it cannot decode (returning what it translated so far is
/// what a consumer can use; the error is logged by the caller).
pub fn native_to_kafka(
    stored: &[u8],
    batch_bytes_max: usize,
    out: &mut bytes::BytesMut,
) -> Result<(), String> {
    let mut records = Vec::new();
    for b in BatchIter::new(stored, batch_bytes_max) {
        let (header, b) = b.map_err(|e| e.to_string())?;
        records.clear();
        let views = batch::records(b).map_err(|e| e.to_string())?;
        let timestamp_type = if header.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND != 0 {
            TimestampType::LogAppend
        } else {
            TimestampType::Creation
        };
        for (i, v) in views.into_iter().enumerate() {
            let mut r = Record {
                transactional: header.attributes & batch::ATTR_TRANSACTIONAL != 0,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: header.leader_epoch,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                timestamp_type,
                offset: v.offset as i64,
                // The encoder splits batches where offset - sequence changes:
                // consecutive sequences keep one batch with its base sequence.
                sequence: header.base_sequence.wrapping_add(i as i32),
                timestamp: if timestamp_type == TimestampType::LogAppend {
                    header.max_timestamp
                } else {
                    v.timestamp_ms
                },
                key: v.key.map(Bytes::copy_from_slice),
                value: (!v.tombstone).then(|| Bytes::copy_from_slice(v.value)),
                headers: Default::default(),
            };
            for (k, hv) in v.headers {
                r.headers.insert(StrBytes::from_string(k.to_string()), Some(Bytes::copy_from_slice(hv)));
            }
            records.push(r);
        }
        if records.is_empty() {
            continue; // emptied by compaction
        }
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(out, &records, &options).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn kafka_batch(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, records, &RecordEncodeOptions { version: 2, compression })
            .expect("encode");
        buf.freeze()
    }

    fn record(i: i64, producer: (i64, i16, i32)) -> Record {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(StrBytes::from_static_str("h"), Some(Bytes::from(format!("v{i}"))));
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: producer.0,
            producer_epoch: producer.1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // Consecutive (from -1 without a producer id), as clients send them.
            sequence: producer.2.wrapping_add(i as i32),
            timestamp: 1_700_000_000_000 + i,
            key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
            value: (i != 3).then(|| Bytes::from(format!("value {i}"))),
            headers,
        }
    }

    /// Kafka → Shardlog (stamped at a base offset) → Kafka keeps every field.
    #[test]
    fn a_batch_survives_the_round_trip_with_every_codec() {
        for compression in
            [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd]
        {
            for producer in [(-1, -1, -1), (4242, 3, 17)] {
                let sent: Vec<Record> = (0..5).map(|i| record(i, producer)).collect();
                let mut native = Vec::new();
                assert_eq!(
                    kafka_to_native(kafka_batch(&sent, compression), &mut native, 1 << 20)
                        .expect("translate"),
                    5
                );
                batch::validate_with_records(&native, 1 << 20).expect("a valid Shardlog batch");
                batch::stamp(&mut native, 100, 7);
                let mut back = BytesMut::new();
                native_to_kafka(&native, 1 << 20, &mut back).expect("back");
                let got = RecordBatchDecoder::decode_all(&mut back.freeze()).expect("decode");
                assert_eq!(got.len(), 1, "one Kafka batch per stored batch");
                let got = &got[0].records;
                assert_eq!(got.len(), 5);
                for (s, g) in sent.iter().zip(got) {
                    assert_eq!(g.offset, s.offset + 100);
                    assert_eq!(
                        (g.key.clone(), g.value.clone(), g.timestamp),
                        (s.key.clone(), s.value.clone(), s.timestamp)
                    );
                    assert_eq!(g.headers, s.headers);
                    assert_eq!(
                        (g.producer_id, g.producer_epoch, g.sequence),
                        (s.producer_id, s.producer_epoch, s.sequence)
                    );
                    assert_eq!(g.partition_leader_epoch, 7);
                }
            }
        }
    }

    fn zigzag(v: i64, out: &mut Vec<u8>) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    /// A Kafka v2 batch, by hand (the encoder refuses such timestamps):
    /// first timestamp 0, one one-byte record per timestamp delta.
    fn batch_with_timestamp_deltas(deltas: &[i64]) -> Bytes {
        let mut records = Vec::new();
        for (i, &delta) in deltas.iter().enumerate() {
            let mut body = vec![0u8]; // attributes
            zigzag(delta, &mut body);
            zigzag(i as i64, &mut body); // offset delta
            zigzag(-1, &mut body); // null key
            zigzag(1, &mut body);
            body.push(b'v');
            zigzag(0, &mut body); // no headers
            zigzag(body.len() as i64, &mut records);
            records.extend_from_slice(&body);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes()); // base offset
        b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes()); // leader epoch
        b.push(2); // magic
        b.extend_from_slice(&[0; 4]); // CRC, below
        b.extend_from_slice(&0i16.to_be_bytes()); // attributes
        b.extend_from_slice(&(deltas.len() as i32 - 1).to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes()); // first timestamp
        b.extend_from_slice(&0i64.to_be_bytes()); // max timestamp
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&(deltas.len() as i32).to_be_bytes());
        b.extend_from_slice(&records);
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        Bytes::from(b)
    }

    #[test]
    fn timestamps_whose_span_overflows_are_refused() {
        let mut out = Vec::new();
        assert_eq!(
            kafka_to_native(batch_with_timestamp_deltas(&[0, 5]), &mut out, 1 << 20).expect("valid"),
            2
        );
        let err =
            kafka_to_native(batch_with_timestamp_deltas(&[i64::MIN, i64::MAX]), &mut Vec::new(), 1 << 20)
                .expect_err("a span past i64");
        assert!(matches!(err, TranslateError::TimestampSpan { min: i64::MIN, max: i64::MAX }), "{err}");
        let err =
            kafka_to_native(batch_with_timestamp_deltas(&[0, i64::MIN, i64::MAX]), &mut Vec::new(), 1 << 20)
                .expect_err("each within i64 of the first, not of each other");
        assert!(matches!(err, TranslateError::TimestampSpan { .. }), "{err}");
    }

    #[test]
    fn junk_and_corrupt_batches_are_refused_not_panicked_on() {
        let good = kafka_batch(&[record(0, (-1, -1, -1))], Compression::None);
        let mut flipped = good.to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        for junk in
            [Bytes::from_static(b"\x00\x01\x02"), Bytes::from(flipped), Bytes::from(vec![0xffu8; 200])]
        {
            assert!(kafka_to_native(junk, &mut Vec::new(), 1 << 20).is_err());
        }
    }
}
