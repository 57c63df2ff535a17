use super::*;

fn writeback(id: u64, ops: Vec<p::Op>, sec: i64, log: std_mpsc::Sender<(u64, Results)>) -> Call {
    let done: Completion = Box::new(move |r| log.send((id, r.expect("answered"))).expect("send"));
    Call {
        id,
        ops,
        time: Some(p::Time { sec, nsec: 0 }),
        reply: Answer::Then(done, AsyncBudget::default(), 0),
        made: std::time::Instant::now(),
        pos: None,
    }
}

fn attr_op(ino: u64) -> p::Op {
    p::Op::GetAttr { ino }
}

#[test]
fn consecutive_writeback_merges_with_clocks_and_splits_its_results() {
    let (tx, rx) = std_mpsc::channel();
    let mut m = Merger::new();
    assert!(m.offer(writeback(1, vec![attr_op(10)], 5, tx.clone())).is_none());
    assert!(m.offer(writeback(2, vec![attr_op(20), attr_op(21)], 5, tx.clone())).is_none());
    assert!(m.offer(writeback(3, vec![attr_op(30)], 6, tx.clone())).is_none());
    // A caller that waits is never merged (it would overtake or be overtaken).
    let (wtx, _wrx) = std_mpsc::sync_channel(1);
    let waiting = Call {
        id: 4,
        ops: vec![attr_op(40)],
        time: None,
        reply: Answer::Wait(wtx),
        made: std::time::Instant::now(),
        pos: None,
    };
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
    merged.reply.send(Ok(results));
    let got: Vec<(u64, Results)> = rx.try_iter().collect();
    let names = |r: &Results| -> Vec<u8> {
        r.iter().map(|x| if let Ok(p::Reply::Names(n)) = x { n[0][0] } else { 99 }).collect()
    };
    assert_eq!(got.len(), 3);
    assert_eq!((got[0].0, names(&got[0].1)), (1, vec![0]));
    assert_eq!((got[1].0, names(&got[1].1)), (2, vec![1, 2]));
    assert_eq!((got[2].0, names(&got[2].1)), (3, vec![4]), "the At's own result is skipped");
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
fn merged(subs: Vec<(Vec<p::Op>, i64)>) -> (Vec<p::Op>, std_mpsc::Receiver<(u64, Results)>, usize) {
    let (tx, rx) = std_mpsc::channel();
    let mut m = Merger::new();
    let n = subs.len();
    for (i, (ops, sec)) in subs.into_iter().enumerate() {
        assert!(m.offer(writeback(i as u64 + 1, ops, sec, tx.clone())).is_none());
    }
    let call = m.flush().expect("a batch");
    let ops = call.ops.clone();
    let results: Results = ops.iter().map(|_| Ok(p::Reply::Done)).collect();
    call.reply.send(Ok(results));
    (ops, rx, n)
}

#[test]
fn a_mkdir_and_its_rmdir_in_one_batch_never_reach_the_server() {
    let (ops, rx, n) = merged(vec![
        (vec![create_at(100, 1, "d", p::FileType::Directory)], 5),
        (vec![create_at(101, 100, "f", p::FileType::Regular), p::Op::Open { ino: 101, handle: 1 }], 5),
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
    let got: Vec<(u64, Results)> = rx.try_iter().collect();
    assert_eq!(got.len(), n, "every completion still runs");
    assert_eq!(got.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), vec![1, 2, 1, 1, 1, 1]);
}

#[test]
fn contiguous_writes_of_one_inode_join_and_run_at_the_last_clock() {
    let write = |ino, offset, data: &[u8]| p::Op::Write { ino, offset, data: data.to_vec() };
    // Appends of uneven sizes, then one that leaves a gap, one to another inode, and
    // one continuing after a different op: only the first run joins.
    let (ops, rx, n) = merged(vec![
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
    let got: Vec<(u64, Results)> = rx.try_iter().collect();
    assert_eq!(got.len(), n, "every completion still runs");
    assert_eq!(got.iter().map(|(_, r)| r.len()).collect::<Vec<_>>(), vec![1, 0, 0, 0, 1, 1, 1, 1]);
    // A write alone in the batch takes the later clock as the request's own.
    let (tx, _rx) = std_mpsc::channel();
    let mut m = Merger::new();
    assert!(m.offer(writeback(1, vec![write(7, 0, b"a")], 5, tx.clone())).is_none());
    assert!(m.offer(writeback(2, vec![write(7, 1, b"b")], 9, tx)).is_none());
    let call = m.flush().expect("a batch");
    assert_eq!((call.ops, call.time), (vec![write(7, 0, b"ab")], Some(p::Time { sec: 9, nsec: 0 })));
}

#[test]
fn a_pair_is_kept_when_anything_could_still_tell() {
    // An open with no release: a descriptor may still reach the unlinked file.
    let (ops, ..) = merged(vec![
        (vec![create_at(100, 1, "f", p::FileType::Regular), p::Op::Open { ino: 100, handle: 1 }], 5),
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
    let (tx, _rx) = std_mpsc::channel();
    let mut m = Merger::new();
    let mut handed_back = 0;
    for i in 0..2 * MAX_MERGED_OPS as u64 {
        if m.offer(writeback(i + 1, vec![attr_op(i)], 1, tx.clone())).is_some() {
            handed_back += 1;
            break;
        }
    }
    assert_eq!(handed_back, 1, "the batch is full at {MAX_MERGED_OPS} operations");
    assert_eq!(m.flush().expect("batch").ops.len(), MAX_MERGED_OPS);
    let big = p::Op::Write { ino: 1, offset: 0, data: vec![0; MAX_MERGED_BYTES] };
    assert!(m.offer(writeback(9, vec![big], 1, tx.clone())).is_some(), "a large write goes alone");
}

#[test]
fn opens_and_reads_outlive_a_fenced_session_and_changes_do_not() {
    let (tx, _rx) = std_mpsc::channel();
    let open = p::Op::Open { ino: 5, handle: 9 };
    let read = p::Op::Read { ino: 5, offset: 0, len: 10 };
    assert!(survives_fencing(&writeback(1, vec![open.clone()], 1, tx.clone())), "an open sent behind its answer");
    assert!(survives_fencing(&writeback(2, vec![p::Op::Release { ino: 5, handle: 9 }], 1, tx.clone())));
    assert!(survives_fencing(&writeback(3, vec![read, open.clone()], 1, tx.clone())));
    let touch = p::Op::SetAttr { ino: 5, set: p::SetAttr { atime: Some(p::SetTime::Now), ..Default::default() } };
    assert!(!survives_fencing(&writeback(4, vec![open, touch], 1, tx.clone())), "a change goes with it");
    assert!(survives_fencing(&writeback(6, vec![attr_op(5)], 1, tx.clone())));
    assert!(!survives_fencing(&writeback(5, vec![p::Op::Reassert { ino: 5, exclusive: true }], 1, tx)));
}
