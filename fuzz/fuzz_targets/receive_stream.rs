//! A send stream from a hostile or broken sender, received into a fresh image with one
//! file system on it. The input is either raw stream bytes or (first byte odd) records of
//! arbitrary types and payloads that the target frames with valid checksums after a valid
//! BEGIN, so the fuzzer reaches the code that applies records, not only the checksums.
//!
//! The store must never panic. A receive that fails is undone: the image is then clean
//! under fsck and the target dataset does not exist.

#![no_main]

use std::sync::OnceLock;

use crest_store::send::fuzzing;
use crest_store::{check, FileKind, MemDisk, MkfsOptions, Store, Timespec, ROOT_INO};
use libfuzzer_sys::fuzz_target;

fn base_image() -> &'static Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let disk = MemDisk::new(16 << 20);
        let opts = MkfsOptions { now: Timespec::new(1, 0), fsid: Some([3; 16]), seed: Some(1), meta_copies: 1 };
        Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
        let mut s = Store::open(Box::new(disk.clone())).expect("open");
        let f = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, Timespec::new(2, 0)).expect("create");
        s.write(f.ino, 0, &[7; 5000], Timespec::new(2, 0)).expect("write");
        s.commit().expect("commit");
        drop(s.close().expect("close"));
        disk.snapshot()
    })
}

fn stream_of(data: &[u8]) -> Vec<u8> {
    if data.first().is_none_or(|b| b & 1 == 0) {
        return data.get(1..).unwrap_or_default().to_vec();
    }
    let next_ino = u64::from(data.get(1).copied().unwrap_or(0)) + 2;
    let mut parts = vec![(1u8, fuzzing::begin("s", next_ino))];
    let mut rest = &data[2.min(data.len())..];
    while rest.len() >= 2 {
        let (t, n) = (rest[0] % 11, usize::from(rest[1]));
        let n = n.min(rest.len() - 2);
        parts.push((t, rest[2..2 + n].to_vec()));
        rest = &rest[2 + n..];
    }
    fuzzing::frame(&parts)
}

fuzz_target!(|data: &[u8]| {
    let disk = MemDisk::from_bytes(base_image().clone());
    let mut s = Store::open(Box::new(disk.clone())).expect("open");
    let stream = stream_of(data);
    let mut r = s.receive_start("t", false, Timespec::new(3, 0)).expect("start");
    let fed = s.receive_feed(&mut r, &stream);
    match fed.and_then(|()| s.receive_finish(&mut r)) {
        Ok(_) => {
            let _ = s.commit();
        }
        Err(_) => {
            if s.receive_abort(r).and_then(|()| s.commit()).is_ok() {
                assert!(s.dataset("t").is_err(), "an undone receive left its dataset");
                drop(s.close().expect("close"));
                let report = check::fsck(Box::new(MemDisk::from_bytes(disk.snapshot()))).expect("fsck");
                assert!(report.is_clean(), "an undone receive left problems: {:?}", report.problems);
            }
        }
    }
});
