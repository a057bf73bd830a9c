//! RFC 7306 on the wire: atomics and immediate data between two softrdma
//! ends (they negotiate it through softrdma's MPA extension block; Linux
//! siw has neither), captured on loopback with tshark and decoded with
//! Wireshark's `iwarp_ddp_rdmap` dissector, which knows RFC 7306's Atomic
//! Request and Response layouts. Checks: no malformed frame, every CRC good,
//! and the decoded fields are the values the engine was asked to send.

mod common;
use common::*;
use softrdma_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    let wc = cq.wait_one(T).expect("a completion within 10 s");
    assert!(wc.is_ok(), "{wc:?}");
    wc
}

fn num(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

#[test]
fn atomics_and_immediate_data_decode_in_tshark() {
    require_tool("tshark");
    let work = Work::new("rfc7306");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cap = Capture::start(&work, &[port]);

    // Not the same-host transport: its Writes would skip the wire.
    let dev = Device::open(DeviceConfig {
        publish: false,
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let listener = dev.listen(("127.0.0.1", port)).unwrap();
    let spd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(64).unwrap();
    let sqp = spd.create_qp(QpInitAttr::new(&scq)).unwrap();
    sqp.modify(QpState::Init).unwrap();
    for i in 0..2 {
        sqp.post_recv(&RecvWr::new(i, &[])).unwrap();
    }
    let target = spd.alloc_mr(4096, Access::ALL).unwrap();
    const START: u64 = 0x0102_0304_0506_0708;
    target.write_at(64, &START.to_ne_bytes());
    let server = std::thread::spawn(move || {
        let req = listener.get_request().unwrap();
        req.accept(&sqp, &ConnParams::default()).unwrap();
        sqp
    });

    let cpd = dev.alloc_pd().unwrap();
    let ccq = dev.create_cq(64).unwrap();
    let cqp = cpd.create_qp(QpInitAttr::new(&ccq)).unwrap();
    cqp.connect(
        ("127.0.0.1", port),
        &ConnParams {
            extensions: true,
            crc: true,
            ..Default::default()
        },
    )
    .unwrap();
    let sqp = server.join().unwrap();
    assert!(cqp.conn_params().unwrap().rfc7306);

    let res = cpd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let src = cpd.alloc_mr(32, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, b"written before the immediate....");
    let at = target.addr() + 64;
    const ADD: u64 = 0x1111;
    const SWAP: u64 = 0xABCD_EF01_2345_6789;
    // One WR at a time, so that each message travels in a TCP segment of
    // its own and tshark's per-frame fields are unambiguous.
    for (id, wr) in [
        SendWr::fetch_add(1, res.sge(0, 8), at, target.rkey(), ADD),
        SendWr::cmp_swap(2, res.sge(8, 8), at, target.rkey(), START + ADD, SWAP),
        SendWr::write_imm(
            3,
            &[src.sge_all()],
            target.addr(),
            target.rkey(),
            0xCAFE_BABE,
        ),
        SendWr::send_imm(4, 0x0000_0007).solicited(),
    ]
    .into_iter()
    .enumerate()
    {
        cqp.post_send(&wr).unwrap();
        assert_eq!(wait(&ccq).wr_id, id as u64 + 1);
    }
    assert_eq!(wait(&scq).imm_data, Some(0xCAFE_BABE));
    assert_eq!(wait(&scq).imm_data, Some(7));
    let mut b = [0u8; 8];
    target.read_at(64, &mut b);
    assert_eq!(u64::from_ne_bytes(b), SWAP);
    cqp.disconnect();
    drop(sqp);
    let file = cap.stop();

    // No malformed frame, every CRC good; the four RFC 7306 opcodes seen.
    let conns = analyse_capture(&file, &[port]);
    let c = &conns[&port];
    assert!(c.fpdus_checked_crc >= 6, "{c:?}");
    for op in [0x8, 0x9, 0xA, 0xB] {
        assert!(c.opcodes.contains(&op), "opcode {op:#x} not seen: {c:?}");
    }

    // Atomic Requests: queue 1, MSNs 1 and 2, the operands as posted.
    let reqs = tshark_fields(
        &file,
        "iwarp_rdma.opcode == 0xa",
        &[
            "iwarp_ddp.qn",
            "iwarp_ddp.msn",
            "iwarp_rdma.atomic.opcode",
            "iwarp_rdma.atomic.remote_stag",
            "iwarp_rdma.atomic.remote_tagged_offset",
            "iwarp_rdma.atomic.add_data",
            "iwarp_rdma.atomic.add_mask",
            "iwarp_rdma.atomic.swap_data",
            "iwarp_rdma.atomic.swap_mask",
            "iwarp_rdma.atomic.compare_data",
            "iwarp_rdma.atomic.compare_mask",
        ],
    );
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    let fa: Vec<u64> = reqs[0]
        .iter()
        .filter(|f| !f.is_empty())
        .map(|f| num(f))
        .collect();
    assert_eq!(
        fa,
        vec![1, 1, 0, target.rkey().raw() as u64, at, ADD, 0, 0, 0],
        "FetchAdd: queue 1, MSN 1, operation 0, STag, TO, add data and mask (0: one \
         64-bit add), compare data and mask (unused)"
    );
    let cs: Vec<u64> = reqs[1]
        .iter()
        .filter(|f| !f.is_empty())
        .map(|f| num(f))
        .collect();
    assert_eq!(
        cs,
        vec![
            1,
            2,
            2,
            target.rkey().raw() as u64,
            at,
            SWAP,
            u64::MAX,
            START + ADD,
            u64::MAX
        ],
        "CmpSwap: queue 1, MSN 2, operation 2, STag, TO, swap data and mask, compare data \
         and mask"
    );

    // Atomic Responses: queue 3, the original values.
    let resps = tshark_fields(
        &file,
        "iwarp_rdma.opcode == 0xb",
        &[
            "iwarp_ddp.qn",
            "iwarp_ddp.msn",
            "iwarp_rdma.atomic.original_remote_data_value",
        ],
    );
    let got: Vec<(u64, u64, u64)> = resps
        .iter()
        .map(|r| (num(&r[0]), num(&r[1]), num(&r[2])))
        .collect();
    assert_eq!(got, vec![(3, 1, START), (3, 2, START + ADD)]);

    // Immediate Data: queue 0, MSNs 1 and 2, SE on the second; the Write
    // with immediate is a Write then the Immediate Data message, in one
    // segment. The dissector decodes their headers (the last of each
    // frame's values is the immediate's) but not the eight bytes of
    // immediate data, which are checked in the TCP payload: ULPDU length
    // 26, untagged last DDP v1, RDMAP v1 opcode 8/9, QN 0, MSN, MO 0, the
    // value (big-endian, four zero bytes after it).
    let imms = tshark_fields(
        &file,
        "iwarp_rdma.opcode == 0x8 || iwarp_rdma.opcode == 0x9",
        &[
            "iwarp_rdma.opcode",
            "iwarp_ddp.qn",
            "iwarp_ddp.msn",
            "tcp.payload",
        ],
    );
    assert_eq!(imms.len(), 2, "{imms:?}");
    let last = |f: &String| num(f.rsplit(',').next().unwrap());
    for (line, (op, msn, imm)) in imms
        .iter()
        .zip([(8u64, 1u64, "cafebabe"), (9, 2, "00000007")])
    {
        assert_eq!(
            (last(&line[0]), last(&line[1]), last(&line[2])),
            (op, 0, msn),
            "{line:?}"
        );
        let fpdu = format!(
            "001a41{:02x}0000000000000000{msn:08x}00000000{imm}00000000",
            0x40 + op
        );
        assert!(
            line[3].contains(&fpdu),
            "immediate FPDU {fpdu} not in {}",
            line[3]
        );
    }
    assert!(
        imms[0][0].starts_with("0x00,"),
        "the Write precedes its immediate: {imms:?}"
    );
}
