//! The server's disk path, backend against backend (`FileDisk` = sync, `PoolDisk` = pool,
//! `UringDisk` = uring), on a real file (default `/var/tmp`; `CREST_BENCH_DIR` moves it;
//! the file system type is printed, keep it off tmpfs):
//!
//! - `batch/N`: a commit-like batch of N random 4 KiB writes (sorted by offset, as the
//!   store sorts them) scattered over a 1 GiB file written full of zeros beforehand (one
//!   file per backend, kept open through the run), then `flush` (fdatasync). N = 1,000
//!   and 10,000.
//! - small commits: 100 times 16 random 4 KiB writes, flush, a 512-byte superblock write,
//!   flush (what a client's fsync costs).
//! - `store/smallfiles`: `Store::mkfs` on a fresh image, create `CREST_BENCH_FILES`
//!   (20,000) files of 100 bytes in 200 directories, commit. The contents are inline, so
//!   the disk sees only commit batches and flushes.
//! - `store/datafiles`: the same with 1,000 files of 64 KiB: the data goes through
//!   `write_at` as it is written (asynchronous in the uring backend).
//!
//! `CREST_BENCH_PREFILL=1` writes zeros over each store image first (allocated blocks,
//! like a block device or an image that has been full; by default images are sparse).
//!
//! A plain table comes first: repetitions alternate between backends (to spread the noise
//! of a shared machine over all of them), and the median and its ratio to sync are shown.
//! Criterion then measures the batches, one backend after the other (same offsets for
//! each). Under `cargo test --benches` (no `--bench`) every case runs once at a tiny size
//! as a correctness smoke test.
//!
//! Measured 2026-11 on the development VM (`cargo bench -p crest-store --bench diskio`,
//! ext4 on /dev/vda (virtio), 2 cores shared with other builds and tests, load 3-5), two
//! runs; ratios are speed vs sync (above 1 = faster):
//!
//! | case | pool | uring | uring-buf |
//! |---|---|---|---|
//! | (a) 1,000 writes, table | 0.66, 0.92 | 1.83, 1.67 | 0.64, 0.55 |
//! | (a) 10,000 writes, table | 0.88, 0.84 | 1.80, 1.64 | 0.68, 0.69 |
//! | (a) 1,000 writes, criterion | 0.74, 1.08 | 1.67, 1.50 | 0.45, 1.06 |
//! | (a) 10,000 writes, criterion | 0.99, 1.00 | 1.93, 1.82 | 0.80, 0.64 |
//! | (d) small commits | 0.86, 0.91 | 1.21, 0.98 | 0.69, 0.97 |
//! | (b) 20,000 small files | 0.99, 1.06 | 1.19, 1.00 | 0.82, 0.93 |
//! | (c) 1,000 files of 64 KiB | 0.88, 0.95 | 1.02, 0.83 | 0.81, 0.92 |
//!
//! Sync itself: 27-32K writes/s at 1,000, 53-54K at 10,000, 1.15 ms per small commit.
//! Run-to-run noise on this machine is about +-20%: what repeats is uring's 1.5-1.9x on
//! commit batches; the rest is within noise (the store workloads are mostly CPU). So
//! `crest serve` defaults to `uring`. An earlier version of this bench had all backends
//! share one file and reopen it for every run; there uring's direct writes landed on
//! pages the buffered backends had just written, paid for evicting them, and measured
//! 0.7-1.3x: keep one file per backend.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crest_rng::Stream;
use crest_store::{Disk, DiskIo, FileKind, MkfsOptions, Store, Timespec, UringDisk, ROOT_INO};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput};

const BLOCK: usize = 4096;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// File system type and device of the mount holding `path`, from /proc/mounts.
fn filesystem_of(path: &Path) -> String {
    let Ok(canon) = path.canonicalize() else { return "unknown".into() };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 2 && canon.starts_with(f[1])).then(|| (f[1].len(), format!("{} on {} ({})", f[2], f[1], f[0])))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "unknown".into(), |(_, s)| s)
}

