//! The host's certificate authority, as the server and the admin commands use it: makes
//! the host's credentials on first use, issues client certificates for redeemed tokens and
//! renews them for their holders, and answers whether a presented certificate may come in
//! (the register, re-read when its file changes, so that `crest cert revoke` reaches a
//! running server).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use time::OffsetDateTime;

use crate::config::{cert_from_pem, key_from_pem, server_config};
use crate::register::{renewal_via, REGISTER};
use crate::renewal::{utc, BACKDATED};
use crate::{
    hex, os_random, unix_now, ClientRecord, Error, Fingerprint, Lifetime, Register, StateDir, Token, TokenRecord,
};

const DAY: u64 = 86_400;
/// The CA and the host's own certificates.
const HOST_VALIDITY: u64 = 20 * 365 * DAY;
/// Certificates issued to joining clients, and to them again when they renew
/// (`renewal.rs`: once a third of it is left).
pub const CLIENT_VALIDITY: u64 = 365 * DAY;
/// The shortest life `Authority::set_client_validity` gives client certificates (tests
/// watch renewals happen with lives of a minute or two).
pub const MIN_CLIENT_VALIDITY: u64 = 30;

/// The host's server side of its credentials.
pub struct HostCredentials {
    /// The CA's certificate.
    pub ca: CertificateDer<'static>,
    /// The server's chain: its certificate, then the CA's.
    pub chain: Vec<CertificateDer<'static>>,
    /// The server's key.
    pub key: PrivateKeyDer<'static>,
}

/// A certificate issued to a joining client.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The client's certificate (DER).
    pub cert: Vec<u8>,
    /// The CA's certificate (DER), for the client to pin.
    pub ca: Vec<u8>,
    /// The name in the certificate.
    pub name: String,
}

/// The name of the host's own client certificate (and how the register says it was
/// issued); no joining client gets it.
pub const LOCAL_NAME: &str = "local";

/// A client the register admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The name in its certificate.
    pub name: String,
    /// It holds the host's own certificate (root on the server's host).
    pub local: bool,
}

/// Why a join was refused (the message goes to the joining client).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JoinError(pub String);

struct Cached {
    register: Register,
    seen: Option<(i64, i64, u64)>,
}

/// The host's certificate authority.
pub struct Authority {
    dir: StateDir,
    ca_pem: String,
    host: Arc<HostCredentials>,
    register: Mutex<Cached>,
    /// The life of the client certificates it issues.
    client_validity: u64,
}

fn time_at(unix: u64) -> Result<OffsetDateTime, Error> {
    OffsetDateTime::from_unix_timestamp(unix as i64).map_err(|e| Error::Cert(e.to_string()))
}

/// Parameters shared by every certificate: a random serial, valid from an hour ago
/// (`BACKDATED`, for clocks a little behind) for `validity` seconds from now.
fn params(cn: &str, validity: u64) -> Result<CertificateParams, Error> {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "crest");
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    let mut serial = os_random::<16>()?;
    serial[0] &= 0x7f;
    p.serial_number = Some(SerialNumber::from_slice(&serial));
    let now = unix_now();
    p.not_before = time_at(now.saturating_sub(BACKDATED))?;
    p.not_after = time_at(now + validity)?;
    p.use_authority_key_identifier_extension = true;
    Ok(p)
}

fn leaf(cn: &str, validity: u64, usage: ExtendedKeyUsagePurpose) -> Result<CertificateParams, Error> {
    let mut p = params(cn, validity)?;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![usage];
    Ok(p)
}

/// Characters a certificate name may hold: printable, safe in a log line, a file name and
/// a JSON key.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-@:".contains(c)
}

/// Longest name a certificate gets.
const MAX_NAME: usize = 64;

/// A name an administrator chose for a token, checked rather than changed: it is what
/// export policies are keyed by, so a name that is not the one typed would be a policy
/// that silently names nobody.
fn check_name(name: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Cert(format!("{name:?} cannot name a client: {why}")));
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("a name has 1 to 64 characters");
    }
    if !name.chars().all(name_char) {
        return bad("letters, digits and . _ - @ : only");
    }
    if name == LOCAL_NAME {
        return bad("it is the host's own certificate");
    }
    Ok(())
}

/// The name a token without one issues: what the client asked for, as a hint for whoever
/// reads `crest cert list`, then 8 random hex digits. The server decides identities: a
/// token holder must not choose the name policies, `admin` and per-identity limits are
/// keyed by, and no name is issued twice (`fresh_name`).
fn joined_name(asked: &str) -> Result<String, Error> {
    let hint: String = asked.chars().filter(|c| name_char(*c)).take(MAX_NAME - 9).collect();
    let hint = if hint.is_empty() { "client".to_string() } else { hint };
    Ok(format!("{hint}-{}", hex(&os_random::<4>()?)))
}

