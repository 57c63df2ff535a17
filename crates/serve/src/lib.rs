//! The server's async shell (client → proto → **serve** → server → store): a TCP
//! listener whose connections feed the `Server` core, which one thread owns.
//!
//! One thread ("crest-server") runs the store task, which owns the `Server` core (and so
//! the store), on a single-threaded tokio runtime. Each connection has a reader task
//! (TLS, framing, decoding) and a writer task (encoding, TLS); readers queue decoded
//! messages for the store task, each connection in a queue of its own served in turn
//! (`sched`); it applies what is queued, then hands the `ServerMessage`s to each
//! connection's writer, which flushes once per burst. The store task also commits on the
//! store's schedule (`tick`) and, at shutdown, finishes every queued request, commits and
//! hands the store back. Store operations block its thread while they run: they are
//! serial anyway.
//!
//! Where the connections run is `Options::io_threads`: with 0 they share the store's
//! thread (a request then costs no hand-off between threads: reader, store and writer
//! wake each other with queue pushes on one thread, and on a two-core machine a
//! cross-thread wake-up costs more than most store operations); with N, a runtime of N
//! "crest-io" threads runs them (and the accept loop and the metrics listener), so TLS
//! and framing of many connections run beside the store's thread, at the price of two
//! cross-thread wake-ups per burst of requests.
//!
//! Connections are mutual TLS 1.3 (`Security::Tls`) unless the server runs `--insecure`: a
//! client presenting a certificate the host's authority issued and did not revoke may say
//! hello; one presenting none may only redeem a join token; any other is refused. A client
//! whose certificate is revoked while connected is disconnected and its session ended.
//!
//! Invariants:
//! - a connection must finish its TLS handshake and say a valid hello within
//!   `HELLO_TIMEOUT` each; any malformed, oversized
//!   or out-of-order frame ends that connection with a logged error, never the server;
//! - the store is touched only by the store task;
//! - what one connection makes the server hold is bounded, both ways (`sched`): its
//!   queued messages, and its unsent replies (past which its requests are not read).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crest_proto::{self as p, ClientMessage, FrameDecoder, ServerMessage};
use crest_server::authz::Policy;
use crest_server::{Outgoing, Server, SessionId};
use crest_store::Store;
use crest_stream::{read_burst, Reader, Writer};
use crest_tls::{Authority, Fingerprint};
use limits::{Counters, Key, Slot};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// How long a new connection has to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

mod collect;
pub use crest_server::objects::DataConfig;
mod exports;
pub mod limits;
pub mod metrics;
mod reads;
mod reload;
mod sched;

pub use reads::READS_ELSEWHERE_FROM;
pub use reload::Reload;

pub use crest_server::MAX_SESSIONS_PER_IDENTITY;

/// A connection's outbox: the store task queues messages for its writer, counting their
/// bytes (`sched::Backlog`).
#[derive(Clone)]
struct Outbox {
    /// Each message with the bytes it was counted for.
    tx: mpsc::UnboundedSender<(usize, reads::Queued)>,
    backlog: sched::Backlog,
    /// The store task's queue, for a planned read that failed (`reads.rs`); weak, so
    /// that the outboxes the store task holds do not keep it from seeing the last
    /// sender go.
    ctrl: mpsc::WeakUnboundedSender<Ctrl>,
}

impl Outbox {
    fn send(&self, m: ServerMessage) {
        let bytes = p::encoded_len(&m);
        if let ServerMessage::Response(r) = &m {
            self.backlog.answered(r.id);
        }
        // (Counted first: the writer may count it off as soon as it is sent.)
        self.backlog.add(bytes);
        if self.tx.send((bytes, reads::Queued::Now(m))).is_err() {
            self.backlog.sent(bytes);
        }
    }

    fn same_channel(&self, other: &Outbox) -> bool {
        self.tx.same_channel(&other.tx)
    }
}

/// When each session's bytes last arrived, as its connection's reader saw them: a session
/// counts as heard then, even while its requests wait in the store task's queue behind
/// another session's flood (its lease must not lapse for that).
type Arrivals = Arc<std::sync::Mutex<HashMap<SessionId, u64>>>;

/// How connections are secured.
#[derive(Clone)]
pub enum Security {
    /// Plaintext and no authentication (`crest serve --insecure`, loopback only).
    Insecure,
    /// Mutual TLS 1.3 against the host's authority.
    Tls(Arc<Authority>),
}

/// What the accept loop hands each TLS connection.
struct Gate {
    acceptor: tokio_rustls::TlsAcceptor,
    authority: Arc<Authority>,
    /// Revoked certificates, as the authority's register last said.
    revoked: watch::Receiver<Arc<HashSet<Fingerprint>>>,
    /// Bumped when the export policies are to be read again (`Serving::reload`).
    policies: watch::Receiver<u64>,
    /// The export policies in force.
    exports: Arc<exports::Policies>,
}

/// What a connection's tasks hold of the server thread: its control queue, the wake-up of
/// the sessions' queues, and where they note their session's arrivals.
#[derive(Clone)]
struct Shell {
    ctrl: mpsc::UnboundedSender<Ctrl>,
    ready: Arc<sched::Ready>,
    arrivals: Arrivals,
    /// How long a session's connection may stay silent (`Options::idle_timeout`).
    idle: Duration,
    /// Connections one client identity may hold (`Options::sessions_per_identity`; a
    /// reload may change it).
    per_identity: Arc<AtomicUsize>,
}

