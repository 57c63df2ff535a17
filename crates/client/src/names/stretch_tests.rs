//! Many narrow stretches of one directory (look-ups answered with their name's own hash).

use super::tests::item;
use super::*;

fn one_name(name: &str, ino: u64) -> DirLeaf {
    let h = name_hash(name.as_bytes());
    DirLeaf { hash_lo: h, hash_hi: h, items: vec![item(name, ino)] }
}

#[test]
fn narrow_stretches_of_one_directory_stay_bounded_and_answer_right() {
    let mut c = NameCache::new(Duration::from_secs(60));
    let now = Instant::now();
    for i in 0..5_000u64 {
        c.absorb_leaf(1, &one_name(&format!("f{i}"), 100 + i), c.epoch(), now);
        let held = c.dirs.get(&1).map_or(0, Vec::len);
        assert!(held <= MAX_STRETCHES_PER_DIR, "{held} stretches after {i} look-ups");
    }
    // The newest are still answered here; nothing answers for a name never looked up.
    assert!(matches!(c.lookup(1, b"f4999", now), Some(Cached::Found(a)) if a.ino == 5_099));
    assert!(c.lookup(1, b"never", now).is_none());
    assert_eq!(c.len(), c.dirs.values().flatten().map(|r| r.names.len()).sum::<usize>(), "entries counted right");
}

#[test]
fn lapsed_stretches_go_when_the_next_is_taken_in() {
    let mut c = NameCache::new(Duration::from_secs(1));
    let now = Instant::now();
    c.absorb_leaf(1, &one_name("a", 10), c.epoch(), now);
    c.absorb_leaf(1, &one_name("b", 11), c.epoch(), now + Duration::from_secs(2));
    assert_eq!(c.dirs.get(&1).map(Vec::len), Some(1), "a's lapsed stretch went");
    assert_eq!(c.len(), 1);
}
