//! The storage target's network inputs: the connect request and accept
//! (MPA private data) and the control messages (Sends). Arbitrary bytes
//! never panic, and whatever decodes encodes back to a frame that decodes
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_storage::endpoint::{
    decode_control, decode_control_reply, decode_listing, decode_request, encode_control_arg,
    encode_listing, encode_request, ControlOp,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((token, relaxed)) = decode_request(data) {
        assert_eq!(
            decode_request(&encode_request(&token, relaxed)),
            Ok((token, relaxed))
        );
    }
    if let Ok(listing) = decode_listing(data) {
        let again = encode_listing(&listing.regions, listing.total);
        assert_eq!(decode_listing(&again), Ok(listing));
    }
    if let Some((op, arg, id)) = decode_control(data) {
        let mut again = encode_control_arg(ControlOp::Info, arg, id);
        again[5] = op;
        assert_eq!(decode_control(&again), Some((op, arg, id)));
    }
    let _ = decode_control_reply(data);
});
