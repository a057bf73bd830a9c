//! DDP/RDMAP headers and the Read Request body: decode arbitrary bytes;
//! whatever decodes must re-encode to the input's bytes (reserved bits
//! aside) and decode again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::ddp::{ReadRequest, DDP_RSVD};
use softrdma_wire::{DdpHeader, Opcode};

fn check_read_request(b: &[u8]) {
    if let Ok(r) = ReadRequest::decode(b) {
        let mut out = [0u8; ReadRequest::LEN];
        assert_eq!(r.encode(&mut out), ReadRequest::LEN);
        assert_eq!(&out[..], &b[..ReadRequest::LEN]);
        assert_eq!(ReadRequest::decode(&out), Ok(r));
    }
}

fuzz_target!(|data: &[u8]| {
    check_read_request(data);
    match DdpHeader::decode(data) {
        Ok(h) => {
            let mut out = [0u8; 18];
            let n = h.encode(&mut out);
            assert_eq!(n, h.len());
            assert_eq!(n, DdpHeader::len_from_ctrl(data[0]));
            assert_eq!(out[0], data[0] & !DDP_RSVD);
            assert_eq!(out[1], data[1] & !0x30);
            assert_eq!(&out[2..n], &data[2..n]);
            assert_eq!(DdpHeader::decode(&out[..n]), Ok(h));
            if h.opcode() == Opcode::ReadRequest {
                check_read_request(&data[n..]);
            }
        }
        Err(e) => {
            let _ = e.term_code();
            let _ = e.term_code_in(data);
            let _ = e.to_string();
        }
    }
});
