//! The RDMAP Terminate message (RFC 5040 section 4.8) and the error codes of
//! RFC 5040 section 4.8 (Figure 9) / section 7, RFC 5041 section 7.2 and
//! RFC 5044 section 8 / RFC 6581 section 8.
//!
//! A Terminate is an untagged DDP message on queue 2 (RFC 5040 section 4.1,
//! Figure 4).
//! After its untagged DDP header the body is, in network byte order
//! (RFC 5040 section 4.8, Figures 7 and 8):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! | Layer | EType |  Error Code   |M|D|R|       Reserved (13)     |
//! |  DDP Segment Length (D set)   |  Terminated DDP Header (D set)
//! ~  14 bytes (tagged) or 18 bytes (untagged)                     ~
//! ~  Terminated RDMA Header (R set): the 28-byte Read Request body ~
//! ```
//!
//! * `M` (bit 16, mask `0x0000_8000` of the word): the DDP Segment Length
//!   is valid.
//! * `D` (bit 17, `0x0000_4000`): the DDP Segment Length field and the
//!   terminated DDP header are present. The length field "MUST be present
//!   when the D bit is set" and exists only then; this is also how
//!   Wireshark's `iwarp_ddp_rdmap` dissector reads it.
//! * `R` (bit 18, `0x0000_2000`): the terminated RDMA header (only ever a
//!   Read Request's) is present.
//!
//! # Linux siw
//!
//! Linux siw (`drivers/infiniband/sw/siw`) attaches what follows the control
//! word exactly as above: the copy of the offending frame starts at its MPA
//! length slot, which siw overwrites with the DDP segment length, followed
//! by the DDP header and (Read Request) the RDMAP header; it sets M and D
//! together, and for a remote protection error on a Send with Invalidate it
//! sets R without attaching an RDMAP header, which [`Terminate::decode`]
//! accepts.
//!
//! siw declares the control word as C bit-fields, and on little-endian
//! hosts (x86-64, arm64) those land in different bits from the RFC's: the
//! first byte carries `EType << 4 | Layer` (nibbles swapped) and M/D/R are
//! the bits `0x01`/`0x02`/`0x04` of the third byte. siw reads incoming
//! Terminates with the same layout. This crate encodes and decodes the RFC
//! layout (what Wireshark decodes and what other iWARP stacks send);
//! [`Terminate::decode_siw_le`], [`siw_le_to_rfc`] and [`rfc_to_siw_le`]
//! convert, and [`Terminate::decode_guess_layout`] reads a peer that may
//! be siw (the engine uses it for peers that are not softrdma: the code a
//! Terminate carries decides the status of the work request it fails).

use crate::{be16, ddp, WireError};

/// The layer that detected the error (RFC 5040 section 4.8, Figure 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// 0x0: RDMAP (RFC 5040).
    Rdmap = 0,
    /// 0x1: DDP (RFC 5041).
    Ddp = 1,
    /// 0x2: the lower layer protocol: MPA over TCP (RFC 5044).
    Llp = 2,
}

impl Layer {
    /// The layer for a 4-bit Layer field value, if it is one of the three
    /// that RFC 5040 defines.
    pub fn from_u8(v: u8) -> Option<Layer> {
        match v {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }
}

/// Layer, error type and error code of a Terminate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    pub layer: Layer,
    /// 4 bits.
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

/// Named Terminate codes. Each is `(Layer, EType, Error Code)`; they agree
/// with the IANA "Remote Direct Data Placement (RDDP)" error registries
/// (RFC 6580), Linux siw's `enum rdmap_ecode`/`ddp_ecode`/`llp_ecode` and
/// Wireshark's value tables.
pub mod codes {
    use super::{Layer, TermCode};

    const fn c(layer: Layer, etype: u8, ecode: u8) -> TermCode {
        TermCode {
            layer,
            etype,
            ecode,
        }
    }

    // ---- RDMAP: RFC 5040 section 4.8, Figure 9; section 7. ----

