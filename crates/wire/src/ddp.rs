//! DDP (RFC 5041) segment headers with the RDMAP (RFC 5040) control byte and
//! RDMAP header fields.
//!
//! Tagged header (14 bytes, RFC 5041 section 4.2):
//! `DDP ctrl | RDMAP ctrl | STag (32) | TO (64)`.
//! Untagged header (18 bytes, RFC 5041 section 4.3):
//! `DDP ctrl | RDMAP ctrl | RDMAP word (32) | QN (32) | MSN (32) | MO (32)`,
//! where the RDMAP word is the STag to invalidate for Send with Invalidate
//! and 0 otherwise (RFC 5040 section 4.1, Figure 3).
//!
//! The DDP control byte is `T | L | Rsvd (4) | DV (2)` (RFC 5041 section
//! 4.1); the RDMAP control byte that follows it is `RV (2) | Rsv (2) |
//! OpCode (4)` (RFC 5040 section 4.1). Reserved bits are sent as zero and
//! ignored on receive.

use crate::{be32, be64, WireError};

/// DDP control byte: T, the tagged flag (RFC 5041 section 4.1).
pub const DDP_TAGGED: u8 = 0x80;
/// DDP control byte: L, last segment of a message (RFC 5041 section 4.1).
pub const DDP_LAST: u8 = 0x40;
/// DDP control byte: reserved bits (RFC 5041 section 4.1).
pub const DDP_RSVD: u8 = 0x3C;
/// DDP control byte: mask of the 2-bit DDP version field, DV.
pub const DDP_VERSION_MASK: u8 = 0x03;
/// DDP version 1 (DV = 01b, RFC 5041 section 4.1).
pub const DDP_VERSION: u8 = 1;
/// RDMAP version 1 (RV = 01b, the top two bits of the RDMAP control byte,
/// RFC 5040 section 4.1). RFC 5040 also calls RV = 00b (the RDMA
/// Consortium's protocol) valid; like Linux siw, this crate accepts only 1.
pub const RDMAP_VERSION: u8 = 1;
/// RDMAP control byte: mask of the OpCode field (RFC 5040 section 4.1).
pub const RDMAP_OPCODE_MASK: u8 = 0x0F;

/// Length of a tagged DDP header, RDMAP control byte included
/// (RFC 5041 section 4.2).
pub const TAGGED_LEN: usize = 14;
/// Length of an untagged DDP header, RDMAP control byte and Invalidate
/// STag included (RFC 5041 section 4.3).
pub const UNTAGGED_LEN: usize = 18;

/// Untagged queue 0: Send and its variants (RFC 5040 section 4.1, Figure 4).
pub const QN_SEND: u32 = 0;
/// Untagged queue 1: RDMA Read Request (RFC 5040 section 4.1, Figure 4).
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue 2: Terminate (RFC 5040 section 4.1, Figure 4).
pub const QN_TERMINATE: u32 = 2;
/// Untagged queue 3: Atomic Response (RFC 7306). Atomic Requests share
/// queue 1 with RDMA Read Requests, Immediate Data shares queue 0 with
/// Sends.
pub const QN_ATOMIC_RESPONSE: u32 = 3;
/// Length of the Immediate Data an Immediate Data message carries as its
/// whole payload (RFC 7306).
pub const IMMEDIATE_LEN: usize = 8;

/// The Terminate code for a segment whose DDP version is not 1, given its
/// DDP control byte: the tagged or the untagged "invalid DDP version" code
/// after the segment's T bit (RFC 5041 section 7.2).
pub fn invalid_version_code(ddp_ctrl: u8) -> crate::TermCode {
    if ddp_ctrl & DDP_TAGGED != 0 {
        crate::terminate::codes::DDP_TAGGED_INVALID_VERSION
    } else {
        crate::terminate::codes::DDP_UNTAGGED_INVALID_VERSION
    }
}

