//! A hostile peer speaking the raw wire protocol to a real server process: whatever it
//! sends, it hurts only itself. The server runs in a process of its own (this test binary
//! started again with `SERVE_ENV` set: `server_process`), so that its descriptors and its
//! memory can be read in /proc.
//!
//! The waits here are guards against a hang (a server that never answers or never closes
//! a connection), generous and never the measure of a result.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crest_proto::{self as p, ClientMessage, Op, Reply, ServerMessage};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

/// Set in the environment of the process that serves.
const SERVE_ENV: &str = "CREST_HOSTILE_SERVE";
/// The serving process's idle timeout, in milliseconds, if not the default.
const IDLE_ENV: &str = "CREST_HOSTILE_IDLE_MS";
/// How long a test waits for the server before calling it stuck.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Not a test of its own: the server process the other tests start. It serves a fresh
/// in-memory image on a port of its own, prints the port and stops when its stdin
/// closes, which happens when the test that started it ends, however it ends.
#[test]
fn server_process() {
    if std::env::var_os(SERVE_ENV).is_none() {
        return;
    }
    // CREST_LOG=debug shows what the server did (on stderr, with the test's output).
    if let Ok(filter) = std::env::var("CREST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let disk = MemDisk::new(256 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    let store = Store::open(Box::new(disk)).expect("open");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut options = crest_serve::Options::default();
    if let Some(ms) = std::env::var(IDLE_ENV).ok().and_then(|v| v.parse().ok()) {
        options.idle_timeout = Duration::from_millis(ms);
    }
    let insecure = crest_serve::Security::Insecure;
    let serving = rt.block_on(crest_serve::start_with(store, "127.0.0.1:0", insecure, options)).expect("serve");
    println!("PORT {}", serving.local_addr.port());
    std::io::stdout().flush().expect("stdout");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    std::process::exit(0);
}

/// The server, in a process of its own.
struct ServerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    addr: SocketAddr,
}

impl ServerProcess {
    fn start() -> ServerProcess {
        ServerProcess::start_idle(None)
    }

    /// A server whose idle timeout is `idle` (None: the default).
    fn start_idle(idle: Option<Duration>) -> ServerProcess {
        let exe = std::env::current_exe().expect("test binary");
        let mut cmd = Command::new(exe);
        if let Some(idle) = idle {
            cmd.env(IDLE_ENV, idle.as_millis().to_string());
        }
        let mut child = cmd
            .args(["--exact", "server_process", "--nocapture", "--test-threads=1"])
            .env(SERVE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let mut port = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("server output");
            // (libtest may print the test's name on the same line first.)
            if let Some((_, p)) = line.split_once("PORT ") {
                port = Some(p.trim().parse::<u16>().expect("port"));
                break;
            }
        }
        let port = port.expect("the server process said no port");
        ServerProcess { child, stdin, addr: SocketAddr::from(([127, 0, 0, 1], port)) }
    }

