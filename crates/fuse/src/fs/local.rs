//! Calls the mount answers itself, under rights it holds: creates (with inode numbers
//! reserved ahead), opens, unlinks, renames, links, xattr and attribute changes, each sent
//! to the server behind the answer as writeback (`completion` settles what comes back).

use super::*;

impl CrestFs {
    /// A fresh inode number for a writeback create (from a batch reserved on the server).
    pub(super) fn next_ino(&self) -> Option<u64> {
        {
            let mut p = lock(&self.pool);
            if p.0 < p.1 {
                p.0 += 1;
                return Some(p.0 - 1);
            }
        }
        match self.one("allocate inodes", Op::AllocInodes { count: INODE_BATCH }) {
            Ok(Reply::Inodes { first, count }) if count > 0 => {
                *lock(&self.pool) = (first + 1, first + u64::from(count));
                Some(first)
            }
            Ok(r) => {
                tracing::warn!("{}", unexpected("allocate inodes", &r));
                None
            }
            Err(e) => {
                tracing::debug!("{e}");
                None
            }
        }
    }

    /// What runs when a writeback request touching `inodes` is answered: the in-flight
    /// counts go down; a failure is kept for the next flush/fsync of each inode, and what
    /// this mount assumed about them is dropped (the server's state is fetched again); on
    /// success, the server's attributes replace the computed ones once nothing else is in
    /// flight for the inode (they differ at most in the block count).
    pub(super) fn completion(&self, op: &'static str, inodes: Vec<u64>) -> Completion {
        let names = self.names.clone();
        let idle = self.idle.clone();
        Box::new(move |r| {
            let mut c = lock(&names);
            let idle_now: Vec<bool> = inodes.iter().map(|&i| c.end_writeback(i)).collect();
            let failure = match r {
                Ok(results) => {
                    let mut failure = None;
                    for res in results {
                        match res {
                            Ok(Reply::Attr(a) | Reply::Entry(a)) => {
                                if let Some(k) = inodes.iter().position(|&i| i == a.ino) {
                                    // A reply can come back after that of a later request
                                    // (the server held this one until other clients dropped
                                    // what they cached): its state is then older than what
                                    // this mount answered since (a later ctime) and must
                                    // neither be compared nor replace it.
                                    let mine = c.attr(a.ino, Instant::now());
                                    let newer_here =
                                        mine.as_ref().is_some_and(|m| time_key(m.ctime) > time_key(a.ctime));
                                    if idle_now[k] && c.is_exclusive(a.ino) && !newer_here {
                                        if let Some(mine) = mine {
                                            if (p::Attr { blocks_4k: a.blocks_4k, ..mine.clone() }) != a {
                                                // The client's rules and the server's disagree:
                                                // a bug (e2e fails on this line).
                                                tracing::error!(
                                                    "writeback attributes differ from the server's: {mine:?} vs {a:?}"
                                                );
                                            }
                                        }
                                        c.attr_changed(&a);
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(e) => failure = failure.or(Some(e)),
                        }
                    }
                    failure
                }
                Err(e) => Some(p::OpError { errno: e.errno(), message: e.to_string() }),
            };
            if let Some(e) = failure {
                tracing::warn!(?inodes, "writeback {op} failed: {} (errno {})", e.message, e.errno);
                let now = Instant::now();
                for &ino in &inodes {
                    // An access time a read moved is no change of the caller's: its loss
                    // (a fenced session) fails no later close or fsync.
                    if op != ATIME {
                        c.defer_error(ino, e.clone());
                    }
                    c.recall_rights(ino, now);
                    c.recalled(ino);
                }
            }
            drop(c);
            idle.notify_all();
        })
    }

    /// Waits until no writeback of `ino` is in flight; then its deferred failure, if any.
    pub(super) fn settle(&self, op: &'static str, ino: u64) -> Result<(), Error> {
        let deadline = Instant::now() + WRITEBACK_WAIT;
        // What is still held on the client goes out now rather than on its timer.
        self.client.flush_writeback();
        let mut c = lock(&self.names);
        while c.writeback_pending(ino) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Server { op, errno: libc::ETIMEDOUT, message: format!("writeback of inode {ino}") });
            }
            c = self.idle.wait_timeout(c, left).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
        match c.take_error(ino) {
            Some(e) => Err(Error::server(op, e)),
            None => Ok(()),
        }
    }

    /// Answers a create here when this mount holds `parent` exclusively and knows `name`
    /// is free: the new inode's attributes are the server's rules applied at this mount's
    /// clock (`Store::create`, set-group-ID inheritance), and the request goes out without
    /// waiting. `None`: do it the synchronous way.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_locally(
        &self,
        cred: p::Cred,
        parent: u64,
        name: &[u8],
        kind: p::FileType,
        mode: u32,
        rdev: u64,
        target: Option<&[u8]>,
        open: Option<FileHandle>,
    ) -> Option<p::Attr> {
        if name.is_empty() || name.len() > crest_client::NAME_MAX || name == b"." || name == b".." {
            return None;
        }
        if !lock(&self.names).is_exclusive(parent) {
            return None;
        }
        let ino = self.next_ino()?;
        let permit = self.client.async_permit(name.len() + target.map_or(0, <[u8]>::len));
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        if !c.is_exclusive(parent) || c.lookup(parent, name, now) != Some(Cached::Absent) {
            return None;
        }
        let dir = c.attr(parent, now)?;
        if dir.kind != p::FileType::Directory || (kind == p::FileType::Directory && dir.nlink >= LINK_MAX_MARGIN) {
            return None;
        }
        // The parent's default ACL, when it has one, must be known here to create locally.
        let default = match dir.flags & acl::HAS_DEFAULT {
            0 => None,
            _ => Some(c.held_xattrs(parent)?.get(acl::DEFAULT)?.clone()),
        };
        let requested = mode & 0o7777;
        let got =
            acl::inherit(default.as_deref(), kind == p::FileType::Directory, target.is_some(), requested, cred.umask);
        let (gid, mode) =
            p::owner::new_inode_group(dir.mode, dir.gid, cred.gid, kind == p::FileType::Directory, got.mode);
        // The server reports every directory as one block (its entry count is its own).
        let size =
            if kind == p::FileType::Directory { p::DIR_SIZE_BYTES } else { target.map_or(0, |t| t.len() as u64) };
        let attr = p::Attr {
            ino,
            generation: crest_rng::next_u64(),
            kind,
            mode: if target.is_some() { 0o777 } else { mode & 0o7777 },
            nlink: if kind == p::FileType::Directory { 2 } else { 1 },
            uid: cred.uid,
            gid,
            size_bytes: size,
            blocks_4k: if target.is_some() { estimated_blocks(size) } else { 0 },
            rdev,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            flags: got.flags(),
        };
        let mut d = dir;
        d.mtime = t;
        d.ctime = t;
        if kind == p::FileType::Directory {
            d.nlink += 1;
        }
        let mut ops = vec![match target {
            Some(target) => Op::SymlinkAt {
                ino,
                generation: attr.generation,
                parent,
                name: name.to_vec(),
                target: target.to_vec(),
                cred,
            },
            // The server applies the parent's default ACL or the umask to the mode asked for,
            // as `inherit` did here.
            None => Op::CreateAt {
                ino,
                generation: attr.generation,
                parent,
                name: name.to_vec(),
                kind,
                mode: requested,
                rdev,
                cred,
            },
        }];
        if let Some(fh) = open {
            ops.push(Op::Open { ino, handle: fh.0 });
        }
        c.added(parent, name, &attr, now);
        c.set_attr(&d, now);
        if kind == p::FileType::Directory {
            c.made_dir(&attr, now);
        }
        c.grant_exclusive(ino, now, now);
        c.created_without_xattrs(ino);
        for (name, value) in [(acl::ACCESS, &got.access), (acl::DEFAULT, &got.default)] {
            if let Some(v) = value {
                c.set_held_xattr(ino, name, v);
            }
        }
        c.begin_writeback(ino);
        c.begin_writeback(parent);
        if let Err(e) = permit.submit(ops, t, self.completion("create", vec![ino, parent])) {
            tracing::warn!("writeback create of inode {ino}: {e}");
        }
        drop(c);
        lock(&self.inodes).learn(parent, &attr);
        Some(attr)
    }

