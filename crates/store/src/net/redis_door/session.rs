//! One connection of the front door: its bytes in and out, who it
//! authenticated as, and the two paths of its requests (a write through
//! the node loop, retried through a client of its own; a read from the
//! node's own arena).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{ConnInfo, Shared};
use crate::auth::{Credentials, Rights};
use crate::index::Layout;
use crate::lookup::{self, Outcome};
use crate::net::client::{ClientError, StoreClient};
use crate::proto::{self, Op, StatusInfo, StoreError};
use crate::resp_codec::{self, Decoder, Proto, Reply};

/// How long a node's role, as the front door last asked, is trusted
/// before a write asks again.
pub(super) const ROLE_TTL: Duration = Duration::from_millis(100);

/// How long a request waits for the node loop before the front door asks
/// again through a client (same request id: it takes effect once).
pub(super) const FRONT_TIMEOUT: Duration = Duration::from_secs(2);

/// Replies are written out once this many bytes wait (a pipeline of many
/// requests, or a long `MGET`, never holds more than about this much).
pub(super) const FLUSH_AT: usize = 256 << 10;

/// A client that does not read its replies for this long is disconnected.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a look-up in this node's arena keeps trying to read between
/// two batches' writes ([`Session::consistent`]) before the key goes the
/// remote way: far longer than writing one batch's bytes takes, unless
/// the node loop is descheduled in the middle of one.
pub(super) const CONSISTENT_WAIT: Duration = Duration::from_millis(100);

/// How long a write waits for a primary while none is known (a
/// failover under way) before it is refused.
const FAILOVER_WAIT: Duration = Duration::from_secs(5);

/// A connection's replies, written out as they pile up.
pub(super) struct Out {
    /// Where the replies go (the connection while a worker serves it; a
    /// sink under fuzzing). `None` on the event loop, which writes
    /// `buf` out itself as the socket takes it.
    pub(super) conn: Option<Box<dyn Write + Send>>,
    pub(super) buf: Vec<u8>,
    /// The protocol the replies are written in (`HELLO`).
    pub(super) proto: Proto,
    /// A write failed: the connection is done.
    pub(super) broken: bool,
}

impl Out {
    pub(super) fn reply(&mut self, r: &Reply) {
        r.encode_as(self.proto, &mut self.buf);
        self.maybe_flush();
    }

    /// A bulk string (the same in RESP2 and RESP3), written from `b`.
    pub(super) fn bulk(&mut self, b: &[u8]) {
        self.buf.reserve(b.len() + 16);
        self.buf.push(b'$');
        self.buf.extend_from_slice(b.len().to_string().as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        self.buf.extend_from_slice(b);
        self.buf.extend_from_slice(b"\r\n");
        self.maybe_flush();
    }

    pub(super) fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        self.maybe_flush();
    }

    fn maybe_flush(&mut self) {
        if self.buf.len() >= FLUSH_AT {
            self.flush();
        }
    }

    pub(super) fn flush(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if !self.broken && !self.buf.is_empty() && conn.write_all(&self.buf).is_err() {
            self.broken = true;
        }
        self.buf.clear();
    }
}

impl Out {
    pub(super) fn new(conn: Option<Box<dyn Write + Send>>) -> Out {
        Out {
            conn,
            buf: Vec::with_capacity(16 << 10),
            proto: Proto::Resp2,
            broken: false,
        }
    }
}

pub(super) struct Session {
    /// Who the connection authenticated as (`AUTH`), and its rights.
    pub(super) user: Option<(String, Rights)>,
    /// The credentials `user` was checked against.
    pub(super) creds: Arc<Credentials>,
    /// `Gate::changes` when `creds` was taken.
    pub(super) seen_changes: u64,
    pub(super) shared: Arc<Shared>,
    /// A client under this connection's id, made only to retry a write
    /// whose answer did not come through the node loop (the same request
    /// id then takes effect once).
    pub(super) retry: Option<StoreClient>,
    /// This connection's client id, on both paths.
    pub(super) id: u64,
    /// What `CLIENT LIST` shows of it (its `CLIENT ID`, name, ...).
    pub(super) info: Arc<ConnInfo>,
    /// Request ids used before `retry` existed.
    pub(super) req: u64,
    /// The key index's layout, read from the local arena's superblock.
    pub(super) layout: Option<Layout>,
    /// The open transaction (`MULTI`), if any.
    pub(super) multi: Option<super::transaction::Multi>,
    /// Keys `WATCH`ed and the version each had then.
    pub(super) watched: Vec<(Vec<u8>, Option<u64>)>,
}

