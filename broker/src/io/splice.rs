//! Zero-copy sends: IORING_OP_SPLICE file → pipe → socket.
//!
//! glommio does not expose splice, so each shard owns a second, small
//! io_uring (the `io-uring` crate) for it. Completions are awaited without
//! blocking the glommio reactor: an eventfd is registered with the ring and
//! read through glommio (`BufferedFile::read_at(0, 8)`), and the completion
//! queue is drained before every wait.
//!
//! ```text
//!   segment fd ──SPLICE(off, n)──> pipe A ──SPLICE(n)──> socket   chunk k
//!   segment fd ──SPLICE(off', n')─> pipe B  (filling meanwhile)     chunk k+1
//! ```
//!
//! Two pipes alternate so the file read of the next chunk overlaps the socket
//! send of the current one. What a chunk put in its pipe is flushed to the
//! socket in a loop (short splices), waiting with POLL_ADD on EAGAIN. A pipe
//! goes back to the pool only when empty; one that may hold bytes after an
//! error is closed instead.
//!
//! **Invariant**: an in-flight operation keeps every fd it names open (the
//! op's state owns `Rc` handles until its CQE is reaped), even if the future
//! that started it is dropped.

use io_uring::{opcode, squeue, types::Fd, IoUring};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Pipe capacity: 64 KiB pipes lose the gain (DESIGN, prototype notes).
pub const PIPE_BYTES: usize = 1 << 20;
/// Pipes kept for reuse per shard.
pub const PIPE_POOL_MAX: usize = 64;
/// Submission queue size of the splice ring.
const RING_ENTRIES: u32 = 256;

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid 2-element array for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by us alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: plain fcntl on an fd we own.
        let size = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe { read, write })
    }
}

/// Completion slot of one SQE.
#[derive(Default)]
struct OpState {
    result: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
    /// Fds the kernel may still use: dropped only when the CQE is reaped.
    _keep: RefCell<Vec<Rc<dyn Any>>>,
}

struct OpFuture(Rc<OpState>);

/// Completes when an operation has been submitted to an idle engine.
struct Idle<'a>(&'a Splicer);

