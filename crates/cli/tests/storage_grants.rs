//! Live grants on a storage target (issue 29, finding 2): `softrdma storage
//! grant` and `revoke`, run as separate processes while `softrdma storage
//! serve` runs and a peer is connected, reach new connections at once and
//! narrow or end the rights of live ones; a principal with rights on more
//! partitions than one MPA reply can list still reaches all of them.

mod common;
use common::*;
use softrdma_storage::endpoint::{
    connect, decode_accept, decode_control_reply, decode_listing, encode_control, list_partitions,
    ControlOp, ControlStatus, PartitionRegion, CTRL_MAX, GRANT_POLL,
};
use softrdma_storage::layout::Rights;
use softrdma_storage::{InitOptions, PartitionSpec, Store};
use softrdma_verbs::wire::Layer;
use softrdma_verbs::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");
const MIB: u64 = 1 << 20;
const T: Duration = Duration::from_secs(20);
/// How long a test waits for a grant change to show before failing.
const EFFECT_DEADLINE: Duration = Duration::from_secs(10);

/// A store of `n` partitions of `each` bytes.
fn store(w: &Work, n: usize, each: u64) -> std::path::PathBuf {
    let p = w.path("store.img");
    Store::init(
        &p,
        &InitOptions {
            size: Some(MIB + n as u64 * each),
            partitions: PartitionSpec::Equal(n),
            align: MIB,
            force: false,
        },
    )
    .unwrap();
    p
}

