//! Round trips (encode then decode gives back the value) for every codec,
//! and the arithmetic invariants of the FPDU helpers.

use proptest::prelude::*;
use softrdma_wire::ddp::{
    self, AtomicOp, AtomicRequest, AtomicResponse, ReadRequest, TaggedHeader, UntaggedHeader,
};
use softrdma_wire::mpa::{self, FpduError};
use softrdma_wire::terminate::{self, Terminate};
use softrdma_wire::{DdpHeader, Layer, MpaFrame, MpaKind, MpaV2, Opcode, TermCode, WireError};

const OPCODES: [Opcode; 8] = [
    Opcode::Write,
    Opcode::ReadRequest,
    Opcode::ReadResponse,
    Opcode::Send,
    Opcode::SendInvalidate,
    Opcode::SendSe,
    Opcode::SendSeInvalidate,
    Opcode::Terminate,
];

/// RFC 7306's opcodes, decoded only on streams that negotiated them.
const RFC7306_OPCODES: [Opcode; 4] = [
    Opcode::ImmediateData,
    Opcode::ImmediateDataSe,
    Opcode::AtomicRequest,
    Opcode::AtomicResponse,
];

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(OPCODES.to_vec())
}

fn arb_any_opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select([&OPCODES[..], &RFC7306_OPCODES[..]].concat())
}

fn arb_atomic_request() -> impl Strategy<Value = AtomicRequest> {
    (
        prop::sample::select(vec![
            AtomicOp::FetchAdd,
            AtomicOp::Swap,
            AtomicOp::CompareSwap,
        ]),
        any::<(u32, u32, u64)>(),
        any::<(u64, u64, u64, u64)>(),
    )
        .prop_map(|(op, (req_id, stag, to), (a, am, c, cm))| AtomicRequest {
            op,
            req_id,
            stag,
            to,
            add_swap: a,
            add_swap_mask: am,
            compare: c,
            compare_mask: cm,
        })
}

fn arb_v2() -> impl Strategy<Value = MpaV2> {
    (
        0u16..=0x3FFF,
        0u16..=0x3FFF,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(ird, ord, p, s, w, r)| MpaV2 {
            ird,
            ord,
            peer_to_peer: p,
            rtr_send: s,
            rtr_write: w,
            rtr_read: r,
        })
}

prop_compose! {
    fn arb_frame()(
        request in any::<bool>(),
        markers in any::<bool>(),
        crc in any::<bool>(),
        reject in any::<bool>(),
        v2 in prop::option::of(arb_v2()),
        rev1 in any::<bool>(),
        pd in prop::collection::vec(any::<u8>(), 0..=508),
    ) -> MpaFrame {
        // The v2 block needs revision 2; without it either revision works.
        let revision = if v2.is_none() && rev1 { 1 } else { 2 };
        MpaFrame {
            kind: if request { MpaKind::Request } else { MpaKind::Reply },
            markers,
            crc,
            reject,
            revision,
            v2,
            private_data: pd,
        }
    }
}

/// Any valid header: tagged opcodes tagged, untagged ones on their queue.
fn arb_ddp_header() -> impl Strategy<Value = DdpHeader> {
    arb_header_of(arb_opcode())
}

fn arb_header_of(op: impl Strategy<Value = Opcode>) -> impl Strategy<Value = DdpHeader> {
    (
        op,
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(opcode, last, a, to, msn, mo)| {
            if opcode.is_tagged() {
                DdpHeader::Tagged(TaggedHeader {
                    last,
                    opcode,
                    stag: a,
                    to,
                })
            } else {
                DdpHeader::Untagged(UntaggedHeader {
                    last,
                    opcode,
                    inval_stag: a,
                    qn: opcode.queue().unwrap(),
                    msn,
                    mo,
                })
            }
        })
}

fn arb_read_request() -> impl Strategy<Value = ReadRequest> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(a, b, c, d, e)| ReadRequest {
            sink_stag: a,
            sink_to: b,
            size: c,
            src_stag: d,
            src_to: e,
        })
}

