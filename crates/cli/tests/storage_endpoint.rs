//! The storage endpoint (issue 4): a store's partitions as RDMA regions,
//! served by `softrdma storage serve` over iWARP and reached in-process
//! through a local QP, with per-principal rights, token checks at connect
//! time, strict and relaxed ordering, Flush as a durability barrier, and
//! survival of `kill -9`.

mod common;
use common::*;
use softrdma_storage::endpoint::{
    connect, decode_accept, decode_control_reply, encode_control, ConnectError, ControlOp,
    ControlStatus, Endpoint, PartitionRegion, CTRL_MAX,
};
use softrdma_storage::layout::Rights;
use softrdma_storage::{InitOptions, PartitionSpec, Store};
use softrdma_verbs::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");
const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(20);

/// A 2 + 2 x 8 MiB store: alice rw on p0 and r on p1, bob r on p0.
fn store(w: &Work) -> (std::path::PathBuf, [u8; 32], [u8; 32]) {
    let p = w.path("store.img");
    let mut s = Store::init(
        &p,
        &InitOptions {
            size: Some(18 * MIB),
            partitions: PartitionSpec::Equal(2),
            align: MIB,
            force: false,
        },
    )
    .unwrap();
    let a = s.grant("0", "alice", Rights::READ_WRITE).unwrap().unwrap();
    s.grant("1", "alice", Rights::READ).unwrap();
    let b = s.grant("0", "bob", Rights::READ).unwrap().unwrap();
    (p, a, b)
}

