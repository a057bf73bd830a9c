//! Bad input from a misbehaving iWARP peer.
//!
//! Every test drives a real TCP socket by hand (`std::net::TcpStream`)
//! against a real softrdma-verbs device: the raw peer does a correct MPA
//! revision 2 "enhanced" handshake (RFC 5044 section 7.1, RFC 6581) with
//! the wire crate's codecs, then sends one kind of bad input. Each test
//! checks
//!
//! * what the peer reads back: a Terminate (RDMAP opcode 7 on DDP queue 2,
//!   RFC 5040 section 4.8) with the layer / error type / error code that
//!   RFC 5040 section 4.8 (Figure 9) and RFC 5041 section 7.2 prescribe,
//!   followed by the end of the stream; or just the end of the stream where
//!   no Terminate can be sent (rules below);
//! * that the engine's QP goes to ERROR, that the receives (and send WRs)
//!   posted beforehand complete, with the specific error status where one
//!   applies and a flush status otherwise, and that the engine reports the
//!   Terminate it chose as an async event;
//! * that no byte outside a registered region is written, nor one inside
//!   a region the bad request was refused for: regions are registered over
//!   the middle of a larger buffer whose guard bytes on both sides are
//!   checked afterwards (each region borrows its buffer, so it cannot
//!   outlive it, and the buffer is freed after the region's drop, which
//!   waits for placements in flight);
//! * that the process did not panic and the device still works: a fresh,
//!   good connection on the same device (through the same listener where
//!   the engine is the passive side) moves one Send.
//!
//! Rules applied where the RFCs leave a choice:
//!
//! * Garbage where the MPA Request is due: the listener closes the TCP
//!   connection without a reply. FPDU framing is not established, so no
//!   Terminate can be framed: RFC 5044 has an invalid Request answered by
//!   closing the TCP connection, and its code for it (2/0/0x04, section 8)
//!   is only reported locally (see `WireError::term_code`).
//! * Garbage after the handshake: the receiver has no way to tell garbage
//!   from an FPDU, so it parses the bytes as one and reports the first check
//!   that fails, in Linux siw's order (`siw_get_hdr`): the DDP version (RFC
//!   5041 section 7.2: tagged 1/1/0x04 or untagged 1/2/0x06, after the T bit
//!   of the "header"), then the RDMAP version and opcode. A ULPDU length
//!   too short for the DDP header it announces has no code in RFC 5041 or
//!   5044; it is RDMAP's "catastrophic error, localized to RDMAP stream"
//!   (0/2/0x07), as the wire crate maps every truncated header.
//! * A CRC mismatch is MPA's error 2/0/0x02 (RFC 5044 section 8); the
//!   stream is still framed, so the Terminate is sent (siw does the same).
//! * The peer closing inside an FPDU: the connection is lost (RFC 5044
//!   section 8, code 0x01, reported locally): no Terminate can reach it.
//! * More Read Requests than the IRD: RDMAP remote operation error,
//!   catastrophic error localized to the RDMAP stream (0/2/0x07), the code
//!   Linux siw uses (`siw_init_rresp`). Such a request can only be noticed
//!   while the Read Responses already owed are stuck behind a full socket;
//!   a Terminate must not cut into the Read Response in progress (siw:
//!   `siw_send_terminate`, "must not interfere with an incomplete current
//!   transmit operation"; this engine: `Tx::queue_terminate`), so the peer
//!   sees the response cut off and the end of the stream, and the code is
//!   checked in the engine's async event.

mod common;
use common::{side, Side, T};
use softrdma_verbs::wire::ddp::{
    self, AtomicOp, AtomicRequest, AtomicResponse, DdpHeader, Opcode, ReadRequest, TaggedHeader,
    UntaggedHeader,
};
use softrdma_verbs::wire::mpa::{self, MpaFrame, MpaHeader, MpaKind, MpaV2};
use softrdma_verbs::wire::terminate::{codes, Terminate};
use softrdma_verbs::wire::TermCode;
use softrdma_verbs::*;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

// ------------------------------------------------------------ the raw peer

/// How the raw peer negotiates.
#[derive(Debug, Clone, Copy)]
struct RawOpts {
    crc: bool,
    ird: u16,
    ord: u16,
    /// Offer softrdma's extension block (RFC 7306 among them).
    ext: bool,
    /// The flags it offers ([`RAW_EXT`] unless a test says otherwise).
    ext_flags: u8,
    /// Peer-to-peer mode: the RTR types offered (as initiator) or chosen
    /// (as responder): (zero-length Write, zero-length Read).
    p2p: Option<(bool, bool)>,
    /// As responder: the reply's revision and whether it carries the
    /// enhanced IRD/ORD block (else: the request's revision, enhanced).
    reply: Option<(u8, bool)>,
    /// As responder: the reply's CRC bit, whatever the request asked.
    reply_crc: Option<bool>,
}

impl Default for RawOpts {
    fn default() -> Self {
        RawOpts {
            crc: false,
            ird: 8,
            ord: 8,
            ext: false,
            ext_flags: RAW_EXT,
            p2p: None,
            reply: None,
            reply_crc: None,
        }
    }
}

/// What the raw peer read next.
enum Next {
    /// A whole FPDU (its ULPDU; the CRC checked when negotiated).
    Fpdu(Vec<u8>),
    /// End of stream (or reset), with this many bytes of an unfinished FPDU.
    End { tail: usize },
}

/// The extensions the raw peer offers: not the same-host transport (it
/// has no segment to describe).
const RAW_EXT: u8 = mpa::ext::LARGE_SEGMENTS | mpa::ext::RFC7306;

/// An iWARP peer driven by hand over a plain TCP socket.
struct Raw {
    s: TcpStream,
    crc: bool,
    send_msn: u32,
    rr_msn: u32,
    inbuf: Vec<u8>,
}

fn read_mpa_frame(s: &mut TcpStream) -> MpaFrame {
    let mut h = [0u8; mpa::HEADER_LEN];
    s.read_exact(&mut h).expect("MPA frame header");
    let hdr = MpaHeader::decode(&h).expect("valid MPA frame");
    let mut pd = vec![0u8; hdr.pd_len as usize];
    s.read_exact(&mut pd).expect("MPA private data");
    MpaFrame::decode(&hdr, &pd).expect("valid MPA frame")
}

/// A DDP segment: header then body.
fn ulpdu(h: DdpHeader, body: &[u8]) -> Vec<u8> {
    let mut b = [0u8; ddp::UNTAGGED_LEN];
    let n = h.encode(&mut b);
    let mut v = b[..n].to_vec();
    v.extend_from_slice(body);
    v
}

impl Raw {
    fn from_stream(s: TcpStream, crc: bool) -> Raw {
        s.set_read_timeout(Some(T)).unwrap();
        s.set_write_timeout(Some(T)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw {
            s,
            crc,
            send_msn: 1,
            rr_msn: 1,
            inbuf: Vec::new(),
        }
    }

    /// Active side: TCP connect, MPA Request (revision 2, enhanced, with
    /// IRD/ORD), then the engine's Reply.
    fn connect(addr: SocketAddr, o: RawOpts) -> Raw {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let req = MpaFrame {
            kind: MpaKind::Request,
            markers: false,
            crc: o.crc,
            reject: false,
            revision: 2,
            v2: Some(MpaV2 {
                ird: o.ird,
                ord: o.ord,
                peer_to_peer: o.p2p.is_some(),
                rtr_write: o.p2p.is_some_and(|p| p.0),
                rtr_read: o.p2p.is_some_and(|p| p.1),
                ..Default::default()
            }),
            private_data: if o.ext {
                let mut pd = mpa::ext::encode(o.ext_flags).to_vec();
                pd.extend_from_slice(b"bad input");
                pd
            } else {
                b"bad input".to_vec()
            },
        };
        s.write_all(&req.encode().unwrap()).unwrap();
        let rep = read_mpa_frame(&mut s);
        if o.ext {
            let (flags, _) = mpa::ext::strip(&rep.private_data);
            assert_eq!(
                flags,
                Some(o.ext_flags),
                "the engine agrees to the extensions"
            );
        }
        assert_eq!(rep.kind, MpaKind::Reply);
        assert!(!rep.reject && !rep.markers, "{rep:?}");
        assert_eq!(rep.revision, 2);
        assert_eq!(rep.crc, o.crc, "the reply mirrors the C bit");
        assert!(
            rep.v2.is_some(),
            "an enhanced request gets an enhanced reply"
        );
        Raw::from_stream(s, o.crc)
    }

    /// Passive side: reads the engine's MPA Request and accepts it.
    fn accept(l: &TcpListener, o: RawOpts) -> Raw {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let req = read_mpa_frame(&mut s);
        assert_eq!(req.kind, MpaKind::Request);
        let crc = o.reply_crc.unwrap_or(req.crc || o.crc);
        let (revision, enhanced) = o.reply.unwrap_or((req.revision, true));
        let rep = MpaFrame {
            kind: MpaKind::Reply,
            markers: false,
            crc,
            reject: false,
            revision,
            v2: req.v2.filter(|_| enhanced).map(|_| MpaV2 {
                ird: o.ird,
                ord: o.ord,
                peer_to_peer: o.p2p.is_some(),
                rtr_write: o.p2p.is_some_and(|p| p.0),
                rtr_read: o.p2p.is_some_and(|p| p.1),
                ..Default::default()
            }),
            private_data: Vec::new(),
        };
        s.write_all(&rep.encode().unwrap()).unwrap();
        // CRC when either side asked (RFC 5044 section 7.1.2).
        Raw::from_stream(s, crc || req.crc)
    }

    /// Limits the receive buffer (so that the engine's socket fills up).
    fn set_rcvbuf(&self, bytes: i32) {
        // SAFETY: a valid socket and a pointer to an i32 of the given size.
        let r = unsafe {
            libc::setsockopt(
                self.s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &bytes as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "setsockopt(SO_RCVBUF)");
    }

    fn fpdu(&self, ulpdu: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        mpa::encode_fpdu(ulpdu, self.crc, &mut v);
        v
    }

    fn send_bytes(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("raw peer write");
    }

    /// Writes bytes the engine may stop reading half way (it terminates
    /// first): errors from a closed connection are expected.
    fn send_bytes_lossy(&mut self, b: &[u8]) {
        let _ = self.s.write_all(b);
    }

    fn send_fpdu(&mut self, u: &[u8]) {
        let f = self.fpdu(u);
        self.send_bytes(&f);
    }

    /// A whole Send-type message (one segment) on queue 0.
    fn send_ulpdu(&mut self, opcode: Opcode, inval_stag: u32, payload: &[u8]) -> Vec<u8> {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode,
            inval_stag,
            qn: ddp::QN_SEND,
            msn: self.send_msn,
            mo: 0,
        });
        self.send_msn += 1;
        ulpdu(h, payload)
    }

