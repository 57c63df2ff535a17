//! The connection driver and the blocking call API: a thread running a tokio runtime
//! moves bytes, calls and timers between the socket, the callers and the sans-I/O
//! `crest_client::conn::Connection`, which decides everything else (what is sent, in
//! which order, what goes again after a reconnect or a server restart, who is told
//! what). Callers block on `Client::call`; writeback submissions (`AsyncPermit`) are
//! held here briefly and handed over in bursts, to wake the connection thread once per
//! burst rather than once per submission.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crest_client::conn::{Call, Connection, Event, RightsHook, State, HANDSHAKE_WAIT};
use crest_proto as p;
use crest_stream::{read_burst, Reader, Writer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

pub use crest_client::conn::{ClientError, ConnView, Recall, Rights, HEARTBEAT};
pub use crest_client::lease::CLIENT_LEASE;
pub use crest_client::replay::{Results, MAX_UNSTABLE_BYTES};

/// Requests in flight at once (the server's reply cache holds more, so every retry is
/// still answered from it).
pub const MAX_IN_FLIGHT: usize = 1024;

/// Bytes of writeback requests (`Client::submit`) in flight at once; a submitter waits
/// beyond this, which bounds what a client holds unacknowledged.
pub const MAX_ASYNC_BYTES: usize = 64 << 20;

/// How the client behaves.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Name the server logs for this client.
    pub client_name: String,
    /// The dataset to mount (empty: the server's default one).
    pub dataset: String,
    /// How long a call waits (including reconnects) before failing with `Timeout`.
    pub op_timeout: Duration,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
    /// Mutual TLS (`crest_tls::client_config`), or `None` for a server run `--insecure`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "crest-client".into(),
            dataset: String::new(),
            op_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

/// What callers hand the connection task.
enum Outbound {
    Call(Call<Reply>),
    RecallDone(u64),
    /// Say goodbye, then signal (the client is being dropped).
    Goodbye(std_mpsc::SyncSender<()>),
}

/// What a writeback submission runs when its response arrives (on the connection thread:
/// it must not block).
pub type Completion = Box<dyn FnOnce(Result<Results, ClientError>) + Send>;

/// Where a response goes: to a waiting caller, or to a writeback completion (which gives
/// its room in the writeback budget back).
enum Reply {
    Wait(std_mpsc::SyncSender<Result<Results, ClientError>>),
    Then(Completion, AsyncBudget, usize),
}

impl Reply {
    fn send(self, r: Result<Results, ClientError>) {
        match self {
            Reply::Wait(tx) => {
                let _ = tx.try_send(r);
            }
            Reply::Then(done, budget, bytes) => {
                done(r);
                budget.release(bytes);
            }
        }
    }
}

/// A burst stops taking queued calls once this much is encoded: it is sent, and the rest
/// follows in the next burst (the core reuses buffers up to about this size).
const BURST_BYTES: usize = 8 << 20;

/// Writeback submissions held on the client before they go to the connection task: up
/// to this many, or this many bytes, or `HELD_FOR`, whichever comes first.
const HELD_MAX_CALLS: usize = 64;
const HELD_MAX_BYTES: usize = 1 << 20;
/// How long a writeback submission may wait on the client when nothing else is sent and
/// nobody waits for it (a recall answer, a sync call, `flush_writeback` ship it at once).
const HELD_FOR: Duration = Duration::from_millis(20);

/// Writeback submissions not yet handed to the connection task. Handing each over on its
/// own wakes that thread once per submission (an untar makes ~9 per file); held here,
/// they go over in one hand-off when something must go out — in order, ahead of it.
#[derive(Default)]
struct Held {
    calls: Vec<Outbound>,
    bytes: usize,
}

/// The client's side of the queue to its connection task: writeback submissions are
/// held, everything else goes at once behind them.
struct Outbox {
    tx: mpsc::UnboundedSender<Outbound>,
    held: Arc<Mutex<Held>>,
    /// Told when a submission is held with none before it: `HELD_FOR` from then, the
    /// held ones go (an idle client's connection thread sleeps until then).
    due: Arc<Notify>,
}

/// Hands `held`'s submissions to the connection task, in order; one the task can no
/// longer take (it ended) fails with `Closed`.
fn release_held(held: &mut Held, tx: &mpsc::UnboundedSender<Outbound>) {
    held.bytes = 0;
    for o in held.calls.drain(..) {
        if let Err(e) = tx.send(o) {
            if let Outbound::Call(c) = e.0 {
                for (reply, r) in c.answer(Err(ClientError::Closed)) {
                    reply.send(r);
                }
            }
        }
    }
}

impl Outbox {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `o` now, after every held submission; false when the connection is gone.
    fn send(&self, o: Outbound) -> bool {
        let mut h = self.held();
        release_held(&mut h, &self.tx);
        self.tx.send(o).is_ok()
    }

    /// Holds a writeback submission (sends the batch when it is big enough).
    fn hold(&self, c: Call<Reply>, bytes: usize) {
        let mut h = self.held();
        h.calls.push(Outbound::Call(c));
        h.bytes += bytes;
        if h.calls.len() >= HELD_MAX_CALLS || h.bytes >= HELD_MAX_BYTES {
            release_held(&mut h, &self.tx);
        } else if h.calls.len() == 1 {
            self.due.notify_one();
        }
    }

    fn flush(&self) {
        release_held(&mut self.held(), &self.tx);
    }
}

/// Ships held submissions `HELD_FOR` after the first of them was held (so a lone one is
/// not held for long), and sleeps while nothing is held: an idle client does not wake.
/// Ends with the client.
async fn release_held_when_due(held: Arc<Mutex<Held>>, due: Arc<Notify>, tx: mpsc::WeakUnboundedSender<Outbound>) {
    loop {
        due.notified().await;
        tokio::time::sleep(HELD_FOR).await;
        let Some(tx) = tx.upgrade() else { return };
        let mut h = held.lock().unwrap_or_else(|e| e.into_inner());
        if !h.calls.is_empty() {
            release_held(&mut h, &tx);
        }
    }
}

/// Bytes of writeback in flight, with a condition variable for submitters that wait.
#[derive(Clone, Default)]
struct AsyncBudget(Arc<(Mutex<usize>, Condvar)>);

impl AsyncBudget {
    fn take(&self, bytes: usize) {
        let (lock, cvar) = &*self.0;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 && *n + bytes > MAX_ASYNC_BYTES {
            n = cvar.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += bytes;
    }

    fn release(&self, bytes: usize) {
        let (lock, cvar) = &*self.0;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(bytes);
        cvar.notify_all();
    }
}

/// Room for one writeback submission, taken before the submitter locks its cache (taking
/// it may wait); dropped unused, it gives the room back.
pub struct AsyncPermit<'a> {
    client: &'a Client,
    bytes: usize,
    used: bool,
}

impl AsyncPermit<'_> {
    /// Sends `ops` (applied at the client's `time`) without waiting; `done` runs with the
    /// results when they arrive. The request may be held on the client for up to
    /// `HELD_FOR` (with others, to save the connection thread a wake-up each): anything
    /// sent after it — a call, a recall answer — and `Client::flush_writeback` ship it
    /// first. Never blocks, so it may be called under the caller's
    /// cache lock — which is what orders it before any recall answer the recall thread
    /// sends after taking that lock.
    pub fn submit(mut self, ops: Vec<p::Op>, time: p::Time, done: Completion) -> Result<(), ClientError> {
        self.used = true;
        let id = self.client.next_id.fetch_add(1, Ordering::Relaxed);
        let budget = self.client.budget.clone();
        let reply = Reply::Then(done, budget, self.bytes);
        if self.client.out.tx.is_closed() {
            reply.send(Err(ClientError::Closed));
            return Err(ClientError::Closed);
        }
        let call = Call::writeback(id, ops, time, Instant::now(), reply).with_caller(self.client.caller());
        self.client.out.hold(call, self.bytes);
        Ok(())
    }
}

