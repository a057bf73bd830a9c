//! Registration pins the heap's blocks (`mlock`, counted against the
//! process's registration limit). Alone in its test binary: the pinned
//! byte count and the limit are process-wide.

use softrdma_heap::{Heap, HeapConfig, HeapError};
use softrdma_verbs::Device;

#[test]
fn blocks_are_pinned_once_and_the_limit_is_enforced() {
    if !softrdma_verbs::pinning_enabled() {
        eprintln!("pinning is off (SOFTRDMA_PIN=0): nothing to check");
        return;
    }
    let name = format!("t-pin-{}", std::process::id());
    let _ = Heap::unlink(&name);
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cfg = HeapConfig {
        block_size: 1 << 20,
        max_blocks: 16,
        units: 16,
        ..HeapConfig::new(&name)
    };
    let heap = Heap::create(&pd, &cfg).unwrap();
    let before = softrdma_verbs::pinned_bytes();
    let b = heap.alloc(4096).unwrap();
    let k = heap.lookup(b.addr(), 1).unwrap();
    assert_eq!(softrdma_verbs::pinned_bytes() - before, k.region_len);
    // More allocations from the block pin nothing more.
    let more: Vec<_> = (0..50).map(|_| heap.alloc(4096).unwrap()).collect();
    assert_eq!(softrdma_verbs::pinned_bytes() - before, k.region_len);
    // Past the limit, a new block cannot be registered: a clear error, and
    // the slot it would have used is given back.
    softrdma_verbs::set_pin_limit(Some(softrdma_verbs::pinned_bytes() + 4096));
    let r = heap.alloc(100 << 10);
    assert!(
        matches!(r, Err(HeapError::Register(ref e)) if e.contains("pinned memory")),
        "{r:?}"
    );
    softrdma_verbs::set_pin_limit(None);
    let rep = heap.check(true).unwrap();
    assert_eq!(rep.slots_used, 51, "the failed allocation holds no slot");
    drop((b, more));
    heap.trim().unwrap();
    assert_eq!(heap.registrations_held(), 0);
    assert_eq!(softrdma_verbs::pinned_bytes(), before);
    drop(heap);
    Heap::unlink(&name).unwrap();
}
