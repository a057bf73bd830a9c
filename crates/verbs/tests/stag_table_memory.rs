//! A region registered under an STag the caller chooses costs the STag
//! table about its own slot, wherever the index lies in 24 bits.
//!
//! A store's arena is registered under the group's STag (the same on the
//! primary and the secondary, so a remote pointer is valid on both), and
//! its index is anywhere in 24 bits. The table was a vector grown up to
//! the index, with every index below it put on a free list: ~16 bytes
//! plus 4 per index below, ~200 MB and a third of a second of CPU for
//! every store node at start (found in a `perf` of `softrdma store
//! bench-large`, `StagTable::reserve` at 1.6% of each node's samples).
//!
//! A counting global allocator sums the bytes this thread allocates while
//! the registration is made (the engine's other threads are not counted).

use softrdma_verbs::*;

#[path = "support/counting_alloc.rs"]
mod counting;
use counting::bytes;

#[test]
fn a_chosen_high_stag_index_costs_the_table_little() {
    let dev = Device::open(DeviceConfig {
        publish: false,
        same_host: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    // A first registration, so the table's fixed part is allocated.
    let first = pd.register(vec![0; 4096], Access::LOCAL_WRITE).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    for index in [0x00ff_fff0u32, 0x0096_30a3, 0x0000_4000] {
        let stag = (index << 8) | 0x5a;
        let before = bytes();
        let mr = pd
            .register_with(
                vec![0; 4096],
                access,
                RegOptions {
                    stag: Some(stag),
                    ..Default::default()
                },
            )
            .unwrap();
        let cost = bytes() - before;
        assert_eq!(mr.rkey().raw(), stag);
        // The buffer itself is the caller's; a page of slots and the
        // region's own records are all the table may add.
        assert!(
            cost < 1 << 20,
            "registering under index {index:#x} allocated {cost} bytes"
        );
        // Taken: a second reservation of the index is refused.
        let again = pd.register_with(
            vec![0; 4096],
            access,
            RegOptions {
                stag: Some(stag ^ 0x01),
                ..Default::default()
            },
        );
        assert!(again.is_err(), "index {index:#x} reserved twice");
        drop(mr);
    }
    // Indices the engine picks itself are distinct, and one freed is
    // reused (the chosen ones above were freed too).
    let a = pd.register(vec![0; 64], Access::LOCAL_WRITE).unwrap();
    let b = pd.register(vec![0; 64], Access::LOCAL_WRITE).unwrap();
    let (ia, ib) = (a.rkey().stag().index(), b.rkey().stag().index());
    assert_ne!(ia, ib);
    drop(a);
    let c = pd.register(vec![0; 64], Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.rkey().stag().index(), ia, "a freed index is reused first");
    drop((first, b, c));
}
