//! # softrdma-verbs: RDMA verbs in user space, over TCP
//!
//! The engine gives Rust programs RDMA semantics (registered memory with
//! STags, RC queue pairs, one-sided RDMA Read and Write, Sends, completion
//! queues) with no RDMA NIC and no kernel module. On the wire it speaks
//! iWARP (RFC 5040 RDMAP, RFC 5041 DDP, RFC 5044 MPA with RFC 6581 v2) over
//! TCP, so it interoperates with the Linux kernel's soft-iWARP (`siw`).
//! Between two softrdma ends, connections may also negotiate RFC 7306
//! atomics and immediate data (`docs/extensions.md`).
//!
//! The layout follows Linux siw:
//!
//! | here | role | siw |
//! |------|------|-----|
//! | [`device`](Device) | devices, protection domains, memory registration API | `siw_verbs.c` |
//! | `mr` | STag table, access checks, placement helpers | `siw_mem.c` |
//! | [`qp`](QueuePair) | the QP API: state changes, posting | `siw_verbs.c` |
//! | `engine` | per-device `Core`, per-QP state, queues, ordering, flush; the `Transport` trait it reaches its transports through | `siw_qp.c` |
//! | `iwarp` | the iWARP transport (`iwarp/driver.rs`: its `Transport` impl and progress entry points); FPDU send path (`iwarp/tx.rs`, `wqe.rs`, `batch.rs`) and receive path with direct placement (`iwarp/rx.rs`, one handler per RDMAP opcode in `rdmap.rs`) | `siw_qp_tx.c`, `siw_qp_rx.c` |
//! | [`cm`](ConnectRequest) | listen / connect / accept / reject, MPA exchange | `siw_cm.c` |
//! | `local` | the local transport: a QP bound to this device's own regions | (softrdma's own) |
//! | `progress` | a fixed set of progress threads per device | (siw's tx threads) |
//! | [`cq`](CompletionQueue) | completion queues and notification | `siw_cq.c` |
//!
//! ## A taste
//!
//! ```no_run
//! use softrdma_verbs::*;
//! # fn main() -> Result<()> {
//! let dev = Device::open_default()?;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(64)?;
//! let qp = pd.create_qp(QpInitAttr::new(&cq))?;
//! let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
//! qp.connect("127.0.0.1:7174", &ConnParams::default())?;
//! // Write 4 KiB into the peer's region (rkey and address from the peer).
//! # let (remote_addr, rkey) = (0u64, Rkey::from_raw(0));
//! qp.post_send(&SendWr::write(1, &[mr.sge_all()], remote_addr, rkey))?;
//! let wc = cq.wait_one(std::time::Duration::from_secs(5)).expect("completion");
//! assert!(wc.is_ok());
//! # Ok(()) }
//! ```
//!
//! ## What a completion promises
//!
//! As in RFC 5040 (RDMAP, section 5: a Data Source's completion of an RDMA
//! Write says nothing about the Data Sink, which is never notified) and as
//! Linux siw implements it (`siw_qp_tx.c` completes a Write once its last
//! FPDU is handed to TCP):
//!
//! * **RDMA Write / Send completion at the initiator**: the source buffers
//!   may be reused. Nothing more: the target may not have placed the bytes
//!   yet (they can sit in socket buffers or in the target's receive path),
//!   and a remote failure after that point is reported by a Terminate, not
//!   by this completion. Do not inspect the target's memory on the strength
//!   of it.
//! * **Placement is proven by** the completion of a later RDMA Read on the
//!   same QP (a target answers a Read Request only after everything before
//!   it on the stream was placed; [`SendWr::flush`] is the zero-length one
//!   for exactly this), or by the target's own receive completion of a later
//!   Send (or Write with Immediate Data) on the same QP, after which the
//!   target may look, and answer.
//! * **RDMA Read completion**: the bytes are in the local buffer.
//! * **Receive completion**: the message and every Write before it on the
//!   same QP are placed.
//! * On the same-host transport a Write is copied into the peer's memory by
//!   the posting thread, so placement happens before the completion; code
//!   must not rely on it, since the same program over TCP would race.
//!
//! ## Safety model
//!
//! Posting is safe: a work request names memory by lkey, and the engine
//! holds the registration (and so the memory) until the request completes.
//! Deregistering invalidates the STag at once, but never frees memory the
//! engine may still touch; for caller-owned memory (`register_raw`) the
//! drop of the region waits until no engine access to it is in progress. The only `unsafe` entry points are
//! [`ProtectionDomain::register_raw`] and
//! [`ProtectionDomain::register_owned`], for memory the caller owns.
//! Registration pins the pages (`mlock`, counted per process against
//! [`set_pin_limit`]), as `ibv_reg_mr` does on hardware.
//!
//! `unsafe` is denied in the crate except in the modules that `lib.rs`
//! allows it in, one by one (the compiler enforces this list):
//!
//! | module | why |
//! |--------|-----|
//! | `sys` | system calls on raw memory and descriptors |
//! | `mr` | registration, placement helpers, the access fence |
//! | `pin` | `mlock` of registered pages |
//! | `pool`, `shm` | shared-memory mappings (registered chunks, same-host segments) |
//! | `samehost` | direct copies into a same-host peer's memory |
//! | `spans` | `MemSpans`: registered memory handed to a storage backend (copies, pread/pwrite) |
//! | `iwarp`, `local` | placement of received bytes and sends from registered memory |
//! | `device`, `qp` | the `unsafe` API entry points (`register_raw`, `register_owned`, `advertise_buffers`) |
//!
//! Each block states why it is sound (`clippy::undocumented_unsafe_blocks`
//! is on for the workspace).