    /// RDMAP error type 0x0, Local Catastrophic Error (RFC 5040 Figure 9).
    pub const RDMAP_ETYPE_CATASTROPHIC: u8 = 0;
    /// RDMAP error type 0x1, Remote Protection Error (RFC 5040 Figure 9).
    pub const RDMAP_ETYPE_REMOTE_PROTECTION: u8 = 1;
    /// RDMAP error type 0x2, Remote Operation Error (RFC 5040 Figure 9).
    pub const RDMAP_ETYPE_REMOTE_OPERATION: u8 = 2;

    /// 0/0/any: local catastrophic error; the error code has no meaning
    /// (RFC 5040 Figure 9: "Any value in this field is acceptable").
    pub const RDMAP_LOCAL_CATASTROPHIC: TermCode = c(Layer::Rdmap, 0, 0);
    /// 0/1/0x00: remote protection error, invalid STag (RFC 5040 Figure 9).
    pub const RDMAP_INVALID_STAG: TermCode = c(Layer::Rdmap, 1, 0x00);
    /// 0/1/0x01: base or bounds violation (RFC 5040 Figure 9).
    pub const RDMAP_BASE_BOUNDS: TermCode = c(Layer::Rdmap, 1, 0x01);
    /// 0/1/0x02: access rights violation (RFC 5040 Figure 9).
    pub const RDMAP_ACCESS_RIGHTS: TermCode = c(Layer::Rdmap, 1, 0x02);
    /// 0/1/0x03: STag not associated with RDMAP Stream (RFC 5040 Figure 9).
    pub const RDMAP_STAG_NOT_ASSOC: TermCode = c(Layer::Rdmap, 1, 0x03);
    /// 0/1/0x04: TO wrap (RFC 5040 Figure 9).
    pub const RDMAP_TO_WRAP: TermCode = c(Layer::Rdmap, 1, 0x04);
    /// 0/1/0x09: STag cannot be invalidated, as a protection error
    /// (RFC 5040 Figure 9).
    pub const RDMAP_CANNOT_INVALIDATE: TermCode = c(Layer::Rdmap, 1, 0x09);
    /// 0/1/0xFF: unspecified protection error (RFC 5040 Figure 9).
    pub const RDMAP_PROTECTION_UNSPECIFIED: TermCode = c(Layer::Rdmap, 1, 0xFF);
    /// 0/2/0x05: remote operation error, invalid RDMAP version
    /// (RFC 5040 Figure 9).
    pub const RDMAP_INVALID_VERSION: TermCode = c(Layer::Rdmap, 2, 0x05);
    /// 0/2/0x06: unexpected OpCode (RFC 5040 Figure 9).
    pub const RDMAP_UNEXPECTED_OPCODE: TermCode = c(Layer::Rdmap, 2, 0x06);
    /// 0/2/0x07: catastrophic error, localized to RDMAP Stream
    /// (RFC 5040 Figure 9).
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode = c(Layer::Rdmap, 2, 0x07);
    /// 0/2/0x08: catastrophic error, global (RFC 5040 Figure 9).
    pub const RDMAP_CATASTROPHIC_GLOBAL: TermCode = c(Layer::Rdmap, 2, 0x08);
    /// 0/2/0x09: STag cannot be invalidated, as an operation error
    /// (RFC 5040 Figure 9).
    pub const RDMAP_OP_CANNOT_INVALIDATE: TermCode = c(Layer::Rdmap, 2, 0x09);
    /// 0/2/0xFF: unspecified operation error (RFC 5040 Figure 9).
    pub const RDMAP_OPERATION_UNSPECIFIED: TermCode = c(Layer::Rdmap, 2, 0xFF);

    // ---- DDP: RFC 5041 section 7.2 ("DDP Error Numbers"). ----

    /// DDP error type 0x0, local catastrophic (RFC 5041 section 7.2).
    pub const DDP_ETYPE_CATASTROPHIC: u8 = 0;
    /// DDP error type 0x1, tagged buffer error (RFC 5041 section 7.2).
    pub const DDP_ETYPE_TAGGED: u8 = 1;
    /// DDP error type 0x2, untagged buffer error (RFC 5041 section 7.2).
    pub const DDP_ETYPE_UNTAGGED: u8 = 2;

