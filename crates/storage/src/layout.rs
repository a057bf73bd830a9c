//! The on-disk layout of a store: superblock, partition table and
//! per-partition access rights, and their codec. Pure: no I/O here.
//!
//! The first [`META_LEN`] bytes of the device hold the metadata, twice: copy
//! 0 at offset 0 and copy 1 at [`COPY_LEN`]. Each copy is self-contained and
//! checksummed, and carries a generation number. An update writes the next
//! generation over the *older* copy and syncs, so a crash mid-update leaves
//! the other copy intact: readers take the valid copy with the higher
//! generation. Partitions start at or after [`META_LEN`].
//!
//! One copy, little-endian:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 8 | magic `SRDMASTO` |
//! | 8 | 4 | format version ([`VERSION`]) |
//! | 12 | 4 | length `L` of the copy (bytes covered by the CRC) |
//! | 16 | 16 | store id (random at init) |
//! | 32 | 8 | generation |
//! | 40 | 8 | device size the store spans |
//! | 48 | 8 | partition alignment (power of two, >= 4096) |
//! | 56 | 4 | partition count `P` |
//! | 60 | 4 | principal count `Q` |
//! | 64 | 4 | grant count `G` |
//! | 68 | 4 | reserved, 0 |
//! | 72 | 64 x P | partitions: offset u64, size u64, name (32 bytes, NUL-padded), 16 reserved |
//! | .. | 128 x Q | principals: name (64 bytes, NUL-padded), token (32 bytes), 32 reserved |
//! | .. | 12 x G | grants: partition u32, principal u32, rights u8 (1 read, 2 write), 3 reserved |
//! | L | 4 | CRC32c of bytes 0..L |

use serde::Serialize;
use std::fmt;

/// Bytes at the start of the device reserved for the metadata (two copies).
pub const META_LEN: u64 = 1 << 20;
/// Bytes per metadata copy.
pub const COPY_LEN: u64 = META_LEN / 2;
/// Magic at the start of each copy.
pub const MAGIC: &[u8; 8] = b"SRDMASTO";
/// Format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Most partitions in a store.
pub const MAX_PARTITIONS: usize = 1024;
/// Most principals in a store.
pub const MAX_PRINCIPALS: usize = 256;
/// Most grants (partition, principal) in a store.
pub const MAX_GRANTS: usize = 16384;
/// Longest partition name in bytes.
pub const MAX_PART_NAME: usize = 32;
/// Longest principal name in bytes.
pub const MAX_PRINCIPAL_NAME: usize = 64;
/// Smallest (and default minimum) alignment.
pub const MIN_ALIGN: u64 = 4096;
/// Default partition alignment.
pub const DEFAULT_ALIGN: u64 = 1 << 20;

const HEADER: usize = 72;
const PART_REC: usize = 64;
const PRINC_REC: usize = 128;
const GRANT_REC: usize = 12;

/// Access rights of a principal on a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rights(u8);

impl Rights {
    /// No access.
    pub const NONE: Rights = Rights(0);
    /// RDMA Read.
    pub const READ: Rights = Rights(1);
    /// RDMA Write.
    pub const WRITE: Rights = Rights(2);
    /// Both.
    pub const READ_WRITE: Rights = Rights(3);

    /// Whether every right in `other` is in `self`.
    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }
    /// Union.
    pub fn with(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
    /// Difference.
    pub fn without(self, other: Rights) -> Rights {
        Rights(self.0 & !other.0)
    }
    /// Intersection.
    pub fn intersect(self, other: Rights) -> Rights {
        Rights(self.0 & other.0)
    }
    /// No right at all.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The bits (1 read, 2 write), as stored.
    pub fn bits(self) -> u8 {
        self.0
    }
    /// The rights among `b`'s bits, others ignored.
    pub fn from_bits_lossy(b: u8) -> Rights {
        Rights(b & 3)
    }
    fn from_bits(b: u8) -> Option<Rights> {
        (b != 0 && b & !3 == 0).then_some(Rights(b))
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            0 => "-",
            1 => "r",
            2 => "w",
            _ => "rw",
        })
    }
}

