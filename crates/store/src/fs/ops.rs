//! POSIX operations on the default dataset. Each call runs inside the current
//! transaction; nothing is durable until `commit` (or `fsync`). The store takes the time
//! from its caller (`now`) and checks no permissions: the server decides who may do what.
//!
//! Invariants kept by every operation (checked by fsck):
//! - each directory entry appears once under DIR_ENTRY and once under DIR_INDEX;
//! - a directory's `size` counts its entries, its `nlink` is 2 + its subdirectories;
//! - a non-directory's `nlink` counts the entries naming it; nlink 0 only on the orphan list;
//! - a directory's `parent` names the one directory holding its entry.

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::dirent::{self, check_name, DirEntry};
use crate::fs::inode::{self, FileKind, Inode, Timespec};
use crate::fs::keys::{kind, ORPHAN_OBJECTID};
use crate::fs::xattr;
use crate::limits::{BLOCK_SIZE_U64, LINK_MAX, MAX_FILE_BYTES, MAX_INLINE_BYTES, MAX_ITEM_BYTES, XATTR_LIST_MAX};
use crate::store::Store;

/// An inode number and generation chosen ahead of the create (from
/// `Store::reserve_inode_numbers`), for clients that answer creates themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewInode {
    /// A reserved, unused inode number.
    pub ino: u64,
    /// Its generation.
    pub generation: u64,
}

/// Attributes to change; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<Timespec>,
    /// New modification time.
    pub mtime: Option<Timespec>,
    /// New change time (otherwise `now`).
    pub ctime: Option<Timespec>,
}

/// Flags of `rename`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists.
    pub noreplace: bool,
    /// Swap source and target atomically (both must exist).
    pub exchange: bool,
}

/// `fallocate` modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocateMode {
    /// Don't change the file size.
    pub keep_size: bool,
    /// Deallocate the range (requires `keep_size`).
    pub punch_hole: bool,
    /// Make the range read as zeros, allocated.
    pub zero_range: bool,
}

/// What an unlink did to the inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlinked {
    /// The inode after the unlink (nlink may be 0).
    pub inode: Inode,
    /// True when the inode is gone for good (not open, no links).
    pub destroyed: bool,
}

/// File system usage, for statfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Bytes per block.
    pub block_size: u32,
    /// Blocks in the file system.
    pub total_blocks: u64,
    /// Blocks free now or after the next commits.
    pub free_blocks: u64,
    /// Blocks available to unprivileged users (same as free: no root reserve).
    pub avail_blocks: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes that could still be created (bounded by free blocks).
    pub files_free: u64,
    /// Longest name.
    pub name_max: u32,
}

/// One operation of a batch (`Store::batch`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op {
    Create { dir: u64, name: Vec<u8>, kind: FileKind, mode: u32, uid: u32, gid: u32, rdev: u64, now: Timespec },
    Symlink { dir: u64, name: Vec<u8>, target: Vec<u8>, uid: u32, gid: u32, now: Timespec },
    Link { ino: u64, dir: u64, name: Vec<u8>, now: Timespec },
    Unlink { dir: u64, name: Vec<u8>, now: Timespec },
    Rmdir { dir: u64, name: Vec<u8>, now: Timespec },
    Rename { dir: u64, name: Vec<u8>, new_dir: u64, new_name: Vec<u8>, flags: RenameFlags, now: Timespec },
    SetAttr { ino: u64, attr: SetAttr, now: Timespec },
    Write { ino: u64, offset: u64, data: Vec<u8>, now: Timespec },
    SetXattr { ino: u64, name: Vec<u8>, value: Vec<u8>, now: Timespec },
    RemoveXattr { ino: u64, name: Vec<u8>, now: Timespec },
}

/// A lookup with the rest of its directory leaf (the CRFS idea: one round trip primes a
/// client's cache with the neighbours it is likely to ask for next).
///
/// Invariant: `neighbours` holds *every* entry of the directory whose name hash lies in
/// `hash_lo..=hash_hi`, so a name hashing into that range and not listed is absent. The
/// range is empty (`hash_lo > hash_hi`) when a damaged neighbour could not be listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafLookup {
    /// The inode the name names, if any.
    pub found: Option<Inode>,
    /// First name hash the answer covers.
    pub hash_lo: u64,
    /// Last name hash the answer covers (inclusive).
    pub hash_hi: u64,
    /// All entries with hashes in the range (the looked-up one included), with attributes.
    pub neighbours: Vec<(DirEntry, Inode)>,
}

/// The result of one batched operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The inode created, linked, changed or written.
    Inode(Inode),
    /// Done, nothing to return.
    Done,
}

impl Store {
    // ---- reading ------------------------------------------------------------------------

    /// Attributes of `ino`.
    pub fn getattr(&mut self, ino: u64) -> Result<Inode> {
        self.enter(ino)?;
        let key = Inode::key(ino);
        let v = self.fs.get(&mut self.pager, &key)?.ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        Inode::decode(ino, &v, 0)
    }

    fn dir_inode(&mut self, dir: u64) -> Result<Inode> {
        let d = self.getattr(dir)?;
        if d.kind != FileKind::Directory {
            return Err(Error::NotDir(dir));
        }
        Ok(d)
    }

    fn find_entry(&mut self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        let key = dirent::entry_key(dir, name);
        match self.fs.get(&mut self.pager, &key)? {
            Some(v) => Ok(dirent::decode_entries(key, &v, 0)?.into_iter().find(|e| e.name == name)),
            None => Ok(None),
        }
    }

    /// The inode `name` names in directory `dir`.
    pub fn lookup(&mut self, dir: u64, name: &[u8]) -> Result<Inode> {
        self.enter(dir)?;
        self.dir_inode(dir)?;
        if name.len() > crate::limits::NAME_MAX {
            return Err(Error::NameTooLong { len: name.len(), max: crate::limits::NAME_MAX });
        }
        let e = self
            .find_entry(dir, name)?
            .ok_or_else(|| Error::NotFound(format!("{:?} in directory {dir}", String::from_utf8_lossy(name))))?;
        self.getattr(e.ino)
    }

