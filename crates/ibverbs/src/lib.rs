//! `libibverbs.so.1` for unmodified RDMA applications, with softrdma's
//! engine inside (issue 30). Debian's rdma-core finds devices through the
//! kernel and loads providers only for kernel devices, so this replaces the
//! library as a whole (docs/libibverbs.md): an application started with
//! this directory first on `LD_LIBRARY_PATH` (`softrdma run -- CMD`) sees
//! one iWARP device, `softrdma0`, and its verbs go to the engine.
//!
//! The pieces, one room each:
//! - [`abi`]: rdma-core v44's structures and constants (bindgen, committed;
//!   their layout tests are this crate's unit tests).
//! - `config`: what the environment sets (address, CRC, extensions, logs).
//! - `objects`: the C structures applications see, each the first field of
//!   a Rust object that holds the engine's handle (`Ctx`, `Pd`, `Mr`, `Cq`,
//!   `Channel`, `Qp`), and the process's one engine device.
//! - `convert`: work requests and completions between the two worlds.
//! - `errno`: the engine's errors as the errno a kernel provider returns.
//! - `spin` and `cork`: a spinning poller runs the QPs' receivers; posts
//!   made while completions wait to be reaped go out together at the next
//!   poll.
//! - `share`: registered `malloc` memory moved into a memfd that same-host
//!   peers map (`SOFTRDMA_SHARE_MR=0` turns it off).
//! - `events`: the thread that turns the engine's asynchronous events into
//!   verbs and CM events.
//! - `verbs_*`: the exported functions, thin: check the pointers, call
//!   safe code, map the result.
//! - `cm`: librdmacm's semantics on the engine's connection manager; its
//!   functions are exported as `softrdma_rdma_*` for `librdmacm.so.1`
//!   (`crates/rdmacm`), which forwards to them, so that the process has
//!   one engine.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod abi;
#[allow(unsafe_code)]
mod cm;
mod config;
#[allow(unsafe_code)]
mod convert;
mod cork;
mod errno;
#[allow(unsafe_code)]
mod events;
#[allow(unsafe_code)]
mod objects;
#[allow(unsafe_code)]
mod share;
mod spin;
#[allow(unsafe_code)]
mod verbs_cq;
#[allow(unsafe_code)]
mod verbs_device;
#[allow(unsafe_code)]
mod verbs_mr;
#[allow(unsafe_code)]
mod verbs_other;
#[allow(unsafe_code)]
mod verbs_qp;