/// What a server may be told beyond its store, address and security.
#[derive(Clone, Debug)]
pub struct Options {
    /// A session's connection silent this long (or whose replies go unread this long) is
    /// closed. Clients send a heartbeat every second.
    pub idle_timeout: Duration,
    /// Most sessions, and connections, one client identity holds at once (all of
    /// `--insecure`'s clients are one identity).
    pub sessions_per_identity: usize,
    /// Where to answer Prometheus scrapes (`metrics`), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// The release (and commit) each welcome names, as `crest --version` says it.
    pub release: String,
    /// The image's path, for `crest status`.
    pub image: String,
    /// Threads that run the connections (TLS, framing, encoding and decoding) apart from
    /// the store's thread. 0: the connections share the store's one thread (no hand-off
    /// between threads per request; what a machine of two cores does best).
    pub io_threads: usize,
    /// Reads of at least this many bytes of the disk run on tokio's blocking pool, beside
    /// the store's thread (`reads.rs`); `None`: every read runs on the store's thread.
    pub reads_elsewhere_from: Option<u64>,
    /// Where the data store of an image that keeps file data in objects is, and its keys
    /// (docs/objects.md); such an image is not served without them.
    pub data: Option<crest_server::objects::DataConfig>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            idle_timeout: limits::IDLE_TIMEOUT,
            sessions_per_identity: limits::MAX_CONNECTIONS_PER_IDENTITY,
            metrics: None,
            release: format!("crest {}", env!("CARGO_PKG_VERSION")),
            image: String::new(),
            io_threads: default_io_threads(),
            reads_elsewhere_from: Some(READS_ELSEWHERE_FROM),
            data: None,
        }
    }
}

/// A client the authority admitted: who, and the news of revocations.
struct Admitted {
    fingerprint: Fingerprint,
    name: String,
    /// The host's own certificate.
    local: bool,
    /// Its place among its identity's connections.
    _slot: Slot,
    revoked: watch::Receiver<Arc<HashSet<Fingerprint>>>,
}

/// What comes to the store task apart from the sessions' own queues.
enum Ctrl {
    Hello {
        hello: p::Hello,
        peer: SocketAddr,
        /// What the client may do (its export policy).
        policy: Box<Policy>,
        /// Who it is (its certificate's name; "(insecure)" without TLS).
        identity: String,
        out: Outbox,
        /// The connection's queue, served once the session exists.
        queue: Box<sched::Receiver<Cmd>>,
        reply: oneshot::Sender<(Option<SessionId>, ServerMessage)>,
    },
    /// An administrative call (from a host allowed to make one); the answer's bytes.
    Admin {
        call: Vec<u8>,
        reply: oneshot::Sender<Vec<u8>>,
    },
    Shutdown {
        done: oneshot::Sender<Result<Store, crest_store::Error>>,
    },
    /// The most sessions one identity may hold, as reloaded.
    SessionsPerIdentity(usize),
    /// Answered by the store task when it gets to it (`Serving::responsive`).
    Ping(oneshot::Sender<()>),
    /// A planned read that failed on another thread, to read on the store's (`reads.rs`).
    ReadAgain {
        session: SessionId,
        read: crest_server::PlannedRead,
        reply: oneshot::Sender<Result<p::Reply, p::OpError>>,
    },
    Kill {
        done: oneshot::Sender<Store>,
    },
    /// The collector deleted these objects (`collect.rs`).
    ObjectsDeleted(Vec<u64>),
}

/// A session's messages, in its connection's queue.
enum Cmd {
    Request {
        session: SessionId,
        req: p::Request,
        /// The sums of the blocks each op writes, computed here (`reads::write_sums`).
        sums: crest_server::WriteSums,
        out: Outbox,
    },
    Goodbye {
        session: SessionId,
    },
    /// The session's certificate was revoked: it ends, as if it said goodbye.
    Revoked {
        session: SessionId,
        out: Outbox,
    },
    RecallDone {
        session: SessionId,
        recall_id: u64,
    },
    Replayed {
        session: SessionId,
    },
    Disconnected {
        session: SessionId,
        out: Outbox,
    },
}

