//! The workload: what system call each client makes next, drawn from what it knows.
//!
//! Every choice is drawn from `Sim::rng`, so the order and number of the draws here is
//! part of what a seed means: a change to it changes every seed's run.

use super::*;

/// Names the clients use: few, so that they collide.
const NAMES: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

/// The inodes a client's next call is drawn from.
struct Pool {
    /// Directories (the root if it knows none).
    dirs: Vec<u64>,
    /// Regular files.
    files: Vec<u64>,
    /// Everything.
    all: Vec<u64>,
    /// What its processes can reach to change: files they hold open, and what its cache
    /// holds now with a name left (a name the kernel resolves without asking). The server recalls that from
    /// it before another client removes the last name, so a change never names a file
    /// unlinked elsewhere that it does not hold open — as no system call can.
    reach: Vec<u64>,
    /// The regular files among `reach`: what open(2) can name.
    reach_files: Vec<u64>,
    /// The files its processes hold open: what write(2) and ftruncate(2) need.
    opened: Vec<u64>,
}

impl Pool {
    /// A directory: the root a third of the time.
    fn dir(&self, r: &mut Stream) -> u64 {
        if r.below(3) == 0 {
            ROOT_INO
        } else {
            self.dirs[r.below(self.dirs.len() as u64) as usize]
        }
    }

    /// A regular file, if it knows one (no draw if not).
    fn file(&self, r: &mut Stream) -> Option<u64> {
        (!self.files.is_empty()).then(|| self.files[r.below(self.files.len() as u64) as usize])
    }

    /// Anything.
    fn any(&self, r: &mut Stream) -> u64 {
        self.all[r.below(self.all.len() as u64) as usize]
    }

    /// Something it can reach to change, if any (no draw if not).
    fn reachable(&self, r: &mut Stream) -> Option<u64> {
        (!self.reach.is_empty()).then(|| self.reach[r.below(self.reach.len() as u64) as usize])
    }

    /// A regular file it can reach to open, if any (no draw if not).
    fn file_to_open(&self, r: &mut Stream) -> Option<u64> {
        (!self.reach_files.is_empty()).then(|| self.reach_files[r.below(self.reach_files.len() as u64) as usize])
    }

    /// A file it holds open, if any (no draw if not).
    fn open_file(&self, r: &mut Stream) -> Option<u64> {
        (!self.opened.is_empty()).then(|| self.opened[r.below(self.opened.len() as u64) as usize])
    }
}

/// One of `NAMES`.
fn name(r: &mut Stream) -> Vec<u8> {
    NAMES[r.below(NAMES.len() as u64) as usize].as_bytes().to_vec()
}

impl Sim {
    /// Client `c`'s next system call.
    pub(crate) fn pick_op(&mut self, c: usize) -> Op {
        self.pick_op_of(c, None)
    }

    /// What another process of client `c` does while a call of it waits on the server:
    /// half the time it opens or closes a file (as readers do: `cat`, an editor),
    /// else anything.
    pub(crate) fn pick_meanwhile(&mut self, c: usize) -> Op {
        let w = (self.rng.below(2) == 0).then(|| self.rng.below(6));
        self.pick_op_of(c, w)
    }

    /// Client `c`'s next system call, of the kind `w` (0..100; drawn if none).
    fn pick_op_of(&mut self, c: usize, w: Option<u64>) -> Op {
        let cl = &self.clients[c];
        // From its working set (as often as this seed says), else from everything it has
        // heard of.
        let mut pool: Vec<(u64, p::FileType)> = if self.rng.below(100) < self.locality && !cl.recent.is_empty() {
            cl.recent.iter().copied().collect()
        } else {
            cl.known.iter().map(|(i, k)| (*i, *k)).collect()
        };
        // What its processes hold open they keep using, named or not.
        let opened: BTreeSet<u64> = cl.opens.values().copied().collect();
        // (Not a file it saw with no name left and holds no descriptor of: only a
        // descriptor leads there, and its last one may have gone on another client,
        // which destroys the file without a recall.)
        let at = self.instant();
        let orphan = |i: &u64| cl.names().attr(*i, at).is_some_and(|a| a.nlink == 0);
        pool.retain(|(i, _)| !opened.contains(i) && !orphan(i));
        pool.extend(opened.iter().map(|&i| (i, p::FileType::Regular)));
        let of = |kind| pool.iter().filter(|(_, k)| *k == kind).map(|(i, _)| *i).collect::<Vec<u64>>();
        let (mut dirs, files) = (of(p::FileType::Directory), of(p::FileType::Regular));
        if dirs.is_empty() {
            dirs.push(ROOT_INO);
        }
        let all: Vec<u64> = pool.iter().map(|(i, _)| *i).collect();
        let reach: Vec<u64> = {
            let names = cl.names();
            // (Not a file with no name left that it does not hold open: no path leads there.)
            let named = |i: u64| names.attr(i, at).is_some_and(|a| a.nlink > 0);
            all.iter().copied().filter(|&i| opened.contains(&i) || named(i)).collect()
        };
        let reach_files = reach.iter().copied().filter(|i| files.contains(i)).collect();
        let pool = Pool { dirs, files, all, reach, reach_files, opened: opened.into_iter().collect() };
        let w = w.unwrap_or_else(|| self.rng.below(100));
        let r = &mut self.rng;
        match w {
            0..=9 => self.pick_open_or_lock(c, w, &pool),
            10..=19 => Op::Lookup { parent: pool.dir(r), name: name(r) },
            20..=29 => self.pick_attr(&pool),
            30..=37 => match pool.file(r) {
                Some(ino) => Op::Read { ino, offset: 0, len: 8192 },
                None => Op::ReadDir { ino: pool.dir(r), from_index: 0, limit: 1024 },
            },
            38..=45 => Op::ReadDir { ino: pool.dir(r), from_index: 0, limit: 1024 },
            58..=79 => self.pick_data(c, w, &pool),
            // Creates (46..=57); unlinks, rmdirs, links and renames (80..=99).
            _ => self.pick_name(c, w, &pool),
        }
    }

