//! A simulated client: the real client core (`Connection`) for its session, and a model
//! of the cache a mount keeps under the rights the core tells it of.

use super::*;

/// A stretch of a directory the client holds: every entry whose name hashes into lo..=hi.
#[derive(Clone, Debug)]
pub(crate) struct Range {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) expires: u64,
    pub(crate) names: BTreeMap<Vec<u8>, u64>,
}

/// What a client may answer from: exactly what replies carried (until `expires`), or
/// what it holds exclusively (no expiry: nobody else can change it).
#[derive(Debug, Default)]
pub(crate) struct Cache {
    pub(crate) attrs: BTreeMap<u64, (p::Attr, u64)>,
    pub(crate) dirs: BTreeMap<u64, Vec<Range>>,
    pub(crate) data: BTreeMap<u64, (Vec<u8>, u64)>,
    /// Held exclusively (created here, or named by a directory acquired here).
    pub(crate) x: BTreeSet<u64>,
    /// Where each exclusive inode is named (only this client can rename or unlink it).
    pub(crate) x_at: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Recalls of inodes not (yet) held exclusively: a create's (or an acquire's) reply
    /// released after a recall of the new inode must not grant it.
    /// (With when each came, virtual µs: see `tombstone_rule`.)
    pub(crate) tombstones: BTreeMap<u64, u64>,
    /// Directories acquired whole and held since (as `NameCache::acquired`): with `x`,
    /// what `holds_whole` says.
    pub(crate) acquired: BTreeSet<u64>,
    /// Bumped by every recall and every drop of rights (as `NameCache::epoch`): an
    /// acquire's listing is taken in only if nothing came in between
    /// (`NameCache::absorb_acquired`). Survives a reset of the cache.
    pub(crate) epoch: u64,
}

impl Cache {
    pub(crate) fn attr(&self, ino: u64, now: u64) -> Option<&p::Attr> {
        self.attrs.get(&ino).filter(|(_, e)| now < *e || self.x.contains(&ino)).map(|(a, _)| a)
    }

    pub(crate) fn data(&self, ino: u64, now: u64) -> Option<&Vec<u8>> {
        self.data.get(&ino).filter(|(_, e)| now < *e || self.x.contains(&ino)).map(|(d, _)| d)
    }

    pub(crate) fn range(&self, dir: u64, name: &[u8], now: u64) -> Option<&Range> {
        let h = p::name_hash(name);
        let pinned = self.x.contains(&dir);
        self.dirs.get(&dir)?.iter().find(|r| r.lo <= h && h <= r.hi && (pinned || now < r.expires))
    }

    pub(crate) fn range_mut(&mut self, dir: u64, name: &[u8]) -> Option<&mut Range> {
        let h = p::name_hash(name);
        self.dirs.get_mut(&dir)?.iter_mut().find(|r| r.lo <= h && h <= r.hi)
    }

    /// Holds a stretch of `dir` (replacing what it overlaps).
    pub(crate) fn hold(&mut self, dir: u64, lo: u64, hi: u64, items: &[p::DirItem], expires: u64) {
        let ranges = self.dirs.entry(dir).or_default();
        ranges.retain(|r| r.hi < lo || r.lo > hi);
        let mut names = BTreeMap::new();
        for i in items {
            let h = p::name_hash(&i.name);
            if lo <= h && h <= hi {
                names.insert(i.name.clone(), i.attr.ino);
                self.attrs.insert(i.attr.ino, (i.attr.clone(), expires));
            }
        }
        ranges.push(Range { lo, hi, expires, names });
    }

    /// A recall: drop everything about `ino`.
    pub(crate) fn recall(&mut self, ino: u64, now: u64) {
        self.epoch += 1;
        self.acquired.remove(&ino);
        // (The real client leaves none when it held the inode: see `tombstone_rule`.)
        let held = self.x.remove(&ino);
        if !held || tombstone_rule() == TombstoneRule::SinceSend {
            self.tombstones.insert(ino, now);
        }
        self.x_at.remove(&ino);
        self.forget(ino);
    }

