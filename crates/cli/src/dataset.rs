//! `crest dataset create|list|get|set|destroy`: administrative calls to a running server
//! (docs/protocol.md §5), as `zfs create|list|get|set|destroy` are to a pool. The server
//! checks that this host may make them; the names, properties and results travel as
//! name-value lists.

use std::io::BufRead;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use crest_nvlist::{NvList, Value};

/// Dataset commands.
#[derive(Subcommand, Debug)]
pub enum DatasetCmd {
    /// Create an empty dataset (a separately mountable tree: `crest mount ADDR DIR -o
    /// dataset=NAME`).
    Create {
        /// Its name: letters, digits, '_', '-', '.', ':'.
        name: String,
        /// Properties, PROP=VALUE (quota=10G, readonly=on, atime=off, user:KEY=TEXT).
        #[arg(short = 'o')]
        props: Vec<String>,
        /// Owner and mode of its root directory: UID:GID:MODE (octal), e.g. 1000:1000:750.
        #[arg(long)]
        root: Option<String>,
    },
    /// List datasets.
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show a dataset's properties: all, or those named.
    Get {
        /// The dataset.
        name: String,
        /// Property names (default: all).
        props: Vec<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Set properties (PROP=VALUE), or clear them (PROP=).
    Set {
        /// The dataset.
        name: String,
        /// PROP=VALUE pairs.
        #[arg(required = true)]
        props: Vec<String>,
    },
    /// Destroy datasets and everything in them (refused while one is mounted).
    Destroy {
        /// Datasets to destroy.
        names: Vec<String>,
        /// Also read names from standard input, one per line.
        #[arg(long)]
        stdin: bool,
    },
}

/// Snapshot commands.
#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Take snapshots DATASET@NAME, all at once: each holds exactly what its dataset's
    /// clients were told was done before it (they write back first).
    Create {
        /// Snapshots to take.
        names: Vec<String>,
        /// Also read names from standard input, one per line.
        #[arg(long)]
        stdin: bool,
    },
    /// List snapshots.
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Roll a dataset back to its newest snapshot (refused while the dataset is mounted).
    Rollback {
        /// DATASET@NAME.
        name: String,
    },
    /// Destroy snapshots (refused while one is mounted); per-name failures.
    Destroy {
        /// Snapshots to destroy.
        names: Vec<String>,
        /// Also read names from standard input, one per line.
        #[arg(long)]
        stdin: bool,
    },
}

/// Where and how to reach the server.
pub struct Target<'a> {
    /// `HOST:PORT`.
    pub addr: &'a str,
    /// TLS configuration (None: `--insecure`).
    pub tls: Option<std::sync::Arc<crest_tls::ClientConfig>>,
}

pub(crate) fn call(t: &Target, l: NvList) -> Result<NvList> {
    let bytes =
        crest_net::admin(t.addr, t.tls.clone(), l.encode(), Duration::from_secs(600)).map_err(|e| anyhow!(e))?;
    let answer = NvList::decode(&bytes).map_err(|e| anyhow!("{}: a garbled answer: {e}", t.addr))?;
    if let Some(e) = answer.get_str("error") {
        bail!("{e}");
    }
    Ok(answer)
}

pub(crate) fn command(cmd: &str) -> NvList {
    let mut l = NvList::new();
    let _ = l.add("cmd", Value::Str(cmd.to_string()));
    l
}

pub(crate) fn add(l: &mut NvList, name: &str, v: Value) -> Result<()> {
    l.add(name, v).map_err(|e| anyhow!(e))
}

/// `PROP=VALUE` pairs as a list of text values, and the props given empty (to clear).
fn props_of(pairs: &[String]) -> Result<(NvList, Vec<String>)> {
    let mut set = NvList::new();
    let mut clear = Vec::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else { bail!("{p:?}: expected PROP=VALUE") };
        if v.is_empty() {
            clear.push(k.to_string());
        } else {
            set.add(k, Value::Str(v.to_string())).map_err(|e| anyhow!("{p:?}: {e}"))?;
        }
    }
    Ok((set, clear))
}

/// A dataset answer's fields: name, id, inodes, and its properties as text.
fn fields(d: &NvList) -> (String, u64, u64, Vec<(String, String)>) {
    let props = d
        .get_list("props")
        .map(|p| {
            p.iter()
                .map(|(k, v)| (k.to_string(), if let Value::Str(s) = v { s.clone() } else { String::new() }))
                .collect()
        })
        .unwrap_or_default();
    (
        d.get_str("name").unwrap_or("?").to_string(),
        d.get_u64("id").unwrap_or(0),
        d.get_u64("inodes").unwrap_or(0),
        props,
    )
}

