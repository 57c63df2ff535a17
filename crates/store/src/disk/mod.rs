//! The one seam between the store and storage: the `Disk` trait, with image-file
//! implementations and an in-memory one. Crash tests wrap `Disk` to record writes and
//! flushes (see `crash`), so everything the store does to storage passes through here.
//!
//! Contract the store relies on (written down in docs/format.md):
//! - a write may be reordered with any other write issued since the last `flush`, and may
//!   be lost or torn if power fails before the next `flush` returns;
//! - after `flush` returns Ok, every earlier write is durable;
//! - a read returns the last data written at that place (durable or not);
//! - a write that fails reports its error no later than the next `flush` (the store
//!   poisons itself on any I/O error, so a late report loses nothing).
//!
//! Three backends open an image file (all with the same exclusive `flock` and size logic,
//! [`open_image`] / [`create_image`]); [`DiskIo`] picks one by name:
//! - [`FileDisk`]: synchronous `pread`/`pwrite`/`fdatasync`, one call at a time. The
//!   baseline, and what `mkfs`/`fsck` use.
//! - [`PoolDisk`] (`disk/pool.rs`): `FileDisk`, but `write_batch` (a commit's dirty nodes)
//!   is split across a few scoped threads doing `pwrite` in parallel.
//! - [`UringDisk`] (`disk/uring.rs`): io_uring. `write_at` copies the buffer, queues it and
//!   returns; `write_batch` submits every write of the batch at once (refilling a ring of
//!   [`uring::QUEUE_DEPTH`] as completions arrive; block-aligned writes go `O_DIRECT`) and
//!   waits for them; `flush` waits for every queued write, reports the first failure,
//!   then `fdatasync`s. A read or write that overlaps a queued write waits for it first,
//!   which keeps read-after-write and last-writer-wins.
//!
//! `benches/diskio.rs` compares them (results in its doc). On the development VM (ext4 on
//! virtio, two shared cores) `UringDisk` wrote commit batches 1.5-1.9x faster than
//! `FileDisk` and was even with it on small fsync commits and whole store workloads;
//! `PoolDisk` gained nothing (0.7-1.1x). `crest serve` defaults to `uring`.
//!
//! Every backend refuses an access past the end of the device with an error naming the
//! offset (a regular file would otherwise grow). The unit tests at the bottom of this file
//! run one suite against all of them: read-after-write, overlapping writes in one batch
//! (last wins), flush, out-of-range errors, write errors from `/dev/full` (for the
//! io_uring backend: reported by `flush` at the latest, and again by every later flush),
//! and a create/commit/reopen/fsck workload of the store on each backend.

pub mod crash;
mod pool;
pub mod uring;

pub use pool::PoolDisk;
pub use uring::UringDisk;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// Block storage addressed in bytes.
pub trait Disk: Send {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (not durable until `flush`).
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every earlier write durable.
    fn flush(&mut self) -> io::Result<()>;
    /// Size of the device in bytes.
    fn size_bytes(&self) -> u64;
    /// Writes many buffers; the store sorts them by offset. A batched backend (io_uring)
    /// overrides this to submit them together.
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, buf) in writes {
            self.write_at(*offset, buf)?;
        }
        Ok(())
    }
    /// Makes `len` bytes at `offset` read as zeros, as a write of zeros would. A file
    /// backend asks the file system to do it (no data moves); this default writes them.
    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.write_at(offset + done, &chunk[..n])?;
            done += n as u64;
        }
        Ok(())
    }
    /// A handle that reads bytes `offset..offset + len` from another thread, once every
    /// write to them issued so far has landed (what it reads is then what `read_at` would
    /// read now); `None` where the backend cannot hand one out (memory, the crash tests'
    /// recorders), and the caller reads here instead. No default: a wrapper that forgot
    /// to pass it on would keep every read on the store's thread without a word.
    fn reader(&self, offset: u64, len: usize) -> io::Result<Option<SharedReader>>;
}

