//! crest's credentials and the TLS 1.3 configurations both ends use (client → proto →
//! **tls** ← serve): every connection is mutual TLS unless both ends say `--insecure`.
//!
//! Trust is per host. The first `crest serve` (or `crest token create`) on a host makes the
//! host's certificate authority in the state directory (`state`), a server certificate it
//! signs, and a client certificate for the host itself (`local`), which is how root on the
//! server's host mounts with no flag. Another machine joins with a single-use token
//! (`token`): the token names the CA by its SHA-256 fingerprint, so the joining client
//! authenticates the server before it sends anything, and the server signs a certificate
//! for a key the client made and keeps (`authority::Authority::redeem`). The server admits
//! a client only when its certificate chains to the host CA *and* is in the register of
//! certificates it issued and did not revoke (`register`). A joined host renews its
//! certificate before it expires, over a connection the certificate authenticates, for
//! the same name (`renewal`).
//!
//! Invariants:
//! - private keys and tokens live only in the state directory, which is owned by the
//!   user and closed to everyone else (0700; files 0600, written whole and renamed into
//!   place), and are refused when it is not;
//! - keys, serial numbers and token secrets come from the OS generator (`getrandom`);
//! - a token is redeemed at most once and never after it expires;
//! - the server's name is not checked (clients reach servers by any address): the server
//!   is authenticated by the CA it chains to, which the client pins.

mod authority;
mod config;
mod register;
mod renewal;
mod state;
mod token;

pub use authority::{
    Admitted, Authority, HostCredentials, Issued, JoinError, CLIENT_VALIDITY, LOCAL_NAME, MIN_CLIENT_VALIDITY,
};
pub use config::{client_config, join_config, mount_config, peer_fingerprint, server_config, Credentials, SERVER_NAME};
pub use register::{ClientRecord, Register};
pub use renewal::{cert_name, renew_joined, utc, Held, Lifetime, Renewal, BACKDATED, WARN_LEFT};
/// What `client_config` and `join_config` make (rustls's).
pub use rustls::ClientConfig;
pub use state::{addr_key, StateDir};
pub use token::{Token, TokenRecord};

/// A SHA-256 fingerprint of a certificate's DER encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `der`.
    pub fn of(der: &[u8]) -> Fingerprint {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        Fingerprint(out)
    }

    /// Lower-case hex, 64 characters.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Option<Fingerprint> {
        let bytes = unhex(s)?;
        Some(Fingerprint(bytes.try_into().ok()?))
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.hex())
    }
}

/// Why a credential operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state directory or one of its files could not be used.
    #[error("{path}: {detail}")]
    State {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What went wrong, and what to do.
        detail: String,
    },
    /// A certificate or key could not be made or read.
    #[error("certificate: {0}")]
    Cert(String),
    /// The TLS library refused a configuration.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// A renewal did not go through: the server refused it or could not be asked.
    #[error("renewal: {0}")]
    Renewal(String),
}

impl From<rcgen::Error> for Error {
    fn from(e: rcgen::Error) -> Error {
        Error::Cert(e.to_string())
    }
}

/// `n` bytes from the OS generator.
pub fn os_random<const N: usize>() -> Result<[u8; N], Error> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| Error::Cert(format!("the OS random generator failed: {e}")))?;
    Ok(out)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// Seconds since the epoch, by the local clock.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A new key for a joining client (from the OS generator) and a certificate request
/// for it (PKCS#10, DER): the key stays with the client, the request goes to the server.
pub fn certificate_request(name: &str) -> Result<(String, Vec<u8>), Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, name);
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

/// PEM text of a DER certificate.
pub fn cert_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new("CERTIFICATE", der))
}
