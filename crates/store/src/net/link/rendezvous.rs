//! Large messages by rendezvous, with seed 002's one-shot mechanism
//! (`docs/one-shot.md`): a message of more than [`EAGER_MAX`] bytes (a
//! large value in a client's put, a write replicated to the secondary, a
//! large answer) is not copied through the link's 32 KiB Sends.
//!
//! - The sender registers the message where it lies (no copy), binds a
//!   one-shot STag over it with remote read access and, in the same call,
//!   sends a pull message naming its length and CRC32C
//!   ([`QueuePair::advertise`]; the STag travels in the RDMAP header).
//! - The receiver's owner thread, in [`Endpoint::poll`], reads the message
//!   with RDMA Reads straight into a vector registered for it (up to
//!   [`READ_BATCH`] Reads in flight), takes the vector back from the
//!   registration without a copy ([`MemoryRegion::into_vec`]; the message
//!   is delivered in it, and its values are decoded as slices of it:
//!   `proto::decode_shared`), checks the CRC, and closes the
//!   advertisement with a Send-and-close ([`SendWr::send_close`]), which
//!   frees the STag in the sender's engine before the sender sees the
//!   close. Only then does the sender let go of the memory
//!   ([`Link::returned`]); an advertisement that ends without a close (the
//!   connection failed) gives it back the same way.
//! - The message then reaches the owner as any other, in its place in the
//!   link's order: a pull message is never sent in the middle of a
//!   fragmented one, and the Sends after it are handed on after it.
//!
//! The first byte of every Send says what it is: [`FLAG_LAST`] or
//! [`FLAG_MORE`] (a message's last or not-last fragment), [`FLAG_PULL`]
//! (then the length, u64, and the CRC32C, u32, little-endian) or
//! [`FLAG_CLOSE`] (alone). Anything else, a pull without an advertised
//! STag, or of a length Sends would carry, ends the connection.
//!
//! What it costs: a round trip more than Sends (the Read requests), so
//! messages up to [`EAGER_MAX`] still go as Sends. A pull occupies the
//! owner thread for the transfer (a 64 MiB value over loopback TCP: tens
//! of milliseconds), as Redis's single thread is occupied reading one.

use super::*;
use softrdma_verbs::RegOptions;

/// Largest message sent through the link's Sends (in fragments above
/// [`MAX_FRAME`]); a larger one is lent and pulled.
pub const EAGER_MAX: usize = 64 * 1024;
/// A message's last (or only) fragment.
pub(super) const FLAG_LAST: u8 = 0;
/// A fragment more follows.
pub(super) const FLAG_MORE: u8 = 1;
/// A lent message to pull: length and CRC32C follow.
pub(super) const FLAG_PULL: u8 = 2;
/// The close of a lent message (a Send-and-close of its STag).
pub(super) const FLAG_CLOSE: u8 = 3;
/// Bytes after [`FLAG_PULL`]: the length (u64) and the CRC32C (u32).
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
    crc: u32,
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
        let crc = u32::from_le_bytes(head[8..].try_into().ok()?);
        if len <= EAGER_MAX as u64 || len > crate::proto::MAX_MESSAGE as u64 {
            return None;
        }
        Some(Pull {
            link,
            stag,
            len: len as usize,
            crc,
        })
    }
}

/// A message to send: bytes the caller keeps (copied if they must be
/// lent), or a buffer the link may keep (lent as it is).
pub(super) trait Outgoing {
    fn bytes(&self) -> &[u8];
    /// The bytes as a buffer of their own, to lend.
    fn take(&mut self) -> Vec<u8>;
    /// Their CRC32C, which a pull message carries.
    fn crc(&self) -> u32 {
        crc32c(self.bytes())
    }
}

impl Outgoing for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn take(&mut self) -> Vec<u8> {
        self.to_vec()
    }
}

/// A message the link may keep (a large one is lent as it is), with its
/// CRC32C if that was computed as it was encoded
/// ([`crate::proto::encode_sealed`], which [`super::pool::encode`] uses
/// for a large message): then lending it reads it no more.
#[derive(Debug, Clone, Default)]
pub struct Sealed {
    bytes: Vec<u8>,
    crc: Option<u32>,
}

impl Sealed {
    /// `bytes` and their CRC32C `crc`, which must be theirs: a peer that
    /// pulls them and finds another closes the link.
    pub(crate) fn with_crc(bytes: Vec<u8>, crc: u32) -> Sealed {
        debug_assert_eq!(
            crc,
            crc32c(&bytes),
            "a sealed message's CRC32C is not its own"
        );
        Sealed {
            bytes,
            crc: Some(crc),
        }
    }

    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it has no bytes (a link refuses to send it).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl From<Vec<u8>> for Sealed {
    fn from(bytes: Vec<u8>) -> Sealed {
        Sealed { bytes, crc: None }
    }
}

impl Outgoing for Sealed {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }

    fn crc(&self) -> u32 {
        self.crc.unwrap_or_else(|| crc32c(&self.bytes))
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
        if crc32c(&bytes) != p.crc {
            return Err(LinkError::Verbs(format!(
                "a pulled message of {} bytes does not match its CRC32C",
                p.len
            )));
        }
        link.close_lent(p.stag, pull_timeout(0))?;
        Ok(bytes)
    }
}

/// How a message's memory is registered, lent or pulled into: without
/// pinning its pages, as a NIC with on-demand paging (`IBV_ACCESS_ON_DEMAND`)
/// registers it. A pin per message is an `mlock` and an `munlock` of every
/// page, which halved the rate of 1 MiB puts (docs/store.md, "Large
/// values"); the engine reads and writes user memory without it.
fn transient() -> RegOptions {
    RegOptions {
        unpinned: true,
        ..RegOptions::default()
    }
}

impl Link {
    /// Lends `msg`, whose CRC32C is `crc`, to the peer: registers it,
    /// advertises it with a pull message ([`FLAG_PULL`]) and keeps it
    /// until the peer's close.
    pub(super) fn lend(
        &self,
        tx: &mut Tx,
        msg: Vec<u8>,
        crc: u32,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let ep = self
            .ep
            .upgrade()
            .ok_or_else(|| LinkError::Down(self.peer()))?;
        let len = msg.len();
        let mut head = [0u8; 1 + PULL_HEAD];
        head[0] = FLAG_PULL;
        head[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        head[9..].copy_from_slice(&crc.to_le_bytes());
        let mr = ep
            .pd
            .register_with(msg, Access::LOCAL_READ, transient())
            .map_err(verr)?;
        let wr_id = (self.id as u64) << 32 | ADVERT_SLOT;
        loop {
            // Held across the call: a close (on the owner's thread) that
            // beats the insert waits for it.
            let mut lent = self.lent.lock().unwrap();
            match self
                .qp
                .advertise(wr_id, &[mr.sge(0, len)], Access::REMOTE_READ, &head, 0)
            {
                Ok(stag) => {
                    lent.insert(stag.raw(), mr);
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
            let mr = self.lent.lock().unwrap().remove(&s.raw());
            if let Some(v) = mr.and_then(MemoryRegion::try_into_vec) {
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

/// CRC32C of a message that travels by rendezvous (`crc-fast`: up to 132
/// MiB, checked once on each side).
fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}
