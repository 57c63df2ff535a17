//! After a restart or a lost connection: replays, re-asserts, the grace period, resumes.

use super::*;

#[test]
fn after_a_restart_no_one_sees_older_state_than_another_clients_lost_acknowledged_change() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let token = |m: p::ServerMessage| match m {
        p::ServerMessage::Welcome(w) => w.session,
        other => panic!("{other:?}"),
    };
    let (a, wa) = srv.handle_hello(&hello(None));
    let (b, wb) = srv.handle_hello(&hello(None));
    let (a, b, ta, tb) = (a.expect("a"), b.expect("b"), token(wa), token(wb));
    let mk = create_in_root;
    let lookup = |id, name: &str| p::Request {
        id,
        ops: vec![Op::Lookup { parent: 1, name: name.as_bytes().to_vec() }],
        time: None,
        caller: p::Caller::ROOT,
    };
    srv.handle_request(a, mk(1, "w"), NOW);
    srv.handle_request(b, mk(1, "y"), NOW);
    srv.handle_request(
        b,
        p::Request { id: 2, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    // a's create of x is acknowledged, then the server dies before committing it.
    let lost = srv.handle_request(a, mk(2, "x"), NOW);
    assert!(lost.results[0].is_ok() && lost.seq > lost.durable);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    srv.tick(millis(NOW)).expect("tick");
    // b comes back first, has nothing to replay, and looks for x: it must wait.
    srv.handle_hello(&hello(Some(tb)));
    srv.replayed(b, NOW);
    srv.handle(b, lookup(3, "x"), NOW);
    assert!(srv.take_outgoing().is_empty(), "b's look waits while a has not replayed");
    // a comes back and replays its acknowledged create, then says so.
    let (_, msg) = srv.handle_hello(&hello(Some(ta)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { durable_seq: Some(1), .. })));
    srv.handle(a, mk(2, "x"), NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == a), "a's replay runs: {out:?}");
    srv.replayed(a, NOW);
    // (The replayed create made x a's alone again: b's look recalls it first.)
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(*session, a);
    srv.recall_done(a, *recall_id, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(*session, b);
    assert!(matches!(&response.results[0], Ok(Reply::Lookup { attr: Some(_), .. })), "b sees a's x: {response:?}");
}

#[test]
fn a_refused_oversized_change_still_takes_its_place_in_the_sessions_order() {
    let mut srv = Server::new(Store::open(Box::new(fresh_disk())).expect("open"));
    let (a, _) = srv.handle_hello(&hello(None));
    let a = a.expect("a");
    assert_eq!(srv.handle_request(a, create_in_root(1, "x"), NOW).seq, 1);
    let unlink = Op::Unlink { parent: 1, name: b"nothing".to_vec() };
    let big = p::Request { id: 2, ops: vec![unlink; p::MAX_OPS_PER_REQUEST + 1], time: None, caller: p::Caller::ROOT };
    let r = srv.handle_request(a, big, NOW);
    assert!(matches!(&r.results[..], [Err(e)] if e.errno == 7), "{r:?}");
    assert_eq!(r.seq, 2, "the client counted it as its second change");
    assert_eq!(srv.handle_request(a, create_in_root(3, "y"), NOW).seq, 3);
}

