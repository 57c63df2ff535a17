//! Transfers against a scripted HTTP server on loopback: what is retried (connection
//! drops, 5xx, 429) until it passes or the deadline, what fails at once (403, 404), a
//! retried PUT answered 412 counted as done but a first one not, a short range refused,
//! and a server that never answers given up on within the deadline.

use crest_objects::{TransferError, Transfers};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One scripted answer: a status and a body, or a dropped connection, or silence.
#[derive(Clone)]
enum Answer {
    Status(u16, Vec<u8>),
    Drop,
    Silent,
}

/// Serves `script` in order (the last answer repeats); returns the base URL and the
/// requests seen (method, Range and If-None-Match headers).
fn server(script: Vec<Answer>) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/bucket/key", l.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut i = 0;
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            let mut r = BufReader::new(s.try_clone().expect("clone"));
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let mut req = line.split_whitespace().next().unwrap_or("").to_string();
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if lower.starts_with("range:") || lower.starts_with("if-none-match:") {
                        req.push(' ');
                        req.push_str(lower.trim());
                    }
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                log.lock().expect("log").push(req);
                let a = script.get(i).or(script.last()).cloned().unwrap_or(Answer::Drop);
                i += 1;
                match a {
                    Answer::Status(code, body) => {
                        let head = format!("HTTP/1.1 {code} X\r\ncontent-length: {}\r\n\r\n", body.len());
                        if s.write_all(head.as_bytes()).and_then(|()| s.write_all(&body)).is_err() {
                            break;
                        }
                    }
                    Answer::Drop => break,
                    Answer::Silent => std::thread::sleep(Duration::from_secs(30)),
                }
            }
        }
    });
    (url, seen)
}

#[test]
fn failures_that_may_pass_are_retried_and_a_retried_put_answered_412_is_done() {
    let (url, seen) = server(vec![
        Answer::Status(503, vec![]),
        Answer::Drop,
        Answer::Status(429, vec![]),
        Answer::Status(412, vec![]),
    ]);
    let t = Transfers::new(Duration::from_secs(10));
    t.put_once(&url, b"object bytes").expect("put after retries");
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen.iter().all(|r| r.starts_with("PUT") && r.contains("if-none-match: *")), "{seen:?}");
}

#[test]
fn a_first_put_answered_412_is_an_error_and_403_404_fail_at_once() {
    let (url, _) = server(vec![Answer::Status(412, b"exists".to_vec())]);
    let t = Transfers::new(Duration::from_secs(10));
    assert!(matches!(t.put_once(&url, b"x"), Err(TransferError::Refused(412, _))));
    let (url, seen) = server(vec![Answer::Status(403, b"expired".to_vec())]);
    assert!(matches!(t.get_range(&url, 0, 10), Err(TransferError::Refused(403, _))));
    assert_eq!(seen.lock().expect("seen").len(), 1, "a 403 is not retried");
    let (url, _) = server(vec![Answer::Status(404, vec![])]);
    assert!(matches!(t.get_range(&url, 0, 10), Err(TransferError::NotFound)));
    let (url, _) = server(vec![Answer::Status(404, vec![])]);
    t.delete(&url).expect("deleting what is gone is done");
}

#[test]
fn ranges_are_asked_and_a_short_answer_is_refused() {
    let (url, seen) = server(vec![Answer::Status(206, vec![7; 4096]), Answer::Status(206, vec![7; 100])]);
    let t = Transfers::new(Duration::from_secs(10));
    assert_eq!(t.get_range(&url, 8192, 4096).expect("range"), vec![7; 4096]);
    assert!(matches!(t.get_range(&url, 0, 4096), Err(TransferError::Bad(_))));
    assert!(seen.lock().expect("seen")[0].contains("range: bytes=8192-12287"));
    // A store that ignores the range and answers the whole object: the range is cut out.
    let whole: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let (url, _) = server(vec![Answer::Status(200, whole.clone())]);
    assert_eq!(t.get_range(&url, 5000, 300).expect("range of a whole answer"), whole[5000..5300].to_vec());
}

#[test]
fn a_store_that_never_answers_is_given_up_on_within_the_deadline() {
    for (script, name) in [(vec![Answer::Silent], "silent"), (vec![Answer::Status(500, vec![])], "failing")] {
        let (url, _) = server(script);
        let t = Transfers::new(Duration::from_millis(1500));
        let start = Instant::now();
        let r = t.put_once(&url, &[1; 100_000]);
        let took = start.elapsed();
        assert!(matches!(r, Err(TransferError::Failed(_))), "{name}: {r:?}");
        assert!(took < Duration::from_secs(4), "{name}: gave up after {took:?}");
    }
}
