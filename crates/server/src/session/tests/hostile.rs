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
