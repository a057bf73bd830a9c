//! Asynchronous O_DIRECT I/O through io_uring: the endpoint's queue to the
//! device when requests may be in flight at once (a relaxed-ordering local
//! QP, up to its queue depth).
//!
//! One ring per opened endpoint. Any thread submits (the submission queue
//! is behind a mutex); one completion thread waits in `io_uring_enter` and
//! runs each request's [`IoDone`] when its completion arrives. Every
//! request owns its 4 KiB-aligned bounce buffer (RDMA payloads have no
//! alignment, O_DIRECT needs it), kept in the in-flight table until the
//! kernel is done with it; this is the one place in the crate with
//! `unsafe`, and each block says why it holds.

use parking_lot::{Condvar, Mutex};
use softrdma_verbs::IoDone;
use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of buffers, offsets and lengths.
pub const ALIGN: usize = 4096;

/// Submission queue entries; also the most requests in flight.
const ENTRIES: u32 = 128;

/// A 4 KiB-aligned buffer carved out of a vector (the vector's heap block
/// never moves while the request owns it).
pub struct Aligned {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Aligned {
        let v = vec![0u8; len + ALIGN];
        let start = v.as_ptr().align_offset(ALIGN);
        Aligned { v, start, len }
    }
    /// Its bytes.
    pub fn get(&mut self) -> &mut [u8] {
        &mut self.v[self.start..self.start + self.len]
    }
    fn ptr(&mut self) -> *mut u8 {
        self.get().as_mut_ptr()
    }
}

struct Op {
    buf: Aligned,
    read: bool,
    done: IoDone,
}

struct Inner {
    ring: io_uring::IoUring,
    /// Guards the submission queue (one `SubmissionQueue` at a time).
    sq: Mutex<()>,
    inflight: Mutex<Table>,
    room: Condvar,
    stop: AtomicBool,
    /// Bounce buffers of [`POOLED`] bytes to reuse (no allocation, no
    /// zeroing, no page faults per request).
    pool: Mutex<Vec<Vec<u8>>>,
    /// Submitters holding the doorbell ([`Ring::hold`]): entries queued
    /// meanwhile reach the kernel with the last [`Ring::release`].
    held: AtomicUsize,
}

#[derive(Default)]
struct Table {
    ops: HashMap<u64, Op>,
    next: u64,
}

