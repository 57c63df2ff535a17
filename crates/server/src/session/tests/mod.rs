use super::*;
use crest_store::{MemDisk, MkfsOptions};
use record::MAX_RECORD_GRANTS;

/// A new file system on a shared in-memory disk (to reopen after a simulated crash).
fn fresh_disk() -> MemDisk {
    let disk = MemDisk::new(16 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: s::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    disk
}

fn server() -> Server {
    Server::new(Store::open(Box::new(fresh_disk())).expect("open"))
}

/// A server with two sessions, a and b.
fn two_sessions() -> (Server, SessionId, SessionId) {
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    (srv, a.expect("a"), b.expect("b"))
}

/// Request `id` carrying `ops` at the server's clock.
fn req(id: u64, ops: Vec<Op>) -> p::Request {
    p::Request { id, ops, time: None, caller: p::Caller::ROOT }
}

/// The first result of the one response the last step sent (and nothing else).
fn sole_result(srv: &mut Server) -> Result<Reply, p::OpError> {
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    response.results[0].clone()
}

/// Request `id`: create regular file `name` in the root.
fn create_in_root(id: u64, name: &str) -> p::Request {
    make_in_root(id, name, p::FileType::Regular, 0o644)
}

/// Request `id` making `name` of `kind` in the root, as root.
fn make_in_root(id: u64, name: &str, kind: p::FileType, mode: u32) -> p::Request {
    p::Request {
        id,
        ops: vec![Op::Create {
            parent: 1,
            name: name.as_bytes().to_vec(),
            kind,
            mode,
            rdev: 0,
            cred: p::Cred::default(),
        }],
        time: None,
        caller: p::Caller::ROOT,
    }
}

fn hello(resume: Option<p::SessionToken>) -> p::Hello {
    p::Hello {
        magic: p::HELLO_MAGIC,
        version: p::PROTOCOL_VERSION,
        client_name: "test".into(),
        resume,
        dataset: String::new(),
    }
}

const NOW: p::Time = p::Time { sec: 5, nsec: 0 };

#[test]
fn retried_create_applies_once() {
    let mut srv = server();
    let (sid, w) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let token = match w {
        p::ServerMessage::Welcome(w) => w.session,
        other => panic!("{other:?}"),
    };
    let create = create_in_root(1, "f");
    let first = srv.handle_request(sid, create.clone(), NOW);
    assert!(first.results[0].is_ok());
    // The connection drops; the client resumes and retries the same id.
    let (sid2, w) = srv.handle_hello(&hello(Some(token)));
    assert!(matches!(w, p::ServerMessage::Welcome(p::Welcome { resumed: true, .. })));
    let again = srv.handle_request(sid2.expect("resumed"), create.clone(), NOW);
    assert_eq!(again, first, "the retry is answered from the cache, not re-applied (EEXIST)");
    // A new request id with the same op does run again (and fails: EEXIST).
    let fresh = srv.handle_request(sid, p::Request { id: 2, ..create.clone() }, NOW);
    assert_eq!(fresh.results[0].as_ref().err().map(|e| e.errno), Some(17));
}

#[test]
fn xattrs_up_to_the_linux_limits_and_their_errors() {
    let mut srv = server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let r = srv.handle_request(sid, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(a)) = &r.results[0] else { panic!("{r:?}") };
    let ino = a.ino;
    let set = |name: Vec<u8>, len: usize, flags| Op::SetXattr { ino, name, value: vec![9; len], flags };
    let errno_of = |srv: &mut Server, id, op| {
        srv.handle_request(sid, req(id, vec![op]), NOW).results[0].as_ref().err().map(|e| e.errno)
    };
    // Linux checks the name and the value's size before the flags: ERANGE, E2BIG.
    assert_eq!(errno_of(&mut srv, 2, set(vec![b'a'; 256], 1, p::XATTR_REPLACE)), Some(34));
    assert_eq!(errno_of(&mut srv, 3, set(Vec::new(), 1, 0)), Some(34));
    assert_eq!(errno_of(&mut srv, 4, set(b"user.a".to_vec(), 65_537, p::XATTR_REPLACE)), Some(7));
    assert_eq!(errno_of(&mut srv, 5, set(b"user.a".to_vec(), 65_536, p::XATTR_CREATE)), None);
    let r = srv.handle_request(sid, req(6, vec![Op::GetXattr { ino, name: b"user.a".to_vec() }]), NOW);
    assert_eq!(r.results[0], Ok(Reply::Data(vec![9; 65_536])), "a 64 KiB value travels whole");
}

#[test]
fn wrong_version_and_bad_tokens() {
    let mut srv = server();
    let mut h = hello(None);
    let old = p::OLDEST_PROTOCOL_VERSION - 1;
    h.version = old;
    let (sid, msg) = srv.handle_hello(&h);
    assert!(sid.is_none());
    assert!(matches!(msg, p::ServerMessage::Refused { reason, .. } if reason.contains(&old.to_string())));
    // Each client is answered in the newest version both speak.
    for (asked, answered) in [(p::OLDEST_PROTOCOL_VERSION, p::OLDEST_PROTOCOL_VERSION), (42, p::PROTOCOL_VERSION)] {
        h.version = asked;
        let (_, msg) = srv.handle_hello(&h);
        assert!(matches!(msg, p::ServerMessage::Welcome(ref w) if w.version == answered), "{asked}: {msg:?}");
    }
    let (_, msg) = srv.handle_hello(&hello(Some(p::SessionToken { id: 1, secret: 0 })));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, .. })));
}

