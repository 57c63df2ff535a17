//! Corruption: flipped bytes in a superblock, a tree node or a data block must end in a
//! precise error, or (for a superblock, or a node only the newest generation reaches) in a
//! fallback to the other superblock copy — never in wrong data and never in a panic.
//!
//! How. Two images are built in memory with the public API from a seeded fresh image
//! (`common::fresh`, fsid `[7; 16]`): a 16 MiB one with ~2,700 files committed over four
//! generations so every tree has internal nodes and old node blocks get reused, and a
//! 4 MiB one for fuzzing. The pristine image is walked with the crate's own decoders to
//! learn where every live node and data block is and which generation reaches it. Each
//! numbered case of `CORPUS` (001, 002, …, with a one-line description) damages a copy of
//! an image in one precise way and checks the exact outcome: which error and the block or
//! inode/offset it names, which generation `Store::open` settles on and the notes it
//! leaves, what fsck reports, which reads fail (EIO, `is_corruption`) and that every other
//! read returns the original bytes. After a fallback the older generation must take a new
//! commit and fsck clean. `random_damage_fuzz` flips 1–8 random bytes (sometimes also
//! zeroing a whole block) in the used part of the small image for seeded iterations and
//! derives the exact expected outcome from the set of blocks that changed: fsck is clean
//! iff no live block of the generation it checks changed, open picks the newest generation
//! whose superblock and nodes are intact (or refuses with `BadImage`), and a file's read
//! fails with `DataChecksum` naming a damaged block iff one of its data blocks changed.
//! No corrupt image is committed: they are all generated in code.
//!
//! Random flips cannot get past the checksums, so the `Resealed` cases and `resealed_fuzz`
//! also damage metadata and then fix the node's checksum (what a buggy writer or a crafted
//! image produces): the structural checks and item decoders must then refuse it with an
//! error, and open, fsck, a full dump and a small workload with a commit must not panic,
//! abort or hang.
//!
//! Every call into the store runs under `catch_unwind`; a panic fails the case with its
//! number, the panic message and the store's frames of the backtrace. An abort (a failed
//! huge allocation) cannot be caught in-process, so the resealed cases and seeds run in
//! child processes of this test binary (`isolated_child`): a unit that aborts or hangs
//! fails alone, with the abort message and the store's frames, and the next child goes on.
//!
//! Knobs: `CREST_CORRUPT_CASE=N` runs only case N; `CREST_CORRUPT_ITERS=N` sets the fuzz
//! iterations (default 200) and `CREST_CORRUPT_SEED=S` their first seed;
//! `CREST_CORRUPT_RESEAL_IMAGE=main` runs `resealed_fuzz` on the 16 MiB image;
//! `CREST_CORRUPT_SAVE=dir` writes each case's corrupt image to `dir/case-NNN[-k].img` so
//! it can be fed to `crest fsck` by hand.

mod common;
use common::*;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use crest_rng::Stream;
use crest_store::check::{self, Report};
use crest_store::checksum::crc32c;
use crest_store::fs::extent::Extent;
use crest_store::fs::inode::Inode;
use crest_store::key::{kind, Key};
use crest_store::limits::{BLOCK_SIZE, RESERVED_BLOCKS};
use crest_store::node::{BlockPtr, Body, Node, LEAF_SPACE};
use crest_store::store::{FS_TREE_ID, REFCOUNT_TREE_ID, ROOT_TREE_ID};
use crest_store::superblock::Superblock;
use crest_store::{Error, FileKind, MemDisk, RenameFlags, SetAttr, Store, ROOT_INO};

const BS: usize = BLOCK_SIZE;
const BS64: u64 = BLOCK_SIZE as u64;

/// Returns `Err(format!(…))` from the enclosing function when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

type R<T = ()> = Result<T, String>;

// ---- panics -------------------------------------------------------------------------------

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static CURRENT_CASE: Cell<u32> = const { Cell::new(0) };
    static SAVED: Cell<u32> = const { Cell::new(0) };
}

/// Remembers each panic's message, location and the store's frames of its backtrace.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let frames = store_frames(&bt).join("\n      ");
            let msg = format!("{info}\n    store frames:\n      {frames}");
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(msg));
            prev(info);
        }));
    });
}

/// The store's frames of a printed backtrace, each with its "at file:line" line.
fn store_frames(bt: &str) -> Vec<String> {
    let lines: Vec<&str> = bt.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.contains("crest_store::") {
            let at = lines.get(i + 1).filter(|n| n.starts_with("at ")).map_or(String::new(), |n| format!(" {n}"));
            out.push(format!("{l}{at}"));
        }
    }
    out.truncate(12);
    out
}

/// Runs `f`, turning a panic into an error saying what panicked and where.
fn guard<T>(what: &str, f: impl FnOnce() -> T) -> R<T> {
    install_panic_hook();
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| {
        let p = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
        format!("PANIC in {what}: {p}")
    })
}

// ---- raw image access ---------------------------------------------------------------------

fn blk(img: &[u8], b: u64) -> &[u8] {
    let s = b as usize * BS;
    &img[s..s + BS]
}

fn blk_mut(img: &mut [u8], b: u64) -> &mut [u8] {
    let s = b as usize * BS;
    &mut img[s..s + BS]
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Recomputes the CRC-32C of a node or superblock (bytes 0..4, over 32..4096), so that a
/// deliberate change is seen by the structural checks instead of the checksum.
fn reseal(b: &mut [u8]) {
    let c = crc32c(&b[32..]);
    b[0..4].copy_from_slice(&c.to_le_bytes());
}

fn crc_ok(b: &[u8]) -> bool {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == crc32c(&b[32..])
}

fn sb_block(copy: usize) -> u64 {
    Superblock::block_of_copy(copy)
}

/// Changes a superblock copy and fixes its checksum.
fn patch_sb(img: &mut [u8], copy: usize, f: impl FnOnce(&mut [u8])) {
    let b = blk_mut(img, sb_block(copy));
    f(b);
    reseal(b);
}

/// Changes a node and fixes its checksum.
fn patch_node(img: &mut [u8], block: u64, f: impl FnOnce(&mut [u8])) {
    let b = blk_mut(img, block);
    f(b);
    reseal(b);
}

/// Superblock field offsets (docs/format.md; private in `engine/superblock.rs`).
const SB_VERSION: usize = 40;
const SB_FSID: usize = 52;
const SB_USED_BLOCKS: usize = 84;
const SB_ROOT_TREE: usize = 92; // block u64, generation u64, level u8

/// (key, value offset, value length) of every item of a raw leaf.
fn leaf_items(b: &[u8]) -> Vec<(Key, usize, usize)> {
    let n = get_u16(b, 74);
    (0..n)
        .map(|i| {
            let at = 80 + i * 21;
            (Key::decode(&b[at..at + 17]), get_u16(b, at + 17), get_u16(b, at + 19))
        })
        .collect()
}

/// Writes the image of the running case to `$CREST_CORRUPT_SAVE` when set.
fn keep(img: &[u8]) {
    let Ok(dir) = std::env::var("CREST_CORRUPT_SAVE") else { return };
    let case = CURRENT_CASE.with(Cell::get);
    let k = SAVED.with(|s| {
        let k = s.get();
        s.set(k + 1);
        k
    });
    let name = if k == 0 { format!("case-{case:03}.img") } else { format!("case-{case:03}-{k}.img") };
    let path = std::path::Path::new(&dir).join(name);
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, img)) {
        eprintln!("could not save {}: {e}", path.display());
    }
}

// ---- where everything lives ---------------------------------------------------------------

#[derive(Clone, Debug)]
struct NodeInfo {
    owner: u64,
    level: u8,
    generation: u64,
    is_root: bool,
    /// The last node of its level in its tree (the last leaf holds an fs tree's orphans).
    last: bool,
    /// Free payload bytes (leaves).
    free: usize,
}

/// Every live node and data block of one generation of a pristine image.
#[derive(Clone, Debug, Default)]
struct GenLayout {
    generation: u64,
    copy: usize,
    total_blocks: u64,
    used_blocks: u64,
    root_tree: BlockPtr,
    /// Level of each tree's root, by owner.
    levels: BTreeMap<u64, u8>,
    nodes: BTreeMap<u64, NodeInfo>,
    /// ino → (file offset, first disk block, blocks) of each regular extent.
    extents: BTreeMap<u64, Vec<(u64, u64, u64)>>,
    /// Leaf block holding each fs-tree key.
    fs_leaf_of: BTreeMap<Key, u64>,
    /// Committed with one flush: the data blocks its superblock's manifest lists.
    manifest: Option<BTreeSet<u64>>,
}

impl GenLayout {
    /// Whether opening this generation reads node `block`: every node but an fs-tree leaf
    /// an older commit wrote (not the tree's last leaf: `Leaves::Since` in store.rs).
    fn open_reads(&self, block: u64) -> bool {
        self.nodes
            .get(&block)
            .is_none_or(|n| !(n.owner == FS_TREE_ID && n.level == 0 && n.generation < self.generation && !n.last))
    }

    /// Whether this generation was committed with one flush and wrote `block` (a node of
    /// its generation, or a data block its manifest lists): damage there cannot be told
    /// from a power cut during that commit, so open and fsck take the generation before.
    fn last_commit_wrote(&self, block: u64) -> bool {
        self.manifest.as_ref().is_some_and(|m| {
            m.contains(&block) || self.nodes.get(&block).is_some_and(|n| n.generation == self.generation)
        })
    }

    fn blocks_of(&self, ino: u64) -> BTreeSet<u64> {
        self.extents.get(&ino).into_iter().flatten().flat_map(|&(_, b, n)| b..b + n).collect()
    }

    fn data_blocks(&self) -> BTreeSet<u64> {
        self.extents.values().flatten().flat_map(|&(_, b, n)| b..b + n).collect()
    }

    /// Every block this generation reads: its nodes and its data.
    fn live(&self) -> BTreeSet<u64> {
        let mut s = self.data_blocks();
        s.extend(self.nodes.keys());
        s
    }

    /// Disk block holding file byte `off` of `ino`.
    fn disk_block(&self, ino: u64, off: u64) -> R<u64> {
        self.extents
            .get(&ino)
            .into_iter()
            .flatten()
            .find(|&&(o, _, n)| o <= off && off < o + n * BS64)
            .map(|&(o, b, _)| b + (off - o) / BS64)
            .ok_or_else(|| format!("inode {ino} has no block at offset {off}"))
    }

    /// The (ino, file offset) a data block belongs to.
    fn owner_of(&self, block: u64) -> Option<(u64, u64)> {
        self.extents.iter().find_map(|(ino, v)| {
            v.iter().find(|&&(_, b, n)| b <= block && block < b + n).map(|&(o, b, _)| (*ino, o + (block - b) * BS64))
        })
    }
}

/// Walks one tree, recording its nodes; returns its items with the leaf holding each.
fn walk_tree(
    img: &[u8],
    sb: &Superblock,
    owner: u64,
    root: BlockPtr,
    g: &mut GenLayout,
) -> R<Vec<(Key, Vec<u8>, u64)>> {
    g.levels.insert(owner, root.level);
    let mut items = Vec::new();
    let mut stack = vec![(root, true)];
    while let Some((p, last)) = stack.pop() {
        ensure!(p.block < img.len() as u64 / BS64, "tree {owner}: pointer to block {} past the image", p.block);
        let node = Node::decode(blk(img, p.block), &sb.fsid, &p, owner, sb.total_blocks)
            .map_err(|e| format!("tree {owner}: {e}"))?;
        let free = LEAF_SPACE.saturating_sub(node.used_bytes());
        g.nodes.insert(
            p.block,
            NodeInfo { owner, level: p.level, generation: p.generation, is_root: p.block == root.block, last, free },
        );
        match node.body {
            Body::Leaf(v) => items.extend(v.into_iter().map(|(k, val)| (k, val, p.block))),
            Body::Internal(c) => {
                let n = c.len();
                for (i, (_, cp)) in c.iter().enumerate().rev() {
                    if let Some(child) = cp.on_disk(p.level - 1) {
                        stack.push((child, last && i + 1 == n));
                    }
                }
            }
        }
    }
    Ok(items)
}

/// Walks the generation superblock copy `copy` describes.
fn walk_generation(img: &[u8], copy: usize) -> R<GenLayout> {
    let sb = Superblock::decode(blk(img, sb_block(copy)), copy, img.len() as u64 / BS64).map_err(|e| e.to_string())?;
    let mut g = GenLayout {
        generation: sb.generation,
        copy,
        total_blocks: sb.total_blocks,
        used_blocks: sb.used_blocks,
        root_tree: sb.root_tree,
        manifest: sb.manifest.as_ref().map(|m| m.iter().map(|e| e.0).collect()),
        ..GenLayout::default()
    };
    let root_items = walk_tree(img, &sb, ROOT_TREE_ID, sb.root_tree, &mut g)?;
    let v = root_items
        .iter()
        .find(|(k, _, _)| *k == Key::new(FS_TREE_ID, kind::ROOT_ITEM, 0))
        .map(|(_, v, _)| v.clone())
        .ok_or("no root item")?;
    ensure!(v.len() == 48, "root item of {} bytes", v.len());
    let fs_ptr = BlockPtr { block: get_u64(&v, 0), twin: get_u64(&v, 40), generation: get_u64(&v, 8), level: v[16] };
    walk_tree(img, &sb, REFCOUNT_TREE_ID, sb.refcount_tree, &mut g)?;
    for (k, v, leaf) in walk_tree(img, &sb, FS_TREE_ID, fs_ptr, &mut g)? {
        g.fs_leaf_of.insert(k, leaf);
        if k.kind == kind::EXTENT {
            if let Extent::Regular { disk_block, csums, .. } =
                Extent::decode(k, &v, sb.total_blocks).map_err(|e| e.to_string())?
            {
                g.extents.entry(k.objectid).or_default().push((k.offset, disk_block, csums.len() as u64));
            }
        }
    }
    Ok(g)
}

