//! `crest status`: what a running server is doing — its store's counters, its sessions
//! (which client, which certificate, which dataset, connected or waiting to come back)
//! and the operations it served since it started, by kind — and how long this host's
//! certificate for it has left. A table, or JSON.

use anyhow::{bail, Context, Result};
use crest_nvlist::{NvList, Value};

use crate::dataset::{call, command, Target};

/// One session as the server described it.
struct Session {
    id: u64,
    client: String,
    identity: String,
    dataset: String,
    connected: bool,
    /// The protocol version it speaks (0: restored after a restart, not back yet).
    protocol: u64,
    /// Inodes it holds shared and exclusive rights on, and files it holds open.
    rights_shared: u64,
    rights_exclusive: u64,
    open_handles: u64,
    /// Since the server last heard from it (its lease runs from there).
    heard_ms_ago: Option<u64>,
    /// Where its connection comes from, and its changes in flight at the server.
    address: String,
    changes_in_flight: u64,
}

fn sessions_of(st: &NvList) -> Vec<Session> {
    let Some(Value::Lists(all)) = st.get("sessions") else { return Vec::new() };
    all.iter()
        .map(|s| Session {
            id: s.get_u64("id").unwrap_or(0),
            client: s.get_str("client").unwrap_or("").to_string(),
            identity: s.get_str("identity").unwrap_or("").to_string(),
            dataset: s.get_str("dataset").unwrap_or("").to_string(),
            connected: s.get_bool("connected").unwrap_or(false),
            protocol: s.get_u64("protocol").unwrap_or(0),
            rights_shared: s.get_u64("rights_shared").unwrap_or(0),
            rights_exclusive: s.get_u64("rights_exclusive").unwrap_or(0),
            open_handles: s.get_u64("open_handles").unwrap_or(0),
            heard_ms_ago: s.get_u64("heard_ms_ago"),
            address: s.get_str("address").unwrap_or("").to_string(),
            changes_in_flight: s.get_u64("changes_in_flight").unwrap_or(0),
        })
        .collect()
}

/// The server thread's time on requests, per kind: `{ "count": N, "sum_ns": T }`.
fn service_json(st: &NvList) -> serde_json::Value {
    let Some(Value::List(kinds)) = st.get("service") else { return serde_json::json!({}) };
    let mut out = serde_json::Map::new();
    for (kind, v) in kinds.iter() {
        if let Value::List(h) = v {
            let (count, sum) = (h.get_u64("count").unwrap_or(0), h.get_u64("sum_ns").unwrap_or(0));
            out.insert(kind.to_string(), serde_json::json!({ "count": count, "sum_ns": sum }));
        }
    }
    out.into()
}

/// The image's datasets: name and inodes.
fn datasets_of(st: &NvList) -> Vec<(String, u64)> {
    let Some(Value::Lists(all)) = st.get("datasets") else { return Vec::new() };
    all.iter().map(|d| (d.get_str("name").unwrap_or("").to_string(), d.get_u64("inodes").unwrap_or(0))).collect()
}

/// A list of counters (`served`: by operation kind, `errors`: by errno), most first.
fn counts_of(st: &NvList, name: &str) -> Vec<(String, u64)> {
    let Some(Value::List(l)) = st.get(name) else { return Vec::new() };
    let mut counts: Vec<(String, u64)> =
        l.iter().filter_map(|(k, v)| if let Value::U64(n) = v { Some((k.to_string(), *n)) } else { None }).collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts
}

