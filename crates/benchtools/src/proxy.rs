//! A TCP proxy that delays every byte by a fixed time in each direction: an emulated LAN
//! round trip applied to one path only (no netem, no root, nothing else on the machine
//! affected).
//!
//! Each accepted connection gets its own upstream connection and, per direction, a reader
//! thread and a writer thread joined by a bounded FIFO. The reader timestamps each chunk with
//! the kernel's receive time (`SO_TIMESTAMPNS`; the time its `read` returned where that is
//! unavailable), so the reader's own wake-up is part of the delay, not added to it; the writer releases it when `arrival + delay` has passed, sleeping
//! for the coarse part and spinning for the last [`ProxyConfig::spin`] (a thread sleep can
//! overshoot by tens of microseconds; tokio's timer by a millisecond). Order is preserved
//! because arrivals are in order and the delay is constant; chunks already due when the
//! writer gets to them go out in one write. Both sockets use `TCP_NODELAY`.
//!
//! End of stream is forwarded after the same delay as data: a half-close (FIN) becomes a
//! `shutdown(Write)` toward the other side, while the other direction keeps flowing. A reset
//! or other read error closes both directions of the pair toward the other side (it arrives
//! there as an orderly close, not a reset); a failed write closes both sockets. Nothing a
//! peer does makes the proxy panic; a connection's failure never affects another.
//!
//! Not emulated: bandwidth limits, loss, and the round trip of the TCP handshake (the
//! client's `connect` completes at once; its first bytes are delayed like any others).

use std::io::{self, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeSpec;

use crate::stats::Histogram;

/// How the proxy delays.
#[derive(Clone, Copy, Debug)]
pub struct ProxyConfig {
    /// Added to each direction (half the emulated round trip).
    pub one_way: Duration,
    /// The last part of each wait is spent spinning instead of sleeping.
    pub spin: Duration,
    /// Largest chunk read at once.
    pub chunk_bytes: usize,
    /// Chunks queued per direction before the reader stops reading (back-pressure).
    pub queue_chunks: usize,
}

impl ProxyConfig {
    /// A proxy adding `rtt / 2` to each direction, spinning the last 50 µs of each wait.
    pub fn with_rtt(rtt: Duration) -> ProxyConfig {
        ProxyConfig { one_way: rtt / 2, spin: Duration::from_micros(50), chunk_bytes: 64 * 1024, queue_chunks: 4096 }
    }
}

/// What the proxy has done, updated as it runs.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// How late each release was past its due time (`arrival + delay`).
    pub lateness: Histogram,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections whose upstream connect failed.
    pub upstream_failures: AtomicU64,
    /// Bytes forwarded, both directions.
    pub bytes: AtomicU64,
}

/// A running proxy. Dropping it (or [`DelayProxy::stop`]) stops accepting; connections
/// already open carry on until their peers close them.
#[derive(Debug)]
pub struct DelayProxy {
    local_addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    stats: Arc<ProxyStats>,
    accept: Option<thread::JoinHandle<()>>,
}