    /// Asks the server for `dir` whole — exclusive rights on it and on everything it names,
    /// with every entry — before a change in it that this mount would otherwise send and
    /// wait for. Then this change and the ones after it (an `rm -rf`, a build's outputs)
    /// are answered here. At most once per `ACQUIRE_RETRY` per directory, so two mounts
    /// working in one directory trade it at that pace at most. True when `dir` is now held
    /// whole.
    pub(super) fn acquire(&self, dir: u64) -> bool {
        let epoch = {
            let c = lock(&self.names);
            // (A directory held through its parent's acquire still has to be listed.)
            if !c.caching() || c.holds_whole(dir) {
                return false;
            }
            c.epoch()
        };
        let now = Instant::now();
        {
            let mut tried = lock(&self.acquire_tried);
            if tried.get(&dir).is_some_and(|&t| now.duration_since(t) < ACQUIRE_RETRY) {
                return false;
            }
            if tried.len() >= 4096 {
                tried.retain(|_, t| now.duration_since(*t) < ACQUIRE_RETRY);
            }
            tried.insert(dir, now);
        }
        match self.one("acquire", Op::Acquire { ino: dir }) {
            Ok(Reply::Lookup { attr: Some(a), leaf }) => {
                lock(&self.names).absorb_acquired(&a, &leaf, epoch, Instant::now())
            }
            Ok(r) => {
                tracing::warn!("{}", unexpected("acquire", &r));
                false
            }
            Err(e) => {
                tracing::debug!("{e}");
                false
            }
        }
    }

