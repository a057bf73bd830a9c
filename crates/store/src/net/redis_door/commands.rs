//! The commands of the front door (the table in the module's doc), each
//! a method of the connection's [`Session`].

use super::command_table;
use super::session::{
    impossible_key, integer, store_err, upper, value_too_long, wrong_args, Out, Session,
};
use crate::proto::{self, Bytes, Cond, Op, Ttl};
use crate::resp_codec::Reply;

/// Keys per step of `MGET`/`EXISTS` (their values are encoded and written
/// out step by step).
pub(super) const MGET_STEP: usize = 4 * crate::net::link::READ_BATCH;

/// How long an `MGET` step tries to read all its keys between two
/// batches' writes before it reads them key by key.
const MGET_PATIENCE: std::time::Duration = std::time::Duration::from_millis(2);

impl Session {
    /// Runs one command, its reply written to `out`; whether to close the
    /// connection.
    pub(super) fn exec(&mut self, args: &[Vec<u8>], out: &mut Out) -> bool {
        let cmd = upper(&args[0]);
        if let Some(close) = self.gate(&cmd, args, out) {
            return close;
        }
        self.dispatch(&cmd, args, out)
    }

    /// What comes before any command runs: its arity, the connection's
    /// right to run it, a transaction's queue. `Some(close)` when that
    /// answered the command (its reply written to `out`).
    pub(super) fn gate(&mut self, cmd: &str, args: &[Vec<u8>], out: &mut Out) -> Option<bool> {
        let n = args.len();
        // Redis checks the arity first, for every command it knows.
        if command_table::find(cmd).is_some_and(|c| !command_table::arity_ok(c, n)) {
            self.multi_refused();
            out.reply(&wrong_args(cmd));
            return Some(false);
        }
        if let Err((reply, close)) = self.admit(cmd) {
            self.multi_refused();
            out.reply(&reply);
            return Some(close);
        }
        // Inside a transaction every other command is queued.
        if self.in_multi() && !matches!(cmd, "EXEC" | "DISCARD" | "MULTI" | "QUIT") {
            let reply = match command_table::find(cmd) {
                Some(_) => self.queue(cmd, args),
                None => {
                    self.multi_refused();
                    unknown(args)
                }
            };
            out.reply(&reply);
            return Some(false);
        }
        None
    }

