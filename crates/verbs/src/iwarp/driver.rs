//! The driver around the protocol code: the [`Transport`] the engine calls
//! (kick, close, flush, Terminate, disconnect) and the entry points of the
//! progress threads (input, room for output, timers). Any thread may call
//! them: the progress thread on epoll events, the application's thread
//! when it posts or polls (busy-poll mode), the simulation's driver.

use super::*;
use crate::engine::{Transport, RX_BUDGET};
use std::any::Any;

impl Transport for Conn {
    fn kick(&self, q: &QpInner, sq: &mut Sq) -> io::Result<Option<String>> {
        let mut tx = self.tx.lock();
        tx_progress(q, sq, &mut tx, self)?;
        Ok(tx.pending_fail.take())
    }

    fn close(&self) {
        Conn::close(self);
    }

    fn flush_tx(&self, _sq: &mut Sq) {
        // No same-host copy runs while the send queue is locked: after
        // this, none starts into the flushed WRs' memory.
        if let Some(l) = &self.link {
            l.shutdown();
        }
        self.tx.lock().clear();
    }

    fn take_current_recv(&self) -> Option<RecvWqe> {
        self.rx.lock().take_current_recv()
    }

    fn send_terminate(&self, q: &QpInner, code: TermCode, hdr: Option<&[u8]>) {
        let (mut sq, mut tx) = self.lock_tx(q);
        tx.queue_terminate(code, hdr);
        let _ = tx_progress(q, &mut sq, &mut tx, self);
    }

    fn disconnect(&self, q: &QpInner) {
        // Push out whatever is queued first (best effort).
        let (mut sq, mut tx) = self.lock_tx(q);
        let _ = tx_progress(q, &mut sq, &mut tx, self);
        drop((sq, tx));
        self.shutdown_write();
    }

    fn on_readable(&self, q: &Arc<QpInner>, budget: usize) -> bool {
        on_readable(q, self, budget)
    }

    fn on_writable(&self, q: &Arc<QpInner>) {
        q.kick_with(q.sq.lock());
    }

    fn on_recv_posted(&self, q: &Arc<QpInner>) {
        // Every post comes here: a load, not a write, when nothing waits.
        // (The receive queue's lock orders this with `wait_for_recv`'s
        // look at the queue, so a waiter set before it is seen.)
        if !self.recv_waiting.load(Ordering::Acquire) {
            return;
        }
        if self.set_recv_waiting(false, q.qpn) {
            self.add_timer(q, std::time::Instant::now());
        }
    }

    fn on_timer(&self, q: &Arc<QpInner>) {
        on_timer(q, self)
    }

    fn negotiated(&self) -> Option<Negotiated> {
        Some(self.params)
    }

    fn addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        Some((self.local, self.peer))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A timer of the progress thread fired for this QP: a responder's hold
/// (see `Tx::hold_until`) that ran out starts transmission; a paused
/// receiver is checked for a peer that stopped reading (see
/// [`arm_stall_timer`]); a resumed one runs.
fn on_timer(q: &Arc<QpInner>, c: &Conn) {
    let now = std::time::Instant::now();
    let (sq, tx) = c.lock_tx(q);
    if tx.hold_until.is_some_and(|u| now >= u) {
        drop(tx);
        q.kick_with(sq);
        return;
    }
    if c.is_closed() {
        return;
    }
    if c.rx_paused.load(Ordering::Acquire) {
        let stalled = now.saturating_duration_since(tx.last_progress);
        drop((sq, tx));
        if stalled >= q.core.config.tx_stall_timeout {
            tracing::warn!(
                qpn = q.qpn,
                ?stalled,
                "the peer does not read our Read Response"
            );
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(q.qpn),
                    reason: format!("the peer read nothing for {stalled:?}"),
                }),
            );
        } else {
            arm_stall_timer(q, c);
        }
        return;
    }
    drop((sq, tx));
    // A receiver waiting for a receive: one was posted, or its deadline
    // came (it then sends the Terminate).
    c.set_recv_waiting(false, q.qpn);
    if on_readable(q, c, RX_BUDGET) {
        c.add_timer(q, now);
    }
}

/// A Send found no posted receive ([`RxEnd::NoRecv`]): input is left
/// unread until a receive is posted ([`Transport::on_recv_posted`]) or
/// the deadline passes (the timer runs the receiver, which then sends the
/// Terminate).
fn wait_for_recv(q: &Arc<QpInner>, c: &Conn, deadline: std::time::Instant) {
    // Already waiting (a busy-polling application runs the receiver again
    // and again): the first wait's registration and deadline timer stand
    // (the deadline is the same: `Rx::no_recv_since`). Registering each
    // time grew the SRQ's waiters and the timer list by one per poll.
    if !c.set_recv_waiting(true, q.qpn) {
        return;
    }
    if let Some(srq) = &q.srq {
        srq.waiters.lock().push(Arc::downgrade(q));
    }
    // A receive posted before the flag was up found no waiter: go on now.
    // (The flag is set before the queue is looked at and a post pushes
    // before it looks at the flag, so one of the two sees the other.)
    let posted = match &q.srq {
        Some(srq) => !srq.q.lock().is_empty(),
        None => !q.rq.lock().is_empty(),
    };
    if posted && c.set_recv_waiting(false, q.qpn) {
        c.add_timer(q, std::time::Instant::now());
    } else {
        c.add_timer(q, deadline);
    }
}

