//! In-arena object layout, readable by a one-sided RDMA Read.
//!
//! Every allocation holds one object: a fixed 48-byte header, the key (empty
//! for an object of the pointer API), then the value. All integers are
//! little-endian.
//!
//! ```text
//! offset  size  field
//!      0     4  magic       "SRO2" (0x324f5253 LE); zero once freed
//!      4     4  length      value length in bytes
//!      8     8  version     sequence number of the write that produced it
//!     16     4  checksum    CRC32c over every other header byte, the key and
//!                           the value
//!     20     4  units       the allocation's length in 64-byte units
//!     24     8  generation  sequence number of the write that created the
//!                           key's object (kept by updates, also when an
//!                           update moves it); for the pointer API, of the
//!                           write that stored these bytes
//!     32     8  key hash    [`key_hash`]`(key)`; 0 without a key
//!     40     2  key length  at most `MAX_KEY_LEN`
//!     42     6  deadline    when the key expires: milliseconds since the
//!                           Unix epoch (48 bits, [`MAX_DEADLINE`]); 0: never
//!     48     k  key
//!   48+k     n  value
//! ```
//!
//! The allocation length lets a reader check that its pointer names exactly
//! this allocation ([`decode_exact`]): a pointer whose length is not the
//! allocation's is refused as it is by the node, never answered with the
//! object. The key and generation let a reader that reached the object
//! through a cached pointer or an index slot check that it is the object it
//! was looking for: space freed and reused by another key is recognised by
//! its key, and a slot names the generation it was written for.
//!
//! A client reads the whole allocation with one RDMA Read, without the
//! server's CPU. An update may be overwriting the object in place at the same
//! moment, so the bytes read may mix two versions (a *torn* read) or pair an
//! old header with new data (a *stale* read). [`decode`] recomputes the
//! checksum and reports [`ObjectError::Torn`] on any mismatch; the client
//! retries. Torn bytes are never returned. (CRC32c misses a random mix with
//! probability 2^-32 per read.)
//!
//! A freed allocation has its header zeroed, so a read through a dangling
//! pointer fails with [`ObjectError::Empty`] until the space is reused.

use crate::arena::{ArenaError, Memory};

/// Header size in bytes.
pub const HEADER_LEN: usize = 48;
/// Header magic, "SRO2" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRO2");
/// The longest key, in bytes (memcached allows 250, this allows more).
pub const MAX_KEY_LEN: usize = 1024;
/// The latest deadline a header holds (48 bits of milliseconds since the
/// Unix epoch: the year 10889).
pub const MAX_DEADLINE: u64 = (1 << 48) - 1;

/// The 64-bit hash of a key, the same on every node and client (the
/// header's key hash; the index's buckets and tags come from it).
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// Why bytes could not be decoded as an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// Fewer bytes than a header.
    #[error("buffer of {len} bytes is shorter than an object header")]
    Short {
        /// Buffer length.
        len: usize,
    },
    /// No object here (freed, or never written).
    #[error("no object at this location (freed or never written)")]
    Empty,
    /// Header and data disagree: the read raced a write. Retry.
    #[error("torn read (checksum mismatch): the object changed while it was read; retry")]
    Torn,
    /// The data does not fit the space given.
    #[error("object of {len} bytes does not fit {capacity} bytes of space")]
    TooBig {
        /// Key and value length.
        len: usize,
        /// Space for key and value.
        capacity: usize,
    },
    /// The bytes read are not the object's whole allocation (the pointer's
    /// length is not the allocation's).
    #[error("read {read} bytes of an allocation of {allocation} bytes")]
    WrongLength {
        /// Bytes read.
        read: usize,
        /// The allocation's length, as its header says.
        allocation: u64,
    },
    /// The arena refused the access.
    #[error(transparent)]
    Arena(#[from] ArenaError),
}

