//! One-sided RDMA Reads over a link: the client's look-ups, recovery's
//! copy of the primary's arena, and the pulls of lent messages
//! (`rendezvous.rs`).

use super::*;

/// Read WR ids sit above every send slot id.
const READ_ID: u64 = u64::MAX - READ_BATCH as u64;

impl Link {
    /// One-sided RDMA Read of `len` bytes at `remote_addr` under `rkey`
    /// into `local` at offset 0; waits for it.
    pub fn read(
        &self,
        local: &MemoryRegion,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        timeout: Duration,
    ) -> Result<(), LinkError> {
        self.read_batch(local, &[(0, len, remote_addr)], rkey, timeout)
    }

    /// Several one-sided RDMA Reads under `rkey`, each `(local offset,
    /// len, remote_addr)` into `local`, posted with one doorbell so that
    /// they travel together (over TCP: one `sendmsg` for the requests, the
    /// responder answers them in one batch); waits for all of them. At
    /// most [`READ_BATCH`] at once (the initiator depth a link asks for).
    /// On an error the link is closed (RDMA semantics: a remote access
    /// error ends the connection) and no read of the batch counts.
    pub fn read_batch(
        &self,
        local: &MemoryRegion,
        reads: &[(usize, usize, u64)],
        rkey: u32,
        timeout: Duration,
    ) -> Result<(), LinkError> {
        let wrs: Vec<SendWr> = reads
            .iter()
            .enumerate()
            .map(|(i, &(off, len, addr))| {
                SendWr::read(
                    READ_ID + i as u64,
                    local.sge(off, len),
                    addr,
                    softrdma_verbs::Rkey::from_raw(rkey),
                )
            })
            .collect();
        self.post_reads(wrs, timeout)
    }

    /// One RDMA Read of `remote_addr` under `rkey` scattered into the
    /// concatenation of `sgl` (at most the device's `max_sge_rd` pieces;
    /// the engine binds one sink STag over them); waits for it. A one-sided
    /// get of a large object reads its header and key into the kept read
    /// buffer and its value into a buffer of its own.
    pub fn read_scatter(
        &self,
        sgl: &[softrdma_verbs::Sge],
        remote_addr: u64,
        rkey: u32,
        timeout: Duration,
    ) -> Result<(), LinkError> {
        self.read_scatters(&[(sgl, remote_addr)], rkey, timeout)
    }

    /// Several [`Self::read_scatter`]s, `(sgl, remote_addr)`, posted with
    /// one doorbell as [`Self::read_batch`] posts its Reads; at most
    /// [`READ_BATCH`].
    pub fn read_scatters(
        &self,
        reads: &[(&[softrdma_verbs::Sge], u64)],
        rkey: u32,
        timeout: Duration,
    ) -> Result<(), LinkError> {
        let wrs = reads
            .iter()
            .enumerate()
            .map(|(i, &(sgl, addr))| {
                SendWr::read_sgl(
                    READ_ID + i as u64,
                    sgl,
                    addr,
                    softrdma_verbs::Rkey::from_raw(rkey),
                )
            })
            .collect();
        self.post_reads(wrs, timeout)
    }

    /// Posts `wrs` (Reads with ids from [`READ_ID`]) with one doorbell and
    /// waits for all of them.
    fn post_reads(&self, wrs: Vec<SendWr>, timeout: Duration) -> Result<(), LinkError> {
        assert!(
            wrs.len() <= READ_BATCH,
            "at most {READ_BATCH} Reads per batch, got {}",
            wrs.len()
        );
        if wrs.is_empty() {
            return Ok(());
        }
        if self.is_dead() {
            return Err(LinkError::Down(self.peer()));
        }
        let deadline = Instant::now() + timeout;
        let mut tx = self.tx.lock().unwrap();
        // Room on the send queue (Sends of this link may be in flight).
        self.reap(&mut tx, false, timeout)?;
        while tx.outstanding + wrs.len() > SEND_SLOTS + SQ_SPARE {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LinkError::Timeout(self.peer()));
            }
            self.reap(&mut tx, true, left)?;
        }
        self.qp.post_send_batch(&wrs).map_err(|e| {
            self.dead.store(true, Ordering::Release);
            verr(e)
        })?;
        tx.outstanding += wrs.len();
        let mut left = wrs.len();
        // Same host: the Reads were copied during post_send and their
        // completions are already queued; over TCP the responses come back
        // on this link's input, which this thread runs.
        while left > 0 {
            let Some(wc) = self.next_send_wc(deadline) else {
                return Err(LinkError::Timeout(self.peer()));
            };
            tx.outstanding = tx.outstanding.saturating_sub(1);
            if wc.status != WcStatus::Success {
                // A remote access error (bad pointer) ends the connection
                // (RDMA semantics); the caller reconnects.
                self.dead.store(true, Ordering::Release);
                return Err(LinkError::Verbs(format!(
                    "RDMA Read failed: {:?}",
                    wc.status
                )));
            }
            if wc.wr_id >= READ_ID {
                left -= 1;
            }
        }
        Ok(())
    }
}
