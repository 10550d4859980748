//! Client, producer and consumer settings with their defaults.

use crate::producer::Partitioner;
use std::sync::Arc;

/// Settings shared by every client type.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of any broker's public port, or a comma-separated list
    /// of them (tried in turn until one answers; the brokers metadata names
    /// are tried after them).
    pub bootstrap: String,
    /// Sent in every request envelope (for broker logs).
    pub client_id: String,
    /// How long to wait for one response before failing with `Timeout`.
    pub request_timeout_ms: u64,
    /// How long to wait for a TCP connection.
    pub connect_timeout_ms: u64,
    /// Pause before retrying a retriable error.
    pub retry_backoff_ms: u64,
    /// Requests outstanding on one connection before senders wait.
    pub max_in_flight: usize,
    /// Largest response envelope / payload accepted from a broker.
    pub response_header_bytes_max: u32,
    pub response_payload_bytes_max: u32,
}

pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const RETRY_BACKOFF_MS_DEFAULT: u64 = 100;
pub const MAX_IN_FLIGHT_DEFAULT: usize = 8;
/// Fetch responses carry up to `fetch_max_bytes` (50 MiB) plus one batch.
pub const RESPONSE_PAYLOAD_BYTES_MAX_DEFAULT: u32 = 256 << 20;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            bootstrap: "127.0.0.1:9092".to_string(),
            client_id: "shardlog-client".to_string(),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            retry_backoff_ms: RETRY_BACKOFF_MS_DEFAULT,
            max_in_flight: MAX_IN_FLIGHT_DEFAULT,
            response_header_bytes_max: shardlog_schema::frame::HEADER_BYTES_MAX_DEFAULT,
            response_payload_bytes_max: RESPONSE_PAYLOAD_BYTES_MAX_DEFAULT,
        }
    }
}

impl ClientConfig {
    /// Defaults with another bootstrap address.
    #[must_use]
    pub fn new(bootstrap: impl Into<String>) -> Self {
        ClientConfig { bootstrap: bootstrap.into(), ..ClientConfig::default() }
    }
}

/// How many acknowledgements a produce request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acks {
    /// Fire and forget: the broker sends no response. Delivery futures
    /// resolve once the request is written, with offset [`crate::OFFSET_UNKNOWN`].
    None,
    /// The leader appended the batch.
    #[default]
    Leader,
    /// Every in-sync replica appended the batch.
    All,
}

impl Acks {
    /// The wire value (`ProduceRequest.acks`).
    #[must_use]
    pub fn wire(self) -> i8 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

/// Producer settings.
#[derive(Clone)]
pub struct ProducerConfig {
    pub client: ClientConfig,
    pub acks: Acks,
    /// How long a batch may wait for more records before it is sent.
    pub linger_ms: u64,
    /// Target size of one record batch.
    pub batch_bytes: usize,
    /// Bytes of records buffered (queued, batching or in flight) before
    /// `send` waits: the back-pressure bound.
    pub buffer_bytes_max: usize,
    /// Produce requests outstanding per connection (at most
    /// [`crate::producer::IDEMPOTENT_IN_FLIGHT_MAX`] with idempotence).
    pub max_in_flight: usize,
    /// Retries of a retriable error (with metadata refresh) before a batch
    /// fails. A retried batch may land after batches of its partition sent
    /// later (see the producer's module docs on order).
    pub retries: u32,
    /// Kafka's `delivery.timeout.ms`: no retry starts later than this after
    /// a batch was sealed (with `retries` set high, this is what bounds
    /// them: a partition whose broker restarts within it loses nothing).
    pub delivery_timeout_ms: u64,
    /// `None`: the default partitioner (FNV-1a key hash; sticky for keyless records).
    pub partitioner: Option<Arc<dyn Partitioner>>,
    /// Largest single produce request payload (several batches coalesce into one request).
    pub request_bytes_max: usize,
    /// Idempotent producing (Kafka's `enable.idempotence`): the producer gets
    /// a producer id from the broker at start, its batches carry it and
    /// per-partition sequence numbers, and the partition leader stores a
    /// retried batch once and never appends a batch out of order. On by
    /// default, as in Kafka since 3.0 (it costs one InitProducerId round
    /// trip at start); ignored with `Acks::None`, where no answer could
    /// tell a duplicate or a gap.
    pub enable_idempotence: bool,
}

pub const LINGER_MS_DEFAULT: u64 = 5;
pub const BATCH_BYTES_DEFAULT: usize = 1 << 20;
pub const BUFFER_BYTES_MAX_DEFAULT: usize = 64 << 20;
pub const RETRIES_DEFAULT: u32 = 5;
/// Kafka's default `delivery.timeout.ms`.
pub const DELIVERY_TIMEOUT_MS_DEFAULT: u64 = 120_000;
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 8 << 20;

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            client: ClientConfig::default(),
            acks: Acks::Leader,
            linger_ms: LINGER_MS_DEFAULT,
            batch_bytes: BATCH_BYTES_DEFAULT,
            buffer_bytes_max: BUFFER_BYTES_MAX_DEFAULT,
            max_in_flight: MAX_IN_FLIGHT_DEFAULT,
            retries: RETRIES_DEFAULT,
            delivery_timeout_ms: DELIVERY_TIMEOUT_MS_DEFAULT,
            partitioner: None,
            request_bytes_max: REQUEST_BYTES_MAX_DEFAULT,
            enable_idempotence: true,
        }
    }
}

impl std::fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerConfig")
            .field("client", &self.client)
            .field("acks", &self.acks)
            .field("linger_ms", &self.linger_ms)
            .field("batch_bytes", &self.batch_bytes)
            .field("buffer_bytes_max", &self.buffer_bytes_max)
            .field("max_in_flight", &self.max_in_flight)
            .field("retries", &self.retries)
            .field("delivery_timeout_ms", &self.delivery_timeout_ms)
            .field("partitioner", &self.partitioner.as_ref().map(|_| "custom"))
            .field("request_bytes_max", &self.request_bytes_max)
            .field("enable_idempotence", &self.enable_idempotence)
            .finish()
    }
}

/// What a consumer does when its position is outside the log
/// (`OffsetOutOfRange`, e.g. after retention deleted old segments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    #[default]
    Earliest,
    Latest,
    /// Return the error from `poll`.
    Error,
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub client: ClientConfig,
    /// Longest time the broker holds a fetch waiting for `fetch_min_bytes`.
    pub fetch_max_wait_ms: u32,
    pub fetch_min_bytes: u32,
    /// Bytes one fetch response may carry over all its partitions.
    pub fetch_max_bytes: u32,
    /// Bytes one fetch response may carry for one partition. 8 MiB by
    /// default, not Kafka's 1 MiB: with one fetch in flight per broker and
    /// two answers kept ahead, 1 MiB per round trip let a consumer of one
    /// 1 KB partition read only 24 % of what one producer wrote on the
    /// 2-core machine of `perf-reports/` (8 MiB: 99.8 %, e2e p99 72 ms
    /// against 9.5 s). `fetch_max_bytes` still bounds a whole answer.
    pub partition_max_bytes: u32,
    pub offset_reset: OffsetReset,
    /// Set to consume as a member of a consumer group (`Consumer::subscribe`);
    /// where a partition has no committed offset the member starts as
    /// `offset_reset` says.
    pub group: Option<crate::group::GroupSettings>,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            client: ClientConfig::default(),
            fetch_max_wait_ms: 500,
            fetch_min_bytes: 1,
            fetch_max_bytes: 50 << 20,
            partition_max_bytes: 8 << 20,
            offset_reset: OffsetReset::Earliest,
            group: None,
        }
    }
}
