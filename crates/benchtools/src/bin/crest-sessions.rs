//! What idle clients cost: `crest-sessions ADDR --server-pid PID --sessions 100,1000`.
//!
//! Opens sessions to a running server with the real client (`crest_net::Client`, one
//! connection and one session each, as a mount has), lets them idle, and measures the
//! server process meanwhile: its CPU (share of one core, from /proc/PID/stat) and its
//! resident memory (VmRSS) against what it used before the first session. Also this
//! process's own CPU over the idle window: what the clients' timers cost their host.
//! At each step every session must still answer a call (none was fenced).
//! One line per step: `crest-sessions sessions=… server_cpu_pct=… server_rss_mib=…
//! rss_per_session_kib=… clients_cpu_pct=…`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use crest_benchtools::Sizes;
use crest_net::{Client, ClientOptions};
use crest_proto::Op;

/// What idle sessions cost a server.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Server address.
    addr: String,
    /// The server's process id (its CPU and memory are read from /proc).
    #[arg(long)]
    server_pid: u32,
    /// Session counts to reach, in order (each step opens the difference).
    #[arg(long, default_value = "1,100,1000")]
    sessions: Sizes,
    /// Seconds each step idles while the server is measured.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Plaintext, for a server run with --insecure (else mutual TLS with this host's
    /// own certificate; a server admits at most 256 sessions of one certificate).
    #[arg(long)]
    insecure: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-sessions: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Clock ticks (user + system) process `pid` has used.
fn cpu_ticks(pid: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("process {pid}"))?;
    // The fields after the command name (in parentheses, which may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let field = |i: usize| -> Result<u64> { Ok(f.get(i).ok_or_else(|| anyhow!("short /proc/{pid}/stat"))?.parse()?) };
    Ok(field(11)? + field(12)?)
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow!("no VmRSS for {pid}"))?;
    Ok(line.split_whitespace().nth(1).ok_or_else(|| anyhow!("odd VmRSS line"))?.parse()?)
}

/// Share of one core process `pid` used over `idle`, measured from now.
fn cpu_share(pids: &[&str], idle: Duration) -> Result<Vec<f64>> {
    let before = pids.iter().map(|p| cpu_ticks(p)).collect::<Result<Vec<_>>>()?;
    let start = Instant::now();
    std::thread::sleep(idle);
    let secs = start.elapsed().as_secs_f64();
    let after = pids.iter().map(|p| cpu_ticks(p)).collect::<Result<Vec<_>>>()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().filter(|&h| h > 0).unwrap_or(100);
    Ok(before.iter().zip(&after).map(|(b, a)| (a - b) as f64 / hz as f64 / secs * 100.0).collect())
}

fn run(args: Args) -> Result<()> {
    let base = crest_benchtools::client_options(&args.addr, args.insecure)?;
    let server = args.server_pid.to_string();
    let me = std::process::id().to_string();
    // (A server just started still sets itself up: its first commit, its disk queues.)
    std::thread::sleep(Duration::from_secs(3));
    let base_rss = rss_kib(&server)?;
    let mut clients: Vec<Client> = Vec::new();
    let idle = Duration::from_secs(args.idle_secs);
    for &want in &args.sessions.0 {
        if want < clients.len() {
            bail!("session counts must rise ({want} after {})", clients.len());
        }
        while clients.len() < want {
            let opts = ClientOptions { client_name: format!("crest-sessions-{}", clients.len()), ..base.clone() };
            let c = Client::connect(&args.addr, opts)
                .with_context(|| format!("session {} of {want} to {}", clients.len() + 1, args.addr))?;
            clients.push(c);
        }
        // Settle (handshakes, first heartbeats), then measure the idle window.
        std::thread::sleep(Duration::from_secs(2));
        let shares = cpu_share(&[&server, &me], idle)?;
        let rss = rss_kib(&server)?;
        for (i, c) in clients.iter().enumerate() {
            c.call_one(Op::GetAttr { ino: 1 })
                .map_err(|e| anyhow!("session {} no longer answers: errno {}: {}", i + 1, e.errno, e.message))?;
        }
        let per = if want == 0 { 0.0 } else { rss.saturating_sub(base_rss) as f64 / want as f64 };
        println!(
            "crest-sessions sessions={want} server_cpu_pct={:.2} server_rss_mib={:.1} rss_per_session_kib={per:.1} \
             clients_cpu_pct={:.2} idle_secs={}",
            shares[0],
            rss as f64 / 1024.0,
            shares[1],
            args.idle_secs
        );
    }
    Ok(())
}
