//! The state directory: where a host keeps its CA, its certificates, the register of
//! clients, pending tokens and the credentials it got by joining other servers.
//!
//! Layout (all files 0600 in a 0700 directory owned by the user):
//!
//! ```text
//! ca.pem ca.key            the host's certificate authority
//! server.pem server.key    this host's server certificate (chain: server, CA)
//! local.pem local.key      this host's own client certificate (root mounts with it)
//! clients.json             every client certificate the CA issued, and revocations
//! tokens/ID.json           join tokens not yet redeemed or expired
//! joined/ADDR/             ca.pem cert.pem key.pem for a server this host joined
//! joined/.next-ADDR/       the same, being written, before it replaces joined/ADDR/
//! .lock                    held while any of the above changes
//! .renew.lock              held while this host renews a joined certificate
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// A host's state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

/// An exclusive hold on the state directory (released when dropped).
pub struct Lock {
    _file: File,
}

fn state_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::State { path: path.to_path_buf(), detail: detail.to_string() }
}

impl StateDir {
    /// The default place: `$CREST_STATE_DIR`, else `/var/lib/crest` for root, else
    /// `$XDG_STATE_HOME/crest` or `~/.local/state/crest`.
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("CREST_STATE_DIR").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let euid = unsafe { libc::geteuid() };
        if euid == 0 {
            return PathBuf::from("/var/lib/crest");
        }
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|p| !p.is_empty()) {
            return PathBuf::from(x).join("crest");
        }
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        home.join(".local/state/crest")
    }

    /// The directory at `root` (nothing is read or made yet).
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Makes the directory (and `sub`, relative) if missing, closed to others, and checks
    /// that an existing one is.
    pub fn create(&self, sub: &str) -> Result<PathBuf, Error> {
        let dir = if sub.is_empty() { self.root.clone() } else { self.root.join(sub) };
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| {
            state_err(&dir, format!("cannot create: {e} (run as root, or choose another place with --state-dir)"))
        })?;
        self.check_private(&dir)?;
        Ok(dir)
    }

    /// Refuses a directory that others may read or that another user owns: the keys in
    /// it would not be secret.
    fn check_private(&self, dir: &Path) -> Result<(), Error> {
        let m = fs::metadata(dir).map_err(|e| state_err(dir, e))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let euid = unsafe { libc::geteuid() };
        if m.uid() != euid {
            return Err(state_err(dir, format!("owned by uid {}, not by this user (uid {euid})", m.uid())));
        }
        if m.permissions().mode() & 0o077 != 0 {
            return Err(state_err(
                dir,
                format!("open to other users (mode {:o}); run chmod 700 on it", m.permissions().mode() & 0o777),
            ));
        }
        Ok(())
    }

    /// Whether the directory exists and is private (for a client deciding where to look).
    pub fn usable(&self) -> Result<bool, Error> {
        if !self.root.exists() {
            return Ok(false);
        }
        self.check_private(&self.root)?;
        Ok(true)
    }

    /// Holds the directory's lock until the returned value is dropped.
    pub fn lock(&self) -> Result<Lock, Error> {
        self.lock_file(".lock")
    }

    /// Holds the lock that renewals of joined credentials take, one at a time on a host
    /// (`renewal::renew_joined`). Apart from `lock`: a renewal waits on its server for up
    /// to half a minute, and the host's own server must not wait with it.
    pub fn renewal_lock(&self) -> Result<Lock, Error> {
        self.lock_file(".renew.lock")
    }

    fn lock_file(&self, name: &str) -> Result<Lock, Error> {
        self.create("")?;
        let path = self.root.join(name);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| state_err(&path, e))?;
        file.lock().map_err(|e| state_err(&path, e))?;
        Ok(Lock { _file: file })
    }

    /// Reads `rel`, `None` if it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.root.join(rel);
        match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
            Ok(mut f) => {
                let mut out = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut out).map_err(|e| state_err(&path, e))?;
                Ok(Some(out))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(state_err(&path, e)),
        }
    }

    /// Reads `rel` as text; missing is an error naming it.
    pub fn read_text(&self, rel: &str) -> Result<String, Error> {
        let path = self.root.join(rel);
        let bytes = self.read(rel)?.ok_or_else(|| state_err(&path, "missing"))?;
        String::from_utf8(bytes).map_err(|_| state_err(&path, "not text"))
    }

    /// Writes `rel` whole: a new 0600 file, synced, renamed over the old one, so a reader
    /// or a crash sees the old contents or the new, never a part.
    pub fn write(&self, rel: &str, bytes: &[u8]) -> Result<(), Error> {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            let sub = parent.strip_prefix(&self.root).unwrap_or(Path::new(""));
            self.create(&sub.to_string_lossy())?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| state_err(&tmp, e))?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| state_err(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| state_err(&path, e))
    }

    /// Removes `rel`; false if it was not there (so of two removers exactly one wins).
    pub fn remove(&self, rel: &str) -> Result<bool, Error> {
        let path = self.root.join(rel);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(state_err(&path, e)),
        }
    }

    /// Removes the directory `rel` and everything in it; false if it was not there.
    pub fn remove_tree(&self, rel: &str) -> Result<bool, Error> {
        let path = self.root.join(rel);
        match fs::remove_dir_all(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(state_err(&path, e)),
        }
    }

    /// Puts the directory `next` in the place of `live` (which may not exist) in one
    /// step, so that a reader of `live` finds every file of the old directory or every
    /// file of the new one, never some of each, and a crash leaves one of the two whole.
    /// What was at `live` is removed.
    pub fn replace_dir(&self, next: &str, live: &str) -> Result<(), Error> {
        let (from, to) = (self.root.join(next), self.root.join(live));
        if !to.exists() {
            return fs::rename(&from, &to).map_err(|e| state_err(&to, e));
        }
        match exchange(&from, &to) {
            Ok(()) => {}
            // A file system without RENAME_EXCHANGE: the old one is moved aside first, and
            // a reader in between finds no directory there (and says so) for an instant.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                let aside = format!("{next}.old");
                self.remove_tree(&aside)?;
                fs::rename(&to, self.root.join(&aside)).map_err(|e| state_err(&to, e))?;
                fs::rename(&from, &to).map_err(|e| state_err(&to, e))?;
                self.remove_tree(&aside)?;
                return Ok(());
            }
            Err(e) => return Err(state_err(&to, e)),
        }
        self.remove_tree(next).map(|_| ())
    }

    /// The names in the subdirectory `rel` (empty if it does not exist).
    pub fn list(&self, rel: &str) -> Result<Vec<String>, Error> {
        let dir = self.root.join(rel);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(state_err(&dir, e)),
        };
        let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        names.sort();
        Ok(names)
    }

    /// The modification time of `rel` in nanoseconds, if it exists (to notice changes).
    pub fn mtime(&self, rel: &str) -> Option<(i64, i64, u64)> {
        let m = fs::metadata(self.root.join(rel)).ok()?;
        Some((m.mtime(), m.mtime_nsec(), m.ino()))
    }
}

