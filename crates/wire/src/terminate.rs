//! The RDMAP Terminate message (RFC 5040 section 4.8) and the error codes of
//! RFC 5040 section 7, RFC 5041 section 7 and RFC 5044 section 8 / RFC 6581.
//!
//! After the untagged DDP header (queue 2), a Terminate carries:
//! `Layer (4) | EType (4) | Error Code (8) | M | D | R | reserved (13)`,
//! then, when M or D is set, the DDP segment length (16), then the
//! terminated DDP header when D is set (14 or 18 bytes), then the terminated
//! RDMAP header (the 28-byte Read Request body) when R is set.

use crate::{be16, ddp, WireError};

/// The layer that detected the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    Rdmap = 0,
    Ddp = 1,
    /// The lower layer protocol: MPA over TCP.
    Llp = 2,
}

/// Layer, error type and error code of a Terminate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    pub layer: Layer,
    pub etype: u8,
    pub ecode: u8,
}

impl std::fmt::Display for TermCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} etype {:#x} ecode {:#04x} ({})",
            self.layer,
            self.etype,
            self.ecode,
            codes::describe(*self)
        )
    }
}

/// Named Terminate codes.
pub mod codes {
    use super::{Layer, TermCode};

    const fn c(layer: Layer, etype: u8, ecode: u8) -> TermCode {
        TermCode {
            layer,
            etype,
            ecode,
        }
    }

    // RDMAP (RFC 5040 section 7.2).
    pub const RDMAP_ETYPE_CATASTROPHIC: u8 = 0;
    pub const RDMAP_ETYPE_REMOTE_PROTECTION: u8 = 1;
    pub const RDMAP_ETYPE_REMOTE_OPERATION: u8 = 2;
    pub const RDMAP_LOCAL_CATASTROPHIC: TermCode = c(Layer::Rdmap, 0, 0);
    pub const RDMAP_INVALID_STAG: TermCode = c(Layer::Rdmap, 1, 0x00);
    pub const RDMAP_BASE_BOUNDS: TermCode = c(Layer::Rdmap, 1, 0x01);
    pub const RDMAP_ACCESS_RIGHTS: TermCode = c(Layer::Rdmap, 1, 0x02);
    pub const RDMAP_STAG_NOT_ASSOC: TermCode = c(Layer::Rdmap, 1, 0x03);
    pub const RDMAP_TO_WRAP: TermCode = c(Layer::Rdmap, 1, 0x04);
    pub const RDMAP_CANNOT_INVALIDATE: TermCode = c(Layer::Rdmap, 1, 0x09);
    pub const RDMAP_PROTECTION_UNSPECIFIED: TermCode = c(Layer::Rdmap, 1, 0xFF);
    pub const RDMAP_INVALID_VERSION: TermCode = c(Layer::Rdmap, 2, 0x05);
    pub const RDMAP_UNEXPECTED_OPCODE: TermCode = c(Layer::Rdmap, 2, 0x06);
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode = c(Layer::Rdmap, 2, 0x07);
    pub const RDMAP_CATASTROPHIC_GLOBAL: TermCode = c(Layer::Rdmap, 2, 0x08);
    pub const RDMAP_OP_CANNOT_INVALIDATE: TermCode = c(Layer::Rdmap, 2, 0x09);
    pub const RDMAP_OPERATION_UNSPECIFIED: TermCode = c(Layer::Rdmap, 2, 0xFF);

    // DDP (RFC 5041 section 7).
    pub const DDP_LOCAL_CATASTROPHIC: TermCode = c(Layer::Ddp, 0, 0);
    pub const DDP_TAGGED_INVALID_STAG: TermCode = c(Layer::Ddp, 1, 0x00);
    pub const DDP_TAGGED_BASE_BOUNDS: TermCode = c(Layer::Ddp, 1, 0x01);
    pub const DDP_TAGGED_STAG_NOT_ASSOC: TermCode = c(Layer::Ddp, 1, 0x02);
    pub const DDP_TAGGED_TO_WRAP: TermCode = c(Layer::Ddp, 1, 0x03);
    pub const DDP_TAGGED_INVALID_VERSION: TermCode = c(Layer::Ddp, 1, 0x04);
    pub const DDP_UNTAGGED_INVALID_QN: TermCode = c(Layer::Ddp, 2, 0x01);
    pub const DDP_UNTAGGED_NO_BUFFER: TermCode = c(Layer::Ddp, 2, 0x02);
    pub const DDP_UNTAGGED_MSN_RANGE: TermCode = c(Layer::Ddp, 2, 0x03);
    pub const DDP_UNTAGGED_INVALID_MO: TermCode = c(Layer::Ddp, 2, 0x04);
    pub const DDP_UNTAGGED_TOO_LONG: TermCode = c(Layer::Ddp, 2, 0x05);
    pub const DDP_UNTAGGED_INVALID_VERSION: TermCode = c(Layer::Ddp, 2, 0x06);

    // LLP: MPA (RFC 5044 section 8, RFC 6581 section 8).
    pub const MPA_CRC: TermCode = c(Layer::Llp, 0, 0x02);
    pub const MPA_MARKER: TermCode = c(Layer::Llp, 0, 0x03);
    pub const MPA_INVALID_ULPDU_LENGTH: TermCode = c(Layer::Llp, 0, 0x04);
    pub const MPA_LOCAL_CATASTROPHIC: TermCode = c(Layer::Llp, 0, 0x05);
    pub const MPA_INSUFFICIENT_IRD: TermCode = c(Layer::Llp, 0, 0x06);
    pub const MPA_NO_MATCHING_RTR: TermCode = c(Layer::Llp, 0, 0x07);