#[test]
fn no_session_builds_on_another_sessions_change_that_a_crash_could_take_back() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    let look = |id, name: &str| p::Request {
        id,
        ops: vec![Op::Lookup { parent: 1, name: name.as_bytes().to_vec() }],
        time: None,
        caller: p::Caller::ROOT,
    };
    let found = |r: &p::Response| matches!(&r.results[0], Ok(Reply::Lookup { attr: Some(_), .. }));
    // (Each session's first change commits its record first: get those out of the way.)
    srv.handle_request(a, create_in_root(10, "a0"), NOW);
    srv.handle_request(b, create_in_root(10, "b0"), NOW);
    srv.handle_request(
        b,
        p::Request { id: 11, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    let settled = srv.settling_commits;
    // a's own changes pile up without a commit, and b may look at them...
    assert!(srv.handle_request(a, create_in_root(1, "x"), NOW).results[0].is_ok());
    let r = srv.handle_request(a, create_in_root(2, "y"), NOW);
    assert!(r.seq > r.durable, "not durable yet");
    assert!(found(&srv.handle_request(b, look(1, "x"), NOW)));
    assert_eq!(srv.settling_commits, settled, "a look changes nothing a replay could reorder");
    // ...but b's change in the same directory is committed, with a's, before b is answered.
    let r = srv.handle_request(b, create_in_root(2, "z"), NOW);
    assert!(r.results[0].is_ok() && r.seq == r.durable, "{r:?}");
    assert_eq!(srv.settling_commits, settled + 1);
    // a's next change finds nothing of b's unsettled; w is a's alone, lost in the crash.
    assert!(srv.handle_request(a, create_in_root(4, "w"), NOW).results[0].is_ok());
    assert_eq!(srv.settling_commits, settled + 1);
    let r = srv.handle_request(
        b,
        p::Request { id: 3, ops: vec![Op::GetAttr { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    assert!(r.results[0].is_ok());
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    for (id, name) in [(1, "x"), (2, "y"), (3, "z")] {
        assert!(found(&srv.handle_request(c, look(id, name), NOW)), "{name} was seen by another session: durable");
    }
    assert!(!found(&srv.handle_request(c, look(4, "w"), NOW)), "w was a's alone");
}

/// A server on `disk` with one session (its welcome too) that made "f" in the root.
fn a_session_that_made_f(disk: &MemDisk) -> (Server, SessionId, p::Welcome, u64) {
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello(&hello(None));
    let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
    let a = a.expect("session");
    let made = srv.handle_request(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = &made.results[0] else { panic!("{made:?}") };
    (srv, a, w, f.ino)
}

#[test]
fn rights_held_before_a_restart_are_given_back_while_their_session_replays() {
    let disk = fresh_disk();
    let (mut srv, a, wa, f) = a_session_that_made_f(&disk);
    srv.handle_request(
        a,
        p::Request { id: 2, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    srv.tick(millis(NOW)).expect("tick");
    assert_eq!(srv.caps.exclusive_elsewhere(0, f), None, "rights live in memory only");
    // b is new: re-asserting is not for it, and its look at f waits for the grace.
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("b");
    let reassert = |id, ino, exclusive| p::Request {
        id,
        ops: vec![Op::Reassert { ino, exclusive }],
        time: None,
        caller: p::Caller::ROOT,
    };
    srv.handle(b, reassert(1, 1, false), NOW);
    srv.handle(b, p::Request { id: 2, ops: vec![Op::GetAttr { ino: f }], time: None, caller: p::Caller::ROOT }, NOW);
    assert!(srv.take_outgoing().is_empty(), "b's requests wait for a's replay");
    // a resumes and takes back X on f and S on the root.
    srv.handle_hello(&hello(Some(wa.session)));
    let r = srv.handle_request(
        a,
        p::Request {
            id: 10,
            ops: vec![Op::Reassert { ino: f, exclusive: true }, Op::Reassert { ino: 1, exclusive: false }],
            time: None,
            caller: p::Caller::ROOT,
        },
        NOW,
    );
    assert_eq!(r.results, vec![Ok(Reply::Done), Ok(Reply::Done)]);
    assert_eq!(r.seq, 0, "no change: no place in the order");
    assert_eq!(srv.caps.exclusive_elsewhere(b, f), Some(a));
    srv.replayed(a, NOW);
    // Grace over: b's re-assert is refused, and b's look at f recalls a first.
    let out = srv.take_outgoing();
    let refused = out.iter().any(|o| matches!(o, Outgoing::Response { session, response } if *session == b && response.id == 1 && matches!(&response.results[0], Err(e) if e.errno == 22)));
    assert!(refused, "{out:?}");
    let recall = out.iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }
            if *session == a && inodes.contains(&f) =>
        {
            Some(*recall_id)
        }
        _ => None,
    });
    let recall = recall.unwrap_or_else(|| panic!("a is asked to give f up: {out:?}"));
    assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { response, .. } if response.id == 2)), "b waits for a");
    srv.recall_done(a, recall, NOW);
    let out = srv.take_outgoing();
    assert!(
        matches!(&out[..], [Outgoing::Response { session, response }] if *session == b && response.results[0].is_ok()),
        "{out:?}"
    );
}

#[test]
fn a_reassert_is_refused_when_another_session_holds_the_inode() {
    let mut caps = crate::caps::Caps::default();
    caps.grant(2, [7]);
    assert_eq!(caps.reassert(1, 7, true), Err(2), "X conflicts with b's S");
    assert_eq!(caps.reassert(1, 7, false), Ok(()), "S does not");
    caps.grant_exclusive(2, 8);
    assert_eq!(caps.reassert(1, 8, false), Err(2), "nothing is given back over b's X");
    assert_eq!(caps.reassert(2, 8, true), Ok(()), "b's own again");
}

#[test]
fn the_grace_period_ends_without_clients_that_never_come_back() {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, _) = srv.handle_hello(&hello(None));
    srv.handle_request(
        a.expect("a"),
        p::Request { id: 1, ops: vec![Op::Fsync { ino: 1 }], time: None, caller: p::Caller::ROOT },
        NOW,
    );
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    srv.tick(0).expect("tick");
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    srv.handle(c, p::Request { id: 1, ops: vec![Op::GetAttr { ino: 1 }], time: None, caller: p::Caller::ROOT }, NOW);
    srv.tick(crate::caps::GRACE_MS - 1).expect("tick");
    assert!(srv.take_outgoing().is_empty(), "held during the grace period");
    srv.heard(c, crate::caps::GRACE_MS);
    srv.tick(crate::caps::GRACE_MS).expect("tick");
    assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == c));
}

/// Request `id`: a `kind` lock of `owner` on the whole of inode 1 (fcntl, or flock).
fn lock_root(id: u64, owner: u64, kind: p::LockKind, flock: bool) -> p::Request {
    p::Request {
        id,
        ops: vec![Op::SetLock { ino: 1, owner, start: 0, end: p::LOCK_TO_EOF, kind, flock, pid: 42 }],
        time: None,
        caller: p::Caller::ROOT,
    }
}

/// A server with session a holding an fcntl write lock and an flock lock on inode 1
/// (and having changed nothing), restarted after a commit: a's token.
fn restarted_with_a_lock_holder(disk: &MemDisk) -> (Server, SessionId, p::SessionToken) {
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello(&hello(None));
    let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
    let a = a.expect("a");
    for (id, flock) in [(1, false), (2, true)] {
        let r = srv.handle_request(a, lock_root(id, 7, p::LockKind::Write, flock), NOW);
        assert_eq!(r.results[0], Ok(Reply::Done));
    }
    // The lock gave a its record (it changed nothing), committed at once.
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    assert!(srv.locks.is_empty(), "locks live in memory only");
    srv.tick(millis(NOW)).expect("tick");
    (srv, a, w.session)
}

