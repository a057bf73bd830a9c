//! In-arena object layout, readable by a one-sided RDMA Read.
//!
//! Every allocation holds one object: a fixed 24-byte header followed by the
//! data. All integers are little-endian.
//!
//! ```text
//! offset  size  field
//!      0     4  magic    "SRO1" (0x314f5253 LE); zero once freed
//!      4     4  length   data length in bytes
//!      8     8  version  write sequence number that produced this object
//!     16     4  checksum CRC32c over bytes 0..16 and the data
//!     20     4  reserved zero (non-zero reads as torn)
//!     24     n  data
//! ```
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
pub const HEADER_LEN: usize = 24;
/// Header magic, "SRO1" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRO1");

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
        /// Data length.
        len: usize,
        /// Space for data.
        capacity: usize,
    },
    /// The arena refused the access.
    #[error(transparent)]
    Arena(#[from] ArenaError),
}

/// A decoded object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object<'a> {
    /// Version (the write sequence number).
    pub version: u64,
    /// The data.
    pub data: &'a [u8],
}

/// Bytes needed to store `data_len` bytes of data.
pub fn encoded_len(data_len: usize) -> usize {
    HEADER_LEN + data_len
}

fn checksum(head: &[u8], data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), data)
}

/// The header for `data` at `version`.
pub fn header(version: u64, data: &[u8]) -> [u8; HEADER_LEN] {
    let len = u32::try_from(data.len()).expect("object data must be below 4 GiB");
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&version.to_le_bytes());
    let crc = checksum(&h[0..16], data);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Encodes an object into `dst` (which must hold [`encoded_len`] bytes).
pub fn encode_into(dst: &mut [u8], version: u64, data: &[u8]) -> Result<(), ObjectError> {
    if dst.len() < encoded_len(data.len()) {
        return Err(ObjectError::TooBig {
            len: data.len(),
            capacity: dst.len().saturating_sub(HEADER_LEN),
        });
    }
    dst[..HEADER_LEN].copy_from_slice(&header(version, data));
    dst[HEADER_LEN..HEADER_LEN + data.len()].copy_from_slice(data);
    Ok(())
}

/// Encodes an object into a new buffer.
pub fn encode(version: u64, data: &[u8]) -> Vec<u8> {
    let mut v = vec![0; encoded_len(data.len())];
    encode_into(&mut v, version, data).expect("buffer sized for the object");
    v
}

/// Decodes bytes read from an allocation (possibly longer than the object),
/// verifying the checksum.
pub fn decode(buf: &[u8]) -> Result<Object<'_>, ObjectError> {
    if buf.len() < HEADER_LEN {
        return Err(ObjectError::Short { len: buf.len() });
    }
    let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().unwrap());
    let magic = u32_at(0);
    if magic == 0 {
        return Err(ObjectError::Empty);
    }
    if magic != MAGIC {
        // Not zero and not the magic: a header caught mid-write.
        return Err(ObjectError::Torn);
    }
    let len = u32_at(4) as usize;
    let version = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let crc = u32_at(16);
    if u32_at(20) != 0 {
        // Reserved bytes are always written as zero.
        return Err(ObjectError::Torn);
    }
    if len > buf.len() - HEADER_LEN {
        // A length that cannot be right for this allocation: torn header.
        return Err(ObjectError::Torn);
    }
    let data = &buf[HEADER_LEN..HEADER_LEN + len];
    if checksum(&buf[0..16], data) != crc {
        return Err(ObjectError::Torn);
    }
    Ok(Object { version, data })
}

/// Writes an object in place at `offset`, in an allocation of `capacity`
/// bytes. The data goes first and the header last, so a reader that sees
/// the new header has a good chance of seeing the new data; the checksum
/// catches the rest.
pub fn write_object<M: Memory + ?Sized>(
    mem: &mut M,
    offset: u64,
    capacity: u64,
    version: u64,
    data: &[u8],
) -> Result<(), ObjectError> {
    if encoded_len(data.len()) as u64 > capacity {
        return Err(ObjectError::TooBig {
            len: data.len(),
            capacity: (capacity as usize).saturating_sub(HEADER_LEN),
        });
    }
    mem.write(offset + HEADER_LEN as u64, data)?;
    mem.write(offset, &header(version, data))?;
    Ok(())
}

/// Zeroes the header at `offset` (on free), so reads fail with `Empty`.
pub fn scrub<M: Memory + ?Sized>(mem: &mut M, offset: u64) -> Result<(), ObjectError> {
    mem.write(offset, &[0u8; HEADER_LEN])?;
    Ok(())
}

