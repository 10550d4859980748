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

mod ports;

pub use ports::*;

/// A glommio listener over a socket bound by [`bind_ports`], on the shard
/// that will accept on it.
pub fn into_listener(socket: socket2::Socket) -> TcpListener {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the fd is a bound, listening socket that `socket` owned and
    // gives up here; the TcpListener takes ownership and closes it.
    unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) }
}

/// A connection's server (native protocol, Kafka protocol).
pub type ServeFn =
    fn(Rc<ShardContext>, TcpStream) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Accepts native-protocol connections until the shard stops.
pub async fn accept_loop(ctx: Rc<ShardContext>, listener: TcpListener, name: &'static str) {
    accept_connections(ctx, listener, name, |ctx, stream| {
        Box::pin(async move { serve_connection(&ctx, stream).await })
    })
    .await;
}

/// Accepts connections until the shard stops and serves each with `serve`,
/// within the broker's connection limit (shared by every listener).
pub async fn accept_connections(
    ctx: Rc<ShardContext>,
    listener: TcpListener,
    name: &'static str,
    serve: ServeFn,
) {
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
        let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        // Every line logged while serving the connection names it (the span
        // is entered per poll of its task, never per record).
        let span = tracing::info_span!("conn", shard = %ctx.id, listener = name, %peer);
        // Registered here, not when the task first runs: a shutdown that
        // comes before that must still shut this socket down (a detached
        // task the executor never polls again keeps its socket open, and
        // the peer would wait on it for ever).
        let tracked = TrackedSocket::new(&ctx, stream.as_raw_fd());
        glommio::spawn_local(tracing::Instrument::instrument(
            async move {
                let _tracked = tracked;
                if !ctx.shutting_down.get() {
                    serve(ctx.clone(), stream).await;
                }
            },
            span,
        ))
        .detach();
    }
}

/// A connection counted against the limit and registered for shutdown
/// while its task holds its socket; unregistered when the task ends or is
/// dropped unfinished (the socket goes with it).
struct TrackedSocket {
    ctx: Rc<ShardContext>,
    id: u64,
}

impl TrackedSocket {
    fn new(ctx: &Rc<ShardContext>, fd: std::os::fd::RawFd) -> TrackedSocket {
        ctx.connections.set(ctx.connections.get() + 1);
        TrackedSocket { ctx: ctx.clone(), id: ctx.track_socket(fd) }
    }
}

