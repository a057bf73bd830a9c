//! Unit tests of the transmitter's composition (`compose`): FPDU sizes,
//! segment runs and packing.

use super::*;

/// Composes `sizes` as RDMA Writes (one source buffer each) into one
/// batch at segment size `seg`; returns the wire bytes and the runs
/// (segment boundaries) the batch would be written in.
fn compose_writes(sizes: &[usize], seg: usize) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut bufs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|k| (k * 7 + i) as u8).collect())
        .collect();
    let max_ulpdu = mpa::max_ulpdu_for(seg);
    let mut b = Batch::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: false,
            opcode: Opcode::Write,
            stag: 0x100 + i as u32,
            to: 0,
        });
        let span = RawSpan {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        let mut m = TxMsg::new(hdr, vec![span], buf.len() as u64, Fin::None);
        m.base_to = (i as u64) << 32;
        assert!(compose(&mut m, &mut b, max_ulpdu, seg, false), "batch full");
    }
    let mut wire = Vec::with_capacity(b.total);
    for r in &b.refs {
        match *r {
            IoRef::Hdr { off, len } => {
                wire.extend_from_slice(&b.hdrs[off as usize..(off + len) as usize])
            }
            IoRef::Mem(s) => {
                let at = wire.len();
                wire.resize(at + s.len, 0);
                // SAFETY: the span covers one of `bufs`, alive here.
                unsafe { mr::copy_from_spans(&[s], 0, &mut wire[at..]) };
            }
        }
    }
    assert_eq!(wire.len(), b.total);
    let mut runs = Vec::new();
    let mut start = 0;
    for &c in b.cuts.iter().chain(std::iter::once(&b.total)) {
        runs.push((start, c));
        start = c;
    }
    (wire, runs)
}

/// Walks the FPDUs in `wire`: (start, ulpdu length, STag, TO, last).
fn fpdus(wire: &[u8]) -> Vec<(usize, usize, u32, u64, bool)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let (ulpdu, used) = mpa::decode_fpdu(&wire[at..], false).expect("an FPDU");
        let DdpHeader::Tagged(t) = DdpHeader::decode(ulpdu).expect("a DDP header") else {
            panic!("not tagged");
        };
        out.push((at, ulpdu.len(), t.stag, t.to, t.last));
        at += used;
    }
    out
}

/// A message that needs several FPDUs starts in the room the one before
/// left in the segment: every segment but the last leaves full, each
/// begins with an FPDU header, and the bytes and offsets are exact.
#[test]
fn large_messages_pack_into_full_segments() {
    let seg = 65483; // loopback's MSS
    let sizes = [65536, 65536, 65536, 100_000, 65536];
    let (wire, runs) = compose_writes(&sizes, seg);
    let f = fpdus(&wire);
    let starts: Vec<usize> = f.iter().map(|x| x.0).collect();
    for (i, &(s, e)) in runs.iter().enumerate() {
        assert!(e - s <= seg, "run {i} is {} > {seg}", e - s);
        assert!(starts.contains(&s), "run {i} does not begin an FPDU");
        if i + 1 < runs.len() {
            assert!(
                seg - (e - s) < PACK_MIN + 32,
                "run {i} left {} empty",
                seg - (e - s)
            );
        }
    }
    let total: usize = sizes.iter().sum();
    assert_eq!(runs.len(), total.div_ceil(seg - 100), "{runs:?}");
    // Each message's FPDUs: contiguous TOs, its bytes, one last flag.
    for (i, &n) in sizes.iter().enumerate() {
        let mine: Vec<_> = f.iter().filter(|x| x.2 == 0x100 + i as u32).collect();
        let mut off = 0u64;
        for (k, x) in mine.iter().enumerate() {
            assert_eq!(x.3, ((i as u64) << 32) + off, "message {i} FPDU {k}");
            let hl = ddp::TAGGED_LEN;
            let payload = &wire[x.0 + 2 + hl..x.0 + 2 + x.1];
            for (j, &byte) in payload.iter().enumerate() {
                assert_eq!(byte, ((off as usize + j) * 7 + i) as u8);
            }
            off += (x.1 - hl) as u64;
            assert_eq!(x.4, k + 1 == mine.len(), "message {i} last flag");
        }
        assert_eq!(off, n as u64, "message {i} length");
    }
}

/// A message that fits one FPDU is never split to fill a segment's
/// tail: it goes whole into the next segment.
#[test]
fn small_messages_stay_one_fpdu() {
    let seg = 9000;
    let sizes = [4096, 4096, 4096, 4096, 100, 8000];
    let (wire, runs) = compose_writes(&sizes, seg);
    let f = fpdus(&wire);
    assert_eq!(f.len(), sizes.len(), "{f:?}");
    for (i, &(s, e)) in runs.iter().enumerate() {
        assert!(e - s <= seg, "run {i}");
    }
    // Whole FPDUs share segments as before: 2 x 4 KiB, then 2 x 4 KiB
    // and the 100 bytes, then the 8000 (which did not fit the tail).
    let lens: Vec<usize> = runs.iter().map(|(s, e)| e - s).collect();
    assert_eq!(lens, [8232, 8352, 8020], "{runs:?}");
}
