//! Who may do what: the server's permission checks. Clients are not trusted to check
//! permissions (a client's kernel does, but a hostile peer with a certificate need not
//! run one), so the server judges every operation itself, as Linux's VFS would judge it
//! on a local file system, for the caller the request names as the export `Policy` maps
//! it (root squashed, ids mapped…).
//!
//! Invariant: every operation a session runs is first passed to `check`, with the caller
//! `Policy::map` made of the request's, and runs only if `check` returns `Ok` — then as
//! `check` left it: where POSIX adjusts rather than refuses (the owner of a new inode is
//! the caller whatever the client claimed, setuid bits the policy forbids are dropped, a
//! change time far from the server's clock is the server's clock), `check` rewrites the
//! operation in place.
//!
//! Refusals are Linux's errnos: EACCES (13) where permission bits refuse, EPERM (1) where
//! only the owner or root may (chmod, chown, utimes to a given time, sticky directories,
//! devices, trusted xattrs), EROFS (30) for any change under a read-only policy. An inode
//! that does not exist is the store's error (ENOENT), as the operation itself would say.

mod attrs;
mod names;
#[cfg(test)]
mod tests;

use crest_proto as p;
use crest_proto::acl;
use crest_store as s;
use p::Op;
use serde::{Deserialize, Serialize};

use crate::convert::error_out;

/// How far a time a client sets may be from the server's clock and still count as "now":
/// a client answering a write itself stamps the file's times with its own clock, and
/// sends them with the write-back (`Request::time`, `SetTime::At`).
pub const MAX_CLOCK_SKEW: p::Time = p::Time { sec: 60, nsec: 0 };

/// The user nobody else is (NFS's `nobody`): whom squashed callers become by default.
pub const NOBODY: u32 = 65534;

/// What an export allows the callers of one client host, and as whom they act. A JSON
/// policy names only what it changes from `Policy::default()` (`joined()`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Every change is refused with EROFS.
    pub read_only: bool,
    /// uid 0 acts as `anon_uid`, gid 0 as `anon_gid`, and group 0 is dropped.
    pub root_squash: bool,
    /// Everyone acts as `anon_uid`:`anon_gid`, without supplementary groups.
    pub all_squash: bool,
    /// The uid squashed callers get.
    pub anon_uid: u32,
    /// The gid squashed callers get.
    pub anon_gid: u32,
    /// Setuid (and setgid on files) bits may be set; otherwise they are dropped.
    pub allow_suid: bool,
    /// Character and block devices may be made (by uid 0).
    pub allow_dev: bool,
    /// Client uid → server uid, applied before squashing; ids not named stay as they are.
    pub uid_map: Vec<(u32, u32)>,
    /// Client gid → server gid (primary and supplementary groups), as `uid_map`.
    pub gid_map: Vec<(u32, u32)>,
    /// The datasets this host may mount, by name; `None`: every one. A dataset is the
    /// unit of export: a subtree to export on its own is made a dataset.
    pub datasets: Option<Vec<String>>,
    /// May run administrative commands (`crest dataset …`): the server's own host.
    pub admin: bool,
}

impl Default for Policy {
    /// `joined()`: a host gets no more than that unless the server says so.
    fn default() -> Policy {
        Policy::joined()
    }
}

impl Policy {
    /// The server's own host, or `--insecure`: callers are who they say, root included;
    /// setuid files and devices are allowed.
    pub fn trusted() -> Policy {
        Policy {
            read_only: false,
            root_squash: false,
            all_squash: false,
            anon_uid: NOBODY,
            anon_gid: NOBODY,
            allow_suid: true,
            allow_dev: true,
            uid_map: Vec::new(),
            gid_map: Vec::new(),
            datasets: None,
            admin: true,
        }
    }

    /// Whether this host may mount dataset `name`.
    pub fn may_mount(&self, name: &str) -> bool {
        self.datasets.as_ref().is_none_or(|allowed| allowed.iter().any(|a| a == name))
    }

