//! A crest request's round trip through the crest client (`crest_net::Client`) against a
//! running server, directly or through `crest-delay-proxy`: `crest-rpc-ping ADDR`.
//!
//! Measures one request at a time: a getattr of the root (the smallest request), then
//! writes of 4 B, 64 B and 1 KiB (a request carrying that many data bytes) to a scratch
//! file in the root directory, then, with `--read-sizes`, reads of those sizes from 16 MiB
//! of it (block-aligned offsets walking the file); the file is removed at the end. One
//! line per kind: `crest-rpc op=write size_bytes=64 n=… median_us=… p99_us=… …`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use crest_benchtools::stats::Summary;
use crest_benchtools::Sizes;
use crest_net::Client;
use crest_proto::{Cred, FileType, Op, Reply};

/// crest request round trips.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Server (or proxy) address.
    addr: String,
    /// Write sizes.
    #[arg(long, default_value = "4,64,1024")]
    sizes: Sizes,
    /// Read sizes (none by default; e.g. 4K,64K,1024K).
    #[arg(long, default_value = "")]
    read_sizes: Sizes,
    /// Measured round trips per kind.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// Unmeasured round trips before each kind.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Plaintext, for a server run with --insecure (else mutual TLS with this host's
    /// own certificate, as `crest mount` uses on the server's host).
    #[arg(long)]
    insecure: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-rpc-ping: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn call(client: &Client, op: Op) -> Result<Reply> {
    client.call_one(op).map_err(|e| anyhow!("errno {}: {}", e.errno, e.message))
}

fn measure(client: &Client, warmup: usize, count: usize, op: impl Fn() -> Op) -> Result<Summary> {
    let mut samples = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let op = op();
        let t = Instant::now();
        call(client, op)?;
        let rtt: Duration = t.elapsed();
        if i >= warmup {
            samples.push(rtt);
        }
    }
    Summary::of(&samples).context("no round trips measured (--count 0?)")
}

fn run(args: Args) -> Result<()> {
    let opts = crest_benchtools::client_options(&args.addr, args.insecure)?;
    let client = Client::connect(&args.addr, opts).with_context(|| format!("connecting to {}", args.addr))?;
    let s = measure(&client, args.warmup, args.count, || Op::GetAttr { ino: 1 }).context("getattr")?;
    println!("crest-rpc op=getattr size_bytes=0 {s}");

    let name = format!(".crest-rpc-ping.{}", std::process::id()).into_bytes();
    let reply = call(
        &client,
        Op::Create {
            parent: 1,
            name: name.clone(),
            kind: FileType::Regular,
            mode: 0o600,
            rdev: 0,
            cred: Cred::default(),
        },
    )
    .context("creating the scratch file")?;
    let ino = match reply {
        Reply::Entry(attr) | Reply::Attr(attr) => attr.ino,
        other => bail!("unexpected reply to create: {other:?}"),
    };
    let result = (|| -> Result<()> {
        for &size in &args.sizes.0 {
            let data = vec![0xa5u8; size];
            let s = measure(&client, args.warmup, args.count, || Op::Write { ino, offset: 0, data: data.clone() })
                .with_context(|| format!("{size}-byte writes"))?;
            println!("crest-rpc op=write size_bytes={size} {s}");
        }
        if args.read_sizes.0.is_empty() {
            return Ok(());
        }
        const FILE: usize = 16 << 20;
        for at in (0..FILE).step_by(1 << 20) {
            let data: Vec<u8> = (0..1 << 20).map(|i| (at + i) as u8).collect();
            call(&client, Op::Write { ino, offset: at as u64, data }).context("writing the file to read")?;
        }
        for &size in &args.read_sizes.0 {
            let size = size.min(FILE);
            let next = std::cell::Cell::new(0usize);
            let s = measure(&client, args.warmup, args.count, || {
                let offset = next.get();
                next.set((offset + size.next_multiple_of(4096)) % (FILE - size + 1));
                Op::Read { ino, offset: (offset / 4096 * 4096) as u64, len: size as u32 }
            })
            .with_context(|| format!("{size}-byte reads"))?;
            println!("crest-rpc op=read size_bytes={size} {s}");
        }
        Ok(())
    })();
    let removed = call(&client, Op::Unlink { parent: 1, name }).context("removing the scratch file");
    result.and(removed.map(|_| ()))
}
