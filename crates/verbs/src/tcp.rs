//! How the engine sets up the TCP sockets under its connections.
//!
//! Every iWARP connection (and, through [`tune_tcp`], the benchmark's raw
//! TCP baselines, so that the comparison is between like sockets) gets
//! `TCP_NODELAY` and a congestion control chosen by [`congestion_for`]:
//!
//! * A connection whose peer is this host (a loopback address, or the
//!   connection's own local address) uses `cubic`. The system default on
//!   many hosts is `bbr`, which paces its sends; without the `fq` qdisc
//!   the kernel paces internally, sending part of the stream from a timer
//!   that fires on whichever CPU, while the application's thread sends the
//!   rest. Loopback delivers each segment through the per-CPU backlog of
//!   the CPU that sent it, so the stream arrives reordered: the receiver
//!   SACKs, the sender "recovers" and retransmits what was never lost
//!   (DSACK), and the flow stalls for milliseconds. Measured here
//!   (`softrdma bench --loopback --test read_bw --size 65536 --no-ext`):
//!   with `bbr` 15-40 spurious retransmissions per 2 s run and p99 5-6x
//!   p50; with `cubic` none, p99 1.3-2x p50. Between two hosts a NIC
//!   queue keeps a flow in order (the kernel changes a flow's queue only
//!   when nothing is in flight), so there the system's choice stands.
//! * `SOFTRDMA_TCP_CONGESTION=NAME` sets `NAME` on every connection
//!   instead; `SOFTRDMA_TCP_CONGESTION=system` leaves every connection,
//!   loopback included, to the system default.
//!
//! **The choice is made before the connection exists**: on the
//! connecting socket before `connect` ([`connect`]), on the listening
//! socket for the connections it accepts ([`listen`]; an accepted
//! connection from another host is then switched to the system default,
//! [`tune_accepted`]). Switching an established connection away from `bbr`
//! is not enough: `bbr`'s set-up at the handshake marks the socket as
//! needing internal pacing, and that mark outlives the switch, so a
//! `cubic` connection that began as `bbr` went on pacing from a timer and
//! reordering on loopback (measured: 40-197 spurious retransmissions per
//! 2 s `write_bw --size 1048576 --no-ext` run, p99 up to 5.8x p50; none,
//! and p99 at most 2.3x p50, once the connection was `cubic` from its
//! first segment).
//!
//! A name the kernel refuses (module not loaded) is logged once and the
//! connection keeps the default.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The congestion control used on connections to this host.
pub const LOOPBACK_CONGESTION: &str = "cubic";

/// `SOFTRDMA_TCP_CONGESTION`, read once.
fn forced() -> Option<&'static str> {
    static FORCED: OnceLock<Option<String>> = OnceLock::new();
    FORCED
        .get_or_init(|| {
            std::env::var("SOFTRDMA_TCP_CONGESTION")
                .ok()
                .filter(|v| !v.is_empty())
        })
        .as_deref()
}

/// The congestion control a connection from `local` to `peer` gets, or
/// `None` for the system default (see the module documentation).
pub fn congestion_for(local: SocketAddr, peer: SocketAddr) -> Option<String> {
    policy(forced(), local, peer)
}

fn policy(forced: Option<&str>, local: SocketAddr, peer: SocketAddr) -> Option<String> {
    match forced {
        Some("system") => None,
        Some(name) => Some(name.to_string()),
        None if peer.ip().is_loopback() || peer.ip() == local.ip() => {
            Some(LOOPBACK_CONGESTION.to_string())
        }
        None => None,
    }
}

/// Whether `ip` is an address of this host (loopback, unspecified, or one
/// a socket can bind to).
pub fn is_local_addr(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Sets `cc` on `fd`, logging (once) when the kernel refuses.
fn set_congestion(fd: std::os::fd::RawFd, cc: &str) {
    if let Err(e) = crate::sys::set_tcp_congestion(fd, cc) {
        static WARNED: OnceLock<()> = OnceLock::new();
        WARNED.get_or_init(|| {
            tracing::warn!(congestion = %cc, error = %e, "cannot set TCP congestion control; keeping the default");
        });
    }
}

/// The system's default congestion control (what a new socket gets).
fn system_default() -> Option<&'static str> {
    static DEFAULT: OnceLock<Option<String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).ok()?;
            crate::sys::tcp_congestion(s.as_raw_fd())
        })
        .as_deref()
}

/// Connects to `addr` (within `timeout`) with the engine's socket set-up:
/// the congestion control of [`congestion_for`] chosen before the
/// handshake, then `TCP_NODELAY`.
pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // The local address is not known yet: "this host" is any of its own.
    let local = if is_local_addr(addr.ip()) {
        addr
    } else {
        SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
    };
    if let Some(cc) = congestion_for(local, addr) {
        set_congestion(sock.as_raw_fd(), &cc);
    }
    sock.connect_timeout(&SockAddr::from(addr), timeout)?;
    let s: TcpStream = sock.into();
    s.set_nodelay(true)?;
    Ok(s)
}

