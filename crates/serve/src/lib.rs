//! The server's async shell (client → proto → **serve** → server → store): a TCP
//! listener whose connections feed the `Server` core, all on one thread.
//!
//! One thread ("crest-server") runs a single-threaded tokio runtime: the accept loop, each
//! connection's reader and writer tasks, and the store task that owns the `Server` core
//! (and so the store). Readers send decoded messages to the store task over a channel; it
//! applies every queued command, then hands the `ServerMessage`s to each connection's
//! writer, which flushes once per burst. A request costs no hand-off between threads: the
//! wake-ups between reader, store and writer are queue pushes on the same thread (on a
//! 2-core VM a cross-thread wake-up costs more than most store operations). The store task
//! also commits on the store's schedule (`tick`) and, at shutdown, finishes every queued
//! request, commits and hands the store back. Store operations block the thread while they
//! run: they are serial anyway.
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
//! - the store is touched only by the store task.
//!
//! Not yet bounded: a connection's outbox (see ARCHITECTURE.md, `crates/serve`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crest_proto::{self as p, ClientMessage, FrameDecoder, ServerMessage};
use crest_server::authz::Policy;
use crest_server::{Outgoing, Server, SessionId};
use crest_store::Store;
use crest_tls::{Authority, Fingerprint};
use limits::{Counters, Key, Slot};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// How long a new connection has to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

mod exports;
pub mod limits;

type Outbox = mpsc::UnboundedSender<ServerMessage>;
/// When each session's bytes last arrived, as its connection's reader saw them: a session
/// counts as heard then, even while its requests wait in the store task's queue behind
/// another session's flood (its lease must not lapse for that).
type Arrivals = Arc<std::sync::Mutex<HashMap<SessionId, u64>>>;
type Reader = Box<dyn AsyncRead + Unpin + Send>;
type Writer = Box<dyn AsyncWrite + Unpin + Send>;

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
}

