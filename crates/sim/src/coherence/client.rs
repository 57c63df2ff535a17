//! A simulated client: the real client core for its session (`Connection`), its cache
//! and the rules of what it may answer itself (`NameCache`, `crest_client::local`), kept
//! in step with the session by the real `CacheRights`. What is modelled is what the
//! kernel and the FUSE adapter around them do: which calls reach the cache, what each
//! reply teaches it (as `crest-fuse`'s handlers), and the kernel's page cache.

use super::*;

/// What a request is for.
#[derive(Clone, Debug)]
pub(crate) enum Purpose {
    /// The system call in progress.
    Syscall,
    /// The writeback of local answer `n` (`Checker::locals`), settled in the cache when
    /// answered (`NameCache::writeback_answered`, as the adapter's completion).
    Writeback { n: u64, what: &'static str, touched: Vec<u64> },
    /// The system call in progress first asks for `then`'s directory `dir` whole (sent
    /// with the cache at `epoch`); `then` follows when the answer comes.
    Acquire { dir: u64, then: Op, epoch: Epoch },
    /// Sent behind without waiting, its answer awaited by nobody (a release, as the
    /// adapter's `send_behind`).
    Behind,
    /// A request the client core made itself: after a server restart that restored the
    /// session, the rights the cache kept, asked back (`Op::Reassert`, by `HeldLocks`); a
    /// refused one is dropped as a recall nobody answers.
    Reassert,
}

#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) req: p::Request,
    pub(crate) purpose: Purpose,
    /// When the call started (virtual µs; what cached pages expire from).
    pub(crate) t0_us: u64,
    /// The cache's epoch when the call started (what its replies are absorbed against).
    pub(crate) epoch: Epoch,
    /// The cache's stamp then (`NameCache::attr_changed_since`).
    pub(crate) stamp: u64,
    /// The session it was made in (calls that change nothing go on in the next one
    /// when that one is fenced).
    pub(crate) session: SessionId,
    /// The client dropped every right (its lease ran out, its session was fenced or
    /// forgotten) while this was not answered yet.
    pub(crate) rights_lapsed: bool,
}

/// What the client core told the cache through its `Rights` hook, in order, for the
/// simulator's page-cache model, counts and log (the cache itself is told at once).
#[derive(Debug)]
pub(crate) enum Told {
    Recalled(Vec<u64>),
    Reset,
    Disconnected,
    Restored(Vec<(u64, bool)>),
    ReplyLost(Vec<Op>),
}

/// A client's `Rights` hook: the real `CacheRights` on its `NameCache`, and a record of
/// what it was told.
pub(crate) struct Hook {
    pub(crate) cache: CacheRights,
    pub(crate) told: Mutex<Vec<Told>>,
}

impl Hook {
    fn tell(&self, t: Told) {
        self.told.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }
}

impl Rights for Hook {
    fn granted_exclusive(&self, ino: u64, sent: Instant, now: Instant) {
        self.cache.granted_exclusive(ino, sent, now);
    }
    fn recalled(&self, inodes: &[u64], now: Instant) {
        self.cache.recalled(inodes, now);
        self.tell(Told::Recalled(inodes.to_vec()));
    }
    fn reset(&self, now: Instant) {
        self.cache.reset(now);
        self.tell(Told::Reset);
    }
    fn held(&self, now: Instant) -> Vec<(u64, bool)> {
        self.cache.held(now)
    }
    fn disconnected(&self, now: Instant) {
        self.cache.disconnected(now);
        self.tell(Told::Disconnected);
    }
    fn restored(&self, now: Instant) -> Vec<(u64, bool)> {
        let held = self.cache.restored(now);
        self.tell(Told::Restored(held.clone()));
        held
    }
    fn reply_lost(&self, ops: &[Op], now: Instant) {
        self.cache.reply_lost(ops, now);
        self.tell(Told::ReplyLost(ops.to_vec()));
    }
}

/// The kernel's page cache of one file, as the simulator models it: what reads brought
/// (trusted until `expires`, virtual µs) or what the client wrote under `X` (`None`:
/// trusted while `X` is held).
#[derive(Clone, Debug)]
pub(crate) struct Pages {
    pub(crate) data: Vec<u8>,
    pub(crate) expires: Option<u64>,
}

