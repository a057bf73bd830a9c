//! The door's I/O: one event loop (`mio`, epoll) holds every connection,
//! as Redis's does. It reads what a socket has, runs the commands that
//! need not wait ([`Session::fast`]: a `GET` from the node's own arena,
//! a `SET` or counter step submitted to the node loop, the connection's
//! own commands) and writes the replies out as the socket takes them. A
//! write is in flight for a connection at a time (its later requests wait
//! behind it, as on a Redis connection); the node loop's answer comes
//! back on a channel and wakes the loop.
//!
//! A command that could wait (asking the node's role, a store client, a
//! failover, `WAIT`, a transaction's `EXEC`, a write whose answer did
//! not come in time) is run by a worker thread: the connection (socket,
//! session, buffered input and output) moves to the worker, which runs it
//! and whatever else is buffered the way a thread per connection would
//! ([`Session::exec`], blocking), then hands it back. Workers are made as
//! needed and kept; there are never fewer than the connections away.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::fast::{Fast, Pending};
use super::session::{Out, Session, FLUSH_AT, FRONT_TIMEOUT, WRITE_TIMEOUT};
use super::shared::{ConnInfo, Shared};
use super::workers::{Away, Back, Parts, Work, Workers};
use super::{Answer, MAX_CLIENTS};
use crate::auth::Rights;
use crate::proto;
use crate::resp_codec::{Decoder, Reply};

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);

/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 << 10;

/// Input a connection reads ahead (pipelined requests) while a write of
/// it is in flight.
const READ_AHEAD: usize = 1 << 20;

/// Input one connection may read in one pass of the loop before the
/// others are served (a client sending a 64 MiB value, or pipelining
/// without pause, does not hold the loop for the whole of it).
const READ_SHARE: usize = 1 << 20;

/// How often the loop looks for writes whose answer is late and clients
/// that stopped reading.
const SWEEP: Duration = Duration::from_millis(100);
/// How long the loop polls without sleeping after a pass that served
/// requests and handed no write to the node (`SOFTRDMA_DOOR_SPIN_US`
/// overrides it, for experiments): a client's next request then finds
/// the loop awake, and its `write` wakes no one. Asleep in `epoll_wait`,
/// the loop is woken by the client's `write` itself (on a virtual machine
/// an inter-processor interrupt and an exit, paid in the client's time):
/// 16 `redis-benchmark` clients' 100 B GETs went from 125-136K/s (the loop
/// at 0.69-0.71 of a core, asleep the rest) to 148-155K/s (0.96) with 50
/// us (session 57). Not after a pass that handed writes to the node loop:
/// the node and the secondary need the CPU then.
const SPIN: Duration = Duration::from_micros(50);

/// An output buffer larger than this is given back once written out.
const KEEP_OUT: usize = 1 << 20;

/// A value at least this long is written from the loop's read buffer
/// to the socket, not copied to the output first (and one this long is
/// sent from the arena itself: `fast::PIN_MIN`).
const DIRECT: usize = super::fast::PIN_MIN;

/// The loop's read buffer is kept up to this size (values up to a few
/// MiB are read without growing, and so zeroing, it again).
const KEEP_READ: usize = 8 << 20;

/// Redis's answer to a client from another host when no password is set.
const DENIED: &str = "DENIED softrdma-store is running in protected mode because no \
    credentials are configured: only loopback clients are served. Configure [auth] secret \
    (or users) in the node's configuration (docs/store.md), or set protected_mode = false \
    to serve everyone.";

