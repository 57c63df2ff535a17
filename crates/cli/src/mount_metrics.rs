//! A mount daemon's Prometheus endpoint (`-o metrics=ADDR`): `GET /metrics` answers the
//! mount's own view (`crest status --mount --prometheus`: connection, queue, cache, look-up
//! hit counts), read from the `crest.status` attribute of its root as any process would.
//! Plain HTTP on a thread of its own, one scrape at a time: a request must come within
//! `REQUEST_WAIT` and fit `MAX_REQUEST_BYTES`, and nothing but `GET /metrics` is answered.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// The most bytes of a request's line and headers.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a scraper has to send its request (and to read the answer).
const REQUEST_WAIT: Duration = Duration::from_secs(5);

/// Serves scrapes on `listener` for the mount on `root` until the process ends.
pub fn spawn(listener: TcpListener, root: PathBuf) {
    let spawned = std::thread::Builder::new().name("crest-metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else {
                // (Out of descriptors, say: try again shortly rather than spin.)
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            if let Err(e) = scrape(stream, &root) {
                tracing::debug!("metrics: {e}");
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("no metrics endpoint: {e}");
    }
}

fn scrape(mut stream: TcpStream, root: &std::path::Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_WAIT))?;
    stream.set_write_timeout(Some(REQUEST_WAIT))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > MAX_REQUEST_BYTES {
            return respond(&mut stream, "431 Request Header Fields Too Large", "request too long\n");
        }
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    match (words.next(), words.next()) {
        (Some(b"GET"), Some(b"/metrics")) => match crate::status::mount_metrics_text(root) {
            Ok(text) => respond(&mut stream, "200 OK", &text),
            Err(e) => respond(&mut stream, "503 Service Unavailable", &format!("{e:#}\n")),
        },
        (Some(b"GET"), _) => respond(&mut stream, "404 Not Found", "only /metrics\n"),
        _ => respond(&mut stream, "405 Method Not Allowed", "only GET\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