    /// Runs command `cmd` (admitted by [`Self::gate`]); whether to close
    /// the connection.
    fn dispatch(&mut self, cmd: &str, args: &[Vec<u8>], out: &mut Out) -> bool {
        let cmd = cmd.to_string();
        let n = args.len();
        let reply = match cmd.as_str() {
            "AUTH" => self.auth(args),
            "PING" => match n {
                1 => Reply::Simple("PONG".into()),
                2 => Reply::Bulk(args[1].clone()),
                _ => wrong_args(&cmd),
            },
            "ECHO" if n == 2 => Reply::Bulk(args[1].clone()),
            "QUIT" => {
                out.reply(&Reply::ok());
                return true;
            }
            // One database: a cluster node's answer.
            "SELECT" if n == 2 => match integer(&args[1]) {
                Ok(0) => Reply::ok(),
                Ok(_) => Reply::err("ERR SELECT is not allowed in cluster mode"),
                Err(r) => r,
            },
            "HELLO" => self.hello(args, out),
            "COMMAND" => self.command(args),
            "CLIENT" if n >= 2 => self.client(args),
            "CONFIG" if n >= 2 => self.config(args),
            "CLUSTER" => self.cluster(args),
            "READONLY" | "READWRITE" | "ASKING" if n == 1 => Reply::ok(),
            "ROLE" if n == 1 => self.role_reply(),
            "TIME" if n == 1 => self.time(),
            "TYPE" if n == 2 => match self.value(&args[1]) {
                Ok(Some(_)) => Reply::Simple("string".into()),
                Ok(None) => Reply::Simple("none".into()),
                Err(r) => r,
            },
            "STRLEN" if n == 2 => match self.value(&args[1]) {
                Ok(v) => Reply::Int(v.map_or(0, |v| v.len() as i64)),
                Err(r) => r,
            },
            "GETRANGE" | "SUBSTR" if n == 4 => match (integer(&args[2]), integer(&args[3])) {
                (Err(r), _) | (_, Err(r)) => r,
                (Ok(start), Ok(end)) => match self.value(&args[1]) {
                    Ok(v) => Reply::Bulk(range(&v.unwrap_or_default(), start, end).to_vec()),
                    Err(r) => r,
                },
            },
            "GET" if n == 2 => self.get(&args[1]),
            "SET" if n >= 3 => self.set(args),
            "SETNX" if n == 3 => match self.put(&args[1], &args[2], Cond::IfAbsent, Ttl::Clear) {
                Ok(true) => Reply::Int(1),
                Ok(false) => Reply::Int(0),
                Err(r) => r,
            },
            "DEL" | "UNLINK" if n >= 2 => self.del(&args[1..]),
            "INCR" | "DECR" | "INCRBY" | "DECRBY" => self.incr(&cmd, args),
            "APPEND" => self.append(args),
            "INCRBYFLOAT" => self.incrbyfloat(args),
            "SETRANGE" => self.setrange(args),
            "GETSET" => self.getset(&args[1], &args[2], Cond::Always, Ttl::Clear),
            "SETEX" | "PSETEX" => self.setex(&cmd, args),
            "GETEX" => self.getex(args),
            "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => self.expire(&cmd, args),
            "PERSIST" => self.persist(&args[1]),
            "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => self.ttl(&cmd, &args[1]),
            "GETDEL" => self.getdel(&args[1]),
            "EXISTS" if n >= 2 => {
                let mut found = 0;
                for step in args[1..].chunks(MGET_STEP) {
                    match self.mget(step) {
                        Ok(v) => found += v.iter().filter(|r| matches!(r, Reply::Bulk(_))).count(),
                        Err(r) => {
                            out.reply(&r);
                            return false;
                        }
                    }
                }
                Reply::Int(found as i64)
            }
            "MGET" if n >= 2 => {
                // Step by step, each step's values written out before the
                // next is read: a long MGET never holds all its values.
                // The first step is read before anything is written, so
                // its failure is the reply; a later step that fails (the
                // primary lost meanwhile, and no new one in time) cannot
                // be answered inside the array, so it ends the connection
                // as a node's death would.
                for (i, step) in args[1..].chunks(MGET_STEP).enumerate() {
                    let got = self.mget(step);
                    match (i, got) {
                        (0, Err(r)) => {
                            out.reply(&r);
                            return false;
                        }
                        (_, Err(_)) => return true,
                        (i, Ok(v)) => {
                            if i == 0 {
                                out.raw(format!("*{}\r\n", n - 1).as_bytes());
                            }
                            v.iter().for_each(|r| out.reply(r));
                        }
                    }
                    if out.broken {
                        return true;
                    }
                }
                return false;
            }
            "MSET" if n % 2 == 1 => self.mset(&args[1..]),
            "MSETNX" if n % 2 == 1 => self.msetnx(&args[1..]),
            "KEYS" if n == 2 => match self.shared.pooled(|c| c.scan(&args[1])) {
                Ok(Ok(keys)) => Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
                Ok(Err(e)) => store_err(e),
                Err(r) => r,
            },
            "SCAN" if n >= 2 => self.scan(args),
            "DBSIZE" if n == 1 => match self.role(true) {
                Ok((s, _)) => Reply::Int(s.keys as i64),
                Err(r) => r,
            },
            "WAIT" if n == 3 => self.wait(args),
            "FLUSHDB" | "FLUSHALL" => self.flush(args),
            "MULTI" => self.multi(),
            "EXEC" => self.exec_multi(),
            "DISCARD" => self.discard(),
            "WATCH" => self.watch(&args[1..]),
            "UNWATCH" => self.unwatch(),
            "INFO" => self.info_reply(args),
            _ if command_table::find(&cmd).is_some() => wrong_args(&cmd),
            _ => unknown(args),
        };
        out.reply(&reply);
        false
    }