impl Drop for AsyncPermit<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.client.budget.release(self.bytes);
        }
    }
}

/// A call waits at least this long before its caller's interrupt check is asked: most
/// answers come well before, and an interrupted change may still run.
const INTERRUPTIBLE_AFTER: Duration = Duration::from_secs(1);
/// How often a waiting call asks the interrupt check after that.
const INTERRUPT_POLL: Duration = Duration::from_millis(200);
/// How long ending a session waits for the server to make its changes durable first.
const DURABLE_AT_GOODBYE: Duration = Duration::from_secs(5);

/// Whether the caller of a waiting call gave up (see `Client::set_interrupt_check`).
pub type InterruptCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// On whose behalf the calling thread calls (see `Client::set_caller_source`).
pub type CallerSource = Box<dyn Fn() -> p::Caller + Send + Sync>;

/// A connection to one server, shared by every thread of a mount.
pub struct Client {
    interrupted: std::sync::OnceLock<InterruptCheck>,
    caller_source: std::sync::OnceLock<CallerSource>,
    out: Outbox,
    recalls: Mutex<Option<std_mpsc::Receiver<Recall>>>,
    recalls_taken: Arc<AtomicBool>,
    /// Request ids, shared with the connection thread (which makes requests of its own:
    /// the locks it takes again after a restart).
    next_id: Arc<AtomicU64>,
    in_flight: Arc<(Mutex<usize>, Condvar)>,
    budget: AsyncBudget,
    rights: RightsHook,
    opts: ClientOptions,
    addr: String,
    fsid: [u8; 16],
    /// The dataset keeps no access times (its `atime` property was off at the first
    /// welcome).
    noatime: bool,
    identity: Identity,
    /// The connection thread's `ConnView`, as of its last wake-up.
    view: Arc<Mutex<ConnView>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

impl Client {
    /// How long a call may wait for its answer (the mount's `--timeout`).
    pub fn op_timeout(&self) -> Duration {
        self.opts.op_timeout
    }