impl Drop for TrackedSocket {
    fn drop(&mut self) {
        self.ctx.sockets.borrow_mut().remove(&self.id);
        self.ctx.connections.set(self.ctx.connections.get() - 1);
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
    /// A deadline passed (idle, or a frame arriving too slowly): close.
    TimedOut(&'static str),
    /// The peer broke the protocol: answer with this error, then close.
    Reject { code: ErrorCode, message: String },
}

async fn serve_connection(ctx: &Rc<ShardContext>, stream: TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let writer_stream = match clone_stream(&stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate socket; closing connection");
            return;
        }
    };
    let in_flight_max = ctx.config.limits.in_flight_per_connection_max;
    let (tx, rx) = local_channel::new_bounded::<Reply>(in_flight_max);
    // Handlers each hold a clone; the writer ends when the last one is gone.
    let tx = Rc::new(tx);
    let writer = glommio::spawn_local(write_loop(ctx.clone(), writer_stream, rx));
    let mut reader = stream.buffered();
    let stop = read_loop(ctx, &mut reader, &tx).await;
    match stop {
        Stop::Reject { code, message } => {
            ShardMetrics::inc(&ctx.metrics.rejected_frames);
            tracing::warn!(error = ?code, detail = %message, "closing connection after a bad frame");
            let answer = dispatch::request_error(0, ApiKey::ApiVersions, code, &message);
            let _closed = tx.send((answer, None, Unanswered::new(ctx))).await;
        }
        Stop::TimedOut(why) => {
            ShardMetrics::inc(&ctx.metrics.connections_timed_out);
            tracing::debug!(why, "closing connection");
        }
        Stop::Closed => {}
    }
    // The writer finishes once every handler has dropped its sender.
    drop(tx);
    writer.await;
}

async fn read_loop(
    ctx: &Rc<ShardContext>,
    reader: &mut TcpStream<glommio::net::Preallocated>,
    tx: &Rc<local_channel::LocalSender<Reply>>,
) -> Stop {
    let limits = FrameLimits {
        header_bytes_max: ctx.config.limits.header_bytes_max,
        payload_bytes_max: ctx.config.limits.request_payload_bytes_max,
    };
    let in_flight = Rc::new(Semaphore::new(ctx.config.limits.in_flight_per_connection_max as u64));
    let answer_budget = ctx.config.limits.connection_fetch_bytes_max.max(1);
    let answer_bytes = Rc::new(Semaphore::new(answer_budget));
    let (idle_max, read_max) =
        (ctx.config.limits.connection_idle_max, ctx.config.limits.request_read_timeout);
    loop {
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        // Waiting for a request is bounded by the idle limit (counted from
        // the last request's arrival, in-flight ones included: a long-poll
        // is at most `fetch_wait_ms_max`); once it starts, the envelope must
        // arrive within the read timeout.
        if let Err(stop) = within(idle_max, "idle", reader.read_exact(&mut prefix[..1])).await {
            return stop;
        }
        let mut header = Vec::new();
        let envelope = async {
            reader.read_exact(&mut prefix[1..]).await?;
            let len = frame::decode_prefix(prefix);
            if let Err(e) = limits.check_header_len(len) {
                return Ok(Err(Stop::Reject { code: ErrorCode::RequestTooLarge, message: e.to_string() }));
            }
            // Grown as bytes arrive: a peer that announces a large envelope
            // and sends nothing holds no memory for it.
            while header.len() < len as usize {
                let at = header.len();
                header.resize(at + (len as usize - at).min(ENVELOPE_READ_CHUNK), 0);
                reader.read_exact(&mut header[at..]).await?;
            }
            Ok(Ok(()))
        };
        match within(read_max, "request read timeout", envelope).await {
            Ok(Ok(())) => {}
            Ok(Err(stop)) | Err(stop) => return stop,
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
        if let Err(stop) = within(read_max, "request read timeout", reader.read_exact(&mut payload)).await {
            return stop;
        }
        // A fetch holds its answer's bytes (at most what it may return)
        // against the connection's budget until the writer has sent it, so
        // a client that does not read its answers cannot make the broker
        // hold more than that for it.
        let answer_permit = match fetch_answer_bytes(&limits, &header, ctx.config.limits.fetch_bytes_max) {
            0 => None,
            n => match answer_bytes.acquire_static_permit(n.min(answer_budget)).await {
                Ok(p) => Some(p),
                Err(_) => return Stop::Closed,
            },
        };
        let (ctx, tx) = (ctx.clone(), tx.clone());
        let unanswered = Unanswered::new(&ctx);
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
                let _gone = tx.send((out, answer_permit, unanswered)).await;
            }
            drop(slot);
        })
        .detach();
    }
}

/// A response on its way to the writer, with the fetch-bytes permit it
/// holds until written (`Limits::connection_fetch_bytes_max`) and its
/// request's place in the shard's in-flight count.
type Reply = (Outgoing, Option<glommio::sync::StaticPermit>, Unanswered);

/// A request counted in `ShardContext::in_flight` from its arrival until
/// its answer is written to the socket (or given up with the connection).
/// A graceful shutdown waits for the count to reach zero before it shuts
/// the sockets down: a request handled but not yet answered when the
/// sockets close was stored, and its client would send it again.
pub(crate) struct Unanswered(Rc<ShardContext>);

impl Unanswered {
    pub(crate) fn new(ctx: &Rc<ShardContext>) -> Unanswered {
        ctx.in_flight.set(ctx.in_flight.get() + 1);
        Unanswered(ctx.clone())
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.0.in_flight.set(self.0.in_flight.get() - 1);
    }
}

