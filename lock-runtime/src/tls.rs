//! TLS: the certificates a client trusts (a private CA) and the one it
//! shows (mutual TLS), applied to every connection of the client, each
//! node of a cluster or a quorum included; and what a rejected handshake
//! means for the user.
//!
//! The connections themselves are the `redis` crate's (rustls, through
//! `Client::build_with_tls`); here the certificates are only checked, so
//! that a mistake is a `Config` error when the client is built rather than
//! a failed call later.

use std::fmt;

/// Whether this build has TLS (the `tls-rustls` feature).
pub(crate) const BUILT_IN: bool = cfg!(feature = "tls-rustls");

/// How to get TLS in a build that lacks it.
pub(crate) const HOW_TO_ENABLE: &str = "enable lock-runtime's `tls-rustls` feature \
     (lock-runtime = { version = \"...\", features = [\"tls-rustls\"] })";

/// The reason of a [`ConfigError::InvalidTls`](crate::ConfigError::InvalidTls)
/// (made by the client, which checks the settings).
fn invalid_tls(reason: impl Into<String>) -> String {
    reason.into()
}

/// The certificates of a client's TLS connections. Certificates are public;
/// the client's private key is never shown (`Debug` says only whether one
/// is set).
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM: the certificates to trust instead of the webpki roots.
    pub(crate) root_certificates: Option<Vec<u8>>,
    /// PEM: the client's certificate chain and its private key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Whether any certificate was given.
    pub(crate) fn is_set(&self) -> bool {
        self.root_certificates.is_some() || self.client.is_some()
    }

    /// Checks that the certificates are usable: PEM that holds at least one
    /// certificate, a private key that matches the client certificate.
    /// The messages never quote the key. The error is the reason of a
    /// [`ConfigError::InvalidTls`](crate::ConfigError::InvalidTls).
    pub(crate) fn check(&self) -> Result<(), String> {
        if !self.is_set() {
            return Ok(());
        }
        if !BUILT_IN {
            return Err(invalid_tls(format!(
                "TLS certificates were configured (`Config::tls_root_certificates` or \
                 `Config::tls_client_certificate`), but this build of lock-runtime has no TLS \
                 support: {HOW_TO_ENABLE}"
            )));
        }
        #[cfg(feature = "tls-rustls")]
        rustls_check::check(self)?;
        Ok(())
    }

    /// The `redis` crate's form of the certificates.
    #[cfg(feature = "tls-rustls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.is_set().then(|| redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(certificate, key)| redis::ClientTlsConfig {
                    client_cert: certificate.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_certificates.clone(),
        })
    }
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let roots = match &self.root_certificates {
            Some(pem) => format!("{} certificate(s)", count_certificates(pem)),
            None => "webpki roots".to_owned(),
        };
        let client = match &self.client {
            Some((certificate, _key)) => format!(
                "{} certificate(s), private key <redacted>",
                count_certificates(certificate)
            ),
            None => "none".to_owned(),
        };
        f.debug_struct("Tls")
            .field("root_certificates", &roots)
            .field("client_certificate", &client)
            .finish()
    }
}

fn count_certificates(pem: &[u8]) -> usize {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    pem.windows(BEGIN.len())
        .filter(|window| *window == BEGIN)
        .count()
}

/// Whether `url` turns off the server's certificate check (`#insecure`).
pub(crate) fn is_insecure(url: &str) -> bool {
    url.rsplit_once('#')
        .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
}

/// What a Redis error says about TLS, if it is a failed handshake: what
/// happened, what to do. A rejected certificate does not go away by
/// retrying (see `backend::retryable`).
pub(crate) fn handshake_failure(error: &redis::RedisError) -> Option<HandshakeFailure> {
    #[cfg(feature = "tls-rustls")]
    {
        rustls_check::handshake_failure(error)
    }
    #[cfg(not(feature = "tls-rustls"))]
    {
        let _ = error;
        None
    }
}

/// A TLS handshake that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "tls-rustls"), allow(dead_code))]
pub(crate) enum HandshakeFailure {
    /// The server's certificate was rejected: retrying cannot help.
    Certificate(&'static str),
    /// The server rejected ours (or wanted one): retrying cannot help.
    ClientCertificate(&'static str),
    /// Something else went wrong in the handshake (not TLS on that port,
    /// no common protocol version).
    Other(&'static str),
}

impl HandshakeFailure {
    /// What to do about it.
    pub(crate) fn advice(self) -> &'static str {
        match self {
            HandshakeFailure::Certificate(advice)
            | HandshakeFailure::ClientCertificate(advice)
            | HandshakeFailure::Other(advice) => advice,
        }
    }

    /// Whether the same handshake can succeed later.
    pub(crate) fn is_permanent(self) -> bool {
        !matches!(self, HandshakeFailure::Other(_))
    }
}

#[cfg(feature = "tls-rustls")]
mod rustls_check {
    use std::error::Error;
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{AlertDescription, CertificateError};

    use super::{invalid_tls, HandshakeFailure, TlsSettings};

    pub(super) fn check(settings: &TlsSettings) -> Result<(), String> {
        if let Some(pem) = &settings.root_certificates {
            let roots = certificates(pem, "Config::tls_root_certificates")?;
            let mut store = rustls::RootCertStore::empty();
            let (_, rejected) = store.add_parsable_certificates(roots);
            if rejected > 0 {
                return Err(invalid_tls(format!(
                    "{rejected} certificate(s) given to Config::tls_root_certificates cannot be \
                     used as trust anchors (not X.509 CA certificates?): give the PEM of the CA \
                     that signed the servers' certificates"
                )));
            }
        }
        if let Some((chain, key)) = &settings.client {
            let chain = certificates(chain, "Config::tls_client_certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
                invalid_tls(
                    "the private key given to Config::tls_client_certificate is not a PEM \
                     private key (`-----BEGIN PRIVATE KEY-----`, PKCS#8; or PKCS#1 RSA, or SEC1 \
                     EC): give the key of the client certificate in PEM",
                )
            })?;
            // The same check the connection makes, made now: a key of a
            // supported kind that belongs to the certificate.
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|error| invalid_tls(format!("TLS set-up failed: {error}")))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_client_auth_cert(chain, key)
                .map_err(|error| {
                    invalid_tls(format!(
                        "the client certificate and key given to \
                         Config::tls_client_certificate cannot be used ({}): give a \
                         certificate and the private key it was issued for",
                        describe(&error)
                    ))
                })?;
        }
        Ok(())
    }

