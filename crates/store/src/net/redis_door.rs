//! The store's Redis-compatible front door: `softrdma store serve` with
//! `resp = "ADDR"` (or `--resp ADDR`) accepts RESP connections, so
//! `redis-cli`, `redis-benchmark` and Redis client libraries work
//! unchanged.
//!
//! Each connection is served by a thread (at most [`MAX_CLIENTS`]). A
//! RESP command is a store request like any other, so it keeps every
//! guarantee of the native protocol: a write enters this node's loop
//! through its event queue ([`Front::request`]), the path a client's
//! message takes without the network, and is answered once replicated
//! (if that answer does not come, it is retried under the same request id
//! through a client of the connection's own, and takes effect once); a
//! read on the primary is the one-sided look-up run on the node's own
//! arena, each copy checked against the arena STag's validity and lease
//! deadline as a remote Read is ([`Front::read`]). What this node cannot
//! answer itself (reads while it is not the primary, `KEYS`, `SCAN`, the
//! peers' status) goes through a few [`StoreClient`]s shared by all
//! connections. Replies are written out as they pile up (a pipeline, a
//! long `MGET` step by step), so a connection holds at most a request
//! ([`resp_codec::MAX_REQUEST`]) and a few hundred KiB of replies. Commands:
//!
//! | command | store operation |
//! |---|---|
//! | `GET k` | one-sided look-up (`StoreClient::get`) |
//! | `SET k v [NX\|XX]` | `put` (Always / IfAbsent / IfPresent); `$-1` when the condition fails |
//! | `SETNX k v` | `put` IfAbsent: `:1` / `:0` |
//! | `DEL k...`, `UNLINK k...` | `remove` each: the count that existed |
//! | `EXISTS k...` | batched look-ups: the count found |
//! | `MGET k...` | look-ups in steps of 64 keys (on a secondary: `get_many`, Reads batched) |
//! | `MSET k v ...` | `put` each, in order (**not atomic** across keys: a failure part-way leaves the earlier keys set, and the error says how many) |
//! | `KEYS p`, `SCAN c [MATCH p] [COUNT n]` | `scan` of the committed index |
//! | `DBSIZE` | keys in the index (`status`) |
//! | `INFO [section]` | role, epoch, redundancy, keys, arena use |
//! | `WAIT n t` | at once: `:1` while the group is redundant, else `:0` (every write is acknowledged only once replicated, or, under `min_in_sync_replicas = 0` with the group degraded, held by the primary alone, which this reports) |
//! | `PING`, `ECHO`, `SELECT 0`, `QUIT`, `COMMAND [COUNT\|DOCS\|INFO]`, `CONFIG GET save\|appendonly`, `CLIENT SETNAME\|GETNAME\|ID\|SETINFO` | what clients send when they connect |
//!
//! Anything else is answered `-ERR unknown command '...'`, as Redis does;
//! bytes that are not RESP get `-ERR Protocol error: ...` and the
//! connection is closed. A write sent to a node that is not the primary
//! is answered `-MOVED SLOT HOST:PORT` naming the key's cluster slot and
//! the primary's RESP address (`redis-cli -c` follows it; the host is the
//! primary's store address, the port its RESP port), or `-READONLY` when
//! no primary is known;
//! reads on any node are served (through the primary's arena). Values
//! are at most `net::link::MAX_VALUE` bytes, keys 1 to 1,024 bytes, and
//! TTLs (`EX`, `PX`, ...) are refused: the store does not expire keys.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use super::client::{ClientConfig, ClientError, StoreClient};
use super::handshake::Gate;
use super::server::Front;
use crate::auth::{Credentials, Rights};
use crate::index::Layout;
use crate::lookup::{self, Outcome};
use crate::proto::{self, Cond, Op, StatusInfo, StoreError};
use crate::resp_codec::{self, Decoder, Reply};

/// How long a node's role, as the front door last asked, is trusted
/// before a write asks again.
const ROLE_TTL: Duration = Duration::from_millis(100);

