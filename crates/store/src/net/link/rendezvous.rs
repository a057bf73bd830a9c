//! Large messages by rendezvous, with seed 002's one-shot mechanism
//! (`docs/one-shot.md`): a message of more than [`EAGER_MAX`] bytes (a
//! large value in a client's put, a write replicated to the secondary, a
//! large answer) is not copied through the link's 32 KiB Sends.
//!
//! - The sender registers the message where it lies (no copy): its pieces
//!   ([`Outbound::Pieces`], a gather list: the encoder's bytes between
//!   large values, and each large value where it lies, shared with its
//!   other holders and registered read-only,
//!   `ProtectionDomain::register_bytes`), binds a one-shot STag over them
//!   as one range with remote read access and, in the same call, sends a
//!   pull message naming its length ([`QueuePair::advertise`]; the STag
//!   travels in the RDMAP header).
//! - The receiver's owner thread, in [`Endpoint::poll`], reads the message
//!   with RDMA Reads straight into a vector registered for it (up to
//!   [`READ_BATCH`] Reads in flight), takes the vector back from the
//!   registration without a copy ([`MemoryRegion::into_vec`]; the message
//!   is delivered in it, and its values are decoded as slices of it:
//!   `proto::decode_shared`), and closes the advertisement with a
//!   Send-and-close ([`SendWr::send_close`]), which frees the STag in the
//!   sender's engine before the sender sees the close. Only then does the
//!   sender let go of the memory ([`Link::returned`]); an advertisement
//!   that ends without a close (the connection failed) gives it back the
//!   same way.
//! - The message then reaches the owner as any other, in its place in the
//!   link's order: a pull message is never sent in the middle of a
//!   fragmented one, and the Sends after it are handed on after it.
//!
//! The bytes are checked as every Send's on the link are: by the
//! transport (TCP's checksum, and MPA's CRC32C on connections that
//! negotiate it). A CRC32C of their own, computed by the sender and
//! checked by the receiver, cost a pass over the message on each side of
//! each hop (a fifth of a replicated 16 MiB put's time; docs/store.md,
//! "Large values").
//!
//! The first byte of every Send says what it is: [`FLAG_LAST`] or
//! [`FLAG_MORE`] (a message's last or not-last fragment), [`FLAG_PULL`]
//! (then the length, u64, and flags, u32, none defined: 0,
//! little-endian) or [`FLAG_CLOSE`] (alone). Anything else, a pull with
//! flags, without an advertised STag, or of a length Sends would carry,
//! ends the connection.
//!
//! What it costs: a round trip more than Sends (the Read requests), so
//! messages up to [`EAGER_MAX`] still go as Sends. A pull occupies the
//! owner thread for the transfer (a 64 MiB value over loopback TCP: tens
//! of milliseconds), as Redis's single thread is occupied reading one.

use std::borrow::Cow;

use super::*;
use crate::proto::Piece;
use softrdma_verbs::RegOptions;

/// Largest message sent through the link's Sends (in fragments above
/// [`MAX_FRAME`]); a larger one is lent and pulled.
pub const EAGER_MAX: usize = 64 * 1024;
/// A message's last (or only) fragment.
pub(super) const FLAG_LAST: u8 = 0;
/// A fragment more follows.
pub(super) const FLAG_MORE: u8 = 1;
/// A lent message to pull: its length and flags follow.
pub(super) const FLAG_PULL: u8 = 2;
/// The close of a lent message (a Send-and-close of its STag).
pub(super) const FLAG_CLOSE: u8 = 3;
/// Bytes after [`FLAG_PULL`]: the length (u64) and flags (u32, none
/// defined).
pub(super) const PULL_HEAD: usize = 12;
/// The low half of an advertisement's `wr_id`: its end completes on the
/// endpoint's receive queue under the link's id, and is no receive slot.
const ADVERT_SLOT: u64 = 0xffff_ffff;
/// The least bytes per RDMA Read of a pull.
const PULL_PIECE: usize = 1 << 20;

/// What the receive path produces: an event for the owner, or a lent
/// message to pull first ([`Endpoint::poll`] does, in order).
pub(super) enum Raw {
    Event(LinkEvent),
    Pull(Pull),
}

/// A lent message of a peer, announced on link `link`.
pub(super) struct Pull {
    link: u32,
    stag: u32,
    len: usize,
}

