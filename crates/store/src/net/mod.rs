//! The store on the verbs engine: links, the node server and the client.
//!
//! * [`link`]: one store message per RDMA Send on an RC queue pair, with a
//!   receiver thread per endpoint and one-sided RDMA Reads.
//! * [`server`]: `softrdma store serve`, the node runtime around
//!   [`crate::node::Node`].
//! * [`client`]: the client library (`insert`, `update`, `read`, `delete`),
//!   with failover and one-sided reads.
//! * [`handshake`]: connection private data (who connects, the proofs of
//!   the group's credentials); a client learns each node's id and the
//!   arena, and a joining node the group's arena address and STag, from
//!   the accept reply.

pub mod client;
pub mod handshake;
pub mod link;
pub mod resp;
pub mod server;

use std::time::Duration;

/// Time allowed for one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// 64 random bits from the kernel.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is valid for 8 bytes of writes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if n != 8 {
        // Fall back to the clock (never expected on Linux).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
    }
    u64::from_le_bytes(b)
}
