//! Client certificates' lifetimes, and their renewal. A certificate issued to a joining
//! host lives a year (`authority::CLIENT_VALIDITY`); the host asks its server for the next
//! one once a third of that life is left (`Lifetime::due`), over a connection the current
//! certificate authenticates (`renew_joined`; the server's side is
//! `Authority::renew`). A third of a year is four months in which a server that is away or
//! a network that is down can still be waited for, before the certificate expires and the
//! host must join again; and the server refuses a renewal earlier than that, so a client
//! cannot mint itself certificates.

use std::sync::Arc;

use rustls::ClientConfig;

use crate::config::client_config;
use crate::{cert_pem, certificate_request, unix_now, Credentials, Error, Fingerprint, Issued, StateDir};

/// How long before it is made a certificate is already valid (for clients whose clocks
/// are a little behind the server's). Its life, for renewal, counts from when it was made.
pub const BACKDATED: u64 = 3600;

/// Below this much life left, a mount that uses the certificate warns in its log (once a
/// day): a renewal that keeps failing needs someone to look.
pub const WARN_LEFT: u64 = 30 * 86_400;

/// When a certificate was made and when it expires (seconds since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// When it was made (its `notBefore` is `BACKDATED` earlier).
    pub issued: u64,
    /// Its `notAfter`.
    pub expires: u64,
}

impl Lifetime {
    /// The lifetime a certificate (DER) states.
    pub fn of_cert(der: &[u8]) -> Result<Lifetime, Error> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| Error::Cert(format!("unreadable certificate: {e}")))?;
        let at = |t: &x509_parser::time::ASN1Time| u64::try_from(t.timestamp()).unwrap_or(0);
        let v = cert.validity();
        Ok(Lifetime { issued: at(&v.not_before).saturating_add(BACKDATED), expires: at(&v.not_after) })
    }

    /// Its whole life, in seconds.
    pub fn life(&self) -> u64 {
        self.expires.saturating_sub(self.issued)
    }

    /// Seconds left at `now` (0 once expired).
    pub fn left(&self, now: u64) -> u64 {
        self.expires.saturating_sub(now)
    }

    /// From when it may be renewed: once a third of its life is left.
    pub fn renew_from(&self) -> u64 {
        self.expires - self.life() / 3
    }

    /// Whether it may be renewed at `now` (also once expired: the server then refuses it
    /// for that).
    pub fn due(&self, now: u64) -> bool {
        now >= self.renew_from()
    }
}

/// The name a certificate (DER) carries: its subject's common name.
pub fn cert_name(der: &[u8]) -> Result<String, Error> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| Error::Cert(format!("unreadable certificate: {e}")))?;
    let cn = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok());
    cn.map(str::to_string).ok_or_else(|| Error::Cert("a certificate without a name".into()))
}

/// `unix` as a UTC date and time, `2027-03-01 14:05:09 UTC`.
pub fn utc(unix: u64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(i64::try_from(unix).unwrap_or(i64::MAX)) {
        Ok(t) => format!("{} {:02}:{:02}:{:02} UTC", t.date(), t.hour(), t.minute(), t.second()),
        Err(_) => format!("{unix} s after the epoch"),
    }
}

/// The certificate this host keeps for a server it joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The server, `HOST:PORT`.
    pub addr: String,
    /// The name in the certificate (the server chose it).
    pub name: String,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// Its life.
    pub lifetime: Lifetime,
}

impl Held {
    fn of(addr: &str, creds: &Credentials) -> Result<Held, Error> {
        let cert = creds.chain.first().ok_or_else(|| Error::Cert(format!("{}: no certificate", creds.origin)))?;
        Ok(Held {
            addr: addr.to_string(),
            name: cert_name(cert)?,
            fingerprint: Fingerprint::of(cert),
            lifetime: Lifetime::of_cert(cert)?,
        })
    }

    /// The certificate kept for `addr`, if this host joined it.
    pub fn joined(dir: &StateDir, addr: &str) -> Result<Option<Held>, Error> {
        Credentials::joined(dir, addr)?.map(|c| Held::of(addr, &c)).transpose()
    }
}

