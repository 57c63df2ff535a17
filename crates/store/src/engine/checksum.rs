//! Checksums of nodes, superblocks and data blocks. CRC-32C (Castagnoli) through
//! `crc-fast`, which uses the CPU's carry-less multiply; tests cross-check it against
//! the `crc32c` crate. The format records the algorithm so others can be added.

/// Checksum algorithm identifiers stored in the superblock.
pub const CSUM_CRC32C: u8 = 1;

/// CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The CRC-32C of each 4 KiB block of `data` (the last one short if `data` is): what an
/// extent records for blocks written from it. A server may compute them off the store's
/// thread and hand them to `Store::write_summed`.
pub fn block_sums(data: &[u8]) -> Vec<u32> {
    data.chunks(crate::limits::BLOCK_SIZE).map(crc32c).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_reference_crc32c() {
        let mut buf = vec![0u8; 9000];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        for len in [0, 1, 3, 63, 64, 4095, 4096, 9000] {
            assert_eq!(super::crc32c(&buf[..len]), crc32c::crc32c(&buf[..len]), "len {len}");
        }
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(super::crc32c(&[0u8; 32]), 0x8A91_36AA);
    }
}