    /// `key`'s value (a read, as `GET` does it).
    fn value(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Reply> {
        match self.get(key) {
            Reply::Bulk(v) => Ok(Some(v)),
            Reply::Nil => Ok(None),
            r => Err(r),
        }
    }

    /// `GET k`.
    pub(super) fn get(&mut self, key: &[u8]) -> Reply {
        match self.local_get(key) {
            Some(Some(v)) => return Reply::Bulk(v),
            Some(None) => return Reply::Nil,
            None => {}
        }
        match self.shared.pooled(|c| c.get(key)) {
            Ok(Ok(Some(v))) => Reply::Bulk(v),
            Ok(Ok(None)) => Reply::Nil,
            Ok(Err(e)) => store_err(e),
            Err(r) => r,
        }
    }

    /// A put (its deadline as `ttl` says) if this node is the primary:
    /// whether it was stored.
    pub(super) fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        ttl: Ttl,
    ) -> Result<bool, Reply> {
        if let Some(r) = self.not_primary(key) {
            return Err(r);
        }
        if let Some(r) = value_too_long(value.len()) {
            return Err(r);
        }
        let op = Op::Put {
            key: key.to_vec(),
            data: Bytes::copy_from_slice(value),
            cond,
            ttl,
        };
        match self.write(op)? {
            proto::Reply::Stored { .. } => Ok(true),
            proto::Reply::NotStored => Ok(false),
            proto::Reply::Refused(text) => Err(Reply::err(text)),
            r => Err(Reply::err(format!("ERR unexpected answer {r:?}"))),
        }
    }

    /// `DEL`/`UNLINK`: the removes as one batch (every node and reader
    /// sees all of them or none), in consecutive batches past one
    /// replicated write; the count that existed.
    fn del(&mut self, keys: &[Vec<u8>]) -> Reply {
        if let Some(r) = self.not_primary(&keys[0]) {
            return r;
        }
        let ops: Vec<Op> = keys
            .iter()
            .filter(|k| !impossible_key(k))
            .map(|k| Op::Remove { key: k.clone() })
            .collect();
        self.remove_all(ops)
    }

    /// Runs `ops` (removes) in batches ([`cut`]); the count of keys that
    /// existed.
    fn remove_all(&mut self, ops: Vec<Op>) -> Reply {
        let mut n = 0;
        for batch in cut(&ops) {
            match self.write(Op::Batch {
                ops: batch.to_vec(),
                all_or_none: false,
            }) {
                Ok(proto::Reply::Batch(r)) => {
                    n += r
                        .iter()
                        .filter(|r| matches!(r, proto::Reply::Removed { existed: true }))
                        .count() as i64
                }
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            }
        }
        Reply::Int(n)
    }

    /// `FLUSHDB [ASYNC|SYNC]`, `FLUSHALL [ASYNC|SYNC]`: every key removed,
    /// in batches of removes (each atomic; the whole is not: a write
    /// during the flush may stay).
    fn flush(&mut self, args: &[Vec<u8>]) -> Reply {
        if args.len() > 2
            || args
                .get(1)
                .is_some_and(|a| !matches!(upper(a).as_str(), "ASYNC" | "SYNC"))
        {
            return Reply::err("ERR syntax error");
        }
        if let Some(r) = self.not_primary(b"flush") {
            return r;
        }
        let keys = match self.shared.pooled(|c| c.scan(b"")) {
            Ok(Ok(keys)) => keys,
            Ok(Err(e)) => return store_err(e),
            Err(r) => return r,
        };
        let ops = keys.into_iter().map(|key| Op::Remove { key }).collect();
        match self.remove_all(ops) {
            Reply::Int(_) => Reply::ok(),
            r => r,
        }
    }

    /// The values of `keys` (a step of `MGET`), in order.
    fn mget(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Reply>, Reply> {
        // From the local arena while this node is the primary: all keys
        // between two batches' writes if that comes soon (a snapshot, as
        // Redis's MGET is), else key by key (each between two batches).
        let all = self.consistent(MGET_PATIENCE, |s| {
            keys.iter()
                .map(|k| s.local_get_once(k))
                .collect::<Option<Vec<_>>>()
        });
        if let Some(all) = all {
            return Ok(all
                .into_iter()
                .map(|v| v.map_or(Reply::Nil, Reply::Bulk))
                .collect());
        }
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match self.local_get(k) {
                Some(v) => out.push(v.map_or(Reply::Nil, Reply::Bulk)),
                None => break,
            }
        }
        if out.len() == keys.len() {
            return Ok(out);
        }
        // The rest through a client: the primary's arena, Reads batched.
        let rest: Vec<&[u8]> = keys[out.len()..].iter().map(|k| k.as_slice()).collect();
        let got = self.shared.pooled(|c| c.get_many(&rest))?;
        for (k, r) in rest.iter().zip(got) {
            out.push(match r {
                Ok(Some(v)) => Reply::Bulk(v),
                Ok(None) => Reply::Nil,
                Err(_) if impossible_key(k) => Reply::Nil,
                Err(e) => return Err(store_err(e)),
            });
        }
        Ok(out)
    }