    /// Descriptors the server process holds open.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).expect("/proc/PID/fd").count()
    }

    /// The server process's peak resident memory, bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        let kib: u64 = line.split_whitespace().nth(1).and_then(|k| k.parse().ok()).expect("VmHWM kB");
        kib * 1024
    }

    /// Waits until the server process holds at most `fds` descriptors.
    fn wait_for_fds_at_most(&self, fds: usize) {
        let start = Instant::now();
        loop {
            let now = self.fds();
            if now <= fds {
                return;
            }
            assert!(start.elapsed() < HANG_GUARD, "the server holds {now} descriptors, {} more than before", now - fds);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A seed for a test's randomness, printed so that a failure can be replayed.
fn seed() -> u64 {
    let s = std::env::var("CREST_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("CREST_HOSTILE_SEED={s}");
    s | 1
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A raw connection.
struct Raw {
    s: TcpStream,
    dec: p::FrameDecoder,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
        Raw { s, dec: p::FrameDecoder::new() }
    }

    fn send(&mut self, m: &ClientMessage) {
        let mut frame = Vec::new();
        p::encode_frame(m, &mut frame).expect("encode");
        self.s.write_all(&frame).expect("send");
    }

    /// The next message; `Ok(None)` once the server closed the connection.
    fn next_message(&mut self) -> std::io::Result<Option<ServerMessage>> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(m) = self.dec.poll_message::<ServerMessage>().expect("a frame from the server") {
                return Ok(Some(m));
            }
            match self.s.read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.dec.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// The next message; `None` once the server closed the connection.
    fn recv(&mut self) -> Option<ServerMessage> {
        self.next_message().unwrap_or_else(|e| panic!("no word from the server within {HANG_GUARD:?}: {e}"))
    }

    fn hello_named(addr: SocketAddr, name: String) -> (Raw, Option<ServerMessage>) {
        let mut c = Raw::connect(addr);
        let hello = p::Hello {
            magic: p::HELLO_MAGIC,
            version: p::PROTOCOL_VERSION,
            client_name: name,
            resume: None,
            dataset: String::new(),
        };
        c.send(&ClientMessage::Hello(hello));
        let answer = c.recv();
        (c, answer)
    }

    /// A connection with a new session.
    fn session(addr: SocketAddr) -> Raw {
        let (c, answer) = Raw::hello_named(addr, "hostile".into());
        assert!(matches!(answer, Some(ServerMessage::Welcome(_))), "{answer:?}");
        c
    }

    /// Sends request `id` and returns its response (skipping notices).
    fn call(&mut self, id: u64, ops: Vec<Op>) -> p::Response {
        self.send(&ClientMessage::Request(p::Request { id, ops, time: None, caller: p::Caller::ROOT }));
        loop {
            match self.recv() {
                Some(ServerMessage::Response(r)) if r.id == id => return r,
                Some(ServerMessage::Response(r)) => panic!("a response to {} while waiting for {id}", r.id),
                Some(_) => continue,
                None => panic!("the server closed the connection instead of answering request {id}"),
            }
        }
    }

    /// Makes `name` in the root, `size` bytes long and all holes (requests 1 and 2).
    fn sparse_file(&mut self, name: &[u8], size: u64) -> p::Attr {
        let kind = p::FileType::Regular;
        let create =
            Op::Create { parent: 1, name: name.to_vec(), kind, mode: 0o644, rdev: 0, cred: p::Cred::default() };
        let Ok(Reply::Entry(a)) = self.call(1, vec![create]).results[0].clone() else { panic!("create") };
        let set = p::SetAttr { size_bytes: Some(size), ..Default::default() };
        assert!(self.call(2, vec![Op::SetAttr { ino: a.ino, set }]).results[0].is_ok());
        a
    }

    /// Reads the answers to `reads_of`'s `n` requests: in order, each `len` bytes of data;
    /// `after(i)` once the answer to the `i`-th is in.
    fn answers_in_order(&mut self, n: u64, len: u64, mut after: impl FnMut(u64)) {
        let mut i = 0;
        while i < n {
            match self.recv() {
                Some(ServerMessage::Response(r)) => {
                    assert_eq!(r.id, 10 + i, "answers in order");
                    assert!(matches!(&r.results[0], Ok(Reply::Data(d)) if d.len() as u64 == len), "read {i}");
                    i += 1;
                    after(i);
                }
                Some(ServerMessage::Notify(_)) => {}
                other => panic!("reply {i} of {n}: {other:?}"),
            }
        }
    }

    /// Reads until the server closes the connection.
    fn expect_closed(&mut self, what: &str) {
        loop {
            match self.next_message() {
                Ok(Some(m)) => assert!(!matches!(m, ServerMessage::Welcome(_)), "{what}: {m:?}"),
                Ok(None) => return,
                Err(e) => panic!("{what}: the server kept the connection open for {HANG_GUARD:?} ({e})"),
            }
        }
    }
}

/// `n` requests (ids 10, 11, ...), each a read of `MAX_IO_BYTES` of inode `ino`, `size`
/// bytes long, at an offset `rng` picks: as many frames in one buffer.
fn reads_of(rng: &mut u64, ino: u64, size: u64, n: u64) -> Vec<u8> {
    let max = u64::from(p::MAX_IO_BYTES);
    let mut frames = Vec::new();
    for i in 0..n {
        let offset = next(rng) % (size - max);
        let read = Op::Read { ino, offset, len: p::MAX_IO_BYTES };
        let req =
            ClientMessage::Request(p::Request { id: 10 + i, ops: vec![read], time: None, caller: p::Caller::ROOT });
        p::encode_frame(&req, &mut frames).expect("encode");
    }
    frames
}

/// A frame that breaks the protocol after the hello, chosen by `rng`, and what it is.
fn bad_frame(rng: &mut u64) -> (Vec<u8>, &'static str) {
    let mut frame = Vec::new();
    match next(rng) % 6 {
        5 => {
            // File data that does not match the checksum it travels with.
            let data: Vec<u8> = (0..1 + next(rng) % 9000).map(|_| next(rng) as u8).collect();
            let req = p::Request {
                id: next(rng),
                ops: vec![Op::Write { ino: 2, offset: 0, data: data.clone() }],
                time: None,
                caller: p::Caller::ROOT,
            };
            p::encode_frame(&ClientMessage::Request(req), &mut frame).expect("encode");
            let at = frame.windows(data.len()).position(|w| w == data).expect("data in the frame");
            frame[at + (next(rng) as usize % data.len())] ^= 1 << (next(rng) % 8);
            (frame, "file data damaged after its checksum was taken")
        }
        0 => {
            let len = p::MAX_FRAME_BYTES as u32 + 1 + (next(rng) % 1000) as u32;
            frame.extend_from_slice(&len.to_le_bytes());
            (frame, "an oversized length")
        }
        1 => {
            // Not a message: an unknown variant tag first.
            let len = 1 + next(rng) % 64;
            frame.extend_from_slice(&(len as u32).to_le_bytes());
            frame.push(0x7f);
            frame.extend((1..len).map(|_| next(rng) as u8));
            (frame, "a malformed body")
        }
        2 => {
            p::encode_frame(&ClientMessage::Goodbye, &mut frame).expect("encode");
            let extra = 1 + (next(rng) % 8) as u8;
            frame[0] += extra;
            frame.extend((0..extra).map(|_| 0));
            (frame, "trailing bytes")
        }
        3 => {
            let hello = p::Hello {
                magic: p::HELLO_MAGIC,
                version: p::PROTOCOL_VERSION,
                client_name: "again".into(),
                resume: None,
                dataset: String::new(),
            };
            p::encode_frame(&ClientMessage::Hello(hello), &mut frame).expect("encode");
            (frame, "a second hello")
        }
        _ => {
            let req =
                p::Request { id: next(rng), ops: vec![Op::GetAttr { ino: 1 }], time: None, caller: p::Caller::ROOT };
            p::encode_frame(&ClientMessage::Request(req), &mut frame).expect("encode");
            frame.extend_from_slice(&u32::MAX.to_le_bytes());
            (frame, "a good request, then an oversized length")
        }
    }
}

/// (a) Every connection that breaks the protocol after its hello is closed and its
/// descriptor freed: a peer cannot run the server out of descriptors.
#[test]
fn protocol_errors_after_the_hello_free_the_connection() {
    let mut rng = seed();
    let server = ServerProcess::start();
    // A good session first: whatever the server opens once is open.
    let mut good = Raw::session(server.addr);
    assert!(good.call(1, vec![Op::GetAttr { ino: 1 }]).results[0].is_ok());
    let before = server.fds();
    let rounds = 50 + next(&mut rng) % 50;
    for i in 0..rounds {
        let mut c = Raw::session(server.addr);
        let (frame, what) = bad_frame(&mut rng);
        c.s.write_all(&frame).expect("send");
        c.expect_closed(&format!("connection {i}: {what}"));
    }
    server.wait_for_fds_at_most(before);
    // The good session never noticed.
    assert!(good.call(2, vec![Op::GetAttr { ino: 1 }]).results[0].is_ok());
}

/// (c) The request that made the server build a 434 MB answer, then drop it unsent: a
/// hundred-odd reads of 4 MiB of a sparse file, in a request of 1-2 KiB. It is answered, in
/// one frame: the reads that do not fit are refused with E2BIG, and the server's memory
/// grows by a few frames at most.
#[test]
fn a_small_request_for_a_huge_answer_is_answered_in_one_frame() {
    let mut rng = seed();
    let server = ServerProcess::start();
    let mut c = Raw::session(server.addr);
    let a = c.sparse_file(b"sparse", 1 << 40);
    let before = server.peak_rss();
    let n = 100 + next(&mut rng) % 60;
    let reads: Vec<Op> =
        (0..n).map(|i| Op::Read { ino: a.ino, offset: i * (next(&mut rng) % (1 << 30)), len: u32::MAX }).collect();
    let req = ClientMessage::Request(p::Request { id: 3, ops: reads, time: None, caller: p::Caller::ROOT });
    eprintln!("{n} reads in a request of {} bytes", p::encoded_len(&req));
    c.send(&req);
    let r = loop {
        match c.recv() {
            Some(ServerMessage::Response(r)) => break r,
            Some(_) => continue,
            None => panic!("the server closed the connection instead of answering"),
        }
    };
    assert_eq!((r.id, r.results.len() as u64), (3, n));
    assert!(matches!(&r.results[0], Ok(Reply::Data(d)) if d.len() == p::MAX_IO_BYTES as usize), "the first read fits");
    assert!(r.results[1..].iter().all(|x| x.as_ref().is_err_and(|e| e.errno == p::errno::E2BIG)));
    let grown = server.peak_rss().saturating_sub(before);
    eprintln!("peak memory grew by {grown} bytes");
    assert!(grown <= 8 * p::MAX_FRAME_BYTES as u64, "the server's peak memory grew by {grown} bytes");
    // The session goes on.
    assert!(c.call(4, vec![Op::GetAttr { ino: a.ino }]).results[0].is_ok());
}

/// (d) A hello whose client name is longer than `MAX_CLIENT_NAME_BYTES` is refused (the
/// name would be kept with the session and logged), and the connection closed.
#[test]
fn a_hello_with_a_long_client_name_is_refused() {
    let mut rng = seed();
    let server = ServerProcess::start();
    let (_, welcome) = Raw::hello_named(server.addr, "n".repeat(p::MAX_CLIENT_NAME_BYTES));
    assert!(matches!(welcome, Some(ServerMessage::Welcome(_))), "{welcome:?}");
    for len in [
        p::MAX_CLIENT_NAME_BYTES + 1,
        p::MAX_CLIENT_NAME_BYTES + 1 + (next(&mut rng) % 100_000) as usize,
        p::MAX_FRAME_BYTES - 64,
    ] {
        let (mut c, answer) = Raw::hello_named(server.addr, "n".repeat(len));
        let Some(ServerMessage::Refused { reason, .. }) = answer else { panic!("{len} bytes: {answer:?}") };
        assert!(reason.len() < 200 && reason.contains(&len.to_string()), "{reason}");
        c.expect_closed("after the refusal");
    }
}

#[test]
fn connections_that_never_say_hello_are_bounded_per_address_and_others_go_on() {
    let server = ServerProcess::start();
    let honest = Raw::session(server.addr);
    let before = server.fds();
    let max = crest_serve::limits::MAX_UNAUTHENTICATED_PER_ADDRESS;
    // A flood of connections that say nothing: the server keeps `max` of them.
    let mut idle: Vec<Raw> = (0..max + 16).map(|_| Raw::connect(server.addr)).collect();
    server.wait_for_fds_at_most(before + max);
    // Those beyond the limit (the last accepted) are closed at once.
    for c in &mut idle[max..] {
        let mut b = [0u8; 1];
        match c.s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a connection beyond the limit was kept: {other:?}"),
        }
    }
    // The session that said hello before the flood goes on.
    let mut honest = honest;
    assert!(honest.call(1, vec![Op::GetAttr { ino: 1 }]).results[0].is_ok());
    // Once the idle ones go, the address has room again.
    drop(idle);
    server.wait_for_fds_at_most(before);
    let _again = Raw::session(server.addr);
}

/// (e) A peer that asks for large replies and reads none of them makes the server hold a
/// bounded backlog of them, not one per request: its requests wait unread meanwhile, and
/// another session is answered. Once it reads, every request is answered, in order.
#[test]
fn a_peer_that_reads_no_replies_makes_the_server_hold_only_a_bounded_backlog() {
    let mut rng = seed();
    let server = ServerProcess::start();
    let mut c = Raw::session(server.addr);
    let size = 1u64 << 34;
    let a = c.sparse_file(b"big", size);
    let before = server.peak_rss();
    // Reads of a sparse file: each asks for MAX_IO_BYTES, in a frame of a few bytes.
    let n = 150 + next(&mut rng) % 100;
    let max = u64::from(p::MAX_IO_BYTES);
    let frames = reads_of(&mut rng, a.ino, size, n);
    eprintln!("{n} reads of {} MiB each in {} bytes of requests", max >> 20, frames.len());
    c.s.write_all(&frames).expect("send the reads");
    // Another session is answered while they wait (with nothing the reader holds rights
    // on: a recall to it would wait a lease).
    let mut other = Raw::session(server.addr);
    assert!(other.call(1, vec![Op::StatFs]).results[0].is_ok());
    let grown = server.peak_rss().saturating_sub(before);
    eprintln!("peak memory grew by {} MiB while the replies went unread", grown >> 20);
    let bound = 96u64 << 20;
    assert!(grown <= bound, "the server's peak memory grew by {} MiB for replies nobody reads", grown >> 20);
    // Now it reads: every request was kept, and is answered in order.
    c.answers_in_order(n, max, |_| {});
    let grown = server.peak_rss().saturating_sub(before);
    assert!(grown <= bound, "the server's peak memory grew by {} MiB", grown >> 20);
}

/// (f) A session's connection that falls silent (no request, no heartbeat) is closed
/// after the idle timeout and its descriptor freed; one that keeps talking stays.
#[test]
fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_talking_one_is_not() {
    let idle = Duration::from_millis(1500);
    let server = ServerProcess::start_idle(Some(idle));
    let mut talker = Raw::session(server.addr);
    let mut silent = Raw::session(server.addr);
    let fds = server.fds();
    let start = Instant::now();
    let mut id = 1;
    while start.elapsed() < idle * 3 {
        assert!(talker.call(id, vec![Op::StatFs]).results[0].is_ok(), "the talking session is served");
        id += 1;
        std::thread::sleep(idle / 10);
    }
    silent.expect_closed("a connection silent past the idle timeout");
    server.wait_for_fds_at_most(fds - 1);
    assert!(talker.call(id, vec![Op::StatFs]).results[0].is_ok(), "the talking one is still open");
}

/// Inode numbers granted to a hostile peer's sessions: the lowest, the end of the highest,
/// and how many in all.
struct Granted {
    low: u64,
    high: u64,
    total: u64,
}

impl Granted {
    /// Asks for numbers until refused (EDQUOT), noting what `c`'s session was granted.
    fn grab(&mut self, c: &mut Raw) {
        for id in 1..=4 {
            let r = c.call(id, vec![Op::AllocInodes { count: u32::MAX }]);
            match &r.results[0] {
                Ok(Reply::Inodes { first, count }) => {
                    let count = u64::from(*count);
                    (self.low, self.high, self.total) =
                        (self.low.min(*first), self.high.max(first + count), self.total + count);
                }
                Err(e) => {
                    assert_eq!(e.errno, p::errno::EDQUOT, "refused as over its quota: {e:?}");
                    return;
                }
                other => panic!("{other:?}"),
            }
        }
        panic!("a session was granted more than {} numbers", crest_server::MAX_UNUSED_GRANTED);
    }

    fn span(&self) -> u64 {
        self.high - self.low
    }
}

/// (g) A peer that asks for inode numbers in a loop, in session after session, cannot use
/// up a dataset's: each session holds at most `MAX_UNUSED_GRANTED` unused, and what a
/// session did not use (it said goodbye, or its connection went and it was fenced) is
/// granted again before the dataset's counter moves. So the numbers ever granted span at
/// most what the sessions one identity may hold at once can hold, however many were
/// granted, and the dataset still creates files.
#[test]
fn a_peer_asking_for_inode_numbers_in_a_loop_of_sessions_cannot_use_them_up() {
    let server = ServerProcess::start();
    let bound = crest_server::MAX_UNUSED_GRANTED;
    let most = crest_server::MAX_SESSIONS_PER_IDENTITY as u64;
    let mut g = Granted { low: u64::MAX, high: 0, total: 0 };
    // Sessions that say goodbye: each is granted what the one before left.
    for _ in 0..20 {
        let mut c = Raw::session(server.addr);
        g.grab(&mut c);
        c.send(&ClientMessage::Goodbye);
        c.expect_closed("after a goodbye");
    }
    assert_eq!((g.total, g.span()), (20 * bound, bound), "one session's worth of numbers, granted over and over");
    // Sessions that just go (fenced a few seconds later), as fast as the server lets one
    // identity start them, until several times what they can hold at once was granted.
    let start = Instant::now();
    let (mut sessions, mut refused) = (0u64, 0u64);
    while g.total < 3 * most * bound {
        assert!(start.elapsed() < HANG_GUARD, "{} numbers granted in {sessions} sessions so far", g.total);
        match Raw::hello_named(server.addr, "hoarder".into()) {
            (mut c, Some(ServerMessage::Welcome(_))) => {
                g.grab(&mut c);
                sessions += 1;
            }
            (_, Some(ServerMessage::Refused { .. })) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (_, other) => panic!("{other:?}"),
        }
        assert!(g.span() <= most * bound, "the numbers granted span {} (at most {most} × {bound})", g.span());
    }
    eprintln!("{} numbers granted in {sessions} sessions ({refused} refused) over a span of {}", g.total, g.span());
    assert!(refused > 0, "the identity's session bound was reached");
    // The dataset still creates files: through the server, and at a granted number.
    let mut c = loop {
        match Raw::hello_named(server.addr, "honest".into()) {
            (c, Some(ServerMessage::Welcome(_))) => break c,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let kind = p::FileType::Regular;
    let create =
        Op::Create { parent: 1, name: b"after".to_vec(), kind, mode: 0o644, rdev: 0, cred: p::Cred::default() };
    assert!(c.call(1, vec![create]).results[0].is_ok());
    let Ok(Reply::Inodes { first, .. }) = c.call(2, vec![Op::AllocInodes { count: 4096 }]).results[0] else {
        panic!("no grant")
    };
    assert!((g.low..g.high).contains(&first), "{first}: from the numbers granted before");
    let (ino, name) = (first, b"granted".to_vec());
    let create_at =
        Op::CreateAt { ino, generation: 1, parent: 1, name, kind, mode: 0o644, rdev: 0, cred: p::Cred::default() };
    let r = c.call(3, vec![create_at]);
    assert!(matches!(&r.results[0], Ok(Reply::Entry(a)) if a.ino == first), "{r:?}");
}

/// (g) Reads parked behind another session's exclusive rights count against their
/// connection's bound of replies while they wait: released together when the holder
/// answers its recall, they make the server hold about that bound, not one reply each.
#[test]
fn parked_reads_released_together_make_the_server_hold_only_a_bounded_backlog() {
    let mut rng = seed();
    let server = ServerProcess::start();
    // The holder created the file: it holds it exclusively until it answers a recall.
    let mut holder = Raw::session(server.addr);
    let size = 1u64 << 34;
    let a = holder.sparse_file(b"held", size);
    let before = server.peak_rss();
    let mut reader = Raw::session(server.addr);
    let n = 100 + next(&mut rng) % 100;
    let max = u64::from(p::MAX_IO_BYTES);
    let frames = reads_of(&mut rng, a.ino, size, n);
    reader.s.write_all(&frames).expect("send the reads");
    let recall_id = loop {
        match holder.recv() {
            Some(ServerMessage::Notify(p::Notify::Recall { recall_id, .. })) => break recall_id,
            Some(_) => continue,
            None => panic!("the server closed the holder's connection"),
        }
    };
    // The reads wait in the server for a while, then are all released at once.
    let wait = Duration::from_millis(100 + next(&mut rng) % 700);
    eprintln!("{n} reads of {} MiB parked; the recall answered after {wait:?}", max >> 20);
    std::thread::sleep(wait);
    holder.send(&ClientMessage::RecallDone { recall_id });
    // A slow reader: what the server holds meanwhile is what is measured.
    reader.answers_in_order(n, max, |i| {
        if i % 16 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let grown = server.peak_rss().saturating_sub(before);
    eprintln!("peak memory grew by {} MiB", grown >> 20);
    let bound = 96u64 << 20;
    assert!(grown <= bound, "the server's peak memory grew by {} MiB for {n} parked reads", grown >> 20);
}
