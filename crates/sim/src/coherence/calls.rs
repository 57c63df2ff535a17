//! The clients' system calls: what each process does next, and how the kernel keeps a
//! client's processes apart (its inode and directory locks), answers from the cache or
//! locally, and sends the rest.

use super::*;

impl Sim {
    /// A client's next system call.
    pub(crate) fn syscall(&mut self, c: usize) {
        if self.draining {
            return;
        }
        // Before its first welcome a client knows no session to send on.
        if self.clients[c].session.is_none() {
            let inc = self.clients[c].incarnation;
            self.at(1_000, Ev::Wake { client: c, incarnation: inc });
            return;
        }
        self.steps += 1;
        self.ck.stats.syscalls += 1;
        self.faults_at(c);
        if !self.clients[c].alive || self.clients[c].leaving {
            return;
        }
        let op = self.pick_op(c);
        let locks = self.locks_of(c, &op);
        let cl = &self.clients[c];
        if cl.busy.values().any(|theirs| locks_conflict(theirs, &locks)) {
            // As the kernel's inode locks make it: the process waits until the other's
            // call on the same file or directory returns (it tries again later).
            let d = self.think();
            let inc = self.clients[c].incarnation;
            self.at(d, Ev::Wake { client: c, incarnation: inc });
            return;
        }
        // (Which locks its processes may hold: they drop them before the last close.)
        if let Op::SetLock { ino, owner, kind, flock, start, end, .. } = op {
            if kind != p::LockKind::Unlock {
                self.clients[c].locked.insert((ino, owner, flock));
            } else if (start, end) == (0, p::LOCK_TO_EOF) {
                self.clients[c].locked.remove(&(ino, owner, flock));
            }
        }
        self.check_lease_now(c);
        let (now, at) = (self.now, self.instant());
        let t0_lc = self.ck.tick();
        if let Some(reply) = self.clients[c].answer_from_cache(&op, at, now) {
            self.ck.stats.from_cache += 1;
            self.log(format!(
                "client {c}: [{}] from its cache → {:?}",
                ops_brief(std::slice::from_ref(&op)),
                brief(&[Ok(reply.clone())])
            ));
            self.ck.check_cached(c, &op, &reply);
            self.ck.tick();
            let d = self.think();
            let inc = self.clients[c].incarnation;
            self.at(d, Ev::Wake { client: c, incarnation: inc });
            return;
        }
        if let Op::Release { handle, .. } = op {
            self.close_behind(c, handle, op);
            let d = self.think();
            let inc = self.clients[c].incarnation;
            self.at(d, Ev::Wake { client: c, incarnation: inc });
            return;
        }
        if self.try_local(c, &op) {
            let d = self.think();
            let inc = self.clients[c].incarnation;
            self.at(d, Ev::Wake { client: c, incarnation: inc });
            return;
        }
        if let Some(dir) = self.wants_acquire(c, &op) {
            // As the real client before such a change in a directory it does not hold:
            // ask for it whole, then answer the change itself if it now can.
            self.ck.stats.acquires += 1;
            let cl = &mut self.clients[c];
            cl.acquire_tried.insert(dir, now);
            let purpose = Purpose::Acquire { dir, then: op.clone(), epoch: cl.names().epoch() };
            self.log(format!("client {c}: acquires {dir} before [{}]", ops_brief(std::slice::from_ref(&op))));
            let id = self.send_request(c, vec![Op::Acquire { ino: dir }], None, purpose, t0_lc);
            self.clients[c].busy.insert(id, locks);
            return;
        }
        self.send_syscall(c, op, t0_lc, locks);
    }

    /// close(2) of `handle`: the release (`op`) goes behind, nobody waits for it.
    pub(crate) fn close_behind(&mut self, c: usize, handle: u64, op: Op) {
        self.clients[c].released(handle);
        self.log(format!("client {c}: [{}] sent behind", ops_brief(std::slice::from_ref(&op))));
        let t0_lc = self.ck.tick();
        self.send_request(c, vec![op], Some(ptime(self.now)), Purpose::Behind, t0_lc);
    }

    /// What a system call `op` of client `c` holds locked while it waits on the server,
    /// as the kernel's inode and directory locks make it: what it names, the directories
    /// of the names it names, and what those names stand for as this client knows them
    /// now (another process reaches a file through its name). Another process's call
    /// that needs any of them waits (the simulated processes keep to that for every
    /// call, reads included). The victim of an unlink, rmdir or rename is locked too,
    /// but known only once the server has looked the name up: such a call stands for
    /// every file (`ANY_VICTIM`), and waits for and holds back every change (`CHANGES`).
    pub(crate) fn locks_of(&self, c: usize, op: &Op) -> BTreeSet<u64> {
        let (cl, at) = (&self.clients[c], self.instant());
        let mut s: BTreeSet<u64> = op.named_inodes().into_iter().collect();
        for (dir, name) in op.named_entries() {
            s.insert(dir);
            s.extend(cl.named(dir, name, at));
        }
        if matches!(op, Op::Unlink { .. } | Op::Rmdir { .. } | Op::Rename { .. }) {
            s.insert(ANY_VICTIM);
        }
        if op.is_mutation() || matches!(op, Op::Open { .. }) {
            s.insert(CHANGES);
        }
        s
    }