/// RDMAP opcodes of RFC 5040 (0..=7, section 4.1 Figure 4 and section 4.2
/// Figure 5) and of RFC 7306 (8..=0xB: immediate data and atomics).
///
/// RFC 7306's opcodes are decoded only where the caller says the stream
/// negotiated them ([`DdpHeader::decode_with`]); on any other stream they
/// are "unexpected opcode", as for a peer such as Linux siw, which
/// implements none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// 0000b: RDMA Write, tagged.
    Write = 0,
    /// 0001b: RDMA Read Request, untagged on queue 1, with a 28-byte body.
    ReadRequest = 1,
    /// 0010b: RDMA Read Response, tagged.
    ReadResponse = 2,
    /// 0011b: Send, untagged on queue 0.
    Send = 3,
    /// 0100b: Send with Invalidate, untagged on queue 0.
    SendInvalidate = 4,
    /// 0101b: Send with Solicited Event, untagged on queue 0.
    SendSe = 5,
    /// 0110b: Send with Solicited Event and Invalidate, untagged on queue 0.
    SendSeInvalidate = 6,
    /// 0111b: Terminate, untagged on queue 2.
    Terminate = 7,
    /// 1000b: Immediate Data (RFC 7306), untagged on queue 0; its payload
    /// is exactly [`IMMEDIATE_LEN`] bytes, delivered with the completion.
    ImmediateData = 8,
    /// 1001b: Immediate Data with Solicited Event (RFC 7306).
    ImmediateDataSe = 9,
    /// 1010b: Atomic Request (RFC 7306), untagged on queue 1 with an
    /// [`AtomicRequest`] body.
    AtomicRequest = 0xA,
    /// 1011b: Atomic Response (RFC 7306), untagged on queue 3 with an
    /// [`AtomicResponse`] body.
    AtomicResponse = 0xB,
    /// 1100b (unassigned by RFC 5040 and RFC 7306; softrdma's one-shot
    /// extension, negotiated with `mpa::ext::ONE_SHOT`): a Send, untagged
    /// on queue 0, that advertises the STag in its Invalidate STag field
    /// (the receiver's completion carries it; nothing is invalidated).
    SendAdvertise = 0xC,
    /// 1101b (unassigned; one-shot extension): a Send, untagged on queue
    /// 0, that closes the STag in its Invalidate STag field: the receiver
    /// invalidates it and frees its binding before the completion.
    SendClose = 0xD,
    /// 1110b (unassigned; one-shot extension with `mpa::ext::ONE_SHOT_SE`):
    /// [`Opcode::SendClose`] with Solicited Event, as RFC 5040 pairs Send
    /// (3) with Send with Solicited Event (5).
    SendCloseSe = 0xE,
}

