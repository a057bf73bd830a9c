//! RDMA Write and RDMA Read between a client and a server.
//!
//! 1. The server opens a device, a protection domain (PD), a completion
//!    queue (CQ) and a queue pair (QP), and registers a 4 KiB buffer with
//!    `REMOTE_WRITE | REMOTE_READ`, so that its peer may write and read it
//!    without the server's CPU taking part.
//! 2. Both sides post a receive before connecting: an incoming Send needs
//!    a posted receive buffer, or the connection fails.
//! 3. The client connects; the server accepts the request onto its QP.
//! 4. The server advertises its buffer (address, rkey, length) in a Send.
//! 5. The client RDMA-Writes a pattern into the server's buffer, then
//!    RDMA-Reads the buffer back into a second local region and checks it.
//!    (Completions on one QP arrive in order, and a Read issued after a
//!    Write sees the written data.)
//! 6. The client sends "done"; the server checks its buffer, and the client
//!    disconnects.
//!
//! Run both sides in one process (a server thread, over 127.0.0.1):
//!     cargo run --release -p softrdma-verbs --example write_read
//! or in two:
//!     cargo run --release -p softrdma-verbs --example write_read -- server 7471
//!     cargo run --release -p softrdma-verbs --example write_read -- client 127.0.0.1:7471

use softrdma_verbs::*;
use std::net::ToSocketAddrs;
use std::time::Duration;

type R<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEN: usize = 4096;

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i % 251) as u8).collect()
}

/// Waits for the next completion and checks it succeeded.
fn wait(cq: &CompletionQueue) -> R<WorkCompletion> {
    let wc = cq.wait_one(Duration::from_secs(10)).ok_or("timed out")?;
    if !wc.is_ok() {
        return Err(format!("work request failed: {wc:?}").into());
    }
    Ok(wc)
}

/// One PD, CQ and QP (in INIT) with a 16-byte receive posted.
fn setup(dev: &Device) -> R<(ProtectionDomain, CompletionQueue, QueuePair, MemoryRegion)> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = pd.create_qp(QpInitAttr::new(&cq))?;
    qp.modify(QpState::Init)?;
    let msg = pd.alloc_mr(16, Access::LOCAL_WRITE)?;
    qp.post_recv(&RecvWr::new(1, &[msg.sge_all()]))?;
    Ok((pd, cq, qp, msg))
}

fn server(listener: Listener) -> R<()> {
    let (pd, cq, qp, _done) = setup(listener.device())?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let buf = pd.alloc_mr(LEN, access)?;
    let req = listener.get_request()?;
    println!("server: connection from {}", req.peer_addr());
    req.accept(&qp, &ConnParams::default())?;
    // Advertise the buffer: be64 address, be32 rkey, be32 length.
    let adv = pd.alloc_mr(16, Access::LOCAL_WRITE)?;
    adv.write_at(0, &buf.addr().to_be_bytes());
    adv.write_at(8, &buf.rkey().raw().to_be_bytes());
    adv.write_at(12, &(LEN as u32).to_be_bytes());
    qp.post_send(&SendWr::send(2, &[adv.sge_all()]))?;
    // Our Send's completion and the client's "done", in either order.
    let ops = [wait(&cq)?.opcode, wait(&cq)?.opcode];
    assert!(ops.contains(&WcOpcode::Send) && ops.contains(&WcOpcode::Recv));
    assert!(
        buf.to_vec() == pattern(),
        "server buffer does not hold the data"
    );
    println!(
        "server: the client wrote {LEN} bytes into rkey {:#x}",
        buf.rkey()
    );
    Ok(())
}

fn client(addr: impl ToSocketAddrs) -> R<()> {
    let dev = Device::open_default()?;
    let (pd, cq, qp, msg) = setup(&dev)?;
    qp.connect(addr, &ConnParams::default())?;
    assert_eq!(wait(&cq)?.opcode, WcOpcode::Recv);
    let m = msg.to_vec();
    let raddr = u64::from_be_bytes(m[..8].try_into()?);
    let rkey = u32::from_be_bytes(m[8..12].try_into()?);
    let len = u32::from_be_bytes(m[12..16].try_into()?) as usize;
    println!("client: server buffer at {raddr:#x}, rkey {rkey:#x}, {len} bytes");
    let src = pd.alloc_mr(len, Access::LOCAL_WRITE)?;
    src.write_at(0, &pattern());
    qp.post_send(&SendWr::write(
        3,
        &[src.sge_all()],
        raddr,
        Rkey::from_raw(rkey),
    ))?;
    assert_eq!(wait(&cq)?.opcode, WcOpcode::RdmaWrite);
    let back = pd.alloc_mr(len, Access::LOCAL_WRITE)?;
    qp.post_send(&SendWr::read(
        4,
        back.sge_all(),
        raddr,
        Rkey::from_raw(rkey),
    ))?;
    assert_eq!(wait(&cq)?.opcode, WcOpcode::RdmaRead);
    assert!(back.to_vec() == src.to_vec(), "read-back mismatch");
    println!("client: RDMA Write then RDMA Read of {len} bytes: data matches");
    msg.write_at(0, b"done");
    qp.post_send(&SendWr::send(5, &[msg.sge(0, 4)]))?;
    assert_eq!(wait(&cq)?.opcode, WcOpcode::Send);
    qp.disconnect();
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
        _ => Err("usage: write_read [server PORT | client HOST:PORT]".into()),
    }
}
