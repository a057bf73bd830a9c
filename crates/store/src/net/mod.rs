//! The store on the verbs engine: links, the node server and the client.
//!
//! * [`link`]: one store message per RDMA Send on an RC queue pair, with a
//!   receiver thread per endpoint and one-sided RDMA Reads.
//! * [`server`]: `softrdma store serve`, the node runtime around
//!   [`crate::node::Node`].
//! * [`client`]: the client library (`insert`, `update`, `read`, `delete`),
//!   with failover and one-sided reads.
//!
//! Connection private data (the rdma_cm-style handshake) says who connects:
//! `SRN1 | node u32 | incarnation u64 | group` for a node, `SRC1 | client
//! u64` for a client. The acceptor answers `SRA1 | node u32 | arena base u64
//! | arena len u64 | STag u32` (all little-endian; STag 0: no arena yet), so
//! a client learns each node's id and the arena, and a joining node learns
//! the group's arena address and STag from the primary.

pub mod client;
pub mod link;
pub mod resp;
pub mod server;

use std::time::Duration;

use crate::proto::{Member, NodeId};
use crate::ptr::ArenaRef;

/// Time allowed for one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// A node's introduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHello {
    /// The node.
    pub member: Member,
    /// Its group.
    pub group: String,
}

/// Who connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A node of the group.
    Node(NodeHello),
    /// A client with this id.
    Client(u64),
}

impl Hello {
    /// Private data for the connect request.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            Hello::Node(h) => {
                v.extend_from_slice(b"SRN1");
                v.extend_from_slice(&h.member.node.to_le_bytes());
                v.extend_from_slice(&h.member.incarnation.to_le_bytes());
                v.extend_from_slice(h.group.as_bytes());
            }
            Hello::Client(c) => {
                v.extend_from_slice(b"SRC1");
                v.extend_from_slice(&c.to_le_bytes());
            }
        }
        v
    }
}

/// Parses connect private data.
pub fn decode_hello(b: &[u8]) -> Option<Hello> {
    match b.get(..4)? {
        b"SRN1" if b.len() >= 16 => Some(Hello::Node(NodeHello {
            member: Member {
                node: u32::from_le_bytes(b[4..8].try_into().ok()?),
                incarnation: u64::from_le_bytes(b[8..16].try_into().ok()?),
            },
            group: String::from_utf8(b[16..].to_vec()).ok()?,
        })),
        b"SRC1" if b.len() == 12 => {
            Some(Hello::Client(u64::from_le_bytes(b[4..12].try_into().ok()?)))
        }
        _ => None,
    }
}

/// Accept-reply private data.
pub fn encode_accept(node: NodeId, arena: Option<ArenaRef>) -> Vec<u8> {
    let mut v = b"SRA1".to_vec();
    v.extend_from_slice(&node.to_le_bytes());
    let a = arena.unwrap_or(ArenaRef {
        base: 0,
        len: 0,
        stag: 0,
    });
    v.extend_from_slice(&a.base.to_le_bytes());
    v.extend_from_slice(&a.len.to_le_bytes());
    v.extend_from_slice(&a.stag.to_le_bytes());
    v
}

/// Parses accept-reply private data: the node id and its arena, if any.
pub fn parse_accept(b: &[u8]) -> Option<(NodeId, Option<ArenaRef>)> {
    if b.len() != 28 || &b[..4] != b"SRA1" {
        return None;
    }
    let node = u32::from_le_bytes(b[4..8].try_into().ok()?);
    let base = u64::from_le_bytes(b[8..16].try_into().ok()?);
    let len = u64::from_le_bytes(b[16..24].try_into().ok()?);
    let stag = u32::from_le_bytes(b[24..28].try_into().ok()?);
    Some((node, (stag != 0).then_some(ArenaRef { base, len, stag })))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_accept_round_trip() {
        let h = Hello::Node(NodeHello {
            member: Member {
                node: 7,
                incarnation: 99,
            },
            group: "g1".into(),
        });
        assert_eq!(decode_hello(&h.encode()), Some(h));
        let c = Hello::Client(0xdead_beef_0102);
        assert_eq!(decode_hello(&c.encode()), Some(c));
        assert_eq!(decode_hello(b"SRX1...."), None);
        assert_eq!(decode_hello(b"SRC1abc"), None);
        let a = ArenaRef {
            base: 0x7e00_0000_0000,
            len: 1 << 20,
            stag: 0x8000_0112,
        };
        assert_eq!(parse_accept(&encode_accept(3, Some(a))), Some((3, Some(a))));
        assert_eq!(parse_accept(&encode_accept(3, None)), Some((3, None)));
        assert_eq!(parse_accept(b"SRA1"), None);
    }
}
