//! Batches checked once on their way into a log.
//!
//! A produced byte is CRC'd exactly once: the partition checks a produce
//! request's batches fully ([`CheckedBatches::produced`]: header, length,
//! CRC, record set) and hands the proof to [`super::Log::append_checked`],
//! which takes the headers it needs from it instead of checking again. The
//! only constructors run a check, so a `CheckedBatches` always describes
//! whole, valid batches that cover its bytes exactly.

use shardlog_schema::batch::{self, BatchError, BatchHeader};

/// Whole batches and their headers, as a check found them.
#[derive(Debug)]
pub struct CheckedBatches<'a> {
    bytes: &'a [u8],
    headers: Vec<BatchHeader>,
}

/// Why a check refused: the batch at byte `at` failed with `error`.
#[derive(Debug, PartialEq, Eq)]
pub struct CheckError {
    pub at: usize,
    pub error: BatchError,
}

impl From<CheckError> for super::LogError {
    fn from(e: CheckError) -> Self {
        super::LogError::InvalidBatch(e.error)
    }
}

impl<'a> CheckedBatches<'a> {
    /// A producer's batches: [`batch::validate_with_records`] on each (header,
    /// length at most `batch_bytes_max`, CRC, record set and its deltas).
    pub fn produced(bytes: &'a [u8], batch_bytes_max: usize) -> Result<Self, CheckError> {
        Self::check_each(bytes, batch_bytes_max, batch::validate_with_records)
    }

    /// Batches as a log holds them, from a trusted writer (a leader's, the
    /// log's own tests): [`batch::validate`] on each (header, length, CRC).
    pub fn stored(bytes: &'a [u8], batch_bytes_max: usize) -> Result<Self, CheckError> {
        Self::check_each(bytes, batch_bytes_max, batch::validate)
    }

    fn check_each(
        bytes: &'a [u8],
        batch_bytes_max: usize,
        check: fn(&[u8], usize) -> Result<BatchHeader, BatchError>,
    ) -> Result<Self, CheckError> {
        if bytes.is_empty() {
            return Err(CheckError { at: 0, error: BatchError::Empty });
        }
        let mut headers = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let h = check(&bytes[at..], batch_bytes_max).map_err(|error| CheckError { at, error })?;
            at += h.total_bytes();
            headers.push(h);
        }
        Ok(CheckedBatches { bytes, headers })
    }

    #[must_use]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    #[must_use]
    pub fn headers(&self) -> &[BatchHeader] {
        &self.headers
    }

    /// Records in all the batches.
    #[must_use]
    pub fn record_count(&self) -> u64 {
        self.headers.iter().map(|h| u64::from(h.record_count)).sum()
    }
}

/// One append carries at most [`super::APPEND_BYTES_MAX`].
pub(super) fn check_append_bytes(bytes: usize) -> Result<(), super::LogError> {
    if bytes > super::APPEND_BYTES_MAX {
        return Err(super::LogError::BatchTooLarge { bytes, max: super::APPEND_BYTES_MAX });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlog_schema::batch::BatchBuilder;

    fn one(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(256);
        for i in 0..n {
            b.push(None, format!("v{i}").as_bytes(), &[], 1);
        }
        b.finish()
    }

    #[test]
    fn headers_cover_the_bytes_exactly() {
        let mut two = one(3);
        two.extend(one(2));
        let c = CheckedBatches::produced(&two, 1 << 20).unwrap();
        assert_eq!(c.headers().len(), 2);
        assert_eq!(c.record_count(), 5);
        assert_eq!(c.headers().iter().map(BatchHeader::total_bytes).sum::<usize>(), two.len());
        assert_eq!(c.bytes().len(), two.len());
    }

    #[test]
    fn a_refusal_says_which_batch() {
        let mut two = one(3);
        let second = two.len();
        two.extend(one(2));
        let last = two.len() - 1;
        two[last] ^= 1;
        let e = CheckedBatches::stored(&two, 1 << 20).unwrap_err();
        assert_eq!(e.at, second);
        assert!(matches!(e.error, BatchError::CrcMismatch { .. }), "{e:?}");
        assert_eq!(CheckedBatches::stored(&[], 1 << 20).unwrap_err().error, BatchError::Empty);
        let e = CheckedBatches::produced(&two[..10], 1 << 20).unwrap_err();
        assert_eq!(e.at, 0);
    }
}
