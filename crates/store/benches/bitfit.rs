//! Word-at-a-time `Bitmap::find_clear` against the bit-by-bit loop
//! `Bitmap::find_clear_bitloop`, on the scenario of GFS2's `gfs2_bitfit`
//! rewrite (Red Hat bug 435456 / 446085) and two contrasting ones:
//!
//! - `seed-50MB`: a 50 MB bitmap (50 * 1024 * 1024 * 8 bits), all used
//!   except one free block 400 blocks from the end; one search from a goal
//!   25% in. The seed reported ~4x for its word-aligned algorithm here.
//! - `fragmented`: same size, ~97% used at random (fixed-seed xorshift), free
//!   bits scattered; 2^20 successive next-free searches from a goal 25% in,
//!   each search starting just past the previous answer.
//! - `nearly-empty`: same size, ~1% used at random; the same successive
//!   searches (nearly every search answers at its goal).
//!
//! Under `cargo bench` a plain table is printed first (best of a few
//! `Instant`-timed repetitions), then criterion measures the same searches.
//! Under `cargo test --benches` only a quick agreement check runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crest_store::bitmap::Bitmap;
use criterion::{Criterion, SamplingMode, Throughput};

/// Bits in the seed's 50 MB bitmap.
const SEED_BITS: u64 = 50 * 1024 * 1024 * 8;
/// Searches per run in the successive-goal cases.
const SUCCESSIVE_SEARCHES: usize = 1 << 20;
/// Repetitions for the plain table; the minimum is reported.
const TABLE_REPS: usize = 5;

/// Marsaglia xorshift64: fixed seed, so every run builds the same bitmaps.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A word whose bits are each set with probability 2^-k (AND of k words).
    fn sparse_word(&mut self, k: u32) -> u64 {
        (0..k).fold(u64::MAX, |acc, _| acc & self.next())
    }
}

struct Case {
    name: &'static str,
    map: Bitmap,
    goal: u64,
    searches: usize,
}

fn seed_case(bits: u64) -> Case {
    let mut map = Bitmap::from_words(vec![u64::MAX; (bits / 64) as usize], bits);
    map.clear(bits - 400);
    Case { name: "seed-50MB", map, goal: bits / 4, searches: 1 }
}

fn random_case(name: &'static str, bits: u64, searches: usize, used: bool, k: u32) -> Case {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let words = (0..bits / 64)
        .map(|_| {
            let sparse = rng.sparse_word(k);
            // `used`: the sparse bits are the used ones; else they are the free ones.
            if used {
                sparse
            } else {
                !sparse
            }
        })
        .collect();
    Case { name, map: Bitmap::from_words(words, bits), goal: bits / 4, searches }
}

type Finder = fn(&Bitmap, u64) -> Option<u64>;

/// Runs the case's searches, each from just past the previous answer.
/// Returns (bits scanned, sum of answers) so two finders can be compared.
fn run(case: &Case, find: Finder) -> (u64, u64) {
    let len = case.map.len();
    let mut goal = case.goal;
    let (mut scanned, mut sum) = (0u64, 0u64);
    for _ in 0..case.searches {
        let Some(found) = find(black_box(&case.map), black_box(goal)) else {
            break;
        };
        scanned += if found >= goal { found - goal + 1 } else { len - goal + found + 1 };
        sum = sum.wrapping_add(found);
        goal = found + 1;
    }
    (scanned, sum)
}

fn best_of(case: &Case, find: Finder) -> Duration {
    (0..TABLE_REPS)
        .map(|_| {
            let start = Instant::now();
            black_box(run(case, find));
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn word_at_a_time(map: &Bitmap, goal: u64) -> Option<u64> {
    map.find_clear(goal)
}

fn bit_loop(map: &Bitmap, goal: u64) -> Option<u64> {
    map.find_clear_bitloop(goal)
}

fn gb_per_s(bytes: f64, time: Duration) -> f64 {
    bytes / time.as_secs_f64() / 1e9
}

fn main() {
    let started = Instant::now();
    let bench_mode = std::env::args().any(|a| a == "--bench");
    // Outside `cargo bench` (e.g. `cargo test --benches`, unoptimised) the
    // agreement check runs on 1/64-size bitmaps to stay quick.
    let (bits, searches) =
        if bench_mode { (SEED_BITS, SUCCESSIVE_SEARCHES) } else { (SEED_BITS / 64, SUCCESSIVE_SEARCHES / 64) };
    let cases = [
        seed_case(bits),
        random_case("fragmented", bits, searches, false, 5),
        random_case("nearly-empty", bits, searches, true, 7),
    ];

    // Both finders must agree before anything is timed.
    let mut scanned_bytes = Vec::new();
    for case in &cases {
        let fast = run(case, word_at_a_time);
        let slow = run(case, bit_loop);
        assert_eq!(fast, slow, "{}: find_clear disagrees with the bit loop", case.name);
        scanned_bytes.push(fast.0 / 8);
    }
    if !bench_mode {
        println!("bitfit: finders agree on all cases (timing skipped outside `cargo bench`)");
        return;
    }

    println!();
    println!(
        "{:<13} {:>6} {:>8} {:>10} {:>14} {:>12} {:>9} {:>9} {:>8}",
        "case", "used%", "searches", "scanned", "word-at-a-time", "bit-loop", "word GB/s", "bit GB/s", "speedup"
    );
    let mut times = Vec::new();
    for (case, &bytes) in cases.iter().zip(&scanned_bytes) {
        let fast = best_of(case, word_at_a_time);
        let slow = best_of(case, bit_loop);
        times.push((fast, slow));
        let used = case.map.count_set() as f64 / case.map.len() as f64 * 100.0;
        println!(
            "{:<13} {:>6.2} {:>8} {:>8.2}MB {:>12.3}ms {:>10.3}ms {:>9.2} {:>9.3} {:>7.1}x",
            case.name,
            used,
            case.searches,
            bytes as f64 / 1e6,
            fast.as_secs_f64() * 1e3,
            slow.as_secs_f64() * 1e3,
            gb_per_s(bytes as f64, fast),
            gb_per_s(bytes as f64, slow),
            slow.as_secs_f64() / fast.as_secs_f64(),
        );
    }
    println!("(best of {TABLE_REPS}; scanned = bitmap bytes from each goal to its answer, summed)");
    println!();

    let mut criterion =
        Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).configure_from_args();
    for ((case, &bytes), &(fast, slow)) in cases.iter().zip(&scanned_bytes).zip(&times) {
        let mut group = criterion.benchmark_group(format!("bitfit/{}", case.name));
        group.sampling_mode(SamplingMode::Flat).throughput(Throughput::Bytes(bytes));
        // Ten flat samples need about ten runs; leave a little headroom.
        let budget = |t: Duration| (t * 12).clamp(Duration::from_millis(300), Duration::from_secs(5));
        group.measurement_time(budget(fast));
        group.bench_function("find_clear", |b| b.iter(|| run(case, word_at_a_time)));
        group.measurement_time(budget(slow));
        group.bench_function("find_clear_bitloop", |b| b.iter(|| run(case, bit_loop)));
        group.finish();
    }
    criterion.final_summary();
    println!("bitfit: total bench time {:.1}s", started.elapsed().as_secs_f64());
}
