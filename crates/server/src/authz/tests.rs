//! The checks against a real store on a memory disk: each rule both ways.

use super::*;
use crate::convert::{kind_in, time_in};
use p::{Caller, FileType, SetAttr, SetTime, Time};

mod more;

const NOW: Time = Time { sec: 1_000_000, nsec: 0 };
const ROOT_INO: u64 = 1;

pub(super) fn store() -> s::Store {
    let disk = s::MemDisk::new(16 << 20);
    let opts = s::MkfsOptions { now: s::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 };
    s::Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
    let mut st = s::Store::open(Box::new(disk)).expect("open");
    // The root directory: everyone may create in it, as in /tmp (but not sticky).
    let set = s::SetAttr { mode: Some(0o777), ..Default::default() };
    st.setattr(ROOT_INO, &set, time_in(NOW)).expect("chmod root");
    st
}

pub(super) fn user(uid: u32) -> Caller {
    Caller { uid, gid: uid, groups: Vec::new() }
}

/// Makes `name` in `parent` with this mode and owner, straight in the store.
pub(super) fn mk(st: &mut s::Store, parent: u64, name: &str, kind: FileType, mode: u32, uid: u32, gid: u32) -> u64 {
    st.create(parent, name.as_bytes(), kind_in(kind), mode, uid, gid, 0, time_in(NOW)).expect("create").ino
}

/// `check` under `policy` at the server's clock: the op as it would run, or the errno.
pub(super) fn run(st: &mut s::Store, policy: &Policy, caller: &Caller, op: Op) -> Result<Op, i32> {
    run_at(st, policy, caller, op, None)
}

pub(super) fn run_at(st: &mut s::Store, policy: &Policy, who: &Caller, op: Op, at: Option<Time>) -> Result<Op, i32> {
    let mut op = op;
    check(st, policy, who, &mut op, When { now: NOW, client_time: at, opened: 0 }).map(|()| op).map_err(|e| e.errno)
}

/// `t` by a session holding the op's inode open with `opened` (`p::OPEN_*`).
pub(super) fn through(st: &mut s::Store, who: &Caller, opened: u32, op: Op) -> Result<Op, i32> {
    let mut op = op;
    let when = When { now: NOW, client_time: None, opened };
    check(st, &Policy::trusted(), who, &mut op, when).map(|()| op).map_err(|e| e.errno)
}

/// `run` under the trusted policy: permission bits alone decide.
pub(super) fn t(st: &mut s::Store, caller: &Caller, op: Op) -> Result<Op, i32> {
    run(st, &Policy::trusted(), caller, op)
}

pub(super) fn read(ino: u64) -> Op {
    Op::Read { ino, offset: 0, len: 10 }
}

pub(super) fn write(ino: u64) -> Op {
    Op::Write { ino, offset: 0, data: b"x".to_vec() }
}

pub(super) fn setattr(ino: u64, set: SetAttr) -> Op {
    Op::SetAttr { ino, set }
}

pub(super) fn create(parent: u64, name: &str, kind: FileType, mode: u32, cred: p::Cred) -> Op {
    Op::Create { parent, name: name.as_bytes().to_vec(), kind, mode, rdev: 0, cred }
}

pub(super) fn ok(r: Result<Op, i32>) -> Op {
    r.unwrap_or_else(|e| panic!("refused with errno {e}"))
}

#[test]
fn another_users_private_file_is_neither_read_nor_written() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o600, 1000, 1000);
    for op in
        [read(f), write(f), Op::Append { ino: f, data: vec![1] }, Op::Fallocate { ino: f, offset: 0, len: 1, flags: 0 }]
    {
        assert_eq!(t(&mut st, &user(1001), op.clone()), Err(13), "{op:?} by a stranger");
        assert!(t(&mut st, &user(1000), op.clone()).is_ok(), "{op:?} by the owner");
        assert!(t(&mut st, &Caller::ROOT, op.clone()).is_ok(), "{op:?} by root");
    }
    let wb = Op::WriteBack { ino: f, offset: 0, data: vec![1] };
    assert_eq!(t(&mut st, &user(1001), wb), Err(13));
    let g = mk(&mut st, ROOT_INO, "g", FileType::Regular, 0o640, 1000, 50);
    let member = Caller { uid: 1001, gid: 7, groups: vec![50] };
    assert!(t(&mut st, &member, read(g)).is_ok(), "the group may read");
    assert_eq!(t(&mut st, &member, write(g)), Err(13), "but not write");
    // The owner may use a file whose bits say no (an fd opened before a chmod).
    let ro = mk(&mut st, ROOT_INO, "ro", FileType::Regular, 0o000, 1000, 1000);
    assert!(t(&mut st, &user(1000), write(ro)).is_ok());
    assert!(t(&mut st, &user(1000), read(ro)).is_ok());
}