/// A connection as the loop holds it.
struct Conn {
    /// `None` while a worker has it.
    parts: Option<Parts>,
    /// The loop's write in flight, and until when its answer is awaited.
    pending: Option<(Pending, Instant)>,
    /// Bytes of `out.buf` already written.
    sent: usize,
    /// Since when output waits for the socket.
    stalled: Option<Instant>,
    /// Close once the output is written (`QUIT`, a protocol error).
    closing: bool,
    /// The client closed its side: close once nothing is left to run.
    eof: bool,
    /// The socket had no more input when last read (a short read): the
    /// next readiness event says when it has (epoll edge-triggered).
    drained: bool,
    /// The client closed its side (an event said so): read to the end,
    /// whatever a short read suggests (the end raises no further event).
    hup: bool,
}

/// What [`Door::progress`] leaves a connection in. (A return value only,
/// never stored: boxing `Away` would cost an allocation per command.)
#[allow(clippy::large_enum_variant)]
enum Step {
    Keep,
    /// It read its share for this pass ([`READ_SHARE`]) and the socket
    /// may hold more: served again next pass, after the others.
    Again,
    Close,
    Away(Work),
}

/// The event loop's state.
struct Door {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    conns: HashMap<u64, Conn>,
    back_tx: Sender<Back>,
    back_rx: Receiver<Back>,
    waker: Arc<Waker>,
    workers: Workers,
    /// Where reads land before they join a connection's input.
    scratch: Vec<u8>,
    /// [`Ctx::woken`].
    woken: Arc<AtomicBool>,
    /// [`Ctx::batch`].
    batch: Vec<(u64, u64, proto::Op, Answer)>,
    /// [`Ctx::rbuf`].
    rbuf: Vec<u8>,
    /// Connections to serve again next pass ([`Step::Again`]).
    again: Vec<u64>,
    /// [`Ctx::now`].
    now: Instant,
}

/// Starts the door's event loop on `listener`.
pub(super) fn start(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let poll = Poll::new()?;
    poll.registry().register(
        &mut SourceFd(&listener.as_raw_fd()),
        LISTENER,
        Interest::READABLE,
    )?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let (back_tx, back_rx) = mpsc::channel();
    let workers = Workers::new(back_tx.clone(), waker.clone());
    let mut door = Door {
        poll,
        listener,
        shared,
        conns: HashMap::new(),
        back_tx,
        back_rx,
        waker,
        workers,
        scratch: vec![0; READ_CHUNK],
        woken: Arc::new(AtomicBool::new(false)),
        batch: Vec::new(),
        rbuf: Vec::new(),
        again: Vec::new(),
        now: Instant::now(),
    };
    std::thread::Builder::new()
        .name("store-resp".into())
        .spawn(move || door.run())?;
    Ok(())
}

