//! The store's RESP codec (`resp_codec::parse`, `resp_codec::Decoder`):
//! arbitrary bytes never panic, a request never claims more bytes than it
//! was given, the arguments of what parses, encoded as a client would,
//! parse back the same, and a decoder fed the same bytes in pieces (as a
//! connection delivers them), gathering long arguments apart or not, finds
//! the same requests as one buffer does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::resp_codec::{self, Decoder};

fuzz_target!(|input: &[u8]| {
    let Some((&step, data)) = input.split_first() else {
        return;
    };
    let whole = resp_codec::parse(data);
    if let Ok(Some((args, used))) = &whole {
        assert!(*used > 0 && *used <= data.len());
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        assert_eq!(resp_codec::parse(&b), Ok(Some((args.clone(), b.len()))));
    }
    // In pieces of `step` bytes: the first answer that is not "more bytes"
    // is the one-buffer answer, once all its bytes have arrived; the
    // decoder gathers arguments of a few bytes or more apart (as the
    // door's does from 64 KiB, `Decoder::bulk_room`), or none.
    let mut d = match step & 0x80 {
        0 => Decoder::default(),
        _ => Decoder::gathering_from((step >> 4 & 7) as usize + 1),
    };
    let step = step as usize % 16 + 1;
    let mut end = 0;
    while end < data.len() {
        end = (end + step).min(data.len());
        match d.decode(&data[..end]) {
            Ok(None) => continue,
            r => {
                match (&r, &whole) {
                    (Ok(Some(a)), Ok(Some(b))) => assert_eq!(a, b),
                    // An error may show before the buffer's end, but it is
                    // an error for the whole buffer too.
                    (Err(_), w) => assert!(w.is_err(), "{r:?} vs {w:?}"),
                    _ => panic!("pieces {r:?}, whole {whole:?}"),
                }
                return;
            }
        }
    }
    assert_eq!(whole, Ok(None));
});
