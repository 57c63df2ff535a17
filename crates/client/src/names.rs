//! The mount's name and attribute cache: it decides which lookups a mount can answer
//! without a round trip, and holds the rights and tombstones that say when it may.
//!
//! What it holds: stretches of directories as the server sent them (`DirLeaf`: every
//! entry whose name hash lies in a range), and the attributes that came with them. A
//! lookup of a name inside a held range is answered here — found, or *absent* — which is
//! what makes an untar cheap: the negative lookup before each create never leaves the
//! machine. A new directory made through this mount is known to be empty, so it is held
//! whole from birth.
//!
//! Invariants (each has a test below):
//! - **complete ranges**: a held range lists every entry of its directory in that range
//!   as of when it was fetched, plus every change made through this mount since; names
//!   are added and removed as this mount creates and unlinks them, never just dropped
//!   (dropping one would make it look absent);
//! - **no regress**: a reply fetched before a change made through this mount completed is
//!   not absorbed (a mutation epoch is taken before each fetch and compared after), so the
//!   cache never answers older than this mount's own completed operations;
//! - **bounded staleness** from other clients: everything expires `ttl` after it was
//!   fetched. The next issue's leases replace the timer: a range will be valid while the
//!   directory's lease is held and dropped on recall;
//! - bounded memory: beyond `MAX_ENTRIES` the cache is simply cleared.
//!
//! Writeback state (docs/protocol.md §4.1, `X` rights) lives here too, under the same
//! lock, because the decision "may this mount answer a create itself" reads both:
//! - **exclusive inodes**: granted when this mount creates an inode (the server applies
//!   the same rule), dropped by a recall. While held, the inode's attributes and (for a
//!   directory) its entries never expire: nobody else can change them;
//! - **tombstones**: a recall is remembered for a while, so a grant that raced with it
//!   (a create's or acquire's reply released after a recall of what it grants: the
//!   request was sent before the recall came) is refused;
//! - **in flight** counts writeback requests per inode not yet answered, and **deferred
//!   errors** keeps the failure of one until the next flush or fsync of what it touched;
//! - **xattrs**: every extended attribute of an inode this mount created (with none) and
//!   changed only by writeback since — known complete, so answered here while the inode
//!   is exclusive; a change sent to the server, or a recall, forgets them for good;
//! - **kernel entries**: names in exclusive directories the kernel was told to cache (a
//!   long entry timeout). When the directory stops being exclusive they move to a list
//!   the recall thread drains (kernel invalidations) *before* it answers the recall, so
//!   the kernel never serves a name another client may have changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crest_proto::{self as p, name_hash, DirLeaf};

/// Most entries held (over all directories) before the cache is cleared.
pub const MAX_ENTRIES: usize = 1 << 20;
/// Stretches held of one directory at most (see `hold`).
const MAX_STRETCHES_PER_DIR: usize = 1024;

/// Longest name the server accepts; longer ones always go to the server (for its error).
pub const NAME_MAX: usize = 255;

pub use crate::tombstones::TOMBSTONE_LIFETIME;

/// How long after a recall of a directory the kernel is not let cache its names
/// (`kernel_shared_entry`).
pub const SHARED_DIR_QUIET: Duration = Duration::from_secs(1);

/// What the cache knows about a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cached {
    /// The name exists and names this inode.
    Found(p::Attr),
    /// The name does not exist.
    Absent,
}

use crate::changes::Changes;
pub use crate::changes::Epoch;
use crate::tombstones::Tombstones;

#[derive(Debug)]
struct Range {
    lo: u64,
    hi: u64,
    expires: Instant,
    /// name → inode.
    names: HashMap<Vec<u8>, u64>,
}

#[derive(Debug)]
struct Attr {
    attr: p::Attr,
    expires: Instant,
    /// When it was taken in (`NameCache::stamp`): a reply to a request sent before then
    /// may be older than it.
    stamp: u64,
}

/// What `NameCache::stats` counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Directories some of whose names are held.
    pub directories: usize,
    /// Inodes whose attributes are held.
    pub attributes: usize,
    /// Names held.
    pub names: usize,
    /// Inodes held exclusively (answered here, written back).
    pub exclusive: usize,
    /// Times the server forgot this mount's rights (a new session).
    pub resets: u64,
}

/// Name and attribute cache of one mount. Not thread-safe by itself: the FUSE layer keeps
/// it under a mutex and never holds that across a server call.
#[derive(Debug)]
pub struct NameCache {
    ttl: Duration,
    /// What changed through this mount since each fetch was sent (`crate::changes`).
    changes: Changes,
    /// Counts attributes taken in (`Attr::stamp`).
    stamp: u64,
    /// Counts the times the server forgot this client's rights (`reset_rights`): a new
    /// session, whose inode-number grants are new too.
    resets: u64,
    /// Directory → its held ranges, disjoint, in no particular order (few per directory).
    dirs: HashMap<u64, Vec<Range>>,
    attrs: HashMap<u64, Attr>,
    entries: usize,
    exclusive: HashSet<u64>,
    tombstones: Tombstones,
    in_flight: HashMap<u64, u32>,
    deferred: HashMap<u64, p::OpError>,
    kernel_entries: HashMap<u64, HashSet<Vec<u8>>>,
    kernel_inval: Vec<(u64, Vec<u8>)>,
    /// Inodes whose attributes the kernel may cache for long and must now forget: what was
    /// held when every right went without a recall (drained by the recall thread).
    kernel_attr_inval: Vec<u64>,
    /// Directories in which the kernel was let cache names under shared rights (only
    /// where it can be told to drop them all at once, without a lock: `kernel_shared_entry`).
    kernel_shared_dirs: HashSet<u64>,
    /// Shared state was dropped without a recall (a broken connection, a restart, a
    /// lapsed lease, a lost answer): every name the kernel caches under shared rights
    /// must go (`take_kernel_epoch`).
    kernel_epoch_due: bool,
    /// Every extended attribute of inodes this mount created (with none) and changed only
    /// through this mount since: complete, so get/list/set/remove are answered from it
    /// while the inode is held exclusively.
    xattrs: HashMap<u64, BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Directories acquired whole (`absorb_acquired`) and held since: their entries were
    /// granted with them.
    acquired: HashSet<u64>,
    /// When shared state was last dropped without a recall (`drop_shared`, and
    /// `reset_rights`): a reply to a request sent before may be one the server's reply
    /// cache kept from before, or one a stalled connection delivers late, when it may no
    /// longer count this mount as a holder of what it names.
    shared_dropped: Option<Instant>,
    /// When every right was last dropped (`reset_rights`: the lease ran out, the session
    /// was fenced or forgotten): a grant in a reply to a request sent before is stale.
    rights_reset: Option<Instant>,
}

/// A name the cache keeps (and a writeback create may make): anything else goes to the
/// server, for its error.
pub(crate) fn cacheable(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && name != b"." && name != b".."
}

impl NameCache {
    /// An empty cache whose contents live `ttl` (zero: nothing is ever answered here).
    pub fn new(ttl: Duration) -> NameCache {
        NameCache {
            ttl,
            changes: Changes::default(),
            stamp: 0,
            dirs: HashMap::new(),
            attrs: HashMap::new(),
            entries: 0,
            exclusive: HashSet::new(),
            tombstones: Tombstones::default(),
            in_flight: HashMap::new(),
            deferred: HashMap::new(),
            kernel_entries: HashMap::new(),
            kernel_inval: Vec::new(),
            kernel_attr_inval: Vec::new(),
            resets: 0,
            kernel_shared_dirs: HashSet::new(),
            kernel_epoch_due: false,
            xattrs: HashMap::new(),
            acquired: HashSet::new(),
            shared_dropped: None,
            rights_reset: None,
        }
    }

    /// The epoch to hand to `absorb_*` with the reply of a fetch sent now.
    pub fn epoch(&self) -> Epoch {
        self.changes.epoch()
    }

    /// How many attributes were taken in so far: taken before a request is sent, it tells
    /// `attr_changed_since` what its reply may be older than.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Holds `attr` until `expires`, stamped.
    fn put_attr(&mut self, attr: p::Attr, expires: Instant) {
        self.stamp += 1;
        self.attrs.insert(attr.ino, Attr { attr, expires, stamp: self.stamp });
    }

    /// Whether a reply to a fetch sent at `epoch` may be taken in for `dir` and `items`.
    fn current(&self, epoch: Epoch, dir: u64, items: &[p::DirItem]) -> bool {
        self.changes.current(epoch, std::iter::once(dir).chain(items.iter().map(|i| i.attr.ino)))
    }

