//! MPA (RFC 5044) connection set-up frames, with the RFC 6581 revision 2
//! "enhanced" IRD/ORD block, and FPDU framing helpers.
//!
//! Set-up frame layout (RFC 5044 section 7.1.1, RFC 6581 section 6):
//! `key (16) | M C R S Res(4) | Rev (8) | PD_Length (16) | private data`.
//! With revision 2 and the S ("enhanced") bit, the private data starts with
//! the 4-byte IRD/ORD block (RFC 6581 section 9), which is counted in
//! PD_Length.
//!
//! FPDU layout (RFC 5044 section 4.1):
//! `ULPDU_Length (16) | ULPDU | pad to 4 bytes | CRC (32)`. The CRC is
//! CRC32c (RFC 5044 section 4.4, as in iSCSI, RFC 3720) over the length
//! field, the ULPDU and the pad, sent least significant byte first (the
//! byte order of RFC 3720's test vectors, of Linux siw and of Wireshark);
//! the field is present, and zero, when CRC was not negotiated.

use crate::{be16, WireError};

/// Key of an MPA Request frame (RFC 5044 section 7.1.1).
pub const REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame (RFC 5044 section 7.1.1).
pub const REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Fixed part of a set-up frame: key, flags, revision, PD_Length.
pub const HEADER_LEN: usize = 20;
/// Private data is at most 512 bytes, the RFC 6581 block included
/// (RFC 5044 section 7.1.1, RFC 6581 section 7). Linux siw allows 256.
pub const MAX_PRIVATE_DATA: usize = 512;

/// Flags byte (byte 16): M, markers wanted (RFC 5044 section 7.1.1).
pub const FLAG_MARKERS: u8 = 0x80;
/// Flags byte: C, CRC wanted (RFC 5044 section 7.1.1).
pub const FLAG_CRC: u8 = 0x40;
/// Flags byte: R, connection rejected, in a Reply (RFC 5044 section 7.1.1).
pub const FLAG_REJECT: u8 = 0x20;
/// Flags byte: S, private data starts with the enhanced connection
/// establishment block (RFC 6581 section 6).
pub const FLAG_ENHANCED: u8 = 0x10;

/// IRD word: A, peer-to-peer connection model, i.e. an RTR message ends
/// the set-up (RFC 6581 section 9).
pub const IRD_P2P: u16 = 0x8000;
/// IRD word: B, a zero-length Send may serve as RTR (RFC 6581 section 9).
pub const IRD_RTR_SEND: u16 = 0x4000;
/// ORD word: C, a zero-length RDMA Write may serve as RTR
/// (RFC 6581 section 9).
pub const ORD_RTR_WRITE: u16 = 0x8000;
/// ORD word: D, a zero-length RDMA Read may serve as RTR
/// (RFC 6581 section 9).
pub const ORD_RTR_READ: u16 = 0x4000;
/// Low 14 bits of the IRD and ORD words: the 14-bit unsigned value
/// (RFC 6581 section 9); 0x3FFF means "no value given".
pub const IRD_ORD_MASK: u16 = 0x3FFF;

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaKind {
    Request,
    Reply,
}

/// The fixed 20-byte part of a set-up frame, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaHeader {
    pub kind: MpaKind,
    pub markers: bool,
    pub crc: bool,
    pub reject: bool,
    pub enhanced: bool,
    /// The raw flag byte, reserved bits included.
    pub flags: u8,
    pub revision: u8,
    /// Total private data length, the v2 block included.
    pub pd_len: u16,
}

impl MpaHeader {
    /// Decodes the fixed part. `buf` must hold at least [`HEADER_LEN`] bytes.
    pub fn decode(buf: &[u8]) -> Result<MpaHeader, WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Short(HEADER_LEN - buf.len()));
        }
        let kind = if &buf[..16] == REQ_KEY {
            MpaKind::Request
        } else if &buf[..16] == REP_KEY {
            MpaKind::Reply
        } else {
            return Err(WireError::MpaKey);
        };
        let flags = buf[16];
        let revision = buf[17];
        let pd_len = be16(&buf[18..20]);
        if revision == 0 || revision > 2 {
            return Err(WireError::MpaRevision(revision));
        }
        if pd_len as usize > MAX_PRIVATE_DATA {
            return Err(WireError::MpaPrivateDataLength(pd_len as usize));
        }
        Ok(MpaHeader {
            kind,
            markers: flags & FLAG_MARKERS != 0,
            crc: flags & FLAG_CRC != 0,
            reject: flags & FLAG_REJECT != 0,
            enhanced: flags & FLAG_ENHANCED != 0,
            flags,
            revision,
            pd_len,
        })
    }
}

