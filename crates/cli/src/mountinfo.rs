//! Reading `/proc/self/mountinfo`: what is mounted where, and as what. `crest mount`
//! refuses a directory that is already a mount point and `crest umount` touches only
//! `fuse.crest` mounts, so both need the file system type of the topmost mount on a path.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One line of mountinfo (the fields crest needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted, unescaped.
    pub mount_point: PathBuf,
    /// File system type, e.g. `fuse.crest`, `tmpfs`.
    pub fstype: String,
    /// What is mounted (for crest: the server address), unescaped.
    pub source: String,
    /// The file system's device, `MAJ:MIN`: the same for every mount of one superblock
    /// (a bind mount's and its source's).
    pub device: String,
    /// The file system's own options (for FUSE: `user_id=` of who mounted it, ...).
    pub super_options: String,
}

/// The file system type crest mounts show (FUSE with subtype `crest`).
pub const CREST_FSTYPE: &str = "fuse.crest";

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash): mountinfo and /proc/mounts separate fields with spaces, so a mount point
/// with a space in it appears as `\040`.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = u32::from(d[0] - b'0') * 64 + u32::from(d[1] - b'0') * 8 + u32::from(d[2] - b'0');
                // \400 and above are no byte; keep such text as it is.
                match u8::try_from(v) {
                    Ok(v) => {
                        out.push(v);
                        i += 4;
                    }
                    Err(_) => {
                        out.push(b[i]);
                        i += 1;
                    }
                }
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a mountinfo listing; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
            let mut f = l.split(' ');
            let device = f.nth(2)?;
            let mount_point = f.nth(1)?;
            let mut rest = f.skip_while(|x| *x != "-");
            rest.next()?;
            let fstype = rest.next()?;
            let source = rest.next()?;
            let super_options = rest.next().unwrap_or("");
            Some(Mount {
                mount_point: PathBuf::from(unescape(mount_point)),
                fstype: unescape(fstype),
                source: unescape(source),
                device: device.to_string(),
                super_options: super_options.to_string(),
            })
        })
        .collect()
}

/// The topmost mount on exactly `path` (already absolute and resolved), if any.
pub fn mount_at(mounts: &[Mount], path: &Path) -> Option<Mount> {
    mounts.iter().rev().find(|m| m.mount_point == path).cloned()
}

/// This process's mount table.
pub fn read() -> Result<Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(parse(&text))
}

/// The crest mount `path` names (its mount point, resolved), or why it is none.
pub fn crest_mount_root(path: &Path) -> Result<PathBuf> {
    let target = resolve(path)?;
    match mount_at(&read()?, &target) {
        Some(m) if m.fstype == CREST_FSTYPE => Ok(target),
        Some(m) => anyhow::bail!("{} is a {} mount, not a crest mount", target.display(), m.fstype),
        None => anyhow::bail!("{} is no mount point", target.display()),
    }
}

/// `path` made absolute with symlinks resolved, as mountinfo spells mount points. A FUSE
/// mount whose daemon died cannot be resolved itself (ENOTCONN), so then its parent is
/// resolved and its name appended: that is what unmounting such a mount needs.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    let abs = std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        return Ok(abs);
    };
    let parent = parent.canonicalize().with_context(|| format!("resolving {}", parent.display()))?;
    Ok(parent.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 0:52 / /mnt/x rw,nosuid,nodev,relatime shared:50 - fuse.crest 127.0.0.1:7410 rw,user_id=0
98 22 0:53 / /mnt/with\\040space rw - fuse.crest host\\040a:1 rw
99 22 0:54 / /mnt/x rw master:3 shared:4 - tmpfs tmpfs rw
100 22 0:55 / /mnt/back\\134slash rw - tmpfs tmpfs rw
broken line
";

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/a\\011b\\012c\\134d"), "/a\tb\nc\\d");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
        assert_eq!(unescape("/big\\777"), "/big\\777");
        assert_eq!(unescape("/not\\08x"), "/not\\08x");
    }

    #[test]
    fn parses_and_finds_the_topmost_mount() {
        let m = parse(INFO);
        assert_eq!(m.len(), 5);
        let x = mount_at(&m, Path::new("/mnt/x")).map(|m| m.fstype);
        assert_eq!(x.as_deref(), Some("tmpfs"), "the later (topmost) mount wins");
        let s = mount_at(&m, Path::new("/mnt/with space"));
        assert_eq!(s.as_ref().map(|m| m.fstype.as_str()), Some(CREST_FSTYPE));
        assert_eq!(s.as_ref().map(|m| m.source.as_str()), Some("host a:1"));
        assert_eq!(s.as_ref().map(|m| m.device.as_str()), Some("0:53"));
        assert_eq!(mount_at(&m, Path::new("/mnt/x")).map(|m| m.super_options).as_deref(), Some("rw"));
        let fuse = m.iter().find(|m| m.source == "127.0.0.1:7410").map(|m| m.super_options.as_str());
        assert_eq!(fuse, Some("rw,user_id=0"));
        assert!(mount_at(&m, Path::new("/mnt/back\\slash")).is_some());
        assert!(mount_at(&m, Path::new("/mnt")).is_none());
        assert_eq!(mount_at(&m, Path::new("/")).map(|m| m.source).as_deref(), Some("/dev/sda1"));
    }
}
