//! First come, first enqueued: the order in which appends enter the fill
//! buffer.
//!
//! An append may have to wait before it is enqueued (a segment roll, or
//! more than `UNWRITTEN_BYTES_MAX` not yet written). Without a queue, a
//! later append that arrives after the wait ended, or a smaller one that
//! still fits, was enqueued first: records of one producer landed out of
//! order. Each append takes a ticket when `Log::append` is called (not when
//! its future is first polled), and only the oldest ticket still waiting
//! may enqueue. A ticket whose append gives up (an error, or its future is
//! dropped) lets the next one through.

use super::Shared;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

/// Tickets in call order; see the module docs.
#[derive(Default)]
pub(super) struct Admission {
    next: Cell<u64>,
    /// The oldest ticket that has neither enqueued nor given up.
    head: Cell<u64>,
    /// Tickets after `head` that gave up before their turn.
    abandoned: RefCell<BTreeSet<u64>>,
}

impl Admission {
    pub(super) fn take(&self) -> u64 {
        let t = self.next.get();
        self.next.set(t + 1);
        t
    }

    pub(super) fn is_turn(&self, ticket: u64) -> bool {
        self.head.get() == ticket
    }

    /// `ticket` enqueued or gave up; returns whether the turn passed to a
    /// ticket that is waiting (its holder must then be woken).
    pub(super) fn release(&self, ticket: u64) -> bool {
        let head = self.head.get();
        debug_assert!(ticket >= head && ticket < self.next.get(), "a ticket is released once");
        if ticket != head {
            self.abandoned.borrow_mut().insert(ticket);
            return false;
        }
        let mut head = head + 1;
        let mut abandoned = self.abandoned.borrow_mut();
        while abandoned.remove(&head) {
            head += 1;
        }
        self.head.set(head);
        head < self.next.get()
    }

    /// Appends waiting for their turn (or enqueueing now).
    #[cfg(test)]
    pub(super) fn waiting(&self) -> u64 {
        self.next.get() - self.head.get() - self.abandoned.borrow().len() as u64
    }
}

/// An append's place in the admission order; giving it up (enqueued,
/// failed, or the append's future dropped) lets the next append go.
pub(super) struct Ticket<'a> {
    sh: &'a Shared,
    pub(super) number: u64,
}

impl<'a> Ticket<'a> {
    pub(super) fn take(sh: &'a Shared) -> Self {
        Ticket { sh, number: sh.admission.take() }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.sh.admission.release(self.number) {
            self.sh.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Admission;
    use proptest::prelude::*;

    #[test]
    fn tickets_pass_in_call_order() {
        let a = Admission::default();
        let (t0, t1, t2) = (a.take(), a.take(), a.take());
        assert!(a.is_turn(t0) && !a.is_turn(t1) && !a.is_turn(t2));
        assert!(a.release(t0), "t1 waits: wake it");
        assert!(a.is_turn(t1));
        assert_eq!(a.waiting(), 2);
        assert!(a.release(t1));
        assert!(!a.release(t2), "nobody left to wake");
        assert_eq!(a.waiting(), 0);
    }

    #[test]
    fn a_ticket_that_gives_up_early_is_skipped() {
        let a = Admission::default();
        let (t0, t1, t2) = (a.take(), a.take(), a.take());
        assert!(!a.release(t1), "not the head: nobody new may go");
        assert!(a.is_turn(t0));
        assert!(a.release(t0));
        assert!(a.is_turn(t2), "t1 gave up, so t2 is next");
        assert_eq!(a.waiting(), 1);
    }

    proptest! {
        /// Whatever the interleaving of arrivals, early give-ups and turns,
        /// the tickets that enqueue do so in increasing order, and every
        /// ticket still waiting eventually gets its turn.
        #[test]
        fn enqueue_order_is_call_order(ops in proptest::collection::vec(0u8..3, 1..200)) {
            let a = Admission::default();
            let mut waiting: Vec<u64> = Vec::new();
            let mut enqueued: Vec<u64> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    0 => waiting.push(a.take()),
                    // The holder whose turn it is enqueues.
                    1 => {
                        if let Some(pos) = waiting.iter().position(|t| a.is_turn(*t)) {
                            let t = waiting.remove(pos);
                            a.release(t);
                            enqueued.push(t);
                        }
                    }
                    // Some waiting ticket gives up (an error or a dropped future).
                    _ => {
                        if !waiting.is_empty() {
                            let t = waiting.remove(i % waiting.len());
                            a.release(t);
                        }
                    }
                }
                prop_assert_eq!(a.waiting(), waiting.len() as u64);
            }
            while let Some(pos) = waiting.iter().position(|t| a.is_turn(*t)) {
                let t = waiting.remove(pos);
                a.release(t);
                enqueued.push(t);
            }
            prop_assert!(waiting.is_empty(), "a waiting ticket never got its turn");
            prop_assert!(enqueued.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