/// Whether `name` was ever issued (revoked and expired certificates included) or is
/// promised by a pending token other than `except`.
fn name_taken(dir: &StateDir, reg: &Register, name: &str, except: Option<&str>) -> Result<bool, Error> {
    if reg.clients.iter().any(|r| r.name == name) {
        return Ok(true);
    }
    for file in dir.list("tokens")? {
        if Some(file.trim_end_matches(".json")) == except {
            continue;
        }
        let Some(bytes) = dir.read(&format!("tokens/{file}"))? else { continue };
        if serde_json::from_slice::<TokenRecord>(&bytes).is_ok_and(|t| t.name.as_deref() == Some(name)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Equal without an early exit, so timing does not tell how much of a secret matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authority {
    /// Opens the host's CA in `dir`, making the CA, the server's certificate and the
    /// host's own client certificate the first time.
    pub fn open(dir: &StateDir) -> Result<Authority, Error> {
        let _lock = dir.lock()?;
        if dir.read("ca.key")?.is_none() {
            create_host(dir)?;
        }
        let ca_pem = dir.read_text("ca.pem")?;
        let host = HostCredentials {
            ca: cert_from_pem(&ca_pem, "ca.pem")?,
            chain: vec![cert_from_pem(&dir.read_text("server.pem")?, "server.pem")?, cert_from_pem(&ca_pem, "ca.pem")?],
            key: key_from_pem(&dir.read_text("server.key")?, "server.key")?,
        };
        let register = Register::load(dir)?;
        let seen = dir.mtime(REGISTER);
        Ok(Authority {
            dir: dir.clone(),
            ca_pem,
            host: Arc::new(host),
            register: Mutex::new(Cached { register, seen }),
            client_validity: CLIENT_VALIDITY,
        })
    }

    /// Issues client certificates (joining and renewing) that live `secs` seconds rather
    /// than a year: for tests of renewal, from `MIN_CLIENT_VALIDITY` to `CLIENT_VALIDITY`.
    pub fn set_client_validity(&mut self, secs: u64) -> Result<(), Error> {
        if !(MIN_CLIENT_VALIDITY..=CLIENT_VALIDITY).contains(&secs) {
            return Err(Error::Cert(format!(
                "a client certificate's life of {secs} s: from {MIN_CLIENT_VALIDITY} s to {CLIENT_VALIDITY} s (a year)"
            )));
        }
        self.client_validity = secs;
        Ok(())
    }

    /// The server's TLS configuration.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, Error> {
        server_config(&self.host.ca, self.host.chain.clone(), self.host.key.clone_key())
    }

    /// The CA's fingerprint (what tokens name).
    pub fn ca_fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.host.ca)
    }

    /// Where the credentials live.
    pub fn dir(&self) -> &StateDir {
        &self.dir
    }

    fn cached(&self) -> MutexGuard<'_, Cached> {
        self.register.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-reads the register if its file changed; true if it did.
    pub fn refresh(&self) -> Result<bool, Error> {
        let seen = self.dir.mtime(REGISTER);
        let mut c = self.cached();
        if seen == c.seen {
            return Ok(false);
        }
        c.register = Register::load(&self.dir)?;
        c.seen = seen;
        Ok(true)
    }

    /// Who the client whose certificate has fingerprint `fp` is, if it may come in: its
    /// name, and whether it is the host's own certificate.
    pub fn admit(&self, fp: &Fingerprint) -> Result<Admitted, String> {
        // (A certificate just issued is in the file before the next periodic re-read.)
        if let Err(e) = self.refresh() {
            tracing::warn!("cannot re-read the client register, keeping the last one: {e}");
        }
        let reg = &self.cached().register;
        reg.admits(fp, unix_now()).map(|r| Admitted { name: r.name.clone(), local: r.via == LOCAL_NAME })
    }

    /// Fingerprints of revoked certificates.
    pub fn revoked(&self) -> HashSet<Fingerprint> {
        self.cached().register.revoked().collect()
    }

    /// The register as it is on disk now.
    pub fn clients(&self) -> Result<Register, Error> {
        Register::load(&self.dir)
    }

    /// Revokes by name or fingerprint prefix (see `Register::revoke`).
    pub fn revoke(&self, who: &str) -> Result<Vec<ClientRecord>, Error> {
        let _lock = self.dir.lock()?;
        let mut reg = Register::load(&self.dir)?;
        let out = reg.revoke(who, unix_now());
        if !out.is_empty() {
            reg.save(&self.dir)?;
        }
        Ok(out)
    }

    /// A new join token valid for `ttl` seconds. The certificate it brings is named
    /// `name` if given — a name never issued before nor promised by another pending token
    /// — else a fresh name the server makes (`joined_name`).
    pub fn create_token(&self, ttl: u64, name: Option<&str>) -> Result<Token, Error> {
        if let Some(name) = name {
            check_name(name)?;
        }
        let token = Token { id: os_random()?, secret: os_random()?, ca: self.ca_fingerprint() };
        let now = unix_now();
        let record = TokenRecord {
            id: token.id_hex(),
            secret_sha256: token.secret_hash(),
            created: now,
            expires: now + ttl,
            name: name.map(str::to_string),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| Error::Cert(e.to_string()))?;
        let _lock = self.dir.lock()?;
        if let Some(name) = name {
            if name_taken(&self.dir, &Register::load(&self.dir)?, name, None)? {
                return Err(Error::Cert(format!(
                    "{name:?} was already issued (or a pending token names it): a name belongs to one key; \
                     choose another, and see `crest cert list`"
                )));
            }
        }
        self.dir.write(&format!("tokens/{}.json", record.id), &json)?;
        Ok(token)
    }

    /// Tokens not yet redeemed; expired ones are removed.
    pub fn tokens(&self) -> Result<Vec<TokenRecord>, Error> {
        let _lock = self.dir.lock()?;
        let now = unix_now();
        let mut out = Vec::new();
        for file in self.dir.list("tokens")? {
            let rel = format!("tokens/{file}");
            let Some(bytes) = self.dir.read(&rel)? else { continue };
            match serde_json::from_slice::<TokenRecord>(&bytes) {
                Ok(r) if r.expires > now => out.push(r),
                _ => {
                    self.dir.remove(&rel)?;
                }
            }
        }
        Ok(out)
    }

    /// Redeems `token` (once): signs a client certificate for the key in `csr` (a PKCS#10
    /// request, DER) and registers it. Nothing of the request but its key is used, and of
    /// `requested_name` only a hint in the name the server makes.
    pub fn redeem(&self, token: &str, requested_name: &str, csr: &[u8]) -> Result<Issued, JoinError> {
        let token = Token::parse(token).map_err(JoinError)?;
        if token.ca != self.ca_fingerprint() {
            return Err(JoinError("the token is for another server".into()));
        }
        let csr = CertificateSigningRequestParams::from_der(&csr.to_vec().into())
            .map_err(|e| JoinError(format!("bad certificate request: {e}")))?;
        let internal = |e: Error| JoinError(format!("the server could not issue a certificate: {e}"));
        let _lock = self.dir.lock().map_err(internal)?;
        let rel = format!("tokens/{}.json", token.id_hex());
        let unknown = || JoinError("unknown, used or expired token".into());
        let bytes = self.dir.read(&rel).map_err(internal)?.ok_or_else(unknown)?;
        let record: TokenRecord = serde_json::from_slice(&bytes).map_err(|_| unknown())?;
        if !same(record.secret_sha256.as_bytes(), token.secret_hash().as_bytes()) {
            return Err(unknown());
        }
        // Used or expired, it goes now.
        if !self.dir.remove(&rel).map_err(internal)? || record.expires <= unix_now() {
            return Err(unknown());
        }
        let reg = Register::load(&self.dir).map_err(internal)?;
        let name = match &record.name {
            Some(name) => {
                // (Checked when the token was made; a register edited since is checked again.)
                check_name(name).map_err(|e| JoinError(e.to_string()))?;
                if name_taken(&self.dir, &reg, name, Some(&record.id)).map_err(internal)? {
                    return Err(JoinError(format!("the name {name:?} this token names was issued meanwhile")));
                }
                name.clone()
            }
            None => loop {
                let name = joined_name(requested_name).map_err(internal)?;
                if !name_taken(&self.dir, &reg, &name, None).map_err(internal)? {
                    break name;
                }
            },
        };
        let issuer = self.issuer().map_err(internal)?;
        let p = leaf(&name, self.client_validity, ExtendedKeyUsagePurpose::ClientAuth).map_err(internal)?;
        let cert = p.signed_by(&csr.public_key, &issuer).map_err(|e| internal(e.into()))?;
        let via = format!("token {}", record.id);
        register(&self.dir, &name, cert.der(), &via).map_err(internal)?;
        Ok(Issued { cert: cert.der().to_vec(), ca: self.host.ca.to_vec(), name })
    }

    /// Renews the client certificate whose fingerprint is `presented` (the one the
    /// connection asking was authenticated with): signs a certificate for the key in `csr`
    /// under the name the presented one carries — nothing of the request but its key is
    /// used — and registers it, `via` "renewal of" the old one. Refused unless the old one
    /// is admitted now (issued here, not revoked, not expired), is not the host's own, and
    /// has at most a third of its life left: a client cannot mint itself certificates.
    ///
    /// The old certificate stays valid until it expires (a mount may hold it in memory); a
    /// certificate has at most one live successor: renewed again (its answer was lost on
    /// the way), the successor issued before is revoked. Revoking the name revokes both.
    pub fn renew(&self, presented: &Fingerprint, csr: &[u8]) -> Result<Issued, JoinError> {
        let csr = CertificateSigningRequestParams::from_der(&csr.to_vec().into())
            .map_err(|e| JoinError(format!("bad certificate request: {e}")))?;
        let internal = |e: Error| JoinError(format!("the server could not issue a certificate: {e}"));
        let _lock = self.dir.lock().map_err(internal)?;
        let mut reg = Register::load(&self.dir).map_err(internal)?;
        let now = unix_now();
        let old = reg.admits(presented, now).map_err(JoinError)?.clone();
        let short = &old.fingerprint[..16];
        if old.via == LOCAL_NAME {
            return Err(JoinError("the host's own certificate is not renewed over the network".into()));
        }
        let life = Lifetime { issued: old.issued, expires: old.expires };
        if !life.due(now) {
            return Err(JoinError(format!(
                "too early: the certificate of {} ({short}) may be renewed from {} (when a third of its life is left)",
                old.name,
                utc(life.renew_from())
            )));
        }
        let via = renewal_via(&old.fingerprint);
        for r in reg.retire(&via, now) {
            tracing::warn!("{} renewed {short} again: its successor {} is revoked", old.name, &r.fingerprint[..16]);
        }
        let issuer = self.issuer().map_err(internal)?;
        let p = leaf(&old.name, self.client_validity, ExtendedKeyUsagePurpose::ClientAuth).map_err(internal)?;
        let cert = p.signed_by(&csr.public_key, &issuer).map_err(|e| internal(e.into()))?;
        reg.clients.push(record(&old.name, cert.der(), &via).map_err(internal)?);
        reg.save(&self.dir).map_err(internal)?;
        Ok(Issued { cert: cert.der().to_vec(), ca: self.host.ca.to_vec(), name: old.name })
    }

    /// The client certificate that expires first among those that are live and not renewed
    /// (the host's own aside): the next one that stops a client unless it is renewed.
    pub fn soonest_expiry(&self) -> Option<ClientRecord> {
        self.cached().register.soonest_expiry(unix_now()).cloned()
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, Error> {
        let key = KeyPair::from_pem(&self.dir.read_text("ca.key")?)?;
        Ok(Issuer::from_ca_cert_pem(&self.ca_pem, key)?)
    }
}

/// Appends a record for `cert` to the register (hold the lock).
fn register(dir: &StateDir, name: &str, cert: &CertificateDer<'_>, via: &str) -> Result<(), Error> {
    let mut reg = Register::load(dir)?;
    reg.clients.push(record(name, cert, via)?);
    reg.save(dir)
}

/// The register's record of `cert`, with the lifetime the certificate itself states (what
/// the client, which sees only the certificate, judges its renewal by).
fn record(name: &str, cert: &CertificateDer<'_>, via: &str) -> Result<ClientRecord, Error> {
    let life = Lifetime::of_cert(cert)?;
    Ok(ClientRecord {
        name: name.into(),
        fingerprint: Fingerprint::of(cert).hex(),
        via: via.into(),
        issued: life.issued,
        expires: life.expires,
        revoked: None,
    })
}

/// Makes the host's CA, its server certificate and its own client certificate (hold the
/// lock). Keys are written before the certificates that name them, and `ca.key` last of
/// all: it is what says the host's credentials exist.
fn create_host(dir: &StateDir) -> Result<(), Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = params(&format!("crest CA {}", hex(&os_random::<6>()?)), HOST_VALIDITY)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate()?;
    let mut sp = leaf("crest server", HOST_VALIDITY, ExtendedKeyUsagePurpose::ServerAuth)?;
    sp.subject_alt_names = vec![rcgen::SanType::DnsName(crate::SERVER_NAME.try_into()?)];
    let server_cert = sp.signed_by(&server_key, &issuer)?;

    let local_key = KeyPair::generate()?;
    let local_cert =
        leaf(LOCAL_NAME, HOST_VALIDITY, ExtendedKeyUsagePurpose::ClientAuth)?.signed_by(&local_key, &issuer)?;

    dir.write("ca.pem", ca_cert.pem().as_bytes())?;
    dir.write("server.key", server_key.serialize_pem().as_bytes())?;
    dir.write("server.pem", server_cert.pem().as_bytes())?;
    dir.write("local.key", local_key.serialize_pem().as_bytes())?;
    dir.write("local.pem", local_cert.pem().as_bytes())?;
    register(dir, LOCAL_NAME, local_cert.der(), LOCAL_NAME)?;
    dir.write("ca.key", issuer.key().serialize_pem().as_bytes())
}

#[cfg(test)]
mod tests;