impl Future for Idle<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !self.0.ops.borrow().is_empty() {
            return Poll::Ready(());
        }
        *self.0.idle_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Future for OpFuture {
    type Output = i32;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        if let Some(r) = self.0.result.get() {
            return Poll::Ready(r);
        }
        *self.0.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Per-shard splice engine.
pub struct Splicer {
    ring: RefCell<IoUring>,
    eventfd: Rc<glommio::io::BufferedFile>,
    ops: RefCell<HashMap<u64, Rc<OpState>>>,
    next_id: Cell<u64>,
    pipes: RefCell<Vec<Pipe>>,
    driver_started: Cell<bool>,
    /// The driver, parked while nothing is in flight.
    idle_waker: RefCell<Option<Waker>>,
}

impl Splicer {
    /// Creates the ring and registers its eventfd. Fails where io_uring or
    /// splice is unavailable; the caller then uses the plain path.
    pub fn new() -> io::Result<Rc<Splicer>> {
        let ring = IoUring::new(RING_ENTRIES)?;
        if let Ok(probe) = probe_splice(&ring) {
            if !probe {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "kernel io_uring lacks IORING_OP_SPLICE",
                ));
            }
        }
        // SAFETY: eventfd takes no pointers; the result is checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        ring.submitter().register_eventfd(efd)?;
        // SAFETY: `efd` is a fresh fd owned by nobody else; the BufferedFile
        // takes ownership and closes it.
        let eventfd = unsafe { glommio::io::BufferedFile::from_raw_fd(efd) };
        Ok(Rc::new(Splicer {
            ring: RefCell::new(ring),
            eventfd: Rc::new(eventfd),
            ops: RefCell::default(),
            next_id: Cell::new(1),
            pipes: RefCell::default(),
            driver_started: Cell::new(false),
            idle_waker: RefCell::new(None),
        }))
    }

    /// Reaps completions forever: drain the CQ, then wait on the eventfd
    /// while operations are in flight, or until the next submission when idle.
    fn start_driver(self: &Rc<Self>) {
        if self.driver_started.replace(true) {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            loop {
                me.reap();
                if me.ops.borrow().is_empty() {
                    Idle(&me).await;
                    continue;
                }
                if let Err(e) = me.eventfd.read_at(0, 8).await {
                    tracing::warn!(error = %e, "splice ring eventfd read failed; polling");
                    glommio::timer::sleep(std::time::Duration::from_micros(100)).await;
                }
            }
        })
        .detach();
    }

    fn reap(&self) {
        let mut ring = self.ring.borrow_mut();
        let mut ops = self.ops.borrow_mut();
        for cqe in ring.completion() {
            if let Some(op) = ops.remove(&cqe.user_data()) {
                op.result.set(Some(cqe.result()));
                op._keep.borrow_mut().clear();
                if let Some(w) = op.waker.borrow_mut().take() {
                    w.wake();
                }
            }
        }
    }

    /// Queues SQEs built by `build` (given their user data) and submits.
    fn submit(
        self: &Rc<Self>,
        entries: Vec<squeue::Entry>,
        keep: &[Rc<dyn Any>],
    ) -> io::Result<Vec<OpFuture>> {
        self.start_driver();
        let mut futures = Vec::with_capacity(entries.len());
        let mut ring = self.ring.borrow_mut();
        let free = {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        if free < entries.len() {
            ring.submit()?;
        }
        for entry in entries {
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            let state = Rc::new(OpState::default());
            state._keep.borrow_mut().extend(keep.iter().cloned());
            self.ops.borrow_mut().insert(id, state.clone());
            let entry = entry.user_data(id);
            // SAFETY: splice and poll SQEs carry fds only, no user memory;
            // the fds stay open until the CQE is reaped because `state`
            // holds their owners (`keep`).
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("splice submission queue full"))?;
            futures.push(OpFuture(state));
        }
        ring.submit()?;
        if let Some(w) = self.idle_waker.borrow_mut().take() {
            w.wake();
        }
        Ok(futures)
    }

    fn take_pipe(&self) -> io::Result<Pipe> {
        match self.pipes.borrow_mut().pop() {
            Some(p) => Ok(p),
            None => Pipe::new(),
        }
    }

    fn give_pipe(&self, pipe: Pipe) {
        let mut pipes = self.pipes.borrow_mut();
        if pipes.len() < PIPE_POOL_MAX {
            pipes.push(pipe);
        }
    }

    /// Sends `len` bytes of `file` from `offset` to `socket`. `keep` owns the
    /// fds (for example the segment handle and a dup of the socket).
    pub async fn splice_to_socket(
        self: &Rc<Self>,
        file: RawFd,
        offset: u64,
        len: usize,
        socket: RawFd,
        keep: &[Rc<dyn Any>],
    ) -> io::Result<()> {
        // Two pipes: the next chunk is read from the file into one while the
        // other drains into the socket, so disk and network overlap.
        let pipes = [Rc::new(self.take_pipe()?), Rc::new(self.take_pipe()?)];
        let mut keep = keep.to_vec();
        keep.extend(pipes.iter().map(|p| p.clone() as Rc<dyn Any>));
        let result = async {
            let mut read = 0usize;
            let mut cur = 0;
            let mut filling = Some(self.fill(&pipes[cur], file, offset, len.min(PIPE_BYTES), &keep)?);
            while let Some(fill) = filling.take() {
                let got = match fill.await {
                    n if n > 0 => n as usize,
                    0 => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "segment file ended before the range",
                        ))
                    }
                    e => return Err(io::Error::from_raw_os_error(-e)),
                };
                read += got;
                if read < len {
                    let next = &pipes[1 - cur];
                    filling = Some(self.fill(
                        next,
                        file,
                        offset + read as u64,
                        (len - read).min(PIPE_BYTES),
                        &keep,
                    )?);
                }
                self.flush_pipe(&pipes[cur], got, socket, &keep).await?;
                cur = 1 - cur;
            }
            Ok(())
        }
        .await;
        // On error a pipe may hold bytes (or an op may still use it): it is
        // dropped, never pooled.
        result?;
        drop(keep);
        for pipe in pipes {
            if let Ok(p) = Rc::try_unwrap(pipe) {
                self.give_pipe(p);
            }
        }
        Ok(())
    }

    /// Starts moving up to `len` bytes at `offset` of `file` into `pipe`.
    fn fill(
        self: &Rc<Self>,
        pipe: &Pipe,
        file: RawFd,
        offset: u64,
        len: usize,
        keep: &[Rc<dyn Any>],
    ) -> io::Result<OpFuture> {
        let op =
            opcode::Splice::new(Fd(file), offset as i64, Fd(pipe.write.as_raw_fd()), -1, len as u32).build();
        Ok(self.submit(vec![op], keep)?.pop().expect("one op"))
    }

    /// Moves `left` bytes already in `pipe` to the socket.
    async fn flush_pipe(
        self: &Rc<Self>,
        pipe: &Pipe,
        mut left: usize,
        socket: RawFd,
        keep: &[Rc<dyn Any>],
    ) -> io::Result<()> {
        while left > 0 {
            let op = opcode::Splice::new(Fd(pipe.read.as_raw_fd()), -1, Fd(socket), -1, left as u32).build();
            let r = self.submit(vec![op], keep)?.pop().expect("one op").await;
            match r {
                n if n > 0 => left -= n as usize,
                0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")),
                e if e == -libc::EAGAIN => {
                    let poll = opcode::PollAdd::new(Fd(socket), libc::POLLOUT as u32).build();
                    let r = self.submit(vec![poll], keep)?.pop().expect("one op").await;
                    if r < 0 {
                        return Err(io::Error::from_raw_os_error(-r));
                    }
                }
                e => return Err(io::Error::from_raw_os_error(-e)),
            }
        }
        Ok(())
    }
}

