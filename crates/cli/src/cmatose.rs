//! `softrdma cmatose`: rdma-core's `ucmatose` exchange on the softrdma engine
//! (docs/cmatose-protocol.md).
//!
//! Both sides post `count` receives of `size` bytes before connecting or
//! accepting. Once every connection is up the server Sends `count` messages
//! of `size` bytes on each; the client waits for all of them, then Sends
//! `count` replies of `size` bytes back; the server waits for its Send
//! completions and for the replies, then disconnects; the client exits when
//! it sees the disconnect.
//!
//! ucmatose sends whatever its (uninitialised) buffer holds and receives into
//! that same buffer, so its client's replies are a copy of the last message
//! it received. Our server sends a distinct pattern per message and checks
//! that every reply equals its last message (which holds against ucmatose and
//! against our client, which echoes the same way). Our client checks lengths
//! and counts, and with `--verify` also the pattern our server sends.

use anyhow::{bail, Context, Result};
use softrdma_verbs::*;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server address to connect to: runs the client. Without it, the
    /// server runs (as in ucmatose).
    #[arg(short = 's', long = "server-addr")]
    server_addr: Option<String>,
    /// Server: the address to listen on (default: all addresses).
    /// Client: not supported (the engine does not bind the source address).
    #[arg(short = 'b', long = "bind-addr")]
    bind_addr: Option<String>,
    /// rdma_cm port (the TCP port).
    #[arg(short = 'p', long, default_value_t = 7471)]
    port: u16,
    /// Connections (server: accepts this many before sending).
    #[arg(short = 'c', long, default_value_t = 1)]
    connections: usize,
    /// Messages each way per connection.
    #[arg(short = 'C', long, default_value_t = 10)]
    count: usize,
    /// Message size in bytes (0: no messages, as in ucmatose).
    #[arg(short = 'S', long, default_value_t = 100)]
    size: usize,
    /// MPA revision to offer (client): 1 or 2.
    #[arg(long, default_value_t = 2)]
    mpa_rev: u8,
    /// Ask for (client) or grant (server) MPA CRC32c.
    #[arg(long)]
    crc: bool,
    /// Give up on a connection attempt, a completion or the peer's
    /// disconnect after this many seconds (the server waits for its clients
    /// without limit).
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Server: wait this long after the last accept before sending. Not
    /// needed against Linux siw (which fails a connection whose MPA reply
    /// is followed at once by an FPDU): the engine holds a responder's
    /// first FPDU itself (docs/cmatose-protocol.md, "Who sends first");
    /// kept for trials.
    #[arg(long, default_value_t = 0)]
    send_delay_ms: u64,
    /// Client: also check that the messages carry the pattern our server
    /// sends (only against `softrdma cmatose`; ucmatose sends uninitialised
    /// memory).
    #[arg(long)]
    verify: bool,
}

/// Largest message size accepted (ucmatose takes an `int`; the engine's
/// limit is 2 GiB).
pub const MAX_SIZE: usize = 1 << 30;

/// At most this many bytes of message buffers per connection and direction;
/// above it, messages share buffers (as in ucmatose, whose messages all use
/// one buffer).
const POOL_BYTES: usize = 256 << 20;

/// How many distinct message buffers a connection uses for `count` messages
/// of `size` bytes; message `i` uses buffer `i % slots`.
fn slots(count: usize, size: usize) -> usize {
    count.min((POOL_BYTES / size.max(1)).max(1)).max(1)
}

/// The bytes our server sends in buffer `slot` of connection `conn`.
pub fn pattern(conn: usize, slot: usize, size: usize) -> Vec<u8> {
    let mut x = (conn as u32)
        .wrapping_mul(1_000_003)
        .wrapping_add((slot as u32).wrapping_mul(7919))
        .wrapping_add(1);
    (0..size)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) as u8
        })
        .collect()
}

/// One connection's resources (ucmatose's `cmatest_node`).
struct Node {
    id: usize,
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    /// Receive buffers, `slots` of `size` bytes.
    recv: Option<MemoryRegion>,
    /// Send buffers, `slots` of `size` bytes.
    send: Option<MemoryRegion>,
    slots: usize,
    _pd: ProtectionDomain,
}

