//! The producer: asynchronous batching with back-pressure.
//!
//! ```text
//!  send() ──[buffer bytes permit]──▶ command channel ──▶ accumulator task
//!                                                         │ partition, append into a BatchBuilder,
//!                                                         │ seal on batch_bytes / linger_ms / flush
//!                                                         ▼
//!                                  one sender task per owner-shard address
//!                                                         │ coalesce sealed batches into one
//!                                                         │ produce request, ≤ max_in_flight pipelined
//!                                                         ▼
//!                     completion task per request: offsets → DeliveryFuture,
//!                     retries (metadata refresh), buffer bytes released
//! ```
//!
//! `send` only waits for buffer space (`buffer_bytes_max`, counted in record
//! bytes from `send` until the record's request completes). Records of one
//! partition leave in `send` order; with `max_in_flight > 1` a retried batch
//! may land after a later one (as in Kafka without idempotence).

mod accumulator;
mod partitioner;
mod sender;

pub use partitioner::{DefaultPartitioner, Partitioner};

use crate::cluster::Cluster;
use crate::config::{ClientConfig, ProducerConfig};
use crate::error::{ClientError, Result};
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// The offset reported for records sent with `Acks::None` (the broker sends
/// no response, so the offset is never known).
pub const OFFSET_UNKNOWN: u64 = u64::MAX;

/// Fixed per-record overhead counted against the buffer and the batch size.
const RECORD_OVERHEAD_BYTES: usize = 32;

/// A record to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord {
    pub topic: String,
    /// `None`: chosen by the partitioner.
    pub partition: Option<u32>,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Vec<(String, Bytes)>,
    /// `None`: the time of `send`.
    pub timestamp_ms: Option<i64>,
}

impl ProducerRecord {
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
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
    pub topic: String,
    pub partition: u32,
    /// [`OFFSET_UNKNOWN`] with `Acks::None`.
    pub offset: u64,
    pub timestamp_ms: i64,
}

/// What the completion path sends to a record's future (cheap: no String).
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub topic: Arc<str>,
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
}

pub(crate) type DeliveryReply = oneshot::Sender<Result<Delivered>>;

/// Resolves when the record is acknowledged (with its offset) or has failed
/// for good. Dropping it does not cancel the send.
pub struct DeliveryFuture {
    rx: oneshot::Receiver<Result<Delivered>>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| match r {
            Ok(Ok(d)) => Ok(RecordMetadata {
                topic: d.topic.to_string(),
                partition: d.partition,
                offset: d.offset,
                timestamp_ms: d.timestamp_ms,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClientError::Closed),
        })
    }
}

/// A record on its way to the accumulator.
pub(crate) struct QueuedRecord {
    pub record: ProducerRecord,
    pub bytes: usize,
    pub reply: DeliveryReply,
}

pub(crate) enum Command {
    Record(QueuedRecord),
    /// Seal every batch now and answer once all earlier records completed.
    Flush(oneshot::Sender<()>),
}

struct Shared {
    tx: mpsc::UnboundedSender<Command>,
    buffer: Arc<Semaphore>,
    buffer_bytes_max: usize,
    closed: AtomicBool,
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
        let client = ClientConfig { max_in_flight: config.max_in_flight, ..config.client.clone() };
        let cluster = Cluster::connect(client, Some(&[])).await?;
        let buffer = Arc::new(Semaphore::new(buffer_bytes_max));
        let (tx, rx) = mpsc::unbounded_channel();
        accumulator::spawn(cluster, config, buffer.clone(), rx);
        Ok(Producer {
            shared: Arc::new(Shared { tx, buffer, buffer_bytes_max, closed: AtomicBool::new(false) }),
        })
    }

    /// Queues a record. Waits only while the buffer is full (back-pressure);
    /// the returned future resolves when the record is acknowledged or fails.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(ClientError::Closed);
        }
        let bytes = record.size_estimate();
        if bytes > self.shared.buffer_bytes_max {
            return Err(ClientError::RecordTooLarge { size: bytes, max: self.shared.buffer_bytes_max });
        }
        let permit = self.shared.buffer.acquire_many(bytes as u32).await.map_err(|_| ClientError::Closed)?;
        // Given back by the completion path once the record's request is done.
        permit.forget();
        let (reply, rx) = oneshot::channel();
        if self.shared.tx.send(Command::Record(QueuedRecord { record, bytes, reply })).is_err() {
            self.shared.buffer.add_permits(bytes);
            return Err(ClientError::Closed);
        }
        Ok(DeliveryFuture { rx })
    }

    /// Sends a record and waits for its acknowledgement.
    pub async fn send_and_wait(&self, record: ProducerRecord) -> Result<RecordMetadata> {
        self.send(record).await?.await
    }

    /// Sends every buffered record now (ignoring `linger_ms`) and waits until
    /// all records sent before this call are acknowledged or failed.
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.shared.tx.send(Command::Flush(tx)).map_err(|_| ClientError::Closed)?;
        rx.await.map_err(|_| ClientError::Closed)
    }

    /// Flushes, then refuses further sends from every clone.
    pub async fn close(self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.flush().await
    }
}
