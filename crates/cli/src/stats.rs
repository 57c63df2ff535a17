//! `crest stats`: what a running server does each second, as `juicefs stats` and
//! `vmstat` show it — operations per second by kind, the server thread's mean time per
//! request of each kind over the interval, commits and bytes written per second, sessions
//! connected. It asks for the status (`server.status`, which changes nothing) once per
//! interval and prints the differences: a line per interval, or a JSON object per line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use crest_nvlist::{NvList, Value};

use crate::dataset::{call, command, Target};

/// The counters one status gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub commits: u64,
    pub bytes_written: u64,
    /// File data clients read.
    pub bytes_read: u64,
    pub connected: u64,
    /// By kind: requests of that kind served, and the server thread's microseconds on them.
    pub service: BTreeMap<String, (u64, u64)>,
    /// By kind: operations served (a compound request counts each of its operations).
    pub served: BTreeMap<String, u64>,
}

impl Sample {
    pub fn of(st: &NvList) -> Sample {
        let mut s = Sample {
            commits: st.get_u64("commits").unwrap_or(0),
            bytes_written: st.get_u64("bytes_written").unwrap_or(0),
            bytes_read: st.get_u64("client_bytes_read").unwrap_or(0),
            connected: st.get_u64("sessions_connected").unwrap_or(0),
            ..Sample::default()
        };
        if let Some(Value::List(l)) = st.get("served") {
            for (k, v) in l.iter() {
                if let Value::U64(n) = v {
                    s.served.insert(k.to_string(), *n);
                }
            }
        }
        if let Some(Value::List(l)) = st.get("service") {
            for (k, v) in l.iter() {
                if let Value::List(h) = v {
                    // (Nanoseconds from the server, microseconds here.)
                    let micros = h.get_u64("sum_ns").unwrap_or(0) / 1000;
                    s.service.insert(k.to_string(), (h.get_u64("count").unwrap_or(0), micros));
                }
            }
        }
        s
    }
}

/// One interval: rates per second and mean times.
#[derive(Debug, PartialEq)]
pub struct Interval {
    pub ops_per_sec: f64,
    /// Kind, operations per second, requests of it per second and their mean time (µs),
    /// busiest first.
    pub kinds: Vec<(String, f64, f64, Option<f64>)>,
    pub commits_per_sec: f64,
    pub written_per_sec: f64,
    pub read_per_sec: f64,
    pub connected: u64,
}

/// What happened between `a` and `b`, `secs` apart. (A server restarted in between counts
/// from zero again: what went down is taken as new.)
pub fn between(a: &Sample, b: &Sample, secs: f64) -> Interval {
    let secs = secs.max(1e-3);
    let diff = |x: u64, y: u64| if y >= x { y - x } else { y };
    let mut kinds: Vec<(String, f64, f64, Option<f64>)> = b
        .served
        .iter()
        .map(|(k, &n)| {
            let ops = diff(a.served.get(k).copied().unwrap_or(0), n) as f64 / secs;
            let (c0, t0) = a.service.get(k).copied().unwrap_or((0, 0));
            let (c1, t1) = b.service.get(k).copied().unwrap_or((0, 0));
            let (count, micros) = (diff(c0, c1), diff(t0, t1));
            let mean = (count > 0).then(|| micros as f64 / count as f64);
            (k.clone(), ops, count as f64 / secs, mean)
        })
        .filter(|(_, ops, reqs, _)| *ops > 0.0 || *reqs > 0.0)
        .collect();
    kinds.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    Interval {
        // (A sum of nothing is -0.0, printed "-0".)
        ops_per_sec: kinds.iter().map(|k| k.1).sum::<f64>() + 0.0,
        kinds,
        commits_per_sec: diff(a.commits, b.commits) as f64 / secs,
        written_per_sec: diff(a.bytes_written, b.bytes_written) as f64 / secs,
        read_per_sec: diff(a.bytes_read, b.bytes_read) as f64 / secs,
        connected: b.connected,
    }
}

/// The status call without the sessions listed one by one (`crest status` has those).
fn brief_status() -> Result<NvList> {
    let mut l = command("server.status");
    crate::dataset::add(&mut l, "brief", Value::Bool(true))?;
    Ok(l)
}

