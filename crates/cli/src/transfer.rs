//! `softrdma transfer bench`: the transfer planner (`softrdma-transfer`)
//! against posting one WR per buffer, on a connected pair of QPs in this
//! process (iWARP over loopback TCP, and the same-host transport).

use anyhow::{bail, Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use softrdma_transfer::{exec, Limits, Op, Planner, Transfer};
use softrdma_verbs::*;
use std::time::{Duration, Instant};

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// 4,096 separate 64-byte Writes to contiguous remote memory, then
    /// 4,096 64-byte Reads of it into scattered buffers, each coalesced by
    /// the planner against posted one by one; then 1 GiB from 1,000
    /// scattered buffers (max message 4 MiB, 16 send slots), written and
    /// read back; everything checked byte for byte. Over iWARP/TCP and the
    /// same-host transport (TCP only with SOFTRDMA_SAME_HOST=0).
    Bench {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Rounds of 4,096 Writes (or Reads) per measurement.
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Size of the scattered transfer (default 1GiB).
        #[arg(long, default_value_t = 1 << 30)]
        big: u64,
        /// Mutation testing of the bench's own checks (tests only):
        /// `no-flush` inspects the target without flushing first,
        /// `corrupt:STAGE` flips one byte of the target (or, for the Reads,
        /// of the local buffers) just before the check of STAGE
        /// (`one-by-one`, `coalesced`, `read-one-by-one`, `read-coalesced`,
        /// `scattered-write`, `scattered-read`). Each must make the bench
        /// fail.
        #[arg(long, hide = true, value_delimiter = ',')]
        mutate: Vec<String>,
    },
    /// One-shot advertise/close against the conventional fast-register +
    /// Send + Local Invalidate, as an iSER-like write: driver calls per
    /// command and commands/s at 4 KiB and 64 KiB.
    Oneshot {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Commands per measurement.
        #[arg(long, default_value_t = 20000)]
        commands: u64,
        /// Commands in flight (1 to 16; several: one measurement each).
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
        depth: Vec<usize>,
    },
}

const T: Duration = Duration::from_secs(60);
const SLOTS: usize = 16;

struct Pair {
    _dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    spd: ProtectionDomain,
    _scq: CompletionQueue,
    _sqp: QueuePair,
}

/// Connects `client` to `server` through `l` (both in this process): the
/// server accepts on a thread of its own while the client connects.
pub(crate) fn connect_in_process(
    l: &Listener,
    client: &QueuePair,
    server: &QueuePair,
    params: &ConnParams,
) -> Result<()> {
    std::thread::scope(|s| -> Result<()> {
        let h = s.spawn(|| -> Result<()> {
            l.get_request()?.accept(server, params)?;
            Ok(())
        });
        client.connect(l.local_addr()?, params)?;
        h.join()
            .map_err(|_| anyhow::anyhow!("accept thread panicked"))??;
        Ok(())
    })
}

fn pair(same_host: bool) -> Result<Pair> {
    let dev = Device::open_default()?;
    let params = ConnParams {
        extensions: same_host,
        ..Default::default()
    };
    let l = dev.listen("127.0.0.1:0")?;
    let spd = dev.alloc_pd()?;
    let scq = dev.create_cq(64)?;
    let sqp = spd.create_qp(QpInitAttr::new(&scq))?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(4096)?;
    let mut a = QpInitAttr::new(&cq);
    a.caps.max_send_wr = 4096;
    a.caps.max_send_sge = dev.attr().max_sge as usize;
    let qp = pd.create_qp(a)?;
    connect_in_process(&l, &qp, &sqp, &params)?;
    if qp.conn_params().is_some_and(|n| n.same_host) != same_host {
        bail!("same-host transport: wanted {same_host}");
    }
    Ok(Pair {
        _dev: dev,
        pd,
        cq,
        qp,
        spd,
        _scq: scq,
        _sqp: sqp,
    })
}

