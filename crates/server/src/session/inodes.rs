//! Inode numbers granted ahead (`Op::AllocInodes`): how many one session may hold unused,
//! and where the unused ones of a session that ended go.
//!
//! The store hands numbers out from a counter per dataset that never goes back, over a
//! range of 2^40; a client asking in a loop could use it up, and every create in the
//! dataset would then fail. So a session holds at most `MAX_UNUSED_GRANTED` numbers
//! granted and unused, and when it ends (cleanly, fenced, or dropped after a restart its
//! client never came back from) what it did not use goes to the dataset's `InodePool`,
//! which later grants draw from before the counter moves. What the counter can be made
//! to advance is then bounded by the sessions alive at once (`MAX_SESSIONS_PER_IDENTITY`
//! per client identity) times the bound.
//!
//! Crash safety. The pool lives in memory only: a restart forgets it, and its numbers are
//! never granted again (a leak, which the store's counter never notices). A range goes
//! into the pool only as its session's durable record stops naming it (the record is
//! deleted or rewritten in the same store transaction), so no later commit holds both
//! the old holder's record naming it and a new holder's. A grant drawn from the pool is
//! committed before it is answered: a change lost in a crash is replayed after the
//! restart, and a replayed grant must get the numbers it got the first time (its client
//! may have used them in creates it answered itself); the counter, rolled back with the
//! store, gives them again (`Server::unsettled` keeps other sessions off it meanwhile),
//! the forgotten pool could not. For the same reason a replay never draws from the pool.

use super::*;

/// Most inode numbers a session may hold granted and unused: two of the largest grants.
/// A mount asks for a batch when it has used the last one (`INODE_BATCH`, 4096), so it
/// holds far fewer, but for the batches it dropped unused when the server forgot its
/// rights.
pub const MAX_UNUSED_GRANTED: u64 = 2 * p::MAX_INODE_GRANT as u64;

/// Most ranges a dataset's pool keeps: beyond them the smallest is forgotten (its numbers
/// leak). Ranges a session leaves are broken up only by numbers it used, so a pool this
/// large is filled only by someone who made as many files.
const MAX_POOLED_RANGES: usize = 4096;

/// A grant refused because the session holds `MAX_UNUSED_GRANTED` already: EDQUOT. (Its
/// client then creates through the server, which picks the numbers.)
const EDQUOT: i32 = p::errno::EDQUOT;

/// Unused numbers of ended sessions, by dataset (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct InodePool {
    datasets: HashMap<u64, Ranges>,
    /// Nothing is pooled (`Server::reuse_inode_numbers`).
    off: bool,
}

/// One dataset's pooled ranges, by their first number and by their length.
#[derive(Debug, Default)]
struct Ranges {
    /// First number → end (exclusive). Ranges never touch: adjacent ones are joined.
    by_start: BTreeMap<u64, u64>,
    /// (length, first number), to find the largest and the smallest.
    by_len: BTreeSet<(u64, u64)>,
}

impl Ranges {
    fn insert(&mut self, start: u64, end: u64) {
        self.by_start.insert(start, end);
        self.by_len.insert((end - start, start));
    }

    fn remove(&mut self, start: u64) -> Option<u64> {
        let end = self.by_start.remove(&start)?;
        self.by_len.remove(&(end - start, start));
        Some(end)
    }
}

impl InodePool {
    /// Takes `r` back into `dataset`'s pool.
    pub(super) fn give_back(&mut self, dataset: u64, r: std::ops::Range<u64>) {
        if r.is_empty() || self.off {
            return;
        }
        let ranges = self.datasets.entry(dataset).or_default();
        let (mut start, mut end) = (r.start, r.end);
        if let Some((&s, &e)) = ranges.by_start.range(..=start).next_back() {
            if e >= start {
                // (Never more than touching: a number is pooled once.)
                ranges.remove(s);
                start = s;
                end = end.max(e);
            }
        }
        if let Some(e) = ranges.by_start.get(&end).copied() {
            ranges.remove(end);
            end = e;
        }
        ranges.insert(start, end);
        if ranges.by_start.len() > MAX_POOLED_RANGES {
            if let Some(&(_, smallest)) = ranges.by_len.first() {
                ranges.remove(smallest);
            }
        }
    }

