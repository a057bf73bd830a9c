//! The store on the verbs engine: links, the node server and the client.
//!
//! * [`link`]: one store message per RDMA Send on an RC queue pair, with a
//!   receiver thread per endpoint and one-sided RDMA Reads.
//! * [`server`]: `softrdma store serve`, the node runtime around
//!   `Node` (the state machine in `node/`): it starts the threads, and runs the node loop
//!   (`node_loop.rs`, the only owner of the node and the arena), which
//!   registers the arena for remote reads through `arena_reg.rs` (the one
//!   `unsafe` here).
//! * [`redis_door`]: the Redis-protocol (RESP) front door, which reaches
//!   the node only through its [`redis_door::Front`] trait.
//! * [`client`]: the client library: a keyed face (`get`, `set`, `del`,
//!   ...) and a pointer face (`alloc`, `read_ptr`, `update_ptr`, `free`)
//!   over a request session (failover) and a one-sided reader.
//! * `herald.rs`: while a node back from its log loads its snapshot, it
//!   tells its peers how new that state is (the election of the newest).
//! * [`handshake`]: connection private data (who connects, the proofs of
//!   the group's credentials); a client learns each node's id and the
//!   arena, and a joining node the group's arena address and STag, from
//!   the accept reply.

#[allow(unsafe_code)]
mod arena_reg;
pub mod client;
pub mod handshake;
mod herald;
pub mod link;
mod node_front;
mod node_loop;
mod outbox;
mod persist_thread;
pub mod redis_door;
pub mod server;

use std::time::Duration;

/// Time allowed for one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

pub use crate::auth::random_u64;
