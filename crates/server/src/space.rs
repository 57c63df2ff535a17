//! Low space: when the image runs short, clients stop answering changes themselves.
//!
//! A client holding exclusive rights answers creates and writes itself and writes them
//! back later (up to `crest_net`'s 64 MiB in flight). Near full, the server would refuse
//! some of those after the call had succeeded, and a file would lose its data or a name
//! vanish with the error reported, at best, at a later close. So while the space left is
//! below what clients may have in flight, the server holds no exclusive rights: it
//! recalls them all as space runs low (each client writes back what it holds, then sends
//! its changes one by one, and ENOSPC reaches the call that caused it), refuses to give
//! a directory whole (`Acquire`), and recalls what a create grants as soon as it is
//! granted. Space above the threshold by half again ends the low state.

use crest_store::StatFs;

/// What one client may have written back and not yet acknowledged (`crest_net`'s
/// `MAX_ASYNC_BYTES`).
const IN_FLIGHT_PER_CLIENT: u64 = 64 << 20;

/// Whether the image is short of space, with hysteresis.
#[derive(Debug, Default)]
pub(crate) struct SpaceWatch {
    low: bool,
}

impl SpaceWatch {
    /// True while clients must not answer changes themselves.
    pub(crate) fn low(&self) -> bool {
        self.low
    }

    /// Looks at the space left with `clients` sessions connected; returns true when the
    /// image has just become short (every exclusive right is then to be recalled).
    pub(crate) fn update(&mut self, st: &StatFs, clients: usize) -> bool {
        let total = st.total_blocks * u64::from(st.block_size);
        let avail = st.avail_blocks * u64::from(st.block_size);
        // Never more than an eighth of the image: a small one is not all slow.
        let threshold = (IN_FLIGHT_PER_CLIENT * clients.max(1) as u64).min(total / 8);
        let was = self.low;
        if avail < threshold {
            self.low = true;
        } else if avail >= threshold + threshold / 2 {
            self.low = false;
        }
        if self.low != was {
            tracing::info!(low = self.low, avail, threshold, "space short: clients send changes one by one");
        }
        self.low && !was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(total_mib: u64, avail_mib: u64) -> StatFs {
        StatFs {
            block_size: 4096,
            total_blocks: total_mib * 256,
            free_blocks: avail_mib * 256,
            avail_blocks: avail_mib * 256,
            files: 1,
            files_free: 1,
            name_max: 255,
        }
    }

    #[test]
    fn low_below_what_clients_may_hold_with_hysteresis() {
        let mut w = SpaceWatch::default();
        assert!(!w.update(&st(8192, 1000), 2));
        assert!(!w.low());
        assert!(w.update(&st(8192, 127), 2), "below 2 x 64 MiB");
        assert!(!w.update(&st(8192, 100), 2), "told once");
        assert!(w.low());
        assert!(!w.update(&st(8192, 150), 2) && w.low(), "stays low until half again above");
        assert!(!w.update(&st(8192, 192), 2) && !w.low());
        // A small image: an eighth of it.
        assert!(w.update(&st(64, 7), 1));
        assert!(!w.update(&st(64, 12), 1) && !w.low());
    }
}