#[test]
fn setgid_directories_pass_on_their_group() {
    let mut srv = server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let mk = |name: &str, kind, parent, uid, gid| Op::Create {
        parent,
        name: name.as_bytes().to_vec(),
        kind,
        mode: 0o755,
        rdev: 0,
        cred: p::Cred { uid, gid, umask: 0 },
    };
    let r = srv.handle_request(
        sid,
        p::Request { id: 1, ops: vec![mk("d", p::FileType::Directory, 1, 0, 50)], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    let Ok(Reply::Entry(d)) = &r.results[0] else { panic!("{r:?}") };
    let set = p::SetAttr { mode: Some(0o2775), ..Default::default() };
    srv.handle_request(
        sid,
        p::Request { id: 2, ops: vec![Op::SetAttr { ino: d.ino, set }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    let r = srv.handle_request(
        sid,
        p::Request {
            id: 3,
            ops: vec![mk("f", p::FileType::Regular, d.ino, 7, 7), mk("sub", p::FileType::Directory, d.ino, 7, 7)],
            time: None,
            caller: p::Caller::ROOT,
        },
        NOW,
    );
    let Ok(Reply::Entry(f)) = &r.results[0] else { panic!("{r:?}") };
    let Ok(Reply::Entry(sub)) = &r.results[1] else { panic!("{r:?}") };
    assert_eq!((f.gid, f.mode & 0o2000), (50, 0));
    assert_eq!((sub.gid, sub.mode & 0o2000), (50, 0o2000));
}

#[test]
fn the_protocol_hash_is_the_stores_hash() {
    // Clients judge leaf ranges with the protocol's hash; the store orders entries by
    // its own. They must be the same function.
    for name in [&b""[..], b"a", b"Makefile", &[0xff, 0x80, 0x01], &[b'x'; 255]] {
        assert_eq!(p::name_hash(name), s::key::name_hash(name), "{name:?}");
    }
}

#[test]
fn a_name_read_lossily_is_not_taken_for_the_bytes_before_it() {
    // A grant count ending in 0xef, then a name length of 0xbf and a name that starts with
    // a stray 0xbd: read lossily, the name starts with U+FFFD (ef bf bd), which the bytes
    // just before it spell too. The fuzz check must not take it for a name stored whole.
    let mut b = vec![3];
    b.extend_from_slice(&42u64.to_le_bytes());
    b.extend_from_slice(&7u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&[0, 1]);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&0xef00_0000u32.to_le_bytes());
    b.push(0xbf);
    b.push(0xbd);
    b.extend_from_slice(&[b'a'; 0xbe]);
    let r = decode_record(&b).expect("a record with a damaged name is still read");
    assert!(r.name.starts_with('\u{fffd}'));
    assert!(record::fuzz_record(&b));
}

#[test]
fn session_records_round_trip_and_bad_ones_are_refused() {
    let rec = |seq, holes: &[u64], grants: Option<Vec<std::ops::Range<u64>>>, name: &str| Record {
        secret: 42,
        seq,
        dataset: 9,
        holes: holes.to_vec(),
        grants,
        name: name.into(),
        identity: Some("host-a-1f2e3d4c".into()),
    };
    let want = rec(7, &[3, 5], Some(vec![100..164, 1 << 41..(1 << 41) + 3]), "host-a");
    let r = encode_record(&want);
    assert_eq!(decode_record(&r), Some(want));
    for cut in 0..r.len() {
        assert_eq!(decode_record(&r[..cut]), None, "truncated at {cut}");
    }
    let mut bad = r.clone();
    bad[0] = 5;
    assert_eq!(decode_record(&bad), None, "unknown version");
    let mut long = r.clone();
    long.push(b'x');
    assert_eq!(decode_record(&long), None, "name length disagrees");
    assert_eq!(decode_record(&encode_record(&rec(5, &[5], Some(vec![]), "h"))), None, "a hole at or above its seq");
    let mut many = encode_record(&rec(7, &[], Some(vec![]), "h"));
    many[25] = (MAX_RECORD_HOLES + 1) as u8;
    assert_eq!(decode_record(&many), None, "more holes than a record names");
    let mut grants = encode_record(&rec(7, &[], Some(vec![]), "h"));
    grants[26] = (MAX_RECORD_GRANTS + 1) as u8;
    assert_eq!(decode_record(&grants), None, "more grants than a record keeps");
    let mut wrap = encode_record(&rec(7, &[], Some(std::iter::once(u64::MAX - 1..u64::MAX).collect()), "h"));
    wrap[35..39].copy_from_slice(&9u32.to_le_bytes());
    assert_eq!(decode_record(&wrap), None, "a grant past the last number");
    // Version 2 (no dataset: the default one; no grants) and version 1 (no holes either).
    let mut v2 = vec![2];
    v2.extend_from_slice(&42u64.to_le_bytes());
    v2.extend_from_slice(&7u64.to_le_bytes());
    v2.extend_from_slice(&[1, 3, 0, 0, 0, 0, 0, 0, 0, 1, b'h']);
    let old = Record { dataset: 0, grants: None, identity: None, ..rec(7, &[3], None, "h") };
    assert_eq!(decode_record(&v2), Some(old));
    let mut v1 = vec![1];
    v1.extend_from_slice(&42u64.to_le_bytes());
    v1.extend_from_slice(&7u64.to_le_bytes());
    v1.push(1);
    v1.push(b'h');
    assert_eq!(decode_record(&v1), Some(Record { dataset: 0, identity: None, ..rec(7, &[], None, "h") }));
    let holes: Vec<u64> = (1..=MAX_RECORD_HOLES as u64 + 5).collect();
    let grants: Vec<std::ops::Range<u64>> = (0..MAX_RECORD_GRANTS as u64 + 5).map(|i| i * 10..i * 10 + 5).collect();
    let identity = Some("i".repeat(record::MAX_RECORD_IDENTITY));
    let huge = Record { seq: u64::MAX, identity, ..rec(0, &holes, Some(grants), &"n".repeat(1000)) };
    let b = encode_record(&huge);
    assert!(b.len() <= s::sessions::MAX_SESSION_RECORD_BYTES, "{} bytes", b.len());
    let back = decode_record(&b).expect("the largest record decodes");
    assert_eq!(back.identity, huge.identity, "the identity is kept whole; the name yields");
    assert!(record::fuzz_record(&b));
}

#[test]
fn a_session_record_keeps_the_identity_and_still_reads_those_without_one() {
    let r = Record {
        secret: 42,
        seq: 7,
        dataset: 9,
        holes: vec![3],
        grants: Some(vec![100..164, 300..302]),
        name: "host-a".into(),
        identity: Some("host-a-1f2e3d4c".into()),
    };
    let b = encode_record(&r);
    assert_eq!(b[0], 4);
    assert_eq!(decode_record(&b), Some(r.clone()));
    assert!(record::fuzz_record(&b));
    // A version 3 record (as written before): no identity, and it encodes back as it was.
    let v3 = Record { identity: None, ..r.clone() };
    let old = encode_record(&v3);
    assert_eq!((old[0], old.len() + 1 + r.identity.as_ref().map_or(0, String::len)), (3, b.len()));
    assert_eq!(decode_record(&old), Some(v3));
    assert!(record::fuzz_record(&old));
    let mut trailing = old.clone();
    trailing.push(0);
    assert_eq!(decode_record(&trailing), None, "a version 3 record ends with its name");
    // A damaged identity is not read as another one.
    for cut in b.len() - 16..b.len() {
        assert_eq!(decode_record(&b[..cut]), None, "truncated at {cut}");
    }
    let mut bad = b.clone();
    let last = bad.len() - 1;
    bad[last] = 0xff;
    assert_eq!(decode_record(&bad), None, "an identity that is not UTF-8");
    let mut long = b.clone();
    long.push(b'x');
    assert_eq!(decode_record(&long), None, "identity length disagrees");
}

#[test]
fn after_a_crash_a_resumed_session_learns_exactly_which_changes_survived() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (sid, w) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
    let mk = create_in_root;
    let r1 = srv.handle_request(sid, mk(1, "one"), NOW);
    assert_eq!((r1.seq, r1.durable), (1, 0));
    let read = srv.handle_request(
        sid,
        p::Request { id: 2, ops: vec![Op::GetAttr { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    assert_eq!(read.seq, 0, "reads take no place in the order");
    let r2 = srv.handle_request(
        sid,
        p::Request { id: 3, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    assert_eq!((r2.seq, r2.durable), (2, 2), "fsync makes everything so far durable");
    let r3 = srv.handle_request(sid, mk(4, "two"), NOW);
    assert_eq!((r3.seq, r3.durable), (3, 2));
    // Power cut: nothing after the fsync is on disk.
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    let (sid2, msg) = srv.handle_hello(&hello(Some(w.session)));
    assert_eq!(sid2, Some(sid));
    let p::ServerMessage::Welcome(w2) = msg else { panic!("{msg:?}") };
    assert!(w2.resumed);
    assert_eq!(w2.durable_seq, Some(2), "changes up to seq 2 survived");
    // Replaying the lost change applies it (once), with the next seq.
    let again = srv.handle_request(sid, mk(4, "two"), NOW);
    assert!(again.results[0].is_ok(), "{again:?}");
    assert_eq!(again.seq, 3);
    // A later reconnect (no restart) says nothing about durability.
    let (_, msg) = srv.handle_hello(&hello(Some(w.session)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, durable_seq: None, .. })));
    // A clean goodbye drops the record.
    srv.end_session(sid);
    let mut store = srv.into_store();
    store.commit().expect("commit");
    assert!(store.session_records().expect("records").is_empty());
}

#[test]
fn a_file_unlinked_while_open_outlives_a_restart_for_a_client_that_opens_it_again() {
    for reopens in [false, true] {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
        let (a, wa) = srv.handle_hello(&hello(None));
        let (b, wb) = srv.handle_hello(&hello(None));
        let (a, b) = (a.expect("a"), b.expect("b"));
        let (p::ServerMessage::Welcome(wa), p::ServerMessage::Welcome(wb)) = (wa, wb) else { panic!() };
        let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
            panic!("create")
        };
        // b opens x, changes nothing (so far it has no record); a unlinks x: b's open
        // gives it a record; a's fsync makes it all durable.
        assert!(run_answering_recalls(
            &mut srv,
            b,
            1,
            vec![Op::Open { ino: x.ino, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]
        )
        .is_ok());
        let unlink = vec![Op::Unlink { parent: 1, name: b"x".to_vec() }, Op::Fsync { ino: 1 }];
        assert!(run_answering_recalls(&mut srv, a, 2, unlink).is_ok());
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
        let (b2, msg) = srv.handle_hello(&hello(Some(wb.session)));
        assert_eq!(b2, Some(b), "b's session is restored: {msg:?}");
        if reopens {
            let r = srv.handle_request(
                b,
                req(2, vec![Op::Open { ino: x.ino, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }]),
                NOW,
            );
            assert!(matches!(&r.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "{r:?}");
        }
        srv.replayed(b, NOW);
        assert_eq!(srv.handle_hello(&hello(Some(wa.session))).0, Some(a));
        srv.replayed(a, NOW);
        let _ = srv.take_outgoing();
        let r = srv.handle_request(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 10 }]), NOW);
        assert_eq!(r.results[0].is_ok(), reopens, "the orphan lives exactly while b opened it again: {r:?}");
    }
}

#[test]
fn a_file_a_change_orphans_during_the_grace_period_waits_for_the_restored_sessions_to_reopen() {
    // a holds x open (x still has its name when the server dies). After the restart, b's
    // replayed unlink removes x before a has opened it again: x must wait for a.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (id, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("welcome") };
        sessions.push((id.expect("session"), w.session));
    }
    let [(a, ta), (b, tb)] = sessions[..] else { panic!("two sessions") };
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, b, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    assert!(run_answering_recalls(&mut srv, a, 1, create_in_root(1, "y").ops).is_ok());
    assert!(run_answering_recalls(
        &mut srv,
        a,
        2,
        vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }, Op::Fsync { ino: 1 }]
    )
    .is_ok());
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
    assert_eq!(srv.handle_hello(&hello(Some(tb))).0, Some(b));
    srv.handle(b, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
    srv.replayed(b, NOW);
    assert!(srv.is_pinned(x.ino), "held for the grace period");
    assert_eq!(srv.handle_hello(&hello(Some(ta))).0, Some(a));
    let r = srv.handle_request(
        a,
        req(3, vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]),
        NOW,
    );
    assert!(matches!(&r.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "a opens x again: {r:?}");
    srv.replayed(a, NOW);
    let _ = srv.take_outgoing();
    let r = srv.handle_request(a, req(4, vec![Op::Read { ino: x.ino, offset: 0, len: 10 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
    srv.handle(a, req(5, vec![Op::Release { ino: x.ino, handle: 1 }]), NOW);
    assert!(!srv.is_pinned(x.ino));
    assert!(srv.store.getattr(x.ino).is_err(), "gone with its last handle");
}

#[test]
fn a_change_replayed_after_a_crash_comes_out_with_its_first_times_and_generations() {
    // a creates x; the server dies before committing it; a replays the create with the
    // time its answer carried: x comes back with the generation and times a was told.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello(&hello(None));
    let (a, p::ServerMessage::Welcome(w)) = (a.expect("a"), w) else { panic!("welcome") };
    let first = srv.handle_request(a, create_in_root(1, "x"), NOW);
    let Ok(Reply::Entry(x)) = &first.results[0] else { panic!("{first:?}") };
    assert_eq!(first.time, Some(NOW), "a change's answer says when it ran");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    assert_eq!(srv.handle_hello(&hello(Some(w.session))).0, Some(a));
    let later = p::Time { sec: NOW.sec + 100, nsec: 0 };
    let replay = p::Request { time: first.time, ..create_in_root(1, "x") };
    let again = srv.handle_request(a, replay, later);
    let Ok(Reply::Entry(y)) = &again.results[0] else { panic!("{again:?}") };
    assert_eq!((y.ino, y.generation, y.ctime, y.mtime), (x.ino, x.generation, x.ctime, x.mtime));
}
#[test]
fn a_release_during_the_grace_period_leaves_an_orphan_another_restored_session_holds() {
    // a and b both hold x open; c unlinks it; the server restarts. b comes back first and
    // closes its handle before a has opened x again: x must wait for a.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let (id, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("welcome") };
        sessions.push((id.expect("session"), w.session));
    }
    let [(a, ta), (b, tb), (c, _)] = sessions[..] else { panic!("three sessions") };
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, c, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    assert!(run_answering_recalls(
        &mut srv,
        a,
        1,
        vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]
    )
    .is_ok());
    assert!(run_answering_recalls(
        &mut srv,
        b,
        1,
        vec![Op::Open { ino: x.ino, handle: 2, access: p::OPEN_READ | p::OPEN_WRITE }]
    )
    .is_ok());
    let unlink = vec![Op::Unlink { parent: 1, name: b"x".to_vec() }, Op::Fsync { ino: 1 }];
    assert!(run_answering_recalls(&mut srv, c, 2, unlink).is_ok());
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
    assert_eq!(srv.handle_hello(&hello(Some(tb))).0, Some(b));
    let r = srv.handle_request(
        b,
        req(2, vec![Op::Open { ino: x.ino, handle: 2, access: p::OPEN_READ | p::OPEN_WRITE }]),
        NOW,
    );
    assert!(r.results[0].is_ok(), "{r:?}");
    srv.replayed(b, NOW);
    let r = srv.handle_request(b, req(3, vec![Op::Release { ino: x.ino, handle: 2 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
    assert_eq!(srv.handle_hello(&hello(Some(ta))).0, Some(a));
    let r = srv.handle_request(
        a,
        req(2, vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]),
        NOW,
    );
    assert!(matches!(&r.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "a opens x again: {r:?}");
    srv.replayed(a, NOW);
    let _ = srv.take_outgoing();
    let r = srv.handle_request(a, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 10 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
}

#[test]
fn an_open_that_waits_for_the_grace_period_holds_the_orphan_it_opens() {
    // a holds x open; c unlinks it; the server restarts. b, restored, opens x as new
    // work while a has not replayed yet: the open waits for the grace period, and a's
    // `Replayed` ends it, which reclaims what nobody holds open. b's open must count.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let (id, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("welcome") };
        sessions.push((id.expect("session"), w.session));
    }
    let [(a, ta), (b, tb), (c, tc)] = sessions[..] else { panic!("three sessions") };
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, c, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    assert!(run_answering_recalls(
        &mut srv,
        a,
        1,
        vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]
    )
    .is_ok());
    assert!(run_answering_recalls(&mut srv, b, 1, create_in_root(1, "y").ops).is_ok());
    let unlink = vec![Op::Unlink { parent: 1, name: b"x".to_vec() }, Op::Fsync { ino: 1 }];
    assert!(run_answering_recalls(&mut srv, c, 2, unlink).is_ok());
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
    assert_eq!(srv.handle_hello(&hello(Some(tb))).0, Some(b));
    srv.replayed(b, NOW);
    assert_eq!(srv.handle_hello(&hello(Some(tc))).0, Some(c));
    srv.replayed(c, NOW);
    assert_eq!(srv.handle_hello(&hello(Some(ta))).0, Some(a));
    let _ = srv.take_outgoing();
    // b's open waits: a has not replayed.
    srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 7, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
    assert!(srv.take_outgoing().is_empty(), "new work waits for the grace period");
    // a closed its file while the server was down: it does not open it again.
    srv.replayed(a, NOW);
    let answer = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Response { response, .. } if response.id == 2 => Some(response),
        _ => None,
    });
    let answer = answer.expect("answered once the grace is over");
    assert!(matches!(&answer.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "{answer:?}");
    let r = srv.handle_request(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 10 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
}

#[test]
fn a_stall_of_the_server_itself_does_not_count_against_leases() {
    for forgiven in [false, true] {
        let (mut srv, a, _) = two_sessions();
        srv.handle(a, req(1, vec![Op::GetAttr { ino: 1 }]), p::Time { sec: 1, nsec: 0 });
        srv.tick(1_000).expect("tick");
        // One operation held the server's thread for 14 s: a's heartbeats wait unread.
        if forgiven {
            srv.forgive_stall(15_000, 14_000);
        }
        srv.tick(15_000).expect("tick");
        assert_eq!(srv.is_fenced(a), !forgiven, "forgiven: {forgiven}");
    }
}

#[test]
fn restored_sessions_whose_client_never_returns_are_fenced_and_forgotten() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (sid, _) = srv.handle_hello(&hello(None));
    let req = p::Request { id: 1, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT };
    srv.handle_request(sid.expect("session"), req, NOW);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    assert_eq!(srv.sessions.len(), 1);
    srv.tick(1_000).expect("tick");
    assert_eq!(srv.sessions.len(), 1, "within the grace period");
    srv.tick(1_000 + crate::caps::GRACE_MS).expect("tick");
    assert!(srv.sessions.is_empty() && srv.is_fenced(sid.expect("session")), "fenced when the grace ends");
    let records = srv.store.session_records().expect("records");
    assert!(records.len() == 1 && is_fenced_marker(&records[0].1), "a marker tells its client later");
    srv.tick(1_000 + crate::caps::GRACE_MS + RESTORED_SESSION_GRACE_MS).expect("tick");
    assert!(srv.store.session_records().expect("records").is_empty(), "then it goes too");
}

#[test]
fn locks_hold_across_sessions_and_go_with_their_session() {
    let (mut srv, a, b) = two_sessions();
    let lock = |id, owner, kind| p::Request {
        id,
        ops: vec![Op::SetLock { ino: 1, owner, start: 0, end: p::LOCK_TO_EOF, kind, flock: false, pid: 42 }],
        time: None,
        caller: p::Caller::ROOT,
    };
    let get = |id| p::Request {
        id,
        ops: vec![Op::GetLock { ino: 1, owner: 5, start: 10, end: 10, kind: p::LockKind::Read, flock: false }],
        time: None,
        caller: p::Caller::ROOT,
    };
    let r = srv.handle_request(a, lock(1, 5, p::LockKind::Write), NOW);
    assert_eq!((&r.results[0], r.seq), (&Ok(Reply::Done), 0), "a lock is no stored change");
    let again = srv.handle_request(a, lock(1, 5, p::LockKind::Write), NOW);
    assert_eq!(again.results[0], Ok(Reply::Done), "a retried lock is granted again");
    let r = srv.handle_request(b, lock(1, 5, p::LockKind::Read), NOW);
    assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(11), "the same owner id in another session");
    let r = srv.handle_request(b, get(2), NOW);
    let want = p::LockInfo { kind: p::LockKind::Write, start: 0, end: p::LOCK_TO_EOF, pid: 42 };
    assert_eq!(r.results[0], Ok(Reply::Lock(Some(want))));
    let bad = p::Request {
        id: 3,
        ops: vec![Op::SetLock { ino: 1, owner: 1, start: 9, end: 8, kind: p::LockKind::Read, flock: false, pid: 1 }],
        time: None,
        caller: p::Caller::ROOT,
    };
    assert_eq!(srv.handle_request(b, bad, NOW).results[0].as_ref().err().map(|e| e.errno), Some(22));
    let missing = p::Request {
        id: 4,
        ops: vec![Op::SetLock { ino: 999, owner: 1, start: 0, end: 0, kind: p::LockKind::Read, flock: false, pid: 1 }],
        time: None,
        caller: p::Caller::ROOT,
    };
    assert!(srv.handle_request(b, missing, NOW).results[0].is_err(), "no such inode");
    // a's connection drops: its locks stay while it may come back…
    srv.heard(a, 10_000);
    srv.disconnected(a, 10_000);
    srv.tick(10_000 + crate::caps::DISCONNECTED_FENCE_MS - 1).expect("tick");
    assert_eq!(srv.handle_request(b, get(5), NOW).results[0], Ok(Reply::Lock(Some(want))));
    // …and go once it has been away too long (it is fenced).
    srv.tick(10_000 + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
    assert_eq!(srv.handle_request(b, get(6), NOW).results[0], Ok(Reply::Lock(None)));
    // A clean end of b's session drops b's.
    let r = srv.handle_request(b, lock(7, 1, p::LockKind::Write), NOW);
    assert_eq!(r.results[0], Ok(Reply::Done));
    srv.end_session(b);
    assert!(srv.locks.is_empty());
}

#[test]
fn a_change_to_what_another_session_read_waits_for_its_recall() {
    let (mut srv, a, b) = two_sessions();
    let lookup = |id| p::Request {
        id,
        ops: vec![Op::Lookup { parent: 1, name: b"x".to_vec() }],
        time: None,
        caller: p::Caller::ROOT,
    };
    srv.handle(b, lookup(1), NOW);
    assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == b));
    let create = create_in_root(1, "x");
    srv.handle(a, create, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected one recall to b: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (b, &[1u64][..]), "b's copy of the root directory");
    srv.recall_done(b, *recall_id, NOW);
    let out = srv.take_outgoing();
    assert!(
        matches!(&out[..], [Outgoing::Response { session, response }] if *session == a && response.results[0].is_ok())
    );
    // A read by a changes nothing and recalls nobody.
    srv.handle(a, lookup(2), NOW);
    assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { .. }]));
}

/// Runs `ops` for `session` and answers every recall it sends at once; returns the
/// first result of `session`'s response.
fn run_answering_recalls(srv: &mut Server, session: SessionId, id: u64, ops: Vec<Op>) -> Result<Reply, p::OpError> {
    srv.handle(session, req(id, ops), NOW);
    loop {
        let out = srv.take_outgoing();
        let mut result = None;
        for o in out {
            match o {
                Outgoing::Notify { session: t, notify: p::Notify::Recall { recall_id, .. } } => {
                    srv.recall_done(t, recall_id, NOW)
                }
                Outgoing::Response { session: s, response } if s == session => {
                    result = Some(response.results[0].clone())
                }
                _ => {}
            }
        }
        if let Some(r) = result {
            return r;
        }
    }
}

#[test]
fn a_file_another_session_cached_outlives_its_unlink_until_that_session_answers() {
    for opens in [false, true] {
        let (mut srv, a, b) = two_sessions();
        let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
            panic!("create")
        };
        let lookup = vec![Op::Lookup { parent: 1, name: b"x".to_vec() }];
        assert!(run_answering_recalls(&mut srv, b, 1, lookup).is_ok());
        // b caches x: it may open it without asking, and send the open behind.
        srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("expected a recall to b: {out:?}")
        };
        assert_eq!(*session, b);
        let recall_id = *recall_id;
        if opens {
            srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
            let Ok(Reply::Attr(open)) = sole_result(&mut srv) else { panic!("b's open of the unlinked x") };
            assert_eq!(open.nlink, 0);
        }
        srv.recall_done(b, recall_id, NOW);
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == a));
        srv.handle(b, req(3, vec![Op::GetAttr { ino: x.ino }]), NOW);
        let after = sole_result(&mut srv);
        assert_eq!(after.is_ok(), opens, "x lives on exactly while b holds it open: {after:?}");
        if opens {
            srv.handle(b, req(4, vec![Op::Release { ino: x.ino, handle: 9 }]), NOW);
            assert!(sole_result(&mut srv).is_ok());
            srv.handle(b, req(5, vec![Op::GetAttr { ino: x.ino }]), NOW);
            assert_eq!(sole_result(&mut srv).err().map(|e| e.errno), Some(2), "the last close frees it");
        }
    }
}

