//! `softrdma rping`: rdma-core's rping protocol on the softrdma engine.
//!
//! Per iteration the client advertises its source buffer (a Send of
//! `{be64 addr, be32 rkey, be32 len}`), the server RDMA-Reads it and answers
//! with a go-ahead Send; the client advertises its sink buffer, the server
//! RDMA-Writes what it read into it and sends another go-ahead; the client
//! then checks that the sink holds exactly what the source held.

use anyhow::{bail, Context, Result};
use softrdma_verbs::*;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run as server (listen).
    #[arg(short = 's', long, conflicts_with = "client")]
    server: bool,
    /// Run as client (connect).
    #[arg(short = 'c', long)]
    client: bool,
    /// Address: the server binds it, the client connects to it.
    #[arg(short = 'a', long, default_value = "127.0.0.1")]
    addr: String,
    #[arg(short = 'p', long, default_value_t = 7174)]
    port: u16,
    /// Iterations (0: until the peer disconnects / forever).
    #[arg(short = 'C', long, default_value_t = 1)]
    count: u64,
    /// Buffer size in bytes.
    #[arg(short = 'S', long, default_value_t = 64)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'V', long)]
    verbose: bool,
    /// MPA revision to offer (client) — 1 or 2.
    #[arg(long, default_value_t = 2)]
    mpa_rev: u8,
    /// Ask for (client) or grant (server) MPA CRC32c.
    #[arg(long)]
    crc: bool,
    /// Give up on a connection attempt / a step after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Client: keep retrying to connect until the timeout (for a server
    /// that is still starting).
    #[arg(long)]
    retry: bool,
    /// Client: wait this long after the connection is established before
    /// the first Send. Linux siw as the responder installs its RDMA-mode
    /// socket callback only after sending the MPA reply (siw_accept); an
    /// FPDU arriving in between stays unnoticed in the socket until more
    /// data comes, and rping's server waits for it forever. rdma-core's
    /// rping client never sends that fast; we do without this pause.
    #[arg(long, default_value_t = 50)]
    first_send_delay_ms: u64,
    /// (conformance tests) Server: in the first iteration, RDMA-Read from
    /// (`bad-read-stag`) or RDMA-Write to (`bad-write-stag`) the client's
    /// buffer under a wrong key, so that the peer answers with a
    /// Terminate; the server then prints the Terminate it received
    /// (`rping server: peer Terminate: ...`) and fails.
    #[arg(long, value_enum, hide = true)]
    fault: Option<Fault>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    BadReadStag,
    BadWriteStag,
}

/// The key byte of an STag changed: the same region index, a key the peer
/// never issued.
fn wrong_key(stag: u32) -> u32 {
    stag ^ 0x5a
}

/// rping's minimum buffer (`RPING_MIN_BUFSIZE`, 23: see
/// docs/rping-protocol.md section 1).
pub const MIN_SIZE: usize = 23;
/// rping's maximum is 65535; softrdma against softrdma accepts up to this.
pub const MAX_SIZE: usize = 64 << 20;

/// The data rping's client puts in its source buffer for iteration `ping`.
pub fn ping_pattern(ping: u64, start: &mut u8, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    let head = format!("rdma-ping-{ping}: ");
    let n = head.len().min(size);
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = *start;
    for b in buf.iter_mut().skip(n) {
        *b = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    *start += 1;
    if *start > 122 {
        *start = 65;
    }
    if size > 0 {
        buf[size - 1] = 0;
    }
    buf
}

fn info_msg(addr: u64, rkey: u32, len: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&addr.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..16].copy_from_slice(&len.to_be_bytes());
    m
}

fn parse_info(m: &[u8]) -> (u64, u32, u32) {
    (
        u64::from_be_bytes(m[..8].try_into().unwrap()),
        u32::from_be_bytes(m[8..12].try_into().unwrap()),
        u32::from_be_bytes(m[12..16].try_into().unwrap()),
    )
}

struct Ctx {
    cq: CompletionQueue,
    qp: QueuePair,
    recv: MemoryRegion,
    send: MemoryRegion,
    step: Duration,
}