    /// A host that joined with a token: its root is squashed to `nobody`, and it may make
    /// neither setuid files nor devices.
    pub fn joined() -> Policy {
        Policy { root_squash: true, allow_suid: false, allow_dev: false, admin: false, ..Policy::trusted() }
    }

    /// Whom the server takes this host's callers for (told to its sessions in the
    /// welcome).
    pub fn identity_map(&self) -> p::IdentityMap {
        p::IdentityMap {
            root_squash: self.root_squash,
            all_squash: self.all_squash,
            anon_uid: self.anon_uid,
            anon_gid: self.anon_gid,
            uid_map: self.uid_map.clone(),
            gid_map: self.gid_map.clone(),
            allow_setid: self.allow_suid,
            allow_devices: self.allow_dev,
        }
    }

    /// The caller a request from this host runs as (`IdentityMap::map`).
    pub fn map(&self, caller: &p::Caller) -> p::Caller {
        self.identity_map().map(caller)
    }
}

/// When and through what an operation runs, beside who asks.
#[derive(Clone, Copy, Debug)]
pub struct When {
    /// The server's clock.
    pub now: p::Time,
    /// The time the request runs at if the client gave one (`Request::time`, `Op::At`).
    pub client_time: Option<p::Time>,
    /// The access (`p::OPEN_*`) the session's open handles of the inode the operation
    /// reads or writes were granted: the kernel checks a file's permissions when it opens
    /// it, and whoever holds the descriptor then reads or writes through it (a process
    /// that changed its user, one a descriptor was passed to, the kernel's writeback).
    pub opened: u32,
}

/// Checks that `caller` (already mapped by `policy.map`) may run `op`, and adjusts `op`
/// where POSIX adjusts rather than refuses (see the module's doc).
pub fn check(
    store: &mut s::Store,
    policy: &Policy,
    caller: &p::Caller,
    op: &mut Op,
    when: When,
) -> Result<(), p::OpError> {
    let When { now, client_time, opened } = when;
    // (Nor exclusive rights: nothing may be changed under them.)
    if policy.read_only && (changes(op) || matches!(op, Op::Acquire { .. })) {
        return Err(refuse(30, format!("{}: the export is read-only for this host", op.name())));
    }
    // Root (unsquashed) where setuid files and devices are allowed may do anything: no
    // look-up here, so that whatever fails does so with the store's own error. (A change
    // time is the server's to keep, whoever sets it.)
    if caller.uid == 0 && policy.allow_suid && policy.allow_dev {
        if let Op::SetAttr { set, .. } = op {
            if set.ctime.is_some_and(|t| !attrs::near(t, now)) {
                set.ctime = Some(now);
            }
        }
        return Ok(());
    }
    let mut c = Checker { store, policy, caller, opened };
    match op {
        Op::GetAttr { .. }
        | Op::ReadLink { .. }
        | Op::StatFs
        | Op::Fsync { .. }
        | Op::Release { .. }
        | Op::At { .. }
        | Op::Reassert { .. }
        | Op::AllocInodes { .. }
        | Op::Uploads { .. }
        | Op::ListXattr { .. } => Ok(()),
        // "." and ".." name the inode itself and its parent: what GetAttr tells anyone.
        Op::Lookup { name, .. } if name == b"." || name == b".." => Ok(()),
        Op::Lookup { parent, .. } => c.need(*parent, acl::MAY_EXEC),
        Op::ReadDir { ino, .. } | Op::Acquire { ino } => c.need(*ino, acl::MAY_READ),
        Op::Open { ino, access, .. } => c.open(*ino, *access),
        // Execute permission lets the kernel read a file it runs.
        Op::Read { ino, .. } => c.through_open(*ino, acl::MAY_READ | acl::MAY_EXEC, acl::MAY_READ),
        Op::Write { ino, .. }
        | Op::WriteBack { ino, .. }
        | Op::MapObject { ino, .. }
        | Op::Append { ino, .. }
        | Op::Fallocate { ino, .. } => c.through_open(*ino, acl::MAY_WRITE, acl::MAY_WRITE),
        // flock takes either kind through any descriptor; fcntl a read lock through one
        // open for reading, a write lock through one open for writing.
        Op::SetLock { ino, flock: true, kind: p::LockKind::Read | p::LockKind::Write, .. } => {
            c.through_open(*ino, p::OPEN_READ | p::OPEN_WRITE | p::OPEN_EXEC, acl::MAY_READ)
        }
        Op::SetLock { ino, kind, .. } => match kind {
            p::LockKind::Read => c.through_open(*ino, acl::MAY_READ, acl::MAY_READ),
            p::LockKind::Write => c.through_open(*ino, acl::MAY_WRITE, acl::MAY_WRITE),
            p::LockKind::Unlock => Ok(()),
        },
        Op::GetLock { ino, .. } => {
            let inode = c.inode(*ino)?;
            if c.owns(&inode) || c.may(&inode, acl::MAY_READ)? || c.may(&inode, acl::MAY_WRITE)? {
                Ok(())
            } else {
                Err(denied(*ino, "test locks of"))
            }
        }
        Op::Create { parent, kind, mode, rdev, cred, .. } | Op::CreateAt { parent, kind, mode, rdev, cred, .. } => {
            c.create(*parent, *kind, mode, *rdev, cred)
        }
        Op::Symlink { parent, cred, .. } | Op::SymlinkAt { parent, cred, .. } => {
            c.need(*parent, acl::MAY_WRITE | acl::MAY_EXEC)?;
            c.own(cred);
            Ok(())
        }
        Op::Link { ino, parent, .. } => c.link(*ino, *parent),
        Op::Unlink { parent, name } | Op::Rmdir { parent, name } => c.remove(*parent, name),
        Op::Rename { parent, name, new_parent, new_name, flags } => {
            c.rename(*parent, name, *new_parent, new_name, *flags)
        }
        Op::SetAttr { ino, set } => c.setattr(*ino, set, now, client_time),
        Op::GetXattr { ino, name } => c.getxattr(*ino, name),
        Op::SetXattr { ino, name, flags, .. } => c.setxattr(*ino, name, Some(flags)),
        Op::RemoveXattr { ino, name } => c.setxattr(*ino, name, None),
    }
}

