//! The namespace: how inodes, directory entries, file data and xattrs are laid out as
//! items in a dataset's fs tree, and the POSIX operations on them.

pub mod dirent;
pub mod extent;
pub mod inode;
pub mod ops;
pub(crate) mod space;
pub mod xattr;
