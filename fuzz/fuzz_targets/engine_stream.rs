//! The engine's real receive path, as a responder, fed arbitrary bytes in
//! arbitrary segmentations (issue 19). Unlike `fpdu`, which fuzzes the wire
//! codec alone, this drives `softrdma_verbs` itself: a device listens on
//! loopback, a raw TCP peer completes the MPA exchange (revision 2,
//! enhanced, CRC on or off) and then writes the fuzz input as the FPDU
//! stream, cut into TCP writes whose sizes the input also chooses.
//!
//! The engine's QP has a region with a fixed STag at a fixed address
//! (REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC, so inputs can reach
//! placement, Read Responses and atomics) and receives posted into a second
//! one (Sends). Both sit between guard bytes.
//!
//! Checked after each input: the process is alive (a panic on a progress
//! thread aborts: `panic = "abort"` is what cargo fuzz builds with), the
//! engine ends the connection within 5 s of the peer's FIN (a Terminate or
//! a clean close, never a hang), and no byte outside the two regions
//! changed. Input layout: byte 0 bit 0 = CRC, byte 1 = the segmentation
//! seed, the rest = the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_verbs::wire::mpa::{MpaFrame, MpaKind, MpaV2};
use softrdma_verbs::*;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

#[path = "common/regions.rs"]
mod regions;
use regions::{Guarded, LEN};

struct Env {
    addr: SocketAddr,
    accepted: Mutex<mpsc::Receiver<(QueuePair, CompletionQueue)>>,
    target: Guarded,
    recv: Guarded,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        // SAFETY: ignoring SIGPIPE (a write to a connection the engine
        // closed must be an error, not the end of the fuzzer).
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dev = Device::open_default().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (target, recv, tmr, rmr) = regions::register(&pd);
        let l = dev.listen("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _keep = (tmr, &rmr);
            loop {
                let Ok(req) = l.get_request() else { continue };
                let cq = dev.create_cq(256).unwrap();
                let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
                if req.accept(&qp, &ConnParams::default()).is_err() {
                    continue;
                }
                // The peer writes only once it has the QP from the channel,
                // so these are posted before any Send arrives.
                for i in 0..4u64 {
                    let sge = rmr.sge(i as usize * (LEN / 4), LEN / 4);
                    qp.post_recv(&RecvWr::new(i, &[sge])).unwrap();
                }
                tx.send((qp, cq)).unwrap();
            }
        });
        Env {
            addr,
            accepted: Mutex::new(rx),
            target,
            recv,
        }
    })
}

fn read_frame(s: &mut TcpStream) -> Option<MpaFrame> {
    let mut hdr = [0u8; 20];
    s.read_exact(&mut hdr).ok()?;
    let pd_len = u16::from_be_bytes([hdr[18], hdr[19]]) as usize;
    let mut all = hdr.to_vec();
    all.resize(20 + pd_len, 0);
    s.read_exact(&mut all[20..]).ok()?;
    MpaFrame::decode_all(&all).ok().map(|(f, _)| f)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let e = env();
    let crc = data[0] & 1 == 1;
    let mut seed = data[1] as u32 | 0x100;
    let stream = &data[2..];

    let mut s = TcpStream::connect(e.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    let req = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        v2: Some(MpaV2 {
            ird: 4,
            ord: 4,
            ..Default::default()
        }),
        private_data: Vec::new(),
    };
    s.write_all(&req.encode().unwrap()).unwrap();
    let rep = read_frame(&mut s).expect("the engine's MPA reply");
    assert_eq!(rep.kind, MpaKind::Reply);
    let (qp, cq) = e
        .accepted
        .lock()
        .unwrap()
        .recv_timeout(Duration::from_secs(5))
        .expect("the engine accepted");

    // The stream, in writes of sizes the seed picks (1 byte to 2 KiB).
    let mut rest = stream;
    while !rest.is_empty() {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let n = match seed % 4 {
            0 => 1 + (seed >> 8) as usize % 7,
            1 => 1 + (seed >> 8) as usize % 64,
            _ => 1 + (seed >> 8) as usize % 2048,
        }
        .min(rest.len());
        if s.write_all(&rest[..n]).is_err() {
            break; // the engine closed (after a Terminate): fine
        }
        rest = &rest[n..];
    }
    let _ = s.shutdown(Shutdown::Write);
    // The engine must end the connection: read (Read Responses, a
    // Terminate, ...) until end of stream or reset.
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err)
                if err.kind() == std::io::ErrorKind::WouldBlock
                    || err.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("the engine did not end the connection within 5 s of the peer's FIN")
            }
            Err(_) => break, // reset
        }
    }
    drop(s);
    // Drain completions (flushes) so the next QP starts clean.
    while cq.poll_one().is_some() {}
    drop(qp);
    assert!(
        e.target.guards_intact(),
        "bytes written outside the target region"
    );
    assert!(
        e.recv.guards_intact(),
        "bytes written outside the receive region"
    );
});
