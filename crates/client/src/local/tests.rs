//! The local-answer rules against hand-built caches: each answer changes the cache as the
//! server would change its store, and each refusal leaves the cache as it was.
//! (crest-sim's tests check `xattr_fits` against the store itself, and its simulator
//! drives these methods against the real server.)

use std::time::Duration;

use super::*;
use crate::NAME_MAX;

const TTL: Duration = Duration::from_secs(5);

fn time(sec: i64) -> p::Time {
    p::Time { sec, nsec: 0 }
}

fn attr(ino: u64, kind: p::FileType, mode: u32) -> p::Attr {
    p::Attr {
        ino,
        generation: 1,
        kind,
        mode,
        nlink: if kind == p::FileType::Directory { 2 } else { 1 },
        uid: 10,
        gid: 20,
        size_bytes: if kind == p::FileType::Directory { p::DIR_SIZE_BYTES } else { 0 },
        blocks_4k: 0,
        rdev: 0,
        atime: time(100),
        mtime: time(100),
        ctime: time(100),
        crtime: time(100),
        flags: 0,
    }
}

fn item(name: &str, a: &p::Attr) -> p::DirItem {
    p::DirItem { name: name.as_bytes().to_vec(), index: 0, attr: a.clone() }
}

/// A cache that acquired `dir` whole, naming `items`.
fn acquired(dir: &p::Attr, items: &[p::DirItem], now: Instant) -> NameCache {
    let mut c = NameCache::new(TTL);
    let epoch = c.epoch();
    c.grant_exclusive(dir.ino, now, now);
    for i in items {
        c.grant_exclusive(i.attr.ino, now, now);
    }
    let leaf = p::DirLeaf { hash_lo: 0, hash_hi: u64::MAX, items: items.to_vec() };
    assert!(c.absorb_acquired(dir, &leaf, epoch, now));
    c
}

fn clock(now: Instant, sec: i64) -> Clock {
    Clock { at: now, time: time(sec) }
}

fn node<'a>(parent: u64, name: &'a [u8], kind: p::FileType, mode: u32, ino: u64) -> NewNode<'a> {
    NewNode {
        cred: p::Cred { uid: 1000, gid: 1000, umask: 0o022 },
        parent,
        name,
        kind,
        mode,
        rdev: 0,
        target: None,
        open: None,
        ino,
        generation: 77,
    }
}

