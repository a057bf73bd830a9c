//! Terminate bodies: decode arbitrary bytes in the RFC 5040 layout and in
//! Linux siw's little-endian layout; whatever decodes must re-encode to a
//! body no longer than the input that decodes to the same Terminate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::terminate::{rfc_to_siw_le, siw_le_to_rfc};
use softrdma_wire::Terminate;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let w = [data[0], data[1], data[2], data[3]];
        assert_eq!(rfc_to_siw_le(siw_le_to_rfc(w)), w);
    }
    for decoded in [Terminate::decode(data), Terminate::decode_siw_le(data)] {
        match decoded {
            Ok(t) => {
                let mut out = Vec::new();
                t.encode(&mut out);
                assert_eq!(out.len(), t.encoded_len());
                assert!(out.len() <= data.len());
                assert_eq!(Terminate::decode(&out).as_ref(), Ok(&t));
                let _ = t.parsed_ddp_header();
                let _ = t.parsed_rdmap_header();
                let _ = t.code.to_string();
            }
            Err(e) => {
                let _ = e.term_code();
            }
        }
    }
});
