//! Arbitrary operation sequences on a fresh 8 MiB image behind a `FailingDisk` that fails
//! every write and flush from an arbitrary point on (countdown 0..2000).
//!
//! A model of one flat directory (name → kind, bytes, xattrs) predicts every outcome:
//! success or the exact error class. I/O errors end the run (the store is poisoned);
//! `NoSpace` reopens the image, since an operation that ran out of space half way leaves
//! its transaction in a state the model does not know. The model keeps the namespace of
//! the last successful commit; commits the store makes by itself (when space runs low,
//! before an operation changes anything) are noticed through the generation.
//!
//! After the run the store is dropped without committing, and on the plain `MemDisk`:
//! fsck is clean, `Store::open` succeeds, and the namespace is the last committed one or,
//! if the run ended in an I/O failure, possibly the one the failing call was committing.
//! Finally a file is written and committed on the recovered image and fsck is run again,
//! so that a wrongly rebuilt allocator (live blocks handed out again) shows.
//!
//! The store must never panic: a panic anywhere is a crash libFuzzer reports.

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use crest_rng::Stream;
use crest_store::checksum::crc32c;
use crest_store::crash::FailingDisk;
use crest_store::{
    check, CommitPolicy, Error, FileKind, Inode, MemDisk, MkfsOptions, RenameFlags, SetAttr, Store, Timespec, ROOT_INO,
};
use libfuzzer_sys::fuzz_target;

const IMAGE_BYTES: u64 = 8 << 20;
const NAMES: u8 = 8;
const XATTR_NAMES: u8 = 4;
const MAX_OPS: usize = 128;
const MAX_WRITE: u32 = 64 * 1024;
const MAX_OFFSET: u32 = 1024 * 1024;
const MAX_SIZE: u32 = 1280 * 1024;
const MAX_REPEAT: u8 = 4;
const MAX_FILL_CHUNKS: u8 = 128;
const MAX_XATTR_VALUE: u16 = 1000;
const NOW: Timespec = Timespec::new(1, 0);

#[derive(Arbitrary, Debug)]
enum FuzzOp {
    Create {
        name: u8,
        dir: bool,
    },
    /// `len % (64 KiB + 1)` bytes at `offset % 1 MiB`, generated from `seed`; then as
    /// many again right after, `repeat % 4` times.
    Write {
        name: u8,
        offset: u32,
        len: u32,
        seed: u8,
        repeat: u8,
    },
    /// `1 + chunks % 128` writes of 64 KiB one after the other from `offset % 1 MiB`: up
    /// to 8 MiB, so that one operation can fill the image and reach the space reserve,
    /// the commits it makes by itself, and `NoSpace`.
    Fill {
        name: u8,
        offset: u32,
        seed: u8,
        chunks: u8,
    },
    /// `size % 1.25 MiB`.
    Truncate {
        name: u8,
        size: u32,
    },
    /// unlink for files, rmdir for directories.
    Unlink {
        name: u8,
    },
    Rename {
        from: u8,
        to: u8,
    },
    SetXattr {
        name: u8,
        xname: u8,
        len: u16,
        seed: u8,
    },
    Commit,
    /// Drop the store without committing and open the image again.
    Reopen,
}

/// Writes and flushes that succeed before every later one fails, in 0..2000. Runs of
/// this size issue a few hundred at most, so small countdowns get their own variant.
#[derive(Arbitrary, Debug)]
enum Countdown {
    Soon(u8),
    Any(u16),
}

