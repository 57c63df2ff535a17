//! `crest-flood`: one hostile load on a server, over the raw wire protocol (issue 43), and
//! the honest probe whose latency is measured beside it (`bench/hostile.sh`).
//!
//! Each mode speaks `crest_proto` frames over plain TCP to a server run `--insecure`, as
//! a peer with a valid session may, and is bounded by what it sends (a fixed number of
//! requests in flight, rounds of a fixed size); it runs until its time is up or it is
//! signalled, then waits for what it has in flight (so the next measurement starts on a
//! quiet server) and prints one line of what it did:
//!
//! - `parked-reads`: a holder creates a sparse file (so holds it exclusively), readers on
//!   connections of their own pipeline many 4 MiB reads of it, which park behind the
//!   holder's rights; the holder answers the recall after a while and they all run.
//! - `fallocate`: allocates a large range of a file (one request, in as many ops as the
//!   protocol's step makes it), then punches it out again.
//! - `fence-storm`: many sessions each make one change, then all drop their connections
//!   at once (the server fences them 3 s later); again every few seconds.
//! - `recall-hoard`: acquires a directory (exclusive rights) and never answers the
//!   recall; once fenced, starts a new session and acquires it again.
//! - `lock-flood`: pipelined requests of many `SetLock` operations each.
//! - `fsync-flood`: pipelined requests of a small write and an fsync.

pub mod conn;
pub mod probe;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use crest_proto::{self as p, Op, Reply};

use conn::{attr_of, replies, Conn, Event, Recalls};

/// How long a setup call (a create, a lookup) may take before the flood gives up.
const SETUP_GUARD: Duration = Duration::from_secs(120);
/// How long the flood waits for what it has in flight after a signal.
const SIGNAL_DRAIN: Duration = Duration::from_secs(2);

/// When a run stops sending new work, and when it stops waiting for what is in flight.
#[derive(Clone, Debug)]
pub struct Stop {
    start: Instant,
    deadline: Option<Instant>,
    drain: Duration,
    /// Milliseconds after `start` when a signal came (`u64::MAX`: none).
    signalled_ms: Arc<AtomicU64>,
}

impl Stop {
    /// Stops sending after `seconds` (never, if `None`) or a signal; waits `drain` more
    /// for answers (2 s after a signal).
    pub fn new(seconds: Option<f64>, drain: Duration) -> Stop {
        let start = Instant::now();
        let deadline = seconds.map(|s| start + Duration::from_secs_f64(s.max(0.0)));
        Stop { start, deadline, drain, signalled_ms: Arc::new(AtomicU64::new(u64::MAX)) }
    }

