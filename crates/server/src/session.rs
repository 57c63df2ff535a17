//! Sessions and the step that takes a request through the server: `handle` (waiting,
//! pins, the order a session's changes take and their responses go out in) and
//! `handle_request` (one request's operations and the rights their replies grant). Its
//! rooms: `replies` (the reply cache), `durability` (store units and commits), `lease`
//! (leases and fencing), `dispatch` (one operation against the store), `parking`
//! (requests waiting on other sessions' rights), `record` (the durable session record)
//! and `restart` (the grace period).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crest_proto::{self as p, Op, Reply};
use crest_store::{self as s, Store};

use crate::acl;
use crate::authz::{self, Policy};
use crate::caps::{Caps, Outgoing};
use crate::contention::Contention;
use crate::convert::{attr_out, error_out, kind_in, time_in};
use crate::locks::{self, LockTable};
use crate::space::SpaceWatch;

mod activity;
mod admin;
pub use admin::AdminStart;
mod datasets;
mod dispatch;
mod durability;
mod lease;
mod objects;
mod parking;
mod privs;
use parking::Pin;
pub use parking::{PARKED_SLICE, PARKED_SLICE_BYTES};
mod elsewhere;
pub use elsewhere::{PlannedRead, WriteSums};
mod inodes;
pub use inodes::MAX_UNUSED_GRANTED;
mod record;
pub(crate) use record::fuzz_record;
mod replies;
mod service;
pub use service::SERVICE_BUCKETS_US;
mod restart;
mod room;
mod sendrecv;
#[cfg(test)]
mod tests;

pub(crate) use dispatch::Failure;
use dispatch::{carried, op_inode, op_inodes, take_write_backs};
use durability::settle_inodes;
pub use durability::COMMIT_AFTER_WRITTEN_BYTES;
pub use lease::RESTORED_SESSION_GRACE_MS;
use record::{decode_record, encode_fenced_marker, encode_record, is_fenced_marker, Record, MAX_RECORD_HOLES};
use replies::Replies;
pub use replies::{REPLY_CACHE_BYTES, REPLY_CACHE_ENTRIES};
use restart::{hold_orphans, reclaim_orphans};
use room::Room;

/// Most distinct name hashes (about: entries) around the looked-up name a lookup reply
/// carries from its directory leaf.
pub const LOOKUP_NEIGHBOURS: usize = 64;
/// Most items one readdir reply carries.
pub const READDIR_MAX_ITEMS: u32 = 1024;

/// A session number.
pub type SessionId = u64;

/// No session (ids start at 1): recalls the server makes on its own behalf.
const NO_SESSION: SessionId = 0;

#[derive(Debug, Default)]
struct Session {
    secret: u64,
    client_name: String,
    /// The protocol version its latest hello agreed (`p::agree_version`); 0 for a session
    /// restored after a restart until its client says hello again.
    protocol: u32,
    /// Where its latest connection came from (`set_peer`; status only).
    peer: String,
    /// Its responses to changes, kept for retries.
    replies: Replies,
    /// Handles this session holds open, by inode (released when the session ends), each
    /// with the access its `Open` was granted (`p::OPEN_*`; 0 until the `Open` has run: an
    /// open that takes effect as it arrives is not checked yet).
    open: HashMap<u64, HashMap<u64, u32>>,
    /// Changing requests numbered so far (the last one's `seq`): a change takes its `seq`
    /// when it arrives, so that `seq` is its place in the order the client sent them,
    /// even when it is parked and runs after later ones (docs/protocol.md §4.5).
    applied: u64,
    /// The highest `seq` of a change that has run.
    top: u64,
    /// Changes that arrived and wait (parked) with the `seq` each took, by request id.
    reserved: BTreeMap<u64, u64>,
    /// Changes run through `Server::handle`, counted.
    ran: u64,
    /// Changes run whose responses have not gone out: request id → when it ran.
    run_order: HashMap<u64, u64>,
    /// Their responses that are ready, by when they ran (waiting for earlier ones).
    unreleased: BTreeMap<u64, p::Response>,
    /// The last `top` known to be committed (changes up to it have run and are durable,
    /// but for `holes`).
    durable: u64,
    /// After a restart: places at or below `durable` whose changes never ran (they waited
    /// when the last commit was made), from the record.
    holes: Vec<u64>,
    /// Restored from its record after a restart and not yet resumed by its client;
    /// dropped at this time (set on the first tick) if the client never comes back.
    awaiting_resume: Option<Option<u64>>,
    /// Resumed after a restart, and nothing heard from it since its hello: its welcome
    /// (with `durable_seq` and `holes`) may have been lost with the connection, so a
    /// second resume is told the same again — else its client would send again, as if
    /// the server still had them in its reply cache, changes that ran and were kept.
    restart_unconfirmed: bool,
    /// Its durable record has been written (by a change, or by its first lock): after a
    /// restart it is restored, and the grace period waits for its client, which replays
    /// its changes and takes its locks again (docs/protocol.md §4.5).
    recorded: bool,
    /// What its client may do (`set_policy`); `None`: trusted (`Policy::trusted`).
    policy: Option<std::sync::Arc<Policy>>,
    /// Inode numbers granted to it (`AllocInodes`) and not used yet: its `CreateAt`s and
    /// `SymlinkAt`s may use only these, each once. Kept in its durable record, so a session
    /// restored after a restart has them still; `None` only for one restored from a record
    /// written before records kept them: it may use any number reserved and unused in its
    /// dataset (the store checks that).
    granted: Option<Vec<std::ops::Range<u64>>>,
    /// The dataset it mounts (`Hello::dataset`): it sees its root as inode 1, and every
    /// inode it names is taken as one of this dataset (`datasets.rs`).
    dataset: u64,
    /// `granted` changed in the running change: its record is written again at its end.
    grants_changed: bool,
    /// Its client's identity (the certificate's name; empty for sessions told none), kept
    /// in its durable record: only that identity may resume it. `None` only for one
    /// restored from a record written before records kept it, until its client resumes.
    identity: Option<String>,
    /// The requests that changed nothing and ran while it replayed after a restart (its
    /// re-asserts: locks, handles and rights taken again), with their answers, by id. One
    /// sent again after a reconnect (its answer lost) ran already and is answered from
    /// here: run again, behind what its client sent after it (new work held for the grace
    /// period), it would take back a lock or a handle let go of since.
    reasserted: HashMap<u64, (Vec<Op>, p::Response)>,
}

/// Most sessions one client identity holds at once (connected or not yet fenced): a
/// client reconnecting in a loop cannot fill the server with sessions.
pub const MAX_SESSIONS_PER_IDENTITY: usize = 256;

/// Ranges of granted inode numbers a session keeps (beyond them, the oldest go): as many
/// as its durable record holds.
const MAX_GRANTED_RANGES: usize = record::MAX_RECORD_GRANTS;

impl Session {
    /// Takes `ino` out of the session's grants; false if it was not granted.
    fn use_granted(&mut self, ino: u64) -> bool {
        let Some(granted) = &mut self.granted else { return true };
        let Some(i) = granted.iter().position(|r| r.contains(&ino)) else { return false };
        self.grants_changed = true;
        let r = granted.remove(i);
        if ino + 1 < r.end {
            granted.insert(i, ino + 1..r.end);
        }
        if r.start < ino {
            granted.insert(i, r.start..ino);
        }
        true
    }

    /// Grants `range`; returns the oldest range it held if it now holds more than
    /// `MAX_GRANTED_RANGES` (no longer its own: for the pool, `inodes.rs`).
    fn grant(&mut self, range: std::ops::Range<u64>) -> Option<std::ops::Range<u64>> {
        let granted = self.granted.as_mut()?;
        self.grants_changed = true;
        granted.push(range);
        (granted.len() > MAX_GRANTED_RANGES).then(|| granted.remove(0))
    }
}

