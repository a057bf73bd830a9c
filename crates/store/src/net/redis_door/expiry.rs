//! Redis's expiry commands: `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT`
//! (with `NX`, `XX`, `GT`, `LT`), `PERSIST`, `TTL`, `PTTL`, `EXPIRETIME`,
//! `PEXPIRETIME` and `GETEX`. (`SET`'s `EX`/`PX`/`EXAT`/`PXAT`/`KEEPTTL`
//! and `SETEX`/`PSETEX` are puts with a deadline, `strings.rs`.)
//!
//! A deadline is Unix milliseconds in the key's object header; the door
//! turns a relative time into one by its clock, which is the primary's
//! (writes are taken by the primary's door only). The primary decides
//! expiry by its own clock: a change of deadline is one replicated
//! [`Modify::Expire`], and a deadline already past removes the key, as
//! Redis does; so a failover neither brings back an expired key nor
//! drops a live one early. Readers count a key absent
//! [`crate::lookup::CLOCK_BOUND_MS`] before its deadline.

use super::session::{impossible_key, integer, Session};
use super::strings::{deadline_of, invalid_expire, set_options, TtlOption};
use crate::lookup;
use crate::object;
use crate::proto::{self, ExpireWhen, Modify, Op};
use crate::resp_codec::Reply;

impl Session {
    /// `EXPIRE k s`, `PEXPIRE k ms`, `EXPIREAT k s`, `PEXPIREAT k ms`,
    /// each `[NX|XX|GT|LT]`: 1 if the deadline changed (or the key was
    /// removed, the deadline being past), else 0.
    pub(super) fn expire(&mut self, cmd: &str, args: &[Vec<u8>]) -> Reply {
        let how = match expire_how(cmd, args, lookup::wall_ms()) {
            Ok(how) => how,
            Err(r) => return r,
        };
        if impossible_key(&args[1]) {
            return Reply::Int(0);
        }
        match self.modify(&args[1], how) {
            Ok((_, len)) => Reply::Int(len as i64),
            Err(r) => r,
        }
    }

    /// `PERSIST k`: 1 if the key had a deadline (now none), else 0.
    pub(super) fn persist(&mut self, key: &[u8]) -> Reply {
        if impossible_key(key) {
            return Reply::Int(0);
        }
        match self.modify(key, PERSIST) {
            Ok((_, len)) => Reply::Int(len as i64),
            Err(r) => r,
        }
    }

    /// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`: -2 for an absent key,
    /// -1 for one with no deadline, else as [`ttl_reply`] says. From this
    /// node's arena while it serves reads, else asked of the primary (a
    /// write without effects, [`Modify::Deadline`]).
    pub(super) fn ttl(&mut self, cmd: &str, key: &[u8]) -> Reply {
        if impossible_key(key) {
            return Reply::Int(-2);
        }
        let local = self.consistent(super::session::CONSISTENT_WAIT, |s| s.local_entry_once(key));
        let deadline = match local {
            Some(e) => e.map(|(_, d)| d),
            None => match self.write(Op::Modify {
                key: key.to_vec(),
                how: Modify::Deadline,
            }) {
                Ok(proto::Reply::Modified { len, .. }) => Some(len),
                Ok(proto::Reply::NoKey) => None,
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            },
        };
        ttl_reply(cmd, deadline, lookup::wall_ms())
    }

    /// `GETEX k [EX s|PX ms|EXAT s|PXAT ms|PERSIST]`: the value, and the
    /// deadline changed in the same write (a batch of a read and a
    /// [`Modify::Expire`]); without options a `GET`.
    pub(super) fn getex(&mut self, args: &[Vec<u8>]) -> Reply {
        let how = match getex_how(args, lookup::wall_ms()) {
            Ok(Some(how)) => how,
            Ok(None) => return self.get(&args[1]),
            Err(r) => {
                // Redis checks the time only once it found the key.
                return match self.get(&args[1]) {
                    Reply::Nil => Reply::Nil,
                    _ => r,
                };
            }
        };
        let key = &args[1];
        if impossible_key(key) {
            return Reply::Nil;
        }
        if let Some(r) = self.not_primary(key) {
            return r;
        }
        let ops = vec![
            Op::Modify {
                key: key.clone(),
                how: Modify::Peek,
            },
            Op::Modify {
                key: key.clone(),
                how,
            },
        ];
        match self.write(Op::Batch {
            ops,
            all_or_none: false,
        }) {
            Ok(proto::Reply::Batch(r)) => match r.first() {
                Some(proto::Reply::Modified { value: Some(v), .. }) => Reply::Bulk(v.clone()),
                Some(proto::Reply::Refused(t)) => Reply::err(t.clone()),
                _ => Reply::Nil,
            },
            Ok(r) => Reply::err(format!("ERR unexpected answer {r:?}")),
            Err(r) => r,
        }
    }
}

