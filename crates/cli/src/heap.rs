//! `softrdma heap`: the registered-memory heap shared by processes
//! (`softrdma-heap`): create, show/check, unlink, bench; `worker` is the
//! line-driven participant the multi-process tests start.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use serde_json::json;
use softrdma_heap::{Heap, HeapBuf, HeapConfig, HeapError};
use softrdma_verbs::{
    Access, ConnParams, Device, DeviceConfig, QpInitAttr, QueuePair, RegOptions, SendWr,
};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a heap segment (/dev/shm/softrdma-heap-NAME).
    Create {
        name: String,
        /// Block size (power of two, 64K..1G).
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        block_size: u64,
        #[arg(long, default_value_t = 1024)]
        max_blocks: u32,
        /// Units of the block area (default: max-blocks).
        #[arg(long)]
        units: Option<u32>,
    },
    /// Check the shared table and show it.
    Show {
        name: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a heap segment's name.
    Unlink { name: String },
    /// Allocation + look-up with cached registrations against registering
    /// each allocation (pin + STag) separately.
    Bench {
        /// Sizes in bytes.
        #[arg(long, value_delimiter = ',', default_values_t = vec![64u64, 4096, 1 << 20])]
        sizes: Vec<u64>,
        /// Process counts.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 4])]
        processes: Vec<usize>,
        /// Seconds per measurement (each of cached and uncached).
        #[arg(long, default_value_t = 0.3)]
        secs: f64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// A participant driven by commands on stdin (for tests).
    #[command(hide = true)]
    Worker {
        name: String,
        /// Offer the same-host transport.
        #[arg(long)]
        same_host: bool,
    },
    /// One process of `bench`.
    #[command(hide = true)]
    BenchChild { name: String, size: u64, secs: f64 },
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        Cmd::Create {
            name,
            block_size,
            max_blocks,
            units,
        } => {
            let dev = Device::open_default()?;
            let pd = dev.alloc_pd()?;
            let cfg = HeapConfig {
                block_size,
                max_blocks,
                units: units.unwrap_or(max_blocks),
                ..HeapConfig::new(&name)
            };
            let h = Heap::create(&pd, &cfg)?;
            println!(
                "created heap {name}: block size {block_size}, {max_blocks} descriptors, {} units ({})",
                cfg.units,
                softrdma_heap::path_of(&name).display()
            );
            // Keep the segment: dropping the handle only releases blocks.
            drop(h);
            Ok(())
        }
        Cmd::Show { name, json } => {
            let dev = Device::open_default()?;
            let pd = dev.alloc_pd()?;
            let h = Heap::open(&pd, &name, Access::LOCAL_WRITE, false)?;
            let (bs, maxb, units) = h.geometry();
            let rep = h.check(false).map_err(|e| anyhow!("table damaged: {e}"))?;
            if json {
                println!(
                    "{}",
                    json!({"name": name, "block_size": bs, "max_blocks": maxb, "units": units,
                        "active_blocks": rep.active_blocks, "free_descriptors": rep.free_descriptors,
                        "units_used": rep.units_used, "slots_used": rep.slots_used,
                        "recovered": rep.recovered, "reaped": rep.reaped})
                );
            } else {
                println!("heap {name}: block size {bs}, {maxb} descriptors, {units} units");
                println!(
                    "  {} live blocks ({} units), {} free descriptors, {} slots in use",
                    rep.active_blocks, rep.units_used, rep.free_descriptors, rep.slots_used
                );
                println!(
                    "  lock holders died and repaired: {}; dead processes' blocks reaped: {}",
                    rep.recovered, rep.reaped
                );
            }
            Ok(())
        }
        Cmd::Unlink { name } => Ok(Heap::unlink(&name)?),
        Cmd::Bench {
            sizes,
            processes,
            secs,
            json,
        } => bench(&sizes, &processes, secs, json),
        Cmd::Worker { name, same_host } => worker(&name, same_host),
        Cmd::BenchChild { name, size, secs } => bench_child(&name, size, secs),
    }
}

// ------------------------------------------------------------------ bench

