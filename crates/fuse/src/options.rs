//! Mount options and their translation into fuser's `Config`.

use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};

/// Handler threads unless told otherwise.
pub const DEFAULT_THREADS: usize = 4;
/// How long the kernel may trust attributes and entries it was given. One client for now;
/// later, leases govern it.
pub const DEFAULT_ATTR_TTL: Duration = Duration::from_secs(1);
// A mount stops answering from what it cached before the server stops counting a
// disconnected mount as a holder (and lets a change go ahead without its answer).
const _: () = assert!(DEFAULT_ATTR_TTL.as_millis() < crest_proto::timing::DISCONNECTED_HOLDER_MS as u128);

/// How to mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Source shown in /proc/mounts and `df` (the server address).
    pub fsname: String,
    /// Mount read-only.
    pub read_only: bool,
    /// Let users other than the mounting one in (needed when root mounts for others, e.g.
    /// pjdfstest's unprivileged users). Permissions are still checked by the kernel.
    pub allow_other: bool,
    /// Threads that take requests from the kernel (each blocks while its request is on the
    /// wire, so this is also the number of requests in flight).
    pub threads: usize,
    /// How long the mount trusts attributes and entries it holds without hearing a recall
    /// from the server (a bound for when the server cannot reach it; the kernel itself
    /// caches neither, so other clients' changes are seen at once).
    pub attr_ttl: Duration,
    /// `-o` options passed through (`ro`, `noexec`, `noauto_unmount`…); unknown ones are
    /// ignored with a warning (`unknown_options` lists them for a caller to refuse).
    pub extra: Vec<String>,
    /// Fields the caller keeps current for the mount's status (`crest status --mount`).
    pub status: crate::StatusExtra,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fsname: "crest".into(),
            read_only: false,
            // Root mounts serve everyone; an unprivileged mount needs user_allow_other.
            allow_other: is_root(),
            threads: DEFAULT_THREADS,
            attr_ttl: DEFAULT_ATTR_TTL,
            extra: Vec::new(),
            status: crate::StatusExtra::default(),
        }
    }
}

/// Whether a mount unmounts itself when its process dies (`auto_unmount`) unless `-o`
/// says otherwise: yes for root when fusermount3 is installed (it does the mount and stays
/// behind to unmount). Not for other users: fusermount3 then demands allow_other, which
/// needs user_allow_other in /etc/fuse.conf.
pub fn auto_unmount_by_default() -> bool {
    is_root() && fusermount3_installed()
}

/// Whether `fusermount3` is on the PATH.
pub fn fusermount3_installed() -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("fusermount3").is_file()))
}

fn is_root() -> bool {
    // Without unsafe: the effective uid is the owner of /proc/self.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// What `mount(8)` and fstab put in `-o` that is not for the file system itself.
const MOUNT_ONLY: &[&str] = &[
    "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail", "remount",
    "relatime",
];

/// When a read changes a file's access time. FUSE leaves access times to the file
/// system: the mount keeps them as a local one does under the same option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atime {
    /// `relatime` (the default): when the access time is not after the modification or
    /// change time, or is a day old.
    Relative,
    /// `strictatime`: at every read.
    Strict,
    /// `noatime`, and every read-only mount.
    Never,
}

/// The mount's access-time rule (`Atime`): the last of `atime`/`relatime`,
/// `strictatime` and `noatime` wins, as with mount(8).
pub fn atime_mode(opts: &MountOptions) -> Atime {
    let mut mode = Atime::Relative;
    let mut read_only = opts.read_only;
    for o in opts.extra.iter().flat_map(|e| e.split(',')).map(str::trim) {
        match o {
            "atime" | "relatime" => mode = Atime::Relative,
            "strictatime" => mode = Atime::Strict,
            "noatime" => mode = Atime::Never,
            "ro" => read_only = true,
            "rw" => read_only = false,
            _ => {}
        }
    }
    if read_only {
        Atime::Never
    } else {
        mode
    }
}

