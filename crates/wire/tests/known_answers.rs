//! Known-answer tests: exact bytes as the RFCs, Linux siw and Wireshark have
//! them, and CRC32c values computed independently of the crc32c crate.

use softrdma_wire::ddp::{self, ReadRequest, TaggedHeader, UntaggedHeader};
use softrdma_wire::mpa::{self, FpduError, MpaHeader};
use softrdma_wire::terminate::{self, codes, Terminate};
use softrdma_wire::{DdpHeader, Layer, MpaFrame, MpaKind, MpaV2, Opcode, TermCode, WireError};

/// CRC32c written from its definition (Castagnoli polynomial, reflected
/// 0x82F63B78, initial value and final xor all ones), bit by bit.
fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_check_value_123456789() {
    // The standard check value of CRC-32C.
    assert_eq!(crc32c_bitwise(b"123456789"), 0xE306_9283);
    assert_eq!(mpa::crc_update(mpa::crc_start(), b"123456789"), 0xE306_9283);
    // Fed in pieces, the running CRC is the same.
    let c = mpa::crc_update(mpa::crc_start(), b"1234");
    assert_eq!(mpa::crc_update(c, b"56789"), 0xE306_9283);
}

#[test]
fn crc32c_rfc3720_vectors_and_wire_byte_order() {
    // RFC 3720 appendix B.4 lists each CRC as the bytes sent, in order.
    let cases: [(&[u8], [u8; 4]); 3] = [
        (&[0u8; 32], [0xaa, 0x36, 0x91, 0x8a]),
        (&[0xffu8; 32], [0x43, 0xab, 0xa8, 0x62]),
        (
            &[
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                23, 24, 25, 26, 27, 28, 29, 30, 31,
            ],
            [0x4e, 0x79, 0xdd, 0x46],
        ),
    ];
    for (data, wire) in cases {
        assert_eq!(crc32c_bitwise(data).to_le_bytes(), wire);
        let running = mpa::crc_update(mpa::crc_start(), data);
        // 32 covered bytes = length field + a 30-byte ULPDU: no pad, so the
        // trailer is just the CRC field, in wire order.
        let (t, n) = mpa::trailer(30, Some(running));
        assert_eq!(n, 4);
        assert_eq!(&t[..4], &wire);
    }
}

/// An FPDU carrying a one-segment Send of "hello" (MSN 1), built by hand.
/// ULPDU 23 bytes, 3 pad bytes, CRC 0x0CB190B9 sent as b9 90 b1 0c.
const SEND_HELLO_FPDU: [u8; 32] = [
    0x00, 0x17, // ULPDU_Length = 23
    0x41, 0x43, // DDP: L, DV 1; RDMAP: RV 1, Send
    0x00, 0x00, 0x00, 0x00, // Invalidate STag (unused)
    0x00, 0x00, 0x00, 0x00, // QN 0
    0x00, 0x00, 0x00, 0x01, // MSN 1
    0x00, 0x00, 0x00, 0x00, // MO 0
    b'h', b'e', b'l', b'l', b'o', // payload
    0x00, 0x00, 0x00, // pad
    0xb9, 0x90, 0xb1, 0x0c, // CRC32c, least significant byte first
];

fn send_hello_header() -> DdpHeader {
    DdpHeader::Untagged(UntaggedHeader {
        last: true,
        opcode: Opcode::Send,
        inval_stag: 0,
        qn: ddp::QN_SEND,
        msn: 1,
        mo: 0,
    })
}

#[test]
fn fpdu_known_answer_with_crc() {
    let f = &SEND_HELLO_FPDU;
    // The CRC field is the independent CRC over length, ULPDU and pad.
    assert_eq!(crc32c_bitwise(&f[..28]), 0x0CB1_90B9);
    assert_eq!(crc32c_bitwise(&f[..28]).to_le_bytes(), f[28..32]);

    let mut ulpdu = [0u8; 18];
    assert_eq!(send_hello_header().encode(&mut ulpdu), 18);
    let mut ulpdu = ulpdu.to_vec();
    ulpdu.extend_from_slice(b"hello");

    let mut out = Vec::new();
    mpa::encode_fpdu(&ulpdu, true, &mut out);
    assert_eq!(out, f);
    assert_eq!(mpa::fpdu_len(ulpdu.len()), 32);
    assert_eq!(mpa::pad_len(ulpdu.len()), 3);

    let (got, used) = mpa::decode_fpdu(f, true).unwrap();
    assert_eq!(got, &ulpdu[..]);
    assert_eq!(used, 32);
    assert_eq!(DdpHeader::decode(got).unwrap(), send_hello_header());
    assert_eq!(&got[18..], b"hello");
}

