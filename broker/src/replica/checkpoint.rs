//! The high-watermark checkpoint (Kafka's `replication-offset-checkpoint`):
//! what consumers could read of each replicated partition, kept across a
//! restart so that a broker coming back does not answer "latest" with 0
//! (or hide everything) until its followers have fetched again.
//!
//! Each shard writes its own file, `high-watermark.shard-<N>` in the data
//! directory, every [`CHECKPOINT_INTERVAL`] when something changed and once
//! more at a clean stop: a header line, then `topic partition hw` per
//! partition it owns in a cluster (topic names have no spaces). Each write
//! replaces the file atomically (`topics::replace_file`).
//!
//! At start-up, before any shard runs, [`load`] reads every shard's file
//! (the shard count may have changed since they were written), the newest
//! file winning for a partition, and removes files of shards that no
//! longer exist. A partition opened at start-up takes its entry, clamped to
//! its recovered log end. A checkpointed high watermark was the real one
//! at some moment, so every ISR member of that moment had those records:
//! restoring it never shows consumers a record that was not replicated.

use crate::topics::replace_file;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Kafka's `replica.high-watermark.checkpoint.interval.ms` default.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
const HEADER: &str = "shardlog high-watermark checkpoint v1";
const PREFIX: &str = "high-watermark.shard-";

/// High watermarks by (topic, partition).
pub type HighWatermarks = HashMap<(String, u32), u64>;

/// The file shard `shard` writes.
#[must_use]
pub fn file_name(shard: usize) -> String {
    format!("{PREFIX}{shard}")
}

/// The bytes of a checkpoint of `entries`.
#[must_use]
pub fn encode(entries: &[(String, u32, u64)]) -> Vec<u8> {
    let mut out = String::with_capacity(HEADER.len() + 1 + entries.len() * 32);
    out.push_str(HEADER);
    out.push('\n');
    for (topic, partition, hw) in entries {
        out.push_str(&format!("{topic} {partition} {hw}\n"));
    }
    out.into_bytes()
}

/// Parses a checkpoint; `None` when it is not one (the whole file is then
/// ignored: it is only a hint).
#[must_use]
pub fn decode(text: &str) -> Option<Vec<(String, u32, u64)>> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut out = Vec::new();
    for line in lines {
        let mut words = line.split(' ');
        let (Some(topic), Some(p), Some(hw), None) = (words.next(), words.next(), words.next(), words.next())
        else {
            return None;
        };
        out.push((topic.to_string(), p.parse().ok()?, hw.parse().ok()?));
    }
    Some(out)
}

/// Reads every shard's checkpoint in `dir` (blocking: start-up only, before
/// the shards run), newest file winning, and removes the files of shards
/// `shards` and above. Unreadable or corrupt files are skipped with a
/// warning.
#[must_use]
pub fn load(dir: &Path, shards: usize) -> HighWatermarks {
    let mut files: Vec<(std::time::SystemTime, usize, PathBuf)> = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return HashMap::new() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(shard) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
        files.push((modified, shard, entry.path()));
    }
    files.sort();
    let mut out = HashMap::new();
    for (_, shard, path) in files {
        match std::fs::read_to_string(&path).ok().as_deref().and_then(decode) {
            Some(entries) => {
                for (topic, partition, hw) in entries {
                    out.insert((topic, partition), hw);
                }
            }
            None => {
                tracing::warn!(path = %path.display(), "ignoring an unreadable high-watermark checkpoint")
            }
        }
        if shard >= shards {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a former shard's checkpoint");
            }
        }
    }
    out
}

/// Writes shard `shard`'s checkpoint of `entries` (on the blocking pool).
pub async fn write(dir: PathBuf, shard: usize, entries: &[(String, u32, u64)]) -> Result<(), String> {
    let bytes = encode(entries);
    glommio::executor()
        .spawn_blocking(move || replace_file(&dir, &file_name(shard), &bytes))
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_a_checkpoint() {
        let entries = vec![("orders".to_string(), 3, 1_234_567), ("__consumer_offsets".to_string(), 0, 0)];
        let bytes = encode(&entries);
        assert_eq!(decode(std::str::from_utf8(&bytes).expect("utf-8")), Some(entries));
        assert_eq!(decode(""), None);
        assert_eq!(decode("something else\n"), None);
        assert_eq!(decode(&format!("{HEADER}\norders 1\n")), None);
        assert_eq!(decode(&format!("{HEADER}\norders x 1\n")), None);
        assert_eq!(decode(&format!("{HEADER}\norders 1 2 3\n")), None);
    }

    #[test]
    fn load_merges_newest_last_and_drops_former_shards() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |shard: usize, entries: &[(String, u32, u64)]| {
            std::fs::write(dir.path().join(file_name(shard)), encode(entries)).expect("write");
            // mtime resolution: make the order unambiguous.
            std::thread::sleep(Duration::from_millis(20));
        };
        write(2, &[("a".into(), 0, 5)]);
        write(0, &[("a".into(), 0, 9), ("b".into(), 1, 3)]);
        std::fs::write(dir.path().join(file_name(1)), "junk").expect("write");
        let hw = load(dir.path(), 2);
        assert_eq!(hw.get(&("a".to_string(), 0)), Some(&9));
        assert_eq!(hw.get(&("b".to_string(), 1)), Some(&3));
        assert_eq!(hw.len(), 2);
        assert!(!dir.path().join(file_name(2)).exists(), "shard 2 no longer exists");
        assert!(dir.path().join(file_name(0)).exists());
    }
}