/// Reads and decodes the object in the allocation `[offset, offset + capacity)`;
/// returns `(version, data)`.
pub fn read_object<M: Memory + ?Sized>(
    mem: &M,
    offset: u64,
    capacity: u64,
) -> Result<(u64, Vec<u8>), ObjectError> {
    let mut buf = vec![0u8; capacity as usize];
    mem.read(offset, &mut buf)?;
    let o = decode(&buf)?;
    Ok((o.version, o.data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::HeapMemory;
    use proptest::prelude::*;

    #[test]
    fn round_trip_in_memory() {
        let mut m = HeapMemory::new(256);
        write_object(&mut m, 64, 128, 7, b"hello world").unwrap();
        assert_eq!(
            read_object(&m, 64, 128).unwrap(),
            (7, b"hello world".to_vec())
        );
        // Overwrite in place with shorter data.
        write_object(&mut m, 64, 128, 8, b"bye").unwrap();
        assert_eq!(read_object(&m, 64, 128).unwrap(), (8, b"bye".to_vec()));
        assert!(matches!(
            write_object(&mut m, 64, 128, 9, &[0; 105]),
            Err(ObjectError::TooBig {
                len: 105,
                capacity: 104
            })
        ));
        scrub(&mut m, 64).unwrap();
        assert_eq!(read_object(&m, 64, 128), Err(ObjectError::Empty));
        assert_eq!(decode(&[0; 10]), Err(ObjectError::Short { len: 10 }));
    }

    #[test]
    fn single_bit_flips_are_detected() {
        let enc = encode(3, b"some payload");
        for byte in 0..enc.len() {
            for bit in 0..8 {
                let mut b = enc.clone();
                b[byte] ^= 1 << bit;
                let r = decode(&b);
                assert!(
                    matches!(r, Err(ObjectError::Torn) | Err(ObjectError::Empty)),
                    "flip {byte}:{bit} gave {r:?}"
                );
            }
        }
    }

    #[test]
    fn simulated_concurrent_overwrite_is_detected() {
        // A reader copies the allocation front to back while a writer
        // overwrites it (data first, then header). Model every interleaving:
        // the reader has copied `k` bytes before the writer runs to its
        // `w`-th step, then copies the rest afterwards.
        let cap = 96usize;
        let old = encode(1, &[0xAA; 60]);
        let new = encode(2, &[0x55; 70]);
        let mut mem = HeapMemory::new(cap as u64);
        mem.write(0, &old).unwrap();
        let steps = [(HEADER_LEN, &new[HEADER_LEN..]), (0, &new[..HEADER_LEN])];
        let mut torn_seen = 0;
        for k in 0..=cap {
            for w in 0..=steps.len() {
                let mut m = mem.clone();
                let mut buf = vec![0u8; cap];
                m.read(0, &mut buf[..k]).unwrap();
                for &(at, bytes) in &steps[..w] {
                    m.write(at as u64, bytes).unwrap();
                }
                m.read(k as u64, &mut buf[k..]).unwrap();
                match decode(&buf) {
                    Ok(o) => assert!(
                        (o.version == 1 && o.data == [0xAA; 60])
                            || (o.version == 2 && o.data == [0x55; 70]),
                        "decode returned a mix: k={k} w={w}"
                    ),
                    Err(ObjectError::Torn) => torn_seen += 1,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        }
        assert!(torn_seen > 0, "the model must produce torn reads");
    }

    proptest! {
        #[test]
        fn any_mix_of_two_versions_is_whole_or_torn(
            a in prop::collection::vec(any::<u8>(), 0..200),
            b in prop::collection::vec(any::<u8>(), 0..200),
            cut in 0usize..240,
            cut2 in 0usize..240,
        ) {
            let cap = 240;
            let mut ea = encode(10, &a); ea.resize(cap, 0);
            let mut eb = encode(11, &b); eb.resize(cap, 0);
            let (lo, hi) = (cut.min(cut2), cut.max(cut2));
            // bytes [lo, hi) from b, the rest from a
            let mut mix = ea.clone();
            mix[lo..hi].copy_from_slice(&eb[lo..hi]);
            match decode(&mix) {
                Ok(o) => prop_assert!(
                    (o.version == 10 && o.data == &a[..]) || (o.version == 11 && o.data == &b[..])
                ),
                Err(ObjectError::Torn) => {}
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }

        #[test]
        fn decode_never_panics(buf in prop::collection::vec(any::<u8>(), 0..100)) {
            let _ = decode(&buf);
        }
    }
}