impl Pull {
    /// The pull message `head` (after its flag) of receive `wc` on
    /// `link`; `None` if it is malformed.
    pub(super) fn parse(link: u32, wc: &WorkCompletion, head: &[u8]) -> Option<Pull> {
        let stag = wc.advertised_stag?.raw();
        if head.len() != PULL_HEAD {
            return None;
        }
        let len = u64::from_le_bytes(head[..8].try_into().ok()?);
        let flags = u32::from_le_bytes(head[8..].try_into().ok()?);
        if flags != 0 || len <= EAGER_MAX as u64 || len > crate::proto::MAX_MESSAGE as u64 {
            return None;
        }
        Some(Pull {
            link,
            stag,
            len: len as usize,
        })
    }
}

/// A message to send: bytes the caller keeps (copied if they must be
/// lent), or an [`Outbound`] message the link may keep (lent as it is).
pub(super) trait Outgoing {
    fn len(&self) -> usize;
    /// The bytes in one piece, to send through Sends (a message of at most
    /// [`EAGER_MAX`] bytes).
    fn eager(&self) -> Cow<'_, [u8]>;
    /// The pieces to lend.
    fn take(&mut self) -> Vec<Piece>;
}

impl Outgoing for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn eager(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }

    fn take(&mut self) -> Vec<Piece> {
        vec![Piece::Own(self.to_vec())]
    }
}

/// A message the link may keep: one buffer, or the pieces of a large one
/// that it lends as a gather list, its large values where they lie
/// ([`crate::proto::encode_gather`], which [`super::pool::encode`] uses).
#[derive(Debug, Clone)]
pub enum Outbound {
    /// The message's bytes.
    One(Vec<u8>),
    /// Pieces whose concatenation is the message.
    Pieces(Vec<Piece>),
}

impl Outbound {
    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Outbound::One(v) => v.len(),
            Outbound::Pieces(p) => p.iter().map(|p| p.bytes().len()).sum(),
        }
    }

    /// Whether it has no bytes (a link refuses to send it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<u8>> for Outbound {
    fn from(v: Vec<u8>) -> Outbound {
        Outbound::One(v)
    }
}

impl Outgoing for Outbound {
    fn len(&self) -> usize {
        Outbound::len(self)
    }

    fn eager(&self) -> Cow<'_, [u8]> {
        match self {
            Outbound::One(v) => Cow::Borrowed(v),
            Outbound::Pieces(p) => Cow::Owned(p.iter().flat_map(|p| p.bytes()).copied().collect()),
        }
    }

    fn take(&mut self) -> Vec<Piece> {
        match std::mem::replace(self, Outbound::One(Vec::new())) {
            Outbound::One(v) => vec![Piece::Own(v)],
            Outbound::Pieces(p) => p,
        }
    }
}

/// How long a pull of `len` bytes may take: 10 s, and 100 ms per MiB.
pub(super) fn pull_timeout(len: usize) -> Duration {
    Duration::from_secs(10) + Duration::from_millis(100 * (len >> 20) as u64)
}

impl Endpoint {
    /// Pulls a lent message: its bytes as the link's next message, or the
    /// link's end if the pull fails (the link is closed: the sender's
    /// advertisement ends with it).
    pub(super) fn pull(&self, p: Pull) -> Option<LinkEvent> {
        let link = self.link(p.link)?;
        match self.pull_bytes(&link, &p) {
            Ok(bytes) => Some(LinkEvent::Frame {
                link: p.link,
                bytes: super::pool::shared(bytes),
            }),
            Err(e) => {
                tracing::warn!(link = p.link, len = p.len, error = %e, "pulling a lent message failed; closing link");
                link.close();
                Some(LinkEvent::Down { link: p.link })
            }
        }
    }

    fn pull_bytes(&self, link: &Link, p: &Pull) -> Result<Vec<u8>, LinkError> {
        if link.is_dead() {
            return Err(LinkError::Down(link.peer()));
        }
        // The message lands in the vector it is then delivered in (taken
        // back from its registration without a copy): one pass over the
        // bytes, not a landing buffer and a copy out of it; a kept one
        // (`pool.rs`), not zeroed first.
        let mr = self
            .pd
            .register_with(
                super::pool::overwritable(p.len),
                Access::LOCAL_WRITE,
                transient(),
            )
            .map_err(verr)?;
        // The advertised range starts at address 0.
        let piece = p.len.div_ceil(READ_BATCH).max(PULL_PIECE);
        let reads: Vec<(usize, usize, u64)> = (0..p.len)
            .step_by(piece)
            .map(|o| (o, piece.min(p.len - o), o as u64))
            .collect();
        link.read_batch(&mr, &reads, p.stag, pull_timeout(p.len))?;
        let bytes = mr.into_vec();
        link.close_lent(p.stag, pull_timeout(0))?;
        Ok(bytes)
    }
}

