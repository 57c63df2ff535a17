//! crest's FUSE layer, the client end of the data path (FUSE → **fuse** → client/net →
//! proto → server → store): translation only: kernel request → client op → reply. Each
//! request a handler thread takes from /dev/fuse becomes one blocking `Client::call`; the
//! result becomes the reply, and a failure becomes an errno here and nowhere else. Locks
//! are the server's, so they hold across clients; a blocking lock waits on a thread of
//! its own (`locks`). The kernel does the rest: permission checks
//! (`default_permissions`), attribute and entry caching for `attr_ttl`, and the page
//! cache, which is kept across opens only while the file is unchanged.
//!
//! Mounting: [`mount_blocking`] serves until the file system is unmounted;
//! [`spawn_mount`] serves from background threads and unmounts when its guard is dropped.
//! As root (with fusermount3 installed) mounts use `auto_unmount`: a killed client leaves
//! no dead mount behind; `-o noauto_unmount` turns that off.

mod caller;
mod convert;
mod dir;
mod error;
mod fs;
mod inodes;
mod locks;
mod options;
mod prefetch;

use std::io;
use std::path::{Path, PathBuf};

pub use error::Error;
pub use fs::status::StatusExtra;
pub use fs::CrestFs;
pub use options::{unknown_options, MountOptions, DEFAULT_ATTR_TTL, DEFAULT_THREADS};

/// Buffered readahead asked of the kernel's bdi for the mount (its default is 128 KiB).
/// A window of several requests keeps the server reading (and sealing, over TLS) the next
/// one while the mount opens and hands over the last: a 1 GiB cold `dd` read took a median
/// 1.84 s at 1 MiB and 1.52 s at 4 MiB over TLS (1.47 and 1.41 s with `--insecure`; five
/// runs each); 8 and 16 MiB gained nothing more.
pub const READ_AHEAD_KB: u32 = 4096;