    /// Answers a lookup from held state, or `None` when the server must be asked.
    pub fn lookup(&self, dir: u64, name: &[u8], now: Instant) -> Option<Cached> {
        if !cacheable(name) {
            return None;
        }
        let h = name_hash(name);
        let pinned = self.exclusive.contains(&dir);
        let range = self.dirs.get(&dir)?.iter().find(|r| r.lo <= h && h <= r.hi && (pinned || now < r.expires))?;
        match range.names.get(name) {
            None => Some(Cached::Absent),
            Some(ino) => {
                let a = self.attrs.get(ino).filter(|a| now < a.expires || self.exclusive.contains(ino))?;
                Some(Cached::Found(a.attr.clone()))
            }
        }
    }

    /// Takes in a stretch of `dir` the server sent in reply to a fetch started at `epoch`.
    /// Ignored when a change made through this mount to `dir`'s names completed in
    /// between; the attributes of an inode that changed in between are left out.
    pub fn absorb_leaf(&mut self, dir: u64, leaf: &DirLeaf, epoch: Epoch, now: Instant) {
        if !self.changes.current(epoch, [dir]) || leaf.hash_lo > leaf.hash_hi || self.ttl.is_zero() {
            return;
        }
        self.hold(dir, leaf.hash_lo, leaf.hash_hi, &leaf.items, now, Some(epoch));
    }

    /// Takes in a complete listing of `dir` (a readdir that started at the beginning and
    /// reached the end in one reply), fetched at `epoch`.
    pub fn absorb_listing(&mut self, dir: u64, items: &[p::DirItem], epoch: Epoch, now: Instant) {
        if !self.changes.current(epoch, [dir]) || self.ttl.is_zero() {
            return;
        }
        self.hold(dir, 0, u64::MAX, items, now, Some(epoch));
    }

    /// Takes in a directory this mount acquired (`Op::Acquire`, fetched at `epoch`): its
    /// attributes and every entry, held for as long as the exclusive rights that came with
    /// them. False (nothing taken) when a change made through this mount, or a recall,
    /// came in between, or `leaf` does not cover every name.
    pub fn absorb_acquired(&mut self, dir: &p::Attr, leaf: &DirLeaf, epoch: Epoch, now: Instant) -> bool {
        if !self.current(epoch, dir.ino, &leaf.items)
            || self.ttl.is_zero()
            || leaf.hash_lo != 0
            || leaf.hash_hi != u64::MAX
        {
            return false;
        }
        self.hold(dir.ino, 0, u64::MAX, &leaf.items, now, None);
        self.put_attr(dir.clone(), now + self.ttl);
        self.acquired.insert(dir.ino);
        true
    }

    /// True when this mount acquired `dir` whole and still holds it (its entries may have
    /// been recalled one by one since).
    pub fn holds_whole(&self, dir: u64) -> bool {
        self.acquired.contains(&dir) && self.exclusive.contains(&dir)
    }

    /// True when this cache holds anything at all (its time to live is not zero).
    pub fn caching(&self) -> bool {
        !self.ttl.is_zero()
    }

    fn hold(&mut self, dir: u64, lo: u64, hi: u64, items: &[p::DirItem], now: Instant, fetched: Option<Epoch>) {
        if self.entries + items.len() > MAX_ENTRIES {
            self.clear();
        }
        let expires = now + self.ttl;
        let pinned = self.exclusive.contains(&dir);
        let ranges = self.dirs.entry(dir).or_default();
        // The new stretch replaces whatever it overlaps (it is at least as fresh), and
        // those that lapsed go with it. A look-up the server answers with its name's own
        // hash only (another mount holds some of the directory) adds a stretch per name:
        // they would pile up, and every look-up walks them, so past
        // `MAX_STRETCHES_PER_DIR` the directory starts afresh.
        let mut dropped = 0;
        ranges.retain(|r| {
            let keep = (r.hi < lo || r.lo > hi) && (pinned || now < r.expires);
            if !keep {
                dropped += r.names.len();
            }
            keep
        });
        if ranges.len() >= MAX_STRETCHES_PER_DIR {
            dropped += ranges.iter().map(|r| r.names.len()).sum::<usize>();
            ranges.clear();
        }
        let mut names = HashMap::with_capacity(items.len());
        let mut attrs = Vec::with_capacity(items.len());
        for i in items {
            if lo <= name_hash(&i.name) && name_hash(&i.name) <= hi {
                names.insert(i.name.clone(), i.attr.ino);
                // Attributes of inodes changed since the fetch was sent are left out (a
                // lookup of their names then asks the server).
                if fetched.is_none_or(|e| self.changes.current(e, [i.attr.ino])) {
                    attrs.push(i.attr.clone());
                }
            }
        }
        self.entries = self.entries - dropped + names.len();
        ranges.push(Range { lo, hi, expires, names });
        for a in attrs {
            self.put_attr(a, expires);
        }
    }

    /// A directory this mount just made: it is empty, so it is held whole.
    pub fn made_dir(&mut self, attr: &p::Attr, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let expires = now + self.ttl;
        self.dirs.insert(attr.ino, vec![Range { lo: 0, hi: u64::MAX, expires, names: HashMap::new() }]);
    }

    /// `name` in `dir` now names `attr` (create, mkdir, symlink, link, rename target),
    /// done through this mount. Also records `attr` and forgets `dir`'s attributes (its
    /// times changed).
    pub fn added(&mut self, dir: u64, name: &[u8], attr: &p::Attr, now: Instant) {
        self.changes.bump([dir, attr.ino]);
        self.attrs.remove(&dir);
        let h = name_hash(name);
        if let Some(r) = self.dirs.get_mut(&dir).and_then(|v| v.iter_mut().find(|r| r.lo <= h && h <= r.hi)) {
            if r.names.insert(name.to_vec(), attr.ino).is_none() {
                self.entries += 1;
            }
        }
        self.put_attr(attr.clone(), now + self.ttl);
    }

    /// As `added`, for a change the server answered: the reply to a request first sent at
    /// `sent`. The server may have held the reply back until other mounts dropped what
    /// they held, and a recall of the inode that came here meanwhile ended this mount's
    /// claim to what the reply carries (the server no longer counts it as a holder): the
    /// name is recorded, the attributes are not.
    pub fn added_by_reply(&mut self, dir: u64, name: &[u8], attr: &p::Attr, sent: Instant, now: Instant) {
        self.added(dir, name, attr, now);
        if self.stale_since(attr.ino, sent) {
            self.attrs.remove(&attr.ino);
        }
    }

    /// This mount created `attr` (named `name` in `dir`) by a request first sent at
    /// `sent`, and the server answered: what `added_by_reply` records, and, unless a
    /// recall of the new inode came first (then nothing of it is held), that it has no
    /// extended attributes but its ACLs and, a directory, that it is empty.
    pub fn created_by_reply(&mut self, dir: u64, name: &[u8], attr: &p::Attr, sent: Instant, now: Instant) {
        self.added(dir, name, attr, now);
        if self.stale_since(attr.ino, sent) {
            self.attrs.remove(&attr.ino);
            return;
        }
        if attr.flags == 0 {
            self.created_without_xattrs(attr.ino);
        }
        if attr.kind == p::FileType::Directory {
            self.made_dir(attr, now);
        }
    }

    /// A name of `victim` (as the request that removed it looked it up first) went
    /// through the server: as `removed`, and the victim's attributes go even when the
    /// name was not held here. A file unlinked while open is still reached through its
    /// descriptors, and must not show its old link count.
    pub fn unlinked(&mut self, dir: u64, name: &[u8], victim: Option<u64>) {
        let Some(victim) = victim else { return self.removed(dir, name) };
        let named = self.take_name(dir, name);
        self.changes.bump(named.into_iter().chain([dir, victim]));
        self.attrs.remove(&dir);
        for ino in named.into_iter().chain([victim]) {
            self.attrs.remove(&ino);
            self.drop_dir(ino);
        }
    }

    /// Whether what a reply to a request sent at `sent` says of `ino` may be stale: a
    /// recall of it came since, or shared state was dropped since (the connection broke:
    /// the server may have stopped counting this mount as a holder, and answer a resend
    /// from its reply cache with what it found before).
    fn stale_since(&self, ino: u64, sent: Instant) -> bool {
        self.tombstones.since(ino, sent) || self.shared_dropped.is_some_and(|at| at >= sent)
    }

