//! The planner proper: no I/O, property-tested (`tests/plan_props.rs`).

use softrdma_verbs::Sge;

/// Read (remote -> local) or Write (local -> remote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
}

/// One transfer: `local` (a chain of buffers, in order) is read from or
/// written to the remote range starting at `remote_addr` under `rkey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub op: Op,
    pub local: Vec<Sge>,
    pub remote_addr: u64,
    pub rkey: u32,
}

impl Transfer {
    /// Bytes moved.
    pub fn len(&self) -> u64 {
        self.local.iter().map(|s| s.length as u64).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one WR may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest message (bytes per WR), at least 1.
    pub max_msg: u32,
    /// Most SGEs per Write WR, at least 1.
    pub max_sge: usize,
    /// Most SGEs per Read WR, at least 1 (ibverbs' `max_sge_rd`; this
    /// engine's Reads take as many as its Writes: it binds one sink STag
    /// over a Read's SGEs, so any peer can answer it).
    pub max_sge_rd: usize,
    /// Send-queue slots the executor may fill, at least 1.
    pub slots: usize,
}

impl Limits {
    /// The device's limits with `slots` send-queue slots.
    pub fn of_device(dev: &softrdma_verbs::Device, slots: usize) -> Limits {
        let a = dev.attr();
        Limits {
            max_msg: a.max_msg_size.min(u32::MAX as u64) as u32,
            max_sge: a.max_sge as usize,
            max_sge_rd: a.max_sge_rd as usize,
            slots,
        }
    }
    fn check(&self) {
        assert!(
            self.max_msg >= 1 && self.max_sge >= 1 && self.max_sge_rd >= 1 && self.slots >= 1,
            "{self:?}"
        );
    }
}

/// A transfer's share of a WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Index of the transfer in the planner's queue.
    pub transfer: usize,
    /// Bytes of it this WR moves.
    pub bytes: u64,
    /// Whether this WR moves the transfer's last bytes.
    pub last: bool,
}

/// One work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedWr {
    pub op: Op,
    pub sgl: Vec<Sge>,
    pub remote_addr: u64,
    pub rkey: u32,
    pub len: u64,
    /// The transfers it carries, in order (more than one when merged).
    pub parts: Vec<Part>,
}

/// Where planning stands: the transfer, the buffer in it, the offset in
/// that buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cursor {
    transfer: usize,
    elem: usize,
    off: u64,
    /// Bytes of the current transfer already planned.
    done: u64,
}

/// Plans WRs for a queue of transfers, one at a time (see the crate doc).
#[derive(Debug, Clone)]
pub struct Planner {
    limits: Limits,
    transfers: Vec<Transfer>,
    at: Cursor,
    /// WRs each transfer needs (WRs carrying a part of it), fixed up front.
    need: Vec<usize>,
    total: usize,
}

impl Planner {
    pub fn new(limits: Limits, transfers: Vec<Transfer>) -> Planner {
        limits.check();
        let mut p = Planner {
            limits,
            transfers,
            at: Cursor::default(),
            need: Vec::new(),
            total: 0,
        };
        p.skip_empty();
        // The announcement: a dry run of the very same planning.
        let mut dry = p.clone();
        let mut need = vec![0; dry.transfers.len()];
        let mut total = 0;
        while let Some(w) = dry.next_wr() {
            total += 1;
            for part in &w.parts {
                need[part.transfer] += 1;
            }
        }
        p.need = need;
        p.total = total;
        p
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn transfers(&self) -> &[Transfer] {
        &self.transfers
    }

    /// (WRs in all, WRs per transfer), known before any is planned.
    pub fn announced(&self) -> (usize, &[usize]) {
        (self.total, &self.need)
    }

    /// Moves the cursor past empty buffers and transfers.
    fn skip_empty(&mut self) {
        while let Some(t) = self.transfers.get(self.at.transfer) {
            match t.local.get(self.at.elem) {
                Some(s) if self.at.off < s.length as u64 => return,
                Some(_) => {
                    self.at.elem += 1;
                    self.at.off = 0;
                }
                None => {
                    self.at = Cursor {
                        transfer: self.at.transfer + 1,
                        ..Default::default()
                    };
                }
            }
        }
    }

    /// The next WR, or None when everything is planned.
    pub fn next_wr(&mut self) -> Option<PlannedWr> {
        self.skip_empty();
        let first = self.transfers.get(self.at.transfer)?;
        let (op, rkey) = (first.op, first.rkey);
        let remote_addr = first.remote_addr + self.at.done;
        let max = self.limits.max_msg as u64;
        let mut w = PlannedWr {
            op,
            sgl: Vec::new(),
            remote_addr,
            rkey,
            len: 0,
            parts: Vec::new(),
        };
        loop {
            let t = &self.transfers[self.at.transfer];
            let s = t.local[self.at.elem];
            let n = (s.length as u64 - self.at.off).min(max - w.len);
            let addr = s.addr + self.at.off;
            // Extend the last SGE when the bytes follow it in local memory.
            let max_sge = match op {
                Op::Read => self.limits.max_sge_rd,
                Op::Write => self.limits.max_sge,
            };
            let full = w.sgl.len() == max_sge;
            match w.sgl.last_mut() {
                Some(l) if l.lkey == s.lkey && l.addr + l.length as u64 == addr => {
                    l.length += n as u32;
                }
                _ if full => break,
                _ => w.sgl.push(Sge {
                    addr,
                    length: n as u32,
                    lkey: s.lkey,
                }),
            }
            w.len += n;
            self.at.off += n;
            self.at.done += n;
            let tlen = t.len();
            let ti = self.at.transfer;
            match w.parts.last_mut() {
                Some(p) if p.transfer == ti => p.bytes += n,
                _ => w.parts.push(Part {
                    transfer: ti,
                    bytes: n,
                    last: false,
                }),
            }
            let end = t.remote_addr + tlen;
            self.skip_empty();
            if self.at.transfer != ti {
                w.parts.last_mut().expect("a part").last = true;
                // Merge the next transfer if its remote range continues
                // this one's.
                let Some(nx) = self.transfers.get(self.at.transfer) else {
                    break;
                };
                if nx.op != op || nx.rkey != rkey || nx.remote_addr != end {
                    break;
                }
            }
            if w.len == max {
                break;
            }
        }
        debug_assert!(w.len > 0 && w.sgl.len() <= self.limits.max_sge.max(self.limits.max_sge_rd));
        Some(w)
    }
}

/// Plans everything at once.
pub fn plan(limits: Limits, transfers: Vec<Transfer>) -> Vec<PlannedWr> {
    let mut p = Planner::new(limits, transfers);
    std::iter::from_fn(|| p.next_wr()).collect()
}