/// How a message's memory is registered, lent or pulled into: without
/// pinning its pages, as a NIC with on-demand paging (`IBV_ACCESS_ON_DEMAND`)
/// registers it. A pin per message is an `mlock` and an `munlock` of every
/// page, which halved the rate of 1 MiB puts (docs/store.md, "Large
/// values"); the engine reads and writes user memory without it.
pub(crate) fn transient() -> RegOptions {
    RegOptions {
        unpinned: true,
        ..RegOptions::default()
    }
}

impl Link {
    /// Lends the message `pieces` make to the peer: registers each piece
    /// where it lies (a large value shared with its other holders is
    /// registered read-only, not copied), advertises them as one range
    /// with a pull message ([`FLAG_PULL`]) and keeps them until the peer's
    /// close.
    pub(super) fn lend(
        &self,
        tx: &mut Tx,
        pieces: Vec<Piece>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let ep = self
            .ep
            .upgrade()
            .ok_or_else(|| LinkError::Down(self.peer()))?;
        let mut len = 0;
        let mut mrs = Vec::with_capacity(pieces.len());
        for p in pieces {
            len += p.bytes().len();
            let mr = match p {
                Piece::Own(v) if v.is_empty() => continue,
                Piece::Own(v) => ep.pd.register_with(v, Access::LOCAL_READ, transient()),
                Piece::Shared(b) => ep.pd.register_bytes(b, Access::LOCAL_READ, transient()),
            };
            mrs.push(mr.map_err(verr)?);
        }
        let sges: Vec<_> = mrs.iter().map(|m| m.sge(0, m.len())).collect();
        let mut head = [0u8; 1 + PULL_HEAD];
        head[0] = FLAG_PULL;
        head[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        // head[9..]: flags, none.
        let wr_id = (self.id as u64) << 32 | ADVERT_SLOT;
        loop {
            // Held across the call: a close (on the owner's thread) that
            // beats the insert waits for it.
            let mut lent = self.lent.lock().unwrap();
            match self
                .qp
                .advertise(wr_id, &sges, Access::REMOTE_READ, &head, 0)
            {
                Ok(stag) => {
                    lent.insert(stag.raw(), mrs);
                    return Ok(());
                }
                Err(softrdma_verbs::Error::SendQueueFull) => {
                    drop(lent);
                    // Sends and advertisements leave the queue as the
                    // engine sends them.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(LinkError::Timeout(self.peer()));
                    }
                    if tx.outstanding > 0 {
                        self.reap(tx, true, left)?;
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                Err(e) => {
                    self.dead.store(true, Ordering::Release);
                    return Err(verr(e));
                }
            }
        }
    }

    /// A lent message the peer is done with (its close, or the
    /// advertisement's end): its memory is let go, and its buffer kept for
    /// the next large message if the engine holds it no more.
    pub(super) fn returned(&self, stag: Option<softrdma_verbs::Rkey>) {
        if let Some(s) = stag {
            let mrs = self.lent.lock().unwrap().remove(&s.raw());
            // Its own pieces' buffers are kept; a shared value's
            // registration lets its bytes go.
            for v in mrs
                .into_iter()
                .flatten()
                .filter_map(MemoryRegion::try_into_vec)
            {
                super::pool::give(v);
            }
        }
    }

    /// Lent messages not yet given back.
    pub fn lent(&self) -> usize {
        self.lent.lock().unwrap().len()
    }

    /// Closes the peer's advertisement `stag` (after pulling it).
    fn close_lent(&self, stag: u32, timeout: Duration) -> Result<(), LinkError> {
        let mut tx = self.tx.lock().unwrap();
        let mut wrs = Vec::with_capacity(1);
        let slot = self.slot(&mut tx, &mut wrs, Instant::now() + timeout)?;
        self.send_mr.write_at(slot * MAX_FRAME, &[FLAG_CLOSE]);
        wrs.push(SendWr::send_close(
            slot as u64,
            &[self.send_mr.sge(slot * MAX_FRAME, 1)],
            softrdma_verbs::Rkey::from_raw(stag),
        ));
        self.post(&mut tx, &mut wrs)
    }
}