/// Runs the receiver core ([`process`]) and does the I/O it asks for,
/// until the connection has nothing more for now, the budget is spent, or
/// the connection ends.
pub(super) fn rx_loop(q: &QpInner, rx: &mut Rx, c: &Conn, budget: usize) -> RxEnd {
    let polled = c.polled.load(Ordering::Relaxed);
    let (mut budget, mut handled_any) = (budget, false);
    let mut scratch: Vec<RawSpan> = Vec::new();
    // Hands the receiver's responses and completions to the transmitter
    // and runs it.
    let kick = |rx: &mut Rx| {
        let (mut sq, mut tx) = c.lock_tx(q);
        tx.take_from_rx(&mut rx.to_tx);
        tx_or_fail(q, &mut sq, &mut tx, c)
    };
    loop {
        let stop = process(q, rx, c, &mut budget, &mut handled_any, polled);
        // A kick deferred while staged input was handled: before reading
        // more, placing a payload, or returning.
        if !matches!(stop, Stop::Kick) && std::mem::take(&mut rx.kick) {
            if let Some(e) = kick(rx) {
                return e;
            }
        }
        match stop {
            Stop::End(e) => return e,
            Stop::Kick => {
                if let Some(e) = kick(rx) {
                    return e;
                }
            }
            Stop::Stage(n) => match c.recv(rx.stage_room(n)) {
                Ok(0) => return rx.eof(),
                Ok(k) => rx.staged(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return RxEnd::Block,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return RxEnd::Io(e),
            },
            Stop::Direct => {
                if !rx.direct_target(&mut scratch) {
                    return deregistered(rx);
                }
                crate::test_hooks::placement_point(q);
                // What follows the payload (its trailer, the next FPDUs'
                // headers) comes in the same system call, into the stage:
                // one read per FPDU instead of two (a 1 MiB message in
                // 64 KiB FPDUs: 16 reads, not 32). Nothing is staged here
                // (staged payload bytes are placed before a direct read).
                assert_eq!(rx.avail(), 0, "bytes staged at a direct read");
                let payload: usize = scratch.iter().map(|s| s.len).sum();
                let room = rx.stage_room(1);
                scratch.push(RawSpan {
                    ptr: room.as_mut_ptr(),
                    len: room.len(),
                });
                // SAFETY: the spans but the last are the current segment's
                // target, checked against its STag (PD, rights, bounds)
                // when the header was handled and held by its
                // registration; caller-owned memory among them is entered
                // until `direct_done`. The last is the free room of this
                // receiver's stage, which nothing else touches during the
                // call. The connection writes only inside them, in order.
                let got = unsafe { c.recv_spans(&scratch) };
                scratch.pop();
                let k = *got.as_ref().unwrap_or(&0);
                rx.direct_done(k.min(payload), c.params.crc, &mut scratch);
                if k > payload {
                    rx.staged(k - payload);
                }
                match got {
                    Ok(0) => return RxEnd::EofMidFrame,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return RxEnd::Block,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return RxEnd::Io(e),
                }
            }
        }
    }
}

/// Runs the transmitter: writes what is composed, has the core compose
/// more ([`fill_batch`]), until nothing may be sent or the socket is full
/// (then EPOLLOUT, or the ring's doorbell, takes over).
pub(crate) fn tx_progress(q: &QpInner, sq: &mut Sq, tx: &mut Tx, c: &Conn) -> io::Result<()> {
    if c.is_closed() {
        return Ok(());
    }
    loop {
        if !tx.batch.is_empty() {
            if !tx.batch.write(c)? {
                // The socket wakes us when it has room; a full ring, with
                // the consumer's doorbell (on_readable kicks us then).
                if c.ring_tx().is_none() {
                    c.arm_out(q.qpn);
                }
                return Ok(());
            }
            batch_written(q, sq, tx);
        }
        let filled = fill_batch(q, sq, tx, c);
        if std::mem::take(&mut tx.resume_rx) {
            c.set_rx_paused(false, q.qpn);
            // (The receiver runs on its thread: bytes it staged wait for
            // no new input.)
            c.add_timer(q, std::time::Instant::now());
        }
        match filled {
            Filled::Ready => {}
            Filled::Idle => {
                c.disarm_out(q.qpn);
                return Ok(());
            }
            Filled::Failed => return Ok(()),
        }
    }
}

/// Runs the transmitter for the receiver (a response or a completion it
/// queued); a failure ends the receiver.
fn tx_or_fail(q: &QpInner, sq: &mut Sq, tx: &mut Tx, c: &Conn) -> Option<RxEnd> {
    match tx_progress(q, sq, tx, c) {
        Ok(()) => tx
            .pending_fail
            .take()
            .map(|r| RxEnd::Io(io::Error::other(r))),
        Err(e) => Some(RxEnd::Io(e)),
    }
}

/// Checks a paused receiver again in a while (see `on_timer`).
pub(super) fn arm_stall_timer(q: &QpInner, c: &Conn) {
    let every = (q.core.config.tx_stall_timeout / 4).max(std::time::Duration::from_millis(10));
    c.add_timer(q, std::time::Instant::now() + every);
}

/// EPOLLIN: runs the receiver, then acts on how it ended.
/// Runs the receiver for at most `budget` segments; returns true if it
/// stopped at its budget (more input may be waiting).
fn on_readable(q: &Arc<QpInner>, c: &Conn, budget: usize) -> bool {
    if c.is_closed() {
        return false;
    }
    crate::test_hooks::receiver_point(q);
    let end = {
        let mut rx = c.rx.lock();
        // Again under the lock: `QpInner::fail` closes the connection and
        // then takes the receive in progress under this lock (flushing it
        // back to the application). Once closed, nothing more may be placed
        // into that receive's buffer (issue 20, item 6: a receiver past the
        // first check placed staged bytes into the flushed buffer and then
        // panicked on the missing receive).
        if c.is_closed() || c.rx_paused.load(Ordering::Acquire) {
            return false;
        }
        let end = rx_loop(q, &mut rx, c, budget);
        // Every response queued was handed over at its `Stop::Kick`: none
        // is left holding its source region in a receiver that stopped.
        assert!(
            rx.to_tx.replies.is_empty(),
            "responses left with the receiver"
        );
        end
    };
    // Ring mode: a doorbell may mean the peer made room in its ring.
    if c.tx_blocked.swap(false, Ordering::AcqRel) {
        q.kick_with(q.sq.lock());
    }
    let more = matches!(end, RxEnd::Budget);
    match end {
        RxEnd::Block | RxEnd::Budget => {}
        RxEnd::NoRecv(deadline) => wait_for_recv(q, c, deadline),
        RxEnd::Eof => {
            tracing::debug!(qpn = q.qpn, "peer disconnected");
            c.on_peer_fin();
            q.fail(
                WcStatus::WrFlushErr,
                Some(AsyncEvent::Disconnected {
                    qpn: crate::Qpn::from_raw(q.qpn),
                }),
            );
        }
        RxEnd::EofMidFrame => {
            tracing::warn!(qpn = q.qpn, "peer closed the connection inside an FPDU");
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::Disconnected {
                    qpn: crate::Qpn::from_raw(q.qpn),
                }),
            );
        }
        RxEnd::Io(e)
            if c.fin_sent.load(Ordering::Acquire) && e.kind() == io::ErrorKind::ConnectionReset =>
        {
            // A reset that answers our own FIN is how the peer ends the
            // connection when it takes us for a peer that is not softrdma
            // (`Conn::on_peer_fin`; Linux siw releases its socket alike),
            // and how a peer that closed first answers the FIN we sent back
            // if its socket is gone: the connection closed as a FIN would
            // close it, not an error (`softrdma transfer bench` printed one
            // at each TCP pair's end; `loopback::disconnect_flushes_both_sides`
            // saw `QpFatal` in about one run in five beside a CPU hog).
            tracing::debug!(qpn = q.qpn, error = %e, "reset after our FIN: connection closed");
            q.fail(
                WcStatus::WrFlushErr,
                Some(AsyncEvent::Disconnected {
                    qpn: crate::Qpn::from_raw(q.qpn),
                }),
            );
        }
        RxEnd::Io(e) => {
            tracing::warn!(qpn = q.qpn, error = %e, "connection error");
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(q.qpn),
                    reason: e.to_string(),
                }),
            );
        }
        RxEnd::Fatal(code, hdr, status) => {
            q.terminate(code, hdr.as_deref(), status);
        }
        RxEnd::PeerTerminated(code) => {
            tracing::warn!(qpn = q.qpn, %code, "peer sent Terminate");
            q.fail(
                status_for_peer_term(code),
                Some(AsyncEvent::Terminated {
                    qpn: crate::Qpn::from_raw(q.qpn),
                    code,
                    by_peer: true,
                }),
            );
        }
    }
    more
}

/// Bytes the QP's connection holds in its own buffers (see
/// [`crate::sim::conn_memory`]).
pub(crate) fn conn_memory(c: &Conn) -> usize {
    use std::mem::size_of;
    let rx = c.rx.lock();
    let tx = c.tx.lock();
    let msg = |m: &TxMsg| size_of::<TxMsg>() + m.spans.capacity() * size_of::<RawSpan>();
    rx.stage.capacity()
        + rx.backed.capacity()
        + rx.target.capacity() * size_of::<RawSpan>()
        + tx.batch.memory()
        + tx.irq.iter().map(msg).sum::<usize>()
        + tx.cur.as_ref().map_or(0, msg)
        + rx.to_tx.replies.capacity() * size_of::<Reply>()
        + c.backed_bytes.load(Ordering::Acquire) as usize
}
