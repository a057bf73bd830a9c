//! The commands the door's event loop runs itself, without blocking
//! ([`Session::fast`]): a `GET`, `MGET` or `EXISTS` the node's own arena
//! answers; a `SET`, an `MSET` of one batch or a counter step while this
//! node is known to be the primary (the write submitted to the node loop,
//! its answer taken when it comes); and the connection's own commands.
//! Everything else, and anything that would wait (a role to ask, a store
//! client, `WAIT`, a failover), goes to a worker that runs
//! [`Session::exec`] (`event_loop.rs`).
use std::time::{Duration, Instant};

use super::commands::{one_batch, puts, MGET_STEP};
use super::session::{impossible_key, store_err, upper_in, value_too_long, Out, Session, ROLE_TTL};
use super::strings::{incr_amount, put_ttl, set_options};
use crate::lookup;
use crate::proto::{self, Bytes, Cond, Modify, Op, StoreError};
use crate::resp_codec::Reply;

/// How long a `GET` on the loop waits for a batch's writes to end before
/// it goes to a worker (which waits [`super::session::CONSISTENT_WAIT`]).
const LOOP_PATIENCE: Duration = Duration::from_micros(200);

/// The least allocation whose value a `GET` on the loop sends from the
/// arena ([`Session::find_or_pin`]): as large as the values the loop
/// writes straight to the socket (`event_loop.rs`), below which a value
/// is copied into the connection's output anyway.
pub(super) const PIN_MIN: usize = 64 << 10;

/// Where [`Session::find_or_pin`] found a key's value.
pub(super) enum Found {
    /// Read into the caller's buffer, at this range.
    Read(std::ops::Range<usize>),
    /// In the arena, pinned.
    Pinned(crate::arena::Pin),
}

/// What [`Session::fast`] did with a command.
pub(super) enum Fast {
    /// Answered (its reply is in the output); whether to close.
    Done(bool),
    /// Answered with the bulk string `rbuf[range]` (a `GET`'s value, as
    /// read): for the caller to write out ([`Out::bulk`], or straight
    /// from `rbuf` to the socket).
    Value(std::ops::Range<usize>),
    /// Answered with the bulk string of a large value sent from the arena
    /// itself, pinned meanwhile ([`Session::find_or_pin`]).
    Pinned(crate::arena::Pin),
    /// A write submitted as `req_id`: its answer is [`Session::answer`]'s.
    Write(Pending),
    /// Not for the loop: a worker runs it ([`Session::exec`]).
    Slow,
}

/// A write of the loop in flight.
pub(super) struct Pending {
    pub(super) req_id: u64,
    /// Kept to ask again under the same id if the answer does not come.
    pub(super) op: Op,
    kind: Kind,
}

/// Which command a [`Pending`] answers.
#[derive(Clone, Copy)]
enum Kind {
    /// `SET` without `GET`: `+OK`, or nil when its condition failed.
    Set,
    /// `INCR`, `DECR`, `INCRBY`, `DECRBY`: the new value.
    Incr,
    /// `MSET` of one batch: `+OK`.
    Mset,
}

