//! The server side of perftest's `-R` (rdma_cm) protocol, so that
//! `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R` clients (Linux
//! siw, perftest 6.06) run against `softrdma bench --server`. The protocol
//! is written down in docs/perftest-protocol.md; in short:
//!
//! * A perftest client opens a **control connection** first (no private
//!   data) and then, half-way through the set-up, one **test connection**
//!   per QP (`-q`, default 1) to the same port, again without private data.
//!   The bench server hands every such request to [`serve`] on a thread of
//!   its own; a request from an address whose control session is waiting
//!   for its test connections (see below) is one of those, anything else
//!   starts a new control session.
//! * On the control connection the client always speaks first and the
//!   server answers each message with one of its own (RDMAP Sends, one
//!   outstanding each way). A session answers by length: the first message
//!   is perftest's 16-byte version string (we answer "6.06", the version
//!   implemented here); a message of 56 bytes or more is a
//!   `struct pingpong_dest` (we answer with ours: the advertised buffer's
//!   address and rkey, big-endian); anything else (page size, cache line,
//!   MTU, the bandwidth report) is echoed, which is always acceptable to the
//!   client (it takes the larger page size, the smaller MTU, and does not
//!   use the report).
//! * The first `pingpong_dest` is the sync before the test connections: the
//!   session registers itself as collecting test connections from the
//!   client's address before answering it; the second is the sync after
//!   them: the session stops collecting, and the connections it holds are
//!   the test QPs.
//! * Test QPs are passive for write_bw and read_bw (the client Writes into
//!   or Reads from the advertised buffer). For send_bw they get many
//!   receives (reposted as they complete) and, because iWARP has no
//!   receiver-not-ready retry, perftest's iWARP credit scheme: the server
//!   RDMA-Writes the number of messages received (a 32-bit little-endian
//!   count) into the client's credit word for each QP, whose address and
//!   rkey the client sent in the first `pingpong_dest`s after the sync.
//!   We cannot tell which test QP is which client QP, so every credit word
//!   gets the smallest count of all QPs, which never lets a client run
//!   ahead of the receives we hold and never stalls it.
//! * The session ends when the client closes the control connection.
//!
//! Nothing tells the server the test, the message size or the iteration
//! count (perftest 6.06 exchanges none of them), so the buffer is 64 MiB
//! (allocated lazily by the kernel; only what the client touches becomes
//! resident), every receive covers all of it, and the test is named in the
//! session's summary line from what the client did (Sends received:
//! send_bw; RDMA Reads asked for at connection time: read_bw; else
//! write_bw).
//!
//! The latency tests need the server to take part, so it must be told the
//! test, as a perftest server is (`--perftest TEST`, see [`Expect`]):
//!
//! * `read_lat`: passive, like read_bw (only the summary's name differs).
//! * `send_lat`: the client Sends first; every Send received is answered
//!   with a Send of the same length on the same QP (perftest's ping-pong).
//!   No credit Writes: a latency client advertises its data buffer, not a
//!   credit word, and never runs ahead of the answers.
//! * `write_lat`: the **server** Writes first. Round `r` Writes `size`
//!   bytes whose last byte is `r` (mod 256) to the buffer the client
//!   advertised on its test QP, then waits until the client's Write has
//!   set the last byte of our buffer to `r`. So the server must know the
//!   size (`--size`, perftest's `-s`) and the number of rounds (`--iters`,
//!   perftest's `-n`), exactly as a perftest server does; `-a` (all sizes)
//!   is not supported.