#[test]
fn a_lock_taken_again_in_the_grace_period_beats_a_new_sessions_conflicting_lock() {
    let disk = fresh_disk();
    let (mut srv, a, ta) = restarted_with_a_lock_holder(&disk);
    // b is first back and wants both locks: new work, held for the grace period.
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("b");
    srv.handle(b, lock_root(1, 9, p::LockKind::Write, false), NOW);
    srv.handle(b, lock_root(2, 9, p::LockKind::Read, true), NOW);
    let test = Op::GetLock { ino: 1, owner: 9, start: 0, end: 0, kind: p::LockKind::Read, flock: false };
    srv.handle(b, p::Request { id: 3, ops: vec![test], time: None, caller: p::Caller::ROOT }, NOW);
    assert!(srv.take_outgoing().is_empty(), "b waits while a has not taken its locks again");
    // a resumes (its record was restored) and takes its locks again: they run at once,
    // as no change: no seq, nothing in the reply cache.
    let (_, msg) = srv.handle_hello(&hello(Some(ta)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, durable_seq: Some(0), .. })));
    let relock = p::Request {
        id: 100,
        ops: vec![
            Op::SetLock {
                ino: 1,
                owner: 7,
                start: 0,
                end: p::LOCK_TO_EOF,
                kind: p::LockKind::Write,
                flock: false,
                pid: 42,
            },
            Op::SetLock {
                ino: 1,
                owner: 7,
                start: 0,
                end: p::LOCK_TO_EOF,
                kind: p::LockKind::Write,
                flock: true,
                pid: 42,
            },
        ],
        time: None,
        caller: p::Caller::ROOT,
    };
    srv.handle(a, relock, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(*session, a);
    assert_eq!(response.results, vec![Ok(Reply::Done), Ok(Reply::Done)]);
    assert_eq!(response.seq, 0, "a lock is no stored change");
    assert!(srv.sessions[&a].replies.is_empty(), "nor is it kept for a retry");
    // a has replayed: b's requests run now, and meet a's locks.
    srv.replayed(a, NOW);
    let out = srv.take_outgoing();
    let answers: Vec<(u64, &p::Response)> = out
        .iter()
        .map(|o| match o {
            Outgoing::Response { session, response } => (*session, response),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(answers.iter().map(|(s, r)| (*s, r.id)).collect::<Vec<_>>(), vec![(b, 1), (b, 2), (b, 3)]);
    for (_, r) in &answers[..2] {
        assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(11), "{r:?}");
    }
    let want = p::LockInfo { kind: p::LockKind::Write, start: 0, end: p::LOCK_TO_EOF, pid: 42 };
    assert_eq!(answers[2].1.results[0], Ok(Reply::Lock(Some(want))));
    // Once a lets go, b gets them.
    srv.handle(a, lock_root(101, 7, p::LockKind::Unlock, false), NOW);
    srv.handle(a, lock_root(102, 7, p::LockKind::Unlock, true), NOW);
    srv.handle(b, lock_root(4, 9, p::LockKind::Write, false), NOW);
    srv.handle(b, lock_root(5, 9, p::LockKind::Read, true), NOW);
    let out = srv.take_outgoing();
    assert_eq!(out.len(), 4);
    for o in &out {
        assert!(matches!(o, Outgoing::Response { response, .. } if response.results[0].is_ok()), "{o:?}");
    }
}

#[test]
fn a_lock_not_taken_again_within_the_grace_period_is_lost() {
    let disk = fresh_disk();
    let (mut srv, a, ta) = restarted_with_a_lock_holder(&disk);
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("b");
    srv.handle(b, lock_root(1, 9, p::LockKind::Write, false), NOW);
    srv.tick(millis(NOW) + crate::caps::GRACE_MS - 1).expect("tick");
    assert!(srv.take_outgoing().is_empty(), "held during the grace period");
    srv.heard(b, millis(NOW) + crate::caps::GRACE_MS);
    srv.tick(millis(NOW) + crate::caps::GRACE_MS).expect("tick");
    let out = srv.take_outgoing();
    assert!(
        matches!(&out[..], [Outgoing::Response { session, response }] if *session == b && response.results[0].is_ok()),
        "a never came back: b gets the lock: {out:?}"
    );
    // a's client comes back late: it was fenced when the grace period ended, and is
    // told so (its locks are lost, as a client's cut off past its lease).
    let (_, msg) = srv.handle_hello(&hello(Some(ta)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })), "{msg:?}");
    srv.handle(a, lock_root(100, 7, p::LockKind::Write, false), NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Notify { notify: p::Notify::Fenced, .. }]), "{out:?}");
}

#[test]
fn a_fenced_session_is_not_restored_after_a_restart() {
    // Its record's removal is committed with the fencing: a restart right after it
    // (well inside the commit interval) does not bring it back.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello(&hello(None));
    let (a, p::ServerMessage::Welcome(w)) = (a.expect("a"), w) else { panic!("no welcome") };
    let a_token = w.session;
    srv.handle_request(a, lock_root(1, 7, p::LockKind::Write, false), NOW);
    srv.heard(a, 1_000);
    srv.disconnected(a, 1_000);
    srv.tick(1_000 + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
    assert!(srv.is_fenced(a));
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    assert!(srv.sessions.is_empty() && srv.replaying.is_empty(), "nothing to wait for");
    // Its client, back after the restart, is told its session was fenced (it must not
    // send its unanswered work again in a new session); told again after another restart
    // (that welcome may have been lost with its connection), until the marker expires.
    let (_, msg) = srv.handle_hello(&hello(Some(a_token)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })), "{msg:?}");
    srv.store_mut().commit().expect("commit");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    let (_, msg) = srv.handle_hello(&hello(Some(a_token)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })), "{msg:?}");
    srv.tick(1).expect("tick");
    srv.tick(2 + RESTORED_SESSION_GRACE_MS).expect("tick");
    srv.store_mut().commit().expect("commit");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    let (_, msg) = srv.handle_hello(&hello(Some(a_token)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: false, .. })), "{msg:?}");
    assert!(srv.store.session_records().expect("records").len() <= 2, "only the new sessions', if any");
}

