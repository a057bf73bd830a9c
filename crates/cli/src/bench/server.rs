//! `softrdma bench --server`: answers our own bench client (private data
//! starting with `SRBENCH1`, see `proto.rs`) and perftest's `-R` clients
//! (`perftest.rs`), plus a plain TCP endpoint for the baseline.
//!
//! Passive connections (write_bw, read_bw, read_lat, idle_qps) need no
//! thread: their QPs share one CQ, each with one posted receive whose
//! flush tells a single reaper thread that the peer has gone. Active ones
//! (send_bw, send_lat, write_lat) get a thread each.

use super::proto::{Hello, Reply, Test, MAGIC};
use super::tcp;
use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use softrdma_verbs::*;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Receives the server keeps posted for send_bw: enough for the client to
/// stream without waiting, bounded to 64 MiB of buffers.
pub fn send_credits(size: usize) -> usize {
    ((64 << 20) / size.max(1)).clamp(4, 512)
}

/// What the server of one passive QP keeps until the peer disconnects.
struct PassiveConn {
    _qp: Arc<QueuePair>,
    _bufs: Vec<MemoryRegion>,
}

struct Passive {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    conns: Mutex<HashMap<softrdma_verbs::Qpn, PassiveConn>>,
}

/// Runs the server until killed (or, with `stdin_eof`, until stdin closes:
/// `--loopback` uses that so the child never outlives its parent).
pub fn run(
    bind: IpAddr,
    port: u16,
    stdin_eof: bool,
    expect: super::perftest::Expect,
) -> Result<()> {
    expect.check()?;
    let dev_addr = if bind.is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        bind
    };
    let dev = Device::open(DeviceConfig {
        name: "bench0".into(),
        addr: dev_addr,
        ..DeviceConfig::default()
    })?;
    let listener = dev
        .listen(SocketAddr::new(bind, port))
        .with_context(|| format!("cannot listen on {bind}:{port}"))?;
    let addr = listener.local_addr()?;
    let tcp_listener = softrdma_verbs::tcp::listen(SocketAddr::new(bind, 0))
        .context("cannot open the TCP baseline listener")?;
    let tcp_port = tcp_listener.local_addr()?.port();
    std::thread::Builder::new()
        .name("bench-tcp".into())
        .spawn(move || tcp::serve(tcp_listener))?;
    if stdin_eof {
        std::thread::spawn(|| {
            let mut s = String::new();
            while std::io::stdin()
                .lock()
                .read_line(&mut s)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                s.clear();
            }
            std::process::exit(0);
        });
    }
    let passive = Arc::new(Passive {
        pd: dev.alloc_pd()?,
        cq: dev.create_cq(1 << 16)?,
        conns: Mutex::new(HashMap::new()),
    });
    {
        let p = passive.clone();
        std::thread::Builder::new()
            .name("bench-reaper".into())
            .spawn(move || reap(&p))?;
    }
    println!("BENCH-SERVER-LISTENING {addr} tcp-baseline {tcp_port}");
    std::io::stdout().flush()?;
    loop {
        let req = match listener.get_request() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "connection request failed");
                continue;
            }
        };
        let pd_ours = req.private_data().starts_with(MAGIC);
        let dev = dev.clone();
        let passive = passive.clone();
        let peer = req.peer_addr();
        let r = std::thread::Builder::new()
            .name("bench-conn".into())
            .spawn(move || {
                let r = if pd_ours {
                    serve_ours(&dev, &passive, req, tcp_port)
                } else {
                    super::perftest::serve(&dev, req, expect)
                };
                if let Err(e) = r {
                    eprintln!("bench server: connection from {peer}: {e:#}");
                }
            });
        if let Err(e) = r {
            eprintln!("bench server: cannot start a thread for {peer}: {e}");
        }
    }
}

/// Drops passive connections whose peer has gone (their receive flushed).
fn reap(p: &Passive) {
    let mut wcs = vec![WorkCompletion::default(); 64];
    loop {
        let n = p.cq.poll_wait(&mut wcs, Duration::from_secs(3600));
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                p.conns.lock().remove(&wc.qp_num);
            }
        }
    }
}

fn conn_params(req: &ConnectRequest, reply: &Reply) -> ConnParams {
    let (ird, ord) = req.ird_ord().unwrap_or((16, 16));
    ConnParams {
        private_data: reply.encode(),
        // Serve as many Reads as the client will issue (up to our limit).
        ird: ord.clamp(1, 128),
        ord: ird.clamp(1, 128),
        mpa_revision: req.mpa_revision(),
        crc: req.crc_requested(),
        ..ConnParams::default()
    }
}

