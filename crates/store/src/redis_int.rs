//! Integers as Redis reads them (`INCR`, `DECRBY` and the other counters):
//! stricter than `str::parse`.

/// `v` as Redis reads an integer (`string2ll`): an optional `-`, then
/// digits with no leading zero (but `0` itself), nothing else, within i64.
pub fn redis_i64(v: &[u8]) -> Option<i64> {
    let digits = v.strip_prefix(b"-").unwrap_or(v);
    let ok = match digits {
        [] => false,
        [b'0'] => v.len() == 1,
        [b'0', ..] => false,
        d => d.iter().all(u8::is_ascii_digit) && d.len() <= 20,
    };
    if !ok {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}
