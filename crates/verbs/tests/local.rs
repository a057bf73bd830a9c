//! QPs connected without a network (`QueuePair::connect_local`): Writes,
//! Reads and Flushes reach a region of the same device with the checks a
//! remote peer gets; strict ordering completes in posting order, relaxed
//! lets a small Write overtake a large one, a fence holds everything after
//! it.

mod common;
use common::*;
use parking_lot::{Condvar, Mutex};
use softrdma_verbs::*;
use std::sync::Arc;
use std::time::Duration;

/// A backend in memory whose writes larger than 64 KiB wait at a gate.
struct Gated {
    data: Mutex<Vec<u8>>,
    open: Mutex<bool>,
    cv: Condvar,
    flushes: Mutex<Vec<usize>>,
    writes: Mutex<usize>,
}

impl Gated {
    fn new(len: usize, open: bool) -> Arc<Gated> {
        Arc::new(Gated {
            data: Mutex::new(vec![0; len]),
            open: Mutex::new(open),
            cv: Condvar::new(),
            flushes: Mutex::new(Vec::new()),
            writes: Mutex::new(0),
        })
    }
    fn release(&self) {
        *self.open.lock() = true;
        self.cv.notify_all();
    }
}

impl RegionBackend for Gated {
    fn write_at(&self, off: u64, d: &[u8]) -> std::io::Result<()> {
        if d.len() > 64 << 10 {
            let mut o = self.open.lock();
            while !*o {
                self.cv.wait(&mut o);
            }
        }
        self.data.lock()[off as usize..off as usize + d.len()].copy_from_slice(d);
        *self.writes.lock() += 1;
        Ok(())
    }
    fn read_at(&self, off: u64, b: &mut [u8]) -> std::io::Result<()> {
        b.copy_from_slice(&self.data.lock()[off as usize..off as usize + b.len()]);
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let w = *self.writes.lock();
        self.flushes.lock().push(w);
        Ok(())
    }
}

struct Local {
    _dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn local(relaxed: bool) -> Local {
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.relaxed_ordering = relaxed;
    let qp = pd.create_qp(attr).unwrap();
    qp.connect_local().unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    Local {
        _dev: dev,
        pd,
        cq,
        qp,
    }
}

fn region(l: &Local, b: &Arc<Gated>, access: Access) -> MemoryRegion {
    let len = b.data.lock().len() as u64;
    l.pd.register_backend(b.clone(), len, access, RegOptions::default())
        .unwrap()
}

const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

#[test]
fn writes_reads_and_flush_in_order() {
    let l = local(false);
    let b = Gated::new(1 << 20, true);
    let r = region(&l, &b, RW);
    let src = l.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = l.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let data = pattern(1 << 20, 5);
    src.write_at(0, &data);
    // Two SGEs in one Write, then a Read of it, a Flush, and a Write to
    // a memory region of the same PD.
    let wr = SendWr::write(1, &[src.sge(0, 100), src.sge(5000, 200 << 10)], 7, r.rkey());
    l.qp.post_send_batch(&[
        wr,
        SendWr::read(2, dst.sge(0, 100 + (200 << 10)), 7, r.rkey()),
        SendWr::flush(3, 0, r.rkey()),
    ])
    .unwrap();
    for want in [
        (1, WcOpcode::RdmaWrite),
        (2, WcOpcode::RdmaRead),
        (3, WcOpcode::Flush),
    ] {
        let wc = wait(&l.cq);
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (want.0, want.1, WcStatus::Success)
        );
    }
    let mut want = data[..100].to_vec();
    want.extend_from_slice(&data[5000..5000 + (200 << 10)]);
    let mut got = vec![0; want.len()];
    dst.read_at(0, &mut got);
    assert_eq!(got, want);
    assert_eq!(&b.data.lock()[7..7 + want.len()], &want[..]);
    // Every backend write of the Write WR (its two SGEs arrive as one
    // `write_spans`, staged by the default into one `write_at`) came
    // before the flush.
    let writes = *b.writes.lock();
    assert!(writes >= 1, "the Write reached the backend");
    assert_eq!(
        *b.flushes.lock(),
        vec![writes],
        "the flush ran after the write"
    );
    // A region in memory is a target too.
    let m = l.pd.alloc_mr(4096, Access::REMOTE_WRITE).unwrap();
    l.qp.post_send(&SendWr::write(4, &[src.sge(0, 4096)], m.addr(), m.rkey()))
        .unwrap();
    assert_eq!(wait(&l.cq).status, WcStatus::Success);
    assert_eq!(m.to_vec(), data[..4096]);
}