// ---- fixtures -----------------------------------------------------------------------------

struct Fixture {
    /// The pristine image.
    image: Vec<u8>,
    /// The generation of the newest superblock copy, and of the other one.
    new: GenLayout,
    old: GenLayout,
    /// Namespace after each commit, by generation.
    dumps: BTreeMap<u64, Dump>,
    /// path → ino in the newest generation.
    inos: BTreeMap<String, u64>,
    /// The image as it was right after generation `early_gen` (for stale writes).
    early: Vec<u8>,
    early_gen: u64,
}

impl Fixture {
    fn ino(&self, path: &str) -> R<u64> {
        self.inos.get(path).copied().ok_or_else(|| format!("fixture has no {path}"))
    }

    fn content(&self, path: &str) -> R<&[u8]> {
        self.dumps[&self.new.generation].get(path).map(|e| e.content.as_slice()).ok_or(format!("no {path}"))
    }

    fn path_of(&self, ino: u64) -> Option<&str> {
        self.inos.iter().find(|(_, i)| **i == ino).map(|(p, _)| p.as_str())
    }

    fn shared(&self, block: u64) -> bool {
        self.old.nodes.contains_key(&block)
    }

    /// First node of the newest generation (by block number) matching `f`.
    fn pick(&self, what: &str, f: impl Fn(u64, &NodeInfo) -> bool) -> R<u64> {
        self.new.nodes.iter().find(|(b, n)| f(**b, n)).map(|(b, _)| *b).ok_or_else(|| format!("fixture has no {what}"))
    }

    /// Leaf (in the newest generation) holding `key`, and the item's value offset and length.
    fn item(&self, key: Key) -> R<(u64, usize, usize)> {
        let leaf = *self.new.fs_leaf_of.get(&key).ok_or_else(|| format!("no item {key:?}"))?;
        let (_, off, len) = leaf_items(blk(&self.image, leaf))
            .into_iter()
            .find(|(k, _, _)| *k == key)
            .ok_or_else(|| format!("item {key:?} not in leaf {leaf}"))?;
        Ok((leaf, off, len))
    }
}

/// Seeded random bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Stream::from_seed_u64(seed).fill_bytes(&mut v);
    v
}

fn finish_fixture(disk: &MemDisk, dumps: BTreeMap<u64, Dump>, early: Vec<u8>, early_gen: u64) -> Fixture {
    assert_clean(disk);
    let image = disk.snapshot();
    let a = walk_generation(&image, 0).expect("pristine copy 0");
    let b = walk_generation(&image, 1).expect("pristine copy 1");
    let (new, old) = if a.generation > b.generation { (a, b) } else { (b, a) };
    assert_eq!(new.generation, old.generation + 1, "fixture ends with two consecutive generations");
    let mut s = Store::open(Box::new(MemDisk::from_bytes(image.clone()))).expect("open pristine");
    let got = soft_dump(&mut s);
    check_dump(&got, &dumps[&new.generation], &new, &BTreeSet::new()).expect("pristine dump");
    let inos = got.entries.iter().map(|(p, e)| (p.clone(), e.ino)).collect();
    Fixture { image, new, old, dumps, inos, early, early_gen }
}

/// Files in `/d` of the main image: enough for a three-level fs tree.
const SMALL_FILES: usize = 2500;
/// Two-block files in `/` of the main image: enough for a two-level refcount tree.
const BIG_FILES: usize = 200;

