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
//! - **writeback** (docs/protocol.md §4.1, §4.7): a create, unlink, rename or link among
//!   what this mount holds exclusively, and a write, setattr or xattr change of an inode
//!   it holds exclusively, is answered here
//!   — attributes computed as the server will compute them, at this mount's clock, which
//!   the request carries — and sent without waiting. The decision and the send happen
//!   under the cache lock, which the recall path also takes before answering, so every
//!   writeback request reaches the server before this mount gives the inode up. `flush`
//!   (close) and `fsync` wait for the inode's writeback and report its deferred failure.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crest_client::local::{Clock, NewNode, Writeback, ATIME};
use crest_client::rights::CacheRights;
use crest_client::{Cached, NameCache};
use crest_net::{Client, Completion};
use crest_proto::{self as p, acl, Op, Reply};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use crate::caller::{self, Caller};

mod answer;
mod local;
mod objects;
mod privs;
mod readahead;
mod recall;
pub(crate) mod status;
use crate::convert::{self, XattrAnswer};
use crate::dir::{DirStream, Entry, READDIR_BATCH};
use crate::error::Error;
use crate::inodes::Inodes;
use crate::locks::{self, LockCall, Owners};
use crate::options::Atime;
use answer::{nth, unexpected, want_attr, want_data, want_done};
pub use recall::{KernelAttrs, KernelEpoch};

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

/// The kernel's `__FMODE_EXEC` in the flags of an open to execute the file (execve's and
/// uselib's): it checks execute permission there, not read.
const FMODE_EXEC: i32 = 0o40;

/// What an open with `flags` may do (`p::OPEN_*`), as the kernel checked it: the server
/// checks it again, and lets the descriptor read or write whoever uses it later.
fn open_access(flags: i32) -> u32 {
    if flags & FMODE_EXEC != 0 {
        return p::OPEN_EXEC;
    }
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => p::OPEN_READ,
        libc::O_WRONLY => p::OPEN_WRITE,
        _ => p::OPEN_READ | p::OPEN_WRITE,
    }
}

/// What the kernel is told of a file it opened with open(2) `flags`. An `O_APPEND`
/// descriptor bypasses the page cache (FOPEN_DIRECT_IO): through the cache, the kernel
/// sends a write that starts inside a page it has not read in two requests, ending the
/// first at that page's end, and another client's append could land between the halves.
/// Direct, each write(2) is one request of up to `MAX_IO_BYTES`, appended whole at the
/// server's end of file.
fn open_reply_flags(flags: i32, keep_cache: bool, atime: Atime) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if flags & libc::O_APPEND != 0 {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    } else if keep_cache && atime != Atime::Strict {
        // (Under strictatime every read must reach the daemon, which moves the access time.)
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        f |= READ_ONLY_OPEN_FLAGS;
    }
    f
}
/// How long the kernel may cache entries and attributes this mount holds exclusively
/// (nobody else can change them; a recall invalidates them in the kernel before it is
/// answered). Everything else gets no kernel caching at all.
pub const HELD_TTL: Duration = Duration::from_secs(5);
/// Inode numbers asked of the server at a time for writeback creates.
pub const INODE_BATCH: u32 = 4096;
/// How long `flush` and `fsync` wait for an inode's writeback to be answered.
pub const WRITEBACK_WAIT: Duration = Duration::from_secs(120);
/// How often one directory may be asked for whole (`Op::Acquire`) by this mount.
const ACQUIRE_RETRY: Duration = Duration::from_secs(1);
/// Acquires of one directory sent back to back when each grant crossed a recall.
const ACQUIRE_ATTEMPTS: usize = 3;

type Results = Vec<Result<Reply, p::OpError>>;

/// A crest mount as the kernel sees it.
#[derive(Debug)]
pub struct CrestFs {
    client: Arc<Client>,
    /// What the kernel may cache entries and attributes for when nothing else says longer:
    /// nothing. The daemon's own cache (`names`) holds them under the server's recall
    /// protocol, where a recall never waits on a kernel lock (docs/protocol.md §4.3).
    ttl: Duration,
    next_fh: AtomicU64,
    /// The kernel's look-ups answered from `names`, and sent to the server (the cache's
    /// hit rate, for `crest status --mount`).
    lookups_cached: AtomicU64,
    lookups_sent: AtomicU64,
    inodes: Mutex<Inodes>,
    dirs: Mutex<HashMap<u64, DirStream>>,
    /// Names and attributes this mount may answer lookups from, and its writeback state
    /// (see crest-client).
    names: Arc<Mutex<NameCache>>,
    /// Signalled (with `names`) when a writeback request is answered.
    idle: Arc<Condvar>,
    /// Inode numbers reserved for this mount's writeback creates: next, end.
    /// Inode numbers reserved ahead (next, end) and the `NameCache::resets` they were
    /// granted under: a new session may use only its own.
    pool: Mutex<(u64, u64, u64)>,
    /// Lock owners that may hold locks on the server (see crate::locks).
    lock_owners: Arc<Mutex<Owners>>,
    /// Directories this mount last asked to hold whole (`Op::Acquire`), and when.
    acquire_tried: Mutex<HashMap<u64, Instant>>,
    /// Small files' data read ahead with their directory (`crate::prefetch`).
    prefetch: Arc<readahead::ReadAhead>,
    /// The thread that reads batches ahead behind reads (`None`: it could not start).
    behind: Option<readahead::Behind>,
    /// Reads and writes in progress here, by inode: the kernel holds page locks for them.
    page_io: Arc<PageIo>,
    /// Set when the kernel can drop every cached name at once without a lock: then it
    /// caches names under shared rights too (unless `shared_kernel_names` is off), and
    /// names under exclusive rights are dropped that way.
    kernel_epoch: Arc<KernelEpoch>,
    /// The kernel's cached attributes, dropped when this mount changes a mode the kernel
    /// hears nothing of (`privs.rs`).
    kernel_attrs: Arc<KernelAttrs>,
    /// `-o nokernelnames` turns it off: the kernel caches no names under shared rights.
    shared_kernel_names: bool,
    /// Whether the kernel enforces POSIX ACLs (FUSE_POSIX_ACL; `-o noacl` turns it off).
    posix_acls: bool,
    /// When a read changes the file's access time.
    atime: Atime,
    /// Transfers of file data in the data store's objects (`fs/objects.rs`).
    objects: objects::ObjectIo,
    /// What the mount's owner adds to its status.
    status_extra: status::StatusExtra,
}

