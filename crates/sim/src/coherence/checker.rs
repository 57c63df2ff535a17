//! The checker: what each answer may be, given what was applied and completed.

use super::*;

/// What a request that ran should have answered.
#[derive(Clone, Debug)]
pub(crate) struct Expect {
    pub(crate) results: Vec<Res>,
    /// The request's place in its session's order of changes (0: changes nothing).
    pub(crate) seq: u64,
    /// Directory listings at the time, for checking lookup leaves.
    pub(crate) listings: Vec<Option<BTreeMap<Vec<u8>, AttrV>>>,
    /// With every completed local answer laid on top (when some was not yet applied):
    /// what a coherent server would have answered. (Which client's answers were missing.)
    pub(crate) coherent: Option<(Vec<Res>, Vec<usize>)>,
    /// The time it ran at.
    pub(crate) time: p::Time,
}

/// A change a client answered itself (writeback).
#[derive(Clone, Debug)]
pub(crate) struct Local {
    pub(crate) client: usize,
    pub(crate) session: SessionId,
    pub(crate) op: Op,
    pub(crate) time: p::Time,
    pub(crate) answer: Res,
    pub(crate) done_lc: u64,
    /// The model state (`Checker::k`) that first includes it.
    pub(crate) applied_k: Option<u64>,
    /// Its session was fenced before the server applied it: it never will be (the client
    /// reports it failed later, as a deferred EIO). Nobody else need see it; its own
    /// client may, from what it still holds, until it learns of the fencing.
    pub(crate) lost: bool,
    /// What the names it removes or moves stood for when its client answered it.
    pub(crate) named: Vec<(u64, Vec<u8>, u64)>,
    /// A system call's change answered by the server and lost by a crash before it was
    /// committed: the request whose replay applies it.
    pub(crate) replay_of: Option<(SessionId, u64)>,
    /// Applied, then taken back by a crash: it comes again only from its client.
    pub(crate) taken_back: bool,
    /// For a create a crash took back (a system call's or a writeback's): the handles
    /// open on its file then (opens are not replayed, the restored sessions open them
    /// again), which keep it when a lost unlink laid after it leaves it no name.
    pub(crate) opens: BTreeSet<(SessionId, u64)>,
}

impl Local {
    /// Lays the answer on an older state `m`, unless a name it removes or moves stands for
    /// another inode there: an uncompleted change (a rename onto that name, say) came in
    /// between, and the answer was about what that change put there, not about `m`'s.
    pub(crate) fn lay_on(&self, m: &mut Model) {
        let same = self.named.iter().all(|(d, n, ino)| m.dirs.get(d).and_then(|e| e.get(n)).is_none_or(|i| i == ino));
        if same {
            if let (Some(_), Op::CreateAt { ino, .. }) = (self.replay_of, &self.op) {
                // (A lost create took its number from the counter, which its replay
                // moves on again.)
                m.next_ino = m.next_ino.max(ino + 1);
            }
            m.reopened(self.session);
            let _ = m.apply(self.session, &self.op, self.time);
            if let (Op::CreateAt { ino, .. }, false) = (&self.op, self.opens.is_empty()) {
                if let Some(i) = m.inodes.get_mut(ino) {
                    i.opens.extend(self.opens.iter().copied());
                }
            }
        }
    }
}

/// A request the server received.
#[derive(Clone, Debug)]
pub(crate) struct ReqInfo {
    pub(crate) client: usize,
    pub(crate) ops: Vec<Op>,
    pub(crate) time: Option<p::Time>,
    pub(crate) purpose: Purpose,
    pub(crate) t0_lc: u64,
}