#[test]
fn a_pin_outlives_the_recall_timeout_until_the_holder_answers_or_is_fenced() {
    // b caches x and answered an open of it itself; the Open is stuck in a partition.
    // a's unlink does not wait past the recall timeout, but the file must: b's Open,
    // ahead of its late answer on the same connection, has to find it.
    for fenced in [false, true] {
        let (mut srv, a, b) = two_sessions();
        let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
            panic!("create")
        };
        let lookup = vec![Op::Lookup { parent: 1, name: b"x".to_vec() }];
        assert!(run_answering_recalls(&mut srv, b, 1, lookup).is_ok());
        srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. }] = &out[..] else {
            panic!("expected a recall to b: {out:?}")
        };
        let recall_id = *recall_id;
        // The recall times out: a's unlink returns.
        srv.tick(millis(NOW) + crate::caps::RECALL_TIMEOUT_MS + 1).expect("tick");
        assert!(srv.take_outgoing().iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)));
        if fenced {
            // b stays silent past its lease: fenced, its Open will never come.
            srv.tick(millis(NOW) + p::timing::LEASE_MS * 2).expect("tick");
            assert!(srv.is_fenced(b));
            assert!(!srv.is_pinned(x.ino), "nobody can open it any more");
            continue;
        }
        assert!(srv.is_pinned(x.ino));
        srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
        let Ok(Reply::Attr(open)) = sole_result(&mut srv) else { panic!("b's late open of the unlinked x") };
        assert_eq!(open.nlink, 0);
        srv.recall_done(b, recall_id, NOW);
        assert!(!srv.is_pinned(x.ino));
        srv.handle(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 1 }]), NOW);
        assert!(sole_result(&mut srv).is_ok(), "b's descriptor works");
    }
}

