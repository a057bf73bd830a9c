//! The store's RESP front door codec (`resp::parse`): arbitrary bytes never
//! panic, a request never claims more bytes than it was given, and the
//! arguments of what parses, encoded as a client would, parse back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::resp;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((args, used))) = resp::parse(data) {
        assert!(used > 0 && used <= data.len());
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in &args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        assert_eq!(resp::parse(&b), Ok(Some((args, b.len()))));
    }
});