/// Whether the kernel may cache names this mount holds under shared rights (where it can
/// drop them all at once: `fs::KernelEpoch`). On unless `-o nokernelnames` (the last of
/// `kernelnames`/`nokernelnames` wins).
pub fn kernel_names(opts: &MountOptions) -> bool {
    let mut words = opts.extra.iter().flat_map(|e| e.split(',')).map(str::trim);
    words.rfind(|o| *o == "kernelnames" || *o == "nokernelnames").is_none_or(|o| o == "kernelnames")
}

/// Whether the kernel enforces POSIX ACLs on this mount (`acl`, the default) or ignores
/// them and refuses to set them (`noacl`, as ext4's option): the last of the two wins.
/// The server keeps ACLs and applies default ACLs to new inodes either way.
pub fn posix_acls(opts: &MountOptions) -> bool {
    let mut words = opts.extra.iter().flat_map(|e| e.split(',')).map(str::trim);
    words.rfind(|o| *o == "acl" || *o == "noacl").is_none_or(|o| o == "acl")
}

/// The fuser configuration for `opts`; `auto_unmount` is the default `-o` can override.
pub fn fuser_config(opts: &MountOptions, auto_unmount: bool) -> Config {
    let mut read_only = opts.read_only;
    let mut acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    let mut auto_unmount = auto_unmount;
    // A file system from the network holds what others wrote: its setuid bits and device
    // nodes count only when the mount asks (`-o suid`, `-o dev`), as NFS and sshfs users
    // are told to do.
    let mut flags: Vec<MountOption> = vec![MountOption::NoSuid, MountOption::NoDev];
    for o in opts.extra.iter().flat_map(|e| e.split(',')).map(str::trim).filter(|o| !o.is_empty()) {
        let flag = match word(o) {
            Some(Word::Kernel(flag)) => flag,
            Some(Word::ReadOnly(ro)) => {
                read_only = ro;
                continue;
            }
            Some(Word::AllowOther) => {
                acl = SessionACL::All;
                continue;
            }
            Some(Word::AllowRoot) => {
                if acl == SessionACL::Owner {
                    acl = SessionACL::RootAndOwner;
                }
                continue;
            }
            Some(Word::AutoUnmount(on)) => {
                auto_unmount = on;
                continue;
            }
            Some(Word::Elsewhere) => continue,
            None => {
                // (`crest mount` refuses these before it mounts: `unknown_options`.)
                tracing::warn!("unknown mount option {o:?} ignored");
                continue;
            }
        };
        // Later options win over earlier opposites (`exec,noexec` → noexec).
        let opposite = opposite(&flag);
        flags.retain(|f| Some(f) != opposite.as_ref() && f != &flag);
        flags.push(flag);
    }
    let mut mount_options = vec![MountOption::FSName(opts.fsname.clone()), MountOption::DefaultPermissions];
    if auto_unmount {
        // fusermount3 does the mount (and the unmount when this process dies); it takes
        // the subtype itself.
        mount_options.push(MountOption::Subtype("crest".into()));
        mount_options.push(MountOption::AutoUnmount);
        if acl == SessionACL::Owner {
            // fusermount3 insists on allow_root or allow_other for auto_unmount.
            acl = SessionACL::RootAndOwner;
        }
    } else {
        // A direct mount(2) by root passes only kernel options: fuser's Subtype would be
        // dropped (the type would read plain "fuse"), the kernel's own subtype= is not.
        mount_options.push(MountOption::CUSTOM("subtype=crest".into()));
    }
    mount_options.push(if read_only { MountOption::RO } else { MountOption::RW });
    mount_options.extend(flags);
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = acl;
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config
}

/// What one `-o` word means to the mount.
enum Word {
    /// A flag of the kernel's mount.
    Kernel(MountOption),
    /// `ro` (true) or `rw`.
    ReadOnly(bool),
    AllowOther,
    AllowRoot,
    /// `auto_unmount` (true) or `noauto_unmount`.
    AutoUnmount(bool),
    /// Known, and taken care of elsewhere (or meant for mount(8), or set by crest itself).
    Elsewhere,
}