    fn write_ulpdu(&self, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
        let h = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::Write,
            stag,
            to,
        });
        ulpdu(h, payload)
    }

    /// An Atomic Request on queue 1 (RFC 7306), taking the next queue-1 MSN.
    fn atomic_request_ulpdu(&mut self, ar: &AtomicRequest) -> Vec<u8> {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::AtomicRequest,
            inval_stag: 0,
            qn: ddp::QN_READ_REQUEST,
            msn: self.rr_msn,
            mo: 0,
        });
        self.rr_msn += 1;
        let mut b = [0u8; AtomicRequest::LEN];
        ar.encode(&mut b);
        ulpdu(h, &b)
    }

    /// An untagged RFC 7306 message on `qn` with MSN `msn` and `body`.
    fn rfc7306_ulpdu(&self, opcode: Opcode, qn: u32, msn: u32, body: &[u8]) -> Vec<u8> {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode,
            inval_stag: 0,
            qn,
            msn,
            mo: 0,
        });
        ulpdu(h, body)
    }

    fn read_request_ulpdu(&mut self, rr: &ReadRequest) -> Vec<u8> {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::ReadRequest,
            inval_stag: 0,
            qn: ddp::QN_READ_REQUEST,
            msn: self.rr_msn,
            mo: 0,
        });
        self.rr_msn += 1;
        let mut body = [0u8; ReadRequest::LEN];
        rr.encode(&mut body);
        ulpdu(h, &body)
    }

    /// Reads more bytes; 0 at end of stream (a reset counts as the end).
    fn fill(&mut self) -> usize {
        let mut b = vec![0u8; 1 << 16];
        loop {
            match self.s.read(&mut b) {
                Ok(n) => {
                    self.inbuf.extend_from_slice(&b[..n]);
                    return n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return 0,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!(
                        "raw peer: the engine sent nothing and kept the connection open for {T:?}"
                    )
                }
                Err(e) => panic!("raw peer read: {e}"),
            }
        }
    }

    fn next(&mut self) -> Next {
        loop {
            if self.inbuf.len() >= 2 {
                let len = u16::from_be_bytes([self.inbuf[0], self.inbuf[1]]) as usize;
                if self.inbuf.len() >= mpa::fpdu_len(len) {
                    let (u, n) = mpa::decode_fpdu(&self.inbuf, self.crc)
                        .expect("the engine's FPDU (CRC checked when negotiated)");
                    let u = u.to_vec();
                    self.inbuf.drain(..n);
                    return Next::Fpdu(u);
                }
            }
            if self.fill() == 0 {
                return Next::End {
                    tail: self.inbuf.len(),
                };
            }
        }
    }

    /// The next FPDU, or None at the end of the stream on an FPDU boundary.
    fn read_fpdu(&mut self) -> Option<Vec<u8>> {
        match self.next() {
            Next::Fpdu(u) => Some(u),
            Next::End { tail: 0 } => None,
            Next::End { tail } => panic!("stream ended {tail} bytes into an FPDU"),
        }
    }

    /// The engine closed the connection, sending nothing more.
    fn expect_closed(&mut self) {
        if let Some(u) = self.read_fpdu() {
            panic!(
                "expected the end of the stream, got {:?}",
                DdpHeader::decode(&u)
            );
        }
    }

    /// The next FPDU must be a Terminate (RFC 5040 section 4.8: untagged,
    /// queue 2, MSN 1, MO 0, last), and the stream must end after it.
    fn expect_terminate(&mut self) -> Terminate {
        let u = self
            .read_fpdu()
            .expect("a Terminate, not the end of the stream");
        match DdpHeader::decode(&u).expect("a valid DDP header") {
            DdpHeader::Untagged(h) => {
                assert_eq!(h.opcode, Opcode::Terminate, "{h:?}");
                assert_eq!((h.qn, h.msn, h.mo, h.last), (ddp::QN_TERMINATE, 1, 0, true));
            }
            h => panic!("{h:?} where a Terminate was due"),
        }
        let t = Terminate::decode(&u[ddp::UNTAGGED_LEN..]).expect("a valid Terminate");
        self.expect_closed();
        t
    }
}

// ------------------------------------------------------------ engine side

fn device() -> Device {
    Device::open(DeviceConfig {
        publish: false,
        ..Default::default()
    })
    .unwrap()
}

/// The engine as the passive side: a device and a listener on it.
struct Server {
    dev: Device,
    l: Listener,
}

impl Server {
    fn new() -> Server {
        let dev = device();
        let l = dev.listen("127.0.0.1:0").unwrap();
        Server { dev, l }
    }

    fn addr(&self) -> SocketAddr {
        self.l.local_addr().unwrap()
    }

    /// A fresh QP (in its own PD) accepting a raw peer that connects with `o`.
    fn accept_raw(&self, params: &ConnParams, o: RawOpts) -> (Side, Raw) {
        let s = side(&self.dev, QpCaps::default());
        let addr = self.addr();
        let raw = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let req = self.l.get_request().unwrap();
                req.accept(&s.qp, params).unwrap();
            });
            let raw = Raw::connect(addr, o);
            h.join().unwrap();
            raw
        });
        assert_eq!(s.qp.state(), QpState::Rts);
        (s, raw)
    }

    fn accept_default(&self) -> (Side, Raw) {
        self.accept_raw(&ConnParams::default(), RawOpts::default())
    }

    /// The device and its listener still work: a good engine client on the
    /// same device connects, a fresh QP accepts, one Send moves.
    fn prove_usable(&self) {
        let s = side(&self.dev, QpCaps::default());
        let c = side(&self.dev, QpCaps::default());
        let addr = self.addr();
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let req = self.l.get_request().unwrap();
                req.accept(&s.qp, &ConnParams::default()).unwrap();
            });
            c.qp.connect(addr, &ConnParams::default()).unwrap();
            h.join().unwrap();
        });
        send_one(&c, &s);
    }
}

/// The engine as the active side: a fresh QP on `dev` connects to a raw
/// listener.
fn connect_raw(dev: &Device, params: &ConnParams, o: RawOpts) -> (Side, Raw) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = side(dev, QpCaps::default());
    let raw = std::thread::scope(|sc| {
        let h = sc.spawn(|| c.qp.connect(addr, params).unwrap());
        let raw = Raw::accept(&l, o);
        h.join().unwrap();
        raw
    });
    assert_eq!(c.qp.state(), QpState::Rts);
    (c, raw)
}

/// One good Send from `c` to `s`.
fn send_one(c: &Side, s: &Side) {
    let data = common::pattern(64, 0x33);
    let r = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(77, &[r.sge_all()])).unwrap();
    let m = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    m.write_at(0, &data);
    c.qp.post_send(&SendWr::send(78, &[m.sge_all()])).unwrap();
    let wc = common::wait(&c.cq);
    assert_eq!((wc.wr_id, wc.status), (78, WcStatus::Success));
    let wc = common::wait(&s.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (77, WcStatus::Success, 64)
    );
    assert_eq!(r.to_vec(), data);
}

/// Collects exactly the completions `want` (wr_id -> status), in any
/// order, and checks that no other one is queued.
fn expect_wcs(cq: &CompletionQueue, want: &[(u64, WcStatus)]) {
    let mut got = BTreeMap::new();
    for _ in 0..want.len() {
        let wc = cq.wait_one(T).expect("a completion within 10 s");
        assert!(
            got.insert(wc.wr_id, wc.status).is_none(),
            "two completions for WR {}",
            wc.wr_id
        );
    }
    let want: BTreeMap<u64, WcStatus> = want.iter().copied().collect();
    assert_eq!(got, want);
    assert_eq!(cq.poll_one(), None, "an unexpected extra completion");
}

/// Waits for the async event `Terminated` of `qpn`, sent by the engine.
fn expect_term_event(dev: &Device, qpn: Qpn, code: TermCode) {
    let deadline = Instant::now() + T;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match dev.next_event(left).expect("a Terminated event") {
            AsyncEvent::Terminated {
                qpn: q,
                code: c,
                by_peer,
            } if q == qpn => {
                assert!(!by_peer, "the engine sent the Terminate");
                assert_eq!(c, code, "Terminate code in the event: {c}");
                return;
            }
            _ => {}
        }
    }
}

/// The engine's QP went to ERROR because of a Terminate it sent with
/// `code`, and completed the given WRs.
fn expect_engine_terminated(s: &Side, code: TermCode, wcs: &[(u64, WcStatus)]) {
    assert!(s.qp.wait_state(QpState::Error, T), "QP in ERROR");
    expect_wcs(&s.cq, wcs);
    expect_term_event(&s.dev, s.qp.qp_num(), code);
}

// ------------------------------------------------------------ guarded memory

const GUARD: usize = 512;
const GUARD_BYTE: u8 = 0xA5;
/// What the raw peer tries to place.
const EVIL: u8 = 0xEE;

/// A buffer of `len` bytes (filled with `fill`) between two guard zones.
/// It is freed when dropped; the regions registered over it borrow it
/// ([`GuardedMr`]), so none can outlive it, and deregistration waits for
/// any placement in flight (`register_raw`'s contract).
struct Guarded {
    base: *mut u8,
    total: usize,
    len: usize,
    fill: u8,
}

/// A region over the middle of a [`Guarded`] buffer, which it borrows.
struct GuardedMr<'a> {
    mr: MemoryRegion,
    _buf: std::marker::PhantomData<&'a Guarded>,
}

impl std::ops::Deref for GuardedMr<'_> {
    type Target = MemoryRegion;
    fn deref(&self) -> &MemoryRegion {
        &self.mr
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: `base` came from Box::into_raw of a boxed slice of
        // `total` bytes and is freed once; every region over it borrowed
        // `self` and is gone, and its drop waited until the engine stopped
        // placing into it.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, self.total)) });
    }
}

impl Guarded {
    fn new(len: usize, fill: u8) -> Guarded {
        let mut v = vec![GUARD_BYTE; GUARD + len + GUARD];
        v[GUARD..GUARD + len].fill(fill);
        let total = v.len();
        let base = Box::into_raw(v.into_boxed_slice()) as *mut u8;
        Guarded {
            base,
            total,
            len,
            fill,
        }
    }

    /// Registers the middle part (not the guards).
    fn register(&self, pd: &ProtectionDomain, access: Access, opts: RegOptions) -> GuardedMr<'_> {
        // SAFETY: the range lies inside the allocation, which the returned
        // region borrows (so it is freed only after the region is dropped)
        // and that nothing else in the test writes while it is registered.
        let mr = unsafe { pd.register_raw(self.base.add(GUARD), self.len, access, opts) }.unwrap();
        GuardedMr {
            mr,
            _buf: std::marker::PhantomData,
        }
    }

    /// Guards, region, guards.
    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; GUARD + self.len + GUARD];
        // SAFETY: the whole allocation is readable; it is only read once
        // the QP that could place into it is in ERROR.
        unsafe { std::ptr::copy_nonoverlapping(self.base, v.as_mut_ptr(), v.len()) };
        v
    }

    fn assert_guards(&self, what: &str) {
        let b = self.bytes();
        let bad = b[..GUARD]
            .iter()
            .chain(&b[GUARD + self.len..])
            .filter(|&&x| x != GUARD_BYTE)
            .count();
        assert_eq!(
            bad, 0,
            "{what}: {bad} guard bytes outside the region changed"
        );
    }

    /// Guards intact and region bytes `[from, to)` unchanged.
    fn assert_unchanged(&self, from: usize, to: usize, what: &str) {
        self.assert_guards(what);
        let b = self.bytes();
        let bad = b[GUARD + from..GUARD + to]
            .iter()
            .filter(|&&x| x != self.fill)
            .count();
        assert_eq!(bad, 0, "{what}: {bad} bytes of the refused region changed");
    }

    fn assert_untouched(&self, what: &str) {
        self.assert_unchanged(0, self.len, what);
    }
}

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// Receives 1 and 2 posted into the two halves of a guarded region (a
/// `Guarded::new(len, 0x5A)`).
fn guarded_recvs<'a>(s: &Side, g: &'a Guarded) -> GuardedMr<'a> {
    let len = g.len;
    let mr = g.register(&s.pd, Access::LOCAL_WRITE, RegOptions::default());
    s.qp.post_recv(&RecvWr::new(1, &[mr.sge(0, len / 2)]))
        .unwrap();
    s.qp.post_recv(&RecvWr::new(2, &[mr.sge(len / 2, len / 2)]))
        .unwrap();
    mr
}

const FLUSHED: [(u64, WcStatus); 2] = [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)];

// ------------------------------------------------------------ the cases

/// (1) Garbage instead of an FPDU after the handshake. See the module
/// comment for the rule: the bytes are parsed as an FPDU and the first
/// failing check decides the Terminate.
#[test]
fn garbage_instead_of_fpdu_after_handshake() {
    let srv = Server::new();
    let short_ulpdu = {
        // An FPDU whose 4-byte ULPDU cannot hold the 18-byte untagged DDP
        // header its first byte announces.
        let mut v = Vec::new();
        mpa::encode_fpdu(&[0x41, 0x43, 0, 0], false, &mut v);
        v
    };
    let cases: [(&str, Vec<u8>, TermCode); 3] = [
        // 'G' 'E' = ULPDU length 0x4745, then 'T' = 0x54: untagged, DDP
        // version 0.
        (
            "an HTTP request",
            b"GET / HTTP/1.1\r\nHost: softrdma\r\n\r\n".to_vec(),
            codes::DDP_UNTAGGED_INVALID_VERSION,
        ),
        // Length 0xFFFF, control byte 0xFF: tagged, DDP version 3.
        (
            "0xFF bytes",
            vec![0xFF; 64],
            codes::DDP_TAGGED_INVALID_VERSION,
        ),
        (
            "a ULPDU shorter than its DDP header",
            short_ulpdu,
            codes::RDMAP_CATASTROPHIC_STREAM,
        ),
    ];
    for (what, bytes, want) in cases {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(256, 0x5A);
        let _mr = guarded_recvs(&s, &g);
        raw.send_bytes_lossy(&bytes);
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{what}: got {}", t.code);
        expect_engine_terminated(&s, want, &FLUSHED);
        g.assert_untouched(what);
    }
    srv.prove_usable();
}