    /// Sends `op` behind this mount's writeback without waiting for its answer, which
    /// only a log line awaits (opens and closes of handles).
    pub(super) fn send_behind(&self, what: &'static str, ino: u64, op: Op) {
        let permit = self.client.async_permit(0);
        let done: Completion = Box::new(move |r| match r {
            Ok(res) => {
                if let Some(Err(e)) = res.first() {
                    tracing::debug!(ino, "{what}: {}", e.message);
                }
            }
            Err(e) => tracing::debug!(ino, "{what}: {e}"),
        });
        if let Err(e) = permit.submit(vec![op], now_time(), done) {
            tracing::warn!(ino, "{what}: {e}");
        }
    }

    pub(super) fn open_locally(&self, ino: u64, fh: FileHandle, writable: bool) -> Option<bool> {
        let permit = self.client.async_permit(0);
        let mut c = lock(&self.names);
        let a = c.attr(ino, Instant::now()).filter(|a| a.kind == p::FileType::Regular)?;
        c.begin_writeback(ino);
        if let Err(e) =
            permit.submit(vec![Op::Open { ino, handle: fh.0 }], now_time(), self.completion("open", vec![ino]))
        {
            tracing::warn!("open of inode {ino}: {e}");
        }
        drop(c);
        if writable {
            // Not held for a batch: the server sends the flush recall that protects this
            // descriptor's shared mapping (dirtied as soon as open returns) only to the
            // sessions it knows hold the file open.
            self.client.flush_writeback();
        }
        Some(lock(&self.inodes).keep_cache_on_open(&a))
    }