fn word(o: &str) -> Option<Word> {
    Some(Word::Kernel(match o {
        "ro" => return Some(Word::ReadOnly(true)),
        "rw" => return Some(Word::ReadOnly(false)),
        "allow_other" => return Some(Word::AllowOther),
        "allow_root" => return Some(Word::AllowRoot),
        "auto_unmount" => return Some(Word::AutoUnmount(true)),
        "noauto_unmount" => return Some(Word::AutoUnmount(false)),
        // Always on; crest's own (`kernel_names`); negotiated at FUSE init (`posix_acls`);
        // access times are the daemon's (`atime_mode`): the kernel keeps none for FUSE.
        "default_permissions"
        | "kernelnames"
        | "nokernelnames"
        | "acl"
        | "noacl"
        | "strictatime"
        | "nostrictatime"
        | "relatime"
        | "norelatime"
        | "diratime"
        | "nodiratime"
        | "lazytime" => return Some(Word::Elsewhere),
        // mount(8) keeps `dev` and `suid` (its defaults) from a helper: these reach it.
        "dev" | "crest.dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" | "crest.suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        o if MOUNT_ONLY.contains(&o) || o.starts_with("x-") || o.starts_with("comment=") => {
            tracing::debug!("mount option {o:?} is for mount(8), not crest");
            return Some(Word::Elsewhere);
        }
        // What the FUSE layer sets itself (mount(8) hands a remount the mount's current
        // options, these among them).
        o if ["fsname=", "subtype=", "user_id=", "group_id=", "rootmode=", "fd=", "max_read=", "blksize="]
            .iter()
            .any(|p| o.starts_with(p)) =>
        {
            tracing::warn!("mount option {o:?} ignored: crest sets it");
            return Some(Word::Elsewhere);
        }
        _ => return None,
    }))
}

/// The words of `extra` the mount does not know: `crest mount` refuses to mount with
/// them, as mount(8) refuses an option a file system does not take.
pub fn unknown_options(extra: &[String]) -> Vec<String> {
    extra
        .iter()
        .flat_map(|e| e.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty() && word(o).is_none())
        .map(str::to_string)
        .collect()
}

