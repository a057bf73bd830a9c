//! The store's client library.
//!
//! A [`StoreClient`] talks to the nodes of one replica group. It offers
//! two APIs, each a thin face over the same two engines:
//!
//! * the **keyed** API ([`keyed`]), Redis-like verbs on keys:
//!   [`get`](StoreClient::get), [`get_many`](StoreClient::get_many),
//!   [`set`](StoreClient::set), [`set_if`](StoreClient::set_if),
//!   [`del`](StoreClient::del), [`scan`](StoreClient::scan),
//!   [`get_via_node`](StoreClient::get_via_node);
//! * the **pointer** API ([`pointers`]), objects named by their
//!   [`RemotePtr`], with memory verbs or a `_ptr` suffix:
//!   [`alloc`](StoreClient::alloc), [`read_ptr`](StoreClient::read_ptr),
//!   [`read_ptrs`](StoreClient::read_ptrs),
//!   [`update_ptr`](StoreClient::update_ptr), [`free`](StoreClient::free),
//!   [`read_ptr_via_node`](StoreClient::read_ptr_via_node).
//!
//! No verb appears in both, and none of one face is a synonym of one of
//! the other: keys are `get`/`set`/`del`, pointers `alloc`/`read_ptr`/
//! `update_ptr`/`free`. The names before issue 31, for readers of older
//! code:
//!
//! | before | now | protocol op |
//! |---|---|---|
//! | `put` | `set` | `Op::Put` (`Cond::Always`) |
//! | `put_if` | `set_if` | `Op::Put` |
//! | `remove` | `del` | `Op::Remove` |
//! | `get` | `get` | one-sided look-up, else `Op::Get` |
//! | `get_many` | `get_many` | one-sided look-ups, batched |
//! | `get_server` | `get_via_node` | `Op::Get` |
//! | `scan` | `scan` | `Op::Scan` |
//! | `insert` | `alloc` | `Op::Insert` |
//! | `read` | `read_ptr` | one-sided Read, else `Op::Read` |
//! | `read_many` | `read_ptrs` | one-sided Reads, batched |
//! | `read_server` | `read_ptr_via_node` | `Op::Read` |
//! | `update` | `update_ptr` | `Op::Update` |
//! | `delete` | `free` | `Op::Delete` |
//!
//! Underneath:
//!
//! * `session.rs`: the request session. Writes are requests to the
//!   primary, which answers once the write exists on both nodes (or on
//!   itself alone after the coordinator recorded that the group is
//!   degraded). Each request carries the client's epoch and a request id;
//!   when the primary does not answer within the per-attempt timeout, or
//!   answers `NotPrimary`, the same request (same id) goes to the other
//!   node, and the nodes' replicated de-duplication table makes a retried
//!   write take effect once.
//! * `reader.rs`: the one-sided reader. Reads are **one-sided RDMA Reads**
//!   of the primary's arena, with no server CPU on the path: an object at
//!   its pointer (the header's checksum detects a Read that raced an
//!   update, which is retried), or a key after a look-up in the arena's
//!   index ([`crate::lookup`]; a cached pointer makes it one Read). When a
//!   Read cannot answer, the face asks the node, which also gives the
//!   precise error; keyed fallbacks are counted ([`ClientStats`]).
//! * `error.rs`: [`ClientError`] and its parts, typed.
//!
//! The raw session is reachable too ([`StoreClient::request`],
//! [`StoreClient::request_as`]) for callers that speak the protocol
//! themselves (the RESP front door).

mod error;
pub mod keyed;
pub mod pointers;
mod reader;
mod session;

use std::net::SocketAddr;
use std::time::Duration;

pub use error::{ClientError, OpKind, Unreachable};
pub use reader::CACHE_ENTRIES;

use crate::net::handshake::ClientAuth;
use crate::proto::{Op, Reply, StatusInfo};
use crate::ptr::{ArenaRef, RemotePtr};
use reader::Reader;
use session::Session;

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
    /// ([`crate::proto::StoreError::NotEnoughReplicas`]: nothing changed,
    /// under `min_in_sync_replicas = 1` while the secondary is re-copied)
    /// is retried before the refusal is returned (within `deadline`); zero
    /// returns it at once.
    pub wait_for_replicas: Duration,
    /// The credential to prove (the group's user and password); `None`:
    /// only nodes without credentials (protected mode, loopback) admit
    /// the client.
    pub auth: Option<ClientAuth>,
}