use super::proto::Test as BenchTest;
use anyhow::{bail, Context, Result};
use parking_lot::{Condvar, Mutex};
use softrdma_verbs::{
    Access, CompletionQueue, ConnParams, ConnectRequest, Device, Error as VerbsError, MemoryRegion,
    ProtectionDomain, QpCaps, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The perftest version we announce: the one this module implements (and
/// the one Debian 12 ships). Newer clients (6.28 and later) then skip the
/// parameter negotiation they would run with a peer of their own version.
const VERSION: &[u8] = b"6.06";
/// perftest's `MAX_VERSION`: the length of the version message.
const VERSION_LEN: usize = 16;
/// `sizeof(struct pingpong_dest)` in perftest 6.06 (later versions add a
/// field and send 64 bytes; the fields we use keep their offsets).
const DEST_LEN: usize = 56;
/// Offsets in `struct pingpong_dest` (all fields big-endian on the wire).
const DEST_OUT_READS: usize = 4;
const DEST_QPN: usize = 8;
const DEST_PSN: usize = 12;
const DEST_RKEY: usize = 16;
const DEST_VADDR: usize = 24;

/// Bytes per control message slot (perftest's are at most 64 bytes).
const CTRL_SLOT: usize = 256;
/// Receives kept posted on the control QP (the client has one message in
/// flight at a time).
const CTRL_RECVS: usize = 4;
/// Send slots for our answers (used in turn).
const CTRL_SENDS: usize = 4;

/// The buffer advertised to the client: the target of its Writes, the
/// source of its Reads, and where its Sends land. perftest touches at most
/// max(message size, page size) bytes of it.
const BUF_LEN: usize = 64 << 20;
/// Receives posted on a test QP when it is accepted (perftest's default
/// receive depth for send_bw is 512).
const INITIAL_RECVS: usize = 1024;
/// At most this many receives per test QP (perftest's largest `-r`).
const MAX_RECVS_PER_QP: usize = 16384;
/// Receives posted over all test QPs of a session, once their number is
/// known (bounds the memory of receive descriptors to a few MiB).
const RECV_BUDGET: usize = 65536;
/// Credit values in flight (each a 4-byte source that must not change
/// until its Writes have gone out).
const CREDIT_SLOTS: usize = 256;
const TEST_SQ_DEPTH: usize = CREDIT_SLOTS + 16;
const CQ_DEPTH: usize = 1 << 20;
/// How long a session waits for another session from the same address to
/// finish collecting its test connections.
const COLLECT_WAIT: Duration = Duration::from_secs(30);

/// `wr_id` of a send_lat answer and of a write_lat Write (never a credit
/// slot).
const ANSWER_WR: u64 = u64::MAX - 1;
const LAT_WRITE_WR: u64 = u64::MAX - 2;

/// What the server is told about its perftest clients (`--perftest`,
/// `--size`, `--iters`, `--crc`), since perftest tells it none of this.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// The test the clients run; `None`: a bandwidth test, recognised from
    /// what the client does.
    pub test: Option<BenchTest>,
    /// write_lat: the message size (perftest's `-s`).
    pub size: usize,
    /// write_lat: the number of rounds (perftest's `-n`).
    pub iters: u64,
    /// Turn MPA CRC on even when the client does not ask for it (siw asks
    /// only with its `mpa_crc_required` parameter set).
    pub crc: bool,
}

impl Default for Expect {
    fn default() -> Expect {
        Expect {
            test: None,
            size: 2,
            iters: 1000,
            crc: false,
        }
    }
}

impl Expect {
    /// Checks that the server can serve `test` as perftest's server would.
    pub fn check(&self) -> Result<()> {
        match self.test {
            None
            | Some(BenchTest::WriteBw | BenchTest::ReadBw | BenchTest::SendBw)
            | Some(BenchTest::ReadLat | BenchTest::SendLat) => Ok(()),
            Some(BenchTest::WriteLat) => {
                if self.size == 0 || self.size > BUF_LEN {
                    bail!(
                        "--perftest write_lat: the size must be 1 to {BUF_LEN} bytes, not {}",
                        self.size
                    );
                }
                if self.iters == 0 {
                    bail!("--perftest write_lat: --iters must be at least 1");
                }
                Ok(())
            }
            Some(t) => bail!("--perftest: perftest has no `{}` test we serve", t.name()),
        }
    }

    fn credits(&self) -> bool {
        matches!(self.test, None | Some(BenchTest::SendBw))
    }
}

/// Sessions collecting test connections, at most one per client address.
struct Registry {
    collecting: Mutex<Vec<Arc<Shared>>>,
    changed: Condvar,
}

static REGISTRY: Registry = Registry {
    collecting: Mutex::new(Vec::new()),
    changed: Condvar::new(),
};

/// What a session shares with the threads that accept its test connections.
struct Shared {
    peer_ip: IpAddr,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    buf: MemoryRegion,
    collect: Mutex<Collect>,
    expect: Expect,
}

#[derive(Default)]
struct Collect {
    open: bool,
    conns: Vec<TestConn>,
}

struct TestConn {
    qp: Arc<QueuePair>,
    peer: SocketAddr,
    /// The client's IRD and ORD from its MPA request.
    req_ird: u16,
    req_ord: u16,
}

impl Shared {
    /// One receive covering the whole buffer (contents do not matter).
    fn recv_wr(&self) -> RecvWr {
        RecvWr::new(0, &[self.buf.sge(0, BUF_LEN)])
    }

    /// Accepts a test connection while the session collects them; hands the
    /// request back when it no longer does.
    fn add_test_conn(&self, req: ConnectRequest) -> Result<Option<ConnectRequest>> {
        let crc = self.expect.crc;
        if !self.collect.lock().open {
            return Ok(Some(req));
        }
        let (req_ird, req_ord) = req.ird_ord().unwrap_or((0, 0));
        let mut attr = QpInitAttr::new(&self.cq);
        attr.caps = QpCaps {
            max_send_wr: TEST_SQ_DEPTH,
            max_recv_wr: MAX_RECVS_PER_QP,
            max_send_sge: 1,
            max_recv_sge: 1,
        };
        let qp = Arc::new(self.pd.create_qp(attr)?);
        qp.modify(QpState::Init)?;
        // The client sends nothing on a test QP before the set-up ends, but
        // have receives there from the start anyway.
        let wr = self.recv_wr();
        for _ in 0..INITIAL_RECVS {
            qp.post_recv(&wr)?;
        }
        let params = ConnParams {
            // Serve as many Reads as the client will have in flight.
            ird: req_ord.max(1),
            ord: 1,
            mpa_revision: req.mpa_revision(),
            crc: req.crc_requested() || crc,
            ..ConnParams::default()
        };
        let peer = req.peer_addr();
        {
            let mut c = self.collect.lock();
            if !c.open {
                return Ok(Some(req));
            }
            c.conns.push(TestConn {
                qp: qp.clone(),
                peer,
                req_ird,
                req_ord,
            });
        }
        if let Err(e) = req.accept(&qp, &params) {
            self.collect
                .lock()
                .conns
                .retain(|t| t.qp.qp_num() != qp.qp_num());
            return Err(e).context("accept a perftest test connection");
        }
        tracing::debug!(%peer, qpn = %qp.qp_num(), req_ird, req_ord, "perftest test connection");
        Ok(None)
    }
}

/// Serves one connection request that is not a softrdma bench client:
/// either the control connection of a perftest `-R` client (then runs its
/// whole session, returning when the client has gone) or one of the test
/// connections of a session already running (then returns once it is
/// accepted).
pub fn serve(
    dev: &softrdma_verbs::Device,
    req: softrdma_verbs::ConnectRequest,
    expect: Expect,
) -> Result<()> {
    let ip = req.peer_addr().ip();
    let collecting = REGISTRY
        .collecting
        .lock()
        .iter()
        .find(|s| s.peer_ip == ip)
        .cloned();
    let req = match collecting {
        Some(s) => match s.add_test_conn(req)? {
            None => return Ok(()),
            Some(req) => req,
        },
        None => req,
    };
    run_session(dev, req, expect)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the first `pingpong_dest`.
    Setup,
    /// Between the syncs around the test connections.
    Collecting,
    /// Test QPs known.
    Connected,
}

struct Test {
    qp: Arc<QueuePair>,
    peer: SocketAddr,
    req_ird: u16,
    req_ord: u16,
    /// Messages received since the last reset (the credit perftest counts).
    count: u64,
    alive: bool,
}

struct Session {
    shared: Arc<Shared>,
    peer: SocketAddr,
    qp: QueuePair,
    ctrl: MemoryRegion,
    credit: MemoryRegion,
    recv_wr: RecvWr,
    phase: Phase,
    /// Control messages received.
    msgs: u64,
    /// `pingpong_dest`s received, and those since the test connections.
    dests: u64,
    dests_connected: usize,
    /// Test Sends received when the last `pingpong_dest` arrived: 0 with
    /// Sends received means the client never sent the closing exchange
    /// that follows its Sends (it failed on its own side, see `finish`).
    sends_at_last_dest: u64,
    client_version: String,
    next_send: usize,
    tests: Vec<Test>,
    by_qpn: HashMap<softrdma_verbs::Qpn, usize>,
    /// The clients' credit words (address, rkey), one per test QP.
    targets: Vec<(u64, u32)>,
    credit_written: u64,
    credit_seq: usize,
    slot_busy: Vec<u32>,
    credit_outstanding: u32,
    /// An answer held back until our credit Writes have gone out.
    pending_reply: Option<Vec<u8>>,
    sends: u64,
    send_bytes: u64,
    credit_writes: u64,
    test_errors: Vec<String>,
    /// send_lat answers posted, or write_lat rounds completed.
    answers: u64,
    /// write_lat: the thread running the rounds, and its stop flag.
    lat_writer: Option<JoinHandle<Result<u64>>>,
    stop: Arc<AtomicBool>,
    /// The client left (its control connection closed).
    ended: bool,
}

fn run_session(dev: &Device, req: ConnectRequest, expect: Expect) -> Result<()> {
    let peer = req.peer_addr();
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(CQ_DEPTH)?;
    // vec! of zeros comes from calloc: the pages stay unmapped until used.
    let buf = pd
        .register(
            vec![0u8; BUF_LEN],
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .context("register the perftest buffer")?;
    let ctrl = pd.alloc_mr(CTRL_SLOT * (CTRL_RECVS + CTRL_SENDS), Access::LOCAL_WRITE)?;
    let credit = pd.alloc_mr(4 * CREDIT_SLOTS, Access::LOCAL_WRITE)?;
    let mut attr = QpInitAttr::new(&cq);
    attr.caps = QpCaps {
        max_send_wr: CTRL_SENDS + 4,
        max_recv_wr: CTRL_RECVS,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let qp = pd.create_qp(attr)?;
    qp.modify(QpState::Init)?;
    // The client's first message may follow the connection at once.
    for i in 0..CTRL_RECVS {
        qp.post_recv(&RecvWr::new(
            i as u64,
            &[ctrl.sge(i * CTRL_SLOT, CTRL_SLOT)],
        ))?;
    }
    let (_, req_ord) = req.ird_ord().unwrap_or((0, 0));
    let params = ConnParams {
        ird: req_ord.max(1),
        ord: 1,
        mpa_revision: req.mpa_revision(),
        crc: req.crc_requested() || expect.crc,
        ..ConnParams::default()
    };
    req.accept(&qp, &params)
        .context("accept a perftest control connection")?;
    if let Some(n) = qp.conn_params() {
        tracing::info!(%peer, ?n, "perftest control connection");
    }
    let shared = Arc::new(Shared {
        peer_ip: peer.ip(),
        pd,
        cq,
        buf,
        collect: Mutex::new(Collect::default()),
        expect,
    });
    let recv_wr = shared.recv_wr();
    let mut s = Session {
        shared,
        peer,
        qp,
        ctrl,
        credit,
        recv_wr,
        phase: Phase::Setup,
        msgs: 0,
        dests: 0,
        dests_connected: 0,
        sends_at_last_dest: 0,
        client_version: String::new(),
        next_send: 0,
        tests: Vec::new(),
        by_qpn: HashMap::new(),
        targets: Vec::new(),
        credit_written: 0,
        credit_seq: 0,
        slot_busy: vec![0; CREDIT_SLOTS],
        credit_outstanding: 0,
        pending_reply: None,
        sends: 0,
        send_bytes: 0,
        credit_writes: 0,
        test_errors: Vec::new(),
        answers: 0,
        lat_writer: None,
        stop: Arc::new(AtomicBool::new(false)),
        ended: false,
    };
    let r = s.run();
    s.finish(r)
}

/// perftest's version strings: digits, a dot, digits ("6.06", "5.70").
fn is_version(v: &[u8]) -> bool {
    let s = String::from_utf8_lossy(v);
    match s.split_once('.') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Session {
    fn run(&mut self) -> Result<()> {
        let mut wcs = vec![WorkCompletion::default(); 256];
        let ctrl_qpn = self.qp.qp_num();
        while !self.ended {
            let n = self
                .shared
                .cq
                .poll_wait(&mut wcs, Duration::from_secs(3600));
            for wc in &wcs[..n] {
                if wc.qp_num == ctrl_qpn {
                    self.on_ctrl(wc)?;
                } else {
                    self.on_test(wc);
                }
            }
            if !self.ended {
                self.write_credits()?;
                if self.credit_outstanding == 0 {
                    if let Some(r) = self.pending_reply.take() {
                        self.post_reply(&r)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn on_ctrl(&mut self, wc: &WorkCompletion) -> Result<()> {
        if !wc.is_ok() {
            // Flushed: the client closed the control connection.
            if wc.status != WcStatus::WrFlushErr {
                tracing::warn!(peer = %self.peer, ?wc, "perftest control QP error");
            }
            self.ended = true;
            return Ok(());
        }
        if wc.opcode != WcOpcode::Recv {
            return Ok(()); // one of our answers went out
        }
        let slot = wc.wr_id as usize;
        let len = (wc.byte_len as usize).min(CTRL_SLOT);
        let mut msg = vec![0u8; len];
        self.ctrl.read_at(slot * CTRL_SLOT, &mut msg);
        self.qp.post_recv(&RecvWr::new(
            slot as u64,
            &[self.ctrl.sge(slot * CTRL_SLOT, CTRL_SLOT)],
        ))?;
        self.msgs += 1;
        let answer = self.answer(&msg)?;
        if self.credit_outstanding > 0 {
            self.pending_reply = Some(answer);
        } else {
            self.post_reply(&answer)?;
        }
        Ok(())
    }

    fn post_reply(&mut self, data: &[u8]) -> Result<()> {
        let slot = CTRL_RECVS + self.next_send % CTRL_SENDS;
        self.next_send += 1;
        self.ctrl.write_at(slot * CTRL_SLOT, data);
        self.qp
            .post_send(&SendWr::send(
                u64::MAX,
                &[self.ctrl.sge(slot * CTRL_SLOT, data.len())],
            ))
            .context("send a perftest control message")
    }

    /// Our answer to one control message.
    fn answer(&mut self, msg: &[u8]) -> Result<Vec<u8>> {
        if self.msgs == 1 {
            if msg.len() != VERSION_LEN {
                bail!(
                    "not a perftest -R client: its first message has {} bytes (perftest's \
                     version string has {VERSION_LEN})",
                    msg.len()
                );
            }
            let end = msg.iter().position(|b| *b == 0).unwrap_or(msg.len());
            let v = &msg[..end];
            if !is_version(v) {
                bail!(
                    "not a perftest -R client: its first message is not a version string \
                     ({:02x?})",
                    msg
                );
            }
            self.client_version = String::from_utf8_lossy(v).into_owned();
            let mut v = vec![0u8; VERSION_LEN];
            v[..VERSION.len()].copy_from_slice(VERSION);
            return Ok(v);
        }
        if msg.len() >= DEST_LEN {
            return self.on_dest(msg);
        }
        // Page size, cache line size, MTU, bandwidth report: the same back.
        Ok(msg.to_vec())
    }

    fn on_dest(&mut self, msg: &[u8]) -> Result<Vec<u8>> {
        self.dests += 1;
        self.sends_at_last_dest = self.sends;
        match self.phase {
            Phase::Setup => {
                self.open_collecting()?;
                self.phase = Phase::Collecting;
                Ok(self.dest(msg.len(), None))
            }
            Phase::Collecting => {
                self.close_collecting()?;
                self.phase = Phase::Connected;
                Ok(self.dest(msg.len(), None))
            }
            Phase::Connected => {
                let k = self.dests_connected;
                self.dests_connected += 1;
                // The first one per QP carries the client's buffer (or, for
                // send_bw on iWARP, its credit word) for that QP.
                if k < self.tests.len() {
                    self.targets
                        .push((be_u64(msg, DEST_VADDR), be_u32(msg, DEST_RKEY)));
                }
                if self.shared.expect.test == Some(BenchTest::WriteLat)
                    && self.lat_writer.is_none()
                    && !self.targets.is_empty()
                {
                    self.start_lat_writer()?;
                }
                // Every sync starts a new count (ib_send_bw -a zeroes its
                // credit words after the sync before each size).
                for t in &mut self.tests {
                    t.count = 0;
                }
                self.credit_written = 0;
                let i = k % self.tests.len().max(1);
                Ok(self.dest(msg.len(), Some(i)))
            }
        }
    }

    /// write_lat: the server's side of perftest's ping-pong, on a thread of
    /// its own (the session thread keeps answering control messages and
    /// reaping completions). The client polls the last byte of the buffer
    /// it advertised; we poll the last byte of ours.
    fn start_lat_writer(&mut self) -> Result<()> {
        if self.tests.len() != 1 {
            bail!(
                "write_lat runs one QP, the client connected {}",
                self.tests.len()
            );
        }
        let e = self.shared.expect;
        let qp = self.tests[0].qp.clone();
        let (addr, rkey) = self.targets[0];
        let src = self
            .shared
            .pd
            .alloc_mr(e.size, Access::LOCAL_WRITE)
            .context("allocate the write_lat source")?;
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        let h = std::thread::Builder::new()
            .name("perftest-lat".into())
            .spawn(move || -> Result<u64> {
                let last = e.size - 1;
                let mut done = 0;
                for r in 1..=e.iters {
                    let b = r as u8;
                    src.write_at(last, &[b]);
                    // The previous round's Write has been placed (the
                    // client answered it), so the source may change.
                    qp.post_send(&SendWr::write(
                        LAT_WRITE_WR,
                        &[src.sge(0, e.size)],
                        addr,
                        softrdma_verbs::Rkey::from_raw(rkey),
                    ))
                    .with_context(|| format!("write_lat round {r}: post the Write"))?;
                    super::spin_until(
                        || stop.load(Ordering::Relaxed) || shared.buf.peek_u8(last) == b,
                        &qp,
                        false,
                    )
                    .with_context(|| format!("write_lat round {r}: waiting for the client"))?;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    done = r;
                }
                Ok(done)
            })?;
        self.lat_writer = Some(h);
        Ok(())
    }

    /// Our `pingpong_dest` (for test QP `i`, if any), `len` bytes.
    fn dest(&self, len: usize, i: Option<usize>) -> Vec<u8> {
        let mut d = vec![0u8; len];
        let (qpn, ird) = match i.and_then(|i| self.tests.get(i)) {
            Some(t) => (
                t.qp.qp_num().raw(),
                t.qp.conn_params().map_or(0, |n| n.ird as u32),
            ),
            None => (0, 0),
        };
        d[DEST_OUT_READS..DEST_OUT_READS + 4].copy_from_slice(&ird.to_be_bytes());
        d[DEST_QPN..DEST_QPN + 4].copy_from_slice(&qpn.to_be_bytes());
        d[DEST_PSN..DEST_PSN + 4].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
        d[DEST_RKEY..DEST_RKEY + 4].copy_from_slice(&self.shared.buf.rkey().raw().to_be_bytes());
        d[DEST_VADDR..DEST_VADDR + 8].copy_from_slice(&self.shared.buf.addr().to_be_bytes());
        d
    }

    /// Registers this session as collecting test connections from the
    /// client's address (after another one from there has finished).
    fn open_collecting(&mut self) -> Result<()> {
        let deadline = Instant::now() + COLLECT_WAIT;
        let mut reg = REGISTRY.collecting.lock();
        while reg.iter().any(|s| s.peer_ip == self.shared.peer_ip) {
            if REGISTRY.changed.wait_until(&mut reg, deadline).timed_out() {
                bail!(
                    "another perftest client from {} kept collecting its test connections \
                     for {COLLECT_WAIT:?}",
                    self.shared.peer_ip
                );
            }
        }
        self.shared.collect.lock().open = true;
        reg.push(self.shared.clone());
        Ok(())
    }

    fn unregister(&self) {
        let mut reg = REGISTRY.collecting.lock();
        let before = reg.len();
        reg.retain(|s| !Arc::ptr_eq(s, &self.shared));
        if reg.len() != before {
            REGISTRY.changed.notify_all();
        }
    }

    /// The client has connected all its test QPs: take them.
    fn close_collecting(&mut self) -> Result<()> {
        self.unregister();
        let conns = {
            let mut c = self.shared.collect.lock();
            c.open = false;
            std::mem::take(&mut c.conns)
        };
        if conns.is_empty() {
            bail!("the client made no test connection before its second sync");
        }
        let per_qp = (RECV_BUDGET / conns.len()).clamp(INITIAL_RECVS, MAX_RECVS_PER_QP);
        for (i, c) in conns.into_iter().enumerate() {
            for _ in INITIAL_RECVS..per_qp {
                c.qp.post_recv(&self.recv_wr)
                    .context("post receives on a test QP")?;
            }
            self.by_qpn.insert(c.qp.qp_num(), i);
            self.tests.push(Test {
                qp: c.qp,
                peer: c.peer,
                req_ird: c.req_ird,
                req_ord: c.req_ord,
                count: 0,
                alive: true,
            });
        }
        tracing::info!(peer = %self.peer, qps = self.tests.len(), per_qp, "perftest test QPs connected");
        Ok(())
    }

    fn on_test(&mut self, wc: &WorkCompletion) {
        let Some(&i) = self.by_qpn.get(&wc.qp_num) else {
            return;
        };
        if wc.opcode == WcOpcode::RdmaWrite {
            // A credit Write (flushed ones keep their opcode).
            if let Some(b) = self.slot_busy.get_mut(wc.wr_id as usize) {
                *b = b.saturating_sub(1);
                self.credit_outstanding = self.credit_outstanding.saturating_sub(1);
            }
        }
        let t = &mut self.tests[i];
        if !wc.is_ok() {
            if t.alive && wc.status != WcStatus::WrFlushErr {
                self.test_errors.push(format!(
                    "test QP {} ({}): {:?} on {:?}",
                    wc.qp_num, t.peer, wc.status, wc.opcode
                ));
            }
            t.alive = false;
            return;
        }
        if wc.opcode == WcOpcode::Recv {
            t.count += 1;
            self.sends += 1;
            self.send_bytes += wc.byte_len as u64;
            if let Err(e) = t.qp.post_recv(&self.recv_wr) {
                // Only a QP going down refuses a receive here.
                tracing::debug!(qpn = %wc.qp_num, error = %e, "repost refused");
            }
            if self.shared.expect.test == Some(BenchTest::SendLat) {
                // perftest's ping-pong: one Send of the same length back.
                // Its content does not matter; it is what just arrived.
                let len = wc.byte_len as usize;
                let sge = self.shared.buf.sge(0, len.min(BUF_LEN));
                let wr = if len == 0 {
                    SendWr::send(ANSWER_WR, &[])
                } else {
                    SendWr::send(ANSWER_WR, &[sge])
                };
                match t.qp.post_send(&wr) {
                    Ok(()) => self.answers += 1,
                    Err(e) => {
                        if t.alive {
                            self.test_errors.push(format!(
                                "test QP {} ({}): send_lat answer refused: {e}",
                                wc.qp_num, t.peer
                            ));
                        }
                    }
                }
            }
        }
    }

    /// perftest's iWARP credits (send_bw): after receives have completed
    /// (and been reposted), Write the smallest count of all test QPs into
    /// every client credit word. Nothing is written before the first Send
    /// arrives, so write_bw and read_bw clients never see a Write.
    fn write_credits(&mut self) -> Result<()> {
        if !self.shared.expect.credits() || self.sends == 0 || self.targets.is_empty() {
            return Ok(());
        }
        let Some(min) = self.tests.iter().filter(|t| t.alive).map(|t| t.count).min() else {
            return Ok(());
        };
        if min <= self.credit_written {
            return Ok(());
        }
        let slot = self.credit_seq % CREDIT_SLOTS;
        if self.slot_busy[slot] > 0 {
            return Ok(()); // try again after more completions
        }
        // perftest keeps the count in host order (little-endian on x86 and
        // arm64) and compares it as a u32.
        self.credit.write_at(slot * 4, &(min as u32).to_le_bytes());
        let mut posted = 0;
        for (t, (addr, rkey)) in self.tests.iter().zip(&self.targets) {
            if !t.alive {
                continue;
            }
            let wr = SendWr::write(
                slot as u64,
                &[self.credit.sge(slot * 4, 4)],
                *addr,
                softrdma_verbs::Rkey::from_raw(*rkey),
            );
            match t.qp.post_send(&wr) {
                Ok(()) => posted += 1,
                Err(VerbsError::SendQueueFull) => {}
                Err(e) => tracing::debug!(qpn = %t.qp.qp_num(), error = %e, "credit Write refused"),
            }
        }
        if posted > 0 {
            self.slot_busy[slot] = posted;
            self.credit_outstanding += posted;
            self.credit_seq += 1;
            self.credit_writes += 1;
            self.credit_written = min;
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        if let Some(t) = self.shared.expect.test {
            t.name()
        } else if self.sends > 0 {
            "send_bw"
        } else if self.tests.iter().any(|t| t.req_ord > 0) {
            "read_bw"
        } else {
            "write_bw"
        }
    }

    /// Tears the session down and prints its summary line.
    fn finish(mut self, r: Result<()>) -> Result<()> {
        self.unregister();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.lat_writer.take() {
            match h.join() {
                Ok(Ok(rounds)) => self.answers = rounds,
                Ok(Err(e)) => self.test_errors.push(format!("{e:#}")),
                Err(_) => self
                    .test_errors
                    .push("the write_lat thread panicked".into()),
            }
        }
        let leftover = std::mem::take(&mut self.shared.collect.lock().conns);
        for c in &leftover {
            c.qp.disconnect();
        }
        for t in &self.tests {
            t.qp.disconnect();
        }
        self.qp.disconnect();
        let (ird, ord) = self
            .tests
            .first()
            .map_or((0, 0), |t| (t.req_ird, t.req_ord));
        let summary = format!(
            "perftest: {}: {} client (perftest {}): {} test QP(s) (client IRD {ird} ORD {ord}), \
             {} control messages ({} pingpong_dest), {} Sends received ({} bytes), {} credit Writes, \
             {} latency answers",
            self.peer,
            self.kind(),
            if self.client_version.is_empty() {
                "?"
            } else {
                &self.client_version
            },
            self.tests.len(),
            self.msgs,
            self.dests,
            self.sends,
            self.send_bytes,
            self.credit_writes,
            self.answers,
        );
        if let Err(e) = r {
            return Err(e.context(summary));
        }
        if self.phase != Phase::Connected {
            bail!(
                "the perftest client left during the set-up ({} control messages): {summary}",
                self.msgs
            );
        }
        if !self.test_errors.is_empty() {
            bail!("{}; {summary}", self.test_errors.join("; "));
        }
        // A send_bw or send_lat client sends a `pingpong_dest` after its
        // Sends (the closing exchange, `ctx_close_connection`) before it
        // disconnects. One that leaves without it failed after its test, on
        // its own side: perftest exits 1 with `Can't produce a report` when
        // its clock calibration fails (a CPU-starved guest) and `-F` is not
        // given (docs/perftest-protocol.md, section 7).
        let note = if self.sends > 0 && self.sends_at_last_dest == 0 {
            "; the client left after its Sends without its closing exchange (a failure on \
             its side: see its output)"
        } else {
            ""
        };
        println!("{summary}{note}, done");
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_layout_matches_perftest() {
        // struct pingpong_dest on x86-64: lid, out_reads, qpn, psn, rkey,
        // 4 bytes of padding, vaddr, gid[16], srqn, gid_index.
        assert_eq!(DEST_LEN, 4 * 5 + 4 + 8 + 16 + 4 + 4);
        assert_eq!(DEST_VADDR % 8, 0);
        assert_eq!(DEST_RKEY + 4 + 4, DEST_VADDR);
        let mut m = vec![0u8; DEST_LEN];
        m[DEST_RKEY..DEST_RKEY + 4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        m[DEST_VADDR..DEST_VADDR + 8].copy_from_slice(&0x7f00_0000_1000u64.to_be_bytes());
        assert_eq!(be_u32(&m, DEST_RKEY), 0x1234_5678);
        assert_eq!(be_u64(&m, DEST_VADDR), 0x7f00_0000_1000);
    }

    #[test]
    fn version_strings() {
        assert!(is_version(b"6.06"));
        assert!(is_version(b"5.70"));
        assert!(!is_version(b""));
        assert!(!is_version(b"6"));
        assert!(!is_version(b"6."));
        assert!(!is_version(&[0x10, 0x20, 0, 0, 0x12, 0x34, 0x56, 0x78]));
    }
}
