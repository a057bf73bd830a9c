//! A log device on a storage endpoint's partition, reached through a queue
//! pair: RDMA Writes place the bytes, a Flush (`WrOp::Flush`, the endpoint's
//! `fdatasync`) makes them durable, RDMA Reads read them back.
//!
//! The same device serves a local endpoint (`storage:PATH`, a QP connected
//! with `connect_local`, no network) and a remote one (`softrdma storage
//! serve` on another host, its token in the connect request): only the
//! constructor differs. Bytes go through one registered staging region;
//! a write larger than it is posted in pieces, all before the one Flush.
//!
//! Writes are posted without waiting: a commit's Writes and its Flush go
//! out back to back and the device waits once, for the Flush (which
//! completes only after every earlier Write is durable). It waits earlier
//! only when the staging region is full, and before a Read.

use super::LogDevice;
use softrdma_storage::endpoint::{connect, Direct, Endpoint, Session};
use softrdma_verbs::{
    Access, CompletionQueue, Device, DeviceConfig, MemoryRegion, QpInitAttr, QueuePair, Rkey,
    SendWr, WcStatus,
};
use std::io;
use std::time::Duration;

/// Bytes of the staging region (and of one RDMA Write or Read).
const STAGE: usize = 4 << 20;
/// How long one work request may take before the device reports an error.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Work requests in flight at most (the send queue holds 64).
const MAX_OUTSTANDING: usize = 32;

/// A storage partition as a log device.
pub struct QpDevice {
    qp: QueuePair,
    cq: CompletionQueue,
    stage: MemoryRegion,
    rkey: Rkey,
    len: u64,
    next_id: u64,
    /// Bytes of the staging region that posted Writes still own.
    staged: usize,
    /// Work requests posted and not yet completed.
    outstanding: usize,
    // Kept for as long as the QP: a local endpoint's registrations live in
    // its session, and the device owns the PD's verbs objects.
    _session: Option<Session>,
    _endpoint: Option<Endpoint>,
    _device: Device,
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl QpDevice {
    /// Partition `partition` of the store at `path` (`storage:PATH` or a
    /// plain path), opened in this process as `principal`, reached through
    /// a local QP.
    pub fn local(path: &str, principal: &str, partition: u32) -> io::Result<QpDevice> {
        let ep = Endpoint::open_with(path, Direct::Auto).map_err(err)?;
        let dev = Device::open_default().map_err(err)?;
        let pd = dev.alloc_pd().map_err(err)?;
        let session = ep.attach(&pd, principal).map_err(err)?;
        let region = session.region(partition).ok_or_else(|| {
            err(format!(
                "{principal} has no right on partition {partition} of {path}"
            ))
        })?;
        let cq = dev.create_cq(256).map_err(err)?;
        let mut a = QpInitAttr::new(&cq);
        a.caps.max_send_wr = 64;
        let qp = pd.create_qp(a).map_err(err)?;
        qp.connect_local().map_err(err)?;
        let stage = pd.alloc_mr(STAGE, Access::LOCAL_WRITE).map_err(err)?;
        Ok(QpDevice {
            qp,
            cq,
            stage,
            rkey: Rkey::from_raw(region.rkey),
            len: region.len,
            next_id: 0,
            staged: 0,
            outstanding: 0,
            _session: Some(session),
            _endpoint: Some(ep),
            _device: dev,
        })
    }

    /// Partition `partition` of a storage target at `addr`, as the
    /// principal whose token is `token`.
    pub fn remote(
        addr: std::net::SocketAddr,
        token: &[u8; 32],
        partition: u32,
    ) -> io::Result<QpDevice> {
        let dev = Device::open(DeviceConfig {
            same_host: softrdma_verbs::same_host_default(),
            ..Default::default()
        })
        .map_err(err)?;
        let pd = dev.alloc_pd().map_err(err)?;
        let cq = dev.create_cq(256).map_err(err)?;
        let mut a = QpInitAttr::new(&cq);
        a.caps.max_send_wr = 64;
        let qp = pd.create_qp(a).map_err(err)?;
        let regions = connect(&qp, &cq, addr, token, false).map_err(err)?;
        let region = regions
            .iter()
            .find(|r| r.index == partition)
            .ok_or_else(|| err(format!("no right on partition {partition} at {addr}")))?;
        let stage = pd.alloc_mr(STAGE, Access::LOCAL_WRITE).map_err(err)?;
        Ok(QpDevice {
            qp,
            cq,
            stage,
            rkey: Rkey::from_raw(region.rkey),
            len: region.len,
            next_id: 0,
            staged: 0,
            outstanding: 0,
            _session: None,
            _endpoint: None,
            _device: dev,
        })
    }

    /// Posts `wr` without waiting for it.
    fn post(&mut self, wr: SendWr) -> io::Result<()> {
        if self.outstanding >= MAX_OUTSTANDING {
            self.drain()?;
        }
        self.qp.post_send(&wr).map_err(err)?;
        self.outstanding += 1;
        Ok(())
    }

    /// Waits for every posted work request; the first failure is the
    /// error. The staging region is free again afterwards.
    fn drain(&mut self) -> io::Result<()> {
        let mut first_err = None;
        while self.outstanding > 0 {
            let Some(wc) = self.cq.wait_one(TIMEOUT) else {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "storage work request timed out",
                ));
            };
            self.outstanding -= 1;
            if wc.status != WcStatus::Success && first_err.is_none() {
                first_err = Some(err(format!(
                    "storage work request {}: {:?}",
                    wc.wr_id, wc.status
                )));
            }
        }
        self.staged = 0;
        first_err.map_or(Ok(()), Err)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "outside the partition",
            ));
        }
        Ok(())
    }
}

