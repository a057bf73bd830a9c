//! The embedded coordinator: a [`LeaseTable`] served over loopback TCP.
//!
//! One process of a group (or the demo driver) runs an
//! [`EmbeddedServer`]; every node talks to it through an
//! [`EmbeddedClient`], which implements [`Coordinator`]. Leases are timed
//! by the server's monotonic clock, so the clients' clocks don't matter.
//!
//! Protocol: one request line, one answer line (ASCII, space separated;
//! a member is `NODE:INCARNATION`, an absent one `-`; `held` is 1 while
//! the primary's lease runs, else 0):
//!
//! ```text
//! CAMPAIGN g m ttl_us       -> WON epoch in_sync | LOST - | LOST epoch primary in_sync held
//! KEEPALIVE g m epoch       -> OK 1 | OK 0
//! SETINSYNC g m epoch m|-   -> EPOCH n | EPOCH -
//! RESIGN g m epoch          -> OK 1
//! RETIRE g m new_inc        -> OK 1 | OK 0       (0: the record names m)
//! GET g                     -> NONE | REC epoch primary in_sync held
//! PROMOTE g m               -> DONE epoch primary in_sync held | HELD epoch primary in_sync held | RETIRED
//! RESET g                   -> DONE - | DONE epoch primary in_sync held | HELD epoch primary in_sync held
//! (anything else)           -> ERR message
//! ```
//!
//! `WON` names the in-sync member a re-election keeps (`-` after a
//! failover or a bootstrap). A request line is at most [`MAX_LINE`] bytes;
//! a malformed or impossible one (a primary named as its own secondary)
//! is answered `ERR`, never a panic, and changes nothing.
//!
//! **Authentication.** On connecting, the server greets with one line:
//! `CHALLENGE <nonce>` when it has the group's secret, `WELCOME` when it
//! has none (then it serves loopback clients only, as a node in protected
//! mode does). A client answers a challenge with `AUTH <its nonce> <HMAC>`
//! ([`crate::auth::client_proof`] over both nonces, hex) and gets `OK
//! <HMAC>`, the server's proof, or `ERR authentication failed` and the
//! connection closed. A client holding the secret accepts only a server
//! that proves it too, so neither side can be impersonated by a process
//! that knows the address but not the secret (issue 29, finding 10). The
//! challenge is new per connection, so a recorded exchange replays nothing.
//!
//! The server is thread-based: an accept thread and one thread per
//! connection, all stopped (and joined) when the server is dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Campaign, CoordError, Coordinator, GroupRecord, LeaseTable, Override};
use crate::auth::{self, Secret, NONCE_LEN};
use crate::proto::Member;

/// What both proofs of the coordinator's handshake name.
const PROOF_LABEL: &[u8] = b"softrdma-store embedded coordinator";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

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

