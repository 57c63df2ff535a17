//! What a hostile peer may ask of the request step: answers larger than a frame.

use super::*;

/// A seed for a test's randomness, printed so that a failure can be replayed.
fn seed() -> u64 {
    let s = std::env::var("CREST_SERVER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    eprintln!("CREST_SERVER_SEED={s}");
    s | 1
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn create(srv: &mut Server, sid: SessionId, id: u64, parent: u64, name: &[u8], kind: p::FileType) -> u64 {
    let op = Op::Create { parent, name: name.to_vec(), kind, mode: 0o755, rdev: 0, cred: p::Cred::default() };
    let r = srv.handle_request(sid, req(id, vec![op]), NOW);
    let Ok(Reply::Entry(a)) = &r.results[0] else { panic!("{r:?}") };
    a.ino
}

/// A name of `len` bytes, distinct per `i`.
fn long_name(i: usize, len: usize) -> Vec<u8> {
    let mut n = format!("{i:06}-").into_bytes();
    n.resize(len, b'x');
    n
}

/// Every response fits in one frame, has one result per operation, and refuses only
/// replies too large (E2BIG), never a change (which ran, and whose client must be told).
fn check(ops: &[Op], r: &p::Response, file_size: u64) -> usize {
    let mut frame = Vec::new();
    p::encode_frame(&p::ServerMessage::Response(r.clone()), &mut frame)
        .unwrap_or_else(|e| panic!("the response to {} operations cannot be sent: {e}", ops.len()));
    assert_eq!(r.results.len(), ops.len());
    let mut refused = 0;
    for (i, (op, res)) in ops.iter().zip(&r.results).enumerate() {
        match (op, res) {
            (_, Err(e)) if e.errno == p::errno::E2BIG => {
                assert!(!op.is_mutation(), "op {i}: the change {op:?} was refused for its reply's size");
                refused += 1;
            }
            (Op::Read { offset, len, .. }, Ok(Reply::Data(d))) => {
                let want = u64::from((*len).min(p::MAX_IO_BYTES)).min(file_size.saturating_sub(*offset));
                assert_eq!(d.len() as u64, want, "op {i}: read {op:?}");
            }
            (_, Err(e)) => panic!("op {i}: {op:?} failed: {e:?}"),
            (_, Ok(_)) => {}
        }
    }
    refused
}

/// A server on a roomy image (for writes that are never committed).
fn roomy_server() -> Server {
    let disk = MemDisk::new(256 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: s::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    Server::new(Store::open(Box::new(disk)).expect("open"))
}

#[test]
fn answers_that_would_not_fit_in_a_frame_are_refused_not_built() {
    let mut rng = seed();
    let mut srv = roomy_server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let f = create(&mut srv, sid, 1, 1, b"f", p::FileType::Regular);
    let size = 1u64 << 30;
    let set = p::SetAttr { size_bytes: Some(size), ..Default::default() };
    assert!(srv.handle_request(sid, req(2, vec![Op::SetAttr { ino: f, set }]), NOW).results[0].is_ok());
    let d = create(&mut srv, sid, 3, 1, b"d", p::FileType::Directory);
    let mut id = 4;
    for i in 0..300 {
        create(&mut srv, sid, id, d, &long_name(i, 250), p::FileType::Regular);
        id += 1;
    }
    for i in 0..100 {
        let op = Op::SetXattr {
            ino: f,
            name: [b"user.".to_vec(), long_name(i, 240)].concat(),
            value: vec![1; 10],
            flags: 0,
        };
        assert!(srv.handle_request(sid, req(id, vec![op]), NOW).results[0].is_ok());
        id += 1;
    }
    // The request the hostile client sent: a hundred 4 MiB reads in 800 bytes.
    let reads: Vec<Op> = (0..100).map(|i| Op::Read { ino: f, offset: i << 22, len: p::MAX_IO_BYTES }).collect();
    let r = srv.handle_request(sid, req(id, reads.clone()), NOW);
    id += 1;
    assert_eq!(check(&reads, &r, size), 99, "the first read is answered, the rest refused");
    let mut refused = 0;
    for round in 0..40 {
        let n = match next(&mut rng) % 4 {
            0 => p::MAX_OPS_PER_REQUEST,
            1 => 1 + (next(&mut rng) % 1024) as usize,
            _ => 1 + (next(&mut rng) % 64) as usize,
        };
        let ops: Vec<Op> = (0..n)
            .map(|_| match next(&mut rng) % 9 {
                0 => Op::Read { ino: f, offset: next(&mut rng) % (size + 4096), len: next(&mut rng) as u32 },
                1 => Op::Read { ino: f, offset: next(&mut rng) % size, len: (next(&mut rng) % 70_000) as u32 },
                2 => Op::ReadDir { ino: d, from_index: 0, limit: u32::MAX },
                3 => Op::ListXattr { ino: f },
                4 => Op::Lookup { parent: d, name: long_name((next(&mut rng) % 300) as usize, 250) },
                5 => Op::GetAttr { ino: f },
                6 => Op::SetAttr { ino: f, set: p::SetAttr { mode: Some(0o600), ..Default::default() } },
                7 => {
                    Op::Write { ino: f, offset: next(&mut rng) % 65_536, data: vec![7; (next(&mut rng) % 64) as usize] }
                }
                _ => Op::GetXattr { ino: f, name: [b"user.".to_vec(), long_name(7, 240)].concat() },
            })
            .collect();
        let r = srv.handle_request(sid, req(id, ops.clone()), NOW);
        id += 1;
        let k = check(&ops, &r, size);
        eprintln!("round {round}: {} operations, {k} refused", ops.len());
        refused += k;
    }
    eprintln!("{refused} refused in all");
}

/// The reply cache keeps a bounded number of bytes per session; a retry of a change whose
/// answer it dropped is answered EIO, and the change is not applied again.
#[test]
fn a_retry_of_a_change_whose_large_answer_was_dropped_runs_no_more() {
    let mut rng = seed();
    let mut srv = roomy_server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let f = create(&mut srv, sid, 1, 1, b"f", p::FileType::Regular);
    let set = p::SetAttr { size_bytes: Some(1 << 30), ..Default::default() };
    assert!(srv.handle_request(sid, req(2, vec![Op::SetAttr { ino: f, set }]), NOW).results[0].is_ok());
    // Changes with large answers: a create, and a read of 4 MiB in the same request.
    let ops = |i: usize| {
        let name = format!("c{i}").into_bytes();
        let kind = p::FileType::Regular;
        vec![
            Op::Create { parent: 1, name, kind, mode: 0o644, rdev: 0, cred: p::Cred::default() },
            Op::Read { ino: f, offset: (i as u64) << 22, len: p::MAX_IO_BYTES },
        ]
    };
    let n = REPLY_CACHE_BYTES / p::MAX_IO_BYTES as usize + 2 + (next(&mut rng) % 4) as usize;
    let mut first = Vec::new();
    for i in 0..n {
        let r = srv.handle_request(sid, req(100 + i as u64, ops(i)), NOW);
        assert!(r.results.iter().all(Result::is_ok), "{i}: {:?}", r.results[0]);
        first.push(r);
    }
    let answered = |r: &p::Response, f: &p::Response| r.results == f.results && r.seq == f.seq;
    let mut dropped = 0;
    for (i, f) in first.iter().enumerate() {
        let again = srv.handle_request(sid, req(100 + i as u64, ops(i)), NOW);
        if !answered(&again, f) {
            assert_eq!((again.results.len(), again.seq), (2, f.seq), "{i}");
            for r in &again.results {
                assert!(r.as_ref().is_err_and(|e| e.errno == p::errno::EIO), "{i}: {r:?} (a create run twice: EEXIST)");
            }
            dropped += 1;
        }
    }
    assert!(dropped > 0 && dropped < n, "{dropped} of {n} answers dropped");
    assert!(answered(&srv.handle_request(sid, req(100 + n as u64 - 1, ops(n - 1)), NOW), &first[n - 1]));
}

#[test]
fn a_session_creates_only_at_inode_numbers_granted_to_it_and_each_once() {
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    let r = srv.handle_request(a, req(1, vec![Op::AllocInodes { count: 4 }]), NOW);
    let Ok(Reply::Inodes { first, .. }) = r.results[0] else { panic!("{r:?}") };
    let at = |ino, name: &str| Op::CreateAt {
        ino,
        generation: 1,
        parent: 1,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    };
    let errno_of = |r: &p::Response| r.results[0].as_ref().err().map(|e| e.errno);
    let r = srv.handle_request(b, req(1, vec![at(first + 1, "stolen")]), NOW);
    assert_eq!(errno_of(&r), Some(1), "another session's number");
    let r = srv.handle_request(b, req(2, vec![at(first + 100, "unreserved")]), NOW);
    assert_eq!(errno_of(&r), Some(1), "a number never granted");
    let r = srv.handle_request(a, req(2, vec![at(first + 1, "mine")]), NOW);
    assert_eq!(errno_of(&r), None, "its own: {r:?}");
    let unlink = Op::Unlink { parent: 1, name: b"mine".to_vec() };
    srv.handle_request(a, req(3, vec![unlink]), NOW);
    let r = srv.handle_request(a, req(4, vec![at(first + 1, "again")]), NOW);
    assert_eq!(errno_of(&r), Some(1), "once: (ino, generation) is never reused");
    for (id, ino) in [(5, first), (6, first + 2), (7, first + 3)] {
        let r = srv.handle_request(a, req(id, vec![at(ino, &format!("n{ino}"))]), NOW);
        assert_eq!(errno_of(&r), None, "the rest of the grant, around the used one: {r:?}");
    }
}

/// A request of `ops` on behalf of `caller`.
fn req_as(id: u64, caller: &p::Caller, ops: Vec<Op>) -> p::Request {
    p::Request { id, ops, time: None, caller: caller.clone() }
}

#[test]
fn a_handle_lets_its_session_do_what_its_checked_open_asked_and_no_more() {
    let mut srv = roomy_server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let op = Op::Create {
        parent: 1,
        name: b"f".to_vec(),
        kind: p::FileType::Regular,
        mode: 0o600,
        rdev: 0,
        cred: p::Cred::default(),
    };
    let r = srv.handle_request(sid, req(1, vec![op]), NOW);
    let Ok(Reply::Entry(a)) = &r.results[0] else { panic!("{r:?}") };
    let f = a.ino;
    let nobody = p::Caller { uid: 65534, gid: 65534, groups: Vec::new() };
    let mut id = 1;
    let mut run = |srv: &mut Server, caller: &p::Caller, op: Op| {
        id += 1;
        srv.handle_request(sid, req_as(id, caller, vec![op]), NOW).results[0].clone().map_err(|e| e.errno)
    };
    let write = || Op::Write { ino: f, offset: 0, data: b"x".to_vec() };
    let read = || Op::Read { ino: f, offset: 0, len: 1 };
    let open = |handle, access| Op::Open { ino: f, handle, access };
    assert_eq!(run(&mut srv, &nobody, write()).err(), Some(13), "root's 0600 file");
    // A hostile peer's open for nobody is refused, and grants nothing.
    assert_eq!(run(&mut srv, &nobody, open(7, p::OPEN_WRITE)).err(), Some(13));
    assert_eq!(run(&mut srv, &nobody, write()).err(), Some(13));
    // Root opens it for writing; whoever the session says asks next may write through it
    // (a descriptor passed on, a process that dropped its privileges).
    assert!(run(&mut srv, &p::Caller::ROOT, open(1, p::OPEN_WRITE)).is_ok());
    assert!(run(&mut srv, &nobody, write()).is_ok());
    assert_eq!(run(&mut srv, &nobody, read()).err(), Some(13), "a handle open for writing does not read");
    assert!(run(&mut srv, &p::Caller::ROOT, Op::Release { ino: f, handle: 1 }).is_ok());
    assert_eq!(run(&mut srv, &nobody, write()).err(), Some(13), "released: nothing is open");
}

/// `AllocInodes` for `count` numbers: the first and how many, or the errno.
fn alloc(srv: &mut Server, sid: SessionId, id: u64, count: u32) -> Result<(u64, u64), i32> {
    let r = srv.handle_request(sid, req(id, vec![Op::AllocInodes { count }]), NOW);
    match &r.results[0] {
        Ok(Reply::Inodes { first, count }) => Ok((*first, u64::from(*count))),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.errno),
    }
}

/// Request `id`: a file named `name` in the root made at granted number `ino`.
fn create_at(id: u64, ino: u64, name: &str) -> p::Request {
    let op = Op::CreateAt {
        ino,
        generation: 7,
        parent: 1,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    };
    req(id, vec![op])
}

/// `session`'s connection goes and stays gone until it is fenced.
fn fence_by_absence(srv: &mut Server, sids: &[SessionId], now_ms: &mut u64) {
    for &sid in sids {
        srv.heard(sid, *now_ms);
        srv.disconnected(sid, *now_ms);
    }
    *now_ms += crate::caps::DISCONNECTED_FENCE_MS + 1;
    srv.tick(*now_ms).expect("tick");
    assert!(sids.iter().all(|&s| srv.is_fenced(s)));
}

const EDQUOT: i32 = p::errno::EDQUOT;

#[test]
fn a_session_cannot_hoard_inode_numbers() {
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("session");
    let mut held = 0;
    let mut id = 1;
    let refused = loop {
        match alloc(&mut srv, a, id, p::MAX_INODE_GRANT) {
            Ok((_, n)) => held += n,
            Err(e) => break e,
        }
        id += 1;
        assert!(id < 100, "granted {held} numbers and counting");
    };
    assert_eq!((refused, held), (EDQUOT, MAX_UNUSED_GRANTED), "granted up to the bound, then refused");
    // What it uses makes room again, for as many as it used.
    let (first, _) =
        srv.sessions[&a].granted.as_ref().and_then(|g| g.first()).map(|r| (r.start, r.end)).expect("a grant");
    for i in 0..3 {
        id += 1;
        let r = srv.handle_request(a, create_at(id, first + i, &format!("f{i}")), NOW);
        assert!(r.results[0].is_ok(), "{r:?}");
    }
    assert_eq!(alloc(&mut srv, a, id + 1, p::MAX_INODE_GRANT).map(|(_, n)| n), Ok(3));
    assert_eq!(alloc(&mut srv, a, id + 2, 1), Err(EDQUOT));
    // Another session is not held back, and creates through the server still work.
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("session");
    assert!(alloc(&mut srv, b, 1, 4096).is_ok());
    assert!(srv.handle_request(a, create_in_root(id + 3, "plain"), NOW).results[0].is_ok());
}

#[test]
fn the_unused_inode_numbers_of_a_session_that_ended_are_granted_again() {
    let mut srv = server();
    let mut now_ms = 0;
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("a");
    let (first, n) = alloc(&mut srv, a, 1, 4096).expect("grant");
    assert!(srv.handle_request(a, create_at(2, first, "a0"), NOW).results[0].is_ok());
    srv.end_session(a);
    // The next session gets what it left, before the counter moves.
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("b");
    assert_eq!(alloc(&mut srv, b, 1, 4096), Ok((first + 1, n - 1)), "the rest of a's grant");
    assert!(srv.handle_request(b, create_at(2, first + 1, "b0"), NOW).results[0].is_ok(), "usable");
    assert_eq!(
        srv.handle_request(b, create_at(3, first, "b1"), NOW).results[0].as_ref().err().map(|e| e.errno),
        Some(1)
    );
    assert_eq!(alloc(&mut srv, b, 4, 4096), Ok((first + n, 4096)), "then the counter, where it was");
    // A fenced session's numbers come back too.
    fence_by_absence(&mut srv, &[b], &mut now_ms);
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    let mut got = Vec::new();
    for id in 1..=3 {
        got.push(alloc(&mut srv, c, id, 4096).expect("grant"));
    }
    got.sort_unstable();
    assert_eq!(got, vec![(first + 2, n), (first + 2 + n, n - 2), (first + 2 * n, 4096)], "joined, then the counter");
}

#[test]
fn sessions_started_in_a_loop_do_not_advance_the_inode_counter_without_bound() {
    let mut srv = server();
    let per_identity = 8;
    srv.set_sessions_per_identity(per_identity);
    let mut now_ms = 0;
    let (mut low, mut high, mut total) = (u64::MAX, 0, 0);
    let rounds = 6;
    for _ in 0..rounds {
        let mut sids = Vec::new();
        while let (Some(sid), _) = srv.handle_hello_as(&hello(None), Policy::joined(), "greedy") {
            let mut id = 1;
            while let Ok((first, n)) = alloc(&mut srv, sid, id, p::MAX_INODE_GRANT) {
                (low, high, total) = (low.min(first), high.max(first + n), total + n);
                id += 1;
                assert!(
                    id <= 4,
                    "a session was granted {} numbers and counting",
                    (id - 1) * u64::from(p::MAX_INODE_GRANT)
                );
            }
            sids.push(sid);
        }
        assert_eq!(sids.len(), per_identity, "then the identity's bound refuses more sessions");
        fence_by_absence(&mut srv, &sids, &mut now_ms);
    }
    let span = high - low;
    eprintln!("{total} numbers granted over a span of {span}");
    assert_eq!(total, rounds * per_identity as u64 * MAX_UNUSED_GRANTED);
    assert_eq!(span, per_identity as u64 * MAX_UNUSED_GRANTED, "the counter moved for the first round only");
    // The dataset still creates files, through the server and at granted numbers.
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    assert!(srv.handle_request(sid, create_in_root(1, "plain"), NOW).results[0].is_ok());
    let (first, _) = alloc(&mut srv, sid, 2, 16).expect("grant");
    assert!((low..high).contains(&first), "from the pool");
    assert!(srv.handle_request(sid, create_at(3, first, "granted"), NOW).results[0].is_ok());
}

#[test]
fn after_a_crash_no_pooled_inode_number_is_granted_twice_and_a_replayed_grant_is_the_same() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, wb) = srv.handle_hello(&hello(None));
    let (d, _) = srv.handle_hello(&hello(None));
    let (a, b, d) = (a.expect("a"), b.expect("b"), d.expect("d"));
    let p::ServerMessage::Welcome(wb) = wb else { panic!("{wb:?}") };
    let (pooled, n) = alloc(&mut srv, a, 1, 4096).expect("a's grant");
    let (d_first, _) = alloc(&mut srv, d, 1, 4096).expect("d's grant");
    srv.end_session(a);
    // b's grant from the pool is durable before it is answered.
    let r = srv.handle_request(b, req(1, vec![Op::AllocInodes { count: 4096 }]), NOW);
    assert_eq!(r.results[0], Ok(Reply::Inodes { first: pooled, count: n as u32 }));
    assert_eq!(r.durable, r.seq, "committed");
    // Its next grant, from the counter, is lost with the crash.
    let lost = alloc(&mut srv, b, 2, 4096).expect("from the counter");
    assert_eq!(lost.0, d_first + 4096);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    assert!(srv.sessions[&b].granted.as_ref().is_some_and(|g| g.contains(&(pooled..pooled + n))), "b's record");
    // A restored session that ends in the grace period leaves its grant to the pool; b's
    // replay still takes the counter's numbers, as it did before the crash.
    srv.end_session(d);
    assert_eq!(srv.inode_pool.pooled(0), 4096);
    assert_eq!(srv.handle_hello(&hello(Some(wb.session))).0, Some(b));
    assert_eq!(alloc(&mut srv, b, 2, 4096), Ok(lost), "the replay is granted what the client was told");
    srv.replayed(b, NOW);
    assert!(!srv.in_grace());
    // A new session draws d's numbers, never b's.
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    let (first, count) = alloc(&mut srv, c, 1, 4096).expect("c's grant");
    assert_eq!((first, count), (d_first, 4096));
    let (first, _) = alloc(&mut srv, c, 2, 4096).expect("c's grant");
    assert_eq!(first, lost.0 + 4096, "then the counter, past b's");
}

