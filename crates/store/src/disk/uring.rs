//! [`UringDisk`]: an image file driven through io_uring.
//!
//! - `write_at` copies the buffer into a slot of the ring, queues a write for it and
//!   returns; queued writes go to the kernel [`SUBMIT_EVERY`] at a time (one
//!   `io_uring_enter` for many writes), or sooner when something waits on them. At most
//!   [`QUEUE_DEPTH`] writes and [`MAX_QUEUED_BYTES`] bytes are queued; past that `write_at`
//!   waits for completions first. These writes are buffered, so the page cache serves the
//!   reads that often follow them (the edge blocks of the next small write).
//! - `write_batch` (a commit's dirty nodes) first lets queued single writes land, then
//!   (from [`MIN_RING_BATCH`] writes on; smaller batches are plain `pwrite`s) submits the
//!   batch's writes together, keeping up to [`QUEUE_DEPTH`] in flight and
//!   refilling as completions arrive, and returns when all are done, with the error of the
//!   earliest failed write of the batch. Block-aligned writes (every node) are copied into
//!   the slot's own 4 KiB-aligned buffer, writes that follow each other on disk joined
//!   into one of up to [`MAX_RUN`] bytes (the allocator lays a commit's nodes out
//!   contiguously), and go through a second descriptor opened with `O_DIRECT`; other
//!   writes are buffered, from the
//!   caller's memory, and the call does not return or unwind while the kernel may still
//!   read it.
//! - `flush` waits for every queued write, reports the first one that failed (and keeps
//!   reporting it: after a lost write no flush may claim durability), then `fdatasync`s.
//! - `read_at` (and `write_at`) first wait for any queued write that overlaps the range,
//!   so a read sees the last write to a place and two writes to one place land in order;
//!   a batch whose own writes overlap is written one write at a time, in order.
//! - A completion that wrote less than asked (short write) is resubmitted for the rest;
//!   `EINTR`/`EAGAIN` completions are resubmitted unchanged.
//!
//! Why `O_DIRECT` for batches: buffered io_uring writes to ext4 are handed to io_uring's
//! worker threads, which measured no faster than plain `pwrite` (often slower: the
//! `uring-buf` rows of `benches/diskio.rs`), while direct writes reach the device
//! together, up to [`QUEUE_DEPTH`] deep, and leave `fdatasync` little to do. Joining
//! adjacent writes matters: a commit's nodes are mostly contiguous, and 4 KiB direct
//! writes one by one made whole-store commits up to 2x slower than buffered writeback,
//! which merges them. A direct write over pages in the page cache makes the kernel drop
//! them first (so buffered reads still see the new data) and may push the write to a
//! worker thread; that is the cost of mixing. Where `O_DIRECT` is refused (tmpfs at
//! open; `EINVAL` from a write) batches fall back to buffered writes.
//!
//! Invariants: read-after-write holds; a failed write is reported no later than the next
//! `flush`; no buffer the kernel may still read is freed or changed (a slot's buffers are
//! touched only while the slot is free; dropping the disk waits for every queued write,
//! and if the ring cannot be waited on the buffers are leaked rather than freed). The
//! tests in `disk/mod.rs` check the first two against every backend (with entries capped at
//! 6000 bytes so that larger writes take the short-write path); `/dev/full` supplies real
//! write errors (ENOSPC) that surface from `flush`.
//!
//! This is the only module of the workspace with `unsafe`: the io-uring crate's
//! `SubmissionQueue::push` is `unsafe` because the kernel uses the entry's buffer after
//! the call returns. Its one use carries a SAFETY comment.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use io_uring::{opcode, types, IoUring};

use super::{batch_overlaps, check_range, io_context, Disk, FileDisk};

/// Entries of the submission queue and most writes in flight at once.
pub const QUEUE_DEPTH: usize = 256;
/// Most bytes of `write_at` copies held by queued writes.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// Queued `write_at`s are handed to the kernel in groups of this many.
pub const SUBMIT_EVERY: usize = 16;
/// Longest run of adjacent batch writes joined into one direct write.
pub const MAX_RUN: usize = 1 << 20;
/// Most bytes of staged copies in flight at once.
const MAX_STAGED_IN_FLIGHT: usize = 64 << 20;
/// A slot keeps its staging buffer between batches up to this capacity.
const KEEP_STAGE: usize = 64 << 10;
/// Largest single write entry (a longer buffer is written in several, like a short write).
/// Unit tests use a small value so that every write above it takes the short-write path.
const MAX_ENTRY_BYTES: usize = if cfg!(test) { 6000 } else { 1 << 30 };
/// Batches with fewer writes are written with plain `pwrite`s (buffered): a commit for a
/// client's fsync is a handful of nodes, and the ring measured slower there (unit tests
/// use a small value so both paths run).
pub const MIN_RING_BATCH: usize = if cfg!(test) { 8 } else { 64 };
/// Alignment of offset, length and memory of a direct write.
const DIRECT_ALIGN: usize = 4096;