/// Swaps the paths `a` and `b` atomically (renameat2's RENAME_EXCHANGE).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call; renameat2 reads
    // nothing else of ours.
    #[allow(unsafe_code)]
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A server address as a directory name: `host:port` with every character outside
/// `[A-Za-z0-9.-]`, and a leading `.`, written as `_` (so never `.` or `..`).
pub fn addr_key(addr: &str) -> String {
    let mut key: String =
        addr.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
    if key.starts_with('.') || key.is_empty() {
        key.insert(0, '_');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_private_and_replaced_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(tmp.path().join("s"));
        dir.write("a/b.json", b"one").expect("write");
        dir.write("a/b.json", b"two").expect("rewrite");
        assert_eq!(dir.read("a/b.json").expect("read"), Some(b"two".to_vec()));
        let mode = fs::metadata(tmp.path().join("s/a/b.json")).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = fs::metadata(tmp.path().join("s")).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(dir.list("a").expect("list"), vec!["b.json".to_string()]);
        assert!(dir.remove("a/b.json").expect("remove"));
        assert!(!dir.remove("a/b.json").expect("remove again"));
    }

    #[test]
    fn a_directory_is_replaced_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(tmp.path().join("s"));
        dir.write("j/.next-a/cert", b"one").expect("write");
        dir.replace_dir("j/.next-a", "j/a").expect("first: nothing to replace");
        dir.write("j/.next-a/cert", b"two").expect("write");
        dir.write("j/.next-a/key", b"two").expect("write");
        dir.replace_dir("j/.next-a", "j/a").expect("replace");
        assert_eq!(dir.list("j").expect("list"), vec!["a".to_string()], "the old one is gone");
        assert_eq!(dir.list("j/a").expect("list"), vec!["cert".to_string(), "key".to_string()]);
        assert_eq!(dir.read("j/a/cert").expect("read"), Some(b"two".to_vec()));
        assert!(!dir.remove_tree("j/.next-a").expect("remove"));
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("s");
        let dir = StateDir::new(&root);
        dir.create("").expect("create");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = dir.write("x", b"1").expect_err("must refuse");
        assert!(e.to_string().contains("chmod 700"), "{e}");
        assert!(dir.usable().is_err());
    }

    #[test]
    fn addresses_become_plain_names() {
        assert_eq!(addr_key("[::1]:7410"), "___1__7410");
        assert_eq!(addr_key("host.example:7410"), "host.example_7410");
        assert_eq!(addr_key("../../etc"), "_.._.._etc");
        assert_eq!(addr_key(".."), "_..");
    }
}