    /// A signal came (from the signal thread).
    pub fn signal(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        let _ = self.signalled_ms.compare_exchange(u64::MAX, ms, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn signalled_at(&self) -> Option<Instant> {
        match self.signalled_ms.load(Ordering::SeqCst) {
            u64::MAX => None,
            ms => Some(self.start + Duration::from_millis(ms)),
        }
    }

    /// Whether new work may still be sent.
    pub fn sending(&self) -> bool {
        self.signalled_at().is_none() && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Whether to stop waiting for answers too.
    pub fn give_up(&self) -> bool {
        let now = Instant::now();
        match (self.signalled_at(), self.deadline) {
            (Some(s), _) => now >= s + SIGNAL_DRAIN,
            (None, Some(d)) => now >= d + self.drain,
            (None, None) => false,
        }
    }

    /// Sleeps up to `d`, less if sending should stop meanwhile.
    pub fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while self.sending() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// Seconds since the run started.
    pub fn elapsed_secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// What a flood did: counters and maxima, printed as `key=value`.
#[derive(Debug, Default)]
pub struct Tally {
    values: BTreeMap<&'static str, u64>,
    /// The first error an operation got (the flood went on).
    pub first_error: Option<String>,
}

impl Tally {
    /// Adds `n` to counter `key`.
    pub fn add(&mut self, key: &'static str, n: u64) {
        *self.values.entry(key).or_insert(0) += n;
    }

    /// Raises `key` to `v` if it is below.
    pub fn max(&mut self, key: &'static str, v: u64) {
        let e = self.values.entry(key).or_insert(0);
        *e = (*e).max(v);
    }

    /// Notes a failed operation (counted under `key`; the first message kept).
    pub fn error(&mut self, key: &'static str, e: impl std::fmt::Display) {
        self.add(key, 1);
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    /// `key=value …`.
    pub fn fields(&self) -> String {
        self.values.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

/// Where a flood runs and when it stops.
pub struct Target {
    /// The server's address (HOST:PORT; a server run `--insecure`).
    pub addr: String,
    /// When to stop.
    pub stop: Stop,
}

impl Target {
    /// A new session on a connection of its own.
    fn conn(&self, recalls: Recalls) -> Result<Conn> {
        Conn::connect(&self.addr, "crest-flood", recalls)
    }
}

/// Milliseconds in `d`.
fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Creates `name` (a file, or a directory with `dir`) in `parent`; its inode.
fn create(c: &mut Conn, parent: u64, name: &str, dir: bool) -> Result<u64> {
    let kind = if dir { p::FileType::Directory } else { p::FileType::Regular };
    let mode = if dir { 0o755 } else { 0o644 };
    let op = Op::Create { parent, name: name.as_bytes().to_vec(), kind, mode, rdev: 0, cred: p::Cred::default() };
    let r = c.call(vec![op], SETUP_GUARD).with_context(|| format!("creating {name}"))?;
    Ok(attr_of(r.first().ok_or_else(|| anyhow!("no reply to a create"))?)?.ino)
}

/// Creates a directory of the flood's own in the root (and says goodbye, so no session
/// of the flood holds it): its inode.
fn flood_dir(t: &Target, mode: &str) -> Result<u64> {
    let mut c = t.conn(Recalls::Answer)?;
    let ino = create(&mut c, 1, &format!("crest-flood-{mode}-{}", std::process::id()), true)?;
    c.goodbye();
    Ok(ino)
}

/// The inode at `path` (components split by `/`) below the root.
fn resolve(c: &mut Conn, path: &str) -> Result<u64> {
    let mut ino = 1;
    for name in path.split('/').filter(|n| !n.is_empty()) {
        let r = c.call(vec![Op::Lookup { parent: ino, name: name.as_bytes().to_vec() }], SETUP_GUARD)?;
        ino = attr_of(r.first().ok_or_else(|| anyhow!("no reply to a lookup"))?).with_context(|| name.to_string())?.ino;
    }
    Ok(ino)
}

/// xorshift64*, for read offsets.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `parked-reads`'s settings.
#[derive(Clone, Copy, Debug)]
pub struct ParkedReads {
    /// Reader connections (sessions).
    pub readers: usize,
    /// 4 MiB reads each reader sends a round.
    pub reads: u64,
    /// How long the holder keeps the reads parked before it answers the recall.
    pub hold: Duration,
}

/// Rounds of: a holder creates a sparse file, readers park `reads` 4 MiB reads each on
/// it, the holder answers the recall after `hold`, every read is answered, the file goes.
pub fn parked_reads(t: &Target, s: ParkedReads, tally: &mut Tally) -> Result<()> {
    let dir = flood_dir(t, "parked-reads")?;
    let mut holder = t.conn(Recalls::Forward)?;
    let mut readers = (0..s.readers).map(|_| t.conn(Recalls::Answer)).collect::<Result<Vec<_>>>()?;
    let size = 1u64 << 36;
    let max = u64::from(p::MAX_IO_BYTES);
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    let mut round = 0u64;
    while t.stop.sending() {
        let name = format!("held-{round}");
        let ino = create(&mut holder, dir, &name, false)?;
        let set = p::SetAttr { size_bytes: Some(size), ..Default::default() };
        holder.call(vec![Op::SetAttr { ino, set }], SETUP_GUARD)?;
        // (A recall left from the round before is answered now, not taken for this one's.)
        while let Some(e) = holder.next_event(Duration::ZERO)? {
            if let Event::Recall { recall_id } = e {
                holder.recall_done(recall_id)?;
            }
        }
        for r in &mut readers {
            let batches = (0..s.reads)
                .map(|_| vec![Op::Read { ino, offset: next(&mut rng) % (size - max), len: p::MAX_IO_BYTES }]);
            r.send_many(batches.collect())?;
        }
        tally.add("reads_sent", s.reads * s.readers as u64);
        // The reads park; the holder is recalled.
        let asked = Instant::now();
        let recall = loop {
            match holder.next_event(Duration::from_millis(100))? {
                Some(Event::Recall { recall_id }) => break Some(recall_id),
                Some(Event::Fenced) => bail!("the holder was fenced"),
                Some(Event::Closed(why)) => bail!("the holder's connection: {why}"),
                Some(_) => {}
                None if asked.elapsed() > Duration::from_secs(30) || t.stop.give_up() => break None,
                None => {}
            }
        };
        match recall {
            Some(id) => {
                tally.add("recalls", 1);
                std::thread::sleep(s.hold.saturating_sub(asked.elapsed()));
                holder.recall_done(id)?;
            }
            None => tally.add("no_recall", 1),
        }
        let released = Instant::now();
        for r in &mut readers {
            drain_reads(r, s.reads, &t.stop, tally)?;
        }
        tally.max("release_to_last_answer_ms_max", ms(released.elapsed()));
        holder.call(vec![Op::Unlink { parent: dir, name: name.into_bytes() }], SETUP_GUARD)?;
        round += 1;
        tally.add("rounds", 1);
    }
    holder.goodbye();
    readers.into_iter().for_each(Conn::goodbye);
    Ok(())
}

/// Takes the answers to `n` reads from `r` (until `stop` gives up).
fn drain_reads(r: &mut Conn, n: u64, stop: &Stop, tally: &mut Tally) -> Result<()> {
    let mut got = 0;
    while got < n {
        match r.next_event(Duration::from_millis(100))? {
            Some(Event::Response { response, data_bytes }) => {
                got += 1;
                tally.add("read_bytes", data_bytes);
                match response.results.first() {
                    Some(Ok(_)) => tally.add("reads_ok", 1),
                    Some(Err(e)) => tally.error("reads_failed", format!("read: errno {}: {}", e.errno, e.message)),
                    None => tally.error("reads_failed", "a read answered with no result"),
                }
            }
            Some(Event::Fenced) => bail!("a reader was fenced"),
            Some(Event::Closed(why)) => bail!("a reader's connection: {why}"),
            Some(Event::Recall { .. }) => {}
            None if stop.give_up() => {
                tally.add("reads_abandoned", n - got);
                return Ok(());
            }
            None => {}
        }
    }
    Ok(())
}

/// Sends `ops` and waits for the answer (until `stop` gives up): how long it took and the
/// replies (none if one failed: tallied under `failed`), or `None` if abandoned.
fn timed(
    c: &mut Conn,
    ops: Vec<Op>,
    stop: &Stop,
    tally: &mut Tally,
    failed: &'static str,
) -> Result<Option<(Duration, Vec<Reply>)>> {
    let start = Instant::now();
    let id = c.send(ops)?;
    let Some(r) = c.wait_for(id, || stop.give_up())? else {
        tally.add("abandoned", 1);
        return Ok(None);
    };
    let took = start.elapsed();
    match replies(r) {
        Ok(r) => Ok(Some((took, r))),
        Err(e) => {
            tally.error(failed, e);
            Ok(Some((took, Vec::new())))
        }
    }
}

/// Rounds of: fallocate `mib` MiB of a file (one request of as many ops as
/// `MAX_FALLOCATE_STEP` makes it), then punch them out again.
pub fn fallocate(t: &Target, mib: u64, tally: &mut Tally) -> Result<()> {
    let dir = flood_dir(t, "fallocate")?;
    let mut c = t.conn(Recalls::Answer)?;
    let ino = create(&mut c, dir, "big", false)?;
    let len = mib << 20;
    while t.stop.sending() {
        // (The heaviest requests the server takes, back to back: one step each, as a
        // mount sends them.)
        let start = Instant::now();
        let mut last = None;
        for (offset, step) in p::fallocate_steps(0, len, 0) {
            let op = Op::Fallocate { ino, offset, len: step, flags: 0 };
            let Some((took, replies)) = timed(&mut c, vec![op], &t.stop, tally, "allocs_failed")? else { break };
            tally.max("step_ms_max", ms(took));
            last = replies.last().cloned();
        }
        if let Some(Reply::Attr(a)) = last {
            tally.max("allocated_mib_max", a.blocks_4k / 256);
        }
        tally.add("allocs", 1);
        tally.add("alloc_ms_total", ms(start.elapsed()));
        tally.max("alloc_ms_max", ms(start.elapsed()));
        let punch = Op::Fallocate { ino, offset: 0, len, flags: p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_KEEP_SIZE };
        let Some((took, _)) = timed(&mut c, vec![punch], &t.stop, tally, "punches_failed")? else { break };
        tally.add("punches", 1);
        tally.max("punch_ms_max", ms(took));
        if tally.first_error.is_some() {
            // (Out of space, say: do not spin on it.)
            t.stop.sleep(Duration::from_secs(1));
        }
    }
    c.goodbye();
    Ok(())
}

/// `fence-storm`'s settings.
#[derive(Clone, Copy, Debug)]
pub struct FenceStorm {
    /// Sessions a round.
    pub sessions: usize,
    /// Time from one round's start to the next.
    pub every: Duration,
}

/// Rounds of: `sessions` sessions each create a file, then all drop their connections
/// at once.
pub fn fence_storm(t: &Target, s: FenceStorm, tally: &mut Tally) -> Result<()> {
    let dir = flood_dir(t, "fence-storm")?;
    let mut round = 0u64;
    while t.stop.sending() {
        let start = Instant::now();
        // A few sessions at a time (the server keeps at most 64 connections of one
        // address before their hello).
        let workers = 16.min(s.sessions.max(1));
        let opened: Vec<Result<Conn>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    scope.spawn(move || {
                        (w..s.sessions)
                            .step_by(workers)
                            .map(|i| {
                                let mut c = t.conn(Recalls::Answer)?;
                                create(&mut c, dir, &format!("r{round}-s{i}"), false)?;
                                Ok(c)
                            })
                            .collect::<Vec<Result<Conn>>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|_| vec![Err(anyhow!("a worker panicked"))]))
                .collect()
        });
        let mut conns = Vec::new();
        for c in opened {
            match c {
                Ok(c) => conns.push(c),
                Err(e) => tally.error("sessions_failed", format!("{e:#}")),
            }
        }
        tally.add("sessions_changed", conns.len() as u64);
        tally.max("round_setup_ms_max", ms(start.elapsed()));
        // All at once, no goodbye.
        conns.into_iter().for_each(Conn::cut);
        round += 1;
        tally.add("rounds", 1);
        t.stop.sleep(s.every.saturating_sub(start.elapsed()));
    }
    Ok(())
}

/// Acquires directory `ino` on `c`, asking again every half second while the server
/// refuses (another session changes it: EBUSY); false if the run stopped first.
fn acquire(c: &mut Conn, ino: u64, stop: &Stop, tally: &mut Tally) -> Result<bool> {
    while stop.sending() {
        let asked = Instant::now();
        let id = c.send(vec![Op::Acquire { ino }])?;
        let Some(r) = c.wait_for(id, || !stop.sending())? else { return Ok(false) };
        match replies(r) {
            Ok(_) => {
                tally.add("acquired", 1);
                tally.max("acquire_ms_max", ms(asked.elapsed()));
                return Ok(true);
            }
            Err(e) => {
                tally.error("acquire_refused", format!("acquire: {e:#}"));
                stop.sleep(Duration::from_millis(500));
            }
        }
    }
    Ok(false)
}

/// Acquires the directory at `path` and never answers its recall; when fenced for it (or
/// cut off), starts a new session and acquires it again.
pub fn recall_hoard(t: &Target, path: &str, tally: &mut Tally) -> Result<()> {
    while t.stop.sending() {
        let mut c = t.conn(Recalls::Hoard)?;
        let ino = resolve(&mut c, path).with_context(|| format!("looking up {path}"))?;
        if !acquire(&mut c, ino, &t.stop, tally)? {
            c.goodbye();
            break;
        }
        let mut recalled: Option<Instant> = None;
        let fenced = loop {
            match c.next_event(Duration::from_millis(100))? {
                Some(Event::Recall { .. }) => {
                    tally.add("recalls_hoarded", 1);
                    recalled.get_or_insert_with(Instant::now);
                }
                Some(Event::Fenced) => break true,
                Some(Event::Closed(_)) => break false,
                Some(Event::Response { .. }) => {}
                None if !t.stop.sending() => break false,
                None if recalled.is_some_and(|r| r.elapsed() > Duration::from_secs(60)) => break false,
                None => {}
            }
        };
        if let Some(r) = recalled {
            tally.max("recall_held_ms_max", ms(r.elapsed()));
        }
        if fenced {
            tally.add("fenced", 1);
            c.cut();
        } else if t.stop.sending() {
            tally.add("cut_off", 1);
            c.cut();
        } else {
            // The end: give the directory back.
            c.goodbye();
        }
    }
    Ok(())
}

/// Keeps `depth` requests of `make(n)` in flight on `c` until the run stops; tallies
/// each request's time, and failed operations under `failed`.
fn pipeline(
    c: &mut Conn,
    stop: &Stop,
    depth: usize,
    tally: &mut Tally,
    failed: &'static str,
    mut make: impl FnMut(u64) -> Vec<Op>,
) -> Result<()> {
    let mut sent: HashMap<u64, Instant> = HashMap::new();
    let mut n = 0u64;
    loop {
        while stop.sending() && sent.len() < depth.max(1) {
            let id = c.send(make(n))?;
            sent.insert(id, Instant::now());
            n += 1;
        }
        if sent.is_empty() {
            return Ok(());
        }
        match c.next_event(Duration::from_millis(100))? {
            Some(Event::Response { response, .. }) => {
                let Some(at) = sent.remove(&response.id) else { continue };
                tally.add("requests", 1);
                tally.max("request_ms_max", ms(at.elapsed()));
                for r in &response.results {
                    match r {
                        Ok(_) => tally.add("ops_ok", 1),
                        Err(e) => tally.error(failed, format!("errno {}: {}", e.errno, e.message)),
                    }
                }
            }
            Some(Event::Fenced) => bail!("the session was fenced"),
            Some(Event::Closed(why)) => bail!("connection lost: {why}"),
            Some(Event::Recall { .. }) => {}
            None if stop.give_up() => {
                tally.add("abandoned", sent.len() as u64);
                return Ok(());
            }
            None => {}
        }
    }
}

/// Pipelined requests of `ops` `SetLock`s each on one file that first gets as many other
/// locks as a session may keep on it (each operation then looks at them all): one owner's
/// write and read locks on `ops` separate bytes, the kind alternating request by request
/// (so each operation changes a lock).
pub fn lock_flood(t: &Target, ops: usize, depth: usize, tally: &mut Tally) -> Result<()> {
    let dir = flood_dir(t, "lock-flood")?;
    let mut c = t.conn(Recalls::Answer)?;
    let ino = create(&mut c, dir, "locked", false)?;
    let ops = ops.clamp(1, p::MAX_LOCK_OPS_PER_REQUEST) as u64;
    let pid = std::process::id();
    let lock = |owner, start: u64, kind| Op::SetLock { ino, owner, start, end: start, kind, flock: false, pid };
    let kept = (p::locks::MAX_LOCKS_PER_SESSION_FILE as u64).saturating_sub(ops);
    let mut first = 0;
    while first < kept {
        let batch: Vec<Op> =
            (first..kept.min(first + ops)).map(|i| lock(2, (1 << 40) + 2 * i, p::LockKind::Read)).collect();
        first += batch.len() as u64;
        c.call(batch, SETUP_GUARD).context("taking the locks the file keeps")?;
    }
    pipeline(&mut c, &t.stop, depth, tally, "locks_failed", |n| {
        let kind = if n % 2 == 0 { p::LockKind::Write } else { p::LockKind::Read };
        (0..ops).map(|i| lock(1, 2 * i, kind)).collect()
    })?;
    c.goodbye();
    Ok(())
}

/// Pipelined requests of a `bytes`-byte write and an fsync of one file.
pub fn fsync_flood(t: &Target, bytes: usize, depth: usize, tally: &mut Tally) -> Result<()> {
    let dir = flood_dir(t, "fsync-flood")?;
    let mut c = t.conn(Recalls::Answer)?;
    let ino = create(&mut c, dir, "synced", false)?;
    let data = vec![0xa5_u8; bytes];
    pipeline(&mut c, &t.stop, depth, tally, "ops_failed", |n| {
        let offset = (n % 256) * bytes as u64;
        vec![Op::Write { ino, offset, data: data.clone() }, Op::Fsync { ino }]
    })?;
    c.goodbye();
    Ok(())
}

/// Prints a flood's line: `crest-flood mode=… secs=… key=value…`.
pub fn report(mode: &str, stop: &Stop, tally: &Tally) -> String {
    format!("crest-flood mode={mode} secs={:.2} {}", stop.elapsed_secs(), tally.fields())
}
