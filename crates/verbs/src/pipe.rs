//! A simulated TCP connection: two byte streams between two ends, with no
//! socket and no thread, driven step by step by whoever owns the [`Pipe`]
//! (the deterministic simulation in `sim.rs` and the engine fuzz targets).
//!
//! It behaves like a TCP connection seen through non-blocking sockets:
//! - bytes an end writes are *in flight* until the driver delivers them
//!   ([`Pipe::deliver`]), any number at a time, so segments split and
//!   merge however the driver likes, and delay as long as it waits;
//! - each direction holds at most `cap` bytes (in flight plus delivered
//!   and unread): a writer finds it full (`WouldBlock`) until the reader
//!   drains it, which is how a peer that stops reading stalls a sender;
//! - a read returns a seeded random number of the bytes waiting (short
//!   reads, as a kernel gives them), `WouldBlock` when none are;
//! - a half-close arrives after the bytes before it (end of stream), a
//!   reset at once (in-flight bytes are lost, the reader gets
//!   `ConnectionReset`).
//!
//! The pipe also records what the engine asked of the poller (the epoll
//! interest and timers), so the driver knows which end is ready for what,
//! the way a level-triggered epoll would tell a progress thread.

use crate::sys::{EV_IN, EV_OUT};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

#[derive(Default)]
struct Dir {
    /// Written, not yet delivered.
    flight: VecDeque<u8>,
    /// Delivered, not yet read.
    ready: VecDeque<u8>,
    /// The writer half-closed (FIN after the bytes in flight).
    fin: bool,
    /// The writer reset the connection.
    reset: bool,
}

#[derive(Default)]
struct End {
    /// The epoll interest the engine asked for (`sys::EV_IN` / `EV_OUT`).
    interest: u32,
    /// The engine closed this end (no more I/O from it).
    closed: bool,
    /// A timer was asked for (the driver fires it when it likes).
    timer: bool,
}

struct State {
    /// `dir[i]`: the bytes end `i` writes.
    dir: [Dir; 2],
    end: [End; 2],
    cap: usize,
    max_read: usize,
    rng: u64,
}

impl State {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, enough for choosing read sizes.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Both directions of one simulated connection.
pub struct Pipe {
    st: Mutex<State>,
}

/// What an end of a [`Pipe`] is ready for, as a level-triggered poller
/// would report it (only what the engine asked for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    /// Input (bytes, end of stream or a reset) and the engine wants it.
    pub input: bool,
    /// Room to write and the engine asked to be told.
    pub output: bool,
    /// The engine asked for a timer.
    pub timer: bool,
}

impl Pipe {
    /// A pipe whose directions hold `cap` bytes each and whose reads
    /// return at most `max_read` bytes; `seed` chooses read sizes.
    pub fn new(cap: usize, max_read: usize, seed: u64) -> Arc<Pipe> {
        Arc::new(Pipe {
            st: Mutex::new(State {
                dir: [Dir::default(), Dir::default()],
                end: [End::default(), End::default()],
                cap: cap.max(1),
                max_read: max_read.max(1),
                rng: seed | 1,
            }),
        })
    }

    /// End 0 or 1 (the engine's side of the connection).
    pub(crate) fn end(self: &Arc<Self>, side: usize) -> PipeEnd {
        assert!(side < 2);
        PipeEnd {
            pipe: Arc::clone(self),
            side,
            scratch: Mutex::new(Vec::new()),
        }
    }

    /// Delivers up to `n` bytes written by `from` to the other end;
    /// returns how many.
    pub fn deliver(&self, from: usize, n: usize) -> usize {
        let mut st = self.st.lock();
        let d = &mut st.dir[from];
        let k = n.min(d.flight.len());
        d.ready.extend(d.flight.drain(..k));
        k
    }

    /// Bytes written by `from` and not yet delivered.
    pub fn in_flight(&self, from: usize) -> usize {
        self.st.lock().dir[from].flight.len()
    }

    /// Bytes delivered to the end opposite `from` and not yet read.
    pub fn unread(&self, from: usize) -> usize {
        self.st.lock().dir[from].ready.len()
    }

    /// What end `side` is ready for now.
    pub fn ready(&self, side: usize) -> Ready {
        let st = self.st.lock();
        let e = &st.end[side];
        if e.closed {
            return Ready::default();
        }
        let inb = &st.dir[1 - side];
        let out = &st.dir[side];
        let has_input = !inb.ready.is_empty() || inb.reset || (inb.fin && inb.flight.is_empty());
        let room = out.flight.len() + out.ready.len() < st.cap;
        Ready {
            input: e.interest & EV_IN != 0 && has_input,
            output: e.interest & EV_OUT != 0 && room,
            timer: e.timer,
        }
    }

    /// Takes end `side`'s timer request (the driver is about to fire it).
    pub fn take_timer(&self, side: usize) -> bool {
        std::mem::take(&mut self.st.lock().end[side].timer)
    }

    /// Whether end `side` was closed by its engine.
    pub fn is_closed(&self, side: usize) -> bool {
        self.st.lock().end[side].closed
    }

    /// A peer with no engine behind it (a fuzzer, a test): bytes from end
    /// `from` arrive at the other end at once, whatever the room.
    pub fn inject(&self, from: usize, bytes: &[u8]) {
        let mut st = self.st.lock();
        if !st.dir[from].reset && !st.dir[from].fin {
            st.dir[from].ready.extend(bytes.iter().copied());
        }
    }

