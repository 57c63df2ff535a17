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
/// Quota exceeded.
pub const EDQUOT: i32 = 122;

/// The symbolic name of a Linux errno (for counters and logs), or None for one this table
/// does not know.
pub fn name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        1 => "EPERM",
        2 => "ENOENT",
        4 => "EINTR",
        5 => "EIO",
        6 => "ENXIO",
        7 => "E2BIG",
        9 => "EBADF",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        16 => "EBUSY",
        17 => "EEXIST",
        18 => "EXDEV",
        19 => "ENODEV",
        20 => "ENOTDIR",
        21 => "EISDIR",
        22 => "EINVAL",
        26 => "ETXTBSY",
        27 => "EFBIG",
        28 => "ENOSPC",
        29 => "ESPIPE",
        30 => "EROFS",
        31 => "EMLINK",
        34 => "ERANGE",
        35 => "EDEADLK",
        36 => "ENAMETOOLONG",
        37 => "ENOLCK",
        38 => "ENOSYS",
        39 => "ENOTEMPTY",
        40 => "ELOOP",
        61 => "ENODATA",
        75 => "EOVERFLOW",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        116 => "ESTALE",
        122 => "EDQUOT",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_named_constants_name_themselves() {
        for (n, s) in [(super::ENOENT, "ENOENT"), (super::ENOSPC, "ENOSPC"), (super::ETIMEDOUT, "ETIMEDOUT")] {
            assert_eq!(super::name(n), Some(s));
        }
        assert_eq!(super::name(4242), None);
    }
}
