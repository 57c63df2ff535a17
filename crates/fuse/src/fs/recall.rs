//! What a recall does to the kernel: names and attributes the kernel cached are dropped
//! (all names at once by `KernelEpoch` where the kernel has FUSE_NOTIFY_INC_EPOCH), and
//! pages are dropped — dirty ones written back first — before the recall is answered.

use super::*;

/// The kernel's name-cache epoch (`FUSE_NOTIFY_INC_EPOCH`, Linux 6.16+): bumping it makes
/// every cached name be looked up again before its next use, without taking a directory
/// lock — so, unlike `FUSE_NOTIFY_INVAL_ENTRY`, a recall can do it before it is answered
/// whatever this mount's own requests hold (docs/protocol.md §4.3). A dentry carries the
/// epoch of its creation, taken before its LOOKUP is sent, so a reply racing a bump
/// cannot outlive it. Unsupported (an older kernel refuses the notice): names under
/// shared rights are not cached by the kernel at all, as before.
#[derive(Debug, Default)]
pub struct KernelEpoch {
    device: OnceLock<Mutex<std::fs::File>>,
}

impl KernelEpoch {
    /// Tries a first bump on the session's device; keeps a copy of it when the kernel takes
    /// it.
    pub fn attach(&self, device: std::os::fd::BorrowedFd<'_>) {
        let Ok(owned) = device.try_clone_to_owned() else { return };
        let file = std::fs::File::from(owned);
        if Self::send(&file) {
            let _ = self.device.set(Mutex::new(file));
        } else {
            tracing::info!("this kernel cannot drop every cached name at once: names are not cached by it");
        }
    }

    /// True when the kernel took the notice: names can be dropped all at once.
    pub fn enabled(&self) -> bool {
        self.device.get().is_some()
    }

    /// Makes the kernel look every cached name up again. False when it could not be told
    /// (the mount is going away).
    pub fn bump(&self) -> bool {
        self.device.get().is_some_and(|d| Self::send(&lock(d)))
    }

    fn send(mut file: &std::fs::File) -> bool {
        use std::io::Write;
        // struct fuse_out_header { u32 len; i32 error (the notice's code); u64 unique (0) }
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&16u32.to_le_bytes());
        header[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_le_bytes());
        match file.write(&header) {
            Ok(16) => true,
            Ok(n) => {
                tracing::warn!("epoch notice: the kernel took {n} of 16 bytes");
                false
            }
            Err(e) => {
                tracing::debug!("epoch notice refused: {e}");
                false
            }
        }
    }
}

/// Applies the server's recalls: drops the named inodes from the daemon's cache and the
/// kernel's (entries, attributes, pages), then acknowledges. Runs on its own thread, never
/// inside a request handler.
///
/// Pages go before the answer too, when they can: every kernel invalidation of an inode
/// bumps its attribute version, and a GETATTR whose reply comes back after a bump is
/// discarded — a read that asked for the size then runs on the size it had, so dropping
/// pages *after* answering let a reader miss a write the other client had completed (found
/// by the O_DIRECT check of tests/e2e/two_mounts.py under load). Dropping pages waits for
/// page locks, which a read or write of this mount may hold while the server parks it
/// behind this very recall (docs/protocol.md §4.3), so a page drop runs on a thread of its
/// own, and the answer waits for it only while no read or write of the inodes is in
/// progress here (`PageIo`), and then at most `PAGE_DROP_WAIT`.
#[derive(Debug)]
pub struct RecallWorker {
    /// Weak: the mount owns the client; when it goes, the client says goodbye, its
    /// recall stream ends and so does this worker.
    client: std::sync::Weak<Client>,
    names: Arc<Mutex<NameCache>>,
    page_io: Arc<PageIo>,
    kernel_epoch: Arc<KernelEpoch>,
}

impl RecallWorker {
    /// What the kernel caches and must now forget: names and attributes given up without
    /// a recall, or with the recall of `recalled`.
    fn invalidate_kernel_entries(&self, notifier: &fuser::Notifier, recalled: &[u64]) {
        let (names, inodes, epoch) = {
            let mut c = lock(&self.names);
            (c.take_kernel_invalidations(), c.take_kernel_attr_invalidations(), c.take_kernel_epoch(recalled))
        };
        // Names held exclusively go the same way when the kernel can drop them all at once:
        // one by one, each would wait for its directory's lock, which this mount's own
        // create there may hold while it waits on the server for this very recall (a
        // cycle only the lease broke: the holder was fenced after 10 s).
        let at_once = self.kernel_epoch.enabled() && (epoch || !names.is_empty());
        if at_once {
            if !self.kernel_epoch.bump() {
                tracing::warn!("the kernel could not be told to drop the names it caches");
            }
            invalidate_attributes(notifier, &inodes);
            return;
        }
        for (dir, name) in names {
            // ENOENT: the kernel no longer has the entry.
            if let Err(e) = notifier.inval_entry(INodeNo(dir), OsStr::from_bytes(&name)) {
                tracing::trace!(dir, "inval_entry: {e}");
            }
        }
        invalidate_attributes(notifier, &inodes);
    }

