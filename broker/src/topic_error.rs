//! Why a topic creation or deletion failed: one typed error that crosses the
//! shard mesh (in `ShardReply::Done` and `ShardReply::TopicResults`) with its
//! cause intact, and the one place that maps it to a wire [`ErrorCode`].
//!
//! The `Display` text is what the client sees in `TopicResult.message` and
//! what the broker logs; callers decide by variant, never by that text.

use crate::config::ConfigError;
use crate::log::LogError;
use crate::topics::TopicsError;
use shardlog_schema::ErrorCode;

/// A failed topic operation, with the topic, partition and underlying error.
#[derive(Debug, thiserror::Error)]
pub enum TopicOpError {
    #[error("{reason}")]
    InvalidName { topic: String, reason: String },
    #[error("topic `{topic}` already exists")]
    AlreadyExists { topic: String },
    #[error("topic `{topic}` does not exist")]
    Unknown { topic: String },
    #[error("topic `{topic}` is internal to the broker and cannot be deleted")]
    Internal { topic: String },
    #[error("partitions must be 1 to {max}, not {partitions}")]
    InvalidPartitions { topic: String, partitions: u32, max: u32 },
    #[error("broker holds {total} partitions; limit is {max}")]
    PartitionLimit { topic: String, total: u64, max: u64 },
    #[error(
        "replication factor {replication} needs that many live brokers (one replica each); {live} \
         live (a broker without --zookeeper is alone: use 1)"
    )]
    Replication { topic: String, replication: u16, live: usize },
    /// Cluster mode: no controller created (or deleted) the topic in time.
    /// The request stays in ZooKeeper and a controller serves it later.
    #[error(
        "no controller acted on the request within {waited_ms} ms (it stays queued for the next controller)"
    )]
    ControllerTimeout { topic: String, waited_ms: u64 },
    /// Cluster mode: the controller refused the request (it logs why).
    #[error("the controller refused the request: {reason}")]
    Refused { topic: String, reason: String },
    /// Cluster mode: ZooKeeper could not be asked.
    #[error("cannot reach the cluster's ZooKeeper: {message}")]
    ZooKeeper { topic: String, message: String },
    #[error("{source}")]
    BadConfig {
        topic: String,
        #[source]
        source: ConfigError,
    },
    /// A shard could not open one of the topic's partitions.
    #[error("cannot open partition {topic}-{partition}: {source}")]
    OpenPartition {
        topic: String,
        partition: u32,
        #[source]
        source: LogError,
    },
    /// A shard could not delete one of the topic's partitions.
    #[error("cannot delete partition {topic}-{partition}: {source}")]
    DeletePartition {
        topic: String,
        partition: u32,
        #[source]
        source: LogError,
    },
    /// `topics.json` could not be written (boxed: `TopicsError` is large).
    #[error("{source}")]
    Persist {
        topic: String,
        #[source]
        source: Box<TopicsError>,
    },
    /// The shard asked is stopping (or its reply channel closed).
    #[error("shard {shard} is unavailable (stopping)")]
    ShardUnavailable { topic: String, shard: u16 },
    /// A shard answered with a reply of the wrong kind (a bug).
    #[error("shard {shard} answered {reply}")]
    UnexpectedReply { topic: String, shard: u16, reply: String },
    /// Creation failed on some shard and was undone everywhere.
    #[error("{source}; the topic was not created")]
    RolledBack {
        #[source]
        source: Box<TopicOpError>,
    },
}

impl TopicOpError {
    /// The client-visible code: the one mapping from topic-operation
    /// failures to the wire.
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        match self {
            TopicOpError::InvalidName { .. } => ErrorCode::InvalidTopicName,
            TopicOpError::AlreadyExists { .. } => ErrorCode::TopicAlreadyExists,
            TopicOpError::Unknown { .. } => ErrorCode::UnknownTopicOrPartition,
            TopicOpError::Internal { .. } => ErrorCode::InvalidTopicName,
            TopicOpError::InvalidPartitions { .. } => ErrorCode::InvalidPartitions,
            TopicOpError::PartitionLimit { .. } => ErrorCode::ResourceLimit,
            TopicOpError::Replication { .. } | TopicOpError::BadConfig { .. } => ErrorCode::InvalidConfig,
            // Out of descriptors is a limit the operator can raise; any
            // other failure to open or delete a log is the disk's.
            TopicOpError::OpenPartition { source, .. } | TopicOpError::DeletePartition { source, .. } => {
                if source.is_out_of_files() {
                    ErrorCode::ResourceLimit
                } else {
                    ErrorCode::StorageError
                }
            }
            TopicOpError::Persist { .. } | TopicOpError::UnexpectedReply { .. } => ErrorCode::StorageError,
            TopicOpError::ShardUnavailable { .. } => ErrorCode::BrokerShuttingDown,
            TopicOpError::ControllerTimeout { .. } => ErrorCode::RequestTimedOut,
            TopicOpError::Refused { .. } => ErrorCode::InvalidRequest,
            TopicOpError::ZooKeeper { .. } => ErrorCode::Unknown,
            TopicOpError::RolledBack { source } => source.error_code(),
        }
    }
}