/// Optional opcode sets a stream negotiated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ext {
    /// RFC 7306's Immediate Data and atomics.
    pub rfc7306: bool,
    /// softrdma's one-shot SendAdvertise and SendClose.
    pub one_shot: bool,
    /// The one-shot close with Solicited Event (needs `one_shot` too).
    pub one_shot_se: bool,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Result<Opcode, WireError> {
        Ok(match v {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            other => return Err(WireError::Opcode(other)),
        })
    }

    /// Like [`Opcode::from_u8`], also accepting RFC 7306's opcodes when
    /// `rfc7306` (the stream negotiated them).
    pub fn from_u8_with(v: u8, rfc7306: bool) -> Result<Opcode, WireError> {
        Opcode::from_u8_ext(
            v,
            Ext {
                rfc7306,
                ..Ext::default()
            },
        )
    }

    /// Like [`Opcode::from_u8`], also accepting the opcode sets in `ext`.
    pub fn from_u8_ext(v: u8, ext: Ext) -> Result<Opcode, WireError> {
        Ok(match v {
            8 if ext.rfc7306 => Opcode::ImmediateData,
            9 if ext.rfc7306 => Opcode::ImmediateDataSe,
            0xA if ext.rfc7306 => Opcode::AtomicRequest,
            0xB if ext.rfc7306 => Opcode::AtomicResponse,
            0xC if ext.one_shot => Opcode::SendAdvertise,
            0xD if ext.one_shot => Opcode::SendClose,
            0xE if ext.one_shot && ext.one_shot_se => Opcode::SendCloseSe,
            other => return Opcode::from_u8(other),
        })
    }

    /// Whether this is one of RFC 7306's opcodes.
    pub fn is_rfc7306(self) -> bool {
        (8..=0xB).contains(&(self as u8))
    }

    /// Whether this is one of the one-shot extension's opcodes.
    pub fn is_one_shot(self) -> bool {
        matches!(
            self,
            Opcode::SendAdvertise | Opcode::SendClose | Opcode::SendCloseSe
        )
    }

    /// A one-shot close, with or without Solicited Event.
    pub fn is_close(self) -> bool {
        matches!(self, Opcode::SendClose | Opcode::SendCloseSe)
    }

    /// Immediate Data, with or without Solicited Event.
    pub fn is_immediate(self) -> bool {
        matches!(self, Opcode::ImmediateData | Opcode::ImmediateDataSe)
    }

    /// Whether the opcode travels in tagged DDP segments.
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The untagged queue this opcode uses (None for tagged opcodes).
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::Write | Opcode::ReadResponse => None,
            Opcode::ReadRequest | Opcode::AtomicRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            Opcode::AtomicResponse => Some(QN_ATOMIC_RESPONSE),
            _ => Some(QN_SEND),
        }
    }

    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send
                | Opcode::SendInvalidate
                | Opcode::SendSe
                | Opcode::SendSeInvalidate
                | Opcode::SendAdvertise
                | Opcode::SendClose
                | Opcode::SendCloseSe
        )
    }

    pub fn solicited(self) -> bool {
        matches!(
            self,
            Opcode::SendSe
                | Opcode::SendSeInvalidate
                | Opcode::ImmediateDataSe
                | Opcode::SendCloseSe
        )
    }

    pub fn invalidates(self) -> bool {
        matches!(
            self,
            Opcode::SendInvalidate
                | Opcode::SendSeInvalidate
                | Opcode::SendClose
                | Opcode::SendCloseSe
        )
    }

    fn rdmap_ctrl(self) -> u8 {
        (RDMAP_VERSION << 6) | self as u8
    }
}

/// A tagged segment header (RDMA Write, RDMA Read Response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedHeader {
    pub last: bool,
    pub opcode: Opcode,
    pub stag: u32,
    pub to: u64,
}

/// An untagged segment header (Sends, Read Request, Terminate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UntaggedHeader {
    pub last: bool,
    pub opcode: Opcode,
    /// The STag to invalidate (Send with Invalidate), else 0.
    pub inval_stag: u32,
    pub qn: u32,
    pub msn: u32,
    pub mo: u32,
}

/// Either DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHeader {
    Tagged(TaggedHeader),
    Untagged(UntaggedHeader),
}

