//! Benchmarks for crest-rng: criterion measurements, then a plain table that
//! compares the thread-local streams against a lock-protected generator, the
//! OS generator and the seed's xorshift128+ (SPL, 2014).
//!
//! Run with `cargo bench -p crest-rng`. Under `cargo test --benches` the
//! criterion benches run once each and the table uses tiny loop counts.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crest_rng::rand_core::{Rng, SeedableRng};
use crest_rng::{Stream, Xoshiro256PlusPlus};
use criterion::{BenchmarkId, Criterion, Throughput};

const MIB: usize = 1 << 20;

/// The seed's generator, xorshift128+ (Vigna), as in SPL's `spl_rand_next`.
struct XorShift128Plus {
    s: [u64; 2],
}

impl XorShift128Plus {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        let mut s1 = self.s[0];
        let s0 = self.s[1];
        self.s[0] = s0;
        s1 ^= s1 << 23;
        self.s[1] = s1 ^ s0 ^ (s1 >> 18) ^ (s0 >> 5);
        self.s[1].wrapping_add(s0)
    }
}

fn xorshift() -> XorShift128Plus {
    XorShift128Plus { s: [0x9E37_79B9_7F4A_7C15, 0xBF58_476D_1CE4_E5B9] }
}

fn os_u64() -> u64 {
    getrandom::u64().expect("OS random number generator")
}

fn criterion_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("u64");
    group.throughput(Throughput::Bytes(8));
    group.bench_function("thread_local", |b| b.iter(|| black_box(crest_rng::next_u64())));
    let mut stream = Stream::from_seed_u64(1);
    group.bench_function("stream", |b| b.iter(|| black_box(stream.next_u64())));
    let shared = Mutex::new(Xoshiro256PlusPlus::seed_from_u64(1));
    group.bench_function("mutex_shared", |b| b.iter(|| black_box(shared.lock().expect("lock").next_u64())));
    group.bench_function("getrandom_os", |b| b.iter(|| black_box(os_u64())));
    let mut xs = xorshift();
    group.bench_function("xorshift128plus_seed", |b| b.iter(|| black_box(xs.next_u64())));
    group.bench_function("below_1000", |b| b.iter(|| black_box(crest_rng::below(black_box(1000)))));
    group.finish();

    let mut group = c.benchmark_group("fill");
    group.throughput(Throughput::Bytes(MIB as u64));
    group.sample_size(10);
    let mut buf = vec![0u8; MIB];
    group.bench_with_input(BenchmarkId::new("thread_local", "1MiB"), &(), |b, ()| {
        b.iter(|| crest_rng::fill_bytes(black_box(&mut buf)))
    });
    group.bench_with_input(BenchmarkId::new("getrandom_os", "1MiB"), &(), |b, ()| {
        b.iter(|| getrandom::fill(black_box(&mut buf)).expect("OS random number generator"))
    });
    group.finish();

    let mut stream = Stream::from_seed_u64(2);
    c.bench_function("jump", |b| b.iter(|| black_box(&mut stream).jump()));
}

/// Best-of-`runs` nanoseconds per call of `f` over `iters` calls.
fn ns_per_op(runs: u32, iters: u64, mut f: impl FnMut() -> u64) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let start = Instant::now();
        let mut acc = 0u64;
        for _ in 0..iters {
            acc = acc.wrapping_add(f());
        }
        black_box(acc);
        best = best.min(start.elapsed());
    }
    best.as_nanos() as f64 / iters as f64
}

/// Best-of-`runs` GB/s (10^9 bytes per second) filling a 1 MiB buffer.
fn gb_per_s(runs: u32, iters: u64, mut fill: impl FnMut(&mut [u8])) -> f64 {
    let mut buf = vec![0u8; MIB];
    let ns = ns_per_op(runs, iters, || {
        fill(black_box(&mut buf));
        u64::from(buf[MIB - 1])
    });
    MIB as f64 / ns
}

