//! Buffers of large messages, kept for the next large message.
//!
//! A message over [`EAGER_MAX`] is encoded into a buffer the link lends
//! and pulled into a buffer the receiver registers (`rendezvous.rs`). New
//! memory costs a pass over it before the transfer's: `vec![0; n]` zeroes
//! it, and above glibc's largest mmap threshold (32 MiB) every buffer is a
//! fresh mapping faulted in page by page (a 64 MiB put ran at a fifth of
//! the rate of 16 MiB ones; docs/store.md, "Large values"). So a process
//! keeps a few such buffers once their message is done with, and the next
//! large message of about the same size is encoded or pulled into one:
//!
//! - a lent message's buffer comes back when the peer closes the
//!   advertisement ([`give`], from `Link::returned`);
//! - a pulled message is delivered as [`Bytes`] that own their buffer
//!   ([`shared`]): the buffer comes back when the last value decoded from
//!   it (a staged write's, say) is dropped.
//!
//! A kept buffer's old bytes are never read: an encoder gets it empty
//! ([`with_capacity`]); a pull gets it at the message's length
//! ([`overwritable`]) and its Reads overwrite all of it before anything
//! sees it (a failed pull delivers nothing).

use std::sync::Mutex;

use bytes::Bytes;

use super::EAGER_MAX;

/// Buffers kept at most.
const KEEP: usize = 4;
/// Bytes kept at most, all buffers together: two of the largest values.
const KEEP_BYTES: usize = 2 * crate::proto::MAX_VALUE + (8 << 20);
/// New buffers' capacity is a multiple of this, so that messages of one
/// value size with keys or fields of other lengths fit the same buffers.
const ROUND: usize = 64 << 10;

/// Kept buffers.
pub(crate) struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// This process's.
static POOL: Pool = Pool::new();

/// An empty vector with room for at least `cap` bytes: a kept one if one
/// fits, else a new one.
pub(crate) fn with_capacity(cap: usize) -> Vec<u8> {
    POOL.with_capacity(cap)
}

/// A vector of `len` bytes to be overwritten whole (by a pull's Reads, or
/// a one-sided get's Read of a large value, `client/reader.rs`):
/// a kept one (its bytes are an earlier message's) if one fits, else a
/// new one of zeros.
pub(crate) fn overwritable(len: usize) -> Vec<u8> {
    POOL.overwritable(len)
}

/// Bytes owning `v`, whose buffer is kept when the last of them is
/// dropped.
pub(crate) fn shared(v: Vec<u8>) -> Bytes {
    POOL.shared(v)
}

/// `env` encoded for a link: a large message as a gather list (its large
/// values where they lie, the bytes between them written into a kept
/// buffer and small new ones), the others into one buffer.
pub(crate) fn encode(env: &crate::proto::Envelope) -> super::Outbound {
    let room = crate::proto::room(env);
    if room <= EAGER_MAX {
        return crate::proto::encode_into(env, Vec::with_capacity(room)).into();
    }
    let buf = with_capacity(crate::proto::gather_room(env));
    let pieces = crate::proto::encode_gather(env, buf);
    match <[_; 1]>::try_from(pieces) {
        Ok([crate::proto::Piece::Own(v)]) => super::Outbound::One(v),
        Ok([p]) => super::Outbound::Pieces(vec![p]),
        Err(pieces) => super::Outbound::Pieces(pieces),
    }
}

/// Keeps `v` for a later large message.
pub(crate) fn give(v: Vec<u8>) {
    POOL.give(v)
}

