//! A Prometheus endpoint (`crest serve --metrics ADDR`): `GET /metrics` answers what
//! `crest status` shows, in Prometheus's text format. Plain HTTP/1.1, one request per
//! connection. A scraper may be anyone who reaches the address, so: the request line and
//! headers must come within `REQUEST_WAIT` and fit `MAX_REQUEST_BYTES`, at most
//! `MAX_SCRAPES` connections are served at once (others are closed), and nothing but
//! `GET /metrics` is answered (404, 405). The status is the store task's answer to an
//! administrative `server.status` call, which changes nothing; one answer serves every
//! scrape for `FRESH_FOR`, so scrapers cannot keep the store task busy. With TLS, the
//! register of client certificates adds when the next one expires (`certificates`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crest_nvlist::{NvList, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::Ctrl;

/// The most bytes of a request's line and headers.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a scraper has to send its request.
pub const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// Scrapes served at once.
pub const MAX_SCRAPES: usize = 16;
/// How long one status serves scrapes.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// The last page rendered, and when.
type Page = Arc<tokio::sync::Mutex<Option<(std::time::Instant, String)>>>;

/// Serves scrapes on `listener` for as long as the server thread runs (`authority`: the
/// CA whose client certificates it admits, None for `--insecure`).
pub(super) async fn serve(
    listener: TcpListener,
    ctrl: mpsc::UnboundedSender<Ctrl>,
    authority: Option<Arc<crest_tls::Authority>>,
) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    let page = Page::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // (Out of descriptors, say: not a loop on the server's thread.)
                tracing::debug!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many scrapes at once; closed");
            continue;
        };
        let (ctrl, page, authority) = (ctrl.clone(), page.clone(), authority.clone());
        tokio::spawn(async move {
            if let Err(e) = scrape(stream, &ctrl, &page, authority.as_deref()).await {
                tracing::debug!(%peer, "metrics: {e}");
            }
            drop(slot);
        });
    }
}