/// What a connection's tasks hold of the server thread: its command queue, and where they
/// note their session's arrivals.
struct Shell {
    cmds: mpsc::UnboundedSender<Cmd>,
    arrivals: Arrivals,
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

enum Cmd {
    Hello {
        hello: p::Hello,
        peer: SocketAddr,
        /// What the client may do (its export policy).
        policy: Policy,
        out: Outbox,
        reply: oneshot::Sender<(Option<SessionId>, ServerMessage)>,
    },
    Request {
        session: SessionId,
        req: p::Request,
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
    Shutdown {
        done: oneshot::Sender<Result<Store, crest_store::Error>>,
    },
    Kill {
        done: oneshot::Sender<Store>,
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
        };
        if let Some(out) = outboxes.get(&session) {
            let _ = out.send(msg);
        }
    }
}

/// What the store thread does next.
enum Step {
    Continue,
    Stop,
}

/// Applies one command; `Stop` after a shutdown or kill (the store has been handed back).
fn apply_cmd(server: &mut Option<Server>, outboxes: &mut HashMap<SessionId, Outbox>, cmd: Cmd) -> Step {
    let Some(srv) = server.as_mut() else { return Step::Stop };
    match cmd {
        Cmd::Hello { hello, peer, policy, out, reply } => {
            let (sid, msg) = srv.handle_hello(&hello);
            if let Some(sid) = sid {
                srv.set_policy(sid, policy);
                srv.heard(sid, now_ms());
            }
            // The welcome goes out first, before any notice for the session.
            let _ = out.send(msg.clone());
            match sid {
                Some(sid) => {
                    outboxes.insert(sid, out);
                }
                None => tracing::warn!(%peer, "handshake refused: {msg:?}"),
            }
            let _ = reply.send((sid, msg));
        }
        Cmd::Request { session, req, out } => {
            if !outboxes.get(&session).is_some_and(|o| o.same_channel(&out)) {
                outboxes.insert(session, out);
            }
            srv.handle(session, req, now());
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
        Cmd::Shutdown { done } => {
            // Everything queued before the shutdown has been handled (FIFO channel).
            deliver(srv, outboxes);
            if let Some(srv) = server.take() {
                let mut store = srv.into_store();
                let r = store.commit().map(|()| store);
                let _ = done.send(r);
            }
            return Step::Stop;
        }
        Cmd::Kill { done } => {
            if let Some(srv) = server.take() {
                let _ = done.send(srv.into_store());
            }
            return Step::Stop;
        }
    }
    Step::Continue
}

/// A gap between two ticks longer than this is a stall of the store's thread.
const STALL_MS: u64 = 1_000;

/// Runs the store task until a `Shutdown` or `Kill` command. Every command already queued
/// is applied before the periodic work and the delivery of what they produced, so a burst
/// of requests costs one wake-up of each connection's writer, not one per response.
async fn store_task(server: Server, mut rx: mpsc::UnboundedReceiver<Cmd>, arrivals: Arrivals) {
    let mut outboxes: HashMap<SessionId, Outbox> = HashMap::new();
    let mut server = Some(server);
    // Wake often enough to release replies whose recalls went unanswered.
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = now_ms();
    loop {
        let first = tokio::select! {
            c = rx.recv() => match c {
                Some(c) => Some(c),
                None => return,
            },
            _ = ticker.tick() => None,
        };
        if let Some(cmd) = first {
            if let Step::Stop = apply_cmd(&mut server, &mut outboxes, cmd) {
                return;
            }
            for _ in 0..4096 {
                let Ok(cmd) = rx.try_recv() else { break };
                if let Step::Stop = apply_cmd(&mut server, &mut outboxes, cmd) {
                    return;
                }
            }
        }
        let Some(srv) = server.as_mut() else { return };
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
        deliver(srv, &outboxes);
    }
}

/// A running server.
pub struct Serving {
    /// Address actually bound (useful with port 0).
    pub local_addr: SocketAddr,
    cmds: mpsc::UnboundedSender<Cmd>,
    stop: Option<oneshot::Sender<()>>,
    accept: Option<oneshot::Receiver<()>>,
}

/// Binds `listen` and starts serving `store` on a thread of its own, securing connections
/// as `security` says. Async only to keep the callers' shape: it does not need their runtime.
pub async fn start(store: Store, listen: &str, security: Security) -> std::io::Result<Serving> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    let tls = match &security {
        Security::Insecure => None,
        Security::Tls(authority) => {
            let config = authority.server_config().map_err(std::io::Error::other)?;
            Some((tokio_rustls::TlsAcceptor::from(config), authority.clone()))
        }
    };
    let (cmds, rx) = mpsc::unbounded_channel();
    let server = Server::new(store);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (accept_done_tx, accept_done_rx) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let accept_cmds = cmds.clone();
    let arrivals = Arrivals::default();
    let store_arrivals = arrivals.clone();
    std::thread::Builder::new().name("crest-server".into()).spawn(move || {
        runtime.block_on(async move {
            let gate = tls.map(|(acceptor, authority)| {
                let revoked = watch_revocations(authority.clone());
                Arc::new(Gate { acceptor, authority, revoked })
            });
            match TcpListener::from_std(listener) {
                Ok(listener) => {
                    tokio::spawn(accept_loop(listener, accept_cmds, gate, arrivals, stop_rx, accept_done_tx));
                }
                Err(e) => tracing::error!("cannot listen: {e}"),
            }
            store_task(server, rx, store_arrivals).await;
        });
    })?;
    tracing::info!(%local_addr, tls = matches!(security, Security::Tls(_)), "serving");
    Ok(Serving { local_addr, cmds, stop: Some(stop_tx), accept: Some(accept_done_rx) })
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
    cmds: mpsc::UnboundedSender<Cmd>,
    gate: Option<Arc<Gate>>,
    arrivals: Arrivals,
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
                    let cmds = cmds.clone();
                    let gate = gate.clone();
                    let counters = counters.clone();
                    let arrivals = arrivals.clone();
                    tokio::spawn(async move {
                        let shell = Shell { cmds, arrivals };
                        if let Err(e) = connection(stream, peer, shell, gate, early, counters).await {
                            tracing::warn!(%peer, "connection closed: {e}");
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
        if self.cmds.send(Cmd::Shutdown { done }).is_err() {
            return Err(crest_store::Error::Poisoned("the store thread is gone".into()));
        }
        rx.await.unwrap_or_else(|_| Err(crest_store::Error::Poisoned("the store thread stopped".into())))
    }
}

impl Serving {
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
        self.cmds.send(Cmd::Kill { done }).ok()?;
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
    let _ = stream.set_nodelay(true);
    let Some(gate) = gate else {
        let (rd, wr) = stream.into_split();
        return serve(Box::new(rd), Box::new(wr), peer, shell, None, None, early).await;
    };
    let tls = tokio::time::timeout(HELLO_TIMEOUT, gate.acceptor.accept(stream))
        .await
        .map_err(|_| ConnError::Other("no TLS handshake in time".into()))??;
    let fingerprint = crest_tls::peer_fingerprint(tls.get_ref().1);
    let (rd, wr) = tokio::io::split(tls);
    let admitted = match fingerprint {
        None => None,
        Some(fingerprint) => match gate.authority.admit(&fingerprint) {
            Ok(who) => {
                let Some(slot) = counters.take(Key::Identity(fingerprint), limits::MAX_CONNECTIONS_PER_IDENTITY) else {
                    let reason =
                        format!("{} has {} connections already", who.name, limits::MAX_CONNECTIONS_PER_IDENTITY);
                    refuse(Box::new(wr), reason.clone()).await;
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
                refuse(Box::new(wr), reason.clone()).await;
                return Err(ConnError::Other(format!("refused: {reason}")));
            }
        },
    };
    serve(Box::new(rd), Box::new(wr), peer, shell, Some(gate), admitted, early).await
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
            tracing::warn!(%peer, "join refused: {reason}");
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
    buf: &mut [u8],
    plaintext: bool,
) -> Result<ClientMessage, ConnError> {
    tokio::time::timeout(HELLO_TIMEOUT, async {
        let mut first = true;
        loop {
            if let Some(m) = decoder.poll_message::<ClientMessage>()? {
                return Ok::<_, ConnError>(m);
            }
            let n = rd.read(buf).await?;
            if n == 0 {
                return Err(ConnError::Other("closed before hello".into()));
            }
            if std::mem::take(&mut first) && plaintext && buf[..n].starts_with(&[0x16, 0x03]) {
                return Err(ConnError::Other("a TLS client; this server runs --insecure".into()));
            }
            decoder.handle_bytes(&buf[..n]);
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
    let mut buf = vec![0u8; 256 * 1024];
    let first = first_message(&mut rd, &mut decoder, &mut buf, gate.is_none()).await;
    // Through its hello (or on its way out): it no longer counts against its address.
    drop(early);
    let hello = match first? {
        ClientMessage::Join(j) => {
            let Some(gate) = gate else {
                let reason = "this server runs --insecure: there is nothing to join".to_string();
                refuse(wr, reason).await;
                return Ok(());
            };
            return join(wr, &gate, j, peer).await;
        }
        ClientMessage::Hello(h) if gate.is_none() || admitted.is_some() => h,
        ClientMessage::Hello(_) => {
            let reason = "no client certificate: join this server first (crest token create on the server, \
                          then crest join ADDR TOKEN)"
                .to_string();
            refuse(wr, reason.clone()).await;
            return Err(ConnError::Other(reason));
        }
        other => return Err(ConnError::Other(format!("first message is not a hello: {other:?}"))),
    };
    // What this client may do: its export policy (trusted without TLS: loopback only).
    let policy = match (&gate, &admitted) {
        (Some(gate), Some(a)) => match exports::policy_for(gate.authority.dir(), &a.name, a.local) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(%peer, client = %a.name, "session refused: {e}");
                let reason = format!("the server's export policies are unreadable: {e}");
                refuse(wr, reason).await;
                return Err(ConnError::Other(e));
            }
        },
        _ => Policy::trusted(),
    };
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<ServerMessage>();
    let writer = tokio::spawn(async move {
        let mut wr = BufWriter::with_capacity(256 * 1024, wr);
        let mut buf = Vec::new();
        while let Some(m) = out_rx.recv().await {
            buf.clear();
            encode_message(&m, &mut buf);
            while let Ok(m) = out_rx.try_recv() {
                encode_message(&m, &mut buf);
            }
            if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
    });
    let (reply, rx) = oneshot::channel();
    shell
        .cmds
        .send(Cmd::Hello { hello, peer, policy, out: out_tx.clone(), reply })
        .map_err(|_| ConnError::Other("server stopping".into()))?;
    // The store thread has queued the welcome (or refusal) on `out_tx` itself.
    let (session, _welcome) = rx.await.map_err(|_| ConnError::Other("server stopping".into()))?;
    let Some(session) = session else {
        drop(out_tx);
        let _ = writer.await;
        return Ok(());
    };
    let who = admitted.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| "(insecure)".into());
    tracing::debug!(%peer, session, client = who, "client connected");
    let mut revoked = admitted.map(|a| (a.fingerprint, a.revoked));
    let ended = session_messages(&mut rd, &mut decoder, &mut buf, &shell, session, &out_tx, &mut revoked).await;
    match ended {
        Ok(Ended::Goodbye) => {
            drop(out_tx);
            let _ = writer.await;
            return Ok(());
        }
        Ok(Ended::Stopping) => return Ok(()),
        Ok(Ended::Revoked) => {
            tracing::warn!(%peer, session, client = who, "certificate revoked: session ended");
            let _ = shell.cmds.send(Cmd::Revoked { session, out: out_tx.clone() });
            writer.abort();
            return Ok(());
        }
        Ok(Ended::Closed) => {}
        Err(ConnError::Proto(ref e)) => tracing::error!(%peer, session, "bad frame: {e}"),
        Err(_) => {}
    }
    // Whatever ended it, the connection is gone: the writer goes with its socket (it
    // holds the write half, and the store task the outbox it waits on) and the session
    // stays for a reconnect.
    tracing::debug!(%peer, session, "client disconnected");
    let _ = shell.cmds.send(Cmd::Disconnected { session, out: out_tx.clone() });
    writer.abort();
    ended.map(|_| ())
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
/// broken connection or a protocol violation.
async fn session_messages(
    rd: &mut Reader,
    decoder: &mut FrameDecoder,
    buf: &mut [u8],
    shell: &Shell,
    session: SessionId,
    out: &Outbox,
    revoked: &mut Option<(Fingerprint, watch::Receiver<Arc<HashSet<Fingerprint>>>)>,
) -> Result<Ended, ConnError> {
    loop {
        while let Some(msg) = decoder.poll_message::<ClientMessage>()? {
            let cmd = match msg {
                ClientMessage::Request(req) => Cmd::Request { session, req, out: out.clone() },
                ClientMessage::Replayed => Cmd::Replayed { session },
                ClientMessage::RecallDone { recall_id } => Cmd::RecallDone { session, recall_id },
                ClientMessage::Goodbye => {
                    let _ = shell.cmds.send(Cmd::Goodbye { session });
                    return Ok(Ended::Goodbye);
                }
                ClientMessage::Hello(_) | ClientMessage::Join(_) => {
                    return Err(ConnError::Other("a second hello on one connection".into()))
                }
            };
            if shell.cmds.send(cmd).is_err() {
                return Ok(Ended::Stopping);
            }
        }
        tokio::select! {
            r = tokio::time::timeout(limits::IDLE_TIMEOUT, rd.read(buf)) => match r {
                Err(_) => return Err(ConnError::Other(format!("silent for {:?}", limits::IDLE_TIMEOUT))),
                Ok(r) => match r? {
                    0 => return Ok(Ended::Closed),
                    n => {
                        shell.arrivals.lock().unwrap_or_else(|e| e.into_inner()).insert(session, now_ms());
                        decoder.handle_bytes(&buf[..n]);
                    }
                },
            },
            () = revocation(revoked) => return Ok(Ended::Revoked),
        }
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