impl DdpHeader {
    /// Header length given the first (DDP control) byte.
    #[inline]
    pub fn len_from_ctrl(ddp_ctrl: u8) -> usize {
        if ddp_ctrl & DDP_TAGGED != 0 {
            TAGGED_LEN
        } else {
            UNTAGGED_LEN
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match self {
            DdpHeader::Tagged(_) => TAGGED_LEN,
            DdpHeader::Untagged(_) => UNTAGGED_LEN,
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn opcode(&self) -> Opcode {
        match self {
            DdpHeader::Tagged(h) => h.opcode,
            DdpHeader::Untagged(h) => h.opcode,
        }
    }

    pub fn last(&self) -> bool {
        match self {
            DdpHeader::Tagged(h) => h.last,
            DdpHeader::Untagged(h) => h.last,
        }
    }

    /// Writes the header into `out` (at least [`DdpHeader::len`] bytes) and
    /// returns its length.
    #[inline]
    pub fn encode(&self, out: &mut [u8]) -> usize {
        match self {
            DdpHeader::Tagged(h) => {
                out[0] = DDP_TAGGED | if h.last { DDP_LAST } else { 0 } | DDP_VERSION;
                out[1] = h.opcode.rdmap_ctrl();
                out[2..6].copy_from_slice(&h.stag.to_be_bytes());
                out[6..14].copy_from_slice(&h.to.to_be_bytes());
                TAGGED_LEN
            }
            DdpHeader::Untagged(h) => {
                out[0] = if h.last { DDP_LAST } else { 0 } | DDP_VERSION;
                out[1] = h.opcode.rdmap_ctrl();
                out[2..6].copy_from_slice(&h.inval_stag.to_be_bytes());
                out[6..10].copy_from_slice(&h.qn.to_be_bytes());
                out[10..14].copy_from_slice(&h.msn.to_be_bytes());
                out[14..18].copy_from_slice(&h.mo.to_be_bytes());
                UNTAGGED_LEN
            }
        }
    }

    /// Decodes a header from the start of a ULPDU. Checks the DDP and RDMAP
    /// versions, the opcode (RFC 5040's only), that the opcode matches the
    /// tagged/untagged model, and (for untagged segments) that the queue
    /// number is the one the opcode uses.
    pub fn decode(buf: &[u8]) -> Result<DdpHeader, WireError> {
        Self::decode_with(buf, false)
    }

    /// Like [`DdpHeader::decode`]; with `rfc7306`, RFC 7306's opcodes
    /// (immediate data, atomics) are accepted too.
    pub fn decode_with(buf: &[u8], rfc7306: bool) -> Result<DdpHeader, WireError> {
        Self::decode_ext(
            buf,
            Ext {
                rfc7306,
                ..Ext::default()
            },
        )
    }

    /// Like [`DdpHeader::decode`], accepting the opcode sets in `ext`.
    pub fn decode_ext(buf: &[u8], ext: Ext) -> Result<DdpHeader, WireError> {
        if buf.len() < 2 {
            return Err(WireError::Short(2 - buf.len()));
        }
        let need = Self::len_from_ctrl(buf[0]);
        if buf.len() < need {
            return Err(WireError::Short(need - buf.len()));
        }
        let ctrl = buf[0];
        if ctrl & DDP_VERSION_MASK != DDP_VERSION {
            return Err(WireError::DdpVersion(ctrl & DDP_VERSION_MASK));
        }
        let rctrl = buf[1];
        if rctrl >> 6 != RDMAP_VERSION {
            return Err(WireError::RdmapVersion(rctrl >> 6));
        }
        let opcode = Opcode::from_u8_ext(rctrl & RDMAP_OPCODE_MASK, ext)?;
        let tagged = ctrl & DDP_TAGGED != 0;
        let last = ctrl & DDP_LAST != 0;
        if tagged != opcode.is_tagged() {
            return Err(WireError::OpcodeModel { opcode, tagged });
        }
        if tagged {
            Ok(DdpHeader::Tagged(TaggedHeader {
                last,
                opcode,
                stag: be32(&buf[2..6]),
                to: be64(&buf[6..14]),
            }))
        } else {
            let qn = be32(&buf[6..10]);
            if Some(qn) != opcode.queue() {
                return Err(WireError::QueueNumber(qn));
            }
            Ok(DdpHeader::Untagged(UntaggedHeader {
                last,
                opcode,
                inval_stag: be32(&buf[2..6]),
                qn,
                msn: be32(&buf[10..14]),
                mo: be32(&buf[14..18]),
            }))
        }
    }
}

/// The body of an RDMA Read Request (28 bytes, after the untagged header;
/// RFC 5040 section 4.4, Figure 6): sink STag, sink TO, RDMA Read Message
/// Size, source STag, source TO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequest {
    /// Encoded length (224 bits, RFC 5040 section 4.4).
    pub const LEN: usize = 28;

    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        out[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        out[12..16].copy_from_slice(&self.size.to_be_bytes());
        out[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        out[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        Self::LEN
    }

    pub fn decode(b: &[u8]) -> Result<ReadRequest, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Short(Self::LEN - b.len()));
        }
        Ok(ReadRequest {
            sink_stag: be32(&b[0..4]),
            sink_to: be64(&b[4..12]),
            size: be32(&b[12..16]),
            src_stag: be32(&b[16..20]),
            src_to: be64(&b[20..28]),
        })
    }
}

/// The operation of an Atomic Request (RFC 7306: the low four bits of the
/// request's first word; the other 28 bits are reserved). Every operation
/// carries masks: FetchAdd's Add Mask marks field boundaries (zero: one
/// plain 64-bit add), Swap's and CmpSwap's Swap Mask the bits replaced,
/// CmpSwap's Compare Mask the bits compared (all ones: the plain
/// operations of InfiniBand verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// 0000b: add "Add Data" to the 64-bit value; return the original.
    FetchAdd = 0,
    /// 0001b: replace the bits of "Swap Mask" with those of "Swap Data";
    /// return the original.
    Swap = 1,
    /// 0010b: if the bits of "Compare Mask" equal those of "Compare Data",
    /// swap as [`AtomicOp::Swap`] does; return the original either way.
    CompareSwap = 2,
}

