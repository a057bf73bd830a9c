//! Shared receive queues.

use crate::device::ProtectionDomain;
use crate::engine::RecvWqe;
pub(crate) use crate::engine::SrqInner;
use crate::error::{Error, Result};
use crate::wr::RecvWr;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// A receive queue shared by several QPs of one protection domain.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
    pub(crate) pd: ProtectionDomain,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue(pd {})", self.inner.pd)
    }
}

impl SharedReceiveQueue {
    pub(crate) fn new(
        pd: &ProtectionDomain,
        max_wr: usize,
        max_sge: usize,
    ) -> Result<SharedReceiveQueue> {
        if max_wr == 0 || max_sge == 0 {
            return Err(Error::inval("SRQ depth and SGE count must be > 0"));
        }
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                pd: pd.id,
                max_wr,
                max_sge,
                q: Mutex::new(VecDeque::new()),
                waiters: Mutex::new(Vec::new()),
            }),
            pd: pd.clone(),
        })
    }

    /// Posts a receive buffer that any QP using this SRQ may consume.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        if wr.sgl.len() > self.inner.max_sge {
            return Err(Error::inval("too many SGEs"));
        }
        self.pd.dev.rt.core.check_post(&wr.sgl)?;
        let wqe = RecvWqe::resolve(&self.pd.dev.rt.core, self.inner.pd, wr)?;
        let mut q = self.inner.q.lock();
        if q.len() >= self.inner.max_wr {
            return Err(Error::RecvQueueFull);
        }
        q.push_back(wqe);
        drop(q);
        // Receivers that found the queue empty go on now.
        let waiters = std::mem::take(&mut *self.inner.waiters.lock());
        for qp in waiters.iter().filter_map(std::sync::Weak::upgrade) {
            if let Some(t) = qp.transport.get() {
                t.on_recv_posted(&qp);
            }
        }
        Ok(())
    }

    /// Receive buffers posted and not yet consumed.
    pub fn len(&self) -> usize {
        self.inner.q.lock().len()
    }

    /// Whether no receive buffer is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ProtectionDomain {
    /// Creates a shared receive queue of up to `max_wr` receive work requests with up to `max_sge`
    /// SGEs each, for QPs of this PD ([`QpInitAttr::srq`](crate::QpInitAttr::srq)).
    pub fn create_srq(&self, max_wr: usize, max_sge: usize) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::new(self, max_wr, max_sge)
    }
}
