//! Transactions: `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`.
//!
//! Between `MULTI` and `EXEC` the door queues commands (`+QUEUED`),
//! checking only what Redis checks then (a known command, its arity) and
//! what this store can run inside one: the keyed string commands below,
//! and `PING`/`ECHO`. `EXEC` turns the queue into **one** [`Op::Batch`]:
//! each command becomes its writes (a read becomes [`Modify::Peek`], the
//! value as of that point of the transaction), planned in order by the
//! primary and replicated as one write, so the transaction is atomic on
//! every node, to every other transaction and to the door's reads (which
//! wait out a batch being written into the arena), and the answers come back in the
//! batch's reply. `WATCH` notes each key's version (the sequence number of
//! its latest write) and `EXEC` puts a [`Modify::Unchanged`] check of each
//! first in the batch: a key written since makes the batch a write without
//! effects and `EXEC` answers a null array, as Redis does. A command's own
//! error (a syntax error, `INCR` of a word) is its entry in `EXEC`'s array
//! and the others run, as in Redis; a queued command Redis would refuse
//! (unknown, wrong arity) makes `EXEC` answer `-EXECABORT`.

use super::expiry::{expire_how, getex_how, ttl_reply, PERSIST};
use super::session::{impossible_key, integer, upper, value_too_long, Session};
use super::strings::{deadline_of, incr_amount, put_ttl, set_options, TimeUnit};
use crate::lookup;
use crate::proto::{self, Bytes, Cond, Modify, Op, Ttl};
use crate::resp_codec::Reply;

/// The open transaction of a connection.
#[derive(Default)]
pub(super) struct Multi {
    queued: Vec<Vec<Vec<u8>>>,
    /// A command was refused while queueing: `EXEC` aborts.
    failed: bool,
}

/// How a command's replies in the batch become its answer.
enum Finish {
    /// No writes: this answer.
    Const(Reply),
    SetOk,
    SetNx,
    Removed,
    /// `EXISTS`/`MGET`: per key, whether it has a write in the batch.
    Exists(Vec<bool>),
    MGet(Vec<bool>),
    /// The value the write answered (`GET`, `GETSET`, `INCRBYFLOAT`, ...).
    Value,
    /// The length the write answered (`STRLEN`, `APPEND`, `SETRANGE`).
    Len,
    Type,
    Range(i64, i64),
    Int,
    Ok,
    /// `TTL` and its kin (the command): from the deadline the write
    /// answered.
    Ttl(&'static str),
    /// `GETEX` with a time Redis refuses: `nil` if the key is absent,
    /// else this error.
    ErrorIfPresent(Reply),
}

/// A queued command as writes of the batch.
struct Planned {
    ops: Vec<Op>,
    finish: Finish,
}

/// Commands a transaction may hold.
const IN_MULTI: &[&str] = &[
    "GET",
    "SET",
    "SETNX",
    "DEL",
    "UNLINK",
    "EXISTS",
    "MGET",
    "MSET",
    "INCR",
    "DECR",
    "INCRBY",
    "DECRBY",
    "INCRBYFLOAT",
    "APPEND",
    "SETRANGE",
    "GETSET",
    "GETDEL",
    "STRLEN",
    "TYPE",
    "GETRANGE",
    "SUBSTR",
    "SETEX",
    "PSETEX",
    "GETEX",
    "EXPIRE",
    "PEXPIRE",
    "EXPIREAT",
    "PEXPIREAT",
    "PERSIST",
    "TTL",
    "PTTL",
    "EXPIRETIME",
    "PEXPIRETIME",
    "PING",
    "ECHO",
];

impl Session {
    /// Whether a transaction is open.
    pub(super) fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// A command refused before it ran (unknown, wrong arity): inside a
    /// transaction, `EXEC` will abort.
    pub(super) fn multi_refused(&mut self) {
        if let Some(m) = &mut self.multi {
            m.failed = true;
        }
    }

    /// `MULTI`.
    pub(super) fn multi(&mut self) -> Reply {
        if self.multi.is_some() {
            return Reply::err("ERR MULTI calls can not be nested");
        }
        self.multi = Some(Multi::default());
        Reply::ok()
    }

