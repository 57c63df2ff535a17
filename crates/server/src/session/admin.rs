//! Administrative calls (`crest dataset …`): one name-value list in, one out
//! (docs/protocol.md §5). A call on many names answers for each (`results`: name → "ok"
//! or the error), in one transaction, and costs O(names); everything a call changed is
//! committed before its answer goes.

use super::*;
use crest_nvlist::{NvList, Value};
use s::datasets::{check_prop, show_prop, DatasetInfo};

/// Most names one call may carry.
pub const MAX_ADMIN_NAMES: usize = 100_000;
/// Most sessions `server.status` lists one by one (it counts them all).
pub const MAX_STATUS_SESSIONS: usize = 10_000;

/// A call's failure: errno and message.
pub(super) type Failed = (i32, String);

pub(super) fn err_of(e: &s::Error) -> Failed {
    (e.errno(), e.to_string())
}

pub(super) fn invalid(msg: impl Into<String>) -> Failed {
    (22, msg.into())
}

pub(super) fn text<'a>(call: &'a NvList, name: &str) -> Result<&'a str, Failed> {
    call.get_str(name).ok_or_else(|| invalid(format!("argument {name:?} missing or not text")))
}

/// Properties given as text (`name` → `Str`), checked and typed as stored.
fn typed_props(call: &NvList) -> Result<Vec<(String, Option<Value>)>, Failed> {
    let mut out = Vec::new();
    if let Some(given) = call.get("props") {
        let Value::List(given) = given else { return Err(invalid("props must be a list")) };
        for (k, v) in given.iter() {
            let Value::Str(v) = v else { return Err(invalid(format!("property {k}: a text value"))) };
            out.push((k.to_string(), Some(check_prop(k, v).map_err(|e| err_of(&e))?)));
        }
    }
    if let Some(Value::Strs(clear)) = call.get("clear") {
        out.extend(clear.iter().map(|k| (k.clone(), None)));
    }
    Ok(out)
}

/// A dataset as `list` and `get` answer it: `name`, `id`, `inodes`, `props` (as text).
fn describe(d: &DatasetInfo) -> NvList {
    let mut l = NvList::new();
    let mut props = NvList::new();
    for (k, v) in d.props.iter() {
        let _ = props.add(k, Value::Str(show_prop(k, v)));
    }
    let _ = l.add("name", Value::Str(d.name.clone()));
    let _ = l.add("id", Value::U64(d.id));
    let _ = l.add("inodes", Value::U64(d.inodes));
    let _ = l.add("props", Value::List(props));
    l
}

/// What `Server::admin_start` did with a call.
#[derive(Debug, PartialEq, Eq)]
pub enum AdminStart {
    /// Answered (the encoded answer).
    Done(Vec<u8>),
    /// Waits for clients to write back what they acknowledged (a snapshot); its answer
    /// comes from `take_admin_answers` with this token.
    Pending(u64),
}

/// A call waiting for the recalls it sent to be answered (a snapshot, a dataset made
/// read-only): then it runs as `admin` would.
#[derive(Debug)]
pub(super) struct PendingSnapshot {
    token: u64,
    call: Vec<u8>,
    /// The datasets whose writers must write back first.
    datasets: HashSet<u64>,
    /// Recalls not yet answered.
    waiting: HashSet<u64>,
    /// Asked for in a grace period: restored sessions may still replay changes they
    /// were told were done, and take back rights; the recalls go out once it is over.
    after_grace: bool,
}

fn answer_of(r: Result<NvList, Failed>) -> Vec<u8> {
    match r {
        Ok(l) => l.encode(),
        Err((errno, message)) => {
            let mut l = NvList::new();
            let _ = l.add("error", Value::Str(message));
            let _ = l.add("errno", Value::U64(errno.unsigned_abs().into()));
            l.encode()
        }
    }
}

