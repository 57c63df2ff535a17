//! Sessions, the reply cache and the dispatch of operations to the store.

use std::collections::{HashMap, VecDeque};

use crest_proto::{self as p, Op, Reply};
use crest_store::{self as s, Store};

use crate::convert::{attr_out, error_out, kind_in, time_in};

/// Responses each session remembers for retries.
pub const REPLY_CACHE_ENTRIES: usize = 4096;
/// Neighbouring directory items a lookup reply carries.
pub const LOOKUP_NEIGHBOURS: usize = 32;
/// Most items one readdir reply carries.
pub const READDIR_MAX_ITEMS: u32 = 1024;

/// A session number.
pub type SessionId = u64;

#[derive(Debug, Default)]
struct Session {
    secret: u64,
    client_name: String,
    replies: HashMap<u64, p::Response>,
    order: VecDeque<u64>,
    /// Inodes this session holds open, with counts (released when the session ends).
    open: HashMap<u64, u32>,
}

/// The server core.
pub struct Server {
    store: Store,
    sessions: HashMap<SessionId, Session>,
    next_session: SessionId,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("sessions", &self.sessions.len()).finish()
    }
}

fn errno(errno: i32, message: impl Into<String>) -> p::OpError {
    p::OpError { errno, message: message.into() }
}

impl Server {
    /// A server over an opened store.
    pub fn new(store: Store) -> Server {
        Server { store, sessions: HashMap::new(), next_session: 1 }
    }

    /// The store (for shutdown and status).
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Hands the store back.
    pub fn into_store(self) -> Store {
        self.store
    }

    /// Answers a client's hello: a new session, or the resumed one when the token matches.
    pub fn handle_hello(&mut self, hello: &p::Hello) -> (Option<SessionId>, p::ServerMessage) {
        if let Err(reason) = p::check_hello(hello) {
            return (None, p::ServerMessage::Refused { reason, version: p::PROTOCOL_VERSION });
        }
        if let Some(t) = hello.resume {
            if self.sessions.get(&t.id).is_some_and(|s| s.secret == t.secret) {
                tracing::info!(session = t.id, client = %hello.client_name, "session resumed");
                return (Some(t.id), self.welcome(t.id, true));
            }
        }
        let id = self.next_session;
        self.next_session += 1;
        let secret = crest_rng::next_u64();
        self.sessions.insert(id, Session { secret, client_name: hello.client_name.clone(), ..Default::default() });
        tracing::info!(session = id, client = %hello.client_name, "session started");
        (Some(id), self.welcome(id, false))
    }

    fn welcome(&self, id: SessionId, resumed: bool) -> p::ServerMessage {
        let secret = self.sessions.get(&id).map_or(0, |s| s.secret);
        p::ServerMessage::Welcome(p::Welcome {
            version: p::PROTOCOL_VERSION,
            session: p::SessionToken { id, secret },
            resumed,
            fsid: self.store.fsid(),
        })
    }

    /// Ends a session cleanly: its open files are released.
    pub fn end_session(&mut self, id: SessionId) {
        if let Some(s) = self.sessions.remove(&id) {
            tracing::info!(session = id, client = %s.client_name, "session ended");
            for (ino, n) in s.open {
                for _ in 0..n {
                    if let Err(e) = self.store.release_handle(ino) {
                        tracing::warn!(ino, "release at session end: {e}");
                    }
                }
            }
        }
    }

