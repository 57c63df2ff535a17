//! Every size and limit of the store in one place.

/// Bytes per block: the unit of allocation, of data checksums and of tree nodes.
pub const BLOCK_SIZE: usize = 4096;
/// `BLOCK_SIZE` as u64.
pub const BLOCK_SIZE_U64: u64 = BLOCK_SIZE as u64;
/// Byte offsets of the two superblock copies (block 16 and block 256).
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [64 * 1024, 1024 * 1024];
/// Byte offsets of their mirrors (blocks 128 and 192), written when metadata has two copies.
pub const SUPERBLOCK_MIRROR_OFFSETS: [u64; 2] = [512 * 1024, 768 * 1024];
/// Blocks reserved at the start of the image (superblocks live inside this area).
pub const RESERVED_BLOCKS: u64 = 257;
/// Smallest image `mkfs` accepts.
pub const MIN_IMAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Blocks per allocation group (a 128 MiB group: its bitmap is 4 KiB).
pub const BLOCKS_PER_GROUP: u64 = 32 * 1024;
/// Longest file name, as on Linux.
pub const NAME_MAX: usize = 255;
/// Largest value of one leaf item: two must fit in one leaf so that a split always works.
pub const MAX_ITEM_BYTES: usize = 1800;
/// Files of up to this many bytes are stored inline in their leaf.
pub const MAX_INLINE_BYTES: usize = 1024;
/// Longest xattr name.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value (Linux's XATTR_SIZE_MAX: the kernel refuses larger with E2BIG).
pub const XATTR_SIZE_MAX: usize = 65_536;
/// Largest `listxattr` answer: the inode's names with a NUL each (Linux's XATTR_LIST_MAX).
/// A setxattr of a new name that would pass it fails with ENOSPC, as on ext4.
pub const XATTR_LIST_MAX: usize = 65_536;
/// Xattrs whose name + value take at most this are stored inline in their XATTR item
/// (the version-1 limit of any xattr); larger values go to XATTR_CHUNK items.
pub const XATTR_INLINE_MAX: usize = MAX_ITEM_BYTES - 16;
/// Value bytes per XATTR_CHUNK item: three chunk items (21-byte item header, 12-byte chunk
/// header) fill a 4016-byte leaf, so a 64 KiB value takes 51 chunks in 17 leaves.
pub const XATTR_CHUNK_BYTES: usize = 1305;
/// Longest run of blocks one extent item maps (1 MiB): bounds the item's checksum array.
pub const MAX_EXTENT_BLOCKS: u64 = 256;
/// Largest file size (2^60 bytes, leaves room below u64::MAX for offsets + lengths).
pub const MAX_FILE_BYTES: u64 = 1 << 60;
/// Highest link count.
pub const LINK_MAX: u32 = 65_000;
/// Decoded clean nodes kept in memory.
pub const NODE_CACHE_ENTRIES: usize = 65_536;
/// Deepest tree accepted when reading (guards against pointer loops in corrupt images).
pub const MAX_TREE_LEVEL: u8 = 8;
/// Longest symlink target (PATH_MAX - 1).
pub const SYMLINK_MAX: usize = 4095;
/// Most bytes one read returns (a longer request gets a short read): bounds the buffer a
/// caller's length can make the store allocate.
pub const MAX_READ_BYTES: u64 = 64 << 20;