fn session(
    client: crest_net::Client,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<(fuser::Session<CrestFs>, bool)> {
    // Resolved before mounting: once mounted, touching the mount point needs the session
    // running.
    let mountpoint = mountpoint.canonicalize()?;
    let config = options::fuser_config(opts, options::auto_unmount_by_default());
    let via_fusermount = config.mount_options.contains(&fuser::MountOption::AutoUnmount);
    tracing::debug!(?config, "mounting {}", mountpoint.display());
    // A dataset whose `atime` property is off keeps none, whatever the mount says.
    let atime = if client.dataset_noatime() { options::Atime::Never } else { options::atime_mode(opts) };
    let fs = CrestFs::new(client, opts.attr_ttl)
        .with_shared_kernel_names(options::kernel_names(opts))
        .with_posix_acls(options::posix_acls(opts))
        .with_atime(atime)
        .with_status_extra(opts.status.clone());
    let recalls = fs.recall_worker();
    let epoch = fs.kernel_epoch();
    let attrs = fs.kernel_attrs();
    let session = fuser::Session::new(fs, &mountpoint, &config)?;
    epoch.attach(std::os::fd::AsFd::as_fd(&session));
    attrs.attach(session.notifier());
    recalls.spawn(session.notifier())?;
    raise_readahead(&mountpoint);
    Ok((session, via_fusermount))
}

/// Mounts the server behind `client` on `mountpoint` and serves it until it is unmounted
/// (`umount`, `fusermount3 -u`). With `auto_unmount` (the default for root), the mount
/// also goes away when this process dies.
pub fn mount_blocking(client: crest_net::Client, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    session(client, mountpoint, opts)?.0.run()
}

/// Mounts and serves from background threads. The file system stays mounted until the
/// guard is dropped (lazy unmount) or [`MountGuard::unmount`] is called.
pub fn spawn_mount(client: crest_net::Client, mountpoint: &Path, opts: &MountOptions) -> io::Result<MountGuard> {
    let mountpoint = mountpoint.canonicalize()?;
    let (session, via_fusermount) = session(client, &mountpoint, opts)?;
    Ok(MountGuard { session: Some(session.spawn()?), mountpoint, via_fusermount })
}

/// A mount served in the background; dropping it unmounts (lazily if busy).
#[derive(Debug)]
pub struct MountGuard {
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
    /// Mounted by fusermount3 for auto_unmount. fusermount3 unmounts only once this
    /// process is dead (it checks for ENOTCONN), and fuser's unmount of such a mount merely
    /// closes the socket to it, so a live process must unmount with `fusermount3 -u`.
    via_fusermount: bool,
}

impl MountGuard {
    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// True once the session has ended (someone unmounted the file system).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Waits until the file system is unmounted by someone else.
    pub fn join(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.join(),
            None => Ok(()),
        }
    }

    /// Unmounts and waits for the handler threads to finish. While the file system is in
    /// use this fails with `ResourceBusy` and everything stays as it was (mounted, served,
    /// guard still valid), given fusermount3 is installed (without it, fuser unmounts and
    /// on failure leaves the mount served by detached threads).
    pub fn unmount(&mut self) -> io::Result<()> {
        if self.session.is_none() {
            return Ok(());
        }
        // fusermount3 -u where possible: on EBUSY it leaves everything in place, while
        // fuser's own unmount consumes the session even when it fails.
        let by_fusermount = !self.is_finished() && (self.via_fusermount || options::fusermount3_installed());
        if by_fusermount {
            fusermount_unmount(&self.mountpoint, false)?;
        }
        match self.session.take() {
            // Unmounted: the handler threads see ENODEV and end.
            Some(s) if by_fusermount => s.join(),
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        // Lazily: a drop cannot report EBUSY, and a busy mount must not stay behind served
        // by threads nobody owns.
        if self.session.is_some() && !self.is_finished() && (self.via_fusermount || options::fusermount3_installed()) {
            if let Err(e) = fusermount_unmount(&self.mountpoint, true) {
                tracing::warn!("unmounting {}: {e}", self.mountpoint.display());
            }
        }
        // Otherwise dropping the session unmounts (what fuser mounted itself, if not busy).
        drop(self.session.take());
    }
}

/// `fusermount3 -u` (`-z`: lazily, detaching a busy mount at once).
fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg("--").arg(mountpoint).output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let kind = if msg.contains("busy") { io::ErrorKind::ResourceBusy } else { io::ErrorKind::Other };
    Err(io::Error::new(kind, if msg.is_empty() { format!("fusermount3 -u failed: {}", out.status) } else { msg }))
}

/// Raises the mount's readahead so buffered sequential reads go out in large requests.
/// Best effort: needs root, and is skipped quietly otherwise.
fn raise_readahead(mountpoint: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let Some(dev) = mountinfo_device(&info, &mountpoint.to_string_lossy()) else {
        tracing::debug!("{} not found in mountinfo", mountpoint.display());
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, READ_AHEAD_KB.to_string()) {
        Ok(()) => tracing::debug!("{path} = {READ_AHEAD_KB}"),
        Err(e) => tracing::debug!("cannot raise readahead ({path}): {e}"),
    }
}

/// The `major:minor` of the last (topmost) mount on `mountpoint` in a mountinfo listing.
fn mountinfo_device(mountinfo: &str, mountpoint: &str) -> Option<String> {
    let escaped = mountpoint.replace('\\', "\\134").replace(' ', "\\040").replace('\t', "\\011").replace('\n', "\\012");
    mountinfo.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let _root = f.next()?;
        (f.next()? == escaped).then(|| dev.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_from_mountinfo() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 0:52 / /mnt/x rw,nosuid,nodev,relatime shared:50 - fuse.crest 127.0.0.1:7410 rw,user_id=0
98 22 0:53 / /mnt/with\\040space rw - fuse.crest a rw
99 22 0:54 / /mnt/x rw - fuse.crest b rw
";
        assert_eq!(mountinfo_device(info, "/mnt/x").as_deref(), Some("0:54"));
        assert_eq!(mountinfo_device(info, "/mnt/with space").as_deref(), Some("0:53"));
        assert_eq!(mountinfo_device(info, "/"), Some("8:1".into()));
        assert_eq!(mountinfo_device(info, "/mnt"), None);
    }
}
