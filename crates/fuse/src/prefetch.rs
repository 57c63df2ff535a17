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
//! - a file is read ahead at most once per listing of its directory: a read that goes to
//!   the server takes the files listed after it (then those before it) not yet read
//!   ahead, so a directory larger than one batch costs a round trip per batch, not one per
//!   file beyond the first batch; what is kept is bounded (`MAX_KEPT_BYTES`, the oldest
//!   going first; `MAX_TRACKED`), and overflowing only costs round trips;
//! - the read that goes to the server waits only for its own file and the next few
//!   (`NOW_FILES`); the next batch is read *ahead*, behind it, by a thread of its own, and
//!   the batch after that when the first file of the last one is read (so a reader going
//!   through a directory in listing order finds its files here and the server reads the
//!   next ones meanwhile). A file being read ahead is *pending*: its reader waits for it
//!   (at most `PENDING_WAIT`) rather than asking the server a second time.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crest_proto as p;

/// Largest file read ahead with its directory.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Most bytes of files one read-ahead request asks for (its reply is one frame).
pub const MAX_BATCH_BYTES: u64 = 1 << 20;
/// Most files one read-ahead request asks for (two operations each).
pub const MAX_BATCH_FILES: usize = 256;
/// Most bytes of data kept here at once.
pub const MAX_KEPT_BYTES: usize = 64 << 20;
/// Most directories' listings and files remembered (cleared beyond).
pub const MAX_TRACKED: usize = 1 << 20;
/// Most files, and bytes, the read that goes to the server waits for besides its own.
pub const NOW_FILES: usize = 8;
pub const NOW_BYTES: u64 = 128 * 1024;
/// Longest a read waits for its file to be read ahead before it asks the server itself.
pub const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Files of a batch per lookup of their names sent with it (a lookup brings up to 64
/// names around the one asked for).
const PROBE_EVERY: usize = 24;
/// Most directories a batch read ahead looks through for files left to read.
const MAX_DIRS_SCANNED: usize = 16;
/// Most listed files one batch looks at past those already read ahead (a directory read
/// in no order must not cost a scan of its whole listing per read).
const MAX_SCANNED: usize = 4 * MAX_BATCH_FILES;

/// Files to read ahead: each inode with its size when listed (what its read asks for).
pub type Batch = Vec<(u64, u64)>;

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

    /// The file's size in this version.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// The read-ahead state of a mount.
#[derive(Debug, Default)]
pub struct Prefetch {
    /// Each listed directory's small regular files (inode, size), in listing order.
    listed: HashMap<u64, Vec<(u64, u64)>>,
    /// The directory each of those files was listed in, its place in that listing, and
    /// its name (a batch looks some up again, to hold their directory's names when its
    /// files are read: `lookups_for`).
    place: HashMap<u64, (u64, usize, Vec<u8>)>,
    /// Files read ahead (or being read) since their directory's last listing.
    fetched: HashSet<u64>,
    /// Each directory's place in its listing after the last file batched.
    cursor: HashMap<u64, usize>,
    /// Files being read ahead.
    pending: HashSet<u64>,
    /// The first file of a batch read ahead → its directory: reading it reads the next.
    trigger: HashMap<u64, u64>,
    /// Directories in the order they were last listed (sequence number → directory), and
    /// each one's number: a directory read to its end is followed by the next listed, as
    /// `find` lists directories in the order it then prints their files in.
    sequence: BTreeMap<u64, u64>,
    seq_of: HashMap<u64, u64>,
    next_seq: u64,
    kept: HashMap<u64, (Version, Vec<u8>)>,
    kept_bytes: usize,
    /// Kept files, oldest first (some may have gone since).
    order: VecDeque<u64>,
}

impl Prefetch {
    /// A page of directory `dir`'s listing (`first`: it starts the listing).
    pub fn listed(&mut self, dir: u64, items: &[p::DirItem], first: bool) {
        if self.place.len() >= MAX_TRACKED || self.listed.len() >= MAX_TRACKED || self.fetched.len() >= MAX_TRACKED {
            self.listed.clear();
            self.place.clear();
            self.fetched.clear();
            self.cursor.clear();
            self.trigger.clear();
            self.sequence.clear();
            self.seq_of.clear();
        }
        if first {
            if let Some(old) = self.seq_of.insert(dir, self.next_seq) {
                self.sequence.remove(&old);
            }
            self.sequence.insert(self.next_seq, dir);
            self.next_seq += 1;
            self.cursor.remove(&dir);
            if let Some(old) = self.listed.remove(&dir) {
                for (ino, _) in old {
                    if self.place.get(&ino).is_some_and(|&(d, ..)| d == dir) {
                        self.place.remove(&ino);
                        self.fetched.remove(&ino);
                    }
                }
            }
        }
        let files = self.listed.entry(dir).or_default();
        for i in items {
            let a = &i.attr;
            if a.kind == p::FileType::Regular && a.size_bytes > 0 && a.size_bytes <= MAX_FILE_BYTES {
                self.place.insert(a.ino, (dir, files.len(), i.name.clone()));
                self.fetched.remove(&a.ino);
                files.push((a.ino, a.size_bytes));
            }
        }
    }

    /// A read of `ino` is going to the server: the other files of its directory to read
    /// with it (`now`, at most `NOW_FILES`) and, if `ahead`, the batch to read behind it
    /// (marked pending) — those listed after it, then those before, that were not read
    /// ahead since the listing (they are marked so now) and are not kept.
    pub fn batch_for(&mut self, ino: u64, ahead: bool) -> (Batch, Batch) {
        let Some(&(dir, at, _)) = self.place.get(&ino) else { return (Vec::new(), Vec::new()) };
        self.fetched.insert(ino);
        let now = self.take(dir, at + 1, ino, NOW_FILES, NOW_BYTES);
        let ahead = if ahead { self.ahead(dir, ino) } else { Vec::new() };
        (now, ahead)
    }

    /// A read of `ino` was answered here: the next batch of its directory to read ahead
    /// (marked pending), when `ino` was the first of the last one.
    pub fn hit(&mut self, ino: u64) -> Batch {
        match self.trigger.remove(&ino) {
            Some(dir) => self.ahead(dir, ino),
            None => Vec::new(),
        }
    }

    /// Names to look up with `batch` (directory, name): the first file of each directory
    /// in it, and one in every `PROBE_EVERY` listed after — a lookup's reply brings the
    /// stretch of names around the one asked for (docs/protocol.md §3), so the reader's
    /// own lookups of these files, when it comes to them, are answered by the mount.
    pub fn lookups_for(&self, batch: &[(u64, u64)]) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        let mut last: Option<(u64, usize)> = None;
        for (f, _) in batch {
            let Some((dir, at, name)) = self.place.get(f) else { continue };
            let (dir, at) = (*dir, *at);
            if last.is_none_or(|(d, probed)| d != dir || at >= probed + PROBE_EVERY || at < probed) {
                v.push((dir, name.clone()));
                last = Some((dir, at));
            }
        }
        v
    }

    /// A batch read ahead came back (or failed): its files are no longer pending.
    pub fn landed(&mut self, files: &[(u64, u64)]) {
        for (f, _) in files {
            self.pending.remove(f);
        }
    }

    /// Whether `ino` is being read ahead.
    pub fn pending(&self, ino: u64) -> bool {
        self.pending.contains(&ino)
    }

    /// The next batch of `dir` to read ahead — or, when nothing of it is left, of the
    /// first directory listed after it that has something — marked pending, its first
    /// file the trigger of the next.
    fn ahead(&mut self, dir: u64, from: u64) -> Batch {
        let mut d = dir;
        for _ in 0..MAX_DIRS_SCANNED {
            let start = self.cursor.get(&d).copied().unwrap_or(0);
            let v = self.take(d, start, from, MAX_BATCH_FILES, MAX_BATCH_BYTES);
            if let Some(&(first, _)) = v.first() {
                self.trigger.insert(first, d);
                self.pending.extend(v.iter().map(|&(f, _)| f));
                return v;
            }
            let Some(&seq) = self.seq_of.get(&d) else { break };
            let Some((_, &next)) = self.sequence.range(seq + 1..).next() else { break };
            d = next;
        }
        Vec::new()
    }

    /// Up to `max_files` files (`max_bytes`) of `dir` not read ahead since the listing,
    /// nor kept, nor `skip`, looking from place `start` on, then from the listing's start;
    /// marks them read ahead and moves the directory's cursor past the last.
    fn take(&mut self, dir: u64, start: usize, skip: u64, max_files: usize, max_bytes: u64) -> Batch {
        let Some(files) = self.listed.get(&dir) else { return Vec::new() };
        let start = start.min(files.len());
        let (mut bytes, mut v, mut last) = (0u64, Vec::new(), None);
        let order = (start..files.len()).chain(0..start).take(MAX_SCANNED);
        for i in order {
            let (f, size) = files[i];
            if v.len() == max_files || bytes + size > max_bytes {
                break;
            }
            if f == skip || self.kept.contains_key(&f) || !self.fetched.insert(f) {
                continue;
            }
            bytes += size;
            v.push((f, size));
            last = Some(i);
        }
        if let Some(i) = last {
            self.cursor.insert(dir, i + 1);
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
    fn a_file_is_read_ahead_once_per_listing_and_only_small_files_are() {
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
        assert_eq!(p.batch_for(99, true), (Vec::new(), Vec::new()), "never listed");
        // (Larger than what the read that goes to the server waits for: read behind it.)
        assert_eq!(p.batch_for(10, true), (Vec::new(), vec![(14, MAX_FILE_BYTES)]));
        assert_eq!(p.batch_for(14, true), (Vec::new(), Vec::new()), "once per listing");
        p.listed(2, &items, true);
        p.keep(10, Version::of(&items[0].attr), vec![7; 100]);
        assert_eq!(p.batch_for(14, false).0, Vec::new(), "10 is kept already");
        p.forget(10);
        p.listed(2, &items, true);
        assert_eq!(
            p.batch_for(14, false).0,
            vec![(10, 100)],
            "listed again: read ahead again, from the start after the end"
        );
    }

    #[test]
    fn a_directory_larger_than_a_batch_is_read_ahead_batch_by_batch_in_any_order() {
        // Seeded and printed: which file misses first, and the order of the misses after.
        let seed =
            std::env::var("CREST_PREFETCH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
        eprintln!("CREST_PREFETCH_SEED={seed}");
        let mut rng = crest_rng::Stream::from_seed_u64(seed);
        let mut next = |n: u64| rng.below(n);
        let n = 1000 + next(2000);
        let items: Vec<p::DirItem> =
            (0..n).map(|i| item(100 + i, p::FileType::Regular, 1 + next(MAX_FILE_BYTES), 1)).collect();
        let mut p = Prefetch::default();
        // Split among directories listed one after the other (as `find` lists them), each
        // in pages; another directory listed before them all, and one after.
        let dirs = 1 + next(5) as usize;
        p.listed(2, &[item(1, p::FileType::Regular, 10, 1)], true);
        for (d, files) in items.chunks(items.len().div_ceil(dirs)).enumerate() {
            for (k, page) in files.chunks(1 + next(300) as usize).enumerate() {
                p.listed(3 + d as u64, page, k == 0);
            }
        }
        p.listed(1, &[item(2, p::FileType::Regular, 10, 1)], true);
        let mut sizes: HashMap<u64, u64> = items.iter().map(|i| (i.attr.ino, i.attr.size_bytes)).collect();
        sizes.extend([(1, 10), (2, 10)]);
        let in_order = next(2) == 0;
        let ahead = next(3) != 0;
        eprintln!("{n} files in {dirs} directories, in order: {in_order}, read ahead: {ahead}");
        // Every file comes once: as a read that goes to the server, or read with one, or
        // ahead (landing at once here).
        let mut seen = HashSet::new();
        let fetch = |p: &mut Prefetch, seen: &mut HashSet<u64>, b: Batch, max: (usize, u64), pending: bool| {
            let (max_files, max_bytes) = max;
            let bytes: u64 = b.iter().map(|&(_, size)| size).sum();
            assert!(b.len() <= max_files && bytes <= max_bytes, "seed {seed}: batch too large");
            for &(f, size) in &b {
                assert_eq!(size, sizes[&f], "seed {seed}: {f}'s size as listed");
                assert!(seen.insert(f), "seed {seed}: {f} read ahead twice");
                assert_eq!(p.pending(f), pending, "seed {seed}: {f} pending");
            }
            p.landed(&b);
        };
        let mut trips = 0;
        for k in 0..n {
            let ino = if in_order { 100 + k } else { 100 + next(n) };
            if seen.contains(&ino) {
                let b = p.hit(ino);
                fetch(&mut p, &mut seen, b, (MAX_BATCH_FILES, MAX_BATCH_BYTES), true);
                continue;
            }
            trips += 1;
            seen.insert(ino);
            let (now, behind) = p.batch_for(ino, ahead);
            fetch(&mut p, &mut seen, now, (NOW_FILES, NOW_BYTES), false);
            fetch(&mut p, &mut seen, behind, (MAX_BATCH_FILES, MAX_BATCH_BYTES), true);
        }
        if in_order {
            // Read in listing order, only the first read goes to the server when batches
            // are read ahead, the next directory's behind the last; without, each batch
            // is full but for the last of each directory.
            let total: u64 = sizes.values().sum();
            let most = if ahead { 1 } else { (total / (NOW_BYTES / 2) + n / NOW_FILES as u64 + 2) as usize + dirs };
            assert!(trips <= most, "seed {seed}: {trips} round trips for {n} files, want at most {most}");
        }
    }

    #[test]
    fn a_batch_looks_up_a_name_per_stretch_of_each_directory() {
        let mut p = Prefetch::default();
        let a: Vec<p::DirItem> = (0..60).map(|i| item(100 + i, p::FileType::Regular, 10, 1)).collect();
        let b: Vec<p::DirItem> = (0..5).map(|i| item(200 + i, p::FileType::Regular, 10, 1)).collect();
        p.listed(1, &a, true);
        p.listed(2, &b, true);
        let batch: Vec<(u64, u64)> = (100..160).chain(200..205).map(|f| (f, 10)).collect();
        let got: Vec<(u64, Vec<u8>)> = p.lookups_for(&batch);
        let want: Vec<(u64, Vec<u8>)> =
            [(1, 100), (1, 100 + PROBE_EVERY as u64), (1, 100 + 2 * PROBE_EVERY as u64), (2, 200)]
                .into_iter()
                .map(|(d, f)| (d, format!("f{f}").into_bytes()))
                .collect();
        assert_eq!(got, want);
        // Out of listing order: a file before the last probe is probed again.
        let got = p.lookups_for(&[(130, 10), (101, 10), (102, 10)]);
        assert_eq!(got.len(), 2);
        assert!(p.lookups_for(&[(999, 1)]).is_empty(), "never listed");
    }

    #[test]
    fn a_batch_stays_within_its_bytes_and_files() {
        let mut p = Prefetch::default();
        let items: Vec<p::DirItem> = (0..2000).map(|i| item(100 + i, p::FileType::Regular, 60_000, 1)).collect();
        p.listed(3, &items, true);
        let (now, b) = p.batch_for(100, true);
        assert_eq!(now.len() as u64, NOW_BYTES / 60_000);
        assert_eq!(b.len() as u64, MAX_BATCH_BYTES / 60_000);
        assert!(b.iter().chain(&now).all(|&(f, _)| f != 100));
        let items: Vec<p::DirItem> = (0..2000).map(|i| item(5000 + i, p::FileType::Regular, 1, 1)).collect();
        p.listed(4, &items, true);
        let (now, b) = p.batch_for(5000, true);
        assert_eq!((now.len(), b.len()), (NOW_FILES, MAX_BATCH_FILES));
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
