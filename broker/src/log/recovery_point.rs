//! The recovery point: how much of the active segment an unclean open may
//! trust without scanning it (Kafka's recovery-point checkpoint, here down
//! to the byte).
//!
//! An unclean open used to validate the whole active segment batch by
//! batch, so recovery grew with segment size times partitions. Now the
//! shard's housekeeping calls [`Log::write_recovery_point`] every
//! `log_recovery_point_interval`: it makes what is written durable (one
//! flush), then records, in `recovery.point`, a durable batch boundary `P`
//! of the active segment with everything a scan of `[0, P)` would have
//! produced: the next offset there, the index and time-index entries, the
//! largest timestamp, and the idempotent producers' state as of that offset.
//! An unclean open whose active segment matches the point scans only
//! `[P, end)`: the torn tail is still found and cut, and what it costs is
//! bounded by what was written after the last point.
//!
//! Invariants:
//! - every byte below `P` was fdatasync'ed before the point naming it was
//!   written, and the point itself is written durably (temporary file,
//!   fdatasync, rename, directory fsync): a point never names bytes a crash
//!   can take back;
//! - the point is read only for the segment it names (`base`), and only
//!   when the file still holds `P` bytes; a CRC covers the whole file, and
//!   entries that do not go forward are refused: a bad point costs a full
//!   scan, never a wrong log;
//! - nothing rewrites bytes below a point while it names them: a roll
//!   starts a new segment (the point's `base` no longer matches), and
//!   `truncate_to` removes the point before it cuts (it waits for a point
//!   being written to finish first);
//! - the producer state in the point holds every idempotent batch below
//!   `next_offset` and none at or after it (the state of the time, with
//!   later batches cut), so replaying the scanned batches on it rebuilds the
//!   state a full scan would.
//!
//! The file is rewritten whole; to keep that cheap it is rewritten only when
//! the durable data grew by at least [`REWRITE_GROWTH_FACTOR`] times the
//! file's own size (and [`REWRITE_BYTES_MIN`]), so its writes stay a small
//! fraction of the log's.

use super::index::{IndexEntry, TimeEntry, INDEX_ENTRY_BYTES, TIME_ENTRY_BYTES};
use super::roll::wait_while;
use super::*;

pub(super) const RECOVERY_POINT_FILE: &str = "recovery.point";
const RECOVERY_POINT_TMP_FILE: &str = "recovery.point.tmp";
const MAGIC: u32 = 0x5250_4c53; // "SLPR" little-endian
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 4 + 4 + 8 * 5 + 4 * 3;
/// A point is rewritten once the durable bytes past the last one are at
/// least this many times the point file's size...
pub(super) const REWRITE_GROWTH_FACTOR: u64 = 16;
/// ... and at least this many bytes.
pub(super) const REWRITE_BYTES_MIN: u64 = 1 << 20;

/// What a scan of the active segment's first `pos` bytes produced.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RecoveryPoint {
    pub base: u64,
    pub pos: u64,
    pub next_offset: u64,
    pub max_timestamp: i64,
    /// `i64::MIN` when the segment had no batch below `pos`.
    pub first_timestamp: i64,
    pub entries: Vec<IndexEntry>,
    pub times: Vec<TimeEntry>,
    /// A producer snapshot as of `next_offset` (`ProducerStates::encode_snapshot`).
    pub producers: Vec<u8>,
}

/// Where the last point written stands, kept in the log's state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Written {
    pub base: u64,
    pub pos: u64,
    pub file_bytes: u64,
}

