//! The same-host byte rings: each connection's FPDU stream travels in a
//! ring in the receiver's segment instead of the TCP socket (which then
//! carries only doorbells and the end of the stream).

use super::*;

/// The consumer end of our slot's ring (the peer writes into it).
pub(crate) struct RingReader {
    shm: Arc<LocalShm>,
    slot: u32,
}

/// The producer end of the peer's ring for this connection.
pub(crate) struct RingWriter {
    peer: Arc<PeerShm>,
    slot: u32,
}

impl RingReader {
    pub fn new(shm: Arc<LocalShm>, slot: u32) -> RingReader {
        RingReader { shm, slot }
    }

    fn hdr(&self) -> (&RingHdr, *mut u8) {
        self.shm.seg.ring(self.slot)
    }

    /// Whether the peer sends through the ring (set before its first byte).
    pub fn active(&self) -> bool {
        self.hdr().0.active.load(Acquire) == 1
    }

    /// Bytes waiting.
    pub fn available(&self) -> usize {
        let (h, _) = self.hdr();
        (h.tail.load(Acquire) - h.head.load(Relaxed)) as usize
    }

    /// Copies up to the spans' total length out of the ring into them;
    /// returns the bytes moved and whether the producer waits for room
    /// (then ring its doorbell).
    ///
    /// # Safety
    /// The spans must be writable memory valid for the call.
    pub unsafe fn read_spans(&self, spans: &[sys::RawSpan]) -> (usize, bool) {
        let (h, data) = self.hdr();
        let head = h.head.load(Relaxed);
        let tail = h.tail.load(Acquire);
        let mut left = (tail - head) as usize;
        let mut pos = head;
        let mut moved = 0;
        for s in spans {
            let mut done = 0;
            while done < s.len && left > 0 {
                let at = pos as usize & (RING_DATA - 1);
                let n = (s.len - done).min(left).min(RING_DATA - at);
                // SAFETY: [at, at + n) is inside the data area and holds
                // bytes the producer published (before `tail`, Acquire);
                // the target is writable (caller's contract).
                unsafe { std::ptr::copy_nonoverlapping(data.add(at), s.ptr.add(done), n) };
                done += n;
                left -= n;
                pos += n as u64;
                moved += n;
            }
            if left == 0 {
                break;
            }
        }
        if moved == 0 {
            return (0, false);
        }
        h.head.store(pos, SeqCst);
        let wake = h.writer_blocked.load(SeqCst) == 1 && h.writer_blocked.swap(0, SeqCst) == 1;
        (moved, wake)
    }

    /// Before sleeping: asks for a doorbell. False if bytes came meanwhile
    /// (read them instead).
    pub fn park(&self) -> bool {
        let h = self.hdr().0;
        h.need_wake.store(1, SeqCst);
        if h.tail.load(SeqCst) != h.head.load(Relaxed) {
            h.need_wake.store(0, Relaxed);
            return false;
        }
        true
    }
}

impl RingWriter {
    pub fn new(peer: Arc<PeerShm>, slot: u32) -> RingWriter {
        RingWriter { peer, slot }
    }

    fn hdr(&self) -> (&RingHdr, *mut u8) {
        self.peer.seg.ring(self.slot)
    }

    /// Marks this direction as using the ring (before the first write).
    pub fn activate(&self) {
        self.hdr().0.active.store(1, SeqCst);
    }

    /// Copies as much of the spans as fits; returns the bytes written and
    /// whether the consumer asked for a doorbell.
    ///
    /// # Safety
    /// The spans must be readable memory valid for the call.
    pub unsafe fn write_spans(&self, spans: &[sys::RawSpan]) -> (usize, bool) {
        let (h, data) = self.hdr();
        let tail = h.tail.load(Relaxed);
        let head = h.head.load(Acquire);
        let mut free = RING_DATA - (tail - head) as usize;
        let mut pos = tail;
        let mut moved = 0;
        for s in spans {
            let mut done = 0;
            while done < s.len && free > 0 {
                let at = pos as usize & (RING_DATA - 1);
                let n = (s.len - done).min(free).min(RING_DATA - at);
                // SAFETY: [at, at + n) is inside the data area and free
                // (the consumer is done with it: before `head`, Acquire);
                // the source is readable (caller's contract).
                unsafe { std::ptr::copy_nonoverlapping(s.ptr.add(done), data.add(at), n) };
                done += n;
                free -= n;
                pos += n as u64;
                moved += n;
            }
            if free == 0 {
                break;
            }
        }
        if moved == 0 {
            return (0, false);
        }
        h.tail.store(pos, SeqCst);
        let wake = h.need_wake.load(SeqCst) == 1 && h.need_wake.swap(0, SeqCst) == 1;
        (moved, wake)
    }

    /// The ring is full: asks the consumer to ring back once it made room.
    /// False if room appeared meanwhile (write again instead).
    pub fn block(&self) -> bool {
        let h = self.hdr().0;
        h.writer_blocked.store(1, SeqCst);
        let full = h.tail.load(Relaxed) - h.head.load(SeqCst) == RING_DATA as u64;
        if !full {
            h.writer_blocked.store(0, Relaxed);
            return false;
        }
        true
    }
}
