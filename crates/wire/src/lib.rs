//! Pure codecs for the iWARP protocol suite, with no I/O.
//!
//! The layers, bottom up, as they sit inside one TCP byte stream:
//!
//! * [`mpa`]: RFC 5044 Marker PDU Aligned framing, with the RFC 6581
//!   (MPA revision 2, "enhanced") connection set-up. After the request and
//!   reply frames, the stream is a sequence of FPDUs:
//!   `ULPDU_Length (16) | ULPDU | pad | CRC32c (32)`.
//! * [`ddp`]: RFC 5041 Direct Data Placement headers (tagged and untagged)
//!   together with the RDMAP control byte and the RDMAP-specific header
//!   fields of RFC 5040 (opcodes, the Read Request body).
//! * [`terminate`]: the RDMAP Terminate message and its error codes
//!   (RFC 5040 section 7, RFC 5041 section 7, RFC 5044 section 8).
//!
//! Every decoder takes a byte slice and returns either a value or a
//! [`WireError`] that names the Terminate code a receiver must send; no
//! decoder panics on any input (see the property tests and the `cargo fuzz`
//! targets under `fuzz/`).
//!
//! All multi-byte fields are big-endian, except the MPA CRC, which goes on the
//! wire in the byte order that Linux siw and Wireshark use (little-endian).

#![forbid(unsafe_code)]

pub mod ddp;
pub mod mpa;
pub mod terminate;

pub use ddp::{
    AtomicOp, AtomicRequest, AtomicResponse, DdpHeader, Ext, Opcode, ReadRequest, TaggedHeader,
    UntaggedHeader,
};
pub use mpa::{MpaFrame, MpaHeader, MpaKind, MpaV2};
pub use terminate::{Layer, TermCode, Terminate};

/// A decoding failure. Each one knows the Terminate code that a receiver
/// reports for it (see [`WireError::term_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("need {0} more bytes")]
    Short(usize),
    #[error("bad MPA key")]
    MpaKey,
    #[error("MPA revision {0} not supported")]
    MpaRevision(u8),
    #[error("MPA markers requested; not supported")]
    MpaMarkers,
    #[error("MPA private data length {0} too large")]
    MpaPrivateDataLength(usize),
    #[error("MPA v2 frame without the 4-byte IRD/ORD block")]
    MpaV2Block,
    #[error("invalid DDP version {0}")]
    DdpVersion(u8),
    #[error("invalid RDMAP version {0}")]
    RdmapVersion(u8),
    #[error("unknown or unsupported RDMAP opcode {0:#x}")]
    Opcode(u8),
    #[error("RDMAP opcode {opcode:?} carried in a {} DDP segment", if *.tagged {"tagged"} else {"untagged"})]
    OpcodeModel { opcode: Opcode, tagged: bool },
    #[error("invalid DDP queue number {0}")]
    QueueNumber(u32),
    #[error("unknown atomic operation {0:#x}")]
    AtomicOp(u8),
    #[error("malformed Terminate message")]
    Terminate,
}

impl WireError {
    /// The Terminate error code a receiver sends when it meets this error.
    ///
    /// * [`WireError::Short`]: a DDP segment or Read Request too short for
    ///   its header. Neither RFC 5040 nor RFC 5041 has a code for that; the
    ///   stream cannot be parsed further, so this is RDMAP's "catastrophic
    ///   error, localized to RDMAP Stream" (0/2/0x07). (When it comes from
    ///   an MPA set-up frame it only means "read more".)
    /// * MPA set-up frame errors: "invalid MPA Request or Reply frame"
    ///   (2/0/0x04, RFC 5044 section 8). RFC 5044 says to close the TCP
    ///   connection then rather than send a Terminate.
    /// * [`WireError::DdpVersion`]: the untagged "invalid DDP version"
    ///   code (1/2/0x06); the tagged one (1/1/0x04) applies to a tagged
    ///   segment, which [`WireError::term_code_in`] tells apart.
    /// * [`WireError::Terminate`]: a malformed Terminate. RDMAP never
    ///   answers a Terminate with another; the code is only for reporting.
    pub fn term_code(&self) -> TermCode {
        use terminate::codes::*;
        match self {
            WireError::Short(_) => RDMAP_CATASTROPHIC_STREAM,
            WireError::MpaKey
            | WireError::MpaRevision(_)
            | WireError::MpaMarkers
            | WireError::MpaPrivateDataLength(_)
            | WireError::MpaV2Block => MPA_INVALID_REQ_REP,
            WireError::DdpVersion(_) => DDP_UNTAGGED_INVALID_VERSION,
            WireError::RdmapVersion(_) => RDMAP_INVALID_VERSION,
            WireError::Opcode(_) | WireError::OpcodeModel { .. } | WireError::AtomicOp(_) => {
                RDMAP_UNEXPECTED_OPCODE
            }
            WireError::QueueNumber(_) => DDP_UNTAGGED_INVALID_QN,
            WireError::Terminate => RDMAP_UNEXPECTED_OPCODE,
        }
    }

    /// Like [`WireError::term_code`], for an error met decoding the DDP
    /// segment `ulpdu`: a bad DDP version in a tagged segment gets the
    /// tagged code (RFC 5041 section 7.2).
    pub fn term_code_in(&self, ulpdu: &[u8]) -> TermCode {
        match (self, ulpdu.first()) {
            (WireError::DdpVersion(_), Some(&ctrl)) => ddp::invalid_version_code(ctrl),
            _ => self.term_code(),
        }
    }
}

#[inline]
pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
#[inline]
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
#[inline]
pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}
