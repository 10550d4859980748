//! The Shardlog client (tokio): [`Admin`], [`Producer`], [`Consumer`].
//!
//! Every client starts from one bootstrap address, loads metadata, and then
//! talks to the shard that owns each partition on that shard's own port
//! (metadata names it), so requests never hop between cores in the broker.
//!
//! Code map, in data-path order:
//! - [`protocol`]: request encoding / response decoding, pure functions.
//! - `conn`: one TCP connection, a writer task (vectored, pipelined writes)
//!   and a reader task (responses matched by correlation id).
//! - `cluster`: metadata cache and one connection per shard address.
//! - `producer`: accumulator (partitioning, batching, inside `send`) → a
//!   sender task per shard (pipelined produce requests) → one completion per
//!   batch (offsets to every record's future, retries).
//! - [`consumer`]: concurrent long-polling fetches per owner shard.
//! - [`admin`]: topic management.

pub mod admin;
mod clock;
mod cluster;
pub mod config;
mod conn;
pub mod consumer;
mod consumer_group;
pub mod error;
pub mod group;
pub mod producer;
pub mod protocol;

pub use admin::{Admin, PartitionDescription, TopicDescription};
pub use config::{Acks, ClientConfig, ConsumerConfig, OffsetReset, ProducerConfig};
pub use consumer::{Consumer, ConsumerRecord, SeekTo};
pub use error::{ClientError, Result};
pub use group::{GroupSettings, RebalanceListener};
pub use producer::{
    DefaultPartitioner, DeliveryFuture, Partitioner, Producer, ProducerRecord, RecordMetadata, OFFSET_UNKNOWN,
};
pub use protocol::{BrokerInfo, ClusterMetadata, PartitionInfo, TopicMetadata};
pub use shardlog_schema::ErrorCode;

// Behaviour is tested against the real broker in `tests/`; unit tests here
// cover the pure parts (codec, demultiplexing, partitioning).

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_thread_safe() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Producer>();
        send_sync::<Admin>();
        send::<Consumer>();
        send::<DeliveryFuture>();
        send_sync::<ClientError>();
    }
}
