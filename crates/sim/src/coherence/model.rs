//! The reference model of the file system: every answer is checked against it, replayed
//! in the order the server applied the requests.

use super::*;

/// Attributes as compared: everything but block counts and access/creation times (the
/// store keeps those on its own rules, which this simulator does not exercise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AttrV {
    pub(crate) ino: u64,
    pub(crate) kind: p::FileType,
    pub(crate) mode: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) size: u64,
    pub(crate) mtime: p::Time,
    pub(crate) ctime: p::Time,
}

/// A result as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    Attr(AttrV),
    Entry(AttrV),
    Lookup(Option<AttrV>),
    Dir(BTreeMap<Vec<u8>, AttrV>),
    Data(Vec<u8>),
    Done,
    Inodes {
        first: u64,
        count: u32,
    },
    /// An `Acquire`: the directory's attributes and every entry.
    Acquired(AttrV, BTreeMap<Vec<u8>, AttrV>),
    /// A `ListXattr` (in any order).
    Names(BTreeSet<Vec<u8>>),
    /// A `GetLock`: the conflicting lock, if any.
    Lock(Option<p::LockInfo>),
}

pub(crate) type Res = Result<Out, i32>;

#[derive(Clone, Debug)]
pub(crate) struct MInode {
    pub(crate) kind: p::FileType,
    pub(crate) mode: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) data: Vec<u8>,
    pub(crate) mtime: p::Time,
    pub(crate) ctime: p::Time,
    /// Directories: the parent (for "into its own subtree").
    pub(crate) parent: u64,
    pub(crate) xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Open handles, by session: a file whose last name goes stays (an orphan, nlink 0)
    /// until the last is released.
    pub(crate) opens: BTreeSet<(SessionId, u64)>,
}

impl MInode {
    /// Its attributes as compared.
    pub(crate) fn attr_v(&self, ino: u64) -> AttrV {
        AttrV {
            ino,
            kind: self.kind,
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: if self.kind == p::FileType::Directory { 4096 } else { self.data.len() as u64 },
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }
}

/// The file system as it should be: replayed in the order the server applied requests.
#[derive(Clone, Debug)]
pub(crate) struct Model {
    pub(crate) inodes: BTreeMap<u64, MInode>,
    pub(crate) dirs: BTreeMap<u64, BTreeMap<Vec<u8>, u64>>,
    pub(crate) next_ino: u64,
    /// Files that lost their last name while another session may have opened them
    /// without asking (the server keeps such a file until that session has answered the
    /// change's recall: `Server::pinned`, which `sync_pins` follows): gone for everything
    /// but an `Open`, which brings them back as orphans.
    pub(crate) pinned: BTreeMap<u64, MInode>,
    /// Opens of requests the server parked that took effect as they arrived
    /// (`opened_early`): when the request runs, they are not opened again (a release may
    /// have come in between), and answer with the file as it is.
    pub(crate) early: BTreeSet<(SessionId, u64, u64)>,
    /// Handles of restored sessions the restarted server forgot, `(session, ino, handle)`,
    /// until their client opens them again: it does so before it replays any change, so
    /// its changes not yet replayed are laid on with these handles held (`Local::lay_on`).
    pub(crate) reopen: BTreeSet<(SessionId, u64, u64)>,
    /// Every session's fcntl and flock locks, as the server must hold them: gone with
    /// their session, and emptied by a server restart, then filled again by the restored
    /// sessions' re-asserts (`relock.rs`).
    pub(crate) locks: crest_proto::locks::LockTable,
    /// During the grace period after a restart: the orphans nobody holds open, which the
    /// server keeps, as they are, for the restored sessions' replays (and re-opens)
    /// until it ends (`end_grace`). `None` outside it.
    pub(crate) grace: Option<BTreeSet<u64>>,
    /// Counts changes made by no changing request (opens, releases, sessions ending,
    /// pins let go): the checker does not take them for a change of the next request's.
    pub(crate) side: u64,
}

pub(crate) const EPERM: i32 = 1;
pub(crate) const ENOENT: i32 = 2;
pub(crate) const EEXIST: i32 = 17;
pub(crate) const ENOTDIR: i32 = 20;
pub(crate) const EISDIR: i32 = 21;
/// An acquire of a directory other sessions are changing (the server's choice).
pub(crate) const EBUSY: i32 = 16;
pub(crate) const EINVAL: i32 = 22;
pub(crate) const ENOTEMPTY: i32 = 39;
pub(crate) const ENODATA: i32 = 61;
pub(crate) const EAGAIN: i32 = 11;
pub(crate) const ENOLCK: i32 = 37;

impl Model {
    pub(crate) fn attr(&self, ino: u64) -> Option<AttrV> {
        self.inodes.get(&ino).map(|i| i.attr_v(ino))
    }

