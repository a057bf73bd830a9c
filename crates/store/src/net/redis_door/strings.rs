//! Redis's read-modify-write string commands: `INCR`/`INCRBY`/`DECR`/
//! `DECRBY`, `INCRBYFLOAT`, `APPEND`, `SETRANGE`, `GETSET`, `GETDEL` and `SET ... GET`.
//! Each is one store write ([`Op::Modify`]): the primary decides the new
//! value from the current one, in order with every other write, and
//! replicates the result as one write, so two clients' `INCR`s never
//! both add to the same value, and a failover shows each whole or not at
//! all. A value that does not suit (`INCR` of "abc") is refused in order
//! too, and changes nothing.

use super::session::{integer, upper, Session};
use crate::lookup;
use crate::object;
use crate::proto::{self, Bytes, Cond, Modify, Op, Ttl};
use crate::resp_codec::Reply;

impl Session {
    /// Runs `how` on `key`'s value if this node is the primary.
    pub(super) fn modify(
        &mut self,
        key: &[u8],
        how: Modify,
    ) -> Result<(Option<Vec<u8>>, u64), Reply> {
        if let Err(e) = proto::check_key(key) {
            return Err(Reply::err(format!("ERR {e}")));
        }
        if let Some(r) = self.not_primary(key) {
            return Err(r);
        }
        match self.write(Op::Modify {
            key: key.to_vec(),
            how,
        })? {
            proto::Reply::Modified { value, len } => Ok((value, len)),
            proto::Reply::Refused(text) => Err(Reply::err(text)),
            r => Err(Reply::err(format!("ERR unexpected answer {r:?}"))),
        }
    }

    /// `INCR`, `DECR`, `INCRBY k n`, `DECRBY k n`.
    pub(super) fn incr(&mut self, cmd: &str, args: &[Vec<u8>]) -> Reply {
        let by = match incr_amount(cmd, args) {
            Ok(by) => by,
            Err(r) => return r,
        };
        match self.modify(&args[1], Modify::IncrBy(by)) {
            Ok((Some(v), _)) => match crate::redis_int::redis_i64(&v) {
                Some(n) => Reply::Int(n),
                None => Reply::err("ERR the store answered a counter that is not a number"),
            },
            Ok((None, _)) => Reply::err("ERR the store answered no counter"),
            Err(r) => r,
        }
    }

    /// `INCRBYFLOAT k by`: the new value, as Redis prints it.
    pub(super) fn incrbyfloat(&mut self, args: &[Vec<u8>]) -> Reply {
        match self.modify(&args[1], Modify::IncrByFloat(args[2].clone())) {
            Ok((Some(v), _)) => Reply::Bulk(v),
            Ok((None, _)) => Reply::err("ERR the store answered no number"),
            Err(r) => r,
        }
    }

    /// `APPEND k v`: the new length.
    pub(super) fn append(&mut self, args: &[Vec<u8>]) -> Reply {
        match self.modify(&args[1], Modify::Append(args[2].clone())) {
            Ok((_, len)) => Reply::Int(len as i64),
            Err(r) => r,
        }
    }

    /// `SETRANGE k offset v`: the new length.
    pub(super) fn setrange(&mut self, args: &[Vec<u8>]) -> Reply {
        let offset = match integer(&args[2]) {
            Ok(o) if o < 0 => return Reply::err("ERR offset is out of range"),
            Ok(o) => o as u64,
            Err(r) => return r,
        };
        let data = args[3].clone();
        match self.modify(&args[1], Modify::SetRange { offset, data }) {
            Ok((_, len)) => Reply::Int(len as i64),
            Err(r) => r,
        }
    }

    /// `GETSET k v` (and `SET ... GET` with `cond` and `ttl`): the old
    /// value.
    pub(super) fn getset(&mut self, key: &[u8], data: &[u8], cond: Cond, ttl: Ttl) -> Reply {
        let data = Bytes::copy_from_slice(data);
        match self.modify(key, Modify::Swap { data, cond, ttl }) {
            Ok((Some(old), _)) => Reply::Bulk(old),
            Ok((None, _)) => Reply::Nil,
            Err(r) => r,
        }
    }

    /// `GETDEL k`: the old value.
    pub(super) fn getdel(&mut self, key: &[u8]) -> Reply {
        if proto::check_key(key).is_err() {
            return Reply::Nil;
        }
        match self.modify(key, Modify::Take) {
            Ok((Some(old), _)) => Reply::Bulk(old),
            Ok((None, _)) => Reply::Nil,
            Err(r) => r,
        }
    }

    /// `SET k v [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`.
    pub(super) fn set(&mut self, args: &[Vec<u8>]) -> Reply {
        let o = match set_options(&args[3..], false) {
            Ok(o) => o,
            Err(r) => return r,
        };
        let ttl = match put_ttl("set", &o.ttl, lookup::wall_ms) {
            Ok(t) => t,
            Err(r) => return r,
        };
        if o.get {
            return self.getset(&args[1], &args[2], o.cond, ttl);
        }
        match self.put(&args[1], &args[2], o.cond, ttl) {
            Ok(true) => Reply::ok(),
            Ok(false) => Reply::Nil,
            Err(r) => r,
        }
    }

    /// `SETEX k s v`, `PSETEX k ms v`.
    pub(super) fn setex(&mut self, cmd: &str, args: &[Vec<u8>]) -> Reply {
        let unit = match cmd {
            "SETEX" => TimeUnit::Ex,
            _ => TimeUnit::Px,
        };
        let at = match deadline_of(cmd, unit, &args[2], lookup::wall_ms()) {
            Ok(at) => at,
            Err(r) => return r,
        };
        match self.put(&args[1], &args[3], Cond::Always, Ttl::At(at)) {
            Ok(_) => Reply::ok(),
            Err(r) => r,
        }
    }
}