/// The mode a change of file data by `caller` (already mapped) leaves the file with when
/// it takes setuid or setgid away, as Linux's `file_remove_privs`: setuid, and setgid
/// where the group may execute the file or the caller is outside its group. The mount
/// clears them itself before it writes; the server does again, so that a client that
/// does not — or a writer its export squashes — cannot leave a setuid file rewritten.
/// Root keeps them (the server sees no capabilities: uid 0 stands for CAP_FSETID), and
/// so does the kernel's writeback of a shared mapping's pages (`WriteBack`), as on Linux.
/// A truncate's comes as the `SetAttr`'s own mode (`None` when it sets one itself).
pub fn killed_by_write(store: &mut s::Store, caller: &p::Caller, op: &Op) -> Option<(u64, u32)> {
    let ino = match op {
        Op::Write { ino, .. } | Op::Append { ino, .. } | Op::Fallocate { ino, .. } | Op::MapObject { ino, .. } => *ino,
        Op::SetAttr { ino, set } if set.size_bytes.is_some() && set.mode.is_none() => *ino,
        _ => return None,
    };
    if caller.uid == 0 {
        return None;
    }
    let inode = store.getattr(ino).ok()?;
    if inode.kind != s::FileKind::Regular {
        return None;
    }
    let mode = inode.mode & 0o7777;
    let mut kill = mode & names::S_ISUID;
    if mode & names::S_ISGID != 0 && (mode & names::S_IXGRP != 0 || !caller.in_group(inode.gid)) {
        kill |= names::S_ISGID;
    }
    (kill != 0).then_some((ino, mode & !kill))
}

