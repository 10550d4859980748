//! Topic metadata: names, partition counts and settings.
//!
//! The broker keeps topic metadata behind [`TopicStore`] so that the static
//! single-node store (a JSON file in the data directory, this module) and the
//! ZooKeeper store (later) are interchangeable. Shard 0 is the only writer;
//! every shard holds a read-only copy of the [`TopicTable`], updated by
//! messages over the shard mesh.
//!
//! [`TopicStore::store`] runs on shard 0's executor, so it must not block
//! it: the file store does its writes, fsyncs and rename on glommio's
//! blocking thread pool. [`TopicStore::load`] runs once on the main thread
//! before any shard starts, where blocking is fine.

use crate::config::{ConfigError, TopicConfig};
use futures_lite::future::BoxedLocal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest topic name (Kafka's limit).
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Most partitions a single topic may have.
pub const TOPIC_PARTITIONS_MAX: u32 = 10_000;
/// The file holding topic metadata inside the data directory.
pub const TOPICS_FILE: &str = "topics.json";

/// What the broker knows about one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    pub name: String,
    pub partitions: u32,
    pub config: TopicConfig,
}

/// The on-disk form: settings as Kafka-named entries, so that a file written
/// by one version stays readable when defaults change.
#[derive(Debug, Serialize, Deserialize)]
struct TopicRecord {
    name: String,
    partitions: u32,
    configs: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct TopicsFile {
    version: u32,
    topics: Vec<TopicRecord>,
}

/// All topics, by name.
pub type TopicTable = BTreeMap<String, TopicMeta>;

#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("cannot {op} topic metadata file {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("topic metadata file {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("topic `{topic}` in {path} has a bad setting: {source}")]
    BadConfig {
        topic: String,
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
}

/// Where topic metadata lives. Implementations: [`FileTopicStore`] (single
/// node); a ZooKeeper-backed store later.
pub trait TopicStore {
    /// Reads the stored table. Blocking: start-up only, before the shards
    /// run.
    fn load(&self) -> Result<TopicTable, TopicsError>;
    /// Replaces the stored table atomically, without blocking the calling
    /// executor. The table is captured when this is called.
    fn store(&self, table: &TopicTable) -> BoxedLocal<Result<(), TopicsError>>;
}

/// `<data_dir>/topics.json`, replaced atomically (write temp, fsync, rename,
/// fsync the directory). The file work runs on the calling executor's
/// blocking thread pool (`glommio::executor().spawn_blocking`): glommio has
/// no async rename or directory fsync, and the writes are rare and small.
pub struct FileTopicStore {
    dir: PathBuf,
}

impl FileTopicStore {
    #[must_use]
    pub fn new(dir: &Path) -> Self {
        FileTopicStore { dir: dir.to_path_buf() }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(TOPICS_FILE)
    }

    /// Replaces the file from a plain thread (start-up, before any shard
    /// runs; shards use the async `TopicStore::store`).
    pub fn store_blocking(&self, table: &TopicTable) -> Result<(), TopicsError> {
        replace_topics_file(&self.dir, &encode(table))
    }
}

impl TopicStore for FileTopicStore {
    fn load(&self) -> Result<TopicTable, TopicsError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TopicTable::new()),
            Err(source) => return Err(TopicsError::Io { op: "read", path, source }),
        };
        let file: TopicsFile = serde_json::from_slice(&bytes)
            .map_err(|source| TopicsError::Corrupt { path: path.clone(), source })?;
        let mut table = TopicTable::new();
        for t in file.topics {
            let config =
                TopicConfig::from_entries(t.configs.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(
                    |source| TopicsError::BadConfig { topic: t.name.clone(), path: path.clone(), source },
                )?;
            table.insert(t.name.clone(), TopicMeta { name: t.name, partitions: t.partitions, config });
        }
        Ok(table)
    }

    fn store(&self, table: &TopicTable) -> BoxedLocal<Result<(), TopicsError>> {
        let bytes = encode(table);
        let dir = self.dir.clone();
        Box::pin(async move {
            glommio::executor().spawn_blocking(move || replace_topics_file(&dir, &bytes)).await
        })
    }
}

/// The `topics.json` bytes for a table.
fn encode(table: &TopicTable) -> Vec<u8> {
    let file = TopicsFile {
        version: 1,
        topics: table
            .values()
            .map(|t| TopicRecord {
                name: t.name.clone(),
                partitions: t.partitions,
                configs: t.config.entries().into_iter().collect(),
            })
            .collect(),
    };
    serde_json::to_vec_pretty(&file).expect("topic metadata serializes")
}

/// Replaces `<dir>/topics.json` with `bytes` (see [`replace_file`]).
fn replace_topics_file(dir: &Path, bytes: &[u8]) -> Result<(), TopicsError> {
    replace_file(dir, TOPICS_FILE, bytes).map_err(|e| TopicsError::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

/// A failed step of [`replace_file`].
#[derive(Debug)]
pub struct ReplaceError {
    pub op: &'static str,
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot {} {}: {}", self.op, self.path.display(), self.source)
    }
}

/// Replaces `<dir>/<name>` with `bytes` atomically and durably: write a
/// temp file, fsync it, rename it over the old one, fsync the directory.
/// Blocking: call it off the shard executors.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ReplaceError> {
    fn io<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> ReplaceError + 'p {
        move |source| ReplaceError { op, path: path.to_path_buf(), source }
    }
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        f.write_all(bytes).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("fsync", &tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("fsync", dir))?;
    Ok(())
}

/// Checks a topic name: 1..=249 bytes of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX {
        return Err(format!("topic name must be 1 to {TOPIC_NAME_BYTES_MAX} bytes long"));
    }
    if name == "." || name == ".." {
        return Err("topic name cannot be `.` or `..`".into());
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!(
            "topic name contains `{c}`; allowed are ASCII letters, digits, `.`, `_` and `-`"
        ));
    }
    Ok(())
}

/// The directory of one partition: `<data_dir>/<topic>-<partition>`.
#[must_use]
pub fn partition_dir(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlushPolicy;

    #[test]
    fn names() {
        assert!(validate_topic_name("orders.v1_eu-west").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }

    #[test]
    fn store_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileTopicStore::new(dir.path());
        assert!(store.load().expect("empty").is_empty());
        let mut table = TopicTable::new();
        let config = TopicConfig { flush: FlushPolicy::Always, ..TopicConfig::default() };
        table.insert("t".into(), TopicMeta { name: "t".into(), partitions: 3, config });
        // `store` needs an executor (it runs on its blocking pool).
        let ex = glommio::LocalExecutorBuilder::default().make().expect("executor");
        ex.run(store.store(&table)).expect("store");
        assert_eq!(store.load().expect("load"), table);
        assert!(!dir.path().join(format!("{TOPICS_FILE}.tmp")).exists(), "temp file renamed away");
        std::fs::write(dir.path().join(TOPICS_FILE), b"{not json").expect("write");
        assert!(matches!(store.load(), Err(TopicsError::Corrupt { .. })));
    }
}