fn serve_ours(dev: &Device, passive: &Passive, req: ConnectRequest, tcp_port: u16) -> Result<()> {
    let h = Hello::decode(req.private_data())?;
    let size = usize::try_from(h.size)
        .ok()
        .filter(|s| *s <= 64 << 20)
        .context("message size above 64 MiB")?
        .max(1);
    let mut access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    if h.test == Test::AtomicLat {
        if req
            .extensions()
            .is_none_or(|f| f & wire::mpa::ext::RFC7306 == 0)
        {
            req.reject(b"atomic_lat needs RFC 7306 (softrdma's extensions)")?;
            bail!("atomic_lat requested without RFC 7306 offered");
        }
        access = access | Access::REMOTE_ATOMIC;
    }
    match h.test {
        Test::WriteBw | Test::ReadBw | Test::ReadLat | Test::AtomicLat | Test::IdleQps => {
            let mut attr = QpInitAttr::new(&passive.cq);
            attr.caps.max_send_wr = 4;
            attr.caps.max_recv_wr = 1;
            let qp = Arc::new(passive.pd.create_qp(attr)?);
            qp.modify(QpState::Init)?;
            let buf = passive.pd.alloc_mr(size, access)?;
            let ctl = passive.pd.alloc_mr(8, Access::LOCAL_WRITE)?;
            qp.post_recv(&RecvWr::new(0, &[ctl.sge_all()]))?;
            let reply = Reply {
                addr: buf.addr(),
                rkey: buf.rkey().raw(),
                len: size as u32,
                credits: 0,
                tcp_port,
            };
            let qpn = qp.qp_num();
            // Registered before accepting, so the reaper finds it whenever
            // the flush comes.
            passive.conns.lock().insert(
                qpn,
                PassiveConn {
                    _qp: qp.clone(),
                    _bufs: vec![buf, ctl],
                },
            );
            let params = conn_params(&req, &reply);
            if let Err(e) = req.accept(&qp, &params) {
                passive.conns.lock().remove(&qpn);
                return Err(e.into());
            }
            // Busy-poll latency tests measure an always-running responder
            // (what a NIC is, and what the TCP baseline's busy-polling
            // echo side is): a thread spins on the QP's receiver, which
            // answers Read Requests and atomics inline, instead of a
            // progress thread woken by epoll.
            if h.busy_poll && matches!(h.test, Test::ReadLat | Test::AtomicLat) {
                qp.set_busy_poll(true)?;
                let qp = qp.clone();
                std::thread::Builder::new()
                    .name("bench-responder".into())
                    .spawn(move || {
                        while qp.state() != QpState::Error {
                            if !qp.progress() {
                                std::hint::spin_loop();
                            }
                        }
                    })?;
            }
            Ok(())
        }
        Test::SendBw | Test::SendLat | Test::WriteLat => {
            let pd = dev.alloc_pd()?;
            let credits = match h.test {
                Test::SendBw => send_credits(size),
                _ => 4,
            };
            let cq = dev.create_cq(credits * 2 + 256)?;
            let mut attr = QpInitAttr::new(&cq);
            attr.caps.max_send_wr = 256;
            attr.caps.max_recv_wr = credits;
            let qp = pd.create_qp(attr)?;
            qp.modify(QpState::Init)?;
            let bufs = pd.alloc_mr(size * credits, access)?;
            let out = pd.alloc_mr(size.max(8 * 16), Access::LOCAL_WRITE)?;
            for i in 0..credits {
                qp.post_recv(&RecvWr::new(i as u64, &[bufs.sge(i * size, size)]))?;
            }
            let reply = Reply {
                addr: bufs.addr(),
                rkey: bufs.rkey().raw(),
                len: size as u32,
                credits: credits as u32,
                tcp_port,
            };
            let params = conn_params(&req, &reply);
            req.accept(&qp, &params)?;
            if h.busy_poll {
                qp.set_busy_poll(true)?;
            }
            // Without busy-polling the Send tests' thread runs the QP's
            // input itself while it waits (no progress-thread hand-off).
            let driven = match h.test {
                Test::SendBw | Test::SendLat if !h.busy_poll => {
                    Some(DrivenCq::new(&cq, std::slice::from_ref(&qp))?)
                }
                _ => None,
            };
            let w = Waiter {
                qp: &qp,
                cq: &cq,
                busy: h.busy_poll,
                driven,
            };
            match h.test {
                Test::SendBw => serve_send_bw(&qp, &w, &bufs, &out, size, credits),
                Test::SendLat => serve_send_lat(&qp, &w, &bufs, &out, size),
                _ => serve_write_lat(&qp, &cq, &bufs, &out, size, &h),
            }
        }
    }
}

/// How a serving thread waits for its completions.
struct Waiter<'a> {
    qp: &'a QueuePair,
    cq: &'a CompletionQueue,
    busy: bool,
    driven: Option<DrivenCq>,
}

