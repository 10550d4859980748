//! Listeners, connections and framing.
//!
//! Every shard accepts on the shared public port (SO_REUSEPORT: the kernel
//! spreads connections over shards) and on its own port (the one Metadata
//! names for the partitions it owns). A connection is served by two tasks of
//! the accepting shard:
//!
//! ```text
//!   socket ──> reader: frame → verify → spawn handler ──┐  (≤ in-flight limit)
//!   socket <── writer <── responses, in completion order ┘
//! ```
//!
//! **Invariants**: nothing read from the network is trusted: lengths are
//! checked against limits before allocation, envelopes are verified before a
//! field is read, and a bad frame costs only its own connection.
//! **API boundary**: `net` never interprets a request body; that is `dispatch`.

use crate::dispatch::{self, DataChunk, Outgoing};
use crate::io::splice::Splicer;
use crate::log::{ReadChunk, SegmentFile};
use crate::metrics::{ServePath, ShardMetrics};
use crate::shard::ShardContext;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::Semaphore;
use shardlog_schema::frame::{self, FrameLimits, LENGTH_PREFIX_BYTES};
use shardlog_schema::wire::{ApiKey, ErrorCode};
use std::any::Any;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Binds a listener with SO_REUSEPORT (every shard accepts on the public
/// port) and SO_REUSEADDR (a restart or a port that just served short-lived
/// connections must not fail with EADDRINUSE because of TIME_WAIT).
pub fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd, IntoRawFd};
    let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    // SAFETY: the fd is a freshly created, bound and listening socket that
    // nothing else owns; the TcpListener takes ownership and closes it.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Accepts connections until the shard stops.
pub async fn accept_loop(ctx: Rc<ShardContext>, listener: TcpListener, name: &'static str) {
    let per_shard_max = ctx.config.limits.connections_max.div_ceil(ctx.config.shards).max(1);
    let mut failures = AcceptFailures::default();
    let mut refused = LogThrottle::default();
    loop {
        let Some(stream) = accept_next(&ctx, &listener, name, &mut failures).await else {
            return;
        };
        if ctx.shutting_down.get() {
            return;
        }
        if ctx.connections.get() >= per_shard_max {
            if let Some(suppressed) = refused.hit(Instant::now()) {
                tracing::warn!(limit = per_shard_max, shard = %ctx.id, suppressed,
                    "connection limit reached; closing new connection");
            }
            drop(stream);
            continue;
        }
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            ctx.connections.set(ctx.connections.get() + 1);
            let id = ctx.track_socket(stream.as_raw_fd());
            serve_connection(&ctx, stream).await;
            ctx.sockets.borrow_mut().remove(&id);
            ctx.connections.set(ctx.connections.get() - 1);
        })
        .detach();
    }
}

/// Accepts the next connection on `listener`; `None` once the shard is
/// shutting down. Every listener of the broker (public, shard, admin) accepts
/// through this. Out of file descriptors (EMFILE/ENFILE) or memory, accept
/// fails again at once: it backs off (see [`AcceptFailures`]) and says so
/// once per interval rather than once per attempt.
pub(crate) async fn accept_next(
    ctx: &ShardContext,
    listener: &TcpListener,
    name: &'static str,
    failures: &mut AcceptFailures,
) -> Option<TcpStream> {
    loop {
        match listener.accept().await {
            Ok(s) => {
                if let Some(count) = failures.recovered() {
                    tracing::info!(listener = name, shard = %ctx.id, failures = count, "accepting again");
                }
                return Some(s);
            }
            Err(e) => {
                if ctx.shutting_down.get() {
                    return None;
                }
                let (pause, report) = failures.failed(Instant::now());
                if let Some(suppressed) = report {
                    tracing::warn!(listener = name, shard = %ctx.id, error = %e, suppressed,
                        retry_in_ms = pause.as_millis() as u64, "accept failed");
                }
                glommio::timer::sleep(pause).await;
            }
        }
    }
}

/// Lets a repeated warning through once per interval, counting the ones it
/// held back, so a condition that recurs per attempt cannot flood the log.
#[derive(Debug, Default)]
struct LogThrottle {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    const INTERVAL: Duration = Duration::from_secs(5);

    /// `Some(n)` when this occurrence should be logged, `n` being how many
    /// were held back since the last one logged.
    fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < Self::INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Back-off for a failing `accept`: 10 ms doubling to 1 s, reset by the
/// next success.
#[derive(Debug, Default)]
pub(crate) struct AcceptFailures {
    consecutive: u64,
    log: LogThrottle,
}

impl AcceptFailures {
    const FIRST_PAUSE: Duration = Duration::from_millis(10);
    const MAX_PAUSE: Duration = Duration::from_secs(1);

    /// How long to pause before the next attempt, and whether to log this
    /// failure (with the count of failures not logged since the last one).
    fn failed(&mut self, now: Instant) -> (Duration, Option<u64>) {
        let doublings = self.consecutive.min(7) as u32;
        self.consecutive += 1;
        let pause = (Self::FIRST_PAUSE * 2u32.pow(doublings)).min(Self::MAX_PAUSE);
        (pause, self.log.hit(now))
    }