/// A backend under test: the three of `crest serve --disk-io`, and io_uring with its
/// batches buffered (what it would be without `O_DIRECT`).
#[derive(Clone, Copy, Debug)]
enum Backend {
    Io(DiskIo),
    UringBuffered,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Io(io) => io.name(),
            Backend::UringBuffered => "uring-buf",
        }
    }

    fn open(self, path: &Path) -> Box<dyn Disk> {
        match self {
            Backend::Io(io) => io.open(path).expect("open image"),
            Backend::UringBuffered => Box::new(UringDisk::open(path).expect("open image").buffered()),
        }
    }

    fn create(self, path: &Path, size: u64) -> Box<dyn Disk> {
        match self {
            Backend::Io(io) => io.create(path, size).expect("create image"),
            Backend::UringBuffered => Box::new(UringDisk::create(path, size).expect("create image").buffered()),
        }
    }
}

/// The backends usable here: uring only when the kernel lets us set up a ring.
fn backends(probe: &Path) -> Vec<Backend> {
    let mut v = vec![Backend::Io(DiskIo::Sync), Backend::Io(DiskIo::Pool)];
    match UringDisk::create(probe, 1 << 20) {
        Ok(d) => {
            println!("io_uring available; O_DIRECT batches: {}", d.is_direct());
            v.push(Backend::Io(DiskIo::Uring));
            v.push(Backend::UringBuffered);
        }
        Err(e) => println!("uring skipped: {e}"),
    }
    let _ = std::fs::remove_file(probe);
    v
}

/// `n` distinct random block offsets in a file of `file_blocks` blocks, sorted.
fn random_offsets(rng: &mut Stream, n: usize, file_blocks: u64) -> Vec<u64> {
    let mut set = std::collections::BTreeSet::new();
    while set.len() < n {
        set.insert(rng.below(file_blocks) * BLOCK as u64);
    }
    set.into_iter().collect()
}

/// Writes zeros over the whole file so the batches overwrite allocated blocks (like a
/// block device; a sparse file would make the first backend pay for block allocation).
fn prefill(path: &Path, size: u64) {
    let disk = DiskIo::Sync.create(path, size).expect("create batch file");
    let mut disk = disk;
    let zeros = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        disk.write_at(off, &zeros).expect("prefill");
        off += zeros.len() as u64;
    }
    disk.flush().expect("prefill flush");
}