    pub(crate) fn dir(&self, d: u64) -> Result<&BTreeMap<Vec<u8>, u64>, i32> {
        match self.inodes.get(&d) {
            None => Err(ENOENT),
            Some(i) if i.kind != p::FileType::Directory => Err(ENOTDIR),
            Some(_) => Ok(&self.dirs[&d]),
        }
    }

    pub(crate) fn listing(&self, d: u64) -> Result<BTreeMap<Vec<u8>, AttrV>, i32> {
        let entries = self.dir(d)?;
        Ok(entries.iter().map(|(n, i)| (n.clone(), self.attr(*i).expect("entry names an inode"))).collect())
    }

    /// A read-only operation's result (None for a changing one).
    pub(crate) fn eval(&self, op: &Op) -> Option<Res> {
        Some(match op {
            Op::Lookup { parent, name } => {
                self.dir(*parent).map(|d| Out::Lookup(d.get(name).map(|i| self.attr(*i).expect("entry"))))
            }
            Op::GetAttr { ino } => self.attr(*ino).map(Out::Attr).ok_or(ENOENT),
            Op::ReadDir { ino, .. } => self.listing(*ino).map(Out::Dir),
            // (No directory here comes near `MAX_ACQUIRE_ENTRIES`: E2BIG is never due.)
            Op::Acquire { ino } => {
                self.listing(*ino).map(|l| Out::Acquired(self.attr(*ino).expect("a directory listed"), l))
            }
            Op::GetXattr { ino, name } => match self.inodes.get(ino) {
                None => Err(ENOENT),
                Some(i) => i.xattrs.get(name).cloned().map(Out::Data).ok_or(ENODATA),
            },
            Op::ListXattr { ino } => match self.inodes.get(ino) {
                None => Err(ENOENT),
                Some(i) => Ok(Out::Names(i.xattrs.keys().cloned().collect())),
            },
            Op::Read { ino, offset, len } => match self.inodes.get(ino) {
                None => Err(ENOENT),
                Some(i) if i.kind == p::FileType::Directory => Err(EISDIR),
                Some(i) => {
                    let start = (*offset as usize).min(i.data.len());
                    let end = (start + *len as usize).min(i.data.len());
                    Ok(Out::Data(i.data[start..end].to_vec()))
                }
            },
            _ => return None,
        })
    }

    /// Group and mode of a new inode (the server's set-group-ID rule).
    pub(crate) fn new_owner(
        &self,
        parent: u64,
        cred: p::Cred,
        kind: p::FileType,
        mode: u32,
    ) -> Result<(u32, u32), i32> {
        let d = self.inodes.get(&parent).ok_or(ENOENT)?;
        Ok(p::owner::new_inode_group(d.mode, d.gid, cred.gid, kind == p::FileType::Directory, mode))
    }

