//! Remote pointers.
//!
//! A [`RemotePtr`] names one object in a replica group's arena:
//!
//! * `addr`: the virtual address of the object's header. All nodes of a group
//!   map the arena at the same address, so `addr` is valid on each of them.
//! * `stag`: the STag (RDMA access key) under which the arena was registered
//!   when the pointer was made; all nodes register under the same STag. Its
//!   index (upper 24 bits) names the arena; its key byte (low 8 bits)
//!   changes when the group rotates the STag (credentials narrowed: issue
//!   29), so a pointer stays valid across a rotation and a reader uses the
//!   arena's current STag, which only an admitted client learns.
//! * `len`: the length of the **allocation** (header included, a multiple of
//!   64), not of the data. A one-sided RDMA Read of `len` bytes at `addr`
//!   always covers the whole object, even after an in-place update made it
//!   longer, and an in-place update keeps the pointer unchanged. The data
//!   length is in the object header.
//! * `gen`: the object's generation (its header carries it): the sequence
//!   number of the write that created the object, kept by in-place
//!   updates. Once the object is deleted and its space reused, the new
//!   object has another generation, so a stale pointer is refused with
//!   `Stale` by the node (update, delete, read) and by a one-sided reader,
//!   and never reaches the new owner's object (issue 29, finding 3).
//!
//! Binary form (24 bytes, little-endian): `addr u64, stag u32, len u32,
//! gen u64`. Text form: `0x7f00_0000_1000:0x00012345:4096:17`, i.e.
//! address in hex (underscores every 4 digits), STag as 8 hex digits,
//! length and generation in decimal.
//! [`RemotePtr::from_str`](std::str::FromStr) accepts underscores anywhere and
//! the `0x` prefixes as optional.

use std::fmt;
use std::str::FromStr;

use crate::alloc::Allocator;

/// Length of the binary encoding.
pub const ENCODED_LEN: usize = 24;

/// A pointer to an object in a group's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemotePtr {
    /// Virtual address of the object header.
    pub addr: u64,
    /// STag of the arena registration.
    pub stag: u32,
    /// Allocation length in bytes (header included).
    pub len: u32,
    /// The object's generation (its header's).
    pub gen: u64,
}

/// The arena a pointer must point into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaRef {
    /// Virtual address of the arena's first byte.
    pub base: u64,
    /// Arena length.
    pub len: u64,
    /// The arena's STag.
    pub stag: u32,
}

/// Why a pointer was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtrError {
    /// The STag is not this arena's.
    #[error("wrong STag {got:#010x} (this arena's STag is {expected:#010x})")]
    WrongStag {
        /// STag in the pointer.
        got: u32,
        /// The arena's STag.
        expected: u32,
    },
    /// The range lies (partly) outside the arena.
    #[error("pointer {addr:#x}+{len} lies outside the arena {base:#x}+{arena_len}")]
    OutOfArena {
        /// Pointer address.
        addr: u64,
        /// Pointer length.
        len: u32,
        /// Arena base.
        base: u64,
        /// Arena length.
        arena_len: u64,
    },
    /// Nothing is allocated there (any more).
    #[error("pointer {addr:#x} refers to freed space")]
    Freed {
        /// Pointer address.
        addr: u64,
    },
    /// Not the start of an allocation, or the length differs.
    #[error("pointer {addr:#x}+{len} does not match an allocation")]
    NotAllocated {
        /// Pointer address.
        addr: u64,
        /// Pointer length.
        len: u32,
    },
    /// Text or binary form malformed.
    #[error("malformed remote pointer: {0}")]
    Parse(String),
}

impl RemotePtr {
    /// The binary form.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut b = [0u8; ENCODED_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.stag.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.gen.to_le_bytes());
        b
    }

    /// Parses the binary form.
    pub fn decode(b: &[u8]) -> Result<RemotePtr, PtrError> {
        if b.len() != ENCODED_LEN {
            return Err(PtrError::Parse(format!(
                "binary pointer must be {ENCODED_LEN} bytes, got {}",
                b.len()
            )));
        }
        Ok(RemotePtr {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            stag: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            len: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            gen: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        })
    }

    /// Checks the pointer against an arena and its allocator; returns the
    /// offset of the object in the arena. Checks, in order: STag, range,
    /// allocation (freed space and non-matching ranges are told apart).
    pub fn validate(&self, arena: &ArenaRef, alloc: &Allocator) -> Result<u64, PtrError> {
        if !same_arena(self.stag, arena.stag) {
            return Err(PtrError::WrongStag {
                got: self.stag,
                expected: arena.stag,
            });
        }
        let inside = self.addr >= arena.base
            && self
                .addr
                .checked_add(self.len as u64)
                .is_some_and(|end| end <= arena.base + arena.len);
        if !inside || self.len == 0 {
            return Err(PtrError::OutOfArena {
                addr: self.addr,
                len: self.len,
                base: arena.base,
                arena_len: arena.len,
            });
        }
        let offset = self.addr - arena.base;
        match alloc.allocation_at(offset) {
            Some(l) if l == self.len as u64 => Ok(offset),
            None if alloc.was_freed(offset) => Err(PtrError::Freed { addr: self.addr }),
            _ => Err(PtrError::NotAllocated {
                addr: self.addr,
                len: self.len,
            }),
        }
    }
}

/// Whether two STags name the same arena: the same index, whatever key
/// byte a rotation gave it.
pub fn same_arena(a: u32, b: u32) -> bool {
    a >> 8 == b >> 8
}

