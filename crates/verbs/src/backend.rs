//! Regions whose bytes are not in memory: a storage partition, say
//! (`softrdma-storage` exposes each partition this way).
//!
//! A region registered with [`ProtectionDomain::register_backend`] has an
//! STag, a protection domain, access rights and bounds like any other, and
//! every remote access is checked against them first. What differs is
//! where the bytes go:
//!
//! - a tagged RDMA Write into it is received into the QP's staging buffer
//!   and, once the segment's CRC checked out, handed to
//!   [`RegionBackend::write_at`] (so nothing reaches the device from a
//!   corrupted frame, a stronger promise than direct placement gives);
//! - an RDMA Read Request from it is answered with bytes from
//!   [`RegionBackend::read_at`];
//! - a **zero-length** RDMA Read Request naming it is a flush: the engine
//!   calls [`RegionBackend::flush`] and sends the (empty) Read Response only
//!   after it returned, so the requester's Read completion means "every
//!   Write placed before this Read is durable". RDMA executes a QP's
//!   Writes and Reads in order at the responder, which makes this the
//!   barrier of IBTA's FLUSH on the plain RFC 5040 wire: any iWARP peer,
//!   Linux siw included, can issue it with an ordinary zero-length Read.
//!   [`crate::WrOp::Flush`] posts one.
//!
//! Such a region can only be reached remotely: naming it in a local SGE
//! fails with a local protection error, atomics on it are refused like
//! misaligned ones, and the same-host transport never maps it (its Writes
//! and Reads go on the stream, where the engine calls the backend).
//!
//! A backend may refuse an access with `std::io::ErrorKind::PermissionDenied`
//! (its owner withdrew the right after the STag check let the access in: a
//! storage target applying a revoke to a Write being received): the peer
//! gets the protection Terminate (DDP tagged "invalid STag" for a Write,
//! RDMAP "invalid STag" for a Read), as if the check had come later. Any
//! other error is the device's: RDMAP's catastrophic Terminate.
//!
//! A backend's calls run on the engine's progress thread for the QP, in the
//! order the QP's messages arrived. A backend that queues work instead
//! (relaxed ordering) must still make `flush` wait for every write it
//! accepted, and report a failed earlier write there at the latest.
//!
//! [`ProtectionDomain::register_backend`]: crate::ProtectionDomain::register_backend

use crate::spans::MemSpans;

/// Called once when an asynchronous backend request ends: with the bytes
/// read (a read) or an empty slice (a write), or the error. It may run on
/// the backend's completion thread or, for a request the backend did
/// synchronously, inside the submitting call.
pub type IoDone = Box<dyn FnOnce(std::io::Result<&[u8]>) + Send>;

/// Where a backed region's bytes live. Offsets are relative to the start
/// of the region and already checked to lie inside it.
///
/// A local QP's Writes and Reads (`local.rs`) move bytes between the
/// backend and registered memory, which may be written meanwhile; they use
/// the `*_spans` methods, which see that memory only as [`MemSpans`] (never
/// a slice). Their defaults stage through a buffer of their own and call
/// the slice methods; a backend that can do better (positioned I/O
/// straight from the memory, or its own bounce buffer) overrides them.
pub trait RegionBackend: Send + Sync + 'static {
    /// Stores `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Fills `buf` from `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Returns once every write accepted so far is durable.
    fn flush(&self) -> std::io::Result<()>;
    /// How many requests the backing device serves at once with benefit.
    /// 1 (the default): it works at memory speed (the page cache), and a
    /// local QP runs small requests on the posting thread. More (a device
    /// under O_DIRECT): a relaxed-ordering local QP keeps up to this many
    /// (at most 32) in flight on its workers.
    fn queue_depth(&self) -> usize {
        1
    }
    /// Whether [`RegionBackend::submit_write`] and
    /// [`RegionBackend::submit_read`] return before the I/O is done (a
    /// kernel queue such as io_uring does it). A relaxed-ordering local QP
    /// then keeps up to [`RegionBackend::queue_depth`] requests in flight
    /// from one thread instead of one thread per request.
    fn is_async(&self) -> bool {
        false
    }
    /// Requests submitted until the matching
    /// [`RegionBackend::release_doorbell`] may wait in the backend's queue
    /// and reach the device together (a local QP holds it across one
    /// posted batch of work requests). Default: nothing.
    fn hold_doorbell(&self) {}
    /// Ends [`RegionBackend::hold_doorbell`]; the last holder submits.
    fn release_doorbell(&self) {}
    /// Starts writing the concatenation of `data` at `offset`; `done` runs
    /// when it is stored. The slices need only live for this call (a
    /// backend copies what it keeps). Default: `write_at`, then `done`.
    fn submit_write(&self, offset: u64, data: &[&[u8]], done: IoDone) {
        done(write_each(self, offset, data).map(|()| &[][..]))
    }
    /// Starts reading `len` bytes at `offset`; `done` gets them. Default:
    /// `read_at`, then `done`.
    fn submit_read(&self, offset: u64, len: usize, done: IoDone) {
        let mut v = vec![0u8; len];
        let r = self.read_at(offset, &mut v);
        done(r.map(|()| &v[..]))
    }
    /// Stores the bytes of registered memory `src` at `offset`. Default:
    /// copied into a buffer, then `write_at`.
    fn write_spans(&self, offset: u64, src: &MemSpans<'_>) -> std::io::Result<()> {
        let mut v = vec![0u8; src.len()];
        src.copy_to(0, &mut v);
        self.write_at(offset, &v)
    }
    /// Fills registered memory `dst` from `offset`. Default: `read_at`
    /// into a buffer, then copied.
    fn read_spans(&self, offset: u64, dst: &MemSpans<'_>) -> std::io::Result<()> {
        let mut v = vec![0u8; dst.len()];
        self.read_at(offset, &mut v)?;
        dst.copy_from(0, &v);
        Ok(())
    }
    /// Starts writing the bytes of registered memory `src` at `offset`
    /// (`src` is valid only during this call: a backend copies what it
    /// keeps); `done` runs when they are stored. Default: copied into a
    /// buffer, then `submit_write`.
    fn submit_write_spans(&self, offset: u64, src: &MemSpans<'_>, done: IoDone) {
        let mut v = vec![0u8; src.len()];
        src.copy_to(0, &mut v);
        self.submit_write(offset, &[&v], done)
    }
}

/// Writes the concatenation of `data` at `offset` with
/// [`RegionBackend::write_at`], piece by piece (what a synchronous
/// `submit_write` does).
pub fn write_each<B: RegionBackend + ?Sized>(
    b: &B,
    offset: u64,
    data: &[&[u8]],
) -> std::io::Result<()> {
    let mut at = offset;
    for d in data {
        b.write_at(at, d)?;
        at += d.len() as u64;
    }
    Ok(())
}