/// An image file written through io_uring (see the module doc).
pub struct UringDisk {
    // Declared before the files so that it drops first: dropping the ring waits for
    // every queued write, and only then are the files closed.
    ring: Mutex<Ring>,
    /// The same file opened with `O_DIRECT`, for aligned batch writes.
    direct: Option<File>,
    inner: FileDisk,
}

impl std::fmt::Debug for UringDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDisk").field("inner", &self.inner).field("direct", &self.direct).finish_non_exhaustive()
    }
}

impl UringDisk {
    /// Opens an existing image (locked like [`FileDisk::open`]). Fails when io_uring is
    /// unavailable (old kernel, seccomp, `kernel.io_uring_disabled`).
    pub fn open(path: &Path) -> io::Result<UringDisk> {
        UringDisk::from_disk(FileDisk::open(path)?)?.with_direct(path)
    }

    /// Creates (or truncates) an image file of `size_bytes` (like [`FileDisk::create`]).
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<UringDisk> {
        UringDisk::from_disk(FileDisk::create(path, size_bytes)?)?.with_direct(path)
    }

    /// Checks that this process can set up a ring that writes (seccomp filters in
    /// containers, `kernel.io_uring_disabled` and old kernels refuse).
    pub fn available() -> io::Result<()> {
        new_ring().map(drop)
    }

    /// Sets up a ring for an open [`FileDisk`] (batches buffered).
    pub fn from_disk(inner: FileDisk) -> io::Result<UringDisk> {
        let uring = new_ring()?;
        let ring = Ring {
            uring,
            fd: types::Fd(inner.file().as_raw_fd()),
            direct_fd: None,
            slots: (0..QUEUE_DEPTH).map(|_| Slot::default()).collect(),
            free: (0..QUEUE_DEPTH).rev().collect(),
            in_flight: 0,
            batch_in_flight: 0,
            unsubmitted: 0,
            queued_bytes: 0,
            staged_bytes: 0,
            error: None,
            batch_error: None,
            cqes: Vec::with_capacity(QUEUE_DEPTH),
        };
        Ok(UringDisk { ring: Mutex::new(ring), direct: None, inner })
    }

    /// Opens `path` (the image this disk has open) a second time with `O_DIRECT` for
    /// aligned batch writes; where that is refused, batches stay buffered.
    fn with_direct(mut self, path: &Path) -> io::Result<UringDisk> {
        match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(file) => {
                self.ring_mut().direct_fd = Some(types::Fd(file.as_raw_fd()));
                self.direct = Some(file);
            }
            Err(e) => tracing::info!("{}: no O_DIRECT ({e}); batches are buffered", path.display()),
        }
        Ok(self)
    }

    /// Writes batches buffered too (benchmarks compare the two).
    pub fn buffered(mut self) -> UringDisk {
        self.ring_mut().direct_fd = None;
        self.direct = None;
        self
    }

    /// True while aligned batch writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.ring().direct_fd.is_some()
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // Only a panic inside this module can poison the lock; the ring's counters are
        // updated before anything that could panic, so its state is still usable.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the range, then waits for every queued write that overlaps it: a read of it
    /// after this sees the last write to each place.
    fn settle(&self, offset: u64, len: usize) -> io::Result<()> {
        check_range(offset, len, self.inner.size_bytes())?;
        let mut ring = self.ring();
        while ring.overlaps_queued(offset, len) {
            ring.wait_one(None)?;
        }
        Ok(())
    }

    fn ring_mut(&mut self) -> &mut Ring {
        self.ring.get_mut().unwrap_or_else(|p| p.into_inner())
    }
}