impl Countdown {
    fn ops(&self) -> u64 {
        match *self {
            Countdown::Soon(n) => u64::from(n),
            Countdown::Any(n) => u64::from(n % 2000),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    countdown: Countdown,
    ops: Vec<FuzzOp>,
}

/// File bytes in shared 64 KiB pages, so that remembering the state before every store
/// call copies no data (a fill of 8 MiB would otherwise copy the file at each chunk).
/// Canonical: `ceil(len / PAGE)` pages, bytes past `len` zero, so `==` compares content.
#[derive(Clone, Default, PartialEq, Eq)]
struct Data {
    len: usize,
    pages: Vec<Arc<Vec<u8>>>,
}

const PAGE: usize = 64 * 1024;

impl Data {
    fn from_vec(v: &[u8]) -> Data {
        let mut d = Data::default();
        d.write(0, v);
        d
    }

    fn len(&self) -> usize {
        self.len
    }

    fn resize(&mut self, len: usize) {
        if len < self.len && !len.is_multiple_of(PAGE) {
            // Zero the cut-off tail of what becomes the last page.
            let page = Arc::make_mut(&mut self.pages[len / PAGE]);
            page[len % PAGE..].fill(0);
        }
        self.pages.resize_with(len.div_ceil(PAGE), || Arc::new(vec![0u8; PAGE]));
        self.len = len;
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        let end = offset + data.len();
        if end > self.len {
            self.resize(end);
        }
        let mut at = offset;
        while at < end {
            let n = (PAGE - at % PAGE).min(end - at);
            Arc::make_mut(&mut self.pages[at / PAGE])[at % PAGE..at % PAGE + n]
                .copy_from_slice(&data[at - offset..at - offset + n]);
            at += n;
        }
    }

    fn to_vec(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self.pages.iter().flat_map(|p| p.iter().copied()).collect();
        v.truncate(self.len);
        v
    }
}

#[derive(Clone, PartialEq, Eq)]
struct Entry {
    dir: bool,
    data: Data,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Name → entry; entries are shared so that remembering a state is cheap.
type Model = BTreeMap<Vec<u8>, Arc<Entry>>;

fn name(n: u8) -> Vec<u8> {
    format!("n{}", n % NAMES).into_bytes()
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Stream::from_seed_u64(u64::from(seed) + 1).fill_bytes(&mut v);
    v
}

/// One line per name: kind, length, CRC of the bytes, xattrs (name, length).
fn summary(m: &BTreeMap<Vec<u8>, Entry>) -> String {
    let mut s = String::new();
    for (n, e) in m {
        s.push_str(&format!(
            "\n  {} {} len {} crc {:08x} xattrs {:?}",
            String::from_utf8_lossy(n),
            if e.dir { "dir" } else { "file" },
            e.data.len(),
            crc32c(&e.data.to_vec()),
            e.xattrs.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.len())).collect::<Vec<_>>()
        ));
    }
    s
}

fn plain(m: &Model) -> BTreeMap<Vec<u8>, Entry> {
    m.iter().map(|(k, v)| (k.clone(), (**v).clone())).collect()
}

/// The whole root directory as the store shows it. Reads never fail on these disks.
fn dump(store: &mut Store) -> BTreeMap<Vec<u8>, Entry> {
    let mut out = BTreeMap::new();
    let mut from = 0;
    loop {
        let batch = store.readdir(ROOT_INO, from, 100).unwrap_or_else(|e| panic!("readdir: {e}"));
        if batch.is_empty() {
            break;
        }
        for (e, inode) in batch {
            from = e.index + 1;
            assert_eq!(e.kind, inode.kind, "entry {:?} kind differs from its inode", e.name);
            let data = match inode.kind {
                FileKind::Regular => {
                    let d = store.read(inode.ino, 0, inode.size + 10).unwrap_or_else(|err| panic!("read {e:?}: {err}"));
                    assert_eq!(d.len() as u64, inode.size, "read of {e:?} returned a wrong length");
                    d
                }
                FileKind::Directory => {
                    let sub = store.readdir(inode.ino, 0, 10).unwrap_or_else(|err| panic!("readdir {e:?}: {err}"));
                    assert!(sub.is_empty(), "directory {e:?} is not empty");
                    Vec::new()
                }
                k => panic!("entry {e:?} of unexpected kind {k:?}"),
            };
            let mut xattrs = BTreeMap::new();
            for n in store.listxattr(inode.ino).unwrap_or_else(|err| panic!("listxattr {e:?}: {err}")) {
                let v = store.getxattr(inode.ino, &n).unwrap_or_else(|err| panic!("getxattr {e:?}: {err}"));
                xattrs.insert(n, v);
            }
            let entry = Entry { dir: inode.kind == FileKind::Directory, data: Data::from_vec(&data), xattrs };
            let dup = out.insert(e.name.clone(), entry);
            assert!(dup.is_none(), "name {:?} listed twice", e.name);
        }
    }
    out
}

fn assert_matches(store: &mut Store, model: &Model, context: &str) {
    let got = dump(store);
    let want = plain(model);
    assert!(
        got == want,
        "{context}: namespace differs from the model\n got:{}\n want:{}",
        summary(&got),
        summary(&want)
    );
}

/// Errors that come from the environment (the disk failed or filled up), not from the
/// operation's arguments: the model cannot predict them.
fn environmental(e: &Error) -> bool {
    matches!(e, Error::Io { .. } | Error::Poisoned(_) | Error::NoSpace(_))
}

/// What the model says an operation must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Ok,
    NotFound,
    Exists,
    IsDir,
    NotDir,
}

