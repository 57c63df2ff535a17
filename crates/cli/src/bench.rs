//! `crest bench DIR`: what a user gets from a mount — any mount: crest, NFS, sshfs, a local
//! disk — as `juicefs bench` reports it: big-file write and read throughput, small-file
//! create, read, stat and delete rates, and 4 KiB writes each made durable by fsync, with
//! latencies (average, median, 99th percentile, worst) per operation. Each of `--threads`
//! threads works on files of its own, all at once. Progress on stderr while it runs (on a
//! terminal), a table at the end, or one JSON object (`--json`).
//!
//! Big files are read back after their pages are dropped from this host's cache
//! (`posix_fadvise(DONTNEED)`), so reads go to the file system; small files are read warm
//! or cold as the file system keeps them. Everything is made in a scratch directory inside
//! DIR, removed at the end (also when a phase fails).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// `crest bench` options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Directory to run in (a scratch directory is made inside it and removed after).
    pub dir: PathBuf,
    /// Size of the big file each thread writes and reads back (K, M, G suffixes).
    #[arg(long, default_value = "1G")]
    pub big_size: String,
    /// Size of each I/O on the big file.
    #[arg(long, default_value = "1M")]
    pub block_size: String,
    /// Size of each small file.
    #[arg(long, default_value = "128K")]
    pub small_size: String,
    /// Small files each thread creates, reads, stats and deletes.
    #[arg(long, default_value_t = 100)]
    pub small_count: usize,
    /// 4 KiB writes each thread makes durable one by one (write + fsync).
    #[arg(long, default_value_t = 100)]
    pub fsync_count: usize,
    /// Threads, each with files of its own.
    #[arg(short = 'p', long, default_value_t = 1)]
    pub threads: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One phase's measurements.
#[derive(Debug)]
struct Phase {
    name: &'static str,
    /// Bytes moved (0 for metadata phases).
    bytes: u64,
    elapsed: Duration,
    /// Every operation's latency, sorted.
    latencies: Vec<Duration>,
}

impl Phase {
    fn ops_per_s(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn mib_per_s(&self) -> Option<f64> {
        (self.bytes > 0).then(|| self.bytes as f64 / (1 << 20) as f64 / self.elapsed.as_secs_f64().max(1e-9))
    }
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }
    fn avg(&self) -> Duration {
        let n = self.latencies.len().max(1) as u32;
        self.latencies.iter().sum::<Duration>() / n
    }
}

/// Parses `4096`, `4K`, `128K`, `1M`, `2G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => bail!("{s:?}: a size is a number with an optional K, M, G or T"),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| anyhow!("{s:?}: a size is a number with an optional K, M, G or T"))?;
    n.checked_mul(mult).ok_or_else(|| anyhow!("{s:?}: too large"))
}

/// Bytes that are not all alike (a file system may treat zeros specially).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Progress of one phase on stderr, when it is a terminal.
fn progress(name: &str, total: u64) -> ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{prefix:>18} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(name.to_string());
    bar
}

/// Runs `work(thread, i)` for every thread and i < `per_thread`, threads at once; each call
/// returns the bytes it moved. Latencies of every call, and the phase's wall time.
fn phase(
    name: &'static str,
    threads: usize,
    per_thread: usize,
    work: impl Fn(usize, usize) -> Result<u64> + Sync,
) -> Result<Phase> {
    let bar = progress(name, (threads * per_thread) as u64);
    let started = Instant::now();
    let results: Vec<Result<(u64, Vec<Duration>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (work, bar) = (&work, bar.clone());
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(per_thread);
                    let mut bytes = 0;
                    for i in 0..per_thread {
                        let t0 = Instant::now();
                        bytes += work(t, i)?;
                        lat.push(t0.elapsed());
                        bar.inc(1);
                    }
                    Ok((bytes, lat))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a bench thread panicked")))).collect()
    });
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let mut latencies = Vec::new();
    let mut bytes = 0;
    for r in results {
        let (b, l) = r.context(name)?;
        bytes += b;
        latencies.extend(l);
    }
    latencies.sort_unstable();
    Ok(Phase { name, bytes, elapsed, latencies })
}