    /// Connects (waiting up to `connect_timeout` for the first handshake) and starts the
    /// connection thread.
    pub fn connect(addr: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let (recall_tx, recall_rx) = std_mpsc::channel();
        let recalls_taken = Arc::new(AtomicBool::new(false));
        let sink = RecallSink { tx: recall_tx, taken: recalls_taken.clone() };
        let rights: RightsHook = Arc::default();
        let next_id = Arc::new(AtomicU64::new(1));
        let core = Connection::new(addr, &opts.client_name, next_id.clone(), rights.clone(), Instant::now())
            .with_dataset(&opts.dataset);
        let identity = Identity::default();
        let view = Arc::new(Mutex::new(ConnView::default()));
        let driver = Driver {
            core,
            addr: addr.to_string(),
            opts: opts.clone(),
            ready: ready_tx,
            recalls: sink,
            identity: identity.clone(),
            view: view.clone(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Connect { addr: addr.into(), detail: e.to_string() })?;
        let held = Arc::new(Mutex::new(Held::default()));
        let due = Arc::new(Notify::new());
        let (task_held, task_due, weak_tx) = (held.clone(), due.clone(), tx.downgrade());
        std::thread::Builder::new()
            .name("crest-conn".into())
            .spawn(move || {
                rt.block_on(async move {
                    tokio::spawn(release_held_when_due(task_held, task_due, weak_tx));
                    run(driver, rx).await
                })
            })
            .map_err(|e| ClientError::Connect { addr: addr.into(), detail: e.to_string() })?;
        let (fsid, noatime) = match ready_rx.recv_timeout(opts.connect_timeout + Duration::from_secs(1)) {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ClientError::Connect { addr: addr.into(), detail: "timed out".into() }),
        };
        Ok(Client {
            interrupted: std::sync::OnceLock::new(),
            caller_source: std::sync::OnceLock::new(),
            out: Outbox { tx, held, due },
            recalls: Mutex::new(Some(recall_rx)),
            recalls_taken,
            next_id,
            in_flight: Arc::new((Mutex::new(0), Condvar::new())),
            budget: AsyncBudget::default(),
            rights,
            opts,
            addr: addr.into(),
            fsid,
            noatime,
            identity,
            view,
        })
    }

