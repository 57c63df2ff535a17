//! Space accounting: what an operation may take, and freeing large files in steps.
//!
//! A commit writes every node the transaction dirtied to a fresh block, so a commit that
//! finds no free block cannot complete and the store turns read-only. Two invariants keep
//! that from happening and keep a full file system emptiable:
//!
//! - **An operation never takes free space below its floor plus what commits need.**
//!   `reserve` checks, before anything changes, that the blocks the operation will
//!   allocate (data and an estimate of the nodes it dirties) fit above its floor: `COMMIT_BLOCKS`
//!   for deletions, `kept_back` (a reserve of 0.5 % of the image) for everything else.
//!   Data allocation checks again with the runs it actually got (`data_fits`), because a
//!   fragmented free space makes one item per block; a call that would cross the floor
//!   fails with ENOSPC before it changes anything.
//! - **A deletion dirties a bounded number of nodes.** An inode with more than
//!   `STEP_EXTENTS` extents is not destroyed in one transaction: it goes on the orphan list
//!   (so a crash resumes the work at the next open) and its extents are freed
//!   `STEP_EXTENTS` at a time, each step committed before the next needs space, from
//!   `tick` in the background and from `reserve` at once when an operation needs the
//!   space. Its blocks count as free in `statfs` from the moment of the deletion.
//!
//! Tests: tests/space.rs fills images in several ways (one huge fallocate, fragmented
//! files, checkerboard free space, xattrs), then commits, deletes everything and reuses it.

use std::collections::VecDeque;