/// What an object holds, to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields<'a> {
    /// Version (the write's sequence number).
    pub version: u64,
    /// Generation (see the module docs).
    pub generation: u64,
    /// The key; empty for the pointer API.
    pub key: &'a [u8],
    /// The value.
    pub data: &'a [u8],
    /// When the key expires, in milliseconds since the Unix epoch; 0:
    /// never (and always for the pointer API). At most [`MAX_DEADLINE`].
    pub deadline: u64,
}

impl<'a> Fields<'a> {
    /// An object of the pointer API (no key) whose generation is its
    /// version.
    pub fn unkeyed(version: u64, data: &'a [u8]) -> Fields<'a> {
        Fields {
            version,
            generation: version,
            key: &[],
            data,
            deadline: 0,
        }
    }
}

/// A decoded object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object<'a> {
    /// Version (the write sequence number).
    pub version: u64,
    /// Generation.
    pub generation: u64,
    /// The key's hash as the header stores it ([`key_hash`]`(key)`; 0
    /// without a key).
    pub key_hash: u64,
    /// The key (empty for the pointer API).
    pub key: &'a [u8],
    /// The data.
    pub data: &'a [u8],
    /// The allocation's length in bytes.
    pub allocation: u64,
    /// When the key expires (milliseconds since the Unix epoch); 0: never.
    pub deadline: u64,
}

/// An object read out of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Version.
    pub version: u64,
    /// Generation.
    pub generation: u64,
    /// Key.
    pub key: Vec<u8>,
    /// Value.
    pub data: Vec<u8>,
    /// Deadline (see [`Fields::deadline`]).
    pub deadline: u64,
}

/// Bytes needed to store a key of `key_len` bytes and `data_len` bytes of
/// value.
pub fn encoded_len(key_len: usize, data_len: usize) -> usize {
    HEADER_LEN + key_len + data_len
}

/// CRC32C (Castagnoli) of the header less its checksum field, the key and
/// the value (`crc-fast`: a 1 MiB value is checked on every read of it).
fn checksum(head: &[u8], key: &[u8], data: &[u8]) -> u32 {
    let mut d = digest(head, key);
    d.update(data);
    d.finalize() as u32
}

/// The checksum's digest after the header's fields and the key (the value
/// comes next).
fn digest(head: &[u8], key: &[u8]) -> crc_fast::Digest {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&head[0..16]);
    d.update(&head[20..HEADER_LEN]);
    d.update(key);
    d
}

/// A value is written into memory and checksummed this much at a time:
/// the checksum reads each piece while the copy left it in the cache, so
/// a large value costs about one pass over memory, not two.
const FUSED: usize = 64 << 10;

/// Allocations are multiples of this many bytes.
pub const UNIT: u64 = 64;

/// The header for `f` in an allocation of `allocation` bytes (a multiple
/// of [`UNIT`]).
pub fn header(f: &Fields<'_>, allocation: u64) -> [u8; HEADER_LEN] {
    let mut h = fields(f, allocation);
    let crc = checksum(&h, f.key, f.data);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// [`header`] without its checksum (zero).
fn fields(f: &Fields<'_>, allocation: u64) -> [u8; HEADER_LEN] {
    let len = u32::try_from(f.data.len()).expect("object data must be below 4 GiB");
    let units = u32::try_from(allocation / UNIT).expect("allocations below 256 GiB");
    assert!(
        f.key.len() <= MAX_KEY_LEN,
        "keys are at most {MAX_KEY_LEN} bytes"
    );
    assert!(f.deadline <= MAX_DEADLINE, "a deadline has 48 bits");
    let hash = if f.key.is_empty() { 0 } else { key_hash(f.key) };
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&f.version.to_le_bytes());
    h[20..24].copy_from_slice(&units.to_le_bytes());
    h[24..32].copy_from_slice(&f.generation.to_le_bytes());
    h[32..40].copy_from_slice(&hash.to_le_bytes());
    h[40..42].copy_from_slice(&(f.key.len() as u16).to_le_bytes());
    h[42..48].copy_from_slice(&f.deadline.to_le_bytes()[..6]);
    h
}

