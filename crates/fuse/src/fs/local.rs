//! Calls the mount answers itself, under rights it holds: the decision and the cache
//! change are the client core's (`crest_client::local`); here are the inode numbers
//! reserved ahead, the queue room taken before the cache lock, the send under it, and
//! the kernel's inode table.

use super::*;

impl CrestFs {
    /// A fresh inode number for a writeback create (from a batch reserved on the server).
    pub(super) fn next_ino(&self) -> Option<u64> {
        let resets = lock(&self.names).resets();
        {
            let mut p = lock(&self.pool);
            if p.0 < p.1 && p.2 == resets {
                p.0 += 1;
                return Some(p.0 - 1);
            }
        }
        match self.one("allocate inodes", Op::AllocInodes { count: INODE_BATCH }) {
            Ok(Reply::Inodes { first, count }) if count > 0 => {
                *lock(&self.pool) = (first + 1, first + u64::from(count), resets);
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

    /// Creates and opens a regular file through the server in one request, under a
    /// number from this mount's range (`Op::CreateAt`) that the `Open` can name: a create
    /// in a directory another mount is changing too costs one round trip, not two.
    /// Returns the created and the opened attributes, and the stamp the opened ones are
    /// newer than. `None`: no number at hand, or the server did not know the grant (a
    /// restart forgot it; EPERM): make the two calls.
    pub(super) fn create_open_on_server(
        &self,
        cred: p::Cred,
        parent: u64,
        name: &OsStr,
        mode: u32,
        fh: FileHandle,
        access: u32,
    ) -> Option<Result<(p::Attr, p::Attr, u64), Error>> {
        let ino = self.next_ino()?;
        let create = Op::CreateAt {
            ino,
            generation: crest_rng::next_u64(),
            parent,
            name: name.as_bytes().to_vec(),
            kind: p::FileType::Regular,
            mode,
            rdev: 0,
            cred,
        };
        let sent = Instant::now();
        let mut r = match self.many("create", vec![create, Op::Open { ino, handle: fh.0, access }]) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let a = match nth("create", &mut r, 0).and_then(|x| want_attr("create", x)) {
            Ok(a) => a,
            Err(e) if e.errno() == Errno::EPERM => return None,
            Err(e) => return Some(Err(e)),
        };
        // (Stamped after the create's attributes are in, as if the open went next: nobody
        // else can have had the new inode's attributes to take in before its reply.)
        let stamp = {
            let mut c = lock(&self.names);
            c.created_by_reply(parent, name.as_bytes(), &a, sent, Instant::now());
            c.stamp()
        };
        Some(nth("create", &mut r, 1).and_then(|x| want_attr("create", x)).map(|opened| (a, opened, stamp)))
    }

    /// What runs when writeback `what` touching `inodes` is answered: the cache settles
    /// it (`NameCache::writeback_answered`), and whoever waits for the inodes is woken.
    pub(super) fn completion(&self, what: &'static str, inodes: Vec<u64>) -> Completion {
        let names = self.names.clone();
        let idle = self.idle.clone();
        Box::new(move |r| {
            let r = r.as_deref().map_err(|e| p::OpError { errno: e.errno(), message: e.to_string() });
            let failure = lock(&names).writeback_answered(what, &inodes, r, Instant::now());
            if let Some(e) = failure {
                tracing::warn!(?inodes, "writeback {what} failed: {} (errno {})", e.message, e.errno);
            }
            idle.notify_all();
        })
    }

    /// Sends a local answer's writeback (under the cache lock, with `permit` taken before
    /// it): a failure to queue it is the connection's end, reported there.
    pub(super) fn send_writeback(&self, permit: crest_net::AsyncPermit<'_>, wb: Writeback, t: p::Time) {
        let done = self.completion(wb.what, wb.touched);
        if let Err(e) = permit.submit(wb.ops, t, done) {
            tracing::warn!("writeback {}: {e}", wb.what);
        }
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

    /// Whether the calling process's change may be answered here. The kernel checked it
    /// with the caller's own ids (`default_permissions`); that is the server's check only
    /// for a caller the server takes for who it is (`p::IdentityMap::keeps`). A squashed
    /// root, or anyone under all_squash or an id map, goes to the server, which judges
    /// and refuses at once what the kernel let through. (Writes are not asked: an open
    /// handle, which the server judged, is what permits them.)
    pub(super) fn judged_here(&self) -> bool {
        self.judged_map().is_some()
    }

    /// `judged_here`, with the identity map it judged by.
    pub(super) fn judged_map(&self) -> Option<Arc<p::IdentityMap>> {
        let map = self.client.identity_map();
        (map.is_identity() || map.keeps(&caller::current())).then_some(map)
    }

    /// The clock a local answer is made on.
    pub(super) fn clock() -> Clock {
        Clock { at: Instant::now(), time: now_time() }
    }

    /// Answers a create here when this mount holds `parent` exclusively and knows `name`
    /// is free (`NameCache::create_here`). `None`: do it the synchronous way.
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
        open: Option<(FileHandle, u32)>,
    ) -> Option<p::Attr> {
        // What the server would change (setuid bits dropped) or refuse (a device) is not
        // answered here either.
        let map = self.judged_map()?;
        let device = matches!(kind, p::FileType::CharDevice | p::FileType::BlockDevice) && rdev != 0;
        if (device && !map.allow_devices) || !map.keeps_mode(mode, kind == p::FileType::Directory) {
            return None;
        }
        if !lock(&self.names).may_create_here(parent, name) {
            return None;
        }
        let ino = self.next_ino()?;
        let permit = self.client.async_permit(name.len() + target.map_or(0, <[u8]>::len));
        let generation = crest_rng::next_u64();
        let node = NewNode {
            cred,
            parent,
            name,
            kind,
            mode,
            rdev,
            target,
            open: open.map(|(h, access)| (h.0, access)),
            ino,
            generation,
        };
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let (attr, wb) = c.create_here(&node, clock)?;
        self.send_writeback(permit, wb, clock.time);
        drop(c);
        lock(&self.inodes).learn(parent, &attr);
        Some(attr)
    }

    /// Asks the server for `dir` whole — exclusive rights on it and on everything it names,
    /// with every entry — before a change in it that this mount would otherwise send and
    /// wait for. Then this change and the ones after it (an `rm -rf`, a build's outputs)
    /// are answered here. At most once per `ACQUIRE_RETRY` per directory; the server
    /// refuses (EBUSY) while another mount is changing the directory too, so mounts
    /// working in one directory do not trade it (docs/protocol.md §4.1, "Shared
    /// directories"). True when `dir` is now held whole.
    pub(super) fn acquire(&self, dir: u64) -> bool {
        if !self.judged_here() {
            return false;
        }
        {
            let c = lock(&self.names);
            // (A directory held through its parent's acquire still has to be listed.)
            if !c.caching() || c.holds_whole(dir) {
                return false;
            }
        }
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
        // A grant can cross a recall of the directory or an entry on its way (several
        // mounts starting at once in directories one mount made: the maker gives them up
        // as the others look them up), and a listing older than a recall is not taken
        // in. Asking again is then usually answered at once (the server holds `dir` for
        // this mount by then); if another mount is at work in `dir`, it is refused
        // (EBUSY) or takes back what the other holds, at most ACQUIRE_ATTEMPTS times.
        // Giving up at once left the mount sending every change for a second
        // (ACQUIRE_RETRY).
        for _ in 0..ACQUIRE_ATTEMPTS {
            let epoch = lock(&self.names).epoch();
            match self.one("acquire", Op::Acquire { ino: dir }) {
                Ok(Reply::Lookup { attr: Some(a), leaf }) => {
                    if lock(&self.names).absorb_acquired(&a, &leaf, epoch, Instant::now()) {
                        return true;
                    }
                    tracing::debug!(dir, "acquire: granted, but a recall crossed it: asking again");
                }
                Ok(r) => {
                    tracing::warn!("{}", unexpected("acquire", &r));
                    return false;
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    return false;
                }
            }
        }
        false
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

    /// Opens a regular file whose attributes are held without waiting
    /// (`NameCache::open_here`). Returns keep-cache, or `None` to open synchronously.
    pub(super) fn open_locally(&self, ino: u64, fh: FileHandle, access: u32) -> Option<bool> {
        if !self.judged_here() {
            return None;
        }
        let permit = self.client.async_permit(0);
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let (a, wb) = c.open_here(ino, fh.0, access, clock.at)?;
        self.send_writeback(permit, wb, clock.time);
        drop(c);
        if access & p::OPEN_WRITE != 0 {
            // Not held for a batch: the server sends the flush recall that protects this
            // descriptor's shared mapping (dirtied as soon as open returns) only to the
            // sessions it knows hold the file open.
            self.client.flush_writeback();
        }
        Some(lock(&self.inodes).keep_cache_on_open(&a))
    }

    /// Answers an unlink (or, `dir`, an rmdir) here (`NameCache::remove_here`); false:
    /// do it the synchronous way.
    pub(super) fn remove_locally(&self, parent: u64, name: &[u8], dir: bool) -> bool {
        if !self.judged_here() {
            return false;
        }
        if !lock(&self.names).is_exclusive(parent) {
            return false;
        }
        let permit = self.client.async_permit(name.len());
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let Some(wb) = c.remove_here(parent, name, dir, clock) else { return false };
        self.send_writeback(permit, wb, clock.time);
        true
    }

    /// Answers a rename here (`NameCache::rename_here`); false: do it the synchronous way.
    pub(super) fn rename_locally(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> bool {
        if !self.judged_here() {
            return false;
        }
        {
            let c = lock(&self.names);
            if !c.is_exclusive(parent) || !c.is_exclusive(new_parent) {
                return false;
            }
        }
        let permit = self.client.async_permit(name.len() + new_name.len());
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let Some((moved, wb)) = c.rename_here(parent, name, new_parent, new_name, flags, clock) else { return false };
        self.send_writeback(permit, wb, clock.time);
        drop(c);
        if moved.kind == p::FileType::Directory {
            lock(&self.inodes).set_parent(moved.ino, new_parent);
        }
        true
    }

    /// Answers a hard link here (`NameCache::link_here`). `None`: do it the synchronous
    /// way.
    pub(super) fn link_locally(&self, ino: u64, parent: u64, name: &[u8]) -> Option<p::Attr> {
        if !self.judged_here() {
            return None;
        }
        {
            let c = lock(&self.names);
            if !c.is_exclusive(parent) || !c.is_exclusive(ino) {
                return None;
            }
        }
        let permit = self.client.async_permit(name.len());
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let (a, wb) = c.link_here(ino, parent, name, clock)?;
        self.send_writeback(permit, wb, clock.time);
        Some(a)
    }

    /// Answers setxattr (`value` `Some`) or removexattr here (`NameCache::xattr_here`).
    /// `None`: do it the synchronous way.
    pub(super) fn xattr_locally(
        &self,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Option<Result<(), Errno>> {
        if !self.judged_here() {
            return None;
        }
        // Not held: the synchronous way (checked again under the lock below).
        lock(&self.names).held_xattrs(ino)?;
        let permit = self.client.async_permit(name.len() + value.map_or(0, <[u8]>::len));
        let clock = Self::clock();
        let mut c = lock(&self.names);
        match c.xattr_here(ino, name, value, flags, clock)? {
            Ok(wb) => {
                self.send_writeback(permit, wb, clock.time);
                Some(Ok(()))
            }
            Err(errno) => Some(Err(Errno::from_i32(errno))),
        }
    }

    /// Answers a change of an inode this mount holds exclusively (`answer` is one of
    /// `NameCache::{write,setattr}_here`), with `bytes` of queue room. `None`: do it the
    /// synchronous way.
    pub(super) fn change_locally(
        &self,
        ino: u64,
        bytes: usize,
        answer: impl FnOnce(&mut NameCache, Clock) -> Option<(p::Attr, Writeback)>,
    ) -> Option<p::Attr> {
        if !lock(&self.names).is_exclusive(ino) {
            return None;
        }
        let permit = self.client.async_permit(bytes);
        let clock = Self::clock();
        let mut c = lock(&self.names);
        let (a, wb) = answer(&mut c, clock)?;
        self.send_writeback(permit, wb, clock.time);
        drop(c);
        lock(&self.inodes).changed_here(&a);
        Some(a)
    }
}
