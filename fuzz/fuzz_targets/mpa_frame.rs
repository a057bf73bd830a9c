//! MPA Request/Reply frames: decode arbitrary bytes; whatever decodes must
//! re-encode to the same header fields and private data, and decode again
//! to the same frame. Without sanitizer hooks libFuzzer cannot learn the
//! 16-byte keys, so the input is also tried behind each key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::mpa::{MpaHeader, HEADER_LEN, REP_KEY, REQ_KEY};
use softrdma_wire::{MpaFrame, MpaV2};

fuzz_target!(|data: &[u8]| {
    check(data);
    for key in [REQ_KEY, REP_KEY] {
        let mut keyed = key.to_vec();
        keyed.extend_from_slice(data);
        check(&keyed);
    }
});

fn check(data: &[u8]) {
    let _ = MpaV2::decode(data);
    let hdr = MpaHeader::decode(data);
    match MpaFrame::decode_all(data) {
        Ok((frame, used)) => {
            let hdr = hdr.expect("a frame that decodes has a header that decodes");
            assert_eq!(used, HEADER_LEN + hdr.pd_len as usize);
            assert!(used <= data.len());
            let bytes = frame.encode().expect("a decoded frame re-encodes");
            assert_eq!(bytes.len(), frame.len());
            assert_eq!(bytes.len(), used);
            // Key, M/C/R flags, revision, length and private data survive;
            // only reserved flag bits (and S without revision 2) may not.
            assert_eq!(&bytes[..16], &data[..16]);
            assert_eq!(bytes[16] & 0xE0, data[16] & 0xE0);
            assert_eq!(&bytes[17..used], &data[17..used]);
            let (again, n) = MpaFrame::decode_all(&bytes).expect("re-encoded frame decodes");
            assert_eq!(n, used);
            assert_eq!(again, frame);
            // softrdma's extension block: stripping never loses or invents
            // application bytes.
            let pd = &frame.private_data;
            match softrdma_wire::mpa::ext::strip(pd) {
                (Some(f), rest) => {
                    // The block, and after it the same-host record when
                    // that flag is set (`ext::parse`).
                    use softrdma_wire::mpa::ext;
                    let skip = ext::LEN
                        + if f & ext::SAME_HOST != 0 {
                            ext::SAME_HOST_LEN
                        } else {
                            0
                        };
                    assert_eq!(rest, &pd[skip..]);
                    assert_eq!(f & !ext::KNOWN, 0);
                }
                (None, rest) => assert_eq!(rest, &pd[..]),
            }
        }
        Err(e) => {
            let _ = e.term_code();
            let _ = e.to_string();
        }
    }
}