impl std::str::FromStr for Rights {
    type Err = String;
    fn from_str(s: &str) -> Result<Rights, String> {
        match s {
            "r" => Ok(Rights::READ),
            "w" => Ok(Rights::WRITE),
            "rw" | "wr" => Ok(Rights::READ_WRITE),
            _ => Err(format!("rights must be r, w or rw, not {s:?}")),
        }
    }
}

impl Serialize for Rights {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// Name (may be empty).
    pub name: String,
    /// Byte offset on the device.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Someone a connecting peer may authenticate as.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal {
    /// Name.
    pub name: String,
    /// The secret a peer presents (in the MPA private data).
    pub token: [u8; 32],
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a token by accident.
        f.debug_struct("Principal")
            .field("name", &self.name)
            .finish()
    }
}

/// A right of a principal on a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Partition index.
    pub partition: u32,
    /// Principal index.
    pub principal: u32,
    /// What it may do.
    pub rights: Rights,
}

/// The whole metadata of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Random at init; tells stores apart.
    pub store_id: [u8; 16],
    /// Bumped by every update.
    pub generation: u64,
    /// Bytes of the device the store spans.
    pub device_size: u64,
    /// Partition alignment.
    pub align: u64,
    /// The partitions, in index order.
    pub partitions: Vec<Partition>,
    /// The principals.
    pub principals: Vec<Principal>,
    /// Who may do what.
    pub grants: Vec<Grant>,
}

/// Why a layout is not acceptable, or metadata cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Alignment not a power of two or below 4096.
    #[error("alignment {0} is not a power of two of at least 4096")]
    BadAlign(u64),
    /// No partitions.
    #[error("a store needs at least one partition")]
    NoPartitions,
    /// Too many of something.
    #[error("too many {what}: {n} (at most {max})")]
    TooMany {
        /// Partitions, principals or grants.
        what: &'static str,
        /// How many.
        n: usize,
        /// Limit.
        max: usize,
    },
    /// A partition of size zero.
    #[error("partition {0} has size 0")]
    Empty(usize),
    /// A partition not on an alignment boundary.
    #[error("partition {index}: offset {offset:#x} or size {size:#x} is not a multiple of the alignment {align:#x}")]
    Misaligned {
        /// Index.
        index: usize,
        /// Offset.
        offset: u64,
        /// Size.
        size: u64,
        /// Alignment.
        align: u64,
    },
    /// A partition inside the metadata area.
    #[error("partition {index} starts at {offset:#x}, inside the metadata area (the first {META_LEN:#x} bytes)")]
    InMetadata {
        /// Index.
        index: usize,
        /// Offset.
        offset: u64,
    },
    /// A partition past the end of the device.
    #[error(
        "partition {index} ends at {end:#x}, past the end of the store ({device_size:#x} bytes)"
    )]
    PastEnd {
        /// Index.
        index: usize,
        /// End offset.
        end: u64,
        /// Device size.
        device_size: u64,
    },
    /// Two partitions share bytes.
    #[error("partitions {a} and {b} overlap")]
    Overlap {
        /// One.
        a: usize,
        /// The other.
        b: usize,
    },
    /// A name too long or with a NUL.
    #[error("name {0:?} is too long or contains NUL")]
    BadName(String),
    /// Two partitions or principals with one name.
    #[error("duplicate name {0:?}")]
    DuplicateName(String),
    /// A grant naming something that does not exist, or granting nothing.
    #[error("grant {0} is invalid")]
    BadGrant(usize),
    /// A partition other than the last asked for "the rest".
    #[error("partition {0}: only the last partition may be `rest`")]
    RestNotLast(usize),
    /// Store smaller than the metadata area plus one aligned partition.
    #[error("store size {size} is too small (the metadata alone takes {META_LEN} bytes)")]
    TooSmall {
        /// Size.
        size: u64,
    },
    /// Neither metadata copy starts with the magic: not a softrdma store.
    #[error("not a softrdma store (no superblock magic): a foreign or uninitialised device")]
    Foreign,
    /// A copy has the magic but fails its checksum or structure, and no
    /// other copy is valid.
    #[error("corrupt superblock: {0}")]
    Corrupt(String),
    /// A version this code does not read.
    #[error("store format version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
}