impl AtomicOp {
    pub fn from_u8(v: u8) -> Result<AtomicOp, WireError> {
        Ok(match v {
            0 => AtomicOp::FetchAdd,
            1 => AtomicOp::Swap,
            2 => AtomicOp::CompareSwap,
            other => return Err(WireError::AtomicOp(other)),
        })
    }

    /// The value the target holds after the operation on `orig` (the
    /// arithmetic of RFC 7306's operations; the caller makes it atomic).
    pub fn apply(self, orig: u64, r: &AtomicRequest) -> u64 {
        let swapped = (orig & !r.add_swap_mask) | (r.add_swap & r.add_swap_mask);
        match self {
            AtomicOp::FetchAdd => masked_add(orig, r.add_swap, r.add_swap_mask),
            AtomicOp::Swap => swapped,
            AtomicOp::CompareSwap => {
                if (orig ^ r.compare) & r.compare_mask == 0 {
                    swapped
                } else {
                    orig
                }
            }
        }
    }
}

/// Adds `add` to `orig` bit by bit, dropping the carry out of every bit
/// position set in `mask` (the mask marks the most significant bit of each
/// field, so fields add independently).
fn masked_add(orig: u64, add: u64, mask: u64) -> u64 {
    if mask == 0 {
        return orig.wrapping_add(add);
    }
    let mut out = 0u64;
    let mut carry = 0u64;
    for i in 0..64 {
        let a = (orig >> i) & 1;
        let b = (add >> i) & 1;
        let s = a + b + carry;
        out |= (s & 1) << i;
        carry = if (mask >> i) & 1 == 1 { 0 } else { s >> 1 };
    }
    out
}

/// The body of an Atomic Request (52 bytes after the untagged header,
/// RFC 7306; Wireshark's `iwarp_rdma.atomic.*` fields): operation word,
/// Request Identifier, Remote STag, Remote Tagged Offset, Add-or-Swap Data,
/// Add-or-Swap Mask, Compare Data, Compare Mask. The target is the naturally aligned 64-bit value at the
/// Remote Tagged Offset of the Remote STag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicRequest {
    pub op: AtomicOp,
    /// Chosen by the requester; echoed in the response.
    pub req_id: u32,
    pub stag: u32,
    pub to: u64,
    pub add_swap: u64,
    pub add_swap_mask: u64,
    pub compare: u64,
    pub compare_mask: u64,
}