fn json_of(d: &NvList) -> serde_json::Value {
    let (name, id, inodes, props) = fields(d);
    let props: serde_json::Map<String, serde_json::Value> = props.into_iter().map(|(k, v)| (k, v.into())).collect();
    serde_json::json!({ "name": name, "id": id, "inodes": inodes, "properties": props })
}

/// Runs a dataset command against `t`.
pub fn run(t: &Target, cmd: DatasetCmd) -> Result<()> {
    match cmd {
        DatasetCmd::Create { name, props, root } => {
            let mut l = command("dataset.create");
            add(&mut l, "name", Value::Str(name.clone()))?;
            let (set, clear) = props_of(&props)?;
            if !clear.is_empty() {
                bail!("create: properties need values ({})", clear.join(", "));
            }
            add(&mut l, "props", Value::List(set))?;
            if let Some(root) = root {
                let parts: Vec<&str> = root.split(':').collect();
                let [uid, gid, mode] = parts[..] else { bail!("--root {root:?}: expected UID:GID:MODE") };
                let num = |s: &str, radix| {
                    u64::from_str_radix(s, radix).map_err(|_| anyhow!("--root {root:?}: bad number {s:?}"))
                };
                add(&mut l, "uid", Value::U64(num(uid, 10)?))?;
                add(&mut l, "gid", Value::U64(num(gid, 10)?))?;
                add(&mut l, "mode", Value::U64(num(mode, 8)?))?;
            }
            call(t, l)?;
        }
        DatasetCmd::List { json } => {
            let answer = call(t, command("dataset.list"))?;
            let all = match answer.get("datasets") {
                Some(Value::Lists(v)) => v.clone(),
                _ => Vec::new(),
            };
            if json {
                println!("{}", serde_json::Value::Array(all.iter().map(json_of).collect()));
            } else {
                println!("{:<24} {:>6} {:>12}  PROPERTIES", "NAME", "ID", "INODES");
                for d in &all {
                    let (name, id, inodes, props) = fields(d);
                    let props: Vec<String> = props.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    println!("{name:<24} {id:>6} {inodes:>12}  {}", props.join(","));
                }
            }
        }
        DatasetCmd::Get { name, props, json } => {
            let mut l = command("dataset.get");
            add(&mut l, "name", Value::Str(name))?;
            let answer = call(t, l)?;
            let d = answer.get_list("dataset").cloned().unwrap_or_default();
            let (name, _, _, all) = fields(&d);
            let wanted = |k: &str| props.is_empty() || props.iter().any(|p| p == "all" || p == k);
            if json {
                let mut j = json_of(&d);
                if let Some(m) = j.get_mut("properties").and_then(|p| p.as_object_mut()) {
                    m.retain(|k, _| wanted(k));
                }
                println!("{j}");
            } else {
                println!("{:<24} {:<24} VALUE", "NAME", "PROPERTY");
                for (k, v) in all.iter().filter(|(k, _)| wanted(k)) {
                    println!("{name:<24} {k:<24} {v}");
                }
            }
        }
        DatasetCmd::Set { name, props } => {
            let mut l = command("dataset.set");
            add(&mut l, "name", Value::Str(name))?;
            let (set, clear) = props_of(&props)?;
            add(&mut l, "props", Value::List(set))?;
            add(&mut l, "clear", Value::Strs(clear))?;
            call(t, l)?;
        }
        DatasetCmd::Destroy { names, stdin } => destroy(t, "dataset.destroy", names, stdin)?,
    }
    Ok(())
}

/// Names given, and those on standard input (one per line) with `--stdin`.
fn names_with_stdin(mut names: Vec<String>, stdin: bool) -> Result<Vec<String>> {
    if stdin {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            if !line.trim().is_empty() {
                names.push(line.trim().to_string());
            }
        }
    }
    if names.is_empty() {
        bail!("no name given");
    }
    Ok(names)
}