#[test]
fn an_access_acl_decides_for_named_users() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o600, 1000, 1000);
    let e = |tag, perm, id| acl::Entry { tag, perm, id };
    let entries = [
        e(acl::USER_OBJ, 6, 0),
        e(acl::USER, 6, 1001),
        e(acl::GROUP_OBJ, 0, 0),
        e(acl::MASK, 6, 0),
        e(acl::OTHER, 0, 0),
    ];
    st.setxattr(f, acl::ACCESS, &acl::encode(&entries), time_in(NOW)).expect("set ACL");
    let set = s::SetAttr { mode: Some(0o660), ..Default::default() };
    st.setattr(f, &set, time_in(NOW)).expect("mode of the ACL");
    assert!(t(&mut st, &user(1001), read(f)).is_ok(), "the named user");
    assert!(t(&mut st, &user(1001), write(f)).is_ok());
    assert_eq!(t(&mut st, &user(1002), read(f)), Err(13), "not in the ACL");
    assert_eq!(t(&mut st, &Caller { uid: 1002, gid: 1000, groups: vec![] }, read(f)), Err(13), "group entry ---");
}

#[test]
fn names_need_search_and_listings_read() {
    let mut st = store();
    let d = mk(&mut st, ROOT_INO, "d", FileType::Directory, 0o711, 1000, 1000);
    mk(&mut st, d, "f", FileType::Regular, 0o644, 1000, 1000);
    let lookup = |name: &str| Op::Lookup { parent: d, name: name.as_bytes().to_vec() };
    let stranger = user(1001);
    assert!(t(&mut st, &stranger, lookup("f")).is_ok(), "x lets one look names up");
    assert_eq!(t(&mut st, &stranger, Op::ReadDir { ino: d, from_index: 0, limit: 10 }), Err(13));
    assert_eq!(t(&mut st, &stranger, Op::Acquire { ino: d }), Err(13), "acquire returns the listing");
    assert!(t(&mut st, &user(1000), Op::ReadDir { ino: d, from_index: 0, limit: 10 }).is_ok());
    assert_eq!(may_list(&mut st, &stranger, d), Ok(false));
    assert_eq!(may_list(&mut st, &user(1000), d), Ok(true));
    let closed = mk(&mut st, ROOT_INO, "closed", FileType::Directory, 0o700, 1000, 1000);
    let look = Op::Lookup { parent: closed, name: b"f".to_vec() };
    assert_eq!(t(&mut st, &stranger, look.clone()), Err(13));
    assert!(t(&mut st, &Caller::ROOT, look).is_ok(), "root searches any directory");
    for name in [".", ".."] {
        let op = Op::Lookup { parent: closed, name: name.as_bytes().to_vec() };
        assert!(t(&mut st, &stranger, op).is_ok(), "{name} tells no more than GetAttr");
    }
    for op in [
        Op::GetAttr { ino: closed },
        Op::StatFs,
        Op::Fsync { ino: closed },
        Op::Open { ino: closed, handle: 1, access: 0 },
    ] {
        assert!(t(&mut st, &stranger, op).is_ok());
    }
}

