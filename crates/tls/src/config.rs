//! The TLS 1.3 configurations: the server's (its chain, client certificates verified
//! against the host CA, and unauthenticated connections allowed only so that they can
//! join), a client's (pinned CA, its certificate), and a joining client's (the CA pinned
//! by the token's fingerprint, no certificate yet).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::{addr_key, Error, Fingerprint, StateDir};

/// The name every server certificate carries and every client asks for: servers are
/// reached by any address, and authenticated by the CA the client pins.
pub const SERVER_NAME: &str = "crest";

/// aws-lc's cryptography (its AES-GCM uses the 512-bit vector AES and carry-less multiply
/// instructions where the CPU has them: ~11 GB/s per core here against ring's ~7) with
/// the TLS 1.3 suites only, AES-128-GCM first: every byte of file
/// data is sealed once and opened once, and on the CPUs crest runs on (AES-NI, carry-less
/// multiply) AES-128-GCM costs ~15 % less per byte than AES-256-GCM (the default's first)
/// at the security level TLS 1.3 asks of every suite; ChaCha20-Poly1305 stays for peers
/// without AES instructions.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// What a client presents and trusts.
pub struct Credentials {
    /// The CA its server's certificate must chain to.
    pub ca: CertificateDer<'static>,
    /// Its certificate.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its key.
    pub key: PrivateKeyDer<'static>,
    /// Where they were found (for messages).
    pub origin: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, CA {:?})", self.origin, Fingerprint::of(&self.ca))
    }
}

pub(crate) fn cert_from_pem(pem: &str, what: &str) -> Result<CertificateDer<'static>, Error> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| Error::Cert(format!("{what}: {e}")))
}

pub(crate) fn key_from_pem(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| Error::Cert(format!("{what}: {e}")))
}

impl Credentials {
    fn load(dir: &StateDir, ca: &str, cert: &str, key: &str) -> Result<Option<Credentials>, Error> {
        if dir.read(cert)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Credentials {
            ca: cert_from_pem(&dir.read_text(ca)?, ca)?,
            chain: vec![cert_from_pem(&dir.read_text(cert)?, cert)?],
            key: key_from_pem(&dir.read_text(key)?, key)?,
            origin: dir.path().join(cert).display().to_string(),
        }))
    }

    /// The host's own client certificate (made by the first `crest serve` on this host).
    pub fn local(dir: &StateDir) -> Result<Option<Credentials>, Error> {
        Credentials::load(dir, "ca.pem", "local.pem", "local.key")
    }

    /// The credentials `crest join ADDR` saved.
    pub fn joined(dir: &StateDir, addr: &str) -> Result<Option<Credentials>, Error> {
        let sub = format!("joined/{}", addr_key(addr));
        Credentials::load(dir, &format!("{sub}/ca.pem"), &format!("{sub}/cert.pem"), &format!("{sub}/key.pem"))
    }

    /// What a mount of `addr` uses: what joining `addr` gave, else the host's own.
    pub fn for_server(dir: &StateDir, addr: &str) -> Result<Credentials, Error> {
        if !dir.usable()? {
            return Err(no_credentials(dir, addr));
        }
        if let Some(c) = Credentials::joined(dir, addr)? {
            return Ok(c);
        }
        Credentials::local(dir)?.ok_or_else(|| no_credentials(dir, addr))
    }

    /// Saves what joining `addr` gave: the server's CA, the certificate and its key.
    pub fn save_joined(dir: &StateDir, addr: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<(), Error> {
        let _lock = dir.lock()?;
        let sub = format!("joined/{}", addr_key(addr));
        dir.write(&format!("{sub}/key.pem"), key_pem.as_bytes())?;
        dir.write(&format!("{sub}/ca.pem"), ca_pem.as_bytes())?;
        dir.write(&format!("{sub}/cert.pem"), cert_pem.as_bytes())?;
        dir.write(&format!("{sub}/server"), addr.as_bytes())
    }
}

fn no_credentials(dir: &StateDir, addr: &str) -> Error {
    Error::State {
        path: dir.path().to_path_buf(),
        detail: format!(
            "no credentials for {addr}: on the server's host, root mounts with none; elsewhere run \
             `crest token create` on the server and `crest join {addr} TOKEN` here (or mount with \
             --token TOKEN); for a server run with --insecure, mount with --insecure"
        ),
    }
}

fn roots(ca: &CertificateDer<'static>) -> Result<Arc<RootCertStore>, Error> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone())?;
    Ok(Arc::new(roots))
}

/// The server's configuration: TLS 1.3 only; its chain (server certificate, CA); client
/// certificates verified against `ca` when presented (the server then checks the register;
/// a connection without one may only join).
pub fn server_config(
    ca: &CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, Error> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Cert(e.to_string()))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// A mounting client's configuration: the server must chain to `c.ca`; `c`'s certificate
/// is presented.
pub fn client_config(c: &Credentials) -> Result<Arc<ClientConfig>, Error> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(&c.ca)?)
        .with_client_auth_cert(c.chain.clone(), c.key.clone_key())?;
    Ok(Arc::new(config))
}

/// A joining client's configuration: the server must send, after its certificate, a CA
/// whose fingerprint is `ca` and which signed that certificate. No client certificate.
pub fn join_config(ca: Fingerprint) -> Result<Arc<ClientConfig>, Error> {
    let verifier = Arc::new(PinnedCa { ca, provider: provider() });
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The fingerprint of the certificate the peer presented, if any (after the handshake,
/// which verified it).
pub fn peer_fingerprint(conn: &rustls::CommonState) -> Option<Fingerprint> {
    conn.peer_certificates()?.first().map(|c| Fingerprint::of(c))
}

/// Verifies a server against a CA known only by its fingerprint (from a join token).
#[derive(Debug)]
struct PinnedCa {
    ca: Fingerprint,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates.iter().find(|c| Fingerprint::of(c) == self.ca) else {
            return Err(rustls::Error::General(
                "the server's certificate authority is not the one the token names".into(),
            ));
        };
        let roots = roots(&ca.clone().into_owned()).map_err(|e| rustls::Error::General(e.to_string()))?;
        let inner = WebPkiServerVerifier::builder_with_provider(roots, self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
