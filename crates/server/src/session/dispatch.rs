//! Dispatch: one protocol operation run against the store, its errors turned into
//! errnos, and what it touches and carries (for rights).

use super::*;

/// The inode an operation is about, for the rights its reply grants.
pub(super) fn op_inode(op: &Op) -> Option<u64> {
    match op {
        Op::Lookup { parent, .. } => Some(*parent),
        Op::ReadDir { ino, .. } | Op::Read { ino, .. } | Op::GetAttr { ino } | Op::Open { ino, .. } => Some(*ino),
        _ => None,
    }
}

/// Every inode an operation involves, for rights: what it names, but for these.
/// Turns `req`'s write-backs into plain writes (what runs is the same) and returns the
/// inodes they write (which decide whether the request waits: `park_for_flush`).
pub(super) fn take_write_backs(req: &mut p::Request) -> Vec<u64> {
    let mut inos = Vec::new();
    for op in &mut req.ops {
        if let Op::WriteBack { ino, offset, data } = op {
            inos.push(*ino);
            *op = Op::Write { ino: *ino, offset: *offset, data: std::mem::take(data) };
        }
    }
    inos
}

pub(super) fn op_inodes(op: &Op) -> Vec<u64> {
    match op {
        // fsync commits everything; it involves no one inode's rights. Locks live only on
        // the server: no client caches them. A re-assert never waits for anyone: it is
        // refused instead when another session holds the inode.
        Op::Fsync { .. } | Op::SetLock { .. } | Op::GetLock { .. } | Op::Reassert { .. } => Vec::new(),
        // The new inode's number was reserved for the creator: nobody else holds it.
        Op::CreateAt { parent, .. } | Op::SymlinkAt { parent, .. } => vec![*parent],
        other => other.named_inodes(),
    }
}

/// Inodes whose state a reply carries: the client may cache them from now on.
pub(super) fn carried(op_inode: Option<u64>, reply: &Reply) -> Vec<u64> {
    let mut v: Vec<u64> = op_inode.into_iter().collect();
    match reply {
        Reply::Attr(a) | Reply::Entry(a) => v.push(a.ino),
        Reply::Lookup { attr, leaf } => {
            v.extend(attr.iter().map(|a| a.ino));
            v.extend(leaf.items.iter().map(|i| i.attr.ino));
        }
        Reply::Dir { items, .. } => v.extend(items.iter().map(|i| i.attr.ino)),
        // (`AttrOnly` carries attributes nobody may cache.)
        Reply::Data(_)
        | Reply::Names(_)
        | Reply::StatFs(_)
        | Reply::Done
        | Reply::Inodes { .. }
        | Reply::Lock(_)
        | Reply::AttrOnly(_)
        | Reply::Uploads(_) => {}
        // (A located read carries the file's data, as `Data` does: the reply's inode
        // is the op's.)
        Reply::Located(_) => {}
    }
    v
}

/// Why an operation failed: in the store, or refused here with an errno.
pub(crate) enum Failure {
    Store(s::Error),
    Wire(p::OpError),
}

/// What a client hears of a store error (the server's log hears of damage and I/O errors).
pub(super) fn store_error_out(e: &s::Error) -> p::OpError {
    if e.is_corruption() || matches!(e, s::Error::Io { .. } | s::Error::Poisoned(_)) {
        tracing::error!("{e}");
    }
    error_out(e)
}

impl From<s::Error> for Failure {
    fn from(e: s::Error) -> Failure {
        Failure::Store(e)
    }
}

