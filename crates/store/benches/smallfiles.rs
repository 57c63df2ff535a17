//! The store's metadata-heavy workload next to the local file system in the same run:
//! create N small files in D directories, commit (or sync), then read every file back.
//! Prints ops/s for each phase and the bytes each side wrote per created file (write
//! amplification). `CREST_BENCH_FILES` / `CREST_BENCH_DIRS` / `CREST_BENCH_FILE_BYTES`
//! change the shape; the default is the 100,000 files in 1,000 directories.
//! Under `cargo test` (no `--bench`) it runs a tiny shape once as a smoke test.

use std::path::Path;
use std::time::Instant;

use crest_store::{FileDisk, FileKind, MkfsOptions, Store, Timespec, ROOT_INO};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Sectors written to the block device holding `path`, from /proc/diskstats (whole device).
fn device_bytes_written(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (((dev >> 8) & 0xfff) as u32, ((dev & 0xff) | ((dev >> 12) & 0xfff00)) as u32);
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    stats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 9 && f[0].parse() == Ok(major) && f[1].parse() == Ok(minor))
            .then(|| f[9].parse::<u64>().ok().map(|s| s * 512))
            .flatten()
    })
}

/// Flushes and drops the kernel's page cache (needs root; without it the reads are warm).
fn drop_caches() {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

struct Row {
    what: &'static str,
    create_s: f64,
    commit_s: f64,
    read_s: f64,
    bytes_written: Option<u64>,
}

fn crest(dir: &Path, files: usize, dirs: usize, payload: &[u8]) -> Row {
    let image = dir.join("bench.img");
    let size = ((files * (payload.len().max(512) + 1024)) as u64 * 4).max(256 << 20);
    let disk = FileDisk::create(&image, size).expect("create image");
    let now = Timespec::new(1_700_000_000, 0);
    Store::mkfs(Box::new(disk), &MkfsOptions { now, fsid: None, seed: None, meta_copies: 2 }).expect("mkfs");
    let mut store = Store::open(Box::new(FileDisk::open(&image).expect("open image"))).expect("open store");
    let before = store.stats().bytes_written;
    let t0 = Instant::now();
    let mut dir_inos = Vec::with_capacity(dirs);
    for d in 0..dirs {
        let name = format!("d{d:04}");
        dir_inos.push(
            store.create(ROOT_INO, name.as_bytes(), FileKind::Directory, 0o755, 0, 0, 0, now).expect("mkdir").ino,
        );
    }
    for f in 0..files {
        let d = dir_inos[f % dirs];
        let name = format!("file-{f:06}");
        let ino = store.create(d, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now).expect("create").ino;
        store.write(ino, 0, payload, now).expect("write");
    }
    let create_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    store.commit().expect("commit");
    let commit_s = t1.elapsed().as_secs_f64();
    let bytes = store.stats().bytes_written - before;
    drop(store);
    // Cold read-back: a fresh open has no cached nodes, and the image leaves the page cache.
    // Open walks every tree to rebuild the free-space bitmaps, which warms the node cache,
    // so the read-back time includes the open.
    drop_caches();
    let t2 = Instant::now();
    let mut store = Store::open(Box::new(FileDisk::open(&image).expect("open image"))).expect("reopen");
    let mut total = 0usize;
    for (d, dino) in dir_inos.iter().enumerate() {
        let mut from = 0;
        loop {
            let batch = store.readdir(*dino, from, 512).expect("readdir");
            let Some(last) = batch.last() else { break };
            from = last.0.index + 1;
            for (_, inode) in &batch {
                total += store.read(inode.ino, 0, inode.size).expect("read").len();
            }
        }
        let _ = d;
    }
    assert_eq!(total, files * payload.len(), "read back everything");
    let read_s = t2.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&image);
    Row { what: "crest store (in-process, image file)", create_s, commit_s, read_s, bytes_written: Some(bytes) }
}

fn local(dir: &Path, files: usize, dirs: usize, payload: &[u8]) -> Row {
    let root = dir.join("local");
    std::fs::create_dir_all(&root).expect("mkdir");
    let before = device_bytes_written(&root);
    let t0 = Instant::now();
    for d in 0..dirs {
        std::fs::create_dir(root.join(format!("d{d:04}"))).expect("mkdir");
    }
    for f in 0..files {
        std::fs::write(root.join(format!("d{:04}/file-{f:06}", f % dirs)), payload).expect("write");
    }
    let create_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    // sync(1) flushes every file system: the local side's equivalent of a commit.
    let _ = std::process::Command::new("sync").status();
    let commit_s = t1.elapsed().as_secs_f64();
    let after = device_bytes_written(&root);
    drop_caches();
    let t2 = Instant::now();
    let mut total = 0;
    for d in 0..dirs {
        for e in std::fs::read_dir(root.join(format!("d{d:04}"))).expect("readdir") {
            total += std::fs::read(e.expect("entry").path()).expect("read").len();
        }
    }
    assert_eq!(total, files * payload.len());
    let read_s = t2.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&root);
    let bytes_written = match (before, after) {
        (Some(b), Some(a)) if a >= b => Some(a - b),
        _ => None,
    };
    Row { what: "local file system (std::fs + sync)", create_s, commit_s, read_s, bytes_written }
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let files = if smoke { 500 } else { env_or("CREST_BENCH_FILES", 100_000) };
    let dirs = if smoke { 10 } else { env_or("CREST_BENCH_DIRS", 1_000) };
    let file_bytes = env_or("CREST_BENCH_FILE_BYTES", 100);
    let payload = vec![b'x'; file_bytes];
    let base = std::env::var("CREST_BENCH_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = Path::new(&base).join(format!("crest-smallfiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let rows = [crest(&dir, files, dirs, &payload), local(&dir, files, dirs, &payload)];
    let _ = std::fs::remove_dir_all(&dir);
    if smoke {
        return;
    }
    let ops = (files + dirs) as f64;
    println!("\n{files} files of {file_bytes} B in {dirs} directories, under {base}");
    println!(
        "{:<40} {:>12} {:>10} {:>12} {:>14} {:>10}",
        "", "creates/s", "commit s", "open+reads/s", "bytes/create", "x payload"
    );
    for r in &rows {
        let (per_op, amp) = match r.bytes_written {
            Some(b) => (format!("{:.0}", b as f64 / ops), format!("{:.1}", b as f64 / (files * file_bytes) as f64)),
            None => ("n/a".into(), "n/a".into()),
        };
        println!(
            "{:<40} {:>12.0} {:>10.3} {:>12.0} {:>14} {:>10}",
            r.what,
            ops / r.create_s,
            r.commit_s,
            files as f64 / r.read_s,
            per_op,
            amp
        );
    }
    let (c, l) = (&rows[0], &rows[1]);
    println!(
        "crest / local: create+commit {:.2}x faster, read-back {:.2}x faster",
        (l.create_s + l.commit_s) / (c.create_s + c.commit_s),
        l.read_s / c.read_s
    );
    println!("(local bytes are the whole device's writes during the run, so other activity counts too)");
}