pub(crate) struct Client {
    pub(crate) idx: usize,
    /// Bumped at each crash: a new client process.
    pub(crate) incarnation: u32,
    pub(crate) alive: bool,
    /// The real client core: it decides what goes on the wire, when, and again.
    pub(crate) core: Connection<u64>,
    /// Its rights hook, holding its cache.
    pub(crate) hook: Arc<Hook>,
    /// Its session, once welcomed.
    pub(crate) session: Option<SessionId>,
    /// The session its core's pending calls were made in, when that one was fenced: they
    /// go on in the next.
    pub(crate) prior: Option<SessionId>,
    /// Its connection on the simulated network.
    pub(crate) conn: Option<u64>,
    pub(crate) next_id: u64,
    pub(crate) pending: BTreeMap<u64, Pending>,
    /// The requests of the system calls in progress, one per process waiting, with the
    /// inodes each call holds locked (as the kernel's inode and directory locks).
    pub(crate) busy: BTreeMap<u64, BTreeSet<u64>>,
    /// The kernel's page cache.
    pub(crate) pages: BTreeMap<u64, Pages>,
    /// Inode numbers reserved for writeback creates: next, end.
    pub(crate) pool: (u64, u64),
    /// Files its processes hold open (handle → inode): reachable by those processes
    /// whatever happens to their names.
    pub(crate) opens: BTreeMap<u64, u64>,
    /// The next file handle.
    pub(crate) next_handle: u64,
    /// Locks its processes may hold (inode, owner, flock): each unlocks before it closes
    /// the file's last descriptor here (as a close's FLUSH and RELEASE do).
    pub(crate) locked: BTreeSet<(u64, u64, bool)>,
    /// Files it saw with no name left (open, unlinked): gone for it with their last handle.
    pub(crate) unlinked: BTreeSet<u64>,
    /// Inodes it has heard of (what it can name; possibly gone).
    pub(crate) known: BTreeMap<u64, p::FileType>,
    /// Its working set: what it created or looked up lately (most of its calls go there,
    /// so that it works in what it holds, as a program does).
    pub(crate) recent: VecDeque<(u64, p::FileType)>,
    pub(crate) cred: p::Cred,
    pub(crate) partition_until: u64,
    /// Said goodbye; comes back as a new session.
    pub(crate) leaving: bool,
    /// When it last asked for each directory whole (virtual µs): at most once per
    /// `ACQUIRE_RETRY_US`, as the real client.
    pub(crate) acquire_tried: BTreeMap<u64, u64>,
    /// The highest `seq` answered in its session: a server restart must keep it.
    pub(crate) answered_seq: u64,
    /// Which life of the server last welcomed it (`Sim::server_life`).
    pub(crate) server_life: u64,
}

/// The client core of client `idx`, on the simulation's clock from `now`, with a new
/// cache behind its rights hook.
pub(crate) fn new_core(idx: usize, now: Instant) -> (Connection<u64>, Arc<Hook>) {
    let names = Arc::new(Mutex::new(NameCache::new(Duration::from_micros(TTL_US))));
    let hook = Arc::new(Hook { cache: CacheRights { names }, told: Mutex::default() });
    let rights = RightsHook::default();
    let dynhook: Arc<dyn Rights> = hook.clone();
    let _ = rights.set(dynhook);
    // (Its own ids, for re-asserts, far from the ones the simulator gives its calls.)
    let ids = Arc::new(AtomicU64::new(1 << 40));
    (Connection::new("sim", &format!("sim-{idx}"), ids, rights, now), hook)
}

impl Client {
    pub(crate) fn new(idx: usize, incarnation: u32, now: Instant) -> Client {
        let mut known = BTreeMap::new();
        known.insert(ROOT_INO, p::FileType::Directory);
        let (core, hook) = new_core(idx, now);
        Client {
            idx,
            incarnation,
            alive: true,
            core,
            hook,
            session: None,
            prior: None,
            conn: None,
            next_id: 1,
            pending: BTreeMap::new(),
            busy: BTreeMap::new(),
            pages: BTreeMap::new(),
            pool: (0, 0),
            opens: BTreeMap::new(),
            next_handle: 1,
            locked: BTreeSet::new(),
            unlinked: BTreeSet::new(),
            known,
            recent: VecDeque::new(),
            cred: p::Cred { uid: 1000 + idx as u32, gid: 100 + idx as u32, umask: 0 },
            partition_until: 0,
            leaving: false,
            acquire_tried: BTreeMap::new(),
            answered_seq: 0,
            server_life: 0,
        }
    }