impl Session {
    /// Runs `args` if the event loop can without waiting.
    /// `rbuf`: the loop's read buffer (a `GET`'s value is read into it
    /// and written out from it, not copied in between). `now`: the loop's
    /// time of this pass (what [`Self::primary_known`] measures against).
    pub(super) fn fast(
        &mut self,
        args: &mut [Vec<u8>],
        out: &mut Out,
        rbuf: &mut Vec<u8>,
        now: Instant,
    ) -> Fast {
        let mut name = [0u8; 16];
        let Some(cmd) = upper_in(&args[0], &mut name) else {
            return Fast::Slow;
        };
        let n = args.len();
        match cmd {
            // The connection's own commands, and what clients send when
            // they connect: nothing to wait for.
            "PING" | "ECHO" | "SELECT" | "QUIT" | "COMMAND" | "CLIENT" | "CONFIG" | "TIME"
            | "READONLY" | "READWRITE" | "ASKING" | "AUTH" | "MULTI" | "DISCARD" => {
                return Fast::Done(self.exec(args, out))
            }
            "GET" | "MGET" | "EXISTS" | "SET" | "MSET" | "INCR" | "DECR" | "INCRBY" | "DECRBY" => {}
            _ => return Fast::Slow,
        }
        if let Some(close) = self.gate(cmd, args, out) {
            return Fast::Done(close);
        }
        let reply = match cmd {
            "GET" if n == 2 => {
                if impossible_key(&args[1]) {
                    Reply::Nil
                } else {
                    match self.consistent(LOOP_PATIENCE, |s| s.find_or_pin(&args[1], rbuf)) {
                        Some(Some(Found::Read(at))) => return Fast::Value(at),
                        Some(Some(Found::Pinned(pin))) => return Fast::Pinned(pin),
                        Some(None) => Reply::Nil,
                        None => return Fast::Slow,
                    }
                }
            }
            // Every key read between two batches' writes (a snapshot, as
            // Redis's MGET is), else a worker's (which also waits longer,
            // and reads through a client when this node does not serve).
            "MGET" if n >= 2 && n - 1 <= MGET_STEP => {
                let keys = &args[1..];
                let all = self.consistent(LOOP_PATIENCE, |s| {
                    keys.iter()
                        .map(|k| s.local_get_once(k))
                        .collect::<Option<Vec<_>>>()
                });
                match all {
                    Some(all) => Reply::Array(
                        all.into_iter()
                            .map(|v| v.map_or(Reply::Nil, Reply::Bulk))
                            .collect(),
                    ),
                    None => return Fast::Slow,
                }
            }
            // `EXISTS` the same way: how many of the keys (each time it is
            // named) have a value, each read into `rbuf` and not copied out.
            "EXISTS" if n >= 2 && n - 1 <= MGET_STEP => {
                let keys = &args[1..];
                let found = self.consistent(LOOP_PATIENCE, |s| {
                    keys.iter().try_fold(0i64, |found, k| {
                        Some(found + s.local_find(k, rbuf)?.is_some() as i64)
                    })
                });
                match found {
                    Some(found) => Reply::Int(found),
                    None => return Fast::Slow,
                }
            }
            "SET" if n >= 3 => {
                let o = match set_options(&args[3..], false) {
                    Ok(o) => o,
                    Err(r) => return self.done(r, out),
                };
                if o.get || !self.primary_known(now) {
                    return Fast::Slow;
                }
                let ttl = match put_ttl("set", &o.ttl, lookup::wall_ms) {
                    Ok(t) => t,
                    Err(r) => return self.done(r, out),
                };
                if let Some(r) = value_too_long(args[2].len()) {
                    return self.done(r, out);
                }
                // A large value is taken, not copied (its buffer is not
                // the decoder's to reuse then).
                let data = match args[2].len() >= PIN_MIN {
                    true => Bytes::from(std::mem::take(&mut args[2])),
                    false => Bytes::copy_from_slice(&args[2]),
                };
                let op = Op::Put {
                    key: args[1].clone(),
                    data,
                    cond: o.cond,
                    ttl,
                };
                return self.submit(op, Kind::Set);
            }
            // One batch (one replicated write), answered as `SET` is; a
            // larger `MSET`, cut into several, is a worker's.
            "MSET" if n % 2 == 1 => {
                if !self.primary_known(now) || !one_batch(&args[1..]) {
                    return Fast::Slow;
                }
                if let Some(r) = args[2..]
                    .iter()
                    .step_by(2)
                    .find_map(|v| value_too_long(v.len()))
                {
                    return self.done(r, out);
                }
                let op = Op::Batch {
                    ops: puts(&args[1..], Cond::Always),
                    all_or_none: false,
                };
                return self.submit(op, Kind::Mset);
            }
            "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
                let by = match incr_amount(cmd, args) {
                    Ok(by) => by,
                    Err(r) => return self.done(r, out),
                };
                if let Err(e) = proto::check_key(&args[1]) {
                    return self.done(Reply::err(format!("ERR {e}")), out);
                }
                if !self.primary_known(now) {
                    return Fast::Slow;
                }
                let op = Op::Modify {
                    key: args[1].clone(),
                    how: Modify::IncrBy(by),
                };
                return self.submit(op, Kind::Incr);
            }
            // A wrong arity the table does not know of: the worker's
            // answer (Redis's words for it are there).
            _ => return Fast::Slow,
        };
        out.reply(&reply);
        Fast::Done(false)
    }

    fn done(&mut self, r: Reply, out: &mut Out) -> Fast {
        out.reply(&r);
        Fast::Done(false)
    }

    /// A write for the loop to submit.
    fn submit(&mut self, op: Op, kind: Kind) -> Fast {
        Fast::Write(Pending {
            req_id: self.next_req(),
            op,
            kind,
        })
    }

    /// Whether this node was the primary when the door last asked, less
    /// than [`ROLE_TTL`] ago (the check [`Session::not_primary`] makes
    /// without asking; asking is a worker's), as of `now` (the loop's
    /// pass: a clock read per write was 0.7% of the loop's thread).
    fn primary_known(&self, now: Instant) -> bool {
        match &*self.shared.role.lock().expect("role") {
            Some((at, s, _)) => {
                now.saturating_duration_since(*at) < ROLE_TTL && s.role == proto::ROLE_PRIMARY
            }
            None => false,
        }
    }

    /// The reply to write `p` given the node loop's answer `first`, or
    /// `Err(p)` when the write must be asked again through a client (a
    /// worker's: [`Self::answer_slow`]).
    pub(super) fn answer(
        &mut self,
        p: Pending,
        first: &mut Option<Result<proto::Reply, StoreError>>,
    ) -> Result<Reply, Pending> {
        if !Session::is_final(first) {
            return Err(p);
        }
        let r = match first.take() {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(store_err(e.into())),
            None => unreachable!("is_final"),
        };
        Ok(reply_of(p.kind, r))
    }

    /// [`Self::local_find`] for a `GET` on the loop, which sends a large
    /// value from the arena itself rather than copy it out and check its
    /// checksum (43% of the loop's time in 1 MiB `GET`s): an object
    /// of [`PIN_MIN`] bytes or more is read only as far as its key
    /// ([`lookup::Lookup::on_read_head`]), and its value pinned
    /// ([`crate::arena::pins`]) if no write of the arena began since the
    /// look-up did, which also proves the heads it read whole. Otherwise
    /// (a write meanwhile, or a small value) as [`Self::local_find`].
    pub(super) fn find_or_pin(&mut self, key: &[u8], buf: &mut Vec<u8>) -> Option<Option<Found>> {
        let front = self.shared.front.clone();
        let checked = |s: &mut Self, buf: &mut Vec<u8>| {
            Some(s.local_find(key, buf)?.map(|(at, _)| Found::Read(at)))
        };
        let (Some(since), false) = (front.write_epoch(), impossible_key(key)) else {
            return checked(self, buf);
        };
        let Some(layout) = self.layout() else {
            return checked(self, buf);
        };
        let arena_len = front.arena().len;
        let (mut l, mut step) = lookup::Lookup::start(key, layout, None);
        l.keep_data(false);
        let head_len = crate::object::HEADER_LEN + key.len();
        // Whether any read was a head (unchecked), and whether the last was.
        let (mut heads, mut last_head) = (false, false);
        let outcome = loop {
            match step {
                lookup::Step::Read { offset, len } => {
                    let len = len as usize;
                    if offset.saturating_add(len as u64) > arena_len {
                        return checked(self, buf);
                    }
                    if buf.len() < len {
                        buf.resize(len, 0);
                    }
                    if len >= PIN_MIN && len > head_len {
                        if !front.read(offset, &mut buf[..head_len]) {
                            return checked(self, buf);
                        }
                        if let Some(s) = l.on_read_head(&buf[..head_len], len) {
                            (heads, last_head) = (true, true);
                            step = s;
                            continue;
                        }
                    }
                    if !front.read(offset, &mut buf[..len]) {
                        return checked(self, buf);
                    }
                    last_head = false;
                    step = l.on_read(&buf[..len]);
                }
                lookup::Step::Done(o) => break o,
            }
        };
        match outcome {
            lookup::Outcome::Found {
                offset,
                data_at,
                data_len,
                deadline,
                ..
            } if last_head => {
                if !lookup::live_now(deadline) {
                    return match front.unchanged(since) {
                        true => Some(None),
                        false => checked(self, buf),
                    };
                }
                match front.pin(offset + data_at as u64, data_len as u64, since) {
                    Some(pin) => Some(Some(Found::Pinned(pin))),
                    None => checked(self, buf),
                }
            }
            // Decided on heads not checked: only if nothing was written.
            _ if heads && !front.unchanged(since) => checked(self, buf),
            lookup::Outcome::Found {
                data_at,
                data_len,
                deadline,
                ..
            } => {
                Some(lookup::live_now(deadline).then_some(Found::Read(data_at..data_at + data_len)))
            }
            lookup::Outcome::Absent => Some(None),
            lookup::Outcome::GaveUp => None,
        }
    }

    /// [`Self::answer`] for a write whose answer did not come (or came
    /// from a node no longer the primary): asked again, under the same
    /// request id, through this connection's client.
    pub(super) fn answer_slow(
        &mut self,
        p: Pending,
        first: Option<Result<proto::Reply, StoreError>>,
    ) -> Reply {
        let r = self.write_answer(p.req_id, p.op, first);
        reply_of(p.kind, r)
    }
}

/// The reply to a write of `kind` that the store answered `r`.
fn reply_of(kind: Kind, r: Result<proto::Reply, Reply>) -> Reply {
    match (kind, r) {
        (_, Err(r)) => r,
        (_, Ok(proto::Reply::Refused(text))) => Reply::err(text),
        (Kind::Set, Ok(proto::Reply::Stored { .. })) => Reply::ok(),
        (Kind::Set, Ok(proto::Reply::NotStored)) => Reply::Nil,
        (Kind::Mset, Ok(proto::Reply::Batch(_))) => Reply::ok(),
        (Kind::Incr, Ok(proto::Reply::Modified { value: Some(v), .. })) => {
            match crate::redis_int::redis_i64(&v) {
                Some(n) => Reply::Int(n),
                None => Reply::err("ERR the store answered a counter that is not a number"),
            }
        }
        (Kind::Incr, Ok(proto::Reply::Modified { value: None, .. })) => {
            Reply::err("ERR the store answered no counter")
        }
        (_, Ok(r)) => Reply::err(format!("ERR unexpected answer {r:?}")),
    }
}