    /// A command inside a transaction: queued, or refused (and `EXEC`
    /// will abort).
    pub(super) fn queue(&mut self, cmd: &str, args: &[Vec<u8>]) -> Reply {
        let m = self.multi.as_mut().expect("a transaction is open");
        if cmd == "WATCH" {
            return Reply::err("ERR WATCH inside MULTI is not allowed");
        }
        if !IN_MULTI.contains(&cmd) {
            m.failed = true;
            return Reply::err(format!(
                "ERR {cmd} inside MULTI is not supported by this store (string commands, PING \
                 and ECHO are)"
            ));
        }
        m.queued.push(args.to_vec());
        Reply::Simple("QUEUED".into())
    }

    /// `DISCARD`.
    pub(super) fn discard(&mut self) -> Reply {
        if self.multi.take().is_none() {
            return Reply::err("ERR DISCARD without MULTI");
        }
        self.watched.clear();
        Reply::ok()
    }

    /// `WATCH k...`: each key's version now.
    pub(super) fn watch(&mut self, keys: &[Vec<u8>]) -> Reply {
        if self.multi.is_some() {
            return Reply::err("ERR WATCH inside MULTI is not allowed");
        }
        for k in keys {
            if impossible_key(k) {
                continue; // never written: never changes
            }
            let version = match self.write(Op::Get { key: k.clone() }) {
                Ok(proto::Reply::Value { version, .. }) => Some(version),
                Ok(proto::Reply::NoKey) => None,
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            };
            self.watched.push((k.clone(), version));
        }
        Reply::ok()
    }

    /// `UNWATCH`.
    pub(super) fn unwatch(&mut self) -> Reply {
        self.watched.clear();
        Reply::ok()
    }