#[test]
fn a_session_a_pin_waits_for_is_restored_after_a_restart_and_its_open_finds_the_file() {
    // b caches x and answered an open of it itself; the Open is stuck in a partition. a
    // unlinks x (made durable), and the server dies while the pin waits for b. b changed
    // nothing, but its Open is on its way: the restarted server must wait for b as for a
    // session holding x open, and keep x for its Open.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
    let (a, wa) = srv.handle_hello(&hello(None));
    let (b, wb) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    let (p::ServerMessage::Welcome(wa), p::ServerMessage::Welcome(wb)) = (wa, wb) else { panic!() };
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    let lookup = vec![Op::Lookup { parent: 1, name: b"x".to_vec() }];
    assert!(run_answering_recalls(&mut srv, b, 1, lookup).is_ok());
    let unlink = vec![Op::Unlink { parent: 1, name: b"x".to_vec() }, Op::Fsync { ino: 1 }];
    srv.handle(a, req(2, unlink), NOW);
    let out = srv.take_outgoing();
    assert!(
        out.iter()
            .any(|o| matches!(o, Outgoing::Notify { session, notify: p::Notify::Recall { .. } } if *session == b)),
        "b is recalled: {out:?}"
    );
    assert!(srv.is_pinned(x.ino), "b may have opened x without asking");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
    srv.tick(millis(NOW)).expect("tick");
    let (b2, msg) = srv.handle_hello(&hello(Some(wb.session)));
    assert_eq!(b2, Some(b));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, .. })), "b is restored: {msg:?}");
    assert_eq!(srv.handle_hello(&hello(Some(wa.session))).0, Some(a));
    srv.replayed(a, NOW);
    // b's Open, sent behind before the restart, goes before its `Replayed`.
    srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
    let Ok(Reply::Attr(open)) = sole_result(&mut srv) else { panic!("b's open of the unlinked x") };
    assert_eq!(open.nlink, 0);
    srv.replayed(b, NOW);
    let _ = srv.take_outgoing();
    srv.handle(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 1 }]), NOW);
    assert!(sole_result(&mut srv).is_ok(), "b's descriptor works");
}

