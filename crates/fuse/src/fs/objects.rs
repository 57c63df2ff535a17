//! File data in the data store's objects (docs/objects.md), moved by the mount itself:
//! a big write is PUT as a new object with a URL the server granted (`Op::Uploads`) and
//! then mapped into the file (`Op::MapObject`), answered here under exclusive rights and
//! written back like any write, or sent and waited for; a read the server answers
//! `Located` is fetched from the objects and every block checked against its CRC-32C.
//! The server never carries these bytes.
//!
//! A file read located once is read a window at a time: one request asks the file's
//! attributes and the locations of `WINDOW_BYTES` (no data of objects), and the mount
//! keeps that map with the version `(mtime, ctime, size)` those attributes give. The
//! reads inside the window go straight to the objects while the mount's valid attributes
//! of the file are that version (`prefetch.rs`'s rule: a change by another mount recalls
//! them first, one by this mount moves them), so a big file's reads cost the server one
//! request per window, not one per read.
//!
//! Which writes: at least `OBJECT_MIN_BYTES`, at a block-aligned offset (a whole object's
//! worth of a file written in order: a `cp`'s or a `dd`'s); smaller ones go to the image
//! as before. An image without a data store answers the first `Uploads` with EOPNOTSUPP
//! and the mount stops asking.

use super::*;
use crest_objects::{block_sums, first_bad_block, TransferError, Transfers, BLOCK_BYTES};
use std::collections::HashMap;
use std::sync::atomic::AtomicU8;

/// The smallest write that goes to an object.
pub const OBJECT_MIN_BYTES: usize = 1 << 20;
/// Ids asked for at once.
const UPLOADS_PER_ASK: u32 = 64;
/// A granted URL older than this is not used (the server signs them for 15 minutes).
const URL_FRESH: Duration = Duration::from_secs(10 * 60);
/// Reads asked again when an object was gone or its URL refused (an overwrite and the
/// collector got there between the answer and the fetch).
const READ_ATTEMPTS: usize = 3;
/// Bytes of a file one located window maps (the most one `Read` asks).
const WINDOW_BYTES: u64 = MAX_IO_BYTES as u64;
/// A window is used at most this long (its URLs are signed for 15 minutes).
const WINDOW_FRESH: Duration = Duration::from_secs(5 * 60);
/// Most files with a window kept (all dropped beyond).
const MAX_WINDOWS: usize = 4096;

/// The locations of a stretch of a file, kept for one version of it.
struct Window {
    version: crate::prefetch::Version,
    located: p::Located,
    at: Instant,
}

const UNKNOWN: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

/// The mount's object transfers and the ids it holds to upload to.
pub(super) struct ObjectIo {
    transfers: Transfers,
    state: AtomicU8,
    pool: Mutex<Vec<(p::Upload, Instant)>>,
    /// Files read located: their last window (`None` until one is asked).
    windows: Mutex<HashMap<u64, Option<Window>>>,
}

impl std::fmt::Debug for ObjectIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectIo {{ state: {} }}", self.state.load(Ordering::Relaxed))
    }
}

impl ObjectIo {
    pub(super) fn new(deadline: Duration) -> ObjectIo {
        ObjectIo {
            transfers: Transfers::new(deadline),
            state: AtomicU8::new(UNKNOWN),
            pool: Mutex::new(Vec::new()),
            windows: Mutex::new(HashMap::new()),
        }
    }
}

fn transfer_error(op: &'static str, e: &TransferError) -> Error {
    tracing::warn!("{op}: {e}");
    Error::Server { op, errno: libc::EIO, message: e.to_string() }
}

impl CrestFs {
    /// Whether a write of `len` bytes at `offset` goes to an object.
    pub(super) fn wants_object(&self, offset: u64, len: usize) -> bool {
        len >= OBJECT_MIN_BYTES
            && offset.is_multiple_of(BLOCK_BYTES as u64)
            && self.objects.state.load(Ordering::Relaxed) != OFF
            && self.client.view().protocol >= p::PROTOCOL_OBJECTS
    }

    /// Asks the server once, as the mount starts, whether it keeps file data in objects
    /// (and takes the first ids): if so, `st_blksize` says an object's worth.
    pub(super) fn probe_objects(&self) {
        if self.client.view().protocol < p::PROTOCOL_OBJECTS {
            return;
        }
        if let Some(u) = self.next_upload() {
            lock(&self.objects.pool).push((u, Instant::now()));
            crate::convert::set_reported_blksize(OBJECT_MIN_BYTES as u32);
        }
    }

