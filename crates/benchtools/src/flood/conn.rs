//! One raw protocol connection (plain TCP, a server run `--insecure`), as a hostile peer
//! holds it: frames of `crest_proto` messages written and read by hand, no client core.
//!
//! Two threads serve each connection so that the flood's own thread never stalls the
//! protocol: a writer that sends what the flood queues and a heartbeat (an empty request,
//! id 0) after a second with nothing else, as a real client does (so a session is fenced
//! for what the flood means it to be, never for silence); and a reader that decodes what
//! the server sends, answers recalls or not (`Recalls`), and hands responses and notices
//! on as `Event`s (file data dropped: only its length is kept).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use crest_proto::{self as p, ClientMessage, Notify, Op, Reply, ServerMessage};

/// How long the handshake may take.
const HELLO_WAIT: Duration = Duration::from_secs(30);
/// Request id of heartbeats, as the real client sends them (never answered to the flood).
const HEARTBEAT_ID: u64 = 0;

/// What the connection does with the recalls the server sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recalls {
    /// Answers each at once (its reader thread): an honest-looking holder.
    Answer,
    /// Hands each to the flood as `Event::Recall`, which answers when it likes.
    Forward,
    /// Never answers; each is still handed on as `Event::Recall` (to be counted).
    Hoard,
}

/// What the server said.
#[derive(Debug)]
pub enum Event {
    /// The answer to a request; `data_bytes`: the file data its replies carried (dropped).
    Response {
        /// The response, with every `Reply::Data` emptied.
        response: p::Response,
        /// Bytes of data it carried.
        data_bytes: u64,
    },
    /// A recall (not answered unless the flood answers it; see `Recalls`).
    Recall {
        /// The recall's id, for `RecallDone`.
        recall_id: u64,
    },
    /// The session was fenced.
    Fenced,
    /// The connection ended (the reason).
    Closed(String),
}

/// Recalls a connection answered and hoarded, counted by its reader thread.
#[derive(Debug, Default)]
pub struct RecallCounts {
    /// Answered at once (`Recalls::Answer`).
    pub answered: AtomicU64,
    /// Left unanswered (`Recalls::Hoard`).
    pub hoarded: AtomicU64,
}

/// A session on a connection of its own.
pub struct Conn {
    stream: TcpStream,
    out: Sender<Vec<u8>>,
    events: Receiver<Event>,
    next_id: u64,
    policy: Recalls,
    /// What the reader thread did with recalls.
    pub recalls: Arc<RecallCounts>,
}

/// Encodes `m` as one frame at the end of `buf`.
pub fn encode(m: &ClientMessage, buf: &mut Vec<u8>) -> Result<()> {
    p::encode_frame(m, buf).map_err(|e| anyhow!("encoding a message: {e}"))
}

/// A request frame of `ops` with id `id`, as root.
fn request(id: u64, ops: Vec<Op>, buf: &mut Vec<u8>) -> Result<()> {
    encode(&ClientMessage::Request(p::Request { id, ops, time: None, caller: p::Caller::ROOT }), buf)
}