impl Node {
    /// PD, a send and a receive CQ, an RC QP in INIT, the buffers, and
    /// `count` receives posted (ucmatose's `init_node` and `post_recvs`).
    fn new(dev: &Device, id: usize, count: usize, size: usize) -> Result<Node> {
        let pd = dev.alloc_pd()?;
        let depth = count.max(1) + 8;
        let send_cq = dev.create_cq(depth)?;
        let recv_cq = dev.create_cq(depth)?;
        let mut attr = QpInitAttr::new(&send_cq);
        attr.recv_cq = recv_cq.clone();
        attr.caps.max_send_wr = count.max(1);
        attr.caps.max_recv_wr = count.max(1);
        attr.caps.max_send_sge = 1;
        attr.caps.max_recv_sge = 1;
        attr.sq_sig_all = true;
        let qp = pd.create_qp(attr)?;
        // Receives may be posted from INIT on; ucmatose posts them before
        // connecting or accepting.
        qp.modify(QpState::Init)?;
        let slots = slots(count, size);
        let (recv, send) = if count > 0 {
            (
                Some(pd.alloc_mr(slots * size, Access::LOCAL_WRITE)?),
                Some(pd.alloc_mr(slots * size, Access::LOCAL_WRITE)?),
            )
        } else {
            (None, None)
        };
        let node = Node {
            id,
            qp,
            send_cq,
            recv_cq,
            recv,
            send,
            slots,
            _pd: pd,
        };
        if let Some(mr) = &node.recv {
            for i in 0..count {
                let off = (i % slots) * size;
                node.qp
                    .post_recv(&RecvWr::new(i as u64, &[mr.sge(off, size)]))
                    .context("post receive")?;
            }
        }
        Ok(node)
    }

    fn describe(&self, verb: &str) -> String {
        let np = self.qp.conn_params().expect("connected");
        let peer = self
            .qp
            .peer_addr()
            .map_or_else(|| "?".into(), |a| a.to_string());
        format!(
            "{verb} {peer} (MPA rev {}, CRC {}, IRD {}, ORD {})",
            np.revision,
            if np.crc { "on" } else { "off" },
            np.ird,
            np.ord
        )
    }

    /// Posts `count` Sends of `size` bytes, message `i` from buffer
    /// `i % slots` (ucmatose's `post_sends`; every Send is signaled).
    fn post_sends(&self, count: usize, size: usize) -> Result<()> {
        let Some(mr) = &self.send else { return Ok(()) };
        let wrs: Vec<SendWr> = (0..count)
            .map(|i| SendWr::send(i as u64, &[mr.sge((i % self.slots) * size, size)]))
            .collect();
        self.qp
            .post_send_batch(&wrs)
            .with_context(|| format!("connection {}: post sends", self.id))
    }

    /// Waits for `count` successful completions on `cq` of kind `op`;
    /// for receives, checks that each carried `size` bytes.
    fn complete(&self, recv: bool, count: usize, size: usize, step: Duration) -> Result<()> {
        let (cq, op, what) = if recv {
            (&self.recv_cq, WcOpcode::Recv, "receive")
        } else {
            (&self.send_cq, WcOpcode::Send, "send")
        };
        for n in 0..count {
            let wc = cq.wait_one(step).with_context(|| {
                format!(
                    "connection {}: timed out waiting for {what} completion {} of {count}",
                    self.id,
                    n + 1
                )
            })?;
            if wc.status != WcStatus::Success || wc.opcode != op {
                bail!(
                    "connection {}: {what} completion {} of {count} failed: {:?} ({:?}, wr {})",
                    self.id,
                    n + 1,
                    wc.status,
                    wc.opcode,
                    wc.wr_id
                );
            }
            if recv && wc.byte_len as usize != size {
                bail!(
                    "connection {}: message {} has {} bytes, expected {size}",
                    self.id,
                    wc.wr_id,
                    wc.byte_len
                );
            }
        }
        Ok(())
    }

    /// Receive buffer `slot`.
    fn received(&self, slot: usize, size: usize) -> Vec<u8> {
        let mut v = vec![0u8; size];
        if let Some(mr) = &self.recv {
            mr.read_at(slot * size, &mut v);
        }
        v
    }
}

