//! The bench's own session set-up, carried in MPA private data.
//!
//! Connect (client -> server), 64 bytes, big-endian:
//! ```text
//!  0  magic "SRBENCH1"        8
//!  8  test                    1   (Test as u8)
//!  9  flags                   1   (bit 0: busy-poll)
//! 10  reserved                2
//! 12  depth                   4   (outstanding WRs per QP)
//! 16  size                    8   (message size in bytes)
//! 24  iters                   8   (latency tests: round trips)
//! 32  client buffer address   8   (write_lat: where the server writes)
//! 40  client buffer rkey      4
//! 44  client buffer length    4
//! 48  session id              8   (groups the QPs of one run)
//! 56  qp index, qp count      4 + 4
//! ```
//! Accept (server -> client), 32 bytes:
//! ```text
//!  0  magic "SRBENCH1"        8
//!  8  server buffer address   8
//! 16  server buffer rkey      4
//! 20  server buffer length    4
//! 24  receive credits         4   (send_bw: receives the server keeps posted)
//! 28  TCP baseline port       2
//! 30  reserved                2
//! ```
//! Anything else in a connect request is not ours (perftest, see
//! `perftest.rs`).

use anyhow::{bail, Result};

pub const MAGIC: &[u8; 8] = b"SRBENCH1";

/// The benchmarks (`--test`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[clap(rename_all = "snake_case")]
pub enum Test {
    WriteBw,
    ReadBw,
    SendBw,
    WriteLat,
    ReadLat,
    SendLat,
    AtomicLat,
    /// Many idle connected QPs: resident memory and idle CPU.
    IdleQps,
}

impl Test {
    pub const ALL: [Test; 8] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::AtomicLat,
        Test::IdleQps,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::AtomicLat => "atomic_lat",
            Test::IdleQps => "idle_qps",
        }
    }
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }
    fn code(self) -> u8 {
        Test::ALL.iter().position(|t| *t == self).unwrap() as u8
    }
    fn from_code(c: u8) -> Option<Test> {
        Test::ALL.get(c as usize).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub test: Test,
    pub busy_poll: bool,
    pub depth: u32,
    pub size: u64,
    pub iters: u64,
    pub client_addr: u64,
    pub client_rkey: u32,
    pub client_len: u32,
    pub session: u64,
    pub qp_index: u32,
    pub qp_count: u32,
}

pub const HELLO_LEN: usize = 64;
pub const REPLY_LEN: usize = 32;

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_LEN);
        b.extend_from_slice(MAGIC);
        b.push(self.test.code());
        b.push(self.busy_poll as u8);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.depth.to_be_bytes());
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.client_addr.to_be_bytes());
        b.extend_from_slice(&self.client_rkey.to_be_bytes());
        b.extend_from_slice(&self.client_len.to_be_bytes());
        b.extend_from_slice(&self.session.to_be_bytes());
        b.extend_from_slice(&self.qp_index.to_be_bytes());
        b.extend_from_slice(&self.qp_count.to_be_bytes());
        debug_assert_eq!(b.len(), HELLO_LEN);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Hello> {
        if b.len() < HELLO_LEN || &b[..8] != MAGIC {
            bail!("not a softrdma bench hello ({} bytes)", b.len());
        }
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap());
        let Some(test) = Test::from_code(b[8]) else {
            bail!("unknown bench test code {}", b[8]);
        };
        Ok(Hello {
            test,
            busy_poll: b[9] & 1 != 0,
            depth: u32_at(12),
            size: u64_at(16),
            iters: u64_at(24),
            client_addr: u64_at(32),
            client_rkey: u32_at(40),
            client_len: u32_at(44),
            session: u64_at(48),
            qp_index: u32_at(56),
            qp_count: u32_at(60),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
    pub credits: u32,
    pub tcp_port: u16,
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REPLY_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.addr.to_be_bytes());
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b.extend_from_slice(&self.len.to_be_bytes());
        b.extend_from_slice(&self.credits.to_be_bytes());
        b.extend_from_slice(&self.tcp_port.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        debug_assert_eq!(b.len(), REPLY_LEN);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Reply> {
        if b.len() < REPLY_LEN || &b[..8] != MAGIC {
            bail!(
                "the server's accept carries no bench reply ({} bytes)",
                b.len()
            );
        }
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        Ok(Reply {
            addr: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            rkey: u32_at(16),
            len: u32_at(20),
            credits: u32_at(24),
            tcp_port: u16::from_be_bytes(b[28..30].try_into().unwrap()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_reply_roundtrip() {
        for (i, t) in Test::ALL.iter().enumerate() {
            let h = Hello {
                test: *t,
                busy_poll: i % 2 == 0,
                depth: 64 + i as u32,
                size: 1 << (i + 3),
                iters: 1000 * i as u64,
                client_addr: 0x7f00_1234_5678 + i as u64,
                client_rkey: 0x1234_5600 | i as u32,
                client_len: 4096,
                session: 0xdead_beef_0000 + i as u64,
                qp_index: i as u32,
                qp_count: 8,
            };
            assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        }
        let r = Reply {
            addr: 0x7fff_0000_1000,
            rkey: 0xabcdef01,
            len: 1 << 20,
            credits: 512,
            tcp_port: 40123,
        };
        assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn foreign_private_data_is_not_ours() {
        assert!(Hello::decode(b"").is_err());
        assert!(Hello::decode(&[0u8; 64]).is_err());
        let mut h = Hello {
            test: Test::WriteBw,
            busy_poll: false,
            depth: 1,
            size: 1,
            iters: 1,
            client_addr: 0,
            client_rkey: 0,
            client_len: 0,
            session: 0,
            qp_index: 0,
            qp_count: 1,
        }
        .encode();
        h[8] = 200;
        assert!(Hello::decode(&h).is_err(), "unknown test code accepted");
        assert!(Reply::decode(&h[..31]).is_err());
    }
}
