use super::merge::{MAX_MERGED_BYTES, MAX_MERGED_OPS};
use super::*;

/// A writeback submission whose answer names its id.
fn writeback(id: u64, ops: Vec<p::Op>, sec: i64) -> Call<u64> {
    Call::writeback(id, ops, p::Time { sec, nsec: 0 }, Instant::now(), id)
}

/// Answers `call` with `results`; each part's (id, results).
fn answer(call: Call<u64>, results: Results) -> Vec<(u64, Results)> {
    let mut events = VecDeque::new();
    call.reply.send(Ok(results), &mut events);
    events
        .into_iter()
        .map(|e| match e {
            Event::Answer(id, r) => (id, r.expect("answered")),
            _ => panic!("only answers"),
        })
        .collect()
}

fn attr_op(ino: u64) -> p::Op {
    p::Op::GetAttr { ino }
}

#[test]
fn consecutive_writeback_merges_with_clocks_and_splits_its_results() {
    let mut m = Merger::new();
    assert!(m.offer(writeback(1, vec![attr_op(10)], 5)).is_none());
    assert!(m.offer(writeback(2, vec![attr_op(20), attr_op(21)], 5)).is_none());
    assert!(m.offer(writeback(3, vec![attr_op(30)], 6)).is_none());
    // A caller that waits is never merged (it would overtake or be overtaken).
    let waiting = Call::wait(4, vec![attr_op(40)], Instant::now(), 4);
    assert!(m.offer(waiting).is_some());
    let merged = m.flush().expect("one merged request");
    assert!(m.flush().is_none());
    assert_eq!(merged.id, 1, "it goes out under the first submission's id");
    assert_eq!(merged.time, Some(p::Time { sec: 5, nsec: 0 }));
    assert_eq!(
        merged.ops,
        vec![attr_op(10), attr_op(20), attr_op(21), p::Op::At { time: p::Time { sec: 6, nsec: 0 } }, attr_op(30)],
        "the third submission's clock differs: an At sets it"
    );
    let results: Results = (0..5).map(|i| Ok(p::Reply::Names(vec![vec![i]]))).collect();
    let got = answer(merged, results);
    let names = |r: &Results| -> Vec<u8> {
        r.iter().map(|x| if let Ok(p::Reply::Names(n)) = x { n[0][0] } else { 99 }).collect()
    };
    assert_eq!(got.len(), 3);
    assert_eq!((got[0].0, names(&got[0].1)), (1, vec![0]));
    assert_eq!((got[1].0, names(&got[1].1)), (2, vec![1, 2]));
    assert_eq!((got[2].0, names(&got[2].1)), (3, vec![4]), "the At's own result is skipped");
}

#[test]
fn writeback_of_different_callers_goes_in_different_requests() {
    let mut m = Merger::new();
    let alice = p::Caller { uid: 1000, gid: 1000, groups: vec![27] };
    let bob = p::Caller { uid: 1001, gid: 1001, groups: Vec::new() };
    assert!(m.offer(writeback(1, vec![attr_op(10)], 5).with_caller(alice.clone())).is_none());
    assert!(m.offer(writeback(2, vec![attr_op(11)], 5).with_caller(alice.clone())).is_none());
    let back = m.offer(writeback(3, vec![attr_op(12)], 5).with_caller(bob.clone())).expect("not merged");
    let first = m.flush().expect("alice's");
    assert_eq!((first.ops.len(), &first.caller), (2, &alice));
    assert!(m.offer(back).is_none());
    let second = m.flush().expect("bob's");
    assert_eq!((second.id, &second.request().caller), (3, &bob), "the request carries its caller");
}

fn cred() -> p::Cred {
    p::Cred { uid: 0, gid: 0, umask: 0 }
}

fn create_at(ino: u64, parent: u64, name: &str, kind: p::FileType) -> p::Op {
    let name = name.as_bytes().to_vec();
    p::Op::CreateAt { ino, generation: 1, parent, name, kind, mode: 0o755, rdev: 0, cred: cred() }
}

fn unlink(parent: u64, name: &str) -> p::Op {
    p::Op::Unlink { parent, name: name.as_bytes().to_vec() }
}

fn rmdir(parent: u64, name: &str) -> p::Op {
    p::Op::Rmdir { parent, name: name.as_bytes().to_vec() }
}

fn at(sec: i64) -> p::Op {
    p::Op::At { time: p::Time { sec, nsec: 0 } }
}

fn touch_dir(ino: u64) -> p::Op {
    p::Op::SetAttr { ino, set: p::SetAttr { mtime: Some(p::SetTime::Now), ..Default::default() } }
}

/// Offers each submission (ops, clock) to one merger; the merged request's ops.
fn merged(subs: Vec<(Vec<p::Op>, i64)>) -> (Vec<p::Op>, Vec<(u64, Results)>, usize) {
    let mut m = Merger::new();
    let n = subs.len();
    for (i, (ops, sec)) in subs.into_iter().enumerate() {
        assert!(m.offer(writeback(i as u64 + 1, ops, sec)).is_none());
    }
    let call = m.flush().expect("a batch");
    let ops = call.ops.clone();
    let results: Results = ops.iter().map(|_| Ok(p::Reply::Done)).collect();
    (ops, answer(call, results), n)
}

fn atime(ino: u64) -> p::Op {
    p::Op::SetAttr { ino, set: p::SetAttr { atime: Some(p::SetTime::Now), ..Default::default() } }
}

#[test]
fn an_open_and_its_release_in_one_batch_never_reach_the_server() {
    // cat of two files: each opened and read under the caller's credentials, an access
    // time moved, then released by nobody (the kernel's release has no caller).
    let alice = p::Caller { uid: 1000, gid: 1000, groups: vec![27] };
    let mut m = Merger::new();
    let subs = vec![
        (vec![p::Op::Open { ino: 20, handle: 4, access: p::OPEN_READ }], 5, alice.clone()),
        (vec![atime(20)], 5, alice.clone()),
        (vec![p::Op::Release { ino: 20, handle: 4 }], 6, p::Caller::ROOT),
        (vec![p::Op::Open { ino: 21, handle: 6, access: 0 }], 6, alice.clone()),
        (vec![p::Op::Release { ino: 21, handle: 6 }], 7, p::Caller::ROOT),
    ];
    let n = subs.len();
    for (i, (ops, sec, caller)) in subs.into_iter().enumerate() {
        assert!(m.offer(writeback(i as u64 + 1, ops, sec).with_caller(caller)).is_none(), "submission {i} joins");
    }
    let call = m.flush().expect("a batch");
    assert_eq!(call.caller, alice);
    assert_eq!(call.ops, vec![at(5), atime(20), at(6), at(6), at(6), at(7), at(7)], "only the access time is left");
    let results: Results = call.ops.iter().map(|_| Ok(p::Reply::Done)).collect();
    let got = answer(call, results);
    assert_eq!(got.len(), n, "every completion still runs");
    assert!(got.iter().all(|(_, r)| r.len() == 1));
}

fn setattr(ino: u64, set: p::SetAttr) -> p::Op {
    p::Op::SetAttr { ino, set }
}

