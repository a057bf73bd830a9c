//! The local transport: a QP connected to a region of its own device
//! without a network ([`crate::QueuePair::connect_local`]). This is how a
//! process reaches a storage endpoint it opened itself: the same work
//! requests (RDMA Write, RDMA Read, Flush) with the same STag, rights and
//! bounds checks as a remote peer gets, executed by this module's workers
//! straight between the WR's local memory and the target region (for a
//! backed region, `RegionBackend::write_at` from the caller's buffer: one
//! copy, as `pwrite` from a user buffer).
//!
//! Ordering ([`crate::QpInitAttr::relaxed_ordering`]):
//! - **strict** (default, RDMA's): one worker; WRs execute and complete in
//!   posting order. On a backend that queues I/O in the kernel (below),
//!   WRs are pipelined as a NIC pipelines an RC QP: up to the queue depth
//!   in flight, started in posting order, a WR that overlaps one in flight
//!   (unless both are Reads) waits for it, and completions are reported in
//!   posting order; the result is that of running them one by one;
//! - **relaxed**: [`WORKERS`] workers take WRs in posting order but run
//!   them at once, and each completes when it is done (out of order: a small
//!   Write overtakes a large one). A backend that queues I/O in the kernel
//!   ([`crate::RegionBackend::is_async`], the storage endpoint's io_uring
//!   under O_DIRECT) instead gets up to its queue depth of WRs in flight,
//!   started from the posting thread (or a worker, as completions free
//!   room) and completed from the backend's completion callback.
//!
//! A WR with [`crate::SendFlags::FENCE`] starts only when every earlier WR
//! has completed, and no later WR starts before it completes (RDMA's fence,
//! widened from Reads to every earlier WR). A Flush is always fenced, and
//! completes after the target's `flush`: every earlier Write is durable.
//!
//! A remote access error (bad rkey, rights, bounds) completes that WR with
//! `RemAccessErr` and moves the QP to ERROR, as the Terminate from a
//! remote responder would; a failing backend gives `RemOpErr`.

use crate::cq::{CqInner, WcOpcode, WcStatus, WorkCompletion};
use crate::engine::{QpInner, RecvWqe, Sq, SqWqe, Transport};
use crate::error::{Error, Result};
use crate::mr::{Access, MrInner};
use crate::qp_state::QpState;
use crate::sys::RawSpan;
use crate::wr::{SendFlags, SendWr, WrOp};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

/// Workers of a relaxed-ordering local QP.
pub const WORKERS: usize = 2;
/// Largest job a relaxed QP runs on the posting thread when idle.
pub const INLINE_MAX: u64 = 64 << 10;
/// Most workers a relaxed local QP grows to (for device-bound backends).
pub const MAX_WORKERS: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Write,
    Read,
    Flush,
}

pub(crate) struct Job {
    pub wr_id: u64,
    pub signaled: bool,
    pub fence: bool,
    pub kind: Kind,
    /// The WR's local memory, held by `keep`.
    pub spans: Vec<RawSpan>,
    /// Holds the memory of `spans` until the job is done.
    #[allow(dead_code)]
    pub keep: Vec<Arc<MrInner>>,
    pub target: Arc<MrInner>,
    /// Region-relative offset.
    pub off: u64,
    pub len: u64,
}

impl Job {
    /// Fenced: starts when everything before it completed, and holds
    /// everything after it (a Flush always is).
    fn fenced(&self) -> bool {
        self.fence || self.kind == Kind::Flush
    }
}

// SAFETY: the raw spans point into registrations that `keep` holds; the
// job moves to a worker thread as a whole.
unsafe impl Send for Job {}

struct State {
    pending: VecDeque<Job>,
    running: usize,
    /// A fenced WR is running: nothing else starts.
    fenced: bool,
    /// Fenced WRs among `pending`.
    pending_fences: usize,
    stop: bool,
    /// Strict ordering: what the asynchronous WRs in flight touch (a WR
    /// that overlaps one of them, other than two Reads, waits).
    inflight: Vec<Span>,
    /// Strict ordering: the next asynchronous WR's place in the completion
    /// order.
    next_seq: u64,
}

