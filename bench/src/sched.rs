//! The load generator's timing core, independent of the client library.
//!
//! **Open loop**: message `i` of a producer has an *intended* send time
//! `start + i / rate`. The producer sleeps until that instant, sends, and the
//! latency of the message is measured from the intended time, not from the
//! moment `send` was finally called. A stalled sender therefore shows up in
//! the latency of every message that queued behind the stall (no coordinated
//! omission). The sleep uses [`crate::pacer`], which wakes within tens of
//! microseconds of the intended time instead of at tokio's next 1 ms tick.
//!
//! **Closed loop**: the intended time is "now" at each send; the producer sends
//! as fast as the client's back-pressure allows.
//!
//! Every message's latency is recorded (no sampling), at the cost of a queue
//! entry and a poll: an ack carries the instant it arrived (the client takes
//! it when the broker's answer is read), so the loop takes acks in send
//! order whenever it gets round to them, in its own task, and a sending loop
//! blocked on back-pressure still measures each ack at its arrival.

use crate::hist::LatencyHist;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Nanoseconds of `CLOCK_MONOTONIC`: the same clock for every process on the
/// host, so a timestamp written by a producer can be read by any consumer.
#[must_use]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) cannot fail");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps `Instant`s to `mono_ns` values (both are CLOCK_MONOTONIC on Linux;
/// the pair pins the offset once).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
    base_ns: u64,
}

impl Clock {
    #[must_use]
    pub fn new() -> Self {
        Clock { base: Instant::now(), base_ns: mono_ns() }
    }