    /// Its cache (never held across a call into its core, which takes it too).
    pub(crate) fn names(&self) -> std::sync::MutexGuard<'_, NameCache> {
        self.hook.cache.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn sid(&self) -> Option<SessionId> {
        self.session
    }

    pub(crate) fn learn(&mut self, a: &p::Attr) {
        if a.nlink == 0 && a.kind == p::FileType::Regular {
            // Open but unlinked: reachable only through its handles (`released`), and not
            // at all by a client that holds none.
            if !self.opens.values().any(|&i| i == a.ino) {
                self.forget(a.ino);
                return;
            }
            self.unlinked.insert(a.ino);
        }
        self.known.insert(a.ino, a.kind);
        self.recent.retain(|(i, _)| *i != a.ino);
        self.recent.push_back((a.ino, a.kind));
        if self.recent.len() > 8 {
            self.recent.pop_front();
        }
    }

    /// The kernel saw a name of `victim` go (looked up just before): with no other name
    /// left, no process can reach it again (the simulated processes hold no file open),
    /// so it is no longer used.
    pub(crate) fn name_gone(&mut self, victim: &p::Attr) {
        if victim.nlink <= 1 && self.opens.values().any(|&i| i == victim.ino) {
            self.unlinked.insert(victim.ino);
        } else if victim.nlink <= 1 || victim.kind == p::FileType::Directory {
            self.known.remove(&victim.ino);
            self.recent.retain(|(i, _)| *i != victim.ino);
            self.pages.remove(&victim.ino);
        }
    }

    /// Whether its processes still hold every handle `ops` open.
    pub(crate) fn holds(&self, ops: &[Op]) -> bool {
        ops.iter().all(|op| !matches!(op, Op::Open { handle, .. } if !self.opens.contains_key(handle)))
    }

    /// Its process closed `handle`: an unlinked file whose last handle this was is out of
    /// every process's reach (the kernel forgets it).
    pub(crate) fn released(&mut self, handle: u64) {
        let Some(ino) = self.opens.remove(&handle) else { return };
        if self.unlinked.contains(&ino) && !self.opens.values().any(|&i| i == ino) {
            self.forget(ino);
        }
    }

    /// No process of it can reach `ino` any more.
    fn forget(&mut self, ino: u64) {
        self.unlinked.remove(&ino);
        self.known.remove(&ino);
        self.recent.retain(|(i, _)| *i != ino);
        self.pages.remove(&ino);
    }

    /// The pages of `ino` the kernel may read from now.
    pub(crate) fn pages(&self, ino: u64, now: u64) -> Option<&Vec<u8>> {
        let pg = self.pages.get(&ino)?;
        let valid = match pg.expires {
            Some(e) => now < e,
            None => self.names().is_exclusive(ino),
        };
        valid.then_some(&pg.data)
    }

    /// What the core told the cache, applied to the page cache: a recall drops the
    /// recalled files' pages before it is answered; a drop of every right drops them all;
    /// a broken connection keeps only what `X` keeps; a lost answer drops what it touched.
    pub(crate) fn told(&mut self, t: &Told) {
        match t {
            Told::Recalled(inodes) => inodes.iter().for_each(|i| _ = self.pages.remove(i)),
            Told::Reset => self.pages.clear(),
            Told::Disconnected | Told::Restored(_) => {
                let names = self.hook.cache.names.lock().unwrap_or_else(|e| e.into_inner());
                self.pages.retain(|i, pg| pg.expires.is_none() && names.is_exclusive(*i));
            }
            Told::ReplyLost(ops) => {
                let names = self.hook.cache.names.lock().unwrap_or_else(|e| e.into_inner());
                let touched: BTreeSet<u64> = ops.iter().flat_map(Op::named_inodes).collect();
                self.pages.retain(|i, pg| pg.expires.is_none() && names.is_exclusive(*i) && !touched.contains(i));
            }
        }
    }

