//! The `fuser::Filesystem`: each kernel request becomes one client call (a compound one
//! where a request needs several operations), and the result becomes the reply.
//!
//! Invariants:
//! - handlers hold no lock across a client call (calls block while the server is away);
//! - every successful `Open` on the server is matched by exactly one `Release`, sent when
//!   the kernel releases the file handle (the kernel guarantees one release per open);
//! - file and directory handles are a counter; they carry no state on files, and index the
//!   directory streams on directories;
//! - POSIX (fcntl) and flock locks on files are the server's (docs/protocol.md §4.6): the
//!   init reply advertises both lock capabilities, `getlk`/`setlk` ask the server, and a
//!   blocking request waits on a thread of its own, never on a handler thread
//!   (`crate::locks`). Every lock is dropped on the server when the kernel would drop it
//!   locally: a process's POSIX locks at each of its closes (FLUSH, hence no FOPEN_NOFLUSH),
//!   an open file's flock and OFD locks at its release. Locks on directories stay in the
//!   kernel (FUSE has no lock method for directories).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crest_cache::{Cached, NameCache};
use crest_net::Client;
use crest_proto::{self as p, Op, Reply};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, PollEvents, PollFlags,
    PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use crate::convert::{self, XattrAnswer};
use crate::dir::{DirStream, Entry, READDIR_BATCH};
use crate::error::Error;
use crate::inodes::Inodes;
use crate::locks::{self, LockCall, Owners};

/// Largest read or write the kernel is offered (it caps this at its `max_pages_limit`).
pub const MAX_IO_BYTES: u32 = p::MAX_IO_BYTES;
/// Readahead asked of the kernel (it caps this at the bdi's current readahead; the mount
/// raises that afterwards).
pub const MAX_READAHEAD_BYTES: u32 = 1 << 20;
/// Most directory streams kept at once (one per open directory handle).
pub const MAX_DIR_STREAMS: usize = 4096;
/// Flags for files opened read-only. Not FOPEN_NOFLUSH, although such a descriptor cannot
/// dirty pages: the FLUSH at `close` is where a process's POSIX locks end (a read lock
/// needs only a read-only descriptor), and the daemon answers it without a round trip
/// unless the process took locks on the file.
const READ_ONLY_OPEN_FLAGS: FopenFlags = FopenFlags::empty();

type Results = Vec<Result<Reply, p::OpError>>;

/// A crest mount as the kernel sees it.
#[derive(Debug)]
pub struct CrestFs {
    client: Arc<Client>,
    /// What the kernel may cache entries and attributes for: nothing. The daemon's own
    /// cache (`names`) holds them under the server's recall protocol, where a recall
    /// never waits on a kernel lock (docs/protocol.md §4.3).
    ttl: Duration,
    next_fh: AtomicU64,
    inodes: Mutex<Inodes>,
    dirs: Mutex<HashMap<u64, DirStream>>,
    /// Names and attributes this mount may answer lookups from (see crest-cache).
    names: Arc<Mutex<NameCache>>,
    /// Lock owners that may hold locks on the server (see crate::locks).
    lock_owners: Arc<Mutex<Owners>>,
}

/// Applies the server's recalls: drops the named inodes from the daemon's cache,
/// acknowledges, then asks the kernel to drop their pages (mmap readers; `read` already
/// revalidates through FUSE_AUTO_INVAL_DATA). Runs on its own thread, never inside a
/// request handler.
#[derive(Debug)]
pub struct RecallWorker {
    /// Weak: the mount owns the client; when it goes, the client says goodbye, its
    /// recall stream ends and so does this worker.
    client: std::sync::Weak<Client>,
    names: Arc<Mutex<NameCache>>,
}