    /// The server counts this client as `ino`'s exclusive holder (it created it, or
    /// acquired a directory naming it), told in wire order with recalls: a recall that
    /// came first wins (its tombstone refuses the grant). True when granted.
    /// (`sent`: when the request whose reply grants it was first sent.)
    pub(crate) fn grant_x(&mut self, ino: u64, now: u64, sent: u64) -> bool {
        // As `NameCache::grant_exclusive`: the tombstone stays while it refuses (one reply
        // may grant an inode twice: a hard link named twice in an acquired directory).
        if let Some(&at) = self.tombstones.get(&ino) {
            let refuses = match tombstone_rule() {
                TombstoneRule::Forever => true,
                TombstoneRule::Expire => now < at + TOMBSTONE_LIFETIME_US,
                TombstoneRule::SinceSend => at >= sent,
            };
            if refuses {
                return false;
            }
            self.tombstones.remove(&ino);
        }
        if fresh_grants() && !self.x.contains(&ino) {
            // What expired of it may be stale (the server stops counting this client as
            // a holder once its copies have expired): X pins only what is still valid.
            self.attrs.retain(|i, (_, e)| *i != ino || now < *e);
            self.data.retain(|i, (_, e)| *i != ino || now < *e);
            if let Some(v) = self.dirs.get_mut(&ino) {
                v.retain(|r| now < r.expires);
            }
        }
        self.x.insert(ino);
        true
    }

    /// Drops every right and everything cached. Tombstones stay: a create's reply still on
    /// its way must not grant what a recall already took.
    pub(crate) fn drop_every_right(&mut self) {
        let tombstones = std::mem::take(&mut self.tombstones);
        *self = Cache { tombstones, epoch: self.epoch + 1, ..Cache::default() };
    }

    /// After a server restart: keeps only what it holds exclusively (`x`, and what `x`
    /// pins), as `NameCache::restored`.
    pub(crate) fn keep_exclusive_only(&mut self) {
        self.epoch += 1;
        let x = &self.x;
        self.attrs.retain(|i, _| x.contains(i));
        self.data.retain(|i, _| x.contains(i));
        self.dirs.retain(|i, _| x.contains(i));
    }

    /// Acquired whole and still held (`NameCache::holds_whole`).
    pub(crate) fn holds_whole(&self, dir: u64) -> bool {
        self.acquired.contains(&dir) && self.x.contains(&dir)
    }

    /// `dir` is held exclusively and a complete listing of it names nothing
    /// (`NameCache::known_empty`: no expiry is looked at, the listing being pinned by X).
    pub(crate) fn known_empty(&self, dir: u64) -> bool {
        self.x.contains(&dir)
            && self
                .dirs
                .get(&dir)
                .is_some_and(|v| v.iter().any(|r| r.lo == 0 && r.hi == u64::MAX && r.names.is_empty()))
    }

    pub(crate) fn forget(&mut self, ino: u64) {
        self.attrs.remove(&ino);
        self.dirs.remove(&ino);
        self.data.remove(&ino);
    }

    /// Updates held attributes (never adds: the reply may have been held back behind
    /// recalls that already dropped them).
    pub(crate) fn update_attr(&mut self, a: &p::Attr) {
        if let Some((held, _)) = self.attrs.get_mut(&a.ino) {
            *held = a.clone();
        }
    }

    /// The client removed `name` from `dir` (unlink, rmdir, rename source or victim):
    /// what it named loses its attributes; if it is unknown, anything might be it.
    pub(crate) fn removed(&mut self, dir: u64, name: &[u8]) {
        self.attrs.remove(&dir);
        let known = self.range_mut(dir, name).and_then(|r| r.names.remove(name));
        let x_victim = self.x_at.iter().find(|(_, (d, n))| *d == dir && n == name).map(|(i, _)| *i);
        match known.or(x_victim) {
            Some(ino) => {
                self.forget(ino);
                self.x_at.remove(&ino);
            }
            None => {
                // What it holds exclusively is not it if it is named elsewhere (`x_at`)
                // and has no other name (a hard link: as `NameCache::removed`, any
                // multiply-linked inode might be it). A directory acquired whole may be
                // named where this client does not know: it could be the victim. (The
                // real client keeps its listing, and relies on the kernel, which knows
                // what it removed is dead, to ask nothing of it again; this client may
                // still name it: it lets it go.)
                let x = self.placed_x();
                self.attrs.retain(|i, (a, _)| x.contains(i) && a.nlink <= 1);
                self.data.retain(|i, _| x.contains(i));
                self.dirs.retain(|i, _| x.contains(i));
            }
        }
    }