/// The RFC 6581 IRD/ORD block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MpaV2 {
    /// Inbound RDMA Read queue depth offered (0x3FFF = none given).
    pub ird: u16,
    /// Outbound RDMA Read queue depth offered (0x3FFF = none given).
    pub ord: u16,
    pub peer_to_peer: bool,
    pub rtr_send: bool,
    pub rtr_write: bool,
    pub rtr_read: bool,
}

impl MpaV2 {
    pub const LEN: usize = 4;

    pub fn encode(&self) -> [u8; 4] {
        let mut ird = self.ird & IRD_ORD_MASK;
        if self.peer_to_peer {
            ird |= IRD_P2P;
        }
        if self.rtr_send {
            ird |= IRD_RTR_SEND;
        }
        let mut ord = self.ord & IRD_ORD_MASK;
        if self.rtr_write {
            ord |= ORD_RTR_WRITE;
        }
        if self.rtr_read {
            ord |= ORD_RTR_READ;
        }
        let i = ird.to_be_bytes();
        let o = ord.to_be_bytes();
        [i[0], i[1], o[0], o[1]]
    }

    pub fn decode(b: &[u8]) -> Result<MpaV2, WireError> {
        if b.len() < 4 {
            return Err(WireError::MpaV2Block);
        }
        let ird = be16(&b[0..2]);
        let ord = be16(&b[2..4]);
        Ok(MpaV2 {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & IRD_P2P != 0,
            rtr_send: ird & IRD_RTR_SEND != 0,
            rtr_write: ord & ORD_RTR_WRITE != 0,
            rtr_read: ord & ORD_RTR_READ != 0,
        })
    }
}

/// A whole MPA request or reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    pub kind: MpaKind,
    pub markers: bool,
    pub crc: bool,
    pub reject: bool,
    /// 1 or 2.
    pub revision: u8,
    /// Present exactly when revision is 2 and the enhanced bit is set.
    pub v2: Option<MpaV2>,
    /// The user's private data (after the v2 block, if any).
    pub private_data: Vec<u8>,
}

impl MpaFrame {
    /// Encoded length.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.v2.map_or(0, |_| MpaV2::LEN) + self.private_data.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Encodes the frame. Fails if the private data is too long, if the
    /// revision is not 1 or 2, or if a v2 block is given with revision 1
    /// (the enhanced block needs revision 2, RFC 6581 section 6).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let pd_len = self.v2.map_or(0, |_| MpaV2::LEN) + self.private_data.len();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(WireError::MpaPrivateDataLength(pd_len));
        }
        if self.revision == 0 || self.revision > 2 || (self.v2.is_some() && self.revision != 2) {
            return Err(WireError::MpaRevision(self.revision));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + pd_len);
        out.extend_from_slice(match self.kind {
            MpaKind::Request => REQ_KEY,
            MpaKind::Reply => REP_KEY,
        });
        let mut flags = 0u8;
        if self.markers {
            flags |= FLAG_MARKERS;
        }
        if self.crc {
            flags |= FLAG_CRC;
        }
        if self.reject {
            flags |= FLAG_REJECT;
        }
        if self.v2.is_some() {
            flags |= FLAG_ENHANCED;
        }
        out.push(flags);
        out.push(self.revision);
        out.extend_from_slice(&(pd_len as u16).to_be_bytes());
        if let Some(v2) = self.v2 {
            out.extend_from_slice(&v2.encode());
        }
        out.extend_from_slice(&self.private_data);
        Ok(out)
    }

    /// Decodes a frame from its header and its `hdr.pd_len` bytes of
    /// private data.
    pub fn decode(hdr: &MpaHeader, pd: &[u8]) -> Result<MpaFrame, WireError> {
        if pd.len() < hdr.pd_len as usize {
            return Err(WireError::Short(hdr.pd_len as usize - pd.len()));
        }
        let pd = &pd[..hdr.pd_len as usize];
        let (v2, rest) = if hdr.revision == 2 && hdr.enhanced {
            (Some(MpaV2::decode(pd)?), &pd[MpaV2::LEN..])
        } else {
            (None, pd)
        };
        Ok(MpaFrame {
            kind: hdr.kind,
            markers: hdr.markers,
            crc: hdr.crc,
            reject: hdr.reject,
            revision: hdr.revision,
            v2,
            private_data: rest.to_vec(),
        })
    }

    /// Decodes a whole frame held in one buffer; returns it and the bytes used.
    pub fn decode_all(buf: &[u8]) -> Result<(MpaFrame, usize), WireError> {
        let hdr = MpaHeader::decode(buf)?;
        let total = HEADER_LEN + hdr.pd_len as usize;
        if buf.len() < total {
            return Err(WireError::Short(total - buf.len()));
        }
        Ok((MpaFrame::decode(&hdr, &buf[HEADER_LEN..total])?, total))
    }
}

