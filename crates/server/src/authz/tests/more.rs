//! Removal, renames, links, read-only exports, squashing, xattrs, locks; and random
//! files and callers against a reference.

use super::*;

fn unlink(parent: u64, name: &str) -> Op {
    Op::Unlink { parent, name: name.as_bytes().to_vec() }
}

fn rename(parent: u64, name: &str, new_parent: u64, new_name: &str, flags: u32) -> Op {
    Op::Rename { parent, name: name.as_bytes().to_vec(), new_parent, new_name: new_name.as_bytes().to_vec(), flags }
}

#[test]
fn a_sticky_directory_keeps_others_from_removing_ones_files() {
    let mut st = store();
    let tmp = mk(&mut st, ROOT_INO, "tmp", FileType::Directory, 0o1777, 0, 0);
    mk(&mut st, tmp, "mine", FileType::Regular, 0o644, 1000, 1000);
    mk(&mut st, tmp, "sub", FileType::Directory, 0o755, 1000, 1000);
    assert_eq!(t(&mut st, &user(1001), unlink(tmp, "mine")), Err(1), "another's file");
    let rmdir = Op::Rmdir { parent: tmp, name: b"sub".to_vec() };
    assert_eq!(t(&mut st, &user(1001), rmdir.clone()), Err(1));
    assert!(t(&mut st, &user(1000), unlink(tmp, "mine")).is_ok(), "one's own");
    assert!(t(&mut st, &user(1000), rmdir).is_ok());
    assert!(t(&mut st, &Caller::ROOT, unlink(tmp, "mine")).is_ok(), "root");
    assert!(t(&mut st, &user(1001), unlink(tmp, "absent")).is_ok(), "the store says ENOENT");
    let own_tmp = mk(&mut st, ROOT_INO, "own", FileType::Directory, 0o1777, 1001, 1001);
    mk(&mut st, own_tmp, "theirs", FileType::Regular, 0o644, 1000, 1000);
    assert!(t(&mut st, &user(1001), unlink(own_tmp, "theirs")).is_ok(), "the directory's owner");
    // Renames: out of a sticky directory, and over an entry in one.
    assert_eq!(t(&mut st, &user(1001), rename(tmp, "mine", ROOT_INO, "stolen", 0)), Err(1));
    mk(&mut st, ROOT_INO, "bait", FileType::Regular, 0o644, 1001, 1001);
    assert_eq!(t(&mut st, &user(1001), rename(ROOT_INO, "bait", tmp, "mine", 0)), Err(1), "replace another's");
    assert!(t(&mut st, &user(1001), rename(ROOT_INO, "bait", tmp, "new", 0)).is_ok());
    // Without the sticky bit, write on the directory is enough.
    let open = mk(&mut st, ROOT_INO, "open", FileType::Directory, 0o777, 0, 0);
    mk(&mut st, open, "f", FileType::Regular, 0o600, 1000, 1000);
    assert!(t(&mut st, &user(1001), unlink(open, "f")).is_ok());
    let closed = mk(&mut st, ROOT_INO, "closed", FileType::Directory, 0o755, 0, 0);
    mk(&mut st, closed, "f", FileType::Regular, 0o666, 1000, 1000);
    assert_eq!(t(&mut st, &user(1000), unlink(closed, "f")), Err(13), "no write on the directory");
}

