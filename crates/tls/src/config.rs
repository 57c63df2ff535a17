//! The TLS 1.3 configurations: the server's (its chain, client certificates verified
//! against the host CA, and unauthenticated connections allowed only so that they can
//! join), a client's (pinned CA, its certificate), and a joining client's (the CA pinned
//! by the token's fingerprint, no certificate yet).

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
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
pub(crate) fn provider() -> Arc<CryptoProvider> {
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
    /// Reads a certificate, its key and the CA it trusts. Read twice if the key is not the
    /// certificate's: a renewal replaced the directory between two of the reads
    /// (`StateDir::replace_dir`), and the second read sees the new one whole.
    fn load(dir: &StateDir, ca: &str, cert: &str, key: &str) -> Result<Option<Credentials>, Error> {
        let read = || -> Result<Option<Credentials>, Error> {
            if dir.read(cert)?.is_none() {
                return Ok(None);
            }
            Ok(Some(Credentials {
                ca: cert_from_pem(&dir.read_text(ca)?, ca)?,
                chain: vec![cert_from_pem(&dir.read_text(cert)?, cert)?],
                key: key_from_pem(&dir.read_text(key)?, key)?,
                origin: dir.path().join(cert).display().to_string(),
            }))
        };
        match read()? {
            Some(c) if c.certified().is_err() => {
                let again = read()?;
                if let Some(Err(e)) = again.as_ref().map(Credentials::certified) {
                    return Err(Error::Cert(format!(
                        "{}: not the certificate of {key}: {e}",
                        dir.path().join(cert).display()
                    )));
                }
                Ok(again)
            }
            found => Ok(found),
        }
    }

    /// The certificate and its key as TLS presents them (an error if they do not belong
    /// together).
    pub(crate) fn certified(&self) -> Result<CertifiedKey, Error> {
        Ok(CertifiedKey::from_der(self.chain.clone(), self.key.clone_key(), &provider())?)
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

    /// Saves what joining `addr` (or renewing its certificate) gave: the server's CA, the
    /// certificate and its key. They replace what was kept for `addr` in one step: a
    /// mount reading them meanwhile, or a crash, finds the old set or the new one.
    pub fn save_joined(dir: &StateDir, addr: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<(), Error> {
        let _lock = dir.lock()?;
        let key = addr_key(addr);
        // (`addr_key` never starts with a dot: no address's directory is this one.)
        let next = format!("joined/.next-{key}");
        dir.remove_tree(&next)?;
        dir.write(&format!("{next}/key.pem"), key_pem.as_bytes())?;
        dir.write(&format!("{next}/ca.pem"), ca_pem.as_bytes())?;
        dir.write(&format!("{next}/cert.pem"), cert_pem.as_bytes())?;
        dir.write(&format!("{next}/server"), addr.as_bytes())?;
        dir.replace_dir(&next, &format!("joined/{key}"))
    }

    /// The servers this host joined, as `crest join` was given them (`HOST:PORT`).
    pub fn joined_servers(dir: &StateDir) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for key in dir.list("joined")?.into_iter().filter(|k| !k.starts_with('.')) {
            if let Some(addr) = dir.read(&format!("joined/{key}/server"))? {
                out.push(String::from_utf8_lossy(&addr).trim().to_string());
            }
        }
        Ok(out)
    }
}

/// What a mount of `addr` uses, as `Credentials::for_server` finds it: for a server this
/// host joined, a configuration that presents the certificate kept for it *now*, read
/// again whenever a renewal replaced it (`renewal::renew_joined`), so that a mount that
/// runs for years reconnects with a certificate that is still valid; else the host's own.
pub fn mount_config(dir: &StateDir, addr: &str) -> Result<Arc<ClientConfig>, Error> {
    let sub = format!("joined/{}", addr_key(addr));
    // (Looked at before reading: a renewal in between is read again at the first resolve.)
    let seen = dir.mtime(&format!("{sub}/cert.pem"));
    let joined = if dir.usable()? { Credentials::joined(dir, addr)? } else { None };
    let Some(creds) = joined else { return client_config(&Credentials::for_server(dir, addr)?) };
    let held = Mutex::new((seen, Arc::new(creds.certified()?)));
    let resolver = Arc::new(Reloading { dir: dir.clone(), addr: addr.to_string(), sub, held });
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(&creds.ca)?)
        .with_client_cert_resolver(resolver);
    // (A resumed session would be the old certificate again: see `client_config`.)
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// A file's modification time and inode (`StateDir::mtime`), to see that it changed.
type Stamp = Option<(i64, i64, u64)>;

/// The certificate kept for a joined server, read again when its file changes.
#[derive(Debug)]
struct Reloading {
    dir: StateDir,
    addr: String,
    /// `joined/ADDR`.
    sub: String,
    /// The certificate file as last read (`StateDir::mtime`), and what it held.
    held: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl ResolvesClientCert for Reloading {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.dir.mtime(&format!("{}/cert.pem", self.sub));
        if seen != held.0 {
            match Credentials::joined(&self.dir, &self.addr).and_then(|c| c.map(|c| c.certified()).transpose()) {
                Ok(Some(key)) => {
                    let fp = key.end_entity_cert().map(|c| Fingerprint::of(c).hex()).unwrap_or_default();
                    tracing::info!(
                        "{}: using the client certificate kept now ({})",
                        self.addr,
                        &fp[..fp.len().min(16)]
                    );
                    *held = (seen, Arc::new(key));
                }
                // (The last one read goes on: it stays valid until it expires.)
                Ok(None) => tracing::warn!("{}: the client certificate is gone; using the last one read", self.addr),
                Err(e) => {
                    tracing::warn!("{}: cannot read the client certificate again ({e}); using the last one", self.addr)
                }
            }
        }
        Some(held.1.clone())
    }

    fn has_certs(&self) -> bool {
        true
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
///
/// Sessions are not resumed: a resumed TLS 1.3 session keeps the identity of the
/// handshake that began it, so a mount reconnecting after its certificate was renewed
/// would still be its old certificate, and refused once that expires. A mount connects
/// seldom; a full handshake costs a millisecond.
pub fn client_config(c: &Credentials) -> Result<Arc<ClientConfig>, Error> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(&c.ca)?)
        .with_client_auth_cert(c.chain.clone(), c.key.clone_key())?;
    config.resumption = Resumption::disabled();
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
