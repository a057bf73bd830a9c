//! The embedded coordinator: a [`LeaseTable`] served over loopback TCP.
//!
//! One process of a group (or the demo driver) runs an
//! [`EmbeddedServer`]; every node talks to it through an
//! [`EmbeddedClient`], which implements [`Coordinator`]. Leases are timed
//! by the server's monotonic clock, so the clients' clocks don't matter.
//!
//! Protocol: one request line, one answer line (ASCII, space separated;
//! a member is `NODE:INCARNATION`, an absent one `-`):
//!
//! ```text
//! CAMPAIGN g m ttl_us       -> WON epoch | LOST - | LOST epoch primary in_sync held
//! KEEPALIVE g m epoch       -> OK 1 | OK 0
//! SETINSYNC g m epoch m|-   -> EPOCH n | EPOCH -
//! RESIGN g m epoch          -> OK 1
//! GET g                     -> NONE | REC epoch primary in_sync held
//! (anything malformed)      -> ERR message
//! ```
//!
//! The server is thread-based: an accept thread and one thread per
//! connection, all stopped (and joined) when the server is dropped.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Campaign, CoordError, Coordinator, GroupRecord, LeaseTable};
use crate::proto::Member;

const IO_TIMEOUT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(50);

fn fmt_member(m: Option<Member>) -> String {
    match m {
        Some(m) => format!("{}:{}", m.node, m.incarnation),
        None => "-".into(),
    }
}

fn parse_member(s: &str) -> Result<Option<Member>, String> {
    if s == "-" {
        return Ok(None);
    }
    let (n, i) = s
        .split_once(':')
        .ok_or_else(|| format!("bad member {s:?}"))?;
    Ok(Some(Member {
        node: n.parse().map_err(|_| format!("bad node in {s:?}"))?,
        incarnation: i.parse().map_err(|_| format!("bad incarnation in {s:?}"))?,
    }))
}

fn fmt_record(r: &GroupRecord) -> String {
    format!(
        "{} {} {} {}",
        r.epoch,
        fmt_member(Some(r.primary)),
        fmt_member(r.in_sync),
        r.lease_held as u8
    )
}

fn parse_record(w: &[&str]) -> Result<GroupRecord, String> {
    let [epoch, primary, in_sync, held] = w else {
        return Err(format!("bad record {w:?}"));
    };
    Ok(GroupRecord {
        epoch: epoch.parse().map_err(|_| "bad epoch".to_string())?,
        primary: parse_member(primary)?.ok_or("record without primary")?,
        in_sync: parse_member(in_sync)?,
        lease_held: *held == "1",
    })
}

/// Answers one request line against the table at time `now` (µs).
fn answer(table: &Mutex<LeaseTable>, now: u64, line: &str) -> String {
    let w: Vec<&str> = line.split_whitespace().collect();
    let member = |s: &str| parse_member(s).and_then(|m| m.ok_or_else(|| "member required".into()));
    let num = |s: &str| s.parse::<u64>().map_err(|_| format!("bad number {s:?}"));
    let mut t = table.lock().unwrap();
    let r: Result<String, String> = (|| match w[..] {
        ["CAMPAIGN", g, m, ttl] => Ok(match t.campaign(g, member(m)?, num(ttl)?, now) {
            Campaign::Won { epoch, in_sync } => format!("WON {epoch} {}", fmt_member(in_sync)),
            Campaign::Lost { record: None } => "LOST -".into(),
            Campaign::Lost { record: Some(r) } => format!("LOST {}", fmt_record(&r)),
        }),
        ["KEEPALIVE", g, m, e] => Ok(format!(
            "OK {}",
            t.keep_alive(g, member(m)?, num(e)?, now) as u8
        )),
        ["SETINSYNC", g, m, e, s] => Ok(
            match t.set_in_sync(g, member(m)?, num(e)?, parse_member(s)?, now) {
                Some(e) => format!("EPOCH {e}"),
                None => "EPOCH -".into(),
            },
        ),
        ["RESIGN", g, m, e] => {
            t.resign(g, member(m)?, num(e)?, now);
            Ok("OK 1".into())
        }
        ["RETIRE", g, m, n] => Ok(format!("OK {}", t.retire(g, member(m)?, num(n)?) as u8)),
        ["GET", g] => Ok(match t.get(g, now) {
            Some(r) => format!("REC {}", fmt_record(&r)),
            None => "NONE".into(),
        }),
        _ => Err(format!("unknown request {line:?}")),
    })();
    r.unwrap_or_else(|e| format!("ERR {e}"))
}