impl Layout {
    /// Checks every rule of a valid layout.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if !self.align.is_power_of_two() || self.align < MIN_ALIGN {
            return Err(LayoutError::BadAlign(self.align));
        }
        if self.device_size < META_LEN + self.align {
            return Err(LayoutError::TooSmall {
                size: self.device_size,
            });
        }
        let too_many = |what, n, max| {
            if n > max {
                Err(LayoutError::TooMany { what, n, max })
            } else {
                Ok(())
            }
        };
        too_many("partitions", self.partitions.len(), MAX_PARTITIONS)?;
        too_many("principals", self.principals.len(), MAX_PRINCIPALS)?;
        too_many("grants", self.grants.len(), MAX_GRANTS)?;
        if self.partitions.is_empty() {
            return Err(LayoutError::NoPartitions);
        }
        for (i, p) in self.partitions.iter().enumerate() {
            check_name(&p.name, MAX_PART_NAME)?;
            if p.size == 0 {
                return Err(LayoutError::Empty(i));
            }
            if p.offset % self.align != 0 || p.size % self.align != 0 {
                return Err(LayoutError::Misaligned {
                    index: i,
                    offset: p.offset,
                    size: p.size,
                    align: self.align,
                });
            }
            if p.offset < META_LEN {
                return Err(LayoutError::InMetadata {
                    index: i,
                    offset: p.offset,
                });
            }
            let end = p.offset.saturating_add(p.size);
            if end > self.device_size {
                return Err(LayoutError::PastEnd {
                    index: i,
                    end,
                    device_size: self.device_size,
                });
            }
        }
        let mut by_offset: Vec<usize> = (0..self.partitions.len()).collect();
        by_offset.sort_by_key(|&i| self.partitions[i].offset);
        for w in by_offset.windows(2) {
            let (a, b) = (&self.partitions[w[0]], &self.partitions[w[1]]);
            if a.offset + a.size > b.offset {
                let (x, y) = (w[0].min(w[1]), w[0].max(w[1]));
                return Err(LayoutError::Overlap { a: x, b: y });
            }
        }
        unique(
            self.partitions
                .iter()
                .map(|p| p.name.as_str())
                .filter(|n| !n.is_empty()),
        )?;
        for p in &self.principals {
            check_name(&p.name, MAX_PRINCIPAL_NAME)?;
            if p.name.is_empty() {
                return Err(LayoutError::BadName(String::new()));
            }
        }
        unique(self.principals.iter().map(|p| p.name.as_str()))?;
        let mut seen = std::collections::HashSet::new();
        for (i, g) in self.grants.iter().enumerate() {
            if g.partition as usize >= self.partitions.len()
                || g.principal as usize >= self.principals.len()
                || g.rights.is_empty()
                || !seen.insert((g.partition, g.principal))
            {
                return Err(LayoutError::BadGrant(i));
            }
        }
        Ok(())
    }

    /// What `principal` (an index) may do on `partition`.
    pub fn rights(&self, partition: u32, principal: u32) -> Rights {
        self.grants
            .iter()
            .find(|g| g.partition == partition && g.principal == principal)
            .map_or(Rights::NONE, |g| g.rights)
    }

    /// The principal whose token this is (compared in constant time).
    pub fn authenticate(&self, token: &[u8]) -> Option<u32> {
        let mut found = None;
        for (i, p) in self.principals.iter().enumerate() {
            let mut diff = (token.len() ^ p.token.len()) as u8;
            for (a, b) in token.iter().zip(p.token.iter()) {
                diff |= a ^ b;
            }
            if diff == 0 && found.is_none() {
                found = Some(i as u32);
            }
        }
        found
    }

    /// Index of the principal named `name`.
    pub fn principal(&self, name: &str) -> Option<u32> {
        self.principals
            .iter()
            .position(|p| p.name == name)
            .map(|i| i as u32)
    }

    /// Encodes one metadata copy (exactly [`COPY_LEN`] bytes, zero-padded).
    /// The layout must be valid.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.validate(), Ok(()));
        let mut b = Vec::with_capacity(COPY_LEN as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // length, patched below
        b.extend_from_slice(&self.store_id);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.device_size.to_le_bytes());
        b.extend_from_slice(&self.align.to_le_bytes());
        b.extend_from_slice(&(self.partitions.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.principals.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.grants.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(b.len(), HEADER);
        for p in &self.partitions {
            b.extend_from_slice(&p.offset.to_le_bytes());
            b.extend_from_slice(&p.size.to_le_bytes());
            put_name(&mut b, &p.name, MAX_PART_NAME);
            b.extend_from_slice(&[0; 16]);
        }
        for p in &self.principals {
            put_name(&mut b, &p.name, MAX_PRINCIPAL_NAME);
            b.extend_from_slice(&p.token);
            b.extend_from_slice(&[0; 32]);
        }
        for g in &self.grants {
            b.extend_from_slice(&g.partition.to_le_bytes());
            b.extend_from_slice(&g.principal.to_le_bytes());
            b.push(g.rights.0);
            b.extend_from_slice(&[0; 3]);
        }
        let len = b.len() as u32;
        b[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        assert!(
            b.len() as u64 <= COPY_LEN,
            "limits keep a copy within COPY_LEN"
        );
        b.resize(COPY_LEN as usize, 0);
        b
    }

    /// Decodes one copy. `Foreign` if the magic is missing.
    pub fn decode(b: &[u8]) -> Result<Layout, LayoutError> {
        if b.len() < HEADER + 4 || &b[..8] != MAGIC {
            return Err(LayoutError::Foreign);
        }
        let version = u32le(b, 8);
        if version != VERSION {
            return Err(LayoutError::Version(version));
        }
        let len = u32le(b, 12) as usize;
        if len < HEADER || len + 4 > b.len() || len as u64 + 4 > COPY_LEN {
            return Err(LayoutError::Corrupt(format!("length {len} out of range")));
        }
        let crc = u32le(b, len);
        if crc32c::crc32c(&b[..len]) != crc {
            return Err(LayoutError::Corrupt("checksum mismatch".into()));
        }
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(&b[16..32]);
        let (np, nq, ng) = (
            u32le(b, 56) as usize,
            u32le(b, 60) as usize,
            u32le(b, 64) as usize,
        );
        let want = HEADER
            .checked_add(np.saturating_mul(PART_REC))
            .and_then(|x| x.checked_add(nq.saturating_mul(PRINC_REC)))
            .and_then(|x| x.checked_add(ng.saturating_mul(GRANT_REC)));
        if want != Some(len) {
            return Err(LayoutError::Corrupt(format!(
                "counts ({np} partitions, {nq} principals, {ng} grants) do not match the length {len}"
            )));
        }
        let mut at = HEADER;
        let mut partitions = Vec::with_capacity(np);
        for _ in 0..np {
            partitions.push(Partition {
                offset: u64le(b, at),
                size: u64le(b, at + 8),
                name: get_name(&b[at + 16..at + 16 + MAX_PART_NAME])?,
            });
            at += PART_REC;
        }
        let mut principals = Vec::with_capacity(nq);
        for _ in 0..nq {
            let mut token = [0u8; 32];
            token.copy_from_slice(&b[at + 64..at + 96]);
            principals.push(Principal {
                name: get_name(&b[at..at + MAX_PRINCIPAL_NAME])?,
                token,
            });
            at += PRINC_REC;
        }
        let mut grants = Vec::with_capacity(ng);
        for i in 0..ng {
            grants.push(Grant {
                partition: u32le(b, at),
                principal: u32le(b, at + 4),
                rights: Rights::from_bits(b[at + 8]).ok_or(LayoutError::BadGrant(i))?,
            });
            at += GRANT_REC;
        }
        let l = Layout {
            store_id,
            generation: u64le(b, 32),
            device_size: u64le(b, 40),
            align: u64le(b, 48),
            partitions,
            principals,
            grants,
        };
        l.validate()
            .map_err(|e| LayoutError::Corrupt(format!("checksum good but layout invalid: {e}")))?;
        Ok(l)
    }

    /// Picks the metadata from the two copies at the start of a device
    /// (`meta`: its first [`META_LEN`] bytes, or fewer if the device is
    /// smaller): the valid copy with the higher generation. Also returns
    /// which copies were damaged (had the magic but did not decode).
    pub fn read(meta: &[u8]) -> Result<(Layout, Vec<usize>), LayoutError> {
        let copy = |i: usize| {
            let start = i * COPY_LEN as usize;
            let end = (start + COPY_LEN as usize).min(meta.len());
            if start >= meta.len() {
                Err(LayoutError::Foreign)
            } else {
                Layout::decode(&meta[start..end])
            }
        };
        let (a, b) = (copy(0), copy(1));
        let damaged: Vec<usize> = [&a, &b]
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(e) if *e != LayoutError::Foreign))
            .map(|(i, _)| i)
            .collect();
        match (a, b) {
            (Ok(x), Ok(y)) => Ok((if y.generation > x.generation { y } else { x }, damaged)),
            (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok((x, damaged)),
            (Err(LayoutError::Foreign), Err(LayoutError::Foreign)) => Err(LayoutError::Foreign),
            (Err(e @ LayoutError::Version(_)), _) | (_, Err(e @ LayoutError::Version(_))) => Err(e),
            (Err(e), Err(LayoutError::Foreign)) | (Err(LayoutError::Foreign), Err(e)) => Err(e),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// The copy (0 or 1) that holds `generation`: copies alternate by
    /// generation parity, so writing generation g + 1 overwrites the copy
    /// older than g and leaves g intact.
    pub fn slot(generation: u64) -> u64 {
        generation % 2
    }
}

fn check_name(n: &str, max: usize) -> Result<(), LayoutError> {
    if n.len() > max || n.contains('\0') {
        return Err(LayoutError::BadName(n.to_string()));
    }
    Ok(())
}

fn unique<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), LayoutError> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(LayoutError::DuplicateName(n.to_string()));
        }
    }
    Ok(())
}

