//! A follower's fetcher: one task per followed partition, on the shard that
//! owns the replica, connected straight to the leader's owning shard.
//!
//! 1. Connect to the leader's shard port (from its registration).
//! 2. Truncate: ask where this log's latest epoch ends on the leader
//!    (`OffsetsForLeaderEpoch`) and drop what lies past it here (the
//!    smaller of the leader's end and this log's own end of the epoch the
//!    leader answered; nothing in common drops everything).
//! 3. Fetch from the log end with this broker's id as replica id and the
//!    epoch it follows, append what comes unchanged, take the leader's high
//!    watermark; again, until told to stop (a new role) or until something
//!    goes wrong, which goes back to 1 after a pause.
//!
//! **Pipelining.** An answer of at least [`PIPELINE_BYTES`] that ends
//! below the leader's high watermark means a backlog (the leader has
//! acknowledged more than it sent, so this replica is out of the ISR and
//! catching up): the next fetch, from just past that answer, goes out
//! while the answer is appended, so the leader's read, the transfer and
//! this log's write overlap. Such a fetch names this log's written end
//! apart (`replica_log_end`): the leader counts only what a follower has
//! written for the ISR and the high watermark. It asks the leader not to
//! wait (`max_wait_ms` 0): a held fetch would keep the leader from learning
//! of the write for as long as it is held. Any other answer is appended
//! before the next fetch, which then reports it at once: an in-sync
//! follower (the high watermark waits for it, so it never lies below) works
//! as without pipelining, and `acks=all` waits no longer. Appends stay one
//! at a time, in order.
//!
//! The leader epoch in every request fences both sides: a leader with
//! another epoch answers `FencedLeaderEpoch`, and the follower waits for
//! the metadata that resolves it (the shard then starts a new fetcher).

use crate::cluster::metadata::ClusterMetadata;
use crate::partition::Partition;
use crate::shard::ShardContext;
use flatbuffers::FlatBufferBuilder;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use shardlog_schema::frame::{self, FrameLimits, LENGTH_PREFIX_BYTES};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use shardlog_schema::Offset;
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// Pause after a failure before trying again.
const RETRY: Duration = Duration::from_millis(200);
/// How long the leader may hold a fetch with nothing new.
const FETCH_MAX_WAIT_MS: u32 = 500;
/// Bytes asked for per fetch (the leader caps it at its `fetch_bytes_max`).
const FETCH_BYTES: u32 = 8 << 20;
/// An answer this large is appended while the next fetch is in flight.
const PIPELINE_BYTES: usize = 1 << 20;
/// How replica requests name their sender.
const CLIENT_ID: &str = "shardlog-replica-fetcher";
/// Longest wait for a connection or an answer.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a round of the fetcher ended.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("leader broker {0} is not registered")]
    NoLeader(i32),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("timed out waiting for the leader")]
    Timeout,
    #[error("bad answer from the leader: {0}")]
    Protocol(String),
    #[error("leader answered {code:?}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("{0}")]
    Log(#[from] crate::log::LogError),
    #[error("told to stop")]
    Stopped,
}

/// Runs until `stop` is set.
pub(crate) async fn run(
    ctx: Rc<ShardContext>,
    p: Rc<Partition>,
    leader: i32,
    epoch: i32,
    stop: Rc<Cell<bool>>,
) {
    let me = ctx.config.broker_id;
    tracing::info!(topic = %p.topic, partition = p.id, leader, epoch, "following");
    let mut corr = 0u32;
    while !stop.get() && !ctx.shutting_down.get() {
        let round = follow_round(&ctx, &p, me, leader, epoch, &stop, &mut corr).await;
        match round {
            Ok(()) => {}
            Err(FetchError::Refused { code, message }) => {
                tracing::debug!(topic = %p.topic, partition = p.id, leader, ?code, %message, "leader refused a replica fetch");
            }
            Err(e) => {
                tracing::debug!(topic = %p.topic, partition = p.id, leader, error = %e, "replica fetch failed")
            }
        }
        if !stop.get() {
            glommio::timer::sleep(RETRY).await;
        }
    }
    tracing::debug!(topic = %p.topic, partition = p.id, leader, epoch, "fetcher stopped");
}