#[derive(Default)]
pub(crate) struct Checker {
    pub(crate) model: Option<Model>,
    /// Changing requests applied so far: the model is state `k`.
    pub(crate) k: u64,
    /// States from just before the oldest change not yet completed (what an answer may
    /// show).
    pub(crate) snaps: BTreeMap<u64, Rc<Model>>,
    /// For each state, the model just before its change was applied (what changed in
    /// between was no request's: `Model::side`).
    pub(crate) pre: BTreeMap<u64, Rc<Model>>,
    /// Changes applied whose system calls have not returned (their state `k`).
    pub(crate) uncompleted: BTreeSet<u64>,
    /// States made by applying a writeback (completed when its client answered; laid on
    /// earlier states as an overlay instead).
    pub(crate) local_ks: BTreeSet<u64>,
    /// Sessions whose client died: their changes complete when the server lets their
    /// response go (nobody is left to receive it).
    pub(crate) dead_sessions: BTreeSet<SessionId>,
    /// Sessions the server fenced.
    pub(crate) fenced_sessions: BTreeSet<SessionId>,
    /// Logical clock over system call starts and completions.
    pub(crate) lc: u64,
    pub(crate) reqs: BTreeMap<(SessionId, u64), ReqInfo>,
    /// Changing requests applied: their state `k`.
    pub(crate) applied: BTreeMap<(SessionId, u64), u64>,
    pub(crate) expect: BTreeMap<(SessionId, u64), VecDeque<Expect>>,
    /// What each changing request's one run gave (the reply cache answers retries).
    pub(crate) first_run: BTreeMap<(SessionId, u64), Expect>,
    /// How many times the server ran (or answered from its cache) each request.
    pub(crate) runs: BTreeMap<(SessionId, u64), u32>,
    /// Changing requests each session has had applied.
    pub(crate) seqs: BTreeMap<SessionId, u64>,
    /// The highest place among each session's changes that ran (`Applied::seq`): what
    /// its `durable` may reach once they are committed, though changes below are parked.
    pub(crate) run_top: BTreeMap<SessionId, u64>,
    /// The highest `seq` each session was answered with.
    pub(crate) top_seq: BTreeMap<SessionId, u64>,
    pub(crate) locals: BTreeMap<u64, Local>,
    pub(crate) next_local: u64,
    /// The last state the server's store has committed (a crash keeps it), and the
    /// store's generation when that was last learnt (`note_durable`).
    pub(crate) k_durable: u64,
    pub(crate) seen_generation: u64,
    /// Changes a crash took back after their callers were answered (or their writeback
    /// answered): each must run again (its client replays it) before the run ends,
    /// unless its session is fenced or its client dies; with what it first gave.
    pub(crate) lost_done: BTreeMap<(SessionId, u64), Vec<Res>>,
    /// When each system call's change completed (`lc`), for the order of lost ones.
    pub(crate) completed_lc: BTreeMap<(SessionId, u64), u64>,
    /// Generation of every inode seen (the model does not pick them).
    pub(crate) generations: BTreeMap<u64, u64>,
    pub(crate) failure: Option<String>,
    pub(crate) stats: Stats,
    /// Requests whose opens took effect on the server at some run.
    pub(crate) opens_taken: BTreeSet<(SessionId, u64)>,
    /// Locks across server restarts: what restored sessions must take again.
    pub(crate) relock: super::relock::Relock,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub(crate) syscalls: u64,
    pub(crate) from_cache: u64,
    pub(crate) local: u64,
    pub(crate) to_server: u64,
    pub(crate) applied: u64,
    pub(crate) reply_cache_hits: u64,
    pub(crate) recalls: u64,
    pub(crate) drops: u64,
    pub(crate) partitions: u64,
    pub(crate) crashes: u64,
    pub(crate) goodbyes: u64,
    /// Reads answered from a client's cache while its system call waited.
    pub(crate) peeks: u64,
    /// Acquires sent, those whose listing the client took in, and of those, the ones
    /// that left it without `X` on the directory (a tombstone refused it).
    pub(crate) acquires: u64,
    pub(crate) acquired: u64,
    pub(crate) acquired_without_x: u64,
    /// Unlinks and rmdirs a client answered itself.
    pub(crate) local_removes: u64,
    /// Sessions the server fenced, and clients that learnt theirs was.
    pub(crate) server_fenced: u64,
    pub(crate) fenced: u64,
    pub(crate) checked: u64,
    /// Server crashes; changes applied and kept whose answers they lost (system calls
    /// failed with EIO, writebacks done); rights asked back after them, and refused.
    pub(crate) server_crashes: u64,
    pub(crate) replies_lost: u64,
    /// Changes applied and lost by crashes between commits.
    pub(crate) changes_lost: u64,
    pub(crate) reasserted: u64,
    pub(crate) reassert_refused: u64,
    /// Of the run's events (`Sim::trace_hash`).
    pub(crate) trace_hash: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub(crate) fn add(&mut self, s: &Stats) {
        self.syscalls += s.syscalls;
        self.from_cache += s.from_cache;
        self.local += s.local;
        self.to_server += s.to_server;
        self.applied += s.applied;
        self.reply_cache_hits += s.reply_cache_hits;
        self.recalls += s.recalls;
        self.drops += s.drops;
        self.partitions += s.partitions;
        self.crashes += s.crashes;
        self.goodbyes += s.goodbyes;
        self.server_fenced += s.server_fenced;
        self.peeks += s.peeks;
        self.acquires += s.acquires;
        self.acquired += s.acquired;
        self.acquired_without_x += s.acquired_without_x;
        self.local_removes += s.local_removes;
        self.fenced += s.fenced;
        self.checked += s.checked;
        self.server_crashes += s.server_crashes;
        self.replies_lost += s.replies_lost;
        self.changes_lost += s.changes_lost;
        self.reasserted += s.reasserted;
        self.reassert_refused += s.reassert_refused;
    }
}

impl Checker {
    pub(crate) fn model(&self) -> &Model {
        self.model.as_ref().expect("model")
    }

    pub(crate) fn fail(&mut self, msg: String) {
        if self.failure.is_none() {
            // (File data runs to kilobytes: a line shows its start and its end.)
            let short = |l: &str| {
                let chars: Vec<char> = l.chars().collect();
                if chars.len() <= 1_200 {
                    return l.to_string();
                }
                let (head, tail): (String, String) =
                    (chars[..800].iter().collect(), chars[chars.len() - 300..].iter().collect());
                format!("{head} …[{} chars]… {tail}", chars.len() - 1_100)
            };
            self.failure = Some(msg.lines().map(short).collect::<Vec<_>>().join("\n"));
        }
    }

    pub(crate) fn tick(&mut self) -> u64 {
        self.lc += 1;
        self.lc
    }