impl Ctx {
    fn new(dev: &Device) -> Result<(Ctx, ProtectionDomain)> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(64)?;
        let mut attr = QpInitAttr::new(&cq);
        attr.caps.max_send_wr = 16;
        attr.caps.max_recv_wr = 4;
        let qp = pd.create_qp(attr)?;
        // Receives may be posted from INIT on; rping posts its receive
        // before connecting or accepting.
        qp.modify(QpState::Init)?;
        let recv = pd.alloc_mr(16, Access::LOCAL_WRITE)?;
        let send = pd.alloc_mr(16, Access::LOCAL_WRITE)?;
        Ok((
            Ctx {
                cq,
                qp,
                recv,
                send,
                step: Duration::from_secs(30),
            },
            pd,
        ))
    }

    fn post_recv(&self) -> Result<()> {
        self.qp.post_recv(&RecvWr::new(1, &[self.recv.sge_all()]))?;
        Ok(())
    }

    /// Waits for the next completion; errors on a failed one.
    fn wait(&self, what: &str) -> Result<WorkCompletion> {
        let wc = self
            .cq
            .wait_one(self.step)
            .with_context(|| format!("timed out waiting for {what}"))?;
        if wc.status != WcStatus::Success {
            bail!("{what} failed: {:?} ({:?})", wc.status, wc.opcode);
        }
        Ok(wc)
    }

    fn wait_for(&self, what: &str, op: WcOpcode) -> Result<WorkCompletion> {
        let wc = self.wait(what)?;
        if wc.opcode != op {
            bail!("expected {op:?} completion for {what}, got {:?}", wc.opcode);
        }
        Ok(wc)
    }

    fn send_msg(&self, m: &[u8; 16]) -> Result<()> {
        self.send.write_at(0, m);
        // Unsignaled: the peer's answer (a Recv on the same CQ) may arrive
        // before this Send's completion would; a failed Send still
        // completes (with an error) and fails the next wait.
        self.qp
            .post_send(&SendWr::send(2, &[self.send.sge_all()]).unsignaled())?;
        Ok(())
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.server == a.client {
        bail!("give exactly one of --server and --client");
    }
    if a.size < MIN_SIZE {
        bail!("size {} below rping's minimum of {MIN_SIZE}", a.size);
    }
    if a.size > MAX_SIZE {
        bail!("size {} above the maximum of {MAX_SIZE}", a.size);
    }
    let dev = Device::open(DeviceConfig {
        progress_threads: 1,
        ..Default::default()
    })?;
    let params = ConnParams {
        mpa_revision: a.mpa_rev,
        crc: a.crc,
        ird: 1,
        ord: 1,
        timeout: Duration::from_secs(a.timeout),
        ..Default::default()
    };
    if a.server {
        server(&dev, &a, &params)
    } else {
        client(&dev, &a, &params)
    }
}

/// After a failed step: the Terminate the peer sent, if one came (printed
/// with its decoded layer, type and code), as the error's context.
fn peer_terminate(dev: &Device, ctx: &Ctx, e: anyhow::Error) -> anyhow::Error {
    let deadline = Instant::now() + Duration::from_secs(5);
    let qpn = ctx.qp.qp_num();
    while let Some(ev) = dev.next_event(deadline.saturating_duration_since(Instant::now())) {
        if let AsyncEvent::Terminated {
            qpn: q,
            code,
            by_peer: true,
        } = ev
        {
            if q == qpn {
                println!(
                    "rping server: peer Terminate: layer {} etype {:#x} ecode {:#04x} ({code})",
                    code.layer as u8, code.etype, code.ecode
                );
                return e.context(format!("the peer sent a Terminate: {code}"));
            }
        }
    }
    println!("rping server: no Terminate from the peer");
    e
}

fn server(dev: &Device, a: &Args, params: &ConnParams) -> Result<()> {
    let listener = dev
        .listen((a.addr.as_str(), a.port))
        .with_context(|| format!("listen on {}:{}", a.addr, a.port))?;
    println!("rping server listening on {}", listener.local_addr()?);
    let (ctx, pd) = Ctx::new(dev)?;
    let rdma = pd.alloc_mr(
        a.size,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
    )?;
    let req = listener.get_request()?;
    ctx.post_recv()?;
    req.accept(&ctx.qp, params)?;
    let np = ctx.qp.conn_params().expect("connected");
    println!(
        "accepted connection from {} (MPA rev {}, CRC {})",
        req_peer(&ctx),
        np.revision,
        if np.crc { "on" } else { "off" }
    );
    let mut i = 0u64;
    loop {
        if a.count != 0 && i >= a.count {
            break;
        }
        // Source advertisement (or the client's disconnect).
        let wc = match ctx.cq.wait_one(ctx.step) {
            Some(wc) => wc,
            None => bail!("timed out waiting for the client"),
        };
        if wc.status == WcStatus::WrFlushErr {
            break; // client disconnected
        }
        if !wc.is_ok() || wc.opcode != WcOpcode::Recv {
            bail!("unexpected completion {wc:?}");
        }
        let (addr, rkey, len) = parse_info(&ctx.recv.to_vec());
        if len as usize > a.size {
            bail!("client buffer of {len} bytes exceeds ours ({})", a.size);
        }
        ctx.post_recv()?;
        let rkey = if a.fault == Some(Fault::BadReadStag) {
            wrong_key(rkey)
        } else {
            rkey
        };
        ctx.qp.post_send(&SendWr::read(
            3,
            rdma.sge(0, len as usize),
            addr,
            softrdma_verbs::Rkey::from_raw(rkey),
        ))?;
        if let Err(e) = ctx.wait_for("RDMA Read", WcOpcode::RdmaRead) {
            return Err(peer_terminate(dev, &ctx, e));
        }
        if a.verbose {
            println!("server ping data: {}", cstr(&rdma.to_vec()));
        }
        ctx.send_msg(&[0u8; 16])?;
        // Sink advertisement.
        let wc = ctx.wait_for("sink advertisement", WcOpcode::Recv)?;
        let _ = wc;
        let (addr, rkey, len2) = parse_info(&ctx.recv.to_vec());
        ctx.post_recv()?;
        let n = (len2 as usize).min(len as usize);
        let rkey = if a.fault == Some(Fault::BadWriteStag) {
            wrong_key(rkey)
        } else {
            rkey
        };
        ctx.qp.post_send(&SendWr::write(
            4,
            &[rdma.sge(0, n)],
            addr,
            softrdma_verbs::Rkey::from_raw(rkey),
        ))?;
        if let Err(e) = ctx.wait_for("RDMA Write", WcOpcode::RdmaWrite) {
            return Err(peer_terminate(dev, &ctx, e));
        }
        if a.fault == Some(Fault::BadWriteStag) {
            // A Write completes when its bytes are sent; the peer's
            // Terminate follows. Wait for it on the next step.
            let e = match ctx.wait("the peer's answer to the Write") {
                Ok(wc) => anyhow::anyhow!("the peer accepted a Write under a wrong key: {wc:?}"),
                Err(e) => e,
            };
            return Err(peer_terminate(dev, &ctx, e));
        }
        ctx.send_msg(&[0u8; 16])?;
        i += 1;
    }
    // Wait for the client to disconnect (rping's client does after its
    // last iteration).
    let deadline = Instant::now() + ctx.step;
    while ctx.qp.state() != QpState::Error && Instant::now() < deadline {
        if let Some(wc) = ctx.cq.wait_one(Duration::from_millis(100)) {
            if wc.status != WcStatus::WrFlushErr {
                bail!("unexpected completion after the last iteration: {wc:?}");
            }
        }
    }
    println!("rping server: {i} iterations done");
    Ok(())
}