    /// Answers an unlink (or, `dir`, an rmdir) here when this mount holds the directory
    /// and the victim exclusively and knows what the server will find: the name names a
    /// non-directory (or a directory known to be empty), and the directory's attributes
    /// are held. The request goes out without waiting; false: do it the synchronous way.
    pub(super) fn remove_locally(&self, parent: u64, name: &[u8], dir: bool) -> bool {
        if !lock(&self.names).is_exclusive(parent) {
            return false;
        }
        let permit = self.client.async_permit(name.len());
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        let Some(Cached::Found(victim)) = c.lookup(parent, name, now) else { return false };
        let (Some(mut d), true) = (c.attr(parent, now), c.is_exclusive(parent) && c.is_exclusive(victim.ino)) else {
            return false;
        };
        let is_dir = victim.kind == p::FileType::Directory;
        if is_dir != dir || (dir && !c.known_empty(victim.ino)) {
            return false;
        }
        d.mtime = t;
        d.ctime = t;
        if dir {
            d.nlink = d.nlink.saturating_sub(1);
        }
        let op =
            if dir { Op::Rmdir { parent, name: name.to_vec() } } else { Op::Unlink { parent, name: name.to_vec() } };
        c.removed(parent, name);
        c.set_attr(&d, now);
        c.begin_writeback(parent);
        c.begin_writeback(victim.ino);
        let what = if dir { "rmdir" } else { "unlink" };
        if let Err(e) = permit.submit(vec![op], t, self.completion(what, vec![parent, victim.ino])) {
            tracing::warn!("writeback {what} in directory {parent}: {e}");
        }
        true
    }