    /// Looks `name` up in `dir` and returns the entries around it in the same leaf: at
    /// most `max_hashes` distinct name hashes, centred on the name's. See `LeafLookup`.
    pub fn lookup_leaf(&mut self, dir: u64, name: &[u8], max_hashes: usize) -> Result<LeafLookup> {
        self.enter(dir)?;
        self.dir_inode(dir)?;
        if name.len() > crate::limits::NAME_MAX {
            return Err(Error::NameTooLong { len: name.len(), max: crate::limits::NAME_MAX });
        }
        let key = dirent::entry_key(dir, name);
        let (leaf_lo, leaf_hi) = self.fs.leaf_bounds(&mut self.pager, &key)?;
        // Clip the leaf's key range to this directory's DIR_ENTRY items.
        let dir_lo = Key::new(dir, kind::DIR_ENTRY, 0);
        let dir_hi = Key::new(dir, kind::DIR_ENTRY, u64::MAX);
        let mut hash_lo = if leaf_lo <= dir_lo { 0 } else { leaf_lo.offset };
        let mut hash_hi = match leaf_hi {
            Some(h) if h <= dir_hi => h.offset.saturating_sub(1),
            _ => u64::MAX,
        };
        let lo = Key::new(dir, kind::DIR_ENTRY, hash_lo);
        let hi = Key::new(dir, kind::DIR_ENTRY, hash_hi);
        let items = self.fs.collect(&mut self.pager, &lo, &hi, usize::MAX)?;
        let at = items.partition_point(|(k, _)| *k < key);
        let want = max_hashes.max(1);
        let end = (at.saturating_sub(want / 2) + want).min(items.len());
        let start = end.saturating_sub(want);
        if start > 0 {
            hash_lo = items[start - 1].0.offset + 1;
        }
        if end < items.len() {
            hash_hi = items[end].0.offset - 1;
        }
        let mut found = None;
        let mut neighbours = Vec::new();
        let mut damaged = false;
        for (k, v) in &items[start..end] {
            let entries = match dirent::decode_entries(*k, v, 0) {
                Ok(entries) => entries,
                Err(e) if *k == key => return Err(e),
                Err(_) => {
                    damaged = true;
                    continue;
                }
            };
            for e in entries {
                match self.getattr(e.ino) {
                    Ok(inode) => {
                        if e.name == name {
                            found = Some(inode.clone());
                        }
                        neighbours.push((e, inode));
                    }
                    Err(err) if e.name == name => return Err(err),
                    Err(_) => damaged = true,
                }
            }
        }
        if damaged {
            // A damaged neighbour must not fail a healthy lookup, nor be reported absent:
            // answer for the name alone and cover nothing.
            neighbours.retain(|(e, _)| e.name == name);
            return Ok(LeafLookup { found, hash_lo: 1, hash_hi: 0, neighbours });
        }
        Ok(LeafLookup { found, hash_lo, hash_hi, neighbours })
    }