    /// `EXEC`: the queue as one batch.
    pub(super) fn exec_multi(&mut self) -> Reply {
        let Some(m) = self.multi.take() else {
            return Reply::err("ERR EXEC without MULTI");
        };
        let watched = std::mem::take(&mut self.watched);
        if m.failed {
            return Reply::err("EXECABORT Transaction discarded because of previous errors.");
        }
        let plans: Vec<Result<Planned, Reply>> = m.queued.iter().map(|a| plan(a)).collect();
        let mut ops: Vec<Op> = watched
            .iter()
            .map(|(key, version)| Op::Modify {
                key: key.clone(),
                how: Modify::Unchanged { version: *version },
            })
            .collect();
        let guards = ops.len();
        ops.extend(plans.iter().flatten().flat_map(|p| p.ops.iter().cloned()));
        let replies = if ops.is_empty() {
            Vec::new()
        } else {
            let key = match &ops[0] {
                Op::Put { key, .. } | Op::Remove { key } | Op::Modify { key, .. } => key.clone(),
                _ => unreachable!("keyed writes only"),
            };
            if let Some(r) = self.not_primary(&key) {
                return r;
            }
            match self.write(Op::Batch {
                ops,
                all_or_none: false,
            }) {
                Ok(proto::Reply::Batch(r)) => r,
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            }
        };
        if replies[..guards.min(replies.len())]
            .iter()
            .any(|r| matches!(r, proto::Reply::Changed))
        {
            return Reply::NilArray;
        }
        let mut rest = replies.get(guards..).unwrap_or_default();
        let mut out = Vec::with_capacity(plans.len());
        for p in plans {
            match p {
                Err(r) => out.push(r),
                Ok(p) => {
                    let (mine, after) = rest.split_at(p.ops.len().min(rest.len()));
                    rest = after;
                    out.push(finish(p.finish, mine));
                }
            }
        }
        Reply::Array(out)
    }
}

/// A queued command as writes of the batch, or its error.
fn plan(args: &[Vec<u8>]) -> Result<Planned, Reply> {
    let cmd = upper(&args[0]);
    // Relative times count from `EXEC`, as in Redis.
    let now = lookup::wall_ms();
    let modify = |key: &[u8], how: Modify| -> Result<Op, Reply> {
        proto::check_key(key).map_err(|e| Reply::err(format!("ERR {e}")))?;
        Ok(Op::Modify {
            key: key.to_vec(),
            how,
        })
    };
    let put = |key: &[u8], data: &[u8], cond: Cond, ttl: Ttl| -> Result<Op, Reply> {
        proto::check_key(key).map_err(|e| Reply::err(format!("ERR {e}")))?;
        if let Some(r) = value_too_long(data.len()) {
            return Err(r);
        }
        Ok(Op::Put {
            key: key.to_vec(),
            data: Bytes::copy_from_slice(data),
            cond,
            ttl,
        })
    };
    let one = |op: Op, finish: Finish| {
        Ok(Planned {
            ops: vec![op],
            finish,
        })
    };
    // Reads of keys that cannot exist have no write: absent.
    let peeks = |keys: &[Vec<u8>]| -> (Vec<Op>, Vec<bool>) {
        let mask: Vec<bool> = keys.iter().map(|k| !impossible_key(k)).collect();
        let ops = keys
            .iter()
            .filter(|k| !impossible_key(k))
            .map(|k| Op::Modify {
                key: k.clone(),
                how: Modify::Peek,
            })
            .collect();
        (ops, mask)
    };
    // A key that cannot exist has no write: `absent` is the answer.
    let read = |key: &[u8], how: Modify, finish: Finish, absent: Reply| {
        if impossible_key(key) {
            return Ok(Planned {
                ops: Vec::new(),
                finish: Finish::Const(absent),
            });
        }
        one(modify(key, how)?, finish)
    };
    match cmd.as_str() {
        "PING" => Ok(Planned {
            ops: Vec::new(),
            finish: Finish::Const(match args.len() {
                1 => Reply::Simple("PONG".into()),
                _ => Reply::Bulk(args[1].clone()),
            }),
        }),
        "ECHO" => Ok(Planned {
            ops: Vec::new(),
            finish: Finish::Const(Reply::Bulk(args[1].clone())),
        }),
        "GET" => read(&args[1], Modify::Peek, Finish::Value, Reply::Nil),
        "STRLEN" => read(&args[1], Modify::Peek, Finish::Len, Reply::Int(0)),
        "TYPE" => read(
            &args[1],
            Modify::Peek,
            Finish::Type,
            Reply::Simple("none".into()),
        ),
        "GETRANGE" | "SUBSTR" => {
            let (a, b) = (integer(&args[2])?, integer(&args[3])?);
            let finish = Finish::Range(a, b);
            read(&args[1], Modify::Peek, finish, Reply::Bulk(Vec::new()))
        }
        "EXISTS" | "MGET" => {
            let (ops, mask) = peeks(&args[1..]);
            let finish = match cmd.as_str() {
                "EXISTS" => Finish::Exists(mask),
                _ => Finish::MGet(mask),
            };
            Ok(Planned { ops, finish })
        }
        "SET" => {
            let o = set_options(&args[3..], false)?;
            let ttl = put_ttl("set", &o.ttl, || now)?;
            if o.get {
                let how = Modify::Swap {
                    data: Bytes::copy_from_slice(&args[2]),
                    cond: o.cond,
                    ttl,
                };
                return one(modify(&args[1], how)?, Finish::Value);
            }
            one(put(&args[1], &args[2], o.cond, ttl)?, Finish::SetOk)
        }
        "SETEX" | "PSETEX" => {
            let unit = match cmd.as_str() {
                "SETEX" => TimeUnit::Ex,
                _ => TimeUnit::Px,
            };
            let at = deadline_of(&cmd, unit, &args[2], now)?;
            one(
                put(&args[1], &args[3], Cond::Always, Ttl::At(at))?,
                Finish::Ok,
            )
        }
        "GETEX" => match getex_how(args, now) {
            Ok(None) => read(&args[1], Modify::Peek, Finish::Value, Reply::Nil),
            Ok(Some(how)) if !impossible_key(&args[1]) => Ok(Planned {
                ops: vec![modify(&args[1], Modify::Peek)?, modify(&args[1], how)?],
                finish: Finish::Value,
            }),
            Ok(Some(_)) => read(&args[1], Modify::Peek, Finish::Value, Reply::Nil),
            Err(r) => read(
                &args[1],
                Modify::Peek,
                Finish::ErrorIfPresent(r),
                Reply::Nil,
            ),
        },
        "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => {
            let how = expire_how(&cmd, args, now)?;
            read(&args[1], how, Finish::Len, Reply::Int(0))
        }
        "PERSIST" => read(&args[1], PERSIST, Finish::Len, Reply::Int(0)),
        "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => {
            let name = IN_MULTI.iter().find(|c| **c == cmd).expect("listed");
            read(
                &args[1],
                Modify::Deadline,
                Finish::Ttl(name),
                Reply::Int(-2),
            )
        }
        "SETNX" => one(
            put(&args[1], &args[2], Cond::IfAbsent, Ttl::Clear)?,
            Finish::SetNx,
        ),
        "MSET" => {
            if args.len().is_multiple_of(2) {
                return Err(super::session::wrong_args("MSET"));
            }
            let ops = args[1..]
                .chunks(2)
                .map(|p| put(&p[0], &p[1], Cond::Always, Ttl::Clear))
                .collect::<Result<_, _>>()?;
            Ok(Planned {
                ops,
                finish: Finish::Ok,
            })
        }
        "DEL" | "UNLINK" => Ok(Planned {
            ops: args[1..]
                .iter()
                .filter(|k| !impossible_key(k))
                .map(|k| Op::Remove { key: k.clone() })
                .collect(),
            finish: Finish::Removed,
        }),
        "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
            let by = incr_amount(&cmd, args)?;
            one(modify(&args[1], Modify::IncrBy(by))?, Finish::Int)
        }
        "INCRBYFLOAT" => one(
            modify(&args[1], Modify::IncrByFloat(args[2].clone()))?,
            Finish::Value,
        ),
        "APPEND" => one(
            modify(&args[1], Modify::Append(args[2].clone()))?,
            Finish::Len,
        ),
        "SETRANGE" => {
            let offset = match integer(&args[2])? {
                o if o < 0 => return Err(Reply::err("ERR offset is out of range")),
                o => o as u64,
            };
            let how = Modify::SetRange {
                offset,
                data: args[3].clone(),
            };
            one(modify(&args[1], how)?, Finish::Len)
        }
        "GETSET" => {
            let how = Modify::Swap {
                data: Bytes::copy_from_slice(&args[2]),
                cond: Cond::Always,
                ttl: Ttl::Clear,
            };
            one(modify(&args[1], how)?, Finish::Value)
        }
        "GETDEL" => read(&args[1], Modify::Take, Finish::Value, Reply::Nil),
        _ => Err(Reply::err(format!(
            "ERR {cmd} inside MULTI is not supported"
        ))),
    }
}