#[test]
fn a_session_is_resumed_only_by_the_identity_that_started_it() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello_as(&hello(None), Policy::trusted(), "alice");
    let a = a.expect("session");
    let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
    let made = srv.handle_request(a, create_in_root(1, "f"), NOW);
    assert!(made.results[0].is_ok());
    srv.heard(a, 0);
    srv.disconnected(a, 0);
    srv.take_outgoing();
    let refused = |srv: &mut Server, who: &str| {
        let (sid, msg) = srv.handle_hello_as(&hello(Some(w.session)), Policy::trusted(), who);
        let p::ServerMessage::Refused { reason, .. } = msg else { panic!("{who}: {msg:?}") };
        assert!(sid.is_none() && reason.contains("another client identity"), "{reason}");
    };
    refused(&mut srv, "mallory");
    refused(&mut srv, "");
    // The session did not notice: still away, nothing sent to it.
    assert!(srv.disconnected.contains_key(&a) && srv.take_outgoing().is_empty());
    assert_eq!(srv.sessions.len(), 1, "and no session was started for the refused");
    let (sid, msg) = srv.handle_hello_as(&hello(Some(w.session)), Policy::trusted(), "alice");
    assert_eq!(sid, Some(a));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, .. })), "{msg:?}");
    // After a crash the record says whose it is (once records keep it: `WRITE_IDENTITY`);
    // until then the first to resume it owns it.
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    if super::super::record::WRITE_IDENTITY {
        refused(&mut srv, "mallory");
        assert!(srv.in_grace() && srv.sessions[&a].awaiting_resume.is_some(), "still awaited");
    }
    let (sid, msg) = srv.handle_hello_as(&hello(Some(w.session)), Policy::trusted(), "alice");
    assert_eq!(sid, Some(a));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { durable_seq: Some(_), .. })), "{msg:?}");
    refused(&mut srv, "mallory");
}