#![deny(unsafe_code)]
#![deny(missing_docs)]

mod backend;
mod cm;
mod cq;
#[allow(unsafe_code)]
mod device;
mod engine;
mod error;
#[allow(unsafe_code)]
mod iwarp;
#[allow(unsafe_code)]
mod local;
#[allow(unsafe_code)]
mod mr;
mod negotiated;
#[allow(unsafe_code)]
mod pin;
pub mod pipe;
mod poller;
#[allow(unsafe_code)]
mod pool;
mod progress;
#[allow(unsafe_code)]
mod qp;
mod qp_state;
pub mod registry;
#[allow(unsafe_code)]
mod samehost;
#[allow(unsafe_code)]
mod shm;
pub mod sim;
#[allow(unsafe_code)]
mod spans;
mod srq;
mod stag;
#[allow(unsafe_code)]
mod sys;
pub mod tcp;
#[doc(hidden)]
pub mod test_hooks;
pub mod threads;
mod timers;
mod wr;

pub use backend::{write_each, IoDone, RegionBackend};
pub use cm::{ConnParams, ConnectRequest, Listener, Negotiated};
pub use cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use device::{
    AsyncEvent, Device, DeviceAttr, DeviceConfig, FastRegMr, MemoryRegion, PostCheck,
    ProtectionDomain, RegOptions,
};
pub use error::{Error, Result};
pub use mr::{Access, AccessGuard};
pub use pin::{pinned_bytes, pinning_enabled, set_pin_limit, PinMap};
pub use poller::{DrivenCq, Poller, Waker};
pub use qp::{QpCaps, QpInitAttr, QpState, QueuePair, REG_CACHE_IDLE_BYTES, REG_CACHE_IDLE_MAX};
pub use registry::{DeviceInfo, MrInfo, QpInfo};
pub use samehost::{same_host_default, SameHostStats};
pub use spans::MemSpans;
pub use srq::SharedReceiveQueue;
pub use stag::{Lkey, Qpn, Rkey, Stag};
pub use wr::{RecvWr, SendFlags, SendWr, Sge, WrOp};

/// Re-export of the wire codecs.
pub use softrdma_wire as wire;
