//! crest's FUSE layer, the client end of the data path (FUSE → **fuse** → client/net →
//! proto → server → store): translation only: kernel request → client op → reply. Each
//! request a handler thread takes from /dev/fuse becomes one blocking `Client::call`; the
//! result becomes the reply, and a failure becomes an errno here and nowhere else. The
//! kernel does the rest: permission checks (`default_permissions`), POSIX and flock locks
//! (kept local), attribute and entry caching for `attr_ttl`, and the page cache, which is
//! kept across opens only while the file is unchanged.
//!
//! Mounting: [`mount_blocking`] serves until the file system is unmounted;
//! [`spawn_mount`] serves from background threads and unmounts when its guard is dropped.

mod convert;
mod dir;
mod error;
mod fs;
mod inodes;
mod options;

use std::io;
use std::path::{Path, PathBuf};

pub use error::Error;
pub use fs::CrestFs;
pub use options::{MountOptions, DEFAULT_ATTR_TTL, DEFAULT_THREADS};

/// Buffered readahead asked of the kernel's bdi for the mount (its default is 128 KiB).
pub const READ_AHEAD_KB: u32 = 1024;

fn session(client: crest_net::Client, mountpoint: &Path, opts: &MountOptions) -> io::Result<fuser::Session<CrestFs>> {
    // Resolved before mounting: once mounted, touching the mount point needs the session
    // running.
    let mountpoint = mountpoint.canonicalize()?;
    let config = options::fuser_config(opts);
    tracing::debug!(?config, "mounting {}", mountpoint.display());
    let session = fuser::Session::new(CrestFs::new(client, opts.attr_ttl), &mountpoint, &config)?;
    raise_readahead(&mountpoint);
    Ok(session)
}

/// Mounts the server behind `client` on `mountpoint` and serves it until it is unmounted
/// (`umount`, `fusermount3 -u`).
pub fn mount_blocking(client: crest_net::Client, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    session(client, mountpoint, opts)?.run()
}

/// Mounts and serves from background threads. The file system stays mounted until the
/// guard is dropped or [`MountGuard::unmount`] is called.
pub fn spawn_mount(client: crest_net::Client, mountpoint: &Path, opts: &MountOptions) -> io::Result<MountGuard> {
    let mountpoint_buf = mountpoint.canonicalize()?;
    let session = session(client, &mountpoint_buf, opts)?.spawn()?;
    Ok(MountGuard { session: Some(session), mountpoint: mountpoint_buf })
}

/// A mount served in the background; dropping it unmounts.
#[derive(Debug)]
pub struct MountGuard {
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
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

    /// Unmounts (fails with EBUSY while the file system is in use) and waits for the
    /// handler threads to finish.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        // Dropping the session unmounts.
        drop(self.session.take());
    }
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
    mountinfo
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let _root = f.next()?;
            (f.next()? == escaped).then(|| dev.to_string())
        })
        .last()
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
