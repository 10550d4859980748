//! The frame codec: `u32` little-endian length, a verified flatbuffer
//! envelope, then `payload_bytes` raw bytes (record batches).
//!
//! ```text
//!   [u32 LE header_len][header_len bytes: RequestFrame|ResponseFrame][payload_bytes raw]
//! ```
//!
//! Nothing here trusts its input: lengths are checked against [`FrameLimits`]
//! before anything is allocated, and every flatbuffer goes through the
//! verifier before a field is read.

use crate::wire;
use flatbuffers::{FlatBufferBuilder, InvalidFlatbuffer, VerifierOptions, WIPOffset};

/// Size of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Default upper bound of one envelope flatbuffer.
pub const HEADER_BYTES_MAX_DEFAULT: u32 = 4 << 20;
/// Default upper bound of the raw payload of one request.
pub const PAYLOAD_BYTES_MAX_DEFAULT: u32 = 64 << 20;
/// Smallest envelope the verifier can accept (root offset + vtable).
pub const HEADER_BYTES_MIN: u32 = 8;

/// Size bounds a peer's frames must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    pub header_bytes_max: u32,
    pub payload_bytes_max: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            header_bytes_max: HEADER_BYTES_MAX_DEFAULT,
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
        }
    }
}

/// Why a frame was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame header of {len} bytes is outside [{min}, {max}]")]
    HeaderSize { len: u32, min: u32, max: u32 },
    #[error("frame payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge { len: u32, max: u32 },
    #[error("frame failed flatbuffers verification: {0}")]
    Invalid(#[from] InvalidFlatbuffer),
    #[error("frame has api key {key:?} but a body of another type or none")]
    BodyMismatch { key: wire::ApiKey },
}

impl FrameLimits {
    /// Checks a length prefix before any allocation.
    pub fn check_header_len(&self, len: u32) -> Result<(), FrameError> {
        if !(HEADER_BYTES_MIN..=self.header_bytes_max).contains(&len) {
            return Err(FrameError::HeaderSize { len, min: HEADER_BYTES_MIN, max: self.header_bytes_max });
        }
        Ok(())
    }

    pub fn check_payload_len(&self, len: u32) -> Result<(), FrameError> {
        if len > self.payload_bytes_max {
            return Err(FrameError::PayloadTooLarge { len, max: self.payload_bytes_max });
        }
        Ok(())
    }

    /// The verifier options frames are checked with (public for the fuzz
    /// targets, which verify request bodies alone with them).
    #[doc(hidden)]
    #[must_use]
    pub fn verifier_options(&self) -> VerifierOptions {
        VerifierOptions {
            max_depth: 16,
            max_tables: 1 << 20,
            max_apparent_size: self.header_bytes_max as usize * 2,
            ignore_missing_null_terminator: false,
        }
    }

    /// Verifies and returns a request envelope. Checks that the body matches
    /// the api key.
    pub fn verify_request<'a>(&self, buf: &'a [u8]) -> Result<wire::RequestFrame<'a>, FrameError> {
        let frame = flatbuffers::root_with_opts::<wire::RequestFrame>(&self.verifier_options(), buf)?;
        let key = frame.api_key();
        let matches = match key {
            wire::ApiKey::ApiVersions => frame.body_as_api_versions_request().is_some(),
            wire::ApiKey::Metadata => frame.body_as_metadata_request().is_some(),
            wire::ApiKey::CreateTopics => frame.body_as_create_topics_request().is_some(),
            wire::ApiKey::DeleteTopics => frame.body_as_delete_topics_request().is_some(),
            wire::ApiKey::Produce => frame.body_as_produce_request().is_some(),
            wire::ApiKey::Fetch => frame.body_as_fetch_request().is_some(),
            wire::ApiKey::ListOffsets => frame.body_as_list_offsets_request().is_some(),
            // Unknown keys are answered with UnsupportedApi by the broker.
            _ => true,
        };
        if !matches {
            return Err(FrameError::BodyMismatch { key });
        }
        Ok(frame)
    }

    /// Verifies and returns a response envelope.
    pub fn verify_response<'a>(&self, buf: &'a [u8]) -> Result<wire::ResponseFrame<'a>, FrameError> {
        Ok(flatbuffers::root_with_opts::<wire::ResponseFrame>(&self.verifier_options(), buf)?)
    }
}

