//! The pager owns the disk, the cache of verified clean nodes, the arena of nodes dirtied
//! by the running transaction, and the block allocator. It is where copy-on-write happens
//! and where a commit turns dirty nodes into blocks.
//!
//! Invariants:
//! - a node in the cache was verified against the pointer that led to it, and the block
//!   it came from is allocated; a block is dropped from the cache when it is freed;
//! - a committed block is never overwritten: dirty nodes get fresh blocks at commit;
//! - a block freed in transaction `T` is handed back to the allocator only after the
//!   commit of `T + 1` is durable, so both superblock copies always describe intact trees;
//! - after any failed write or flush the pager is poisoned and refuses further writes;
//! - with two metadata copies every node is written to two blocks half an image apart
//!   (the parent's pointer names both); a copy that fails to read or verify is replaced by
//!   the other, which is then written over the bad one.

use std::collections::HashMap;
use std::sync::Arc;

use crate::disk::Disk;
use crate::disk::SharedReader;
use crate::engine::alloc::Allocator;
use crate::engine::checksum::crc32c;
use crate::engine::node::{BlockPtr, Body, ChildPtr, Node, NodeRef};
use crate::engine::pins::{Pins, ReadPin, Runs};
use crate::engine::superblock::MANIFEST_MAX_BLOCKS;
use crate::error::{Error, Result};
use crate::limits::{BLOCK_SIZE, BLOCK_SIZE_U64, NODE_CACHE_ENTRIES};

/// Freed runs up to this long are offered to `alloc_node` a block at a time.
const RECYCLE_RUN: u64 = 4;
/// Freed blocks remembered for `alloc_node`, per half of the image (8 bytes each).
const RECYCLE_MAX: usize = 8_192;

/// Where the half of an image that second copies of nodes go to starts.
fn twin_half(total_blocks: u64) -> u64 {
    crate::limits::RESERVED_BLOCKS + total_blocks / 2
}

/// The node store under every tree of one image.
pub struct Pager {
    disk: Box<dyn Disk>,
    fsid: [u8; 16],
    total_blocks: u64,
    cache: HashMap<u64, (u64, NodeRef)>,
    dirty: Vec<NodeRef>,
    /// Free-space bitmaps (derived from the trees at open).
    pub(crate) alloc: Allocator,
    freed_this_txn: Vec<(u64, u64)>,
    freed_prev_txn: Vec<(u64, u64)>,
    /// Freed runs due back to the allocator that a read running elsewhere still reads
    /// (`engine/pins.rs`).
    held: Runs,
    pins: Arc<Pins>,
    poisoned: Option<String>,
    meta_goal: u64,
    /// Where the next second copy goes (half an image away from `meta_goal`).
    twin_goal: u64,
    /// Copies of each node: 1 or 2.
    copies: u8,
    /// Single blocks `finish_commit` gave back, newest last: a node's (lower half of the
    /// image) and, with two copies, a twin's (upper half). `alloc_node` takes these before
    /// searching from its goal, so that a steady run of small commits rewrites blocks the
    /// image file already holds: a block written for the first time makes the file system
    /// under an image file allocate it, and its journal commit doubles what the commit's
    /// flush costs (tests/recycle.rs).
    recycled: [Vec<u64>; 2],
    /// Node copies found bad and rewritten from their twin since open.
    pub(crate) repaired: u64,
    /// Whether a bad copy is rewritten from its twin (not by fsck, which only reads).
    repairs: bool,
    /// Bytes written to the disk since open (nodes, data, superblocks).
    pub(crate) bytes_written: u64,
    /// By tree owner: the newest generation a snapshot of that tree holds. A committed
    /// node of the tree born at or before it is shared with the snapshot: copying it
    /// frees nothing, and the block goes to `kept` instead.
    pub(crate) keep: HashMap<u64, u64>,
    /// (owner, block, birth) of the shared nodes the running transaction stopped using.
    pub(crate) kept: Vec<(u64, u64, u64)>,
    /// The data blocks the running transaction wrote, with the CRC-32C of what each holds
    /// now, while they fit a superblock's manifest (`None` once they do not, or after a
    /// write the manifest cannot describe): what a one-flush commit lists.
    tx_data: Option<std::collections::BTreeMap<u64, u32>>,
    /// Whether nodes read are kept in `cache` (not during open's walk of every internal
    /// node: the cache would keep the whole upper tree of a big image, most of it unused).
    caching: bool,
}