#[test]
fn fpdu_known_answer_without_crc() {
    let mut f = SEND_HELLO_FPDU;
    f[28..].fill(0);
    let mut out = Vec::new();
    mpa::encode_fpdu(&SEND_HELLO_FPDU[2..25], false, &mut out);
    assert_eq!(out, f);
    // Without CRC the field is not checked.
    assert_eq!(mpa::decode_fpdu(&f, false).unwrap().1, 32);
    assert_eq!(
        mpa::decode_fpdu(&f, true),
        Err(FpduError::Crc {
            want: 0x0CB1_90B9,
            got: 0
        })
    );
}

#[test]
fn fpdu_crc_covers_length_payload_and_pad() {
    for i in 0..28 {
        let mut f = SEND_HELLO_FPDU;
        f[i] ^= 0x01;
        match mpa::decode_fpdu(&f, true) {
            // Flipping the length makes the frame longer than the buffer
            // (or changes the pad), or fails the CRC.
            Err(FpduError::Crc { .. }) | Err(FpduError::Short(_)) => {}
            other => panic!("byte {i} flipped, still accepted: {other:?}"),
        }
    }
    let mut f = SEND_HELLO_FPDU;
    f[30] ^= 0x80;
    let e = mpa::decode_fpdu(&f, true).unwrap_err();
    assert_eq!(e.term_code(), codes::MPA_CRC);
}

fn key(kind: MpaKind) -> &'static [u8; 16] {
    match kind {
        MpaKind::Request => mpa::REQ_KEY,
        MpaKind::Reply => mpa::REP_KEY,
    }
}

#[test]
fn mpa_v2_request_as_siw_rping_sends_it() {
    let mut wire = b"MPA ID Req Frame".to_vec();
    // flags 0x10 (enhanced), revision 2, PD_Length 4, IRD 1, ORD 1.
    wire.extend_from_slice(&[0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01]);

    let hdr = MpaHeader::decode(&wire).unwrap();
    assert_eq!(hdr.kind, MpaKind::Request);
    assert_eq!(hdr.flags, 0x10);
    assert!(hdr.enhanced && !hdr.crc && !hdr.markers && !hdr.reject);
    assert_eq!(hdr.revision, 2);
    assert_eq!(hdr.pd_len, 4);

    let frame = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        v2: Some(MpaV2 {
            ird: 1,
            ord: 1,
            ..MpaV2::default()
        }),
        private_data: vec![],
    };
    assert_eq!(MpaFrame::decode_all(&wire).unwrap(), (frame.clone(), 24));
    assert_eq!(frame.encode().unwrap(), wire);
    assert_eq!(frame.len(), 24);
    assert_eq!(&key(MpaKind::Request)[..], &wire[..16]);
}

#[test]
fn mpa_v2_reply_with_crc_p2p_and_rtr_flags() {
    let mut wire = b"MPA ID Rep Frame".to_vec();
    wire.extend_from_slice(&[0x50, 0x02, 0x00, 0x08]); // C + S, rev 2, PD 8
    wire.extend_from_slice(&[0x80, 0x10]); // A (peer-to-peer), IRD 16
    wire.extend_from_slice(&[0x80, 0x08]); // C (zero-length Write RTR), ORD 8
    wire.extend_from_slice(b"abcd");
    let frame = MpaFrame {
        kind: MpaKind::Reply,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        v2: Some(MpaV2 {
            ird: 16,
            ord: 8,
            peer_to_peer: true,
            rtr_send: false,
            rtr_write: true,
            rtr_read: false,
        }),
        private_data: b"abcd".to_vec(),
    };
    assert_eq!(MpaFrame::decode_all(&wire).unwrap(), (frame.clone(), 28));
    assert_eq!(frame.encode().unwrap(), wire);
    // The B and D bits.
    let v = MpaV2 {
        ird: 0x3FFF,
        ord: 0,
        rtr_send: true,
        rtr_read: true,
        ..MpaV2::default()
    };
    assert_eq!(v.encode(), [0x7F, 0xFF, 0x40, 0x00]);
    assert_eq!(MpaV2::decode(&v.encode()).unwrap(), v);
}