#[test]
fn a_holder_whose_recall_timed_out_is_still_waited_for_by_a_later_unlinks_pin() {
    // b caches x and answered an open of it itself; the Open is stuck in a partition with
    // b's answers. a's chmod of x stops waiting for b at the recall timeout; then a
    // unlinks x. b's Open, ahead of its late answers, has to find the file.
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    // (b holds x, not the directory: the unlink has nothing else to recall from it.)
    assert!(run_answering_recalls(&mut srv, b, 1, vec![Op::GetAttr { ino: x.ino }]).is_ok());
    let chmod = Op::SetAttr { ino: x.ino, set: p::SetAttr { mode: Some(0o600), ..Default::default() } };
    srv.handle(a, req(2, vec![chmod]), NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Notify { session, .. }] if *session == b), "{out:?}");
    srv.tick(millis(NOW) + crate::caps::RECALL_TIMEOUT_MS + 1).expect("tick");
    assert!(srv.take_outgoing().iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)));
    srv.handle(a, req(3, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
    let out = srv.take_outgoing();
    assert!(
        out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)),
        "the unlink does not wait for b again: {out:?}"
    );
    let recall_id = out.iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == b => Some(*recall_id),
        _ => None,
    });
    assert!(srv.is_pinned(x.ino), "b may have opened x without asking");
    srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
    let Ok(Reply::Attr(open)) = sole_result(&mut srv) else { panic!("b's late open of the unlinked x") };
    assert_eq!(open.nlink, 0);
    srv.recall_done(b, recall_id.expect("b is told of the unlink, to answer behind its opens"), NOW);
    assert!(!srv.is_pinned(x.ino));
    srv.handle(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 1 }]), NOW);
    assert!(sole_result(&mut srv).is_ok(), "b's descriptor works");
}

#[test]
fn a_writeback_of_a_write_answered_under_exclusive_rights_does_not_wait_for_other_openers() {
    // a answered a write itself while it held x exclusively, then lost the rights (a
    // restart gave them to nobody: b opened x again first). Its writeback must run before
    // a's later requests, which its processes made after that write returned: parked for
    // b's flush, a's next read would run ahead of it and miss it.
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    assert!(run_answering_recalls(
        &mut srv,
        b,
        1,
        vec![Op::Open { ino: x.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]
    )
    .is_ok());
    let write = Op::Write { ino: x.ino, offset: 0, data: b"written".to_vec() };
    srv.handle(a, p::Request { id: 2, ops: vec![write], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    srv.handle(a, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 64 }]), NOW);
    let out = srv.take_outgoing();
    let read = out.iter().find_map(|o| match o {
        Outgoing::Response { response, .. } if response.id == 3 => Some(response.results[0].clone()),
        _ => None,
    });
    assert!(matches!(&read, Some(Ok(Reply::Data(d))) if d == b"written"), "{out:?}");
}

#[test]
fn a_sessions_requests_wait_behind_its_own_writeback_that_waits() {
    // a's writeback of a create in d waits for b's exclusive rights on d; a's next
    // writeback, a truncate of the new file, must not run before it (ENOENT): its caller
    // was told the create is done.
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Inodes { first, .. }) = run_answering_recalls(&mut srv, a, 1, vec![Op::AllocInodes { count: 4 }])
    else {
        panic!("alloc")
    };
    let mkdir = Op::Create {
        parent: 1,
        name: b"d".to_vec(),
        kind: p::FileType::Directory,
        mode: 0o777,
        rdev: 0,
        cred: p::Cred::default(),
    };
    let Ok(Reply::Entry(d)) = run_answering_recalls(&mut srv, b, 1, vec![mkdir]) else { panic!("mkdir") };
    let create = Op::CreateAt {
        ino: first,
        generation: 1,
        parent: d.ino,
        name: b"f".to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    };
    srv.handle(a, p::Request { id: 2, ops: vec![create], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    let truncate = Op::SetAttr { ino: first, set: p::SetAttr { size_bytes: Some(10), ..Default::default() } };
    srv.handle(a, p::Request { id: 3, ops: vec![truncate], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    let out = srv.take_outgoing();
    assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)), "{out:?}");
    let recall = out.iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == b => Some(*recall_id),
        _ => None,
    });
    srv.recall_done(b, recall.expect("b's rights on d are recalled"), NOW);
    let out = srv.take_outgoing();
    let results: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Outgoing::Response { response, .. } if response.id >= 2 => Some((response.id, response.results[0].is_ok())),
            _ => None,
        })
        .collect();
    assert_eq!(results, [(2, true), (3, true)], "{out:?}");
}
#[test]
fn a_write_waits_for_other_openers_to_write_back_first() {
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, b, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    let ino = x.ino;
    assert!(run_answering_recalls(&mut srv, b, 2, vec![Op::Write { ino, offset: 0, data: vec![b'0'; 64] }]).is_ok());
    assert!(run_answering_recalls(
        &mut srv,
        a,
        1,
        vec![Op::Open { ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE }]
    )
    .is_ok());
    // a holds x open (it may have dirtied a shared mapping): b's write waits.
    srv.handle(b, req(3, vec![Op::Write { ino, offset: 10, data: b"BB".to_vec() }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a flush recall to a: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[ino][..]));
    let recall_id = *recall_id;
    // a writes its dirty page back before answering: that runs at once, b's waits on.
    srv.handle(a, req(2, vec![Op::Write { ino, offset: 0, data: b"AAAAAAAAAAAAAAAA".to_vec() }]), NOW);
    let out = srv.take_outgoing();
    assert!(out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)), "{out:?}");
    assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == b)), "{out:?}");
    srv.recall_done(a, recall_id, NOW);
    let out = srv.take_outgoing();
    for o in out {
        if let Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } = o {
            srv.recall_done(session, recall_id, NOW);
        }
    }
    srv.handle(b, req(4, vec![Op::Read { ino, offset: 0, len: 16 }]), NOW);
    let out = srv.take_outgoing();
    let data = out.iter().find_map(|o| match o {
        Outgoing::Response { session, response } if *session == b && response.id == 4 => {
            response.results[0].clone().ok()
        }
        _ => None,
    });
    assert_eq!(data, Some(Reply::Data(b"AAAAAAAAAABBAAAA".to_vec())), "b's write lands after a's write-back");
}

