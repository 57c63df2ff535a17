//! The one seam between the store and storage: the `Disk` trait, with an image-file
//! implementation and an in-memory one. Crash tests wrap `Disk` to record writes and
//! flushes (see `crash`), so everything the store does to storage passes through here.
//!
//! Contract the store relies on (written down in docs/format.md):
//! - a write may be reordered with any other write issued since the last `flush`, and may
//!   be lost or torn if power fails before the next `flush` returns;
//! - after `flush` returns Ok, every earlier write is durable;
//! - a read returns the last data written at that place (durable or not).

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
    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
}

/// An image file or block device, locked exclusively while open.
#[derive(Debug)]
pub struct FileDisk {
    file: File,
    size: u64,
}

impl FileDisk {
    /// Opens an existing image read-write and takes an exclusive lock on it, so a second
    /// process serving the same image gets `WouldBlock` and a clear message.
    pub fn open(path: &Path) -> io::Result<FileDisk> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{} is in use by another crest process", path.display()),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let size = device_size(&file)?;
        Ok(FileDisk { file, size })
    }

    /// Creates (or truncates) a sparse image file of `size_bytes`.
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<FileDisk> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use by another crest process", path.display()),
            ),
            std::fs::TryLockError::Error(e) => e,
        })?;
        if file.metadata()?.file_type().is_file() {
            file.set_len(0)?;
            file.set_len(size_bytes)?;
        }
        let size = device_size(&file)?;
        Ok(FileDisk { file, size })
    }
}

fn device_size(file: &File) -> io::Result<u64> {
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

impl Disk for FileDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size_bytes(&self) -> u64 {
        self.size
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

fn out_of_range(offset: u64, len: usize, size: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("access of {len} bytes at {offset} beyond the end of a {size}-byte disk"),
    )
}

impl Disk for MemDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.lock();
        let start = usize::try_from(offset).map_err(|_| out_of_range(offset, buf.len(), bytes.len()))?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| out_of_range(offset, buf.len(), bytes.len()))?;
        buf.copy_from_slice(&bytes[start..end]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut bytes = self.lock();
        let len = bytes.len();
        let start = usize::try_from(offset).map_err(|_| out_of_range(offset, buf.len(), len))?;
        let end =
            start.checked_add(buf.len()).filter(|&e| e <= len).ok_or_else(|| out_of_range(offset, buf.len(), len))?;
        bytes[start..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.lock().len() as u64
    }
}
