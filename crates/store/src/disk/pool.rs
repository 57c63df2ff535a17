//! [`PoolDisk`]: a [`FileDisk`] whose `write_batch` is split across a few blocking threads.
//!
//! The batch (a commit's dirty nodes, sorted by offset) is cut into one contiguous run per
//! thread; each thread `pwrite`s its run in order. Scoped threads borrow the caller's
//! buffers, so nothing is copied and nothing outlives the call. A batch in which two writes
//! touch the same byte, or one too small to be worth the threads, is written in order on
//! the calling thread, so the last write to a place always wins. Reads, single writes and
//! `flush` are `FileDisk`'s.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{batch_overlaps, check_range, io_context, Disk, FileDisk};

/// Batches smaller than this are written on the calling thread (starting threads costs
/// more than a few page-cache copies: small commits measured slower with threads).
const MIN_PARALLEL_WRITES: usize = 64;

/// An image file whose commit batches are written by a small pool of threads.
#[derive(Debug)]
pub struct PoolDisk {
    inner: FileDisk,
    threads: usize,
}

impl PoolDisk {
    /// Threads per batch unless told otherwise.
    pub const DEFAULT_THREADS: usize = 4;

    /// Opens an existing image (locked like [`FileDisk::open`]).
    pub fn open(path: &Path) -> io::Result<PoolDisk> {
        Ok(PoolDisk::from_disk(FileDisk::open(path)?))
    }

    /// Creates (or truncates) an image file of `size_bytes` (like [`FileDisk::create`]).
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<PoolDisk> {
        Ok(PoolDisk::from_disk(FileDisk::create(path, size_bytes)?))
    }

    /// Wraps an open [`FileDisk`].
    pub fn from_disk(inner: FileDisk) -> PoolDisk {
        PoolDisk { inner, threads: PoolDisk::DEFAULT_THREADS }
    }

    /// Uses `threads` threads per batch (at least 1).
    pub fn with_threads(mut self, threads: usize) -> PoolDisk {
        self.threads = threads.max(1);
        self
    }
}

/// Writes a run of the batch in order; the error names the write that failed.
fn write_run(file: &std::fs::File, run: &[(u64, &[u8])]) -> io::Result<()> {
    for (offset, buf) in run {
        file.write_all_at(buf, *offset).map_err(|e| io_context("write", *offset, buf.len(), &e))?;
    }
    Ok(())
}

impl Disk for PoolDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn reader(&self, offset: u64, len: usize) -> io::Result<Option<super::SharedReader>> {
        self.inner.reader(offset, len)
    }
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let size = self.inner.size_bytes();
        for (offset, buf) in writes {
            check_range(*offset, buf.len(), size)?;
        }
        let file = self.inner.file();
        if self.threads == 1 || writes.len() < MIN_PARALLEL_WRITES || batch_overlaps(writes) {
            return write_run(file, writes);
        }
        let per_thread = writes.len().div_ceil(self.threads);
        std::thread::scope(|scope| {
            let mut runs = writes.chunks(per_thread);
            // The calling thread takes the first run itself.
            let first = runs.next().unwrap_or(&[]);
            let workers: Vec<_> = runs.map(|run| scope.spawn(move || write_run(file, run))).collect();
            let mut result = write_run(file, first);
            for w in workers {
                let r = w.join().unwrap_or_else(|_| Err(io::Error::other("a disk writer thread panicked")));
                // Runs are in batch order, so the first error kept is the earliest write's.
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    }
}