    /// Applies a request for `session` at time `now` (or answers it from the reply cache).
    pub fn handle_request(&mut self, session: SessionId, req: p::Request, now: p::Time) -> p::Response {
        if let Some(r) = self.sessions.get(&session).and_then(|s| s.replies.get(&req.id)) {
            tracing::debug!(session, id = req.id, "answered from the reply cache");
            return r.clone();
        }
        let mutates = req.ops.iter().any(Op::is_mutation);
        let results = if req.ops.len() > p::MAX_OPS_PER_REQUEST {
            vec![Err(errno(7, format!("{} operations in one request (max {})", req.ops.len(), p::MAX_OPS_PER_REQUEST)))]
        } else {
            req.ops.into_iter().map(|op| self.apply(session, op, now)).collect()
        };
        let resp = p::Response { id: req.id, results };
        if mutates {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.replies.insert(resp.id, resp.clone());
                s.order.push_back(resp.id);
                while s.order.len() > REPLY_CACHE_ENTRIES {
                    if let Some(old) = s.order.pop_front() {
                        s.replies.remove(&old);
                    }
                }
            }
        }
        resp
    }

    /// Lets the store commit on its schedule.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), s::Error> {
        self.store.tick(now_ms)
    }

    fn dir_items(&mut self, dir: u64, from: u64, limit: usize) -> Result<Vec<p::DirItem>, s::Error> {
        Ok(self
            .store
            .readdir(dir, from, limit)?
            .into_iter()
            .map(|(e, i)| p::DirItem { name: e.name, index: e.index, attr: attr_out(&i) })
            .collect())
    }

    /// Fills in ownership of a new inode: a set-group-ID directory passes on its group
    /// (and, to subdirectories, the bit itself).
    fn new_owner(&mut self, parent: u64, cred: p::Cred, kind: s::FileKind, mode: u32) -> Result<(u32, u32), s::Error> {
        let dir = self.store.getattr(parent)?;
        if dir.mode & 0o2000 != 0 {
            let mode = if kind == s::FileKind::Directory { mode | 0o2000 } else { mode };
            return Ok((dir.gid, mode));
        }
        Ok((cred.gid, mode))
    }

    fn apply(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, p::OpError> {
        match self.apply_inner(session, op, now) {
            Ok(r) => Ok(r),
            Err(Failure::Wire(e)) => Err(e),
            Err(Failure::Store(e)) => {
                if e.is_corruption() || matches!(e, s::Error::Io { .. } | s::Error::Poisoned(_)) {
                    tracing::error!("{e}");
                }
                Err(error_out(&e))
            }
        }
    }

    fn apply_inner(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, Failure> {
        let now_s = time_in(now);
        let st = &mut self.store;
        match op {
            Op::Lookup { parent, name } => {
                let inode = st.lookup(parent, &name)?;
                Ok(Reply::Entry { attr: attr_out(&inode), neighbours: Vec::new() })
            }
            Op::GetAttr { ino } => Ok(Reply::Attr(attr_out(&st.getattr(ino)?))),
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
                Ok(Reply::Attr(attr_out(&st.setattr(ino, &sa, now_s)?)))
            }
            Op::ReadDir { ino, from_index, limit } => {
                let limit = limit.clamp(1, READDIR_MAX_ITEMS) as usize;
                let mut items = self.dir_items(ino, from_index, limit + 1)?;
                let end = items.len() <= limit;
                items.truncate(limit);
                Ok(Reply::Dir { items, end })
            }
            Op::Create { parent, name, kind, mode, rdev, cred } => {
                let kind = kind_in(kind);
                let (gid, mode) = self.new_owner(parent, cred, kind, mode)?;
                let inode = self.store.create(parent, &name, kind, mode, cred.uid, gid, rdev, now_s)?;
                Ok(Reply::Entry { attr: attr_out(&inode), neighbours: Vec::new() })
            }
            Op::Symlink { parent, name, target, cred } => {
                let (gid, _) = self.new_owner(parent, cred, s::FileKind::Symlink, 0)?;
                let inode = self.store.symlink(parent, &name, &target, cred.uid, gid, now_s)?;
                Ok(Reply::Entry { attr: attr_out(&inode), neighbours: Vec::new() })
            }
            Op::Link { ino, parent, name } => {
                let inode = st.link(ino, parent, &name, now_s)?;
                Ok(Reply::Entry { attr: attr_out(&inode), neighbours: Vec::new() })
            }
            Op::Unlink { parent, name } => Ok(st.unlink(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rmdir { parent, name } => Ok(st.rmdir(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rename { parent, name, new_parent, new_name, flags } => {
                if flags & !(p::RENAME_NOREPLACE | p::RENAME_EXCHANGE) != 0 {
                    return Err(Failure::Wire(errno(22, format!("unknown rename flags {flags:#x}"))));
                }
                let f = s::RenameFlags {
                    noreplace: flags & p::RENAME_NOREPLACE != 0,
                    exchange: flags & p::RENAME_EXCHANGE != 0,
                };
                Ok(st.rename(parent, &name, new_parent, &new_name, f, now_s).map(|()| Reply::Done)?)
            }
            Op::ReadLink { ino } => Ok(st.readlink(ino).map(Reply::Data)?),
            Op::Open { ino } => {
                let inode = st.open_handle(ino)?;
                if let Some(sess) = self.sessions.get_mut(&session) {
                    *sess.open.entry(ino).or_insert(0) += 1;
                }
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Op::Release { ino } => {
                if let Some(sess) = self.sessions.get_mut(&session) {
                    match sess.open.get_mut(&ino) {
                        Some(n) if *n > 1 => *n -= 1,
                        Some(_) => {
                            sess.open.remove(&ino);
                        }
                        None => return Ok(Reply::Done), // already released (a retry)
                    }
                }
                Ok(self.store.release_handle(ino).map(|()| Reply::Done)?)
            }
            Op::Read { ino, offset, len } => {
                Ok(st.read(ino, offset, u64::from(len.min(p::MAX_IO_BYTES))).map(Reply::Data)?)
            }
            Op::Write { ino, offset, data } => {
                if data.len() > p::MAX_IO_BYTES as usize {
                    return Err(Failure::Wire(errno(27, "write larger than the protocol allows")));
                }
                Ok(st.write(ino, offset, &data, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
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
            Op::StatFs => {
                let f = st.statfs();
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
            Op::SetXattr { ino, name, value, flags } => {
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
                Ok(st.setxattr(ino, &name, &value, now_s).map(|()| Reply::Done)?)
            }
            Op::GetXattr { ino, name } => Ok(st.getxattr(ino, &name).map(Reply::Data)?),
            Op::ListXattr { ino } => Ok(st.listxattr(ino).map(Reply::Names)?),
            Op::RemoveXattr { ino, name } => Ok(st.removexattr(ino, &name, now_s).map(|()| Reply::Done)?),
        }
    }
}

/// Why an operation failed: in the store, or refused here with an errno.
enum Failure {
    Store(s::Error),
    Wire(p::OpError),
}

impl From<s::Error> for Failure {
    fn from(e: s::Error) -> Failure {
        Failure::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crest_store::{MemDisk, MkfsOptions};

    fn server() -> Server {
        let disk = MemDisk::new(16 << 20);
        Store::mkfs(Box::new(disk.clone()), &MkfsOptions { now: s::Timespec::new(1, 0), fsid: None }).expect("mkfs");
        Server::new(Store::open(Box::new(disk)).expect("open"))
    }

    fn hello(resume: Option<p::SessionToken>) -> p::Hello {
        p::Hello { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, client_name: "test".into(), resume }
    }

    const NOW: p::Time = p::Time { sec: 5, nsec: 0 };

    #[test]
    fn retried_create_applies_once() {
        let mut srv = server();
        let (sid, w) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let token = match w {
            p::ServerMessage::Welcome(w) => w.session,
            other => panic!("{other:?}"),
        };
        let create = p::Request {
            id: 1,
            ops: vec![Op::Create {
                parent: 1,
                name: b"f".to_vec(),
                kind: p::FileType::Regular,
                mode: 0o644,
                rdev: 0,
                cred: p::Cred::default(),
            }],
        };
        let first = srv.handle_request(sid, create.clone(), NOW);
        assert!(first.results[0].is_ok());
        // The connection drops; the client resumes and retries the same id.
        let (sid2, w) = srv.handle_hello(&hello(Some(token)));
        assert!(matches!(w, p::ServerMessage::Welcome(p::Welcome { resumed: true, .. })));
        let again = srv.handle_request(sid2.expect("resumed"), create.clone(), NOW);
        assert_eq!(again, first, "the retry is answered from the cache, not re-applied (EEXIST)");
        // A new request id with the same op does run again (and fails: EEXIST).
        let fresh = srv.handle_request(sid, p::Request { id: 2, ..create }, NOW);
        assert_eq!(fresh.results[0].as_ref().err().map(|e| e.errno), Some(17));
    }

    #[test]
    fn wrong_version_and_bad_tokens() {
        let mut srv = server();
        let mut h = hello(None);
        h.version = 42;
        let (sid, msg) = srv.handle_hello(&h);
        assert!(sid.is_none());
        assert!(matches!(msg, p::ServerMessage::Refused { reason, .. } if reason.contains("42")));
        let (_, msg) = srv.handle_hello(&hello(Some(p::SessionToken { id: 1, secret: 0 })));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, .. })));
    }

    #[test]
    fn setgid_directories_pass_on_their_group() {
        let mut srv = server();
        let (sid, _) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let mk = |name: &str, kind, parent, uid, gid| Op::Create {
            parent,
            name: name.as_bytes().to_vec(),
            kind,
            mode: 0o755,
            rdev: 0,
            cred: p::Cred { uid, gid },
        };
        let r =
            srv.handle_request(sid, p::Request { id: 1, ops: vec![mk("d", p::FileType::Directory, 1, 0, 50)] }, NOW);
        let Ok(Reply::Entry { attr: d, .. }) = &r.results[0] else { panic!("{r:?}") };
        let set = p::SetAttr { mode: Some(0o2775), ..Default::default() };
        srv.handle_request(sid, p::Request { id: 2, ops: vec![Op::SetAttr { ino: d.ino, set }] }, NOW);
        let r = srv.handle_request(
            sid,
            p::Request {
                id: 3,
                ops: vec![mk("f", p::FileType::Regular, d.ino, 7, 7), mk("sub", p::FileType::Directory, d.ino, 7, 7)],
            },
            NOW,
        );
        let Ok(Reply::Entry { attr: f, .. }) = &r.results[0] else { panic!("{r:?}") };
        let Ok(Reply::Entry { attr: sub, .. }) = &r.results[1] else { panic!("{r:?}") };
        assert_eq!((f.gid, f.mode & 0o2000), (50, 0));
        assert_eq!((sub.gid, sub.mode & 0o2000), (50, 0o2000));
    }
}