/// `softrdma storage ARGS...` in a process of its own; its stdout.
fn cli(args: &[&str]) -> String {
    let o = Command::new(SOFTRDMA)
        .arg("storage")
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "storage {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `storage grant` that creates a principal: its token, as printed.
fn grant_new(path: &Path, part: &str, who: &str, rights: &str) -> [u8; 32] {
    let out = cli(&["grant", path.to_str().unwrap(), part, who, rights]);
    let hex = out
        .split("token ")
        .nth(1)
        .unwrap_or_else(|| panic!("no token in {out:?}"))
        .trim();
    softrdma_storage::parse_token(hex).unwrap()
}

/// Starts `softrdma storage serve` on a free port.
struct Target {
    child: Child,
    addr: SocketAddr,
}

impl Target {
    fn start(path: &Path) -> Target {
        let mut child = Command::new(SOFTRDMA)
            .args(["storage", "serve", path.to_str().unwrap(), "--port", "0"])
            .args(["--direct", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split(" on ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .parse()
            .unwrap();
        Target { child, addr }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        kill_group(&self.child);
        let _ = self.child.wait();
    }
}

struct Client {
    dev: Device,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// Local buffers: data to write, data read, control messages.
    src: MemoryRegion,
    dst: MemoryRegion,
    ctl: MemoryRegion,
    next_id: u64,
}

const BUF: usize = 64 << 10;

fn client() -> Client {
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
    let src = pd.alloc_mr(BUF, Access::LOCAL_WRITE).unwrap();
    let dst = pd.alloc_mr(BUF, Access::LOCAL_WRITE).unwrap();
    let ctl = pd.alloc_mr(2 * CTRL_MAX, Access::LOCAL_WRITE).unwrap();
    Client {
        dev,
        _pd: pd,
        cq,
        qp,
        src,
        dst,
        ctl,
        next_id: 1,
    }
}

fn file_bytes(path: &Path, at: u64, n: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut v = vec![0; n];
    f.read_exact_at(&mut v, at).unwrap();
    v
}

fn offsets(path: &Path) -> Vec<u64> {
    Store::open(path)
        .unwrap()
        .layout()
        .partitions
        .iter()
        .map(|p| p.offset)
        .collect()
}

impl Client {
    fn wait(&self) -> WorkCompletion {
        self.cq.wait_one(T).expect("completion within 20 s")
    }

    /// RDMA Write of `data` at `off` of `rkey`, then an RDMA Read of the
    /// same range back (executed after the Write at the target): the
    /// Read's status, and whether it returned `data`.
    fn write_read(&mut self, rkey: u32, off: u64, data: &[u8]) -> (WcStatus, bool) {
        let n = data.len();
        self.src.write_at(0, data);
        let rk = Rkey::from_raw(rkey);
        let id = self.next_id;
        self.next_id += 2;
        self.qp
            .post_send(&SendWr::write(id, &[self.src.sge(0, n)], off, rk))
            .unwrap();
        let read = SendWr::read(id + 1, self.dst.sge(0, n), off, rk);
        if self.qp.post_send(&read).is_err() {
            // The Terminate already moved the QP to ERROR.
            let _ = self.wait();
            return (WcStatus::WrFlushErr, false);
        }
        let (a, b) = (self.wait(), self.wait());
        let r = if a.wr_id == id + 1 { a } else { b };
        let ok = r.status == WcStatus::Success && self.dst.to_vec()[..n] == *data;
        (r.status, ok)
    }

    /// RDMA Read of `n` bytes at `off` of `rkey`.
    fn read(&mut self, rkey: u32, off: u64, n: usize) -> (WcStatus, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        self.qp
            .post_send(&SendWr::read(
                id,
                self.dst.sge(0, n),
                off,
                Rkey::from_raw(rkey),
            ))
            .unwrap();
        let wc = self.wait();
        (wc.status, self.dst.to_vec()[..n].to_vec())
    }

    /// One control request (`start`: the first partition index an Info
    /// asks for, in bytes 6..8); the reply's status and payload.
    fn control(&mut self, op: ControlOp, start: u16) -> (u8, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        self.qp
            .post_recv(&RecvWr::new(id, &[self.ctl.sge(0, CTRL_MAX)]))
            .unwrap();
        let mut req = encode_control(op, id);
        req[6..8].copy_from_slice(&start.to_be_bytes());
        self.ctl.write_at(CTRL_MAX, &req);
        self.qp
            .post_send(&SendWr::send(
                id + 1_000_000,
                &[self.ctl.sge(CTRL_MAX, req.len())],
            ))
            .unwrap();
        let mut reply = None;
        for _ in 0..2 {
            let wc = self.wait();
            assert_eq!(wc.status, WcStatus::Success, "control message {op:?}");
            if wc.opcode == WcOpcode::Recv {
                let mut b = vec![0; wc.byte_len as usize];
                self.ctl.read_at(0, &mut b);
                let (o, s, i, p) = decode_control_reply(&b).expect("a control reply");
                assert_eq!((o, i), (op as u8, id));
                reply = Some((s, p.to_vec()));
            }
        }
        reply.expect("a reply")
    }

    /// Every partition the connection reaches now, by Info requests
    /// (pages from `start` on until one lists nothing new).
    fn info(&mut self) -> Vec<PartitionRegion> {
        let mut all: Vec<PartitionRegion> = Vec::new();
        let mut start = 0u16;
        loop {
            let (s, page) = self.control(ControlOp::Info, start);
            assert_eq!(s, ControlStatus::Ok as u8);
            let page = decode_accept(&page).unwrap();
            let fresh: Vec<_> = page
                .into_iter()
                .filter(|r| r.index >= start as u32)
                .collect();
            match fresh.last() {
                None => return all,
                Some(l) => start = l.index as u16 + 1,
            }
            all.extend(fresh);
        }
    }

    /// The Terminate the target sent, if one came (the QP's async event).
    fn terminate(&self) -> Option<softrdma_verbs::wire::TermCode> {
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            match self.dev.next_event(Duration::from_millis(100)) {
                Some(AsyncEvent::Terminated {
                    code,
                    by_peer: true,
                    ..
                }) => return Some(code),
                Some(_) => {}
                None if self.qp.state() == QpState::Error => {
                    // Events come before the state change is visible;
                    // one more look.
                    return match self.dev.next_event(Duration::from_millis(500)) {
                        Some(AsyncEvent::Terminated { code, .. }) => Some(code),
                        _ => None,
                    };
                }
                None => {}
            }
        }
        None
    }
}

/// RFC 5040 section 7 / RFC 5041 section 7: a protection error (RDMAP
/// "remote protection error", DDP "tagged buffer error").
fn is_protection(code: softrdma_verbs::wire::TermCode) -> bool {
    matches!(
        (code.layer, code.etype),
        (Layer::Rdmap, 1) | (Layer::Ddp, 1)
    )
}

fn region(rs: &[PartitionRegion], i: u32) -> Option<&PartitionRegion> {
    rs.iter().find(|r| r.index == i)
}

/// (a) A grant made by another process while the target serves (and a
/// peer is connected) reaches the next connection: an existing principal
/// gets a new partition, a new principal's token is accepted. The live
/// connection keeps exactly what it was admitted with.
#[test]
fn grants_reach_new_connections_while_serving() {
    let w = Work::new("grants-new");
    let path = store(&w, 2, 8 * MIB);
    let bob = {
        let mut s = Store::open(&path).unwrap();
        s.grant("0", "alice", Rights::READ_WRITE).unwrap();
        s.grant("0", "bob", Rights::READ).unwrap().unwrap()
    };
    let off = offsets(&path);
    let t = Target::start(&path);

    let mut live = client();
    let first = connect(&live.qp, &live.cq, t.addr, &bob, false).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].index, first[0].rights), (0, Rights::READ));

    // From other processes, while bob's connection is up.
    let p = path.to_str().unwrap();
    cli(&["grant", p, "1", "bob", "rw"]);
    let carol = grant_new(&path, "0", "carol", "r");

    let mut again = client();
    let rs =
        connect(&again.qp, &again.cq, t.addr, &bob, false).expect("bob connects after the grant");
    let p1 =
        region(&rs, 1).unwrap_or_else(|| panic!("no partition 1 for bob after the grant: {rs:?}"));
    assert_eq!(p1.rights, Rights::READ_WRITE);
    let data = pattern(8192, 11);
    assert_eq!(
        again.write_read(p1.rkey, 4096, &data),
        (WcStatus::Success, true)
    );
    assert_eq!(
        again.control(ControlOp::FlushAll, 0).0,
        ControlStatus::Ok as u8
    );
    assert_eq!(file_bytes(&path, off[1] + 4096, 8192), data);

    let c = client();
    let rs = connect(&c.qp, &c.cq, t.addr, &carol, false)
        .expect("a principal created while serving connects");
    assert_eq!(rs.len(), 1);
    assert_eq!((rs[0].index, rs[0].rights), (0, Rights::READ));

    // The live connection: unchanged (new rights need a new connection).
    assert_eq!(live.info(), first);
    let (st, got) = live.read(first[0].rkey, 4096, 16);
    assert_eq!((st, got), (WcStatus::Success, vec![0; 16]));
}

