//! Publishing device state to `softrdma info`, like `rdma resource show`.
//!
//! Every open device listens on a Unix socket in a per-user directory
//! (`$XDG_RUNTIME_DIR/softrdma` or `/tmp/softrdma-<uid>`), named
//! `<pid>-<device>.sock`. A client writes `text\n` or `json\n` and reads the
//! device's resources back. Stale sockets (their process gone) are removed
//! by the reader.

use crate::mr::Access;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The directory holding the sockets.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("softrdma");
    }
    let uid = crate::sys::uid();
    PathBuf::from(format!("/tmp/softrdma-{uid}"))
}

/// What `Device::info` reports.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The device's name.
    pub name: String,
    /// The local IP address the device is bound to.
    pub addr: IpAddr,
    /// Progress threads the device runs.
    pub progress_threads: usize,
    /// Its queue pairs.
    pub qps: Vec<QpInfo>,
    /// Its memory regions.
    pub mrs: Vec<MrInfo>,
    /// Bytes `alloc_mr` holds in shared chunks (same-host peers map them).
    pub shared_bytes: usize,
}

#[derive(Debug, Clone)]
/// One queue pair in a [`DeviceInfo`].
pub struct QpInfo {
    /// The QP number.
    pub qpn: u32,
    /// Its protection domain's number.
    pub pd: u32,
    /// Its state.
    pub state: crate::qp_state::QpState,
    /// Local address, once connected.
    pub local: Option<std::net::SocketAddr>,
    /// Peer address, once connected.
    pub peer: Option<std::net::SocketAddr>,
    /// Send work requests posted and not yet completed.
    pub sq_outstanding: usize,
    /// Receive work requests posted and not yet consumed.
    pub rq_posted: usize,
    /// Negotiated MPA revision (0 before the connection).
    pub mpa_revision: u8,
    /// Whether FPDUs carry an MPA CRC.
    pub crc: bool,
    /// Negotiated inbound RDMA Read depth.
    pub ird: u16,
    /// Negotiated outbound RDMA Read depth.
    pub ord: u16,
    /// Writes and Reads reach the peer directly (same-host transport).
    pub same_host: bool,
}

#[derive(Debug, Clone)]
/// One memory region in a [`DeviceInfo`].
pub struct MrInfo {
    /// The region's STag.
    pub stag: u32,
    /// Its protection domain's number.
    pub pd: u32,
    /// The virtual address it starts at.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// Its access rights.
    pub access: Access,
    /// Whether the STag is valid (not invalidated).
    pub valid: bool,
    /// Whether it is a fast-register region.
    pub fast_reg: bool,
}

pub(crate) struct Publisher {
    path: PathBuf,
    /// The listening socket, owned by the accept thread; used only to
    /// shut it down, which wakes a blocked `accept`.
    fd: std::os::fd::RawFd,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes device `name`'s socket; `info` answers each request.
    pub fn start(name: &str, info: impl Fn() -> DeviceInfo + Send + 'static) -> Option<Publisher> {
        let d = dir();
        std::fs::create_dir_all(&d).ok()?;
        // A process may open several devices with the same name: a sequence
        // number keeps their sockets apart.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = d.join(format!("{}-{}-{seq}.sock", std::process::id(), name));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).ok()?;
        let fd = l.as_raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = crate::threads::spawn("softrdma-info".into(), move || {
            for conn in l.incoming() {
                if s.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut c) = conn else {
                    if s.load(Ordering::Acquire) {
                        return;
                    }
                    continue;
                };
                let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                let mut line = String::new();
                let _ = BufReader::new(&mut c).read_line(&mut line);
                let info = info();
                let out = if line.trim() == "json" {
                    to_json(&info)
                } else {
                    render_text(&info)
                };
                let _ = c.write_all(out.as_bytes());
            }
        })
        .ok()?;
        Some(Publisher {
            path,
            fd,
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The accept thread owns the listener and is still running (joined
        // below), so `fd` is open; shutdown does not close it, it only makes
        // the blocked accept return an error.
        crate::sys::shutdown_both(self.fd);
        let _ = std::fs::remove_file(&self.path);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Asks every published device; returns (pid, answer) pairs.
pub fn query_all(json: bool) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir()) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let Some(pid) = name.split('-').next().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        match UnixStream::connect(&p) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.write_all(if json { b"json\n" } else { b"text\n" });
                let mut text = String::new();
                if s.read_to_string(&mut text).is_ok() {
                    out.push((pid, text));
                }
            }
            Err(_) => {
                // The process is gone: remove its stale socket.
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The device's resources as one JSON object.
pub fn to_json(i: &DeviceInfo) -> String {
    let qps: Vec<String> = i
        .qps
        .iter()
        .map(|q| {
            format!(
                "{{\"qpn\":{},\"pd\":{},\"state\":\"{:?}\",\"local\":\"{}\",\"peer\":\"{}\",\"sq_outstanding\":{},\"rq_posted\":{},\"mpa_revision\":{},\"crc\":{},\"ird\":{},\"ord\":{},\"same_host\":{}}}",
                q.qpn,
                q.pd,
                q.state,
                q.local.map(|a| a.to_string()).unwrap_or_default(),
                q.peer.map(|a| a.to_string()).unwrap_or_default(),
                q.sq_outstanding,
                q.rq_posted,
                q.mpa_revision,
                q.crc,
                                q.ird,
                q.ord,
                q.same_host
            )
        })
        .collect();
    let mrs: Vec<String> = i
        .mrs
        .iter()
        .map(|m| {
            format!(
                "{{\"stag\":\"{:#010x}\",\"pd\":{},\"iova\":\"{:#x}\",\"len\":{},\"access\":{},\"valid\":{},\"fast_reg\":{}}}",
                m.stag, m.pd, m.iova, m.len, m.access.0, m.valid, m.fast_reg
            )
        })
        .collect();
    format!(
        "{{\"name\":\"{}\",\"addr\":\"{}\",\"progress_threads\":{},\"shared_bytes\":{},\"qps\":[{}],\"mrs\":[{}]}}",
        esc(&i.name),
        i.addr,
        i.progress_threads,
        i.shared_bytes,
        qps.join(","),
        mrs.join(",")
    )
}

/// The device's resources as a table.
pub fn render_text(i: &DeviceInfo) -> String {
    let mut s = format!(
        "dev {} addr {} progress_threads {} shared_bytes {} qps {} mrs {}\n",
        i.name,
        i.addr,
        i.progress_threads,
        i.shared_bytes,
        i.qps.len(),
        i.mrs.len()
    );
    for q in &i.qps {
        s += &format!(
            "qp {} pd {} state {:?} local {} peer {} sq {} rq {} mpa {} crc {} ird {} ord {}{}\n",
            q.qpn,
            q.pd,
            q.state,
            q.local.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            q.peer.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            q.sq_outstanding,
            q.rq_posted,
            q.mpa_revision,
            if q.crc { "on" } else { "off" },
            q.ird,
            q.ord,
            if q.same_host { " same-host" } else { "" }
        );
    }
    for m in &i.mrs {
        s += &format!(
            "mr stag {:#010x} pd {} iova {:#x} len {} access {:#x}{}{}\n",
            m.stag,
            m.pd,
            m.iova,
            m.len,
            m.access.0,
            if m.valid { "" } else { " invalid" },
            if m.fast_reg { " fast-reg" } else { "" }
        );
    }
    s
}
