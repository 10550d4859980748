//! One TCP connection to one broker shard, shared by every caller.
//!
//! ```text
//!  callers ──submit()──▶ [in-flight permit] ──mpsc──▶ writer task ──write_vectored──▶ socket
//!                                                        │ registers (corr id, reply) first
//!                                                        ▼
//!  callers ◀──oneshot── reader task ◀── frames (verified) ◀────────────────────── socket
//! ```
//!
//! The writer coalesces every queued frame into one vectored write (record
//! batches are separate buffers, never copied into the frame). The reader
//! owns the table of outstanding requests and matches responses by
//! correlation id, in whatever order they come back. A request's in-flight
//! permit is released when its response is delivered, which bounds the
//! requests outstanding per connection. Neither task takes a lock.
//!
//! A connection is given up ([`Health::give_up`]) when a request on it
//! times out or a caller distrusts it: no new request goes on it, and the
//! in-flight semaphore closes, so a caller waiting for a slot gets
//! `ConnectionClosed` at once instead of waiting for answers a hung peer (a
//! frozen broker, a socket nobody closes) never sends. Requests already
//! sent still get their answers, each until its own timeout (a resend of a
//! produce the broker is only slow to answer would store it twice). The
//! reader leaves once no caller waits any more, and the socket closes with
//! the last handle.

use crate::error::{ClientError, Result};
use crate::protocol::RawResponse;
use bytes::{Buf, Bytes, BytesMut};
use shardlog_schema::frame::{FrameLimits, LENGTH_PREFIX_BYTES};
use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};

/// Frames queued for the writer before `submit` waits.
const WRITE_QUEUE_FRAMES_MAX: usize = 256;
/// Buffers per `write_vectored` call (Linux IOV_MAX is 1024).
const IOVECS_MAX: usize = 256;
/// Smallest free space the reader asks the kernel to fill.
const READ_CHUNK_BYTES_MIN: usize = 256 << 10;

type Reply = oneshot::Sender<Result<RawResponse>>;

struct Pending {
    corr: u32,
    reply: Reply,
    _permit: OwnedSemaphorePermit,
}

enum ReaderMsg {
    Expect(Pending),
    WriteFailed(ClientError),
}

struct Outgoing {
    bufs: Vec<Bytes>,
    pending: Option<Pending>,
}

/// Whether a connection may still be used, shared by its handles, its
/// response futures and its reader task.
struct Health {
    /// Set once the connection failed, closed or was given up.
    closed: AtomicBool,
    /// One permit per request that may be outstanding; closed with the
    /// connection, which wakes every caller waiting for a slot.
    in_flight: Arc<Semaphore>,
    /// Tells the reader the connection was given up (a permit is kept if
    /// it is not waiting).
    given_up: Notify,
}

impl Health {
    /// Gives the connection up: no new request goes on it, callers waiting
    /// for a slot fail, and the reader leaves once nobody waits for an
    /// answer.
    fn give_up(&self) {
        self.mark_closed();
        self.given_up.notify_one();
    }

    fn mark_closed(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.in_flight.close();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// How often the reader of a given-up connection looks whether anybody
/// still waits for an answer.
const GIVEN_UP_CHECK: Duration = Duration::from_millis(100);

/// Tells connections apart (also two to one address, one given up).
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

struct Inner {
    addr: String,
    id: u64,
    next_corr: AtomicU32,
    tx: mpsc::Sender<Outgoing>,
    health: Arc<Health>,
    request_timeout: Duration,
}

/// A cheap-to-clone handle to one connection.
#[derive(Clone)]
pub(crate) struct Connection {
    inner: Arc<Inner>,
}

/// The settings a connection needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnOptions {
    pub max_in_flight: usize,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub limits: FrameLimits,
}

/// The answer to one submitted request (a response or, for requests that get
/// none, nothing).
pub(crate) struct ResponseFuture {
    rx: Option<oneshot::Receiver<Result<RawResponse>>>,
    addr: String,
    timeout: Duration,
    /// The connection's state: a timed-out request gives it up.
    health: Arc<Health>,
}

impl ResponseFuture {
    /// Gives the connection up (the next caller reconnects), as a request
    /// timeout does: for a caller that gives the request up before its
    /// timeout.
    pub fn distrust_handle(&self) -> impl Fn() + Send + 'static {
        let health = self.health.clone();
        move || health.give_up()
    }

