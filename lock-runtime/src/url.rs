//! The URL of a `redis::ConnectionInfo`, as `Config::new` takes it: for a
//! `Config` built from the `redis` crate's settings, and for messages that
//! name a server (with the password masked by `redact`).

use redis::{ConnectionAddr, ConnectionInfo};

/// The URL of `info`, user and password percent-encoded.
pub(crate) fn connection_url(info: &ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings.username().map(encode);
    let password = settings.password().map(encode);
    let db = settings.db();
    match info.addr() {
        ConnectionAddr::Unix(path) => {
            let mut query = vec![format!("db={db}")];
            if let Some(user) = user {
                query.push(format!("user={user}"));
            }
            if let Some(password) = password {
                query.push(format!("pass={password}"));
            }
            format!("redis+unix://{}?{}", path.display(), query.join("&"))
        }
        addr => {
            let (scheme, host, port, insecure) = match addr {
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure,
                    ..
                } => ("rediss", host, *port, *insecure),
                ConnectionAddr::Tcp(host, port) => ("redis", host, *port, false),
                // An address kind this crate does not know: as the `redis`
                // crate shows it, which `Client::new` refuses with the
                // address in its message.
                other => return format!("redis://{other}"),
            };
            let credentials = match (user, password) {
                (None, None) => String::new(),
                (user, None) => format!("{}@", user.unwrap_or_default()),
                (user, Some(password)) => format!("{}:{password}@", user.unwrap_or_default()),
            };
            let host = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]")
            } else {
                host.clone()
            };
            let insecure = if insecure { "#insecure" } else { "" };
            format!("{scheme}://{credentials}{host}:{port}/{db}{insecure}")
        }
    }
}

/// `text` percent-encoded for a URL's user or password.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use redis::IntoConnectionInfo;

    use super::connection_url;

    /// The URL made of a `ConnectionInfo` gives the same `ConnectionInfo`
    /// back: address, database, user and password (odd characters too).
    #[test]
    fn a_connection_info_round_trips_through_its_url() {
        for url in [
            "redis://127.0.0.1:6380/3",
            "redis://app:s%2Fe%40c%3Ar%23t%3F@localhost:7000/0",
            "redis://:pw@[::1]:6379/1",
            #[cfg(feature = "tls-rustls")]
            "rediss://user:pw@redis.example:6380/0",
            "redis+unix:///run/redis.sock?db=2&user=app&pass=p%40ss",
        ] {
            let info = url.into_connection_info().unwrap();
            let made = connection_url(&info);
            let again = made.as_str().into_connection_info().unwrap();
            assert_eq!(again.addr(), info.addr(), "{url} -> {made}");
            let (a, b) = (again.redis_settings(), info.redis_settings());
            assert_eq!(
                (a.db(), a.username(), a.password()),
                (b.db(), b.username(), b.password()),
                "{url} -> {made}"
            );
        }
    }

    #[cfg(feature = "tls-rustls")]
    #[test]
    fn an_insecure_tls_address_says_so() {
        let info = "rediss://h:1/#insecure".into_connection_info().unwrap();
        assert!(matches!(
            info.addr(),
            redis::ConnectionAddr::TcpTls { insecure: true, .. }
        ));
        assert_eq!(connection_url(&info), "rediss://h:1/0#insecure");
    }
}
