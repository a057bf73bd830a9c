//! The storage target's formats on the wire: the connect request, the
//! accept and the reject (MPA private data), and the control messages
//! (Send/Receive); with the client side of the handshake ([`connect`],
//! [`list_partitions`]). Re-exported by [`crate::endpoint`].
//!
//! A partition listing (the accept, and each Info reply's payload) is
//! `SRSA`, version 1, the number `n` of entries it holds, the number of
//! partitions the connection reaches in all (be16), then `n` entries of 16
//! bytes in ascending partition order: index (be16), rights (bit 0 read,
//! bit 1 write), zero, STag (be32), length (be64). An accept holds at most
//! [`ACCEPT_LISTED`] entries: Linux siw takes at most 256 bytes of private
//! data, the 4-byte MPA v2 IRD/ORD block included, and the engine keeps to
//! that unless both ends are softrdma (the old limit of 24 entries, 392
//! bytes, failed the accept of anyone with more than 15). When the
//! connection reaches more, the rest is asked for with Info requests naming
//! the first partition index wanted, each answered with up to
//! [`PAGE_LISTED`] entries. So no partition count limits a principal (a
//! store holds at most 1,024 partitions).

use crate::endpoint::PartitionRegion;
use crate::layout::Rights;
use softrdma_verbs::{Access, CompletionQueue, ConnParams, QueuePair, RecvWr, SendWr, WcOpcode};
use std::time::Duration;

/// Connect request private data: magic, version, flags, token.
const REQ_MAGIC: &[u8; 4] = b"SRSQ";
/// A partition listing: magic, version, count, total, then the entries.
const LIST_MAGIC: &[u8; 4] = b"SRSA";
/// Reject private data: magic, then a UTF-8 reason.
pub(crate) const REJ_MAGIC: &[u8; 4] = b"SRSJ";
pub(crate) const VERSION: u8 = 1;
/// Flag: relaxed ordering.
const FLAG_RELAXED: u8 = 1;
const REQ_LEN: usize = 8 + 32;
const LIST_HEAD: usize = 8;
const ENTRY_LEN: usize = 16;
/// Entries an MPA accept lists (the rest: Info requests): 8 + 15 x 16 =
/// 248 bytes, 252 with MPA v2's IRD/ORD block, within siw's 256.
pub const ACCEPT_LISTED: usize = 15;
/// Entries one Info reply lists (what fits in a control message).
pub const PAGE_LISTED: usize = (CTRL_MAX - CTRL_HEAD - LIST_HEAD) / ENTRY_LEN;

/// What a client sends in its MPA request.
pub fn encode_request(token: &[u8; 32], relaxed: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(REQ_LEN);
    v.extend_from_slice(REQ_MAGIC);
    v.push(VERSION);
    v.push(if relaxed { FLAG_RELAXED } else { 0 });
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(token);
    v
}

/// Parses a connect request: (token, relaxed).
pub fn decode_request(b: &[u8]) -> Result<([u8; 32], bool), String> {
    if b.len() != REQ_LEN || &b[..4] != REQ_MAGIC {
        return Err("not a softrdma storage connect request".into());
    }
    if b[4] != VERSION {
        return Err(format!("unsupported request version {}", b[4]));
    }
    if b[5] & !FLAG_RELAXED != 0 {
        return Err(format!("unknown flags {:#x}", b[5]));
    }
    let mut t = [0; 32];
    t.copy_from_slice(&b[8..]);
    Ok((t, b[5] & FLAG_RELAXED != 0))
}

/// A decoded partition listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The entries it holds, in ascending partition order.
    pub regions: Vec<PartitionRegion>,
    /// How many partitions the connection reaches in all.
    pub total: usize,
}