fn put_name(b: &mut Vec<u8>, name: &str, width: usize) {
    let start = b.len();
    b.extend_from_slice(name.as_bytes());
    b.resize(start + width, 0);
}

fn get_name(b: &[u8]) -> Result<String, LayoutError> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    if b[end..].iter().any(|&c| c != 0) {
        return Err(LayoutError::Corrupt(
            "name field has bytes after its NUL".into(),
        ));
    }
    String::from_utf8(b[..end].to_vec())
        .map_err(|_| LayoutError::Corrupt("name is not UTF-8".into()))
}

fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64le(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Layout {
        Layout {
            store_id: [7; 16],
            generation: 3,
            device_size: 64 << 20,
            align: 1 << 20,
            partitions: vec![
                Partition {
                    name: "logs".into(),
                    offset: 1 << 20,
                    size: 16 << 20,
                },
                Partition {
                    name: String::new(),
                    offset: 17 << 20,
                    size: 47 << 20,
                },
            ],
            principals: vec![Principal {
                name: "alice".into(),
                token: [9; 32],
            }],
            grants: vec![Grant {
                partition: 1,
                principal: 0,
                rights: Rights::READ,
            }],
        }
    }

    #[test]
    fn round_trip_and_rights() {
        let l = sample();
        let b = l.encode();
        assert_eq!(b.len() as u64, COPY_LEN);
        assert_eq!(Layout::decode(&b).unwrap(), l);
        assert_eq!(l.rights(1, 0), Rights::READ);
        assert_eq!(l.rights(0, 0), Rights::NONE);
        assert_eq!(l.authenticate(&[9; 32]), Some(0));
        assert_eq!(l.authenticate(&[9; 31]), None);
        assert_eq!(l.authenticate(&[8; 32]), None);
    }

    #[test]
    fn invalid_layouts_are_named() {
        let mut l = sample();
        l.partitions[1].offset = 16 << 20;
        assert_eq!(l.validate(), Err(LayoutError::Overlap { a: 0, b: 1 }));
        let mut l = sample();
        l.partitions[0].offset += 4096;
        assert!(matches!(
            l.validate(),
            Err(LayoutError::Misaligned { index: 0, .. })
        ));
        let mut l = sample();
        l.partitions[1].size += 1 << 20;
        assert!(matches!(
            l.validate(),
            Err(LayoutError::PastEnd { index: 1, .. })
        ));
        let mut l = sample();
        l.partitions[0].offset = 0;
        assert!(matches!(
            l.validate(),
            Err(LayoutError::InMetadata { index: 0, .. })
        ));
        let mut l = sample();
        l.align = 3000;
        assert_eq!(l.validate(), Err(LayoutError::BadAlign(3000)));
        let mut l = sample();
        l.grants.push(l.grants[0]);
        assert_eq!(l.validate(), Err(LayoutError::BadGrant(1)));
        let mut l = sample();
        l.partitions[1].name = "logs".into();
        assert_eq!(l.validate(), Err(LayoutError::DuplicateName("logs".into())));
    }

    #[test]
    fn newer_valid_copy_wins_and_damage_is_reported() {
        let mut old = sample();
        old.generation = 4;
        let mut new = sample();
        new.generation = 5;
        new.grants[0].rights = Rights::READ_WRITE;
        let mut meta = old.encode();
        meta.extend(new.encode());
        let (l, damaged) = Layout::read(&meta).unwrap();
        assert_eq!((l.generation, damaged.len()), (5, 0));
        // Tear the newer copy: the older one is used, the damage reported.
        meta[COPY_LEN as usize + 100] ^= 1;
        let (l, damaged) = Layout::read(&meta).unwrap();
        assert_eq!((l.generation, damaged), (4, vec![1]));
        // Both torn: corrupt.
        meta[100] ^= 1;
        assert!(matches!(Layout::read(&meta), Err(LayoutError::Corrupt(_))));
        // Nothing of ours: foreign.
        assert_eq!(
            Layout::read(&vec![0xab; META_LEN as usize]).unwrap_err(),
            LayoutError::Foreign
        );
    }

    proptest! {
        /// Any single-byte change inside the checksummed part of a copy is
        /// rejected (never silently accepted as another layout).
        #[test]
        fn any_flip_is_detected(at in 0usize..(HEADER + 2 * PART_REC + PRINC_REC + GRANT_REC + 4), x in 1u8..=255) {
            let l = sample();
            let mut b = l.encode();
            b[at] ^= x;
            prop_assert!(Layout::decode(&b).is_err());
        }

        /// Decoding arbitrary bytes never panics.
        #[test]
        fn garbage_never_panics(mut b in prop::collection::vec(any::<u8>(), 0..2048), magic in any::<bool>()) {
            if magic && b.len() >= 16 {
                b[..8].copy_from_slice(MAGIC);
                b[8..12].copy_from_slice(&VERSION.to_le_bytes());
            }
            let _ = Layout::decode(&b);
        }
    }
}