    /// What the connection is doing (as of its thread's last wake-up).
    pub fn view(&self) -> ConnView {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes the stream of recalls (once). Whoever takes it must drop what each recall
    /// names from its caches and then call `recall_done`; until someone takes it the
    /// connection answers recalls itself at once (a client that caches nothing).
    pub fn take_recalls(&self) -> Option<std_mpsc::Receiver<Recall>> {
        let r = self.recalls.lock().unwrap_or_else(|e| e.into_inner()).take();
        if r.is_some() {
            self.recalls_taken.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Ends the session cleanly: the server releases this client's open files and rights
    /// at once instead of waiting for them to time out. First the server makes every
    /// change it acknowledged durable (an unmount leaves nobody to replay them after a
    /// crash), waiting up to `DURABLE_AT_GOODBYE`; then the goodbye, up to a second.
    fn goodbye(&self) {
        if let Err(e) = self.call_bounded(vec![p::Op::Fsync { ino: 1 }], DURABLE_AT_GOODBYE) {
            tracing::warn!("{}: could not make this session's changes durable before leaving: {e}", self.addr);
        }
        let (done, rx) = std_mpsc::sync_channel(1);
        if self.out.send(Outbound::Goodbye(done)) {
            let _ = rx.recv_timeout(Duration::from_secs(1));
        }
    }

    /// Tells the server that recall `recall_id` is done. (Id 0 names rights the server
    /// refused to give back after a restart: dropped, but nobody waits for an answer.)
    pub fn recall_done(&self, recall_id: u64) {
        if recall_id != 0 {
            self.out.send(Outbound::RecallDone(recall_id));
        }
    }

    /// Ships every held writeback submission now (before waiting for one to complete).
    pub fn flush_writeback(&self) {
        self.out.flush();
    }

    /// The server's file system id.
    pub fn fsid(&self) -> [u8; 16] {
        self.fsid
    }

    /// Whether the mounted dataset keeps no access times (`atime=off` when mounted).
    pub fn dataset_noatime(&self) -> bool {
        self.noatime
    }

    /// Whom the server takes this session's callers for (`p::Welcome::identity`, from
    /// the last welcome).
    pub fn identity_map(&self) -> Arc<p::IdentityMap> {
        self.identity.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The server address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Installs the hook told about rights in wire order (once; false if one was set).
    pub fn set_rights(&self, rights: Arc<dyn Rights>) -> bool {
        self.rights.set(rights).is_ok()
    }

    /// Room for a writeback submission of about `bytes` (waits while `MAX_ASYNC_BYTES`
    /// are in flight).
    pub fn async_permit(&self, bytes: usize) -> AsyncPermit<'_> {
        let bytes = bytes + 128;
        self.budget.take(bytes);
        AsyncPermit { client: self, bytes, used: false }
    }

    /// Sends a compound request and waits for its results.
    pub fn call(&self, ops: Vec<p::Op>) -> Result<Results, ClientError> {
        let (lock, cvar) = &*self.in_flight;
        {
            let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
            while *n >= MAX_IN_FLIGHT {
                n = cvar.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            *n += 1;
        }
        let result = self.call_inner(ops);
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        cvar.notify_one();
        result
    }

    fn call_inner(&self, ops: Vec<p::Op>) -> Result<Results, ClientError> {
        self.call_bounded(ops, self.opts.op_timeout)
    }

    /// `call_inner`, giving up after `limit`.
    fn call_bounded(&self, ops: Vec<p::Op>, limit: Duration) -> Result<Results, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = std_mpsc::sync_channel(1);
        let call = Call::wait(id, ops, Instant::now(), Reply::Wait(reply)).with_caller(self.caller());
        if !self.out.send(Outbound::Call(call)) {
            return Err(ClientError::Closed);
        }
        // A caller that waits long may be asked to stop: after `INTERRUPTIBLE_AFTER`, the
        // interrupt check (`set_interrupt_check`) is asked every `INTERRUPT_POLL`.
        let start = std::time::Instant::now();
        loop {
            let waited = start.elapsed();
            let Some(left) = limit.checked_sub(waited).filter(|d| !d.is_zero()) else {
                return Err(ClientError::Timeout { addr: self.addr.clone(), secs: limit.as_secs() });
            };
            let slice = if waited < INTERRUPTIBLE_AFTER { INTERRUPTIBLE_AFTER - waited } else { INTERRUPT_POLL };
            match rx.recv_timeout(left.min(slice)) {
                Ok(r) => return r,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    let check = self.interrupted.get();
                    if start.elapsed() >= INTERRUPTIBLE_AFTER && check.is_some_and(|f| f()) {
                        tracing::debug!(id, "caller interrupted after {:?}", start.elapsed());
                        return Err(ClientError::Interrupted { addr: self.addr.clone() });
                    }
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return Err(ClientError::Closed),
            }
        }
    }

    /// How a waiting call learns that its caller gave up (a signal to take): asked on the
    /// calling thread, once a call has waited `INTERRUPTIBLE_AFTER`. Set once.
    pub fn set_interrupt_check(&self, check: InterruptCheck) {
        let _ = self.interrupted.set(check);
    }

    /// How a call learns on whose behalf it runs: asked on the calling thread for every
    /// call and writeback submission (root when unset, as for a tool). Set once.
    pub fn set_caller_source(&self, source: CallerSource) {
        let _ = self.caller_source.set(source);
    }

    fn caller(&self) -> p::Caller {
        self.caller_source.get().map_or(p::Caller::ROOT, |f| f())
    }

    /// One operation; errors flattened to an errno.
    pub fn call_one(&self, op: p::Op) -> Result<p::Reply, p::OpError> {
        match self.call(vec![op]) {
            Ok(mut r) => r.pop().unwrap_or_else(|| Err(p::OpError { errno: 5, message: "empty response".into() })),
            Err(e) => Err(p::OpError { errno: e.errno(), message: e.to_string() }),
        }
    }
}

/// Where recalls go: to whoever took them, else answered at once by the connection.
struct RecallSink {
    tx: std_mpsc::Sender<Recall>,
    taken: Arc<AtomicBool>,
}

impl RecallSink {
    /// False when nobody takes recalls (the caller answers it).
    fn deliver(&self, r: Recall) -> bool {
        self.taken.load(Ordering::SeqCst) && self.tx.send(r).is_ok()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.goodbye();
    }
}

/// The connection thread's side of the connection: the core, and where its events go.
struct Driver {
    core: Connection<Reply>,
    addr: String,
    opts: ClientOptions,
    ready: std_mpsc::SyncSender<Result<([u8; 16], bool), ClientError>>,
    recalls: RecallSink,
    identity: Identity,
    view: Arc<Mutex<ConnView>>,
}

/// Whom the server takes this session's callers for, as its last welcome said.
type Identity = Arc<Mutex<Arc<p::IdentityMap>>>;

impl Driver {
    /// Tells callers what the core has for them. A recall nobody takes is answered at
    /// once (a client that caches nothing).
    fn deliver(&mut self) {
        self.publish_view();
        while let Some(e) = self.core.poll_event() {
            match e {
                Event::Answer(reply, r) => reply.send(r),
                Event::Recall(r) => {
                    let id = r.recall_id;
                    if !self.recalls.deliver(r) {
                        self.core.recall_done(id);
                    }
                }
                Event::Ready(r) => {
                    let _ = self.ready.try_send(r.map(|fsid| (fsid, self.core.noatime())));
                }
                Event::Identity(m) => *self.identity.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(m),
            }
        }
    }

    /// Runs `fut` while keeping the core's timers (the lease, heartbeats): whatever the
    /// thread waits for — a connect, a backoff, a full socket — the lease lapses on time.
    async fn with_timers<F: Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        loop {
            let deadline = tokio::time::Instant::from_std(self.core.poll_timeout());
            tokio::select! {
                r = &mut fut => return r,
                _ = tokio::time::sleep_until(deadline) => {
                    self.core.handle_timeout(Instant::now());
                    // (A hung server or a full socket keeps the loop here: what the
                    // timers changed is what `crest status --mount` must show.)
                    self.publish_view();
                }
            }
        }
    }

    fn publish_view(&self) {
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = self.core.view();
    }

    /// Writes what the core has to send; false if the connection failed.
    async fn transmit<W: AsyncWriteExt + Unpin>(&mut self, wr: &mut W) -> bool {
        loop {
            let out = self.core.poll_transmit();
            if out.is_empty() {
                return true;
            }
            let written = self
                .with_timers(async {
                    wr.write_all(&out).await?;
                    wr.flush().await
                })
                .await;
            if let Err(e) = written {
                self.core.connection_lost(&e.to_string());
                return false;
            }
            self.core.recycle(out);
        }
    }

    /// Keeps taking calls while away, so callers queue instead of failing, for `backoff`,
    /// which then doubles (up to a second). False when the client is gone.
    async fn wait_away(&mut self, calls: &mut mpsc::UnboundedReceiver<Outbound>, backoff: &mut Duration) -> bool {
        let sleep = tokio::time::sleep(*backoff);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
        tokio::pin!(sleep);
        loop {
            let deadline = tokio::time::Instant::from_std(self.core.poll_timeout());
            tokio::select! {
                _ = &mut sleep => return true,
                _ = tokio::time::sleep_until(deadline) => self.core.handle_timeout(Instant::now()),
                c = calls.recv() => match c {
                    Some(Outbound::Call(c)) => self.core.submit(c, Instant::now()),
                    // The new connection's session will not wait for it.
                    Some(Outbound::RecallDone(_)) => {}
                    Some(Outbound::Goodbye(_)) | None => {
                        self.core.goodbye();
                        return false;
                    }
                },
            }
            self.deliver();
        }
    }

    /// Reads the answer to the hello (each read within `HANDSHAKE_WAIT`).
    async fn handshake(&mut self, rd: &mut Reader, buf: &mut [u8]) {
        let mut give_up = tokio::time::Instant::now() + HANDSHAKE_WAIT;
        while self.core.state() == State::Handshaking {
            let deadline = tokio::time::Instant::from_std(self.core.poll_timeout());
            tokio::select! {
                r = read_burst(rd, buf) => {
                    match r {
                        Ok(n) => self.core.handle_bytes(Instant::now(), &buf[..n]),
                        Err(e) if certificates_refused(&e) && !self.core.has_connected() => {
                            self.core.fail(untrusted(&self.addr, &e));
                        }
                        Err(e) => self.core.connection_lost(&e.to_string()),
                    }
                    give_up = tokio::time::Instant::now() + HANDSHAKE_WAIT;
                }
                _ = tokio::time::sleep_until(give_up) => self.core.handshake_timeout(),
                _ = tokio::time::sleep_until(deadline) => self.core.handle_timeout(Instant::now()),
            }
        }
    }

    /// Hands a burst of queued calls to the core, so one write carries it and consecutive
    /// writeback merges. False when the client says goodbye (`done` is told once sent).
    async fn burst<W: AsyncWriteExt + Unpin>(
        &mut self,
        first: Outbound,
        calls: &mut mpsc::UnboundedReceiver<Outbound>,
        wr: &mut W,
    ) -> bool {
        let mut next = Some(first);
        // (What is queued past BURST_BYTES waits for the next burst: the buffer the core
        // encodes into stays a size it can keep and reuse.)
        let more = |core: &Connection<_>, calls: &mut mpsc::UnboundedReceiver<Outbound>| {
            (core.queued_bytes() < BURST_BYTES).then(|| calls.try_recv().ok()).flatten()
        };
        while let Some(o) = next.take().or_else(|| more(&self.core, calls)) {
            match o {
                Outbound::Call(c) => self.core.submit(c, Instant::now()),
                Outbound::RecallDone(id) => self.core.recall_done(id),
                Outbound::Goodbye(done) => {
                    self.core.goodbye();
                    self.transmit(wr).await;
                    self.deliver();
                    let _ = done.try_send(());
                    return false;
                }
            }
        }
        self.core.end_burst();
        true
    }
}

impl Driver {
    /// The connection's two halves (`crest_stream`): plain, or after a TLS handshake
    /// (within `HANDSHAKE_WAIT`, the lease kept meanwhile). Why not, if the handshake failed.
    async fn secure(&mut self, stream: TcpStream) -> Result<(Reader, Writer), ClientError> {
        let Some(config) = self.opts.tls.clone() else {
            return Ok(crest_stream::plain(stream));
        };
        let tls = self
            .with_timers(tokio::time::timeout(HANDSHAKE_WAIT, tls_connect(config, stream)))
            .await
            .map_err(|_| ClientError::NotCrest { addr: self.addr.clone(), detail: "no TLS handshake in time".into() })?
            .map_err(|e| tls_error(&self.addr, e))?;
        Ok(crest_stream::tls(tls))
    }
}

/// A TLS 1.3 handshake as a client of `config` (which pins the server's CA).
async fn tls_connect(
    config: Arc<rustls::ClientConfig>,
    stream: TcpStream,
) -> std::io::Result<tokio_rustls::client::TlsStream<crest_stream::Socket>> {
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(config).connect(name, crest_stream::socket(stream)).await
}

/// Whether `e` is TLS saying the certificates do not match: the server's is not from the
/// CA this client pins, or the server refuses this client's (an alert that, in TLS 1.3,
/// arrives with the first read after the handshake).
fn certificates_refused(e: &std::io::Error) -> bool {
    use rustls::AlertDescription as A;
    e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).is_some_and(|r| {
        matches!(
            r,
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::General(_)
                | rustls::Error::AlertReceived(
                    A::BadCertificate
                        | A::UnknownCA
                        | A::CertificateRequired
                        | A::CertificateRevoked
                        | A::CertificateExpired
                        | A::CertificateUnknown
                        | A::AccessDenied
                )
        )
    })
}

fn untrusted(addr: &str, e: &std::io::Error) -> ClientError {
    let detail = format!(
        "{e}; to mount a server of another host, join it first (`crest token create` there, \
         `crest join {addr} TOKEN` here)"
    );
    ClientError::Untrusted { addr: addr.to_string(), detail }
}

/// What a failed TLS handshake means to a user: certificates that do not match, or a peer
/// that does not speak crest over TLS.
fn tls_error(addr: &str, e: std::io::Error) -> ClientError {
    if certificates_refused(&e) {
        return untrusted(addr, &e);
    }
    let detail = format!("the TLS handshake failed: {e} (a server run with --insecure needs --insecure here too)");
    ClientError::NotCrest { addr: addr.to_string(), detail }
}

/// The name every crest server's certificate carries (`crest_tls::SERVER_NAME`).
const SERVER_NAME: &str = "crest";

/// Redeems a join token at `addr` (a TLS server whose CA `config` pins) for a certificate.
pub fn join(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    req: p::Join,
    wait: Duration,
) -> Result<p::Joined, ClientError> {
    let version = req.version;
    ask_certificate(addr, config, version, wait, |version| p::ClientMessage::Join(p::Join { version, ..req.clone() }))
}

/// Asks `addr` for the next certificate of the one `config` presents (a server older than
/// renewals closes the connection: a `ClientError` saying so).
pub fn renew(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    req: p::Renew,
    wait: Duration,
) -> Result<p::Joined, ClientError> {
    let version = req.version;
    ask_certificate(addr, config, version, wait, |version| p::ClientMessage::Renew(p::Renew { version, ..req.clone() }))
}

/// Sends `message(version)` and takes the certificate the server answers with, asking again
/// in the version a refusal names when this client speaks it too.
fn ask_certificate(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    mut version: u32,
    wait: Duration,
    message: impl Fn(u32) -> p::ClientMessage,
) -> Result<p::Joined, ClientError> {
    loop {
        match exchange(addr, Some(config.clone()), message(version), wait)? {
            p::ServerMessage::Joined(j) => return Ok(j),
            p::ServerMessage::Refused { version: theirs, .. } if p::retry_version(version, theirs).is_some() => {
                version = theirs;
            }
            other => return Err(unexpected(addr, other)),
        }
    }
}

/// Runs one administrative call (an encoded name-value list) at `addr` (`tls`: None for a
/// server run `--insecure`); returns the answer's bytes.
pub fn admin(
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    call: Vec<u8>,
    wait: Duration,
) -> Result<Vec<u8>, ClientError> {
    let mut version = p::PROTOCOL_VERSION;
    loop {
        let msg = p::ClientMessage::Admin(p::Admin { magic: p::HELLO_MAGIC, version, call: call.clone() });
        match exchange(addr, tls.clone(), msg, wait)? {
            p::ServerMessage::Administered(a) => return Ok(a),
            // (An older server: asked again in its version, which this code speaks too.)
            p::ServerMessage::Refused { version: v, .. } if p::retry_version(version, v).is_some() => version = v,
            other => return Err(unexpected(addr, other)),
        }
    }
}

fn unexpected(addr: &str, m: p::ServerMessage) -> ClientError {
    match m {
        p::ServerMessage::Refused { reason, .. } => ClientError::Refused { addr: addr.to_string(), reason },
        other => ClientError::NotCrest { addr: addr.to_string(), detail: format!("answered {other:?}") },
    }
}

/// Sends `msg` as a connection's first message and returns the server's one answer.
fn exchange(
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    msg: p::ClientMessage,
    wait: Duration,
) -> Result<p::ServerMessage, ClientError> {
    let err = |detail: String| ClientError::Connect { addr: addr.to_string(), detail };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| err(e.to_string()))?;
    let exchange = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| err(e.to_string()))?;
        let not_crest = |detail: String| ClientError::NotCrest { addr: addr.to_string(), detail };
        let (mut rd, mut wr) = match tls {
            Some(config) => crest_stream::tls(tls_connect(config, stream).await.map_err(|e| tls_error(addr, e))?),
            None => crest_stream::plain(stream),
        };
        let mut buf = Vec::new();
        p::encode_frame(&msg, &mut buf).map_err(|e| err(e.to_string()))?;
        wr.write_all(&buf).await.map_err(|e| err(e.to_string()))?;
        wr.flush().await.map_err(|e| err(e.to_string()))?;
        let mut decoder = p::FrameDecoder::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match decoder.poll_message::<p::ServerMessage>() {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => return Err(not_crest(e.to_string())),
            }
            match read_burst(&mut rd, &mut chunk).await {
                Ok(0) => return Err(err("the server closed the connection".into())),
                Ok(n) => decoder.handle_bytes(&chunk[..n]),
                Err(e) => return Err(err(e.to_string())),
            }
        }
    };
    rt.block_on(async { tokio::time::timeout(wait, exchange).await })
        .map_err(|_| err(format!("no answer within {} s", wait.as_secs())))?
}