#[test]
fn mpa_v1_reject_reply() {
    let mut wire = b"MPA ID Rep Frame".to_vec();
    wire.extend_from_slice(&[0x20, 0x01, 0x00, 0x00]);
    let (f, n) = MpaFrame::decode_all(&wire).unwrap();
    assert_eq!(n, 20);
    assert!(f.reject && !f.crc && f.v2.is_none() && f.private_data.is_empty());
    assert_eq!(f.revision, 1);
    assert_eq!(f.encode().unwrap(), wire);
}

#[test]
fn mpa_setup_errors() {
    let mut wire = b"MPA ID Req Frame".to_vec();
    wire.extend_from_slice(&[0x10, 0x02, 0x00, 0x02, 0x00, 0x01]);
    // Enhanced rev 2 with only 2 bytes of private data: no room for the block.
    assert_eq!(MpaFrame::decode_all(&wire), Err(WireError::MpaV2Block));
    wire[17] = 3;
    assert_eq!(MpaFrame::decode_all(&wire), Err(WireError::MpaRevision(3)));
    wire[17] = 1;
    wire[18] = 0x02; // PD_Length 0x0202 = 514
    assert_eq!(
        MpaFrame::decode_all(&wire),
        Err(WireError::MpaPrivateDataLength(514))
    );
    wire[0] = b'm';
    assert_eq!(MpaFrame::decode_all(&wire), Err(WireError::MpaKey));
    assert_eq!(MpaHeader::decode(&wire[..19]), Err(WireError::Short(1)));
    for e in [
        WireError::MpaKey,
        WireError::MpaRevision(3),
        WireError::MpaMarkers,
        WireError::MpaPrivateDataLength(600),
        WireError::MpaV2Block,
    ] {
        assert_eq!(e.term_code(), codes::MPA_INVALID_REQ_REP);
    }
}

#[test]
fn ddp_headers_exact_bytes() {
    let mut b = [0u8; 18];
    let w = DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::Write,
        stag: 0x0102_0304,
        to: 0x1122_3344_5566_7788,
    });
    assert_eq!(w.encode(&mut b), 14);
    assert_eq!(
        b[..14],
        [0xC1, 0x40, 1, 2, 3, 4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
    );
    let rr = DdpHeader::Tagged(TaggedHeader {
        last: false,
        opcode: Opcode::ReadResponse,
        stag: 0xAABB_CCDD,
        to: 0,
    });
    rr.encode(&mut b);
    assert_eq!(b[..6], [0x81, 0x42, 0xAA, 0xBB, 0xCC, 0xDD]);

    let si = DdpHeader::Untagged(UntaggedHeader {
        last: true,
        opcode: Opcode::SendSeInvalidate,
        inval_stag: 0x0000_1234,
        qn: 0,
        msn: 7,
        mo: 0x100,
    });
    assert_eq!(si.encode(&mut b), 18);
    assert_eq!(
        b,
        [0x41, 0x46, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 1, 0]
    );
    let rreq = DdpHeader::Untagged(UntaggedHeader {
        last: true,
        opcode: Opcode::ReadRequest,
        inval_stag: 0,
        qn: ddp::QN_READ_REQUEST,
        msn: 1,
        mo: 0,
    });
    rreq.encode(&mut b);
    assert_eq!(b[..10], [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1]);

    let body = ReadRequest {
        sink_stag: 0x11,
        sink_to: 0x22,
        size: 0x33,
        src_stag: 0x44,
        src_to: 0x55,
    };
    let mut rb = [0u8; 28];
    assert_eq!(body.encode(&mut rb), 28);
    assert_eq!(
        rb,
        [
            0, 0, 0, 0x11, 0, 0, 0, 0, 0, 0, 0, 0x22, 0, 0, 0, 0x33, 0, 0, 0, 0x44, 0, 0, 0, 0, 0,
            0, 0, 0x55
        ]
    );
}

