//! `INCRBYFLOAT`'s arithmetic exactly as Redis does it: both numbers read
//! as C's `strtold` reads them into an x87 80-bit `long double` (64-bit
//! significand, rounded to nearest), added in that precision, and the sum
//! printed as `printf("%.17Lf")` prints it, trailing zeros (and a
//! trailing point) removed (Redis's `ld2string` in its human mode). Doing
//! it in `f64` gives other answers (0.1 + 0.2 is 0.3 in Redis,
//! 0.30000000000000004 in f64). The 80-bit arithmetic is
//! `rustc_apfloat`'s (the Rust project's port of LLVM's APFloat); the
//! decimal printing is here.

use rustc_apfloat::ieee::X87DoubleExtended as F80;
use rustc_apfloat::{Float, Round, Status};

/// Redis's `MAX_LONG_DOUBLE_CHARS`: a longer number is not read.
const MAX_CHARS: usize = 5 * 1024;

/// Why `INCRBYFLOAT` refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatError {
    /// The value or the increment is not a number `strtold` reads whole.
    NotAFloat,
    /// The sum is not finite.
    NanOrInfinity,
}

impl FloatError {
    /// Redis's words.
    pub fn text(self) -> &'static str {
        match self {
            FloatError::NotAFloat => "ERR value is not a valid float",
            FloatError::NanOrInfinity => "ERR increment would produce NaN or Infinity",
        }
    }
}

/// `cur` (absent: 0) plus `by`, printed as Redis prints it.
pub fn incr_by_float(cur: Option<&[u8]>, by: &[u8]) -> Result<String, FloatError> {
    let a = match cur {
        Some(v) => parse(v)?,
        None => F80::ZERO,
    };
    let b = parse(by)?;
    let sum = a.add_r(b, Round::NearestTiesToEven).value;
    if sum.is_nan() || sum.is_infinite() {
        return Err(FloatError::NanOrInfinity);
    }
    Ok(format(sum))
}

