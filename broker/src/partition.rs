//! One partition replica on its owning shard: the log plus the state the
//! serving path needs around it (leader epoch, waiters for new data).
//!
//! **Invariant**: a `Partition` lives on exactly one shard and is touched only
//! by that shard's thread. **API boundary**: `partition` does no I/O itself;
//! it validates input and delegates to `log`.

use crate::config::TopicConfig;
use crate::log::{AppendInfo, CheckError, CheckedBatches, Log, LogError, LogOptions, LogRead};
use shardlog_schema::batch::{self, BatchIter};
use shardlog_schema::{ErrorCode, Offset};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// A typed, client-visible failure of a partition operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionError {
    pub code: ErrorCode,
    pub message: String,
}

impl PartitionError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PartitionError { code, message: message.into() }
    }
}

impl From<LogError> for PartitionError {
    fn from(e: LogError) -> Self {
        PartitionError { code: e.error_code(), message: e.to_string() }
    }
}

/// Wakes fetches that wait for data. A generation counter makes "data arrived
/// after I looked" impossible to miss: a waiter remembers the generation it
/// read under and completes as soon as it differs.
#[derive(Default)]
pub struct DataNotify {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
    /// When the bytes of the newest append were written (the latency
    /// breakdown's `fetch_wake` starts there).
    written_at: Cell<Option<Instant>>,
}

impl DataNotify {
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// When the newest append's bytes were written, if one has been.
    pub fn written_at(&self) -> Option<Instant> {
        self.written_at.get()
    }

    /// New data written at `at`: wakes the waiting fetches.
    pub fn notify_written(&self, at: Instant) {
        self.written_at.set(Some(at));
        self.notify();
    }

    pub fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }

    /// Completes once the generation differs from `seen`.
    pub fn changed(self: &Rc<Self>, seen: u64) -> Changed {
        Changed { notify: self.clone(), seen }
    }
}

pub struct Changed {
    notify: Rc<DataNotify>,
    seen: u64,
}

impl Future for Changed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.generation.get() != self.seen {
            return Poll::Ready(());
        }
        let mut wakers = self.notify.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Checks that `bytes` is a sequence of whole, valid batches (header, CRC,
/// record set) each at most `batch_bytes_max`: the one check a produced
/// batch gets (the log takes the proof and does not check again).
pub fn validate_batches(bytes: &[u8], batch_bytes_max: usize) -> Result<CheckedBatches<'_>, PartitionError> {
    if bytes.is_empty() {
        return Err(PartitionError::new(ErrorCode::CorruptMessage, "produce request has no record batch"));
    }
    CheckedBatches::produced(bytes, batch_bytes_max).map_err(|CheckError { at, error }| match error {
        batch::BatchError::BadLength { length, .. } if length > batch_bytes_max as u64 => {
            PartitionError::new(
                ErrorCode::MessageTooLarge,
                format!("batch of {length} bytes exceeds the topic's max.message.bytes of {batch_bytes_max}"),
            )
        }
        error => {
            PartitionError::new(ErrorCode::CorruptMessage, format!("batch at byte {at} rejected: {error}"))
        }
    })
}

pub struct Partition {
    pub topic: Rc<str>,
    pub id: u32,
    pub log: Log,
    pub config: TopicConfig,
    pub leader_epoch: Cell<i32>,
    pub data: Rc<DataNotify>,
    /// Leader, follower or alone (`replica`).
    pub replica: crate::replica::Replica,
}

impl Partition {
    pub async fn open(
        dir: PathBuf,
        topic: Rc<str>,
        id: u32,
        config: TopicConfig,
        options: LogOptions,
    ) -> Result<Partition, LogError> {
        let log = Log::open_with(dir, config.clone(), options).await?;
        Ok(Partition::with_log(log, topic, id, config))
    }

    /// A partition over a log already open (`Log::open_wave`).
    #[must_use]
    pub fn with_log(log: Log, topic: Rc<str>, id: u32, config: TopicConfig) -> Partition {
        Partition {
            topic,
            id,
            log,
            config,
            leader_epoch: Cell::new(0),
            data: Rc::default(),
            replica: crate::replica::Replica::default(),
        }
    }

    /// Validates and appends whole batches; wakes waiting fetches.
    pub async fn append(&self, batches: &[u8]) -> Result<AppendInfo, PartitionError> {
        let checked = validate_batches(batches, self.config.batch_bytes_max as usize)?;
        let info = self.log.append_checked(checked, self.leader_epoch.get()).await?;
        self.replica.advance_hw(self.log.high_watermark().0);
        self.data.notify_written(info.written_at);
        Ok(info)
    }

    /// A consumer's read: whole batches below the high watermark.
    pub async fn read(&self, from: u64, max_bytes: usize) -> Result<LogRead, PartitionError> {
        let hw = self.high_watermark();
        Ok(self.log.read_upto(Offset(from), max_bytes, Offset(hw)).await?)
    }

