//! The hot tail: the most recently written bytes of each log's active
//! segment, kept in memory so that consumers at or near the end of the log
//! are served without touching the disk (not even the page cache).
//!
//! ```text
//!   active segment:  0 ........ window.start ............. window.end (= written_pos)
//!                               [piece][piece][piece] ... [piece]
//!                               each piece: Bytes copied from one completed write
//! ```
//!
//! Every piece starts and ends on a batch boundary (a write completes whole
//! batches only), so `window.start` is always a batch boundary and a read can
//! scan batch headers from it. Memory is bounded twice: per log by
//! `LogOptions::hot_tail_log_bytes_max` (oldest pieces are dropped first) and
//! per shard by one [`HotTailBudget`] shared by every log of the shard, which
//! evicts the oldest pieces of the least recently used log when it is over
//! budget. Everything is shard-local (`Rc`, `Cell`, `RefCell`): no locks.
//! Bytes already handed to a reader stay alive until the reader drops them;
//! the budget counts what the windows hold.

use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::{Rc, Weak};

/// Default shard budget of [`HotTailBudget::thread_default`].
pub const HOT_TAIL_SHARD_BYTES_DEFAULT: u64 = 128 << 20;
/// Default per-log cap of the hot tail window.
pub const HOT_TAIL_LOG_BYTES_DEFAULT: u64 = 8 << 20;
/// A read that spans more pieces than this is copied into one `Bytes`
/// instead of being returned as many small chunks.
const READ_PIECES_MAX: usize = 16;

/// Per-shard memory budget of the hot tail windows of all logs of a shard,
/// with LRU eviction across logs. Create one per shard (`Rc` it) and pass it
/// to every [`super::Log::open_with`] of that shard.
pub struct HotTailBudget {
    bytes_max: u64,
    used: Cell<u64>,
    evicted: Cell<u64>,
    clock: Cell<u64>,
    next_id: Cell<u64>,
    /// Non-empty windows by last use (tick -> window id), oldest first.
    lru: RefCell<BTreeMap<u64, u64>>,
    members: RefCell<HashMap<u64, Member>>,
}

struct Member {
    tick: Option<u64>,
    window: Weak<RefCell<HotWindow>>,
}

thread_local! {
    static THREAD_DEFAULT: Rc<HotTailBudget> = HotTailBudget::new(HOT_TAIL_SHARD_BYTES_DEFAULT);
}

impl std::fmt::Debug for HotTailBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotTailBudget")
            .field("bytes_max", &self.bytes_max)
            .field("used", &self.used.get())
            .field("evicted", &self.evicted.get())
            .finish_non_exhaustive()
    }
}

impl HotTailBudget {
    /// A budget of `bytes_max` bytes (0 disables the hot tail).
    #[must_use]
    pub fn new(bytes_max: u64) -> Rc<HotTailBudget> {
        Rc::new(HotTailBudget {
            bytes_max,
            used: Cell::new(0),
            evicted: Cell::new(0),
            clock: Cell::new(0),
            next_id: Cell::new(0),
            lru: RefCell::new(BTreeMap::new()),
            members: RefCell::new(HashMap::new()),
        })
    }

    /// The budget shared by every log opened on this thread (shard) with
    /// [`super::Log::open`]: [`HOT_TAIL_SHARD_BYTES_DEFAULT`] bytes.
    #[must_use]
    pub fn thread_default() -> Rc<HotTailBudget> {
        THREAD_DEFAULT.with(Rc::clone)
    }

