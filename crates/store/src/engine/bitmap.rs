//! Free-space bitmap searched a machine word at a time (GFS2 `gfs2_bitfit` style).
//!
//! One bit per block: a SET bit means the block is used, a CLEAR bit means it
//! is free. Bit `i` lives in word `i / 64` at position `i % 64` (least
//! significant bit first).
//!
//! Searches mask the partial first word so bits before the start look
//! uninteresting, test it together with the following word (one branch for
//! 128 bits), then skip whole words that cannot contain an answer (a word
//! equal to `u64::MAX` has no clear bit; a word equal to `0` has no set bit)
//! eight per step, in a branch-free loop the compiler can vectorise, and
//! locate the answer inside the first candidate word with `trailing_ones` /
//! `trailing_zeros`. [`Bitmap::find_clear_bitloop`] is the
//! naive bit-by-bit reference kept for tests and for the benchmark baseline.
//!
//! Invariants:
//! - `words.len() == len_bits.div_ceil(64)`: no spare words, no missing words.
//! - Bits at positions `>= len_bits` in the last word (the tail) are always
//!   SET, so a search for a clear bit can never return a position past the
//!   end, and whole-word skipping needs no bounds special case.
//! - Every public method that takes a position or a range asserts that it lies
//!   within `0..len_bits`; an out-of-range argument is a programmer error and
//!   panics. Search goals are the exception: a goal `>= len_bits` is treated
//!   as goal `0`.
//! - No method ever changes a tail bit, and no method changes `len_bits`.

const WORD_BITS: u64 = 64;

/// Index of the word holding `bit`.
#[inline]
fn word_index(bit: u64) -> usize {
    // Bitmaps are held in memory, so the word index always fits in usize.
    (bit / WORD_BITS) as usize
}

/// Position of `bit` inside its word.
#[inline]
fn bit_offset(bit: u64) -> u32 {
    (bit % WORD_BITS) as u32
}

/// Mask of the bits at positions `0..off` (`off < 64`).
#[inline]
fn low_mask(off: u32) -> u64 {
    debug_assert!(off < 64);
    (1u64 << off) - 1
}

/// Mask of the bits at positions `lo..hi` (`lo < hi <= 64`).
#[inline]
fn span_mask(lo: u32, hi: u32) -> u64 {
    debug_assert!(lo < hi && hi <= 64);
    let below_hi = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    below_hi & (u64::MAX << lo)
}

/// Mask of the tail bits (positions `>= len_bits`) of the last word.
#[inline]
fn tail_mask(len_bits: u64) -> u64 {
    match bit_offset(len_bits) {
        0 => 0,
        off => !low_mask(off),
    }
}

/// A fixed-length bitmap of used (SET) and free (CLEAR) blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len_bits: u64,
}

impl Bitmap {
    /// Creates a bitmap of `len_bits` bits, all clear (every block free).
    pub fn new(len_bits: u64) -> Bitmap {
        let nwords = len_bits.div_ceil(WORD_BITS) as usize;
        let mut words = vec![0u64; nwords];
        if let Some(last) = words.last_mut() {
            *last = tail_mask(len_bits);
        }
        Bitmap { words, len_bits }
    }

    /// Rebuilds a bitmap from its words (as returned by [`Bitmap::as_words`],
    /// e.g. after reading them back from disk).
    ///
    /// Tail bits past `len_bits` are forced SET whatever their stored value.
    ///
    /// # Panics
    ///
    /// If `words.len()` is not exactly `len_bits.div_ceil(64)`.
    pub fn from_words(mut words: Vec<u64>, len_bits: u64) -> Bitmap {
        assert_eq!(
            words.len() as u64,
            len_bits.div_ceil(WORD_BITS),
            "bitmap of {len_bits} bits needs {} words",
            len_bits.div_ceil(WORD_BITS)
        );
        if let Some(last) = words.last_mut() {
            *last |= tail_mask(len_bits);
        }
        Bitmap { words, len_bits }
    }

    /// Number of bits (blocks) in the bitmap.
    pub fn len(&self) -> u64 {
        self.len_bits
    }