fn bench(sizes: &[u64], processes: &[usize], secs: f64, json: bool) -> Result<()> {
    let name = format!("bench-{}", std::process::id());
    let dev = Device::open_default()?;
    let pd = dev.alloc_pd()?;
    let _ = Heap::unlink(&name);
    let heap = Heap::create(&pd, &HeapConfig::new(&name))?;
    let exe = std::env::current_exe()?;
    if !json {
        println!(
            "{:>9} {:>9} {:>12} {:>14} {:>9}   (alloc + look-up + free; pinning {})",
            "size",
            "processes",
            "cached ns",
            "uncached ns",
            "speedup",
            if softrdma_verbs::pinning_enabled() {
                "on"
            } else {
                "off"
            }
        );
    }
    let mut result = Ok(());
    'outer: for &size in sizes {
        for &np in processes {
            let children: Vec<_> = (0..np)
                .map(|_| {
                    std::process::Command::new(&exe)
                        .args(["heap", "bench-child", &name])
                        .arg(size.to_string())
                        .arg(secs.to_string())
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                })
                .collect::<std::io::Result<_>>()?;
            let (mut cached, mut uncached) = (Vec::new(), Vec::new());
            for c in children {
                let out = c.wait_with_output()?;
                if !out.status.success() {
                    result = Err(anyhow!("a bench process failed ({})", out.status));
                    break 'outer;
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&out.stdout).context("bench child output")?;
                cached.push(v["cached_ns"].as_f64().unwrap_or(f64::NAN));
                uncached.push(v["uncached_ns"].as_f64().unwrap_or(f64::NAN));
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let (c, u) = (mean(&cached), mean(&uncached));
            if json {
                println!(
                    "{}",
                    json!({"bench": "heap", "size": size, "processes": np,
                        "cached_ns": (c * 10.0).round() / 10.0, "uncached_ns": (u * 10.0).round() / 10.0,
                        "speedup": (u / c * 10.0).round() / 10.0,
                        "pinning": softrdma_verbs::pinning_enabled()})
                );
            } else {
                println!("{size:>9} {np:>9} {c:>12.1} {u:>14.1} {:>8.1}x", u / c);
            }
        }
    }
    drop(heap);
    let _ = Heap::unlink(&name);
    result
}

fn bench_child(name: &str, size: u64, secs: f64) -> Result<()> {
    let dev = Device::open(DeviceConfig {
        publish: false,
        ..Default::default()
    })?;
    let pd = dev.alloc_pd()?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let heap = Heap::open(&pd, name, access, false)?;
    let size = size as usize;
    let dur = Duration::from_secs_f64(secs);
    // Cached: the heap's registration of the block is reused.
    drop(heap.alloc(size)?); // warm: the first allocation registers
    let mut n = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        for _ in 0..64 {
            let b = heap.alloc(size)?;
            let k = heap.lookup(b.addr(), size)?;
            std::hint::black_box((k.lkey, k.rkey));
            drop(b);
        }
        n += 64;
    }
    let cached = t0.elapsed().as_nanos() as f64 / n as f64;
    // Uncached: each allocation registered (pinned, STag installed) and
    // deregistered on its own, as without a registration cache.
    let align = if size >= 4096 { 4096 } else { 64 };
    let layout = std::alloc::Layout::from_size_align(size, align)?;
    let mut n = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        for _ in 0..16 {
            // SAFETY: layout has a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                bail!("out of memory");
            }
            // SAFETY: p is a live allocation of `size` bytes, freed only
            // after the region is dropped (no work request names it).
            let mr = unsafe { pd.register_raw(p, size, access, RegOptions::default()) }?;
            std::hint::black_box((mr.lkey(), mr.rkey()));
            drop(mr);
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(p, layout) };
        }
        n += 16;
    }
    let uncached = t0.elapsed().as_nanos() as f64 / n as f64;
    println!("{}", json!({"cached_ns": cached, "uncached_ns": uncached}));
    Ok(())
}

// ----------------------------------------------------------------- worker

struct Worker {
    dev: Device,
    heap: Heap,
    bufs: HashMap<u64, HeapBuf>,
    next_id: u64,
    out_qp: Option<(QueuePair, softrdma_verbs::CompletionQueue)>,
    /// Connection parameters: extensions (and so the same-host transport,
    /// where the peer offers it too) when started with `--same-host`.
    params: ConnParams,
    in_qp: Arc<parking_lot::Mutex<Vec<QueuePair>>>,
    next_wr: u64,
    scratch: Option<HeapBuf>,
}

fn err(e: impl std::fmt::Display) -> serde_json::Value {
    json!({"error": e.to_string()})
}