#[test]
fn terminate_ddp_header_is_what_siw_sends() {
    let mut b = [0u8; 18];
    Terminate::ddp_header_for(1).encode(&mut b);
    // siw: L set, DV 1, RV 1, opcode 7, QN 2, MSN 1, MO 0.
    assert_eq!(
        b,
        [0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]
    );
}

/// A tagged header of a Write to STag 0x1201 at TO 0x1000.
const WRITE_HDR: [u8; 14] = [
    0xC1, 0x40, 0x00, 0x00, 0x12, 0x01, 0, 0, 0, 0, 0, 0, 0x10, 0x00,
];
/// The untagged header of a Send (MSN 3).
const SEND_HDR: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0];

#[test]
fn terminate_rfc_layout_ddp_tagged_error() {
    let t = Terminate {
        code: codes::DDP_TAGGED_INVALID_STAG,
        ddp_seg_len: Some(0x40),
        ddp_header: Some(WRITE_HDR.to_vec()),
        rdmap_header: None,
    };
    let mut out = Vec::new();
    t.encode(&mut out);
    let mut want = vec![0x11, 0x00, 0xC0, 0x00, 0x00, 0x40];
    want.extend_from_slice(&WRITE_HDR);
    assert_eq!(out, want);
    assert_eq!(t.encoded_len(), want.len());
    // What Wireshark reads: layer = byte0 & 0xF0, etype = byte0 & 0x0F,
    // HdrCt = byte2 & 0xE0 with M 0x80, D 0x40, R 0x20.
    assert_eq!(out[0] & 0xF0, 0x10);
    assert_eq!(out[2] & 0xE0, 0xC0);
    assert_eq!(Terminate::decode(&out).unwrap(), t);
    assert_eq!(
        t.parsed_ddp_header().unwrap().unwrap(),
        DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::Write,
            stag: 0x1201,
            to: 0x1000
        })
    );
}

#[test]
fn terminate_from_linux_siw_little_endian() {
    // DDP untagged "no buffer" on a Send, M and D set, as siw on x86-64
    // lays out its bit-fields: byte 0 = EType << 4 | Layer, byte 2 has
    // M = 0x01, D = 0x02.
    let mut siw = vec![0x21, 0x02, 0x03, 0x00, 0x00, 0x05];
    siw.extend_from_slice(&SEND_HDR);
    // The same Terminate in the RFC 5040 layout.
    let mut rfc = vec![0x12, 0x02, 0xC0, 0x00, 0x00, 0x05];
    rfc.extend_from_slice(&SEND_HDR);

    let want = Terminate {
        code: codes::DDP_UNTAGGED_NO_BUFFER,
        ddp_seg_len: Some(5),
        ddp_header: Some(SEND_HDR.to_vec()),
        rdmap_header: None,
    };
    assert_eq!(Terminate::decode(&rfc).unwrap(), want);
    assert_eq!(Terminate::decode_siw_le(&siw).unwrap(), want);
    assert_eq!(
        terminate::rfc_to_siw_le([0x12, 0x02, 0xC0, 0x00]),
        [0x21, 0x02, 0x03, 0x00]
    );
    assert_eq!(
        terminate::siw_le_to_rfc([0x21, 0x02, 0x03, 0x00]),
        [0x12, 0x02, 0xC0, 0x00]
    );
    // Read as RFC layout, siw's word says something else entirely.
    let misread = Terminate::decode(&siw).unwrap();
    assert_eq!(misread.code.layer, Layer::Llp);
    assert_eq!(misread.ddp_header, None);
}