    /// Waits for the response, up to the request timeout (plus `extra`, for
    /// long-polling fetches).
    pub async fn wait(self, extra: Duration) -> Result<RawResponse> {
        let Some(rx) = self.rx else {
            return Err(ClientError::Protocol("request expects no response".into()));
        };
        match tokio::time::timeout(self.timeout + extra, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ClientError::ConnectionClosed(self.addr)),
            Err(_) => {
                // A peer that stops answering (a hung broker, or a socket a
                // stopped broker never closed) is not trusted again: the next
                // caller reconnects (Kafka does the same on request timeout),
                // and what else waits on it fails now, not never.
                self.health.give_up();
                Err(ClientError::Timeout)
            }
        }
    }
}

impl Connection {
    /// Connects and starts the reader and writer tasks.
    pub async fn connect(addr: &str, opts: ConnOptions) -> Result<Connection> {
        let stream = match tokio::time::timeout(opts.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(ClientError::io(addr, e)),
            Err(_) => return Err(ClientError::Timeout),
        };
        stream.set_nodelay(true).map_err(|e| ClientError::io(addr, e))?;
        Ok(Connection::from_stream(stream, addr, opts))
    }

    pub(crate) fn from_stream(stream: TcpStream, addr: &str, opts: ConnOptions) -> Connection {
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
        let (reader_tx, reader_rx) = mpsc::unbounded_channel();
        let health = Arc::new(Health {
            closed: AtomicBool::new(false),
            in_flight: Arc::new(Semaphore::new(opts.max_in_flight.max(1))),
            given_up: Notify::new(),
        });
        tokio::spawn(writer_task(write, rx, reader_tx, addr.to_string()));
        tokio::spawn(reader_task(read, reader_rx, opts.limits, health.clone(), addr.to_string()));
        Connection {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
                next_corr: AtomicU32::new(1),
                tx,
                health,
                request_timeout: opts.request_timeout,
            }),
        }
    }

    /// This connection's identity, unique in the process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether the connection has failed or closed (callers reconnect).
    pub fn is_closed(&self) -> bool {
        self.inner.health.is_closed() || self.inner.tx.is_closed()
    }

    /// Queues one request: waits for an in-flight permit (when a response is
    /// expected) and for room in the write queue, then returns the future of
    /// the response. Requests submitted one after another from one task go
    /// on the wire in that order.
    ///
    /// `encode` gets the correlation id and returns `[len][envelope]`;
    /// `payload` (raw record batches) is written right after it.
    pub async fn submit(
        &self,
        encode: impl FnOnce(u32) -> Vec<u8>,
        payload: Vec<Bytes>,
        expect_response: bool,
    ) -> Result<ResponseFuture> {
        if self.is_closed() {
            return Err(ClientError::ConnectionClosed(self.inner.addr.clone()));
        }
        let closed = || ClientError::ConnectionClosed(self.inner.addr.clone());
        let permit = if expect_response {
            // Fails once the connection is given up while this waits.
            Some(self.inner.health.in_flight.clone().acquire_owned().await.map_err(|_| closed())?)
        } else {
            None
        };
        let corr = self.inner.next_corr.fetch_add(1, Ordering::Relaxed);
        let mut bufs = Vec::with_capacity(1 + payload.len());
        bufs.push(Bytes::from(encode(corr)));
        bufs.extend(payload);
        let (pending, rx) = match permit {
            Some(permit) => {
                let (reply, rx) = oneshot::channel();
                (Some(Pending { corr, reply, _permit: permit }), Some(rx))
            }
            None => (None, None),
        };
        self.inner.tx.send(Outgoing { bufs, pending }).await.map_err(|_| closed())?;
        Ok(ResponseFuture {
            rx,
            addr: self.inner.addr.clone(),
            timeout: self.inner.request_timeout,
            health: self.inner.health.clone(),
        })
    }

    /// Waits until a request expecting a response could take an in-flight
    /// slot at once (the slot is not kept), or the connection is given up.
    pub async fn wait_for_slot(&self) {
        drop(self.inner.health.in_flight.acquire().await);
    }

    /// Submits a request and waits for its response.
    pub async fn call(
        &self,
        encode: impl FnOnce(u32) -> Vec<u8>,
        payload: Vec<Bytes>,
    ) -> Result<RawResponse> {
        self.submit(encode, payload, true).await?.wait(Duration::ZERO).await
    }
}

