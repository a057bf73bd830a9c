//! Glob patterns over binary keys, as Redis's `KEYS` and `SCAN MATCH`
//! take them: `*` any run of bytes, `?` one byte, `[abc]`, `[a-z]` and
//! `[^a]` sets, `\x` the byte `x` itself.

/// Whether `s` matches `pattern` whole.
pub fn matches(pattern: &[u8], s: &[u8]) -> bool {
    // Iterative with one backtrack point (the last `*`): linear-ish, no
    // recursion an adversarial pattern could blow up.
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
                        // An unclosed `[` is a literal.
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
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A `[...]` set at the start of `p`: whether `c` is in it and the
/// pattern bytes it takes; `None` if it is not closed.
fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut j = 1;
    let negate = p.get(1) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut hit = false;
    let mut first = true;
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
            let (a, b) = (lo.min(hi), lo.max(hi));
            hit |= (a..=b).contains(&c);
            j += 3;
        } else {
            hit |= lo == c;
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::matches;

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
}
