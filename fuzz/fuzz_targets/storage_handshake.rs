//! The storage target's connect request and accept (MPA private data from
//! the network): arbitrary bytes never panic, and whatever decodes encodes
//! back to a frame that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_storage::endpoint::{decode_accept, decode_request, encode_accept, encode_request};

fuzz_target!(|data: &[u8]| {
    if let Ok((token, relaxed)) = decode_request(data) {
        assert_eq!(decode_request(&encode_request(&token, relaxed)), Ok((token, relaxed)));
    }
    if let Ok(regions) = decode_accept(data) {
        let again = encode_accept(&regions).expect("decoded lists fit");
        assert_eq!(decode_accept(&again), Ok(regions));
    }
});
