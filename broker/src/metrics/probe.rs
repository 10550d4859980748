//! The shard's scheduling probe: a timer task that measures how late it
//! wakes. Its lateness is what any task that became ready waits for the
//! reactor (the task-queue latency of the shard's one queue), and a wake-up
//! [`STALL`] or more late means something held the thread: a reactor stall.
//!
//! Glommio's own stall detector was not used: it arms and disarms a timerfd
//! around every task-queue run (two syscalls on the data path) and takes a
//! backtrace by signal. The probe costs one timer every [`INTERVAL`].

use crate::metrics::ShardMetrics;
use crate::shard::ShardContext;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often the probe wakes.
pub const INTERVAL: Duration = Duration::from_millis(10);
/// A wake-up this late counts as a stall (`shardlog_shard_stalls_total`).
pub const STALL: Duration = Duration::from_millis(20);

/// Runs until the shard cancels it.
pub async fn run(ctx: Rc<ShardContext>) {
    loop {
        let asleep = Instant::now();
        glommio::timer::sleep(INTERVAL).await;
        let late = asleep.elapsed().saturating_sub(INTERVAL);
        ctx.metrics.scheduling_delay.record(late);
        if late >= STALL {
            ShardMetrics::inc(&ctx.metrics.stalls);
        }
    }
}