/// Encodes an object into `dst`, the whole allocation (its length a
/// multiple of [`UNIT`] holding at least [`encoded_len`] bytes).
pub fn encode_into(dst: &mut [u8], f: &Fields<'_>) -> Result<(), ObjectError> {
    let need = encoded_len(f.key.len(), f.data.len());
    if dst.len() < need {
        return Err(ObjectError::TooBig {
            len: f.key.len() + f.data.len(),
            capacity: dst.len().saturating_sub(HEADER_LEN),
        });
    }
    let h = header(f, dst.len() as u64);
    dst[..HEADER_LEN].copy_from_slice(&h);
    dst[HEADER_LEN..HEADER_LEN + f.key.len()].copy_from_slice(f.key);
    dst[HEADER_LEN + f.key.len()..need].copy_from_slice(f.data);
    Ok(())
}

/// Encodes an object into a new buffer, the smallest allocation for it.
pub fn encode(f: &Fields<'_>) -> Vec<u8> {
    let n = (encoded_len(f.key.len(), f.data.len()) as u64).div_ceil(UNIT) * UNIT;
    let mut v = vec![0; n as usize];
    encode_into(&mut v, f).expect("buffer sized for the object");
    v
}

/// Decodes bytes read from an allocation (possibly longer than the object),
/// verifying the checksum.
pub fn decode(buf: &[u8]) -> Result<Object<'_>, ObjectError> {
    let h = parse_header(buf)?;
    if h.key_len + h.len > buf.len() - HEADER_LEN {
        // A length that cannot be right for this allocation: torn header.
        return Err(ObjectError::Torn);
    }
    let key = &buf[HEADER_LEN..HEADER_LEN + h.key_len];
    let data = &buf[HEADER_LEN + h.key_len..HEADER_LEN + h.key_len + h.len];
    h.object(&buf[..HEADER_LEN], key, data)
}

/// [`decode_exact`] of an allocation read in two parts, `head` and then
/// `body` (a one-sided reader scatters a large object's Read so that its
/// value lands at the start of a buffer of its own, `body`, which it then
/// hands out without a copy). `None` where the object's key does not end
/// exactly where `head` does (another key's object, or no object): the
/// caller joins the parts and decodes them whole.
pub fn decode_parts<'a>(head: &'a [u8], body: &'a [u8]) -> Option<Result<Object<'a>, ObjectError>> {
    let h = match parse_header(head) {
        Ok(h) => h,
        Err(ObjectError::Short { .. }) => return None,
        Err(e) => return Some(Err(e)),
    };
    let read = head.len() + body.len();
    if h.allocation != read as u64 {
        return Some(Err(ObjectError::WrongLength {
            read,
            allocation: h.allocation,
        }));
    }
    if HEADER_LEN + h.key_len != head.len() {
        return None;
    }
    if h.len > body.len() {
        return Some(Err(ObjectError::Torn));
    }
    Some(h.object(&head[..HEADER_LEN], &head[HEADER_LEN..], &body[..h.len]))
}

/// The header and key of an allocation of `allocation` bytes, `head`
/// (its first `HEADER_LEN` + key length bytes), decoded **without** its
/// checksum, which covers the value too: an [`Object`] with an empty
/// `data`, and the value's length. Only for a reader that knows no write
/// touched the arena while it read (the RESP door between two counts of
/// the arena's writes, `arena::pins`); a one-sided reader decodes whole.
/// `None` where the key does not end exactly where `head` does (the
/// caller reads the allocation whole).
pub fn decode_head(
    head: &[u8],
    allocation: usize,
) -> Option<Result<(Object<'_>, usize), ObjectError>> {
    let h = match parse_header(head) {
        Ok(h) => h,
        Err(ObjectError::Short { .. }) => return None,
        Err(e) => return Some(Err(e)),
    };
    if h.allocation != allocation as u64 {
        return Some(Err(ObjectError::WrongLength {
            read: allocation,
            allocation: h.allocation,
        }));
    }
    if HEADER_LEN + h.key_len != head.len() {
        return None;
    }
    if HEADER_LEN + h.key_len + h.len > allocation {
        return Some(Err(ObjectError::Torn));
    }
    let o = Object {
        version: h.version,
        generation: h.generation,
        key_hash: h.key_hash,
        key: &head[HEADER_LEN..],
        data: &[],
        allocation: h.allocation,
        deadline: h.deadline,
    };
    Some(Ok((o, h.len)))
}