#[test]
fn an_open_parked_behind_exclusive_rights_holds_the_file_before_the_holders_unlink() {
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    // a holds x exclusively (it made it): b's open waits for a's rights, yet it is
    // already an open when a's unlink, sent before a answered, runs.
    srv.handle(b, req(1, vec![Op::Open { ino: x.ino, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
        panic!("expected a recall of a's rights: {out:?}")
    };
    assert_eq!(*session, a);
    let recall_id = *recall_id;
    srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
    assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == a));
    srv.recall_done(a, recall_id, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(*session, b);
    assert!(matches!(&response.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "{response:?}");
}

#[test]
fn a_request_resent_while_it_waits_parked_runs_once() {
    let (mut srv, a, b) = two_sessions();
    let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
        panic!("create")
    };
    // b's open of x and its release wait behind a's exclusive rights; b's connection
    // breaks and its client sends both again. a unlinks x, then gives its rights up.
    let open = req(1, vec![Op::Open { ino: x.ino, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }]);
    let release = req(2, vec![Op::Release { ino: x.ino, handle: 3 }]);
    srv.handle(b, open.clone(), NOW);
    srv.handle(b, release.clone(), NOW);
    let recalls: Vec<u64> = srv
        .take_outgoing()
        .into_iter()
        .filter_map(|o| match o {
            Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. } => Some(recall_id),
            _ => None,
        })
        .collect();
    assert!(!recalls.is_empty(), "a's rights are recalled");
    srv.handle(b, open, NOW);
    srv.handle(b, release, NOW);
    srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
    srv.take_outgoing();
    for id in recalls {
        srv.recall_done(a, id, NOW);
    }
    // Each ran once, and answered once: a second run of the open, after the release,
    // would open the handle its process closed again (here: on a file gone with it).
    let answers: Vec<(u64, bool)> = srv
        .take_outgoing()
        .into_iter()
        .filter_map(|o| match o {
            Outgoing::Response { session, response } if session == b => {
                Some((response.id, response.results.iter().all(Result::is_ok)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(answers, vec![(1, true), (2, true)]);
    assert!(srv.sessions[&b].open.is_empty(), "b holds nothing open");
}

#[test]
fn another_sessions_request_waits_until_exclusive_rights_are_flushed_and_returned() {
    let (mut srv, a, b) = two_sessions();
    // (About rights between two sessions taking turns, not a directory both change at
    // once: `shared_dirs`.)
    srv.set_contention_window(0);
    // a makes a directory: it holds it exclusively from birth.
    let mkdir = Op::Create {
        parent: 1,
        name: b"d".to_vec(),
        kind: p::FileType::Directory,
        mode: 0o755,
        rdev: 0,
        cred: p::Cred::default(),
    };
    srv.handle(a, req(1, vec![mkdir, Op::AllocInodes { count: 8 }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    let (Ok(Reply::Entry(d)), Ok(Reply::Inodes { first, .. })) = (&response.results[0], &response.results[1]) else {
        panic!("{response:?}")
    };
    let (d, first) = (d.ino, *first);
    // b looks inside: its request waits and a is asked to give d up.
    srv.handle(b, req(1, vec![Op::Lookup { parent: d, name: b"x".to_vec() }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall to a: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
    let recall_id = *recall_id;
    // a's writeback, sent before its answer, arrives first and is applied at a's time.
    let client_time = p::Time { sec: NOW.sec + 30, nsec: 5 };
    let create_at = Op::CreateAt {
        ino: first + 2,
        generation: 9,
        parent: d,
        name: b"x".to_vec(),
        kind: p::FileType::Regular,
        mode: 0o600,
        rdev: 0,
        cred: p::Cred { uid: 3, gid: 4, umask: 0 },
    };
    srv.handle(a, p::Request { id: 2, ops: vec![create_at], time: Some(client_time), caller: p::Caller::ROOT }, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    let Ok(Reply::Entry(x)) = &response.results[0] else { panic!("{response:?}") };
    assert_eq!((x.ino, x.generation, x.uid, x.gid, x.mtime), (first + 2, 9, 3, 4, client_time));
    // a answers: b's lookup runs, but its reply would carry x, which a also holds
    // (it created it): that is recalled too before b hears anything.
    srv.recall_done(a, recall_id, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall of x to a: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[first + 2][..]));
    srv.recall_done(a, *recall_id, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(*session, b);
    assert!(matches!(&response.results[0], Ok(Reply::Lookup { attr: Some(found), .. }) if found.ino == first + 2));
    // A holder that does not answer delays b only until its time runs out.
    let create = Op::Create {
        parent: d,
        name: b"y".to_vec(),
        kind: p::FileType::Regular,
        mode: 0o600,
        rdev: 0,
        cred: p::Cred::default(),
    };
    srv.handle(a, req(3, vec![create]), NOW);
    // (b caches d now: a's create is answered once b dropped it.)
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(*session, b);
    srv.recall_done(b, *recall_id, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    let Ok(Reply::Entry(y)) = &response.results[0] else { panic!("{response:?}") };
    let y = y.ino;
    srv.handle(b, req(2, vec![Op::GetAttr { ino: y }]), NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Notify { session, .. }] if *session == a), "{out:?}");
    // b stays in touch; a says nothing of y for the recall's time: it is fenced.
    let later = millis(NOW) + crate::caps::EXCLUSIVE_RECALL_MS;
    srv.heard(b, later);
    srv.tick(later - 1).expect("tick");
    assert!(srv.take_outgoing().is_empty(), "a's lease has not lapsed yet");
    srv.tick(later).expect("tick");
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
    // Nobody holds y exclusively now: b's next look at it does not wait.
    srv.handle(b, req(3, vec![Op::GetAttr { ino: y }]), time_of_millis(later));
    assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { .. }]));
    // a's late writeback is refused, not applied, and a is told it was fenced.
    let late_write = Op::SetAttr { ino: y, set: p::SetAttr { mode: Some(0o777), ..Default::default() } };
    srv.handle(a, req(4, vec![late_write]), time_of_millis(later));
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Notify { notify: p::Notify::Fenced, .. }]), "{out:?}");
    srv.handle(b, req(4, vec![Op::GetAttr { ino: y }]), time_of_millis(later));
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    assert!(matches!(&response.results[0], Ok(Reply::Attr(attr)) if attr.mode == 0o600));
    // Its client's resume starts a new session and says the old one was fenced.
    let (_, msg) = srv.handle_hello(&hello(Some(p::SessionToken { id: a, secret: 0 })));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })));
}

#[test]
fn a_holder_shipping_its_changes_keeps_its_recalled_rights_up_to_a_lease_and_an_idle_one_not() {
    // a creates a file (exclusive from birth); b asks for it. Both times a keeps talking;
    // the first time it writes back to the file, the second only to others.
    for shipping in [true, false] {
        let (mut srv, a, b) = two_sessions();
        srv.set_contention_window(0);
        srv.handle(a, create_in_root(1, "f"), NOW);
        let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
        srv.handle(a, create_in_root(2, "other"), NOW);
        let Ok(Reply::Entry(other)) = sole_result(&mut srv) else { panic!("create other") };
        srv.handle(b, req(1, vec![Op::GetAttr { ino: f.ino }]), NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Notify { notify: p::Notify::Recall { .. }, .. }]), "{out:?}");
        let start = millis(NOW);
        let step = crate::caps::EXCLUSIVE_RECALL_MS / 3;
        let mut at = start;
        let mut id = 10;
        let fenced_at = loop {
            at += step;
            id += 1;
            let ino = if shipping { f.ino } else { other.ino };
            let op = Op::Write { ino, offset: id * 10, data: vec![1; 10] };
            srv.handle(a, req(id, vec![op]), time_of_millis(at));
            srv.heard(b, at);
            srv.tick(at).expect("tick");
            srv.take_outgoing();
            if srv.is_fenced(a) {
                break at - start;
            }
            assert!(at - start <= 2 * crate::caps::LEASE_MS, "never fenced");
        };
        let (low, high) = if shipping {
            (crate::caps::LEASE_MS, crate::caps::LEASE_MS + step)
        } else {
            (crate::caps::EXCLUSIVE_RECALL_MS, crate::caps::EXCLUSIVE_RECALL_MS + step)
        };
        assert!((low..=high).contains(&fenced_at), "shipping {shipping}: fenced {fenced_at} ms after the recall");
    }
}