/// How long a request waits for the node loop before the front door asks
/// again through a client (same request id: it takes effect once).
const FRONT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections served at once (Redis's `maxclients` is 10,000; each
/// connection here is a thread). One more is answered with Redis's error
/// and closed.
pub const MAX_CLIENTS: usize = 1000;

/// Replies are written out once this many bytes wait (a pipeline of many
/// requests, or a long `MGET`, never holds more than about this much).
const FLUSH_AT: usize = 256 << 10;

/// A client that does not read its replies for this long is disconnected.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Keys per step of `MGET`/`EXISTS` (their values are encoded and written
/// out step by step).
const MGET_STEP: usize = 4 * super::link::READ_BATCH;

/// Key -> pointer entries one connection keeps.
const SESSION_CACHE: usize = 16 << 10;

/// Store clients shared by all connections, for what this node cannot
/// answer from its own arena (reads while it is not the primary, `KEYS`,
/// `SCAN`, the peers' status).
const POOL: usize = 4;

struct Shared {
    /// This node first, then its peers (store addresses).
    nodes: Vec<SocketAddr>,
    /// The node's credentials (re-read while it runs).
    gate: Arc<Gate>,
    /// With no credential configured, serve loopback clients only.
    protected_mode: bool,
    /// This node's loop and arena.
    front: Arc<Front>,
    /// (when asked, this node's status, the primary's RESP address).
    role: Mutex<Option<(Instant, StatusInfo, Option<SocketAddr>)>>,
    /// Connections open now.
    conns: AtomicUsize,
    /// Connections ever accepted (`CLIENT ID`).
    accepted: AtomicU64,
    pool: Mutex<Pool>,
    pool_free: Condvar,
}

#[derive(Default)]
struct Pool {
    idle: Vec<StoreClient>,
    made: usize,
}

impl Shared {
    /// A store client of this node's own (proving the group secret).
    fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new(self.nodes.clone());
        cfg.auth = self.front.client_auth();
        cfg
    }

    /// Runs `f` with a client of the pool (made when fewer than [`POOL`]
    /// exist, else waited for).
    fn pooled<R>(&self, f: impl FnOnce(&mut StoreClient) -> R) -> Result<R, Reply> {
        let mut c = {
            let mut p = self.pool.lock().expect("pool");
            loop {
                if let Some(c) = p.idle.pop() {
                    break c;
                }
                if p.made < POOL {
                    p.made += 1;
                    drop(p);
                    match StoreClient::new(self.client_config()) {
                        Ok(c) => break c,
                        Err(e) => {
                            self.pool.lock().expect("pool").made -= 1;
                            self.pool_free.notify_one();
                            return Err(Reply::err(format!("ERR cannot reach the store: {e}")));
                        }
                    }
                }
                p = self.pool_free.wait(p).expect("pool");
            }
        };
        let r = f(&mut c);
        self.pool.lock().expect("pool").idle.push(c);
        self.pool_free.notify_one();
        Ok(r)
    }
}