impl Pool {
    const fn new() -> Pool {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    fn with_capacity(&self, cap: usize) -> Vec<u8> {
        if cap <= EAGER_MAX {
            return Vec::with_capacity(cap);
        }
        match self.take(cap) {
            Some(mut v) => {
                v.clear();
                v
            }
            None => Vec::with_capacity(cap.next_multiple_of(ROUND)),
        }
    }

    fn overwritable(&self, len: usize) -> Vec<u8> {
        if len <= EAGER_MAX {
            return vec![0; len];
        }
        match self.take(len) {
            Some(mut v) => {
                // Within its capacity: truncating is free, growing zeroes
                // only the difference.
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, 0);
                }
                v
            }
            None => {
                // Zeroed by the allocator (`calloc`: a fresh mapping is
                // not written), not by a pass of ours before the Reads'.
                let mut v = vec![0; len.next_multiple_of(ROUND)];
                v.truncate(len);
                v
            }
        }
    }

    fn shared(&'static self, v: Vec<u8>) -> Bytes {
        if v.capacity() <= EAGER_MAX {
            return Bytes::from(v);
        }
        Bytes::from_owner(Kept(v, self))
    }

    /// Keeps `v` within [`KEEP`] buffers and [`KEEP_BYTES`] (the oldest
    /// goes first).
    fn give(&self, v: Vec<u8>) {
        if v.capacity() <= EAGER_MAX || v.capacity() > KEEP_BYTES {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(v);
        while free.len() > KEEP || free.iter().map(Vec::capacity).sum::<usize>() > KEEP_BYTES {
            let old = free.remove(0);
            drop(old);
        }
    }

    /// The smallest kept buffer with room for `n` bytes and at most twice
    /// that (a 64 MiB buffer is not tied up in a 100 KiB message).
    fn take(&self, n: usize) -> Option<Vec<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (i, _) = free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n && v.capacity() / 2 <= n)
            .min_by_key(|(_, v)| v.capacity())?;
        // In order: `give` lets the oldest go first.
        Some(free.remove(i))
    }
}

/// A buffer that goes back to its pool when dropped.
struct Kept(Vec<u8>, &'static Pool);

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.1.give(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> &'static Pool {
        Box::leak(Box::new(Pool::new()))
    }

    #[test]
    fn a_pulled_buffer_comes_back_when_its_bytes_are_dropped_and_is_reused() {
        let p = pool();
        let n = (3 << 20) + 10;
        let mut v = p.overwritable(n);
        assert!(v.iter().all(|&b| b == 0), "a new buffer is zeros");
        v.fill(7);
        let at = v.as_ptr();
        let b = p.shared(v);
        let value = b.slice(100..200);
        drop(b);
        assert!(p.take(n).is_none(), "kept while a slice lives");
        drop(value);
        // A pull of a message a little longer gets it at its length: the
        // old bytes left for the Reads to overwrite, the difference zeroed.
        let q = p.overwritable(n + 10);
        assert_eq!((q.as_ptr(), q.len()), (at, n + 10));
        assert!(q[..n].iter().all(|&b| b == 7) && q[n..].iter().all(|&b| b == 0));
        // An encoder gets it empty.
        p.give(q);
        let e = p.with_capacity(n);
        assert_eq!((e.as_ptr(), e.len()), (at, 0));
    }

    #[test]
    fn small_and_huge_buffers_are_not_kept_and_the_total_is_bounded() {
        let p = pool();
        for _ in 0..(KEEP + 3) {
            p.give(vec![0u8; 1 << 20]);
        }
        assert_eq!(p.free.lock().unwrap().len(), KEEP);
        for _ in 0..3 {
            p.give(Vec::with_capacity(crate::proto::MAX_VALUE));
        }
        p.give(Vec::with_capacity(KEEP_BYTES + 1));
        p.give(vec![0u8; 100]);
        let free = p.free.lock().unwrap();
        assert!(free.iter().map(Vec::capacity).sum::<usize>() <= KEEP_BYTES);
        assert!(free
            .iter()
            .all(|v| v.capacity() > EAGER_MAX && v.capacity() <= KEEP_BYTES));
        assert_eq!(
            free.iter()
                .filter(|v| v.capacity() == crate::proto::MAX_VALUE)
                .count(),
            2
        );
    }

    #[test]
    fn a_buffer_far_larger_than_the_message_is_left_for_a_large_one() {
        let p = pool();
        p.give(Vec::with_capacity(40 << 20));
        assert!(p.with_capacity(300 << 10).capacity() < 600 << 10);
        assert!(p.with_capacity(30 << 20).capacity() == 40 << 20);
    }
}
