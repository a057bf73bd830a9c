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
//! A name the kernel refuses (module not loaded) is logged once and the
//! connection keeps the default.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// The congestion control used on connections to this host.
pub const LOOPBACK_CONGESTION: &str = "cubic";

/// The congestion control a connection from `local` to `peer` gets, or
/// `None` for the system default (see the module documentation).
pub fn congestion_for(local: SocketAddr, peer: SocketAddr) -> Option<String> {
    static FORCED: OnceLock<Option<String>> = OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        std::env::var("SOFTRDMA_TCP_CONGESTION")
            .ok()
            .filter(|v| !v.is_empty())
    });
    policy(forced.as_deref(), local, peer)
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

/// Sets up a connected TCP socket the way the engine does its own:
/// `TCP_NODELAY` and the congestion control of [`congestion_for`].
pub fn tune_tcp(s: &TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let (local, peer) = (s.local_addr()?, s.peer_addr()?);
    if let Some(cc) = congestion_for(local, peer) {
        if let Err(e) = crate::sys::set_tcp_congestion(s.as_raw_fd(), &cc) {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                tracing::warn!(congestion = %cc, error = %e, "cannot set TCP congestion control; keeping the default");
            });
        }
    }
    Ok(())
}

/// The congestion control `s` uses (for reports and tests).
pub fn congestion_of(s: &TcpStream) -> Option<String> {
    crate::sys::tcp_congestion(s.as_raw_fd())
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
