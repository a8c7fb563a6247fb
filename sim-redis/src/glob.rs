//! Redis's glob-style pattern matching (`stringmatchlen`): `*`, `?`,
//! `[abc]`, `[^a-z]`, and `\` to escape, for `SCAN ... MATCH`.

/// Whether `string` matches `pattern`.
pub(crate) fn matches(pattern: &[u8], string: &[u8]) -> bool {
    match_from(pattern, string, 0)
}

fn match_from(mut p: &[u8], mut s: &[u8], depth: usize) -> bool {
    if depth > 1000 {
        return false; // Redis bounds the recursion too (and fails the match)
    }
    while !p.is_empty() && !s.is_empty() {
        match p[0] {
            b'*' => {
                while p.len() > 1 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return true;
                }
                for start in 0..s.len() {
                    if match_from(&p[1..], &s[start..], depth + 1) {
                        return true;
                    }
                }
                return false;
            }
            b'?' => s = &s[1..],
            b'[' => {
                p = &p[1..];
                let not = p.first() == Some(&b'^');
                if not {
                    p = &p[1..];
                }
                let mut matched = false;
                loop {
                    if p.is_empty() {
                        break;
                    }
                    if p[0] == b'\\' && p.len() >= 2 {
                        p = &p[1..];
                        if p[0] == s[0] {
                            matched = true;
                        }
                    } else if p[0] == b']' {
                        break;
                    } else if p.len() >= 3 && p[1] == b'-' {
                        let (mut start, mut end) = (p[0], p[2]);
                        if start > end {
                            std::mem::swap(&mut start, &mut end);
                        }
                        p = &p[2..];
                        if s[0] >= start && s[0] <= end {
                            matched = true;
                        }
                    } else if p[0] == s[0] {
                        matched = true;
                    }
                    p = &p[1..];
                }
                if not {
                    matched = !matched;
                }
                if !matched {
                    return false;
                }
                s = &s[1..];
                if p.is_empty() {
                    // an unterminated class: the pattern ends here
                    return s.is_empty();
                }
            }
            b'\\' if p.len() >= 2 => {
                p = &p[1..];
                if p[0] != s[0] {
                    return false;
                }
                s = &s[1..];
            }
            c => {
                if c != s[0] {
                    return false;
                }
                s = &s[1..];
            }
        }
        p = &p[1..];
        if s.is_empty() {
            while p.first() == Some(&b'*') {
                p = &p[1..];
            }
            break;
        }
    }
    p.is_empty() && s.is_empty()
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_as_in_redis() {
        assert!(matches(b"lock:*", b"lock:a"));
        // as in Redis's stringmatchlen, an empty string matches nothing
        assert!(!matches(b"*", b""));
        assert!(matches(b"lock:*:fence", b"lock:{x}:fence"));
        assert!(!matches(b"lock:*:fence", b"lock:{x}:queue"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-b]llo", b"hbllo"));
        assert!(matches(b"a\\*", b"a*"));
        assert!(!matches(b"a\\*", b"ab"));
        assert!(!matches(b"abc", b"ab"));
    }
}