/// Reads a length prefix.
#[must_use]
pub fn decode_prefix(prefix: [u8; LENGTH_PREFIX_BYTES]) -> u32 {
    u32::from_le_bytes(prefix)
}

/// Finishes `fbb` with `root` and appends `[len][flatbuffer]` to `out`.
/// The caller appends the payload (if any) after it.
pub fn finish_into<T>(fbb: &mut FlatBufferBuilder<'_>, root: WIPOffset<T>, out: &mut Vec<u8>) {
    fbb.finish_minimal(root);
    let data = fbb.finished_data();
    out.reserve(LENGTH_PREFIX_BYTES + data.len());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
}

/// Builds a whole-request error response (no body) for `correlation_id`.
pub fn error_response(
    correlation_id: u32,
    api_key: wire::ApiKey,
    error: wire::ErrorCode,
    message: &str,
    out: &mut Vec<u8>,
) {
    let mut fbb = FlatBufferBuilder::with_capacity(128 + message.len());
    let msg = fbb.create_string(message);
    let root = wire::ResponseFrame::create(
        &mut fbb,
        &wire::ResponseFrameArgs {
            correlation_id,
            api_key,
            error,
            error_message: Some(msg),
            payload_bytes: 0,
            body_type: wire::ResponseBody::NONE,
            body: None,
        },
    );
    finish_into(&mut fbb, root, out);
}

/// Wraps a request body into a frame envelope and returns `[len][envelope]`.
pub fn request_envelope(
    mut fbb: FlatBufferBuilder<'_>,
    corr: u32,
    client_id: &str,
    api_key: wire::ApiKey,
    body_type: wire::RequestBody,
    body: WIPOffset<flatbuffers::UnionWIPOffset>,
    payload_bytes: u32,
) -> Vec<u8> {
    let client_id = fbb.create_string(client_id);
    let root = wire::RequestFrame::create(
        &mut fbb,
        &wire::RequestFrameArgs {
            correlation_id: corr,
            api_key,
            api_version: 0,
            client_id: Some(client_id),
            payload_bytes,
            body_type,
            body: Some(body),
        },
    );
    let mut out = Vec::new();
    finish_into(&mut fbb, root, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(corr: u32) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::new();
        let body = wire::MetadataRequest::create(&mut fbb, &wire::MetadataRequestArgs { topics: None });
        let root = wire::RequestFrame::create(
            &mut fbb,
            &wire::RequestFrameArgs {
                correlation_id: corr,
                api_key: wire::ApiKey::Metadata,
                api_version: 0,
                client_id: None,
                payload_bytes: 0,
                body_type: wire::RequestBody::MetadataRequest,
                body: Some(body.as_union_value()),
            },
        );
        let mut out = Vec::new();
        finish_into(&mut fbb, root, &mut out);
        out
    }

    #[test]
    fn round_trip_and_limits() {
        let limits = FrameLimits::default();
        let out = request(9);
        let len = decode_prefix(out[..4].try_into().expect("prefix"));
        assert_eq!(len as usize, out.len() - 4);
        limits.check_header_len(len).expect("within limits");
        let frame = limits.verify_request(&out[4..]).expect("verifies");
        assert_eq!(frame.correlation_id(), 9);
        assert!(limits.check_header_len(u32::MAX).is_err());
        assert!(limits.check_header_len(0).is_err());
        assert!(limits.check_payload_len(PAYLOAD_BYTES_MAX_DEFAULT + 1).is_err());
    }

    #[test]
    fn junk_never_panics() {
        let limits = FrameLimits::default();
        let good = request(1);
        let mut seed: u64 = 0x1234_5678;
        for i in 0..5000 {
            let mut buf = good[4..].to_vec();
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let at = (seed >> 33) as usize % buf.len();
            buf[at] = (seed >> 17) as u8;
            buf.truncate(buf.len() - (i % 3));
            let _ = limits.verify_request(&buf);
        }
    }

    #[test]
    fn error_response_verifies() {
        let mut out = Vec::new();
        error_response(5, wire::ApiKey::Produce, wire::ErrorCode::RequestTooLarge, "too big", &mut out);
        let f = FrameLimits::default().verify_response(&out[4..]).expect("verifies");
        assert_eq!(f.error(), wire::ErrorCode::RequestTooLarge);
        assert_eq!(f.error_message(), Some("too big"));
    }
}
