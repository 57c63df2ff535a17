//! Every inode number a message carries, rewritten by one function: how a server shows a
//! client a dataset other than the default one, whose root directory has another number
//! than the FUSE root (`1`) the client uses for it. The matches are exhaustive, so a new
//! field that carries an inode cannot be forgotten here.

use crate::message::{Attr, Notify, Op, Reply};

impl Op {
    /// Rewrites every inode number the operation names with `f`.
    pub fn map_inos(&mut self, f: &mut dyn FnMut(u64) -> u64) {
        match self {
            Op::StatFs | Op::At { .. } | Op::AllocInodes { .. } | Op::Uploads { .. } => {}
            Op::Lookup { parent, .. }
            | Op::Create { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::Unlink { parent, .. }
            | Op::Rmdir { parent, .. } => *parent = f(*parent),
            Op::Rename { parent, new_parent, .. } => {
                *parent = f(*parent);
                *new_parent = f(*new_parent);
            }
            Op::Link { ino, parent, .. } | Op::CreateAt { ino, parent, .. } | Op::SymlinkAt { ino, parent, .. } => {
                *ino = f(*ino);
                *parent = f(*parent);
            }
            Op::GetAttr { ino }
            | Op::SetAttr { ino, .. }
            | Op::ReadDir { ino, .. }
            | Op::ReadLink { ino }
            | Op::Open { ino, .. }
            | Op::Release { ino, .. }
            | Op::Read { ino, .. }
            | Op::Write { ino, .. }
            | Op::WriteBack { ino, .. }
            | Op::MapObject { ino, .. }
            | Op::Append { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::Fsync { ino }
            | Op::SetXattr { ino, .. }
            | Op::GetXattr { ino, .. }
            | Op::ListXattr { ino }
            | Op::RemoveXattr { ino, .. }
            | Op::SetLock { ino, .. }
            | Op::Acquire { ino }
            | Op::Reassert { ino, .. }
            | Op::GetLock { ino, .. } => *ino = f(*ino),
        }
    }
}

impl Attr {
    fn map_inos(&mut self, f: &mut dyn FnMut(u64) -> u64) {
        self.ino = f(self.ino);
    }
}

impl Reply {
    /// Rewrites every inode number the reply carries with `f` (a grant of new numbers,
    /// `Inodes`, names no existing inode and is left alone).
    pub fn map_inos(&mut self, f: &mut dyn FnMut(u64) -> u64) {
        match self {
            Reply::Attr(a) | Reply::Entry(a) | Reply::AttrOnly(a) => a.map_inos(f),
            Reply::Lookup { attr, leaf } => {
                if let Some(a) = attr {
                    a.map_inos(f);
                }
                leaf.items.iter_mut().for_each(|i| i.attr.map_inos(f));
            }
            Reply::Dir { items, .. } => items.iter_mut().for_each(|i| i.attr.map_inos(f)),
            Reply::Data(_)
            | Reply::Names(_)
            | Reply::StatFs(_)
            | Reply::Done
            | Reply::Inodes { .. }
            | Reply::Lock(_)
            | Reply::Uploads(_)
            | Reply::Located(_) => {}
        }
    }
}

impl Notify {
    /// Rewrites every inode number the notice carries with `f`.
    pub fn map_inos(&mut self, f: &mut dyn FnMut(u64) -> u64) {
        match self {
            Notify::ShuttingDown | Notify::Fenced => {}
            Notify::Recall { inodes, .. } | Notify::RecallPart { inodes, .. } => {
                inodes.iter_mut().for_each(|i| *i = f(*i))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::message::*;

    #[test]
    fn every_inode_number_is_mapped() {
        let mut op = Op::Rename { parent: 1, name: b"a".to_vec(), new_parent: 7, new_name: b"b".to_vec(), flags: 0 };
        op.map_inos(&mut |i| i + 100);
        assert_eq!(op.named_inodes(), vec![101, 107]);
        let mut op = Op::CreateAt {
            ino: 9,
            generation: 3,
            parent: 1,
            name: b"x".to_vec(),
            kind: FileType::Regular,
            mode: 0o644,
            rdev: 0,
            cred: Cred::default(),
        };
        op.map_inos(&mut |i| i * 2);
        assert_eq!(op.named_inodes(), vec![18, 2]);
        let mut n = Notify::Recall { recall_id: 4, inodes: vec![1, 2] };
        n.map_inos(&mut |i| i + 1);
        assert_eq!(n, Notify::Recall { recall_id: 4, inodes: vec![2, 3] });
    }
}