#[test]
fn a_restart_welcome_lost_with_its_connection_is_given_again() {
    // The client never saw the first welcome, took the second for a plain resume and sent a
    // kept change again.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, w) = srv.handle_hello(&hello(None));
    let (a, p::ServerMessage::Welcome(w)) = (a.expect("a"), w) else { panic!("no welcome") };
    let chmod = Op::SetAttr { ino: 1, set: p::SetAttr { mode: Some(0o700), ..Default::default() } };
    srv.handle(a, p::Request { id: 1, ops: vec![chmod], time: None, caller: p::Caller::ROOT }, NOW);
    srv.store_mut().commit().expect("commit");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    let durable = |m: p::ServerMessage| match m {
        p::ServerMessage::Welcome(w) => (w.resumed, w.durable_seq),
        other => panic!("{other:?}"),
    };
    let resume = hello(Some(w.session));
    assert_eq!(durable(srv.handle_hello(&resume).1), (true, Some(1)));
    assert_eq!(durable(srv.handle_hello(&resume).1), (true, Some(1)), "nothing heard since: told again");
    srv.replayed(a, NOW);
    assert_eq!(durable(srv.handle_hello(&resume).1), (true, None), "the client had it: a plain resume");
}

/// a holds d exclusively; b's lookup in d recalls it, but a's connection is gone, so
/// the notice is lost (the shell has nowhere to send it).
fn recall_lost_with_the_connection() -> (Server, SessionId, SessionId, p::SessionToken, u64) {
    let mut srv = server();
    let (a, w) = srv.handle_hello(&hello(None));
    let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
    let (b, _) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    let mkdir = Op::Create {
        parent: 1,
        name: b"d".to_vec(),
        kind: p::FileType::Directory,
        mode: 0o755,
        rdev: 0,
        cred: p::Cred::default(),
    };
    srv.handle(a, p::Request { id: 1, ops: vec![mkdir], time: None, caller: p::Caller::ROOT }, NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    let Ok(Reply::Entry(d)) = &response.results[0] else { panic!("{response:?}") };
    let d = d.ino;
    srv.disconnected(a, millis(NOW));
    let lookup = p::Request {
        id: 1,
        ops: vec![Op::Lookup { parent: d, name: b"x".to_vec() }],
        time: None,
        caller: p::Caller::ROOT,
    };
    srv.handle(b, lookup, NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Notify { session, .. }] if *session == a), "{out:?}");
    (srv, a, b, w.session, d)
}

#[test]
fn a_recall_lost_with_the_connection_is_sent_again_when_the_session_resumes() {
    let (mut srv, a, b, token, d) = recall_lost_with_the_connection();
    // a comes back within the deadline: it must hear the recall again, or it keeps
    // answering from d as its own while the server waits for nothing.
    let (again, _) = srv.handle_hello(&hello(Some(token)));
    assert_eq!(again, Some(a));
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected the recall again: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
    srv.recall_done(a, *recall_id, NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
}

#[test]
fn an_exclusive_recall_is_sent_again_on_a_late_resume_and_its_holder_fenced_if_it_stays_away() {
    let (mut srv, a, b, token, d) = recall_lost_with_the_connection();
    // Past the recall's deadline b's lookup still waits: exclusive rights are not taken
    // back unanswered while their holder may still come back within the fencing delay
    // (and write back what it answered itself)…
    srv.tick(millis(NOW) + crate::caps::RECALL_TIMEOUT_MS).expect("tick");
    assert!(srv.take_outgoing().is_empty());
    // …and a, back before the fencing delay, hears the recall again.
    srv.handle_hello(&hello(Some(token)));
    srv.heard(a, millis(NOW) + crate::caps::RECALL_TIMEOUT_MS);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected the recall again: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
    let recall_id = *recall_id;
    // Its connection goes again before it answers, and it stays away: it is fenced,
    // b's lookup runs, and a's resume is told (it drops everything, replays nothing).
    let gone = millis(NOW) + crate::caps::RECALL_TIMEOUT_MS + 1;
    srv.disconnected(a, gone);
    srv.heard(b, gone + crate::caps::DISCONNECTED_FENCE_MS);
    srv.tick(gone + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
    let (_, msg) = srv.handle_hello(&hello(Some(token)));
    assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })));
    assert!(srv.take_outgoing().is_empty(), "nothing is recalled from a new session");
    // Its late answer to the old recall changes nothing.
    srv.recall_done(a, recall_id, NOW);
    assert!(srv.take_outgoing().is_empty());
}

