//! The log's error type. Every variant says what was being done and where.

use super::producers::SeqError;
use shardlog_schema::batch::BatchError;
use shardlog_schema::{ErrorCode, Offset};
use std::io;
use std::path::{Path, PathBuf};

/// What can go wrong in a partition log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An I/O operation failed (not for lack of space).
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The filesystem is full (ENOSPC, EDQUOT or a short write). The log is
    /// unchanged by the failed append and takes appends again once space
    /// returns.
    #[error("no space left on device: {op} {}: {source}", path.display())]
    NoSpace {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The process is out of file descriptors (EMFILE, or ENFILE for the
    /// whole system): a partition file cannot be opened. Nothing is lost;
    /// the operation can be retried once files are released.
    #[error(
        "too many open files: {op} {}: {source} (raise the open-files limit, `ulimit -n`, \
         or lower `--open-files-shard-max`)",
        path.display()
    )]
    TooManyOpenFiles {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A read outside `[start, end]`.
    #[error("offset {requested} is out of range: the log holds [{start}, {end})")]
    OffsetOutOfRange { requested: Offset, start: Offset, end: Offset },
    /// A batch given to `append` failed its header or CRC check.
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    /// An append larger than the topic allows.
    #[error("append of {bytes} bytes exceeds the limit of {max} bytes")]
    BatchTooLarge { bytes: usize, max: usize },
    /// The log is poisoned after an fdatasync failed: what was written may
    /// not be on disk, so it takes no more appends until it is reopened.
    #[error("log {} has failed and takes no more appends: {reason}", dir.display())]
    Failed { dir: PathBuf, reason: String },
    /// The log was closed or deleted.
    #[error("log {} is closed", dir.display())]
    Closed { dir: PathBuf },
    /// `truncate_to` was given an offset inside a batch.
    #[error("offset {offset} is not a batch boundary in {}", dir.display())]
    NotBatchBoundary { dir: PathBuf, offset: Offset },
    /// A follower's batches do not continue its log (`append_replica`).
    #[error("replica append starts at offset {got}, the log ends at {expected}")]
    ReplicaOffsetMismatch { expected: Offset, got: Offset },
    /// An idempotent producer's batch was refused by its sequence check.
    #[error("{0}")]
    Sequence(#[from] super::producers::SeqError),
    /// On-disk state that recovery cannot repair (a bad metadata file, an
    /// unknown format version).
    #[error("{}: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
}

impl LogError {
    /// The client-visible code for this error.
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        match self {
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            LogError::InvalidBatch(BatchError::BadLength { length, max, .. }) if *length > *max as u64 => {
                ErrorCode::MessageTooLarge
            }
            LogError::InvalidBatch(_) => ErrorCode::CorruptMessage,
            LogError::BatchTooLarge { .. } => ErrorCode::MessageTooLarge,
            LogError::NotBatchBoundary { .. } | LogError::ReplicaOffsetMismatch { .. } => {
                ErrorCode::InvalidRequest
            }
            LogError::TooManyOpenFiles { .. } => ErrorCode::ResourceLimit,
            LogError::Sequence(e) => match e {
                SeqError::OutOfOrder { .. } => ErrorCode::OutOfOrderSequence,
                SeqError::InvalidEpoch { .. } => ErrorCode::InvalidProducerEpoch,
                SeqError::NegativeSequence { .. } | SeqError::RetryNotAlone { .. } => {
                    ErrorCode::InvalidRequest
                }
            },
            // Not written, and the log takes appends again once space returns.
            LogError::NoSpace { .. } => ErrorCode::StorageFull,
            LogError::Io { .. }
            | LogError::Failed { .. }
            | LogError::Closed { .. }
            | LogError::Corrupt { .. } => ErrorCode::StorageError,
        }
    }

    /// Builds an I/O error, sorting "disk full" into [`LogError::NoSpace`]
    /// and "out of file descriptors" into [`LogError::TooManyOpenFiles`].
    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> LogError {
        if is_no_space(&source) {
            LogError::NoSpace { op, path: path.to_path_buf(), source }
        } else if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            warn_out_of_files(op, path, &source);
            LogError::TooManyOpenFiles { op, path: path.to_path_buf(), source }
        } else {
            LogError::Io { op, path: path.to_path_buf(), source }
        }
    }

    /// Builds an error from a glommio error, keeping the OS error number.
    pub(crate) fn glommio(op: &'static str, path: &Path, e: glommio::GlommioError<()>) -> LogError {
        LogError::io(op, path, unwrap_glommio(e))
    }

    /// A copy for delivery to each of several waiters of one failed
    /// operation (`io::Error` is not `Clone`; kind, OS code and message are kept).
    pub(crate) fn duplicate(&self) -> LogError {
        let dup_io = |e: &io::Error| match e.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(e.kind(), e.to_string()),
        };
        match self {
            LogError::Io { op, path, source } => {
                LogError::Io { op, path: path.clone(), source: dup_io(source) }
            }
            LogError::NoSpace { op, path, source } => {
                LogError::NoSpace { op, path: path.clone(), source: dup_io(source) }
            }
            LogError::TooManyOpenFiles { op, path, source } => {
                LogError::TooManyOpenFiles { op, path: path.clone(), source: dup_io(source) }
            }
            LogError::OffsetOutOfRange { requested, start, end } => {
                LogError::OffsetOutOfRange { requested: *requested, start: *start, end: *end }
            }
            LogError::InvalidBatch(e) => LogError::InvalidBatch(clone_batch_error(e)),
            LogError::BatchTooLarge { bytes, max } => LogError::BatchTooLarge { bytes: *bytes, max: *max },
            LogError::Failed { dir, reason } => LogError::Failed { dir: dir.clone(), reason: reason.clone() },
            LogError::Closed { dir } => LogError::Closed { dir: dir.clone() },
            LogError::Sequence(e) => LogError::Sequence(*e),
            LogError::NotBatchBoundary { dir, offset } => {
                LogError::NotBatchBoundary { dir: dir.clone(), offset: *offset }
            }
            LogError::Corrupt { path, what } => LogError::Corrupt { path: path.clone(), what: what.clone() },
            LogError::ReplicaOffsetMismatch { expected, got } => {
                LogError::ReplicaOffsetMismatch { expected: *expected, got: *got }
            }
        }
    }

    /// Whether this is a disk-full error.
    #[must_use]
    pub fn is_no_space(&self) -> bool {
        matches!(self, LogError::NoSpace { .. })
    }

    /// Whether this is the process running out of file descriptors.
    #[must_use]
    pub fn is_out_of_files(&self) -> bool {
        matches!(self, LogError::TooManyOpenFiles { .. })
    }
}