#[test]
fn a_directory_moving_to_another_parent_needs_write_on_itself() {
    let mut st = store();
    let a = mk(&mut st, ROOT_INO, "a", FileType::Directory, 0o755, 1000, 1000);
    let b = mk(&mut st, ROOT_INO, "b", FileType::Directory, 0o755, 1000, 1000);
    mk(&mut st, a, "d", FileType::Directory, 0o555, 1000, 1000);
    mk(&mut st, a, "w", FileType::Directory, 0o755, 1000, 1000);
    mk(&mut st, a, "f", FileType::Regular, 0o444, 1000, 1000);
    let me = user(1000);
    assert_eq!(t(&mut st, &me, rename(a, "d", b, "d", 0)), Err(13), "its .. would change");
    assert!(t(&mut st, &me, rename(a, "d", a, "e", 0)).is_ok(), "same parent: .. stays");
    assert!(t(&mut st, &me, rename(a, "w", b, "w", 0)).is_ok());
    assert!(t(&mut st, &me, rename(a, "f", b, "f", 0)).is_ok(), "a file has no ..");
    assert!(t(&mut st, &Caller::ROOT, rename(a, "d", b, "d", 0)).is_ok());
    mk(&mut st, b, "x", FileType::Directory, 0o555, 1000, 1000);
    let swap = rename(a, "w", b, "x", p::RENAME_EXCHANGE);
    assert_eq!(t(&mut st, &me, swap), Err(13), "an exchange moves the other directory too");
    assert!(t(&mut st, &me, rename(a, "w", b, "x", 0)).is_ok(), "a plain rename only replaces it");
    assert_eq!(t(&mut st, &user(1001), rename(a, "f", b, "f", 0)), Err(13), "write on the parents");
    let c = mk(&mut st, ROOT_INO, "c", FileType::Directory, 0o777, 0, 0);
    assert_eq!(t(&mut st, &user(1001), rename(c, "f", a, "f", 0)), Err(13), "and on the new one");
}

#[test]
fn links_need_write_on_the_directory_and_rights_to_the_file() {
    let mut st = store();
    let d = mk(&mut st, ROOT_INO, "d", FileType::Directory, 0o755, 1000, 1000);
    let mine = mk(&mut st, ROOT_INO, "mine", FileType::Regular, 0o600, 1000, 1000);
    let link = |ino, parent| Op::Link { ino, parent, name: b"l".to_vec() };
    assert!(t(&mut st, &user(1000), link(mine, d)).is_ok());
    assert_eq!(t(&mut st, &user(1001), link(mine, ROOT_INO)), Err(1), "another's file it cannot read");
    let suid = mk(&mut st, ROOT_INO, "suid", FileType::Regular, 0o4777, 0, 0);
    assert_eq!(t(&mut st, &user(1001), link(suid, ROOT_INO)), Err(1), "root's setuid program");
    let shared = mk(&mut st, ROOT_INO, "shared", FileType::Regular, 0o666, 0, 0);
    assert!(t(&mut st, &user(1001), link(shared, ROOT_INO)).is_ok());
    assert_eq!(t(&mut st, &user(1001), link(shared, d)), Err(13));
}

#[test]
fn a_read_only_export_refuses_every_change() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o666, 1000, 1000);
    let d = mk(&mut st, ROOT_INO, "d", FileType::Directory, 0o777, 1000, 1000);
    let ro = Policy { read_only: true, ..Policy::trusted() };
    let cred = p::Cred::default();
    let name = || b"n".to_vec();
    let changes = vec![
        create(d, "n", FileType::Regular, 0o644, cred),
        Op::Symlink { parent: d, name: name(), target: name(), cred },
        Op::Link { ino: f, parent: d, name: name() },
        unlink(ROOT_INO, "f"),
        Op::Rmdir { parent: ROOT_INO, name: b"d".to_vec() },
        rename(ROOT_INO, "f", d, "g", 0),
        setattr(f, SetAttr { mode: Some(0o600), ..Default::default() }),
        write(f),
        Op::Append { ino: f, data: vec![1] },
        Op::Fallocate { ino: f, offset: 0, len: 1, flags: 0 },
        Op::WriteBack { ino: f, offset: 0, data: vec![1] },
        Op::SetXattr { ino: f, name: b"user.x".to_vec(), value: vec![], flags: 0 },
        Op::RemoveXattr { ino: f, name: b"user.x".to_vec() },
        Op::CreateAt {
            ino: 50,
            generation: 1,
            parent: d,
            name: name(),
            kind: FileType::Regular,
            mode: 0o644,
            rdev: 0,
            cred,
        },
        Op::SymlinkAt { ino: 51, generation: 1, parent: d, name: name(), target: name(), cred },
        Op::AllocInodes { count: 4 },
        // (Exclusive rights are for answering changes: a read-only host gets none.)
        Op::Acquire { ino: d },
    ];
    for op in changes {
        assert_eq!(run(&mut st, &ro, &Caller::ROOT, op.clone()), Err(30), "{op:?}");
        assert!(run(&mut st, &Policy::trusted(), &Caller::ROOT, op.clone()).is_ok(), "{op:?} when writable");
    }
    let reads = vec![
        Op::Lookup { parent: ROOT_INO, name: b"f".to_vec() },
        Op::GetAttr { ino: f },
        Op::ReadDir { ino: d, from_index: 0, limit: 5 },
        read(f),
        Op::StatFs,
        Op::GetXattr { ino: f, name: b"user.x".to_vec() },
        Op::ListXattr { ino: f },
        Op::Open { ino: f, handle: 1, access: p::OPEN_READ },
        Op::Release { ino: f, handle: 1 },
        Op::Fsync { ino: f },
        Op::SetLock { ino: f, owner: 1, start: 0, end: 1, kind: p::LockKind::Write, flock: false, pid: 1 },
        Op::GetLock { ino: f, owner: 1, start: 0, end: 1, kind: p::LockKind::Write, flock: false },
    ];
    for op in reads {
        assert!(run(&mut st, &ro, &user(1000), op.clone()).is_ok(), "{op:?} on a read-only export");
    }
    for access in [p::OPEN_WRITE, p::OPEN_READ | p::OPEN_WRITE] {
        let open = Op::Open { ino: f, handle: 2, access };
        assert_eq!(run(&mut st, &ro, &user(1000), open), Err(30), "an open for writing, as on a read-only mount");
    }
}