/// What `renew_joined` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing: the certificate kept has more than a third of its life left.
    NotDue(Held),
    /// The server issued the next certificate, which replaced `old`.
    Renewed {
        /// The certificate before.
        old: Held,
        /// The one kept now.
        new: Held,
    },
}

/// Renews the certificate kept for `addr` (a server this host joined) if a third of its
/// life or less is left, or whatever is left if `force` (the server judges). `exchange`
/// sends the renewal on a connection made with the configuration it is given (the current
/// certificate's) and returns the server's answer, or why there is none. The new key is made here and never leaves the state directory; the new
/// certificate and key replace the old ones in one step (`Credentials::save_joined`).
///
/// One renewal runs at a time on a host (`StateDir::renewal_lock`), and each looks at
/// what is kept once it holds the lock: of two processes that found the certificate due
/// at once, the second finds it renewed. The server keeps one live successor per
/// certificate, so two renewals of one certificate would leave the first one's revoked.
pub fn renew_joined(
    dir: &StateDir,
    addr: &str,
    force: bool,
    exchange: impl FnOnce(Arc<ClientConfig>, Vec<u8>) -> Result<Issued, String>,
) -> Result<Renewal, Error> {
    let _one = dir.renewal_lock()?;
    let creds = Credentials::joined(dir, addr)?.ok_or_else(|| Error::State {
        path: dir.path().to_path_buf(),
        detail: format!("this host did not join {addr}: there is no certificate to renew"),
    })?;
    let old = Held::of(addr, &creds)?;
    if !force && !old.lifetime.due(unix_now()) {
        return Ok(Renewal::NotDue(old));
    }
    let (key_pem, csr) = certificate_request(&old.name)?;
    let Issued { cert, ca, .. } = exchange(client_config(&creds)?, csr).map_err(Error::Renewal)?;
    if Fingerprint::of(&ca) != Fingerprint::of(&creds.ca) {
        return Err(Error::Renewal(format!("{addr} answered with a CA other than the one this host pinned")));
    }
    let next = Credentials {
        ca: creds.ca.clone(),
        chain: vec![cert.into()],
        key: crate::config::key_from_pem(&key_pem, "the new key")?,
        origin: "the renewed certificate".into(),
    };
    next.certified().map_err(|e| Error::Renewal(format!("{addr} answered with a certificate for another key: {e}")))?;
    let new = Held::of(addr, &next)?;
    Credentials::save_joined(dir, addr, &cert_pem(&creds.ca), &cert_pem(&next.chain[0]), &key_pem)?;
    Ok(Renewal::Renewed { old, new })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    #[test]
    fn renewal_opens_when_a_third_of_the_life_is_left() {
        let year = Lifetime { issued: 1_000, expires: 1_000 + 365 * DAY };
        assert_eq!(year.life(), 365 * DAY);
        let from = year.renew_from();
        assert_eq!(year.expires - from, 365 * DAY / 3, "a third of a year: about 122 days");
        assert!(!year.due(year.issued));
        assert!(!year.due(from - 1));
        assert!(year.due(from));
        assert!(year.due(year.expires + 1), "an expired one is due (the server refuses it)");
        assert_eq!(year.left(year.expires + 5), 0);
        assert_eq!(year.left(from), 365 * DAY / 3);
        // Short lives (tests) follow the same rule.
        let short = Lifetime { issued: 100, expires: 190 };
        assert_eq!((short.renew_from(), short.due(159), short.due(160)), (160, false, true));
        // Dates that make no sense: due at the expiry, no underflow.
        let odd = Lifetime { issued: 500, expires: 400 };
        assert_eq!((odd.life(), odd.renew_from(), odd.due(0)), (0, 400, false));
        assert!(odd.due(400));
    }

    #[test]
    fn times_read_as_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_798_761_600 + 14 * 3600 + 5 * 60 + 9), "2027-01-01 14:05:09 UTC");
    }
}
