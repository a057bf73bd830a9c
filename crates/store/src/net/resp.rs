//! The store's Redis-compatible front door: `softrdma store serve` with
//! `resp = "ADDR"` (or `--resp ADDR`) accepts RESP connections, so
//! `redis-cli`, `redis-benchmark` and Redis client libraries work
//! unchanged.
//!
//! Each connection is served by a thread with its own [`StoreClient`]
//! whose first node is this node: a RESP command is a store request like
//! any other (writes go through the primary's replication path and are
//! answered once replicated; reads are one-sided look-ups of the primary's
//! arena), so it keeps every guarantee of the native protocol. Commands:
//!
//! | command | store operation |
//! |---|---|
//! | `GET k` | one-sided look-up (`StoreClient::get`) |
//! | `SET k v [NX\|XX]` | `put` (Always / IfAbsent / IfPresent); `$-1` when the condition fails |
//! | `SETNX k v` | `put` IfAbsent: `:1` / `:0` |
//! | `DEL k...`, `UNLINK k...` | `remove` each: the count that existed |
//! | `EXISTS k...` | batched look-ups: the count found |
//! | `MGET k...` | `get_many` (look-ups side by side, Reads batched) |
//! | `MSET k v ...` | `put` each, in order (**not atomic** across keys: a failure part-way leaves the earlier keys set, and the error says how many) |
//! | `KEYS p`, `SCAN c [MATCH p] [COUNT n]` | `scan` of the committed index |
//! | `DBSIZE` | keys in the index (`status`) |
//! | `INFO [section]` | role, epoch, redundancy, keys, arena use |
//! | `WAIT n t` | at once: `:1` while the group is redundant, else `:0` (every write is acknowledged only once replicated, or, under `min_in_sync_replicas = 0` with the group degraded, held by the primary alone, which this reports) |
//! | `PING`, `ECHO`, `SELECT 0`, `QUIT`, `COMMAND`, `CONFIG GET`, `CLIENT SETNAME\|SETINFO` | what clients send when they connect |
//!
//! Anything else is answered `-ERR unknown command '...'`, as Redis does;
//! bytes that are not RESP get `-ERR Protocol error: ...` and the
//! connection is closed. A write sent to a node that is not the primary
//! is answered `-MOVED 0 HOST:PORT` naming the primary's RESP address
//! (`redis-cli -c` follows it), or `-READONLY` when no primary is known;
//! reads on any node are served (through the primary's arena). Values
//! are at most `net::link::MAX_VALUE` bytes, keys 1 to 1,024 bytes, and
//! TTLs (`EX`, `PX`, ...) are refused: the store does not expire keys.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use super::client::{ClientConfig, ClientError, StoreClient};
use super::server::Front;
use crate::index::Layout;
use crate::lookup::{Lookup, Outcome, Step};
use crate::proto::{self, Cond, Op, StatusInfo, StoreError};
use crate::resp::{self, Reply};

/// How long a node's role, as the front door last asked, is trusted
/// before a write asks again.
const ROLE_TTL: Duration = Duration::from_millis(100);

/// How long a request waits for the node loop before the front door asks
/// again through a client (same request id: it takes effect once).
const FRONT_TIMEOUT: Duration = Duration::from_secs(2);

struct Shared {
    /// This node first, then its peers (store addresses).
    nodes: Vec<SocketAddr>,
    /// This node's loop and arena.
    front: Arc<Front>,
    /// (when asked, this node's status, the primary's RESP address).
    role: Mutex<Option<(Instant, StatusInfo, Option<SocketAddr>)>>,
}

/// Serves RESP on `listener` for the node at `nodes[0]` (its peers
/// after it), one thread per connection, until the process ends.
pub fn spawn(
    listener: TcpListener,
    nodes: Vec<SocketAddr>,
    front: Arc<Front>,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        nodes,
        front,
        role: Mutex::new(None),
    });
    std::thread::Builder::new()
        .name("store-resp".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let shared = shared.clone();
                let _ = std::thread::Builder::new()
                    .name("store-resp-conn".into())
                    .spawn(move || serve_conn(conn, shared));
            }
        })?;
    Ok(())
}

