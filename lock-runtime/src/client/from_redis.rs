//! A [`Config`] from the `redis` crate's own connection settings: what a
//! service that already talks to Redis through that crate has at hand
//! (`redis::Client::get_connection_info()`, a `ConnectionInfo` built by
//! hand, its `TlsCertificates`), instead of a URL written again.

use redis::ConnectionInfo;

use crate::url::connection_url;

use super::Config;

impl Config {
    /// A configuration for the server `info` names: its address (TCP,
    /// TLS or a Unix socket), database, user and password, as
    /// [`Config::new`] would take them from the URL `redis://user:password@host:port/db`
    /// (`rediss://` for [`ConnectionAddr::TcpTls`](redis::ConnectionAddr::TcpTls), `redis+unix://` for
    /// [`ConnectionAddr::Unix`](redis::ConnectionAddr::Unix)). Everything else is this crate's own
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