/// The 16 MiB image: generations 2 (snapshot kept), 3, 4 and 5 (the two copies hold 5 and 4).
fn build_main() -> Fixture {
    let disk = fresh_with_copies(16, 1);
    let now = t(10);
    let mut dumps = BTreeMap::new();
    let mut s = open(&disk);
    let d = s.create(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, 0, 0, now).expect("mkdir").ino;
    for i in 0..SMALL_FILES {
        let name = format!("f-{i:05}");
        let ino = s.create(d, name.as_bytes(), FileKind::Regular, 0o644, 1, 2, 0, now).expect("create").ino;
        s.write(ino, 0, name.as_bytes(), now).expect("write");
    }
    for i in 0..BIG_FILES {
        let ino = s
            .create(ROOT_INO, format!("big-{i:03}").as_bytes(), FileKind::Regular, 0o600, 3, 4, 0, now)
            .expect("create big")
            .ino;
        s.write(ino, 0, &pattern(5000, 1000 + i as u64), now).expect("write big");
    }
    let three = s.create(ROOT_INO, b"three", FileKind::Regular, 0o640, 5, 6, 0, now).expect("three").ino;
    s.write(three, 0, &pattern(3 * BS, 3), now).expect("write three");
    s.setxattr(three, b"user.note", b"three blocks", now).expect("setxattr");
    let target: Vec<u8> = (0..3000).map(|i| b'a' + (i % 26) as u8).collect();
    s.symlink(ROOT_INO, b"link", &target, 0, 0, now).expect("symlink");
    s.commit().expect("commit");
    assert_eq!(s.generation(), 2);
    let early = disk.snapshot();
    dumps.insert(2, dump(&mut s));

    // Generation 3: rewrite a fifth of the small files, drop a quarter of the big ones.
    for i in (0..SMALL_FILES).step_by(5) {
        let ino = s.lookup(d, format!("f-{i:05}").as_bytes()).expect("lookup").ino;
        s.write(ino, 0, format!("rewritten-{i}").as_bytes(), now).expect("rewrite");
    }
    for i in 150..BIG_FILES {
        s.unlink(ROOT_INO, format!("big-{i:03}").as_bytes(), now).expect("unlink");
    }
    for i in 0..10 {
        let ino =
            s.create(ROOT_INO, format!("mid-{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now).expect("mid").ino;
        s.write(ino, 0, format!("mid-{i}").as_bytes(), now).expect("write mid");
    }
    s.commit().expect("commit");
    assert_eq!(s.generation(), 3);
    dumps.insert(3, dump(&mut s));
    drop(s);

    // Generation 4, after a reopen (allocation restarts low: blocks of generation 2 get reused).
    let mut s = open(&disk);
    for i in (1..SMALL_FILES).step_by(7) {
        let ino = s.lookup(d, format!("f-{i:05}").as_bytes()).expect("lookup").ino;
        s.write(ino, 0, format!("again-{i}").as_bytes(), now).expect("rewrite");
    }
    for i in 0..20 {
        let ino = s
            .create(ROOT_INO, format!("g4-{i:02}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now)
            .expect("g4")
            .ino;
        s.write(ino, 0, &pattern(9000, 2000 + i), now).expect("write g4");
    }
    s.commit().expect("commit");
    assert_eq!(s.generation(), 4);
    dumps.insert(4, dump(&mut s));
    drop(s);

    // Generation 5: one small inline file, so only a few fs nodes and the root tree change.
    let mut s = open(&disk);
    let late = s.create(ROOT_INO, b"late", FileKind::Regular, 0o644, 0, 0, 0, now).expect("late").ino;
    s.write(late, 0, b"late", now).expect("write late");
    s.commit().expect("commit");
    assert_eq!(s.generation(), 5);
    dumps.insert(5, dump(&mut s));
    drop(s);
    finish_fixture(&disk, dumps, early, 2)
}

/// The 4 MiB image for fuzzing: generation 2 with everything, generation 3 = 2 plus an
/// xattr on the root (invisible to the dump), so both copies show the same namespace.
fn build_small() -> Fixture {
    let disk = fresh_with_copies(4, 1);
    let now = t(10);
    let mut dumps = BTreeMap::new();
    let mut s = open(&disk);
    let sub = s.create(ROOT_INO, b"sub", FileKind::Directory, 0o755, 0, 0, 0, now).expect("mkdir").ino;
    for i in 0..24u64 {
        let size = [0, 10, 700, 1024, 1025, 5000, 20_000, 4096][i as usize % 8];
        let ino = s
            .create(ROOT_INO, format!("s-{i:02}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now)
            .expect("create")
            .ino;
        if size > 0 {
            s.write(ino, 0, &pattern(size, 100 + i), now).expect("write");
        }
        if i % 3 == 0 {
            s.setxattr(ino, b"user.i", format!("{i}").as_bytes(), now).expect("setxattr");
        }
    }
    for (i, size) in [3000usize, 9000, 100, 12_288].into_iter().enumerate() {
        let ino =
            s.create(sub, format!("t-{i}").as_bytes(), FileKind::Regular, 0o600, 7, 7, 0, now).expect("create").ino;
        s.write(ino, 0, &pattern(size, 200 + i as u64), now).expect("write");
    }
    s.symlink(ROOT_INO, b"long-link", &vec![b'x'; 2000], 0, 0, now).expect("symlink");
    s.symlink(sub, b"short-link", b"../s-01", 0, 0, now).expect("symlink");
    s.create(ROOT_INO, b"pipe", FileKind::Fifo, 0o644, 0, 0, 0, now).expect("fifo");
    s.commit().expect("commit");
    assert_eq!(s.generation(), 2);
    let early = disk.snapshot();
    dumps.insert(2, dump(&mut s));
    s.setxattr(ROOT_INO, b"user.generation", b"3", now).expect("setxattr");
    s.commit().expect("commit");
    assert_eq!(s.generation(), 3);
    dumps.insert(3, dump(&mut s));
    drop(s);
    finish_fixture(&disk, dumps, early, 2)
}

fn main_fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build_main)
}

fn small_fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build_small)
}

// ---- a dump that never panics -------------------------------------------------------------

/// What a damaged store showed for one path.
struct Got {
    ino: u64,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u32,
    content: Result<Vec<u8>, Error>,
    xattrs: Result<BTreeMap<Vec<u8>, Vec<u8>>, Error>,
}

#[derive(Default)]
struct SoftDump {
    entries: BTreeMap<String, Got>,
    /// Directories whose listing failed (path, error).
    dir_errors: Vec<(String, Error)>,
}

/// Like `common::dump`, but every failure is recorded instead of panicking.
fn soft_dump(store: &mut Store) -> SoftDump {
    let mut out = SoftDump::default();
    let mut stack = vec![(ROOT_INO, String::new())];
    let mut seen = BTreeSet::from([ROOT_INO]);
    while let Some((dir, path)) = stack.pop() {
        let mut from = 0u64;
        loop {
            let batch = match store.readdir(dir, from, 100) {
                Ok(b) => b,
                Err(e) => {
                    out.dir_errors.push((path.clone(), e));
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            for (e, inode) in batch {
                from = e.index.saturating_add(1);
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let content = match inode.kind {
                    FileKind::Regular => read_all(store, inode.ino, inode.size),
                    FileKind::Symlink => store.readlink(inode.ino),
                    _ => Ok(Vec::new()),
                };
                let xattrs = store.listxattr(inode.ino).and_then(|names| {
                    names.into_iter().map(|n| store.getxattr(inode.ino, &n).map(|v| (n, v))).collect()
                });
                if inode.kind == FileKind::Directory && seen.insert(inode.ino) {
                    stack.push((inode.ino, p.clone()));
                }
                out.entries.insert(
                    p,
                    Got {
                        ino: inode.ino,
                        kind: inode.kind,
                        mode: inode.mode,
                        uid: inode.uid,
                        gid: inode.gid,
                        size: if inode.kind == FileKind::Directory { 0 } else { inode.size },
                        nlink: inode.nlink,
                        content,
                        xattrs,
                    },
                );
                if out.entries.len() > 100_000 {
                    out.dir_errors.push((path, Error::Invalid("dump stopped at 100000 entries".into())));
                    return out;
                }
            }
            if from == u64::MAX {
                break;
            }
        }
    }
    out
}

/// Reads a file the way a client does: in bounded chunks (a corrupt size must not make the
/// harness itself ask for terabytes), up to 32 MiB, plus a probe past the end.
fn read_all(store: &mut Store, ino: u64, size: u64) -> Result<Vec<u8>, Error> {
    const CHUNK: u64 = 1 << 20;
    let mut out = Vec::new();
    let mut off = 0u64;
    while off <= size.min(32 << 20) {
        let chunk = store.read(ino, off, CHUNK)?;
        if chunk.is_empty() {
            break;
        }
        off += chunk.len() as u64;
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn dump_soft(s: &mut Store) -> R<SoftDump> {
    guard("dump (readdir/read/readlink/listxattr/getxattr)", || soft_dump(s))
}

/// Attributes and xattrs of `got` against `want`.
fn same_meta(p: &str, got: &Got, want: &Entry) -> R {
    ensure!(
        got.kind == want.kind
            && got.mode == want.mode
            && got.uid == want.uid
            && got.gid == want.gid
            && got.size == want.size
            && got.nlink == want.nlink,
        "{p}: attributes differ (WRONG DATA): got {:?} mode {:o} uid {} gid {} size {} nlink {}, want {want:?}",
        got.kind,
        got.mode,
        got.uid,
        got.gid,
        got.size,
        got.nlink
    );
    Ok(())
}

/// A dump of a store over a damaged image against the namespace it must show exactly:
/// every path with its attributes and xattrs; the content of a file with a data block in
/// `damaged` refused with `DataChecksum` naming one of those blocks (EIO); every other
/// content equal to the original.
fn check_dump(got: &SoftDump, want: &Dump, g: &GenLayout, damaged: &BTreeSet<u64>) -> R {
    if let Some((p, e)) = got.dir_errors.first() {
        return Err(format!("listing directory {p:?} failed: {e}"));
    }
    for p in want.keys() {
        ensure!(got.entries.contains_key(p), "path {p} is missing");
    }
    for (p, gv) in &got.entries {
        let w = want.get(p).ok_or_else(|| format!("extra path {p} (WRONG DATA)"))?;
        same_meta(p, gv, w)?;
        match &gv.xattrs {
            Ok(x) => ensure!(*x == w.xattrs, "{p}: xattrs differ (WRONG DATA)"),
            Err(e) => return Err(format!("{p}: xattrs unreadable: {e}")),
        }
        let bad: BTreeSet<u64> = g.blocks_of(gv.ino).intersection(damaged).copied().collect();
        match &gv.content {
            Ok(c) if bad.is_empty() => {
                ensure!(*c == w.content, "{p}: content differs from the original (WRONG DATA)")
            }
            Ok(_) => {
                return Err(format!("{p}: read succeeded although its data blocks {bad:?} are damaged (WRONG DATA)"))
            }
            Err(e @ Error::DataChecksum { ino, block, expected, found, .. }) => {
                ensure!(
                    *ino == gv.ino && bad.contains(block) && expected != found && e.errno() == 5 && e.is_corruption(),
                    "{p} (inode {}): imprecise data error {e} (damaged blocks of the file: {bad:?})",
                    gv.ino
                );
            }
            Err(e) => return Err(format!("{p}: unexpected read error {e:?} (damaged blocks of the file: {bad:?})")),
        }
    }
    Ok(())
}

/// A dump of a store whose metadata is damaged: whatever it returned matches `want`, and
/// every failure is a corruption error (EIO). Returns the paths whose content failed.
fn check_sound(got: &SoftDump, want: &Dump) -> R<Vec<String>> {
    for (p, e) in &got.dir_errors {
        ensure!(e.errno() == 5 && e.is_corruption(), "listing {p:?} failed with a non-corruption error: {e:?}");
    }
    let mut failed = Vec::new();
    for (p, gv) in &got.entries {
        let w = want.get(p).ok_or_else(|| format!("extra path {p} (WRONG DATA)"))?;
        same_meta(p, gv, w)?;
        if let Ok(x) = &gv.xattrs {
            ensure!(*x == w.xattrs, "{p}: xattrs differ (WRONG DATA)");
        }
        match &gv.content {
            Ok(c) => ensure!(*c == w.content, "{p}: content differs from the original (WRONG DATA)"),
            Err(e) => {
                ensure!(e.errno() == 5 && e.is_corruption(), "{p}: non-corruption error {e:?}");
                failed.push(p.clone());
            }
        }
        if let Err(e) = &gv.xattrs {
            ensure!(e.errno() == 5 && e.is_corruption(), "{p}: xattrs: non-corruption error {e:?}");
        }
    }
    Ok(failed)
}

/// The oracle itself: it must see a changed byte, a missing path and an error without damage.
#[test]
fn checker_catches_wrong_data() {
    let fx = small_fixture();
    let want = &fx.dumps[&fx.new.generation];
    let fresh_dump = || {
        let mut s = Store::open(Box::new(MemDisk::from_bytes(fx.image.clone()))).expect("open");
        soft_dump(&mut s)
    };
    let none = BTreeSet::new();
    assert!(check_dump(&fresh_dump(), want, &fx.new, &none).is_ok());
    let mut got = fresh_dump();
    let (p, e) = got.entries.iter_mut().find(|(_, e)| e.content.as_ref().is_ok_and(|c| c.len() > 100)).expect("file");
    let p = p.clone();
    if let Ok(c) = &mut e.content {
        c[50] ^= 1;
    }
    let m = check_dump(&got, want, &fx.new, &none).expect_err("changed byte");
    assert!(m.contains("WRONG DATA") && m.contains(&p), "{m}");
    assert!(check_sound(&got, want).is_err(), "check_sound misses a changed byte");
    let mut got = fresh_dump();
    got.entries.remove(&p);
    assert!(check_dump(&got, want, &fx.new, &none).is_err(), "missing path unnoticed");
    let mut got = fresh_dump();
    let e = got.entries.get_mut(&p).expect("entry");
    let ino = e.ino;
    let block = *fx.new.blocks_of(ino).first().expect("a data block");
    e.content = Err(Error::DataChecksum { ino, file_offset: 0, block, expected: 1, found: 2 });
    assert!(check_dump(&got, want, &fx.new, &none).is_err(), "an error without damage is unnoticed");
    assert!(check_dump(&got, want, &fx.new, &BTreeSet::from([block])).is_ok(), "a precise error is refused");
}

// ---- running the store on an image --------------------------------------------------------

fn run_fsck(img: &[u8]) -> R<Result<Report, Error>> {
    let disk = MemDisk::from_bytes(img.to_vec());
    guard("check::fsck", || check::fsck(Box::new(disk)))
}

fn fsck_ok(img: &[u8]) -> R<Report> {
    run_fsck(img)?.map_err(|e| format!("fsck failed to run: {e}"))
}

fn open_img(img: &[u8]) -> R<(MemDisk, Result<Store, Error>)> {
    let disk = MemDisk::from_bytes(img.to_vec());
    let r = guard("Store::open", || Store::open(Box::new(disk.clone())))?;
    Ok((disk, r))
}

fn short(v: &[String]) -> String {
    let mut s: Vec<&str> = v.iter().map(String::as_str).take(6).collect();
    if v.len() > 6 {
        s.push("…");
    }
    format!("{s:?}")
}

/// fsck runs and reports a problem containing every needle.
fn fsck_problem(img: &[u8], needles: &[&str]) -> R<Report> {
    let rep = fsck_ok(img)?;
    ensure!(
        rep.problems.iter().any(|p| needles.iter().all(|n| p.contains(n))),
        "fsck reports no problem containing {needles:?}; problems: {}",
        short(&rep.problems)
    );
    Ok(rep)
}

/// Both `Store::open` and fsck refuse the image with `BadImage` (EINVAL) mentioning every needle.
fn expect_bad_image(img: &[u8], open_needles: &[&str], fsck_needles: &[&str]) -> R {
    keep(img);
    let (_, r) = open_img(img)?;
    match r {
        Err(e @ Error::BadImage(_)) => {
            let m = e.to_string();
            ensure!(e.errno() == 22, "BadImage errno {}", e.errno());
            for n in open_needles {
                ensure!(m.contains(n), "open error lacks {n:?}: {m}");
            }
        }
        Err(e) => return Err(format!("open: expected BadImage, got {e:?}")),
        Ok(s) => return Err(format!("open succeeded at generation {}", s.generation())),
    }
    match run_fsck(img)? {
        Err(e @ Error::BadImage(_)) => {
            let m = e.to_string();
            for n in fsck_needles {
                ensure!(m.contains(n), "fsck error lacks {n:?}: {m}");
            }
        }
        Err(e) => return Err(format!("fsck: expected BadImage, got {e:?}")),
        Ok(r) => return Err(format!("fsck ran on an unusable image: {:?}", r.problems)),
    }
    Ok(())
}

/// The image opens at generation `g` with exactly its namespace, notes containing every
/// needle, and fsck is clean.
fn expect_intact(fx: &Fixture, img: &[u8], g: &GenLayout, needles: &[&str]) -> R {
    expect_opens_intact(fx, img, g, needles)?;
    let rep = fsck_ok(img)?;
    ensure!(rep.is_clean(), "fsck problems: {}", short(&rep.problems));
    ensure!(rep.generation == g.generation, "fsck checked generation {}", rep.generation);
    Ok(())
}

/// The image opens at generation `g` with exactly its namespace and notes containing
/// every needle (what fsck says is the caller's to check).
fn expect_opens_intact(fx: &Fixture, img: &[u8], g: &GenLayout, needles: &[&str]) -> R {
    keep(img);
    let (_, r) = open_img(img)?;
    let mut s = r.map_err(|e| format!("open failed: {e}"))?;
    ensure!(s.generation() == g.generation, "opened generation {}, want {}", s.generation(), g.generation);
    let notes = s.open_notes().join(" | ");
    for n in needles {
        ensure!(notes.contains(n), "open notes lack {n:?}: {notes:?}");
    }
    check_dump(&dump_soft(&mut s)?, &fx.dumps[&g.generation], g, &BTreeSet::new())
}

/// `Store::open` falls back to the older generation, leaving notes with every needle; its
/// namespace is intact; it takes a new commit; the result is a clean image.
fn expect_fallback(fx: &Fixture, img: &[u8], needles: &[&str]) -> R {
    keep(img);
    let old = fx.old.generation;
    let (disk, r) = open_img(img)?;
    let mut s = r.map_err(|e| format!("open failed instead of falling back to generation {old}: {e}"))?;
    ensure!(s.generation() == old, "opened generation {}, want the fallback {old}", s.generation());
    let notes = s.open_notes().join(" | ");
    for n in needles {
        ensure!(notes.contains(n), "open notes lack {n:?}: {notes:?}");
    }
    check_dump(&dump_soft(&mut s)?, &fx.dumps[&old], &fx.old, &BTreeSet::new())?;
    // The older generation takes new commits and the result is clean.
    let r = guard("commit after fallback", || -> Result<(), Error> {
        let ino = s.create(ROOT_INO, b"after-fallback", FileKind::Regular, 0o600, 0, 0, 0, t(50))?.ino;
        s.write(ino, 0, b"recovered", t(50))?;
        s.commit()
    })?;
    r.map_err(|e| format!("commit after fallback failed: {e}"))?;
    drop(s);
    let healed = disk.snapshot();
    let rep = fsck_ok(&healed)?;
    ensure!(rep.is_clean(), "fsck after the fallback commit: {}", short(&rep.problems));
    ensure!(rep.generation == old + 1, "fsck after the fallback commit checked generation {}", rep.generation);
    let (_, r) = open_img(&healed)?;
    let mut s = r.map_err(|e| format!("reopen after the fallback commit: {e}"))?;
    ensure!(s.generation() == old + 1, "reopened at generation {}", s.generation());
    let mut got = dump_soft(&mut s)?;
    let new_file = got.entries.remove("/after-fallback").ok_or("the file created after the fallback is gone")?;
    ensure!(new_file.content.as_deref().ok() == Some(&b"recovered"[..]), "file created after the fallback reads wrong");
    check_dump(&got, &fx.dumps[&old], &fx.old, &BTreeSet::new())
}

/// Node `block` of the newest generation is damaged in `img`: fsck names the block and
/// `detail`; open falls back when the older generation does not use the block, and refuses
/// the image naming the block in both generations when it does — but for an fs-tree leaf
/// the last commit did not write: open does not read those (`Leaves::Since`), so it opens
/// the newest generation, and what the leaf held fails, naming the block, when read.
fn expect_node_damage(fx: &Fixture, img: &[u8], block: u64, detail: &str) -> R {
    keep(img);
    let tag = format!("at block {block}:");
    if fx.new.last_commit_wrote(block) {
        // Written by the newest commit, made with one flush: damage there is what a power
        // cut during that commit leaves. fsck notes it and checks the generation before.
        let rep = fsck_ok(img)?;
        ensure!(rep.is_clean(), "fsck problems: {}", short(&rep.problems));
        ensure!(rep.generation == fx.old.generation, "fsck checked generation {}", rep.generation);
        let want = format!("generation {} did not fully reach the disk", fx.new.generation);
        ensure!(
            rep.notes.iter().any(|n| n.contains(&want) && n.contains(&tag) && n.contains(detail)),
            "fsck notes lack {want:?} {tag} {detail}: {:?}",
            rep.notes
        );
    } else {
        fsck_problem(img, &[&tag, detail])?;
    }
    if !fx.new.open_reads(block) {
        let (_, r) = open_img(img)?;
        let mut s = r.map_err(|e| format!("open failed although only an older fs leaf is damaged: {e}"))?;
        let g = fx.new.generation;
        ensure!(s.generation() == g, "opened generation {}, want the newest {g}", s.generation());
        let got = dump_soft(&mut s)?;
        let failed = check_sound(&got, &fx.dumps[&g])?;
        let errors: Vec<String> = got
            .dir_errors
            .iter()
            .map(|(_, e)| e.to_string())
            .chain(got.entries.values().filter_map(|v| v.content.as_ref().err().map(|e| e.to_string())))
            .chain(got.entries.values().filter_map(|v| v.xattrs.as_ref().err().map(|e| e.to_string())))
            .collect();
        let missing = fx.dumps[&g].keys().filter(|p| !got.entries.contains_key(*p)).count();
        // Names are looked up too (a listing reads the index items, not the entries).
        let mut errors = errors;
        for p in fx.dumps[&g].keys() {
            let mut dir = ROOT_INO;
            for name in p.split('/').filter(|c| !c.is_empty()) {
                match guard("lookup", || s.lookup(dir, name.as_bytes()))? {
                    Ok(i) => dir = i.ino,
                    Err(e) => {
                        ensure!(e.errno() == 5 && e.is_corruption(), "lookup of {p}: non-corruption error {e:?}");
                        errors.push(e.to_string());
                        break;
                    }
                }
            }
        }
        ensure!(
            errors.iter().any(|e| e.contains(&tag) && e.contains(detail)),
            "no read names the damaged leaf ({tag} {detail}): {} failed, {missing} missing, errors {:?}",
            failed.len(),
            errors.iter().take(3).collect::<Vec<_>>()
        );
        return Ok(());
    }
    if fx.shared(block) {
        let (_, r) = open_img(img)?;
        match r {
            Err(e @ Error::BadImage(_)) => {
                let m = e.to_string();
                for n in [
                    tag.as_str(),
                    detail,
                    &format!("generation {} unusable", fx.new.generation),
                    &format!("generation {} unusable", fx.old.generation),
                ] {
                    ensure!(m.contains(n), "open error lacks {n:?}: {m}");
                }
                Ok(())
            }
            Err(e) => Err(format!("open: expected BadImage, got {e:?}")),
            Ok(s) => Err(format!("opened generation {} although both generations use block {block}", s.generation())),
        }
    } else {
        expect_fallback(fx, img, &[&format!("generation {} unusable", fx.new.generation), &tag, detail])
    }
}

/// Data blocks at (path, file offset) are damaged: fsck names inode, offset and block; the
/// image opens at the newest generation; those files' reads fail with `DataChecksum`
/// naming exactly that place; everything else reads back intact. Returns the open store.
fn expect_data_damage(fx: &Fixture, img: &[u8], bad: &[(&str, u64)]) -> R<Store> {
    keep(img);
    let g = &fx.new;
    let mut damaged = BTreeSet::new();
    let mut want = Vec::new();
    for &(p, off) in bad {
        let ino = fx.ino(p)?;
        let b = g.disk_block(ino, off)?;
        damaged.insert(b);
        want.push((p, ino, off, b));
    }
    let rep = fsck_ok(img)?;
    for &(_, ino, off, b) in &want {
        let needle = format!("inode {ino}: data checksum mismatch at file offset {off} (disk block {b})");
        ensure!(rep.problems.iter().any(|p| p.contains(&needle)), "fsck lacks {needle:?}: {}", short(&rep.problems));
    }
    ensure!(
        rep.problems.iter().all(|p| p.contains("data checksum mismatch")),
        "fsck reports more than the data damage: {}",
        short(&rep.problems)
    );
    let (_, r) = open_img(img)?;
    let mut s = r.map_err(|e| format!("open failed: {e}"))?;
    ensure!(s.generation() == g.generation, "opened generation {}", s.generation());
    let got = dump_soft(&mut s)?;
    check_dump(&got, &fx.dumps[&g.generation], g, &damaged)?;
    for &(p, ino, off, b) in &want {
        match &got.entries[p].content {
            Err(e @ Error::DataChecksum { ino: i, file_offset, block, .. }) => {
                ensure!(
                    *i == ino && *file_offset == off && *block == b,
                    "{p}: error names inode {i} offset {file_offset} block {block}, want {ino} {off} {b}"
                );
                let m = e.to_string();
                let needle = format!("inode {ino} at file offset {off} (disk block {b})");
                ensure!(m.contains(&needle), "{p}: message {m:?} lacks {needle:?}");
            }
            other => return Err(format!("{p}: want DataChecksum, got {:?}", other.as_ref().map(Vec::len))),
        }
    }
    Ok(s)
}

/// `r` is a `DataChecksum` for `ino` at `off` in disk block `block`.
fn is_data_err<T>(r: &Result<T, Error>, ino: u64, off: u64, block: u64) -> R {
    match r {
        Err(e @ Error::DataChecksum { ino: i, file_offset, block: b, .. }) => {
            ensure!(
                *i == ino && *file_offset == off && *b == block && e.errno() == 5 && e.is_corruption(),
                "imprecise {e}, want inode {ino} offset {off} block {block}"
            );
            Ok(())
        }
        Err(e) => Err(format!("want DataChecksum, got {e:?}")),
        Ok(_) => Err(format!("read succeeded although block {block} of inode {ino} is damaged (WRONG DATA)")),
    }
}

fn read_eq(s: &mut Store, ino: u64, off: u64, len: u64, want: &[u8]) -> R {
    let got = guard("read", || s.read(ino, off, len))?.map_err(|e| format!("read {ino} @{off}+{len}: {e}"))?;
    ensure!(got == want, "read {ino} @{off}+{len} returned other bytes (WRONG DATA)");
    Ok(())
}

// ---- the corpus ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Group {
    Superblock,
    Node,
    Misdirected,
    Data,
    /// Damage with the checksum fixed afterwards, run in a child process (see `run_isolated`).
    Resealed,
}

struct Case {
    id: u32,
    group: Group,
    what: &'static str,
    run: fn(&Fixture) -> R,
}

macro_rules! case {
    ($id:literal, $group:ident, $what:literal, $f:ident) => {
        Case { id: $id, group: Group::$group, what: $what, run: $f }
    };
}

/// The numbered corpus of corrupt images (all built from `main_fixture`). Groups `Superblock`
/// to `Data` run in-process; `Resealed` in child processes.
const CORPUS: &[Case] = &[
    case!(
        1,
        Superblock,
        "byte flipped in the newest superblock copy → falls back to the older generation; fsck problem",
        c001
    ),
    case!(2, Superblock, "byte flipped in the older superblock copy → newest generation; fsck problem", c002),
    case!(3, Superblock, "both superblock copies flipped → BadImage naming both copies", c003),
    case!(4, Superblock, "blank (all-zero) image → BadImage: bad magic", c004),
    case!(5, Superblock, "foreign ext4-like image → BadImage: bad magic", c005),
    case!(6, Superblock, "random noise image → BadImage: bad magic", c006),
    case!(7, Superblock, "format version 4 in both copies (checksum fixed) → BadImage: version", c007),
    case!(8, Superblock, "format version 4 in the newest copy only → BadImage: upgrade crest", c008),
    case!(9, Superblock, "image truncated to 12 of 16 MiB → BadImage: truncated", c009),
    case!(10, Superblock, "image truncated below the 4 MiB minimum → BadImage: too small", c010),
    case!(11, Superblock, "image length not a multiple of 4 KiB → BadImage: truncated", c011),
    case!(12, Superblock, "the two copies swapped → BadImage: copy index (misdirected)", c012),
    case!(13, Superblock, "newest copy's root tree pointer past the end (checksum fixed) → fallback", c013),
    case!(14, Superblock, "newest copy carries another fsid (checksum fixed) → fallback, fsck flags it", c014),
    case!(15, Superblock, "newest copy's root tree pointer a generation old (checksum fixed) → fallback", c015),
    case!(16, Superblock, "newest copy's used-block count off by one (checksum fixed) → opens, note, fsck flags", c016),
    case!(17, Node, "byte flipped in an fs-tree leaf both generations use → BadImage naming the block", c017),
    case!(18, Node, "byte flipped in an fs-tree leaf only the newest generation uses → fallback", c018),
    case!(19, Node, "byte flipped in a non-root internal fs-tree node → BadImage naming the block", c019),
    case!(20, Node, "byte flipped in the fs-tree root → fallback", c020),
    case!(21, Node, "byte flipped in the root-tree root → fallback", c021),
    case!(22, Node, "byte flipped in a refcount-tree leaf → BadImage naming the block", c022),
    case!(23, Node, "byte flipped in the refcount-tree root (internal) → BadImage naming the block", c023),
    case!(24, Node, "stored node checksum flipped → checksum mismatch", c024),
    case!(25, Node, "reserved node header byte set (outside the checksum) → reserved bytes", c025),
    case!(26, Node, "node block zeroed → checksum mismatch", c026),
    case!(27, Node, "node fsid changed (checksum fixed) → another file system", c027),
    case!(28, Node, "node owner changed (checksum fixed) → owner tree", c028),
    case!(29, Node, "leaf level changed to 1 (checksum fixed) → level", c029),
    case!(30, Node, "internal child pointer past the end (checksum fixed) → past the end", c030),
    case!(31, Node, "leaf item count + 1 (checksum fixed) → not packed", c031),
    case!(32, Node, "inode item with file type 99 (checksum fixed) → EIO on every op touching it", c032),
    case!(33, Node, "extent item pointing outside the image (checksum fixed) → EIO on read", c033),
    case!(34, Node, "extent item cross-linked to another file's blocks (checksum fixed) → DataChecksum", c034),
    case!(35, Misdirected, "fs leaf written over another fs leaf's block → misdirected", c035),
    case!(36, Misdirected, "refcount leaf written over an fs leaf's block → misdirected", c036),
    case!(37, Misdirected, "older version of a live node block written back → stale", c037),
    case!(38, Misdirected, "stale superblock (generation 2) in the older slot → harmless, fsck note", c038),
    case!(39, Misdirected, "stale older superblock + damaged newest → refused or generation-2 data only", c039),
    case!(40, Misdirected, "another file's data block written over a data block → DataChecksum", c040),
    case!(41, Misdirected, "old content written back over a live data block (lost write) → DataChecksum", c041),
    case!(42, Data, "byte flipped in the middle block of a 3-block file → DataChecksum, neighbours readable", c042),
    case!(43, Data, "first byte of a file flipped → a 1-byte read fails, the rest reads", c043),
    case!(44, Data, "last block of a file zeroed → DataChecksum at offset 8192", c044),
    case!(45, Data, "data damaged under an open store → EIO, read-modify-write refused, overwrite heals", c045),
    case!(46, Data, "long symlink's data block flipped → readlink fails with DataChecksum", c046),
    case!(47, Data, "byte flipped past EOF in a file's last block → that block is refused", c047),
    case!(48, Data, "byte flipped in a free block → no effect", c048),
    case!(49, Data, "byte flipped in a freed (stale) node block → no effect", c049),
    case!(50, Data, "bytes flipped in the reserved area outside the superblocks → no effect", c050),
    case!(51, Resealed, "symlink inode claiming 1 TiB (checksum fixed) → readlink fails with EIO, no abort", c051),
    case!(52, Resealed, "symlink inode claiming 1 TiB (checksum fixed) → fsck flags the inode", c052),
    case!(
        53,
        Resealed,
        "dataset inode count 0 in the root item (checksum fixed) → unlink neither panics nor wraps",
        c053
    ),
    case!(
        54,
        Resealed,
        "dataset next inode number near u64::MAX (checksum fixed) → create never reuses an inode",
        c054
    ),
];

fn only_case() -> Option<u32> {
    std::env::var("CREST_CORRUPT_CASE").ok().and_then(|v| v.trim().parse().ok())
}

/// Runs corpus case `id` on the main image, turning a panic into an error.
fn run_case(id: u64) -> R {
    let c = CORPUS.iter().find(|c| u64::from(c.id) == id).ok_or_else(|| format!("no case {id}"))?;
    CURRENT_CASE.with(|x| x.set(c.id));
    SAVED.with(|x| x.set(0));
    let fx = main_fixture();
    install_panic_hook();
    match catch_unwind(AssertUnwindSafe(|| (c.run)(fx))) {
        Ok(r) => r,
        Err(_) => Err(format!("PANIC: {}", LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default())),
    }
}

fn run_group(group: Group) {
    let only = only_case();
    let mut failures = Vec::new();
    let mut ran = 0;
    for c in CORPUS.iter().filter(|c| c.group == group && only.is_none_or(|o| o == c.id)) {
        ran += 1;
        let verdict = match run_case(u64::from(c.id)) {
            Ok(()) => "ok",
            Err(m) => {
                let v = if m.starts_with("PANIC") { "PANIC" } else { "FAIL" };
                failures.push(format!("case {:03} ({}): {m}", c.id, c.what));
                v
            }
        };
        eprintln!("case {:03} {verdict:5} {}", c.id, c.what);
    }
    eprintln!("{group:?} corpus: {ran} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{} corpus case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn corpus_is_numbered() {
    for (i, c) in CORPUS.iter().enumerate() {
        assert_eq!(c.id as usize, i + 1, "corpus numbers run 1, 2, 3, … without gaps");
        assert!(!c.what.is_empty() && !c.what.contains('\n'), "case {} needs a one-line description", c.id);
    }
}

#[test]
fn superblock_corpus() {
    run_group(Group::Superblock);
}

#[test]
fn node_corpus() {
    run_group(Group::Node);
}

#[test]
fn misdirected_and_stale_corpus() {
    run_group(Group::Misdirected);
}

#[test]
fn data_block_corpus() {
    run_group(Group::Data);
}

#[test]
fn resealed_corpus() {
    let only = only_case();
    let cases: Vec<&Case> =
        CORPUS.iter().filter(|c| c.group == Group::Resealed && only.is_none_or(|o| o == c.id)).collect();
    let ids: Vec<u64> = cases.iter().map(|c| u64::from(c.id)).collect();
    let failures = run_isolated("case", &ids);
    for c in &cases {
        let label = format!("case {:03}:", c.id);
        let verdict = if failures.iter().any(|f| f.starts_with(&label)) { "FAIL" } else { "ok" };
        eprintln!("case {:03} {verdict:5} {}", c.id, c.what);
    }
    assert!(failures.is_empty(), "{} corpus case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

// ---- superblock cases ---------------------------------------------------------------------

fn c001(fx: &Fixture) -> R {
    let copy = fx.new.copy;
    let mut img = fx.image.clone();
    blk_mut(&mut img, sb_block(copy))[100] ^= 0x08;
    // Open falls back to the other copy, but fsck reports the damaged one.
    let rep = fsck_problem(
        &img,
        &[&format!("superblock copy {copy}:"), &format!("at byte {}", sb_block(copy) * BS64), "checksum mismatch"],
    )?;
    ensure!(rep.generation == fx.old.generation, "fsck checked generation {}", rep.generation);
    ensure!(rep.problems.len() == 1, "fsck problems besides the superblock: {}", short(&rep.problems));
    expect_fallback(
        fx,
        &img,
        &[&format!("superblock copy {copy}: corrupt superblock at block {}", sb_block(copy)), "checksum mismatch"],
    )
}

fn c002(fx: &Fixture) -> R {
    let copy = fx.old.copy;
    let mut img = fx.image.clone();
    blk_mut(&mut img, sb_block(copy))[300] ^= 0x01;
    let rep = fsck_problem(
        &img,
        &[&format!("superblock copy {copy}:"), &format!("at byte {}", sb_block(copy) * BS64), "checksum mismatch"],
    )?;
    ensure!(rep.generation == fx.new.generation, "fsck checked generation {}", rep.generation);
    ensure!(rep.problems.len() == 1, "fsck problems besides the superblock: {}", short(&rep.problems));
    expect_opens_intact(fx, &img, &fx.new, &[&format!("superblock copy {copy}:"), "checksum mismatch"])
}

fn c003(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    blk_mut(&mut img, sb_block(0))[70] ^= 0x80;
    blk_mut(&mut img, sb_block(1))[4000] ^= 0x02;
    expect_bad_image(
        &img,
        &["no valid superblock", "superblock copy 0:", "superblock copy 1:", "checksum mismatch"],
        &["superblock copy 0:", "superblock copy 1:", "checksum mismatch"],
    )
}

const BAD_MAGIC: [&str; 4] = ["bad magic", "not a crest image?", "superblock copy 0", "superblock copy 1"];

fn c004(_: &Fixture) -> R {
    expect_bad_image(&vec![0u8; 16 << 20], &BAD_MAGIC, &BAD_MAGIC)
}

fn c005(_: &Fixture) -> R {
    // An ext4-ish layout: superblock at byte 1024 with magic 0xEF53, then group descriptors
    // and inode tables over the blocks where crest keeps its superblocks.
    let mut img = vec![0u8; 16 << 20];
    img[1024..1028].copy_from_slice(&4096u32.to_le_bytes()); // inodes count
    img[1028..1032].copy_from_slice(&4096u32.to_le_bytes()); // blocks count
    img[1080..1082].copy_from_slice(&0xEF53u16.to_le_bytes());
    let tables = pattern(300 * BS, 5);
    img[BS..301 * BS].copy_from_slice(&tables);
    expect_bad_image(&img, &BAD_MAGIC, &BAD_MAGIC)
}

fn c006(_: &Fixture) -> R {
    expect_bad_image(&pattern(16 << 20, 6), &BAD_MAGIC, &BAD_MAGIC)
}

fn c007(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    for copy in 0..2 {
        patch_sb(&mut img, copy, |b| b[SB_VERSION..SB_VERSION + 4].copy_from_slice(&4u32.to_le_bytes()));
    }
    let n = ["on-disk format version 4; this crest reads versions 2 to 3", "upgrade crest"];
    expect_bad_image(&img, &n, &n)
}

fn c008(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    patch_sb(&mut img, fx.new.copy, |b| b[SB_VERSION..SB_VERSION + 4].copy_from_slice(&4u32.to_le_bytes()));
    // Not a fallback: that would silently undo what the newer crest did.
    let n = [&format!("superblock copy {}:", fx.new.copy), "format version 4", "upgrade crest"];
    expect_bad_image(&img, &n, &n)
}

fn c009(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    img.truncate(12 << 20);
    let n = format!("file system has {} blocks but the image holds only 3072 (truncated image?)", fx.new.total_blocks);
    expect_bad_image(&img, &[&n, "superblock copy 0", "superblock copy 1"], &[&n])
}

fn c010(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    img.truncate(3 << 20);
    expect_bad_image(&img, &["3145728 bytes is too small to be a crest image (truncated?)"], &["truncated image?"])
}

fn c011(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    img.truncate((16 << 20) - 100);
    let n = format!("file system has {} blocks but the image holds only 4095 (truncated image?)", fx.new.total_blocks);
    expect_bad_image(&img, &[&n], &[&n])
}

fn c012(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    let a = blk(&img, sb_block(0)).to_vec();
    let b = blk(&img, sb_block(1)).to_vec();
    blk_mut(&mut img, sb_block(0)).copy_from_slice(&b);
    blk_mut(&mut img, sb_block(1)).copy_from_slice(&a);
    let n = ["copy index 1 found where copy 0 belongs (misdirected write?)", "copy index 0 found where copy 1 belongs"];
    expect_bad_image(&img, &n, &n)
}

fn c013(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    let past = fx.new.total_blocks + 10;
    patch_sb(&mut img, fx.new.copy, |b| put_u64(b, SB_ROOT_TREE, past));
    expect_fallback(fx, &img, &[&format!("superblock copy {}:", fx.new.copy), "root tree root", "outside the image"])
}

fn c014(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    patch_sb(&mut img, fx.new.copy, |b| b[SB_FSID..SB_FSID + 16].copy_from_slice(&[9; 16]));
    let rep = fsck_ok(&img)?;
    ensure!(
        rep.problems.iter().any(|p| p.contains("superblock copies disagree on fsid or size")),
        "fsck problems: {}",
        short(&rep.problems)
    );
    ensure!(
        rep.problems.iter().any(|p| p.contains("belongs to another file system (fsid mismatch)")),
        "fsck problems: {}",
        short(&rep.problems)
    );
    expect_fallback(
        fx,
        &img,
        &[
            "the superblock copies belong to different file systems",
            &format!("generation {} unusable", fx.new.generation),
            "fsid mismatch",
        ],
    )
}

fn c015(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    let real = fx.new.root_tree.generation;
    ensure!(real > 1, "root tree root at generation {real}");
    patch_sb(&mut img, fx.new.copy, |b| put_u64(b, SB_ROOT_TREE + 8, real - 1));
    let detail = format!("generation {real}, parent expects {} (stale or lost write)", real - 1);
    fsck_problem(&img, &[&format!("at block {}:", fx.new.root_tree.block), &detail])?;
    expect_fallback(fx, &img, &[&format!("at block {}:", fx.new.root_tree.block), &detail])
}

fn c016(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    let used = fx.new.used_blocks;
    patch_sb(&mut img, fx.new.copy, |b| put_u64(b, SB_USED_BLOCKS, used - 1));
    let rep =
        fsck_problem(&img, &[&format!("superblock says {} blocks used; trees and extents use {used}", used - 1)])?;
    ensure!(rep.problems.len() == 1, "fsck problems: {}", short(&rep.problems));
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    ensure!(s.generation() == fx.new.generation, "opened generation {}", s.generation());
    let notes = s.open_notes().join(" | ");
    let n = format!("superblock says {} blocks used, the trees reach {used}", used - 1);
    ensure!(notes.contains(&n), "open notes lack {n:?}: {notes}");
    check_dump(&dump_soft(&mut s)?, &fx.dumps[&fx.new.generation], &fx.new, &BTreeSet::new())
}

// ---- node cases ---------------------------------------------------------------------------

fn flip(img: &mut [u8], block: u64, at: usize, x: u8) {
    blk_mut(img, block)[at] ^= x;
}

fn fs_leaf(fx: &Fixture, shared: bool) -> R<u64> {
    fx.pick(if shared { "shared fs leaf" } else { "newest-only fs leaf" }, |b, n| {
        n.owner == FS_TREE_ID && n.level == 0 && fx.shared(b) == shared
    })
}

fn flip_case(fx: &Fixture, block: u64, at: usize) -> R {
    let mut img = fx.image.clone();
    flip(&mut img, block, at, 0x10);
    expect_node_damage(fx, &img, block, "checksum mismatch")
}

fn c017(fx: &Fixture) -> R {
    flip_case(fx, fs_leaf(fx, true)?, 2000)
}

fn c018(fx: &Fixture) -> R {
    flip_case(fx, fs_leaf(fx, false)?, 100)
}

fn c019(fx: &Fixture) -> R {
    let fs_level = fx.new.levels[&FS_TREE_ID];
    ensure!(fs_level >= 2, "fs tree has only {} levels; the fixture needs more files", fs_level + 1);
    let b = fx.pick("shared non-root internal fs node", |b, n| {
        n.owner == FS_TREE_ID && n.level > 0 && !n.is_root && fx.shared(b)
    })?;
    flip_case(fx, b, 90)
}

fn c020(fx: &Fixture) -> R {
    let b = fx.pick("fs root", |_, n| n.owner == FS_TREE_ID && n.is_root)?;
    ensure!(!fx.shared(b), "the fs root is shared");
    flip_case(fx, b, 81)
}

fn c021(fx: &Fixture) -> R {
    let b = fx.new.root_tree.block;
    ensure!(!fx.shared(b), "the root tree root is shared");
    flip_case(fx, b, 4095)
}

fn c022(fx: &Fixture) -> R {
    let b = fx.pick("refcount leaf", |_, n| n.owner == REFCOUNT_TREE_ID && n.level == 0)?;
    ensure!(fx.shared(b), "refcount leaf {b} is not shared (fixture changed?)");
    flip_case(fx, b, 500)
}

fn c023(fx: &Fixture) -> R {
    let b = fx.pick("refcount root", |_, n| n.owner == REFCOUNT_TREE_ID && n.is_root)?;
    ensure!(fx.new.nodes[&b].level > 0, "refcount root is a leaf; the fixture needs more extents");
    flip_case(fx, b, 33)
}

fn c024(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    flip(&mut img, b, 1, 0xff);
    expect_node_damage(fx, &img, b, "checksum mismatch")
}

fn c025(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    blk_mut(&mut img, b)[12] = 0x5a;
    expect_node_damage(fx, &img, b, "non-zero reserved header bytes")
}

fn c026(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    blk_mut(&mut img, b).fill(0);
    expect_node_damage(fx, &img, b, "checksum mismatch: stored 0x00000000")
}

fn c027(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    patch_node(&mut img, b, |n| n[40] ^= 1);
    expect_node_damage(fx, &img, b, "belongs to another file system (fsid mismatch)")
}

fn c028(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    patch_node(&mut img, b, |n| put_u64(n, 64, REFCOUNT_TREE_ID));
    expect_node_damage(fx, &img, b, &format!("owner tree {REFCOUNT_TREE_ID}, expected {FS_TREE_ID}"))
}

fn c029(fx: &Fixture) -> R {
    let b = fs_leaf(fx, true)?;
    let mut img = fx.image.clone();
    patch_node(&mut img, b, |n| n[72] = 1);
    expect_node_damage(fx, &img, b, "level 1, parent expects 0")
}

fn c030(fx: &Fixture) -> R {
    let b = fx.pick("shared internal fs node", |b, n| n.owner == FS_TREE_ID && n.level > 0 && fx.shared(b))?;
    let past = fx.new.total_blocks + 7;
    let mut img = fx.image.clone();
    patch_node(&mut img, b, |n| put_u64(n, 80 + 17, past));
    expect_node_damage(fx, &img, b, &format!("child 0 points at block {past}, past the end"))
}

fn c031(fx: &Fixture) -> R {
    let b = fx.pick("shared fs leaf with room", |b, n| {
        n.owner == FS_TREE_ID && n.level == 0 && fx.shared(b) && n.free >= 21
    })?;
    let mut img = fx.image.clone();
    patch_node(&mut img, b, |n| {
        let c = get_u16(n, 74) as u16 + 1;
        n[74..76].copy_from_slice(&c.to_le_bytes());
    });
    expect_node_damage(fx, &img, b, "is not packed")
}

fn c032(fx: &Fixture) -> R {
    let ino = fx.ino("/big-001")?;
    let (leaf, off, len) = fx.item(Inode::key(ino))?;
    ensure!(len == 128, "inode item of {len} bytes");
    let mut img = fx.image.clone();
    patch_node(&mut img, leaf, |n| n[off + 8] = 99);
    keep(&img);
    fsck_problem(&img, &[&format!("({ino} 1 0)"), "unknown file type 99"])?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    ensure!(s.generation() == fx.new.generation, "opened generation {}", s.generation());
    let eio = |what: &str, r: Result<String, Error>| -> R {
        match r {
            Err(e) if e.errno() == 5 && e.is_corruption() && e.to_string().contains("unknown file type 99") => Ok(()),
            other => Err(format!("{what}: want EIO naming the bad file type, got {other:?}")),
        }
    };
    eio("getattr", guard("getattr", || s.getattr(ino))?.map(|i| format!("{i:?}")))?;
    eio("lookup", guard("lookup", || s.lookup(ROOT_INO, b"big-001"))?.map(|i| format!("{i:?}")))?;
    eio("read", guard("read", || s.read(ino, 0, 10))?.map(|v| format!("{} bytes", v.len())))?;
    eio("listxattr", guard("listxattr", || s.listxattr(ino))?.map(|v| format!("{v:?}")))?;
    eio("write", guard("write", || s.write(ino, 0, b"x", t(60)))?.map(|i| format!("{i:?}")))?;
    // Its neighbours are fine.
    let ino2 = guard("lookup", || s.lookup(ROOT_INO, b"big-002"))?.map_err(|e| format!("lookup big-002: {e}"))?.ino;
    read_eq(&mut s, ino2, 0, 10_000, fx.content("/big-002")?)?;
    let got = dump_soft(&mut s)?;
    check_sound(&got, &fx.dumps[&fx.new.generation])?;
    // readdir returns each entry with its attributes, so a batch holding big-001 fails as a
    // whole (here the first batch of /); batches after it and other directories still work.
    ensure!(got.dir_errors.iter().any(|(p, _)| p.is_empty()), "listing / did not fail although it names big-001");
    let after = guard("readdir", || s.readdir(ROOT_INO, 3, 1000))?.map_err(|e| format!("readdir / from 3: {e}"))?;
    ensure!(after.first().is_some_and(|(e, _)| e.name == b"big-002"), "readdir / from index 3 starts elsewhere");
    let d = guard("lookup", || s.lookup(ROOT_INO, b"d"))?.map_err(|e| format!("lookup d: {e}"))?.ino;
    let listing = guard("readdir", || s.readdir(d, 0, 10_000))?.map_err(|e| format!("readdir /d: {e}"))?;
    ensure!(listing.len() == SMALL_FILES, "/d lists {} entries", listing.len());
    Ok(())
}

fn c033(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let (leaf, off, _) = fx.item(Key::new(ino, kind::EXTENT, 0))?;
    let past = fx.new.total_blocks + 100;
    let mut img = fx.image.clone();
    patch_node(&mut img, leaf, |n| put_u64(n, off + 1, past));
    keep(&img);
    fsck_problem(&img, &[&format!("({ino} 5 0)"), "outside the image"])?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    ensure!(s.generation() == fx.new.generation, "opened generation {}", s.generation());
    match guard("read", || s.read(ino, 0, 100))? {
        Err(e) if e.errno() == 5 && e.is_corruption() && e.to_string().contains("outside the image") => {}
        other => return Err(format!("read: want EIO (extent outside the image), got {:?}", other.map(|v| v.len()))),
    }
    let got = dump_soft(&mut s)?;
    let failed = check_sound(&got, &fx.dumps[&fx.new.generation])?;
    ensure!(got.dir_errors.is_empty() && failed == ["/three"], "failures: {failed:?} / {}", got.dir_errors.len());
    Ok(())
}

fn c034(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let other = fx.ino("/big-000")?;
    let other_block = fx.new.disk_block(other, 0)?;
    let (leaf, off, _) = fx.item(Key::new(ino, kind::EXTENT, 0))?;
    let mut img = fx.image.clone();
    patch_node(&mut img, leaf, |n| put_u64(n, off + 1, other_block));
    keep(&img);
    fsck_problem(&img, &[&format!("inode {ino}: data checksum mismatch at file offset 0 (disk block {other_block})")])?;
    fsck_problem(&img, &["extents reference it"])?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    is_data_err(&guard("read", || s.read(ino, 0, 3 * BS64))?, ino, 0, other_block)?;
    read_eq(&mut s, other, 0, 5000, fx.content("/big-000")?)?;
    let got = dump_soft(&mut s)?;
    let failed = check_sound(&got, &fx.dumps[&fx.new.generation])?;
    ensure!(got.dir_errors.is_empty() && failed == ["/three"], "failures: {failed:?}");
    Ok(())
}

// ---- misdirected and stale writes ---------------------------------------------------------

fn c035(fx: &Fixture) -> R {
    let victim = fs_leaf(fx, true)?;
    let source = fx.pick("another fs leaf", |b, n| n.owner == FS_TREE_ID && n.level == 0 && b != victim)?;
    let mut img = fx.image.clone();
    let bytes = blk(&img, source).to_vec();
    blk_mut(&mut img, victim).copy_from_slice(&bytes);
    expect_node_damage(fx, &img, victim, &format!("header says block {source}: misdirected write or read"))
}

fn c036(fx: &Fixture) -> R {
    let victim = fs_leaf(fx, false)?;
    let source = fx.pick("refcount leaf", |_, n| n.owner == REFCOUNT_TREE_ID && n.level == 0)?;
    let mut img = fx.image.clone();
    let bytes = blk(&img, source).to_vec();
    blk_mut(&mut img, victim).copy_from_slice(&bytes);
    expect_node_damage(fx, &img, victim, &format!("header says block {source}: misdirected"))
}

fn c037(fx: &Fixture) -> R {
    // A live node whose block held, at generation 2, another valid node written to that
    // same block: putting that one back is a stale (lost) write.
    let fsid = [7u8; 16];
    let cand = fx.new.nodes.iter().find(|(b, n)| {
        let old = blk(&fx.early, **b);
        crc_ok(old)
            && old[32..48] == fsid
            && get_u64(old, 48) == **b
            && get_u64(old, 56) < n.generation
            && get_u64(old, 64) == n.owner
            && old[72] == n.level
    });
    let (&b, n) = cand.ok_or("no live node whose block held an older node of the same tree at generation 2")?;
    let old_gen = get_u64(blk(&fx.early, b), 56);
    let mut img = fx.image.clone();
    let bytes = blk(&fx.early, b).to_vec();
    blk_mut(&mut img, b).copy_from_slice(&bytes);
    expect_node_damage(
        fx,
        &img,
        b,
        &format!("generation {old_gen}, parent expects {} (stale or lost write)", n.generation),
    )
}

/// The image with the older slot holding the generation-2 superblock.
fn with_stale_sb(fx: &Fixture) -> R<Vec<u8>> {
    let early_copy = Superblock::copy_for_generation(fx.early_gen);
    ensure!(early_copy == fx.old.copy, "generation {} lives in the newest slot", fx.early_gen);
    let mut img = fx.image.clone();
    let bytes = blk(&fx.early, sb_block(early_copy)).to_vec();
    blk_mut(&mut img, sb_block(early_copy)).copy_from_slice(&bytes);
    Ok(img)
}

fn c038(fx: &Fixture) -> R {
    let img = with_stale_sb(fx)?;
    let rep = fsck_ok(&img)?;
    let n = format!("superblock copies at generations {} and {}", fx.new.generation, fx.early_gen);
    ensure!(rep.notes.iter().any(|x| x.contains(&n)), "fsck notes lack {n:?}: {:?}", rep.notes);
    expect_intact(fx, &img, &fx.new, &[])
}

fn c039(fx: &Fixture) -> R {
    let mut img = with_stale_sb(fx)?;
    flip(&mut img, sb_block(fx.new.copy), 200, 0x04);
    keep(&img);
    // Generation 2's blocks were freed and reused since: find out what is left of it.
    let g2 = walk_generation(&img, fx.old.copy);
    let rep = fsck_ok(&img)?;
    ensure!(rep.generation == fx.early_gen, "fsck checked generation {}", rep.generation);
    let (_, r) = open_img(&img)?;
    match (g2, r) {
        (Err(why), Err(e @ Error::BadImage(_))) => {
            ensure!(!rep.is_clean(), "fsck is clean although generation 2 is broken ({why})");
            let m = e.to_string();
            let n = format!("generation {} unusable", fx.early_gen);
            ensure!(m.contains(&n), "open error lacks {n:?}: {m}");
            ensure!(
                ["stale", "misdirected", "checksum mismatch", "owner tree", "level"].iter().any(|d| m.contains(d)),
                "open error does not say what is wrong: {m}"
            );
            Ok(())
        }
        (Ok(g), Ok(mut s)) => {
            ensure!(s.generation() == fx.early_gen, "opened generation {}", s.generation());
            let damaged = g.data_blocks().into_iter().filter(|b| blk(&img, *b) != blk(&fx.early, *b)).collect();
            check_dump(&dump_soft(&mut s)?, &fx.dumps[&fx.early_gen], &g, &damaged)
        }
        (g2, r) => Err(format!(
            "generation 2 walk says {:?} but open says {:?}",
            g2.map(|g| g.generation),
            r.map(|s| s.generation())
        )),
    }
}

fn c040(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let src = fx.new.disk_block(fx.ino("/big-000")?, 0)?;
    let dst = fx.new.disk_block(ino, 0)?;
    let mut img = fx.image.clone();
    let bytes = blk(&img, src).to_vec();
    blk_mut(&mut img, dst).copy_from_slice(&bytes);
    let mut s = expect_data_damage(fx, &img, &[("/three", 0)])?;
    read_eq(&mut s, fx.ino("/big-000")?, 0, 5000, fx.content("/big-000")?)?;
    read_eq(&mut s, ino, 4096, 8192, &fx.content("/three")?[4096..])
}

fn c041(fx: &Fixture) -> R {
    let data = fx.new.data_blocks();
    let b = data
        .iter()
        .copied()
        .find(|b| blk(&fx.early, *b) != blk(&fx.image, *b))
        .ok_or("no live data block whose generation-2 content differs")?;
    let (ino, off) = fx.new.owner_of(b).ok_or("block has no owner")?;
    let path = fx.path_of(ino).ok_or("inode has no path")?.to_string();
    let mut img = fx.image.clone();
    let bytes = blk(&fx.early, b).to_vec();
    blk_mut(&mut img, b).copy_from_slice(&bytes);
    expect_data_damage(fx, &img, &[(&path, off)]).map(drop)
}

// ---- data cases ---------------------------------------------------------------------------

fn c042(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let b1 = fx.new.disk_block(ino, 4096)?;
    let want = fx.content("/three")?;
    let mut img = fx.image.clone();
    flip(&mut img, b1, 77, 0x20);
    let mut s = expect_data_damage(fx, &img, &[("/three", 4096)])?;
    read_eq(&mut s, ino, 0, 4096, &want[..4096])?;
    read_eq(&mut s, ino, 8192, 4096, &want[8192..])?;
    is_data_err(&guard("read", || s.read(ino, 4000, 200))?, ino, 4096, b1)?;
    is_data_err(&guard("read", || s.read(ino, 4196, 10))?, ino, 4096, b1)?;
    Ok(())
}

fn c043(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let b0 = fx.new.disk_block(ino, 0)?;
    let mut img = fx.image.clone();
    flip(&mut img, b0, 0, 0x01);
    let mut s = expect_data_damage(fx, &img, &[("/three", 0)])?;
    is_data_err(&guard("read", || s.read(ino, 0, 1))?, ino, 0, b0)?;
    read_eq(&mut s, ino, 4096, 8192, &fx.content("/three")?[4096..])
}

fn c044(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let b2 = fx.new.disk_block(ino, 8192)?;
    let mut img = fx.image.clone();
    blk_mut(&mut img, b2).fill(0);
    let mut s = expect_data_damage(fx, &img, &[("/three", 8192)])?;
    read_eq(&mut s, ino, 0, 8192, &fx.content("/three")?[..8192])
}

fn c045(fx: &Fixture) -> R {
    let ino = fx.ino("/three")?;
    let b1 = fx.new.disk_block(ino, 4096)?;
    let want = fx.content("/three")?.to_vec();
    let disk = MemDisk::from_bytes(fx.image.clone());
    let mut s = guard("Store::open", || Store::open(Box::new(disk.clone())))?.map_err(|e| format!("open: {e}"))?;
    read_eq(&mut s, ino, 0, 3 * BS64, &want)?;
    disk.with_bytes(|b| b[b1 as usize * BS + 123] ^= 0x20);
    keep(&disk.snapshot());
    is_data_err(&guard("read", || s.read(ino, 0, 3 * BS64))?, ino, 4096, b1)?;
    read_eq(&mut s, ino, 0, 4096, &want[..4096])?;
    // A partial write into the damaged block needs its old bytes: refused, not merged.
    is_data_err(&guard("write", || s.write(ino, 4096 + 10, b"zz", t(70)))?, ino, 4096, b1)?;
    // A whole-block overwrite does not need them and heals the file.
    let fresh_block = pattern(BS, 45);
    guard("write", || s.write(ino, 4096, &fresh_block, t(71)))?.map_err(|e| format!("whole-block write: {e}"))?;
    let mut healed = want.clone();
    healed[4096..8192].copy_from_slice(&fresh_block);
    read_eq(&mut s, ino, 0, 3 * BS64, &healed)?;
    guard("commit", || s.commit())?.map_err(|e| format!("commit: {e}"))?;
    drop(s);
    let img = disk.snapshot();
    let rep = fsck_ok(&img)?;
    ensure!(rep.is_clean(), "fsck after healing: {}", short(&rep.problems));
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("reopen: {e}"))?;
    read_eq(&mut s, ino, 0, 3 * BS64, &healed)
}

fn c046(fx: &Fixture) -> R {
    let ino = fx.ino("/link")?;
    let b = fx.new.disk_block(ino, 0)?;
    let mut img = fx.image.clone();
    flip(&mut img, b, 1500, 0x40);
    let mut s = expect_data_damage(fx, &img, &[("/link", 0)])?;
    is_data_err(&guard("readlink", || s.readlink(ino))?, ino, 0, b)?;
    let attr = guard("lookup", || s.lookup(ROOT_INO, b"link"))?.map_err(|e| format!("lookup: {e}"))?;
    ensure!(attr.size == 3000 && attr.kind == FileKind::Symlink, "symlink attributes changed: {attr:?}");
    Ok(())
}

fn c047(fx: &Fixture) -> R {
    let ino = fx.ino("/big-007")?;
    let want = fx.content("/big-007")?;
    ensure!(want.len() == 5000, "big-007 is {} bytes", want.len());
    let b1 = fx.new.disk_block(ino, 4096)?;
    let mut img = fx.image.clone();
    flip(&mut img, b1, 2000, 0x08); // file byte 6096, past the end of the file
    let mut s = expect_data_damage(fx, &img, &[("/big-007", 4096)])?;
    read_eq(&mut s, ino, 0, 4096, &want[..4096])?;
    is_data_err(&guard("read", || s.read(ino, 4096, 100))?, ino, 4096, b1)
}

fn unused_blocks(fx: &Fixture) -> Vec<u64> {
    let mut live = fx.new.live();
    live.extend(fx.old.live());
    (RESERVED_BLOCKS..fx.new.total_blocks).filter(|b| !live.contains(b)).collect()
}

fn c048(fx: &Fixture) -> R {
    let b = unused_blocks(fx)
        .into_iter()
        .find(|b| blk(&fx.image, *b).iter().all(|&x| x == 0))
        .ok_or("no never-used block")?;
    let mut img = fx.image.clone();
    flip(&mut img, b, 9, 0xff);
    expect_intact(fx, &img, &fx.new, &[])
}

fn c049(fx: &Fixture) -> R {
    let b = unused_blocks(fx)
        .into_iter()
        .find(|b| {
            let x = blk(&fx.image, *b);
            crc_ok(x) && x[32..48] == [7u8; 16]
        })
        .ok_or("no freed node block")?;
    let mut img = fx.image.clone();
    flip(&mut img, b, 300, 0x11);
    expect_intact(fx, &img, &fx.new, &[])
}

fn c050(fx: &Fixture) -> R {
    let mut img = fx.image.clone();
    for b in [0u64, 1, 100, 255] {
        flip(&mut img, b, 17, 0x5a);
    }
    expect_intact(fx, &img, &fx.new, &[])
}

// ---- damage with the checksum fixed -------------------------------------------------------

/// The main image with the `/link` symlink's inode claiming 1 TiB.
fn huge_symlink(fx: &Fixture) -> R<(u64, Vec<u8>)> {
    let ino = fx.ino("/link")?;
    let (leaf, off, len) = fx.item(Inode::key(ino))?;
    ensure!(len == 128, "inode item of {len} bytes");
    let mut img = fx.image.clone();
    patch_node(&mut img, leaf, |n| put_u64(n, off + 32, 1 << 40));
    keep(&img);
    Ok((ino, img))
}

fn c051(fx: &Fixture) -> R {
    let (ino, img) = huge_symlink(fx)?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    // A symlink is shorter than 4 KiB; a size of 1 TiB is corruption, not a length to allocate.
    match guard("readlink", || s.readlink(ino))? {
        Err(e) if e.errno() == 5 && e.is_corruption() => Ok(()),
        other => Err(format!("readlink of a symlink claiming 1 TiB: want EIO, got {:?}", other.map(|v| v.len()))),
    }
}

fn c052(fx: &Fixture) -> R {
    let (ino, img) = huge_symlink(fx)?;
    let rep = fsck_ok(&img)?;
    ensure!(
        rep.problems.iter().any(|p| p.contains(&format!("({ino} 1 0)")) || p.contains(&format!("inode {ino}"))),
        "fsck does not flag inode {ino} (a symlink claiming 1 TiB); problems: {}",
        short(&rep.problems)
    );
    Ok(())
}

/// The main image with the root item's counters changed (next inode number, inode count).
fn patched_root_item(fx: &Fixture, next_ino: Option<u64>, count: Option<u64>) -> R<Vec<u8>> {
    let leaf = fx.new.root_tree.block;
    ensure!(fx.new.nodes[&leaf].level == 0, "root tree root is not a leaf");
    let key = Key::new(FS_TREE_ID, kind::ROOT_ITEM, 0);
    let (_, off, len) =
        leaf_items(blk(&fx.image, leaf)).into_iter().find(|(k, _, _)| *k == key).ok_or("no root item")?;
    ensure!(len == 48, "root item of {len} bytes");
    let mut img = fx.image.clone();
    patch_node(&mut img, leaf, |n| {
        if let Some(v) = next_ino {
            put_u64(n, off + 24, v);
        }
        if let Some(v) = count {
            put_u64(n, off + 32, v);
        }
    });
    keep(&img);
    Ok(img)
}

fn c053(fx: &Fixture) -> R {
    let img = patched_root_item(fx, None, Some(0))?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    // Whatever unlink answers, the counter must not wrap to 2^64 - 1 (a panic in debug builds).
    let _ = guard("unlink", || s.unlink(ROOT_INO, b"big-003", t(90)))?;
    let files = s.statfs().files;
    ensure!(files < 1 << 32, "statfs reports {files} files: the inode count wrapped below zero");
    Ok(())
}

fn c054(fx: &Fixture) -> R {
    let img = patched_root_item(fx, Some(u64::MAX - 1), None)?;
    let (_, r) = open_img(&img)?;
    let mut s = r.map_err(|e| format!("open: {e}"))?;
    let mut taken: BTreeSet<u64> = fx.inos.values().copied().collect();
    taken.insert(ROOT_INO);
    for i in 0..4 {
        let name = format!("wrap-{i}");
        let created =
            guard("create", || s.create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(90)))?;
        if let Ok(inode) = created {
            ensure!(
                inode.ino != u64::MAX && taken.insert(inode.ino),
                "create {name} got inode {}, which is in use or reserved (the counter wrapped)",
                inode.ino
            );
        }
    }
    let root = guard("getattr", || s.getattr(ROOT_INO))?.map_err(|e| format!("getattr root: {e}"))?;
    ensure!(root.kind == FileKind::Directory, "the root directory was overwritten: {root:?}");
    Ok(())
}

// ---- isolation in a child process ---------------------------------------------------------

/// How long one unit in a child process may run before it counts as hung.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `units` (corpus case numbers or fuzz seeds) of `kind` in child processes of this
/// test binary (test `isolated_child`), so that an abort — a failed huge allocation, which
/// `catch_unwind` cannot stop — or a hang fails only the unit it happened in; the next
/// child resumes after it. Returns the failures, each starting with "case NNN:" or
/// "seed N:".
fn run_isolated(kind: &str, units: &[u64]) -> Vec<String> {
    let label = |u: u64| if kind == "case" { format!("case {u:03}") } else { format!("seed {u}") };
    let mut failures = Vec::new();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return vec![format!("cannot find the test binary: {e}")],
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return vec![format!("no temporary directory: {e}")],
    };
    let mut rest = units.to_vec();
    while !rest.is_empty() {
        let list = rest.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let units_path = dir.path().join("units");
        let spawned =
            std::fs::write(&units_path, &list).and_then(|()| std::fs::File::create(&out_path)).and_then(|out| {
                let err = std::fs::File::create(&err_path)?;
                Command::new(&exe)
                    .args(["isolated_child", "--exact", "--nocapture", "--test-threads=1"])
                    .env("CREST_CORRUPT_CHILD", kind)
                    .env("CREST_CORRUPT_UNITS_FILE", &units_path)
                    .env("RUST_BACKTRACE", "1")
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err)
                    .spawn()
            });
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("cannot start a child process: {e}"));
                break;
            }
        };
        // The deadline restarts whenever the child reports progress on its stdout.
        let mut progress = (Instant::now(), 0u64);
        let status = loop {
            let len = std::fs::metadata(&out_path).map_or(0, |m| m.len());
            if len != progress.1 {
                progress = (Instant::now(), len);
            }
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if progress.0.elapsed() > CHILD_DEADLINE => {
                    let _ = child.kill(); // this child only, by its handle
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    failures.push(format!("waiting for the child: {e}"));
                    return failures;
                }
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let mut started = None;
        let mut note = String::new();
        let mut done = BTreeSet::new();
        // libtest may print "test isolated_child ... " in front of the first marker.
        for line in stdout.lines().filter_map(|l| l.find("@@").map(|i| &l[i..])) {
            if let Some(u) = line.strip_prefix("@@start ").and_then(|u| u.trim().parse::<u64>().ok()) {
                started = Some(u);
                note.clear();
            } else if let Some(n) = line.strip_prefix("@@note ") {
                note = format!("[{n}] ");
            } else if let Some(u) = line.strip_prefix("@@ok ").and_then(|u| u.trim().parse::<u64>().ok()) {
                done.insert(u);
            } else if let Some((u, m)) = line.strip_prefix("@@fail ").and_then(|r| r.split_once(' ')) {
                if let Ok(u) = u.parse::<u64>() {
                    done.insert(u);
                    failures.push(format!("{}: {}", label(u), m.replace("\\n", "\n")));
                }
            }
        }
        if status.is_some_and(|st| st.success()) {
            let missing: Vec<u64> = rest.iter().copied().filter(|u| !done.contains(u)).collect();
            if !missing.is_empty() {
                failures.push(format!("the child finished without running {missing:?}"));
            }
            break;
        }
        let how = match status {
            Some(st) => format!("died ({st})"),
            None => format!("hung (killed after {CHILD_DEADLINE:?})"),
        };
        let Some(u) = started.filter(|u| !done.contains(u)) else {
            failures.push(format!("the child process {how} before starting a unit: {}", tail(&stderr)));
            break;
        };
        failures.push(format!("{}: {note}the child process {how} — {}", label(u), tail(&stderr)));
        let at = rest.iter().position(|x| *x == u).map_or(rest.len(), |i| i + 1);
        rest.drain(..at);
    }
    failures
}

/// The telling lines of a dead child's stderr: the abort or panic message and the
/// store's frames of the backtrace.
fn tail(stderr: &str) -> String {
    let mut lines: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains("memory allocation") || l.contains("panicked"))
        .map(|l| l.trim().to_string())
        .take(4)
        .collect();
    lines.extend(store_frames(stderr));
    if lines.is_empty() {
        let all: Vec<&str> = stderr.lines().collect();
        all[all.len().saturating_sub(8)..].join(" / ")
    } else {
        lines.join("\n      ")
    }
}

/// Entry point of the child processes `run_isolated` starts; does nothing in a normal run.
#[test]
fn isolated_child() {
    let Ok(kind) = std::env::var("CREST_CORRUPT_CHILD") else { return };
    let units: Vec<u64> = std::env::var("CREST_CORRUPT_UNITS_FILE")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
        .split(',')
        .filter_map(|u| u.trim().parse().ok())
        .collect();
    for u in units {
        println!("@@start {u}");
        let r = match kind.as_str() {
            "case" => run_case(u),
            "reseal" => {
                let main = std::env::var("CREST_CORRUPT_RESEAL_IMAGE").is_ok_and(|v| v == "main");
                guard("resealed damage", || reseal_one(if main { main_fixture() } else { small_fixture() }, u))
                    .and_then(|r| r)
            }
            other => Err(format!("unknown child kind {other}")),
        };
        match r {
            Ok(()) => println!("@@ok {u}"),
            Err(m) => println!("@@fail {u} {}", m.replace('\n', "\\n")),
        }
    }
}

/// Values that make decoders and arithmetic trip.
fn interesting(rng: &mut Stream, total_blocks: u64) -> u64 {
    const V: [u64; 20] = [
        0,
        1,
        2,
        0x7f,
        0x80,
        0xff,
        0xffff,
        0x1_0000,
        0xffff_ffff,
        u64::MAX,
        u64::MAX - 1,
        1 << 40,
        1 << 60,
        1 << 63,
        256,
        257,
        4095,
        4096,
        1 << 20,
        1 << 32,
    ];
    match rng.below(V.len() as u64 + 3) {
        i if (i as usize) < V.len() => V[i as usize],
        i if i == V.len() as u64 => total_blocks,
        i if i == V.len() as u64 + 1 => total_blocks - 1,
        _ => rng.next_u64(),
    }
}

/// Damages one live node of the small image and fixes its checksum, so the damage reaches
/// the structural checks and the item decoders; then fsck, open, a full dump, a small
/// workload with a commit, fsck and open again. Errors are fine; a panic, an abort or a
/// hang is not.
fn reseal_one(fx: &Fixture, seed: u64) -> R {
    let mut rng = Stream::from_seed_u64(seed);
    let total = fx.new.total_blocks;
    let nodes: Vec<(u64, &NodeInfo)> = fx.new.nodes.iter().map(|(b, n)| (*b, n)).collect();
    let (b, info) = nodes[rng.below(nodes.len() as u64) as usize];
    let mut img = fx.image.clone();
    let mut what = vec![format!("node {b} (tree {}, level {})", info.owner, info.level)];
    {
        let node = blk_mut(&mut img, b);
        let items = if info.level == 0 { leaf_items(node) } else { Vec::new() };
        let n = get_u16(node, 74);
        let mode = rng.below(5);
        if mode == 1 && !items.is_empty() {
            // A field inside an item's value.
            let (k, off, len) = items[rng.below(items.len() as u64) as usize];
            let width = [1usize, 2, 4, 8][rng.below(4) as usize].min(len.max(1));
            if len >= width {
                let at = off + rng.below((len - width + 1) as u64) as usize;
                let v = interesting(&mut rng, total).to_le_bytes();
                node[at..at + width].copy_from_slice(&v[..width]);
                what.push(format!("item {k:?} value bytes {}..{} = {:02x?}", at - off, at - off + width, &v[..width]));
            }
        } else if mode == 2 && !items.is_empty() {
            // A key field.
            let i = rng.below(items.len() as u64) as usize;
            let at = 80 + i * 21;
            let v = interesting(&mut rng, total);
            match rng.below(3) {
                0 => put_u64(node, at, v),
                1 => node[at + 8] = v as u8,
                _ => put_u64(node, at + 9, v),
            }
            what.push(format!("item {i} key field := {v:#x}"));
        } else if mode == 3 && info.level > 0 && n > 0 {
            // A child pointer: block (often another live node) or generation.
            let i = rng.below(n as u64) as usize;
            let at = 80 + i * 33 + 17;
            let v = if rng.below(2) == 0 {
                nodes[rng.below(nodes.len() as u64) as usize].0
            } else {
                interesting(&mut rng, total)
            };
            let field = if rng.below(3) == 0 { at + 8 } else { at };
            put_u64(node, field, v);
            what.push(format!("child {i} {} := {v:#x}", if field == at { "block" } else { "generation" }));
        } else if mode == 4 {
            // The item count or an item's data offset/length.
            if !items.is_empty() && rng.below(2) == 0 {
                let i = rng.below(items.len() as u64) as usize;
                let at = 80 + i * 21 + 17 + 2 * rng.below(2) as usize;
                let v = interesting(&mut rng, total) as u16;
                node[at..at + 2].copy_from_slice(&v.to_le_bytes());
                what.push(format!("item {i} data offset/len field := {v}"));
            } else {
                let v = interesting(&mut rng, total) as u16;
                node[74..76].copy_from_slice(&v.to_le_bytes());
                what.push(format!("item count := {v}"));
            }
        } else {
            for _ in 0..1 + rng.below(3) {
                let at = 80 + rng.below((BS - 80) as u64) as usize;
                let x = 1 + rng.below(255) as u8;
                node[at] ^= x;
                what.push(format!("byte {at} ^= {x:#04x}"));
            }
        }
        reseal(node);
    }
    let ctx = what.join(", ");
    // For the parent, in case this process dies or hangs below.
    println!("@@note {ctx}");
    let e = |m: String| format!("[{ctx}] {m}");
    let _ = run_fsck(&img).map_err(e)?;
    let (disk, r) = open_img(&img).map_err(e)?;
    let Ok(mut s) = r else { return Ok(()) };
    let got = dump_soft(&mut s).map_err(e)?;
    guard("workload on the damaged image", || workload(&mut s, &got, &mut rng)).map_err(e)?;
    drop(s);
    let after = disk.snapshot();
    let _ = run_fsck(&after).map_err(e)?;
    let (_, r) = open_img(&after).map_err(e)?;
    if let Ok(mut s) = r {
        dump_soft(&mut s).map_err(e)?;
    }
    Ok(())
}

/// A few namespace and data operations on whatever a damaged store shows, then a commit.
fn workload(s: &mut Store, got: &SoftDump, rng: &mut Stream) {
    let now = t(80);
    let dirs: BTreeMap<&str, u64> = got
        .entries
        .iter()
        .filter(|(_, g)| g.kind == FileKind::Directory)
        .map(|(p, g)| (p.as_str(), g.ino))
        .chain([("", ROOT_INO)])
        .collect();
    let paths: Vec<(&String, &Got)> = got.entries.iter().collect();
    for i in 0..8u64 {
        if paths.is_empty() {
            break;
        }
        let (p, g) = paths[rng.below(paths.len() as u64) as usize];
        let (parent, name) = p.rsplit_once('/').unwrap_or(("", p.as_str()));
        let dir = dirs.get(parent).copied().unwrap_or(ROOT_INO);
        let name = name.as_bytes();
        match rng.below(7) {
            0 if g.kind == FileKind::Directory => drop(s.rmdir(dir, name, now)),
            0 => drop(s.unlink(dir, name, now)),
            1 => drop(s.write(g.ino, rng.below(20_000), &pattern(1 + rng.below(9000) as usize, i), now)),
            2 => drop(s.setattr(g.ino, &SetAttr { size: Some(rng.below(30_000)), ..SetAttr::default() }, now)),
            3 => drop(s.rename(dir, name, ROOT_INO, format!("moved-{i}").as_bytes(), RenameFlags::default(), now)),
            4 => drop(s.setxattr(g.ino, b"user.fuzz", b"v", now)),
            5 => drop(s.read(g.ino, rng.below(1 << 20), 1 << 16)),
            _ => {
                if let Ok(n) = s.create(dir, format!("new-{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now) {
                    drop(s.write(n.ino, 0, &pattern(5000, i), now));
                }
            }
        }
    }
    drop(s.commit());
}

#[test]
fn resealed_fuzz() {
    let iters: u64 = std::env::var("CREST_CORRUPT_ITERS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(200);
    let base: u64 = std::env::var("CREST_CORRUPT_SEED").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0xc0de);
    let seeds: Vec<u64> = (base..base + iters).collect();
    let failures = run_isolated("reseal", &seeds);
    eprintln!("resealed damage: {iters} iterations from seed {base}, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {iters} iterations failed:\n{}", failures.len(), failures.join("\n"));
}

// ---- random damage ------------------------------------------------------------------------

#[derive(Default, Debug)]
struct Tally {
    newest: u32,
    fell_back: u32,
    refused: u32,
    fsck_clean: u32,
    fsck_problems: u32,
    fsck_refused: u32,
    unreadable_files: u32,
}

/// Damages a copy of the small image at random (seeded) and checks the exact outcome.
fn fuzz_one(fx: &Fixture, seed: u64, tally: &mut Tally) -> R {
    let mut rng = Stream::from_seed_u64(seed);
    let gens = [&fx.new, &fx.old];
    let nodes: Vec<u64> =
        gens.iter().flat_map(|g| g.nodes.keys().copied()).collect::<BTreeSet<_>>().into_iter().collect();
    let data: Vec<u64> = gens.iter().flat_map(|g| g.data_blocks()).collect::<BTreeSet<_>>().into_iter().collect();
    let used_end = nodes.iter().chain(&data).copied().chain([sb_block(1)]).max().unwrap_or(0) + 1;
    let mut img = fx.image.clone();
    let mut what = Vec::new();
    let target = match rng.below(10) {
        0 | 1 => Some(sb_block(rng.below(2) as usize)),
        2..=5 => Some(nodes[rng.below(nodes.len() as u64) as usize]),
        6 | 7 => Some(data[rng.below(data.len() as u64) as usize]),
        _ => None,
    };
    for _ in 0..1 + rng.below(8) {
        let pos = match target {
            Some(b) => b as usize * BS + rng.below(BS64) as usize,
            None => rng.below(used_end * BS64) as usize,
        };
        let x = 1 + rng.below(255) as u8;
        img[pos] ^= x;
        what.push(format!("byte {pos} (block {}) ^= {x:#04x}", pos / BS));
    }
    if rng.below(4) == 0 {
        let b = rng.below(used_end);
        blk_mut(&mut img, b).fill(0);
        what.push(format!("block {b} zeroed"));
    }
    let damaged: BTreeSet<u64> = (0..used_end).filter(|b| blk(&img, *b) != blk(&fx.image, *b)).collect();
    let ctx = format!("[{}; changed blocks {damaged:?}]", what.join(", "));

    // Superblock copies verify iff untouched (every byte of the block is checked).
    let valid: Vec<&GenLayout> = gens
        .iter()
        .copied()
        .filter(|g| !damaged.contains(&sb_block(g.copy)) && !damaged.iter().any(|&b| g.last_commit_wrote(b)))
        .collect();

    // fsck checks the newest valid copy's generation and is clean iff none of its blocks
    // changed and neither superblock copy did (a damaged copy is a problem of its own).
    match (valid.first(), run_fsck(&img).map_err(|e| format!("{ctx} {e}"))?) {
        (None, Err(Error::BadImage(_))) => tally.fsck_refused += 1,
        (Some(g), Ok(rep)) => {
            ensure!(
                rep.generation == g.generation,
                "{ctx} fsck checked generation {}, want {}",
                rep.generation,
                g.generation
            );
            let mut hit: Vec<u64> = g.live().intersection(&damaged).copied().collect();
            hit.extend((0..2).map(sb_block).filter(|b| damaged.contains(b)));
            ensure!(
                rep.is_clean() == hit.is_empty(),
                "{ctx} fsck of generation {} clean={} but its changed blocks are {hit:?}; problems: {}",
                g.generation,
                rep.is_clean(),
                short(&rep.problems)
            );
            if rep.is_clean() {
                tally.fsck_clean += 1;
            } else {
                tally.fsck_problems += 1;
            }
        }
        (g, r) => {
            return Err(format!(
                "{ctx} fsck: expected {:?}, got {:?}",
                g.map(|g| g.generation),
                r.map(|r| r.problems.len())
            ))
        }
    }

    // Open settles on the newest generation whose superblock and the nodes an open reads
    // are intact; an older fs leaf is found damaged when read.
    let expect = valid.iter().find(|g| g.nodes.keys().all(|b| !damaged.contains(b) || !g.open_reads(*b)));
    let (_, r) = open_img(&img).map_err(|e| format!("{ctx} {e}"))?;
    match (expect, r) {
        (None, Err(Error::BadImage(_))) => tally.refused += 1,
        (Some(g), Ok(mut s)) => {
            ensure!(
                s.generation() == g.generation,
                "{ctx} opened generation {}, want {}",
                s.generation(),
                g.generation
            );
            let got = dump_soft(&mut s).map_err(|e| format!("{ctx} {e}"))?;
            if g.nodes.keys().any(|b| damaged.contains(b)) {
                check_sound(&got, &fx.dumps[&g.generation]).map_err(|e| format!("{ctx} {e}"))?;
            } else {
                check_dump(&got, &fx.dumps[&g.generation], g, &damaged).map_err(|e| format!("{ctx} {e}"))?;
            }
            tally.unreadable_files += got.entries.values().filter(|e| e.content.is_err()).count() as u32;
            if g.generation == fx.new.generation {
                tally.newest += 1;
            } else {
                tally.fell_back += 1;
            }
        }
        (g, r) => {
            return Err(format!(
                "{ctx} open: expected {:?}, got {:?}",
                g.map(|g| g.generation),
                r.map(|s| s.generation())
            ))
        }
    }
    Ok(())
}

#[test]
fn random_damage_fuzz() {
    let fx = small_fixture();
    let iters: u64 = std::env::var("CREST_CORRUPT_ITERS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(200);
    let base: u64 = std::env::var("CREST_CORRUPT_SEED").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0xc0de);
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for seed in base..base + iters {
        match guard("fuzz iteration", || fuzz_one(fx, seed, &mut tally)) {
            Ok(Ok(())) => {}
            Ok(Err(m)) | Err(m) => failures.push(format!("seed {seed}: {m}")),
        }
    }
    eprintln!("random damage: {iters} iterations from seed {base}: {tally:?}");
    assert!(failures.is_empty(), "{} of {iters} iterations failed:\n{}", failures.len(), failures.join("\n"));
    assert!(tally.newest > 0 && tally.fell_back > 0 && tally.refused > 0, "fuzzing missed an outcome: {tally:?}");
}