    /// `MSET`: the pairs as one batch ([`Op::Batch`]), replicated as one
    /// write: every node holds all of them or none, and a transaction
    /// sees all or none of them. A batch is one replicated frame, so an
    /// `MSET` larger than that ([`cut`]) is written as consecutive
    /// batches, each atomic, and a failure after the first says how many
    /// keys were set.
    fn mset(&mut self, kv: &[Vec<u8>]) -> Reply {
        if let Some(r) = self.check_pairs(kv) {
            return r;
        }
        let ops = puts(kv, Cond::Always);
        let mut done = 0;
        for batch in cut(&ops) {
            match self.write(Op::Batch {
                ops: batch.to_vec(),
                all_or_none: false,
            }) {
                Ok(proto::Reply::Batch(_)) => done += batch.len(),
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) if done == 0 => return r,
                Err(Reply::Error(text)) => {
                    return Reply::err(format!(
                        "{text} (an MSET larger than one replicated write is not atomic: the \
                         first {done} keys were set)"
                    ))
                }
                Err(r) => return r,
            }
        }
        Reply::ok()
    }

    /// `MSETNX`: every key set, or none when one exists (one batch, all
    /// or none); larger than one replicated write, refused.
    fn msetnx(&mut self, kv: &[Vec<u8>]) -> Reply {
        if let Some(r) = self.check_pairs(kv) {
            return r;
        }
        // Redis looks at every key before it sets any: a key given twice
        // is set (to its last value) when it did not exist. As puts each
        // seeing the one before, the key is put once, with that value.
        let mut last: Vec<Vec<u8>> = Vec::with_capacity(kv.len());
        let mut at = std::collections::HashMap::new();
        for p in kv.chunks(2) {
            match at.get(&p[0]) {
                Some(&i) => last[i + 1] = p[1].clone(),
                None => {
                    at.insert(&p[0], last.len());
                    last.extend([p[0].clone(), p[1].clone()]);
                }
            }
        }
        let ops = puts(&last, Cond::IfAbsent);
        let n = ops.len();
        match self.write(Op::Batch {
            ops,
            all_or_none: true,
        }) {
            Ok(proto::Reply::Batch(r)) => Reply::Int(
                (r.len() == n && r.iter().all(|r| matches!(r, proto::Reply::Stored { .. }))) as i64,
            ),
            Ok(r) => Reply::err(format!("ERR unexpected answer {r:?}")),
            Err(r) => r,
        }
    }

    /// What every pair of an `MSET` must be before anything is written:
    /// sent to the primary (a redirection otherwise), values within the
    /// limit.
    fn check_pairs(&mut self, kv: &[Vec<u8>]) -> Option<Reply> {
        if let Some(r) = self.not_primary(&kv[0]) {
            return Some(r);
        }
        kv.chunks(2).find_map(|p| value_too_long(p[1].len()))
    }

    fn scan(&mut self, args: &[Vec<u8>]) -> Reply {
        // One SCAN call covers the whole index (the store's own scan
        // walks it in steps), so every cursor but 0 is the end.
        let Ok(cursor) = std::str::from_utf8(&args[1])
            .map_err(|_| ())
            .and_then(|t| t.parse::<u64>().map_err(|_| ()))
        else {
            return Reply::err("ERR invalid cursor");
        };
        let mut pattern = Vec::new();
        let mut i = 2;
        while i < args.len() {
            match upper(&args[i]).as_str() {
                "MATCH" if i + 1 < args.len() => pattern = args[i + 1].clone(),
                "COUNT" if i + 1 < args.len() => match integer(&args[i + 1]) {
                    Ok(c) if c >= 1 => {}
                    Ok(_) => return Reply::err("ERR syntax error"),
                    Err(r) => return r,
                },
                _ => return Reply::err("ERR syntax error"),
            }
            i += 2;
        }
        if cursor != 0 {
            return Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
        }
        match self.shared.pooled(|c| c.scan(&pattern)) {
            Ok(Ok(keys)) => Reply::Array(vec![
                Reply::Bulk(b"0".to_vec()),
                Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
            ]),
            Ok(Err(e)) => store_err(e),
            Err(r) => r,
        }
    }
}

