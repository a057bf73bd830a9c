//! The raw TCP baseline, measured between the same two processes as the
//! RDMA run: a pump (bandwidth) and a ping-pong (latency).
//!
//! The client opens a connection to the server's baseline port and sends a
//! 9-byte header: mode (0 pump, 1 ping-pong, 2 ping-pong with busy
//! polling) and the message size (be64). Pump: the client writes messages
//! of that size (one `write` each, like one WR each) and shuts down its
//! side; the server reads everything and answers the byte count (be64).
//! Ping-pong: the server echoes every `size` bytes until the client closes.

use anyhow::{bail, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const PUMP: u8 = 0;
const PINGPONG: u8 = 1;
const PINGPONG_BUSY: u8 = 2;

pub fn serve(l: TcpListener) {
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        std::thread::spawn(move || {
            if let Err(e) = serve_one(s) {
                tracing::debug!(error = %e, "TCP baseline connection ended");
            }
        });
    }
}

fn serve_one(mut s: TcpStream) -> Result<()> {
    // Like the engine's own sockets (TCP_NODELAY, the congestion control
    // of `softrdma_verbs::tcp`), so the baseline differs only in framing.
    softrdma_verbs::tcp::tune_accepted(&s)?;
    let mut hdr = [0u8; 9];
    s.read_exact(&mut hdr)?;
    let size = u64::from_be_bytes(hdr[1..9].try_into().unwrap()) as usize;
    if size == 0 || size > 64 << 20 {
        bail!("bad baseline size {size}");
    }
    match hdr[0] {
        PUMP => {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            s.write_all(&total.to_be_bytes())?;
        }
        PINGPONG | PINGPONG_BUSY => {
            let busy = hdr[0] == PINGPONG_BUSY;
            s.set_nonblocking(busy)?;
            let mut buf = vec![0u8; size];
            while read_full(&mut s, &mut buf, busy)? {
                write_full(&mut s, &buf, busy)?;
            }
        }
        m => bail!("bad baseline mode {m}"),
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes; Ok(false) on a clean EOF before any.
fn read_full(s: &mut TcpStream, buf: &mut [u8], busy: bool) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!("EOF in the middle of a message"),
            Ok(n) => got += n,
            Err(e) if busy && e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

fn write_full(s: &mut TcpStream, buf: &[u8], busy: bool) -> Result<()> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(n) => put += n,
            Err(e) if busy && e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// How often the segment pump re-reads the MSS (as the transmitter does).
const SEG_REFRESH: Duration = Duration::from_millis(50);

/// Pumps `count` messages of `size` bytes (or until `until`) over `streams`
/// connections in parallel; returns (bytes, seconds). With `segments`,
/// the stream is written as the siw framing writes it: a message ending
/// with `MSG_EOR` at every MSS of the stream, 16 per `sendmmsg`
/// (`softrdma_verbs::tcp::write_segments`), with no framing.
pub fn pump(
    addr: SocketAddr,
    size: usize,
    count: u64,
    until: Option<Duration>,
    streams: usize,
    segments: bool,
) -> Result<(u64, f64)> {
    let start = Instant::now();
    let handles: Vec<_> = (0..streams.max(1))
        .map(|_| {
            std::thread::spawn(move || -> Result<u64> {
                let mut s = softrdma_verbs::tcp::connect(addr, Duration::from_secs(10))?;
                let mut hdr = vec![PUMP];
                hdr.extend_from_slice(&(size as u64).to_be_bytes());
                s.write_all(&hdr)?;
                let buf = vec![0xa5u8; size];
                let t0 = Instant::now();
                let mut sent = 0u64;
                let mut i = 0u64;
                let (mut seg, mut seg_at) = (0usize, None);
                loop {
                    match until {
                        Some(d) if t0.elapsed() >= d => break,
                        None if i >= count => break,
                        _ => {}
                    }
                    if segments {
                        // The MSS, read again at most every 50 ms as the
                        // transmitter does (`Conn::current_seg`), not per
                        // message: the baseline pays no system call ours
                        // does not.
                        if seg_at.is_none_or(|t: Instant| t.elapsed() >= SEG_REFRESH) {
                            seg = softrdma_verbs::tcp::fpdu_segment(&s)
                                .ok_or_else(|| anyhow::anyhow!("no MSS on the pump's socket"))?;
                            seg_at = Some(Instant::now());
                        }
                        softrdma_verbs::tcp::write_segments(&s, &buf, seg, sent)?;
                    } else {
                        s.write_all(&buf)?;
                    }
                    sent += size as u64;
                    i += 1;
                }
                s.shutdown(Shutdown::Write)?;
                let mut ack = [0u8; 8];
                s.read_exact(&mut ack)?;
                let got = u64::from_be_bytes(ack);
                if got != sent {
                    bail!("TCP baseline: server counted {got} bytes, we sent {sent}");
                }
                Ok(sent)
            })
        })
        .collect();
    let mut bytes = 0;
    for h in handles {
        bytes += h
            .join()
            .map_err(|_| anyhow::anyhow!("pump thread panicked"))??;
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}

/// Ping-pongs `size` bytes `count` times (or until `until`); returns the
/// half round trips in nanoseconds.
pub fn pingpong(
    addr: SocketAddr,
    size: usize,
    count: u64,
    until: Option<Duration>,
    busy: bool,
) -> Result<Vec<u64>> {
    let mut s = softrdma_verbs::tcp::connect(addr, Duration::from_secs(10))?;
    let mut hdr = vec![if busy { PINGPONG_BUSY } else { PINGPONG }];
    hdr.extend_from_slice(&(size as u64).to_be_bytes());
    s.write_all(&hdr)?;
    s.set_nonblocking(busy)?;
    let out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut halves = Vec::new();
    let t0 = Instant::now();
    loop {
        match until {
            Some(d) if t0.elapsed() >= d => break,
            None if halves.len() as u64 >= count => break,
            _ => {}
        }
        let t = Instant::now();
        write_full(&mut s, &out, busy)?;
        if !read_full(&mut s, &mut back, busy)? {
            bail!("TCP baseline server closed the ping-pong");
        }
        halves.push(t.elapsed().as_nanos() as u64 / 2);
    }
    Ok(halves)
}
