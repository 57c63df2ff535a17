//! The errnos on the wire (`OpError::errno`): Linux's numbers, whatever the host, so a
//! client and a server agree without a libc. The client and the server name them here;
//! the store, which never sees the protocol, maps its errors to the same numbers
//! (`crest_store::Error::errno`, checked against these in crest-sim's tests).

/// Operation not permitted.
pub const EPERM: i32 = 1;
/// No such file or directory.
pub const ENOENT: i32 = 2;
/// I/O error.
pub const EIO: i32 = 5;
/// Argument list too long.
pub const E2BIG: i32 = 7;
/// File exists.
pub const EEXIST: i32 = 17;
/// Not a directory.
pub const ENOTDIR: i32 = 20;
/// Is a directory.
pub const EISDIR: i32 = 21;
/// Invalid argument.
pub const EINVAL: i32 = 22;
/// File too large.
pub const EFBIG: i32 = 27;
/// No space left on device.
pub const ENOSPC: i32 = 28;
/// Too many links.
pub const EMLINK: i32 = 31;
/// Result out of range.
pub const ERANGE: i32 = 34;
/// File name too long.
pub const ENAMETOOLONG: i32 = 36;
/// Directory not empty.
pub const ENOTEMPTY: i32 = 39;
/// No such extended attribute.
pub const ENODATA: i32 = 61;
/// Operation not supported.
pub const EOPNOTSUPP: i32 = 95;
/// Timed out.
pub const ETIMEDOUT: i32 = 110;