/// [`SPIN`], or `SOFTRDMA_DOOR_SPIN_US`.
fn spin() -> Duration {
    std::env::var("SOFTRDMA_DOOR_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(SPIN, Duration::from_micros)
}

impl Door {
    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let mut next_sweep = Instant::now() + SWEEP;
        let spin = spin();
        // Until when the loop polls without sleeping.
        let mut spin_until = Instant::now();
        loop {
            let now = Instant::now();
            let wait = if !self.again.is_empty() {
                Duration::ZERO
            } else if now < spin_until {
                std::thread::yield_now();
                Duration::ZERO
            } else {
                next_sweep.saturating_duration_since(now)
            };
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::warn!("RESP poll: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            self.now = Instant::now();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKE => {}
                    Token(t) => self.on_event(
                        (t - 2) as u64,
                        ev.is_readable(),
                        ev.is_read_closed() || ev.is_error(),
                    ),
                }
            }
            for no in std::mem::take(&mut self.again) {
                self.service(no);
            }
            // Cleared before the channel is drained: an answer sent after
            // this wakes the loop again.
            self.woken.store(false, Ordering::SeqCst);
            while let Ok(back) = self.back_rx.try_recv() {
                self.on_back(back);
            }
            if !self.batch.is_empty() {
                let batch = std::mem::take(&mut self.batch);
                self.shared.front.submit_all(batch, FRONT_TIMEOUT);
                spin_until = self.now;
            } else if !events.is_empty() {
                spin_until = self.now + spin;
            }
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + SWEEP;
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, most likely: the next connection
                    // that arrives tries again.
                    tracing::warn!("RESP accept: {e}");
                    return;
                }
            }
        }
    }

    /// A new connection: refused (too many, protected mode) or joined to
    /// the loop.
    fn admit(&mut self, mut stream: TcpStream) {
        let shared = self.shared.clone();
        // The accepted socket blocks until it joins the loop, so these
        // short refusals are written whole.
        let _ = stream.set_nonblocking(false);
        if shared.conns.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            shared.conns.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
            return;
        }
        let no = shared.accepted.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = stream.set_nodelay(true);
        // A worker writes with the socket blocking: a client that does
        // not read for this long is disconnected (the loop checks the
        // same in `sweep`).
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        // (Read in this order, a change in between is seen at the first
        // request.)
        let seen_changes = shared.gate.changes();
        let creds = shared.gate.credentials();
        let loopback = stream.peer_addr().is_ok_and(|a| a.ip().is_loopback());
        if !creds.configured() && shared.protected_mode && !loopback {
            let _ = stream.write_all(format!("-{DENIED}\r\n").as_bytes());
            shared.conns.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        // Without credentials everyone is the default user, as in Redis.
        let user = (!creds.configured())
            .then(|| (crate::auth::DEFAULT_USER.to_string(), Rights::ReadWrite));
        let info = Arc::new(ConnInfo::new(
            no,
            stream.peer_addr().ok(),
            stream.local_addr().ok(),
        ));
        let registered = stream.set_nonblocking(true).is_ok()
            && self
                .poll
                .registry()
                .register(
                    &mut SourceFd(&stream.as_raw_fd()),
                    Token(no as usize + 2),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_ok();
        if !registered {
            shared.conns.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        shared
            .clients
            .lock()
            .expect("clients")
            .insert(no, info.clone());
        let session = Session::new(&shared, info, user, creds, seen_changes);
        self.conns.insert(
            no,
            Conn {
                parts: Some(Parts {
                    stream,
                    session,
                    out: Out::new(None),
                    decoder: Decoder::default(),
                    input: Vec::new(),
                }),
                pending: None,
                sent: 0,
                stalled: None,
                closing: false,
                eof: false,
                drained: false,
                hup: false,
            },
        );
        self.service(no);
    }

    /// A readiness event of connection `no`.
    fn on_event(&mut self, no: u64, readable: bool, hup: bool) {
        if readable || hup {
            if let Some(conn) = self.conns.get_mut(&no) {
                conn.drained = false;
                conn.hup |= hup;
            }
        }
        self.service(no);
    }

    /// Moves connection `no` on as far as it goes without waiting.
    fn service(&mut self, no: u64) {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut ctx = Ctx {
            back_tx: &self.back_tx,
            waker: &self.waker,
            woken: &self.woken,
            batch: &mut self.batch,
            rbuf: &mut self.rbuf,
            now: self.now,
        };
        let step = self.conns.get_mut(&no).map(|conn| {
            // A command that panics ends its connection, not the loop
            // that serves all of them.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                progress(no, conn, &mut ctx, &mut scratch)
            }))
            .unwrap_or_else(|_| {
                tracing::error!("RESP connection {no}: a command panicked; connection closed");
                Step::Close
            })
        });
        self.scratch = scratch;
        if self.rbuf.len() > KEEP_READ {
            // (A large value's buffer is not kept.)
            self.rbuf = Vec::new();
        }
        match step {
            None | Some(Step::Keep) => {}
            Some(Step::Again) => self.again.push(no),
            Some(Step::Close) => self.close(no),
            Some(Step::Away(work)) => self.send_away(no, work),
        }
    }

    fn on_back(&mut self, back: Back) {
        match back {
            Back::Answer { no, req_id, result } => {
                let Some(conn) = self.conns.get_mut(&no) else {
                    return;
                };
                match &conn.pending {
                    Some((p, _)) if p.req_id == req_id => {}
                    // Given up on (a worker asks again): not this one's.
                    _ => return,
                }
                let (p, _) = conn.pending.take().expect("matched above");
                let parts = conn
                    .parts
                    .as_mut()
                    .expect("a loop write's connection is home");
                let mut first = Some(result);
                match parts.session.answer(p, &mut first) {
                    Ok(reply) => {
                        parts.out.reply(&reply);
                        self.service(no);
                    }
                    Err(p) => self.send_away(no, Work::Retry(p, first)),
                }
            }
            Back::Served(away) => {
                let Away {
                    no, parts, close, ..
                } = *away;
                let Some(conn) = self.conns.get_mut(&no) else {
                    return;
                };
                conn.parts = Some(parts);
                match close {
                    true => self.close(no),
                    false => self.service(no),
                }
            }
        }
    }

    /// Writes whose answer is late go to a worker (which asks again);
    /// clients that stopped reading are disconnected.
    fn sweep(&mut self) {
        let now = Instant::now();
        let mut late = Vec::new();
        let mut stuck = Vec::new();
        for (no, conn) in &mut self.conns {
            if conn
                .pending
                .as_ref()
                .is_some_and(|(_, until)| now >= *until)
            {
                late.push(*no);
            }
            if conn.stalled.is_some_and(|t| now - t >= WRITE_TIMEOUT) {
                stuck.push(*no);
            }
        }
        for no in late {
            if let Some((p, _)) = self.conns.get_mut(&no).and_then(|c| c.pending.take()) {
                self.send_away(no, Work::Retry(p, None));
            }
        }
        for no in stuck {
            self.close(no);
        }
    }

    fn send_away(&mut self, no: u64, work: Work) {
        let Some(conn) = self.conns.get_mut(&no) else {
            return;
        };
        let Some(mut parts) = conn.parts.take() else {
            return;
        };
        // What the loop wrote of the output is gone; the worker writes
        // the rest first.
        parts.out.buf.drain(..conn.sent);
        conn.sent = 0;
        conn.stalled = None;
        self.workers.run(Box::new(Away {
            no,
            parts,
            work,
            close: false,
        }));
    }

    fn close(&mut self, no: u64) {
        let Some(conn) = self.conns.remove(&no) else {
            return;
        };
        if let Some(parts) = &conn.parts {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&parts.stream.as_raw_fd()));
        }
        self.shared.clients.lock().expect("clients").remove(&no);
        self.shared.conns.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a connection's progress needs of the loop.
