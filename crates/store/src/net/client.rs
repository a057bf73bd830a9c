//! The store's client library.
//!
//! A [`StoreClient`] talks to the nodes of one replica group. Writes
//! (`put`, `remove` of keys; `insert`, `update`, `delete` of the pointer
//! API) are requests to the primary; the primary
//! answers once the write exists on both nodes (or on itself alone after
//! the coordinator recorded that the group is degraded). Reads are
//! **one-sided RDMA Reads** of the object at its remote pointer, with no
//! server CPU on the path; the object header's checksum detects a read that
//! raced an update, which is retried; after a few torn reads, or when the
//! bytes are not an object (freed space), the client falls back to a
//! server-side read, which also gives the precise error. A key is read
//! the same way after a look-up in the arena's index, also by RDMA Reads
//! ([`crate::lookup`]; a cached pointer makes it one Read), with the
//! node's `get` as the counted fallback ([`ClientStats`]).
//!
//! Failover: each request carries the client's epoch and a request id; when
//! the primary does not answer within the per-attempt timeout, or answers
//! `NotPrimary`, the client sends the same request (same id) to the other
//! node. The nodes' replicated de-duplication table makes a retried write
//! take effect once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_verbs::{Access, MemoryRegion};

use super::handshake::{self, ClientAuth, HandshakeError, Hello};
use super::link::{Endpoint, Link, LinkError, LinkEvent, MAX_VALUE, READ_BATCH};
use super::{random_u64, CONNECT_TIMEOUT};
use crate::index::Layout;
use crate::lookup::{self, Lookup, Outcome, Step};
use crate::object::{self, ObjectError};
use crate::proto::{self, Body, Cond, Envelope, NodeId, Op, Reply, StatusInfo, StoreError};
use crate::ptr::{ArenaRef, RemotePtr};

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The store refused the operation (bad pointer, arena full, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No node answered before the deadline.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The value is larger than a message can carry.
    #[error("value of {len} bytes exceeds the client's limit of {max} bytes")]
    ValueTooLarge {
        /// Value length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The answer did not match the request.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Local RDMA setup failed.
    #[error("rdma: {0}")]
    Rdma(String),
    /// The nodes refused this client (credentials, protected mode): the
    /// reason says why; retrying will not help.
    #[error("refused: {0}")]
    Auth(String),
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The group's nodes.
    pub nodes: Vec<SocketAddr>,
    /// How long to wait for one attempt before trying the other node.
    pub attempt_timeout: Duration,
    /// How long an operation may take in all before it fails.
    pub deadline: Duration,
    /// Torn one-sided reads retried before the server-side fallback.
    pub torn_retries: u32,
    /// The client's id (its requests' identity in the nodes'
    /// de-duplication table); `None`: a random one.
    pub id: Option<u64>,
    /// How long a write refused for want of an in-sync secondary
    /// ([`StoreError::NotEnoughReplicas`]: nothing changed, under
    /// `min_in_sync_replicas = 1` while the secondary is re-copied) is
    /// retried before the refusal is returned (within `deadline`); zero
    /// returns it at once.
    pub wait_for_replicas: Duration,
    /// The credential to prove (the group's user and password); `None`:
    /// only nodes without credentials (protected mode, loopback) admit
    /// the client.
    pub auth: Option<ClientAuth>,
}

impl ClientConfig {
    /// Defaults for `nodes`.
    pub fn new(nodes: Vec<SocketAddr>) -> ClientConfig {
        ClientConfig {
            nodes,
            attempt_timeout: Duration::from_millis(300),
            deadline: Duration::from_secs(15),
            torn_retries: 8,
            id: None,
            wait_for_replicas: Duration::from_secs(5),
            auth: None,
        }
    }
}

/// Counters of what the client did.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientStats {
    /// Requests re-sent to the other node or after a timeout.
    pub retries: u64,
    /// One-sided reads completed.
    pub one_sided_reads: u64,
    /// One-sided reads that were torn and retried.
    pub torn_reads: u64,
    /// Reads served by a node instead.
    pub server_reads: u64,
    /// Keyed gets answered by a one-sided look-up (found or absent).
    pub keyed_one_sided: u64,
    /// The same, by the node that served them (its index in the
    /// configured node list; the fourth and later share the last).
    pub keyed_one_sided_at: [u64; 4],
    /// Of those, answered by the cached pointer alone (one Read).
    pub cache_hits: u64,
    /// Look-up restarts (a slot changed under the reader, a torn read).
    pub lookup_restarts: u64,
    /// Keyed gets answered by the node because the look-up kept racing
    /// writes (it gave up after `lookup::MAX_RESTARTS`).
    pub keyed_fallback_raced: u64,
    /// Keyed gets answered by the node because a one-sided Read failed
    /// (the node is no primary now, the link broke, the arena or its
    /// index is not known yet).
    pub keyed_fallback_refused: u64,
}