#[test]
fn creating_needs_write_and_search_and_makes_the_caller_the_owner() {
    let mut st = store();
    let d = mk(&mut st, ROOT_INO, "d", FileType::Directory, 0o755, 1000, 1000);
    let claimed = p::Cred { uid: 0, gid: 0, umask: 0o022 };
    let op = create(d, "f", FileType::Regular, 0o644, claimed);
    assert_eq!(t(&mut st, &user(1001), op.clone()), Err(13), "no write on the directory");
    let Op::Create { cred, kind, mode, .. } = ok(t(&mut st, &user(1000), op)) else { panic!() };
    assert_eq!(cred, p::Cred { uid: 1000, gid: 1000, umask: 0o022 }, "the owner is who asks; the umask stays");
    // As it runs: the file is 1000's.
    let f = st.create(d, b"f", kind_in(kind), mode, cred.uid, cred.gid, 0, time_in(NOW)).expect("create");
    assert_eq!((f.uid, f.gid), (1000, 1000));
    let sym = Op::Symlink { parent: d, name: b"l".to_vec(), target: b"f".to_vec(), cred: claimed };
    let Op::Symlink { cred, .. } = ok(t(&mut st, &user(1000), sym.clone())) else { panic!() };
    assert_eq!((cred.uid, cred.gid), (1000, 1000));
    assert_eq!(t(&mut st, &user(1001), sym), Err(13));
    let at = Op::CreateAt {
        ino: 99,
        generation: 1,
        parent: d,
        name: b"g".to_vec(),
        kind: FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: claimed,
    };
    let Op::CreateAt { cred, .. } = ok(t(&mut st, &user(1000), at.clone())) else { panic!() };
    assert_eq!(cred.uid, 1000);
    assert_eq!(t(&mut st, &user(1001), at), Err(13));
    let sat =
        Op::SymlinkAt { ino: 98, generation: 1, parent: d, name: b"m".to_vec(), target: b"f".to_vec(), cred: claimed };
    assert_eq!(t(&mut st, &user(1001), sat), Err(13));
    let x_only = mk(&mut st, ROOT_INO, "x", FileType::Directory, 0o733, 1000, 1000);
    assert!(t(&mut st, &user(1001), create(x_only, "f", FileType::Regular, 0o644, claimed)).is_ok());
    let w_only = mk(&mut st, ROOT_INO, "w", FileType::Directory, 0o722, 1000, 1000);
    assert_eq!(t(&mut st, &user(1001), create(w_only, "f", FileType::Regular, 0o644, claimed)), Err(13));
}

#[test]
fn devices_need_root_and_a_policy_that_allows_them() {
    let mut st = store();
    for kind in [FileType::CharDevice, FileType::BlockDevice] {
        let op = Op::Create {
            parent: ROOT_INO,
            name: b"dev".to_vec(),
            kind,
            mode: 0o666,
            rdev: 0x0801,
            cred: Default::default(),
        };
        assert!(t(&mut st, &Caller::ROOT, op.clone()).is_ok(), "root on a trusted host");
        assert_eq!(t(&mut st, &user(1000), op.clone()), Err(1), "not root");
        let root_unsquashed = Policy { root_squash: false, ..Policy::joined() };
        assert_eq!(run(&mut st, &root_unsquashed, &Caller::ROOT, op.clone()), Err(1), "devices not allowed");
        let joined = Policy::joined();
        assert_eq!(run(&mut st, &joined, &joined.map(&Caller::ROOT), op), Err(1), "squashed root");
    }
    // A whiteout (0:0) opens nothing: anyone may make one, as on Linux.
    let whiteout = Op::Create {
        parent: ROOT_INO,
        name: b"w".to_vec(),
        kind: FileType::CharDevice,
        mode: 0,
        rdev: 0,
        cred: Default::default(),
    };
    assert!(run(&mut st, &Policy::joined(), &user(1000), whiteout).is_ok());
    let fifo = create(ROOT_INO, "p", FileType::Fifo, 0o644, Default::default());
    assert!(run(&mut st, &Policy::joined(), &user(1000), fifo).is_ok());
}

