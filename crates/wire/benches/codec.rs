//! Codec speed: FPDU encode/decode (64 B and 4 KiB ULPDUs, CRC on and off),
//! CRC32c throughput over 64 KiB, DDP header encode/decode.
//!
//! `cargo bench -p softrdma-wire --bench codec` (add `-- --quick` for a
//! short run). Figures from one run are in docs/bench-wire.txt.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma_wire::ddp::{TaggedHeader, UntaggedHeader};
use softrdma_wire::{mpa, DdpHeader, Opcode};

fn fpdu(c: &mut Criterion) {
    let mut g = c.benchmark_group("fpdu");
    for size in [64usize, 4096] {
        let ulpdu: Vec<u8> = (0..size).map(|i| i as u8).collect();
        for crc in [false, true] {
            let label = if crc { "crc" } else { "nocrc" };
            g.throughput(Throughput::Bytes(size as u64));
            let mut out = Vec::with_capacity(mpa::fpdu_len(size));
            g.bench_with_input(
                BenchmarkId::new(format!("encode_{label}"), size),
                &ulpdu,
                |b, u| {
                    b.iter(|| {
                        out.clear();
                        mpa::encode_fpdu(black_box(u), crc, &mut out);
                        black_box(out.len())
                    })
                },
            );
            let mut frame = Vec::new();
            mpa::encode_fpdu(&ulpdu, crc, &mut frame);
            g.bench_with_input(
                BenchmarkId::new(format!("decode_{label}"), size),
                &frame,
                |b, f| b.iter(|| mpa::decode_fpdu(black_box(f), crc).unwrap().1),
            );
        }
    }
    g.finish();
}

fn crc32c(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7) as u8).collect();
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("64KiB", |b| {
        b.iter(|| mpa::crc_update(mpa::crc_start(), black_box(&data)))
    });
    g.finish();
}

fn ddp_header(c: &mut Criterion) {
    let mut g = c.benchmark_group("ddp_header");
    let tagged = DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::Write,
        stag: 0x1234_5601,
        to: 0x7f00_0000_1000,
    });
    let untagged = DdpHeader::Untagged(UntaggedHeader {
        last: false,
        opcode: Opcode::Send,
        inval_stag: 0,
        qn: 0,
        msn: 42,
        mo: 8192,
    });
    for (name, h) in [("tagged", tagged), ("untagged", untagged)] {
        let mut buf = [0u8; 18];
        g.bench_function(format!("encode_{name}"), |b| {
            b.iter(|| black_box(h).encode(black_box(&mut buf)))
        });
        let mut enc = [0u8; 18];
        let n = h.encode(&mut enc);
        g.bench_function(format!("decode_{name}"), |b| {
            b.iter(|| DdpHeader::decode(black_box(&enc[..n])).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, fpdu, crc32c, ddp_header);
criterion_main!(benches);