    /// Answers a read from what it holds, if the real client would: lookups and getattrs
    /// from its cache (the FUSE adapter's `lookup`, `getattr`), file data from the page
    /// cache. Listings always go to the server, as the adapter's `readdir` does.
    pub(crate) fn answer_from_cache(&self, op: &Op, at: Instant, now: u64) -> Option<Reply> {
        match op {
            Op::Lookup { parent, name } => match self.names().lookup(*parent, name, at)? {
                Cached::Absent => Some(Reply::Lookup { attr: None, leaf: empty_leaf() }),
                Cached::Found(a) => Some(Reply::Lookup { attr: Some(a), leaf: empty_leaf() }),
            },
            Op::GetAttr { ino } => self.names().attr(*ino, at).map(Reply::Attr),
            // (A process reads through a descriptor: one it holds, or one the client would
            // open without asking, its attributes held. Else the open asks the server,
            // and so does the read here.)
            Op::Read { ino, offset, len } => {
                if !self.opens.values().any(|i| i == ino) && self.names().attr(*ino, at).is_none() {
                    return None;
                }
                let d = self.pages(*ino, now)?;
                let start = (*offset as usize).min(d.len());
                let end = (start + *len as usize).min(d.len());
                Some(Reply::Data(d[start..end].to_vec()))
            }
            _ => None,
        }
    }

    /// What `name` in `dir` names, as far as its cache knows.
    pub(crate) fn named(&self, dir: u64, name: &[u8], at: Instant) -> Option<u64> {
        match self.names().lookup(dir, name, at)? {
            Cached::Found(a) => Some(a.ino),
            Cached::Absent => None,
        }
    }

