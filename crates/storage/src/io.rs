//! The storage I/O queue under the endpoint: partition-relative Writes and
//! Reads become `pwrite`/`pread` on the device, with RDMA's ordering rules
//! and two storage ones.
//!
//! - **Strict** ordering (the default, like an RC QP): requests execute one
//!   after another in submission order and complete in that order.
//! - **Relaxed** ordering: up to `workers` requests execute at once, in any
//!   order, and complete as they finish (out-of-order completion).
//! - A **fence** request starts only when every earlier request has
//!   completed, and no later request starts before it completes (RDMA's
//!   fence, applied to everything in flight).
//! - A **barrier** (flush) request is a fence that completes only once every
//!   earlier completed Write is durable on the device (`fdatasync`): IBTA's
//!   FLUSH with global visibility and persistence, libfabric's
//!   `FI_COMMIT_COMPLETE` for the writes before it. A Write's own completion
//!   means "placed" (in the page cache), not durable.
//!
//! Every request is bounds-checked against its partition before any byte is
//! read or written.

use crate::layout::Partition;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a queue orders requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// In submission order, one at a time.
    Strict,
    /// Several at once, completions out of order.
    Relaxed,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoOp {
    /// Write `data` at `offset` of the partition.
    Write {
        /// Partition-relative offset.
        offset: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// Read `len` bytes at `offset`.
    Read {
        /// Partition-relative offset.
        offset: u64,
        /// Length.
        len: usize,
    },
    /// Wait for everything before; hold everything after.
    Fence,
    /// A fence that also makes every earlier Write durable.
    Barrier,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoRequest {
    /// Caller's id, returned in the completion.
    pub id: u64,
    /// Partition index.
    pub partition: u32,
    /// The operation.
    pub op: IoOp,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// No such partition.
    #[error("no partition {0}")]
    NoPartition(u32),
    /// Range outside the partition (nothing was touched).
    #[error("range {offset:#x}+{len} is outside partition {partition} ({size} bytes)")]
    OutOfRange {
        /// Partition.
        partition: u32,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Partition size.
        size: u64,
    },
    /// The device failed.
    #[error("device I/O error: {0}")]
    Device(String),
}

/// A completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoCompletion {
    /// The request's id.
    pub id: u64,
    /// Read data, or nothing; or the error.
    pub result: Result<Option<Vec<u8>>, IoError>,
}

struct State {
    /// Submitted, not yet started.
    pending: VecDeque<IoRequest>,
    /// Started, not yet completed.
    in_flight: usize,
    /// A fence or barrier is executing: nothing else starts.
    fenced: bool,
    /// Completions not yet taken.
    done: VecDeque<IoCompletion>,
    stop: bool,
}

struct Shared {
    file: File,
    partitions: Vec<Partition>,
    ordering: Ordering,
    workers: usize,
    state: Mutex<State>,
    /// Workers wait here for work.
    work: Condvar,
    /// Completion waiters.
    done: Condvar,
}

/// A queue of storage requests over one device.
pub struct IoQueue {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl IoQueue {
    /// A queue on `file` (the store's device) for `partitions`. `workers`
    /// threads execute requests (at least 1; strict mode uses one at a time
    /// whatever the count).
    pub fn new(
        file: File,
        partitions: Vec<Partition>,
        ordering: Ordering,
        workers: usize,
    ) -> IoQueue {
        let shared = Arc::new(Shared {
            file,
            partitions,
            ordering,
            workers: workers.max(1),
            state: Mutex::new(State {
                pending: VecDeque::new(),
                in_flight: 0,
                fenced: false,
                done: VecDeque::new(),
                stop: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let threads = (0..shared.workers)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("storage-io{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawn storage worker")
            })
            .collect();
        IoQueue { shared, threads }
    }

    /// Queues a request.
    pub fn submit(&self, req: IoRequest) {
        let mut st = self.shared.state.lock();
        st.pending.push_back(req);
        drop(st);
        self.shared.work.notify_one();
    }

    /// Takes up to `max` completions, waiting up to `timeout` for the first.
    pub fn wait(&self, max: usize, timeout: Duration) -> Vec<IoCompletion> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock();
        while st.done.is_empty() {
            if self.shared.done.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        let n = st.done.len().min(max);
        st.done.drain(..n).collect()
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Whether the head of `pending` may start now.
fn may_start(s: &Shared, st: &State) -> bool {
    let Some(head) = st.pending.front() else {
        return false;
    };
    if st.fenced {
        return false;
    }
    match head.op {
        IoOp::Fence | IoOp::Barrier => st.in_flight == 0,
        _ => match s.ordering {
            Ordering::Strict => st.in_flight == 0,
            Ordering::Relaxed => true,
        },
    }
}

fn worker(s: &Shared) {
    let mut st = s.state.lock();
    loop {
        if st.stop {
            return;
        }
        if !may_start(s, &st) {
            s.work.wait(&mut st);
            continue;
        }
        let req = st.pending.pop_front().expect("may_start saw a head");
        st.in_flight += 1;
        // A fence or barrier starts with nothing in flight (may_start) and
        // holds every later request until it completes.
        let blocking = matches!(req.op, IoOp::Fence | IoOp::Barrier);
        st.fenced |= blocking;
        if s.ordering == Ordering::Relaxed && !blocking {
            // Another worker may start the next request meanwhile.
            s.work.notify_one();
        }
        drop(st);
        let result = execute(s, &req);
        st = s.state.lock();
        st.in_flight -= 1;
        if blocking {
            st.fenced = false;
        }
        st.done.push_back(IoCompletion { id: req.id, result });
        s.done.notify_all();
        s.work.notify_all();
    }
}

fn execute(s: &Shared, req: &IoRequest) -> Result<Option<Vec<u8>>, IoError> {
    let dev = |e: std::io::Error| IoError::Device(e.to_string());
    match &req.op {
        IoOp::Fence => Ok(None),
        IoOp::Barrier => s.file.sync_data().map(|_| None).map_err(dev),
        IoOp::Write { offset, data } => {
            let at = locate(s, req.partition, *offset, data.len() as u64)?;
            s.file.write_all_at(data, at).map(|_| None).map_err(dev)
        }
        IoOp::Read { offset, len } => {
            let at = locate(s, req.partition, *offset, *len as u64)?;
            let mut b = vec![0u8; *len];
            s.file.read_exact_at(&mut b, at).map_err(dev)?;
            Ok(Some(b))
        }
    }
}

/// Device offset of a partition range, or why it is not in the partition.
fn locate(s: &Shared, partition: u32, offset: u64, len: u64) -> Result<u64, IoError> {
    let p = s
        .partitions
        .get(partition as usize)
        .ok_or(IoError::NoPartition(partition))?;
    match offset.checked_add(len) {
        Some(end) if end <= p.size => Ok(p.offset + offset),
        _ => Err(IoError::OutOfRange {
            partition,
            offset,
            len,
            size: p.size,
        }),
    }
}
