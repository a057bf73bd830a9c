//! The HA store's network messages (`proto::decode`) and connection private
//! data (`net::decode_hello`, `net::parse_accept`): arbitrary bytes never
//! panic; whatever decodes re-encodes to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::{net, proto};

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = proto::decode(data) {
        let bytes = proto::encode(&env);
        assert_eq!(proto::decode(&bytes).as_ref(), Ok(&env));
    }
    if let Some(h) = net::decode_hello(data) {
        assert_eq!(net::decode_hello(&h.encode()), Some(h));
    }
    if let Some((node, arena)) = net::parse_accept(data) {
        assert_eq!(
            net::parse_accept(&net::encode_accept(node, arena)),
            Some((node, arena))
        );
    }
});