/// `GETRANGE`'s bytes of `v`: `start` to `end` inclusive, negative
/// indexes from the end, clamped, as Redis cuts them.
pub(super) fn range(v: &[u8], start: i64, end: i64) -> &[u8] {
    let len = v.len() as i64;
    if start < 0 && end < 0 && start > end {
        return &[];
    }
    let fix = |i: i64| if i < 0 { (len + i).max(0) } else { i };
    let (start, end) = (fix(start), fix(end).min(len - 1));
    if len == 0 || start > end || start >= len {
        return &[];
    }
    &v[start as usize..=end as usize]
}

/// The pairs `kv` as puts under `cond`.
pub(super) fn puts(kv: &[Vec<u8>], cond: Cond) -> Vec<Op> {
    kv.chunks(2)
        .map(|p| Op::Put {
            key: p[0].clone(),
            data: Bytes::copy_from_slice(&p[1]),
            cond,
            ttl: Ttl::Clear,
        })
        .collect()
}

/// The bytes of effects a batch may carry ([`cut`]).
const BATCH_BUDGET: usize = proto::MAX_BATCH_BYTES - 512;

/// What a keyed write of a `key_len`-byte key and a `data_len`-byte value
/// costs a batch ([`cut`]).
fn batch_cost(key_len: usize, data_len: usize) -> usize {
    2 * key_len + data_len + 128
}

/// Whether the puts of `MSET`'s pairs `kv` make one batch, which [`cut`]
/// would not cut (so `MSET` is one atomic write), without making them.
pub(super) fn one_batch(kv: &[Vec<u8>]) -> bool {
    let n = kv.len() / 2;
    n <= proto::MAX_BATCH_OPS
        && (n == 1
            || kv
                .chunks(2)
                .map(|p| batch_cost(p[0].len(), p[1].len()))
                .sum::<usize>()
                <= BATCH_BUDGET)
}

/// Keyed writes cut into batches whose replicated write fits a frame:
/// each replicates its key twice (the object, the index edit), its value
/// once, and about 100 bytes of effects and reply; at most
/// [`proto::MAX_BATCH_OPS`] writes. One batch when they fit (then they are
/// atomic together).
fn cut(ops: &[Op]) -> Vec<&[Op]> {
    let budget = BATCH_BUDGET;
    let cost = |op: &Op| match op {
        Op::Put { key, data, .. } => batch_cost(key.len(), data.len()),
        Op::Remove { key } | Op::Modify { key, .. } => batch_cost(key.len(), 0),
        _ => 128,
    };
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        let c = cost(op);
        if i > start && (used + c > budget || i - start >= proto::MAX_BATCH_OPS) {
            out.push(&ops[start..i]);
            (start, used) = (i, 0);
        }
        used += c;
    }
    if start < ops.len() {
        out.push(&ops[start..]);
    }
    out
}

/// An unknown command's error, worded as Redis words it.
fn unknown(args: &[Vec<u8>]) -> Reply {
    let mut text = format!(
        "ERR unknown command '{}', with args beginning with: ",
        String::from_utf8_lossy(&args[0])
    );
    for a in args[1..].iter().take(4) {
        text.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
    }
    Reply::err(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event loop's `MSET` takes one batch when `one_batch` says so,
    /// and a worker cuts the others: the two must agree on where the cut
    /// falls, at the byte and at the count.
    #[test]
    fn one_batch_is_exactly_what_cut_leaves_whole() {
        let pairs = |n: usize, v: usize| -> Vec<Vec<u8>> {
            (0..n)
                .flat_map(|i| [format!("k{:03}", i % 1000).into_bytes(), vec![7u8; v]])
                .collect()
        };
        // Two 4-byte keys: 2 * (8 + v + 128) bytes against the budget.
        let edge = BATCH_BUDGET / 2 - 136;
        for (n, v, whole) in [
            (1, 0, true),
            (1, BATCH_BUDGET + 1, true),
            (2, edge, true),
            (2, edge + 1, false),
            (10, 100, true),
            (proto::MAX_BATCH_OPS, 1, true),
            (proto::MAX_BATCH_OPS + 1, 1, false),
        ] {
            let kv = pairs(n, v);
            assert_eq!(one_batch(&kv), whole, "{n} pairs of {v} B");
            assert_eq!(
                cut(&puts(&kv, Cond::Always)).len() == 1,
                whole,
                "{n} pairs of {v} B"
            );
        }
    }
}
