//! Mounts of one server on one host share one daemon, and so one session and one
//! connection (SPEC §4 "Many clients", seed 003). A `crest mount` by root whose server,
//! dataset, security, timeout, state directory and options are those of a running mount
//! daemon does not start another: it bind-mounts that daemon's mount on the new directory.
//! Both directories are then one FUSE mount (one superblock): one set of kernel caches,
//! so there is no coherence to keep between them, and the server sees one client.
//! `-o own_session` starts a daemon of its own (what a test playing several clients on one
//! host wants); without root (no bind mounts) every mount has its own too.
//!
//! The daemon serves until the last directory of its mount goes: unmounting its own leaves
//! the bind mounts served. A small watcher process per bind mount (`crest mount --bind-of
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

/// What two mounts must agree on to share a daemon, as one string (it is a hidden argument
/// of the daemon's command line, where `find_daemon` looks for it). Options are sorted:
/// `-o ro,noatime` and `-o noatime,ro` share.
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

/// The running daemon started with `key` whose own directory is still a crest mount of
/// `source` (what the mount of `key` names: the server, and the dataset if any): its pid
/// and that directory; the newest, if several. (A daemon whose directory was unmounted
/// lazily while in use keeps its command line; another mount may be on that directory
/// now: one of another server or dataset is never taken for it.)
pub fn find_daemon(key: &str, source: &str) -> Option<(u32, PathBuf)> {
    let mounts = mountinfo::read().ok()?;
    crate::daemons::crest_processes()
        .into_iter()
        .filter_map(|(pid, args)| {
            let at = |flag: &[u8]| args.iter().position(|a| a.as_slice() == flag);
            let shares =
                at(b"--share-key").and_then(|i| args.get(i + 1)).is_some_and(|k| k.as_slice() == key.as_bytes());
            if !shares || at(b"--bind-of").is_some() {
                return None;
            }
            let dir = crate::daemons::resolve_for(pid, Path::new(std::ffi::OsStr::from_bytes(args.last()?)))?;
            let mounted =
                mountinfo::mount_at(&mounts, &dir).is_some_and(|m| m.fstype == CREST_FSTYPE && m.source == source);
            mounted.then(|| Some((crate::daemons::started(pid)?, pid, dir))).flatten()
        })
        .max()
        .map(|(_, pid, dir)| (pid, dir))
}

use std::os::unix::ffi::OsStrExt;

/// Bind-mounts `source` (a crest mount's directory) on `target`; returns the device
/// (`MAJ:MIN`) both now show.
pub fn bind(source: &Path, target: &Path) -> Result<String> {
    use nix::mount::MsFlags;
    nix::mount::mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind-mounting {} on {}", source.display(), target.display()))?;
    match mountinfo::mount_at(&mountinfo::read()?, target) {
        Some(m) if m.fstype == CREST_FSTYPE => Ok(m.device),
        _ => bail!("{} is not a crest mount after binding it", target.display()),
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
