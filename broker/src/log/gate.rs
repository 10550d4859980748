//! The shard's gate on small segment writes: group commit across
//! partitions.
//!
//! Each log writes its own files, so a shard with many partitions that each
//! get a record or two per produce request would issue an O_DIRECT write per
//! partition and request: at 1,000 partitions and 100 k records/s of 1 KB,
//! 71 k io_uring requests and 41 k device requests a second, about 2.4
//! records per device write, with the shard thread spending 39 % of its
//! time submitting them (perf, 2026-12-07). A write of less than a whole
//! chunk therefore needs a place at the shard's gate: at most
//! [`SMALL_WRITES_IN_FLIGHT_DEFAULT`] of them are in flight per shard. A log
//! that finds the gate full joins its queue (once) and its appends go on
//! filling its buffer; when a small write completes, the next log in the
//! queue is let through and writes everything it gathered meanwhile in one
//! write. While the device keeps up the gate is never full and nothing
//! waits; under load, writes grow instead of multiplying.
//!
//! Only a write that goes straight to the device takes a place: one that
//! must first open its file (the shard's file budget closed it) or
//! preallocate would hold its place through that too. Whole-chunk writes do
//! not need a place: they are as large as writes get.
//!
//! Where there is nothing to gather the wait is pure latency: at 10,000
//! partitions a partition gets an append every few hundred milliseconds,
//! queued logs waited 0.5-0.7 s on average, and publish fell to about half
//! of ungated. So a sparse log, one whose appends come [`SPARSE_GAP`] or
//! more apart on average ([`AppendPace`]), goes past a full gate: it takes
//! a place beyond the limit (counted, so the dense logs behind it wait
//! until places are back under the limit). A large
//! `small_writes_in_flight_shard` turns the gate off.
//!
//! Invariants:
//! - `in_flight` counts the small writes issued with a place and not yet
//!   completed (at most `limit` plus those of sparse logs); each
//!   completion gives its place back exactly once (dropping its [`Place`]),
//!   whatever became of the write (done, failed, rolled back, its task
//!   dropped).
//! - A log with unwritten data is always woken later: either its own write is
//!   in flight (its completion kicks it), or it is in the queue (a
//!   completion lets it through), or it holds a place.
//! - The queue is served in arrival order, so no log starves.

use super::Shared;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// Small writes in flight per shard. At 1,000 partitions 8 and 16 did best
/// of 1-64 (2 did two thirds as well, 64 left consumers behind again); see
/// `perf-reports/`.
pub const SMALL_WRITES_IN_FLIGHT_DEFAULT: usize = 8;