/// A listing of `regions` (ascending, at most [`PAGE_LISTED`]) out of
/// `total`.
pub fn encode_listing(regions: &[PartitionRegion], total: usize) -> Vec<u8> {
    assert!(regions.len() <= PAGE_LISTED && regions.len() <= total && total <= 0xffff);
    let mut v = Vec::with_capacity(LIST_HEAD + regions.len() * ENTRY_LEN);
    v.extend_from_slice(LIST_MAGIC);
    v.push(VERSION);
    v.push(regions.len() as u8);
    v.extend_from_slice(&(total as u16).to_be_bytes());
    for r in regions {
        v.extend_from_slice(&(r.index as u16).to_be_bytes());
        v.push(rights_bits(r.rights));
        v.push(0);
        v.extend_from_slice(&r.rkey.to_be_bytes());
        v.extend_from_slice(&r.len.to_be_bytes());
    }
    v
}

/// The accept of a connection that reaches `all` (ascending): the first
/// [`ACCEPT_LISTED`] of them, and their number.
pub fn encode_accept(all: &[PartitionRegion]) -> Vec<u8> {
    encode_listing(&all[..all.len().min(ACCEPT_LISTED)], all.len())
}

/// The Info reply's listing: the partitions of `all` (ascending) from
/// index `start` on, as many as fit.
pub fn encode_page(all: &[PartitionRegion], start: u16) -> Vec<u8> {
    let from = all.partition_point(|r| r.index < start as u32);
    let to = all.len().min(from + PAGE_LISTED);
    encode_listing(&all[from..to], all.len())
}

fn rights_bits(r: Rights) -> u8 {
    (r.contains(Rights::READ) as u8) | (r.contains(Rights::WRITE) as u8) << 1
}