/// ns per u64 per thread with `threads` threads each calling `f` `iters` times.
fn ns_per_op_threads(threads: usize, iters: u64, f: impl Fn() -> u64 + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut acc = 0u64;
                for _ in 0..iters {
                    acc = acc.wrapping_add(f());
                }
                black_box(acc)
            });
        }
    });
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn print_table(full: bool) {
    // Loop counts sized for a few hundred ms per row in bench mode.
    let scale = if full { 1 } else { 1000 };
    let fast = 50_000_000 / scale;
    let runs = if full { 5 } else { 1 };

    let tl = ns_per_op(runs, fast, crest_rng::next_u64);
    let mut stream = Stream::from_seed_u64(3);
    let st = ns_per_op(runs, fast, || stream.next_u64());
    let shared = Mutex::new(Xoshiro256PlusPlus::seed_from_u64(3));
    let mx = ns_per_op(runs, 10_000_000 / scale, || shared.lock().expect("lock").next_u64());
    let os = ns_per_op(runs, 200_000 / scale, os_u64);
    let mut xs = xorshift();
    let xsn = ns_per_op(runs, fast, || xs.next_u64());
    let bl = ns_per_op(runs, fast / 2, || crest_rng::below(1000));
    let mut js = Stream::from_seed_u64(4);
    let jump = ns_per_op(runs, 100_000 / scale, || {
        js.jump();
        0
    });

    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    let tl_mt = ns_per_op_threads(threads, 20_000_000 / scale, crest_rng::next_u64);
    let mx_mt = ns_per_op_threads(threads, 2_000_000 / scale, || shared.lock().expect("lock").next_u64());

    let fill_tl = gb_per_s(runs, 400 / scale.min(400), crest_rng::fill_bytes);
    let mut fs = Stream::from_seed_u64(5);
    let fill_st = gb_per_s(runs, 400 / scale.min(400), |b| fs.fill_bytes(b));
    let fill_os = gb_per_s(runs, 30 / scale.min(30), |b| getrandom::fill(b).expect("OS random number generator"));

    println!();
    println!("crest-rng: ns per u64 (best of {runs} timed loops, std::time::Instant)");
    println!("{:<52} {:>10} {:>12}", "generator", "ns/u64", "x faster vs OS");
    let row = |name: &str, ns: f64| println!("{name:<52} {ns:>10.2} {:>12.1}", os / ns);
    row("(a) crest_rng::next_u64 (thread-local stream)", tl);
    row("(b) Stream::next_u64 (owned xoshiro256++)", st);
    row("(c) Mutex<Xoshiro256PlusPlus> shared (lock per u64)", mx);
    row("(d) getrandom::u64 (OS entropy, per u64)", os);
    row("(e) xorshift128+ (the seed's generator, inline)", xsn);
    row("    crest_rng::below(1000) (thread-local)", bl);
    row(&format!("(a) thread-local, {threads} threads at once (per thread)"), tl_mt);
    row(&format!("(c) Mutex shared, {threads} threads at once (per thread)"), mx_mt);
    println!("{:<52} {:>10.1}", "Stream::jump (2^128 steps), ns", jump);
    println!();
    println!("{:<52} {:>10} {:>12}", "fill 1 MiB", "GB/s", "x vs OS");
    let row = |name: &str, gbs: f64| println!("{name:<52} {gbs:>10.2} {:>12.1}", gbs / fill_os);
    row("crest_rng::fill_bytes (thread-local)", fill_tl);
    row("Stream::fill_bytes", fill_st);
    row("getrandom::fill (OS)", fill_os);
    println!();
    println!(
        "seed (SPL 2014): xorshift128+ at 1.12 ns per 64 bits (7.14 GB/s) on an i7-4770; \
         OS get_random_bytes() at 16.3 MB/s; 50x less CPU in random_get_pseudo_bytes()"
    );
    println!(
        "here: thread-local {tl:.2} ns per 64 bits ({:.2} GB/s fill), {:.0}x less CPU per u64 than the OS generator",
        fill_tl,
        os / tl
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    print_table(full);
}
