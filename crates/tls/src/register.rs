//! The register of client certificates the host's CA issued (`clients.json`): the server
//! admits a client only if its certificate is here and not revoked, so issuing and
//! revoking are edits of one small file that the running server notices.

use serde::{Deserialize, Serialize};

use crate::{Error, Fingerprint, StateDir};

/// The register's file in the state directory.
pub const REGISTER: &str = "clients.json";

/// A register larger than this is not read (it holds one short line per client).
const MAX_REGISTER_BYTES: usize = 64 << 20;

/// One issued client certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRecord {
    /// The name in the certificate (a host name, or "local" for the host itself).
    pub name: String,
    /// SHA-256 of the certificate, hex.
    pub fingerprint: String,
    /// How it was issued: "local", "token ID" or "renewal of FINGERPRINT-PREFIX" (the
    /// certificate it replaced, `renewal_via`).
    pub via: String,
    /// Seconds since the epoch.
    pub issued: u64,
    /// Seconds since the epoch.
    pub expires: u64,
    /// When it was revoked, if it was.
    pub revoked: Option<u64>,
}

/// Every client certificate the CA issued.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// In order of issue.
    pub clients: Vec<ClientRecord>,
}

impl Register {
    /// Reads the register (empty if there is none yet).
    pub fn load(dir: &StateDir) -> Result<Register, Error> {
        let Some(bytes) = dir.read(REGISTER)? else { return Ok(Register::default()) };
        let bad = |detail: String| Error::State { path: dir.path().join(REGISTER), detail };
        if bytes.len() > MAX_REGISTER_BYTES {
            return Err(bad(format!("{} bytes, more than a register can hold", bytes.len())));
        }
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("unreadable: {e}")))
    }

    /// Writes the register whole (hold the state directory's lock around load and save).
    pub fn save(&self, dir: &StateDir) -> Result<(), Error> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Cert(e.to_string()))?;
        dir.write(REGISTER, &json)
    }

    /// The record of the certificate with fingerprint `fp` if the server may admit it
    /// at `now`, else why not.
    pub fn admits(&self, fp: &Fingerprint, now: u64) -> Result<&ClientRecord, String> {
        let hex = fp.hex();
        let Some(r) = self.clients.iter().find(|r| r.fingerprint == hex) else {
            return Err(format!("certificate {} was not issued by this server", &hex[..16]));
        };
        if let Some(when) = r.revoked {
            return Err(format!("certificate of {} ({}) was revoked at {when}", r.name, &hex[..16]));
        }
        if r.expires <= now {
            return Err(format!("certificate of {} ({}) expired; join again", r.name, &hex[..16]));
        }
        Ok(r)
    }

    /// Revokes every live certificate whose name is `who` or whose fingerprint starts
    /// with `who` (at least 8 hex digits); returns those revoked.
    pub fn revoke(&mut self, who: &str, now: u64) -> Vec<ClientRecord> {
        let by_fp = who.len() >= 8 && who.bytes().all(|b| b.is_ascii_hexdigit());
        let who_lower = who.to_ascii_lowercase();
        let mut out = Vec::new();
        for r in &mut self.clients {
            let hit = r.name == who || (by_fp && r.fingerprint.starts_with(&who_lower));
            if hit && r.revoked.is_none() {
                r.revoked = Some(now);
                out.push(r.clone());
            }
        }
        out
    }

    /// Whether the certificate of `r` was renewed: a record says it replaced it.
    pub fn renewed(&self, r: &ClientRecord) -> bool {
        let via = renewal_via(&r.fingerprint);
        self.clients.iter().any(|c| c.via == via)
    }

    /// Revokes the live certificates issued `via` (the successors of a certificate renewed
    /// again); returns those revoked.
    pub fn retire(&mut self, via: &str, now: u64) -> Vec<ClientRecord> {
        let mut out = Vec::new();
        for r in self.clients.iter_mut().filter(|r| r.via == via && r.revoked.is_none()) {
            r.revoked = Some(now);
            out.push(r.clone());
        }
        out
    }

    /// Of the certificates admitted at `now` and not renewed, the host's own aside, the one
    /// that expires first.
    pub fn soonest_expiry(&self, now: u64) -> Option<&ClientRecord> {
        let live = self.clients.iter().filter(|r| r.revoked.is_none() && r.expires > now && r.via != "local");
        live.filter(|r| !self.renewed(r)).min_by_key(|r| r.expires)
    }

    /// Fingerprints of the revoked certificates.
    pub fn revoked(&self) -> impl Iterator<Item = Fingerprint> + '_ {
        self.clients.iter().filter(|r| r.revoked.is_some()).filter_map(|r| Fingerprint::from_hex(&r.fingerprint))
    }
}