#[test]
fn tars_times_owner_and_mode_of_a_file_go_as_one_setattr() {
    let t = |sec| p::SetTime::At(p::Time { sec, nsec: 0 });
    let times = p::SetAttr { mtime: Some(t(1_000)), ..Default::default() };
    let owner = p::SetAttr { uid: Some(0), gid: Some(0), ..Default::default() };
    let mode = p::SetAttr { mode: Some(0o4755), ..Default::default() };
    let (ops, got, n) = merged(vec![
        (vec![p::Op::Write { ino: 40, offset: 0, data: vec![1; 5] }], 5),
        (vec![setattr(40, times)], 6),
        (vec![setattr(40, owner)], 7),
        (vec![setattr(40, mode)], 7),
    ]);
    let joined =
        p::SetAttr { mode: Some(0o4755), uid: Some(0), gid: Some(0), mtime: Some(t(1_000)), ..Default::default() };
    assert_eq!(
        ops,
        vec![p::Op::Write { ino: 40, offset: 0, data: vec![1; 5] }, at(7), setattr(40, joined)],
        "one setattr, at the last one's clock"
    );
    assert_eq!(got.len(), n, "every completion still runs");
    assert_eq!(got.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), vec![1, 1, 0, 0], "the first gets the answer");
}

#[test]
fn setattrs_that_would_come_out_differently_joined_stay_apart() {
    let mode = p::SetAttr { mode: Some(0o4755), ..Default::default() };
    let owner = p::SetAttr { uid: Some(7), ..Default::default() };
    let group = p::SetAttr { gid: Some(7), ..Default::default() };
    let size = p::SetAttr { size_bytes: Some(3), ..Default::default() };
    let touch = p::SetAttr { mtime: Some(p::SetTime::Now), ..Default::default() };
    let cases = [
        // A change of hands after the mode drops its set-user-ID bit.
        (vec![(setattr(50, mode.clone()), 5), (setattr(50, owner.clone()), 5)], 2),
        (vec![(setattr(50, mode.clone()), 5), (setattr(50, group.clone()), 5)], 2),
        // Two changes of hands: the one in between may drop the set-user-ID bit.
        (vec![(setattr(50, group), 5), (setattr(50, owner.clone()), 5)], 2),
        // A size moves data and times.
        (vec![(setattr(50, size.clone()), 5), (setattr(50, mode.clone()), 5)], 2),
        (vec![(setattr(50, mode.clone()), 5), (setattr(50, size), 5)], 2),
        // "Now" under the first clock, joined at the second's.
        (vec![(setattr(50, touch.clone()), 5), (setattr(50, mode.clone()), 6)], 3),
        // Another inode.
        (vec![(setattr(50, owner.clone()), 5), (setattr(51, mode.clone()), 5)], 2),
    ];
    for (subs, len) in cases {
        let subs: Vec<(Vec<p::Op>, i64)> = subs.into_iter().map(|(op, sec)| (vec![op], sec)).collect();
        let (ops, _, _) = merged(subs.clone());
        assert_eq!(ops.len(), len, "not joined: {subs:?} -> {ops:?}");
    }
    // "Now" under one clock joins: the server's now is that clock.
    let (ops, _, _) = merged(vec![(vec![setattr(50, touch)], 5), (vec![setattr(50, mode)], 5)]);
    assert_eq!(ops.len(), 1);
}

#[test]
fn an_open_stays_when_a_name_may_go_or_a_lock_is_taken_before_its_release() {
    let open = p::Op::Open { ino: 30, handle: 9, access: p::OPEN_READ };
    let release = p::Op::Release { ino: 30, handle: 9 };
    let lock =
        p::Op::SetLock { ino: 30, owner: 3, start: 0, end: u64::MAX, kind: p::LockKind::Read, flock: true, pid: 1 };
    let rename = p::Op::Rename { parent: 1, name: b"a".to_vec(), new_parent: 1, new_name: b"b".to_vec(), flags: 0 };
    for between in [unlink(1, "f"), rmdir(1, "d"), rename, lock] {
        let (ops, _, _) = merged(vec![(vec![open.clone()], 5), (vec![between.clone()], 5), (vec![release.clone()], 5)]);
        assert_eq!(ops, vec![open.clone(), between.clone(), release.clone()], "kept around {between:?}");
    }
    // Another handle's release, or a release whose open went in an earlier request.
    let other = p::Op::Release { ino: 30, handle: 10 };
    let (ops, _, _) = merged(vec![(vec![open.clone()], 5), (vec![other.clone()], 5)]);
    assert_eq!(ops, vec![open.clone(), other]);
    let (ops, _, _) = merged(vec![(vec![atime(30)], 5), (vec![release.clone()], 5)]);
    assert_eq!(ops, vec![atime(30), release]);
}

#[test]
fn a_mkdir_and_its_rmdir_in_one_batch_never_reach_the_server() {
    let (ops, got, n) = merged(vec![
        (vec![create_at(100, 1, "d", p::FileType::Directory)], 5),
        (
            vec![
                create_at(101, 100, "f", p::FileType::Regular),
                p::Op::Open { ino: 101, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE },
            ],
            5,
        ),
        (vec![p::Op::Write { ino: 101, offset: 0, data: vec![1; 10] }], 6),
        (vec![p::Op::Release { ino: 101, handle: 1 }], 6),
        (vec![unlink(100, "f")], 7),
        (vec![rmdir(1, "d")], 8),
    ]);
    assert_eq!(
        ops,
        vec![at(5), at(5), at(5), at(6), at(6), at(6), at(7), at(7), at(8), touch_dir(1)],
        "all that is left is the parent's new mtime, at the rmdir's clock"
    );
    assert_eq!(got.len(), n, "every completion still runs");
    assert_eq!(got.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), vec![1, 2, 1, 1, 1, 1]);
}

#[test]
fn contiguous_writes_of_one_inode_join_and_run_at_the_last_clock() {
    let write = |ino, offset, data: &[u8]| p::Op::Write { ino, offset, data: data.to_vec() };
    // Appends of uneven sizes, then one that leaves a gap, one to another inode, and
    // one continuing after a different op: only the first run joins.
    let (ops, got, n) = merged(vec![
        (vec![write(7, 0, b"ab")], 5),
        (vec![write(7, 2, b"cde")], 5),
        (vec![write(7, 5, b"f")], 6),
        (vec![write(7, 6, b"ghij")], 7),
        (vec![write(7, 20, b"gap")], 7),
        (vec![write(8, 23, b"other")], 7),
        (vec![touch_dir(1)], 7),
        (vec![write(8, 28, b"after")], 7),
    ]);
    assert_eq!(
        ops,
        vec![
            write(7, 0, b"abcdefghij"),
            write(7, 20, b"gap"),
            write(8, 23, b"other"),
            touch_dir(1),
            write(8, 28, b"after")
        ],
        "one write (the request's clock, alone before it: see below), then the rest at 7"
    );
    assert_eq!(got.len(), n, "every completion still runs");
    assert_eq!(got.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), vec![1, 0, 0, 0, 1, 1, 1, 1]);
    // A write alone in the batch takes the later clock as the request's own.
    let mut m = Merger::new();
    assert!(m.offer(writeback(1, vec![write(7, 0, b"a")], 5)).is_none());
    assert!(m.offer(writeback(2, vec![write(7, 1, b"b")], 9)).is_none());
    let call = m.flush().expect("a batch");
    assert_eq!((call.ops, call.time), (vec![write(7, 0, b"ab")], Some(p::Time { sec: 9, nsec: 0 })));
}