fn now() -> p::Time {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    p::Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// Sends what the server core queued to the sessions' connections (a session without a
/// live connection misses its notices: a recall then times out, a response is resent
/// from the reply cache when the client retries).
fn deliver(server: &mut Server, outboxes: &HashMap<SessionId, Outbox>) {
    for o in server.take_outgoing() {
        let (session, msg) = match o {
            Outgoing::Response { session, response } => (session, ServerMessage::Response(response)),
            Outgoing::Notify { session, notify } => (session, ServerMessage::Notify(notify)),
            Outgoing::Read { session, response, read } => {
                // (No connection: the plan drops here, and the client asks again.)
                if let Some(out) = outboxes.get(&session) {
                    out.send_read(session, response, read);
                }
                continue;
            }
        };
        if let Some(out) = outboxes.get(&session) {
            out.send(msg);
        }
    }
}

/// What the store thread does next.
enum Step {
    Continue,
    Stop,
}

/// The store task's state: the core (gone once handed back), the sessions' outboxes and
/// their connections' queues.
struct StoreTask {
    server: Option<Server>,
    collector: collect::Collector,
    outboxes: HashMap<SessionId, Outbox>,
    queues: sched::Queues<Cmd>,
    /// Administrative calls that wait (a snapshot waits for clients' writeback), by token.
    admin_waiting: HashMap<u64, oneshot::Sender<Vec<u8>>>,
}

impl StoreTask {
    /// Applies everything the sessions' queues hold, in turn (but for those waiting for
    /// their writers).
    fn drain(&mut self) {
        let (server, outboxes) = (&mut self.server, &mut self.outboxes);
        self.queues.drain(|cmd| apply_and_deliver(server, outboxes, cmd));
    }

    /// Applies a control message; `Stop` after a shutdown or kill (the store has been
    /// handed back).
    fn apply_ctrl(&mut self, ctrl: Ctrl) -> Step {
        match ctrl {
            Ctrl::Hello { hello, peer, policy, identity, out, queue, reply } => {
                // What an earlier connection of the session queued goes first.
                self.drain();
                let Some(srv) = self.server.as_mut() else { return Step::Stop };
                let (sid, msg) = srv.handle_hello_as(&hello, *policy, &identity);
                if let Some(sid) = sid {
                    srv.heard(sid, now_ms());
                    srv.set_peer(sid, peer.to_string());
                }
                // The welcome goes out first, before any notice for the session.
                out.send(msg.clone());
                match sid {
                    Some(sid) => {
                        self.queues.add(*queue, out.backlog.clone());
                        self.outboxes.insert(sid, out);
                    }
                    None => limits::refusal!(%peer, "handshake refused: {msg:?}"),
                }
                let _ = reply.send((sid, msg));
            }
            Ctrl::Admin { call, reply } => {
                // After what the sessions sent before it (a destroy sees them settled).
                self.drain();
                let Some(srv) = self.server.as_mut() else { return Step::Stop };
                match srv.admin_start(&call, now()) {
                    crest_server::AdminStart::Done(answer) => {
                        let _ = reply.send(answer);
                    }
                    crest_server::AdminStart::Pending(token) => {
                        self.admin_waiting.insert(token, reply);
                    }
                }
                deliver(srv, &self.outboxes);
            }
            Ctrl::Shutdown { done } => {
                // Everything queued before the shutdown is handled first.
                self.drain();
                if let Some(srv) = self.server.as_mut() {
                    deliver(srv, &self.outboxes);
                }
                if let Some(srv) = self.server.take() {
                    let mut store = srv.into_store();
                    let r = store.commit().map(|()| store);
                    let _ = done.send(r);
                }
                return Step::Stop;
            }
            Ctrl::Ping(reply) => {
                let _ = reply.send(());
            }
            Ctrl::ReadAgain { session, read, reply } => {
                if let Some(srv) = self.server.as_mut() {
                    let _ = reply.send(srv.read_again(session, &read));
                }
            }
            Ctrl::ObjectsDeleted(ids) => {
                if let Some(srv) = self.server.as_mut() {
                    self.collector.done(srv, &ids);
                }
            }
            Ctrl::SessionsPerIdentity(n) => {
                if let Some(srv) = self.server.as_mut() {
                    srv.set_sessions_per_identity(n);
                }
            }
            Ctrl::Kill { done } => {
                if let Some(srv) = self.server.take() {
                    let _ = done.send(srv.into_store());
                }
                return Step::Stop;
            }
        }
        Step::Continue
    }
}

/// `apply_cmd`, then hands what it produced to the outboxes, so that their backlogs count
/// it before the next message is taken (the writers run only once the store task yields:
/// a burst still goes out in one flush). False once the store is gone.
fn apply_and_deliver(server: &mut Option<Server>, outboxes: &mut HashMap<SessionId, Outbox>, cmd: Cmd) -> bool {
    if let Step::Stop = apply_cmd(server, outboxes, cmd) {
        return false;
    }
    if let Some(srv) = server.as_mut() {
        deliver(srv, outboxes);
    }
    true
}

/// Applies one of a session's messages (`Stop` once the store is gone).
fn apply_cmd(server: &mut Option<Server>, outboxes: &mut HashMap<SessionId, Outbox>, cmd: Cmd) -> Step {
    let Some(srv) = server.as_mut() else { return Step::Stop };
    match cmd {
        Cmd::Request { session, req, sums, out } => {
            out.backlog.asked(req.id, reads::weight(&req));
            if !outboxes.get(&session).is_some_and(|o| o.same_channel(&out)) {
                outboxes.insert(session, out);
            }
            // (By its first real operation: a batch may begin with its clock, `At`.)
            let kind = req.ops.iter().find(|o| !matches!(o, p::Op::At { .. })).map_or("none", p::Op::name);
            let began = std::time::Instant::now();
            srv.handle_with_sums(session, req, sums, now());
            srv.record_service(kind, began.elapsed().as_nanos().try_into().unwrap_or(u64::MAX));
        }
        Cmd::RecallDone { session, recall_id } => srv.recall_done(session, recall_id, now()),
        Cmd::Replayed { session } => srv.replayed(session, now()),
        Cmd::Disconnected { session, out } => {
            // Only if no newer connection of the session took over.
            if outboxes.get(&session).is_some_and(|o| o.same_channel(&out)) {
                outboxes.remove(&session);
                srv.disconnected(session, now_ms());
            }
        }
        Cmd::Goodbye { session } => {
            srv.end_session(session);
            outboxes.remove(&session);
        }
        Cmd::Revoked { session, out } => {
            if outboxes.get(&session).is_some_and(|o| o.same_channel(&out)) {
                outboxes.remove(&session);
            }
            srv.end_session(session);
        }
    }
    Step::Continue
}

/// A gap between two ticks longer than this is a stall of the store's thread.
const STALL_MS: u64 = 1_000;

/// Messages applied between two deliveries (and ticks), at most.
const MAX_APPLIED_PER_WAKE: usize = 4096;
/// The store task's time spent applying messages before it does its periodic work (ticks:
/// recall deadlines, parked slices, fencing) and delivers: costly requests from many
/// sessions must not hold those back for seconds.
const APPLY_SLICE: Duration = Duration::from_millis(100);

/// Runs the store task until a `Shutdown` or `Kill`. What is queued is applied (up to
/// `MAX_APPLIED_PER_WAKE`, the sessions' queues in turn) before the periodic work and the
/// delivery of what it produced, so a burst of requests costs one wake-up of each
/// connection's writer, not one per response.
async fn store_task(
    server: Server,
    (mut ctrl, ctrl_tx): (mpsc::UnboundedReceiver<Ctrl>, mpsc::WeakUnboundedSender<Ctrl>),
    queues: sched::Queues<Cmd>,
    arrivals: Arrivals,
) {
    let ready = queues.ready();
    let collector = collect::Collector::new(ctrl_tx);
    let mut task =
        StoreTask { server: Some(server), collector, outboxes: HashMap::new(), queues, admin_waiting: HashMap::new() };
    // Wake often enough to release replies whose recalls went unanswered.
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = now_ms();
    loop {
        let mut next = tokio::select! {
            c = ctrl.recv() => match c {
                Some(c) => Some(c),
                None => return,
            },
            () = ready.notified() => None,
            _ = ticker.tick() => None,
        };
        while let Some(c) = next.take().or_else(|| ctrl.try_recv().ok()) {
            if let Step::Stop = task.apply_ctrl(c) {
                return;
            }
        }
        let mut applied = 0;
        let began = std::time::Instant::now();
        while applied < MAX_APPLIED_PER_WAKE && began.elapsed() < APPLY_SLICE {
            let StoreTask { server, outboxes, queues, .. } = &mut task;
            let (n, stop) = queues.round(|cmd| apply_and_deliver(server, outboxes, cmd));
            if stop {
                return;
            }
            if n == 0 {
                break;
            }
            applied += n;
        }
        if applied >= MAX_APPLIED_PER_WAKE || began.elapsed() >= APPLY_SLICE {
            // More may wait: back after the delivery.
            ready.notify_one();
        }
        let StoreTask { server, outboxes, admin_waiting, collector, .. } = &mut task;
        let Some(srv) = server.as_mut() else { return };
        collector.tick(srv);
        let now = now_ms();
        // Ticks come every 100 ms at most: a longer gap is this thread's own stall.
        if let Some(gap) = now.checked_sub(last_tick).filter(|&g| g > STALL_MS) {
            srv.forgive_stall(now, gap);
        }
        last_tick = now;
        for (session, at) in std::mem::take(&mut *arrivals.lock().unwrap_or_else(|e| e.into_inner())) {
            srv.heard(session, at);
        }
        if let Err(e) = srv.tick(now) {
            tracing::error!("periodic commit failed: {e}");
        }
        if srv.has_parked_ready() {
            // The next slice of parked requests, after what the sessions queued meanwhile.
            ready.notify_one();
        }
        for (token, answer) in srv.take_admin_answers(crate::now()) {
            if let Some(reply) = admin_waiting.remove(&token) {
                let _ = reply.send(answer);
            }
        }
        deliver(srv, outboxes);
    }
}

/// A running server.
pub struct Serving {
    /// Address actually bound (useful with port 0).
    pub local_addr: SocketAddr,
    /// Where Prometheus scrapes are answered (`Options::metrics`, as bound).
    pub metrics_addr: Option<SocketAddr>,
    cmds: mpsc::UnboundedSender<Ctrl>,
    stop: Option<oneshot::Sender<()>>,
    accept: Option<oneshot::Receiver<()>>,
    /// Bumped to have connected sessions' export policies read again.
    policies: watch::Sender<u64>,
    /// The export policies in force (none for `--insecure`).
    exports: Option<Arc<exports::Policies>>,
    per_identity: Arc<AtomicUsize>,
}

/// Binds `listen` and starts serving `store` on a thread of its own, securing connections
/// as `security` says. Async only to keep the callers' shape: it does not need their runtime.
pub async fn start(store: Store, listen: &str, security: Security) -> std::io::Result<Serving> {
    start_with(store, listen, security, Options::default()).await
}

/// `start`, with `options`.
pub async fn start_with(store: Store, listen: &str, security: Security, options: Options) -> std::io::Result<Serving> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    let tls = match &security {
        Security::Insecure => None,
        Security::Tls(authority) => {
            let config = authority.server_config().map_err(std::io::Error::other)?;
            let exports = exports::Policies::load(authority.dir()).map_err(std::io::Error::other)?;
            Some((tokio_rustls::TlsAcceptor::from(config), authority.clone(), Arc::new(exports)))
        }
    };
    let exports = tls.as_ref().map(|(_, _, e)| e.clone());
    let metrics = match options.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Some(l)
        }
        None => None,
    };
    let metrics_addr = metrics.as_ref().map(std::net::TcpListener::local_addr).transpose()?;
    let (cmds, rx) = mpsc::unbounded_channel();
    let queues = sched::Queues::new();
    let ready = queues.ready();
    let mut server = Server::new(store);
    collect::data_access(&mut server, options.data.as_ref())?;
    let weak_cmds = cmds.downgrade();
    server.set_sessions_per_identity(options.sessions_per_identity);
    server.set_reads_elsewhere(options.reads_elsewhere_from);
    server.set_release(options.release.clone());
    server.set_image_name(options.image.clone());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (accept_done_tx, accept_done_rx) = oneshot::channel::<()>();
    let arrivals = Arrivals::default();
    let store_arrivals = arrivals.clone();
    let (policies_tx, policies) = watch::channel(0u64);
    let per_identity = Arc::new(AtomicUsize::new(options.sessions_per_identity));
    let shell =
        Shell { ctrl: cmds.clone(), ready, arrivals, idle: options.idle_timeout, per_identity: per_identity.clone() };
    let listening = Listening { listener, metrics, tls, policies, shell, stop: stop_rx, done: accept_done_tx };
    // With I/O threads of their own, the connections run on a runtime the store's thread
    // owns (and ends once the store task ends, after its last reply is queued).
    let mut runtimes = Runtimes::default();
    if options.io_threads > 0 {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.io_threads)
            .thread_name("crest-io")
            .enable_all()
            .build()?;
        runtimes.io = Some(io);
    }
    runtimes.store = Some(tokio::runtime::Builder::new_current_thread().enable_all().build()?);
    std::thread::Builder::new().name("crest-server".into()).spawn(move || {
        let Runtimes { store: Some(store), io } = &runtimes else { return };
        match io {
            Some(io) => drop(io.spawn(listening.run())),
            None => drop(store.spawn(listening.run())),
        }
        store.block_on(store_task(server, (rx, weak_cmds), queues, store_arrivals));
    })?;
    tracing::info!(%local_addr, tls = matches!(security, Security::Tls(_)), "serving");
    if let Some(addr) = metrics_addr {
        tracing::info!(%addr, "answering Prometheus scrapes at /metrics");
    }
    Ok(Serving {
        local_addr,
        metrics_addr,
        cmds,
        stop: Some(stop_tx),
        accept: Some(accept_done_rx),
        policies: policies_tx,
        exports,
        per_identity,
    })
}