    /// 1/0/0x00: DDP local catastrophic (RFC 5041 section 7.2).
    pub const DDP_LOCAL_CATASTROPHIC: TermCode = c(Layer::Ddp, 0, 0);
    /// 1/1/0x00: tagged buffer, invalid STag (RFC 5041 section 7.2).
    pub const DDP_TAGGED_INVALID_STAG: TermCode = c(Layer::Ddp, 1, 0x00);
    /// 1/1/0x01: tagged buffer, base or bounds violation
    /// (RFC 5041 section 7.2).
    pub const DDP_TAGGED_BASE_BOUNDS: TermCode = c(Layer::Ddp, 1, 0x01);
    /// 1/1/0x02: tagged buffer, STag not associated with DDP Stream
    /// (RFC 5041 section 7.2).
    pub const DDP_TAGGED_STAG_NOT_ASSOC: TermCode = c(Layer::Ddp, 1, 0x02);
    /// 1/1/0x03: tagged buffer, TO wrap (RFC 5041 section 7.2).
    pub const DDP_TAGGED_TO_WRAP: TermCode = c(Layer::Ddp, 1, 0x03);
    /// 1/1/0x04: tagged segment with an invalid DDP version
    /// (RFC 5041 section 7.2).
    pub const DDP_TAGGED_INVALID_VERSION: TermCode = c(Layer::Ddp, 1, 0x04);
    /// 1/2/0x01: untagged buffer, invalid QN (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_INVALID_QN: TermCode = c(Layer::Ddp, 2, 0x01);
    /// 1/2/0x02: invalid MSN, no buffer available (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_NO_BUFFER: TermCode = c(Layer::Ddp, 2, 0x02);
    /// 1/2/0x03: invalid MSN, MSN range is not valid
    /// (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_MSN_RANGE: TermCode = c(Layer::Ddp, 2, 0x03);
    /// 1/2/0x04: invalid MO (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_INVALID_MO: TermCode = c(Layer::Ddp, 2, 0x04);
    /// 1/2/0x05: DDP message too long for available buffer
    /// (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_TOO_LONG: TermCode = c(Layer::Ddp, 2, 0x05);
    /// 1/2/0x06: untagged segment with an invalid DDP version
    /// (RFC 5041 section 7.2).
    pub const DDP_UNTAGGED_INVALID_VERSION: TermCode = c(Layer::Ddp, 2, 0x06);

    // ---- LLP = MPA: RFC 5044 section 8 (codes 1-4, numbered by RFC 6580)
    // and RFC 6581 section 8 (codes 5-7); error type 0x0 = MPA. ----

    /// LLP error type 0x0, MPA (RFC 6581 section 8).
    pub const LLP_ETYPE_MPA: u8 = 0;

    /// 2/0/0x01: TCP connection closed, terminated or lost (RFC 5044
    /// section 8). Reported locally; there is no stream left to send it on.
    pub const MPA_TCP_LOST: TermCode = c(Layer::Llp, 0, 0x01);
    /// 2/0/0x02: received MPA CRC does not match (RFC 5044 section 8).
    pub const MPA_CRC: TermCode = c(Layer::Llp, 0, 0x02);
    /// 2/0/0x03: MPA Marker and ULPDU Length field disagree on the start
    /// of an FPDU (RFC 5044 section 8).
    pub const MPA_MARKER: TermCode = c(Layer::Llp, 0, 0x03);
    /// 2/0/0x04: invalid MPA Request or Reply frame (RFC 5044 section 8).
    pub const MPA_INVALID_REQ_REP: TermCode = c(Layer::Llp, 0, 0x04);
    /// The same code as [`MPA_INVALID_REQ_REP`] (2/0/0x04), under its old,
    /// misleading name: code 0x04 means "Invalid MPA Request Frame or MPA
    /// Response Frame" (RFC 5044 section 8), not a ULPDU length error.
    pub const MPA_INVALID_ULPDU_LENGTH: TermCode = MPA_INVALID_REQ_REP;
    /// 2/0/0x05: local catastrophic error (RFC 6581 section 8).
    pub const MPA_LOCAL_CATASTROPHIC: TermCode = c(Layer::Llp, 0, 0x05);
    /// 2/0/0x06: insufficient IRD resources (RFC 6581 section 8).
    pub const MPA_INSUFFICIENT_IRD: TermCode = c(Layer::Llp, 0, 0x06);
    /// 2/0/0x07: no matching RTR option (RFC 6581 section 8).
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
            (Layer::Llp, 0, 0x01) => "TCP connection closed, terminated or lost",
            (Layer::Llp, 0, 0x02) => "MPA CRC error",
            (Layer::Llp, 0, 0x03) => "MPA marker and ULPDU length mismatch",
            (Layer::Llp, 0, 0x04) => "invalid MPA request or reply frame",
            (Layer::Llp, 0, 0x05) => "MPA local catastrophic",
            (Layer::Llp, 0, 0x06) => "MPA insufficient IRD resources",
            (Layer::Llp, 0, 0x07) => "MPA no matching RTR option",
            (_, _, 0xFF) => "unspecified",
            _ => "unknown",
        }
    }
}

