//! What the environment sets for the drop-in (docs/libibverbs.md):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `SOFTRDMA_ADDR` | the device's address: its GID, `ibv_devinfo` | the address of the default route, else 127.0.0.1 |
//! | `SOFTRDMA_CRC` | `1`: ask for (and grant) MPA CRC32c | `0` |
//! | `SOFTRDMA_EXTENSIONS` | `1`/`0`: offer softrdma's extensions to the peer when connecting | only to peers on this host |
//! | `SOFTRDMA_SAME_HOST` | `0`: no shared-memory path between processes on one host | on (read by the engine) |
//! | `SOFTRDMA_LOG` | a `tracing` filter for logs on stderr (`info`, `debug`) | `warn` |
//! | `SOFTRDMA_PIN` | `0`: do not pin registered memory | pin where `RLIMIT_MEMLOCK` allows |

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: IpAddr,
    pub crc: bool,
    pub extensions: Option<bool>,
}

fn flag(name: &str) -> Option<bool> {
    match std::env::var(name).ok()?.trim() {
        "1" | "on" | "yes" | "true" => Some(true),
        "0" | "off" | "no" | "false" => Some(false),
        other => {
            tracing::warn!(variable = name, value = other, "not 0 or 1; ignored");
            None
        }
    }
}

/// The source address the kernel would use for the default route (a UDP
/// `connect` sends nothing).
fn default_route_addr() -> Option<IpAddr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    Some(s.local_addr().ok()?.ip()).filter(|a| !a.is_unspecified())
}

impl Config {
    pub fn from_env() -> Config {
        let addr = match std::env::var("SOFTRDMA_ADDR") {
            Ok(v) => match v.parse::<IpAddr>() {
                Ok(a) => a,
                Err(_) => {
                    tracing::warn!(value = %v, "SOFTRDMA_ADDR is not an IP address; ignored");
                    default_route_addr().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
                }
            },
            Err(_) => default_route_addr().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        };
        Config {
            addr,
            crc: flag("SOFTRDMA_CRC").unwrap_or(false),
            extensions: flag("SOFTRDMA_EXTENSIONS"),
        }
    }

    /// Whether to offer softrdma's extensions to `peer`: they prefix the
    /// private data with 8 bytes that a softrdma responder strips and any
    /// other responder's application would see, so by default only peers
    /// on this host are offered them (a kernel siw peer behind a port
    /// forward on this host wants `SOFTRDMA_EXTENSIONS=0`).
    pub fn offer_extensions(&self, peer: &SocketAddr) -> bool {
        self.extensions
            .unwrap_or_else(|| softrdma_verbs::tcp::is_local_addr(peer.ip()))
    }
}

/// Logs to stderr, filtered by `SOFTRDMA_LOG` (default `warn`), once.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("SOFTRDMA_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    });
}