/// The server's runtimes. They are shut down without waiting: dropping one that was not
/// started would block, and `start_with` runs inside its caller's runtime, where that
/// panics (a failure to build the other runtime or to start the thread).
#[derive(Default)]
struct Runtimes {
    store: Option<tokio::runtime::Runtime>,
    io: Option<tokio::runtime::Runtime>,
}

impl Drop for Runtimes {
    fn drop(&mut self) {
        for rt in [self.store.take(), self.io.take()].into_iter().flatten() {
            rt.shutdown_background();
        }
    }
}

/// What the connections' side of the server starts with: the listeners and what each
/// accepted connection is handed.
struct Listening {
    listener: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    tls: Option<(tokio_rustls::TlsAcceptor, Arc<Authority>, Arc<exports::Policies>)>,
    policies: watch::Receiver<u64>,
    shell: Shell,
    stop: oneshot::Receiver<()>,
    done: oneshot::Sender<()>,
}

impl Listening {
    /// Starts the accept loop (and the metrics listener) on the current runtime.
    async fn run(self) {
        let Listening { listener, metrics, tls, policies, shell, stop, done } = self;
        let metrics_cmds = shell.ctrl.clone();
        let certificates = tls.as_ref().map(|(_, authority, _)| authority.clone());
        let gate = tls.map(|(acceptor, authority, exports)| {
            let revoked = watch_revocations(authority.clone());
            Arc::new(Gate { acceptor, authority, revoked, policies, exports })
        });
        match TcpListener::from_std(listener) {
            Ok(listener) => drop(tokio::spawn(accept_loop(listener, shell, gate, stop, done))),
            Err(e) => tracing::error!("cannot listen: {e}"),
        }
        if let Some(l) = metrics {
            match TcpListener::from_std(l) {
                Ok(l) => drop(tokio::spawn(metrics::serve(l, metrics_cmds, certificates))),
                Err(e) => tracing::error!("cannot listen for metrics: {e}"),
            }
        }
    }
}

