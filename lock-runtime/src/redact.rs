//! Masking passwords in Redis URLs before they reach a message or a log.

/// Returns `url` with any password replaced by `***`.
///
/// Handles `scheme://user:password@host`, `scheme://password@host` (the whole
/// user part is masked, since some clients read it as a password) and
/// `?password=...` / `?pass=...` query parameters (as in `redis+unix://` URLs).
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let tail = redact_query(tail);
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    }
}

fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _))
                if name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password") =>
            {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn masks_every_password_form() {
        let cases = [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis://user:s3cret@host:6379/0",
                "redis://user:***@host:6379/0",
            ),
            ("redis://:s3cret@host", "redis://:***@host"),
            ("rediss://s3cret@host:6380", "rediss://***@host:6380"),
            ("redis://u:p@ss:w@rd@host/1", "redis://u:***@host/1"),
            (
                "redis+unix:///tmp/redis.sock?db=1&pass=s3cret",
                "redis+unix:///tmp/redis.sock?db=1&pass=***",
            ),
        ];
        for (input, expected) in cases {
            let redacted = redact_url(input);
            assert_eq!(redacted, expected, "for {input}");
            assert!(!redacted.contains("s3cret") && !redacted.contains("rd@"));
        }
    }
}