/// Options as numbers.
struct Plan {
    big: u64,
    block: usize,
    small: usize,
    small_count: usize,
    fsync_count: usize,
    threads: usize,
}

impl Plan {
    fn of(a: &BenchArgs) -> Result<Plan> {
        let block = parse_size(&a.block_size)?;
        if block == 0 || block > 64 << 20 {
            bail!("--block-size: 1 byte to 64M");
        }
        if a.threads == 0 || a.threads > 256 {
            bail!("--threads: 1 to 256");
        }
        let small = parse_size(&a.small_size)?;
        if small > 64 << 20 {
            bail!("--small-size: at most 64M");
        }
        Ok(Plan {
            big: parse_size(&a.big_size)?,
            block: block as usize,
            small: small as usize,
            small_count: a.small_count,
            fsync_count: a.fsync_count,
            threads: a.threads,
        })
    }
}

fn big_path(dir: &Path, t: usize) -> PathBuf {
    dir.join(format!("big.{t}"))
}

fn small_path(dir: &Path, t: usize, i: usize) -> PathBuf {
    dir.join(format!("t{t}")).join(format!("f{i:06}"))
}

/// Every phase, in order.
fn run_phases(dir: &Path, p: &Plan) -> Result<Vec<Phase>> {
    let mut out = Vec::new();
    let blocks = p.big.div_ceil(p.block as u64) as usize;
    let data = pattern(p.block.max(p.small).max(4096), 0x5eed);
    if blocks > 0 {
        let files: Vec<File> = (0..p.threads)
            .map(|t| {
                let path = big_path(dir, t);
                let open = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path);
                open.with_context(|| format!("creating {}", path.display()))
            })
            .collect::<Result<_>>()?;
        out.push(phase("write big file", p.threads, blocks, |t, i| {
            let off = i as u64 * p.block as u64;
            let len = (p.big - off).min(p.block as u64) as usize;
            files[t].write_all_at(&data[..len], off)?;
            if i + 1 == blocks {
                files[t].sync_all()?; // the data is written once it is durable
            }
            Ok(len as u64)
        })?);
        for f in &files {
            drop_cache(f);
        }
        out.push(phase("read big file", p.threads, blocks, |t, i| {
            let off = i as u64 * p.block as u64;
            let len = (p.big - off).min(p.block as u64) as usize;
            let mut buf = vec![0u8; len];
            files[t].read_exact_at(&mut buf, off)?;
            Ok(len as u64)
        })?);
    }
    if p.small_count > 0 {
        for t in 0..p.threads {
            fs::create_dir(dir.join(format!("t{t}")))?;
        }
        out.push(phase("write small files", p.threads, p.small_count, |t, i| {
            let mut f = File::create(small_path(dir, t, i))?;
            f.write_all(&data[..p.small])?;
            Ok(p.small as u64)
        })?);
        out.push(phase("read small files", p.threads, p.small_count, |t, i| {
            let mut buf = Vec::with_capacity(p.small);
            File::open(small_path(dir, t, i))?.read_to_end(&mut buf)?;
            Ok(buf.len() as u64)
        })?);
        out.push(phase("stat small files", p.threads, p.small_count, |t, i| {
            fs::symlink_metadata(small_path(dir, t, i))?;
            Ok(0)
        })?);
    }
    if p.fsync_count > 0 {
        let files: Vec<File> = (0..p.threads)
            .map(|t| OpenOptions::new().create(true).truncate(true).write(true).open(dir.join(format!("fsync.{t}"))))
            .collect::<std::io::Result<_>>()?;
        out.push(phase("4 KiB write + fsync", p.threads, p.fsync_count, |t, i| {
            files[t].write_all_at(&data[..4096], i as u64 * 4096)?;
            files[t].sync_data()?;
            Ok(4096)
        })?);
    }
    if p.small_count > 0 {
        out.push(phase("delete small files", p.threads, p.small_count, |t, i| {
            fs::remove_file(small_path(dir, t, i))?;
            Ok(0)
        })?);
    }
    Ok(out)
}