#[test]
fn terminate_siw_send_with_invalidate_sets_r_without_rdmap_header() {
    let mut hdr = SEND_HDR;
    hdr[1] = 0x44; // Send with Invalidate
    hdr[5] = 0x77; // STag to invalidate
                   // siw LE: RDMAP (0), remote protection (1), cannot invalidate (9),
                   // M D R = 0x07; then segment length and the 18-byte header only.
    let mut siw = vec![0x10, 0x09, 0x07, 0x00, 0x00, 0x00];
    siw.extend_from_slice(&hdr);
    let t = Terminate::decode_siw_le(&siw).unwrap();
    assert_eq!(t.code, codes::RDMAP_CANNOT_INVALIDATE);
    assert_eq!(t.ddp_seg_len, Some(0));
    assert_eq!(t.ddp_header.as_deref(), Some(&hdr[..]));
    assert_eq!(t.rdmap_header, None);

    // With a Read Request header, R without the 28 bytes is malformed.
    let mut rreq_hdr = hdr;
    rreq_hdr[1] = 0x41;
    rreq_hdr[9] = 1;
    let mut bad = vec![0x01, 0x00, 0xE0, 0x00, 0x00, 0x00];
    bad.extend_from_slice(&rreq_hdr);
    assert_eq!(Terminate::decode(&bad), Err(WireError::Terminate));
    // And R alone, with nothing after the word, is malformed too.
    assert_eq!(
        Terminate::decode(&[0x01, 0x00, 0x20, 0x00]),
        Err(WireError::Terminate)
    );
}

#[test]
fn terminate_read_request_protection_error_with_rdmap_header() {
    let mut rreq_hdr = [0u8; 18];
    DdpHeader::Untagged(UntaggedHeader {
        last: true,
        opcode: Opcode::ReadRequest,
        inval_stag: 0,
        qn: 1,
        msn: 1,
        mo: 0,
    })
    .encode(&mut rreq_hdr);
    let body = ReadRequest {
        sink_stag: 0x0100,
        sink_to: 0x7000,
        size: 4096,
        src_stag: 0x0200,
        src_to: 0x8000,
    };
    let mut rb = [0u8; 28];
    body.encode(&mut rb);
    let mut wire = vec![0x01, 0x02, 0xE0, 0x00, 0x00, 0x00];
    wire.extend_from_slice(&rreq_hdr);
    wire.extend_from_slice(&rb);
    let t = Terminate::decode(&wire).unwrap();
    assert_eq!(t.code, codes::RDMAP_ACCESS_RIGHTS);
    assert_eq!(t.parsed_rdmap_header().unwrap().unwrap(), body);
    let mut out = Vec::new();
    t.encode(&mut out);
    assert_eq!(out, wire);
}

#[test]
fn terminate_llp_and_catastrophic_have_no_headers() {
    let t = Terminate::new(codes::MPA_CRC);
    let mut out = Vec::new();
    t.encode(&mut out);
    assert_eq!(out, [0x20, 0x02, 0x00, 0x00]);
    let t = Terminate::new(codes::RDMAP_CATASTROPHIC_STREAM);
    out.clear();
    t.encode(&mut out);
    assert_eq!(out, [0x02, 0x07, 0x00, 0x00]);
    // Reserved bits are ignored on receive; M without D carries nothing.
    let t = Terminate::decode(&[0x02, 0x07, 0x9F, 0xFF]).unwrap();
    assert_eq!(t, Terminate::new(codes::RDMAP_CATASTROPHIC_STREAM));
    // Layer 3 does not exist.
    assert_eq!(
        Terminate::decode(&[0x30, 0, 0, 0]),
        Err(WireError::Terminate)
    );
    assert_eq!(Terminate::decode(&[0x20, 0, 0]), Err(WireError::Terminate));
}