impl RecoveryPoint {
    /// The encoded file's size.
    pub fn file_bytes(&self) -> usize {
        HEADER_BYTES
            + self.entries.len() * INDEX_ENTRY_BYTES
            + self.times.len() * TIME_ENTRY_BYTES
            + self.producers.len()
            + 4
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.file_bytes());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.base, self.pos, self.next_offset] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.max_timestamp.to_le_bytes());
        out.extend_from_slice(&self.first_timestamp.to_le_bytes());
        for n in [self.entries.len(), self.times.len(), self.producers.len()] {
            out.extend_from_slice(
                &u32::try_from(n).expect("a segment's index fits u32 entries").to_le_bytes(),
            );
        }
        for e in &self.entries {
            e.encode(&mut out);
        }
        for t in &self.times {
            t.encode(&mut out);
        }
        out.extend_from_slice(&self.producers);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a point file; `Err` says why it cannot be trusted.
    pub fn decode(b: &[u8]) -> Result<RecoveryPoint, String> {
        if b.len() < HEADER_BYTES + 4 {
            return Err(format!("{} bytes, shorter than a header", b.len()));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != crc {
            return Err("CRC mismatch".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return Err("not a recovery point (magic)".into());
        }
        if u32_at(4) != VERSION {
            return Err(format!("unsupported recovery point version {}", u32_at(4)));
        }
        let (base, pos, next_offset) = (u64_at(8), u64_at(16), u64_at(24));
        let (max_timestamp, first_timestamp) = (u64_at(32) as i64, u64_at(40) as i64);
        let (n_entries, n_times, n_producers) =
            (u32_at(48) as usize, u32_at(52) as usize, u32_at(56) as usize);
        let want = HEADER_BYTES as u64
            + n_entries as u64 * INDEX_ENTRY_BYTES as u64
            + n_times as u64 * TIME_ENTRY_BYTES as u64
            + n_producers as u64;
        if want != body.len() as u64 {
            return Err(format!("lengths add up to {want} bytes, the file holds {}", body.len()));
        }
        let mut at = HEADER_BYTES;
        let entries: Vec<IndexEntry> = body[at..at + n_entries * INDEX_ENTRY_BYTES]
            .chunks_exact(INDEX_ENTRY_BYTES)
            .map(IndexEntry::decode)
            .collect();
        at += n_entries * INDEX_ENTRY_BYTES;
        let times: Vec<TimeEntry> = body[at..at + n_times * TIME_ENTRY_BYTES]
            .chunks_exact(TIME_ENTRY_BYTES)
            .map(TimeEntry::decode)
            .collect();
        at += n_times * TIME_ENTRY_BYTES;
        let producers = body[at..].to_vec();
        let point = RecoveryPoint {
            base,
            pos,
            next_offset,
            max_timestamp,
            first_timestamp,
            entries,
            times,
            producers,
        };
        point.check()?;
        Ok(point)
    }

    /// The scan of `[0, pos)` this point stands for, to resume from; and
    /// the producer snapshot.
    pub fn into_scan(self, interval_bytes: u32) -> (Scan, Vec<u8>) {
        let mut index =
            IndexBuilder::from_parts(interval_bytes, self.entries, self.times, self.max_timestamp);
        index.first_timestamp = (self.first_timestamp != i64::MIN).then_some(self.first_timestamp);
        let scan = Scan {
            valid_bytes: self.pos,
            next_offset: self.next_offset,
            index,
            stop: ScanStop::Clean,
            batches: 0,
            producers: Vec::new(),
        };
        (scan, self.producers)
    }

    /// What the index builder would have asserted, checked up front.
    fn check(&self) -> Result<(), String> {
        if self.next_offset < self.base || self.next_offset - self.base >= u64::from(u32::MAX) {
            return Err(format!("next offset {} does not fit segment {}", self.next_offset, self.base));
        }
        if (self.pos == 0) != (self.next_offset == self.base) {
            return Err("position and next offset disagree about an empty segment".into());
        }
        let rel_end = self.next_offset - self.base;
        let forward = |pairs: &mut dyn Iterator<Item = (u32, u32)>| {
            let mut last: Option<(u32, u32)> = None;
            for (rel, pos) in pairs {
                if u64::from(rel) >= rel_end || u64::from(pos) >= self.pos || pos == 0 {
                    return false;
                }
                if last.is_some_and(|(r, p)| r >= rel || p >= pos) {
                    return false;
                }
                last = Some((rel, pos));
            }
            true
        };
        if !forward(&mut self.entries.iter().map(|e| (e.rel_offset, e.pos))) {
            return Err("index entries do not go forward within the point".into());
        }
        if !forward(&mut self.times.iter().map(|t| (t.rel_offset, t.pos))) {
            return Err("time-index entries do not go forward within the point".into());
        }
        Ok(())
    }
}

/// The point in `dir`, when there is one that can be trusted for the
/// active segment based at `base` whose file holds `size` bytes.
pub(super) async fn read(dir: &Path, base: u64, size: u64) -> Option<RecoveryPoint> {
    let path = dir.join(RECOVERY_POINT_FILE);
    let bytes = match read_file(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the recovery point; scanning the whole active segment");
            return None;
        }
    };
    match RecoveryPoint::decode(&bytes) {
        Ok(p) if p.base == base && p.pos <= size => Some(p),
        Ok(p) => {
            tracing::info!(
                path = %path.display(), point_base = p.base, point_pos = p.pos, active_base = base, active_bytes = size,
                "the recovery point is for another segment or past its end; scanning the whole active segment"
            );
            None
        }
        Err(why) => {
            tracing::warn!(path = %path.display(), why, "ignoring a damaged recovery point; scanning the whole active segment");
            None
        }
    }
}

/// The whole file, through the reactor (a point of a full 1 GiB segment
/// holds a few MiB of index entries).
async fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let f =
        glommio::io::OpenOptions::new().read(true).buffered_open(path).await.map_err(std::io::Error::from)?;
    let read = async {
        let len = f.file_size().await.map_err(std::io::Error::from)?;
        let len = usize::try_from(len).map_err(|_| std::io::Error::other("the point file is too large"))?;
        f.read_at(0, len).await.map(|b| b.to_vec()).map_err(std::io::Error::from)
    };
    let bytes = read.await;
    let _ = f.close().await;
    bytes
}

/// Removes the point (before a truncation cuts below it).
pub(super) async fn remove(sh: &Shared) -> Result<(), LogError> {
    wait_while(sh, |_| sh.recovery_point_writing.get()).await;
    remove_if_exists(&sh.dir.join(RECOVERY_POINT_FILE)).await?;
    sh.st.borrow_mut().recovery_point = Written::default();
    Ok(())
}

