//! A thousand sessions at once: the real client core (`crest_client::conn::Connection`) of
//! each of 1,000 clients against the real server core, on virtual time, every message
//! delayed at random (each direction of a connection in order). Every client keeps its
//! session alive with its heartbeats; a tenth of them work meanwhile (a directory of
//! their own, then files made, written and read back in it), and all of them stat the
//! root now and then. Over 30 virtual seconds no session may be fenced, no client may
//! lose its connection or its lease, every call must be answered with what it asked
//! for, and the server must end holding exactly these sessions.
//! `CREST_MANY_SEED` runs one seed (else a random one, printed); `CREST_MANY_CLIENTS`
//! another count.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crest_client::conn::{Call, Connection, Event, RightsHook, State};
use crest_proto::{self as p, ClientMessage, Op, Reply, ServerMessage};
use crest_rng::Stream;
use crest_server::{Outgoing, Server, SessionId};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

/// Virtual seconds simulated.
const SECONDS: u64 = 30;
/// The server's periodic work, as `crest serve` runs it.
const TICK_US: u64 = 100_000;
/// The server's clock at virtual time 0 (the clients' `Instant`s start at `t0`).
const EPOCH_S: u64 = 1_000_000;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Bytes from client `c` reach the server.
    Up(usize, Vec<u8>),
    /// Bytes from the server reach client `c`.
    Down(usize, Vec<u8>),
    /// Client `c`'s core asked to be woken now (if `gen` is still its latest ask).
    Timer(usize, u64),
    /// Client `c` makes its next call.
    Work(usize),
    /// The server's periodic work.
    Tick,
}

/// What a call is for, and what its answer must say.
#[derive(Debug)]
enum Want {
    /// A stat of the root.
    Root,
    /// The client's own directory made.
    Dir,
    /// A file made in the client's directory.
    File,
    /// `data` written to a file and read back.
    Data(Vec<u8>),
}

struct Client {
    core: Connection<u64>,
    session: Option<SessionId>,
    /// Its directory, once made.
    dir: Option<u64>,
    /// A file made and not yet written.
    file: Option<u64>,
    works: bool,
    files: u64,
    calls: HashMap<u64, Want>,
    timer_gen: u64,
    /// When the last bytes each way arrive (messages on one connection stay in order).
    up_at: u64,
    down_at: u64,
}

struct Sim {
    now: u64,
    t0: Instant,
    rng: Stream,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    server: Server,
    clients: Vec<Client>,
    by_session: HashMap<SessionId, usize>,
    ids: Arc<AtomicU64>,
    answered: u64,
    heartbeat_requests: u64,
}

impl Sim {
    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn instant(&self) -> Instant {
        self.t0 + Duration::from_micros(self.now)
    }

    fn ptime(&self) -> p::Time {
        p::Time { sec: (EPOCH_S + self.now / 1_000_000) as i64, nsec: (self.now % 1_000_000) as u32 * 1000 }
    }

    fn now_ms(&self) -> u64 {
        EPOCH_S * 1000 + self.now / 1000
    }

    /// 50 µs to 2 ms, after what went the same way before.
    fn latency(&mut self) -> u64 {
        50 + self.rng.below(1950)
    }

    /// What client `c`'s core has to say goes up; its events are handled; its timer set.
    fn sync(&mut self, c: usize) {
        while let Some(e) = self.clients[c].core.poll_event() {
            match e {
                Event::Answer(id, r) => self.answered(c, id, r),
                Event::Recall(r) => self.clients[c].core.recall_done(r.recall_id),
                Event::Ready(r) => assert!(r.is_ok(), "client {c}: {r:?}"),
                Event::Identity(_) => {}
            }
        }
        let out = self.clients[c].core.poll_transmit();
        if !out.is_empty() {
            let t = (self.now + self.latency()).max(self.clients[c].up_at);
            self.clients[c].up_at = t;
            self.at(t, Ev::Up(c, out));
        }
        let due = self.clients[c].core.poll_timeout();
        let at = due.saturating_duration_since(self.t0).as_micros() as u64;
        let cl = &mut self.clients[c];
        cl.timer_gen += 1;
        let gen = cl.timer_gen;
        self.at(at.max(self.now), Ev::Timer(c, gen));
    }