/// The time a request's changes run at: the client's (`Request::time`, `Op::At`) when it
/// is within `MAX_CLOCK_SKEW` of the server's clock, else the server's. A session
/// replaying after a restart keeps its changes' original times, however old (they ran
/// at them before), but never one ahead of the server.
pub fn bound_time(client: p::Time, now: p::Time, replaying: bool) -> p::Time {
    let ahead = attrs::nanos(client) > attrs::nanos(now) + attrs::nanos(MAX_CLOCK_SKEW);
    if ahead || (!replaying && !attrs::near(client, now)) {
        now
    } else {
        client
    }
}

/// Whether `caller` may read the entries of directory `dir` (or whatever it names): a
/// `Lookup` needs only search permission, but its reply lists the neighbouring entries
/// of the name too; a caller who may not read the directory should get none of them.
pub fn may_list(store: &mut s::Store, caller: &p::Caller, dir: u64) -> Result<bool, p::OpError> {
    let policy = Policy::trusted();
    let mut c = Checker { store, policy: &policy, caller, opened: 0 };
    let inode = c.inode(dir)?;
    c.may(&inode, acl::MAY_READ)
}

/// Operations that change the file system (refused under a read-only policy, as is an
/// open for writing, as on a read-only mount). Written out whole, so that a new operation
/// needs a decision here.
fn changes(op: &Op) -> bool {
    match op {
        Op::Open { access, .. } => access & p::OPEN_WRITE != 0,
        Op::Create { .. }
        | Op::Symlink { .. }
        | Op::Link { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Rename { .. }
        | Op::SetAttr { .. }
        | Op::Write { .. }
        | Op::Append { .. }
        | Op::Fallocate { .. }
        | Op::WriteBack { .. }
        | Op::SetXattr { .. }
        | Op::RemoveXattr { .. }
        | Op::CreateAt { .. }
        | Op::SymlinkAt { .. }
        | Op::AllocInodes { .. }
        | Op::Uploads { .. }
        | Op::MapObject { .. } => true,
        Op::Lookup { .. }
        | Op::GetAttr { .. }
        | Op::ReadDir { .. }
        | Op::ReadLink { .. }
        | Op::Release { .. }
        | Op::Read { .. }
        | Op::Fsync { .. }
        | Op::StatFs
        | Op::GetXattr { .. }
        | Op::ListXattr { .. }
        | Op::At { .. }
        | Op::SetLock { .. }
        | Op::GetLock { .. }
        | Op::Acquire { .. }
        | Op::Reassert { .. } => false,
    }
}

fn refuse(errno: i32, message: impl Into<String>) -> p::OpError {
    p::OpError { errno, message: message.into() }
}

/// EACCES: the permission bits (or ACL) refuse.
fn denied(ino: u64, what: &str) -> p::OpError {
    refuse(13, format!("permission denied: may not {what} inode {ino}"))
}

/// EPERM: only the owner (or root) may.
fn not_permitted(ino: u64, what: &str) -> p::OpError {
    refuse(1, format!("operation not permitted: {what} of inode {ino}"))
}

/// One check's view: the store to look inodes up in, the policy, who asks, and what the
/// session's handles of the inode may do (`When::opened`).
struct Checker<'a> {
    store: &'a mut s::Store,
    policy: &'a Policy,
    caller: &'a p::Caller,
    opened: u32,
}

