//! [`MemSpans`]: registered memory as a storage backend sees it (`backend.rs`).
//!
//! The application, or a peer through the engine, may write registered
//! memory at any moment, as a NIC's DMA may; so it is never handed out as
//! a Rust slice (`&[u8]` promises that nobody writes it meanwhile). A
//! backend gets this view instead: copies in and out of buffers of its own,
//! and positioned file I/O straight from or into the memory (the kernel
//! copies, no Rust reference is made). A racing write gives the backend old
//! or new bytes, never undefined behaviour.

use crate::sys::RawSpan;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;

/// The memory of one request (a local QP's RDMA Write or Read on a backed
/// region), as a list of pieces, valid for the call it is passed to.
pub struct MemSpans<'a> {
    spans: &'a [RawSpan],
    len: usize,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> MemSpans<'a> {
    /// # Safety
    /// Every span is memory of a registration that the caller holds (and,
    /// for caller-owned memory, has entered) for as long as the returned
    /// value lives, readable, and writable where it is written through
    /// [`MemSpans::copy_from`] or [`MemSpans::pread`].
    pub(crate) unsafe fn new(spans: &'a [RawSpan]) -> MemSpans<'a> {
        MemSpans {
            spans,
            len: spans.iter().map(|s| s.len).sum(),
            _life: PhantomData,
        }
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the spans hold no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies bytes `[off, off + dst.len())` of the memory into `dst`.
    pub fn copy_to(&self, off: usize, dst: &mut [u8]) {
        let mut k = 0;
        self.pieces(off, dst.len(), |p, n| {
            // SAFETY: `p..p+n` lies in a span readable for our life
            // (`new`'s contract); `dst[k..k+n]` is ours and distinct.
            unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr().add(k), n) };
            k += n;
        });
    }

    /// Copies `src` into the memory at `off`.
    pub fn copy_from(&self, off: usize, src: &[u8]) {
        let mut k = 0;
        self.pieces(off, src.len(), |p, n| {
            // SAFETY: `p..p+n` lies in a span writable for our life
            // (`new`'s contract); `src` is ours and distinct.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(k), p, n) };
            k += n;
        });
    }

    /// Calls `f(ptr, n)` for the pieces of `[off, off + len)`, in order.
    fn pieces(&self, mut off: usize, mut len: usize, mut f: impl FnMut(*mut u8, usize)) {
        self.check(off, len);
        for s in self.spans {
            if len == 0 {
                break;
            }
            if off >= s.len {
                off -= s.len;
                continue;
            }
            let n = (s.len - off).min(len);
            // SAFETY: off < s.len keeps the pointer inside the span.
            f(unsafe { s.ptr.add(off) }, n);
            len -= n;
            off = 0;
        }
    }

    /// Writes bytes `[off, off + len)` of the memory to `file` at `at`
    /// (pwrite(2) from the memory itself, all of it or an error).
    pub fn pwrite(&self, off: usize, len: usize, file: &impl AsRawFd, at: u64) -> io::Result<()> {
        self.each(off, len, at, |p, n, at| {
            // SAFETY: `p..p+n` lies in a span readable for our life.
            unsafe { libc::pwrite(file.as_raw_fd(), p as *const libc::c_void, n, at as i64) }
        })
    }

    /// Reads `len` bytes of `file` at `at` into the memory at `off`
    /// (pread(2) into the memory itself, all of them or an error).
    pub fn pread(&self, off: usize, len: usize, file: &impl AsRawFd, at: u64) -> io::Result<()> {
        self.each(off, len, at, |p, n, at| {
            // SAFETY: `p..p+n` lies in a span writable for our life.
            unsafe { libc::pread(file.as_raw_fd(), p as *mut libc::c_void, n, at as i64) }
        })
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "range {off}+{len} outside {} bytes of spans",
            self.len
        );
    }

    /// Calls `io(ptr, n, file offset)` over the pieces of `[off, off +
    /// len)` until each is done; a short transfer continues, 0 is an
    /// unexpected end of file.
    fn each(
        &self,
        off: usize,
        len: usize,
        mut at: u64,
        io: impl Fn(*mut u8, usize, u64) -> isize,
    ) -> io::Result<()> {
        let mut res = Ok(());
        self.pieces(off, len, |p, n| {
            let mut k = 0;
            while res.is_ok() && k < n {
                // SAFETY: k < n keeps the pointer inside the piece.
                let r = io(unsafe { p.add(k) }, n - k, at);
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        res = Err(e);
                    }
                } else if r == 0 {
                    res = Err(io::ErrorKind::UnexpectedEof.into());
                } else {
                    k += r as usize;
                    at += r as u64;
                }
            }
        });
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_file_io_cross_span_boundaries() {
        let mut a = vec![0u8; 5];
        let mut b = vec![0u8; 7];
        let spans = [
            RawSpan {
                ptr: a.as_mut_ptr(),
                len: a.len(),
            },
            RawSpan {
                ptr: b.as_mut_ptr(),
                len: b.len(),
            },
        ];
        // SAFETY: both vectors outlive `m` and nothing else touches them.
        let m = unsafe { MemSpans::new(&spans) };
        assert_eq!(m.len(), 12);
        let src: Vec<u8> = (1..=12).collect();
        m.copy_from(0, &src);
        let mut out = [0u8; 6];
        m.copy_to(3, &mut out);
        assert_eq!(out, [4, 5, 6, 7, 8, 9]);
        let f = tempfile_in_tmp();
        m.pwrite(2, 9, &f, 100).unwrap();
        m.copy_from(0, &[0u8; 12]);
        m.pread(1, 9, &f, 100).unwrap();
        let mut all = [0u8; 12];
        m.copy_to(0, &mut all);
        assert_eq!(all, [0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0]);
        assert!(m.pread(0, 12, &f, 200).is_err(), "past the end of file");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_range_past_the_spans_is_refused() {
        let mut a = vec![0u8; 4];
        let spans = [RawSpan {
            ptr: a.as_mut_ptr(),
            len: 4,
        }];
        // SAFETY: as above.
        let m = unsafe { MemSpans::new(&spans) };
        m.copy_to(2, &mut [0u8; 3]);
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("softrdma-memspans-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