/// A running embedded coordinator.
pub struct EmbeddedServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl EmbeddedServer {
    /// Binds `addr` (port 0: any free port) and starts serving.
    pub fn start(addr: SocketAddr) -> Result<EmbeddedServer, CoordError> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            CoordError::Setup(format!("embedded coordinator cannot bind {addr}: {e}"))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| CoordError::Setup(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CoordError::Setup(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table = Arc::new(Mutex::new(LeaseTable::new()));
        let epoch0 = Instant::now();
        let stop2 = stop.clone();
        let accept = std::thread::Builder::new()
            .name("coord-accept".into())
            .spawn(move || {
                let mut conns: Vec<JoinHandle<()>> = Vec::new();
                while !stop2.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let (t, stop3) = (table.clone(), stop2.clone());
                            conns.push(std::thread::spawn(move || serve(s, &t, epoch0, &stop3)));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            // Nothing to accept: wait for a connection or
                            // the stop flag, whichever comes first.
                            std::thread::park_timeout(POLL);
                        }
                        Err(_) => std::thread::park_timeout(POLL),
                    }
                    conns.retain(|h| !h.is_finished());
                }
                for h in conns {
                    let _ = h.join();
                }
            })
            .map_err(|e| CoordError::Setup(e.to_string()))?;
        Ok(EmbeddedServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.accept.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

fn serve(s: TcpStream, table: &Mutex<LeaseTable>, epoch0: Instant, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(POLL));
    let _ = s.set_nodelay(true);
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Acquire) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with('\n') => {
                let now = epoch0.elapsed().as_micros() as u64;
                let mut a = answer(table, now, line.trim_end());
                a.push('\n');
                if w.write_all(a.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Ok(_) => {} // partial line, keep reading
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// A connection to an embedded coordinator (reconnects on failure).
pub struct EmbeddedClient {
    addr: SocketAddr,
    conn: Mutex<Option<(BufReader<TcpStream>, TcpStream)>>,
}

impl EmbeddedClient {
    /// A client for the server at `addr` (connects lazily).
    pub fn new(addr: SocketAddr) -> EmbeddedClient {
        EmbeddedClient {
            addr,
            conn: Mutex::new(None),
        }
    }

    fn call(&self, req: String) -> Result<Vec<String>, CoordError> {
        let io = |e: std::io::Error| CoordError::Io(format!("{}: {e}", self.addr));
        let mut guard = self.conn.lock().unwrap();
        if guard.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT).map_err(io)?;
            s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
            s.set_nodelay(true).map_err(io)?;
            let w = s.try_clone().map_err(io)?;
            *guard = Some((BufReader::new(s), w));
        }
        let (r, w) = guard.as_mut().unwrap();
        let result = (|| {
            w.write_all(format!("{req}\n").as_bytes())?;
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "coordinator closed the connection",
                ));
            }
            Ok(line)
        })();
        match result {
            Ok(line) => {
                let words: Vec<String> = line.split_whitespace().map(String::from).collect();
                if words.first().map(String::as_str) == Some("ERR") {
                    return Err(CoordError::Protocol(line.trim().to_string()));
                }
                Ok(words)
            }
            Err(e) => {
                *guard = None;
                Err(io(e))
            }
        }
    }
}

fn proto_err(w: &[String]) -> CoordError {
    CoordError::Protocol(format!("unexpected answer {w:?}"))
}

fn check_group(g: &str) -> Result<(), CoordError> {
    if g.is_empty() || g.contains(char::is_whitespace) {
        return Err(CoordError::Protocol(format!("bad group name {g:?}")));
    }
    Ok(())
}

impl Coordinator for EmbeddedClient {
    fn campaign(&self, group: &str, me: Member, ttl: Duration) -> Result<Campaign, CoordError> {
        check_group(group)?;
        let w = self.call(format!(
            "CAMPAIGN {group} {} {}",
            fmt_member(Some(me)),
            ttl.as_micros()
        ))?;
        let ws: Vec<&str> = w.iter().map(String::as_str).collect();
        match ws[..] {
            ["WON", e, i] => Ok(Campaign::Won {
                epoch: e.parse().map_err(|_| proto_err(&w))?,
                in_sync: parse_member(i).map_err(CoordError::Protocol)?,
            }),
            ["LOST", "-"] => Ok(Campaign::Lost { record: None }),
            ["LOST", ref rest @ ..] => Ok(Campaign::Lost {
                record: Some(parse_record(rest).map_err(CoordError::Protocol)?),
            }),
            _ => Err(proto_err(&w)),
        }
    }

