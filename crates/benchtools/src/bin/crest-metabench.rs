//! `crest-metabench DIR --count 10000`: creates, stats and unlinks `count` files in one
//! directory and prints each phase's rate: `metabench phase=create n=… secs=… ops_per_s=…`.
//! `--phase` runs one phase only (so a script can remount or drop caches between them).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use crest_benchtools::metabench::{run_phase, Phase};

/// Metadata operations in one directory.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The directory (must exist; files f000000…, after `--prefix`, are created in it).
    dir: PathBuf,
    /// Files per phase.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// create, stat, unlink or all (in that order).
    #[arg(long, default_value = "all")]
    phase: String,
    /// End the create and unlink phases with a syncfs (timed), like `sync -f`.
    #[arg(long)]
    sync: bool,
    /// What the file names start with (several runs in one directory take one each).
    #[arg(long, default_value = "")]
    prefix: String,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-metabench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let phases = if args.phase == "all" {
        vec![Phase::Create, Phase::Stat, Phase::Unlink]
    } else {
        vec![Phase::parse(&args.phase).with_context(|| format!("unknown phase {:?}", args.phase))?]
    };
    for phase in phases {
        let sync = args.sync && phase != Phase::Stat;
        let took = run_phase(&args.dir, &args.prefix, phase, args.count, sync).with_context(|| phase.name())?;
        let secs = took.as_secs_f64();
        println!(
            "metabench phase={} n={} secs={secs:.3} ops_per_s={:.0}",
            phase.name(),
            args.count,
            args.count as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