/// Parses a listing (an accept, or an Info reply's payload).
pub fn decode_listing(b: &[u8]) -> Result<Listing, String> {
    if b.len() < LIST_HEAD || &b[..4] != LIST_MAGIC || b[4] != VERSION {
        return Err("not a softrdma storage partition listing".into());
    }
    let n = b[5] as usize;
    let total = u16::from_be_bytes([b[6], b[7]]) as usize;
    if n > PAGE_LISTED || b.len() != LIST_HEAD + n * ENTRY_LEN || total < n {
        return Err("malformed storage partition listing".into());
    }
    let regions = b[LIST_HEAD..]
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            let rights = match e[2] {
                1 => Rights::READ,
                2 => Rights::WRITE,
                3 => Rights::READ_WRITE,
                x => return Err(format!("bad rights {x:#x}")),
            };
            Ok(PartitionRegion {
                index: u16::from_be_bytes([e[0], e[1]]) as u32,
                rights,
                rkey: u32::from_be_bytes(e[4..8].try_into().expect("4 bytes")),
                len: u64::from_be_bytes(e[8..16].try_into().expect("8 bytes")),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if regions.windows(2).any(|w| w[0].index >= w[1].index) {
        return Err("storage partition listing out of order".into());
    }
    Ok(Listing { regions, total })
}

/// Parses an accept's or Info reply's listing: the entries it holds.
pub fn decode_accept(b: &[u8]) -> Result<Vec<PartitionRegion>, String> {
    decode_listing(b).map(|l| l.regions)
}

/// Why a connection to a storage target failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The target refused: unknown token, or a malformed request.
    #[error("the storage target refused the connection: {0}")]
    Refused(String),
    /// Anything else (network, MPA, a malformed accept, the listing).
    #[error("{0}")]
    Other(String),
}

/// How long [`connect`] and [`list_partitions`] wait for a control reply.
const CTRL_WAIT: Duration = Duration::from_secs(10);

/// Connects `qp` to a storage target at `addr` as the principal whose
/// token is `token`; returns every partition it may reach, in index
/// order. The accept lists up to [`ACCEPT_LISTED`]; when the principal
/// reaches more, the rest comes from Info requests on the new connection
/// ([`list_partitions`]), which complete on `cq` (the QP's send and
/// receive CQ): the caller must not have posted receives of its own yet.
pub fn connect(
    qp: &QueuePair,
    cq: &CompletionQueue,
    addr: std::net::SocketAddr,
    token: &[u8; 32],
    relaxed: bool,
) -> Result<Vec<PartitionRegion>, ConnectError> {
    let params = ConnParams {
        private_data: encode_request(token, relaxed),
        ..Default::default()
    };
    let accept = match qp.connect(addr, &params) {
        Ok(pd) => decode_listing(&pd).map_err(ConnectError::Other)?,
        Err(softrdma_verbs::Error::Rejected { private_data }) => {
            let why = match private_data.strip_prefix(REJ_MAGIC) {
                Some(r) => String::from_utf8_lossy(r).into_owned(),
                None => "rejected (no reason given)".into(),
            };
            return Err(ConnectError::Refused(why));
        }
        Err(e) => return Err(ConnectError::Other(e.to_string())),
    };
    if accept.regions.len() == accept.total {
        return Ok(accept.regions);
    }
    list_partitions(qp, cq).map_err(ConnectError::Other)
}

/// Every partition the connection reaches now, with its current rights,
/// asked for with Info requests (one per [`PAGE_LISTED`] partitions).
/// After a revoke narrowed the connection, this is where the peer sees
/// it. The requests and replies complete on `cq`; nothing else may be
/// outstanding on the QP (its first receive takes the reply).
pub fn list_partitions(
    qp: &QueuePair,
    cq: &CompletionQueue,
) -> Result<Vec<PartitionRegion>, String> {
    let e = |e: softrdma_verbs::Error| e.to_string();
    let buf = qp
        .pd()
        .alloc_mr(2 * CTRL_MAX, Access::LOCAL_WRITE)
        .map_err(e)?;
    let (recv_id, send_id) = (u64::MAX - 1, u64::MAX - 2);
    let mut all: Vec<PartitionRegion> = Vec::new();
    let mut start = 0u32;
    for id in 1u64.. {
        qp.post_recv(&RecvWr::new(recv_id, &[buf.sge(0, CTRL_MAX)]))
            .map_err(e)?;
        let req = encode_control_arg(ControlOp::Info, start as u16, id);
        buf.write_at(CTRL_MAX, &req);
        qp.post_send(&SendWr::send(send_id, &[buf.sge(CTRL_MAX, req.len())]))
            .map_err(e)?;
        let mut reply = None;
        let mut sent = false;
        while reply.is_none() || !sent {
            let wc = cq
                .wait_one(CTRL_WAIT)
                .ok_or("no answer to an Info request within 10 s")?;
            if !wc.is_ok() {
                return Err(format!("Info request: {:?}", wc.status));
            }
            match (wc.wr_id, wc.opcode) {
                (x, WcOpcode::Recv) if x == recv_id => {
                    let mut b = vec![0; wc.byte_len as usize];
                    buf.read_at(0, &mut b);
                    reply = Some(b);
                }
                (x, _) if x == send_id => sent = true,
                _ => return Err(format!("an unexpected completion (wr {})", wc.wr_id)),
            }
        }
        let b = reply.expect("reply");
        let (op, status, rid, payload) =
            decode_control_reply(&b).ok_or("a malformed control reply")?;
        if op != ControlOp::Info as u8 || rid != id || status != ControlStatus::Ok as u8 {
            return Err(format!("Info refused (status {status})"));
        }
        let page = decode_listing(payload)?;
        if page.regions.first().is_some_and(|r| r.index < start) {
            return Err("an Info page before the partition asked for".into());
        }
        match page.regions.last() {
            Some(l) if page.regions.len() == PAGE_LISTED && l.index < 0xffff => {
                start = l.index + 1;
                all.extend(page.regions);
            }
            _ => {
                all.extend(page.regions);
                return Ok(all);
            }
        }
    }
    unreachable!("the loop returns")
}

// ------------------------------------------------------- control messages

/// Receives posted for control messages per connection.
pub(crate) const CTRL_SLOTS: usize = 8;
/// Largest control message (request or reply).
pub const CTRL_MAX: usize = 512;
const CTRL_HEAD: usize = 16;
const CTRL_REQ: &[u8; 4] = b"SRSC";
const CTRL_REP: &[u8; 4] = b"SRSR";

/// A control request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlOp {
    /// Answered at once (liveness, round trip).
    Ping = 1,
    /// Every Write the target received before this message is durable
    /// when the reply is sent (all partitions of the connection).
    FlushAll = 2,
    /// The reply lists the partitions the connection reaches now (current
    /// rights) from the index in the request's argument on.
    Info = 3,
}