impl ClientConfig {
    /// How long one attempt that moves `bytes` (a request's, a one-sided
    /// Read's) may take: [`ClientConfig::attempt_timeout`], and 30 ms per
    /// MiB, so that a 64 MiB value (pulled by the primary, then by the
    /// secondary) is not sent again while it is still travelling.
    pub fn attempt_for(&self, bytes: usize) -> Duration {
        self.attempt_timeout + Duration::from_millis(30 * (bytes >> 20) as u64)
    }
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

/// A client of one replica group: the entry point of both APIs (the
/// keyed face in [`keyed`], the pointer face in [`pointers`]).
pub struct StoreClient {
    session: Session,
    reader: Reader,
}

impl StoreClient {
    /// A client of the group at `cfg.nodes` (connections open lazily).
    pub fn new(cfg: ClientConfig) -> Result<StoreClient, ClientError> {
        Ok(StoreClient {
            session: Session::new(cfg)?,
            reader: Reader::default(),
        })
    }

    /// This client's id.
    pub fn id(&self) -> u64 {
        self.session.id()
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            retries: self.session.retries(),
            ..self.reader.stats()
        }
    }

    /// The highest epoch seen.
    pub fn epoch(&self) -> u64 {
        self.session.epoch()
    }

    /// The arena, once a node told it.
    pub fn arena(&self) -> Option<ArenaRef> {
        self.session.arena()
    }

    /// Forgets every cached key -> pointer entry (the next get of each key
    /// reads its index bucket first).
    pub fn clear_cache(&mut self) {
        self.reader.clear_cache();
    }

    /// Sends `op` to the primary, failing over as needed, until it is
    /// answered or the deadline passes.
    pub fn request(&mut self, op: Op) -> Result<Reply, ClientError> {
        self.session.request(op)
    }

    /// Request ids from now on are above `used` (ids another path of the
    /// same client id already used).
    pub fn skip_req_ids(&mut self, used: u64) {
        self.session.skip_req_ids(used)
    }

    /// A new request id of this client (for a request made another way
    /// first, such as the RESP front door's in-process path, and retried
    /// with [`Self::request_as`]).
    pub fn next_req_id(&mut self) -> u64 {
        self.session.next_req_id()
    }

    /// [`Self::request`] under request id `req_id`: a retry of a request
    /// that may have been applied already takes effect once (the nodes'
    /// replicated de-duplication table answers it as before).
    pub fn request_as(&mut self, req_id: u64, op: Op) -> Result<Reply, ClientError> {
        self.session.request_as(req_id, op)
    }

    /// Status of every node (asked directly, not through the primary).
    pub fn status_all(&mut self) -> Vec<(SocketAddr, Result<StatusInfo, ClientError>)> {
        let addrs = self.session.addrs();
        addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| (addr, self.session.status_of(i)))
            .collect()
    }

    /// Status of node `i` of the configured list (no failover).
    pub fn status_of(&mut self, i: usize) -> Result<StatusInfo, ClientError> {
        self.session.status_of(i)
    }

    /// `key`'s object is at `ptr` now: the cache keeps it.
    fn remember(&mut self, key: &[u8], ptr: RemotePtr) {
        self.reader.remember(self.session.arena(), key, ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::StoreError;

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
            c.del(b""),
            Err(ClientError::Store(StoreError::BadKey { len: 0, .. }))
        ));
        assert!(matches!(
            c.set(b"k", &vec![0u8; crate::net::link::MAX_VALUE + 1]),
            Err(ClientError::ValueTooLarge { .. })
        ));
        assert!(matches!(
            c.alloc(&vec![0u8; crate::net::link::MAX_VALUE + 1]),
            Err(ClientError::ValueTooLarge { .. })
        ));
    }

    /// With no node at the address, a request ends unavailable, with the
    /// last failure typed (the connection to the one node).
    #[test]
    fn no_node_is_unavailable_with_the_reason() {
        let cfg = ClientConfig {
            deadline: Duration::from_millis(200),
            wait_for_replicas: Duration::ZERO,
            ..ClientConfig::new(vec!["127.0.0.1:9".parse().unwrap()])
        };
        let mut c = StoreClient::new(cfg).unwrap();
        let e = c.alloc(b"x").unwrap_err();
        assert!(
            matches!(e, ClientError::Unavailable(Unreachable::Connect { .. })),
            "{e:?}"
        );
        assert!(matches!(
            StoreClient::new(ClientConfig::new(vec![])),
            Err(ClientError::NoNodes)
        ));
    }
}