    /// What it holds exclusively and knows where it is named (`x_at`; the root is named
    /// nowhere): nothing it does not know the name of can be one of these.
    pub(crate) fn placed_x(&self) -> BTreeSet<u64> {
        self.x.iter().copied().filter(|i| self.x_at.contains_key(i) || *i == ROOT_INO).collect()
    }

    /// The inode `name` in `dir` names, as far as this client knows.
    pub(crate) fn named(&self, dir: u64, name: &[u8]) -> Option<u64> {
        let h = p::name_hash(name);
        let ranges = self.dirs.get(&dir).into_iter().flatten();
        let from_range = ranges.filter(|r| r.lo <= h && h <= r.hi).find_map(|r| r.names.get(name));
        from_range.copied().or_else(|| self.x_at.iter().find(|(_, (d, n))| *d == dir && n == name).map(|(i, _)| *i))
    }
}

/// What a request is for.
#[derive(Clone, Debug)]
pub(crate) enum Purpose {
    /// The system call in progress.
    Syscall,
    /// The writeback of local answer `n` (`Checker::locals`).
    Writeback(u64),
    /// The system call in progress first asks for `then`'s directory `dir` whole (sent
    /// with the cache at `epoch`); `then` follows when the answer comes.
    Acquire { dir: u64, then: Op, epoch: u64 },
    /// A request the client core made itself: after a server restart that restored the
    /// session, the rights the cache kept, asked back (`Op::Reassert`, by `HeldLocks`); a
    /// refused one is dropped as a recall nobody answers.
    Reassert,
}

#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) req: p::Request,
    pub(crate) purpose: Purpose,
    /// When the call started (virtual µs; what cached replies expire from).
    pub(crate) t0_us: u64,
}

/// What the client core told the cache through its `Rights` hook, in order; the
/// simulator applies it to the client's cache model after each thing the core takes in.
#[derive(Debug)]
pub(crate) enum Told {
    Recalled(Vec<u64>),
    Reset,
    Disconnected,
    ReplyLost(Vec<Op>),
}

/// A client's `Rights` hook: records what the core says; `restored` answers with the
/// rights the simulator worked out before it handed the core the welcome.
#[derive(Default)]
pub(crate) struct Hook {
    pub(crate) told: Mutex<Vec<Told>>,
    pub(crate) held: Mutex<Vec<(u64, bool)>>,
}

impl Hook {
    pub(crate) fn tell(&self, t: Told) {
        self.told.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }
}

impl Rights for Hook {
    // (Grants are taken from the answers, in the same wire order: `Sim::answered`.)
    fn granted_exclusive(&self, _ino: u64, _sent: Instant) {}
    fn recalled(&self, inodes: &[u64]) {
        self.tell(Told::Recalled(inodes.to_vec()));
    }
    fn reset(&self) {
        self.tell(Told::Reset);
    }
    fn disconnected(&self) {
        self.tell(Told::Disconnected);
    }
    fn restored(&self) -> Vec<(u64, bool)> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }
    fn reply_lost(&self, ops: &[Op]) {
        self.tell(Told::ReplyLost(ops.to_vec()));
    }
}