#[test]
fn a_create_is_answered_only_where_the_directory_is_held_whole() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut shared = NameCache::new(TTL);
    let epoch = shared.epoch();
    shared.absorb_listing(2, &[], epoch, now);
    shared.hold_attr(&dir, epoch, now);
    // Listed but shared: another mount may create the name meanwhile.
    assert!(shared.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).is_none());
    assert!(shared.lookup(2, b"f", now) == Some(Cached::Absent), "a refusal changes nothing");

    let file = attr(3, p::FileType::Regular, 0o644);
    let mut c = acquired(&dir, &[item("taken", &file)], now);
    assert!(c.create_here(&node(2, b"taken", p::FileType::Regular, 0o644, 50), clock(now, 200)).is_none());
    for bad in [&b""[..], b".", b"..", &[b'n'; NAME_MAX + 1]] {
        assert!(c.create_here(&node(2, bad, p::FileType::Regular, 0o644, 50), clock(now, 200)).is_none());
    }
    let (a, wb) = c.create_here(&node(2, b"new", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    assert_eq!((a.ino, a.generation, a.mode, a.uid, a.gid, a.nlink), (50, 77, 0o644, 1000, 1000, 1));
    assert_eq!((a.mtime, a.ctime, a.crtime), (time(200), time(200), time(200)));
    assert_eq!(c.lookup(2, b"new", now), Some(Cached::Found(a.clone())));
    assert!(c.is_exclusive(50));
    let d = c.attr(2, now).expect("the directory's attributes stay held");
    assert_eq!((d.mtime, d.ctime, d.nlink), (time(200), time(200), 2));
    // The server applies the umask itself: the request carries the mode asked for.
    assert!(matches!(&wb.ops[..], [Op::CreateAt { ino: 50, generation: 77, mode: 0o644, .. }]));
    assert_eq!(wb.touched, vec![50, 2]);
    assert!(c.writeback_pending(50) && c.writeback_pending(2));
}

#[test]
fn a_directory_made_here_follows_the_set_group_id_rule_and_is_held_empty() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o2775);
    let mut c = acquired(&dir, &[], now);
    let mut n = node(2, b"sub", p::FileType::Directory, 0o777, 60);
    n.open = Some((9, p::OPEN_READ | p::OPEN_WRITE));
    let (a, wb) = c.create_here(&n, clock(now, 300)).expect("held");
    // Group of the parent, set-group-ID kept on a directory; umask 022 applied.
    assert_eq!((a.gid, a.mode, a.nlink, a.size_bytes), (20, 0o2755, 2, p::DIR_SIZE_BYTES));
    assert_eq!(c.attr(2, now).map(|d| d.nlink), Some(3), "the parent gains the new '..'");
    assert!(c.known_empty(60));
    let rw = p::OPEN_READ | p::OPEN_WRITE;
    assert!(matches!(&wb.ops[..], [Op::CreateAt { .. }, Op::Open { ino: 60, handle: 9, access }] if *access == rw));
    // Near the link limit the server's EMLINK must reach the caller.
    let mut full = attr(3, p::FileType::Directory, 0o755);
    full.nlink = LINK_MAX_MARGIN;
    let mut c = acquired(&full, &[], now);
    assert!(c.create_here(&node(3, b"sub", p::FileType::Directory, 0o755, 61), clock(now, 300)).is_none());
    assert!(c.create_here(&node(3, b"file", p::FileType::Regular, 0o644, 62), clock(now, 300)).is_some());
}

#[test]
fn removes_are_answered_only_when_the_server_will_agree() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let file = attr(3, p::FileType::Regular, 0o644);
    let sub = attr(4, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[item("f", &file), item("d", &sub)], now);
    // Wrong kind either way, or a directory not known to be empty: the server decides.
    assert!(c.remove_here(2, b"f", true, clock(now, 200)).is_none());
    assert!(c.remove_here(2, b"d", false, clock(now, 200)).is_none());
    assert!(c.remove_here(2, b"d", true, clock(now, 200)).is_none());
    assert!(c.remove_here(2, b"missing", false, clock(now, 200)).is_none());
    let wb = c.remove_here(2, b"f", false, clock(now, 200)).expect("held");
    assert_eq!(wb.ops, vec![Op::Unlink { parent: 2, name: b"f".to_vec() }]);
    assert_eq!(c.lookup(2, b"f", now), Some(Cached::Absent));
    assert_eq!(c.attr(2, now).map(|d| (d.mtime, d.nlink)), Some((time(200), 2)));
    // A directory made here is known empty: its rmdir is answered, the parent loses a link.
    c.create_here(&node(2, b"e", p::FileType::Directory, 0o755, 70), clock(now, 210)).expect("held");
    assert_eq!(c.attr(2, now).map(|d| d.nlink), Some(3));
    c.remove_here(2, b"e", true, clock(now, 220)).expect("empty, held");
    assert_eq!(c.attr(2, now).map(|d| d.nlink), Some(2));
}