fn arb_code() -> impl Strategy<Value = TermCode> {
    (0u8..3, 0u8..16, any::<u8>()).prop_map(|(l, etype, ecode)| TermCode {
        layer: Layer::from_u8(l).unwrap(),
        etype,
        ecode,
    })
}

fn header_bytes(h: &DdpHeader) -> Vec<u8> {
    let mut b = [0u8; 18];
    let n = h.encode(&mut b);
    b[..n].to_vec()
}

prop_compose! {
    fn arb_terminate()(
        code in arb_code(),
        seg in prop::option::of(any::<u16>()),
        hdr in prop::option::of(arb_ddp_header()),
        rr in prop::option::of(arb_read_request()),
    ) -> Terminate {
        Terminate {
            code,
            ddp_seg_len: seg,
            ddp_header: hdr.as_ref().map(header_bytes),
            rdmap_header: rr.map(|r| { let mut b = [0u8; 28]; r.encode(&mut b); b.to_vec() }),
        }
    }
}

/// What a Terminate looks like after a trip over the wire: the segment
/// length only travels with a DDP header.
fn normalized(t: &Terminate) -> Terminate {
    let mut t = t.clone();
    if t.ddp_header.is_none() {
        t.ddp_seg_len = None;
    }
    t
}

proptest! {
    #[test]
    fn mpa_frame_roundtrip(f in arb_frame()) {
        let bytes = f.encode().unwrap();
        prop_assert_eq!(bytes.len(), f.len());
        let (g, used) = MpaFrame::decode_all(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(&g, &f);
        // Trailing bytes (the first FPDU) are not consumed.
        let mut more = bytes.clone();
        more.extend_from_slice(&[1, 2, 3]);
        prop_assert_eq!(MpaFrame::decode_all(&more).unwrap(), (f.clone(), bytes.len()));
        // Any shorter prefix is short, never wrong.
        let cut = bytes.len() / 2;
        prop_assert!(matches!(MpaFrame::decode_all(&bytes[..cut]), Err(WireError::Short(_))));
    }

    #[test]
    fn mpa_v2_roundtrip(v in arb_v2()) {
        prop_assert_eq!(MpaV2::decode(&v.encode()).unwrap(), v);
    }

    #[test]
    fn mpa_frame_too_much_private_data(extra in 1usize..64, v2 in any::<bool>()) {
        let block = if v2 { 4 } else { 0 };
        let f = MpaFrame {
            kind: MpaKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 2,
            v2: v2.then(MpaV2::default),
            private_data: vec![0; mpa::MAX_PRIVATE_DATA - block + extra],
        };
        prop_assert_eq!(f.encode(), Err(WireError::MpaPrivateDataLength(mpa::MAX_PRIVATE_DATA + extra)));
    }

    #[test]
    fn ddp_header_roundtrip(h in arb_ddp_header(), tail in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut b = header_bytes(&h);
        prop_assert_eq!(b.len(), h.len());
        prop_assert_eq!(DdpHeader::len_from_ctrl(b[0]), h.len());
        b.extend_from_slice(&tail);
        let g = DdpHeader::decode(&b).unwrap();
        prop_assert_eq!(g, h);
        prop_assert_eq!(g.opcode(), h.opcode());
        prop_assert_eq!(g.last(), h.last());
    }

    #[test]
    fn ddp_header_roundtrip_rfc7306(h in arb_header_of(arb_any_opcode())) {
        let b = header_bytes(&h);
        prop_assert_eq!(DdpHeader::decode_with(&b, true).unwrap(), h);
        // Without the negotiation, RFC 7306's opcodes are unexpected.
        let plain = DdpHeader::decode(&b);
        if h.opcode().is_rfc7306() {
            prop_assert_eq!(plain, Err(WireError::Opcode(h.opcode() as u8)));
        } else {
            prop_assert_eq!(plain, Ok(h));
        }
    }

    #[test]
    fn atomic_request_roundtrip(r in arb_atomic_request(), reserved in 0u32..(1 << 28)) {
        let mut b = [0u8; AtomicRequest::LEN];
        prop_assert_eq!(r.encode(&mut b), AtomicRequest::LEN);
        prop_assert_eq!(AtomicRequest::decode(&b).unwrap(), r);
        // The 28 reserved bits of the first word are ignored on receive.
        let w = u32::from_be_bytes(b[..4].try_into().unwrap()) | (reserved << 4);
        b[..4].copy_from_slice(&w.to_be_bytes());
        prop_assert_eq!(AtomicRequest::decode(&b).unwrap(), r);
        prop_assert_eq!(AtomicRequest::decode(&b[..51]), Err(WireError::Short(1)));
    }

    #[test]
    fn atomic_response_roundtrip(req_id in any::<u32>(), orig in any::<u64>()) {
        let r = AtomicResponse { req_id, orig };
        let mut b = [0u8; AtomicResponse::LEN];
        prop_assert_eq!(r.encode(&mut b), AtomicResponse::LEN);
        prop_assert_eq!(AtomicResponse::decode(&b).unwrap(), r);
    }

    /// RFC 7306's masks at their extremes: an Add Mask of zero is one plain
    /// 64-bit add, all ones (every bit its own field) is XOR; full Swap and
    /// Compare Masks are InfiniBand's plain swap and compare-and-swap, empty
    /// ones change nothing.
    #[test]
    fn atomic_masks_at_extremes(r in arb_atomic_request(), v in any::<u64>()) {
        let mut m = r;
        m.add_swap_mask = 0;
        prop_assert_eq!(AtomicOp::FetchAdd.apply(v, &m), v.wrapping_add(r.add_swap));
        prop_assert_eq!(AtomicOp::Swap.apply(v, &m), v);
        m.add_swap_mask = u64::MAX;
        prop_assert_eq!(AtomicOp::FetchAdd.apply(v, &m), v ^ r.add_swap);
        prop_assert_eq!(AtomicOp::Swap.apply(v, &m), r.add_swap);
        m.compare_mask = u64::MAX;
        let want = if v == r.compare { r.add_swap } else { v };
        prop_assert_eq!(AtomicOp::CompareSwap.apply(v, &m), want);
        m.compare_mask = 0;
        prop_assert_eq!(AtomicOp::CompareSwap.apply(v, &m), r.add_swap);
    }

    #[test]
    fn read_request_roundtrip(r in arb_read_request()) {
        let mut b = [0u8; 28];
        prop_assert_eq!(r.encode(&mut b), ReadRequest::LEN);
        prop_assert_eq!(ReadRequest::decode(&b).unwrap(), r);
    }

    #[test]
    fn terminate_roundtrip(t in arb_terminate()) {
        let mut b = Vec::new();
        t.encode(&mut b);
        prop_assert_eq!(b.len(), t.encoded_len());
        let g = Terminate::decode(&b).unwrap();
        prop_assert_eq!(&g, &normalized(&t));
        // The siw little-endian form of the same message decodes the same.
        let mut siw = b.clone();
        let w = terminate::rfc_to_siw_le([b[0], b[1], b[2], b[3]]);
        siw[..4].copy_from_slice(&w);
        prop_assert_eq!(Terminate::decode_siw_le(&siw).unwrap(), g);
    }

    #[test]
    fn siw_word_conversion_is_a_bijection(w in any::<[u8; 4]>()) {
        prop_assert_eq!(terminate::siw_le_to_rfc(terminate::rfc_to_siw_le(w)), w);
        prop_assert_eq!(terminate::rfc_to_siw_le(terminate::siw_le_to_rfc(w)), w);
    }

    #[test]
    fn fpdu_roundtrip(ulpdu in prop::collection::vec(any::<u8>(), 0..3000), crc in any::<bool>(), junk in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut b = Vec::new();
        mpa::encode_fpdu(&ulpdu, crc, &mut b);
        prop_assert_eq!(b.len(), mpa::fpdu_len(ulpdu.len()));
        prop_assert_eq!(b.len() % 4, 0);
        if !crc {
            prop_assert_eq!(&b[b.len() - 4..], &[0u8; 4]);
        }
        let used = b.len();
        b.extend_from_slice(&junk);
        let (got, n) = mpa::decode_fpdu(&b, crc).unwrap();
        prop_assert_eq!(got, &ulpdu[..]);
        prop_assert_eq!(n, used);
        // A CRC-protected FPDU also passes without CRC checking.
        prop_assert_eq!(mpa::decode_fpdu(&b, false).unwrap().1, used);
        // Every shorter prefix reports exactly how much is missing.
        for cut in [0usize, 1, 2, used / 2, used - 1] {
            let want = if cut < 2 { 2 - cut } else { used - cut };
            prop_assert_eq!(mpa::decode_fpdu(&b[..cut], crc), Err(FpduError::Short(want)));
        }
    }

    #[test]
    fn trailer_matches_encode_fpdu(ulpdu in prop::collection::vec(any::<u8>(), 0..100)) {
        let mut b = Vec::new();
        mpa::encode_fpdu(&ulpdu, true, &mut b);
        let mut head = (ulpdu.len() as u16).to_be_bytes().to_vec();
        head.extend_from_slice(&ulpdu);
        let running = mpa::crc_update(mpa::crc_start(), &head);
        let (t, n) = mpa::trailer(ulpdu.len(), Some(running));
        prop_assert_eq!(n, mpa::pad_len(ulpdu.len()) + 4);
        prop_assert_eq!(&t[..n], &b[head.len()..]);
        let (t0, n0) = mpa::trailer(ulpdu.len(), None);
        prop_assert_eq!(n0, n);
        prop_assert!(t0[..n0].iter().all(|&x| x == 0));
    }
}

#[test]
fn fpdu_largest_ulpdu() {
    let ulpdu = vec![0xA5u8; 0xFFFF];
    for crc in [false, true] {
        let mut b = Vec::new();
        mpa::encode_fpdu(&ulpdu, crc, &mut b);
        assert_eq!(b.len(), 2 + 0xFFFF + 3 + 4);
        let (got, n) = mpa::decode_fpdu(&b, crc).unwrap();
        assert_eq!((got.len(), n), (0xFFFF, b.len()));
    }
}

#[test]
#[should_panic(expected = "ULPDU longer than 65535 bytes")]
fn fpdu_encode_rejects_oversized_ulpdu() {
    mpa::encode_fpdu(&vec![0u8; 0x1_0000], true, &mut Vec::new());
}

#[test]
fn every_opcode_both_buffer_models() {
    for op in OPCODES {
        for last in [false, true] {
            let h = if op.is_tagged() {
                assert_eq!(op.queue(), None);
                DdpHeader::Tagged(TaggedHeader {
                    last,
                    opcode: op,
                    stag: 0xDEAD_BEEF,
                    to: u64::MAX - 1,
                })
            } else {
                DdpHeader::Untagged(UntaggedHeader {
                    last,
                    opcode: op,
                    inval_stag: if op.invalidates() { 0x55 } else { 0 },
                    qn: op.queue().unwrap(),
                    msn: u32::MAX,
                    mo: 12345,
                })
            };
            let b = header_bytes(&h);
            assert_eq!(b[1], 0x40 | op as u8, "{op:?}");
            assert_eq!(b[0] & ddp::DDP_TAGGED != 0, op.is_tagged(), "{op:?}");
            assert_eq!(b[0] & ddp::DDP_LAST != 0, last);
            assert_eq!(DdpHeader::decode(&b).unwrap(), h);
            assert_eq!(Opcode::from_u8(op as u8).unwrap(), op);
        }
    }
    for op in RFC7306_OPCODES {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: op,
            inval_stag: 0,
            qn: op.queue().unwrap(),
            msn: 1,
            mo: 0,
        });
        let b = header_bytes(&h);
        assert_eq!(b[1], 0x40 | op as u8, "{op:?}");
        assert_eq!(DdpHeader::decode_with(&b, true).unwrap(), h);
        assert_eq!(DdpHeader::decode(&b), Err(WireError::Opcode(op as u8)));
        assert!(op.is_rfc7306() && !op.is_tagged() && !op.is_send());
    }
    assert_eq!(Opcode::AtomicRequest.queue(), Some(ddp::QN_READ_REQUEST));
    assert_eq!(
        Opcode::AtomicResponse.queue(),
        Some(ddp::QN_ATOMIC_RESPONSE)
    );
    assert_eq!(Opcode::ImmediateDataSe.queue(), Some(ddp::QN_SEND));
    assert!(Opcode::ImmediateDataSe.solicited() && !Opcode::ImmediateData.solicited());
    assert_eq!(Opcode::ReadRequest.queue(), Some(ddp::QN_READ_REQUEST));
    assert_eq!(Opcode::Terminate.queue(), Some(ddp::QN_TERMINATE));
    assert!(Opcode::SendSeInvalidate.solicited() && Opcode::SendSeInvalidate.is_send());
    assert!(!Opcode::ReadRequest.is_send() && !Opcode::Send.invalidates());
}

