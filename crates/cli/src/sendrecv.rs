//! `crest send` and `crest receive`: a snapshot as a checksummed stream on standard output,
//! and such a stream applied to a dataset of another (or the same) server, as `zfs send`
//! and `zfs receive` do. The stream passes through this process in parts of about two
//! megabytes; the servers do the work (docs/protocol.md §5, docs/format.md §9).

use std::io::{IsTerminal, Read, Write};

use anyhow::{anyhow, bail, Context, Result};
use crest_nvlist::{NvList, Value};

use crate::dataset::{add, call, command, Target};
use crate::progress;

/// Bytes of stream one call asks for or carries (the most a server takes).
const PART_BYTES: usize = 2 << 20;

/// Writes the stream of `snapshot` (incremental from `base`: `@NAME` or `DATASET@NAME`)
/// to standard output.
pub fn send(t: &Target, snapshot: &str, base: Option<&str>) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    if stdout.is_terminal() {
        bail!("a send stream is binary: redirect it to a file or pipe it to crest receive");
    }
    let Some((dataset, _)) = snapshot.split_once('@') else { bail!("{snapshot}: DATASET@SNAPSHOT") };
    let base = base.map(|b| if b.starts_with('@') { format!("{dataset}{b}") } else { b.to_string() });
    let mut cursor = Vec::new();
    let mut sent = 0u64;
    let counted = progress::Counter::default();
    let spinner = progress::Spinner::bytes(&format!("sending {snapshot}"), "sent", &counted, progress::QUIET_FOR);
    loop {
        let mut l = command("send");
        add(&mut l, "snapshot", Value::Str(snapshot.to_string()))?;
        if let Some(b) = &base {
            add(&mut l, "base", Value::Str(b.clone()))?;
        }
        add(&mut l, "cursor", Value::Bytes(std::mem::take(&mut cursor)))?;
        add(&mut l, "budget", Value::U64(PART_BYTES as u64))?;
        let answer = call(t, l)?;
        let data = bytes_of(&answer, "data")?;
        stdout.write_all(data).context("writing the stream")?;
        sent += data.len() as u64;
        counted.add(data.len() as u64);
        cursor = bytes_of(&answer, "cursor")?.to_vec();
        if answer.get_bool("done") == Some(true) {
            break;
        }
    }
    stdout.flush().context("writing the stream")?;
    spinner.done();
    if std::io::stderr().is_terminal() {
        eprintln!("crest: sent {snapshot} ({sent} bytes)");
    }
    Ok(())
}

fn bytes_of<'a>(l: &'a NvList, name: &str) -> Result<&'a [u8]> {
    match l.get(name) {
        Some(Value::Bytes(b)) => Ok(b),
        _ => Err(anyhow!("the server's answer has no {name}")),
    }
}

/// Fills `buf` from `r` as far as it can; the bytes read (0 at the end).
fn read_part(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Applies the stream on standard input to `dataset`; prints the snapshot it made.
pub fn receive(t: &Target, dataset: &str, force: bool) -> Result<()> {
    let mut stdin = std::io::stdin().lock();
    if stdin.is_terminal() {
        bail!("no stream on standard input: pipe crest send into it, or redirect a file");
    }
    let mut l = command("receive.start");
    add(&mut l, "name", Value::Str(dataset.to_string()))?;
    add(&mut l, "force", Value::Bool(force))?;
    let token = call(t, l)?.get_u64("token").ok_or_else(|| anyhow!("the server gave no receive token"))?;
    let mut buf = vec![0u8; PART_BYTES];
    let mut seq = 0u64;
    let counted = progress::Counter::default();
    let spinner = progress::Spinner::bytes(&format!("receiving {dataset}"), "received", &counted, progress::QUIET_FOR);
    loop {
        let n = match read_part(&mut stdin, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                abort(t, token);
                return Err(anyhow!("reading the stream: {e}; nothing received"));
            }
        };
        if n == 0 {
            break;
        }
        let mut l = command("receive.chunk");
        add(&mut l, "token", Value::U64(token))?;
        add(&mut l, "seq", Value::U64(seq))?;
        add(&mut l, "data", Value::Bytes(buf[..n].to_vec()))?;
        // (A refused chunk has undone the receive on the server already.)
        call(t, l).with_context(|| format!("{dataset}: nothing received"))?;
        seq += 1;
        counted.add(n as u64);
    }
    spinner.done();
    let mut l = command("receive.finish");
    add(&mut l, "token", Value::U64(token))?;
    let answer = call(t, l).with_context(|| format!("{dataset}: nothing received"))?;
    let snap = answer.get_str("snapshot").unwrap_or("?");
    println!("received {snap}");
    Ok(())
}

fn abort(t: &Target, token: u64) {
    let mut l = command("receive.abort");
    if add(&mut l, "token", Value::U64(token)).is_ok() {
        let _ = call(t, l);
    }
}