/// (1b) Garbage where the MPA Request is due: no FPDU framing exists yet,
/// so the listener just closes the connection (no Reply, no Terminate) and
/// goes on serving good connection requests.
#[test]
fn garbage_instead_of_mpa_request_closes() {
    let srv = Server::new();
    let s = side(&srv.dev, QpCaps::default());
    let c = side(&srv.dev, QpCaps::default());
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            // Skips the garbage connection, returns the good one.
            let req = srv.l.get_request().unwrap();
            req.accept(&s.qp, &ConnParams::default()).unwrap();
        });
        let mut bad = TcpStream::connect(srv.addr()).unwrap();
        bad.set_read_timeout(Some(T)).unwrap();
        bad.write_all(&[0x17; 64]).unwrap();
        let mut buf = [0u8; 64];
        let outcome = bad.read(&mut buf);
        // Connect the good client before judging, so that the listener
        // thread always returns.
        c.qp.connect(srv.addr(), &ConnParams::default()).unwrap();
        h.join().unwrap();
        match outcome {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Ok(n) => panic!("the listener answered garbage with {n} bytes"),
            Err(e) => panic!("the listener did not close the connection: {e}"),
        }
    });
    send_one(&c, &s);
}

/// (2) Oversized ULPDU lengths.
///
/// MPA negotiates no MULPDU with the receiver: the MULPDU is the sender's
/// own limit (RFC 5044), the 16-bit ULPDU_Length allows 65535 and Linux siw
/// accepts any length, as this engine does. What is oversized is the DDP
/// message for the buffer it lands in: a Send larger than the posted
/// receive is answered as siw answers it (`siw_send_check_ntoh`, "receive
/// space short": 1/2/0x02, no buffer; RFC 5041 section 7.2 would also
/// allow 0x05, "DDP message too long"), the receive completing with a
/// length error; a Read Request longer than the 28-byte Read Request that
/// queue 1 holds is "too long" (RFC 5040 section 4.4, 1/2/0x05).
#[test]
fn oversized_ulpdu_length() {
    let srv = Server::new();

    // A Send in the largest FPDU MPA can frame, into a 64-byte receive.
    let (s, mut raw) = srv.accept_default();
    let g = Guarded::new(128, 0x5A);
    let _mr = guarded_recvs(&s, &g);
    let u = raw.send_ulpdu(Opcode::Send, 0, &vec![EVIL; 0xFFFF - ddp::UNTAGGED_LEN]);
    assert_eq!(u.len(), 0xFFFF);
    let f = raw.fpdu(&u);
    raw.send_bytes_lossy(&f);
    let t = raw.expect_terminate();
    assert_eq!(t.code, codes::DDP_UNTAGGED_NO_BUFFER, "got {}", t.code);
    assert_eq!(t.ddp_header.as_deref(), Some(&u[..ddp::UNTAGGED_LEN]));
    // The receive it was for fails with a length error, the other is
    // flushed; nothing was placed.
    expect_engine_terminated(
        &s,
        codes::DDP_UNTAGGED_NO_BUFFER,
        &[(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)],
    );
    g.assert_untouched("Send longer than the receive");

    // A Read Request with 4 bytes after its 28-byte body: refused before
    // any Read Response goes out.
    let (s, mut raw) = srv.accept_default();
    let g = Guarded::new(128, 0x5A);
    let _rmr = guarded_recvs(&s, &g);
    let src = Guarded::new(4096, 0x77);
    let mr = src.register(&s.pd, RW, RegOptions::default());
    let mut u = raw.read_request_ulpdu(&ReadRequest {
        sink_stag: 0x0000_4200,
        sink_to: 0,
        size: 16,
        src_stag: mr.rkey().raw(),
        src_to: mr.addr(),
    });
    u.extend_from_slice(&[EVIL; 4]);
    raw.send_fpdu(&u);
    let t = raw.expect_terminate();
    assert_eq!(t.code, codes::DDP_UNTAGGED_TOO_LONG, "got {}", t.code);
    expect_engine_terminated(&s, codes::DDP_UNTAGGED_TOO_LONG, &FLUSHED);
    g.assert_untouched("Read Request with trailing bytes");
    src.assert_untouched("Read Request with trailing bytes");

    srv.prove_usable();
}

/// (3) RDMAP opcodes outside RFC 5040's 0..=7 (0xA is RFC 7306's Atomic
/// Request, never negotiated here), and a Send carried in a tagged segment:
/// remote operation error, unexpected opcode (RFC 5040 Figure 9, 0/2/0x06).
#[test]
fn unknown_rdmap_opcode() {
    let srv = Server::new();
    let mut cases: Vec<(String, Vec<u8>)> = [0x8u8, 0xA, 0xC, 0xF]
        .iter()
        .map(|&op| {
            // Untagged, last, DDP version 1; RDMAP version 1 and `op`;
            // QN 0, MSN 1, MO 0; then a 28-byte body.
            let mut u = vec![0u8; ddp::UNTAGGED_LEN];
            u[0] = ddp::DDP_LAST | ddp::DDP_VERSION;
            u[1] = (ddp::RDMAP_VERSION << 6) | op;
            u[13] = 1;
            u.extend_from_slice(&[EVIL; 28]);
            (format!("opcode {op:#x}"), u)
        })
        .collect();
    // Tagged, last, version 1, with the Send opcode; STag 0x100, TO 0.
    let mut tagged_send = vec![0xC1, 0x43, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    tagged_send.extend_from_slice(&[EVIL; 16]);
    cases.push(("a Send in a tagged segment".into(), tagged_send));
    for (what, u) in cases {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(128, 0x5A);
        let _mr = guarded_recvs(&s, &g);
        raw.send_fpdu(&u);
        let t = raw.expect_terminate();
        assert_eq!(
            t.code,
            codes::RDMAP_UNEXPECTED_OPCODE,
            "{what}: got {}",
            t.code
        );
        expect_engine_terminated(&s, codes::RDMAP_UNEXPECTED_OPCODE, &FLUSHED);
        g.assert_untouched(&what);
    }
    srv.prove_usable();
}

/// Sends an RDMA Write of 32 bytes to `stag`/`to` and expects the Terminate
/// `want` echoing the Write's DDP header.
fn refused_write(raw: &mut Raw, stag: u32, to: u64, want: TermCode, what: &str) {
    let u = raw.write_ulpdu(stag, to, &[EVIL; 32]);
    raw.send_fpdu(&u);
    let t = raw.expect_terminate();
    assert_eq!(t.code, want, "{what}: got {}", t.code);
    assert_eq!(
        t.ddp_header.as_deref(),
        Some(&u[..ddp::TAGGED_LEN]),
        "{what}: the Terminate carries the Write's DDP header"
    );
}

/// Sends a Read Request and expects the Terminate `want` (and no Read
/// Response before it), echoing the request's DDP and RDMAP headers.
fn refused_read(raw: &mut Raw, rr: &ReadRequest, want: TermCode, what: &str) {
    let u = raw.read_request_ulpdu(rr);
    raw.send_fpdu(&u);
    let t = raw.expect_terminate();
    assert_eq!(t.code, want, "{what}: got {}", t.code);
    assert_eq!(t.ddp_header.as_deref(), Some(&u[..ddp::UNTAGGED_LEN]));
    assert_eq!(
        t.parsed_rdmap_header()
            .expect("R: the Read Request is attached"),
        Ok(*rr),
        "{what}"
    );
}

/// (4) An RDMA Write to an STag that was never registered, to a registered
/// STag's index under another key, and to STag 0: DDP tagged buffer error,
/// invalid STag (RFC 5041 section 7.2, 1/1/0x00).
#[test]
fn write_to_invalid_stag() {
    let srv = Server::new();
    for (what, stag) in [
        ("an unregistered STag", None),
        ("a registered index with the wrong key", Some(0xFFu32)),
        ("STag 0", Some(0)),
    ] {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(128, 0x5A);
        let _rmr = guarded_recvs(&s, &g);
        let target = Guarded::new(4096, 0x77);
        let mr = target.register(
            &s.pd,
            RW,
            RegOptions {
                key: Some(0x5A),
                ..Default::default()
            },
        );
        let stag = match stag {
            None => 0x00FF_FE00 | 0x11,
            Some(0) => 0,
            Some(x) => mr.rkey().raw() ^ x,
        };
        refused_write(
            &mut raw,
            stag,
            mr.addr(),
            codes::DDP_TAGGED_INVALID_STAG,
            what,
        );
        expect_engine_terminated(&s, codes::DDP_TAGGED_INVALID_STAG, &FLUSHED);
        target.assert_untouched(what);
        g.assert_untouched(what);
    }
    srv.prove_usable();
}

/// (5) An RDMA Write to an STag that is no longer valid: invalidated by the
/// peer's Send with Invalidate, by a local invalidate, or deregistered.
/// DDP tagged buffer error, invalid STag (RFC 5041 section 7.2, 1/1/0x00).
#[test]
fn write_to_invalidated_stag() {
    let srv = Server::new();
    for how in ["Send with Invalidate", "local invalidate", "deregistration"] {
        let (s, mut raw) = srv.accept_default();
        let target = Guarded::new(4096, 0x77);
        let mr = target.register(
            &s.pd,
            RW,
            RegOptions {
                key: Some(0x42),
                invalidatable: true,
                ..Default::default()
            },
        );
        let rbuf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(1, &[rbuf.sge(0, 32)])).unwrap();
        s.qp.post_recv(&RecvWr::new(2, &[rbuf.sge(32, 32)]))
            .unwrap();
        let stag = mr.rkey();
        let addr = mr.addr();
        let mut keep = Some(mr);
        match how {
            "Send with Invalidate" => {
                let u = raw.send_ulpdu(Opcode::SendInvalidate, stag.raw(), b"done with it");
                raw.send_fpdu(&u);
                let wc = common::wait(&s.cq);
                assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
                assert_eq!(wc.invalidated_rkey, Some(stag));
            }
            "local invalidate" => {
                s.qp.post_send(&SendWr::local_inv(9, stag)).unwrap();
                let wc = common::wait(&s.cq);
                assert_eq!(
                    (wc.wr_id, wc.status, wc.opcode),
                    (9, WcStatus::Success, WcOpcode::LocalInv)
                );
            }
            _ => keep = None,
        }
        if let Some(mr) = &keep {
            assert!(!mr.is_valid());
        }
        refused_write(
            &mut raw,
            stag.raw(),
            addr,
            codes::DDP_TAGGED_INVALID_STAG,
            how,
        );
        let wcs: &[(u64, WcStatus)] = if how == "Send with Invalidate" {
            &[(2, WcStatus::WrFlushErr)]
        } else {
            &FLUSHED
        };
        expect_engine_terminated(&s, codes::DDP_TAGGED_INVALID_STAG, wcs);
        target.assert_untouched(how);
    }
    srv.prove_usable();
}