/// Waits for a point being written to be done (before the files go).
pub(super) async fn wait_idle(sh: &Shared) {
    wait_while(sh, |_| sh.recovery_point_writing.get()).await;
}

impl Log {
    /// Writes a recovery point for the active segment when enough was
    /// written since the last one (module docs); returns whether it did.
    /// Flushes first, so under `flush.policy=never` this is also the
    /// log's periodic fdatasync.
    pub async fn write_recovery_point(&self) -> Result<bool, LogError> {
        let sh = &self.sh;
        let due = |st: &State| {
            let a = &st.active;
            let last = st.recovery_point;
            let (from, cost) = if last.base == a.base { (last.pos, last.file_bytes) } else { (0, 0) };
            let grown = a.written_pos.saturating_sub(from);
            st.failed.is_none()
                && !st.shut
                && !st.rolling
                && grown >= REWRITE_BYTES_MIN.max(REWRITE_GROWTH_FACTOR * cost)
        };
        if sh.recovery_point_writing.get() || !due(&sh.st.borrow()) {
            return Ok(false);
        }
        flush_inner(sh).await?;
        let point = {
            let st = sh.st.borrow();
            if sh.recovery_point_writing.get() || st.failed.is_some() || st.shut || st.rolling {
                return Ok(false);
            }
            let a = &st.active;
            let (n, t) = a.durable_index;
            RecoveryPoint {
                base: a.base,
                pos: a.durable_pos,
                next_offset: a.durable_next,
                max_timestamp: a.durable_max_ts.0,
                first_timestamp: a.durable_max_ts.1,
                entries: a.index.entries[..n].to_vec(),
                times: a.index.times[..t].to_vec(),
                producers: st.producers.encode_snapshot_before(a.durable_next),
            }
        };
        let writing = Writing::start(sh);
        let bytes = point.encode();
        let file_bytes = bytes.len() as u64;
        write_durably(sh, bytes).await?;
        sh.st.borrow_mut().recovery_point = Written { base: point.base, pos: point.pos, file_bytes };
        drop(writing);
        Ok(true)
    }
}

/// Marks a point write in progress until dropped, also when the writing
/// future is dropped midway (a shard stopping cancels its housekeeping).
struct Writing<'a>(&'a Shared);

impl<'a> Writing<'a> {
    fn start(sh: &'a Shared) -> Self {
        sh.recovery_point_writing.set(true);
        Writing(sh)
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.recovery_point_writing.set(false);
        self.0.changed.notify_all();
    }
}

async fn write_durably(sh: &Shared, bytes: Vec<u8>) -> Result<(), LogError> {
    let tmp = sh.dir.join(RECOVERY_POINT_TMP_FILE);
    let path = sh.dir.join(RECOVERY_POINT_FILE);
    segment::write_file_durably(&tmp, bytes).await?;
    glommio::io::rename(&tmp, &path).await.map_err(|e| LogError::glommio("renaming", &tmp, e))?;
    sync_dir(&sh.dir).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point() -> RecoveryPoint {
        RecoveryPoint {
            base: 100,
            pos: 9000,
            next_offset: 160,
            max_timestamp: 1_700_000_000_000,
            first_timestamp: 1_600_000_000_000,
            entries: vec![IndexEntry { rel_offset: 20, pos: 4100 }, IndexEntry { rel_offset: 41, pos: 8200 }],
            times: vec![
                TimeEntry { max_ts_before: 5, rel_offset: 20, pos: 4100 },
                TimeEntry { max_ts_before: 7, rel_offset: 41, pos: 8200 },
            ],
            producers: br#"{"version":1}"#.to_vec(),
        }
    }

    #[test]
    fn a_point_round_trips() {
        let p = point();
        assert_eq!(RecoveryPoint::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn any_flipped_bit_or_cut_is_refused_without_a_panic() {
        let bytes = point().encode();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(RecoveryPoint::decode(&b).is_err(), "bit {i} flipped was accepted");
        }
        for n in 0..bytes.len() {
            assert!(RecoveryPoint::decode(&bytes[..n]).is_err(), "a cut at {n} was accepted");
        }
    }

    #[test]
    fn entries_that_do_not_go_forward_or_pass_the_point_are_refused() {
        type Damage = fn(&mut RecoveryPoint);
        let cases: [(&str, Damage); 5] = [
            ("backwards", |p| p.entries.swap(0, 1)),
            ("past the position", |p| p.entries[1].pos = 9000),
            ("past the next offset", |p| p.times[1].rel_offset = 60),
            ("at position 0", |p| p.times[0].pos = 0),
            ("empty but with bytes", |p| p.next_offset = p.base),
        ];
        for (what, spoil) in cases {
            let mut p = point();
            spoil(&mut p);
            // Re-encoded, so the CRC is right and only the check can refuse it.
            assert!(RecoveryPoint::decode(&p.encode()).is_err(), "{what} was accepted");
        }
    }
}