/// Longest request line the server reads; a longer one is answered `ERR`
/// and ends the connection.
pub const MAX_LINE: usize = 1024;
/// Most groups one embedded coordinator keeps (a campaign or retirement
/// that would add one more is answered `ERR`).
pub const MAX_GROUPS: usize = 4096;

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Request<'a> {
    Campaign(&'a str, Member, u64),
    KeepAlive(&'a str, Member, u64),
    SetInSync(&'a str, Member, u64, Option<Member>),
    Resign(&'a str, Member, u64),
    Retire(&'a str, Member, u64),
    Get(&'a str),
    Promote(&'a str, Member),
    Reset(&'a str),
}

/// Parses and checks one request line: everything a client can get
/// wrong is an `Err` here, before the table is touched.
fn parse_request(line: &str) -> Result<Request<'_>, String> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let member = |s: &str| parse_member(s).and_then(|m| m.ok_or_else(|| "member required".into()));
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("bad number {:?}", clip(s)))
    };
    let r = match w[..] {
        ["CAMPAIGN", g, m, ttl] => Request::Campaign(g, member(m)?, num(ttl)?),
        ["KEEPALIVE", g, m, e] => Request::KeepAlive(g, member(m)?, num(e)?),
        ["SETINSYNC", g, m, e, s] => {
            let (me, in_sync) = (member(m)?, parse_member(s)?);
            if in_sync.is_some_and(|s| s.node == me.node) {
                return Err("a primary is not its own secondary".into());
            }
            Request::SetInSync(g, me, num(e)?, in_sync)
        }
        ["RESIGN", g, m, e] => Request::Resign(g, member(m)?, num(e)?),
        ["RETIRE", g, m, n] => Request::Retire(g, member(m)?, num(n)?),
        ["GET", g] => Request::Get(g),
        ["PROMOTE", g, m] => Request::Promote(g, member(m)?),
        ["RESET", g] => Request::Reset(g),
        _ => return Err(format!("unknown request {:?}", clip(line))),
    };
    Ok(r)
}

/// At most 64 characters of `s`, for error messages.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Answers one request line against the table at time `now` (µs). Any
/// input gets an answer line, `ERR ...` when it is not a valid request;
/// nothing panics (fuzzed: `fuzz/fuzz_targets/coord_line.rs`).
pub fn answer_line(t: &mut LeaseTable, now: u64, line: &[u8]) -> String {
    let Ok(line) = std::str::from_utf8(line) else {
        return "ERR request is not UTF-8".into();
    };
    let line = line.trim_end_matches(['\r', '\n']);
    let req = match parse_request(line) {
        Ok(r) => r,
        Err(e) => return format!("ERR {e}"),
    };
    let group = match req {
        Request::Campaign(g, ..)
        | Request::KeepAlive(g, ..)
        | Request::SetInSync(g, ..)
        | Request::Resign(g, ..)
        | Request::Retire(g, ..)
        | Request::Get(g)
        | Request::Promote(g, _)
        | Request::Reset(g) => g,
    };
    let adds = matches!(
        req,
        Request::Campaign(..) | Request::Retire(..) | Request::Promote(..)
    );
    if adds && !t.knows(group) && t.group_count() >= MAX_GROUPS {
        return format!("ERR this coordinator keeps at most {MAX_GROUPS} groups");
    }
    match req {
        Request::Campaign(g, m, ttl) => match t.campaign(g, m, ttl, now) {
            Campaign::Won { epoch, in_sync } => format!("WON {epoch} {}", fmt_member(in_sync)),
            Campaign::Lost { record: None } => "LOST -".into(),
            Campaign::Lost { record: Some(r) } => format!("LOST {}", fmt_record(&r)),
        },
        Request::KeepAlive(g, m, e) => format!("OK {}", t.keep_alive(g, m, e, now) as u8),
        Request::SetInSync(g, m, e, s) => match t.set_in_sync(g, m, e, s, now) {
            Some(e) => format!("EPOCH {e}"),
            None => "EPOCH -".into(),
        },
        Request::Resign(g, m, e) => {
            t.resign(g, m, e, now);
            "OK 1".into()
        }
        Request::Retire(g, m, n) => format!("OK {}", t.retire(g, m, n) as u8),
        Request::Get(g) => match t.get(g, now) {
            Some(r) => format!("REC {}", fmt_record(&r)),
            None => "NONE".into(),
        },
        Request::Promote(g, m) => fmt_override(t.promote(g, m, now)),
        Request::Reset(g) => fmt_override(t.reset(g, now)),
    }
}

fn fmt_override(o: Override) -> String {
    match o {
        Override::Done { record: None } => "DONE -".into(),
        Override::Done { record: Some(r) } => format!("DONE {}", fmt_record(&r)),
        Override::LeaseHeld { record } => format!("HELD {}", fmt_record(&record)),
        Override::Retired => "RETIRED".into(),
    }
}

fn parse_override(w: &[String]) -> Result<Override, CoordError> {
    let ws: Vec<&str> = w.iter().map(String::as_str).collect();
    let rec = |r: &[&str]| parse_record(r).map_err(CoordError::Protocol);
    match ws[..] {
        ["DONE", "-"] => Ok(Override::Done { record: None }),
        ["DONE", ref r @ ..] => Ok(Override::Done {
            record: Some(rec(r)?),
        }),
        ["HELD", ref r @ ..] => Ok(Override::LeaseHeld { record: rec(r)? }),
        ["RETIRED"] => Ok(Override::Retired),
        _ => Err(proto_err(w)),
    }
}

/// [`answer_line`] under the shared table's lock. Nothing in it panics;
/// should that ever change, a poisoned lock still does not take the
/// coordinator and every group with it (issue 29, finding 10).
fn answer(table: &Mutex<LeaseTable>, now: u64, line: &[u8]) -> String {
    let mut t = table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    answer_line(&mut t, now, line)
}

/// A running embedded coordinator.
pub struct EmbeddedServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl EmbeddedServer {
    /// Binds `addr` (port 0: any free port) and starts serving without a
    /// secret: loopback clients only.
    pub fn start(addr: SocketAddr) -> Result<EmbeddedServer, CoordError> {
        EmbeddedServer::start_with(addr, None)
    }

    /// Binds `addr` and serves clients that prove `secret` (see the module
    /// documentation); `None`: loopback clients only.
    pub fn start_with(
        addr: SocketAddr,
        secret: Option<Secret>,
    ) -> Result<EmbeddedServer, CoordError> {
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
                            let secret = secret.clone();
                            conns.push(std::thread::spawn(move || {
                                serve(s, &t, epoch0, &stop3, secret.as_ref())
                            }));
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

/// The server's side of the handshake; `false`: the connection ends.
fn greet(
    s: &TcpStream,
    r: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    secret: Option<&Secret>,
) -> bool {
    let Some(secret) = secret else {
        if !s.peer_addr().is_ok_and(|a| a.ip().is_loopback()) {
            let _ = w.write_all(
                b"ERR protected mode: this coordinator has no secret and serves loopback clients only\n",
            );
            return false;
        }
        return w.write_all(b"WELCOME\n").is_ok();
    };
    let sn = auth::random_nonce();
    if w.write_all(format!("CHALLENGE {}\n", hex(&sn)).as_bytes())
        .is_err()
    {
        return false;
    }
    // The answer comes within the I/O timeout.
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let mut line = Vec::new();
    if (&mut *r)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)
        .is_err()
    {
        return false;
    }
    let _ = s.set_read_timeout(Some(POLL));
    let text = String::from_utf8_lossy(&line);
    let w2: Vec<&str> = text.split_whitespace().collect();
    let proven = match w2[..] {
        ["AUTH", cn, mac] => match (unhex(cn), unhex(mac)) {
            (Some(cn), Some(mac)) if cn.len() == NONCE_LEN => {
                let cn: [u8; NONCE_LEN] = cn.try_into().expect("checked");
                let want = auth::client_proof(secret, PROOF_LABEL, &sn, &cn);
                auth::proofs_equal(&want, &mac).then_some(cn)
            }
            _ => None,
        },
        _ => None,
    };
    match proven {
        Some(cn) => {
            let p = auth::server_proof(secret, &sn, &cn, PROOF_LABEL);
            w.write_all(format!("OK {}\n", hex(&p)).as_bytes()).is_ok()
        }
        None => {
            let _ = w.write_all(b"ERR authentication failed\n");
            false
        }
    }
}

fn serve(
    s: TcpStream,
    table: &Mutex<LeaseTable>,
    epoch0: Instant,
    stop: &AtomicBool,
    secret: Option<&Secret>,
) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(POLL));
    let _ = s.set_nodelay(true);
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s.try_clone().expect("cloned above"));
    if !greet(&s, &mut r, &mut w, secret) {
        return;
    }
    let mut line = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // At most MAX_LINE bytes and its newline, however they arrive.
        let room = (MAX_LINE + 1).saturating_sub(line.len()) as u64;
        match (&mut r).take(room).read_until(b'\n', &mut line) {
            Ok(0) if room > 0 => return,
            Ok(_) if line.ends_with(b"\n") => {
                let now = epoch0.elapsed().as_micros() as u64;
                let mut a = answer(table, now, &line);
                a.push('\n');
                if w.write_all(a.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Ok(_) if line.len() > MAX_LINE => {
                let _ =
                    w.write_all(format!("ERR request longer than {MAX_LINE} bytes\n").as_bytes());
                return;
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
    secret: Option<Secret>,
    conn: Mutex<Option<(BufReader<TcpStream>, TcpStream)>>,
}

impl EmbeddedClient {
    /// A client for the server at `addr` (connects lazily), without a
    /// secret (a server on loopback without one).
    pub fn new(addr: SocketAddr) -> EmbeddedClient {
        EmbeddedClient::with_secret(addr, None)
    }

    /// A client that proves `secret` and requires the server's proof.
    pub fn with_secret(addr: SocketAddr, secret: Option<Secret>) -> EmbeddedClient {
        EmbeddedClient {
            addr,
            secret,
            conn: Mutex::new(None),
        }
    }

    /// The client's side of the handshake on a new connection.
    fn handshake(&self, r: &mut BufReader<TcpStream>, w: &mut TcpStream) -> Result<(), CoordError> {
        let io = |e: std::io::Error| CoordError::Io(format!("{}: {e}", self.addr));
        let refused = |why: String| CoordError::Protocol(format!("{}: {why}", self.addr));
        let mut line = String::new();
        r.read_line(&mut line).map_err(io)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match (&self.secret, &words[..]) {
            (None, ["WELCOME"]) => Ok(()),
            (Some(_), ["WELCOME"]) => Err(refused(
                "the coordinator did not authenticate itself (it has no secret, we do)".into(),
            )),
            (None, ["CHALLENGE", _]) => Err(refused(
                "the coordinator requires the group's secret and none is configured".into(),
            )),
            (Some(secret), ["CHALLENGE", sn]) => {
                let sn: [u8; NONCE_LEN] = unhex(sn)
                    .and_then(|v| v.try_into().ok())
                    .ok_or_else(|| refused("bad challenge".into()))?;
                let cn = auth::random_nonce();
                let p = auth::client_proof(secret, PROOF_LABEL, &sn, &cn);
                w.write_all(format!("AUTH {} {}\n", hex(&cn), hex(&p)).as_bytes())
                    .map_err(io)?;
                let mut ans = String::new();
                r.read_line(&mut ans).map_err(io)?;
                let a: Vec<&str> = ans.split_whitespace().collect();
                let want = auth::server_proof(secret, &sn, &cn, PROOF_LABEL);
                match a[..] {
                    ["OK", mac] if unhex(mac).is_some_and(|m| auth::proofs_equal(&want, &m)) => {
                        Ok(())
                    }
                    ["OK", _] => Err(refused("the coordinator's proof is wrong".into())),
                    _ => Err(refused(format!("authentication refused: {}", ans.trim()))),
                }
            }
            _ => Err(refused(format!("unexpected greeting {:?}", line.trim()))),
        }
    }

    fn call(&self, req: String) -> Result<Vec<String>, CoordError> {
        let io = |e: std::io::Error| CoordError::Io(format!("{}: {e}", self.addr));
        let mut guard = self.conn.lock().unwrap();
        if guard.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT).map_err(io)?;
            s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
            s.set_nodelay(true).map_err(io)?;
            let mut w = s.try_clone().map_err(io)?;
            let mut r = BufReader::new(s);
            self.handshake(&mut r, &mut w)?;
            *guard = Some((r, w));
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

    fn promote(&self, group: &str, m: Member) -> Result<Override, CoordError> {
        check_group(group)?;
        parse_override(&self.call(format!("PROMOTE {group} {}", fmt_member(Some(m))))?)
    }

    fn reset(&self, group: &str) -> Result<Override, CoordError> {
        check_group(group)?;
        parse_override(&self.call(format!("RESET {group}"))?)
    }
}

#[cfg(test)]
#[path = "embedded_tests.rs"]
mod tests;
