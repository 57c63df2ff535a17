//! The delay proxy against real sockets on loopback: bytes arrive unchanged and in order in
//! both directions over many concurrent connections, half-closes and resets are passed on
//! without a panic, and the delay added is never less than the one requested. Timing
//! assertions are lower bounds only (the machine may be busy; upper bounds would flake).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Once};
use std::thread;
use std::time::{Duration, Instant};

use crest_benchtools::pingpong::{spawn_echo_server, PingPong};
use crest_benchtools::proxy::{DelayProxy, ProxyConfig};

const RTT: Duration = Duration::from_micros(200);

static PANICKED: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Notes any panic on any thread (a proxy thread's panic would otherwise go unnoticed).
fn watch_panics() {
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if thread::current().name().is_some_and(|n| n.starts_with("proxy")) {
                PANICKED.store(true, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

fn assert_no_proxy_panic() {
    assert!(!PANICKED.load(Ordering::SeqCst), "a proxy thread panicked");
}

fn proxy_to(upstream: SocketAddr) -> DelayProxy {
    watch_panics();
    DelayProxy::start("127.0.0.1:0", upstream, ProxyConfig::with_rtt(RTT)).expect("proxy")
}

/// Deterministic bytes that differ per stream and per offset.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    s
}

#[test]
fn many_connections_echo_unchanged() {
    let echo = spawn_echo_server("127.0.0.1:0").expect("echo");
    let proxy = proxy_to(echo);
    let addr = proxy.local_addr();
    let workers: Vec<_> = (0..24u64)
        .map(|i| {
            thread::spawn(move || {
                let data = pattern(i, 64 * 1024 + 977 * i as usize);
                let mut s = connect(addr);
                let mut reader = s.try_clone().expect("clone");
                let expect = data.clone();
                // Read concurrently with writing so neither side's buffers fill up.
                let rd = thread::spawn(move || {
                    let mut back = vec![0u8; expect.len()];
                    reader.read_exact(&mut back).expect("echo back");
                    assert!(back == expect, "connection {i}: bytes changed or reordered");
                });
                // Odd-sized writes, so chunks split and coalesce at arbitrary points.
                for piece in data.chunks(1 + (i as usize * 131) % 5000) {
                    s.write_all(piece).expect("write");
                }
                rd.join().expect("reader");
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let stats = proxy.stats();
    assert_eq!(stats.connections.load(Ordering::Relaxed), 24);
    assert_no_proxy_panic();
}

#[test]
fn half_close_both_ways() {
    // The server reads until the client's FIN, then answers with a different stream and
    // closes: the FIN must cross the proxy one way, then the answer and a FIN the other way.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server_addr = listener.local_addr().expect("addr");
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read to FIN");
        assert_eq!(got, pattern(1, 300_000), "upstream received different bytes");
        s.write_all(&pattern(2, 200_000)).expect("answer");
        s.shutdown(Shutdown::Write).expect("shutdown");
        // Stay open for reading: the proxy must not need both sides closed to forward the FIN.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    let proxy = proxy_to(server_addr);
    let mut c = connect(proxy.local_addr());
    c.write_all(&pattern(1, 300_000)).expect("send");
    c.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).expect("read answer to FIN");
    assert!(answer == pattern(2, 200_000), "client received different bytes");
    drop(c);
    server.join().expect("server");
    assert_no_proxy_panic();
}

#[test]
fn resets_end_the_pair_and_the_proxy_goes_on() {
    // An upstream that closes with unread data pending sends a reset.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let (arrived_tx, arrived_rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let tx = arrived_tx.clone();
            thread::spawn(move || {
                let mut one = [0u8; 1];
                if s.read_exact(&mut one).is_ok() {
                    thread::sleep(Duration::from_millis(50)); // let the rest arrive, unread
                    let _ = tx.send(());
                    drop(s); // unread data: the kernel answers with RST
                }
            });
        }
    });
    let proxy = proxy_to(upstream);
    let addr = proxy.local_addr();

    // 1. Upstream resets: the client sees its connection end (EOF or error), no hang.
    let mut c = connect(addr);
    c.write_all(&pattern(3, 100_000)).expect("send");
    arrived_rx.recv_timeout(Duration::from_secs(20)).expect("upstream got data");
    let mut sink = Vec::new();
    let end = c.read_to_end(&mut sink);
    assert!(sink.is_empty(), "nothing was sent back");
    if let Err(e) = end {
        assert_ne!(e.kind(), io::ErrorKind::WouldBlock, "client hung instead of seeing the reset");
    }

    // 2. Client resets while the upstream is sending it data (an echo of what it sent).
    let echo = spawn_echo_server("127.0.0.1:0").expect("echo");
    let proxy2 = proxy_to(echo);
    {
        let mut c = connect(proxy2.local_addr());
        c.write_all(&pattern(4, 200_000)).expect("send");
        thread::sleep(Duration::from_millis(50));
        // Dropped with the echo unread: RST toward the proxy.
    }
    thread::sleep(Duration::from_millis(100));

    // Both proxies still serve new connections.
    let mut pp = PingPong::connect(proxy2.local_addr()).expect("connect after reset");
    pp.run(64, 0, 10).expect("ping-pong after reset");
    let mut c = connect(proxy.local_addr());
    c.write_all(b"x").expect("send after reset");
    arrived_rx.recv_timeout(Duration::from_secs(20)).expect("upstream reached after reset");
    assert_no_proxy_panic();
}

#[test]
fn upstream_down_closes_the_client() {
    // Nothing listens upstream: the client's connection is closed, the proxy goes on.
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let proxy = proxy_to(port); // the listener above is already dropped
    let mut c = connect(proxy.local_addr());
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(buf.is_empty());
    let t = Instant::now();
    while proxy.stats().upstream_failures.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(proxy.stats().upstream_failures.load(Ordering::Relaxed), 1);
    assert_no_proxy_panic();
}

#[test]
fn delay_is_at_least_the_requested_one() {
    // Round trips: every one takes at least the requested round trip.
    let echo = spawn_echo_server("127.0.0.1:0").expect("echo");
    let proxy = proxy_to(echo);
    let mut pp = PingPong::connect(proxy.local_addr()).expect("connect");
    for size in [4, 64, 1024, 100_000] {
        let samples = pp.run(size, 5, 200).expect("ping-pong");
        let min = samples.iter().min().copied().expect("samples");
        assert!(min >= RTT, "{size}-byte round trip took {min:?} < {RTT:?}");
    }

    // One way, each direction separately, timed in this process.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let proxy = proxy_to(upstream);
    let mut c = connect(proxy.local_addr());
    c.set_nodelay(true).expect("nodelay");
    let (mut s, _) = listener.accept().expect("accept");
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut byte = [0u8; 1];
    for _ in 0..100 {
        let t = Instant::now();
        c.write_all(b"a").expect("send");
        s.read_exact(&mut byte).expect("upstream read");
        let up = t.elapsed();
        assert!(up >= RTT / 2, "client→server took {up:?}");
        let t = Instant::now();
        s.write_all(b"b").expect("answer");
        c.read_exact(&mut byte).expect("client read");
        let down = t.elapsed();
        assert!(down >= RTT / 2, "server→client took {down:?}");
    }
    assert_no_proxy_panic();
}