#[test]
fn terminate_seg_len_without_header_is_not_sent() {
    // RFC 5040 section 4.8: the length field is present only with D.
    let t = Terminate {
        code: codes::DDP_UNTAGGED_INVALID_MO,
        ddp_seg_len: Some(9),
        ddp_header: None,
        rdmap_header: None,
    };
    let mut out = Vec::new();
    t.encode(&mut out);
    assert_eq!(out, [0x12, 0x04, 0x00, 0x00]);
    assert_eq!(
        Terminate::decode(&out).unwrap(),
        Terminate::new(codes::DDP_UNTAGGED_INVALID_MO)
    );
    // D without M: the field is there (zero), but not valid.
    let t = Terminate {
        code: codes::DDP_UNTAGGED_INVALID_MO,
        ddp_seg_len: None,
        ddp_header: Some(SEND_HDR.to_vec()),
        rdmap_header: None,
    };
    out.clear();
    t.encode(&mut out);
    assert_eq!(out[..6], [0x12, 0x04, 0x40, 0x00, 0x00, 0x00]);
    assert_eq!(Terminate::decode(&out).unwrap(), t);
}

#[test]
fn term_code_table_values() {
    use Layer::*;
    let t = |layer, etype, ecode| TermCode {
        layer,
        etype,
        ecode,
    };
    // RFC 5040 section 4.8, Figure 9.
    assert_eq!(codes::RDMAP_LOCAL_CATASTROPHIC, t(Rdmap, 0, 0));
    assert_eq!(codes::RDMAP_INVALID_STAG, t(Rdmap, 1, 0));
    assert_eq!(codes::RDMAP_BASE_BOUNDS, t(Rdmap, 1, 1));
    assert_eq!(codes::RDMAP_ACCESS_RIGHTS, t(Rdmap, 1, 2));
    assert_eq!(codes::RDMAP_STAG_NOT_ASSOC, t(Rdmap, 1, 3));
    assert_eq!(codes::RDMAP_TO_WRAP, t(Rdmap, 1, 4));
    assert_eq!(codes::RDMAP_CANNOT_INVALIDATE, t(Rdmap, 1, 9));
    assert_eq!(codes::RDMAP_PROTECTION_UNSPECIFIED, t(Rdmap, 1, 0xFF));
    assert_eq!(codes::RDMAP_INVALID_VERSION, t(Rdmap, 2, 5));
    assert_eq!(codes::RDMAP_UNEXPECTED_OPCODE, t(Rdmap, 2, 6));
    assert_eq!(codes::RDMAP_CATASTROPHIC_STREAM, t(Rdmap, 2, 7));
    assert_eq!(codes::RDMAP_CATASTROPHIC_GLOBAL, t(Rdmap, 2, 8));
    assert_eq!(codes::RDMAP_OP_CANNOT_INVALIDATE, t(Rdmap, 2, 9));
    assert_eq!(codes::RDMAP_OPERATION_UNSPECIFIED, t(Rdmap, 2, 0xFF));
    // RFC 5041 section 7.2.
    assert_eq!(codes::DDP_LOCAL_CATASTROPHIC, t(Ddp, 0, 0));
    assert_eq!(codes::DDP_TAGGED_INVALID_STAG, t(Ddp, 1, 0));
    assert_eq!(codes::DDP_TAGGED_BASE_BOUNDS, t(Ddp, 1, 1));
    assert_eq!(codes::DDP_TAGGED_STAG_NOT_ASSOC, t(Ddp, 1, 2));
    assert_eq!(codes::DDP_TAGGED_TO_WRAP, t(Ddp, 1, 3));
    assert_eq!(codes::DDP_TAGGED_INVALID_VERSION, t(Ddp, 1, 4));
    assert_eq!(codes::DDP_UNTAGGED_INVALID_QN, t(Ddp, 2, 1));
    assert_eq!(codes::DDP_UNTAGGED_NO_BUFFER, t(Ddp, 2, 2));
    assert_eq!(codes::DDP_UNTAGGED_MSN_RANGE, t(Ddp, 2, 3));
    assert_eq!(codes::DDP_UNTAGGED_INVALID_MO, t(Ddp, 2, 4));
    assert_eq!(codes::DDP_UNTAGGED_TOO_LONG, t(Ddp, 2, 5));
    assert_eq!(codes::DDP_UNTAGGED_INVALID_VERSION, t(Ddp, 2, 6));
    // RFC 5044 section 8 (numbered in RFC 6580) and RFC 6581 section 8.
    assert_eq!(codes::MPA_TCP_LOST, t(Llp, 0, 1));
    assert_eq!(codes::MPA_CRC, t(Llp, 0, 2));
    assert_eq!(codes::MPA_MARKER, t(Llp, 0, 3));
    assert_eq!(codes::MPA_INVALID_REQ_REP, t(Llp, 0, 4));
    assert_eq!(codes::MPA_INVALID_ULPDU_LENGTH, codes::MPA_INVALID_REQ_REP);
    assert_eq!(codes::MPA_LOCAL_CATASTROPHIC, t(Llp, 0, 5));
    assert_eq!(codes::MPA_INSUFFICIENT_IRD, t(Llp, 0, 6));
    assert_eq!(codes::MPA_NO_MATCHING_RTR, t(Llp, 0, 7));
    assert_eq!(
        codes::describe(codes::MPA_INVALID_REQ_REP),
        "invalid MPA request or reply frame"
    );
    assert_eq!(
        codes::MPA_CRC.to_string(),
        "Llp etype 0x0 ecode 0x02 (MPA CRC error)"
    );
}