/// `PERSIST`: no deadline, if the key has one.
pub(super) const PERSIST: Modify = Modify::Expire {
    at: 0,
    when: ExpireWhen::IfSet,
};

/// The [`Modify::Expire`] of `EXPIRE`, `PEXPIRE`, `EXPIREAT` or
/// `PEXPIREAT` (`args`: the command, key, time and options) at `now_ms`,
/// checked as Redis checks it (`expireGenericCommand`: the options first,
/// then the time, which may be negative but must not overflow). A time at
/// or before now removes the key. One past [`object::MAX_DEADLINE`] (the
/// year 10889), which Redis takes, is refused with Redis's error for an
/// overflow: a named difference.
pub(super) fn expire_how(cmd: &str, args: &[Vec<u8>], now_ms: u64) -> Result<Modify, Reply> {
    let when = expire_when(&args[3..])?;
    let n = integer(&args[2])?;
    let (seconds, relative) = match cmd {
        "EXPIRE" => (true, true),
        "PEXPIRE" => (false, true),
        "EXPIREAT" => (true, false),
        _ => (false, false),
    };
    let ms = match seconds {
        true => n.checked_mul(1000).ok_or_else(|| invalid_expire(cmd))?,
        false => n,
    };
    let base = if relative { now_ms as i64 } else { 0 };
    let at = ms.checked_add(base).ok_or_else(|| invalid_expire(cmd))?;
    if at > object::MAX_DEADLINE as i64 {
        return Err(invalid_expire(cmd));
    }
    // At or before now (1: a deadline long past; 0 would mean none).
    Ok(Modify::Expire {
        at: at.max(1) as u64,
        when,
    })
}

/// `EXPIRE`'s options as Redis parses them
/// (`parseExtendedExpireArgumentsOrReply`).
fn expire_when(opts: &[Vec<u8>]) -> Result<ExpireWhen, Reply> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in opts {
        match super::session::upper(o).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            _ => {
                return Err(Reply::err(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(o)
                )))
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::err(
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(Reply::err(
            "ERR GT and LT options at the same time are not compatible",
        ));
    }
    Ok(match (nx, xx, gt, lt) {
        (true, ..) => ExpireWhen::IfNone,
        // GT already fails without a deadline.
        (_, _, true, _) => ExpireWhen::IfLater,
        (_, true, _, true) => ExpireWhen::IfSetAndEarlier,
        (_, true, _, _) => ExpireWhen::IfSet,
        (_, _, _, true) => ExpireWhen::IfEarlier,
        _ => ExpireWhen::Always,
    })
}

/// `GETEX`'s change of deadline: `None` without one (a plain read).
pub(super) fn getex_how(args: &[Vec<u8>], now_ms: u64) -> Result<Option<Modify>, Reply> {
    let o = set_options(&args[2..], true)?;
    Ok(match o.ttl {
        TtlOption::Clear | TtlOption::Keep => None,
        TtlOption::Persist => Some(PERSIST),
        TtlOption::Time { unit, arg } => Some(Modify::Expire {
            at: deadline_of("getex", unit, &arg, now_ms)?,
            when: ExpireWhen::Always,
        }),
    })
}

