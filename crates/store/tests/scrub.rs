//! Scrub: every data block of every dataset and snapshot read back and checked, a step at
//! a time and resumable across a reopen; a damaged block reported by dataset and path,
//! and reads of it fail (EIO), never bad data.

mod common;
use common::*;
use crest_nvlist::NvList;
use crest_store::datasets::root_of;
use crest_store::{Disk, FileKind, MemDisk, Store, ROOT_INO};

fn full_scrub(s: &mut Store, step: u64) -> crest_store::scrub::Scrub {
    s.scrub_restart().expect("restart");
    loop {
        let st = s.scrub_step(step).expect("step");
        if st.done {
            return st;
        }
    }
}

#[test]
fn scrub_finds_a_damaged_block_by_path_and_resumes_after_a_reopen() {
    let disk = fresh(64);
    let mut s = open(&disk);
    let a = s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("dataset");
    for (root, tag) in [(ROOT_INO, 1u8), (root_of(a), 2)] {
        let dir = s.create(root, b"dir", FileKind::Directory, 0o755, 0, 0, 0, t(3)).expect("mkdir");
        for i in 0..20u8 {
            let f =
                s.create(dir.ino, format!("f{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
            // Inline (small) files too: nothing to report about them.
            let len = if i % 4 == 0 { 300 } else { 12_000 + 900 * i as usize };
            s.write(f.ino, 0, &vec![tag ^ i; len], t(3)).expect("write");
        }
    }
    // The victim: a block of its own pattern, easy to find in the image.
    let victim_dir = s.lookup(root_of(a), b"dir").expect("dir").ino;
    let victim = s.create(victim_dir, b"victim", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    s.write(victim, 0, &pattern, t(3)).expect("write");
    s.create_snapshots(&["a@s".to_string()]).expect("snapshot");
    s.commit().expect("commit");
    let clean = full_scrub(&mut s, 7);
    assert!(clean.bad.is_empty(), "a clean image: {:?}", clean.bad);
    assert!(clean.blocks > 100);
    // Resumable: a few steps, a reopen, the rest.
    s.scrub_restart().expect("restart");
    s.scrub_step(10).expect("step");
    s.scrub_step(10).expect("step");
    drop(s.close().expect("close"));
    let mut s = open(&disk);
    let mut st = s.scrub_state().expect("state");
    assert!(st.blocks >= 20 && !st.done, "the position survives a reopen: {st:?}");
    while !st.done {
        st = s.scrub_step(10).expect("step");
    }
    assert_eq!(st.blocks, clean.blocks, "every block once, across the reopen");
    drop(s.close().expect("close"));
    // Flip a byte of the victim's first block on disk.
    let image = disk.snapshot();
    let at = image.windows(64).position(|w| w == &pattern[..64]).expect("the victim's block in the image");
    let mut byte = [0u8; 1];
    disk.read_at(at as u64 + 100, &mut byte).expect("read");
    disk.clone().write_at(at as u64 + 100, &[byte[0] ^ 0x40]).expect("damage");
    let mut s = open(&disk);
    assert!(s.read(victim, 0, 8192).is_err(), "a read of the damaged block fails, never returns bad data");
    let st = full_scrub(&mut s, 5);
    let names: Vec<&str> = st.bad.iter().map(|(d, _, _)| d.as_str()).collect();
    assert_eq!(names, ["a", "a@s"], "found in the dataset and in its snapshot, nowhere else: {:?}", st.bad);
    assert!(st.bad.iter().all(|(_, ino, what)| *ino == victim && what.contains("checksum")), "{:?}", st.bad);
    let d = s.dataset_id("a").expect("id");
    assert_eq!(s.path_of(d, victim).expect("path").as_deref(), Some("/dir/victim"));
    let snap = s.dataset_id("a@s").expect("id");
    assert_eq!(s.path_of(snap, victim).expect("path").as_deref(), Some("/dir/victim"));
    let _: &MemDisk = &disk;
}
