//! Block allocator: allocation groups, each with its own free-space
//! [`Bitmap`] and free count, searched bitfit-style.
//!
//! Blocks `0..total_blocks` are split into groups of `blocks_per_group`
//! consecutive blocks; the last group may be shorter. A search skips any
//! group whose free count is below the requested length without touching its
//! bitmap, and searches the others word at a time.
//!
//! Search order for a goal block in group `g` at offset `o`: group `g` for
//! runs starting at `o..`, then groups `g + 1, g + 2, ...` wrapping round to
//! `0, ..., g - 1` (whole group), then group `g` for runs starting at `0..o`.
//! An empty allocator's first allocation therefore starts exactly at the goal.
//!
//! Invariants:
//! - Bit SET = block used, CLEAR = free; block `b` is bit
//!   `b % blocks_per_group` of group `b / blocks_per_group`.
//! - Each group's `free` equals its bitmap's clear-bit count, and the
//!   allocator's `free_blocks` equals the sum of the groups' `free`.
//! - A run returned by [`Allocator::alloc`] or [`Allocator::alloc_upto`] lies
//!   entirely inside one group: runs never span groups, so no allocation can
//!   be longer than `blocks_per_group`. ([`Allocator::mark_used`] and
//!   [`Allocator::mark_free`] accept ranges that cross groups.)
//! - Allocated runs never overlap: a block is handed out only while free, and
//!   [`Allocator::mark_used`] / [`Allocator::mark_free`] panic on a double
//!   allocation / double free (a bug in the caller), leaving the state
//!   unchanged.

use crate::engine::bitmap::Bitmap;

#[derive(Clone, Debug)]
struct Group {
    bitmap: Bitmap,
    free: u64,
}

/// Block allocator over `total_blocks` blocks split into allocation groups.
#[derive(Clone, Debug)]
pub struct Allocator {
    groups: Vec<Group>,
    blocks_per_group: u64,
    total_blocks: u64,
    free_blocks: u64,
}

/// Splits `start..start + len` into `(group, offset_in_group, len)` pieces,
/// one per group touched, in order.
fn pieces(start: u64, len: u64, per_group: u64) -> impl Iterator<Item = (usize, u64, u64)> {
    let end = start + len;
    let mut pos = start;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let group = pos / per_group;
        let offset = pos % per_group;
        let piece = (per_group - offset).min(end - pos);
        pos += piece;
        Some((group as usize, offset, piece))
    })
}

impl Allocator {
    /// Creates an allocator of `total_blocks` free blocks in groups of
    /// `blocks_per_group` blocks; the last group holds the remainder and may
    /// be shorter.
    ///
    /// # Panics
    ///
    /// If `blocks_per_group == 0`.
    pub fn new(total_blocks: u64, blocks_per_group: u64) -> Allocator {
        assert!(blocks_per_group > 0, "blocks_per_group must be non-zero");
        let groups = (0..total_blocks.div_ceil(blocks_per_group))
            .map(|g| {
                let len = blocks_per_group.min(total_blocks - g * blocks_per_group);
                Group { bitmap: Bitmap::new(len), free: len }
            })
            .collect();
        Allocator { groups, blocks_per_group, total_blocks, free_blocks: total_blocks }
    }

    /// Total number of blocks managed.
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// Number of free blocks.
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Number of used blocks.
    pub fn used_blocks(&self) -> u64 {
        self.total_blocks - self.free_blocks
    }

    /// Blocks per allocation group (the last group may hold fewer); also
    /// the longest run [`Allocator::alloc`] can return.
    pub fn blocks_per_group(&self) -> u64 {
        self.blocks_per_group
    }

    /// Number of allocation groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// True if `block` is used.
    ///
    /// # Panics
    ///
    /// If `block >= total_blocks()`.
    pub fn is_used(&self, block: u64) -> bool {
        assert!(block < self.total_blocks, "block {block} out of range for {} blocks", self.total_blocks);
        let group = &self.groups[(block / self.blocks_per_group) as usize];
        group.bitmap.get(block % self.blocks_per_group)
    }

