//! Drives a queue pair with a [`Planner`]: at most `limits.slots` WRs in
//! flight, resuming as completions free slots, one report per transfer.

use crate::plan::{Op, Planner};
use softrdma_verbs::{
    CompletionQueue, QueuePair, SendFlags, SendWr, WcStatus, WorkCompletion, WrOp,
};
use std::collections::VecDeque;
use std::time::Duration;

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("posting failed: {0}")]
    Post(#[from] softrdma_verbs::Error),
    #[error("WR {wr} (carrying transfers {transfers:?}) completed with {status:?}")]
    Failed {
        wr: u64,
        transfers: Vec<usize>,
        status: WcStatus,
    },
    #[error("no completion for {0:?}")]
    Timeout(Duration),
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// WRs posted (equals the planner's announcement).
    pub wrs: usize,
    /// Of those, signaled.
    pub signaled: usize,
    /// `post_send_batch` calls.
    pub posts: usize,
    /// Bytes moved.
    pub bytes: u64,
}

struct InFlight {
    seq: u64,
    /// The transfers it carries a part of.
    carries: Vec<usize>,
}

/// One transfer's progress: the WRs it needs (announced up front), those
/// posted and those completed. (Where it stands in its buffer chain is the
/// planner's cursor.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub needed: usize,
    pub posted: usize,
    pub completed: usize,
}

/// WR id of the Flush posted by [`flush`].
pub const FLUSH_WR_ID: u64 = u64::MAX;

/// Returns once every RDMA Write posted on `qp` before the call is placed
/// in the target's memory. A Write's completion only frees its source
/// buffers (the target may not have placed it yet); a Flush (a zero-length
/// RDMA Read of `rkey` at `remote_addr`) is answered only after everything
/// before it on the connection was placed, so its completion is the proof.
/// `cq` receives `qp`'s send completions and is used by nothing else
/// meanwhile; other successful completions reaped while waiting are
/// dropped, a failed one is an error.
pub fn flush(
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote_addr: u64,
    rkey: u32,
    timeout: Duration,
) -> Result<(), ExecError> {
    qp.post_send(&SendWr::flush(
        FLUSH_WR_ID,
        remote_addr,
        softrdma_verbs::Rkey::from_raw(rkey),
    ))?;
    loop {
        let wc = match cq.poll_one() {
            Some(wc) => wc,
            None => cq.wait_one(timeout).ok_or(ExecError::Timeout(timeout))?,
        };
        if wc.status != WcStatus::Success {
            return Err(ExecError::Failed {
                wr: wc.wr_id,
                transfers: Vec::new(),
                status: wc.status,
            });
        }
        if wc.wr_id == FLUSH_WR_ID {
            return Ok(());
        }
    }
}

/// Runs every transfer of `planner` on `qp` (whose send completions go to
/// `cq`, used by nothing else meanwhile); calls `done(i)` once per
/// transfer `i`, when all of its WRs have completed (an empty transfer at
/// once). WR ids are the planner's sequence numbers.
pub fn run(
    qp: &QueuePair,
    cq: &CompletionQueue,
    mut planner: Planner,
    timeout: Duration,
    mut done: impl FnMut(usize),
) -> Result<Stats, ExecError> {
    let limits = planner.limits();
    let (total, need) = planner.announced();
    let mut prog: Vec<Progress> = need
        .iter()
        .map(|&n| Progress {
            needed: n,
            ..Default::default()
        })
        .collect();
    for (i, p) in prog.iter().enumerate() {
        if p.needed == 0 {
            done(i);
        }
    }
    let mut stats = Stats::default();
    let mut flight: VecDeque<InFlight> = VecDeque::new();
    let mut seq = 0u64;
    let mut next = planner.next_wr();
    let (mut wrs, mut posted) = (Vec::new(), Vec::new());
    let mut wcs = vec![WorkCompletion::default(); 64];
    while next.is_some() || !flight.is_empty() {
        // Fill the free slots with one doorbell.
        while flight.len() + wrs.len() < limits.slots {
            let Some(w) = next.take() else { break };
            next = planner.next_wr();
            let finishes = w.parts.iter().any(|p| p.last);
            let carries: Vec<usize> = w.parts.iter().map(|p| p.transfer).collect();
            for &t in &carries {
                prog[t].posted += 1;
            }
            // The WR that fills the last free slot is signaled, so slots
            // always come back (and no run of unsignaled WRs is longer).
            let room_left = flight.len() + wrs.len() + 1 == limits.slots;
            let signaled = finishes || next.is_none() || room_left;
            stats.signaled += signaled as usize;
            let op = match w.op {
                Op::Read => WrOp::RdmaRead {
                    remote_addr: w.remote_addr,
                    rkey: softrdma_verbs::Rkey::from_raw(w.rkey),
                },
                Op::Write => WrOp::RdmaWrite {
                    remote_addr: w.remote_addr,
                    rkey: softrdma_verbs::Rkey::from_raw(w.rkey),
                },
            };
            stats.bytes += w.len;
            wrs.push(SendWr {
                wr_id: seq,
                op,
                sgl: w.sgl,
                flags: if signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            });
            posted.push(InFlight { seq, carries });
            seq += 1;
        }
        if !wrs.is_empty() {
            qp.post_send_batch(&wrs)?;
            stats.posts += 1;
            stats.wrs += wrs.len();
            wrs.clear();
            flight.extend(posted.drain(..));
            continue;
        }
        // Slots full (or the last WRs in flight): wait for completions.
        let mut n = cq.poll(&mut wcs);
        if n == 0 {
            match cq.wait_one(timeout) {
                Some(wc) => {
                    wcs[0] = wc;
                    n = 1;
                }
                None => return Err(ExecError::Timeout(timeout)),
            }
        }
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                let mut transfers: Vec<usize> =
                    flight.iter().flat_map(|f| f.carries.clone()).collect();
                transfers.dedup();
                return Err(ExecError::Failed {
                    wr: wc.wr_id,
                    transfers,
                    status: wc.status,
                });
            }
            // In order: this completion retires every WR up to it.
            while flight.front().is_some_and(|f| f.seq <= wc.wr_id) {
                let f = flight.pop_front().expect("front exists");
                for t in f.carries {
                    let p = &mut prog[t];
                    p.completed += 1;
                    debug_assert!(p.completed <= p.posted && p.posted <= p.needed);
                    if p.completed == p.needed {
                        done(t);
                    }
                }
            }
        }
    }
    debug_assert_eq!(stats.wrs, total);
    debug_assert!(prog.iter().all(|p| p.completed == p.needed));
    Ok(stats)
}
