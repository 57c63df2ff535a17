//! A recording disk for crash tests. It passes every write and flush to an in-memory
//! image and keeps a log of them, so a test can rebuild the image as it would be after a
//! power cut at any point: every write before the last completed flush is there, and any
//! subset (in any order — writes to different blocks commute, writes to the same place
//! are applied in issue order) of the writes issued since then may be.

use std::io;
use std::sync::{Arc, Mutex};

use crate::disk::{Disk, MemDisk};

/// One recorded event.
#[derive(Clone, Debug)]
pub enum Event {
    /// Bytes written at an offset.
    Write {
        /// Byte offset.
        offset: u64,
        /// Data.
        data: Vec<u8>,
    },
    /// A completed flush.
    Flush,
}

/// A `Disk` that records everything done to it.
#[derive(Clone, Debug)]
pub struct RecordingDisk {
    inner: MemDisk,
    log: Arc<Mutex<Vec<Event>>>,
    base: Arc<Vec<u8>>,
}

impl RecordingDisk {
    /// Starts recording on top of `base` (the image before the workload).
    pub fn new(base: Vec<u8>) -> RecordingDisk {
        RecordingDisk {
            inner: MemDisk::from_bytes(base.clone()),
            log: Arc::new(Mutex::new(Vec::new())),
            base: Arc::new(base),
        }
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The image before any recorded event.
    pub fn base(&self) -> &[u8] {
        &self.base
    }

    /// The image as it is now (every write applied).
    pub fn current(&self) -> Vec<u8> {
        self.inner.snapshot()
    }

    fn record(&self, e: Event) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
}

impl Disk for RecordingDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.record(Event::Write { offset, data: buf.to_vec() });
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.record(Event::Flush);
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn reader(&self, _offset: u64, _len: usize) -> io::Result<Option<super::SharedReader>> {
        // (Every read stays on the store's thread, where the test sees it.)
        Ok(None)
    }
}

/// A crash point: the image after `durable` events, plus the chosen writes among those
/// that followed (up to the next flush).
#[derive(Clone, Debug)]
pub struct CrashPoint {
    /// Events certainly on disk (everything up to and including a flush, or 0).
    pub durable: usize,
    /// Indices (into the event log) of later, unflushed writes that made it to disk.
    pub survivors: Vec<usize>,
}

/// Rebuilds the image a crash point leaves.
pub fn image_at(base: &[u8], events: &[Event], point: &CrashPoint) -> Vec<u8> {
    let mut img = base.to_vec();
    let mut apply = |e: &Event| {
        if let Event::Write { offset, data } = e {
            let s = *offset as usize;
            img[s..s + data.len()].copy_from_slice(data);
        }
    };
    events[..point.durable].iter().for_each(&mut apply);
    let mut survivors = point.survivors.clone();
    survivors.sort_unstable();
    for i in survivors {
        apply(&events[i]);
    }
    img
}

/// Indices where the log has a flush (a crash right after it loses nothing before it).
pub fn flush_points(events: &[Event]) -> Vec<usize> {
    events.iter().enumerate().filter(|(_, e)| matches!(e, Event::Flush)).map(|(i, _)| i + 1).collect()
}

/// A disk that fails every write and flush after a countdown: for I/O-error tests.
#[derive(Clone, Debug)]
pub struct FailingDisk {
    inner: MemDisk,
    remaining: Arc<Mutex<u64>>,
}

impl FailingDisk {
    /// Fails from the `ops_before_failure`-th write or flush on.
    pub fn new(inner: MemDisk, ops_before_failure: u64) -> FailingDisk {
        FailingDisk { inner, remaining: Arc::new(Mutex::new(ops_before_failure)) }
    }

    fn tick(&self) -> io::Result<()> {
        let mut r = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        if *r == 0 {
            return Err(io::Error::other("injected I/O failure"));
        }
        *r -= 1;
        Ok(())
    }
}

impl Disk for FailingDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.tick()?;
        self.inner.write_at(offset, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tick()?;
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn reader(&self, _offset: u64, _len: usize) -> io::Result<Option<super::SharedReader>> {
        // (Every read stays on the store's thread, where the test sees it.)
        Ok(None)
    }
}
