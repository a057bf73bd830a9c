//! Arena ranges a reader in this process sends from without copying them
//! out first: the RESP door writes a large value from the arena straight
//! to its client's socket (Redis writes from its own memory the same way).
//!
//! A copied-out value is checked by its object's checksum, which catches a
//! write that raced the copy; bytes handed to a socket cannot be taken
//! back, so a value sent from the arena must not change while it is sent.
//! Two rules give that, with no lock on the common path:
//!
//! - **Every change of the arena counts itself** ([`Pins::epoch`]: odd
//!   while one is under way, two more after each; a change is one write,
//!   or a group of them, as a replicated write's objects, each written in
//!   pieces and its header last: [`Memory::begin_group`]) and, before it
//!   writes a byte, waits while a pin overlaps the range
//!   ([`Memory::write`] on an [`Arena`](crate::arena::Arena)).
//! - **A reader pins only what it found while nothing was written**: it
//!   takes the count before its look-up ([`Pins::epoch`]), and
//!   [`Pins::pin`] registers the range and then checks the count again.
//!   Either the writer sees the pin (and waits), or the reader sees the
//!   write (and copies instead): both take a sequentially consistent
//!   step before looking at the other's.
//!
//! A pin is held for one socket write: what the socket does not take is
//! copied out and the pin dropped, so a slow client never holds up the
//! node's writes for longer than one `writev`.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(doc)]
use crate::arena::Memory;

/// An arena's writes and pins (see the module's doc).
#[derive(Debug)]
pub struct Pins {
    /// The arena's first byte.
    base: usize,
    len: u64,
    /// Odd while a write is under way, two more after each; odd for ever
    /// once the arena is being unmapped.
    epoch: AtomicU64,
    /// Pins held: a writer looks at `held` only when this is not 0.
    count: AtomicUsize,
    /// The ranges pinned, `[start, end)`.
    held: Mutex<Vec<(u64, u64)>>,
}

/// A pinned range of the arena: no write of this process changes it
/// until the pin is dropped.
#[derive(Debug)]
pub struct Pin {
    pins: Arc<Pins>,
    offset: u64,
    len: u64,
}

impl Pins {
    pub(super) fn new(base: *mut u8, len: u64) -> Pins {
        Pins {
            base: base as usize,
            len,
            epoch: AtomicU64::new(0),
            count: AtomicUsize::new(0),
            held: Mutex::new(Vec::new()),
        }
    }

    /// Where a reader's look-up starts: the count of writes, or `None`
    /// while one is under way.
    pub fn epoch(&self) -> Option<u64> {
        let e = self.epoch.load(Ordering::SeqCst);
        e.is_multiple_of(2).then_some(e)
    }

    /// Whether no write began since [`Self::epoch`] gave `since`: the
    /// reads in between saw the arena as it was then.
    pub fn unchanged(&self, since: u64) -> bool {
        // The reads before this load are not moved after it (a writer's
        // bytes seen by them would have been preceded by its count).
        fence(Ordering::Acquire);
        self.epoch.load(Ordering::SeqCst) == since
    }

    /// Pins `len` bytes at `offset` if no write began since
    /// [`Self::epoch`] gave `since` (so what the reader found then is
    /// what the range holds, and holds until the pin is dropped); `None`
    /// otherwise, or outside the arena.
    pub fn pin(self: &Arc<Self>, offset: u64, len: u64, since: u64) -> Option<Pin> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((offset, offset + len));
        let pin = Pin {
            pins: self.clone(),
            offset,
            len,
        };
        // Dropping the pin unpins.
        self.unchanged(since).then_some(pin)
    }

    fn unpin(&self, offset: u64, len: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let at = held
            .iter()
            .position(|&r| r == (offset, offset + len))
            .expect("a pin is held until dropped");
        held.swap_remove(at);
        drop(held);
        self.count.fetch_sub(1, Ordering::SeqCst);
    }

    /// Begins a change of the arena (one write, or a group of them: a
    /// write's objects, each in pieces): counts it.
    pub(super) fn begin_write(&self) {
        let e = self.epoch.fetch_add(1, Ordering::SeqCst);
        assert!(e.is_multiple_of(2), "arena changes one at a time");
        // The bytes written after this are not moved before the count.
        fence(Ordering::Release);
    }

    /// Before `len` bytes at `offset` are written, inside
    /// [`Self::begin_write`]: waits while a pin overlaps them (a reader
    /// sending them).
    pub(super) fn wait_unpinned(&self, offset: u64, len: u64) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let end = offset + len;
        let mut tries = 0u32;
        while self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|&(s, e)| s < end && offset < e)
        {
            tries = tries.saturating_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Ends what [`Self::begin_write`] began.
    pub(super) fn end_write(&self) {
        self.epoch.fetch_add(1, Ordering::Release);
    }

    /// The arena is being unmapped: no pin from now on, and waits for
    /// those held (each for one socket write).
    pub(super) fn close(&self) {
        // Odd whether or not a change was left open (a panic mid-write).
        self.epoch.fetch_or(1, Ordering::SeqCst);
        while self.count.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
    }
}

impl Pin {
    /// The pinned bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Pins::pin` checked that the range lies inside the
        // arena, which stays mapped while a pin is held (`Arena`'s drop
        // closes the pins and waits for them first). While this pin is
        // held no write of this process changes the range (every write
        // goes through `Arena::write`, which waits for overlapping pins),
        // and the engine only reads the arena (its registration serves
        // remote reads; a recovery's Reads land in a scratch region). So
        // the bytes are not written for as long as the borrow lives.
        unsafe {
            std::slice::from_raw_parts(
                (self.pins.base + self.offset as usize) as *const u8,
                self.len as usize,
            )
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.pins.unpin(self.offset, self.len);
    }
}

#[cfg(test)]
mod tests {
    use crate::arena::{Arena, ArenaKind, Memory};

    #[test]
    fn a_pin_is_refused_after_a_write_and_a_write_waits_for_a_pin() {
        let mut a = Arena::map_anywhere(1 << 20, ArenaKind::Private).unwrap();
        a.write(4096, &[1u8; 4096]).unwrap();
        let pins = a.pins();
        // A write between the look-up and the pin: refused.
        let since = pins.epoch().unwrap();
        a.write(0, &[9u8; 64]).unwrap();
        assert!(pins.pin(4096, 4096, since).is_none());
        // Nothing written since: pinned, and the bytes are the arena's.
        let since = pins.epoch().unwrap();
        let pin = pins.pin(4096, 4096, since).expect("pinned");
        assert_eq!(pin.bytes(), &[1u8; 4096][..]);
        // A write elsewhere does not wait; one over the pin does, and
        // lands once the pin is dropped.
        a.write(0, &[7u8; 64]).unwrap();
        std::thread::scope(|s| {
            let writer = s.spawn(move || {
                a.write(4096 + 100, &[2u8; 8]).unwrap();
                a
            });
            // Until the writer has counted its write (odd) and waits for
            // the pin, the pinned bytes stay as they were.
            loop {
                assert_eq!(pin.bytes(), &[1u8; 4096][..], "written under a pin");
                if pins.epoch().is_none() {
                    break;
                }
                std::thread::yield_now();
            }
            assert_eq!(pin.bytes(), &[1u8; 4096][..], "written under a pin");
            drop(pin);
            let a = writer.join().unwrap();
            let mut got = [0u8; 8];
            a.read(4096 + 100, &mut got).unwrap();
            assert_eq!(got, [2u8; 8]);
        });
    }
}