    fn answered(
        &mut self,
        c: usize,
        id: u64,
        r: Result<Vec<Result<Reply, p::OpError>>, crest_client::conn::ClientError>,
    ) {
        let want =
            self.clients[c].calls.remove(&id).unwrap_or_else(|| panic!("client {c}: an answer to {id}, unasked"));
        let results = r.unwrap_or_else(|e| panic!("client {c}: call {id} ({want:?}) failed: {e}"));
        self.answered += 1;
        let cl = &mut self.clients[c];
        match (want, results.as_slice()) {
            // (`AttrOnly` while other clients are changing the root.)
            (Want::Root, [Ok(Reply::Attr(a) | Reply::AttrOnly(a))]) => assert_eq!(a.ino, 1),
            (Want::Dir, [Ok(Reply::Entry(a))]) => cl.dir = Some(a.ino),
            (Want::File, [Ok(Reply::Entry(a))]) => cl.file = Some(a.ino),
            (Want::Data(d), [Ok(Reply::Attr(_)), Ok(Reply::Data(back))]) => {
                assert_eq!(*back, d, "client {c}: read back other bytes");
            }
            (want, other) => panic!("client {c}: {want:?} answered {other:?}"),
        }
    }

    fn call(&mut self, c: usize, ops: Vec<Op>, want: Want) {
        let id = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = self.instant();
        self.clients[c].calls.insert(id, want);
        self.clients[c].core.submit(Call::wait(id, ops, now, id), now);
        self.sync(c);
    }

    /// Client `c`'s next call, and when the one after it comes.
    fn work(&mut self, c: usize) {
        let cl = &self.clients[c];
        let name = |s: String| s.into_bytes();
        let create =
            |parent, name, kind| Op::Create { parent, name, kind, mode: 0o755, rdev: 0, cred: p::Cred::default() };
        if !cl.works || self.rng.below(4) == 0 {
            self.call(c, vec![Op::GetAttr { ino: 1 }], Want::Root);
        } else if let Some(ino) = cl.file {
            let len = 1 + self.rng.below(3000) as usize;
            let data: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + c as u64) as u8).collect();
            self.clients[c].file = None;
            let ops =
                vec![Op::Write { ino, offset: 0, data: data.clone() }, Op::Read { ino, offset: 0, len: len as u32 }];
            self.call(c, ops, Want::Data(data));
        } else if let Some(dir) = cl.dir {
            let n = cl.files;
            self.clients[c].files += 1;
            self.call(c, vec![create(dir, name(format!("f{n}")), p::FileType::Regular)], Want::File);
        } else if cl.calls.values().all(|w| !matches!(w, Want::Dir)) {
            self.call(c, vec![create(1, name(format!("d{c}")), p::FileType::Directory)], Want::Dir);
        }
        let next = self.now + 200_000 + self.rng.below(2_800_000);
        self.at(next, Ev::Work(c));
    }

    /// Bytes from client `c` at the server: each message handled as `crest-serve` does.
    fn up(&mut self, c: usize, bytes: Vec<u8>) {
        let mut d = p::FrameDecoder::new();
        d.handle_bytes(&bytes);
        let (now, now_ms) = (self.ptime(), self.now_ms());
        while let Some(msg) = d.poll_message::<ClientMessage>().expect("a client's frame") {
            match msg {
                ClientMessage::Hello(h) => {
                    let (sid, reply) = self.server.handle_hello(&h);
                    let sid = sid.unwrap_or_else(|| panic!("client {c} refused: {reply:?}"));
                    self.server.heard(sid, now_ms);
                    self.clients[c].session = Some(sid);
                    self.by_session.insert(sid, c);
                    self.down(c, reply);
                }
                ClientMessage::Request(req) => {
                    let sid = self.clients[c].session.expect("hello first");
                    if req.id == 0 {
                        self.heartbeat_requests += 1;
                    }
                    self.server.heard(sid, now_ms);
                    self.server.handle(sid, req, now);
                }
                ClientMessage::RecallDone { recall_id } => {
                    let sid = self.clients[c].session.expect("hello first");
                    self.server.heard(sid, now_ms);
                    self.server.recall_done(sid, recall_id, now);
                }
                other => panic!("client {c} sent {other:?}"),
            }
        }
        self.flush_server();
    }

    fn down(&mut self, c: usize, msg: ServerMessage) {
        let mut bytes = Vec::new();
        p::encode_frame(&msg, &mut bytes).expect("encode");
        let t = (self.now + self.latency()).max(self.clients[c].down_at);
        self.clients[c].down_at = t;
        self.at(t, Ev::Down(c, bytes));
    }

    fn flush_server(&mut self) {
        for o in self.server.take_outgoing() {
            let (session, msg) = match o {
                Outgoing::Response { session, response } => (session, ServerMessage::Response(response)),
                Outgoing::Notify { session, notify } => (session, ServerMessage::Notify(notify)),
                Outgoing::Read { session, response, read } => {
                    (session, ServerMessage::Response(self.server.finish_read(session, response, &read)))
                }
            };
            let c = *self.by_session.get(&session).unwrap_or_else(|| panic!("a message for session {session}"));
            self.down(c, msg);
        }
    }

    fn run(&mut self) {
        let end = SECONDS * 1_000_000;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t > end {
                break;
            }
            self.now = t;
            let now = self.instant();
            match ev {
                Ev::Up(c, bytes) => self.up(c, bytes),
                Ev::Down(c, bytes) => {
                    self.clients[c].core.handle_bytes(now, &bytes);
                    self.sync(c);
                }
                Ev::Timer(c, gen) => {
                    if gen == self.clients[c].timer_gen {
                        self.clients[c].core.handle_timeout(now);
                        self.sync(c);
                    }
                }
                Ev::Work(c) => self.work(c),
                Ev::Tick => {
                    let ms = self.now_ms();
                    self.server.tick(ms).expect("tick");
                    self.flush_server();
                    self.at(self.now + TICK_US, Ev::Tick);
                }
            }
        }
    }
}