    /// After a success: the number of consecutive failures it ends, if any.
    fn recovered(&mut self) -> Option<u64> {
        let count = std::mem::take(&mut self.consecutive);
        self.log = LogThrottle::default();
        (count > 0).then_some(count)
    }
}

/// A second handle on the same socket, so the writer task can own one.
fn clone_stream(stream: &TcpStream) -> std::io::Result<TcpStream> {
    let owned = clone_fd(stream)?;
    Ok(TcpStream::from(socket2::Socket::from(std::net::TcpStream::from(owned))))
}

/// Why the reader stopped.
enum Stop {
    /// Peer closed or the connection broke: nothing to answer.
    Closed,
    /// The peer broke the protocol: answer with this error, then close.
    Reject { code: ErrorCode, message: String },
}

async fn serve_connection(ctx: &Rc<ShardContext>, stream: TcpStream) {
    let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    let writer_stream = match clone_stream(&stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot duplicate socket; closing connection");
            return;
        }
    };
    let in_flight_max = ctx.config.limits.in_flight_per_connection_max;
    let (tx, rx) = local_channel::new_bounded::<Outgoing>(in_flight_max);
    // Handlers each hold a clone; the writer ends when the last one is gone.
    let tx = Rc::new(tx);
    let writer = glommio::spawn_local(write_loop(ctx.clone(), writer_stream, rx));
    let mut reader = stream.buffered();
    let stop = read_loop(ctx, &mut reader, &tx).await;
    if let Stop::Reject { code, message } = stop {
        ShardMetrics::inc(&ctx.metrics.rejected_frames);
        tracing::warn!(%peer, error = ?code, %message, "closing connection after a bad frame");
        let _closed = tx.send(dispatch::request_error(0, ApiKey::ApiVersions, code, &message)).await;
    }
    // The writer finishes once every handler has dropped its sender.
    drop(tx);
    writer.await;
}

async fn read_loop(
    ctx: &Rc<ShardContext>,
    reader: &mut TcpStream<glommio::net::Preallocated>,
    tx: &Rc<local_channel::LocalSender<Outgoing>>,
) -> Stop {
    let limits = FrameLimits {
        header_bytes_max: ctx.config.limits.header_bytes_max,
        payload_bytes_max: ctx.config.limits.request_payload_bytes_max,
    };
    let in_flight = Rc::new(Semaphore::new(ctx.config.limits.in_flight_per_connection_max as u64));
    loop {
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        if reader.read_exact(&mut prefix).await.is_err() {
            return Stop::Closed;
        }
        let len = frame::decode_prefix(prefix);
        if let Err(e) = limits.check_header_len(len) {
            return Stop::Reject { code: ErrorCode::RequestTooLarge, message: e.to_string() };
        }
        let mut header = vec![0u8; len as usize];
        if reader.read_exact(&mut header).await.is_err() {
            return Stop::Closed;
        }
        let payload_len = match limits.verify_request(&header) {
            Ok(f) => f.payload_bytes(),
            Err(e) => return Stop::Reject { code: ErrorCode::InvalidRequest, message: e.to_string() },
        };
        if let Err(e) = limits.check_payload_len(payload_len) {
            return Stop::Reject { code: ErrorCode::RequestTooLarge, message: e.to_string() };
        }
        // Back-pressure: hold the payload's bytes against the shard budget
        // and a slot of the connection's in-flight window until answered.
        let bytes_permit = match ctx.buffered_bytes.acquire_static_permit(u64::from(payload_len)).await {
            Ok(p) => p,
            Err(_) => return Stop::Closed,
        };
        let slot = match in_flight.acquire_static_permit(1).await {
            Ok(p) => p,
            Err(_) => return Stop::Closed,
        };
        let mut payload = vec![0u8; payload_len as usize];
        if reader.read_exact(&mut payload).await.is_err() {
            return Stop::Closed;
        }
        let (ctx, tx) = (ctx.clone(), tx.clone());
        ctx.in_flight.set(ctx.in_flight.get() + 1);
        glommio::spawn_local(async move {
            // The envelope was verified above; verifying again here (instead
            // of an unchecked re-parse) keeps this path free of unsafe.
            let out = match limits.verify_request(&header) {
                Ok(frame) => dispatch::handle(&ctx, frame, &payload).await,
                Err(e) => {
                    dispatch::request_error(0, ApiKey::ApiVersions, ErrorCode::InvalidRequest, &e.to_string())
                }
            };
            drop(payload);
            drop(bytes_permit);
            if !matches!(out, Outgoing::Nothing) {
                // A closed writer means the peer is gone; the work is done anyway.
                let _gone = tx.send(out).await;
            }
            drop(slot);
            ctx.in_flight.set(ctx.in_flight.get() - 1);
        })
        .detach();
    }
}

/// Responses ready at once are coalesced into one send up to this size.
const WRITE_COALESCE_BYTES_MAX: usize = 256 << 10;