#[test]
fn a_resent_change_whose_reply_waits_on_recalls_is_not_answered_before_they_are() {
    // b caches the root; a's mkdir changes it and its reply waits for b's answer. a's
    // connection breaks and a resends the mkdir: the reply cache must not answer it before
    // b has dropped what it cached.
    let (mut srv, a, b) = two_sessions();
    srv.handle(b, p::Request { id: 1, ops: vec![Op::GetAttr { ino: 1 }], time: None, caller: p::Caller::ROOT }, NOW);
    srv.take_outgoing();
    let mkdir = make_in_root(1, "d", p::FileType::Directory, 0o755);
    srv.handle(a, mkdir.clone(), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(*session, b);
    let recall_id = *recall_id;
    srv.disconnected(a, millis(NOW));
    srv.handle(a, mkdir, NOW);
    assert!(srv.take_outgoing().is_empty(), "the resend waits with the original");
    srv.recall_done(b, recall_id, NOW);
    let out = srv.take_outgoing();
    assert!(
        matches!(&out[..], [Outgoing::Response { session, response }] if *session == a && response.id == 1),
        "{out:?}"
    );
}

/// Sessions that each made one of `names` in the root (in that order), across a restart
/// that kept every change (the first session's fsync): all restored, none replayed yet.
/// Returns the server, the sessions and their files' inodes, in `names`' order.
fn restarted(names: &[&str]) -> (Server, Vec<SessionId>, Vec<u64>) {
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let mut made = Vec::new();
    for name in names {
        let (id, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
        let id = id.expect("session");
        let r = srv.handle_request(id, create_in_root(1, name), NOW);
        let Ok(Reply::Entry(f)) = &r.results[0] else { panic!("{r:?}") };
        made.push((id, w.session, f.ino));
    }
    srv.handle_request(made[0].0, req(2, vec![Op::Fsync { ino: 1 }]), NOW);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk)).expect("reopen"));
    for (_, token, _) in &made {
        assert!(srv.handle_hello(&hello(Some(*token))).0.is_some());
    }
    (srv, made.iter().map(|m| m.0).collect(), made.iter().map(|m| m.2).collect())
}

/// `session` re-asserts exclusive rights on `ino` and says it has replayed.
fn take_back(srv: &mut Server, session: SessionId, ino: u64) {
    let r = srv.handle_request(session, req(3, vec![Op::Reassert { ino, exclusive: true }]), NOW);
    assert_eq!(r.results, vec![Ok(Reply::Done)]);
    srv.replayed(session, NOW);
}

#[test]
fn a_handle_released_while_its_reopen_waits_twice_is_not_opened_again() {
    // After a restart b opens its handles again in one request, which waits behind a's
    // re-asserted exclusive rights on y (its opens take effect as it arrives). b's
    // process closes x meanwhile: the release runs at once. When a answers, the request
    // waits again, now for the grace period (c has not replayed): that second wait is
    // no new arrival, and must not open x again, or nobody ever releases it.
    let (mut srv, sessions, files) = restarted(&["y", "x", "z"]);
    let (&[a, b, c], &[y, x, _]) = (&sessions[..], &files[..]) else { panic!("three sessions") };
    take_back(&mut srv, a, y);
    let _ = srv.take_outgoing();
    srv.handle(
        b,
        req(
            10,
            vec![
                Op::Open { ino: y, handle: 1, access: p::OPEN_READ | p::OPEN_WRITE },
                Op::Open { ino: x, handle: 2, access: p::OPEN_READ | p::OPEN_WRITE },
            ],
        ),
        NOW,
    );
    let recall = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if session == a => Some(recall_id),
        _ => None,
    });
    let recall = recall.expect("b's re-opens wait for a to give y up");
    assert!(srv.holds_open(b, x, 2), "its opens took effect as it arrived");
    let r = srv.handle_request(b, req(11, vec![Op::Release { ino: x, handle: 2 }]), NOW);
    assert_eq!(r.results, vec![Ok(Reply::Done)]);
    srv.replayed(b, NOW);
    srv.recall_done(a, recall, NOW);
    srv.replayed(c, NOW);
    let _ = srv.take_outgoing();
    assert!(!srv.holds_open(b, x, 2), "x was closed while its re-open waited");
}

#[test]
fn a_replay_parked_behind_rights_runs_when_they_are_given_up_not_after_the_grace() {
    // b's replay waits behind a's re-asserted exclusive rights on y; b says `Replayed`
    // behind it. When a gives y up, the replay must run then, ahead of anyone's new work,
    // not wait for the grace period (c has not replayed) as new work would.
    let (mut srv, sessions, files) = restarted(&["y", "x", "z"]);
    let (&[a, b, _c], &[y, ..]) = (&sessions[..], &files[..]) else { panic!("three sessions") };
    take_back(&mut srv, a, y);
    let _ = srv.take_outgoing();
    let chmod = Op::SetAttr { ino: y, set: p::SetAttr { mode: Some(0o600), ..Default::default() } };
    srv.handle(b, p::Request { id: 2, ops: vec![chmod], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    let recall = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if session == a => Some(recall_id),
        _ => None,
    });
    let recall = recall.expect("b's replay waits for a to give y up");
    srv.replayed(b, NOW);
    srv.recall_done(a, recall, NOW);
    let out = srv.take_outgoing();
    assert!(
        out.iter().any(|o| matches!(o, Outgoing::Response { session, response } if *session == b && response.id == 2)),
        "the replay ran once y was given up, inside the grace period: {out:?}"
    );
}

