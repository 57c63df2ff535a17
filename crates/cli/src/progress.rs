//! Progress on standard error for the commands that can take long: fsck (and its repair),
//! scrub, send, receive, mkfs, and a server opening its image. What can be counted as it
//! goes is bytes (read from the image, checked, streamed), so each shows a spinner with the
//! bytes so far, their rate and the time taken; none knows its total in advance (fsck
//! learns which blocks are in use by walking the trees it checks).
//!
//! Drawn only when standard error is a terminal (a log, a pipe or a service manager gets
//! nothing, not escape codes), from a thread of its own that reads a counter the work
//! bumps (one relaxed atomic add per disk request: nothing on the work's path waits for a
//! terminal), after a delay so that quick work draws nothing, and erased when the work is
//! done, leaving the command's own output as it was.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Bytes done so far, shared between the work and its spinner.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Counts `n` more bytes.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The bytes counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How long work may take before its spinner shows.
pub const QUIET_FOR: Duration = Duration::from_millis(500);

/// A spinner on standard error, drawn while its value lives.
pub struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Spinner {
    /// Shows "`what`: N MiB `verb` (rate), elapsed" from `after` on (`CREST_PROGRESS_AFTER_MS`
    /// overrides it), while `counter` is counted; nothing unless standard error is a
    /// terminal.
    pub fn bytes(what: &str, verb: &str, counter: &Counter, after: Duration) -> Spinner {
        let after = std::env::var("CREST_PROGRESS_AFTER_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(after, Duration::from_millis);
        Spinner::bytes_to(what, verb, counter, after, std::io::stderr().is_terminal())
    }

    fn bytes_to(what: &str, verb: &str, counter: &Counter, after: Duration, terminal: bool) -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        if !terminal {
            return Spinner { stop, thread: None };
        }
        let template = format!("{{spinner}} {{prefix}}: {{bytes}} {verb} ({{bytes_per_sec}}), {{elapsed}}");
        let style = ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_spinner());
        let (prefix, counter, stopped) = (what.to_string(), counter.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("crest-progress".into())
            .spawn(move || {
                let began = std::time::Instant::now();
                while began.elapsed() < after {
                    if stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let bar =
                    ProgressBar::new_spinner().with_style(style).with_prefix(prefix).with_elapsed(began.elapsed());
                // (Drawn at least once once shown, however soon the work ends: what a
                // delay of 0 promises.)
                loop {
                    bar.set_position(counter.get());
                    bar.tick();
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                bar.finish_and_clear();
            })
            .ok();
        Spinner { stop, thread }
    }

    /// Erases the spinner (when it showed) before the command prints what it found.
    pub fn done(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.end();
    }
}

/// A disk whose reads and writes are counted (for a spinner), everything else as `D` does
/// it: batches stay batches, zeroing stays the file system's.
pub struct Counted<D> {
    inner: D,
    counter: Counter,
}

impl<D> Counted<D> {
    /// `inner`, counted into `counter`.
    pub fn new(inner: D, counter: &Counter) -> Counted<D> {
        Counted { inner, counter: counter.clone() }
    }
}

impl<D: crest_store::Disk> crest_store::Disk for Counted<D> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)?;
        self.counter.add(buf.len() as u64);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.counter.add(buf.len() as u64);
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> std::io::Result<()> {
        self.inner.write_batch(writes)?;
        self.counter.add(writes.iter().map(|(_, b)| b.len() as u64).sum());
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn reader(&self, offset: u64, len: usize) -> std::io::Result<Option<crest_store::SharedReader>> {
        self.inner.reader(offset, len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crest_store::Disk;

    #[test]
    fn a_counted_disk_counts_what_moves_and_passes_the_rest_through() {
        let counter = Counter::default();
        let mut d = Counted::new(crest_store::MemDisk::new(1 << 20), &counter);
        d.write_at(4096, &[7; 100]).unwrap();
        d.write_batch(&[(0, &[1; 10]), (8192, &[2; 30])]).unwrap();
        let mut buf = [0u8; 100];
        d.read_at(4096, &mut buf).unwrap();
        assert_eq!(buf, [7; 100]);
        d.write_zeroes(0, 4096).unwrap();
        assert_eq!(counter.get(), 100 + 40 + 100, "zeroing moves no bytes");
        assert_eq!(d.size_bytes(), 1 << 20);
        assert!(d.read_at(2 << 20, &mut buf).is_err(), "errors pass through uncounted");
        assert_eq!(counter.get(), 240);
    }

    #[test]
    fn no_terminal_no_thread_and_quick_work_draws_nothing() {
        let counter = Counter::default();
        let s = Spinner::bytes_to("x", "read", &counter, Duration::ZERO, false);
        assert!(s.thread.is_none());
        // On a terminal, work done before the delay ends the thread before it draws.
        let s = Spinner::bytes_to("x", "read", &counter, Duration::from_secs(60), true);
        let began = std::time::Instant::now();
        s.done();
        assert!(began.elapsed() < Duration::from_secs(5), "done does not wait out the delay");
    }
}