impl RecallWorker {
    /// Starts the worker thread; it ends when the client's recall stream does.
    pub fn spawn(self, notifier: fuser::Notifier) -> std::io::Result<()> {
        let Some(recalls) = self.client.upgrade().and_then(|c| c.take_recalls()) else {
            return Ok(());
        };
        std::thread::Builder::new().name("crest-recall".into()).spawn(move || {
            for r in recalls {
                {
                    let mut names = lock(&self.names);
                    for &ino in &r.inodes {
                        names.recalled(ino);
                    }
                }
                match self.client.upgrade() {
                    Some(c) => c.recall_done(r.recall_id),
                    None => return,
                }
                for &ino in &r.inodes {
                    // ENOENT: the kernel does not know the inode; nothing to drop.
                    if let Err(e) = notifier.inval_inode(INodeNo(ino), 0, 0) {
                        tracing::trace!(ino, "inval_inode: {e}");
                    }
                }
            }
        })?;
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn name_of(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

fn cred(req: &Request) -> p::Cred {
    p::Cred { uid: req.uid(), gid: req.gid() }
}

fn unexpected(op: &'static str, r: &Reply) -> Error {
    let got = match r {
        Reply::Attr(_) => "Attr",
        Reply::Entry(_) => "Entry",
        Reply::Lookup { .. } => "Lookup",
        Reply::Dir { .. } => "Dir",
        Reply::Data(_) => "Data",
        Reply::Names(_) => "Names",
        Reply::StatFs(_) => "StatFs",
        Reply::Done => "Done",
        Reply::Lock(_) => "Lock",
    };
    Error::Protocol { op, got: got.into() }
}

fn want_attr(op: &'static str, r: Reply) -> Result<p::Attr, Error> {
    match r {
        Reply::Attr(a) | Reply::Entry(a) | Reply::Lookup { attr: Some(a), .. } => Ok(a),
        Reply::Lookup { attr: None, .. } => {
            Err(Error::Server { op, errno: libc::ENOENT, message: "no such name".into() })
        }
        r => Err(unexpected(op, &r)),
    }
}

fn want_data(op: &'static str, r: Reply) -> Result<Vec<u8>, Error> {
    match r {
        Reply::Data(d) => Ok(d),
        r => Err(unexpected(op, &r)),
    }
}

fn want_done(op: &'static str, r: Reply) -> Result<(), Error> {
    match r {
        Reply::Done => Ok(()),
        r => Err(unexpected(op, &r)),
    }
}

/// Takes result `i` of a compound call.
fn nth(op: &'static str, results: &mut Results, i: usize) -> Result<Reply, Error> {
    match results.get_mut(i).map(|r| std::mem::replace(r, Ok(Reply::Done))) {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(Error::server(op, e)),
        None => Err(Error::Protocol { op, got: format!("{} results", results.len()) }),
    }
}

impl CrestFs {
    /// A file system talking through `client`; the daemon trusts what it holds for at most
    /// `ttl` without hearing a recall (the kernel caches no entries or attributes).
    pub fn new(client: Client, ttl: Duration) -> CrestFs {
        CrestFs {
            client: Arc::new(client),
            ttl: Duration::ZERO,
            next_fh: AtomicU64::new(1),
            inodes: Mutex::new(Inodes::default()),
            dirs: Mutex::new(HashMap::new()),
            names: Arc::new(Mutex::new(NameCache::new(ttl))),
            lock_owners: Arc::new(Mutex::new(Owners::default())),
        }
    }

    /// The part that applies recalls; spawn it once the FUSE session exists.
    pub fn recall_worker(&self) -> RecallWorker {
        RecallWorker { client: Arc::downgrade(&self.client), names: self.names.clone() }
    }

    fn fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    fn one(&self, op: &'static str, o: Op) -> Result<Reply, Error> {
        self.client.call_one(o).map_err(|e| Error::server(op, e))
    }

    fn many(&self, op: &'static str, ops: Vec<Op>) -> Result<Results, Error> {
        let n = ops.len();
        let r = self.client.call(ops).map_err(|source| Error::Client { op, source })?;
        if r.len() != n {
            return Err(Error::Protocol { op, got: format!("{} results for {n} operations", r.len()) });
        }
        Ok(r)
    }

    fn fail(&self, e: &Error) -> Errno {
        if e.is_routine() {
            tracing::debug!("{e}");
        } else {
            tracing::warn!("{e}");
        }
        e.errno()
    }

    fn reply_entry(&self, reply: ReplyEntry, parent: u64, r: Result<p::Attr, Error>) {
        match r {
            Ok(a) => {
                lock(&self.inodes).learn(parent, &a);
                reply.entry(&self.ttl, &convert::file_attr(&a), Generation(a.generation));
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, r: Result<p::Attr, Error>) {
        match r {
            Ok(a) => reply.attr(&self.ttl, &convert::file_attr(&a)),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn reply_empty(&self, reply: ReplyEmpty, r: Result<(), Error>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn reply_xattr(&self, reply: ReplyXattr, size: u32, r: Result<Vec<u8>, Error>) {
        match r {
            Ok(v) => match convert::xattr_answer(v.len(), size) {
                XattrAnswer::Size(n) => reply.size(n),
                XattrAnswer::Data => reply.data(&v),
                XattrAnswer::TooSmall => reply.error(Errno::ERANGE),
            },
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn create_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: p::FileType,
        mode: u32,
        rdev: u64,
    ) -> Result<p::Attr, Error> {
        let op = Op::Create { parent: parent.0, name: name_of(name), kind, mode, rdev, cred: cred(req) };
        let a = self.one("create", op).and_then(|r| want_attr("create", r))?;
        self.added(parent.0, name.as_bytes(), &a);
        Ok(a)
    }

    /// Records a name this mount just made.
    fn added(&self, parent: u64, name: &[u8], a: &p::Attr) {
        let now = Instant::now();
        let mut c = lock(&self.names);
        c.added(parent, name, a, now);
        if a.kind == p::FileType::Directory {
            c.made_dir(a, now);
        }
    }

    /// Records fresh attributes from a reply.
    fn attr_changed(&self, a: &p::Attr) {
        lock(&self.names).attr_changed(a);
    }

    /// A close by process owner `owner` (FLUSH): drops its POSIX locks on `ino`, as a local
    /// close would, if it may hold any.
    fn unlock_at_close(&self, ino: u64, owner: u64) -> Result<(), Error> {
        if !lock(&self.lock_owners).take_posix(ino, owner) {
            return Ok(());
        }
        self.one("unlock at close", locks::unlock_all(ino, owner, false)).and_then(|r| want_done("unlock at close", r))
    }

    /// The release of handle `fh`: drops the locks owned by the open file itself (flock,
    /// OFD). The kernel names the flock owner when it took a flock lock through the handle
    /// (FUSE_RELEASE_FLOCK_UNLOCK); that owner is unlocked in both namespaces, in case its
    /// flock was taken as a POSIX lock (when /proc could not tell). Failures are logged:
    /// the release itself goes on, and the session's end drops whatever is left.
    fn unlock_at_release(&self, ino: u64, fh: u64, flock_owner: Option<LockOwner>) {
        let mut owners = lock(&self.lock_owners).take_handle(fh);
        if let Some(o) = flock_owner {
            owners.extend([(o.0, true), (o.0, false)]);
        }
        owners.sort_unstable();
        owners.dedup();
        if owners.is_empty() {
            return;
        }
        let ops = owners.into_iter().map(|(owner, flock)| locks::unlock_all(ino, owner, flock)).collect();
        match self.many("unlock at release", ops) {
            Ok(results) => {
                for e in results.into_iter().filter_map(Result::err) {
                    tracing::warn!(ino, "unlock at release: {} (errno {})", e.message, e.errno);
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Runs one readdir/readdirplus call on the stream of handle `fh`.
    fn readdir_into(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(Entry<'_>, u64) -> bool,
    ) -> Result<(), Error> {
        // The stream leaves the table while in use: no lock across the server call (the
        // kernel never runs two readdirs on one handle at once).
        let mut stream = lock(&self.dirs).remove(&fh).unwrap_or_default();
        let parent = lock(&self.inodes).parent(ino);
        let fetch = |from: u64| -> Result<(Vec<p::DirItem>, bool), Error> {
            let epoch = lock(&self.names).epoch();
            match self.one("readdir", Op::ReadDir { ino, from_index: from, limit: READDIR_BATCH })? {
                Reply::Dir { items, end } => {
                    let mut t = lock(&self.inodes);
                    for i in &items {
                        t.learn(ino, &i.attr);
                    }
                    drop(t);
                    if from == 0 && end {
                        // The whole directory in one reply: every lookup in it can be answered here.
                        lock(&self.names).absorb_listing(ino, &items, epoch, Instant::now());
                    }
                    Ok((items, end))
                }
                r => Err(unexpected("readdir", &r)),
            }
        };
        let r = stream.fill(offset, fetch, |e| add(e, parent));
        let mut dirs = lock(&self.dirs);
        if dirs.len() < MAX_DIR_STREAMS {
            dirs.insert(fh, stream);
        }
        r
    }
}

impl Filesystem for CrestFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Wanted: big requests, readdirplus when the kernel thinks it helps, lookups and
        // readdirs in one directory in parallel, symlink targets cached (they never change).
        // Locks are the server's, so they hold across clients (POSIX_LOCKS, FLOCK_LOCKS).
        // Deliberately absent: WRITEBACK_CACHE (several clients will share files; data is
        // buffered by the daemon), ATOMIC_O_TRUNC (with it the kernel skips the truncating
        // setattr of open(O_TRUNC) and with it the clearing of set-user-ID bits; without it
        // the kernel sends that setattr itself), EXPORT_SUPPORT.
        let wanted = [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // With attributes never cached in the kernel, every read revalidates them
            // and drops pages another client's write made stale.
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_FLOCK_LOCKS,
        ];
        for f in wanted {
            if let Err(missing) = config.add_capabilities(f) {
                tracing::info!("kernel lacks FUSE capability {missing:?}");
            }
        }
        if let Err(max) = config.set_max_write(MAX_IO_BYTES) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD_BYTES) {
            let _ = config.set_max_readahead(max);
        }
        tracing::debug!(abi = %config.kernel_abi(), "FUSE init");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (held, epoch) = {
            let c = lock(&self.names);
            (c.lookup(parent.0, name.as_bytes(), Instant::now()), c.epoch())
        };
        let r = match held {
            Some(Cached::Found(a)) => Ok(Some(a)),
            Some(Cached::Absent) => Ok(None),
            None => self.one("lookup", Op::Lookup { parent: parent.0, name: name_of(name) }).and_then(|r| match r {
                Reply::Lookup { attr, leaf } => {
                    lock(&self.names).absorb_leaf(parent.0, &leaf, epoch, Instant::now());
                    Ok(attr)
                }
                r => Err(unexpected("lookup", &r)),
            }),
        };
        match r {
            // Inode 0 with a timeout: the kernel caches the name's absence.
            Ok(None) => reply.entry(&self.ttl, &convert::placeholder_attr(0, FileType::RegularFile), Generation(0)),
            Ok(Some(a)) => self.reply_entry(reply, parent.0, Ok(a)),
            Err(e) => self.reply_entry(reply, parent.0, Err(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // The kernel sends forget when it evicts the inode, with its whole lookup count.
        lock(&self.inodes).forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(a) = lock(&self.names).attr(ino.0, Instant::now()) {
            return self.reply_attr(reply, Ok(a));
        }
        let epoch = lock(&self.names).epoch();
        let r = self.one("getattr", Op::GetAttr { ino: ino.0 }).and_then(|r| want_attr("getattr", r));
        if let Ok(a) = &r {
            lock(&self.names).hold_attr(a, epoch, Instant::now());
        }
        self.reply_attr(reply, r);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = p::SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size_bytes: size,
            atime: atime.map(convert::set_time),
            mtime: mtime.map(convert::set_time),
            ctime: ctime.map(convert::setattr_time),
        };
        let r = self.one("setattr", Op::SetAttr { ino: ino.0, set }).and_then(|r| want_attr("setattr", r));
        if let Ok(a) = &r {
            lock(&self.inodes).changed_here(a);
            self.attr_changed(a);
        }
        self.reply_attr(reply, r);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.one("readlink", Op::ReadLink { ino: ino.0 }).and_then(|r| want_data("readlink", r)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let Some(kind) = convert::kind_from_mode(mode) else {
            let e =
                Error::Invalid { op: "mknod", why: format!("mode {mode:#o} is not a file, device, fifo or socket") };
            return reply.error(self.fail(&e));
        };
        let r = self.create_node(req, parent, name, kind, convert::create_mode(mode, umask), u64::from(rdev));
        self.reply_entry(reply, parent.0, r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = self.create_node(req, parent, name, p::FileType::Directory, convert::create_mode(mode, umask), 0);
        self.reply_entry(reply, parent.0, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.one("unlink", Op::Unlink { parent: parent.0, name: name_of(name) });
        let r = r.and_then(|r| want_done("unlink", r));
        if r.is_ok() {
            lock(&self.names).removed(parent.0, name.as_bytes());
        }
        self.reply_empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.one("rmdir", Op::Rmdir { parent: parent.0, name: name_of(name) });
        let r = r.and_then(|r| want_done("rmdir", r));
        if r.is_ok() {
            lock(&self.names).removed(parent.0, name.as_bytes());
        }
        self.reply_empty(reply, r);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let op = Op::Symlink {
            parent: parent.0,
            name: name_of(link_name),
            target: name_of(target.as_os_str()),
            cred: cred(req),
        };
        let r = self.one("symlink", op).and_then(|r| want_attr("symlink", r));
        if let Ok(a) = &r {
            self.added(parent.0, link_name.as_bytes(), a);
        }
        self.reply_entry(reply, parent.0, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let Some(wire_flags) = convert::rename_flags(flags.bits()) else {
            let e = Error::Invalid { op: "rename", why: format!("flags {:#x} (whiteout or unknown)", flags.bits()) };
            return reply.error(self.fail(&e));
        };
        // Look the moved names up in the same request: a directory that moved needs its
        // new parent for "..".
        let mut ops = vec![
            Op::Rename {
                parent: parent.0,
                name: name_of(name),
                new_parent: newparent.0,
                new_name: name_of(newname),
                flags: wire_flags,
            },
            Op::Lookup { parent: newparent.0, name: name_of(newname) },
        ];
        if wire_flags & p::RENAME_EXCHANGE != 0 {
            ops.push(Op::Lookup { parent: parent.0, name: name_of(name) });
        }
        let r = self.many("rename", ops).and_then(|mut res| {
            want_done("rename", nth("rename", &mut res, 0)?)?;
            let mut c = lock(&self.names);
            c.removed(parent.0, name.as_bytes());
            c.removed(newparent.0, newname.as_bytes());
            let mut t = lock(&self.inodes);
            for (i, dir, n) in [(1, newparent.0, newname), (2, parent.0, name)] {
                if let Ok(a) = nth("rename", &mut res, i).and_then(|r| want_attr("rename", r)) {
                    t.learn(dir, &a);
                    c.added(dir, n.as_bytes(), &a, Instant::now());
                }
            }
            Ok(())
        });
        self.reply_empty(reply, r);
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let op = Op::Link { ino: ino.0, parent: newparent.0, name: name_of(newname) };
        let r = self.one("link", op).and_then(|r| want_attr("link", r));
        if let Ok(a) = &r {
            self.added(newparent.0, newname.as_bytes(), a);
        }
        self.reply_entry(reply, newparent.0, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // O_TRUNC never arrives here (no ATOMIC_O_TRUNC: the kernel truncates by setattr);
        // O_DIRECT needs nothing: the kernel sends such I/O straight through.
        match self.one("open", Op::Open { ino: ino.0 }).and_then(|r| want_attr("open", r)) {
            Ok(a) => {
                self.attr_changed(&a);
                let keep = lock(&self.inodes).keep_cache_on_open(&a);
                let mut f = FopenFlags::empty();
                if keep {
                    f |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if flags.acc_mode() == OpenAccMode::O_RDONLY {
                    f |= READ_ONLY_OPEN_FLAGS;
                }
                reply.opened(self.fh(), f);
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let op = Op::Read { ino: ino.0, offset, len: size.min(MAX_IO_BYTES) };
        match self.one("read", op).and_then(|r| want_data("read", r)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Ok(len) = u32::try_from(data.len()) else {
            return reply.error(Errno::EFBIG);
        };
        // O_APPEND: the kernel picked the offset from its idea of the size, which another
        // client's append may have outdated; the server appends at the real end.
        let op = if flags.0 & libc::O_APPEND != 0 {
            Op::Append { ino: ino.0, data: data.to_vec() }
        } else {
            Op::Write { ino: ino.0, offset, data: data.to_vec() }
        };
        match self.one("write", op).and_then(|r| want_attr("write", r)) {
            Ok(a) => {
                lock(&self.inodes).changed_here(&a);
                self.attr_changed(&a);
                reply.written(len);
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        // Writes are already on the server when they are acknowledged: nothing to push.
        // Pages dirtied through a shared mapping were written back by the kernel before it
        // sent this.
        if let Err(e) = self.unlock_at_close(ino.0, lock_owner.0) {
            return reply.error(self.fail(&e));
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.unlock_at_release(ino.0, fh.0, lock_owner);
        let r = self.one("release", Op::Release { ino: ino.0 });
        self.reply_empty(reply, r.and_then(|r| want_done("release", r)));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let r = self.one("fsync", Op::Fsync { ino: ino.0 });
        self.reply_empty(reply, r.and_then(|r| want_done("fsync", r)));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(self.fh(), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = self.readdir_into(ino.0, fh.0, offset, |e, parent| match e {
            Entry::Dot => reply.add(ino, convert::DOT_OFFSET, FileType::Directory, "."),
            Entry::DotDot => reply.add(INodeNo(parent), convert::DOTDOT_OFFSET, FileType::Directory, ".."),
            Entry::Item(i) => reply.add(
                INodeNo(i.attr.ino),
                convert::entry_offset(i.index),
                convert::file_type(i.attr.kind),
                OsStr::from_bytes(&i.name),
            ),
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let ttl = self.ttl;
        let r = self.readdir_into(ino.0, fh.0, offset, |e, parent| match e {
            // The kernel takes no attributes or lookup reference from "." and "..".
            Entry::Dot => {
                let a = convert::placeholder_attr(ino.0, FileType::Directory);
                reply.add(ino, convert::DOT_OFFSET, ".", &Duration::ZERO, &a, Generation(0))
            }
            Entry::DotDot => {
                let a = convert::placeholder_attr(parent, FileType::Directory);
                reply.add(INodeNo(parent), convert::DOTDOT_OFFSET, "..", &Duration::ZERO, &a, Generation(0))
            }
            Entry::Item(i) => reply.add(
                INodeNo(i.attr.ino),
                convert::entry_offset(i.index),
                OsStr::from_bytes(&i.name),
                &ttl,
                &convert::file_attr(&i.attr),
                Generation(i.attr.generation),
            ),
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let r = self.one("fsyncdir", Op::Fsync { ino: ino.0 });
        self.reply_empty(reply, r.and_then(|r| want_done("fsyncdir", r)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.one("statfs", Op::StatFs) {
            Ok(Reply::StatFs(s)) => reply.statfs(
                s.total_blocks,
                s.free_blocks,
                s.avail_blocks,
                s.files.saturating_add(s.files_free),
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Ok(r) => reply.error(self.fail(&unexpected("statfs", &r))),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let op =
            Op::SetXattr { ino: ino.0, name: name_of(name), value: value.to_vec(), flags: convert::xattr_flags(flags) };
        let r = self.one("setxattr", op);
        lock(&self.names).attr_stale(ino.0);
        self.reply_empty(reply, r.and_then(|r| want_done("setxattr", r)));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = self.one("getxattr", Op::GetXattr { ino: ino.0, name: name_of(name) });
        self.reply_xattr(reply, size, r.and_then(|r| want_data("getxattr", r)));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self.one("listxattr", Op::ListXattr { ino: ino.0 }).and_then(|r| match r {
            Reply::Names(n) => Ok(convert::xattr_list(&n)),
            r => Err(unexpected("listxattr", &r)),
        });
        self.reply_xattr(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.one("removexattr", Op::RemoveXattr { ino: ino.0, name: name_of(name) });
        lock(&self.names).attr_stale(ino.0);
        self.reply_empty(reply, r.and_then(|r| want_done("removexattr", r)));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks; this is only reached without it.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        // Two calls: Open names its inode, which exists only once Create has answered. The
        // kernel holds the directory locked in between, so nothing can unlink the new name.
        let created = self
            .create_node(req, parent, name, p::FileType::Regular, convert::create_mode(mode, umask), 0)
            .and_then(|a| {
                let opened = self.one("create", Op::Open { ino: a.ino }).and_then(|r| want_attr("create", r))?;
                Ok((a, opened))
            });
        match created {
            Ok((a, opened)) => {
                let mut t = lock(&self.inodes);
                t.learn(parent.0, &a);
                t.keep_cache_on_open(&opened);
                drop(t);
                self.attr_changed(&opened);
                let attr = convert::file_attr(&opened);
                reply.created(&self.ttl, &attr, Generation(opened.generation), self.fh(), FopenFlags::empty());
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // ENOSYS once: the kernel then answers poll itself (always ready).
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let op = Op::Fallocate { ino: ino.0, offset, len: length, flags: convert::fallocate_flags(mode) };
        let r = self.one("fallocate", op).and_then(|r| want_attr("fallocate", r));
        if let Ok(a) = &r {
            lock(&self.inodes).changed_here(a);
            self.attr_changed(a);
        }
        self.reply_empty(reply, r.map(|_| ()));
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: i64, _whence: i32, reply: ReplyLseek) {
        // ENOSYS once: the kernel then seeks itself (SEEK_DATA/SEEK_HOLE see one extent).
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // ENOSYS once: the kernel then copies through read and write.
        reply.error(Errno::ENOSYS);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        // Only fcntl tests locks (F_GETLK, F_OFD_GETLK): never the flock namespace.
        let Some(kind) = locks::kind_in(typ) else {
            return reply.error(Errno::EINVAL);
        };
        let op = Op::GetLock { ino: ino.0, owner: lock_owner.0, start, end: locks::end_in(end), kind, flock: false };
        match self.one("getlk", op) {
            Ok(Reply::Lock(None)) => reply.locked(start, end, libc::F_UNLCK, 0),
            Ok(Reply::Lock(Some(c))) => reply.locked(c.start, locks::end_out(c.end), locks::kind_out(c.kind), c.pid),
            Ok(r) => reply.error(self.fail(&unexpected("getlk", &r))),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(kind) = locks::kind_in(typ) else {
            return reply.error(Errno::EINVAL);
        };
        let call = locks::lock_call(req.pid());
        let (ino, fh, owner) = (ino.0, fh.0, lock_owner.0);
        let op = Op::SetLock { ino, owner, start, end: locks::end_in(end), kind, flock: call == LockCall::Flock, pid };
        let note = {
            let owners = self.lock_owners.clone();
            move || lock(&owners).note(ino, fh, owner, call)
        };
        if kind != p::LockKind::Unlock {
            // Before the request too: a close racing with it then unlocks rather than
            // leaving a lock nobody will drop.
            note();
        }
        match self.one("setlk", op.clone()).and_then(|r| want_done("setlk", r)) {
            Ok(()) => {
                if kind != p::LockKind::Unlock {
                    note();
                }
                reply.ok();
            }
            Err(e) if sleep && e.errno() == Errno::EAGAIN => {
                if let Err(e) = locks::wait_for_lock(Arc::downgrade(&self.client), op, req.pid(), reply, note) {
                    tracing::warn!("cannot start a lock waiter: {e}");
                }
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }
}