#[test]
fn a_replay_waits_behind_the_sessions_earlier_replay_parked_behind_rights() {
    // b's replays: a chmod of y, which waits behind a's re-asserted exclusive rights on
    // y, then a chmod of x, which nobody holds. They ran in that order the first time
    // (what the first one answered may show the second's effect, or not): the second
    // waits for the first, and both run in their order when a gives y up.
    let (mut srv, sessions, files) = restarted(&["y", "x"]);
    let (&[a, b], &[y, x]) = (&sessions[..], &files[..]) else { panic!("two sessions") };
    take_back(&mut srv, a, y);
    let _ = srv.take_outgoing();
    let chmod = |ino| Op::SetAttr { ino, set: p::SetAttr { mode: Some(0o600), ..Default::default() } };
    srv.handle(b, p::Request { id: 2, ops: vec![chmod(y)], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    let recall = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if session == a => Some(recall_id),
        _ => None,
    });
    let recall = recall.expect("b's first replay waits for a to give y up");
    srv.handle(b, p::Request { id: 3, ops: vec![chmod(x)], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    let responses = |out: Vec<Outgoing>| -> Vec<u64> {
        out.into_iter()
            .filter_map(|o| match o {
                Outgoing::Response { session, response } if session == b => Some(response.id),
                _ => None,
            })
            .collect()
    };
    assert_eq!(responses(srv.take_outgoing()), Vec::<u64>::new(), "the second waits behind the first");
    srv.replayed(b, NOW);
    srv.recall_done(a, recall, NOW);
    assert_eq!(responses(srv.take_outgoing()), vec![2, 3], "in the order they first ran");
}

#[test]
fn a_sessions_new_work_waits_behind_its_own_replay_parked_behind_rights() {
    // b's create in d (the server chose its inode) is lost with a crash; replayed, it
    // waits behind a's re-asserted exclusive rights on d; both say `Replayed`, so the
    // grace period ends. b's new work, sent after the replay and building on it (a look
    // at the inode the create made), must not run before it.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, wa) = srv.handle_hello(&hello(None));
    let (b, wb) = srv.handle_hello(&hello(None));
    let (p::ServerMessage::Welcome(wa), p::ServerMessage::Welcome(wb)) = (wa, wb) else { panic!() };
    let (a, b) = (a.expect("a"), b.expect("b"));
    let mk = |parent, name: &[u8], kind| Op::Create {
        parent,
        name: name.to_vec(),
        kind,
        mode: 0o777,
        rdev: 0,
        cred: p::Cred::default(),
    };
    let r = srv.handle_request(a, req(1, vec![mk(1, b"d", p::FileType::Directory), Op::Fsync { ino: 1 }]), NOW);
    let Ok(Reply::Entry(d)) = &r.results[0] else { panic!("{r:?}") };
    let d = d.ino;
    srv.caps.drop_exclusive(d);
    let create = mk(d, b"n", p::FileType::Regular);
    let r = srv.handle_request(b, req(2, vec![create.clone()]), NOW);
    let Ok(Reply::Entry(n)) = &r.results[0] else { panic!("{r:?}") };
    let n = n.ino;
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk)).expect("reopen"));
    for t in [wa.session, wb.session] {
        assert!(srv.handle_hello(&hello(Some(t))).0.is_some());
    }
    let r = srv.handle_request(a, req(3, vec![Op::Reassert { ino: d, exclusive: true }]), NOW);
    assert_eq!(r.results, vec![Ok(Reply::Done)]);
    srv.replayed(a, NOW);
    let _ = srv.take_outgoing();
    srv.handle(b, req(2, vec![create]), NOW);
    let recall = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if session == a => Some(recall_id),
        _ => None,
    });
    let recall = recall.expect("b's replay waits for a to give d up");
    srv.replayed(b, NOW);
    srv.handle(b, req(3, vec![Op::GetAttr { ino: n }]), NOW);
    let early = srv.take_outgoing();
    assert!(
        !early.iter().any(|o| matches!(o, Outgoing::Response { response, .. } if response.id == 3)),
        "the new work ran before the replay it builds on: {early:?}"
    );
    srv.recall_done(a, recall, NOW);
    let out = srv.take_outgoing();
    let answered = |id| {
        out.iter().find_map(|o| match o {
            Outgoing::Response { session, response } if *session == b && response.id == id => Some(response.clone()),
            _ => None,
        })
    };
    let created = answered(2).expect("the replay ran once d was given up");
    assert!(matches!(&created.results[0], Ok(Reply::Entry(e)) if e.ino == n), "{created:?}");
    let looked = answered(3).expect("then the new work");
    assert!(matches!(looked.results[0], Ok(Reply::Attr(_))), "{looked:?}");
}

#[test]
fn a_reopen_the_check_refuses_still_holds_the_file_and_grants_nothing() {
    let disk = fresh_disk();
    let (mut srv, a, w, f) = a_session_that_made_f(&disk);
    let open = Op::Open { ino: f, handle: 1, access: p::OPEN_WRITE };
    let r = srv.handle_request(a, req(2, vec![open.clone(), Op::Unlink { parent: 1, name: b"f".to_vec() }]), NOW);
    assert!(r.results.iter().all(Result::is_ok), "{r:?}");
    srv.handle_request(a, req(3, vec![Op::Fsync { ino: 1 }]), NOW);
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk)).expect("reopen"));
    assert!(srv.handle_hello(&hello(Some(w.session))).0.is_some());
    // Its host is now squashed: the re-open (which names no caller) runs as nobody, who
    // may not write root's 0644 file.
    srv.set_policy(a, Policy::joined());
    let r = srv.handle_request(a, req(4, vec![open]), NOW);
    assert!(r.results[0].is_ok(), "the re-open keeps the unlinked file: {r:?}");
    assert!(srv.holds_open(a, f, 1));
    srv.replayed(a, NOW);
    let write = Op::Write { ino: f, offset: 0, data: b"x".to_vec() };
    let r = srv.handle_request(a, req(5, vec![write]), NOW);
    assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(13), "but grants no writing");
}