#[test]
fn terminate_every_combination_of_optional_parts() {
    let tagged = header_bytes(&DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::ReadResponse,
        stag: 9,
        to: 10,
    }));
    let untagged = header_bytes(&DdpHeader::Untagged(UntaggedHeader {
        last: false,
        opcode: Opcode::ReadRequest,
        inval_stag: 0,
        qn: 1,
        msn: 2,
        mo: 0,
    }));
    let mut n = 0;
    for seg in [None, Some(0u16), Some(0xFFFF)] {
        for hdr in [None, Some(tagged.clone()), Some(untagged.clone())] {
            for rr in [None, Some(vec![7u8; 28])] {
                let t = Terminate {
                    code: terminate::codes::RDMAP_BASE_BOUNDS,
                    ddp_seg_len: seg,
                    ddp_header: hdr.clone(),
                    rdmap_header: rr.clone(),
                };
                let mut b = Vec::new();
                t.encode(&mut b);
                let want_len =
                    4 + hdr.as_ref().map_or(0, |h| 2 + h.len()) + rr.as_ref().map_or(0, |_| 28);
                assert_eq!(b.len(), want_len);
                let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                assert_eq!(w & terminate::HDRCT_D != 0, hdr.is_some());
                assert_eq!(w & terminate::HDRCT_M != 0, hdr.is_some() && seg.is_some());
                assert_eq!(w & terminate::HDRCT_R != 0, rr.is_some());
                assert_eq!(Terminate::decode(&b).unwrap(), normalized(&t));
                // Cut anywhere inside, it never decodes to something longer.
                for cut in 0..b.len() {
                    if let Ok(p) = Terminate::decode(&b[..cut]) {
                        assert!(p.encoded_len() <= cut);
                    }
                }
                n += 1;
            }
        }
    }
    assert_eq!(n, 18);
}