/// (b) A full revoke while the peer is connected and writing: its next
/// access after the target applied it gets the protection Terminate,
/// within the stated delay after `storage revoke` returned; every Write
/// the target accepted before is in the store, none after. Five rounds
/// (grant, connect, write, revoke), each timed.
#[test]
fn revoke_terminates_the_next_access_of_a_live_connection() {
    let w = Work::new("grants-revoke");
    let path = store(&w, 2, 8 * MIB);
    let alice = {
        let mut s = Store::open(&path).unwrap();
        s.grant("1", "alice", Rights::READ).unwrap().unwrap()
    };
    let off = offsets(&path);
    let p = path.to_str().unwrap();
    let t = Target::start(&path);
    const SLOTS: usize = 16;
    let mut model = vec![0u8; SLOTS * 4096];
    let mut delays = Vec::new();
    for round in 0..5u64 {
        cli(&["grant", p, "0", "alice", "rw"]);
        let mut c = client();
        let rs = connect(&c.qp, &c.cq, t.addr, &alice, false).unwrap();
        let p0 = region(&rs, 0).expect("partition 0 granted again").rkey;
        // 4 KiB Writes into 16 slots, each read back before the next.
        let put = |c: &mut Client, k: usize| {
            let slot = k % SLOTS;
            let data = pattern(4096, round << 32 | k as u64);
            let (st, ok) = c.write_read(p0, (slot * 4096) as u64, &data);
            (st, ok, slot, data)
        };
        let mut apply = |slot: usize, data: &[u8]| {
            model[slot * 4096..(slot + 1) * 4096].copy_from_slice(data);
        };
        for k in 0..SLOTS {
            let (st, ok, slot, data) = put(&mut c, k);
            assert!(st == WcStatus::Success && ok);
            apply(slot, &data);
        }

        cli(&["revoke", p, "0", "alice", "rw"]);
        let revoked = Instant::now();
        let mut k = SLOTS;
        let (refused_at, slot, data) = loop {
            let (st, ok, slot, data) = put(&mut c, k);
            if st != WcStatus::Success {
                break (Instant::now(), slot, data);
            }
            assert!(ok, "read back other bytes");
            apply(slot, &data);
            assert!(
                revoked.elapsed() < EFFECT_DEADLINE,
                "the revoke never took effect on the live connection ({} Writes after it went through)",
                k - SLOTS
            );
            k += 1;
        };
        let delay = refused_at - revoked;
        delays.push(delay);
        let code = c.terminate().expect("a Terminate from the target");
        assert!(is_protection(code), "not a protection error: {code}");
        // Which message the revoke refused: a Write segment (DDP tagged
        // buffer error: that Write placed nothing) or the Read behind an
        // accepted Write (RDMAP: the Write was checked before the revoke
        // took effect, and is stored).
        if code.layer == Layer::Rdmap {
            apply(slot, &data);
        }
        // The file as the target left it: every accepted Write, nothing
        // refused.
        assert!(
            file_bytes(&path, off[0], SLOTS * 4096) == model,
            "round {round}: the store differs from the accepted Writes ({code})"
        );
        eprintln!(
            "round {round}: revoke took effect {:.1} ms after `storage revoke` returned \
             ({} accesses went through before; refused: {code})",
            delay.as_secs_f64() * 1e3,
            k - SLOTS
        );
    }
    // The stated bound is one poll interval (20 ms) plus the time to read
    // the metadata and narrow; the assertion allows for scheduling on a
    // loaded host.
    let worst = delays.iter().max().unwrap();
    assert!(
        *worst < GRANT_POLL + Duration::from_millis(480),
        "a revoke took {worst:?} to take effect"
    );

    // A new connection: partition 0 is gone, partition 1 is still there.
    let c = client();
    let rs = connect(&c.qp, &c.cq, t.addr, &alice, false).unwrap();
    assert_eq!(rs.len(), 1);
    assert_eq!((rs[0].index, rs[0].rights), (1, Rights::READ));
}