async fn writer_task(
    mut write: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
    reader_tx: mpsc::UnboundedSender<ReaderMsg>,
    addr: String,
) {
    let mut queued: Vec<Outgoing> = Vec::new();
    let mut bufs: Vec<Bytes> = Vec::new();
    loop {
        if rx.recv_many(&mut queued, WRITE_QUEUE_FRAMES_MAX).await == 0 {
            break; // every handle dropped
        }
        for out in queued.drain(..) {
            if let Some(p) = out.pending {
                // Registered before the bytes hit the wire, so the reader always
                // knows a correlation id before its response can arrive.
                if let Err(mpsc::error::SendError(ReaderMsg::Expect(p))) =
                    reader_tx.send(ReaderMsg::Expect(p))
                {
                    let _ = p.reply.send(Err(ClientError::ConnectionClosed(addr.clone())));
                }
            }
            bufs.extend(out.bufs);
        }
        if let Err(e) = write_all_vectored(&mut write, &mut bufs).await {
            tracing::debug!(%addr, error = %e, "write failed; closing connection");
            let _ = reader_tx.send(ReaderMsg::WriteFailed(ClientError::io(&addr, e)));
            return;
        }
    }
    let _ = write.shutdown().await;
}

/// Writes every buffer in order with as few syscalls as the kernel allows.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    bufs: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut first = 0usize;
    while first < bufs.len() {
        let slices: Vec<IoSlice<'_>> =
            bufs[first..].iter().take(IOVECS_MAX).map(|b| IoSlice::new(b)).collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let b = &mut bufs[first];
            if n >= b.len() {
                n -= b.len();
                first += 1;
            } else {
                b.advance(n);
                n = 0;
            }
        }
        while first < bufs.len() && bufs[first].is_empty() {
            first += 1;
        }
    }
    bufs.clear();
    Ok(())
}

/// A frame whose envelope has been verified but whose bytes are not all in yet.
#[derive(Clone, Copy)]
struct FrameShape {
    header_bytes: usize,
    payload_bytes: usize,
    corr: u32,
}

impl FrameShape {
    fn total(&self) -> usize {
        LENGTH_PREFIX_BYTES + self.header_bytes + self.payload_bytes
    }
}

/// Reads the frame at the front of `buf` as far as the bytes allow: `Ok(None)`
/// when more bytes are needed. Verifies the envelope as soon as it is in.
fn peek_frame(buf: &[u8], limits: &FrameLimits) -> Result<Option<FrameShape>> {
    if buf.len() < LENGTH_PREFIX_BYTES {
        return Ok(None);
    }
    let header_len = shardlog_schema::frame::decode_prefix(buf[..4].try_into().expect("4 bytes"));
    limits.check_header_len(header_len).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let header_bytes = header_len as usize;
    if buf.len() < LENGTH_PREFIX_BYTES + header_bytes {
        return Ok(None);
    }
    let frame = limits
        .verify_response(&buf[LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + header_bytes])
        .map_err(|e| ClientError::Protocol(format!("response failed verification: {e}")))?;
    limits.check_payload_len(frame.payload_bytes()).map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(Some(FrameShape {
        header_bytes,
        payload_bytes: frame.payload_bytes() as usize,
        corr: frame.correlation_id(),
    }))
}

