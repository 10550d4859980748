//! One completion cell per batch, shared by every record's [`DeliveryFuture`].
//!
//! A record costs no channel and no allocation of its own: its future holds
//! the batch's `Arc<BatchCell>` and its index in the batch. The sender
//! completes the cell once (offsets or an error) and wakes every waiting
//! future; a future polled after completion reads the outcome without a lock.
//!
//! ```text
//!   send() ──▶ DeliveryFuture { cell: Arc<BatchCell>, index, timestamp }
//!                                   │
//!   sender ──complete(outcome)──▶ BatchCell { outcome: OnceLock, wakers: Mutex<Vec<Waker>> }
//! ```

use super::{RecordMetadata, OFFSET_UNKNOWN};
use crate::error::{ClientError, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Where a whole batch landed: the base offset (-1 when unknown, with
/// `Acks::None`), the broker's append time (-1 with create-time topics) and
/// when this client took the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Landed {
    pub base_offset: i64,
    pub append_time_ms: i64,
    pub acknowledged_at: Instant,
    /// When the batch was sealed and when the request that landed it was
    /// handed to its connection (see [`crate::producer::RecordMetadata`]).
    pub sealed_at: Instant,
    pub requested_at: Instant,
}

/// The outcome of one batch and the futures waiting for it.
pub(crate) struct BatchCell {
    topic: Arc<str>,
    partition: u32,
    outcome: OnceLock<Result<Landed>>,
    /// Wakers of pending futures; a future remembers its slot so that polling
    /// it again replaces its waker instead of adding one.
    wakers: Mutex<Vec<Waker>>,
}

impl BatchCell {
    pub fn new(topic: Arc<str>, partition: u32) -> Arc<BatchCell> {
        Arc::new(BatchCell { topic, partition, outcome: OnceLock::new(), wakers: Mutex::new(Vec::new()) })
    }

    /// Sets the outcome (the first call wins) and wakes every waiting future.
    pub fn complete(&self, outcome: Result<Landed>) {
        if self.outcome.set(outcome).is_err() {
            return;
        }
        // The outcome is set before the lock is taken: a future that takes the
        // lock after us sees it; one that took it before left its waker here.
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(PoisonError::into_inner));
        for w in wakers {
            w.wake();
        }
    }

    fn poll_outcome(&self, cx: &mut Context<'_>, slot: &mut Option<usize>) -> Poll<&Result<Landed>> {
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o);
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o);
        }
        match *slot {
            // Slots stay valid while the cell is pending: only `complete` empties the list.
            Some(i) if i < wakers.len() => {
                if !wakers[i].will_wake(cx.waker()) {
                    wakers[i] = cx.waker().clone();
                }
            }
            _ => {
                *slot = Some(wakers.len());
                wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// Completes the cell with `ClientError::Closed` if it is dropped before the
/// batch finished (runtime shut down, producer gone), so no future hangs.
pub(crate) struct Completion(Arc<BatchCell>);

impl Completion {
    pub fn new(topic: Arc<str>, partition: u32) -> Completion {
        Completion(BatchCell::new(topic, partition))
    }

    /// The future of the record at `index` in this batch.
    pub fn future(&self, index: u32, timestamp_ms: i64) -> DeliveryFuture {
        DeliveryFuture { state: State::Pending { cell: self.0.clone(), index, timestamp_ms, slot: None } }
    }

    pub fn complete(&self, outcome: Result<Landed>) {
        self.0.complete(outcome);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.0.complete(Err(ClientError::Closed));
    }
}

enum State {
    Pending {
        cell: Arc<BatchCell>,
        index: u32,
        timestamp_ms: i64,
        slot: Option<usize>,
    },
    /// Failed before it joined a batch (unknown topic or partition).
    Failed(Option<ClientError>),
}

/// Resolves when the record is acknowledged (with its offset) or has failed
/// for good. Dropping it does not cancel the send.
pub struct DeliveryFuture {
    state: State,
}

impl DeliveryFuture {
    pub(crate) fn failed(e: ClientError) -> DeliveryFuture {
        DeliveryFuture { state: State::Failed(Some(e)) }
    }
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            State::Failed(e) => Poll::Ready(Err(e.take().unwrap_or(ClientError::Closed))),
            State::Pending { cell, index, timestamp_ms, slot } => {
                cell.poll_outcome(cx, slot).map(|outcome| match outcome {
                    Ok(l) => Ok(RecordMetadata {
                        topic: cell.topic.clone(),
                        partition: cell.partition,
                        offset: if l.base_offset < 0 {
                            OFFSET_UNKNOWN
                        } else {
                            l.base_offset as u64 + u64::from(*index)
                        },
                        timestamp_ms: if l.append_time_ms >= 0 { l.append_time_ms } else { *timestamp_ms },
                        acknowledged_at: l.acknowledged_at,
                        sealed_at: l.sealed_at,
                        requested_at: l.requested_at,
                    }),
                    Err(e) => Err(e.clone()),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landed(base_offset: i64, append_time_ms: i64, at: Instant) -> Landed {
        Landed { base_offset, append_time_ms, acknowledged_at: at, sealed_at: at, requested_at: at }
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll(f: &mut DeliveryFuture, waker: &Waker) -> Poll<Result<RecordMetadata>> {
        Pin::new(f).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn one_completion_resolves_every_record_with_its_offset() {
        let c = Completion::new(Arc::from("t"), 3);
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut futures: Vec<_> = (0..5).map(|i| c.future(i, 100 + i64::from(i))).collect();
        for f in &mut futures {
            assert!(poll(f, &waker).is_pending());
            // Polling again replaces the waker instead of adding one.
            assert!(poll(f, &waker).is_pending());
        }
        assert_eq!(c.0.wakers.lock().expect("lock").len(), 5);
        let acked = Instant::now();
        c.complete(Ok(landed(40, -1, acked)));
        assert_eq!(counter.0.load(Ordering::SeqCst), 5, "every waiting future woken once");
        for (i, f) in futures.iter_mut().enumerate() {
            let Poll::Ready(Ok(md)) = poll(f, &waker) else { panic!("record {i} not resolved") };
            assert_eq!((&*md.topic, md.partition), ("t", 3));
            assert_eq!(md.offset, 40 + i as u64);
            assert_eq!(md.timestamp_ms, 100 + i as i64, "create time kept");
            assert_eq!(md.acknowledged_at, acked, "the batch's acknowledgement instant");
        }
        // A future created and first polled after completion resolves at once.
        let mut late = c.future(5, 0);
        let Poll::Ready(Ok(md)) = poll(&mut late, &waker) else { panic!("late future") };
        assert_eq!(md.offset, 45);
    }

    #[test]
    fn append_time_and_unknown_offsets() {
        let c = Completion::new(Arc::from("t"), 0);
        let mut f = c.future(2, 7);
        c.complete(Ok(landed(-1, 999, Instant::now())));
        let Poll::Ready(Ok(md)) = poll(&mut f, Waker::noop()) else { panic!("resolved") };
        assert_eq!((md.offset, md.timestamp_ms), (OFFSET_UNKNOWN, 999));
    }

    #[test]
    fn a_failed_batch_fails_every_record_and_the_first_outcome_wins() {
        let c = Completion::new(Arc::from("t"), 0);
        let mut futures: Vec<_> = (0..3).map(|i| c.future(i, 0)).collect();
        c.complete(Err(ClientError::Timeout));
        c.complete(Ok(landed(0, -1, Instant::now())));
        for f in &mut futures {
            assert!(matches!(poll(f, Waker::noop()), Poll::Ready(Err(ClientError::Timeout))));
        }
    }

    #[test]
    fn a_dropped_batch_fails_its_records_as_closed() {
        let c = Completion::new(Arc::from("t"), 0);
        let mut f = c.future(0, 0);
        drop(c);
        assert!(matches!(poll(&mut f, Waker::noop()), Poll::Ready(Err(ClientError::Closed))));
        let mut failed = DeliveryFuture::failed(ClientError::UnknownTopic("x".into()));
        assert!(matches!(poll(&mut failed, Waker::noop()), Poll::Ready(Err(ClientError::UnknownTopic(_)))));
    }
}