    /// True if the bitmap has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len_bits == 0
    }

    /// The backing words, least significant bit first; tail bits past
    /// [`Bitmap::len`] are SET.
    pub fn as_words(&self) -> &[u64] {
        &self.words
    }

    #[inline]
    fn check_bit(&self, bit: u64) {
        assert!(bit < self.len_bits, "bit {bit} out of range for bitmap of {} bits", self.len_bits);
    }

    /// Asserts `start..start + len` lies within the bitmap and returns its end.
    #[inline]
    fn check_range(&self, start: u64, len: u64) -> u64 {
        match start.checked_add(len) {
            Some(end) if end <= self.len_bits => end,
            _ => panic!("range {start}+{len} out of range for bitmap of {} bits", self.len_bits),
        }
    }

    /// True if `bit` is SET (used).
    ///
    /// # Panics
    ///
    /// If `bit >= len()`.
    pub fn get(&self, bit: u64) -> bool {
        self.check_bit(bit);
        self.words[word_index(bit)] >> bit_offset(bit) & 1 == 1
    }

    /// Sets `bit` (marks it used).
    ///
    /// # Panics
    ///
    /// If `bit >= len()`.
    pub fn set(&mut self, bit: u64) {
        self.check_bit(bit);
        self.words[word_index(bit)] |= 1u64 << bit_offset(bit);
    }

    /// Clears `bit` (marks it free).
    ///
    /// # Panics
    ///
    /// If `bit >= len()`.
    pub fn clear(&mut self, bit: u64) {
        self.check_bit(bit);
        self.words[word_index(bit)] &= !(1u64 << bit_offset(bit));
    }

    /// Sets every bit in `start..start + len`, whole words at a time in the
    /// middle of the range.
    ///
    /// # Panics
    ///
    /// If the range extends past `len()`.
    pub fn set_range(&mut self, start: u64, len: u64) {
        let end = self.check_range(start, len);
        if len == 0 {
            return;
        }
        let (first, last) = (word_index(start), word_index(end - 1));
        let (lo, hi) = (bit_offset(start), bit_offset(end - 1) + 1);
        if first == last {
            self.words[first] |= span_mask(lo, hi);
            return;
        }
        self.words[first] |= span_mask(lo, 64);
        self.words[first + 1..last].fill(u64::MAX);
        self.words[last] |= span_mask(0, hi);
    }

    /// Clears every bit in `start..start + len`, whole words at a time in the
    /// middle of the range.
    ///
    /// # Panics
    ///
    /// If the range extends past `len()`.
    pub fn clear_range(&mut self, start: u64, len: u64) {
        let end = self.check_range(start, len);
        if len == 0 {
            return;
        }
        let (first, last) = (word_index(start), word_index(end - 1));
        let (lo, hi) = (bit_offset(start), bit_offset(end - 1) + 1);
        if first == last {
            self.words[first] &= !span_mask(lo, hi);
            return;
        }
        self.words[first] &= !span_mask(lo, 64);
        self.words[first + 1..last].fill(0);
        self.words[last] &= !span_mask(0, hi);
    }

    /// Number of SET (used) bits, by popcount.
    pub fn count_set(&self) -> u64 {
        let raw: u64 = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
        raw - u64::from(tail_mask(self.len_bits).count_ones())
    }

    /// True if every bit in `start..start + len` is clear (free). An empty
    /// range is clear.
    ///
    /// # Panics
    ///
    /// If the range extends past `len()`.
    pub fn range_is_clear(&self, start: u64, len: u64) -> bool {
        let end = self.check_range(start, len);
        self.scan(start, end, u64::MAX).is_none()
    }

    /// First clear bit in `from..to`, without wrapping; `None` if the range
    /// is empty or fully set.
    ///
    /// # Panics
    ///
    /// If `to > len()`.
    pub fn find_clear_in(&self, from: u64, to: u64) -> Option<u64> {
        assert!(to <= self.len_bits, "end {to} past bitmap of {} bits", self.len_bits);
        self.scan(from, to, 0)
    }

    /// First set bit in `from..to`, without wrapping; `None` if the range is
    /// empty or fully clear.
    ///
    /// # Panics
    ///
    /// If `to > len()`.
    pub fn find_set_in(&self, from: u64, to: u64) -> Option<u64> {
        assert!(to <= self.len_bits, "end {to} past bitmap of {} bits", self.len_bits);
        self.scan(from, to, u64::MAX)
    }

    /// First clear bit at or after `goal`, wrapping round to `0..goal`;
    /// `None` if every bit is set. A `goal >= len()` is treated as `0`.
    ///
    /// Word at a time: if the goal bit itself is not free, the goal's word is
    /// masked so bits below the goal look used, full words (`u64::MAX`) are
    /// skipped eight at a time, and the first partial word is resolved with
    /// `trailing_ones`.
    pub fn find_clear(&self, goal: u64) -> Option<u64> {
        let goal = self.clamp_goal(goal);
        // The goal itself is often free (sparse bitmaps, sequential
        // allocation). Testing it with a branch rather than a data
        // dependency lets successive searches overlap.
        if self.len_bits > 0 && self.words[word_index(goal)] >> bit_offset(goal) & 1 == 0 {
            return Some(goal);
        }
        self.scan(goal, self.len_bits, 0).or_else(|| self.scan(0, goal, 0))
    }

    /// Naive reference for [`Bitmap::find_clear`]: tests one bit per
    /// iteration. Same result, kept for tests and as the benchmark baseline.
    pub fn find_clear_bitloop(&self, goal: u64) -> Option<u64> {
        let goal = self.clamp_goal(goal);
        let is_clear = |bit: u64| self.words[word_index(bit)] >> bit_offset(bit) & 1 == 0;
        (goal..self.len_bits).chain(0..goal).find(|&bit| is_clear(bit))
    }

    /// Start of the first run of `len` clear bits whose start is at or after
    /// `goal`, wrapping round to starts in `0..goal`. A run never wraps across
    /// the end of the bitmap. `None` if no such run exists. A `goal >= len()`
    /// is treated as `0`.
    ///
    /// # Panics
    ///
    /// If `len == 0`.
    pub fn find_clear_run(&self, goal: u64, len: u64) -> Option<u64> {
        assert!(len > 0, "zero-length run requested");
        let goal = self.clamp_goal(goal);
        self.find_clear_run_in(goal, self.len_bits, len).or_else(|| self.find_clear_run_in(0, goal, len))
    }

    /// Start of the first run of `len` clear bits whose start lies in
    /// `from..to`, without wrapping. The run itself may extend past `to` but
    /// not past `len()`.
    ///
    /// Skips to each candidate with the word-at-a-time clear-bit search, then
    /// measures the run word at a time ([`Bitmap::clear_run_len`]); a run that
    /// is too short is stepped over whole.
    ///
    /// # Panics
    ///
    /// If `len == 0` or `to > len()`.
    pub fn find_clear_run_in(&self, from: u64, to: u64, len: u64) -> Option<u64> {
        assert!(len > 0, "zero-length run requested");
        assert!(to <= self.len_bits, "end {to} past bitmap of {} bits", self.len_bits);
        let mut pos = from;
        while pos < to {
            let start = self.scan(pos, to, 0)?;
            if len > self.len_bits - start {
                // Every later start leaves even less room.
                return None;
            }
            let run = self.clear_run_len(start, len);
            if run >= len {
                return Some(start);
            }
            // Bit `start + run` is set, so no run starting in
            // `start..=start + run` can be long enough.
            pos = start + run + 1;
        }
        None
    }

    /// The first clear run at or after `goal` (wrapping round to `0..goal`),
    /// truncated to `max_len`: `(start, len)` with `1 <= len <= max_len`.
    /// If `goal` falls inside a clear run, the run is taken from `goal`.
    /// `None` if every bit is set.
    ///
    /// # Panics
    ///
    /// If `max_len == 0`.
    pub fn find_clear_run_upto(&self, goal: u64, max_len: u64) -> Option<(u64, u64)> {
        assert!(max_len > 0, "zero-length run requested");
        let start = self.find_clear(goal)?;
        Some((start, self.clear_run_len(start, max_len)))
    }

    /// Number of consecutive clear bits starting at `start`, capped at
    /// `max`; `0` if `start` is set or `start >= len()`. Counted word at a
    /// time: whole zero words are skipped eight at a time and the run's end
    /// is found with `trailing_zeros`.
    pub fn clear_run_len(&self, start: u64, max: u64) -> u64 {
        if max == 0 || start >= self.len_bits {
            return 0;
        }
        let first = word_index(start);
        let off = bit_offset(start);
        let avail = WORD_BITS as u32 - off;
        // Shifting brings in zeros from the top, so cap at the bits that are real.
        let head = (self.words[first] >> off).trailing_zeros().min(avail);
        let mut run = u64::from(head);
        if head < avail || run >= max {
            return run.min(max);
        }
        // Words needed to reach `start + max`, bounded by the bitmap's end.
        let want_end = start.saturating_add(max).min(self.len_bits);
        let end_word = want_end.div_ceil(WORD_BITS) as usize;
        let next = first + 1;
        let stop = self.skip_uniform(next, end_word, u64::MAX);
        run += (stop - next) as u64 * WORD_BITS;
        if stop < end_word {
            run += u64::from(self.words[stop].trailing_zeros());
        }
        run.min(max)
    }

    #[inline]
    fn clamp_goal(&self, goal: u64) -> u64 {
        if goal < self.len_bits {
            goal
        } else {
            0
        }
    }

    /// First position in `from..to` whose bit, XORed with `flip`'s bit,
    /// is clear. `flip == 0` finds clear bits; `flip == u64::MAX` finds set
    /// bits. Requires `to <= len_bits`.
    #[inline]
    fn scan(&self, from: u64, to: u64, flip: u64) -> Option<u64> {
        if from >= to {
            return None;
        }
        let first = word_index(from);
        let last = word_index(to - 1);
        // Bits below `from` are made to look "full" so they are never found.
        let head = (self.words[first] ^ flip) | low_mask(bit_offset(from));
        // Test the start's word and the next one together: with scattered
        // answers the hit is usually there, and one well-predicted branch is
        // cheaper than a mispredicted one per word.
        let next = if first < last { self.words[first + 1] ^ flip } else { u64::MAX };
        let pair = u128::from(head) | u128::from(next) << 64;
        let bit = if pair != u128::MAX {
            first as u64 * WORD_BITS + u64::from(pair.trailing_ones())
        } else {
            let index = self.skip_uniform(first + 2, last + 1, flip);
            if index > last {
                return None;
            }
            index as u64 * WORD_BITS + u64::from((self.words[index] ^ flip).trailing_ones())
        };
        // The hit may be past `to` (including a tail bit when finding set
        // bits); then nothing in range matched.
        (bit < to).then_some(bit)
    }

    /// First word index in `from..end` whose word XOR `flip` is not
    /// `u64::MAX`, or `end` if there is none. Eight words are tested per step
    /// with a branch-free AND so the hot loop can be vectorised.
    #[inline]
    fn skip_uniform(&self, from: usize, end: usize, flip: u64) -> usize {
        if from >= end {
            return end;
        }
        let words = &self.words[from..end];
        let mut index = 0;
        for chunk in words.chunks_exact(8) {
            if chunk.iter().fold(u64::MAX, |acc, &w| acc & (w ^ flip)) != u64::MAX {
                break;
            }
            index += 8;
        }
        while index < words.len() && words[index] ^ flip == u64::MAX {
            index += 1;
        }
        from + index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn from_bools(bits: &[bool]) -> Bitmap {
        let mut map = Bitmap::new(bits.len() as u64);
        for (i, &b) in bits.iter().enumerate() {
            if b {
                map.set(i as u64);
            }
        }
        map
    }

    fn naive_run(bits: &[bool], goal: u64, len: u64) -> Option<u64> {
        let n = bits.len() as u64;
        let goal = if goal < n { goal } else { 0 };
        (goal..n).chain(0..goal).find(|&s| s + len <= n && (s..s + len).all(|b| !bits[b as usize]))
    }

    fn naive_run_len(bits: &[bool], start: u64, max: u64) -> u64 {
        bits.iter().skip(start as usize).take_while(|&&b| !b).count().min(max as usize) as u64
    }

    /// Random bitmaps in two flavours: independent bits of random density
    /// (including all-set and nearly-all-set), and runs of random lengths.
    fn bits_strategy() -> impl Strategy<Value = Vec<bool>> {
        let density = (0usize..600, 0u16..=256).prop_flat_map(|(n, thr)| {
            proptest::collection::vec(any::<u8>(), n)
                .prop_map(move |v| v.into_iter().map(|b| u16::from(b) < thr).collect())
        });
        let runs = proptest::collection::vec((any::<bool>(), 1usize..150), 0..12)
            .prop_map(|segs| segs.into_iter().flat_map(|(b, n)| std::iter::repeat_n(b, n)).collect());
        prop_oneof![density, runs]
    }

    #[test]
    fn new_is_clear_with_set_tail() {
        for n in [0u64, 1, 63, 64, 65, 127, 128, 200] {
            let map = Bitmap::new(n);
            assert_eq!(map.len(), n);
            assert_eq!(map.is_empty(), n == 0);
            assert_eq!(map.count_set(), 0);
            assert_eq!(map.as_words().len() as u64, n.div_ceil(64));
            if n % 64 != 0 {
                let last = *map.as_words().last().expect("non-empty");
                assert_eq!(last, !((1u64 << (n % 64)) - 1));
            }
            assert!(map.range_is_clear(0, n));
        }
    }

    #[test]
    fn from_words_forces_tail() {
        let map = Bitmap::from_words(vec![0, 0], 70);
        assert_eq!(map.as_words()[1], !((1u64 << 6) - 1));
        assert_eq!(map.count_set(), 0);
        assert_eq!(map.find_clear(69), Some(69));
        let full = Bitmap::from_words(vec![u64::MAX; 2], 128);
        assert_eq!(full.count_set(), 128);
        assert_eq!(full.find_clear(5), None);
    }

    #[test]
    #[should_panic(expected = "needs 2 words")]
    fn from_words_wrong_count_panics() {
        let _ = Bitmap::from_words(vec![0], 70);
    }

    #[test]
    fn get_set_clear() {
        let mut map = Bitmap::new(130);
        map.set(0);
        map.set(64);
        map.set(129);
        assert!(map.get(0) && map.get(64) && map.get(129));
        assert!(!map.get(1) && !map.get(128));
        assert_eq!(map.count_set(), 3);
        map.clear(64);
        assert!(!map.get(64));
        assert_eq!(map.count_set(), 2);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn get_past_end_panics() {
        let _ = Bitmap::new(10).get(10);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn set_range_past_end_panics() {
        Bitmap::new(100).set_range(90, 11);
    }

    #[test]
    fn all_set_finds_nothing() {
        for n in [1u64, 63, 64, 65, 200, 1000] {
            let mut map = Bitmap::new(n);
            map.set_range(0, n);
            assert_eq!(map.count_set(), n);
            for goal in [0, n / 2, n - 1, n, n + 5] {
                assert_eq!(map.find_clear(goal), None);
                assert_eq!(map.find_clear_bitloop(goal), None);
                assert_eq!(map.find_clear_run(goal, 1), None);
                assert_eq!(map.find_clear_run_upto(goal, 3), None);
            }
        }
        assert_eq!(Bitmap::new(0).find_clear(0), None);
        assert_eq!(Bitmap::new(0).find_clear_run(0, 1), None);
    }

    #[test]
    fn single_clear_bit_every_position_200() {
        for pos in 0..200u64 {
            let mut map = Bitmap::new(200);
            map.set_range(0, 200);
            map.clear(pos);
            for goal in 0..200u64 {
                assert_eq!(map.find_clear(goal), Some(pos), "pos {pos} goal {goal}");
                assert_eq!(map.find_clear_bitloop(goal), Some(pos));
                assert_eq!(map.find_clear_run(goal, 1), Some(pos));
                assert_eq!(map.find_clear_run(goal, 2), None);
                assert_eq!(map.find_clear_run_upto(goal, 5), Some((pos, 1)));
            }
        }
    }

    #[test]
    fn goal_in_last_partial_word() {
        // 150 bits: words 0,1 full, word 2 holds bits 128..150.
        let mut map = Bitmap::new(150);
        map.set_range(0, 150);
        map.clear(10);
        map.clear(140);
        assert_eq!(map.find_clear(130), Some(140));
        assert_eq!(map.find_clear(140), Some(140));
        assert_eq!(map.find_clear(141), Some(10)); // wraps, tail bits never returned
        assert_eq!(map.find_clear(149), Some(10));
        map.clear(149);
        assert_eq!(map.find_clear(141), Some(149));
        assert_eq!(map.find_clear_run(141, 2), None);
        map.clear(148);
        assert_eq!(map.find_clear_run(0, 2), Some(148));
        assert_eq!(map.find_clear_run_upto(145, 64), Some((148, 2)));
    }

    #[test]
    fn runs_do_not_wrap() {
        let mut map = Bitmap::new(100);
        map.set_range(5, 90);
        // Clear 0..5 and 95..100: 10 free bits, but no run of 6.
        assert_eq!(map.find_clear_run(96, 5), Some(0));
        assert_eq!(map.find_clear_run(0, 6), None);
        assert_eq!(map.find_clear_run_upto(97, 10), Some((97, 3)));
        assert_eq!(map.find_clear_run(50, 5), Some(95));
    }

    #[test]
    fn long_runs_across_words() {
        let mut map = Bitmap::new(10_000);
        map.set_range(0, 10_000);
        map.clear_range(1_000, 5_000);
        assert_eq!(map.find_clear_run(0, 5_000), Some(1_000));
        assert_eq!(map.find_clear_run(0, 5_001), None);
        assert_eq!(map.find_clear_run(1_001, 4_999), Some(1_001));
        assert_eq!(map.clear_run_len(1_000, u64::MAX), 5_000);
        assert_eq!(map.clear_run_len(1_037, 3_000), 3_000);
        assert_eq!(map.find_clear_run_upto(0, 100_000), Some((1_000, 5_000)));
        let empty = Bitmap::new(640);
        assert_eq!(empty.clear_run_len(3, u64::MAX), 637);
        assert_eq!(empty.find_clear_run(0, 640), Some(0));
        assert_eq!(empty.find_clear_run(1, 640), Some(0));
        assert_eq!(empty.find_clear_run(1, 641), None);
    }

    proptest! {
        #[test]
        fn find_clear_matches_bitloop(bits in bits_strategy(), goal in 0u64..700) {
            let map = from_bools(&bits);
            let n = bits.len() as u64;
            for g in [goal, goal % n.max(1), n.saturating_sub(1), n.saturating_sub(goal % 64 + 1)] {
                let expected = map.find_clear_bitloop(g);
                prop_assert_eq!(map.find_clear(g), expected);
                if let Some(bit) = expected {
                    prop_assert!(!bits[bit as usize]);
                }
            }
        }

        #[test]
        fn find_clear_run_matches_naive(bits in bits_strategy(), goal in 0u64..700, len in 1u64..200) {
            let map = from_bools(&bits);
            prop_assert_eq!(map.find_clear_run(goal, len), naive_run(&bits, goal, len));
            let small = len % 8 + 1;
            prop_assert_eq!(map.find_clear_run(goal, small), naive_run(&bits, goal, small));
        }

        #[test]
        fn find_clear_run_upto_matches_naive(bits in bits_strategy(), goal in 0u64..700, max in 1u64..200) {
            let map = from_bools(&bits);
            let expected = map
                .find_clear_bitloop(goal)
                .map(|s| (s, naive_run_len(&bits, s, max)));
            prop_assert_eq!(map.find_clear_run_upto(goal, max), expected);
        }

        #[test]
        fn find_in_ranges_match_naive(bits in bits_strategy(), a in 0u64..700, b in 0u64..700) {
            let map = from_bools(&bits);
            let n = bits.len() as u64;
            let (from, to) = (a.min(n), b.min(n));
            let clear = (from..to).find(|&i| !bits[i as usize]);
            let set = (from..to).find(|&i| bits[i as usize]);
            prop_assert_eq!(map.find_clear_in(from, to), clear);
            prop_assert_eq!(map.find_set_in(from, to), set);
            if from <= to {
                prop_assert_eq!(map.range_is_clear(from, to - from), set.is_none());
            }
            prop_assert_eq!(map.clear_run_len(from, b), naive_run_len(&bits, from, b));
        }

        #[test]
        fn ranges_match_per_bit_reference(
            n in 1u64..600,
            ops in proptest::collection::vec((any::<bool>(), 0u64..600, 0u64..300), 1..40),
        ) {
            let mut map = Bitmap::new(n);
            let mut reference = vec![false; n as usize];
            for (set, start, len) in ops {
                let start = start % n;
                let len = len.min(n - start);
                if set {
                    map.set_range(start, len);
                } else {
                    map.clear_range(start, len);
                }
                for b in start..start + len {
                    reference[b as usize] = set;
                }
                prop_assert_eq!(&map, &from_bools(&reference));
                let used = reference.iter().filter(|&&b| b).count() as u64;
                prop_assert_eq!(map.count_set(), used);
                prop_assert_eq!(
                    map.range_is_clear(start, len),
                    reference[start as usize..(start + len) as usize].iter().all(|&b| !b)
                );
            }
            // Tail bits stay set whatever the operations did.
            let tail = tail_mask(n);
            let last = *map.as_words().last().expect("n > 0");
            prop_assert_eq!(last & tail, tail);
        }
    }
}