impl Conn {
    /// Connects to `addr`, says hello as `name` (a new session of the default dataset) and
    /// starts the connection's threads.
    pub fn connect(addr: &str, name: &str, recalls: Recalls) -> Result<Conn> {
        let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let hello = p::Hello {
            magic: p::HELLO_MAGIC,
            version: p::PROTOCOL_VERSION,
            client_name: name.to_string(),
            resume: None,
            dataset: String::new(),
        };
        let mut frame = Vec::new();
        encode(&ClientMessage::Hello(hello), &mut frame)?;
        stream.write_all(&frame).context("sending the hello")?;
        stream.set_read_timeout(Some(HELLO_WAIT))?;
        let mut dec = p::FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match dec.poll_message::<ServerMessage>().map_err(|e| anyhow!("a bad frame from the server: {e}"))? {
                Some(ServerMessage::Welcome(_)) => break,
                Some(ServerMessage::Refused { reason, .. }) => bail!("session refused: {reason}"),
                Some(other) => bail!("the server answered the hello with {other:?}"),
                None => {}
            }
            let n = stream.read(&mut buf).context("waiting for the welcome")?;
            if n == 0 {
                bail!("the server closed the connection instead of a welcome");
            }
            dec.handle_bytes(&buf[..n]);
        }
        stream.set_read_timeout(None)?;
        let counts = Arc::new(RecallCounts::default());
        let (out, out_rx) = mpsc::channel();
        let (ev_tx, events) = mpsc::channel();
        let writer = stream.try_clone()?;
        std::thread::Builder::new().name("flood-writer".into()).spawn(move || write_loop(writer, out_rx))?;
        let reader = stream.try_clone()?;
        let (answers, c) = (out.clone(), counts.clone());
        std::thread::Builder::new()
            .name("flood-reader".into())
            .spawn(move || read_loop(reader, dec, recalls, answers, ev_tx, c))?;
        Ok(Conn { stream, out, events, next_id: 1, policy: recalls, recalls: counts })
    }

    /// Queues a request of `ops`; returns its id.
    pub fn send(&mut self, ops: Vec<Op>) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut buf = Vec::new();
        request(id, ops, &mut buf)?;
        self.send_bytes(buf)?;
        Ok(id)
    }

    /// Queues requests of each of `batches`, in one write; returns the first id (the
    /// others follow in order).
    pub fn send_many(&mut self, batches: Vec<Vec<Op>>) -> Result<u64> {
        let first = self.next_id;
        let mut buf = Vec::new();
        for ops in batches {
            request(self.next_id, ops, &mut buf)?;
            self.next_id += 1;
        }
        self.send_bytes(buf)?;
        Ok(first)
    }

    fn send_bytes(&self, bytes: Vec<u8>) -> Result<()> {
        self.out.send(bytes).map_err(|_| anyhow!("the connection's writer has stopped (connection lost)"))
    }

    /// Answers recall `recall_id`.
    pub fn recall_done(&self, recall_id: u64) -> Result<()> {
        let mut buf = Vec::new();
        encode(&ClientMessage::RecallDone { recall_id }, &mut buf)?;
        self.send_bytes(buf)
    }

    /// The next event, or `None` if none comes within `wait`.
    pub fn next_event(&self, wait: Duration) -> Result<Option<Event>> {
        match self.events.recv_timeout(wait) {
            Ok(e) => Ok(Some(e)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => bail!("the connection's reader has stopped"),
        }
    }

    /// Waits for the response to request `id` (other responses are dropped, recalls
    /// answered unless hoarded); `None` once `give_up` says so first. A fence or a lost
    /// connection is an error.
    pub fn wait_for(&mut self, id: u64, give_up: impl Fn() -> bool) -> Result<Option<p::Response>> {
        loop {
            match self.next_event(Duration::from_millis(100))? {
                Some(Event::Response { response, .. }) if response.id == id => return Ok(Some(response)),
                Some(Event::Recall { recall_id }) if self.policy == Recalls::Forward => self.recall_done(recall_id)?,
                Some(Event::Fenced) => bail!("the session was fenced"),
                Some(Event::Closed(why)) => bail!("connection lost: {why}"),
                Some(_) => {}
                None if give_up() => return Ok(None),
                None => {}
            }
        }
    }

    /// `wait_for(send(ops))`, giving up after `guard`: the replies, or the first error.
    pub fn call(&mut self, ops: Vec<Op>, guard: Duration) -> Result<Vec<Reply>> {
        let id = self.send(ops)?;
        let start = Instant::now();
        let r = self.wait_for(id, || start.elapsed() > guard)?;
        let r = r.ok_or_else(|| anyhow!("no answer within {guard:?}"))?;
        replies(r)
    }

    /// Ends the session cleanly: its rights and files go back at once.
    pub fn goodbye(self) {
        let mut buf = Vec::new();
        if encode(&ClientMessage::Goodbye, &mut buf).is_ok() && self.send_bytes(buf).is_ok() {
            // The writer sends what was queued before it sees the channel close; the
            // server closes the connection after a goodbye.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                match self.events.recv_timeout(Duration::from_millis(50)) {
                    Ok(Event::Closed(_)) | Err(RecvTimeoutError::Disconnected) => break,
                    _ => {}
                }
            }
        }
        self.cut();
    }

    /// Drops the connection without a goodbye (the server sees it go and, 3 s later,
    /// fences the session).
    pub fn cut(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The replies of `r`, or its first failure as an error.
pub fn replies(r: p::Response) -> Result<Vec<Reply>> {
    r.results.into_iter().map(|x| x.map_err(|e| anyhow!("errno {}: {}", e.errno, e.message))).collect()
}

/// The attributes a create, lookup or acquire answered with.
pub fn attr_of(reply: &Reply) -> Result<&p::Attr> {
    match reply {
        Reply::Entry(a) | Reply::Attr(a) | Reply::Lookup { attr: Some(a), .. } => Ok(a),
        Reply::Lookup { attr: None, .. } => bail!("no such name"),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn write_loop(mut s: TcpStream, queue: Receiver<Vec<u8>>) {
    let mut heartbeat = Vec::new();
    if request(HEARTBEAT_ID, Vec::new(), &mut heartbeat).is_err() {
        return;
    }
    loop {
        let bytes = match queue.recv_timeout(Duration::from_millis(p::timing::HEARTBEAT_MS)) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => heartbeat.clone(),
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if s.write_all(&bytes).is_err() {
            return;
        }
    }
}

fn read_loop(
    mut s: TcpStream,
    mut dec: p::FrameDecoder,
    recalls: Recalls,
    answers: Sender<Vec<u8>>,
    events: Sender<Event>,
    counts: Arc<RecallCounts>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        loop {
            let event = match dec.poll_message::<ServerMessage>() {
                Ok(Some(m)) => match on_message(m, recalls, &answers, &counts) {
                    Some(e) => e,
                    None => continue,
                },
                Ok(None) => break,
                Err(e) => Event::Closed(format!("a bad frame from the server: {e}")),
            };
            let closed = matches!(event, Event::Closed(_));
            if events.send(event).is_err() || closed {
                return;
            }
        }
        let why = match s.read(&mut buf) {
            Ok(0) => "closed by the server".to_string(),
            Ok(n) => {
                dec.handle_bytes(&buf[..n]);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => e.to_string(),
        };
        let _ = events.send(Event::Closed(why));
        return;
    }
}

/// What a message from the server is for the flood (`None`: nothing).
fn on_message(m: ServerMessage, recalls: Recalls, answers: &Sender<Vec<u8>>, counts: &RecallCounts) -> Option<Event> {
    match m {
        ServerMessage::Response(r) if r.id == HEARTBEAT_ID => None,
        ServerMessage::Response(mut response) => {
            let mut data_bytes = 0;
            for res in &mut response.results {
                if let Ok(Reply::Data(d)) = res {
                    data_bytes += d.len() as u64;
                    *d = Vec::new();
                }
            }
            Some(Event::Response { response, data_bytes })
        }
        ServerMessage::Notify(Notify::Recall { recall_id, .. }) => match recalls {
            Recalls::Answer => {
                let mut buf = Vec::new();
                if encode(&ClientMessage::RecallDone { recall_id }, &mut buf).is_ok() && answers.send(buf).is_ok() {
                    counts.answered.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
            Recalls::Forward => Some(Event::Recall { recall_id }),
            Recalls::Hoard => {
                counts.hoarded.fetch_add(1, Ordering::Relaxed);
                Some(Event::Recall { recall_id })
            }
        },
        ServerMessage::Notify(Notify::Fenced) => Some(Event::Fenced),
        ServerMessage::Notify(Notify::ShuttingDown) => Some(Event::Closed("the server is shutting down".into())),
        _ => None,
    }
}