/// A listener whose connections get the engine's socket set-up: it holds
/// the congestion control for connections from this host (they inherit
/// it at the handshake); call [`tune_accepted`] on each accepted one.
pub fn listen(addr: impl ToSocketAddrs) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    match forced() {
        Some("system") => {}
        Some(name) => set_congestion(l.as_raw_fd(), name),
        None => set_congestion(l.as_raw_fd(), LOOPBACK_CONGESTION),
    }
    Ok(l)
}

/// Sets up a connection accepted from a [`listen`] listener: `TCP_NODELAY`,
/// and a connection from another host goes back to the system default
/// (it began with the listener's loopback choice).
pub fn tune_accepted(s: &TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let (local, peer) = (s.local_addr()?, s.peer_addr()?);
    let want = congestion_for(local, peer).or_else(|| system_default().map(str::to_string));
    if let Some(cc) = want {
        if congestion_of(s).as_deref() != Some(cc.as_str()) {
            set_congestion(s.as_raw_fd(), &cc);
        }
    }
    Ok(())
}

/// Sets up a connected TCP socket the engine did not create itself:
/// `TCP_NODELAY` and the congestion control of [`congestion_for`]. (A
/// connection that began as `bbr` keeps pacing after the switch: prefer
/// [`connect`] and [`listen`].)
pub fn tune_tcp(s: &TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let (local, peer) = (s.local_addr()?, s.peer_addr()?);
    if let Some(cc) = congestion_for(local, peer) {
        set_congestion(s.as_raw_fd(), &cc);
    }
    Ok(())
}

/// The congestion control `s` uses (for reports and tests).
pub fn congestion_of(s: &TcpStream) -> Option<String> {
    crate::sys::tcp_congestion(s.as_raw_fd())
}

/// Writes `buf` (bytes `pos..` of the stream) to `s` as the siw framing's
/// transmitter writes a stream (`iwarp::Batch::write`): messages that end
/// at every multiple of `seg` stream bytes, each with `MSG_EOR` so the
/// next begins a TCP segment (as the transmitter packs FPDUs into whole
/// segments), up to
/// 16 of them per `sendmmsg` (one `sendmsg` each on
/// kernels before 5.3). Blocks until all is written. This is the bench's
/// `--baseline tcp-segments` pump: what the kernel charges a sender that
/// must start a segment every FPDU (MPA's 16-bit length caps an FPDU at
/// 64 KiB), measured without any framing.
pub fn write_segments(s: &TcpStream, buf: &[u8], seg: usize, pos: u64) -> std::io::Result<()> {
    crate::sys::write_segments(s.as_raw_fd(), buf, seg, pos)
}

/// The segment size the siw framing cuts FPDUs to on `s`: its current
/// MSS (`TCP_MAXSEG`), at most 65535 (MPA's length field).
pub fn fpdu_segment(s: &TcpStream) -> Option<usize> {
    crate::sys::tcp_mss(s.as_raw_fd()).map(|m| m.min(65535))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_and_own_address_get_cubic_others_the_default() {
        let lo = a("127.0.0.1:5000");
        assert_eq!(
            policy(None, lo, a("127.0.0.1:6000")).as_deref(),
            Some("cubic")
        );
        assert_eq!(
            policy(None, a("[::1]:1"), a("[::1]:2")).as_deref(),
            Some("cubic")
        );
        let me = a("10.1.2.3:5000");
        assert_eq!(
            policy(None, me, a("10.1.2.3:7000")).as_deref(),
            Some("cubic")
        );
        assert_eq!(policy(None, me, a("10.1.2.4:7000")), None);
        assert_eq!(policy(Some("system"), lo, a("127.0.0.1:6000")), None);
        assert_eq!(
            policy(Some("reno"), me, a("10.1.2.4:7000")).as_deref(),
            Some("reno")
        );
    }

    #[test]
    fn connect_and_listen_choose_before_the_handshake() {
        let l = listen("127.0.0.1:0").unwrap();
        let c = connect(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        let (s, _) = l.accept().unwrap();
        tune_accepted(&s).unwrap();
        if forced().is_none() {
            assert_eq!(congestion_of(&c).as_deref(), Some(LOOPBACK_CONGESTION));
            assert_eq!(congestion_of(&s).as_deref(), Some(LOOPBACK_CONGESTION));
        }
        assert!(c.nodelay().unwrap() && s.nodelay().unwrap());
        assert!(is_local_addr("127.0.0.1".parse().unwrap()));
        // TEST-NET-1 (RFC 5737) is never this host's.
        assert!(!is_local_addr("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn a_tuned_loopback_socket_uses_cubic() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        tune_tcp(&c).unwrap();
        tune_tcp(&s).unwrap();
        if std::env::var_os("SOFTRDMA_TCP_CONGESTION").is_none() {
            assert_eq!(congestion_of(&c).as_deref(), Some(LOOPBACK_CONGESTION));
            assert_eq!(congestion_of(&s).as_deref(), Some(LOOPBACK_CONGESTION));
        }
        assert!(c.nodelay().unwrap() && s.nodelay().unwrap());
    }
}