    /// Answers a change itself when the real client's rules (`crest_client::local`) say
    /// it may: the writeback and the answer, with the cache (and the page cache) changed.
    /// Errors the rules answer themselves (an xattr flag's) go to the server here.
    pub(crate) fn answer_locally(
        &mut self,
        op: &Op,
        at: Instant,
        now: u64,
        rng: &mut Stream,
    ) -> Option<(Writeback, Reply)> {
        let clock = Clock { at, time: ptime(now) };
        let (wb, reply) = match op {
            Op::Create { parent, name, kind, mode, rdev, cred } => {
                if self.pool.0 >= self.pool.1 || !self.names().may_create_here(*parent, name) {
                    return None;
                }
                let node = NewNode {
                    cred: *cred,
                    parent: *parent,
                    name,
                    kind: *kind,
                    mode: *mode,
                    rdev: *rdev,
                    target: None,
                    open: None,
                    ino: self.pool.0,
                    generation: rng.next_u64(),
                };
                let (attr, wb) = self.names().create_here(&node, clock)?;
                self.pool.0 += 1;
                self.learn(&attr);
                if attr.kind == p::FileType::Regular {
                    self.pages.insert(attr.ino, Pages { data: Vec::new(), expires: None });
                }
                (wb, Reply::Entry(attr))
            }
            Op::Write { ino, offset, data } => self.write_locally(*ino, *offset, data, false, clock)?,
            Op::Append { ino, data } => self.write_locally(*ino, 0, data, true, clock)?,
            Op::SetAttr { ino, set } => {
                let (a, wb) = self.names().setattr_here(*ino, set, clock)?;
                if let (Some(size), Some(pg)) = (set.size_bytes, self.pages.get_mut(ino)) {
                    pg.data.resize(size as usize, 0);
                }
                (wb, Reply::Attr(a))
            }
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                let hook = self.hook.clone();
                let mut c = hook.cache.names.lock().unwrap_or_else(|e| e.into_inner());
                let victim = c.lookup(*parent, name, at);
                let wb = c.remove_here(*parent, name, matches!(op, Op::Rmdir { .. }), clock)?;
                drop(c);
                if let Some(Cached::Found(v)) = victim {
                    self.name_gone(&v);
                }
                (wb, Reply::Done)
            }
            Op::Rename { parent, name, new_parent, new_name, flags } => {
                let hook = self.hook.clone();
                let mut c = hook.cache.names.lock().unwrap_or_else(|e| e.into_inner());
                let victim = c.lookup(*new_parent, new_name, at);
                let (_, wb) = c.rename_here(*parent, name, *new_parent, new_name, *flags, clock)?;
                drop(c);
                if let Some(Cached::Found(v)) = victim {
                    self.name_gone(&v);
                }
                (wb, Reply::Done)
            }
            Op::Link { ino, parent, name } => {
                let (a, wb) = self.names().link_here(*ino, *parent, name, clock)?;
                (wb, Reply::Entry(a))
            }
            Op::SetXattr { ino, name, value, flags } => {
                // (Not the errors it answers itself: nothing to check them against here.)
                let wb = self.names().xattr_here(*ino, name, Some(value), *flags, clock)?.ok()?;
                (wb, Reply::Done)
            }
            Op::RemoveXattr { ino, name } => (self.names().xattr_here(*ino, name, None, 0, clock)?.ok()?, Reply::Done),
            // (As the adapter's `open`: the `Open` follows the answer, ahead of the file's
            // reads and writes.)
            Op::Open { ino, handle, access } => {
                let (a, wb) = self.names().open_here(*ino, *handle, *access, at)?;
                self.opens.insert(*handle, *ino);
                (wb, Reply::Attr(a))
            }
            _ => return None,
        };
        Some((wb, reply))
    }

    /// A write (at the held end of file, `append`) answered here: the page cache takes
    /// the data where it is the file's whole content (held under `X`).
    fn write_locally(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        clock: Clock,
    ) -> Option<(Writeback, Reply)> {
        let (a, wb) = self.names().write_here(ino, offset, data, append, clock)?;
        let at = a.size_bytes - data.len() as u64;
        let at = if append { at } else { offset };
        match self.pages.get_mut(&ino) {
            Some(pg) if pg.expires.is_none() => {
                let end = at as usize + data.len();
                if pg.data.len() < end {
                    pg.data.resize(end, 0);
                }
                pg.data[at as usize..end].copy_from_slice(data);
            }
            _ => _ = self.pages.remove(&ino),
        }
        Some((wb, Reply::Attr(a)))
    }

    /// Takes in the reply to a system call it sent (`ops`, started at `t0_us` with the
    /// cache at `epoch`), as the FUSE adapter's handlers do. Rights come from the core
    /// (`CacheRights`: a create's and an acquire's grants, in wire order with recalls).
    pub(crate) fn absorb(
        &mut self,
        ops: &[Op],
        results: &[Result<Reply, p::OpError>],
        pd: (u64, Epoch, u64, Instant),
        at: Instant,
    ) {
        let (t0_us, epoch, stamp, sent) = pd;
        for r in results.iter().flatten() {
            match r {
                Reply::Attr(a) | Reply::Entry(a) | Reply::AttrOnly(a) => self.learn(a),
                Reply::Lookup { attr, leaf } => {
                    leaf.items.iter().for_each(|i| _ = self.known.insert(i.attr.ino, i.attr.kind));
                    if let Some(a) = attr {
                        self.learn(a);
                    }
                }
                Reply::Dir { items, .. } => items.iter().for_each(|i| _ = self.known.insert(i.attr.ino, i.attr.kind)),
                _ => {}
            }
        }
        // A rename goes behind lookups of both names (`send_syscall`): when they named the
        // same inode (two hard links), the kernel would not have called it at all.
        let same_inode = match results {
            [Ok(Reply::Lookup { attr: Some(a), .. }), Ok(Reply::Lookup { attr: Some(b), .. }), ..] => {
                matches!(ops.get(2), Some(Op::Rename { .. })) && a.ino == b.ino
            }
            _ => false,
        };
        // The kernel looked the removed name up first (`send_syscall`): what it named.
        let victim = match (ops, results) {
            (
                [Op::Lookup { .. }, Op::Unlink { .. } | Op::Rmdir { .. }],
                [Ok(Reply::Lookup { attr: Some(v), .. }), Ok(Reply::Done)],
            )
            | ([_, _, Op::Rename { .. }, ..], [_, Ok(Reply::Lookup { attr: Some(v), .. }), Ok(Reply::Done), ..]) => {
                (!same_inode).then(|| v.clone())
            }
            _ => None,
        };
        if let Some(v) = &victim {
            self.name_gone(v);
        }
        let mut renamed = None;
        let hook = self.hook.clone();
        let mut c = hook.cache.names.lock().unwrap_or_else(|e| e.into_inner());
        for (op, r) in ops.iter().zip(results) {
            let Ok(r) = r else { continue };
            match (op, r) {
                (Op::GetAttr { .. }, Reply::Attr(a)) => c.hold_attr(a, epoch, at),
                (Op::ReadDir { ino, from_index: 0, .. }, Reply::Dir { items, end: true, .. }) => {
                    c.absorb_listing(*ino, items, epoch, at)
                }
                // The kernel keeps what a read brought (a short read: the whole file)
                // until a recall drops it; while the mount holds the file exclusively
                // nobody else changes it.
                (Op::Read { ino, offset: 0, len }, Reply::Data(d)) if d.len() < *len as usize => {
                    let expires = (!c.is_exclusive(*ino)).then_some(t0_us + TTL_US);
                    self.pages.insert(*ino, Pages { data: d.clone(), expires });
                }
                (Op::Create { parent, name, .. }, Reply::Entry(a)) => c.created_by_reply(*parent, name, a, sent, at),
                (Op::Open { ino, handle, .. }, Reply::Attr(a)) => {
                    c.attr_changed_since(a, stamp);
                    self.opens.insert(*handle, *ino);
                }
                (Op::AllocInodes { .. }, Reply::Inodes { first, count }) => {
                    self.pool = (*first, first + u64::from(*count));
                }
                (Op::Write { ino, .. } | Op::Append { ino, .. } | Op::SetAttr { ino, .. }, Reply::Attr(a)) => {
                    c.attr_changed_since(a, stamp);
                    self.pages.remove(ino);
                }
                (Op::SetXattr { ino, .. } | Op::RemoveXattr { ino, .. }, Reply::Done) => {
                    c.xattrs_changed(*ino);
                    c.attr_stale(*ino);
                }
                (Op::Link { parent, name, .. }, Reply::Entry(a)) => c.added_by_reply(*parent, name, a, sent, at),
                // (The adapter looks the name up in the same request: `remove_on_server`.)
                (Op::Unlink { parent, name } | Op::Rmdir { parent, name }, Reply::Done) => {
                    drop_pages_of(&mut self.pages, &c, *parent, name, at);
                    c.unlinked(*parent, name, victim.as_ref().map(|v| v.ino));
                }
                // (The kernel calls no rename of two links of one inode: `send_syscall`.)
                (Op::Rename { parent, name, new_parent, new_name, .. }, Reply::Done) if !same_inode => {
                    drop_pages_of(&mut self.pages, &c, *new_parent, new_name, at);
                    c.kernel_entry_moved(*parent, name, *new_parent, new_name);
                    let moved = match results.get(3) {
                        Some(Ok(Reply::Lookup { attr: Some(a), .. })) => Some(a.ino),
                        _ => None,
                    };
                    c.unlinked(*parent, name, moved);
                    c.unlinked(*new_parent, new_name, victim.as_ref().map(|v| v.ino));
                    renamed = Some((*new_parent, new_name.clone()));
                }
                // The moved name, looked up in the rename's request (as the adapter does).
                (Op::Lookup { parent, name }, Reply::Lookup { attr: Some(a), .. })
                    if renamed.as_ref() == Some(&(*parent, name.clone())) =>
                {
                    c.added_by_reply(*parent, name, a, sent, at);
                }
                (Op::Lookup { parent, .. }, Reply::Lookup { leaf, .. }) if renamed.is_none() => {
                    c.absorb_leaf(*parent, leaf, epoch, at)
                }
                _ => {}
            }
        }
    }
}

/// The kernel's pages of what `name` in `dir` names go with the name (a read of an inode
/// no name reaches is not made; the checker knows no data of it): what the cache says it
/// names, or, unknown, anything not held under `X`.
fn drop_pages_of(pages: &mut BTreeMap<u64, Pages>, c: &NameCache, dir: u64, name: &[u8], at: Instant) {
    match c.lookup(dir, name, at) {
        Some(Cached::Found(v)) => _ = pages.remove(&v.ino),
        _ => pages.retain(|i, pg| pg.expires.is_none() && c.is_exclusive(*i)),
    }
}

pub(crate) fn empty_leaf() -> p::DirLeaf {
    p::DirLeaf::none()
}