/// A command's answer from its writes' replies.
fn finish(f: Finish, replies: &[proto::Reply]) -> Reply {
    if let Some(text) = replies.iter().find_map(|r| match r {
        proto::Reply::Refused(t) => Some(t),
        _ => None,
    }) {
        return Reply::err(text.clone());
    }
    let value = |i: usize| match replies.get(i) {
        Some(proto::Reply::Modified { value, len }) => (value.clone(), *len),
        _ => (None, 0),
    };
    let masked = |mask: &[bool]| {
        let mut i = 0;
        mask.iter()
            .map(|&has| {
                has.then(|| {
                    i += 1;
                    value(i - 1).0
                })
                .flatten()
            })
            .collect::<Vec<_>>()
    };
    match f {
        Finish::Const(r) => r,
        Finish::SetOk => match replies.first() {
            Some(proto::Reply::Stored { .. }) => Reply::ok(),
            _ => Reply::Nil,
        },
        Finish::SetNx => {
            Reply::Int(matches!(replies.first(), Some(proto::Reply::Stored { .. })) as i64)
        }
        Finish::Removed => Reply::Int(
            replies
                .iter()
                .filter(|r| matches!(r, proto::Reply::Removed { existed: true }))
                .count() as i64,
        ),
        Finish::Exists(mask) => {
            Reply::Int(masked(&mask).iter().filter(|v| v.is_some()).count() as i64)
        }
        Finish::MGet(mask) => Reply::Array(
            masked(&mask)
                .into_iter()
                .map(|v| v.map_or(Reply::Nil, Reply::Bulk))
                .collect(),
        ),
        Finish::Value => value(0).0.map_or(Reply::Nil, Reply::Bulk),
        Finish::Len => Reply::Int(value(0).1 as i64),
        Finish::Type => match value(0).0 {
            Some(_) => Reply::Simple("string".into()),
            None => Reply::Simple("none".into()),
        },
        Finish::Range(a, b) => {
            Reply::Bulk(super::commands::range(&value(0).0.unwrap_or_default(), a, b).to_vec())
        }
        Finish::Int => match value(0).0.as_deref().and_then(crate::redis_int::redis_i64) {
            Some(n) => Reply::Int(n),
            None => Reply::err("ERR the store answered a counter that is not a number"),
        },
        Finish::Ok => Reply::ok(),
        Finish::Ttl(cmd) => {
            let deadline = match replies.first() {
                Some(proto::Reply::Modified { len, .. }) => Some(*len),
                _ => None,
            };
            ttl_reply(cmd, deadline, lookup::wall_ms())
        }
        Finish::ErrorIfPresent(r) => match value(0).0 {
            Some(_) => r,
            None => Reply::Nil,
        },
    }
}