#[test]
fn pad_and_fpdu_len_invariants_exhaustive() {
    for len in 0..=0xFFFFusize {
        let pad = mpa::pad_len(len);
        assert!(pad < 4);
        assert_eq!((2 + len + pad) % 4, 0);
        assert_eq!(mpa::fpdu_len(len), 2 + len + pad + 4);
        assert_eq!(mpa::fpdu_len(len) % 4, 0);
    }
    assert_eq!(mpa::pad_len(usize::MAX), mpa::pad_len(3));
}

#[test]
fn max_ulpdu_for_is_the_largest_that_fits() {
    for m in 0..=70_000usize {
        let u = mpa::max_ulpdu_for(m);
        if m < 8 {
            assert_eq!(u, 0, "m={m}");
            continue;
        }
        assert!(mpa::fpdu_len(u) <= m, "m={m} u={u}");
        assert_eq!(mpa::pad_len(u), 0, "m={m}");
        assert!(u <= 0xFFFE);
        if u < 0xFFFE {
            assert!(mpa::fpdu_len(u + 1) > m, "m={m} u={u} not maximal");
        }
    }
    assert_eq!(mpa::max_ulpdu_for(1460 + 6), 1458);
    assert_eq!(mpa::max_ulpdu_for(usize::MAX), 0xFFFE);
}