/// Prints an interval every `every` until `count` were printed (for ever without one).
pub fn stats(t: &Target, every: Duration, count: Option<u64>, json: bool) -> Result<()> {
    if every < Duration::from_millis(100) {
        bail!("--interval of at least 0.1 s");
    }
    let mut before = Sample::of(&call(t, brief_status()?)?);
    let mut at = Instant::now();
    let mut printed = 0u64;
    while count.is_none_or(|c| printed < c) {
        std::thread::sleep(every.saturating_sub(at.elapsed()));
        let now = Sample::of(&call(t, brief_status()?)?);
        let took = at.elapsed();
        at = Instant::now();
        let iv = between(&before, &now, took.as_secs_f64());
        before = now;
        if json {
            let kinds: serde_json::Map<String, serde_json::Value> = iv
                .kinds
                .iter()
                .map(|(k, ops, reqs, mean)| {
                    (k.clone(), serde_json::json!({ "ops_per_sec": ops, "requests_per_sec": reqs, "mean_us": mean }))
                })
                .collect();
            let line = serde_json::json!({
                "ops_per_sec": iv.ops_per_sec, "commits_per_sec": iv.commits_per_sec,
                "written_bytes_per_sec": iv.written_per_sec, "read_bytes_per_sec": iv.read_per_sec,
                "sessions_connected": iv.connected,
                "kinds": kinds,
            });
            println!("{line}");
        } else {
            if printed.is_multiple_of(20) {
                println!(
                    "{:>9} {:>8} {:>9} {:>9} {:>5}  busiest kinds: ops/s (mean µs per request)",
                    "ops/s", "commit/s", "MiB/s wr", "MiB/s rd", "conn"
                );
            }
            let top: Vec<String> = iv
                .kinds
                .iter()
                .take(4)
                .map(|(k, ops, _, mean)| match mean {
                    Some(m) => format!("{k} {ops:.0} ({m:.0})"),
                    None => format!("{k} {ops:.0}"),
                })
                .collect();
            println!(
                "{:>9.0} {:>8.1} {:>9.1} {:>9.1} {:>5}  {}",
                iv.ops_per_sec,
                iv.commits_per_sec,
                iv.written_per_sec / (1 << 20) as f64,
                iv.read_per_sec / (1 << 20) as f64,
                iv.connected,
                top.join(", ")
            );
        }
        printed += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(commits: u64, served: &[(&str, u64)], service: &[(&str, u64, u64)]) -> Sample {
        Sample {
            commits,
            bytes_written: commits * 4096,
            bytes_read: commits * 100,
            connected: 2,
            served: served.iter().map(|&(k, n)| (k.to_string(), n)).collect(),
            service: service.iter().map(|&(k, c, t)| (k.to_string(), (c, t))).collect(),
        }
    }

    #[test]
    fn an_interval_is_the_differences_per_second_busiest_first() {
        let a = sample(10, &[("lookup", 100), ("write", 5)], &[("lookup", 50, 5_000), ("write", 5, 500)]);
        let b = sample(
            14,
            &[("lookup", 300), ("write", 5), ("create", 40)],
            &[("lookup", 150, 25_000), ("create", 20, 4_000)],
        );
        let iv = between(&a, &b, 2.0);
        assert_eq!(iv.ops_per_sec, 120.0);
        assert_eq!(iv.commits_per_sec, 2.0);
        assert_eq!(iv.written_per_sec, 8192.0);
        assert_eq!(iv.read_per_sec, 200.0);
        assert_eq!(
            iv.kinds,
            vec![("lookup".into(), 100.0, 50.0, Some(200.0)), ("create".into(), 20.0, 10.0, Some(200.0))],
            "write served nothing in between"
        );
    }

    #[test]
    fn a_quiet_interval_is_zero_not_minus_zero() {
        let a = sample(1, &[("lookup", 5)], &[]);
        assert_eq!(format!("{:.0}", between(&a, &a, 1.0).ops_per_sec), "0");
    }

    #[test]
    fn a_restarted_server_counts_from_zero() {
        let a = sample(1000, &[("lookup", 5000)], &[]);
        let b = sample(3, &[("lookup", 30)], &[]);
        let iv = between(&a, &b, 1.0);
        assert_eq!((iv.commits_per_sec, iv.ops_per_sec), (3.0, 30.0));
        assert_eq!(iv.kinds[0].3, None, "no times: no mean");
    }
}
