//! Makes a crest image holding many inodes, fast (through the store, no server): for
//! measuring what opening and checking a big image costs (`bench/fsck-scale.sh`).
//!
//!   cargo run --release -p crest-store --example fill-image -- IMAGE INODES [SIZE_GIB]
//!
//! Directories of 1,000 entries each; every tenth file carries 100 bytes (inline), every
//! hundredth 8 KiB (an extent), every fiftieth an xattr, every thousandth a second name.

use std::path::PathBuf;

use crest_store::{FileDisk, FileKind, MkfsOptions, Store, Timespec, ROOT_INO};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: fill-image IMAGE INODES [SIZE_GIB]";
    let path = PathBuf::from(args.get(1).ok_or(usage)?);
    let inodes: u64 = args.get(2).ok_or(usage)?.parse()?;
    let gib: u64 = args.get(3).map_or(Ok(8), |s| s.parse())?;
    let now = Timespec::new(1_700_000_000, 0);
    let disk = FileDisk::create(&path, gib << 30)?;
    let opts = MkfsOptions { now, fsid: None, seed: None, meta_copies: 2 };
    Store::mkfs(Box::new(disk), &opts)?;
    let mut store = Store::open(Box::new(FileDisk::open(&path)?))?;
    let started = std::time::Instant::now();
    let mut dir = ROOT_INO;
    let small = vec![7u8; 100];
    let big = vec![9u8; 8192];
    for i in 0..inodes {
        if i % 1000 == 0 {
            dir = store.create(ROOT_INO, format!("d{i}").as_bytes(), FileKind::Directory, 0o755, 0, 0, 0, now)?.ino;
            continue;
        }
        let f = store.create(dir, format!("f{i}").as_bytes(), FileKind::Regular, 0o644, 1000, 1000, 0, now)?;
        if i % 100 == 0 {
            store.write(f.ino, 0, &big, now)?;
        } else if i % 10 == 0 {
            store.write(f.ino, 0, &small, now)?;
        }
        if i % 50 == 0 {
            store.setxattr(f.ino, b"user.tag", b"value", now)?;
        }
        if i % 1000 == 1 {
            store.link(f.ino, ROOT_INO, format!("l{i}").as_bytes(), now)?;
        }
        if i % 100_000 == 0 {
            store.commit()?;
            eprintln!("fill-image: {i} inodes, {:.1} s", started.elapsed().as_secs_f64());
        }
    }
    store.commit()?;
    eprintln!("fill-image: {inodes} inodes in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
