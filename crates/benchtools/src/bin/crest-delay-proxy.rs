//! `crest-delay-proxy --listen ADDR --connect ADDR --rtt-us 200`: a TCP proxy adding half of
//! the round trip to each direction, precise to microseconds (see `crest_benchtools::proxy`).
//! `crest-delay-proxy --self-test [--rtt-us 200]` measures how close the added round trip
//! comes to the requested one, against a raw TCP ping-pong on loopback.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use crest_benchtools::pingpong::{spawn_echo_server, PingPong};
use crest_benchtools::proxy::{DelayProxy, ProxyConfig, ProxyStats};
use crest_benchtools::stats::Summary;
use crest_benchtools::{size_label, tighten_timer_slack, Sizes};

/// A TCP proxy that adds a fixed, precise delay to each direction.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on (e.g. 127.0.0.1:7411).
    #[arg(long, required_unless_present = "self_test")]
    listen: Option<String>,
    /// Address to forward each connection to (e.g. 127.0.0.1:7410).
    #[arg(long, required_unless_present = "self_test")]
    connect: Option<String>,
    /// Emulated round trip in microseconds; half is added to each direction.
    #[arg(long, default_value_t = 200)]
    rtt_us: u64,
    /// Microseconds at the end of each wait spent spinning rather than sleeping.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Print counters and release lateness to stderr every N seconds (0: never).
    #[arg(long, default_value_t = 0)]
    stats_every: u64,
    /// Measure the proxy's added round trip against a raw TCP ping-pong and exit.
    #[arg(long)]
    self_test: bool,
    /// Self-test: round trips per message size.
    #[arg(long, default_value_t = 2000)]
    count: usize,
    /// Self-test: message sizes.
    #[arg(long, default_value = "4,64,1024")]
    sizes: Sizes,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tighten_timer_slack();
    let result = if args.self_test { self_test(&args) } else { run(&args) };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-delay-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config(args: &Args) -> ProxyConfig {
    let mut c = ProxyConfig::with_rtt(Duration::from_micros(args.rtt_us));
    c.spin = Duration::from_micros(args.spin_us);
    c
}

fn stats_line(s: &ProxyStats) -> String {
    let q = |q| s.lateness.quantile_us(q).map_or("-".to_string(), |v| v.to_string());
    format!(
        "connections={} bytes={} releases={} lateness_median_us={} lateness_p99_us={} lateness_max_us={:.1}",
        s.connections.load(std::sync::atomic::Ordering::Relaxed),
        s.bytes.load(std::sync::atomic::Ordering::Relaxed),
        s.lateness.count(),
        q(0.5),
        q(0.99),
        s.lateness.max().as_secs_f64() * 1e6
    )
}

fn run(args: &Args) -> Result<()> {
    let (Some(listen), Some(connect)) = (&args.listen, &args.connect) else {
        bail!("--listen and --connect are required");
    };
    let proxy = DelayProxy::start(listen.as_str(), connect.as_str(), config(args))
        .with_context(|| format!("proxy {listen} -> {connect}"))?;
    eprintln!(
        "crest-delay-proxy: {} -> {connect}, +{} us each way ({} us round trip)",
        proxy.local_addr(),
        args.rtt_us as f64 / 2.0,
        args.rtt_us
    );
    if args.stats_every > 0 {
        let stats = proxy.stats().clone();
        let every = Duration::from_secs(args.stats_every);
        std::thread::Builder::new().name("proxy-stats".into()).spawn(move || loop {
            std::thread::sleep(every);
            eprintln!("crest-delay-proxy: {}", stats_line(&stats));
        })?;
    }
    proxy.wait();
    bail!("the listener failed")
}

fn self_test(args: &Args) -> Result<()> {
    let echo = spawn_echo_server("127.0.0.1:0").context("echo server")?;
    let proxy = DelayProxy::start("127.0.0.1:0", echo, config(args)).context("proxy")?;
    let mut direct = PingPong::connect(echo).context("connecting to the echo server")?;
    let mut proxied = PingPong::connect(proxy.local_addr()).context("connecting through the proxy")?;
    println!(
        "delay proxy self-test: requested round trip {} us ({} us each way, spin {} us), {} round trips per size",
        args.rtt_us,
        args.rtt_us as f64 / 2.0,
        args.spin_us,
        args.count
    );
    println!(
        "{:>7} {:>12} {:>12} {:>12} {:>12} {:>12} {:>9}",
        "size", "raw med", "proxy med", "proxy p99", "added med", "error", "error %"
    );
    let warmup = (args.count / 10).max(10);
    for &size in &args.sizes.0 {
        let raw = Summary::of(&direct.run(size, warmup, args.count)?).context("no samples")?;
        let via = Summary::of(&proxied.run(size, warmup, args.count)?).context("no samples")?;
        let added = via.median_us - raw.median_us;
        let err = added - args.rtt_us as f64;
        println!(
            "{:>7} {:>9.1} us {:>9.1} us {:>9.1} us {:>9.1} us {:>+9.1} us {:>+8.1}%",
            size_label(size),
            raw.median_us,
            via.median_us,
            via.p99_us,
            added,
            err,
            100.0 * err / args.rtt_us.max(1) as f64
        );
    }
    println!("release lateness past due (per write): {}", stats_line(proxy.stats()));
    Ok(())
}