impl Pager {
    /// A pager over `disk` for the file system `fsid`.
    pub fn new(disk: Box<dyn Disk>, fsid: [u8; 16], total_blocks: u64, alloc: Allocator) -> Pager {
        Pager {
            disk,
            fsid,
            total_blocks,
            cache: HashMap::new(),
            dirty: Vec::new(),
            alloc,
            freed_this_txn: Vec::new(),
            freed_prev_txn: Vec::new(),
            held: Vec::new(),
            pins: Default::default(),
            poisoned: None,
            meta_goal: crate::limits::RESERVED_BLOCKS,
            twin_goal: twin_half(total_blocks),
            copies: 1,
            recycled: [Vec::new(), Vec::new()],
            repaired: 0,
            repairs: true,
            bytes_written: 0,
            keep: HashMap::new(),
            kept: Vec::new(),
            tx_data: Some(Default::default()),
            caching: true,
        }
    }

    /// Whether nodes read from now on are cached (see `caching`).
    pub(crate) fn set_caching(&mut self, on: bool) {
        self.caching = on;
    }

    /// The file system id every node carries.
    pub fn fsid(&self) -> &[u8; 16] {
        &self.fsid
    }

    /// Writes every node from now on in `copies` copies (1 or 2).
    pub fn set_copies(&mut self, copies: u8) {
        self.copies = copies.clamp(1, 2);
    }

    /// Lets reads rewrite a bad node copy from its twin (the default) or not.
    pub fn set_repairs(&mut self, on: bool) {
        self.repairs = on;
    }

    /// Copies of each node this pager writes.
    pub fn copies(&self) -> u8 {
        self.copies
    }

    /// Blocks in the file system.
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// Direct access to the disk, for reads.
    pub fn disk(&self) -> &dyn Disk {
        &*self.disk
    }

    /// Hands the disk back (closing the store).
    pub fn into_disk(self) -> Box<dyn Disk> {
        self.disk
    }

    /// Number of nodes dirtied in this transaction (an upper bound on blocks a commit needs).
    pub fn dirty_nodes(&self) -> usize {
        self.dirty.len()
    }

    /// Blocks waiting to become free after the next commits.
    pub fn pending_free_blocks(&self) -> u64 {
        self.freed_this_txn.iter().chain(&self.freed_prev_txn).chain(&self.held).map(|r| r.1).sum()
    }

