//! A raw TCP ping-pong: the floor a request round trip is compared against. The server
//! echoes whatever it reads; the client sends `size` bytes and waits for the same `size`
//! bytes back, one message at a time, on one connection with `TCP_NODELAY`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

/// Serves echo connections on `listener` until it fails (one thread per connection).
pub fn serve_echo(listener: TcpListener) -> io::Result<()> {
    loop {
        let (stream, _) = match listener.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::ConnectionAborted => {
                continue
            }
            Err(e) => return Err(e),
        };
        thread::Builder::new().name("echo".into()).stack_size(128 * 1024).spawn(move || {
            let _ = echo(stream);
        })?;
    }
}

/// Binds `addr` and serves echo connections from a background thread; returns the bound
/// address.
pub fn spawn_echo_server(addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    thread::Builder::new().name("echo-accept".into()).spawn(move || {
        if let Err(e) = serve_echo(listener) {
            eprintln!("echo server: {e}");
        }
    })?;
    Ok(local)
}

fn echo(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        stream.write_all(&buf[..n])?;
    }
}

/// One connection's worth of ping-pong.
#[derive(Debug)]
pub struct PingPong {
    stream: TcpStream,
}

impl PingPong {
    /// Connects (with `TCP_NODELAY`).
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<PingPong> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(PingPong { stream })
    }

    /// `count` round trips of `size`-byte messages after `warmup` unmeasured ones; returns
    /// each measured round trip. Fails if the echo comes back different.
    pub fn run(&mut self, size: usize, warmup: usize, count: usize) -> io::Result<Vec<Duration>> {
        let out: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
        let mut back = vec![0u8; size];
        let mut samples = Vec::with_capacity(count);
        for i in 0..warmup + count {
            let t = Instant::now();
            self.stream.write_all(&out)?;
            self.stream.read_exact(&mut back)?;
            let rtt = t.elapsed();
            if back != out {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "echo differs from what was sent"));
            }
            if i >= warmup {
                samples.push(rtt);
            }
        }
        Ok(samples)
    }
}