#[test]
fn open_and_release_are_idempotent_by_handle() {
    // A retried Open or Release (its connection broke) runs again: handles, not
    // counts, keep an unlinked file alive exactly until its last handle goes.
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("a");
    let answer = |srv: &mut Server, id, ops| {
        srv.handle(a, req(id, ops), NOW);
        sole_result(srv)
    };
    srv.handle(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
    let ino = f.ino;
    for (id, handle) in [(2, 7), (3, 7), (4, 8)] {
        assert!(matches!(
            answer(&mut srv, id, vec![Op::Open { ino, handle, access: p::OPEN_READ | p::OPEN_WRITE }]),
            Ok(Reply::Attr(_))
        ));
    }
    assert!(answer(&mut srv, 5, vec![Op::Unlink { parent: 1, name: b"f".to_vec() }]).is_ok());
    for id in [6, 7] {
        assert!(answer(&mut srv, id, vec![Op::Release { ino, handle: 7 }]).is_ok());
    }
    assert!(
        matches!(answer(&mut srv, 8, vec![Op::GetAttr { ino }]), Ok(Reply::Attr(x)) if x.nlink == 0),
        "handle 8 keeps it"
    );
    assert!(answer(&mut srv, 9, vec![Op::Release { ino, handle: 8 }]).is_ok());
    assert_eq!(
        answer(&mut srv, 10, vec![Op::GetAttr { ino }]).err().map(|e| e.errno),
        Some(2),
        "gone with its last handle"
    );
    assert_eq!(
        answer(&mut srv, 11, vec![Op::Open { ino, handle: 9, access: p::OPEN_READ | p::OPEN_WRITE }])
            .err()
            .map(|e| e.errno),
        Some(2)
    );
}

#[test]
fn short_of_space_no_session_answers_changes_itself() {
    let (mut srv, a, b) = two_sessions();
    srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), NOW);
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { .. })));
    assert_eq!(srv.caps.exclusive_elsewhere(a, 1), Some(b));
    // a fills the image to within an eighth of its size (the limit for a small one).
    srv.handle(a, create_in_root(1, "spc"), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }, ..] = &out[..] else {
        panic!("a's create in b's directory recalls it: {out:?}")
    };
    assert_eq!(*session, b);
    srv.recall_done(b, *recall_id, NOW);
    let Ok(Reply::Entry(spc)) = sole_result(&mut srv) else { panic!() };
    let st = srv.store.statfs();
    let len = (st.avail_blocks - st.total_blocks / 8 + 16) * u64::from(st.block_size);
    // (In the steps a mount sends.)
    for (id, (offset, len)) in (100..).zip(p::fallocate_steps(0, len, 0)) {
        srv.handle(a, req(id, vec![Op::Fallocate { ino: spc.ino, offset, len, flags: 0 }]), NOW);
        assert!(sole_result(&mut srv).is_ok());
    }
    // b takes the root again; its next request finds space short: what it holds is
    // recalled, and it cannot take a directory whole again.
    srv.handle(b, create_in_root(2, "g"), NOW);
    let out = srv.take_outgoing();
    let recalled: Vec<u64> = out
        .iter()
        .filter_map(|o| match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { inodes, .. } } if *session == a => {
                Some(inodes.clone())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert!(recalled.contains(&spc.ino), "a's exclusive rights on what it made are recalled: {out:?}");
    let created = out.iter().find_map(|o| match o {
        Outgoing::Response { response, .. } => Some(response.results[0].clone()),
        _ => None,
    });
    let Some(Ok(Reply::Entry(g))) = created else { panic!("{out:?}") };
    let recall_of_g = out.iter().any(|o| {
        matches!(o, Outgoing::Notify { session, notify: p::Notify::Recall { inodes, .. } }
            if *session == b && inodes == &vec![g.ino])
    });
    assert!(recall_of_g, "what a create grants is recalled at once: {out:?}");
    for o in &out {
        if let Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } = o {
            srv.recall_done(*session, *recall_id, NOW);
        }
    }
    assert!(srv.take_outgoing().is_empty());
    assert_eq!(srv.caps.exclusive_inodes(), Vec::<u64>::new());
    // (a changed the root a moment ago, which would make it shared: not what this is about.)
    srv.set_contention_window(0);
    srv.handle(b, req(3, vec![Op::Acquire { ino: 1 }]), NOW);
    let out = srv.take_outgoing();
    let refused = out.iter().any(|o| {
        matches!(o, Outgoing::Response { response, .. }
            if matches!(&response.results[0], Err(e) if e.errno == 28))
    });
    assert!(refused, "{out:?}");
}

#[test]
fn acquiring_a_directory_recalls_its_readers_and_makes_others_wait() {
    let (mut srv, a, b) = two_sessions();
    // (About rights between two sessions taking turns, not a directory both change at
    // once: `shared_dirs`.)
    srv.set_contention_window(0);
    // b makes two files in the root and forgets its exclusive rights by a recall
    // (a's look at them); a then reads the root, so both cache it.
    srv.handle(b, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!() };
    srv.handle(b, create_in_root(2, "g"), NOW);
    let Ok(Reply::Entry(g)) = sole_result(&mut srv) else { panic!() };
    srv.handle(a, req(1, vec![Op::Lookup { parent: 1, name: b"f".to_vec() }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. }] = &out[..] else { panic!("{out:?}") };
    srv.recall_done(b, *recall_id, NOW);
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { attr: Some(_), .. })));
    // A file is not a directory; a directory too large for one reply is refused.
    srv.handle(a, req(2, vec![Op::Acquire { ino: f.ino }]), NOW);
    assert_eq!(sole_result(&mut srv).err().map(|e| e.errno), Some(20));
    // b's acquire of the root waits until a dropped what it read of it.
    srv.handle(b, req(3, vec![Op::Acquire { ino: 1 }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall to a: {out:?}")
    };
    assert_eq!(*session, a);
    assert!(inodes.contains(&1) && inodes.contains(&f.ino), "{inodes:?}");
    srv.recall_done(a, *recall_id, NOW);
    let Ok(Reply::Lookup { attr: Some(root), leaf }) = sole_result(&mut srv) else { panic!() };
    assert_eq!(root.ino, 1);
    assert_eq!((leaf.hash_lo, leaf.hash_hi), (0, u64::MAX));
    let mut names: Vec<_> = leaf.items.iter().map(|i| (i.name.clone(), i.attr.ino)).collect();
    names.sort();
    assert_eq!(names, vec![(b"f".to_vec(), f.ino), (b"g".to_vec(), g.ino)]);
    for ino in [1, f.ino, g.ino] {
        assert_eq!(srv.caps.exclusive_elsewhere(a, ino), Some(b), "inode {ino}");
    }
    // Now a's look into the root, or at g, waits for b to give them up.
    srv.handle(a, req(4, vec![Op::GetAttr { ino: g.ino }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall to b: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (b, &[g.ino][..]));
    srv.recall_done(b, *recall_id, NOW);
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Attr(x)) if x.ino == g.ino));
    // b takes the root back: a, which read g meanwhile, is asked to drop it first.
    srv.handle(b, req(5, vec![Op::Acquire { ino: 1 }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall to a: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[g.ino][..]));
    srv.recall_done(a, *recall_id, NOW);
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 2));
    assert_eq!(srv.caps.exclusive_elsewhere(a, g.ino), Some(b));
}