/// The outcome of one topic in a CreateTopics or DeleteTopics request.
#[derive(Debug)]
pub struct TopicOutcome {
    pub name: String,
    pub result: Result<(), TopicOpError>,
}

impl TopicOutcome {
    /// The wire code and message (empty on success).
    #[must_use]
    pub fn code_and_message(&self) -> (ErrorCode, String) {
        match &self.result {
            Ok(()) => (ErrorCode::None, String::new()),
            Err(e) => (e.error_code(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn io(errno: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn error_codes() {
        let t = || "t".to_string();
        let open = |source| TopicOpError::OpenPartition { topic: t(), partition: 5, source };
        let emfile =
            LogError::TooManyOpenFiles { op: "open", path: PathBuf::from("/d"), source: io(libc::EMFILE) };
        let eisdir = LogError::Io { op: "open", path: PathBuf::from("/d"), source: io(libc::EISDIR) };
        let cases = [
            (TopicOpError::InvalidName { topic: t(), reason: "bad".into() }, ErrorCode::InvalidTopicName),
            (TopicOpError::AlreadyExists { topic: t() }, ErrorCode::TopicAlreadyExists),
            (TopicOpError::Unknown { topic: t() }, ErrorCode::UnknownTopicOrPartition),
            (TopicOpError::Internal { topic: t() }, ErrorCode::InvalidTopicName),
            (
                TopicOpError::InvalidPartitions { topic: t(), partitions: 0, max: 9 },
                ErrorCode::InvalidPartitions,
            ),
            (TopicOpError::PartitionLimit { topic: t(), total: 9, max: 9 }, ErrorCode::ResourceLimit),
            (TopicOpError::Replication { topic: t(), replication: 3, live: 1 }, ErrorCode::InvalidConfig),
            (
                TopicOpError::BadConfig { topic: t(), source: ConfigError::Unknown("x".into()) },
                ErrorCode::InvalidConfig,
            ),
            (open(emfile.duplicate()), ErrorCode::ResourceLimit),
            (open(eisdir.duplicate()), ErrorCode::StorageError),
            (
                TopicOpError::DeletePartition { topic: t(), partition: 0, source: eisdir.duplicate() },
                ErrorCode::StorageError,
            ),
            (
                TopicOpError::Persist {
                    topic: t(),
                    source: Box::new(TopicsError::Io {
                        op: "fsync",
                        path: PathBuf::from("/d"),
                        source: io(libc::EIO),
                    }),
                },
                ErrorCode::StorageError,
            ),
            (TopicOpError::ShardUnavailable { topic: t(), shard: 1 }, ErrorCode::BrokerShuttingDown),
            (
                TopicOpError::UnexpectedReply { topic: t(), shard: 1, reply: "Waited".into() },
                ErrorCode::StorageError,
            ),
            // A rolled-back creation keeps the cause's code.
            (TopicOpError::RolledBack { source: Box::new(open(emfile)) }, ErrorCode::ResourceLimit),
            (TopicOpError::RolledBack { source: Box::new(open(eisdir)) }, ErrorCode::StorageError),
        ];
        for (e, code) in cases {
            assert_eq!(e.error_code(), code, "{e:?}");
        }
    }

    #[test]
    fn messages_name_the_partition_and_cause() {
        let source = LogError::TooManyOpenFiles {
            op: "open",
            path: PathBuf::from("/d/t-5"),
            source: io(libc::EMFILE),
        };
        let e = TopicOpError::RolledBack {
            source: Box::new(TopicOpError::OpenPartition { topic: "t".into(), partition: 5, source }),
        };
        let outcome = TopicOutcome { name: "t".into(), result: Err(e) };
        let (code, message) = outcome.code_and_message();
        assert_eq!(code, ErrorCode::ResourceLimit);
        assert!(message.starts_with("cannot open partition t-5: too many open files"), "{message}");
        assert!(message.ends_with("; the topic was not created"), "{message}");
        let ok = TopicOutcome { name: "t".into(), result: Ok(()) };
        assert_eq!(ok.code_and_message(), (ErrorCode::None, String::new()));
    }
}