    /// Why the store refuses to write, if it does.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn poison<T>(&mut self, op: &'static str, offset: u64, e: std::io::Error) -> Result<T> {
        let why = format!("{op} at byte {offset} failed: {e}");
        tracing::error!(%why, "store poisoned");
        self.poisoned = Some(why);
        Err(Error::Io { op, offset, source: e })
    }

    /// A reader for `nblocks` blocks at `block` that another thread may use, once the
    /// writes to them issued so far have landed (`None` where the disk hands out none).
    /// What it reads is safe from reuse only under a [`Pager::pin`] of them taken now.
    pub fn shared_reader(&self, block: u64, nblocks: u64) -> Result<Option<SharedReader>> {
        let offset = block * BLOCK_SIZE_U64;
        let len = usize::try_from(nblocks * BLOCK_SIZE_U64).unwrap_or(usize::MAX);
        self.disk.reader(offset, len).map_err(|source| Error::Io { op: "read", offset, source })
    }

    /// Keeps the blocks of `runs` (`(start, len)`) from reuse until the pin drops
    /// (`engine/pins.rs`).
    pub fn pin(&self, runs: Runs) -> ReadPin {
        self.pins.pin(runs)
    }

    /// Reads `buf.len()` bytes at block `block`.
    pub fn read_blocks(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let offset = block * BLOCK_SIZE_U64;
        self.disk.read_at(offset, buf).map_err(|source| Error::Io { op: "read", offset, source })
    }

    /// Writes data blocks directly (file data is written before the commit that refers to it).
    pub fn write_blocks(&mut self, block: u64, buf: &[u8]) -> Result<()> {
        self.check_writable()?;
        let offset = block * BLOCK_SIZE_U64;
        match self.disk.write_at(offset, buf) {
            Ok(()) => {
                self.bytes_written += buf.len() as u64;
                self.note_data(block, buf);
                Ok(())
            }
            Err(e) => self.poison("write", offset, e),
        }
    }

    /// Adds a data write to the transaction's manifest while it fits.
    fn note_data(&mut self, block: u64, buf: &[u8]) {
        let Some(listed) = &mut self.tx_data else { return };
        let n = buf.len() / BLOCK_SIZE;
        if !buf.len().is_multiple_of(BLOCK_SIZE) || listed.len() + n > MANIFEST_MAX_BLOCKS {
            self.tx_data = None;
            return;
        }
        for (i, b) in buf.chunks(BLOCK_SIZE).enumerate() {
            listed.insert(block + i as u64, crc32c(b));
        }
    }

    /// Makes the running transaction commit with two flushes (see `Store::open`).
    pub(crate) fn flush_twice_next(&mut self) {
        self.tx_data = None;
    }

    /// The data blocks this transaction wrote and their checksums, if they fit a manifest.
    pub(crate) fn manifest(&self) -> Option<Vec<(u64, u32)>> {
        self.tx_data.as_ref().map(|m| m.iter().map(|(&b, &c)| (b, c)).collect())
    }

    /// Makes `count` blocks from `block` read as zeros.
    pub fn write_zero_blocks(&mut self, block: u64, count: u64) -> Result<()> {
        self.check_writable()?;
        let offset = block * BLOCK_SIZE_U64;
        // (Zeroed ranges can be long: such a transaction commits with two flushes.)
        self.tx_data = None;
        match self.disk.write_zeroes(offset, count * BLOCK_SIZE_U64) {
            Ok(()) => Ok(()),
            Err(e) => self.poison("write", offset, e),
        }
    }

    /// Writes a batch sorted by offset, then nothing else.
    pub fn write_batch(&mut self, mut writes: Vec<(u64, Vec<u8>)>) -> Result<()> {
        self.check_writable()?;
        writes.sort_by_key(|w| w.0);
        let refs: Vec<(u64, &[u8])> = writes.iter().map(|(b, v)| (b * BLOCK_SIZE_U64, v.as_slice())).collect();
        match self.disk.write_batch(&refs) {
            Ok(()) => {
                self.bytes_written += writes.iter().map(|w| w.1.len() as u64).sum::<u64>();
                Ok(())
            }
            Err(e) => {
                let at = writes.first().map_or(0, |w| w.0 * BLOCK_SIZE_U64);
                self.poison("write", at, e)
            }
        }
    }

    /// Writes raw byte ranges at byte offsets (superblock slots and mirrors) now, in one
    /// batch: a small batch goes straight to the file, where a queued write would make the
    /// flush after it wait for the ring.
    pub fn write_raw(&mut self, writes: &[(u64, &[u8])]) -> Result<()> {
        self.check_writable()?;
        match self.disk.write_batch(writes) {
            Ok(()) => {
                self.bytes_written += writes.iter().map(|w| w.1.len() as u64).sum::<u64>();
                Ok(())
            }
            Err(e) => self.poison("write", writes.first().map_or(0, |w| w.0), e),
        }
    }

    /// Writes `writes` (byte offset, bytes) and flushes, even in a poisoned store, ignoring
    /// failures: to put back what a failed commit may have left (`Store::commit`).
    pub(crate) fn restore_raw(&mut self, writes: &[(u64, Vec<u8>)]) {
        let refs: Vec<(u64, &[u8])> = writes.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        let restored = self.disk.write_batch(&refs).and_then(|()| self.disk.flush());
        if let Err(e) = restored {
            tracing::warn!("putting the last good superblock back after a failed commit: {e}");
        }
    }

    /// Makes every earlier write durable.
    pub fn flush(&mut self) -> Result<()> {
        self.check_writable()?;
        match self.disk.flush() {
            Ok(()) => Ok(()),
            Err(e) => self.poison("flush", 0, e),
        }
    }

    /// Reads and verifies the node `ptr` names (a dirty node is returned as is).
    pub fn node(&mut self, ptr: ChildPtr, owner: u64, level: u8) -> Result<NodeRef> {
        match ptr {
            ChildPtr::Dirty(id) => Ok(self.dirty[id as usize].clone()),
            ChildPtr::Disk { block, twin, generation } => {
                self.read_node(&BlockPtr { block, twin, generation, level }, owner)
            }
        }
    }

    /// Reads and verifies a committed node.
    pub fn read_node(&mut self, ptr: &BlockPtr, owner: u64) -> Result<NodeRef> {
        if let Some((generation, node)) = self.cache.get(&ptr.block) {
            if *generation == ptr.generation && node.owner == owner && node.level == ptr.level {
                return Ok(node.clone());
            }
            // Same block, other expectations: fall through and let the read report it.
        }
        if ptr.block < crate::limits::RESERVED_BLOCKS || ptr.block >= self.total_blocks {
            return Err(Error::corrupt(
                "node",
                ptr.block,
                format!(
                    "pointer outside the usable area (0..{} reserved, {} blocks)",
                    crate::limits::RESERVED_BLOCKS,
                    self.total_blocks
                ),
            ));
        }
        let node = match self.read_copy(ptr, ptr.block, owner) {
            Ok((node, _)) => node,
            Err(e) if ptr.twin == 0 || !(e.is_corruption() || matches!(e, Error::Io { .. })) => return Err(e),
            Err(e) => match self.read_copy(ptr, ptr.twin, owner) {
                Ok((node, good)) => {
                    tracing::warn!(block = ptr.block, copy = ptr.twin, "node copy bad ({e}); using its twin");
                    self.rewrite_copy(ptr.block, &good);
                    node
                }
                Err(_) => return Err(e),
            },
        };
        let node = Arc::new(node);
        if self.caching {
            self.cache_insert(ptr.block, ptr.generation, node.clone());
        }
        Ok(node)
    }

    /// Reads one copy of the node `ptr` names (at `at`: its block or its twin) and
    /// verifies it against the pointer; returns it with its bytes.
    pub(crate) fn read_copy(&self, ptr: &BlockPtr, at: u64, owner: u64) -> Result<(Node, Vec<u8>)> {
        if at < crate::limits::RESERVED_BLOCKS || at >= self.total_blocks {
            return Err(Error::corrupt("node", at, "copy outside the usable area"));
        }
        let mut buf = vec![0u8; crate::limits::BLOCK_SIZE];
        self.read_blocks(at, &mut buf)?;
        let node = Node::decode(&buf, &self.fsid, ptr, owner, self.total_blocks)?;
        Ok((node, buf))
    }

    /// Writes a good copy's bytes over a bad copy of the same committed node. Safe at any
    /// time: the bytes are the ones the block should hold, so a torn write leaves it as bad
    /// as it was and the twin still good. A store that refuses writes leaves it be.
    pub(crate) fn rewrite_copy(&mut self, at: u64, good: &[u8]) -> bool {
        self.rewrite_raw(at * BLOCK_SIZE_U64, good)
    }

    /// As `rewrite_copy`, at a byte offset (a superblock's slot or mirror).
    pub(crate) fn rewrite_raw(&mut self, offset: u64, good: &[u8]) -> bool {
        let at = offset / BLOCK_SIZE_U64;
        if self.poisoned.is_some() || !self.repairs {
            return false;
        }
        match self.disk.write_at(offset, good) {
            Ok(()) => {
                self.bytes_written += good.len() as u64;
                self.repaired += 1;
                true
            }
            Err(e) => {
                tracing::warn!(block = at, "rewriting a bad node copy failed: {e}");
                false
            }
        }
    }

    fn cache_insert(&mut self, block: u64, generation: u64, node: NodeRef) {
        if self.cache.len() >= NODE_CACHE_ENTRIES {
            // Cheap eviction: drop leaves first, keeping interior nodes that every lookup needs.
            self.cache.retain(|_, (_, n)| n.level > 0);
            if self.cache.len() >= NODE_CACHE_ENTRIES / 2 {
                self.cache.clear();
            }
        }
        self.cache.insert(block, (generation, node));
    }

    /// Makes `ptr`'s node writable in this transaction and returns its arena index.
    pub fn cow(&mut self, ptr: ChildPtr, owner: u64, level: u8) -> Result<u32> {
        match ptr {
            ChildPtr::Dirty(id) => Ok(id),
            ChildPtr::Disk { block, twin, generation } => {
                let node = self.read_node(&BlockPtr { block, twin, generation, level }, owner)?;
                let shared = self.keep.get(&owner).is_some_and(|&g| generation <= g);
                for b in [block, twin].into_iter().filter(|&b| b != 0) {
                    if shared {
                        self.kept.push((owner, b, generation));
                    } else {
                        self.free_later(b, 1);
                    }
                }
                Ok(self.push_dirty(Node::clone(&node)))
            }
        }
    }

    /// Adds a new node to the arena.
    pub fn push_dirty(&mut self, node: Node) -> u32 {
        self.dirty.push(Arc::new(node));
        (self.dirty.len() - 1) as u32
    }

    /// Mutable access to a dirty node.
    pub fn dirty_mut(&mut self, id: u32) -> &mut Node {
        Arc::make_mut(&mut self.dirty[id as usize])
    }

    /// Shared access to a dirty node.
    pub fn dirty_ref(&self, id: u32) -> &Node {
        &self.dirty[id as usize]
    }

    /// Records blocks that the running transaction stops referencing.
    pub fn free_later(&mut self, start: u64, len: u64) {
        debug_assert!(self.alloc.is_used(start), "freeing free block {start}");
        self.freed_this_txn.push((start, len));
    }

    /// Keeps blocks that only an older generation still reaches out of the allocator until
    /// the next commit is durable (blocks already in use are left alone). Used at open for
    /// the other superblock copy, which the next commit overwrites.
    pub fn hold_until_next_commit(&mut self, start: u64, len: u64) {
        let end = start.saturating_add(len).min(self.total_blocks);
        let mut run: Option<(u64, u64)> = None;
        for b in start..end {
            if self.alloc.is_used(b) {
                if let Some(r) = run.take() {
                    self.freed_prev_txn.push(r);
                }
                continue;
            }
            self.alloc.mark_used(b, 1);
            run = match run {
                Some((s, l)) if s + l == b => Some((s, l + 1)),
                Some(r) => {
                    self.freed_prev_txn.push(r);
                    Some((b, 1))
                }
                None => Some((b, 1)),
            };
        }
        if let Some(r) = run {
            self.freed_prev_txn.push(r);
        }
    }

    /// Allocates `len` contiguous blocks near `goal`.
    pub fn alloc_blocks(&mut self, goal: u64, len: u64) -> Option<u64> {
        self.alloc.alloc(goal, len)
    }

    /// Allocates up to `max_len` contiguous blocks near `goal`.
    pub fn alloc_upto(&mut self, goal: u64, max_len: u64) -> Option<(u64, u64)> {
        self.alloc.alloc_upto(goal, max_len)
    }

    /// Writes every dirty node reachable from `root` (children first) and returns the
    /// root's new on-disk pointer. Writes are queued in `out`, not yet issued.
    pub fn write_tree(
        &mut self,
        root: ChildPtr,
        level: u8,
        generation: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<BlockPtr> {
        let block = match root {
            ChildPtr::Disk { block, twin, generation } => return Ok(BlockPtr { block, twin, generation, level }),
            ChildPtr::Dirty(id) => {
                let mut node = Node::clone(self.dirty_ref(id));
                if let Body::Internal(children) = &mut node.body {
                    for child in children.iter_mut() {
                        let p = self.write_tree(child.1, level - 1, generation, out)?;
                        child.1 = ChildPtr::Disk { block: p.block, twin: p.twin, generation: p.generation };
                    }
                }
                let block = self.alloc_node(false)?;
                let bytes = node.encode(&self.fsid, block, generation);
                let twin = if self.copies == 2 { self.alloc_node(true)? } else { 0 };
                if twin != 0 {
                    out.push((twin, bytes.clone()));
                }
                out.push((block, bytes));
                self.cache_insert(block, generation, Arc::new(node));
                (block, twin)
            }
        };
        Ok(BlockPtr { block: block.0, twin: block.1, generation, level })
    }

    /// A block for a node (or, `twin`, for its second copy, in the other half of the image
    /// so that one bad region rarely takes both); a commit that finds none cannot complete.
    fn alloc_node(&mut self, twin: bool) -> Result<u64> {
        // (A recycled block a data extent took meanwhile is skipped.)
        while let Some(b) = self.recycled[usize::from(twin)].pop() {
            if !self.alloc.is_used(b) {
                self.alloc.mark_used(b, 1);
                return Ok(b);
            }
        }
        let goal = if twin { self.twin_goal } else { self.meta_goal };
        let Some(b) = self.alloc.alloc(goal, 1) else {
            let why = "no free block for a tree node during commit".to_string();
            self.poisoned = Some(why.clone());
            return Err(Error::NoSpace(why));
        };
        if twin {
            self.twin_goal = b + 1;
        } else {
            self.meta_goal = b + 1;
        }
        Ok(b)
    }

    /// Offers a freed block to `alloc_node` (see `recycled`).
    fn recycle(&mut self, block: u64) {
        let upper = self.copies == 2 && block >= twin_half(self.total_blocks);
        let list = &mut self.recycled[usize::from(upper)];
        if list.len() >= RECYCLE_MAX {
            // The oldest half goes: what is freed now is what small commits will want.
            list.drain(..RECYCLE_MAX / 2);
        }
        list.push(block);
    }

    /// Ends a transaction after its superblock is durable: the arena is emptied and blocks
    /// freed one transaction earlier become allocatable.
    pub fn finish_commit(&mut self) {
        self.dirty.clear();
        // What a read running elsewhere still reads waits for a later commit.
        let mut due = std::mem::take(&mut self.held);
        due.append(&mut self.freed_prev_txn);
        let (release, held) = self.pins.split(due);
        self.held = held;
        for (start, len) in release {
            for b in start..start + len {
                self.cache.remove(&b);
            }
            self.alloc.mark_free(start, len);
            // Nodes come back a block at a time; longer runs are left whole for data.
            if len <= RECYCLE_RUN {
                for b in start..start + len {
                    self.recycle(b);
                }
            }
        }
        self.freed_prev_txn = std::mem::take(&mut self.freed_this_txn);
        self.tx_data = Some(Default::default());
    }
}