    /// A short human description.
    pub fn describe(t: TermCode) -> &'static str {
        match (t.layer, t.etype, t.ecode) {
            (Layer::Rdmap, 0, _) => "local catastrophic",
            (Layer::Rdmap, 1, 0x00) => "invalid STag",
            (Layer::Rdmap, 1, 0x01) => "base or bounds violation",
            (Layer::Rdmap, 1, 0x02) => "access rights violation",
            (Layer::Rdmap, 1, 0x03) => "STag not associated with RDMAP stream",
            (Layer::Rdmap, 1, 0x04) => "TO wrap",
            (Layer::Rdmap, 1, 0x09) | (Layer::Rdmap, 2, 0x09) => "STag cannot be invalidated",
            (Layer::Rdmap, 2, 0x05) => "invalid RDMAP version",
            (Layer::Rdmap, 2, 0x06) => "unexpected opcode",
            (Layer::Rdmap, 2, 0x07) => "catastrophic error localized to RDMAP stream",
            (Layer::Rdmap, 2, 0x08) => "catastrophic error global",
            (Layer::Ddp, 0, _) => "DDP local catastrophic",
            (Layer::Ddp, 1, 0x00) => "DDP tagged: invalid STag",
            (Layer::Ddp, 1, 0x01) => "DDP tagged: base or bounds violation",
            (Layer::Ddp, 1, 0x02) => "DDP tagged: STag not associated with stream",
            (Layer::Ddp, 1, 0x03) => "DDP tagged: TO wrap",
            (Layer::Ddp, 1, 0x04) => "DDP tagged: invalid DDP version",
            (Layer::Ddp, 2, 0x01) => "DDP untagged: invalid queue number",
            (Layer::Ddp, 2, 0x02) => "DDP untagged: invalid MSN, no buffer available",
            (Layer::Ddp, 2, 0x03) => "DDP untagged: invalid MSN, MSN range",
            (Layer::Ddp, 2, 0x04) => "DDP untagged: invalid MO",
            (Layer::Ddp, 2, 0x05) => "DDP untagged: message too long for buffer",
            (Layer::Ddp, 2, 0x06) => "DDP untagged: invalid DDP version",
            (Layer::Llp, _, 0x02) => "MPA CRC error",
            (Layer::Llp, _, 0x03) => "MPA marker error",
            (Layer::Llp, _, 0x04) => "MPA invalid ULPDU length",
            (Layer::Llp, _, 0x05) => "MPA local catastrophic",
            (Layer::Llp, _, 0x06) => "MPA insufficient IRD",
            (Layer::Llp, _, 0x07) => "MPA no matching RTR",
            (_, _, 0xFF) => "unspecified",
            _ => "unknown",
        }
    }
}

/// A Terminate message body (what follows its untagged DDP header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    pub code: TermCode,
    /// Length of the DDP segment that caused the error (M bit).
    pub ddp_seg_len: Option<u16>,
    /// Raw bytes of the terminated DDP header, 14 or 18 bytes (D bit).
    pub ddp_header: Option<Vec<u8>>,
    /// Raw bytes of the terminated RDMAP header (R bit): the Read Request body.
    pub rdmap_header: Option<Vec<u8>>,
}

const FLAG_M: u32 = 1 << 15;
const FLAG_D: u32 = 1 << 14;
const FLAG_R: u32 = 1 << 13;

impl Terminate {
    pub fn new(code: TermCode) -> Terminate {
        Terminate {
            code,
            ddp_seg_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w: u32 = ((self.code.layer as u32) << 28)
            | ((self.code.etype as u32 & 0xF) << 24)
            | ((self.code.ecode as u32) << 16);
        if self.ddp_seg_len.is_some() {
            w |= FLAG_M;
        }
        if self.ddp_header.is_some() {
            w |= FLAG_D;
        }
        if self.rdmap_header.is_some() {
            w |= FLAG_R;
        }
        out.extend_from_slice(&w.to_be_bytes());
        if self.ddp_seg_len.is_some() || self.ddp_header.is_some() {
            out.extend_from_slice(&self.ddp_seg_len.unwrap_or(0).to_be_bytes());
        }
        if let Some(h) = &self.ddp_header {
            out.extend_from_slice(h);
        }
        if let Some(h) = &self.rdmap_header {
            out.extend_from_slice(h);
        }
    }

    pub fn decode(b: &[u8]) -> Result<Terminate, WireError> {
        if b.len() < 4 {
            return Err(WireError::Terminate);
        }
        let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let layer = match w >> 28 {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            _ => return Err(WireError::Terminate),
        };
        let code = TermCode {
            layer,
            etype: ((w >> 24) & 0xF) as u8,
            ecode: ((w >> 16) & 0xFF) as u8,
        };
        let mut t = Terminate::new(code);
        let mut p = 4;
        if w & (FLAG_M | FLAG_D) != 0 {
            if b.len() < p + 2 {
                return Err(WireError::Terminate);
            }
            let len = be16(&b[p..]);
            if w & FLAG_M != 0 {
                t.ddp_seg_len = Some(len);
            }
            p += 2;
        }
        if w & FLAG_D != 0 {
            if b.len() < p + 1 {
                return Err(WireError::Terminate);
            }
            let n = ddp::DdpHeader::len_from_ctrl(b[p]);
            if b.len() < p + n {
                return Err(WireError::Terminate);
            }
            t.ddp_header = Some(b[p..p + n].to_vec());
            p += n;
        }
        if w & FLAG_R != 0 {
            let n = crate::ddp::ReadRequest::LEN;
            if b.len() < p + n {
                return Err(WireError::Terminate);
            }
            t.rdmap_header = Some(b[p..p + n].to_vec());
        }
        Ok(t)
    }
}