    fn check_range(&self, start: u64, len: u64) {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.total_blocks),
            "range {start}+{len} out of range for {} blocks",
            self.total_blocks
        );
    }

    /// First used block in `start..start + len`, if any.
    fn first_used_in(&self, start: u64, len: u64) -> Option<u64> {
        pieces(start, len, self.blocks_per_group).find_map(|(g, off, n)| {
            let base = g as u64 * self.blocks_per_group;
            self.groups[g].bitmap.find_set_in(off, off + n).map(|b| base + b)
        })
    }

    /// First free block in `start..start + len`, if any.
    fn first_free_in(&self, start: u64, len: u64) -> Option<u64> {
        pieces(start, len, self.blocks_per_group).find_map(|(g, off, n)| {
            let base = g as u64 * self.blocks_per_group;
            self.groups[g].bitmap.find_clear_in(off, off + n).map(|b| base + b)
        })
    }

    /// Marks a range used or free, keeping the free counts exact. The caller
    /// has checked that every block currently has the opposite state.
    fn apply(&mut self, start: u64, len: u64, used: bool) {
        for (g, off, n) in pieces(start, len, self.blocks_per_group) {
            let group = &mut self.groups[g];
            if used {
                group.bitmap.set_range(off, n);
                group.free -= n;
                self.free_blocks -= n;
            } else {
                group.bitmap.clear_range(off, n);
                group.free += n;
                self.free_blocks += n;
            }
        }
    }

    /// Marks `start..start + len` used. The range may cross groups.
    ///
    /// # Panics
    ///
    /// If the range extends past `total_blocks()`, or if any block in it is
    /// already used: a double allocation is a bug. Nothing is changed then.
    pub fn mark_used(&mut self, start: u64, len: u64) {
        self.check_range(start, len);
        if let Some(block) = self.first_used_in(start, len) {
            panic!("double allocation: block {block} is already used");
        }
        self.apply(start, len, true);
    }

    /// Marks `start..start + len` free. The range may cross groups.
    ///
    /// # Panics
    ///
    /// If the range extends past `total_blocks()`, or if any block in it is
    /// already free: a double free is a bug. Nothing is changed then.
    pub fn mark_free(&mut self, start: u64, len: u64) {
        self.check_range(start, len);
        if let Some(block) = self.first_free_in(start, len) {
            panic!("double free: block {block} is already free");
        }
        self.apply(start, len, false);
    }

    /// Marks `start..start + len` used if every block in it is free;
    /// otherwise changes nothing and returns `Err(first block already used)`.
    /// For fsck and open-time rebuilds, where a block referenced twice is
    /// corruption to report rather than a bug.
    ///
    /// # Panics
    ///
    /// If the range extends past `total_blocks()`.
    pub fn try_mark_used(&mut self, start: u64, len: u64) -> Result<(), u64> {
        self.check_range(start, len);
        if let Some(block) = self.first_used_in(start, len) {
            return Err(block);
        }
        self.apply(start, len, true);
        Ok(())
    }

    /// `(group, from, to)` windows of run starts to try, in search order
    /// for `goal` (see the module docs).
    fn search_order(&self, goal: u64) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        let n = self.groups.len();
        let goal = if goal < self.total_blocks { goal } else { 0 };
        let g0 = (goal / self.blocks_per_group) as usize;
        let off = goal % self.blocks_per_group;
        let first = (n > 0).then(|| (g0, off, self.groups[g0].bitmap.len()));
        let middle = (1..n).map(move |i| {
            let g = (g0 + i) % n;
            (g, 0, self.groups[g].bitmap.len())
        });
        let last = (n > 0 && off > 0).then_some((g0, 0, off));
        first.into_iter().chain(middle).chain(last)
    }

    /// Finds the first run of exactly `len` free blocks in search order,
    /// as `(group, offset)`.
    fn find_exact(&self, goal: u64, len: u64) -> Option<(usize, u64)> {
        if len > self.blocks_per_group || len > self.free_blocks {
            return None;
        }
        self.search_order(goal).find_map(|(g, from, to)| {
            let group = &self.groups[g];
            if group.free < len {
                return None;
            }
            group.bitmap.find_clear_run_in(from, to, len).map(|s| (g, s))
        })
    }

    /// Marks `len` blocks at `offset` in group `g` used and returns the
    /// absolute start block.
    fn take(&mut self, g: usize, offset: u64, len: u64) -> u64 {
        let group = &mut self.groups[g];
        debug_assert!(group.bitmap.range_is_clear(offset, len));
        group.bitmap.set_range(offset, len);
        group.free -= len;
        self.free_blocks -= len;
        g as u64 * self.blocks_per_group + offset
    }

    /// Allocates a contiguous run of `len` blocks and returns its first
    /// block, or `None` if no group has such a run. The search starts at
    /// `goal`'s group and offset (see the module docs for the order) and
    /// skips groups with fewer than `len` free blocks. A `goal` past the end
    /// is treated as `0`. The run lies within one group, so
    /// `len > blocks_per_group()` always yields `None`.
    ///
    /// # Panics
    ///
    /// If `len == 0`.
    pub fn alloc(&mut self, goal: u64, len: u64) -> Option<u64> {
        assert!(len > 0, "zero-length allocation");
        let (g, offset) = self.find_exact(goal, len)?;
        Some(self.take(g, offset, len))
    }

    /// Best-effort allocation of up to `max_len` blocks: a run of exactly
    /// `min(max_len, blocks_per_group())` blocks if one exists (first in the
    /// same search order as [`Allocator::alloc`]), otherwise the first free
    /// run found in that order, truncated to `max_len`. Returns
    /// `(start, len)` with `1 <= len <= max_len`, or `None` only when no
    /// block is free.
    ///
    /// # Panics
    ///
    /// If `max_len == 0`.
    pub fn alloc_upto(&mut self, goal: u64, max_len: u64) -> Option<(u64, u64)> {
        assert!(max_len > 0, "zero-length allocation");
        let want = max_len.min(self.blocks_per_group);
        if let Some((g, offset)) = self.find_exact(goal, want) {
            return Some((self.take(g, offset, want), want));
        }
        let (g, offset, len) = self.search_order(goal).find_map(|(g, from, to)| {
            let group = &self.groups[g];
            if group.free == 0 {
                return None;
            }
            let start = group.bitmap.find_clear_in(from, to)?;
            Some((g, start, group.bitmap.clear_run_len(start, want)))
        })?;
        Some((self.take(g, offset, len), len))
    }

    /// Every maximal run of free blocks as `(start, len)`, in block order.
    /// Runs that touch across a group boundary are merged, so the result
    /// does not depend on the group size (handy for fsck comparisons).
    pub fn iter_free_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let per_group = self.blocks_per_group;
        let mut raw = self.groups.iter().enumerate().flat_map(move |(g, group)| {
            let base = g as u64 * per_group;
            let bitmap = &group.bitmap;
            let mut pos = 0;
            std::iter::from_fn(move || {
                if group.free == 0 {
                    return None;
                }
                let start = bitmap.find_clear_in(pos, bitmap.len())?;
                let len = bitmap.clear_run_len(start, u64::MAX);
                pos = start + len;
                Some((base + start, len))
            })
        });
        let mut pending: Option<(u64, u64)> = None;
        std::iter::from_fn(move || loop {
            match (raw.next(), pending) {
                (Some((start, len)), Some((p_start, p_len))) if p_start + p_len == start => {
                    pending = Some((p_start, p_len + len));
                }
                (Some(run), previous) => {
                    pending = Some(run);
                    if previous.is_some() {
                        return previous;
                    }
                }
                (None, previous) => {
                    pending = None;
                    return previous;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Naive model: one bool per block and the documented search order,
    /// tested bit by bit.
    struct Model {
        used: Vec<bool>,
        per_group: u64,
    }

    impl Model {
        fn new(total: u64, per_group: u64) -> Model {
            Model { used: vec![false; total as usize], per_group }
        }

        fn total(&self) -> u64 {
            self.used.len() as u64
        }

        fn free(&self) -> u64 {
            self.used.iter().filter(|&&u| !u).count() as u64
        }

        fn is_clear(&self, start: u64, len: u64) -> bool {
            (start..start + len).all(|b| !self.used[b as usize])
        }

        /// Candidate starts in search order, each with the end of its group.
        fn order(&self, goal: u64) -> Vec<(u64, u64)> {
            let total = self.total();
            if total == 0 {
                return Vec::new();
            }
            let goal = if goal < total { goal } else { 0 };
            let groups = total.div_ceil(self.per_group);
            let g0 = goal / self.per_group;
            let group_end = |g: u64| ((g + 1) * self.per_group).min(total);
            let mut out: Vec<(u64, u64)> = (goal..group_end(g0)).map(|s| (s, group_end(g0))).collect();
            for i in 1..groups {
                let g = (g0 + i) % groups;
                out.extend((g * self.per_group..group_end(g)).map(|s| (s, group_end(g))));
            }
            out.extend((g0 * self.per_group..goal).map(|s| (s, group_end(g0))));
            out
        }

        fn find_exact(&self, goal: u64, len: u64) -> Option<u64> {
            self.order(goal).into_iter().find(|&(s, end)| s + len <= end && self.is_clear(s, len)).map(|(s, _)| s)
        }

        fn find_upto(&self, goal: u64, max: u64) -> Option<(u64, u64)> {
            let want = max.min(self.per_group);
            if let Some(s) = self.find_exact(goal, want) {
                return Some((s, want));
            }
            self.order(goal).into_iter().find(|&(s, _)| !self.used[s as usize]).map(|(s, end)| {
                let len = (s..end).take_while(|&b| !self.used[b as usize]).count() as u64;
                (s, len.min(want))
            })
        }

        fn set(&mut self, start: u64, len: u64, used: bool) {
            for b in start..start + len {
                self.used[b as usize] = used;
            }
        }

        fn free_runs(&self) -> Vec<(u64, u64)> {
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for (b, &used) in self.used.iter().enumerate() {
                if used {
                    continue;
                }
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == b as u64 => *l += 1,
                    _ => runs.push((b as u64, 1)),
                }
            }
            runs
        }
    }

    fn check_consistent(a: &Allocator, m: &Model) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.free_blocks(), m.free());
        prop_assert_eq!(a.used_blocks(), m.total() - m.free());
        for g in &a.groups {
            prop_assert_eq!(g.free, g.bitmap.len() - g.bitmap.count_set());
        }
        prop_assert_eq!(a.iter_free_runs().collect::<Vec<_>>(), m.free_runs());
        Ok(())
    }

    #[test]
    fn new_shapes() {
        let a = Allocator::new(1000, 300);
        assert_eq!(a.total_blocks(), 1000);
        assert_eq!(a.free_blocks(), 1000);
        assert_eq!(a.used_blocks(), 0);
        assert_eq!(a.group_count(), 4);
        assert_eq!(a.groups[3].bitmap.len(), 100);
        assert_eq!(a.iter_free_runs().collect::<Vec<_>>(), vec![(0, 1000)]);
        let empty = Allocator::new(0, 64);
        assert_eq!(empty.group_count(), 0);
        assert_eq!(empty.iter_free_runs().count(), 0);
    }

    #[test]
    fn alloc_on_empty_allocator_returns_goal() {
        for goal in [0u64, 1, 63, 64, 299, 300, 555, 999] {
            let mut a = Allocator::new(1000, 300);
            let len = (300 - goal % 300).min(1000 - goal).min(17);
            assert_eq!(a.alloc(goal, len), Some(goal), "goal {goal}");
            assert_eq!(a.free_blocks(), 1000 - len);
            assert!(a.is_used(goal) && a.is_used(goal + len - 1));
        }
    }

    #[test]
    fn alloc_search_order() {
        let mut a = Allocator::new(400, 100);
        // Run of 10 does not fit after offset 95 in group 2: next group.
        assert_eq!(a.alloc(295, 10), Some(300));
        // Group 3 now has 90 free; a 95-run skips it and wraps to group 0.
        assert_eq!(a.alloc(350, 95), Some(0));
        // Goal group searched again from its start last.
        a.mark_used(100, 100);
        a.mark_used(310, 90);
        a.mark_used(95, 5);
        assert_eq!(a.alloc(250, 50), Some(250));
        assert_eq!(a.alloc(250, 50), Some(200));
        assert_eq!(a.alloc(0, 1), None);
        assert_eq!(a.free_blocks(), 0);
    }

    #[test]
    fn alloc_none_when_nothing_fits() {
        let mut a = Allocator::new(256, 64);
        assert_eq!(a.alloc(0, 65), None); // longer than a group
        for g in 0..4 {
            a.mark_used(g * 64 + 32, 1); // split every group into 32 + 31
        }
        assert_eq!(a.alloc(0, 33), None);
        assert_eq!(a.alloc(0, 32), Some(0));
        assert_eq!(a.free_blocks(), 256 - 4 - 32);
        assert_eq!(a.alloc_upto(0, 40), Some((33, 31)));
        assert_eq!(Allocator::new(0, 8).alloc(0, 1), None);
    }

    #[test]
    fn alloc_upto_prefers_exact_then_first() {
        let mut a = Allocator::new(100, 100);
        a.mark_used(10, 1);
        a.mark_used(20, 80);
        // 9 free at 11..20, 10 at 0..10. Exact 10 wraps to 0.
        assert_eq!(a.alloc_upto(12, 10), Some((0, 10)));
        // Nothing of 10 left: first run found from the goal, truncated to the run.
        assert_eq!(a.alloc_upto(12, 10), Some((12, 8)));
        assert_eq!(a.alloc_upto(0, 10), Some((11, 1)));
        assert_eq!(a.alloc_upto(0, 10), None);
        // max_len larger than a group is capped to the group.
        let mut b = Allocator::new(256, 64);
        assert_eq!(b.alloc_upto(10, 1000), Some((64, 64)));
    }

    #[test]
    fn try_mark_used_reports_first_conflict() {
        let mut a = Allocator::new(300, 100);
        a.mark_used(150, 10);
        assert_eq!(a.try_mark_used(90, 65), Err(150));
        assert_eq!(a.used_blocks(), 10);
        assert_eq!(a.try_mark_used(90, 60), Ok(()));
        assert_eq!(a.used_blocks(), 70);
        assert_eq!(a.iter_free_runs().collect::<Vec<_>>(), vec![(0, 90), (160, 140)]);
        a.mark_free(95, 60);
        assert_eq!(a.iter_free_runs().collect::<Vec<_>>(), vec![(0, 90), (95, 60), (160, 140)]);
    }

    #[test]
    #[should_panic(expected = "double allocation")]
    fn mark_used_twice_panics() {
        let mut a = Allocator::new(100, 32);
        a.mark_used(10, 30);
        a.mark_used(39, 2);
    }

    #[test]
    #[should_panic(expected = "double allocation")]
    fn mark_used_over_alloc_panics() {
        let mut a = Allocator::new(100, 32);
        let start = a.alloc(5, 4).expect("empty allocator has room");
        a.mark_used(start + 3, 1);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn mark_free_twice_panics() {
        let mut a = Allocator::new(100, 32);
        a.mark_used(10, 30);
        a.mark_free(10, 30);
        a.mark_free(20, 1);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn mark_used_past_end_panics() {
        Allocator::new(100, 32).mark_used(90, 11);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc { goal: u64, len: u64 },
        AllocUpto { goal: u64, max: u64 },
        Free { pick: usize },
        TryMark { start: u64, len: u64 },
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..1100, 1u64..80).prop_map(|(goal, len)| Op::Alloc { goal, len }),
            2 => (0u64..1100, 1u64..80).prop_map(|(goal, max)| Op::AllocUpto { goal, max }),
            2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            1 => (0u64..1100, 1u64..40).prop_map(|(start, len)| Op::TryMark { start, len }),
        ]
    }

    proptest! {
        #[test]
        fn allocator_matches_model(
            total in 0u64..1000,
            per_group in 1u64..300,
            ops in proptest::collection::vec(op_strategy(), 1..60),
        ) {
            let mut a = Allocator::new(total, per_group);
            let mut m = Model::new(total, per_group);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { goal, len } => {
                        let got = a.alloc(goal, len);
                        prop_assert_eq!(got, m.find_exact(goal, len));
                        if let Some(start) = got {
                            prop_assert!(m.is_clear(start, len), "overlapping run");
                            prop_assert_eq!(start / per_group, (start + len - 1) / per_group);
                            m.set(start, len, true);
                            live.push((start, len));
                        }
                    }
                    Op::AllocUpto { goal, max } => {
                        let got = a.alloc_upto(goal, max);
                        prop_assert_eq!(got, m.find_upto(goal, max));
                        prop_assert_eq!(got.is_none(), m.free() == 0);
                        if let Some((start, len)) = got {
                            prop_assert!(len >= 1 && len <= max);
                            prop_assert!(m.is_clear(start, len), "overlapping run");
                            m.set(start, len, true);
                            live.push((start, len));
                        }
                    }
                    Op::Free { pick } => {
                        if !live.is_empty() {
                            let (start, len) = live.swap_remove(pick % live.len());
                            a.mark_free(start, len);
                            m.set(start, len, false);
                        }
                    }
                    Op::TryMark { start, len } => {
                        if start + len <= total {
                            let expected = (start..start + len).find(|&b| m.used[b as usize]);
                            match a.try_mark_used(start, len) {
                                Ok(()) => {
                                    prop_assert_eq!(expected, None);
                                    m.set(start, len, true);
                                    live.push((start, len));
                                }
                                Err(b) => prop_assert_eq!(Some(b), expected),
                            }
                        }
                    }
                }
                check_consistent(&a, &m)?;
                for b in 0..total {
                    prop_assert_eq!(a.is_used(b), m.used[b as usize]);
                }
            }
        }
    }
}