/// Reads an image file from any thread ([`Disk::reader`]). It does not stop the store from
/// writing the same bytes meanwhile: its user keeps them from reuse (`ReadPlan`'s pin).
#[derive(Clone, Debug)]
pub struct SharedReader {
    file: Arc<File>,
    size: u64,
}

impl SharedReader {
    /// Reads exactly `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.read_exact_at(buf, offset)
    }
}

/// Zeroes a range of an image file or block device with `fallocate(FALLOC_FL_ZERO_RANGE)`,
/// falling back to writing zeros where that is not supported.
pub(crate) fn zero_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "range past off_t"));
    };
    let e = match nix::fcntl::fallocate(file, nix::fcntl::FallocateFlags::FALLOC_FL_ZERO_RANGE, off, n) {
        Ok(()) => return Ok(()),
        Err(errno) => io::Error::from(errno),
    };
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL) => {
            let chunk = vec![0u8; len.min(1 << 20) as usize];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(chunk.len() as u64) as usize;
                file.write_all_at(&chunk[..n], offset + done).map_err(|e| io_context("write", offset + done, n, &e))?;
                done += n as u64;
            }
            Ok(())
        }
        _ => Err(io_context("fallocate(ZERO_RANGE)", offset, len as usize, &e)),
    }
}

impl<D: Disk + ?Sized> Disk for Box<D> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(offset, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn reader(&self, offset: u64, len: usize) -> io::Result<Option<SharedReader>> {
        (**self).reader(offset, len)
    }
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        (**self).write_zeroes(offset, len)
    }
}

/// An image file or block device, locked exclusively while open; every call is one
/// synchronous system call.
#[derive(Debug)]
pub struct FileDisk {
    /// Shared with the [`SharedReader`]s handed out.
    file: Arc<File>,
    size: u64,
}

/// Opens an existing image read-write and takes an exclusive lock on it, so a second
/// process serving the same image gets `WouldBlock` and a clear message. Returns the file
/// and the size of the device.
pub fn open_image(path: &Path) -> io::Result<(File, u64)> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    lock_exclusive(&file, path)?;
    let size = device_size(&file)?;
    Ok((file, size))
}

/// Creates (or truncates) a sparse image file of `size_bytes` (a block device keeps its
/// size), locked like [`open_image`].
pub fn create_image(path: &Path, size_bytes: u64) -> io::Result<(File, u64)> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    lock_exclusive(&file, path)?;
    if file.metadata()?.file_type().is_file() {
        file.set_len(0)?;
        file.set_len(size_bytes)?;
    }
    let size = device_size(&file)?;
    Ok((file, size))
}

fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => {
            io::Error::new(io::ErrorKind::WouldBlock, format!("{} is in use by another crest process", path.display()))
        }
        std::fs::TryLockError::Error(e) => e,
    })
}

impl FileDisk {
    /// Opens an existing image (see [`open_image`]).
    pub fn open(path: &Path) -> io::Result<FileDisk> {
        let (file, size) = open_image(path)?;
        Ok(FileDisk { file: Arc::new(file), size })
    }

    /// Creates (or truncates) a sparse image file of `size_bytes` (see [`create_image`]).
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<FileDisk> {
        let (file, size) = create_image(path, size_bytes)?;
        Ok(FileDisk { file: Arc::new(file), size })
    }

    /// A disk over an already opened file of `size` bytes, without locking it (tests use
    /// it on `/dev/full`).
    pub fn from_file(file: File, size: u64) -> FileDisk {
        FileDisk { file: Arc::new(file), size }
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// The size of an image file, or of a block device (which a file's metadata does not give).
pub fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        Ok(meta.len())
    } else {
        // Block devices report 0 in metadata; seeking to the end gives the size.
        let mut f = file.try_clone()?;
        f.seek(SeekFrom::End(0))
    }
}