#[test]
fn a_session_restored_from_a_record_without_identity_is_bound_to_its_first_resumer() {
    let disk = fresh_disk();
    let mut store = Store::open(Box::new(disk.clone())).expect("open");
    let old = Record {
        secret: 42,
        seq: 1,
        dataset: 0,
        holes: Vec::new(),
        grants: Some(Vec::new()),
        name: "old".into(),
        identity: None,
    };
    let bytes = encode_record(&old);
    assert_eq!(bytes[0], 3, "as written before records kept identities");
    store.put_session_record(5, &bytes).expect("put");
    store.commit().expect("commit");
    drop(store);
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    let token = p::SessionToken { id: 5, secret: 42 };
    assert_eq!(srv.handle_hello_as(&hello(Some(token)), Policy::trusted(), "alice").0, Some(5));
    let (sid, msg) = srv.handle_hello_as(&hello(Some(token)), Policy::trusted(), "mallory");
    assert!(sid.is_none() && matches!(msg, p::ServerMessage::Refused { .. }), "{msg:?}");
    // Its next change's record keeps the identity (once records keep it).
    assert!(srv.handle_request(5, create_in_root(1, "f"), NOW).results[0].is_ok());
    srv.store.commit().expect("commit");
    let records = srv.store.session_records().expect("records");
    let record = records.iter().find(|(id, _)| *id == 5).and_then(|(_, b)| decode_record(b)).expect("record");
    let kept = super::super::record::WRITE_IDENTITY.then_some("alice");
    assert_eq!(record.identity.as_deref(), kept);
}