/// How the register says a certificate was issued in place of the one whose fingerprint
/// (hex) is `old`: "renewal of" its first 16 hex digits, as `crest cert list` shows it.
pub fn renewal_via(old: &str) -> String {
    format!("renewal of {}", &old[..old.len().min(16)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, fp: Fingerprint, expires: u64) -> ClientRecord {
        ClientRecord { name: name.into(), fingerprint: fp.hex(), via: "test".into(), issued: 1, expires, revoked: None }
    }

    #[test]
    fn admits_only_live_issued_certificates() {
        let (a, b, c) = (Fingerprint([1; 32]), Fingerprint([2; 32]), Fingerprint([3; 32]));
        let mut reg = Register { clients: vec![record("alpha", a, 100), record("beta", b, 50)] };
        assert!(reg.admits(&a, 10).is_ok());
        assert!(reg.admits(&c, 10).is_err_and(|e| e.contains("not issued")));
        assert!(reg.admits(&b, 50).is_err_and(|e| e.contains("expired")));
        assert_eq!(reg.revoke("alpha", 20).len(), 1);
        assert!(reg.admits(&a, 21).is_err_and(|e| e.contains("revoked")));
        assert_eq!(reg.revoke("alpha", 30).len(), 0, "revoking twice changes nothing");
        assert_eq!(reg.revoke(&b.hex()[..8], 30).len(), 1);
        assert_eq!(reg.revoke("0202", 30).len(), 0, "a short prefix names nothing");
        assert_eq!(reg.revoked().count(), 2);
    }

    #[test]
    fn a_renewed_certificate_is_known_by_its_successor() {
        let (a, b, c, d) = (Fingerprint([1; 32]), Fingerprint([2; 32]), Fingerprint([3; 32]), Fingerprint([4; 32]));
        let mut reg = Register { clients: vec![record("alpha", a, 100), record("beta", b, 50)] };
        assert_eq!(reg.soonest_expiry(10).map(|r| r.name.as_str()), Some("beta"));
        let mut next = record("beta", c, 150);
        next.via = renewal_via(&b.hex());
        assert_eq!(next.via, "renewal of 0202020202020202");
        reg.clients.push(next);
        assert!(reg.renewed(&reg.clients[1]) && !reg.renewed(&reg.clients[0]));
        assert_eq!(reg.soonest_expiry(10).map(|r| r.name.as_str()), Some("alpha"), "a renewed one is not waited for");
        assert_eq!(reg.soonest_expiry(120).map(|r| r.fingerprint.clone()), Some(c.hex()), "nor an expired one");
        // Revoking the name reaches the renewed certificate and its predecessor alike.
        assert_eq!(reg.revoke("beta", 20).len(), 2);
        let mut again = record("beta", d, 150);
        again.via = renewal_via(&b.hex());
        reg.clients.push(again);
        assert_eq!(reg.retire(&renewal_via(&b.hex()), 30).len(), 1, "only the live successor is retired");
        assert_eq!(reg.soonest_expiry(10).map(|r| r.name.as_str()), Some("alpha"));
        let mut own = record("local", Fingerprint([5; 32]), 20);
        own.via = "local".into();
        reg.clients.push(own);
        assert_eq!(reg.soonest_expiry(10).map(|r| r.name.as_str()), Some("alpha"), "the host's own is not counted");
    }
}