#[test]
fn a_rename_over_a_link_keeps_the_victims_other_name_and_refuses_what_the_server_decides() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let a = attr(3, p::FileType::Regular, 0o644);
    let mut b = attr(4, p::FileType::Regular, 0o644);
    b.nlink = 2;
    let mut c = acquired(&dir, &[item("a", &a), item("b", &b), item("b2", &b)], now);
    // Two names of one inode, an exchange, and no-replace over a name: the server's.
    assert!(c.rename_here(2, b"b", 2, b"b2", 0, clock(now, 200)).is_none());
    assert!(c.rename_here(2, b"a", 2, b"b", p::RENAME_NOREPLACE, clock(now, 200)).is_none());
    assert!(c.rename_here(2, b"a", 2, b"b", 2, clock(now, 200)).is_none());
    // A directory to another directory: it might be moving into its own subtree.
    c.create_here(&node(2, b"sub", p::FileType::Directory, 0o755, 5), clock(now, 150)).expect("held");
    c.create_here(&node(2, b"sub2", p::FileType::Directory, 0o755, 6), clock(now, 150)).expect("held");
    assert!(c.rename_here(2, b"sub", 6, b"x", 0, clock(now, 200)).is_none());
    assert!(c.rename_here(2, b"sub", 2, b"sub3", 0, clock(now, 200)).is_some(), "within one directory");
    let (moved, wb) = c.rename_here(2, b"a", 2, b"b", 0, clock(now, 200)).expect("held");
    assert_eq!((moved.ino, moved.ctime), (3, time(200)));
    assert_eq!(wb.touched, vec![2, 3, 4]);
    assert_eq!(c.lookup(2, b"a", now), Some(Cached::Absent));
    assert!(matches!(c.lookup(2, b"b", now), Some(Cached::Found(x)) if x.ino == 3));
    // The replaced inode lives on under its other name, with one link fewer.
    let Some(Cached::Found(left)) = c.lookup(2, b"b2", now) else { panic!("b2 is still named") };
    assert_eq!((left.ino, left.nlink, left.ctime), (4, 1, time(200)));
}

#[test]
fn xattr_changes_answer_their_errors_and_leave_big_ones_to_the_server() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[], now);
    c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    assert_eq!(c.xattr_here(50, b"user.a", None, 0, clock(now, 201)), Some(Err(p::errno::ENODATA)));
    assert_eq!(
        c.xattr_here(50, b"user.a", Some(b"1"), p::XATTR_REPLACE, clock(now, 201)),
        Some(Err(p::errno::ENODATA))
    );
    let wb = c.xattr_here(50, b"user.a", Some(b"1"), 0, clock(now, 202)).expect("held").expect("set");
    assert_eq!(wb.what, "setxattr");
    assert_eq!(c.attr(50, now).map(|a| a.ctime), Some(time(202)));
    assert_eq!(c.xattr_here(50, b"user.a", Some(b"2"), p::XATTR_CREATE, clock(now, 203)), Some(Err(p::errno::EEXIST)));
    // Too big for the store, an ACL (the mode follows it), a bad name: the server's.
    assert!(c.xattr_here(50, b"user.big", Some(&vec![0; XATTR_SIZE_MAX + 1]), 0, clock(now, 204)).is_none());
    assert!(c.xattr_here(50, acl::ACCESS, Some(b"x"), 0, clock(now, 204)).is_none());
    assert!(c.xattr_here(50, b"user.\0", Some(b"x"), 0, clock(now, 204)).is_none());
    assert_eq!(c.held_xattrs(50).map(|h| h.len()), Some(1));
}

#[test]
fn writes_grow_the_held_size_and_appends_land_at_the_held_end() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[], now);
    c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    let (a, _) = c.write_here(50, 4000, &[1; 100], false, clock(now, 201)).expect("held");
    assert_eq!((a.size_bytes, a.blocks_4k, a.mtime), (4100, 2, time(201)));
    let (a, wb) = c.write_here(50, 0, &[2; 10], true, clock(now, 202)).expect("held");
    assert_eq!(a.size_bytes, 4110);
    assert!(matches!(&wb.ops[..], [Op::Write { offset: 4100, .. }]), "{:?}", wb.ops);
    assert!(c.write_here(50, 0, &[], false, clock(now, 203)).is_none(), "an empty write changes nothing");
    assert!(c.write_here(50, MAX_WRITEBACK_END, &[1], false, clock(now, 203)).is_none(), "EFBIG is the server's");
    let set = p::SetAttr { size_bytes: Some(10), ..Default::default() };
    let (a, _) = c.setattr_here(50, &set, clock(now, 204)).expect("held");
    assert_eq!((a.size_bytes, a.blocks_4k, a.mtime, a.ctime), (10, 0, time(204), time(204)));
    assert!(c.write_here(2, 0, &[1], false, clock(now, 205)).is_none(), "a directory is not written");
}