impl ClientStats {
    /// Every counter of `self` combined with the same counter of `o`.
    fn zip(self, o: ClientStats, f: impl Fn(u64, u64) -> u64) -> ClientStats {
        ClientStats {
            retries: f(self.retries, o.retries),
            one_sided_reads: f(self.one_sided_reads, o.one_sided_reads),
            torn_reads: f(self.torn_reads, o.torn_reads),
            server_reads: f(self.server_reads, o.server_reads),
            keyed_one_sided: f(self.keyed_one_sided, o.keyed_one_sided),
            keyed_one_sided_at: std::array::from_fn(|i| {
                f(self.keyed_one_sided_at[i], o.keyed_one_sided_at[i])
            }),
            cache_hits: f(self.cache_hits, o.cache_hits),
            lookup_restarts: f(self.lookup_restarts, o.lookup_restarts),
            keyed_fallback_raced: f(self.keyed_fallback_raced, o.keyed_fallback_raced),
            keyed_fallback_refused: f(self.keyed_fallback_refused, o.keyed_fallback_refused),
        }
    }
}

/// Counters of two clients (or phases) together.
impl std::ops::Add for ClientStats {
    type Output = ClientStats;
    fn add(self, o: ClientStats) -> ClientStats {
        self.zip(o, |a, b| a + b)
    }
}

/// What a client did between two readings of its counters (`after -
/// before`).
impl std::ops::Sub for ClientStats {
    type Output = ClientStats;
    fn sub(self, o: ClientStats) -> ClientStats {
        self.zip(o, |a, b| a - b)
    }
}

struct Slot {
    addr: SocketAddr,
    link: Option<Arc<Link>>,
    node: Option<NodeId>,
}

/// How long a client polls for its answer before it sleeps, when a link is
/// same-host ([`Endpoint::spin`]).
const CLIENT_SPIN: Duration = Duration::from_micros(100);

/// Key -> pointer entries a client caches (at most about 1 GiB with keys
/// of the largest size, a few tens of MiB with typical ones).
pub const CACHE_ENTRIES: usize = 1 << 20;

/// A client of one replica group.
pub struct StoreClient {
    cfg: ClientConfig,
    ep: Arc<Endpoint>,
    /// Messages polled off the links and not yet consumed.
    inbox: std::collections::VecDeque<(u32, Vec<u8>)>,
    slots: Vec<Slot>,
    target: usize,
    epoch: u64,
    id: u64,
    next_req: u64,
    arena: Option<ArenaRef>,
    read_mr: Option<MemoryRegion>,
    /// Key -> (arena offset, allocation length) of its object as last
    /// seen: a hit costs one Read; a stale entry is detected by the key in
    /// the object's header (`lookup`). At most [`CACHE_ENTRIES`].
    cache: HashMap<Vec<u8>, (u64, u32)>,
    /// The key index's layout, read once from the arena's superblock.
    layout: Option<Layout>,
    stats: ClientStats,
}

fn rdma(e: impl std::fmt::Display) -> ClientError {
    ClientError::Rdma(e.to_string())
}

impl StoreClient {
    /// A client of the group at `cfg.nodes` (connections open lazily).
    pub fn new(cfg: ClientConfig) -> Result<StoreClient, ClientError> {
        if cfg.nodes.is_empty() {
            return Err(ClientError::Unavailable("no nodes given".into()));
        }
        let ep = Endpoint::open("store-client").map_err(rdma)?;
        let slots = cfg
            .nodes
            .iter()
            .map(|&addr| Slot {
                addr,
                link: None,
                node: None,
            })
            .collect();
        let id = cfg.id.unwrap_or_else(random_u64);
        Ok(StoreClient {
            cfg,
            ep,
            inbox: std::collections::VecDeque::new(),
            slots,
            target: 0,
            epoch: 0,
            id,
            next_req: 0,
            arena: None,
            read_mr: None,
            cache: HashMap::new(),
            layout: None,
            stats: ClientStats::default(),
        })
    }

    /// This client's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The highest epoch seen.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The arena, once a node told it.
    pub fn arena(&self) -> Option<ArenaRef> {
        self.arena
    }