    pub(crate) fn touch(&mut self, ino: u64, now: p::Time) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.mtime = now;
            i.ctime = now;
        }
    }

    pub(crate) fn nlink_add(&mut self, ino: u64, delta: i32) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlink = i.nlink.wrapping_add_signed(delta);
        }
    }

    /// Drops one link of a victim (already out of its directory).
    pub(crate) fn drop_link(&mut self, ino: u64, now: p::Time) {
        let Some(i) = self.inodes.get_mut(&ino) else { return };
        i.ctime = now;
        i.nlink = if i.kind == p::FileType::Directory { 0 } else { i.nlink.saturating_sub(1) };
        if i.nlink == 0 && i.opens.is_empty() {
            if i.kind == p::FileType::Regular {
                self.unheld(ino);
            } else {
                self.dirs.remove(&ino);
                self.inodes.remove(&ino);
            }
        }
    }

    /// File `ino` has no name and no handle left: gone, but for the pins that may keep it
    /// for an `Open` on its way (`sync_pins`) — or, in the grace period, kept as it is.
    pub(crate) fn unheld(&mut self, ino: u64) {
        if let Some(held) = &mut self.grace {
            held.insert(ino);
            return;
        }
        if let Some(gone) = self.inodes.remove(&ino) {
            self.pinned.insert(ino, gone);
        }
    }

    /// The grace period began: the image's orphans nobody holds are kept as they are.
    pub(crate) fn start_grace(&mut self) {
        let mut held: BTreeSet<u64> = self.pinned.keys().copied().collect();
        self.inodes.extend(std::mem::take(&mut self.pinned));
        held.extend(self.inodes.iter().filter(|(_, i)| i.nlink == 0 && i.opens.is_empty()).map(|(&ino, _)| ino));
        self.grace = Some(held);
        self.side += 1;
    }

    /// The grace period ended: what nobody opened again goes.
    pub(crate) fn end_grace(&mut self) {
        let Some(held) = self.grace.take() else { return };
        for ino in held {
            if self.inodes.get(&ino).is_some_and(|i| i.nlink == 0 && i.opens.is_empty()) {
                self.unheld(ino);
            }
        }
        self.side += 1;
    }

    /// Whether `op` names an orphan the grace period keeps that nobody holds open: gone for
    /// everything but an `Open` (or a release, or an unlock, which ask nothing of the
    /// file), as `Server::is_pinned` has it.
    pub(crate) fn grace_held(&self, op: &Op) -> bool {
        let Some(held) = &self.grace else { return false };
        if matches!(
            op,
            Op::Open { .. }
                | Op::Release { .. }
                | Op::Fsync { .. }
                | Op::Reassert { .. }
                | Op::SetLock { kind: p::LockKind::Unlock, .. }
        ) {
            return false;
        }
        op.named_inodes()
            .into_iter()
            .any(|i| held.contains(&i) && self.inodes.get(&i).is_some_and(|m| m.nlink == 0 && m.opens.is_empty()))
    }

    /// The attributes of a file kept only by pins (see `Model::val`).
    pub(crate) fn pinned_attr(&self, ino: u64) -> Option<AttrV> {
        self.pinned.get(&ino).map(|i| i.attr_v(ino))
    }

    /// What the server still keeps of the files that lost their last name unopened
    /// (`pinned` says whether it pins one).
    pub(crate) fn sync_pins(&mut self, pinned: impl Fn(u64) -> bool) {
        let before = self.pinned.len();
        self.pinned.retain(|&ino, _| pinned(ino));
        self.side += (before - self.pinned.len()) as u64;
    }

    /// An `Open` of a request the server parked took effect as it arrived (its answer
    /// comes when the request runs).
    pub(crate) fn opened_early(&mut self, s: SessionId, ino: u64, handle: u64) {
        self.side += 1;
        self.early.insert((s, ino, handle));
        if let Some(i) = self.pinned.remove(&ino) {
            self.inodes.insert(ino, i);
        }
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.opens.insert((s, handle));
        }
    }

    /// The sessions holding handles.
    pub(crate) fn openers(&self) -> BTreeSet<SessionId> {
        self.inodes.values().flat_map(|i| i.opens.iter().map(|(s, _)| *s)).collect()
    }

    /// The server restarted: it knows none of session `s`'s handles until its client
    /// opens them again (first thing, before its replays); its locks stay (taken again).
    pub(crate) fn forget_handles(&mut self, s: SessionId) {
        let held: Vec<(u64, u64)> = self
            .inodes
            .iter()
            .flat_map(|(&ino, i)| i.opens.iter().filter(|(o, _)| *o == s).map(move |(_, h)| (ino, *h)))
            .collect();
        for (ino, handle) in held {
            let _ = self.apply(s, &Op::Release { ino, handle }, p::Time::default());
            self.reopen.insert((s, ino, handle));
        }
    }

    /// Puts back session `s`'s forgotten handles (`reopen`) on the files that are here.
    pub(crate) fn reopened(&mut self, s: SessionId) {
        for &(o, ino, handle) in self.reopen.iter().filter(|(o, _, _)| *o == s) {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.opens.insert((o, handle));
            }
        }
    }

    /// Session `s` ended (goodbye, or fenced): its handles and its locks are released.
    pub(crate) fn end_session(&mut self, s: SessionId) {
        self.early.retain(|(o, _, _)| *o != s);
        if self.locks.release_session(s) > 0 {
            self.side += 1;
        }
        self.forget_handles(s);
        self.reopen.retain(|(o, _, _)| *o != s);
    }

    /// Inodes some name reaches (the root included): orphans are not among them.
    pub(crate) fn named_inodes(&self) -> usize {
        self.inodes.values().filter(|i| i.nlink > 0).count()
    }

    pub(crate) fn is_ancestor(&self, a: u64, mut d: u64) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT_INO {
                return false;
            }
            d = self.inodes[&d].parent;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        &mut self,
        at: Option<u64>,
        parent: u64,
        name: &[u8],
        kind: p::FileType,
        mode: u32,
        cred: p::Cred,
        now: p::Time,
    ) -> Res {
        let (gid, mode) = self.new_owner(parent, cred, kind, mode)?;
        if self.dir(parent)?.contains_key(name) {
            return Err(EEXIST);
        }
        let ino = match at {
            Some(ino) => {
                if ino <= ROOT_INO || ino >= self.next_ino {
                    return Err(EINVAL);
                }
                if self.inodes.contains_key(&ino) {
                    return Err(EEXIST);
                }
                ino
            }
            None => {
                self.next_ino += 1;
                self.next_ino - 1
            }
        };
        let dir = kind == p::FileType::Directory;
        let node = MInode {
            kind,
            mode: mode & 0o7777,
            nlink: if dir { 2 } else { 1 },
            uid: cred.uid,
            gid,
            data: Vec::new(),
            mtime: now,
            ctime: now,
            parent,
            xattrs: BTreeMap::new(),
            opens: BTreeSet::new(),
        };
        self.inodes.insert(ino, node);
        if dir {
            self.dirs.insert(ino, BTreeMap::new());
            self.nlink_add(parent, 1);
        }
        self.dirs.get_mut(&parent).expect("checked").insert(name.to_vec(), ino);
        self.touch(parent, now);
        Ok(Out::Entry(self.attr(ino).expect("just made")))
    }

    pub(crate) fn rename(&mut self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8], now: p::Time) -> Res {
        self.dir(parent)?;
        self.dir(new_parent)?;
        let src = *self.dirs[&parent].get(name).ok_or(ENOENT)?;
        let dst = self.dirs[&new_parent].get(new_name).copied();
        if dst == Some(src) {
            return Ok(Out::Done);
        }
        let is_dir = |m: &Model, i: u64| m.inodes[&i].kind == p::FileType::Directory;
        let src_dir = is_dir(self, src);
        let across = parent != new_parent;
        if src_dir && across && self.is_ancestor(src, new_parent) {
            return Err(EINVAL);
        }
        if let Some(d) = dst {
            if src_dir {
                if !is_dir(self, d) {
                    return Err(ENOTDIR);
                }
                if !self.dirs[&d].is_empty() {
                    return Err(ENOTEMPTY);
                }
            } else if is_dir(self, d) {
                return Err(EISDIR);
            }
        }
        self.dirs.get_mut(&parent).expect("dir").remove(name);
        self.touch(parent, now);
        if src_dir && across {
            self.nlink_add(parent, -1);
        }
        self.dirs.get_mut(&new_parent).expect("dir").insert(new_name.to_vec(), src);
        if let Some(d) = dst {
            if is_dir(self, d) {
                self.nlink_add(new_parent, -1);
            }
            self.drop_link(d, now);
        }
        if src_dir && across {
            self.nlink_add(new_parent, 1);
            self.inodes.get_mut(&src).expect("src").parent = new_parent;
        }
        self.touch(new_parent, now);
        self.inodes.get_mut(&src).expect("src").ctime = now;
        Ok(Out::Done)
    }

    /// Applies one operation of session `session` at `now` (the server's clock, or the
    /// writeback's).
    pub(crate) fn apply(&mut self, session: SessionId, op: &Op, now: p::Time) -> Res {
        if self.grace_held(op) {
            return Err(ENOENT);
        }
        if let Op::GetLock { ino, owner, start, end, kind, flock } = op {
            if !self.inodes.contains_key(ino) {
                return Err(ENOENT);
            }
            let holder = crest_proto::locks::Holder { session, owner: *owner };
            return Ok(Out::Lock(self.locks.test(*ino, holder, *start, *end, *kind, *flock)));
        }
        if let Some(r) = self.eval(op) {
            return r;
        }
        match op {
            Op::Open { .. } | Op::SetLock { .. } | Op::Release { .. } => self.apply_open_or_lock(session, op),
            Op::Create { .. }
            | Op::CreateAt { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::Rename { flags: 0, .. }
            | Op::Link { .. } => self.apply_name(op, now),
            Op::Write { .. }
            | Op::SetAttr { .. }
            | Op::Append { .. }
            | Op::SetXattr { .. }
            | Op::RemoveXattr { .. } => self.apply_data(session, op, now),
            Op::AllocInodes { count } => {
                let count = (*count).clamp(1, p::MAX_INODE_GRANT);
                let first = self.next_ino;
                self.next_ino += u64::from(count);
                Ok(Out::Inodes { first, count })
            }
            other => panic!("the simulator sends no {other:?}"),
        }
    }

    /// `apply` of an open, a lock or unlock (`SetLock`) or a release.
    fn apply_open_or_lock(&mut self, session: SessionId, op: &Op) -> Res {
        match op {
            Op::Open { ino, handle, .. } => {
                self.side += 1;
                self.reopen.remove(&(session, *ino, *handle));
                if self.early.remove(&(session, *ino, *handle)) {
                    return self.attr(*ino).map(Out::Attr).ok_or(ENOENT);
                }
                if let Some(i) = self.pinned.remove(ino) {
                    self.inodes.insert(*ino, i);
                }
                let i = self.inodes.get_mut(ino).ok_or(ENOENT)?;
                i.opens.insert((session, *handle));
                Ok(Out::Attr(self.attr(*ino).expect("exists")))
            }
            Op::SetLock { ino, owner, start, end, kind, flock, pid } => {
                self.side += 1;
                if *kind != p::LockKind::Unlock && !self.inodes.contains_key(ino) {
                    return Err(ENOENT);
                }
                let holder = crest_proto::locks::Holder { session, owner: *owner };
                let req = crest_proto::locks::Request {
                    holder,
                    start: *start,
                    end: *end,
                    kind: *kind,
                    flock: *flock,
                    pid: *pid,
                };
                match self.locks.set(*ino, &req) {
                    Ok(()) => Ok(Out::Done),
                    Err(crest_proto::locks::Refusal::Conflict(_)) => Err(EAGAIN),
                    Err(crest_proto::locks::Refusal::TooMany) => Err(ENOLCK),
                }
            }
            Op::Release { ino, handle } => {
                self.side += 1;
                self.reopen.remove(&(session, *ino, *handle));
                if let Some(i) = self.inodes.get_mut(ino) {
                    if i.opens.remove(&(session, *handle)) && i.opens.is_empty() && i.nlink == 0 {
                        // (Still kept while the server pins it: `sync_pins`.)
                        self.unheld(*ino);
                    }
                }
                Ok(Out::Done)
            }
            other => unreachable!("not an open or a lock: {other:?}"),
        }
    }

    /// `apply` of a change to names: create, unlink, rmdir, rename (plain) or link.
    fn apply_name(&mut self, op: &Op, now: p::Time) -> Res {
        match op {
            Op::Create { parent, name, kind, mode, cred, .. } => {
                self.create(None, *parent, name, *kind, *mode, *cred, now)
            }
            Op::CreateAt { ino, parent, name, kind, mode, cred, .. } => {
                self.create(Some(*ino), *parent, name, *kind, *mode, *cred, now)
            }
            Op::Unlink { parent, name } => {
                let victim = *self.dir(*parent)?.get(name).ok_or(ENOENT)?;
                if self.inodes[&victim].kind == p::FileType::Directory {
                    return Err(EISDIR);
                }
                self.dirs.get_mut(parent).expect("dir").remove(name);
                self.touch(*parent, now);
                self.drop_link(victim, now);
                Ok(Out::Done)
            }
            Op::Rmdir { parent, name } => {
                let victim = *self.dir(*parent)?.get(name).ok_or(ENOENT)?;
                if self.inodes[&victim].kind != p::FileType::Directory {
                    return Err(ENOTDIR);
                }
                if !self.dirs[&victim].is_empty() {
                    return Err(ENOTEMPTY);
                }
                self.dirs.get_mut(parent).expect("dir").remove(name);
                self.nlink_add(*parent, -1);
                self.touch(*parent, now);
                self.drop_link(victim, now);
                Ok(Out::Done)
            }
            Op::Rename { parent, name, new_parent, new_name, flags: 0 } => {
                self.rename(*parent, name, *new_parent, new_name, now)
            }
            Op::Link { ino, parent, name } => {
                let i = self.inodes.get(ino).ok_or(ENOENT)?;
                if i.kind == p::FileType::Directory {
                    return Err(EPERM);
                }
                // (An orphan, open but unlinked, takes no new name.)
                if i.nlink == 0 {
                    return Err(ENOENT);
                }
                if self.dir(*parent)?.contains_key(name) {
                    return Err(EEXIST);
                }
                self.dirs.get_mut(parent).expect("checked").insert(name.clone(), *ino);
                self.nlink_add(*ino, 1);
                self.inodes.get_mut(ino).expect("checked").ctime = now;
                self.touch(*parent, now);
                Ok(Out::Entry(self.attr(*ino).expect("exists")))
            }
            other => unreachable!("not a change to names: {other:?}"),
        }
    }

    /// `apply` of a change to an inode's data or attributes: write, append, setattr, or an
    /// xattr set or removed.
    fn apply_data(&mut self, session: SessionId, op: &Op, now: p::Time) -> Res {
        match op {
            Op::Write { ino, offset, data } => {
                let i = self.inodes.get_mut(ino).ok_or(ENOENT)?;
                if i.kind == p::FileType::Directory {
                    return Err(EISDIR);
                }
                if !data.is_empty() {
                    let end = *offset as usize + data.len();
                    if i.data.len() < end {
                        i.data.resize(end, 0);
                    }
                    i.data[*offset as usize..end].copy_from_slice(data);
                    i.mtime = now;
                    i.ctime = now;
                }
                Ok(Out::Attr(self.attr(*ino).expect("exists")))
            }
            Op::SetAttr { ino, set } => {
                let i = self.inodes.get_mut(ino).ok_or(ENOENT)?;
                if let Some(size) = set.size_bytes {
                    if i.kind == p::FileType::Directory {
                        return Err(EISDIR);
                    }
                    i.data.resize(size as usize, 0);
                    i.mtime = now;
                }
                if let Some(m) = set.mode {
                    i.mode = m & 0o7777;
                }
                i.ctime = now;
                Ok(Out::Attr(self.attr(*ino).expect("exists")))
            }
            Op::Append { ino, data } => {
                let end = self.inodes.get(ino).ok_or(ENOENT)?.data.len() as u64;
                self.apply(session, &Op::Write { ino: *ino, offset: end, data: data.clone() }, now)
            }
            Op::SetXattr { ino, name, value, flags } => {
                let i = self.inodes.get_mut(ino).ok_or(ENOENT)?;
                let exists = i.xattrs.contains_key(name);
                if flags & p::XATTR_CREATE != 0 && exists {
                    return Err(EEXIST);
                }
                if flags & p::XATTR_REPLACE != 0 && !exists {
                    return Err(ENODATA);
                }
                i.xattrs.insert(name.clone(), value.clone());
                i.ctime = now;
                Ok(Out::Done)
            }
            Op::RemoveXattr { ino, name } => {
                let i = self.inodes.get_mut(ino).ok_or(ENOENT)?;
                i.xattrs.remove(name).ok_or(ENODATA)?;
                i.ctime = now;
                Ok(Out::Done)
            }
            other => unreachable!("not a change to data or attributes: {other:?}"),
        }
    }
}
