//! The client's batching rules against the real server: setattrs of one file joined into
//! one (`crest_client::batch::join_setattr`) leave it as the same setattrs sent one by
//! one do — for root and for an owner who is not root, with random modes (set-user-ID,
//! set-group-ID, sticky), owners, groups, sizes and times given or "now", at clocks that
//! repeat or move on. (The client links no server; this crate links both.)
//! `CREST_BATCH_SEED` runs one seed; otherwise a random one, printed.

use crest_client::batch::join_setattr;
use crest_proto as p;
use crest_rng::Stream;
use crest_server::{Outgoing, Server, SessionId};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

/// The server's clock; the clients' stay within a second of it (inside the allowed skew).
const NOW: p::Time = p::Time { sec: 1_000_000, nsec: 0 };

fn server() -> (Server, SessionId) {
    let disk = MemDisk::new(16 << 20);
    let opts = MkfsOptions { now: Timespec::new(1, 0), fsid: Some([7; 16]), seed: Some(1), meta_copies: 2 };
    Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("open"));
    let hello = p::Hello {
        magic: p::HELLO_MAGIC,
        version: p::PROTOCOL_VERSION,
        client_name: "batching".into(),
        resume: None,
        dataset: String::new(),
    };
    let (session, _) = srv.handle_hello(&hello);
    (srv, session.expect("a session"))
}

/// Sends request `id` and returns its results.
fn send(
    srv: &mut Server,
    s: SessionId,
    id: u64,
    ops: Vec<p::Op>,
    time: Option<p::Time>,
    caller: &p::Caller,
) -> Vec<Result<p::Reply, p::OpError>> {
    srv.handle(s, p::Request { id, ops, time, caller: caller.clone() }, NOW);
    let out = srv.take_outgoing();
    out.into_iter()
        .find_map(|o| match o {
            Outgoing::Response { response, .. } if response.id == id => Some(response.results),
            _ => None,
        })
        .expect("an answer")
}

/// A fresh server with one file of 100 bytes owned by `owner`; the file's inode.
fn with_file(owner: &p::Caller) -> (Server, SessionId, u64) {
    let (mut srv, s) = server();
    let cred = p::Cred { uid: 0, gid: 0, umask: 0 };
    let create =
        p::Op::Create { parent: 1, name: b"f".to_vec(), kind: p::FileType::Regular, mode: 0o644, rdev: 0, cred };
    let Ok(p::Reply::Entry(a)) = &send(&mut srv, s, 1, vec![create], None, &p::Caller::ROOT)[0] else {
        panic!("create")
    };
    let ino = a.ino;
    let set = p::SetAttr { uid: Some(owner.uid), gid: Some(owner.gid), ..Default::default() };
    let ops = vec![p::Op::Write { ino, offset: 0, data: vec![7; 100] }, p::Op::SetAttr { ino, set }];
    assert!(send(&mut srv, s, 2, ops, None, &p::Caller::ROOT).iter().all(Result::is_ok));
    (srv, s, ino)
}

fn attrs(srv: &mut Server, s: SessionId, id: u64, ino: u64) -> p::Attr {
    match &send(srv, s, id, vec![p::Op::GetAttr { ino }], None, &p::Caller::ROOT)[0] {
        Ok(p::Reply::Attr(a)) => a.clone(),
        other => panic!("getattr: {other:?}"),
    }
}