impl Server {
    /// Starts an administrative call: answered at once, or, for a snapshot, once every
    /// client that may hold acknowledged changes of its datasets has written them back
    /// (module doc of `snapshots` in the store: a snapshot holds exactly what was
    /// acknowledged before it) — and, after a restart, once the grace period is over:
    /// until then a restored session may still replay a change it was told was done.
    pub fn admin_start(&mut self, call: &[u8], now: p::Time) -> AdminStart {
        let Ok(l) = NvList::decode(call) else { return AdminStart::Done(self.admin(call, now)) };
        let mut datasets = HashSet::new();
        match l.get_str("cmd") {
            Some("snapshot.create") => {
                let names = match l.get("names") {
                    Some(Value::Strs(n)) if !n.is_empty() && n.len() <= MAX_ADMIN_NAMES => n.clone(),
                    _ => return AdminStart::Done(answer_of(Err(invalid("argument \"names\": 1 to 100,000 texts")))),
                };
                for n in &names {
                    match n.split_once('@').map(|(d, _)| self.store.dataset_id(d)) {
                        Some(Ok(d)) if !self.store.is_snapshot(d) => {
                            datasets.insert(d);
                        }
                        _ => {
                            return AdminStart::Done(answer_of(Err(invalid(format!("{n}: DATASET@NAME of a dataset")))))
                        }
                    }
                }
            }
            // Made read-only: what clients acknowledged before must land first, and none
            // may answer changes itself after.
            Some("dataset.set")
                if l.get_list("props")
                    .and_then(|p| p.get_str("readonly"))
                    .is_some_and(|v| matches!(check_prop("readonly", v), Ok(Value::Bool(true)))) =>
            {
                match l.get_str("name").map(|n| self.store.dataset_id(n)) {
                    Some(Ok(d)) => {
                        datasets.insert(d);
                    }
                    _ => return AdminStart::Done(self.admin(call, now)),
                }
            }
            _ => return AdminStart::Done(self.admin(call, now)),
        }
        let after_grace = self.in_grace();
        let waiting = if after_grace { HashSet::new() } else { self.recall_writers_of(&datasets, now) };
        self.next_admin_token += 1;
        let token = self.next_admin_token;
        self.pending_snapshots.push(PendingSnapshot { token, call: call.to_vec(), datasets, waiting, after_grace });
        AdminStart::Pending(token)
    }

    /// Recalls what any session may hold unwritten in `datasets`: exclusive rights (it
    /// answers changes itself and writes them back) and files it holds open for writing
    /// (its kernel's cached pages). Returns the recall ids to wait for.
    fn recall_writers_of(&mut self, datasets: &HashSet<u64>, now: p::Time) -> HashSet<u64> {
        let now_ms = millis(now);
        let inside = |ino: u64| datasets.contains(&s::datasets::dataset_of(ino));
        let exclusive: Vec<u64> = self.caps.exclusive_inodes().into_iter().filter(|&i| inside(i)).collect();
        let mut out = Vec::new();
        // (Session 0 is nobody: every holder is recalled.)
        let mut waiting = self.caps.recall_exclusive(0, &exclusive, now_ms, &mut out);
        let mut writers: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for (&id, sess) in &self.sessions {
            for (&ino, handles) in &sess.open {
                if inside(ino) && handles.values().any(|a| a & p::OPEN_WRITE != 0) && !exclusive.contains(&ino) {
                    writers.entry(id).or_default().push(ino);
                }
            }
        }
        waiting.extend(self.caps.recall_for_flush(writers, now_ms, &mut out));
        self.outbox.extend(out);
        waiting
    }

    /// Answers of calls that waited (`AdminStart::Pending`), by token, once ready: the
    /// snapshots whose recalls are all answered (or timed out, their holders fenced) are
    /// taken now.
    pub fn take_admin_answers(&mut self, now: p::Time) -> Vec<(u64, Vec<u8>)> {
        let mut ready = Vec::new();
        let mut still = Vec::new();
        for mut p in std::mem::take(&mut self.pending_snapshots) {
            if p.after_grace {
                if self.in_grace() {
                    still.push(p);
                    continue;
                }
                p.after_grace = false;
                p.waiting = self.recall_writers_of(&p.datasets, now);
            }
            if p.waiting.iter().any(|&id| self.caps.recall_pending(id)) {
                still.push(p);
            } else {
                ready.push(p);
            }
        }
        self.pending_snapshots = still;
        ready.into_iter().map(|p| (p.token, self.admin(&p.call, now))).collect()
    }