/// Connection threads by default: none on a machine of two cores or fewer (measured:
/// docs/performance.md, "The server's threads"), else one per core beyond the store's,
/// up to four.
pub fn default_io_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    if cores <= 2 {
        0
    } else {
        (cores - 1).min(4)
    }
}

/// How often the register of clients is looked at for revocations.
const REVOCATION_POLL: Duration = Duration::from_secs(1);

/// Re-reads the register when its file changes and publishes the revoked certificates.
fn watch_revocations(authority: Arc<Authority>) -> watch::Receiver<Arc<HashSet<Fingerprint>>> {
    let (tx, rx) = watch::channel(Arc::new(authority.revoked()));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(REVOCATION_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match authority.refresh() {
                Ok(true) => {
                    if tx.send(Arc::new(authority.revoked())).is_err() {
                        return;
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot re-read the client register, keeping the last one: {e}"),
            }
        }
    });
    rx
}

/// Accepts connections until `stop` fires (or the server thread ends), then says so.
async fn accept_loop(
    listener: TcpListener,
    shell: Shell,
    gate: Option<Arc<Gate>>,
    mut stop: oneshot::Receiver<()>,
    done: oneshot::Sender<()>,
) {
    let counters = Counters::default();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let Some(early) = counters.take(Key::Address(peer.ip()), limits::MAX_UNAUTHENTICATED_PER_ADDRESS)
                    else {
                        tracing::debug!(%peer, "too many connections from this address before their hello: closed");
                        continue;
                    };
                    let shell = shell.clone();
                    let gate = gate.clone();
                    let counters = counters.clone();
                    tokio::spawn(async move {
                        match connection(stream, peer, shell, gate, early, counters).await {
                            Ok(()) => {}
                            Err(ConnError::ClosedBeforeHello) => tracing::debug!(%peer, "connection closed before hello"),
                            Err(e) => limits::refusal!(%peer, "connection closed: {e}"),
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = done.send(());
}

impl Serving {
    /// Stops accepting, lets queued requests finish, commits and returns the store.
    pub async fn shutdown(mut self) -> Result<Store, crest_store::Error> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(a) = self.accept.take() {
            let _ = a.await;
        }
        let (done, rx) = oneshot::channel();
        if self.cmds.send(Ctrl::Shutdown { done }).is_err() {
            return Err(crest_store::Error::Poisoned("the store thread is gone".into()));
        }
        rx.await.unwrap_or_else(|_| Err(crest_store::Error::Poisoned("the store thread stopped".into())))
    }
}

impl Serving {
    /// True if the store task answers within `wait`: it is not stuck (a service manager's
    /// watchdog is fed only then).
    pub async fn responsive(&self, wait: Duration) -> bool {
        let (reply, answered) = oneshot::channel();
        self.cmds.send(Ctrl::Ping(reply)).is_ok() && matches!(tokio::time::timeout(wait, answered).await, Ok(Ok(())))
    }

    /// Stops at once without committing, as `kill -9` would, and hands back the store
    /// with its uncommitted transaction (for crash tests: `Store::abandon` it and reopen
    /// the disk). Connections see the server vanish.
    pub async fn kill(mut self) -> Option<Store> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(a) = self.accept.take() {
            let _ = a.await;
        }
        let (done, rx) = oneshot::channel();
        self.cmds.send(Ctrl::Kill { done }).ok()?;
        rx.await.ok()
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Proto(#[from] p::ProtoError),
    #[error("{0}")]
    Other(String),
    /// The peer closed before sending anything that could be a hello: a port probe or a
    /// health check, not worth a warning.
    #[error("closed before hello")]
    ClosedBeforeHello,
}

/// Appends `m`'s frame to `buf`. A response too large for a frame (the server core keeps
/// each within one; this is the last guard) goes out as EIO for each of its operations,
/// so that its caller hears of it instead of waiting for ever.
fn encode_message(m: &ServerMessage, buf: &mut Vec<u8>) {
    let Err(e) = p::encode_frame(m, buf) else { return };
    let ServerMessage::Response(r) = m else {
        let kind = match m {
            ServerMessage::Welcome(_) => "welcome",
            ServerMessage::Refused { .. } => "refusal",
            ServerMessage::Notify(_) => "notice",
            ServerMessage::Response(_) => "response",
            ServerMessage::Joined(_) => "certificate",
            ServerMessage::Administered(_) => "administrative answer",
        };
        return tracing::error!("cannot send a {kind}: {e}");
    };
    tracing::error!(id = r.id, "cannot send a response, sending EIO instead: {e}");
    let lost = p::OpError { errno: p::errno::EIO, message: "the reply could not be sent".into() };
    let refusal = p::Response { id: r.id, results: vec![Err(lost); r.results.len()], seq: r.seq, ..r.clone() };
    if let Err(e) = p::encode_frame(&ServerMessage::Response(refusal), buf) {
        tracing::error!(id = r.id, "cannot send even the refusal: {e}");
    }
}

/// Secures a new connection as the gate says, then serves it.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shell: Shell,
    gate: Option<Arc<Gate>>,
    early: Slot,
    counters: Counters,
) -> Result<(), ConnError> {
    let Some(gate) = gate else {
        let (rd, wr) = crest_stream::plain(stream);
        return serve(rd, wr, peer, shell, None, None, early).await;
    };
    let tls = tokio::time::timeout(HELLO_TIMEOUT, gate.acceptor.accept(crest_stream::socket(stream)))
        .await
        .map_err(|_| ConnError::Other("no TLS handshake in time".into()))??;
    let fingerprint = crest_tls::peer_fingerprint(tls.get_ref().1);
    let (rd, wr) = crest_stream::tls(tls);
    let admitted = match fingerprint {
        None => None,
        Some(fingerprint) => match gate.authority.admit(&fingerprint) {
            Ok(who) => {
                let per_identity = shell.per_identity.load(Ordering::Relaxed);
                let Some(slot) = counters.take(Key::Identity(fingerprint), per_identity) else {
                    let reason = format!("{} has {per_identity} connections already", who.name);
                    refuse(wr, reason.clone()).await;
                    return Err(ConnError::Other(reason));
                };
                Some(Admitted {
                    fingerprint,
                    name: who.name,
                    local: who.local,
                    revoked: gate.revoked.clone(),
                    _slot: slot,
                })
            }
            Err(reason) => {
                refuse(wr, reason.clone()).await;
                return Err(ConnError::Other(format!("refused: {reason}")));
            }
        },
    };
    serve(rd, wr, peer, shell, Some(gate), admitted, early).await
}

/// Refuses the connection with `reason` (its client reports it) and closes it.
async fn refuse(wr: Writer, reason: String) {
    send_once(wr, &ServerMessage::Refused { reason, version: p::PROTOCOL_VERSION }).await;
}

/// Sends one message and closes.
async fn send_once(mut wr: Writer, m: &ServerMessage) {
    let mut buf = Vec::new();
    encode_message(m, &mut buf);
    let _ = wr.write_all(&buf).await;
    let _ = wr.flush().await;
    let _ = wr.shutdown().await;
}

/// Redeems a join token (the authority writes files and signs: off this thread).
async fn join(wr: Writer, gate: &Gate, join: p::Join, peer: SocketAddr) -> Result<(), ConnError> {
    let answer = match p::check_join(&join) {
        Err(reason) => Err(reason),
        Ok(()) => {
            let authority = gate.authority.clone();
            let redeemed =
                tokio::task::spawn_blocking(move || authority.redeem(&join.token, &join.name, &join.csr)).await;
            match redeemed {
                Ok(Ok(issued)) => Ok(issued),
                Ok(Err(e)) => Err(e.0),
                Err(e) => Err(format!("the server failed: {e}")),
            }
        }
    };
    let msg = match &answer {
        Ok(i) => {
            tracing::info!(%peer, name = %i.name, "client joined");
            ServerMessage::Joined(p::Joined { cert: i.cert.clone(), ca: i.ca.clone(), name: i.name.clone() })
        }
        Err(reason) => {
            limits::refusal!(%peer, "join refused: {reason}");
            ServerMessage::Refused { reason: reason.clone(), version: p::PROTOCOL_VERSION }
        }
    };
    send_once(wr, &msg).await;
    Ok(())
}

/// Renews the certificate the connection was admitted with (the authority writes files
/// and signs: off this thread). The name is the one that certificate carries: the server
/// decides identities, whatever the request says.
async fn renew(wr: Writer, gate: &Gate, who: &Admitted, renew: p::Renew, peer: SocketAddr) -> Result<(), ConnError> {
    let answer = match p::check_renew(&renew) {
        Err(reason) => Err(reason),
        Ok(()) => {
            let (authority, fingerprint) = (gate.authority.clone(), who.fingerprint);
            match tokio::task::spawn_blocking(move || authority.renew(&fingerprint, &renew.csr)).await {
                Ok(Ok(issued)) => Ok(issued),
                Ok(Err(e)) => Err(e.0),
                Err(e) => Err(format!("the server failed: {e}")),
            }
        }
    };
    let msg = match &answer {
        Ok(i) => {
            let (old, new) = (&who.fingerprint.hex()[..16], crest_tls::Fingerprint::of(&i.cert).hex());
            tracing::info!(%peer, name = %i.name, "client certificate {old} renewed: {}", &new[..16]);
            ServerMessage::Joined(p::Joined { cert: i.cert.clone(), ca: i.ca.clone(), name: i.name.clone() })
        }
        Err(reason) => {
            limits::refusal!(%peer, name = %who.name, "renewal refused: {reason}");
            ServerMessage::Refused { reason: reason.clone(), version: p::PROTOCOL_VERSION }
        }
    };
    send_once(wr, &msg).await;
    Ok(())
}

/// Reads the first message of a connection (within `HELLO_TIMEOUT`). On a plaintext
/// connection, a TLS handshake (a record of type 22, version 3.x) ends it at once: its
/// bytes would otherwise read as the start of a long frame, and the client would wait.
async fn first_message(
    rd: &mut Reader,
    decoder: &mut FrameDecoder,
    plaintext: bool,
) -> Result<ClientMessage, ConnError> {
    tokio::time::timeout(HELLO_TIMEOUT, async {
        let mut first = true;
        loop {
            if let Some(m) = decoder.poll_message::<ClientMessage>()? {
                return Ok::<_, ConnError>(m);
            }
            let room = decoder.read_room(crest_stream::BUFFER_BYTES);
            let n = read_burst(rd, room).await?;
            if n == 0 {
                return Err(if decoder.buffered() == 0 {
                    ConnError::ClosedBeforeHello
                } else {
                    ConnError::Other("closed in the middle of its hello".into())
                });
            }
            if std::mem::take(&mut first) && plaintext && room[..n].starts_with(&[0x16, 0x03]) {
                return Err(ConnError::Other("a TLS client; this server runs --insecure".into()));
            }
            decoder.filled(n);
        }
    })
    .await
    .map_err(|_| ConnError::Other("no hello in time".into()))?
}

/// Serves a connection: its hello (or join), then its session's messages until it ends.
/// `gate` is the TLS gate (None for `--insecure`); `admitted`, who the certificate says.
async fn serve(
    mut rd: Reader,
    wr: Writer,
    peer: SocketAddr,
    shell: Shell,
    gate: Option<Arc<Gate>>,
    admitted: Option<Admitted>,
    early: Slot,
) -> Result<(), ConnError> {
    let mut decoder = FrameDecoder::new();
    let first = first_message(&mut rd, &mut decoder, gate.is_none()).await;
    // Through its hello (or on its way out): it no longer counts against its address.
    drop(early);
    let first = first?;
    // What this client may do: its export policy (trusted without TLS: loopback only).
    let policy = || match (&gate, &admitted) {
        (Some(gate), Some(a)) => gate.exports.policy_for(&a.name, a.local),
        _ => Policy::trusted(),
    };
    let hello = match first {
        ClientMessage::Admin(a) if gate.is_none() || admitted.is_some() => {
            let allowed = match policy() {
                p if p.admin => Ok(()),
                _ => Err("this host may not run administrative commands (\"admin\" in its export policy)".into()),
            };
            if let Err(reason) = allowed.and_then(|()| p::check_admin(&a)) {
                refuse(wr, reason).await;
                return Ok(());
            }
            let (reply, rx) = oneshot::channel();
            shell
                .ctrl
                .send(Ctrl::Admin { call: a.call, reply })
                .map_err(|_| ConnError::Other("server stopping".into()))?;
            let answer = rx.await.map_err(|_| ConnError::Other("server stopping".into()))?;
            send_once(wr, &ServerMessage::Administered(answer)).await;
            return Ok(());
        }
        ClientMessage::Join(j) => {
            let Some(gate) = gate else {
                let reason = "this server runs --insecure: there is nothing to join".to_string();
                refuse(wr, reason).await;
                return Ok(());
            };
            return join(wr, &gate, j, peer).await;
        }
        ClientMessage::Renew(r) => {
            let (Some(gate), Some(who)) = (gate, &admitted) else {
                let reason = "no client certificate to renew: join this server (crest join ADDR TOKEN)".to_string();
                refuse(wr, reason).await;
                return Ok(());
            };
            return renew(wr, &gate, who, r, peer).await;
        }
        ClientMessage::Hello(h) if gate.is_none() || admitted.is_some() => h,
        ClientMessage::Hello(_) | ClientMessage::Admin(_) => {
            let reason = "no client certificate: join this server first (crest token create on the server, \
                          then crest join ADDR TOKEN)"
                .to_string();
            refuse(wr, reason.clone()).await;
            return Err(ConnError::Other(reason));
        }
        other => return Err(ConnError::Other(format!("first message is not a hello: {other:?}"))),
    };
    let policy = policy();
    let policy_now = policy.clone();
    let who = admitted.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| "(insecure)".into());
    let (tx, out_rx) = mpsc::unbounded_channel::<(usize, reads::Queued)>();
    let (inbox, queue, wake) = sched::queue(&shell.ready);
    let out_tx = Outbox { tx, backlog: sched::Backlog::new(&wake), ctrl: shell.ctrl.downgrade() };
    let writer = tokio::spawn(write_messages(wr, out_rx, out_tx.backlog.clone()));
    let (reply, rx) = oneshot::channel();
    shell
        .ctrl
        .send(Ctrl::Hello {
            hello,
            peer,
            policy: Box::new(policy),
            identity: who.clone(),
            out: out_tx.clone(),
            queue: Box::new(queue),
            reply,
        })
        .map_err(|_| ConnError::Other("server stopping".into()))?;
    // The store thread has queued the welcome (or refusal) on `out_tx` itself.
    let (session, _welcome) = rx.await.map_err(|_| ConnError::Other("server stopping".into()))?;
    let Some(session) = session else {
        drop(out_tx);
        let _ = writer.await;
        return Ok(());
    };
    tracing::debug!(%peer, session, client = who, "client connected");
    let mut watched =
        reload::Watched::new(admitted.map(|a| (a.fingerprint, a.revoked, a.name, a.local)), gate, policy_now);
    let conn = Conn { shell: &shell, inbox: &inbox, session, out: &out_tx };
    let ended = session_messages(&mut rd, &mut decoder, &conn, &mut watched).await;
    match ended {
        Ok(Ended::Goodbye) => {
            drop(out_tx);
            let _ = writer.await;
            return Ok(());
        }
        Ok(Ended::Stopping) => return Ok(()),
        Ok(Ended::Revoked) => {
            tracing::warn!(%peer, session, client = who, "certificate revoked: session ended");
            let _ = inbox.send(Cmd::Revoked { session, out: out_tx.clone() }, 1).await;
            writer.abort();
            return Ok(());
        }
        Ok(Ended::PolicyChanged) => {
            // (The client connects again at once; its hello takes the new policy.)
            tracing::info!(%peer, session, client = who, "export policy changed: connection closed");
        }
        Ok(Ended::Closed) => {}
        Err(ConnError::Proto(ref e)) => tracing::error!(%peer, session, "bad frame: {e}"),
        Err(_) => {}
    }
    // Whatever ended it, the connection is gone: the writer goes with its socket (it
    // holds the write half, and the store task the outbox it waits on) and the session
    // stays for a reconnect.
    tracing::debug!(%peer, session, "client disconnected");
    let _ = inbox.send(Cmd::Disconnected { session, out: out_tx.clone() }, 1).await;
    writer.abort();
    ended.map(|_| ())
}

/// A connection's writer: sends what the store task queues, a burst per write (encoded
/// into one buffer: no second buffer, and over TLS as few records as the burst fills),
/// and counts it off the connection's backlog. A read still being read is waited for in
/// its place.
async fn write_messages(
    mut wr: Writer,
    mut out_rx: mpsc::UnboundedReceiver<(usize, reads::Queued)>,
    backlog: sched::Backlog,
) {
    let mut buf = Vec::new();
    while let Some((mut bytes, m)) = out_rx.recv().await {
        buf.clear();
        let Some(m) = m.ready().await else { return };
        encode_message(&m, &mut buf);
        while let Ok((more, m)) = out_rx.try_recv() {
            bytes = bytes.saturating_add(more);
            let Some(m) = m.ready().await else { return };
            encode_message(&m, &mut buf);
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            return;
        }
        backlog.sent(bytes);
    }
}

/// What a session's reader holds: the server thread, its queue there, and its outbox.
struct Conn<'a> {
    shell: &'a Shell,
    inbox: &'a sched::Inbox<Cmd>,
    session: SessionId,
    out: &'a Outbox,
}