/// (c) Revoking write but not read on a live connection: the target
/// narrows the registration in place (the peer sees it in Info); reads
/// through the same STag go on, a Write gets the protection Terminate and
/// changes nothing.
#[test]
fn narrowing_write_to_read_keeps_reads_working() {
    let w = Work::new("grants-narrow");
    let path = store(&w, 2, 8 * MIB);
    let alice = {
        let mut s = Store::open(&path).unwrap();
        s.grant("0", "alice", Rights::READ_WRITE).unwrap().unwrap()
    };
    let off = offsets(&path);
    let t = Target::start(&path);
    let mut c = client();
    let rs = connect(&c.qp, &c.cq, t.addr, &alice, false).unwrap();
    assert_eq!(rs.len(), 1);
    let p0 = rs[0].rkey;
    let a = pattern(8192, 1);
    assert_eq!(c.write_read(p0, 0, &a), (WcStatus::Success, true));

    cli(&["revoke", path.to_str().unwrap(), "0", "alice", "w"]);
    let revoked = Instant::now();
    loop {
        let now = c.info();
        if now.len() == 1 && now[0].rights == Rights::READ {
            assert_eq!(now[0].rkey, p0, "the STag stays");
            break;
        }
        assert_eq!(now, rs, "unexpected listing");
        assert!(
            revoked.elapsed() < EFFECT_DEADLINE,
            "the connection was not narrowed to read within {EFFECT_DEADLINE:?}"
        );
    }
    eprintln!(
        "narrowed {:.1} ms after `storage revoke` returned (seen by Info)",
        revoked.elapsed().as_secs_f64() * 1e3
    );
    for _ in 0..3 {
        assert_eq!(c.read(p0, 0, 8192), (WcStatus::Success, a.clone()));
    }
    let b = pattern(8192, 2);
    let (st, _) = c.write_read(p0, 0, &b);
    assert_ne!(st, WcStatus::Success, "a Write after narrowing to read");
    let code = c.terminate().expect("a Terminate from the target");
    assert!(is_protection(code), "not a protection error: {code}");
    drop(t);
    assert_eq!(file_bytes(&path, off[0], 8192), a);
}