    /// Runs one administrative call (an encoded name-value list) at `now`; returns the
    /// encoded answer. Never fails: a bad call is answered with `error`. (A snapshot taken
    /// this way does not wait for clients: `admin_start` does.)
    pub fn admin(&mut self, call: &[u8], now: p::Time) -> Vec<u8> {
        let (answer, commit) = match NvList::decode(call) {
            // The parts of a receive need no commit of their own: nothing in them is
            // acknowledged until `receive.finish`, which commits (the store still commits
            // on its own schedule meanwhile).
            // (Nor does a status: it changes nothing.)
            Ok(call) => {
                let commit = !matches!(call.get_str("cmd"), Some("receive.chunk" | "server.status"));
                (self.admin_call(&call, now), commit)
            }
            Err(e) => (Err(invalid(format!("not a name-value list: {e}"))), true),
        };
        if !commit {
            return answer_of(answer);
        }
        answer_of(answer.and_then(|a| match self.store.commit() {
            Ok(()) => Ok(a),
            Err(e) => Err(err_of(&e)),
        }))
    }

    /// `crest status`: the store's counters, the sessions (who, which dataset, whether
    /// connected) and the operations served since start, by kind.
    /// `brief` (what `crest stats` and the Prometheus page ask for, often): the counters
    /// and totals without the sessions listed one by one, whose rights take a walk over
    /// every right held.
    fn status_into(&self, out: &mut NvList, now: p::Time, brief: bool) {
        let st = self.store.stats();
        let _ = out.add("release", Value::Str(self.release.clone()));
        let _ = out.add("image", Value::Str(self.image.clone()));
        let _ = out.add("protocols", Value::Str(format!("{}-{}", p::OLDEST_PROTOCOL_VERSION, p::PROTOCOL_VERSION)));
        let now_ms = super::millis(now);
        let up = self.started_ms.map_or(0, |t| now_ms.saturating_sub(t));
        let _ = out.add("uptime_ms", Value::U64(up));
        let space = self.store.statfs();
        let block = u64::from(space.block_size);
        let _ = out.add("space_total_bytes", Value::U64(space.total_blocks.saturating_mul(block)));
        let _ = out.add("space_free_bytes", Value::U64(space.free_blocks.saturating_mul(block)));
        self.activity.add_to(out);
        let _ = out.add("generation", Value::U64(self.store.generation()));
        let _ = out.add("commits", Value::U64(st.commits));
        let _ = out.add("bytes_written", Value::U64(st.bytes_written));
        let _ = out.add("repaired", Value::U64(st.repaired));
        let _ = out.add("grace", Value::Bool(self.in_grace()));
        let datasets = self.store.datasets();
        let listed_datasets: Vec<NvList> = datasets
            .iter()
            .map(|d| {
                let mut l = NvList::new();
                let _ = l.add("name", Value::Str(d.name.clone()));
                let _ = l.add("inodes", Value::U64(d.inodes));
                l
            })
            .collect();
        let _ = out.add("datasets", Value::Lists(listed_datasets));
        let names: HashMap<u64, String> = datasets.into_iter().map(|d| (d.id, d.name)).collect();
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        let _ = out.add("sessions_total", Value::U64(ids.len() as u64));
        let connected = ids.iter().filter(|id| !self.disconnected.contains_key(id)).count();
        let _ = out.add("sessions_connected", Value::U64(connected as u64));
        // The server's queue: changes parked behind other sessions' rights, or run and
        // waiting for an earlier answer of their session to go first.
        let in_flight: usize = self.sessions.values().map(|s| s.reserved.len() + s.unreleased.len()).sum();
        let _ = out.add("changes_in_flight", Value::U64(in_flight as u64));
        let mut served = NvList::new();
        for (kind, n) in &self.served {
            let _ = served.add(*kind, Value::U64(*n));
        }
        let _ = out.add("served", Value::List(served));
        let _ = out.add("service", Value::List(self.service.to_nvlist()));
        if brief {
            return;
        }
        let held = self.caps.held_per_session();
        let listed = ids
            .iter()
            .take(MAX_STATUS_SESSIONS)
            .filter_map(|id| self.sessions.get(id).map(|s| (id, s)))
            .map(|(&id, s)| {
                let mut l = NvList::new();
                let _ = l.add("id", Value::U64(id));
                let _ = l.add("client", Value::Str(s.client_name.clone()));
                let _ = l.add("identity", Value::Str(s.identity.clone().unwrap_or_default()));
                let _ = l.add("dataset", Value::Str(names.get(&s.dataset).cloned().unwrap_or_default()));
                let _ = l.add("connected", Value::Bool(!self.disconnected.contains_key(&id)));
                let _ = l.add("protocol", Value::U64(u64::from(s.protocol)));
                let (shared, exclusive) = held.get(&id).copied().unwrap_or_default();
                let _ = l.add("rights_shared", Value::U64(shared));
                let _ = l.add("rights_exclusive", Value::U64(exclusive));
                let _ = l.add("open_handles", Value::U64(s.open.values().map(|h| h.len() as u64).sum()));
                let _ = l.add("address", Value::Str(s.peer.clone()));
                // Its changes in flight here: parked behind another session's rights, or
                // run and waiting for an earlier one's answer to go first.
                let in_flight = (s.reserved.len() + s.unreleased.len()) as u64;
                let _ = l.add("changes_in_flight", Value::U64(in_flight));
                if let Some(at) = self.last_heard.get(&id) {
                    let _ = l.add("heard_ms_ago", Value::U64(now_ms.saturating_sub(*at)));
                }
                l
            })
            .collect();
        let _ = out.add("sessions", Value::Lists(listed));
    }