/// Sends a recall naming more than `MAX_RECALL_INODES` inodes as `RecallPart`s and a final
/// `Recall` (one notice must fit in a frame); the client answers only the last.
fn split_recalls(out: Vec<Outgoing>) -> Vec<Outgoing> {
    if !out.iter().any(|o| matches!(o, Outgoing::Notify { notify: p::Notify::Recall { inodes, .. }, .. } if inodes.len() > p::MAX_RECALL_INODES)) {
        return out;
    }
    let mut split = Vec::with_capacity(out.len() + 1);
    for o in out {
        match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }
                if inodes.len() > p::MAX_RECALL_INODES =>
            {
                let mut chunks: Vec<Vec<u64>> = inodes.chunks(p::MAX_RECALL_INODES).map(<[u64]>::to_vec).collect();
                let last = chunks.pop().unwrap_or_default();
                for inodes in chunks {
                    split.push(Outgoing::Notify { session, notify: p::Notify::RecallPart { recall_id, inodes } });
                }
                split.push(Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes: last } });
            }
            other => split.push(other),
        }
    }
    split
}

/// The policy of a session never told one (`set_policy`): simulations, tests, tools.
static TRUSTED: std::sync::LazyLock<std::sync::Arc<Policy>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(Policy::trusted()));

/// On whose behalf a request's operations run, and by which rules.
struct Who {
    policy: std::sync::Arc<Policy>,
    /// The request's caller, mapped by the policy.
    caller: p::Caller,
    /// The server's clock.
    server_now: p::Time,
    /// The client's clock for the request, as bounded (`authz::bound_time`).
    client_time: Option<p::Time>,
    /// The session replays after a restart: the locks it takes again were granted before.
    replaying: bool,
}

impl Session {
    /// Reserves the place (`seq`) of change `id` as it arrives, unless it has one already
    /// or was answered (a resend).
    fn reserve_place(&mut self, id: u64) {
        if !self.replies.contains(id) && !self.reserved.contains_key(&id) {
            self.applied += 1;
            self.reserved.insert(id, self.applied);
        }
    }

    /// The `seq` of change `id`, running now: the place it took when it arrived (a
    /// request run without going through `Server::handle` takes the next one).
    fn take_place(&mut self, id: u64) -> u64 {
        let seq = self.reserved.remove(&id).unwrap_or_else(|| {
            self.applied += 1;
            self.applied
        });
        self.top = self.top.max(seq);
        seq
    }

    /// Places below `top` whose changes have not run (they wait, parked).
    /// What its durable record says.
    fn record(&self) -> Record {
        Record {
            secret: self.secret,
            seq: self.top,
            dataset: self.dataset,
            holes: self.holes_below_top(),
            grants: self.granted.clone(),
            name: self.client_name.clone(),
            identity: self.identity.clone().filter(|_| record::WRITE_IDENTITY),
        }
    }

    fn holes_below_top(&self) -> Vec<u64> {
        let mut holes: Vec<u64> = self.reserved.values().copied().filter(|&p| p < self.top).collect();
        holes.sort_unstable();
        if holes.len() > MAX_RECORD_HOLES {
            tracing::error!(holes = holes.len(), "more waiting changes than a session record can name");
        }
        holes
    }
}

/// The server core.
pub struct Server {
    store: Store,
    /// Where session secrets come from in a simulation (`seed_randomness`), which must
    /// replay exactly; `None`: from the OS generator, as secrets must.
    rng: Option<crest_rng::Stream>,
    /// What a welcome names as the server's release (`set_release`).
    release: String,
    /// The image's path as the operator named it (`set_image_name`; status only).
    image: String,
    /// When its first tick came (what `crest status` counts its uptime from).
    started_ms: Option<u64>,
    sessions: HashMap<SessionId, Session>,
    next_session: SessionId,
    /// Store generation when sessions' `durable` was last brought up to date.
    seen_generation: u64,
    /// File data bytes written since that generation.
    written_since_commit: u64,
    /// Access to the image's data store (`objects.rs`), when it keeps file data there.
    data: Option<crate::objects::DataAccess>,
    /// Inodes changed since the last commit, by the one session that changed them (the
    /// inode-number counter as `ALLOCATOR`). A change by another session that involves one
    /// is committed before it is answered, so no session's change ever builds on another's
    /// that a crash could still take back: each inode's lost changes after a crash belong
    /// to one session's replay, and replays of different sessions commute
    /// (docs/protocol.md §4.5). (Reads may see such a change: it is back once its client
    /// has replayed, before anyone's new work runs.)
    unsettled: HashMap<u64, SessionId>,
    /// Commits made for that, since start (logged at shutdown).
    settling_commits: u64,
    /// Who may cache what; responses waiting for recalls.
    caps: Caps,
    /// Inodes the last request changed (recall targets).
    changed: Vec<u64>,
    /// What to send, drained by `take_outgoing`.
    outbox: Vec<Outgoing>,
    /// Sessions whose connection is gone, since when (ms).
    disconnected: HashMap<SessionId, u64>,
    /// Sessions among `disconnected` whose shared rights have lapsed (`lapse_disconnected`).
    shared_lapsed: HashSet<SessionId>,
    /// Inodes whose state the last request's replies carried.
    carried: Vec<u64>,
    /// Requests waiting for other sessions to give up exclusive rights, oldest first.
    parked: VecDeque<Parked>,
    /// Some parked requests are free to run and wait for the next slice (`run_parked`).
    parked_ready: bool,
    /// Inodes a change removed the last name of while other sessions cached them, held
    /// open (a store handle each) by recall id, until every session the recall went to
    /// has answered it or is gone (`Pin`).
    pins: BTreeMap<u64, Pin>,
    /// Unlinked files the last request opened (their openers need a record).
    opened_orphans: Vec<u64>,
    /// Opens of parked requests that took effect as they arrived: not run again when
    /// the request runs (a release may have come in between).
    opened_on_arrival: HashSet<(SessionId, u64, u64)>,
    /// After a restart, until the grace period ends: every orphan the image kept, and
    /// every file a change in the grace period orphaned (`hold_for_grace`), held open by
    /// the server itself (a store handle each), so that neither a release nor an unlink
    /// by one session destroys a file another restored session is yet to open again.
    grace_orphans: Vec<u64>,
    /// Requests parked for a flush recall (`park_for_flush`), by session and id: run
    /// when it is answered, whoever holds the file open by then.
    flushed: HashSet<(SessionId, u64)>,
    /// When each session (that spoke since this server started) was last heard from, ms.
    last_heard: HashMap<SessionId, u64>,
    /// Sessions fenced for silence: their requests are refused, a resume starts afresh.
    fenced: HashSet<SessionId>,
    /// Fenced sessions whose durable marker (`FENCED_MARKER`) is still in the store: dropped
    /// `RESTORED_SESSION_GRACE_MS` after the first tick (telling the client is not enough:
    /// the welcome may be lost).
    fenced_markers: HashMap<SessionId, Option<u64>>,
    /// After a restart: sessions restored from their records whose clients have not yet
    /// replayed; while any remain (and the grace period lasts), other work waits.
    replaying: HashSet<SessionId>,
    /// The grace period is on: from a restart that restored sessions until every one has
    /// said `Replayed` and every replay parked meanwhile has run (`parked_in_replay`), or
    /// it runs out.
    grace: bool,
    /// End of the grace period (set by the first tick after a restart).
    grace_until: Option<u64>,
    /// The grace period ended since the last request ran (for `Applied::grace_ended`).
    grace_just_ended: bool,
    /// Requests held for the grace period, oldest first.
    grace_parked: VecDeque<(SessionId, p::Request)>,
    /// Sessions that answered a recall in the grace period while requests of theirs,
    /// sent before the answer, were held for it: theirs run first when it ends. In wire
    /// order they came before the answer (an exclusive holder's writeback, which it
    /// answered itself, before the answer that gives the inode up), and another
    /// session's request that waited for that answer must not overtake them.
    grace_answered: BTreeSet<SessionId>,
    /// Requests that arrived while their session replayed and were parked (behind
    /// rights, or a flush): part of its replay, they do not wait for the grace period
    /// when they run after its `Replayed`, and the session's new work waits behind them
    /// (it may build on what they change), also once the grace period is over.
    parked_in_replay: HashSet<(SessionId, u64)>,
    /// fcntl and flock locks, by inode.
    locks: LockTable,
    /// Requests run or answered, in order, while `record_applied` is on (for simulators).
    applied: Option<Vec<Applied>>,
    /// Operations run since start, by kind (logged at shutdown: what a workload cost).
    served: BTreeMap<&'static str, u64>,
    /// Time the server's thread spent on requests, by kind (`record_service`).
    service: service::ServiceTimes,
    /// Bytes, recalls, fences and errors since start.
    activity: activity::Activity,
    /// Whether the image is short of space (then no session holds exclusive rights).
    space: SpaceWatch,
    /// Directories several sessions change at once: not handed to one whole.
    contention: Contention,
    /// Most sessions one client identity holds at once (`set_sessions_per_identity`).
    sessions_per_identity: usize,
    /// The last request had an acquire refused for that (`Applied::busy`).
    refused_busy: bool,
    /// Work the shell does off the store's thread: reads it runs, sums of written blocks
    /// it computed (`elsewhere.rs`).
    elsewhere: elsewhere::Elsewhere,
    /// Snapshots waiting for clients to write back (`admin_start`).
    pending_snapshots: Vec<admin::PendingSnapshot>,
    /// Inode numbers granted to sessions that ended unused, for later grants (`inodes.rs`).
    inode_pool: inodes::InodePool,
    /// The request running is a replay after a restart (`handle`): it draws no grant from
    /// `inode_pool`.
    replaying_now: bool,
    /// The running change must be durable before it is answered (it drew a grant from
    /// `inode_pool`): `end_change` commits.
    commit_after_change: bool,
    /// The last token given to a call that waits.
    next_admin_token: u64,
    /// Receives under way (`crest receive`), by token.
    receives: sendrecv::Receives,
}

