//! Export policies: the `Policy` a client identity gets, from the state directory's
//! `exports.json` (docs/security.md), read at each session's hello so that an edit
//! reaches the next session without a restart, and again for connected sessions on a
//! reload (`reload.rs`).

use std::collections::HashMap;

use crest_server::authz::Policy;
use crest_tls::StateDir;

/// The policies file in the state directory.
pub const EXPORTS: &str = "exports.json";

/// A file larger than this is not read.
const MAX_EXPORTS_BYTES: usize = 4 << 20;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Exports {
    /// For clients not named.
    #[serde(default)]
    default: Option<Policy>,
    /// By certificate name.
    #[serde(default)]
    clients: HashMap<String, Policy>,
}

/// The policy of the client whose certificate is named `name` (`local`: the host's own
/// certificate): its own entry, else trusted for the host's own, else the file's
/// default, else `Policy::joined()`. An unreadable file refuses every session rather
/// than guess.
pub fn policy_for(dir: &StateDir, name: &str, local: bool) -> Result<Policy, String> {
    let exports = match dir.read(EXPORTS) {
        Ok(None) => Exports::default(),
        Ok(Some(bytes)) if bytes.len() > MAX_EXPORTS_BYTES => {
            return Err(format!("{EXPORTS} is larger than {MAX_EXPORTS_BYTES} bytes"));
        }
        Ok(Some(bytes)) => serde_json::from_slice(&bytes).map_err(|e| format!("{EXPORTS} is not valid: {e}"))?,
        Err(e) => return Err(e.to_string()),
    };
    if let Some(p) = exports.clients.get(name) {
        return Ok(p.clone());
    }
    if local {
        return Ok(Policy::trusted());
    }
    Ok(exports.default.unwrap_or_else(Policy::joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_then_local_then_default() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(tmp.path().join("s"));
        assert_eq!(policy_for(&dir, "x", false), Ok(Policy::joined()), "no file: joined clients are squashed");
        assert_eq!(policy_for(&dir, "local", true), Ok(Policy::trusted()));
        assert_eq!(policy_for(&dir, "local", false), Ok(Policy::joined()), "a name alone is not the host");
        let json = br#"{"default": {"read_only": true}, "clients": {"b7": {"all_squash": true}, "local": {"root_squash": true}}}"#;
        dir.write(EXPORTS, json).expect("write");
        assert!(policy_for(&dir, "x", false).expect("default").read_only);
        let b7 = policy_for(&dir, "b7", false).expect("named");
        assert!(b7.all_squash && !b7.read_only && b7.root_squash, "fields not given keep the joined default");
        assert!(policy_for(&dir, "local", true).expect("local").root_squash);
        dir.write(EXPORTS, b"{\"clients\": {\"a\": {\"bogus\": 1}}}").expect("write");
        assert!(policy_for(&dir, "a", false).is_err(), "an unknown field is an error, not a silent default");
        dir.write(EXPORTS, b"{").expect("write");
        assert!(policy_for(&dir, "local", true).is_err());
    }
}