    fn admin_call(&mut self, call: &NvList, now: p::Time) -> Result<NvList, Failed> {
        let mut out = NvList::new();
        match text(call, "cmd")? {
            "server.status" => self.status_into(&mut out, now, call.get_bool("brief") == Some(true)),
            "dataset.create" => {
                let name = text(call, "name")?;
                let mut props = NvList::new();
                for (k, v) in typed_props(call)? {
                    if let Some(v) = v {
                        props.set(k, v).map_err(|e| invalid(e.to_string()))?;
                    }
                }
                let owner = |k: &str, dflt: u64| call.get_u64(k).unwrap_or(dflt);
                let (uid, gid, mode) = (owner("uid", 0), owner("gid", 0), owner("mode", 0o755));
                let id = u32::try_from(uid).ok().zip(u32::try_from(gid).ok()).zip(u32::try_from(mode).ok());
                let Some(((uid, gid), mode)) = id else { return Err(invalid("uid, gid and mode are 32-bit")) };
                let d =
                    self.store.create_dataset(name, props, (uid, gid, mode), time_in(now)).map_err(|e| err_of(&e))?;
                tracing::info!(dataset = name, id = d, "dataset created");
                let _ = out.add("id", Value::U64(d));
            }
            "dataset.list" | "snapshot.list" => {
                let snapshots = call.get_str("cmd") == Some("snapshot.list");
                let all = self
                    .store
                    .datasets()
                    .iter()
                    .filter(|d| self.store.is_snapshot(d.id) == snapshots)
                    .map(describe)
                    .collect();
                let _ = out.add("datasets", Value::Lists(all));
            }
            "snapshot.create" => {
                let Some(Value::Strs(names)) = call.get("names") else {
                    return Err(invalid("argument \"names\" missing or not a list of texts"));
                };
                let ids = self.store.create_snapshots(names).map_err(|e| err_of(&e))?;
                tracing::info!(snapshots = ?names, "snapshots taken");
                let _ = out.add("ids", Value::Strs(ids.iter().map(u64::to_string).collect()));
            }
            "scrub.step" => {
                if call.get_bool("restart") == Some(true) {
                    self.store.scrub_restart().map_err(|e| err_of(&e))?;
                }
                let max = call.get_u64("max_blocks").unwrap_or(2048).clamp(1, 65_536);
                let st = self.store.scrub_step(max).map_err(|e| err_of(&e))?;
                let _ = out.add("blocks", Value::U64(st.blocks));
                let _ = out.add("nodes", Value::U64(st.nodes));
                let _ = out.add("repaired", Value::U64(st.repaired));
                let _ = out.add("fixed", Value::Strs(st.fixed.clone()));
                let _ = out.add("done", Value::Bool(st.done));
                let _ = out.add("dataset", Value::U64(st.dataset));
                let _ = out.add("more_bad", Value::U64(st.more_bad));
                // Paths only once done, and for the first hundred (each is a search).
                let mut bad = Vec::new();
                for (i, (ds, ino, what)) in st.bad.iter().enumerate() {
                    let mut b = NvList::new();
                    let _ = b.add("dataset", Value::Str(ds.clone()));
                    let _ = b.add("ino", Value::U64(*ino));
                    let _ = b.add("what", Value::Str(what.clone()));
                    if st.done && i < 100 {
                        let path =
                            self.store.dataset_id(ds).ok().and_then(|d| self.store.path_of(d, *ino).ok().flatten());
                        if let Some(p) = path {
                            let _ = b.add("path", Value::Str(p));
                        }
                    }
                    bad.push(b);
                }
                let _ = out.add("bad", Value::Lists(bad));
            }
            "snapshot.rollback" => {
                let name = text(call, "name")?;
                let d = self.store.origin_of(self.store.dataset_id(name).map_err(|e| err_of(&e))?);
                if self.dataset_in_use(d) {
                    return Err((16, format!("the dataset of {name} is mounted")));
                }
                self.store.rollback(name).map_err(|e| err_of(&e))?;
                // (Its inode counter went back: pooled numbers may be given by it again.)
                self.inode_pool.forget_all();
                tracing::info!(snapshot = name, "dataset rolled back");
            }
            "snapshot.destroy" => {
                let results = self.destroy_each(call, "snapshot", |st, name| st.destroy_snapshot(name))?;
                let _ = out.add("results", Value::List(results));
            }
            "dataset.get" => {
                let d = self.store.dataset(text(call, "name")?).map_err(|e| err_of(&e))?;
                let _ = out.add("dataset", Value::List(describe(&d)));
            }
            "dataset.set" => {
                let name = text(call, "name")?;
                self.store.set_dataset_props(name, &typed_props(call)?).map_err(|e| err_of(&e))?;
                tracing::info!(dataset = name, "dataset properties set");
            }
            "dataset.destroy" => {
                // (Numbers of a dataset that is gone are no use to anyone.)
                self.inode_pool.forget_all();
                let results = self.destroy_each(call, "dataset", |st, name| st.destroy_dataset(name))?;
                let _ = out.add("results", Value::List(results));
            }
            cmd @ ("send" | "receive.start" | "receive.chunk" | "receive.finish" | "receive.abort") => {
                if cmd != "send" {
                    // (A dataset received into takes the sender's inode counter.)
                    self.inode_pool.forget_all();
                }
                out = self.send_receive(cmd, call, now)?;
            }
            other => return Err(invalid(format!("unknown command {other:?}"))),
        }
        Ok(out)
    }
}

impl Server {
    /// Destroys each of a call's `names` (datasets or snapshots, `what`) with `destroy`, in
    /// order, refusing one a session mounts; the results by name ("ok" or why not).
    fn destroy_each(
        &mut self,
        call: &NvList,
        what: &str,
        destroy: impl Fn(&mut s::Store, &str) -> s::Result<()>,
    ) -> Result<NvList, Failed> {
        let Some(Value::Strs(names)) = call.get("names") else {
            return Err(invalid("argument \"names\" missing or not a list of texts"));
        };
        if names.len() > MAX_ADMIN_NAMES {
            return Err(invalid(format!("{} names in one call (at most {MAX_ADMIN_NAMES})", names.len())));
        }
        let mut results = NvList::new();
        for name in names {
            let r = match self.store.dataset_id(name) {
                Ok(d) if self.dataset_in_use(d) => Err(format!("{what} {name} is mounted")),
                Ok(_) => destroy(&mut self.store, name).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if r.is_ok() {
                tracing::info!(name = %name, "{what} destroyed");
            }
            // (A name given twice is answered once, for its first time.)
            let _ = results.add(name.clone(), Value::Str(r.err().unwrap_or_else(|| "ok".into())));
        }
        Ok(results)
    }
}