    pub(crate) fn attr_v(&mut self, a: &p::Attr) -> AttrV {
        let g = *self.generations.entry(a.ino).or_insert(a.generation);
        if g != a.generation {
            self.fail(format!("inode {} changed generation: {g:#x} then {:#x}", a.ino, a.generation));
        }
        AttrV {
            ino: a.ino,
            kind: a.kind,
            mode: a.mode,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size: a.size_bytes,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }

    /// What `op` answered, as compared (an `Acquire`'s lookup reply is a listing).
    pub(crate) fn res_of(&mut self, op: &Op, r: &Result<Reply, p::OpError>) -> Res {
        match (op, r) {
            (Op::Acquire { .. }, Ok(Reply::Lookup { attr: Some(a), leaf })) => {
                let dir = self.attr_v(a);
                let mut l = BTreeMap::new();
                for i in &leaf.items {
                    let v = self.attr_v(&i.attr);
                    if l.insert(i.name.clone(), v).is_some() {
                        self.fail(format!("acquire of {} lists {:?} twice", a.ino, i.name));
                    }
                }
                if (leaf.hash_lo, leaf.hash_hi) != (0, u64::MAX) {
                    self.fail(format!("acquire of {} answered with a stretch, not the whole: {leaf:?}", a.ino));
                }
                Ok(Out::Acquired(dir, l))
            }
            _ => self.res(r),
        }
    }

    pub(crate) fn res(&mut self, r: &Result<Reply, p::OpError>) -> Res {
        Ok(match r {
            Err(e) => return Err(e.errno),
            // (Attributes the client may not cache are the same answer.)
            Ok(Reply::Attr(a) | Reply::AttrOnly(a)) => Out::Attr(self.attr_v(a)),
            Ok(Reply::Entry(a)) => Out::Entry(self.attr_v(a)),
            Ok(Reply::Lookup { attr, .. }) => Out::Lookup(attr.as_ref().map(|a| self.attr_v(a))),
            Ok(Reply::Dir { items, .. }) => {
                Out::Dir(items.iter().map(|i| (i.name.clone(), self.attr_v(&i.attr))).collect())
            }
            Ok(Reply::Data(d)) => Out::Data(d.clone()),
            Ok(Reply::Done) => Out::Done,
            Ok(Reply::Inodes { first, count }) => Out::Inodes { first: *first, count: *count },
            Ok(Reply::Names(n)) => Out::Names(n.iter().cloned().collect()),
            Ok(Reply::Lock(l)) => Out::Lock(*l),
            Ok(other) => panic!("the simulator asks nothing answered with {other:?}"),
        })
    }

    /// Local answers completed before `before_lc` that state `k` does not include (as
    /// `viewer` may see them: lost ones only for their own client).
    pub(crate) fn overlay(&self, k: u64, before_lc: u64, viewer: Option<usize>) -> Vec<&Local> {
        let mut v: Vec<&Local> = self
            .locals
            .values()
            .filter(|l| l.done_lc < before_lc && l.applied_k.is_none_or(|a| a > k))
            .filter(|l| !l.lost || viewer == Some(l.client))
            .collect();
        // In the order they completed (a lost change's local answer is made at the
        // crash, long after it completed).
        v.sort_by_key(|l| l.done_lc);
        v
    }

    /// The server fenced `session`: its writebacks not applied yet never will be. A
    /// fenced client's local answers are lost changes its client reports later (the real
    /// client fails them with EIO: deferred errors on the next close or fsync), so other
    /// clients are not required to see them from here on.
    pub(crate) fn fenced(&mut self, session: SessionId) {
        self.forget_numbers_of(session);
        for l in self.locals.values_mut().filter(|l| l.session == session && l.applied_k.is_none()) {
            l.lost = true;
        }
    }

    /// The numbers `session`'s creates not applied (answered locally, or lost by a crash)
    /// took, now that they never will be (it was fenced, or its client is gone): free, as
    /// far as the model holds no file of them, to be given again to other files, of other
    /// generations. (A crash's roll-back forgets what it took back; a lost create laid on
    /// again as a local answer, shown since, stood for its replay.)
    fn forget_numbers_of(&mut self, session: SessionId) {
        let model = self.model.as_ref().expect("model");
        let freed: Vec<u64> = self
            .locals
            .values()
            .filter(|l| l.session == session && l.applied_k.is_none())
            .filter_map(|l| match l.op {
                Op::CreateAt { ino, .. } | Op::SymlinkAt { ino, .. } => Some(ino),
                _ => None,
            })
            .filter(|ino| !model.inodes.contains_key(ino) && !model.pinned.contains_key(ino))
            .collect();
        for ino in freed {
            self.generations.remove(&ino);
        }
    }

    /// Session `session`'s client is gone (it died, or said goodbye): changes of it a
    /// crash took back are never replayed. They stand for nobody.
    pub(crate) fn never_replayed(&mut self, session: SessionId) {
        self.forget_numbers_of(session);
        self.lost_done.retain(|(s, _), _| *s != session);
        self.locals
            .retain(|_, l| !(l.applied_k.is_none() && l.session == session && (l.replay_of.is_some() || l.taken_back)));
    }

    /// The server ran (or answered from its reply cache) a request.
    pub(crate) fn on_applied(&mut self, a: crest_server::Applied, server_now: p::Time) -> Option<String> {
        let key = (a.session, a.id);
        *self.runs.entry(key).or_default() += 1;
        let Some(info) = self.reqs.get(&key).cloned() else {
            self.fail(format!("the server ran request {key:?}, which nobody sent"));
            return None;
        };
        if matches!(info.purpose, Purpose::Reassert) && a.from_cache {
            // (Sent again after a reconnect, it ran already: answered again, not run.)
            return Some(format!("server: answers {key:?} again (a re-assert that ran)"));
        }
        if matches!(info.purpose, Purpose::Reassert) {
            // (Changes only who holds what, and which handles are open: a handle opened
            // again after a restart, in the restored session or a new one, holds its file
            // as any open does, until released — at once, if it was opened again only for
            // the replays; a lock taken again holds as any lock does, also one on a file a
            // crash took back and a replay made again; the client checks what it was
            // given back.)
            let model = self.model.as_mut().expect("model");
            let reasserts = |op: &&Op| matches!(op, Op::Open { .. } | Op::Release { .. } | Op::SetLock { .. });
            for op in info.ops.iter().filter(reasserts) {
                let _ = model.apply(key.0, op, server_now);
            }
            if let Err(e) = self.relock.reasserted(key.0, key.1, &info.ops) {
                self.fail(e);
            }
            return Some(format!("server: runs {key:?} (re-assert)"));
        }
        if a.from_cache {
            self.stats.reply_cache_hits += 1;
            // (A request that changes nothing, run while its session replayed after a
            // restart, is answered again as it was when sent again.)
            let read_only = !info.ops.iter().any(Op::is_mutation);
            let ran = self.applied.contains_key(&key) || (read_only && self.first_run.contains_key(&key));
            if !ran {
                self.fail(format!("request {key:?} answered from the reply cache but it never ran"));
                return None;
            }
            let first = self.first_run.get(&key).cloned();
            if let Some(e) = first {
                self.expect.entry(key).or_default().push_back(e);
            }
            return Some(format!("server: answers {key:?} from its reply cache"));
        }
        self.stats.applied += 1;
        let mutates = info.ops.iter().any(Op::is_mutation);
        let now = info.time.unwrap_or(server_now);
        // (An acquire is a read of the system call's: its answer must be as coherent.)
        // (A replay's answer goes to no caller: it was answered before the crash.)
        let is_replay = mutates && self.lost_done.contains_key(&key);
        let syscall = matches!(info.purpose, Purpose::Syscall | Purpose::Acquire { .. }) && !is_replay;
        if info.time.is_none() && !is_replay {
            self.replays_came_first(key, &info.ops);
        }
        // Completed local answers (of anyone) the server has not applied yet: a coherent
        // answer to a system call started after them shows them.
        let coherent = if syscall {
            let ov: Vec<Local> = self.overlay(self.k, info.t0_lc, None).into_iter().cloned().collect();
            (!ov.is_empty()).then(|| {
                let mut m = self.model().clone();
                for l in &ov {
                    l.lay_on(&mut m);
                }
                let mut r: Vec<Res> = info.ops.iter().map(|op| m.apply(key.0, op, now)).collect();
                refused_if_busy(&info.ops, &mut r, a.busy);
                (r, ov.iter().map(|l| l.client).collect())
            })
        } else {
            None
        };
        if mutates {
            let last = self.snaps.last_key_value().map(|(_, m)| m.clone());
            let pre = match last {
                Some(m) if m.side == self.model().side => m,
                _ => Rc::new(self.model().clone()),
            };
            self.pre.insert(self.k + 1, pre);
        }
        // (A lookup's leaf is the directory as the operations before it in the request
        // left it.)
        let model = self.model.as_mut().expect("model");
        self.relock.before_run(key, &info.ops, &model.locks);
        let mut listings = Vec::new();
        let mut results: Vec<Res> = Vec::new();
        for op in &info.ops {
            listings.push(match op {
                Op::Lookup { parent, .. } => model.listing(*parent).ok(),
                _ => None,
            });
            results.push(model.apply(key.0, op, now));
        }
        refused_if_busy(&info.ops, &mut results, a.busy);
        if info.ops.iter().any(|op| matches!(op, Op::Open { .. })) && results.iter().all(Result::is_ok) {
            self.opens_taken.insert(key);
        }
        let what = format!("server: runs {}/{} [{}] → {}", key.0, key.1, ops_brief(&info.ops), res_brief(&results));
        let replay = if mutates { self.lost_done.remove(&key) } else { None };
        if let Some(first) = &replay {
            // A replay comes out as the change first did (it carries the time the change
            // first ran at, and draws the same generations) — but a change of a file
            // unlinked while another session held it open, whose opener has not opened it
            // again after the restart (or closed it meanwhile): gone (ENOENT) until then.
            let model = self.model();
            let orphaned = info.ops.iter().flat_map(|op| op.named_inodes()).any(|i| model.pinned.contains_key(&i));
            let same = first.iter().zip(&results).all(|(f, r)| f == r || (orphaned && *r == Err(ENOENT)));
            if !same || first.len() != results.len() {
                self.fail(format!(
                    "request {key:?} {:?} ran again after a crash and gave {results:?}, first {first:?}",
                    info.ops
                ));
            }
        }
        if mutates {
            if self.applied.contains_key(&key) {
                self.fail(format!("request {key:?} applied twice: {:?}", info.ops));
            }
            self.k += 1;
            let snap = Rc::new(self.model().clone());
            self.snaps.insert(self.k, snap);
            self.applied.insert(key, self.k);
            let k = self.k;
            if replay.is_some() {
                for l in self.locals.values_mut().filter(|l| l.replay_of == Some(key)) {
                    l.applied_k = Some(k);
                    self.local_ks.insert(k);
                }
            }
            match info.purpose {
                // (A replay's caller was answered before the crash.)
                Purpose::Syscall if replay.is_some() => {}
                Purpose::Syscall => {
                    self.uncompleted.insert(k);
                }
                Purpose::Acquire { .. } | Purpose::Reassert | Purpose::Behind => {
                    self.fail(format!("{key:?} ran as a change"))
                }
                // It completed when its client answered.
                Purpose::Writeback { n, .. } => {
                    if let Some(l) = self.locals.get_mut(&n) {
                        l.applied_k = Some(k);
                        self.local_ks.insert(k);
                    }
                }
            }
            self.prune();
        }
        let top = self.run_top.entry(a.session).or_default();
        *top = (*top).max(a.seq);
        let seq = if mutates {
            let n = self.seqs.entry(a.session).or_default();
            *n += 1;
            *n
        } else {
            0
        };
        let e = Expect { results, seq, listings, coherent, time: now };
        // (And opens and locks: the server answers one sent again as it first did when it
        // ran while its session replayed after a restart.)
        let reopens = info.ops.iter().all(|op| matches!(op, Op::Open { .. } | Op::Release { .. } | Op::SetLock { .. }));
        if mutates || reopens {
            self.first_run.insert(key, e.clone());
        }
        self.expect.entry(key).or_default().push_back(e);
        Some(what)
    }

    /// New work `key` runs (neither a replay nor a writeback: it carries no client
    /// time): every change a crash took back after its caller was answered must be back
    /// first — its client replays it in the grace period, before anyone's new work runs
    /// (docs/protocol.md §4.5). New work run before it may see the state without it, or
    /// build on that state; whether it shows depends on what that work reads, so the
    /// order itself is checked. (Sessions fenced or gone replay nothing.)
    fn replays_came_first(&mut self, key: (SessionId, u64), ops: &[Op]) {
        let live = |s: &SessionId| !self.fenced_sessions.contains(s) && !self.dead_sessions.contains(s);
        let missing: Vec<(SessionId, u64)> = self.lost_done.keys().filter(|(s, _)| live(s)).copied().collect();
        if !missing.is_empty() {
            let theirs: Vec<String> =
                missing.iter().map(|k| self.reqs.get(k).map_or(String::new(), |i| ops_brief(&i.ops))).collect();
            self.fail(format!(
                "{key:?} [{}] ran before the replays of {missing:?} ({theirs:?}): new work ran before every replay",
                ops_brief(ops)
            ));
        }
    }

    /// A response left the server (delivered or not): is it what the model said?
    pub(crate) fn on_response(&mut self, session: SessionId, resp: &p::Response) {
        let key = (session, resp.id);
        if matches!(self.reqs.get(&key), Some(ReqInfo { purpose: Purpose::Reassert, .. })) {
            return;
        }
        let ops = self.reqs.get(&key).map(|i| i.ops.clone()).unwrap_or_default();
        let got: Vec<Res> = resp.results.iter().zip(&ops).map(|(r, op)| self.res_of(op, r)).collect();
        // Runs of a request answer in the order they ran, except a read that waits on
        // recalls (an acquire): a resend's run can be answered before the first run is.
        // Whichever run this is, it must be one.
        let queue = self.expect.entry(key).or_default();
        let at = queue.iter().position(|e| e.results == got).unwrap_or(0);
        let Some(e) = queue.remove(at) else {
            self.fail(format!("response to {key:?} from no run of it: {resp:?}"));
            return;
        };
        self.stats.checked += 1;
        // (Its client checks `seq` against the change's place: a change takes its place as
        // it arrives, parked or not, so it need not count the changes applied before it.)
        let top = self.top_seq.entry(session).or_default();
        *top = (*top).max(resp.seq);
        let top = (*top).max(self.seqs.get(&session).copied().unwrap_or(0));
        let top = top.max(self.run_top.get(&session).copied().unwrap_or(0));
        if resp.durable > top || (resp.seq == 0) != (e.seq == 0) {
            self.fail(format!(
                "response to {key:?} says seq {} durable {}; expected seq {} (highest so far {top})",
                resp.seq, resp.durable, e.seq
            ));
        }
        if got != e.results {
            let ops = self.reqs.get(&key).map(|i| i.ops.clone());
            let client = self.reqs.get(&key).map(|i| i.client);
            // (Who holds the files it names open, in the model: a common cause.)
            let model = self.model();
            let held: Vec<(u64, Vec<(SessionId, u64)>)> = ops
                .iter()
                .flatten()
                .flat_map(Op::named_inodes)
                .filter_map(|i| model.inodes.get(&i).map(|n| (i, n.opens.iter().copied().collect())))
                .collect();
            self.fail(format!(
                "reply to client {client:?}'s request {key:?} {ops:?} differs from the model:\n  server: {got:?}\n  model:  {:?}\n  open in the model: {held:?}",
                e.results
            ));
            return;
        }
        if let Some((coherent, clients)) = &e.coherent {
            if &got != coherent {
                let ops = self.reqs.get(&key).map(|i| i.ops.clone());
                self.fail(format!(
                    "coherence: reply to {key:?} {ops:?} misses a completed local answer of client(s) {clients:?}:\n  server: {got:?}\n  coherent: {coherent:?}"
                ));
                return;
            }
        }
        for ((r, listing), op) in resp.results.iter().zip(&e.listings).zip(self.reqs[&key].ops.clone()) {
            let (Ok(Reply::Lookup { leaf, .. }), Some(listing)) = (r, listing) else { continue };
            let mut seen = BTreeSet::new();
            for i in &leaf.items {
                let v = self.attr_v(&i.attr);
                if listing.get(&i.name) != Some(&v) || !leaf.covers(p::name_hash(&i.name)) {
                    self.fail(format!(
                        "lookup leaf of {op:?} lists {:?} as {v:?}; the model: {:?}",
                        i.name,
                        listing.get(&i.name)
                    ));
                }
                seen.insert(i.name.clone());
            }
            for name in listing.keys() {
                if leaf.covers(p::name_hash(name)) && !seen.contains(name) {
                    self.fail(format!("lookup leaf of {op:?} covers {name:?} but does not list it: {leaf:?}"));
                }
            }
        }
        if let Some(ReqInfo { purpose: Purpose::Writeback { n, .. }, .. }) = self.reqs.get(&key) {
            if let Some(l) = self.locals.get(n) {
                if got[0] != l.answer {
                    self.fail(format!(
                        "writeback {key:?} {:?} came out differently from the client's answer:\n  server: {:?}\n  client: {:?}",
                        l.op, got[0], l.answer
                    ));
                }
            }
        }
    }

    /// A system call's response reached its client: the change is complete.
    pub(crate) fn completed(&mut self, key: (SessionId, u64)) -> u64 {
        if let Some(&k) = self.applied.get(&key) {
            self.uncompleted.remove(&k);
            self.prune();
        }
        let lc = self.tick();
        self.completed_lc.insert(key, lc);
        lc
    }

    /// The server ran a request (`Applied`) and left its store at `generation`, `dirty`
    /// or not; `k_before` was the state before it ran. A commit since the last one seen
    /// kept everything applied before it: with nothing left uncommitted, the request too.
    pub(crate) fn note_durable(&mut self, k_before: u64, generation: u64, dirty: bool) {
        if generation != self.seen_generation {
            self.seen_generation = generation;
            self.k_durable = if dirty { k_before } else { self.k };
        } else if !dirty {
            self.k_durable = self.k;
        }
    }

    /// The server died with changes after state `k_durable` not committed: they are
    /// gone. The model goes back to that state, with the handles and locks of now (the
    /// restored sessions open theirs again; the locks were emptied by the crash, to be
    /// taken again: `Checker::locks_lost`) and the image's
    /// orphans nobody holds kept as the restarted server keeps them (for the grace);
    /// `in_store` says which inodes the image has (an orphan's end may have been
    /// committed since). Lost changes whose callers were answered must come again.
    pub(crate) fn roll_back(&mut self, in_store: impl Fn(u64) -> bool) {
        let kd = self.k_durable;
        if kd >= self.k {
            return;
        }
        let Some(base) = self.snaps.get(&kd).cloned() else {
            return self.fail(format!("no state {kd} to roll back to (at {})", self.k));
        };
        let cur = self.model.take().expect("model");
        let mut m = (*base).clone();
        // (Files kept then only by pins are orphans in the image too, a pin being a store
        // handle: sorted with the others below.)
        for (ino, i) in std::mem::take(&mut m.pinned) {
            m.inodes.entry(ino).or_insert(i);
        }
        for (ino, i) in m.inodes.iter_mut() {
            i.opens = cur.inodes.get(ino).map(|c| c.opens.clone()).unwrap_or_default();
        }
        let orphans: Vec<u64> = m.inodes.iter().filter(|(_, i)| i.nlink == 0).map(|(&ino, _)| ino).collect();
        for ino in orphans {
            let gone = !in_store(ino);
            let unheld = m.inodes[&ino].opens.is_empty();
            if let Some(i) = (gone || unheld).then(|| m.inodes.remove(&ino)).flatten() {
                if !gone {
                    m.pinned.insert(ino, i);
                }
            }
        }
        m.locks = Default::default();
        for (ino, req) in cur.locks.entries() {
            // (A lock on a file the crash took back is refused when taken again.)
            if m.inodes.contains_key(&ino) {
                let _ = m.locks.set(ino, &req);
            }
        }
        m.early.clear();
        m.grace = None;
        m.side = cur.side + 1;
        let gone_opens: BTreeMap<u64, BTreeSet<(SessionId, u64)>> = cur
            .inodes
            .iter()
            .filter(|(ino, i)| !i.opens.is_empty() && !m.inodes.contains_key(ino) && !m.pinned.contains_key(ino))
            .map(|(&ino, i)| (ino, i.opens.clone()))
            .collect();
        self.model = Some(m);
        let mut lost: Vec<((SessionId, u64), u64)> =
            self.applied.iter().filter(|(_, &k)| k > kd).map(|(&key, &k)| (key, k)).collect();
        lost.sort_by_key(|&(_, k)| k);
        for (key, k) in lost {
            self.applied.remove(&key);
            // A response not yet out is gone with the server.
            self.expect.remove(&key);
            // (A replay lost again stands as before: its local answers are there.)
            let replayed = self.locals.values().any(|l| l.replay_of == Some(key));
            // (A session whose client is gone, or fenced, replays nothing.)
            let gone = self.dead_sessions.contains(&key.0) || self.fenced_sessions.contains(&key.0);
            let done = !gone && !self.uncompleted.contains(&k) && (!self.local_ks.contains(&k) || replayed);
            if done {
                if let Some(first) = self.first_run.get(&key).cloned() {
                    self.lost_done.insert(key, first.results.clone());
                    if !replayed {
                        self.lost_answer(key, k, &first, &gone_opens);
                    }
                }
            }
            if let Some(n) = self.seqs.get_mut(&key.0) {
                *n = n.saturating_sub(1);
            }
        }
        for l in self.locals.values_mut() {
            if l.applied_k.is_some_and(|k| k > kd) {
                l.applied_k = None;
                l.taken_back = true;
                // (As `lost_answer` for a system call's create.)
                if let Op::CreateAt { ino, .. } = l.op {
                    l.opens = gone_opens.get(&ino).cloned().unwrap_or_default();
                }
            }
        }
        let gone: Vec<SessionId> = self.dead_sessions.iter().chain(&self.fenced_sessions).copied().collect();
        for s in gone {
            self.never_replayed(s);
        }
        self.uncompleted.retain(|&k| k <= kd);
        self.local_ks.retain(|&k| k <= kd);
        self.snaps.retain(|&k, _| k <= kd);
        self.pre.retain(|&k, _| k <= kd);
        self.k = kd;
        // Numbers the lost creates took may be given again, to other files.
        let model = self.model.as_ref().expect("model");
        let known: BTreeSet<u64> = model.inodes.keys().chain(model.pinned.keys()).copied().collect();
        self.generations.retain(|ino, _| known.contains(ino));
    }

    /// Change `key` (state `k`), answered as `first` and lost by a crash, stands as its
    /// client's caller saw it until its replay: as a local answer completed and not yet
    /// applied (what an answer may show).
    fn lost_answer(
        &mut self,
        key: (SessionId, u64),
        k: u64,
        first: &Expect,
        gone_opens: &BTreeMap<u64, BTreeSet<(SessionId, u64)>>,
    ) {
        let Some(info) = self.reqs.get(&key).cloned() else { return };
        let before = self.pre.get(&k).cloned();
        for (op, res) in info.ops.iter().zip(&first.results) {
            if !op.is_mutation() || res.is_err() {
                continue;
            }
            let op = match (op, res) {
                // (As the number it was given.)
                (Op::Create { parent, name, kind, mode, rdev, cred }, Ok(Out::Entry(a))) => Op::CreateAt {
                    ino: a.ino,
                    generation: 0,
                    parent: *parent,
                    name: name.clone(),
                    kind: *kind,
                    mode: *mode,
                    rdev: *rdev,
                    cred: *cred,
                },
                _ => op.clone(),
            };
            let named = before
                .as_ref()
                .map(|m| {
                    op.named_entries()
                        .into_iter()
                        .filter_map(|(d, n)| Some((d, n.to_vec(), *m.dirs.get(&d)?.get(n)?)))
                        .collect()
                })
                .unwrap_or_default();
            let opens = match &op {
                Op::CreateAt { ino, .. } => gone_opens.get(ino).cloned().unwrap_or_default(),
                _ => BTreeSet::new(),
            };
            let n = self.next_local;
            self.next_local += 1;
            let local = Local {
                client: info.client,
                session: key.0,
                op,
                time: first.time,
                answer: res.clone(),
                done_lc: self.completed_lc.get(&key).copied().unwrap_or(0),
                applied_k: None,
                lost: false,
                named,
                replay_of: Some(key),
                taken_back: false,
                opens,
            };
            self.locals.insert(n, local);
        }
    }

    /// Keeps the states an answer may still show: from just before the oldest change
    /// not completed (all of them when every change is).
    pub(crate) fn prune(&mut self) {
        // (The state a crash would roll back to stays too.)
        let w = self.uncompleted.first().map_or(self.k, |k| k - 1).min(self.k_durable);
        self.snaps = self.snaps.split_off(&w);
        self.pre = self.pre.split_off(&w);
        self.local_ks = self.local_ks.split_off(&(w + 1));
        self.locals.retain(|_, l| l.applied_k.is_none_or(|k| k > w));
    }

    /// State `k` with the local answers completed before `before_lc` that it lacks.
    pub(crate) fn state(&self, k: u64, before_lc: u64, viewer: Option<usize>) -> std::borrow::Cow<'_, Model> {
        let ov = self.overlay(k, before_lc, viewer);
        if ov.is_empty() {
            return std::borrow::Cow::Borrowed(&self.snaps[&k]);
        }
        let mut m = (*self.snaps[&k]).clone();
        // (The handles to open again are the server's now, whatever the state.)
        m.reopen.clone_from(&self.model().reopen);
        for l in ov {
            l.lay_on(&mut m);
        }
        std::borrow::Cow::Owned(m)
    }