fn new_ring() -> io::Result<IoUring> {
    let unavailable = |e: io::Error| io::Error::new(e.kind(), format!("io_uring unavailable: {e}"));
    let uring = IoUring::new(QUEUE_DEPTH as u32).map_err(unavailable)?;
    let mut probe = io_uring::Probe::new();
    uring.submitter().register_probe(&mut probe).map_err(unavailable)?;
    if !probe.is_supported(opcode::Write::CODE) {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "io_uring unavailable: no IORING_OP_WRITE"));
    }
    Ok(uring)
}

/// The data a slot writes.
#[derive(Default)]
enum Buf {
    /// Slot unused.
    #[default]
    Free,
    /// A copy made by `write_at`, owned until the write completes.
    Owned(Vec<u8>),
    /// The write at this index of the running `write_batch`'s slice, from its memory.
    Batch(usize),
    /// The write at this index of the running batch, copied to the slot's `stage`.
    Staged(usize),
}

/// One write in flight (at most one entry of it is in the kernel at a time).
#[derive(Default)]
struct Slot {
    offset: u64,
    len: usize,
    /// Bytes already written (a short write is resubmitted from here).
    done: usize,
    /// The entry in the kernel goes through the `O_DIRECT` descriptor.
    direct: bool,
    buf: Buf,
    /// Kept across uses: `stage[stage_start..][..len]` is an aligned copy (`Buf::Staged`).
    stage: Vec<u8>,
    stage_start: usize,
}

impl Slot {
    /// The batch index of a batch write.
    fn batch_index(&self) -> Option<usize> {
        match self.buf {
            Buf::Batch(i) | Buf::Staged(i) => Some(i),
            Buf::Free | Buf::Owned(_) => None,
        }
    }

    /// Copies `parts` back to back into `stage` at a `DIRECT_ALIGN`-aligned address
    /// (before the slot's first entry is pushed).
    fn fill_stage(&mut self, parts: &[(u64, &[u8])], len: usize) {
        let need = len + DIRECT_ALIGN;
        if self.stage.capacity() < need {
            self.stage = Vec::with_capacity(need);
        }
        self.stage.clear();
        // `align_offset` may decline (usize::MAX); then the copy is unaligned and `push`
        // writes it buffered.
        let start = self.stage.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        self.stage.resize(start, 0);
        for (_, data) in parts {
            self.stage.extend_from_slice(data);
        }
        self.stage_start = start;
    }
}

type Batch<'a, 'b> = Option<&'a [(u64, &'b [u8])]>;

struct Ring {
    uring: IoUring,
    fd: types::Fd,
    /// `UringDisk::direct`, while batches use it.
    direct_fd: Option<types::Fd>,
    /// Indexed by the entries' `user_data`.
    slots: Vec<Slot>,
    free: Vec<usize>,
    in_flight: usize,
    batch_in_flight: usize,
    /// Entries pushed since the last `io_uring_enter`.
    unsubmitted: usize,
    queued_bytes: usize,
    /// Bytes of `Buf::Staged` copies in flight.
    staged_bytes: usize,
    /// First failed `write_at`, reported by every later write, batch and flush.
    error: Option<(io::ErrorKind, String)>,
    /// Earliest failed write of the running batch (by index).
    batch_error: Option<(usize, io::Error)>,
    cqes: Vec<(u64, i32)>,
}

/// A batch write that can go direct: aligned offset and length, not too long.
fn direct_shape(offset: u64, buf: &[u8]) -> bool {
    !buf.is_empty()
        && buf.len() <= MAX_RUN
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
        && buf.len().is_multiple_of(DIRECT_ALIGN)
}

impl Ring {
    /// The first failure of a queued write, if there was one.
    fn check_error(&self) -> io::Result<()> {
        match &self.error {
            Some((kind, msg)) => Err(io::Error::new(*kind, msg.clone())),
            None => Ok(()),
        }
    }

    /// True when a queued `write_at` touches bytes `offset..offset + len`.
    fn overlaps_queued(&self, offset: u64, len: usize) -> bool {
        let end = offset.saturating_add(len as u64);
        self.in_flight > self.batch_in_flight
            && self
                .slots
                .iter()
                .any(|s| matches!(s.buf, Buf::Owned(_)) && s.offset < end && offset < s.offset + s.len as u64)
    }