fn hex_grouped(v: u64) -> String {
    let digits = format!("{v:x}");
    let mut out = String::with_capacity(digits.len() + digits.len() / 4);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 4 == 0 {
            out.push('_');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for RemotePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "0x{}:{:#010x}:{}:{}",
            hex_grouped(self.addr),
            self.stag,
            self.len,
            self.gen
        )
    }
}

fn parse_hex(s: &str, what: &str) -> Result<u64, PtrError> {
    let t: String = s.chars().filter(|&c| c != '_').collect();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(&t);
    if t.is_empty() {
        return Err(PtrError::Parse(format!("empty {what}")));
    }
    u64::from_str_radix(t, 16).map_err(|e| PtrError::Parse(format!("{what} {s:?}: {e}")))
}

impl FromStr for RemotePtr {
    type Err = PtrError;

    fn from_str(s: &str) -> Result<RemotePtr, PtrError> {
        let parts: Vec<&str> = s.trim().split(':').collect();
        let [addr, stag, len, gen] = parts[..] else {
            return Err(PtrError::Parse(format!(
                "expected ADDR:STAG:LEN:GENERATION (e.g. 0x7f00_0000_1000:0x00012345:4096:17), \
                 got {s:?}"
            )));
        };
        let addr = parse_hex(addr, "address")?;
        let stag = parse_hex(stag, "STag")?;
        let stag = u32::try_from(stag)
            .map_err(|_| PtrError::Parse(format!("STag {stag:#x} exceeds 32 bits")))?;
        let len_clean: String = len.chars().filter(|&c| c != '_').collect();
        let len = len_clean
            .parse::<u32>()
            .map_err(|e| PtrError::Parse(format!("length {len:?}: {e}")))?;
        let gen_clean: String = gen.chars().filter(|&c| c != '_').collect();
        let gen = gen_clean
            .parse::<u64>()
            .map_err(|e| PtrError::Parse(format!("generation {gen:?}: {e}")))?;
        Ok(RemotePtr {
            addr,
            stag,
            len,
            gen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_form() {
        let p = RemotePtr {
            addr: 0x7f00_0000_1000,
            stag: 0x12345,
            len: 4096,
            gen: 17,
        };
        assert_eq!(p.to_string(), "0x7f00_0000_1000:0x00012345:4096:17");
        assert_eq!(
            "0x7f0000001000:0x00012345:4096:17".parse::<RemotePtr>(),
            Ok(p)
        );
        assert_eq!("7f00_0000_1000:12345:4_096:1_7".parse::<RemotePtr>(), Ok(p));
        for bad in [
            "",
            "1:2",
            "1:2:3",
            "1:2:3:4:5",
            "zz:1:1:1",
            "1:1_0000_0000:1:1",
            "1:1:-1:1",
            "1:1:1:-1",
            "0x:1:1:1",
        ] {
            assert!(
                matches!(bad.parse::<RemotePtr>(), Err(PtrError::Parse(_))),
                "{bad:?}"
            );
        }
        assert!(RemotePtr::decode(&[0; 23]).is_err());
    }

    #[test]
    fn validation_errors_are_distinct() {
        let arena = ArenaRef {
            base: 0x1000_0000,
            len: 4096,
            stag: 0xabcd_ef01,
        };
        let mut alloc = Allocator::new(4096);
        let off = alloc.alloc(100).unwrap();
        let good = RemotePtr {
            addr: arena.base + off,
            stag: arena.stag,
            len: 128,
            gen: 1,
        };
        assert_eq!(good.validate(&arena, &alloc), Ok(off));
        // A rotated STag (same index, another key) names the same arena.
        let rotated = RemotePtr {
            stag: arena.stag ^ 0xff,
            ..good
        };
        assert_eq!(rotated.validate(&arena, &alloc), Ok(off));
        let wrong_stag = RemotePtr { stag: 1, ..good };
        assert!(matches!(
            wrong_stag.validate(&arena, &alloc),
            Err(PtrError::WrongStag { got: 1, .. })
        ));
        for addr in [arena.base - 64, arena.base + 4096 - 64, u64::MAX - 10] {
            let p = RemotePtr { addr, ..good };
            assert!(matches!(
                p.validate(&arena, &alloc),
                Err(PtrError::OutOfArena { .. })
            ));
        }
        let wrong_len = RemotePtr { len: 64, ..good };
        assert!(matches!(
            wrong_len.validate(&arena, &alloc),
            Err(PtrError::NotAllocated { .. })
        ));
        let inside = RemotePtr {
            addr: good.addr + 64,
            len: 64,
            ..good
        };
        assert!(matches!(
            inside.validate(&arena, &alloc),
            Err(PtrError::NotAllocated { .. })
        ));
        alloc.free(off).unwrap();
        assert_eq!(
            good.validate(&arena, &alloc),
            Err(PtrError::Freed { addr: good.addr })
        );
        // Messages are clear.
        assert!(wrong_stag
            .validate(&arena, &alloc)
            .unwrap_err()
            .to_string()
            .contains("wrong STag"));
    }

    proptest! {
        #[test]
        fn encodings_round_trip(addr in any::<u64>(), stag in any::<u32>(), len in any::<u32>(), gen in any::<u64>()) {
            let p = RemotePtr { addr, stag, len, gen };
            prop_assert_eq!(RemotePtr::decode(&p.encode()), Ok(p));
            prop_assert_eq!(p.to_string().parse::<RemotePtr>(), Ok(p));
        }

        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = s.parse::<RemotePtr>();
        }
    }
}