/// Pad bytes after a ULPDU of `ulpdu_len` bytes, so that
/// `2 + ulpdu_len + pad` is a multiple of 4.
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ulpdu_len.wrapping_add(2) & 3)) & 3
}

/// Whole FPDU length on the wire: length field, ULPDU, pad and CRC.
#[inline]
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    2 + ulpdu_len + pad_len(ulpdu_len) + 4
}

/// Largest ULPDU that fits in an FPDU of at most `max_fpdu` bytes (the
/// MULPDU for a given maximum FPDU size, RFC 5044 section 4.1). The answer
/// always needs no pad (`2 + ulpdu` is a multiple of 4), and is capped at
/// 65534, the largest such length the 16-bit ULPDU_Length allows. Below 8
/// bytes nothing fits and the answer is 0.
#[inline]
pub const fn max_ulpdu_for(max_fpdu: usize) -> usize {
    // 2 + ulpdu + pad + 4 <= max_fpdu; the largest such ulpdu has pad 0.
    if max_fpdu < 8 {
        return 0;
    }
    let room = max_fpdu - 6;
    let ulpdu = room - ((room + 2) & 3);
    if ulpdu > 0xFFFF {
        0xFFFF - ((0xFFFF + 2) & 3)
    } else {
        ulpdu
    }
}

/// Running CRC32c over an FPDU: start with [`crc_start`], feed every byte of
/// the length field and the ULPDU, then [`trailer`] adds the pad.
#[inline]
pub fn crc_start() -> u32 {
    0
}

#[inline]
pub fn crc_update(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The bytes that follow a ULPDU: zero pad plus the CRC field. The CRC is
/// finished over the pad when `crc` is `Some(running)`, else the field is 0.
/// Returns the buffer and how many of its bytes to send.
#[inline]
pub fn trailer(ulpdu_len: usize, crc: Option<u32>) -> ([u8; 7], usize) {
    let pad = pad_len(ulpdu_len);
    let mut out = [0u8; 7];
    let field = match crc {
        Some(c) => crc32c::crc32c_append(c, &out[..pad]),
        None => 0,
    };
    out[pad..pad + 4].copy_from_slice(&field.to_le_bytes());
    (out, pad + 4)
}

/// Encodes a whole FPDU around `ulpdu` (for tests, control messages and
/// small frames; the engine's send path builds FPDUs with scatter-gather).
pub fn encode_fpdu(ulpdu: &[u8], with_crc: bool, out: &mut Vec<u8>) {
    assert!(ulpdu.len() <= 0xFFFF, "ULPDU longer than 65535 bytes");
    let start = out.len();
    out.extend_from_slice(&(ulpdu.len() as u16).to_be_bytes());
    out.extend_from_slice(ulpdu);
    let crc = with_crc.then(|| crc_update(crc_start(), &out[start..]));
    let (t, n) = trailer(ulpdu.len(), crc);
    out.extend_from_slice(&t[..n]);
}

/// Checks one whole FPDU held in `buf`: returns the ULPDU and the bytes used.
/// The CRC is checked when `with_crc`.
pub fn decode_fpdu(buf: &[u8], with_crc: bool) -> Result<(&[u8], usize), FpduError> {
    if buf.len() < 2 {
        return Err(FpduError::Short(2 - buf.len()));
    }
    let len = be16(buf) as usize;
    let total = fpdu_len(len);
    if buf.len() < total {
        return Err(FpduError::Short(total - buf.len()));
    }
    if with_crc {
        let body = 2 + len + pad_len(len);
        let want = crc32c::crc32c(&buf[..body]);
        let got = u32::from_le_bytes(buf[body..body + 4].try_into().unwrap());
        if want != got {
            return Err(FpduError::Crc { want, got });
        }
    }
    Ok((&buf[2..2 + len], total))
}

/// FPDU framing failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FpduError {
    #[error("need {0} more bytes")]
    Short(usize),
    #[error("CRC mismatch: computed {want:#010x}, received {got:#010x}")]
    Crc { want: u32, got: u32 },
}

