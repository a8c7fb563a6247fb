//! A [`Config`] from the `redis` crate's own connection settings: what a
//! service that already talks to Redis through that crate has at hand
//! (`redis::Client::get_connection_info()`, a `ConnectionInfo` built by
//! hand, its `TlsCertificates`), instead of a URL written again.

use redis::{ConnectionAddr, ConnectionInfo};

use super::Config;

impl Config {
    /// A configuration for the server `info` names: its address (TCP,
    /// TLS or a Unix socket), database, user and password, as
    /// [`Config::new`] would take them from the URL `redis://user:password@host:port/db`
    /// (`rediss://` for [`ConnectionAddr::TcpTls`], `redis+unix://` for
    /// [`ConnectionAddr::Unix`]). Everything else is this crate's own
    /// setting, as for a URL: the protocol, the client name, TCP options
    /// and the timeouts of `info` are not taken (the lock opens its own
    /// connection, with [`connect_timeout`](Config::connect_timeout) and
    /// [`response_timeout`](Config::response_timeout)).
    ///
    /// TLS needs the `tls-rustls` feature, as a `rediss://` URL does. A TLS
    /// address with `insecure: true` (no check of the server's certificate)
    /// is refused by [`Client::new`](crate::Client::new): give the CA
    /// instead, with [`tls_certificates`](Config::tls_certificates) or
    /// [`tls_root_certificates`](Config::tls_root_certificates). The
    /// password never appears in `Debug` output, errors or logs.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_runtime::{Client, Config};
    ///
    /// let redis = lock_runtime::redis::Client::open("redis://app:secret@10.0.0.5:6379/2")?;
    /// let locks = Client::new(Config::from_connection_info(redis.get_connection_info()))?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn from_connection_info(info: &ConnectionInfo) -> Config {
        Config::new(connection_url(info))
    }

    /// TLS certificates given the `redis` crate's way
    /// (`redis::TlsCertificates`, as for `redis::Client::build_with_tls`):
    /// `root_cert` as [`tls_root_certificates`](Config::tls_root_certificates),
    /// `client_tls` as [`tls_client_certificate`](Config::tls_client_certificate).
    #[cfg(feature = "tls-rustls")]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Config {
        if let Some(root) = certificates.root_cert {
            self = self.tls_root_certificates(root);
        }
        if let Some(client) = certificates.client_tls {
            self = self.tls_client_certificate(client.client_cert, client.client_key);
        }
        self
    }
}

impl From<&ConnectionInfo> for Config {
    fn from(info: &ConnectionInfo) -> Config {
        Config::from_connection_info(info)
    }
}

impl From<ConnectionInfo> for Config {
    fn from(info: ConnectionInfo) -> Config {
        Config::from_connection_info(&info)
    }
}

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
