//! TLS for the private redis-servers: certificate authorities and
//! certificates made on the spot (rcgen), the settings a server is started
//! with ([`TlsOptions`], for [`RedisServer::start_tls`](crate::RedisServer::start_tls)),
//! and the TLS connection this crate's own commands use.
//!
//! Every certificate is valid from 1975 to 4096 and uses an ECDSA P-256
//! key; nothing is read from or written to the system's trust store.

use std::io;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A certificate authority of its own: its certificate, and its key to
/// sign others.
pub struct Ca {
    certificate_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new CA named `name` (its common name; give unrelated CAs different
    /// names).
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let certificate = params.self_signed(&key).expect("a CA certificate");
        Ca {
            certificate_pem: certificate.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate, PEM: what a client trusts.
    pub fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// A server certificate for `names` (IP addresses or DNS names, e.g.
    /// `127.0.0.1`, `localhost`), signed by this CA. Good for client
    /// authentication too: a cluster node shows it to the nodes it
    /// connects to.
    pub fn server_certificate(&self, names: &[&str]) -> Identity {
        self.issue(
            names,
            names.first().copied().unwrap_or("server"),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate for mutual TLS, named `name`, signed by this CA.
    pub fn client_certificate(&self, name: &str) -> Identity {
        self.issue(&[], name, &[ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn issue(
        &self,
        names: &[&str],
        common_name: &str,
        uses: &[ExtendedKeyUsagePurpose],
    ) -> Identity {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = uses.to_vec();
        let key = KeyPair::generate().expect("a key");
        let certificate = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        Identity {
            certificate_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Identity {
    pub certificate_pem: String,
    pub key_pem: String,
}

/// Whether a TLS server asks its clients for a certificate (redis-server's
/// `tls-auth-clients`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthClients {
    /// No client certificate asked for.
    No,
    /// A client certificate is checked if shown.
    Optional,
    /// A client certificate signed by the client CA is required.
    Yes,
}

impl AuthClients {
    fn as_arg(self) -> &'static str {
        match self {
            AuthClients::No => "no",
            AuthClients::Optional => "optional",
            AuthClients::Yes => "yes",
        }
    }
}

/// How a TLS redis-server is set up: its certificate (and the CA that
/// signed it, which this crate's own connections trust), the CA whose
/// client certificates it accepts, and whether it asks for one.
#[derive(Clone)]
pub struct TlsOptions {
    identity: Identity,
    /// The names of the server's certificate; the first is the name this
    /// crate's own connections check it against.
    names: Vec<String>,
    server_ca_pem: String,
    client_ca_pem: String,
    auth_clients: AuthClients,
    /// The client certificate of this crate's own connections (signed by
    /// the client CA).
    admin: Identity,
}

impl TlsOptions {
    /// A server with a certificate for `names` signed by `ca`, accepting
    /// client certificates of `ca`, asking for none.
    pub fn new(ca: &Ca, names: &[&str]) -> TlsOptions {
        TlsOptions {
            identity: ca.server_certificate(names),
            names: names.iter().map(|name| (*name).to_owned()).collect(),
            server_ca_pem: ca.certificate_pem().to_owned(),
            client_ca_pem: ca.certificate_pem().to_owned(),
            auth_clients: AuthClients::No,
            admin: ca.client_certificate("test-support"),
        }
    }

    /// A server with a certificate for 127.0.0.1 and localhost signed by
    /// `ca`.
    pub fn loopback(ca: &Ca) -> TlsOptions {
        TlsOptions::new(ca, &["127.0.0.1", "localhost"])
    }

    /// Whether the server asks for a client certificate (default: no).
    pub fn auth_clients(mut self, auth: AuthClients) -> TlsOptions {
        self.auth_clients = auth;
        self
    }

    /// The CA whose client certificates the server accepts (default: the
    /// server certificate's CA).
    pub fn client_ca(mut self, ca: &Ca) -> TlsOptions {
        self.client_ca_pem = ca.certificate_pem().to_owned();
        self.admin = ca.client_certificate("test-support");
        self
    }

    /// The PEM of the CA that signed the server's certificate.
    pub fn server_ca_pem(&self) -> &str {
        &self.server_ca_pem
    }

    /// Writes the server's files into `dir` and returns the redis-server
    /// arguments that use them (the TLS port apart).
    pub(crate) fn write_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::create_dir_all(dir)?;
        let cert = dir.join("server.crt");
        let key = dir.join("server.key");
        let ca = dir.join("client-ca.crt");
        std::fs::write(&cert, &self.identity.certificate_pem)?;
        std::fs::write(&key, &self.identity.key_pem)?;
        std::fs::write(&ca, &self.client_ca_pem)?;
        // For `redis-cli --tls` (creating a cluster).
        std::fs::write(dir.join("server-ca.crt"), &self.server_ca_pem)?;
        std::fs::write(dir.join("admin.crt"), &self.admin.certificate_pem)?;
        std::fs::write(dir.join("admin.key"), &self.admin.key_pem)?;
        let path = |path: PathBuf| path.display().to_string();
        Ok(vec![
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            self.auth_clients.as_arg().into(),
        ])
    }

    /// `redis-cli` arguments for a TLS connection to such a server, its
    /// files in `dir` (written by [`write_files`](Self::write_files)).
    pub(crate) fn cli_args(dir: &Path) -> Vec<String> {
        let path = |name: &str| dir.join(name).display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            path("server-ca.crt"),
            "--cert".into(),
            path("admin.crt"),
            "--key".into(),
            path("admin.key"),
        ]
    }

    /// The configuration of this crate's own TLS connections to the server.
    pub(crate) fn connector(&self) -> io::Result<Connector> {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(self.server_ca_pem.as_bytes()) {
            roots
                .add(certificate.map_err(io::Error::other)?)
                .map_err(io::Error::other)?;
        }
        let chain = CertificateDer::pem_slice_iter(self.admin.certificate_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(io::Error::other)?;
        let key = PrivateKeyDer::from_pem_slice(self.admin.key_pem.as_bytes())
            .map_err(io::Error::other)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(io::Error::other)?;
        let name = self.names.first().map_or("localhost", String::as_str);
        let name = ServerName::try_from(name.to_owned()).map_err(io::Error::other)?;
        Ok(Connector {
            config: Arc::new(config),
            name,
        })
    }
}

/// This crate's own TLS connections to one server.
pub(crate) struct Connector {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl Connector {
    /// A TLS connection to the loopback `port`, its handshake done.
    pub(crate) fn connect(
        &self,
        port: u16,
    ) -> io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
        let socket = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        socket.set_read_timeout(Some(Duration::from_secs(5)))?;
        socket.set_write_timeout(Some(Duration::from_secs(5)))?;
        let connection = rustls::ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(io::Error::other)?;
        let mut stream = rustls::StreamOwned::new(connection, socket);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(stream)
    }
}