proptest! {
    #[test]
    fn same_host_record_roundtrip(
                boot_id in any::<[u8; 16]>(),
        (pid_ns, net_ns, pid, seg_fd) in any::<(u64, u64, u32, u32)>(),
        (nonce, pd, slot) in any::<(u64, u32, u32)>(),
        flags in any::<u8>(),
        app in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        use softrdma_wire::mpa::ext;
                let r = ext::SameHost { boot_id, pid_ns, net_ns, pid, seg_fd, nonce, pd, slot };
        prop_assert_eq!(ext::SameHost::decode(&r.encode()), Some(r));
        let mut b = ext::encode_with(flags, Some(&r));
        prop_assert_eq!(b.len(), ext::LEN + ext::SAME_HOST_LEN);
        b.extend_from_slice(&app);
        let (f, got, rest) = ext::parse(&b);
        prop_assert_eq!(f, Some((flags | ext::SAME_HOST) & ext::KNOWN));
        prop_assert_eq!(got, Some(r));
        prop_assert_eq!(rest, &app[..]);
        // Without the record the flag is never set.
        let b = ext::encode_with(flags, None);
        prop_assert_eq!(ext::parse(&b), (Some(flags & ext::KNOWN & !ext::SAME_HOST), None, &[][..]));
        // A record cut short makes the whole thing foreign data.
        let mut cut = ext::encode_with(flags, Some(&r));
        cut.truncate(ext::LEN + ext::SAME_HOST_LEN - 1);
        prop_assert_eq!(ext::parse(&cut), (None, None, &cut[..]));
    }
}