/// Waits until the connection's unsent replies are few enough to read more requests. A
/// peer reading its replies counts as heard while it waits (a slow link is not a silent
/// one); one that reads nothing for `IDLE_TIMEOUT` is disconnected.
async fn wait_for_room(conn: &Conn<'_>) -> Result<(), ConnError> {
    let backlog = &conn.out.backlog;
    let mut last = backlog.bytes();
    let mut progress = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = backlog.room() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(p::timing::HEARTBEAT_MS)) => {}
        }
        let now = backlog.bytes();
        if now < last {
            progress = tokio::time::Instant::now();
            conn.shell.arrivals.lock().unwrap_or_else(|e| e.into_inner()).insert(conn.session, now_ms());
        } else if progress.elapsed() > conn.shell.idle {
            return Err(ConnError::Other(format!("{now} bytes of replies unread for {:?}", conn.shell.idle)));
        }
        last = now;
    }
}

/// How a session's connection ended.
enum Ended {
    /// The peer closed it.
    Closed,
    /// The client said goodbye.
    Goodbye,
    /// The store task is gone.
    Stopping,
    /// The client's certificate was revoked.
    Revoked,
    /// Its export policy is not what it was at the hello (`Serving::reload`).
    PolicyChanged,
}

/// Waits until `fp` is among the revoked certificates (never, for an insecure connection
/// or when the server stops publishing).
async fn revocation(revoked: &mut Option<(Fingerprint, watch::Receiver<Arc<HashSet<Fingerprint>>>)>) {
    let Some((fp, rx)) = revoked else { return std::future::pending().await };
    loop {
        if rx.borrow_and_update().contains(fp) {
            return;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Hands a session's messages to the store task until the connection ends; an error is a
/// broken connection or a protocol violation. Its queue there full, it waits (and reads no
/// more); its replies piling up unread, it reads no more requests until they drain, or
/// ends the connection after `IDLE_TIMEOUT`.
async fn session_messages(
    rd: &mut Reader,
    decoder: &mut FrameDecoder,
    conn: &Conn<'_>,
    watched: &mut reload::Watched,
) -> Result<Ended, ConnError> {
    let session = conn.session;
    loop {
        loop {
            let before = decoder.buffered();
            let Some(msg) = decoder.poll_message::<ClientMessage>()? else { break };
            let bytes = before - decoder.buffered();
            let cmd = match msg {
                ClientMessage::Request(req) => {
                    let sums = reads::write_sums(&req);
                    Cmd::Request { session, req, sums, out: conn.out.clone() }
                }
                ClientMessage::Replayed => Cmd::Replayed { session },
                ClientMessage::RecallDone { recall_id } => Cmd::RecallDone { session, recall_id },
                ClientMessage::Goodbye => {
                    let _ = conn.inbox.send(Cmd::Goodbye { session }, bytes).await;
                    return Ok(Ended::Goodbye);
                }
                ClientMessage::Hello(_)
                | ClientMessage::Join(_)
                | ClientMessage::Admin(_)
                | ClientMessage::Renew(_) => return Err(ConnError::Other("a second hello on one connection".into())),
            };
            if conn.inbox.send(cmd, bytes).await.is_err() {
                return Ok(Ended::Stopping);
            }
        }
        wait_for_room(conn).await?;
        // (Read straight into the decoder: a big write's bytes are copied once less.)
        let room = decoder.read_room(crest_stream::BUFFER_BYTES);
        let n = tokio::select! {
            r = tokio::time::timeout(conn.shell.idle, read_burst(rd, room)) => match r {
                Err(_) => return Err(ConnError::Other(format!("silent for {:?}", conn.shell.idle))),
                Ok(r) => match r? {
                    0 => return Ok(Ended::Closed),
                    n => n,
                },
            },
            () = revocation(&mut watched.revoked) => return Ok(Ended::Revoked),
            () = reload::policy_changed(&mut watched.policy) => return Ok(Ended::PolicyChanged),
        };
        conn.shell.arrivals.lock().unwrap_or_else(|e| e.into_inner()).insert(session, now_ms());
        decoder.filled(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_too_large_to_send_goes_out_as_an_error_for_each_operation() {
        for ops in [1, 2, 7] {
            let mut results = vec![Ok(p::Reply::Done); ops - 1];
            results.push(Ok(p::Reply::Data(vec![1; p::MAX_FRAME_BYTES])));
            let r = p::Response { id: 42, results, seq: 3, durable: 2, time: None };
            let mut buf = b"before".to_vec();
            encode_message(&ServerMessage::Response(r), &mut buf);
            assert_eq!(&buf[..6], b"before", "what was queued before stays");
            let mut d = FrameDecoder::new();
            d.handle_bytes(&buf[6..]);
            let Ok(Some(ServerMessage::Response(sent))) = d.poll_message::<ServerMessage>() else {
                panic!("no response sent for {ops} operations")
            };
            assert_eq!((sent.id, sent.seq, sent.results.len()), (42, 3, ops));
            assert!(sent.results.iter().all(|r| r.as_ref().is_err_and(|e| e.errno == p::errno::EIO)));
            assert_eq!(d.buffered(), 0);
        }
    }
}