    /// Takes a free slot for a write (None when none is free).
    fn claim(&mut self, offset: u64, len: usize, buf: Buf) -> Option<usize> {
        let idx = self.free.pop()?;
        match &buf {
            Buf::Owned(_) => self.queued_bytes += len,
            Buf::Batch(_) => self.batch_in_flight += 1,
            Buf::Staged(_) => {
                self.batch_in_flight += 1;
                self.staged_bytes += len;
            }
            Buf::Free => {}
        }
        self.in_flight += 1;
        let slot = &mut self.slots[idx];
        (slot.offset, slot.len, slot.done, slot.direct, slot.buf) = (offset, len, 0, false, buf);
        Some(idx)
    }

    /// Returns a slot whose write is over (a `write_at` copy is dropped here).
    fn release(&mut self, idx: usize) {
        match std::mem::take(&mut self.slots[idx].buf) {
            Buf::Free => return,
            Buf::Owned(v) => self.queued_bytes -= v.len(),
            Buf::Batch(_) => self.batch_in_flight -= 1,
            Buf::Staged(_) => {
                self.batch_in_flight -= 1;
                let slot = &mut self.slots[idx];
                self.staged_bytes -= slot.len;
                if slot.stage.capacity() > KEEP_STAGE {
                    slot.stage = Vec::new();
                }
            }
        }
        self.in_flight -= 1;
        self.free.push(idx);
    }

    /// Ends a slot's write with an error, kept where its caller will see it.
    fn fail(&mut self, idx: usize, e: &io::Error) {
        let slot = &self.slots[idx];
        let err = io_context("write", slot.offset, slot.len, e);
        match slot.batch_index() {
            Some(i) => {
                if self.batch_error.as_ref().is_none_or(|(j, _)| i < *j) {
                    self.batch_error = Some((i, err));
                }
            }
            None => {
                if self.error.is_none() {
                    tracing::error!(%err, "queued write failed");
                    self.error = Some((err.kind(), err.to_string()));
                }
            }
        }
        self.release(idx);
    }

    /// Puts an entry for the rest of slot `idx`'s write on the submission queue. On
    /// failure the slot is ended with the error (nothing of it is left in the kernel).
    fn push(&mut self, idx: usize, batch: Batch<'_, '_>) -> io::Result<()> {
        let slot = &self.slots[idx];
        let data: &[u8] = match (&slot.buf, batch) {
            (Buf::Owned(v), _) => v,
            (Buf::Staged(_), _) => &slot.stage[slot.stage_start..][..slot.len],
            (Buf::Batch(i), Some(b)) => b[*i].1,
            (Buf::Batch(_), None) | (Buf::Free, _) => {
                let e = io::Error::new(io::ErrorKind::Interrupted, "write abandoned after a short write");
                self.fail(idx, &e);
                return Err(e);
            }
        };
        let rest = &data[slot.done.min(data.len())..];
        let at = slot.offset + slot.done as u64;
        // Staged copies aligned in offset, length and memory go direct.
        let direct_len = (MAX_ENTRY_BYTES / DIRECT_ALIGN * DIRECT_ALIGN).min(rest.len());
        let (fd, len, direct) = match self.direct_fd {
            Some(dfd)
                if matches!(slot.buf, Buf::Staged(_))
                    && at.is_multiple_of(DIRECT_ALIGN as u64)
                    && rest.len().is_multiple_of(DIRECT_ALIGN)
                    && direct_len > 0
                    && (rest.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) =>
            {
                (dfd, direct_len, true)
            }
            _ => (self.fd, rest.len().min(MAX_ENTRY_BYTES), false),
        };
        let entry = opcode::Write::new(fd, rest.as_ptr(), len as u32).offset(at).build().user_data(idx as u64);
        self.slots[idx].direct = direct;
        for attempt in 0..2 {
            // SAFETY: the entry makes the kernel read `len` bytes at `rest` until its
            // completion is reaped. `rest` lies in (a) the `Vec` of `Buf::Owned` in slot
            // `idx`, or (b) slot `idx`'s `stage`: both are changed or freed only while no
            // entry of the slot is in the kernel: before this push, or once `reap` has
            // seen this entry's completion and released the slot (moving a
            // `Vec` does not move its heap buffer; `Drop for Ring` waits for every slot,
            // and leaks the buffers if it cannot); or (c) a buffer of the slice borrowed by
            // the running `write_batch`, which neither returns nor unwinds until every
            // batch slot is released (`BatchGuard`). The files behind `self.fd` and
            // `self.direct_fd` outlive the ring (`UringDisk` drops `ring` first).
            let pushed = unsafe { self.uring.submission().push(&entry) };
            if pushed.is_ok() {
                self.unsubmitted += 1;
                return Ok(());
            }
            // The queue is full (cannot happen with one entry per slot, but be safe):
            // hand it to the kernel and try once more.
            if attempt == 0 {
                if let Err(e) = self.enter(0) {
                    self.fail(idx, &e);
                    return Err(e);
                }
            }
        }
        let e = io::Error::other("io_uring submission queue stays full");
        self.fail(idx, &e);
        Err(e)
    }

