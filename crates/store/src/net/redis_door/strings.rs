//! Redis's read-modify-write string commands: `INCR`/`INCRBY`/`DECR`/
//! `DECRBY`, `INCRBYFLOAT`, `APPEND`, `SETRANGE`, `GETSET`, `GETDEL` and `SET ... GET`.
//! Each is one store write ([`Op::Modify`]): the primary decides the new
//! value from the current one, in order with every other write, and
//! replicates the result as one write, so two clients' `INCR`s never
//! both add to the same value, and a failover shows each whole or not at
//! all. A value that does not suit (`INCR` of "abc") is refused in order
//! too, and changes nothing.

use super::session::{integer, upper, Session};
use crate::proto::{self, Cond, Modify, Op};
use crate::resp_codec::Reply;

impl Session {
    /// Runs `how` on `key`'s value if this node is the primary.
    fn modify(&mut self, key: &[u8], how: Modify) -> Result<(Option<Vec<u8>>, u64), Reply> {
        if let Err(e) = proto::check_key(key) {
            return Err(Reply::err(format!("ERR {e}")));
        }
        if let Some(r) = self.not_primary(key) {
            return Err(r);
        }
        self.cache.remove(key);
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
            Ok((Some(v), _)) => match proto::redis_i64(&v) {
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

    /// `GETSET k v` (and `SET ... GET` with `cond`): the old value.
    pub(super) fn getset(&mut self, key: &[u8], data: &[u8], cond: Cond) -> Reply {
        let data = data.to_vec();
        match self.modify(key, Modify::Swap { data, cond }) {
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

    /// `SET k v [NX|XX] [GET]`.
    pub(super) fn set(&mut self, args: &[Vec<u8>]) -> Reply {
        let (cond, get) = match set_options(&args[3..]) {
            Ok(o) => o,
            Err(r) => return r,
        };
        if get {
            return self.getset(&args[1], &args[2], cond);
        }
        match self.put(&args[1], &args[2], cond) {
            Ok(true) => Reply::ok(),
            Ok(false) => Reply::Nil,
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

/// `SET k v`'s options: its condition and whether `GET` was given.
/// Repeated flags are taken, conflicting ones refused, as Redis parses them.
pub(super) fn set_options(opts: &[Vec<u8>]) -> Result<(Cond, bool), Reply> {
    let mut cond = Cond::Always;
    let mut get = false;
    for o in opts {
        match upper(o).as_str() {
            "NX" if cond != Cond::IfPresent => cond = Cond::IfAbsent,
            "XX" if cond != Cond::IfAbsent => cond = Cond::IfPresent,
            "GET" => get = true,
            "EX" | "PX" | "EXAT" | "PXAT" | "KEEPTTL" => {
                return Err(Reply::err(
                    "ERR TTLs are not supported: the store does not expire keys",
                ))
            }
            _ => return Err(Reply::err("ERR syntax error")),
        }
    }
    Ok((cond, get))
}
