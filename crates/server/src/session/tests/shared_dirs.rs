//! Directories several sessions change at once (`contention`): not handed to one whole.

use super::*;

/// `ms` milliseconds after `NOW`.
fn after(ms: u64) -> p::Time {
    let t = u64::try_from(NOW.sec).expect("NOW") * 1_000 + ms;
    p::Time { sec: i64::try_from(t / 1_000).expect("time"), nsec: u32::try_from(t % 1_000).expect("ms") * 1_000_000 }
}

fn refused_busy(r: &Result<Reply, p::OpError>) -> bool {
    matches!(r, Err(e) if e.errno == 16)
}

#[test]
fn a_directory_two_sessions_change_at_once_is_handed_to_neither_whole() {
    let (mut srv, a, b) = two_sessions();
    srv.handle(a, create_in_root(1, "f"), after(0));
    let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
    // a changed the root a moment ago: b's acquire is refused at once, recalling nothing
    // (a still holds f, which it made).
    srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), after(200));
    let r = sole_result(&mut srv);
    assert!(refused_busy(&r), "{r:?}");
    assert_eq!(srv.caps.exclusive_elsewhere(b, f.ino), Some(a));
    // b creates through the server instead; now a's acquire is refused too.
    srv.handle(b, create_in_root(2, "g"), after(300));
    let Ok(Reply::Entry(g)) = sole_result(&mut srv) else { panic!("create g") };
    srv.handle(a, req(2, vec![Op::Acquire { ino: 1 }]), after(400));
    assert!(refused_busy(&sole_result(&mut srv)));
    // b has been quiet a whole window: a takes the root whole (b gives up g first).
    srv.handle(a, req(3, vec![Op::Acquire { ino: 1 }]), after(1_300 + 1));
    let out = srv.take_outgoing();
    let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
        panic!("expected a recall to b: {out:?}")
    };
    assert_eq!((*session, inodes.as_slice()), (b, &[g.ino][..]));
    srv.recall_done(b, *recall_id, after(1_302));
    let r = sole_result(&mut srv);
    assert!(matches!(&r, Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 2), "{r:?}");
    // Taken whole just now: b may not take it straight back.
    srv.handle(b, req(4, vec![Op::Acquire { ino: 1 }]), after(1_500));
    assert!(refused_busy(&sole_result(&mut srv)));
    assert_eq!(srv.caps.exclusive_elsewhere(b, 1), Some(a));
}

#[test]
fn writeback_of_a_holder_keeps_its_directory_shared_for_others() {
    // a holds the root whole and answers creates itself; its writeback arrives. b, whose
    // acquire would recall the root and every entry and stall both, is refused; b's
    // change through the server takes the root from a as it always did.
    let (mut srv, a, b) = two_sessions();
    srv.handle(a, req(1, vec![Op::Acquire { ino: 1 }]), after(0));
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { .. })));
    srv.handle(a, req(2, vec![Op::AllocInodes { count: 4 }]), after(1_100));
    let Ok(Reply::Inodes { first, .. }) = sole_result(&mut srv) else { panic!("alloc") };
    let wb = p::Request {
        id: 3,
        ops: vec![Op::CreateAt {
            parent: 1,
            name: b"w".to_vec(),
            ino: first,
            generation: 9,
            kind: p::FileType::Regular,
            mode: 0o644,
            rdev: 0,
            cred: p::Cred::default(),
        }],
        time: Some(after(1_150)),
        caller: p::Caller::ROOT,
    };
    srv.handle(a, wb, after(1_200));
    assert!(sole_result(&mut srv).is_ok());
    srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), after(1_900));
    let r = sole_result(&mut srv);
    assert!(refused_busy(&r), "{r:?}");
    assert_eq!(srv.caps.exclusive_elsewhere(b, 1), Some(a), "nothing was recalled");
    // A window after a's last writeback, the root is b's for the asking.
    srv.handle(b, req(2, vec![Op::Acquire { ino: 1 }]), after(2_300));
    let out = srv.take_outgoing();
    assert!(
        out.iter()
            .any(|o| matches!(o, Outgoing::Notify { session, notify: p::Notify::Recall { .. } } if *session == a)),
        "{out:?}"
    );
}

