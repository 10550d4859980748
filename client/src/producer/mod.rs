//! The producer: asynchronous batching with back-pressure.
//!
//! ```text
//!  send() ──[buffer bytes permit]──▶ accumulator (a mutex, held briefly, inside send):
//!                                      partition, append into the open BatchBuilder,
//!                                      seal when full; the record's future = its batch's
//!                                      completion cell + its index in the batch
//!                                                         │ batch ready (linger over, or at once
//!                                                         │ with linger_ms = 0), full, or flushed
//!                                                         ▼
//!                                  one sender task per owner-shard address
//!                                                         │ waits for an in-flight slot, seals its
//!                                                         │ ready batches, coalesces sealed batches
//!                                                         │ into one produce request (≤ max_in_flight)
//!                                                         ▼
//!                     completion task per request: one outcome per batch resolves
//!                     every record's future; retries (metadata refresh); buffer bytes released
//! ```
//!
//! `send` only waits for buffer space (`buffer_bytes_max`, counted in record
//! bytes from `send` until the record's request completes).
//!
//! **Order.** Records sent by one producer to one partition are appended in
//! `send` order at any `max_in_flight`, `batch_bytes` and `linger_ms`, as
//! long as no batch fails: batches of a partition are sealed into their
//! sender's queue in `send` order whichever path seals them (full, linger
//! over, a freed in-flight slot, flush), one sender task per connection
//! writes its requests in that order, and the broker appends a
//! connection's requests to each partition in arrival order. The exception,
//! as in Kafka without idempotence: a batch that fails with a retriable
//! error (a broker restart, a leader move) is sent again on its own after a
//! backoff, and batches of that partition sent meanwhile may land before
//! it (at any `max_in_flight`: the retry waits out its backoff while the
//! sender goes on). With `enable_idempotence` that cannot happen: every
//! batch carries the producer id and its partition's sequence, the broker
//! refuses a batch that does not follow the last one it stored
//! (`OutOfOrderSequence`, which this producer retries, so it lands once
//! the batch before it has) and answers a batch it already holds with its
//! first offsets. The producer keeps every batch it sends within the
//! broker's memory of its batches and retries a partition's batches in
//! order, before any later one (see `accumulator`). Order then holds across
//! retries, and a retry is never stored twice; a batch whose retries run
//! out fails, and so may the ones after it.

mod accumulator;
mod completion;
mod partitioner;
mod sender;

pub use completion::DeliveryFuture;
pub use partitioner::{DefaultPartitioner, Partitioner};

use crate::cluster::Cluster;
use crate::config::{ClientConfig, ProducerConfig};
use crate::error::{ClientError, Result};
use accumulator::Core;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{Semaphore, TryAcquireError};

/// Requests in flight per connection with idempotence. How far past its
/// partition's oldest unfinished batch a batch may be sent is a separate
/// bound, in batches ([`shardlog_schema::batch::IDEMPOTENT_BATCHES_REMEMBERED`],
/// see `accumulator`): a request may carry several batches of a partition.
pub const IDEMPOTENT_IN_FLIGHT_MAX: usize = 8;

/// The offset reported for records sent with `Acks::None` (the broker sends
/// no response, so the offset is never known).
pub const OFFSET_UNKNOWN: u64 = u64::MAX;

/// Fixed per-record overhead counted against the buffer and the batch size.
const RECORD_OVERHEAD_BYTES: usize = 32;

/// A record to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Shared: a clone per record costs a reference count, not a copy.
    pub topic: Arc<str>,
    /// `None`: chosen by the partitioner.
    pub partition: Option<u32>,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Vec<(String, Bytes)>,
    /// `None`: the time of `send`.
    pub timestamp_ms: Option<i64>,
}