use crate::engine::key::Key;
use crate::engine::node::LEAF_ITEM_BYTES;
use crate::error::{Error, Result};
use crate::fs::extent::{extent_key, Extent};
use crate::fs::keys::{kind, ORPHAN_OBJECTID};
use crate::limits::{BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::store::Store;

/// Blocks an operation leaves free beyond its own for the commit that follows it: the
/// root and refcount trees' paths, and the nodes of one reclaim step.
pub(crate) const COMMIT_BLOCKS: u64 = 64;

/// Extents one reclaim step frees: at most this many extent and refcount items change,
/// so a step dirties at most about `2 * STEP_EXTENTS` leaves plus their paths.
const STEP_EXTENTS: usize = 16;

/// Nodes one reclaim step may dirty, paths included: within `COMMIT_BLOCKS`, so a step
/// fits wherever a deletion does.
const STEP_NODES: u64 = 2 * STEP_EXTENTS as u64 + 16;
const _: () = assert!(STEP_NODES + 16 <= COMMIT_BLOCKS);

/// Blocks a non-deleting operation leaves free: room for commits, and a reserve (0.5 % of
/// the image, 16 to 4,096 blocks) that lets a full file system still be emptied.
pub(crate) fn kept_back(total_blocks: u64) -> u64 {
    (total_blocks / 200).clamp(16, 4096) + COMMIT_BLOCKS
}

/// Nodes that mapping `data_blocks` new blocks is expected to dirty: extents of many
/// blocks cost ~4 bytes a block in half-full leaves, plus the paths. `data_fits` checks
/// the real runs, so this only has to be right for the usual, contiguous case.
pub(crate) fn meta_estimate(data_blocks: u64) -> u64 {
    if data_blocks == 0 {
        0
    } else {
        data_blocks / 256 + 8
    }
}

/// Leaves that the items mapping `runs` (one extent and one refcount item each) fill when
/// half full, plus the nodes on the paths to them.
fn meta_for_runs(runs: &[(u64, u64)]) -> u64 {
    let bytes: u64 = runs.iter().map(|&(_, len)| 2 * LEAF_ITEM_BYTES as u64 + 17 + 4 * len).sum();
    bytes.div_ceil(BLOCK_SIZE as u64 / 2) + 8
}

/// Space state of an open store, in memory only.
#[derive(Debug, Default)]
pub(crate) struct Space {
    /// Free blocks the running operation must leave (set by `reserve`).
    floor: u64,
    /// Inodes with no link and no handle whose data is being freed in steps; each is on
    /// the orphan list on disk.
    doomed: VecDeque<u64>,
    /// Blocks those inodes still hold.
    doomed_blocks: u64,
}

impl Space {
    /// Blocks that deleted files still hold and will give back.
    pub(crate) fn doomed_blocks(&self) -> u64 {
        self.doomed_blocks
    }

    /// True if inodes of dataset `d` are being freed.
    pub(crate) fn doomed_in(&self, d: u64) -> bool {
        self.doomed.iter().any(|&ino| crate::datasets::dataset_of(ino) == d)
    }

    /// True if `ino` is being freed (no longer openable).
    pub(crate) fn is_doomed(&self, ino: u64) -> bool {
        self.doomed.contains(&ino)
    }
}

impl Store {
    /// Makes sure an operation needing `data_blocks` new blocks can complete and commit.
    /// Deletions (`for_delete`) may use the last reserve so a full disk can be emptied.
    pub(crate) fn reserve(&mut self, data_blocks: u64, for_delete: bool) -> Result<()> {
        self.pager.check_writable()?;
        if self.is_snapshot(self.active) {
            return Err(Error::ReadOnly("a snapshot".into()));
        }
        // (A dataset with `copies=2` writes each block twice.)
        let data_blocks = data_blocks * u64::from(self.data_copies());
        if !for_delete && data_blocks > 0 {
            self.check_quota(data_blocks)?;
        }
        let floor = if for_delete { self.nodes(COMMIT_BLOCKS) } else { self.kept_back() };
        self.space.floor = floor;
        // (`meta_estimate` is four times what contiguous data's leaves take, so it covers
        // them in two copies too: counting it once keeps this in step with `statfs`'s
        // available blocks, all of which one write must be able to take. `data_fits`
        // checks the real runs, every node in every copy.)
        let need = |s: &Store| data_blocks + meta_estimate(data_blocks) + s.nodes(s.pager.dirty_nodes() as u64) + floor;
        // Freed blocks come back only after commits; two make everything pending reusable.
        let mut idle_commits = 0;
        while self.pager.alloc.free_blocks() < need(self) {
            if !self.space.doomed.is_empty() && self.reclaim_some(usize::MAX)? {
                idle_commits = 0;
            } else if idle_commits < 2 && (self.pager.pending_free_blocks() > 0 || self.is_dirty()) {
                self.commit()?;
                idle_commits += 1;
            } else {
                return Err(Error::NoSpace(format!(
                    "{} blocks free, {} needed",
                    self.pager.alloc.free_blocks(),
                    need(self)
                )));
            }
        }
        Ok(())
    }

    /// True if data runs already taken from the allocator (`runs`) leave room above the
    /// running operation's floor for the nodes mapping them dirties and for the commit.
    pub(crate) fn data_fits(&self, runs: &[(u64, u64)]) -> bool {
        let need = self.space.floor.max(self.nodes(COMMIT_BLOCKS))
            + self.nodes(self.pager.dirty_nodes() as u64 + meta_for_runs(runs));
        self.pager.alloc.free_blocks() >= need
    }

    /// Blocks that `n` nodes take: each is written in every metadata copy.
    pub(crate) fn nodes(&self, n: u64) -> u64 {
        n * u64::from(self.pager.copies())
    }

    /// The reserve a non-deleting operation leaves free, its commit's nodes counted in
    /// every metadata copy.
    fn kept_back(&self) -> u64 {
        let total = self.sb.total_blocks;
        kept_back(total) + self.nodes(COMMIT_BLOCKS) - COMMIT_BLOCKS
    }

    /// Blocks `statfs` reports available: what a write may take, its nodes included.
    pub(crate) fn avail_blocks(&self, free: u64) -> u64 {
        let left = free.saturating_sub(self.kept_back() + 8);
        // What mapping the rest as data takes: its checksums and extent and refcount
        // items in two copies, and the nodes a commit's copy-on-write moves, come to about
        // one block in 250 for contiguous data (measured: 200 blocks for 49,152). One in
        // 128 is kept for them, so that a fallocate of all that is available succeeds,
        // in one op or in steps (`crest_proto::MAX_FALLOCATE_STEP`), each of which
        // `reserve` estimates whole; and so are the nodes already dirty and the paths to
        // the new items (`meta_for_runs`), in every copy.
        let nodes = self.nodes(self.pager.dirty_nodes() as u64 + 16);
        (left - left.div_ceil(128)).saturating_sub(nodes)
    }

    /// Destroys `ino` (no link, no handle) later and in steps if it has many extents;
    /// returns false if it is small enough to destroy at once.
    pub(crate) fn doom_if_large(&mut self, ino: u64, blocks: u64) -> Result<bool> {
        if self.space.is_doomed(ino) {
            return Ok(true);
        }
        if blocks <= STEP_EXTENTS as u64 || self.extent_items(ino, STEP_EXTENTS + 1)?.len() <= STEP_EXTENTS {
            return Ok(false);
        }
        self.fs.insert(&mut self.pager, Key::new(ORPHAN_OBJECTID, kind::ORPHAN, ino), Vec::new())?;
        self.space.doomed.push_back(ino);
        self.space.doomed_blocks += blocks;
        Ok(true)
    }

    /// The first `limit` extent items of `ino`: (file offset, block run) pairs.
    fn extent_items(&mut self, ino: u64, limit: usize) -> Result<Vec<(u64, u64)>> {
        let total = self.pager.total_blocks();
        let items = self.fs.collect(&mut self.pager, &extent_key(ino, 0), &extent_key(ino, u64::MAX), limit)?;
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            if let Extent::Regular { csums, .. } = Extent::decode(k, &v, total)? {
                out.push((k.offset, csums.len() as u64));
            }
        }
        Ok(out)
    }

    /// Frees doomed inodes' extents step by step, committing whenever the next step might
    /// not fit, until `max_steps` steps ran or nothing is doomed. Returns whether it did
    /// anything (freed blocks become allocatable two commits later).
    pub(crate) fn reclaim_some(&mut self, max_steps: usize) -> Result<bool> {
        let mut steps = 0;
        while steps < max_steps && !self.space.doomed.is_empty() {
            let room = self.pager.alloc.free_blocks();
            if room < self.nodes(self.pager.dirty_nodes() as u64 + COMMIT_BLOCKS) {
                if !self.is_dirty() && self.pager.pending_free_blocks() == 0 {
                    break; // nothing a commit could give back
                }
                self.commit()?;
                if steps > 0 {
                    // Let the caller look again: what was freed returns one commit later.
                    self.commit()?;
                    return Ok(true);
                }
                continue;
            }
            self.reclaim_step()?;
            steps += 1;
        }
        if steps > 0 {
            self.commit()?;
        }
        Ok(steps > 0)
    }

    /// Frees up to `STEP_EXTENTS` extents of the first doomed inode, or destroys what is
    /// left of it when it has none.
    fn reclaim_step(&mut self) -> Result<()> {
        let Some(&ino) = self.space.doomed.front() else { return Ok(()) };
        self.enter(ino)?;
        let runs = self.extent_items(ino, STEP_EXTENTS)?;
        let mut inode = self.getattr(ino)?;
        let Some(&(last_off, last_len)) = runs.last() else {
            self.space.doomed.pop_front();
            self.space.doomed_blocks = self.space.doomed_blocks.saturating_sub(inode.blocks);
            return self.destroy_inode_now(&inode);
        };
        let first = runs[0].0 / BLOCK_SIZE_U64;
        let end = last_off / BLOCK_SIZE_U64 + last_len;
        let freed = self.unmap_blocks(ino, first, end)?;
        inode.blocks = inode.blocks.saturating_sub(freed);
        self.space.doomed_blocks = self.space.doomed_blocks.saturating_sub(freed);
        self.put_inode(&inode)
    }
}
