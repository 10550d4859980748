//! The client's error type.

use shardlog_schema::error::{is_retriable, name};
use shardlog_schema::ErrorCode;
use std::sync::Arc;

/// Result alias used throughout the client.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Everything that can go wrong in the client.
///
/// `Clone` because one failed produce request fails every record it carried:
/// each record's [`crate::DeliveryFuture`] gets a copy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// A socket operation failed (connect, read, write).
    #[error("I/O error talking to {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The broker sent something that does not follow the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The broker answered with an error code.
    #[error("broker error {}: {message}", name(*code))]
    Broker { code: ErrorCode, message: String },
    /// No answer within `request_timeout_ms`.
    #[error("request timed out")]
    Timeout,
    /// The topic does not exist (metadata has no such topic).
    #[error("unknown topic `{0}`")]
    UnknownTopic(String),
    /// The partition does not exist in the topic.
    #[error("unknown partition {partition} of topic `{topic}`")]
    UnknownPartition { topic: String, partition: u32 },
    /// The connection closed while a request was outstanding.
    #[error("connection to {0} closed")]
    ConnectionClosed(String),
    /// The producer or consumer was closed.
    #[error("client is closed")]
    Closed,
    /// A record is larger than the producer may ever buffer.
    #[error("record of {size} bytes exceeds the producer limit of {max} bytes")]
    RecordTooLarge { size: usize, max: usize },
    /// Bad configuration or argument.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A consumer's position is outside its partition's log and its
    /// `offset_reset` policy is [`crate::OffsetReset::Error`]. `log_start` and
    /// `high_watermark` are what the broker reported with the error (-1:
    /// unknown): the readable offsets are `log_start..high_watermark`.
    #[error(
        "offset {offset} is out of range for {topic}/{partition}: readable offsets are {log_start} up to \
         {high_watermark} (exclusive), and the offset reset policy is none"
    )]
    OffsetOutOfRange { topic: String, partition: u32, offset: u64, log_start: i64, high_watermark: i64 },
}

impl ClientError {
    /// The broker error code behind this error, when there is one.
    #[must_use]
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker { code, .. } => Some(*code),
            ClientError::UnknownTopic(_) | ClientError::UnknownPartition { .. } => {
                Some(ErrorCode::UnknownTopicOrPartition)
            }
            ClientError::Timeout => Some(ErrorCode::RequestTimedOut),
            ClientError::RecordTooLarge { .. } => Some(ErrorCode::MessageTooLarge),
            ClientError::OffsetOutOfRange { .. } => Some(ErrorCode::OffsetOutOfRange),
            _ => None,
        }
    }

    /// Whether retrying (after a metadata refresh) may succeed.
    ///
    /// Unknown topics are not retried by the producer: a topic that does not
    /// exist is a user error, reported at once.
    #[must_use]
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Broker { code, .. } => is_retriable(*code),
            ClientError::Io { .. } | ClientError::ConnectionClosed(_) | ClientError::Timeout => true,
            _ => false,
        }
    }

    pub(crate) fn io(addr: &str, source: std::io::Error) -> Self {
        ClientError::Io { addr: addr.to_string(), source: Arc::new(source) }
    }

    pub(crate) fn broker(code: ErrorCode, message: Option<&str>) -> Self {
        ClientError::Broker { code, message: message.unwrap_or_default().to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_retry() {
        let e = ClientError::broker(ErrorCode::NotLeaderOrFollower, Some("moved"));
        assert_eq!(e.code(), Some(ErrorCode::NotLeaderOrFollower));
        assert!(e.is_retriable());
        assert_eq!(e.to_string(), "broker error NotLeaderOrFollower: moved");
        let e = ClientError::UnknownTopic("t".into());
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopicOrPartition));
        assert!(!e.is_retriable());
    }
}