/// A destroy of many names: per-name failures printed, the call fails if any did.
fn destroy(t: &Target, cmd: &str, names: Vec<String>, stdin: bool) -> Result<()> {
    let mut l = command(cmd);
    add(&mut l, "names", Value::Strs(names_with_stdin(names, stdin)?))?;
    let answer = call(t, l)?;
    let mut failed = 0;
    if let Some(results) = answer.get_list("results") {
        for (name, r) in results.iter() {
            if let Value::Str(r) = r {
                if r != "ok" {
                    eprintln!("crest: cannot destroy {name}: {r}");
                    failed += 1;
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} not destroyed");
    }
    Ok(())
}

/// Runs a snapshot command against `t`.
pub fn run_snapshot(t: &Target, cmd: SnapshotCmd) -> Result<()> {
    match cmd {
        SnapshotCmd::Create { names, stdin } => {
            let mut l = command("snapshot.create");
            add(&mut l, "names", Value::Strs(names_with_stdin(names, stdin)?))?;
            call(t, l)?;
        }
        SnapshotCmd::List { json } => {
            let answer = call(t, command("snapshot.list"))?;
            let all = match answer.get("datasets") {
                Some(Value::Lists(v)) => v.clone(),
                _ => Vec::new(),
            };
            if json {
                let v: Vec<serde_json::Value> = all
                    .iter()
                    .map(|d| {
                        let (name, id, inodes, _) = fields(d);
                        serde_json::json!({ "name": name, "id": id, "inodes": inodes })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                println!("{:<40} {:>8} {:>12}", "NAME", "ID", "INODES");
                for d in &all {
                    let (name, id, inodes, _) = fields(d);
                    println!("{name:<40} {id:>8} {inodes:>12}");
                }
            }
        }
        SnapshotCmd::Destroy { names, stdin } => destroy(t, "snapshot.destroy", names, stdin)?,
        SnapshotCmd::Rollback { name } => {
            let mut l = command("snapshot.rollback");
            add(&mut l, "name", Value::Str(name))?;
            call(t, l)?;
        }
    }
    Ok(())
}

/// `crest scrub`: reads and checks every data block of every dataset and snapshot on the
/// server, a step at a time (throttled between steps) while clients work, from where the
/// last scrub stopped unless `restart` (or it had finished); prints progress on a
/// terminal and a report at the end. Returns whether it found problems.
pub fn scrub(t: &Target, restart: bool, json: bool) -> Result<bool> {
    let mut first = true;
    let started = std::time::Instant::now();
    let checked = crate::progress::Counter::default();
    let spinner = (!json).then(|| crate::progress::Spinner::bytes("scrubbing", "checked", &checked, Duration::ZERO));
    loop {
        let mut l = command("scrub.step");
        add(&mut l, "max_blocks", Value::U64(2048))?;
        if first {
            // Resumes where it stopped; a finished one (or --restart) starts again.
            let state = call(t, {
                let mut s = command("scrub.step");
                add(&mut s, "max_blocks", Value::U64(1))?;
                s
            })?;
            let again = restart || state.get_bool("done") == Some(true);
            add(&mut l, "restart", Value::Bool(again))?;
            first = false;
        }
        let st = call(t, l)?;
        let blocks = st.get_u64("blocks").unwrap_or(0);
        checked.add((blocks * 4096).saturating_sub(checked.get()));
        if st.get_bool("done") == Some(true) {
            if let Some(s) = spinner {
                s.done();
            }
            return report(&st, started.elapsed(), json);
        }
        // Leaves the server to its clients between steps.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn report(st: &NvList, took: Duration, json: bool) -> Result<bool> {
    let blocks = st.get_u64("blocks").unwrap_or(0);
    let bad = match st.get("bad") {
        Some(Value::Lists(b)) => b.clone(),
        _ => Vec::new(),
    };
    let more = st.get_u64("more_bad").unwrap_or(0);
    let repaired = st.get_u64("repaired").unwrap_or(0);
    let fixed = match st.get("fixed") {
        Some(Value::Strs(f)) => f.clone(),
        _ => Vec::new(),
    };
    let nodes = st.get_u64("nodes").unwrap_or(0);
    if json {
        let items: Vec<serde_json::Value> = bad
            .iter()
            .map(|b| {
                serde_json::json!({
                    "dataset": b.get_str("dataset").unwrap_or(""),
                    "inode": b.get_u64("ino").unwrap_or(0),
                    "path": b.get_str("path"),
                    "problem": b.get_str("what").unwrap_or(""),
                    "repaired": false,
                })
            })
            .collect();
        let j = serde_json::json!({
            "blocks": blocks, "bytes": blocks * 4096, "seconds": took.as_secs_f64(),
            "metadata_copies_checked": nodes, "repaired_count": repaired, "repaired": fixed,
            "unrepaired": items, "more_unrepaired": more,
        });
        println!("{j}");
    } else {
        println!(
            "scrubbed {} MiB ({blocks} data blocks, {nodes} metadata copies) in {:.1} s: {repaired} repaired, {} not repairable",
            (blocks * 4096) >> 20,
            took.as_secs_f64(),
            bad.len() as u64 + more
        );
        for f in &fixed {
            println!("  repaired: {f}");
        }
        for b in &bad {
            let at =
                b.get_str("path").map_or_else(|| format!("inode {}", b.get_u64("ino").unwrap_or(0)), str::to_string);
            println!("  {}:{at}: {}", b.get_str("dataset").unwrap_or("?"), b.get_str("what").unwrap_or(""));
        }
    }
    Ok(!bad.is_empty() || more > 0)
}