    /// Answers a rename here when this mount holds both directories, the moved inode and
    /// any inode the target name replaces exclusively, and knows what the server will
    /// find: the source name (found), the target name (found or absent), both
    /// directories' attributes, and — for a replaced directory — that it is empty. The
    /// cache is changed as `Store::rename` changes the server (entries, both directories'
    /// mtime/ctime and link counts, the moved inode's ctime, the replaced inode's lost
    /// link); the request goes out without waiting. Only flags 0 and RENAME_NOREPLACE (with
    /// the target absent); anything the server would refuse or treat specially (same
    /// inode, a kind mismatch, exchange) is left to the synchronous path, which reports
    /// the server's answer. false: do it the synchronous way.
    pub(super) fn rename_locally(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> bool {
        if flags & !p::RENAME_NOREPLACE != 0 {
            return false;
        }
        {
            let c = lock(&self.names);
            if !c.is_exclusive(parent) || !c.is_exclusive(new_parent) {
                return false;
            }
        }
        let permit = self.client.async_permit(name.len() + new_name.len());
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        if !c.is_exclusive(parent) || !c.is_exclusive(new_parent) {
            return false;
        }
        let Some(Cached::Found(mut moved)) = c.lookup(parent, name, now) else { return false };
        let target = match c.lookup(new_parent, new_name, now) {
            Some(Cached::Absent) => None,
            Some(Cached::Found(v)) if flags == 0 => Some(v),
            _ => return false,
        };
        let (Some(mut od), Some(mut nd)) = (c.attr(parent, now), c.attr(new_parent, now)) else { return false };
        if !c.is_exclusive(moved.ino) || od.kind != p::FileType::Directory || nd.kind != p::FileType::Directory {
            return false;
        }
        let is_dir = moved.kind == p::FileType::Directory;
        let across = parent != new_parent;
        if is_dir && across && (moved.ino == new_parent || nd.nlink >= LINK_MAX_MARGIN) {
            return false;
        }
        let mut victim = None;
        if let Some(v) = target {
            let v_dir = v.kind == p::FileType::Directory;
            if v.ino == moved.ino || !c.is_exclusive(v.ino) || v_dir != is_dir || (v_dir && !c.known_empty(v.ino)) {
                return false;
            }
            victim = Some(v);
        }
        // The server's order (`Store::rename`): the old directory loses the entry (and a
        // ".." link when a directory leaves it), the new one gains it (and the link),
        // losing the replaced directory's; when both are one directory, both apply to it.
        od.mtime = t;
        od.ctime = t;
        if is_dir && across {
            od.nlink = od.nlink.saturating_sub(1);
        }
        if !across {
            nd = od.clone();
        }
        if victim.as_ref().is_some_and(|v| v.kind == p::FileType::Directory) {
            nd.nlink = nd.nlink.saturating_sub(1);
        }
        if is_dir && across {
            nd.nlink += 1;
        }
        nd.mtime = t;
        nd.ctime = t;
        moved.ctime = t;
        // The replaced inode loses a link (`drop_link`): a directory all of its own; with
        // none left it is gone (or an orphan kept by its opens), and nothing is held of it.
        let victim_after = victim.as_ref().and_then(|v| {
            let nlink = if v.kind == p::FileType::Directory { 0 } else { v.nlink.saturating_sub(1) };
            (nlink > 0).then(|| p::Attr { nlink, ctime: t, ..v.clone() })
        });
        c.renamed(parent, name, new_parent, new_name, &moved, victim_after.as_ref(), now);
        if across {
            c.set_attr(&od, now);
        }
        c.set_attr(&nd, now);
        // The kernel moved its dentry itself, with the long timeout the old one had: the
        // new name is one to invalidate when the new directory is given up.
        c.kernel_entry(new_parent, new_name, moved.ino);
        let mut touched = vec![parent, moved.ino];
        if across {
            touched.push(new_parent);
        }
        if let Some(v) = &victim {
            touched.push(v.ino);
        }
        for &i in &touched {
            c.begin_writeback(i);
        }
        let op = Op::Rename { parent, name: name.to_vec(), new_parent, new_name: new_name.to_vec(), flags };
        if let Err(e) = permit.submit(vec![op], t, self.completion("rename", touched)) {
            tracing::warn!("writeback rename in directory {parent}: {e}");
        }
        drop(c);
        if is_dir {
            lock(&self.inodes).set_parent(moved.ino, new_parent);
        }
        true
    }

    /// Answers a hard link here when this mount holds the inode and the directory
    /// exclusively, knows the name is absent and holds both's attributes (`Store::link`:
    /// the inode gains a link and its ctime, the directory its mtime and ctime). `None`:
    /// do it the synchronous way.
    pub(super) fn link_locally(&self, ino: u64, parent: u64, name: &[u8]) -> Option<p::Attr> {
        if name.is_empty() || name.len() > crest_client::NAME_MAX || name == b"." || name == b".." {
            return None;
        }
        {
            let c = lock(&self.names);
            if !c.is_exclusive(parent) || !c.is_exclusive(ino) {
                return None;
            }
        }
        let permit = self.client.async_permit(name.len());
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        if !c.is_exclusive(parent) || !c.is_exclusive(ino) || c.lookup(parent, name, now) != Some(Cached::Absent) {
            return None;
        }
        let (mut a, mut d) = (c.attr(ino, now)?, c.attr(parent, now)?);
        if a.kind == p::FileType::Directory || d.kind != p::FileType::Directory {
            return None;
        }
        if a.nlink == 0 || a.nlink >= LINK_MAX_MARGIN {
            return None;
        }
        a.nlink += 1;
        a.ctime = t;
        d.mtime = t;
        d.ctime = t;
        c.added(parent, name, &a, now);
        c.set_attr(&d, now);
        c.begin_writeback(ino);
        c.begin_writeback(parent);
        let op = Op::Link { ino, parent, name: name.to_vec() };
        if let Err(e) = permit.submit(vec![op], t, self.completion("link", vec![ino, parent])) {
            tracing::warn!("writeback link of inode {ino}: {e}");
        }
        Some(a)
    }

    /// Bytes the store's record of an xattr takes in the item of its name hash
    /// (`crest_store::fs::xattr::record_bytes`): inline, or a 14-byte header and the name.
    pub(super) fn xattr_record_bytes(name_len: usize, value_len: usize) -> usize {
        if name_len + value_len <= XATTR_INLINE_MAX {
            3 + name_len + value_len
        } else {
            14 + name_len
        }
    }

    /// True when the store accepts xattr `name` = a value of `value_len` bytes on an inode
    /// whose xattrs are `held` (all of them): the value's size, the name list, and the
    /// item of the names sharing its hash (computed as the store does, so exact).
    pub(super) fn xattr_fits(
        held: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
        name: &[u8],
        value_len: usize,
    ) -> bool {
        if value_len > XATTR_SIZE_MAX {
            return false;
        }
        if !held.contains_key(name) && held.keys().map(|n| n.len() + 1).sum::<usize>() + name.len() + 1 > XATTR_LIST_MAX
        {
            return false;
        }
        let hash = p::name_hash(name);
        let same_hash: usize = held
            .iter()
            .filter(|(n, _)| n.as_slice() != name && p::name_hash(n) == hash)
            .map(|(n, v)| Self::xattr_record_bytes(n.len(), v.len()))
            .sum();
        same_hash + Self::xattr_record_bytes(name.len(), value_len) <= XATTR_ITEM_BYTES
    }

    /// Answers setxattr (`value` `Some`) or removexattr here when this mount holds the
    /// inode exclusively and knows all its extended attributes (it created the inode and
    /// changed them only here since). The flags' and a missing name's errors are answered
    /// from that knowledge; a change bumps the ctime (as the store does) and goes out
    /// without waiting. Anything the server might refuse for its size is left to the
    /// synchronous path. `None`: do it the synchronous way.
    pub(super) fn xattr_locally(
        &self,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Option<Result<(), Errno>> {
        // ACLs change the mode too (`acl::update_mode`): the server applies them.
        if name.is_empty() || name.contains(&0) || name.len() > XATTR_NAME_MAX || acl::flag_of(name) != 0 {
            return None;
        }
        // Not held: the synchronous way (checked again under the lock below).
        lock(&self.names).held_xattrs(ino)?;
        let permit = self.client.async_permit(name.len() + value.map_or(0, <[u8]>::len));
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        let held = c.held_xattrs(ino)?;
        let exists = held.contains_key(name);
        let op = match value {
            Some(value) => {
                if flags & p::XATTR_CREATE != 0 && exists {
                    return Some(Err(Errno::EEXIST));
                }
                if flags & p::XATTR_REPLACE != 0 && !exists {
                    return Some(Err(Errno::from_i32(libc::ENODATA)));
                }
                // What the store would refuse goes to the server for its answer; so does
                // an inode whose xattrs grow past what this mount keeps of them.
                let others: usize =
                    held.iter().filter(|(n, _)| n.as_slice() != name).map(|(n, v)| n.len() + v.len()).sum();
                if !Self::xattr_fits(held, name, value.len()) || others + name.len() + value.len() > HELD_XATTR_BYTES {
                    return None;
                }
                Op::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), flags }
            }
            None => {
                if !exists {
                    return Some(Err(Errno::from_i32(libc::ENODATA)));
                }
                Op::RemoveXattr { ino, name: name.to_vec() }
            }
        };
        let mut a = c.attr(ino, now)?;
        a.ctime = t;
        match value {
            Some(v) => c.set_held_xattr(ino, name, v),
            None => c.remove_held_xattr(ino, name),
        };
        c.set_attr(&a, now);
        c.begin_writeback(ino);
        let what = if value.is_some() { "setxattr" } else { "removexattr" };
        if let Err(e) = permit.submit(vec![op], t, self.completion(what, vec![ino])) {
            tracing::warn!("writeback {what} of inode {ino}: {e}");
        }
        Some(Ok(()))
    }

    /// Answers a change of an inode this mount holds exclusively here, if it can: `change`
    /// turns the held attributes into the new ones (or declines), and the operation `op`
    /// makes of the attributes held before goes out without waiting. `None`: do it the
    /// synchronous way.
    pub(super) fn change_locally(
        &self,
        what: &'static str,
        ino: u64,
        bytes: usize,
        op: impl FnOnce(&p::Attr) -> Op,
        change: impl FnOnce(&mut p::Attr, p::Time) -> bool,
    ) -> Option<p::Attr> {
        if !lock(&self.names).is_exclusive(ino) {
            return None;
        }
        let permit = self.client.async_permit(bytes);
        let now = Instant::now();
        let t = now_time();
        let mut c = lock(&self.names);
        if !c.is_exclusive(ino) {
            return None;
        }
        let mut a = c.attr(ino, now)?;
        let op = op(&a);
        if !change(&mut a, t) {
            return None;
        }
        c.set_attr(&a, now);
        c.begin_writeback(ino);
        if let Err(e) = permit.submit(vec![op], t, self.completion(what, vec![ino])) {
            tracing::warn!("writeback {what} of inode {ino}: {e}");
        }
        drop(c);
        lock(&self.inodes).changed_here(&a);
        Some(a)
    }
}
