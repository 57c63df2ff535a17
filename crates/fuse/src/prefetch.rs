//! Small files' data fetched a directory at a time (seed 003: one reply brings what a
//! whole leaf holds): the first read of a file that goes to the server also reads, in the
//! same request, every other small regular file its directory's last listing named, with
//! their attributes. The next reads of those files are answered here, with no round trip.
//!
//! Invariants:
//! - data is kept with the version `(mtime, ctime, size)` the server gave in the same
//!   request (a `GetAttr` beside the `Read`, run together by the server's one thread);
//! - it answers a read only while the mount's valid attributes of the file (under the
//!   server's recall protocol, or fresh) are that version — the rule by which the kernel
//!   keeps its page cache at open — and it goes at the first read that reaches the end
//!   of the file (the kernel's page cache has it from then on), at a mismatch, or when
//!   the kernel forgets the inode;
//! - a directory is read ahead once per listing; what is kept is bounded
//!   (`MAX_KEPT_BYTES`, the oldest going first; `MAX_TRACKED`), and overflowing only
//!   costs round trips.

use std::collections::{HashMap, HashSet, VecDeque};

use crest_proto as p;

/// Largest file read ahead with its directory.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
/// Most bytes of files one read-ahead request asks for (its reply is one frame).
pub const MAX_BATCH_BYTES: u64 = 1 << 20;
/// Most files one read-ahead request asks for (two operations each).
pub const MAX_BATCH_FILES: usize = 256;
/// Most bytes of data kept here at once.
pub const MAX_KEPT_BYTES: usize = 64 << 20;
/// Most directories' listings and files remembered (cleared beyond).
pub const MAX_TRACKED: usize = 1 << 20;

/// What a read of kept data must find the file to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    mtime: p::Time,
    ctime: p::Time,
    size: u64,
}

impl Version {
    /// The version attributes `a` describe.
    pub fn of(a: &p::Attr) -> Version {
        Version { mtime: a.mtime, ctime: a.ctime, size: a.size_bytes }
    }
}

/// The read-ahead state of a mount.
#[derive(Debug, Default)]
pub struct Prefetch {
    /// Each listed directory's small regular files (inode, size), in listing order.
    listed: HashMap<u64, Vec<(u64, u64)>>,
    /// The directory each of those files was listed in.
    dir_of: HashMap<u64, u64>,
    /// Directories read ahead since their last listing.
    done: HashSet<u64>,
    kept: HashMap<u64, (Version, Vec<u8>)>,
    kept_bytes: usize,
    /// Kept files, oldest first (some may have gone since).
    order: VecDeque<u64>,
}

impl Prefetch {
    /// A page of directory `dir`'s listing (`first`: it starts the listing).
    pub fn listed(&mut self, dir: u64, items: &[p::DirItem], first: bool) {
        if self.dir_of.len() >= MAX_TRACKED || self.listed.len() >= MAX_TRACKED {
            self.listed.clear();
            self.dir_of.clear();
            self.done.clear();
        }
        if first {
            self.done.remove(&dir);
            if let Some(old) = self.listed.remove(&dir) {
                for (ino, _) in old {
                    if self.dir_of.get(&ino) == Some(&dir) {
                        self.dir_of.remove(&ino);
                    }
                }
            }
        }
        let files = self.listed.entry(dir).or_default();
        for i in items {
            let a = &i.attr;
            if a.kind == p::FileType::Regular && a.size_bytes > 0 && a.size_bytes <= MAX_FILE_BYTES {
                files.push((a.ino, a.size_bytes));
                self.dir_of.insert(a.ino, dir);
            }
        }
    }

    /// A read of `ino` is going to the server: the other files of its directory to read
    /// with it, if that directory has not been read ahead since it was listed (and marks
    /// it read ahead). Files already kept are left out.
    pub fn batch_for(&mut self, ino: u64) -> Vec<u64> {
        let Some(&dir) = self.dir_of.get(&ino) else { return Vec::new() };
        if !self.done.insert(dir) {
            return Vec::new();
        }
        let (mut bytes, mut v) = (0u64, Vec::new());
        for &(f, size) in self.listed.get(&dir).into_iter().flatten() {
            if f == ino || self.kept.contains_key(&f) {
                continue;
            }
            if v.len() == MAX_BATCH_FILES || bytes + size > MAX_BATCH_BYTES {
                break;
            }
            bytes += size;
            v.push(f);
        }
        v
    }