    /// May a client show `val` for `item` now? Only a value at least as new as the last
    /// completed change of the item (local answers laid on), and no newer than the
    /// server's.
    pub(crate) fn item_ok(&self, item: &Item, val: &Val, before_lc: u64, viewer: Option<usize>) -> bool {
        let ks: Vec<u64> = self.snaps.keys().rev().copied().collect();
        for (i, &k) in ks.iter().enumerate() {
            if &self.state(k, before_lc, viewer).val(item) == val {
                return true;
            }
            let Some(&older) = ks.get(i + 1) else { break };
            // Going back past change `k` is allowed only if it is not completed (or is
            // a writeback, which the overlay keeps) or did not touch the item.
            let completed = !self.uncompleted.contains(&k) && !self.local_ks.contains(&k);
            let before = self.pre.get(&k).unwrap_or(&self.snaps[&older]);
            if completed && before.val(item) != self.snaps[&k].val(item) {
                break;
            }
        }
        false
    }

    /// A client answered a read from its cache: every item it showed must be allowed.
    pub(crate) fn check_cached(&mut self, client: usize, op: &Op, reply: &Reply) {
        self.stats.checked += 1;
        let before = self.lc + 1;
        for (item, val) in self.items(op, reply) {
            if !self.item_ok(&item, &val, before, Some(client)) {
                // Where the item changes, oldest first (states not listed repeat the one
                // above them).
                let mut cands: Vec<String> = Vec::new();
                let mut last = None;
                for &k in self.snaps.keys() {
                    let v = self.state(k, before, Some(client)).val(&item);
                    if last.as_ref() != Some(&v) {
                        let done = if self.uncompleted.contains(&k) { "not completed" } else { "completed" };
                        cands.push(format!("  state {k} ({done}): {v:?}"));
                        last = Some(v);
                    }
                }
                let pending: Vec<String> = self
                    .locals
                    .values()
                    .filter(|l| l.applied_k.is_none())
                    .map(|l| {
                        format!(
                            "  client {}: {} (replay of {:?})",
                            l.client,
                            ops_brief(std::slice::from_ref(&l.op)),
                            l.replay_of
                        )
                    })
                    .collect();
                self.fail(format!(
                    "coherence: client {client} answered [{}] from its cache: {item:?} = {val:?}\nbut it may show only a value no older than the last completed change:\n{}\nlocal answers not yet applied:\n{}",
                    ops_brief(std::slice::from_ref(op)),
                    cands.join("\n"),
                    pending.join("\n")
                ));
                return;
            }
        }
    }

