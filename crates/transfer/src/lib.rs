//! Fewer, better-sized work requests per transfer (issue 5).
//!
//! A [`Transfer`] is an RDMA Read or Write between a chain of local buffers
//! (any sizes, any number) and one remote range (`remote_addr`, `rkey`).
//! The [`Planner`] turns a queue of transfers into work requests within the
//! device's [`Limits`]:
//!
//! - a buffer larger than the maximum message size is **divided** across
//!   WRs;
//! - consecutive small buffers are **coalesced** into one WR's SGL while
//!   the message size and SGE count allow (and buffers adjacent in local
//!   memory under one lkey share one SGE);
//! - separate transfers of the same kind whose remote ranges are
//!   contiguous (same rkey, one ending where the next begins) are
//!   **merged**: one WR may carry the end of one and the start of the next.
//!
//! Planning is a pure function of the queue and the limits ([`plan`]), so
//! the number of WRs each transfer needs is known, and announced, before
//! the first is posted ([`Planner::announced`]). The [`exec`] module drives
//! a queue pair with it: it posts as many WRs as there are free send-queue
//! slots, resumes as completions free slots, and reports each transfer's
//! completion once, when every WR that carries a part of it has completed.
//! Only the WRs that finish a transfer, or that must free slots, are
//! signaled (RC completes a send queue in order, so one completion retires
//! every WR before it).

#![forbid(unsafe_code)]

pub mod exec;
mod plan;

pub use plan::{plan, Limits, Op, Part, PlannedWr, Planner, Transfer};