impl FpduError {
    /// The Terminate code for this failure: a CRC mismatch is the MPA CRC
    /// error (2/0/0x02, RFC 5044 section 8). A short buffer only means
    /// "read more"; if the stream ends there, the connection is lost
    /// (2/0/0x01).
    pub fn term_code(&self) -> crate::TermCode {
        use crate::terminate::codes::{MPA_CRC, MPA_TCP_LOST};
        match self {
            FpduError::Short(_) => MPA_TCP_LOST,
            FpduError::Crc { .. } => MPA_CRC,
        }
    }
}

/// softrdma's connection extensions, offered at the start of the MPA
/// private data (after the v2 IRD/ORD block, before the application's
/// bytes). Only an initiator that knows its peer is softrdma offers them;
/// a softrdma responder strips the block before the application sees the
/// private data and answers with its own block listing what both support.
/// Peers such as Linux siw never see one (they are never offered one) and
/// never send one.
///
/// Layout (8 bytes): magic `SRDX`, version (1), flags, two reserved zero
/// bytes; with [`SAME_HOST`] set, a [`SameHost`] record of
/// [`SAME_HOST_LEN`] bytes follows. See `docs/extensions.md`.
pub mod ext {
    /// The block's first four bytes.
    pub const MAGIC: &[u8; 4] = b"SRDX";
    pub const VERSION: u8 = 1;
    pub const LEN: usize = 8;
    /// FPDUs need not be aligned to TCP segments: the sender may write
    /// FPDUs back to back in large batches (like siw's GSO experiment, but
    /// negotiated here rather than in reserved MPA header bits).
    pub const LARGE_SEGMENTS: u8 = 0x01;
    /// RFC 7306: atomics (Atomic Request / Response) and Immediate Data.
    /// RFC 7306 leaves their negotiation to the ULP; siw implements none of
    /// them, so only peers that agree to this flag ever see those opcodes.
    pub const RFC7306: u8 = 0x02;
    /// Both ends run on one host: each describes itself in a [`SameHost`]
    /// record, and may then reach the other's registered memory without
    /// the TCP stream (`docs/same-host.md`).
    pub const SAME_HOST: u8 = 0x04;
    /// One-shot operations (`docs/one-shot.md`): the unassigned RDMAP
    /// opcodes 0xC (Send advertising an STag) and 0xD (Send closing one).
    pub const ONE_SHOT: u8 = 0x08;
    /// The one-shot close with Solicited Event (`docs/one-shot.md`): RDMAP
    /// opcode 0xE. Meaningful only with [`ONE_SHOT`]; a peer that agreed
    /// to `ONE_SHOT` alone gets a solicited close as a standard Send with
    /// Solicited Event and Invalidate (opcode 6), which it also takes for
    /// a close.
    pub const ONE_SHOT_SE: u8 = 0x10;
    /// Flags this implementation understands.
    pub const KNOWN: u8 = LARGE_SEGMENTS | RFC7306 | SAME_HOST | ONE_SHOT | ONE_SHOT_SE;
    /// Length of the [`SameHost`] record.
    pub const SAME_HOST_LEN: usize = 56;