/// `FUSE_NOTIFY_INC_EPOCH` (include/uapi/linux/fuse.h, protocol 7.44); it has no body.
const FUSE_NOTIFY_INC_EPOCH: i32 = 8;

/// Reads and writes this mount is serving, counted by inode. The kernel holds page locks
/// of the inode while it waits for them, and the server may park them behind a recall of
/// this mount, so a recall does not wait for the kernel to drop those pages (`PageDropper`).
#[derive(Debug, Default)]
struct PageIo(Mutex<HashMap<u64, usize>>);

impl PageIo {
    /// Counts a read or write of `ino` until the guard goes.
    fn begin(&self, ino: u64) -> PageIoGuard<'_> {
        *lock(&self.0).entry(ino).or_default() += 1;
        PageIoGuard { io: self, ino }
    }

    fn any(&self, inodes: &[u64]) -> bool {
        let busy = lock(&self.0);
        inodes.iter().any(|i| busy.contains_key(i))
    }
}

struct PageIoGuard<'a> {
    io: &'a PageIo,
    ino: u64,
}

impl Drop for PageIoGuard<'_> {
    fn drop(&mut self) {
        let mut busy = lock(&self.io.0);
        if let Some(n) = busy.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                busy.remove(&self.ino);
            }
        }
    }
}