fn class(e: &Error) -> Option<Want> {
    Some(match e {
        Error::NotFound(_) => Want::NotFound,
        Error::Exists(_) => Want::Exists,
        Error::IsDir(_) => Want::IsDir,
        Error::NotDir(_) => Want::NotDir,
        _ => return None,
    })
}

/// Checks a store result against the model's prediction. `Ok(true)`: the operation took
/// effect (apply it to the model); `Ok(false)`: it failed as predicted; `Err`: the
/// environment failed.
fn judge<T>(r: Result<T, Error>, want: Want, what: &str) -> Result<bool, Error> {
    match r {
        Ok(_) if want == Want::Ok => Ok(true),
        Ok(_) => panic!("{what}: succeeded, the model expected {want:?}"),
        Err(e) if environmental(&e) => Err(e),
        Err(e) if class(&e) == Some(want) => Ok(false),
        Err(e) => panic!("{what}: failed with {e:?}, the model expected {want:?}"),
    }
}

/// Looks `name` up in the store and checks it against the model.
fn lookup(store: &mut Store, model: &Model, name: &[u8]) -> Result<Option<Inode>, Error> {
    let r = store.lookup(ROOT_INO, name);
    let what = format!("lookup {:?}", String::from_utf8_lossy(name));
    match model.get(name) {
        None => {
            judge(r, Want::NotFound, &what)?;
            Ok(None)
        }
        Some(e) => {
            let inode = match r {
                Ok(i) => i,
                Err(err) if environmental(&err) => return Err(err),
                Err(err) => panic!("{what}: {err:?}, the model has it"),
            };
            let kind = if e.dir { FileKind::Directory } else { FileKind::Regular };
            assert_eq!(inode.kind, kind, "{what}: wrong kind");
            if !e.dir {
                assert_eq!(inode.size, e.data.len() as u64, "{what}: wrong size");
            }
            Ok(Some(inode))
        }
    }
}