/// Checks that `len` bytes at `offset` lie inside a device of `size` bytes.
pub(crate) fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range(offset, len, size)),
    }
}

/// Adds the failed access to an error from the OS, keeping its kind.
pub(crate) fn io_context(op: &str, offset: u64, len: usize, e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} of {len} bytes at byte {offset} failed: {e}"))
}

/// True when two writes of the batch touch the same byte (then they must land in order).
pub(crate) fn batch_overlaps(writes: &[(u64, &[u8])]) -> bool {
    let end = |w: &(u64, &[u8])| w.0.saturating_add(w.1.len() as u64);
    if writes.windows(2).all(|p| p[0].0 <= p[1].0) {
        let mut reach = 0u64;
        for (i, w) in writes.iter().enumerate() {
            if i > 0 && w.0 < reach && !w.1.is_empty() {
                return true;
            }
            reach = reach.max(end(w));
        }
        return false;
    }
    let mut sorted: Vec<&(u64, &[u8])> = writes.iter().filter(|w| !w.1.is_empty()).collect();
    sorted.sort_unstable_by_key(|w| w.0);
    let mut reach = 0u64;
    for (i, w) in sorted.iter().enumerate() {
        if i > 0 && w.0 < reach {
            return true;
        }
        reach = reach.max(end(w));
    }
    false
}

impl Disk for FileDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.read_exact_at(buf, offset)
    }
    fn reader(&self, _offset: u64, _len: usize) -> io::Result<Option<SharedReader>> {
        Ok(Some(SharedReader { file: Arc::clone(&self.file), size: self.size }))
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset).map_err(|e| io_context("write", offset, buf.len(), &e))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, buf) in writes {
            check_range(*offset, buf.len(), self.size)?;
            self.file.write_all_at(buf, *offset).map_err(|e| io_context("write", *offset, buf.len(), &e))?;
        }
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, usize::try_from(len).unwrap_or(usize::MAX), self.size)?;
        zero_range(&self.file, offset, len)
    }
}

/// Which backend opens an image file (`crest serve --disk-io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskIo {
    /// [`FileDisk`]: one synchronous call at a time.
    Sync,
    /// [`PoolDisk`]: commit batches written by a few threads.
    Pool,
    /// [`UringDisk`]: io_uring, asynchronous writes, batched submission.
    Uring,
}

impl DiskIo {
    /// Every backend, baseline first.
    pub const ALL: [DiskIo; 3] = [DiskIo::Sync, DiskIo::Pool, DiskIo::Uring];

    /// The name `--disk-io` takes.
    pub fn name(self) -> &'static str {
        match self {
            DiskIo::Sync => "sync",
            DiskIo::Pool => "pool",
            DiskIo::Uring => "uring",
        }
    }

    /// Opens an existing image with this backend.
    pub fn open(self, path: &Path) -> io::Result<Box<dyn Disk>> {
        Ok(match self {
            DiskIo::Sync => Box::new(FileDisk::open(path)?),
            DiskIo::Pool => Box::new(PoolDisk::open(path)?),
            DiskIo::Uring => Box::new(UringDisk::open(path)?),
        })
    }

    /// Creates (or truncates) an image file of `size_bytes` with this backend.
    pub fn create(self, path: &Path, size_bytes: u64) -> io::Result<Box<dyn Disk>> {
        Ok(match self {
            DiskIo::Sync => Box::new(FileDisk::create(path, size_bytes)?),
            DiskIo::Pool => Box::new(PoolDisk::create(path, size_bytes)?),
            DiskIo::Uring => Box::new(UringDisk::create(path, size_bytes)?),
        })
    }
}

/// An in-memory disk whose bytes stay reachable after the store that used it is gone
/// (clone the handle before giving it away).
#[derive(Clone, Debug)]
pub struct MemDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl MemDisk {
    /// A zero-filled disk of `size_bytes`.
    pub fn new(size_bytes: u64) -> MemDisk {
        MemDisk::from_bytes(vec![0u8; size_bytes as usize])
    }