async fn reader_task(
    mut read: OwnedReadHalf,
    mut rx: mpsc::UnboundedReceiver<ReaderMsg>,
    limits: FrameLimits,
    health: Arc<Health>,
    addr: String,
) {
    let mut pending: HashMap<u32, Pending> = HashMap::new();
    let err = read_loop(&mut read, &mut rx, &mut pending, limits, &health, &addr).await;
    health.mark_closed();
    if !pending.is_empty() {
        tracing::debug!(%addr, error = %err, outstanding = pending.len(), "connection closed");
    }
    for (_, p) in pending.drain() {
        let _ = p.reply.send(Err(err.clone()));
    }
    rx.close();
    while let Ok(msg) = rx.try_recv() {
        if let ReaderMsg::Expect(p) = msg {
            let _ = p.reply.send(Err(err.clone()));
        }
    }
}

/// Runs until the connection fails, or every handle is gone and nothing is
/// outstanding, or it was given up and no caller waits for an answer any
/// more; returns the error to fail outstanding requests with.
async fn read_loop(
    read: &mut OwnedReadHalf,
    rx: &mut mpsc::UnboundedReceiver<ReaderMsg>,
    pending: &mut HashMap<u32, Pending>,
    limits: FrameLimits,
    health: &Health,
    addr: &str,
) -> ClientError {
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES_MIN);
    let mut shape: Option<FrameShape> = None;
    let mut writer_gone = false;
    loop {
        // Deliver every complete frame in the buffer.
        loop {
            if shape.is_none() {
                match peek_frame(&buf, &limits) {
                    Ok(s) => shape = s,
                    Err(e) => return e,
                }
            }
            let Some(s) = shape else { break };
            if buf.len() < s.total() {
                break;
            }
            shape = None;
            buf.advance(LENGTH_PREFIX_BYTES);
            let header = buf.split_to(s.header_bytes).freeze();
            let payload = buf.split_to(s.payload_bytes).freeze();
            if let Some(e) = deliver(pending, rx, RawResponse { header, payload, limits }, s.corr, addr) {
                return e;
            }
        }
        if writer_gone && pending.is_empty() {
            return ClientError::ConnectionClosed(addr.to_string());
        }
        let given_up = health.is_closed();
        if given_up {
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    ReaderMsg::Expect(p) => drop(pending.insert(p.corr, p)),
                    ReaderMsg::WriteFailed(e) => return e,
                }
            }
            // Callers that stopped waiting (their timeout) give up their entry.
            pending.retain(|_, p| !p.reply.is_closed());
            if pending.is_empty() {
                return ClientError::ConnectionClosed(addr.to_string());
            }
        }
        let want = shape.map_or(0, |s| s.total().saturating_sub(buf.len()));
        if buf.capacity() - buf.len() < want.max(READ_CHUNK_BYTES_MIN / 4) {
            buf.reserve(want.max(READ_CHUNK_BYTES_MIN));
        }
        tokio::select! {
            msg = rx.recv(), if !writer_gone => match msg {
                Some(ReaderMsg::Expect(p)) => {
                    pending.insert(p.corr, p);
                }
                Some(ReaderMsg::WriteFailed(e)) => return e,
                None => writer_gone = true,
            },
            n = read.read_buf(&mut buf) => match n {
                Ok(0) => return ClientError::ConnectionClosed(addr.to_string()),
                Ok(_) => {}
                Err(e) => return ClientError::io(addr, e),
            },
            () = health.given_up.notified() => {}
            () = tokio::time::sleep(GIVEN_UP_CHECK), if given_up => {}
        }
    }
}