    fn keep_alive(&self, group: &str, me: Member, epoch: u64) -> Result<bool, CoordError> {
        check_group(group)?;
        let w = self.call(format!(
            "KEEPALIVE {group} {} {epoch}",
            fmt_member(Some(me))
        ))?;
        match w.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["OK", "1"] => Ok(true),
            ["OK", "0"] => Ok(false),
            _ => Err(proto_err(&w)),
        }
    }

    fn set_in_sync(
        &self,
        group: &str,
        me: Member,
        epoch: u64,
        in_sync: Option<Member>,
    ) -> Result<Option<u64>, CoordError> {
        check_group(group)?;
        let w = self.call(format!(
            "SETINSYNC {group} {} {epoch} {}",
            fmt_member(Some(me)),
            fmt_member(in_sync)
        ))?;
        match w.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["EPOCH", "-"] => Ok(None),
            ["EPOCH", e] => Ok(Some(e.parse().map_err(|_| proto_err(&w))?)),
            _ => Err(proto_err(&w)),
        }
    }

    fn resign(&self, group: &str, me: Member, epoch: u64) -> Result<(), CoordError> {
        check_group(group)?;
        self.call(format!("RESIGN {group} {} {epoch}", fmt_member(Some(me))))?;
        Ok(())
    }

    fn get(&self, group: &str) -> Result<Option<GroupRecord>, CoordError> {
        check_group(group)?;
        let w = self.call(format!("GET {group}"))?;
        let ws: Vec<&str> = w.iter().map(String::as_str).collect();
        match ws[..] {
            ["NONE"] => Ok(None),
            ["REC", ref rest @ ..] => Ok(Some(parse_record(rest).map_err(CoordError::Protocol)?)),
            _ => Err(proto_err(&w)),
        }
    }
    fn retire(&self, group: &str, old: Member, new: u64) -> Result<bool, CoordError> {
        check_group(group)?;
        let w = self.call(format!("RETIRE {group} {} {new}", fmt_member(Some(old))))?;
        match w.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["OK", "1"] => Ok(true),
            ["OK", "0"] => Ok(false),
            _ => Err(proto_err(&w)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(node: u32, incarnation: u64) -> Member {
        Member { node, incarnation }
    }

    #[test]
    fn two_clients_share_one_embedded_coordinator() {
        let server = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let a = EmbeddedClient::new(server.addr());
        let b = EmbeddedClient::new(server.addr());
        let (ma, mb) = (m(1, 11), m(2, 22));
        let ttl = Duration::from_millis(300);
        assert_eq!(a.get("g").unwrap(), None);
        let Campaign::Won { epoch, .. } = a.campaign("g", ma, ttl).unwrap() else {
            panic!("first campaign must win")
        };
        let Campaign::Lost { record: Some(r) } = b.campaign("g", mb, ttl).unwrap() else {
            panic!("second campaign must lose")
        };
        assert_eq!((r.epoch, r.primary, r.lease_held), (epoch, ma, true));
        assert!(a.keep_alive("g", ma, epoch).unwrap());
        let e2 = a.set_in_sync("g", ma, epoch, Some(mb)).unwrap().unwrap();
        assert!(e2 > epoch);
        assert_eq!(a.set_in_sync("g", ma, epoch, None).unwrap(), None);
        assert_eq!(b.get("g").unwrap().unwrap().in_sync, Some(mb));
        // Resigning frees the lease at once: the in-sync member takes over
        // under a newer epoch, and the old primary is fenced.
        a.resign("g", ma, e2).unwrap();
        let Campaign::Won { epoch: e3, .. } = b.campaign("g", mb, ttl).unwrap() else {
            panic!("in-sync secondary must win after resign")
        };
        assert!(e3 > e2);
        assert!(!a.keep_alive("g", ma, e2).unwrap());
        // Malformed input is answered with an error, not a hang.
        assert!(matches!(a.get("bad group"), Err(CoordError::Protocol(_))));
        assert!(answer(&Mutex::new(LeaseTable::new()), 0, "FOO").starts_with("ERR"));
        assert!(answer(&Mutex::new(LeaseTable::new()), 0, "KEEPALIVE g x 1").starts_with("ERR"));
    }

    #[test]
    fn lease_expires_by_ttl() {
        let server = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let a = EmbeddedClient::new(server.addr());
        let b = EmbeddedClient::new(server.addr());
        let (ma, mb) = (m(1, 1), m(2, 2));
        let Campaign::Won { epoch, .. } = a.campaign("g", ma, Duration::from_millis(100)).unwrap()
        else {
            panic!()
        };
        a.set_in_sync("g", ma, epoch, Some(mb)).unwrap().unwrap();
        let start = Instant::now();
        // Poll with a deadline until the lease lapses and b wins.
        let deadline = start + Duration::from_secs(5);
        loop {
            match b.campaign("g", mb, Duration::from_secs(1)).unwrap() {
                Campaign::Won { .. } => break,
                Campaign::Lost { .. } => {
                    assert!(Instant::now() < deadline, "lease never expired");
                    std::thread::park_timeout(Duration::from_millis(10));
                }
            }
        }
        assert!(
            start.elapsed() >= Duration::from_millis(90),
            "won before the TTL"
        );
        let addr = server.addr();
        drop(server);
        // The server is gone: calls fail cleanly.
        let c = EmbeddedClient::new(addr);
        assert!(matches!(c.get("g"), Err(CoordError::Io(_))));
    }
}
