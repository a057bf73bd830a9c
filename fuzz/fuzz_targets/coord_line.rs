//! The embedded coordinator's line protocol (`coord::embedded::answer_line`):
//! any sequence of request lines, valid or not, at growing times, gets one
//! answer line each and never panics (issue 29, finding 10: one line used
//! to panic the server inside the table's lock and kill it for every
//! group); the table's rules hold whatever the lines say: a group's epoch
//! only grows (across an operator's reset too: the next record starts
//! above the forgotten one) and its primary is never its own in-sync
//! secondary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::coord::embedded::answer_line;
use softrdma_store::coord::LeaseTable;

/// Words the lines are made of, so that most lines parse and reach the
/// table; raw bytes still come through unchanged.
const WORDS: &[&str] = &[
    "CAMPAIGN", "KEEPALIVE", "SETINSYNC", "RESIGN", "RETIRE", "GET", "g", "h", "1:5", "1:6",
    "2:7", "2:8", "-", "0", "1", "2", "3", "100", "18446744073709551615", "1:", ":", "PROMOTE",
    "RESET",
];

fuzz_target!(|data: &[u8]| {
    let mut t = LeaseTable::new();
    let mut now = 0u64;
    let mut epochs = std::collections::BTreeMap::new();
    for chunk in data.split(|&b| b == b'\n') {
        // A line either as raw bytes (first byte odd) or as words picked
        // by its bytes.
        let line: Vec<u8> = match chunk.split_first() {
            Some((&f, rest)) if f & 1 == 0 => rest
                .iter()
                .map(|&b| WORDS[b as usize % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
                .into_bytes(),
            _ => chunk.to_vec(),
        };
        now += chunk.first().map_or(1, |&b| b as u64 * 7);
        let a = answer_line(&mut t, now, &line);
        assert!(!a.is_empty() && !a.contains('\n'), "one answer line: {a:?}");
        for g in ["g", "h"] {
            if let Some(r) = t.get(g, now) {
                let last = epochs.insert(g, r.epoch).unwrap_or(0);
                assert!(r.epoch >= last, "epoch went back");
                assert!(r.in_sync.is_none_or(|m| m.node != r.primary.node));
            }
        }
    }
});
