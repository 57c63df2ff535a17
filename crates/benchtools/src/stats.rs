//! Latency summaries: exact percentiles of collected samples, and a lock-free histogram with
//! 1 µs buckets for measurements taken on hot paths (the proxy's release lateness).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A summary of latency samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min_us: f64,
    /// Median (nearest rank).
    pub median_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

impl Summary {
    /// Summarizes `samples` (any order); `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let rank = |q: f64| us[(((n as f64) * q).ceil() as usize).clamp(1, n) - 1];
        Some(Summary {
            n,
            min_us: us[0],
            median_us: rank(0.5),
            p99_us: rank(0.99),
            max_us: us[n - 1],
            mean_us: us.iter().sum::<f64>() / n as f64,
        })
    }
}

impl fmt::Display for Summary {
    /// `key=value` pairs, easy to read and to parse from a shell script.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={} median_us={:.1} p99_us={:.1} mean_us={:.1} min_us={:.1} max_us={:.1}",
            self.n, self.median_us, self.p99_us, self.mean_us, self.min_us, self.max_us
        )
    }
}

/// Buckets of the histogram: one per microsecond up to this, then one overflow bucket.
const BUCKETS_US: usize = 10_000;

/// A histogram of durations with 1 µs buckets up to 10 ms, safe to update from many
/// threads without locks.
pub struct Histogram {
    buckets: Vec<AtomicU64>,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: (0..=BUCKETS_US).map(|_| AtomicU64::new(0)).collect(), max_ns: AtomicU64::new(0) }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram").field("count", &self.count()).finish()
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn record(&self, d: Duration) {
        let us = usize::try_from(d.as_micros()).unwrap_or(usize::MAX).min(BUCKETS_US);
        self.buckets[us].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How many durations were counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The bucket (in whole microseconds, rounded down) holding quantile `q` (0..=1);
    /// `None` when empty. The overflow bucket reads as 10,000 µs.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (us, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= want {
                return Some(us as u64);
            }
        }
        Some(BUCKETS_US as u64)
    }

    /// The largest duration counted.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_percentiles() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Summary::of(&samples).expect("samples");
        assert_eq!(s.n, 100);
        assert!((s.median_us - 50.0).abs() < 1e-9);
        assert!((s.p99_us - 99.0).abs() < 1e-9);
        assert!((s.min_us - 1.0).abs() < 1e-9 && (s.max_us - 100.0).abs() < 1e-9);
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn histogram_quantiles() {
        let h = Histogram::default();
        assert_eq!(h.quantile_us(0.5), None);
        for us in 0..100 {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_secs(5));
        assert_eq!(h.count(), 101);
        assert_eq!(h.quantile_us(0.5), Some(50));
        assert_eq!(h.quantile_us(1.0), Some(10_000));
        assert_eq!(h.max(), Duration::from_secs(5));
    }
}