#[test]
fn a_pair_is_kept_when_anything_could_still_tell() {
    // An open with no release: a descriptor may still reach the unlinked file.
    let (ops, ..) = merged(vec![
        (
            vec![
                create_at(100, 1, "f", p::FileType::Regular),
                p::Op::Open { ino: 100, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE },
            ],
            5,
        ),
        (vec![unlink(1, "f")], 5),
    ]);
    assert!(ops.contains(&unlink(1, "f")));
    // A rename in between: the name may not be the created inode's any more.
    let rename = p::Op::Rename { parent: 1, name: b"g".to_vec(), new_parent: 1, new_name: b"f".to_vec(), flags: 0 };
    let (ops, ..) = merged(vec![
        (vec![create_at(100, 1, "f", p::FileType::Regular)], 5),
        (vec![rename], 5),
        (vec![unlink(1, "f")], 5),
    ]);
    assert!(ops.contains(&unlink(1, "f")));
    // Something made inside the directory is still there (and a read of the inode).
    let (ops, ..) = merged(vec![
        (vec![create_at(100, 1, "d", p::FileType::Directory)], 5),
        (vec![create_at(101, 100, "x", p::FileType::Regular)], 5),
        (vec![rmdir(1, "d")], 5),
    ]);
    assert!(ops.contains(&rmdir(1, "d")) && ops.contains(&create_at(100, 1, "d", p::FileType::Directory)));
    // The create already went out (not in this batch): the removal is sent as it is.
    let (ops, ..) = merged(vec![(vec![p::Op::GetAttr { ino: 7 }], 5), (vec![unlink(1, "f")], 5)]);
    assert_eq!(ops, vec![p::Op::GetAttr { ino: 7 }, unlink(1, "f")]);
    // A kind mismatch is the server's to refuse.
    let (ops, ..) = merged(vec![(vec![create_at(100, 1, "f", p::FileType::Regular)], 5), (vec![rmdir(1, "f")], 5)]);
    assert!(ops.contains(&rmdir(1, "f")));
}

#[test]
fn merged_requests_stay_within_their_limits() {
    let mut m = Merger::new();
    let mut handed_back = 0;
    for i in 0..2 * MAX_MERGED_OPS as u64 {
        if m.offer(writeback(i + 1, vec![attr_op(i)], 1)).is_some() {
            handed_back += 1;
            break;
        }
    }
    assert_eq!(handed_back, 1, "the batch is full at {MAX_MERGED_OPS} operations");
    assert_eq!(m.flush().expect("batch").ops.len(), MAX_MERGED_OPS);
    let big = p::Op::Write { ino: 1, offset: 0, data: vec![0; MAX_MERGED_BYTES] };
    assert!(m.offer(writeback(9, vec![big], 1)).is_some(), "a large write goes alone");
}

#[test]
fn opens_and_reads_outlive_a_fenced_session_and_changes_do_not() {
    let open = p::Op::Open { ino: 5, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE };
    let read = p::Op::Read { ino: 5, offset: 0, len: 10 };
    assert!(survives_fencing(&writeback(1, vec![open.clone()], 1)), "an open sent behind its answer");
    assert!(survives_fencing(&writeback(2, vec![p::Op::Release { ino: 5, handle: 9 }], 1)));
    assert!(survives_fencing(&writeback(3, vec![read, open.clone()], 1)));
    let touch = p::Op::SetAttr { ino: 5, set: p::SetAttr { atime: Some(p::SetTime::Now), ..Default::default() } };
    assert!(!survives_fencing(&writeback(4, vec![open, touch], 1)), "a change goes with it");
    assert!(survives_fencing(&writeback(6, vec![attr_op(5)], 1)));
    assert!(!survives_fencing(&writeback(5, vec![p::Op::Reassert { ino: 5, exclusive: true }], 1)));
}

/// A connection driven by hand: what it writes is decoded, what the "server" says is
/// encoded and fed to it, on a clock the test moves.
struct Harness {
    c: Connection<u64>,
    t0: Instant,
    now: Instant,
    answers: Vec<(u64, Result<Results, ClientError>)>,
    recalls: Vec<Recall>,
    identities: Vec<p::IdentityMap>,
    /// Size of the pieces the next frame arrives in (each frame a different one).
    piece: usize,
}

const FSID: [u8; 16] = [7; 16];

fn welcome(resumed: bool, durable_seq: Option<u64>, fenced: bool) -> ServerMessage {
    ServerMessage::Welcome(p::Welcome {
        version: p::PROTOCOL_VERSION,
        session: p::SessionToken { id: 1, secret: 2 },
        resumed,
        durable_seq,
        durable_holes: Vec::new(),
        fsid: FSID,
        fenced,
        noatime: false,
        identity: p::IdentityMap::default(),
        server_release: "crest test".into(),
    })
}

/// The version of the hello the client wrote last (after `connected`).
fn hello_version(h: &mut Harness) -> u32 {
    match h.sent().first() {
        Some(ClientMessage::Hello(hello)) => hello.version,
        other => panic!("no hello: {other:?}"),
    }
}

#[test]
fn an_older_server_is_said_hello_to_in_its_version_until_the_connection_is_lost() {
    let mut h = Harness::new();
    let (t, old) = (h.at(0), p::OLDEST_PROTOCOL_VERSION);
    h.c.connecting(t);
    h.c.connected(t);
    assert_eq!(hello_version(&mut h), p::PROTOCOL_VERSION, "the newest first");
    h.hear(ServerMessage::Refused { reason: format!("this server speaks {old}"), version: old });
    assert_eq!(h.c.state(), State::Away, "not failed: the driver connects again");
    h.call(1, vec![attr_op(1)]);
    h.c.connecting(t);
    h.c.connected(t);
    assert_eq!(hello_version(&mut h), old, "then the server's");
    let ServerMessage::Welcome(mut w) = welcome(false, None, false) else { unreachable!() };
    w.version = old;
    h.hear(ServerMessage::Welcome(w.clone()));
    assert_eq!(h.c.state(), State::Open);
    assert_eq!(Harness::ids(&h.sent()), vec![1], "what waited goes once the welcome came");
    // A reconnect (no open connection lost) stays at the version that worked ...
    h.c.handshake_timeout();
    h.c.connecting(t);
    h.c.connected(t);
    assert_eq!(hello_version(&mut h), old);
    h.hear(ServerMessage::Welcome(w));
    // ... and once an open connection is lost (the server may come back upgraded), the
    // newest again.
    h.c.connection_lost("test");
    h.c.connecting(t);
    h.c.connected(t);
    assert_eq!(hello_version(&mut h), p::PROTOCOL_VERSION);
}