    /// The certificates of `pem`; at least one.
    fn certificates(pem: &[u8], given_to: &str) -> Result<Vec<CertificateDer<'static>>, String> {
        let certificates = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| {
                invalid_tls(format!(
                    "the PEM given to {given_to} cannot be read ({error}): give certificates in \
                     PEM (`-----BEGIN CERTIFICATE-----`)"
                ))
            })?;
        if certificates.is_empty() {
            return Err(invalid_tls(format!(
                "the PEM given to {given_to} holds no certificate: give certificates in PEM \
                 (`-----BEGIN CERTIFICATE-----`)"
            )));
        }
        Ok(certificates)
    }

    /// A rustls error in words, without anything it may quote.
    fn describe(error: &rustls::Error) -> String {
        match error {
            rustls::Error::InconsistentKeys(_) => {
                "the private key does not belong to the certificate".to_owned()
            }
            rustls::Error::General(_) => "the key is of a kind rustls does not support".to_owned(),
            other => format!("{other:?}"),
        }
    }

    pub(super) fn handshake_failure(error: &redis::RedisError) -> Option<HandshakeFailure> {
        let error = rustls_error(error)?;
        Some(match error {
            rustls::Error::InvalidCertificate(certificate) => {
                HandshakeFailure::Certificate(match certificate {
                    CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                        "the server's TLS certificate is not signed by a CA this client trusts: \
                         give that CA's certificate to Config::tls_root_certificates"
                    }
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. } => {
                        "the server's TLS certificate is not for the host name or address in the \
                         URL: connect by a name or address the certificate lists"
                    }
                    CertificateError::Expired
                    | CertificateError::ExpiredContext { .. }
                    | CertificateError::NotValidYet
                    | CertificateError::NotValidYetContext { .. } => {
                        "the server's TLS certificate has expired or is not valid yet: renew it, \
                         or check the clocks"
                    }
                    _ => {
                        "the server's TLS certificate was rejected: check it against the CA given \
                         to Config::tls_root_certificates"
                    }
                })
            }
            rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::HandshakeFailure
                | AlertDescription::BadCertificate
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateRevoked
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnknownCA
                | AlertDescription::AccessDenied,
            ) => HandshakeFailure::ClientCertificate(
                "the server refused the TLS handshake, most likely because it requires a client \
                 certificate it trusts: give one signed by the CA of its tls-ca-cert-file to \
                 Config::tls_client_certificate",
            ),
            _ => HandshakeFailure::Other(
                "the TLS handshake failed: check that the server serves TLS on this port (its \
                 tls-port), or use `redis://` for a server without TLS",
            ),
        })
    }

    /// The rustls error inside a Redis I/O error, if any: the chain is
    /// `RedisError` -> `Arc<io::Error>` -> `io::Error` -> `rustls::Error`
    /// (an `io::Error`'s `source` skips its inner error, so each link is
    /// opened by hand).
    fn rustls_error(error: &redis::RedisError) -> Option<&rustls::Error> {
        let mut next: Option<&(dyn Error + 'static)> = error.source();
        for _ in 0..8 {
            let current = next?;
            if let Some(found) = current.downcast_ref::<rustls::Error>() {
                return Some(found);
            }
            next = if let Some(io) = current.downcast_ref::<std::io::Error>() {
                io.get_ref().map(|inner| inner as &(dyn Error + 'static))
            } else if let Some(shared) = current.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
                Some(shared.as_ref() as &(dyn Error + 'static))
            } else if let Some(shared) = current.downcast_ref::<Arc<std::io::Error>>() {
                Some(shared.as_ref() as &(dyn Error + 'static))
            } else {
                current.source()
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERTIFICATE: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn debug_shows_no_key() {
        let settings = TlsSettings {
            root_certificates: Some(CERTIFICATE.to_vec()),
            client: Some((
                CERTIFICATE.to_vec(),
                b"-----BEGIN PRIVATE KEY-----\nSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n"
                    .to_vec(),
            )),
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("SECRETKEYMATERIAL"), "{shown}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        assert!(shown.contains("1 certificate(s)"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn insecure_fragment() {
        assert!(is_insecure("rediss://host:6380/#insecure"));
        assert!(is_insecure("rediss://host:6380#INSECURE"));
        assert!(!is_insecure("rediss://host:6380/"));
        assert!(!is_insecure("rediss://u:p#insecure@host:6380/0"));
    }
}
