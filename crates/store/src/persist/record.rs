//! The log's record format: a pure codec, no I/O.
//!
//! ```text
//!  0..4   magic "SRLG"
//!  4      format version (1)
//!  5      kind: 1 entry, 2 wrap (the next record is at offset 0)
//!  6..8   zero
//!  8..12  payload length (LE)
//! 12..16  CRC32C of the previous record (the chain; the log's start
//!         names the one before the first)
//! 16..24  log sequence number (LE), one more than the previous record's
//! 24..28  log id (LE): which log this is; a reset log gets a new one
//! 28..32  CRC32C of bytes 0..28 and the payload
//! 32..    payload, then zeros to the next multiple of 8
//! ```
//!
//! A record is valid where it is expected only if every field checks out:
//! the magic and version, a known kind, the zero bytes, a length within
//! bounds, the CRC, and the three values the reader expects there (the
//! sequence number, the previous record's CRC, the log id). Anything else
//! ends the log at that offset: a torn tail, zeros never written, or a
//! record left from an earlier lap of the ring or an earlier life of the
//! writer (its chain or sequence number differs).

/// Bytes of a record's header.
pub const HEADER_LEN: usize = 32;
/// Records start and end on multiples of this.
pub const ALIGN: usize = 8;
/// The largest payload a record may carry (a 512 MiB value with room for
/// its effects' framing).
pub const MAX_PAYLOAD: usize = (512 << 20) + (64 << 10);

const MAGIC: [u8; 4] = *b"SRLG";
const VERSION: u8 = 1;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A payload the log's user appended.
    Entry,
    /// No payload: the ring continues at offset 0.
    Wrap,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Entry => 1,
            Kind::Wrap => 2,
        }
    }
}

/// What the reader expects of the record at some offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// Its sequence number.
    pub lsn: u64,
    /// The CRC of the record before it.
    pub prev_crc: u32,
    /// The log's id.
    pub log_id: u32,
}

/// A record found where it was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// What it is.
    pub kind: Kind,
    /// Its payload: `bytes[HEADER_LEN..HEADER_LEN + len]`.
    pub len: usize,
    /// Its whole size, padding included.
    pub size: usize,
    /// Its CRC (the next record's `prev_crc`).
    pub crc: u32,
}

/// The outcome of [`decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record.
    Record(Found),
    /// The header is plausible but its record runs past the bytes given:
    /// call again with at least this many.
    NeedMore(usize),
    /// No valid record starts here: the log ends.
    End(EndReason),
}

/// Why the log ends at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// No magic (bytes never written, or zeros past the end).
    NoMagic,
    /// A header field is impossible (version, kind, reserved bytes,
    /// length).
    BadHeader,
    /// The CRC does not match: a torn or damaged record.
    BadCrc,
    /// A whole record of another log, another lap or another life of the
    /// writer (sequence number, chain or log id not the expected ones).
    Stale,
}

/// The size of a record carrying `len` payload bytes.
pub fn record_size(len: usize) -> usize {
    (HEADER_LEN + len).div_ceil(ALIGN) * ALIGN
}

/// Appends a record to `out`; returns its CRC.
///
/// # Panics
/// If `payload` is longer than [`MAX_PAYLOAD`], or a wrap has a payload.
pub fn encode(kind: Kind, at: Expect, payload: &[u8], out: &mut Vec<u8>) -> u32 {
    assert!(payload.len() <= MAX_PAYLOAD, "record payload too long");
    assert!(
        kind == Kind::Entry || payload.is_empty(),
        "a wrap has no payload"
    );
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind.code());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.prev_crc.to_le_bytes());
    out.extend_from_slice(&at.lsn.to_le_bytes());
    out.extend_from_slice(&at.log_id.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 28]), payload);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + record_size(payload.len()), 0);
    crc
}

/// Decodes the record at the start of `bytes`, which the reader expects to
/// be `expect`. Never panics, whatever the bytes.
pub fn decode(bytes: &[u8], expect: Expect) -> Decoded {
    if bytes.len() < HEADER_LEN {
        if bytes.len() >= 4 && bytes[..4] != MAGIC {
            return Decoded::End(EndReason::NoMagic);
        }
        return Decoded::NeedMore(HEADER_LEN);
    }
    if bytes[..4] != MAGIC {
        return Decoded::End(EndReason::NoMagic);
    }
    let le32 = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let kind = match bytes[5] {
        1 => Kind::Entry,
        2 => Kind::Wrap,
        _ => return Decoded::End(EndReason::BadHeader),
    };
    let len = le32(8) as usize;
    if bytes[4] != VERSION
        || bytes[6..8] != [0, 0]
        || len > MAX_PAYLOAD
        || (kind == Kind::Wrap && len != 0)
    {
        return Decoded::End(EndReason::BadHeader);
    }
    let size = record_size(len);
    if bytes.len() < size {
        return Decoded::NeedMore(size);
    }
    let crc = le32(28);
    let want = crc32c::crc32c_append(
        crc32c::crc32c(&bytes[..28]),
        &bytes[HEADER_LEN..HEADER_LEN + len],
    );
    if crc != want {
        return Decoded::End(EndReason::BadCrc);
    }
    let lsn = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if lsn != expect.lsn || le32(12) != expect.prev_crc || le32(24) != expect.log_id {
        return Decoded::End(EndReason::Stale);
    }
    Decoded::Record(Found {
        kind,
        len,
        size,
        crc,
    })
}