impl LogDevice for QpDevice {
    fn capacity(&self) -> u64 {
        self.len
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.check(offset, bytes.len())?;
        for (i, piece) in bytes.chunks(STAGE).enumerate() {
            if self.staged + piece.len() > STAGE {
                // The region is still the source of posted Writes.
                self.drain()?;
            }
            let at_stage = self.staged;
            self.stage.write_at(at_stage, piece);
            self.staged += piece.len();
            let sge = self.stage.sge(at_stage, piece.len());
            let id = self.id();
            let at = offset + (i * STAGE) as u64;
            self.post(SendWr::write(id, &[sge], at, self.rkey))?;
        }
        Ok(())
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.check(offset, out.len())?;
        self.drain()?;
        for (i, piece) in out.chunks_mut(STAGE).enumerate() {
            let sge = self.stage.sge(0, piece.len());
            let id = self.id();
            let at = offset + (i * STAGE) as u64;
            self.post(SendWr::read(id, sge, at, self.rkey))?;
            self.drain()?;
            self.stage.read_at(0, piece);
        }
        Ok(())
    }

    /// Keeps the staging region's pieces all in flight as RDMA Reads (on
    /// a local endpoint the next pieces are read from the file while the
    /// sink copies one out: recovery's snapshot load).
    fn read_stream(
        &mut self,
        offset: u64,
        len: u64,
        piece: usize,
        sink: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check(offset, len.try_into().unwrap_or(usize::MAX))?;
        self.drain()?;
        let piece = piece.clamp(1, STAGE);
        let slots = (STAGE / piece).min(MAX_OUTSTANDING);
        let mut buf = vec![0u8; piece];
        // Pieces posted (the i-th in slot i % slots, under work request id
        // `first + i`), pieces handed over.
        let (mut posted, mut handed) = (0u64, 0u64);
        let first = self.next_id + 1;
        let count = len.div_ceil(piece as u64);
        let span = |i: u64| {
            let at = i * piece as u64;
            (at, (len - at).min(piece as u64) as usize)
        };
        while handed < count {
            while posted < count && posted - handed < slots as u64 {
                let (at, n) = span(posted);
                let slot = (posted % slots as u64) as usize * piece;
                let sge = self.stage.sge(slot, n);
                let id = self.id();
                self.qp
                    .post_send(&SendWr::read(id, sge, offset + at, self.rkey))
                    .map_err(err)?;
                self.outstanding += 1;
                posted += 1;
            }
            let Some(wc) = self.cq.wait_one(TIMEOUT) else {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "storage read timed out",
                ));
            };
            self.outstanding -= 1;
            if wc.status != WcStatus::Success {
                let _ = self.drain();
                return Err(err(format!("storage read {}: {:?}", wc.wr_id, wc.status)));
            }
            // A QP's Reads complete in the order they were posted: the
            // completion is the oldest piece's, whose slot is read next
            // (another's would hand a piece's bytes over as another's).
            if wc.wr_id != first + handed {
                let _ = self.drain();
                return Err(err(format!(
                    "storage read completed out of order: work request {}, expected {}",
                    wc.wr_id,
                    first + handed
                )));
            }
            let (at, n) = span(handed);
            let slot = (handed % slots as u64) as usize * piece;
            self.stage.read_at(slot, &mut buf[..n]);
            if let Err(e) = sink(at, &buf[..n]) {
                // (The staging region is free only once no Read lands.)
                let _ = self.drain();
                return Err(e);
            }
            handed += 1;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let id = self.id();
        self.post(SendWr::flush(id, 0, self.rkey))?;
        self.drain()
    }
}

impl Drop for QpDevice {
    /// Waits for posted work requests before the staging region goes.
    fn drop(&mut self) {
        let _ = self.drain();
    }
}
