//! Mounts of one server on one host share one daemon, and so one session and one
//! connection (SPEC §4 "Many clients", seed 003). A `crest mount` by root whose server,
//! dataset, security, timeout, state directory and options are those of a running mount
//! daemon does not start another: it bind-mounts that daemon's mount on the new directory.
//! Both directories are then one FUSE mount (one superblock): one set of kernel caches,
//! so there is no coherence to keep between them, and the server sees one client.
//! `-o own_session` starts a daemon of its own (what a test playing several clients on one
//! host wants); without root (no bind mounts) every mount has its own too.
//!
//! A sharing daemon registers itself in the state directory (`shared/PID`: its start
//! time, its mount's device and its key; the directory is root's alone), and a new mount
//! trusts only such an entry whose process still runs as the same user in the same mount
//! namespace, and binds a mount that shows that device (checked on the open directory
//! before binding, and on the result after). The daemon serves until the last directory
//! of its mount goes: unmounting its own leaves the bind mounts served, and a later mount
//! binds one of those. A small watcher process per bind mount (`crest mount --bind-of
//! PID … DIR`: no session, no connection) detaches the bind mount if the daemon dies (as
//! auto_unmount does for the daemon's own directory: a killed client leaves no dead mount)
//! and ends as soon as the bind mount is unmounted (`crest umount` waits for it).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::mountinfo::{self, CREST_FSTYPE};

/// The mount option that asks for a daemon (a session) of the mount's own.
pub const OWN_SESSION: &str = "own_session";

/// How often the watcher looks at its bind mount when nothing wakes it.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What two mounts must agree on to share a daemon, as one string (handed to the daemon as
/// `--share-key`, which registers it). Options are sorted: `-o ro,noatime` and
/// `-o noatime,ro` share.
pub fn key(addr: &str, dataset: Option<&str>, insecure: bool, timeout: u64, state: &Path, opts: &[String]) -> String {
    let mut opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    opts.sort_unstable();
    opts.dedup();
    format!(
        "addr={addr};dataset={};insecure={insecure};timeout={timeout};state={};o={}",
        dataset.unwrap_or(""),
        state.display(),
        opts.join(",")
    )
}

/// A sharing daemon's entry in the registry.
struct Entry {
    pid: u32,
    /// The process's start time (`daemons::started`): a pid used again is not it.
    started: u64,
    device: String,
    key: String,
}

impl Entry {
    fn parse(pid: u32, text: &str) -> Option<Entry> {
        let mut lines = text.lines();
        let started = lines.next()?.strip_prefix("started ")?.parse().ok()?;
        let device = lines.next()?.strip_prefix("device ")?.to_string();
        let key = lines.next()?.strip_prefix("key ")?.to_string();
        Some(Entry { pid, started, device, key })
    }

    /// Still the process that wrote it, run by this user in this mount namespace.
    fn alive(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        crate::daemons::started(self.pid) == Some(self.started)
            && std::fs::metadata(format!("/proc/{}", self.pid))
                .is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw())
            && ns(&self.pid.to_string()).is_some_and(|n| Some(n) == ns("self"))
    }
}

/// The registry's directory in the state directory (created, closed to other users).
fn registry(state: &crest_tls::StateDir) -> Result<PathBuf> {
    state.create("shared").context("the state directory's registry of shared mounts")
}

/// Registers this process, which serves the mount at `target` under `key`; returns the
/// entry's path (for `unregister`).
pub fn register(state: &crest_tls::StateDir, key: &str, target: &Path) -> Result<PathBuf> {
    let pid = std::process::id();
    let started = crate::daemons::started(pid).context("this process's start time")?;
    let device = match mountinfo::mount_at(&mountinfo::read()?, target) {
        Some(m) if m.fstype == CREST_FSTYPE => m.device,
        _ => bail!("{} is not a crest mount", target.display()),
    };
    let dir = registry(state)?;
    let (tmp, path) = (dir.join(format!(".{pid}")), dir.join(pid.to_string()));
    std::fs::write(&tmp, format!("started {started}\ndevice {device}\nkey {key}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("registering in {}", dir.display()))?;
    Ok(path)
}

/// Removes an entry `register` made (best effort: a stale one is recognised anyway).
pub fn unregister(entry: &Path) {
    let _ = std::fs::remove_file(entry);
}

/// The registry's entries whose process still runs (an entry left by a daemon killed
/// before it could remove it is removed here).
fn entries(state: &crest_tls::StateDir) -> Vec<Entry> {
    let Ok(dir) = registry(state).and_then(|d| std::fs::read_dir(d).map_err(Into::into)) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let entry = Entry::parse(pid, &std::fs::read_to_string(e.path()).ok()?)?;
            if crate::daemons::started(pid) != Some(entry.started) {
                let _ = std::fs::remove_file(e.path());
                return None;
            }
            Some(entry)
        })
        .collect()
}