#[test]
fn ext_block_roundtrip_and_foreign_data() {
    use softrdma_wire::mpa::ext;
    let mut pd = ext::encode(ext::LARGE_SEGMENTS | 0x80).to_vec();
    pd.extend_from_slice(b"app data");
    let (flags, rest) = ext::strip(&pd);
    assert_eq!(flags, Some(ext::LARGE_SEGMENTS), "unknown bit 0x80 kept");
    assert_eq!(rest, b"app data");
    // Private data without the block is returned whole.
    for foreign in [
        &b""[..],
        b"SRDX",
        b"SRDX\x02\x01\0\0xx",
        b"SRDX\x01\x01\0\x01",
        b"rping",
    ] {
        assert_eq!(ext::strip(foreign), (None, foreign));
    }
}

/// The one-shot opcodes (0xC advertise, 0xD close, 0xE close with
/// Solicited Event) decode only on a stream that negotiated them (0xE:
/// also `ONE_SHOT_SE`); they are Sends on queue 0 carrying an STag, and a
/// close invalidates it.
#[test]
fn one_shot_opcodes_need_the_extension() {
    use softrdma_wire::{Ext, UntaggedHeader};
    for (op, invalidates, solicited) in [
        (Opcode::SendAdvertise, false, false),
        (Opcode::SendClose, true, false),
        (Opcode::SendCloseSe, true, true),
    ] {
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: op,
            inval_stag: 0x1234_5601,
            qn: 0,
            msn: 7,
            mo: 0,
        });
        let mut b = vec![0; h.len()];
        h.encode(&mut b);
        let on = Ext {
            rfc7306: false,
            one_shot: true,
            one_shot_se: true,
        };
        assert_eq!(DdpHeader::decode_ext(&b, on).unwrap(), h);
        let without_se = Ext {
            one_shot_se: false,
            ..on
        };
        assert_eq!(
            DdpHeader::decode_ext(&b, without_se).is_ok(),
            !solicited,
            "{op:?} with ONE_SHOT alone"
        );
        assert!(
            DdpHeader::decode_with(&b, true).is_err(),
            "{op:?} without the extension"
        );
        assert!(DdpHeader::decode(&b).is_err());
        assert!(op.is_send() && op.is_one_shot() && !op.is_rfc7306());
        assert_eq!(op.invalidates(), invalidates);
        assert_eq!(op.is_close(), invalidates);
        assert_eq!(op.solicited(), solicited);
        assert_eq!(op.queue(), Some(0));
    }
}