/// A random setattr an owner might send (through tar, chmod, chown, touch, truncate).
fn random_set(rng: &mut Stream, owner: &p::Caller) -> p::SetAttr {
    let mut set = p::SetAttr::default();
    let pick = |rng: &mut Stream, v: &[u32]| v[rng.below(v.len() as u64) as usize];
    let time = |rng: &mut Stream| match rng.below(3) {
        0 => p::SetTime::Now,
        _ => {
            p::SetTime::At(p::Time { sec: 900_000 + rng.below(200_000) as i64, nsec: rng.below(1_000_000_000) as u32 })
        }
    };
    while set == p::SetAttr::default() {
        if rng.below(3) == 0 {
            set.mode = Some(pick(rng, &[0o644, 0o755, 0o4755, 0o2755, 0o6711, 0o2745, 0o1777, 0o600, 0o4750]));
        }
        if rng.below(3) == 0 {
            set.uid = Some(if owner.uid == 0 { pick(rng, &[0, 7, 1000]) } else { owner.uid });
        }
        if rng.below(3) == 0 {
            set.gid = Some(if owner.uid == 0 { pick(rng, &[0, 7, 1000]) } else { pick(rng, &[owner.gid, 2000]) });
        }
        if rng.below(6) == 0 {
            set.size_bytes = Some(rng.below(5_000));
        }
        if rng.below(3) == 0 {
            set.atime = Some(time(rng));
        }
        if rng.below(3) == 0 {
            set.mtime = Some(time(rng));
        }
    }
    set
}

#[test]
fn joined_setattrs_leave_a_file_as_the_same_setattrs_one_by_one() {
    let seed = match std::env::var("CREST_BATCH_SEED") {
        Ok(s) => s.parse().expect("CREST_BATCH_SEED: a number"),
        Err(_) => crest_rng::next_u64(),
    };
    eprintln!("batching: seed {seed} (CREST_BATCH_SEED={seed} to run it again)");
    let mut rng = Stream::from_seed_u64(seed);
    let owners = [p::Caller::ROOT, p::Caller { uid: 1000, gid: 1000, groups: vec![1000, 2000] }];
    let (mut joins, mut compared) = (0, 0);
    for round in 0..300 {
        let owner = &owners[round % 2];
        let n = 2 + rng.below(4) as usize;
        let mut clock = NOW.sec - 1;
        let calls: Vec<(p::SetAttr, p::Time)> = (0..n)
            .map(|_| {
                clock += rng.below(2) as i64; // the same clock, or a later one
                (random_set(&mut rng, owner), p::Time { sec: clock, nsec: 0 })
            })
            .collect();
        // One by one, as a client that answered none of them itself.
        let (mut srv, s, ino) = with_file(owner);
        let mut all_ok = true;
        for (i, (set, t)) in calls.iter().enumerate() {
            let op = p::Op::SetAttr { ino, set: set.clone() };
            all_ok &= send(&mut srv, s, 10 + i as u64, vec![op], Some(*t), owner)[0].is_ok();
        }
        if !all_ok {
            // The mount answers (and joins) only what the server would let through.
            continue;
        }
        let one_by_one = attrs(&mut srv, s, 99, ino);
        // Joined where the rule allows, as the merger does: an `At` where the clock moves.
        let mut ops = vec![p::Op::SetAttr { ino, set: calls[0].0.clone() }];
        let (mut base_time, mut at) = (Some(calls[0].1), Some(calls[0].1));
        for (set, t) in &calls[1..] {
            let next = [p::Op::SetAttr { ino, set: set.clone() }];
            if join_setattr(&mut ops, &mut base_time, &mut at, &next, Some(*t)) {
                joins += 1;
                continue;
            }
            if at != Some(*t) {
                ops.push(p::Op::At { time: *t });
                at = Some(*t);
            }
            ops.extend(next);
        }
        let (mut srv, s, ino2) = with_file(owner);
        assert_eq!(ino2, ino);
        let results = send(&mut srv, s, 10, ops.clone(), base_time, owner);
        assert!(
            results.iter().all(Result::is_ok),
            "seed {seed} round {round}: {calls:?} joined as {ops:?}: {results:?}"
        );
        let joined = attrs(&mut srv, s, 99, ino);
        assert_eq!(joined, one_by_one, "seed {seed} round {round}: {calls:?} joined as {ops:?}");
        compared += 1;
    }
    eprintln!("batching: {compared} sequences compared, {joins} setattrs joined");
    assert!(compared > 100 && joins > 100, "the cases cover too little: {compared} compared, {joins} joined");
}