impl Checker<'_> {
    fn inode(&mut self, ino: u64) -> Result<s::Inode, p::OpError> {
        self.store.getattr(ino).map_err(|e| error_out(&e))
    }

    /// The inode `name` names in `dir`, if any (a name that is not there is the
    /// operation's own error to report).
    fn child(&mut self, dir: u64, name: &[u8]) -> Result<Option<s::Inode>, p::OpError> {
        match self.store.lookup(dir, name) {
            Ok(i) => Ok(Some(i)),
            Err(s::Error::NotFound(_) | s::Error::NotDir(_) | s::Error::NameTooLong { .. }) => Ok(None),
            Err(e) => Err(error_out(&e)),
        }
    }

    fn root(&self) -> bool {
        self.caller.uid == 0
    }

    fn owns(&self, inode: &s::Inode) -> bool {
        self.caller.uid == inode.uid
    }

    /// Owner or root (Linux's `inode_owner_or_capable`).
    fn owner_or_root(&self, inode: &s::Inode) -> bool {
        self.root() || self.owns(inode)
    }

    /// `acl::permits` for `inode`, with its access ACL if it has one. An ACL that does
    /// not parse (a damaged store) grants nothing but to root.
    fn may(&mut self, inode: &s::Inode, want: u32) -> Result<bool, p::OpError> {
        let entries = if inode.flags & s::fs::inode::FLAG_ACL_ACCESS != 0 && !self.root() {
            match self.store.getxattr(inode.ino, acl::ACCESS) {
                Ok(v) => Some(acl::parse(&v).unwrap_or_default()),
                Err(s::Error::NoXattr(_)) => None,
                Err(e) => return Err(error_out(&e)),
            }
        } else {
            None
        };
        let dir = if inode.kind == s::FileKind::Directory { acl::S_IFDIR } else { 0 };
        Ok(acl::permits(inode.mode | dir, inode.uid, inode.gid, entries.as_deref(), self.caller, want))
    }

    /// EACCES unless `want` is granted on `ino`.
    fn need(&mut self, ino: u64, want: u32) -> Result<(), p::OpError> {
        let inode = self.inode(ino)?;
        self.need_on(&inode, want)
    }

    fn need_on(&mut self, inode: &s::Inode, want: u32) -> Result<(), p::OpError> {
        if self.may(inode, want)? {
            Ok(())
        } else {
            Err(denied(inode.ino, what(want)))
        }
    }

    /// Open: the access asked (`p::OPEN_*`) as the kernel checks an open — but the owner
    /// may open for anything (an O_CREAT of a read-only file opens it for writing; and
    /// the owner may change the bits anyway). Only a directory's open asks nothing (each
    /// readdir is checked): a file's names an access, so that a session keeps alive only
    /// the unlinked files it may use.
    fn open(&mut self, ino: u64, access: u32) -> Result<(), p::OpError> {
        let want = access & (acl::MAY_READ | acl::MAY_WRITE | acl::MAY_EXEC);
        if access != want {
            return Err(refuse(22, format!("open of inode {ino}: unknown access bits {access:#x}")));
        }
        let inode = self.inode(ino)?;
        if want == 0 {
            if inode.kind == s::FileKind::Directory {
                return Ok(());
            }
            return Err(refuse(22, format!("open of inode {ino} asks for no access")));
        }
        if self.owns(&inode) {
            return Ok(());
        }
        self.need_on(&inode, want)
    }

    /// A read or write of `ino`'s data: through a handle open for any of `opened` (the
    /// open was checked), or as the caller may `want` (`need_or_owner`).
    fn through_open(&mut self, ino: u64, opened: u32, want: u32) -> Result<(), p::OpError> {
        if self.opened & opened != 0 {
            return Ok(());
        }
        self.need_or_owner(ino, want)
    }

    /// `need`, but the owner may whatever the bits say (as knfsd lets an owner use a file
    /// opened before a chmod, or created read-only with O_CREAT: the client's kernel
    /// checked the open, the server sees only the reads and writes after it).
    fn need_or_owner(&mut self, ino: u64, want: u32) -> Result<(), p::OpError> {
        let inode = self.inode(ino)?;
        if self.owns(&inode) {
            return Ok(());
        }
        self.need_on(&inode, want)
    }
}

fn what(want: u32) -> &'static str {
    match want {
        acl::MAY_READ => "read",
        acl::MAY_WRITE => "write",
        acl::MAY_EXEC => "search",
        _ if want & acl::MAY_WRITE != 0 => "change entries of",
        _ => "use",
    }
}