/// A control reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlStatus {
    /// Done.
    Ok = 0,
    /// The operation failed (the payload says why).
    Failed = 1,
    /// Not a control request this target knows.
    Unknown = 2,
}

/// A control request: `SRSC`, version 1, operation, two zero bytes, the
/// caller's 64-bit id (echoed in the reply).
pub fn encode_control(op: ControlOp, id: u64) -> Vec<u8> {
    encode_control_arg(op, 0, id)
}

/// A control request with an argument (be16 in bytes 6..8; Info: the
/// first partition index to list).
pub fn encode_control_arg(op: ControlOp, arg: u16, id: u64) -> Vec<u8> {
    let mut v = CTRL_REQ.to_vec();
    v.push(VERSION);
    v.push(op as u8);
    v.extend_from_slice(&arg.to_be_bytes());
    v.extend_from_slice(&id.to_be_bytes());
    v
}

/// Parses a control request: (operation byte, argument, id).
pub fn decode_control(b: &[u8]) -> Option<(u8, u16, u64)> {
    if b.len() != CTRL_HEAD || &b[..4] != CTRL_REQ || b[4] != VERSION {
        return None;
    }
    Some((
        b[5],
        u16::from_be_bytes([b[6], b[7]]),
        u64::from_be_bytes(b[8..16].try_into().ok()?),
    ))
}

/// A control reply: `SRSR`, version 1, operation, status, zero, the id,
/// then the payload (Info: a partition listing; Failed: a reason).
pub fn encode_control_reply(op: u8, status: ControlStatus, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = CTRL_REP.to_vec();
    v.extend_from_slice(&[VERSION, op, status as u8, 0]);
    v.extend_from_slice(&id.to_be_bytes());
    let room = CTRL_MAX - v.len();
    v.extend_from_slice(&payload[..payload.len().min(room)]);
    v
}