    /// What an answer from the cache says, item by item.
    pub(crate) fn items(&mut self, op: &Op, reply: &Reply) -> Vec<(Item, Val)> {
        let mut v = Vec::new();
        match (op, reply) {
            (Op::Lookup { parent, name }, Reply::Lookup { attr, .. }) => {
                v.push((Item::Entry(*parent, name.clone()), Val::Entry(Ok(attr.as_ref().map(|a| a.ino)))));
                if let Some(a) = attr {
                    v.push((Item::Attr(a.ino), Val::Attr(Some(self.attr_v(a)))));
                }
            }
            (Op::GetAttr { ino }, Reply::Attr(a) | Reply::AttrOnly(a)) => {
                v.push((Item::Attr(*ino), Val::Attr(Some(self.attr_v(a)))))
            }
            (Op::Read { ino, .. }, Reply::Data(d)) => v.push((Item::Data(*ino), Val::Data(Some(d.clone())))),
            (Op::ReadDir { ino, .. }, Reply::Dir { items, .. }) => {
                let names = items.iter().map(|i| (i.name.clone(), i.attr.ino)).collect();
                v.push((Item::Listing(*ino), Val::Listing(Ok(names))));
                for i in items {
                    v.push((Item::Attr(i.attr.ino), Val::Attr(Some(self.attr_v(&i.attr)))));
                }
            }
            _ => panic!("no cached answer {reply:?} to {op:?}"),
        }
        v
    }

