//! The store's client library.
//!
//! A [`StoreClient`] talks to the nodes of one replica group. Writes
//! (`insert`, `update`, `delete`) are requests to the primary; the primary
//! answers once the write exists on both nodes (or on itself alone after
//! the coordinator recorded that the group is degraded). Reads are
//! **one-sided RDMA Reads** of the object at its remote pointer, with no
//! server CPU on the path; the object header's checksum detects a read that
//! raced an update, which is retried; after a few torn reads, or when the
//! bytes are not an object (freed space), the client falls back to a
//! server-side read, which also gives the precise error.
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

use super::link::{Endpoint, Link, LinkError, LinkEvent, MAX_VALUE, READ_BATCH};
use super::{parse_accept, random_u64, Hello, CONNECT_TIMEOUT};
use crate::object::{self, ObjectError};
use crate::proto::{self, Body, Envelope, NodeId, Op, Reply, StatusInfo, StoreError};
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
}

impl ClientConfig {
    /// Defaults for `nodes`.
    pub fn new(nodes: Vec<SocketAddr>) -> ClientConfig {
        ClientConfig {
            nodes,
            attempt_timeout: Duration::from_millis(300),
            deadline: Duration::from_secs(15),
            torn_retries: 8,
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
}

struct Slot {
    addr: SocketAddr,
    link: Option<Arc<Link>>,
    node: Option<NodeId>,
}

/// How long a client polls for its answer before it sleeps, when a link is
/// same-host ([`Endpoint::spin`]).
const CLIENT_SPIN: Duration = Duration::from_micros(100);

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
    /// User key -> pointer, for `put`/`get`/`remove`.
    keys: HashMap<String, RemotePtr>,
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
        Ok(StoreClient {
            cfg,
            ep,
            inbox: std::collections::VecDeque::new(),
            slots,
            target: 0,
            epoch: 0,
            id: random_u64(),
            next_req: 0,
            arena: None,
            read_mr: None,
            keys: HashMap::new(),
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
        let hello = Hello::Client(self.id).encode();
        let (link, reply) = self
            .ep
            .connect(self.slots[i].addr, &hello, CONNECT_TIMEOUT)
            .map_err(|e| match e {
                LinkError::Protocol(_) => {
                    ClientError::Protocol(format!("{}: {e}", self.slots[i].addr))
                }
                e => ClientError::Unavailable(format!("{}: {e}", self.slots[i].addr)),
            })?;
        let (node, arena) = parse_accept(&reply).ok_or_else(|| {
            ClientError::Protocol(format!("{}: not a store node", self.slots[i].addr))
        })?;
        self.slots[i].node = Some(node);
        if let Some(a) = arena {
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
        self.next_req += 1;
        let req_id = self.next_req;
        let deadline = Instant::now() + self.cfg.deadline;
        let mut last_err = String::from("no attempt made");
        // Nodes that answered with something other than a store node's
        // handshake: when every one did, waiting will not help.
        let mut not_store = vec![false; self.slots.len()];
        loop {
            if Instant::now() > deadline {
                return Err(ClientError::Unavailable(last_err));
            }
            let t = self.target;
            let link = match self.link(t) {
                Ok(l) => l,
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
            if link
                .read(mr, len, ptr.addr, ptr.stag, self.cfg.attempt_timeout)
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
            ptr.stag == a.stag
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

    /// Stores `data` under a user key (insert, or update of the key's
    /// object); the key -> pointer map lives in this client.
    pub fn put(&mut self, key: &str, data: &[u8]) -> Result<RemotePtr, ClientError> {
        let p = match self.keys.get(key) {
            Some(&p) => self.update(p, data)?,
            None => self.insert(data)?,
        };
        self.keys.insert(key.to_string(), p);
        Ok(p)
    }

    /// The pointer stored under `key`.
    pub fn pointer(&self, key: &str) -> Option<RemotePtr> {
        self.keys.get(key).copied()
    }

    /// Reads the object stored under `key`.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, ClientError> {
        match self.keys.get(key).copied() {
            Some(p) => self.read(p).map(Some),
            None => Ok(None),
        }
    }

    /// Deletes the object stored under `key`.
    pub fn remove(&mut self, key: &str) -> Result<bool, ClientError> {
        match self.keys.remove(key) {
            Some(p) => self.delete(p).map(|_| true),
            None => Ok(false),
        }
    }
}

impl Drop for StoreClient {
    fn drop(&mut self) {
        self.ep.shutdown();
    }
}