#[test]
fn an_acquire_waits_for_the_recall_of_its_own_sessions_exclusive_rights() {
    // a holds f exclusively (it made it); b's look at f recalls it. Before a's answer, a
    // acquires the root, which names f: run at once, it would grant f again, a's client
    // (seeing the recall first, then the grant) would hold f, and a's answer to the recall
    // would then end a's rights here: a would answer changes of f itself unseen by b.
    let (mut srv, a, b) = two_sessions();
    srv.handle(a, create_in_root(1, "f"), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    let Ok(Reply::Entry(f)) = &response.results[0] else { panic!("{response:?}") };
    srv.handle(b, req(1, vec![Op::GetAttr { ino: f.ino }]), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
        panic!("expected a recall to a: {out:?}")
    };
    assert_eq!(*session, a);
    let recall_id = *recall_id;
    srv.handle(a, req(2, vec![Op::Acquire { ino: 1 }]), NOW);
    assert_eq!(srv.take_outgoing(), vec![], "the acquire waits for a's answer to the recall");
    srv.recall_done(a, recall_id, NOW);
    // b's look runs first (it came first), then a's acquire, which recalls what b
    // read of f and answers once b has dropped it.
    let out = srv.take_outgoing();
    let b_answered = out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == b));
    assert!(b_answered, "{out:?}");
    let recall = out.iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == b => Some(*recall_id),
        _ => None,
    });
    let Some(recall) = recall else { panic!("expected a recall to b: {out:?}") };
    srv.recall_done(b, recall, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(*session, a);
    assert!(matches!(&response.results[0], Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 1));
    assert_eq!(srv.caps.exclusive_elsewhere(b, f.ino), Some(a), "a holds f again, as its client does");
}

mod hostile;
mod restart;
mod shared_dirs;

#[test]
fn a_recall_too_long_for_one_frame_goes_in_parts_answered_once() {
    let inodes: Vec<u64> = (1..=2 * p::MAX_RECALL_INODES as u64 + 7).map(|i| i << 20).collect();
    let before = Outgoing::Notify { session: 3, notify: p::Notify::Recall { recall_id: 1, inodes: vec![5] } };
    let long = Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id: 9, inodes: inodes.clone() } };
    let out = split_recalls(vec![before.clone(), long]);
    assert_eq!(out.len(), 4, "one short recall, two parts, the last part");
    assert_eq!(out[0], before, "a short recall goes as it is");
    let mut seen: Vec<u64> = Vec::new();
    for (i, o) in out[1..].iter().enumerate() {
        let (Outgoing::Notify { session: 2, notify: p::Notify::RecallPart { recall_id: 9, inodes: part } }
        | Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id: 9, inodes: part } }) = o
        else {
            panic!("{o:?}")
        };
        assert_eq!(
            matches!(o, Outgoing::Notify { notify: p::Notify::Recall { .. }, .. }),
            i == 2,
            "the last is the recall"
        );
        let mut frame = Vec::new();
        let Outgoing::Notify { notify, .. } = o else { unreachable!() };
        p::encode_frame(&p::ServerMessage::Notify(notify.clone()), &mut frame).expect("each part fits in a frame");
        seen.extend(part.iter().copied());
    }
    assert_eq!(seen, inodes, "every inode once, in order");
}

#[test]
fn one_client_identity_holds_a_bounded_number_of_sessions() {
    let mut srv = server();
    let mut ids = Vec::new();
    for _ in 0..MAX_SESSIONS_PER_IDENTITY {
        let (sid, _) = srv.handle_hello_as(&hello(None), Policy::joined(), "greedy");
        ids.push(sid.expect("a session within the bound"));
    }
    let (sid, msg) = srv.handle_hello_as(&hello(None), Policy::joined(), "greedy");
    assert!(sid.is_none() && matches!(msg, p::ServerMessage::Refused { .. }), "one more is refused: {msg:?}");
    let (other, _) = srv.handle_hello_as(&hello(None), Policy::joined(), "honest");
    assert!(other.is_some(), "another identity is not held back");
    // A session of the greedy one resumes at the bound; once one ends, a new one fits.
    let token = p::SessionToken { id: ids[3], secret: srv.sessions[&ids[3]].secret };
    assert_eq!(srv.handle_hello_as(&hello(Some(token)), Policy::joined(), "greedy").0, Some(ids[3]));
    srv.end_session(ids[0]);
    assert!(srv.handle_hello_as(&hello(None), Policy::joined(), "greedy").0.is_some());
}

#[test]
fn a_session_restored_after_a_crash_may_use_only_the_numbers_granted_to_it() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, wa) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    let p::ServerMessage::Welcome(wa) = wa else { panic!("{wa:?}") };
    let alloc = |srv: &mut Server, s, id| match srv
        .handle_request(s, req(id, vec![Op::AllocInodes { count: 4 }]), NOW)
        .results[0]
    {
        Ok(Reply::Inodes { first, .. }) => first,
        ref r => panic!("alloc: {r:?}"),
    };
    let mine = alloc(&mut srv, a, 1);
    let theirs = alloc(&mut srv, b, 1);
    let create_at = |id, ino, name: &str| {
        req(
            id,
            vec![Op::CreateAt {
                ino,
                generation: 5,
                parent: 1,
                name: name.as_bytes().to_vec(),
                kind: p::FileType::Regular,
                mode: 0o644,
                rdev: 0,
                cred: p::Cred::default(),
            }],
        )
    };
    assert!(srv.handle_request(a, create_at(2, mine, "a0"), NOW).results[0].is_ok());
    srv.handle_request(a, req(3, vec![Op::Fsync { ino: 1 }]), NOW);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    assert_eq!(srv.handle_hello(&hello(Some(wa.session))).0, Some(a));
    let r = srv.handle_request(a, create_at(4, theirs, "stolen"), NOW);
    assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(1), "another session's number: {r:?}");
    let r = srv.handle_request(a, create_at(5, mine, "again"), NOW);
    assert!(r.results[0].is_err(), "a number already used is not used again: {r:?}");
    let r = srv.handle_request(a, create_at(6, mine + 1, "a1"), NOW);
    assert!(r.results[0].is_ok(), "its own unused number still works: {r:?}");
}

#[test]
fn a_snapshot_waits_for_the_writeback_of_what_a_client_holds_in_its_dataset() {
    use crest_nvlist::{NvList, Value};
    let mut srv = server();
    let ds = srv.store.create_dataset("ds", NvList::new(), (0, 0, 0o755), s::Timespec::new(1, 0)).expect("dataset");
    let (a, _) = srv.handle_hello(&p::Hello { dataset: "ds".into(), ..hello(None) });
    let a = a.expect("session in ds");
    let (other, _) = srv.handle_hello(&hello(None));
    let other = other.expect("session in the default dataset");
    // Each creates a file: it holds it exclusively (it may answer changes itself).
    srv.handle(a, create_in_root(1, "f"), NOW);
    srv.handle(other, create_in_root(1, "g"), NOW);
    srv.take_outgoing();
    let call = |names: &[&str]| {
        let mut l = NvList::new();
        l.add("cmd", Value::Str("snapshot.create".into())).expect("add");
        l.add("names", Value::Strs(names.iter().map(|n| n.to_string()).collect())).expect("add");
        l.encode()
    };
    let AdminStart::Pending(token) = srv.admin_start(&call(&["ds@one"]), NOW) else { panic!("the snapshot waits") };
    let out = srv.take_outgoing();
    let recalls: Vec<(SessionId, u64)> = out
        .iter()
        .filter_map(|o| match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } => Some((*session, *recall_id)),
            _ => None,
        })
        .collect();
    assert_eq!(recalls.iter().map(|r| r.0).collect::<Vec<_>>(), vec![a], "only the holder in that dataset is recalled");
    assert!(srv.take_admin_answers(NOW).is_empty(), "not before its answer");
    assert!(srv.store.dataset("ds@one").is_err());
    srv.recall_done(a, recalls[0].1, NOW);
    let answers = srv.take_admin_answers(NOW);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, token);
    let answer = NvList::decode(&answers[0].1).expect("answer");
    assert!(answer.get("error").is_none(), "{answer:?}");
    assert!(srv.store.dataset("ds@one").is_ok(), "taken once the holder wrote back");
    // Nobody holds anything there now: the next one is taken at the next look.
    let AdminStart::Pending(_) = srv.admin_start(&call(&["ds@two"]), NOW) else { panic!("pending") };
    assert_eq!(srv.take_admin_answers(NOW).len(), 1);
    // A bad name is answered at once, and nothing is taken.
    let AdminStart::Done(bad) = srv.admin_start(&call(&["nope@x"]), NOW) else { panic!("answered at once") };
    assert!(NvList::decode(&bad).expect("answer").get_str("error").is_some());
    let _ = ds;
}
