//! Glob patterns over binary keys, as Redis's `KEYS` and `SCAN MATCH`
//! take them: `*` any run of bytes, `?` one byte, `[abc]`, `[a-z]` and
//! `[^a]` sets, `\x` the byte `x` itself.
//!
//! A pattern is parsed once ([`Pattern::new`]: each set becomes a 256-bit
//! table), so matching a key costs O(1) per pattern token and byte; the
//! matcher keeps one backtrack point (the last `*`), which bounds a key's
//! cost by its length times the pattern's. A node refuses patterns longer
//! than [`MAX_PATTERN_LEN`], so that product stays small.

/// The longest pattern a scan takes, in bytes: room for a key and its
/// escapes and wildcards, far below what could hold the node loop.
pub const MAX_PATTERN_LEN: usize = 4 * crate::object::MAX_KEY_LEN;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// `*` (a run of them is one).
    Star,
    /// `?`.
    Any,
    /// A byte itself (also `\x`, and an unclosed `[`).
    Byte(u8),
    /// A `[...]` set, negation applied: bit `c` set when `c` matches.
    Set([u64; 4]),
}

impl Token {
    fn matches(&self, c: u8) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Byte(b) => *b == c,
            Token::Set(bits) => bits[(c >> 6) as usize] & (1 << (c & 63)) != 0,
        }
    }
}

/// A parsed glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Token>,
}

impl Pattern {
    /// Parses `pattern` (any bytes: what is not a wildcard is a literal).
    pub fn new(pattern: &[u8]) -> Pattern {
        let mut tokens = Vec::new();
        let mut p = 0;
        while p < pattern.len() {
            let (t, used) = match pattern[p] {
                b'*' => (Token::Star, 1),
                b'?' => (Token::Any, 1),
                b'[' => match class(&pattern[p..]) {
                    Some((bits, used)) => (Token::Set(bits), used),
                    // An unclosed `[` is a literal.
                    None => (Token::Byte(b'['), 1),
                },
                b'\\' if p + 1 < pattern.len() => (Token::Byte(pattern[p + 1]), 2),
                c => (Token::Byte(c), 1),
            };
            if !(t == Token::Star && tokens.last() == Some(&Token::Star)) {
                tokens.push(t);
            }
            p += used;
        }
        Pattern { tokens }
    }

    /// Whether `s` matches the pattern whole.
    pub fn matches(&self, s: &[u8]) -> bool {
        // Iterative with one backtrack point (the last `*`): no recursion
        // an adversarial pattern could blow up.
        let t = &self.tokens;
        let (mut p, mut i) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while i < s.len() {
            if p < t.len() {
                if t[p] == Token::Star {
                    star = Some((p, i));
                    p += 1;
                    continue;
                }
                if t[p].matches(s[i]) {
                    p += 1;
                    i += 1;
                    continue;
                }
            }
            // Mismatch: let the last `*` take one more byte.
            match star {
                Some((sp, si)) => {
                    star = Some((sp, si + 1));
                    p = sp + 1;
                    i = si + 1;
                }
                None => return false,
            }
        }
        // Runs of `*` are one token: at most one can be left.
        t[p..].iter().all(|x| *x == Token::Star)
    }
}

/// Whether `s` matches `pattern` whole (parses the pattern: to match many
/// keys, make a [`Pattern`] once).
pub fn matches(pattern: &[u8], s: &[u8]) -> bool {
    Pattern::new(pattern).matches(s)
}