fn opposite(o: &MountOption) -> Option<MountOption> {
    Some(match o {
        MountOption::Dev => MountOption::NoDev,
        MountOption::NoDev => MountOption::Dev,
        MountOption::Suid => MountOption::NoSuid,
        MountOption::NoSuid => MountOption::Suid,
        MountOption::Exec => MountOption::NoExec,
        MountOption::NoExec => MountOption::Exec,
        MountOption::Atime => MountOption::NoAtime,
        MountOption::NoAtime => MountOption::Atime,
        MountOption::Sync => MountOption::Async,
        MountOption::Async => MountOption::Sync,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(extra: &[&str]) -> MountOptions {
        MountOptions {
            fsname: "10.0.0.1:7410".into(),
            allow_other: false,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            ..MountOptions::default()
        }
    }

    #[test]
    fn defaults() {
        let c = fuser_config(&opts(&[]), false);
        assert_eq!(
            c.mount_options,
            vec![
                MountOption::FSName("10.0.0.1:7410".into()),
                MountOption::DefaultPermissions,
                MountOption::CUSTOM("subtype=crest".into()),
                MountOption::RW,
                MountOption::NoSuid,
                MountOption::NoDev,
            ]
        );
        assert_eq!(c.acl, SessionACL::Owner);
        assert_eq!(c.n_threads, Some(DEFAULT_THREADS));
        assert!(c.clone_fd);
    }

    #[test]
    fn acls_are_on_unless_turned_off() {
        assert!(posix_acls(&opts(&[])));
        assert!(!posix_acls(&opts(&["noatime,noacl"])));
        assert!(posix_acls(&opts(&["noacl", "acl"])));
        let c = fuser_config(&opts(&["noacl"]), false);
        assert!(c.mount_options.iter().all(|o| !format!("{o:?}").contains("acl")), "not passed to the kernel");
    }

    #[test]
    fn kernel_name_caching_is_on_unless_turned_off() {
        assert!(kernel_names(&opts(&[])));
        assert!(!kernel_names(&opts(&["noatime,nokernelnames"])));
        assert!(kernel_names(&opts(&["nokernelnames", "kernelnames"])));
        let c = fuser_config(&opts(&["nokernelnames", "kernelnames"]), false);
        assert!(c.mount_options.iter().all(|o| !format!("{o:?}").contains("kernelnames")), "not passed to the kernel");
    }

    #[test]
    fn extra_options() {
        let c =
            fuser_config(&opts(&["ro,noexec", "exec", "defaults", "_netdev", "x-systemd.automount", "bogus=1"]), false);
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(!c.mount_options.contains(&MountOption::RW));
        assert!(c.mount_options.contains(&MountOption::Exec));
        assert!(!c.mount_options.contains(&MountOption::NoExec));
        assert_eq!(c.mount_options.len(), 7);
        let c = fuser_config(&opts(&["allow_other", "nosuid,suid,nosuid"]), false);
        assert_eq!(c.acl, SessionACL::All);
        assert_eq!(c.mount_options.iter().filter(|o| matches!(o, MountOption::NoSuid | MountOption::Suid)).count(), 1);
        assert!(c.mount_options.contains(&MountOption::NoSuid));
        // Asked for, setuid bits and devices count.
        let c = fuser_config(&opts(&["suid,dev"]), false);
        assert!(c.mount_options.contains(&MountOption::Suid) && c.mount_options.contains(&MountOption::Dev));
        assert!(!c.mount_options.iter().any(|o| matches!(o, MountOption::NoSuid | MountOption::NoDev)));
    }

    #[test]
    fn read_only_and_allow_other_fields() {
        let c = fuser_config(&MountOptions { read_only: true, allow_other: true, threads: 0, ..opts(&[]) }, false);
        assert!(c.mount_options.contains(&MountOption::RO));
        assert_eq!(c.acl, SessionACL::All);
        assert_eq!(c.n_threads, Some(1));
        let c = fuser_config(&MountOptions { read_only: true, ..opts(&["rw"]) }, false);
        assert!(c.mount_options.contains(&MountOption::RW));
    }

    #[test]
    fn auto_unmount_goes_through_fusermount() {
        for c in [fuser_config(&opts(&["auto_unmount"]), false), fuser_config(&opts(&[]), true)] {
            assert!(c.mount_options.contains(&MountOption::AutoUnmount));
            assert!(c.mount_options.contains(&MountOption::Subtype("crest".into())));
            assert!(!c.mount_options.contains(&MountOption::CUSTOM("subtype=crest".into())));
            assert_ne!(c.acl, SessionACL::Owner);
        }
        let c = fuser_config(&opts(&["noauto_unmount"]), true);
        assert!(!c.mount_options.contains(&MountOption::AutoUnmount));
        assert!(c.mount_options.contains(&MountOption::CUSTOM("subtype=crest".into())));
    }

    #[test]
    fn the_last_atime_option_wins_and_read_only_mounts_keep_none() {
        let with = |extra: &[&str], read_only| MountOptions {
            extra: extra.iter().map(|s| s.to_string()).collect(),
            read_only,
            ..MountOptions::default()
        };
        assert_eq!(atime_mode(&with(&[], false)), Atime::Relative);
        assert_eq!(atime_mode(&with(&["strictatime"], false)), Atime::Strict);
        assert_eq!(atime_mode(&with(&["noatime,relatime"], false)), Atime::Relative);
        assert_eq!(atime_mode(&with(&["relatime", "noatime"], false)), Atime::Never);
        assert_eq!(atime_mode(&with(&["ro,strictatime"], false)), Atime::Never);
        assert_eq!(atime_mode(&with(&["strictatime"], true)), Atime::Never);
        assert_eq!(atime_mode(&with(&["ro", "rw,strictatime"], false)), Atime::Strict);
    }
}
