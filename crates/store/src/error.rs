//! The store's error type: grouped by cause, each variant carrying where it happened
//! (which block, which inode) and knowing its POSIX errno class. Only the FUSE edge turns
//! an error into an errno; everything inside passes `Error` along.

use crate::engine::key::Key;

/// Result alias for the store.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the store can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- the world failed -------------------------------------------------------------
    /// The disk reported an I/O error.
    #[error("I/O error {op} at byte {offset}: {source}")]
    Io {
        /// What was being done ("read", "write", "flush", "open").
        op: &'static str,
        /// Byte offset in the image, when meaningful.
        offset: u64,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An earlier write or flush failed; the store refuses to write until reopened.
    #[error("store is read-only after an earlier I/O failure ({0}); reopen it")]
    Poisoned(String),

    // ---- bytes on disk are wrong -----------------------------------------------------------
    /// A block's content failed verification (checksum, header fields, structure).
    #[error("corrupt {what} at block {block}: {detail}")]
    Corrupt {
        /// Which structure ("node", "superblock", "item").
        what: &'static str,
        /// Block number in the image.
        block: u64,
        /// What exactly is wrong: expected vs found.
        detail: String,
    },
    /// A data block's checksum did not match; the bytes are never returned.
    #[error("data checksum mismatch in inode {ino} at file offset {file_offset} (disk block {block}): expected {expected:#010x}, found {found:#010x}")]
    DataChecksum {
        /// Inode whose data is bad.
        ino: u64,
        /// Byte offset in the file of the bad 4 KiB block.
        file_offset: u64,
        /// Disk block number.
        block: u64,
        /// Checksum recorded in metadata.
        expected: u32,
        /// Checksum of what was read.
        found: u32,
    },
    /// The image is not a crest image or cannot be used at all.
    #[error("cannot open image: {0}")]
    BadImage(String),

    // ---- the caller asked for something POSIX refuses -----------------------------------
    /// No such file or directory.
    #[error("no such entry: {0}")]
    NotFound(String),
    /// The name already exists.
    #[error("already exists: {0}")]
    Exists(String),
    /// Directory not empty.
    #[error("directory inode {0} is not empty")]
    NotEmpty(u64),
    /// A path component is not a directory.
    #[error("inode {0} is not a directory")]
    NotDir(u64),
    /// The target is a directory where a non-directory was needed.
    #[error("inode {0} is a directory")]
    IsDir(u64),
    /// A name longer than the limit.
    #[error("name of {len} bytes is longer than {max}")]
    NameTooLong {
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Invalid argument (bad name, bad range, rename into own subtree…).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The image is full.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// No such extended attribute.
    #[error("no such xattr on inode {0}")]
    NoXattr(u64),
    /// Value too large (xattr, inline item).
    #[error("value too large: {0}")]
    TooBig(String),
    /// Result or argument out of range (an xattr name of 0 or more than 255 bytes).
    #[error("out of range: {0}")]
    Range(String),
    /// File too large.
    #[error("file too large: {0}")]
    FileTooBig(String),
    /// Too many links.
    #[error("too many links to inode {0}")]
    TooManyLinks(u64),
    /// Operation not supported on this object.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// A link or rename between datasets.
    #[error("cross-dataset link: {0}")]
    CrossDataset(String),
    /// A change to something read-only (a snapshot).
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// A dataset's quota is used up.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// In use (a dataset with open files).
    #[error("busy: {0}")]
    Busy(String),
    /// Operation not permitted (a hard link to a directory…).
    #[error("not permitted: {0}")]
    NotPermitted(String),
}

impl Error {
    /// The POSIX errno this error maps to at the system-call edge.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { .. } | Error::Poisoned(_) => 5,              // EIO
            Error::Corrupt { .. } | Error::DataChecksum { .. } => 5, // EIO (EUCLEAN would confuse tools)
            Error::BadImage(_) => 22,                                // EINVAL
            Error::NotFound(_) => 2,                                 // ENOENT
            Error::Exists(_) => 17,                                  // EEXIST
            Error::NotEmpty(_) => 39,                                // ENOTEMPTY
            Error::NotDir(_) => 20,                                  // ENOTDIR
            Error::IsDir(_) => 21,                                   // EISDIR
            Error::NameTooLong { .. } => 36,                         // ENAMETOOLONG
            Error::Invalid(_) => 22,                                 // EINVAL
            Error::NoSpace(_) => 28,                                 // ENOSPC
            Error::NoXattr(_) => 61,                                 // ENODATA
            Error::TooBig(_) => 7,                                   // E2BIG
            Error::Range(_) => 34,                                   // ERANGE
            Error::FileTooBig(_) => 27,                              // EFBIG
            Error::TooManyLinks(_) => 31,                            // EMLINK
            Error::NotSupported(_) => 95,                            // EOPNOTSUPP
            Error::NotPermitted(_) => 1,                             // EPERM
            Error::CrossDataset(_) => 18,                            // EXDEV
            Error::Busy(_) => 16,                                    // EBUSY
            Error::Quota(_) => 122,                                  // EDQUOT
            Error::ReadOnly(_) => 30,                                // EROFS
        }
    }

    /// True when the error means the bytes on disk are bad (as opposed to a caller error).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt { .. } | Error::DataChecksum { .. })
    }

    pub(crate) fn corrupt(what: &'static str, block: u64, detail: impl Into<String>) -> Error {
        Error::Corrupt { what, block, detail: detail.into() }
    }

    pub(crate) fn bad_item(key: Key, block: u64, detail: impl Into<String>) -> Error {
        Error::Corrupt { what: "item", block, detail: format!("{key:?}: {}", detail.into()) }
    }
}