pub(crate) struct Client {
    pub(crate) idx: usize,
    /// Bumped at each crash: a new client process.
    pub(crate) incarnation: u32,
    pub(crate) alive: bool,
    /// The real client core: it decides what goes on the wire, when, and again.
    pub(crate) core: Connection<u64>,
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
    /// The request of the system call in progress.
    pub(crate) busy: Option<u64>,
    pub(crate) cache: Cache,
    /// Inode numbers reserved for writeback creates: next, end.
    pub(crate) pool: (u64, u64),
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

/// The client core of client `idx`, on the simulation's clock from `now`.
pub(crate) fn new_core(idx: usize, now: Instant) -> (Connection<u64>, Arc<Hook>) {
    let hook = Arc::new(Hook::default());
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
            busy: None,
            cache: Cache::default(),
            pool: (0, 0),
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

    /// Everything it holds rights on, with whether exclusively (`NameCache::held_rights`):
    /// what it holds exclusively and every inode whose attributes, data or directory
    /// entries it may still answer from.
    pub(crate) fn held_rights(&self, now: u64) -> Vec<(u64, bool)> {
        let c = &self.cache;
        let mut held: BTreeMap<u64, bool> = c.x.iter().map(|&i| (i, true)).collect();
        let valid = c.attrs.iter().map(|(&i, (_, e))| (i, *e)).chain(c.data.iter().map(|(&i, (_, e))| (i, *e)));
        for (ino, expires) in valid {
            if now < expires {
                held.entry(ino).or_insert(false);
            }
        }
        for (&dir, ranges) in &c.dirs {
            if ranges.iter().any(|r| now < r.expires) {
                held.entry(dir).or_insert(false);
            }
        }
        held.into_iter().collect()
    }

    pub(crate) fn sid(&self) -> Option<SessionId> {
        self.session
    }

    pub(crate) fn learn(&mut self, a: &p::Attr) {
        self.known.insert(a.ino, a.kind);
        self.recent.retain(|(i, _)| *i != a.ino);
        self.recent.push_back((a.ino, a.kind));
        if self.recent.len() > 8 {
            self.recent.pop_front();
        }
    }

    /// Answers a read from what it holds, if it can.
    pub(crate) fn answer_from_cache(&self, op: &Op, now: u64) -> Option<Reply> {
        let c = &self.cache;
        match op {
            Op::Lookup { parent, name } => {
                let r = c.range(*parent, name, now)?;
                match r.names.get(name) {
                    None => Some(Reply::Lookup { attr: None, leaf: empty_leaf() }),
                    Some(ino) => c.attr(*ino, now).map(|a| Reply::Lookup { attr: Some(a.clone()), leaf: empty_leaf() }),
                }
            }
            Op::GetAttr { ino } => c.attr(*ino, now).map(|a| Reply::Attr(a.clone())),
            Op::Read { ino, offset, len } => {
                let d = c.data(*ino, now)?;
                let start = (*offset as usize).min(d.len());
                let end = (start + *len as usize).min(d.len());
                Some(Reply::Data(d[start..end].to_vec()))
            }
            Op::ReadDir { ino, .. } => {
                let r = c.range(*ino, b"", now).filter(|r| r.lo == 0 && r.hi == u64::MAX)?;
                let mut items = Vec::new();
                for (name, i) in &r.names {
                    items.push(p::DirItem { name: name.clone(), index: 0, attr: c.attr(*i, now)?.clone() });
                }
                Some(Reply::Dir { items, end: true, next_index: 0 })
            }
            _ => None,
        }
    }

    /// Answers a change of what it holds exclusively itself: the writeback operation and
    /// the answer, with the cache updated. `t` is the client's clock.
    pub(crate) fn answer_locally(&mut self, op: &Op, now: u64, rng: &mut Stream) -> Option<(Op, Reply)> {
        let t = ptime(now);
        match op {
            Op::Create { parent, name, kind, mode, rdev, cred } => {
                let c = &self.cache;
                if !c.x.contains(parent) || self.pool.0 >= self.pool.1 {
                    return None;
                }
                if c.range(*parent, name, now)?.names.contains_key(name) {
                    return None;
                }
                let dir = c.attr(*parent, now)?.clone();
                let is_dir = *kind == p::FileType::Directory;
                let (gid, new_mode) = p::owner::new_inode_group(dir.mode, dir.gid, cred.gid, is_dir, *mode);
                let ino = self.pool.0;
                self.pool.0 += 1;
                let attr = p::Attr {
                    ino,
                    generation: rng.next_u64(),
                    kind: *kind,
                    mode: new_mode & 0o7777,
                    nlink: if is_dir { 2 } else { 1 },
                    uid: cred.uid,
                    gid,
                    size_bytes: if is_dir { 4096 } else { 0 },
                    blocks_4k: 0,
                    rdev: *rdev,
                    atime: t,
                    mtime: t,
                    ctime: t,
                    crtime: t,
                    flags: 0,
                };
                let mut d = dir;
                d.mtime = t;
                d.ctime = t;
                if is_dir {
                    d.nlink += 1;
                }
                let wb = Op::CreateAt {
                    ino,
                    generation: attr.generation,
                    parent: *parent,
                    name: name.clone(),
                    kind: *kind,
                    mode: *mode,
                    rdev: *rdev,
                    cred: *cred,
                };
                let c = &mut self.cache;
                c.attrs.insert(*parent, (d, 0));
                c.range_mut(*parent, name).expect("held").names.insert(name.clone(), ino);
                self.grant_new(&attr, *parent, name, now, now);
                Some((wb, Reply::Entry(attr)))
            }
            Op::Write { ino, offset, data } => {
                let c = &mut self.cache;
                if !c.x.contains(ino) {
                    return None;
                }
                let mut a = c.attr(*ino, now)?.clone();
                if a.kind != p::FileType::Regular || data.is_empty() {
                    return None;
                }
                a.size_bytes = a.size_bytes.max(offset + data.len() as u64);
                a.mtime = t;
                a.ctime = t;
                c.attrs.insert(*ino, (a.clone(), 0));
                if let Some((d, _)) = c.data.get_mut(ino) {
                    let end = *offset as usize + data.len();
                    if d.len() < end {
                        d.resize(end, 0);
                    }
                    d[*offset as usize..end].copy_from_slice(data);
                }
                Some((op.clone(), Reply::Attr(a)))
            }
            Op::SetAttr { ino, set } => {
                let c = &mut self.cache;
                if !c.x.contains(ino) {
                    return None;
                }
                let mut a = c.attr(*ino, now)?.clone();
                if let Some(size) = set.size_bytes {
                    if a.kind != p::FileType::Regular {
                        return None;
                    }
                    a.size_bytes = size;
                    a.mtime = t;
                    if let Some((d, _)) = c.data.get_mut(ino) {
                        d.resize(size as usize, 0);
                    }
                }
                if let Some(m) = set.mode {
                    a.mode = m & 0o7777;
                }
                a.ctime = t;
                c.attrs.insert(*ino, (a.clone(), 0));
                Some((op.clone(), Reply::Attr(a)))
            }
            // As `remove_locally`: the directory and the victim held exclusively, the name
            // known (with the victim's attributes), the directory's attributes held, and
            // an rmdir's victim known to be empty; else the server is asked.
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                let rmdir = matches!(op, Op::Rmdir { .. });
                let c = &mut self.cache;
                if !c.x.contains(parent) {
                    return None;
                }
                let victim = *c.range(*parent, name, now)?.names.get(name)?;
                let v = c.attr(victim, now)?;
                let is_dir = v.kind == p::FileType::Directory;
                let mut d = c.attr(*parent, now)?.clone();
                if !c.x.contains(&victim) || is_dir != rmdir || (rmdir && !c.known_empty(victim)) {
                    return None;
                }
                d.mtime = t;
                d.ctime = t;
                if rmdir {
                    d.nlink = d.nlink.saturating_sub(1);
                }
                c.removed(*parent, name);
                c.attrs.insert(*parent, (d, 0));
                Some((op.clone(), Reply::Done))
            }
            _ => None,
        }
    }