    /// `name` in `dir` was removed through this mount (unlink, rmdir, rename source or
    /// replaced target). The inode it named loses its attributes (link count, ctime).
    pub fn removed(&mut self, dir: u64, name: &[u8]) {
        self.attrs.remove(&dir);
        match self.take_name(dir, name) {
            Some(ino) => {
                self.changes.bump([dir, ino]);
                self.attrs.remove(&ino);
                self.drop_dir(ino);
            }
            // Unknown inode: any might have been the victim and lost a link (a file
            // unlinked while open is still reached through its descriptors, so even one
            // with a single link must not show it).
            None => {
                self.changes.bump_all();
                self.attrs.clear();
            }
        }
    }

    /// The server says `attr` is current (a reply to getattr, setattr, write, open…).
    /// Updates what is held, without adding anything new.
    pub fn attr_changed(&mut self, attr: &p::Attr) {
        self.attr_changed_since(attr, u64::MAX);
    }

    /// `attr_changed` for the reply to a request sent when the stamp was `since`: what was
    /// taken in after that (another process's reply, a listing, after a recall) may be
    /// newer than the reply, or older: neither is kept, and the next call asks.
    pub fn attr_changed_since(&mut self, attr: &p::Attr, since: u64) {
        self.changes.bump([attr.ino]);
        match self.attrs.get(&attr.ino).map(|a| (a.stamp, a.expires)) {
            Some((stamp, _)) if stamp > since => _ = self.attrs.remove(&attr.ino),
            Some((_, expires)) => self.put_attr(attr.clone(), expires),
            None => {}
        }
    }

    /// Holds attributes the server sent in reply to a fetch started at `epoch`.
    pub fn hold_attr(&mut self, attr: &p::Attr, epoch: Epoch, now: Instant) {
        // An exclusive inode changes only through this mount: with no writeback of it in
        // flight, the server's answer is current whatever else changed meanwhile.
        let current = self.changes.current(epoch, [attr.ino])
            || (self.exclusive.contains(&attr.ino) && !self.writeback_pending(attr.ino));
        if !current || self.ttl.is_zero() {
            return;
        }
        self.put_attr(attr.clone(), now + self.ttl);
    }

    /// How much longer the attributes held for `ino` stay valid under shared rights (zero
    /// when none are held): the kernel may cache them that long, as a recall drops them
    /// from the kernel before it is answered.
    pub fn attr_valid_for(&self, ino: u64, now: Instant) -> Duration {
        self.attrs.get(&ino).map_or(Duration::ZERO, |a| a.expires.saturating_duration_since(now))
    }

    /// Attributes held for `ino`, if still valid.
    pub fn attr(&self, ino: u64, now: Instant) -> Option<p::Attr> {
        self.attrs.get(&ino).filter(|a| now < a.expires || self.exclusive.contains(&ino)).map(|a| a.attr.clone())
    }

    /// Attributes this mount computed itself for an operation it answered (writeback):
    /// held as if the server had sent them.
    pub fn set_attr(&mut self, attr: &p::Attr, now: Instant) {
        self.changes.bump([attr.ino]);
        self.put_attr(attr.clone(), now + self.ttl);
    }

    /// The server counts this mount as `ino`'s exclusive holder (it created it, or
    /// acquired a directory naming it), told in wire order with recalls, by the reply to a
    /// request first sent at `sent`: this mount holds it exclusively, unless a recall of
    /// it came after `sent` (then the recall wins: the server may have taken the rights
    /// back after granting them; a recall that came before `sent` was answered before the
    /// request reached the server, so the grant is newer). Cached state of `ino` that had
    /// expired is dropped rather than pinned: the server may have stopped counting this
    /// mount as a holder of it meanwhile (a recall lost with a connection).
    pub fn grant_exclusive(&mut self, ino: u64, now: Instant, sent: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        // The tombstone outlives the grant: the same reply may grant the inode twice (a
        // hard link named twice in an acquired directory), and every grant sent before the
        // recall is as stale as the first; so are the attributes in any reply to a request
        // sent before it, which the server may have held back until after this grant
        // (`stale_since`).
        if self.tombstones.since(ino, sent) || self.rights_reset.is_some_and(|at| at >= sent) {
            return;
        }
        if !self.exclusive.contains(&ino) {
            if self.attrs.get(&ino).is_some_and(|a| a.expires <= now) {
                self.attrs.remove(&ino);
            }
            if let Some(ranges) = self.dirs.get_mut(&ino) {
                let before: usize = ranges.iter().map(|r| r.names.len()).sum();
                ranges.retain(|r| now < r.expires);
                let after: usize = ranges.iter().map(|r| r.names.len()).sum();
                self.entries -= before - after;
            }
        }
        self.exclusive.insert(ino);
    }

    /// This mount created `ino`: it has no extended attributes.
    pub fn created_without_xattrs(&mut self, ino: u64) {
        if !self.ttl.is_zero() {
            self.xattrs.insert(ino, BTreeMap::new());
        }
    }

    /// An extended attribute of `ino` is being set or removed through the server (not
    /// answered here): what was held of them is no longer known complete.
    pub fn xattrs_changed(&mut self, ino: u64) {
        self.xattrs.remove(&ino);
    }

    /// True when `ino` is known to have no extended attributes: this mount created it,
    /// set none (or removed what it set), and holds it exclusively (nobody else can have
    /// set one). This answers the kernel's `security.capability` look-up before every
    /// write without a round trip.
    pub fn has_no_xattrs(&self, ino: u64) -> bool {
        self.held_xattrs(ino).is_some_and(BTreeMap::is_empty)
    }

    /// Every extended attribute of `ino` (name → value), when known complete: this mount
    /// created it, has changed them only here since, and holds it exclusively.
    pub fn held_xattrs(&self, ino: u64) -> Option<&BTreeMap<Vec<u8>, Vec<u8>>> {
        self.xattrs.get(&ino).filter(|_| self.exclusive.contains(&ino))
    }