    /// Opens and closes (`w` in 0..=5), and locks (6..=9).
    fn pick_open_or_lock(&mut self, c: usize, w: u64, pool: &Pool) -> Op {
        let cl = &self.clients[c];
        let r = &mut self.rng;
        let handles: Vec<(u64, u64)> = cl.opens.iter().map(|(h, i)| (*h, *i)).collect();
        let next_handle = cl.next_handle;
        match w {
            // Opens and closes (a process keeps a few files open while others unlink or
            // rename over them).
            0..=5 if r.below(2) == 0 && !handles.is_empty() => {
                let (handle, ino) = handles[r.below(handles.len() as u64) as usize];
                let last = handles.iter().filter(|(_, i)| *i == ino).count() == 1;
                match cl.locked.range((ino, 0, false)..=(ino, u64::MAX, true)).next().copied() {
                    // Its processes drop their locks on the file before the last close.
                    Some((ino, owner, flock)) if last => {
                        let pid = 100 * c as u32 + owner as u32;
                        Op::SetLock { ino, owner, start: 0, end: p::LOCK_TO_EOF, kind: p::LockKind::Unlock, flock, pid }
                    }
                    _ => Op::Release { ino, handle },
                }
            }
            0..=5 => match pool.file_to_open(r) {
                Some(ino) if handles.len() < 4 => {
                    self.clients[c].next_handle += 1;
                    Op::Open { ino, handle: next_handle, access: p::OPEN_READ | p::OPEN_WRITE }
                }
                _ => Op::Lookup { parent: pool.dir(r), name: name(r) },
            },
            // fcntl and flock locks of a few owners (processes) on the files it holds
            // open (a lock needs a descriptor), over overlapping ranges: tries (F_SETLK),
            // and tests (F_GETLK).
            _ => match (!handles.is_empty()).then(|| handles[r.below(handles.len() as u64) as usize].1) {
                Some(ino) => {
                    let owner = 1 + r.below(3);
                    let flock = r.below(4) == 0;
                    let (start, end) = if flock {
                        (0, p::LOCK_TO_EOF)
                    } else {
                        let start = r.below(4) * 100 + r.below(50);
                        (start, if r.below(4) == 0 { p::LOCK_TO_EOF } else { start + r.below(200) })
                    };
                    let kind = [p::LockKind::Read, p::LockKind::Write, p::LockKind::Write, p::LockKind::Unlock]
                        [r.below(4) as usize];
                    if r.below(4) == 0 && kind != p::LockKind::Unlock {
                        Op::GetLock { ino, owner, start, end, kind, flock }
                    } else {
                        Op::SetLock { ino, owner, start, end, kind, flock, pid: 100 * c as u32 + owner as u32 }
                    }
                }
                None => Op::Lookup { parent: pool.dir(r), name: name(r) },
            },
        }
    }

