//! Deterministic simulation of two engines (issue 19): two queue pairs of
//! the real engine connected by a simulated TCP connection
//! (`softrdma_verbs::pipe`) that splits, merges and delays the byte
//! stream, all driven from this thread by a seed. Random workloads of
//! Send, Send with Invalidate, Immediate Data, RDMA Write (with and
//! without immediate), RDMA Read (into one SGE or up to four),
//! Fetch-and-Add and Compare-and-Swap run
//! both ways at once, with MPA CRC on and off, MPA revision 1 and 2, and
//! each kind of peer-to-peer RTR; some seeds cut the connection (a reset
//! or a disconnect) at a random moment.
//!
//! What every seed checks:
//! - every completed Read returns exactly the target's bytes as of its
//!   posting (a model of each target memory is kept in posting order: RDMA
//!   places Writes, atomics and Reads of one QP in order, and a Write that
//!   would overlap an outstanding Read is posted with the fence, which
//!   must hold it back until that Read completed);
//! - every atomic returns the model's old value and updates it;
//! - every Send arrives in order, whole, with its invalidation or
//!   immediate value, and the invalidated region is invalid by then;
//! - every work request, send or receive, completes exactly once (flushed
//!   or not), send completions in posting order, and nothing completes
//!   successfully after the first flush on that queue;
//! - the simulation never stalls: while work is outstanding, something can
//!   always move (no deadlock between the two engines);
//! - no Read's sink binding (the STag bound over a scattered Read's SGEs)
//!   outlives its WR, flushed or not.
//!
//! CI runs `SEEDS` seeds; `SOFTRDMA_SOAK=1` runs `SOAK_SEEDS` (or
//! `SOFTRDMA_SIM_SEEDS=N`). A failure prints its seed; replay it alone with
//! `SOFTRDMA_SIM_SEED=<seed> cargo test -p softrdma-verbs --test sim`.

use softrdma_verbs::pipe::Pipe;
use softrdma_verbs::sim::{self, Rtr, SimParams};
use softrdma_verbs::*;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

const SEEDS: u64 = 2000;
const SOAK_SEEDS: u64 = 100_000;

/// The region each end exposes to the peer.
const TARGET_LEN: usize = 32 * 1024;
/// Fetch-and-add and compare-and-swap hit the first words of the target.
const ATOMIC_WORDS: usize = 8;
/// Local source / sink slots: one per outstanding send WR.
const SLOTS: usize = 16;
const SLOT_LEN: usize = 16 * 1024;
/// Receive buffers posted at once, and their size.
const RECVS: usize = 8;
const RECV_LEN: usize = 2048;
/// Regions a peer may invalidate with Send with Invalidate.
const INVAL_MRS: usize = 4;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Two devices shared by all seeds (each seed makes its own QPs and
/// regions; devices start progress threads, which simulated connections
/// never use).
fn devices() -> &'static (Device, Device) {
    static D: OnceLock<(Device, Device)> = OnceLock::new();
    D.get_or_init(|| {
        (
            Device::open_default().unwrap(),
            Device::open_default().unwrap(),
        )
    })
}

/// A send WR posted and not yet completed, with what its completion must
/// show.
#[derive(Debug)]
enum Expect {
    /// Nothing to check but the status (Write, Send, ...).
    Done,
    /// A Read of the peer's target from byte `off`: the sink slot must
    /// hold these bytes.
    Read { off: usize, bytes: Vec<u8> },
    /// An atomic: the result slot must hold the old value.
    Atomic { old: u64 },
}

#[derive(Debug)]
struct Posted {
    wr_id: u64,
    /// The local slot it reads from or writes into.
    slot: usize,
    expect: Expect,
}

impl Posted {
    /// The byte range of the peer's target an outstanding Read covers.
    fn reads(&self) -> Option<(usize, usize)> {
        match &self.expect {
            Expect::Read { off, bytes } => Some((*off, off + bytes.len())),
            _ => None,
        }
    }
}

/// A message the peer sent us, in order: what its receive completion must
/// show.
#[derive(Debug)]
struct Incoming {
    data: Vec<u8>,
    inval: Option<Rkey>,
    imm: Option<u32>,
    /// Write with immediate: no bytes land in the receive buffer.
    write_imm: bool,
}