fn now_time() -> p::Time {
    let d = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    p::Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// How long a recall's answer waits for the kernel to drop the recalled inodes' pages.
/// Dropping a dirty page of a shared mapping writes it back first, a round trip to the
/// server, which a flush recall's change waits for (`caps::FlushRecall`): 200 ms was too
/// short for that on a loaded machine (the e2e mapping check saw the write-back land
/// after the other mount's write). A drop that blocks longer is one a page lock holds.
const PAGE_DROP_WAIT: Duration = Duration::from_millis(1_000);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn name_of(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

/// Who creates, and the umask the server applies unless a default ACL rules instead.
fn cred(req: &Request, umask: u32) -> p::Cred {
    p::Cred { uid: req.uid(), gid: req.gid(), umask: umask & 0o777 }
}

impl CrestFs {
    /// Sets or removes an ACL (`op`) through the server, which may change the mode too:
    /// the inode's attributes come back in the same round trip. What the server keeps of
    /// the ACL (`kept`, from `acl::kept`) is known, so the xattrs this mount holds of an
    /// inode it created stay complete, and creates under a default ACL set here stay
    /// local. On a failure nothing of them is trusted.
    fn acl_change(
        &self,
        what: &'static str,
        ino: u64,
        op: Op,
        name: &[u8],
        kept: Option<Vec<u8>>,
    ) -> Result<(), Error> {
        let since = self.stamp();
        let r = self.many(what, vec![op, Op::GetAttr { ino }]).and_then(|mut r| {
            want_done(what, nth(what, &mut r, 0)?)?;
            want_attr(what, nth(what, &mut r, 1)?)
        });
        let mut c = lock(&self.names);
        match &r {
            Ok(a) => {
                match &kept {
                    Some(v) => _ = c.set_held_xattr(ino, name, v),
                    None => _ = c.remove_held_xattr(ino, name),
                }
                c.attr_changed_since(a, since);
            }
            Err(_) => {
                c.xattrs_changed(ino);
                c.attr_stale(ino);
            }
        }
        r.map(|_| ())
    }
}

impl CrestFs {
    /// A file system talking through `client`; the daemon trusts what it holds for at most
    /// `ttl` without hearing a recall (the kernel caches entries and attributes only as
    /// long as the daemon holds them, and entries under shared rights only once
    /// `KernelEpoch::attach` found the kernel able to drop them all at once).
    pub fn new(client: Client, ttl: Duration) -> CrestFs {
        let names = Arc::new(Mutex::new(NameCache::new(ttl)));
        client.set_rights(Arc::new(CacheRights { names: names.clone() }));
        client.set_interrupt_check(Box::new(caller::interrupted));
        client.set_caller_source(Box::new(caller::current));
        let op_timeout = client.op_timeout();
        let client = Arc::new(client);
        let prefetch = Arc::new(readahead::ReadAhead::default());
        let behind = readahead::Behind::spawn(&client, &names, &prefetch);
        let fs = CrestFs {
            client,
            ttl: Duration::ZERO,
            next_fh: AtomicU64::new(1),
            lookups_cached: AtomicU64::new(0),
            lookups_sent: AtomicU64::new(0),
            inodes: Mutex::new(Inodes::default()),
            dirs: Mutex::new(HashMap::new()),
            names,
            idle: Arc::new(Condvar::new()),
            pool: Mutex::new((0, 0, 0)),
            lock_owners: Arc::new(Mutex::new(Owners::default())),
            acquire_tried: Mutex::new(HashMap::new()),
            prefetch,
            behind,
            page_io: Arc::default(),
            kernel_epoch: Arc::default(),
            kernel_attrs: Arc::default(),
            shared_kernel_names: true,
            posix_acls: true,
            atime: Atime::Relative,
            objects: objects::ObjectIo::new(op_timeout),
            status_extra: status::StatusExtra::default(),
        };
        fs.probe_objects();
        fs
    }

    /// What the status shows beside the mount's own fields.
    pub fn with_status_extra(mut self, extra: status::StatusExtra) -> CrestFs {
        self.status_extra = extra;
        self
    }

    /// When reads change access times (the mount's atime options); relatime by default.
    pub fn with_atime(mut self, mode: Atime) -> CrestFs {
        self.atime = mode;
        self
    }

    /// Whether the kernel enforces POSIX ACLs (on by default).
    pub fn with_posix_acls(mut self, on: bool) -> CrestFs {
        self.posix_acls = on;
        self
    }

    /// Whether the kernel may cache names held under shared rights (where it can drop
    /// them all at once); on by default.
    pub fn with_shared_kernel_names(mut self, on: bool) -> CrestFs {
        self.shared_kernel_names = on;
        self
    }

    /// The kernel name-cache epoch of this mount, to attach to its session's device.
    pub fn kernel_epoch(&self) -> Arc<KernelEpoch> {
        self.kernel_epoch.clone()
    }

    /// Where this mount drops the kernel's cached attributes, to attach to its session.
    pub fn kernel_attrs(&self) -> Arc<KernelAttrs> {
        self.kernel_attrs.clone()
    }

    /// Opens a regular file without waiting when its attributes are held (under a right:
    /// a change elsewhere would have recalled them), so whether the kernel may keep its
    /// pages is known here. The `Open` — which keeps an unlinked file alive on the
    /// server — follows on the connection ahead of this file's reads and writes, and a
    /// failure is reported at close. Returns keep-cache, or `None` to open synchronously.
    /// The kernel looks up "." (an inode by number) and ".." (a directory's parent) only
    /// to decode a file handle it did not find in its cache (EXPORT_SUPPORT): asked of the
    /// server, cached nowhere (neither is an entry). A handle whose inode is gone gets
    /// ENOENT here, which the kernel turns into ESTALE, as it does a generation that
    /// differs (a number used again).
    fn lookup_for_handle(&self, ino: u64, name: &OsStr, reply: ReplyEntry) {
        let since = self.stamp();
        let r = self.one("lookup", Op::Lookup { parent: ino, name: name_of(name) }).and_then(|r| match r {
            Reply::Lookup { attr: Some(a), .. } => Ok(a),
            Reply::Lookup { attr: None, .. } => {
                Err(Error::server("lookup", p::OpError { errno: libc::ENOENT, message: "gone".into() }))
            }
            r => Err(unexpected("lookup", &r)),
        });
        match r {
            Ok(a) => {
                self.attr_changed(&a, since);
                reply.entry(&Duration::ZERO, &convert::file_attr(&a), Generation(a.generation));
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    /// A read of `ino` reached the daemon: its access time moves to now when the mount's
    /// rule says so (`Atime`), without a round trip. The change time stays (an access
    /// changes no state), so the operation names it. Reads the kernel answers from its
    /// page cache do not get here; under `strictatime` opens do not keep that cache.
    fn accessed(&self, ino: u64) {
        if self.atime == Atime::Never {
            return;
        }
        let strict = self.atime == Atime::Strict;
        let clock = Self::clock();
        if !lock(&self.names).atime_due(ino, strict, clock) {
            return;
        }
        let permit = self.client.async_permit(0);
        let mut c = lock(&self.names);
        match c.accessed_here(ino, strict, clock) {
            None => {}
            Some(Ok((a, wb))) => {
                self.send_writeback(permit, wb, clock.time);
                drop(c);
                lock(&self.inodes).changed_here(&a);
            }
            // Held shared (or not at all): the server's answer recalls the other holders.
            Some(Err(op)) => {
                drop(c);
                drop(permit);
                self.send_behind(ATIME, ino, op);
            }
        }
    }

    /// A new handle; `ships` marks it as one whose close hands the held writeback to the
    /// connection (`flush`): every handle that may write, and every one a create made.
    fn fh(&self, ships: bool) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed) << 1 | u64::from(ships))
    }

    /// Whether closing `fh` ships held writeback (`fh`).
    fn ships_at_close(fh: FileHandle) -> bool {
        fh.0 & 1 != 0
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

    fn create_node(
        &self,
        cred: p::Cred,
        parent: INodeNo,
        name: &OsStr,
        kind: p::FileType,
        mode: u32,
        rdev: u64,
    ) -> Result<p::Attr, Error> {
        if let Some(a) = self.create_locally(cred, parent.0, name.as_bytes(), kind, mode, rdev, None, None) {
            return Ok(a);
        }
        if self.acquire(parent.0) {
            if let Some(a) = self.create_locally(cred, parent.0, name.as_bytes(), kind, mode, rdev, None, None) {
                return Ok(a);
            }
        }
        let op = Op::Create { parent: parent.0, name: name_of(name), kind, mode, rdev, cred };
        let sent = Instant::now();
        let a = self.one("create", op).and_then(|r| want_attr("create", r))?;
        self.created(parent.0, name.as_bytes(), &a, sent);
        Ok(a)
    }

    /// Records an inode this mount just made, named `name` in `parent`, by a request
    /// sent at `sent`.
    fn created(&self, parent: u64, name: &[u8], a: &p::Attr, sent: Instant) {
        lock(&self.names).created_by_reply(parent, name, a, sent, Instant::now());
    }

    /// Removes a name through the server (`op`: an unlink or an rmdir), looking it up in
    /// the same request: what it named loses its attributes here even when the name was
    /// not held (`NameCache::unlinked`; a descriptor may still reach it).
    fn remove_on_server(&self, what: &'static str, parent: u64, name: &OsStr, op: Op) -> Result<(), Error> {
        let lookup = Op::Lookup { parent, name: name_of(name) };
        let mut r = self.many(what, vec![lookup, op])?;
        let victim = match nth(what, &mut r, 0) {
            Ok(Reply::Lookup { attr, .. }) => attr.map(|a| a.ino),
            _ => None,
        };
        want_done(what, nth(what, &mut r, 1)?)?;
        lock(&self.names).unlinked(parent, name.as_bytes(), victim);
        Ok(())
    }

    /// Records attributes from the reply to a request sent at stamp `since` (`stamp`).
    fn attr_changed(&self, a: &p::Attr, since: u64) {
        lock(&self.names).attr_changed_since(a, since);
    }

    /// The cache's stamp, taken before a request whose reply carries attributes: what the
    /// cache takes in meanwhile may be newer than that reply (`attr_changed`).
    fn stamp(&self) -> u64 {
        lock(&self.names).stamp()
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
        let fetch = |from: u64| -> Result<(Vec<p::DirItem>, bool, u64), Error> {
            let epoch = lock(&self.names).epoch();
            match self.one("readdir", Op::ReadDir { ino, from_index: from, limit: READDIR_BATCH })? {
                Reply::Dir { items, end, next_index } => {
                    let mut t = lock(&self.inodes);
                    for i in &items {
                        t.learn(ino, &i.attr);
                    }
                    drop(t);
                    self.prefetch.state().listed(ino, &items, from == 0);
                    if from == 0 && end {
                        // The whole directory in one reply: every lookup in it can be answered here.
                        lock(&self.names).absorb_listing(ino, &items, epoch, Instant::now());
                    }
                    Ok((items, end, next_index))
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
        // Wanted: big requests, readdirplus for every listing, lookups and readdirs in one
        // directory in parallel, symlink targets cached (they never change). Readdirplus
        // always (not READDIRPLUS_AUTO): a listing's leaf carries every entry's attributes
        // anyway, and the kernel's heuristic turns it off after the first batch when the
        // lister has not looked anything up yet — as `rm -rf`, `find` and `tar` do, which
        // read a whole directory first and then pay a LOOKUP per entry (20,000 in one
        // directory: rm -rf 1.47 s with the heuristic, 1.03 s without; a bare `ls -f`
        // costs ~1.5 us more per entry).
        // Locks are the server's, so they hold across clients (POSIX_LOCKS, FLOCK_LOCKS).
        // Deliberately absent: WRITEBACK_CACHE (several clients will share files; data is
        // buffered by the daemon), ATOMIC_O_TRUNC (with it the kernel skips the truncating
        // setattr of open(O_TRUNC) and with it the clearing of set-user-ID bits; without it
        // the kernel sends that setattr itself).
        let wanted = [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // With attributes never cached in the kernel, every read revalidates them
            // and drops pages another client's write made stale.
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_FLOCK_LOCKS,
            // O_APPEND descriptors are direct (`open_reply_flags`) and may still be mapped.
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
            // File handles (name_to_handle_at, NFS export) hold the inode number and
            // generation, both the server's: valid on every mount and after a remount
            // (`lookup_for_handle`).
            InitFlags::FUSE_EXPORT_SUPPORT,
            // This daemon takes setuid, setgid and file capabilities away on a write,
            // truncate, fallocate or chown (`privs`), so the kernel stops asking for
            // security.capability before every write (SB_NOSEC).
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ];
        // The kernel enforces POSIX ACLs; the server keeps them with the mode. The umask
        // comes apart from the mode (DONT_MASK), because a parent's default ACL replaces
        // it (`acl::inherit`). Without them the kernel applies the umask itself.
        let acls = self.posix_acls.then_some(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK);
        for f in wanted.into_iter().chain(acls) {
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

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if name == "." || name == ".." {
            return self.lookup_for_handle(parent.0, name, reply);
        }
        let (held, epoch) = {
            let c = lock(&self.names);
            (c.lookup(parent.0, name.as_bytes(), Instant::now()), c.epoch())
        };
        let counter = if held.is_some() { &self.lookups_cached } else { &self.lookups_sent };
        counter.fetch_add(1, Ordering::Relaxed);
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
            Ok(None) => {
                let (entry_ttl, _) = self.kernel_ttls(parent.0, name.as_bytes(), 0);
                let absent = convert::placeholder_attr(0, FileType::RegularFile);
                reply.entry_with_ttls(&self.ttl, &entry_ttl, &absent, Generation(0))
            }
            Ok(Some(a)) => self.reply_entry(reply, parent.0, name.as_bytes(), Ok(a)),
            Err(e) => self.reply_entry(reply, parent.0, name.as_bytes(), Err(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // The kernel sends forget when it evicts the inode, with its whole lookup count.
        lock(&self.inodes).forget(ino.0);
        self.prefetch.state().forget(ino.0);
        self.forget_window(ino.0);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // (Bound first: the cache guard must be gone before the reply locks it again.)
        let held = lock(&self.names).attr(ino.0, Instant::now());
        if let Some(a) = held {
            return self.reply_attr(reply, Ok(a));
        }
        let epoch = lock(&self.names).epoch();
        let r = self.one("getattr", Op::GetAttr { ino: ino.0 });
        // `AttrOnly` (a directory other mounts are changing) grants nothing to hold: the
        // kernel gets it uncached too (`attr_ttl`: not held).
        let holds = matches!(r, Ok(Reply::Attr(_)));
        let r = r.and_then(|r| want_attr("getattr", r));
        if let (true, Ok(a)) = (holds, &r) {
            lock(&self.names).hold_attr(a, epoch, Instant::now());
        }
        self.reply_attr(reply, r);
    }

    fn setattr(
        &self,
        req: &Request,
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
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let mut set = p::SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size_bytes: size,
            atime: atime.map(convert::set_time),
            mtime: mtime.map(convert::set_time),
            ctime: ctime.map(convert::setattr_time),
        };
        let r = self.setattr_privs(req.pid(), ino.0, &mut set).and_then(|()| self.set_attr(ino.0, set));
        self.reply_attr(reply, r);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        match self.one("readlink", Op::ReadLink { ino: ino.0 }).and_then(|r| want_data("readlink", r)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let Some(kind) = convert::kind_from_mode(mode) else {
            let e =
                Error::Invalid { op: "mknod", why: format!("mode {mode:#o} is not a file, device, fifo or socket") };
            return reply.error(self.fail(&e));
        };
        let r = self.create_node(cred(req, umask), parent, name, kind, convert::create_mode(mode), u64::from(rdev));
        self.reply_entry(reply, parent.0, name.as_bytes(), r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let kind = p::FileType::Directory;
        let r = self.create_node(cred(req, umask), parent, name, kind, convert::create_mode(mode), 0);
        self.reply_entry(reply, parent.0, name.as_bytes(), r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if self.remove_locally(parent.0, name.as_bytes(), false)
            || (self.acquire(parent.0) && self.remove_locally(parent.0, name.as_bytes(), false))
        {
            return reply.ok();
        }
        let r = self.remove_on_server("unlink", parent.0, name, Op::Unlink { parent: parent.0, name: name_of(name) });
        self.reply_empty(reply, r);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if self.remove_locally(parent.0, name.as_bytes(), true)
            || (self.acquire(parent.0) && self.remove_locally(parent.0, name.as_bytes(), true))
        {
            return reply.ok();
        }
        let r = self.remove_on_server("rmdir", parent.0, name, Op::Rmdir { parent: parent.0, name: name_of(name) });
        self.reply_empty(reply, r);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let target_bytes = target.as_os_str().as_bytes();
        if !target_bytes.is_empty() && target_bytes.len() < 4096 {
            let (name, kind) = (link_name.as_bytes(), p::FileType::Symlink);
            if let Some(a) = self.create_locally(cred(req, 0), parent.0, name, kind, 0o777, 0, Some(target_bytes), None)
            {
                return self.reply_entry(reply, parent.0, name, Ok(a));
            }
        }
        let op = Op::Symlink {
            parent: parent.0,
            name: name_of(link_name),
            target: name_of(target.as_os_str()),
            cred: cred(req, 0),
        };
        let sent = Instant::now();
        let r = self.one("symlink", op).and_then(|r| want_attr("symlink", r));
        if let Ok(a) = &r {
            self.created(parent.0, link_name.as_bytes(), a, sent);
        }
        self.reply_entry(reply, parent.0, link_name.as_bytes(), r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let Some(wire_flags) = convert::rename_flags(flags.bits()) else {
            let e = Error::Invalid {
                op: "rename",
                why: format!("flags {:#x} (unknown, or whiteout with exchange)", flags.bits()),
            };
            return reply.error(self.fail(&e));
        };
        if self.rename_locally(parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), wire_flags) {
            return reply.ok();
        }
        // Look the names up in the same request: first what the new name named before (a
        // replaced file a descriptor may still reach), then after the rename the moved
        // names (a directory that moved needs its new parent for "..").
        let mut ops = vec![
            Op::Lookup { parent: newparent.0, name: name_of(newname) },
            Op::Rename {
                parent: parent.0,
                name: name_of(name),
                new_parent: newparent.0,
                new_name: name_of(newname),
                flags: wire_flags,
            },
            Op::Lookup { parent: newparent.0, name: name_of(newname) },
        ];
        if wire_flags & (p::RENAME_EXCHANGE | p::RENAME_WHITEOUT) != 0 {
            // The old name now names the other inode, or a whiteout.
            ops.push(Op::Lookup { parent: parent.0, name: name_of(name) });
        }
        let sent = Instant::now();
        let r = self.many("rename", ops).and_then(|mut res| {
            let replaced = match nth("rename", &mut res, 0) {
                Ok(Reply::Lookup { attr: Some(a), .. }) if wire_flags & p::RENAME_EXCHANGE == 0 => Some(a.ino),
                _ => None,
            };
            want_done("rename", nth("rename", &mut res, 1)?)?;
            let mut c = lock(&self.names);
            // The kernel moved (or swapped) its entries, long timeouts included.
            if wire_flags & p::RENAME_EXCHANGE != 0 {
                c.kernel_entry_dropped(parent.0, name.as_bytes());
                c.kernel_entry_dropped(newparent.0, newname.as_bytes());
            } else {
                c.kernel_entry_moved(parent.0, name.as_bytes(), newparent.0, newname.as_bytes());
            }
            // The moved inode, now at the new name: its ctime changed.
            let moved = match res.get(2) {
                Some(Ok(Reply::Lookup { attr: Some(a), .. })) if wire_flags & p::RENAME_EXCHANGE == 0 => Some(a.ino),
                _ => None,
            };
            c.unlinked(parent.0, name.as_bytes(), moved);
            c.unlinked(newparent.0, newname.as_bytes(), replaced);
            let mut t = lock(&self.inodes);
            for (i, dir, n) in [(2, newparent.0, newname), (3, parent.0, name)] {
                if let Ok(a) = nth("rename", &mut res, i).and_then(|r| want_attr("rename", r)) {
                    t.learn(dir, &a);
                    c.added_by_reply(dir, n.as_bytes(), &a, sent, Instant::now());
                }
            }
            Ok(())
        });
        self.reply_empty(reply, r);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if let Some(a) = self.link_locally(ino.0, newparent.0, newname.as_bytes()) {
            return self.reply_entry(reply, newparent.0, newname.as_bytes(), Ok(a));
        }
        let op = Op::Link { ino: ino.0, parent: newparent.0, name: name_of(newname) };
        let sent = Instant::now();
        let r = self.one("link", op).and_then(|r| want_attr("link", r));
        if let Ok(a) = &r {
            // (A new name of an inode that may have extended attributes: what is held of
            // them stays as it was.)
            lock(&self.names).added_by_reply(newparent.0, newname.as_bytes(), a, sent, Instant::now());
        }
        self.reply_entry(reply, newparent.0, newname.as_bytes(), r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // O_TRUNC never arrives here (no ATOMIC_O_TRUNC: the kernel truncates by setattr);
        // O_DIRECT needs nothing: the kernel sends such I/O straight through.
        let access = open_access(flags.0);
        let fh = self.fh(access & p::OPEN_WRITE != 0);
        if let Some(keep) = self.open_locally(ino.0, fh, access) {
            return reply.opened(fh, open_reply_flags(flags.0, keep, self.atime));
        }
        let since = self.stamp();
        match self.one("open", Op::Open { ino: ino.0, handle: fh.0, access }).and_then(|r| want_attr("open", r)) {
            Ok(a) => {
                self.attr_changed(&a, since);
                let keep = lock(&self.inodes).keep_cache_on_open(&a);
                reply.opened(fh, open_reply_flags(flags.0, keep, self.atime));
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let op = Op::Read { ino: ino.0, offset, len: size.min(MAX_IO_BYTES) };
        let io = self.page_io.begin(ino.0);
        if let Some(d) = self.read_kept(ino.0, offset, size) {
            drop(io);
            self.accessed(ino.0);
            return reply.data(&d);
        }
        let r = match self.read_through_window(ino.0, offset, size.min(MAX_IO_BYTES)) {
            Some(r) => r,
            None => self.read_at_server(ino.0, op),
        };
        // Not counted once answered: the kernel unlocks the pages as it takes the answer,
        // and the reader may go on at once to what a recall must not pass by.
        drop(io);
        match r {
            Ok(d) => {
                self.accessed(ino.0);
                reply.data(&d)
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let Ok(len) = u32::try_from(data.len()) else {
            return reply.error(Errno::EFBIG);
        };
        // (Pages of a shared mapping written back: the kernel took no privileges for them.)
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        if !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            if let Err(e) = self.remove_privs(req.pid(), ino.0, kill) {
                return reply.error(self.fail(&e));
            }
        }
        let io = self.page_io.begin(ino.0);
        // O_APPEND: the kernel picked the offset from its idea of the size, which another
        // client's append may have outdated; the server appends at the real end, or, under
        // exclusive rights, this mount at the end it holds.
        let append = flags.0 & libc::O_APPEND != 0;
        // A big write in order goes to an object of the data store (`fs/objects.rs`).
        if !append && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) && self.wants_object(offset, data.len()) {
            if let Some(r) = self.write_object(ino.0, offset, data) {
                drop(io);
                return match r {
                    Ok(_) => reply.written(len),
                    Err(e) => reply.error(self.fail(&e)),
                };
            }
        }
        if self.change_locally(ino.0, data.len(), |c, clock| c.write_here(ino.0, offset, data, append, clock)).is_some()
        {
            drop(io);
            return reply.written(len);
        }
        let op = if append {
            Op::Append { ino: ino.0, data: data.to_vec() }
        } else if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            // Pages the kernel cached (a shared mapping's), written back: during a recall,
            // part of its answer (`Op::WriteBack`).
            Op::WriteBack { ino: ino.0, offset, data: data.to_vec() }
        } else {
            Op::Write { ino: ino.0, offset, data: data.to_vec() }
        };
        let since = self.stamp();
        let r = self.one("write", op).and_then(|r| want_attr("write", r));
        drop(io);
        match r {
            Ok(a) => {
                lock(&self.inodes).changed_here(&a);
                self.attr_changed(&a, since);
                reply.written(len);
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // Synchronous writes are on the server when acknowledged. Writeback ones are not
        // waited for — a local disk's close does not wait for its write-back either, and
        // waiting costs a round trip per file written — but shipped now, and a failure of
        // them that has already come back is reported here; a later one, by the next
        // fsync or close of the file. Pages dirtied through a shared mapping were written
        // back by the kernel before it sent this. A process's POSIX locks end at each of
        // its closes. A read-only descriptor wrote nothing to ship: what is held (its own
        // open and access time among it) goes within `HELD_FOR`, with its release, and an
        // open and its release in one batch never reach the server (`cancel_open`).
        if let Err(e) = self.unlock_at_close(ino.0, lock_owner.0) {
            return reply.error(self.fail(&e));
        }
        if Self::ships_at_close(fh) {
            self.client.flush_writeback();
        }
        let r = match lock(&self.names).take_error(ino.0) {
            Some(e) => Err(Error::server("flush", e)),
            None => Ok(()),
        };
        self.reply_empty(reply, r);
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
        // Nothing waits for a release (the kernel has closed the file): it follows the
        // file's writeback on the connection without a round trip.
        self.send_behind("release", ino.0, Op::Release { ino: ino.0, handle: fh.0 });
        reply.ok();
    }

    fn fsync(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let r = self.one("fsync", Op::Fsync { ino: ino.0 }).and_then(|r| want_done("fsync", r));
        let r = r.and_then(|()| self.settle("fsync", ino.0));
        self.reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The server learns of the open without a round trip: a directory removed while
        // open stays (empty, nlink 0) until its last close, as fstat on it expects.
        let fh = self.fh(false);
        // (Reading it is checked by each readdir: the open asks for nothing.)
        self.send_behind("opendir", ino.0, Op::Open { ino: ino.0, handle: fh.0, access: 0 });
        reply.opened(fh, FopenFlags::empty());
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
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

    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
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
            // (One timeout for the entry and its attributes: the shorter of what a
            // lookup's reply would give them.)
            Entry::Item(i) => {
                let (entry, attr) = self.kernel_ttls(ino.0, &i.name, i.attr.ino);
                reply.add(
                    INodeNo(i.attr.ino),
                    convert::entry_offset(i.index),
                    OsStr::from_bytes(&i.name),
                    &entry.min(attr),
                    &convert::file_attr(&i.attr),
                    Generation(i.attr.generation),
                )
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn releasedir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        lock(&self.dirs).remove(&fh.0);
        self.send_behind("releasedir", ino.0, Op::Release { ino: ino.0, handle: fh.0 });
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let r = self.one("fsyncdir", Op::Fsync { ino: ino.0 }).and_then(|r| want_done("fsyncdir", r));
        let r = r.and_then(|()| self.settle("fsyncdir", ino.0));
        self.reply_empty(reply, r);
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
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
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let mut flags = convert::xattr_flags(flags);
        if name.as_bytes() == acl::ACCESS && self.caller_drops_sgid(req.pid(), ino.0) {
            flags |= p::XATTR_ACL_KILL_SGID;
        }
        match self.xattr_locally(ino.0, name.as_bytes(), Some(value), flags) {
            Some(Ok(())) => return reply.ok(),
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
        let op = Op::SetXattr { ino: ino.0, name: name_of(name), value: value.to_vec(), flags };
        if acl::flag_of(name.as_bytes()) != 0 {
            let kept = acl::kept(name.as_bytes(), value).unwrap_or(None);
            return self.reply_empty(reply, self.acl_change("setxattr", ino.0, op, name.as_bytes(), kept));
        }
        lock(&self.names).xattrs_changed(ino.0);
        let r = self.one("setxattr", op).and_then(|r| want_done("setxattr", r));
        lock(&self.names).attr_stale(ino.0);
        self.reply_empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if ino.0 == crate::inodes::ROOT_INO && name.as_bytes() == status::STATUS_XATTR {
            return self.reply_xattr(reply, size, Ok(self.status_json()));
        }
        // (Bound first: the cache guard must be gone before the reply.)
        let held = {
            let c = lock(&self.names);
            c.held_xattrs(ino.0).map(|m| m.get(name.as_bytes()).cloned()).or_else(|| {
                // The kernel asks for ACLs before its permission checks: an inode whose
                // attributes this mount holds says whether it has one.
                let flag = acl::flag_of(name.as_bytes());
                let a = c.attr(ino.0, Instant::now()).filter(|_| flag != 0)?;
                (a.flags & flag == 0).then_some(None)
            })
        };
        match held {
            Some(Some(v)) => return self.reply_xattr(reply, size, Ok(v)),
            Some(None) => return reply.error(Errno::from_i32(libc::ENODATA)),
            None => {}
        }
        let r = self.one("getxattr", Op::GetXattr { ino: ino.0, name: name_of(name) });
        self.reply_xattr(reply, size, r.and_then(|r| want_data("getxattr", r)));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let held = lock(&self.names).held_xattrs(ino.0).map(|m| m.keys().cloned().collect::<Vec<_>>());
        if let Some(names) = held {
            return self.reply_xattr(reply, size, Ok(convert::xattr_list(&names)));
        }
        let r = self.one("listxattr", Op::ListXattr { ino: ino.0 }).and_then(|r| match r {
            Reply::Names(n) => Ok(convert::xattr_list(&n)),
            r => Err(unexpected("listxattr", &r)),
        });
        self.reply_xattr(reply, size, r);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        match self.xattr_locally(ino.0, name.as_bytes(), None, 0) {
            Some(Ok(())) => return reply.ok(),
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
        if acl::flag_of(name.as_bytes()) != 0 {
            let op = Op::RemoveXattr { ino: ino.0, name: name_of(name) };
            return self.reply_empty(reply, self.acl_change("removexattr", ino.0, op, name.as_bytes(), None));
        }
        self.reply_empty(reply, self.remove_xattr_on_server(ino.0, name_of(name)));
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
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        let kind = p::FileType::Regular;
        let mode = convert::create_mode(mode);
        let cred = cred(req, umask);
        let fh = self.fh(true);
        let access = open_access(flags);
        let local = || self.create_locally(cred, parent.0, name.as_bytes(), kind, mode, 0, None, Some((fh, access)));
        if let Some(a) = local().or_else(|| if self.acquire(parent.0) { local() } else { None }) {
            lock(&self.inodes).keep_cache_on_open(&a);
            let attr = convert::file_attr(&a);
            let (entry_ttl, attr_ttl) = self.kernel_ttls(parent.0, name.as_bytes(), a.ino);
            let ttl = entry_ttl.min(attr_ttl);
            return reply.created(
                &ttl,
                &attr,
                Generation(a.generation),
                fh,
                open_reply_flags(flags, false, self.atime),
            );
        }
        // Through the server: one request when the file can have a number from this
        // mount's range (the Open names it); else two calls, as Open names its inode, which
        // exists only once Create has answered. The kernel holds the directory locked in
        // between, so nothing can unlink the new name.
        let mut since = 0;
        let created = match self.create_open_on_server(cred, parent.0, name, mode, fh, access) {
            Some(r) => r.map(|(a, opened, stamp)| {
                since = stamp;
                (a, opened)
            }),
            None => self.create_node(cred, parent, name, kind, mode, 0).and_then(|a| {
                since = self.stamp();
                let opened = self
                    .one("create", Op::Open { ino: a.ino, handle: fh.0, access })
                    .and_then(|r| want_attr("create", r))?;
                Ok((a, opened))
            }),
        };
        match created {
            Ok((a, opened)) => {
                let mut t = lock(&self.inodes);
                t.learn(parent.0, &a);
                t.keep_cache_on_open(&opened);
                drop(t);
                self.attr_changed(&opened, since);
                let attr = convert::file_attr(&opened);
                reply.created(
                    &self.ttl,
                    &attr,
                    Generation(opened.generation),
                    fh,
                    open_reply_flags(flags, false, self.atime),
                );
            }
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn poll(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // ENOSYS once: the kernel then answers poll itself (always ready).
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        if let Err(e) = self.remove_privs(req.pid(), ino.0, true) {
            return reply.error(self.fail(&e));
        }
        let flags = convert::fallocate_flags(mode);
        let mut r = Ok(());
        for (offset, len) in p::fallocate_steps(offset, length, flags) {
            let since = self.stamp();
            let op = Op::Fallocate { ino: ino.0, offset, len, flags };
            match self.one("fallocate", op).and_then(|r| want_attr("fallocate", r)) {
                Ok(a) => {
                    lock(&self.inodes).changed_here(&a);
                    self.attr_changed(&a, since);
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.reply_empty(reply, r);
    }

    fn lseek(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: i64, _whence: i32, reply: ReplyLseek) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // ENOSYS once: the kernel then seeks itself (SEEK_DATA/SEEK_HOLE see one extent).
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        req: &Request,
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
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
        // ENOSYS once: the kernel then copies through read and write.
        reply.error(Errno::ENOSYS);
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
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
        let _caller = Caller::enter(req.pid(), req.uid(), req.gid());
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