/// A place at the gate, given back when dropped: by the write task once its
/// write completed (which then lets queued logs through), or with the task
/// when its executor ends first (so a gate shared by the executors one
/// thread runs in turn, `WriteGate::thread_default`, never loses places).
pub(super) struct Place(Rc<WriteGate>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct WriteGate {
    limit: usize,
    in_flight: Cell<usize>,
    queue: RefCell<VecDeque<Weak<Shared>>>,
    /// Times a log found the gate full (for `/metrics`).
    waits: Cell<u64>,
    /// Their time in the queue, summed (for `/metrics`).
    waited: Cell<Duration>,
    /// Small writes of sparse logs that went past a full gate (for `/metrics`).
    passes: Cell<u64>,
}

thread_local! {
    static THREAD_DEFAULT: Rc<WriteGate> = Rc::new(WriteGate::new(SMALL_WRITES_IN_FLIGHT_DEFAULT));
}

impl WriteGate {
    /// A gate letting `limit` small writes through at once (at least one).
    #[must_use]
    pub fn new(limit: usize) -> WriteGate {
        WriteGate {
            limit: limit.max(1),
            in_flight: Cell::new(0),
            queue: RefCell::default(),
            waits: Cell::new(0),
            waited: Cell::new(Duration::ZERO),
            passes: Cell::new(0),
        }
    }

    /// The gate shared by logs opened on this thread with default options.
    #[must_use]
    pub fn thread_default() -> Rc<WriteGate> {
        THREAD_DEFAULT.with(Rc::clone)
    }

    /// Times a log found the gate full and queued.
    #[must_use]
    pub fn waits(&self) -> u64 {
        self.waits.get()
    }

    /// Time logs spent queued at the gate, summed.
    #[must_use]
    pub fn waited(&self) -> Duration {
        self.waited.get()
    }

    /// Small writes of sparse logs that went past a full gate.
    #[must_use]
    pub fn passes(&self) -> u64 {
        self.passes.get()
    }

    /// Takes a place for a small write; `None` when the gate is full and
    /// the log is not sparse (`pace`).
    pub(super) fn try_take(self: &Rc<Self>, pace: &AppendPace) -> Option<Place> {
        let n = self.in_flight.get();
        if n >= self.limit {
            if !pace.sparse() {
                return None;
            }
            self.passes.set(self.passes.get() + 1);
        }
        self.in_flight.set(n + 1);
        Some(Place(self.clone()))
    }

    /// Queues `sh` for the next free place (the caller marks it queued, so
    /// that it is queued once).
    pub(super) fn wait(&self, sh: &Rc<Shared>) {
        self.waits.set(self.waits.get() + 1);
        self.queue.borrow_mut().push_back(Rc::downgrade(sh));
    }

    fn release(&self) {
        self.in_flight.set(self.in_flight.get().checked_sub(1).expect("a place was taken"));
    }

    /// Pops live queued logs, up to the free places.
    pub(super) fn next_waiters(&self) -> Vec<Rc<Shared>> {
        let free = self.limit.saturating_sub(self.in_flight.get());
        let mut queue = self.queue.borrow_mut();
        let mut out = Vec::new();
        while out.len() < free {
            let Some(next) = queue.pop_front() else { break };
            // A log dropped while queued is gone.
            if let Some(sh) = next.upgrade() {
                out.push(sh);
            }
        }
        out
    }
}

/// The shard's gate had no place for a small write (`gate`).
pub(super) struct GateFull;

/// Lets queued logs through the shard's gate while it has free places. A
/// log let through takes a place, needs no write (its own write in flight
/// kicks it later) or finds the gate full and queues again behind the
/// others. Each round takes places or shortens the queue, so the loop ends;
/// it stops early when every log of a round queued again: the gate is full,
/// and the next completion lets them through.
pub(super) fn let_through(gate: &WriteGate) {
    loop {
        let next = gate.next_waiters();
        if next.is_empty() {
            return;
        }
        let mut queued_again = 0;
        let round = next.len();
        let now = Instant::now();
        for sh in next {
            if let Some(at) = sh.st.borrow_mut().gate_queued_at.take() {
                gate.waited.set(gate.waited.get() + now.saturating_duration_since(at));
            }
            super::write::kick_write(&sh);
            queued_again += usize::from(sh.st.borrow().gate_queued_at.is_some());
        }
        if queued_again == round {
            return;
        }
    }
}

/// How far apart a log's appends come: an exponential moving average
/// (weight 1/8) of the gaps between them, each counted at most
/// [`AppendPace::GAP_CAP`].
///
/// A log whose appends come [`SPARSE_GAP`] or more apart goes past a full
/// gate: waiting would gather another append only after that long, a
/// latency the gate is not worth. At 10,000 partitions (an append per
/// partition every few hundred milliseconds) queued logs waited 0.5-0.7 s
/// on average and publish fell to about half; at 1,000 partitions appends
/// come about 7 ms apart and every log waits as before.
#[derive(Debug, Clone, Copy)]
pub(super) struct AppendPace {
    last: Option<Instant>,
    gap: Duration,
}

/// See [`AppendPace`].
pub(super) const SPARSE_GAP: Duration = Duration::from_millis(100);

impl AppendPace {
    /// Gaps longer than this count as this long, so a log busy again after
    /// an idle hour counts as dense again after about 20 appends.
    const GAP_CAP: Duration = Duration::from_secs(1);

    /// A log with no appends yet counts as dense: it waits like the others
    /// until its pace is known.
    pub(super) fn new() -> AppendPace {
        AppendPace { last: None, gap: Duration::ZERO }
    }

    /// Notes an append at `now`.
    pub(super) fn note(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last).min(Self::GAP_CAP);
            self.gap = (self.gap * 7 + gap) / 8;
        }
        self.last = Some(now);
    }

    /// Whether its appends come too far apart to gather any while waiting.
    pub(super) fn sparse(&self) -> bool {
        self.gap >= SPARSE_GAP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(gaps_ms: &[u64]) -> AppendPace {
        let mut p = AppendPace::new();
        let mut at = Instant::now();
        p.note(at);
        for g in gaps_ms {
            at += Duration::from_millis(*g);
            p.note(at);
        }
        p
    }

    #[test]
    fn pace_follows_the_gaps_between_appends() {
        assert!(!AppendPace::new().sparse(), "unknown pace counts as dense");
        assert!(!pace(&[]).sparse(), "one append tells nothing");
        assert!(!pace(&[7; 50]).sparse(), "7 ms apart is dense");
        // Two producers: appends in pairs, a pair every 500 ms.
        let pairs: Vec<u64> = (0..40).map(|i| if i % 2 == 0 { 1 } else { 500 }).collect();
        assert!(pace(&pairs).sparse(), "a pair every 500 ms is sparse");
        // An idle hour, then busy: dense again within a few dozen appends.
        let mut woken = vec![3_600_000];
        woken.extend([5; 30]);
        assert!(!pace(&woken).sparse(), "busy again after an idle hour");
        assert!(pace(&[3_600_000, 5]).sparse(), "just woken");
    }

    #[test]
    fn only_sparse_logs_go_past_a_full_gate_and_each_place_comes_back() {
        let gate = Rc::new(WriteGate::new(1));
        let (dense, sparse) = (pace(&[7; 50]), pace(&[500; 10]));
        let first = gate.try_take(&dense).expect("a free place");
        assert!(gate.try_take(&dense).is_none(), "full for a dense log");
        let passed = gate.try_take(&sparse).expect("a sparse log goes past");
        assert_eq!((gate.in_flight.get(), gate.passes()), (2, 1));
        drop(first);
        assert!(gate.try_take(&dense).is_none(), "the pass still holds a place");
        drop(passed);
        assert_eq!(gate.in_flight.get(), 0);
        assert!(gate.try_take(&dense).is_some());
    }
}
