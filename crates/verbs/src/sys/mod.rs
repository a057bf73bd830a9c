//! Thin, audited wrappers around the Linux system calls the engine uses:
//! epoll, eventfd, and socket I/O to and from raw memory (the placement
//! path). Every `unsafe` block here carries a `// SAFETY:` comment.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

mod wait;
pub use wait::{wait_any_readable, wait_writable, Epoll, EventFd, EV_ERR, EV_IN, EV_OUT};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// One piece of memory to send from or receive into.
#[derive(Clone, Copy, Debug)]
pub struct RawSpan {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a RawSpan is only an address range; whoever dereferences it must
// hold the registration that keeps the memory alive (see mr.rs).
unsafe impl Send for RawSpan {}
// SAFETY: as for Send: an address range, dereferenced only under a
// registration.
unsafe impl Sync for RawSpan {}

/// Most messages [`send_runs`] writes in one call.
pub const MAX_RUNS: usize = 16;

/// Whether `sendmmsg` may carry a stream's TCP segment runs: the kernel
/// must honour a per-message `MSG_EOR` (Linux 4.7) and stop the batch at a
/// message it wrote only in part (Linux 5.3, "sock: fix sendmmsg for
/// partial sendmsg"): an older one went on with the next message, which on
/// a stream socket tears the stream.
pub fn sendmmsg_safe() -> bool {
    static SAFE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAFE.get_or_init(|| {
        // SAFETY: utsname is plain data; uname fills it.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid utsname to write to.
        if unsafe { libc::uname(&mut u) } != 0 {
            return false;
        }
        let release: String = u
            .release
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        kernel_at_least(&release, (5, 3))
    })
}

/// Whether a kernel release string ("6.1.0-18-amd64") is at least `min`.
pub fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= min,
        _ => false,
    }
}

/// Several segment runs of a stream in one `sendmmsg`, non-blocking,
/// without SIGPIPE: run `i` is `spans[runs[i].0..runs[i].1]`, ending with
/// `MSG_EOR` when `runs[i].2` (see [`send_spans`]). Returns the bytes
/// written: the runs before the first one written in part, and that part
/// (the kernel stops there, [`sendmmsg_safe`]). At most [`MAX_RUNS`] runs
/// and 64 spans.
///
/// # Safety
/// Every span must be readable memory that stays valid during the call.
pub unsafe fn send_runs(
    fd: RawFd,
    spans: &[RawSpan],
    runs: &[(usize, usize, bool)],
) -> io::Result<usize> {
    assert!(runs.len() <= MAX_RUNS && spans.len() <= 64);
    let mut iov: [libc::iovec; 64] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    for (i, s) in spans.iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    // SAFETY: zeroed mmsghdrs are valid empty headers.
    let mut msgs: [libc::mmsghdr; MAX_RUNS] = unsafe { std::mem::zeroed() };
    for (m, &(a, b, eor)) in msgs.iter_mut().zip(runs) {
        assert!(a <= b && b <= spans.len(), "a run within the spans");
        // SAFETY: a <= spans.len() <= 64 keeps the pointer within `iov`.
        m.msg_hdr.msg_iov = unsafe { iov.as_mut_ptr().add(a) };
        m.msg_hdr.msg_iovlen = (b - a) as _;
        m.msg_hdr.msg_flags = if eor { libc::MSG_EOR } else { 0 };
    }
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    // SAFETY: `runs.len()` headers, each pointing at initialised iovecs in
    // `iov`, all living across the call; the caller guarantees the spans.
    let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), runs.len() as libc::c_uint, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(msgs[..r as usize].iter().map(|m| m.msg_len as usize).sum())
}