#[test]
fn the_inode_pool_joins_neighbours_grants_from_its_largest_and_forgets_its_smallest_when_full() {
    let mut pool = inodes::InodePool::default();
    pool.give_back(3, 100..110);
    pool.give_back(3, 120..130);
    pool.give_back(3, 110..120);
    pool.give_back(4, 5..6);
    assert_eq!(pool.take(3, 1000), Some(100..130), "joined, and no more than it holds");
    assert_eq!(pool.take(3, 1), None);
    // Ranges a user of every other number leaves: the pool keeps a bounded number, the
    // largest.
    for i in 0..10_000u64 {
        pool.give_back(3, 1000 + 2 * i..1001 + 2 * i);
    }
    pool.give_back(3, 1 << 30..(1 << 30) + 500);
    assert!(pool.pooled(3) < 10_000 && pool.pooled(3) >= 500, "{}", pool.pooled(3));
    assert_eq!(pool.take(3, 400), Some(1 << 30..(1 << 30) + 400), "from the largest");
    assert_eq!(pool.take(3, 400), Some((1 << 30) + 400..(1 << 30) + 500));
    assert_eq!(pool.take(4, 9), Some(5..6), "datasets apart");
}

#[test]
fn sessions_dropped_together_are_fenced_with_one_commit() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let mut now_ms = 0;
    let n = 255;
    let mut sids = Vec::new();
    for i in 0..n {
        let (sid, _) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        // A change each: every one has a session record for its fencing to replace.
        assert!(srv.handle_request(sid, create_in_root(1, &format!("f{i}")), NOW).results[0].is_ok());
        sids.push(sid);
    }
    srv.tick(now_ms).expect("tick");
    srv.store.commit().expect("commit");
    let before = srv.store.generation();
    fence_by_absence(&mut srv, &sids, &mut now_ms);
    let commits = srv.store.generation() - before;
    assert_eq!(commits, 1, "{n} sessions fenced in one tick took {commits} commits");
    // The fencing is durable at once: after a crash right then, none of them comes back.
    drop(srv.into_store().abandon());
    let srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    let back: Vec<_> = sids.iter().filter(|s| srv.sessions.contains_key(s)).collect();
    assert!(back.is_empty(), "restored after their fencing: {back:?}");
}

