//! Reading file data. A read is first laid out from the file's extents (`layout`: which
//! bytes come from an inline item, which from which disk blocks, with the checksum of
//! each), then carried out:
//! - on the store's thread (`Store::read_data`): a block that fails to read or to match
//!   its checksum is taken from its second copy, if it has one, and the bad copy is
//!   rewritten; else the read fails with `DataChecksum`;
//! - or on any thread (`ReadPlan::run`, from `Store::plan_read`), so that a server can
//!   move big reads and their checksums off the one thread that owns the store. The plan
//!   holds a pin that keeps the blocks it reads from reuse until it drops
//!   (`engine/pins.rs`), and a reader that saw the writes issued before it. It repairs
//!   nothing: at the first failure it answers `None`, and its caller reads again on the
//!   store's thread, which repairs, falls back or reports as above.

use crate::disk::SharedReader;
use crate::engine::checksum::crc32c;
use crate::engine::pins::ReadPin;
use crate::error::{Error, Result};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode};
use crate::limits::{BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::store::Store;

/// Where some of a read's bytes come from.
#[derive(Debug)]
enum Piece {
    /// Bytes of an inline item, at `at` in the output.
    Bytes { at: usize, data: Vec<u8> },
    /// Consecutive blocks from `disk_block` (`twin`: their second copies, or 0) holding
    /// file bytes from `file_at` on, one checksum each.
    Blocks { file_at: u64, disk_block: u64, twin: u64, csums: Vec<u32> },
}

/// A read's file range (clipped to the file) and where its bytes come from; what no
/// piece covers is a hole and reads as zeros.
#[derive(Debug)]
struct Layout {
    ino: u64,
    offset: u64,
    end: u64,
    pieces: Vec<Piece>,
}

impl Piece {
    fn in_object(&self) -> bool {
        matches!(self, Piece::Blocks { disk_block, .. } if crate::fs::objects::object_of(*disk_block).is_some())
    }
}

impl Layout {
    fn len(&self) -> usize {
        (self.end - self.offset) as usize
    }

    /// Bytes the pieces read from the disk.
    fn disk_bytes(&self) -> u64 {
        let blocks = |p: &Piece| match p {
            Piece::Blocks { csums, .. } => csums.len() as u64,
            Piece::Bytes { .. } => 0,
        };
        self.pieces.iter().map(blocks).sum::<u64>() * BLOCK_SIZE_U64
    }
}

/// Runs `fill` on a buffer for `nblocks` blocks holding file bytes from `file_at`: the
/// output itself where they lie wholly inside the read (a big read's middle), else a
/// copy whose part inside the read is then copied into `out`.
fn through_buffer<E>(
    out: &mut [u8],
    (offset, end): (u64, u64),
    file_at: u64,
    nblocks: usize,
    fill: impl FnOnce(&mut [u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let buf_len = nblocks * BLOCK_SIZE;
    if file_at >= offset && file_at + buf_len as u64 <= end {
        let at = (file_at - offset) as usize;
        return fill(&mut out[at..at + buf_len]);
    }
    let mut copy = vec![0u8; buf_len];
    fill(&mut copy)?;
    let from = offset.max(file_at);
    let to = end.min(file_at + buf_len as u64);
    out[(from - offset) as usize..(to - offset) as usize]
        .copy_from_slice(&copy[(from - file_at) as usize..(to - file_at) as usize]);
    Ok(())
}

/// What `Store::plan_read` decided.
#[derive(Debug)]
pub enum Planned {
    /// The bytes, read on the store's thread (small, inline or holes only, or a disk that
    /// hands out no reader).
    Read(Vec<u8>),
    /// A plan to run on another thread.
    Elsewhere(ReadPlan),
    /// Some of the bytes are in objects of the data store: the reader fetches them.
    Located(Located),
}

/// A read of a file whose data is partly or wholly in objects (`fs/objects.rs`): the
/// bytes of the image are given, the objects' are named with their checksums; what no
/// part covers is a hole (zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// File offset of the read's first byte.
    pub offset: u64,
    /// Bytes the read returns (clipped to the file).
    pub len: u64,
    /// Where they come from.
    pub parts: Vec<Part>,
}

/// Part of a located read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Bytes of the read from `at` (an offset into the read's bytes).
    Bytes {
        /// Offset in the read.
        at: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Blocks `block..block + csums.len()` of object `id` hold the file's bytes from
    /// `file_at` (block-aligned; the read uses the part inside it), one CRC-32C each.
    Object {
        /// File offset of the first block.
        file_at: u64,
        /// The object.
        id: u64,
        /// First block in the object.
        block: u64,
        /// CRC-32C of each block.
        csums: Vec<u32>,
    },
}

/// A read to carry out on any thread; its blocks stay unreused while it lives.
#[derive(Debug)]
pub struct ReadPlan {
    layout: Layout,
    reader: SharedReader,
    _pin: ReadPin,
}

impl ReadPlan {
    /// Bytes the read returns.
    pub fn len(&self) -> usize {
        self.layout.len()
    }

    /// True for a read of nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads and verifies the planned bytes; `None` if a block failed to read or to match
    /// its checksum (then read again with `Store::read`, which repairs or reports).
    pub fn run(&self) -> Option<Vec<u8>> {
        let l = &self.layout;
        let mut out = vec![0u8; l.len()];
        for piece in &l.pieces {
            match piece {
                Piece::Bytes { at, data } => out[*at..*at + data.len()].copy_from_slice(data),
                Piece::Blocks { file_at, disk_block, csums, .. } => {
                    through_buffer(&mut out, (l.offset, l.end), *file_at, csums.len(), |buf| {
                        self.reader.read_at(disk_block * BLOCK_SIZE_U64, buf).map_err(drop)?;
                        let sums = buf.chunks_exact(BLOCK_SIZE).map(crc32c);
                        if sums.zip(csums).all(|(found, &expected)| found == expected) {
                            Ok(())
                        } else {
                            Err(())
                        }
                    })
                    .ok()?;
                }
            }
        }
        Some(out)
    }
}

impl Store {
    /// Where the bytes of file range `[offset, offset+len)` of `inode` (clipped to its
    /// size and to `MAX_READ_BYTES`) come from.
    fn layout(&mut self, inode: &Inode, offset: u64, len: u64) -> Result<Layout> {
        let mut l = Layout { ino: inode.ino, offset, end: offset, pieces: Vec::new() };
        if offset >= inode.size || len == 0 {
            return Ok(l);
        }
        let len = len.min(crate::limits::MAX_READ_BYTES);
        let end = inode.size.min(offset.saturating_add(len));
        l.end = end;
        for (file_off, ext) in self.extents_overlapping(inode.ino, offset, end)? {
            match ext {
                Extent::Inline(data) => {
                    let s = offset as usize;
                    if s < data.len() {
                        let e = data.len().min(end as usize);
                        l.pieces.push(Piece::Bytes { at: 0, data: data[s..e].to_vec() });
                    }
                }
                Extent::Regular { disk_block, twin, csums } => {
                    // The blocks of this extent that the read touches.
                    let first = offset.max(file_off) / BLOCK_SIZE_U64 - file_off / BLOCK_SIZE_U64;
                    let last = ((end.min(file_off + csums.len() as u64 * BLOCK_SIZE_U64) - 1) / BLOCK_SIZE_U64)
                        - file_off / BLOCK_SIZE_U64;
                    l.pieces.push(Piece::Blocks {
                        file_at: file_off + first * BLOCK_SIZE_U64,
                        disk_block: disk_block + first,
                        twin: if twin == 0 { 0 } else { twin + first },
                        csums: csums[first as usize..=last as usize].to_vec(),
                    });
                }
            }
        }
        Ok(l)
    }

    /// Reads file bytes `[offset, offset+len)` clipped to the file size, verifying every
    /// block's checksum. Holes read as zeros.
    pub(crate) fn read_data(&mut self, inode: &Inode, offset: u64, len: u64) -> Result<Vec<u8>> {
        let layout = self.layout(inode, offset, len)?;
        self.read_here(&layout)
    }

    /// Carries out a read on the store's thread (see the module doc).
    fn read_here(&mut self, l: &Layout) -> Result<Vec<u8>> {
        let mut out = vec![0u8; l.len()];
        for piece in &l.pieces {
            match piece {
                Piece::Bytes { at, data } => out[*at..*at + data.len()].copy_from_slice(data),
                Piece::Blocks { file_at, disk_block, twin, csums } => {
                    through_buffer(&mut out, (l.offset, l.end), *file_at, csums.len(), |buf| {
                        self.read_blocks_checked(l.ino, *file_at, (*disk_block, *twin), csums, buf)
                    })?;
                }
            }
        }
        Ok(out)
    }

    /// Reads blocks `disk_block..` (file bytes from `file_at`) into `buf` and checks each
    /// against `csums`, taking a bad one from its second copy where there is one.
    fn read_blocks_checked(
        &mut self,
        ino: u64,
        file_at: u64,
        (disk_block, twin): (u64, u64),
        csums: &[u32],
        buf: &mut [u8],
    ) -> Result<()> {
        let read = match crate::fs::objects::object_of(disk_block) {
            Some(_) => self.read_object_blocks(disk_block, buf),
            None => self.pager.read_blocks(disk_block, buf),
        };
        if read.is_err() && twin == 0 {
            return read;
        }
        for (i, chunk) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            let expected = csums[i];
            let found = crc32c(chunk);
            if read.is_ok() && found == expected {
                continue;
            }
            let block = disk_block + i as u64;
            let file_offset = file_at + i as u64 * BLOCK_SIZE_U64;
            if twin != 0 && self.read_twin_block(twin + i as u64, expected, block, chunk) {
                continue;
            }
            tracing::error!(ino, file_offset, block, "data checksum mismatch");
            return Err(Error::DataChecksum { ino, file_offset, block, expected, found });
        }
        Ok(())
    }

    /// Reads the second copy of data block `block` (at `at`) into `out` if it holds the
    /// bytes `expected` sums, and rewrites the bad first copy from it (a log line says so).
    fn read_twin_block(&mut self, at: u64, expected: u32, block: u64, out: &mut [u8]) -> bool {
        let mut copy = vec![0u8; BLOCK_SIZE];
        if self.pager.read_blocks(at, &mut copy).is_err() || crc32c(&copy) != expected {
            return false;
        }
        tracing::warn!(block, copy = at, "data block bad; using its second copy");
        self.pager.rewrite_copy(block, &copy);
        out.copy_from_slice(&copy);
        true
    }

    /// Plans a read of regular file `ino` (as [`Store::read`]): one that reads at least
    /// `elsewhere_from` bytes from the disk becomes a [`ReadPlan`] for another thread;
    /// a smaller one is read here.
    pub fn plan_read(&mut self, ino: u64, offset: u64, len: u64, elsewhere_from: u64) -> Result<Planned> {
        self.enter(ino)?;
        let inode = self.getattr(ino)?;
        match inode.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(Error::IsDir(ino)),
            _ => return Err(Error::Invalid(format!("inode {ino} is not a regular file"))),
        }
        let layout = self.layout(&inode, offset, len)?;
        if layout.pieces.iter().any(Piece::in_object) {
            return self.locate(&layout).map(Planned::Located);
        }
        if layout.disk_bytes() < elsewhere_from.max(1) {
            return self.read_here(&layout).map(Planned::Read);
        }
        let mut runs = Vec::new();
        let mut reader = None;
        for piece in &layout.pieces {
            if let Piece::Blocks { disk_block, csums, .. } = piece {
                match self.pager.shared_reader(*disk_block, csums.len() as u64)? {
                    Some(r) => reader = Some(r),
                    None => return self.read_here(&layout).map(Planned::Read),
                }
                runs.push((*disk_block, csums.len() as u64));
            }
        }
        let pin = self.pager.pin(runs);
        match reader {
            Some(reader) => Ok(Planned::Elsewhere(ReadPlan { layout, reader, _pin: pin })),
            None => self.read_here(&layout).map(Planned::Read),
        }
    }

    /// A located read: the image's bytes read here, the objects' named.
    fn locate(&mut self, l: &Layout) -> Result<Located> {
        let mut parts = Vec::with_capacity(l.pieces.len());
        for piece in &l.pieces {
            match piece {
                Piece::Bytes { at, data } => parts.push(Part::Bytes { at: *at as u64, data: data.clone() }),
                Piece::Blocks { file_at, disk_block, csums, .. } if piece.in_object() => {
                    let (id, block) = crate::fs::objects::object_of(*disk_block).unwrap_or_default();
                    parts.push(Part::Object { file_at: *file_at, id, block, csums: csums.clone() });
                }
                Piece::Blocks { file_at, disk_block, twin, csums } => {
                    let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
                    self.read_blocks_checked(l.ino, *file_at, (*disk_block, *twin), csums, &mut buf)?;
                    let from = l.offset.max(*file_at);
                    let to = l.end.min(file_at + buf.len() as u64);
                    let data = buf[(from - file_at) as usize..(to - file_at) as usize].to_vec();
                    parts.push(Part::Bytes { at: from - l.offset, data });
                }
            }
        }
        Ok(Located { offset: l.offset, len: l.len() as u64, parts })
    }
}
