//! STags (RFC 5040 section 2.2: the Steering Tag naming a registered
//! buffer), built and taken apart in one place.

/// An STag: a 24-bit index into the device's STag table and an 8-bit key
/// chosen by the consumer (`index << 8 | key`). The local key and the
/// remote key of a region are the same STag; the API hands them out as
/// [`Lkey`] and [`Rkey`] (so that one passed where the other belongs does
/// not compile), and this type is how the engine builds and takes them
/// apart, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stag(u32);

impl Stag {
    /// The largest index (24 bits).
    pub const MAX_INDEX: u32 = (1 << 24) - 1;

    /// The STag of table index `index` (at most [`Stag::MAX_INDEX`]) with
    /// key `key`.
    pub fn new(index: u32, key: u8) -> Stag {
        assert!(
            index <= Stag::MAX_INDEX,
            "STag index {index:#x} over 24 bits"
        );
        Stag(index << 8 | key as u32)
    }
    /// An STag as it travels (an lkey, an rkey, a wire field).
    pub const fn from_raw(raw: u32) -> Stag {
        Stag(raw)
    }
    /// The 32-bit value (as an lkey, an rkey or a wire field).
    pub const fn raw(self) -> u32 {
        self.0
    }
    /// The 24-bit index into the device's STag table.
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }
    /// The 8-bit key chosen by the consumer.
    pub const fn key(self) -> u8 {
        self.0 as u8
    }
}

impl std::fmt::Display for Stag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

macro_rules! key_type {
    ($(#[$m:meta])* $name:ident, $fmt:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(u32);

        impl $name {
            /// The value as it travels (a wire field, a message of the
            /// application's own protocol).
            pub const fn from_raw(raw: u32) -> $name {
                $name(raw)
            }
            /// The value to put on the wire.
            pub const fn raw(self) -> u32 {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, $fmt, self.0)
            }
        }

        impl std::fmt::LowerHex for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

key_type!(
    /// A local key: names one of this device's registered regions in an
    /// SGE ([`crate::MemoryRegion::lkey`]).
    Lkey,
    "{:#010x}"
);

key_type!(
    /// A remote key: names a region of the peer's (or, for invalidation
    /// and one-shot, one of ours as the peer names it) in RDMA Writes,
    /// Reads, atomics and invalidations ([`crate::MemoryRegion::rkey`]).
    Rkey,
    "{:#010x}"
);

key_type!(
    /// A queue pair number ([`crate::QueuePair::qp_num`]).
    Qpn,
    "{}"
);

impl Lkey {
    /// The STag behind the key.
    pub const fn stag(self) -> Stag {
        Stag(self.0)
    }
}

impl Rkey {
    /// The STag behind the key.
    pub const fn stag(self) -> Stag {
        Stag(self.0)
    }
}

impl Stag {
    /// This STag as a local key.
    pub const fn lkey(self) -> Lkey {
        Lkey(self.0)
    }
    /// This STag as a remote key.
    pub const fn rkey(self) -> Rkey {
        Rkey(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stags_split_into_index_and_key() {
        let s = Stag::new(0x12_3456, 0x78);
        assert_eq!(s.raw(), 0x1234_5678);
        assert_eq!((s.index(), s.key()), (0x12_3456, 0x78));
        assert_eq!(Stag::from_raw(0x1234_5678), s);
        assert_eq!(s.to_string(), "0x12345678");
    }

    #[test]
    #[should_panic(expected = "over 24 bits")]
    fn an_index_over_24_bits_is_refused() {
        Stag::new(1 << 24, 0);
    }
}