    /// A setxattr answered here (writeback): `ino`'s attributes stay known complete.
    /// False (nothing recorded) when they were not held.
    pub fn set_held_xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) -> bool {
        if !self.exclusive.contains(&ino) {
            return false;
        }
        match self.xattrs.get_mut(&ino) {
            Some(m) => {
                m.insert(name.to_vec(), value.to_vec());
                true
            }
            None => false,
        }
    }

    /// A removexattr answered here (writeback). True when `name` was there (held).
    pub fn remove_held_xattr(&mut self, ino: u64, name: &[u8]) -> bool {
        if !self.exclusive.contains(&ino) {
            return false;
        }
        self.xattrs.get_mut(&ino).is_some_and(|m| m.remove(name).is_some())
    }

    /// `name` in `dir` was moved to `new_name` in `new_dir` through this mount (a rename
    /// answered here or by the server): the entry moves (a directory keeps what is held of
    /// its own entries); whatever `new_name` named before loses that link. `moved` and
    /// `victim` are the inodes' attributes after the rename (`victim` `None`: it had no
    /// link left, or there was none). Both directories' attributes are forgotten (the
    /// caller sets them when it computed them).
    #[allow(clippy::too_many_arguments)]
    pub fn renamed(
        &mut self,
        dir: u64,
        name: &[u8],
        new_dir: u64,
        new_name: &[u8],
        moved: &p::Attr,
        victim: Option<&p::Attr>,
        now: Instant,
    ) {
        self.attrs.remove(&dir);
        self.attrs.remove(&new_dir);
        let took = self.take_name(dir, name);
        let replaced = self.take_name(new_dir, new_name);
        self.changes.bump([dir, new_dir, moved.ino].into_iter().chain(took).chain(replaced));
        if let Some(v) = replaced.filter(|&v| v != moved.ino) {
            self.attrs.remove(&v);
            match victim {
                Some(a) if a.ino == v => {
                    self.put_attr(a.clone(), now + self.ttl);
                }
                _ => self.drop_dir(v),
            }
        }
        self.added(new_dir, new_name, moved, now);
    }

    /// Removes `name` from what is held of `dir`, returning the inode it named.
    fn take_name(&mut self, dir: u64, name: &[u8]) -> Option<u64> {
        let h = name_hash(name);
        let ino = self
            .dirs
            .get_mut(&dir)
            .and_then(|v| v.iter_mut().find(|r| r.lo <= h && h <= r.hi))
            .and_then(|r| r.names.remove(name));
        if ino.is_some() {
            self.entries -= 1;
        }
        ino
    }

    /// The names held of `dir` that may still be answered from (valid stretches, or any
    /// while `dir` is held exclusively), with the inodes they name.
    pub fn names_held(&self, dir: u64, now: Instant) -> Vec<(Vec<u8>, u64)> {
        let pinned = self.exclusive.contains(&dir);
        let ranges = self.dirs.get(&dir).into_iter().flatten().filter(|r| pinned || now < r.expires);
        let mut held: Vec<(Vec<u8>, u64)> = ranges.flat_map(|r| r.names.iter().map(|(n, &i)| (n.clone(), i))).collect();
        held.sort();
        held
    }

    /// True when directory `dir` is known to have no entries: every hash range of it is
    /// held and lists nothing (a directory this mount made and emptied, say).
    pub fn known_empty(&self, dir: u64) -> bool {
        self.dirs
            .get(&dir)
            .is_some_and(|ranges| ranges.iter().any(|r| r.lo == 0 && r.hi == u64::MAX && r.names.is_empty()))
            && self.exclusive.contains(&dir)
    }

    /// True when this mount holds `ino` exclusively.
    pub fn is_exclusive(&self, ino: u64) -> bool {
        self.exclusive.contains(&ino)
    }

    /// How many times the server forgot this client's rights (a new session each time, or
    /// a restart): inode numbers granted before belong to another session.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// The server no longer knows of any exclusive rights of this mount (it restarted):
    /// hold none, and drop what only they kept valid.
    pub fn reset_rights(&mut self, now: Instant) {
        self.resets += 1;
        // What a reply to a request sent before says may be stale: the lease ran out
        // while the connection stalled, and its stream may still deliver answers the
        // server sent before it fenced this session (the `Fenced` notice comes after).
        self.shared_dropped = Some(now);
        self.rights_reset = Some(now);
        // The kernel was let cache these attributes for long (exclusive ones, shared ones
        // as long as held); nobody will recall them now.
        let held = self.held_rights(now).into_iter().map(|(ino, _)| ino);
        self.kernel_attr_inval.extend(held);
        self.exclusive.clear();
        self.acquired.clear();
        self.xattrs.clear();
        let dirs: Vec<u64> = self.kernel_entries.keys().copied().collect();
        for d in dirs {
            self.release_kernel_entries(d);
        }
        self.clear();
    }

    /// Stops answering from what is held under shared rights, keeping what is held
    /// exclusively. For when the connection to the server breaks (a recall may be lost
    /// with it, and a server that restarts meanwhile knows of no shared holder) and when a
    /// restarted server restored the session (it may have applied, and kept, changes whose
    /// recalls were unanswered when it died). Exclusive state is sure: nobody else can
    /// change it until the lease is over. The kernel forgets the attributes it was let
    /// cache under the dropped rights.
    pub fn drop_shared(&mut self, now: Instant) {
        self.shared_dropped = Some(now);
        let shared = self.attrs.keys().copied().filter(|i| !self.exclusive.contains(i));
        self.kernel_attr_inval.extend(shared);
        self.clear();
    }

    /// A change the server applied and kept, but whose answer was lost (it restarted
    /// first): nothing held about what it touched can be trusted — the inodes it names and
    /// what its names stand for here. They are dropped as if recalled, exclusive rights
    /// included (the server still counting this mount as their holder costs a recall
    /// answered at once).
    pub fn reply_lost(&mut self, ops: &[p::Op], now: Instant) {
        let mut touched: Vec<u64> = ops.iter().flat_map(p::Op::named_inodes).collect();
        let mut unknown = false;
        for op in ops {
            for (dir, name) in op.named_entries() {
                match self.stretch(dir, name) {
                    Some(r) => touched.extend(r.names.get(name).copied()),
                    None => unknown |= op.is_mutation(),
                }
            }
        }
        if unknown {
            // A name this mount does not hold was changed: whatever it named may have
            // lost a link, or been removed (a directory held whole, its listing with
            // it). Rare (a restart between a change and its answer): nothing is trusted.
            self.reset_rights(now);
            return;
        }
        for ino in touched {
            self.kernel_epoch_due |= self.kernel_shared_dirs.contains(&ino);
            if self.exclusive.contains(&ino) || self.attrs.contains_key(&ino) {
                self.kernel_attr_inval.push(ino);
            }
            self.recall_rights(ino, now);
            self.recalled(ino);
        }
    }

    /// How long the kernel may cache the name `name` in `dir` (found or absent) under
    /// shared rights: as long as this mount holds the stretch of `dir` that covers it.
    /// For a kernel that can be told to drop every cached name at once without taking a
    /// lock (`FUSE_NOTIFY_INC_EPOCH`): the directory is recorded, and a recall of it (or a
    /// drop of shared state) makes `take_kernel_epoch` say so before the recall is
    /// answered.
    pub fn kernel_shared_entry(&mut self, dir: u64, name: &[u8], now: Instant) -> Duration {
        // A directory recalled a moment ago is being changed elsewhere: its names are not
        // the kernel's to keep, or each recall of it would make the kernel drop every name
        // it caches and look each path up again (a shared parent's own name included).
        let contended = now.checked_sub(SHARED_DIR_QUIET).is_some_and(|t| self.tombstones.since(dir, t));
        if !cacheable(name) || contended {
            return Duration::ZERO;
        }
        let valid = self.stretch(dir, name).map_or(Duration::ZERO, |r| r.expires.saturating_duration_since(now));
        if !valid.is_zero() {
            self.kernel_shared_dirs.insert(dir);
        }
        valid
    }

    /// The stretch of `dir` held that covers `name`, valid or not.
    fn stretch(&self, dir: u64, name: &[u8]) -> Option<&Range> {
        let h = name_hash(name);
        self.dirs.get(&dir)?.iter().find(|r| r.lo <= h && h <= r.hi)
    }

    /// Whether the kernel must now drop every name it caches under shared rights: one of
    /// `recalled` is a directory it was let cache names in, or shared state was dropped
    /// without a recall. Then the record starts afresh.
    pub fn take_kernel_epoch(&mut self, recalled: &[u64]) -> bool {
        let due = self.kernel_epoch_due || recalled.iter().any(|i| self.kernel_shared_dirs.contains(i));
        if due {
            self.kernel_epoch_due = false;
            self.kernel_shared_dirs.clear();
        }
        due
    }

    /// Exclusive inodes held (for tests and stats).
    pub fn exclusive_count(&self) -> usize {
        self.exclusive.len()
    }

    /// The server recalled `ino`: exclusive rights go first (on the connection thread, in
    /// wire order), and a tombstone is left against a grant racing with the recall (an
    /// acquire's grant of what this mount already held can come after a recall that
    /// ended it — `grant_exclusive`).
    pub fn recall_rights(&mut self, ino: u64, now: Instant) {
        self.xattrs.remove(&ino);
        self.acquired.remove(&ino);
        self.exclusive.remove(&ino);
        self.tombstones.insert(ino, now);
        self.release_kernel_entries(ino);
    }

    /// May the kernel cache the entry `name` in `dir` (negative when `ino` is 0) for a
    /// long time? Yes while `dir` (and the inode it names) is held exclusively; then the
    /// name is recorded, to be invalidated in the kernel when `dir` is given up.
    pub fn kernel_entry(&mut self, dir: u64, name: &[u8], ino: u64) -> bool {
        if !self.exclusive.contains(&dir) || (ino != 0 && !self.exclusive.contains(&ino)) {
            return false;
        }
        self.kernel_entries.entry(dir).or_default().insert(name.to_vec());
        true
    }

    /// `name` in `dir` was renamed to `new_name` in `new_dir` through the server: the
    /// kernel moved its entry, long timeout and all. Still recorded when `new_dir` is held
    /// exclusively; otherwise handed to the recall thread to invalidate (it does so before
    /// it answers any recall, so another client's change of the name is never hidden).
    pub fn kernel_entry_moved(&mut self, dir: u64, name: &[u8], new_dir: u64, new_name: &[u8]) {
        let was = self.kernel_entries.get_mut(&dir).is_some_and(|names| names.remove(name));
        if !was {
            return;
        }
        if self.exclusive.contains(&new_dir) {
            self.kernel_entries.entry(new_dir).or_default().insert(new_name.to_vec());
        } else {
            self.kernel_inval.push((new_dir, new_name.to_vec()));
        }
    }

    /// The kernel's entry `name` in `dir` may now name something else (a rename exchange):
    /// if it was allowed a long timeout, the recall thread invalidates it.
    pub fn kernel_entry_dropped(&mut self, dir: u64, name: &[u8]) {
        if self.kernel_entries.get_mut(&dir).is_some_and(|names| names.remove(name)) {
            self.kernel_inval.push((dir, name.to_vec()));
        }
    }

    fn release_kernel_entries(&mut self, dir: u64) {
        if let Some(names) = self.kernel_entries.remove(&dir) {
            self.kernel_inval.extend(names.into_iter().map(|n| (dir, n)));
        }
    }

    /// What this mount holds rights on, with whether exclusively: every exclusive inode,
    /// and every inode or directory with attributes or entries still valid.
    pub fn held_rights(&self, now: Instant) -> Vec<(u64, bool)> {
        let mut held: BTreeMap<u64, bool> = self.exclusive.iter().map(|&i| (i, true)).collect();
        for (&ino, a) in &self.attrs {
            if now < a.expires {
                held.entry(ino).or_insert(false);
            }
        }
        for (&dir, ranges) in &self.dirs {
            if ranges.iter().any(|r| now < r.expires) {
                held.entry(dir).or_insert(false);
            }
        }
        held.into_iter().collect()
    }

    /// Inodes whose attributes the kernel must now forget (drained by the recall thread).
    pub fn take_kernel_attr_invalidations(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.kernel_attr_inval)
    }

    /// Names the kernel caches that it must now forget (drained by the recall thread).
    pub fn take_kernel_invalidations(&mut self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut self.kernel_inval)
    }

    /// A writeback request touching `ino` was sent.
    pub fn begin_writeback(&mut self, ino: u64) {
        *self.in_flight.entry(ino).or_insert(0) += 1;
    }

    /// Its answer came; true when no other writeback of `ino` is in flight.
    pub fn end_writeback(&mut self, ino: u64) -> bool {
        match self.in_flight.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.in_flight.remove(&ino);
                true
            }
        }
    }

    /// True while writeback requests touching `ino` are unanswered.
    pub fn writeback_pending(&self, ino: u64) -> bool {
        self.in_flight.contains_key(&ino)
    }

    /// A writeback request touching `ino` failed: the next flush or fsync reports it.
    pub fn defer_error(&mut self, ino: u64, e: p::OpError) {
        self.deferred.entry(ino).or_insert(e);
    }

    /// Takes the deferred failure of `ino`, if any.
    pub fn take_error(&mut self, ino: u64) -> Option<p::OpError> {
        self.deferred.remove(&ino)
    }

    /// Another client changed `ino` (a recall): its attributes go, and if it is a
    /// directory, everything held of its entries.
    pub fn recalled(&mut self, ino: u64) {
        self.changes.bump([ino]);
        self.attrs.remove(&ino);
        self.drop_dir(ino);
    }

    /// Something about `ino` changed in a way its reply did not show (xattrs: ctime).
    pub fn attr_stale(&mut self, ino: u64) {
        self.changes.bump([ino]);
        self.attrs.remove(&ino);
    }

    fn drop_dir(&mut self, dir: u64) {
        if let Some(ranges) = self.dirs.remove(&dir) {
            self.entries -= ranges.iter().map(|r| r.names.len()).sum::<usize>();
        }
    }

    /// Forgets everything (memory cap; or a reconnect to a restarted server).
    pub fn clear(&mut self) {
        self.kernel_epoch_due |= !self.kernel_shared_dirs.is_empty();
        self.changes.bump_all();
        self.dirs.retain(|d, _| self.exclusive.contains(d));
        self.attrs.retain(|i, _| self.exclusive.contains(i));
        self.entries = self.dirs.values().flatten().map(|r| r.names.len()).sum();
    }

    /// How much is held, for `crest status --mount`: directories with names held,
    /// attributes held, names held, inodes held exclusively, and the times the server
    /// forgot this mount's rights.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            directories: self.dirs.len(),
            attributes: self.attrs.len(),
            names: self.entries,
            exclusive: self.exclusive.len(),
            resets: self.resets,
        }
    }

    /// Entries held (for tests and stats).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

