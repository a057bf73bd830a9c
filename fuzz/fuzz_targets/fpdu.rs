//! MPA FPDU framing: parse arbitrary bytes as a stream of FPDUs, with and
//! without CRC; every FPDU that parses must re-encode to a frame of the same
//! length that parses to the same ULPDU.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::mpa;

fn walk(mut data: &[u8], crc: bool) {
    while let Ok((ulpdu, used)) = mpa::decode_fpdu(data, crc) {
        assert!(used <= data.len() && used >= 8 && used % 4 == 0);
        assert_eq!(used, mpa::fpdu_len(ulpdu.len()));
        assert_eq!(ulpdu, &data[2..2 + ulpdu.len()]);
        let mut out = Vec::new();
        mpa::encode_fpdu(ulpdu, crc, &mut out);
        assert_eq!(out.len(), used);
        assert_eq!(&out[..2 + ulpdu.len()], &data[..2 + ulpdu.len()]);
        assert_eq!(mpa::decode_fpdu(&out, crc), Ok((ulpdu, used)));
        if crc {
            // The CRC verified over the input's pad; with a zero pad, the
            // frames are identical.
            let pad = mpa::pad_len(ulpdu.len());
            if data[2 + ulpdu.len()..2 + ulpdu.len() + pad]
                .iter()
                .all(|&b| b == 0)
            {
                assert_eq!(&out[..], &data[..used]);
            }
        }
        data = &data[used..];
    }
    if let Err(e) = mpa::decode_fpdu(data, crc) {
        let _ = e.term_code();
        let _ = e.to_string();
    }
}

fuzz_target!(|data: &[u8]| {
    walk(data, false);
    walk(data, true);
});