    /// Data read ahead: `data` is the whole file at version `v`.
    pub fn keep(&mut self, ino: u64, v: Version, data: Vec<u8>) {
        if data.len() as u64 != v.size || data.len() > MAX_KEPT_BYTES {
            return;
        }
        self.drop_kept(ino);
        while self.kept_bytes + data.len() > MAX_KEPT_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            self.drop_kept(old);
        }
        if self.order.len() >= MAX_TRACKED {
            self.order.retain(|i| self.kept.contains_key(i));
        }
        self.kept_bytes += data.len();
        self.kept.insert(ino, (v, data));
        self.order.push_back(ino);
    }

    /// Answers a read of `len` bytes at `offset` from kept data if the file is at version
    /// `now` (the attributes the mount holds valid); a read reaching the end takes it.
    pub fn read(&mut self, ino: u64, now: Option<Version>, offset: u64, len: u32) -> Option<Vec<u8>> {
        let (v, data) = self.kept.get(&ino)?;
        if now != Some(*v) {
            self.drop_kept(ino);
            return None;
        }
        let start = offset.min(data.len() as u64) as usize;
        let end = offset.saturating_add(u64::from(len)).min(data.len() as u64) as usize;
        let out = data[start..end].to_vec();
        if end == data.len() {
            self.drop_kept(ino);
        }
        Some(out)
    }

    /// Whether data of `ino` is kept.
    pub fn has(&self, ino: u64) -> bool {
        self.kept.contains_key(&ino)
    }

    /// The kernel forgot `ino`.
    pub fn forget(&mut self, ino: u64) {
        self.drop_kept(ino);
    }

    fn drop_kept(&mut self, ino: u64) {
        if let Some((_, d)) = self.kept.remove(&ino) {
            self.kept_bytes -= d.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(ino: u64, kind: p::FileType, size: u64, mtime: i64) -> p::DirItem {
        p::DirItem {
            name: format!("f{ino}").into_bytes(),
            index: ino,
            attr: crate::inodes::tests::attr(ino, kind, mtime, size),
        }
    }

    #[test]
    fn a_directory_is_read_ahead_once_per_listing_and_only_its_small_files() {
        let mut p = Prefetch::default();
        let items = [
            item(10, p::FileType::Regular, 100, 1),
            item(11, p::FileType::Directory, 4096, 1),
            item(12, p::FileType::Regular, MAX_FILE_BYTES + 1, 1),
            item(13, p::FileType::Regular, 0, 1),
            item(14, p::FileType::Regular, MAX_FILE_BYTES, 1),
        ];
        p.listed(2, &items[..2], true);
        p.listed(2, &items[2..], false);
        assert_eq!(p.batch_for(99), Vec::<u64>::new(), "never listed");
        assert_eq!(p.batch_for(10), vec![14]);
        assert_eq!(p.batch_for(14), Vec::<u64>::new(), "once per listing");
        p.listed(2, &items, true);
        p.keep(10, Version::of(&items[0].attr), vec![7; 100]);
        assert_eq!(p.batch_for(14), Vec::<u64>::new(), "10 is kept already");
    }

    #[test]
    fn a_batch_stays_within_its_bytes_and_files() {
        let mut p = Prefetch::default();
        let items: Vec<p::DirItem> = (0..2000).map(|i| item(100 + i, p::FileType::Regular, 60_000, 1)).collect();
        p.listed(3, &items, true);
        let b = p.batch_for(100);
        assert_eq!(b.len() as u64, MAX_BATCH_BYTES / 60_000);
        assert!(!b.contains(&100));
        let items: Vec<p::DirItem> = (0..2000).map(|i| item(5000 + i, p::FileType::Regular, 1, 1)).collect();
        p.listed(4, &items, true);
        assert_eq!(p.batch_for(5000).len(), MAX_BATCH_FILES);
    }

    #[test]
    fn kept_data_answers_only_its_version_and_goes_at_the_end() {
        let mut p = Prefetch::default();
        let a = item(10, p::FileType::Regular, 10, 1).attr;
        let v = Version::of(&a);
        p.keep(10, v, b"0123456789".to_vec());
        assert_eq!(p.read(10, Some(v), 2, 3).as_deref(), Some(&b"234"[..]));
        assert_eq!(p.read(10, Some(v), 8, 4096).as_deref(), Some(&b"89"[..]));
        assert!(!p.has(10), "read to the end: the kernel has it");
        p.keep(10, v, b"0123456789".to_vec());
        let mut changed = a.clone();
        changed.ctime.nsec += 1;
        assert_eq!(p.read(10, Some(Version::of(&changed)), 0, 4), None);
        assert!(!p.has(10), "another version: dropped");
        p.keep(10, v, b"0123456789".to_vec());
        assert_eq!(p.read(10, None, 0, 4), None, "attributes not held: not answered here");
        p.keep(10, v, b"short".to_vec());
        assert!(!p.has(10), "data not of the version's size is not kept");
        p.keep(10, v, b"0123456789".to_vec());
        p.forget(10);
        assert!(!p.has(10));
        assert_eq!(p.kept_bytes, 0);
    }

    #[test]
    fn the_oldest_go_first_beyond_the_bound() {
        let mut p = Prefetch::default();
        let size = MAX_FILE_BYTES;
        let n = MAX_KEPT_BYTES as u64 / size;
        for ino in 0..n + 3 {
            let a = item(ino, p::FileType::Regular, size, 1).attr;
            p.keep(ino, Version::of(&a), vec![1; size as usize]);
            assert!(p.kept_bytes <= MAX_KEPT_BYTES);
        }
        assert!(!p.has(0) && !p.has(2) && p.has(3) && p.has(n + 2));
        // A file read to its end leaves a stale place in the order: harmless.
        let a = item(5, p::FileType::Regular, size, 1).attr;
        assert!(p.read(5, Some(Version::of(&a)), 0, size as u32).is_some());
        for ino in 1000..1003 {
            let a = item(ino, p::FileType::Regular, size, 1).attr;
            p.keep(ino, Version::of(&a), vec![1; size as usize]);
        }
        assert!(p.kept_bytes <= MAX_KEPT_BYTES && p.has(1002));
    }
}