    /// A fresh id and URL to upload to; `None` when the server keeps no data in objects
    /// (or cannot grant now: the write goes to the image).
    fn next_upload(&self) -> Option<p::Upload> {
        {
            let mut pool = lock(&self.objects.pool);
            pool.retain(|(_, at)| at.elapsed() < URL_FRESH);
            if let Some((u, _)) = pool.pop() {
                return Some(u);
            }
        }
        match self.one("uploads", Op::Uploads { count: UPLOADS_PER_ASK }) {
            Ok(Reply::Uploads(mut ups)) if !ups.is_empty() => {
                self.objects.state.store(ON, Ordering::Relaxed);
                let first = ups.pop();
                let now = Instant::now();
                lock(&self.objects.pool).extend(ups.into_iter().map(|u| (u, now)));
                first
            }
            Err(e) if e.errno() == Errno::EOPNOTSUPP => {
                tracing::debug!("no data store behind this server: writes stay in its image");
                self.objects.state.store(OFF, Ordering::Relaxed);
                None
            }
            Ok(r) => {
                tracing::warn!("{}", unexpected("uploads", &r));
                None
            }
            Err(e) => {
                tracing::debug!("{e}");
                None
            }
        }
    }

    /// Writes `data` at `offset` of `ino` as a new object: uploaded, then mapped here
    /// (exclusive rights: written back later) or through the server. `None`: not done
    /// (no id to be had); write it the usual way.
    pub(super) fn write_object(&self, ino: u64, offset: u64, data: &[u8]) -> Option<Result<p::Attr, Error>> {
        let upload = self.next_upload()?;
        let padded_len = data.len().div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let padded: std::borrow::Cow<'_, [u8]> = if padded_len == data.len() {
            data.into()
        } else {
            let mut v = data.to_vec();
            v.resize(padded_len, 0);
            v.into()
        };
        let csums = block_sums(&padded);
        if let Err(e) = self.objects.transfers.put_once(&upload.url, &padded) {
            return Some(Err(transfer_error("write", &e)));
        }
        let (len, id) = (data.len() as u64, upload.id);
        let here = self.change_locally(ino, 0, |c, clock| c.map_object_here(ino, offset, len, id, &csums, clock));
        if let Some(a) = here {
            return Some(Ok(a));
        }
        let since = self.stamp();
        let r = self.one("write", Op::MapObject { ino, offset, len, id, csums }).and_then(|r| want_attr("write", r));
        Some(r.inspect(|a| {
            lock(&self.inodes).changed_here(a);
            self.attr_changed(a, since);
        }))
    }

    /// The bytes of a located read: the image's as given, the objects' fetched and
    /// checked. `Ok(None)`: an object was gone or refused its URL (ask again).
    pub(super) fn fetch_located(&self, ino: u64, l: &p::Located) -> Result<Option<Vec<u8>>, Error> {
        let len = usize::try_from(l.len).ok().filter(|&n| n <= MAX_IO_BYTES as usize);
        let bad = |why: String| Error::Protocol { op: "read", got: why };
        let Some(len) = len else { return Err(bad(format!("a located read of {} bytes", l.len))) };
        let (start, end) = (l.offset, l.offset + len as u64);
        let mut out = vec![0u8; len];
        for part in &l.parts {
            match part {
                p::LocatedPart::Bytes { at, data } => {
                    let at = usize::try_from(*at).unwrap_or(usize::MAX);
                    let slot = at.checked_add(data.len()).and_then(|e| out.get_mut(at..e));
                    slot.ok_or_else(|| bad(format!("{} bytes at {at} of a read of {len}", data.len())))?
                        .copy_from_slice(data);
                }
                p::LocatedPart::Object { file_at, block, csums, url } => {
                    let n = csums.len() as u64 * BLOCK_BYTES as u64;
                    let (from, to) = (start.max(*file_at), end.min(file_at.saturating_add(n)));
                    if from >= to || !file_at.is_multiple_of(BLOCK_BYTES as u64) {
                        return Err(bad(format!("object part at {file_at} outside the read {start}..{end}")));
                    }
                    // The blocks the read needs, fetched whole so each can be checked.
                    let (b0, b1) = ((from - file_at) / BLOCK_BYTES as u64, (to - file_at).div_ceil(BLOCK_BYTES as u64));
                    // (A block number no object can have is the server's error, not a wrap.)
                    let at = block.checked_add(b0).and_then(|b| b.checked_mul(BLOCK_BYTES as u64));
                    let Some(at) = at else { return Err(bad(format!("object part at block {block}"))) };
                    let got = match self.objects.transfers.get_range(url, at, ((b1 - b0) as usize) * BLOCK_BYTES) {
                        Ok(g) => g,
                        Err(TransferError::NotFound | TransferError::Refused(403, _)) => return Ok(None),
                        Err(e) => return Err(transfer_error("read", &e)),
                    };
                    if let Some(i) = first_bad_block(&got, &csums[b0 as usize..b1 as usize]) {
                        let offset = file_at + (b0 + i as u64) * BLOCK_BYTES as u64;
                        tracing::error!(ino, offset, "checksum mismatch in the data store's object ({url})");
                        return Err(Error::Server {
                            op: "read",
                            errno: libc::EIO,
                            message: format!("inode {ino}: object block at file offset {offset} is damaged"),
                        });
                    }
                    let skip = (from - file_at - b0 * BLOCK_BYTES as u64) as usize;
                    out[(from - start) as usize..(to - start) as usize]
                        .copy_from_slice(&got[skip..skip + (to - from) as usize]);
                }
            }
        }
        Ok(Some(out))
    }

    /// A read of a file read located before, answered from its window (asking the server
    /// for a new one where the kept one does not cover it or is of another version).
    /// `None`: the file is not read located; ask the usual way.
    pub(super) fn read_through_window(&self, ino: u64, offset: u64, len: u32) -> Option<Result<Vec<u8>, Error>> {
        let now = Instant::now();
        let version = lock(&self.names).attr(ino, now).map(|a| crate::prefetch::Version::of(&a));
        let kept = {
            let windows = lock(&self.objects.windows);
            let w = windows.get(&ino)?;
            w.as_ref()
                .filter(|w| Some(w.version) == version && w.at.elapsed() < WINDOW_FRESH)
                .and_then(|w| slice(&w.located, offset, len, version.map(|v| v.size())))
        };
        if let Some(l) = kept {
            return match self.fetch_located(ino, &l) {
                Ok(Some(bytes)) => Some(Ok(bytes)),
                Ok(None) => {
                    self.drop_window(ino);
                    None
                }
                Err(e) => Some(Err(e)),
            };
        }
        // A new window: the attributes and the locations from the read's block on, in one
        // request (run together by the server, so the version is the map's).
        let start = offset - offset % BLOCK_BYTES as u64;
        let epoch = lock(&self.names).epoch();
        let ops = vec![Op::GetAttr { ino }, Op::Read { ino, offset: start, len: WINDOW_BYTES as u32 }];
        let mut r = match self.many("read", ops) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let (attr, read) = (nth("read", &mut r, 0), nth("read", &mut r, 1));
        match (attr, read) {
            (Ok(Reply::Attr(a)), Ok(Reply::Located(l))) if a.ino == ino => {
                lock(&self.names).hold_attr(&a, epoch, Instant::now());
                let version = crate::prefetch::Version::of(&a);
                let part = slice(&l, offset, len, Some(version.size()));
                let mut windows = lock(&self.objects.windows);
                if windows.len() >= MAX_WINDOWS {
                    windows.clear();
                }
                windows.insert(ino, Some(Window { version, located: l, at: Instant::now() }));
                drop(windows);
                part.map(|l| self.fetch_located(ino, &l).and_then(|b| b.ok_or_else(|| moved(ino))))
            }
            (_, Ok(Reply::Data(d))) => {
                // No object in that stretch now: read as any file from here on.
                lock(&self.objects.windows).remove(&ino);
                let from = (offset - start) as usize;
                Some(Ok(d.get(from..).map_or(Vec::new(), |d| d[..d.len().min(len as usize)].to_vec())))
            }
            (_, Err(e)) | (Err(e), _) => Some(Err(e)),
            (_, Ok(r)) => Some(Err(unexpected("read", &r))),
        }
    }

    /// The kernel forgot `ino`: nothing of it is kept.
    pub(super) fn forget_window(&self, ino: u64) {
        lock(&self.objects.windows).remove(&ino);
    }

    /// Drops the window of `ino` (an object of it moved on), still reading it through one.
    pub(super) fn drop_window(&self, ino: u64) {
        if let Some(w) = lock(&self.objects.windows).get_mut(&ino) {
            *w = None;
        }
    }

    /// A read's answer as bytes, fetching what is located in objects (asking again when
    /// an object moved on meanwhile). A file read located is read through windows next.
    pub(super) fn read_answer(&self, ino: u64, read: &Op, first: Reply) -> Result<Vec<u8>, Error> {
        let mut reply = first;
        for _ in 0..READ_ATTEMPTS {
            let Reply::Located(l) = reply else { return want_data("read", reply) };
            lock(&self.objects.windows).entry(ino).or_insert(None);
            if let Some(bytes) = self.fetch_located(ino, &l)? {
                return Ok(bytes);
            }
            tracing::debug!(ino, "an object of a located read is gone: reading again");
            reply = self.one("read", read.clone())?;
        }
        Err(moved(ino))
    }
}