    fn link(&mut self, i: usize) -> Result<Arc<Link>, ClientError> {
        if let Some(l) = &self.slots[i].link {
            if !l.is_dead() {
                return Ok(l.clone());
            }
            let id = l.id();
            self.ep.remove(id);
            self.slots[i].link = None;
        }
        let hello = Hello::Client {
            id: self.id,
            user: self
                .cfg
                .auth
                .as_ref()
                .map_or(crate::auth::DEFAULT_USER, |a| a.user.as_str())
                .to_string(),
        };
        let addr = self.slots[i].addr;
        let (link, acc) = handshake::connect(
            &self.ep,
            addr,
            &hello,
            self.cfg.auth.as_ref(),
            CONNECT_TIMEOUT,
        )
        .map_err(|e| match e {
            HandshakeError::Link(e @ LinkError::Protocol(_))
            | HandshakeError::Link(e @ LinkError::Rejected(_)) => {
                ClientError::Protocol(format!("{addr}: {e}"))
            }
            HandshakeError::Link(e) => ClientError::Unavailable(format!("{addr}: {e}")),
            HandshakeError::Protocol(p) => ClientError::Protocol(p),
            HandshakeError::Refused(r) => ClientError::Auth(r),
        })?;
        self.slots[i].node = Some(acc.node);
        if let Some(a) = acc.arena {
            if self.arena.is_some_and(|old| old.stag != a.stag) {
                // The arena's STag rotated (credentials narrowed): what
                // we cached was read under the old one, still valid.
                tracing::debug!(old = ?self.arena, new = ?a, "arena STag changed");
            }
            self.arena = Some(a);
        }
        self.slots[i].link = Some(link.clone());
        Ok(link)
    }

    fn drop_link(&mut self, i: usize) {
        if let Some(l) = self.slots[i].link.take() {
            self.ep.remove(l.id());
        }
    }

    fn switch(&mut self) {
        self.target = (self.target + 1) % self.slots.len();
        self.stats.retries += 1;
    }

    /// Sends `op` to the primary, failing over as needed, until it is
    /// answered or the deadline passes.
    pub fn request(&mut self, op: Op) -> Result<Reply, ClientError> {
        let req_id = self.next_req_id();
        self.request_as(req_id, op)
    }

    /// Request ids from now on are above `used` (ids another path of the
    /// same client id already used).
    pub fn skip_req_ids(&mut self, used: u64) {
        self.next_req = self.next_req.max(used);
    }

