//! The wall clock in milliseconds, cheaply: the create time of every record
//! that does not bring one.
//!
//! `SystemTime::now()` costs about 32 ns on this project's machines (a VM:
//! the vDSO reads the TSC and scales it), an eighth of the producer's whole
//! per-record cost. A record's timestamp has millisecond resolution, so the
//! clock only has to be read again when a millisecond may have passed. Each
//! thread keeps an *anchor*: the last precise reading and the TSC value just
//! before it, with the TSC value by which the next millisecond boundary
//! cannot yet have been reached. Until the TSC gets there, the anchor's
//! millisecond is the answer: the same one `SystemTime` would give.
//!
//! The TSC's rate is measured against the monotonic clock over at least
//! [`CALIBRATION`] (until then every call reads the clock), and the deadline
//! is computed with a rate [`MARGIN_PERCENT`] lower than measured, so an
//! error in the measure makes a deadline early, never late. The fast path is
//! used only on x86-64 and only when the kernel itself trusts the TSC
//! (its clocksource is `tsc`, which it chooses only when the TSCs of all
//! cores are synchronized and constant-rate). A clock step (NTP, an admin)
//! shows at the next boundary, within a millisecond.

use std::time::{SystemTime, UNIX_EPOCH};

/// Shortest interval over which the TSC rate is measured.
#[cfg(target_arch = "x86_64")]
const CALIBRATION: std::time::Duration = std::time::Duration::from_millis(100);
/// How much lower than measured the rate used for deadlines is.
#[cfg(target_arch = "x86_64")]
const MARGIN_PERCENT: u64 = 2;

fn precise_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Milliseconds since the Unix epoch, as `SystemTime::now()` would give them.
#[must_use]
pub fn now_ms() -> i64 {
    #[cfg(target_arch = "x86_64")]
    {
        tsc::now_ms()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (precise_ns() / 1_000_000) as i64
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use super::{precise_ns, CALIBRATION, MARGIN_PERCENT};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    /// TSC ticks per millisecond, less the margin; 0 while not measured.
    static TICKS_PER_MS: AtomicU64 = AtomicU64::new(0);
    /// Where the measure started: (TSC, instant, TSC), the instant read
    /// between the two.
    static CALIBRATION_START: Mutex<Option<(u64, Instant, u64)>> = Mutex::new(None);
    static TSC_TRUSTED: OnceLock<bool> = OnceLock::new();

    #[derive(Clone, Copy)]
    struct Anchor {
        ms: i64,
        /// The anchor's millisecond holds while the TSC is below this.
        until: u64,
    }

    thread_local! {
        static ANCHOR: Cell<Anchor> = const { Cell::new(Anchor { ms: 0, until: 0 }) };
    }

    fn rdtsc() -> u64 {
        // SAFETY: RDTSC has no preconditions; it only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    pub(super) fn trusted() -> bool {
        *TSC_TRUSTED.get_or_init(|| {
            std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc")
        })
    }

    /// The rate deadlines use (0: not measured, or the TSC is not trusted).
    #[cfg(test)]
    pub(super) fn ticks_per_ms() -> u64 {
        TICKS_PER_MS.load(Ordering::Relaxed)
    }

    pub(super) fn now_ms() -> i64 {
        let now = rdtsc();
        let anchor = ANCHOR.with(Cell::get);
        if now < anchor.until {
            return anchor.ms;
        }
        reanchor(now)
    }

    #[cold]
    fn reanchor(tsc: u64) -> i64 {
        // The TSC is read before the clock, so the deadline counts from a
        // moment no later than the reading.
        let ns = precise_ns();
        let ms = (ns / 1_000_000) as i64;
        let ticks_per_ms = match TICKS_PER_MS.load(Ordering::Relaxed) {
            0 => calibrate(),
            t => t,
        };
        if ticks_per_ms > 0 {
            let to_boundary_ns = (1_000_000 - ns % 1_000_000) as u64;
            let until = tsc.saturating_add(to_boundary_ns * ticks_per_ms / 1_000_000);
            ANCHOR.with(|a| a.set(Anchor { ms, until }));
        }
        ms
    }

    /// Measures the TSC rate once [`CALIBRATION`] has passed since the first
    /// call; returns it (less the margin), or 0 while it is not known.
    fn calibrate() -> u64 {
        if !trusted() {
            return 0;
        }
        let sample = || {
            let before = rdtsc();
            let at = Instant::now();
            (before, at, rdtsc())
        };
        // Another thread measuring now: this call reads the clock.
        let mut start = match CALIBRATION_START.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let Some((b0, t0, a0)) = *start else {
            *start = Some(sample());
            return 0;
        };
        let (b1, t1, a1) = sample();
        let elapsed_ns = t1.duration_since(t0).as_nanos() as u64;
        if elapsed_ns < CALIBRATION.as_nanos() as u64 || b1 <= a0 {
            return 0;
        }
        let ticks = b1 - a0;
        // A sample whose two TSC reads are far apart was interrupted: its
        // instant is not pinned to its TSC. Start over.
        if (a0 - b0).max(a1 - b1) > ticks / 10_000 {
            *start = Some((b1, t1, a1));
            return 0;
        }
        let per_ms = u128::from(ticks) * 1_000_000 / u128::from(elapsed_ns);
        let per_ms = (per_ms as u64) * (100 - MARGIN_PERCENT) / 100;
        TICKS_PER_MS.store(per_ms, Ordering::Relaxed);
        per_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every answer lies between precise readings taken just before and
    /// just after it, across many millisecond boundaries and past the
    /// calibration.
    #[test]
    fn agrees_with_the_system_clock() {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(400);
        let mut calls = 0u64;
        while std::time::Instant::now() < until {
            for _ in 0..1000 {
                let before = (precise_ns() / 1_000_000) as i64;
                let ms = now_ms();
                let after = (precise_ns() / 1_000_000) as i64;
                assert!(before <= ms && ms <= after, "{before} <= {ms} <= {after}");
                calls += 1;
            }
        }
        assert!(calls > 1000);
        #[cfg(target_arch = "x86_64")]
        if tsc::trusted() {
            assert!(tsc::ticks_per_ms() > 0, "the TSC rate is measured within the run");
        }
    }
}