fn probe_splice(ring: &IoUring) -> io::Result<bool> {
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    Ok(probe.is_supported(opcode::Splice::CODE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn splices_exact_ranges_and_survives_disconnect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("seg");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::File::create(&path).and_then(|mut f| f.write_all(&data)).expect("write file");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ranges: Vec<(u64, usize)> = vec![(0, 10), (7, 1_500_000), (1_000_003, 1_999_997), (2_999_999, 1)];
        let expected: Vec<u8> =
            ranges.iter().flat_map(|(o, l)| data[*o as usize..*o as usize + l].to_vec()).collect();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut got = Vec::new();
            s.read_to_end(&mut got).expect("read");
            // Second connection: the reader hangs up early.
            let (s2, _) = listener.accept().expect("accept");
            drop(s2);
            got
        });
        let ex = glommio::LocalExecutorBuilder::default().make().expect("executor");
        ex.run(async move {
            let splicer = Splicer::new().expect("splice ring");
            let file = Rc::new(std::fs::File::open(&path).expect("open"));
            let sock = Rc::new(std::net::TcpStream::connect(addr).expect("connect"));
            sock.set_nonblocking(true).expect("nonblocking");
            let keep: Vec<Rc<dyn Any>> = vec![file.clone(), sock.clone()];
            for (o, l) in &ranges {
                splicer
                    .splice_to_socket(file.as_raw_fd(), *o, *l, sock.as_raw_fd(), &keep)
                    .await
                    .expect("splice");
            }
            drop(keep);
            drop(Rc::try_unwrap(sock).expect("sole owner"));
            let s2 = Rc::new(std::net::TcpStream::connect(addr).expect("connect"));
            std::thread::sleep(std::time::Duration::from_millis(100));
            let keep: Vec<Rc<dyn Any>> = vec![file.clone(), s2.clone()];
            let mut failed = false;
            for _ in 0..20 {
                if splicer
                    .splice_to_socket(file.as_raw_fd(), 0, 3_000_000, s2.as_raw_fd(), &keep)
                    .await
                    .is_err()
                {
                    failed = true;
                    break;
                }
            }
            assert!(failed, "sending to a closed peer must fail, not hang");
            // The engine still works afterwards.
            let pipe_ok = splicer.take_pipe().expect("pipe");
            splicer.give_pipe(pipe_ok);
        });
        let got = reader.join().expect("reader");
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "spliced bytes differ");
    }
}