    /// Attributes of anything it knows: a getattr, or now and then an xattr call.
    fn pick_attr(&mut self, pool: &Pool) -> Op {
        let r = &mut self.rng;
        // Now and then an xattr of anything it knows: values across the inline limit
        // (1784 bytes of name + value) and the chunk size, set with either flag.
        if r.below(3) != 0 {
            return Op::GetAttr { ino: pool.any(r) };
        }
        let ino = pool.any(r);
        let name = format!("user.{}", NAMES[r.below(3) as usize]).into_bytes();
        let which = r.below(5);
        // (Changes only to what it can reach.)
        let ino = match which {
            2 | 3 => ino,
            _ => match pool.reachable(r) {
                Some(ino) => ino,
                None => return Op::GetXattr { ino, name },
            },
        };
        match which {
            0 | 1 => {
                let mut value = vec![0u8; [0, 17, 1_700, 1_790, 3_000][r.below(5) as usize]];
                r.fill_bytes(&mut value);
                let flags = [0, 0, p::XATTR_CREATE, p::XATTR_REPLACE][r.below(4) as usize];
                Op::SetXattr { ino, name, value, flags }
            }
            2 => Op::GetXattr { ino, name },
            3 => Op::ListXattr { ino },
            _ => Op::RemoveXattr { ino, name },
        }
    }

    /// Data: writes and appends (`w` in 58..=71), and setattrs (72..=79).
    fn pick_data(&mut self, c: usize, w: u64, pool: &Pool) -> Op {
        let cl = &self.clients[c];
        let r = &mut self.rng;
        match w {
            // Through a descriptor (else it opens a file to write to).
            58..=71 => match pool.open_file(r) {
                // A quarter of them O_APPEND: the server chooses where it lands.
                Some(ino) if r.below(4) == 0 => {
                    let mut data = vec![0u8; r.below(300) as usize];
                    r.fill_bytes(&mut data);
                    Op::Append { ino, data }
                }
                Some(ino) => {
                    let len = 1 + r.below(300) as usize;
                    let mut data = vec![0u8; len];
                    r.fill_bytes(&mut data);
                    Op::Write { ino, offset: r.below(1_500), data }
                }
                None => match pool.file_to_open(r) {
                    Some(ino) if cl.opens.len() < 4 => {
                        self.clients[c].next_handle += 1;
                        Op::Open { ino, handle: self.clients[c].next_handle - 1, access: p::OPEN_READ | p::OPEN_WRITE }
                    }
                    _ => Op::Lookup { parent: pool.dir(r), name: name(r) },
                },
            },
            _ => {
                let Some(ino) = pool.reachable(r) else {
                    return Op::GetAttr { ino: pool.any(r) };
                };
                let set = if r.below(2) == 0 && cl.known.get(&ino) == Some(&p::FileType::Regular) {
                    p::SetAttr { size_bytes: Some(r.below(2_000)), ..Default::default() }
                } else {
                    p::SetAttr { mode: Some([0o644, 0o600, 0o755, 0o2775][r.below(4) as usize]), ..Default::default() }
                };
                Op::SetAttr { ino, set }
            }
        }
    }

    /// Names: creates (`w` in 46..=57), unlinks and rmdirs (80..=91), then links and
    /// renames.
    fn pick_name(&mut self, c: usize, w: u64, pool: &Pool) -> Op {
        let at = self.instant();
        let cl = &self.clients[c];
        let r = &mut self.rng;
        match w {
            46..=57 => {
                let is_dir = r.below(3) == 0;
                let mode = if is_dir {
                    [0o755, 0o700, 0o2775][r.below(3) as usize]
                } else {
                    [0o644, 0o600][r.below(2) as usize]
                };
                let kind = if is_dir { p::FileType::Directory } else { p::FileType::Regular };
                Op::Create { parent: pool.dir(r), name: name(r), kind, mode, rdev: 0, cred: cl.cred }
            }
            // Half the time a name it knows to be there, of the right kind (as `rm -r`
            // does), so that removals answered locally are common.
            80..=91 => {
                let rmdir = w >= 88;
                let parent = pool.dir(r);
                let want = if rmdir { p::FileType::Directory } else { p::FileType::Regular };
                let there: Vec<Vec<u8>> = cl
                    .names()
                    .names_held(parent, at)
                    .into_iter()
                    .filter(|(_, i)| cl.known.get(i) == Some(&want))
                    .map(|(n, _)| n)
                    .collect();
                let name = if !there.is_empty() && r.below(2) == 0 {
                    there[r.below(there.len() as u64) as usize].clone()
                } else {
                    name(r)
                };
                if rmdir {
                    Op::Rmdir { parent, name }
                } else {
                    Op::Unlink { parent, name }
                }
            }
            // A third of them hard links (now and then of a directory: EPERM).
            _ if r.below(3) == 0 => {
                let ino = if r.below(8) == 0 { pool.dir(r) } else { pool.reachable(r).unwrap_or(ROOT_INO) };
                Op::Link { ino, parent: pool.dir(r), name: name(r) }
            }
            _ => {
                Op::Rename { parent: pool.dir(r), name: name(r), new_parent: pool.dir(r), new_name: name(r), flags: 0 }
            }
        }
    }
}
