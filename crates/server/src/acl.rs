//! POSIX ACLs kept in step with modes as operations run (the rules themselves are
//! `crest_proto::acl`'s, shared with clients answering under exclusive rights). Each
//! function runs inside the operation's unit, so the ACL and the mode change together
//! or not at all.

use crest_proto as p;
use crest_proto::acl;
use crest_store as s;
use s::fs::inode::{FLAG_ACL_ACCESS, FLAG_ACL_DEFAULT};

use crate::session::{errno, Failure};

/// What a new inode in `parent` gets from the parent's default ACL or the umask.
pub fn inherit(
    store: &mut s::Store,
    parent: u64,
    kind: s::FileKind,
    mode: u32,
    umask: u32,
) -> Result<acl::Inherited, s::Error> {
    let dir = store.getattr(parent)?;
    let default = if dir.flags & FLAG_ACL_DEFAULT != 0 { Some(store.getxattr(parent, acl::DEFAULT)?) } else { None };
    Ok(acl::inherit(default.as_deref(), kind == s::FileKind::Directory, kind == s::FileKind::Symlink, mode, umask))
}

/// Stores the ACLs a new inode inherited; returns the inode as it now is.
pub fn store_inherited(
    store: &mut s::Store,
    inode: s::Inode,
    got: &acl::Inherited,
    now: s::Timespec,
) -> Result<s::Inode, s::Error> {
    if got.access.is_none() && got.default.is_none() {
        return Ok(inode);
    }
    if let Some(v) = &got.access {
        store.setxattr(inode.ino, acl::ACCESS, v, now)?;
    }
    if let Some(v) = &got.default {
        store.setxattr(inode.ino, acl::DEFAULT, v, now)?;
    }
    store.getattr(inode.ino)
}

/// After a chmod of `ino` to `mode`: its access ACL's owner, mask (or group) and other
/// entries follow the new mode.
pub fn chmod(store: &mut s::Store, ino: u64, mode: u32, now: s::Timespec) -> Result<(), s::Error> {
    if store.getattr(ino)?.flags & FLAG_ACL_ACCESS == 0 {
        return Ok(());
    }
    let old = store.getxattr(ino, acl::ACCESS)?;
    let entries = acl::parse(&old).map_err(|e| s::Error::Corrupt {
        what: "xattr",
        block: 0,
        detail: format!("access ACL of inode {ino}: {}", e.0),
    })?;
    store.setxattr(ino, acl::ACCESS, &acl::encode(&acl::chmod(&entries, mode)), now)
}

