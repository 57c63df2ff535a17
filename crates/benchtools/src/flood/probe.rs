//! The honest probe: a loop of small operations on a mounted file system (create a file,
//! write 4 KiB, close, stat, unlink), each iteration timed with the monotonic clock.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::Stop;
use crate::stats::Summary;

/// An iteration slower than this is a stall (issue 43's target: none).
pub const STALL: Duration = Duration::from_secs(1);

/// What the probe measured.
#[derive(Debug)]
pub struct ProbeResult {
    /// Each iteration's time, in order (failed ones included).
    pub samples: Vec<Duration>,
    /// Iterations that failed.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Wall time of the whole loop.
    pub elapsed: Duration,
}

impl ProbeResult {
    /// The line a script parses: `crest-flood probe n=… errors=… p50_ms=… p99_ms=…
    /// max_ms=… over_1s=… secs=…`.
    pub fn line(&self) -> String {
        let ms = |us: f64| format!("{:.2}", us / 1000.0);
        let over = self.samples.iter().filter(|&&d| d > STALL).count();
        let (p50, p99, max) = match Summary::of(&self.samples) {
            Some(s) => (ms(s.median_us), ms(s.p99_us), ms(s.max_us)),
            None => ("-".into(), "-".into(), "-".into()),
        };
        format!(
            "crest-flood probe n={} errors={} p50_ms={p50} p99_ms={p99} max_ms={max} over_1s={over} secs={:.2}",
            self.samples.len(),
            self.errors,
            self.elapsed.as_secs_f64()
        )
    }
}

/// One iteration on `path`: create, write `data`, close, stat, unlink.
fn iteration(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = File::create(path).context("create")?;
    f.write_all(data).context("write")?;
    drop(f);
    let m = fs::metadata(path).context("stat")?;
    if m.len() != data.len() as u64 {
        bail!("stat says {} bytes, {} were written", m.len(), data.len());
    }
    fs::remove_file(path).context("unlink")
}

/// Runs iterations in `dir` (which must exist) until `stop` says to stop sending.
pub fn run(dir: &Path, stop: &Stop, bytes: usize) -> Result<ProbeResult> {
    // (No look at `dir` first: on a mount a hostile peer stalls, that look would stall
    // untimed. A missing directory fails every iteration.)
    let data = vec![0x5a_u8; bytes];
    let pid = std::process::id();
    let start = Instant::now();
    let mut r = ProbeResult { samples: Vec::new(), errors: 0, first_error: None, elapsed: Duration::ZERO };
    let mut i: u64 = 0;
    while stop.sending() {
        let path: PathBuf = dir.join(format!("probe-{pid}-{}", i % 64));
        let t = Instant::now();
        let res = iteration(&path, &data);
        r.samples.push(t.elapsed());
        if let Err(e) = res {
            r.errors += 1;
            if r.first_error.is_none() {
                r.first_error = Some(format!("{}: {e:#}", path.display()));
            }
            // Do not spin on a mount that fails at once.
            std::thread::sleep(Duration::from_millis(10));
        }
        i += 1;
    }
    r.elapsed = start.elapsed();
    Ok(r)
}