    /// The directory a client asks for whole before `op`, if it does (`Fs::acquire`):
    /// an unlink, rmdir or create in a directory it does not hold whole, not asked for
    /// within `ACQUIRE_RETRY_US`; and only in this seed's share of the cases (the real
    /// client always asks: fewer here leaves room for the synchronous paths too).
    pub(crate) fn wants_acquire(&mut self, c: usize, op: &Op) -> Option<u64> {
        let (Op::Unlink { parent, .. } | Op::Rmdir { parent, .. } | Op::Create { parent, .. }) = op else {
            return None;
        };
        let cl = &self.clients[c];
        if cl.names().holds_whole(*parent)
            || cl.acquire_tried.get(parent).is_some_and(|&t| self.now < t + ACQUIRE_RETRY_US)
        {
            return None;
        }
        let parent = *parent;
        (self.rng.below(100) < self.acquire_pct).then_some(parent)
    }

    /// A client answers a change itself if it holds what that takes (`answer_locally`):
    /// checks the answer, records it as a completed change and sends its writeback.
    pub(crate) fn try_local(&mut self, c: usize, op: &Op) -> bool {
        let (now, at) = (self.now, self.instant());
        let mut rng = self.rng.split();
        let cl = &self.clients[c];
        let named: Vec<(u64, Vec<u8>, u64)> =
            op.named_entries().into_iter().filter_map(|(d, n)| Some((d, n.to_vec(), cl.named(d, n, at)?))).collect();
        let Some((writeback, reply)) = self.clients[c].answer_locally(op, at, now, &mut rng) else { return false };
        // (The simulator answers no create with an open: one operation each.)
        let wb = writeback.ops[0].clone();
        self.ck.stats.local += 1;
        if matches!(op, Op::Unlink { .. } | Op::Rmdir { .. }) {
            self.ck.stats.local_removes += 1;
        }
        self.log(format!(
            "client {c}: [{}] answered itself → {:?}; writeback [{}]",
            ops_brief(std::slice::from_ref(op)),
            brief(&[Ok(reply.clone())]),
            ops_brief(std::slice::from_ref(&wb))
        ));
        let session = self.clients[c].sid().expect("session");
        match (&wb, &reply) {
            // An open changes nothing: what it shows is the file's attributes as the
            // cache held them, checked as a read from the cache is.
            (Op::Open { ino, .. }, Reply::Attr(_)) => self.ck.check_cached(c, &Op::GetAttr { ino: *ino }, &reply),
            _ => self.ck.check_local((c, session), &wb, ptime(now), &reply),
        }
        let answer = self.ck.res(&Ok(reply));
        let done_lc = self.ck.tick();
        let n = self.ck.next_local;
        self.ck.next_local += 1;
        let t = ptime(now);
        let purpose = Purpose::Writeback { n, what: writeback.what, touched: writeback.touched };
        self.send_request(c, writeback.ops, Some(t), purpose, done_lc);
        // (An open changes no state anybody observes: nothing to lay over the model. Its
        // `Open` must still succeed on the server: `answered`.)
        if wb.is_mutation() {
            let local = Local {
                client: c,
                session,
                op: wb,
                time: t,
                answer,
                done_lc,
                applied_k: None,
                // (A session the server has fenced, its client not yet told: lost from
                // the start, as its earlier ones are at the fencing.)
                lost: self.ck.fenced_sessions.contains(&session),
                named,
                replay_of: None,
                taken_back: false,
                opens: BTreeSet::new(),
            };
            self.ck.locals.insert(n, local);
        }
        true
    }

    /// Sends a system call's change to the server (it waits for the answer).
    pub(crate) fn send_syscall(&mut self, c: usize, op: Op, t0_lc: u64, locks: BTreeSet<u64>) {
        let mut ops = vec![op.clone()];
        if let Op::Create { parent, .. } = &op {
            let cl = &self.clients[c];
            if cl.names().is_exclusive(*parent) {
                // Creating in a directory it holds: refill the numbers for writeback
                // creates, and learn the directory's new attributes.
                if cl.pool.0 >= cl.pool.1 {
                    ops.push(Op::AllocInodes { count: INODE_BATCH });
                }
                ops.push(Op::GetAttr { ino: *parent });
            }
        }
        if let Op::Unlink { parent, name } | Op::Rmdir { parent, name } = &op {
            // As the kernel, which looks the name up before it removes it.
            ops = vec![Op::Lookup { parent: *parent, name: name.clone() }, op.clone()];
        }
        if let Op::Rename { parent, name, new_parent, new_name, .. } = &op {
            // As the kernel, which looks both names up before a rename (and does nothing
            // when they are links of one inode): the answers tell the cache which it was.
            // The moved name is looked up again behind it (as the adapter's `rename`).
            ops = vec![
                Op::Lookup { parent: *parent, name: name.clone() },
                Op::Lookup { parent: *new_parent, name: new_name.clone() },
                op.clone(),
                Op::Lookup { parent: *new_parent, name: new_name.clone() },
            ];
        }
        self.log(format!("client {c}: calls [{}]", ops_brief(&ops)));
        let id = self.send_request(c, ops, None, Purpose::Syscall, t0_lc);
        self.clients[c].busy.insert(id, locks);
    }
}

/// In `Sim::locks_of`'s sets: the call may remove or replace any file.
const ANY_VICTIM: u64 = u64::MAX;
/// In `Sim::locks_of`'s sets: the call changes something (or opens a file).
const CHANGES: u64 = u64::MAX - 1;

/// Whether calls holding `a` and `b` must run one at a time.
pub(crate) fn locks_conflict(a: &BTreeSet<u64>, b: &BTreeSet<u64>) -> bool {
    let victim = |x: &BTreeSet<u64>, y: &BTreeSet<u64>| x.contains(&ANY_VICTIM) && y.contains(&CHANGES);
    victim(a, b) || victim(b, a) || a.iter().any(|i| *i < CHANGES && b.contains(i))
}