#[test]
fn a_directory_changed_by_a_session_that_since_ended_is_not_shared() {
    // An unmount and a mount again within the window (or one host's job after another's):
    // the session gone is nobody to trade the directory with.
    let (mut srv, a, b) = two_sessions();
    srv.handle(a, create_in_root(1, "f"), after(0));
    assert!(matches!(sole_result(&mut srv), Ok(Reply::Entry(_))));
    srv.end_session(a);
    srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), after(200));
    let r = sole_result(&mut srv);
    assert!(matches!(&r, Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 1), "{r:?}");
}

#[test]
fn a_session_ending_leaves_the_others_uses_counted() {
    // Three at work: one leaving does not make the directory the last one's alone.
    let (mut srv, a, b) = two_sessions();
    let c = srv.handle_hello(&hello(None)).0.expect("c");
    srv.handle(a, create_in_root(1, "f"), after(0));
    assert!(sole_result(&mut srv).is_ok());
    srv.handle(b, create_in_root(1, "g"), after(100));
    assert!(sole_result(&mut srv).is_ok());
    srv.handle(c, create_in_root(1, "h"), after(200));
    assert!(sole_result(&mut srv).is_ok());
    srv.end_session(c);
    srv.handle(a, req(2, vec![Op::Acquire { ino: 1 }]), after(300));
    assert!(refused_busy(&sole_result(&mut srv)), "b changed it 200 ms ago");
}

#[test]
fn a_lookup_recalls_no_sibling_another_session_holds() {
    // a made d1 and d2 side by side in the root and works in d1; b looks d2 up (to work
    // in it). b's answer must not take d1 from a: it carries d2, the root, and the stretch
    // of d2's hash only, not one naming entries that are a's to change.
    let (mut srv, a, b) = two_sessions();
    // (With a's changes to the root counted, b's look-ups would lend nothing of it at all:
    // the next test.)
    srv.set_contention_window(0);
    let mkdir = |id: u64, name: &str| make_in_root(id, name, p::FileType::Directory, 0o755);
    srv.handle(a, mkdir(1, "d1"), after(0));
    let Ok(Reply::Entry(d1)) = sole_result(&mut srv) else { panic!("mkdir d1") };
    srv.handle(a, mkdir(2, "d2"), after(1));
    let Ok(Reply::Entry(d2)) = sole_result(&mut srv) else { panic!("mkdir d2") };
    // d2 is given up once (b wants it; a made it), d1 never.
    let r = run_answering_recalls(&mut srv, b, 1, vec![Op::Lookup { parent: 1, name: b"d2".to_vec() }]);
    let Ok(Reply::Lookup { attr: Some(found), leaf }) = r else { panic!("lookup d2: {r:?}") };
    assert_eq!(found.ino, d2.ino);
    assert!(leaf.items.iter().all(|i| i.attr.ino != d1.ino), "no stretch naming d1: {leaf:?}");
    let h = p::name_hash(b"d2");
    assert_eq!((leaf.hash_lo, leaf.hash_hi, leaf.items.len()), (h, h, 1), "the stretch of d2's own hash");
    assert_eq!(srv.caps.exclusive_elsewhere(b, d1.ino), Some(a), "a still holds d1");
    // Nor does b's look-up of a name that is not there (before a create of its own).
    let r = run_answering_recalls(&mut srv, b, 2, vec![Op::Lookup { parent: 1, name: b"new".to_vec() }]);
    let Ok(Reply::Lookup { attr: None, leaf }) = r else { panic!("lookup new: {r:?}") };
    let h = p::name_hash(b"new");
    assert_eq!((leaf.hash_lo, leaf.hash_hi, leaf.items.len()), (h, h, 0), "absence, on the name's own hash");
    assert_eq!(srv.caps.exclusive_elsewhere(b, d1.ino), Some(a), "a still holds d1");
    // With nobody else's rights in it, the same lookup brings the whole stretch.
    let r = run_answering_recalls(&mut srv, a, 3, vec![Op::Lookup { parent: 1, name: b"d1".to_vec() }]);
    assert!(matches!(&r, Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 2), "{r:?}");
}