fn deliver(
    pending: &mut HashMap<u32, Pending>,
    rx: &mut mpsc::UnboundedReceiver<ReaderMsg>,
    response: RawResponse,
    corr: u32,
    addr: &str,
) -> Option<ClientError> {
    let mut failed = None;
    if !pending.contains_key(&corr) {
        // The registration is queued before the request is written; pick it up.
        while let Ok(msg) = rx.try_recv() {
            match msg {
                ReaderMsg::Expect(p) => {
                    pending.insert(p.corr, p);
                }
                ReaderMsg::WriteFailed(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
    }
    match pending.remove(&corr) {
        // The caller may have given up (timeout); that is fine.
        Some(p) => drop(p.reply.send(Ok(response))),
        None => tracing::warn!(%addr, corr, "response for an unknown correlation id ignored"),
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(corr: u32) -> RawResponse {
        RawResponse {
            header: Bytes::from(corr.to_le_bytes().to_vec()),
            payload: Bytes::new(),
            limits: FrameLimits::default(),
        }
    }

    /// Responses matched by correlation id whatever their order, including
    /// ones whose registration is still queued when they arrive; in-flight
    /// permits come back as responses are delivered.
    #[test]
    fn responses_reach_their_callers_in_any_order() {
        let in_flight = Arc::new(Semaphore::new(4));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut pending = HashMap::new();
        let mut replies = Vec::new();
        for corr in 1..=4u32 {
            let (reply, r) = oneshot::channel();
            let permit = in_flight.clone().try_acquire_owned().expect("permit");
            tx.send(ReaderMsg::Expect(Pending { corr, reply, _permit: permit })).expect("queued");
            replies.push((corr, r));
        }
        assert_eq!(in_flight.available_permits(), 0);
        for corr in [4u32, 2, 3, 1] {
            assert!(deliver(&mut pending, &mut rx, response(corr), corr, "peer").is_none());
        }
        // An answer nobody waits for is ignored, not misdelivered.
        assert!(deliver(&mut pending, &mut rx, response(99), 99, "peer").is_none());
        for (corr, mut r) in replies {
            let got = r.try_recv().expect("answered").expect("ok");
            assert_eq!(got.header[..], corr.to_le_bytes());
        }
        assert!(pending.is_empty());
        assert_eq!(in_flight.available_permits(), 4);
    }

    /// A peer that accepts and never answers (a frozen broker, or a socket
    /// a stopped broker never closed): once one request times out, the
    /// connection is given up. A caller waiting for an in-flight slot fails
    /// at once with `ConnectionClosed` (before, it waited for ever: only
    /// answers gave slots back), no new request goes on it, the other
    /// request already sent waits out its own timeout (its answer may still
    /// come), and once nobody waits the socket closes: the peer sees it end.
    #[tokio::test]
    async fn a_timed_out_request_gives_the_connection_up_and_frees_everyone_waiting_on_it() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = silent.local_addr().expect("addr").to_string();
        let peer = tokio::spawn(async move {
            let (mut s, _) = silent.accept().await.expect("accept");
            // Read (never answer) until the client closes its side.
            let mut sink = vec![0u8; 1024];
            while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let opts = ConnOptions {
            max_in_flight: 2,
            request_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(5),
            limits: FrameLimits::default(),
        };
        let conn = Connection::connect(&addr, opts).await.expect("connect");
        let frame = |corr: u32| {
            let mut f = 4u32.to_le_bytes().to_vec();
            f.extend(corr.to_le_bytes());
            f
        };
        let first = conn.submit(frame, Vec::new(), true).await.expect("first");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = conn.submit(frame, Vec::new(), true).await.expect("second");
        // Both slots are taken: a third caller waits for one.
        let waiter = {
            let conn = conn.clone();
            tokio::spawn(async move { conn.submit(frame, Vec::new(), true).await.map(|_| ()) })
        };
        assert!(matches!(first.wait(Duration::ZERO).await, Err(ClientError::Timeout)));
        assert!(conn.is_closed(), "a timed-out request gives the connection up");
        let waited = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the slot waiter is woken, not left waiting")
            .expect("join");
        assert!(matches!(waited, Err(ClientError::ConnectionClosed(_))), "{waited:?}");
        assert!(matches!(conn.submit(frame, Vec::new(), true).await, Err(ClientError::ConnectionClosed(_))));
        // The request already sent is not failed for the other one's sake.
        assert!(matches!(second.wait(Duration::ZERO).await, Err(ClientError::Timeout)));
        drop(conn);
        tokio::time::timeout(Duration::from_secs(2), peer)
            .await
            .expect("the socket closes once nobody waits on it")
            .expect("join");
    }
}