pub(super) fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
}

/// [`upper`] into `buf`, not allocated: `None` when `a` is longer than
/// `buf` or not ASCII (no command the event loop runs itself is).
pub(super) fn upper_in<'b, const N: usize>(a: &[u8], buf: &'b mut [u8; N]) -> Option<&'b str> {
    let to = buf.get_mut(..a.len())?;
    for (t, &b) in to.iter_mut().zip(a) {
        if !b.is_ascii() {
            return None;
        }
        *t = b.to_ascii_uppercase();
    }
    std::str::from_utf8(to).ok()
}

/// A key no store key can equal (empty, or longer than the limit): a
/// read of it answers "absent", a write a clear error.
pub(super) fn impossible_key(key: &[u8]) -> bool {
    crate::proto::check_key(key).is_err()
}

/// The error for a value longer than a value may be (`proto::MAX_VALUE`).
pub(super) fn value_too_long(len: usize) -> Option<Reply> {
    let max = crate::proto::MAX_VALUE;
    (len > max).then(|| {
        Reply::err(format!(
            "ERR value of {len} bytes exceeds the limit of {max} bytes"
        ))
    })
}

/// An integer argument, or Redis's error for it.
pub(super) fn integer(a: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(a)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| Reply::err("ERR value is not an integer or out of range"))
}

pub(super) fn store_err(e: ClientError) -> Reply {
    match e {
        ClientError::Store(StoreError::BadKey { len: 0, max }) => Reply::err(format!(
            "ERR the empty key is not supported: an object with no key is the pointer \
             API's (keys are 1 to {max} bytes)"
        )),
        ClientError::Store(StoreError::BadKey { len, max }) => {
            Reply::err(format!("ERR key of {len} bytes: keys are 1 to {max} bytes"))
        }
        ClientError::Store(StoreError::Full { largest_free }) => Reply::err(format!(
            "OOM arena full (largest free range {largest_free} bytes)"
        )),
        ClientError::Store(e @ StoreError::IndexFull { .. }) => Reply::err(format!("OOM {e}")),
        ClientError::Store(e @ StoreError::NotEnoughReplicas) => {
            Reply::err(format!("NOREPLICAS {e}"))
        }
        ClientError::Unavailable(e) => Reply::err(format!("TRYAGAIN store unavailable: {e}")),
        ClientError::Store(e @ StoreError::NoPermission) => Reply::err(format!("NOPERM {e}")),
        e => Reply::err(format!("ERR {e}")),
    }
}

pub(super) fn wrong_args(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

pub(super) fn unknown_subcommand(cmd: &str, sub: &[u8]) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand '{}'. Try {cmd} HELP.",
        String::from_utf8_lossy(sub)
    ))
}

impl Session {
    /// A connection's session: `user` is who it is before any `AUTH`
    /// (the default user when no credential is configured).
    pub(super) fn new(
        shared: &Arc<Shared>,
        info: Arc<ConnInfo>,
        user: Option<(String, Rights)>,
        creds: Arc<Credentials>,
        seen_changes: u64,
    ) -> Session {
        Session {
            user,
            creds,
            seen_changes,
            shared: shared.clone(),
            retry: None,
            id: crate::auth::random_u64(),
            info,
            req: 0,
            layout: None,
            multi: None,
            watched: Vec::new(),
        }
    }

    /// Runs every whole request in `buf` (the decoder remembers where an
    /// incomplete one stopped) the blocking way, as a worker does; returns
    /// the bytes used and whether the connection is to be closed (`QUIT`,
    /// a protocol error, a reply that could not be written).
    pub(super) fn serve_bytes(
        &mut self,
        decoder: &mut Decoder,
        buf: &[u8],
        out: &mut Out,
    ) -> (usize, bool) {
        self.serve_with(decoder, buf, out, |s, args, out| s.exec(args, out))
    }

