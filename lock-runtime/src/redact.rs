//! Masking passwords in Redis URLs before they reach a message or a log.

/// Returns `url` with any password replaced by `***`.
///
/// Handles `scheme://user:password@host`, `scheme://password@host` (the whole
/// user part is masked, since some clients read it as a password) and
/// `?password=...` / `?pass=...` query parameters (as in `redis+unix://` URLs).
///
/// The user part ends at the *last* `@` after `scheme://`, so a password with
/// an unencoded `/`, `?`, `#` or `@` is masked whole. When the `@` is in fact
/// in the path, query or fragment, more than the password is masked, never
/// less: the user name is shown only when it holds no `/`, `?`, `#` or `@`, and a
/// `pass`/`password` parameter is masked wherever it sits after that `@`, or
/// across it.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (userinfo, host_and_tail) = match rest.rsplit_once('@') {
        Some((userinfo, host_and_tail)) => {
            let user = userinfo
                .split_once(':')
                .map(|(user, _password)| user)
                // A user name holding one of these is really a password or
                // a path, the `@` being further on.
                .filter(|user| !user.contains(['/', '?', '#', '@']));
            let masked = match user {
                Some(user) => format!("{user}:***@"),
                None => "***@".to_owned(),
            };
            // An `@` inside a password parameter's value: what follows it, up
            // to the next parameter, is the rest of that password.
            let password_continues = userinfo
                .rsplit('&')
                .next()
                .is_some_and(is_password_parameter);
            (masked, redact_parameters(host_and_tail, password_continues))
        }
        None => (String::new(), redact_parameters(rest, false)),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{userinfo}{host_and_tail}"),
        None => format!("{userinfo}{host_and_tail}"),
    }
}

/// Masks the value of every `pass=` / `password=` parameter (any case): each
/// `&`-separated piece whose name, after any `?`, is one of those. The value
/// runs to the next `&`. With `mask_first`, the first piece is masked whole.
fn redact_parameters(text: &str, mask_first: bool) -> String {
    let pieces: Vec<String> = text
        .split('&')
        .enumerate()
        .map(|(index, piece)| {
            if index == 0 && mask_first {
                "***".to_owned()
            } else if is_password_parameter(piece) {
                let (name, _value) = piece.split_once('=').unwrap_or((piece, ""));
                format!("{name}=***")
            } else {
                piece.to_owned()
            }
        })
        .collect();
    pieces.join("&")
}

/// `password=...`, `x?pass=...`: a piece of a query naming a password.
fn is_password_parameter(piece: &str) -> bool {
    let Some((name, _value)) = piece.split_once('=') else {
        return false;
    };
    let name = name.rsplit('?').next().unwrap_or(name);
    name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password")
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

    #[test]
    fn masks_passwords_with_unencoded_delimiters() {
        let cases = [
            (
                "redis://default:pa/ss@host:6379/0",
                "redis://default:***@host:6379/0",
            ),
            ("redis://u:p?w@host", "redis://u:***@host"),
            ("redis://u:p#w@host:6379", "redis://u:***@host:6379"),
            ("redis://u:p/?#@:%w@host/2", "redis://u:***@host/2"),
            ("rediss://p/w?x#y@host", "rediss://***@host"),
            (
                "redis://u:p?w@host:6379/0?db=1&PASSWORD=x",
                "redis://u:***@host:6379/0?db=1&PASSWORD=***",
            ),
            // The `@` is in the query: more than the password is masked.
            (
                "redis://host:6379/0?client=a@b&password=s3cret",
                "redis://host:***@b&password=***",
            ),
            (
                "redis://host/0?password=s3c@ret&db=1",
                "redis://***@***&db=1",
            ),
            ("redis://host/0?password=s3c:r@et", "redis://***@***"),
            ("host:6379?pass=s3cret", "host:6379?pass=***"),
            ("redis://s3cret@host:0?password=x@y", "redis://***@***"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_url(input), expected, "for {input}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::redact_url;

        /// No upper case: a user name or host can never hold `SECRET`.
        fn user() -> impl Strategy<Value = String> {
            "[a-z0-9/?#@:%&=._~é漢 -]{0,8}"
        }

        /// `SECRET` and at least one more character: found in a redacted URL
        /// only if the password leaked.
        fn password() -> impl Strategy<Value = String> {
            "SECRET[A-Za-z0-9/?#@:%&=._~é漢ß€ -]{1,12}"
        }

        /// A password given alone (`scheme://password@host`): with a `:` it
        /// would be a user name and a password.
        fn lone_password() -> impl Strategy<Value = String> {
            "SECRET[A-Za-z0-9/?#@%&=._~é漢ß€ -]{1,12}"
        }

        fn host_and_path() -> impl Strategy<Value = String> {
            let host = prop_oneof![
                "[a-z0-9][a-z0-9.-]{0,15}",
                Just("[::1]".to_owned()),
                Just("127.0.0.1".to_owned()),
            ];
            prop_oneof![
                3 => (host, proptest::option::of(any::<u16>()), proptest::option::of(any::<u8>()))
                    .prop_map(|(host, port, db)| {
                        let port = port.map(|port| format!(":{port}")).unwrap_or_default();
                        let db = db.map(|db| format!("/{db}")).unwrap_or_default();
                        format!("{host}{port}{db}")
                    }),
                1 => Just("/tmp/redis.sock".to_owned()),
            ]
        }

        /// The user part before `@`, with the passwords it holds.
        fn userinfo() -> impl Strategy<Value = (String, Vec<String>)> {
            prop_oneof![
                Just((String::new(), Vec::new())),
                user().prop_map(|user| (format!("{user}@"), Vec::new())),
                (user(), password())
                    .prop_map(|(user, password)| (format!("{user}:{password}@"), vec![password])),
                password().prop_map(|password| (format!(":{password}@"), vec![password])),
                lone_password().prop_map(|password| (format!("{password}@"), vec![password])),
            ]
        }

        /// An optional query, with the password it holds.
        fn query() -> impl Strategy<Value = (String, Vec<String>)> {
            prop_oneof![
                Just((String::new(), Vec::new())),
                Just(("?db=1".to_owned(), Vec::new())),
                password().prop_map(|password| (format!("?password={password}"), vec![password])),
                password().prop_map(|password| (format!("?db=1&pass={password}"), vec![password])),
                password().prop_map(|password| (
                    format!("?PASSWORD={password}&timeout=5"),
                    vec![password]
                )),
            ]
        }

        proptest! {
            // No regression files written beside the sources.
            #![proptest_config(ProptestConfig {
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn never_shows_a_password(
                scheme in prop_oneof![Just("redis"), Just("rediss"), Just("redis+unix")],
                (userinfo, mut passwords) in userinfo(),
                host_and_path in host_and_path(),
                (query, query_passwords) in query(),
            ) {
                passwords.extend(query_passwords);
                let url = format!("{scheme}://{userinfo}{host_and_path}{query}");
                let redacted = redact_url(&url);
                for password in &passwords {
                    prop_assert!(
                        !redacted.contains(password.as_str()),
                        "{url} -> {redacted} shows {password}"
                    );
                }
                prop_assert!(!redacted.contains("SECRET"), "{url} -> {redacted}");
            }

            #[test]
            fn arbitrary_strings_do_not_panic(url in any::<String>()) {
                redact_url(&url);
            }

            #[test]
            fn url_like_strings_do_not_panic(url in "[a-z:/?#@&=%é]{0,40}") {
                let redacted = redact_url(&url);
                let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                prop_assert!(!after_scheme.contains('@') || redacted.contains("***"));
            }
        }
    }
}
