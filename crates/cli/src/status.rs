//! `crest status`: what a running server is doing — its store's counters, its sessions
//! (which client, which certificate, which dataset, connected or waiting to come back)
//! and the operations it served since it started, by kind. A table, or JSON.

use anyhow::Result;
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
        })
        .collect()
}

/// Operations served, by kind, most first.
fn served_of(st: &NvList) -> Vec<(String, u64)> {
    let Some(Value::List(served)) = st.get("served") else { return Vec::new() };
    let mut kinds: Vec<(String, u64)> = served
        .iter()
        .filter_map(|(k, v)| if let Value::U64(n) = v { Some((k.to_string(), *n)) } else { None })
        .collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    kinds
}

/// Asks the server at `t` and prints what it said.
pub fn status(t: &Target, json: bool) -> Result<()> {
    let st = call(t, command("server.status"))?;
    let sessions = sessions_of(&st);
    let served = served_of(&st);
    let total = st.get_u64("sessions_total").unwrap_or(sessions.len() as u64);
    let n = |k: &str| st.get_u64(k).unwrap_or(0);
    if json {
        let sessions: Vec<serde_json::Value> = sessions
            .iter()
            .map(|s| {
                serde_json::json!({ "id": s.id, "client": s.client, "identity": s.identity,
                                    "dataset": s.dataset, "connected": s.connected,
                                    "protocol": s.protocol })
            })
            .collect();
        let served: serde_json::Map<String, serde_json::Value> =
            served.into_iter().map(|(k, v)| (k, v.into())).collect();
        let out = serde_json::json!({
            "server": t.addr,
            "release": st.get_str("release").unwrap_or(""),
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
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    // (A server before protocol 14 names neither its release nor its uptime.)
    if let Some(release) = st.get_str("release") {
        println!(
            "server {}: {release}, protocol {}, up {}",
            t.addr,
            st.get_str("protocols").unwrap_or("?"),
            uptime(n("uptime_ms") / 1000)
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
    let connected = st.get_u64("sessions_connected").unwrap_or(sessions.iter().filter(|s| s.connected).count() as u64);
    println!("sessions: {total} ({connected} connected)");
    if !sessions.is_empty() {
        println!("  {:>6}  {:<12} {:<12} {:<9} {:<8} CLIENT", "ID", "IDENTITY", "DATASET", "CONNECTED", "PROTOCOL");
        for s in &sessions {
            let connected = if s.connected { "yes" } else { "no" };
            let protocol = if s.protocol == 0 { "-".to_string() } else { s.protocol.to_string() };
            println!(
                "  {:>6}  {:<12} {:<12} {:<9} {:<8} {}",
                s.id, s.identity, s.dataset, connected, protocol, s.client
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
    Ok(())
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
