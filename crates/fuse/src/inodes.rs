//! What the FUSE layer remembers about inodes the kernel holds: a directory's parent (for
//! the ".." entry of a listing) and the version of a file the kernel's page cache holds
//! (to decide `FOPEN_KEEP_CACHE`).
//!
//! Invariants:
//! - `page_cache[ino]` is the (mtime, size) of the file as of the last open, create or
//!   change made through this mount; if the server's attributes at the next open differ,
//!   someone else changed the file and the kernel must drop its cached pages;
//! - entries go when the kernel forgets the inode (its page cache and dentries went with
//!   it); both maps are capped at `MAX_TRACKED_INODES` and simply cleared beyond, which
//!   only costs a refetch of pages and a less precise "..";
//! - the root is its own parent; an unknown directory's ".." names the directory itself.

use std::collections::HashMap;

use crest_proto as p;

/// Most inodes either map tracks (far more than the kernel keeps in its inode cache).
pub const MAX_TRACKED_INODES: usize = 1 << 20;

/// The FUSE root inode (crest's root has the same number).
pub const ROOT_INO: u64 = 1;

/// Per-inode memory of the mount.
#[derive(Debug, Default)]
pub struct Inodes {
    parents: HashMap<u64, u64>,
    page_cache: HashMap<u64, (p::Time, u64)>,
}

impl Inodes {
    /// Records that directory `dir` lives in `parent`.
    pub fn set_parent(&mut self, dir: u64, parent: u64) {
        if dir == ROOT_INO {
            return;
        }
        if self.parents.len() >= MAX_TRACKED_INODES && !self.parents.contains_key(&dir) {
            self.parents.clear();
        }
        self.parents.insert(dir, parent);
    }

    /// Records what an entry reply taught us: a directory `attr` found in `parent`.
    pub fn learn(&mut self, parent: u64, attr: &p::Attr) {
        if attr.kind == p::FileType::Directory {
            self.set_parent(attr.ino, parent);
        }
    }

    /// The inode ".." of `dir` should name.
    pub fn parent(&self, dir: u64) -> u64 {
        if dir == ROOT_INO {
            return ROOT_INO;
        }
        self.parents.get(&dir).copied().unwrap_or(dir)
    }

    /// At open: may the kernel keep the pages it has for this file? Records the version
    /// it will hold from now on either way.
    pub fn keep_cache_on_open(&mut self, attr: &p::Attr) -> bool {
        let now = (attr.mtime, attr.size_bytes);
        if self.page_cache.len() >= MAX_TRACKED_INODES && !self.page_cache.contains_key(&attr.ino) {
            self.page_cache.clear();
        }
        self.page_cache.insert(attr.ino, now) == Some(now)
    }

    /// After a change made through this mount (write, truncate, utimes, fallocate): the
    /// kernel's pages already reflect it (it wrote or truncated them itself), so the new
    /// version is the one it holds.
    pub fn changed_here(&mut self, attr: &p::Attr) {
        if let Some(v) = self.page_cache.get_mut(&attr.ino) {
            *v = (attr.mtime, attr.size_bytes);
        }
    }

    /// The kernel evicted `ino`.
    pub fn forget(&mut self, ino: u64) {
        self.parents.remove(&ino);
        self.page_cache.remove(&ino);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Attributes for tests (also `crate::prefetch`'s).
    pub(crate) fn attr(ino: u64, kind: p::FileType, mtime: i64, size: u64) -> p::Attr {
        p::Attr {
            ino,
            generation: 1,
            kind,
            mode: 0o755,
            nlink: 1,
            uid: 0,
            gid: 0,
            size_bytes: size,
            blocks_4k: 0,
            rdev: 0,
            atime: p::Time::default(),
            mtime: p::Time { sec: mtime, nsec: 0 },
            ctime: p::Time::default(),
            crtime: p::Time::default(),
            flags: 0,
        }
    }

    #[test]
    fn parents() {
        let mut t = Inodes::default();
        assert_eq!(t.parent(ROOT_INO), ROOT_INO);
        assert_eq!(t.parent(5), 5);
        t.learn(ROOT_INO, &attr(5, p::FileType::Directory, 0, 0));
        t.learn(5, &attr(6, p::FileType::Regular, 0, 0));
        t.learn(5, &attr(ROOT_INO, p::FileType::Directory, 0, 0));
        assert_eq!(t.parent(5), ROOT_INO);
        assert_eq!(t.parent(6), 6);
        assert_eq!(t.parent(ROOT_INO), ROOT_INO);
        t.set_parent(5, 9);
        assert_eq!(t.parent(5), 9);
        t.forget(5);
        assert_eq!(t.parent(5), 5);
    }

    #[test]
    fn keep_cache_only_when_unchanged() {
        let mut t = Inodes::default();
        let a = attr(7, p::FileType::Regular, 100, 10);
        assert!(!t.keep_cache_on_open(&a)); // first open: nothing cached to keep
        assert!(t.keep_cache_on_open(&a));
        assert!(!t.keep_cache_on_open(&attr(7, p::FileType::Regular, 101, 10))); // changed elsewhere
        assert!(!t.keep_cache_on_open(&attr(7, p::FileType::Regular, 101, 11)));
        // Our own write: the kernel's pages are current.
        let w = attr(7, p::FileType::Regular, 102, 20);
        t.changed_here(&w);
        assert!(t.keep_cache_on_open(&w));
        // Changes to files never opened are not tracked.
        t.changed_here(&attr(8, p::FileType::Regular, 1, 1));
        assert!(!t.keep_cache_on_open(&attr(8, p::FileType::Regular, 1, 1)));
        t.forget(7);
        assert!(!t.keep_cache_on_open(&w));
    }
}
