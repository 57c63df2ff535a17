//! What an image file or device already holds, so that `crest mkfs` does not destroy
//! another file system or data by accident (as mkfs(8) users expect), and the signatures
//! it wipes when told to with `--force` (so blkid and mount no longer take the device for
//! what it was).

use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Bytes examined at the start: every signature below lies within them, and so do both
/// crest superblock copies (the second at 1 MiB).
pub const HEAD_BYTES: u64 = 2 << 20;
/// Bytes wiped at the end of a device: backup GPTs, md 1.0 and other trailing labels.
pub const TAIL_BYTES: u64 = 1 << 20;

/// Known signatures: (what, byte offset, magic bytes).
fn known() -> Vec<(String, u64, Vec<u8>)> {
    let mut v = vec![
        ("an ext2/ext3/ext4 file system".to_string(), 1080, 0xEF53u16.to_le_bytes().to_vec()),
        ("an XFS file system".to_string(), 0, b"XFSB".to_vec()),
        ("a btrfs file system".to_string(), 65536 + 64, b"_BHRfS_M".to_vec()),
        ("a GPT partition table".to_string(), 512, b"EFI PART".to_vec()),
    ];
    for off in crest_store::limits::SUPERBLOCK_OFFSETS {
        v.push(("a crest file system".to_string(), off + 32, crest_store::superblock::MAGIC.to_vec()));
    }
    // mkswap puts its magic at the end of the first page, whatever the page size was.
    for page in [4096u64, 8192, 16384, 65536] {
        for magic in [&b"SWAPSPACE2"[..], b"SWAP-SPACE"] {
            v.push(("swap space".to_string(), page - 10, magic.to_vec()));
        }
    }
    v
}

/// What `head` (the first bytes of an image) holds, one description per finding, empty
/// when it is all zeros. A signature found is named with its offset; otherwise any
/// non-zero byte counts as data.
pub fn detect(head: &[u8]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for (what, off, magic) in known() {
        let (s, e) = (off as usize, off as usize + magic.len());
        if head.get(s..e) == Some(&magic[..]) {
            let f = format!("{what} (signature at byte {off})");
            if !found.iter().any(|x| x.starts_with(&what)) {
                found.push(f);
            }
        }
    }
    // An MBR boot signature alone is weak (it is two bytes), so only when nothing else matched.
    if found.is_empty() && head.get(510..512) == Some(&[0x55, 0xAA][..]) {
        found.push("a DOS/MBR partition table (signature 55 aa at byte 510)".into());
    }
    if found.is_empty() {
        if let Some(pos) = head.iter().position(|&b| b != 0) {
            found.push(format!("data (a non-zero byte at offset {pos})"));
        }
    }
    found
}

/// Reads the head of `path` (shorter if the file is).
pub fn read_head(path: &Path) -> Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; HEAD_BYTES as usize];
    let mut got = 0;
    while got < buf.len() {
        let n = f.read_at(&mut buf[got..], got as u64).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

/// Zeroes the head of `path` and, on something larger, its last `TAIL_BYTES`: every
/// signature `detect` knows, and the trailing ones blkid also probes.
pub fn wipe(path: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {} to wipe it", path.display()))?;
    // A block device's length is where seeking to its end lands.
    let size = f.seek(SeekFrom::End(0)).with_context(|| format!("sizing {}", path.display()))?;
    let zeros = vec![0u8; HEAD_BYTES as usize];
    let head = size.min(HEAD_BYTES);
    f.write_all_at(&zeros[..head as usize], 0).with_context(|| format!("wiping {}", path.display()))?;
    if size > HEAD_BYTES + TAIL_BYTES {
        f.write_all_at(&zeros[..TAIL_BYTES as usize], size - TAIL_BYTES)
            .with_context(|| format!("wiping the end of {}", path.display()))?;
    }
    f.sync_all().with_context(|| format!("syncing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(off: usize, magic: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; HEAD_BYTES as usize];
        v[off..off + magic.len()].copy_from_slice(magic);
        v
    }

    #[test]
    fn zeros_and_empty_hold_nothing() {
        assert!(detect(&[]).is_empty());
        assert!(detect(&vec![0u8; HEAD_BYTES as usize]).is_empty());
    }

    #[test]
    fn finds_each_signature() {
        let cases: [(usize, &[u8], &str); 7] = [
            (1080, &[0x53, 0xEF], "ext2/ext3/ext4"),
            (0, b"XFSB", "XFS"),
            (65536 + 64, b"_BHRfS_M", "btrfs"),
            (4096 - 10, b"SWAPSPACE2", "swap"),
            (65536 - 10, b"SWAP-SPACE", "swap"),
            (64 * 1024 + 32, b"CRESTFS1", "crest"),
            ((1 << 20) + 32, b"CRESTFS1", "crest"),
        ];
        for (off, magic, name) in cases {
            let found = detect(&with(off, magic));
            assert_eq!(found.len(), 1, "{name}: {found:?}");
            assert!(found[0].contains(name) && found[0].contains(&format!("byte {off}")), "{found:?}");
        }
    }

    #[test]
    fn other_bytes_are_data() {
        let found = detect(&with(123_456, &[7]));
        assert_eq!(found, vec!["data (a non-zero byte at offset 123456)".to_string()]);
        // A truncated head cannot hold a signature past its end, but is still data.
        assert_eq!(detect(&[0, 0, 1]), vec!["data (a non-zero byte at offset 2)".to_string()]);
    }

    #[test]
    fn wipe_clears_what_detect_finds() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("img");
        let mut img = with(1080, &[0x53, 0xEF]);
        img.resize(8 << 20, 0xAB);
        std::fs::write(&p, &img)?;
        assert!(!detect(&read_head(&p)?).is_empty());
        wipe(&p)?;
        assert!(detect(&read_head(&p)?).is_empty());
        let after = std::fs::read(&p)?;
        assert_eq!(after.len(), 8 << 20, "wiping keeps the size");
        assert!(after[(8 << 20) - TAIL_BYTES as usize..].iter().all(|&b| b == 0), "the tail is wiped");
        Ok(())
    }
}
