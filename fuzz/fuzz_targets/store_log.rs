//! The store's durable log read back from a damaged device: whatever bytes
//! the device holds, the scan neither panics nor reads past the ring, every
//! entry it passes on lies inside the device, and a writer opened there
//! appends and commits records that the next scan reads back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::persist::log::{scan, LogPos, LogStart, LogWriter, BLOCK};
use softrdma_store::persist::mem::MemDevice;

fuzz_target!(|data: &[u8]| {
    let len = 4 * BLOCK as usize;
    let mut dev = MemDevice::new(len, 1);
    dev.damage(0, &data[..data.len().min(len)]);
    // The device image, then (optionally) where the log starts.
    let off = data.get(len).map_or(0, |&b| b as u64 * 8);
    let start = LogStart {
        log_id: 0x5eed_0001,
        pos: LogPos { offset: off, lsn: 1, prev_crc: 0 },
    };
    let mut n = 0u64;
    let s = scan(&mut dev, start, |_, p| {
        assert!(p.len() < len);
        n += 1;
    })
    .expect("the scan fails only on the device");
    assert_eq!(n, s.entries);
    assert!(s.end.offset < len as u64);
    let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).expect("open");
    let first = w.position().lsn;
    let mut appended = Vec::new();
    for i in 0..3u8 {
        match w.append(&[i; 100]) {
            Ok(lsn) => appended.push(lsn),
            Err(_) => break,
        }
    }
    w.commit().expect("commit");
    let mut dev = std::mem::take(w.device());
    let mut got = Vec::new();
    scan(&mut dev, start, |lsn, p| {
        if lsn >= first {
            got.push((lsn, p.to_vec()));
        }
    })
    .expect("scan");
    assert_eq!(got.len(), appended.len());
    for ((lsn, p), (want, i)) in got.iter().zip(appended.iter().zip(0u8..)) {
        assert_eq!(lsn, want);
        assert_eq!(p, &vec![i; 100]);
    }
});