/// A Terminate message body (what follows its untagged DDP header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    pub code: TermCode,
    /// Length of the DDP segment that caused the error (M bit: valid).
    /// The field is on the wire only together with the terminated DDP
    /// header (D bit, RFC 5040 section 4.8), so it is sent only when
    /// `ddp_header` is `Some`; without it, this is dropped on encode.
    pub ddp_seg_len: Option<u16>,
    /// Raw bytes of the terminated DDP header (D bit): 14 bytes when its T
    /// bit is set, else 18. Its first byte tells the receiver its length.
    pub ddp_header: Option<Vec<u8>>,
    /// Raw bytes of the terminated RDMAP header (R bit): the 28-byte Read
    /// Request body ([`ddp::ReadRequest::LEN`]).
    pub rdmap_header: Option<Vec<u8>>,
}

/// Terminate control word, as a big-endian `u32`: M, "DDP Segment Length
/// valid" (RFC 5040 section 4.8, bit 16).
pub const HDRCT_M: u32 = 1 << 15;
/// Terminate control word: D, "DDP Header Included" (bit 17). The DDP
/// Segment Length field is present exactly when D is set.
pub const HDRCT_D: u32 = 1 << 14;
/// Terminate control word: R, "RDMAP Header Included" (bit 18).
pub const HDRCT_R: u32 = 1 << 13;

/// Length of the DDP Segment Length field.
const SEG_LEN_LEN: usize = 2;

impl Terminate {
    pub fn new(code: TermCode) -> Terminate {
        Terminate {
            code,
            ddp_seg_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// The untagged DDP header that carries a Terminate: last segment,
    /// queue 2, MO 0, and `msn` (1 for the first Terminate on a stream,
    /// which is what Linux siw expects and sends).
    pub fn ddp_header_for(msn: u32) -> ddp::DdpHeader {
        ddp::DdpHeader::Untagged(ddp::UntaggedHeader {
            last: true,
            opcode: ddp::Opcode::Terminate,
            inval_stag: 0,
            qn: ddp::QN_TERMINATE,
            msn,
            mo: 0,
        })
    }

    /// The 32-bit Terminate control word as sent (RFC layout), reserved
    /// bits zero.
    pub fn control_word(&self) -> u32 {
        let mut w: u32 = ((self.code.layer as u32) << 28)
            | ((self.code.etype as u32 & 0xF) << 24)
            | ((self.code.ecode as u32) << 16);
        if self.ddp_header.is_some() {
            w |= HDRCT_D;
            if self.ddp_seg_len.is_some() {
                w |= HDRCT_M;
            }
        }
        if self.rdmap_header.is_some() {
            w |= HDRCT_R;
        }
        w
    }

    /// Number of bytes [`Terminate::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        4 + self
            .ddp_header
            .as_ref()
            .map_or(0, |h| SEG_LEN_LEN + h.len())
            + self.rdmap_header.as_ref().map_or(0, |h| h.len())
    }

    /// Appends the encoded body to `out`: the control word, then, with a
    /// DDP header, the DDP Segment Length (0 when unknown, M clear) and the
    /// header, then the RDMAP header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(&self.control_word().to_be_bytes());
        if let Some(h) = &self.ddp_header {
            out.extend_from_slice(&self.ddp_seg_len.unwrap_or(0).to_be_bytes());
            out.extend_from_slice(h);
        }
        if let Some(h) = &self.rdmap_header {
            out.extend_from_slice(h);
        }
    }