/// (d) A principal with rights on 40 partitions (more than the 15 one MPA
/// reply lists) connects and uses every one of them.
#[test]
fn forty_partitions_are_all_reachable() {
    let w = Work::new("grants-forty");
    const N: usize = 42;
    let path = store(&w, N, MIB);
    let alice = {
        let mut s = Store::open(&path).unwrap();
        let a = s.grant("0", "alice", Rights::READ_WRITE).unwrap().unwrap();
        for i in 1..40 {
            let r = if i % 3 == 0 {
                Rights::READ
            } else {
                Rights::READ_WRITE
            };
            s.grant(&i.to_string(), "alice", r).unwrap();
        }
        a
    };
    let off = offsets(&path);
    let t = Target::start(&path);
    let mut c = client();
    // `connect` fetches what the MPA reply did not list over the
    // connection (Info pages).
    let rs = connect(&c.qp, &c.cq, t.addr, &alice, false).expect("connect with 40 partitions");
    assert_eq!(rs.len(), 40, "{rs:?}");
    assert_eq!(c.info(), rs, "Info pages list the same");
    assert_eq!(list_partitions(&c.qp, &c.cq).unwrap(), rs);
    // The MPA reply itself: the first 15 (what siw's 256 bytes of private
    // data hold), and the number in all.
    let raw = {
        let x = client();
        let params = ConnParams {
            private_data: softrdma_storage::endpoint::encode_request(&alice, false),
            ..Default::default()
        };
        x.qp.connect(t.addr, &params).unwrap()
    };
    let accept = decode_listing(&raw).unwrap();
    assert_eq!((accept.regions.len(), accept.total), (15, 40));
    // (Another connection: other STags.)
    let shape = |r: &PartitionRegion| (r.index, r.rights, r.len);
    assert!(accept
        .regions
        .iter()
        .map(shape)
        .eq(rs[..15].iter().map(shape)));
    for (i, r) in rs.iter().enumerate() {
        assert_eq!(r.index, i as u32);
        assert_eq!(r.len, MIB);
        let want = if i % 3 == 0 && i > 0 {
            Rights::READ
        } else {
            Rights::READ_WRITE
        };
        assert_eq!(r.rights, want, "partition {i}");
    }
    for r in rs.iter().filter(|r| r.rights.contains(Rights::WRITE)) {
        let data = pattern(4096, r.index as u64 + 100);
        assert_eq!(
            c.write_read(r.rkey, MIB - 4096, &data),
            (WcStatus::Success, true),
            "partition {}",
            r.index
        );
    }
    for r in rs.iter().filter(|r| !r.rights.contains(Rights::WRITE)) {
        let (st, got) = c.read(r.rkey, 0, 4096);
        assert_eq!(
            (st, got),
            (WcStatus::Success, vec![0; 4096]),
            "partition {}",
            r.index
        );
    }
    assert_eq!(c.control(ControlOp::FlushAll, 0).0, ControlStatus::Ok as u8);
    for r in rs.iter().filter(|r| r.rights.contains(Rights::WRITE)) {
        assert_eq!(
            file_bytes(&path, off[r.index as usize] + MIB - 4096, 4096),
            pattern(4096, r.index as u64 + 100)
        );
    }
}