#[test]
fn setuid_is_dropped_unless_allowed() {
    let mut st = store();
    let mode_of = |r: Result<Op, i32>| match ok(r) {
        Op::Create { mode, .. } => mode,
        Op::SetAttr { set, .. } => set.mode.expect("a mode"),
        other => panic!("{other:?}"),
    };
    let joined = Policy::joined();
    let trusted = Policy::trusted();
    let me = user(1000);
    let new = |kind, mode| create(ROOT_INO, "n", kind, mode, Default::default());
    assert_eq!(mode_of(run(&mut st, &joined, &me, new(FileType::Regular, 0o6755))), 0o755);
    assert_eq!(mode_of(run(&mut st, &trusted, &me, new(FileType::Regular, 0o6755))), 0o6755);
    assert_eq!(mode_of(run(&mut st, &joined, &me, new(FileType::Directory, 0o6755))), 0o2755, "setgid dirs stay");
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o755, 1000, 1000);
    let chmod = |m| setattr(f, SetAttr { mode: Some(m), ..Default::default() });
    assert_eq!(mode_of(run(&mut st, &joined, &me, chmod(0o4755))), 0o755, "chmod u+s stripped");
    assert_eq!(mode_of(run(&mut st, &trusted, &me, chmod(0o4755))), 0o4755, "kept where allowed");
    assert_eq!(mode_of(run(&mut st, &trusted, &me, chmod(0o2755))), 0o2755, "the owner is in the group");
    let g = mk(&mut st, ROOT_INO, "g", FileType::Regular, 0o755, 1000, 50);
    let chmod_g = setattr(g, SetAttr { mode: Some(0o2755), ..Default::default() });
    assert_eq!(mode_of(run(&mut st, &trusted, &me, chmod_g.clone())), 0o755, "not in group 50: setgid goes");
    assert_eq!(mode_of(run(&mut st, &trusted, &Caller::ROOT, chmod_g)), 0o2755);
    // A file made in a set-group-ID directory of a group its maker is not in.
    let sgid = mk(&mut st, ROOT_INO, "sgid", FileType::Directory, 0o2777, 0, 50);
    let op = create(sgid, "f", FileType::Regular, 0o2755, Default::default());
    assert_eq!(mode_of(run(&mut st, &trusted, &me, op.clone())), 0o755);
    let member = Caller { uid: 1000, gid: 1000, groups: vec![50] };
    assert_eq!(mode_of(run(&mut st, &trusted, &member, op)), 0o2755);
}

#[test]
fn chmod_is_the_owners_and_chown_roots() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o666, 1000, 1000);
    let set = |s: SetAttr| setattr(f, s);
    let stranger = user(1001);
    assert_eq!(t(&mut st, &stranger, set(SetAttr { mode: Some(0o777), ..Default::default() })), Err(1));
    assert!(t(&mut st, &user(1000), set(SetAttr { mode: Some(0o777), ..Default::default() })).is_ok());
    assert!(t(&mut st, &Caller::ROOT, set(SetAttr { mode: Some(0o777), ..Default::default() })).is_ok());
    let to_root = set(SetAttr { uid: Some(0), ..Default::default() });
    assert_eq!(t(&mut st, &user(1000), to_root.clone()), Err(1), "give a file away to root");
    assert_eq!(t(&mut st, &stranger, set(SetAttr { uid: Some(1001), ..Default::default() })), Err(1), "take it");
    assert!(t(&mut st, &user(1000), set(SetAttr { uid: Some(1000), ..Default::default() })).is_ok(), "no change");
    assert!(t(&mut st, &Caller::ROOT, to_root).is_ok());
    let chgrp = |gid| set(SetAttr { gid: Some(gid), ..Default::default() });
    assert_eq!(t(&mut st, &user(1000), chgrp(0)), Err(1), "a group the owner is not in");
    let member = Caller { uid: 1000, gid: 1000, groups: vec![50] };
    assert!(t(&mut st, &member, chgrp(50)).is_ok(), "one they are in");
    assert_eq!(t(&mut st, &Caller { uid: 1001, gid: 1001, groups: vec![50] }, chgrp(50)), Err(1), "not the owner");
    assert!(t(&mut st, &Caller::ROOT, chgrp(0)).is_ok());
    // A set-user-ID file changing hands loses the bit (root is trusted with setuid files
    // only where the policy allows them: there it is left to the kernel's own request).
    let s = mk(&mut st, ROOT_INO, "s", FileType::Regular, 0o6755, 1000, 1000);
    let careful = Policy { root_squash: false, ..Policy::joined() };
    let chown = setattr(s, SetAttr { uid: Some(7), ..Default::default() });
    let Op::SetAttr { set: after, .. } = ok(run(&mut st, &careful, &Caller::ROOT, chown)) else { panic!() };
    assert_eq!(after.mode, Some(0o755));
}