impl DelayProxy {
    /// Listens on `listen` and forwards each connection to `upstream` (resolved now, once).
    pub fn start(listen: impl ToSocketAddrs, upstream: impl ToSocketAddrs, config: ProxyConfig) -> io::Result<Self> {
        let upstream: Vec<SocketAddr> = upstream.to_socket_addrs()?.collect();
        if upstream.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "upstream address resolves to nothing"));
        }
        let listener = TcpListener::bind(listen)?;
        let local_addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ProxyStats::default());
        let (stop, st) = (stopping.clone(), stats.clone());
        let accept = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(listener, upstream, config, stop, st))?;
        Ok(DelayProxy { local_addr, stopping, stats, accept: Some(accept) })
    }

    /// The address the proxy listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Counters and the release-lateness histogram.
    pub fn stats(&self) -> &Arc<ProxyStats> {
        &self.stats
    }

    /// Runs until the accept loop ends (it only ends on [`DelayProxy::stop`] or a listener
    /// failure).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// Stops accepting new connections.
    pub fn stop(self) {}
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: Vec<SocketAddr>,
    config: ProxyConfig,
    stopping: Arc<AtomicBool>,
    stats: Arc<ProxyStats>,
) {
    crate::tighten_timer_slack();
    let mut failures = 0u32;
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let client = match accepted {
            Ok((s, _)) => {
                failures = 0;
                s
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; give up only if it never
                // gets better.
                failures += 1;
                eprintln!("crest-delay-proxy: accept: {e}");
                if failures > 1000 {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (upstream, stats) = (upstream.clone(), stats.clone());
        let spawned = thread::Builder::new()
            .name("proxy-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || connection(client, &upstream, config, stats));
        if let Err(e) = spawned {
            eprintln!("crest-delay-proxy: cannot start a connection thread: {e}");
        }
    }
}

/// Connects upstream and runs the four pipe threads of one proxied connection.
fn connection(client: TcpStream, upstream: &[SocketAddr], config: ProxyConfig, stats: Arc<ProxyStats>) {
    let server = match TcpStream::connect(upstream) {
        Ok(s) => s,
        Err(e) => {
            stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
            eprintln!("crest-delay-proxy: connecting to {:?}: {e}", upstream);
            return; // dropping `client` closes it
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = (|| Ok::<_, io::Error>((client.try_clone()?, server.try_clone()?)))();
    let (client2, server2) = match clones {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crest-delay-proxy: {e}");
            return;
        }
    };
    let up = pipe(client, server, config, stats.clone(), "c2s");
    let down = pipe(server2, client2, config, stats, "s2c");
    for h in [up, down].into_iter().flatten() {
        let _ = h.join();
    }
}

enum Chunk {
    Data(Instant, Vec<u8>),
    Eof(Instant),
    Broken(Instant),
}

impl Chunk {
    fn arrival(&self) -> Instant {
        match self {
            Chunk::Data(t, _) | Chunk::Eof(t) | Chunk::Broken(t) => *t,
        }
    }
}

/// Starts one direction (`src` → `dst`); returns the writer thread (the reader is detached
/// and ends with the writer or at end of stream).
fn pipe(
    src: TcpStream,
    dst: TcpStream,
    config: ProxyConfig,
    stats: Arc<ProxyStats>,
    name: &str,
) -> Option<thread::JoinHandle<()>> {
    let (tx, rx) = mpsc::sync_channel(config.queue_chunks.max(1));
    let src_w = match src.try_clone() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crest-delay-proxy: {e}");
            let _ = dst.shutdown(Shutdown::Both);
            let _ = src.shutdown(Shutdown::Both);
            return None;
        }
    };
    let chunk = config.chunk_bytes.max(1);
    let reader = thread::Builder::new()
        .name(format!("proxy-{name}-r"))
        .stack_size(128 * 1024)
        .spawn(move || read_side(src, tx, chunk));
    if let Err(e) = reader {
        eprintln!("crest-delay-proxy: cannot start a reader thread: {e}");
        let _ = src_w.shutdown(Shutdown::Both);
        let _ = dst.shutdown(Shutdown::Both);
        return None;
    }
    let writer = thread::Builder::new()
        .name(format!("proxy-{name}-w"))
        .stack_size(128 * 1024)
        .spawn(move || write_side(rx, src_w, dst, config, &stats));
    match writer {
        Ok(h) => Some(h),
        Err(e) => {
            // The reader's sends fail once `rx` is gone; it then ends.
            eprintln!("crest-delay-proxy: cannot start a writer thread: {e}");
            None
        }
    }
}

fn read_side(mut src: TcpStream, tx: SyncSender<Chunk>, chunk: usize) {
    // The kernel's receive timestamp, when the socket gives one, is when the bytes reached
    // the proxy, before this thread was woken: the delay then does not include the wake-up.
    let stamped = setsockopt(&src, sockopt::ReceiveTimestampns, &true).is_ok();
    let mut cmsg = nix::cmsg_space!(TimeSpec);
    let mut buf = vec![0u8; chunk];
    loop {
        let read =
            if stamped { recv_stamped(&src, &mut buf, &mut cmsg) } else { src.read(&mut buf).map(|n| (n, None)) };
        let chunk = match read {
            Ok((0, _)) => Chunk::Eof(Instant::now()),
            Ok((n, at)) => Chunk::Data(at.unwrap_or_else(Instant::now), buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => Chunk::Broken(Instant::now()),
        };
        let last = !matches!(chunk, Chunk::Data(..));
        if tx.send(chunk).is_err() || last {
            return; // the writer is gone, or the stream ended
        }
    }
}

/// Reads like `read`, and also returns when the (last) bytes read arrived, from the
/// socket's `SCM_TIMESTAMPNS` (wall clock, converted to the monotonic clock by its age).
fn recv_stamped(src: &TcpStream, buf: &mut [u8], cmsg: &mut [u8]) -> io::Result<(usize, Option<Instant>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(src.as_raw_fd(), &mut iov, Some(cmsg), MsgFlags::empty()).map_err(io::Error::from)?;
    // The wall clock is read first: a pause between the two reads then makes the arrival
    // look later (a longer delay), never earlier than it was.
    let wall = SystemTime::now();
    let now = Instant::now();
    let mut at = None;
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmTimestampns(ts) = c {
                let (Ok(secs), Ok(nanos)) = (u64::try_from(ts.tv_sec()), u32::try_from(ts.tv_nsec())) else { continue };
                let stamp = UNIX_EPOCH + Duration::new(secs, nanos);
                // A stamp in the future or implausibly old means the wall clock moved.
                at = wall.duration_since(stamp).ok().filter(|age| *age < MAX_STAMP_AGE).map(|age| now - age);
            }
        }
    }
    Ok((msg.bytes, at))
}

/// Older kernel timestamps are not trusted (the wall clock was probably stepped).
const MAX_STAMP_AGE: Duration = Duration::from_secs(1);

fn write_side(rx: Receiver<Chunk>, src: TcpStream, mut dst: TcpStream, config: ProxyConfig, stats: &ProxyStats) {
    crate::tighten_timer_slack();
    let mut next: Option<Chunk> = None;
    let mut batch: Vec<u8> = Vec::new();
    loop {
        let chunk = match next.take() {
            Some(c) => c,
            None => match rx.recv() {
                Ok(c) => c,
                Err(_) => return, // reader ended without telling: nothing more will come
            },
        };
        let due = chunk.arrival() + config.one_way;
        wait_until(due, config.spin);
        stats.lateness.record(Instant::now().saturating_duration_since(due));
        match chunk {
            Chunk::Data(_, bytes) => {
                batch.clear();
                batch.extend_from_slice(&bytes);
                // Everything else already due goes out in the same write.
                loop {
                    match rx.try_recv() {
                        Ok(Chunk::Data(t, more)) if t + config.one_way <= Instant::now() => {
                            batch.extend_from_slice(&more)
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                if dst.write_all(&batch).is_err() {
                    // The receiving side is gone: end both directions of this pair.
                    let _ = src.shutdown(Shutdown::Both);
                    let _ = dst.shutdown(Shutdown::Both);
                    return;
                }
                stats.bytes.fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            Chunk::Eof(_) => {
                let _ = dst.shutdown(Shutdown::Write);
                return;
            }
            Chunk::Broken(_) => {
                let _ = dst.shutdown(Shutdown::Both);
                let _ = src.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

/// Waits until `due`: sleeps while more than `spin` is left, then spins.
pub fn wait_until(due: Instant, spin: Duration) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > spin {
            thread::sleep(left - spin);
        } else {
            std::hint::spin_loop();
        }
    }
}