/// The ids of the responses among `out` that go to `to`, in order.
fn answered_to(out: &[Outgoing], to: SessionId) -> Vec<u64> {
    out.iter()
        .filter_map(|o| match o {
            Outgoing::Response { session, response } if *session == to => Some(response.id),
            _ => None,
        })
        .collect()
}

#[test]
fn parked_requests_freed_together_run_a_slice_at_a_time_in_order_and_others_go_between() {
    let seed = seed();
    let mut rng = seed;
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    let (c, _) = srv.handle_hello(&hello(None));
    let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
    srv.set_contention_window(0);
    // a creates f: it holds it exclusively. b piles up lookups of it, parked.
    srv.handle(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
    let piled = PARKED_SLICE as u64 * 2 + 1 + next(&mut rng) % (PARKED_SLICE as u64 * 3);
    eprintln!("{piled} parked");
    // Some are reads of up to 4 MiB: a slice takes about `PARKED_SLICE_BYTES` of them.
    let mut bytes = std::collections::HashMap::new();
    for id in 1..=piled {
        let op = if next(&mut rng).is_multiple_of(3) {
            let len = 1 + (next(&mut rng) % (4 << 20)) as u32;
            bytes.insert(id, u64::from(len));
            Op::Read { ino: f.ino, offset: next(&mut rng) % 100_000, len }
        } else {
            Op::GetAttr { ino: f.ino }
        };
        srv.handle(b, req(id, vec![op]), NOW);
    }
    // A slice holds at most `PARKED_SLICE`, and stops taking more once at the budget;
    // whatever the budget, a slice moves no more than a few milliseconds' worth (16 MiB).
    let within = |slice: &[u64]| {
        let each = |id: &u64| bytes.get(id).copied().unwrap_or(0);
        let before_last: u64 = slice.iter().rev().skip(1).map(each).sum();
        let all: u64 = slice.iter().map(each).sum();
        !slice.is_empty() && slice.len() <= PARKED_SLICE && before_last < PARKED_SLICE_BYTES && all <= 16 << 20
    };
    let out = srv.take_outgoing();
    let recall_id = out
        .iter()
        .find_map(|o| match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == a => {
                Some(*recall_id)
            }
            _ => None,
        })
        .expect("a is asked to give f up");
    assert!(answered_to(&out, b).is_empty(), "parked");
    // a answers: one slice runs.
    srv.recall_done(a, recall_id, NOW);
    let mut got = answered_to(&srv.take_outgoing(), b);
    assert!(within(&got), "the first slice: {got:?}");
    assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "the first slice, in order");
    assert!(srv.has_parked_ready());
    // b's next request waits behind its older ones; c's does not wait behind b's.
    srv.handle(b, req(piled + 1, vec![Op::GetAttr { ino: f.ino }]), NOW);
    assert!(answered_to(&srv.take_outgoing(), b).is_empty(), "behind b's parked ones");
    srv.handle(c, req(1, vec![Op::GetAttr { ino: f.ino }]), NOW);
    assert_eq!(answered_to(&srv.take_outgoing(), c), vec![1], "c between the slices");
    let mut ticks = 0;
    while srv.has_parked_ready() {
        srv.tick(millis(NOW)).expect("tick");
        let slice = answered_to(&srv.take_outgoing(), b);
        assert!(slice.is_empty() || within(&slice), "one slice: {slice:?}");
        got.extend(slice);
        ticks += 1;
        assert!(ticks <= piled, "slices never end");
    }
    assert_eq!(got, (1..=piled + 1).collect::<Vec<_>>(), "every one, once, in the order sent");
}