#[test]
fn the_grace_period_lasts_until_a_replay_parked_behind_rights_has_run() {
    // b's replay waits behind a's re-asserted exclusive rights on y, and b's `Replayed`
    // is the last: the grace must not end before the replay runs, or c's new work
    // (waiting for the grace) runs first without the change b's caller was told of. It
    // ends as soon as the replay has run.
    let (mut srv, sessions, files) = restarted(&["y", "x"]);
    let (&[a, b], &[y, _]) = (&sessions[..], &files[..]) else { panic!("two sessions") };
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    take_back(&mut srv, a, y);
    srv.handle(c, req(1, vec![Op::GetAttr { ino: y }]), NOW);
    let _ = srv.take_outgoing();
    let chmod = Op::SetAttr { ino: y, set: p::SetAttr { mode: Some(0o600), ..Default::default() } };
    srv.handle(b, p::Request { time: Some(NOW), ..req(2, vec![chmod]) }, NOW);
    let recall = srv.take_outgoing().into_iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if session == a => Some(recall_id),
        _ => None,
    });
    let recall = recall.expect("b's replay waits for a to give y up");
    srv.replayed(b, NOW);
    assert!(srv.in_grace(), "b's replay has not run");
    let out = srv.take_outgoing();
    assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == c)), "{out:?}");
    srv.recall_done(a, recall, NOW);
    assert!(!srv.in_grace(), "every replay has run");
    let out = srv.take_outgoing();
    let seen = out.iter().find_map(|o| match o {
        Outgoing::Response { session, response } if *session == c => Some(response.results[0].clone()),
        _ => None,
    });
    assert!(matches!(seen, Some(Ok(Reply::Attr(a))) if a.mode & 0o777 == 0o600), "{out:?}");
}

#[test]
fn a_reassert_resent_after_a_reconnect_does_not_run_again_after_later_lock_changes() {
    // After a restart a takes its lock again (the answer is lost with its connection),
    // says `Replayed`, then drops the lock: held for the grace period, c still replaying.
    // a resends the re-assert on its next connection: run again behind the unlock, it
    // would take back the lock a's process let go of, for as long as the session lives.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let token = |m: p::ServerMessage| match m {
        p::ServerMessage::Welcome(w) => w.session,
        other => panic!("{other:?}"),
    };
    let (a, wa) = srv.handle_hello(&hello(None));
    let (c, wc) = srv.handle_hello(&hello(None));
    let (a, c, ta, tc) = (a.expect("a"), c.expect("c"), token(wa), token(wc));
    assert_eq!(srv.handle_request(a, lock_root(1, 7, p::LockKind::Write, false), NOW).results[0], Ok(Reply::Done));
    let mut create = create_in_root(1, "x");
    create.ops.push(Op::Fsync { ino: 1 });
    assert!(srv.handle_request(c, create, NOW).results[0].is_ok());
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
    srv.tick(millis(NOW)).expect("tick");
    srv.handle_hello(&hello(Some(ta)));
    srv.handle(a, lock_root(100, 7, p::LockKind::Write, false), NOW);
    srv.replayed(a, NOW);
    srv.handle(a, lock_root(2, 7, p::LockKind::Unlock, false), NOW);
    let out = srv.take_outgoing();
    assert!(matches!(&out[..], [Outgoing::Response { response, .. }] if response.id == 100), "{out:?}");
    // a's connection breaks (the answer to 100 is lost); it resumes and sends both again.
    srv.disconnected(a, millis(NOW));
    srv.handle_hello(&hello(Some(ta)));
    srv.handle(a, lock_root(100, 7, p::LockKind::Write, false), NOW);
    let out = srv.take_outgoing();
    let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!((response.id, &response.results[..]), (100, &[Ok(Reply::Done)][..]), "answered again, not run");
    srv.replayed(a, NOW);
    srv.handle(a, lock_root(2, 7, p::LockKind::Unlock, false), NOW);
    // c comes back: the grace period ends, and a's unlock runs.
    srv.handle_hello(&hello(Some(tc)));
    srv.replayed(c, NOW);
    let _ = srv.take_outgoing();
    let (b, _) = srv.handle_hello(&hello(None));
    let b = b.expect("b");
    let r = srv.handle_request(b, lock_root(1, 9, p::LockKind::Write, false), NOW);
    assert_eq!(r.results[0], Ok(Reply::Done), "a let go of its lock");
}

/// A snapshot asked for after a restart, before a restored session has replayed a change
/// it was told was done (the server died before committing it): the snapshot holds
/// exactly what was acknowledged before it, so it waits for the replay (and then for the
/// writeback of the rights the replay gives back), and holds the change.
#[test]
fn a_snapshot_taken_while_a_session_replays_after_a_restart_holds_its_replayed_change() {
    use crest_nvlist::{NvList, Value};
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, wa) = srv.handle_hello(&hello(None));
    let p::ServerMessage::Welcome(wa) = wa else { panic!("{wa:?}") };
    let a = a.expect("a");
    let lost = srv.handle_request(a, create_in_root(1, "x"), NOW);
    assert!(lost.results[0].is_ok() && lost.seq > lost.durable, "acknowledged, not durable: {lost:?}");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    srv.tick(millis(NOW)).expect("tick");
    assert!(srv.in_grace());
    let mut call = NvList::new();
    call.add("cmd", Value::Str("snapshot.create".into())).expect("add");
    call.add("names", Value::Strs(vec!["default@s".into()])).expect("add");
    let AdminStart::Pending(token) = srv.admin_start(&call.encode(), NOW) else { panic!("the snapshot waits") };
    assert!(srv.take_admin_answers(NOW).is_empty(), "not while a restored session may replay");
    assert!(srv.store.dataset("default@s").is_err());
    // a comes back and replays its create, then says so.
    let (_, w) = srv.handle_hello(&hello(Some(wa.session)));
    assert!(matches!(w, p::ServerMessage::Welcome(p::Welcome { durable_seq: Some(0), .. })), "{w:?}");
    srv.handle(a, create_in_root(1, "x"), NOW);
    srv.replayed(a, NOW);
    srv.tick(millis(NOW) + 10).expect("tick");
    // What a holds now (x, made by its replay) is written back before the snapshot.
    let mut answers = Vec::new();
    for _ in 0..10 {
        for o in srv.take_outgoing() {
            if let Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } = o {
                srv.recall_done(session, recall_id, NOW);
            }
        }
        answers.extend(srv.take_admin_answers(NOW));
        if !answers.is_empty() {
            break;
        }
    }
    assert_eq!(answers.len(), 1, "the snapshot is taken once the replay is in");
    assert_eq!(answers[0].0, token);
    let answer = NvList::decode(&answers[0].1).expect("answer");
    assert!(answer.get("error").is_none(), "{answer:?}");
    let snap = srv.store.dataset_id("default@s").expect("taken");
    srv.store.set_view(Some(snap));
    assert!(srv.store.lookup(1, b"x").is_ok(), "the snapshot holds the replayed, acknowledged create");
    srv.store.set_view(None);
}

