//! Work requests.

use crate::mr::Access;
use crate::stag::{Lkey, Rkey};

/// A scatter/gather element: `length` bytes at virtual address `addr` of the
/// region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte, inside the region.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region the bytes belong to.
    pub lkey: Lkey,
}

/// Send flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flags.
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion (always, whatever the QP's default).
    pub const SIGNALED: SendFlags = SendFlags(1);
    /// Do not start before every earlier RDMA Read has completed.
    pub const FENCE: SendFlags = SendFlags(2);
    /// Ask for a solicited event at the receiver (Sends only).
    pub const SOLICITED: SendFlags = SendFlags(4);

    /// Whether every flag in `o` is set in `self`.
    pub fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WrOp {
    /// A Send: the payload lands in the peer's next receive buffer.
    Send,
    /// Send with Invalidate: the peer invalidates `rkey` on receipt.
    SendWithInv {
        /// The peer's STag to invalidate.
        rkey: Rkey,
    },
    /// RDMA Write of the SGEs into the peer's memory.
    RdmaWrite {
        /// Virtual address in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
    },
    /// RDMA Read into the (single) local SGE.
    RdmaRead {
        /// Virtual address in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
    },
    /// Invalidate a local STag.
    LocalInv {
        /// The local STag to invalidate.
        stag: Rkey,
    },
    /// RFC 7306 fetch-and-add on the naturally aligned 64-bit value at
    /// `remote_addr`; the original value lands in the (single, 8-byte)
    /// local SGE. Needs a connection that negotiated RFC 7306.
    AtomicFetchAdd {
        /// Virtual address of the 8-byte target in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
        /// The value to add.
        add: u64,
    },
    /// RFC 7306 compare-and-swap: if the remote value equals `compare` it
    /// becomes `swap`; the original value lands in the local SGE.
    AtomicCmpSwap {
        /// Virtual address of the 8-byte target in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
        /// The value the target must hold for the swap.
        compare: u64,
        /// The value written when it does.
        swap: u64,
    },
    /// RDMA Write followed by an RFC 7306 Immediate Data message carrying
    /// `imm`: the peer gets one receive completion with `imm_data`, after
    /// the written bytes are in place.
    WriteImm {
        /// Virtual address in the peer's region.
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
        /// The immediate value for the peer's receive completion.
        imm: u32,
    },
    /// RFC 7306 Immediate Data: no payload; `imm` arrives in the peer's
    /// receive completion (it consumes one receive WR there, like a Send).
    SendImm {
        /// The immediate value for the peer's receive completion.
        imm: u32,
    },
    /// One-shot advertise (`docs/one-shot.md`): a Send carrying `stag` in
    /// its RDMAP header. [`crate::QueuePair::advertise`] posts it after
    /// binding the STag; with a peer that did not negotiate the extension
    /// it goes out as a plain Send (advertise then puts the STag at the
    /// start of the payload).
    SendAdvertise {
        /// The local STag advertised to the peer.
        stag: Rkey,
    },
    /// One-shot close (`docs/one-shot.md`): a Send that closes the peer's
    /// advertised STag `stag`; the peer invalidates it and frees its
    /// binding before it reports the receive. With a peer that did not
    /// negotiate the extension, a Send with Invalidate.
    SendClose {
        /// The peer's advertised STag to close.
        stag: Rkey,
    },
    /// A flush (barrier) of the peer's region `rkey`: on the wire a
    /// zero-length RDMA Read Request naming it, which a peer whose region
    /// is backed by storage answers only once every Write it placed before
    /// is durable (`RegionBackend::flush`); any other peer answers at once,
    /// its earlier Writes being placed. Completes as [`crate::WcOpcode::Flush`].
    /// No SGEs.
    Flush {
        /// Virtual address in the peer's region (the Read Request's source).
        remote_addr: u64,
        /// The peer region's remote key.
        rkey: Rkey,
    },
    /// Bind a fast-register region's index to the memory of `sgl` under a
    /// new key byte, at virtual address `iova`, with `access`.
    FastReg {
        /// An STag of the fast-register region to bind: its index names the region (the key byte in
        /// it is ignored).
        index_stag: u32,
        /// The new key byte.
        key: u8,
        /// Virtual address the region starts at once bound.
        iova: u64,
        /// Access rights of the binding.
        access: Access,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its remote operands.
    pub op: WrOp,
    /// The local memory: source for sends and writes, destination for reads and atomics.
    pub sgl: Vec<Sge>,
    /// Completion and ordering flags.
    pub flags: SendFlags,
}

impl SendWr {
    /// A Send of `sgl`, signaled.
    pub fn send(wr_id: u64, sgl: &[Sge]) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::Send,
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// A Send with Invalidate of `sgl`: the peer invalidates `rkey` on receipt.
    pub fn send_inv(wr_id: u64, sgl: &[Sge], rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::SendWithInv { rkey },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// An RDMA Write of `sgl` to `remote_addr` under `rkey`. Its completion
    /// frees the source buffers; it does not say the bytes are placed at the
    /// target (crate docs, "What a completion promises": follow it with a
    /// [`SendWr::flush`] or a Send the target answers).
    pub fn write(wr_id: u64, sgl: &[Sge], remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::RdmaWrite { remote_addr, rkey },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// An RDMA Read of `remote_addr` under `rkey` into `sge`.
    pub fn read(wr_id: u64, sge: Sge, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr::read_sgl(wr_id, &[sge], remote_addr, rkey)
    }
    /// An RDMA Read of `remote_addr` under `rkey` into the concatenation
    /// of `sgl` (at most `DeviceAttr::max_sge_rd` SGEs).
    pub fn read_sgl(wr_id: u64, sgl: &[Sge], remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::RdmaRead { remote_addr, rkey },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// A Send closing the peer's advertised `stag` (see [`WrOp::SendClose`]).
    pub fn send_close(wr_id: u64, sgl: &[Sge], stag: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::SendClose { stag },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// A flush of the peer's region `rkey` (see [`WrOp::Flush`]).
    pub fn flush(wr_id: u64, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::Flush { remote_addr, rkey },
            sgl: Vec::new(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// Fetch-and-add of `add` on the 64-bit value at `remote_addr`; the
    /// original value is written to `result` (8 bytes, local write).
    pub fn fetch_add(wr_id: u64, result: Sge, remote_addr: u64, rkey: Rkey, add: u64) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
            sgl: vec![result],
            flags: SendFlags::SIGNALED,
        }
    }
    /// Compare-and-swap on the 64-bit value at `remote_addr`; the original
    /// value is written to `result` (8 bytes, local write).
    pub fn cmp_swap(
        wr_id: u64,
        result: Sge,
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    ) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
            sgl: vec![result],
            flags: SendFlags::SIGNALED,
        }
    }
    /// RDMA Write with immediate data.
    pub fn write_imm(wr_id: u64, sgl: &[Sge], remote_addr: u64, rkey: Rkey, imm: u32) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// Immediate data alone (RFC 7306 Immediate Data message).
    pub fn send_imm(wr_id: u64, imm: u32) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::SendImm { imm },
            sgl: Vec::new(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// A local invalidate of `stag`.
    pub fn local_inv(wr_id: u64, stag: Rkey) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::LocalInv { stag },
            sgl: Vec::new(),
            flags: SendFlags::SIGNALED,
        }
    }
    /// Builder: replace the flags.
    pub fn flags(mut self, f: SendFlags) -> SendWr {
        self.flags = f;
        self
    }
    /// Builder: make unsignaled.
    pub fn unsignaled(mut self) -> SendWr {
        self.flags = SendFlags(self.flags.0 & !SendFlags::SIGNALED.0);
        self
    }
    /// Builder: add the fence flag.
    pub fn fenced(mut self) -> SendWr {
        self.flags = self.flags | SendFlags::FENCE;
        self
    }
    /// Builder: add the solicited flag.
    pub fn solicited(mut self) -> SendWr {
        self.flags = self.flags | SendFlags::SOLICITED;
        self
    }
    /// Bytes in the SGL.
    pub fn total_len(&self) -> u64 {
        self.sgl.iter().map(|s| s.length as u64).sum()
    }
    /// Whether the operation needs RFC 7306 (atomics, immediate data).
    pub fn needs_rfc7306(&self) -> bool {
        matches!(
            self.op,
            WrOp::AtomicFetchAdd { .. }
                | WrOp::AtomicCmpSwap { .. }
                | WrOp::WriteImm { .. }
                | WrOp::SendImm { .. }
        )
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where the received message is placed (in order, across the SGEs).
    pub sgl: Vec<Sge>,
}

impl RecvWr {
    /// A receive work request into `sgl`.
    pub fn new(wr_id: u64, sgl: &[Sge]) -> RecvWr {
        RecvWr {
            wr_id,
            sgl: sgl.to_vec(),
        }
    }
}

impl SendWr {
    /// Fast-register: bind `fr`'s STag index, under key `key`, to the memory
    /// of `sgl` (SGEs of registered regions), at virtual address `iova`.
    pub fn fast_reg(
        wr_id: u64,
        fr: &crate::FastRegMr,
        key: u8,
        sgl: &[Sge],
        iova: u64,
        access: Access,
    ) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::FastReg {
                index_stag: fr.stag_with_key(key).raw(),
                key,
                iova,
                access,
            },
            sgl: sgl.to_vec(),
            flags: SendFlags::SIGNALED,
        }
    }
}