/// An io_uring with its completion thread.
pub struct Ring {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `IORING_ENTER_GETEVENTS` (linux/io_uring.h; the crate keeps its
/// constants private).
const ENTER_GETEVENTS: u32 = 1;

/// `user_data` of the wake-up sent at shutdown.
const WAKE: u64 = u64::MAX;

impl Ring {
    /// A ring, or the reason the kernel refused one (io_uring disabled,
    /// say): the caller then does its I/O synchronously.
    pub fn new() -> io::Result<Ring> {
        let ring = io_uring::IoUring::new(ENTRIES)?;
        let inner = Arc::new(Inner {
            ring,
            sq: Mutex::new(()),
            inflight: Mutex::new(Table::default()),
            room: Condvar::new(),
            stop: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            pool: Mutex::new(Vec::new()),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("storage-uring".into())
            .spawn(move || i.reap())?;
        Ok(Ring {
            inner,
            thread: Some(thread),
        })
    }

    /// A bounce buffer of `len` bytes for [`Ring::write`]: a reused one
    /// up to 128 KiB. Its bytes are unspecified.
    pub fn buffer(&self, len: usize) -> Aligned {
        self.inner.buffer(len)
    }

    /// Writes `buf` at `offset` of `fd` (both aligned); `done` gets an
    /// empty slice or the error.
    pub fn write(&self, fd: RawFd, offset: u64, buf: Aligned, done: IoDone) {
        self.inner.submit(fd, offset, buf, false, done)
    }

    /// Reads `len` bytes (aligned) at `offset`; `done` gets them.
    pub fn read(&self, fd: RawFd, offset: u64, len: usize, done: IoDone) {
        let buf = self.inner.buffer(len);
        self.inner.submit(fd, offset, buf, true, done)
    }

    /// Holds the doorbell: requests queued until the matching
    /// [`Ring::release`] go to the kernel together, one system call and
    /// one device notification for the batch.
    pub fn hold(&self) {
        self.inner.held.fetch_add(1, Ordering::AcqRel);
    }

    /// Releases the doorbell; the last holder submits what was queued.
    pub fn release(&self) {
        if self.inner.held.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.enter();
        }
    }

    /// Hands whatever is queued to the kernel now, doorbell held or not
    /// (for a submitter about to wait for one of its own requests).
    pub fn kick(&self) {
        self.inner.enter();
    }

    /// Waits until no request is in flight.
    pub fn drain(&self) {
        let mut t = self.inner.inflight.lock();
        while !t.ops.is_empty() {
            self.inner.room.wait(&mut t);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The last owner may be a completion callback on the completion
        // thread itself (it held the last request of a closed session):
        // then nothing is in flight but that one, and the thread ends on
        // the wake-up after the callback returns.
        let on_reaper = self
            .thread
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id());
        if !on_reaper {
            self.drain();
        }
        self.inner.stop.store(true, Ordering::Release);
        self.inner
            .push(&io_uring::opcode::Nop::new().build().user_data(WAKE));
        if let Some(t) = self.thread.take() {
            if !on_reaper {
                let _ = t.join();
            }
        }
    }
}

/// Size of a pooled bounce buffer's vector.
const POOLED: usize = (128 << 10) + ALIGN;
/// Most pooled buffers kept.
const POOL_MAX: usize = 64;

impl Inner {
    fn buffer(&self, len: usize) -> Aligned {
        if len + ALIGN > POOLED {
            return Aligned::new(len);
        }
        let v = self.pool.lock().pop().unwrap_or_else(|| vec![0u8; POOLED]);
        let start = v.as_ptr().align_offset(ALIGN);
        Aligned { v, start, len }
    }

    fn recycle(&self, v: Vec<u8>) {
        if v.len() == POOLED {
            let mut p = self.pool.lock();
            if p.len() < POOL_MAX {
                p.push(v);
            }
        }
    }

    fn submit(&self, fd: RawFd, offset: u64, mut buf: Aligned, read: bool, done: IoDone) {
        debug_assert!(offset.is_multiple_of(ALIGN as u64) && buf.len.is_multiple_of(ALIGN));
        let (ptr, len) = (buf.ptr(), buf.len as u32);
        let id = {
            let mut t = self.inflight.lock();
            while t.ops.len() >= ENTRIES as usize {
                // Some of them may wait behind a held doorbell (ours, or
                // another submitter's): hand them to the kernel, or no
                // completion will ever make room.
                self.enter();
                self.room.wait(&mut t);
            }
            t.next += 1;
            let id = t.next;
            // The buffer moves into the table; its heap block (where `ptr`
            // points) stays put until the completion takes it out.
            t.ops.insert(id, Op { buf, read, done });
            id
        };
        let fd = io_uring::types::Fd(fd);
        let sqe = if read {
            io_uring::opcode::Read::new(fd, ptr, len)
        } else {
            return self.push(
                &io_uring::opcode::Write::new(fd, ptr, len)
                    .offset(offset)
                    .build()
                    .user_data(id),
            );
        };
        self.push(&sqe.offset(offset).build().user_data(id));
    }

    /// Queues one entry and tells the kernel.
    fn push(&self, e: &io_uring::squeue::Entry) {
        let _g = self.sq.lock();
        loop {
            // SAFETY: `sq` is held, so this is the only SubmissionQueue.
            let mut sq = unsafe { self.ring.submission_shared() };
            // SAFETY: the entry's buffer belongs to an Op in the in-flight
            // table, which keeps it until this entry's completion has been
            // reaped (or it is a Nop without a buffer).
            let pushed = unsafe { sq.push(e) }.is_ok();
            sq.sync();
            drop(sq);
            // A full queue goes to the kernel even with the doorbell held.
            if !pushed || self.held.load(Ordering::Acquire) == 0 {
                self.enter();
            }
            if pushed {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Hands the queued entries to the kernel.
    fn enter(&self) {
        if let Err(err) = self.ring.submit() {
            // EBUSY/EAGAIN: completions must be reaped first; the
            // completion thread does that, and the caller tries again.
            if !matches!(err.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) {
                tracing::error!("io_uring submit failed: {err}");
            }
        }
    }

    /// The completion thread.
    fn reap(&self) {
        // Completions taken off the queue in one pass (kept across passes).
        let mut ended = Vec::new();
        loop {
            // Wait only: submitting is the submitters' business (and
            // would contend for the ring's submission lock with them).
            // SAFETY: no entries are submitted by this call and no
            // argument is passed.
            let waited = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
            };
            if let Err(e) = waited {
                if e.raw_os_error() != Some(libc::EINTR) {
                    tracing::error!("io_uring wait failed: {e}");
                }
            }
            {
                // SAFETY: only this thread ever looks at the completion
                // queue.
                let cq = unsafe { self.ring.completion_shared() };
                for c in cq {
                    ended.push((c.user_data(), c.result()));
                }
            }
            let mut stop = false;
            for (id, res) in ended.drain(..) {
                if id == WAKE {
                    stop = true;
                    continue;
                }
                let op = self.inflight.lock().ops.remove(&id);
                let Some(mut op) = op else {
                    tracing::error!(id, "io_uring completion for no request");
                    continue;
                };
                let want = op.buf.len;
                let r = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if res as usize != want {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("short transfer: {res} of {want} bytes"),
                    ))
                } else {
                    Ok(())
                };
                let read = op.read;
                let bytes = op.buf.get();
                (op.done)(r.map(|()| if read { &bytes[..] } else { &[][..] }));
                self.recycle(op.buf.v);
                self.room.notify_all();
            }
            if stop && self.stop.load(Ordering::Acquire) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    /// Writes and reads back through the ring, many at once, on a file
    /// opened with O_DIRECT where the file system allows it.
    #[test]
    fn writes_and_reads_round_trip() {
        let Ok(ring) = Ring::new() else {
            panic!("io_uring unavailable (kernel.io_uring_disabled?)");
        };
        let dir = std::env::temp_dir().join(format!("softrdma-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .or_else(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
            })
            .unwrap();
        f.set_len(64 * ALIGN as u64).unwrap();
        let fd = f.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..64u64 {
            let mut b = Aligned::new(ALIGN);
            b.get().fill(i as u8 ^ 0x5a);
            let tx = tx.clone();
            ring.write(
                fd,
                i * ALIGN as u64,
                b,
                Box::new(move |r| tx.send(r.map(|_| ()).map_err(|e| e.to_string())).unwrap()),
            );
        }
        for _ in 0..64 {
            rx.recv().unwrap().unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..64u64 {
            let tx = tx.clone();
            ring.read(
                fd,
                i * ALIGN as u64,
                ALIGN,
                Box::new(move |r| {
                    let ok = r.map(|b| b.iter().all(|&x| x == i as u8 ^ 0x5a));
                    tx.send((i, ok.map_err(|e| e.to_string()))).unwrap()
                }),
            );
        }
        for _ in 0..64 {
            let (i, ok) = rx.recv().unwrap();
            assert_eq!(ok, Ok(true), "block {i}");
        }
        // A read past the end is short: an error, not a panic.
        let (tx, rx) = std::sync::mpsc::channel();
        ring.read(
            fd,
            64 * ALIGN as u64,
            ALIGN,
            Box::new(move |r| tx.send(r.is_err()).unwrap()),
        );
        assert!(rx.recv().unwrap(), "a short read must fail");
        drop(ring);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