/// A request the server ran, or answered from its reply cache, in the order the effects
/// took place (`Server::record_applied`). A simulator replays these on a model of the file
/// system: which requests ran, and in which order, is otherwise hidden inside the core
/// (parked requests run inside `recall_done` and `tick`; held responses come out later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Whose request.
    pub session: SessionId,
    /// Its id.
    pub id: u64,
    /// Answered from the reply cache (or, for a re-assert sent again, from the answers a
    /// session's re-asserts got): nothing ran.
    pub from_cache: bool,
    /// The store's generation just after it ran, and whether the store then held changes
    /// not yet committed: what a crash at that moment would keep (a simulator that crashes
    /// the server between commits rolls its model back to that).
    pub generation: u64,
    /// See `generation`.
    pub dirty: bool,
    /// The grace period after a restart ended just before this ran.
    pub grace_ended: bool,
    /// Its place among its session's changes (`Response::seq`; 0 for none). Places are
    /// taken as changes arrive, so one that ran may hold a place above changes still
    /// parked.
    pub seq: u64,
    /// An acquire in it was refused (EBUSY) because its directory is shared
    /// (`contention`): the server's choice, which no model of the file system predicts.
    pub busy: bool,
}

/// A request that involves inodes another session holds exclusively: it runs once that
/// session has flushed its writeback and answered the recalls in `waiting`.
#[derive(Debug)]
struct Parked {
    session: SessionId,
    req: p::Request,
    waiting: HashSet<u64>,
}

fn millis(t: p::Time) -> u64 {
    (t.sec.max(0) as u64) * 1000 + u64::from(t.nsec) / 1_000_000
}

fn time_of_millis(ms: u64) -> p::Time {
    p::Time { sec: (ms / 1000) as i64, nsec: ((ms % 1000) * 1_000_000) as u32 }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("sessions", &self.sessions.len()).finish()
    }
}

pub(crate) fn errno(errno: i32, message: impl Into<String>) -> p::OpError {
    p::OpError { errno, message: message.into() }
}

/// A session secret from the OS generator. Without one, the process's own stream (itself
/// seeded from the OS, but predictable from its outputs) rather than no session at all.
fn os_secret() -> u64 {
    let mut b = [0u8; 8];
    match crest_rng::os_random_bytes(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(e) => {
            tracing::error!("the OS random generator failed ({e}); session secret from the process's stream");
            crest_rng::next_u64()
        }
    }
}

impl Server {
    /// Draws the server's randomness (session secrets, and the store's inode
    /// generations) from `seed` from now on: for simulations that must replay exactly.
    pub fn seed_randomness(&mut self, seed: u64) {
        self.rng = Some(crest_rng::Stream::from_seed_u64(seed));
        self.store.seed_randomness(seed ^ 0x5707e);
    }

    /// A server over an opened store. Sessions whose records the store holds (a restart)
    /// are restored, waiting for their clients to resume them and replay what was lost.
    pub fn new(mut store: Store) -> Server {
        let mut sessions = HashMap::new();
        let mut next_session = 1;
        let records = store.session_records().unwrap_or_else(|e| {
            tracing::error!("cannot read session records: {e}");
            Vec::new()
        });
        let mut fenced = HashSet::new();
        for (id, bytes) in records {
            next_session = next_session.max(id.saturating_add(1));
            if is_fenced_marker(&bytes) {
                tracing::info!(session = id, "fenced before the restart: its client will be told");
                fenced.insert(id);
                continue;
            }
            let Some(Record { secret, seq, dataset, holes, grants, name: client_name, identity }) =
                decode_record(&bytes)
            else {
                tracing::warn!(session = id, "malformed session record of {} bytes dropped", bytes.len());
                if let Err(e) = store.delete_session_record(id) {
                    tracing::error!(session = id, "cannot drop a session record: {e}");
                }
                continue;
            };
            tracing::info!(session = id, client = %client_name, durable_seq = seq, ?holes, "session restored");
            let s = Session {
                secret,
                client_name,
                identity,
                dataset,
                granted: grants,
                applied: seq,
                top: seq,
                durable: seq,
                holes,
                awaiting_resume: Some(None),
                recorded: true,
                ..Default::default()
            };
            sessions.insert(id, s);
        }
        let seen_generation = store.generation();
        let replaying: HashSet<SessionId> = sessions.keys().copied().collect();
        let mut grace_orphans = Vec::new();
        if !replaying.is_empty() {
            tracing::info!(sessions = replaying.len(), "restarted: new work waits for their clients to replay (grace)");
            grace_orphans = hold_orphans(&mut store);
        } else {
            reclaim_orphans(&mut store);
        }
        Server {
            store,
            rng: None,
            release: format!("crest {}", env!("CARGO_PKG_VERSION")),
            image: String::new(),
            started_ms: None,
            pending_snapshots: Vec::new(),
            inode_pool: Default::default(),
            replaying_now: false,
            commit_after_change: false,
            next_admin_token: 0,
            receives: Default::default(),
            sessions,
            next_session,
            seen_generation,
            written_since_commit: 0,
            data: None,
            unsettled: HashMap::new(),
            settling_commits: 0,
            caps: Caps::default(),
            changed: Vec::new(),
            outbox: Vec::new(),
            disconnected: HashMap::new(),
            shared_lapsed: HashSet::new(),
            carried: Vec::new(),
            parked: VecDeque::new(),
            parked_ready: false,
            pins: BTreeMap::new(),
            opened_orphans: Vec::new(),
            opened_on_arrival: HashSet::new(),
            grace_orphans,
            flushed: HashSet::new(),
            last_heard: HashMap::new(),
            fenced_markers: fenced.iter().map(|&id| (id, None)).collect(),
            fenced,
            grace: !replaying.is_empty(),
            replaying,
            grace_until: None,
            grace_parked: VecDeque::new(),
            grace_answered: BTreeSet::new(),
            parked_in_replay: HashSet::new(),
            grace_just_ended: false,
            locks: LockTable::default(),
            applied: None,
            served: BTreeMap::new(),
            service: Default::default(),
            activity: Default::default(),
            space: SpaceWatch::default(),
            contention: Contention::default(),
            sessions_per_identity: MAX_SESSIONS_PER_IDENTITY,
            refused_busy: false,
            elsewhere: Default::default(),
        }
    }

