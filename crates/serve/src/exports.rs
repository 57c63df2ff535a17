//! Export policies: the `Policy` a client identity gets, from the state directory's
//! `exports.json` (docs/security.md), looked at again at each session's hello so that an
//! edit reaches the next session without a restart, and for connected sessions on a
//! reload (`reload.rs`). A version of the file that is not valid is refused and the one
//! before it kept.

use std::collections::HashMap;
use std::sync::Mutex;

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

/// Reads and checks the file: `None` when there is none.
fn read(dir: &StateDir) -> Result<Option<Exports>, String> {
    let bytes = match dir.read(EXPORTS) {
        Ok(None) => return Ok(None),
        Ok(Some(bytes)) => bytes,
        Err(e) => return Err(e.to_string()),
    };
    if bytes.len() > MAX_EXPORTS_BYTES {
        return Err(format!("{EXPORTS} is larger than {MAX_EXPORTS_BYTES} bytes"));
    }
    let invalid = |e: serde_json::Error| format!("{EXPORTS} is not valid: {e}");
    // (An object: serde would also take a list of the fields in order, and `[]` for none.)
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(invalid)?;
    if !value.is_object() {
        return Err(format!("{EXPORTS} is not valid: not a JSON object"));
    }
    let exports: Exports = serde_json::from_value(value).map_err(invalid)?;
    if exports.default.as_ref().is_some_and(|p| p.admin) {
        return Err(format!(
            "{EXPORTS}: \"admin\" in \"default\" would make every joined host an administrator; \
             name the hosts under \"clients\""
        ));
    }
    Ok(Some(exports))
}

/// The export policies a server goes by: the last version of `exports.json` that was
/// valid. An edit reaches the next session's hello without a reload; an edit that does not
/// parse is refused (logged once) and the policies before it stay, so a typo never locks
/// every host out, the server's own `crest status` and mounts included.
pub(crate) struct Policies {
    dir: StateDir,
    state: Mutex<Loaded>,
}

struct Loaded {
    exports: Exports,
    /// The file as last looked at (modification time and inode; `None`: no file).
    seen: Option<(i64, i64, u64)>,
}

impl Policies {
    /// Reads `dir`'s file; a server does not start on one that is not valid.
    pub(crate) fn load(dir: &StateDir) -> Result<Policies, String> {
        let seen = dir.mtime(EXPORTS);
        let exports = read(dir)?.unwrap_or_default();
        Ok(Policies { dir: dir.clone(), state: Mutex::new(Loaded { exports, seen }) })
    }

    /// Reads the file again if it changed. `Err` says why the new version was refused
    /// (the previous policies stay); only the first look at a version reports it.
    pub(crate) fn refresh(&self) -> Result<(), String> {
        self.look(false)
    }

    /// Reads the file again whether or not it changed (a reload, which must say whether
    /// the file as it is now is in force).
    pub(crate) fn reread(&self) -> Result<(), String> {
        self.look(true)
    }

    fn look(&self, always: bool) -> Result<(), String> {
        let seen = self.dir.mtime(EXPORTS);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if seen == state.seen && !always {
            return Ok(());
        }
        state.seen = seen;
        match read(&self.dir) {
            Ok(exports) => {
                state.exports = exports.unwrap_or_default();
                Ok(())
            }
            Err(e) => {
                tracing::error!("{e}; the export policies before it stay in force");
                Err(e)
            }
        }
    }

    /// The policy of the client whose certificate is named `name` (`local`: the host's
    /// own certificate): its own entry, else trusted for the host's own, else the file's
    /// default, else `Policy::joined()`.
    pub(crate) fn policy_for(&self, name: &str, local: bool) -> Policy {
        let _ = self.refresh();
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = state.exports.clients.get(name) {
            return p.clone();
        }
        if local {
            return Policy::trusted();
        }
        state.exports.default.clone().unwrap_or_else(Policy::joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `json` as the file, so that its modification time differs from the last.
    fn edit(dir: &StateDir, json: &[u8]) {
        let before = dir.mtime(EXPORTS);
        dir.write(EXPORTS, json).expect("write");
        if dir.mtime(EXPORTS) == before {
            std::thread::sleep(std::time::Duration::from_millis(10));
            dir.write(EXPORTS, json).expect("write");
        }
    }

    #[test]
    fn named_then_local_then_default() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(tmp.path().join("s"));
        let p = Policies::load(&dir).expect("no file is valid");
        assert_eq!(p.policy_for("x", false), Policy::joined(), "no file: joined clients are squashed");
        assert_eq!(p.policy_for("local", true), Policy::trusted());
        assert_eq!(p.policy_for("local", false), Policy::joined(), "a name alone is not the host");
        let json = br#"{"default": {"read_only": true}, "clients": {"b7": {"all_squash": true}, "local": {"root_squash": true}}}"#;
        edit(&dir, json);
        assert!(p.policy_for("x", false).read_only, "an edit reaches the next hello");
        let b7 = p.policy_for("b7", false);
        assert!(b7.all_squash && !b7.read_only && b7.root_squash, "fields not given keep the joined default");
        assert!(p.policy_for("local", true).root_squash);
    }

    #[test]
    fn a_bad_edit_is_refused_and_the_policies_before_it_stay() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(tmp.path().join("s"));
        edit(&dir, br#"{"clients": {"ops": {"admin": true}}}"#);
        let p = Policies::load(&dir).expect("valid");
        for bad in [&b"{"[..], b"{\"clients\": {\"a\": {\"bogus\": 1}}}", b"{\"default\": {\"admin\": true}}", b"[]"] {
            edit(&dir, bad);
            assert!(p.refresh().is_err(), "{}", String::from_utf8_lossy(bad));
            assert!(p.refresh().is_ok(), "reported once per version");
            assert!(p.reread().is_err(), "a reload says it is not in force");
            assert!(p.policy_for("ops", false).admin, "the last valid file stays in force");
            assert_eq!(p.policy_for("local", true), Policy::trusted(), "the host's own access goes on");
            assert!(Policies::load(&dir).is_err(), "a server does not start on it");
        }
        dir.remove(EXPORTS).expect("remove");
        assert!(!p.policy_for("ops", false).admin, "no file: the defaults");
    }
}