#[test]
fn the_view_says_where_the_connection_stands_and_counts_reconnects() {
    let mut h = Harness::new();
    assert_eq!(h.c.view().state, "away");
    h.connect(welcome(false, None, false));
    let v = h.c.view();
    assert_eq!((v.state, v.session, v.protocol, v.reconnects), ("open", Some(1), p::PROTOCOL_VERSION, 0));
    assert_eq!(v.server_release, "crest test");
    h.call(1, vec![attr_op(1)]);
    assert_eq!(h.c.view().waiting, 1);
    h.c.connection_lost("test");
    assert_eq!(h.c.view().state, "away");
    h.connect(welcome(true, None, false));
    assert_eq!((h.c.view().state, h.c.view().reconnects), ("open", 1));
}

#[test]
fn a_welcome_in_a_version_the_client_did_not_offer_ends_the_mount() {
    let mut h = Harness::new();
    let t = h.at(0);
    h.c.connecting(t);
    h.c.connected(t);
    h.sent();
    let ServerMessage::Welcome(mut w) = welcome(false, None, false) else { unreachable!() };
    w.version = p::OLDEST_PROTOCOL_VERSION - 1;
    let mut bytes = Vec::new();
    p::encode_frame(&ServerMessage::Welcome(w), &mut bytes).expect("encode");
    h.c.handle_bytes(t, &bytes);
    assert_eq!(h.c.state(), State::Closed);
    match h.c.poll_event() {
        Some(Event::Ready(r)) => {
            assert!(
                matches!(&r, Err(ClientError::Refused { reason, .. }) if reason.contains("does not speak")),
                "{r:?}"
            )
        }
        _ => panic!("the mount is not told"),
    }
}

#[test]
fn whom_the_server_takes_callers_for_is_told_at_the_first_welcome_and_when_it_changes() {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    assert_eq!(h.identities, vec![p::IdentityMap::default()], "told before anything else");
    h.c.connection_lost("test");
    h.connect(welcome(true, None, false));
    assert_eq!(h.identities.len(), 1, "a welcome that says the same is not news");
    h.c.connection_lost("test");
    let squash = p::IdentityMap { root_squash: true, anon_uid: 9, anon_gid: 9, ..p::IdentityMap::default() };
    let ServerMessage::Welcome(mut w) = welcome(true, None, false) else { unreachable!() };
    w.identity = squash.clone();
    h.connect(ServerMessage::Welcome(w));
    assert_eq!(h.identities, vec![p::IdentityMap::default(), squash], "an export policy edited meanwhile");
}

fn response(id: u64, n: usize, seq: u64, durable: u64) -> ServerMessage {
    ServerMessage::Response(p::Response { id, results: vec![Ok(p::Reply::Done); n], seq, durable, time: None })
}

impl Harness {
    fn new() -> Harness {
        let t0 = Instant::now();
        let c = Connection::new("test", "t", Arc::new(AtomicU64::new(1000)), RightsHook::default(), t0);
        Harness { c, t0, now: t0, answers: Vec::new(), recalls: Vec::new(), identities: Vec::new(), piece: 1 }
    }

    fn at(&mut self, ms: u64) -> Instant {
        self.now = self.t0 + Duration::from_millis(ms);
        self.now
    }

    /// Connects and takes the welcome `w`; what the client wrote after its hello.
    fn connect(&mut self, w: ServerMessage) -> Vec<ClientMessage> {
        self.c.connecting(self.now);
        self.c.connected(self.now);
        let hello = self.sent();
        assert!(matches!(hello.first(), Some(ClientMessage::Hello(_))), "the hello goes first: {hello:?}");
        self.hear(w);
        self.sent()
    }

    fn hear(&mut self, m: ServerMessage) {
        let mut bytes = Vec::new();
        p::encode_frame(&m, &mut bytes).expect("encode");
        // In pieces of 1 to 13 bytes, another size each frame, as a socket delivers them:
        // a frame's header and body straddle reads.
        self.piece = self.piece % 13 + 1;
        for piece in bytes.chunks(self.piece) {
            self.c.handle_bytes(self.now, piece);
        }
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(e) = self.c.poll_event() {
            match e {
                Event::Answer(id, r) => self.answers.push((id, r)),
                Event::Recall(r) => self.recalls.push(r),
                Event::Ready(r) => assert_eq!(r, Ok(FSID)),
                Event::Identity(m) => self.identities.push(m),
            }
        }
    }

    fn sent(&mut self) -> Vec<ClientMessage> {
        let mut d = FrameDecoder::new();
        d.handle_bytes(&self.c.poll_transmit());
        let mut v = Vec::new();
        while let Some(m) = d.poll_message::<ClientMessage>().expect("a frame the client wrote") {
            v.push(m);
        }
        v
    }

    /// The request ids (and places: none here) the client wrote, with `Replayed` as 0.
    fn ids(msgs: &[ClientMessage]) -> Vec<u64> {
        msgs.iter()
            .filter_map(|m| match m {
                ClientMessage::Request(r) => Some(r.id),
                ClientMessage::Replayed => Some(0),
                _ => None,
            })
            .collect()
    }

    fn call(&mut self, id: u64, ops: Vec<p::Op>) {
        self.c.submit(Call::wait(id, ops, self.now, id), self.now);
        self.c.end_burst();
    }
}

fn change(ino: u64) -> p::Op {
    touch_dir(ino)
}

/// Five changes placed 1..=5, the first two answered (the second durable through 1), a
/// read waiting, the connection broken; then a restarted server that kept `through`.
fn restart_after(through: u64) -> (Harness, Vec<u64>) {
    let mut h = Harness::new();
    assert_eq!(Harness::ids(&h.connect(welcome(false, None, false))), Vec::<u64>::new());
    for id in 1..=5 {
        h.call(id, vec![change(id)]);
    }
    assert_eq!(Harness::ids(&h.sent()), vec![1, 2, 3, 4, 5]);
    h.hear(response(1, 1, 1, 0));
    h.hear(response(2, 1, 2, 1));
    assert_eq!(h.answers.len(), 2);
    h.call(6, vec![attr_op(6)]);
    h.c.connection_lost("test");
    assert_eq!(h.c.state(), State::Away);
    let again = h.connect(welcome(true, Some(through), false));
    let ids = Harness::ids(&again);
    (h, ids)
}

