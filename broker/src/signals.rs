//! `shardlog serve`'s signals: the first SIGINT/SIGTERM starts a graceful
//! shutdown, a second one during it stops the process at once.

/// Waits for a signal, then runs `shutdown`; a second signal while it runs
/// calls `force` (from another thread) without waiting for it. A graceful
/// shutdown can be slow by design (controlled shutdown, draining requests:
/// up to 30 s and [`crate::SHUTDOWN_DRAIN_MAX`]) or held up by a shard that does
/// not yield; an operator's second Ctrl-C must still stop the process.
pub(crate) fn until_signalled<R>(
    mut signals: signal_hook::iterator::Signals,
    shutdown: impl FnOnce() -> R,
    force: impl FnOnce(i32) + Send + 'static,
) -> R {
    let signal = signals.forever().next();
    tracing::info!(?signal, "shutting down; a second signal stops at once");
    let handle = signals.handle();
    let second = std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            tracing::warn!(
                signal,
                "second signal: stopping without finishing the shutdown; the next start recovers"
            );
            force(signal);
        }
    });
    // Should the thread not start, later signals are ignored during the
    // shutdown (signal-hook keeps its handler), as before this existed.
    if let Err(e) = &second {
        tracing::warn!(error = %e, "cannot watch for a second signal; the shutdown cannot be cut short");
    }
    let result = shutdown();
    handle.close();
    if let Ok(t) = second {
        let _joined = t.join();
    }
    result
}

#[cfg(test)]
mod tests {
    /// Real signals to this process (SIGUSR1 and SIGUSR2 stand in for
    /// SIGTERM, which the test harness must keep): a second one during a
    /// shutdown that would take 10 s forces the stop; a shutdown that
    /// finishes after one signal never forces, and returns.
    #[test]
    fn a_second_signal_forces_a_slow_shutdown_and_a_single_one_does_not() {
        use signal_hook::consts::{SIGUSR1, SIGUSR2};
        use std::sync::atomic::{AtomicI32, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        let forced = Arc::new(AtomicI32::new(0));
        let started = Arc::new(AtomicI32::new(0));
        let signals = signal_hook::iterator::Signals::new([SIGUSR2]).unwrap();
        let s = started.clone();
        let raiser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            signal_hook::low_level::raise(SIGUSR2).unwrap();
            // The second only once the first was taken (unread signals of
            // one kind merge into one).
            while s.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            signal_hook::low_level::raise(SIGUSR2).unwrap();
        });
        let t0 = Instant::now();
        let f = forced.clone();
        let took = super::until_signalled(
            signals,
            || {
                started.store(1, Ordering::SeqCst);
                // A shutdown that takes 10 s unless forced.
                while forced.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                t0.elapsed()
            },
            move |signal| f.store(signal, Ordering::SeqCst),
        );
        raiser.join().unwrap();
        assert_eq!(forced.load(Ordering::SeqCst), SIGUSR2, "the second signal forced the stop");
        assert!(took < Duration::from_secs(5), "forced after {took:?}");

        let forced = Arc::new(AtomicI32::new(0));
        let signals = signal_hook::iterator::Signals::new([SIGUSR1]).unwrap();
        let raiser = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            signal_hook::low_level::raise(SIGUSR1).unwrap();
        });
        let f = forced.clone();
        // A shutdown of 300 ms: time for a stray second signal to show.
        let out = super::until_signalled(
            signals,
            || {
                std::thread::sleep(Duration::from_millis(300));
                7
            },
            move |signal| f.store(signal, Ordering::SeqCst),
        );
        raiser.join().unwrap();
        assert_eq!((out, forced.load(Ordering::SeqCst)), (7, 0), "one signal: a clean stop, never forced");
    }
}