/// (6) Tagged offsets outside the region. RDMA Write: DDP tagged buffer
/// errors (RFC 5041 section 7.2): base or bounds violation (1/1/0x01), or
/// TO wrap (1/1/0x03) when TO + length passes 2^64. RDMA Read Request whose
/// source range is outside: RDMAP remote protection errors (RFC 5040
/// Figure 9): base or bounds violation (0/1/0x01), TO wrap (0/1/0x04).
/// Nothing is placed, not even the part of a Write that is in bounds, and
/// no Read Response goes out.
#[test]
fn tagged_offset_outside_region() {
    const LEN: usize = 4096;
    let srv = Server::new();
    type Case = (&'static str, fn(u64) -> (u64, u32), bool, TermCode);
    let cases: [Case; 6] = [
        (
            "Write past the end",
            |a| (a + LEN as u64 - 8, 32),
            false,
            codes::DDP_TAGGED_BASE_BOUNDS,
        ),
        (
            "Write before the start",
            |a| (a - 8, 32),
            false,
            codes::DDP_TAGGED_BASE_BOUNDS,
        ),
        (
            "Write just after the end",
            |a| (a + LEN as u64, 32),
            false,
            codes::DDP_TAGGED_BASE_BOUNDS,
        ),
        (
            "Write wrapping 2^64",
            |_| (u64::MAX - 7, 32),
            false,
            codes::DDP_TAGGED_TO_WRAP,
        ),
        (
            "Read past the end",
            |a| (a + 4000, 200),
            true,
            codes::RDMAP_BASE_BOUNDS,
        ),
        (
            "Read wrapping 2^64",
            |_| (u64::MAX - 15, 64),
            true,
            codes::RDMAP_TO_WRAP,
        ),
    ];
    for (what, range, read, want) in cases {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(128, 0x5A);
        let _rmr = guarded_recvs(&s, &g);
        let target = Guarded::new(LEN, 0x77);
        let mr = target.register(&s.pd, RW, RegOptions::default());
        let (to, len) = range(mr.addr());
        if read {
            let rr = ReadRequest {
                sink_stag: 0x0000_4200,
                sink_to: 0,
                size: len,
                src_stag: mr.rkey().raw(),
                src_to: to,
            };
            refused_read(&mut raw, &rr, want, what);
        } else {
            let u = raw.write_ulpdu(mr.rkey().raw(), to, &vec![EVIL; len as usize]);
            raw.send_fpdu(&u);
            let t = raw.expect_terminate();
            assert_eq!(t.code, want, "{what}: got {}", t.code);
            assert_eq!(t.ddp_header.as_deref(), Some(&u[..ddp::TAGGED_LEN]));
        }
        expect_engine_terminated(&s, want, &FLUSHED);
        target.assert_untouched(what);
        g.assert_untouched(what);
    }
    srv.prove_usable();
}

/// (7) An STag registered in another protection domain of the same device
/// than the QP's. Write: DDP tagged buffer error, STag not associated with
/// the DDP stream (RFC 5041 section 7.2, 1/1/0x02). Read Request: RDMAP
/// remote protection error, STag not associated with the RDMAP stream
/// (RFC 5040 Figure 9, 0/1/0x03).
#[test]
fn wrong_protection_domain() {
    let srv = Server::new();
    let other_pd = srv.dev.alloc_pd().unwrap();
    for read in [false, true] {
        let (s, mut raw) = srv.accept_default();
        assert_ne!(s.pd.id(), other_pd.id());
        let g = Guarded::new(128, 0x5A);
        let _rmr = guarded_recvs(&s, &g);
        let target = Guarded::new(4096, 0x77);
        let mr = target.register(&other_pd, RW, RegOptions::default());
        let want = if read {
            let rr = ReadRequest {
                sink_stag: 0x0000_4200,
                sink_to: 0,
                size: 64,
                src_stag: mr.rkey().raw(),
                src_to: mr.addr(),
            };
            refused_read(&mut raw, &rr, codes::RDMAP_STAG_NOT_ASSOC, "Read, other PD");
            codes::RDMAP_STAG_NOT_ASSOC
        } else {
            refused_write(
                &mut raw,
                mr.rkey().raw(),
                mr.addr(),
                codes::DDP_TAGGED_STAG_NOT_ASSOC,
                "Write, other PD",
            );
            codes::DDP_TAGGED_STAG_NOT_ASSOC
        };
        expect_engine_terminated(&s, want, &FLUSHED);
        target.assert_untouched("other PD");
        g.assert_untouched("other PD");
    }
    srv.prove_usable();
}

/// (8) More RDMA Read Requests than the IRD negotiated (1): RDMAP remote
/// operation error, catastrophic error localized to the RDMAP stream
/// (0/2/0x07, as Linux siw). The first request's 16 MiB response is stuck
/// behind the peer's small receive window, so the second one overflows the
/// IRD; the Terminate cannot cut into the response in progress (module
/// comment), so the peer reads a correct prefix of the response and then
/// the end of the stream, never a Terminate or a byte from outside the
/// source range.
#[test]
fn read_requests_beyond_ird() {
    const SRC: usize = 16 << 20;
    let srv = Server::new();
    let params = ConnParams {
        ird: 1,
        ord: 1,
        ..Default::default()
    };
    let (s, mut raw) = srv.accept_raw(
        &params,
        RawOpts {
            ird: 1,
            ord: 1,
            ..Default::default()
        },
    );
    assert_eq!(s.qp.conn_params().unwrap().ird, 1, "IRD negotiated to 1");
    raw.set_rcvbuf(64 << 10);
    let _g = Guarded::new(128, 0x5A);
    let _rmr = guarded_recvs(&s, &_g);
    let src = s.pd.alloc_mr(SRC, RW).unwrap();
    let data = common::pattern(SRC, 7);
    src.write_at(0, &data);
    let sink_stag = 0x0012_3400;
    let rr1 = ReadRequest {
        sink_stag,
        sink_to: 0,
        size: SRC as u32,
        src_stag: src.rkey().raw(),
        src_to: src.addr(),
    };
    let rr2 = ReadRequest {
        sink_to: SRC as u64,
        size: 16,
        ..rr1
    };
    let u1 = raw.read_request_ulpdu(&rr1);
    let u2 = raw.read_request_ulpdu(&rr2);
    let mut both = raw.fpdu(&u1);
    both.extend(raw.fpdu(&u2));
    raw.send_bytes(&both);

    expect_engine_terminated(&s, codes::RDMAP_CATASTROPHIC_STREAM, &FLUSHED);

    // Whole FPDUs of the response, then the end of the stream (possibly
    // inside an FPDU: the rest of the engine's batch is dropped).
    let mut got = 0usize;
    while let Next::Fpdu(u) = raw.next() {
        match DdpHeader::decode(&u).expect("valid DDP header") {
            DdpHeader::Tagged(h) if h.opcode == Opcode::ReadResponse => {
                assert_eq!((h.stag, h.to), (sink_stag, got as u64));
                let p = &u[ddp::TAGGED_LEN..];
                assert!(got + p.len() < SRC, "the whole response went out");
                assert!(p == &data[got..got + p.len()], "response bytes at {got}");
                assert!(!h.last);
                got += p.len();
            }
            h => panic!("{h:?} after {got} response bytes: only the response may precede the end"),
        }
    }
    assert!(got > 0, "the first Read was being answered");
    srv.prove_usable();
}

/// (9) The peer closes the connection inside an FPDU (in the DDP header,
/// in the payload, in the CRC field), with a half-close or a full close.
/// The connection is lost (RFC 5044 section 8, 2/0/0x01, reported locally):
/// no Terminate, the QP goes to ERROR, the outstanding RDMA Read completes
/// with the connection-lost status, the receives are flushed.
#[test]
fn peer_closes_mid_frame() {
    let dev = device();
    type Cut = fn(usize) -> usize;
    let cases: [(&str, Cut, bool); 3] = [
        ("in the DDP header", |_| 2 + 9, true),
        ("in the payload", |_| 2 + ddp::UNTAGGED_LEN + 10, false),
        ("in the CRC field", |n| n - 2, true),
    ];
    for (what, cut, half_close) in cases {
        let (c, mut raw) = connect_raw(&dev, &ConnParams::default(), RawOpts::default());
        let g = Guarded::new(128, 0x5A);
        let _mr = guarded_recvs(&c, &g);
        let sink = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        c.qp.post_send(&SendWr::read(
            3,
            sink.sge_all(),
            0x1000,
            Rkey::from_raw(0x0000_4200),
        ))
        .unwrap();
        let u = raw.read_fpdu().expect("the Read Request");
        assert!(
            matches!(DdpHeader::decode(&u), Ok(DdpHeader::Untagged(h)) if h.opcode == Opcode::ReadRequest)
        );
        let u = raw.send_ulpdu(Opcode::Send, 0, &[EVIL; 40]);
        let f = raw.fpdu(&u);
        raw.send_bytes(&f[..cut(f.len())]);
        let mut open = if half_close {
            raw.s.shutdown(Shutdown::Write).unwrap();
            Some(raw)
        } else {
            drop(raw);
            None
        };
        assert!(c.qp.wait_state(QpState::Error, T), "{what}: QP in ERROR");
        expect_wcs(
            &c.cq,
            &[
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::RetryExcErr),
            ],
        );
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match dev.next_event(left).expect("a Disconnected event") {
                AsyncEvent::Disconnected { qpn } if qpn == c.qp.qp_num() => break,
                AsyncEvent::Terminated { qpn, .. } if qpn == c.qp.qp_num() => {
                    panic!("{what}: a Terminate on a lost connection")
                }
                _ => {}
            }
        }
        if let Some(raw) = open.as_mut() {
            raw.expect_closed();
        }
        // Receive 1 may hold the part of the Send that arrived (DDP places
        // on arrival); receive 2's half and the guards are untouched.
        g.assert_unchanged(40, 128, what);
        assert_eq!(
            sink.to_vec(),
            vec![0; 64],
            "{what}: nothing placed in the Read sink"
        );
    }
    let (c, s) = common::pair_on(
        &dev,
        &dev,
        ConnParams::default(),
        ConnParams::default(),
        |_| {},
    );
    send_one(&c, &s);
}

/// (10) A bad MPA CRC when CRC was negotiated: MPA's "CRC error" (RFC 5044
/// section 8, LLP layer, 2/0/0x02), in a Terminate whose own CRC is right.
/// A good FPDU first proves the peer's CRCs are right otherwise. The
/// corrupted Send never completes successfully.
#[test]
fn bad_mpa_crc() {
    let dev = device();
    let params = ConnParams {
        crc: true,
        ..Default::default()
    };
    let (c, mut raw) = connect_raw(&dev, &params, RawOpts::default());
    assert!(c.qp.conn_params().unwrap().crc && raw.crc, "CRC negotiated");
    let g = Guarded::new(128, 0x5A);
    let mr = guarded_recvs(&c, &g);
    let good = common::pattern(16, 3);
    let u = raw.send_ulpdu(Opcode::Send, 0, &good);
    raw.send_fpdu(&u);
    let wc = common::wait(&c.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 16)
    );
    let mut got = vec![0; 16];
    mr.read_at(0, &mut got);
    assert_eq!(got, good);

    let u = raw.send_ulpdu(Opcode::Send, 0, &[EVIL; 24]);
    let mut f = raw.fpdu(&u);
    *f.last_mut().unwrap() ^= 0x01;
    raw.send_bytes(&f);
    let t = raw.expect_terminate();
    assert_eq!(t.code, codes::MPA_CRC, "got {}", t.code);
    assert!(c.qp.wait_state(QpState::Error, T));
    expect_wcs(&c.cq, &[(2, WcStatus::WrFlushErr)]);
    expect_term_event(&dev, c.qp.qp_num(), codes::MPA_CRC);
    // Receive 2 (bytes 64..) may hold the corrupted payload (placed before
    // the CRC could be checked) but was never completed.
    g.assert_unchanged(16, 64, "bad CRC");
    g.assert_unchanged(64 + 24, 128, "bad CRC");
    let (c2, s2) = common::pair_on(&dev, &dev, params.clone(), params, |_| {});
    send_one(&c2, &s2);
}

/// (11) A Write to a region registered without REMOTE_WRITE: DDP "invalid
/// STag", 1/1/0x00, as Linux siw answers it (RFC 5041 has no access-rights
/// code for tagged buffers; issue 20, item 8). A Read Request from a region
/// without REMOTE_READ: RDMAP remote protection error, access rights
/// violation (RFC 5040 Figure 9, 0/1/0x02).
#[test]
fn write_without_remote_write_access() {
    let srv = Server::new();
    for read in [false, true] {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(128, 0x5A);
        let _rmr = guarded_recvs(&s, &g);
        let target = Guarded::new(4096, 0x77);
        let access = if read {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE | Access::REMOTE_READ
        };
        let mr = target.register(&s.pd, access, RegOptions::default());
        if read {
            let rr = ReadRequest {
                sink_stag: 0x0000_4200,
                sink_to: 0,
                size: 64,
                src_stag: mr.rkey().raw(),
                src_to: mr.addr(),
            };
            refused_read(
                &mut raw,
                &rr,
                codes::RDMAP_ACCESS_RIGHTS,
                "Read without REMOTE_READ",
            );
        } else {
            // DDP has no code for missing rights: "invalid STag", as siw
            // (`siw_tagged_error`).
            refused_write(
                &mut raw,
                mr.rkey().raw(),
                mr.addr(),
                codes::DDP_TAGGED_INVALID_STAG,
                "Write without REMOTE_WRITE",
            );
        }
        let want = if read {
            codes::RDMAP_ACCESS_RIGHTS
        } else {
            codes::DDP_TAGGED_INVALID_STAG
        };
        expect_engine_terminated(&s, want, &FLUSHED);
        target.assert_untouched("access rights");
        g.assert_untouched("access rights");
    }
    srv.prove_usable();
}

// ------------------------------------------------------------ RFC 7306

fn ext_opts() -> RawOpts {
    RawOpts {
        ext: true,
        ..Default::default()
    }
}

fn fetch_add(stag: u32, to: u64) -> AtomicRequest {
    AtomicRequest {
        op: AtomicOp::FetchAdd,
        req_id: 1,
        stag,
        to,
        add_swap: 0x0101_0101_0101_0101,
        add_swap_mask: 0,
        compare: 0,
        compare_mask: 0,
    }
}

