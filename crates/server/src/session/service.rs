//! How long the server's thread spends on each request, by kind (the kind of its first
//! operation: a create that opens counts as a create), for `crest status`, `crest stats`
//! and the Prometheus histogram. The driver measures (the core has no clock) and records
//! it here; a request that waits for another session's rights counts the time of each run,
//! not the wait. Memory is bounded by the kinds of operation there are.

use std::collections::BTreeMap;

use crest_nvlist::{NvList, Value};

/// Upper bounds of the histogram's buckets, in microseconds (the last bucket, above them
/// all, is the count).
pub const SERVICE_BUCKETS_US: [u64; 12] = [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 100_000, 1_000_000];

/// One kind's times.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Histogram {
    count: u64,
    /// Nanoseconds (a request served from memory takes less than a microsecond).
    sum_ns: u64,
    /// Requests that took at most each bound (and more than the one before).
    buckets: [u64; SERVICE_BUCKETS_US.len()],
}

/// Every kind's.
#[derive(Debug, Default)]
pub(super) struct ServiceTimes {
    by_kind: BTreeMap<&'static str, Histogram>,
}

impl ServiceTimes {
    pub(super) fn record(&mut self, kind: &'static str, nanos: u64) {
        let h = self.by_kind.entry(kind).or_default();
        h.count += 1;
        h.sum_ns = h.sum_ns.saturating_add(nanos);
        if let Some(i) = SERVICE_BUCKETS_US.iter().position(|&b| nanos <= b.saturating_mul(1000)) {
            h.buckets[i] += 1;
        }
    }

    /// As the status lists it: per kind, `count`, `sum_ns` and `le_<bound µs>` (cumulative, as
    /// Prometheus counts a histogram's buckets).
    pub(super) fn to_nvlist(&self) -> NvList {
        let mut out = NvList::new();
        for (kind, h) in &self.by_kind {
            let mut l = NvList::new();
            let _ = l.add("count", Value::U64(h.count));
            let _ = l.add("sum_ns", Value::U64(h.sum_ns));
            let mut below = 0;
            for (bound, n) in SERVICE_BUCKETS_US.iter().zip(h.buckets) {
                below += n;
                let _ = l.add(format!("le_{bound}"), Value::U64(below));
            }
            let _ = out.add(*kind, Value::List(l));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_land_in_cumulative_buckets_and_add_up() {
        let mut t = ServiceTimes::default();
        // Each bound itself, one past it, and past the last bound.
        for &b in &SERVICE_BUCKETS_US {
            t.record("lookup", b * 1000);
            t.record("lookup", b * 1000 + 1);
        }
        t.record("write", 0);
        let l = t.to_nvlist();
        let Some(Value::List(lookup)) = l.get("lookup") else { panic!("no lookup: {l:?}") };
        let n = SERVICE_BUCKETS_US.len() as u64;
        assert_eq!(lookup.get_u64("count"), Some(2 * n));
        let sum: u64 = SERVICE_BUCKETS_US.iter().map(|b| 2 * b * 1000 + 1).sum();
        assert_eq!(lookup.get_u64("sum_ns"), Some(sum));
        for (i, b) in SERVICE_BUCKETS_US.iter().enumerate() {
            // At most `b`: every bound up to it, and every bound-plus-one below it.
            assert_eq!(lookup.get_u64(&format!("le_{b}")), Some(2 * i as u64 + 1), "le_{b}");
        }
        let Some(Value::List(write)) = l.get("write") else { panic!("no write") };
        assert_eq!((write.get_u64("count"), write.get_u64("le_10")), (Some(1), Some(1)));
    }
}