/// Reads one request and answers it.
async fn scrape(
    mut stream: TcpStream,
    ctrl: &mpsc::UnboundedSender<Ctrl>,
    page: &Page,
    authority: Option<&crest_tls::Authority>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut have = 0;
    let head = tokio::time::timeout(REQUEST_WAIT, async {
        loop {
            if have == buf.len() {
                return Ok(None);
            }
            let n = match stream.read(&mut buf[have..]).await? {
                0 => return Err(std::io::Error::other("closed before a whole request")),
                n => n,
            };
            // Only where the new bytes could end the headers: linear in what comes.
            let from = have.saturating_sub(3);
            have += n;
            if let Some(end) = buf[from..have].windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok(Some(from + end));
            }
        }
    })
    .await
    .map_err(|_| std::io::Error::other("no request in time"))??;
    let Some(end) = head else {
        return respond(&mut stream, "431 Request Header Fields Too Large", "").await;
    };
    let line = buf[..end].split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if path != b"/metrics" {
        return respond(&mut stream, "404 Not Found", "not found: try /metrics\n").await;
    }
    if method != b"GET" {
        return respond(&mut stream, "405 Method Not Allowed", "GET only\n").await;
    }
    let mut last = page.lock().await;
    if let Some((_, text)) = last.as_ref().filter(|(at, _)| at.elapsed() < FRESH_FOR) {
        let text = text.clone();
        drop(last);
        return respond(&mut stream, "200 OK", &text).await;
    }
    let mut call = NvList::new();
    let _ = call.add("cmd", Value::Str("server.status".into()));
    let _ = call.add("brief", Value::Bool(true));
    let (reply, rx) = oneshot::channel();
    if ctrl.send(Ctrl::Admin { call: call.encode(), reply }).is_err() {
        return respond(&mut stream, "503 Service Unavailable", "the server is stopping\n").await;
    }
    let Ok(answer) = rx.await else {
        return respond(&mut stream, "503 Service Unavailable", "the server is stopping\n").await;
    };
    match NvList::decode(&answer) {
        Ok(st) if st.get("error").is_none() => {
            let mut text = render(&st);
            if let Some(authority) = authority {
                certificates(&mut text, authority.soonest_expiry().map(|r| r.expires));
            }
            *last = Some((std::time::Instant::now(), text.clone()));
            drop(last);
            respond(&mut stream, "200 OK", &text).await
        }
        _ => respond(&mut stream, "500 Internal Server Error", "no status\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The status as Prometheus metrics.
pub fn render(st: &NvList) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let one = |k: &str| vec![(String::new(), st.get_u64(k).unwrap_or(0))];
    metric("crest_generation", "gauge", "The image's commit generation.", &one("generation"));
    metric("crest_commits_total", "counter", "Commits since the server started.", &one("commits"));
    metric("crest_written_bytes_total", "counter", "Bytes written to the image since start.", &one("bytes_written"));
    metric("crest_repaired_nodes_total", "counter", "Tree node copies rewritten from their twins.", &one("repaired"));
    let grace = vec![(String::new(), u64::from(st.get_bool("grace").unwrap_or(false)))];
    metric("crest_grace_period", "gauge", "1 while the server waits for clients to replay after a restart.", &grace);
    let sessions = match st.get("sessions") {
        Some(Value::Lists(s)) => s.as_slice(),
        _ => &[],
    };
    let listed = sessions.iter().filter(|s| s.get_bool("connected") == Some(true)).count() as u64;
    let connected = st.get_u64("sessions_connected").unwrap_or(listed);
    let total = st.get_u64("sessions_total").unwrap_or(sessions.len() as u64);
    let by_state = vec![
        ("{state=\"connected\"}".to_string(), connected),
        ("{state=\"disconnected\"}".to_string(), total.saturating_sub(connected)),
    ];
    metric("crest_sessions", "gauge", "Sessions held, connected or kept for a reconnect.", &by_state);
    let served = labelled(st, "served", "kind");
    metric("crest_operations_total", "counter", "Operations served since start, by kind.", &served);
    let data = vec![
        ("{direction=\"written\"}".to_string(), st.get_u64("client_bytes_written").unwrap_or(0)),
        ("{direction=\"read\"}".to_string(), st.get_u64("client_bytes_read").unwrap_or(0)),
    ];
    metric("crest_client_bytes_total", "counter", "File data clients wrote and read since start.", &data);
    let reads = vec![
        ("{on=\"elsewhere\"}".to_string(), st.get_u64("reads_elsewhere").unwrap_or(0)),
        ("{on=\"again\"}".to_string(), st.get_u64("reads_again").unwrap_or(0)),
    ];
    let planned = "Reads run beside the store's thread since start, and those read again on it (a bad block).";
    metric("crest_planned_reads_total", "counter", planned, &reads);
    let objects = vec![
        ("{event=\"mapped\"}".to_string(), st.get_u64("objects_mapped").unwrap_or(0)),
        ("{event=\"deleted\"}".to_string(), st.get_u64("objects_deleted").unwrap_or(0)),
    ];
    let what = "Objects of the data store mapped into files, and deleted by the collector, since start.";
    metric("crest_objects_total", "counter", what, &objects);
    metric(
        "crest_located_reads_total",
        "counter",
        "Reads answered with object locations since start.",
        &one("reads_located"),
    );
    let queued = "Changes waiting at the server: parked behind another session's rights, or for an earlier answer.";
    metric("crest_changes_in_flight", "gauge", queued, &one("changes_in_flight"));
    metric("crest_recalls_total", "counter", "Recalls of rights sent to clients since start.", &one("recalls"));
    metric("crest_fences_total", "counter", "Sessions fenced (silent past their lease) since start.", &one("fences"));
    let errors = labelled(st, "errors", "errno");
    metric("crest_errors_total", "counter", "Operations refused since start, by errno.", &errors);
    let space = vec![
        ("{state=\"total\"}".to_string(), st.get_u64("space_total_bytes").unwrap_or(0)),
        ("{state=\"free\"}".to_string(), st.get_u64("space_free_bytes").unwrap_or(0)),
    ];
    metric("crest_space_bytes", "gauge", "The image's size and its free space.", &space);
    service_histogram(&mut out, st);
    out
}

/// `crest_client_cert_soonest_expiry_timestamp_seconds`: when the first client
/// certificate expires among those admitted and not renewed (the register the server
/// re-reads each second, no file read here); none while there is none.
fn certificates(out: &mut String, soonest: Option<u64>) {
    let Some(expires) = soonest else { return };
    let name = "crest_client_cert_soonest_expiry_timestamp_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} When the first client certificate the server admits and that was not renewed \
         expires (seconds since the epoch); clients renew theirs with a third of its life left.\n\
         # TYPE {name} gauge\n{name} {expires}"
    );
}

/// The counters of the status's list `list` (name → count), each labelled `key="name"`.
fn labelled(st: &NvList, list: &str, key: &str) -> Vec<(String, u64)> {
    let Some(Value::List(l)) = st.get(list) else { return Vec::new() };
    l.iter()
        .filter_map(|(k, v)| match v {
            Value::U64(n) => Some((format!("{{{key}=\"{}\"}}", label(k)), *n)),
            _ => None,
        })
        .collect()
}

