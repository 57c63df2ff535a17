//! Reads answered from data read ahead with a file's directory (`crate::prefetch`), and
//! the thread that reads the next batch of a directory behind the read that needed it.

use super::*;
use crate::prefetch::{Batch, Prefetch, Version, PENDING_WAIT};
use crest_net::ClientError;

/// The read-ahead state, and the signal that a batch read ahead came back.
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    state: Mutex<Prefetch>,
    landed: Condvar,
}

impl ReadAhead {
    /// The state (listings, kept data, what is pending).
    pub(crate) fn state(&self) -> MutexGuard<'_, Prefetch> {
        lock(&self.state)
    }
}

/// A batch to read ahead, with the caller whose read asked for it (the server checks the
/// batch's reads against that caller's credentials).
struct Job {
    files: Batch,
    pid: u32,
    uid: u32,
    gid: u32,
}

/// Where batches to read ahead go: a thread of the mount's own, which ends with the mount.
#[derive(Debug)]
pub(crate) struct Behind(mpsc::Sender<Job>);

impl Behind {
    /// Starts the thread; `None` if it cannot be (then nothing is read ahead behind reads,
    /// and reads that go to the server bring only `NOW_FILES` with them).
    pub(crate) fn spawn(client: &Arc<Client>, names: &Arc<Mutex<NameCache>>, ahead: &Arc<ReadAhead>) -> Option<Behind> {
        let (tx, rx) = mpsc::channel::<Job>();
        // Weak: the thread must not keep the client (and its connection) alive once the
        // mount has gone; the sender going with the mount ends it.
        let client = Arc::downgrade(client);
        let (names, ahead) = (names.clone(), ahead.clone());
        let spawned = std::thread::Builder::new().name("crest-readahead".into()).spawn(move || {
            for job in rx {
                let Some(client) = client.upgrade() else { return };
                let _caller = Caller::enter(job.pid, job.uid, job.gid);
                if let Err(e) = read_with(&client, &names, &ahead, None, &job.files) {
                    tracing::debug!("read ahead of {} files: {e}", job.files.len());
                }
                ahead.state().landed(&job.files);
                ahead.landed.notify_all();
            }
        });
        match spawned {
            Ok(_) => Some(Behind(tx)),
            Err(e) => {
                tracing::warn!("no read-ahead thread: {e}");
                None
            }
        }
    }

    fn send(&self, ahead: &ReadAhead, files: Batch) {
        if files.is_empty() {
            return;
        }
        let (pid, uid, gid) = caller::serving();
        if let Err(mpsc::SendError(job)) = self.0.send(Job { files, pid, uid, gid }) {
            ahead.state().landed(&job.files);
            ahead.landed.notify_all();
        }
    }
}

/// Runs `first` (a read the kernel asked for), if any, together with a `GetAttr` and a
/// `Read` of each of `files` (as large as it was listed: a file that grew since is not
/// kept, its data not being the whole of its version) and a `Lookup` of some of their
/// names (`Prefetch::lookups_for`), keeping what comes back with its version and holding
/// attributes and names as a getattr's and a lookup's are; returns `first`'s result.
fn read_with(
    client: &Client,
    names: &Mutex<NameCache>,
    ahead: &ReadAhead,
    first: Option<Op>,
    files: &[(u64, u64)],
) -> Result<Results, ClientError> {
    let lookups = ahead.state().lookups_for(files);
    let epoch = lock(names).epoch();
    let n = usize::from(first.is_some());
    let mut ops = Vec::with_capacity(n + 2 * files.len() + lookups.len());
    ops.extend(first);
    for &(f, size) in files {
        let len = size.min(crate::prefetch::MAX_FILE_BYTES) as u32;
        ops.push(Op::GetAttr { ino: f });
        ops.push(Op::Read { ino: f, offset: 0, len });
    }
    for (dir, name) in &lookups {
        ops.push(Op::Lookup { parent: *dir, name: name.clone() });
    }
    let mut results = client.call(ops)?;
    let rest = results.split_off(n.min(results.len()));
    let now = Instant::now();
    let mut rest = rest.into_iter();
    for &(f, _) in files {
        if let (Some(Ok(Reply::Attr(a))), Some(Ok(Reply::Data(d)))) = (rest.next(), rest.next()) {
            if a.ino == f && a.kind == p::FileType::Regular {
                lock(names).hold_attr(&a, epoch, now);
                ahead.state().keep(f, Version::of(&a), d);
            }
        }
    }
    for (dir, _) in lookups {
        if let Some(Ok(Reply::Lookup { leaf, .. })) = rest.next() {
            lock(names).absorb_leaf(dir, &leaf, epoch, now);
        }
    }
    Ok(results)
}

impl CrestFs {
    /// A read answered from kept data, if the file is still the version it was read at;
    /// waits (at most `PENDING_WAIT`) for a batch read ahead that brings the file.
    pub(super) fn read_kept(&self, ino: u64, offset: u64, size: u32) -> Option<Vec<u8>> {
        {
            let deadline = Instant::now() + PENDING_WAIT;
            let mut p = self.prefetch.state();
            while p.pending(ino) {
                let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
                p = self.prefetch.landed.wait_timeout(p, left).unwrap_or_else(|e| e.into_inner()).0;
            }
            if !p.has(ino) {
                return None;
            }
        }
        let now = lock(&self.names).attr(ino, Instant::now()).map(|a| Version::of(&a));
        let (data, next) = {
            let mut p = self.prefetch.state();
            let data = p.read(ino, now, offset, size)?;
            (data, p.hit(ino))
        };
        if let Some(behind) = &self.behind {
            behind.send(&self.prefetch, next);
        }
        Some(data)
    }

    /// Runs `read` (of `ino`) at the server, with the next few small files of its
    /// directory read in the same request, and the batch after them read behind it.
    pub(super) fn read_at_server(&self, ino: u64, read: Op) -> Result<Vec<u8>, Error> {
        let (now, behind) = self.prefetch.state().batch_for(ino, self.behind.is_some());
        let r = if now.is_empty() {
            self.one("read", read.clone())
        } else {
            read_with(&self.client, &self.names, &self.prefetch, Some(read.clone()), &now)
                .map_err(|source| Error::Client { op: "read", source })
                .and_then(|mut r| r.pop().ok_or_else(|| Error::Protocol { op: "read", got: "no result".into() }))
                .and_then(|r| r.map_err(|e| Error::server("read", e)))
        };
        // Sent after the read it follows: the server runs them in turn, and this one is
        // waited for.
        if let Some(b) = &self.behind {
            b.send(&self.prefetch, behind);
        }
        r.and_then(|r| self.read_answer(ino, &read, r))
    }
}
