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
//! The cost is latency, and with closed-loop producers throughput. A pass
//! for sparse partitions (appends 100 ms or more apart went past a full
//! gate: 98 % of small writes did at 10,000 partitions, close to ungated)
//! was tried and reverted: producers pushed 2.6x more, but their one-append
//! writes (6.6x as many) starved the consumers (1.5-5 MB/s, e2e p99 70 s,
//! against 20.8 of 20.9 MB/s and 2.3 s with the gate; full-length runs in
//! `perf-reports/`). A large `small_writes_in_flight_shard` turns the gate
//! off.
//!
//! Invariants:
//! - `in_flight` counts the gated writes issued and not yet completed, at
//!   most `limit`; each
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

    /// Takes a place for a small write; `None` when the gate is full.
    pub(super) fn try_take(self: &Rc<Self>) -> Option<Place> {
        let n = self.in_flight.get();
        if n >= self.limit {
            return None;
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
        for sh in next {
            sh.st.borrow_mut().gate_queued = false;
            super::write::kick_write(&sh);
            queued_again += usize::from(sh.st.borrow().gate_queued);
        }
        if queued_again == round {
            return;
        }
    }
}