    #[must_use]
    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }

    /// Bytes held by the windows now.
    #[must_use]
    pub fn used_bytes(&self) -> u64 {
        self.used.get()
    }

    /// Bytes dropped by shard-budget eviction so far.
    #[must_use]
    pub fn evicted_bytes(&self) -> u64 {
        self.evicted.get()
    }

    fn register(&self, window: Weak<RefCell<HotWindow>>, id: u64) {
        self.members.borrow_mut().insert(id, Member { tick: None, window });
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// Marks window `id` as just used (`nonempty`) or drops it from the LRU.
    fn touch(&self, id: u64, nonempty: bool) {
        let mut members = self.members.borrow_mut();
        let Some(m) = members.get_mut(&id) else { return };
        let mut lru = self.lru.borrow_mut();
        if let Some(t) = m.tick.take() {
            lru.remove(&t);
        }
        if nonempty {
            let t = self.clock.get() + 1;
            self.clock.set(t);
            lru.insert(t, id);
            m.tick = Some(t);
        }
    }

    fn unregister(&self, id: u64) {
        if let Some(m) = self.members.borrow_mut().remove(&id) {
            if let Some(t) = m.tick {
                self.lru.borrow_mut().remove(&t);
            }
        }
    }

    /// Evicts the oldest pieces of the least recently used windows until the
    /// budget holds. Must be called with no window borrowed (a borrowed
    /// window is skipped).
    pub(super) fn enforce(&self) {
        let mut skipped = Vec::new();
        while self.used.get() > self.bytes_max {
            let next = {
                let lru = self.lru.borrow();
                lru.iter().find(|(t, _)| !skipped.contains(*t)).map(|(t, id)| (*t, *id))
            };
            let Some((tick, id)) = next else { break };
            let window = self.members.borrow().get(&id).and_then(|m| m.window.upgrade());
            let Some(window) = window else {
                self.lru.borrow_mut().remove(&tick);
                continue;
            };
            let Ok(mut w) = window.try_borrow_mut() else {
                skipped.push(tick);
                continue;
            };
            while self.used.get() > self.bytes_max && w.drop_front(true) {}
            if w.pieces.is_empty() {
                drop(w);
                self.touch(id, false);
            }
        }
    }
}

/// One log's window over the end of its active segment. See the module docs.
pub(crate) struct HotWindow {
    budget: Rc<HotTailBudget>,
    id: u64,
    cap: u64,
    /// Base offset of the active segment the positions refer to.
    pub(crate) segment: u64,
    /// Position of the first byte held (a batch boundary).
    pub(crate) start: u64,
    /// Position after the last byte held.
    pub(crate) end: u64,
    pieces: VecDeque<(u64, Bytes)>,
}

impl HotWindow {
    pub(crate) fn new(budget: Rc<HotTailBudget>, cap: u64, segment: u64, at: u64) -> Rc<RefCell<HotWindow>> {
        let id = budget.next_id();
        let w = Rc::new(RefCell::new(HotWindow {
            budget: budget.clone(),
            id,
            cap: if budget.bytes_max == 0 { 0 } else { cap },
            segment,
            start: at,
            end: at,
            pieces: VecDeque::new(),
        }));
        budget.register(Rc::downgrade(&w), id);
        w
    }

    pub(crate) fn enabled(&self) -> bool {
        self.cap > 0
    }

    #[must_use]
    pub(crate) fn budget(&self) -> &Rc<HotTailBudget> {
        &self.budget
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        self.end - self.start
    }

    /// Forgets everything and starts empty at `(segment, at)` (roll, truncate).
    pub(crate) fn reset(&mut self, segment: u64, at: u64) {
        while self.drop_front(false) {}
        self.segment = segment;
        self.start = at;
        self.end = at;
        self.budget.touch(self.id, false);
    }

    /// Adds `bytes`, written at `pos` of `segment` and ending on a batch
    /// boundary. Bytes that do not follow on from the window restart it at
    /// `pos` (which the caller guarantees is a batch boundary). Call
    /// [`HotTailBudget::enforce`] after the borrow ends.
    pub(crate) fn push(&mut self, segment: u64, pos: u64, bytes: &[u8]) {
        self.push_parts(segment, pos, [bytes, &[]]);
    }

    /// [`Self::push`] of the concatenation of `parts` (a write's bytes may
    /// lie in two buffers), copied once.
    pub(crate) fn push_parts(&mut self, segment: u64, pos: u64, parts: [&[u8]; 2]) {
        let len = (parts[0].len() + parts[1].len()) as u64;
        if !self.enabled() || len == 0 {
            return;
        }
        if segment != self.segment || pos != self.end {
            self.reset(segment, pos);
        }
        if len > self.cap {
            // Larger than the window: keep none of it rather than a piece
            // that does not start on a batch boundary.
            self.reset(segment, pos + len);
            return;
        }
        while self.held_bytes() + len > self.cap && self.drop_front(false) {}
        let mut piece = bytes::BytesMut::with_capacity(len as usize);
        piece.extend_from_slice(parts[0]);
        piece.extend_from_slice(parts[1]);
        self.pieces.push_back((pos, piece.freeze()));
        self.end = pos + len;
        self.budget.used.set(self.budget.used.get() + len);
        self.budget.touch(self.id, true);
    }