impl ProducerRecord {
    pub fn new(topic: impl Into<Arc<str>>, value: impl Into<Bytes>) -> Self {
        ProducerRecord {
            topic: topic.into(),
            partition: None,
            key: None,
            value: value.into(),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    #[must_use]
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    #[must_use]
    pub fn with_partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    #[must_use]
    pub fn with_timestamp(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }

    /// Bytes this record counts for against buffer and batch limits.
    #[must_use]
    pub fn size_estimate(&self) -> usize {
        RECORD_OVERHEAD_BYTES
            + self.key.as_ref().map_or(0, Bytes::len)
            + self.value.len()
            + self.headers.iter().map(|(k, v)| k.len() + v.len() + 16).sum::<usize>()
    }
}

/// Where an acknowledged record landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    /// Shared with the record's batch (no allocation per delivered record).
    pub topic: Arc<str>,
    pub partition: u32,
    /// [`OFFSET_UNKNOWN`] with `Acks::None`.
    pub offset: u64,
    pub timestamp_ms: i64,
    /// When this client took the broker's acknowledgement of the record's
    /// batch (with `Acks::None`: when its request was written). A record's
    /// publish latency is this minus the instant of its `send`, whenever
    /// the application gets round to awaiting the delivery.
    pub acknowledged_at: std::time::Instant,
    /// When the record's batch was sealed (closed to more records and
    /// queued for its broker's sender)...
    pub sealed_at: std::time::Instant,
    /// ... and when the request that landed it was handed to the
    /// connection's writer (its last attempt's, after retries). With
    /// `acknowledged_at` and the send instant these break a record's
    /// publish latency down: accumulating, waiting for an in-flight slot,
    /// the round trip to the broker.
    pub requested_at: std::time::Instant,
}

/// Shared by every clone of one producer; dropping the last one sends what
/// is buffered and lets the background tasks end.
struct Shared {
    core: Arc<Core>,
    buffer: Arc<Semaphore>,
    buffer_bytes_max: usize,
    closed: AtomicBool,
}

/// A new producer id and epoch from the bootstrap broker.
async fn init_producer_id(cluster: &Cluster) -> Result<(i64, i16)> {
    let conn = cluster.bootstrap().await?;
    let client_id = &cluster.config.client_id;
    let raw = conn
        .call(|corr| crate::protocol::encode_init_producer_id(corr, client_id, -1, -1), Vec::new())
        .await?;
    crate::protocol::decode_init_producer_id(&raw)
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.core.shutdown();
    }
}

/// The producer. Cheap to clone; all clones share one accumulator and one
/// connection per owner shard.
#[derive(Clone)]
pub struct Producer {
    shared: Arc<Shared>,
}

impl Producer {
    /// Connects to the bootstrap broker and starts the background tasks.
    pub async fn new(config: ProducerConfig) -> Result<Producer> {
        if config.batch_bytes == 0 || config.buffer_bytes_max < config.batch_bytes.min(1 << 20) {
            return Err(ClientError::Config(
                "batch_bytes must be > 0 and buffer_bytes_max at least min(batch_bytes, 1 MiB)".into(),
            ));
        }
        // Semaphore permits are counted in u32 chunks per acquire and capped overall.
        let buffer_bytes_max = config.buffer_bytes_max.min(Semaphore::MAX_PERMITS).min(u32::MAX as usize);
        let idempotent = config.enable_idempotence && config.acks != crate::config::Acks::None;
        // The broker remembers that many batches per producer and partition:
        // more in flight, and a retry of the oldest after a lost connection
        // would be refused as out of order instead of answered as a duplicate.
        let max_in_flight = if idempotent {
            config.max_in_flight.min(IDEMPOTENT_IN_FLIGHT_MAX)
        } else {
            config.max_in_flight
        };
        let client = ClientConfig { max_in_flight, ..config.client.clone() };
        let cluster = Cluster::connect(client, Some(&[])).await?;
        let producer = if idempotent { Some(init_producer_id(&cluster).await?) } else { None };
        let buffer = Arc::new(Semaphore::new(buffer_bytes_max));
        let core = Core::start(cluster, &config, buffer.clone(), producer);
        Ok(Producer {
            shared: Arc::new(Shared { core, buffer, buffer_bytes_max, closed: AtomicBool::new(false) }),
        })
    }

    /// Queues a record. Waits only while the buffer is full (back-pressure);
    /// the returned future resolves when the record is acknowledged or fails.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(ClientError::Closed);
        }
        // A loop of sends whose futures are ready at once never yields by
        // itself: its worker would not run the tasks it wakes (the sender, a
        // connection's writer and reader) until the buffer is full, and the
        // round trips that free the buffer would wait behind it (publish p50
        // 20-50 ms at 2 M records/s of 100 B with a 16 MiB buffer, against
        // 1-3 ms with this). tokio's cooperative budget: a yield per 128 sends.
        tokio::task::consume_budget().await;
        let bytes = record.size_estimate();
        if bytes > self.shared.buffer_bytes_max {
            return Err(ClientError::RecordTooLarge { size: bytes, max: self.shared.buffer_bytes_max });
        }
        let permit = match self.shared.buffer.try_acquire_many(bytes as u32) {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits) => {
                self.shared.buffer.acquire_many(bytes as u32).await.map_err(|_| ClientError::Closed)?
            }
            Err(TryAcquireError::Closed) => return Err(ClientError::Closed),
        };
        // Given back by the completion path once the record's request is done.
        permit.forget();
        Ok(self.shared.core.append(record, bytes).await)
    }

    /// Sends a record and waits for its acknowledgement.
    pub async fn send_and_wait(&self, record: ProducerRecord) -> Result<RecordMetadata> {
        self.send(record).await?.await
    }

    /// Sends every buffered record now (ignoring `linger_ms`) and waits until
    /// all records sent before this call are acknowledged or failed.
    pub async fn flush(&self) -> Result<()> {
        self.shared.core.flush().await;
        Ok(())
    }

    /// Flushes, then refuses further sends from every clone.
    pub async fn close(self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.flush().await
    }
}
