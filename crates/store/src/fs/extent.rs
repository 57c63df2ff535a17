//! File data. Small files (up to `MAX_INLINE_BYTES`) live in one inline EXTENT item at
//! offset 0. Larger files map block-aligned file ranges to runs of disk blocks; each
//! EXTENT item carries one CRC-32C per 4 KiB block, so a read verifies every block it
//! returns. Data is copy-on-write: a write puts new blocks in place of old ones and the old
//! ones are dropped from the refcount tree, so a crash never mixes old and new bytes.
//!
//! Invariants (checked by fsck):
//! - an inline item exists only alone, at offset 0, with the file no larger than
//!   `MAX_INLINE_BYTES`; its bytes are no longer than the file;
//! - extent items are block-aligned, never overlap, and end at or before the file's last
//!   block; `inode.blocks` is the sum of their lengths;
//! - every block an extent names is covered by a refcount item counting the references;
//! - in a dataset with `copies=2` a new extent also names a second run (`twin`) holding the
//!   same bytes, with refcount items of its own; a read that finds a block bad takes it
//!   from the twin and rewrites the bad one. Both runs are split, merged and freed
//!   together.

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::inode::{le_u32, le_u64, Inode};
use crate::fs::keys::kind;
use crate::limits::{BLOCK_SIZE, BLOCK_SIZE_U64, MAX_EXTENT_BLOCKS, MAX_INLINE_BYTES};
use crate::store::Store;

const INLINE: u8 = 0;
const REGULAR: u8 = 1;
/// A regular extent with a second copy: the twin's first block follows the length.
const REGULAR_TWIN: u8 = 2;

/// What one EXTENT item says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    /// The file's bytes, stored in the leaf.
    Inline(Vec<u8>),
    /// `csums.len()` blocks starting at `disk_block`.
    Regular {
        /// First disk block.
        disk_block: u64,
        /// First block of the second copy (as many blocks, the same bytes), 0 if none.
        twin: u64,
        /// CRC-32C of each block.
        csums: Vec<u32>,
    },
}

impl Extent {
    /// Encodes the item value.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Extent::Inline(data) => {
                let mut v = Vec::with_capacity(1 + data.len());
                v.push(INLINE);
                v.extend_from_slice(data);
                v
            }
            Extent::Regular { disk_block, twin, csums } => {
                let mut v = Vec::with_capacity(21 + 4 * csums.len());
                v.push(if *twin == 0 { REGULAR } else { REGULAR_TWIN });
                v.extend_from_slice(&disk_block.to_le_bytes());
                v.extend_from_slice(&(csums.len() as u32).to_le_bytes());
                if *twin != 0 {
                    v.extend_from_slice(&twin.to_le_bytes());
                }
                for c in csums {
                    v.extend_from_slice(&c.to_le_bytes());
                }
                v
            }
        }
    }

    /// Decodes and validates an EXTENT item of a file system of `total_blocks`.
    pub fn decode(key: Key, b: &[u8], total_blocks: u64) -> Result<Extent> {
        let bad = |d: String| Error::bad_item(key, 0, d);
        match b.first().copied() {
            Some(INLINE) => {
                if key.offset != 0 || b.len() - 1 > MAX_INLINE_BYTES {
                    return Err(bad(format!("inline extent at offset {} of {} bytes", key.offset, b.len() - 1)));
                }
                Ok(Extent::Inline(b[1..].to_vec()))
            }
            Some(t @ (REGULAR | REGULAR_TWIN)) => {
                let head = if t == REGULAR { 13 } else { 21 };
                if b.len() < head {
                    return Err(bad("truncated extent".into()));
                }
                let disk_block = le_u64(b, 1);
                let n = u64::from(le_u32(b, 9));
                if n == 0 || n > MAX_EXTENT_BLOCKS || b.len() as u64 != head as u64 + 4 * n {
                    return Err(bad(format!("extent of {n} blocks in {} bytes", b.len())));
                }
                if !key.offset.is_multiple_of(BLOCK_SIZE_U64) {
                    return Err(bad("extent not block-aligned".into()));
                }
                let inside =
                    |s: u64| s >= crate::limits::RESERVED_BLOCKS && s.checked_add(n).is_some_and(|e| e <= total_blocks);
                if t == REGULAR && crate::fs::objects::within_one_object(disk_block, n) {
                    // Blocks of an object in the data store (`fs/objects.rs`).
                } else if !inside(disk_block) {
                    return Err(bad(format!("extent blocks {disk_block}+{n} outside the image")));
                }
                let twin = if t == REGULAR { 0 } else { le_u64(b, 13) };
                if t == REGULAR_TWIN && (!inside(twin) || twin < disk_block + n && disk_block < twin + n) {
                    return Err(bad(format!("second copy {twin}+{n} outside the image or over {disk_block}+{n}")));
                }
                let csums = (0..n as usize).map(|i| le_u32(b, head + 4 * i)).collect();
                Ok(Extent::Regular { disk_block, twin, csums })
            }
            _ => Err(bad("unknown extent type".into())),
        }
    }

    /// Blocks the extent maps (0 for inline).
    pub fn blocks(&self) -> u64 {
        match self {
            Extent::Inline(_) => 0,
            Extent::Regular { csums, .. } => csums.len() as u64,
        }
    }

    /// The disk runs it holds, (first block, blocks): its blocks and their second copy.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        match self {
            Extent::Inline(_) => Vec::new(),
            Extent::Regular { disk_block, twin, csums } => {
                let n = csums.len() as u64;
                [(*disk_block, n), (*twin, n)].into_iter().filter(|r| r.0 != 0).collect()
            }
        }
    }
}