impl Waiter<'_> {
    /// Waits (up to a second) for completions.
    fn next(&self, wcs: &mut [WorkCompletion]) -> usize {
        match &self.driven {
            Some(d) => d.poll_wait(wcs, Duration::from_secs(1)),
            None => next_wcs(self.qp, self.cq, wcs, self.busy),
        }
    }
}

/// Waits (up to a second) for completions; in busy-poll mode spins,
/// running the QP's receiver itself.
fn next_wcs(qp: &QueuePair, cq: &CompletionQueue, wcs: &mut [WorkCompletion], busy: bool) -> usize {
    if !busy {
        // Poll a little before sleeping: under a stream of messages the
        // next completion is usually microseconds away, and a sleep and
        // wake-up per message costs more than the message.
        let spin_until = std::time::Instant::now() + Duration::from_micros(50);
        loop {
            let n = cq.poll(wcs);
            if n > 0 {
                return n;
            }
            if std::time::Instant::now() > spin_until {
                return cq.poll_wait(wcs, Duration::from_secs(1));
            }
            std::thread::yield_now();
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        qp.progress();
        let n = cq.poll(wcs);
        if n > 0 || std::time::Instant::now() > deadline {
            return n;
        }
        std::hint::spin_loop();
    }
}

/// send_bw: repost every receive at once and return credits (the
/// cumulative count of reposted receives) every `credits / 4`.
fn serve_send_bw(
    qp: &QueuePair,
    w: &Waiter,
    bufs: &MemoryRegion,
    out: &MemoryRegion,
    size: usize,
    credits: usize,
) -> Result<()> {
    let step = (credits / 4).max(1) as u64;
    let mut reposted = 0u64;
    let mut wcs = vec![WorkCompletion::default(); 64];
    let mut recvs = Vec::with_capacity(64);
    loop {
        let n = w.next(&mut wcs);
        recvs.clear();
        let mut credit_due = false;
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Ok(()); // flushed: the client is done
            }
            if wc.opcode == WcOpcode::Recv {
                let slot = wc.wr_id as usize;
                recvs.push(RecvWr::new(slot as u64, &[bufs.sge(slot * size, size)]));
                reposted += 1;
                if reposted.is_multiple_of(step) {
                    credit_due = true;
                }
            }
        }
        for r in &recvs {
            qp.post_recv(r)?;
        }
        if credit_due {
            let slot = ((reposted / step) % 16) as usize * 8;
            out.write_at(slot, &reposted.to_be_bytes());
            qp.post_send(&SendWr::send(u64::MAX, &[out.sge(slot, 8)]))?;
        }
    }
}

/// send_lat: echo every message back.
fn serve_send_lat(
    qp: &QueuePair,
    w: &Waiter,
    bufs: &MemoryRegion,
    out: &MemoryRegion,
    size: usize,
) -> Result<()> {
    let mut wcs = vec![WorkCompletion::default(); 16];
    loop {
        let n = w.next(&mut wcs);
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Ok(());
            }
            if wc.opcode == WcOpcode::Recv {
                let slot = wc.wr_id as usize;
                qp.post_recv(&RecvWr::new(slot as u64, &[bufs.sge(slot * size, size)]))?;
                qp.post_send(&SendWr::send(u64::MAX, &[out.sge(0, size)]))?;
            }
        }
    }
}

/// write_lat (perftest's scheme): wait until the client's Write changes the
/// last byte of our buffer to the round's number, then Write the same
/// number into the last byte of the client's buffer.
fn serve_write_lat(
    qp: &QueuePair,
    cq: &CompletionQueue,
    bufs: &MemoryRegion,
    out: &MemoryRegion,
    size: usize,
    h: &Hello,
) -> Result<()> {
    if (h.client_len as usize) < size {
        bail!("write_lat: the client's buffer is smaller than the message");
    }
    let mut wcs = vec![WorkCompletion::default(); 16];
    for i in 1..=h.iters {
        let want = i as u8;
        super::spin_until(|| bufs.peek_u8(size - 1) == want, qp, h.busy_poll)?;
        out.write_at(size - 1, &[want]);
        qp.post_send(&SendWr::write(
            i,
            &[out.sge(0, size)],
            h.client_addr,
            softrdma_verbs::Rkey::from_raw(h.client_rkey),
        ))?;
        // Reap our Write completions without waiting (frees SQ slots).
        let n = cq.poll(&mut wcs);
        if wcs[..n].iter().any(|wc| !wc.is_ok()) {
            bail!("write_lat: a Write failed: {:?}", &wcs[..n]);
        }
    }
    // Wait for the client to go.
    qp.set_busy_poll(false)?;
    loop {
        let n = next_wcs(qp, cq, &mut wcs, false);
        if wcs[..n].iter().any(|wc| !wc.is_ok()) {
            return Ok(());
        }
    }
}