    /// How recently another session must have changed a directory for this server to
    /// refuse to hand it to a session whole (`contention::CONTENTION_MS` by default; 0:
    /// never). Simulators vary it, to exercise acquires racing with other sessions too.
    pub fn set_contention_window(&mut self, ms: u64) {
        self.contention = Contention::new(ms);
    }

    /// Lets one client identity hold up to `n` sessions at once (a server's operator may
    /// raise or lower `MAX_SESSIONS_PER_IDENTITY`).
    pub fn set_sessions_per_identity(&mut self, n: usize) {
        self.sessions_per_identity = n;
    }

    /// Counts `nanos` of the server thread's time on a request of `kind` (its first
    /// operation's `Op::name`), as the driver measured it around `handle`.
    pub fn record_service(&mut self, kind: &'static str, nanos: u64) {
        self.service.record(kind, nanos);
    }

    /// Notes where `session`'s connection comes from (the driver sees the socket), for
    /// `crest status`.
    pub fn set_peer(&mut self, session: SessionId, peer: String) {
        if let Some(s) = self.sessions.get_mut(&session) {
            s.peer = peer;
        }
    }

    /// The image's path, for `crest status`.
    pub fn set_image_name(&mut self, image: String) {
        self.image = image;
    }

    /// Names the server's release (and commit) in every welcome from now on.
    pub fn set_release(&mut self, release: String) {
        self.release = release;
    }

    /// From now on, remember every request run or answered from the reply cache, for
    /// `take_applied`. Off by default: only simulators need it.
    pub fn record_applied(&mut self) {
        self.applied.get_or_insert_with(Vec::new);
    }

    /// Numbers new sessions from `first` on (at least). A restarted server knows the
    /// numbers of the sessions it restored, not of those an earlier life handed out and
    /// kept no record of; a simulator that checks every session's history tells it where
    /// to start so that no number means two sessions.
    pub fn number_sessions_from(&mut self, first: SessionId) {
        self.next_session = self.next_session.max(first);
    }