    /// A peer with no engine behind it: takes every byte end `from` wrote
    /// (in flight or delivered), as if read at once.
    pub fn take_sent(&self, from: usize) -> Vec<u8> {
        let mut st = self.st.lock();
        let d = &mut st.dir[from];
        let mut out: Vec<u8> = d.ready.drain(..).collect();
        out.extend(d.flight.drain(..));
        out
    }

    /// Half-closes from end `side` (end of stream after its bytes).
    pub fn shutdown_write(&self, side: usize) {
        self.st.lock().dir[side].fin = true;
    }

    /// Resets the connection from end `side` (a crash or a cut cable: the
    /// other end's next read fails, bytes in flight are lost).
    pub fn reset(&self, side: usize) {
        let mut st = self.st.lock();
        st.dir[side].reset = true;
        st.dir[side].flight.clear();
        st.dir[side].ready.clear();
        st.dir[1 - side].flight.clear();
    }
}

/// One end of a [`Pipe`], held by the engine's connection.
pub(crate) struct PipeEnd {
    pipe: Arc<Pipe>,
    side: usize,
    /// The engine's copy buffer for reads and writes, kept so that the
    /// simulated connection allocates nothing per read or write in the
    /// steady state (as a socket does not): `tests/rx_alloc.rs` counts.
    scratch: Mutex<Vec<u8>>,
}

impl PipeEnd {
    /// Reads up to `max` bytes (a random short read when more wait).
    /// Empty: the end of the stream.
    #[cfg(test)]
    pub fn read(&self, max: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(max, &mut out)?;
        Ok(out)
    }

    /// The buffer the engine copies through ([`PipeEnd::read_into`],
    /// [`PipeEnd::push`]), kept between calls.
    pub fn scratch(&self) -> parking_lot::MutexGuard<'_, Vec<u8>> {
        self.scratch.lock()
    }

    /// Reads up to `max` bytes into `out` (cleared first; a random short
    /// read when more wait) and returns how many; 0: the end of the stream.
    pub fn read_into(&self, max: usize, out: &mut Vec<u8>) -> io::Result<usize> {
        out.clear();
        let mut st = self.pipe.st.lock();
        let side = self.side;
        if st.end[side].closed {
            return Err(io::ErrorKind::NotConnected.into());
        }
        let limit = st.max_read;
        let pick = (st.next() % limit as u64) as usize + 1;
        let d = &mut st.dir[1 - side];
        if d.ready.is_empty() {
            if d.reset {
                return Err(io::ErrorKind::ConnectionReset.into());
            }
            if d.fin && d.flight.is_empty() {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let k = max.min(d.ready.len()).min(pick);
        out.extend(d.ready.drain(..k));
        Ok(k)
    }

    /// How many bytes a write may take now (at most `want`).
    pub fn room(&self, want: usize) -> io::Result<usize> {
        let st = self.pipe.st.lock();
        let side = self.side;
        if st.end[side].closed || st.dir[side].fin || st.dir[side].reset {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        if st.dir[1 - side].reset {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        let d = &st.dir[side];
        let room = st.cap.saturating_sub(d.flight.len() + d.ready.len());
        if room == 0 && want > 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(room.min(want))
    }

    /// Writes bytes that [`PipeEnd::room`] made room for.
    pub fn push(&self, bytes: &[u8]) {
        let mut st = self.pipe.st.lock();
        st.dir[self.side].flight.extend(bytes.iter().copied());
    }

    pub fn set_interest(&self, bits: u32) {
        self.pipe.st.lock().end[self.side].interest = bits;
    }

    pub fn add_timer(&self) {
        self.pipe.st.lock().end[self.side].timer = true;
    }

    /// Half-close: the peer reads the end of the stream after our bytes.
    pub fn shutdown_write(&self) {
        self.pipe.st.lock().dir[self.side].fin = true;
    }

    /// Closes both directions (the engine is done with this end).
    pub fn close(&self) {
        let mut st = self.pipe.st.lock();
        st.end[self.side].closed = true;
        st.end[self.side].interest = 0;
        st.dir[self.side].fin = true;
    }

    /// Aborts (`SO_LINGER` 0): the peer reads a reset.
    pub fn reset(&self) {
        self.pipe.reset(self.side);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_order_only_when_delivered() {
        let p = Pipe::new(10, 4, 7);
        let (a, b) = (p.end(0), p.end(1));
        assert_eq!(a.room(100).unwrap(), 10);
        a.push(b"abcdefgh");
        assert_eq!(a.room(100).unwrap(), 2);
        assert_eq!(
            b.read(100).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "nothing delivered yet"
        );
        assert_eq!(p.deliver(0, 5), 5);
        let mut got = Vec::new();
        while let Ok(v) = b.read(100) {
            assert!(
                !v.is_empty() && v.len() <= 4,
                "short reads of at most max_read"
            );
            got.extend(v);
        }
        assert_eq!(got, b"abcde");
        assert_eq!(a.room(100).unwrap(), 7, "read bytes free room");
        a.shutdown_write();
        assert_eq!(b.read(100).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        p.deliver(0, 100);
        let rest: Vec<u8> = std::iter::from_fn(|| b.read(100).ok().filter(|v| !v.is_empty()))
            .flatten()
            .collect();
        assert_eq!(rest, b"fgh");
        assert!(
            b.read(100).unwrap().is_empty(),
            "end of stream after the bytes"
        );
    }

    #[test]
    fn a_reset_loses_bytes_in_flight_and_fails_the_reader() {
        let p = Pipe::new(100, 100, 1);
        let (a, b) = (p.end(0), p.end(1));
        a.push(b"lost");
        a.reset();
        assert_eq!(
            b.read(10).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        assert_eq!(
            b.room(10).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
    }
}
