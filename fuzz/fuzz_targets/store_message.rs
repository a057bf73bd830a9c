//! The HA store's network messages (`proto::decode`) and connection private
//! data (`net::handshake`: the connect intro, the accept reply, the
//! rejection): arbitrary bytes never panic; whatever decodes re-encodes to
//! bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::net::handshake::{decode_intro, Accept, Refusal};
use softrdma_store::proto;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = proto::decode(data) {
        let bytes = proto::encode(&env);
        assert_eq!(proto::decode(&bytes).as_ref(), Ok(&env));
    }
    if let Some((intro, covered)) = decode_intro(data) {
        let again = intro.encode();
        assert_eq!(decode_intro(&again), Some((intro.clone(), covered)));
        assert_eq!(&again[..covered], &intro.hello.encode()[..]);
    }
    if let Some(a) = Accept::decode(data) {
        assert_eq!(Accept::decode(&a.encode()), Some(a));
    }
    if let Some(r) = Refusal::decode(data) {
        // A reason is cut to what MPA private data can carry.
        if let Refusal::Challenge(_) = r {
            assert_eq!(Refusal::decode(&r.encode()), Some(r));
        }
    }
});