    /// A client answered a change itself (under `X`): applied to some state it may show,
    /// the change must give the same answer.
    pub(crate) fn check_local(&mut self, (client, session): (usize, SessionId), op: &Op, now: p::Time, reply: &Reply) {
        self.stats.checked += 1;
        let got = self.res(&Ok(reply.clone()));
        let before = self.lc + 1;
        let results: Vec<(u64, Res)> = self
            .snaps
            .keys()
            .map(|&k| (k, self.state(k, before, Some(client)).into_owned().apply(session, op, now)))
            .collect();
        if !results.iter().any(|(_, r)| r == &got) {
            let cands: Vec<String> =
                results.iter().map(|(k, r)| format!("  state {k}: {}", res_brief(std::slice::from_ref(r)))).collect();
            self.fail(format!(
                "coherence: client {client} answered [{}] itself with {}\nbut no state it may show gives that:\n{}",
                ops_brief(std::slice::from_ref(op)),
                res_brief(&[got]),
                cands.join("\n")
            ));
        }
    }
}

/// One thing a client can observe.
#[derive(Clone, Debug)]
pub(crate) enum Item {
    /// What a name in a directory names.
    Entry(u64, Vec<u8>),
    /// Every name of a directory.
    Listing(u64),
    Attr(u64),
    Data(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Val {
    Entry(Result<Option<u64>, i32>),
    Listing(Result<BTreeMap<Vec<u8>, u64>, i32>),
    Attr(Option<AttrV>),
    Data(Option<Vec<u8>>),
}

impl Model {
    pub(crate) fn val(&self, item: &Item) -> Val {
        match item {
            Item::Entry(d, name) => Val::Entry(self.dir(*d).map(|e| e.get(name).copied())),
            Item::Listing(d) => Val::Listing(self.dir(*d).cloned()),
            // (A file kept only by pins is gone to every request but an `Open`, which
            // brings it back as it was: as an item it is the orphan it may become, so
            // that the `Open`, which changes nothing else, does not look like a change.)
            Item::Attr(i) => Val::Attr(self.attr(*i).or_else(|| self.pinned_attr(*i))),
            Item::Data(i) => Val::Data(
                self.inodes
                    .get(i)
                    .or_else(|| self.pinned.get(i))
                    .filter(|n| n.kind == p::FileType::Regular)
                    .map(|n| n.data.clone()),
            ),
        }
    }
}

/// The server refused an acquire in a request because its directory was shared
/// (`Applied::busy`): its choice, which no model of the file system predicts. (Such an
/// acquire reads nothing: the model's answer to it is replaced, not its state.)
fn refused_if_busy(ops: &[Op], results: &mut [Res], busy: bool) {
    if busy {
        for (op, r) in ops.iter().zip(results) {
            if matches!(op, Op::Acquire { .. }) {
                *r = Err(EBUSY);
            }
        }
    }
}