/// An object header's fields, before its checksum is checked.
struct Parsed {
    len: usize,
    version: u64,
    crc: u32,
    allocation: u64,
    generation: u64,
    key_hash: u64,
    key_len: usize,
    deadline: u64,
}

/// The header at the start of `buf`: `Empty` if zeroed, `Torn` if caught
/// mid-write or with a key too long.
fn parse_header(buf: &[u8]) -> Result<Parsed, ObjectError> {
    if buf.len() < HEADER_LEN {
        return Err(ObjectError::Short { len: buf.len() });
    }
    let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
    let magic = u32_at(0);
    if magic == 0 {
        return Err(ObjectError::Empty);
    }
    if magic != MAGIC {
        // Not zero and not the magic: a header caught mid-write.
        return Err(ObjectError::Torn);
    }
    let mut d = [0u8; 8];
    d[..6].copy_from_slice(&buf[42..48]);
    let h = Parsed {
        len: u32_at(4) as usize,
        version: u64_at(8),
        crc: u32_at(16),
        allocation: u32_at(20) as u64 * UNIT,
        generation: u64_at(24),
        key_hash: u64_at(32),
        key_len: u16::from_le_bytes(buf[40..42].try_into().unwrap()) as usize,
        deadline: u64::from_le_bytes(d),
    };
    if h.key_len > MAX_KEY_LEN {
        return Err(ObjectError::Torn);
    }
    Ok(h)
}

impl Parsed {
    /// The object of this header (`head`, its bytes), `key` and `data`,
    /// if the checksum holds.
    fn object<'a>(
        &self,
        head: &[u8],
        key: &'a [u8],
        data: &'a [u8],
    ) -> Result<Object<'a>, ObjectError> {
        if checksum(head, key, data) != self.crc {
            return Err(ObjectError::Torn);
        }
        Ok(Object {
            version: self.version,
            generation: self.generation,
            key_hash: self.key_hash,
            key,
            data,
            allocation: self.allocation,
            deadline: self.deadline,
        })
    }
}

/// [`decode`] of exactly one whole allocation: `buf` must be as long as the
/// allocation the header names, else [`ObjectError::WrongLength`] (the
/// pointer used names no allocation of that length). What a one-sided
/// reader uses, so it returns no more and no less than the node would.
pub fn decode_exact(buf: &[u8]) -> Result<Object<'_>, ObjectError> {
    if buf.len() >= HEADER_LEN && u32::from_le_bytes(buf[0..4].try_into().unwrap()) == MAGIC {
        let units = u32::from_le_bytes(buf[20..24].try_into().unwrap()) as u64;
        if units * UNIT != buf.len() as u64 {
            // (A torn header may say so too; the node's answer decides.)
            return Err(ObjectError::WrongLength {
                read: buf.len(),
                allocation: units * UNIT,
            });
        }
    }
    decode(buf)
}

/// Writes an object in place at `offset`, in an allocation of `capacity`
/// bytes. Key and value go first and the header last, so a reader that
/// sees the new header has a good chance of seeing the new data; the
/// checksum catches the rest.
pub fn write_object<M: Memory + ?Sized>(
    mem: &mut M,
    offset: u64,
    capacity: u64,
    f: &Fields<'_>,
) -> Result<(), ObjectError> {
    if encoded_len(f.key.len(), f.data.len()) as u64 > capacity {
        return Err(ObjectError::TooBig {
            len: f.key.len() + f.data.len(),
            capacity: (capacity as usize).saturating_sub(HEADER_LEN),
        });
    }
    let body = offset + HEADER_LEN as u64;
    let mut h = fields(f, capacity);
    let mut d = digest(&h, f.key);
    mem.write(body, f.key)?;
    let mut at = body + f.key.len() as u64;
    for piece in f.data.chunks(FUSED) {
        mem.write(at, piece)?;
        d.update(piece);
        at += piece.len() as u64;
    }
    h[16..20].copy_from_slice(&(d.finalize() as u32).to_le_bytes());
    mem.write(offset, &h)?;
    Ok(())
}

