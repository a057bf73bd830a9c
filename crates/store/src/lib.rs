//! softrdma-store: the highly available remote memory store.
//!
//! The engine-independent parts of the store, each usable and tested on its
//! own; the RDMA verbs engine plugs in behind the message seam of
//! [`node`] (see `docs/store.md`).
//!
//! * [`arena`]: fixed-address mappings.
//! * [`alloc`]: deterministic allocator over arena offsets.
//! * [`auth`]: credentials and the connection handshake's proofs.
//! * [`object`]: object header and torn-read detection.
//! * [`index`]: the key index in the arena, read one-sided by clients.
//! * [`lookup`]: a key's one-sided look-up, as a pure state machine.
//! * [`glob`]: glob patterns over keys (`scan`, `KEYS`).
//! * [`ptr`]: remote pointers, their encodings and validation.
//! * [`resp_codec`]: the Redis protocol (RESP2) as a pure codec.
//! * [`proto`]: messages (every one carries the sender's epoch) and codec.
//! * [`node`]: the pure replication state machine of one node.
//! * [`coord`]: coordinators (rules, embedded TCP server, etcd).
//! * [`config`]: TOML configuration of `softrdma store serve`.
//! * [`sim`]: deterministic simulation of a replica group.
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
pub mod node;
pub mod object;
pub mod proto;
pub mod ptr;
pub mod resp_codec;
pub mod sim;