#[test]
fn squashing_and_maps() {
    let joined = Policy::joined();
    let root = Caller { uid: 0, gid: 0, groups: vec![0, 5] };
    assert_eq!(joined.map(&root), Caller { uid: 65534, gid: 65534, groups: vec![5] });
    assert_eq!(joined.map(&user(1000)), user(1000), "others are who they say");
    assert_eq!(Policy::trusted().map(&root), root);
    let all = Policy { all_squash: true, anon_uid: 7, anon_gid: 8, ..Policy::trusted() };
    assert_eq!(
        all.map(&Caller { uid: 1000, gid: 1000, groups: vec![1, 2] }),
        Caller { uid: 7, gid: 8, groups: vec![] }
    );
    let mapped = Policy { uid_map: vec![(1000, 2000), (5, 0)], gid_map: vec![(100, 200), (3, 0)], ..Policy::joined() };
    let c = mapped.map(&Caller { uid: 1000, gid: 100, groups: vec![100, 3, 4] });
    assert_eq!(c, Caller { uid: 2000, gid: 200, groups: vec![200, 4] }, "mapped, then group 0 squashed");
    assert_eq!(mapped.map(&user(5)).uid, 65534, "mapped to root, then squashed");
    let many = Caller { uid: 1, gid: 1, groups: (0..1000).collect() };
    assert_eq!(Policy::trusted().map(&many).groups.len(), p::MAX_CALLER_GROUPS);
    // A squashed root reads no root-private file.
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "secret", FileType::Regular, 0o600, 0, 0);
    assert_eq!(run(&mut st, &joined, &joined.map(&Caller::ROOT), read(f)), Err(13));
    assert!(run(&mut st, &Policy::trusted(), &Policy::trusted().map(&Caller::ROOT), read(f)).is_ok());
    // A JSON policy names only what it changes; the rest is `joined()`.
    let p: Policy = serde_json::from_str(r#"{"read_only": true, "uid_map": [[1000, 2000]]}"#).expect("json");
    assert_eq!(p, Policy { read_only: true, uid_map: vec![(1000, 2000)], ..Policy::joined() });
    assert!(serde_json::from_str::<Policy>(r#"{"root_sqash": false}"#).is_err(), "a misspelt field is refused");
    assert_eq!(Policy::default(), Policy::joined());
}

#[test]
fn xattr_namespaces() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o640, 1000, 1000);
    let get = |name: &str| Op::GetXattr { ino: f, name: name.as_bytes().to_vec() };
    let set = |name: &str| Op::SetXattr { ino: f, name: name.as_bytes().to_vec(), value: vec![], flags: 0 };
    let rm = |name: &str| Op::RemoveXattr { ino: f, name: name.as_bytes().to_vec() };
    let (owner, stranger) = (user(1000), user(1001));
    let reader = Caller { uid: 1001, gid: 1, groups: vec![1000] };
    assert_eq!(t(&mut st, &stranger, get("user.a")), Err(13));
    assert!(t(&mut st, &reader, get("user.a")).is_ok());
    assert_eq!(t(&mut st, &reader, set("user.a")), Err(13), "read is not write");
    assert_eq!(t(&mut st, &reader, rm("user.a")), Err(13));
    assert!(t(&mut st, &owner, set("user.a")).is_ok());
    for name in ["security.selinux", "system.posix_acl_access"] {
        assert!(t(&mut st, &stranger, get(name)).is_ok(), "{name} is anyone's to read");
    }
    assert_eq!(t(&mut st, &owner, get("trusted.a")), Err(1));
    assert!(t(&mut st, &Caller::ROOT, get("trusted.a")).is_ok());
    for name in ["trusted.a", "security.selinux"] {
        assert_eq!(t(&mut st, &owner, set(name)), Err(1), "{name} by its owner");
        assert_eq!(t(&mut st, &owner, rm(name)), Err(1));
        assert!(t(&mut st, &Caller::ROOT, set(name)).is_ok());
    }
    assert!(t(&mut st, &Caller::ROOT, set("security.capability")).is_ok());
    let no_suid = Policy { root_squash: false, ..Policy::joined() };
    assert_eq!(run(&mut st, &no_suid, &Caller::ROOT, set("security.capability")), Err(1));
    // Capabilities go with a write: whoever may write the file may take them away
    // (the group may here), the owner too; not a reader, and nobody may set them.
    let writer = Caller { uid: 1001, gid: 1000, groups: vec![] };
    st.setattr(f, &s::SetAttr { mode: Some(0o660), ..Default::default() }, time_in(NOW)).expect("chmod");
    assert!(t(&mut st, &writer, rm("security.capability")).is_ok());
    assert!(t(&mut st, &owner, rm("security.capability")).is_ok());
    assert_eq!(t(&mut st, &stranger, rm("security.capability")), Err(13), "may not write it");
    assert!(through(&mut st, &stranger, p::OPEN_WRITE, rm("security.capability")).is_ok(), "through a handle");
    assert_eq!(t(&mut st, &writer, set("security.capability")), Err(1));
    assert!(run(&mut st, &no_suid, &writer, rm("security.capability")).is_ok());
    assert_eq!(t(&mut st, &stranger, set("system.posix_acl_access")), Err(1), "ACLs are the owner's");
    assert_eq!(t(&mut st, &stranger, rm("system.posix_acl_default")), Err(1));
    let flags_of = |r: Result<Op, i32>| match ok(r) {
        Op::SetXattr { flags, .. } => flags,
        other => panic!("{other:?}"),
    };
    assert_eq!(flags_of(t(&mut st, &owner, set("system.posix_acl_access"))), 0);
    let g = mk(&mut st, ROOT_INO, "g", FileType::Regular, 0o2750, 1000, 50);
    let set_g = Op::SetXattr { ino: g, name: acl::ACCESS.to_vec(), value: vec![], flags: 0 };
    assert_eq!(flags_of(t(&mut st, &owner, set_g.clone())), p::XATTR_ACL_KILL_SGID, "owner outside group 50");
    assert_eq!(flags_of(t(&mut st, &Caller::ROOT, set_g)), 0);
    // user.* only on files and directories; in a sticky directory, its owner's.
    let fifo = mk(&mut st, ROOT_INO, "p", FileType::Fifo, 0o666, 1000, 1000);
    let on = |ino| Op::SetXattr { ino, name: b"user.a".to_vec(), value: vec![], flags: 0 };
    assert_eq!(t(&mut st, &owner, on(fifo)), Err(1));
    let tmp = mk(&mut st, ROOT_INO, "tmp", FileType::Directory, 0o1777, 0, 0);
    assert_eq!(t(&mut st, &owner, on(tmp)), Err(1));
    assert!(t(&mut st, &Caller::ROOT, on(tmp)).is_ok());
}