struct Ctx<'a> {
    back_tx: &'a Sender<Back>,
    waker: &'a Arc<Waker>,
    /// Set while a wake of the loop is owed or under way: answers that
    /// come meanwhile do not wake it again.
    woken: &'a Arc<AtomicBool>,
    /// Writes to submit when this pass of the loop ends (the node loop
    /// woken once for all).
    batch: &'a mut Vec<(u64, u64, proto::Op, Answer)>,
    /// Where a `GET` reads its object ([`Session::fast`]).
    rbuf: &'a mut Vec<u8>,
    /// When this pass of the loop began (taken once per pass, not per
    /// read or command): a connection's last input, as `CLIENT LIST`
    /// shows it.
    now: Instant,
}

/// Moves `conn` on: writes what its output holds, runs its buffered
/// commands until one must wait, reads more input when it has none.
fn progress(no: u64, conn: &mut Conn, ctx: &mut Ctx<'_>, scratch: &mut Vec<u8>) -> Step {
    if scratch.len() < READ_CHUNK {
        scratch.resize(READ_CHUNK, 0);
    }
    let mut read = 0;
    loop {
        if !write_out(conn) {
            return Step::Close;
        }
        let Some(p) = conn.parts.as_mut() else {
            return Step::Keep;
        };
        if conn.closing {
            return match p.out.buf.is_empty() {
                true => Step::Close,
                false => Step::Keep,
            };
        }
        if p.out.buf.len() - conn.sent >= FLUSH_AT {
            // Until the socket takes more.
            return Step::Keep;
        }
        if conn.pending.is_some() {
            // Read ahead (bounded) while the write is in flight.
            while p.input.len() < READ_AHEAD && !conn.eof && !conn.drained {
                match read_some(&mut p.stream, &mut p.input, scratch) {
                    Ok(n) => {
                        conn.drained = n < scratch.len() && !conn.hup;
                        if n > 0 {
                            p.session.info.touch_at(ctx.now);
                        }
                    }
                    Err(true) => conn.eof = true,
                    Err(false) => return Step::Close,
                }
            }
            return Step::Keep;
        }
        let mut used = 0;
        let mut away = None;
        loop {
            match p.decoder.decode(&p.input[used..]) {
                Ok(Some((mut args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    let fast = p.session.fast(&mut args, &mut p.out, ctx.rbuf, ctx.now);
                    if let Fast::Slow = fast {
                        away = Some(Work::Command(args));
                        break;
                    }
                    p.decoder.recycle(args);
                    match fast {
                        Fast::Done(close) => conn.closing |= close,
                        Fast::Value(at) => {
                            if !reply_bulk(p, conn.sent, &ctx.rbuf[at]) {
                                return Step::Close;
                            }
                        }
                        // Sent from the arena (what the socket does not
                        // take copied out); unpinned at the arm's end.
                        Fast::Pinned(pin) => {
                            if !reply_bulk(p, conn.sent, pin.bytes()) {
                                return Step::Close;
                            }
                        }
                        Fast::Write(pending) => {
                            // (If the node loop is gone, the answer never
                            // comes: asked again at the deadline.)
                            submit(no, &p.session, &pending, ctx);
                            conn.pending = Some((pending, Instant::now() + FRONT_TIMEOUT));
                            break;
                        }
                        Fast::Slow => unreachable!("gone to a worker above"),
                    }
                    if conn.closing || p.out.buf.len() >= FLUSH_AT {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    p.out.reply(&Reply::err(format!("ERR Protocol error: {e}")));
                    conn.closing = true;
                    break;
                }
            }
        }
        p.input.drain(..used);
        if let Some(work) = away {
            return Step::Away(work);
        }
        if used > 0 || conn.closing || conn.pending.is_some() {
            continue;
        }
        // Nothing whole to run: more input.
        if conn.eof {
            // The client sent all it will: close once its replies are
            // out (a client may half-close and then read them).
            conn.closing = true;
            continue;
        }
        if conn.drained {
            // Until the socket has more.
            return Step::Keep;
        }
        if read >= READ_SHARE {
            return Step::Again;
        }
        // A large value's bytes go straight into its argument.
        let got = match p.decoder.bulk_room() {
            Some((arg, missing)) if missing >= READ_CHUNK => {
                read_onto(&mut p.stream, arg, missing.min(READ_SHARE))
            }
            _ => read_some(&mut p.stream, &mut p.input, scratch).map(|n| (n, n < READ_CHUNK)),
        };
        match got {
            // A short read took all there was: the next bytes raise an
            // event.
            Ok((n, short)) => {
                conn.drained = short && !conn.hup;
                read += n;
                if n > 0 {
                    p.session.info.touch_at(ctx.now);
                }
            }
            Err(true) => conn.eof = true,
            Err(false) => return Step::Close,
        }
    }
}

/// Reads what the socket has, up to a chunk, onto `input`: the bytes
/// read (0: none now), or `Err(true)` at the end of the client's input,
/// `Err(false)` when the connection failed.
fn read_some(
    stream: &mut TcpStream,
    input: &mut Vec<u8>,
    scratch: &mut [u8],
) -> Result<usize, bool> {
    loop {
        return match stream.read(scratch) {
            Ok(0) => Err(true),
            Ok(n) => {
                input.extend_from_slice(&scratch[..n]);
                Ok(n)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => Err(false),
        };
    }
}

/// Reads up to `want` bytes straight onto `buf` (a large argument's, no
/// copy through the scratch buffer and the input, its new room not zeroed
/// first): the bytes read and whether the socket ran out of them, or
/// `read_some`'s errors.
fn read_onto(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    want: usize,
) -> Result<(usize, bool), bool> {
    let before = buf.len();
    buf.reserve(want);
    let r = stream.take(want as u64).read_to_end(buf);
    let n = buf.len() - before;
    match r {
        // At the end of the client's input (or of `want`).
        Ok(_) if n == 0 => Err(true),
        Ok(_) => Ok((n, false)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok((n, true)),
        Err(_) if n > 0 => Ok((n, false)),
        Err(_) => Err(false),
    }
}

/// A `GET`'s bulk reply of `value`: a large one written straight to the
/// socket when nothing waits to be written before it ([`write_bulk`]),
/// else copied to the output. False when the connection failed.
fn reply_bulk(p: &mut Parts, sent: usize, value: &[u8]) -> bool {
    if value.len() < DIRECT || p.out.buf.len() > sent {
        p.out.bulk(value);
        true
    } else {
        write_bulk(&mut p.stream, &mut p.out, value)
    }
}

/// A bulk reply of `value` (in the loop's read buffer, or pinned in the arena) straight to the
/// socket (nothing else waits to be written before it): what the socket
/// does not take now joins the output. False when the connection failed.
fn write_bulk(stream: &mut TcpStream, out: &mut Out, value: &[u8]) -> bool {
    let head = format!("${}\r\n", value.len());
    let parts = [head.as_bytes(), value, b"\r\n"];
    let total: usize = parts.iter().map(|b| b.len()).sum();
    let mut done = 0;
    while done < total {
        // The parts from `done` on.
        let mut skip = done;
        let slices: Vec<std::io::IoSlice<'_>> = parts
            .iter()
            .filter_map(|b| {
                let from = skip.min(b.len());
                skip -= from;
                (from < b.len()).then(|| std::io::IoSlice::new(&b[from..]))
            })
            .collect();
        match stream.write_vectored(&slices) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let mut skip = done;
    for b in parts {
        let from = skip.min(b.len());
        skip -= from;
        out.buf.extend_from_slice(&b[from..]);
    }
    true
}

/// Writes as much of `conn`'s output as the socket takes; false when the
/// connection failed.
fn write_out(conn: &mut Conn) -> bool {
    let Some(p) = conn.parts.as_mut() else {
        return true;
    };
    while conn.sent < p.out.buf.len() {
        match p.stream.write(&p.out.buf[conn.sent..]) {
            Ok(0) => return false,
            Ok(n) => conn.sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                conn.stalled.get_or_insert_with(Instant::now);
                return true;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    p.out.buf.clear();
    if p.out.buf.capacity() > KEEP_OUT {
        p.out.buf.shrink_to(16 << 10);
    }
    conn.sent = 0;
    conn.stalled = None;
    true
}

/// Queues the loop's write `pending` of connection `no` for the node
/// loop, its answer to come back to the event loop.
fn submit(no: u64, session: &Session, pending: &Pending, ctx: &mut Ctx<'_>) {
    let (tx, waker, woken) = (ctx.back_tx.clone(), ctx.waker.clone(), ctx.woken.clone());
    let req_id = pending.req_id;
    let done: Answer = Box::new(move |result| {
        if tx.send(Back::Answer { no, req_id, result }).is_ok()
            && !woken.swap(true, Ordering::SeqCst)
        {
            let _ = waker.wake();
        }
    });
    ctx.batch
        .push((session.id, req_id, pending.op.clone(), done));
}