#[test]
fn a_thousand_sessions_stay_alive_and_are_answered() {
    let seed = std::env::var("CREST_MANY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let n: usize = std::env::var("CREST_MANY_CLIENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    println!("CREST_MANY_SEED={seed} CREST_MANY_CLIENTS={n}");
    let disk = MemDisk::new(256 << 20);
    let opts =
        MkfsOptions { now: Timespec::new(EPOCH_S as i64, 0), fsid: Some([9; 16]), seed: Some(seed), meta_copies: 2 };
    Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
    let server = Server::new(Store::open(Box::new(disk)).expect("open"));
    let t0 = Instant::now();
    let ids = Arc::new(AtomicU64::new(1));
    let mut rng = Stream::from_seed_u64(seed);
    let clients = (0..n)
        .map(|i| Client {
            core: Connection::new("sim", &format!("client-{i}"), ids.clone(), RightsHook::default(), t0),
            session: None,
            dir: None,
            file: None,
            works: rng.below(10) == 0,
            files: 0,
            calls: HashMap::new(),
            timer_gen: 0,
            up_at: 0,
            down_at: 0,
        })
        .collect();
    let mut sim = Sim {
        now: 0,
        t0,
        rng,
        events: BinaryHeap::new(),
        seq: 0,
        server,
        clients,
        by_session: HashMap::new(),
        ids,
        answered: 0,
        heartbeat_requests: 0,
    };
    sim.at(0, Ev::Tick);
    // Clients come over the first two seconds, and start working a little later.
    for c in 0..n {
        sim.now = sim.rng.below(2_000_000);
        let now = sim.instant();
        sim.clients[c].core.connecting(now);
        sim.clients[c].core.connected(now);
        sim.sync(c);
        let first = sim.now + 500_000 + sim.rng.below(2_000_000);
        sim.at(first, Ev::Work(c));
    }
    sim.now = 0;
    sim.run();
    let mut sessions = Vec::new();
    for (c, cl) in sim.clients.iter().enumerate() {
        assert_eq!(cl.core.state(), State::Open, "seed {seed}: client {c} is not connected");
        let sid = cl.session.unwrap_or_else(|| panic!("seed {seed}: client {c} has no session"));
        assert!(!sim.server.is_fenced(sid), "seed {seed}: client {c}'s session {sid} was fenced");
        assert!(cl.calls.len() <= 1, "seed {seed}: client {c} waits for {} calls", cl.calls.len());
        sessions.push(sid);
    }
    sessions.sort_unstable();
    sessions.dedup();
    assert_eq!(sessions.len(), n, "seed {seed}: one session per client");
    let workers = sim.clients.iter().filter(|c| c.works).count();
    let made = sim.clients.iter().filter(|c| c.dir.is_some()).count();
    assert_eq!(made, workers, "seed {seed}: every working client made its directory");
    // Every client heartbeats about once a second it is otherwise quiet.
    let per_client = sim.heartbeat_requests as f64 / n as f64;
    println!(
        "seed {seed}: {n} clients ({workers} working), {} calls answered, {per_client:.1} heartbeats each",
        sim.answered
    );
    assert!(per_client >= (SECONDS - 4) as f64 / 2.0, "seed {seed}: clients fell silent: {per_client:.1} heartbeats");
}