fn clone_batch_error(e: &BatchError) -> BatchError {
    match e {
        BatchError::Truncated { need, have } => BatchError::Truncated { need: *need, have: *have },
        BatchError::BadMagic(m) => BatchError::BadMagic(*m),
        BatchError::BadLength { length, min, max } => {
            BatchError::BadLength { length: *length, min: *min, max: *max }
        }
        BatchError::CrcMismatch { stored, computed } => {
            BatchError::CrcMismatch { stored: *stored, computed: *computed }
        }
        BatchError::RecordCountMismatch { header, actual } => {
            BatchError::RecordCountMismatch { header: *header, actual: *actual }
        }
        BatchError::UnsupportedCodec(c) => BatchError::UnsupportedCodec(*c),
        BatchError::Records(r) => BatchError::Records(r.clone()),
        BatchError::Empty => BatchError::Empty,
    }
}

/// How often a shard says it is out of file descriptors, at most.
const OUT_OF_FILES_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

thread_local! {
    static OUT_OF_FILES_LOGGED: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// One clear log line per shard (at most every
/// [`OUT_OF_FILES_LOG_INTERVAL`]) when opens fail for lack of descriptors.
fn warn_out_of_files(op: &str, path: &Path, source: &io::Error) {
    let now = std::time::Instant::now();
    let due = OUT_OF_FILES_LOGGED.with(|last| {
        let due = last.get().is_none_or(|t| now.duration_since(t) >= OUT_OF_FILES_LOG_INTERVAL);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        tracing::error!(
            op, path = %path.display(), error = %source, limit = super::files::process_files_limit(),
            "out of file descriptors: partition files cannot be opened and their requests fail with \
             ResourceLimit; raise the open-files limit (ulimit -n) or lower --open-files-shard-max"
        );
    }
}

/// ENOSPC or EDQUOT.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// Takes the `io::Error` out of a glommio error without losing its OS code
/// (glommio's own `From` conversion keeps only the kind).
pub(crate) fn unwrap_glommio(e: glommio::GlommioError<()>) -> io::Error {
    match e {
        glommio::GlommioError::IoError(e) => e,
        glommio::GlommioError::EnhancedIoError { source, .. } => source,
        other => other.into(),
    }
}