/// Runs one namespace or data operation on the store and the model (for a write, its
/// `chunk`-th repetition: each is a store call of its own).
fn apply(store: &mut Store, model: &mut Model, op: &FuzzOp, chunk: u64) -> Result<(), Error> {
    match *op {
        FuzzOp::Create { name: n, dir } => {
            let n = name(n);
            let kind = if dir { FileKind::Directory } else { FileKind::Regular };
            let want = if model.contains_key(&n) { Want::Exists } else { Want::Ok };
            let r = store.create(ROOT_INO, &n, kind, if dir { 0o755 } else { 0o644 }, 0, 0, 0, NOW);
            if judge(r, want, &format!("{op:?}"))? {
                model.insert(n, Arc::new(Entry { dir, data: Data::default(), xattrs: BTreeMap::new() }));
            }
        }
        FuzzOp::Write { name: n, offset, len, seed, .. } => {
            let n = name(n);
            let Some(inode) = lookup(store, model, &n)? else { return Ok(()) };
            let data = bytes(seed, (len % (MAX_WRITE + 1)) as usize);
            let dir = model[&n].dir;
            let offset = u64::from(offset % MAX_OFFSET) + chunk * data.len() as u64;
            let r = store.write(inode.ino, offset, &data, NOW);
            if judge(r, if dir { Want::IsDir } else { Want::Ok }, &format!("{op:?} (chunk {chunk})"))?
                && !data.is_empty()
            {
                Arc::make_mut(model.get_mut(&n).expect("in the model")).data.write(offset as usize, &data);
            }
        }
        FuzzOp::Fill { name: n, offset, seed, chunks } => {
            let write = FuzzOp::Write { name: n, offset, len: MAX_WRITE, seed, repeat: 0 };
            debug_assert!(chunk <= u64::from(chunks % MAX_FILL_CHUNKS));
            return apply(store, model, &write, chunk);
        }
        FuzzOp::Truncate { name: n, size } => {
            let n = name(n);
            let Some(inode) = lookup(store, model, &n)? else { return Ok(()) };
            let size = u64::from(size % MAX_SIZE);
            let dir = model[&n].dir;
            let r = store.setattr(inode.ino, &SetAttr { size: Some(size), ..Default::default() }, NOW);
            if judge(r, if dir { Want::IsDir } else { Want::Ok }, &format!("{op:?}"))? {
                Arc::make_mut(model.get_mut(&n).expect("in the model")).data.resize(size as usize);
            }
        }
        FuzzOp::Unlink { name: n } => {
            let n = name(n);
            let (r, want) = match model.get(&n) {
                None => (store.unlink(ROOT_INO, &n, NOW).map(|_| ()), Want::NotFound),
                Some(e) if e.dir => (store.rmdir(ROOT_INO, &n, NOW).map(|_| ()), Want::Ok),
                Some(_) => (store.unlink(ROOT_INO, &n, NOW).map(|_| ()), Want::Ok),
            };
            if judge(r, want, &format!("{op:?}"))? {
                model.remove(&n);
            }
        }
        FuzzOp::Rename { from, to } => {
            let (from, to) = (name(from), name(to));
            let want = match (model.get(&from), model.get(&to)) {
                (None, _) => Want::NotFound,
                (Some(_), _) if from == to => Want::Ok,
                (Some(s), Some(d)) if s.dir && !d.dir => Want::NotDir,
                (Some(s), Some(d)) if !s.dir && d.dir => Want::IsDir,
                _ => Want::Ok,
            };
            let r = store.rename(ROOT_INO, &from, ROOT_INO, &to, RenameFlags::default(), NOW);
            if judge(r, want, &format!("{op:?}"))? && from != to {
                let e = model.remove(&from).expect("in the model");
                model.insert(to, e);
            }
        }
        FuzzOp::SetXattr { name: n, xname, len, seed } => {
            let n = name(n);
            let Some(inode) = lookup(store, model, &n)? else { return Ok(()) };
            let xname = format!("user.x{}", xname % XATTR_NAMES).into_bytes();
            let value = bytes(seed, usize::from(len % (MAX_XATTR_VALUE + 1)));
            let r = store.setxattr(inode.ino, &xname, &value, NOW);
            if judge(r, Want::Ok, &format!("{op:?}"))? {
                Arc::make_mut(model.get_mut(&n).expect("in the model")).xattrs.insert(xname, value);
            }
        }
        FuzzOp::Commit | FuzzOp::Reopen => unreachable!("handled by the caller"),
    }
    Ok(())
}

fn open(disk: Box<dyn crest_store::Disk>, context: &str) -> Store {
    let mut store = Store::open(disk).unwrap_or_else(|e| panic!("{context}: open failed: {e}"));
    // Only the space reserve may commit by itself (it does so before an operation
    // changes anything), so the model always knows what a commit wrote.
    store.set_policy(CommitPolicy { max_dirty_nodes: usize::MAX, interval_ms: u64::MAX });
    store
}

/// A freshly made image, made once per process.
fn base_image() -> Vec<u8> {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let disk = MemDisk::new(IMAGE_BYTES);
        Store::mkfs(Box::new(disk.clone()), &MkfsOptions { now: Timespec::new(1, 0), fsid: Some([7; 16]), seed: None, meta_copies: 2 })
            .expect("mkfs");
        disk.snapshot()
    })
    .clone()
}

fn fsck_clean(disk: &MemDisk, context: &str) {
    let report = check::fsck(Box::new(disk.clone())).unwrap_or_else(|e| panic!("{context}: fsck failed: {e}"));
    assert!(report.is_clean(), "{context}: fsck problems: {:#?}", report.problems);
}

