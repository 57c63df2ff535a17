//! Join tokens: short-lived, single-use secrets that let another machine get a client
//! certificate. A token names the server's CA by fingerprint, so the joining client
//! authenticates the server before it shows the secret (as kubeadm's discovery hash does).
//! The server keeps only a hash of the secret.

use serde::{Deserialize, Serialize};

use crate::{hex, unhex, Fingerprint};

/// What a token says (`crest1-ID-SECRET-CAFINGERPRINT`, all hex).
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// Names the token's record on the server (8 bytes).
    pub id: [u8; 8],
    /// The secret (16 bytes).
    pub secret: [u8; 16],
    /// The server's CA.
    pub ca: Fingerprint,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}, secret hidden, CA {})", hex(&self.id), &self.ca.hex()[..16])
    }
}

const PREFIX: &str = "crest1";

impl Token {
    /// The token as a user copies it.
    pub fn encode(&self) -> String {
        format!("{PREFIX}-{}-{}-{}", hex(&self.id), hex(&self.secret), self.ca.hex())
    }

    /// Parses a token a user typed (surrounding space ignored).
    pub fn parse(s: &str) -> Result<Token, String> {
        let bad = || "not a crest join token (crest1-ID-SECRET-CA, from `crest token create`)".to_string();
        let parts: Vec<&str> = s.trim().split('-').collect();
        let [PREFIX, id, secret, ca] = parts.as_slice() else { return Err(bad()) };
        let id = unhex(id).and_then(|v| <[u8; 8]>::try_from(v).ok()).ok_or_else(bad)?;
        let secret = unhex(secret).and_then(|v| <[u8; 16]>::try_from(v).ok()).ok_or_else(bad)?;
        let ca = Fingerprint::from_hex(ca).ok_or_else(bad)?;
        Ok(Token { id, secret, ca })
    }

    /// The id as the record's file name.
    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }

    /// The hash the server keeps.
    pub fn secret_hash(&self) -> String {
        Fingerprint::of(&self.secret).hex()
    }
}

/// What the server keeps of a token (`tokens/ID.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Hex id.
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub secret_sha256: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// Seconds since the epoch; not redeemable from then on.
    pub expires: u64,
    /// The name the certificate gets, if the administrator chose it.
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_ones_are_refused() {
        let t = Token { id: [7; 8], secret: [9; 16], ca: Fingerprint([0xab; 32]) };
        let s = t.encode();
        assert_eq!(Token::parse(&format!("  {s}\n")), Ok(t.clone()));
        assert!(!format!("{t:?}").contains("0909"), "Debug must not show the secret");
        for bad in ["", "crest1", "crest2-0707070707070707-09-ab", &s[..s.len() - 1], &s.replace("crest1", "crest2")] {
            assert!(Token::parse(bad).is_err(), "{bad:?}");
        }
        let mut extra = s.clone();
        extra.push_str("-00");
        assert!(Token::parse(&extra).is_err());
    }
}
