//! The shard's open-file budget: how many files the logs of one shard keep
//! open, with LRU closing of the least recently used handles.
//!
//! ```text
//!   RLIMIT_NOFILE ── reserve (sockets, pipes, rings, short-lived opens) ──┐
//!                                                                        v
//!   per-shard budget = (limit - reserve) / shards    (or --open-files-shard-max)
//!
//!   counted:  active segment write fd (O_DIRECT)   evictable when the log is idle
//!             active segment read fd               opened on the first read that
//!             sealed segment .log / .index readers misses the hot tail
//! ```
//!
//! Every long-lived handle a log opens holds a [`FileToken`] (the count goes
//! down when the fd is really closed, i.e. when the last reader holding it
//! lets go) and, while a log caches it, a place in the LRU. Before a log
//! opens a file, [`FileBudget::admit`] closes as many least recently used
//! handles as the budget is over. Read handles close at once (an in-flight
//! read keeps its own `Rc` until it finishes); an active segment's write fd
//! only when its log is idle (nothing unwritten, nothing unsynced that the
//! flush policy promises, no roll). Closed handles reopen transparently on
//! the next read or append. When the working set fits, nothing is ever
//! closed, so the hot path does no open/close.
//!
//! The budget is soft: it closes what it may, and opens anyway. The hard
//! stop is the process limit, where an open fails with EMFILE and the log
//! returns [`super::LogError::TooManyOpenFiles`] (client code
//! `ResourceLimit`). Everything is shard-local (`Rc`, `Cell`): no locks.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::{Rc, Weak};

/// File descriptors kept out of the log budgets, at least: client sockets,
/// listeners, io_uring rings, eventfds, pipes and short-lived opens.
pub const OPEN_FILES_RESERVE_MIN: usize = 1024;
/// The reserve is at least this fraction (1/n) of the process limit.
pub const OPEN_FILES_RESERVE_FRACTION: usize = 4;
/// Smallest per-shard budget (a log needs a few files to make progress).
pub const OPEN_FILES_SHARD_MIN: usize = 8;

/// Something a log caches open and can close on request.
pub(crate) trait Evict {
    /// Closes the cached handle if it is not in use; `false` if it must stay.
    fn evict(&self) -> bool;
    /// Where the handle's LRU tick is kept.
    fn tick(&self) -> &Cell<Option<u64>>;
}

/// The open-file budget of one shard's logs. See the module docs.
pub struct FileBudget {
    files_max: usize,
    open: Cell<usize>,
    clock: Cell<u64>,
    /// Cached handles by last use (tick), oldest first.
    lru: RefCell<BTreeMap<u64, Weak<dyn Evict>>>,
    evictions: Cell<u64>,
}

impl std::fmt::Debug for FileBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBudget")
            .field("files_max", &self.files_max)
            .field("open", &self.open.get())
            .field("evictions", &self.evictions.get())
            .finish_non_exhaustive()
    }
}

thread_local! {
    static THREAD_DEFAULT: Rc<FileBudget> = FileBudget::new(shard_files_max(process_files_limit(), 1));
}

/// The process's open-files limit (soft), or a conservative guess.
#[must_use]
pub fn process_files_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

/// The default per-shard budget for a process limit of `limit` files shared
/// by `shards` shards: what is left after the reserve, split evenly.
#[must_use]
pub fn shard_files_max(limit: usize, shards: usize) -> usize {
    let reserve = (limit / OPEN_FILES_RESERVE_FRACTION).max(OPEN_FILES_RESERVE_MIN);
    (limit.saturating_sub(reserve) / shards.max(1)).max(OPEN_FILES_SHARD_MIN)
}

impl FileBudget {
    /// A budget of `files_max` open files (at least [`OPEN_FILES_SHARD_MIN`]).
    #[must_use]
    pub fn new(files_max: usize) -> Rc<FileBudget> {
        Rc::new(FileBudget {
            files_max: files_max.max(OPEN_FILES_SHARD_MIN),
            open: Cell::new(0),
            clock: Cell::new(0),
            lru: RefCell::new(BTreeMap::new()),
            evictions: Cell::new(0),
        })
    }

    /// The budget shared by logs opened on this thread with
    /// [`super::Log::open`]: the whole process limit minus the reserve.
    #[must_use]
    pub fn thread_default() -> Rc<FileBudget> {
        THREAD_DEFAULT.with(Rc::clone)
    }

    #[must_use]
    pub fn files_max(&self) -> usize {
        self.files_max
    }

    /// Counted files open now (including handles an in-flight read still holds).
    #[must_use]
    pub fn open_files(&self) -> usize {
        self.open.get()
    }