    /// Decodes a Terminate body laid out as RFC 5040 section 4.8 says.
    ///
    /// Reserved bits are ignored. M without D is ignored (there is no
    /// length field without D). R with fewer than 28 bytes left is accepted
    /// as "no RDMAP header" when the terminated DDP header is present and is
    /// not a Read Request's: Linux siw sends that for a Send with
    /// Invalidate. Bytes after the message are ignored.
    pub fn decode(b: &[u8]) -> Result<Terminate, WireError> {
        if b.len() < 4 {
            return Err(WireError::Terminate);
        }
        let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let layer = Layer::from_u8((w >> 28) as u8).ok_or(WireError::Terminate)?;
        let code = TermCode {
            layer,
            etype: ((w >> 24) & 0xF) as u8,
            ecode: ((w >> 16) & 0xFF) as u8,
        };
        let mut t = Terminate::new(code);
        let mut p = 4;
        if w & HDRCT_D != 0 {
            if b.len() < p + SEG_LEN_LEN + 1 {
                return Err(WireError::Terminate);
            }
            let len = be16(&b[p..]);
            if w & HDRCT_M != 0 {
                t.ddp_seg_len = Some(len);
            }
            p += SEG_LEN_LEN;
            let n = ddp::DdpHeader::len_from_ctrl(b[p]);
            if b.len() < p + n {
                return Err(WireError::Terminate);
            }
            t.ddp_header = Some(b[p..p + n].to_vec());
            p += n;
        }
        if w & HDRCT_R != 0 {
            let n = ddp::ReadRequest::LEN;
            if b.len() >= p + n {
                t.rdmap_header = Some(b[p..p + n].to_vec());
            } else {
                let not_rreq = t
                    .ddp_header
                    .as_ref()
                    .is_some_and(|h| h[1] & 0x0F != ddp::Opcode::ReadRequest as u8);
                if !not_rreq {
                    return Err(WireError::Terminate);
                }
            }
        }
        Ok(t)
    }

    /// Decodes a Terminate body sent by Linux siw on a little-endian host,
    /// whose control word has siw's bit-field layout (see the module
    /// documentation); the rest is read as by [`Terminate::decode`].
    pub fn decode_siw_le(b: &[u8]) -> Result<Terminate, WireError> {
        if b.len() < 4 {
            return Err(WireError::Terminate);
        }
        let mut v = b.to_vec();
        let w = siw_le_to_rfc([b[0], b[1], b[2], b[3]]);
        v[..4].copy_from_slice(&w);
        Terminate::decode(&v)
    }

    /// Decodes a Terminate body from a peer that may write either layout
    /// (the RFC's, or Linux siw's little-endian bit-fields): the layout is
    /// guessed from the control word by [`looks_like_siw_le`].
    pub fn decode_guess_layout(b: &[u8]) -> Result<Terminate, WireError> {
        if b.len() >= 4 && looks_like_siw_le([b[0], b[1], b[2], b[3]]) {
            Terminate::decode_siw_le(b)
        } else {
            Terminate::decode(b)
        }
    }

    /// The terminated DDP header, decoded, if one is attached.
    pub fn parsed_ddp_header(&self) -> Option<Result<ddp::DdpHeader, WireError>> {
        self.ddp_header.as_deref().map(ddp::DdpHeader::decode)
    }

    /// The terminated RDMAP header (a Read Request body), decoded, if one
    /// is attached.
    pub fn parsed_rdmap_header(&self) -> Option<Result<ddp::ReadRequest, WireError>> {
        self.rdmap_header.as_deref().map(ddp::ReadRequest::decode)
    }
}