/// Writes the batch and flushes; returns the seconds `write_batch` took.
fn run_batch(disk: &mut dyn Disk, offsets: &[u64], bufs: &[Vec<u8>]) -> f64 {
    let writes: Vec<(u64, &[u8])> = offsets.iter().zip(bufs).map(|(o, b)| (*o, &b[..])).collect();
    let t = Instant::now();
    disk.write_batch(&writes).expect("write_batch");
    let write_s = t.elapsed().as_secs_f64();
    disk.flush().expect("flush");
    write_s
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Shape {
    files: usize,
    dirs: usize,
    file_bytes: usize,
}

/// mkfs + create + commit on a fresh image; returns (create s, commit s).
fn store_run(io: Backend, image: &Path, shape: &Shape) -> (f64, f64) {
    let size = ((shape.files * (shape.file_bytes + 2048)) as u64 * 3).max(256 << 20);
    let now = Timespec::new(1_700_000_000, 0);
    if std::env::var_os("CREST_BENCH_PREFILL").is_some() {
        // Blocks allocated beforehand, like a block device or an image that has been full.
        prefill(image, size);
    }
    let disk = if std::env::var_os("CREST_BENCH_PREFILL").is_some() { io.open(image) } else { io.create(image, size) };
    Store::mkfs(disk, &MkfsOptions { now, fsid: None, seed: None, meta_copies: 2 }).expect("mkfs");
    let mut store = Store::open(io.open(image)).expect("open store");
    let payload = vec![b'x'; shape.file_bytes];
    let t0 = Instant::now();
    let mut dirs = Vec::with_capacity(shape.dirs);
    for d in 0..shape.dirs {
        let name = format!("d{d:04}");
        dirs.push(
            store.create(ROOT_INO, name.as_bytes(), FileKind::Directory, 0o755, 0, 0, 0, now).expect("mkdir").ino,
        );
    }
    let mut last = 0;
    for f in 0..shape.files {
        let name = format!("file-{f:06}");
        let ino = store
            .create(dirs[f % shape.dirs], name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now)
            .expect("create")
            .ino;
        store.write(ino, 0, &payload, now).expect("write");
        last = ino;
    }
    let create_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    store.commit().expect("commit");
    let commit_s = t1.elapsed().as_secs_f64();
    assert_eq!(store.read(last, 0, payload.len() as u64).expect("read back"), payload);
    drop(store);
    let _ = std::fs::remove_file(image);
    (create_s, commit_s)
}

fn main() {
    let started = Instant::now();
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let base = PathBuf::from(std::env::var("CREST_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()));
    let dir = base.join(format!("crest-diskio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let backends = backends(&dir.join("probe.img"));

    let (file_size, sizes, reps): (u64, Vec<usize>, usize) =
        if bench_mode { (1 << 30, vec![1_000, 10_000], 7) } else { (16 << 20, vec![64], 1) };
    let small = Shape {
        files: if bench_mode { env_or("CREST_BENCH_FILES", 20_000) } else { 200 },
        dirs: if bench_mode { 200 } else { 10 },
        file_bytes: 100,
    };
    let data = Shape { files: if bench_mode { 1_000 } else { 20 }, dirs: 10, file_bytes: 64 << 10 };
    let store_reps = if bench_mode { 3 } else { 1 };

    // One batch file per backend, each opened once for the whole run (as a server keeps
    // its image open), so repetitions can alternate between backends.
    let mut disks: Vec<Box<dyn Disk>> = backends
        .iter()
        .map(|io| {
            let file = dir.join(format!("batch-{}.img", io.name()));
            prefill(&file, file_size);
            io.open(&file)
        })
        .collect();
    let file_blocks = file_size / BLOCK as u64;
    let max_n = sizes.iter().copied().max().unwrap_or(0);
    let bufs: Vec<Vec<u8>> = (0..max_n)
        .map(|i| {
            let mut b = vec![0u8; BLOCK];
            Stream::from_seed_u64(i as u64).fill_bytes(&mut b);
            b
        })
        .collect();

    // (a) commit-like batches: every backend gets the same offsets (in its own file) in the
    // same repetition.
    let mut batch_rows = Vec::new();
    for &n in &sizes {
        let mut times = vec![Vec::new(); backends.len()];
        let mut write_times = vec![Vec::new(); backends.len()];
        for rep in 0..reps {
            for (b, io) in backends.iter().enumerate() {
                let offsets = random_offsets(&mut Stream::from_seed_u64((n * 1000 + rep) as u64), n, file_blocks);
                let t = Instant::now();
                write_times[b].push(run_batch(&mut *disks[b], &offsets, &bufs[..n]));
                times[b].push(t.elapsed().as_secs_f64());
                if rep == reps - 1 {
                    let mut got = vec![0u8; BLOCK];
                    disks[b].read_at(offsets[n - 1], &mut got).expect("read");
                    assert_eq!(got, bufs[n - 1], "{}: the batch reached the file", io.name());
                }
            }
        }
        batch_rows.push((n, times, write_times));
    }

    // (d) small commits, the shape of a client's fsync: a few nodes, flush, superblock, flush.
    let (commits, nodes) = if bench_mode { (100, 16) } else { (3, 4) };
    let mut commit_times = vec![Vec::new(); backends.len()];
    for rep in 0..reps {
        for (b, disk) in disks.iter_mut().enumerate() {
            let mut rng = Stream::from_seed_u64(7 + rep as u64);
            let t = Instant::now();
            for _ in 0..commits {
                let offsets = random_offsets(&mut rng, nodes, file_blocks);
                run_batch(&mut **disk, &offsets, &bufs[..nodes]);
                disk.write_at(64 << 10, &bufs[0][..512]).expect("superblock");
                disk.flush().expect("flush");
            }
            commit_times[b].push(t.elapsed().as_secs_f64() / commits as f64);
        }
    }

    // (b) and (c): the store on each backend.
    let mut store_rows = Vec::new();
    for (what, shape) in [("smallfiles", &small), ("datafiles", &data)] {
        let mut times = vec![(Vec::new(), Vec::new()); backends.len()];
        for _ in 0..store_reps {
            for (b, io) in backends.iter().enumerate() {
                let (c, m) = store_run(*io, &dir.join(format!("store-{}.img", io.name())), shape);
                times[b].0.push(c);
                times[b].1.push(m);
            }
        }
        store_rows.push((what, shape, times));
    }

    if !bench_mode {
        drop(disks);
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "diskio: {} backends agree on batches and store workloads (timing skipped outside `cargo bench`)",
            backends.len()
        );
        return;
    }

    println!("\nunder {} = {}", base.display(), filesystem_of(&base));
    println!("(a) batch of N random 4 KiB writes over a 1 GiB file + fdatasync; median of {reps}");
    println!(
        "{:<8} {:<9} {:>10} {:>10} {:>14} {:>12} {:>9}",
        "N", "disk", "median ms", "min ms", "write_batch ms", "writes/s", "vs sync"
    );
    for (n, times, write_times) in &mut batch_rows {
        let sync = median(&mut times[0].clone());
        for (b, io) in backends.iter().enumerate() {
            let min = times[b].iter().copied().fold(f64::INFINITY, f64::min);
            let med = median(&mut times[b]);
            println!(
                "{:<8} {:<9} {:>10.1} {:>10.1} {:>14.1} {:>12.0} {:>8.2}x",
                n,
                io.name(),
                med * 1e3,
                min * 1e3,
                median(&mut write_times[b]) * 1e3,
                *n as f64 / med,
                sync / med
            );
        }
    }
    println!("(vs sync = sync's median time / this backend's: above 1 is faster; write_batch ms = median");
    println!(" time before the flush, the rest is fdatasync)");
    println!("\n(d) {commits} small commits: {nodes} random 4 KiB writes, flush, a 512 B superblock write, flush");
    println!("{:<9} {:>14} {:>12} {:>9}", "disk", "ms per commit", "commits/s", "vs sync");
    let sync = median(&mut commit_times[0].clone());
    for (b, io) in backends.iter().enumerate() {
        let med = median(&mut commit_times[b]);
        println!("{:<9} {:>14.2} {:>12.0} {:>8.2}x", io.name(), med * 1e3, 1.0 / med, sync / med);
    }
    for (what, shape, times) in &mut store_rows {
        println!(
            "\n({}) store: mkfs, create {} files of {} B in {} dirs, commit; median of {store_reps}",
            if *what == "smallfiles" { "b" } else { "c" },
            shape.files,
            shape.file_bytes,
            shape.dirs
        );
        println!(
            "{:<9} {:>10} {:>10} {:>10} {:>12} {:>9}",
            "disk", "create s", "commit s", "total s", "files/s", "vs sync"
        );
        let total = |t: &(Vec<f64>, Vec<f64>)| {
            let mut v: Vec<f64> = t.0.iter().zip(&t.1).map(|(a, b)| a + b).collect();
            median(&mut v)
        };
        let sync = total(&times[0]);
        for (b, io) in backends.iter().enumerate() {
            let tot = total(&times[b]);
            println!(
                "{:<9} {:>10.3} {:>10.3} {:>10.3} {:>12.0} {:>8.2}x",
                io.name(),
                median(&mut times[b].0),
                median(&mut times[b].1),
                tot,
                shape.files as f64 / tot,
                sync / tot
            );
        }
    }
    println!();

    if std::env::var_os("CREST_BENCH_NO_CRITERION").is_some() {
        drop(disks);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let mut criterion =
        Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).configure_from_args();
    for &n in &sizes {
        let mut group = criterion.benchmark_group(format!("diskio/batch/{n}"));
        group.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(n as u64));
        group.measurement_time(Duration::from_secs(if n >= 10_000 { 8 } else { 3 }));
        for (io, disk) in backends.iter().zip(disks.iter_mut()) {
            let mut rng = Stream::from_seed_u64(n as u64);
            group.bench_function(io.name(), |b| {
                b.iter_batched(
                    || random_offsets(&mut rng, n, file_blocks),
                    |offsets| black_box(run_batch(&mut **disk, black_box(&offsets), &bufs[..n])),
                    BatchSize::PerIteration,
                )
            });
        }
        group.finish();
    }
    criterion.final_summary();
    drop(disks);
    let _ = std::fs::remove_dir_all(&dir);
    println!("diskio: total bench time {:.1}s", started.elapsed().as_secs_f64());
}
