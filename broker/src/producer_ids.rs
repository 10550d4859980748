//! Producer ids for idempotent producers (Kafka's InitProducerId), handed
//! out by shard 0 only, so that no two producers of this broker ever share
//! one.
//!
//! Invariants:
//! - an id is `broker_id << 32 | n`: brokers of a cluster never collide,
//!   and `n` only grows, across restarts too;
//! - ids are reserved in blocks of [`BLOCK`]: the file `producer_ids.json`
//!   in the data directory holds the end of the last reserved block, and is
//!   durable (written, fsynced, renamed, directory fsynced) before any id
//!   of that block is handed out. A crash loses the rest of the block (ids
//!   are skipped, never reused);
//! - the file is read and written on glommio's blocking thread pool, never
//!   on the reactor thread;
//! - the sequence checks that make these ids safe are in `log::producers`:
//!   an id is worth nothing without them.

use crate::partition::PartitionError;
use crate::shard::{ShardContext, ShardOp, ShardReply};
use serde::{Deserialize, Serialize};
use shardlog_schema::ErrorCode;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Ids reserved per write of the file.
pub const BLOCK: u64 = 1000;
/// The file in the data directory.
pub const FILE: &str = "producer_ids.json";
const VERSION: u64 = 1;
const N_MAX: u64 = 1 << 32;

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u64,
    reserved_end: u64,
}

/// Why no id could be given.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("producer id file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("producer id file {}: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error("this broker has handed out all 2^32 producer ids of its range")]
    Exhausted,
}

/// Shard 0's allocator.
pub struct Allocator {
    path: PathBuf,
    broker_id: i32,
    /// `None` until the file was read.
    next: Cell<Option<u64>>,
    reserved_end: Cell<u64>,
    /// One reservation at a time.
    reserving: glommio::sync::Semaphore,
}

impl Allocator {
    #[must_use]
    pub fn new(data_dir: &Path, broker_id: i32) -> Allocator {
        Allocator {
            path: data_dir.join(FILE),
            broker_id,
            next: Cell::new(None),
            reserved_end: Cell::new(0),
            reserving: glommio::sync::Semaphore::new(1),
        }
    }

    /// A producer id never handed out before by this broker.
    pub async fn allocate(&self) -> Result<i64, AllocError> {
        let _one = self.reserving.acquire_permit(1).await.expect("the semaphore is never closed");
        let next = match self.next.get() {
            Some(n) => n,
            None => {
                let path = self.path.clone();
                let end = glommio::executor().spawn_blocking(move || read_reserved_end(&path)).await?;
                self.reserved_end.set(end);
                end
            }
        };
        if next >= N_MAX {
            return Err(AllocError::Exhausted);
        }
        if next >= self.reserved_end.get() {
            let end = (next + BLOCK).min(N_MAX);
            let path = self.path.clone();
            glommio::executor().spawn_blocking(move || write_reserved_end(&path, end)).await?;
            self.reserved_end.set(end);
        }
        self.next.set(Some(next + 1));
        Ok(i64::from(self.broker_id.max(0)) << 32 | next as i64)
    }
}

fn read_reserved_end(path: &Path) -> Result<u64, AllocError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let d: OnDisk = serde_json::from_slice(&bytes).map_err(|e| AllocError::Corrupt {
                path: path.to_path_buf(),
                what: format!("not JSON: {e}"),
            })?;
            if d.version != VERSION {
                return Err(AllocError::Corrupt {
                    path: path.to_path_buf(),
                    what: format!("unsupported version {}", d.version),
                });
            }
            Ok(d.reserved_end)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(AllocError::Io { path: path.to_path_buf(), source }),
    }
}

fn write_reserved_end(path: &Path, reserved_end: u64) -> Result<(), AllocError> {
    use std::io::Write;
    let io = |source| AllocError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec(&OnDisk { version: VERSION, reserved_end }).expect("serializes");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&json).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// A producer id from shard 0 (over the mesh from other shards), or the
/// client-visible error.
pub async fn allocate(ctx: &Rc<ShardContext>) -> Result<i64, PartitionError> {
    match ctx.call(shardlog_schema::ShardId(0), ShardOp::InitProducerId).await {
        ShardReply::ProducerId(r) => r,
        _ => Err(PartitionError::new(ErrorCode::BrokerShuttingDown, "shard 0 unavailable")),
    }
}

/// What InitProducerId answers (native and Kafka alike): a new id at epoch
/// 0, or, given the producer's current id and epoch, the same id at the
/// next epoch (so that partitions fence the older one; KIP-360). An epoch
/// at its maximum gets a new id.
pub async fn init(ctx: &Rc<ShardContext>, id: i64, epoch: i16) -> Result<(i64, i16), PartitionError> {
    if (id >= 0) != (epoch >= 0) {
        return Err(PartitionError::new(
            ErrorCode::InvalidRequest,
            format!("producer id {id} and epoch {epoch}: give both or neither"),
        ));
    }
    if id >= 0 && epoch < i16::MAX {
        return Ok((id, epoch + 1));
    }
    Ok((allocate(ctx).await?, 0))
}

/// Shard 0's side of [`allocate`].
pub(crate) async fn allocate_here(ctx: &ShardContext) -> Result<i64, PartitionError> {
    debug_assert_eq!(ctx.id.0, 0, "producer ids come from shard 0 only");
    ctx.producer_ids.allocate().await.map_err(|e| {
        tracing::warn!(error = %e, "cannot hand out a producer id");
        let code = match &e {
            AllocError::Io { source, .. } if crate::log::is_no_space(source) => ErrorCode::StorageFull,
            _ => ErrorCode::StorageError,
        };
        PartitionError::new(code, e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(fut: impl std::future::Future<Output = T>) -> T {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().expect("executor").run(fut)
    }

    #[test]
    fn ids_are_unique_across_restarts_and_carry_the_broker_id() {
        let dir = tempfile::tempdir().unwrap();
        let first: Vec<i64> = run(async {
            let a = Allocator::new(dir.path(), 3);
            let mut ids = Vec::new();
            for _ in 0..5 {
                ids.push(a.allocate().await.unwrap());
            }
            ids
        });
        assert_eq!(first[0], 3 << 32);
        assert!(first.windows(2).all(|w| w[1] == w[0] + 1));
        // A restart (or crash) skips the rest of the reserved block.
        let after: i64 = run(async { Allocator::new(dir.path(), 3).allocate().await.unwrap() });
        assert_eq!(after, (3 << 32) + BLOCK as i64);
        std::fs::write(dir.path().join(FILE), b"{oops").unwrap();
        let bad = run(async { Allocator::new(dir.path(), 3).allocate().await });
        assert!(matches!(bad, Err(AllocError::Corrupt { .. })), "{bad:?}");
    }
}
