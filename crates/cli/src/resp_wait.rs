//! Redis's replicated write, measured for `softrdma store bench`: `SET`
//! followed by `WAIT 1 0` on one connection (the two requests pipelined in
//! one write), which Redis answers once its replica has the write. That is
//! the promise the store's insert and update make (acknowledged only once
//! both nodes hold the write), so it is the fair baseline for them; plain
//! `SET` (from `redis-benchmark`) acknowledges before replicating.
//!
//! `redis-benchmark` cannot send a pipeline of two different commands, so
//! this is a small RESP client of its own: `clients` threads, each with its
//! own connection, each timing every SET+WAIT pair for `secs`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;

/// Keys each client cycles through (`key:<client>:<n>`).
const KEYS: u64 = 1000;

/// What the SET+WAIT clients measured together.
#[derive(Debug, Clone, Copy)]
pub struct SetWait {
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// CPU use over the run, fractions of one core: this process (the
    /// clients) and the Redis servers (primary and replica together).
    pub cpu_client: Option<f64>,
    pub cpu_server: Option<f64>,
}

/// One RESP array of bulk strings.
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one reply line; a Redis error (`-...`) or anything but `want`'s
/// type fails.
fn reply(r: &mut BufReader<TcpStream>, line: &mut String, want: char) -> Result<()> {
    line.clear();
    if r.read_line(line).context("read a Redis reply")? == 0 {
        bail!("Redis closed the connection");
    }
    if !line.starts_with(want) {
        bail!("Redis answered {:?}", line.trim_end());
    }
    Ok(())
}

/// One client: SET+WAIT pairs until `until`, each pair's latency recorded.
fn client(port: u16, idx: usize, value: &[u8], go: &Barrier, secs: f64) -> Result<Histogram<u64>> {
    let s = TcpStream::connect(("127.0.0.1", port)).context("connect to Redis")?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let (mut buf, mut line) = (Vec::new(), String::new());
    go.wait();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < until {
        let key = format!("key:{idx}:{}", n % KEYS);
        buf.clear();
        command(&mut buf, &[b"SET", key.as_bytes(), value]);
        command(&mut buf, &[b"WAIT", b"1", b"0"]);
        let t = Instant::now();
        w.write_all(&buf).context("send SET+WAIT")?;
        reply(&mut r, &mut line, '+')?;
        reply(&mut r, &mut line, ':')?;
        let ns = t.elapsed().as_nanos() as u64;
        // WAIT answers the number of replicas that have the write; with a
        // timeout of 0 it waits for one, so anything else is a broken
        // replica link, not a measurement.
        let acked: u64 = line[1..].trim_end().parse().context("WAIT's reply")?;
        if acked < 1 {
            bail!("WAIT 1 0 answered {acked} replicas");
        }
        h.record(ns.max(1)).expect("within bounds");
        n += 1;
    }
    Ok(h)
}

/// CPU seconds used so far by this process and by the `servers` together.
fn cpu(servers: &[u32]) -> (Option<f64>, Option<f64>) {
    use crate::bench::cpu_secs;
    let s: Option<Vec<f64>> = servers.iter().map(|&p| cpu_secs(Some(p))).collect();
    (cpu_secs(None), s.map(|v| v.iter().sum()))
}

/// Runs `clients` SET+WAIT clients of `size`-byte values for `secs`
/// against the Redis on `port`; `servers` are the Redis processes whose
/// CPU use is reported.
pub fn measure(
    port: u16,
    servers: &[u32],
    size: usize,
    clients: usize,
    secs: f64,
) -> Result<SetWait> {
    let (t0, c0) = (Instant::now(), cpu(servers));
    let value: Arc<Vec<u8>> = Arc::new(vec![b'x'; size]);
    let go = Arc::new(Barrier::new(clients));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (value, go) = (value.clone(), go.clone());
            std::thread::spawn(move || client(port, i, &value, &go, secs))
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    for t in threads {
        let h = t
            .join()
            .map_err(|_| anyhow::anyhow!("a SET+WAIT client panicked"))??;
        all.add(&h).expect("same bounds");
    }
    if all.is_empty() {
        bail!("no SET+WAIT completed in {secs} s");
    }
    let (wall, c1) = (t0.elapsed().as_secs_f64().max(1e-9), cpu(servers));
    let frac = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / wall);
    Ok(SetWait {
        ops_per_s: all.len() as f64 / secs,
        p50_us: all.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: all.value_at_quantile(0.99) as f64 / 1e3,
        cpu_client: frac(c0.0, c1.0),
        cpu_server: frac(c0.1, c1.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_resp_arrays() {
        let mut b = Vec::new();
        command(&mut b, &[b"SET", b"k", b"vv"]);
        command(&mut b, &[b"WAIT", b"1", b"0"]);
        assert_eq!(
            b,
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n0\r\n"
        );
    }
}