/// Reads commands (one per line) and answers each with one JSON line.
fn worker(name: &str, same_host: bool) -> Result<()> {
    let dev = Device::open(DeviceConfig {
        same_host,
        publish: false,
        ..Default::default()
    })?;
    let pd = dev.alloc_pd()?;
    let check = std::env::var("SOFTRDMA_HEAP_CHECK_POSTS").is_ok_and(|v| v == "1");
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let heap = Heap::open(&pd, name, access, check || cfg!(debug_assertions))?;
    let mut w = Worker {
        dev,
        heap,
        bufs: HashMap::new(),
        next_id: 1,
        out_qp: None,
        in_qp: Arc::new(parking_lot::Mutex::new(Vec::new())),
        next_wr: 1,
        scratch: None,
        params: ConnParams {
            extensions: same_host,
            ..Default::default()
        },
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    println!("{}", json!({"ready": true, "pid": std::process::id()}));
    for line in stdin.lock().lines() {
        let line = line?;
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f[0] == "exit" {
            break;
        }
        let v = w.command(&f).unwrap_or_else(err);
        writeln!(out, "{v}")?;
        out.flush()?;
    }
    Ok(())
}

fn num(f: &[&str], i: usize) -> Result<u64> {
    let s = f.get(i).ok_or_else(|| anyhow!("missing argument {i}"))?;
    Ok(if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16)?
    } else {
        s.parse()?
    })
}

fn fill_tag(b: &mut HeapBuf, tag: u64) {
    let t = tag.to_le_bytes();
    let bytes: Vec<u8> = (0..b.len()).map(|i| t[i % 8]).collect();
    b.write_at(0, &bytes);
}

fn has_tag(b: &HeapBuf, tag: u64) -> bool {
    let t = tag.to_le_bytes();
    b.to_vec().iter().enumerate().all(|(i, &x)| x == t[i % 8])
}

fn keys_json(k: &softrdma_heap::Keys) -> serde_json::Value {
    json!({"lkey": k.lkey, "rkey": k.rkey, "block": k.block, "gen": k.gen})
}

impl Worker {
    fn buf(&mut self, id: u64) -> Result<&mut HeapBuf> {
        self.bufs
            .get_mut(&id)
            .ok_or_else(|| anyhow!("no buffer {id}"))
    }