/// Asks the server at `t` and prints what it said, and the life of `cert`, the certificate
/// this host holds for it if it joined it.
pub fn status(t: &Target, cert: Option<&crest_tls::Held>, json: bool) -> Result<()> {
    // (First: a joined host without the `admin` right is refused what follows.)
    if let Some(c) = cert.filter(|_| !json) {
        println!("this host's certificate for {}: {}", t.addr, crate::renew::describe(c, crest_tls::unix_now()));
    }
    let st = call(t, command("server.status"))?;
    let sessions = sessions_of(&st);
    let served = counts_of(&st, "served");
    let total = st.get_u64("sessions_total").unwrap_or(sessions.len() as u64);
    let n = |k: &str| st.get_u64(k).unwrap_or(0);
    if json {
        let sessions: Vec<serde_json::Value> = sessions
            .iter()
            .map(|s| {
                serde_json::json!({ "id": s.id, "client": s.client, "identity": s.identity,
                                    "dataset": s.dataset, "connected": s.connected,
                                    "protocol": s.protocol, "rights_shared": s.rights_shared,
                                    "rights_exclusive": s.rights_exclusive,
                                    "open_handles": s.open_handles, "heard_ms_ago": s.heard_ms_ago,
                                    "address": s.address, "changes_in_flight": s.changes_in_flight })
            })
            .collect();
        let served: serde_json::Map<String, serde_json::Value> =
            served.into_iter().map(|(k, v)| (k, v.into())).collect();
        let out = serde_json::json!({
            "server": t.addr,
            "release": st.get_str("release").unwrap_or(""),
            "image": st.get_str("image").unwrap_or(""),
            "protocols": st.get_str("protocols").unwrap_or(""),
            "uptime_secs": n("uptime_ms") / 1000,
            "generation": n("generation"),
            "commits": n("commits"),
            "bytes_written": n("bytes_written"),
            "repaired": n("repaired"),
            "grace": st.get_bool("grace").unwrap_or(false),
            "sessions_total": total,
            "sessions": sessions,
            "served": served,
            "service": service_json(&st),
            "client_bytes_written": n("client_bytes_written"),
            "client_bytes_read": n("client_bytes_read"),
            "reads_elsewhere": n("reads_elsewhere"),
            "reads_again": n("reads_again"),
            "objects_mapped": n("objects_mapped"),
            "reads_located": n("reads_located"),
            "objects_deleted": n("objects_deleted"),
            "recalls": n("recalls"),
            "fences": n("fences"),
            "errors": counts_of(&st, "errors").into_iter().map(|(k, v)| (k, v.into())).collect::<serde_json::Map<_, _>>(),
            "space_total_bytes": n("space_total_bytes"),
            "space_free_bytes": n("space_free_bytes"),
            "datasets": datasets_of(&st).into_iter().map(|(name, inodes)| serde_json::json!({ "name": name, "inodes": inodes })).collect::<Vec<_>>(),
            "client_certificate": cert.map(|c| with_seconds_left(crate::renew::describe_json(c))),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_table(t, &st, &sessions, &served);
    Ok(())
}

/// A certificate's description (`renew::describe_json`) with the seconds it has left now.
fn with_seconds_left(mut v: serde_json::Value) -> serde_json::Value {
    let expires = v.get("expires").and_then(serde_json::Value::as_u64).unwrap_or(0);
    if let Some(o) = v.as_object_mut() {
        o.insert("seconds_left".into(), expires.saturating_sub(crest_tls::unix_now()).into());
    }
    v
}

fn print_table(t: &Target, st: &NvList, sessions: &[Session], served: &[(String, u64)]) {
    let n = |k: &str| st.get_u64(k).unwrap_or(0);
    // (A server before protocol 14 names neither its release nor its uptime.)
    if let Some(release) = st.get_str("release") {
        println!(
            "server {}: {release}, protocol {}, up {}; image {}, {:.1} GiB free of {:.1} GiB",
            t.addr,
            st.get_str("protocols").unwrap_or("?"),
            uptime(n("uptime_ms") / 1000),
            st.get_str("image").unwrap_or("?"),
            n("space_free_bytes") as f64 / f64::from(1u32 << 30),
            n("space_total_bytes") as f64 / f64::from(1u32 << 30),
        );
    }
    println!(
        "server {}: generation {}, {} commits and {} MiB written since it started{}",
        t.addr,
        n("generation"),
        n("commits"),
        n("bytes_written") >> 20,
        if st.get_bool("grace") == Some(true) { "; in its grace period after a restart" } else { "" }
    );
    if n("repaired") > 0 {
        println!("bad copies of tree nodes rewritten from their twins: {}", n("repaired"));
    }
    let datasets: Vec<String> = datasets_of(st).iter().map(|(d, i)| format!("{d} ({i} inodes)")).collect();
    if !datasets.is_empty() {
        println!("datasets: {}", datasets.join(", "));
    }
    let total = st.get_u64("sessions_total").unwrap_or(sessions.len() as u64);
    let connected = st.get_u64("sessions_connected").unwrap_or(sessions.iter().filter(|s| s.connected).count() as u64);
    println!("sessions: {total} ({connected} connected)");
    if !sessions.is_empty() {
        println!(
            "  {:>6}  {:<12} {:<12} {:<9} {:<8} {:>13} {:>5} {:>7} {:>9} {:<21} CLIENT",
            "ID", "IDENTITY", "DATASET", "CONNECTED", "PROTOCOL", "RIGHTS S/X", "OPEN", "HEARD", "IN FLIGHT", "ADDRESS"
        );
        for s in sessions {
            let connected = if s.connected { "yes" } else { "no" };
            let protocol = if s.protocol == 0 { "-".to_string() } else { s.protocol.to_string() };
            let rights = format!("{}/{}", s.rights_shared, s.rights_exclusive);
            let heard = s.heard_ms_ago.map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
            println!(
                "  {:>6}  {:<12} {:<12} {:<9} {:<8} {:>13} {:>5} {:>7} {:>9} {:<21} {}",
                s.id,
                s.identity,
                s.dataset,
                connected,
                protocol,
                rights,
                s.open_handles,
                heard,
                s.changes_in_flight,
                s.address,
                s.client
            );
        }
        if total > sessions.len() as u64 {
            println!("  … and {} more", total - sessions.len() as u64);
        }
    }
    let ops: u64 = served.iter().map(|(_, n)| n).sum();
    let kinds: Vec<String> = served.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "served since it started: {ops} operations{}{}",
        if kinds.is_empty() { "" } else { ": " },
        kinds.join(", ")
    );
    if st.get("errors").is_some() {
        let errors: Vec<String> = counts_of(st, "errors").iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "clients wrote {} MiB and read {} MiB; {} recalls, {} sessions fenced; refused: {}",
            n("client_bytes_written") >> 20,
            n("client_bytes_read") >> 20,
            n("recalls"),
            n("fences"),
            if errors.is_empty() { "nothing".to_string() } else { errors.join(", ") }
        );
    }
}

/// "3d 4h", "2h 5m", "4m 10s", "12s".
fn uptime(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// How `crest status --mount` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Prometheus,
}

/// `crest status --mount DIR`: what the mount's daemon says of itself (the `crest.status`
/// attribute of its root, `crest_fuse`'s fs/status.rs).
pub fn mount_status(dir: &std::path::Path, format: Format) -> Result<()> {
    let root = crate::mountinfo::crest_mount_root(dir)?;
    let v = mount_view(&root)?;
    match format {
        Format::Json => {
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        Format::Prometheus => {
            print!("{}", mount_prometheus(&root, &v));
            return Ok(());
        }
        Format::Table => {}
    }
    let s = |k: &str| v.get(k).map_or_else(String::new, |x| x.as_str().map_or_else(|| x.to_string(), str::to_string));
    let c = |k: &str| v.get("cache").and_then(|c| c.get(k)).map_or_else(String::new, ToString::to_string);
    println!(
        "mount {}: {} to {} ({}), session {}, protocol {}, {} reconnects",
        root.display(),
        s("connection"),
        s("server"),
        if s("server_release").is_empty() { "an older crest".to_string() } else { s("server_release") },
        s("session"),
        s("protocol"),
        s("reconnects")
    );
    println!(
        "calls waiting {}, changes not yet durable {}, {} bytes queued to send",
        s("calls_waiting"),
        s("changes_not_durable"),
        s("bytes_queued")
    );
    println!(
        "cache: {} names in {} directories, {} attributes, {} inodes held exclusively; rights reset {} times",
        c("names"),
        c("directories"),
        c("attributes"),
        c("exclusive"),
        c("rights_resets")
    );
    let lookups = |k: &str| v.get("lookups").and_then(|l| l.get(k)).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let (hit, sent) = (lookups("cached"), lookups("sent"));
    let rate = if hit + sent == 0 { 0.0 } else { 100.0 * hit as f64 / (hit + sent) as f64 };
    println!("look-ups: {hit} answered here, {sent} sent to the server ({rate:.0} % hits)");
    if let Some(c) = v.get("client_certificate") {
        let (expires, renew_from) = (num(c, "expires"), num(c, "renew_from"));
        let now = crest_tls::unix_now();
        let life = crest_tls::Lifetime { issued: num(c, "issued"), expires };
        let fp = c.get("fingerprint").and_then(serde_json::Value::as_str).unwrap_or("");
        println!(
            "client certificate {} ({}): {}, {}",
            c.get("name").and_then(serde_json::Value::as_str).unwrap_or("?"),
            &fp[..fp.len().min(16)],
            crate::renew::life_left(&life, now),
            if now >= renew_from {
                "renewal due".to_string()
            } else {
                format!("renewal from {}", crest_tls::utc(renew_from))
            }
        );
    }
    Ok(())
}

fn num(v: &serde_json::Value, key: &str) -> u64 {
    v.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

/// The Prometheus text of the mount whose root is `root` (its metrics endpoint's answer).
pub fn mount_metrics_text(root: &std::path::Path) -> Result<String> {
    Ok(mount_prometheus(root, &mount_view(root)?))
}

/// The mount's view, as its daemon answers it.
fn mount_view(root: &std::path::Path) -> Result<serde_json::Value> {
    let raw = read_status_xattr(root)?;
    serde_json::from_slice(&raw).context("the mount's status is not JSON")
}

/// A mount's view as Prometheus metrics, labelled with its mount point (node_exporter's
/// textfile collector reads files of these: one per mount, rewritten by a timer).
fn mount_prometheus(root: &std::path::Path, v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mount = root.display().to_string().replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    let num = |x: Option<&serde_json::Value>| x.and_then(serde_json::Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{mount=\"{mount}\"}} {value}");
    };
    let open = u64::from(v.get("connection").and_then(serde_json::Value::as_str) == Some("open"));
    metric("crest_mount_connected", "gauge", "1 while the mount's connection to its server is open.", open);
    metric("crest_mount_reconnects_total", "counter", "Welcomes after the first.", num(v.get("reconnects")));
    metric("crest_mount_calls_waiting", "gauge", "Calls waiting for the server's answer.", num(v.get("calls_waiting")));
    let unstable = num(v.get("changes_not_durable"));
    metric("crest_mount_changes_not_durable", "gauge", "Changes answered but not yet committed.", unstable);
    metric("crest_mount_bytes_queued", "gauge", "Bytes encoded and not yet sent.", num(v.get("bytes_queued")));
    let cache = v.get("cache");
    let lookups = v.get("lookups");
    for (key, help) in [
        ("cached", "The kernel's look-ups the mount answered from its cache."),
        ("sent", "The kernel's look-ups the mount sent to its server."),
    ] {
        metric(&format!("crest_mount_lookups_{key}_total"), "counter", help, num(lookups.and_then(|l| l.get(key))));
    }
    for (key, help) in [
        ("names", "Names held in the mount's cache."),
        ("attributes", "Inodes whose attributes the mount holds."),
        ("directories", "Directories some of whose names the mount holds."),
        ("exclusive", "Inodes the mount holds exclusively."),
    ] {
        metric(&format!("crest_mount_cache_{key}"), "gauge", help, num(cache.and_then(|c| c.get(key))));
    }
    // (Only a mount of a server this host joined renews a certificate: the host's own
    // lives 20 years.)
    if let Some(expires) =
        v.get("client_certificate").and_then(|c| c.get("expires")).and_then(serde_json::Value::as_u64)
    {
        let when = "When the client certificate the mount presents expires (seconds since the epoch).";
        metric("crest_mount_client_cert_expiry_timestamp_seconds", "gauge", when, expires);
        let left = "Seconds the client certificate the mount presents has left; renewed when a third of its life is.";
        metric("crest_mount_client_cert_seconds_left", "gauge", left, expires.saturating_sub(crest_tls::unix_now()));
    }
    out
}

/// The bytes of the `crest.status` attribute of `root`.
fn read_status_xattr(root: &std::path::Path) -> Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(root.as_os_str().as_bytes()).context("a path with a NUL byte")?;
    let name = c"crest.status";
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `path` and `name` are NUL-terminated strings that outlive the call, and
    // `buf` is valid for writes of `buf.len()` bytes; getxattr writes at most that many.
    #[allow(unsafe_code)]
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        bail!("{}: the mount did not answer for its status ({e}); an older crest mount?", root.display());
    }
    buf.truncate(n as usize);
    Ok(buf)
}