    /// Handles closed to stay within the budget so far.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.evictions.get()
    }

    /// Makes room for one more file: closes least recently used handles
    /// while the budget is over. Must be called with no log state borrowed
    /// by the caller (a borrowed log's write file is skipped).
    pub(crate) fn admit(&self) {
        let mut excess = (self.open.get() + 1).saturating_sub(self.files_max);
        let mut busy = Vec::new();
        while excess > 0 {
            let Some((_, weak)) = self.lru.borrow_mut().pop_first() else { break };
            let Some(who) = weak.upgrade() else { continue };
            who.tick().set(None);
            if who.evict() {
                self.evictions.set(self.evictions.get() + 1);
                excess -= 1;
            } else {
                busy.push((who, weak));
            }
        }
        // Handles in use go back as most recently used.
        for (who, weak) in busy {
            self.touch(who.tick(), weak);
        }
    }

    /// Counts one open file until the token drops.
    pub(crate) fn token(self: &Rc<Self>) -> FileToken {
        self.open.set(self.open.get() + 1);
        FileToken { budget: self.clone() }
    }

    fn tick(&self) -> u64 {
        let t = self.clock.get() + 1;
        self.clock.set(t);
        t
    }

    /// Marks a cached handle as just used; `at` holds its current tick.
    pub(crate) fn touch(&self, at: &Cell<Option<u64>>, who: Weak<dyn Evict>) {
        let tick = self.tick();
        let mut lru = self.lru.borrow_mut();
        if let Some(old) = at.replace(Some(tick)) {
            lru.remove(&old);
        }
        lru.insert(tick, who);
    }

    /// Drops a handle from the LRU (it was closed or its owner is gone).
    pub(crate) fn forget(&self, at: &Cell<Option<u64>>) {
        if let Some(old) = at.take() {
            self.lru.borrow_mut().remove(&old);
        }
    }
}

/// One open file counted against a [`FileBudget`]; uncounts on drop.
pub(crate) struct FileToken {
    budget: Rc<FileBudget>,
}

impl std::fmt::Debug for FileToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileToken")
    }
}

impl Drop for FileToken {
    fn drop(&mut self) {
        self.budget.open.set(self.budget.open.get() - 1);
    }
}

/// A lazily opened, evictable read handle cached by a log (a segment's
/// `.log` or `.index`). Shared as `Rc` so the budget can close it without
/// borrowing the log's state.
pub(crate) struct ReaderSlot<F> {
    budget: Rc<FileBudget>,
    file: RefCell<Option<Rc<F>>>,
    tick: Cell<Option<u64>>,
    /// While set, the cached handle is neither evicted nor cleared: its file
    /// is not (yet) at the segment's path, so it could not be reopened
    /// (compaction's swap window, `log::compact`).
    pinned: Cell<bool>,
}

impl<F: 'static> ReaderSlot<F> {
    pub(crate) fn new(budget: &Rc<FileBudget>) -> Rc<ReaderSlot<F>> {
        Rc::new(ReaderSlot {
            budget: budget.clone(),
            file: RefCell::new(None),
            tick: Cell::new(None),
            pinned: Cell::new(false),
        })
    }

    /// A slot holding `f`, pinned (see [`ReaderSlot::unpin`]).
    pub(crate) fn pinned(budget: &Rc<FileBudget>, f: Rc<F>) -> Rc<ReaderSlot<F>> {
        let slot = Self::new(budget);
        slot.put(f);
        slot.pinned.set(true);
        slot
    }

    /// The handle's file is at its path now: it may be closed and reopened.
    pub(crate) fn unpin(&self) {
        self.pinned.set(false);
    }

    /// The cached handle (marked as used), if open.
    pub(crate) fn get(self: &Rc<Self>) -> Option<Rc<F>> {
        let f = self.file.borrow().clone()?;
        self.budget.touch(&self.tick, Rc::downgrade(self) as Weak<dyn Evict>);
        Some(f)
    }

    /// Caches `f` unless another task cached one meanwhile; returns the one cached.
    pub(crate) fn put(self: &Rc<Self>, f: Rc<F>) -> Rc<F> {
        let kept = self.file.borrow_mut().get_or_insert(f).clone();
        self.budget.touch(&self.tick, Rc::downgrade(self) as Weak<dyn Evict>);
        kept
    }

    /// Closes the cached handle (in-flight users keep theirs).
    pub(crate) fn clear(&self) {
        if self.pinned.get() {
            return;
        }
        self.budget.forget(&self.tick);
        self.file.borrow_mut().take();
    }

    pub(crate) fn is_open(&self) -> bool {
        self.file.borrow().is_some()
    }
}

impl<F> Evict for ReaderSlot<F> {
    fn evict(&self) -> bool {
        if self.pinned.get() {
            return false;
        }
        self.file.borrow_mut().take();
        true
    }

    fn tick(&self) -> &Cell<Option<u64>> {
        &self.tick
    }
}

impl<F> Drop for ReaderSlot<F> {
    fn drop(&mut self) {
        self.budget.forget(&self.tick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_budget_leaves_a_reserve() {
        assert_eq!(shard_files_max(20_000, 2), 7_500);
        assert_eq!(shard_files_max(1024, 2), OPEN_FILES_SHARD_MIN);
        assert_eq!(shard_files_max(4096, 1), 3072);
    }

    #[test]
    fn least_recently_used_handles_close_first() {
        let budget = FileBudget::new(OPEN_FILES_SHARD_MIN);
        let mut slots = Vec::new();
        let mut tokens = Vec::new();
        for _ in 0..OPEN_FILES_SHARD_MIN {
            let s = ReaderSlot::<u32>::new(&budget);
            budget.admit();
            tokens.push(budget.token());
            s.put(Rc::new(1));
            slots.push(s);
        }
        assert_eq!(budget.open_files(), OPEN_FILES_SHARD_MIN);
        assert!(slots[0].get().is_some()); // slot 0 is now the most recent
        budget.admit();
        assert!(slots[0].is_open());
        assert!(!slots[1].is_open(), "the least recently used handle closed");
        assert_eq!(budget.evictions(), 1);
        drop(tokens.pop());
        assert_eq!(budget.open_files(), OPEN_FILES_SHARD_MIN - 1);
    }
}