#[cfg(test)]
mod stretch_tests;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn attr(ino: u64, kind: p::FileType) -> p::Attr {
        p::Attr {
            ino,
            generation: 1,
            kind,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size_bytes: 0,
            blocks_4k: 0,
            rdev: 0,
            atime: p::Time::default(),
            mtime: p::Time::default(),
            ctime: p::Time::default(),
            crtime: p::Time::default(),
            flags: 0,
        }
    }

    pub(crate) fn item(name: &str, ino: u64) -> p::DirItem {
        p::DirItem { name: name.as_bytes().to_vec(), index: ino, attr: attr(ino, p::FileType::Regular) }
    }

    #[test]
    fn a_reply_older_than_what_was_taken_in_since_its_request_replaces_nothing() {
        // One process's setattr is on its way; another's getattr brings attributes newer
        // than the setattr's answer (another mount changed the file in between). The
        // setattr's answer, arriving last, must not bring the old ones back.
        let now = Instant::now();
        let mut c = NameCache::new(Duration::from_secs(10));
        let old = p::Attr { size_bytes: 506, ..attr(19, p::FileType::Regular) };
        c.hold_attr(&old, c.epoch(), now);
        let since = c.stamp();
        let newer = p::Attr { ctime: p::Time { sec: 2, nsec: 0 }, ..old.clone() };
        c.hold_attr(&newer, c.epoch(), now);
        c.attr_changed_since(&old, since);
        assert_eq!(c.attr(19, now), None, "neither is known to be current: asked again");
        // With nothing taken in meanwhile, the answer is current.
        c.hold_attr(&newer, c.epoch(), now);
        let since = c.stamp();
        let grown = p::Attr { size_bytes: 900, ..newer.clone() };
        c.attr_changed_since(&grown, since);
        assert_eq!(c.attr(19, now), Some(grown));
    }

    fn leaf_around(names: &[(&str, u64)]) -> DirLeaf {
        DirLeaf { hash_lo: 0, hash_hi: u64::MAX, items: names.iter().map(|(n, i)| item(n, *i)).collect() }
    }

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn a_reply_to_a_request_sent_before_a_disconnect_caches_no_attributes() {
        // The connection broke after a rename went out; the server, missing this mount
        // for a while, stopped counting it as a holder and let another mount chmod the
        // file; the resent rename is answered from the reply cache, attributes of before.
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let sent = now;
        c.drop_shared(now + Duration::from_millis(5));
        let later = now + Duration::from_millis(50);
        c.added_by_reply(1, b"e", &attr(4, p::FileType::Directory), sent, later);
        assert_eq!(c.attr(4, later), None);
        // One sent after the reconnect is taken in.
        c.added_by_reply(1, b"f", &attr(5, p::FileType::Regular), later, later);
        assert!(c.attr(5, later).is_some());
    }

    #[test]
    fn a_reply_to_a_request_sent_before_every_right_went_caches_nothing() {
        // A rename went out; the connection stalled and the lease ran out (every right
        // dropped); the server, hearing nothing, fenced the session and let other mounts
        // change the file; then the stalled stream delivered the rename's old answer.
        // Neither its attributes nor a grant in it may be held.
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let sent = now;
        c.reset_rights(now + Duration::from_millis(5));
        let later = now + Duration::from_millis(50);
        c.added_by_reply(1, b"e", &attr(4, p::FileType::Regular), sent, later);
        assert_eq!(c.attr(4, later), None);
        c.created_by_reply(1, b"g", &attr(6, p::FileType::Regular), sent, later);
        c.grant_exclusive(6, later, sent);
        assert_eq!(c.attr(6, later), None);
        assert!(c.held_rights(later).is_empty(), "{:?}", c.held_rights(later));
        // One sent after is taken in.
        c.added_by_reply(1, b"f", &attr(5, p::FileType::Regular), later, later);
        assert!(c.attr(5, later).is_some());
    }

    #[test]
    fn a_lost_answer_to_a_removal_of_a_name_not_held_forgets_everything() {
        // A server restart kept an unlink it never answered, of a name this mount did not
        // hold: the file it named (held exclusively here, open in a process) has lost a
        // link, whichever it was.
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.grant_exclusive(7, now, now);
        c.set_attr(&attr(7, p::FileType::Regular), now);
        c.reply_lost(&[p::Op::Unlink { parent: 6, name: b"e".to_vec() }], now);
        assert_eq!(c.attr(7, now), None);
        // A directory held whole may have been what an rmdir removed.
        let mut c = NameCache::new(TTL);
        c.grant_exclusive(36, now, now);
        c.made_dir(&attr(36, p::FileType::Directory), now);
        assert_eq!(c.lookup(36, b"c", now), Some(Cached::Absent));
        c.reply_lost(&[p::Op::Rmdir { parent: 190, name: b"f".to_vec() }], now);
        assert_eq!(c.lookup(36, b"c", now), None);
        assert!(!c.is_exclusive(36));
    }

    #[test]
    fn a_file_unlinked_through_a_directory_not_held_keeps_no_attributes() {
        // The mount holds the file exclusively (it created it; a process keeps it open)
        // but not the directory that names it: the unlink goes to the server, and its
        // answer must not leave the file's old link count to be answered (fstat on the
        // open descriptor shows 0).
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.grant_exclusive(244, now, now);
        c.set_attr(&attr(244, p::FileType::Regular), now);
        c.unlinked(91, b"c", Some(244));
        assert_eq!(c.attr(244, now), None);
        // Another file, held and not the victim, keeps its attributes.
        c.grant_exclusive(245, now, now);
        c.set_attr(&attr(245, p::FileType::Regular), now);
        c.unlinked(91, b"d", Some(246));
        assert!(c.attr(245, now).is_some());
    }

    #[test]
    fn a_reply_held_back_behind_a_recall_does_not_cache_what_the_recall_took() {
        // A rename's reply names the moved inode; the server held the reply until another
        // mount's change was recalled here, so the attributes it carries are older than
        // that change, and the server no longer counts this mount as their holder.
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let epoch = c.epoch();
        c.absorb_listing(97, &[item("b", 8)], epoch, now);
        let sent = now;
        c.recall_rights(90, now + Duration::from_millis(30));
        c.recalled(90);
        c.removed(97, b"g");
        c.added_by_reply(97, b"g", &attr(90, p::FileType::Regular), sent, now + Duration::from_millis(150));
        let later = now + Duration::from_millis(200);
        assert_eq!(c.attr(90, later), None, "the recall's answer came first: nothing of 90 is held");
        assert_eq!(c.lookup(97, b"g", later), None, "the name is not absent: it is asked of the server");
        // A directory made here whose recall overtook the reply is not held empty: another
        // mount may have filled (or removed) it since.
        c.recall_rights(268, later);
        c.recalled(268);
        let dir = attr(268, p::FileType::Directory);
        c.created_by_reply(1, b"d", &dir, sent, later + Duration::from_millis(5));
        assert_eq!(c.lookup(268, b"f", later), None);
        assert!(!c.known_empty(268) && c.held_xattrs(268).is_none());
        // A reply with no recall in between is taken in whole.
        let sent = later;
        c.added_by_reply(97, b"h", &attr(91, p::FileType::Regular), sent, later);
        assert!(matches!(c.lookup(97, b"h", later), Some(Cached::Found(a)) if a.ino == 91));
        let dir = attr(269, p::FileType::Directory);
        c.created_by_reply(1, b"e", &dir, later, later);
        assert_eq!(c.lookup(269, b"f", later), Some(Cached::Absent), "made here, empty");
    }

    #[test]
    fn a_held_back_reply_does_not_undo_a_grant_taken_after_its_recall() {
        // A link's reply held back by the server behind another mount's recall; meanwhile
        // this mount's inode was recalled (another mount chmodded it), and then granted
        // again, with current attributes, by an acquire sent after the recall. The reply,
        // arriving last, carries attributes from before the chmod: they must not replace
        // what the grant brought, nor be answered from while the inode is exclusive.
        let sent = Instant::now();
        let recall = sent + Duration::from_millis(35);
        let acquired = sent + Duration::from_millis(62);
        let replied = sent + Duration::from_millis(720);
        let mut c = NameCache::new(TTL);
        c.recall_rights(70, recall);
        c.recalled(70);
        let epoch = c.epoch();
        let mut current = attr(70, p::FileType::Regular);
        current.mode = 0o600;
        c.absorb_listing(67, &[item("g", 70)], epoch, acquired);
        c.grant_exclusive(70, acquired, acquired);
        c.hold_attr(&current, c.epoch(), acquired);
        assert_eq!(c.attr(70, acquired).map(|a| a.mode), Some(0o600));
        let mut old = attr(70, p::FileType::Regular);
        old.mode = 0o644;
        c.added_by_reply(9, b"e", &old, sent, replied);
        assert_ne!(c.attr(70, replied).map(|a| a.mode), Some(0o644), "the held-back reply's mode is older");
        assert!(c.is_exclusive(70), "the grant after the recall stands");
    }

    #[test]
    fn a_held_leaf_answers_found_and_absent_and_expires() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        assert_eq!(c.lookup(1, b"a", now), None);
        let e = c.epoch();
        c.absorb_leaf(1, &leaf_around(&[("a", 10), ("b", 11)]), e, now);
        assert_eq!(c.lookup(1, b"a", now), Some(Cached::Found(attr(10, p::FileType::Regular))));
        assert_eq!(c.lookup(1, b"zzz", now), Some(Cached::Absent));
        assert_eq!(c.lookup(2, b"a", now), None, "other directories are not held");
        assert_eq!(c.lookup(1, b"a", now + TTL), None, "expired");
        assert_eq!(c.lookup(1, &[b'x'; 300], now), None, "overlong names go to the server");
    }

    /// This mount made directory 20 and file 21 in it, named f: both held exclusively.
    fn made_exclusive_dir_with_f(c: &mut NameCache, now: Instant) {
        let d = attr(20, p::FileType::Directory);
        c.made_dir(&d, now);
        c.grant_exclusive(20, now, now);
        c.added(20, b"f", &attr(21, p::FileType::Regular), now);
        c.set_attr(&d, now); // (as writeback does: the directory's new attributes)
        c.grant_exclusive(21, now, now);
    }

    #[test]
    fn exclusive_inodes_never_expire_until_recalled() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        made_exclusive_dir_with_f(&mut c, now);
        let later = now + TTL * 10;
        assert_eq!(c.lookup(20, b"f", later), Some(Cached::Found(attr(21, p::FileType::Regular))), "pinned");
        assert_eq!(c.lookup(20, b"g", later), Some(Cached::Absent), "the whole directory is known");
        assert!(c.attr(20, later).is_some() && !c.known_empty(21));
        c.recall_rights(20, later);
        c.recalled(20);
        assert_eq!(c.lookup(20, b"g", later), None, "given up: the server is asked again");
        assert!(!c.is_exclusive(20) && c.is_exclusive(21));
    }

    #[test]
    fn a_broken_connection_or_a_restart_keeps_only_exclusive_state() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let e = c.epoch();
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), e, now);
        made_exclusive_dir_with_f(&mut c, now);
        c.drop_shared(now);
        assert_eq!(c.lookup(1, b"a", now), None, "shared: the server is asked again");
        assert_eq!(c.attr(10, now), None);
        assert_eq!(c.lookup(20, b"f", now), Some(Cached::Found(attr(21, p::FileType::Regular))), "exclusive: kept");
        assert_eq!(c.held_rights(now), vec![(20, true), (21, true)], "what a restored session re-asserts");
        assert_eq!(c.take_kernel_attr_invalidations(), vec![10], "the kernel forgets what was shared");
    }

    #[test]
    fn names_the_kernel_caches_under_shared_rights_go_with_a_recall_of_their_directory() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let e = c.epoch();
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), e, now);
        let ttl = c.kernel_shared_entry(1, b"a", now + TTL / 4);
        assert!(ttl > Duration::ZERO && ttl <= TTL * 3 / 4, "as long as the stretch is held: {ttl:?}");
        assert!(c.kernel_shared_entry(1, b"zz", now) > Duration::ZERO, "absent names too");
        assert_eq!(c.kernel_shared_entry(2, b"a", now), Duration::ZERO, "nothing held: not cached");
        assert!(!c.take_kernel_epoch(&[10]), "a file's recall leaves names alone");
        assert!(c.take_kernel_epoch(&[1]), "its directory's recall drops them all");
        assert!(!c.take_kernel_epoch(&[1]), "once");
        c.kernel_shared_entry(1, b"a", now);
        c.drop_shared(now);
        assert!(c.take_kernel_epoch(&[]), "shared state dropped without a recall");
        // Recalled a moment ago, a directory's names stay out of the kernel (each recall
        // would drop them all), until it has been quiet a while.
        let later = now + Duration::from_secs(5);
        c.recall_rights(1, later);
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), c.epoch(), later + SHARED_DIR_QUIET / 2);
        assert_eq!(c.kernel_shared_entry(1, b"a", later + SHARED_DIR_QUIET / 2), Duration::ZERO);
        assert!(!c.take_kernel_epoch(&[1]), "nothing to drop");
        assert!(c.kernel_shared_entry(1, b"a", later + SHARED_DIR_QUIET + Duration::from_millis(1)) > Duration::ZERO);
    }

    #[test]
    fn a_change_whose_answer_was_lost_drops_what_it_touched() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        made_exclusive_dir_with_f(&mut c, now);
        c.added(20, b"g", &attr(22, p::FileType::Regular), now);
        c.grant_exclusive(22, now, now);
        // An unlink of f sent to the server, applied and kept, answer lost.
        c.reply_lost(&[p::Op::Unlink { parent: 20, name: b"f".to_vec() }], now);
        assert!(!c.is_exclusive(20) && !c.is_exclusive(21), "the directory and the victim are given up");
        assert_eq!(c.lookup(20, b"f", now), None);
        assert!(c.is_exclusive(22) && c.attr(22, now).is_some(), "what it did not touch stays");
    }

    #[test]
    fn a_recall_that_overtakes_its_grant_wins() {
        // A create's reply released after a recall of the new inode (the server held the
        // reply back): the grant must not resurrect rights the server took back.
        let sent = Instant::now();
        let now = sent + Duration::from_millis(1);
        let mut c = NameCache::new(TTL);
        c.recall_rights(30, now);
        c.grant_exclusive(30, now, sent);
        assert!(!c.is_exclusive(30));
        // A second grant by the same reply (a hard-linked inode named twice in an acquired
        // directory) or by another sent before the recall is just as stale.
        c.grant_exclusive(30, now, sent);
        assert!(!c.is_exclusive(30), "every grant from before the recall is refused");
        c.grant_exclusive(30, now, now + Duration::from_millis(1));
        assert!(c.is_exclusive(30), "one sent after it is granted");
        // Held already, recalled, then granted again by a reply to a request sent before
        // the recall: the recall wins. One sent after the recall is granted.
        c.recall_rights(30, now);
        c.grant_exclusive(30, now, sent);
        assert!(!c.is_exclusive(30));
        let later = now + Duration::from_millis(1);
        c.recall_rights(31, now);
        c.grant_exclusive(31, later, later);
        assert!(c.is_exclusive(31), "a recall older than the request does not refuse");
    }

    #[test]
    fn an_entry_renamed_out_of_a_held_directory_is_invalidated_or_still_tracked() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        for ino in [60, 61, 62] {
            c.grant_exclusive(ino, now, now);
        }
        assert!(c.kernel_entry(60, b"a", 62));
        assert!(c.kernel_entry(60, b"b", 62));
        c.kernel_entry_moved(60, b"a", 61, b"a2"); // into a held directory: still tracked
        c.kernel_entry_moved(60, b"b", 99, b"b2"); // into one not held: invalidated soon
        assert_eq!(c.take_kernel_invalidations(), vec![(99, b"b2".to_vec())]);
        c.kernel_entry_moved(60, b"never", 99, b"x"); // never given a long timeout
        assert!(c.take_kernel_invalidations().is_empty());
        c.recall_rights(61, now);
        assert_eq!(c.take_kernel_invalidations(), vec![(61, b"a2".to_vec())]);
    }

    #[test]
    fn a_grant_pins_only_what_is_still_valid() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let d = attr(50, p::FileType::Directory);
        c.absorb_listing(50, &[], c.epoch(), now);
        c.hold_attr(&d, c.epoch(), now);
        let later = now + TTL * 2;
        c.grant_exclusive(50, later, later);
        assert_eq!(c.attr(50, later), None, "expired attributes are not brought back");
        assert_eq!(c.lookup(50, b"x", later), None, "nor an expired listing");
    }

    #[test]
    fn kernel_entries_are_handed_over_when_their_directory_is_given_up() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        assert!(!c.kernel_entry(40, b"a", 0), "not held: no long kernel timeout");
        c.grant_exclusive(40, now, now);
        c.grant_exclusive(41, now, now);
        assert!(c.kernel_entry(40, b"a", 41));
        assert!(c.kernel_entry(40, b"gone", 0), "negative entries too");
        assert!(!c.kernel_entry(40, b"b", 99), "an inode held by nobody here");
        assert!(c.take_kernel_invalidations().is_empty());
        c.recall_rights(40, now);
        let mut inval = c.take_kernel_invalidations();
        inval.sort();
        assert_eq!(inval, vec![(40, b"a".to_vec()), (40, b"gone".to_vec())]);
        c.grant_exclusive(42, now, now);
        assert!(c.kernel_entry(42, b"x", 0));
        c.reset_rights(now);
        assert_eq!(c.take_kernel_invalidations(), vec![(42, b"x".to_vec())], "a server restart gives all up");
        assert_eq!(c.exclusive_count(), 0);
    }

    #[test]
    fn held_rights_list_what_is_valid_and_a_reset_hands_their_attributes_to_the_kernel() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.grant_exclusive(50, now, now);
        let e = c.epoch();
        c.absorb_leaf(1, &leaf_around(&[("a", 51)]), e, now);
        c.hold_attr(&attr(52, p::FileType::Regular), c.epoch(), now);
        assert_eq!(c.held_rights(now), vec![(1, false), (50, true), (51, false), (52, false)]);
        assert_eq!(c.held_rights(now + TTL), vec![(50, true)], "shared rights end with what they cached");
        assert!(c.take_kernel_attr_invalidations().is_empty());
        c.reset_rights(now);
        let mut inval = c.take_kernel_attr_invalidations();
        inval.sort();
        assert_eq!(inval, vec![1, 50, 51, 52], "nobody will recall them now: the kernel forgets them");
        assert!(c.held_rights(now).is_empty());
    }

    #[test]
    fn emptiness_writeback_and_deferred_errors() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let d = attr(50, p::FileType::Directory);
        c.made_dir(&d, now);
        assert!(!c.known_empty(50), "only what is held exclusively");
        c.grant_exclusive(50, now, now);
        assert!(c.known_empty(50));
        c.added(50, b"f", &attr(51, p::FileType::Regular), now);
        assert!(!c.known_empty(50));
        c.removed(50, b"f");
        assert!(c.known_empty(50));
        c.begin_writeback(51);
        c.begin_writeback(51);
        assert!(!c.end_writeback(51) && c.writeback_pending(51));
        assert!(c.end_writeback(51) && !c.writeback_pending(51));
        let e = p::OpError { errno: 28, message: "full".into() };
        c.defer_error(51, e.clone());
        c.defer_error(51, p::OpError { errno: 5, message: "later".into() });
        assert_eq!(c.take_error(51), Some(e), "the first failure is the one reported");
        assert_eq!(c.take_error(51), None, "once");
        c.created_without_xattrs(51);
        assert!(!c.has_no_xattrs(51), "not held exclusively");
        c.grant_exclusive(51, now, now);
        assert!(c.has_no_xattrs(51));
        c.xattrs_changed(51);
        assert!(!c.has_no_xattrs(51));
    }

    #[test]
    fn a_rename_moves_the_entry_keeps_a_moved_directory_whole_and_drops_its_victim() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        for d in [60, 61] {
            c.made_dir(&attr(d, p::FileType::Directory), now);
            c.grant_exclusive(d, now, now);
        }
        let sub = attr(62, p::FileType::Directory);
        c.added(60, b"sub", &sub, now);
        c.made_dir(&sub, now);
        c.grant_exclusive(62, now, now);
        c.added(61, b"old", &attr(63, p::FileType::Directory), now);
        c.made_dir(&attr(63, p::FileType::Directory), now);
        let before = c.len();
        c.renamed(60, b"sub", 61, b"old", &sub, None, now);
        assert_eq!(c.lookup(60, b"sub", now), Some(Cached::Absent));
        assert_eq!(c.lookup(61, b"old", now), Some(Cached::Found(sub.clone())));
        assert!(c.known_empty(62), "the moved directory is still known whole");
        assert_eq!(c.lookup(63, b"x", now), None, "nothing is held of the replaced directory");
        assert_eq!(c.len(), before - 1);
        assert!(c.attr(60, now).is_none() && c.attr(61, now).is_none(), "both directories' times changed");

        // A file over a file with another link: the victim keeps its attributes, one link less.
        let mut two = attr(65, p::FileType::Regular);
        two.nlink = 2;
        c.added(60, b"v", &two, now);
        c.added(60, b"v2", &two, now);
        c.added(60, b"f", &attr(64, p::FileType::Regular), now);
        let one = p::Attr { nlink: 1, ..two.clone() };
        c.renamed(60, b"f", 60, b"v", &attr(64, p::FileType::Regular), Some(&one), now);
        assert_eq!(c.lookup(60, b"v", now), Some(Cached::Found(attr(64, p::FileType::Regular))));
        assert_eq!(c.lookup(60, b"v2", now), Some(Cached::Found(one)));
        assert_eq!(c.lookup(60, b"f", now), Some(Cached::Absent));
    }

    #[test]
    fn xattrs_of_inodes_created_here_are_held_while_exclusive() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.created_without_xattrs(70);
        assert!(c.held_xattrs(70).is_none(), "not held exclusively");
        assert!(!c.set_held_xattr(70, b"user.a", b"1"));
        c.grant_exclusive(70, now, now);
        assert!(c.has_no_xattrs(70));
        assert!(c.set_held_xattr(70, b"user.b", b"2") && c.set_held_xattr(70, b"user.a", b"1"));
        assert!(!c.has_no_xattrs(70));
        let names: Vec<&[u8]> = c.held_xattrs(70).map(|m| m.keys().map(Vec::as_slice).collect()).unwrap_or_default();
        assert_eq!(names, vec![&b"user.a"[..], b"user.b"]);
        assert!(c.remove_held_xattr(70, b"user.a") && !c.remove_held_xattr(70, b"user.a"));
        assert_eq!(c.held_xattrs(70).and_then(|m| m.get(&b"user.b"[..]).cloned()), Some(b"2".to_vec()));
        c.xattrs_changed(70);
        assert!(c.held_xattrs(70).is_none(), "changed through the server: no longer known complete");
        assert!(!c.set_held_xattr(70, b"user.c", b"3"));
        c.created_without_xattrs(71);
        c.grant_exclusive(71, now, now);
        c.recall_rights(71, now);
        c.grant_exclusive(71, now, now);
        assert!(c.held_xattrs(71).is_none(), "a recall forgets them for good");
    }

    #[test]
    fn a_partial_range_answers_only_inside_it() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let h = name_hash(b"inside");
        let leaf = DirLeaf { hash_lo: h, hash_hi: h, items: vec![] };
        c.absorb_leaf(1, &leaf, c.epoch(), now);
        assert_eq!(c.lookup(1, b"inside", now), Some(Cached::Absent));
        assert_eq!(c.lookup(1, b"outside", now), None);
        // An empty range (a damaged neighbour on the server) holds nothing.
        let mut c = NameCache::new(TTL);
        c.absorb_leaf(1, &DirLeaf { hash_lo: 1, hash_hi: 0, items: vec![] }, c.epoch(), now);
        assert_eq!(c.lookup(1, b"inside", now), None);
    }

    #[test]
    fn changes_made_here_keep_ranges_complete() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let d = attr(5, p::FileType::Directory);
        c.made_dir(&d, now);
        assert_eq!(c.lookup(5, b"f", now), Some(Cached::Absent), "a new directory is empty");
        c.added(5, b"f", &attr(6, p::FileType::Regular), now);
        assert_eq!(c.lookup(5, b"f", now), Some(Cached::Found(attr(6, p::FileType::Regular))));
        c.removed(5, b"f");
        assert_eq!(c.lookup(5, b"f", now), Some(Cached::Absent));
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_reply_fetched_before_a_local_change_is_not_absorbed() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let before = c.epoch();
        // The server answered the lookup before our create of "new" reached it…
        let stale = leaf_around(&[("old", 10)]);
        // …and the create completed first here.
        c.added(1, b"new", &attr(11, p::FileType::Regular), now);
        c.absorb_leaf(1, &stale, before, now);
        assert_ne!(c.lookup(1, b"new", now), Some(Cached::Absent), "must not regress");
        // Same for attributes: a write's newer size is not overwritten by an older leaf.
        let e = c.epoch();
        c.absorb_leaf(1, &leaf_around(&[("old", 10)]), e, now);
        let mut grown = attr(10, p::FileType::Regular);
        grown.size_bytes = 4096;
        let e2 = c.epoch();
        c.attr_changed(&grown);
        c.absorb_leaf(1, &leaf_around(&[("old", 10)]), e2, now);
        assert_eq!(c.lookup(1, b"old", now), Some(Cached::Found(grown)));
    }

    #[test]
    fn unlinking_an_unknown_name_forgets_multiply_linked_inodes() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        let mut two = attr(7, p::FileType::Regular);
        two.nlink = 2;
        let leaf = DirLeaf {
            hash_lo: 0,
            hash_hi: u64::MAX,
            items: vec![p::DirItem { name: b"l1".to_vec(), index: 1, attr: two }],
        };
        c.absorb_leaf(1, &leaf, c.epoch(), now);
        // The other link, in a directory not held, goes away: "l1" must not report nlink 2.
        c.removed(2, b"l2");
        assert_eq!(c.lookup(1, b"l1", now), None);
    }

    #[test]
    fn removing_a_directory_drops_what_was_held_in_it() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.made_dir(&attr(1, p::FileType::Directory), now);
        c.added(1, b"sub", &attr(5, p::FileType::Directory), now);
        c.made_dir(&attr(5, p::FileType::Directory), now);
        c.added(5, b"x", &attr(6, p::FileType::Regular), now);
        c.removed(5, b"x");
        c.removed(1, b"sub");
        assert_eq!(c.lookup(5, b"x", now), None);
        assert_eq!(c.lookup(1, b"sub", now), Some(Cached::Absent));
        assert!(c.is_empty());
    }

    #[test]
    fn a_recall_drops_attributes_and_entries_and_stale_fetches() {
        let now = Instant::now();
        let mut c = NameCache::new(TTL);
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), c.epoch(), now);
        assert!(c.attr(10, now).is_some());
        let before = c.epoch();
        c.recalled(1);
        assert_eq!(c.lookup(1, b"zzz", now), None, "the directory's entries went");
        assert!(c.attr(10, now).is_some(), "other inodes stay");
        c.recalled(10);
        assert_eq!(c.attr(10, now), None);
        // A reply fetched before the recall is not taken in.
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), before, now);
        assert_eq!(c.lookup(1, b"a", now), None);
    }

    #[test]
    fn zero_ttl_holds_nothing() {
        let now = Instant::now();
        let mut c = NameCache::new(Duration::ZERO);
        c.absorb_leaf(1, &leaf_around(&[("a", 10)]), c.epoch(), now);
        c.made_dir(&attr(2, p::FileType::Directory), now);
        assert_eq!(c.lookup(1, b"a", now), None);
        assert_eq!(c.lookup(2, b"a", now), None);
    }

    proptest::proptest! {
        /// Against a model directory: after any mix of server leaves and local changes,
        /// every answer the cache gives agrees with the model.
        #[test]
        fn answers_agree_with_the_directory(ops in proptest::collection::vec((0u8..4, 0u8..24, 0u8..24), 1..200)) {
            let now = Instant::now();
            let mut c = NameCache::new(TTL);
            let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
            let mut next_ino = 100;
            for (op, a, b) in ops {
                let name = format!("n{a}").into_bytes();
                match op {
                    0 => {
                        // The server sends a stretch between the hashes of two names.
                        let (x, y) = (name_hash(&name), name_hash(format!("n{b}").as_bytes()));
                        let (lo, hi) = (x.min(y), x.max(y));
                        let items = model.iter().filter(|(n, _)| (lo..=hi).contains(&name_hash(n)))
                            .map(|(n, i)| p::DirItem { name: n.clone(), index: *i, attr: attr(*i, p::FileType::Regular) })
                            .collect();
                        c.absorb_leaf(1, &DirLeaf { hash_lo: lo, hash_hi: hi, items }, c.epoch(), now);
                    }
                    1 => if !model.contains_key(&name) {
                        next_ino += 1;
                        model.insert(name.clone(), next_ino);
                        c.added(1, &name, &attr(next_ino, p::FileType::Regular), now);
                    },
                    2 => if model.remove(&name).is_some() {
                        c.removed(1, &name);
                    },
                    _ => {
                        let ok = match c.lookup(1, &name, now) {
                            None => true,
                            Some(Cached::Absent) => !model.contains_key(&name),
                            Some(Cached::Found(a)) => model.get(&name) == Some(&a.ino),
                        };
                        proptest::prop_assert!(ok, "wrong answer for {:?}", String::from_utf8_lossy(&name));
                    }
                }
            }
        }
    }
}