/// Sets an ACL xattr as the kernel's `posix_acl_update_mode` asks: an access ACL
/// changes the mode, and one the mode alone can say is not stored. Refuses a value that
/// is not a valid ACL (EINVAL) and a default ACL on anything but a directory (EACCES).
pub fn set(
    store: &mut s::Store,
    ino: u64,
    name: &[u8],
    value: &[u8],
    flags: u32,
    now: s::Timespec,
) -> Result<(), Failure> {
    let entries = acl::parse(value).map_err(|e| Failure::Wire(errno(22, format!("{}: {}", show(name), e.0))))?;
    let inode = store.getattr(ino)?;
    if name == acl::DEFAULT {
        if inode.kind != s::FileKind::Directory {
            return Err(Failure::Wire(errno(13, format!("default ACL on inode {ino}, not a directory"))));
        }
        return Ok(store.setxattr(ino, name, &acl::encode(&entries), now)?);
    }
    let (mode, stored) = acl::update_mode(inode.mode, &entries, flags & p::XATTR_ACL_KILL_SGID != 0);
    match stored {
        Some(v) => store.setxattr(ino, name, &v, now)?,
        None if inode.flags & FLAG_ACL_ACCESS != 0 => store.removexattr(ino, name, now)?,
        None => {}
    }
    if mode != inode.mode {
        store.setattr(ino, &s::SetAttr { mode: Some(mode), ..Default::default() }, now)?;
    }
    Ok(())
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Server;
    use acl::{Entry, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    use p::{Op, Reply};

    const NOW: p::Time = p::Time { sec: 5, nsec: 0 };

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    /// owner rwx, user 1000 rwx, group r-x, mask `mask`, other `other`.
    fn named(mask: u16, other: u16) -> Vec<Entry> {
        vec![e(USER_OBJ, 7, 0), e(USER, 7, 1000), e(GROUP_OBJ, 5, 0), e(MASK, mask, 0), e(OTHER, other, 0)]
    }

    struct T {
        srv: Server,
        sid: crate::SessionId,
        id: u64,
    }

    impl T {
        fn new() -> T {
            let disk = s::MemDisk::new(16 << 20);
            let opts = s::MkfsOptions { now: s::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 };
            s::Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
            let mut srv = Server::new(s::Store::open(Box::new(disk)).expect("open"));
            let hello = p::Hello {
                magic: p::HELLO_MAGIC,
                version: p::PROTOCOL_VERSION,
                client_name: "t".into(),
                resume: None,
                dataset: String::new(),
            };
            let sid = srv.handle_hello(&hello).0.expect("session");
            T { srv, sid, id: 0 }
        }

        fn run(&mut self, op: Op) -> Result<Reply, p::OpError> {
            self.id += 1;
            let r = self.srv.handle_request(
                self.sid,
                p::Request { id: self.id, ops: vec![op], time: None, caller: p::Caller::ROOT },
                NOW,
            );
            r.results.into_iter().next().expect("one result")
        }

        fn attr(&mut self, ino: u64) -> p::Attr {
            match self.run(Op::GetAttr { ino }) {
                Ok(Reply::Attr(a)) => a,
                r => panic!("{r:?}"),
            }
        }

        fn xattr(&mut self, ino: u64, name: &[u8]) -> Option<Vec<Entry>> {
            match self.run(Op::GetXattr { ino, name: name.to_vec() }) {
                Ok(Reply::Data(v)) => Some(acl::parse(&v).expect("stored ACLs are valid")),
                Err(e) if e.errno == 61 => None,
                r => panic!("{r:?}"),
            }
        }

        fn create(&mut self, parent: u64, name: &str, kind: p::FileType, mode: u32, umask: u32) -> p::Attr {
            let cred = p::Cred { uid: 0, gid: 0, umask };
            let op = Op::Create { parent, name: name.as_bytes().to_vec(), kind, mode, rdev: 0, cred };
            match self.run(op) {
                Ok(Reply::Entry(a)) => a,
                r => panic!("{r:?}"),
            }
        }

        fn set(&mut self, ino: u64, name: &[u8], value: Vec<u8>, flags: u32) -> Result<Reply, p::OpError> {
            self.run(Op::SetXattr { ino, name: name.to_vec(), value, flags })
        }
    }

    fn canon(v: Vec<Entry>) -> Vec<Entry> {
        acl::parse(&acl::encode(&v)).expect("valid")
    }

    #[test]
    fn new_inodes_take_the_default_acl_instead_of_the_umask() {
        let mut t = T::new();
        let d = t.create(1, "d", p::FileType::Directory, 0o777, 0o022);
        assert_eq!((d.mode, d.flags), (0o755, 0), "no default ACL: the umask applies");
        t.set(d.ino, acl::DEFAULT, acl::encode(&named(7, 0)), 0).expect("set default");
        assert_eq!(t.attr(d.ino).flags, acl::HAS_DEFAULT);
        let f = t.create(d.ino, "f", p::FileType::Regular, 0o666, 0o077);
        assert_eq!(f.mode, 0o660, "owner rw, mask rw from the mode, other none; the umask does not apply");
        assert_eq!(f.flags, acl::HAS_ACCESS);
        let want = canon(vec![e(USER_OBJ, 6, 0), e(USER, 7, 1000), e(GROUP_OBJ, 5, 0), e(MASK, 6, 0), e(OTHER, 0, 0)]);
        assert_eq!(t.xattr(f.ino, acl::ACCESS), Some(want));
        let sub = t.create(d.ino, "sub", p::FileType::Directory, 0o750, 0o077);
        assert_eq!((sub.mode, sub.flags), (0o750, acl::HAS_ACCESS | acl::HAS_DEFAULT));
        assert_eq!(t.xattr(sub.ino, acl::DEFAULT), Some(canon(named(7, 0))), "directories pass it on");
        let fifo = t.create(sub.ino, "p", p::FileType::Fifo, 0o644, 0o077);
        assert_eq!(fifo.mode, 0o640, "inherited again one level down");
    }

    #[test]
    fn chmod_rewrites_the_access_acl() {
        let mut t = T::new();
        let f = t.create(1, "f", p::FileType::Regular, 0o644, 0);
        t.set(f.ino, acl::ACCESS, acl::encode(&named(7, 4)), 0).expect("set");
        assert_eq!(t.attr(f.ino).mode, 0o774, "the mask is the group class");
        let set = p::SetAttr { mode: Some(0o2604), ..Default::default() };
        let r = t.run(Op::SetAttr { ino: f.ino, set });
        assert!(matches!(r, Ok(Reply::Attr(ref a)) if a.mode == 0o2604), "{r:?}");
        let want = canon(vec![e(USER_OBJ, 6, 0), e(USER, 7, 1000), e(GROUP_OBJ, 5, 0), e(MASK, 0, 0), e(OTHER, 4, 0)]);
        assert_eq!(t.xattr(f.ino, acl::ACCESS), Some(want));
    }

    #[test]
    fn an_acl_the_mode_can_say_is_not_kept() {
        let mut t = T::new();
        let f = t.create(1, "f", p::FileType::Regular, 0o2666, 0);
        t.set(f.ino, acl::ACCESS, acl::encode(&named(7, 4)), 0).expect("set");
        let minimal = acl::encode(&[e(USER_OBJ, 7, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]);
        t.set(f.ino, acl::ACCESS, minimal, 0).expect("set minimal");
        let a = t.attr(f.ino);
        assert_eq!((a.mode, a.flags), (0o2750, 0), "mode from the ACL; no xattr kept");
        assert_eq!(t.xattr(f.ino, acl::ACCESS), None);
        t.set(f.ino, acl::ACCESS, acl::encode(&named(6, 4)), p::XATTR_ACL_KILL_SGID).expect("set");
        assert_eq!(t.attr(f.ino).mode, 0o764, "setgid cleared for a caller outside the group");
    }

    #[test]
    fn bad_acls_are_refused() {
        let mut t = T::new();
        let f = t.create(1, "f", p::FileType::Regular, 0o644, 0);
        let errno = |r: Result<Reply, p::OpError>| r.err().map(|e| e.errno);
        assert_eq!(errno(t.set(f.ino, acl::ACCESS, vec![2, 0, 0, 0, 1], 0)), Some(22));
        let no_mask = acl::encode(&[e(USER_OBJ, 7, 0), e(USER, 7, 5), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]);
        assert_eq!(errno(t.set(f.ino, acl::ACCESS, no_mask, 0)), Some(22));
        assert_eq!(errno(t.set(f.ino, acl::DEFAULT, acl::encode(&named(7, 0)), 0)), Some(13), "default on a file");
        let a = t.attr(f.ino);
        assert_eq!((a.mode, a.flags), (0o644, 0), "nothing changed");
    }
}