/// `crest_request_service_seconds`: the server thread's time per request, by the kind of
/// its first operation (the status's `service` list, whose buckets are cumulative already).
fn service_histogram(out: &mut String, st: &NvList) {
    let name = "crest_request_service_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time the server's thread spent on each request, by its first operation's kind.\n\
         # TYPE {name} histogram"
    );
    let Some(Value::List(kinds)) = st.get("service") else { return };
    for (kind, v) in kinds.iter() {
        let Value::List(h) = v else { continue };
        let kind = label(kind);
        for (key, v) in h.iter() {
            let (Some(us), Value::U64(n)) = (key.strip_prefix("le_").and_then(|b| b.parse::<u64>().ok()), v) else {
                continue;
            };
            let _ = writeln!(out, "{name}_bucket{{kind=\"{kind}\",le=\"{}\"}} {n}", us as f64 / 1e6);
        }
        let count = h.get_u64("count").unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{kind=\"{kind}\"}} {}", h.get_u64("sum_ns").unwrap_or(0) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count{{kind=\"{kind}\"}} {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_renders_as_prometheus_text() {
        let mut st = NvList::new();
        let _ = st.add("generation", Value::U64(7));
        let _ = st.add("commits", Value::U64(3));
        let _ = st.add("grace", Value::Bool(true));
        let _ = st.add("sessions_total", Value::U64(3));
        let session = |connected| {
            let mut s = NvList::new();
            let _ = s.add("connected", Value::Bool(connected));
            s
        };
        let _ = st.add("sessions", Value::Lists(vec![session(true), session(false), session(true)]));
        let mut served = NvList::new();
        let _ = served.add("lookup", Value::U64(5));
        let _ = served.add("odd\"kind", Value::U64(1));
        let _ = st.add("served", Value::List(served));
        let mut lookup = NvList::new();
        for (k, v) in [("count", 4), ("sum_ns", 1_500_000_000), ("le_10", 1), ("le_1000", 3)] {
            let _ = lookup.add(k, Value::U64(v));
        }
        let mut service = NvList::new();
        let _ = service.add("lookup", Value::List(lookup));
        let _ = st.add("service", Value::List(service));
        let mut errors = NvList::new();
        let _ = errors.add("ENOENT", Value::U64(6));
        let _ = st.add("errors", Value::List(errors));
        let _ = st.add("client_bytes_read", Value::U64(4096));
        let _ = st.add("space_free_bytes", Value::U64(1 << 20));
        let text = render(&st);
        for line in [
            "# TYPE crest_generation gauge",
            "crest_generation 7",
            "crest_commits_total 3",
            "crest_grace_period 1",
            "crest_sessions{state=\"connected\"} 2",
            "crest_sessions{state=\"disconnected\"} 1",
            "crest_operations_total{kind=\"lookup\"} 5",
            "crest_operations_total{kind=\"odd\\\"kind\"} 1",
            "crest_errors_total{errno=\"ENOENT\"} 6",
            "crest_client_bytes_total{direction=\"read\"} 4096",
            "crest_space_bytes{state=\"free\"} 1048576",
            "crest_fences_total 0",
            "crest_changes_in_flight 0",
            "# TYPE crest_request_service_seconds histogram",
            "crest_request_service_seconds_bucket{kind=\"lookup\",le=\"0.00001\"} 1",
            "crest_request_service_seconds_bucket{kind=\"lookup\",le=\"0.001\"} 3",
            "crest_request_service_seconds_bucket{kind=\"lookup\",le=\"+Inf\"} 4",
            "crest_request_service_seconds_sum{kind=\"lookup\"} 1.5",
            "crest_request_service_seconds_count{kind=\"lookup\"} 4",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        // Certificates: shown when one is live, not otherwise.
        let mut with = text.clone();
        certificates(&mut with, Some(1_800_000_000));
        assert!(with.lines().any(|l| l == "crest_client_cert_soonest_expiry_timestamp_seconds 1800000000"), "{with}");
        let mut without = text.clone();
        certificates(&mut without, None);
        assert_eq!(without, text);
        // Every sample line is a name, optional labels and a number.
        for l in with.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = l.rsplit_once(' ').expect("name and value");
            assert!(name.starts_with("crest_") && value.parse::<f64>().is_ok(), "{l:?}");
        }
    }
}