/// A range of a target region an asynchronous WR in flight touches.
struct Span {
    seq: u64,
    target: usize,
    start: u64,
    end: u64,
    write: bool,
}

/// Strict ordering: completions of asynchronous WRs that ended before an
/// earlier one, held until it ends.
#[derive(Default)]
struct Reorder {
    next: u64,
    held: std::collections::BTreeMap<u64, (Job, WcStatus)>,
}

pub(crate) struct LocalLink {
    relaxed: bool,
    st: Mutex<State>,
    cv: Condvar,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Ourselves, for the workers it starts.
    me: Weak<LocalLink>,
    order: Mutex<Reorder>,
}

impl LocalLink {
    /// Starts workers until there are `n` (the `threads` lock keeps the
    /// count from racing).
    fn grow(&self, q: &Arc<QpInner>, n: usize) {
        let mut ts = self.threads.lock();
        while ts.len() < n {
            let i = ts.len();
            let Some(link) = self.me.upgrade() else {
                return;
            };
            let (qp, cq) = (Arc::downgrade(q), q.send_cq.clone());
            let qpn = q.qpn;
            ts.push(
                crate::threads::spawn(format!("softrdma-local{qpn}.{i}"), move || {
                    link.worker(&qp, &cq, qpn)
                })
                .expect("spawn local worker"),
            );
        }
    }

    pub fn start(q: &Arc<QpInner>, relaxed: bool) -> Arc<LocalLink> {
        let l = Arc::new_cyclic(|me| LocalLink {
            relaxed,
            st: Mutex::new(State {
                pending: VecDeque::new(),
                running: 0,
                fenced: false,
                pending_fences: 0,
                stop: false,
                inflight: Vec::new(),
                next_seq: 0,
            }),
            cv: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            me: me.clone(),
            order: Mutex::new(Reorder::default()),
        });
        l.grow(q, if relaxed { WORKERS } else { 1 });
        l
    }

    /// WRs queued or running.
    pub fn outstanding(&self) -> usize {
        let st = self.st.lock();
        st.pending.len() + st.running
    }

    /// Queues `jobs`, in order. A job runs at once on the posting thread
    /// instead (no hand-off to a worker: a request costs a system call, not
    /// two context switches) when ordering allows it: under strict ordering
    /// when nothing else is queued or running; under relaxed ordering when
    /// it is at most [`INLINE_MAX`] bytes (larger ones go to the workers,
    /// so small requests never wait behind them) and no fence is queued or
    /// running.
    pub fn submit(&self, q: &Arc<QpInner>, jobs: Vec<Job>) {
        // A batch reaches each asynchronous backend with one doorbell.
        let mut held: Vec<Arc<dyn crate::RegionBackend>> = Vec::new();
        if jobs.len() > 1 {
            for j in &jobs {
                if let Some(b) = j.target.backend.as_ref().filter(|b| b.is_async()) {
                    let same = |h: &Arc<dyn crate::RegionBackend>| {
                        std::ptr::addr_eq(Arc::as_ptr(h), Arc::as_ptr(b))
                    };
                    if !held.iter().any(same) {
                        b.hold_doorbell();
                        held.push(b.clone());
                    }
                }
            }
        }
        self.submit_jobs(q, jobs);
        for b in held {
            b.release_doorbell();
        }
    }