/// `sendmsg` of a list of spans, non-blocking, without SIGPIPE. With `eor`
/// the call passes `MSG_EOR`: TCP appends nothing further to the segment
/// buffer that ends with these bytes, so the next write starts a new
/// segment (MPA's FPDU alignment).
///
/// # Safety
/// Every span must be readable memory that stays valid during the call.
pub unsafe fn send_spans(fd: RawFd, spans: &[RawSpan], eor: bool) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if eor { libc::MSG_EOR } else { 0 };
    // Small sends (a latency-bound 8-byte Write is a 40-byte FPDU in three
    // pieces): gather into one buffer and use plain send, which spares the
    // kernel importing a msghdr and an iovec array.
    const SMALL: usize = 512;
    let total: usize = spans.iter().map(|s| s.len).sum();
    if total <= SMALL && spans.len() <= 8 {
        let mut buf = [0u8; SMALL];
        let mut at = 0;
        for s in spans {
            // SAFETY: the caller guarantees each span is valid readable
            // memory; `at + s.len <= total <= SMALL` bounds the copy.
            unsafe {
                std::ptr::copy_nonoverlapping(s.ptr as *const u8, buf.as_mut_ptr().add(at), s.len)
            };
            at += s.len;
        }
        // SAFETY: buf holds `total` initialised bytes.
        return cvt_size(unsafe {
            libc::send(fd, buf.as_ptr() as *const libc::c_void, total, flags)
        });
    }
    let mut iov: [libc::iovec; 64] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    let n = spans.len().min(iov.len());
    for (i, s) in spans[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    // SAFETY: msghdr is zero-initialised (a valid empty header), then given a
    // pointer to `n` initialised iovecs that live across the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the caller guarantees every span is valid readable memory.
    cvt_size(unsafe { libc::sendmsg(fd, &msg, flags) })
}

/// Writes `buf`, which begins at byte `pos` of the stream, to the blocking
/// stream `fd` in messages that end at every multiple of `seg` bytes of
/// the stream, each with `MSG_EOR`, up to [`MAX_RUNS`] per `sendmmsg` (see
/// [`crate::tcp::write_segments`]).
pub fn write_segments(fd: RawFd, buf: &[u8], seg: usize, pos: u64) -> io::Result<()> {
    assert!(seg > 0, "a segment size");
    let max = if sendmmsg_safe() { MAX_RUNS } else { 1 };
    let mut at = 0;
    while at < buf.len() {
        let mut spans = [RawSpan {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; MAX_RUNS];
        let mut runs = [(0usize, 0usize, true); MAX_RUNS];
        let mut n = 0;
        let mut p = at;
        while n < max && p < buf.len() {
            // To the next boundary (a message written in part goes on to
            // its own end, as the transmitter's runs do).
            let in_seg = ((pos + p as u64) % seg as u64) as usize;
            let len = (seg - in_seg).min(buf.len() - p);
            spans[n] = RawSpan {
                ptr: buf[p..].as_ptr() as *mut u8,
                len,
            };
            runs[n] = (n, n + 1, true);
            n += 1;
            p += len;
        }
        // SAFETY: every span lies in `buf`, borrowed for the call, and the
        // system calls only read it.
        let r = unsafe {
            if n == 1 {
                send_spans(fd, &spans[..1], true)
            } else {
                send_runs(fd, &spans[..n], &runs[..n])
            }
        };
        match r {
            Ok(k) => at += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(fd),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The connection's maximum segment size (`TCP_MAXSEG`), or `None`.
pub fn tcp_mss(fd: RawFd) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && v > 0).then_some(v as usize)
}

/// `recvmsg` into a list of spans (direct data placement), non-blocking.
/// Returns Ok(0) at end of stream.
///
/// # Safety
/// Every span must be writable memory that stays valid during the call and
/// that no one else reads or writes as a Rust reference meanwhile.
pub unsafe fn recv_spans(fd: RawFd, spans: &[RawSpan]) -> io::Result<usize> {
    if let [s] = spans {
        // One span: plain recv, which spares the kernel copying in a
        // msghdr and an iovec (measurable on the busy-polled latency
        // path, where most calls find nothing).
        // SAFETY: the caller guarantees the span is valid writable memory.
        return cvt_size(unsafe {
            libc::recv(fd, s.ptr as *mut libc::c_void, s.len, libc::MSG_DONTWAIT)
        });
    }
    let mut iov: [libc::iovec; 16] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 16];
    let n = spans.len().min(iov.len());
    for (i, s) in spans[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    // SAFETY: as in send_spans.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the caller guarantees every span is valid writable memory.
    cvt_size(unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) })
}

/// Plain non-blocking recv into a byte slice.
pub fn recv_into(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid writable slice for its whole length.
    cvt_size(unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    })
}