fuzz_target!(|input: Input| {
    let mem = MemDisk::from_bytes(base_image());
    let failing = FailingDisk::new(mem.clone(), input.countdown.ops());
    let mut store = open(Box::new(failing.clone()), "initial open");
    let mut model = Model::new();
    let mut committed = Model::new();
    // The state a call that failed with an I/O error may have committed.
    let mut in_flight: Option<Model> = None;

    // One step per store call: a write's repetitions are separate steps, so that a
    // commit the space reserve makes between them is attributed to the right state.
    let steps = input.ops.iter().take(MAX_OPS).flat_map(|op| {
        let chunks = match op {
            FuzzOp::Write { repeat, .. } => u64::from(repeat % MAX_REPEAT),
            FuzzOp::Fill { chunks, .. } => u64::from(chunks % MAX_FILL_CHUNKS),
            _ => 0,
        };
        (0..=chunks).map(move |chunk| (op, chunk))
    });
    for (op, chunk) in steps {
        let before = model.clone();
        let generation = store.generation();
        let r = match op {
            FuzzOp::Commit => {
                assert_matches(&mut store, &model, "before commit");
                store.commit()
            }
            FuzzOp::Reopen => {
                drop(store.abandon());
                store = open(Box::new(failing.clone()), "reopen");
                model = committed.clone();
                assert_matches(&mut store, &model, "after reopen");
                Ok(())
            }
            op => apply(&mut store, &mut model, op, chunk),
        };
        match op {
            // A successful commit makes the live state durable.
            FuzzOp::Commit if r.is_ok() => committed = model.clone(),
            FuzzOp::Commit | FuzzOp::Reopen => {}
            // The space reserve commits by itself before the operation changes anything.
            _ if store.generation() != generation => committed = before.clone(),
            _ => {}
        }
        match r {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => {
                drop(store.abandon());
                store = open(Box::new(failing.clone()), "reopen after NoSpace");
                model = committed.clone();
            }
            Err(e @ (Error::Io { .. } | Error::Poisoned(_))) => {
                // Poisoned now: every later write must be refused.
                let again = store.create(ROOT_INO, b"after-failure", FileKind::Regular, 0o644, 0, 0, 0, NOW);
                assert!(matches!(again, Err(Error::Poisoned(_))), "after {e}: create gave {again:?}");
                assert!(matches!(store.commit(), Err(Error::Poisoned(_))), "after {e}: commit not refused");
                in_flight = Some(before);
                break;
            }
            Err(e) => panic!("{op:?}: unexpected error {e:?}"),
        }
    }
    drop(store.abandon());

    // Recovery on the plain disk.
    fsck_clean(&mem, "after the run");
    let mut store = open(Box::new(mem.clone()), "recovery");
    let got = dump(&mut store);
    let ok = got == plain(&committed) || in_flight.as_ref().is_some_and(|m| got == plain(m));
    assert!(
        ok,
        "recovered namespace is neither the last commit nor the failing one\n got:{}\n last commit:{}\n failing commit:{}",
        summary(&got),
        summary(&plain(&committed)),
        in_flight.as_ref().map_or("(none)".to_string(), |m| summary(&plain(m)))
    );

    // The recovered image takes new data without damaging the old.
    let data = bytes(0xEE, 5000);
    let r = store.create(ROOT_INO, b"recovered", FileKind::Regular, 0o644, 0, 0, 0, NOW).and_then(|i| {
        store.write(i.ino, 0, &data, NOW)?;
        store.commit()
    });
    match r {
        Ok(()) => {}
        Err(Error::NoSpace(_)) => return,
        Err(e) => panic!("writing to the recovered image: {e:?}"),
    }
    drop(store);
    fsck_clean(&mem, "after writing to the recovered image");
    let mut store = open(Box::new(mem.clone()), "reopen of the recovered image");
    let mut want = got;
    want.insert(b"recovered".to_vec(), Entry { dir: false, data: Data::from_vec(&data), xattrs: BTreeMap::new() });
    let again = dump(&mut store);
    assert!(again == want, "recovered image after a write\n got:{}\n want:{}", summary(&again), summary(&want));
});