/// Writes responses as they complete, coalescing what is ready into one send.
async fn write_loop(ctx: Rc<ShardContext>, stream: TcpStream, rx: local_channel::LocalReceiver<Outgoing>) {
    let splice = ctx.splicer.clone().and_then(|s| match clone_fd(&stream) {
        Ok(fd) => Some((s, Rc::new(fd))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate socket for splice; using read + send");
            None
        }
    });
    let mut w = Writer { ctx, stream, buf: Vec::with_capacity(64 << 10), splice };
    while let Some(first) = rx.recv().await {
        let mut out = first;
        loop {
            if let Err(e) = w.push(out).await {
                tracing::debug!(error = %e, "response write failed; closing connection");
                return;
            }
            if w.buf.len() >= WRITE_COALESCE_BYTES_MAX {
                break;
            }
            match futures_lite::future::poll_once(rx.recv()).await {
                Some(Some(more)) => out = more,
                _ => break,
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    let _closed = w.stream.flush().await;
    let _closed = w.stream.shutdown(std::net::Shutdown::Write).await;
}

/// Appends exactly `n` bytes of `file` from `at` to `out`.
async fn read_range(file: &SegmentFile, at: u64, n: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
    match file.read_into(at, n, out).await {
        Ok(got) if got == n => Ok(()),
        Ok(_) => Err(std::io::Error::other("segment ended before the range to send")),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// A duplicate of the socket's fd, kept alive by splice operations in flight.
fn clone_fd(stream: &TcpStream) -> std::io::Result<OwnedFd> {
    // SAFETY: the fd belongs to `stream`, which outlives this borrow; the
    // borrow is used only to duplicate the descriptor.
    unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) }.try_clone_to_owned()
}

struct Writer {
    ctx: Rc<ShardContext>,
    stream: TcpStream,
    buf: Vec<u8>,
    /// The shard's splice engine and this socket's fd for it, when splicing.
    splice: Option<(Rc<Splicer>, Rc<OwnedFd>)>,
}

impl Writer {
    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.stream.write_all(&self.buf).await?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Queues one response; file ranges are spliced (after flushing what is
    /// queued before them) or read and copied on the plain path.
    async fn push(&mut self, out: Outgoing) -> std::io::Result<()> {
        let ctx = self.ctx.clone();
        let metrics = &ctx.metrics;
        match out {
            Outgoing::Frame(bytes) => self.buf.extend_from_slice(&bytes),
            Outgoing::Nothing => {}
            Outgoing::Data { header, chunks } => {
                self.buf.extend_from_slice(&header);
                for chunk in chunks {
                    match chunk {
                        DataChunk::Bytes(b) => {
                            metrics.count_fetch_bytes(ServePath::Plain, b.len());
                            self.buf.extend_from_slice(&b);
                        }
                        DataChunk::Log(ReadChunk::Memory(b)) => {
                            metrics.count_fetch_bytes(ServePath::HotTail, b.len());
                            self.buf.extend_from_slice(&b);
                        }
                        DataChunk::Log(ReadChunk::File { file, position, len }) => {
                            if let Some((splicer, sock)) = self.splice.clone() {
                                self.flush().await?;
                                let keep: [Rc<dyn Any>; 2] = [file.clone(), sock.clone()];
                                splicer
                                    .splice_to_socket(file.raw_fd(), position, len, sock.as_raw_fd(), &keep)
                                    .await?;
                                metrics.count_fetch_bytes(ServePath::Splice, len);
                            } else {
                                // One read of the whole range (up to a fetch's
                                // size): O_DIRECT handles turn it into large
                                // concurrent device requests, which measured
                                // faster than chunks overlapped with the send.
                                read_range(&file, position, len, &mut self.buf).await?;
                                metrics.count_fetch_bytes(ServePath::Plain, len);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{AcceptFailures, LogThrottle};
    use std::time::{Duration, Instant};

    #[test]
    fn throttle_logs_once_per_interval_and_counts_the_rest() {
        let mut t = LogThrottle::default();
        let t0 = Instant::now();
        assert_eq!(t.hit(t0), Some(0));
        for i in 1..=99 {
            assert_eq!(t.hit(t0 + Duration::from_millis(i * 10)), None);
        }
        assert_eq!(t.hit(t0 + LogThrottle::INTERVAL), Some(99));
        assert_eq!(t.hit(t0 + LogThrottle::INTERVAL + Duration::from_millis(1)), None);
    }

    #[test]
    fn accept_back_off_doubles_to_a_cap_and_resets_on_success() {
        let mut f = AcceptFailures::default();
        let now = Instant::now();
        let pauses: Vec<u128> = (0..10).map(|_| f.failed(now).0.as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(f.recovered(), Some(10));
        assert_eq!(f.recovered(), None);
        let (pause, report) = f.failed(now);
        assert_eq!(pause, Duration::from_millis(10));
        assert_eq!(report, Some(0), "the first failure after a recovery is logged");
    }
}
