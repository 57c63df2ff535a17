//! Copy-on-write B-trees of items over the pager. A modification copies the path from the
//! root to the leaf into the transaction's arena (once per transaction: a node already
//! dirty is changed in place), so the committed tree stays intact until the superblock
//! moves to the new root.
//!
//! Invariants (checked by `check::fsck` on every tree):
//! - keys strictly increase within a node and across the whole tree;
//! - child `i` of an internal node holds keys in `[key_i, key_{i+1})`;
//! - children sit exactly one level below their parent; all leaves are at level 0;
//! - no node but the root is empty; every node fits in one block.

use crate::engine::key::Key;
use crate::engine::node::{BlockPtr, Body, ChildPtr, Node, INTERNAL_CAPACITY, LEAF_SPACE};
use crate::engine::pager::Pager;
use crate::error::{Error, Result};
use crate::limits::MAX_ITEM_BYTES;

/// A tree handle: its owner id and where its root is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tree {
    /// Tree id, written in every node's header.
    pub owner: u64,
    /// Root pointer.
    pub root: ChildPtr,
    /// Level of the root (0 when the root is a leaf).
    pub level: u8,
}

impl Tree {
    /// A tree whose root is committed at `ptr`.
    pub fn on_disk(owner: u64, ptr: BlockPtr) -> Tree {
        Tree { owner, root: ptr.child(), level: ptr.level }
    }

    /// A new, empty tree (one dirty empty leaf).
    pub fn create(pager: &mut Pager, owner: u64) -> Tree {
        let id = pager.push_dirty(Node::empty_leaf(owner));
        Tree { owner, root: ChildPtr::Dirty(id), level: 0 }
    }

    /// True when the tree has changes not yet committed.
    pub fn is_dirty(&self) -> bool {
        matches!(self.root, ChildPtr::Dirty(_))
    }

