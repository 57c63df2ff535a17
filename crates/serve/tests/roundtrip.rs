//! A real server on loopback and a real client: requests round-trip, many threads share
//! one connection, a restarted server is reconnected to transparently, and garbage or
//! wrong-version clients are refused without harming other clients.

use std::io::{Read, Write};
use std::time::Duration;

use crest_net::{Client, ClientOptions};
use crest_proto::{self as p, Op, Reply};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

fn store() -> Store {
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    Store::open(Box::new(disk)).expect("open")
}

fn create(name: &str) -> Op {
    Op::Create {
        parent: 1,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    }
}

/// An image on a shared in-memory disk, to be killed and reopened.
fn fresh_disk() -> MemDisk {
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    disk
}

/// The store on `disk`, committing only when asked (fsync), so a kill loses everything
/// since.
fn open(disk: &MemDisk) -> Store {
    let mut s = Store::open(Box::new(disk.clone())).expect("open");
    s.set_policy(crest_store::CommitPolicy { max_dirty_nodes: 1 << 20, interval_ms: u64::MAX });
    s
}

/// The wall clock, seconds.
fn wall_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn requests_round_trip_and_threads_share_one_connection() {
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = std::sync::Arc::new(Client::connect(&addr, ClientOptions::default()).expect("connect"));
    let Ok(Reply::Entry(attr)) = client.call_one(create("f")) else { panic!("create") };
    client.call_one(Op::Write { ino: attr.ino, offset: 0, data: b"hello".to_vec() }).expect("write");
    let r = client.call_one(Op::Read { ino: attr.ino, offset: 0, len: 100 }).expect("read");
    assert_eq!(r, Reply::Data(b"hello".to_vec()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    let r = c.call_one(create(&format!("t{t}-{i}")));
                    assert!(r.is_ok(), "{r:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let (mut from, mut names) = (0, 0);
    loop {
        let Ok(Reply::Dir { items, end, .. }) = client.call_one(Op::ReadDir { ino: 1, from_index: from, limit: 5000 })
        else {
            panic!("readdir")
        };
        names += items.len();
        from = items.last().map_or(from, |i| i.index + 1);
        if end {
            break;
        }
    }
    assert_eq!(names, 1601, "pages of at most 1024 items add up");
    // A missing name is an answer, not an error, and comes with its stretch of the
    // directory: every entry hashing into the range is listed.
    let Ok(Reply::Lookup { attr: None, leaf }) = client.call_one(Op::Lookup { parent: 1, name: b"missing".to_vec() })
    else {
        panic!("lookup of a missing name")
    };
    assert!(leaf.covers(p::name_hash(b"missing")), "{:x}..={:x}", leaf.hash_lo, leaf.hash_hi);
    assert!(!leaf.items.is_empty() && leaf.items.iter().all(|i| leaf.covers(p::name_hash(&i.name))));
    let err = client.call_one(Op::Lookup { parent: 999_999, name: b"x".to_vec() }).expect_err("ENOENT");
    assert_eq!(err.errno, 2);
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    assert!(store.generation() > 1, "shutdown committed");
}

#[test]
fn a_restarted_server_is_reconnected_to_and_pending_calls_complete() {
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    client.call_one(create("before")).expect("create");
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    // While the server is away a call blocks; it completes once the server is back.
    let c = std::thread::spawn(move || {
        let r = client.call_one(create("during"));
        (client, r)
    });
    std::thread::sleep(Duration::from_millis(300));
    let serving = rt.block_on(crest_serve::start(store, &addr, crest_serve::Security::Insecure)).expect("restart");
    let (client, r) = c.join().expect("caller");
    assert!(r.is_ok(), "{r:?}");
    for name in [&b"before"[..], b"during"] {
        let r = client.call_one(Op::Lookup { parent: 1, name: name.to_vec() });
        assert!(matches!(r, Ok(Reply::Lookup { attr: Some(_), .. })), "{r:?}");
    }
    rt.block_on(serving.shutdown()).expect("shutdown");
}

#[test]
fn garbage_and_wrong_versions_are_refused_and_others_carry_on() {
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let good = Client::connect(&addr, ClientOptions::default()).expect("connect");
    // Garbage: an HTTP request, a huge length prefix, a truncated frame then hang-up.
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xff, 0xff, 0xff, 0x7f, 1, 2, 3], &[10, 0, 0, 0, 1]] {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        s.write_all(junk).expect("write");
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let _ = s.read_to_end(&mut rest);
    }
    // A client too old gets a clear refusal; one newer than the server is answered in
    // the server's newest version.
    let first_answer = |version: u32| {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        let mut frame = Vec::new();
        let hello =
            p::Hello { magic: p::HELLO_MAGIC, version, client_name: "v".into(), resume: None, dataset: String::new() };
        p::encode_frame(&p::ClientMessage::Hello(hello), &mut frame).expect("encode");
        s.write_all(&frame).expect("write");
        let mut dec = p::FrameDecoder::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).expect("read");
            assert!(n > 0, "closed without an answer");
            dec.handle_bytes(&buf[..n]);
            if let Some(m) = dec.poll_message::<p::ServerMessage>().expect("frame") {
                break m;
            }
        }
    };
    let old = p::OLDEST_PROTOCOL_VERSION - 1;
    let msg = first_answer(old);
    assert!(
        matches!(msg, p::ServerMessage::Refused { ref reason, version } if reason.contains(&old.to_string()) && version == p::PROTOCOL_VERSION),
        "{msg:?}"
    );
    let msg = first_answer(999);
    assert!(matches!(msg, p::ServerMessage::Welcome(ref w) if w.version == p::PROTOCOL_VERSION), "{msg:?}");
    let msg = first_answer(p::OLDEST_PROTOCOL_VERSION);
    assert!(
        matches!(msg, p::ServerMessage::Welcome(ref w) if w.version == p::OLDEST_PROTOCOL_VERSION && w.server_release.is_empty()),
        "{msg:?}"
    );
    // A client that vanishes mid-request.
    let mut s = std::net::TcpStream::connect(&addr).expect("connect");
    let mut frame = Vec::new();
    let hello = p::Hello {
        magic: p::HELLO_MAGIC,
        version: p::PROTOCOL_VERSION,
        client_name: "gone".into(),
        resume: None,
        dataset: String::new(),
    };
    p::encode_frame(&p::ClientMessage::Hello(hello), &mut frame).expect("encode");
    let mut req = Vec::new();
    p::encode_frame(
        &p::ClientMessage::Request(p::Request {
            id: 1,
            ops: vec![create("half")],
            time: None,
            caller: p::Caller::ROOT,
        }),
        &mut req,
    )
    .expect("encode");
    frame.extend_from_slice(&req[..req.len() / 2]);
    s.write_all(&frame).expect("write");
    drop(s);
    // The good client still works.
    good.call_one(create("still-fine")).expect("create after garbage");
    rt.block_on(serving.shutdown()).expect("shutdown");
}

