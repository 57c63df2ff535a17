//! The Prometheus endpoint of a real server: a scrape names the sessions and the
//! operations served; anything but `GET /metrics` is refused; a request too long or too
//! slow, and scrapers past the limit, are closed without holding up the others or the
//! clients.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crest_net::{Client, ClientOptions};
use crest_proto::Op;
use crest_serve::metrics::{MAX_REQUEST_BYTES, MAX_SCRAPES};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

fn store() -> Store {
    let disk = MemDisk::new(64 << 20);
    let opts = MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 };
    Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
    Store::open(Box::new(disk)).expect("open")
}

/// Sends `request` and reads the whole answer (the server closes after it).
fn ask(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    s.write_all(request).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_scrape_shows_sessions_and_operations_and_only_a_scrape_is_answered() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let options = crest_serve::Options { metrics: Some("127.0.0.1:0".parse().expect("addr")), ..Default::default() };
    let serving = rt
        .block_on(crest_serve::start_with(store(), "127.0.0.1:0", crest_serve::Security::Insecure, options))
        .expect("serve");
    let metrics = serving.metrics_addr.expect("a metrics address");
    let client = Client::connect(&serving.local_addr.to_string(), ClientOptions::default()).expect("connect");
    for _ in 0..3 {
        client.call_one(Op::GetAttr { ino: 1 }).expect("getattr");
    }

    let page = ask(metrics, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.contains("\r\nContent-Type: text/plain; version=0.0.4"), "{page}");
    assert!(page.lines().any(|l| l == "crest_sessions{state=\"connected\"} 1"), "{page}");
    let getattrs = page
        .lines()
        .find_map(|l| l.strip_prefix("crest_operations_total{kind=\"get_attr\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(getattrs.is_some_and(|n| n >= 3), "{page}");
    // The server thread's time on each: a histogram whose last bucket holds them all.
    let sample = |prefix: &str| page.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|n| n.parse::<f64>().ok());
    let timed = sample("crest_request_service_seconds_count{kind=\"get_attr\"} ");
    assert!(timed.is_some_and(|n| n >= 3.0), "{page}");
    assert_eq!(sample("crest_request_service_seconds_bucket{kind=\"get_attr\",le=\"+Inf\"} "), timed, "{page}");
    assert!(sample("crest_request_service_seconds_sum{kind=\"get_attr\"} ").is_some_and(|s| s > 0.0), "{page}");
    let body = page.split("\r\n\r\n").nth(1).unwrap_or_default();
    let length = page.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|n| n.parse::<usize>().ok());
    assert_eq!(length, Some(body.len()), "the length says what comes");

    // A request that comes a byte at a time is read whole (the end of its headers found
    // wherever the bytes fall).
    let mut slow = TcpStream::connect(metrics).expect("connect");
    slow.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" {
        slow.write_all(&[*b]).expect("send");
        slow.flush().expect("flush");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(ask(metrics, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(ask(metrics, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    let long = [b"GET /metrics HTTP/1.1\r\nX: ".as_slice(), &vec![b'a'; MAX_REQUEST_BYTES]].concat();
    assert!(ask(metrics, &long).starts_with("HTTP/1.1 431 "), "a request too long is refused");
    assert_eq!(ask(metrics, b"\r\n\r\n").split(' ').nth(1), Some("404"), "an empty request line");

    // Scrapers that never finish their request hold at most MAX_SCRAPES places; past them
    // a connection is closed at once, and clients go on meanwhile.
    let silent: Vec<TcpStream> = (0..MAX_SCRAPES).map(|_| TcpStream::connect(metrics).expect("connect")).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(metrics).expect("connect");
    extra.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut byte = [0u8; 1];
    assert_eq!(extra.read(&mut byte).ok(), Some(0), "past the limit: closed at once");
    client.call_one(Op::GetAttr { ino: 1 }).expect("clients are not held up");
    drop(silent);
    std::thread::sleep(Duration::from_millis(200));
    assert!(ask(metrics, b"GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200 OK"), "places come back");

    drop(client);
    rt.block_on(serving.shutdown()).expect("shutdown");
}