#[test]
fn one_request_allocates_at_most_a_step_and_punches_any_length() {
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("session");
    srv.handle(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
    let step = p::MAX_FALLOCATE_STEP;
    for (id, flags) in [(2, 0), (3, p::FALLOC_FL_KEEP_SIZE), (4, p::FALLOC_FL_ZERO_RANGE)] {
        let r =
            srv.handle_request(a, req(id, vec![Op::Fallocate { ino: f.ino, offset: 0, len: step + 1, flags }]), NOW);
        assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(22), "flags {flags:#x}: {r:?}");
        assert_eq!(srv.store.getattr(f.ino).map(|i| (i.size, i.blocks)).ok(), Some((0, 0)), "nothing done");
    }
    // Nor in several ops of one request.
    let half = Op::Fallocate { ino: f.ino, offset: 0, len: step / 2 + 1, flags: 0 };
    let r = srv.handle_request(a, req(5, vec![half.clone(), half]), NOW);
    assert_eq!(r.results.iter().map(|r| r.as_ref().err().map(|e| e.errno)).collect::<Vec<_>>(), vec![Some(22)]);
    assert_eq!(srv.store.getattr(f.ino).map(|i| (i.size, i.blocks)).ok(), Some((0, 0)), "nothing done");
    // (A 16 MiB image: a step within it, then a hole punched far longer than a step.)
    let len = 1 << 20;
    let r = srv.handle_request(a, req(6, vec![Op::Fallocate { ino: f.ino, offset: 0, len, flags: 0 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
    let punch = p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_KEEP_SIZE;
    let op = Op::Fallocate { ino: f.ino, offset: 0, len: 4 * step, flags: punch };
    let r = srv.handle_request(a, req(7, vec![op]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
    assert_eq!(srv.store.getattr(f.ino).map(|i| (i.size, i.blocks)).ok(), Some((len, 0)));
}

#[test]
fn a_write_by_a_caller_without_root_takes_setuid_away_though_its_client_did_not() {
    // (A client that skips the SetAttr a mount sends first: the server clears them itself.)
    let mut rng = seed();
    let mut srv = roomy_server();
    let (sid, _) = srv.handle_hello(&hello(None));
    let sid = sid.expect("session");
    let nobody = p::Caller { uid: 65534, gid: 65534, groups: Vec::new() };
    let member = p::Caller { uid: 65534, gid: 65534, groups: vec![50] };
    let mut id = 100;
    for n in 0..200 {
        let mode = [0o4777, 0o6777, 0o2777, 0o2767, 0o4755, 0o6707, 0o2757, 0o0777, 0o1777]
            [next(&mut rng) as usize % 9]
            | 0o022;
        let name = format!("f{n}");
        let r = srv.handle_request(sid, make_in_root(id, &name, p::FileType::Regular, 0o666), NOW);
        let Ok(Reply::Entry(a)) = &r.results[0] else { panic!("{r:?}") };
        let f = a.ino;
        let set = p::SetAttr { mode: Some(mode), gid: Some(50), ..Default::default() };
        let r = srv.handle_request(sid, req(id + 1, vec![Op::SetAttr { ino: f, set }]), NOW);
        assert!(r.results[0].is_ok(), "{r:?}");
        let root = p::Caller::ROOT;
        let (who, caller) = [("nobody", &nobody), ("a member", &member), ("root", &root)][n % 3];
        let at = next(&mut rng) % 100_000;
        let len = 1 + next(&mut rng) % 70_000;
        let op = match next(&mut rng) % 6 {
            0 => Op::Write { ino: f, offset: at, data: vec![7; len as usize] },
            1 => Op::Append { ino: f, data: vec![7; len as usize] },
            2 => Op::Fallocate { ino: f, offset: at, len, flags: 0 },
            3 => Op::Fallocate { ino: f, offset: at, len, flags: p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_KEEP_SIZE },
            4 => Op::SetAttr { ino: f, set: p::SetAttr { size_bytes: Some(at), ..Default::default() } },
            _ => Op::WriteBack { ino: f, offset: at, data: vec![7; len as usize] },
        };
        let what = format!("{} of mode {mode:o} by {who}", op.name());
        let r = srv.handle_request(sid, req_as(id + 2, caller, vec![op.clone()]), NOW);
        assert!(r.results[0].is_ok(), "{what}: {r:?}");
        let r = srv.handle_request(sid, req(id + 3, vec![Op::GetAttr { ino: f }]), NOW);
        let Ok(Reply::Attr(a)) = &r.results[0] else { panic!("{r:?}") };
        // Linux's rule, written out: setuid goes; setgid with group execute, or from a
        // writer outside the group; root keeps both; a mapping's writeback takes nothing.
        let kills = caller.uid != 0 && !matches!(op, Op::WriteBack { .. });
        let mut want = mode;
        if kills {
            want &= !0o4000;
            if mode & 0o2010 == 0o2010 || (mode & 0o2000 != 0 && !caller.in_group(50)) {
                want &= !0o2000;
            }
        }
        assert_eq!(a.mode & 0o7777, want, "{what}");
        id += 4;
    }
}

#[test]
fn a_request_carries_at_most_a_bounded_number_of_locks_and_is_refused_whole_past_it() {
    let mut rng = seed();
    let mut srv = server();
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("session");
    srv.handle(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
    let open = Op::Open { ino: f.ino, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE };
    assert!(srv.handle_request(a, req(2, vec![open]), NOW).results[0].is_ok());
    let lock = |i: u64| Op::SetLock {
        ino: f.ino,
        owner: 1,
        start: 2 * i,
        end: 2 * i,
        kind: p::LockKind::Write,
        flock: false,
        pid: 1,
    };
    // Other operations around the locks do not count.
    let others = (next(&mut rng) % 100) as usize;
    let mut ops: Vec<Op> = (0..p::MAX_LOCK_OPS_PER_REQUEST as u64 + 1).map(lock).collect();
    ops.extend((0..others).map(|_| Op::GetAttr { ino: f.ino }));
    let r = srv.handle_request(a, req(3, ops.clone()), NOW);
    assert_eq!(r.results.len(), 1, "refused whole: {r:?}");
    assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(7));
    assert!(srv.locks.held(f.ino, locks::Holder { session: a, owner: 1 }, false).is_empty(), "none taken");
    ops.remove(0);
    let r = srv.handle_request(a, req(4, ops), NOW);
    assert!(r.results.iter().all(Result::is_ok), "{} locks and {others} others: {r:?}", p::MAX_LOCK_OPS_PER_REQUEST);
    let held = srv.locks.held(f.ino, locks::Holder { session: a, owner: 1 }, false);
    assert_eq!(held.len(), p::MAX_LOCK_OPS_PER_REQUEST);
}

#[test]
fn sessions_dropped_together_lose_their_shared_rights_once_for_each_time_they_drop() {
    let mut rng = seed();
    let mut srv = server();
    let n = 50 + (next(&mut rng) % 250) as usize;
    let mut tokens = Vec::new();
    let sessions: Vec<SessionId> = (0..n)
        .map(|_| {
            let (sid, w) = srv.handle_hello(&hello(None));
            let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
            tokens.push(w.session);
            sid.expect("session")
        })
        .collect();
    // Each reads the root (shared rights on it).
    for (i, &s) in sessions.iter().enumerate() {
        let r = srv.handle_request(s, req(1, vec![Op::GetAttr { ino: 1 }]), NOW);
        assert!(r.results[0].is_ok(), "session {i}: {r:?}");
    }
    assert_eq!(srv.caps.holders_of(1).len(), n);
    let t0 = millis(NOW);
    for &s in &sessions {
        srv.disconnected(s, t0);
    }
    // Not yet; then all at once.
    srv.tick(t0 + crate::caps::DISCONNECTED_HOLDER_MS - 1).expect("tick");
    assert_eq!(srv.caps.holders_of(1).len(), n, "still within the holder delay");
    srv.tick(t0 + crate::caps::DISCONNECTED_HOLDER_MS).expect("tick");
    assert!(srv.caps.holders_of(1).is_empty(), "lapsed together");
    // One comes back (before the fencing delay), reads again, and drops again: its
    // rights lapse again, a holder delay after the second drop.
    let which = (next(&mut rng) as usize) % n;
    let (back, token) = (sessions[which], tokens[which]);
    let t1 = t0 + crate::caps::DISCONNECTED_HOLDER_MS + 1;
    let (resumed, _) = srv.handle_hello(&hello(Some(token)));
    assert_eq!(resumed, Some(back));
    let r = srv.handle_request(back, req(2, vec![Op::GetAttr { ino: 1 }]), NOW);
    assert!(r.results[0].is_ok(), "{r:?}");
    assert_eq!(srv.caps.holders_of(1), vec![back]);
    // (No tick between: the drop follows the return at once.)
    srv.disconnected(back, t1);
    srv.tick(t1 + crate::caps::DISCONNECTED_HOLDER_MS - 1).expect("tick");
    assert_eq!(srv.caps.holders_of(1), vec![back], "its new rights stand within the delay");
    srv.tick(t1 + crate::caps::DISCONNECTED_HOLDER_MS).expect("tick");
    assert!(srv.caps.holders_of(1).is_empty(), "and lapse after its second drop too");
}

#[test]
fn the_rights_on_a_file_go_with_it_when_it_is_freed() {
    let mut rng = seed();
    let (mut srv, a, b) = two_sessions();
    let n = 1 + next(&mut rng) % 200;
    for i in 0..n {
        let name = format!("f{i}");
        let r = srv.handle_request(a, create_in_root(10 * i + 1, &name), NOW);
        let Ok(Reply::Entry(f)) = &r.results[0] else { panic!("{r:?}") };
        let f = f.ino;
        let r = srv.handle_request(a, req(10 * i + 2, vec![Op::GetAttr { ino: f }]), NOW);
        assert!(r.results[0].is_ok());
        assert!(!srv.caps.holders_of(f).is_empty(), "a holds what it made and read");
        let unlink = Op::Unlink { parent: 1, name: name.into_bytes() };
        // Removed through the request step a client's requests take.
        let by = if next(&mut rng).is_multiple_of(2) { a } else { b };
        srv.handle(by, req(10 * i + 3, vec![unlink]), NOW);
        let _ = srv.take_outgoing();
        if srv.store.getattr(f).is_err() {
            assert!(srv.caps.holders_of(f).is_empty(), "file {i} freed, rights kept");
        }
    }
}