/// The most record bytes a fetch envelope may be answered with (0 for
/// other requests).
fn fetch_answer_bytes(limits: &FrameLimits, header: &[u8], cap: u32) -> u64 {
    match limits.verify_request(header) {
        Ok(f) if f.api_key() == ApiKey::Fetch => {
            f.body_as_fetch_request().map_or(0, |r| u64::from(r.max_bytes().min(cap)))
        }
        _ => 0,
    }
}

/// Envelope bytes are read (and their buffer grown) this much at a time.
const ENVELOPE_READ_CHUNK: usize = 64 << 10;

/// Runs a socket operation under a deadline: `Closed` if it fails,
/// `TimedOut(why)` if the deadline passes first.
async fn within<T>(
    limit: Duration,
    why: &'static str,
    op: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, Stop> {
    let op = async { Some(op.await) };
    let deadline = async {
        glommio::timer::sleep(limit).await;
        None
    };
    match futures_lite::future::or(op, deadline).await {
        Some(Ok(v)) => Ok(v),
        Some(Err(_)) => Err(Stop::Closed),
        None => Err(Stop::TimedOut(why)),
    }
}

/// Responses ready at once are coalesced into one send up to this size.
const WRITE_COALESCE_BYTES_MAX: usize = 256 << 10;

/// Writes responses as they complete, coalescing what is ready into one send.
async fn write_loop(ctx: Rc<ShardContext>, stream: TcpStream, rx: local_channel::LocalReceiver<Reply>) {
    let splice = ctx.splicer.clone().and_then(|s| match clone_fd(&stream) {
        Ok(fd) => Some((s, Rc::new(fd))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate socket for splice; using read + send");
            None
        }
    });
    let write_max = ctx.config.limits.response_write_timeout;
    // The buffer grows with what is written and is released when large, so
    // idle connections hold no send buffer.
    let mut w = Writer { ctx, stream, buf: Vec::new(), splice, write_max };
    while let Some(first) = rx.recv().await {
        let mut out = first;
        // Permits and counts of the answers in the buffer, released once it
        // is sent.
        let mut sent_with = Vec::new();
        loop {
            let (out_now, permit, unanswered) = out;
            sent_with.push((permit, unanswered));
            if let Err(e) = w.push(out_now).await {
                tracing::debug!(error = %e, "response write failed; closing connection");
                drop(sent_with);
                return give_up(w, rx).await;
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
            drop(sent_with);
            return give_up(w, rx).await;
        }
        drop(sent_with);
        if w.buf.capacity() > WRITE_COALESCE_BYTES_MAX {
            w.buf = Vec::new();
        }
    }
    let _closed = w.stream.flush().await;
    let _closed = w.stream.shutdown(std::net::Shutdown::Write).await;
}

/// After a failed write: shuts the socket down, then takes and drops the
/// answers still coming until every handler is done. A handler waiting on a
/// full channel whose receiver is gone would wait for ever (glommio's send
/// does not notice), holding its request's `Unanswered`, and every graceful
/// shutdown after would wait its full drain time.
async fn give_up(w: Writer, rx: local_channel::LocalReceiver<Reply>) {
    w.abort().await;
    while rx.recv().await.is_some() {}
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
    /// A write that makes no progress for this long fails (the peer does
    /// not read): `Limits::response_write_timeout`.
    write_max: Duration,
}

impl Writer {
    /// After a failed write: shuts the socket down both ways, so that the
    /// reader (which holds its own handle on the socket) stops too and the
    /// peer sees the connection end instead of a half-dead one.
    async fn abort(self) {
        let _closed = self.stream.shutdown(std::net::Shutdown::Both).await;
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        let mut at = 0;
        while at < self.buf.len() {
            let write = self.stream.write(&self.buf[at..]);
            match within(self.write_max, "response write timeout", write).await {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(Stop::TimedOut(why)) => {
                    ShardMetrics::inc(&self.ctx.metrics.connections_timed_out);
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why));
                }
                Err(_) => return Err(std::io::ErrorKind::BrokenPipe.into()),
            }
        }
        self.buf.clear();
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
