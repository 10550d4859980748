//! Named fault points for tests: a point returns an I/O error or adds a
//! delay where the broker does the real operation. They exist only with
//! the `fault-injection` cargo feature (the broker's own tests turn it on
//! through a dev-dependency); without it every point is an empty inline
//! function and nothing is checked on the data path.
//!
//! Faults are armed per point with a path filter (a substring of the file
//! path the operation touches, e.g. a test's temp directory), so tests
//! running in parallel in one process do not hit each other's faults.

use std::path::Path;
use std::time::Duration;

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The O_DIRECT write of appended data to the active segment.
    AppendWrite,
    /// The `fdatasync` of the active segment.
    Fdatasync,
    /// Sealing the active segment and opening the next one.
    SegmentRoll,
    /// Opening a partition's log at start-up (before recovery reads it).
    RecoveryRead,
    /// A step of compaction's swap of a cleaned segment into the log; the
    /// path names the step (`<base>.log.cleaned`: before the commit rename,
    /// `<base>.log.swap`: after it, mid-swap). See `log::compact`.
    CompactSwap,
}

/// What happens at an armed point.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// The operation fails with this errno (e.g. `libc::ENOSPC`, `libc::EIO`).
    Fail(i32),
    /// The operation runs after this delay.
    Delay(Duration),
}

#[cfg(feature = "fault-injection")]
mod armed {
    use super::{Fault, FaultPoint};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    type Armed = Vec<(FaultPoint, String, Fault)>;

    static ANY: AtomicBool = AtomicBool::new(false);
    static FAULTS: Mutex<Armed> = Mutex::new(Vec::new());

    pub fn arm(point: FaultPoint, path_contains: &str, fault: Fault) {
        let mut faults = FAULTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        faults.retain(|(p, f, _)| !(*p == point && f == path_contains));
        faults.push((point, path_contains.to_string(), fault));
        ANY.store(true, Ordering::Release);
    }

    pub fn disarm(path_contains: &str) {
        let mut faults = FAULTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        faults.retain(|(_, f, _)| f != path_contains);
        ANY.store(!faults.is_empty(), Ordering::Release);
    }

    pub fn find(point: FaultPoint, path: &str) -> Option<Fault> {
        if !ANY.load(Ordering::Acquire) {
            return None;
        }
        let faults = FAULTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        faults.iter().find(|(p, f, _)| *p == point && path.contains(f.as_str())).map(|(_, _, fault)| *fault)
    }
}

/// Arms `fault` at `point` for operations on paths containing `path_contains`.
#[cfg(feature = "fault-injection")]
pub fn arm(point: FaultPoint, path_contains: &str, fault: Fault) {
    armed::arm(point, path_contains, fault);
}

/// Disarms every fault armed with this path filter.
#[cfg(feature = "fault-injection")]
pub fn disarm(path_contains: &str) {
    armed::disarm(path_contains);
}

/// Runs the fault armed at `point` for `path`, if any.
#[cfg(feature = "fault-injection")]
pub(crate) async fn hit(point: FaultPoint, path: &Path) -> std::io::Result<()> {
    match armed::find(point, &path.to_string_lossy()) {
        None => Ok(()),
        Some(Fault::Delay(d)) => {
            glommio::timer::sleep(d).await;
            Ok(())
        }
        Some(Fault::Fail(errno)) => {
            tracing::debug!(?point, path = %path.display(), errno, "injected fault");
            Err(std::io::Error::from_raw_os_error(errno))
        }
    }
}

/// Without the `fault-injection` feature: nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) async fn hit(_point: FaultPoint, _path: &Path) -> std::io::Result<()> {
    Ok(())
}