/// `b` read as Redis reads a `long double` (`string2ld`): no leading
/// space, the whole string a decimal number (`strtold`'s syntax: a sign,
/// digits with an optional point, an optional exponent) or `inf`/
/// `infinity`; not NaN; not out of range (an overflow, or an underflow to
/// zero). Hexadecimal floats, which `strtold` also reads, are refused.
pub fn parse(b: &[u8]) -> Result<F80, FloatError> {
    let bad = Err(FloatError::NotAFloat);
    if b.is_empty() || b.len() >= MAX_CHARS {
        return bad;
    }
    let Ok(s) = std::str::from_utf8(b) else {
        return bad;
    };
    let (neg, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let word = body.to_ascii_lowercase();
    if word == "inf" || word == "infinity" {
        return Ok(if neg { -F80::INFINITY } else { F80::INFINITY });
    }
    if !decimal(body) {
        return bad;
    }
    let text = if neg {
        format!("-{body}")
    } else {
        body.to_string()
    };
    let Ok(r) = F80::from_str_r(&text, Round::NearestTiesToEven) else {
        return bad;
    };
    let out_of_range = r.status.contains(Status::OVERFLOW)
        || (r.status.contains(Status::UNDERFLOW) && r.value.is_zero());
    if out_of_range || r.value.is_nan() {
        return bad;
    }
    Ok(r.value)
}

/// `strtold`'s decimal syntax (after the sign): digits with an optional
/// point (at least one digit), then an optional exponent.
fn decimal(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let mut n = digits(&mut i);
    if i < b.len() && b[i] == b'.' {
        i += 1;
        n += digits(&mut i);
    }
    if n == 0 {
        return false;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        // An exponent without digits is not part of the number, so the
        // string does not end where the number does.
        if digits(&mut j) == 0 {
            return false;
        }
        i = j;
    }
    i == b.len()
}

/// `printf("%.17Lf", v)` with the trailing zeros (and point) removed, and
/// `-0` written `0`, as Redis's `ld2string` does.
pub fn format(v: F80) -> String {
    let bits = v.to_bits();
    let sig = bits as u64;
    let biased = ((bits >> 64) & 0x7fff) as i64;
    let neg = (bits >> 79) & 1 == 1;
    // value = sig * 2^shift
    let shift = if biased == 0 { 1 } else { biased } - 16383 - 63;
    let mut t = if shift >= 0 {
        format!("{}.00000000000000000", big_shl_decimal(sig, shift as u32))
    } else {
        // round(sig * 10^17 / 2^k), ties to even: sig * 10^17 < 2^121.
        let k = (-shift) as u32;
        let n = sig as u128 * 100_000_000_000_000_000u128;
        let q = match k {
            0..=127 => {
                let q = n >> k;
                let r = n & ((1u128 << k) - 1);
                let half = 1u128 << (k - 1);
                if r > half || (r == half && q & 1 == 1) {
                    q + 1
                } else {
                    q
                }
            }
            _ => 0,
        };
        let int = q / 100_000_000_000_000_000;
        let frac = q % 100_000_000_000_000_000;
        format!("{int}.{frac:017}")
    };
    // Trailing zeros, then a trailing point.
    while t.ends_with('0') {
        t.pop();
    }
    if t.ends_with('.') {
        t.pop();
    }
    if neg && t != "0" {
        t.insert(0, '-');
    }
    t
}

/// `sig * 2^shift` in decimal.
fn big_shl_decimal(sig: u64, shift: u32) -> String {
    // Base 10^9 limbs, least significant first.
    const BASE: u64 = 1_000_000_000;
    let mut limbs: Vec<u64> = Vec::new();
    let mut s = sig;
    while s > 0 {
        limbs.push(s % BASE);
        s /= BASE;
    }
    let mut left = shift;
    while left > 0 {
        let step = left.min(29); // limb * 2^29 + carry fits u64
        let mut carry = 0u64;
        for l in limbs.iter_mut() {
            let x = (*l << step) + carry;
            *l = x % BASE;
            carry = x / BASE;
        }
        while carry > 0 {
            limbs.push(carry % BASE);
            carry /= BASE;
        }
        left -= step;
    }
    let mut out = limbs.last().map_or("0".to_string(), |l| l.to_string());
    for l in limbs.iter().rev().skip(1) {
        out.push_str(&format!("{l:09}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(a: Option<&str>, b: &str) -> Result<String, FloatError> {
        incr_by_float(a.map(str::as_bytes), b.as_bytes())
    }

    /// Answers of Redis 7.0.15 (x86-64), and the cases f64 gets wrong.
    #[test]
    fn sums_print_as_redis_prints_them() {
        assert_eq!(incr(Some("10.50"), "0.1").unwrap(), "10.6");
        assert_eq!(incr(Some("5.0e3"), "2.0e2").unwrap(), "5200");
        assert_eq!(incr(Some("0.1"), "0.2").unwrap(), "0.3");
        assert_eq!(incr(None, "1").unwrap(), "1");
        assert_eq!(incr(None, "-0").unwrap(), "0");
        assert_eq!(incr(Some("1"), "-1").unwrap(), "0");
        assert_eq!(incr(None, "1e20").unwrap(), "100000000000000000000");
        assert_eq!(incr(None, "-1.5").unwrap(), "-1.5");
        assert_eq!(incr(None, "3.0").unwrap(), "3");
        assert_eq!(incr(None, ".5").unwrap(), "0.5");
        assert_eq!(incr(None, "5.").unwrap(), "5");
        assert_eq!(incr(None, "+2").unwrap(), "2");
        assert_eq!(incr(None, "1e-18").unwrap(), "0");
        assert_eq!(incr(None, "inf"), Err(FloatError::NanOrInfinity));
        assert_eq!(incr(Some("abc"), "1"), Err(FloatError::NotAFloat));
        for bad in [
            "", " 1", "1 ", "1e", "e5", ".", "nan", "0x10", "1e5000", "1e-5000", "1..2",
        ] {
            assert_eq!(incr(None, bad), Err(FloatError::NotAFloat), "{bad:?}");
        }
        // 2^70: a significand shifted left.
        assert_eq!(
            incr(None, "1180591620717411303424").unwrap(),
            "1180591620717411303424"
        );
    }
}