    /// Takes in the reply to `Acquire { ino: dir }` (sent when the cache was at `epoch`,
    /// at `t0_us`), as the real client does: first the grants, on the connection thread
    /// in wire order with recalls (`grant_rights`: X on the directory and on every inode
    /// it names, each refused by a tombstone of a recall that came first); then
    /// `absorb_acquired`: the listing and the directory's attributes, unless a recall (or
    /// a drop of rights) came in between. True when the listing was taken in.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn absorb_acquired(
        &mut self,
        dir: u64,
        attr: &p::Attr,
        leaf: &p::DirLeaf,
        epoch: u64,
        t0_us: u64,
        now: u64,
    ) -> bool {
        self.learn(attr);
        for i in &leaf.items {
            self.known.insert(i.attr.ino, i.attr.kind);
        }
        let c = &mut self.cache;
        c.grant_x(dir, now, t0_us);
        for i in &leaf.items {
            if c.grant_x(i.attr.ino, now, t0_us) {
                c.x_at.insert(i.attr.ino, (dir, i.name.clone()));
            }
        }
        if c.epoch != epoch || leaf.hash_lo != 0 || leaf.hash_hi != u64::MAX {
            return false;
        }
        let expires = t0_us + TTL_US;
        c.hold(dir, 0, u64::MAX, &leaf.items, expires);
        c.attrs.insert(dir, (attr.clone(), expires));
        c.acquired.insert(dir);
        true
    }

    /// This client created `attr` (named `name` in `parent`): it holds it exclusively,
    /// unless a recall of it came first.
    pub(crate) fn grant_new(&mut self, attr: &p::Attr, parent: u64, name: &[u8], now: u64, sent: u64) {
        self.learn(attr);
        let c = &mut self.cache;
        if !c.grant_x(attr.ino, now, sent) {
            return;
        }
        c.x_at.insert(attr.ino, (parent, name.to_vec()));
        c.attrs.insert(attr.ino, (attr.clone(), 0));
        match attr.kind {
            // Empty, and nobody else can add to it: held whole.
            p::FileType::Directory => {
                c.dirs.insert(attr.ino, vec![Range { lo: 0, hi: u64::MAX, expires: 0, names: BTreeMap::new() }]);
            }
            _ => {
                c.data.insert(attr.ino, (Vec::new(), 0));
            }
        }
    }

    /// Takes in the reply to a system call it sent (`ops`, started at `t0_us`).
    pub(crate) fn absorb(&mut self, ops: &[Op], results: &[Result<Reply, p::OpError>], t0_us: u64, now: u64) {
        let expires = t0_us + TTL_US;
        for r in results.iter().flatten() {
            match r {
                Reply::Attr(a) | Reply::Entry(a) => self.learn(a),
                Reply::Lookup { attr, leaf } => {
                    leaf.items.iter().for_each(|i| {
                        self.known.insert(i.attr.ino, i.attr.kind);
                    });
                    if let Some(a) = attr {
                        self.learn(a);
                    }
                }
                Reply::Dir { items, .. } => items.iter().for_each(|i| {
                    self.known.insert(i.attr.ino, i.attr.kind);
                }),
                _ => {}
            }
        }
        let read_only = !ops.iter().any(Op::is_mutation);
        // A rename goes behind lookups of both names (`send_syscall`): when they named the
        // same inode (two hard links), it changed nothing.
        let same_inode = match results {
            [Ok(Reply::Lookup { attr: Some(a), .. }), Ok(Reply::Lookup { attr: Some(b), .. }), ..] => {
                matches!(ops.get(2), Some(Op::Rename { .. })) && a.ino == b.ino
            }
            _ => false,
        };
        for (op, r) in ops.iter().zip(results) {
            let Ok(r) = r else { continue };
            let c = &mut self.cache;
            match (op, r) {
                // Read replies are never held back: what they carry is current.
                (Op::Lookup { parent, .. }, Reply::Lookup { attr, leaf }) if read_only => {
                    if leaf.hash_lo <= leaf.hash_hi {
                        c.hold(*parent, leaf.hash_lo, leaf.hash_hi, &leaf.items, expires);
                    }
                    if let Some(a) = attr {
                        c.attrs.insert(a.ino, (a.clone(), expires));
                    }
                }
                (Op::GetAttr { .. }, Reply::Attr(a)) if read_only => {
                    let e = if c.x.contains(&a.ino) { 0 } else { expires };
                    c.attrs.insert(a.ino, (a.clone(), e));
                }
                (Op::Read { ino, offset: 0, len }, Reply::Data(d)) if read_only && d.len() < *len as usize => {
                    c.data.insert(*ino, (d.clone(), expires));
                }
                (Op::ReadDir { ino, from_index: 0, .. }, Reply::Dir { items, end: true, .. }) if read_only => {
                    c.hold(*ino, 0, u64::MAX, items, expires);
                }
                // Replies to changes may have waited behind recalls: they update what
                // is still held, and add only what this client created.
                (Op::Create { parent, name, .. }, Reply::Entry(a)) => {
                    c.attrs.remove(parent);
                    if let Some(r) = c.range_mut(*parent, name) {
                        r.names.insert(name.clone(), a.ino);
                    }
                    self.grant_new(a, *parent, name, now, t0_us);
                }
                // Asked with a create in a directory held exclusively: still held, so
                // current.
                (Op::GetAttr { ino }, Reply::Attr(a)) if c.x.contains(ino) => {
                    c.attrs.insert(a.ino, (a.clone(), 0));
                }
                (Op::AllocInodes { .. }, Reply::Inodes { first, count }) => {
                    self.pool = (*first, first + u64::from(*count));
                }
                (Op::Write { ino, offset, data }, Reply::Attr(a)) => {
                    c.update_attr(a);
                    if let Some((d, _)) = c.data.get_mut(ino) {
                        let end = *offset as usize + data.len();
                        if d.len() < end {
                            d.resize(end, 0);
                        }
                        d[*offset as usize..end].copy_from_slice(data);
                    }
                }
                (Op::Append { ino, data }, Reply::Attr(a)) => {
                    c.update_attr(a);
                    // Where it landed is the server's end of the file: what is held is
                    // kept only if it ended just there.
                    let at = a.size_bytes.saturating_sub(data.len() as u64) as usize;
                    match c.data.get_mut(ino) {
                        Some((d, _)) if d.len() == at => d.extend_from_slice(data),
                        Some(_) => {
                            c.data.remove(ino);
                        }
                        None => {}
                    }
                }
                // (Its ctime moved; the reply does not say to what.)
                (Op::SetXattr { ino, .. } | Op::RemoveXattr { ino, .. }, Reply::Done) => {
                    c.attrs.remove(ino);
                }
                (Op::Link { parent, name, .. }, Reply::Entry(a)) => {
                    c.attrs.remove(parent);
                    c.update_attr(a);
                    if let Some(r) = c.range_mut(*parent, name) {
                        r.names.insert(name.clone(), a.ino);
                    }
                }
                (Op::SetAttr { ino, set }, Reply::Attr(a)) => {
                    c.update_attr(a);
                    if let (Some(size), Some((d, _))) = (set.size_bytes, c.data.get_mut(ino)) {
                        d.resize(size as usize, 0);
                    }
                }
                (Op::Unlink { parent, name } | Op::Rmdir { parent, name }, Reply::Done) => c.removed(*parent, name),
                (Op::Rename { parent, name, new_parent, new_name, .. }, Reply::Done) => {
                    let moved = c.named(*parent, name);
                    if moved.is_some() && moved == c.named(*new_parent, new_name) {
                        continue; // the same inode: nothing changed
                    }
                    if same_inode {
                        continue; // two links of one inode: rename(2) changed nothing
                    }
                    c.removed(*new_parent, new_name);
                    if let Some(r) = c.range_mut(*parent, name) {
                        r.names.remove(name);
                    }
                    c.attrs.remove(parent);
                    match moved {
                        Some(m) => {
                            c.attrs.remove(&m);
                            if let Some(r) = c.range_mut(*new_parent, new_name) {
                                r.names.insert(new_name.clone(), m);
                            }
                            if c.x.contains(&m) {
                                c.x_at.insert(m, (*new_parent, new_name.clone()));
                            }
                        }
                        None => {
                            // Unknown inode moved in: the stretch that should list it
                            // cannot be kept, and whatever it is, its ctime changed (it
                            // may be a directory acquired whole, held with no name, or
                            // an inode held exclusively under another of its names).
                            let h = p::name_hash(new_name);
                            if let Some(v) = c.dirs.get_mut(new_parent) {
                                v.retain(|r| h < r.lo || h > r.hi);
                            }
                            let x = c.placed_x();
                            c.attrs.retain(|i, (a, _)| x.contains(i) && a.nlink <= 1);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

pub(crate) fn empty_leaf() -> p::DirLeaf {
    p::DirLeaf { hash_lo: 1, hash_hi: 0, items: Vec::new() }
}