#[test]
fn after_a_restart_lost_changes_replay_first_and_kept_ones_are_not_sent_again() {
    // Kept through 3: change 2 is durable, 3 ran and was kept (its caller hears its
    // result is lost; not sent again), 4 and 5 go after `Replayed` as new work, then the
    // read.
    let (h, ids) = restart_after(3);
    assert_eq!(ids, vec![0, 4, 5, 6], "Replayed, then the rest in order");
    let lost: Vec<_> = h.answers.iter().filter(|(id, _)| *id == 3).collect();
    assert!(
        matches!(lost.as_slice(), [(3, Err(ClientError::ReplyLost { .. }))]),
        "the kept, unanswered change's caller hears its result is lost: {lost:?}"
    );
    assert_eq!((h.c.pending[&4].pos, h.c.pending[&5].pos, h.c.pending[&6].pos), (Some(4), Some(5), None));
    // Kept through 1: change 2 was acknowledged and lost: replayed in place 2 before
    // `Replayed`; the unanswered ones follow in their order, in the places after it.
    let (h, ids) = restart_after(1);
    assert_eq!(ids, vec![2, 0, 3, 4, 5, 6]);
    assert_eq!(h.answers.len(), 2, "nobody else is answered yet");
    assert_eq!((h.c.pending[&3].pos, h.c.pending[&5].pos), (Some(3), Some(5)));
    assert_eq!(h.c.log.replaying.len(), 1);
}

#[test]
fn a_lost_change_is_replayed_at_the_time_it_first_ran() {
    // The server answered change 1 with the time it ran at, then died before committing
    // it: the replay carries that time, so that it comes out as the caller was told.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![change(1)]);
    h.sent();
    let ran = p::Time { sec: 1_234, nsec: 5 };
    h.hear(ServerMessage::Response(p::Response {
        id: 1,
        results: vec![Ok(p::Reply::Done)],
        seq: 1,
        durable: 0,
        time: Some(ran),
    }));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    let replay = again.iter().find_map(|m| match m {
        ClientMessage::Request(r) if r.id == 1 => Some(r.clone()),
        _ => None,
    });
    assert_eq!(replay.map(|r| r.time), Some(Some(ran)), "{again:?}");
}

#[test]
fn a_handle_on_a_file_a_lost_change_made_is_opened_again_right_after_its_replay() {
    // The server made file 9 (answered), the client opened it, and the server died before
    // committing the create: the handle can be opened again only once the create is
    // replayed, and before any later replay, which may need it open.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    let attr = create_file_9(&mut h);
    h.call(2, vec![p::Op::Open { ino: 9, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
    h.sent();
    h.hear(ServerMessage::Response(p::Response {
        id: 2,
        results: vec![Ok(p::Reply::Attr(attr))],
        seq: 0,
        durable: 0,
        time: None,
    }));
    h.call(3, vec![change(9)]);
    h.sent();
    h.hear(response(3, 1, 2, 0));
    let order = |msgs: &[ClientMessage]| -> Vec<String> {
        msgs.iter()
            .map(|m| match m {
                ClientMessage::Request(r) if r.ops.iter().any(|op| matches!(op, p::Op::Open { .. })) => {
                    "open".to_string()
                }
                ClientMessage::Request(r) => format!("{}", r.id),
                ClientMessage::Replayed => "replayed".to_string(),
                other => format!("{other:?}"),
            })
            .collect()
    };
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(order(&again), ["1", "open", "3", "replayed"], "{again:?}");
    // The same on a plain reconnect before anything of it was answered.
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(order(&again), ["1", "open", "3", "replayed"], "{again:?}");
}

#[test]
fn an_open_sent_behind_goes_again_before_the_changes_made_after_it() {
    // The mount answered an open itself and sent it behind, then its process unlinked the
    // file; neither reached the server. On the reconnect the open must go first: the
    // unlink would otherwise destroy the file the process holds open.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    let now = h.now;
    h.c.submit(writeback(1, vec![p::Op::Open { ino: 7, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }], 1), now);
    h.c.end_burst();
    h.call(2, vec![unlink(1, "x")]);
    h.sent();
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![1, 2, 0], "the open, the unlink, Replayed: {again:?}");
}

#[test]
fn an_open_sent_behind_goes_again_before_later_changes_after_a_restart() {
    // The same once a restart has been: changes placed after its `Replayed` go after
    // `Replayed` again on a plain reconnect, and the open sent behind before one of them
    // must still go before it (not with the reads, after them all).
    let (mut h, ids) = restart_after(3);
    assert_eq!(ids, vec![0, 4, 5, 6]);
    h.hear(response(4, 1, 4, 4));
    h.hear(response(5, 1, 5, 5));
    h.hear(response(6, 1, 0, 5));
    let now = h.now;
    h.c.submit(writeback(7, vec![p::Op::Open { ino: 7, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }], 1), now);
    h.c.end_burst();
    h.call(8, vec![unlink(1, "x")]);
    h.sent();
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![0, 7, 8], "Replayed, the open, the unlink: {again:?}");
}

#[test]
fn an_open_sent_behind_before_a_restart_goes_before_replayed_again_on_a_reconnect() {
    // The mount answered an open itself and sent it behind; the server restarted. The
    // open goes before `Replayed`, as writeback does (the file may be an orphan the server
    // holds only for the grace period, which this session's `Replayed` may end). The
    // connection breaks before anything is answered: on the plain reconnect it goes
    // before `Replayed` again.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    let now = h.now;
    let open = p::Op::Open { ino: 7, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE };
    h.c.submit(writeback(1, vec![open], 1), now);
    h.c.end_burst();
    h.sent();
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(Harness::ids(&again), vec![1, 0], "the open, then Replayed: {again:?}");
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![1, 0], "the open, then Replayed: {again:?}");
}

#[test]
fn an_open_unanswered_at_a_restart_goes_again_after_replayed() {
    // Its answer must show every session's replays (the server runs it after the grace
    // period, and holds the file for it as it arrives): sent before `Replayed`, it would
    // run as a replay and show state older than changes other clients completed.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![attr_op(1)]);
    h.call(2, vec![p::Op::Open { ino: 7, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }]);
    h.sent();
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(Harness::ids(&again), vec![0, 1, 2], "Replayed, then the read and the open: {again:?}");
}

#[test]
fn new_work_after_a_restart_stays_behind_replayed_when_the_connection_breaks_again() {
    // Kept through 3: 4 and 5 went after `Replayed` as new work. The connection breaks
    // before anything is answered; on the plain reconnect that follows the server may
    // still be in its grace period: 4 and 5 must not reach it before `Replayed`, or it
    // runs them as replays, ahead of the other sessions' re-asserts.
    let (mut h, ids) = restart_after(3);
    assert_eq!(ids, vec![0, 4, 5, 6]);
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![0, 4, 5, 6], "Replayed, then the new work: {again:?}");
    // Lost acknowledged changes still go before it.
    let (mut h, ids) = restart_after(1);
    assert_eq!(ids, vec![2, 0, 3, 4, 5, 6]);
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![2, 0, 3, 4, 5, 6], "{again:?}");
}

#[test]
fn a_plain_reconnect_resends_changes_in_their_places_with_the_same_ids() {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![change(1)]);
    h.call(2, vec![attr_op(2)]);
    h.call(3, vec![change(3)]);
    h.sent();
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, None, false));
    assert_eq!(Harness::ids(&again), vec![1, 3, 0, 2], "changes by place, Replayed, then the read: {again:?}");
    assert_eq!((h.c.pending[&1].pos, h.c.pending[&3].pos), (Some(1), Some(2)));
}