fn check_size(a: &Args) -> Result<()> {
    if a.size > MAX_SIZE {
        bail!("size {} above the maximum of {MAX_SIZE}", a.size);
    }
    if a.connections == 0 {
        bail!("need at least one connection");
    }
    if !(1..=2).contains(&a.mpa_rev) {
        bail!("--mpa-rev must be 1 or 2");
    }
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    check_size(&a)?;
    // As in ucmatose: a size of 0 means no messages.
    let count = if a.size == 0 { 0 } else { a.count };
    let dev = Device::open(DeviceConfig {
        progress_threads: 1,
        ..Default::default()
    })?;
    // ucmatose asks for responder resources 1 and initiator depth 1; it
    // issues no RDMA Reads.
    let params = ConnParams {
        mpa_revision: a.mpa_rev,
        crc: a.crc,
        ird: 1,
        ord: 1,
        timeout: Duration::from_secs(a.timeout),
        ..Default::default()
    };
    match &a.server_addr {
        Some(s) => client(&dev, &a, s, count, &params),
        None => server(&dev, &a, count, &params),
    }
}

fn finish(ret: Result<()>) -> Result<()> {
    println!("test complete");
    match &ret {
        Ok(()) => println!("return status 0"),
        Err(_) => println!("return status 1"),
    }
    ret
}

fn server(dev: &Device, a: &Args, count: usize, params: &ConnParams) -> Result<()> {
    println!("cmatose: starting server");
    let bind = a.bind_addr.as_deref().unwrap_or("0.0.0.0");
    let listener = dev
        .listen((bind, a.port))
        .with_context(|| format!("listen on {bind}:{}", a.port))?;
    println!("cmatose: listening on {}", listener.local_addr()?);
    let ret = serve(dev, a, count, params, &listener);
    finish(ret)
}

fn serve(
    dev: &Device,
    a: &Args,
    count: usize,
    params: &ConnParams,
    listener: &Listener,
) -> Result<()> {
    let step = Duration::from_secs(a.timeout);
    let mut nodes = Vec::new();
    for id in 0..a.connections {
        let node = Node::new(dev, id, count, a.size)?;
        if let Some(mr) = &node.send {
            for s in 0..node.slots {
                mr.write_at(s * a.size, &pattern(id, s, a.size));
            }
        }
        let req = listener.get_request()?;
        req.accept(&node.qp, params)
            .with_context(|| format!("accept connection {id}"))?;
        println!("{}", node.describe("cmatose: accepted connection from"));
        nodes.push(node);
    }
    if count > 0 {
        std::thread::sleep(Duration::from_millis(a.send_delay_ms));
        println!("initiating data transfers");
        for n in &nodes {
            n.post_sends(count, a.size)?;
        }
        println!("completing sends");
        for n in &nodes {
            n.complete(false, count, a.size, step)?;
        }
        println!("receiving data transfers");
        for n in &nodes {
            n.complete(true, count, a.size, step)?;
            // Every reply is a copy of our last message (ucmatose receives
            // all messages into one buffer and sends that buffer back).
            let want = pattern(n.id, (count - 1) % n.slots, a.size);
            for s in 0..n.slots.min(count) {
                let got = n.received(s, a.size);
                if got != want {
                    let at = got.iter().zip(&want).position(|(x, y)| x != y);
                    bail!(
                        "connection {}: reply in buffer {s} is not our last message \
                         (first difference at byte {at:?})",
                        n.id
                    );
                }
            }
        }
        println!("data transfers complete");
        println!(
            "cmatose: {} connection(s): {count} messages of {} bytes sent and {count} echoed back, verified",
            nodes.len(),
            a.size
        );
    }
    println!("cmatose: disconnecting");
    for n in &nodes {
        n.qp.disconnect();
    }
    println!("disconnected");
    Ok(())
}

fn client(dev: &Device, a: &Args, server: &str, count: usize, params: &ConnParams) -> Result<()> {
    println!("cmatose: starting client");
    if a.bind_addr.is_some() {
        bail!("-b is not supported with -s: the engine does not bind the source address");
    }
    let addr: SocketAddr = (server, a.port)
        .to_socket_addrs()
        .with_context(|| format!("resolve {server}"))?
        .next()
        .with_context(|| format!("no address for {server}"))?;
    let ret = connect_and_reply(dev, a, addr, count, params);
    finish(ret)
}