/// The amount `INCR`, `DECR`, `INCRBY k n` or `DECRBY k n` adds.
pub(super) fn incr_amount(cmd: &str, args: &[Vec<u8>]) -> Result<i64, Reply> {
    Ok(match cmd {
        "INCR" => 1,
        "DECR" => -1,
        "INCRBY" => integer(&args[2])?,
        _ => integer(&args[2])?
            .checked_neg()
            .ok_or_else(|| Reply::err("ERR decrement would overflow"))?,
    })
}

/// The options of `SET` (and, with `getex`, of `GETEX`), as Redis parses
/// them (`parseExtendedStringArgumentsOrReply`): a flag may repeat, a
/// time unit too (the last one counts), conflicting ones are a syntax
/// error.
pub(super) fn set_options(opts: &[Vec<u8>], getex: bool) -> Result<SetOptions, Reply> {
    let mut o = SetOptions {
        cond: Cond::Always,
        get: false,
        ttl: TtlOption::Clear,
    };
    let mut i = 0;
    while i < opts.len() {
        let word = upper(&opts[i]);
        let unit = match word.as_str() {
            "EX" => Some(TimeUnit::Ex),
            "PX" => Some(TimeUnit::Px),
            "EXAT" => Some(TimeUnit::ExAt),
            "PXAT" => Some(TimeUnit::PxAt),
            _ => None,
        };
        let set = !getex;
        if let Some(unit) = unit {
            // Another unit, KEEPTTL or PERSIST before it: a conflict.
            let free = match &o.ttl {
                TtlOption::Clear => true,
                TtlOption::Time { unit: u, .. } => *u == unit,
                TtlOption::Keep | TtlOption::Persist => false,
            };
            if !free || i + 1 == opts.len() {
                return Err(Reply::err("ERR syntax error"));
            }
            o.ttl = TtlOption::Time {
                unit,
                arg: opts[i + 1].clone(),
            };
            i += 2;
            continue;
        }
        match (word.as_str(), &o.ttl) {
            ("NX", _) if set && o.cond != Cond::IfPresent => o.cond = Cond::IfAbsent,
            ("XX", _) if set && o.cond != Cond::IfAbsent => o.cond = Cond::IfPresent,
            ("GET", _) if set => o.get = true,
            ("KEEPTTL", TtlOption::Clear | TtlOption::Keep) if set => o.ttl = TtlOption::Keep,
            ("PERSIST", TtlOption::Clear | TtlOption::Persist) if getex => {
                o.ttl = TtlOption::Persist
            }
            _ => return Err(Reply::err("ERR syntax error")),
        }
        i += 1;
    }
    Ok(o)
}

/// The options of a `SET`-like command ([`set_options`]).
pub(super) struct SetOptions {
    pub(super) cond: Cond,
    /// `GET`: answer the old value.
    pub(super) get: bool,
    pub(super) ttl: TtlOption,
}

/// A deadline as a command gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TtlOption {
    /// None given: a put clears the key's deadline, `GETEX` keeps it.
    Clear,
    /// `KEEPTTL`.
    Keep,
    /// `GETEX ... PERSIST`.
    Persist,
    /// `EX`, `PX`, `EXAT` or `PXAT` and its argument.
    Time { unit: TimeUnit, arg: Vec<u8> },
}

/// The unit of a deadline's argument, and whether it is relative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TimeUnit {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// Unix seconds.
    ExAt,
    /// Unix milliseconds.
    PxAt,
}

/// The error Redis gives a deadline it cannot take, naming the command.
pub(super) fn invalid_expire(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR invalid expire time in '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

/// The deadline (Unix milliseconds) of `SET`'s, `SETEX`'s or `GETEX`'s
/// time `arg` in `unit`, at `now_ms`, checked as Redis checks it
/// (`getExpireMillisecondsOrReply`: a positive integer, no overflow).
/// One past [`object::MAX_DEADLINE`] (the year 10889), which Redis
/// takes, is refused with the same error: a named difference.
pub(super) fn deadline_of(
    cmd: &str,
    unit: TimeUnit,
    arg: &[u8],
    now_ms: u64,
) -> Result<u64, Reply> {
    let n = integer(arg)?;
    let seconds = matches!(unit, TimeUnit::Ex | TimeUnit::ExAt);
    if n <= 0 || (seconds && n > i64::MAX / 1000) {
        return Err(invalid_expire(cmd));
    }
    let ms = if seconds { n * 1000 } else { n };
    let ms = match unit {
        TimeUnit::Ex | TimeUnit::Px => ms.checked_add(now_ms as i64),
        TimeUnit::ExAt | TimeUnit::PxAt => Some(ms),
    };
    match ms {
        Some(ms) if ms as u64 <= object::MAX_DEADLINE => Ok(ms as u64),
        _ => Err(invalid_expire(cmd)),
    }
}

/// The deadline a `SET`-like command's [`TtlOption`] gives its put.
pub(super) fn put_ttl(
    cmd: &str,
    ttl: &TtlOption,
    now_ms: impl FnOnce() -> u64,
) -> Result<Ttl, Reply> {
    Ok(match ttl {
        TtlOption::Clear | TtlOption::Persist => Ttl::Clear,
        TtlOption::Keep => Ttl::Keep,
        TtlOption::Time { unit, arg } => Ttl::At(deadline_of(cmd, *unit, arg, now_ms())?),
    })
}
