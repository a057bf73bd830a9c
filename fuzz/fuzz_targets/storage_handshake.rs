//! The storage target's network inputs: the connect request and accept
//! (MPA private data) and the control messages (Sends). Arbitrary bytes
//! never panic, and whatever decodes encodes back to a frame that decodes
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_storage::endpoint::{
    decode_accept, decode_control, decode_control_reply, decode_request, encode_accept,
    encode_control, encode_request, ControlOp,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((token, relaxed)) = decode_request(data) {
        assert_eq!(
            decode_request(&encode_request(&token, relaxed)),
            Ok((token, relaxed))
        );
    }
    if let Ok(regions) = decode_accept(data) {
        let again = encode_accept(&regions).expect("decoded lists fit");
        assert_eq!(decode_accept(&again), Ok(regions));
    }
    if let Some((op, id)) = decode_control(data) {
        let mut again = encode_control(ControlOp::Ping, id);
        again[5] = op;
        assert_eq!(decode_control(&again), Some((op, id)));
    }
    let _ = decode_control_reply(data);
});
