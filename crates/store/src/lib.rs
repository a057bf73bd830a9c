//! softrdma-store: the highly available remote memory store.
//!
//! A replica group (a primary and a secondary) maps its arena at one
//! virtual address under one access key, so a remote pointer is valid on
//! both; a write is replicated before it is acknowledged; clients read
//! with one-sided RDMA Reads and fail over. `docs/store.md` is the design,
//! with a quick start and walks of a keyed put and a one-sided get.
//!
//! # The front door
//!
//! What a user of the crate needs is re-exported here:
//!
//! * the client: [`StoreClient`] (a keyed face, `get`/`set`/`del`/`scan`,
//!   and a pointer face, `alloc`/`read_ptr`/`update_ptr`/`free`),
//!   [`ClientConfig`], [`ClientError`], [`ClientStats`];
//! * what its calls take and return: [`RemotePtr`], [`ArenaRef`], [`Cond`],
//!   [`StoreError`], [`StatusInfo`];
//! * a node: [`Config`] (the TOML of `softrdma store serve`) and [`serve`];
//!   the group's secret, [`Secret`].
//!
//! ```no_run
//! use softrdma_store::{ClientConfig, StoreClient};
//!
//! let mut c = StoreClient::new(ClientConfig::new(vec!["127.0.0.1:7400".parse()?]))?;
//! c.set(b"greeting", b"hello")?; // acknowledged once both nodes hold it
//! assert_eq!(c.get(b"greeting")?.as_deref(), Some(&b"hello"[..])); // one-sided
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The modules
//!
//! The engine-independent parts, each usable and tested on its own; the
//! verbs engine plugs in behind the message seam of the node state machine
//! (`node/`, private: the runtime in [`net`] drives it).
//!
//! * [`arena`]: fixed-address mappings.
//! * [`alloc`]: deterministic allocator over arena offsets.
//! * [`auth`]: credentials and the connection handshake's proofs.
//! * [`object`]: object header and torn-read detection.
//! * [`index`]: the key index in the arena, read one-sided by clients.
//! * [`lookup`]: a key's one-sided look-up, as a pure state machine.
//! * [`glob`]: glob patterns over keys (`scan`, `KEYS`).
//! * [`ptr`]: remote pointers, their encodings and validation.
//! * [`resp_codec`]: the Redis protocol (RESP2 and RESP3) as a pure codec.
//! * [`redis_float`]: `INCRBYFLOAT`'s 80-bit arithmetic and printing, as
//!   Redis does them.
//! * [`redis_int`]: integers as Redis reads them (the counters).
//! * [`proto`]: messages (every one carries the sender's epoch) and codec.
//! * `node/` (private): the pure replication state machine of one node:
//!   the replicated image apart from the protocol (roles, epochs, leases;
//!   join and copy), one pure `Node::handle`.
//! * [`coord`]: coordinators (rules, embedded TCP server, etcd).
//! * [`config`]: TOML configuration of `softrdma store serve`.
//! * [`persist`]: the durable log on a storage endpoint's partition (the
//!   record codec, the ring with group commit and its recovering scan).
//! * [`lincheck`]: the linearizability checker behind `softrdma store
//!   lincheck` and the tests' recorded histories.
//! * `sim/` (tests, or the `testing` feature): deterministic simulation of
//!   a replica group.
//! * [`net`]: the store on the verbs engine (links, node server, client,
//!   the Redis-protocol front door).
//!
//! `unsafe` lives in two modules, which the compiler holds to
//! (`deny(unsafe_code)` here, allowed on them alone): [`arena`] (the
//! mappings) and `net/arena_reg.rs` (registering the arena with the
//! engine, for [`net::server`]).

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod alloc;
#[allow(unsafe_code)]
pub mod arena;
pub mod auth;
pub mod config;
pub mod coord;
pub mod glob;
pub mod index;
pub mod lincheck;
pub mod lookup;
pub mod net;
mod node;
pub mod object;
pub mod persist;
pub mod proto;
pub mod ptr;
pub mod redis_float;
pub mod redis_int;
pub mod resp_codec;
/// Deterministic simulation of a replica group (`SOFTRDMA_SEEDS` seeds of
/// crashes, partitions and clock faults against the real `Node`); built
/// for the crate's tests, or for others with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub mod sim;

pub use auth::Secret;
pub use config::Config;
pub use net::client::{ClientConfig, ClientError, ClientStats, StoreClient};
pub use net::server::serve;
pub use proto::{Cond, StatusInfo, StoreError};
pub use ptr::{ArenaRef, RemotePtr};