/// Serves RESP on `listener` for the node at `nodes[0]` (its peers
/// after it), one thread per connection, until the process ends.
pub fn spawn(
    listener: TcpListener,
    nodes: Vec<SocketAddr>,
    front: Arc<Front>,
    gate: Arc<Gate>,
    protected_mode: bool,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        nodes,
        gate,
        protected_mode,
        front,
        role: Mutex::new(None),
        conns: AtomicUsize::new(0),
        accepted: AtomicU64::new(0),
        pool: Mutex::new(Pool::default()),
        pool_free: Condvar::new(),
    });
    std::thread::Builder::new()
        .name("store-resp".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let mut conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors, most likely: let connections
                        // end rather than spin on the error.
                        tracing::warn!("RESP accept: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                if shared.conns.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    shared.conns.fetch_sub(1, Ordering::AcqRel);
                    let _ = conn.write_all(b"-ERR max number of clients reached\r\n");
                    continue;
                }
                let no = shared.accepted.fetch_add(1, Ordering::Relaxed) + 1;
                let shared = shared.clone();
                let s2 = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("store-resp-conn".into())
                    .spawn(move || {
                        serve_conn(conn, &shared, no);
                        shared.conns.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    s2.conns.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(())
}

/// A connection's replies, written out as they pile up.
struct Out {
    conn: TcpStream,
    buf: Vec<u8>,
    /// A write failed: the connection is done.
    broken: bool,
}

impl Out {
    fn reply(&mut self, r: &Reply) {
        r.encode(&mut self.buf);
        self.maybe_flush();
    }

    fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        self.maybe_flush();
    }

    fn maybe_flush(&mut self) {
        if self.buf.len() >= FLUSH_AT {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.broken && !self.buf.is_empty() && self.conn.write_all(&self.buf).is_err() {
            self.broken = true;
        }
        self.buf.clear();
    }
}

/// Redis's answer to a client from another host when no password is set.
const DENIED: &str = "DENIED softrdma-store is running in protected mode because no \
    credentials are configured: only loopback clients are served. Configure [auth] secret \
    (or users) in the node's configuration (docs/store.md), or set protected_mode = false \
    to serve everyone.";

fn serve_conn(conn: TcpStream, shared: &Arc<Shared>, no: u64) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(mut input) = conn.try_clone() else {
        return;
    };
    // (Read in this order, a change in between is seen at the first
    // request.)
    let seen_changes = shared.gate.changes();
    let creds = shared.gate.credentials();
    let loopback = conn.peer_addr().is_ok_and(|a| a.ip().is_loopback());
    if !creds.configured() && shared.protected_mode && !loopback {
        let mut conn = conn;
        let _ = conn.write_all(format!("-{DENIED}\r\n").as_bytes());
        return;
    }
    // Without credentials everyone is the default user, as in Redis.
    let user =
        (!creds.configured()).then(|| (crate::auth::DEFAULT_USER.to_string(), Rights::ReadWrite));
    let mut session = Session {
        user,
        creds,
        seen_changes,
        shared: shared.clone(),
        retry: None,
        id: super::random_u64(),
        no,
        name: Vec::new(),
        req: 0,
        layout: None,
        cache: HashMap::new(),
    };
    let mut out = Out {
        conn,
        buf: Vec::with_capacity(16 << 10),
        broken: false,
    };
    let mut decoder = Decoder::default();
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let mut used = 0;
        let mut close = false;
        loop {
            match decoder.decode(&buf[used..]) {
                Ok(Some((args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    if session.exec(&args, &mut out) {
                        close = true;
                        break;
                    }
                    if out.broken {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    out.reply(&Reply::err(format!("ERR Protocol error: {e}")));
                    close = true;
                    break;
                }
            }
        }
        buf.drain(..used);
        out.flush();
        if close || out.broken {
            return;
        }
        match input.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

struct Session {
    /// Who the connection authenticated as (`AUTH`), and its rights.
    user: Option<(String, Rights)>,
    /// The credentials `user` was checked against.
    creds: Arc<Credentials>,
    /// `Gate::changes` when `creds` was taken.
    seen_changes: u64,
    shared: Arc<Shared>,
    /// A client under this connection's id, made only to retry a write
    /// whose answer did not come through the node loop (the same request
    /// id then takes effect once).
    retry: Option<StoreClient>,
    /// This connection's client id, on both paths.
    id: u64,
    /// `CLIENT ID`.
    no: u64,
    /// `CLIENT SETNAME`.
    name: Vec<u8>,
    /// Request ids used before `retry` existed.
    req: u64,
    /// The key index's layout, read from the local arena's superblock.
    layout: Option<Layout>,
    /// Key -> (arena offset, allocation length), as in `StoreClient`; at
    /// most [`SESSION_CACHE`] entries.
    cache: HashMap<Vec<u8>, (u64, u32)>,
}

fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
}

/// A key no store key can equal (empty, or longer than the limit): a
/// read of it answers "absent", a write a clear error.
fn impossible_key(key: &[u8]) -> bool {
    crate::proto::check_key(key).is_err()
}

/// An integer argument, or Redis's error for it.
fn integer(a: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(a)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| Reply::err("ERR value is not an integer or out of range"))
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
        ClientError::Store(e @ StoreError::NoPermission) => Reply::err(format!("NOPERM {e}")),
        e => Reply::err(format!("ERR {e}")),
    }
}

fn wrong_args(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

fn unknown_subcommand(cmd: &str, sub: &[u8]) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand '{}'. Try {cmd} HELP.",
        String::from_utf8_lossy(sub)
    ))
}

