//! "Did you mean ...?": the closest of a few known names to a misspelt one.

/// The candidate closest to `written`, if it is close enough to be what was
/// meant: at most one edit (insertion, deletion, substitution or swap of two
/// neighbours) per three characters, at least one; or else the name that
/// shares the longest beginning with it, four characters or more (`fence`
/// for `fencing`, `hold` for `hold_at_least`). Ties go to a candidate that
/// begins with the written name, then to the earlier candidate.
pub(crate) fn closest<'a>(written: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let written = written.to_lowercase();
    let length = written.chars().count();
    let limit = (length / 3).max(1);
    let by_distance = candidates
        .iter()
        .map(|&candidate| (distance(&written, candidate), candidate))
        .filter(|&(distance, _)| distance <= limit)
        // Among equals, a name the written one begins (`writ`: `write`).
        .min_by_key(|&(distance, candidate)| (distance, !candidate.starts_with(written.as_str())))
        .map(|(_, candidate)| candidate);
    by_distance.or_else(|| {
        candidates
            .iter()
            .map(|&candidate| (common_prefix(&written, candidate), candidate))
            .filter(|&(shared, _)| shared >= 4)
            .max_by_key(|&(shared, _)| shared)
            .map(|(_, candidate)| candidate)
    })
}

/// How many leading characters `a` and `b` share.
fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(a, b)| a == b).count()
}

/// The optimal string alignment distance: the Levenshtein distance with the
/// swap of two neighbouring characters counted as one edit (`tll` and `ttl`
/// are one substitution apart, `wiat` and `wait` one swap).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: the distance between a[..i] and b[..j].
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::{closest, distance};

    const ARGUMENTS: &[&str] = &[
        "key",
        "ttl",
        "wait",
        "renew",
        "max_hold",
        "on_lost",
        "fair",
        "fencing",
        "hold_at_least",
        "read",
        "write",
        "permits",
        "client",
        "crate",
    ];

    #[test]
    fn distances() {
        assert_eq!(distance("tll", "ttl"), 1);
        assert_eq!(distance("wiat", "wait"), 1);
        assert_eq!(distance("", "key"), 3);
        assert_eq!(distance("renewal", "renew"), 2);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn misspelt_arguments_find_what_was_meant() {
        let cases = [
            ("tll", Some("ttl")),
            ("TTL", Some("ttl")),
            ("ky", Some("key")),
            ("keys", Some("key")),
            ("wiat", Some("wait")),
            ("renw", Some("renew")),
            ("renewal", Some("renew")),
            ("maxhold", Some("max_hold")),
            ("max_hlod", Some("max_hold")),
            ("onlost", Some("on_lost")),
            ("fence", Some("fencing")),
            ("hold_at_last", Some("hold_at_least")),
            ("hold", Some("hold_at_least")),
            ("fenced", Some("fencing")),
            ("permit", Some("permits")),
            ("clinet", Some("client")),
            ("crates", Some("crate")),
            ("writ", Some("write")),
            // Nothing close: no guess.
            ("timeout", None),
            ("shared", None),
            ("x", None),
            ("expiry", None),
        ];
        for (written, expected) in cases {
            assert_eq!(closest(written, ARGUMENTS), expected, "for {written:?}");
        }
    }
}
