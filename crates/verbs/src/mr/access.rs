//! Access rights of a memory region (`IBV_ACCESS_*`).

/// Access rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(pub u32);

impl Access {
    /// Local read: always granted (the zero flag).
    pub const LOCAL_READ: Access = Access(0);
    /// The engine may write into the region locally (receives, Read responses, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA Write into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA Read from the region.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run RFC 7306 atomics on the region.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Everything.
    pub const ALL: Access = Access(15);

    /// Whether every right in `other` is also in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}
