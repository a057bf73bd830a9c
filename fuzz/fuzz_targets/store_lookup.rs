//! What a store client takes from a remote arena with one-sided Reads: the
//! superblock, index buckets and objects, and the key look-up fed them.
//! Arbitrary bytes (a hostile or broken node) never panic the client, and
//! a look-up ends (found, absent or gave up) within a bounded number of
//! reads whatever it is fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::index::{self, Layout};
use softrdma_store::lookup::{Lookup, Outcome, Step};
use softrdma_store::object;

fuzz_target!(|data: &[u8]| {
    let _ = Layout::from_superblock(data, 1 << 30);
    let _ = index::decode_bucket(3, data);
    if let Ok(o) = object::decode_exact(data) {
        assert!(o.key.len() <= object::MAX_KEY_LEN);
        assert!(o.key.len() + o.data.len() + object::HEADER_LEN <= data.len());
    }
    // A look-up fed slices of `data` as the answers to its reads.
    let layout = Layout::new(index::SUPERBLOCK_LEN, 7);
    let cached = data.first().map(|&b| (64 * b as u64, 64 * (b as u32 % 5)));
    let (mut l, mut step) = Lookup::start(b"fuzzed-key", layout, cached);
    let mut at = 0usize;
    for _ in 0..1000 {
        match step {
            Step::Done(Outcome::Found { data: v, .. }) => {
                assert!(v.len() <= data.len());
                return;
            }
            Step::Done(_) => return,
            Step::Read { offset, len } => {
                // The client refuses a read outside its arena (1 GiB here).
                if offset.saturating_add(len as u64) > 1 << 30 || len > 1 << 20 {
                    return;
                }
                let n = len as usize;
                let mut buf = vec![0u8; n];
                let take = n.min(data.len().saturating_sub(at));
                buf[..take].copy_from_slice(&data[at..at + take]);
                at += take;
                step = l.on_read(&buf);
            }
        }
    }
    panic!("a look-up did not end within 1000 reads");
});
