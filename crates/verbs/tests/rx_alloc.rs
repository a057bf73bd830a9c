//! The receive path allocates nothing per FPDU in the steady state.
//!
//! A counting global allocator counts the allocations of this thread while
//! one RDMA Write is carried over a simulated connection (`sim`: the real
//! transmitter, receiver and RDMAP handlers, driven on this thread, so no
//! other thread's allocations are counted). The segment size is the
//! smallest the engine takes, so the Write arrives as hundreds of FPDUs;
//! a Write twice as long, twice as many FPDUs, must cost about the same
//! number of allocations (the work request's own: a handful, whatever its
//! length). Before, each FPDU's header was copied into a new `Vec` in case
//! a Terminate had to quote it: one allocation per FPDU.

use softrdma_verbs::pipe::Pipe;
use softrdma_verbs::sim::{self, SimParams};
use softrdma_verbs::*;

#[path = "support/counting_alloc.rs"]
mod counting;
use counting::allocs;

/// The smallest segment the engine cuts FPDUs for (a little over 500 bytes
/// of payload each).
const SEG: usize = 536;
/// The shorter Write: about 500 FPDUs.
const LEN: usize = 256 * 1024;

struct Ends {
    _dev: Device,
    c: QueuePair,
    s: QueuePair,
    ccq: CompletionQueue,
    pipe: std::sync::Arc<Pipe>,
    src: MemoryRegion,
    dst: MemoryRegion,
}

fn ends() -> Ends {
    let dev = Device::open(DeviceConfig {
        publish: false,
        same_host: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let ccq = dev.create_cq(16).unwrap();
    let scq = dev.create_cq(16).unwrap();
    let c = pd.create_qp(QpInitAttr::new(&ccq)).unwrap();
    let s = pd.create_qp(QpInitAttr::new(&scq)).unwrap();
    let src = pd.alloc_mr(2 * LEN, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .alloc_mr(2 * LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let p = SimParams {
        seg: SEG,
        cap: 1 << 20,
        ..SimParams::default()
    };
    let pipe = sim::connect(&c, &s, &p).unwrap();
    Ends {
        _dev: dev,
        c,
        s,
        ccq,
        pipe,
        src,
        dst,
    }
}

impl Ends {
    /// Carries `wr` (built beforehand) to the peer and returns the
    /// allocations it took, from the post until the connection is quiet.
    fn write(&self, wr: &SendWr) -> u64 {
        let before = allocs();
        self.c.post_send(wr).unwrap();
        let qps = [&self.c, &self.s];
        let mut more = [false; 2];
        loop {
            let mut moved = false;
            for (side, qp) in qps.iter().enumerate() {
                let r = self.pipe.ready(side);
                if r.input || more[side] {
                    more[side] = sim::on_readable(qp, 64);
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
                if self.pipe.deliver(side, usize::MAX) > 0 {
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        let n = allocs() - before;
        let mut wc = [WorkCompletion::default()];
        assert_eq!(self.ccq.poll(&mut wc), 1, "the Write completed");
        assert!(wc[0].is_ok(), "{:?}", wc[0]);
        n
    }
}

#[test]
fn allocations_do_not_grow_with_fpdus() {
    let e = ends();
    let data: Vec<u8> = (0..2 * LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    e.src.write_at(0, &data);
    let wr = |id, len| SendWr::write(id, &[e.src.sge(0, len)], e.dst.addr(), e.dst.rkey());
    let (warm, short, long) = (wr(1, 2 * LEN), wr(2, LEN), wr(3, 2 * LEN));

    e.write(&warm);
    let a_short = e.write(&short);
    let a_long = e.write(&long);
    assert_eq!(e.dst.to_vec(), data, "the Writes were placed");

    // The long Write carries about LEN / SEG more FPDUs than the short one.
    let extra_fpdus = (LEN / SEG) as u64;
    eprintln!(
        "allocations: {a_short} for {LEN} bytes, {a_long} for {} bytes ({extra_fpdus} more FPDUs)",
        2 * LEN
    );
    assert!(
        a_long <= a_short + extra_fpdus / 16,
        "allocations grow with the FPDUs received: {a_short} for {LEN} bytes, \
         {a_long} for {} bytes (about {extra_fpdus} more FPDUs)",
        2 * LEN
    );
}