    /// A follower's read: up to what this leader has written.
    pub async fn read_replica(&self, from: u64, max_bytes: usize) -> Result<LogRead, PartitionError> {
        Ok(self.log.read(Offset(from), max_bytes).await?)
    }

    /// What consumers may see (see `replica`).
    #[must_use]
    pub fn high_watermark(&self) -> u64 {
        self.replica.high_watermark(self.log.high_watermark().0)
    }

    /// `acks=all` before the append: refused while the ISR is smaller than
    /// `min.insync.replicas`.
    pub fn check_min_insync(&self) -> Result<(), PartitionError> {
        let isr = self.replica.isr_len();
        let min = usize::from(self.config.min_insync_replicas);
        if isr < min {
            return Err(PartitionError::new(
                ErrorCode::NotEnoughReplicas,
                format!(
                    "partition {}-{} has {isr} in-sync replica(s), fewer than its min.insync.replicas of {min}",
                    self.topic, self.id
                ),
            ));
        }
        Ok(())
    }

    /// `acks=all` after the append: waits until every in-sync replica has
    /// `last_offset` (the high watermark passed it), `timeout` at most.
    pub async fn wait_replicated(
        &self,
        last_offset: u64,
        timeout: std::time::Duration,
    ) -> Result<(), PartitionError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let seen = self.data.generation();
            if self.high_watermark() > last_offset {
                return Ok(());
            }
            if !self.replica.leads() {
                return Err(PartitionError::new(
                    ErrorCode::NotLeaderOrFollower,
                    format!(
                        "partition {}-{} lost its leadership here before offset {last_offset} was replicated: \
                         it may or may not survive; retry with the new leader",
                        self.topic, self.id
                    ),
                ));
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(PartitionError::new(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "partition {}-{}: offset {last_offset} not yet on every in-sync replica after {} ms",
                        self.topic,
                        self.id,
                        timeout.as_millis()
                    ),
                ));
            }
            let changed = self.data.changed(seen);
            let _ = futures_lite::future::or(changed, glommio::timer::sleep(deadline - now)).await;
        }
    }

    /// ListOffsets: -2 earliest, -1 latest (high watermark), else the first
    /// offset whose timestamp is at or after `timestamp`.
    pub async fn list_offset(&self, timestamp: i64) -> Result<(i64, i64), PartitionError> {
        match timestamp {
            -2 => Ok((self.log.start_offset().0 as i64, -1)),
            -1 => Ok((self.high_watermark() as i64, -1)),
            ts if ts < 0 => Err(PartitionError::new(
                ErrorCode::InvalidRequest,
                format!("timestamp {ts}: use -2 (earliest), -1 (latest) or a time in ms"),
            )),
            ts => Ok(self.log.offset_for_timestamp(ts).await?.map_or((-1, -1), |(o, t)| (o.0 as i64, t))),
        }
    }
}

/// Whether a batch iterator over `bytes` sees exactly whole batches.
#[must_use]
pub fn whole_batches(bytes: &[u8], batch_bytes_max: usize) -> bool {
    let mut it = BatchIter::new(bytes, batch_bytes_max);
    for b in it.by_ref() {
        if b.is_err() {
            return false;
        }
    }
    it.position() == bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlog_schema::batch::BatchBuilder;

    fn batch(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::with_capacity(256);
        for i in 0..n {
            b.push(None, format!("v{i}").as_bytes(), &[], 1);
        }
        b.finish()
    }

    #[test]
    fn validation_is_typed() {
        let mut two = batch(3);
        two.extend(batch(2));
        assert_eq!(validate_batches(&two, 1 << 20).map(|c| c.headers().len()), Ok(2));
        assert!(whole_batches(&two, 1 << 20));
        assert_eq!(validate_batches(&[], 1 << 20).unwrap_err().code, ErrorCode::CorruptMessage);
        let mut torn = two.clone();
        torn.truncate(torn.len() - 1);
        assert_eq!(validate_batches(&torn, 1 << 20).unwrap_err().code, ErrorCode::CorruptMessage);
        let mut flipped = two.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(validate_batches(&flipped, 1 << 20).unwrap_err().code, ErrorCode::CorruptMessage);
        assert_eq!(validate_batches(&two, 64).unwrap_err().code, ErrorCode::MessageTooLarge);
    }

    #[test]
    fn notify_generation() {
        let n = Rc::new(DataNotify::default());
        let seen = n.generation();
        let waker = futures_lite::future::block_on(futures_lite::future::poll_fn(|cx| {
            Poll::Ready(cx.waker().clone())
        }));
        let mut cx = Context::from_waker(&waker);
        let mut fut = n.changed(seen);
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        n.notify();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_ready());
    }
}