/// Drops a file's pages from this host's cache, so the next read asks the file system.
fn drop_cache(f: &File) {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    let _ = f.sync_all();
    let _ = posix_fadvise(f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

fn ms(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} us")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn table(results: &[Phase]) -> String {
    let mut s = format!(
        "{:<20} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}\n",
        "ITEM", "MiB/s", "ops/s", "avg", "p50", "p99", "max"
    );
    for r in results {
        let mib = r.mib_per_s().map_or("-".to_string(), |m| format!("{m:.1}"));
        s += &format!(
            "{:<20} {:>12} {:>12.1} {:>10} {:>10} {:>10} {:>10}\n",
            r.name,
            mib,
            r.ops_per_s(),
            ms(r.avg()),
            ms(r.pct(0.5)),
            ms(r.pct(0.99)),
            ms(r.pct(1.0))
        );
    }
    s
}

fn json(dir: &Path, p: &Plan, results: &[Phase]) -> serde_json::Value {
    let us = |d: Duration| (d.as_secs_f64() * 1e6 * 10.0).round() / 10.0;
    let phases: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "phase": r.name,
                "ops": r.latencies.len(),
                "bytes": r.bytes,
                "seconds": r.elapsed.as_secs_f64(),
                "mib_per_s": r.mib_per_s(),
                "ops_per_s": r.ops_per_s(),
                "latency_us": {"avg": us(r.avg()), "p50": us(r.pct(0.5)), "p99": us(r.pct(0.99)), "max": us(r.pct(1.0))},
            })
        })
        .collect();
    serde_json::json!({
        "dir": dir.display().to_string(),
        "threads": p.threads,
        "big_file_bytes": p.big,
        "block_bytes": p.block,
        "small_file_bytes": p.small,
        "small_files": p.small_count,
        "fsyncs": p.fsync_count,
        "results": phases,
    })
}

/// `crest bench`.
pub fn bench(a: &BenchArgs) -> Result<()> {
    let plan = Plan::of(a)?;
    let meta = fs::metadata(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    if !meta.is_dir() {
        bail!("{}: not a directory", a.dir.display());
    }
    let scratch = a.dir.join(format!("crest-bench.{}", std::process::id()));
    fs::create_dir(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let results = run_phases(&scratch, &plan);
    let cleaned = fs::remove_dir_all(&scratch).with_context(|| format!("removing {}", scratch.display()));
    let results = results?;
    cleaned?;
    if a.json {
        println!("{}", json(&a.dir, &plan, &results));
    } else {
        println!(
            "crest bench {}: {} thread(s), big file {} in {} blocks, {} small files of {} bytes, {} fsyncs",
            a.dir.display(),
            plan.threads,
            plan.big,
            plan.block,
            plan.small_count,
            plan.small,
            plan.fsync_count
        );
        print!("{}", table(&results));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        for bad in ["", "K", "1.5M", "3X", "-1", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_phase_runs_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let a = BenchArgs {
            dir: dir.path().to_path_buf(),
            big_size: "300K".into(),
            block_size: "64K".into(),
            small_size: "1000".into(),
            small_count: 7,
            fsync_count: 3,
            threads: 2,
            json: true,
        };
        let plan = Plan::of(&a).unwrap();
        let scratch = dir.path().join("s");
        fs::create_dir(&scratch).unwrap();
        let r = run_phases(&scratch, &plan).unwrap();
        let names: Vec<&str> = r.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "write big file",
                "read big file",
                "write small files",
                "read small files",
                "stat small files",
                "4 KiB write + fsync",
                "delete small files"
            ]
        );
        // 300K in 64K blocks: 5 blocks (the last short) per thread.
        assert_eq!(r[0].latencies.len(), 10);
        assert_eq!(r[0].bytes, 2 * 300 * 1024);
        assert_eq!(r[1].bytes, 2 * 300 * 1024);
        assert_eq!(r[3].bytes, 2 * 7 * 1000);
        assert_eq!(r[5].latencies.len(), 6);
        assert_eq!(fs::read(scratch.join("big.1")).unwrap(), pattern(64 << 10, 0x5eed).repeat(5)[..300 * 1024]);
        assert!(fs::read_dir(scratch.join("t0")).unwrap().next().is_none(), "small files deleted");
        let j = json(dir.path(), &plan, &r);
        assert_eq!(j["results"].as_array().unwrap().len(), 7);
        assert!(table(&r).contains("read small files"));
    }
}
