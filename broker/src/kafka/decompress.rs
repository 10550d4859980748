//! Bounded decompression of Kafka produce batches.
//!
//! The `kafka-protocol` crate's own decompressors inflate whatever they are
//! given into an unbounded buffer, and its snappy path allocates the length
//! a block *claims* before checking it: a few KB of hostile input could make
//! gigabytes. These do the same decoding (gzip, xerial-framed or raw snappy,
//! lz4 frames, zstd) but stop with an error as soon as the output would pass
//! `limit` bytes, and check a snappy block's claimed length against the
//! budget before allocating it.
//!
//! Invariant: memory taken for one batch's records is at most `limit`
//! plus one read chunk, whatever the input.

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes};
use kafka_protocol::records::Compression;
use std::io::Read;

/// Why a batch was refused (the caller maps it to MESSAGE_TOO_LARGE).
#[derive(Debug, thiserror::Error)]
#[error("a {codec} batch decompresses to more than {limit} bytes")]
pub struct TooLarge {
    pub codec: &'static str,
    pub limit: usize,
}

const SNAPPY_XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const SNAPPY_XERIAL_HEADER_BYTES: usize = 16;

/// Decompresses one batch's records, refusing more than `limit` bytes of output.
pub fn decompress(input: &mut Bytes, compression: Compression, limit: usize) -> Result<Bytes> {
    let data = input.copy_to_bytes(input.remaining());
    match compression {
        Compression::None => Ok(data),
        Compression::Gzip => read_bounded(flate2::read::GzDecoder::new(data.reader()), "gzip", limit),
        Compression::Lz4 => {
            let decoder = lz4::Decoder::new(data.reader()).context("lz4 frame header")?;
            read_bounded(decoder, "lz4", limit)
        }
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(data.reader()).context("zstd frame")?;
            read_bounded(decoder, "zstd", limit)
        }
        Compression::Snappy => snappy(&data, limit),
    }
}

/// Reads `r` to its end, failing once more than `limit` bytes came out.
fn read_bounded(r: impl Read, codec: &'static str, limit: usize) -> Result<Bytes> {
    let mut out = Vec::new();
    let read = r
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .with_context(|| format!("{codec} stream is not valid"))?;
    if read > limit {
        bail!(TooLarge { codec, limit });
    }
    Ok(out.into())
}

/// Kafka's snappy: the xerial framing (a 16-byte header, then blocks of a
/// big-endian u32 length and a raw snappy block), or one raw block.
fn snappy(data: &[u8], limit: usize) -> Result<Bytes> {
    let mut out = Vec::new();
    if data.len() < SNAPPY_XERIAL_HEADER_BYTES || !data.starts_with(SNAPPY_XERIAL_MAGIC) {
        snappy_block(data, &mut out, limit)?;
        return Ok(out.into());
    }
    let mut rest = &data[SNAPPY_XERIAL_HEADER_BYTES..];
    while !rest.is_empty() {
        if rest.len() < 4 {
            bail!("snappy: a truncated block length");
        }
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        rest = &rest[4..];
        if len > rest.len() {
            bail!("snappy: a block of {len} bytes with {} left", rest.len());
        }
        snappy_block(&rest[..len], &mut out, limit)?;
        rest = &rest[len..];
    }
    Ok(out.into())
}

fn snappy_block(block: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<()> {
    let len = snap::raw::decompress_len(block).context("snappy block header")?;
    if out.len().saturating_add(len) > limit {
        bail!(TooLarge { codec: "snappy", limit });
    }
    let start = out.len();
    out.resize(start + len, 0);
    let n = snap::raw::Decoder::new().decompress(block, &mut out[start..]).context("snappy block")?;
    out.truncate(start + n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap().into()
    }

    #[test]
    fn every_codec_round_trips_within_the_limit_and_stops_past_it() {
        let data = vec![7u8; 1 << 20];
        let zstd_bytes: Bytes = zstd::encode_all(&data[..], 3).unwrap().into();
        let mut lz4_bytes = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        lz4_bytes.write_all(&data).unwrap();
        let lz4_bytes: Bytes = lz4_bytes.finish().0.into();
        let raw_snappy: Bytes = snap::raw::Encoder::new().compress_vec(&data).unwrap().into();
        let mut xerial = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        for chunk in data.chunks(32 << 10) {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            xerial.extend_from_slice(&(block.len() as u32).to_be_bytes());
            xerial.extend_from_slice(&block);
        }
        let cases = [
            (Compression::Gzip, gzip(&data)),
            (Compression::Zstd, zstd_bytes),
            (Compression::Lz4, lz4_bytes),
            (Compression::Snappy, raw_snappy),
            (Compression::Snappy, Bytes::from(xerial)),
        ];
        for (codec, compressed) in cases {
            let out = decompress(&mut compressed.clone(), codec, 1 << 20).unwrap();
            assert!(out[..] == data[..], "{codec:?} round trip");
            let err = decompress(&mut compressed.clone(), codec, (1 << 20) - 1).unwrap_err();
            assert!(err.downcast_ref::<TooLarge>().is_some(), "{codec:?}: {err}");
        }
    }

    #[test]
    fn a_snappy_block_claiming_gigabytes_is_refused_before_allocating() {
        // A raw snappy block whose varint header claims ~4 GiB.
        let mut claim = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
        claim.extend_from_slice(&[0; 16]);
        let err = decompress(&mut Bytes::from(claim), Compression::Snappy, 1 << 20).unwrap_err();
        assert!(err.downcast_ref::<TooLarge>().is_some(), "{err}");
        // Junk and truncations are errors, not panics.
        let xerial_cut = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00";
        for junk in [&b""[..], &xerial_cut[..], b"\x1f\x8b\x08junk"] {
            for codec in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
                match decompress(&mut Bytes::copy_from_slice(junk), codec, 100) {
                    Err(_) => {}
                    // An empty lz4 stream is an empty output; the record
                    // decoder then finds its records missing.
                    Ok(out) => assert!(junk.is_empty() && out.is_empty(), "{codec:?} {junk:?}"),
                }
            }
        }
    }
}
