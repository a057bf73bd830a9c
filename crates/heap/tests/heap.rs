//! The heap in one process: allocation, look-up, release and lazy
//! retirement of stale registrations, the post check, limits and errors.
//! (`crates/cli/tests/heap.rs` runs several processes.)

use softrdma_heap::{Heap, HeapConfig, HeapError};
use softrdma_verbs::{Access, Device, QpInitAttr, SendWr};
use std::time::Duration;

fn name(t: &str) -> String {
    format!("t-{t}-{}", std::process::id())
}

/// Unlinks the segment when the test ends, pass or fail.
struct Unlink(String);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = Heap::unlink(&self.0);
    }
}

fn cfg(n: &str) -> HeapConfig {
    HeapConfig {
        block_size: 1 << 20,
        max_blocks: 64,
        units: 64,
        check_posts: true,
        ..HeapConfig::new(n)
    }
}

#[test]
fn allocations_know_their_keys_and_lookup_finds_them() {
    let n = name("keys");
    let _u = Unlink(n.clone());
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let heap = Heap::create(&pd, &cfg(&n)).unwrap();
    let sizes = [
        1usize,
        64,
        100,
        4096,
        5000,
        200 << 10,
        300 << 10,
        2 << 20,
        3 << 20,
    ];
    let mut bufs = Vec::new();
    for (k, &len) in sizes.iter().enumerate() {
        let mut b = heap.alloc(len).unwrap();
        assert_eq!(b.len(), len);
        assert_eq!(b.addr() % 64, 0, "{len}: 64-byte aligned");
        if len >= 4096 {
            assert_eq!(b.addr() % 4096, 0, "{len}: page aligned");
        }
        b.fill(k as u8 + 1);
        for at in [0, len / 2, len - 1] {
            let keys = heap.lookup(b.addr() + at as u64, len - at).unwrap();
            assert_eq!(
                (keys.lkey, keys.rkey),
                (b.lkey(), b.rkey()),
                "{len} at {at}"
            );
            assert_eq!((keys.block, keys.gen), b.block());
            assert!(keys.region_addr <= b.addr());
            assert!(b.addr() + len as u64 <= keys.region_addr + keys.region_len);
        }
        // Past the end of the block, or spanning out of it: refused.
        let keys = heap.lookup(b.addr(), len).unwrap();
        let end = keys.region_addr + keys.region_len;
        assert!(matches!(
            heap.lookup(end - 1, 2),
            Err(HeapError::NotInHeap(_))
        ));
        bufs.push(b);
    }
    for (k, b) in bufs.iter().enumerate() {
        assert!(
            b.to_vec().iter().all(|&x| x == k as u8 + 1),
            "allocations overlap"
        );
    }
    // Outside the heap, before the data of a block (its header), free units.
    let base = heap.area_base();
    assert!(matches!(
        heap.lookup(base - 1, 1),
        Err(HeapError::NotInHeap(_))
    ));
    let (bs, _, units) = heap.geometry();
    assert!(matches!(
        heap.lookup(base + (units as u64 - 1) * bs, 1),
        Err(HeapError::NotInHeap(_))
    ));
    let first = heap.lookup(bufs[0].addr(), 1).unwrap();
    assert!(matches!(
        heap.lookup(first.region_addr - 64, 1),
        Err(HeapError::NotInHeap(_))
    ));
    let rep = heap.check(true).unwrap();
    assert_eq!(rep.slots_used, sizes.len() as u64);
    let st = heap.stats();
    assert_eq!(st.registrations as usize, heap.registrations_held());
    assert!(st.cache_hits > 0);
    // Several allocations of one class share a block (one registration).
    let more: Vec<_> = (0..100).map(|_| heap.alloc(64).unwrap()).collect();
    assert_eq!(heap.stats().registrations, st.registrations);
    assert!(more.iter().all(|b| b.lkey() == bufs[1].lkey()));
    drop(more);
    // A reused slot keeps old bytes; alloc_zeroed does not.
    let mut d = heap.alloc(4096).unwrap();
    d.fill(0xee);
    drop(d);
    let z = heap.alloc_zeroed(4096).unwrap();
    assert!(z.to_vec().iter().all(|&v| v == 0));
    drop(z);
    drop(bufs);
    heap.trim().unwrap();
    let rep = heap.check(true).unwrap();
    assert_eq!(
        (rep.active_blocks, rep.slots_used, rep.units_used),
        (0, 0, 0)
    );
}

