//! DDP/RDMAP headers, the Read Request body and RFC 7306's Atomic Request
//! and Response bodies: decode arbitrary bytes; whatever decodes must
//! re-encode to the input's bytes (reserved bits aside) and decode again to
//! the same value. The first input byte picks whether RFC 7306's opcodes
//! were negotiated.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::ddp::{AtomicRequest, AtomicResponse, ReadRequest, DDP_RSVD};
use softrdma_wire::{DdpHeader, Opcode};

fn check_read_request(b: &[u8]) {
    if let Ok(r) = ReadRequest::decode(b) {
        let mut out = [0u8; ReadRequest::LEN];
        assert_eq!(r.encode(&mut out), ReadRequest::LEN);
        assert_eq!(&out[..], &b[..ReadRequest::LEN]);
        assert_eq!(ReadRequest::decode(&out), Ok(r));
    }
}

fn check_atomics(b: &[u8]) {
    if let Ok(r) = AtomicRequest::decode(b) {
        let mut out = [0u8; AtomicRequest::LEN];
        assert_eq!(r.encode(&mut out), AtomicRequest::LEN);
        // The first word's 28 reserved bits are not kept.
        assert_eq!(out[3], b[3] & 0x0F);
        assert_eq!(&out[4..], &b[4..AtomicRequest::LEN]);
        assert_eq!(AtomicRequest::decode(&out), Ok(r));
    }
    if let Ok(r) = AtomicResponse::decode(b) {
        let mut out = [0u8; AtomicResponse::LEN];
        assert_eq!(r.encode(&mut out), AtomicResponse::LEN);
        assert_eq!(&out[..], &b[..AtomicResponse::LEN]);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&pick, data)) = input.split_first() else {
        return;
    };
    let rfc7306 = pick & 1 == 1;
    check_read_request(data);
    check_atomics(data);
    match DdpHeader::decode_with(data, rfc7306) {
        Ok(h) => {
            let mut out = [0u8; 18];
            let n = h.encode(&mut out);
            assert_eq!(n, h.len());
            assert_eq!(n, DdpHeader::len_from_ctrl(data[0]));
            assert_eq!(out[0], data[0] & !DDP_RSVD);
            assert_eq!(out[1], data[1] & !0x30);
            assert_eq!(&out[2..n], &data[2..n]);
            assert_eq!(DdpHeader::decode_with(&out[..n], rfc7306), Ok(h));
            match h.opcode() {
                Opcode::ReadRequest => check_read_request(&data[n..]),
                Opcode::AtomicRequest | Opcode::AtomicResponse => check_atomics(&data[n..]),
                _ => {}
            }
        }
        Err(e) => {
            let _ = e.term_code();
            let _ = e.term_code_in(data);
            let _ = e.to_string();
        }
    }
});