    fn submit_jobs(&self, q: &Arc<QpInner>, jobs: Vec<Job>) {
        let single = jobs.len() == 1;
        let mut jobs = jobs.into_iter();
        let mut st = self.st.lock();
        for j in jobs.by_ref() {
            let fenced = j.fenced();
            let idle = st.pending.is_empty() && st.running == 0 && !st.fenced;
            let qd = j.target.backend.as_ref().map_or(1, |b| b.queue_depth());
            if self.async_depth(&j).is_some() {
                // A single request, nothing in flight and every
                // completion consumed: the application waits for each
                // request before the next (queue depth 1). Doing it here and now saves the two
                // thread wake-ups of an asynchronous completion. (Relaxed:
                // small ones only, so a large one never blocks the posting
                // of a small one that could overtake it.)
                if single
                    && idle
                    && !fenced
                    && (!self.relaxed || j.len <= INLINE_MAX)
                    && q.send_cq.is_drained()
                {
                    st.running += 1;
                    drop(st);
                    finish(q, &q.send_cq, q.qpn, j);
                    st = self.st.lock();
                    st.running -= 1;
                    continue;
                }
                // The backend queues it in the kernel: start it here, up
                // to its depth, in posting order; a worker starts the rest
                // as completions free room.
                if st.pending.is_empty() && self.may_launch(&st, &j) {
                    let seq = self.claim(&mut st, &j);
                    drop(st);
                    self.launch(q, j, seq);
                    st = self.st.lock();
                    continue;
                }
                st.pending.push_back(j);
                break;
            }
            if self.relaxed && qd > 1 {
                self.grow(q, qd.min(MAX_WORKERS));
            }
            let now = if self.relaxed {
                qd == 1
                    && j.len <= INLINE_MAX
                    && !st.fenced
                    && st.pending_fences == 0
                    && (!fenced || idle)
            } else {
                idle
            };
            if !now {
                st.pending_fences += fenced as usize;
                st.pending.push_back(j);
                break;
            }
            let fenced = j.fenced();
            st.running += 1;
            st.fenced |= fenced;
            drop(st);
            finish(q, &q.send_cq, q.qpn, j);
            st = self.st.lock();
            st.running -= 1;
            if fenced {
                st.fenced = false;
            }
        }
        for j in jobs {
            st.pending_fences += (j.fenced()) as usize;
            st.pending.push_back(j);
        }
        // Workers wait for queued jobs, or for `running` to drop to let a
        // fenced or strictly ordered one start: only then is there news.
        let news = !st.pending.is_empty();
        drop(st);
        if news {
            self.cv.notify_all();
        }
    }

    /// The depth to which `j` may be kept in flight asynchronously, if its
    /// backend queues I/O in the kernel (not fenced, not a Flush).
    fn async_depth(&self, j: &Job) -> Option<usize> {
        let b = j.target.backend.as_ref()?;
        (!j.fenced() && j.kind != Kind::Flush && b.is_async())
            .then(|| b.queue_depth().clamp(1, MAX_WORKERS))
    }

    /// Whether asynchronous `j` may start now (the posting thread checks
    /// besides that nothing is queued before it): no fence running, room below the backend's depth, and under strict ordering
    /// no overlap with a WR in flight unless both are Reads (so the result
    /// is that of running them one by one, as on a NIC that pipelines an
    /// RC QP's WRs and completes them in order).
    fn may_launch(&self, st: &State, j: &Job) -> bool {
        let depth = self.async_depth(j).unwrap_or(1);
        if st.fenced || st.running >= depth {
            return false;
        }
        if self.relaxed {
            return true;
        }
        let (t, a, b) = (Arc::as_ptr(&j.target) as usize, j.off, j.off + j.len);
        let w = j.kind == Kind::Write;
        !st.inflight
            .iter()
            .any(|f| f.target == t && f.start < b && a < f.end && (w || f.write))
    }

