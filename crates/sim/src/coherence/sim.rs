//! The simulation: virtual time, the network, faults, and the clients' system calls.

use super::*;

#[derive(Debug)]
pub(crate) enum Ev {
    ToServer {
        conn: u64,
        msg: ClientMessage,
    },
    ToClient {
        conn: u64,
        msg: ServerMessage,
    },
    Wake {
        client: usize,
        incarnation: u32,
    },
    Reconnect {
        client: usize,
        incarnation: u32,
    },
    Restart {
        client: usize,
    },
    /// A client's timer (every `LEASE_CHECK_US`): its core checks its lease and, idle for
    /// `HEARTBEAT_MS`, sends an empty request (id 0).
    Beat {
        client: usize,
        incarnation: u32,
    },
    /// While a client's system call waits on the server, another of its processes reads
    /// what the client holds (the kernel and the client's cache answer without waiting).
    Peek {
        client: usize,
        incarnation: u32,
    },
    Tick,
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) client: usize,
    pub(crate) alive: bool,
    pub(crate) session: Option<SessionId>,
    /// Delivery time of the last message each way (FIFO).
    pub(crate) last_up: u64,
    pub(crate) last_down: u64,
}

/// Fault rates, drawn per seed so that some runs are calm and some are rough.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    /// Per delivered message: the connection drops and everything in flight is lost.
    pub(crate) loss: f64,
    /// Per system call: the client is cut off for a while.
    pub(crate) partition: f64,
    /// Per system call: the client process dies.
    pub(crate) crash: f64,
    /// Per system call of an idle client: it unmounts cleanly.
    pub(crate) goodbye: f64,
    /// Per message: a slow one (up to 20 ms).
    pub(crate) slow: f64,
    /// Longest partition and reconnect wait (µs).
    pub(crate) max_partition_us: u64,
    pub(crate) max_reconnect_us: u64,
    /// Per partition: its connection breaks too (each side notices at once).
    pub(crate) partition_drops: f64,
    /// Per system call: the server dies just after a commit and starts again on its image
    /// (drawn from `Sim::crash_rng`; 0 unless server crashes are on).
    pub(crate) server_crash: f64,
}

pub(crate) struct Sim {
    pub(crate) seed: u64,
    pub(crate) rng: Stream,
    pub(crate) now: u64,
    pub(crate) seq: u64,
    pub(crate) events: BTreeMap<(u64, u64), Ev>,
    pub(crate) server: Server,
    pub(crate) disk: MemDisk,
    pub(crate) conns: BTreeMap<u64, Conn>,
    pub(crate) next_conn: u64,
    pub(crate) server_conn: BTreeMap<SessionId, u64>,
    pub(crate) clients: Vec<Client>,
    pub(crate) ck: Checker,
    pub(crate) faults: Faults,
    pub(crate) trace: VecDeque<String>,
    pub(crate) steps: usize,
    pub(crate) max_steps: usize,
    pub(crate) draining: bool,
    /// Events kept for the report (`CREST_SIM_TRACE`, default `TRACE_EVENTS`).
    pub(crate) trace_events: usize,
    /// Percent of calls a client makes in its working set (per seed: how much clients
    /// keep to themselves, hence how long exclusive rights last).
    pub(crate) locality: u64,
    /// Percent of the unlinks, rmdirs and creates in a directory not held whole before
    /// which a client asks for it (`Op::Acquire`; per seed).
    pub(crate) acquire_pct: u64,
    /// The server's contention window (`Server::set_contention_window`): 0 in half the
    /// seeds, so acquires also race with other sessions' changes of the directory.
    pub(crate) contention_ms: u64,
    /// Processes per client: how many of its system calls may wait on the server at once.
    pub(crate) procs: usize,
    /// Hash of every event so far.
    pub(crate) trace_hash: u64,
    pub(crate) modes: Modes,
    /// Draws of the server crashes, apart from `rng` so that a seed without them runs as
    /// it did before they existed.
    pub(crate) crash_rng: Stream,
    /// Lives of the server so far (bumped by each crash).
    pub(crate) server_life: u64,
    /// The highest session number any server life has handed out.
    pub(crate) max_session: SessionId,
    /// The clients' clock at `EPOCH_S` (their cores take `Instant`s).
    pub(crate) t0: Instant,
    /// The server crashes now and then in this run.
    pub(crate) server_crashes: bool,
}