    fn command(&mut self, f: &[&str]) -> Result<serde_json::Value> {
        Ok(match f[0] {
            "alloc" => {
                let b = self.heap.alloc(num(f, 1)? as usize)?;
                let id = self.next_id;
                self.next_id += 1;
                let (block, gen) = b.block();
                let v = json!({"id": id, "addr": b.addr(), "offset": b.offset(), "len": b.len(),
                    "lkey": b.lkey(), "rkey": b.rkey(), "block": block, "gen": gen});
                self.bufs.insert(id, b);
                v
            }
            "fill" => {
                let byte = num(f, 2)? as u8;
                self.buf(num(f, 1)?)?.fill(byte);
                json!({"ok": true})
            }
            // verify <id> <byte> [<offset> <len>]: every byte (of the
            // range) is <byte>.
            "verify" => {
                let byte = num(f, 2)? as u8;
                let b = self.buf(num(f, 1)?)?;
                let (off, len) = match f.get(3) {
                    Some(_) => (num(f, 3)? as usize, num(f, 4)? as usize),
                    None => (0, b.len()),
                };
                if off.checked_add(len).is_none_or(|e| e > b.len()) {
                    bail!("range {off}+{len} outside the buffer");
                }
                let mut v = vec![0u8; len];
                b.read_at(off, &mut v);
                let bad = v.iter().position(|&x| x != byte);
                json!({"ok": bad.is_none(), "first_bad": bad.map(|i| i + off),
                    "found": bad.map(|i| v[i])})
            }
            "free" => {
                let id = num(f, 1)?;
                self.bufs
                    .remove(&id)
                    .ok_or_else(|| anyhow!("no buffer {id}"))?;
                json!({"ok": true})
            }
            "lookup" => {
                let addr = self.heap.addr_of(num(f, 1)?)?;
                match self.heap.lookup(addr, num(f, 2)? as usize) {
                    Ok(k) => {
                        let mut v = keys_json(&k);
                        v["addr"] = json!(addr);
                        v
                    }
                    Err(e @ HeapError::NotInHeap(_)) => json!({"not_in_heap": e.to_string()}),
                    Err(e) => return Err(e.into()),
                }
            }
            "listen" => {
                let l = self.dev.listen("127.0.0.1:0")?;
                let port = l.local_addr()?.port();
                let pd = self.heap.pd().clone();
                let cq = self.dev.create_cq(64)?;
                let keep = self.in_qp.clone();
                let params = self.params.clone();
                std::thread::spawn(move || {
                    let run = || -> Result<()> {
                        let req = l.get_request()?;
                        let qp = pd.create_qp(QpInitAttr::new(&cq))?;
                        req.accept(&qp, &params)?;
                        keep.lock().push(qp);
                        Ok(())
                    };
                    if let Err(e) = run() {
                        eprintln!("heap worker: accept failed: {e:#}");
                    }
                });
                json!({"port": port})
            }
            "connect" => {
                let port = num(f, 1)?;
                let pd = self.heap.pd().clone();
                let cq = self.dev.create_cq(64)?;
                let qp = pd.create_qp(QpInitAttr::new(&cq))?;
                qp.connect(format!("127.0.0.1:{port}"), &self.params)?;
                let same_host = qp.conn_params().is_some_and(|n| n.same_host);
                self.out_qp = Some((qp, cq));
                json!({"ok": true, "same_host": same_host})
            }
            // write <id> <remote_addr> <rkey>: RDMA Write of the whole
            // buffer into the peer's memory, completion awaited.
            "write" => {
                let sge = self.buf(num(f, 1)?)?.sge_all();
                self.rdma_write(sge, num(f, 2)?, num(f, 3)? as u32)?
            }
            // read <id> <remote_addr> <rkey> [<len>]: RDMA Read of the
            // peer's memory into the buffer (its first <len> bytes),
            // completion awaited.
            "read" => {
                let b = self.buf(num(f, 1)?)?;
                let len = match f.get(4) {
                    Some(_) => num(f, 4)? as usize,
                    None => b.len(),
                };
                if len > b.len() {
                    bail!("read of {len} bytes into a buffer of {}", b.len());
                }
                let sge = b.sge(0, len);
                self.rdma_read(sge, num(f, 2)?, num(f, 3)? as u32)?
            }
            // write_from <offset> <len> <remote_addr> <rkey>: the source is
            // any heap memory (another process's allocation, say), keys
            // found by look-up.
            "write_from" => {
                let (off, len) = (num(f, 1)?, num(f, 2)? as usize);
                let addr = self.heap.addr_of(off)?;
                let k = self.heap.lookup(addr, len)?;
                let sge = softrdma_verbs::Sge {
                    addr,
                    length: len as u32,
                    lkey: softrdma_verbs::Lkey::from_raw(k.lkey),
                };
                let mut v = self.rdma_write(sge, num(f, 3)?, num(f, 4)? as u32)?;
                v["lkey"] = json!(k.lkey);
                v
            }
            // post_with <offset> <len> <lkey> <remote_addr> <rkey>: post with
            // an lkey given by the test (a stale one, say).
            "post_with" => {
                let addr = self.heap.addr_of(num(f, 1)?)?;
                let sge = softrdma_verbs::Sge {
                    addr,
                    length: num(f, 2)? as u32,
                    lkey: softrdma_verbs::Lkey::from_raw(num(f, 3)? as u32),
                };
                self.rdma_write(sge, num(f, 4)?, num(f, 5)? as u32)?
            }
            "trim" => json!({"released": self.heap.trim()?}),
            "reap" => json!({"reaped": self.heap.reap()?}),
            "check" => match self.heap.check(f.get(1) == Some(&"quiet")) {
                Ok(r) => json!({"ok": true, "active_blocks": r.active_blocks,
                    "free_descriptors": r.free_descriptors, "units_used": r.units_used,
                    "slots_used": r.slots_used, "recovered": r.recovered, "reaped": r.reaped}),
                Err(e) => json!({"ok": false, "error": e}),
            },
            "stats" => {
                let s = self.heap.stats();
                json!({"registrations": s.registrations, "deregistrations": s.deregistrations,
                    "stale_retired": s.stale_retired, "cache_hits": s.cache_hits,
                    "blocks_obtained": s.blocks_obtained, "blocks_released": s.blocks_released,
                    "blocks_reaped": s.blocks_reaped, "held": self.heap.registrations_held(),
                    "pinned_bytes": softrdma_verbs::pinned_bytes()})
            }
            // chaos <seed> <ops>: random allocations and frees of random
            // sizes (some large), then report; the kill test kills us
            // while this runs.
            "chaos" => {
                let (mut x, ops) = (num(f, 1)? | 1, num(f, 2)?);
                // Each buffer is filled with its own 8-byte tag (process id,
                // serial number) and checked when freed: an allocation that
                // overlapped another, in this process or another, shows up.
                let pid = std::process::id() as u64;
                let mut live: Vec<(HeapBuf, u64)> = Vec::new();
                let (mut done, mut serial, mut corrupt) = (0u64, 0u64, 0u64);
                println!("{}", json!({"chaos": "started"}));
                std::io::stdout().flush()?;
                while done < ops {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 48 && (x % 3 != 0 || live.is_empty()) {
                        let size = match x % 10 {
                            0 => 1 + (x >> 8) % (3 << 20),
                            1..=3 => 1 + (x >> 8) % (256 << 10),
                            _ => 1 + (x >> 8) % 4096,
                        };
                        let mut b = self.heap.alloc(size as usize)?;
                        serial += 1;
                        let tag = pid << 32 | serial;
                        fill_tag(&mut b, tag);
                        live.push((b, tag));
                    } else {
                        let i = (x >> 8) as usize % live.len();
                        let (b, tag) = live.swap_remove(i);
                        if !has_tag(&b, tag) {
                            corrupt += 1;
                        }
                    }
                    if x % 97 == 0 {
                        self.heap.trim()?;
                    }
                    done += 1;
                }
                for (b, tag) in &live {
                    if !has_tag(b, *tag) {
                        corrupt += 1;
                    }
                }
                json!({"ok": corrupt == 0, "ops": done, "corrupt": corrupt})
            }
            c => bail!("unknown command {c:?}"),
        })
    }

