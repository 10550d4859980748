//! Single-threaded wake-ups: an event that many tasks can wait for, and a
//! one-shot result slot for one append. No atomics, no locks: everything
//! lives on one shard.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A broadcast "something changed" event. Waiters re-check their condition.
#[derive(Default)]
pub(crate) struct Notify {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Notify {
    /// A future that completes at the next `notify_all` after this call.
    /// Take it *before* dropping the state borrow the condition was checked
    /// under, then await it.
    pub(crate) fn listen(&self) -> Listen<'_> {
        Listen { notify: self, generation: self.generation.get() }
    }

    pub(crate) fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }
}

pub(crate) struct Listen<'a> {
    notify: &'a Notify,
    generation: u64,
}

impl Future for Listen<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let mut wakers = self.notify.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// The outcome of one append (or flush request), filled in by the write or
/// sync task, awaited by the caller.
pub(crate) struct Slot<T> {
    result: RefCell<Option<T>>,
    waker: RefCell<Option<Waker>>,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Self {
        Slot { result: RefCell::new(None), waker: RefCell::new(None) }
    }

    pub(crate) fn resolve(&self, value: T) {
        let previous = self.result.borrow_mut().replace(value);
        assert!(previous.is_none(), "a slot is resolved once");
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub(crate) fn wait(&self) -> SlotWait<'_, T> {
        SlotWait { slot: self }
    }
}

pub(crate) struct SlotWait<'a, T> {
    slot: &'a Slot<T>,
}

impl<T> Future for SlotWait<'_, T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if let Some(v) = self.slot.result.borrow_mut().take() {
            return Poll::Ready(v);
        }
        *self.slot.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}