/// Starts `softrdma storage serve` on a free port.
fn serve(path: &Path, direct: bool) -> (Child, SocketAddr) {
    let mut c = Command::new(SOFTRDMA)
        .args(["storage", "serve", path.to_str().unwrap(), "--port", "0"])
        .args(["--direct", if direct { "on" } else { "off" }])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split(" on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .parse()
        .unwrap();
    (c, addr)
}

struct Client {
    _dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn client() -> Client {
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps.max_send_wr = 1024;
    let qp = pd.create_qp(attr).unwrap();
    Client {
        _dev: dev,
        pd,
        cq,
        qp,
    }
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait_one(T).expect("completion within 20 s")
}

/// A QP of `pd` connected locally (no network), strict or relaxed.
fn local_qp(dev: &Device, pd: &ProtectionDomain, relaxed: bool) -> (QueuePair, CompletionQueue) {
    let cq = dev.create_cq(256).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.relaxed_ordering = relaxed;
    let qp = pd.create_qp(attr).unwrap();
    qp.connect_local().unwrap();
    (qp, cq)
}

fn file_bytes(path: &Path, at: u64, n: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut v = vec![0; n];
    f.read_exact_at(&mut v, at).unwrap();
    v
}

/// A xorshift generator of numbers below its argument.
fn rng(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    }
}

/// A store opened with O_DIRECT (io_uring required) and alice's
/// partitions attached locally: (store path, endpoint, device, PD,
/// session, partition 0's rkey, its offset in the file).
fn direct_local(
    w: &Work,
) -> (
    std::path::PathBuf,
    Endpoint,
    Device,
    ProtectionDomain,
    softrdma_storage::endpoint::Session,
    u32,
    u64,
) {
    let (path, _a, _b) = store(w);
    let ep = Endpoint::open_with(
        &path.to_string_lossy(),
        softrdma_storage::endpoint::Direct::On,
    )
    .unwrap();
    assert!(ep.uses_io_uring(), "io_uring refused by the kernel");
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let s = ep.attach(&pd, "alice").unwrap();
    let p0 = s.region(0).unwrap().rkey;
    let off0 = partition_offset(&path, 0);
    (path, ep, dev, pd, s, p0, off0)
}

fn partition_offset(path: &Path, i: usize) -> u64 {
    Store::open(path).unwrap().layout().partitions[i].offset
}

/// Over iWARP: alice writes (several segments) and reads back her
/// partition, the bytes are in the file at the partition's offset after a
/// Flush; a Write to her read-only partition is refused with a remote
/// access error and changes nothing; bob (read-only) cannot write; an
/// unknown token is refused at connect time.
#[test]
fn remote_rights_tokens_and_flush() {
    let w = Work::new("storage-remote");
    let (path, alice, bob) = store(&w);
    let (mut child, addr) = serve(&path, false);
    let off0 = partition_offset(&path, 0);
    let off1 = partition_offset(&path, 1);

    let c = client();
    let regions = connect(&c.qp, &c.cq, addr, &alice, false).unwrap();
    let want = |i, rights| PartitionRegion {
        index: i,
        rkey: regions.iter().find(|r| r.index == i).unwrap().rkey,
        len: 8 * MIB,
        rights,
    };
    assert_eq!(
        regions,
        vec![want(0, Rights::READ_WRITE), want(1, Rights::READ)]
    );
    let data = pattern(1 << 20, 1);
    let src = c.pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    let dst = c.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let p0 = regions[0].rkey;
    c.qp.post_send(&SendWr::write(
        1,
        &[src.sge(0, 300_000)],
        12_345,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    c.qp.post_send(&SendWr::flush(2, 0, softrdma_verbs::Rkey::from_raw(p0)))
        .unwrap();
    c.qp.post_send(&SendWr::read(
        3,
        dst.sge(0, 300_000),
        12_345,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    for id in 1..=3 {
        let wc = wait(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    assert_eq!(dst.to_vec()[..300_000], data[..300_000]);
    assert_eq!(file_bytes(&path, off0 + 12_345, 300_000), data[..300_000]);

    // Control messages over Send/Receive: Ping, Info (the partition list
    // again), FlushAll after a Write, and an unknown operation.
    let rbuf = c.pd.alloc_mr(4 * CTRL_MAX, Access::LOCAL_WRITE).unwrap();
    let ask = |op: u8, id: u64, slot: usize| -> (u8, u8, u64, Vec<u8>) {
        c.qp.post_recv(&RecvWr::new(
            50 + id,
            &[rbuf.sge(slot * CTRL_MAX, CTRL_MAX)],
        ))
        .unwrap();
        let mut req = encode_control(ControlOp::Ping, id);
        req[5] = op;
        let m = c.pd.register(req, Access::LOCAL_WRITE).unwrap();
        c.qp.post_send(&SendWr::send(60 + id, &[m.sge_all()]))
            .unwrap();
        let mut got = None;
        for _ in 0..2 {
            let wc = wait(&c.cq);
            assert_eq!(wc.status, WcStatus::Success);
            if wc.opcode == WcOpcode::Recv {
                let mut b = vec![0; wc.byte_len as usize];
                rbuf.read_at(slot * CTRL_MAX, &mut b);
                let (o, s, i, p) = decode_control_reply(&b).expect("a control reply");
                got = Some((o, s, i, p.to_vec()));
            }
        }
        got.expect("reply received")
    };
    assert_eq!(
        ask(ControlOp::Ping as u8, 1, 0),
        (1, ControlStatus::Ok as u8, 1, vec![])
    );
    let (_, s, _, listing) = ask(ControlOp::Info as u8, 2, 1);
    assert_eq!(s, ControlStatus::Ok as u8);
    assert_eq!(decode_accept(&listing).unwrap(), regions);
    c.qp.post_send(&SendWr::write(
        9,
        &[src.sge(0, 4096)],
        1 << 20,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::Success);
    assert_eq!(
        ask(ControlOp::FlushAll as u8, 3, 2).1,
        ControlStatus::Ok as u8
    );
    assert_eq!(file_bytes(&path, off0 + (1 << 20), 4096), data[..4096]);
    assert_eq!(ask(99, 4, 3).1, ControlStatus::Unknown as u8);

    // Write to the read-only partition: refused, nothing changes.
    let before = file_bytes(&path, off1, 4096);
    c.qp.post_send(&SendWr::write(
        4,
        &[src.sge(0, 4096)],
        0,
        softrdma_verbs::Rkey::from_raw(regions[1].rkey),
    ))
    .unwrap();
    c.qp.post_send(&SendWr::flush(
        5,
        0,
        softrdma_verbs::Rkey::from_raw(regions[1].rkey),
    ))
    .unwrap();
    let statuses = [wait(&c.cq).status, wait(&c.cq).status];
    assert!(
        statuses.iter().any(|s| *s != WcStatus::Success),
        "{statuses:?}"
    );
    assert!(c.qp.wait_state(QpState::Error, T));
    assert_eq!(file_bytes(&path, off1, 4096), before);

    // bob may read partition 0 but not write it.
    let b = client();
    let r = connect(&b.qp, &b.cq, addr, &bob, false).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].rights, Rights::READ);
    let bsrc =
        b.pd.register(vec![0xEE; 4096], Access::LOCAL_WRITE)
            .unwrap();
    b.qp.post_send(&SendWr::read(
        1,
        bsrc.sge(0, 4096),
        12_345,
        softrdma_verbs::Rkey::from_raw(r[0].rkey),
    ))
    .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    assert_eq!(bsrc.to_vec(), data[..4096], "bob reads alice's bytes");
    b.qp.post_send(&SendWr::write(
        2,
        &[bsrc.sge(0, 4096)],
        0,
        softrdma_verbs::Rkey::from_raw(r[0].rkey),
    ))
    .unwrap();
    b.qp.post_send(&SendWr::flush(
        3,
        0,
        softrdma_verbs::Rkey::from_raw(r[0].rkey),
    ))
    .unwrap();
    let statuses = [wait(&b.cq).status, wait(&b.cq).status];
    assert!(statuses.iter().any(|s| *s != WcStatus::Success));
    assert_eq!(file_bytes(&path, off0 + 12_345, 4096), data[..4096]);

    // An unknown token: refused before any QP exists on the target.
    let x = client();
    match connect(&x.qp, &x.cq, addr, &[7; 32], false) {
        Err(ConnectError::Refused(why)) => assert!(why.contains("unknown token"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    kill_group(&child);
    let _ = child.wait();
}

/// In-process, no network: the same WRs through a local QP; relaxed
/// ordering too.
#[test]
fn local_endpoint_uses_the_same_verbs() {
    let w = Work::new("storage-local");
    let (path, _alice, _bob) = store(&w);
    let ep = Endpoint::open(&format!("storage:{}", path.display())).unwrap();
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let s = ep.attach(&pd, "alice").unwrap();
    assert!(ep.attach(&pd, "nobody").is_err());
    let off0 = partition_offset(&path, 0);
    for relaxed in [false, true] {
        let (qp, cq) = local_qp(&dev, &pd, relaxed);
        let data = pattern(256 << 10, relaxed as u64 + 10);
        let src = pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
        let dst = pd.alloc_mr(256 << 10, Access::LOCAL_WRITE).unwrap();
        let p0 = s.region(0).unwrap().rkey;
        for i in 0..4u64 {
            let o = i as usize * (64 << 10);
            qp.post_send(&SendWr::write(
                i,
                &[src.sge(o, 64 << 10)],
                o as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        }
        qp.post_send(&SendWr::flush(9, 0, softrdma_verbs::Rkey::from_raw(p0)))
            .unwrap();
        let mut got: Vec<u64> = (0..5)
            .map(|_| wait(&cq))
            .map(|wc| {
                assert_eq!(wc.status, WcStatus::Success);
                wc.wr_id
            })
            .collect();
        assert_eq!(got.pop(), Some(9), "the flush completes last");
        qp.post_send(&SendWr::read(
            10,
            dst.sge(0, 256 << 10),
            0,
            softrdma_verbs::Rkey::from_raw(p0),
        ))
        .unwrap();
        assert_eq!(wait(&cq).status, WcStatus::Success);
        assert_eq!(dst.to_vec(), data);
        assert_eq!(file_bytes(&path, off0, 256 << 10), data);
        // Partition 1 is read-only for alice.
        qp.post_send(&SendWr::write(
            11,
            &[src.sge(0, 16)],
            0,
            softrdma_verbs::Rkey::from_raw(s.region(1).unwrap().rkey),
        ))
        .unwrap();
        assert_eq!(wait(&cq).status, WcStatus::RemAccessErr);
    }
}

/// O_DIRECT (forced on a regular file, as `--direct on` would): aligned
/// transfers bypass the page cache, unaligned ones do not, and the two stay
/// coherent; a relaxed local QP keeps several requests in flight.
#[test]
fn direct_io_is_coherent_with_buffered() {
    use softrdma_storage::endpoint::Direct;
    let w = Work::new("storage-direct");
    let (path, _a, _b) = store(&w);
    let ep = match Endpoint::open_with(&path.to_string_lossy(), Direct::On) {
        Ok(ep) => ep,
        Err(e) => panic!("O_DIRECT refused on this file system: {e}"),
    };
    assert!(ep.is_direct());
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let s = ep.attach(&pd, "alice").unwrap();
    let p0 = s.region(0).unwrap().rkey;
    let off0 = partition_offset(&path, 0);
    for relaxed in [false, true] {
        let (qp, cq) = local_qp(&dev, &pd, relaxed);
        let data = pattern(1 << 20, 40 + relaxed as u64);
        let src = pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
        // Aligned (direct) 128 KiB pieces, then an unaligned (buffered)
        // patch across two of them; a fence before the patch.
        for i in 0..8u64 {
            let o = i as usize * (128 << 10);
            qp.post_send(&SendWr::write(
                i,
                &[src.sge(o, 128 << 10)],
                o as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        }
        let patch = pattern(1000, 77);
        let psrc = pd.register(patch.clone(), Access::LOCAL_WRITE).unwrap();
        let mut wr = SendWr::write(
            8,
            &[psrc.sge(0, 1000)],
            (128 << 10) - 500,
            softrdma_verbs::Rkey::from_raw(p0),
        );
        wr.flags = wr.flags | SendFlags::FENCE;
        qp.post_send(&wr).unwrap();
        qp.post_send(&SendWr::flush(9, 0, softrdma_verbs::Rkey::from_raw(p0)))
            .unwrap();
        for _ in 0..10 {
            assert_eq!(wait(&cq).status, WcStatus::Success);
        }
        let mut want = data.clone();
        want[(128 << 10) - 500..(128 << 10) + 500].copy_from_slice(&patch);
        // Read back aligned (direct read sees the buffered patch).
        let dst = pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        qp.post_send(&SendWr::read(
            10,
            dst.sge(0, 1 << 20),
            0,
            softrdma_verbs::Rkey::from_raw(p0),
        ))
        .unwrap();
        assert_eq!(wait(&cq).status, WcStatus::Success);
        assert!(dst.to_vec() == want, "relaxed={relaxed}");
        assert!(file_bytes(&path, off0, 1 << 20) == want);
    }
}

/// io_uring under a relaxed local QP on an O_DIRECT endpoint: rounds of 48
/// Writes in flight at once to disjoint random ranges (4 KiB-aligned ones
/// go through the ring, the others through the page cache; SGLs of 1-4
/// pieces of odd sizes), a Flush, then 48 Reads of random ranges, aligned
/// and not, at once; every Read must return the model's bytes, and so must
/// the file.
#[test]
fn relaxed_direct_io_through_io_uring() {
    let w = Work::new("storage-uring");
    let (path, _ep, dev, pd, _s, p0, off0) = direct_local(&w);
    let (qp, cq) = local_qp(&dev, &pd, true);
    const SPAN: usize = 4 << 20;
    const SLOT: usize = 64 << 10;
    let mut model = file_bytes(&path, off0, SPAN);
    let mut rnd = rng(0x2545_f491_4f6c_dd1du64);
    let src = pd.alloc_mr(48 * SLOT, Access::LOCAL_WRITE).unwrap();
    let dst = pd.alloc_mr(48 * SLOT, Access::LOCAL_WRITE).unwrap();
    let (mut aligned, mut unaligned) = (0, 0);
    for round in 0..6u64 {
        // 48 of the 64 slots, each written once, at a random range.
        let mut slots: Vec<usize> = (0..SPAN / SLOT).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rnd(i + 1));
        }
        for (k, &slot) in slots[..48].iter().enumerate() {
            let (at, len) = if rnd(2) == 0 {
                aligned += 1;
                (slot * SLOT + rnd(8) * 4096, 4096 * (1 + rnd(8)))
            } else {
                unaligned += 1;
                (slot * SLOT + rnd(SLOT / 2), 1 + rnd(SLOT / 2 - 1))
            };
            let bytes = pattern(len, round * 100 + k as u64);
            let base = k * SLOT;
            src.write_at(base, &bytes);
            model[at..at + len].copy_from_slice(&bytes);
            // Split the local side into 1-4 pieces of odd sizes.
            let mut sgl = Vec::new();
            let mut o = 0;
            for _ in 0..rnd(4) {
                if len - o > 1 {
                    let n = 1 + rnd(len - o - 1);
                    sgl.push(src.sge(base + o, n));
                    o += n;
                }
            }
            sgl.push(src.sge(base + o, len - o));
            qp.post_send(&SendWr::write(
                k as u64,
                &sgl,
                at as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        }
        qp.post_send(&SendWr::flush(100, 0, softrdma_verbs::Rkey::from_raw(p0)))
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..49 {
            let wc = wait(&cq);
            assert_eq!(
                wc.status,
                WcStatus::Success,
                "round {round} wr {}",
                wc.wr_id
            );
            seen.push(wc.wr_id);
        }
        assert_eq!(seen.pop(), Some(100), "the flush completes last");
        let mut reads = Vec::new();
        for k in 0..48usize {
            let (at, len) = if rnd(2) == 0 {
                (rnd(SPAN / 4096 - 16) * 4096, 4096 * (1 + rnd(16)))
            } else {
                let at = rnd(SPAN - SLOT);
                (at, 1 + rnd(SLOT - 1))
            };
            reads.push((k * SLOT, at, len));
            qp.post_send(&SendWr::read(
                200 + k as u64,
                dst.sge(k * SLOT, len),
                at as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        }
        for _ in 0..48 {
            let wc = wait(&cq);
            assert_eq!(
                wc.status,
                WcStatus::Success,
                "round {round} wr {}",
                wc.wr_id
            );
        }
        for (i, &(base, at, len)) in reads.iter().enumerate() {
            let mut got = vec![0u8; len];
            dst.read_at(base, &mut got);
            assert!(
                got == model[at..at + len],
                "round {round}: read {i} of {len} bytes at {at} differs"
            );
        }
    }
    assert!(aligned > 100 && unaligned > 100, "{aligned} / {unaligned}");
    assert!(file_bytes(&path, off0, SPAN) == model, "the file differs");
}

/// Buffered and direct I/O of the same pages in flight together: a
/// relaxed local QP posts, in one batch, aligned Writes (queued to
/// io_uring) and unaligned Writes and Reads into the same pages. Linux
/// cannot keep such a page cached while a direct write of it is in flight:
/// let through together, later reads fail with EIO ("page cache
/// invalidation failure"); the endpoint makes the buffered ones wait.
/// Every WR must succeed and every byte must hold a value some Write of
/// that round gave it.
#[test]
fn buffered_and_direct_writes_of_one_page_do_not_collide() {
    let w = Work::new("storage-collide");
    let (path, _ep, dev, pd, _s, p0, off0) = direct_local(&w);
    let (qp, cq) = local_qp(&dev, &pd, true);
    const WIN: usize = 64 << 10;
    let src = pd.alloc_mr(32 * WIN, Access::LOCAL_WRITE).unwrap();
    let dst = pd.alloc_mr(8 * WIN, Access::LOCAL_WRITE).unwrap();
    let mut rnd = rng(0xdead_beef_1234_5678u64);
    for round in 0..60u64 {
        let base = (round as usize % 32) * WIN;
        // Per byte of the window: the values this round's Writes gave it.
        let mut vals: Vec<Vec<u8>> = vec![Vec::new(); WIN];
        let mut wrs = Vec::new();
        for k in 0..24usize {
            let aligned = k % 2 == 0;
            let (at, len) = if aligned {
                let n = 1 + rnd(4);
                (rnd(16 - n + 1) * 4096, n * 4096)
            } else {
                let at = rnd(WIN - 5000);
                (at, 1 + rnd(4999))
            };
            let bytes = pattern(len, round * 100 + k as u64);
            src.write_at(k * WIN, &bytes);
            for (i, b) in bytes.iter().enumerate() {
                vals[at + i].push(*b);
            }
            wrs.push(SendWr::write(
                k as u64,
                &[src.sge(k * WIN, len)],
                (base + at) as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ));
            if k % 3 == 0 {
                let n = 1 + rnd(2);
                let at = rnd(16 - n + 1) * 4096;
                wrs.push(SendWr::read(
                    100 + k as u64,
                    dst.sge((k / 3) * WIN / 8 * 8 % (7 * WIN), n * 4096),
                    (base + at) as u64,
                    softrdma_verbs::Rkey::from_raw(p0),
                ));
            }
        }
        wrs.push(SendWr::flush(999, 0, softrdma_verbs::Rkey::from_raw(p0)));
        qp.post_send_batch(&wrs).unwrap();
        for _ in 0..wrs.len() {
            let wc = wait(&cq);
            assert_eq!(
                wc.status,
                WcStatus::Success,
                "round {round} wr {}",
                wc.wr_id
            );
        }
        let got = file_bytes(&path, off0 + base as u64, WIN);
        for i in 0..WIN {
            assert!(
                vals[i].is_empty() || vals[i].contains(&got[i]),
                "round {round}: byte {i} is {} (written {:?})",
                got[i],
                vals[i]
            );
        }
    }
}

/// Strict ordering pipelined through io_uring (O_DIRECT endpoint): 400
/// Writes and Reads of 1-4 blocks over only 16 blocks (so most overlap
/// something in flight), a few unaligned Writes among them, all posted at
/// once. Completions must come in posting order, every Read must return
/// the bytes as they were when it was posted (all earlier Writes, no later
/// one), and the file must end as the last Writes left it.
#[test]
fn strict_direct_io_pipelines_in_order() {
    let w = Work::new("storage-strict-uring");
    let (path, _ep, dev, pd, _s, p0, off0) = direct_local(&w);
    let cq = dev.create_cq(1024).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps.max_send_wr = 1024;
    let qp = pd.create_qp(attr).unwrap();
    qp.connect_local().unwrap();
    const BLK: usize = 4096;
    const SPAN: usize = 16 * BLK;
    const OPS: usize = 400;
    let mut model = file_bytes(&path, off0, SPAN);
    let mut rnd = rng(0x9e37_79b9_7f4a_7c15u64);
    let src = pd.alloc_mr(OPS * 4 * BLK, Access::LOCAL_WRITE).unwrap();
    let dst = pd.alloc_mr(OPS * 4 * BLK, Access::LOCAL_WRITE).unwrap();
    let mut reads = Vec::new();
    for k in 0..OPS {
        let base = k * 4 * BLK;
        let n = 1 + rnd(4);
        let at = rnd(16 - n + 1) * BLK;
        let len = n * BLK;
        match rnd(10) {
            0 => {
                // Unaligned: through the page cache, synchronously.
                let (at, len) = (at + 1 + rnd(100), len - 200);
                let bytes = pattern(len, 1000 + k as u64);
                src.write_at(base, &bytes);
                model[at..at + len].copy_from_slice(&bytes);
                qp.post_send(&SendWr::write(
                    k as u64,
                    &[src.sge(base, len)],
                    at as u64,
                    softrdma_verbs::Rkey::from_raw(p0),
                ))
                .unwrap();
            }
            1..=5 => {
                let bytes = pattern(len, k as u64);
                src.write_at(base, &bytes);
                model[at..at + len].copy_from_slice(&bytes);
                qp.post_send(&SendWr::write(
                    k as u64,
                    &[src.sge(base, len)],
                    at as u64,
                    softrdma_verbs::Rkey::from_raw(p0),
                ))
                .unwrap();
            }
            _ => {
                reads.push((k, base, model[at..at + len].to_vec()));
                qp.post_send(&SendWr::read(
                    k as u64,
                    dst.sge(base, len),
                    at as u64,
                    softrdma_verbs::Rkey::from_raw(p0),
                ))
                .unwrap();
            }
        }
    }
    for want in 0..OPS as u64 {
        let wc = wait(&cq);
        assert_eq!(wc.status, WcStatus::Success, "wr {}", wc.wr_id);
        assert_eq!(wc.wr_id, want, "completions out of posting order");
    }
    assert!(reads.len() > 100, "{} reads", reads.len());
    for (k, base, want) in &reads {
        let mut got = vec![0u8; want.len()];
        dst.read_at(*base, &mut got);
        assert!(got == *want, "read {k} saw other bytes than at its turn");
    }
    qp.post_send(&SendWr::flush(
        OPS as u64,
        0,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    assert_eq!(wait(&cq).status, WcStatus::Success);
    assert!(file_bytes(&path, off0, SPAN) == model, "the file differs");
}

/// A remote strict connection to an O_DIRECT target (Writes queued to
/// io_uring as they arrive): 600 Writes and Reads of 1-4 blocks over 16
/// blocks, a few unaligned Writes among them, posted back to back. Every
/// Read must return the bytes as they were when it was posted, the Flush
/// must leave the file as the last Writes made it. Then the same on a
/// relaxed connection with disjoint Writes, a Flush, and Reads after it.
#[test]
fn remote_direct_writes_are_queued_in_order() {
    let w = Work::new("storage-remote-uring");
    let (path, alice, _) = store(&w);
    let (child, addr) = serve(&path, true);
    // The target goes with the test, even when an assertion fails.
    struct Target(Child);
    impl Drop for Target {
        fn drop(&mut self) {
            kill_group(&self.0);
            let _ = self.0.wait();
        }
    }
    let _target = Target(child);
    let off0 = partition_offset(&path, 0);
    const BLK: usize = 4096;
    const SPAN: usize = 16 * BLK;
    const OPS: usize = 600;
    let mut rnd = rng(0x1234_5678_9abc_def1u64);
    // Strict.
    let c = client();
    let p0 = connect(&c.qp, &c.cq, addr, &alice, false).unwrap()[0].rkey;
    let mut model = file_bytes(&path, off0, SPAN);
    let src = c.pd.alloc_mr(OPS * 4 * BLK, Access::LOCAL_WRITE).unwrap();
    let dst = c.pd.alloc_mr(OPS * 4 * BLK, Access::LOCAL_WRITE).unwrap();
    let mut reads = Vec::new();
    for k in 0..OPS {
        let base = k * 4 * BLK;
        let n = 1 + rnd(4);
        let (mut at, mut len) = (rnd(16 - n + 1) * BLK, n * BLK);
        if rnd(3) == 0 {
            reads.push((k, base, model[at..at + len].to_vec()));
            c.qp.post_send(&SendWr::read(
                k as u64,
                dst.sge(base, len),
                at as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        } else {
            if rnd(10) == 0 {
                // Unaligned: through the page cache.
                at += 1 + rnd(100);
                len -= 200;
            }
            let bytes = pattern(len, 7000 + k as u64);
            src.write_at(base, &bytes);
            model[at..at + len].copy_from_slice(&bytes);
            c.qp.post_send(&SendWr::write(
                k as u64,
                &[src.sge(base, len)],
                at as u64,
                softrdma_verbs::Rkey::from_raw(p0),
            ))
            .unwrap();
        }
    }
    c.qp.post_send(&SendWr::flush(
        OPS as u64,
        0,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    for want in 0..=OPS as u64 {
        let wc = wait(&c.cq);
        assert_eq!(wc.status, WcStatus::Success, "wr {}", wc.wr_id);
        assert_eq!(wc.wr_id, want, "in order");
    }
    assert!(reads.len() > 100, "{} reads", reads.len());
    for (k, base, want) in &reads {
        let mut got = vec![0u8; want.len()];
        dst.read_at(*base, &mut got);
        assert!(got == *want, "read {k} saw other bytes than at its turn");
    }
    assert!(file_bytes(&path, off0, SPAN) == model, "the file differs");
    c.qp.disconnect();

    // Relaxed: 64 disjoint Writes, a Flush, then Reads of everything.
    let c = client();
    let p0 = connect(&c.qp, &c.cq, addr, &alice, true).unwrap()[0].rkey;
    let src = c.pd.alloc_mr(64 * 2 * BLK, Access::LOCAL_WRITE).unwrap();
    let dst = c.pd.alloc_mr(64 * 2 * BLK, Access::LOCAL_WRITE).unwrap();
    let bytes = pattern(64 * 2 * BLK, 99);
    src.write_at(0, &bytes);
    for k in 0..64usize {
        let at = SPAN + k * 2 * BLK;
        c.qp.post_send(&SendWr::write(
            k as u64,
            &[src.sge(k * 2 * BLK, 2 * BLK)],
            at as u64,
            softrdma_verbs::Rkey::from_raw(p0),
        ))
        .unwrap();
    }
    c.qp.post_send(&SendWr::flush(64, 0, softrdma_verbs::Rkey::from_raw(p0)))
        .unwrap();
    c.qp.post_send(&SendWr::read(
        65,
        dst.sge_all(),
        SPAN as u64,
        softrdma_verbs::Rkey::from_raw(p0),
    ))
    .unwrap();
    for _ in 0..66 {
        assert_eq!(wait(&c.cq).status, WcStatus::Success);
    }
    assert!(dst.to_vec() == bytes, "relaxed: read back differs");
    assert!(file_bytes(&path, off0 + SPAN as u64, bytes.len()) == bytes);
}

/// Crash safety: a served store takes random Writes (1-16 KiB, half of
/// them 4 KiB-aligned; strict and relaxed connections; buffered and
/// O_DIRECT servers) with Flushes between; the server is killed with
/// SIGKILL at a random point with WRs in flight;
/// after a restart every byte read back through the target holds the value
/// of the last Write that completed before the last completed Flush (on a
/// relaxed connection: of any Write to it in the last flush epoch that
/// wrote it, as overlapping Writes between two Flushes may land in either
/// order), or of a Write posted after it. SOFTRDMA_SOAK=1 runs 200 rounds
/// instead of 12.
#[test]
fn flushed_writes_survive_kill_9() {
    let w = Work::new("storage-crash");
    let (path, alice, _) = store(&w);
    let rounds = if std::env::var("SOFTRDMA_SOAK").as_deref() == Ok("1") {
        200
    } else {
        12
    };
    const SPAN: usize = 2 << 20; // the part of p0 the test uses
                                 // Per byte: the durable value, and values of Writes that may or may
                                 // not have landed (posted after the last completed flush).
    let mut durable = vec![0u8; SPAN];
    let mut seed = 0x5eed_u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut total_flushes = 0;
    for round in 0..rounds {
        let direct = round % 4 >= 2;
        let (mut child, addr) = serve(&path, direct);
        let c = client();
        let relaxed = round % 2 == 1;
        let regions = connect(&c.qp, &c.cq, addr, &alice, relaxed).unwrap();
        let p0 = regions[0].rkey;
        // Everything must equal the durable image from the rounds before.
        let check = c.pd.alloc_mr(SPAN, Access::LOCAL_WRITE).unwrap();
        c.qp.post_send(&SendWr::read(
            0,
            check.sge_all(),
            0,
            softrdma_verbs::Rkey::from_raw(p0),
        ))
        .unwrap();
        assert_eq!(wait(&c.cq).status, WcStatus::Success);
        assert!(
            check.to_vec() == durable,
            "round {round}: image differs after restart"
        );

        // This round's Writes: (wr_id -> offset, data); flushes.
        let mut writes: Vec<(usize, Vec<u8>)> = Vec::new();
        let srcs = c.pd.alloc_mr(64 << 20, Access::LOCAL_WRITE).unwrap();
        let mut src_off = 0usize;
        let n_ops = 50 + (rnd() % 150) as usize;
        let kill_after = (rnd() % n_ops as u64) as usize;
        let mut flushed_upto = 0usize; // writes[..flushed_upto] are durable
        let mut flush_points = Vec::new();

        let mut outstanding: std::collections::VecDeque<(u64, Option<usize>)> = Default::default();
        for op in 0..n_ops {
            if rnd() % 8 == 0 {
                flush_points.push(writes.len());
                c.qp.post_send(&SendWr::flush(
                    1_000_000 + op as u64,
                    0,
                    softrdma_verbs::Rkey::from_raw(p0),
                ))
                .unwrap();
                outstanding.push_back((1_000_000 + op as u64, Some(writes.len())));
            } else {
                // Half aligned (O_DIRECT's path on a direct server), half
                // not (the page cache's).
                let (len, at) = if rnd() % 2 == 0 {
                    let len = 4096 * (1 + (rnd() % 4) as usize);
                    (len, ((rnd() as usize) % (SPAN - len)) & !4095)
                } else {
                    let len = 1024 * (1 + (rnd() % 16) as usize);
                    (len, (rnd() as usize) % (SPAN - len))
                };
                let data = pattern(len, rnd());
                srcs.write_at(src_off, &data);
                c.qp.post_send(&SendWr::write(
                    writes.len() as u64,
                    &[srcs.sge(src_off, len)],
                    at as u64,
                    softrdma_verbs::Rkey::from_raw(p0),
                ))
                .unwrap();
                outstanding.push_back((writes.len() as u64, None));
                src_off += len;
                writes.push((at, data));
            }

            // Keep at most 32 in flight; take completions as they come.
            while outstanding.len() > 32 {
                let wc = wait(&c.cq);
                assert_eq!(wc.status, WcStatus::Success);
                let (id, fl) = outstanding.pop_front().unwrap();
                assert_eq!(id, wc.wr_id, "in order");
                if let Some(upto) = fl {
                    flushed_upto = upto;
                    total_flushes += 1;
                }
            }
            if op == kill_after {
                break;
            }
        }
        // Take whatever completed, without waiting, then kill the server.
        while let Some(wc) = c.cq.poll_one() {
            let (id, fl) = outstanding.pop_front().unwrap();
            assert_eq!((id, wc.status), (wc.wr_id, WcStatus::Success));
            if let Some(upto) = fl {
                flushed_upto = upto;
                total_flushes += 1;
            }
        }
        kill_group(&child);
        let _ = child.wait();

        // The new durable image: writes up to the flush; what came after
        // may or may not have landed, byte by byte.
        let mut maybe: Vec<Vec<u8>> = vec![Vec::new(); SPAN];
        // Relaxed ordering: overlapping Writes with no Flush between them
        // may land in either order, so a byte two of them wrote in one
        // flush epoch may hold either value (until a later epoch writes it
        // again). Strict: in posting order.
        let mut either: std::collections::HashMap<usize, Vec<u8>> = Default::default();
        if relaxed {
            let mut ends: Vec<usize> = flush_points
                .iter()
                .copied()
                .filter(|&p| p <= flushed_upto)
                .collect();
            ends.push(flushed_upto);
            let mut start = 0;
            for end in ends {
                if end <= start {
                    continue;
                }
                let mut epoch: std::collections::HashMap<usize, Vec<u8>> = Default::default();
                for (at, d) in &writes[start..end] {
                    for (i, b) in d.iter().enumerate() {
                        epoch.entry(at + i).or_default().push(*b);
                    }
                }
                for (i, vals) in epoch {
                    if vals.len() > 1 {
                        either.insert(i, vals);
                    } else {
                        either.remove(&i);
                    }
                }
                start = end;
            }
        }
        for (at, d) in &writes[..flushed_upto] {
            durable[*at..*at + d.len()].copy_from_slice(d);
        }
        for (at, d) in &writes[flushed_upto..] {
            for (i, b) in d.iter().enumerate() {
                maybe[at + i].push(*b);
            }
        }
        let image = file_bytes(&path, partition_offset(&path, 0), SPAN);
        for i in 0..SPAN {
            if image[i] == durable[i]
                || maybe[i].contains(&image[i])
                || either.get(&i).is_some_and(|v| v.contains(&image[i]))
            {
                continue;
            }
            // Which of this round's Writes touched the byte, and where the
            // flushes were.
            let touched: Vec<String> = writes
                .iter()
                .enumerate()
                .filter(|(_, (at, d))| (*at..*at + d.len()).contains(&i))
                .map(|(k, (at, d))| format!("write {k} -> {}", d[i - at]))
                .collect();
            panic!(
                "round {round} (relaxed {relaxed}, direct {direct}): byte {i} is {} (durable {}, \
                 later writes {:?}); flushed up to write {flushed_upto}, flushes posted after \
                 writes {flush_points:?}; this round's writes of the byte: {touched:?}",
                image[i], durable[i], maybe[i]
            );
        }
        // Whatever landed becomes the baseline the next round checks
        // through the target.
        durable = image;
    }
    assert!(total_flushes > 0, "no flush completed in {rounds} rounds");
}

/// `softrdma storage bench --json` on a new file: every configuration of
/// the issue, each line with its fields, local lines with fio's figure and
/// the ratio, remote lines with the TCP pump's, mixed lines with the
/// small requests' latency, the others with their WRs' p50/p99, and every
/// line with the process's CPU (short runs: this checks the tool, not
/// speed).
#[test]
fn storage_bench_reports_every_configuration() {
    require_tool("fio");
    let w = Work::new("storage-bench");
    let p = w.path("bench.img");
    let lines = softrdma_json(&[
        "storage",
        "bench",
        p.to_str().unwrap(),
        "--json",
        "--seconds",
        "0.05",
        "--working-set",
        "16MiB",
    ]);
    assert_eq!(lines.len(), 32 + 4);
    let mut seen = std::collections::HashSet::new();
    let mut cpu = 0.0;
    for l in &lines {
        for k in [
            "op", "size", "depth", "ordering", "where", "gbps", "iops", "cpu",
        ] {
            assert!(l.get(k).is_some(), "{k} missing in {l}");
        }
        assert!(l["gbps"].as_f64().unwrap() > 0.0, "{l}");
        // CPU is read in 10 ms ticks: a 50 ms point may show none, the
        // whole run cannot.
        assert!(l["cpu"].as_f64().unwrap() >= 0.0, "{l}");
        cpu += l["cpu"].as_f64().unwrap();
        let op = l["op"].as_str().unwrap();
        if op.ends_with("_mixed") {
            assert!(l["small_lat_us_p50"].as_f64().unwrap() > 0.0);
            continue;
        }
        let (p50, p99) = (
            l["lat_us_p50"].as_f64().unwrap(),
            l["lat_us_p99"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{l}");
        let key = format!(
            "{op} {} {} {} {}",
            l["size"], l["depth"], l["ordering"], l["where"]
        );
        assert!(seen.insert(key), "duplicate {l}");
        if l["where"] == "local" {
            assert!(l["fio_gbps"].as_f64().unwrap() > 0.0, "{l}");
            assert!(l["ratio"].as_f64().unwrap() > 0.0, "{l}");
        } else {
            assert!(l["tcp_gbps"].as_f64().unwrap() > 0.0, "{l}");
        }
    }
    assert_eq!(seen.len(), 32);
    assert!(cpu > 0.0, "no CPU in any line");
}