fn moved(ino: u64) -> Error {
    Error::Server { op: "read", errno: libc::EIO, message: format!("inode {ino}: objects kept moving") }
}

/// The part of located window `l` a read of `len` bytes at `offset` needs, as a located
/// read of its own; `None` when the window does not cover it (clipped to the file's
/// `size`).
fn slice(l: &p::Located, offset: u64, len: u32, size: Option<u64>) -> Option<p::Located> {
    let size = size?;
    let end = offset.saturating_add(u64::from(len)).min(size);
    let (w0, w1) = (l.offset, l.offset.saturating_add(l.len));
    if offset < w0 || offset >= end || end > w1 {
        return None;
    }
    let mut parts = Vec::new();
    for part in &l.parts {
        match part {
            p::LocatedPart::Bytes { at, data } => {
                let s = w0.saturating_add(*at);
                let e = s.saturating_add(data.len() as u64);
                let (from, to) = (s.max(offset), e.min(end));
                if from < to {
                    let data = data[(from - s) as usize..(to - s) as usize].to_vec();
                    parts.push(p::LocatedPart::Bytes { at: from - offset, data });
                }
            }
            p::LocatedPart::Object { file_at, csums, .. } => {
                let e = file_at.saturating_add(csums.len() as u64 * BLOCK_BYTES as u64);
                if *file_at < end && e > offset {
                    parts.push(part.clone());
                }
            }
        }
    }
    Some(p::Located { offset, len: end - offset, parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(file_at: u64, blocks: usize) -> p::LocatedPart {
        p::LocatedPart::Object { file_at, block: 0, csums: vec![0; blocks], url: format!("u{file_at}") }
    }

    #[test]
    fn a_window_slice_keeps_what_the_read_needs() {
        // Window [4096, 4096 + 5 blocks): bytes at its start, an object, bytes, an object.
        let w = p::Located {
            offset: 4096,
            len: 5 * 4096,
            parts: vec![
                p::LocatedPart::Bytes { at: 0, data: vec![1; 4096] },
                object(8192, 2),
                p::LocatedPart::Bytes { at: 3 * 4096, data: vec![2; 100] },
                object(20480, 1),
            ],
        };
        let s = slice(&w, 6000, 4000, Some(1 << 20)).expect("inside");
        assert_eq!((s.offset, s.len), (6000, 4000));
        assert_eq!(s.parts.len(), 2, "{:?}", s.parts);
        assert_eq!(s.parts[0], p::LocatedPart::Bytes { at: 0, data: vec![1; 8192 - 6000] });
        assert_eq!(s.parts[1], object(8192, 2));
        let s = slice(&w, 16384, 200, Some(1 << 20)).expect("inside");
        assert_eq!(s.parts, vec![p::LocatedPart::Bytes { at: 0, data: vec![2; 100] }]);
        // Clipped to the file's size; outside the window or past the end: not from it.
        assert_eq!(slice(&w, 20480, 4096, Some(20500)).map(|s| s.len), Some(20));
        assert!(slice(&w, 0, 10, Some(1 << 20)).is_none());
        assert!(slice(&w, 20000, 5000, Some(1 << 20)).is_none());
        assert!(slice(&w, 20500, 10, Some(20500)).is_none());
        assert!(slice(&w, 5000, 10, None).is_none());
        // A hostile window (offsets near the end of the range) is refused, not wrapped.
        let h = p::Located { offset: u64::MAX - 10, len: 100, parts: vec![object(u64::MAX - 4096, 9)] };
        assert!(slice(&h, u64::MAX - 5, 3, Some(u64::MAX)).is_some_and(|s| s.parts.len() == 1));
    }
}
