//! What all connections of the front door share: the node, the
//! credentials, a few store clients, the node's last known role.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::Front;
use crate::net::client::{ClientConfig, StoreClient};
use crate::net::handshake::Gate;
use crate::proto::StatusInfo;
use crate::resp_codec::Reply;

/// Store clients shared by all connections, for what this node cannot
/// answer from its own arena (reads while it is not the primary, `KEYS`,
/// `SCAN`, the peers' status).
const POOL: usize = 4;

/// The door's state, shared by its connections.
pub(super) struct Shared {
    /// This node first, then its peers (store addresses).
    pub(super) nodes: Vec<SocketAddr>,
    /// The node's credentials (re-read while it runs).
    pub(super) gate: Arc<Gate>,
    /// With no credential configured, serve loopback clients only.
    pub(super) protected_mode: bool,
    /// This node's loop and arena.
    pub(super) front: Arc<dyn Front>,
    /// (when asked, this node's status, the primary's RESP address).
    pub(super) role: Mutex<Option<(Instant, StatusInfo, Option<SocketAddr>)>>,
    /// Connections open now.
    pub(super) conns: AtomicUsize,
    /// Connections ever accepted (`CLIENT ID`).
    pub(super) accepted: AtomicU64,
    /// The connections open now (`CLIENT LIST`), by `CLIENT ID`.
    pub(super) clients: Mutex<BTreeMap<u64, Arc<ConnInfo>>>,
    /// When the door started (`INFO`'s uptime).
    pub(super) started: Instant,
    /// No store clients: what needs one answers `-TRYAGAIN` at once (the
    /// fuzzed door, which has no network).
    pub(super) offline: bool,
    pool: Mutex<Pool>,
    pool_free: Condvar,
}

#[derive(Default)]
struct Pool {
    idle: Vec<StoreClient>,
    made: usize,
}

impl Shared {
    /// The state of a door for the node at `nodes[0]` (its peers after it).
    pub(super) fn new(
        nodes: Vec<SocketAddr>,
        front: Arc<dyn Front>,
        gate: Arc<Gate>,
        protected_mode: bool,
    ) -> Shared {
        Shared {
            nodes,
            gate,
            protected_mode,
            front,
            role: Mutex::new(None),
            conns: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            clients: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            offline: false,
            pool: Mutex::new(Pool::default()),
            pool_free: Condvar::new(),
        }
    }

    /// A store client of this node's own (proving the group secret).
    pub(super) fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new(self.nodes.clone());
        cfg.auth = self.front.client_auth();
        cfg
    }

    /// Runs `f` with a client of the pool (made when fewer than [`POOL`]
    /// exist, else waited for).
    pub(super) fn pooled<R>(&self, f: impl FnOnce(&mut StoreClient) -> R) -> Result<R, Reply> {
        if self.offline {
            return Err(Reply::err("TRYAGAIN no store clients (offline)"));
        }
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

/// What `CLIENT LIST` shows of a connection; updated by whoever serves
/// it (the loop or a worker), read by any.
pub(super) struct ConnInfo {
    /// `CLIENT ID`.
    pub(super) no: u64,
    /// The client's address and ours.
    pub(super) addr: Option<SocketAddr>,
    pub(super) laddr: Option<SocketAddr>,
    pub(super) since: Instant,
    /// Milliseconds from `since` to the last input read from it (Redis's
    /// "last interaction").
    pub(super) last_ms: AtomicU64,
    /// `CLIENT SETNAME`.
    pub(super) name: Mutex<Vec<u8>>,
    /// Who it authenticated as.
    pub(super) user: Mutex<String>,
    /// 2 or 3 (`HELLO`).
    pub(super) resp: AtomicU8,
}

impl ConnInfo {
    pub(super) fn new(no: u64, addr: Option<SocketAddr>, laddr: Option<SocketAddr>) -> ConnInfo {
        ConnInfo {
            no,
            addr,
            laddr,
            since: Instant::now(),
            last_ms: AtomicU64::new(0),
            name: Mutex::new(Vec::new()),
            user: Mutex::new(crate::auth::DEFAULT_USER.into()),
            resp: AtomicU8::new(2),
        }
    }

    /// Input arrived at `now` (the event loop's time for its pass: no
    /// clock read per command).
    pub(super) fn touch_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.since).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Its `CLIENT LIST` line; `cmd`: its last command as Redis names it.
    pub(super) fn line(&self, cmd: &str) -> String {
        let age = self.since.elapsed();
        let idle = age.as_millis() as u64
            - self
                .last_ms
                .load(Ordering::Relaxed)
                .min(age.as_millis() as u64);
        let at = |a: Option<SocketAddr>| a.map_or_else(String::new, |a| a.to_string());
        format!(
            "id={} addr={} laddr={} fd=0 name={} age={} idle={} flags=N db=0 sub=0 psub=0 \
             ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
             omem=0 tot-mem=0 events=r cmd={cmd} user={} redir=-1 resp={}\n",
            self.no,
            at(self.addr),
            at(self.laddr),
            String::from_utf8_lossy(&self.name.lock().expect("name")),
            age.as_secs(),
            idle / 1000,
            self.user.lock().expect("user"),
            self.resp.load(Ordering::Relaxed),
        )
    }
}