    /// [`Self::serve_bytes`] with `step` running each request (whether to
    /// close): the one decode loop of a worker's and of the fuzzer's
    /// imitation of the event loop (`fuzzing.rs`).
    pub(super) fn serve_with(
        &mut self,
        decoder: &mut Decoder,
        buf: &[u8],
        out: &mut Out,
        mut step: impl FnMut(&mut Self, &mut [Vec<u8>], &mut Out) -> bool,
    ) -> (usize, bool) {
        let mut used = 0;
        loop {
            match decoder.decode(&buf[used..]) {
                Ok(Some((mut args, n))) => {
                    used += n;
                    if args.is_empty() {
                        continue;
                    }
                    if step(self, &mut args, out) || out.broken {
                        return (used, true);
                    }
                }
                Ok(None) => return (used, false),
                Err(e) => {
                    out.reply(&Reply::err(format!("ERR Protocol error: {e}")));
                    return (used, true);
                }
            }
        }
    }

    /// The client that retries this connection's writes.
    pub(super) fn retry_client(&mut self) -> Result<&mut StoreClient, Reply> {
        if self.retry.is_none() {
            let mut cfg = self.shared.client_config();
            cfg.id = Some(self.id);
            let mut c = StoreClient::new(cfg)
                .map_err(|e| Reply::err(format!("ERR cannot reach the store: {e}")))?;
            c.skip_req_ids(self.req);
            self.retry = Some(c);
        }
        Ok(self.retry.as_mut().expect("set above"))
    }

    pub(super) fn next_req(&mut self) -> u64 {
        match &mut self.retry {
            Some(c) => c.next_req_id(),
            None => {
                self.req += 1;
                self.req
            }
        }
    }

    /// A write: through this node's loop (the path a client's request
    /// takes, without the network); if no answer comes in time, or the
    /// node stopped being the primary while the write was pending (it may
    /// have been replicated), asked again through a client under the same
    /// request id, which makes it take effect once whatever happened.
    pub(super) fn write(&mut self, op: Op) -> Result<proto::Reply, Reply> {
        let req_id = self.next_req();
        let first = self
            .shared
            .front
            .request(self.id, req_id, op.clone(), FRONT_TIMEOUT);
        self.write_answer(req_id, op, first)
    }

    /// Whether `first`, the node loop's answer to a write (`None`: none
    /// in time), is the write's outcome; otherwise the write is asked
    /// again through a client ([`Self::write_answer`], which blocks).
    pub(super) fn is_final(first: &Option<Result<proto::Reply, StoreError>>) -> bool {
        !matches!(
            first,
            None | Some(Err(StoreError::NotPrimary { .. }))
                | Some(Err(StoreError::StaleEpoch { .. }))
        )
    }

    /// The outcome of write `req_id` (`op`) given the node loop's answer
    /// `first`: that answer, or the write asked again through this
    /// connection's client under the same request id.
    pub(super) fn write_answer(
        &mut self,
        req_id: u64,
        op: Op,
        first: Option<Result<proto::Reply, StoreError>>,
    ) -> Result<proto::Reply, Reply> {
        match first {
            Some(Ok(r)) => Ok(r),
            Some(Err(StoreError::NotPrimary { .. }))
            | Some(Err(StoreError::StaleEpoch { .. }))
            | None => {
                let _ = self.role(true);
                self.retry_client()?
                    .request_as(req_id, op)
                    .map_err(store_err)
            }
            Some(Err(e)) => Err(store_err(e.into())),
        }
    }

    /// A keyed get served from this node's own arena, as a one-sided
    /// reader would (the same look-up, the reads checked against the
    /// STag's validity and deadline), and between two batches' writes, so
    /// a batch's keys are seen all new or all old; `None` if this node
    /// does not serve reads now or the look-up gave up.
    pub(super) fn local_get(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.consistent(CONSISTENT_WAIT, |s| s.local_get_once(key))
    }