    /// What ran since the last call, oldest first (empty unless `record_applied`).
    pub fn take_applied(&mut self) -> Vec<Applied> {
        self.applied.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The store (for shutdown and status).
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Hands the store back.
    pub fn into_store(self) -> Store {
        if !self.served.is_empty() {
            let total: u64 = self.served.values().sum();
            let kinds: Vec<String> = self.served.iter().map(|(k, n)| format!("{k} {n}")).collect();
            tracing::info!(settling_commits = self.settling_commits, "served {total} operations: {}", kinds.join(", "));
        }
        self.store
    }

    /// Answers a client's hello: a new session, or the resumed one when the token matches.
    /// The session is trusted (`Policy::trusted`): simulations, tests, tools.
    pub fn handle_hello(&mut self, hello: &p::Hello) -> (Option<SessionId>, p::ServerMessage) {
        let (sid, msg) = self.hello_inner(hello, &Policy::trusted(), "");
        if let Some(sid) = sid {
            self.set_policy(sid, Policy::trusted());
        }
        (sid, msg)
    }

    /// `handle_hello` for a client under `policy` (its export policy) whose certificate
    /// names `identity`: it runs its requests under the policy, may mount only the datasets
    /// it names, resumes only sessions `identity` started, and holds at most
    /// `sessions_per_identity` sessions at once (`MAX_SESSIONS_PER_IDENTITY` unless
    /// `set_sessions_per_identity` says otherwise).
    pub fn handle_hello_as(
        &mut self,
        hello: &p::Hello,
        policy: Policy,
        identity: &str,
    ) -> (Option<SessionId>, p::ServerMessage) {
        let refuse = |reason| (None, p::ServerMessage::Refused { reason, version: p::PROTOCOL_VERSION });
        if identity.len() > record::MAX_RECORD_IDENTITY {
            // (Its sessions' records could not keep it whole, to check a resume against.)
            return refuse(format!("a client identity of {} bytes is too long", identity.len()));
        }
        let resuming = hello.resume.is_some_and(|t| {
            self.sessions.get(&t.id).is_some_and(|s| s.secret == t.secret && s.identity.as_deref() == Some(identity))
        });
        let most = self.sessions_per_identity;
        if !resuming && self.sessions.values().filter(|s| s.identity.as_deref() == Some(identity)).count() >= most {
            tracing::warn!(identity, "session refused: too many sessions of one client identity");
            return refuse(format!("{identity} holds {most} sessions already"));
        }
        let (sid, msg) = self.hello_inner(hello, &policy, identity);
        if let Some(sid) = sid {
            self.set_policy(sid, policy);
        }
        (sid, msg)
    }

    fn hello_inner(
        &mut self,
        hello: &p::Hello,
        policy: &Policy,
        identity: &str,
    ) -> (Option<SessionId>, p::ServerMessage) {
        let refuse = |reason| (None, p::ServerMessage::Refused { reason, version: p::PROTOCOL_VERSION });
        let protocol = match p::check_hello(hello) {
            Ok(v) => v,
            Err(reason) => return refuse(reason),
        };
        let dataset = match self.dataset_for(hello, policy) {
            Ok(d) => d,
            Err(reason) => return refuse(reason),
        };
        let mut fenced = false;
        if let Some(t) = hello.resume {
            // (A fenced session's marker stays until it expires, not only until its client
            // is told: the welcome saying so can be lost with the connection, and a crash
            // after the marker went would leave the client thinking it merely forgotten.)
            fenced = self.fenced.contains(&t.id);
            if let Some(s) = self.sessions.get_mut(&t.id).filter(|s| s.secret == t.secret) {
                // The token alone is a bearer's: one that leaked (a log, a core dump, a
                // host's backup) must not hand another client the session's locks,
                // handles and replay. Refused before anything of the session is touched.
                if s.identity.as_deref().is_some_and(|own| own != identity) {
                    tracing::warn!(session = t.id, identity, "resume refused: the session belongs to another client");
                    return refuse(format!("session {} belongs to another client identity", t.id));
                }
                if s.dataset != dataset {
                    return refuse(format!("session {} mounts another dataset", t.id));
                }
                // (Restored from a record that kept no identity: whoever holds the token
                // is taken for its client, as before records kept it; its next change's
                // record keeps the identity.)
                s.identity = Some(identity.to_string());
                self.disconnected.remove(&t.id);
                let restarted = s.awaiting_resume.take().is_some() || s.restart_unconfirmed;
                s.restart_unconfirmed = restarted;
                // (Its client may have been upgraded, or downgraded, since its last hello.)
                s.protocol = protocol;
                let durable_seq = restarted.then_some(s.durable);
                let holes = if restarted { s.holes.clone() } else { Vec::new() };
                tracing::info!(session = t.id, client = %hello.client_name, ?durable_seq, ?holes, "session resumed");
                // Recalls it may have missed while away (sent after the welcome).
                let again = self.caps.resumed(t.id);
                self.outbox.extend(again);
                return (Some(t.id), self.welcome(t.id, true, durable_seq, holes, false, policy.identity_map()));
            }
        }
        let id = self.next_session;
        self.next_session += 1;
        let secret = match &mut self.rng {
            Some(seeded) => seeded.next_u64(),
            None => os_secret(),
        };
        let fresh = Session {
            secret,
            client_name: hello.client_name.clone(),
            identity: Some(identity.to_string()),
            protocol,
            granted: Some(Vec::new()),
            dataset,
            ..Default::default()
        };
        self.sessions.insert(id, fresh);
        tracing::info!(session = id, client = %hello.client_name, fenced_before = fenced, "session started");
        (Some(id), self.welcome(id, false, None, Vec::new(), fenced, policy.identity_map()))
    }

    /// Applies a request and queues what to send: its response, or recalls to other
    /// sessions holding what it changed (the response follows when they answer).
    ///
    /// A request that involves an inode another session holds exclusively waits: that
    /// session is asked to flush and give the inode up, and the request runs when it has
    /// (or its time ran out). A read-only request is checked again after it ran, against
    /// everything its reply would let the client cache, and run again later if needed.
    pub fn handle(&mut self, session: SessionId, req: p::Request, now: p::Time) {
        // A session that mounts a snapshot reads it through the store's view, for this
        // request only (the requests of others it lets run set their own).
        let before = self.store.view();
        self.store.set_view(self.snapshot_of(session));
        self.handle_in_view(session, req, now);
        self.store.set_view(before);
    }

    fn handle_in_view(&mut self, session: SessionId, mut req: p::Request, now: p::Time) {
        let now_ms = millis(now);
        if !self.sessions.contains_key(&session) {
            // Fenced (or never known): nothing of it is applied any more, and no request
            // is answered, so the client knows each of its pending ones was not applied
            // here (what ran before the fencing was answered before): it may send its
            // reads again in its new session.
            tracing::debug!(session, id = req.id, "refused: the session was fenced");
            self.outbox.push(Outgoing::Notify { session, notify: p::Notify::Fenced });
            return;
        }
        self.inbound(session, &mut req);
        self.heard(session, now_ms);
        if self.caps.recalling_exclusive() {
            let inodes: Vec<u64> = req.ops.iter().flat_map(op_inodes).collect();
            self.caps.recall_progress(session, &inodes, now_ms);
        }
        self.confirm_resume(session);
        self.watch_space(now_ms);
        if self.waits_parked(session, req.id) {
            // A resend (its connection broke) of a request still parked: that copy runs,
            // once, and answers on the session's connection then. Run twice, an open
            // would take again a handle its process released in between.
            tracing::debug!(session, id = req.id, "resent while it waits parked");
            return;
        }
        if let Some(response) =
            self.sessions.get(&session).and_then(|s| s.reasserted.get(&req.id)).and_then(|(ops, r)| {
                // (Its client may have taken ops out since: a handle released, rights dropped.)
                let results: Option<Vec<_>> = req
                    .ops
                    .iter()
                    .map(|op| ops.iter().position(|o| o == op).and_then(|i| r.results.get(i).cloned()))
                    .collect();
                Some(p::Response { results: results?, ..r.clone() })
            })
        {
            tracing::debug!(session, id = req.id, "a re-assert sent again: answered again, not run");
            if let Some(log) = &mut self.applied {
                let (generation, dirty) = (self.store.generation(), self.store.is_dirty());
                let grace_ended = std::mem::take(&mut self.grace_just_ended);
                log.push(Applied {
                    session,
                    id: req.id,
                    from_cache: true,
                    generation,
                    dirty,
                    grace_ended,
                    seq: 0,
                    busy: false,
                });
            }
            self.outbox.push(Outgoing::Response { session, response });
            return;
        }
        let write_backs = take_write_backs(&mut req);
        let in_replay = self.parked_in_replay.remove(&(session, req.id)) || self.replaying.contains(&session);
        if self.grace && !in_replay {
            // Grace after a restart: a restored session's replays come first (they are
            // changes other clients may already have seen acknowledged).
            self.open_on_arrival(session, &req);
            self.grace_parked.push_back((session, req));
            return;
        }
        // A change takes its place (`seq`) in its session's order as it arrives, parked or
        // not: its client counts them as it sends them (§4.5).
        if req.ops.iter().any(Op::is_mutation) {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.reserve_place(req.id);
            }
        }
        // Whatever it changes counts from its arrival: a change parked behind the holder of
        // its directory is the very sign that the directory is shared.
        for op in req.ops.iter().filter(|op| op.is_mutation()) {
            for (dir, _) in op.named_entries() {
                self.contention.used(dir, session, now_ms);
            }
        }
        let involved = self.involved(&req, Some((session, now_ms)));
        if self.park_behind_own_replays(session, &req, in_replay)
            || self.park_behind_own_ready(session, &req)
            || self.park_behind_own_writeback(session, &req)
            || self.park_if_exclusive(session, &req, &involved, now_ms)
            || self.park_for_flush(session, &req, &write_backs, now_ms)
        {
            if in_replay {
                self.parked_in_replay.insert((session, req.id));
            }
            self.open_on_arrival(session, &req);
            return;
        }
        let read_only = !req.ops.iter().any(Op::is_mutation);
        let retry = read_only.then(|| req.clone());
        let (id, from_cache) = (req.id, self.sessions.get(&session).is_some_and(|s| s.replies.contains(req.id)));
        if from_cache && self.caps.holds_response(session, id) {
            // A resend (its connection broke) of a change whose reply still waits for
            // other holders to drop what they cached: answering it from the reply cache
            // now would let the call return before they have. The held reply goes to
            // the session's current connection when they answer.
            tracing::debug!(session, id, "resent while its reply waits on recalls");
            return;
        }
        let victims = if from_cache { Vec::new() } else { self.victims(&req) };
        let mut pins = self.pin(session, &victims);
        let held_for_grace = self.hold_for_grace(&victims);
        // (Not a replay's: its response may be kept to answer a resend, data and all.)
        self.begin_plannable(&req, !in_replay);
        self.replaying_now = in_replay;
        let response = self.handle_request(session, req, now);
        self.replaying_now = false;
        let planned = self.end_plannable();
        if let (true, Some(ops)) = (in_replay, &retry) {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.reasserted.insert(id, (ops.ops.clone(), response.clone()));
            }
        }
        if !victims.is_empty() {
            // A victim the change freed is cached by nobody (a pin would keep it): its
            // rights go with it, or they would pile up for every file a session makes
            // and removes.
            for &ino in &victims {
                if self.store.getattr(ino).is_err() {
                    self.caps.forget_inode(ino);
                }
            }
            // Only what the change did remove stays pinned (it may have failed).
            let orphans: Vec<u64> =
                victims.into_iter().filter(|&i| self.store.getattr(i).is_ok_and(|a| a.nlink == 0)).collect();
            let (removed, kept) = pins.into_iter().partition(|i| orphans.contains(i));
            self.unpin(kept);
            pins = removed;
            let (removed, kept): (Vec<u64>, Vec<u64>) = held_for_grace.into_iter().partition(|i| orphans.contains(i));
            self.unpin(kept);
            self.grace_orphans.extend(removed);
            self.record_openers(&orphans);
        }
        let opened = std::mem::take(&mut self.opened_orphans);
        self.record_openers(&opened);
        if response.seq != 0 && !from_cache {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.ran += 1;
                s.run_order.insert(id, s.ran);
            }
        }
        let carried = std::mem::take(&mut self.carried);
        if let Some(req) = retry {
            if self.park_if_exclusive(session, &req, &carried, now_ms) {
                return;
            }
        }
        if let Some(log) = &mut self.applied {
            let (generation, dirty) = (self.store.generation(), self.store.is_dirty());
            let grace_ended = std::mem::take(&mut self.grace_just_ended);
            let busy = std::mem::take(&mut self.refused_busy);
            log.push(Applied { session, id, from_cache, generation, dirty, grace_ended, seq: response.seq, busy });
        }
        let changed = std::mem::take(&mut self.changed);
        let (response, planned) = self.read_now_if_held(session, response, planned, &changed);
        let mut out = self.caps.changed(session, &changed, response, now_ms);
        if !pins.is_empty() {
            self.hold_pins(pins, &out);
        }
        if let Some(read) = planned {
            // (Nothing changed: the response is the one message, sent now.)
            out = out
                .into_iter()
                .map(|o| match o {
                    Outgoing::Response { session, response } if response.id == id => {
                        Outgoing::Read { session, response, read: read.clone() }
                    }
                    o => o,
                })
                .collect();
        }
        self.outbox.extend(out);
    }

    /// True while request `id` of `session` waits parked (behind rights, a flush, its
    /// session's replays or writeback, or for the grace period).
    fn waits_parked(&self, session: SessionId, id: u64) -> bool {
        self.parked.iter().any(|p| p.session == session && p.req.id == id)
            || self.grace_parked.iter().any(|(s, r)| *s == session && r.id == id)
    }

    /// The opens of a request whose answer must wait take effect as it arrives: for
    /// another session's exclusive rights or its flush, its client may have answered the
    /// open itself and sent it before answering a recall, and the holder's unlink that
    /// runs first must find the file open (only the attributes in the answer need the
    /// holder's writeback); for the grace period after a restart, the `Replayed` that
    /// ends it reclaims what nobody holds open while they wait (a restored session's
    /// re-opens, and new opens of files the server held for the grace).
    fn open_on_arrival(&mut self, session: SessionId, req: &p::Request) {
        for op in &req.ops {
            if let Op::Open { ino, handle, .. } = *op {
                // A request parked again when it runs (behind exclusive rights, then for
                // the grace period) arrived once: a release since must not be undone.
                if self.opened_on_arrival.contains(&(session, ino, handle)) {
                    continue;
                }
                // A failure is reported when the open runs.
                if self.open_handle(session, ino, handle).is_ok() {
                    self.opened_on_arrival.insert((session, ino, handle));
                }
            }
        }
    }

    /// Opens `handle` of `ino` for `session` unless it is open already (a retry, or an
    /// open that took effect when it arrived).
    fn open_handle(&mut self, session: SessionId, ino: u64, handle: u64) -> Result<s::Inode, s::Error> {
        let fresh = self.sessions.get_mut(&session).is_some_and(|s| {
            let handles = s.open.entry(ino).or_default();
            !handles.contains_key(&handle) && handles.insert(handle, 0).is_none()
        });
        if !fresh {
            return self.store.getattr(ino);
        }
        let r = self.store.open_handle(ino);
        if r.is_err() {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.open.entry(ino).or_default().remove(&handle);
            }
        }
        r
    }

    /// `handle` of `ino`, open for `session`, may do `access` (its `Open`, checked, ran).
    fn grant_open(&mut self, session: SessionId, ino: u64, handle: u64, access: u32) {
        let handles = self.sessions.get_mut(&session).and_then(|s| s.open.get_mut(&ino));
        if let Some(granted) = handles.and_then(|h| h.get_mut(&handle)) {
            *granted |= access;
        }
    }

    /// `session` dropped what recall `recall_id` named (and, for exclusive rights, sent
    /// everything it had answered itself first).
    pub fn recall_done(&mut self, session: SessionId, recall_id: u64, now: p::Time) {
        if self.grace && self.grace_parked.iter().any(|(s, _)| *s == session) {
            self.grace_answered.insert(session);
        }
        if self.sessions.contains_key(&session) {
            self.heard(session, millis(now));
            self.confirm_resume(session);
        }
        let out = self.caps.recall_done(session, recall_id);
        self.outbox.extend(out);
        if let Some(pin) = self.pins.get_mut(&recall_id) {
            pin.owed.remove(&session);
        }
        self.release_pins();
        self.run_parked(now);
    }

    /// Was `session` fenced? (For simulators: the moment its unapplied writebacks are
    /// lost is otherwise hidden inside `tick`.)
    pub fn is_fenced(&self, session: SessionId) -> bool {
        self.fenced.contains(&session)
    }

    /// True while the server knows `session` (started, or restored after a restart).
    pub fn has_session(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session)
    }

    /// True when `session` holds `handle` of `ino` open (an `Open` of a parked request
    /// takes effect as it arrives).
    pub fn holds_open(&self, session: SessionId, ino: u64, handle: u64) -> bool {
        self.sessions.get(&session).is_some_and(|s| s.open.get(&ino).is_some_and(|h| h.contains_key(&handle)))
    }

    /// The access `session`'s open handles of the inode `op` reads or writes grant it
    /// (`p::OPEN_*`, together): what it may do through them whoever asks.
    fn open_access(&self, session: SessionId, op: &Op) -> u32 {
        let ino = match *op {
            Op::Read { ino, .. }
            | Op::Write { ino, .. }
            | Op::WriteBack { ino, .. }
            | Op::MapObject { ino, .. }
            | Op::Append { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::SetLock { ino, .. }
            | Op::SetAttr { ino, .. } => ino,
            _ => return 0,
        };
        let handles = self.sessions.get(&session).and_then(|s| s.open.get(&ino));
        handles.map_or(0, |h| h.values().fold(0, |all, access| all | access))
    }

    /// True during the grace period after a restart (restored sessions still replaying,
    /// or a replay of theirs still parked).
    pub fn in_grace(&self) -> bool {
        self.grace
    }

    /// True while `ino`, a file whose last name a change removed, is kept for the opens
    /// of sessions that may have opened it without asking (until they have answered the
    /// change's recall), or an orphan held for the grace period after a restart: gone
    /// for everything but an `Open` unless a session holds it open.
    pub fn is_pinned(&self, ino: u64) -> bool {
        self.pins.values().any(|p| p.inodes.contains(&ino)) || self.grace_orphans.contains(&ino)
    }

    /// Everything queued to send, in order.
    ///
    /// A session's change responses come out in the order the changes ran: one held for
    /// recalls holds back the later ones. So what a client has had answered is always
    /// everything its session ran up to some point, and after a restart it can replay its
    /// lost acknowledged changes in that order, and send the unanswered ones after them
    /// (docs/protocol.md §4.5).
    pub fn take_outgoing(&mut self) -> Vec<Outgoing> {
        let out = std::mem::take(&mut self.outbox);
        let mut ready = Vec::with_capacity(out.len());
        for o in out {
            match o {
                Outgoing::Response { session, response } => self.release_in_order(session, response, &mut ready),
                other => ready.push(other),
            }
        }
        for o in &mut ready {
            self.outbound(o);
            self.activity.outgoing(o);
        }
        split_recalls(ready)
    }

    /// Lets `response` go once every change `session` ran before it has been answered.
    fn release_in_order(&mut self, session: SessionId, response: p::Response, ready: &mut Vec<Outgoing>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return ready.push(Outgoing::Response { session, response });
        };
        let Some(&order) = s.run_order.get(&response.id) else {
            // A read, or a repeat answered from the reply cache.
            return ready.push(Outgoing::Response { session, response });
        };
        s.unreleased.insert(order, response);
        while let Some(entry) = s.unreleased.first_entry() {
            if s.run_order.values().any(|&o| o < *entry.key()) {
                break;
            }
            let response = entry.remove();
            s.run_order.remove(&response.id);
            ready.push(Outgoing::Response { session, response });
        }
    }

    /// Ends a session cleanly: its open files and its locks are released.
    pub fn end_session(&mut self, id: SessionId) {
        self.disconnected.remove(&id);
        self.last_heard.remove(&id);
        self.grace_parked.retain(|(s, _)| *s != id);
        self.parked_in_replay.retain(|(s, _)| *s != id);
        // (If it was the last one to replay, the next tick ends the grace period.)
        self.replaying.remove(&id);
        self.release_locks(id, "session ended");
        self.contention.forget_session(id);
        let out = self.caps.forget_session(id);
        self.outbox.extend(out);
        self.parked.retain(|p| p.session != id);
        self.flushed.retain(|(s, _)| *s != id);
        self.opened_on_arrival.retain(|(s, _, _)| *s != id);
        // Its opens sent behind will never come: nothing is kept for them.
        for pin in self.pins.values_mut() {
            pin.owed.remove(&id);
        }
        self.release_pins();
        if let Some(s) = self.sessions.remove(&id) {
            tracing::info!(session = id, client = %s.client_name, "session ended");
            let record_gone = match self.store.delete_session_record(id) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(session = id, "cannot drop the session record: {e}");
                    !s.recorded
                }
            };
            self.pool_unused(id, &s, record_gone);
            self.end_grants(id);
            // (In inode order: the order orphans go decides the store's layout, which a
            // simulator's seed must reproduce.)
            let mut open: Vec<(u64, usize)> = s.open.into_iter().map(|(ino, h)| (ino, h.len())).collect();
            open.sort_unstable();
            for (ino, handles) in open {
                for _ in 0..handles {
                    if let Err(e) = self.store.release_handle(ino) {
                        tracing::warn!(ino, "release at session end: {e}");
                    }
                }
            }
        }
    }

    /// Applies a request for `session` at time `now` (or answers it from the reply cache),
    /// records the rights its replies grant and leaves the inodes it changed in
    /// `self.changed`. `handle` is the whole step; this is its core (and the unit tests').
    pub(crate) fn handle_request(&mut self, session: SessionId, req: p::Request, now: p::Time) -> p::Response {
        self.confirm_resume(session);
        self.changed.clear();
        self.carried.clear();
        self.refused_busy = false;
        let replaying = self.replaying.contains(&session);
        let policy = self.sessions.get(&session).and_then(|s| s.policy.clone());
        let mut policy = policy.unwrap_or_else(|| TRUSTED.clone());
        if !policy.read_only && self.dataset_read_only(session) {
            policy = std::sync::Arc::new(Policy { read_only: true, ..(*policy).clone() });
        }
        let client_time = req.time.map(|t| authz::bound_time(t, now, replaying));
        let who = Who { caller: policy.map(&req.caller), policy, server_now: now, client_time, replaying };
        // Writeback: the client already answered with its clock; apply at that time.
        let now = client_time.unwrap_or(now);
        if let Some(s) = self.sessions.get(&session) {
            if let Some(r) = s.replies.get(req.id) {
                tracing::debug!(session, id = req.id, "answered from the reply cache");
                return p::Response { durable: s.durable, ..r };
            }
        }
        let mutates = req.ops.iter().any(Op::is_mutation);
        let acquires = req.ops.iter().any(|op| matches!(op, Op::Acquire { .. }));
        let mut involved = settle_inodes(&req.ops);
        let mut seq = 0;
        let refusal = p::request_refusal(&req.ops).map(|(code, message)| errno(code, message));
        let results = if let Some(refusal) = refusal {
            // Refused whole, but still the session's next change in order: its client
            // counted it (places, §4.5), and it changed nothing a replay could redo.
            if mutates {
                if let Some(s) = self.sessions.get_mut(&session) {
                    seq = s.take_place(req.id);
                }
            }
            vec![Err(refusal)]
        } else {
            let fsyncs: Vec<bool> = req.ops.iter().map(|op| matches!(op, Op::Fsync { .. })).collect();
            if acquires {
                // An acquire grants exclusive rights, under which the client answers changes
                // itself: after a restart its session must be restored (and waited for), or
                // that writeback would arrive as a stranger's new work.
                self.record_session(session, "an exclusive holder");
            }
            if mutates {
                seq = self.begin_change(session, req.id);
            }
            let sums = self.take_request_sums(session, req.id);
            let mut results = self.run_ops(session, &who, (req.ops, sums), now, mutates, &mut involved);
            if mutates {
                self.end_change(session, seq, &mut results, &fsyncs);
            }
            results
        };
        involved.extend(&self.changed);
        involved.extend(&self.carried);
        self.settle(session, mutates, acquires, &involved);
        let durable = self.sessions.get(&session).map_or(0, |s| s.durable);
        let time = mutates.then_some(now);
        let resp = p::Response { id: req.id, results, seq, durable, time };
        if mutates {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.replies.insert(resp.clone());
            }
        }
        resp
    }

    /// Runs `ops` for `session` in order from time `now` (an `Op::At` moves it for those
    /// after), recording the rights each reply grants; `involved` gains what each would
    /// change. With each op, the sums of the blocks it writes if the shell gave them
    /// (`elsewhere.rs`). The results fit in one frame (`Room`).
    fn run_ops(
        &mut self,
        session: SessionId,
        who: &Who,
        (ops, mut sums): (Vec<Op>, WriteSums),
        mut now: p::Time,
        mutates: bool,
        involved: &mut Vec<u64>,
    ) -> Vec<Result<Reply, p::OpError>> {
        let mut results = Vec::with_capacity(ops.len());
        let mut room = Room::new(ops.len());
        for (i, mut op) in ops.into_iter().enumerate() {
            if let Op::At { time } = op {
                now = authz::bound_time(time, who.server_now, who.replaying);
                results.push(room.place(Ok(Reply::Done)));
                continue;
            }
            *self.served.entry(op.name()).or_default() += 1;
            if let Op::Reassert { ino, exclusive } = op {
                let r = self.reassert(session, ino, exclusive);
                results.push(room.place(r));
                continue;
            }
            let relocking = who.replaying && matches!(op, Op::SetLock { .. });
            let client_time = who.client_time.map(|_| now);
            if !relocking {
                let opened = self.open_access(session, &op);
                let checked = authz::check(
                    &mut self.store,
                    &who.policy,
                    &who.caller,
                    &mut op,
                    authz::When { now: who.server_now, client_time, opened },
                );
                let checked = match (checked, &mut op) {
                    // A restart's re-opens name no caller (and may not know the access):
                    // a handle the check refuses is held open all the same (an unlinked
                    // file must outlive the restart), for nothing but what its callers
                    // may do themselves.
                    (Err(e), Op::Open { access, .. }) if who.replaying && matches!(e.errno, 13 | 22) => {
                        *access = 0;
                        Ok(())
                    }
                    (r, _) => r,
                };
                if let Err(e) = checked {
                    results.push(room.place(Err(e)));
                    continue;
                }
                self.kill_privs_before(session, who, &mut op, now, mutates, involved);
            }
            if let Op::Acquire { ino } = op {
                if self.contention.shared(ino, session, millis(who.server_now)) {
                    let e = errno(16, format!("directory {ino} is shared with another client: changes go one by one"));
                    self.refused_busy = true;
                    results.push(room.place(Err(e)));
                    continue;
                }
            }
            if let Op::CreateAt { ino, .. } | Op::SymlinkAt { ino, .. } = op {
                if !self.sessions.get_mut(&session).is_some_and(|s| s.use_granted(ino)) {
                    let e = errno(1, format!("inode number {ino} was not granted to this session"));
                    results.push(room.place(Err(e)));
                    continue;
                }
            }
            let listed = match op {
                Op::Lookup { parent, .. } => Some(parent),
                _ => None,
            };
            let xattr_names = matches!(op, Op::ListXattr { .. });
            // (Counted once it ran: a write refused moved no data.)
            let data = match &op {
                Op::Write { data, .. } | Op::Append { data, .. } => data.len() as u64,
                _ => 0,
            };
            self.elsewhere.op_sums = sums.get_mut(i).and_then(Option::take);
            let mut r = self.run_op(session, op, now, mutates, involved, &mut room);
            self.elsewhere.op_sums = None;
            if r.is_ok() {
                self.activity.bytes_written += data;
            }
            self.redact(who, listed, xattr_names, &mut r);
            results.push(r);
        }
        results
    }

    /// Takes out of a reply what its caller may not see: the neighbouring entries a
    /// lookup carries from a directory the caller may search but not read, and
    /// `trusted.*` xattr names for anyone but root.
    fn redact(&mut self, who: &Who, listed: Option<u64>, xattr_names: bool, r: &mut Result<Reply, p::OpError>) {
        match r {
            // (Root may read every directory: no look-up for it.)
            Ok(Reply::Lookup { leaf, .. }) if !leaf.items.is_empty() && who.caller.uid != 0 => {
                let Some(dir) = listed else { return };
                if !authz::may_list(&mut self.store, &who.caller, dir).unwrap_or(false) {
                    *leaf = p::DirLeaf::none();
                }
            }
            Ok(Reply::Names(names)) if xattr_names && who.caller.uid != 0 => {
                names.retain(|n| !n.starts_with(b"trusted."));
            }
            _ => {}
        }
    }

    /// From now on, `session`'s requests run under `policy` (its client's export policy;
    /// sessions are trusted until told).
    pub fn set_policy(&mut self, session: SessionId, policy: Policy) {
        if let Some(s) = self.sessions.get_mut(&session) {
            s.policy = Some(std::sync::Arc::new(policy));
        }
    }

    /// Runs one operation of a request (`mutates`: one that changes something) and
    /// records the rights its reply grants: what it carries, exclusive rights to what a
    /// create made or an acquire named; leaves what it changed in `self.changed`. A reply
    /// that does not fit in the `room` left is refused before any right is granted.
    fn run_op(
        &mut self,
        session: SessionId,
        op: Op,
        now: p::Time,
        mutates: bool,
        involved: &mut Vec<u64>,
        room: &mut Room,
    ) -> Result<Reply, p::OpError> {
        if room.refuses(&op) {
            return room.place(Err(Room::too_large()));
        }
        let acquires = if let Op::Acquire { ino } = op { Some(ino) } else { None };
        // (An acquire touches what its reply carries: the directory and every
        // entry — taken from the reply rather than listed again.)
        let touched = if acquires.is_some() { Vec::new() } else { self.touches(&op) };
        // (What it would change decides its answer even when it fails: an rmdir's
        // ENOTEMPTY depends on the victim's entries.)
        involved.extend(&touched);
        let inode_of_op = op_inode(&op);
        let (creates, rmdir) = (op.creates(), matches!(op, Op::Rmdir { .. }));
        let looked_up = if let Op::Lookup { name, .. } = &op { Some(p::name_hash(name)) } else { None };
        let getattr = matches!(op, Op::GetAttr { .. });
        let mut r = room.place(self.apply(session, op, now));
        let mut withheld = Vec::new();
        if let Ok(reply) = &mut r {
            if mutates {
                // This reply is not checked after the fact (it cannot be rerun):
                // it lends no stretch of a directory holding another session's
                // exclusive inodes, whose attributes may be ahead on that client.
                if let Reply::Lookup { leaf, .. } = reply {
                    if leaf.items.iter().any(|i| self.caps.exclusive_elsewhere(session, i.attr.ino).is_some()) {
                        *leaf = p::DirLeaf::none();
                    }
                }
            } else if let (None, Some(h)) = (acquires, looked_up) {
                self.narrow_lent_stretch(session, h, reply);
            }
            if !mutates && acquires.is_none() {
                withheld = self.withhold_contended(session, inode_of_op, getattr, millis(now), reply);
            }
            if creates {
                if let Reply::Entry(a) = reply {
                    // Its client takes these rights with the reply; short of
                    // space, they are recalled as soon as given (space.rs).
                    self.caps.grant_exclusive(session, a.ino);
                    if self.space.low() {
                        self.recall_for_space(&[a.ino], millis(now));
                    }
                }
            }
            if let (Some(dir), Reply::Lookup { leaf, .. }) = (acquires, &*reply) {
                self.contention.used(dir, session, millis(now));
                self.caps.grant_exclusive(session, dir);
                for i in &leaf.items {
                    self.caps.grant_exclusive(session, i.attr.ino);
                }
            }
            if rmdir {
                if let Some(&victim) = touched.get(1) {
                    self.caps.drop_exclusive(victim);
                }
            }
            let mut c = carried(inode_of_op, reply);
            c.retain(|i| !withheld.contains(i));
            self.carried.extend(&c);
            self.changed.extend(touched);
            if acquires.is_some() {
                self.changed.extend(&c);
            }
            self.caps.grant(session, c);
        }
        r
    }

    /// A look-up lends no stretch naming what another session holds exclusively (besides
    /// what it looked up), as a change's reply lends none: the reply would wait for those
    /// to be recalled, and mounts each working in a directory of their own under one
    /// parent would take each other's away at every look-up. It lends the stretch of the
    /// name's own hash `h` instead (what the answer stands on: the name, and any that
    /// share its hash). The same for a name that is not there: the look-up before each
    /// create in a directory several mounts create in would otherwise take back every file
    /// the others just made.
    fn narrow_lent_stretch(&self, session: SessionId, h: u64, reply: &mut Reply) {
        let Reply::Lookup { attr, leaf } = reply else { return };
        let found = attr.as_ref().map(|a| a.ino);
        let elsewhere =
            |i: &p::DirItem| Some(i.attr.ino) != found && self.caps.exclusive_elsewhere(session, i.attr.ino).is_some();
        if leaf.items.iter().any(elsewhere) {
            leaf.items.retain(|i| p::name_hash(&i.name) == h);
            (leaf.hash_lo, leaf.hash_hi) = (h, h);
            if leaf.items.iter().any(elsewhere) {
                *leaf = p::DirLeaf::none();
            }
        }
    }

    /// A reply that only reads lends nothing of a directory other sessions are changing
    /// (`Contention::shared`) and this one does not hold exclusively: a look-up in it
    /// lends no stretch of it, a look-up that finds it lends no stretch of its parent
    /// (whose entry for it would carry its attributes), and a getattr of it answers
    /// `AttrOnly` to a session that speaks it. Whoever caches a directory's names or
    /// attributes must be recalled at every change in it: in a directory several mounts
    /// create in, every create recalled the others, who took it back at their next look-up
    /// or permission check (docs/protocol.md §4.1 "Shared directories"). Returns the
    /// inodes the reply must not grant.
    fn withhold_contended(
        &self,
        session: SessionId,
        inode_of_op: Option<u64>,
        getattr: bool,
        now_ms: u64,
        reply: &mut Reply,
    ) -> Vec<u64> {
        // (Not one another session holds whole: the reply must then wait for its recall,
        // which only what the reply carries triggers, `park_if_exclusive`.)
        let contended = |dir: u64| {
            self.contention.shared(dir, session, now_ms)
                && !self.caps.holds_exclusive(session, dir)
                && self.caps.exclusive_elsewhere(session, dir).is_none()
        };
        match reply {
            Reply::Lookup { attr, leaf } => {
                let parent = inode_of_op.filter(|&d| contended(d));
                let found = attr.as_ref().filter(|a| a.kind == p::FileType::Directory && contended(a.ino));
                let withheld: Vec<u64> = parent.into_iter().chain(found.map(|a| a.ino)).collect();
                if !withheld.is_empty() {
                    *leaf = p::DirLeaf::none();
                }
                withheld
            }
            Reply::Attr(a) if getattr && a.kind == p::FileType::Directory && contended(a.ino) => {
                let speaks = self.sessions.get(&session).is_some_and(|s| s.protocol >= p::PROTOCOL_ATTR_ONLY);
                if !speaks {
                    return Vec::new();
                }
                let ino = a.ino;
                *reply = Reply::AttrOnly(a.clone());
                vec![ino]
            }
            _ => Vec::new(),
        }
    }

    /// Parked requests are free to run and wait for their slice: the driver should `tick`
    /// again soon rather than wait for its period.
    pub fn has_parked_ready(&self) -> bool {
        self.parked_ready
    }

    /// Lets the store commit on its schedule, releases change replies whose recalls went
    /// unanswered too long, and drops restored sessions whose clients
    /// did not come back within `RESTORED_SESSION_GRACE_MS`.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), s::Error> {
        self.started_ms.get_or_insert(now_ms);
        self.tick_grace(now_ms);
        self.drop_stale_fenced_markers(now_ms);
        self.drop_unresumed(now_ms);
        self.fence_lapsed(now_ms);
        self.lapse_disconnected(now_ms);
        let late = self.caps.expire(now_ms);
        self.outbox.extend(late);
        self.release_pins();
        if !self.parked.is_empty() {
            self.run_parked(time_of_millis(now_ms));
        }
        let r = self.store.tick(now_ms);
        self.note_commits();
        self.watch_space(now_ms);
        self.abort_idle_receives(now_ms);
        r
    }

    /// Recalls every exclusive right when the image has just run short of space.
    fn watch_space(&mut self, now_ms: u64) {
        let clients = self.sessions.len().saturating_sub(self.disconnected.len());
        if self.space.update(&self.store.statfs(), clients) {
            let all = self.caps.exclusive_inodes();
            self.recall_for_space(&all, now_ms);
        }
    }

    /// Recalls every session's exclusive rights on `inodes`, on the server's own behalf.
    fn recall_for_space(&mut self, inodes: &[u64], now_ms: u64) {
        let mut out = Vec::new();
        self.caps.recall_exclusive(NO_SESSION, inodes, now_ms, &mut out);
        self.outbox.extend(out);
    }

    /// Drops every lock of `session`, saying why in the log.
    fn release_locks(&mut self, session: SessionId, why: &str) {
        let n = self.locks.release_session(session);
        if n > 0 {
            tracing::info!(session, "{why}: {n} locks released");
        }
    }
}