    /// Starts the worker thread; it ends when the client's recall stream does.
    pub fn spawn(self, notifier: fuser::Notifier) -> std::io::Result<()> {
        let Some(recalls) = self.client.upgrade().and_then(|c| c.take_recalls()) else {
            return Ok(());
        };
        let mut pages = PageDropper::spawn(notifier.clone())?;
        std::thread::Builder::new().name("crest-recall".into()).spawn(move || {
            loop {
                // Also wakes now and then for kernel entries given up without a recall
                // (a failed writeback, a server restart).
                let r = match recalls.recv_timeout(Duration::from_millis(100)) {
                    Ok(r) => r,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        self.invalidate_kernel_entries(&notifier, &[]);
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                };
                {
                    let mut names = lock(&self.names);
                    for &ino in &r.inodes {
                        names.recalled(ino);
                    }
                }
                // What the kernel was allowed to cache goes before the answer: names (all
                // at once with the epoch notice, which takes no lock; else one by one in
                // directories held exclusively, each waiting for its directory's lock,
                // which a create in flight may hold — the server's recall deadline bounds
                // that wait: docs/protocol.md §4.3) and attributes (no page lock taken).
                self.invalidate_kernel_entries(&notifier, &r.inodes);
                invalidate_attributes(&notifier, &r.inodes);
                let busy = self.page_io.any(&r.inodes);
                pages.drop_then_wait(r.inodes, !busy);
                match self.client.upgrade() {
                    Some(c) => c.recall_done(r.recall_id),
                    None => return,
                }
            }
        })?;
        Ok(())
    }
}

/// The kernel's cached attributes of an inode, dropped from inside a request handler: a
/// write's reply carries no attributes, so when this mount takes setuid or setgid away
/// for a write or fallocate, the kernel would go on with the mode it cached — exec and
/// its own check before the next write read that copy. Dropping attributes takes no page
/// or inode lock (offset −1), so a handler may do it before it replies.
#[derive(Debug, Default)]
pub struct KernelAttrs {
    notifier: OnceLock<fuser::Notifier>,
}

impl KernelAttrs {
    /// Keeps the session's notifier (before the session serves requests).
    pub fn attach(&self, notifier: fuser::Notifier) {
        let _ = self.notifier.set(notifier);
    }

    /// Makes the kernel ask for `ino`'s attributes before it next uses them.
    pub fn forget(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            invalidate_attributes(n, &[ino]);
        }
    }
}

/// Drops the kernel's attributes of `inodes` (offset −1: no page lock is taken).
pub(super) fn invalidate_attributes(notifier: &fuser::Notifier, inodes: &[u64]) {
    for &ino in inodes {
        // ENOENT: the kernel does not know the inode; nothing to drop.
        if let Err(e) = notifier.inval_inode(INodeNo(ino), -1, 0) {
            tracing::trace!(ino, "inval_inode (attributes): {e}");
        }
    }
}

/// The thread that drops recalled inodes' pages from the kernel (see `RecallWorker`).
pub(super) struct PageDropper {
    jobs: mpsc::Sender<(Vec<u64>, mpsc::SyncSender<()>)>,
    /// Signalled when the last job handed over is done.
    last: Option<mpsc::Receiver<()>>,
}

impl PageDropper {
    fn spawn(notifier: fuser::Notifier) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<(Vec<u64>, mpsc::SyncSender<()>)>();
        std::thread::Builder::new().name("crest-pages".into()).spawn(move || {
            for (inodes, done) in queue {
                for ino in inodes {
                    // ENOENT: the kernel does not know the inode; nothing to drop.
                    if let Err(e) = notifier.inval_inode(INodeNo(ino), 0, 0) {
                        tracing::trace!(ino, "inval_inode: {e}");
                    }
                }
                let _ = done.send(());
            }
        })?;
        Ok(PageDropper { jobs, last: None })
    }

    /// Drops the pages of `inodes`, waiting up to `PAGE_DROP_WAIT` for it if `wait`; not
    /// at all when an earlier drop is still blocked (this one queues behind it).
    fn drop_then_wait(&mut self, inodes: Vec<u64>, wait: bool) {
        let blocked = self.last.as_ref().is_some_and(|rx| matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        let (done, rx) = mpsc::sync_channel(1);
        if self.jobs.send((inodes, done)).is_err() {
            return;
        }
        if wait && !blocked && rx.recv_timeout(PAGE_DROP_WAIT).is_ok() {
            self.last = None;
            return;
        }
        if wait {
            tracing::debug!("dropping recalled pages waits on a page lock; answering the recall first");
        }
        self.last = Some(rx);
    }
}

impl CrestFs {
    /// The part that applies recalls; spawn it once the FUSE session exists.
    pub fn recall_worker(&self) -> RecallWorker {
        RecallWorker {
            client: Arc::downgrade(&self.client),
            names: self.names.clone(),
            page_io: self.page_io.clone(),
            kernel_epoch: self.kernel_epoch.clone(),
        }
    }
}