#[test]
fn wire_error_term_codes() {
    assert_eq!(
        WireError::Short(3).term_code(),
        codes::RDMAP_CATASTROPHIC_STREAM
    );
    assert_eq!(
        WireError::RdmapVersion(0).term_code(),
        codes::RDMAP_INVALID_VERSION
    );
    assert_eq!(
        WireError::Opcode(8).term_code(),
        codes::RDMAP_UNEXPECTED_OPCODE
    );
    assert_eq!(
        WireError::QueueNumber(5).term_code(),
        codes::DDP_UNTAGGED_INVALID_QN
    );
    // A bad DDP version: tagged or untagged code after the T bit.
    let tagged = [0xC2u8; 14];
    let untagged = [0x42u8; 18];
    let e = DdpHeader::decode(&tagged).unwrap_err();
    assert_eq!(e, WireError::DdpVersion(2));
    assert_eq!(e.term_code_in(&tagged), codes::DDP_TAGGED_INVALID_VERSION);
    let e = DdpHeader::decode(&untagged).unwrap_err();
    assert_eq!(
        e.term_code_in(&untagged),
        codes::DDP_UNTAGGED_INVALID_VERSION
    );
    assert_eq!(e.term_code(), codes::DDP_UNTAGGED_INVALID_VERSION);
}

#[test]
fn ddp_decode_errors() {
    let mut b = [0u8; 18];
    send_hello_header().encode(&mut b);
    let mut x = b;
    x[1] = 0x03; // RDMAP version 0
    assert_eq!(DdpHeader::decode(&x), Err(WireError::RdmapVersion(0)));
    x[1] = 0x83; // RDMAP version 2
    assert_eq!(DdpHeader::decode(&x), Err(WireError::RdmapVersion(2)));
    for op in 8..16u8 {
        x[1] = 0x40 | op;
        assert_eq!(DdpHeader::decode(&x), Err(WireError::Opcode(op)));
    }
    x = b;
    x[9] = 1; // Send on queue 1
    assert_eq!(DdpHeader::decode(&x), Err(WireError::QueueNumber(1)));
    x = b;
    x[0] |= ddp::DDP_TAGGED; // a tagged Send
    assert_eq!(
        DdpHeader::decode(&x),
        Err(WireError::OpcodeModel {
            opcode: Opcode::Send,
            tagged: true
        })
    );
    // An untagged Write.
    let mut w = b;
    w[1] = 0x40;
    assert_eq!(
        DdpHeader::decode(&w),
        Err(WireError::OpcodeModel {
            opcode: Opcode::Write,
            tagged: false
        })
    );
    assert_eq!(DdpHeader::decode(&b[..17]), Err(WireError::Short(1)));
    assert_eq!(DdpHeader::decode(&b[..1]), Err(WireError::Short(1)));
    // Reserved bits are ignored.
    let mut r = b;
    r[0] |= ddp::DDP_RSVD;
    r[1] |= 0x30;
    assert_eq!(DdpHeader::decode(&r).unwrap(), send_hello_header());
    assert_eq!(ReadRequest::decode(&[0u8; 27]), Err(WireError::Short(1)));
}