fn emit(json: bool, v: serde_json::Value) {
    if json {
        println!("{v}");
    } else {
        let g = |k: &str| v.get(k).map(|x| x.to_string()).unwrap_or_default();
        let opt = |k: &str, f: &dyn Fn(&str) -> String| v.get(k).map(|x| f(&x.to_string()));
        let extra: Vec<String> = [
            opt("p99_round_us", &|x| format!("p99/round {x} us")),
            opt("cpu", &|x| format!("cpu {x}")),
            opt("speedup", &|x| format!("speedup {x}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        println!(
            "{:<28} {:<10} {:>9} GB/s {:>12} ops/s {:>5} WRs {}",
            g("bench").trim_matches('"'),
            g("transport").trim_matches('"'),
            g("gbps"),
            g("ops_per_s"),
            g("wrs"),
            extra.join("  ")
        );
    }
}

/// Makes sure every RDMA Write posted on `p.qp` before it is placed in
/// the target's memory (an RDMA Write completion at the initiator only says
/// that the source buffer may be reused; see [`exec::flush`]).
fn flush(p: &Pair, raddr: u64, rkey: u32) -> Result<()> {
    Ok(exec::flush(&p.qp, &p.cq, raddr, rkey, T)?)
}

/// The bench's mutations (see `--mutate`).
struct Mutations {
    no_flush: bool,
    corrupt: Vec<String>,
}

impl Mutations {
    fn parse(m: &[String]) -> Result<Mutations> {
        let mut out = Mutations {
            no_flush: false,
            corrupt: Vec::new(),
        };
        for x in m {
            match x.split_once(':') {
                None if x == "no-flush" => out.no_flush = true,
                Some(("corrupt", st))
                    if [
                        "one-by-one",
                        "coalesced",
                        "read-one-by-one",
                        "read-coalesced",
                        "scattered-write",
                        "scattered-read",
                    ]
                    .contains(&st) =>
                {
                    out.corrupt.push(st.to_string())
                }
                _ => bail!("unknown mutation {x:?}"),
            }
        }
        Ok(out)
    }

    /// Flushes unless mutated not to.
    fn flush(&self, p: &Pair, raddr: u64, rkey: u32) -> Result<()> {
        if self.no_flush {
            return Ok(());
        }
        flush(p, raddr, rkey)
    }

    /// Flips byte `at` of `mr` if `stage` is to be corrupted.
    fn corrupt(&self, stage: &str, mr: &MemoryRegion, at: usize) {
        if self.corrupt.iter().any(|s| s == stage) {
            let mut b = [0u8];
            mr.read_at(at, &mut b);
            mr.write_at(at, &[!b[0]]);
        }
    }
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One by one: each 64-byte buffer (every other 64 bytes of `local`) its
/// own WR and its own post call, to or from `raddr + 64 i`; one signaled
/// WR per SLOTS keeps the send queue from overflowing.
fn one_by_one(
    p: &Pair,
    op: Op,
    local: &MemoryRegion,
    rkey: u32,
    raddr: u64,
    n: usize,
) -> Result<usize> {
    let mut in_flight = 0;
    let rkey = softrdma_verbs::Rkey::from_raw(rkey);
    for i in 0..n {
        let last = i + 1 == n;
        let (sge, to) = (local.sge(i * 128, 64), raddr + i as u64 * 64);
        let mut wr = match op {
            Op::Write => SendWr::write(i as u64, &[sge], to, rkey),
            Op::Read => SendWr::read(i as u64, sge, to, rkey),
        };
        if !((i + 1) % SLOTS == 0 || last) {
            wr.flags = SendFlags::NONE;
        }
        p.qp.post_send(&wr)?;
        in_flight += 1;
        if in_flight == SLOTS || last {
            // Wait for the signaled WR: it retires all before it.
            let wc = match p.cq.poll_one() {
                Some(wc) => wc,
                None => p.cq.wait_one(T).context("no completion")?,
            };
            if wc.status != WcStatus::Success {
                bail!("WR {} failed: {:?}", wc.wr_id, wc.status);
            }
            in_flight = 0;
        }
    }
    Ok(n)
}

/// This process's CPU seconds (both ends and their progress threads).
fn cpu_now() -> f64 {
    crate::bench::cpu_secs(None).unwrap_or(0.0)
}

/// Rounds of one measurement: the time of each round (ns), the wall time
/// and CPU seconds per wall second.
struct Timed {
    secs: f64,
    rounds_ns: Vec<u64>,
    cpu: f64,
}

impl Timed {
    fn run(rounds: usize, mut round: impl FnMut() -> Result<()>) -> Result<Timed> {
        let mut rounds_ns = Vec::with_capacity(rounds);
        let (t0, c0) = (Instant::now(), cpu_now());
        for _ in 0..rounds {
            let t = Instant::now();
            round()?;
            rounds_ns.push(t.elapsed().as_nanos() as u64);
        }
        let secs = t0.elapsed().as_secs_f64();
        Ok(Timed {
            secs,
            rounds_ns,
            cpu: (cpu_now() - c0) / secs.max(1e-9),
        })
    }

    /// The row: rate, p50/p99 of a round of `n` transfers, CPU.
    fn row(&self, bench: &str, transport: &str, n: usize, wrs: usize) -> serde_json::Value {
        let mut sorted = self.rounds_ns.clone();
        sorted.sort_unstable();
        let q = |f: f64| {
            let i = ((sorted.len() as f64 * f).ceil() as usize).clamp(1, sorted.len()) - 1;
            r3(sorted[i] as f64 / 1e3)
        };
        let rounds = self.rounds_ns.len();
        serde_json::json!({
            "bench": bench, "transport": transport,
            "gbps": r3((n * 64 * rounds) as f64 / self.secs / 1e9),
            "ops_per_s": ((n * rounds) as f64 / self.secs).round(),
            "wrs": wrs, "rounds": rounds,
            "p50_round_us": q(0.5), "p99_round_us": q(0.99),
            "cpu": r3(self.cpu),
        })
    }

    fn ops(&self, n: usize) -> f64 {
        (n * self.rounds_ns.len()) as f64 / self.secs
    }
}

/// 4,096 64-byte Writes (from every other 64 bytes of a local region to
/// contiguous remote memory) or Reads (back into every other 64 bytes of
/// a cleared local region): posted one by one, then coalesced by the
/// planner; each measurement checked byte for byte.
fn small_ops(
    json: bool,
    p: &Pair,
    op: Op,
    transport: &str,
    rounds: usize,
    mutate: &Mutations,
) -> Result<()> {
    let n = 4096usize;
    let (name, stages) = match op {
        Op::Write => ("write64x4096", ["one-by-one", "coalesced"]),
        Op::Read => ("read64x4096", ["read-one-by-one", "read-coalesced"]),
    };
    let local = p.pd.alloc_mr(n * 128, Access::LOCAL_WRITE)?;
    let pat: Vec<u8> = (0..n * 128).map(|i| (i * 7 + 3) as u8).collect();
    let remote = p
        .spd
        .alloc_mr(n * 64, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let (rkey, raddr) = (remote.rkey(), remote.addr());
    // Reads: the remote bytes are a pattern, the local ones a sentinel
    // (between the buffers it must stay). Writes: the other way round.
    const SENTINEL: u8 = 0xEE;
    let rpat: Vec<u8> = (0..n * 64).map(|i| (i * 13 + 5) as u8 ^ 0x40).collect();
    let reset = || match op {
        Op::Write => remote.write_at(0, &vec![0; n * 64]),
        Op::Read => {
            remote.write_at(0, &rpat);
            local.write_at(0, &vec![SENTINEL; n * 128]);
        }
    };
    if op == Op::Write {
        local.write_at(0, &pat);
    }
    // Every check first flushes (placement before inspection; a Read's
    // completion already means its bytes are here), and the memory is
    // reset before each measurement, so each check sees only the bytes of
    // its own run.
    let check = |what: &str| -> Result<()> {
        match op {
            Op::Write => {
                mutate.flush(p, raddr, rkey.raw())?;
                mutate.corrupt(what, &remote, 1234 * 64 + 17);
                let got = remote.to_vec();
                for i in 0..n {
                    if got[i * 64..i * 64 + 64] != pat[i * 128..i * 128 + 64] {
                        bail!("{what}: write {i} landed wrong");
                    }
                }
            }
            Op::Read => {
                mutate.corrupt(what, &local, 1234 * 128 + 17);
                let got = local.to_vec();
                for i in 0..n {
                    if got[i * 128..i * 128 + 64] != rpat[i * 64..i * 64 + 64]
                        || got[i * 128 + 64..i * 128 + 128]
                            .iter()
                            .any(|&b| b != SENTINEL)
                    {
                        bail!("{what}: read {i} landed wrong");
                    }
                }
            }
        }
        Ok(())
    };
    reset();
    let one = Timed::run(rounds, || {
        one_by_one(p, op, &local, rkey.raw(), raddr, n).map(|_| ())
    })?;
    check(stages[0])?;
    emit(
        json,
        one.row(&format!("{name}_one_by_one"), transport, n, n),
    );
    // Coalesced by the planner.
    let transfers: Vec<Transfer> = (0..n)
        .map(|i| Transfer {
            op,
            local: vec![local.sge(i * 128, 64)],
            remote_addr: raddr + i as u64 * 64,
            rkey: rkey.raw(),
        })
        .collect();
    let limits = Limits::of_device(p.qp.pd().device(), SLOTS);
    let p_wrs = Planner::new(limits, transfers.clone()).announced().0;
    let mut done = 0usize;
    reset();
    let co = Timed::run(rounds, || {
        let st = exec::run(
            &p.qp,
            &p.cq,
            Planner::new(limits, transfers.clone()),
            T,
            |_| done += 1,
        )?;
        if st.wrs != p_wrs {
            bail!("{} WRs posted, {p_wrs} announced", st.wrs);
        }
        Ok(())
    })?;
    if done != n * rounds {
        bail!("{done} transfer completions, expected {}", n * rounds);
    }
    check(stages[1])?;
    let mut row = co.row(&format!("{name}_coalesced"), transport, n, p_wrs);
    row["speedup"] = r3(co.ops(n) / one.ops(n)).into();
    emit(json, row);
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    let (json, rounds, big, mutate) = match a.cmd {
        Cmd::Bench {
            json,
            rounds,
            big,
            mutate,
        } => (json, rounds, big, Mutations::parse(&mutate)?),
        Cmd::Oneshot {
            json,
            commands,
            depth,
        } => return crate::oneshot::run(json, commands, &depth),
    };
    // SOFTRDMA_SAME_HOST=0 turns the same-host transport off for every
    // device: then only the TCP path is measured.
    let transports: &[bool] = if DeviceConfig::default().same_host {
        &[false, true]
    } else {
        eprintln!("same-host transport off (SOFTRDMA_SAME_HOST=0): iWARP/TCP only");
        &[false]
    };
    for &same_host in transports {
        let transport = if same_host { "same-host" } else { "tcp" };
        let p = pair(same_host)?;
        for op in [Op::Write, Op::Read] {
            small_ops(json, &p, op, transport, rounds, &mutate)?;
        }
        let limits = Limits::of_device(p.qp.pd().device(), SLOTS);

        // 1 GiB from 1,000 scattered buffers.
        let bufs = 1000usize;
        let mut sizes = Vec::with_capacity(bufs);
        let mut x = 0x9E3779B97F4A7C15u64;
        for _ in 0..bufs {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes.push(1 + x % (2 * big / bufs as u64));
        }
        let sum: u64 = sizes.iter().sum();
        // Scale to exactly `big` bytes.
        let mut acc = 0;
        for (i, s) in sizes.iter_mut().enumerate() {
            *s = if i + 1 == bufs {
                big - acc
            } else {
                (*s * big / sum).max(1)
            };
            acc += *s;
        }
        let gap = 4096;
        let span = big as usize + bufs * gap;
        let scattered = p.pd.alloc_mr(span, Access::LOCAL_WRITE)?;
        let rbig = p
            .spd
            .alloc_mr(big as usize, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
        // Touch every page first (registration pins memory on RDMA NICs;
        // here fresh memory would make the first run measure page faults).
        let chunk = vec![0u8; 64 << 20];
        for off in (0..big as usize).step_by(chunk.len()) {
            let n = chunk.len().min(big as usize - off);
            rbig.write_at(off, &chunk[..n]);
        }
        let mut sgl = Vec::with_capacity(bufs);
        let mut want = Vec::with_capacity(big as usize);
        let mut at = 0usize;
        for (i, &s) in sizes.iter().enumerate() {
            let s = s as usize;
            let data: Vec<u8> = (0..s).map(|k| (k as u64 * 31 + i as u64) as u8).collect();
            scattered.write_at(at, &data);
            want.extend_from_slice(&data);
            sgl.push(scattered.sge(at, s));
            at += s + gap;
        }
        let big_limits = Limits {
            max_msg: 4 << 20,
            max_sge: limits.max_sge,
            max_sge_rd: limits.max_sge_rd,
            slots: SLOTS,
        };
        for op in [Op::Write, Op::Read] {
            if op == Op::Read {
                // Clear the local buffers, read everything back.
                for s in &sgl {
                    scattered.write_at(
                        (s.addr - scattered.addr()) as usize,
                        &vec![0; s.length as usize],
                    );
                }
            }
            let t = Transfer {
                op,
                local: sgl.clone(),
                remote_addr: rbig.addr(),
                rkey: rbig.rkey().raw(),
            };
            let planner = Planner::new(big_limits, vec![t]);
            let wrs = planner.announced().0;
            let mut done = 0;
            let (t0, c0) = (Instant::now(), cpu_now());
            let st = exec::run(&p.qp, &p.cq, planner, T, |_| done += 1)?;
            let secs = t0.elapsed().as_secs_f64();
            let cpu = (cpu_now() - c0) / secs.max(1e-9);
            if done != 1 || st.wrs != wrs || st.bytes != big {
                bail!(
                    "scattered {op:?}: {done} completions, {} WRs of {wrs}, {} bytes",
                    st.wrs,
                    st.bytes
                );
            }
            // Byte for byte (a Read completion means the bytes are in the
            // local buffers; a Write completion does not mean they are in
            // the target's: flush first).
            let ok = match op {
                Op::Write => {
                    mutate.flush(&p, rbig.addr(), rbig.rkey().raw())?;
                    mutate.corrupt("scattered-write", &rbig, big as usize / 2);
                    rbig.to_vec() == want
                }
                Op::Read => {
                    mutate.corrupt("scattered-read", &scattered, 0);
                    let mut got = Vec::with_capacity(big as usize);
                    for s in &sgl {
                        let mut b = vec![0; s.length as usize];
                        scattered.read_at((s.addr - scattered.addr()) as usize, &mut b);
                        got.extend_from_slice(&b);
                    }
                    got == want
                }
            };
            if !ok {
                bail!("scattered {op:?}: bytes differ");
            }
            emit(
                json,
                serde_json::json!({
                    "bench": if op == Op::Write { "scattered_1000_write" } else { "scattered_1000_read" },
                    "transport": transport, "bytes": big, "buffers": bufs,
                    "max_msg": big_limits.max_msg, "slots": SLOTS,
                    "gbps": r3(big as f64 / secs / 1e9), "ops_per_s": r3(1.0 / secs),
                    "wrs": wrs, "signaled": st.signaled, "checked": true,
                    "cpu": r3(cpu),
                }),
            );
        }
    }
    Ok(())
}