/// (13) Atomic Requests the responder must refuse (RFC 5040 Figure 9 codes,
/// as for RDMA Read's source): unknown STag, another PD's STag, no
/// remote-atomic right, outside the region, a tagged offset that is not a
/// naturally aligned 64-bit word (no code of its own in RFC 7306: remote
/// operation error, unspecified, 0/2/0xFF), and an operation code RFC 7306
/// does not define (unexpected opcode). The target is never touched.
#[test]
fn atomic_requests_refused() {
    let srv = Server::new();
    let all = Access::ALL;
    let no_atomic = RW;
    type Case = (
        &'static str,
        Access,
        fn(&MemoryRegion, &MemoryRegion) -> AtomicRequest,
        TermCode,
    );
    let cases: [Case; 7] = [
        (
            "invalid STag",
            all,
            |m, _| fetch_add(m.rkey().raw() ^ 0x5A, m.addr()),
            codes::RDMAP_INVALID_STAG,
        ),
        (
            "STag of another PD",
            all,
            |_, o| fetch_add(o.rkey().raw(), o.addr()),
            codes::RDMAP_STAG_NOT_ASSOC,
        ),
        (
            "no remote-atomic right",
            no_atomic,
            |m, _| fetch_add(m.rkey().raw(), m.addr()),
            codes::RDMAP_ACCESS_RIGHTS,
        ),
        (
            "past the end",
            all,
            |m, _| fetch_add(m.rkey().raw(), m.addr() + 64),
            codes::RDMAP_BASE_BOUNDS,
        ),
        (
            "straddling the end",
            all,
            |m, _| fetch_add(m.rkey().raw(), m.addr() + 60),
            codes::RDMAP_BASE_BOUNDS,
        ),
        (
            "misaligned",
            all,
            |m, _| fetch_add(m.rkey().raw(), m.addr() + 4),
            codes::RDMAP_OPERATION_UNSPECIFIED,
        ),
        (
            "atomic operation 7",
            all,
            |m, _| AtomicRequest {
                op: AtomicOp::FetchAdd,
                ..fetch_add(m.rkey().raw(), m.addr())
            },
            codes::RDMAP_UNEXPECTED_OPCODE,
        ),
    ];
    for (what, access, make, want) in cases {
        let (s, mut raw) = srv.accept_raw(&ConnParams::default(), ext_opts());
        assert!(s.qp.conn_params().unwrap().rfc7306);
        let g_rx = Guarded::new(128, 0x5A);
        let _rmr = guarded_recvs(&s, &g_rx);
        let g = Guarded::new(64, 0x3C);
        let target = g.register(&s.pd, access, RegOptions::default());
        let other_pd = s.dev.alloc_pd().unwrap();
        let g_other = Guarded::new(64, 0x3C);
        let other = g_other.register(&other_pd, Access::ALL, RegOptions::default());
        let ar = make(&target, &other);
        let mut u = raw.atomic_request_ulpdu(&ar);
        if what == "atomic operation 7" {
            // The operation word's low four bits.
            u[ddp::UNTAGGED_LEN + 3] = 7;
        }
        raw.send_fpdu(&u);
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{what}: got {}", t.code);
        assert_eq!(
            t.ddp_header.as_deref(),
            Some(&u[..ddp::UNTAGGED_LEN]),
            "{what}"
        );
        expect_engine_terminated(&s, want, &FLUSHED);
        g.assert_untouched(what);
        g_other.assert_untouched(what);
        g_rx.assert_untouched(what);
    }
    srv.prove_usable();
}

/// (14) Malformed RFC 7306 messages: an Atomic Request with bytes after its
/// body (too long for queue 1's buffer) or an MSN out of sequence; an
/// Atomic Response nobody asked for; Immediate Data shorter than its eight
/// bytes, longer, or with no receive posted.
#[test]
fn malformed_rfc7306_messages() {
    let srv = Server::new();
    for what in [
        "atomic request with trailing bytes",
        "atomic request MSN 5",
        "unsolicited atomic response",
        "immediate data of 4 bytes",
        "immediate data of 12 bytes",
        "immediate data with no receive",
    ] {
        let (s, mut raw) = srv.accept_raw(&ConnParams::default(), ext_opts());
        let g = Guarded::new(64, 0x3C);
        let target = g.register(&s.pd, Access::ALL, RegOptions::default());
        let no_recv = what.ends_with("no receive");
        let g_rx = Guarded::new(128, 0x5A);
        let _rmr = if no_recv {
            g_rx.register(&s.pd, Access::LOCAL_WRITE, RegOptions::default())
        } else {
            guarded_recvs(&s, &g_rx)
        };
        let (u, want) = match what {
            "atomic request with trailing bytes" => {
                let mut u =
                    raw.atomic_request_ulpdu(&fetch_add(target.rkey().raw(), target.addr()));
                u.extend_from_slice(&[EVIL; 4]);
                (u, codes::DDP_UNTAGGED_TOO_LONG)
            }
            "atomic request MSN 5" => {
                let mut b = [0u8; AtomicRequest::LEN];
                fetch_add(target.rkey().raw(), target.addr()).encode(&mut b);
                (
                    raw.rfc7306_ulpdu(Opcode::AtomicRequest, ddp::QN_READ_REQUEST, 5, &b),
                    codes::DDP_UNTAGGED_MSN_RANGE,
                )
            }
            "unsolicited atomic response" => {
                let mut b = [0u8; 12];
                b[11] = 1;
                (
                    raw.rfc7306_ulpdu(Opcode::AtomicResponse, ddp::QN_ATOMIC_RESPONSE, 1, &b),
                    codes::RDMAP_UNEXPECTED_OPCODE,
                )
            }
            "immediate data of 4 bytes" => (
                raw.rfc7306_ulpdu(Opcode::ImmediateData, ddp::QN_SEND, 1, &[EVIL; 4]),
                codes::RDMAP_CATASTROPHIC_STREAM,
            ),
            "immediate data of 12 bytes" => (
                raw.rfc7306_ulpdu(Opcode::ImmediateData, ddp::QN_SEND, 1, &[EVIL; 12]),
                codes::DDP_UNTAGGED_TOO_LONG,
            ),
            _ => (
                raw.rfc7306_ulpdu(Opcode::ImmediateData, ddp::QN_SEND, 1, &[EVIL; 8]),
                codes::DDP_UNTAGGED_NO_BUFFER,
            ),
        };
        raw.send_fpdu(&u);
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{what}: got {}", t.code);
        let wcs: &[(u64, WcStatus)] = if no_recv { &[] } else { &FLUSHED };
        expect_engine_terminated(&s, want, wcs);
        g.assert_untouched(what);
        g_rx.assert_untouched(what);
    }
    srv.prove_usable();
}

/// (15) Atomic Requests count against the IRD like Read Requests: with
/// IRD 1 and a large Read Response still owed (the peer does not read), an
/// Atomic Request is one too many (0/2/0x07, as for Reads) and is not
/// executed.
#[test]
fn atomic_request_beyond_ird() {
    const SRC: usize = 16 << 20;
    let srv = Server::new();
    let params = ConnParams {
        ird: 1,
        ord: 1,
        ..Default::default()
    };
    let (s, mut raw) = srv.accept_raw(
        &params,
        RawOpts {
            ird: 1,
            ord: 1,
            ext: true,
            ..Default::default()
        },
    );
    assert_eq!(s.qp.conn_params().unwrap().ird, 1);
    raw.set_rcvbuf(64 << 10);
    let _g = Guarded::new(128, 0x5A);
    let _rmr = guarded_recvs(&s, &_g);
    let src = s.pd.alloc_mr(SRC, RW).unwrap();
    let g = Guarded::new(64, 0x3C);
    let target = g.register(&s.pd, Access::ALL, RegOptions::default());
    let rr = ReadRequest {
        sink_stag: 0x0012_3400,
        sink_to: 0,
        size: SRC as u32,
        src_stag: src.rkey().raw(),
        src_to: src.addr(),
    };
    let u1 = raw.read_request_ulpdu(&rr);
    let u2 = raw.atomic_request_ulpdu(&fetch_add(target.rkey().raw(), target.addr()));
    let mut both = raw.fpdu(&u1);
    both.extend(raw.fpdu(&u2));
    raw.send_bytes(&both);
    expect_engine_terminated(&s, codes::RDMAP_CATASTROPHIC_STREAM, &FLUSHED);
    g.assert_untouched("atomic beyond IRD");
    srv.prove_usable();
}

/// Issue 20, item 3: Read Responses from the peer are checked as siw checks
/// them (`siw_rresp_check_ntoh`): a last segment that ends before the length
/// asked for (which completed the Read as Success over bytes that never
/// came), a wrong sink STag, a wrong offset, and a response nobody asked
/// for each get a Terminate, and the Read does not complete as Success.
#[test]
fn read_responses_are_checked() {
    let dev = device();
    const LEN: usize = 1000;
    for case in ["short", "wrong stag", "wrong offset", "unsolicited"] {
        let (c, mut raw) = connect_raw(&dev, &ConnParams::default(), RawOpts::default());
        let local = c.pd.alloc_mr(LEN, Access::LOCAL_WRITE).unwrap();
        local.write_at(0, &[0x11; LEN]);
        let rr = if case == "unsolicited" {
            ReadRequest {
                sink_stag: local.rkey().raw(),
                sink_to: local.addr(),
                size: LEN as u32,
                src_stag: 0x1234,
                src_to: 0,
            }
        } else {
            c.qp.post_send(&SendWr::read(
                1,
                local.sge_all(),
                0x8000,
                Rkey::from_raw(0x1234),
            ))
            .unwrap();
            let Next::Fpdu(u) = raw.next() else {
                panic!("{case}: no Read Request")
            };
            assert!(matches!(
                DdpHeader::decode(&u).unwrap(),
                DdpHeader::Untagged(h) if h.opcode == Opcode::ReadRequest
            ));
            ReadRequest::decode(&u[ddp::UNTAGGED_LEN..]).unwrap()
        };
        assert_eq!(rr.size as usize, LEN);
        let (stag, to, len, want) = match case {
            "short" => (
                rr.sink_stag,
                rr.sink_to,
                LEN - 400,
                codes::DDP_TAGGED_BASE_BOUNDS,
            ),
            "wrong stag" => (
                rr.sink_stag ^ 0x100,
                rr.sink_to,
                LEN,
                codes::DDP_TAGGED_INVALID_STAG,
            ),
            "wrong offset" => (
                rr.sink_stag,
                rr.sink_to + 8,
                LEN - 8,
                codes::DDP_TAGGED_BASE_BOUNDS,
            ),
            // As siw: DDP catastrophic ("ORQ empty").
            _ => (rr.sink_stag, rr.sink_to, LEN, codes::DDP_LOCAL_CATASTROPHIC),
        };
        let h = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag,
            to,
        });
        raw.send_fpdu(&ulpdu(h, &vec![EVIL; len]));
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{case}: got {}", t.code);
        assert!(c.qp.wait_state(QpState::Error, T), "{case}: QP in ERROR");
        if case != "unsolicited" {
            let wc = common::wait(&c.cq);
            assert_eq!(wc.wr_id, 1);
            assert_ne!(wc.status, WcStatus::Success, "{case}: the Read completed");
        }
        assert!(c.cq.poll_one().is_none(), "{case}: nothing more completes");
    }
}

/// Like [`connect_raw`], but returns what the engine's connect said.
fn try_connect_raw(dev: &Device, params: &ConnParams, o: RawOpts) -> (Side, Result<Vec<u8>>, Raw) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = side(dev, QpCaps::default());
    let (r, raw) = std::thread::scope(|sc| {
        let h = sc.spawn(|| c.qp.connect(addr, params));
        let raw = Raw::accept(&l, o);
        (h.join().unwrap(), raw)
    });
    (c, r, raw)
}

fn p2p_params() -> ConnParams {
    ConnParams {
        p2p: true,
        ..Default::default()
    }
}

/// A zero-length Read Request (an RTR, or a flush) from the raw peer.
fn zero_read() -> ReadRequest {
    ReadRequest {
        sink_stag: 1,
        sink_to: 0,
        size: 0,
        src_stag: 1,
        src_to: 0,
    }
}

/// Issue 20, item 1, responder side: a peer-to-peer initiator that offers
/// only the Read RTR. The engine answers the zero-length Read with a
/// zero-length Read Response (its sink STag, offset 0), counts its MSN (the
/// initiator's first real Read, MSN 2, is answered, not refused), and
/// holds its own Send until the RTR came.
#[test]
fn read_rtr_as_responder() {
    let srv = Server::new();
    let o = RawOpts {
        p2p: Some((false, true)),
        ..Default::default()
    };
    let (s, mut raw) = srv.accept_raw(&p2p_params(), o);
    assert!(s.qp.conn_params().unwrap().p2p);
    // Posted at once; must wait for the RTR.
    let m =
        s.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    m.write_at(0, &[0x5a; 64]);
    s.qp.post_send(&SendWr::send(1, &[m.sge(0, 16)])).unwrap();
    let rr = zero_read();
    let u = raw.read_request_ulpdu(&rr);
    raw.send_fpdu(&u);
    // First the RTR's answer, then the Send.
    let Next::Fpdu(first) = raw.next() else {
        panic!("no answer to the Read RTR")
    };
    match DdpHeader::decode(&first).unwrap() {
        DdpHeader::Tagged(h) => {
            assert_eq!(h.opcode, Opcode::ReadResponse);
            assert_eq!((h.stag, h.to, h.last), (1, 0, true));
            assert_eq!(first.len(), ddp::TAGGED_LEN, "zero-length");
        }
        h => panic!("{h:?} before the RTR's Read Response"),
    }
    let Next::Fpdu(send) = raw.next() else {
        panic!("the held Send never came")
    };
    assert!(
        matches!(DdpHeader::decode(&send).unwrap(), DdpHeader::Untagged(h) if h.opcode == Opcode::Send)
    );
    // A real Read Request, MSN 2: answered.
    let rr = ReadRequest {
        sink_stag: 0x4200,
        sink_to: 0,
        size: 64,
        src_stag: m.rkey().raw(),
        src_to: m.addr(),
    };
    let u = raw.read_request_ulpdu(&rr);
    raw.send_fpdu(&u);
    let Next::Fpdu(resp) = raw.next() else {
        panic!("no Read Response")
    };
    match DdpHeader::decode(&resp).unwrap() {
        DdpHeader::Tagged(h) => {
            assert_eq!(h.opcode, Opcode::ReadResponse, "{h:?}");
            assert_eq!(&resp[ddp::TAGGED_LEN..], &[0x5a; 64]);
        }
        h => panic!("{h:?} instead of the Read Response"),
    }
    assert_eq!(s.qp.state(), QpState::Rts);
}