/// Two handles stand for two processes (each its own device and private
/// table): B's block is released and its descriptor reused for a new block
/// elsewhere; A's registration of the old one is stale, the post check
/// refuses it, and A's next look-up retires it and registers the new one.
#[test]
fn stale_registrations_are_refused_and_retired_lazily() {
    let n = name("stale");
    let _u = Unlink(n.clone());
    let dev_a = Device::open_default().unwrap();
    let dev_b = Device::open_default().unwrap();
    let pd_a = dev_a.alloc_pd().unwrap();
    let pd_b = dev_b.alloc_pd().unwrap();
    let b = Heap::create(&pd_b, &cfg(&n)).unwrap();
    let a = Heap::open(&pd_a, &n, Access::LOCAL_WRITE, true).unwrap();
    let mut x = b.alloc(1000).unwrap();
    x.fill(0x5a);
    // One process maps the segment once per handle: A names the bytes by
    // its own address (other processes usually get the creator's).
    let xa = a.addr_of(x.offset()).unwrap();
    let ka = a.lookup(xa, 1000).unwrap();
    assert_eq!(a.stats().registrations, 1);
    // A can use it: a local QP of A's device writes it into a region.
    let cq = dev_a.create_cq(16).unwrap();
    let qp = pd_a.create_qp(QpInitAttr::new(&cq)).unwrap();
    qp.connect_local().unwrap();
    let sink = pd_a
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let sge = softrdma_verbs::Sge {
        addr: xa,
        length: 1000,
        lkey: softrdma_verbs::Lkey::from_raw(ka.lkey),
    };
    qp.post_send(&SendWr::write(1, &[sge], sink.addr(), sink.rkey()))
        .unwrap();
    let wc = cq.wait_one(Duration::from_secs(5)).unwrap();
    assert!(wc.is_ok(), "{wc:?}");
    let mut got = vec![0u8; 1000];
    sink.read_at(0, &mut got);
    assert!(got.iter().all(|&v| v == 0x5a));
    // B frees and releases the block, then obtains another: the same
    // descriptor (LIFO free list), a new id, a different place.
    let old = x.block();
    drop(x);
    assert!(b.trim().unwrap() >= 1);
    let y = b.alloc(1000).unwrap();
    assert_eq!(y.block().0, old.0, "descriptor reused");
    assert_ne!(y.block().1, old.1, "with a new block id");
    assert_ne!(
        y.offset() / (1 << 20),
        (ka.region_addr - a.area_base()) / (1 << 20),
        "in another unit"
    );
    // A still holds the old registration (nobody told it) ...
    assert_eq!(a.registrations_held(), 1);
    // ... but may not use it: the post check refuses the work request.
    let e = qp
        .post_send(&SendWr::write(2, &[sge], sink.addr(), sink.rkey()))
        .unwrap_err();
    assert!(e.to_string().contains("stale heap registration"), "{e}");
    // A's next look-up of that block retires the stale registration.
    let ky = a.lookup(a.addr_of(y.offset()).unwrap(), 1000).unwrap();
    let st = a.stats();
    assert_eq!(st.stale_retired, 1);
    assert_eq!(st.registrations, 2);
    assert_eq!((ky.block, ky.gen), y.block());
    assert_eq!(a.registrations_held(), 1);
    // The old lkey is gone from the engine too.
    let e = qp.post_send(&SendWr::write(3, &[sge], sink.addr(), sink.rkey()));
    match e {
        Err(_) => {}
        Ok(()) => {
            let wc = cq.wait_one(Duration::from_secs(5)).unwrap();
            assert!(!wc.is_ok(), "a retired lkey must not work: {wc:?}");
        }
    }
    b.check(true).unwrap();
}