struct End {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    target: MemoryRegion,
    /// The model of `target` (changed only by the peer's Writes and
    /// atomics, in the order the peer posted them).
    model: Vec<u8>,
    local: MemoryRegion,
    free_slots: Vec<usize>,
    rbuf: MemoryRegion,
    /// Receive slots posted, in posting order (wr_id = RECV | slot).
    recvs: VecDeque<u64>,
    free_recv: Vec<usize>,
    inval: Vec<MemoryRegion>,
    /// Invalidatable regions the peer has not been sent away with yet.
    inval_free: Vec<usize>,
    posted: VecDeque<Posted>,
    incoming: VecDeque<Incoming>,
    next_wr: u64,
    /// A send completion came back flushed: nothing later may succeed.
    sq_flushed: bool,
    rq_flushed: bool,
    ops_left: usize,
    completed: u64,
}

const RECV: u64 = 1 << 63;

impl End {
    fn new(dev: &Device) -> End {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4096).unwrap();
        let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let target = pd.alloc_mr(TARGET_LEN, all).unwrap();
        let inval = (0..INVAL_MRS)
            .map(|_| {
                pd.alloc_mr_with(
                    64,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    RegOptions {
                        invalidatable: true,
                        ..Default::default()
                    },
                )
                .unwrap()
            })
            .collect();
        End {
            local: pd.alloc_mr(SLOTS * SLOT_LEN, Access::LOCAL_WRITE).unwrap(),
            rbuf: pd.alloc_mr(RECVS * RECV_LEN, Access::LOCAL_WRITE).unwrap(),
            model: vec![0; TARGET_LEN],
            free_slots: (0..SLOTS).rev().collect(),
            recvs: VecDeque::new(),
            free_recv: (0..RECVS).rev().collect(),
            inval,
            inval_free: (0..INVAL_MRS).collect(),
            posted: VecDeque::new(),
            incoming: VecDeque::new(),
            next_wr: 1,
            sq_flushed: false,
            rq_flushed: false,
            ops_left: 0,
            completed: 0,
            target,
            pd,
            cq,
            qp,
        }
    }

    fn post_recvs(&mut self) {
        if self.qp.state() != QpState::Rts && self.qp.state() != QpState::Init {
            return;
        }
        while let Some(slot) = self.free_recv.pop() {
            let id = RECV | slot as u64;
            let wr = RecvWr::new(id, &[self.rbuf.sge(slot * RECV_LEN, RECV_LEN)]);
            if self.qp.post_recv(&wr).is_err() {
                self.free_recv.push(slot);
                return;
            }
            self.recvs.push_back(id);
        }
    }
}