#[test]
fn truncation_needs_write_or_ownership() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o444, 1000, 1000);
    let trunc = setattr(f, SetAttr { size_bytes: Some(0), ..Default::default() });
    assert_eq!(t(&mut st, &user(1001), trunc.clone()), Err(13));
    assert!(t(&mut st, &user(1000), trunc.clone()).is_ok(), "open(O_CREAT|O_TRUNC, 0444) then ftruncate");
    assert!(t(&mut st, &Caller::ROOT, trunc).is_ok());
    let g = mk(&mut st, ROOT_INO, "g", FileType::Regular, 0o666, 1000, 1000);
    assert!(t(&mut st, &user(1001), setattr(g, SetAttr { size_bytes: Some(0), ..Default::default() })).is_ok());
}

#[test]
fn given_times_are_the_owners_and_now_any_writers() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o666, 1000, 1000);
    let y1970 = SetTime::At(Time { sec: 0, nsec: 0 });
    let times = |a, m| setattr(f, SetAttr { atime: a, mtime: m, ..Default::default() });
    assert_eq!(t(&mut st, &user(1001), times(Some(y1970), Some(y1970))), Err(1), "utimes to 1970 by a writer");
    assert!(t(&mut st, &user(1000), times(Some(y1970), Some(y1970))).is_ok(), "by the owner");
    assert!(t(&mut st, &Caller::ROOT, times(None, Some(y1970))).is_ok());
    assert!(t(&mut st, &user(1001), times(Some(SetTime::Now), Some(SetTime::Now))).is_ok(), "touch by a writer");
    let near = |d: i64| SetTime::At(Time { sec: NOW.sec + d, nsec: 5 });
    assert!(t(&mut st, &user(1001), times(None, Some(near(10)))).is_ok(), "a write-back's stamp");
    assert!(t(&mut st, &user(1001), times(Some(near(-10)), Some(near(-10)))).is_ok());
    assert_eq!(t(&mut st, &user(1001), times(None, Some(near(120)))), Err(1), "too far to be now");
    // Near the client's clock, when that is itself near the server's.
    let client = Some(Time { sec: NOW.sec + 50, nsec: 0 });
    let op = times(None, Some(near(100)));
    assert!(run_at(&mut st, &Policy::trusted(), &user(1001), op.clone(), client).is_ok());
    let wild = Some(Time { sec: NOW.sec + 3600, nsec: 0 });
    assert_eq!(run_at(&mut st, &Policy::trusted(), &user(1001), op, wild), Err(1), "a client clock far off counts not");
    let ro = mk(&mut st, ROOT_INO, "ro", FileType::Regular, 0o644, 1000, 1000);
    let ro_times = |a, m| setattr(ro, SetAttr { atime: a, mtime: m, ..Default::default() });
    assert_eq!(t(&mut st, &user(1001), ro_times(Some(SetTime::Now), Some(SetTime::Now))), Err(13), "no write");
    assert!(t(&mut st, &user(1001), ro_times(Some(near(1)), None)).is_ok(), "reading sets the access time");
    let closed = mk(&mut st, ROOT_INO, "closed", FileType::Regular, 0o600, 1000, 1000);
    let op = setattr(closed, SetAttr { atime: Some(SetTime::Now), ..Default::default() });
    assert_eq!(t(&mut st, &user(1001), op), Err(13));
}

#[test]
fn a_change_time_far_from_now_becomes_now() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o666, 1000, 1000);
    let ctime = |c: Time| setattr(f, SetAttr { ctime: Some(c), ..Default::default() });
    let ctime_of = |r: Result<Op, i32>| match ok(r) {
        Op::SetAttr { set, .. } => set.ctime,
        other => panic!("{other:?}"),
    };
    let near = Time { sec: NOW.sec - 30, nsec: 1 };
    assert_eq!(ctime_of(t(&mut st, &user(1001), ctime(near))), Some(near), "a write-back's own stamp stays");
    assert_eq!(ctime_of(t(&mut st, &Caller::ROOT, ctime(Time { sec: 0, nsec: 0 }))), Some(NOW), "even root's");
    let hostile = Time { sec: i64::MAX, nsec: u32::MAX };
    assert_eq!(ctime_of(t(&mut st, &user(1001), ctime(hostile))), Some(NOW));
}