    /// Runs `reads` (look-ups in this node's arena) until they ran while
    /// no batch's bytes were being written ([`crate::arena::Exposures`]),
    /// for at most `patience`: every batch they saw, they saw whole (a
    /// batch's writes land one object after another). `None` if `reads`
    /// gave `None` or patience ran out.
    pub(super) fn consistent<R>(
        &mut self,
        patience: Duration,
        mut reads: impl FnMut(&mut Self) -> Option<R>,
    ) -> Option<R> {
        let front = self.shared.front.clone();
        let mut until = None;
        let mut tries = 0u32;
        loop {
            if let Some(since) = front.read_begin() {
                let r = reads(self)?;
                if front.read_valid(since) {
                    return Some(r);
                }
            }
            let until = *until.get_or_insert_with(|| Instant::now() + patience);
            if Instant::now() >= until {
                return None;
            }
            tries = tries.saturating_add(1);
            if tries < 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// One look-up of [`Self::local_get`], with no check against batches.
    pub(super) fn local_get_once(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.local_entry_once(key).map(|e| e.map(|(v, _)| v))
    }

    /// One look-up in this node's arena: the key's value and deadline
    /// (0: none), absent if it expired ([`lookup::live`]); `None` where
    /// [`Self::local_get`] gives `None`.
    pub(super) fn local_entry_once(&mut self, key: &[u8]) -> Option<Option<(Vec<u8>, u64)>> {
        let mut buf = Vec::new();
        let found = self.local_find(key, &mut buf)?;
        Some(found.map(|(at, deadline)| {
            buf.truncate(at.end);
            buf.drain(..at.start);
            (buf, deadline)
        }))
    }

    /// One look-up in this node's arena, read into `buf` (kept by the
    /// caller, grown as needed): where the key's value lies in `buf` and
    /// its deadline; absent if it expired ([`lookup::live`]); `None`
    /// where [`Self::local_get`] gives `None`. Always from the key's
    /// bucket: no pointer cache, as a remote reader keeps to save a round
    /// trip (here the bucket is a local 512-byte copy, cheaper than
    /// keeping a cache: hashing, a key copy per entry, clearing it).
    pub(super) fn local_find(
        &mut self,
        key: &[u8],
        buf: &mut Vec<u8>,
    ) -> Option<Option<(std::ops::Range<usize>, u64)>> {
        if impossible_key(key) {
            return Some(None);
        }
        let front = self.shared.front.clone();
        let arena_len = front.arena().len;
        let layout = self.layout()?;
        let read = |offset: u64, len: u32, buf: &mut Vec<u8>| {
            // Bounds first: a length is never trusted before it is known
            // to lie inside the arena.
            if offset.saturating_add(len as u64) > arena_len {
                return Err(());
            }
            let len = len as usize;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            match front.read(offset, &mut buf[..len]) {
                true => Ok(()),
                false => Err(()),
            }
        };
        match lookup::run_in(key, layout, None, buf, read).ok()?.0 {
            Outcome::Found {
                data_at,
                data_len,
                deadline,
                ..
            } => {
                // Expired, allowing for this clock's lag behind the
                // primary's: absent (the clock read only for a key with a
                // deadline).
                Some(lookup::live_now(deadline).then_some((data_at..data_at + data_len, deadline)))
            }
            Outcome::Absent => Some(None),
            Outcome::GaveUp => None,
        }
    }

    /// The arena's index layout, read from its superblock once.
    pub(super) fn layout(&mut self) -> Option<Layout> {
        if self.layout.is_none() {
            let front = &self.shared.front;
            let mut sb = [0u8; crate::index::SUPERBLOCK_LEN as usize];
            if !front.read(0, &mut sb) {
                return None;
            }
            self.layout = Layout::from_superblock(&sb, front.arena().len).ok();
        }
        self.layout
    }

    /// This node's status, asked at most every [`ROLE_TTL`] (by any
    /// connection), and the primary's RESP address when this node is not
    /// the primary.
    pub(super) fn role(&mut self, fresh: bool) -> Result<(StatusInfo, Option<SocketAddr>), Reply> {
        if !fresh {
            if let Some((at, s, p)) = self.shared.role.lock().expect("role").clone() {
                if at.elapsed() < ROLE_TTL {
                    return Ok((s, p));
                }
            }
        }
        let me = match self
            .shared
            .front
            .request(self.id, 0, Op::Status, FRONT_TIMEOUT)
        {
            Some(Ok(proto::Reply::Status(s))) => s,
            _ => return Err(Reply::err("TRYAGAIN this node does not answer")),
        };
        let mut primary = None;
        if me.role != proto::ROLE_PRIMARY {
            let nodes = self.shared.nodes.clone();
            self.shared.pooled(|c| {
                for (i, addr) in nodes.iter().enumerate().skip(1) {
                    if let Ok(s) = c.status_of(i) {
                        if s.role == proto::ROLE_PRIMARY && s.resp_port != 0 {
                            primary = Some(SocketAddr::new(addr.ip(), s.resp_port));
                        }
                    }
                }
            })?;
        }
        *self.shared.role.lock().expect("role") = Some((Instant::now(), me.clone(), primary));
        Ok((me, primary))
    }

    /// `None` if this node may take writes of `key`; else the
    /// redirection (`-MOVED slot host:port`, the key's cluster slot, so
    /// that cluster-aware clients such as `redis-cli -c` follow it). While
    /// no node is the primary (a failover under way) the write waits for
    /// one, at most [`FAILOVER_WAIT`], rather than fail at once; then
    /// `-CLUSTERDOWN`, which cluster clients retry.
    pub(super) fn not_primary(&mut self, key: &[u8]) -> Option<Reply> {
        let deadline = Instant::now() + FAILOVER_WAIT;
        let mut fresh = false;
        loop {
            match self.role(fresh) {
                Err(r) => return Some(r),
                Ok((s, _)) if s.role == proto::ROLE_PRIMARY => return None,
                Ok((_, Some(p))) => {
                    return Some(Reply::err(format!(
                        "MOVED {} {p}",
                        resp_codec::key_slot(key)
                    )))
                }
                Ok((s, None)) if Instant::now() >= deadline => {
                    return Some(Reply::err(format!(
                        "CLUSTERDOWN this node is {}, not the primary, and no primary was \
                         known for {} s",
                        proto::role_name(s.role),
                        FAILOVER_WAIT.as_secs()
                    )))
                }
                Ok(_) => {
                    fresh = true;
                    std::thread::sleep(ROLE_TTL / 4);
                }
            }
        }
    }

    /// Whether the connection may run `cmd`; otherwise the reply (and
    /// whether to close). Credentials that changed since `AUTH` are
    /// checked again first: a removed user or a changed password ends the
    /// connection (issue 29: revocation is live).
    pub(super) fn admit(&mut self, cmd: &str) -> Result<(), (Reply, bool)> {
        // One atomic load per request; the credentials only when they changed.
        let changes = self.shared.gate.changes();
        if changes != self.seen_changes {
            self.seen_changes = changes;
            let now = self.shared.gate.credentials();
            let keeps = match &self.user {
                Some((u, _)) if self.creds.configured() => now.still_grants(&self.creds, u),
                // Admitted while none were configured: only while none are.
                Some(_) => !now.configured(),
                None => true,
            };
            if !keeps {
                return Err((Reply::err("NOAUTH Authentication required."), true));
            }
            if !now.configured() && self.user.is_none() {
                self.user = Some((crate::auth::DEFAULT_USER.into(), Rights::ReadWrite));
            }
            self.creds = now;
        }
        match (&self.user, cmd) {
            (_, "AUTH" | "HELLO" | "QUIT") => Ok(()),
            (None, _) => Err((Reply::err("NOAUTH Authentication required."), false)),
            (Some((u, Rights::Read)), _)
                if super::command_table::find(cmd).is_some_and(|c| c.writes()) =>
            {
                Err((
                    Reply::err(format!(
                        "NOPERM User {u} has no permissions to run the '{}' command",
                        cmd.to_ascii_lowercase()
                    )),
                    false,
                ))
            }
            _ => Ok(()),
        }
    }

    /// `AUTH [user] password`, as Redis answers it.
    pub(super) fn auth(&mut self, args: &[Vec<u8>]) -> Reply {
        let (user, pass) = match args.len() {
            2 => (crate::auth::DEFAULT_USER.to_string(), &args[1]),
            3 => (String::from_utf8_lossy(&args[1]).into_owned(), &args[2]),
            _ => return Reply::err("ERR syntax error"),
        };
        let creds = self.shared.gate.credentials();
        if !creds.configured() && args.len() == 2 {
            return Reply::err(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        }
        match creds.check_password(&user, pass) {
            Some(rights) => {
                self.info.user.lock().expect("user").clone_from(&user);
                self.user = Some((user, rights));
                self.creds = creds;
                Reply::ok()
            }
            None => Reply::err("WRONGPASS invalid username-password pair or user is disabled."),
        }
    }
}