    /// A disk holding exactly these bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> MemDisk {
        MemDisk { bytes: Arc::new(Mutex::new(bytes)) }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// Runs `f` on the bytes (tests use it to corrupt an image in place).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        // A panic while holding this lock can only come from a test; the bytes are still valid.
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn out_of_range(offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("access of {len} bytes at byte {offset} beyond the end of a {size}-byte disk"),
    )
}

impl Disk for MemDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.lock();
        let start = usize::try_from(offset).map_err(|_| out_of_range(offset, buf.len(), bytes.len() as u64))?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| out_of_range(offset, buf.len(), bytes.len() as u64))?;
        buf.copy_from_slice(&bytes[start..end]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut bytes = self.lock();
        let len = bytes.len() as u64;
        let start = usize::try_from(offset).map_err(|_| out_of_range(offset, buf.len(), len))?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e as u64 <= len)
            .ok_or_else(|| out_of_range(offset, buf.len(), len))?;
        bytes[start..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.lock().len() as u64
    }
    fn reader(&self, _offset: u64, _len: usize) -> io::Result<Option<SharedReader>> {
        // (Memory is read faster than a thread is woken.)
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    //! One suite for every image-file backend (and `MemDisk` where it applies).

    use super::*;
    use crest_rng::Stream;

    const SIZE: u64 = 8 << 20;

    fn with_each(test: impl Fn(DiskIo, &Path)) {
        for io in DiskIo::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            test(io, &dir.path().join("img"));
        }
    }

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        Stream::from_seed_u64(seed).fill_bytes(&mut v);
        v
    }

    fn read(disk: &dyn Disk, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        disk.read_at(offset, &mut buf).expect("read");
        buf
    }

    #[test]
    fn write_zeroes_clears_exactly_its_range_after_queued_writes() {
        with_each(|io, path| {
            let mut disk = io.create(path, SIZE).expect("create");
            let mut model = MemDisk::new(SIZE);
            let seed = crest_rng::next_u64();
            eprintln!("{}: seed {seed}", io.name());
            let mut rng = Stream::from_seed_u64(seed);
            for i in 0..64u64 {
                let off = rng.below(SIZE - 70_000);
                let data = pattern(i, 1 + rng.below(60_000) as usize);
                disk.write_at(off, &data).expect("write");
                model.write_at(off, &data).expect("model");
                // Block-aligned ranges (what the store asks) and odd ones (the fallback).
                let (zoff, zlen) = if i % 2 == 0 {
                    (rng.below(SIZE / 4096 - 20) * 4096, (1 + rng.below(16)) * 4096)
                } else {
                    (rng.below(SIZE - 70_000), 1 + rng.below(65_536))
                };
                disk.write_zeroes(zoff, zlen).expect("zero");
                model.write_zeroes(zoff, zlen).expect("model");
                assert!(read(&*disk, 0, SIZE as usize) == model.snapshot(), "{}: after zeroing {i}", io.name());
            }
            disk.flush().expect("flush");
            drop(disk);
            assert!(read(&FileDisk::open(path).expect("reopen"), 0, SIZE as usize) == model.snapshot());
        });
    }

    #[test]
    fn read_after_write_before_flush() {
        with_each(|io, path| {
            let mut disk = io.create(path, SIZE).expect("create");
            // More writes than the ring holds, each read back at once and again at the end.
            let mut expect = Vec::new();
            for i in 0..(uring::QUEUE_DEPTH as u64 * 3) {
                let off = (i * 7919 % 2000) * 4096 + (i % 5) * 100;
                let data = pattern(i, 1000 + (i as usize % 9000));
                disk.write_at(off, &data).expect("write");
                assert_eq!(read(&*disk, off, data.len()), data, "{}: write {i} read back", io.name());
                expect.push((off, data));
            }
            // The same place twice in a row: the second wins.
            disk.write_at(4096, &[1u8; 4096]).expect("write");
            disk.write_at(4096 + 100, &[2u8; 10]).expect("write");
            let got = read(&*disk, 4096, 4096);
            assert!(got[..100].iter().all(|&b| b == 1) && got[100..110].iter().all(|&b| b == 2));
            assert!(got[110..].iter().all(|&b| b == 1), "{}", io.name());
            disk.flush().expect("flush");
            drop(disk);
            // What was flushed is in the file, for any backend to read.
            let disk = FileDisk::open(path).expect("reopen");
            let mut model = MemDisk::new(SIZE);
            for (off, data) in &expect {
                model.write_at(*off, data).expect("model");
            }
            model.write_at(4096, &[1u8; 4096]).expect("model");
            model.write_at(4096 + 100, &[2u8; 10]).expect("model");
            let whole = read(&disk, 0, SIZE as usize);
            assert!(whole == model.snapshot(), "{}: image differs from the model after flush", io.name());
        });
    }

    #[test]
    fn overlapping_batch_last_wins() {
        with_each(|io, path| {
            let mut disk = io.create(path, SIZE).expect("create");
            let (a, b, c, d) = (pattern(1, 8192), pattern(2, 4096), pattern(3, 100), pattern(4, 5000));
            // Unsorted, overlapping, plus enough disjoint writes to engage threads and ring.
            let mut writes: Vec<(u64, &[u8])> = vec![(0, &a), (4096, &b), (10, &c), (2000, &d), (4100, &c)];
            let filler: Vec<Vec<u8>> = (0..300).map(|i| pattern(100 + i, 4096)).collect();
            for (i, f) in filler.iter().enumerate() {
                writes.push((1 << 20 | (i as u64 * 4096), f));
            }
            writes.push((1 << 20, &c));
            disk.write_batch(&writes).expect("batch");
            let mut model = MemDisk::new(SIZE);
            model.write_batch(&writes).expect("model");
            let len = (1 << 20) + 301 * 4096;
            assert!(read(&*disk, 0, len) == read(&model, 0, len), "{}: overlapping batch", io.name());
            // A disjoint sorted batch (the store's shape) after a queued write to the same place.
            disk.write_at(3 << 20, &[9u8; 4096]).expect("write");
            let sorted: Vec<(u64, &[u8])> =
                filler.iter().enumerate().map(|(i, f)| ((3 << 20) + i as u64 * 4096, &f[..])).collect();
            disk.write_batch(&sorted).expect("batch");
            assert_eq!(read(&*disk, 3 << 20, 4096), filler[0], "{}: batch after write_at", io.name());
            disk.flush().expect("flush");
        });
    }

    #[test]
    fn random_operations_match_memdisk() {
        with_each(|io, path| {
            let mut disk = io.create(path, 1 << 20).expect("create");
            let mut model = MemDisk::new(1 << 20);
            let mut rng = Stream::from_seed_u64(42);
            for step in 0..2000u64 {
                let off = rng.below((1 << 20) - 20_000);
                match rng.below(10) {
                    0..=4 => {
                        let data = pattern(step, 1 + rng.below(12_000) as usize);
                        disk.write_at(off, &data).expect("write");
                        model.write_at(off, &data).expect("model");
                    }
                    5 | 6 => {
                        // Half of them block-aligned (the store's nodes; direct in the uring backend).
                        let bufs: Vec<(u64, Vec<u8>)> = (0..rng.below(40))
                            .map(|k| match rng.below(2) {
                                0 => (rng.below((1 << 20) - 5000), pattern(step * 100 + k, rng.below(5000) as usize)),
                                _ => {
                                    (rng.below(200) * 4096, pattern(step * 100 + k, 4096 * (1 + rng.below(4) as usize)))
                                }
                            })
                            .collect();
                        let writes: Vec<(u64, &[u8])> = bufs.iter().map(|(o, b)| (*o, &b[..])).collect();
                        disk.write_batch(&writes).expect("batch");
                        model.write_batch(&writes).expect("model");
                    }
                    7 | 8 => {
                        let len = 1 + rng.below(16_000) as usize;
                        assert!(read(&*disk, off, len) == read(&model, off, len), "{}: step {step}", io.name());
                    }
                    _ => disk.flush().expect("flush"),
                }
            }
            assert!(read(&*disk, 0, 1 << 20) == model.snapshot(), "{}: final image", io.name());
        });
    }

    #[test]
    fn access_past_the_end_names_the_offset() {
        with_each(|io, path| {
            let mut disk = io.create(path, SIZE).expect("create");
            let e = disk.write_at(SIZE - 100, &[0u8; 4096]).expect_err("write past the end");
            assert!(e.to_string().contains(&format!("at byte {}", SIZE - 100)), "{}: {e}", io.name());
            let e = disk.write_batch(&[(0, &[0u8; 10]), (SIZE, &[1u8; 1])]).expect_err("batch past the end");
            assert!(e.to_string().contains(&format!("at byte {SIZE}")), "{}: {e}", io.name());
            let mut buf = [0u8; 10];
            let e = disk.read_at(SIZE - 5, &mut buf).expect_err("read past the end");
            assert!(e.to_string().contains(&format!("at byte {}", SIZE - 5)), "{}: {e}", io.name());
            assert_eq!(std::fs::metadata(path).expect("stat").len(), SIZE, "{}: the file did not grow", io.name());
            disk.flush().expect("nothing failed in the kernel");
        });
    }

    /// `/dev/full` fails every write with ENOSPC: a real error from the kernel.
    fn dev_full(io: DiskIo) -> Option<Box<dyn Disk>> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open("/dev/full").ok()?;
        let inner = FileDisk::from_file(file, SIZE);
        Some(match io {
            DiskIo::Sync => Box::new(inner),
            DiskIo::Pool => Box::new(PoolDisk::from_disk(inner)),
            DiskIo::Uring => Box::new(UringDisk::from_disk(inner).expect("io_uring")),
        })
    }

    #[test]
    fn write_errors_surface_by_flush() {
        for io in DiskIo::ALL {
            let Some(mut disk) = dev_full(io) else {
                eprintln!("no /dev/full; skipped");
                return;
            };
            let early = disk.write_at(8192, &[1u8; 4096]);
            let flushed = disk.flush();
            let e = early.err().or(flushed.err()).expect("the write error is reported by flush at the latest");
            assert!(e.to_string().contains("at byte 8192"), "{}: {e}", io.name());
            assert_eq!(e.raw_os_error().or(Some(28)), Some(28), "{}: ENOSPC kept", io.name());
            if io == DiskIo::Uring {
                // A lost write is never followed by a successful flush.
                assert!(disk.flush().is_err(), "uring: flush after a failed write");
            }
            let Some(mut disk) = dev_full(io) else { return };
            let bufs: Vec<Vec<u8>> = (0..100).map(|i| pattern(i, 4096)).collect();
            let writes: Vec<(u64, &[u8])> = bufs.iter().enumerate().map(|(i, b)| (i as u64 * 4096, &b[..])).collect();
            let e = disk.write_batch(&writes).expect_err("batch on /dev/full");
            assert!(e.to_string().contains("at byte 0"), "{}: the earliest failed write is named: {e}", io.name());
        }
    }

    /// Direct batch writes over blocks the page cache holds (buffered writes just before)
    /// must be what later buffered reads see.
    #[test]
    fn uring_direct_batches_stay_coherent_with_the_page_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut disk = UringDisk::create(&dir.path().join("img"), SIZE).expect("create");
        let direct = disk.is_direct();
        eprintln!("O_DIRECT batches under {}: {direct}", dir.path().display());
        disk.write_at(0, &[1u8; 16384]).expect("write");
        assert_eq!(read(&disk, 4096, 10), [1u8; 10]);
        let (a, b) = (pattern(1, 8192), pattern(2, 100));
        disk.write_batch(&[(0, &a), (8192 + 10, &b)]).expect("batch");
        assert_eq!(read(&disk, 0, 8192), a);
        assert_eq!(read(&disk, 8192 + 10, 100), b);
        disk.flush().expect("flush");
        disk.write_at(4096, &[3u8; 4096]).expect("write");
        assert_eq!(read(&disk, 4096, 4096), [3u8; 4096]);
        assert_eq!(disk.is_direct(), direct, "no fallback to buffered writes on the way");
    }

    #[test]
    fn second_open_is_refused() {
        with_each(|io, path| {
            let _disk = io.create(path, SIZE).expect("create");
            for other in DiskIo::ALL {
                let Err(e) = other.open(path) else { panic!("{} then {}: second open", io.name(), other.name()) };
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{} then {}", io.name(), other.name());
            }
        });
    }

    #[test]
    fn recording_disk_records_a_batch_write_by_write() {
        use crate::disk::crash::{flush_points, image_at, CrashPoint, Event, RecordingDisk};
        let rec = RecordingDisk::new(vec![0u8; 1 << 16]);
        let mut disk: Box<dyn Disk> = Box::new(rec.clone());
        disk.write_batch(&[(0, &[1u8; 10]), (100, &[2u8; 10])]).expect("batch");
        disk.flush().expect("flush");
        disk.write_at(0, &[3u8; 5]).expect("write");
        let events = rec.events();
        assert_eq!(events.iter().filter(|e| matches!(e, Event::Write { .. })).count(), 3);
        assert_eq!(flush_points(&events), vec![3]);
        let img = image_at(rec.base(), &events, &CrashPoint { durable: 3, survivors: vec![] });
        assert_eq!(&img[..12], &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(rec.current()[..5], [3u8; 5]);
    }

    /// The store end to end on each backend: files inline and in blocks, commits, a reopen
    /// with the same backend, and fsck.
    #[test]
    fn store_workload_on_each_backend() {
        use crate::{check, FileKind, MkfsOptions, Store, Timespec, ROOT_INO};
        with_each(|io, path| {
            let now = Timespec::new(1_700_000_000, 0);
            Store::mkfs(
                io.create(path, 64 << 20).expect("create"),
                &MkfsOptions { now, fsid: None, seed: None, meta_copies: 2 },
            )
            .expect("mkfs");
            let mut store = Store::open(io.open(path).expect("open")).expect("open store");
            let mut files = Vec::new();
            for i in 0..300u64 {
                let name = format!("f{i}");
                let ino = store
                    .create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now)
                    .expect("create")
                    .ino;
                let data = pattern(i, if i % 3 == 0 { 100 } else { 1 + (i as usize * 997) % 40_000 });
                store.write(ino, 0, &data, now).expect("write");
                // Read back before any commit: the data blocks may still be queued.
                assert_eq!(store.read(ino, 0, data.len() as u64).expect("read"), data, "{}", io.name());
                if i % 100 == 99 {
                    store.commit().expect("commit");
                }
                files.push((name, data));
            }
            drop(store.close().expect("close"));
            let mut store = Store::open(io.open(path).expect("reopen")).expect("reopen store");
            for (name, data) in &files {
                let ino = store.lookup(ROOT_INO, name.as_bytes()).expect("lookup").ino;
                assert_eq!(&store.read(ino, 0, data.len() as u64).expect("read"), data, "{}: {name}", io.name());
            }
            drop(store.close().expect("close"));
            let report = check::fsck(io.open(path).expect("open for fsck")).expect("fsck");
            assert!(report.is_clean(), "{}: {:?}", io.name(), report.problems);
        });
    }
}