    #[must_use]
    pub fn ns(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.base) {
            Some(d) => self.base_ns + d.as_nanos() as u64,
            None => self.base_ns - (self.base - at).as_nanos() as u64,
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// When each message is meant to be sent.
#[derive(Clone, Copy, Debug)]
pub enum Schedule {
    /// As fast as possible: each message is intended "now".
    ClosedLoop,
    /// `rate_per_s` messages per second from `start`.
    OpenLoop { start: Instant, rate_per_s: f64 },
}

impl Schedule {
    /// Intended send instant of message `seq`, or `None` for "now".
    #[must_use]
    pub fn intended(&self, seq: u64) -> Option<Instant> {
        match *self {
            Schedule::ClosedLoop => None,
            Schedule::OpenLoop { start, rate_per_s } => {
                Some(start + Duration::from_secs_f64(seq as f64 / rate_per_s))
            }
        }
    }
}

/// Per-second counters shared by the tasks of a run and read by the progress
/// bar and the report. This is the load generator, not the broker: shared
/// atomics are fine here.
pub struct Counters {
    start: Instant,
    pub sent_msgs: Vec<AtomicU64>,
    pub sent_bytes: Vec<AtomicU64>,
    pub acked_msgs: Vec<AtomicU64>,
    pub recv_msgs: Vec<AtomicU64>,
    pub recv_bytes: Vec<AtomicU64>,
    pub errors: AtomicU64,
}

/// Bound on the length of a run's per-second series.
pub const SERIES_SECONDS_MAX: usize = 4 * 3_600;

impl Counters {
    #[must_use]
    pub fn new(start: Instant) -> Self {
        let v = || (0..SERIES_SECONDS_MAX).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Counters {
            start,
            sent_msgs: v(),
            sent_bytes: v(),
            acked_msgs: v(),
            recv_msgs: v(),
            recv_bytes: v(),
            errors: AtomicU64::new(0),
        }
    }

    #[must_use]
    pub fn start(&self) -> Instant {
        self.start
    }

    #[must_use]
    pub fn slot(&self, at: Instant) -> usize {
        (at.saturating_duration_since(self.start).as_secs() as usize).min(SERIES_SECONDS_MAX - 1)
    }

    pub fn add(series: &[AtomicU64], slot: usize, n: u64) {
        series[slot].fetch_add(n, Ordering::Relaxed);
    }

    pub fn on_received(&self, msgs: u64, bytes: u64) {
        let s = self.slot(Instant::now());
        Self::add(&self.recv_msgs, s, msgs);
        Self::add(&self.recv_bytes, s, bytes);
    }

    /// Sum of `series` over all seconds.
    #[must_use]
    pub fn total(series: &[AtomicU64]) -> u64 {
        series.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// `series` for seconds `0..secs`.
    #[must_use]
    pub fn snapshot(series: &[AtomicU64], secs: usize) -> Vec<u64> {
        series[..secs.min(SERIES_SECONDS_MAX)].iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// What the sending loop needs from a producer. `send` may wait for buffer
/// space (back-pressure); the returned ack resolves to the instant the
/// message was acknowledged.
///
/// An ack must be **eager**: its instant is when the acknowledgement
/// happened, however late the loop gets round to polling it (the client's
/// [`shardlog_client::RecordMetadata::acknowledged_at`]). The loop polls
/// acks in send order, only the oldest ones, and never waits on one while
/// it can send, so per-record latency costs one queue entry and a poll.
pub trait Sender: Send {
    type Ack: Future<Output = Result<Acked, Self::Failure>> + Unpin + Send;
    /// What a failed ack says; [`Sender::failed`] turns it into the error.
    type Failure;
    /// Sends message `seq` whose payload carries `intended_ns`.
    fn send(
        &mut self,
        seq: u64,
        intended_ns: u64,
    ) -> impl Future<Output = anyhow::Result<(Self::Ack, u64)>> + Send;
    /// Notes a message whose ack failed (for the order check) and says why.
    fn failed(&mut self, failure: Self::Failure) -> anyhow::Error;
}

/// A message's acknowledgement as the client reported it.
#[derive(Clone, Copy, Debug)]
pub struct Acked {
    /// When the acknowledgement happened (see [`Sender`]).
    pub at: Instant,
    /// When the message's batch was sealed and when the request carrying it
    /// was handed to the connection, if the sender knows (the client's part
    /// of the latency breakdown).
    pub steps: Option<(Instant, Instant)>,
}

/// The client's part of the publish latency, per message (intended send ->
/// batch sealed -> request handed to the connection -> acknowledged): what
/// the latency breakdown reports beside the broker's stages.
#[derive(Clone, Default)]
pub struct ClientSteps {
    pub accumulate: LatencyHist,
    pub slot_wait: LatencyHist,
    pub round_trip: LatencyHist,
}

impl ClientSteps {
    fn record(&mut self, intended: Instant, sealed: Instant, requested: Instant, acked: Instant) {
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
        self.accumulate.record_ns(ns(intended, sealed));
        self.slot_wait.record_ns(ns(sealed, requested));
        self.round_trip.record_ns(ns(requested, acked));
    }

    pub fn merge(&mut self, other: &ClientSteps) {
        self.accumulate.merge(&other.accumulate);
        self.slot_wait.merge(&other.slot_wait);
        self.round_trip.merge(&other.round_trip);
    }
}

/// Settings of one producer loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopConfig {
    pub schedule: Schedule,
    /// Latencies of messages intended before this instant are not recorded.
    pub measure_from: Instant,
    /// No message intended at or after this instant is sent.
    pub stop_at: Instant,
    /// Upper bound on messages to send (backlog phases); `u64::MAX` for none.
    pub msgs_max: u64,
    /// Acks pending at once before the loop waits for the oldest.
    pub outstanding_max: usize,
    /// Record the client's steps of every measured message (three more
    /// histogram entries each; the open-loop latency workloads).
    pub steps: bool,
}

/// Result of one producer loop.
pub struct LoopResult {
    pub sent: u64,
    pub acked: u64,
    pub errors: u64,
    pub publish: LatencyHist,
    /// With [`LoopConfig::steps`].
    pub steps: Option<ClientSteps>,
}

/// Runs one producer: paces sends by `cfg.schedule` and records, for every
/// message, `ack instant - intended instant` (no sampling).
pub async fn run_producer<S: Sender>(
    mut sender: S,
    cfg: LoopConfig,
    clock: Clock,
    counters: Arc<Counters>,
    abort: Arc<AtomicBool>,
) -> anyhow::Result<LoopResult> {
    let mut acks = Pending::<S>::new(cfg.measure_from, counters.clone(), cfg.steps);
    let mut sent = LocalSeries::default();
    let mut seq = 0u64;
    let open_loop = matches!(cfg.schedule, Schedule::OpenLoop { .. });
    while seq < cfg.msgs_max && !abort.load(Ordering::Relaxed) {
        let intended = match cfg.schedule.intended(seq) {
            Some(at) => {
                if at >= cfg.stop_at {
                    break;
                }
                crate::pacer::sleep_until(at).await;
                at
            }
            None => {
                let now = Instant::now();
                if now >= cfg.stop_at {
                    break;
                }
                now
            }
        };
        let (ack, bytes) = sender.send(seq, clock.ns(intended)).await?;
        // Closed loop: `intended` was read just before the send.
        let sent_at = if open_loop { Instant::now() } else { intended };
        sent.add(&counters, counters.slot(sent_at), bytes);
        acks.push(intended, ack);
        if acks.len() >= cfg.outstanding_max.max(1) {
            acks.wait_oldest(&mut sender).await;
        } else if seq.is_multiple_of(TAKE_READY_EVERY) {
            acks.take_ready(&mut sender);
        }
        seq += 1;
    }
    sent.flush(&counters);
    while !acks.is_empty() {
        acks.wait_oldest(&mut sender).await;
    }
    let (acked, errors, publish, steps) = acks.finish();
    Ok(LoopResult { sent: seq, acked, errors, publish, steps })
}

/// Sends between two looks at the oldest acks: a look at one still pending
/// costs a poll (a lock in the client), and the acks of a batch resolve
/// together, so looking after every send buys nothing.
const TAKE_READY_EVERY: u64 = 32;

/// A loop's sent messages and bytes of the current second, added to the
/// shared series when the second changes (not per message).
#[derive(Default)]
struct LocalSeries {
    slot: usize,
    msgs: u64,
    bytes: u64,
}

impl LocalSeries {
    fn add(&mut self, counters: &Counters, slot: usize, bytes: u64) {
        if slot != self.slot {
            self.flush(counters);
            self.slot = slot;
        }
        self.msgs += 1;
        self.bytes += bytes;
    }

    fn flush(&mut self, counters: &Counters) {
        if self.msgs > 0 {
            Counters::add(&counters.sent_msgs, self.slot, self.msgs);
            Counters::add(&counters.sent_bytes, self.slot, self.bytes);
        }
        (self.msgs, self.bytes) = (0, 0);
    }
}

/// Acks not yet taken, oldest first, with what the taken ones showed.
struct Pending<S: Sender> {
    queue: VecDeque<(Instant, S::Ack)>,
    measure_from: Instant,
    counters: Arc<Counters>,
    acked_slot: usize,
    acked_in_slot: u64,
    hist: LatencyHist,
    steps: Option<ClientSteps>,
    acked: u64,
    errors: u64,
    first_error: Option<String>,
}

impl<S: Sender> Pending<S> {
    fn new(measure_from: Instant, counters: Arc<Counters>, steps: bool) -> Self {
        Pending {
            steps: steps.then(ClientSteps::default),
            queue: VecDeque::new(),
            measure_from,
            counters,
            acked_slot: 0,
            acked_in_slot: 0,
            hist: LatencyHist::new(),
            acked: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn push(&mut self, intended: Instant, ack: S::Ack) {
        self.queue.push_back((intended, ack));
    }

    /// Takes the oldest acks that have resolved, up to the first that has not.
    fn take_ready(&mut self, sender: &mut S) {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some((_, ack)) = self.queue.front_mut() {
            let Poll::Ready(r) = Pin::new(ack).poll(&mut cx) else { break };
            let (intended, _) = self.queue.pop_front().expect("a front entry");
            self.take(intended, r.map_err(|f| sender.failed(f)));
        }
    }

    /// Waits for the oldest ack, then takes every resolved one after it.
    async fn wait_oldest(&mut self, sender: &mut S) {
        let Some((intended, ack)) = self.queue.pop_front() else { return };
        let r = ack.await;
        self.take(intended, r.map_err(|f| sender.failed(f)));
        self.take_ready(sender);
    }

    fn take(&mut self, intended: Instant, r: anyhow::Result<Acked>) {
        match r {
            Ok(Acked { at: done, steps }) => {
                self.acked += 1;
                let slot = self.counters.slot(done);
                if slot != self.acked_slot {
                    self.flush_acked();
                    self.acked_slot = slot;
                }
                self.acked_in_slot += 1;
                if intended >= self.measure_from {
                    self.hist.record_ns(done.saturating_duration_since(intended).as_nanos() as u64);
                    if let (Some(h), Some((sealed, requested))) = (&mut self.steps, steps) {
                        h.record(intended, sealed, requested, done);
                    }
                }
            }
            Err(e) => {
                self.errors += 1;
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    fn flush_acked(&mut self) {
        if self.acked_in_slot > 0 {
            Counters::add(&self.counters.acked_msgs, self.acked_slot, self.acked_in_slot);
            self.acked_in_slot = 0;
        }
    }

    fn finish(mut self) -> (u64, u64, LatencyHist, Option<ClientSteps>) {
        self.flush_acked();
        if let Some(e) = &self.first_error {
            eprintln!("shardlog-bench: {} sends failed; first error: {e}", self.errors);
        }
        (self.acked, self.errors, self.hist, self.steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake producer whose acks complete after a fixed service time, with
    /// one deliberate stall: `send` blocks for `stall` at message `stall_at`
    /// (as a client blocked on back-pressure would).
    struct FakeSender {
        service: Duration,
        stall_at: u64,
        stall: Duration,
    }

    impl Sender for FakeSender {
        type Ack = std::pin::Pin<Box<dyn Future<Output = Result<Acked, ()>> + Send>>;
        type Failure = ();
        fn failed(&mut self, (): ()) -> anyhow::Error {
            anyhow::anyhow!("the fake ack failed")
        }
        fn send(
            &mut self,
            seq: u64,
            _intended_ns: u64,
        ) -> impl Future<Output = anyhow::Result<(Self::Ack, u64)>> + Send {
            let (service, stall) =
                (self.service, if seq == self.stall_at { self.stall } else { Duration::ZERO });
            async move {
                if !stall.is_zero() {
                    tokio::time::sleep(stall).await;
                }
                // Eager, as a client's ack is: it completes `service` after
                // the send whenever it is polled.
                let done = Instant::now() + service;
                let ack: Self::Ack = Box::pin(async move {
                    tokio::time::sleep_until(done.into()).await;
                    Ok(Acked { at: done, steps: Some((done - service / 2, done - service / 4)) })
                });
                Ok((ack, 100))
            }
        }
    }

    async fn run(schedule: Schedule, start: Instant, stall: Duration) -> LoopResult {
        let counters = Arc::new(Counters::new(start));
        let cfg = LoopConfig {
            schedule,
            measure_from: start,
            stop_at: start + Duration::from_millis(1_000),
            msgs_max: 1_000,
            outstanding_max: 10_000,
            steps: true,
        };
        let sender = FakeSender { service: Duration::from_millis(1), stall_at: 200, stall };
        run_producer(sender, cfg, Clock::new(), counters, Arc::new(AtomicBool::new(false))).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_shows_a_stall_in_the_latency_of_the_messages_behind_it() {
        let start = Instant::now();
        let stall = Duration::from_millis(300);
        // 1,000 msgs/s: the 300 ms stall delays ~300 intended sends.
        let r = run(Schedule::OpenLoop { start, rate_per_s: 1_000.0 }, start, stall).await;
        assert_eq!(r.acked, r.sent);
        assert!(r.sent >= 900, "sent {}", r.sent);
        let s = r.publish.summary();
        assert!(s.max_us >= 300_000.0, "max {} us must include the stall", s.max_us);
        // About 30 % of the messages queued behind the stall: p50 is ordinary
        // but p90 is not.
        assert!(s.p50_us < 150_000.0, "p50 {}", s.p50_us);
        let p90 = s.curve.iter().find(|(p, _)| (*p - 90.0).abs() < 1e-9).unwrap().1;
        assert!(p90 >= 50_000.0, "p90 {p90} us must show the messages queued behind the stall");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_charges_a_stall_to_one_message_only_which_is_why_open_loop_exists() {
        let start = Instant::now();
        let r = run(Schedule::ClosedLoop, start, Duration::from_millis(300)).await;
        let s = r.publish.summary();
        assert_eq!(r.acked, 1_000);
        // The stalled send itself is charged, but nothing queued behind it.
        assert!(s.max_us >= 300_000.0, "closed loop max {} us", s.max_us);
        assert!(s.p99_us < 100_000.0, "closed loop p99 {} us", s.p99_us);
        assert!(s.p50_us >= 1_000.0, "service time is at least 1 ms: {}", s.p50_us);
    }

    #[test]
    fn open_loop_intended_times_are_evenly_spaced() {
        let start = Instant::now();
        let s = Schedule::OpenLoop { start, rate_per_s: 4.0 };
        assert_eq!(s.intended(0), Some(start));
        assert_eq!(s.intended(6), Some(start + Duration::from_millis(1_500)));
        assert!(Schedule::ClosedLoop.intended(7).is_none());
    }

    #[test]
    fn clock_maps_instants_to_monotonic_ns() {
        // The clock pairs an Instant with a CLOCK_MONOTONIC reading taken
        // just after it, so it may run ahead by the gap between the two (a
        // preemption there on a loaded machine): bound it by readings around.
        let lo = mono_ns();
        let c = Clock::new();
        let now = Instant::now();
        let a = c.ns(now);
        let hi = mono_ns();
        assert!(lo <= a && a <= hi + (hi - lo), "{lo} <= {a} <= {hi} + ({hi} - {lo})");
        assert_eq!(c.ns(now + Duration::from_millis(3)) - a, 3_000_000);
    }
}
