//! Raw TCP ping-pong, the floor for a request round trip:
//!
//! - `crest-tcp-pingpong --server ADDR` serves echo connections;
//! - `crest-tcp-pingpong --connect ADDR` pings an echo server (directly or through
//!   `crest-delay-proxy`);
//! - with neither, it starts an echo server in-process on loopback, and with `--rtt-us N`
//!   an in-process delay proxy in front of it.
//!
//! One line per message size: `tcp-pingpong size_bytes=4 n=… median_us=… p99_us=… …`.

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use crest_benchtools::pingpong::{serve_echo, spawn_echo_server, PingPong};
use crest_benchtools::proxy::{DelayProxy, ProxyConfig};
use crest_benchtools::stats::Summary;
use crest_benchtools::{tighten_timer_slack, Sizes};

/// Raw TCP ping-pong round trips.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Serve echo connections on this address and never exit.
    #[arg(long, conflicts_with = "connect")]
    server: Option<String>,
    /// Ping the echo server (or a proxy in front of it) at this address.
    #[arg(long)]
    connect: Option<String>,
    /// In-process mode only: put a delay proxy with this round trip in front of the server.
    #[arg(long, default_value_t = 0)]
    rtt_us: u64,
    /// Message sizes.
    #[arg(long, default_value = "4,64,1024")]
    sizes: Sizes,
    /// Measured round trips per size.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// Unmeasured round trips before each size.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-tcp-pingpong: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    if let Some(addr) = &args.server {
        let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        eprintln!("crest-tcp-pingpong: echo server on {}", listener.local_addr()?);
        serve_echo(listener).context("echo server")?;
        return Ok(());
    }
    tighten_timer_slack();
    let _proxy;
    let target = match &args.connect {
        Some(a) => a.clone(),
        None => {
            let echo = spawn_echo_server("127.0.0.1:0").context("echo server")?;
            if args.rtt_us > 0 {
                let p =
                    DelayProxy::start("127.0.0.1:0", echo, ProxyConfig::with_rtt(Duration::from_micros(args.rtt_us)))
                        .context("proxy")?;
                let a = p.local_addr().to_string();
                _proxy = p;
                a
            } else {
                echo.to_string()
            }
        }
    };
    let mut pp = PingPong::connect(target.as_str()).with_context(|| format!("connecting to {target}"))?;
    for &size in &args.sizes.0 {
        let samples = pp.run(size, args.warmup, args.count).with_context(|| format!("{size}-byte round trips"))?;
        let s = Summary::of(&samples).context("no round trips measured (--count 0?)")?;
        println!("tcp-pingpong size_bytes={size} {s}");
    }
    Ok(())
}