/// A large Write held at the backend's gate, then a small one. Relaxed:
/// the small one completes first. Strict: it waits behind the large one.
/// With a fence (relaxed): it waits too.
#[test]
fn relaxed_ordering_completes_out_of_order_and_fence_holds() {
    for (relaxed, fence) in [(true, false), (false, false), (true, true)] {
        let l = local(relaxed);
        let b = Gated::new(1 << 20, false);
        let r = region(&l, &b, RW);
        let src = l.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        let mut small = SendWr::write(2, &[src.sge(0, 512)], 0, r.rkey());
        if fence {
            small.flags = small.flags | SendFlags::FENCE;
        }
        let batch = [
            SendWr::write(1, &[src.sge(0, 512 << 10)], 4096, r.rkey()),
            small,
        ];
        // Posted from a thread of its own: under strict ordering an idle
        // QP runs WRs on the posting thread, which then waits at the gate.
        std::thread::scope(|sc| {
            sc.spawn(|| l.qp.post_send_batch(&batch).unwrap());
            if relaxed && !fence {
                let wc = wait(&l.cq);
                assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
                b.release();
                assert_eq!(wait(&l.cq).wr_id, 1);
            } else {
                // Nothing may complete while the large Write is held.
                assert!(l.cq.wait_one(Duration::from_millis(300)).is_none());
                b.release();
                assert_eq!(wait(&l.cq).wr_id, 1, "relaxed={relaxed} fence={fence}");
                assert_eq!(wait(&l.cq).wr_id, 2);
            }
        });
    }
}

/// Rights, bounds and unknown rkeys: RemAccessErr, QP in ERROR, later WRs
/// flushed, nothing written.
#[test]
fn access_errors_fail_the_qp_and_touch_nothing() {
    let cases: [(Access, u64, bool); 3] = [
        (Access::REMOTE_READ, 0, false),
        (RW, (1 << 20) - 100, false),
        (RW, 0, true),
    ];
    for (access, to, bad_key) in cases {
        let l = local(false);
        let b = Gated::new(1 << 20, true);
        let r = region(&l, &b, access);
        let src = l.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        src.write_at(0, &[1; 4096]);
        let key = if bad_key {
            Rkey::from_raw(r.rkey().raw() ^ 1)
        } else {
            r.rkey()
        };
        l.qp.post_send_batch(&[
            SendWr::write(1, &[src.sge(0, 4096)], to, key),
            SendWr::write(2, &[src.sge(0, 16)], 0, r.rkey()),
        ])
        .unwrap();
        let wc = wait(&l.cq);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
        let wc = wait(&l.cq);
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
        assert_eq!(l.qp.state(), QpState::Error);
        assert!(b.data.lock().iter().all(|&x| x == 0));
        // Later posts are flushed.
        l.qp.post_send(&SendWr::write(3, &[src.sge(0, 16)], 0, r.rkey()))
            .unwrap();
        assert_eq!(wait(&l.cq).status, WcStatus::WrFlushErr);
    }
}

/// Sends make no sense without a peer.
#[test]
fn sends_are_refused() {
    let l = local(false);
    let src = l.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    l.qp.post_send(&SendWr::send(1, &[src.sge(0, 8)])).unwrap();
    let wc = wait(&l.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocQpOpErr));
}