/// A `[...]` set at the start of `p`: its bytes (negation applied) and the
/// pattern bytes it takes; `None` if it is not closed.
fn class(p: &[u8]) -> Option<([u64; 4], usize)> {
    let mut j = 1;
    let negate = p.get(1) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut bits = [0u64; 4];
    let set = |bits: &mut [u64; 4], c: u8| bits[(c >> 6) as usize] |= 1 << (c & 63);
    let mut first = true;
    while j < p.len() {
        if p[j] == b']' && !first {
            if negate {
                for w in &mut bits {
                    *w = !*w;
                }
            }
            return Some((bits, j + 1));
        }
        first = false;
        let lo = if p[j] == b'\\' && j + 1 < p.len() {
            j += 1;
            p[j]
        } else {
            p[j]
        };
        if j + 2 < p.len() && p[j + 1] == b'-' && p[j + 2] != b']' {
            let hi = p[j + 2];
            for c in lo.min(hi)..=lo.max(hi) {
                set(&mut bits, c);
            }
            j += 3;
        } else {
            set(&mut bits, lo);
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn redis_style_patterns() {
        let yes: &[(&str, &str)] = &[
            ("*", ""),
            ("*", "anything"),
            ("user:*", "user:42"),
            ("h?llo", "hello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-c]llo", "hbllo"),
            ("a*b*c", "axxbyyc"),
            ("\\*x", "*x"),
            ("[", "["),
            ("*.txt", "a.b.txt"),
        ];
        let no: &[(&str, &str)] = &[
            ("user:*", "users"),
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("a*b*c", "axxbyy"),
            ("\\*x", "ax"),
            ("abc", "abcd"),
            ("", "a"),
        ];
        for (p, s) in yes {
            assert!(matches(p.as_bytes(), s.as_bytes()), "{p} ~ {s}");
        }
        for (p, s) in no {
            assert!(!matches(p.as_bytes(), s.as_bytes()), "{p} !~ {s}");
        }
    }

    #[test]
    fn many_stars_stay_fast() {
        let p = "*a".repeat(50) + "b";
        let s = "a".repeat(200);
        assert!(!matches(p.as_bytes(), s.as_bytes()));
    }

    /// A long `[...]` set against long keys: the set is parsed once, not
    /// walked per byte (this took seconds when it was).
    #[test]
    fn long_sets_stay_fast() {
        let set: String = std::iter::repeat_n("\\x", MAX_PATTERN_LEN / 2 - 4).collect();
        let p = Pattern::new(format!("*[{set}]*b").as_bytes());
        let s = "a".repeat(crate::object::MAX_KEY_LEN);
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            assert!(!p.matches(s.as_bytes()));
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
    }

    /// The matcher as it was before patterns were parsed once: the parsed
    /// one must agree with it on every pattern.
    fn reference(pattern: &[u8], s: &[u8]) -> bool {
        fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
            let mut j = 1;
            let negate = p.get(1) == Some(&b'^');
            if negate {
                j += 1;
            }
            let (mut hit, mut first) = (false, true);
            while j < p.len() {
                if p[j] == b']' && !first {
                    return Some((hit != negate, j + 1));
                }
                first = false;
                let lo = if p[j] == b'\\' && j + 1 < p.len() {
                    j += 1;
                    p[j]
                } else {
                    p[j]
                };
                if j + 2 < p.len() && p[j + 1] == b'-' && p[j + 2] != b']' {
                    let hi = p[j + 2];
                    hit |= (lo.min(hi)..=lo.max(hi)).contains(&c);
                    j += 3;
                } else {
                    hit |= lo == c;
                    j += 1;
                }
            }
            None
        }
        let (mut p, mut i) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while i < s.len() {
            if p < pattern.len() {
                match pattern[p] {
                    b'*' => {
                        star = Some((p, i));
                        p += 1;
                        continue;
                    }
                    b'?' => {
                        p += 1;
                        i += 1;
                        continue;
                    }
                    b'[' => {
                        if let Some((ok, next)) = class(&pattern[p..], s[i]) {
                            if ok {
                                p += next;
                                i += 1;
                                continue;
                            }
                        } else if s[i] == b'[' {
                            p += 1;
                            i += 1;
                            continue;
                        }
                    }
                    b'\\' if p + 1 < pattern.len() => {
                        if pattern[p + 1] == s[i] {
                            p += 2;
                            i += 1;
                            continue;
                        }
                    }
                    c => {
                        if c == s[i] {
                            p += 1;
                            i += 1;
                            continue;
                        }
                    }
                }
            }
            match star {
                Some((sp, si)) => {
                    star = Some((sp, si + 1));
                    p = sp + 1;
                    i = si + 1;
                }
                None => return false,
            }
        }
        pattern[p..].iter().all(|&c| c == b'*')
    }

    fn text(len: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"ab*?[]^-\\".to_vec()), 0..len)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

        #[test]
        fn parsed_patterns_match_as_before(p in text(12), s in text(10)) {
            prop_assert_eq!(matches(&p, &s), reference(&p, &s));
        }
    }
}