/// A refcount item's value: the count (u32) and the generation the blocks were born in
/// (u64). Written before snapshots, a value was the count alone: born at generation 0.
pub(crate) fn encode_ref(count: u32, birth: u64) -> Vec<u8> {
    let mut v = count.to_le_bytes().to_vec();
    v.extend_from_slice(&birth.to_le_bytes());
    v
}

/// (count, birth) of a refcount item's value, if it is one.
pub(crate) fn decode_ref(v: &[u8]) -> Option<(u32, u64)> {
    match v.len() {
        4 => Some((le_u32(v, 0), 0)),
        12 => Some((le_u32(v, 0), le_u64(v, 4))),
        _ => None,
    }
}

/// Key of the EXTENT item at file byte `offset`.
pub fn extent_key(ino: u64, offset: u64) -> Key {
    Key::new(ino, kind::EXTENT, offset)
}

/// Largest byte length an extent covers, so a range search can start that far back.
const MAX_EXTENT_BYTES: u64 = MAX_EXTENT_BLOCKS * BLOCK_SIZE_U64;

impl Store {
    /// EXTENT items of `ino` that overlap file bytes `[start, end)`, in order.
    pub(crate) fn extents_overlapping(&mut self, ino: u64, start: u64, end: u64) -> Result<Vec<(u64, Extent)>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let lo = extent_key(ino, start.saturating_sub(MAX_EXTENT_BYTES - 1));
        let hi = extent_key(ino, end - 1);
        let total = self.pager.total_blocks();
        let mut out = Vec::new();
        self.fs.range(&mut self.pager, &lo, &hi, &mut |k, v| {
            let e = Extent::decode(*k, v, total)?;
            let len = match &e {
                Extent::Inline(d) => d.len() as u64,
                Extent::Regular { csums, .. } => csums.len() as u64 * BLOCK_SIZE_U64,
            };
            if k.offset + len > start {
                out.push((k.offset, e));
            }
            Ok(true)
        })?;
        Ok(out)
    }

    /// The inline item of `ino`, if its data is inline.
    pub(crate) fn inline_data(&mut self, ino: u64) -> Result<Option<Vec<u8>>> {
        let key = extent_key(ino, 0);
        match self.fs.get(&mut self.pager, &key)? {
            Some(v) => match Extent::decode(key, &v, self.pager.total_blocks())? {
                Extent::Inline(d) => Ok(Some(d)),
                Extent::Regular { .. } => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// Drops the mappings of file blocks `[first, end)` (block numbers), splitting extents
    /// at the edges and releasing the blocks. Returns the number of blocks unmapped.
    pub(crate) fn unmap_blocks(&mut self, ino: u64, first: u64, end: u64) -> Result<u64> {
        if first >= end {
            return Ok(0);
        }
        let mut dropped = 0;
        for (file_off, ext) in
            self.extents_overlapping(ino, first * BLOCK_SIZE_U64, end.saturating_mul(BLOCK_SIZE_U64))?
        {
            let Extent::Regular { disk_block, twin, csums } = ext else { continue };
            let ext_first = file_off / BLOCK_SIZE_U64;
            let n = csums.len() as u64;
            let cut_lo = first.max(ext_first) - ext_first;
            let cut_hi = end.min(ext_first + n) - ext_first;
            self.fs.delete(&mut self.pager, &extent_key(ino, file_off))?;
            if cut_lo > 0 {
                let left = Extent::Regular { disk_block, twin, csums: csums[..cut_lo as usize].to_vec() };
                self.fs.insert(&mut self.pager, extent_key(ino, file_off), left.encode())?;
            }
            let moved = |b: u64, by: u64| if b == 0 { 0 } else { b + by };
            if cut_hi < n {
                let right = Extent::Regular {
                    disk_block: disk_block + cut_hi,
                    twin: moved(twin, cut_hi),
                    csums: csums[cut_hi as usize..].to_vec(),
                };
                self.fs.insert(
                    &mut self.pager,
                    extent_key(ino, (ext_first + cut_hi) * BLOCK_SIZE_U64),
                    right.encode(),
                )?;
            }
            for start in [disk_block, twin].into_iter().filter(|&b| b != 0) {
                self.refs_drop(start + cut_lo, cut_hi - cut_lo)?;
                self.uncharge(cut_hi - cut_lo);
            }
            dropped += cut_hi - cut_lo;
        }
        Ok(dropped)
    }

    /// Writes whole blocks of `data` at file block `first`, replacing what was mapped there.
    /// `data.len()` is a multiple of the block size; `sums`, if given, is the CRC-32C of
    /// each of its blocks (`checksum::block_sums`, computed elsewhere; a list of another
    /// length is ignored). Returns (blocks unmapped, blocks mapped).
    pub(crate) fn write_blocks(
        &mut self,
        ino: u64,
        first: u64,
        data: &[u8],
        sums: Option<&[u32]>,
    ) -> Result<(u64, u64)> {
        debug_assert_eq!(data.len() % BLOCK_SIZE, 0);
        let nblocks = (data.len() / BLOCK_SIZE) as u64;
        let sums = sums.filter(|s| s.len() as u64 == nblocks);
        let goal = self.goal_at(ino, first)?;
        let runs = self.take_copies(ino, goal, nblocks)?;
        let unmapped = self.unmap_blocks(ino, first, first + nblocks)?;
        let mut done = 0u64;
        for (start, twin, got) in runs {
            let bytes = &data[(done as usize) * BLOCK_SIZE..((done + got) as usize) * BLOCK_SIZE];
            for at in [start, twin].into_iter().filter(|&b| b != 0) {
                self.pager.write_blocks(at, bytes)?;
                self.refs_add(at, got)?;
                self.charge(got);
            }
            let csums = match sums {
                Some(s) => s[done as usize..(done + got) as usize].to_vec(),
                None => crate::engine::checksum::block_sums(bytes),
            };
            self.map_extent(ino, first + done, start, twin, csums)?;
            done += got;
        }
        Ok((unmapped, nblocks))
    }

    /// Copies of each data block the active dataset keeps (its `copies` property).
    pub(crate) fn data_copies(&self) -> u8 {
        let copies = self.dataset_props(self.active).and_then(|p| p.get_u64("copies"));
        if copies == Some(2) {
            2
        } else {
            1
        }
    }

    /// `take_runs`, and with `copies=2` as many blocks again half an image away for the
    /// second copy: (first block, first block of its copy or 0, blocks), cut where either
    /// run list breaks so each piece is contiguous in both.
    fn take_copies(&mut self, ino: u64, goal: u64, nblocks: u64) -> Result<Vec<(u64, u64, u64)>> {
        let runs = self.take_runs(ino, goal, nblocks)?;
        if self.data_copies() < 2 {
            return Ok(runs.into_iter().map(|(s, n)| (s, 0, n)).collect());
        }
        let total = self.pager.total_blocks();
        let far = crate::limits::RESERVED_BLOCKS + (goal + total / 2) % (total - crate::limits::RESERVED_BLOCKS);
        let twins = match self.take_runs(ino, far, nblocks) {
            Ok(t) => t,
            Err(e) => {
                for (start, len) in runs {
                    self.pager.alloc.mark_free(start, len);
                }
                return Err(e);
            }
        };
        let mut out = Vec::new();
        let (mut a, mut b) = (runs.into_iter(), twins.into_iter());
        let (mut x, mut y) = (a.next(), b.next());
        while let (Some((s, n)), Some((t, m))) = (x, y) {
            let k = n.min(m);
            out.push((s, t, k));
            x = if n > k { Some((s + k, n - k)) } else { a.next() };
            y = if m > k { Some((t + k, m - k)) } else { b.next() };
        }
        Ok(out)
    }

    /// Where blocks for file block `first` of `ino` should go: right after the extent that
    /// ends where they start, else spread by inode.
    fn goal_at(&mut self, ino: u64, first: u64) -> Result<u64> {
        let prev = match first.checked_sub(1) {
            Some(p) => self.extents_overlapping(ino, p * BLOCK_SIZE_U64, first * BLOCK_SIZE_U64)?.pop(),
            None => None,
        };
        Ok(match prev {
            Some((off, Extent::Regular { disk_block, csums, .. }))
                if off / BLOCK_SIZE_U64 + csums.len() as u64 == first
                    && crate::fs::objects::object_of(disk_block).is_none() =>
            {
                disk_block + csums.len() as u64
            }
            _ => self.data_goal(ino),
        })
    }

    /// Takes `nblocks` blocks from the allocator near `goal`, in runs an extent can map,
    /// or none (ENOSPC) if they and the items mapping them would not leave the running
    /// operation's floor free: a full, fragmented free space must fail the call before it
    /// changes anything, not the commit after it.
    fn take_runs(&mut self, ino: u64, mut goal: u64, nblocks: u64) -> Result<Vec<(u64, u64)>> {
        let mut runs = Vec::new();
        let mut done = 0;
        while done < nblocks {
            let want = (nblocks - done).min(MAX_EXTENT_BLOCKS);
            match self.pager.alloc_upto(goal, want) {
                Some((start, got)) => {
                    runs.push((start, got));
                    goal = start + got;
                    done += got;
                }
                None => break,
            }
        }
        if done == nblocks && self.data_fits(&runs) {
            return Ok(runs);
        }
        for (start, len) in runs {
            self.pager.alloc.mark_free(start, len);
        }
        Err(Error::NoSpace(format!("no room for {nblocks} blocks of inode {ino} data")))
    }

    /// Inserts an extent item, merging with the previous one when the disk blocks continue it.
    pub(crate) fn map_extent(
        &mut self,
        ino: u64,
        file_block: u64,
        disk_block: u64,
        twin: u64,
        csums: Vec<u32>,
    ) -> Result<()> {
        if file_block > 0 {
            let prev =
                self.extents_overlapping(ino, (file_block - 1) * BLOCK_SIZE_U64, file_block * BLOCK_SIZE_U64)?.pop();
            if let Some((off, Extent::Regular { disk_block: pd, twin: pt, csums: mut pc })) = prev {
                let pn = pc.len() as u64;
                let twins_continue = if pt == 0 { twin == 0 } else { twin == pt + pn };
                if off / BLOCK_SIZE_U64 + pn == file_block
                    && pd + pn == disk_block
                    && twins_continue
                    && pn + csums.len() as u64 <= MAX_EXTENT_BLOCKS
                {
                    pc.extend(csums);
                    let merged = Extent::Regular { disk_block: pd, twin: pt, csums: pc };
                    self.fs.insert(&mut self.pager, extent_key(ino, off), merged.encode())?;
                    return Ok(());
                }
            }
        }
        let e = Extent::Regular { disk_block, twin, csums };
        self.fs.insert(&mut self.pager, extent_key(ino, file_block * BLOCK_SIZE_U64), e.encode())?;
        Ok(())
    }

    fn data_goal(&mut self, ino: u64) -> u64 {
        // Spread files over allocation groups by inode so unrelated files don't interleave.
        let total = self.pager.total_blocks();
        let span = total - crate::limits::RESERVED_BLOCKS;
        crate::limits::RESERVED_BLOCKS + (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) % span.max(1)
    }

    /// Adds a refcount item for newly allocated blocks, born in the running transaction.
    pub(crate) fn refs_add(&mut self, start: u64, len: u64) -> Result<()> {
        let key = Key::new(start, kind::EXTENT_REF, len);
        let old = self.refcount_tree.insert(&mut self.pager, key, encode_ref(1, self.sb.generation + 1))?;
        debug_assert!(old.is_none(), "refcount item {key:?} already existed");
        Ok(())
    }

    /// Drops one reference to blocks `[start, start+len)`, splitting refcount items at the
    /// edges; blocks left with no reference are freed after the commit — unless a snapshot
    /// of the active dataset holds them (born at or before its generation): then they stay
    /// allocated, on the dataset's deadlist (`snapshots.rs`).
    pub(crate) fn refs_drop(&mut self, start: u64, len: u64) -> Result<()> {
        let keep = self.pager.keep.get(&self.fs.owner).copied();
        self.refs_drop_keeping(start, len, keep)
    }

    /// `refs_drop`, keeping what a snapshot of generation `keep` holds.
    pub(crate) fn refs_drop_keeping(&mut self, start: u64, len: u64, keep: Option<u64>) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = start + len;
        let lo = Key::new(start.saturating_sub(MAX_EXTENT_BLOCKS - 1), kind::EXTENT_REF, 0);
        let hi = Key::new(end - 1, kind::EXTENT_REF, u64::MAX);
        let items = self.refcount_tree.collect(&mut self.pager, &lo, &hi, usize::MAX)?;
        let mut covered = 0;
        let mut freed_objects = Vec::new();
        for (k, v) in items {
            let Some((refs, birth)) = decode_ref(&v).filter(|_| k.kind == kind::EXTENT_REF) else {
                return Err(Error::bad_item(k, 0, "bad refcount item"));
            };
            let (s, e) = (k.objectid, k.objectid + k.offset);
            if e <= start || s >= end {
                continue;
            }
            self.refcount_tree.delete(&mut self.pager, &k)?;
            let (cs, ce) = (s.max(start), e.min(end));
            let kept = refs <= 1 && keep.is_some_and(|g| birth <= g);
            let left = if kept { refs } else { refs.saturating_sub(1) };
            for (ps, pe, r) in [(s, cs, refs), (cs, ce, left), (ce, e, refs)] {
                if pe > ps && r > 0 {
                    self.refcount_tree.insert(
                        &mut self.pager,
                        Key::new(ps, kind::EXTENT_REF, pe - ps),
                        encode_ref(r, birth),
                    )?;
                }
            }
            if kept {
                self.dead_data(cs, ce - cs, birth);
            } else if refs <= 1 {
                match crate::fs::objects::object_of(cs) {
                    Some((id, _)) => freed_objects.push(id),
                    None => self.pager.free_later(cs, ce - cs),
                }
            }
            covered += ce - cs;
        }
        freed_objects.dedup();
        for id in freed_objects {
            self.object_blocks_freed(id)?;
        }
        if covered != len {
            return Err(Error::corrupt(
                "refcount tree",
                start,
                format!("blocks {start}+{len} are referenced but only {covered} are counted"),
            ));
        }
        Ok(())
    }

    /// Rewrites file `ino` so its data is in blocks, not inline (before it grows past the
    /// inline limit). Returns blocks mapped.
    pub(crate) fn uninline(&mut self, ino: u64) -> Result<u64> {
        let Some(data) = self.inline_data(ino)? else { return Ok(0) };
        self.fs.delete(&mut self.pager, &extent_key(ino, 0))?;
        if data.is_empty() {
            return Ok(0);
        }
        let mut block = vec![0u8; BLOCK_SIZE];
        block[..data.len()].copy_from_slice(&data);
        let (_, mapped) = self.write_blocks(ino, 0, &block, None)?;
        Ok(mapped)
    }

    /// Writes `data` at `offset` of a file whose inode the caller holds; updates size and
    /// block count in `inode` (the caller stores it).
    pub(crate) fn write_data(
        &mut self,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let new_size = inode.size.max(end);
        let has_blocks = inode.blocks > 0;
        if new_size <= MAX_INLINE_BYTES as u64 && !has_blocks {
            let mut bytes = self.inline_data(inode.ino)?.unwrap_or_default();
            bytes.resize(inode.size as usize, 0);
            if bytes.len() < end as usize {
                bytes.resize(end as usize, 0);
            }
            bytes[offset as usize..end as usize].copy_from_slice(data);
            self.fs.insert(&mut self.pager, extent_key(inode.ino, 0), Extent::Inline(bytes).encode())?;
            inode.size = new_size;
            return Ok(());
        }
        inode.blocks += self.uninline(inode.ino)?;
        let first = offset / BLOCK_SIZE_U64;
        let last = (end - 1) / BLOCK_SIZE_U64;
        if offset.is_multiple_of(BLOCK_SIZE_U64) && end.is_multiple_of(BLOCK_SIZE_U64) {
            // Whole blocks (a big write's): written as they came, no copy.
            let (unmapped, mapped) = self.write_blocks(inode.ino, first, data, sums)?;
            inode.blocks = inode.blocks + mapped - unmapped;
            inode.size = new_size;
            return Ok(());
        }
        let mut buf = vec![0u8; ((last - first + 1) as usize) * BLOCK_SIZE];
        let head = (offset - first * BLOCK_SIZE_U64) as usize;
        // Read-modify-write of partial edge blocks (only what exists below the old size).
        if head != 0 {
            let old = self.read_data(inode, first * BLOCK_SIZE_U64, BLOCK_SIZE_U64)?;
            buf[..old.len()].copy_from_slice(&old);
        }
        let tail_block_start = last * BLOCK_SIZE_U64;
        if !end.is_multiple_of(BLOCK_SIZE_U64) && (last != first || head == 0) {
            let old = self.read_data(inode, tail_block_start, BLOCK_SIZE_U64)?;
            let at = (tail_block_start - first * BLOCK_SIZE_U64) as usize;
            buf[at..at + old.len()].copy_from_slice(&old);
        }
        buf[head..head + data.len()].copy_from_slice(data);
        let (unmapped, mapped) = self.write_blocks(inode.ino, first, &buf, None)?;
        inode.blocks = inode.blocks + mapped - unmapped;
        inode.size = new_size;
        Ok(())
    }

    /// Sets the size of a regular file, freeing blocks past the end and zeroing the tail of
    /// the last block so that growing the file later reads zeros.
    pub(crate) fn truncate_data(&mut self, inode: &mut Inode, size: u64) -> Result<()> {
        if size == inode.size {
            return Ok(());
        }
        if inode.blocks == 0 {
            if let Some(mut bytes) = self.inline_data(inode.ino)? {
                if size <= MAX_INLINE_BYTES as u64 {
                    bytes.truncate(size as usize);
                    self.fs.insert(&mut self.pager, extent_key(inode.ino, 0), Extent::Inline(bytes).encode())?;
                    inode.size = size;
                    return Ok(());
                }
                inode.blocks += self.uninline(inode.ino)?;
            }
        }
        if size < inode.size {
            let keep = size.div_ceil(BLOCK_SIZE_U64);
            inode.blocks -= self.unmap_blocks(inode.ino, keep, u64::MAX / BLOCK_SIZE_U64)?;
            if !size.is_multiple_of(BLOCK_SIZE_U64) {
                let block_start = (keep - 1) * BLOCK_SIZE_U64;
                if !self.extents_overlapping(inode.ino, block_start, block_start + 1)?.is_empty() {
                    let mut old = self.read_data(inode, block_start, BLOCK_SIZE_U64)?;
                    old.resize(BLOCK_SIZE, 0);
                    old[(size - block_start) as usize..].fill(0);
                    let (u, m) = self.write_blocks(inode.ino, keep - 1, &old, None)?;
                    inode.blocks = inode.blocks + m - u;
                }
            }
        }
        inode.size = size;
        Ok(())
    }

    /// Frees all data of an inode being destroyed.
    pub(crate) fn drop_data(&mut self, inode: &Inode) -> Result<()> {
        if self.inline_data(inode.ino)?.is_some() {
            self.fs.delete(&mut self.pager, &extent_key(inode.ino, 0))?;
        }
        self.unmap_blocks(inode.ino, 0, u64::MAX / BLOCK_SIZE_U64)?;
        Ok(())
    }

    /// Unmaps whole blocks inside `[offset, offset+len)` and zeroes the partial edges.
    pub(crate) fn punch_data(&mut self, inode: &mut Inode, offset: u64, len: u64) -> Result<()> {
        let end = offset.saturating_add(len).min(inode.size);
        if offset >= end {
            return Ok(());
        }
        if inode.blocks == 0 {
            if let Some(mut bytes) = self.inline_data(inode.ino)? {
                let e = (end as usize).min(bytes.len());
                if (offset as usize) < e {
                    bytes[offset as usize..e].fill(0);
                }
                self.fs.insert(&mut self.pager, extent_key(inode.ino, 0), Extent::Inline(bytes).encode())?;
                return Ok(());
            }
        }
        let first_whole = offset.div_ceil(BLOCK_SIZE_U64);
        let end_whole = end / BLOCK_SIZE_U64;
        if first_whole < end_whole {
            inode.blocks -= self.unmap_blocks(inode.ino, first_whole, end_whole)?;
        }
        // Partial blocks at the edges: zero the covered bytes where data exists.
        let mut edges = vec![(offset, end.min(first_whole * BLOCK_SIZE_U64))];
        if end_whole >= first_whole {
            edges.push(((end_whole * BLOCK_SIZE_U64).max(offset), end));
        }
        for (s, e) in edges {
            if s >= e || self.extents_overlapping(inode.ino, s, e)?.is_empty() {
                continue;
            }
            let size = inode.size;
            self.write_data(inode, s, &vec![0u8; (e - s) as usize], None)?;
            inode.size = size;
        }
        Ok(())
    }

    /// Makes sure blocks exist (zero-filled where there were holes) for `[offset, end)`.
    /// Holes get whole zeroed blocks without moving data (`Disk::write_zeroes`): a
    /// fallocate of gigabytes costs its extent items, not a write of every byte.
    pub(crate) fn allocate_data(&mut self, inode: &mut Inode, offset: u64, end: u64) -> Result<()> {
        let mut pos = offset;
        while pos < end {
            let exts = self.extents_overlapping(inode.ino, pos, end)?;
            let next_data = exts.iter().map(|(o, _)| *o).find(|o| *o + 1 > pos).unwrap_or(end).max(pos);
            let covered_until = exts
                .iter()
                .filter(|(o, _)| *o <= pos)
                .map(|(o, e)| *o + e.blocks() * BLOCK_SIZE_U64)
                .max()
                .unwrap_or(pos);
            if covered_until > pos {
                pos = covered_until;
                continue;
            }
            // No extent covers `pos`, and extents are block-aligned, so the blocks from
            // the one holding `pos` to the one holding `hole_end - 1` are all unmapped.
            let hole_end = next_data.min(end);
            let first = pos / BLOCK_SIZE_U64;
            let last = hole_end.div_ceil(BLOCK_SIZE_U64).min(first + ZERO_CHUNK_BLOCKS);
            self.map_zero_blocks(inode, first, last - first)?;
            pos = last * BLOCK_SIZE_U64;
        }
        Ok(())
    }

    /// Maps `count` zeroed blocks at file block `first` (all unmapped).
    fn map_zero_blocks(&mut self, inode: &mut Inode, first: u64, count: u64) -> Result<()> {
        let goal = self.goal_at(inode.ino, first)?;
        let runs = self.take_copies(inode.ino, goal, count)?;
        let zero_csum = crate::engine::checksum::crc32c(&[0u8; BLOCK_SIZE]);
        let mut done = 0;
        for (start, twin, got) in runs {
            for at in [start, twin].into_iter().filter(|&b| b != 0) {
                self.pager.write_zero_blocks(at, got)?;
                self.refs_add(at, got)?;
                self.charge(got);
            }
            self.map_extent(inode.ino, first + done, start, twin, vec![zero_csum; got as usize])?;
            done += got;
        }
        inode.blocks += count;
        Ok(())
    }
}

/// Blocks one step of `allocate_data` maps (32 MiB): bounds the runs held at once.
const ZERO_CHUNK_BLOCKS: u64 = 8192;
