//! The store on the verbs engine: links, the node server and the client.
//!
//! * [`link`]: one store message per RDMA Send on an RC queue pair, with a
//!   receiver thread per endpoint and one-sided RDMA Reads.
//! * [`server`]: `softrdma store serve`, the node runtime around
//!   [`crate::node::Node`].
//! * [`client`]: the client library: a keyed face (`get`, `set`, `del`,
//!   ...) and a pointer face (`alloc`, `read_ptr`, `update_ptr`, `free`)
//!   over a request session (failover) and a one-sided reader.
//! * [`handshake`]: connection private data (who connects, the proofs of
//!   the group's credentials); a client learns each node's id and the
//!   arena, and a joining node the group's arena address and STag, from
//!   the accept reply.

pub mod client;
pub mod handshake;
pub mod link;
pub mod resp;
#[allow(unsafe_code)]
pub mod server;

use std::time::Duration;

/// Time allowed for one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

pub use crate::auth::random_u64;