#[test]
fn an_acquire_that_carries_another_sessions_change_not_yet_durable_commits_it_first() {
    // b's acquire grants it exclusive rights on what the directory names, under which its
    // client answers changes itself, computed from what the acquire carried. Had that
    // included a's write not yet durable, and a crash taken the write back, b's writeback
    // (sent again before its `Replayed`) would run ahead of a's replay of the write, and
    // come out differently from what b's client answered.
    let disk = fresh_disk();
    let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
    let (a, _) = srv.handle_hello(&hello(None));
    let (b, _) = srv.handle_hello(&hello(None));
    let (a, b) = (a.expect("a"), b.expect("b"));
    srv.handle(a, create_in_root(1, "f"), NOW);
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create") };
    // (b's first change records its session, committing: out of the way first.)
    srv.handle(
        b,
        req(9, vec![Op::SetAttr { ino: 1, set: p::SetAttr { mode: Some(0o755), ..Default::default() } }]),
        NOW,
    );
    assert!(sole_result(&mut srv).is_ok());
    srv.handle(a, req(2, vec![Op::Fsync { ino: f.ino }]), NOW);
    assert!(sole_result(&mut srv).is_ok());
    srv.handle(a, req(3, vec![Op::Write { ino: f.ino, offset: 0, data: vec![7; 300] }]), NOW);
    assert!(sole_result(&mut srv).is_ok());
    let settled = srv.settling_commits;
    // (a changed the root a moment ago, which would make it shared: not what this is about.)
    srv.set_contention_window(0);
    srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), NOW);
    // (The acquire recalls a's exclusive rights on the file it made first.)
    for _ in 0..4 {
        let out = srv.take_outgoing();
        let mut answered = false;
        for o in &out {
            match o {
                Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } => {
                    srv.recall_done(*session, *recall_id, NOW)
                }
                Outgoing::Response { response, .. } => {
                    assert!(matches!(&response.results[0], Ok(Reply::Lookup { .. })), "{response:?}");
                    answered = true;
                }
                _ => {}
            }
        }
        if answered {
            break;
        }
    }
    assert_eq!(srv.caps.exclusive_elsewhere(a, f.ino), Some(b), "b holds the file");
    assert_eq!(srv.settling_commits, settled + 1, "a's write was committed before b was answered");
    drop(srv.into_store().abandon());
    let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
    let (c, _) = srv.handle_hello(&hello(None));
    let c = c.expect("c");
    let r = srv.handle_request(c, req(1, vec![Op::GetAttr { ino: f.ino }]), NOW);
    assert!(matches!(&r.results[0], Ok(Reply::Attr(x)) if x.size_bytes == 300), "{r:?}");
}

#[test]
fn a_holders_writeback_held_for_the_grace_period_runs_before_what_its_recall_answer_let_through() {
    // After a restart a holds y exclusively again; b has replayed and unlinks y (new
    // work: held for the grace period); a, which answered a truncate of y itself under
    // its rights, ships it (held too). c's replay opens y: a is recalled, and answers —
    // after its writeback, in wire order. When the grace period ends, a's truncate must
    // run before b's unlink, which waited on a's rights: a's client answered it with y
    // still linked.
    let (mut srv, sessions, files) = restarted(&["y", "x", "z"]);
    let (&[a, b, c], &[y, ..]) = (&sessions[..], &files[..]) else { panic!("three sessions") };
    take_back(&mut srv, a, y);
    srv.replayed(b, NOW);
    let _ = srv.take_outgoing();
    srv.handle(b, req(10, vec![Op::Unlink { parent: 1, name: b"y".to_vec() }]), NOW);
    let truncate = Op::SetAttr { ino: y, set: p::SetAttr { size_bytes: Some(7), ..Default::default() } };
    srv.handle(a, p::Request { id: 11, ops: vec![truncate], time: Some(NOW), caller: p::Caller::ROOT }, NOW);
    srv.handle(c, req(12, vec![Op::Open { ino: y, handle: 1, access: p::OPEN_READ }]), NOW);
    let out = srv.take_outgoing();
    let recall = out.iter().find_map(|o| match o {
        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == a => Some(*recall_id),
        _ => None,
    });
    let recall = recall.expect("c's reopen waits for a to give y up");
    srv.recall_done(a, recall, NOW);
    srv.replayed(c, NOW);
    // Every recall answered at once, until nothing more comes.
    let mut order = Vec::new();
    for _ in 0..10 {
        for o in srv.take_outgoing() {
            match o {
                Outgoing::Response { session, response } => {
                    if session == a && response.id == 11 {
                        let Ok(Reply::Attr(at)) = &response.results[0] else { panic!("{response:?}") };
                        assert_eq!(at.nlink, 1, "a's truncate ran on y still linked, as a answered it");
                    }
                    order.push((session, response.id));
                }
                Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } => {
                    srv.recall_done(session, recall_id, NOW);
                }
                _ => {}
            }
        }
    }
    let at = |s, id| order.iter().position(|&o| o == (s, id));
    assert!(at(a, 11).is_some() && at(b, 10).is_some(), "both ran: {order:?}");
    assert!(at(a, 11) < at(b, 10), "a's writeback first: {order:?}");
}