/// Runs `ops` for `session` at `at` and returns the one response's first result and
/// whatever else went out with it.
fn run_at(
    srv: &mut Server,
    session: SessionId,
    id: u64,
    ops: Vec<Op>,
    at: p::Time,
) -> (Result<Reply, p::OpError>, Vec<Outgoing>) {
    srv.handle(session, req(id, ops), at);
    let mut out = srv.take_outgoing();
    let Some(i) = out.iter().position(|o| matches!(o, Outgoing::Response { .. })) else {
        panic!("no response to request {id} of session {session}: {out:?}")
    };
    let Outgoing::Response { response, .. } = out.remove(i) else { unreachable!() };
    (response.results[0].clone(), out)
}

#[test]
fn a_directory_others_are_changing_is_lent_to_no_reader() {
    // a and b both create in d. While the other is at work there, neither's look-ups in
    // d, look-ups of d, nor getattrs of d grant anything of d: so neither's creates wait
    // for the other to drop d. A session of protocol 14 gets its getattr as before (held,
    // and recalled at the next change).
    let (mut srv, a, b) = two_sessions();
    let (r, _) = run_at(&mut srv, a, 1, vec![make_op(1, "d", p::FileType::Directory)], after(0));
    let Ok(Reply::Entry(d)) = r else { panic!("mkdir d: {r:?}") };
    // a gives d up (b looks it up), then each creates in it.
    let (r, _) = run_answering(&mut srv, b, 1, vec![Op::Lookup { parent: 1, name: b"d".to_vec() }], after(10));
    assert!(matches!(r, Ok(Reply::Lookup { attr: Some(_), .. })), "{r:?}");
    let (r, _) = run_answering(&mut srv, a, 2, vec![make_op(d.ino, "a1", p::FileType::Regular)], after(20));
    assert!(r.is_ok(), "{r:?}");
    let (r, _) = run_answering(&mut srv, b, 2, vec![make_op(d.ino, "b1", p::FileType::Regular)], after(30));
    assert!(r.is_ok(), "{r:?}");
    for (i, (s, t)) in [(a, 100u64), (b, 200), (a, 300), (b, 400)].into_iter().enumerate() {
        let id = 10 + i as u64 * 10;
        let name = format!("n{i}");
        let (r, out) =
            run_at(&mut srv, s, id, vec![Op::Lookup { parent: d.ino, name: name.clone().into_bytes() }], after(t));
        let Ok(Reply::Lookup { attr: None, leaf }) = r else { panic!("lookup {name}: {r:?}") };
        assert!(leaf.items.is_empty() && leaf.hash_lo > leaf.hash_hi, "no stretch of d lent: {leaf:?}");
        assert!(out.is_empty(), "a look-up recalled something: {out:?}");
        let (r, out) = run_at(&mut srv, s, id + 1, vec![Op::GetAttr { ino: d.ino }], after(t + 1));
        assert!(matches!(&r, Ok(Reply::AttrOnly(x)) if x.ino == d.ino), "getattr of d: {r:?}");
        assert!(out.is_empty(), "{out:?}");
        let (r, out) = run_at(&mut srv, s, id + 2, vec![Op::Lookup { parent: 1, name: b"d".to_vec() }], after(t + 2));
        let Ok(Reply::Lookup { attr: Some(x), leaf }) = r else { panic!("lookup d: {r:?}") };
        assert!(x.ino == d.ino && leaf.items.is_empty(), "d found, no stretch of the root naming it: {leaf:?}");
        assert!(out.is_empty(), "{out:?}");
        // The create answers at once: nobody holds d.
        let (r, out) = run_at(&mut srv, s, id + 3, vec![make_op(d.ino, &name, p::FileType::Regular)], after(t + 3));
        assert!(matches!(r, Ok(Reply::Entry(_))), "create {name}: {r:?}");
        assert!(out.iter().all(|o| !matches!(o, Outgoing::Notify { notify: p::Notify::Recall { .. }, .. })), "{out:?}");
        assert!(!srv.caps.held_elsewhere(s, d.ino), "d held after {name}");
    }
    // Once the others have been quiet a window, d is lent again.
    let (r, _) = run_at(&mut srv, b, 90, vec![Op::GetAttr { ino: d.ino }], after(1_500));
    assert!(matches!(&r, Ok(Reply::Attr(x)) if x.ino == d.ino), "{r:?}");
    // A client of protocol 14 cannot be told: its getattr is held as before.
    let (old, _) = srv.handle_hello(&p::Hello { version: 14, ..hello(None) });
    let old = old.expect("a session of protocol 14");
    let (r, _) = run_answering(&mut srv, a, 91, vec![make_op(d.ino, "late", p::FileType::Regular)], after(1_600));
    assert!(r.is_ok(), "{r:?}");
    let (r, _) = run_at(&mut srv, old, 1, vec![Op::GetAttr { ino: d.ino }], after(1_700));
    assert!(matches!(&r, Ok(Reply::Attr(_))), "{r:?}");
}