    /// Up to `count` numbers in a row from `dataset`'s pool (from its largest range).
    pub(super) fn take(&mut self, dataset: u64, count: u64) -> Option<std::ops::Range<u64>> {
        let ranges = self.datasets.get_mut(&dataset)?;
        let &(_, start) = ranges.by_len.last()?;
        let end = ranges.remove(start)?;
        let taken = start..end.min(start.saturating_add(count));
        if taken.end < end {
            ranges.insert(taken.end, end);
        }
        if ranges.by_start.is_empty() {
            self.datasets.remove(&dataset);
        }
        Some(taken)
    }

    /// Forgets every pooled number: a dataset was rolled back, destroyed or received
    /// into, and its counter may have gone back below them.
    pub(super) fn forget_all(&mut self) {
        self.datasets.clear();
    }

    /// How many numbers `dataset`'s pool holds (for tests).
    #[cfg(test)]
    pub(super) fn pooled(&self, dataset: u64) -> u64 {
        self.datasets.get(&dataset).map_or(0, |r| r.by_start.iter().map(|(s, e)| e - s).sum())
    }
}

impl Session {
    /// How many numbers it holds granted and unused.
    fn unused_granted(&self) -> u64 {
        self.granted.as_ref().map_or(0, |g| g.iter().map(|r| r.end - r.start).sum())
    }
}

impl Server {
    /// Whether the unused inode numbers of sessions that ended are granted again (on by
    /// default). A simulator whose model of the file system hands numbers out from the
    /// counter alone turns it off.
    pub fn reuse_inode_numbers(&mut self, on: bool) {
        self.inode_pool.off = !on;
        if !on {
            self.inode_pool.forget_all();
        }
    }

    /// `Op::AllocInodes`: up to `count` numbers in a row for `session`'s creates, from its
    /// dataset's pool if it has some, else from the store's counter; no more than keeps
    /// what it holds unused within `MAX_UNUSED_GRANTED` (EDQUOT when that leaves none).
    pub(super) fn alloc_inodes(&mut self, session: SessionId, count: u32, root: u64) -> Result<Reply, Failure> {
        let Some(s) = self.sessions.get(&session) else {
            return Err(Failure::Wire(errno(p::errno::EINVAL, "no session")));
        };
        if s.granted.is_none() {
            // Restored from a record that kept no grants: it may use any number reserved
            // and unused, so nothing it is given could be counted against it, nor taken
            // back. It creates through the server until its client starts a new session.
            return Err(Failure::Wire(errno(EDQUOT, "this session keeps no count of its grants: no more are given")));
        }
        let (dataset, held) = (s.dataset, s.unused_granted());
        let room = MAX_UNUSED_GRANTED.saturating_sub(held);
        let count = u64::from(count.clamp(1, p::MAX_INODE_GRANT)).min(room);
        if count == 0 {
            let why = format!("{held} inode numbers granted and unused already (at most {MAX_UNUSED_GRANTED})");
            return Err(Failure::Wire(errno(EDQUOT, why)));
        }
        let replay = self.grace || self.replaying_now || self.replaying.contains(&session);
        let pooled = if replay { None } else { self.inode_pool.take(dataset, count) };
        let range = match pooled {
            Some(r) => {
                self.commit_after_change = true;
                r
            }
            None => {
                let first = self.store.reserve_inode_numbers(root, count)?;
                first..first + count
            }
        };
        let granted = u32::try_from(range.end - range.start).unwrap_or(p::MAX_INODE_GRANT);
        let first = range.start;
        let evicted = self.sessions.get_mut(&session).and_then(|s| s.grant(range));
        if let Some(old) = evicted {
            // (Its record, rewritten at the end of this change, no longer names it.)
            self.inode_pool.give_back(dataset, old);
        }
        Ok(Reply::Inodes { first, count: granted })
    }

    /// What `s`, a session that ended, did not use of its grants goes to its dataset's
    /// pool. `record_gone`: its durable record was deleted (or it never had one).
    pub(super) fn pool_unused(&mut self, id: SessionId, s: &Session, record_gone: bool) {
        let Some(granted) = &s.granted else { return };
        if !record_gone {
            // A crash could restore it naming them: they are not given to another.
            tracing::warn!(session = id, "unused inode numbers of an ended session not reused");
            return;
        }
        for r in granted {
            self.inode_pool.give_back(s.dataset, r.clone());
        }
    }
}