/// Gives the object in the allocation `[offset, offset + capacity)`,
/// which must hold `key`, a new `version` and `deadline`: only its header
/// is rewritten (the checksum recomputed over the same key and value).
/// A one-sided reader racing it sees the old header or the new one, or a
/// torn one that fails its checksum.
pub fn retime<M: Memory + ?Sized>(
    mem: &mut M,
    offset: u64,
    capacity: u64,
    key: &[u8],
    version: u64,
    deadline: u64,
) -> Result<(), ObjectError> {
    let o = read_object(mem, offset, capacity)?;
    if o.key != key || deadline > MAX_DEADLINE {
        return Err(ObjectError::Torn);
    }
    let f = Fields {
        version,
        generation: o.generation,
        key,
        data: &o.data,
        deadline,
    };
    mem.write(offset, &header(&f, capacity))?;
    Ok(())
}

/// Zeroes the header at `offset` (on free), so reads fail with `Empty`.
pub fn scrub<M: Memory + ?Sized>(mem: &mut M, offset: u64) -> Result<(), ObjectError> {
    mem.write(offset, &[0u8; HEADER_LEN])?;
    Ok(())
}

/// Reads and decodes the object in the allocation `[offset, offset + capacity)`.
pub fn read_object<M: Memory + ?Sized>(
    mem: &M,
    offset: u64,
    capacity: u64,
) -> Result<Owned, ObjectError> {
    let mut buf = vec![0u8; capacity as usize];
    mem.read(offset, &mut buf)?;
    let o = decode(&buf)?;
    Ok(Owned {
        version: o.version,
        generation: o.generation,
        key: o.key.to_vec(),
        data: o.data.to_vec(),
        deadline: o.deadline,
    })
}

/// An object's header fields and key, read without its value ([`read_head`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Key.
    pub key: Vec<u8>,
    /// Generation.
    pub generation: u64,
    /// Version.
    pub version: u64,
    /// Deadline (see [`Fields::deadline`]).
    pub deadline: u64,
}

/// Reads only the header and key of the object at `offset` (at most
/// [`HEADER_LEN`] + [`MAX_KEY_LEN`] bytes, never the value), checking
/// nothing but the magic and the key's length: for a node reading its
/// own memory, which only its loop writes (a key's version or deadline
/// without copying its value; its index rebuilt from quiescent memory).
pub fn read_head<M: Memory + ?Sized>(mem: &M, offset: u64) -> Result<Head, ObjectError> {
    let mut h = [0u8; HEADER_LEN];
    mem.read(offset, &mut h)?;
    if u32::from_le_bytes(h[0..4].try_into().unwrap()) != MAGIC {
        return Err(ObjectError::Empty);
    }
    let version = u64::from_le_bytes(h[8..16].try_into().unwrap());
    let generation = u64::from_le_bytes(h[24..32].try_into().unwrap());
    let key_len = u16::from_le_bytes(h[40..42].try_into().unwrap()) as usize;
    let mut d = [0u8; 8];
    d[..6].copy_from_slice(&h[42..48]);
    if key_len > MAX_KEY_LEN {
        return Err(ObjectError::Torn);
    }
    let mut key = vec![0u8; key_len];
    mem.read(offset + HEADER_LEN as u64, &mut key)?;
    Ok(Head {
        key,
        generation,
        version,
        deadline: u64::from_le_bytes(d),
    })
}

/// Reads only the key and generation of the object at `offset`
/// ([`read_head`]).
pub fn read_key<M: Memory + ?Sized>(mem: &M, offset: u64) -> Result<(Vec<u8>, u64), ObjectError> {
    read_head(mem, offset).map(|h| (h.key, h.generation))
}

#[cfg(test)]
#[path = "object_tests.rs"]
mod tests;