fn connect_and_reply(
    dev: &Device,
    a: &Args,
    addr: SocketAddr,
    count: usize,
    params: &ConnParams,
) -> Result<()> {
    let step = Duration::from_secs(a.timeout);
    println!("cmatose: connecting");
    let mut nodes = Vec::new();
    for id in 0..a.connections {
        let node = Node::new(dev, id, count, a.size)?;
        node.qp
            .connect(addr, params)
            .with_context(|| format!("connect to {addr}"))?;
        println!("{}", node.describe("cmatose: connected to"));
        nodes.push(node);
    }
    if count > 0 {
        println!("receiving data transfers");
        for n in &nodes {
            n.complete(true, count, a.size, step)?;
            if a.verify {
                // Our server's message i comes from its buffer i % slots,
                // which is where our receive i landed.
                for s in 0..n.slots.min(count) {
                    if n.received(s, a.size) != pattern(n.id, s, a.size) {
                        bail!(
                            "connection {}: message {s} does not carry the pattern",
                            n.id
                        );
                    }
                }
            }
        }
        println!("sending replies");
        for n in &nodes {
            // Reply with the last message received, as ucmatose does.
            let last = n.received((count - 1) % n.slots, a.size);
            if let Some(mr) = &n.send {
                for s in 0..n.slots {
                    mr.write_at(s * a.size, &last);
                }
            }
            n.post_sends(count, a.size)?;
        }
        // ucmatose does not wait for these; we do, to see them succeed.
        for n in &nodes {
            n.complete(false, count, a.size, step)?;
        }
        println!("data transfers complete");
        println!(
            "cmatose: {} connection(s): {count} messages of {} bytes received{}, {count} replies sent",
            nodes.len(),
            a.size,
            if a.verify { " and verified" } else { "" }
        );
    }
    // The server disconnects once it has our replies.
    let deadline = Instant::now() + step;
    for n in &nodes {
        let left = deadline.saturating_duration_since(Instant::now());
        if !n.qp.wait_state(QpState::Error, left) {
            bail!(
                "connection {}: the server did not disconnect within {} s",
                n.id,
                a.timeout
            );
        }
        // Anything still queued is flushed; a reply that did not make it
        // would show here.
        if let Some(wc) = n.send_cq.poll_one() {
            bail!(
                "connection {}: send completion after the last: {wc:?}",
                n.id
            );
        }
    }
    println!("disconnected");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cap_the_pool() {
        assert_eq!(slots(4, 1 << 20), 4);
        assert_eq!(slots(0, 100), 1);
        assert_eq!(slots(1000, 1 << 20), 256);
        assert_eq!(slots(10, 0), 10);
    }

    #[test]
    fn patterns_differ_per_message_and_connection() {
        assert_ne!(pattern(0, 0, 64), pattern(0, 1, 64));
        assert_ne!(pattern(0, 0, 64), pattern(1, 0, 64));
        assert_eq!(pattern(0, 3, 64), pattern(0, 3, 64));
        assert_ne!(pattern(0, 0, 1), pattern(0, 1, 1));
    }

    /// Our client against our server on loopback, CRC on.
    #[test]
    fn loopback_exchange() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let args = move |server: bool| Args {
            server_addr: (!server).then(|| "127.0.0.1".to_string()),
            bind_addr: server.then(|| "127.0.0.1".to_string()),
            port,
            connections: 2,
            count: 4,
            size: 70_000,
            mpa_rev: 2,
            crc: true,
            timeout: 10,
            send_delay_ms: 0,
            verify: true,
        };
        let srv = std::thread::spawn(move || run(args(true)));
        let deadline = Instant::now() + Duration::from_secs(10);
        // Retry while the server is not listening yet.
        let mut res = run(args(false));
        while res
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("refused"))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
            res = run(args(false));
        }
        const HINT: &str = "the server sends first: an engine that holds a responder's \
                            FPDUs until the initiator's first one deadlocks here \
                            (docs/cmatose-protocol.md, \"Who sends first\")";
        res.expect(HINT);
        srv.join().unwrap().expect(HINT);
    }
}