/// Issue 20, item 1, initiator side: a peer-to-peer responder that picks
/// the Read RTR. The engine sends a zero-length Read Request first (STag
/// 1, as siw), takes the conformant zero-length Read Response, and its own
/// first Read then goes out with MSN 2 and completes.
#[test]
fn read_rtr_as_initiator() {
    let dev = device();
    let o = RawOpts {
        p2p: Some((false, true)),
        ..Default::default()
    };
    let (c, mut raw) = connect_raw(&dev, &p2p_params(), o);
    let Next::Fpdu(u) = raw.next() else {
        panic!("no RTR")
    };
    let DdpHeader::Untagged(h) = DdpHeader::decode(&u).unwrap() else {
        panic!("the RTR is untagged")
    };
    assert_eq!(
        (h.opcode, h.qn, h.msn),
        (Opcode::ReadRequest, ddp::QN_READ_REQUEST, 1)
    );
    let rtr = ReadRequest::decode(&u[ddp::UNTAGGED_LEN..]).unwrap();
    assert_eq!(
        (rtr.size, rtr.sink_stag, rtr.src_stag),
        (0, 1, 1),
        "STag 1, not 0"
    );
    let answer = DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::ReadResponse,
        stag: rtr.sink_stag,
        to: rtr.sink_to,
    });
    raw.send_fpdu(&ulpdu(answer, &[]));
    // Our own Read.
    let local = c.pd.alloc_mr(32, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::read(
        5,
        local.sge_all(),
        0x9000,
        Rkey::from_raw(0x77),
    ))
    .unwrap();
    let Next::Fpdu(u) = raw.next() else {
        panic!("no Read Request")
    };
    let DdpHeader::Untagged(h) = DdpHeader::decode(&u).unwrap() else {
        panic!("untagged")
    };
    assert_eq!((h.opcode, h.msn), (Opcode::ReadRequest, 2));
    let rr = ReadRequest::decode(&u[ddp::UNTAGGED_LEN..]).unwrap();
    let resp = DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::ReadResponse,
        stag: rr.sink_stag,
        to: rr.sink_to,
    });
    raw.send_fpdu(&ulpdu(resp, &[0x3c; 32]));
    let wc = common::wait(&c.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    assert_eq!(local.to_vec(), vec![0x3c; 32]);
}

/// Issue 20, items 2 and 9: a responder sends nothing before the
/// initiator's first FPDU (RFC 5044 section 7.1.2 rule 4: siw fails a
/// connection whose MPA reply arrives with an FPDU), then at once; with a
/// silent initiator it starts after the grace period (200 ms). A
/// peer-to-peer initiator whose first message is not the RTR releases the
/// responder too (it stalled forever).
#[test]
fn responder_waits_for_the_initiators_first_fpdu() {
    let srv = Server::new();
    for case in ["initiator speaks", "silent initiator", "p2p without RTR"] {
        let (s, mut raw) = if case == "p2p without RTR" {
            let o = RawOpts {
                p2p: Some((true, true)),
                ..Default::default()
            };
            srv.accept_raw(&p2p_params(), o)
        } else {
            srv.accept_default()
        };
        let t0 = Instant::now();
        let r = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(9, &[r.sge_all()])).unwrap();
        let m = s.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
        s.qp.post_send(&SendWr::send(1, &[m.sge_all()])).unwrap();
        // Nothing for 120 ms.
        raw.s
            .set_read_timeout(Some(std::time::Duration::from_millis(120)))
            .unwrap();
        let mut b = [0u8; 1];
        match raw.s.peek(&mut b) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            r => panic!("{case}: the responder sent before the initiator: {r:?}"),
        }
        raw.s.set_read_timeout(Some(T)).unwrap();
        if case != "silent initiator" {
            let u = raw.send_ulpdu(Opcode::Send, 0, b"hello");
            raw.send_fpdu(&u);
        }
        let Next::Fpdu(u) = raw.next() else {
            panic!("{case}: the responder's Send never came")
        };
        let waited = t0.elapsed();
        assert!(
            matches!(DdpHeader::decode(&u).unwrap(), DdpHeader::Untagged(h) if h.opcode == Opcode::Send)
        );
        if case == "silent initiator" {
            assert!(
                waited >= std::time::Duration::from_millis(190),
                "{case}: after {waited:?}"
            );
        }
        assert!(
            waited < std::time::Duration::from_secs(2),
            "{case}: after {waited:?}"
        );
        assert_eq!(s.qp.state(), QpState::Rts);
    }
}

/// Issue 20, item 7: the initiator's handshake checks.
#[test]
fn initiator_handshake_checks() {
    let dev = device();
    // CRC when either side asked: the reply says no, we asked: CRC.
    let crc = ConnParams {
        crc: true,
        ..Default::default()
    };
    let o = RawOpts {
        reply_crc: Some(false),
        ..Default::default()
    };
    let (c, r, mut raw) = try_connect_raw(&dev, &crc, o);
    r.expect("connects");
    assert!(
        c.qp.conn_params().unwrap().crc,
        "CRC when either side asked"
    );
    let m = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::send(1, &[m.sge_all()])).unwrap();
    // The raw peer checks the CRC of every FPDU it reads.
    assert!(
        matches!(raw.next(), Next::Fpdu(_)),
        "a Send with a good CRC"
    );
    // A revision-1 reply, and a non-enhanced one, to an enhanced request.
    for reply in [(1, false), (2, false)] {
        let o = RawOpts {
            reply: Some(reply),
            ..Default::default()
        };
        let (_c, r, _raw) = try_connect_raw(&dev, &ConnParams::default(), o);
        assert!(
            matches!(r, Err(Error::Protocol(_))),
            "reply {reply:?}: {r:?}"
        );
    }
    // The responder's ORD beyond our largest IRD: an MPA Terminate,
    // "insufficient IRD", and no connection.
    let o = RawOpts {
        ord: dev.attr().max_ird + 1,
        ..Default::default()
    };
    let (_c, r, mut raw) = try_connect_raw(&dev, &ConnParams::default(), o);
    assert!(matches!(r, Err(Error::Protocol(_))), "{r:?}");
    let t = raw.expect_terminate();
    assert_eq!(t.code, codes::MPA_INSUFFICIENT_IRD);
    // Within it, our IRD grows to the responder's ORD.
    let o = RawOpts {
        ord: 40,
        ..Default::default()
    };
    let (c, r, _raw) = try_connect_raw(&dev, &ConnParams::default(), o);
    r.expect("connects");
    assert_eq!(c.qp.conn_params().unwrap().ird, 40);
    // The responder's IRD of 0: our ORD stays 0, Reads are refused when
    // posted (they were forced to ORD 1).
    let o = RawOpts {
        ird: 0,
        ..Default::default()
    };
    let (c, r, _raw) = try_connect_raw(&dev, &ConnParams::default(), o);
    r.expect("connects");
    assert_eq!(c.qp.conn_params().unwrap().ord, 0);
    let l = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    assert!(matches!(
        c.qp.post_send(&SendWr::read(1, l.sge_all(), 0, Rkey::from_raw(0x77))),
        Err(Error::InvalidArgument(_))
    ));
    // Private data over siw's 256 bytes (IRD/ORD block included): refused
    // before anything is sent.
    let big = ConnParams {
        private_data: vec![7; 253],
        ..Default::default()
    };
    let c = side(&dev, QpCaps::default());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = c.qp.connect(l.local_addr().unwrap(), &big);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let ok = ConnParams {
        private_data: vec![7; 252],
        ..Default::default()
    };
    let (_c, r, _raw) = try_connect_raw(&dev, &ok, RawOpts::default());
    r.expect("252 bytes fit");
}

/// Issue 20, item 4: peers that trickle their MPA request one byte every
/// 300 ms delay no valid client's accept (it took up to 47 s when the
/// listener read handshakes one at a time with a per-read timeout), and
/// each is cut at its own whole-frame deadline although it keeps sending.
#[test]
fn a_slow_peer_delays_no_other_accept() {
    let dev = Device::open(DeviceConfig {
        publish: false,
        handshake_timeout: std::time::Duration::from_secs(1),
        ..Default::default()
    })
    .unwrap();
    let l = dev.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let req = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        v2: Some(MpaV2::default()),
        private_data: vec![1; 64],
    }
    .encode()
    .unwrap();
    let slow: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let t0 = Instant::now();
    let trickles: Vec<_> = slow
        .iter()
        .map(|s| {
            let (mut s, req) = (s.try_clone().unwrap(), req.clone());
            std::thread::spawn(move || {
                // A fault's pace, not a wait for anything.
                for b in req {
                    if s.write_all(&[b]).is_err() {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(300));
                }
            })
        })
        .collect();
    // A valid client meanwhile.
    let s = side(&dev, QpCaps::default());
    let c = side(&dev, QpCaps::default());
    std::thread::scope(|sc| {
        sc.spawn(|| c.qp.connect(addr, &ConnParams::default()).unwrap());
        let r = l
            .get_request_timeout(std::time::Duration::from_secs(5))
            .unwrap()
            .expect("the valid client's request");
        let waited = t0.elapsed();
        assert!(
            waited < std::time::Duration::from_secs(1),
            "accepted after {waited:?}"
        );
        r.accept(&s.qp, &ConnParams::default()).unwrap();
    });
    // Each slow peer is cut at its deadline (1 s), not after its last byte.
    for mut x in slow {
        x.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        let mut b = [0u8; 16];
        let r = x.read(&mut b);
        let at = t0.elapsed();
        assert!(
            matches!(r, Ok(0))
                || matches!(&r, Err(e) if e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut),
            "slow peer: {r:?}"
        );
        assert!(
            at < std::time::Duration::from_millis(2500),
            "cut after {at:?}"
        );
    }
    drop(trickles);
    send_one(&c, &s);
}

/// Issue 20, item 9: a masked fetch-and-add (RFC 7306 section 4.1: the
/// mask marks each field's top bit, where carries stop) adds the fields
/// independently; it was applied as a plain 64-bit add.
#[test]
fn masked_fetch_add_adds_fields_independently() {
    let srv = Server::new();
    let (s, mut raw) = srv.accept_raw(&ConnParams::default(), ext_opts());
    let target = s.pd.alloc_mr(8, Access::ALL).unwrap();
    // Four 16-bit fields at 0xFFFF, 1, 2, 3 (low to high).
    let orig: u64 = 0x0003_0002_0001_FFFF;
    target.write_at(0, &orig.to_le_bytes());
    let ar = AtomicRequest {
        add_swap: 0x0001_0001_0001_0001,
        add_swap_mask: 0x8000_8000_8000_8000,
        ..fetch_add(target.rkey().raw(), target.addr())
    };
    let u = raw.atomic_request_ulpdu(&ar);
    raw.send_fpdu(&u);
    let Next::Fpdu(resp) = raw.next() else {
        panic!("no Atomic Response")
    };
    let DdpHeader::Untagged(h) = DdpHeader::decode_with(&resp, true).unwrap() else {
        panic!("untagged")
    };
    assert_eq!(h.opcode, Opcode::AtomicResponse);
    let r = AtomicResponse::decode(&resp[ddp::UNTAGGED_LEN..]).unwrap();
    assert_eq!(r.orig, orig, "the original value");
    let mut b = [0u8; 8];
    target.read_at(0, &mut b);
    // 0xFFFF + 1 wraps within its field; no carry into the next.
    assert_eq!(u64::from_le_bytes(b), 0x0004_0003_0002_0000);
}