async fn follow_round(
    ctx: &Rc<ShardContext>,
    p: &Rc<Partition>,
    me: i32,
    leader: i32,
    epoch: i32,
    stop: &Cell<bool>,
    corr: &mut u32,
) -> Result<(), FetchError> {
    let addr = {
        let md = ctx.cluster_metadata().ok_or(FetchError::NoLeader(leader))?;
        let broker = md.brokers.get(&leader).ok_or(FetchError::NoLeader(leader))?;
        let (_, port) = ClusterMetadata::leader_endpoint(broker, &p.topic, p.id);
        format!("{}:{port}", broker.host)
    };
    let mut conn = unless_stopped(p, stop, timed(TcpStream::connect(addr.as_str())))
        .await?
        .map_err(|e| std::io::Error::other(format!("connecting to the leader at {addr}: {e}")))?;
    conn.set_nodelay(true).ok();
    let limits = FrameLimits::default();
    // Truncate to where this log and the leader's agree.
    if let Some(latest) = p.log.latest_epoch() {
        *corr = corr.wrapping_add(1);
        let req = encode_epoch_query(*corr, &p.topic, p.id, me, latest, epoch);
        let (header, _) =
            unless_stopped(p, stop, round_trip(&mut conn, &req, &limits, &mut Vec::new())).await?;
        let (leader_epoch, leader_end) = decode_epoch_answer(&header, &limits)?;
        let target = if leader_epoch < 0 {
            p.log.start_offset()
        } else {
            let own_end = p.log.epoch_end_offset(leader_epoch).map_or(p.log.start_offset(), |(_, end)| end);
            Offset(leader_end.min(own_end.0))
        };
        if target < p.log.end_offset() {
            let end = p.log.truncate_at_most(target).await?;
            tracing::warn!(topic = %p.topic, partition = p.id, leader, epoch, %end, "truncated to the leader's log");
        }
    }
    // One buffer receives an answer while the other's is appended.
    let (mut receiving, mut appending) = (Vec::new(), Vec::new());
    // Bytes of `appending` not yet appended, and the offset after them.
    let mut held: Option<(usize, u64)> = None;
    let mut leader_hw = 0u64;
    while !stop.get() && !ctx.shutting_down.get() {
        let written = p.log.end_offset().0;
        *corr = corr.wrapping_add(1);
        let (answer, appended) = match held.take() {
            None => {
                let req = encode_replica_fetch(*corr, &p.topic, p.id, me, Ask::at(written, epoch));
                (
                    unless_stopped(p, stop, round_trip(&mut conn, &req, &limits, &mut receiving)).await,
                    Ok(None),
                )
            }
            Some((bytes, next)) => {
                let req = encode_replica_fetch(*corr, &p.topic, p.id, me, Ask::ahead(next, written, epoch));
                // Only the network side gives up on a stop: an append
                // under way runs to its end.
                let (answer, appended) = futures_lite::future::zip(
                    unless_stopped(p, stop, round_trip(&mut conn, &req, &limits, &mut receiving)),
                    p.log.append_replica(&appending[..bytes]),
                )
                .await;
                (answer, appended.map(Some))
            }
        };
        if appended?.is_some() {
            p.data.notify();
            p.replica.set_follower_hw(leader_hw, p.log.end_offset().0);
        }
        let (header, payload_len) = answer?;
        let frame = limits.verify_response(&header).map_err(|e| FetchError::Protocol(e.to_string()))?;
        let body =
            frame.body_as_fetch_response().ok_or_else(|| FetchError::Protocol("no fetch body".into()))?;
        let part = body.partitions().and_then(|v| v.iter().next()).ok_or_else(no_partition)?;
        check_answer(part.error(), part.error_message())?;
        if stop.get() {
            return Ok(());
        }
        let bytes = part.bytes() as usize;
        if bytes > payload_len {
            return Err(FetchError::Protocol("answer shorter than it says".into()));
        }
        leader_hw = part.high_watermark().max(0) as u64;
        let next = u64::try_from(part.last_offset()).ok().and_then(|last| last.checked_add(1));
        if let Some(next) = next.filter(|&next| bytes >= PIPELINE_BYTES && next < leader_hw) {
            std::mem::swap(&mut receiving, &mut appending);
            held = Some((bytes, next));
            continue;
        }
        if bytes > 0 {
            p.log.append_replica(&receiving[..bytes]).await?;
            p.data.notify();
        }
        p.replica.set_follower_hw(leader_hw, p.log.end_offset().0);
    }
    Ok(())
}

/// `fut`, unless this fetcher is told to stop first (a new role): a fetch
/// held by a frozen leader is given up at once instead of at
/// [`IO_TIMEOUT`], and its connection closed. The shard notifies the
/// partition's data after every role change, which wakes the wait.
async fn unless_stopped<T>(
    p: &Partition,
    stop: &Cell<bool>,
    fut: impl Future<Output = Result<T, FetchError>>,
) -> Result<T, FetchError> {
    use futures_lite::future::FutureExt;
    let stopped = async {
        loop {
            let seen = p.data.generation();
            if stop.get() {
                return Err(FetchError::Stopped);
            }
            p.data.changed(seen).await;
        }
    };
    fut.or(stopped).await
}

async fn timed<T>(fut: impl Future<Output = T>) -> Result<T, FetchError> {
    use futures_lite::future::FutureExt;
    async { Ok(fut.await) }
        .or(async {
            glommio::timer::sleep(IO_TIMEOUT).await;
            Err(FetchError::Timeout)
        })
        .await
}