/// A server killed without a commit loses the changes it acknowledged since its last
/// commit; the client, told by the restarted server which of its changes survived,
/// replays the rest before anything else: nothing acknowledged is lost, and each change
/// applies once (the replayed creates get the same inode numbers, the write lands once).
#[test]
fn a_killed_server_loses_nothing_it_acknowledged() {
    let rt = rt();
    let disk = fresh_disk();
    let serving =
        rt.block_on(crest_serve::start(open(&disk), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let Ok(Reply::Entry(kept)) = client.call_one(create("kept")) else { panic!("create") };
    client.call_one(Op::Fsync { ino: 1 }).expect("fsync");
    let mut lost = Vec::new();
    for i in 0..20 {
        let Ok(Reply::Entry(a)) = client.call_one(create(&format!("after-{i}"))) else { panic!("create") };
        lost.push(a);
    }
    let append = Op::Write { ino: lost[0].ino, offset: 0, data: b"written once".to_vec() };
    client.call_one(append).expect("write");
    client.call_one(Op::Unlink { parent: 1, name: b"after-19".to_vec() }).expect("unlink");
    // kill -9: the uncommitted transaction is gone from the disk.
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let mut check = open(&disk);
    assert!(check.lookup(1, b"kept").is_ok());
    assert!(check.lookup(1, b"after-0").is_err(), "the server really lost it");
    drop(check.abandon());
    let serving =
        rt.block_on(crest_serve::start(open(&disk), &addr, crest_serve::Security::Insecure)).expect("restart");
    // The client's next call goes out after the replay, on the same connection.
    for (i, want) in lost.iter().enumerate().take(19) {
        let r = client.call_one(Op::Lookup { parent: 1, name: format!("after-{i}").into_bytes() });
        let Ok(Reply::Lookup { attr: Some(a), .. }) = r else { panic!("after-{i} lost: {r:?}") };
        assert_eq!(a.ino, want.ino, "replayed with the same inode number");
    }
    let r = client.call_one(Op::Lookup { parent: 1, name: b"after-19".to_vec() });
    assert!(matches!(r, Ok(Reply::Lookup { attr: None, .. })), "the unlink was replayed too: {r:?}");
    let r = client.call_one(Op::Read { ino: lost[0].ino, offset: 0, len: 100 });
    assert_eq!(r, Ok(Reply::Data(b"written once".to_vec())));
    assert!(client.call_one(Op::Lookup { parent: 1, name: b"kept".to_vec() }).is_ok());
    let _ = kept;
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    let report = crest_store::check::fsck(store.close().expect("close")).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A change to an inode another client holds is answered only after that client has
/// dropped it: the holder gets a recall naming the inode, and the changer's call returns
/// after the holder says it is done. A client that never took its recalls answers them
/// itself at once.
#[test]
fn a_change_waits_until_other_holders_have_dropped_their_copies() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let a = Client::connect(&addr, ClientOptions::default()).expect("connect a");
    let b = Client::connect(&addr, ClientOptions::default()).expect("connect b");
    let c = Client::connect(&addr, ClientOptions::default()).expect("connect c (caches nothing)");
    let recalls = b.take_recalls().expect("recalls");
    assert!(b.take_recalls().is_none(), "taken once");
    // b and c read the root directory: both hold it.
    b.call_one(Op::GetAttr { ino: 1 }).expect("getattr");
    c.call_one(Op::GetAttr { ino: 1 }).expect("getattr");
    let dropped = Arc::new(AtomicBool::new(false));
    let b = Arc::new(b);
    let holder = {
        let (b, dropped) = (b.clone(), dropped.clone());
        std::thread::spawn(move || {
            let r = recalls.recv_timeout(Duration::from_secs(10)).expect("a recall");
            assert!(r.inodes.contains(&1), "{r:?}");
            std::thread::sleep(Duration::from_millis(200));
            dropped.store(true, Ordering::SeqCst);
            b.recall_done(r.recall_id);
        })
    };
    let r = a.call_one(create("new"));
    assert!(r.is_ok(), "{r:?}");
    assert!(dropped.load(Ordering::SeqCst), "the create returned before the holder dropped the directory");
    holder.join().expect("holder");
    // b no longer holds the root: a second change goes straight through.
    let t = std::time::Instant::now();
    a.call_one(create("newer")).expect("create");
    assert!(t.elapsed() < Duration::from_millis(1500), "no recall for a dropped right");
    rt.block_on(serving.shutdown()).expect("shutdown");
}

#[test]
fn writeback_submissions_each_get_their_own_results_at_their_own_time() {
    // A burst of writeback submissions is merged into compound requests on the wire
    // (`Op::At` keeps each one's clock); every completion must still get exactly its own
    // results, and the server must apply each at the time its submitter gave.
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let Ok(Reply::Entry(f)) = client.call_one(create("wb")) else { panic!("create") };
    let (tx, rx) = std::sync::mpsc::channel();
    let n = 300u64;
    for i in 0..n {
        let tx = tx.clone();
        let permit = client.async_permit(1);
        // (Times near the server's: it bounds how far a client's clock may be off.)
        let time = p::Time { sec: wall_secs(), nsec: 7 + i as u32 * 1000 };
        let ops = if i % 3 == 0 {
            vec![Op::Write { ino: f.ino, offset: i, data: vec![i as u8] }]
        } else {
            // Two operations in one submission, the second one failing.
            vec![Op::Write { ino: f.ino, offset: i, data: vec![i as u8] }, Op::GetAttr { ino: 999_999 }]
        };
        permit.submit(ops, time, Box::new(move |r| tx.send((i, time, r)).expect("send"))).expect("submit");
    }
    drop(tx);
    let mut seen = 0;
    for (i, time, r) in rx.iter().take(n as usize) {
        let results = r.expect("answered");
        let want = if i % 3 == 0 { 1 } else { 2 };
        assert_eq!(results.len(), want, "submission {i} got {results:?}");
        match &results[0] {
            Ok(Reply::Attr(a)) => assert_eq!(a.mtime, time, "submission {i} applied at another time"),
            other => panic!("submission {i}: {other:?}"),
        }
        if want == 2 {
            assert!(results[1].is_err(), "submission {i}: {:?}", results[1]);
        }
        seen += 1;
    }
    assert_eq!(seen, n);
    let Ok(Reply::Data(d)) = client.call_one(Op::Read { ino: f.ino, offset: 0, len: n as u32 }) else { panic!() };
    assert_eq!(d, (0..n).map(|i| i as u8).collect::<Vec<_>>());
    drop(client);
    rt.block_on(serving.shutdown()).expect("shutdown");
}

#[test]
fn a_lone_writeback_submission_goes_by_itself_and_so_does_the_next() {
    // Held on the client for a moment in case more come; with nothing else sent and
    // nobody waiting, it must still go (the connection thread sleeps while none is held,
    // so the first one held is what wakes it), and again after an idle spell.
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let client = Client::connect(&serving.local_addr.to_string(), ClientOptions::default()).expect("connect");
    let Ok(Reply::Entry(f)) = client.call_one(create("lone")) else { panic!("create") };
    for (round, idle_ms) in [(0u8, 0u64), (1, 70), (2, 3)] {
        std::thread::sleep(std::time::Duration::from_millis(idle_ms));
        let (tx, rx) = std::sync::mpsc::channel();
        let time = p::Time { sec: wall_secs(), nsec: 0 };
        let ops = vec![Op::Write { ino: f.ino, offset: u64::from(round), data: vec![round] }];
        client.async_permit(1).submit(ops, time, Box::new(move |r| tx.send(r).expect("send"))).expect("submit");
        let r = rx.recv_timeout(std::time::Duration::from_secs(5));
        assert!(matches!(r, Ok(Ok(_))), "round {round}: the held submission never went: {r:?}");
    }
    drop(client);
    rt.block_on(serving.shutdown()).expect("shutdown");
}

#[test]
fn after_a_restart_another_client_waits_for_the_replay_of_what_it_may_have_seen() {
    // a's create is acknowledged (and seen by b) but not durable when the server dies.
    // After the restart, b's first look must not find it missing: the server holds b's
    // request until a has come back and replayed (the grace period).
    let rt = rt();
    let disk = fresh_disk();
    let serving =
        rt.block_on(crest_serve::start(open(&disk), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let a = Client::connect(&addr, ClientOptions { client_name: "a".into(), ..Default::default() }).expect("a");
    let b = Client::connect(&addr, ClientOptions { client_name: "b".into(), ..Default::default() }).expect("b");
    a.call_one(create("a-was-here")).expect("a's first create");
    b.call_one(create("b-was-here")).expect("b's first create");
    b.call_one(Op::Fsync { ino: 1 }).expect("fsync: both sessions' records are durable");
    let Ok(Reply::Entry(x)) = a.call_one(create("x")) else { panic!("create x") };
    let seen = b.call_one(Op::Lookup { parent: 1, name: b"x".to_vec() });
    assert!(matches!(seen, Ok(Reply::Lookup { attr: Some(_), .. })), "b saw x: {seen:?}");
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let serving =
        rt.block_on(crest_serve::start(open(&disk), &addr, crest_serve::Security::Insecure)).expect("restart");
    // b asks at once, while a may not have reconnected yet.
    let again = b.call_one(Op::Lookup { parent: 1, name: b"x".to_vec() });
    let Ok(Reply::Lookup { attr: Some(found), .. }) = again else {
        panic!("b saw x vanish after the restart: {again:?}")
    };
    assert_eq!(found.ino, x.ino);
    drop((a, b));
    rt.block_on(serving.shutdown()).expect("shutdown");
}

/// A lock op of `owner` on `ino`, bytes `start..=end`.
fn lock(ino: u64, owner: u64, start: u64, end: u64, kind: p::LockKind, flock: bool) -> Op {
    Op::SetLock { ino, owner, start, end, kind, flock, pid: 4242 }
}

fn errno(r: Result<Reply, p::OpError>) -> Option<i32> {
    r.err().map(|e| e.errno)
}

#[test]
fn after_a_restart_each_client_takes_its_locks_again_before_anyone_else_may() {
    // a holds an fcntl lock on all of f, an flock lock on f and an fcntl lock on g with a
    // hole unlocked in its middle. The server dies; b, asking at once, must still meet
    // every one of them (and only them): a takes them again while the grace period holds
    // b's requests.
    use p::LockKind::{Unlock, Write};
    let rt = rt();
    let disk = fresh_disk();
    let serving =
        rt.block_on(crest_serve::start(open(&disk), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let a = Client::connect(&addr, ClientOptions { client_name: "a".into(), ..Default::default() }).expect("a");
    let b = Client::connect(&addr, ClientOptions { client_name: "b".into(), ..Default::default() }).expect("b");
    let Ok(Reply::Entry(f)) = a.call_one(create("f")) else { panic!("create f") };
    let Ok(Reply::Entry(g)) = a.call_one(create("g")) else { panic!("create g") };
    a.call_one(Op::Fsync { ino: 1 }).expect("fsync");
    let eof = p::LOCK_TO_EOF;
    a.call_one(lock(f.ino, 7, 0, eof, Write, false)).expect("fcntl lock");
    a.call_one(lock(f.ino, 8, 0, eof, Write, true)).expect("flock lock");
    a.call_one(lock(g.ino, 9, 0, 99, Write, false)).expect("range lock");
    a.call_one(lock(g.ino, 9, 40, 59, Unlock, false)).expect("unlock the middle");
    assert_eq!(errno(b.call_one(lock(f.ino, 1, 5, 5, Write, false))), Some(11), "before the restart");
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let serving =
        rt.block_on(crest_serve::start(open(&disk), &addr, crest_serve::Security::Insecure)).expect("restart");
    // b asks at once, while a may not have reconnected yet.
    assert_eq!(errno(b.call_one(lock(f.ino, 1, 5, 5, Write, false))), Some(11), "a's fcntl lock came back");
    assert_eq!(errno(b.call_one(lock(f.ino, 2, 0, eof, Write, true))), Some(11), "a's flock lock came back");
    assert_eq!(errno(b.call_one(lock(g.ino, 3, 39, 39, Write, false))), Some(11), "a's range came back");
    assert_eq!(errno(b.call_one(lock(g.ino, 3, 60, 60, Write, false))), Some(11), "both of its parts");
    b.call_one(lock(g.ino, 3, 40, 59, Write, false)).expect("the hole stayed free");
    // a lets go; b gets them.
    a.call_one(lock(f.ino, 7, 0, eof, Unlock, false)).expect("unlock");
    a.call_one(lock(f.ino, 8, 0, eof, Unlock, true)).expect("unlock");
    b.call_one(lock(f.ino, 1, 5, 5, Write, false)).expect("b's fcntl lock");
    b.call_one(lock(f.ino, 2, 0, eof, Write, true)).expect("b's flock lock");
    // A second restart: b's locks come back for b, and what a gave up stays given up.
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let serving =
        rt.block_on(crest_serve::start(open(&disk), &addr, crest_serve::Security::Insecure)).expect("restart");
    assert_eq!(errno(a.call_one(lock(f.ino, 7, 5, 5, Write, false))), Some(11), "b's fcntl lock came back");
    a.call_one(lock(f.ino, 7, 6, 6, Write, false)).expect("only byte 5 is b's");
    assert_eq!(errno(a.call_one(lock(g.ino, 9, 40, 40, Write, false))), Some(11), "b's range on g came back");
    a.call_one(lock(g.ino, 9, 0, 39, Write, false)).expect("a's own range");
    drop((a, b));
    rt.block_on(serving.shutdown()).expect("shutdown");
}

type Results = Vec<Result<Reply, p::OpError>>;

/// One submission's outcome: exactly one successful result.
fn outcome(r: Result<Results, crest_net::ClientError>) -> Result<(), String> {
    match r.map_err(|e| e.to_string())?.as_slice() {
        [Ok(_)] => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

#[test]
fn creates_removed_in_the_same_burst_leave_only_their_directory_times() {
    // Pairs submitted back to back (behind a large write, so the connection finds many of
    // them queued at once and merges them): whether a pair is cancelled in the client or
    // applied by the server, every completion gets its results, nothing is left, and the
    // directory ends with the last removal's time.
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let Ok(Reply::Entry(f)) = client.call_one(create("big")) else { panic!("create") };
    let Ok(Reply::Inodes { first, count }) = client.call_one(Op::AllocInodes { count: 1000 }) else { panic!() };
    assert!(count >= 400);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut sent = 0;
    let mut last = p::Time::default();
    for round in 0..4u64 {
        let big = Op::Write { ino: f.ino, offset: 0, data: vec![7; 3 << 20] };
        let t = tx.clone();
        let done = Box::new(move |r: Result<Results, crest_net::ClientError>| t.send(outcome(r)).expect("send"));
        client.async_permit(3 << 20).submit(vec![big], p::Time { sec: wall_secs(), nsec: 0 }, done).expect("submit");
        sent += 1;
        for i in 0..50u64 {
            let ino = first + round * 100 + 2 * i;
            let name = format!("d{round}-{i}").into_bytes();
            let time = p::Time { sec: wall_secs(), nsec: (round * 100 + i) as u32 * 1000 };
            let dir = i % 2 == 0;
            let kind = if dir { p::FileType::Directory } else { p::FileType::Regular };
            let mk = Op::CreateAt {
                ino,
                generation: 1,
                parent: 1,
                name: name.clone(),
                kind,
                mode: 0o755,
                rdev: 0,
                cred: p::Cred::default(),
            };
            let rm = if dir { Op::Rmdir { parent: 1, name } } else { Op::Unlink { parent: 1, name } };
            for op in [mk, rm] {
                let t = tx.clone();
                let done =
                    Box::new(move |r: Result<Results, crest_net::ClientError>| t.send(outcome(r)).expect("send"));
                client.async_permit(16).submit(vec![op], time, done).expect("submit");
                sent += 1;
            }
            last = time;
        }
    }
    drop(tx);
    let outcomes: Vec<Result<(), String>> = rx.iter().take(sent).collect();
    assert_eq!(outcomes.len(), sent, "every submission answered");
    let failed: Vec<&String> = outcomes.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "none failed: {failed:?}");
    let Ok(Reply::Dir { items, .. }) = client.call_one(Op::ReadDir { ino: 1, from_index: 0, limit: 1000 }) else {
        panic!("readdir")
    };
    assert_eq!(items.iter().map(|i| i.name.clone()).collect::<Vec<_>>(), vec![b"big".to_vec()]);
    let Ok(Reply::Attr(root)) = client.call_one(Op::GetAttr { ino: 1 }) else { panic!("getattr") };
    assert_eq!((root.mtime, root.ctime, root.nlink), (last, last, 2));
    drop(client);
    rt.block_on(serving.shutdown()).expect("shutdown");
}

/// A client that ends its session cleanly (an unmount) first has the server make what it
/// acknowledged durable: nobody is left to replay it after a crash.
#[test]
fn what_a_client_was_told_survives_a_crash_right_after_it_unmounts() {
    let rt = rt();
    let disk = fresh_disk();
    let serving =
        rt.block_on(crest_serve::start(open(&disk), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let Ok(Reply::Entry(_)) = client.call_one(create("told")) else { panic!("create") };
    drop(client);
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let mut check = open(&disk);
    assert!(check.lookup(1, b"told").is_ok(), "the create was lost with the unmount");
    drop(check.abandon());
}