    /// Submits pushed entries and waits for `want` completions (retrying on EINTR).
    fn enter(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.uring.submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Completion queue full or no memory for now: reap, the caller comes back.
                Err(e) if matches!(e.kind(), io::ErrorKind::ResourceBusy | io::ErrorKind::WouldBlock) => break,
                Err(e) => return Err(io::Error::new(e.kind(), format!("io_uring_enter: {e}"))),
            }
        }
        self.unsubmitted = 0;
        Ok(())
    }

    /// Handles every completion already posted (no system call).
    fn reap(&mut self, batch: Batch<'_, '_>) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        cqes.extend(self.uring.completion().map(|c| (c.user_data(), c.result())));
        for &(user_data, res) in &cqes {
            let idx = user_data as usize;
            if self.slots.get(idx).is_none_or(|s| matches!(s.buf, Buf::Free)) {
                continue;
            }
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if e.kind() == io::ErrorKind::InvalidInput && self.slots[idx].direct && self.direct_fd.is_some() {
                    // The file system or device wants another alignment: buffered from now on.
                    tracing::warn!("O_DIRECT write refused ({e}); writing batches buffered");
                    self.direct_fd = None;
                    let _ = self.push(idx, batch); // a failure ends the slot with its error
                } else if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) {
                    let _ = self.push(idx, batch);
                } else {
                    self.fail(idx, &e);
                }
                continue;
            }
            let slot = &mut self.slots[idx];
            let wrote = res as usize;
            if wrote == 0 && slot.done < slot.len {
                self.fail(idx, &io::Error::new(io::ErrorKind::WriteZero, "the kernel wrote 0 bytes"));
                continue;
            }
            slot.done += wrote;
            if slot.done < slot.len {
                let _ = self.push(idx, batch); // short write: the rest
            } else {
                self.release(idx);
            }
        }
        self.cqes = cqes;
    }

    /// Submits what is pushed, waits for at least one completion and handles them all.
    fn wait_one(&mut self, batch: Batch<'_, '_>) -> io::Result<()> {
        self.enter(1)?;
        self.reap(batch);
        Ok(())
    }

    /// Waits until no `write_at` is queued.
    fn drain(&mut self) -> io::Result<()> {
        while self.in_flight > 0 {
            self.wait_one(None)?;
        }
        Ok(())
    }

    /// Queues a copy of `buf` for writing at `offset`.
    fn queue_write(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        // Two writes to the same place must land in order.
        while self.overlaps_queued(offset, buf.len()) {
            self.wait_one(None)?;
        }
        while self.in_flight > 0 && (self.free.is_empty() || self.queued_bytes + buf.len() > MAX_QUEUED_BYTES) {
            self.wait_one(None)?;
        }
        let Some(idx) = self.claim(offset, buf.len(), Buf::Owned(buf.to_vec())) else {
            return Err(io::Error::other("no free io_uring slot"));
        };
        self.push(idx, None)?;
        if self.unsubmitted >= SUBMIT_EVERY {
            self.enter(0)?;
        }
        self.reap(None);
        Ok(())
    }

    /// Writes the whole batch (no `write_at` is queued) and waits for it.
    fn run_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        // Overlapping writes go one at a time, in order, so the last one wins.
        let depth = if batch_overlaps(writes) { 1 } else { QUEUE_DEPTH };
        self.batch_error = None;
        let guard = BatchGuard { ring: self };
        let ring = &mut *guard.ring;
        let mut next = 0;
        let mut failed = false;
        while next < writes.len() || ring.batch_in_flight > 0 {
            while next < writes.len() && ring.in_flight < depth && !failed {
                let (offset, buf) = writes[next];
                if buf.is_empty() {
                    next += 1;
                    continue;
                }
                if ring.direct_fd.is_some() && direct_shape(offset, buf) {
                    // Join the writes that follow on disk into one direct write.
                    let (mut end, mut len) = (next + 1, buf.len());
                    while let Some(&(o, b)) = writes.get(end) {
                        if o != offset + len as u64 || !direct_shape(o, b) || len + b.len() > MAX_RUN {
                            break;
                        }
                        len += b.len();
                        end += 1;
                    }
                    if ring.batch_in_flight > 0 && ring.staged_bytes + len > MAX_STAGED_IN_FLIGHT {
                        break; // wait for completions first
                    }
                    let Some(idx) = ring.claim(offset, len, Buf::Staged(next)) else { break };
                    ring.slots[idx].fill_stage(&writes[next..end], len);
                    next = end;
                    // A failure is in `batch_error`; stop adding, let what is in flight finish.
                    failed = ring.push(idx, Some(writes)).is_err();
                } else {
                    let Some(idx) = ring.claim(offset, buf.len(), Buf::Batch(next)) else { break };
                    next += 1;
                    failed = ring.push(idx, Some(writes)).is_err();
                }
            }
            if failed {
                next = writes.len();
            }
            if ring.batch_in_flight > 0 {
                ring.wait_one(Some(writes))?;
            }
        }
        drop(guard);
        match self.batch_error.take() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Keeps `write_batch` from returning or unwinding while the kernel may still read the