#[test]
fn locks_follow_read_and_write_permission() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o640, 1000, 50);
    let lock = |kind| Op::SetLock { ino: f, owner: 1, start: 0, end: 9, kind, flock: false, pid: 1 };
    let get = Op::GetLock { ino: f, owner: 1, start: 0, end: 9, kind: p::LockKind::Read, flock: true };
    let member = Caller { uid: 1001, gid: 50, groups: vec![] };
    let stranger = user(1002);
    assert!(t(&mut st, &member, lock(p::LockKind::Read)).is_ok());
    assert_eq!(t(&mut st, &member, lock(p::LockKind::Write)), Err(13));
    assert!(t(&mut st, &member, get.clone()).is_ok());
    assert_eq!(t(&mut st, &stranger, lock(p::LockKind::Read)), Err(13), "lock what one cannot read");
    assert_eq!(t(&mut st, &stranger, get), Err(13));
    assert!(t(&mut st, &stranger, lock(p::LockKind::Unlock)).is_ok(), "unlocking asks nothing");
    assert!(t(&mut st, &user(1000), lock(p::LockKind::Write)).is_ok());
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Random files (mode, owner, group) under random directories, asked of by random
/// callers, against the classic rules written out plainly.
#[test]
fn random_files_and_callers_against_the_classic_rules() {
    let seed = std::env::var("CREST_SERVER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    eprintln!("CREST_SERVER_SEED={seed}");
    let mut rs = seed | 1;
    let mut st = store();
    let ids = [0u32, 1000, 1001, 50];
    let bits = |m: u32, c: &Caller, uid: u32, gid: u32| -> u32 {
        if c.uid == uid {
            (m >> 6) & 7
        } else if c.gid == gid || c.groups.contains(&gid) {
            (m >> 3) & 7
        } else {
            m & 7
        }
    };
    for i in 0..300 {
        let mut r = || next(&mut rs);
        let pick = |x: u64| ids[(x % 4) as usize];
        let (dmode, duid, dgid) = (r() as u32 & 0o1777, pick(r()), pick(r()));
        let (fmode, fuid, fgid) = (r() as u32 & 0o7777, pick(r()), pick(r()));
        let groups = if r() % 2 == 0 { vec![50] } else { vec![] };
        let c = Caller { uid: pick(r()), gid: pick(r()), groups };
        let d = mk(&mut st, ROOT_INO, &format!("d{i}"), FileType::Directory, dmode, duid, dgid);
        let f = mk(&mut st, d, "f", FileType::Regular, fmode, fuid, fgid);
        let ctx = format!("seed {seed} step {i}: dir {dmode:o} {duid}:{dgid}, file {fmode:o} {fuid}:{fgid}, {c:?}");
        let root = c.uid == 0;
        let fb = bits(fmode, &c, fuid, fgid);
        let db = bits(dmode, &c, duid, dgid);
        let code = |allowed: bool, errno: i32| if allowed { Ok(()) } else { Err(errno) };
        let got = |r: Result<Op, i32>| r.map(|_| ());
        assert_eq!(got(t(&mut st, &c, read(f))), code(root || c.uid == fuid || fb & 4 != 0, 13), "read: {ctx}");
        assert_eq!(got(t(&mut st, &c, write(f))), code(root || c.uid == fuid || fb & 2 != 0, 13), "write: {ctx}");
        let look = Op::Lookup { parent: d, name: b"f".to_vec() };
        assert_eq!(got(t(&mut st, &c, look)), code(root || db & 1 != 0, 13), "lookup: {ctx}");
        let may_dir = root || db & 3 == 3;
        let sticky_ok = dmode & 0o1000 == 0 || root || c.uid == fuid || c.uid == duid;
        let want = if !may_dir { Err(13) } else { code(sticky_ok, 1) };
        assert_eq!(got(t(&mut st, &c, unlink(d, "f"))), want, "unlink: {ctx}");
        let chmod = setattr(f, SetAttr { mode: Some(0o6777), ..Default::default() });
        match t(&mut st, &c, chmod) {
            Ok(Op::SetAttr { set, .. }) => {
                assert!(root || c.uid == fuid, "chmod allowed: {ctx}");
                let kept_sgid = root || c.gid == fgid || c.groups.contains(&fgid);
                assert_eq!(set.mode, Some(if kept_sgid { 0o6777 } else { 0o4777 }), "chmod: {ctx}");
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => assert_eq!((e, root || c.uid == fuid), (1, false), "chmod refused: {ctx}"),
        }
        let joined = Policy::joined();
        let mc = joined.map(&c);
        if let Ok(Op::SetAttr { set, .. }) =
            run(&mut st, &joined, &mc, setattr(f, SetAttr { mode: Some(0o6777), ..Default::default() }))
        {
            assert_eq!(set.mode.map(|m| m & 0o6000), Some(0), "no setuid for a joined host: {ctx}");
        }
    }
}

fn open(ino: u64, access: u32) -> Op {
    Op::Open { ino, handle: 1, access }
}

#[test]
fn an_open_is_checked_as_the_kernel_checks_it() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o640, 1000, 1000);
    let (owner, member, stranger) = (user(1000), Caller { uid: 1002, gid: 7, groups: vec![1000] }, user(1001));
    let (r, w, x) = (p::OPEN_READ, p::OPEN_WRITE, p::OPEN_EXEC);
    assert_eq!(t(&mut st, &stranger, open(f, r)), Err(13));
    assert_eq!(t(&mut st, &stranger, open(f, w)), Err(13));
    assert_eq!(t(&mut st, &stranger, open(f, 0)), Err(22), "a file's open asks for an access");
    let dir = mk(&mut st, ROOT_INO, "dir", FileType::Directory, 0o700, 1000, 1000);
    assert!(t(&mut st, &stranger, open(dir, 0)).is_ok(), "a directory's asks nothing (each readdir is checked)");
    assert!(t(&mut st, &member, open(f, r)).is_ok());
    assert_eq!(t(&mut st, &member, open(f, r | w)), Err(13));
    assert!(t(&mut st, &owner, open(f, r | w)).is_ok());
    let ro = mk(&mut st, ROOT_INO, "ro", FileType::Regular, 0o444, 1000, 1000);
    assert!(t(&mut st, &owner, open(ro, w)).is_ok(), "O_CREAT of a read-only file opens it for writing");
    let tool = mk(&mut st, ROOT_INO, "tool", FileType::Regular, 0o711, 0, 0);
    assert!(t(&mut st, &stranger, open(tool, x)).is_ok(), "execute permission runs it");
    assert_eq!(t(&mut st, &stranger, open(tool, r)), Err(13), "but does not read it");
    assert_eq!(t(&mut st, &stranger, open(f, 8)), Err(22), "unknown access bits");
    assert_eq!(t(&mut st, &Caller::ROOT, open(f, 8 | r)), Ok(open(f, 8 | r)), "root: nothing is looked at");
}