impl Server {
    /// Inodes `op` will change if it succeeds (looked up before it runs: an unlink's victim
    /// is gone afterwards).
    pub(super) fn touches(&mut self, op: &Op) -> Vec<u64> {
        let mut look = |parent: u64, name: &[u8]| self.store.lookup(parent, name).ok().map(|i| i.ino);
        match op {
            Op::SetAttr { ino, .. }
            | Op::Write { ino, .. }
            | Op::MapObject { ino, .. }
            | Op::Append { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::SetXattr { ino, .. }
            | Op::RemoveXattr { ino, .. } => vec![*ino],
            Op::Create { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::CreateAt { parent, .. }
            | Op::SymlinkAt { parent, .. } => vec![*parent],
            Op::Link { ino, parent, .. } => vec![*ino, *parent],
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                std::iter::once(*parent).chain(look(*parent, name)).collect()
            }
            Op::Rename { parent, name, new_parent, new_name, .. } => {
                let moved = look(*parent, name);
                let replaced = look(*new_parent, new_name);
                [Some(*parent), Some(*new_parent), moved, replaced].into_iter().flatten().collect()
            }
            // Taking a directory whole: whoever cached it or its entries must let go first.
            Op::Acquire { ino } => {
                let entries = self.store.readdir(*ino, 0, p::MAX_ACQUIRE_ENTRIES + 1).unwrap_or_default();
                std::iter::once(*ino).chain(entries.into_iter().map(|(e, _)| e.ino)).collect()
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn dir_items(&mut self, dir: u64, from: u64, limit: usize) -> Result<Vec<p::DirItem>, s::Error> {
        Ok(self
            .store
            .readdir(dir, from, limit)?
            .into_iter()
            .map(|(e, i)| p::DirItem { name: e.name, index: e.index, attr: attr_out(&i) })
            .collect())
    }

    /// Fills in ownership of a new inode: a set-group-ID directory passes on its group
    /// (and, to subdirectories, the bit itself).
    pub(super) fn new_owner(
        &mut self,
        parent: u64,
        cred: p::Cred,
        kind: s::FileKind,
        mode: u32,
    ) -> Result<(u32, u32), s::Error> {
        let dir = self.store.getattr(parent)?;
        Ok(p::owner::new_inode_group(dir.mode, dir.gid, cred.gid, kind == s::FileKind::Directory, mode))
    }

    pub(super) fn apply(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, p::OpError> {
        match self.apply_inner(session, op, now) {
            Ok(r) => Ok(r),
            Err(Failure::Wire(e)) => Err(e),
            Err(Failure::Store(e)) => Err(store_error_out(&e)),
        }
    }

    pub(super) fn apply_inner(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, Failure> {
        let kept = !self.pins.is_empty() || !self.grace_orphans.is_empty();
        if kept && !matches!(op, Op::Open { .. } | Op::Release { .. }) {
            // (Locks too, but for an unlock, which asks nothing of the file.)
            let locked = match op {
                Op::SetLock { ino, kind, .. } if kind != p::LockKind::Unlock => Some(ino),
                Op::GetLock { ino, .. } => Some(ino),
                _ => None,
            };
            if let Some(ino) = op_inodes(&op).into_iter().chain(locked).find(|&i| self.only_pinned(i)) {
                return Err(Failure::Wire(errno(2, format!("inode {ino} was removed"))));
            }
        }
        let now_s = time_in(now);
        // One family of operations each (reads, names, data, the rest).
        match &op {
            Op::Lookup { .. }
            | Op::GetAttr { .. }
            | Op::Acquire { .. }
            | Op::ReadDir { .. }
            | Op::ReadLink { .. }
            | Op::Read { .. }
            | Op::StatFs
            | Op::GetXattr { .. }
            | Op::ListXattr { .. }
            | Op::GetLock { .. } => self.apply_read(session, op, now),
            Op::Create { .. }
            | Op::Symlink { .. }
            | Op::Link { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::Rename { .. }
            | Op::CreateAt { .. }
            | Op::SymlinkAt { .. } => self.apply_names(op, now_s),
            Op::AllocInodes { count } => {
                let root = self.root_of_session(session);
                self.alloc_inodes(session, *count, root)
            }
            Op::SetAttr { .. }
            | Op::Open { .. }
            | Op::Release { .. }
            | Op::Write { .. }
            | Op::Append { .. }
            | Op::Fallocate { .. }
            | Op::Fsync { .. }
            | Op::WriteBack { .. } => self.apply_data(session, op, now_s),
            Op::Uploads { count } => self.uploads(session, *count, now),
            Op::MapObject { ino, offset, len, id, csums } => {
                self.map_object(session, (*ino, *offset, *len), *id, csums, now_s)
            }
            _ => self.apply_other(session, op, now_s),
        }
    }

    /// Operations that read.
    fn apply_read(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, Failure> {
        let st = &mut self.store;
        match op {
            // A client decoding a file handle asks for an inode by number ("." of it) or
            // for a directory's parent (".."); neither is an entry: no leaf.
            Op::Lookup { parent, name } if name == b"." || name == b".." => {
                let dir = st.getattr(parent)?;
                let ino = if name == b"." {
                    parent
                } else if dir.kind == s::FileKind::Directory {
                    dir.parent
                } else {
                    return Err(Failure::Wire(errno(20, format!("inode {parent} is not a directory"))));
                };
                let attr = attr_out(&st.getattr(ino)?);
                Ok(Reply::Lookup { attr: Some(attr), leaf: p::DirLeaf::none() })
            }
            Op::Lookup { parent, name } => {
                let l = st.lookup_leaf(parent, &name, LOOKUP_NEIGHBOURS)?;
                let items = l.neighbours.iter().map(|(e, i)| p::DirItem {
                    name: e.name.clone(),
                    index: e.index,
                    attr: attr_out(i),
                });
                let leaf = p::DirLeaf { hash_lo: l.hash_lo, hash_hi: l.hash_hi, items: items.collect() };
                Ok(Reply::Lookup { attr: l.found.as_ref().map(attr_out), leaf })
            }
            Op::GetAttr { ino } => Ok(Reply::Attr(attr_out(&st.getattr(ino)?))),
            Op::Acquire { ino } => {
                if self.space.low() {
                    return Err(Failure::Wire(errno(28, "space is short: changes go to the server one by one")));
                }
                let dir = st.getattr(ino)?;
                if dir.kind != s::FileKind::Directory {
                    return Err(Failure::Wire(errno(20, format!("acquire of inode {ino}: not a directory"))));
                }
                let items = self.dir_items(ino, 0, p::MAX_ACQUIRE_ENTRIES + 1)?;
                let name_bytes: usize = items.iter().map(|i| i.name.len()).sum();
                if items.len() > p::MAX_ACQUIRE_ENTRIES || name_bytes > p::MAX_ACQUIRE_BYTES {
                    return Err(Failure::Wire(errno(7, format!("directory {ino} is too large to hold exclusively"))));
                }
                let leaf = p::DirLeaf { hash_lo: 0, hash_hi: u64::MAX, items };
                Ok(Reply::Lookup { attr: Some(attr_out(&dir)), leaf })
            }
            Op::ReadDir { ino, from_index, limit } => {
                let limit = limit.clamp(1, READDIR_MAX_ITEMS) as usize;
                let next_index = self.store.getattr(ino)?.next_index;
                let mut items = self.dir_items(ino, from_index, limit + 1)?;
                let end = items.len() <= limit;
                items.truncate(limit);
                Ok(Reply::Dir { items, end, next_index })
            }
            Op::ReadLink { ino } => Ok(st.readlink(ino).map(Reply::Data)?),
            Op::Read { ino, offset, len } => {
                Ok(self.read_or_plan(session, ino, offset, u64::from(len.min(p::MAX_IO_BYTES)), now)?)
            }
            Op::StatFs => {
                let root = self.root_of_session(session);
                let f = self.store.dataset_statfs(root)?;
                Ok(Reply::StatFs(p::StatFs {
                    block_size: f.block_size,
                    total_blocks: f.total_blocks,
                    free_blocks: f.free_blocks,
                    avail_blocks: f.avail_blocks,
                    files: f.files,
                    files_free: f.files_free,
                    name_max: f.name_max,
                }))
            }
            Op::GetXattr { ino, name } => Ok(st.getxattr(ino, &name).map(Reply::Data)?),
            Op::ListXattr { ino } => Ok(st.listxattr(ino).map(Reply::Names)?),
            Op::GetLock { ino, owner, start, end, kind, flock } => {
                if start > end {
                    return Err(Failure::Wire(errno(22, format!("lock range {start}..={end} on inode {ino}"))));
                }
                st.getattr(ino)?;
                Ok(Reply::Lock(self.locks.test(ino, locks::Holder { session, owner }, start, end, kind, flock)))
            }
            other => Err(Failure::Wire(errno(22, format!("{other:?} reached the wrong handler")))),
        }
    }

    /// Operations on names: create, link, remove, rename.
    fn apply_names(&mut self, op: Op, now_s: s::Timespec) -> Result<Reply, Failure> {
        let st = &mut self.store;
        match op {
            Op::Create { parent, name, kind, mode, rdev, cred } => {
                let kind = kind_in(kind);
                let got = acl::inherit(&mut self.store, parent, kind, mode, cred.umask)?;
                let (gid, mode) = self.new_owner(parent, cred, kind, got.mode)?;
                let inode = self.store.create(parent, &name, kind, mode, cred.uid, gid, rdev, now_s)?;
                Ok(Reply::Entry(attr_out(&acl::store_inherited(&mut self.store, inode, &got, now_s)?)))
            }
            Op::Symlink { parent, name, target, cred } => {
                let (gid, _) = self.new_owner(parent, cred, s::FileKind::Symlink, 0)?;
                let inode = self.store.symlink(parent, &name, &target, cred.uid, gid, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            Op::Link { ino, parent, name } => {
                let inode = st.link(ino, parent, &name, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            Op::Unlink { parent, name } => Ok(st.unlink(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rmdir { parent, name } => Ok(st.rmdir(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rename { parent, name, new_parent, new_name, flags } => {
                let whiteout = flags & p::RENAME_WHITEOUT != 0;
                if flags & !(p::RENAME_NOREPLACE | p::RENAME_EXCHANGE | p::RENAME_WHITEOUT) != 0
                    || (whiteout && flags & p::RENAME_EXCHANGE != 0)
                {
                    return Err(Failure::Wire(errno(22, format!("unsupported rename flags {flags:#x}"))));
                }
                let f = s::RenameFlags {
                    noreplace: flags & p::RENAME_NOREPLACE != 0,
                    exchange: flags & p::RENAME_EXCHANGE != 0,
                };
                st.rename(parent, &name, new_parent, &new_name, f, now_s)?;
                if whiteout {
                    // In the same unit as the rename: a crash keeps both or neither.
                    st.create(parent, &name, s::FileKind::CharDevice, 0, 0, 0, 0, now_s)?;
                }
                Ok(Reply::Done)
            }
            Op::CreateAt { ino, generation, parent, name, kind, mode, rdev, cred } => {
                let kind = kind_in(kind);
                let got = acl::inherit(&mut self.store, parent, kind, mode, cred.umask)?;
                let (gid, mode) = self.new_owner(parent, cred, kind, got.mode)?;
                let at = Some(s::NewInode { ino, generation });
                let inode = self.store.create_at(at, parent, &name, kind, mode, cred.uid, gid, rdev, now_s)?;
                Ok(Reply::Entry(attr_out(&acl::store_inherited(&mut self.store, inode, &got, now_s)?)))
            }
            Op::SymlinkAt { ino, generation, parent, name, target, cred } => {
                let (gid, _) = self.new_owner(parent, cred, s::FileKind::Symlink, 0)?;
                let at = Some(s::NewInode { ino, generation });
                let inode = self.store.symlink_at(at, parent, &name, &target, cred.uid, gid, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            other => Err(Failure::Wire(errno(22, format!("{other:?} reached the wrong handler")))),
        }
    }

    /// Operations on a file's data and attributes, and its open handles.
    fn apply_data(&mut self, session: SessionId, op: Op, now_s: s::Timespec) -> Result<Reply, Failure> {
        let st = &mut self.store;
        match op {
            Op::SetAttr { ino, set } => {
                let t = |x: Option<p::SetTime>| {
                    x.map(|x| match x {
                        p::SetTime::Now => now_s,
                        p::SetTime::At(t) => time_in(t),
                    })
                };
                let sa = s::SetAttr {
                    mode: set.mode,
                    uid: set.uid,
                    gid: set.gid,
                    size: set.size_bytes,
                    atime: t(set.atime),
                    mtime: t(set.mtime),
                    ctime: set.ctime.map(time_in),
                };
                let inode = st.setattr(ino, &sa, now_s)?;
                if let Some(mode) = set.mode {
                    acl::chmod(st, ino, mode, now_s)?;
                }
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Op::Open { ino, handle, access } => {
                if self.opened_on_arrival.remove(&(session, ino, handle)) {
                    // It took effect as it arrived (`handle`): a release since then must
                    // not be undone. The answer is the file as it is now.
                    self.grant_open(session, ino, handle, access);
                    return Ok(Reply::Attr(attr_out(&self.store.getattr(ino)?)));
                }
                let inode = self.open_handle(session, ino, handle)?;
                self.grant_open(session, ino, handle, access);
                if inode.nlink == 0 {
                    // Recorded once the request is done (a record commits: not inside a unit).
                    self.opened_orphans.push(ino);
                }
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Op::Release { ino, handle } => {
                let held = self.sessions.get_mut(&session).is_some_and(|s| {
                    let Some(handles) = s.open.get_mut(&ino) else { return false };
                    let held = handles.remove(&handle).is_some();
                    if handles.is_empty() {
                        s.open.remove(&ino);
                    }
                    held
                });
                if !held {
                    return Ok(Reply::Done); // already released (a retry), or never opened
                }
                Ok(self.store.release_handle(ino).map(|()| Reply::Done)?)
            }
            Op::Write { ino, offset, data } | Op::WriteBack { ino, offset, data } => {
                if data.len() > p::MAX_IO_BYTES as usize {
                    return Err(Failure::Wire(errno(27, "write larger than the protocol allows")));
                }
                self.written_since_commit += data.len() as u64;
                let sums = self.elsewhere.op_sums.take();
                let written = self.store.write_summed(ino, offset, &data, sums.as_deref(), now_s);
                Ok(written.map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Append { ino, data } => {
                if data.len() > p::MAX_IO_BYTES as usize {
                    return Err(Failure::Wire(errno(27, "write larger than the protocol allows")));
                }
                self.written_since_commit += data.len() as u64;
                let end = self.store.getattr(ino)?.size;
                Ok(self.store.write(ino, end, &data, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Fallocate { ino, offset, len, flags } => {
                let known = p::FALLOC_FL_KEEP_SIZE | p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_ZERO_RANGE;
                if flags & !known != 0 {
                    return Err(Failure::Wire(errno(95, format!("fallocate mode {flags:#x}"))));
                }
                let mode = s::FallocateMode {
                    keep_size: flags & p::FALLOC_FL_KEEP_SIZE != 0,
                    punch_hole: flags & p::FALLOC_FL_PUNCH_HOLE != 0,
                    zero_range: flags & p::FALLOC_FL_ZERO_RANGE != 0,
                };
                Ok(st.fallocate(ino, offset, len, mode, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Fsync { ino } => Ok(st.fsync(ino).map(|()| Reply::Done)?),
            other => Err(Failure::Wire(errno(22, format!("{other:?} reached the wrong handler")))),
        }
    }

    /// Xattrs, locks, and what the request handling answers itself.
    fn apply_other(&mut self, session: SessionId, op: Op, now_s: s::Timespec) -> Result<Reply, Failure> {
        let st = &mut self.store;
        match op {
            Op::SetXattr { ino, name, value, flags } => {
                // Linux refuses a bad name or an oversized value before looking at flags.
                s::fs::xattr::check(&name, value.len())?;
                if flags & (p::XATTR_CREATE | p::XATTR_REPLACE) != 0 {
                    let exists = match st.getxattr(ino, &name) {
                        Ok(_) => true,
                        Err(s::Error::NoXattr(_)) => false,
                        Err(e) => return Err(e.into()),
                    };
                    if flags & p::XATTR_CREATE != 0 && exists {
                        return Err(Failure::Wire(errno(17, "xattr exists")));
                    }
                    if flags & p::XATTR_REPLACE != 0 && !exists {
                        return Err(Failure::Wire(errno(61, "no such xattr")));
                    }
                }
                if p::acl::flag_of(&name) != 0 {
                    return acl::set(st, ino, &name, &value, flags, now_s).map(|()| Reply::Done);
                }
                Ok(st.setxattr(ino, &name, &value, now_s).map(|()| Reply::Done)?)
            }
            // Handled by `handle_request` (it sets the clock for what follows).
            Op::At { .. } => Ok(Reply::Done),
            // Answered by `Server::reassert` before the store is reached.
            Op::Reassert { ino, .. } => {
                Err(Failure::Wire(errno(22, format!("re-assert of inode {ino} inside a changing request"))))
            }
            Op::RemoveXattr { ino, name } => match st.removexattr(ino, &name, now_s) {
                // Removing an ACL is setting none: done when there is none (as ext4 says).
                Err(s::Error::NoXattr(_)) if p::acl::flag_of(&name) != 0 => Ok(Reply::Done),
                r => Ok(r.map(|()| Reply::Done)?),
            },
            Op::SetLock { ino, owner, start, end, kind, flock, pid } => {
                if start > end {
                    return Err(Failure::Wire(errno(22, format!("lock range {start}..={end} on inode {ino}"))));
                }
                if kind != p::LockKind::Unlock {
                    st.getattr(ino)?; // no locks on inodes that do not exist
                }
                let req = locks::Request { holder: locks::Holder { session, owner }, start, end, kind, flock, pid };
                match self.locks.set(ino, &req) {
                    Ok(()) => {
                        if kind != p::LockKind::Unlock {
                            self.record_session(session, "a lock holder");
                        }
                        Ok(Reply::Done)
                    }
                    Err(locks::Refusal::Conflict(c)) => Err(Failure::Wire(errno(
                        11,
                        format!(
                            "inode {ino}: bytes {}..={} {:?}-locked by pid {} of another owner",
                            c.start, c.end, c.kind, c.pid
                        ),
                    ))),
                    Err(locks::Refusal::TooMany) => Err(Failure::Wire(errno(
                        37,
                        format!("inode {ino} already carries {} locks", locks::MAX_LOCKS_PER_FILE),
                    ))),
                }
            }
            other => Err(Failure::Wire(errno(22, format!("{other:?} reached the wrong handler")))),
        }
    }
}