/// The TCP states of local port `port` in /proc/net/tcp (IPv4 loopback
/// sockets), as hex state codes ("06" is TIME_WAIT).
fn tcp_states_of(local_port: u16, peer_port: u16) -> Vec<String> {
    // The whole 4-tuple's ports: other connections on this machine (a
    // fuzzer's, another test's) may leave TIME_WAIT on the same local port
    // towards another peer.
    let port = |field: Option<&&str>| -> Option<u16> {
        u16::from_str_radix(field?.rsplit(':').next()?, 16).ok()
    };
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap();
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (port(f.get(1))? == local_port && port(f.get(2))? == peer_port)
                .then(|| f.get(3).map(|s| s.to_string()))?
        })
        .collect()
}

/// A peer that is not softrdma and closes first (its FIN, as Linux siw
/// sends on disconnect) is answered with a reset, not our FIN, so no
/// TIME_WAIT stays on the peer (issue 20: Linux rdma_cm gives a siw
/// client local ports without regard to TIME_WAIT, so each one a passive
/// close left there was a port whose next connect to us failed with
/// EADDRNOTAVAIL). Both as responder and as initiator; the QP still ends
/// with a flush and a Disconnected event, and the device serves on.
#[test]
fn a_peer_that_closes_first_is_reset_and_keeps_no_time_wait() {
    let srv = Server::new();
    for responder in [true, false] {
        let (s, mut raw) = if responder {
            srv.accept_default()
        } else {
            connect_raw(&srv.dev, &ConnParams::default(), RawOpts::default())
        };
        let what = if responder { "responder" } else { "initiator" };
        let port = raw.s.local_addr().unwrap().port();
        let peer_port = raw.s.peer_addr().unwrap().port();
        let rmr = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(7, &[rmr.sge(0, 64)])).unwrap();
        raw.s.shutdown(Shutdown::Write).unwrap();
        assert!(s.qp.wait_state(QpState::Error, T), "{what}: QP in ERROR");
        expect_wcs(&s.cq, &[(7, WcStatus::WrFlushErr)]);
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match srv.dev.next_event(left).expect("a Disconnected event") {
                AsyncEvent::Disconnected { qpn } if qpn == s.qp.qp_num() => break,
                _ => {}
            }
        }
        raw.s.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 64];
        let r = raw.s.read(&mut b);
        assert!(
            matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "{what}: the peer's read after its FIN: {r:?} (a reset was due; Ok(0) is our FIN)"
        );
        drop(raw);
        let states = tcp_states_of(port, peer_port);
        assert!(
            !states.iter().any(|s| s == "06"),
            "{what}: port {port} left in TIME_WAIT ({states:?})"
        );
    }
    srv.prove_usable();
}

/// Raw MPA request bytes: key, flags, revision, private data (its length
/// field `declared`, or its real length).
fn raw_mpa_request(
    key: &[u8; 16],
    flags: u8,
    rev: u8,
    pd: &[u8],
    declared: Option<u16>,
) -> Vec<u8> {
    let mut b = key.to_vec();
    b.push(flags);
    b.push(rev);
    b.extend_from_slice(&declared.unwrap_or(pd.len() as u16).to_be_bytes());
    b.extend_from_slice(pd);
    b
}

/// What the listener must do with one MPA request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MpaWant {
    /// Close without a byte (RFC 5044 section 7.1.4: a receiver that cannot
    /// interpret the revision or key closes the TCP connection; siw drops
    /// such a connection with EPROTO).
    Closed,
    /// An MPA reply with the reject bit, then close (markers: neither siw
    /// nor this engine does them, siw also rejects).
    Rejected,
    /// Accepted, the reply of this revision (enhanced when the request was).
    Accepted(u8),
}

/// The MPA handshake against every revision (0 to 3, 255), the enhanced
/// bit with and without its IRD/ORD block, markers, a wrong key, a reply
/// frame where a request is due, and private-data lengths at and beyond
/// MPA's 512-byte limit. Each refused peer gets exactly the answer above,
/// never reaches the application (the next request the listener returns is
/// the next good one), and the listener serves on.
#[test]
fn mpa_requests_of_every_revision_key_and_length() {
    use mpa::{FLAG_ENHANCED, FLAG_MARKERS, REP_KEY, REQ_KEY};
    let srv = Server::new();
    let v2 = MpaV2 {
        ird: 8,
        ord: 8,
        peer_to_peer: false,
        rtr_send: false,
        rtr_write: false,
        rtr_read: false,
    }
    .encode();
    let big: Vec<u8> = (0..512u32).map(|i| (i % 251) as u8 | 0x01).collect();
    let mut big_v2 = v2.to_vec();
    big_v2.extend_from_slice(&big[..508]);
    let cases: Vec<(&str, Vec<u8>, MpaWant)> = vec![
        (
            "revision 0",
            raw_mpa_request(REQ_KEY, 0, 0, &[], None),
            MpaWant::Closed,
        ),
        (
            "revision 3",
            raw_mpa_request(REQ_KEY, FLAG_ENHANCED, 3, &v2, None),
            MpaWant::Closed,
        ),
        (
            "revision 255",
            raw_mpa_request(REQ_KEY, 0, 255, &[], None),
            MpaWant::Closed,
        ),
        (
            "revision 1",
            raw_mpa_request(REQ_KEY, 0, 1, &[], None),
            MpaWant::Accepted(1),
        ),
        (
            "revision 2, not enhanced",
            raw_mpa_request(REQ_KEY, 0, 2, &[], None),
            MpaWant::Accepted(2),
        ),
        (
            "revision 2, enhanced",
            raw_mpa_request(REQ_KEY, FLAG_ENHANCED, 2, &v2, None),
            MpaWant::Accepted(2),
        ),
        (
            "enhanced bit, IRD/ORD block cut short",
            raw_mpa_request(REQ_KEY, FLAG_ENHANCED, 2, &v2[..2], None),
            MpaWant::Closed,
        ),
        (
            "markers",
            raw_mpa_request(REQ_KEY, FLAG_MARKERS | FLAG_ENHANCED, 2, &v2, None),
            MpaWant::Rejected,
        ),
        (
            "one byte of the key wrong",
            raw_mpa_request(b"MPA ID Req Framf", FLAG_ENHANCED, 2, &v2, None),
            MpaWant::Closed,
        ),
        (
            "a reply where the request is due",
            raw_mpa_request(REP_KEY, FLAG_ENHANCED, 2, &v2, None),
            MpaWant::Rejected,
        ),
        (
            "private data of 512 bytes (MPA's limit)",
            raw_mpa_request(REQ_KEY, 0, 1, &big, None),
            MpaWant::Accepted(1),
        ),
        (
            "enhanced, 4 + 508 bytes of private data",
            raw_mpa_request(REQ_KEY, FLAG_ENHANCED, 2, &big_v2, None),
            MpaWant::Accepted(2),
        ),
        (
            "private data length 513",
            raw_mpa_request(REQ_KEY, 0, 1, &[7; 513], None),
            MpaWant::Closed,
        ),
        (
            "private data length 65535",
            raw_mpa_request(REQ_KEY, 0, 1, &[7; 64], Some(0xffff)),
            MpaWant::Closed,
        ),
    ];
    for (what, bytes, want) in cases {
        let mut raw = TcpStream::connect(srv.addr()).unwrap();
        raw.set_read_timeout(Some(T)).unwrap();
        let raw_addr = raw.local_addr().unwrap();
        raw.write_all(&bytes).unwrap();
        match want {
            MpaWant::Closed | MpaWant::Rejected => {
                let mut got = Vec::new();
                let r = raw.read_to_end(&mut got);
                if let Err(e) = &r {
                    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{what}: {e}");
                }
                if want == MpaWant::Closed {
                    assert!(
                        got.is_empty(),
                        "{what}: closed with {} bytes sent",
                        got.len()
                    );
                } else {
                    let (f, n) = MpaFrame::decode_all(&got)
                        .unwrap_or_else(|e| panic!("{what}: no MPA reply ({e:?}): {got:02x?}"));
                    assert!(
                        f.kind == MpaKind::Reply && f.reject,
                        "{what}: a reject reply was due: {f:?}"
                    );
                    assert_eq!(n, got.len(), "{what}: bytes after the reject");
                }
                // The refused peer never reached the application: the next
                // request is a good client's.
                let s = side(&srv.dev, QpCaps::default());
                let c = side(&srv.dev, QpCaps::default());
                std::thread::scope(|sc| {
                    let h = sc.spawn(|| {
                        let req = srv.l.get_request().unwrap();
                        let from = req.peer_addr();
                        req.accept(&s.qp, &ConnParams::default()).unwrap();
                        from
                    });
                    c.qp.connect(srv.addr(), &ConnParams::default()).unwrap();
                    let from = h.join().unwrap();
                    assert_ne!(
                        from, raw_addr,
                        "{what}: the refused request reached the application"
                    );
                });
                send_one(&c, &s);
            }
            MpaWant::Accepted(rev) => {
                let s = side(&srv.dev, QpCaps::default());
                let req = srv.l.get_request().unwrap();
                assert_eq!(req.peer_addr(), raw_addr, "{what}");
                assert_eq!(req.mpa_revision(), rev, "{what}");
                let sent_pd = &bytes[mpa::HEADER_LEN..];
                let enhanced = bytes[16] & FLAG_ENHANCED != 0;
                let want_pd = if enhanced { &sent_pd[4..] } else { sent_pd };
                assert_eq!(req.private_data(), want_pd, "{what}: private data");
                req.accept(&s.qp, &ConnParams::default()).unwrap();
                let f = read_mpa_frame(&mut raw);
                assert!(f.kind == MpaKind::Reply && !f.reject, "{what}: {f:?}");
                assert_eq!(f.revision, rev, "{what}: reply revision");
                assert_eq!(f.v2.is_some(), enhanced, "{what}: enhanced reply");
                assert_eq!(s.qp.state(), QpState::Rts, "{what}");
            }
        }
    }
    srv.prove_usable();
}

/// An untagged ULPDU: DDP flags (last, version `ddp_ver`), RDMAP version
/// `rdmap_ver` and `op`, `inv` (Invalidate STag), QN, MSN, MO, then `body`.
#[allow(clippy::too_many_arguments)]
fn untagged(
    last: bool,
    ddp_ver: u8,
    rdmap_ver: u8,
    op: u8,
    inv: u32,
    qn: u32,
    msn: u32,
    mo: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut u = vec![0u8; ddp::UNTAGGED_LEN];
    u[0] = if last { ddp::DDP_LAST } else { 0 } | (ddp_ver & 3);
    u[1] = (rdmap_ver << 6) | (op & 0x0f);
    u[2..6].copy_from_slice(&inv.to_be_bytes());
    u[6..10].copy_from_slice(&qn.to_be_bytes());
    u[10..14].copy_from_slice(&msn.to_be_bytes());
    u[14..18].copy_from_slice(&mo.to_be_bytes());
    u.extend_from_slice(body);
    u
}