    fn rdma_read(
        &mut self,
        sge: softrdma_verbs::Sge,
        raddr: u64,
        rkey: u32,
    ) -> Result<serde_json::Value> {
        let (qp, cq) = self
            .out_qp
            .as_ref()
            .ok_or_else(|| anyhow!("not connected"))?;
        let id = self.next_wr;
        self.next_wr += 1;
        if let Err(e) = qp.post_send(&SendWr::read(
            id,
            sge,
            raddr,
            softrdma_verbs::Rkey::from_raw(rkey),
        )) {
            return Ok(json!({"refused": e.to_string()}));
        }
        let wc = cq
            .wait_one(Duration::from_secs(10))
            .ok_or_else(|| anyhow!("no Read completion"))?;
        Ok(json!({"ok": wc.is_ok(), "status": format!("{:?}", wc.status)}))
    }

    fn rdma_write(
        &mut self,
        sge: softrdma_verbs::Sge,
        raddr: u64,
        rkey: u32,
    ) -> Result<serde_json::Value> {
        let (qp, cq) = self
            .out_qp
            .as_ref()
            .ok_or_else(|| anyhow!("not connected"))?;
        let id = self.next_wr;
        self.next_wr += 1;
        if let Err(e) = qp.post_send(&SendWr::write(
            id,
            &[sge],
            raddr,
            softrdma_verbs::Rkey::from_raw(rkey),
        )) {
            return Ok(json!({"refused": e.to_string()}));
        }
        let wc = cq
            .wait_one(Duration::from_secs(10))
            .ok_or_else(|| anyhow!("no completion"))?;
        if !wc.is_ok() {
            return Ok(json!({"ok": false, "status": format!("{:?}", wc.status)}));
        }
        // A Write completes when sent; a Read of the same memory returns
        // only after the peer placed the Write (RDMA ordering), so the
        // peer can check its bytes once we answer.
        if self.scratch.is_none() {
            self.scratch = Some(self.heap.alloc(64)?);
        }
        let (qp, cq) = self.out_qp.as_ref().unwrap();
        let sge = self.scratch.as_ref().unwrap().sge(0, 1);
        qp.post_send(&SendWr::read(
            id + 1_000_000_000,
            sge,
            raddr,
            softrdma_verbs::Rkey::from_raw(rkey),
        ))?;
        let wc = cq
            .wait_one(Duration::from_secs(10))
            .ok_or_else(|| anyhow!("no Read completion"))?;
        Ok(json!({"ok": wc.is_ok(), "status": format!("{:?}", wc.status)}))
    }
}