/// Sends one request and reads its answer: the envelope, and the payload's
/// length, read into the front of `payload` (grown as needed, never
/// cleared: a buffer is reused from fetch to fetch).
async fn round_trip(
    conn: &mut TcpStream,
    request: &[u8],
    limits: &FrameLimits,
    payload: &mut Vec<u8>,
) -> Result<(Vec<u8>, usize), FetchError> {
    timed(conn.write_all(request)).await??;
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    timed(conn.read_exact(&mut prefix)).await??;
    let len = frame::decode_prefix(prefix);
    limits.check_header_len(len).map_err(|e| FetchError::Protocol(e.to_string()))?;
    let mut header = vec![0u8; len as usize];
    timed(conn.read_exact(&mut header)).await??;
    let frame = limits.verify_response(&header).map_err(|e| FetchError::Protocol(e.to_string()))?;
    check_answer(frame.error(), frame.error_message())?;
    let payload_len = frame.payload_bytes();
    limits.check_payload_len(payload_len).map_err(|e| FetchError::Protocol(e.to_string()))?;
    let n = payload_len as usize;
    if payload.len() < n {
        payload.resize(n, 0);
    }
    timed(conn.read_exact(&mut payload[..n])).await??;
    Ok((header, n))
}

/// Where a replica fetch reads from and what it tells the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ask {
    from: u64,
    /// This log's written end (the leader's view of this follower).
    log_end: u64,
    epoch: i32,
    max_wait_ms: u32,
}

impl Ask {
    /// From the log end: the leader may hold it until data comes.
    fn at(log_end: u64, epoch: i32) -> Ask {
        Ask { from: log_end, log_end, epoch, max_wait_ms: FETCH_MAX_WAIT_MS }
    }

    /// From past the log end while an append runs: answered at once.
    fn ahead(from: u64, log_end: u64, epoch: i32) -> Ask {
        Ask { from, log_end, epoch, max_wait_ms: 0 }
    }
}

fn encode_replica_fetch(corr: u32, topic: &str, partition: u32, me: i32, ask: Ask) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let t = fbb.create_string(topic);
    let part = wire::FetchPartition::create(
        &mut fbb,
        &wire::FetchPartitionArgs {
            topic: Some(t),
            partition,
            fetch_offset: ask.from as i64,
            partition_max_bytes: FETCH_BYTES,
            current_leader_epoch: ask.epoch,
            replica_log_end: ask.log_end as i64,
        },
    );
    let partitions = fbb.create_vector(&[part]);
    let body = wire::FetchRequest::create(
        &mut fbb,
        &wire::FetchRequestArgs {
            replica_id: me,
            max_wait_ms: ask.max_wait_ms,
            min_bytes: 1,
            max_bytes: FETCH_BYTES,
            partitions: Some(partitions),
        },
    );
    frame::request_envelope(
        fbb,
        corr,
        CLIENT_ID,
        ApiKey::Fetch,
        wire::RequestBody::FetchRequest,
        body.as_union_value(),
        0,
    )
}

fn encode_epoch_query(corr: u32, topic: &str, partition: u32, me: i32, epoch: i32, current: i32) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(256);
    let t = fbb.create_string(topic);
    let q = wire::EpochQuery::create(
        &mut fbb,
        &wire::EpochQueryArgs {
            topic: Some(t),
            partition,
            leader_epoch: epoch,
            current_leader_epoch: current,
        },
    );
    let partitions = fbb.create_vector(&[q]);
    let body = wire::OffsetsForLeaderEpochRequest::create(
        &mut fbb,
        &wire::OffsetsForLeaderEpochRequestArgs { replica_id: me, partitions: Some(partitions) },
    );
    frame::request_envelope(
        fbb,
        corr,
        CLIENT_ID,
        ApiKey::OffsetsForLeaderEpoch,
        wire::RequestBody::OffsetsForLeaderEpochRequest,
        body.as_union_value(),
        0,
    )
}

/// The leader's (epoch, end offset) for the one partition asked about.
fn decode_epoch_answer(header: &[u8], limits: &FrameLimits) -> Result<(i32, u64), FetchError> {
    let frame = limits.verify_response(header).map_err(|e| FetchError::Protocol(e.to_string()))?;
    let body = frame
        .body_as_offsets_for_leader_epoch_response()
        .ok_or_else(|| FetchError::Protocol("no OffsetsForLeaderEpoch body".into()))?;
    let part = body.partitions().and_then(|v| v.iter().next()).ok_or_else(no_partition)?;
    check_answer(part.error(), part.error_message())?;
    Ok((part.leader_epoch(), part.end_offset().max(0) as u64))
}

fn no_partition() -> FetchError {
    FetchError::Protocol("no partition in the answer".into())
}

/// A partition's (or a whole frame's) error code as a `FetchError`.
fn check_answer(code: ErrorCode, message: Option<&str>) -> Result<(), FetchError> {
    if code == ErrorCode::None {
        return Ok(());
    }
    Err(FetchError::Refused { code, message: message.unwrap_or_default().to_string() })
}