impl Sim {
    pub(crate) fn new(seed: u64, max_steps: usize, server_crashes: bool, modes: Modes) -> Sim {
        let mut rng = Stream::from_seed_u64(seed);
        let mut crash_rng = Stream::from_seed_u64(seed ^ 0x5e7e_c7a5_4000_0001);
        let disk = MemDisk::new(64 << 20);
        let t = crest_store::Timespec::new(EPOCH_S as i64 - 10, 0);
        Store::mkfs(
            Box::new(disk.clone()),
            &MkfsOptions { now: t, fsid: Some([7; 16]), seed: Some(seed), meta_copies: 2 },
        )
        .expect("mkfs");
        let mut store = Store::open(Box::new(disk.clone())).expect("open");
        let root = crest_server::convert::attr_out(&store.getattr(ROOT_INO).expect("root"));
        let mut server = Server::new(store);
        server.record_applied();
        // (Session secrets travel in the client cores' hellos: drawn from the seed.)
        server.seed_randomness(seed ^ 0x5e55_1015);
        // (Drawn apart from `rng`: every other choice of a seed stays as it was.)
        let contention_ms =
            [0, crest_server::contention::CONTENTION_MS][Stream::from_seed_u64(seed ^ 0xc0_17e5).below(2) as usize];
        server.set_contention_window(contention_ms);
        // (The model hands inode numbers out from the counter alone.)
        server.reuse_inode_numbers(false);
        let t0 = Instant::now();
        let pick = |rng: &mut Stream, v: &[f64]| v[rng.below(v.len() as u64) as usize];
        let faults = Faults {
            loss: pick(&mut rng, &[0.0, 0.001, 0.005, 0.02]),
            partition: pick(&mut rng, &[0.0, 0.001, 0.005]),
            crash: pick(&mut rng, &[0.0, 0.0005, 0.002]),
            goodbye: pick(&mut rng, &[0.0, 0.001]),
            slow: pick(&mut rng, &[0.0, 0.01, 0.05]),
            max_partition_us: MAX_PARTITION_US,
            max_reconnect_us: MAX_RECONNECT_US,
            partition_drops: 0.0,
            server_crash: 0.0,
        };
        let server_crash = if server_crashes { [0.0003, 0.001, 0.003][crash_rng.below(3) as usize] } else { 0.0 };
        let faults = Faults { server_crash, ..faults };
        let faults = if modes.long_outages {
            Faults {
                max_partition_us: LONG_PARTITION_US,
                max_reconnect_us: LONG_RECONNECT_US,
                partition_drops: 0.5,
                ..faults
            }
        } else {
            faults
        };
        let n = 2 + rng.below(4) as usize;
        let locality = 30 + rng.below(65);
        let acquire_pct = [0, 30, 70, 100][rng.below(4) as usize];
        let procs = [1, 2, 2, 3][rng.below(4) as usize];
        let mut inodes = BTreeMap::new();
        inodes.insert(
            ROOT_INO,
            MInode {
                kind: p::FileType::Directory,
                mode: root.mode,
                nlink: root.nlink,
                uid: root.uid,
                gid: root.gid,
                data: Vec::new(),
                mtime: root.mtime,
                ctime: root.ctime,
                parent: ROOT_INO,
                xattrs: BTreeMap::new(),
                opens: BTreeSet::new(),
            },
        );
        let mut dirs = BTreeMap::new();
        dirs.insert(ROOT_INO, BTreeMap::new());
        let model = Model {
            inodes,
            dirs,
            next_ino: ROOT_INO + 1,
            pinned: BTreeMap::new(),
            grace: None,
            early: BTreeSet::new(),
            reopen: BTreeSet::new(),
            locks: Default::default(),
            side: 0,
        };
        let mut ck = Checker::default();
        ck.snaps.insert(0, Rc::new(model.clone()));
        ck.model = Some(model);
        ck.generations.insert(ROOT_INO, root.generation);
        let mut sim = Sim {
            seed,
            rng,
            now: EPOCH_S * 1_000_000,
            seq: 0,
            events: BTreeMap::new(),
            server,
            disk,
            conns: BTreeMap::new(),
            next_conn: 1,
            server_conn: BTreeMap::new(),
            clients: (0..n).map(|i| Client::new(i, 0, t0)).collect(),
            t0,
            server_crashes,
            ck,
            faults,
            trace: VecDeque::new(),
            steps: 0,
            max_steps,
            draining: false,
            trace_events: crate::env_u64("CREST_SIM_TRACE").ok().flatten().map_or(TRACE_EVENTS, |n| n as usize),
            locality,
            acquire_pct,
            contention_ms,
            procs,
            trace_hash: 0xcbf2_9ce4_8422_2325,
            modes,
            crash_rng,
            server_life: 0,
            max_session: 0,
        };
        sim.log(format!(
            "seed {seed}: {n} clients of {procs} processes, locality {locality}%, acquires {acquire_pct}%, contention window {contention_ms} ms, faults {:?}",
            sim.faults
        ));
        for c in 0..n {
            sim.connect(c);
            for _ in 0..procs {
                let d = sim.think();
                sim.at(d, Ev::Wake { client: c, incarnation: 0 });
            }
            let phase = sim.rng.below(LEASE_CHECK_US);
            sim.at(phase, Ev::Beat { client: c, incarnation: 0 });
            let d = PEEK_US / 2 + sim.rng.below(PEEK_US);
            sim.at(d, Ev::Peek { client: c, incarnation: 0 });
        }
        sim.at(10_000, Ev::Tick);
        sim
    }

    pub(crate) fn log(&mut self, s: String) {
        // FNV-1a over every event: two runs of a seed must agree.
        for b in s.bytes() {
            self.trace_hash = (self.trace_hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        if self.trace.len() == self.trace_events {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("[{:>10.6}] {s}", (self.now - EPOCH_S * 1_000_000) as f64 / 1e6));
    }

    pub(crate) fn at(&mut self, delay_us: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((self.now + delay_us, self.seq), ev);
    }

    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.rng.next_u64() as f64 / u64::MAX as f64) < p
    }

    pub(crate) fn think(&mut self) -> u64 {
        self.rng.below(10_000)
    }

    pub(crate) fn latency(&mut self) -> u64 {
        let slow = self.faults.slow;
        let base = 20 + self.rng.below(300);
        if self.chance(slow) {
            base + self.rng.below(20_000)
        } else {
            base
        }
    }

    pub(crate) fn send_up(&mut self, conn: u64, msg: ClientMessage) {
        let lat = self.latency();
        let Some(cn) = self.conns.get(&conn) else { return };
        let until = self.clients[cn.client].partition_until;
        let t = (self.now + lat).max(until + lat).max(cn.last_up);
        self.conns.get_mut(&conn).expect("conn").last_up = t;
        let d = t - self.now;
        self.at(d, Ev::ToServer { conn, msg });
    }

    pub(crate) fn send_down(&mut self, conn: u64, msg: ServerMessage) {
        let lat = self.latency();
        let Some(cn) = self.conns.get(&conn) else { return };
        let until = self.clients[cn.client].partition_until;
        let t = (self.now + lat).max(until + lat).max(cn.last_down);
        self.conns.get_mut(&conn).expect("conn").last_down = t;
        let d = t - self.now;
        self.at(d, Ev::ToClient { conn, msg });
    }

    pub(crate) fn instant(&self) -> Instant {
        self.t0 + Duration::from_micros(self.now - EPOCH_S * 1_000_000)
    }

    /// Client `c`'s core connects on a new connection: its hello goes up.
    pub(crate) fn connect(&mut self, c: usize) {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(id, Conn { client: c, alive: true, session: None, last_up: 0, last_down: 0 });
        let now = self.instant();
        let cl = &mut self.clients[c];
        if cl.core.state() == State::Closed && cl.session.is_none() {
            // Its first handshake broke off (the core takes that for "not a crest
            // server"): as a mount started again.
            (cl.core, cl.hook) = new_core(c, now);
        }
        cl.conn = Some(id);
        cl.core.connecting(now);
        cl.core.connected(now);
        self.log(format!("client {c}: connects (conn {id}, session {:?})", self.clients[c].session));
        self.sync(c);
    }

    /// After client `c`'s core took something in: what it told the cache is applied, its
    /// events are handled, and what it wrote goes up.
    pub(crate) fn sync(&mut self, c: usize) {
        loop {
            let told = std::mem::take(&mut *self.clients[c].hook.told.lock().unwrap_or_else(|e| e.into_inner()));
            for t in told {
                self.apply_told(c, t);
            }
            let Some(e) = self.clients[c].core.poll_event() else { break };
            match e {
                Event::Answer(id, r) => self.answered(c, id, r),
                Event::Recall(r) if r.recall_id == 0 => {
                    // Re-asserted rights the restarted server refused (another session
                    // holds what conflicts): dropped as a recall nobody answers.
                    self.ck.stats.reassert_refused += r.inodes.len() as u64;
                    self.log(format!("client {c}: rights on {:?} not given back", r.inodes));
                }
                Event::Recall(r) => self.clients[c].core.recall_done(r.recall_id),
                Event::Ready(_) | Event::Identity(_) => {}
            }
        }
        self.transmit(c);
    }