#[test]
fn limits_and_bad_settings_are_clear_errors() {
    let n = name("limits");
    let _u = Unlink(n.clone());
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let bad = |f: fn(&mut HeapConfig)| {
        let mut c = cfg(&name("bad"));
        f(&mut c);
        let r = Heap::create(&pd, &c);
        assert!(matches!(r, Err(HeapError::Config(_))), "{:?}", r.err());
    };
    bad(|c| c.block_size = 3 << 20);
    bad(|c| c.block_size = 4096);
    bad(|c| c.max_blocks = 0);
    bad(|c| c.units = 0);
    bad(|c| c.name = "../etc".into());
    assert!(matches!(
        Heap::open(&pd, &name("missing"), Access::LOCAL_WRITE, false),
        Err(HeapError::NotFound(_))
    ));
    let small = HeapConfig {
        max_blocks: 3,
        units: 4,
        ..cfg(&n)
    };
    let heap = Heap::create(&pd, &small).unwrap();
    assert!(matches!(
        Heap::create(&pd, &small),
        Err(HeapError::Exists(_))
    ));
    // 4 units of 1 MiB: a 5 MiB allocation can never fit.
    assert!(matches!(
        heap.alloc(5 << 20),
        Err(HeapError::TooLarge { .. })
    ));
    // Three classes take the three descriptors; a fourth finds none.
    let _a = heap.alloc(64).unwrap();
    let _b = heap.alloc(128).unwrap();
    let _c = heap.alloc(256).unwrap();
    assert!(matches!(heap.alloc(512), Err(HeapError::TableFull(3))));
    // The failed allocations changed nothing.
    let rep = heap.check(true).unwrap();
    assert_eq!((rep.active_blocks, rep.slots_used), (3, 3));
    drop((_a, _b, _c));
    heap.trim().unwrap();
    // Area: 4 units; a 3-unit block then a 2-unit one does not fit.
    let big = heap.alloc(2 << 20).unwrap();
    assert!(matches!(
        heap.alloc((1 << 20) + 1),
        Err(HeapError::AreaFull(_))
    ));
    drop(big);
    assert!(heap.alloc((1 << 20) + 1).is_ok());
    // A foreign file under the heap's name is refused, not used.
    let f = name("foreign");
    let _u2 = Unlink(f.clone());
    std::fs::write(softrdma_heap::path_of(&f), vec![7u8; 8192]).unwrap();
    assert!(matches!(
        Heap::open(&pd, &f, Access::LOCAL_WRITE, false),
        Err(HeapError::Corrupt(_))
    ));
}

/// A segment of layout version 1 (32-bit block ids) is refused with an
/// error that says what to do, and left as it was: it is never read with
/// the wrong layout.
#[test]
fn a_segment_of_the_old_layout_is_refused_clearly() {
    use std::os::unix::fs::FileExt;
    let n = name("v1");
    let _u = Unlink(n.clone());
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    drop(Heap::create(&pd, &cfg(&n)).unwrap());
    let path = softrdma_heap::path_of(&n);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // The header's version field (after the 8-byte magic).
    f.write_at(&1u32.to_le_bytes(), 8).unwrap();
    drop(f);
    let before = std::fs::read(&path).unwrap();
    let e = Heap::open(&pd, &n, Access::LOCAL_WRITE, false).unwrap_err();
    assert!(
        matches!(
            e,
            HeapError::Version {
                found: 1,
                want: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("version 1")
            && msg.contains("64-bit block ids")
            && msg.contains(&format!("softrdma heap unlink {n}")),
        "{msg}"
    );
    let cfg = cfg(&n);
    assert!(matches!(
        Heap::open_or_create(&pd, &cfg),
        Err(HeapError::Version { .. })
    ));
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the segment was not touched"
    );
}

/// Threads of one process allocate and free concurrently from the same
/// classes: no two live buffers overlap and the counts add up.
#[test]
fn concurrent_threads_never_share_a_slot() {
    let n = name("threads");
    let _u = Unlink(n.clone());
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let heap = Heap::create(&pd, &cfg(&n)).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let heap = heap.clone();
            s.spawn(move || {
                let mut live = Vec::new();
                let mut x = 0x9e3779b97f4a7c15u64 ^ t as u64;
                for _ in 0..3000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 50 && !x.is_multiple_of(3) {
                        let len = 1 + (x >> 8) as usize % 9000;
                        let mut b = heap.alloc(len).unwrap();
                        b.fill(t);
                        live.push(b);
                    } else if !live.is_empty() {
                        let b = live.swap_remove((x >> 8) as usize % live.len());
                        assert!(
                            b.to_vec().iter().all(|&v| v == t),
                            "another thread wrote into our buffer"
                        );
                    }
                }
                for b in &live {
                    assert!(b.to_vec().iter().all(|&v| v == t));
                }
            });
        }
    });
    let rep = heap.check(true).unwrap();
    assert_eq!(rep.slots_used, 0);
}

/// Creators and openers racing on one name all end up on one initialised
/// heap (the creator publishes the segment with link(2) only once it is
/// initialised), and no temporary file is left behind.
#[test]
fn racing_creators_and_openers_share_one_heap() {
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    for round in 0..20 {
        let n = name(&format!("race{round}"));
        let _u = Unlink(n.clone());
        let heaps: Vec<Heap> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| Heap::open_or_create(&pd, &cfg(&n)).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let b = heaps[0].alloc(64).unwrap();
        for h in &heaps {
            let k = h.lookup(h.addr_of(b.offset()).unwrap(), 64).unwrap();
            assert_eq!((k.block, k.gen), b.block(), "round {round}");
        }
        let left: Vec<_> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let f = e.file_name();
                let f = f.to_string_lossy();
                f.starts_with(&format!("softrdma-heap-{n}.init-"))
            })
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}