/// The connection loop: connect, handshake, resend what is pending, then move requests
/// and responses until the connection breaks; repeat.
/// What woke the connection loop.
enum Woke {
    Timer,
    Call(Option<Outbound>),
    Read(std::io::Result<usize>),
}

async fn run(mut d: Driver, mut calls: mpsc::UnboundedReceiver<Outbound>) {
    let mut backoff = Duration::from_millis(20);
    let started = Instant::now();
    let mut buf = vec![0u8; crest_stream::BUFFER_BYTES];
    loop {
        d.core.connecting(Instant::now());
        let addr = d.addr.clone();
        let stream = match d.with_timers(TcpStream::connect(&addr)).await {
            Ok(s) => s,
            Err(e) => {
                if !d.core.has_connected() && started.elapsed() > d.opts.connect_timeout {
                    d.core.fail(ClientError::Connect { addr: addr.clone(), detail: e.to_string() });
                    d.deliver();
                    return;
                }
                tracing::debug!("connect to {addr}: {e}; retrying in {backoff:?}");
                if !d.wait_away(&mut calls, &mut backoff).await {
                    d.deliver();
                    return;
                }
                continue;
            }
        };
        let (mut rd, mut wr) = match d.secure(stream).await {
            Ok(halves) => halves,
            Err(e) => {
                if !d.core.has_connected() {
                    d.core.fail(e);
                    d.deliver();
                    return;
                }
                tracing::warn!("{e}; retrying in {backoff:?}");
                if !d.wait_away(&mut calls, &mut backoff).await {
                    d.deliver();
                    return;
                }
                continue;
            }
        };
        d.core.connected(Instant::now());
        if d.transmit(&mut wr).await {
            d.handshake(&mut rd, &mut buf).await;
        }
        d.deliver();
        match d.core.state() {
            State::Closed => return,
            State::Open => backoff = Duration::from_millis(20),
            State::Away | State::Handshaking => {
                if !d.wait_away(&mut calls, &mut backoff).await {
                    d.deliver();
                    return;
                }
                continue;
            }
        }
        while d.core.state() == State::Open {
            if !d.transmit(&mut wr).await {
                break;
            }
            let deadline = tokio::time::Instant::from_std(d.core.poll_timeout());
            // (Replies are read straight into the core's frame decoder: a big read's data
            // is not copied once more. So the branches only say what woke the loop.)
            let room = d.core.read_room(crest_stream::BUFFER_BYTES);
            let woke = tokio::select! {
                _ = tokio::time::sleep_until(deadline) => Woke::Timer,
                c = calls.recv() => Woke::Call(c),
                r = read_burst(&mut rd, room) => Woke::Read(r),
            };
            match woke {
                Woke::Timer => d.core.handle_timeout(Instant::now()),
                Woke::Call(None) => {
                    d.core.goodbye();
                    d.transmit(&mut wr).await;
                    d.deliver();
                    return;
                }
                Woke::Call(Some(c)) => {
                    if !d.burst(c, &mut calls, &mut wr).await {
                        return;
                    }
                }
                Woke::Read(Ok(n)) => d.core.handle_read(Instant::now(), n),
                Woke::Read(Err(e)) => d.core.connection_lost(&e.to_string()),
            }
            d.deliver();
        }
        d.deliver();
    }
}
