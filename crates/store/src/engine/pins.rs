//! Read pins: what keeps blocks from reuse while another thread reads them.
//!
//! A read handed to another thread (`ReadPlan`) names blocks the trees held when it was
//! planned. Blocks a transaction stops using become allocatable two commits later
//! (`Pager::finish_commit`) and may then be written again. So a plan pins the runs it
//! reads, and a freed run due back to the allocator is split: what a live pin covers
//! waits (`Pager::held`) for a later commit, the rest goes free. A pinned read never sees
//! a block rewritten under it, and nothing else waits for it. Pins live microseconds to
//! milliseconds (a read of up to a few MiB).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Runs of blocks, `(start, len)`.
pub(crate) type Runs = Vec<(u64, u64)>;

/// The runs of the reads still running elsewhere, by pin.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    live: Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    last_id: u64,
    runs: HashMap<u64, Runs>,
}

impl Pins {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins `runs` until the returned pin drops.
    pub(crate) fn pin(self: &Arc<Self>, runs: Runs) -> ReadPin {
        let mut live = self.lock();
        live.last_id += 1;
        let id = live.last_id;
        live.runs.insert(id, runs);
        ReadPin { pins: Arc::clone(self), id }
    }

    /// Splits freed runs into those that may go free now and those a live pin covers
    /// (`(free, held)`).
    pub(crate) fn split(&self, runs: Runs) -> (Runs, Runs) {
        let live = self.lock();
        if live.runs.is_empty() {
            return (runs, Vec::new());
        }
        let mut pinned: Runs = live.runs.values().flatten().copied().collect();
        drop(live);
        pinned.sort_unstable();
        let (mut free, mut held) = (Vec::new(), Vec::new());
        for (start, len) in runs {
            let end = start + len;
            let mut at = start;
            for &(p, n) in pinned.iter().filter(|&&(p, n)| p < end && start < p + n) {
                if p > at {
                    free.push((at, p - at));
                }
                let (from, to) = (p.max(at), (p + n).min(end));
                if to > from {
                    held.push((from, to - from));
                    at = to;
                }
            }
            if at < end {
                free.push((at, end - at));
            }
        }
        (free, held)
    }
}

/// Keeps the runs a read planned for another thread reads from reuse while it lives.
#[derive(Debug)]
pub struct ReadPin {
    pins: Arc<Pins>,
    id: u64,
}

impl Drop for ReadPin {
    fn drop(&mut self) {
        self.pins.lock().runs.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_run_is_held_where_a_live_pin_covers_it() {
        let pins = Arc::new(Pins::default());
        assert_eq!(pins.split(vec![(10, 5)]), (vec![(10, 5)], vec![]));
        let a = pins.pin(vec![(12, 2), (30, 10)]);
        let b = pins.pin(vec![(13, 4), (50, 1)]);
        // 10..20 against 12..14 and 13..17; 25..35 against 30..40; 50..51 whole.
        let (free, held) = pins.split(vec![(10, 10), (25, 10), (50, 1), (60, 3)]);
        assert_eq!(free, vec![(10, 2), (17, 3), (25, 5), (60, 3)]);
        assert_eq!(held, vec![(12, 2), (14, 3), (30, 5), (50, 1)]);
        drop(a);
        assert_eq!(pins.split(vec![(10, 10)]), (vec![(10, 3), (17, 3)], vec![(13, 4)]));
        drop(b);
        assert_eq!(pins.split(vec![(10, 10)]), (vec![(10, 10)], vec![]));
    }
}