/// The commands served (`COMMAND COUNT`).
const COMMANDS: [&str; 21] = [
    "PING", "ECHO", "QUIT", "SELECT", "COMMAND", "CLIENT", "CONFIG", "GET", "SET", "SETNX", "DEL",
    "UNLINK", "EXISTS", "MGET", "MSET", "KEYS", "SCAN", "DBSIZE", "WAIT", "INFO", "AUTH",
];

impl Session {
    /// The client that retries this connection's writes.
    fn retry_client(&mut self) -> Result<&mut StoreClient, Reply> {
        if self.retry.is_none() {
            let mut cfg = self.shared.client_config();
            cfg.id = Some(self.id);
            let mut c = StoreClient::new(cfg)
                .map_err(|e| Reply::err(format!("ERR cannot reach the store: {e}")))?;
            c.skip_req_ids(self.req);
            self.retry = Some(c);
        }
        Ok(self.retry.as_mut().expect("set above"))
    }

    fn next_req(&mut self) -> u64 {
        match &mut self.retry {
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
                self.retry_client()?
                    .request_as(req_id, op)
                    .map_err(store_err)
            }
            Some(Err(e)) => Err(store_err(e.into())),
        }
    }

    /// A keyed get served from this node's own arena, as a one-sided
    /// reader would (the same look-up, the reads checked against the
    /// STag's validity and deadline); `None` if this node does not serve
    /// reads now or the look-up gave up.
    fn local_get(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if impossible_key(key) {
            return Some(None);
        }
        let front = self.shared.front.clone();
        let arena_len = front.arena().len;
        if self.layout.is_none() {
            let mut sb = [0u8; crate::index::SUPERBLOCK_LEN as usize];
            if !front.read(0, &mut sb) {
                return None;
            }
            self.layout = Layout::from_superblock(&sb, arena_len).ok();
        }
        let layout = self.layout?;
        let cached = self.cache.get(key).copied();
        let read = |offset: u64, len: u32| {
            // Bounds first: a length is never trusted before it is known
            // to lie inside the arena.
            if offset.saturating_add(len as u64) > arena_len {
                return Err(());
            }
            let mut buf = vec![0u8; len as usize];
            match front.read(offset, &mut buf) {
                true => Ok(buf),
                false => Err(()),
            }
        };
        match lookup::run(key, layout, cached, read).ok()?.0 {
            Outcome::Found {
                offset, len, data, ..
            } => {
                if self.cache.len() >= SESSION_CACHE && !self.cache.contains_key(key) {
                    self.cache.clear();
                }
                self.cache.insert(key.to_vec(), (offset, len));
                Some(Some(data))
            }
            Outcome::Absent => {
                self.cache.remove(key);
                Some(None)
            }
            Outcome::GaveUp => None,
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
            let nodes = self.shared.nodes.clone();
            self.shared.pooled(|c| {
                for (i, addr) in nodes.iter().enumerate().skip(1) {
                    if let Ok(s) = c.status_of(i) {
                        if s.role == proto::ROLE_PRIMARY && s.resp_port != 0 {
                            primary = Some(SocketAddr::new(addr.ip(), s.resp_port));
                        }
                    }
                }
            })?;
        }
        *self.shared.role.lock().expect("role") = Some((Instant::now(), me.clone(), primary));
        Ok((me, primary))
    }

    /// `None` if this node may take writes of `key`; else the
    /// redirection (`-MOVED slot host:port`, the key's cluster slot, so
    /// that cluster-aware clients such as `redis-cli -c` follow it).
    fn not_primary(&mut self, key: &[u8]) -> Option<Reply> {
        match self.role(false) {
            Err(r) => Some(r),
            Ok((s, _)) if s.role == proto::ROLE_PRIMARY => None,
            Ok((_, Some(p))) => Some(Reply::err(format!(
                "MOVED {} {p}",
                resp_codec::key_slot(key)
            ))),
            Ok((s, None)) => Some(Reply::err(format!(
                "READONLY this node is {}, not the primary, and no primary is known",
                proto::role_name(s.role)
            ))),
        }
    }

    /// Whether the connection may run `cmd`; otherwise the reply (and
    /// whether to close). Credentials that changed since `AUTH` are
    /// checked again first: a removed user or a changed password ends the
    /// connection (issue 29: revocation is live).
    fn admit(&mut self, cmd: &str) -> Result<(), (Reply, bool)> {
        // One atomic load per request; the credentials only when they changed.
        let changes = self.shared.gate.changes();
        if changes != self.seen_changes {
            self.seen_changes = changes;
            let now = self.shared.gate.credentials();
            let keeps = match &self.user {
                Some((u, _)) if self.creds.configured() => now.still_grants(&self.creds, u),
                // Admitted while none were configured: only while none are.
                Some(_) => !now.configured(),
                None => true,
            };
            if !keeps {
                return Err((Reply::err("NOAUTH Authentication required."), true));
            }
            if !now.configured() && self.user.is_none() {
                self.user = Some((crate::auth::DEFAULT_USER.into(), Rights::ReadWrite));
            }
            self.creds = now;
        }
        match (&self.user, cmd) {
            (_, "AUTH" | "QUIT") => Ok(()),
            (None, _) => Err((Reply::err("NOAUTH Authentication required."), false)),
            (Some((u, Rights::Read)), "SET" | "SETNX" | "DEL" | "UNLINK" | "MSET") => Err((
                Reply::err(format!(
                    "NOPERM User {u} has no permissions to run the '{}' command",
                    cmd.to_ascii_lowercase()
                )),
                false,
            )),
            _ => Ok(()),
        }
    }

    /// `AUTH [user] password`, as Redis answers it.
    fn auth(&mut self, args: &[Vec<u8>]) -> Reply {
        let (user, pass) = match args.len() {
            2 => (crate::auth::DEFAULT_USER.to_string(), &args[1]),
            3 => (String::from_utf8_lossy(&args[1]).into_owned(), &args[2]),
            _ => return Reply::err("ERR syntax error"),
        };
        let creds = self.shared.gate.credentials();
        if !creds.configured() && args.len() == 2 {
            return Reply::err(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        }
        match creds.check_password(&user, pass) {
            Some(rights) => {
                self.user = Some((user, rights));
                self.creds = creds;
                Reply::ok()
            }
            None => Reply::err("WRONGPASS invalid username-password pair or user is disabled."),
        }
    }

    /// Runs one command, its reply written to `out`; whether to close the
    /// connection.
    fn exec(&mut self, args: &[Vec<u8>], out: &mut Out) -> bool {
        let cmd = upper(&args[0]);
        let n = args.len();
        if let Err((reply, close)) = self.admit(&cmd) {
            out.reply(&reply);
            return close;
        }
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
            "SELECT" if n == 2 => match integer(&args[1]) {
                Ok(0) => Reply::ok(),
                Ok(_) => Reply::err("ERR DB index is out of range"),
                Err(r) => r,
            },
            "COMMAND" if n == 1 => Reply::Array(Vec::new()),
            "COMMAND" => match upper(&args[1]).as_str() {
                // No command table: clients (redis-cli's hints) do
                // without one.
                "DOCS" | "INFO" => Reply::Array(Vec::new()),
                "COUNT" if n == 2 => Reply::Int(COMMANDS.len() as i64),
                _ => unknown_subcommand("COMMAND", &args[1]),
            },
            "CLIENT" if n >= 2 => match (upper(&args[1]).as_str(), n) {
                ("SETNAME", 3) => {
                    self.name = args[2].clone();
                    Reply::ok()
                }
                ("GETNAME", 2) if self.name.is_empty() => Reply::Nil,
                ("GETNAME", 2) => Reply::Bulk(self.name.clone()),
                ("ID", 2) => Reply::Int(self.no as i64),
                ("SETINFO", 4) => Reply::ok(),
                ("SETNAME" | "GETNAME" | "ID" | "SETINFO", _) => Reply::err(format!(
                    "ERR wrong number of arguments for 'client|{}' command",
                    String::from_utf8_lossy(&args[1]).to_ascii_lowercase()
                )),
                _ => unknown_subcommand("CLIENT", &args[1]),
            },
            "CONFIG" if n >= 2 => match upper(&args[1]).as_str() {
                // What redis-benchmark asks; the store has no such
                // settings (no snapshots, no append-only file).
                "GET" if n >= 3 => {
                    let mut pairs = Vec::new();
                    for p in &args[2..] {
                        let v: &[u8] = match p.to_ascii_lowercase().as_slice() {
                            b"save" => b"",
                            b"appendonly" => b"no",
                            _ => continue,
                        };
                        pairs.push(Reply::Bulk(p.to_ascii_lowercase()));
                        pairs.push(Reply::Bulk(v.to_vec()));
                    }
                    Reply::Array(pairs)
                }
                "GET" => Reply::err("ERR wrong number of arguments for 'config|get' command"),
                _ => unknown_subcommand("CONFIG", &args[1]),
            },
            "GET" if n == 2 => self.get(&args[1]),
            "SET" if n >= 3 => self.set(args),
            "SETNX" if n == 3 => match self.put(&args[1], &args[2], Cond::IfAbsent) {
                Ok(true) => Reply::Int(1),
                Ok(false) => Reply::Int(0),
                Err(r) => r,
            },
            "DEL" | "UNLINK" if n >= 2 => self.del(&args[1..]),
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
                // An error in a step answers its keys with the error.
                out.raw(format!("*{}\r\n", n - 1).as_bytes());
                for step in args[1..].chunks(MGET_STEP) {
                    match self.mget(step) {
                        Ok(v) => v.iter().for_each(|r| out.reply(r)),
                        Err(r) => (0..step.len()).for_each(|_| out.reply(&r)),
                    }
                    if out.broken {
                        return true;
                    }
                }
                return false;
            }
            "MSET" if n >= 3 && n % 2 == 1 => self.mset(&args[1..]),
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
            "WAIT" if n == 3 => match (integer(&args[1]), integer(&args[2])) {
                (Err(r), _) | (_, Err(r)) => r,
                (_, Ok(t)) if t < 0 => Reply::err("ERR timeout is negative"),
                _ => match self.role(true) {
                    Ok((s, _)) => Reply::Int(s.redundant as i64),
                    Err(r) => r,
                },
            },
            "INFO" => self.info(),
            "ECHO" | "SELECT" | "CLIENT" | "CONFIG" | "GET" | "SET" | "SETNX" | "DEL"
            | "UNLINK" | "EXISTS" | "MGET" | "MSET" | "KEYS" | "SCAN" | "DBSIZE" | "WAIT" => {
                wrong_args(&cmd)
            }
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
        out.reply(&reply);
        false
    }

    fn get(&mut self, key: &[u8]) -> Reply {
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

    /// A put if this node is the primary: whether it was stored.
    fn put(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<bool, Reply> {
        if let Some(r) = self.not_primary(key) {
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
        if let Some(r) = self.not_primary(&keys[0]) {
            return r;
        }
        let mut n = 0;
        for k in keys {
            self.cache.remove(k);
            if impossible_key(k) {
                continue;
            }
            match self.write(Op::Remove { key: k.clone() }) {
                Ok(proto::Reply::Removed { existed }) => n += existed as i64,
                Ok(r) => return Reply::err(format!("ERR unexpected answer {r:?}")),
                Err(r) => return r,
            }
        }
        Reply::Int(n)
    }

    /// The values of `keys` (a step of `MGET`), in order.
    fn mget(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Reply>, Reply> {
        // From the local arena while this node is the primary.
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
            "\r\n# Clients\r\nconnected_clients:{}\r\nmaxclients:{MAX_CLIENTS}\r\n",
            self.shared.conns.load(Ordering::Relaxed)
        ));
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
            "epoch:{}\r\nredundant:{}\r\napplied_seq:{}\r\nmin_in_sync_replicas:{}\r\n\
             durability:{}\r\n",
            s.epoch,
            s.redundant as u8,
            s.applied_seq,
            s.min_in_sync,
            crate::config::durability(s.min_in_sync)
        ));
        t.push_str(&format!(
            "\r\n# Memory\r\narena_bytes:{}\r\narena_used_bytes:{}\r\nobjects:{}\r\n",
            s.arena_len, s.allocated, s.objects
        ));
        t.push_str(&format!("\r\n# Keyspace\r\ndb0:keys={}\r\n", s.keys));
        Reply::Bulk(t.into_bytes())
    }
}