/// `TTL` (seconds, rounded), `PTTL` (milliseconds), `EXPIRETIME` (Unix
/// seconds, rounded), `PEXPIRETIME` (Unix milliseconds) of a key whose
/// deadline is `deadline` (`None`: absent; 0: none) at `now_ms`, as
/// Redis's `ttlGenericCommand` computes them.
pub(super) fn ttl_reply(cmd: &str, deadline: Option<u64>, now_ms: u64) -> Reply {
    let d = match deadline {
        None => return Reply::Int(-2),
        Some(0) => return Reply::Int(-1),
        Some(d) => d as i64,
    };
    let v = match cmd {
        "TTL" => ((d - now_ms as i64).max(0) + 500) / 1000,
        "PTTL" => (d - now_ms as i64).max(0),
        "EXPIRETIME" => (d + 500) / 1000,
        _ => d,
    };
    Reply::Int(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn expire_times_become_deadlines_as_redis_computes_them() {
        let at = |line: &str| {
            let a = args(line);
            expire_how(&crate::net::redis_door::session::upper(&a[0]), &a, NOW)
        };
        let m = |at, when| Modify::Expire { at, when };
        assert_eq!(at("EXPIRE k 10"), Ok(m(NOW + 10_000, ExpireWhen::Always)));
        assert_eq!(at("PEXPIRE k 10 NX"), Ok(m(NOW + 10, ExpireWhen::IfNone)));
        assert_eq!(at("EXPIREAT k 5 xx"), Ok(m(5_000, ExpireWhen::IfSet)));
        assert_eq!(at("PEXPIREAT k 0 GT"), Ok(m(1, ExpireWhen::IfLater)));
        assert_eq!(
            at("EXPIRE k -5 LT XX"),
            Ok(m(NOW - 5_000, ExpireWhen::IfSetAndEarlier))
        );
        assert_eq!(at("EXPIREAT k -5"), Ok(m(1, ExpireWhen::Always)));
        assert_eq!(
            at("EXPIRE k 5 GT XX"),
            Ok(m(NOW + 5_000, ExpireWhen::IfLater))
        );
        let err = |line: &str| match at(line) {
            Err(Reply::Error(e)) => e,
            r => panic!("{line}: {r:?}"),
        };
        assert_eq!(
            err("EXPIRE k 9223372036854775807"),
            "ERR invalid expire time in 'expire' command"
        );
        assert_eq!(
            err("PEXPIRE k 9223372036854775807"),
            "ERR invalid expire time in 'pexpire' command"
        );
        assert_eq!(
            err("EXPIRE k x"),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(err("EXPIRE k x FOO"), "ERR Unsupported option FOO");
        assert_eq!(
            err("EXPIRE k 1 NX GT"),
            "ERR NX and XX, GT or LT options at the same time are not compatible"
        );
        assert_eq!(
            err("EXPIRE k 1 GT LT"),
            "ERR GT and LT options at the same time are not compatible"
        );
        // Past the header's 48 bits: refused (Redis would take it).
        assert_eq!(
            err("PEXPIREAT k 281474976710656"),
            "ERR invalid expire time in 'pexpireat' command"
        );
        assert_eq!(
            at("PEXPIREAT k 281474976710655"),
            Ok(m(object::MAX_DEADLINE, ExpireWhen::Always))
        );
    }

    #[test]
    fn ttls_round_as_redis_rounds_them() {
        assert_eq!(ttl_reply("TTL", None, NOW), Reply::Int(-2));
        assert_eq!(ttl_reply("PTTL", Some(0), NOW), Reply::Int(-1));
        assert_eq!(ttl_reply("TTL", Some(NOW + 1_499), NOW), Reply::Int(1));
        assert_eq!(ttl_reply("TTL", Some(NOW + 1_500), NOW), Reply::Int(2));
        assert_eq!(ttl_reply("PTTL", Some(NOW + 1_500), NOW), Reply::Int(1_500));
        assert_eq!(ttl_reply("PTTL", Some(NOW - 5), NOW), Reply::Int(0));
        assert_eq!(ttl_reply("EXPIRETIME", Some(2_500), NOW), Reply::Int(3));
        assert_eq!(
            ttl_reply("PEXPIRETIME", Some(2_500), NOW),
            Reply::Int(2_500)
        );
    }

    #[test]
    fn getex_options_parse_as_redis_parses_them() {
        let how = |line: &str| getex_how(&args(line), NOW);
        assert_eq!(how("GETEX k"), Ok(None));
        assert_eq!(how("GETEX k PERSIST"), Ok(Some(PERSIST)));
        assert_eq!(
            how("GETEX k EX 2 EX 3"),
            Ok(Some(Modify::Expire {
                at: NOW + 3_000,
                when: ExpireWhen::Always
            }))
        );
        for bad in [
            "GETEX k EX 1 PX 2",
            "GETEX k NX",
            "GETEX k PERSIST EX 1",
            "GETEX k EX",
        ] {
            assert_eq!(how(bad), Err(Reply::err("ERR syntax error")), "{bad}");
        }
        assert_eq!(
            how("GETEX k EX 0"),
            Err(Reply::err("ERR invalid expire time in 'getex' command"))
        );
    }
}