/// Parses a control reply: (operation byte, status byte, id, payload).
pub fn decode_control_reply(b: &[u8]) -> Option<(u8, u8, u64, &[u8])> {
    if b.len() < CTRL_HEAD || b.len() > CTRL_MAX || &b[..4] != CTRL_REP || b[4] != VERSION {
        return None;
    }
    Some((
        b[5],
        b[6],
        u64::from_be_bytes(b[8..16].try_into().ok()?),
        &b[CTRL_HEAD..],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rights() -> impl Strategy<Value = Rights> {
        prop_oneof![
            Just(Rights::READ),
            Just(Rights::WRITE),
            Just(Rights::READ_WRITE)
        ]
    }

    /// Up to `max` regions with distinct ascending indices.
    fn regions(max: usize) -> impl Strategy<Value = Vec<PartitionRegion>> {
        prop::collection::btree_map(
            0u32..=u16::MAX as u32,
            (any::<u32>(), any::<u64>(), rights()),
            0..=max,
        )
        .prop_map(|m| {
            m.into_iter()
                .map(|(index, (rkey, len, rights))| PartitionRegion {
                    index,
                    rkey,
                    len,
                    rights,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn request_round_trips(token in any::<[u8; 32]>(), relaxed in any::<bool>()) {
            let b = encode_request(&token, relaxed);
            prop_assert_eq!(decode_request(&b), Ok((token, relaxed)));
        }

        /// An accept lists at most 15 and says how many there are; the
        /// Info pages from each listed index on, in order, cover the rest
        /// exactly.
        #[test]
        fn accept_and_pages_cover_everything(rs in regions(200)) {
            let a = encode_accept(&rs);
            prop_assert!(a.len() + 4 <= 256, "within siw's private data limit");
            let l = decode_listing(&a).unwrap();
            prop_assert_eq!(l.total, rs.len());
            prop_assert_eq!(&l.regions[..], &rs[..rs.len().min(ACCEPT_LISTED)]);
            let mut got = Vec::new();
            let mut start = 0u32;
            loop {
                let p = encode_page(&rs, start as u16);
                prop_assert!(CTRL_HEAD + p.len() <= CTRL_MAX);
                let page = decode_listing(&p).unwrap();
                prop_assert_eq!(page.total, rs.len());
                let full = page.regions.len() == PAGE_LISTED;
                let last = page.regions.last().map(|r| r.index);
                got.extend(page.regions);
                match last {
                    Some(i) if full && i < 0xffff => start = i + 1,
                    _ => break,
                }
            }
            prop_assert_eq!(got, rs);
        }

        #[test]
        fn control_round_trips(op in any::<u8>(), arg in any::<u16>(), st in 0u8..3, id in any::<u64>(),
                               payload in prop::collection::vec(any::<u8>(), 0..600)) {
            let mut req = encode_control_arg(ControlOp::Info, arg, id);
            req[5] = op;
            prop_assert_eq!(decode_control(&req), Some((op, arg, id)));
            let status = [ControlStatus::Ok, ControlStatus::Failed, ControlStatus::Unknown][st as usize];
            let rep = encode_control_reply(op, status, id, &payload);
            prop_assert!(rep.len() <= CTRL_MAX);
            let (o, s, i, p) = decode_control_reply(&rep).unwrap();
            prop_assert_eq!((o, s, i), (op, st, id));
            prop_assert_eq!(p, &payload[..payload.len().min(CTRL_MAX - CTRL_HEAD)]);
        }

        /// Arbitrary bytes: no panic; whatever decodes re-encodes to the
        /// same bytes (nothing is silently ignored).
        #[test]
        fn arbitrary_bytes_decode_safely(b in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_control(&b);
            let _ = decode_control_reply(&b);
            if let Ok((t, r)) = decode_request(&b) {
                let mut again = encode_request(&t, r);
                // The two reserved bytes are not checked.
                again[6..8].copy_from_slice(&b[6..8]);
                prop_assert_eq!(again, b.clone());
            }
            if let Ok(l) = decode_listing(&b) {
                let mut again = encode_listing(&l.regions, l.total);
                for (i, e) in again[LIST_HEAD..].chunks_exact_mut(ENTRY_LEN).enumerate() {
                    e[3] = b[LIST_HEAD + i * ENTRY_LEN + 3];
                }
                prop_assert_eq!(again, b);
            }
        }
    }

    #[test]
    fn bad_requests_and_listings_are_refused_with_a_reason() {
        let good = encode_request(&[1; 32], false);
        let mut v = good.clone();
        v[4] = 9;
        assert!(decode_request(&v).unwrap_err().contains("version"));
        let mut v = good.clone();
        v[5] = 0x80;
        assert!(decode_request(&v).unwrap_err().contains("flags"));
        assert!(decode_request(&good[..39]).is_err());
        assert!(decode_request(b"").is_err());
        let r = |index| PartitionRegion {
            index,
            rkey: 1,
            len: 1,
            rights: Rights::READ,
        };
        // Fewer in all than listed; out of order.
        let mut l = encode_listing(&[r(1), r(2)], 2);
        l[7] = 1;
        assert!(decode_listing(&l).is_err());
        let l = encode_listing(&[r(2), r(1)], 2);
        assert!(decode_listing(&l).unwrap_err().contains("order"));
        // 40 reachable: the accept lists 15 and says 40.
        let all: Vec<_> = (0..40).map(r).collect();
        let a = decode_listing(&encode_accept(&all)).unwrap();
        assert_eq!((a.regions.len(), a.total), (ACCEPT_LISTED, 40));
        assert_eq!(PAGE_LISTED, 30);
    }
}