    /// Counts `j` as running; under strict ordering records its span and
    /// gives it its place in the completion order.
    fn claim(&self, st: &mut State, j: &Job) -> Option<u64> {
        st.running += 1;
        if self.relaxed {
            return None;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.inflight.push(Span {
            seq,
            target: Arc::as_ptr(&j.target) as usize,
            start: j.off,
            end: j.off + j.len,
            write: j.kind == Kind::Write,
        });
        Some(seq)
    }

    /// A job started with [`LocalLink::launch`] has ended (and, under
    /// strict ordering, been reported).
    fn release(&self, seq: Option<u64>) {
        let mut st = self.st.lock();
        st.running -= 1;
        if let Some(seq) = seq {
            st.inflight.retain(|f| f.seq != seq);
        }
        // Only workers wait on `cv`, and only for queued WRs: with none
        // queued, waking them would cost two context switches for nothing.
        let news = !st.pending.is_empty();
        drop(st);
        if news {
            self.cv.notify_all();
        }
    }

    /// Reports an asynchronous job's end: at once (relaxed), or in posting
    /// order (strict: held until every earlier one is reported).
    fn report(
        &self,
        q: &Weak<QpInner>,
        cq: &CqInner,
        qpn: u32,
        seq: Option<u64>,
        j: Job,
        status: WcStatus,
    ) {
        let deliver = |j: Job, status: WcStatus| match q.upgrade() {
            Some(q) => complete(&q, cq, qpn, j, status),
            None => cq.push(wc(qpn, &j, WcStatus::WrFlushErr)),
        };
        let Some(seq) = seq else {
            return deliver(j, status);
        };
        let mut o = self.order.lock();
        o.held.insert(seq, (j, status));
        loop {
            let next = o.next;
            let Some((j, status)) = o.held.remove(&next) else {
                break;
            };
            o.next += 1;
            deliver(j, status);
        }
    }

    /// Hands `j` (claimed) to its asynchronous backend; the completion
    /// reports it and releases its slot.
    fn launch(&self, q: &Arc<QpInner>, mut j: Job, seq: Option<u64>) {
        let (cq, qpn) = (q.send_cq.clone(), q.qpn);
        if q.state() == crate::QpState::Error {
            self.report(&Arc::downgrade(q), &cq, qpn, seq, j, WcStatus::WrFlushErr);
            self.release(seq);
            return;
        }
        let link = self.me.upgrade().expect("a link in use is alive");
        let b = j.target.backend.clone().expect("async jobs are backed");
        let (kind, off, len) = (j.kind, j.off, j.len as usize);
        // The registrations stay alive across the submitting call even if
        // the completion runs (and drops the job) inside it.
        let hold = j.keep.clone();
        // A Write's source spans are needed only for the submitting call
        // (the completion of a Write uses none), so they leave the job
        // instead of being copied; a Read keeps them for its completion.
        let spans = if kind == Kind::Write {
            std::mem::take(&mut j.spans)
        } else {
            Vec::new()
        };
        let qw = Arc::downgrade(q);
        let done: crate::IoDone = Box::new(move |r: std::io::Result<&[u8]>| {
            let status = match r {
                Ok(bytes) => {
                    if kind == Kind::Read {
                        let n = bytes.len().min(j.spans.iter().map(|s| s.len).sum());
                        // SAFETY: the spans lie in registrations the job
                        // holds, checked for local write when posted.
                        unsafe { crate::mr::copy_into_spans(&j.spans, 0, &bytes[..n]) };
                    }
                    WcStatus::Success
                }
                Err(e) => {
                    tracing::error!(qpn, stag = j.target.stag, "local access failed: {e}");
                    WcStatus::RemOpErr
                }
            };
            link.report(&qw, &cq, qpn, seq, j, status);
            link.release(seq);
        });
        match kind {
            Kind::Write => {
                // SAFETY: each span lies in a registration held by `hold`
                // (and the job) across this call, checked for local read
                // when posted; the backend sees it only as `MemSpans`.
                let src = unsafe { crate::spans::MemSpans::new(&spans) };
                b.submit_write_spans(off, &src, done)
            }
            _ => b.submit_read(off, len, done),
        }
        drop(spans);
        drop(hold);
    }

    /// Stops the workers; queued WRs complete as flushed.
    pub fn stop(&self) {
        self.st.lock().stop = true;
        self.cv.notify_all();
        let me = std::thread::current().id();
        for t in self.threads.lock().drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    fn worker(&self, qp: &Weak<QpInner>, cq: &CqInner, qpn: u32) {
        let mut st = self.st.lock();
        loop {
            if st.stop {
                // Flush what is left (once: whoever finds it).
                for j in st.pending.drain(..) {
                    cq.push(wc(qpn, &j, WcStatus::WrFlushErr));
                }
                st.pending_fences = 0;
                return;
            }
            let startable = match st.pending.front() {
                None => false,
                Some(j) if self.async_depth(j).is_some() => self.may_launch(&st, j),
                Some(j) => {
                    let fenced = j.fenced();
                    !st.fenced && (!fenced || st.running == 0) && (self.relaxed || st.running == 0)
                }
            };
            if !startable {
                self.cv.wait(&mut st);
                continue;
            }
            let j = st.pending.pop_front().expect("front exists");
            if self.async_depth(&j).is_some() {
                // Its completion releases its slot and wakes us.
                let seq = self.claim(&mut st, &j);
                drop(st);
                match qp.upgrade() {
                    Some(q) => self.launch(&q, j, seq),
                    None => {
                        cq.push(wc(qpn, &j, WcStatus::WrFlushErr));
                        self.release(seq);
                    }
                }
                st = self.st.lock();
                continue;
            }
            let fenced = j.fenced();
            st.pending_fences -= fenced as usize;
            st.running += 1;
            st.fenced |= fenced;
            drop(st);
            match qp.upgrade() {
                Some(q) => finish(&q, cq, qpn, j),
                None => cq.push(wc(qpn, &j, WcStatus::WrFlushErr)),
            }
            st = self.st.lock();
            st.running -= 1;
            if fenced {
                st.fenced = false;
            }
            self.cv.notify_all();
        }
    }
}

/// Runs a job and reports its completion.
fn finish(q: &QpInner, cq: &CqInner, qpn: u32, j: Job) {
    let status = if q.state() == crate::QpState::Error {
        WcStatus::WrFlushErr
    } else {
        match execute(&j) {
            Ok(()) => WcStatus::Success,
            Err(e) => {
                tracing::error!(qpn, stag = j.target.stag, "local access failed: {e}");
                WcStatus::RemOpErr
            }
        }
    };
    complete(q, cq, qpn, j, status);
}

/// Reports a job's end with `status`; a failed backend ends the QP.
fn complete(q: &QpInner, cq: &CqInner, qpn: u32, j: Job, status: WcStatus) {
    if status != WcStatus::Success || j.signaled {
        cq.push(wc(qpn, &j, status));
    }
    drop(j);
    if status == WcStatus::RemOpErr {
        q.fail(
            WcStatus::WrFlushErr,
            Some(crate::engine::AsyncEvent::QpFatal {
                qpn: crate::Qpn::from_raw(qpn),
                reason: "backing I/O failed".into(),
            }),
        );
    }
}

/// The engine's view of a local link: no bytes to transmit or receive, no
/// peer to terminate; send WRs are executed by the link itself.
impl Transport for LocalLink {
    fn kick(&self, _q: &QpInner, _sq: &mut Sq) -> std::io::Result<Option<String>> {
        Ok(None)
    }

    fn close(&self) {}

    fn flush_tx(&self, _sq: &mut Sq) {}

    fn take_current_recv(&self) -> Option<RecvWqe> {
        None
    }

    fn send_terminate(&self, _q: &QpInner, _code: softrdma_wire::TermCode, _hdr: Option<&[u8]>) {}

    fn disconnect(&self, _q: &QpInner) {}

    fn on_drop(&self, q: &QpInner) {
        q.set_state(QpState::Error);
        self.stop();
    }

    fn post_send(&self, q: &Arc<QpInner>, wrs: &[SendWr]) -> Option<Result<()>> {
        Some(post_local(q, self, wrs))
    }

    fn allows_reset(&self) -> bool {
        true
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

pub(crate) fn wc(qpn: u32, j: &Job, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id: j.wr_id,
        status,
        opcode: match j.kind {
            Kind::Write => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
            Kind::Flush => WcOpcode::Flush,
        },
        byte_len: j.len as u32,
        qp_num: crate::Qpn::from_raw(qpn),
        ..Default::default()
    }
}

/// The access a job needs on its target.
pub(crate) fn need(kind: Kind) -> Access {
    match kind {
        Kind::Write => Access::REMOTE_WRITE,
        Kind::Read => Access::REMOTE_READ,
        Kind::Flush => Access::LOCAL_READ,
    }
}

fn execute(j: &Job) -> std::io::Result<()> {
    // Caller-owned memory on either side is entered for the job, so that
    // its deregistration waits for it (`MrInner::enter`).
    let mut fence: Vec<Arc<MrInner>> = j.keep.iter().filter(|m| m.fenced).cloned().collect();
    if j.target.fenced {
        fence.push(j.target.clone());
    }
    if !crate::mr::enter_all(&fence) {
        return Err(std::io::Error::other(
            "a region of the job was deregistered before it ran",
        ));
    }
    let r = execute_entered(j);
    crate::mr::exit_all(&fence);
    r
}

fn execute_entered(j: &Job) -> std::io::Result<()> {
    let t = &j.target;
    match (&t.backend, j.kind) {
        (Some(b), Kind::Flush) => b.flush(),
        (None, Kind::Flush) => Ok(()),
        (Some(b), kind) => {
            // SAFETY: the spans lie in registrations held by `j.keep` (and
            // entered if caller-owned, `execute`) for the call, checked
            // for local read (a Write) or local write (a Read) when posted.
            // Other accesses to the same bytes meanwhile (the application,
            // a peer) race as they would with a NIC's DMA: the backend sees
            // the memory only as `MemSpans`, never a slice.
            let mem = unsafe { crate::spans::MemSpans::new(&j.spans) };
            if kind == Kind::Write {
                b.write_spans(j.off, &mem)
            } else {
                b.read_spans(j.off, &mem)
            }
        }
        (None, kind) => {
            let mut remote = Vec::new();
            t.resolve(t.iova + j.off, j.len, &mut remote);
            // SAFETY: both sides are spans of registrations held by the
            // job (`keep`, `target`), bounds-checked when posted; distinct
            // registrations (or the application's own overlap, which RDMA
            // leaves undefined). No Rust slice is made over either.
            unsafe {
                if kind == Kind::Write {
                    crate::mr::copy_spans_into_spans(&j.spans, &remote, 0);
                } else {
                    crate::mr::copy_spans_into_spans(&remote, &j.spans, 0);
                }
            }
            Ok(())
        }
    }
}

/// Posts to a QP connected to a local region (`local.rs`): each WR is
/// resolved and checked here, in order; the first that fails completes with
/// its status and moves the QP to ERROR (its successors are not queued and
/// complete as flushed).
pub(crate) fn post_local(q: &Arc<QpInner>, l: &LocalLink, wrs: &[SendWr]) -> Result<()> {
    if l.outstanding() + wrs.len() > q.caps.max_send_wr {
        return Err(Error::SendQueueFull);
    }
    let mut jobs = Vec::with_capacity(wrs.len());
    let mut failed: Option<(usize, WcStatus)> = None;
    for (i, wr) in wrs.iter().enumerate() {
        if q.state() == QpState::Error {
            failed = Some((i, WcStatus::WrFlushErr));
            break;
        }
        let (kind, to, rkey) = match wr.op {
            WrOp::RdmaWrite { remote_addr, rkey } => (Kind::Write, remote_addr, rkey),
            WrOp::RdmaRead { remote_addr, rkey } => (Kind::Read, remote_addr, rkey),
            WrOp::Flush { remote_addr, rkey } => (Kind::Flush, remote_addr, rkey),
            _ => {
                failed = Some((i, WcStatus::LocQpOpErr));
                break;
            }
        };
        // Only its resolved memory is used (the job carries the flags).
        let mut w = SqWqe::new(0, wr);
        if let Err(st) = resolve_local(q, wr, &mut w) {
            failed = Some((i, st));
            break;
        }
        let target = match q.core.stags.lookup(rkey.raw()) {
            Some(t) if t.check(q.pd, need(kind), to, w.len).is_ok() => t,
            _ => {
                failed = Some((i, WcStatus::RemAccessErr));
                break;
            }
        };
        jobs.push(Job {
            wr_id: wr.wr_id,
            signaled: q.sig_all || wr.flags.contains(SendFlags::SIGNALED),
            fence: wr.flags.contains(SendFlags::FENCE),
            kind,
            spans: w.spans,
            keep: w.keep,
            off: to - target.iova,
            target,
            len: w.len,
        });
    }
    l.submit(q, jobs);
    if let Some((i, status)) = failed {
        q.send_cq.push(WorkCompletion {
            wr_id: wrs[i].wr_id,
            status,
            opcode: WcOpcode::RdmaWrite,
            qp_num: crate::Qpn::from_raw(q.qpn),
            ..Default::default()
        });
        for wr in &wrs[i + 1..] {
            q.send_cq.push(WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                qp_num: crate::Qpn::from_raw(q.qpn),
                ..Default::default()
            });
        }
        if status != WcStatus::WrFlushErr {
            q.fail(
                WcStatus::WrFlushErr,
                Some(crate::engine::AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(q.qpn),
                    reason: "error in a WR posted to a local QP".into(),
                }),
            );
        }
    }
    Ok(())
}

/// Resolves a send WR's local memory; Err is the completion status.
pub(crate) fn resolve_local(q: &QpInner, wr: &SendWr, w: &mut SqWqe) -> Result<(), WcStatus> {
    let need = match wr.op {
        WrOp::RdmaRead { .. } => Access::LOCAL_WRITE,
        // A peer's write through the new STag writes these regions: they
        // must allow it (as a registration with remote write needs local
        // write). A region registered read-only stays so.
        WrOp::FastReg { access, .. }
            if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC) =>
        {
            Access::LOCAL_WRITE
        }
        _ => Access::LOCAL_READ,
    };
    let atomic = matches!(
        wr.op,
        WrOp::AtomicFetchAdd { .. } | WrOp::AtomicCmpSwap { .. }
    );
    match &wr.op {
        WrOp::RdmaRead { .. } if wr.sgl.is_empty() => return Err(WcStatus::LocQpOpErr),
        // The original value: one 8-byte SGE.
        _ if atomic && (wr.sgl.len() != 1 || wr.sgl[0].length != 8) => {
            return Err(WcStatus::LocQpOpErr)
        }
        WrOp::SendImm { .. } if !wr.sgl.is_empty() => return Err(WcStatus::LocQpOpErr),
        WrOp::LocalInv { .. } => return Ok(()),
        WrOp::Flush { .. } if !wr.sgl.is_empty() => return Err(WcStatus::LocQpOpErr),
        WrOp::Flush { .. } => return Ok(()),
        _ => {}
    }
    let need = if atomic { Access::LOCAL_WRITE } else { need };
    for (i, sge) in wr.sgl.iter().enumerate() {
        // SGEs of one registration in a row (a coalesced SGL): one look-up
        // and one reference held for all of them.
        if i == 0 || wr.sgl[i - 1].lkey != sge.lkey {
            let mr = q
                .core
                .stags
                .lookup(sge.lkey.raw())
                .ok_or(WcStatus::LocProtErr)?;
            w.keep.push(mr);
        }
        let mr = w.keep.last().expect("pushed for this SGE's lkey");
        // A backed region has no memory to send from or receive into.
        if mr.backend.is_some() {
            return Err(WcStatus::LocProtErr);
        }
        mr.check(q.pd, need, sge.addr, sge.length as u64)
            .map_err(|_| WcStatus::LocProtErr)?;
        mr.resolve(sge.addr, sge.length as u64, &mut w.spans);
        w.len += sge.length as u64;
        // (A Read into several SGEs gets a sink bound over them when its
        // request goes on the wire: `engine/sink.rs`.)
        if wr.sgl.len() == 1 && (matches!(wr.op, WrOp::RdmaRead { .. }) || atomic) {
            w.sink = Some(crate::engine::Sink::at(mr.clone(), sge.addr));
        }
    }
    if w.len > q.core.config.attr.max_msg_size {
        return Err(WcStatus::LocLenErr);
    }
    Ok(())
}