#[test]
fn fencing_fails_changes_and_writeback_but_reads_go_again_in_the_new_session() {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![change(1)]);
    h.call(2, vec![attr_op(2)]);
    h.c.submit(writeback(3, vec![change(3)], 5), h.now);
    h.c.end_burst();
    h.sent();
    h.at(5);
    h.hear(ServerMessage::Notify(p::Notify::Fenced));
    assert_eq!(h.c.state(), State::Away);
    let mut failed: Vec<u64> =
        h.answers.iter().filter(|(_, r)| matches!(r, Err(ClientError::Fenced { .. }))).map(|(id, _)| *id).collect();
    failed.sort_unstable();
    assert_eq!(failed, vec![1, 3]);
    // Writeback made before the fencing was learnt and handed over only now fails too.
    let before = h.t0 + Duration::from_millis(1);
    h.at(10);
    h.c.submit(Call::writeback(4, vec![change(4)], p::Time { sec: 1, nsec: 0 }, before, 4), h.now);
    h.drain();
    assert!(matches!(h.answers.last(), Some((4, Err(ClientError::Fenced { .. })))));
    let again = h.connect(welcome(false, None, false));
    assert_eq!(Harness::ids(&again), vec![2], "a new session: only the read goes, no Replayed");
}

/// A `Rights` hook that counts how often every right was dropped.
struct Count(std::sync::Mutex<u32>);

impl Rights for Count {
    fn granted_exclusive(&self, _: u64, _: Instant, _: Instant) {}
    fn recalled(&self, _: &[u64], _: Instant) {}
    fn reset(&self, _: Instant) {
        *self.0.lock().expect("lock") += 1;
    }
}

/// A `Rights` hook holding inode 9 exclusively, that records what it is told to drop.
struct HoldsNine(std::sync::Mutex<Vec<u64>>);

impl Rights for HoldsNine {
    fn granted_exclusive(&self, _: u64, _: Instant, _: Instant) {}
    fn recalled(&self, inodes: &[u64], _: Instant) {
        self.0.lock().expect("lock").extend(inodes);
    }
    fn reset(&self, _: Instant) {}
    fn held(&self, _: Instant) -> Vec<(u64, bool)> {
        vec![(9, true)]
    }
}

#[test]
fn rights_reasserted_after_a_restart_go_when_the_connection_breaks_before_the_answer() {
    // The answer may have been a refusal (another session holds the inode now), lost
    // with the connection; the server, its grace period over, lets others change the
    // inode: what was held under those rights is not answered from any more.
    let mut h = Harness::new();
    let hook = Arc::new(HoldsNine(std::sync::Mutex::new(Vec::new())));
    assert!(h.c.rights.set(hook.clone()).is_ok());
    h.connect(welcome(false, None, false));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    let reassert = p::Op::Reassert { ino: 9, exclusive: true };
    let sent = |msgs: &[ClientMessage]| {
        msgs.iter().any(|m| matches!(m, ClientMessage::Request(r) if r.ops.contains(&reassert)))
    };
    assert!(sent(&again), "{again:?}");
    assert!(hook.0.lock().expect("lock").is_empty(), "held while the server may give them back");
    h.c.connection_lost("test");
    assert_eq!(*hook.0.lock().expect("lock"), vec![9]);
    let again = h.connect(welcome(true, None, false));
    assert!(!sent(&again), "not asked again: {again:?}");
}

#[test]
fn heartbeats_go_when_nothing_else_does_and_the_lease_drops_rights_once() {
    let mut h = Harness::new();
    let count = Arc::new(Count(std::sync::Mutex::new(0)));
    assert!(h.c.rights.set(count.clone()).is_ok());
    h.connect(welcome(false, None, false));
    let due = h.c.poll_timeout();
    assert_eq!(due, h.t0 + HEARTBEAT, "nothing sent since the hello: a heartbeat is due then");
    let t = h.at(HEARTBEAT.as_millis() as u64 - 1);
    h.c.handle_timeout(t);
    assert!(h.sent().is_empty(), "not before");
    let t = h.at(HEARTBEAT.as_millis() as u64);
    h.c.handle_timeout(t);
    assert!(matches!(h.sent().as_slice(), [ClientMessage::Request(r)] if r.id == HEARTBEAT_ID && r.ops.is_empty()));
    // Silence from the server: the lease runs out once, at its deadline.
    let lease_ms = crate::lease::CLIENT_LEASE.as_millis() as u64;
    assert_eq!(h.c.poll_timeout().min(h.t0 + crate::lease::CLIENT_LEASE), h.t0 + HEARTBEAT * 2);
    let t = h.at(lease_ms - 1);
    h.c.handle_timeout(t);
    assert_eq!(*count.0.lock().expect("lock"), 0);
    let t = h.at(lease_ms);
    h.c.handle_timeout(t);
    let t = h.at(lease_ms + 500);
    h.c.handle_timeout(t);
    assert_eq!(*count.0.lock().expect("lock"), 1, "dropped once, when the lease ran out");
}

