//! What all connections of the front door share: the node, the
//! credentials, a few store clients, the node's last known role.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
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
