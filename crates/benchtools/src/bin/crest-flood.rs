//! `crest-flood MODE ADDR [--seconds N]`: one hostile load on a crest server run
//! `--insecure`, over the raw wire protocol (issue 43's findings 2, 3 and 5), until its
//! time is up or it is signalled; then one line of what it did. `crest-flood probe --dir D`
//! is the honest side: small operations on a mount, timed (`bench/hostile.sh` runs it
//! beside each flood).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use crest_benchtools::flood::{self, probe, FenceStorm, ParkedReads, Stop, Tally, Target};
use nix::sys::signal::{SigSet, Signal};

/// One hostile load on a crest server (or the honest probe beside it).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Stop after this many seconds (default: when signalled).
    #[arg(long, global = true)]
    seconds: Option<f64>,
    /// Once stopped, wait this long at most for what is in flight (2 s after a signal).
    #[arg(long, global = true, default_value_t = 180)]
    drain_secs: u64,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// The honest probe: create a file, write to it, close, stat, unlink, in a loop; each
    /// iteration timed (prints n, p50, p99 and max in ms, and stalls over 1 s).
    Probe {
        /// The directory to work in (on the mount under test; must exist).
        #[arg(long)]
        dir: PathBuf,
        /// Bytes written to each file.
        #[arg(long, default_value_t = 4096)]
        bytes: usize,
    },
    /// Reads parked behind another session's exclusive rights, then released together.
    ParkedReads {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// Reader sessions.
        #[arg(long, default_value_t = 2)]
        readers: usize,
        /// 4 MiB reads each reader parks a round.
        #[arg(long, default_value_t = 100)]
        reads: u64,
        /// Milliseconds the holder keeps them parked before it answers the recall.
        #[arg(long, default_value_t = 500)]
        hold_ms: u64,
    },
    /// Fallocate of a large range of a file (requests of `MAX_FALLOCATE_STEP`, 4 MiB), punched out
    /// again, repeatedly.
    Fallocate {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// MiB each fallocate allocates.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
    },
    /// Sessions that each make one change, then all drop their connections at once.
    FenceStorm {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// Sessions a round.
        #[arg(long, default_value_t = 255)]
        sessions: usize,
        /// Seconds from one round's start to the next.
        #[arg(long, default_value_t = 6.0)]
        every_secs: f64,
    },
    /// Exclusive rights on a directory whose recall is never answered.
    RecallHoard {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// The directory, a path below the dataset's root (e.g. the probe's directory).
        #[arg(long)]
        path: String,
    },
    /// Pipelined requests of many SetLock operations each, on one file.
    LockFlood {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// SetLock operations a request (at most `MAX_LOCK_OPS_PER_REQUEST`, 16).
        #[arg(long, default_value_t = 16)]
        ops: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 4)]
        depth: usize,
    },
    /// Pipelined requests of a small write and an fsync, on one file.
    FsyncFlood {
        /// Server address (HOST:PORT, run --insecure).
        addr: String,
        /// Bytes each write writes.
        #[arg(long, default_value_t = 4096)]
        bytes: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 4)]
        depth: usize,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let stop = Stop::new(args.seconds, Duration::from_secs(args.drain_secs));
    if let Err(e) = watch_signals(&stop) {
        eprintln!("crest-flood: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(args.mode, stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crest-flood: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT and SIGTERM stop the run (what is in flight gets 2 s, then the report); a
/// second one ends the process at once. Blocked in every thread, taken by one.
fn watch_signals(stop: &Stop) -> Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block().context("blocking signals")?;
    let stop = stop.clone();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Ok(sig) = set.wait() {
            eprintln!("crest-flood: {sig}: stopping");
            stop.signal();
        }
        if set.wait().is_ok() {
            std::process::exit(130);
        }
    })?;
    Ok(())
}

fn run(mode: Mode, stop: Stop) -> Result<()> {
    let mut tally = Tally::default();
    let (name, res) = match mode {
        Mode::Probe { dir, bytes } => {
            let r = probe::run(&dir, &stop, bytes)?;
            println!("{}", r.line());
            if let Some(e) = r.first_error {
                eprintln!("crest-flood probe: first error: {e}");
            }
            return Ok(());
        }
        Mode::ParkedReads { addr, readers, reads, hold_ms } => {
            let s = ParkedReads { readers, reads, hold: Duration::from_millis(hold_ms) };
            ("parked-reads", flood::parked_reads(&Target { addr, stop: stop.clone() }, s, &mut tally))
        }
        Mode::Fallocate { addr, mib } => {
            ("fallocate", flood::fallocate(&Target { addr, stop: stop.clone() }, mib, &mut tally))
        }
        Mode::FenceStorm { addr, sessions, every_secs } => {
            let s = FenceStorm { sessions, every: Duration::from_secs_f64(every_secs.max(0.0)) };
            ("fence-storm", flood::fence_storm(&Target { addr, stop: stop.clone() }, s, &mut tally))
        }
        Mode::RecallHoard { addr, path } => {
            ("recall-hoard", flood::recall_hoard(&Target { addr, stop: stop.clone() }, &path, &mut tally))
        }
        Mode::LockFlood { addr, ops, depth } => {
            ("lock-flood", flood::lock_flood(&Target { addr, stop: stop.clone() }, ops, depth, &mut tally))
        }
        Mode::FsyncFlood { addr, bytes, depth } => {
            ("fsync-flood", flood::fsync_flood(&Target { addr, stop: stop.clone() }, bytes, depth, &mut tally))
        }
    };
    // What it did, also when it stopped on an error.
    println!("{}", flood::report(name, &stop, &tally));
    if let Some(e) = &tally.first_error {
        eprintln!("crest-flood {name}: first failed operation: {e}");
    }
    res
}