    /// Up to `limit` entries of `dir` whose index is at least `from_index`, in creation
    /// order, each with its attributes. The next call continues at the last index + 1.
    pub fn readdir(&mut self, dir: u64, from_index: u64, limit: usize) -> Result<Vec<(DirEntry, Inode)>> {
        self.enter(dir)?;
        self.dir_inode(dir)?;
        let lo = dirent::index_key(dir, from_index);
        let hi = dirent::index_key(dir, u64::MAX);
        let items = self.fs.collect(&mut self.pager, &lo, &hi, limit)?;
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            let e = dirent::decode_index(k, &v, 0)?;
            let inode = self.getattr(e.ino)?;
            out.push((e, inode));
        }
        Ok(out)
    }

    /// Reads up to `len` bytes at `offset` (short at end of file).
    pub fn read(&mut self, ino: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.enter(ino)?;
        let inode = self.getattr(ino)?;
        match inode.kind {
            FileKind::Regular => self.read_data(&inode, offset, len),
            FileKind::Directory => Err(Error::IsDir(ino)),
            _ => Err(Error::Invalid(format!("inode {ino} is not a regular file"))),
        }
    }

    /// The target of symlink `ino`.
    pub fn readlink(&mut self, ino: u64) -> Result<Vec<u8>> {
        self.enter(ino)?;
        let inode = self.getattr(ino)?;
        if inode.kind != FileKind::Symlink {
            return Err(Error::Invalid(format!("inode {ino} is not a symlink")));
        }
        self.read_data(&inode, 0, inode.size)
    }

    /// Value of xattr `name`.
    pub fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.enter(ino)?;
        xattr::check_name(name)?;
        self.getattr(ino)?;
        let key = xattr::xattr_key(ino, name);
        let v = self.fs.get(&mut self.pager, &key)?.ok_or(Error::NoXattr(ino))?;
        let entry = xattr::decode(key, &v, 0)?.into_iter().find(|e| e.name == name).ok_or(Error::NoXattr(ino))?;
        match entry.value {
            xattr::Value::Inline(v) => Ok(v),
            xattr::Value::Chunked { len, id } => {
                let items = self.xattr_chunks(ino, id)?;
                xattr::join_chunks(key.offset, len as usize, id, &items)
            }
        }
    }

    /// Every XATTR_CHUNK item of chunk id `id` of `ino`, in order.
    fn xattr_chunks(&mut self, ino: u64, id: u64) -> Result<Vec<(Key, Vec<u8>)>> {
        let lo = xattr::chunk_key(ino, id, 0);
        let hi = xattr::chunk_key(ino, id, 0xff);
        self.fs.collect(&mut self.pager, &lo, &hi, usize::MAX)
    }

    /// Names of all xattrs of `ino`.
    pub fn listxattr(&mut self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.enter(ino)?;
        self.getattr(ino)?;
        let lo = Key::new(ino, kind::XATTR, 0);
        let hi = Key::new(ino, kind::XATTR, u64::MAX);
        let mut names = Vec::new();
        self.fs.range(&mut self.pager, &lo, &hi, &mut |k, v| {
            names.extend(xattr::decode(*k, v, 0)?.into_iter().map(|e| e.name));
            Ok(true)
        })?;
        Ok(names)
    }

    /// Bytes `listxattr` of `ino` answers: every name with its NUL.
    fn xattr_list_bytes(&mut self, ino: u64) -> Result<usize> {
        let lo = Key::new(ino, kind::XATTR, 0);
        let hi = Key::new(ino, kind::XATTR, u64::MAX);
        let mut total = 0;
        self.fs.range(&mut self.pager, &lo, &hi, &mut |k, v| {
            total += xattr::list_bytes(*k, v, 0)?;
            Ok(true)
        })?;
        Ok(total)
    }

    /// Usage figures.
    pub fn statfs(&self) -> StatFs {
        let free = self.pager.alloc.free_blocks() + self.pager.pending_free_blocks() + self.space.doomed_blocks();
        StatFs {
            block_size: crate::limits::BLOCK_SIZE as u32,
            total_blocks: self.sb.total_blocks,
            free_blocks: free,
            // What a write may take: the blocks `reserve` keeps back for the commit that
            // follows and for deletions are not available (as ext4's reserved blocks), so
            // a fallocate of everything reported available succeeds.
            avail_blocks: self.avail_blocks(free),
            files: self.meta.inode_count,
            files_free: free,
            name_max: crate::limits::NAME_MAX as u32,
        }
    }

    // ---- namespace ----------------------------------------------------------------------

    pub(crate) fn put_inode(&mut self, inode: &Inode) -> Result<()> {
        self.fs.insert(&mut self.pager, Inode::key(inode.ino), inode.encode())?;
        Ok(())
    }

    fn add_entry(&mut self, dir: &mut Inode, name: &[u8], ino: u64, kind: FileKind) -> Result<()> {
        let e = DirEntry { name: name.to_vec(), ino, kind, index: dir.next_index };
        dir.next_index += 1;
        dir.size += 1;
        let key = dirent::entry_key(dir.ino, name);
        let mut entries = match self.fs.get(&mut self.pager, &key)? {
            Some(v) => dirent::decode_entries(key, &v, 0)?,
            None => Vec::new(),
        };
        entries.push(e.clone());
        self.fs.insert(&mut self.pager, key, dirent::encode_entries(&entries))?;
        self.fs.insert(&mut self.pager, dirent::index_key(dir.ino, e.index), dirent::encode_index(&e))?;
        Ok(())
    }

    fn remove_entry(&mut self, dir: &mut Inode, name: &[u8]) -> Result<DirEntry> {
        let key = dirent::entry_key(dir.ino, name);
        let v = self
            .fs
            .get(&mut self.pager, &key)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let mut entries = dirent::decode_entries(key, &v, 0)?;
        let pos = entries
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let e = entries.remove(pos);
        if entries.is_empty() {
            self.fs.delete(&mut self.pager, &key)?;
        } else {
            self.fs.insert(&mut self.pager, key, dirent::encode_entries(&entries))?;
        }
        self.fs.delete(&mut self.pager, &dirent::index_key(dir.ino, e.index))?;
        dir.size -= 1;
        Ok(e)
    }

    /// Repoints an existing entry at another inode (rename over, exchange).
    fn retarget_entry(&mut self, dir: u64, name: &[u8], ino: u64, kind: FileKind) -> Result<()> {
        let key = dirent::entry_key(dir, name);
        let v = self
            .fs
            .get(&mut self.pager, &key)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let mut entries = dirent::decode_entries(key, &v, 0)?;
        let e = entries
            .iter_mut()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        e.ino = ino;
        e.kind = kind;
        let index_item = dirent::encode_index(e);
        let index = e.index;
        self.fs.insert(&mut self.pager, key, dirent::encode_entries(&entries))?;
        self.fs.insert(&mut self.pager, dirent::index_key(dir, index), index_item)?;
        Ok(())
    }

    fn check_inode_numbers(&self) -> Result<()> {
        if self.meta.next_ino >= crate::datasets::range_end(self.active) {
            return Err(Error::NoSpace("inode numbers exhausted".into()));
        }
        Ok(())
    }

    /// Reserves `count` inode numbers for a client that will create inodes with them
    /// (`create_at`, `symlink_at`) after answering its callers itself. Returns the first.
    /// The numbers are never handed out again, used or not. They come from the dataset of
    /// `in_ino` (a directory there, usually its root).
    pub fn reserve_inode_numbers(&mut self, in_ino: u64, count: u64) -> Result<u64> {
        self.pager.check_writable()?;
        self.enter(in_ino)?;
        if self.is_snapshot(self.active) {
            return Err(Error::ReadOnly("a snapshot".into()));
        }
        let first = self.meta.next_ino;
        let end = first.checked_add(count).filter(|&e| e <= crate::datasets::range_end(self.active));
        let Some(end) = end else {
            return Err(Error::NoSpace("inode numbers exhausted".into()));
        };
        self.meta.next_ino = end;
        Ok(first)
    }

    /// Checks that `at` names a reserved, unused inode number (a replayed or buggy
    /// client must not overwrite a live inode).
    fn check_new_inode(&mut self, at: Option<NewInode>) -> Result<()> {
        let Some(at) = at else { return self.check_inode_numbers() };
        let root = crate::datasets::root_of(self.active);
        if at.ino <= root || at.ino >= self.meta.next_ino {
            return Err(Error::Invalid(format!("inode number {} was not reserved", at.ino)));
        }
        match self.getattr(at.ino) {
            Ok(_) => Err(Error::Exists(format!("inode {}", at.ino))),
            Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn new_inode(
        &mut self,
        at: Option<NewInode>,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        parent: u64,
        now: Timespec,
    ) -> Inode {
        let (ino, generation) = match at {
            Some(at) => (at.ino, at.generation),
            None => {
                let ino = self.meta.next_ino;
                self.meta.next_ino += 1;
                (ino, self.rng.next_u64())
            }
        };
        self.meta.inode_count += 1;
        debug_assert!(ino < crate::datasets::range_end(self.active), "checked by check_inode_numbers");
        Inode {
            ino,
            generation,
            kind,
            mode: mode & 0o7777,
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            uid,
            gid,
            size: 0,
            blocks: 0,
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: if kind == FileKind::Directory { parent } else { 0 },
            next_index: 0,
            flags: 0,
        }
    }

    /// Creates a file, directory, device, fifo or socket named `name` in `dir`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        dir: u64,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        now: Timespec,
    ) -> Result<Inode> {
        self.create_at(None, dir, name, kind, mode, uid, gid, rdev, now)
    }

    /// `create`, with the inode number and generation given (`at`, from
    /// `reserve_inode_numbers`) or picked here (`None`).
    #[allow(clippy::too_many_arguments)]
    pub fn create_at(
        &mut self,
        at: Option<NewInode>,
        dir: u64,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        now: Timespec,
    ) -> Result<Inode> {
        self.enter(dir)?;
        if kind == FileKind::Symlink {
            return Err(Error::Invalid("use symlink() for symbolic links".into()));
        }
        check_name(name)?;
        self.reserve(0, false)?;
        let mut d = self.dir_inode(dir)?;
        if self.find_entry(dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        if kind == FileKind::Directory && d.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks(dir));
        }
        self.check_new_inode(at)?;
        let inode = self.new_inode(at, kind, mode, uid, gid, rdev, dir, now);
        self.put_inode(&inode)?;
        self.add_entry(&mut d, name, inode.ino, kind)?;
        if kind == FileKind::Directory {
            d.nlink += 1;
        }
        d.mtime = now;
        d.ctime = now;
        self.put_inode(&d)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Creates a symbolic link `name` in `dir` pointing at `target`.
    pub fn symlink(
        &mut self,
        dir: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
        now: Timespec,
    ) -> Result<Inode> {
        self.symlink_at(None, dir, name, target, uid, gid, now)
    }

    /// `symlink`, with the inode number and generation given or picked here (see
    /// `create_at`).
    #[allow(clippy::too_many_arguments)]
    pub fn symlink_at(
        &mut self,
        at: Option<NewInode>,
        dir: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
        now: Timespec,
    ) -> Result<Inode> {
        self.enter(dir)?;
        check_name(name)?;
        if target.is_empty() || target.len() >= 4096 {
            return Err(if target.is_empty() {
                Error::NotFound("empty symlink target".into())
            } else {
                Error::NameTooLong { len: target.len(), max: 4095 }
            });
        }
        self.reserve(target.len() as u64 / BLOCK_SIZE_U64 + 1, false)?;
        let mut d = self.dir_inode(dir)?;
        if self.find_entry(dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        self.check_new_inode(at)?;
        let mut inode = self.new_inode(at, FileKind::Symlink, 0o777, uid, gid, 0, dir, now);
        self.write_data(&mut inode, 0, target, None)?;
        self.put_inode(&inode)?;
        self.add_entry(&mut d, name, inode.ino, FileKind::Symlink)?;
        d.mtime = now;
        d.ctime = now;
        self.put_inode(&d)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Adds a hard link `name` in `dir` to `ino`.
    pub fn link(&mut self, ino: u64, dir: u64, name: &[u8], now: Timespec) -> Result<Inode> {
        self.enter_both(dir, ino)?;
        check_name(name)?;
        self.reserve(0, false)?;
        let mut inode = self.getattr(ino)?;
        if inode.kind == FileKind::Directory {
            return Err(Error::NotPermitted(format!("hard link to directory {ino}")));
        }
        if inode.nlink == 0 {
            return Err(Error::NotFound(format!("inode {ino} has been unlinked")));
        }
        if inode.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks(ino));
        }
        let mut d = self.dir_inode(dir)?;
        if self.find_entry(dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        self.add_entry(&mut d, name, ino, inode.kind)?;
        inode.nlink += 1;
        inode.ctime = now;
        d.mtime = now;
        d.ctime = now;
        self.put_inode(&d)?;
        self.put_inode(&inode)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Drops one link of `inode` (already removed from its directory): destroys it when no
    /// link and no open handle remain, else parks it on the orphan list at nlink 0.
    fn drop_link(&mut self, mut inode: Inode, now: Timespec) -> Result<Unlinked> {
        inode.ctime = now;
        inode.nlink = if inode.kind == FileKind::Directory { 0 } else { inode.nlink.saturating_sub(1) };
        if inode.nlink > 0 {
            self.put_inode(&inode)?;
            return Ok(Unlinked { inode, destroyed: false });
        }
        if self.open_handles.get(&inode.ino).copied().unwrap_or(0) > 0 {
            self.put_inode(&inode)?;
            self.fs.insert(&mut self.pager, Key::new(ORPHAN_OBJECTID, kind::ORPHAN, inode.ino), Vec::new())?;
            return Ok(Unlinked { inode, destroyed: false });
        }
        self.destroy_inode(&inode)?;
        Ok(Unlinked { inode, destroyed: true })
    }

    /// Removes every item of an inode with no links and no handle; one with many extents
    /// is freed in steps (fs/space.rs).
    fn destroy_inode(&mut self, inode: &Inode) -> Result<()> {
        if self.doom_if_large(inode.ino, inode.blocks)? {
            return self.put_inode(inode);
        }
        self.destroy_inode_now(inode)
    }

    /// Removes every item of an inode with no links, at once.
    pub(crate) fn destroy_inode_now(&mut self, inode: &Inode) -> Result<()> {
        self.drop_data(inode)?;
        let lo = Key::new(inode.ino, 0, 0);
        let hi = Key::new(inode.ino, u8::MAX, u64::MAX);
        let keys: Vec<Key> =
            self.fs.collect(&mut self.pager, &lo, &hi, usize::MAX)?.into_iter().map(|(k, _)| k).collect();
        for k in keys {
            self.fs.delete(&mut self.pager, &k)?;
        }
        self.fs.delete(&mut self.pager, &Key::new(ORPHAN_OBJECTID, kind::ORPHAN, inode.ino))?;
        self.meta.inode_count = self.meta.inode_count.saturating_sub(1);
        Ok(())
    }

    /// Removes the non-directory `name` from `dir`.
    pub fn unlink(&mut self, dir: u64, name: &[u8], now: Timespec) -> Result<Unlinked> {
        self.enter(dir)?;
        self.reserve(0, true)?;
        let mut d = self.dir_inode(dir)?;
        let e =
            self.find_entry(dir, name)?.ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if e.kind == FileKind::Directory {
            return Err(Error::IsDir(e.ino));
        }
        let inode = self.getattr(e.ino)?;
        self.remove_entry(&mut d, name)?;
        d.mtime = now;
        d.ctime = now;
        self.put_inode(&d)?;
        let r = self.drop_link(inode, now)?;
        self.maybe_commit()?;
        Ok(r)
    }

    /// Removes the empty directory `name` from `dir`.
    pub fn rmdir(&mut self, dir: u64, name: &[u8], now: Timespec) -> Result<Unlinked> {
        self.enter(dir)?;
        if name == b"." {
            return Err(Error::Invalid("rmdir of \".\"".into()));
        }
        if name == b".." {
            return Err(Error::NotEmpty(dir));
        }
        self.reserve(0, true)?;
        let mut d = self.dir_inode(dir)?;
        let e =
            self.find_entry(dir, name)?.ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let victim = self.getattr(e.ino)?;
        if victim.kind != FileKind::Directory {
            return Err(Error::NotDir(e.ino));
        }
        if victim.size != 0 {
            return Err(Error::NotEmpty(e.ino));
        }
        self.remove_entry(&mut d, name)?;
        d.nlink -= 1;
        d.mtime = now;
        d.ctime = now;
        self.put_inode(&d)?;
        let r = self.drop_link(victim, now)?;
        self.maybe_commit()?;
        Ok(r)
    }

    /// True when `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&mut self, ancestor: u64, mut dir: u64) -> Result<bool> {
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == crate::datasets::root_of(self.active) {
                return Ok(false);
            }
            let d = self.getattr(dir)?;
            if d.parent == dir {
                return Ok(false);
            }
            dir = d.parent;
        }
        Err(Error::corrupt("directory tree", 0, format!("parent chain from {dir} does not reach the root")))
    }

    /// Renames `dir/name` to `new_dir/new_name` (see `RenameFlags`).
    pub fn rename(
        &mut self,
        dir: u64,
        name: &[u8],
        new_dir: u64,
        new_name: &[u8],
        flags: RenameFlags,
        now: Timespec,
    ) -> Result<()> {
        self.enter_both(dir, new_dir)?;
        check_name(new_name)?;
        if flags.noreplace && flags.exchange {
            return Err(Error::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE".into()));
        }
        self.reserve(0, true)?;
        self.dir_inode(dir)?;
        self.dir_inode(new_dir)?;
        let src =
            self.find_entry(dir, name)?.ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let dst = self.find_entry(new_dir, new_name)?;
        if let Some(d) = &dst {
            if flags.noreplace {
                return Err(Error::Exists(String::from_utf8_lossy(new_name).into_owned()));
            }
            if d.ino == src.ino && !flags.exchange {
                return Ok(()); // Same file: POSIX says do nothing.
            }
        }
        if src.kind == FileKind::Directory && dir != new_dir && self.is_ancestor(src.ino, new_dir)? {
            return Err(Error::Invalid("cannot move a directory into itself".into()));
        }
        if flags.exchange {
            let dst = dst.ok_or_else(|| Error::NotFound(String::from_utf8_lossy(new_name).into_owned()))?;
            if dst.kind == FileKind::Directory && dir != new_dir && self.is_ancestor(dst.ino, dir)? {
                return Err(Error::Invalid("cannot move a directory into itself".into()));
            }
            return self.exchange(dir, name, &src, new_dir, new_name, &dst, now);
        }
        let mut src_inode = self.getattr(src.ino)?;
        if let Some(d) = &dst {
            let victim = self.getattr(d.ino)?;
            if src.kind == FileKind::Directory {
                if victim.kind != FileKind::Directory {
                    return Err(Error::NotDir(victim.ino));
                }
                if victim.size != 0 {
                    return Err(Error::NotEmpty(victim.ino));
                }
            } else if victim.kind == FileKind::Directory {
                return Err(Error::IsDir(victim.ino));
            }
        }
        // Remove the source entry, then put it in place (over the target or as a new entry).
        let mut od = self.getattr(dir)?;
        self.remove_entry(&mut od, name)?;
        od.mtime = now;
        od.ctime = now;
        if src.kind == FileKind::Directory && dir != new_dir {
            od.nlink -= 1;
        }
        self.put_inode(&od)?;
        let mut nd = self.getattr(new_dir)?;
        if let Some(d) = &dst {
            let victim = self.getattr(d.ino)?;
            self.retarget_entry(new_dir, new_name, src.ino, src.kind)?;
            nd = self.getattr(new_dir)?;
            if victim.kind == FileKind::Directory {
                nd.nlink -= 1;
            }
            self.drop_link(victim, now)?;
        } else {
            self.add_entry(&mut nd, new_name, src.ino, src.kind)?;
        }
        if src.kind == FileKind::Directory && dir != new_dir {
            nd.nlink += 1;
            src_inode.parent = new_dir;
        }
        nd.mtime = now;
        nd.ctime = now;
        self.put_inode(&nd)?;
        src_inode.ctime = now;
        self.put_inode(&src_inode)?;
        self.maybe_commit()
    }

    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &mut self,
        dir: u64,
        name: &[u8],
        src: &DirEntry,
        new_dir: u64,
        new_name: &[u8],
        dst: &DirEntry,
        now: Timespec,
    ) -> Result<()> {
        self.retarget_entry(dir, name, dst.ino, dst.kind)?;
        self.retarget_entry(new_dir, new_name, src.ino, src.kind)?;
        let mut a = self.getattr(src.ino)?;
        let mut b = self.getattr(dst.ino)?;
        if dir != new_dir {
            let is_dir = |k: FileKind| i64::from(k == FileKind::Directory);
            // Directories moving across parents carry a ".." link with them.
            let delta = is_dir(src.kind) - is_dir(dst.kind);
            let mut od = self.getattr(dir)?;
            let mut nd = self.getattr(new_dir)?;
            od.nlink = (i64::from(od.nlink) - delta) as u32;
            nd.nlink = (i64::from(nd.nlink) + delta) as u32;
            if a.kind == FileKind::Directory {
                a.parent = new_dir;
            }
            if b.kind == FileKind::Directory {
                b.parent = dir;
            }
            od.mtime = now;
            od.ctime = now;
            self.put_inode(&od)?;
            nd.mtime = now;
            nd.ctime = now;
            self.put_inode(&nd)?;
        } else {
            let mut d = self.getattr(dir)?;
            d.mtime = now;
            d.ctime = now;
            self.put_inode(&d)?;
        }
        a.ctime = now;
        b.ctime = now;
        self.put_inode(&a)?;
        self.put_inode(&b)?;
        self.maybe_commit()
    }

    /// Changes attributes; a size change truncates or extends a regular file.
    pub fn setattr(&mut self, ino: u64, attr: &SetAttr, now: Timespec) -> Result<Inode> {
        self.enter(ino)?;
        let mut inode = self.getattr(ino)?;
        if let Some(size) = attr.size {
            match inode.kind {
                FileKind::Regular => {}
                FileKind::Directory => return Err(Error::IsDir(ino)),
                _ => return Err(Error::Invalid(format!("truncate of inode {ino}, not a regular file"))),
            }
            if size > MAX_FILE_BYTES {
                return Err(Error::FileTooBig(format!("size {size}")));
            }
            let grow_blocks = if size > MAX_INLINE_BYTES as u64 && inode.blocks == 0 { 1 } else { 0 };
            self.reserve(grow_blocks, size < inode.size)?;
            self.truncate_data(&mut inode, size)?;
            inode.mtime = now;
        } else {
            self.reserve(0, false)?;
        }
        if let Some(m) = attr.mode {
            inode.mode = m & 0o7777;
        }
        if let Some(u) = attr.uid {
            inode.uid = u;
        }
        if let Some(g) = attr.gid {
            inode.gid = g;
        }
        if let Some(t) = attr.atime {
            inode.atime = t;
        }
        if let Some(t) = attr.mtime {
            inode.mtime = t;
        }
        inode.ctime = attr.ctime.unwrap_or(now);
        self.put_inode(&inode)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Writes `data` at `offset` of regular file `ino`; returns the new attributes.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8], now: Timespec) -> Result<Inode> {
        self.write_summed(ino, offset, data, None, now)
    }

    /// `write`, with the checksums of `data`'s blocks computed already (`sums`:
    /// `checksum::block_sums(data)`), used where the write covers whole blocks. The store
    /// records them as given: a sum of other bytes makes those blocks read as damaged.
    pub fn write_summed(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        now: Timespec,
    ) -> Result<Inode> {
        let mut inode = self.file_to_write(ino)?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or_else(|| Error::FileTooBig(format!("write ending past {MAX_FILE_BYTES}")))?;
        if data.is_empty() {
            return Ok(inode);
        }
        let blocks = (end - 1) / BLOCK_SIZE_U64 - offset / BLOCK_SIZE_U64 + 2;
        self.reserve(blocks, false)?;
        self.write_data(&mut inode, offset, data, sums)?;
        inode.mtime = now;
        inode.ctime = now;
        self.put_inode(&inode)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// The inode of regular file `ino`, entered for a write (a directory or anything
    /// else refused as a write to it is).
    pub(crate) fn file_to_write(&mut self, ino: u64) -> Result<Inode> {
        self.enter(ino)?;
        let inode = self.getattr(ino)?;
        match inode.kind {
            FileKind::Regular => Ok(inode),
            FileKind::Directory => Err(Error::IsDir(ino)),
            _ => Err(Error::Invalid(format!("write to inode {ino}, not a regular file"))),
        }
    }

    /// Allocates, punches or zeroes a range of a regular file.
    pub fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: FallocateMode, now: Timespec) -> Result<Inode> {
        self.enter(ino)?;
        let mut inode = self.getattr(ino)?;
        if inode.kind != FileKind::Regular {
            return Err(if inode.kind == FileKind::Directory {
                Error::IsDir(ino)
            } else {
                Error::Invalid(format!("fallocate on inode {ino}"))
            });
        }
        if len == 0 {
            return Err(Error::Invalid("fallocate of length 0".into()));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or_else(|| Error::FileTooBig("fallocate range".into()))?;
        if mode.punch_hole {
            if !mode.keep_size {
                return Err(Error::NotSupported("punch hole without keep-size".into()));
            }
            self.reserve(2, true)?;
            self.punch_data(&mut inode, offset, len)?;
        } else {
            let blocks = end.div_ceil(BLOCK_SIZE_U64) - offset / BLOCK_SIZE_U64 + 1;
            self.reserve(blocks, false)?;
            if mode.zero_range {
                self.punch_data(&mut inode, offset, len)?;
            }
            let alloc_end = if mode.keep_size {
                end.min(inode.size.div_ceil(BLOCK_SIZE_U64) * BLOCK_SIZE_U64).max(offset)
            } else {
                end
            };
            if !mode.keep_size && end > inode.size {
                self.truncate_data(&mut inode, end)?;
            }
            if alloc_end > offset && inode.size > MAX_INLINE_BYTES as u64 {
                if let Err(e) = self.allocate_data(&mut inode, offset, alloc_end) {
                    // What was allocated stays (as ext4 and xfs leave it), recorded in
                    // the inode so that the file and its extents agree.
                    inode.ctime = now;
                    self.put_inode(&inode)?;
                    return Err(e);
                }
            }
        }
        inode.ctime = now;
        if mode.punch_hole || mode.zero_range || end > inode.size {
            inode.mtime = now;
        }
        self.put_inode(&inode)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Sets xattr `name` (creating or replacing it). A value too big for the name's
    /// XATTR item goes to chunk items (`fs/xattr.rs`); the record, its chunks and the old
    /// value's chunks change in this one operation. Everything that can refuse the change
    /// is checked before the tree is touched, so a refused setxattr changes nothing.
    pub fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], now: Timespec) -> Result<()> {
        self.enter(ino)?;
        xattr::check(name, value.len())?;
        // Each chunk may dirty a leaf of its own (old chunks are covered by the margin).
        let chunks = if xattr::is_inline(name.len(), value.len()) { 0 } else { xattr::chunk_count(value.len()) };
        self.reserve(chunks as u64, false)?;
        let mut inode = self.getattr(ino)?;
        let key = xattr::xattr_key(ino, name);
        let mut entries = match self.fs.get(&mut self.pager, &key)? {
            Some(v) => xattr::decode(key, &v, 0)?,
            None => Vec::new(),
        };
        let old = entries.iter().position(|e| e.name == name).map(|i| entries.remove(i));
        if old.is_none() {
            let list = self.xattr_list_bytes(ino)?;
            if list + name.len() + 1 > XATTR_LIST_MAX {
                return Err(Error::NoSpace(format!(
                    "xattr names of inode {ino} would take {} bytes (max {XATTR_LIST_MAX})",
                    list + name.len() + 1
                )));
            }
        }
        let item = xattr::item_bytes(&entries) + xattr::record_bytes(name.len(), value.len());
        if item > MAX_ITEM_BYTES {
            return Err(Error::NoSpace(format!("xattrs colliding on one hash of inode {ino} exceed an item")));
        }
        if let Some(xattr::Entry { value: xattr::Value::Chunked { len, id }, .. }) = old {
            self.delete_xattr_chunks(ino, id, len)?;
        }
        let stored = if chunks == 0 {
            xattr::Value::Inline(value.to_vec())
        } else {
            let id = self.free_chunk_id(ino, key.offset)?;
            for i in 0..chunks {
                self.fs.insert(
                    &mut self.pager,
                    xattr::chunk_key(ino, id, i),
                    xattr::encode_chunk(key.offset, value, i),
                )?;
            }
            xattr::Value::Chunked { len: value.len() as u32, id }
        };
        entries.push(xattr::Entry { name: name.to_vec(), value: stored });
        self.fs.insert(&mut self.pager, key, xattr::encode(&entries))?;
        inode.flags |= inode::xattr_flag(name);
        inode.ctime = now;
        self.put_inode(&inode)?;
        self.maybe_commit()
    }

    /// A chunk id no value of `ino` uses: the first free one from the name's preferred id
    /// (every value has a chunk 0, so a free chunk 0 is a free id). An inode has at most
    /// `XATTR_LIST_MAX / 2` xattrs, so the search ends within that many steps.
    fn free_chunk_id(&mut self, ino: u64, hash: u64) -> Result<u64> {
        let mut id = xattr::preferred_chunk_id(hash);
        for _ in 0..=XATTR_LIST_MAX / 2 {
            if self.fs.get(&mut self.pager, &xattr::chunk_key(ino, id, 0))?.is_none() {
                return Ok(id);
            }
            id = xattr::next_chunk_id(id);
        }
        Err(Error::corrupt("item", 0, format!("inode {ino}: more xattr chunk ids in use than xattrs can have")))
    }

    /// Deletes the chunks of an out-of-line value.
    fn delete_xattr_chunks(&mut self, ino: u64, id: u64, len: u32) -> Result<()> {
        for i in 0..xattr::chunk_count(len as usize) {
            self.fs.delete(&mut self.pager, &xattr::chunk_key(ino, id, i))?;
        }
        Ok(())
    }

    /// Removes xattr `name` and its chunks.
    pub fn removexattr(&mut self, ino: u64, name: &[u8], now: Timespec) -> Result<()> {
        self.enter(ino)?;
        xattr::check_name(name)?;
        self.reserve(0, true)?;
        let mut inode = self.getattr(ino)?;
        let key = xattr::xattr_key(ino, name);
        let v = self.fs.get(&mut self.pager, &key)?.ok_or(Error::NoXattr(ino))?;
        let mut entries = xattr::decode(key, &v, 0)?;
        let i = entries.iter().position(|e| e.name == name).ok_or(Error::NoXattr(ino))?;
        if let xattr::Value::Chunked { len, id } = entries.remove(i).value {
            self.delete_xattr_chunks(ino, id, len)?;
        }
        if entries.is_empty() {
            self.fs.delete(&mut self.pager, &key)?;
        } else {
            self.fs.insert(&mut self.pager, key, xattr::encode(&entries))?;
        }
        inode.flags &= !inode::xattr_flag(name);
        inode.ctime = now;
        self.put_inode(&inode)?;
        self.maybe_commit()
    }

    // ---- handles and durability ---------------------------------------------------------

    /// Notes that `ino` is open (an unlinked open file stays until `release`).
    pub fn open_handle(&mut self, ino: u64) -> Result<Inode> {
        self.enter(ino)?;
        if self.space.is_doomed(ino) {
            return Err(Error::NotFound(format!("inode {ino} (being freed)")));
        }
        let inode = self.getattr(ino)?;
        *self.open_handles.entry(ino).or_insert(0) += 1;
        Ok(inode)
    }

    /// Closes one handle; the last close of an unlinked inode destroys it.
    pub fn release_handle(&mut self, ino: u64) -> Result<()> {
        let Some(n) = self.open_handles.get_mut(&ino) else { return Ok(()) };
        *n -= 1;
        if *n > 0 {
            return Ok(());
        }
        self.open_handles.remove(&ino);
        let inode = match self.getattr(ino) {
            Ok(i) => i,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        if inode.nlink == 0 {
            self.reserve(0, true)?;
            self.destroy_inode(&inode)?;
            self.maybe_commit()?;
        }
        Ok(())
    }

    /// Makes everything done so far durable (crest has no per-file log yet: a commit).
    pub fn fsync(&mut self, _ino: u64) -> Result<()> {
        self.commit_or_defer()
    }

    /// The inodes on the orphan list of every dataset (unlinked while open; after a crash,
    /// until `reclaim_orphans`).
    pub fn orphans(&mut self) -> Result<Vec<u64>> {
        let lo = Key::new(ORPHAN_OBJECTID, kind::ORPHAN, 0);
        let hi = Key::new(ORPHAN_OBJECTID, kind::ORPHAN, u64::MAX);
        let mut out = Vec::new();
        // (A snapshot's orphans are its dataset's as they were: never reclaimed there.)
        let live: Vec<u64> = self.dataset_ids().into_iter().filter(|&d| !self.is_snapshot(d)).collect();
        for d in live {
            self.select(d)?;
            out.extend(self.fs.collect(&mut self.pager, &lo, &hi, usize::MAX)?.into_iter().map(|(k, _)| k.offset));
        }
        Ok(out)
    }

    /// Destroys inodes left on the orphan lists (open files unlinked before a crash).
    pub fn reclaim_orphans(&mut self) -> Result<usize> {
        // An orphan (or the list) that cannot be read is left as it is, for fsck: open does
        // not verify every leaf (`Leaves::Since`), and one bad leaf must neither keep the
        // image from opening nor lose the record of what is to be freed.
        let orphans = match self.orphans() {
            Err(e) if e.is_corruption() => {
                tracing::error!("the orphan list cannot be read; orphans are not reclaimed (run crest fsck): {e}");
                return Ok(0);
            }
            r => r?,
        };
        let mut n = 0;
        for ino in orphans {
            if self.open_handles.contains_key(&ino) {
                continue;
            }
            match self.getattr(ino) {
                Ok(inode) if inode.nlink == 0 => {
                    self.destroy_inode(&inode)?;
                    n += 1;
                }
                Err(e) if e.is_corruption() => {
                    tracing::error!(ino, "an orphan cannot be read; not reclaimed (run crest fsck): {e}");
                }
                _ => {
                    self.enter(ino)?;
                    self.fs.delete(&mut self.pager, &Key::new(ORPHAN_OBJECTID, kind::ORPHAN, ino))?;
                }
            }
        }
        if n > 0 {
            tracing::info!(reclaimed = n, "reclaimed orphan inodes");
            self.commit()?;
        }
        Ok(n)
    }

    /// Applies many operations in the running transaction, returning each one's result.
    pub fn batch(&mut self, ops: Vec<Op>) -> Vec<Result<OpResult>> {
        let saved = self.policy.max_dirty_nodes;
        self.policy.max_dirty_nodes = usize::MAX; // one transaction, unless space runs low
        let out = ops.into_iter().map(|op| self.apply(op)).collect();
        self.policy.max_dirty_nodes = saved;
        out
    }

    /// Applies one operation.
    pub fn apply(&mut self, op: Op) -> Result<OpResult> {
        use OpResult::{Done, Inode as I};
        Ok(match op {
            Op::Create { dir, name, kind, mode, uid, gid, rdev, now } => {
                I(self.create(dir, &name, kind, mode, uid, gid, rdev, now)?)
            }
            Op::Symlink { dir, name, target, uid, gid, now } => I(self.symlink(dir, &name, &target, uid, gid, now)?),
            Op::Link { ino, dir, name, now } => I(self.link(ino, dir, &name, now)?),
            Op::Unlink { dir, name, now } => I(self.unlink(dir, &name, now)?.inode),
            Op::Rmdir { dir, name, now } => I(self.rmdir(dir, &name, now)?.inode),
            Op::Rename { dir, name, new_dir, new_name, flags, now } => {
                self.rename(dir, &name, new_dir, &new_name, flags, now)?;
                Done
            }
            Op::SetAttr { ino, attr, now } => I(self.setattr(ino, &attr, now)?),
            Op::Write { ino, offset, data, now } => I(self.write(ino, offset, &data, now)?),
            Op::SetXattr { ino, name, value, now } => {
                self.setxattr(ino, &name, &value, now)?;
                Done
            }
            Op::RemoveXattr { ino, name, now } => {
                self.removexattr(ino, &name, now)?;
                Done
            }
        })
    }
}