/// Untagged segments with a bad queue number, MSN, MO, RDMAP version, or
/// an opcode on the wrong queue (RFC 5041 section 7.2 and RFC 5040 section
/// 7). An untagged opcode names its queue (Send and its variants 0, Read
/// Request 1, Terminate 2), so one on another queue is answered as a bad
/// queue number at the DDP layer; opcodes that are never untagged (Write,
/// Read Response) as an unexpected opcode. Each gets exactly its
/// Terminate, echoing the segment's DDP header, the QP ends with its
/// receives flushed and nothing placed, and the listener serves on.
#[test]
fn untagged_segments_with_bad_queue_msn_mo_or_version() {
    let srv = Server::new();
    let send = Opcode::Send as u8;
    let body = [EVIL; 32];
    let v = ddp::DDP_VERSION;
    let rv = ddp::RDMAP_VERSION;
    let cases: Vec<(&str, Vec<u8>, TermCode)> = vec![
        (
            "queue number 3",
            untagged(true, v, rv, send, 0, 3, 1, 0, &body),
            codes::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            "queue number 0xffffffff",
            untagged(true, v, rv, send, 0, u32::MAX, 1, 0, &body),
            codes::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            "MSN 0 (1 is due)",
            untagged(true, v, rv, send, 0, 0, 0, 0, &body),
            codes::DDP_UNTAGGED_MSN_RANGE,
        ),
        (
            "MSN 2 (1 is due)",
            untagged(true, v, rv, send, 0, 0, 2, 0, &body),
            codes::DDP_UNTAGGED_MSN_RANGE,
        ),
        (
            "MSN 0x80000001",
            untagged(true, v, rv, send, 0, 0, 0x8000_0001, 0, &body),
            codes::DDP_UNTAGGED_MSN_RANGE,
        ),
        (
            "MO 64 in a message's first segment",
            untagged(true, v, rv, send, 0, 0, 1, 64, &body),
            codes::DDP_UNTAGGED_INVALID_MO,
        ),
        (
            "MO 0xfffffff0",
            untagged(true, v, rv, send, 0, 0, 1, 0xffff_fff0, &body),
            codes::DDP_UNTAGGED_INVALID_MO,
        ),
        (
            "RDMAP version 0",
            untagged(true, v, 0, send, 0, 0, 1, 0, &body),
            codes::RDMAP_INVALID_VERSION,
        ),
        (
            "RDMAP version 2",
            untagged(true, v, 2, send, 0, 0, 1, 0, &body),
            codes::RDMAP_INVALID_VERSION,
        ),
        (
            "a Send on the Read Request queue",
            untagged(true, v, rv, send, 0, 1, 1, 0, &body),
            codes::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            "a Read Request on the Send queue",
            untagged(true, v, rv, Opcode::ReadRequest as u8, 0, 0, 1, 0, &[0; 28]),
            codes::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            "a Terminate on the Send queue",
            untagged(true, v, rv, Opcode::Terminate as u8, 0, 0, 1, 0, &[0; 4]),
            codes::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            "an RDMA Write in an untagged segment",
            untagged(true, v, rv, Opcode::Write as u8, 0, 0, 1, 0, &body),
            codes::RDMAP_UNEXPECTED_OPCODE,
        ),
        (
            "a Read Response in an untagged segment",
            untagged(true, v, rv, Opcode::ReadResponse as u8, 0, 0, 1, 0, &body),
            codes::RDMAP_UNEXPECTED_OPCODE,
        ),
    ];
    for (what, u, want) in cases {
        let (s, mut raw) = srv.accept_default();
        let g = Guarded::new(128, 0x5A);
        let _mr = guarded_recvs(&s, &g);
        raw.send_fpdu(&u);
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{what}: got {}", t.code);
        assert_eq!(
            t.ddp_header.as_deref(),
            Some(&u[..ddp::UNTAGGED_LEN]),
            "{what}: the Terminate echoes the segment's DDP header"
        );
        expect_engine_terminated(&s, want, &FLUSHED);
        g.assert_untouched(what);
    }
    srv.prove_usable();
}

/// Send with Invalidate (and with Solicited Event and Invalidate) naming an
/// STag the engine may not invalidate: siw's codes (its
/// `siw_invalidate_stag` -EACCES vs. not found): an STag we hold for
/// another PD, or one registered without `invalidatable`, is a remote
/// protection error (1/0x09); one we do not know (never registered, or the
/// right index under another key) a remote operation error (2/0x09). The
/// receive completes with a remote invalid request error, the rest are
/// flushed, the Terminate echoes the Send's DDP header, the region stays
/// valid and unchanged, and the listener serves on.
#[test]
fn send_with_invalidate_failures() {
    let srv = Server::new();
    let other_pd = srv.dev.alloc_pd().unwrap();
    #[derive(Clone, Copy, Debug)]
    enum Target {
        Unknown,
        WrongKey,
        OtherPd,
        NotInvalidatable,
    }
    let cases = [
        (
            Target::Unknown,
            Opcode::SendInvalidate,
            codes::RDMAP_OP_CANNOT_INVALIDATE,
        ),
        (
            Target::WrongKey,
            Opcode::SendInvalidate,
            codes::RDMAP_OP_CANNOT_INVALIDATE,
        ),
        (
            Target::OtherPd,
            Opcode::SendInvalidate,
            codes::RDMAP_CANNOT_INVALIDATE,
        ),
        (
            Target::NotInvalidatable,
            Opcode::SendInvalidate,
            codes::RDMAP_CANNOT_INVALIDATE,
        ),
        (
            Target::Unknown,
            Opcode::SendSeInvalidate,
            codes::RDMAP_OP_CANNOT_INVALIDATE,
        ),
        (
            Target::OtherPd,
            Opcode::SendSeInvalidate,
            codes::RDMAP_CANNOT_INVALIDATE,
        ),
    ];
    for (target, op, want) in cases {
        let what = format!("{op:?} of {target:?}");
        let (s, mut raw) = srv.accept_default();
        let region = Guarded::new(256, 0x31);
        let mr = match target {
            Target::OtherPd => Some(region.register(
                &other_pd,
                RW,
                RegOptions {
                    invalidatable: true,
                    ..Default::default()
                },
            )),
            Target::NotInvalidatable | Target::WrongKey => Some(region.register(
                &s.pd,
                RW,
                RegOptions {
                    key: Some(0x42),
                    invalidatable: matches!(target, Target::WrongKey),
                    ..Default::default()
                },
            )),
            Target::Unknown => None,
        };
        let stag = match (&mr, target) {
            (Some(m), Target::WrongKey) => (m.rkey().raw() & !0xff) | 0x43,
            (Some(m), _) => m.rkey().raw(),
            (None, _) => 0x00ab_cd42,
        };
        let rbuf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(1, &[rbuf.sge(0, 32)])).unwrap();
        s.qp.post_recv(&RecvWr::new(2, &[rbuf.sge(32, 32)]))
            .unwrap();
        let u = raw.send_ulpdu(op, stag, b"invalidate this");
        raw.send_fpdu(&u);
        let t = raw.expect_terminate();
        assert_eq!(t.code, want, "{what}: got {}", t.code);
        assert_eq!(
            t.ddp_header.as_deref(),
            Some(&u[..ddp::UNTAGGED_LEN]),
            "{what}: the Terminate echoes the Send's DDP header"
        );
        expect_engine_terminated(
            &s,
            want,
            &[(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)],
        );
        if let Some(m) = &mr {
            assert!(m.is_valid(), "{what}: the region was invalidated");
        }
        region.assert_untouched(&what);
    }
    srv.prove_usable();
}

/// Issue 20, item 6, made deterministic: the application moves a QP to
/// ERROR while a Send's FPDU is half placed (its payload arrives in two
/// pieces), and the receiver, woken by the second piece, is held (a test
/// pause point) just past its first closed-check, before the receive lock.
/// The flush hands the receive back; released, the receiver must place
/// nothing more into that buffer (it used to place the rest of the payload
/// and then panic the progress thread on the missing receive), and the
/// device must keep working.
#[test]
fn a_flush_in_the_middle_of_an_fpdu_places_nothing_after_it() {
    let srv = Server::new();
    let (s, mut raw) = srv.accept_default();
    let region = Guarded::new(256, 0x11);
    let mr = region.register(&s.pd, Access::LOCAL_WRITE, RegOptions::default());
    s.qp.post_recv(&RecvWr::new(1, &[mr.sge(0, 256)])).unwrap();
    let (v, rv, send) = (ddp::DDP_VERSION, ddp::RDMAP_VERSION, Opcode::Send as u8);
    let f = raw.fpdu(&untagged(true, v, rv, send, 0, 0, 1, 0, &[0x21; 128]));
    // MPA length, DDP/RDMAP header, 64 of the 128 payload bytes.
    let cut = 2 + ddp::UNTAGGED_LEN + 64;
    raw.send_bytes(&f[..cut]);
    let deadline = Instant::now() + T;
    while mr.peek_u8(63) != 0x21 {
        assert!(Instant::now() < deadline, "the first half was never placed");
        std::thread::yield_now();
    }
    let pause = softrdma_verbs::test_hooks::pause_receiver(&s.qp);
    raw.send_bytes(&f[cut..]);
    assert!(
        pause.wait_reached(T),
        "the receiver never woke for the second half"
    );
    s.qp.modify(QpState::Error).unwrap();
    let wc = common::wait(&s.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
    let snap = mr.to_vec();
    pause.release();
    // The device's progress thread is alive and has run past the pause.
    srv.prove_usable();
    assert_eq!(mr.to_vec(), snap, "bytes placed after the flush");
    assert_eq!(mr.peek_u8(64), 0x11, "the second half was placed");
}

/// Deregistering caller-owned memory waits until no placement into it is
/// in flight (issue 19), as a NIC's deregistration does, so the caller may
/// free the memory as soon as the drop returns. A Write's second half is
/// held inside its placement (regions entered, bytes not yet copied); the
/// drop of the region must not return until it is let go. The buffer is an
/// ordinary vector, freed at the end of the test, not leaked.
#[test]
fn deregistering_raw_memory_waits_for_the_placement_in_flight() {
    const LEN: usize = 8192;
    let srv = Server::new();
    let (s, mut raw) = srv.accept_default();
    let mut buf = vec![0x11u8; LEN];
    // SAFETY: `buf` outlives the region: it is freed at the end of the
    // test, after the region was dropped (and that drop waited for the
    // engine's placement, which is what this test checks).
    let mr = unsafe {
        s.pd.register_raw(
            buf.as_mut_ptr(),
            LEN,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            RegOptions::default(),
        )
    }
    .unwrap();
    let (addr, rkey) = (mr.addr(), mr.rkey());
    let f = raw.fpdu(&raw.write_ulpdu(rkey.raw(), addr, &[0x22; 4096]));
    let cut = 2 + ddp::TAGGED_LEN + 1024;
    raw.send_bytes(&f[..cut]);
    let deadline = Instant::now() + T;
    while mr.peek_u8(1023) != 0x22 {
        assert!(Instant::now() < deadline, "the first part was never placed");
        std::thread::yield_now();
    }
    let pause = softrdma_verbs::test_hooks::pause_placement(&s.qp);
    raw.send_bytes(&f[cut..]);
    assert!(pause.wait_reached(T), "the rest never reached placement");
    let (tx, rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(mr);
        tx.send(()).unwrap();
    });
    // The drop must still be waiting while the placement is held.
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_millis(300)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout),
        "the region was deregistered under a placement in flight"
    );
    pause.release();
    rx.recv_timeout(T)
        .expect("the drop returned once placement ended");
    dropper.join().unwrap();
    // The held copy finished (it had entered before the drop); whatever
    // of the Write was still to come, and the next Write, met a dead STag:
    // the peer gets the invalid-STag Terminate, nothing lands after it.
    assert!(buf[..1024].iter().all(|&b| b == 0x22));
    assert!(buf[4096..].iter().all(|&b| b == 0x11));
    raw.send_bytes_lossy(&raw.fpdu(&raw.write_ulpdu(rkey.raw(), addr + 4096, &[0x33; 64])));
    let t = raw.expect_terminate();
    assert_eq!(t.code, codes::DDP_TAGGED_INVALID_STAG, "{t:?}");
    drop(buf);
    srv.prove_usable();
}

/// A one-shot close with Solicited Event goes out as opcode 0xE only to a
/// peer that agreed to `ONE_SHOT_SE`; to one that agreed to `ONE_SHOT`
/// alone (an older softrdma) as the standard Send with Solicited Event and
/// Invalidate (opcode 6), which such a peer also takes for a close. A
/// close without the flag is 0xD either way (issue 29: the flag used to be
/// dropped on the negotiated close).
#[test]
fn solicited_close_opcode_follows_the_negotiation() {
    const STAG: u32 = 0x1234_5601;
    for se in [false, true] {
        let srv = Server::new();
        let flags = RAW_EXT | mpa::ext::ONE_SHOT | if se { mpa::ext::ONE_SHOT_SE } else { 0 };
        let (s, mut raw) = srv.accept_raw(
            &ConnParams {
                extensions: true,
                ..Default::default()
            },
            RawOpts {
                ext: true,
                ext_flags: flags,
                ..Default::default()
            },
        );
        let n = s.qp.conn_params().unwrap();
        assert_eq!((n.one_shot, n.one_shot_se), (true, se));
        let buf = s.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(1, &[buf.sge(0, 256)])).unwrap();
        let u = raw.send_ulpdu(Opcode::SendAdvertise, STAG, b"cmd");
        raw.send_fpdu(&u);
        let wc = common::wait(&s.cq);
        assert_eq!(wc.advertised_stag, Some(Rkey::from_raw(STAG)));
        let ext = softrdma_verbs::wire::Ext {
            rfc7306: true,
            one_shot: true,
            one_shot_se: se,
        };
        for solicited in [false, true] {
            let mut close = SendWr::send_close(2, &[buf.sge(0, 4)], Rkey::from_raw(STAG));
            if solicited {
                close.flags = close.flags | SendFlags::SOLICITED;
            }
            s.qp.post_send(&close).unwrap();
            let u = raw.read_fpdu().expect("the close");
            let want = match (solicited, se) {
                (false, _) => Opcode::SendClose,
                (true, true) => Opcode::SendCloseSe,
                (true, false) => Opcode::SendSeInvalidate,
            };
            match DdpHeader::decode_ext(&u, ext).expect("a valid header") {
                DdpHeader::Untagged(h) => assert_eq!(
                    (h.opcode, h.inval_stag),
                    (want, STAG),
                    "ONE_SHOT_SE {se}, solicited {solicited}"
                ),
                h => panic!("{h:?}"),
            }
            assert!(common::wait(&s.cq).is_ok());
        }
    }
}
