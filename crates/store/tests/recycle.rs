//! Where a commit's nodes go: once a workload of small commits has run a while, its
//! commits write only blocks the image file has held before. A block written for the first
//! time makes the host file system allocate it (or convert an unwritten extent), and its
//! journal commit then doubles what the image's fdatasync costs (measured on ext4: 8 blocks
//! rewritten and flushed ~150 µs, 8 fresh ~295 µs).

mod common;

use common::{fresh_with_copies, open, t};
use crest_store::{SetAttr, ROOT_INO};

const BLOCK: usize = 4096;

fn written(img: &[u8]) -> Vec<bool> {
    img.chunks(BLOCK).map(|b| b.iter().any(|&x| x != 0)).collect()
}

fn steady_small_commits_write_no_fresh_blocks(copies: u8) {
    let disk = fresh_with_copies(64, copies);
    let mut s = open(&disk);
    // A tree of a few levels: small commits then copy a path of several nodes each.
    for i in 0..2_000u32 {
        s.setxattr(ROOT_INO, format!("user.k{i:05}").as_bytes(), &[7u8; 40], t(2)).expect("xattr");
    }
    s.commit().expect("commit");
    let mut step = 0u32;
    let mut small_commit = |s: &mut crest_store::Store| {
        step += 1;
        let mode = 0o700 | (step % 64);
        s.setattr(ROOT_INO, &SetAttr { mode: Some(mode), ..Default::default() }, t(10 + i64::from(step)))
            .expect("chmod");
        let key = format!("user.k{:05}", (step * 7919) % 2_000);
        s.setxattr(ROOT_INO, key.as_bytes(), &step.to_le_bytes(), t(10 + i64::from(step))).expect("xattr");
        s.commit().expect("commit");
    };
    for _ in 0..50 {
        small_commit(&mut s);
    }
    let before = disk.with_bytes(|b| written(b));
    for _ in 0..500 {
        small_commit(&mut s);
    }
    let after = disk.with_bytes(|b| written(b));
    let fresh: Vec<usize> = (0..after.len()).filter(|&i| after[i] && !before[i]).collect();
    assert!(
        fresh.is_empty(),
        "copies {copies}: 500 small commits wrote {} blocks never written before: {:?}",
        fresh.len(),
        &fresh[..fresh.len().min(20)]
    );
    drop(s);
    common::assert_clean(&disk);
}

#[test]
fn small_commits_rewrite_blocks_already_written_one_copy() {
    steady_small_commits_write_no_fresh_blocks(1);
}

#[test]
fn small_commits_rewrite_blocks_already_written_two_copies() {
    steady_small_commits_write_no_fresh_blocks(2);
}