    /// What client `c`'s core told its cache (`Rights`; the cache has taken it in): the
    /// page-cache model follows, and it is counted and logged.
    pub(crate) fn apply_told(&mut self, c: usize, t: Told) {
        self.clients[c].told(&t);
        match t {
            Told::Recalled(_) | Told::Disconnected => {}
            Told::Reset => {
                self.log(format!("client {c}: drops every right (lease over, fenced, or session forgotten)"));
                for pd in self.clients[c].pending.values_mut() {
                    pd.rights_lapsed = true;
                }
            }
            Told::Restored(rights) => {
                self.ck.stats.reasserted += rights.len() as u64;
                if !rights.is_empty() {
                    self.log(format!("client {c}: re-asserts {rights:?}"));
                }
            }
            // A change kept by a restarted server but never answered: nothing it touched
            // is sure (dropped as a recall, by `NameCache::reply_lost`).
            Told::ReplyLost(_) => self.ck.stats.replies_lost += 1,
        }
    }

    /// What client `c`'s core wrote goes up its connection (none: it is lost). A request
    /// the simulator did not make is the core's own re-assert after a server restart.
    pub(crate) fn transmit(&mut self, c: usize) {
        let out = self.clients[c].core.poll_transmit();
        let Some(conn) = self.clients[c].conn.filter(|_| !out.is_empty()) else { return };
        let mut d = p::FrameDecoder::new();
        d.handle_bytes(&out);
        loop {
            let msg = match d.poll_message::<ClientMessage>() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return self.ck.fail(format!("client {c} wrote a bad frame: {e}")),
            };
            if let (ClientMessage::Request(r), Some(sid)) = (&msg, self.clients[c].session) {
                if r.id != 0 && !self.ck.reqs.contains_key(&(sid, r.id)) {
                    let t0_lc = self.ck.tick();
                    let info =
                        ReqInfo { client: c, ops: r.ops.clone(), time: r.time, purpose: Purpose::Reassert, t0_lc };
                    self.ck.reqs.insert((sid, r.id), info);
                    self.ck.relock.sent(sid, r.id, &r.ops);
                    self.ck.stats.to_server += 1;
                }
            }
            self.send_up(conn, msg);
        }
    }

    /// The connection breaks: everything in flight on it is lost.
    pub(crate) fn drop_conn(&mut self, conn: u64, why: &str) {
        let Some(cn) = self.conns.get_mut(&conn) else { return };
        if !cn.alive {
            return;
        }
        cn.alive = false;
        let (c, session) = (cn.client, cn.session);
        self.ck.stats.drops += 1;
        self.log(format!("conn {conn} of client {c} drops ({why})"));
        if let Some(s) = session {
            if self.server_conn.get(&s) == Some(&conn) {
                self.server_conn.remove(&s);
                self.server.disconnected(s, self.now / 1000);
            }
        }
        let cl = &mut self.clients[c];
        if cl.conn == Some(conn) {
            cl.conn = None;
            if cl.alive && !cl.leaving {
                cl.core.connection_lost(why);
                let inc = cl.incarnation;
                self.sync(c);
                let d = 1 + self.rng.below(self.faults.max_reconnect_us);
                self.at(d, Ev::Reconnect { client: c, incarnation: inc });
            }
        }
    }

    /// What the server queued: check it against the model, and send it.
    pub(crate) fn flush_server(&mut self, call_now: p::Time) {
        // Sessions the server fenced just now (inside `tick`, or a request's handling):
        // their writebacks not applied yet are lost from here on.
        let fenced: Vec<SessionId> = self
            .clients
            .iter()
            .filter_map(Client::sid)
            .chain(self.ck.dead_sessions.iter().copied())
            .filter(|s| !self.ck.fenced_sessions.contains(s) && self.server.is_fenced(*s))
            .collect();
        for &s in &fenced {
            self.log(format!("server: session {s} fenced"));
            self.ck.fenced_sessions.insert(s);
            self.ck.fenced(s);
            self.ck.stats.server_fenced += 1;
            // Its handles went with it, before what ran after the fencing (another
            // session's change released from parking by it, say).
            self.ck.model.as_mut().expect("model").end_session(s);
        }
        for a in self.server.take_applied() {
            if a.grace_ended {
                self.ck.model.as_mut().expect("model").end_grace();
            }
            let k_before = self.ck.k;
            if a.id != 0 {
                // (Id 0: a heartbeat.)
                if let Some(s) = self.ck.on_applied(a, call_now) {
                    self.log(s);
                }
            }
            self.ck.note_durable(k_before, a.generation, a.dirty);
        }
        // (Again for what the fenced session itself ran before its fencing.) Files kept
        // for opens on their way go when the server lets them.
        let model = self.ck.model.as_mut().expect("model");
        for s in fenced {
            model.end_session(s);
        }
        let server = &self.server;
        if !server.in_grace() {
            model.end_grace();
        }
        model.sync_pins(|ino| server.is_pinned(ino));
        for o in self.server.take_outgoing() {
            match o {
                Outgoing::Response { session, response } => self.response_out(session, response),
                // (A simulated disk hands out no reader, so no read is planned; were one,
                // it is answered in place.)
                Outgoing::Read { session, response, read } => {
                    let response = self.server.finish_read(session, response, &read);
                    self.response_out(session, response);
                }
                Outgoing::Notify { session, notify } => {
                    self.ck.stats.recalls += 1;
                    match self.server_conn.get(&session) {
                        Some(&conn) => {
                            self.log(format!("server: {notify:?} to session {session}"));
                            self.send_down(conn, ServerMessage::Notify(notify));
                        }
                        None => self.log(format!("server: {notify:?} to session {session} lost (no connection)")),
                    }
                }
            }
        }
    }

    /// A response from the server, seen by the checker and sent down its connection.
    fn response_out(&mut self, session: SessionId, response: crest_proto::Response) {
        // (A fenced session's requests get no response: `Notify::Fenced`.)
        if response.id == 0 {
            // A heartbeat's answer.
        } else {
            self.ck.on_response(session, &response);
        }
        if self.ck.dead_sessions.contains(&session) {
            // Had its client lived, it would have returned now.
            self.ck.completed((session, response.id));
        }
        match self.server_conn.get(&session) {
            Some(&conn) => self.send_down(conn, ServerMessage::Response(response)),
            None => self.log(format!("server: response {session}/{} lost (no connection)", response.id)),
        }
    }

    pub(crate) fn run(&mut self) -> Result<Stats, String> {
        let mut quiet_since: Option<u64> = None;
        let mut drain_started = 0;
        loop {
            if let Some(f) = self.ck.failure.take() {
                return Err(self.report(&f));
            }
            if !self.draining && self.steps >= self.max_steps {
                self.draining = true;
                drain_started = self.now;
                self.log("no more system calls; faults stop".into());
                for c in &mut self.clients {
                    c.partition_until = 0;
                }
                self.faults = Faults {
                    loss: 0.0,
                    partition: 0.0,
                    crash: 0.0,
                    goodbye: 0.0,
                    slow: 0.0,
                    server_crash: 0.0,
                    ..self.faults
                };
            }
            if self.draining {
                let busy = self.clients.iter().any(|c| c.alive && (!c.pending.is_empty() || !c.busy.is_empty()))
                    || self.clients.iter().any(|c| !c.alive || c.conn.is_none());
                if busy {
                    quiet_since = None;
                } else {
                    let since = *quiet_since.get_or_insert(self.now);
                    // Past every deadline: nothing can be waiting any more.
                    if self.now > since + 3 * RECALL_TIMEOUT_MS * 1000 {
                        break;
                    }
                }
                // Everything heals at once; a minute later nothing can be pending.
                if self.now > drain_started + 60_000_000 {
                    let stuck: Vec<_> =
                        self.clients.iter().map(|c| (c.idx, c.pending.keys().collect::<Vec<_>>())).collect();
                    return Err(self.report(&format!("liveness: requests never answered: {stuck:?}")));
                }
            }
            let Some(((t, _), ev)) = self.events.pop_first() else { break };
            self.now = t;
            self.step(ev);
        }
        self.final_check()?;
        Ok(Stats { trace_hash: self.trace_hash, ..self.ck.stats.clone() })
    }

    pub(crate) fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Tick => {
                let ms = self.now / 1000;
                self.server.tick(ms).expect("tick");
                self.flush_server(ptime(ms * 1000));
                self.at(10_000, Ev::Tick);
            }
            Ev::ToServer { conn, msg } => self.deliver_to_server(conn, msg),
            Ev::ToClient { conn, msg } => self.deliver_to_client(conn, msg),
            Ev::Wake { client, incarnation } => {
                let c = &self.clients[client];
                if c.alive && c.incarnation == incarnation && c.busy.len() < self.procs && !c.leaving {
                    self.syscall(client);
                }
            }
            Ev::Reconnect { client, incarnation } => {
                let c = &self.clients[client];
                if c.alive && c.incarnation == incarnation && c.conn.is_none() {
                    self.connect(client);
                }
            }
            Ev::Restart { client } => {
                let inc = self.clients[client].incarnation + 1;
                self.clients[client] = Client::new(client, inc, self.instant());
                self.log(format!("client {client}: starts again (incarnation {inc})"));
                self.connect(client);
                for _ in 0..self.procs {
                    let d = self.think();
                    self.at(d, Ev::Wake { client, incarnation: inc });
                }
                let phase = self.rng.below(LEASE_CHECK_US);
                self.at(phase, Ev::Beat { client, incarnation: inc });
                let d = PEEK_US / 2 + self.rng.below(PEEK_US);
                self.at(d, Ev::Peek { client, incarnation: inc });
            }
            Ev::Beat { client, incarnation } => {
                let c = &self.clients[client];
                if !c.alive || c.incarnation != incarnation {
                    return;
                }
                self.beat(client);
                self.at(LEASE_CHECK_US, Ev::Beat { client, incarnation });
            }
            Ev::Peek { client, incarnation } => {
                let c = &self.clients[client];
                if !c.alive || c.incarnation != incarnation || self.draining {
                    return;
                }
                if !c.busy.is_empty() && c.session.is_some() {
                    self.peek(client);
                }
                let d = PEEK_US / 2 + self.rng.below(PEEK_US);
                self.at(d, Ev::Peek { client, incarnation });
            }
        }
    }

    /// Another process of a client whose system call waits: a call answered without
    /// waiting — a read the client holds what it needs for, or a change or an open it
    /// answers itself (its writeback, or its `Open`, goes behind on the connection, stuck
    /// there with the waiting call when the client is cut off) — else not run (that
    /// process would wait too).
    pub(crate) fn peek(&mut self, c: usize) {
        let op = self.pick_meanwhile(c);
        if let Op::Release { handle, .. } = op {
            // (close(2) never waits, but the kernel sends the release only once no call
            // uses the descriptor: not while a call on the file waits, as in `syscall`.)
            let locks = self.locks_of(c, &op);
            if self.clients[c].busy.values().any(|theirs| locks_conflict(theirs, &locks)) {
                return;
            }
            self.ck.stats.peeks += 1;
            return self.close_behind(c, handle, op);
        }
        if op.is_mutation() || matches!(op, Op::Open { .. }) {
            // (As the kernel's inode locks make it: not while another process's call
            // holds what it needs. And not past `MEANWHILE_BACKLOG` calls unanswered:
            // the adapter's queue room, here small, so that a long outage does not
            // pile up more writeback than a few processes would make.)
            if self.clients[c].core.waiting() >= MEANWHILE_BACKLOG {
                return;
            }
            let locks = self.locks_of(c, &op);
            if self.clients[c].busy.values().any(|theirs| locks_conflict(theirs, &locks)) {
                return;
            }
            self.check_lease_now(c);
            if self.try_local(c, &op) {
                self.ck.stats.peeks += 1;
            }
            return;
        }
        self.check_lease_now(c);
        let (now, at) = (self.now, self.instant());
        let Some(reply) = self.clients[c].answer_from_cache(&op, at, now) else { return };
        self.ck.tick();
        self.ck.stats.peeks += 1;
        self.log(format!(
            "client {c}: (meanwhile) [{}] from its cache → {:?}",
            ops_brief(std::slice::from_ref(&op)),
            brief(&[Ok(reply.clone())])
        ));
        self.ck.check_cached(c, &op, &reply);
        self.ck.tick();
    }

    /// A client's timer (every 250 ms): its core
    /// drops every right once it has heard nothing for `CLIENT_LEASE_MS` (so up to 250 ms
    /// late here), and says it is alive when it has sent nothing for `HEARTBEAT_MS`.
    pub(crate) fn beat(&mut self, c: usize) {
        let now = self.instant();
        self.clients[c].core.handle_timeout(now);
        self.sync(c);
    }

    /// With `CREST_SIM_LEASE=exact`: the client also checks its lease before it answers
    /// anything itself (as `crest-net`, which wakes the core at the lease's deadline).
    pub(crate) fn check_lease_now(&mut self, c: usize) {
        if self.modes.exact_lease {
            self.beat(c);
        }
    }

    /// The client learns its session was fenced (`Notify::Fenced`, or a resume answered
    /// with `Welcome.fenced`), before its core does: what it answered itself and never
    /// wrote back is lost, its cache and its numbers for writeback creates go. Its core
    /// fails the pending changes (EIO; writeback completions become deferred errors) and
    /// keeps the calls that change nothing for the new session.
    pub(crate) fn fenced(&mut self, c: usize) {
        let old = self.clients[c].sid();
        self.log(format!("client {c}: session {old:?} was fenced; pending changes fail, rights dropped"));
        if let Some(s) = old {
            // (The checker marked them lost when the server fenced the session.)
            self.ck.locals.retain(|_, l| !(l.session == s && l.applied_k.is_none()));
        }
        let cl = &mut self.clients[c];
        cl.pool = (0, 0);
        // (Its handles and locks went with the session: the server released them.)
        cl.opens.clear();
        cl.locked.clear();
        cl.prior = old.or(cl.prior);
        cl.session = None;
        cl.answered_seq = 0;
        self.ck.stats.fenced += 1;
    }

    pub(crate) fn deliver_to_server(&mut self, conn: u64, msg: ClientMessage) {
        if !self.conns.get(&conn).is_some_and(|c| c.alive) {
            return;
        }
        let loss = self.faults.loss;
        if self.chance(loss) {
            self.drop_conn(conn, "message to the server lost");
            return;
        }
        let now = ptime(self.now);
        let session = self.conns[&conn].session;
        match msg {
            ClientMessage::Hello(h) => {
                let (sid, reply) = self.server.handle_hello(&h);
                let sid = sid.expect("a good hello");
                self.max_session = self.max_session.max(sid);
                // As the net layer: every message from a client renews its lease (requests
                // and recall answers do so inside the core).
                self.server.heard(sid, self.now / 1000);
                self.conns.get_mut(&conn).expect("conn").session = Some(sid);
                self.server_conn.insert(sid, conn);
                self.log(format!("server: hello on conn {conn} → session {sid}"));
                self.send_down(conn, reply);
                self.flush_server(now);
            }
            ClientMessage::Request(req) => {
                let sid = session.expect("hello first");
                if req.id != 0 {
                    self.log(format!("server: gets {sid}/{} [{}]", req.id, ops_brief(&req.ops)));
                }
                let opens: Vec<(u64, u64)> = req
                    .ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Open { ino, handle, .. } => Some((*ino, *handle)),
                        _ => None,
                    })
                    .collect();
                let key = (sid, req.id);
                // (A replay carries the time its change first ran at.)
                if let (Some(t), Some(info)) = (req.time, self.ck.reqs.get_mut(&key)) {
                    info.time = Some(t);
                }
                // (Re-opens sent again leave out the handles released meanwhile.)
                if let Some(info) = self.ck.reqs.get_mut(&key).filter(|i| matches!(i.purpose, Purpose::Reassert)) {
                    info.ops = req.ops.clone();
                }
                let runs = self.ck.runs.get(&key).copied();
                self.server.handle(sid, req, now);
                self.flush_server(now);
                // A parked request's opens took effect as it arrived (`Server::handle`).
                // (Not one that ran now, and was answered.)
                if !opens.is_empty() && self.ck.runs.get(&key).copied() == runs {
                    for (ino, handle) in opens {
                        if self.server.holds_open(sid, ino, handle) {
                            self.ck.model.as_mut().expect("model").opened_early(sid, ino, handle);
                        }
                    }
                }
            }
            ClientMessage::RecallDone { recall_id } => {
                let sid = session.expect("hello first");
                self.log(format!("server: recall {recall_id} done by session {sid}"));
                self.server.recall_done(sid, recall_id, now);
                self.flush_server(now);
            }
            ClientMessage::Replayed => {
                let sid = session.expect("hello first");
                self.log(format!("server: session {sid} has replayed"));
                if let Err(e) = self.ck.relock.replayed(sid) {
                    return self.ck.fail(e);
                }
                self.server.replayed(sid, now);
                self.flush_server(now);
            }
            ClientMessage::Goodbye => {
                let sid = session.expect("hello first");
                self.log(format!("server: goodbye from session {sid}"));
                self.server.end_session(sid);
                self.ck.model.as_mut().expect("model").end_session(sid);
                self.server_conn.remove(&sid);
                self.conns.get_mut(&conn).expect("conn").alive = false;
                self.flush_server(now);
            }
            // Joining is the TLS shell's business; the client core never sends it.
            ClientMessage::Join(_) => self.ck.fail("a client core sent a join".to_string()),
            ClientMessage::Admin(_) => self.ck.fail("a client core sent an administrative call".to_string()),
            ClientMessage::Renew(_) => self.ck.fail("a client core sent a renewal".to_string()),
        }
    }

    pub(crate) fn deliver_to_client(&mut self, conn: u64, msg: ServerMessage) {
        let Some(cn) = self.conns.get(&conn) else { return };
        let c = cn.client;
        if !cn.alive || self.clients[c].conn != Some(conn) || !self.clients[c].alive {
            return;
        }
        let loss = self.faults.loss;
        if self.chance(loss) {
            self.drop_conn(conn, "message to the client lost");
            return;
        }
        match &msg {
            ServerMessage::Welcome(w) => {
                if !self.before_welcome(c, w) {
                    return;
                }
            }
            ServerMessage::Refused { reason, .. } => return self.ck.fail(format!("client {c} refused: {reason}")),
            ServerMessage::Notify(p::Notify::Recall { recall_id, inodes }) => {
                self.log(format!("client {c}: recall {recall_id} of {inodes:?}"));
            }
            ServerMessage::Notify(p::Notify::Fenced) => self.fenced(c),
            ServerMessage::Notify(n) => return self.ck.fail(format!("unexpected notice {n:?}")),
            ServerMessage::Response(resp) => self.before_response(c, resp),
            ServerMessage::Joined(_) => return self.ck.fail("the server sent a certificate".to_string()),
            ServerMessage::Administered(_) => {
                return self.ck.fail("the server sent an administrative answer".to_string())
            }
        }
        let mut frame = Vec::new();
        if let Err(e) = p::encode_frame(&msg, &mut frame) {
            return self.ck.fail(format!("encoding {msg:?}: {e}"));
        }
        let now = self.instant();
        self.clients[c].core.handle_bytes(now, &frame);
        if let ServerMessage::Welcome(w) = &msg {
            self.after_welcome(c, w);
        }
        self.sync(c);
        if matches!(msg, ServerMessage::Notify(p::Notify::Fenced)) {
            // A new session, not a resume of the fenced one.
            self.drop_conn(conn, "fenced");
        }
    }

    /// A welcome, before client `c`'s core takes it: the simulator's checks and
    /// bookkeeping (false: failed). After a restart that restored the session the cache
    /// keeps only what it holds exclusively, and that is what the core re-asserts.
    pub(crate) fn before_welcome(&mut self, c: usize, w: &p::Welcome) -> bool {
        if w.fenced {
            self.fenced(c);
        }
        let restarted = self.clients[c].server_life != self.server_life;
        let (old, new) = (self.clients[c].sid(), w.session.id);
        if let (Some(old), false) = (old, w.resumed) {
            if !restarted {
                self.ck.fail(format!("client {c}: session not resumed: {w:?}"));
                return false;
            }
            // A restarted server without a record of the session (it had changed nothing
            // the server kept): a new session, every right dropped (by the core), and
            // everything unanswered goes again as new work.
            if self.clients[c].answered_seq > 0 {
                self.ck.fail(format!(
                    "client {c}: session {old} forgotten by the restarted server with changes answered (seq {})",
                    self.clients[c].answered_seq
                ));
                return false;
            }
            self.log(format!("client {c}: session {old} not restored: new session {new}"));
            // (Its handles went with it.)
            self.ck.model.as_mut().expect("model").end_session(old);
            self.clients[c].opens.clear();
            self.clients[c].locked.clear();
            let cl = &mut self.clients[c];
            cl.pool = (0, 0);
            cl.answered_seq = 0;
            for l in self.ck.locals.values_mut().filter(|l| l.session == old && l.applied_k.is_none()) {
                l.session = new;
            }
        }
        if let (true, Some(durable)) = (w.resumed, w.durable_seq) {
            self.log(format!("client {c}: welcome back after a restart (session {new}, durable {durable})"));
            if self.clients[c].answered_seq > durable {
                // Answered, and lost by a crash between commits: its core replays them
                // (the checker's `lost_done` waits for each).
                self.log(format!(
                    "client {c}: seqs {}..={} were answered and lost; replayed",
                    durable + 1,
                    self.clients[c].answered_seq
                ));
            }
            // What it held under shared rights may be stale: the server applied (and kept)
            // changes whose recalls were still unanswered when it died. Only what it holds
            // exclusively is sure, and asked back (`CacheRights::restored`, in the core).
        } else {
            self.log(format!("client {c}: welcome (session {new})"));
        }
        true
    }

    /// After client `c`'s core took a welcome, before what it wrote goes up: calls it
    /// still holds from an older session now belong to the new one.
    pub(crate) fn after_welcome(&mut self, c: usize, w: &p::Welcome) {
        let new = w.session.id;
        let cl = &mut self.clients[c];
        let from = cl.session.or(cl.prior.take());
        cl.session = Some(new);
        cl.server_life = self.server_life;
        if let Some(from) = from.filter(|&f| f != new) {
            let ids: Vec<u64> = cl.pending.keys().copied().collect();
            for id in ids {
                if let Some(info) = self.ck.reqs.get(&(from, id)).cloned() {
                    self.ck.reqs.insert((new, id), info);
                }
            }
        }
    }

    /// A response, before client `c`'s core takes it: a change comes back with the place
    /// the core sent it in.
    pub(crate) fn before_response(&mut self, c: usize, resp: &p::Response) {
        let core = &self.clients[c].core;
        if !core.awaits(resp.id) {
            return; // a second answer to a resent request
        }
        if let Some(pos) = core.place(resp.id) {
            if resp.seq != pos {
                let ops = self.clients[c].pending.get(&resp.id).map(|pd| pd.req.ops.clone());
                self.ck.fail(format!(
                    "client {c}: change {} placed {pos} answered with seq {} ({ops:?})",
                    resp.id, resp.seq
                ));
            }
            let cl = &mut self.clients[c];
            cl.answered_seq = cl.answered_seq.max(resp.seq);
        }
    }

    /// Client `c`'s core hands over the answer to call `id`.
    pub(crate) fn answered(&mut self, c: usize, id: u64, r: Result<Vec<Result<Reply, p::OpError>>, ClientError>) {
        let Some(pd) = self.clients[c].pending.remove(&id) else { return };
        let results = match r {
            Ok(results) => results,
            Err(ClientError::ReplyLost { .. }) => {
                // Kept by a restarted server, its answer lost: the change stands; the
                // caller is told EIO (the change counts as completed: it returned).
                let sid = self.clients[c].sid().expect("restored");
                match pd.purpose {
                    Purpose::Syscall => {
                        self.ck.completed((sid, id));
                        self.log(format!("client {c}: [{}] was kept; its answer is lost: EIO", ops_brief(&pd.req.ops)));
                    }
                    _ => self.ck.fail(format!("client {c}: request {id} ({:?}) kept without its answer", pd.purpose)),
                }
                return self.returned(c, id);
            }
            Err(e @ ClientError::Fenced { .. }) => {
                if let Purpose::Writeback { what, touched, .. } = &pd.purpose {
                    // Kept for the next fsync of what it touched, which reports it.
                    let failure = p::OpError { errno: e.errno(), message: e.to_string() };
                    let at = self.instant();
                    self.clients[c].names().writeback_answered(what, touched, Err(failure), at);
                }
                // The system call returns EIO. Had the server applied it, that change is
                // not a completed one: the caller was told it failed.
                self.log(format!("client {c}: [{}] returns EIO (fenced)", ops_brief(&pd.req.ops)));
                return self.returned(c, id);
            }
            Err(e) => return self.ck.fail(format!("client {c}: request {id} failed: {e}")),
        };
        let sid = self.clients[c].sid().expect("session");
        match pd.purpose {
            Purpose::Reassert => self.ck.fail(format!("client {c}: the core handed over a re-assert's answer")),
            Purpose::Behind => {
                self.log(format!("client {c}: [{}] answered {:?}", ops_brief(&pd.req.ops), brief(&results)))
            }
            Purpose::Syscall => {
                self.ck.completed((sid, id));
                self.log(format!("client {c}: [{}] returns {:?}", ops_brief(&pd.req.ops), brief(&results)));
                let at = self.instant();
                let sent = self.t0 + Duration::from_micros(pd.t0_us - EPOCH_S * 1_000_000);
                self.clients[c].absorb(&pd.req.ops, &results, (pd.t0_us, pd.epoch, pd.stamp, sent), at);
                self.returned(c, id);
            }
            Purpose::Acquire { dir, then, epoch } => {
                // As the adapter's `acquire`: the grants came through the core (in wire
                // order with recalls); the listing is taken in unless a recall or a change
                // came in between.
                let at = self.instant();
                let cl = &mut self.clients[c];
                let took = match results.first() {
                    Some(Ok(Reply::Lookup { attr: Some(a), leaf })) => {
                        cl.learn(a);
                        leaf.items.iter().for_each(|i| _ = cl.known.insert(i.attr.ino, i.attr.kind));
                        cl.names().absorb_acquired(a, leaf, epoch, at)
                    }
                    _ => false,
                };
                self.ck.stats.acquired += u64::from(took);
                self.ck.stats.acquired_without_x += u64::from(took && !self.clients[c].names().is_exclusive(dir));
                self.log(format!(
                    "client {c}: acquire {dir} returns {:?}{}",
                    brief(&results),
                    if took { "; holds it whole" } else { "" }
                ));
                // The system call goes on: answered here if the directory was taken in
                // and it now can be (as `Fs::unlink`, `create_node`), else sent.
                self.check_lease_now(c);
                if took && self.try_local(c, &then) {
                    self.returned(c, id);
                } else {
                    // (The same process goes on waiting, holding what it held.)
                    let locks = self.clients[c].busy.remove(&id).unwrap_or_default();
                    let t0_lc = self.ck.tick();
                    self.send_syscall(c, then, t0_lc, locks);
                }
            }
            Purpose::Writeback { n, what, touched } => {
                self.log(format!("client {c}: writeback {n} answered {:?}", brief(&results)));
                let at = self.instant();
                self.clients[c].names().writeback_answered(what, &touched, Ok(&results), at);
                match results.first() {
                    // An open answered here whose session was fenced before it reached
                    // the server went on in the next session (it changes nothing): the
                    // file may be gone by then, as its handle is with the fenced session.
                    // Its descriptor reports the failure (a deferred error), as a lost
                    // change's does.
                    Some(Err(e)) if self.ck.fenced_sessions.contains(&pd.session) => {
                        self.log(format!("client {c}: writeback {n} lost with its fenced session: {e:?}"));
                    }
                    // The same for an open answered here whose client then lost every
                    // right (its lease ran out while it was cut off, or a restarted server
                    // forgot its session) before the open reached the server: nothing held
                    // the file for it meanwhile, and another mount may have unlinked and
                    // closed it (ENOENT). Its descriptor reports the failure.
                    Some(Err(e))
                        if pd.rights_lapsed
                            && e.errno == 2
                            && pd.req.ops.iter().all(|o| matches!(o, Op::Open { .. })) =>
                    {
                        self.log(format!("client {c}: writeback {n}, an open whose rights lapsed first: {e:?}"));
                    }
                    // An open that took effect, whose answer a broken connection lost, sent
                    // again after its descriptor was closed (the release goes again behind
                    // it): the file may be gone by then, and nobody is left to tell.
                    Some(Err(e))
                        if self.ck.opens_taken.contains(&(pd.session, id)) && !self.clients[c].holds(&pd.req.ops) =>
                    {
                        self.log(format!("client {c}: writeback {n}, an open sent again after its close: {e:?}"));
                    }
                    // Its caller was told it worked: the promise is broken.
                    Some(Err(e)) => {
                        self.ck.fail(format!("client {c}: writeback {n} {:?} failed on the server: {e:?}", pd.req.ops))
                    }
                    _ => {}
                }
            }
        }
    }

    /// Client `c`'s system call waiting on request `id` returns; it thinks, then goes on.
    pub(crate) fn returned(&mut self, c: usize, id: u64) {
        let cl = &mut self.clients[c];
        if cl.busy.remove(&id).is_some() {
            let inc = cl.incarnation;
            let d = self.think();
            self.at(d, Ev::Wake { client: c, incarnation: inc });
        }
    }

    /// Hands a request to client `c`'s core (a writeback when it carries the client's
    /// clock), which puts it on the wire now or when it is connected.
    pub(crate) fn send_request(
        &mut self,
        c: usize,
        ops: Vec<Op>,
        time: Option<p::Time>,
        purpose: Purpose,
        t0_lc: u64,
    ) -> u64 {
        let now = self.instant();
        let cl = &mut self.clients[c];
        let id = cl.next_id;
        cl.next_id += 1;
        let req = p::Request { id, ops, time, caller: p::Caller::ROOT };
        let (epoch, stamp) = {
            let names = cl.names();
            (names.epoch(), names.stamp())
        };
        let session = cl.sid().expect("a client sends only once welcomed");
        let pending = Pending {
            req: req.clone(),
            purpose: purpose.clone(),
            t0_us: self.now,
            epoch,
            stamp,
            session,
            rights_lapsed: false,
        };
        cl.pending.insert(id, pending);
        let sid = cl.sid().expect("a client sends only once welcomed");
        self.ck.reqs.insert((sid, id), ReqInfo { client: c, ops: req.ops.clone(), time, purpose, t0_lc });
        self.ck.stats.to_server += 1;
        let call = match time {
            Some(t) => Call::writeback(id, req.ops, t, now, id),
            None => Call::wait(id, req.ops, now, id),
        };
        cl.core.submit(call, now);
        cl.core.end_burst();
        // (Its answer, if any came at once, is handed over at the next `sync`: the caller
        // marks the call busy first.)
        self.transmit(c);
        id
    }

    /// The server dies — just after a commit, or (`CREST_SIM_LOST_CHANGES=on`, half the
    /// time) with whatever it applied since the last one uncommitted, which is lost — and
    /// starts again on its image;
    /// every connection breaks, and every message in flight is lost. The new server
    /// restores the sessions it finds records of and waits for their clients, which
    /// replay what they were answered and was lost (the grace period, docs/protocol.md
    /// §4.5).
    pub(crate) fn server_crash(&mut self) {
        self.ck.stats.server_crashes += 1;
        self.server_life += 1;
        let committed = !self.modes.lost_changes || self.crash_rng.below(2) == 0;
        if committed {
            if let Err(e) = self.server.store_mut().commit() {
                return self.ck.fail(format!("commit before the crash: {e}"));
            }
        }
        // (A commit since the last request ran — a tick's, a fencing's — kept them all.)
        let store = self.server.store_mut();
        if !store.is_dirty() || store.generation() != self.ck.seen_generation {
            self.ck.k_durable = self.ck.k;
        }
        let lost = self.ck.k - self.ck.k_durable;
        self.log(format!(
            "SERVER CRASH (life {} begins; {lost} changes applied since the last commit lost)",
            self.server_life
        ));
        let store = match Store::open_keeping_orphans(Box::new(self.disk.clone())) {
            Ok(s) => s,
            Err(e) => return self.ck.fail(format!("the image does not open after the crash: {e}")),
        };
        let old = std::mem::replace(&mut self.server, Server::new(store));
        drop(old.into_store().abandon());
        let restored = self.clients.iter().filter_map(|cl| cl.sid()).filter(|&s| self.server.has_session(s)).collect();
        let clients = &self.clients;
        let unanswered =
            |(s, id): (SessionId, u64)| clients.iter().any(|cl| cl.pending.get(&id).is_some_and(|pd| pd.session == s));
        self.ck.locks_lost(unanswered, restored);
        if lost > 0 {
            self.ck.stats.changes_lost += lost;
            let store = self.server.store_mut();
            let mut present = BTreeSet::new();
            for ino in self.ck.model().inodes.keys().chain(self.ck.model().pinned.keys()) {
                if store.getattr(*ino).is_ok() {
                    present.insert(*ino);
                }
            }
            // (The snapshot's orphans too: looked up once more below, by number.)
            let orphans: Vec<u64> = self
                .ck
                .snaps
                .get(&self.ck.k_durable)
                .map(|m| {
                    let orphans = m.inodes.iter().filter(|(_, i)| i.nlink == 0).map(|(&ino, _)| ino);
                    orphans.chain(m.pinned.keys().copied()).collect()
                })
                .unwrap_or_default();
            for ino in orphans {
                if store.getattr(ino).is_ok() {
                    present.insert(ino);
                }
            }
            self.ck.roll_back(|ino| present.contains(&ino));
        }
        self.ck.seen_generation = self.server.store_mut().generation();
        self.server.record_applied();
        self.server.set_contention_window(self.contention_ms);
        self.server.reuse_inode_numbers(false);
        self.server.seed_randomness(self.seed ^ 0x5e55_1015 ^ (self.server_life << 32));
        // (So that a session number names one session in the checker's books.)
        self.server.number_sessions_from(self.max_session + 1);
        // A session the restarted server did not restore (it had no record) lost its
        // handles with the old server's memory.
        let model = self.ck.model.as_mut().expect("model");
        // (The new server remembers no open that took effect on arrival.)
        model.early.clear();
        // A restored one's handles the new server knows again when its client opens them
        // again.
        for s in model.openers() {
            if self.server.has_session(s) {
                model.forget_handles(s);
            } else {
                model.end_session(s);
            }
        }
        if self.server.in_grace() {
            model.start_grace();
        }
        // (The new server knows no connection: none is reported to it as dropped.)
        self.server_conn.clear();
        let alive: Vec<u64> = self.conns.iter().filter(|(_, c)| c.alive).map(|(&id, _)| id).collect();
        for conn in alive {
            self.drop_conn(conn, "server crashed");
        }
        let ms = self.now / 1000;
        if let Err(e) = self.server.tick(ms) {
            return self.ck.fail(format!("tick after the restart: {e}"));
        }
        self.flush_server(ptime(ms * 1000));
    }

    /// Faults that strike at a client's system call.
    pub(crate) fn faults_at(&mut self, c: usize) {
        let f = self.faults.clone();
        if f.server_crash > 0.0 && (self.crash_rng.next_u64() as f64 / u64::MAX as f64) < f.server_crash {
            self.server_crash();
        }
        if self.chance(f.partition) {
            let d = 50_000 + self.rng.below(f.max_partition_us - 50_000);
            self.clients[c].partition_until = self.now + d;
            self.ck.stats.partitions += 1;
            self.log(format!("client {c}: partitioned for {} ms", d / 1000));
            if let (true, Some(conn)) = (self.chance(f.partition_drops), self.clients[c].conn) {
                self.drop_conn(conn, "partition");
            }
        }
        if self.chance(f.crash) {
            self.ck.stats.crashes += 1;
            self.log(format!("client {c}: crashes"));
            let cl = &mut self.clients[c];
            cl.alive = false;
            if let Some(conn) = cl.conn {
                self.drop_conn(conn, "client crashed");
            }
            // What it answered itself and had not yet written back dies with it.
            let sessions: Vec<SessionId> = self.clients[c].sid().into_iter().collect();
            self.ck.dead_sessions.extend(&sessions);
            for &s in &sessions {
                self.ck.never_replayed(s);
            }
            self.ck.locals.retain(|_, l| !(sessions.contains(&l.session) && l.applied_k.is_none()));
            let d = 10_000 + self.rng.below(1_500_000);
            self.at(d, Ev::Restart { client: c });
            return;
        }
        let cl = &self.clients[c];
        let idle = cl.pending.is_empty() && cl.core.waiting() == 0 && cl.core.state() == State::Open;
        if let (true, Some(_)) = (idle, cl.conn) {
            if !self.chance(f.goodbye) {
                return;
            }
            self.ck.stats.goodbyes += 1;
            self.log(format!("client {c}: unmounts"));
            self.clients[c].core.goodbye();
            self.transmit(c);
            // (Its goodbye may be lost with the connection: then the server fences the
            // session in time, and what it held goes then.)
            let gone: Vec<SessionId> = self.clients[c].sid().into_iter().collect();
            for &s in &gone {
                self.ck.never_replayed(s);
            }
            self.ck.dead_sessions.extend(gone);
            let cl = &mut self.clients[c];
            cl.leaving = true;
            cl.conn = None;
            let d = 10_000 + self.rng.below(500_000);
            self.at(d, Ev::Restart { client: c });
        }
    }

    /// Everything healed and answered: the store must equal the model, and be clean.
    pub(crate) fn final_check(&mut self) -> Result<(), String> {
        // Every change a crash took back after its caller was answered came again.
        let ck = &self.ck;
        let missing: Vec<&(SessionId, u64)> = ck
            .lost_done
            .keys()
            .filter(|(s, _)| !ck.fenced_sessions.contains(s) && !ck.dead_sessions.contains(s))
            .collect();
        if !missing.is_empty() {
            return Err(format!("changes answered, lost by a crash and never replayed: {missing:?}"));
        }
        let model = self.ck.model().clone();
        let store = self.server.store_mut();
        let mut problems = Vec::new();
        let mut stack = vec![ROOT_INO];
        // (By inode: a file with hard links is reached once per name.)
        let mut seen = BTreeSet::new();
        while let Some(d) = stack.pop() {
            let entries = store.readdir(d, 0, usize::MAX).map_err(|e| format!("readdir {d}: {e}"))?;
            let names: BTreeMap<Vec<u8>, u64> = entries.iter().map(|(e, _)| (e.name.clone(), e.ino)).collect();
            if Some(&names) != model.dirs.get(&d) {
                problems.push(format!("directory {d}: store {names:?}, model {:?}", model.dirs.get(&d)));
            }
            for (e, inode) in entries {
                seen.insert(e.ino);
                let a = crest_server::convert::attr_out(&inode);
                let v = self.ck.attr_v(&a);
                if Some(&v) != model.attr(e.ino).as_ref() {
                    problems.push(format!("inode {}: store {v:?}, model {:?}", e.ino, model.attr(e.ino)));
                }
                let mut xattrs = BTreeMap::new();
                for name in store.listxattr(e.ino).map_err(|e| format!("listxattr: {e}"))? {
                    let value = store.getxattr(e.ino, &name).map_err(|e| format!("getxattr: {e}"))?;
                    xattrs.insert(name, value);
                }
                if Some(&xattrs) != model.inodes.get(&e.ino).map(|i| &i.xattrs) {
                    problems.push(format!("inode {}: xattrs differ", e.ino));
                }
                match inode.kind {
                    crest_store::FileKind::Directory => stack.push(e.ino),
                    _ => {
                        let data = store.read(e.ino, 0, inode.size).map_err(|e| format!("read: {e}"))?;
                        if Some(&data) != model.inodes.get(&e.ino).map(|i| &i.data) {
                            problems.push(format!("inode {}: data differs", e.ino));
                        }
                    }
                }
            }
        }
        if seen.len() + 1 != model.named_inodes() {
            problems.push(format!("store reaches {} inodes, the model names {}", seen.len() + 1, model.named_inodes()));
        }
        store.commit().map_err(|e| format!("commit: {e}"))?;
        let report = check::fsck(Box::new(self.disk.clone())).map_err(|e| format!("fsck: {e}"))?;
        if !report.is_clean() {
            problems.push(format!("fsck: {:?}", report.problems));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(self.report(&format!("final state:\n{}", problems.join("\n"))))
        }
    }

    pub(crate) fn report(&self, what: &str) -> String {
        format!(
            "\n=== crest sim: seed {} failed at system call {} (t = {:.6} s) ===\n{what}\n--- last events ---\n{}\n--- reproduce: {}cargo run --release -p crest-sim -- coherence {} --steps {}{} ---\n",
            self.seed,
            self.steps,
            (self.now - EPOCH_S * 1_000_000) as f64 / 1e6,
            self.trace.iter().cloned().collect::<Vec<_>>().join("\n"),
            self.modes.env_prefix(),
            self.seed,
            self.max_steps,
            if self.server_crashes { " --server-crashes" } else { "" },
        )
    }
}