#[test]
fn a_descriptor_reads_and_writes_for_whoever_uses_it() {
    let mut st = store();
    // Root's file, setgid, that nobody may read or write by its bits.
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o2600, 0, 1003);
    let nobody = user(NOBODY);
    let (r, w, x) = (p::OPEN_READ, p::OPEN_WRITE, p::OPEN_EXEC);
    let write = || write(f);
    let fallocate = || Op::Fallocate { ino: f, offset: 0, len: 10, flags: 0 };
    let truncate = || setattr(f, SetAttr { size_bytes: Some(3), ..Default::default() });
    let lock = |kind, flock| Op::SetLock { ino: f, owner: 1, start: 0, end: 1, kind, flock, pid: 1 };
    for op in
        [read(f), write(), fallocate(), truncate(), lock(p::LockKind::Read, false), lock(p::LockKind::Write, true)]
    {
        assert_eq!(through(&mut st, &nobody, 0, op.clone()), Err(13), "{op:?} with no descriptor");
    }
    for op in [write(), fallocate(), truncate(), lock(p::LockKind::Write, false), lock(p::LockKind::Read, true)] {
        assert!(through(&mut st, &nobody, w, op.clone()).is_ok(), "{op:?} through a descriptor open for writing");
    }
    assert_eq!(through(&mut st, &nobody, w, read(f)), Err(13), "a descriptor open for writing does not read");
    assert_eq!(through(&mut st, &nobody, w, lock(p::LockKind::Read, false)), Err(13), "nor takes fcntl read locks");
    for opened in [r, x] {
        assert!(through(&mut st, &nobody, opened, read(f)).is_ok());
        assert_eq!(through(&mut st, &nobody, opened, write()), Err(13), "a descriptor open for reading does not write");
        assert_eq!(through(&mut st, &nobody, opened, truncate()), Err(13));
    }
    // The kill-priv the kernel asks on nobody's behalf after the write.
    let kill = setattr(f, SetAttr { mode: Some(0o600), ..Default::default() });
    assert!(through(&mut st, &nobody, w, kill).is_ok());
}
