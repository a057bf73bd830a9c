//! Ping-pong with two-sided Send / Receive.
//!
//! 1. Each side opens a device, a protection domain, a completion queue and
//!    a queue pair, and registers a small receive and a small send buffer.
//! 2. Each side posts a receive before connecting (and re-posts it after
//!    every message it takes): a Send arriving with no receive posted
//!    breaks the connection.
//! 3. The client connects; the server accepts the request onto its QP.
//! 4. For each round the client sends "ping N"; the server's receive
//!    completes, it re-posts its receive and answers "pong N"; the client
//!    waits for the reply and checks it. Send completions only say that
//!    the message has left, so both sides skip over them.
//! 5. The client disconnects; the server's posted receive completes with a
//!    flush status, which tells it the client has gone.
//!
//! Run both sides in one process (a server thread, over 127.0.0.1):
//!     cargo run --release -p softrdma-verbs --example send_recv
//! or in two:
//!     cargo run --release -p softrdma-verbs --example send_recv -- server 7472
//!     cargo run --release -p softrdma-verbs --example send_recv -- client 127.0.0.1:7472

use softrdma_verbs::*;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

type R<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ROUNDS: u32 = 1000;

struct Ep {
    cq: CompletionQueue,
    qp: QueuePair,
    recv: MemoryRegion,
    send: MemoryRegion,
}

impl Ep {
    fn new(dev: &Device) -> R<Ep> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(64)?;
        let qp = pd.create_qp(QpInitAttr::new(&cq))?;
        qp.modify(QpState::Init)?;
        let recv = pd.alloc_mr(64, Access::LOCAL_WRITE)?;
        let send = pd.alloc_mr(64, Access::LOCAL_WRITE)?;
        let ep = Ep { cq, qp, recv, send };
        ep.post_recv()?;
        Ok(ep)
    }

    fn post_recv(&self) -> R<()> {
        Ok(self.qp.post_recv(&RecvWr::new(1, &[self.recv.sge_all()]))?)
    }

    fn send(&self, text: &str) -> R<()> {
        self.send.write_at(0, text.as_bytes());
        Ok(self
            .qp
            .post_send(&SendWr::send(2, &[self.send.sge(0, text.len())]))?)
    }

    /// The next received message (re-posting the receive), or None once
    /// the peer has disconnected.
    fn recv(&self) -> R<Option<String>> {
        loop {
            let wc = self
                .cq
                .wait_one(Duration::from_secs(10))
                .ok_or("timed out")?;
            match (wc.status, wc.opcode) {
                (WcStatus::Success, WcOpcode::Send) => continue,
                (WcStatus::Success, WcOpcode::Recv) => {
                    let mut m = vec![0; wc.byte_len as usize];
                    self.recv.read_at(0, &mut m);
                    self.post_recv()?;
                    return Ok(Some(String::from_utf8(m)?));
                }
                (WcStatus::WrFlushErr, _) => return Ok(None),
                _ => return Err(format!("work request failed: {wc:?}").into()),
            }
        }
    }
}

fn server(listener: Listener) -> R<()> {
    let ep = Ep::new(listener.device())?;
    let req = listener.get_request()?;
    println!("server: connection from {}", req.peer_addr());
    req.accept(&ep.qp, &ConnParams::default())?;
    let mut n = 0;
    while let Some(ping) = ep.recv()? {
        let reply = ping.replace("ping", "pong");
        ep.send(&reply)?;
        n += 1;
    }
    println!("server: answered {n} pings; the client disconnected");
    Ok(())
}

fn client(addr: impl ToSocketAddrs) -> R<()> {
    let ep = Ep::new(&Device::open_default()?)?;
    ep.qp.connect(addr, &ConnParams::default())?;
    let start = Instant::now();
    for i in 0..ROUNDS {
        ep.send(&format!("ping {i}"))?;
        let reply = ep.recv()?.ok_or("server disconnected")?;
        assert_eq!(reply, format!("pong {i}"));
    }
    let rtt = start.elapsed() / ROUNDS;
    println!(
        "client: {ROUNDS} ping-pongs, {:.1} us per round trip",
        rtt.as_secs_f64() * 1e6
    );
    ep.qp.disconnect();
    Ok(())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => {
            let listener = Device::open_default()?.listen("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            let server = std::thread::spawn(move || server(listener));
            client(addr)?;
            server.join().expect("server thread panicked")
        }
        ["server", port] => server(Device::open_default()?.listen(("0.0.0.0", port.parse()?))?),
        ["client", addr] => client(addr),
        _ => Err("usage: send_recv [server PORT | client HOST:PORT]".into()),
    }
}