fn req_peer(ctx: &Ctx) -> String {
    ctx.qp
        .peer_addr()
        .map_or_else(|| "?".into(), |a| a.to_string())
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn client(dev: &Device, a: &Args, params: &ConnParams) -> Result<()> {
    let (ctx, pd) = Ctx::new(dev)?;
    let start = pd.alloc_mr(a.size, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
    let sink = pd.alloc_mr(a.size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    ctx.post_recv()?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let mut ctx = ctx;
    let mut pd = pd;
    let mut bufs = (start, sink);
    loop {
        match ctx.qp.connect((a.addr.as_str(), a.port), params) {
            Ok(_) => break,
            Err(e) if a.retry && Instant::now() < deadline => {
                tracing::debug!(error = %e, "connect failed; retrying");
                std::thread::sleep(Duration::from_millis(200));
                // A failed attempt may leave the QP unusable: start over.
                let (c, p) = Ctx::new(dev)?;
                bufs = (
                    p.alloc_mr(a.size, Access::LOCAL_WRITE | Access::REMOTE_READ)?,
                    p.alloc_mr(a.size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
                );
                ctx = c;
                pd = p;
                ctx.post_recv()?;
            }
            Err(e) => return Err(e).context("connect"),
        }
    }
    let _ = &pd;
    let (start, sink) = bufs;
    let np = ctx.qp.conn_params().expect("connected");
    println!(
        "connected to {} (MPA rev {}, CRC {})",
        req_peer(&ctx),
        np.revision,
        if np.crc { "on" } else { "off" }
    );
    // Not synchronisation with anything we could wait for: see the
    // option's documentation (a race in the Linux siw responder).
    std::thread::sleep(Duration::from_millis(a.first_send_delay_ms));
    let mut first = 65u8;
    let mut i = 0u64;
    while a.count == 0 || i < a.count {
        let data = ping_pattern(i, &mut first, a.size);
        start.write_at(0, &data);
        sink.write_at(0, &vec![0u8; a.size]);
        ctx.send_msg(&info_msg(start.addr(), start.rkey().raw(), a.size as u32))?;
        ctx.wait_for("go-ahead after the RDMA Read", WcOpcode::Recv)?;
        ctx.post_recv()?;
        ctx.send_msg(&info_msg(sink.addr(), sink.rkey().raw(), a.size as u32))?;
        ctx.wait_for("go-ahead after the RDMA Write", WcOpcode::Recv)?;
        ctx.post_recv()?;
        let got = sink.to_vec();
        if got != data {
            let at = got.iter().zip(&data).position(|(x, y)| x != y).unwrap_or(0);
            bail!("data mismatch in iteration {i} at byte {at}");
        }
        if a.verbose {
            println!("ping data: {}", cstr(&got));
        }
        i += 1;
    }
    ctx.qp.disconnect();
    println!("rping client: {i} iterations verified");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_rping() {
        let mut s = 65u8;
        let p = ping_pattern(0, &mut s, 30);
        assert_eq!(&p[..13], b"rdma-ping-0: ");
        assert_eq!(&p[13..16], b"ABC");
        assert_eq!(p[29], 0);
        assert_eq!(s, 66);
        let p = ping_pattern(1, &mut s, 30);
        assert_eq!(&p[13..15], b"BC");
    }
}