fn serve_conn(mut conn: TcpStream, shared: Arc<Shared>) {
    let _ = conn.set_nodelay(true);
    let mut session = Session {
        shared,
        client: None,
        id: super::random_u64(),
        req: 0,
        layout: None,
        cache: HashMap::new(),
    };
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let mut used = 0;
        let mut close = false;
        loop {
            match resp::parse(&buf[used..]) {
                Ok(Some((args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, quit) = session.exec(&args);
                    reply.encode(&mut out);
                    if quit {
                        close = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    Reply::err(format!("ERR Protocol error: {e}")).encode(&mut out);
                    close = true;
                    break;
                }
            }
        }
        buf.drain(..used);
        if !out.is_empty() {
            if conn.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
        if close {
            return;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

struct Session {
    shared: Arc<Shared>,
    /// For what the node loop cannot answer here: reads while this node is
    /// not the primary, retries of requests whose answer did not come.
    client: Option<StoreClient>,
    /// This connection's client id, on both paths.
    id: u64,
    /// Request ids used before `client` existed.
    req: u64,
    /// The key index's layout, read from the local arena's superblock.
    layout: Option<Layout>,
    /// Key -> (arena offset, allocation length), as in `StoreClient`.
    cache: HashMap<Vec<u8>, (u64, u32)>,
}

fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
}

fn store_err(e: ClientError) -> Reply {
    match e {
        ClientError::Store(StoreError::BadKey { len, max }) => {
            Reply::err(format!("ERR key of {len} bytes: keys are 1 to {max} bytes"))
        }
        ClientError::Store(StoreError::Full { largest_free }) => Reply::err(format!(
            "OOM arena full (largest free range {largest_free} bytes)"
        )),
        ClientError::Store(e @ StoreError::IndexFull { .. }) => Reply::err(format!("OOM {e}")),
        ClientError::Store(e @ StoreError::NotEnoughReplicas) => {
            Reply::err(format!("NOREPLICAS {e}"))
        }
        ClientError::Unavailable(e) => Reply::err(format!("TRYAGAIN store unavailable: {e}")),
        e => Reply::err(format!("ERR {e}")),
    }
}

fn wrong_args(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

impl Session {
    fn client(&mut self) -> Result<&mut StoreClient, Reply> {
        if self.client.is_none() {
            let mut cfg = ClientConfig::new(self.shared.nodes.clone());
            cfg.id = Some(self.id);
            let mut c = StoreClient::new(cfg)
                .map_err(|e| Reply::err(format!("ERR cannot reach the store: {e}")))?;
            c.skip_req_ids(self.req);
            self.client = Some(c);
        }
        Ok(self.client.as_mut().expect("set above"))
    }

    fn next_req(&mut self) -> u64 {
        match &mut self.client {
            Some(c) => c.next_req_id(),
            None => {
                self.req += 1;
                self.req
            }
        }
    }

    /// A write: through this node's loop (the path a client's request
    /// takes, without the network); if no answer comes in time, or the
    /// node stopped being the primary while the write was pending (it may
    /// have been replicated), asked again through a client under the same
    /// request id, which makes it take effect once whatever happened.
    fn write(&mut self, op: Op) -> Result<proto::Reply, Reply> {
        let req_id = self.next_req();
        let first = self
            .shared
            .front
            .request(self.id, req_id, op.clone(), FRONT_TIMEOUT);
        match first {
            Some(Ok(r)) => Ok(r),
            Some(Err(StoreError::NotPrimary { .. }))
            | Some(Err(StoreError::StaleEpoch { .. }))
            | None => {
                let _ = self.role(true);
                self.client()?.request_as(req_id, op).map_err(store_err)
            }
            Some(Err(e)) => Err(store_err(e.into())),
        }
    }

    /// A keyed get served from this node's own arena, as a one-sided
    /// reader would (the same look-up, the reads checked against the
    /// STag's validity and deadline); `None` if this node does not serve
    /// reads now or the look-up gave up.
    fn local_get(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if crate::object::check_key(key).is_err() {
            return None;
        }
        let front = self.shared.front.clone();
        if self.layout.is_none() {
            let mut sb = [0u8; crate::index::SUPERBLOCK_LEN as usize];
            if !front.read(0, &mut sb) {
                return None;
            }
            self.layout = Layout::from_superblock(&sb, front.arena().len).ok();
        }
        let layout = self.layout?;
        let cached = self.cache.get(key).copied();
        let (mut l, mut step) = Lookup::start(key, layout, cached);
        let mut buf = Vec::new();
        loop {
            match step {
                Step::Read { offset, len } => {
                    buf.resize(len as usize, 0);
                    if !front.read(offset, &mut buf) {
                        return None;
                    }
                    step = l.on_read(&buf);
                }
                Step::Done(Outcome::Found {
                    offset, len, data, ..
                }) => {
                    self.cache.insert(key.to_vec(), (offset, len));
                    return Some(Some(data));
                }
                Step::Done(Outcome::Absent) => {
                    self.cache.remove(key);
                    return Some(None);
                }
                Step::Done(Outcome::GaveUp) => return None,
            }
        }
    }

    /// This node's status, asked at most every [`ROLE_TTL`] (by any
    /// connection), and the primary's RESP address when this node is not
    /// the primary.
    fn role(&mut self, fresh: bool) -> Result<(StatusInfo, Option<SocketAddr>), Reply> {
        if !fresh {
            if let Some((at, s, p)) = self.shared.role.lock().expect("role").clone() {
                if at.elapsed() < ROLE_TTL {
                    return Ok((s, p));
                }
            }
        }
        let nodes = self.shared.nodes.clone();
        let me = match self
            .shared
            .front
            .request(self.id, 0, Op::Status, FRONT_TIMEOUT)
        {
            Some(Ok(proto::Reply::Status(s))) => s,
            _ => return Err(Reply::err("TRYAGAIN this node does not answer")),
        };
        let mut primary = None;
        if me.role != proto::ROLE_PRIMARY {
            let c = self.client()?;
            for (i, addr) in nodes.iter().enumerate().skip(1) {
                if let Ok(s) = c.status_of(i) {
                    if s.role == proto::ROLE_PRIMARY && s.resp_port != 0 {
                        primary = Some(SocketAddr::new(addr.ip(), s.resp_port));
                    }
                }
            }
        }
        *self.shared.role.lock().expect("role") = Some((Instant::now(), me.clone(), primary));
        Ok((me, primary))
    }

    /// `None` if this node may take writes; else the redirection.
    fn not_primary(&mut self) -> Option<Reply> {
        match self.role(false) {
            Err(r) => Some(r),
            Ok((s, _)) if s.role == proto::ROLE_PRIMARY => None,
            Ok((_, Some(p))) => Some(Reply::err(format!("MOVED 0 {p}"))),
            Ok((s, None)) => Some(Reply::err(format!(
                "READONLY this node is {}, not the primary, and no primary is known",
                proto::role_name(s.role)
            ))),
        }
    }

    /// Runs one command: the reply, and whether to close the connection.
    fn exec(&mut self, args: &[Vec<u8>]) -> (Reply, bool) {
        let cmd = upper(&args[0]);
        let n = args.len();
        let reply = match cmd.as_str() {
            "PING" => match n {
                1 => Reply::Simple("PONG".into()),
                2 => Reply::Bulk(args[1].clone()),
                _ => wrong_args(&cmd),
            },
            "ECHO" if n == 2 => Reply::Bulk(args[1].clone()),
            "QUIT" => return (Reply::ok(), true),
            "SELECT" if n == 2 => match args[1].as_slice() {
                b"0" => Reply::ok(),
                _ => Reply::err("ERR DB index is out of range"),
            },
            "COMMAND" => Reply::Array(Vec::new()),
            "CLIENT" if n >= 2 && matches!(upper(&args[1]).as_str(), "SETNAME" | "SETINFO") => {
                Reply::ok()
            }
            "CONFIG" if n == 3 && upper(&args[1]) == "GET" => {
                match String::from_utf8_lossy(&args[2])
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "save" => {
                        Reply::Array(vec![Reply::Bulk(b"save".to_vec()), Reply::Bulk(Vec::new())])
                    }
                    "appendonly" => Reply::Array(vec![
                        Reply::Bulk(b"appendonly".to_vec()),
                        Reply::Bulk(b"no".to_vec()),
                    ]),
                    _ => Reply::Array(Vec::new()),
                }
            }
            "GET" if n == 2 => self.get(&args[1]),
            "SET" if n >= 3 => self.set(args),
            "SETNX" if n == 3 => match self.put(&args[1], &args[2], Cond::IfAbsent) {
                Ok(true) => Reply::Int(1),
                Ok(false) => Reply::Int(0),
                Err(r) => r,
            },
            "DEL" | "UNLINK" if n >= 2 => self.del(&args[1..]),
            "EXISTS" if n >= 2 => match self.mget(&args[1..]) {
                Ok(v) => Reply::Int(v.iter().filter(|r| **r != Reply::Nil).count() as i64),
                Err(r) => r,
            },
            "MGET" if n >= 2 => match self.mget(&args[1..]) {
                Ok(v) => Reply::Array(v),
                Err(r) => r,
            },
            "MSET" if n >= 3 && n % 2 == 1 => self.mset(&args[1..]),
            "KEYS" if n == 2 => match self.client().map(|c| c.scan(&args[1])) {
                Ok(Ok(keys)) => Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
                Ok(Err(e)) => store_err(e),
                Err(r) => r,
            },
            "SCAN" if n >= 2 => self.scan(args),
            "DBSIZE" if n == 1 => match self.role(true) {
                Ok((s, _)) => Reply::Int(s.keys as i64),
                Err(r) => r,
            },
            "WAIT" if n == 3 => match self.role(true) {
                Ok((s, _)) => Reply::Int(s.redundant as i64),
                Err(r) => r,
            },
            "INFO" => self.info(),
            "ECHO" | "SELECT" | "GET" | "SET" | "SETNX" | "DEL" | "UNLINK" | "EXISTS" | "MGET"
            | "MSET" | "KEYS" | "SCAN" | "DBSIZE" | "WAIT" => wrong_args(&cmd),
            _ => {
                // Worded as Redis words it.
                let mut text = format!(
                    "ERR unknown command '{}', with args beginning with: ",
                    String::from_utf8_lossy(&args[0])
                );
                for a in args[1..].iter().take(4) {
                    text.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
                }
                Reply::err(text)
            }
        };
        (reply, false)
    }

    fn get(&mut self, key: &[u8]) -> Reply {
        match self.local_get(key) {
            Some(Some(v)) => return Reply::Bulk(v),
            Some(None) => return Reply::Nil,
            None => {}
        }
        match self.client().map(|c| c.get(key)) {
            Ok(Ok(Some(v))) => Reply::Bulk(v),
            Ok(Ok(None)) => Reply::Nil,
            Ok(Err(e)) => store_err(e),
            Err(r) => r,
        }
    }

    /// A put if this node is the primary: whether it was stored.
    fn put(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<bool, Reply> {
        if let Some(r) = self.not_primary() {
            return Err(r);
        }
        if value.len() > super::link::MAX_VALUE {
            return Err(Reply::err(format!(
                "ERR value of {} bytes exceeds the limit of {} bytes",
                value.len(),
                super::link::MAX_VALUE
            )));
        }
        let op = Op::Put {
            key: key.to_vec(),
            data: value.to_vec(),
            cond,
        };
        match self.write(op)? {
            proto::Reply::Stored { .. } => Ok(true),
            proto::Reply::NotStored => Ok(false),
            r => Err(Reply::err(format!("ERR unexpected answer {r:?}"))),
        }
    }

    fn set(&mut self, args: &[Vec<u8>]) -> Reply {
        let mut cond = Cond::Always;
        for o in &args[3..] {
            match upper(o).as_str() {
                "NX" if cond == Cond::Always => cond = Cond::IfAbsent,
                "XX" if cond == Cond::Always => cond = Cond::IfPresent,
                "EX" | "PX" | "EXAT" | "PXAT" | "KEEPTTL" => {
                    return Reply::err("ERR TTLs are not supported: the store does not expire keys")
                }
                "GET" => return Reply::err("ERR SET ... GET is not supported"),
                _ => return Reply::err("ERR syntax error"),
            }
        }
        match self.put(&args[1], &args[2], cond) {
            Ok(true) => Reply::ok(),
            Ok(false) => Reply::Nil,
            Err(r) => r,
        }
    }

    fn del(&mut self, keys: &[Vec<u8>]) -> Reply {
        if let Some(r) = self.not_primary() {
            return r;
        }
        let mut n = 0;
        for k in keys {
            self.cache.remove(k);
            match self.write(Op::Remove { key: k.clone() }) {
                Ok(proto::Reply::Removed { existed }) => n += existed as i64,
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            }
        }
        Reply::Int(n)
    }

    fn mget(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Reply>, Reply> {
        // From the local arena while this node is the primary.
        let mut local = Vec::with_capacity(keys.len());
        for k in keys {
            match self.local_get(k) {
                Some(v) => local.push(v.map_or(Reply::Nil, Reply::Bulk)),
                None => break,
            }
        }
        if local.len() == keys.len() {
            return Ok(local);
        }
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let c = self.client()?;
        let mut out = Vec::with_capacity(keys.len());
        for r in c.get_many(&refs) {
            out.push(match r {
                Ok(Some(v)) => Reply::Bulk(v),
                Ok(None) => Reply::Nil,
                Err(e) => return Err(store_err(e)),
            });
        }
        Ok(out)
    }

    fn mset(&mut self, kv: &[Vec<u8>]) -> Reply {
        for (i, pair) in kv.chunks(2).enumerate() {
            if let Err(r) = self.put(&pair[0], &pair[1], Cond::Always) {
                if i == 0 {
                    return r;
                }
                let Reply::Error(text) = r else { return r };
                return Reply::err(format!(
                    "{text} (MSET is not atomic: the first {i} keys were set)"
                ));
            }
        }
        Reply::ok()
    }

    fn scan(&mut self, args: &[Vec<u8>]) -> Reply {
        // The cursor is the index bucket to go on from; one SCAN call
        // covers the whole index (the store's own scan walks it in steps).
        let Ok(cursor) = String::from_utf8_lossy(&args[1]).parse::<u64>() else {
            return Reply::err("ERR invalid cursor");
        };
        let mut pattern = Vec::new();
        let mut i = 2;
        while i < args.len() {
            match upper(&args[i]).as_str() {
                "MATCH" if i + 1 < args.len() => pattern = args[i + 1].clone(),
                "COUNT" if i + 1 < args.len() => {}
                _ => return Reply::err("ERR syntax error"),
            }
            i += 2;
        }
        if cursor != 0 {
            return Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
        }
        match self.client().map(|c| c.scan(&pattern)) {
            Ok(Ok(keys)) => Reply::Array(vec![
                Reply::Bulk(b"0".to_vec()),
                Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
            ]),
            Ok(Err(e)) => store_err(e),
            Err(r) => r,
        }
    }

    fn info(&mut self) -> Reply {
        let (s, primary) = match self.role(true) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let role = if s.role == proto::ROLE_PRIMARY {
            "master"
        } else {
            "slave"
        };
        let mut t = String::new();
        t.push_str("# Server\r\nredis_version:7.0.0\r\nsoftrdma_store:1\r\n");
        t.push_str(&format!(
            "\r\n# Replication\r\nrole:{role}\r\nsoftrdma_role:{}\r\nconnected_slaves:{}\r\n",
            proto::role_name(s.role),
            s.redundant as u8
        ));
        if let Some(p) = primary {
            t.push_str(&format!(
                "master_host:{}\r\nmaster_port:{}\r\n",
                p.ip(),
                p.port()
            ));
        }
        t.push_str(&format!(
            "epoch:{}\r\nredundant:{}\r\napplied_seq:{}\r\n",
            s.epoch, s.redundant as u8, s.applied_seq
        ));
        t.push_str(&format!(
            "\r\n# Memory\r\narena_bytes:{}\r\narena_used_bytes:{}\r\nobjects:{}\r\n",
            s.arena_len, s.allocated, s.objects
        ));
        t.push_str(&format!("\r\n# Keyspace\r\ndb0:keys={}\r\n", s.keys));
        Reply::Bulk(t.into_bytes())
    }
}