    /// Who an end is, for a peer on the same host: enough to find (and
    /// verify) its shared segment, which publishes its STag table.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SameHost {
        /// `/proc/sys/kernel/random/boot_id`: same kernel instance.
        pub boot_id: [u8; 16],
        /// The inode of `/proc/self/ns/pid`: pids mean the same thing.
        pub pid_ns: u64,
        /// The inode of `/proc/self/ns/net`: ends in different network
        /// namespaces (containers, or hosts modelled with namespaces) are
        /// different hosts to the transport, so a partition of their
        /// network is one of their connection too.
        pub net_ns: u64,
        pub pid: u32,
        /// The descriptor of the shared segment in that process.
        pub seg_fd: u32,
        /// Written in the segment's header: proves the right segment.
        pub nonce: u64,
        /// The protection domain of the end's QP.
        pub pd: u32,
        /// The slot of the end's segment reserved for this connection's
        /// accesses by the other end.
        pub slot: u32,
    }

    impl SameHost {
        pub fn encode(&self) -> [u8; SAME_HOST_LEN] {
            let mut b = [0u8; SAME_HOST_LEN];
            b[0..16].copy_from_slice(&self.boot_id);
            b[16..24].copy_from_slice(&self.pid_ns.to_be_bytes());
            b[24..32].copy_from_slice(&self.net_ns.to_be_bytes());
            b[32..36].copy_from_slice(&self.pid.to_be_bytes());
            b[36..40].copy_from_slice(&self.seg_fd.to_be_bytes());
            b[40..48].copy_from_slice(&self.nonce.to_be_bytes());
            b[48..52].copy_from_slice(&self.pd.to_be_bytes());
            b[52..56].copy_from_slice(&self.slot.to_be_bytes());
            b
        }

        pub fn decode(b: &[u8]) -> Option<SameHost> {
            if b.len() < SAME_HOST_LEN {
                return None;
            }
            Some(SameHost {
                boot_id: b[0..16].try_into().unwrap(),
                pid_ns: crate::be64(&b[16..24]),
                net_ns: crate::be64(&b[24..32]),
                pid: crate::be32(&b[32..36]),
                seg_fd: crate::be32(&b[36..40]),
                nonce: crate::be64(&b[40..48]),
                pd: crate::be32(&b[48..52]),
                slot: crate::be32(&b[52..56]),
            })
        }
    }

    /// The block for `flags`.
    pub fn encode(flags: u8) -> [u8; LEN] {
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, flags, 0, 0]
    }

    /// The block for `flags` (without [`SAME_HOST`]) or for `flags` plus
    /// [`SAME_HOST`] and `same_host`'s record.
    pub fn encode_with(flags: u8, same_host: Option<&SameHost>) -> Vec<u8> {
        match same_host {
            Some(r) => {
                let mut v = encode(flags | SAME_HOST).to_vec();
                v.extend_from_slice(&r.encode());
                v
            }
            None => encode(flags & !SAME_HOST).to_vec(),
        }
    }

    /// Splits private data into (offered flags, the application's bytes).
    /// Without a well-formed block the flags are `None` and the data is
    /// returned whole. Unknown flag bits are dropped; a [`SAME_HOST`]
    /// record is skipped (see [`parse`]).
    pub fn strip(pd: &[u8]) -> (Option<u8>, &[u8]) {
        let (flags, _, rest) = parse(pd);
        (flags, rest)
    }

    /// Like [`strip`], also returning the [`SameHost`] record. A block
    /// that sets [`SAME_HOST`] without a whole record is not a block.
    pub fn parse(pd: &[u8]) -> (Option<u8>, Option<SameHost>, &[u8]) {
        if pd.len() < LEN || &pd[..4] != MAGIC || pd[4] != VERSION || pd[6..8] != [0, 0] {
            return (None, None, pd);
        }
        let flags = pd[5] & KNOWN;
        if flags & SAME_HOST == 0 {
            return (Some(flags), None, &pd[LEN..]);
        }
        match SameHost::decode(&pd[LEN..]) {
            Some(r) => (Some(flags), Some(r), &pd[LEN + SAME_HOST_LEN..]),
            None => (None, None, pd),
        }
    }
}