impl AtomicRequest {
    pub const LEN: usize = 52;

    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&(self.op as u32).to_be_bytes());
        out[4..8].copy_from_slice(&self.req_id.to_be_bytes());
        out[8..12].copy_from_slice(&self.stag.to_be_bytes());
        out[12..20].copy_from_slice(&self.to.to_be_bytes());
        out[20..28].copy_from_slice(&self.add_swap.to_be_bytes());
        out[28..36].copy_from_slice(&self.add_swap_mask.to_be_bytes());
        out[36..44].copy_from_slice(&self.compare.to_be_bytes());
        out[44..52].copy_from_slice(&self.compare_mask.to_be_bytes());
        Self::LEN
    }

    /// Decodes the body; the 28 reserved bits of the first word are
    /// ignored, an operation code above 2 is an error.
    pub fn decode(b: &[u8]) -> Result<AtomicRequest, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Short(Self::LEN - b.len()));
        }
        Ok(AtomicRequest {
            op: AtomicOp::from_u8(b[3] & 0x0F)?,
            req_id: be32(&b[4..8]),
            stag: be32(&b[8..12]),
            to: be64(&b[12..20]),
            add_swap: be64(&b[20..28]),
            add_swap_mask: be64(&b[28..36]),
            compare: be64(&b[36..44]),
            compare_mask: be64(&b[44..52]),
        })
    }
}

/// The body of an Atomic Response (12 bytes after the untagged header,
/// RFC 7306): the request's identifier and the target's original value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicResponse {
    pub req_id: u32,
    pub orig: u64,
}

impl AtomicResponse {
    pub const LEN: usize = 12;

    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[0..4].copy_from_slice(&self.req_id.to_be_bytes());
        out[4..12].copy_from_slice(&self.orig.to_be_bytes());
        Self::LEN
    }

    pub fn decode(b: &[u8]) -> Result<AtomicResponse, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Short(Self::LEN - b.len()));
        }
        Ok(AtomicResponse {
            req_id: be32(&b[0..4]),
            orig: be64(&b[4..12]),
        })
    }
}

#[cfg(test)]
mod atomic_tests {
    use super::*;

    fn req(op: AtomicOp, add_swap: u64, asm: u64, compare: u64, cm: u64) -> AtomicRequest {
        AtomicRequest {
            op,
            req_id: 1,
            stag: 0x100,
            to: 0,
            add_swap,
            add_swap_mask: asm,
            compare,
            compare_mask: cm,
        }
    }

    #[test]
    fn arithmetic() {
        let fa = req(AtomicOp::FetchAdd, 5, 0, 0, 0);
        assert_eq!(AtomicOp::FetchAdd.apply(u64::MAX, &fa), 4);
        // Plain compare-and-swap: full masks.
        let cs = req(AtomicOp::CompareSwap, 9, u64::MAX, 7, u64::MAX);
        assert_eq!(AtomicOp::CompareSwap.apply(7, &cs), 9);
        assert_eq!(AtomicOp::CompareSwap.apply(8, &cs), 8);
        // Two 32-bit fields: the low field wraps without carrying into
        // the high one.
        let m = req(
            AtomicOp::FetchAdd,
            0x0000_0001_0000_0001,
            0x8000_0000_8000_0000,
            0,
            0,
        );
        assert_eq!(
            AtomicOp::FetchAdd.apply(0x0000_0005_FFFF_FFFF, &m),
            0x0000_0006_0000_0000
        );
        // Compare only the low byte, swap only the high byte.
        let mc = req(
            AtomicOp::CompareSwap,
            0xAB00_0000_0000_0000,
            0xFF00_0000_0000_0000,
            0x42,
            0xFF,
        );
        assert_eq!(
            AtomicOp::CompareSwap.apply(0x1234_0000_0000_0042, &mc),
            0xAB34_0000_0000_0042
        );
        assert_eq!(
            AtomicOp::CompareSwap.apply(0x1234_0000_0000_0043, &mc),
            0x1234_0000_0000_0043
        );
        // Swap: unconditional, under its mask.
        let sw = req(AtomicOp::Swap, 0xFFFF, 0x00FF, 0, 0);
        assert_eq!(AtomicOp::Swap.apply(0x1200, &sw), 0x12FF);
    }
}