/// Shuts down a socket in both directions (wakes up any poller).
pub fn shutdown(fd: RawFd) {
    // SAFETY: no pointer arguments.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Drops a TCP connection with a reset (RST) instead of a FIN, keeping
/// the descriptor open (so no other file can take its number while the
/// engine still holds it): `connect` with `AF_UNSPEC` runs Linux's
/// `tcp_disconnect`, which resets an established, closing or half-closed
/// connection and leaves no TIME_WAIT behind.
pub fn reset(fd: RawFd) {
    // SAFETY: an all-zero sockaddr is valid; family AF_UNSPEC. connect()
    // reads `size_of::<sockaddr>()` bytes from it and keeps no pointer.
    unsafe {
        let mut sa: libc::sockaddr = std::mem::zeroed();
        sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            fd,
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `std::time::Instant` reads
/// on Linux, shared by every process of the host (region deadlines,
/// `MemoryRegion::set_valid_until`, are compared with it on both sides of
/// the same-host transport).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists
    // on every Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `mono_ns` value of `t`.
pub fn instant_ns(t: std::time::Instant) -> u64 {
    let (now, mono) = (std::time::Instant::now(), mono_ns());
    if t >= now {
        mono.saturating_add(u64::try_from((t - now).as_nanos()).unwrap_or(u64::MAX))
    } else {
        mono.saturating_sub(u64::try_from((now - t).as_nanos()).unwrap_or(u64::MAX))
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no pointer arguments.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

// ------------------------------------------------------------ same host

/// A shared mapping of a file (a memfd), unmapped on drop.
#[derive(Debug)]
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to it goes
// through raw pointers and atomics by code that documents its
// synchronisation (shm.rs).
unsafe impl Send for SharedMap {}
// SAFETY: as for Send.
unsafe impl Sync for SharedMap {}

/// Where the engine's shared mappings go: a range of their own (from 16
/// TiB up), away from where the kernel places ordinary mappings (top-down
/// below the stack). Same-host segments take gigabytes of address space,
/// and applications such as the HA store need to map memory at an address
/// another process chose there.
static NEXT_HINT: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0x1000_0000_0000);

impl SharedMap {
    /// Maps `len` bytes of `fd` from offset 0, read-write and shared.
    pub fn map(fd: RawFd, len: usize) -> io::Result<SharedMap> {
        const GAP: u64 = 1 << 30;
        let span = (len as u64).div_ceil(GAP) * GAP + GAP;
        let hint = NEXT_HINT.fetch_add(span, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a fresh mapping; the address is only a hint (no
        // MAP_FIXED), so the kernel never places it over existing memory;
        // fd is a valid descriptor.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: p as *mut u8,
            len,
        })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing uses the
        // mapping after its owner drops it.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// An anonymous memory file (`memfd_create`) of `len` bytes (sparse:
/// pages are allocated when first touched).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: c is a valid NUL-terminated string for the call.
    let fd = cvt(unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: no pointer arguments.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
    Ok(fd)
}

/// Opens descriptor `fd` of process `pid` (`/proc/PID/fd/FD`); needs the
/// same rights over that process as `process_vm_readv`.
pub fn open_peer_fd(pid: u32, fd: u32) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    // SAFETY: path is a valid NUL-terminated string for the call.
    let r = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: r is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Whether process `pid` exists (signal 0).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: no pointer arguments; signal 0 only checks.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn iovecs(spans: &[RawSpan]) -> Vec<libc::iovec> {
    spans
        .iter()
        .map(|s| libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        })
        .collect()
}

/// `process_vm_writev`: copies `local` into process `pid` at `remote`
/// (one range). Returns the bytes copied.
///
/// # Safety
/// Every local span must be readable memory valid for the call. (The
/// remote range is checked by the kernel: a bad one fails with EFAULT.)
pub unsafe fn vm_write(pid: u32, local: &[RawSpan], remote: u64, len: usize) -> io::Result<usize> {
    let l = iovecs(local);
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: l holds valid iovecs of readable memory (caller's contract);
    // the remote iovec is only interpreted in the other process.
    cvt_size(unsafe {
        libc::process_vm_writev(pid as libc::pid_t, l.as_ptr(), l.len() as _, &r, 1, 0)
    })
}

/// `process_vm_readv`: copies `len` bytes at `remote` in process `pid`
/// into `local`. Returns the bytes copied.
///
/// # Safety
/// Every local span must be writable memory valid for the call that no
/// one else accesses meanwhile.
pub unsafe fn vm_read(pid: u32, local: &[RawSpan], remote: u64, len: usize) -> io::Result<usize> {
    let l = iovecs(local);
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: as in vm_write, for writable local memory.
    cvt_size(unsafe {
        libc::process_vm_readv(pid as libc::pid_t, l.as_ptr(), l.len() as _, &r, 1, 0)
    })
}

/// This kernel instance (`/proc/sys/kernel/random/boot_id`, 16 bytes).
pub fn boot_id() -> Option<[u8; 16]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(b)
}

/// The inode of this process's namespace `kind` (`/proc/self/ns/KIND`).
pub fn namespace(kind: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/self/ns/{kind}"))
        .ok()
        .map(|m| m.ino())
}

/// The inode number and size of the file behind `fd`.
pub fn fd_ino_size(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: st is plain old data, written whole by fstat before use.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid for writes of a stat.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_ino, st.st_size as u64))
}

/// Duplicates `fd` (close-on-exec).
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: no pointer arguments.
    let r = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: r is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Gives `[off, off + len)` of a memory file back to the system; it reads
/// as zeros afterwards.
pub fn punch_hole(fd: RawFd, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: no pointer arguments.
    cvt(unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    })?;
    Ok(())
}

/// The real user id of the process.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// shutdown(SHUT_RDWR) on a socket the caller knows to be open (errors,
/// such as a socket already shut down, are ignored).
pub(crate) fn shutdown_both(fd: RawFd) {
    // SAFETY: shutdown takes a descriptor and a flag and touches no memory
    // of ours; on a bad descriptor it fails with EBADF.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Sets the connection's congestion control algorithm (`TCP_CONGESTION`).
pub fn set_tcp_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: the option value is `name`'s bytes, valid for reads of the
    // length given for the duration of the call.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// The connection's congestion control algorithm, or `None`.
pub fn tcp_congestion(fd: RawFd) -> Option<String> {
    let mut buf = [0u8; 32];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    let b = &buf[..(len as usize).min(buf.len())];
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8(b[..end].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    #[test]
    fn kernel_releases_compare() {
        assert!(kernel_at_least("6.1.0-18-amd64", (5, 3)));
        assert!(kernel_at_least("5.3.0", (5, 3)));
        assert!(kernel_at_least("5.10.0-28-cloud-amd64", (5, 3)));
        assert!(!kernel_at_least("5.2.21", (5, 3)));
        assert!(!kernel_at_least("4.19.0-26-amd64", (5, 3)));
        assert!(!kernel_at_least("garbage", (5, 3)));
    }

    /// Runs written with `send_runs` arrive whole and in order, and the
    /// count returned is what the peer reads.
    #[test]
    fn send_runs_keeps_the_stream_in_order() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut b: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let mut h = *b"header";
        let span = |v: &mut [u8]| RawSpan {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        };
        let spans = [span(&mut h), span(&mut a), span(&mut b), span(&mut h)];
        // Three runs: [h a], [b], [h].
        let runs = [(0, 2, true), (2, 3, true), (3, 4, false)];
        // SAFETY: the spans are the live vectors and array above.
        let n = unsafe { send_runs(c.as_raw_fd(), &spans, &runs) }.unwrap();
        let want: Vec<u8> = [&h[..], &a, &b, &h].concat();
        assert_eq!(n, want.len());
        let mut got = vec![0u8; n];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, want);
    }

    /// `write_segments` delivers the whole buffer in order, through a full
    /// socket (24 MiB is more than both socket buffers hold) and from a
    /// position inside a segment.
    #[test]
    fn write_segments_delivers_everything_in_order() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let data: Vec<u8> = (0..(24u32 << 20)).map(|i| (i % 251) as u8).collect();
        let want = data.clone();
        let w = std::thread::spawn(move || {
            write_segments(c.as_raw_fd(), &data[..1000], 9000, 0).unwrap();
            write_segments(c.as_raw_fd(), &data[1000..], 9000, 1000).unwrap();
        });
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        w.join().unwrap();
        assert!(got == want, "the stream arrived changed");
    }
}
