//! The store's RESP door (`net::redis_door`), commands and all, without a
//! network (`redis_door::fuzzing::run`): arbitrary bytes, fed in pieces
//! as a connection delivers them, never panic or block, and the door
//! writes only whole RESP replies (RESP2 or, after `HELLO 3`, RESP3).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_store::net::redis_door::fuzzing;

/// The length of the first whole reply in `b`, if it is one.
fn reply_len(b: &[u8]) -> Option<usize> {
    let end = b.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&b[1..end]).ok()?;
    let at = end + 2;
    let n = || line.parse::<i64>().ok();
    match *b.first()? {
        b'+' | b'-' | b':' | b'_' | b'#' | b',' => Some(at),
        b'$' | b'=' => match n()? {
            -1 => Some(at),
            len if len >= 0 => {
                let len = len as usize;
                (b.len() >= at + len + 2 && &b[at + len..at + len + 2] == b"\r\n")
                    .then_some(at + len + 2)
            }
            _ => None,
        },
        c @ (b'*' | b'~' | b'%') => {
            let count = match n()? {
                -1 if c == b'*' => return Some(at),
                x if x >= 0 => x as usize * if c == b'%' { 2 } else { 1 },
                _ => return None,
            };
            let mut used = at;
            for _ in 0..count {
                used += reply_len(&b[used..])?;
            }
            Some(used)
        }
        _ => None,
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&step, data)) = input.split_first() else {
        return;
    };
    let out = fuzzing::run(data, step as usize % 64 + 1);
    let mut at = 0;
    while at < out.len() {
        match reply_len(&out[at..]) {
            Some(n) => at += n,
            None => panic!(
                "the door wrote something that is not a reply at byte {at}: {:?}",
                String::from_utf8_lossy(&out[at..out.len().min(at + 200)])
            ),
        }
    }
});