/// A running daemon registered with `key` and a crest mount of `source` that shows its
/// device: its pid, that mount's directory and the device. The newest, if several.
pub fn find_daemon(state: &crest_tls::StateDir, key: &str, source: &str) -> Option<(u32, PathBuf, String)> {
    let mounts = mountinfo::read().ok()?;
    entries(state)
        .into_iter()
        .filter(|e| e.key == key && e.alive())
        .filter_map(|e| {
            let m = mounts.iter().rev().find(|m| {
                m.device == e.device && m.fstype == CREST_FSTYPE && m.source == source && mounted_as_root(m)
            })?;
            Some((e.started, e.pid, m.mount_point.clone(), e.device))
        })
        .max()
        .map(|(_, pid, dir, device)| (pid, dir, device))
}

/// The daemon registered as serving `device`, if it runs (what `crest umount` of the last
/// directory of a shared mount waits for).
pub fn daemon_of_device(state: &crest_tls::StateDir, device: &str) -> Option<u32> {
    entries(state).into_iter().find(|e| e.device == device && e.alive()).map(|e| e.pid)
}

/// A FUSE mount its mounter's user id says root's (`user_id=` among the super options: a
/// user's own FUSE mount, whatever it calls itself, is never bound).
fn mounted_as_root(m: &mountinfo::Mount) -> bool {
    m.super_options.split(',').any(|o| o == format!("user_id={}", nix::unistd::geteuid().as_raw()))
}

/// Bind-mounts `source`, a crest mount showing `device`, on `target`. The directory is
/// opened and its device checked before the bind (which goes through the open descriptor:
/// whatever replaces the path meanwhile is not bound), and the result after it.
pub fn bind(source: &Path, target: &Path, device: &str) -> Result<()> {
    use nix::mount::MsFlags;
    use nix::sys::stat::{major, minor};
    let dir = nix::fcntl::open(
        source,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .with_context(|| format!("opening {}", source.display()))?;
    let st = nix::sys::stat::fstat(&dir).with_context(|| format!("stat {}", source.display()))?;
    if format!("{}:{}", major(st.st_dev), minor(st.st_dev)) != device {
        bail!("{} is no longer the shared mount", source.display());
    }
    let via = format!("/proc/self/fd/{}", dir.as_raw_fd());
    nix::mount::mount(Some(via.as_str()), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind-mounting {} on {}", source.display(), target.display()))?;
    match mountinfo::mount_at(&mountinfo::read()?, target) {
        Some(m) if m.fstype == CREST_FSTYPE && m.device == device => Ok(()),
        _ => {
            let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
            bail!("{} did not become the shared mount: undone", target.display())
        }
    }
}

/// Watches the bind mount at `target` (device `device`) of daemon `daemon`: detaches it if
/// the daemon dies, returns once it is unmounted.
pub fn watch(daemon: u32, target: &Path, device: &str) -> Result<()> {
    let pidfd = pidfd_open(daemon);
    let table = std::fs::File::open("/proc/self/mountinfo").context("opening /proc/self/mountinfo")?;
    loop {
        let gone = match &pidfd {
            Some(fd) => readable(fd.as_raw_fd(), table.as_raw_fd()),
            None => {
                std::thread::sleep(WATCH_EVERY);
                !crate::daemons::running(daemon)
            }
        };
        if gone {
            tracing::warn!(daemon, "the mount's daemon ended: detaching {}", target.display());
            let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
            return Ok(());
        }
        let still = mountinfo::read()?.iter().any(|m| m.mount_point == target && m.device == device);
        if !still {
            tracing::info!("{} unmounted", target.display());
            return Ok(());
        }
    }
}

/// A descriptor that becomes readable when process `pid` ends (None where the kernel has
/// no pidfd_open, before Linux 5.3).
#[allow(unsafe_code)]
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; nothing
    // else is passed or borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits up to `WATCH_EVERY` for the process behind `pidfd` to end or the mount table to
/// change; true if the process ended.
#[allow(unsafe_code)]
fn readable(pidfd: i32, table: i32) -> bool {
    let mut fds = [
        libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: table, events: libc::POLLPRI, revents: 0 },
    ];
    let ms = libc::c_int::try_from(WATCH_EVERY.as_millis()).unwrap_or(1000);
    // SAFETY: `fds` is a valid array of two pollfd for the duration of the call, and its
    // length is passed with it.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    n > 0 && fds[0].revents & (libc::POLLIN | libc::POLLHUP) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_option_order_and_tell_everything_else_apart() {
        let s = Path::new("/var/lib/crest");
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let base = key("h:7410", None, false, 120, s, &o(&["ro", "noatime"]));
        assert_eq!(base, key("h:7410", None, false, 120, s, &o(&["noatime", "ro", "ro"])));
        for other in [
            key("h:7411", None, false, 120, s, &o(&["ro", "noatime"])),
            key("h:7410", Some("d"), false, 120, s, &o(&["ro", "noatime"])),
            key("h:7410", None, true, 120, s, &o(&["ro", "noatime"])),
            key("h:7410", None, false, 30, s, &o(&["ro", "noatime"])),
            key("h:7410", None, false, 120, Path::new("/other"), &o(&["ro", "noatime"])),
            key("h:7410", None, false, 120, s, &o(&["noatime"])),
        ] {
            assert_ne!(base, other);
        }
    }
}