    /// The value stored under `key`.
    pub fn get(&self, pager: &mut Pager, key: &Key) -> Result<Option<Vec<u8>>> {
        let mut ptr = self.root;
        let mut level = self.level;
        loop {
            let node = pager.node(ptr, self.owner, level)?;
            match &node.body {
                Body::Leaf(items) => {
                    return Ok(items.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| items[i].1.clone()));
                }
                Body::Internal(children) => {
                    ptr = children[child_index(children, key)].1;
                    level -= 1;
                }
            }
        }
    }

    /// Calls `visit` on every item with `lo <= key <= hi` in key order until it returns false.
    pub fn range(
        &self,
        pager: &mut Pager,
        lo: &Key,
        hi: &Key,
        visit: &mut dyn FnMut(&Key, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        if lo <= hi {
            range_rec(pager, self.owner, self.root, self.level, lo, hi, visit)?;
        }
        Ok(())
    }

    /// The key range the leaf that would hold `key` is responsible for: `lo` inclusive,
    /// `hi` exclusive (`None`: up to the end of the key space). Every key in the range
    /// lives in that one leaf, so a scan of it reads one node.
    pub fn leaf_bounds(&self, pager: &mut Pager, key: &Key) -> Result<(Key, Option<Key>)> {
        let (mut lo, mut hi) = (Key::MIN, None);
        let mut ptr = self.root;
        let mut level = self.level;
        loop {
            let node = pager.node(ptr, self.owner, level)?;
            match &node.body {
                Body::Leaf(_) => return Ok((lo, hi)),
                Body::Internal(children) => {
                    let i = child_index(children, key);
                    // Child 0 also holds whatever sorts below its separator.
                    if i > 0 {
                        lo = lo.max(children[i].0);
                    }
                    if let Some((next, _)) = children.get(i + 1) {
                        hi = Some(hi.map_or(*next, |h: Key| h.min(*next)));
                    }
                    ptr = children[i].1;
                    level -= 1;
                }
            }
        }
    }

    /// Collects up to `limit` items with `lo <= key <= hi` from the nodes `skip` does not
    /// rule out: a committed subtree `skip` is true for is not read at all. With `skip`
    /// true for what another tree shares, this is what the two trees do not share (a send
    /// stream's diff, `send.rs`), read in time proportional to that.
    pub fn collect_unshared(
        &self,
        pager: &mut Pager,
        lo: &Key,
        hi: &Key,
        skip: &dyn Fn(&BlockPtr) -> bool,
        limit: usize,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 || lo > hi || self.root.on_disk(self.level).is_some_and(|p| skip(&p)) {
            return Ok(out);
        }
        unshared_rec(pager, self.owner, self.root, self.level, lo, hi, skip, limit, &mut out)?;
        Ok(out)
    }

    /// The blocks of the committed subtrees `skip` is true for that the tree reaches
    /// without passing through another such subtree (the frontier of what it shares).
    pub fn frontier(
        &self,
        pager: &mut Pager,
        skip: &dyn Fn(&BlockPtr) -> bool,
    ) -> Result<std::collections::HashSet<u64>> {
        let mut out = std::collections::HashSet::new();
        let mut stack = vec![(self.root, self.level)];
        while let Some((ptr, level)) = stack.pop() {
            if let Some(p) = ptr.on_disk(level).filter(|p| skip(p)) {
                out.insert(p.block);
                continue;
            }
            if level == 0 {
                continue;
            }
            let node = pager.node(ptr, self.owner, level)?;
            if let Body::Internal(children) = &node.body {
                stack.extend(children.iter().map(|(_, c)| (*c, level - 1)));
            }
        }
        Ok(out)
    }

    /// Collects the items with `lo <= key <= hi`, at most `limit` of them.
    pub fn collect(&self, pager: &mut Pager, lo: &Key, hi: &Key, limit: usize) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.range(pager, lo, hi, &mut |k, v| {
            out.push((*k, v.to_vec()));
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    /// Inserts or replaces; returns the old value.
    pub fn insert(&mut self, pager: &mut Pager, key: Key, value: Vec<u8>) -> Result<Option<Vec<u8>>> {
        if value.len() > MAX_ITEM_BYTES {
            return Err(Error::TooBig(format!("item {key:?} of {} bytes (max {MAX_ITEM_BYTES})", value.len())));
        }
        let r = insert_rec(pager, self.owner, self.root, self.level, key, value)?;
        self.root = ChildPtr::Dirty(r.id);
        if let Some((split_key, split_id)) = r.split {
            let first = pager.dirty_ref(r.id).first_key().unwrap_or(Key::MIN);
            let root = Node {
                owner: self.owner,
                level: self.level + 1,
                body: Body::Internal(vec![(first, ChildPtr::Dirty(r.id)), (split_key, ChildPtr::Dirty(split_id))]),
            };
            self.root = ChildPtr::Dirty(pager.push_dirty(root));
            self.level += 1;
        }
        Ok(r.old)
    }

    /// Removes `key`; returns its value. A missing key changes nothing (no copy-on-write).
    pub fn delete(&mut self, pager: &mut Pager, key: &Key) -> Result<Option<Vec<u8>>> {
        if self.get(pager, key)?.is_none() {
            return Ok(None);
        }
        let (id, old) = delete_rec(pager, self.owner, self.root, self.level, key)?;
        self.root = ChildPtr::Dirty(id);
        // Shrink: an internal root with one child is replaced by that child.
        loop {
            let node = pager.dirty_ref(match self.root {
                ChildPtr::Dirty(id) => id,
                ChildPtr::Disk { .. } => break,
            });
            match &node.body {
                Body::Internal(children) if children.len() == 1 => {
                    self.root = children[0].1;
                    self.level -= 1;
                }
                Body::Internal(children) if children.is_empty() => {
                    self.root = ChildPtr::Dirty(pager.push_dirty(Node::empty_leaf(self.owner)));
                    self.level = 0;
                }
                _ => break,
            }
        }
        Ok(old)
    }

    /// Writes the tree's dirty nodes (queued in `out`) and points the handle at the new root.
    pub fn write(&mut self, pager: &mut Pager, generation: u64, out: &mut Vec<(u64, Vec<u8>)>) -> Result<BlockPtr> {
        let p = pager.write_tree(self.root, self.level, generation, out)?;
        self.root = p.child();
        Ok(p)
    }
}

/// Index of the child whose range holds `key` (the first child for keys below all bounds).
fn child_index(children: &[(Key, ChildPtr)], key: &Key) -> usize {
    children.partition_point(|(k, _)| k <= key).saturating_sub(1)
}

fn range_rec(
    pager: &mut Pager,
    owner: u64,
    ptr: ChildPtr,
    level: u8,
    lo: &Key,
    hi: &Key,
    visit: &mut dyn FnMut(&Key, &[u8]) -> Result<bool>,
) -> Result<bool> {
    let node = pager.node(ptr, owner, level)?;
    match &node.body {
        Body::Leaf(items) => {
            let start = items.partition_point(|(k, _)| k < lo);
            for (k, v) in &items[start..] {
                if k > hi {
                    return Ok(false);
                }
                if !visit(k, v)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Body::Internal(children) => {
            let start = child_index(children, lo);
            for (k, child) in &children[start..] {
                if k > hi {
                    return Ok(false);
                }
                if !range_rec(pager, owner, *child, level - 1, lo, hi, visit)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn unshared_rec(
    pager: &mut Pager,
    owner: u64,
    ptr: ChildPtr,
    level: u8,
    lo: &Key,
    hi: &Key,
    skip: &dyn Fn(&BlockPtr) -> bool,
    limit: usize,
    out: &mut Vec<(Key, Vec<u8>)>,
) -> Result<bool> {
    let node = pager.node(ptr, owner, level)?;
    match &node.body {
        Body::Leaf(items) => {
            let start = items.partition_point(|(k, _)| k < lo);
            for (k, v) in &items[start..] {
                if k > hi {
                    return Ok(false);
                }
                out.push((*k, v.clone()));
                if out.len() >= limit {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Body::Internal(children) => {
            let start = child_index(children, lo);
            for (k, child) in &children[start..] {
                if k > hi {
                    return Ok(false);
                }
                if child.on_disk(level - 1).is_some_and(|p| skip(&p)) {
                    continue;
                }
                if !unshared_rec(pager, owner, *child, level - 1, lo, hi, skip, limit, out)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

struct Inserted {
    id: u32,
    old: Option<Vec<u8>>,
    split: Option<(Key, u32)>,
}

fn insert_rec(pager: &mut Pager, owner: u64, ptr: ChildPtr, level: u8, key: Key, value: Vec<u8>) -> Result<Inserted> {
    let id = pager.cow(ptr, owner, level)?;
    let child = match &pager.dirty_ref(id).body {
        Body::Leaf(_) => None,
        Body::Internal(children) => {
            let i = child_index(children, &key);
            Some((i, children[i].1))
        }
    };
    let (old, overflow) = match child {
        None => {
            let node = pager.dirty_mut(id);
            let Body::Leaf(items) = &mut node.body else { unreachable!("checked above") };
            let old = match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => Some(std::mem::replace(&mut items[i].1, value)),
                Err(i) => {
                    items.insert(i, (key, value));
                    None
                }
            };
            (old, !node.fits())
        }
        Some((i, child_ptr)) => {
            let r = insert_rec(pager, owner, child_ptr, level - 1, key, value)?;
            let node = pager.dirty_mut(id);
            let Body::Internal(children) = &mut node.body else { unreachable!("checked above") };
            children[i].1 = ChildPtr::Dirty(r.id);
            if key < children[i].0 {
                children[i].0 = key;
            }
            if let Some((k, sid)) = r.split {
                children.insert(i + 1, (k, ChildPtr::Dirty(sid)));
            }
            (r.old, !node.fits())
        }
    };
    let split = if overflow { Some(split_node(pager, id)) } else { None };
    Ok(Inserted { id, old, split })
}

/// Splits an overfull dirty node in two; returns the right half's first key and arena id.
fn split_node(pager: &mut Pager, id: u32) -> (Key, u32) {
    let node = pager.dirty_mut(id);
    let (owner, level) = (node.owner, node.level);
    let right_body = match &mut node.body {
        Body::Leaf(items) => {
            // Split where the larger half is smallest, so both halves fit.
            let sizes: Vec<usize> = items.iter().map(|(_, v)| crate::engine::node::LEAF_ITEM_BYTES + v.len()).collect();
            let total: usize = sizes.iter().sum();
            let mut left = 0;
            let mut best = (usize::MAX, 1);
            for (i, s) in sizes.iter().enumerate().take(items.len() - 1) {
                left += s;
                let worst = left.max(total - left);
                if worst < best.0 {
                    best = (worst, i + 1);
                }
            }
            debug_assert!(best.0 <= LEAF_SPACE, "leaf split cannot fit");
            Body::Leaf(items.split_off(best.1))
        }
        Body::Internal(children) => {
            let half = children.len() / 2;
            debug_assert!(half > 0 && children.len() - half <= INTERNAL_CAPACITY);
            Body::Internal(children.split_off(half))
        }
    };
    let right = Node { owner, level, body: right_body };
    let first = right.first_key().unwrap_or(Key::MIN);
    (first, pager.push_dirty(right))
}

fn underfull(node: &Node) -> bool {
    match &node.body {
        Body::Leaf(_) => node.used_bytes() < LEAF_SPACE / 4,
        Body::Internal(c) => c.len() < INTERNAL_CAPACITY / 4,
    }
}

fn delete_rec(pager: &mut Pager, owner: u64, ptr: ChildPtr, level: u8, key: &Key) -> Result<(u32, Option<Vec<u8>>)> {
    let id = pager.cow(ptr, owner, level)?;
    let child = match &pager.dirty_ref(id).body {
        Body::Leaf(_) => None,
        Body::Internal(children) => {
            let i = child_index(children, key);
            Some((i, children[i].1))
        }
    };
    let Some((i, child_ptr)) = child else {
        let Body::Leaf(items) = &mut pager.dirty_mut(id).body else { unreachable!("checked above") };
        let old = items.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| items.remove(i).1);
        return Ok((id, old));
    };
    let (cid, old) = delete_rec(pager, owner, child_ptr, level - 1, key)?;
    let Body::Internal(children) = &mut pager.dirty_mut(id).body else { unreachable!("checked above") };
    children[i].1 = ChildPtr::Dirty(cid);
    let child_node = pager.dirty_ref(cid);
    if child_node.is_empty() {
        let Body::Internal(children) = &mut pager.dirty_mut(id).body else { unreachable!("checked above") };
        children.remove(i);
    } else if underfull(child_node) {
        merge_with_sibling(pager, owner, id, i, level - 1)?;
    }
    Ok((id, old))
}

/// Merges child `i` of dirty node `parent` with a neighbour when both fit in one node.
fn merge_with_sibling(pager: &mut Pager, owner: u64, parent: u32, i: usize, child_level: u8) -> Result<()> {
    let Body::Internal(children) = &pager.dirty_ref(parent).body else { return Ok(()) };
    if children.len() < 2 {
        return Ok(());
    }
    let (left_i, right_i) = if i > 0 { (i - 1, i) } else { (i, i + 1) };
    let (left_ptr, right_ptr) = (children[left_i].1, children[right_i].1);
    // Check the fit before copying anything.
    let left = pager.node(left_ptr, owner, child_level)?;
    let right = pager.node(right_ptr, owner, child_level)?;
    let fits = match (&left.body, &right.body) {
        (Body::Leaf(_), Body::Leaf(_)) => left.used_bytes() + right.used_bytes() <= LEAF_SPACE,
        (Body::Internal(a), Body::Internal(b)) => a.len() + b.len() <= INTERNAL_CAPACITY,
        _ => false,
    };
    if !fits {
        return Ok(());
    }
    let left_id = pager.cow(left_ptr, owner, child_level)?;
    let right_id = pager.cow(right_ptr, owner, child_level)?;
    let right_body = std::mem::replace(&mut pager.dirty_mut(right_id).body, Body::Leaf(Vec::new()));
    match (&mut pager.dirty_mut(left_id).body, right_body) {
        (Body::Leaf(a), Body::Leaf(b)) => a.extend(b),
        (Body::Internal(a), Body::Internal(b)) => a.extend(b),
        _ => unreachable!("levels match"),
    }
    let Body::Internal(children) = &mut pager.dirty_mut(parent).body else { unreachable!("parent is internal") };
    children[left_i].1 = ChildPtr::Dirty(left_id);
    children.remove(right_i);
    Ok(())
}