/// Request op making `name` of `kind` in `parent`.
fn make_op(parent: u64, name: &str, kind: p::FileType) -> Op {
    let mode = if kind == p::FileType::Directory { 0o755 } else { 0o644 };
    Op::Create { parent, name: name.as_bytes().to_vec(), kind, mode, rdev: 0, cred: p::Cred::default() }
}

/// `run_at`, answering every recall it makes at once (and returning what went out then).
fn run_answering(
    srv: &mut Server,
    session: SessionId,
    id: u64,
    ops: Vec<Op>,
    at: p::Time,
) -> (Result<Reply, p::OpError>, Vec<Outgoing>) {
    srv.handle(session, req(id, ops), at);
    let mut seen = Vec::new();
    for _ in 0..10 {
        let out = srv.take_outgoing();
        for o in &out {
            if let Outgoing::Response { session: s, response } = o {
                if *s == session {
                    return (response.results[0].clone(), seen);
                }
            }
        }
        for o in out {
            if let Outgoing::Notify { session: s, notify: p::Notify::Recall { recall_id, .. } } = &o {
                srv.recall_done(*s, *recall_id, at);
            }
            seen.push(o);
        }
    }
    panic!("no response to request {id}")
}

#[test]
fn a_lookup_finding_a_directory_another_session_holds_whole_still_recalls_it() {
    // a made d (it holds d whole) and creates in it, so d counts as used by a; b's look-up
    // of d must still take d back from a before b hears d's attributes: a's creates in d
    // may be ahead of the server's (its writeback).
    let (mut srv, a, b) = two_sessions();
    let (r, _) = run_at(&mut srv, a, 1, vec![make_op(1, "d", p::FileType::Directory)], after(0));
    let Ok(Reply::Entry(d)) = r else { panic!("mkdir d: {r:?}") };
    let (r, _) = run_at(&mut srv, a, 2, vec![make_op(d.ino, "f", p::FileType::Regular)], after(10));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(srv.caps.exclusive_elsewhere(b, d.ino), Some(a));
    srv.handle(b, req(1, vec![Op::Lookup { parent: 1, name: b"d".to_vec() }]), after(20));
    let out = srv.take_outgoing();
    assert!(
        out.iter().any(|o| matches!(o, Outgoing::Notify { session, notify: p::Notify::Recall { inodes, .. } }
            if *session == a && inodes.contains(&d.ino))),
        "no recall of d from a: {out:?}"
    );
    assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == b)), "{out:?}");
}