#[test]
fn a_first_answer_that_is_not_crest_fails_everything_at_once() {
    let mut h = Harness::new();
    h.c.submit(Call::wait(1, vec![attr_op(1)], h.now, 1), h.now);
    h.c.connecting(h.now);
    h.c.connected(h.now);
    h.c.handle_bytes(h.now, b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
    assert_eq!(h.c.state(), State::Closed);
    let mut ready = None;
    while let Some(e) = h.c.poll_event() {
        match e {
            Event::Ready(r) => ready = Some(r),
            Event::Answer(id, r) => h.answers.push((id, r)),
            Event::Recall(_) | Event::Identity(_) => {}
        }
    }
    assert!(matches!(ready, Some(Err(ClientError::NotCrest { .. }))), "{ready:?}");
    assert!(matches!(h.answers.as_slice(), [(1, Err(ClientError::NotCrest { .. }))]));
}

#[test]
fn a_connection_that_opens_but_says_nothing_does_not_renew_the_lease() {
    let mut h = Harness::new();
    let count = Arc::new(Count(std::sync::Mutex::new(0)));
    assert!(h.c.rights.set(count.clone()).is_ok());
    h.connect(welcome(false, None, false));
    let lease_ms = crate::lease::CLIENT_LEASE.as_millis() as u64;
    // The connection breaks; a new one opens (the server is hung, or a proxy answers)
    // just before the lease would run out, and nothing comes on it.
    let t = h.at(lease_ms - 10);
    h.c.connection_lost("test");
    h.c.connecting(t);
    h.c.connected(t);
    let t = h.at(lease_ms);
    h.c.handle_timeout(t);
    assert_eq!(*count.0.lock().expect("lock"), 1, "the rights go when the lease runs out");
}

#[test]
fn a_heartbeat_due_while_a_write_is_stuck_is_queued_once_and_not_again_at_once() {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    // The driver took the bytes and its write blocks (the server stopped reading): the
    // core is woken at its deadline, again and again, without a `poll_transmit`.
    let t = h.at(HEARTBEAT.as_millis() as u64);
    h.c.handle_timeout(t);
    assert!(h.c.poll_timeout() > t, "the next wake-up is later, not at once (a busy loop)");
    for ms in [1, 2, 500, 1_500, 2_200] {
        let t = h.at(HEARTBEAT.as_millis() as u64 + ms);
        h.c.handle_timeout(t);
    }
    let beats = h.sent().into_iter().filter(|m| matches!(m, ClientMessage::Request(r) if r.id == HEARTBEAT_ID));
    assert_eq!(beats.count(), 1, "one heartbeat waits behind the stuck write, not one per wake-up");
}

#[test]
fn a_stranger_answering_a_reconnect_does_not_renew_the_lease() {
    let mut h = Harness::new();
    let count = Arc::new(Count(std::sync::Mutex::new(0)));
    assert!(h.c.rights.set(count.clone()).is_ok());
    h.connect(welcome(false, None, false));
    let lease_ms = crate::lease::CLIENT_LEASE.as_millis() as u64;
    h.c.connection_lost("test");
    // Something answers on the port just before the lease runs out, but not a welcome.
    let t = h.at(lease_ms - 10);
    h.c.connecting(t);
    h.c.connected(t);
    h.c.handle_bytes(t, b"HTTP/1.1 400 Bad Request\r\n\r\n");
    assert_eq!(h.c.state(), State::Away, "retried later: this client has connected before");
    let t = h.at(lease_ms);
    h.c.handle_timeout(t);
    assert_eq!(*count.0.lock().expect("lock"), 1, "the rights go when the lease runs out");
}

#[test]
fn a_refused_reconnect_ends_the_session_and_drops_every_right_at_once() {
    let mut h = Harness::new();
    let count = Arc::new(Count(std::sync::Mutex::new(0)));
    assert!(h.c.rights.set(count.clone()).is_ok());
    h.connect(welcome(false, None, false));
    h.call(1, vec![attr_op(1)]);
    h.c.connection_lost("test");
    let t = h.at(100);
    h.c.connecting(t);
    h.c.connected(t);
    let mut refused = Vec::new();
    let msg = ServerMessage::Refused { reason: "version".into(), version: p::PROTOCOL_VERSION + 1 };
    p::encode_frame(&msg, &mut refused).expect("encode");
    h.c.handle_bytes(t, &refused);
    h.drain();
    assert_eq!(h.c.state(), State::Closed, "nothing more will be sent: the driver stops");
    assert!(matches!(h.answers.as_slice(), [(1, Err(ClientError::Refused { .. }))]));
    // Nobody wakes a closed core again: what the mount held must not outlive it.
    assert_eq!(*count.0.lock().expect("lock"), 1, "every right dropped with the session");
}

#[test]
fn a_handle_released_after_a_lost_change_opens_again_for_its_replay() {
    // The process wrote to file 7 through handle 4 (its last name gone), closed it, and
    // the server died before committing the write: releases are not replayed, so the
    // restart opens the handle again before the replay (the file may be reachable only
    // through it) and releases it behind the replays.
    let run = |durable_at_release: u64, written: u64| {
        let mut h = Harness::new();
        h.connect(welcome(false, None, false));
        h.call(1, vec![p::Op::Open { ino: 7, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
        h.sent();
        h.hear(response(1, 1, 0, 0));
        h.call(2, vec![change(written)]);
        h.sent();
        h.hear(response(2, 1, 1, 0));
        h.call(3, vec![p::Op::Release { ino: 7, handle: 4 }]);
        h.sent();
        h.hear(response(3, 1, 0, durable_at_release));
        h.c.connection_lost("test");
        let again = h.connect(welcome(true, Some(durable_at_release), false));
        handles_order(&again, None)
    };
    assert_eq!(run(0, 7), ["open 7#4", "2", "release 7#4", "replayed"]);
    // Durable before the crash: nothing goes again.
    assert_eq!(run(1, 7), ["replayed"]);
    // The lost change is of another file: the handle stays closed.
    assert_eq!(run(0, 8), ["2", "replayed"]);
}

#[test]
fn a_handle_released_on_a_file_a_lost_change_made_opens_again_after_its_replay() {
    // File 9 was made, opened, written and closed, all lost: the handle can be opened
    // again only once the create is replayed, and must be before the write's replay.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    create_file_9(&mut h);
    h.call(2, vec![p::Op::Open { ino: 9, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
    h.sent();
    h.hear(response(2, 1, 0, 0));
    h.call(3, vec![change(9)]);
    h.sent();
    h.hear(response(3, 1, 2, 0));
    h.call(4, vec![p::Op::Release { ino: 9, handle: 4 }]);
    h.sent();
    h.hear(response(4, 1, 0, 0));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    let order = handles_order(&again, None);
    assert_eq!(order, ["1", "open 9#4", "3", "release 9#4", "replayed"]);
}

#[test]
fn a_handle_whose_release_is_unanswered_at_a_restart_opens_again_for_the_replays() {
    // The process closed the file as the server died: its release is still on its way,
    // and the write before it was lost. The handle opens again for the write's replay;
    // the release itself follows `Replayed` as new work.
    let mut h = opened_7_and_changed();
    h.c.connection_lost("test");
    h.call(3, vec![p::Op::Release { ino: 7, handle: 4 }]);
    let again = h.connect(welcome(true, Some(0), false));
    let order = handles_order(&again, Some(3));
    assert_eq!(order, ["open 7#4", "2", "replayed", "the release 7#4"]);
}

#[test]
fn a_handle_whose_release_is_unanswered_at_a_restart_opens_again_for_its_writeback() {
    // The process wrote through the handle (answered here, written back) and closed it
    // while the connection was down; the server restarted meanwhile and held the file
    // (unlinked, open) only for the grace period. The handle opens again first, then the
    // writeback and the release go, before `Replayed`.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![p::Op::Open { ino: 7, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
    h.sent();
    h.hear(response(1, 1, 0, 0));
    h.c.connection_lost("test");
    let now = h.now;
    h.c.submit(writeback(2, vec![change(7)], 1), now);
    h.c.submit(writeback(3, vec![p::Op::Release { ino: 7, handle: 4 }], 1), now);
    h.c.end_burst();
    let again = h.connect(welcome(true, Some(0), false));
    let order = handles_order(&again, None);
    assert_eq!(order, ["open 7#4", "2", "release 7#4", "replayed"]);
}

#[test]
fn a_handle_released_while_a_writeback_through_it_waits_for_its_answer_opens_again_for_it() {
    // The process wrote through the handle (answered here, written back) and closed it.
    // The server ran the write, but its answer waited (behind another mount's recall)
    // while the release's came; then the server restarted before committing the write,
    // holding the file (unlinked, open) only for the grace period. Whether the write's
    // answer never came (it goes again as writeback) or came after the release's (it is
    // replayed), the handle opens again first and closes again behind it.
    for answered in [false, true] {
        let mut h = Harness::new();
        h.connect(welcome(false, None, false));
        h.call(1, vec![p::Op::Open { ino: 7, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
        h.sent();
        h.hear(response(1, 1, 0, 0));
        let now = h.now;
        // (Two bursts: not merged into one request.)
        h.c.submit(writeback(2, vec![change(7)], 1), now);
        h.c.end_burst();
        h.c.submit(writeback(3, vec![p::Op::Release { ino: 7, handle: 4 }], 1), now);
        h.c.end_burst();
        assert_eq!(Harness::ids(&h.sent()), vec![2, 3]);
        h.hear(response(3, 1, 0, 0));
        if answered {
            h.hear(response(2, 1, 1, 0));
        }
        h.c.connection_lost("test");
        let again = h.connect(welcome(true, Some(0), false));
        let order = handles_order(&again, None);
        assert_eq!(order, ["open 7#4", "2", "release 7#4", "replayed"], "answered: {answered}");
    }
}

#[test]
fn replays_go_again_in_the_order_they_ran_after_a_second_restart() {
    // Two changes lost to a restart are replayed; the first replay is answered, the
    // second not, and the server restarts again before committing either: they must go
    // again in the order they ran, the answered one first.
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![change(1)]);
    h.call(2, vec![change(2)]);
    h.sent();
    h.hear(response(1, 1, 1, 0));
    h.hear(response(2, 1, 2, 0));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(Harness::ids(&again), vec![1, 2, 0], "{again:?}");
    h.hear(response(1, 1, 1, 0));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(Harness::ids(&again), vec![1, 2, 0], "{again:?}");
}

/// Attributes of a new regular file, inode 9.
fn file_9() -> p::Attr {
    let t = p::Time { sec: 1, nsec: 0 };
    p::Attr {
        ino: 9,
        generation: 1,
        kind: p::FileType::Regular,
        mode: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        size_bytes: 0,
        blocks_4k: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        flags: 0,
    }
}

/// What a reconnect sent, for the tests of handles: "open I#H" and "release I#H" for
/// requests of one re-open or release ("the release I#H" for the call `release_id`),
/// other requests by id, and "replayed".
fn handles_order(msgs: &[ClientMessage], release_id: Option<u64>) -> Vec<String> {
    msgs.iter()
        .map(|m| match m {
            ClientMessage::Request(r) => match r.ops.as_slice() {
                [p::Op::Open { ino, handle, .. }] => format!("open {ino}#{handle}"),
                [p::Op::Release { ino, handle }] if Some(r.id) == release_id => format!("the release {ino}#{handle}"),
                [p::Op::Release { ino, handle }] => format!("release {ino}#{handle}"),
                _ => format!("{}", r.id),
            },
            ClientMessage::Replayed => "replayed".to_string(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Request 1 creates file 9 (`file_9`), answered in place 1, not durable.
fn create_file_9(h: &mut Harness) -> p::Attr {
    let create = p::Op::Create {
        parent: 1,
        name: b"f".to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: cred(),
    };
    h.call(1, vec![create]);
    h.sent();
    let attr = file_9();
    let created =
        p::Response { id: 1, results: vec![Ok(p::Reply::Entry(attr.clone()))], seq: 1, durable: 0, time: None };
    h.hear(ServerMessage::Response(created));
    attr
}

#[test]
fn a_handle_opened_again_for_replays_opens_again_at_a_second_restart() {
    // The restart that lost the write opened the closed handle again for its replay; the
    // server restarted again before answering anything: the handle opens again first.
    let mut h = opened_7_and_changed();
    h.call(3, vec![p::Op::Release { ino: 7, handle: 4 }]);
    h.sent();
    h.hear(response(3, 1, 0, 0));
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(handles_order(&again, None), ["open 7#4", "2", "release 7#4", "replayed"]);
    h.c.connection_lost("test");
    let again = h.connect(welcome(true, Some(0), false));
    assert_eq!(handles_order(&again, None), ["open 7#4", "2", "release 7#4", "replayed"]);
}

/// A connected harness whose request 1 opened handle 4 of file 7 and whose change 2 of it
/// was answered in place 1, not durable.
fn opened_7_and_changed() -> Harness {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.call(1, vec![p::Op::Open { ino: 7, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]);
    h.sent();
    h.hear(response(1, 1, 0, 0));
    h.call(2, vec![change(7)]);
    h.sent();
    h.hear(response(2, 1, 1, 0));
    h
}

#[test]
fn a_recall_in_parts_drops_every_part_and_is_answered_once_after_the_last() {
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    h.hear(ServerMessage::Notify(p::Notify::RecallPart { recall_id: 9, inodes: vec![1, 2] }));
    h.hear(ServerMessage::Notify(p::Notify::RecallPart { recall_id: 9, inodes: vec![3] }));
    h.hear(ServerMessage::Notify(p::Notify::Recall { recall_id: 9, inodes: vec![4] }));
    let got: Vec<(u64, Vec<u64>)> = h.recalls.iter().map(|r| (r.recall_id, r.inodes.clone())).collect();
    // Parts carry id 0: whoever drops them does not answer; the last part is answered.
    assert_eq!(got, vec![(0, vec![1, 2]), (0, vec![3]), (9, vec![4])]);
    for r in &got {
        h.c.recall_done(r.0);
    }
    let answers: Vec<ClientMessage> = h.sent();
    assert_eq!(answers, vec![ClientMessage::RecallDone { recall_id: 9 }], "answered once");
}

#[test]
fn a_written_buffer_is_reused_for_the_next_frames_and_given_back_when_idle() {
    // Sizes vary (seeded, printed): the next frames land in a buffer already that big,
    // not in memory grown (and faulted in) afresh for each request.
    let seed = 0xB0F5u64 ^ std::env::var("CREST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    println!("seed {seed}");
    let mut rng = crest_rng::Stream::from_seed_u64(seed);
    let mut h = Harness::new();
    h.connect(welcome(false, None, false));
    let mut id = 1;
    let mut write = |h: &mut Harness, len: usize| {
        id += 1;
        h.call(id, vec![p::Op::Write { ino: 40, offset: 0, data: vec![7; len] }]);
    };
    let big = 256 * 1024 + rng.below(768 * 1024) as usize;
    write(&mut h, big);
    let first = h.c.poll_transmit();
    assert!(first.len() > big);
    let (cap, at) = (first.capacity(), first.as_ptr() as usize);
    h.c.recycle(first);
    // A smaller frame, then one as big: each goes into the buffer given back.
    for len in [1 + rng.below(4096) as usize, big] {
        write(&mut h, len);
        let out = h.c.poll_transmit();
        assert_eq!((out.as_ptr() as usize, out.capacity()), (at, cap), "frame of {len} bytes in a new buffer");
        h.c.recycle(out);
    }
    // Idle for a heartbeat: the buffer goes, and the heartbeat is small.
    let t = h.at(HEARTBEAT.as_millis() as u64 * 2);
    h.c.handle_timeout(t);
    let beat = h.c.poll_transmit();
    assert!(!beat.is_empty() && beat.capacity() < cap, "the idle connection kept {} bytes", beat.capacity());
    h.c.recycle(beat);
    write(&mut h, 10);
    assert!(h.c.poll_transmit().capacity() < cap, "kept after the idle heartbeat");
}