/// Whether a Terminate control word is more likely in Linux siw's
/// little-endian layout than in the RFC's. The flags M/D/R sit in bits
/// `0xE0` of the third byte in the RFC layout and in bits `0x07` in siw's
/// (and a Terminate that carries headers sets them); with no flags, the
/// Layer (0 to 2) is the low nibble of the first byte in siw's layout and
/// the high one in the RFC's; when both read as a layer, siw wins (the
/// peers this is used for are not softrdma).
pub fn looks_like_siw_le(word: [u8; 4]) -> bool {
    let flags = word[2];
    if flags & 0x07 != 0 && flags & 0xE0 == 0 {
        return true;
    }
    if flags & 0xE0 != 0 && flags & 0x07 == 0 {
        return false;
    }
    let (hi, lo) = (word[0] >> 4, word[0] & 0x0F);
    match (hi <= 2, lo <= 2) {
        (true, false) => false,
        (false, true) => true,
        _ => true,
    }
}

/// Converts a Terminate control word from Linux siw's little-endian
/// bit-field layout (`EType << 4 | Layer`, error code, then M/D/R in bits
/// 0x01/0x02/0x04 of the third byte) to the RFC 5040 layout. Reserved bits
/// are carried over.
pub fn siw_le_to_rfc(word: [u8; 4]) -> [u8; 4] {
    let v = u32::from_le_bytes(word);
    let layer = v & 0xF;
    let etype = (v >> 4) & 0xF;
    let ecode = (v >> 8) & 0xFF;
    let hdrct = (v >> 16) & 0x7; // bit 0 = M, 1 = D, 2 = R
    let rsvd = v >> 19; // 13 bits
    let m = hdrct & 1;
    let d = (hdrct >> 1) & 1;
    let r = (hdrct >> 2) & 1;
    let w =
        (layer << 28) | (etype << 24) | (ecode << 16) | (m << 15) | (d << 14) | (r << 13) | rsvd;
    w.to_be_bytes()
}

/// The inverse of [`siw_le_to_rfc`]: the bytes a Linux siw peer on a
/// little-endian host reads as the same layer, type, code and flags.
pub fn rfc_to_siw_le(word: [u8; 4]) -> [u8; 4] {
    let w = u32::from_be_bytes(word);
    let layer = w >> 28;
    let etype = (w >> 24) & 0xF;
    let ecode = (w >> 16) & 0xFF;
    let m = (w >> 15) & 1;
    let d = (w >> 14) & 1;
    let r = (w >> 13) & 1;
    let rsvd = w & 0x1FFF;
    let v = layer | (etype << 4) | (ecode << 8) | (m << 16) | (d << 17) | (r << 18) | (rsvd << 19);
    v.to_le_bytes()
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    /// Every code the engine or siw sends, with and without an attached
    /// DDP header, reads back right from either layout where the word is
    /// unambiguous, and in siw's layout where it is not.
    #[test]
    fn guessed_layout_reads_both_kinds() {
        let hdr = vec![0xC1u8, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let all = [
            codes::RDMAP_INVALID_STAG,
            codes::RDMAP_ACCESS_RIGHTS,
            codes::RDMAP_UNEXPECTED_OPCODE,
            codes::RDMAP_CATASTROPHIC_STREAM,
            codes::DDP_LOCAL_CATASTROPHIC,
            codes::DDP_TAGGED_INVALID_STAG,
            codes::DDP_TAGGED_BASE_BOUNDS,
            codes::DDP_UNTAGGED_NO_BUFFER,
            codes::DDP_UNTAGGED_MSN_RANGE,
            codes::MPA_CRC,
        ];
        for code in all {
            for with_hdr in [true, false] {
                let mut t = Terminate::new(code);
                if with_hdr {
                    t.ddp_header = Some(hdr.clone());
                    t.ddp_seg_len = Some(14);
                }
                let mut rfc = Vec::new();
                t.encode(&mut rfc);
                let mut siw = rfc.clone();
                let w = rfc_to_siw_le([rfc[0], rfc[1], rfc[2], rfc[3]]);
                siw[..4].copy_from_slice(&w);
                assert_eq!(
                    Terminate::decode_guess_layout(&siw).unwrap().code,
                    code,
                    "siw layout of {code} (header {with_hdr})"
                );
                if with_hdr {
                    // Flags make the RFC layout unambiguous.
                    assert_eq!(
                        Terminate::decode_guess_layout(&rfc).unwrap().code,
                        code,
                        "RFC layout of {code}"
                    );
                }
            }
        }
    }
}