    /// Drops the oldest piece; false when empty.
    fn drop_front(&mut self, evicted: bool) -> bool {
        let Some((_, b)) = self.pieces.pop_front() else { return false };
        let len = b.len() as u64;
        self.start += len;
        self.budget.used.set(self.budget.used.get() - len);
        if evicted {
            self.budget.evicted.set(self.budget.evicted.get() + len);
        }
        true
    }

    /// Whether `[from, to)` of `segment` is held.
    pub(crate) fn covers(&self, segment: u64, from: u64, to: u64) -> bool {
        self.segment == segment
            && !self.pieces.is_empty()
            && self.start <= from
            && to <= self.end
            && from <= to
    }

    /// Index of the piece holding position `pos` (`start <= pos < end`).
    fn piece_at(&self, pos: u64) -> usize {
        self.pieces.partition_point(|(p, _)| *p <= pos) - 1
    }

    /// Copies `out.len()` bytes at `pos` (the range must be held).
    pub(crate) fn copy_to(&self, pos: u64, out: &mut [u8]) {
        assert!(pos >= self.start && pos + out.len() as u64 <= self.end, "copy inside the window");
        let mut i = self.piece_at(pos);
        let mut at = pos;
        let mut done = 0;
        while done < out.len() {
            let (p, b) = &self.pieces[i];
            let off = (at - p) as usize;
            let n = (b.len() - off).min(out.len() - done);
            out[done..done + n].copy_from_slice(&b[off..off + n]);
            done += n;
            at += n as u64;
            i += 1;
        }
    }

    /// `[from, to)` as shared slices of the pieces (no copy), or one copy
    /// when it spans many pieces. Marks the window as used.
    pub(crate) fn slices(&self, from: u64, to: u64) -> Vec<Bytes> {
        assert!(self.covers(self.segment, from, to), "slices inside the window");
        self.budget.touch(self.id, true);
        if from == to {
            return Vec::new();
        }
        let first = self.piece_at(from);
        let last = self.piece_at(to - 1);
        if last - first + 1 > READ_PIECES_MAX {
            let mut v = vec![0u8; (to - from) as usize];
            self.copy_to(from, &mut v);
            return vec![Bytes::from(v)];
        }
        (first..=last)
            .map(|i| {
                let (p, b) = &self.pieces[i];
                let a = from.saturating_sub(*p) as usize;
                let e = ((to - p) as usize).min(b.len());
                b.slice(a..e)
            })
            .collect()
    }
}

impl Drop for HotWindow {
    fn drop(&mut self) {
        while self.drop_front(false) {}
        self.budget.unregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_cap_and_slices() {
        let budget = HotTailBudget::new(1 << 20);
        let w = HotWindow::new(budget.clone(), 100, 0, 0);
        let mut ww = w.borrow_mut();
        ww.push(0, 0, &[1; 40]);
        ww.push(0, 40, &[2; 40]);
        assert_eq!((ww.start, ww.end), (0, 80));
        ww.push(0, 80, &[3; 40]); // over the cap: the first piece goes
        assert_eq!((ww.start, ww.end), (40, 120));
        assert_eq!(budget.used_bytes(), 80);
        let s = ww.slices(50, 90);
        assert_eq!(s.len(), 2);
        assert_eq!(&s[0][..], &[2u8; 30][..]);
        assert_eq!(&s[1][..], &[3u8; 10][..]);
        assert!(!ww.covers(0, 39, 50));
        ww.push(0, 500, &[4; 10]); // a gap restarts the window
        assert_eq!((ww.start, ww.end), (500, 510));
        assert_eq!(budget.used_bytes(), 10);
        drop(ww);
        drop(w);
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn budget_evicts_least_recently_used() {
        let budget = HotTailBudget::new(100);
        let a = HotWindow::new(budget.clone(), 100, 0, 0);
        let b = HotWindow::new(budget.clone(), 100, 0, 0);
        a.borrow_mut().push(0, 0, &[1; 60]);
        b.borrow_mut().push(0, 0, &[2; 30]);
        budget.enforce();
        assert_eq!(budget.used_bytes(), 90);
        let _ = a.borrow().slices(0, 10); // a is now the most recently used
        b.borrow_mut().push(0, 30, &[2; 30]);
        budget.enforce();
        // b was pushed last, so a (touched before) is evicted first.
        assert!(budget.used_bytes() <= 100);
        assert!(a.borrow().pieces.is_empty());
        assert_eq!(b.borrow().held_bytes(), 60);
        assert_eq!(budget.evicted_bytes(), 60);
    }
}
