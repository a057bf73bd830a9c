//! Every decoder returns a value or an error for any input, never panics,
//! and what it returns re-encodes to something that decodes the same.
//! (The `cargo fuzz` targets under `fuzz/` run the same checks for longer.)

use proptest::prelude::*;
use softrdma_wire::ddp::{AtomicRequest, AtomicResponse, ReadRequest};
use softrdma_wire::mpa::{self, MpaHeader};
use softrdma_wire::{DdpHeader, MpaFrame, MpaV2, Terminate, WireError};

fn check_all(data: &[u8]) -> Result<(), TestCaseError> {
    // MPA set-up frames.
    let _ = MpaHeader::decode(data);
    let _ = MpaV2::decode(data);
    if let Ok((f, used)) = MpaFrame::decode_all(data) {
        prop_assert!(used <= data.len());
        let b = f.encode().expect("a decoded frame re-encodes");
        prop_assert_eq!(b.len(), f.len());
        prop_assert_eq!(MpaFrame::decode_all(&b).unwrap(), (f, b.len()));
    }
    // DDP headers and the Read Request body.
    if let Ok(h) = DdpHeader::decode(data) {
        let mut b = [0u8; 18];
        let n = h.encode(&mut b);
        prop_assert_eq!(n, h.len());
        prop_assert_eq!(DdpHeader::decode(&b[..n]).unwrap(), h);
        // Reserved bits aside, the header is the input's.
        prop_assert_eq!(b[0], data[0] & !softrdma_wire::ddp::DDP_RSVD);
        prop_assert_eq!(&b[2..n], &data[2..n]);
    }
    // With RFC 7306's opcodes: the same, and a superset of the above.
    if let Ok(h) = DdpHeader::decode_with(data, true) {
        let mut b = [0u8; 18];
        let n = h.encode(&mut b);
        prop_assert_eq!(DdpHeader::decode_with(&b[..n], true).unwrap(), h);
        prop_assert_eq!(&b[2..n], &data[2..n]);
    } else {
        prop_assert!(DdpHeader::decode(data).is_err());
    }
    if let Ok(r) = AtomicRequest::decode(data) {
        let mut b = [0u8; AtomicRequest::LEN];
        r.encode(&mut b);
        prop_assert_eq!(&b[4..], &data[4..AtomicRequest::LEN]);
        prop_assert_eq!(AtomicRequest::decode(&b).unwrap(), r);
    }
    if let Ok(r) = AtomicResponse::decode(data) {
        let mut b = [0u8; AtomicResponse::LEN];
        r.encode(&mut b);
        prop_assert_eq!(&b[..], &data[..AtomicResponse::LEN]);
    }
    if let Ok(r) = ReadRequest::decode(data) {
        let mut b = [0u8; 28];
        r.encode(&mut b);
        prop_assert_eq!(&b[..], &data[..28]);
    }
    // Terminate bodies, both control word layouts.
    for t in [Terminate::decode(data), Terminate::decode_siw_le(data)]
        .into_iter()
        .flatten()
    {
        let mut b = Vec::new();
        t.encode(&mut b);
        prop_assert_eq!(b.len(), t.encoded_len());
        prop_assert!(b.len() <= data.len());
        prop_assert_eq!(Terminate::decode(&b).unwrap(), t.clone());
        let _ = t.parsed_ddp_header();
        let _ = t.parsed_rdmap_header();
    }
    // FPDUs, with and without CRC.
    for crc in [false, true] {
        if let Ok((ulpdu, used)) = mpa::decode_fpdu(data, crc) {
            prop_assert_eq!(used, mpa::fpdu_len(ulpdu.len()));
            prop_assert!(used <= data.len());
            let mut b = Vec::new();
            mpa::encode_fpdu(ulpdu, crc, &mut b);
            prop_assert_eq!(b.len(), used);
            prop_assert_eq!(mpa::decode_fpdu(&b, crc).unwrap(), (ulpdu, used));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic_on_random_bytes(data in prop::collection::vec(any::<u8>(), 0..600)) {
        check_all(&data)?;
    }

    /// Random bytes rarely get past the first check; these start from
    /// plausible prefixes so the later paths see random input too.
    #[test]
    fn decoders_never_panic_on_plausible_prefixes(
        kind in 0usize..5,
        tail in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut data: Vec<u8> = match kind {
            0 => mpa::REQ_KEY.to_vec(),
            1 => mpa::REP_KEY.to_vec(),
            2 => vec![0x41, 0x40 | (tail.first().copied().unwrap_or(0) & 0x0F)],
            3 => vec![0xC1, 0x40 | (tail.first().copied().unwrap_or(0) & 0x0F)],
            _ => {
                // A short FPDU length so the frame fits in the buffer.
                let n = tail.len().saturating_sub(8) as u16;
                n.to_be_bytes().to_vec()
            }
        };
        data.extend_from_slice(&tail);
        check_all(&data)?;
    }
}

#[test]
fn empty_and_tiny_inputs() {
    for n in 0..40 {
        for fill in [0x00u8, 0xFF, 0x41, 0xC1] {
            let data = vec![fill; n];
            check_all(&data).unwrap();
        }
    }
    assert_eq!(DdpHeader::decode(&[]), Err(WireError::Short(2)));
    assert_eq!(Terminate::decode(&[]), Err(WireError::Terminate));
    assert_eq!(mpa::decode_fpdu(&[], true), Err(mpa::FpduError::Short(2)));
}