/// caller's buffers.
struct BatchGuard<'r> {
    ring: &'r mut Ring,
}

impl Drop for BatchGuard<'_> {
    fn drop(&mut self) {
        let mut failures = 0;
        while self.ring.batch_in_flight > 0 {
            // Without the batch slice a short write from the caller's memory cannot be
            // resumed: that slot fails.
            if self.ring.wait_one(None).is_err() {
                failures += 1;
                if failures >= 100 {
                    // The kernel may still read buffers we are about to give back.
                    tracing::error!("io_uring cannot be waited on with writes in flight; aborting");
                    std::process::abort();
                }
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let mut failures = 0;
        while self.in_flight > 0 {
            if self.wait_one(None).is_err() {
                failures += 1;
                if failures >= 100 {
                    tracing::error!("io_uring cannot be waited on at close; leaking the queued buffers");
                    for slot in &mut self.slots {
                        if let Buf::Owned(v) = std::mem::take(&mut slot.buf) {
                            std::mem::forget(v);
                        }
                        std::mem::forget(std::mem::take(&mut slot.stage));
                    }
                    return;
                }
            }
        }
        if let Some((_, msg)) = &self.error {
            tracing::warn!(%msg, "a queued write failed and was never flushed");
        }
    }
}

impl Disk for UringDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.settle(offset, buf.len())?;
        self.inner.read_at(offset, buf)
    }

    fn reader(&self, offset: u64, len: usize) -> io::Result<Option<super::SharedReader>> {
        self.settle(offset, len)?;
        self.inner.reader(offset, len)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.inner.size_bytes())?;
        let ring = self.ring_mut();
        ring.check_error()?;
        if buf.is_empty() {
            return Ok(());
        }
        ring.queue_write(offset, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        let ring = self.ring_mut();
        ring.drain()?;
        ring.check_error()?;
        self.inner.flush().map_err(|e| io::Error::new(e.kind(), format!("fdatasync: {e}")))
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> io::Result<()> {
        // Queued writes to the range must not land after the zeroing.
        let ring = self.ring_mut();
        ring.drain()?;
        ring.check_error()?;
        self.inner.write_zeroes(offset, len)
    }

    fn write_batch(&mut self, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let size = self.inner.size_bytes();
        for (offset, buf) in writes {
            check_range(*offset, buf.len(), size)?;
        }
        let ring = self.ring_mut();
        ring.check_error()?;
        // Queued single writes land first (they might overlap the batch); a commit calls
        // `flush` right after its batch anyway.
        ring.drain()?;
        ring.check_error()?;
        if writes.len() < MIN_RING_BATCH {
            let file = self.inner.file();
            for (offset, buf) in writes {
                std::os::unix::fs::FileExt::write_all_at(file, buf, *offset)
                    .map_err(|e| io_context("write", *offset, buf.len(), &e))?;
            }
            return Ok(());
        }
        ring.run_batch(writes)
    }
}