    /// A new request id of this client (for a request made another way
    /// first, such as the RESP front door's in-process path, and retried
    /// with [`Self::request_as`]).
    pub fn next_req_id(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    /// [`Self::request`] under request id `req_id`: a retry of a request
    /// that may have been applied already takes effect once (the nodes'
    /// replicated de-duplication table answers it as before).
    pub fn request_as(&mut self, req_id: u64, op: Op) -> Result<Reply, ClientError> {
        let deadline = Instant::now() + self.cfg.deadline;
        let replicas_until = Some(Instant::now() + self.cfg.wait_for_replicas)
            .filter(|_| !self.cfg.wait_for_replicas.is_zero())
            .map(|u| u.min(deadline));
        let mut last_err = String::from("no attempt made");
        // Nodes that answered with something other than a store node's
        // handshake: when every one did, waiting will not help.
        let mut not_store = vec![false; self.slots.len()];
        let mut refused = false;
        loop {
            if Instant::now() > deadline {
                // Still refused for want of a secondary: say so (nothing
                // changed), not "unavailable".
                if refused {
                    return Err(StoreError::NotEnoughReplicas.into());
                }
                return Err(ClientError::Unavailable(last_err));
            }
            let t = self.target;
            let link = match self.link(t) {
                Ok(l) => l,
                Err(e @ ClientError::Auth(_)) => return Err(e),
                Err(e) => {
                    if let ClientError::Protocol(_) = e {
                        not_store[t] = true;
                        if not_store.iter().all(|&x| x) {
                            return Err(e);
                        }
                    }
                    last_err = e.to_string();
                    self.switch();
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let env = Envelope {
                epoch: self.epoch,
                body: Body::Request {
                    client: self.id,
                    req_id,
                    op: op.clone(),
                },
            };
            if let Err(e) = link.send(&proto::encode(&env), self.cfg.attempt_timeout) {
                last_err = e.to_string();
                self.drop_link(t);
                self.switch();
                continue;
            }
            let until = Instant::now() + self.cfg.attempt_timeout;
            // Wait for the answer on this link.
            let outcome = self.await_response(link.id(), req_id, until);
            match outcome {
                None => {
                    last_err = format!("no answer from {} in time", self.slots[t].addr);
                    if link.is_dead() {
                        self.drop_link(t);
                    }
                    self.switch();
                }
                Some(Ok(reply)) => return Ok(reply),
                Some(Err(StoreError::NotEnoughReplicas))
                    if replicas_until.is_some_and(|u| Instant::now() < u) =>
                {
                    // Nothing changed: ask again once the secondary may
                    // be back in sync (a copy takes a fraction of a
                    // second for small arenas).
                    last_err = "no secondary in sync".into();
                    refused = true;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Some(Err(StoreError::StaleEpoch { current })) => {
                    self.epoch = self.epoch.max(current);
                    last_err = format!("stale epoch, now {current}");
                }
                Some(Err(StoreError::NotPrimary { primary })) => {
                    last_err = format!("{} is not the primary", self.slots[t].addr);
                    let idx = primary.and_then(|p| {
                        self.slots
                            .iter()
                            .position(|s| s.node == Some(p))
                            .filter(|&i| i != t)
                    });
                    match idx {
                        Some(i) => self.target = i,
                        None => self.switch(),
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(Err(e)) => return Err(e.into()),
            }
        }
    }

    fn check_value(data: &[u8]) -> Result<(), ClientError> {
        if data.len() > MAX_VALUE {
            return Err(ClientError::ValueTooLarge {
                len: data.len(),
                max: MAX_VALUE,
            });
        }
        Ok(())
    }

    /// Stores `data`; returns its remote pointer.
    pub fn insert(&mut self, data: &[u8]) -> Result<RemotePtr, ClientError> {
        Self::check_value(data)?;
        match self.request(Op::Insert {
            data: data.to_vec(),
        })? {
            Reply::Inserted(p) => Ok(p),
            r => Err(ClientError::Protocol(format!("insert answered {r:?}"))),
        }
    }

    /// Replaces the object at `ptr`; returns its pointer (the same one if
    /// the data fit the old space).
    pub fn update(&mut self, ptr: RemotePtr, data: &[u8]) -> Result<RemotePtr, ClientError> {
        Self::check_value(data)?;
        match self.request(Op::Update {
            ptr,
            data: data.to_vec(),
        })? {
            Reply::Updated(p) => Ok(p),
            r => Err(ClientError::Protocol(format!("update answered {r:?}"))),
        }
    }

    /// Frees the object at `ptr`.
    pub fn delete(&mut self, ptr: RemotePtr) -> Result<(), ClientError> {
        match self.request(Op::Delete { ptr })? {
            Reply::Deleted => Ok(()),
            r => Err(ClientError::Protocol(format!("delete answered {r:?}"))),
        }
    }

    /// Reads through the node (no RDMA Read).
    pub fn read_server(&mut self, ptr: RemotePtr) -> Result<Vec<u8>, ClientError> {
        self.stats.server_reads += 1;
        match self.request(Op::Read { ptr })? {
            Reply::Data { data, .. } => Ok(data),
            r => Err(ClientError::Protocol(format!("read answered {r:?}"))),
        }
    }

    /// Reads the object at `ptr` with a one-sided RDMA Read from the
    /// primary, retrying torn reads; falls back to [`read_server`]
    /// (`Self::read_server`) when the bytes are no object or keep tearing.
    pub fn read(&mut self, ptr: RemotePtr) -> Result<Vec<u8>, ClientError> {
        // Learn the arena (first contact).
        if self.arena.is_none() {
            let t = self.target;
            let _ = self.link(t);
        }
        if !self.one_sided_ok(ptr) {
            // Not ours to read remotely: the node gives the precise error.
            return self.read_server(ptr);
        }
        let len = ptr.len as usize;
        self.ensure_read_mr(len)?;
        for _ in 0..=self.cfg.torn_retries {
            let t = self.target;
            let Ok(link) = self.link(t) else { break };
            let mr = self.read_mr.as_ref().expect("read buffer");
            // The arena's STag as the node gave it now (it rotates when
            // credentials are narrowed); the pointer's names the arena.
            let rkey = self.arena.map_or(ptr.stag, |a| a.stag);
            if link
                .read(mr, len, ptr.addr, rkey, self.cfg.attempt_timeout)
                .is_err()
            {
                self.drop_link(t);
                break;
            }
            let mut buf = vec![0u8; len];
            mr.read_at(0, &mut buf);
            // Exactly the allocation the pointer names, or the node decides
            // (a pointer whose length is not the allocation's is refused,
            // as it is for update and delete).
            match object::decode_exact(&buf) {
                // Another object took the pointer's space (its generation
                // differs): the pointer is stale, nothing of it is returned.
                Ok(o) if o.generation != ptr.gen => {
                    return Err(StoreError::StalePointer { expected: ptr.gen }.into())
                }
                Ok(o) => {
                    self.stats.one_sided_reads += 1;
                    return Ok(o.data.to_vec());
                }
                Err(ObjectError::Torn) => self.stats.torn_reads += 1,
                Err(_) => break,
            }
        }
        self.read_server(ptr)
    }

    /// Reads the objects at `ptrs` with one-sided RDMA Reads from the
    /// primary, up to [`READ_BATCH`] in flight at once on the one
    /// connection (posted together: over TCP the requests leave in one
    /// system call and the node answers them together). Each result is
    /// what [`read`](Self::read) gives for that pointer: a pointer outside
    /// the arena, a torn object or a failed batch falls back to `read` for
    /// the pointers concerned, so errors are per pointer.
    pub fn read_many(&mut self, ptrs: &[RemotePtr]) -> Vec<Result<Vec<u8>, ClientError>> {
        let mut out: Vec<Option<Result<Vec<u8>, ClientError>>> = Vec::with_capacity(ptrs.len());
        out.resize_with(ptrs.len(), || None);
        if self.arena.is_none() {
            let t = self.target;
            let _ = self.link(t);
        }
        // The pointers a one-sided Read may serve, by batch.
        let readable: Vec<usize> = (0..ptrs.len())
            .filter(|&i| self.one_sided_ok(ptrs[i]))
            .collect();
        for batch in readable.chunks(READ_BATCH) {
            // Each Read gets its own stretch of the read buffer.
            let mut offs = Vec::with_capacity(batch.len());
            let mut total = 0usize;
            for &i in batch {
                offs.push(total);
                total += (ptrs[i].len as usize).next_multiple_of(64);
            }
            if self.ensure_read_mr(total).is_err() {
                // `read` reports it per pointer.
                continue;
            }
            let t = self.target;
            let Ok(link) = self.link(t) else { continue };
            let rkey = self.arena.expect("arena known").stag;
            let reads: Vec<(usize, usize, u64)> = batch
                .iter()
                .zip(&offs)
                .map(|(&i, &o)| (o, ptrs[i].len as usize, ptrs[i].addr))
                .collect();
            let mr = self.read_mr.as_ref().expect("read buffer");
            if link
                .read_batch(mr, &reads, rkey, self.cfg.attempt_timeout)
                .is_err()
            {
                // The pointers of this batch go the single-read way.
                self.drop_link(t);
                continue;
            }
            let mut buf = Vec::new();
            for (&i, &(off, len, _)) in batch.iter().zip(&reads) {
                buf.resize(len, 0);
                mr.read_at(off, &mut buf);
                match object::decode_exact(&buf) {
                    Ok(o) if o.generation != ptrs[i].gen => {
                        out[i] = Some(Err(StoreError::StalePointer {
                            expected: ptrs[i].gen,
                        }
                        .into()));
                    }
                    Ok(o) => {
                        self.stats.one_sided_reads += 1;
                        out[i] = Some(Ok(o.data.to_vec()));
                    }
                    Err(ObjectError::Torn) => self.stats.torn_reads += 1,
                    // Not an object there: `read` asks the node, which
                    // gives the precise error.
                    Err(_) => {}
                }
            }
        }
        ptrs.iter()
            .zip(out)
            .map(|(&p, r)| r.unwrap_or_else(|| self.read(p)))
            .collect()
    }

    /// Whether `ptr` lies in the arena (as far as this client knows it),
    /// so that a one-sided Read may serve it.
    fn one_sided_ok(&self, ptr: RemotePtr) -> bool {
        self.arena.is_some_and(|a| {
            crate::ptr::same_arena(ptr.stag, a.stag)
                && ptr.len as usize >= object::HEADER_LEN
                && ptr.addr >= a.base
                && ptr
                    .addr
                    .checked_add(ptr.len as u64)
                    .is_some_and(|e| e <= a.base + a.len)
        })
    }

    /// A read buffer of at least `len` bytes.
    fn ensure_read_mr(&mut self, len: usize) -> Result<(), ClientError> {
        if self.read_mr.as_ref().is_none_or(|m| m.len() < len) {
            let mr = self
                .ep
                .pd()
                .alloc_mr(len.next_power_of_two(), Access::LOCAL_WRITE)
                .map_err(rdma)?;
            self.read_mr = Some(mr);
        }
        Ok(())
    }

    /// Status of every node (asked directly, not through the primary).
    pub fn status_all(&mut self) -> Vec<(SocketAddr, Result<StatusInfo, ClientError>)> {
        let n = self.slots.len();
        let saved = (self.target, self.cfg.deadline);
        self.cfg.deadline = self.cfg.attempt_timeout * 2;
        let mut out = Vec::new();
        for i in 0..n {
            self.target = i;
            let addr = self.slots[i].addr;
            let r = match self.request_at(i, Op::Status) {
                Ok(Reply::Status(s)) => Ok(s),
                Ok(r) => Err(ClientError::Protocol(format!("status answered {r:?}"))),
                Err(e) => Err(e),
            };
            out.push((addr, r));
        }
        (self.target, self.cfg.deadline) = saved;
        out
    }

    /// Status of node `i` of the configured list (no failover).
    pub fn status_of(&mut self, i: usize) -> Result<StatusInfo, ClientError> {
        let saved = self.cfg.deadline;
        self.cfg.deadline = self.cfg.attempt_timeout * 2;
        let r = match self.request_at(i, Op::Status) {
            Ok(Reply::Status(s)) => Ok(s),
            Ok(r) => Err(ClientError::Protocol(format!("status answered {r:?}"))),
            Err(e) => Err(e),
        };
        self.cfg.deadline = saved;
        r
    }

    /// Node `i` only (no failover); a stale epoch is adopted and retried.
    fn request_at(&mut self, i: usize, op: Op) -> Result<Reply, ClientError> {
        let mut tries = 0;
        loop {
            match self.request_at_once(i, op.clone()) {
                Err(ClientError::Store(StoreError::StaleEpoch { current })) if tries < 3 => {
                    self.epoch = self.epoch.max(current);
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn request_at_once(&mut self, i: usize, op: Op) -> Result<Reply, ClientError> {
        self.next_req += 1;
        let req_id = self.next_req;
        let link = self.link(i)?;
        let env = Envelope {
            epoch: self.epoch,
            body: Body::Request {
                client: self.id,
                req_id,
                op,
            },
        };
        link.send(&proto::encode(&env), self.cfg.attempt_timeout)
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
        let until = Instant::now() + self.cfg.attempt_timeout * 3;
        match self.await_response(link.id(), req_id, until) {
            Some(result) => result.map_err(ClientError::from),
            None => Err(ClientError::Unavailable(format!(
                "{}: no answer",
                self.slots[i].addr
            ))),
        }
    }

    /// Waits for the response to `req_id` on link `lid` until `until`,
    /// running this client's links itself: polls for [`CLIENT_SPIN`], then
    /// sleeps on their input. Every message seen raises the known epoch;
    /// `None` when the time ran out or the link went down.
    fn await_response(
        &mut self,
        lid: u32,
        req_id: u64,
        until: Instant,
    ) -> Option<Result<Reply, StoreError>> {
        let spin_until = Instant::now() + self.ep.spin(CLIENT_SPIN);
        let mut evs = Vec::new();
        loop {
            evs.clear();
            self.ep.poll(&mut evs);
            for e in evs.drain(..) {
                match e {
                    LinkEvent::Frame { link, bytes } => self.inbox.push_back((link, bytes)),
                    LinkEvent::Down { link } if link == lid => return None,
                    LinkEvent::Down { .. } => {}
                }
            }
            while let Some((l, bytes)) = self.inbox.pop_front() {
                let Ok(env) = proto::decode(&bytes) else {
                    continue;
                };
                self.epoch = self.epoch.max(env.epoch);
                if l != lid {
                    continue;
                }
                if let Body::Response { req_id: r, result } = env.body {
                    if r == req_id {
                        return Some(result);
                    }
                }
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            if now < spin_until {
                std::thread::yield_now();
            } else {
                self.ep.wait(
                    until
                        .saturating_duration_since(now)
                        .min(Duration::from_millis(50)),
                );
            }
        }
    }

    fn remember(&mut self, key: &[u8], ptr: RemotePtr) {
        if let Some(a) = self.arena {
            self.cache_put(key, (ptr.addr - a.base, ptr.len));
        }
    }

    /// Caches `key`'s object (arena offset, allocation length); at most
    /// [`CACHE_ENTRIES`] entries: a new key then takes an arbitrary old
    /// one's place (a forgotten key costs its next get one more Read).
    fn cache_put(&mut self, key: &[u8], at: (u64, u32)) {
        if let Some(e) = self.cache.get_mut(key) {
            *e = at;
            return;
        }
        if self.cache.len() >= CACHE_ENTRIES {
            if let Some(old) = self.cache.keys().next().cloned() {
                self.cache.remove(&old);
            }
        }
        self.cache.insert(key.to_vec(), at);
    }

    /// Forgets every cached key -> pointer entry (the next get of each key
    /// reads its index bucket first).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Stores `data` under `key` (creating or replacing it); answered once
    /// replicated. Returns where the key's object is now.
    pub fn put(&mut self, key: &[u8], data: &[u8]) -> Result<RemotePtr, ClientError> {
        self.put_if(key, data, Cond::Always)?
            .ok_or_else(|| ClientError::Protocol("an unconditional put was not stored".into()))
    }

    /// Stores `data` under `key` if `cond` holds (`SET NX` / `SET XX`);
    /// `None`: it did not, nothing changed.
    pub fn put_if(
        &mut self,
        key: &[u8],
        data: &[u8],
        cond: Cond,
    ) -> Result<Option<RemotePtr>, ClientError> {
        proto::check_key(key)?;
        Self::check_value(data)?;
        let op = Op::Put {
            key: key.to_vec(),
            data: data.to_vec(),
            cond,
        };
        match self.request(op)? {
            Reply::Stored { ptr, .. } => {
                self.remember(key, ptr);
                Ok(Some(ptr))
            }
            Reply::NotStored => Ok(None),
            r => Err(ClientError::Protocol(format!("put answered {r:?}"))),
        }
    }

    /// Deletes `key`; whether it existed.
    pub fn remove(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        proto::check_key(key)?;
        self.cache.remove(key);
        match self.request(Op::Remove { key: key.to_vec() })? {
            Reply::Removed { existed } => Ok(existed),
            r => Err(ClientError::Protocol(format!("remove answered {r:?}"))),
        }
    }

    /// The node's answer for `key` (the fallback of [`Self::get`]).
    pub fn get_server(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        proto::check_key(key)?;
        self.stats.server_reads += 1;
        match self.request(Op::Get { key: key.to_vec() })? {
            Reply::Value { ptr, data, .. } => {
                self.remember(key, ptr);
                Ok(Some(data))
            }
            Reply::NoKey => {
                self.cache.remove(key);
                Ok(None)
            }
            r => Err(ClientError::Protocol(format!("get answered {r:?}"))),
        }
    }

    /// The key index's layout: read once, one-sided, from the arena's
    /// superblock.
    fn layout(&mut self) -> Option<Layout> {
        if self.layout.is_none() {
            let arena = self.arena?;
            let b = self
                .read_arena(0, crate::index::SUPERBLOCK_LEN as u32)
                .ok()?;
            self.layout = Layout::from_superblock(&b, arena.len).ok();
        }
        self.layout
    }

    /// One RDMA Read of `len` bytes at arena offset `offset` from the node
    /// the client talks to.
    fn read_arena(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, ClientError> {
        let arena = self
            .arena
            .ok_or_else(|| ClientError::Unavailable("arena not known yet".into()))?;
        if offset.saturating_add(len as u64) > arena.len {
            return Err(ClientError::Protocol(format!(
                "read of {len} bytes at {offset} outside the arena"
            )));
        }
        self.ensure_read_mr(len as usize)?;
        let t = self.target;
        let link = self.link(t)?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        if let Err(e) = link.read(
            mr,
            len as usize,
            arena.base + offset,
            arena.stag,
            self.cfg.attempt_timeout,
        ) {
            self.drop_link(t);
            return Err(ClientError::Unavailable(e.to_string()));
        }
        let mut buf = vec![0u8; len as usize];
        mr.read_at(0, &mut buf);
        Ok(buf)
    }

    /// Reads `key`'s value with one-sided RDMA Reads of the primary's
    /// arena (`lookup`: the cached pointer, else the key's index bucket
    /// and then the object), no server CPU on the path. Falls back to the
    /// node ([`Self::get_server`]) when a Read fails or the look-up keeps
    /// racing writes; each fallback is counted with its reason
    /// ([`ClientStats`]).
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        proto::check_key(key)?;
        if self.arena.is_none() {
            let t = self.target;
            let _ = self.link(t);
        }
        let Some(layout) = self.layout() else {
            self.stats.keyed_fallback_refused += 1;
            return self.get_server(key);
        };
        let cached = self.cache.get(key).copied();
        match lookup::run(key, layout, cached, |o, n| self.read_arena(o, n)) {
            Ok((outcome, l)) => {
                self.stats.lookup_restarts += l.restarts() as u64;
                match self.finish(key, outcome, cached.is_some() && l.reads() == 1) {
                    Some(r) => Ok(r),
                    None => self.get_server(key),
                }
            }
            Err(_) => {
                self.stats.keyed_fallback_refused += 1;
                self.get_server(key)
            }
        }
    }

    /// A finished look-up: the answer, or `None` to ask the node.
    fn finish(&mut self, key: &[u8], o: Outcome, one_read: bool) -> Option<Option<Vec<u8>>> {
        match o {
            Outcome::Found {
                offset, len, data, ..
            } => {
                self.stats.keyed_one_sided += 1;
                self.stats.keyed_one_sided_at[self.target.min(3)] += 1;
                self.stats.one_sided_reads += 1;
                self.stats.cache_hits += one_read as u64;
                self.cache_put(key, (offset, len));
                Some(Some(data))
            }
            Outcome::Absent => {
                self.stats.keyed_one_sided += 1;
                self.stats.keyed_one_sided_at[self.target.min(3)] += 1;
                self.stats.one_sided_reads += 1;
                self.cache.remove(key);
                Some(None)
            }
            Outcome::GaveUp => {
                self.stats.keyed_fallback_raced += 1;
                None
            }
        }
    }

    /// Reads many keys (`MGET`): their look-ups run side by side, each
    /// round of their next Reads posted together (up to [`READ_BATCH`] in
    /// flight on the one connection), so a round costs about one round
    /// trip however many keys it serves. Each result is what
    /// [`Self::get`] gives for that key.
    pub fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Result<Option<Vec<u8>>, ClientError>> {
        let mut out: Vec<Option<Result<Option<Vec<u8>>, ClientError>>> = Vec::new();
        out.resize_with(keys.len(), || None);
        if self.arena.is_none() {
            let t = self.target;
            let _ = self.link(t);
        }
        let layout = self.layout();
        // Running look-ups: (key index, look-up, next read, cached).
        let mut running = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if let Err(e) = proto::check_key(k) {
                out[i] = Some(Err(e.into()));
                continue;
            }
            let Some(layout) = layout else { continue };
            let cached = self.cache.get(*k).copied();
            if let (l, Step::Read { offset, len }) = Lookup::start(k, layout, cached) {
                running.push((i, l, (offset, len), cached.is_some()));
            }
        }
        while !running.is_empty() {
            let mut next = Vec::new();
            for chunk in running.chunks_mut(READ_BATCH) {
                let reads: Vec<(u64, u32)> = chunk.iter().map(|r| r.2).collect();
                let Ok(bytes) = self.read_arena_batch(&reads) else {
                    // These keys go the single way.
                    continue;
                };
                for (r, b) in chunk.iter_mut().zip(bytes) {
                    match r.1.on_read(&b) {
                        Step::Read { offset, len } => {
                            r.2 = (offset, len);
                            next.push(r.clone());
                        }
                        Step::Done(o) => {
                            self.stats.lookup_restarts += r.1.restarts() as u64;
                            let one = r.3 && r.1.reads() == 1;
                            if let Some(v) = self.finish(keys[r.0], o, one) {
                                out[r.0] = Some(Ok(v));
                            }
                        }
                    }
                }
            }
            running = next;
        }
        keys.iter()
            .zip(out)
            .map(|(k, r)| r.unwrap_or_else(|| self.get(k)))
            .collect()
    }

    /// Several RDMA Reads `(arena offset, len)` posted together.
    fn read_arena_batch(&mut self, reads: &[(u64, u32)]) -> Result<Vec<Vec<u8>>, ClientError> {
        let arena = self
            .arena
            .ok_or_else(|| ClientError::Unavailable("arena not known yet".into()))?;
        let mut posts = Vec::with_capacity(reads.len());
        let mut total = 0usize;
        for &(off, len) in reads {
            if off.saturating_add(len as u64) > arena.len {
                return Err(ClientError::Protocol("read outside the arena".into()));
            }
            posts.push((total, len as usize, arena.base + off));
            total += (len as usize).next_multiple_of(64);
        }
        self.ensure_read_mr(total)?;
        let t = self.target;
        let link = self.link(t)?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        if let Err(e) = link.read_batch(mr, &posts, arena.stag, self.cfg.attempt_timeout) {
            self.drop_link(t);
            return Err(ClientError::Unavailable(e.to_string()));
        }
        Ok(posts
            .iter()
            .map(|&(o, l, _)| {
                let mut b = vec![0u8; l];
                mr.read_at(o, &mut b);
                b
            })
            .collect())
    }

    /// Keys matching a glob `pattern` (empty: all; at most
    /// [`crate::glob::MAX_PATTERN_LEN`] bytes), in index order; a scan of
    /// the committed index on the primary, a few hundred buckets per
    /// request.
    pub fn scan(&mut self, pattern: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        if pattern.len() > crate::glob::MAX_PATTERN_LEN {
            return Err(StoreError::BadPattern {
                len: pattern.len() as u64,
                max: crate::glob::MAX_PATTERN_LEN as u64,
            }
            .into());
        }
        let mut keys = Vec::new();
        let mut cursor = 0;
        loop {
            let op = Op::Scan {
                cursor,
                count: 1000,
                pattern: pattern.to_vec(),
            };
            match self.request(op)? {
                Reply::Keys { keys: k, next } => {
                    keys.extend(k);
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
                r => return Err(ClientError::Protocol(format!("scan answered {r:?}"))),
            }
        }
    }
}

impl Drop for StoreClient {
    fn drop(&mut self) {
        self.ep.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests the node would refuse are refused before anything is
    /// sent: no node listens at the address given.
    #[test]
    fn bad_keys_and_patterns_are_refused_locally() {
        let cfg = ClientConfig {
            deadline: Duration::from_millis(200),
            ..ClientConfig::new(vec!["127.0.0.1:9".parse().unwrap()])
        };
        let mut c = StoreClient::new(cfg).unwrap();
        let max = crate::glob::MAX_PATTERN_LEN;
        assert!(matches!(
            c.scan(&vec![b'*'; max + 1]),
            Err(ClientError::Store(StoreError::BadPattern { len, .. })) if len == max as u64 + 1
        ));
        assert!(matches!(
            c.remove(b""),
            Err(ClientError::Store(StoreError::BadKey { len: 0, .. }))
        ));
    }
}