/// One seed's world.
struct World {
    rng: Rng,
    seed: u64,
    pipe: Arc<Pipe>,
    ends: [End; 2],
    params: SimParams,
    /// The step at which the connection is cut, and how.
    fault: Option<(u64, Fault)>,
    faulted: bool,
    steps: u64,
    /// The receiver stopped at its budget: it runs again before anything
    /// sleeps (bytes it read ahead are invisible to the poller), as the
    /// progress thread does.
    more: [bool; 2],
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Reset(usize),
    Disconnect(usize),
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed);
        let revision = 1 + rng.below(2) as u8;
        let rtr = match (revision, rng.below(3)) {
            (2, 1) => Some(Rtr::Write),
            (2, 2) => Some(Rtr::Read),
            _ => None,
        };
        let params = SimParams {
            revision,
            crc: rng.chance(50),
            rtr,
            initiator_ird: 1 + rng.below(8) as u16,
            responder_ird: 1 + rng.below(8) as u16,
            rfc7306: true,
            large_segments: rng.chance(25),
            seg: [536, 1460, 4096, 9000][rng.below(4) as usize],
            cap: [64, 1000, 8 * 1024, 256 * 1024][rng.below(4) as usize],
            max_read: [1, 7, 100, 1 << 20][rng.below(4) as usize],
            seed: rng.next(),
        };
        let (d0, d1) = devices();
        let mut ends = [End::new(d0), End::new(d1)];
        for e in &mut ends {
            e.ops_left = 20 + rng.below(120) as usize;
            // Some receives before the connection exists (the usual
            // order), the rest as the run goes.
            e.post_recvs();
        }
        let pipe = sim::connect(&ends[0].qp, &ends[1].qp, &params).unwrap();
        let fault = rng.chance(20).then(|| {
            let side = rng.below(2) as usize;
            let f = if rng.chance(50) {
                Fault::Reset(side)
            } else {
                Fault::Disconnect(side)
            };
            (rng.below(400), f)
        });
        World {
            rng,
            seed,
            pipe,
            ends,
            params,
            fault,
            faulted: false,
            steps: 0,
            more: [false; 2],
        }
    }

    fn fail(&self, what: &str) -> ! {
        let mut state = String::new();
        for (i, e) in self.ends.iter().enumerate() {
            state +=
                &format!(
                "\nend {i}: {:?}, {} ops left, posted {:?}, receives posted {:x?}, {} messages \
                 expected, ready {:?}, in flight {}, unread {}",
                e.qp.state(),
                e.ops_left,
                e.posted.iter().map(|p| (p.wr_id, p.reads())).collect::<Vec<_>>(),
                e.recvs,
                e.incoming.len(),
                self.pipe.ready(i),
                self.pipe.in_flight(i),
                self.pipe.unread(i),
            );
        }
        panic!(
            "seed {}: {what}\nparams {:?}\nfault {:?}\nstep {}{state}",
            self.seed, self.params, self.fault, self.steps
        );
    }

    /// Posts one random send WR from `me` to the peer, if it can.
    fn post_op(&mut self, me: usize) -> bool {
        if self.ends[me].ops_left == 0 || self.ends[me].free_slots.is_empty() {
            return false;
        }
        if self.ends[me].qp.state() != QpState::Rts {
            return false;
        }
        let rng = &mut self.rng;
        let (a, b) = self.ends.split_at_mut(1);
        let (e, p) = if me == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        let wr_id = e.next_wr;
        let slot = *e.free_slots.last().unwrap();
        let base = slot * SLOT_LEN;
        // A receive the peer has posted and no earlier message of ours
        // will take.
        // (`incoming`: messages we sent that each take one of its receives.)
        let recv_free = p.recvs.len() > p.incoming.len();
        let overlaps_read = |e: &End, lo: usize, hi: usize| {
            e.posted
                .iter()
                .filter_map(Posted::reads)
                .any(|(rl, rh)| lo < rh && rl < hi)
        };
        let len_pick = |rng: &mut Rng, max: usize| match rng.below(4) {
            0 => rng.below(9) as usize,
            1 => rng.below(200) as usize,
            2 => rng.below(2048) as usize,
            _ => rng.below(max as u64 + 1) as usize,
        };
        let kind = rng.below(9);
        let (wr, posted) = match kind {
            // RDMA Write (with immediate data when a receive is free).
            0..=2 => {
                let len = len_pick(rng, SLOT_LEN.min(TARGET_LEN));
                let off = rng.below((TARGET_LEN - len) as u64 + 1) as usize;
                let data = rng.bytes(len);
                e.local.write_at(base, &data);
                let imm = (kind == 2 && recv_free).then(|| rng.next() as u32);
                let to = p.target.addr() + off as u64;
                let sge = [e.local.sge(base, len)];
                let mut wr = match imm {
                    Some(v) => SendWr::write_imm(wr_id, &sge, to, p.target.rkey(), v),
                    None => SendWr::write(wr_id, &sge, to, p.target.rkey()),
                };
                if overlaps_read(e, off, off + len) || rng.chance(5) {
                    wr = wr.fenced();
                }
                p.model[off..off + len].copy_from_slice(&data);
                if let Some(v) = imm {
                    p.incoming.push_back(Incoming {
                        data: Vec::new(),
                        inval: None,
                        imm: Some(v),
                        write_imm: true,
                    });
                }
                (wr, Expect::Done)
            }
            // RDMA Read.
            3 | 4 => {
                let len = len_pick(rng, SLOT_LEN.min(TARGET_LEN));
                let off = rng.below((TARGET_LEN - len) as u64 + 1) as usize;
                // Poison the sink: a Read that placed nothing shows.
                e.local.write_at(base, &vec![0xA5; len]);
                // One SGE, or the slot cut into up to four (the engine
                // then binds one sink STag over them).
                let mut cuts: Vec<usize> = (0..rng.below(4))
                    .map(|_| rng.below(len as u64 + 1) as usize)
                    .collect();
                cuts.extend([0, len]);
                cuts.sort_unstable();
                let sgl: Vec<Sge> = cuts
                    .windows(2)
                    .map(|c| e.local.sge(base + c[0], c[1] - c[0]))
                    .collect();
                let mut wr =
                    SendWr::read_sgl(wr_id, &sgl, p.target.addr() + off as u64, p.target.rkey());
                if rng.chance(5) {
                    wr = wr.fenced();
                }
                let bytes = p.model[off..off + len].to_vec();
                (wr, Expect::Read { off, bytes })
            }
            // Atomics.
            5 => {
                let word = rng.below(ATOMIC_WORDS as u64) as usize * 8;
                let old = u64::from_ne_bytes(p.model[word..word + 8].try_into().unwrap());
                e.local.write_at(base, &[0x5A; 8]);
                let to = p.target.addr() + word as u64;
                let mut wr = if rng.chance(50) {
                    let add = rng.next();
                    p.model[word..word + 8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                    SendWr::fetch_add(wr_id, e.local.sge(base, 8), to, p.target.rkey(), add)
                } else {
                    let compare = if rng.chance(50) { old } else { rng.next() };
                    let swap = rng.next();
                    if compare == old {
                        p.model[word..word + 8].copy_from_slice(&swap.to_ne_bytes());
                    }
                    SendWr::cmp_swap(
                        wr_id,
                        e.local.sge(base, 8),
                        to,
                        p.target.rkey(),
                        compare,
                        swap,
                    )
                };
                if overlaps_read(e, word, word + 8) {
                    wr = wr.fenced();
                }
                (wr, Expect::Atomic { old })
            }
            // Send, Send with Invalidate, Immediate Data: each takes one
            // of the peer's receives.
            _ => {
                if !recv_free {
                    return false;
                }
                let choice = rng.below(4);
                if choice == 3 {
                    let imm = rng.next() as u32;
                    p.incoming.push_back(Incoming {
                        data: Vec::new(),
                        inval: None,
                        imm: Some(imm),
                        write_imm: false,
                    });
                    (SendWr::send_imm(wr_id, imm), Expect::Done)
                } else {
                    let len = len_pick(rng, RECV_LEN);
                    let data = rng.bytes(len);
                    e.local.write_at(base, &data);
                    let sge = [e.local.sge(base, len)];
                    let inval = (choice == 2 && !p.inval_free.is_empty()).then(|| {
                        let i = p
                            .inval_free
                            .remove(rng.below(p.inval_free.len() as u64) as usize);
                        p.inval[i].rkey()
                    });
                    p.incoming.push_back(Incoming {
                        data,
                        inval,
                        imm: None,
                        write_imm: false,
                    });
                    match inval {
                        Some(stag) => (SendWr::send_inv(wr_id, &sge, stag), Expect::Done),
                        None => (SendWr::send(wr_id, &sge), Expect::Done),
                    }
                }
            }
        };
        e.posted.push_back(Posted {
            wr_id,
            slot,
            expect: posted,
        });
        e.free_slots.pop();
        e.next_wr += 1;
        e.ops_left -= 1;
        post(e, &wr, me, self.seed)
    }

    /// Checks the completions waiting on `me`'s CQ.
    fn reap(&mut self, me: usize) -> bool {
        let mut any = false;
        while let Some(wc) = self.ends[me].cq.poll_one() {
            any = true;
            if std::env::var_os("SOFTRDMA_SIM_TRACE").is_some() {
                eprintln!("step {} end {me}: {wc:?}", self.steps);
            }
            if let Err(msg) = self.check(me, &wc) {
                self.fail(&format!("end {me}: {msg}\n{wc:?}"));
            }
        }
        any
    }

    fn check(&mut self, me: usize, wc: &WorkCompletion) -> Result<(), String> {
        let e = &mut self.ends[me];
        e.completed += 1;
        if wc.wr_id & RECV != 0 {
            let want = e.recvs.pop_front().ok_or("a receive completed twice")?;
            if want != wc.wr_id {
                return Err(format!("receive {want:#x} expected first"));
            }
            let slot = (wc.wr_id & !RECV) as usize;
            e.free_recv.push(slot);
            if !wc.is_ok() {
                e.rq_flushed = true;
                return Ok(());
            }
            if e.rq_flushed {
                return Err("a receive succeeded after a flushed one".into());
            }
            let m = e.incoming.pop_front().ok_or("a message nobody sent")?;
            if m.write_imm {
                if wc.opcode != WcOpcode::RecvWithImm || wc.imm_data != m.imm {
                    return Err(format!("expected Write with immediate {:?}", m.imm));
                }
            } else if m.imm.is_some() {
                if wc.imm_data != m.imm {
                    return Err(format!("expected immediate data {:?}", m.imm));
                }
            } else {
                if wc.byte_len as usize != m.data.len() {
                    return Err(format!("expected {} bytes", m.data.len()));
                }
                let mut got = vec![0u8; m.data.len()];
                e.rbuf.read_at(slot * RECV_LEN, &mut got);
                if got != m.data {
                    return Err("a Send's bytes differ".into());
                }
                if wc.invalidated_rkey != m.inval {
                    return Err(format!("expected invalidation of {:?}", m.inval));
                }
                if let Some(stag) = m.inval {
                    let i = e
                        .inval
                        .iter()
                        .position(|r| r.rkey() == Rkey::from_raw(stag.raw()))
                        .unwrap();
                    if e.inval[i].is_valid() {
                        return Err("the invalidated region is still valid".into());
                    }
                    e.inval[i].set_valid(true);
                    e.inval_free.push(i);
                }
            }
            return Ok(());
        }
        let p = e.posted.pop_front().ok_or("a send WR completed twice")?;
        if p.wr_id != wc.wr_id {
            return Err(format!("send WR {} expected first (order)", p.wr_id));
        }
        e.free_slots.push(p.slot);
        if !wc.is_ok() {
            if wc.status != WcStatus::WrFlushErr && !self.faulted {
                return Err(format!("failed without a fault: {:?}", wc.status));
            }
            e.sq_flushed = true;
            return Ok(());
        }
        if e.sq_flushed {
            return Err("a send WR succeeded after a flushed one".into());
        }
        match p.expect {
            Expect::Done => {}
            Expect::Read { bytes, .. } => {
                let mut got = vec![0u8; bytes.len()];
                e.local.read_at(p.slot * SLOT_LEN, &mut got);
                if got != bytes {
                    let at = got.iter().zip(&bytes).position(|(a, b)| a != b);
                    return Err(format!(
                        "a Read returned other bytes than the target held (first at {at:?} of {})",
                        bytes.len()
                    ));
                }
            }
            Expect::Atomic { old } => {
                let mut got = [0u8; 8];
                e.local.read_at(p.slot * SLOT_LEN, &mut got);
                if u64::from_ne_bytes(got) != old {
                    return Err(format!(
                        "an atomic returned {:#x}, the target held {old:#x}",
                        u64::from_ne_bytes(got)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Everything posted has completed, nothing more will be posted, and
    /// the connection is quiet (every byte sent was received).
    fn finished(&self) -> bool {
        let ends_done = self.ends.iter().all(|e| {
            let err = e.qp.state() == QpState::Error;
            (e.ops_left == 0 || err)
                && e.posted.is_empty()
                && (if err {
                    e.recvs.is_empty()
                } else {
                    e.incoming.is_empty()
                })
        });
        ends_done
            && (0..2).all(|s| {
                let r = self.pipe.ready(s);
                self.pipe.in_flight(s) == 0
                    && (self.pipe.unread(s) == 0 || self.pipe.is_closed(1 - s))
                    && !r.input
                    && !self.more[s]
                    && !r.output
            })
    }

    /// One step: something random that a network and two hosts could do.
    /// Returns whether anything moved.
    fn step(&mut self) -> bool {
        self.steps += 1;
        if let Some((at, f)) = self.fault {
            if !self.faulted && self.steps >= at {
                self.faulted = true;
                match f {
                    Fault::Reset(side) => {
                        self.pipe.reset(side);
                        // The crashed end's engine goes down too.
                        self.ends[side].qp.disconnect();
                    }
                    Fault::Disconnect(side) => self.ends[side].qp.disconnect(),
                }
                return true;
            }
        }
        let side = self.rng.below(2) as usize;
        match self.rng.below(6) {
            0 => self.post_op(side),
            1 => {
                let n = 1 + self.rng.below(3000) as usize;
                self.pipe.deliver(side, n) > 0
            }
            2 => self.reap(side),
            3 => {
                self.ends[side].post_recvs();
                false
            }
            _ => self.drive(side),
        }
    }

    /// What a progress thread would do for `side` now.
    fn drive(&mut self, side: usize) -> bool {
        let r = self.pipe.ready(side);
        let qp = &self.ends[side].qp;
        let mut moved = false;
        if r.input || self.more[side] {
            self.more[side] = sim::on_readable(qp, 1 + self.rng.below(8) as usize);
            moved = true;
        }
        if r.output {
            sim::on_writable(qp);
            moved = true;
        }
        if r.timer && self.pipe.take_timer(side) {
            sim::on_timer(qp);
            moved = true;
        }
        moved
    }

    /// Whether anything at all could still move.
    fn can_move(&self) -> bool {
        (0..2).any(|s| {
            let r = self.pipe.ready(s);
            r.input
                || self.more[s]
                || r.output
                || r.timer
                || self.pipe.in_flight(s) > 0
                || !self.ends[s].cq.is_empty()
                || (self.ends[s].ops_left > 0
                    && self.ends[s].qp.state() == QpState::Rts
                    && !self.ends[s].free_slots.is_empty())
                || !self.ends[s].free_recv.is_empty()
        })
    }

    fn run(mut self) {
        let mut idle = 0u32;
        while !self.finished() {
            if self.step() {
                idle = 0;
            } else {
                idle += 1;
                if idle > 10_000 && !self.can_move() {
                    self.fail("stalled: work outstanding and nothing can move");
                }
                if idle > 200_000 {
                    self.fail("no progress in 200000 steps (livelock)");
                }
            }
            if self.steps > 5_000_000 {
                self.fail("did not finish in 5M steps");
            }
        }
        // A clean run leaves both QPs connected and every receive posted;
        // in a faulted one everything outstanding came back flushed.
        if !self.faulted {
            for (i, e) in self.ends.iter().enumerate() {
                if e.qp.state() != QpState::Rts {
                    self.fail(&format!("end {i} left RTS without a fault"));
                }
                if !e.incoming.is_empty() {
                    self.fail(&format!("end {i}: a message never arrived"));
                }
                let mut got = vec![0u8; TARGET_LEN];
                e.target.read_at(0, &mut got);
                if let Some(at) = got.iter().zip(&e.model).position(|(a, b)| a != b) {
                    self.fail(&format!(
                        "end {i}: the target differs from the peer's Writes at byte {at}"
                    ));
                }
            }
        }
        // Every WR has completed: no Read's sink binding is left.
        for (i, e) in self.ends.iter().enumerate() {
            let pd = e.pd.id();
            let info = e.pd.device().info();
            let left = info.mrs.iter().filter(|m| m.fast_reg && m.pd == pd);
            if left.count() != 0 {
                self.fail(&format!("end {i}: a Read's sink binding outlived it"));
            }
        }
    }
}

fn post(e: &mut End, wr: &SendWr, me: usize, seed: u64) -> bool {
    if let Err(err) = e.qp.post_send(wr) {
        // Only a QP that left RTS refuses a WR (a fault cut it).
        assert_ne!(
            e.qp.state(),
            QpState::Rts,
            "seed {seed}: end {me} refused {wr:?}: {err}"
        );
        let p = e.posted.pop_back().unwrap();
        e.free_slots.push(p.slot);
        return false;
    }
    true
}

fn seeds() -> std::ops::Range<u64> {
    if let Some(s) = std::env::var("SOFTRDMA_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return s..s + 1;
    }
    let n = std::env::var("SOFTRDMA_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if std::env::var_os("SOFTRDMA_SOAK").is_some() {
            SOAK_SEEDS
        } else {
            SEEDS
        });
    0..n
}

#[test]
fn two_engines_agree_under_any_segmentation_and_fault() {
    for seed in seeds() {
        World::new(seed).run();
    }
}

#[test]
fn a_seed_replays_exactly() {
    // The same seed makes the same run: same steps, same completions.
    let run = |seed| {
        let mut w = World::new(seed);
        let mut trace = Vec::new();
        while !w.finished() && w.steps < 200_000 {
            w.step();
            for s in 0..2 {
                trace.push((w.pipe.in_flight(s), w.ends[s].completed));
            }
        }
        (w.steps, trace)
    };
    for seed in [3, 17, 99] {
        assert_eq!(run(seed), run(seed), "seed {seed} ran differently twice");
    }
}