#[test]
fn a_writer_outside_the_group_may_drop_setgid_but_change_nothing_else() {
    let mut st = store();
    let f = mk(&mut st, ROOT_INO, "f", FileType::Regular, 0o2777, 0, 1003);
    let nobody = user(65534);
    let mode = |m| setattr(f, SetAttr { mode: Some(m), ..Default::default() });
    assert!(t(&mut st, &nobody, mode(0o777)).is_ok(), "the kernel's kill-priv after a write");
    assert_eq!(t(&mut st, &nobody, mode(0o775)), Err(1), "anything more is a chmod");
    assert_eq!(t(&mut st, &nobody, mode(0o2777)), Err(1), "as is setting the bits it has");
    let suid = mk(&mut st, ROOT_INO, "s", FileType::Regular, 0o6666, 0, 65534);
    let only_suid = setattr(suid, SetAttr { mode: Some(0o2666), ..Default::default() });
    assert!(t(&mut st, &nobody, only_suid).is_ok(), "a member of the group keeps setgid: only setuid goes");
    let closed = mk(&mut st, ROOT_INO, "g", FileType::Regular, 0o2775, 0, 1003);
    let kill = setattr(closed, SetAttr { mode: Some(0o775), ..Default::default() });
    // The writer may hold a descriptor opened by someone else: Linux drops the bits for
    // it whatever its permissions; its session holds the file open for writing.
    assert!(through(&mut st, &nobody, p::OPEN_WRITE, kill).is_ok(), "e2e acl seed 3882497651");
}

#[test]
fn only_a_writer_the_owner_or_root_may_drop_setuid_and_setgid() {
    let mut st = store();
    // Root's setuid and setgid program, which others may run but not write.
    let tool = mk(&mut st, ROOT_INO, "tool", FileType::Regular, 0o6755, 0, 0);
    let drop_both = || setattr(tool, SetAttr { mode: Some(0o755), ..Default::default() });
    let drop_suid = || setattr(tool, SetAttr { mode: Some(0o2755), ..Default::default() });
    let stranger = user(1001);
    for op in [drop_both(), drop_suid()] {
        assert_eq!(t(&mut st, &stranger, op.clone()), Err(1), "{op:?} by one who may not write it");
        let joined = Policy::joined();
        let squashed = run(&mut st, &joined, &joined.map(&Caller::ROOT), op.clone());
        assert_eq!(squashed, Err(1), "{op:?} by a squashed root, who is nobody");
        assert_eq!(through(&mut st, &stranger, p::OPEN_READ | p::OPEN_EXEC, op.clone()), Err(1), "read handles");
        assert!(through(&mut st, &stranger, p::OPEN_WRITE, op.clone()).is_ok(), "{op:?} through a write handle");
        assert!(t(&mut st, &Caller::ROOT, op.clone()).is_ok(), "{op:?} by root");
    }
    assert_eq!(st.getattr(tool).expect("tool").mode & 0o7777, 0o6755, "the checks changed nothing");
    // Its owner may; so may whoever its bits (or its group's) let write it.
    let owned = mk(&mut st, ROOT_INO, "owned", FileType::Regular, 0o6755, 1001, 1001);
    assert!(t(&mut st, &stranger, setattr(owned, SetAttr { mode: Some(0o755), ..Default::default() })).is_ok());
    let shared = mk(&mut st, ROOT_INO, "shared", FileType::Regular, 0o6775, 0, 50);
    let member = Caller { uid: 1001, gid: 1001, groups: vec![50] };
    let drop_shared = setattr(shared, SetAttr { mode: Some(0o2775), ..Default::default() });
    assert!(t(&mut st, &member, drop_shared.clone()).is_ok(), "a member of the writing group");
    assert_eq!(t(&mut st, &stranger, drop_shared), Err(1), "not a member");
}
