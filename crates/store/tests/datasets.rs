//! Datasets: separate trees in one image, each with its own root, inode range and
//! properties; created, changed and destroyed while the others are in use.

mod common;
use common::*;
use crest_nvlist::{NvList, Value};
use crest_store::datasets::{check_prop, dataset_of, root_of, DEFAULT_DATASET};
use crest_store::{Error, FileKind, RenameFlags, Store, ROOT_INO};

fn props(kv: &[(&str, &str)]) -> NvList {
    let mut l = NvList::new();
    for (k, v) in kv {
        l.add(*k, check_prop(k, v).expect("valid property")).expect("add");
    }
    l
}

fn fill(s: &mut Store, root: u64, tag: u8, files: usize) {
    let dir = s.create(root, b"sub", FileKind::Directory, 0o755, 0, 0, 0, t(3)).expect("mkdir");
    for i in 0..files {
        let f = s.create(dir.ino, format!("f{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
        // Inline, one block, several blocks: every kind of extent.
        let len = [100, 4096, 70_000][i % 3];
        s.write(f.ino, 0, &vec![tag ^ i as u8; len], t(3)).expect("write");
    }
}

#[test]
fn datasets_have_their_own_roots_inode_ranges_and_names_across_a_reopen() {
    let disk = fresh(32);
    let mut s = open(&disk);
    let a = s.create_dataset("alpha", props(&[("quota", "10M"), ("user:owner", "ops")]), (1000, 1000, 0o750), t(2));
    let a = a.expect("create alpha");
    let b = s.create_dataset("beta", NvList::new(), (0, 0, 0o755), t(2)).expect("create beta");
    assert!(a != b && a != DEFAULT_DATASET && b != DEFAULT_DATASET);
    assert!(matches!(s.create_dataset("alpha", NvList::new(), (0, 0, 0o755), t(2)), Err(Error::Exists(_))));
    for bad in ["", "a/b", "a@b", "-x", ".x", "x y", &"n".repeat(201)] {
        assert!(s.create_dataset(bad, NvList::new(), (0, 0, 0o755), t(2)).is_err(), "name {bad:?} accepted");
    }
    let root_a = s.getattr(root_of(a)).expect("alpha's root");
    assert_eq!((root_a.uid, root_a.gid, root_a.mode, root_a.kind), (1000, 1000, 0o750, FileKind::Directory));
    fill(&mut s, ROOT_INO, 1, 5);
    fill(&mut s, root_of(a), 2, 7);
    fill(&mut s, root_of(b), 3, 4);
    let in_a = s.lookup(root_of(a), b"sub").expect("sub in alpha");
    assert_eq!(dataset_of(in_a.ino), a, "alpha's inodes are in alpha's range");
    assert!(s.lookup(ROOT_INO, b"sub").is_ok_and(|i| dataset_of(i.ino) == DEFAULT_DATASET));
    s.commit().expect("commit");
    let before: Vec<_> = [ROOT_INO, root_of(a), root_of(b)].iter().map(|&r| dump_from(&mut s, r)).collect();
    drop(s);
    assert_eq!(assert_clean(&disk).datasets, 3);

    let mut s = open(&disk);
    let after: Vec<_> = [ROOT_INO, root_of(a), root_of(b)].iter().map(|&r| dump_from(&mut s, r)).collect();
    for (i, (x, y)) in before.iter().zip(&after).enumerate() {
        assert_same(y, x, &format!("dataset {i} after reopen"));
    }
    assert_ne!(before[0], before[1], "datasets hold different trees");
    let list: Vec<String> = s.datasets().into_iter().map(|d| d.name).collect();
    assert_eq!(list, ["default", "alpha", "beta"]);
    let info = s.dataset("alpha").expect("alpha");
    assert_eq!(info.props.get_u64("quota"), Some(10 << 20));
    assert_eq!(info.props.get_str("user:owner"), Some("ops"));
    assert_eq!(info.inodes, 1 + 1 + 7);
}

#[test]
fn links_and_renames_stay_inside_a_dataset() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let a = s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("create");
    let f = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
    let g = s.create(root_of(a), b"g", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
    let exdev = |r: Result<(), Error>| matches!(r, Err(ref e) if e.errno() == 18);
    assert!(exdev(s.link(f.ino, root_of(a), b"l", t(4)).map(drop)), "link into another dataset");
    assert!(exdev(s.link(g.ino, ROOT_INO, b"l", t(4)).map(drop)));
    assert!(exdev(s.rename(ROOT_INO, b"f", root_of(a), b"f", RenameFlags::default(), t(4))));
    assert!(exdev(s.rename(root_of(a), b"g", ROOT_INO, b"g", RenameFlags::default(), t(4))));
    s.rename(root_of(a), b"g", root_of(a), b"h", RenameFlags::default(), t(4)).expect("rename inside a dataset");
    // A dataset's inode numbers come from its own range, reserved or not.
    let first = s.reserve_inode_numbers(root_of(a), 4).expect("reserve");
    assert_eq!(dataset_of(first), a);
    let at = crest_store::NewInode { ino: first, generation: 9 };
    assert!(
        s.create_at(Some(at), ROOT_INO, b"x", FileKind::Regular, 0o644, 0, 0, 0, t(4)).is_err(),
        "a number of another dataset"
    );
    s.create_at(Some(at), root_of(a), b"x", FileKind::Regular, 0o644, 0, 0, 0, t(4)).expect("create_at in its dataset");
    // The root of one dataset never resolves ".." into another.
    assert!(s.rename(root_of(a), b"h", root_of(a), b"h2", RenameFlags::default(), t(5)).is_ok());
    assert!(s.getattr(root_of(a + 1)).is_err(), "no such dataset");
    drop(s);
    assert_clean(&disk);
}

#[test]
fn destroying_a_dataset_frees_every_block_and_leaves_the_others_alone() {
    let disk = fresh(64);
    let mut s = open(&disk);
    fill(&mut s, ROOT_INO, 1, 6);
    s.commit().expect("commit");
    let keep = dump_from(&mut s, ROOT_INO);
    let used_before = s.statfs().free_blocks;
    let a = s.create_dataset("doomed", NvList::new(), (0, 0, 0o755), t(2)).expect("create");
    fill(&mut s, root_of(a), 2, 60);
    let f = s.lookup(root_of(a), b"sub").expect("sub");
    s.commit().expect("commit");
    assert!(s.statfs().free_blocks < used_before);
    let open_file = s.lookup(f.ino, b"f2").expect("f2").ino;
    s.open_handle(open_file).expect("open");
    assert!(matches!(s.destroy_dataset("doomed"), Err(Error::Busy(_))), "a dataset with open files stays");
    s.release_handle(open_file).expect("release");
    assert!(matches!(s.destroy_dataset("default"), Err(Error::NotPermitted(_))));
    assert!(matches!(s.destroy_dataset("nope"), Err(Error::NotFound(_))));
    s.destroy_dataset("doomed").expect("destroy");
    assert!(s.getattr(root_of(a)).is_err() && s.getattr(f.ino).is_err(), "its inodes are gone");
    // Freed blocks come back after two commits (docs/format.md §7.5).
    s.commit().expect("commit");
    s.commit().expect("commit");
    assert_eq!(s.statfs().free_blocks, used_before, "every block it used is free again");
    assert_same(&dump_from(&mut s, ROOT_INO), &keep, "the default dataset");
    // The name is free again; the id is not reused.
    let again = s.create_dataset("doomed", NvList::new(), (0, 0, 0o755), t(2)).expect("create again");
    assert!(again > a, "ids are never reused");
    drop(s.close().expect("close"));
    assert_eq!(assert_clean(&disk).datasets, 2);
    let s = open(&disk);
    assert_eq!(s.datasets().len(), 2);
}

#[test]
fn properties_are_checked_and_kept() {
    let disk = fresh(16);
    let mut s = open(&disk);
    s.create_dataset("p", NvList::new(), (0, 0, 0o755), t(2)).expect("create");
    for (k, v) in [("quota", "12x"), ("readonly", "maybe"), ("copies", "3"), ("bogus", "1"), ("user:", "x")] {
        assert!(check_prop(k, v).is_err(), "{k}={v} accepted");
    }
    assert!(check_prop("user:note", &"x".repeat(1025)).is_err());
    let set = |k: &str, v: &str| (k.to_string(), Some(check_prop(k, v).expect("valid")));
    s.set_dataset_props("p", &[set("readonly", "on"), set("quota", "1G"), set("atime", "off"), set("user:a", "b")])
        .expect("set");
    s.set_dataset_props("p", &[("user:a".to_string(), None)]).expect("clear");
    s.set_dataset_props("default", &[set("user:note", "the first")]).expect("the default dataset has properties too");
    let big = (0..40).map(|i| (format!("user:k{i}"), Some(Value::Str("v".repeat(60))))).collect::<Vec<_>>();
    assert!(matches!(s.set_dataset_props("p", &big), Err(Error::TooBig(_))), "properties fit in one item");
    drop(s.close().expect("close"));
    let s = open(&disk);
    let p = s.dataset("p").expect("p").props;
    assert_eq!(p.get_bool("readonly"), Some(true));
    assert_eq!(p.get_u64("quota"), Some(1 << 30));
    assert_eq!(p.get_bool("atime"), Some(false));
    assert_eq!(p.get("user:a"), None);
    assert_eq!(s.dataset("default").expect("default").props.get_str("user:note"), Some("the first"));
    drop(s);
    assert_clean(&disk);
}

#[test]
fn the_older_superblock_keeps_every_datasets_tree_as_a_fallback_after_reopen() {
    use crest_store::crash::{image_at, CrashPoint, Event, RecordingDisk};
    use crest_store::limits::{SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
    use crest_store::MemDisk;
    // Generation 2 holds dataset "a" with files; generation 3 removes them. Reopened, the
    // first transaction writes much new data: if a crash then loses its superblock and the
    // generation-3 copy is damaged, generation 2 must still be whole, "a" included — so
    // `open` must keep every block of every dataset of the older copy allocated.
    let disk = fresh(16);
    let mut s = open(&disk);
    let a = s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("create");
    fill(&mut s, root_of(a), 5, 12);
    s.commit().expect("gen 2");
    let gen2 = dump(&mut s);
    let sub = s.lookup(root_of(a), b"sub").expect("sub").ino;
    for i in 0..12 {
        s.unlink(sub, format!("f{i}").as_bytes(), t(4)).expect("unlink");
    }
    s.commit().expect("gen 3");
    drop(s);
    let rec = RecordingDisk::new(disk.snapshot());
    let mut s = Store::open(Box::new(rec.clone())).expect("open");
    assert_eq!(s.generation(), 3);
    for i in 0..60u8 {
        let dir = if i % 2 == 0 { ROOT_INO } else { sub };
        let ino =
            s.create(dir, format!("g{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(5)).expect("create").ino;
        s.write(ino, 0, &vec![i; 90_000], t(5)).expect("write");
    }
    s.commit().expect("gen 4");
    let events = rec.events();
    let sb = events
        .iter()
        .position(|e| {
            matches!(e, Event::Write { offset, .. }
                if SUPERBLOCK_OFFSETS.contains(offset) || SUPERBLOCK_MIRROR_OFFSETS.contains(offset))
        })
        .expect("superblock write");
    let mut img = image_at(rec.base(), &events, &CrashPoint { durable: sb, survivors: vec![] });
    // (Generation 3's copy is damaged in its slot and in the slot's mirror.)
    img[SUPERBLOCK_OFFSETS[3 % 2] as usize + 100] ^= 0xff;
    img[SUPERBLOCK_MIRROR_OFFSETS[3 % 2] as usize + 100] ^= 0xff;
    let mut s = Store::open(Box::new(MemDisk::from_bytes(img))).expect("falls back to generation 2");
    assert_eq!(s.generation(), 2);
    assert_same(&dump(&mut s), &gen2, "generation 2 after the fallback");
}

#[test]
fn a_quota_refuses_data_beyond_it_and_counts_again_after_a_reopen() {
    let disk = fresh(32);
    let mut s = open(&disk);
    let q = s.create_dataset("q", props(&[("quota", "100K")]), (0, 0, 0o755), t(2)).expect("create");
    let root = root_of(q);
    let f = s.create(root, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    s.write(f, 0, &[1; 80 * 1024], t(3)).expect("within the quota");
    assert_eq!(s.dataset_used_blocks(q), 20);
    let g = s.create(root, b"g", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    let over = s.write(g, 0, &[2; 40 * 1024], t(3));
    assert!(matches!(over, Err(ref e) if e.errno() == 122), "EDQUOT beyond the quota: {over:?}");
    assert_eq!(s.getattr(g).expect("g").size, 0, "a refused write changes nothing");
    // The default dataset has no quota and is not charged for q's files.
    let big = s.create(ROOT_INO, b"big", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    s.write(big, 0, &[3; 400 * 1024], t(3)).expect("no quota in the default dataset");
    assert_eq!(s.dataset_used_blocks(q), 20);
    let st = s.dataset_statfs(root).expect("statfs");
    assert_eq!((st.total_blocks, st.free_blocks), (25, 5), "df shows the quota");
    s.commit().expect("commit");
    drop(s);
    let mut s = open(&disk);
    assert_eq!(s.dataset_used_blocks(q), 20, "usage is counted again at open");
    assert!(s.write(g, 0, &[2; 40 * 1024], t(4)).is_err(), "still over after a reopen");
    s.setattr(f, &crest_store::SetAttr { size: Some(0), ..Default::default() }, t(4)).expect("truncate");
    assert_eq!(s.dataset_used_blocks(q), 0);
    s.write(g, 0, &[2; 40 * 1024], t(4)).expect("room again once f is emptied");
    s.unlink(root, b"g", t(5)).expect("unlink");
    assert_eq!(s.dataset_used_blocks(q), 0);
    drop(s.close().expect("close"));
    assert_clean(&disk);
}

#[test]
fn a_dataset_record_is_read_back_only_as_it_was_written() {
    use crest_store::store::fuzzing::dataset_record;
    let enc = |items: &[(&str, Value)]| {
        let mut l = NvList::new();
        for (k, v) in items {
            l.add(*k, v.clone()).expect("add");
        }
        l.encode()
    };
    let props = Value::List(props(&[("quota", "1M")]));
    assert!(dataset_record(&enc(&[("name", Value::Str("a".into()))])));
    assert!(dataset_record(&enc(&[("name", Value::Str("a".into())), ("props", props.clone())])));
    assert!(!dataset_record(&enc(&[("props", props.clone()), ("name", Value::Str("a".into()))])), "another order");
    assert!(!dataset_record(&enc(&[("name", Value::Str("a".into())), ("props", Value::List(NvList::new()))])));
    assert!(!dataset_record(&enc(&[("name", Value::Str("a/b".into()))])), "a bad name");
    assert!(!dataset_record(&enc(&[("name", Value::U64(1))])));
    assert!(!dataset_record(&enc(&[("name", Value::Str("a".into())), ("x", Value::Bool(true))])));
    // Random bytes and every cut of a good record: refused or read back exactly.
    let good = enc(&[("name", Value::Str("home".into())), ("props", props)]);
    for cut in 0..good.len() {
        assert!(!dataset_record(&good[..cut]));
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = good.clone();
        let at = (x % b.len() as u64) as usize;
        b[at] ^= 1 << (x >> 60 & 7);
        let _ = dataset_record(&b); // must not panic; its own assertion checks a read-back
    }
}