#[test]
fn a_failed_writeback_is_kept_for_the_next_fsync_and_drops_what_was_assumed() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[], now);
    let (_, wb) = c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    let err = p::OpError { errno: p::errno::ENOSPC, message: "full".into() };
    let results = vec![Err(err.clone())];
    assert_eq!(c.writeback_answered(wb.what, &wb.touched, Ok(&results), now), Some(err.clone()));
    assert!(!c.writeback_pending(50) && !c.is_exclusive(50) && !c.is_exclusive(2));
    assert_eq!(c.take_error(50), Some(err.clone()));
    assert_eq!(c.take_error(2), Some(err));
    // An access time's failure is nobody's to report.
    let mut c = acquired(&dir, &[], now);
    let (_, wb) = c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    let lost = p::OpError { errno: p::errno::EIO, message: "fenced".into() };
    c.writeback_answered(ATIME, &wb.touched, Err(lost), now);
    assert_eq!(c.take_error(50), None);
}

#[test]
fn the_servers_attributes_replace_the_computed_ones_only_when_idle_and_not_older() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[], now);
    let (a, create) = c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    let (_, write) = c.write_here(50, 0, &[1; 5000], false, clock(now, 201)).expect("held");
    // The create's answer comes while the write is in flight: the computed state stays.
    let server_then = vec![Ok(Reply::Entry(p::Attr { blocks_4k: 9, ..a.clone() }))];
    assert_eq!(c.writeback_answered(create.what, &create.touched, Ok(&server_then), now), None);
    assert_eq!(c.attr(50, now).map(|x| x.size_bytes), Some(5000));
    // The write's answer (the server's block count) replaces it once nothing is in flight.
    let mine = c.attr(50, now).expect("held");
    let server = vec![Ok(Reply::Attr(p::Attr { blocks_4k: 3, ..mine.clone() }))];
    c.writeback_answered(write.what, &write.touched, Ok(&server), now);
    assert_eq!(c.attr(50, now).map(|x| x.blocks_4k), Some(3));
    // An answer older than what was answered here since (earlier ctime) is not taken.
    let (_, wb) = c.write_here(50, 0, &[1], false, clock(now, 300)).expect("held");
    let old = vec![Ok(Reply::Attr(p::Attr { blocks_4k: 7, ctime: time(250), ..mine }))];
    c.writeback_answered(wb.what, &wb.touched, Ok(&old), now);
    assert_eq!(c.attr(50, now).map(|x| (x.blocks_4k, x.ctime)), Some((3, time(300))));
}

#[test]
fn access_times_follow_relatime_and_go_to_the_server_when_shared() {
    let now = Instant::now();
    let dir = attr(2, p::FileType::Directory, 0o755);
    let mut c = acquired(&dir, &[], now);
    c.create_here(&node(2, b"f", p::FileType::Regular, 0o644, 50), clock(now, 200)).expect("held");
    // atime == mtime: due once, then not until something changes or a day passes.
    let (_, wb) = c.accessed_here(50, false, clock(now, 210)).expect("due").expect("held here");
    assert_eq!(wb.what, ATIME);
    assert_eq!(c.attr(50, now).map(|a| (a.atime, a.ctime)), Some((time(210), time(200))));
    assert!(c.accessed_here(50, false, clock(now, 220)).is_none());
    assert!(c.accessed_here(50, true, clock(now, 220)).is_some(), "strictatime: every read");
    assert!(c.accessed_here(50, false, clock(now, 220 + 24 * 3600)).is_some());
    // Held shared: the server is asked and the held attributes go.
    let file = attr(3, p::FileType::Regular, 0o644);
    let mut s = NameCache::new(TTL);
    let epoch = s.epoch();
    s.hold_attr(&file, epoch, now);
    assert!(matches!(s.accessed_here(3, false, clock(now, 200)), Some(Err(Op::SetAttr { ino: 3, .. }))));
    assert_eq!(s.attr(3, now), None);
}
