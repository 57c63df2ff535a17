//! `crest`, the one binary: `mkfs`, `fsck`, `serve`, `mount`, `umount`, and the mount
//! helper `mount.fuse.crest` (the same binary under that name). Output is for people by
//! default and JSON with `--json`; exit codes follow mkfs(8), fsck(8) and mount(8), since
//! scripts and fstab treat crest as they treat those (see `exit`).

mod bench;
mod config;
mod daemons;
mod dataset;
mod helpfiles;
mod logging;
mod mount;
mod mount_metrics;
mod mountinfo;
mod objects;
mod progress;
mod renew;
mod repair;
mod sendrecv;
mod share;
mod signature;
mod stats;
mod status;
mod systemd;
mod trust;
mod version;

use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use crest_store::{check, DiskIo, FileDisk, MkfsOptions, Store, Timespec};

/// Exit codes.
mod exit {
    /// Every command: success; fsck: clean.
    pub const OK: u8 = 0;
    /// mkfs, serve (mkfs(8)): failure.
    pub const FAILURE: u8 = 1;
    /// fsck --repair (fsck(8)): errors corrected, none left.
    pub const FSCK_CORRECTED: u8 = 1;
    /// Usage error, except for fsck and the mount helper (clap's convention).
    pub const USAGE: u8 = 2;
    /// fsck(8): file system errors left uncorrected.
    pub const FSCK_UNCORRECTED: u8 = 4;
    /// fsck(8): operational error (the image cannot be opened or read, or is no crest image).
    pub const FSCK_OPERATIONAL: u8 = 8;
    /// fsck(8): usage or syntax error.
    pub const FSCK_USAGE: u8 = 16;
    /// mount(8): incorrect invocation (the mount helper's usage errors).
    pub const MOUNT_USAGE: u8 = 1;
    /// mount(8): mount failure (`crest mount`, `crest umount`, the mount helper).
    pub const MOUNT_FAILURE: u8 = 32;
}

/// What `crest --help` says after the commands: how to make crest say more or less, and
/// where the other ways in are.
const AFTER_HELP: &str = "\
Logs: warnings and errors go to standard error; -q logs errors only, -v, -vv and -vvv add
crest's info, debug and trace lines. --log-file PATH appends them to PATH instead (mode
0600). Colour codes only on a terminal (none with NO_COLOR set); under systemd, lines carry
journald priorities and no timestamps. CREST_LOG, filter directives as tracing's EnvFilter
reads them (CREST_LOG=debug, CREST_LOG=crest_server=debug,fuser=info), wins over -v and
-q. A background mount logs to log/ in the state directory, or to --log-file.

crest --version names the commit, the protocol and the on-disk format. Shell completions:
crest completions SHELL; man pages: crest man DIR (docs/operations.md).";

#[derive(Parser, Debug)]
#[command(
    name = "crest",
    version = version::short(),
    long_version = version::long(),
    about = "A coherent remote file system",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: logging::LogArgs,
    /// Where this host keeps its credentials (CA, certificates, tokens): default
    /// $CREST_STATE_DIR, else /var/lib/crest for root, else ~/.local/state/crest.
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// The configuration file (docs/operations.md): keys for serve, mount and the logs,
    /// under the flags given here. Default /etc/crest/crest.toml, if it exists.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new, empty crest file system on an image file or block device.
    Mkfs {
        /// Image file (created sparse if missing) or block device.
        image: PathBuf,
        /// Size of a new image file, e.g. 20G, 512M, 65536K or plain bytes.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Overwrite what the image holds (another file system, swap, a partition table,
        /// data); its signatures are wiped first. Without it mkfs refuses anything but an
        /// empty or all-zero image.
        #[arg(long)]
        force: bool,
        /// Copies of every tree node and superblock: 2 (DUP: a bad copy is read from
        /// and repaired by its twin) or 1.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
        metadata_copies: u8,
        /// On-disk format version: 3 (the default: small commits are made durable with one
        /// flush), or 2 for an image that crest releases before format 3 can also open
        /// (`crest upgrade` moves it on later).
        #[arg(long, default_value_t = crest_store::superblock::FORMAT_VERSION,
              value_parser = clap::value_parser!(u32).range(2..=3))]
        format_version: u32,
        /// Keep big files' data as objects in an S3-compatible store, `s3://BUCKET[/PREFIX]`
        /// (docs/operations.md); the image keeps the metadata and small files. No keys
        /// here: the server reads them from AWS_* variables.
        #[arg(long, value_name = "URL")]
        data: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move an image (not being served) to this crest's on-disk format: from version 2 to
    /// 3, whose commits of small changes need one flush instead of two (fsync is faster).
    /// Crest releases that read only version 2 refuse the image afterwards.
    Upgrade {
        /// Image file or block device.
        image: PathBuf,
    },
    /// Serve an image to crest clients (until SIGTERM or SIGINT, then commit and exit).
    Serve {
        /// Image file or block device (locked: one server per image).
        image: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = DEFAULT_LISTEN)]
        listen: String,
        /// Commit at least this often (milliseconds).
        #[arg(long, default_value_t = 5000)]
        commit_interval_ms: u64,
        /// How the image is written: uring (io_uring: queued writes, commit batches
        /// submitted together with O_DIRECT; the default, fastest measured; falls back to
        /// pool where io_uring is unavailable), pool (commit batches written by a few
        /// threads) or sync (one call at a time).
        #[arg(long, value_enum, default_value_t = DiskIoArg::Uring)]
        disk_io: DiskIoArg,
        /// Plaintext, no authentication: for benchmarks and tests, loopback addresses
        /// only. Without it every connection is mutual TLS (docs/security.md).
        #[arg(long)]
        insecure: bool,
        /// Most sessions (mounts) one client certificate holds at once (all of
        /// `--insecure`'s clients count as one).
        #[arg(long, default_value_t = crest_serve::MAX_SESSIONS_PER_IDENTITY, value_parser = clap::value_parser!(usize))]
        max_sessions_per_client: usize,
        /// Answer Prometheus scrapes at http://ADDR/metrics (what `crest status` shows;
        /// plain HTTP: keep it on loopback or a monitoring network).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Threads for the connections (TLS, framing, encoding), apart from the store's
        /// one thread; 0 runs them on the store's thread. The default is 0 on two cores
        /// or fewer, else one per further core up to 4.
        #[arg(long, value_name = "N", default_value_t = crest_serve::default_io_threads(),
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_IO_THREADS as u64))]
        io_threads: usize,
        /// Reads of at least this many bytes run on threads beside the store's (the
        /// copy and the checksums; the store's thread only plans them); 0: every read
        /// runs on the store's thread.
        #[arg(long, value_name = "BYTES", default_value_t = crest_serve::READS_ELSEWHERE_FROM)]
        reads_elsewhere_from: u64,
        /// (testing) Client certificates issued from now on live this many seconds (30 to
        /// a year) instead of a year: tests watch renewals happen.
        #[arg(long, hide = true, value_name = "SECS",
              value_parser = clap::value_parser!(u64).range(crest_tls::MIN_CLIENT_VALIDITY..=crest_tls::CLIENT_VALIDITY))]
        client_cert_lifetime: Option<u64>,
    },
    /// Mount a crest server on a directory (in the background unless --foreground).
    Mount {
        /// Server address: HOST[:PORT] (the port defaults to 7410, as for serve).
        addr: String,
        /// Directory to mount on.
        mountpoint: PathBuf,
        /// Mount options, comma-separated (ro, allow_other, noexec, remount, ...); an
        /// unknown one fails the mount. Mounts are nosuid,nodev unless suid/dev (through
        /// mount(8) or fstab: crest.suid/crest.dev) ask. As root, mounts of one server
        /// with the same options share one session (bind mounts of the first);
        /// own_session gives this one its own.
        #[arg(short = 'o')]
        options: Option<String>,
        /// Stay in the foreground (logs to stderr).
        #[arg(long, short = 'f')]
        foreground: bool,
        /// Seconds a file operation waits for an absent server before failing.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// (internal) Set by `crest mount` in its background daemon: stdout is a pipe on
        /// which to report "ok" once mounted, or why not.
        #[arg(long, hide = true, requires = "foreground")]
        ready_pipe: bool,
        /// (internal) The daemon's sharing key (`share.rs`): a later mount that agrees on
        /// it bind-mounts this daemon's mount instead of starting another.
        #[arg(long, hide = true, requires = "foreground")]
        share_key: Option<String>,
        /// (internal) Watch the bind mount on the mount point of the daemon with this pid.
        #[arg(long, hide = true, requires = "foreground")]
        bind_of: Option<u32>,
        /// (internal) The log file the daemon's stderr is: opened again on SIGHUP (after
        /// logrotate moved it).
        #[arg(long, hide = true, requires = "foreground")]
        log_path: Option<PathBuf>,
        /// Talk to a server run with --insecure (plaintext, no authentication); also
        /// `-o insecure`.
        #[arg(long)]
        insecure: bool,
        /// Join the server first with this token (from `crest token create` there),
        /// unless this host already joined it.
        #[arg(long)]
        token: Option<String>,
    },
    /// Join another host's crest server: redeem a token from `crest token create` there
    /// for a client certificate, kept for later mounts of ADDR.
    Join {
        /// Server address: HOST[:PORT].
        addr: String,
        /// The token.
        token: String,
    },
    /// Join tokens for other machines (run on the server's host).
    Token {
        #[command(subcommand)]
        cmd: trust::TokenCmd,
    },
    /// Client certificates this host's CA issued: list, revoke.
    Cert {
        #[command(subcommand)]
        cmd: trust::CertCmd,
    },
    /// Datasets of a running server: create, list, get, set, destroy.
    Dataset {
        #[command(subcommand)]
        cmd: dataset::DatasetCmd,
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, global = true, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long, global = true)]
        insecure: bool,
    },
    /// Snapshots of a running server's datasets: create, list, destroy.
    Snapshot {
        #[command(subcommand)]
        cmd: dataset::SnapshotCmd,
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, global = true, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long, global = true)]
        insecure: bool,
    },
    /// Measure a mounted file system (any: crest, NFS, a local disk) as a user sees it:
    /// big-file write/read throughput, small-file create/read/stat/delete rates, fsync,
    /// with latencies; a table, or JSON.
    Bench(bench::BenchArgs),
    /// Write a snapshot as a checksummed stream to standard output: whole, or with -i what
    /// changed since an older snapshot (to `crest receive` on another server).
    Send {
        /// The snapshot, DATASET@NAME.
        snapshot: String,
        /// Incremental from this older snapshot of the same dataset (@NAME or DATASET@NAME).
        #[arg(short = 'i')]
        base: Option<String>,
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long)]
        insecure: bool,
    },
    /// Apply a send stream from standard input: a full stream makes DATASET, an
    /// incremental one moves DATASET from the stream's base to its snapshot. A damaged or
    /// cut-short stream is refused and leaves DATASET as it was.
    Receive {
        /// The dataset to receive into.
        dataset: String,
        /// Roll DATASET back to its newest snapshot first if it changed since (discarding
        /// those changes).
        #[arg(short = 'F', long)]
        force: bool,
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long)]
        insecure: bool,
    },
    /// Read and check every copy of every superblock, tree node and data block of a
    /// running server's datasets and snapshots while clients work, rewriting a bad copy
    /// from a good one; resumes where the last one stopped. Exit 0 clean or all repaired,
    /// 4 problems left.
    Scrub {
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long)]
        insecure: bool,
        /// Start from the beginning even if the last scrub stopped halfway.
        #[arg(long)]
        restart: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// What a running server is doing: its sessions (client, certificate, dataset,
    /// connected), its commits and the operations it served since it started.
    Status {
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long)]
        insecure: bool,
        /// Instead of a server's view, this mount's own: its connection (session, protocol,
        /// calls waiting, changes not yet durable, reconnects) and its cache.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["server", "insecure"])]
        mount: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// With --mount: Prometheus's text format, for node_exporter's textfile collector.
        #[arg(long, requires = "mount", conflicts_with = "json")]
        prometheus: bool,
    },
    /// What a running server does each second: operations per second by kind with the
    /// server thread's mean time per request, commits and bytes written per second,
    /// sessions connected (as vmstat; until interrupted unless --count)
    Stats {
        /// The server (HOST[:PORT]; default: this host's).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: String,
        /// Talk to a server run with --insecure.
        #[arg(long)]
        insecure: bool,
        /// Seconds between lines (at least 0.1).
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many lines.
        #[arg(long)]
        count: Option<u64>,
        /// A JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Unmount a crest mount (refuses anything that is not a fuse.crest mount).
    Umount {
        /// The mount point.
        mountpoint: PathBuf,
        /// Lazy: detach the mount now even if it is busy, clean up when no longer in use.
        #[arg(short = 'l', long)]
        lazy: bool,
    },
    /// Check every checksum and structural invariant of an image (read-only unless
    /// --repair). Exit 0 clean, 1 repaired and now clean, 4 problems left, 8 the image
    /// cannot be read or is no crest image, 16 usage.
    Fsck {
        /// Image file or block device.
        image: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// First rewrite every bad copy of a superblock or tree node from its good twin
        /// (the image must not be served); what has no good copy is reported, never
        /// guessed.
        #[arg(long)]
        repair: bool,
    },
    /// Print the release, the git commit it was built from, and the protocol, on-disk
    /// format and send stream versions it speaks (as --version).
    Version {
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for SHELL to standard output (e.g. into
    /// /usr/share/bash-completion/completions/crest).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write a man page for crest and each of its commands into DIR (crest.1,
    /// crest-mount.1, ...; e.g. /usr/local/share/man/man1).
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
}

/// `crest serve --disk-io`: the image backend (benches/diskio.rs in crest-store measures them).
/// The configuration file names them as the flag does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum DiskIoArg {
    /// io_uring (crest_store::UringDisk).
    Uring,
    /// Synchronous calls, commit batches split over threads (crest_store::PoolDisk).
    Pool,
    /// Synchronous calls, one at a time (crest_store::FileDisk).
    Sync,
}

impl From<DiskIoArg> for DiskIo {
    fn from(a: DiskIoArg) -> DiskIo {
        match a {
            DiskIoArg::Uring => DiskIo::Uring,
            DiskIoArg::Pool => DiskIo::Pool,
            DiskIoArg::Sync => DiskIo::Sync,
        }
    }
}

/// Opens the image with the chosen backend; io_uring that cannot be set up (seccomp in a
/// container, `kernel.io_uring_disabled`, an old kernel) falls back to the pool.
fn open_disk(image: &Path, mut io: DiskIo) -> Result<Box<dyn crest_store::Disk>> {
    if io == DiskIo::Uring {
        if let Err(e) = crest_store::UringDisk::available() {
            tracing::warn!("{e}; using --disk-io pool instead");
            io = DiskIo::Pool;
        }
    }
    tracing::info!("{}: --disk-io {}", image.display(), io.name());
    io.open(image).with_context(|| format!("opening {}", image.display()))
}

/// Most connection threads `crest serve` starts (`--io-threads`).
const MAX_IO_THREADS: usize = 64;

/// Where `crest serve` listens unless told otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7410";

fn serve(
    image: &Path,
    listen: &str,
    commit_interval_ms: u64,
    disk_io: DiskIo,
    security: crest_serve::Security,
    options: crest_serve::Options,
    reread: &dyn Fn() -> Result<Reloaded, String>,
) -> Result<()> {
    crest_store::memory::keep_freed_buffers();
    // (An image of millions of inodes takes seconds to open: a terminal is shown it going.)
    let counted = progress::Counter::default();
    let disk = progress::Counted::new(open_disk(image, disk_io)?, &counted);
    let spinner = progress::Spinner::bytes(
        &format!("opening {}", image.display()),
        "read",
        &counted,
        std::time::Duration::from_secs(1),
    );
    let mut store = Store::open_keeping_orphans(Box::new(disk))
        .with_context(|| format!("opening the file system on {}", image.display()))?;
    spinner.done();
    store.set_policy(crest_store::CommitPolicy { interval_ms: commit_interval_ms, ..Default::default() });
    for n in store.open_notes() {
        tracing::warn!("{n}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let serving = crest_serve::start_with(store, listen, security, options)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        eprintln!("crest: serving {} on {}", image.display(), serving.local_addr);
        systemd::notify(&format!("READY=1\nSTATUS=serving {} on {}", image.display(), serving.local_addr));
        // (Fed only while the store task answers; never, without a systemd watchdog.)
        let every = systemd::watchdog_every();
        let mut watchdog = tokio::time::interval(every.unwrap_or(std::time::Duration::from_secs(3600)));
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => {
                    systemd::notify("RELOADING=1");
                    reload(&serving, reread);
                    systemd::notify("READY=1");
                }
                _ = watchdog.tick(), if every.is_some() => {
                    if serving.responsive(every.unwrap_or_default()).await {
                        systemd::notify("WATCHDOG=1");
                    } else {
                        tracing::error!("the store task does not answer: the watchdog is not fed");
                    }
                }
            }
        }
        systemd::notify("STOPPING=1");
        eprintln!("crest: shutting down: finishing requests and committing");
        let store = serving.shutdown().await.context("committing at shutdown")?;
        eprintln!("crest: {} closed cleanly at generation {}", image.display(), store.generation());
        Ok(())
    })
}

/// What a SIGHUP takes again from the configuration file (under the command line's flags,
/// as at start): the log level and the sessions one client may hold.
struct Reloaded {
    log: logging::LogArgs,
    sessions_per_client: usize,
}

/// Applies the configuration as it is now to the running server, and has it read the
/// export policies again (crest_serve::Reload). What cannot change live (the address, the
/// disk I/O, the log file, --metrics...) waits for a restart.
fn reload(serving: &crest_serve::Serving, reread: &dyn Fn() -> Result<Reloaded, String>) {
    match reread() {
        Ok(r) => {
            let log = logging::reload(&r.log).unwrap_or_else(|e| format!("unchanged ({e})"));
            let exports =
                match serving.reload(crest_serve::Reload { sessions_per_identity: Some(r.sessions_per_client) }) {
                    Ok(()) => "export policies read again".to_string(),
                    Err(e) => format!("export policies NOT reloaded, the previous ones stay in force: {e}"),
                };
            eprintln!("crest: reloaded: log {log}, {} sessions per client; {exports}", r.sessions_per_client);
        }
        Err(e) => eprintln!("crest: not reloaded (the server goes on as it was): {e}"),
    }
}

/// The command line `args` again, with the configuration file as it is now under it.
fn reread_serve(args: &[std::ffi::OsString]) -> Result<Reloaded, String> {
    use clap::{CommandFactory, FromArgMatches};
    let m = Cli::command().try_get_matches_from(args).map_err(|e| e.to_string())?;
    let mut cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
    let file = config::load(cli.config.as_deref()).map_err(|e| format!("{e:#}"))?;
    config::apply(&mut cli, &m, &file);
    match cli.command {
        Command::Serve { max_sessions_per_client, .. } => {
            Ok(Reloaded { log: cli.log, sessions_per_client: max_sessions_per_client })
        }
        _ => Err("not a serve command line".into()),
    }
}

/// `crest join`: says what it got.
fn join(state: &crest_tls::StateDir, addr: &str, token: &str) -> Result<()> {
    let addr = mount::parse_addr(addr)?;
    let name = trust::join(state, &addr, token)?;
    println!("crest: joined {addr} as {name:?}; mount it with: crest mount {addr} DIR");
    Ok(())
}

/// Parses sizes like `20G`, `512M`, `4k` or `1048576` (binary units).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    if digits.is_empty() {
        return Err(format!("size {s:?} does not start with a number"));
    }
    let n: u64 = digits.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => return Err(format!("unknown size unit {other:?} in {s:?} (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size {s:?} is too large"))
}

fn now() -> Timespec {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timespec::new(d.as_secs() as i64, d.subsec_nanos())
}

/// True if either superblock slot holds crest's magic (damaged or not): tells a damaged
/// crest image (fsck: errors, 4) from something else entirely (fsck: operational, 8).
fn looks_like_crest(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut magic = [0u8; 8];
    crest_store::limits::SUPERBLOCK_OFFSETS
        .iter()
        .any(|off| f.read_exact_at(&mut magic, off + 32).is_ok() && magic == crest_store::superblock::MAGIC)
}

/// Refuses (without `force`) an image that holds anything: another file system, swap, a
/// partition table, crest, or any data. With `force`, wipes those signatures first so
/// that blkid and mount stop seeing the old file system in what becomes crest.
fn check_overwrite(image: &Path, force: bool) -> Result<()> {
    let found = signature::detect(&signature::read_head(image)?);
    if found.is_empty() {
        return Ok(());
    }
    if !force {
        bail!("{} holds {}; pass --force to overwrite it", image.display(), found.join(" and "));
    }
    eprintln!("crest: overwriting {} on {} (--force)", found.join(" and "), image.display());
    signature::wipe(image)
}

/// `crest upgrade`: opens the image (locked, as a server would) and moves it to this
/// crest's on-disk format.
fn upgrade(image: &Path) -> Result<()> {
    let disk = FileDisk::open(image).with_context(|| format!("opening {}", image.display()))?;
    let mut store = Store::open(Box::new(disk)).with_context(|| format!("opening {}", image.display()))?;
    let from = store.format_version();
    if store.upgrade_format().with_context(|| format!("upgrading {}", image.display()))? {
        println!("{}: upgraded from on-disk format {from} to {}", image.display(), store.format_version());
    } else {
        println!("{}: already in on-disk format {from}", image.display());
    }
    Ok(())
}

fn mkfs(
    image: &Path,
    size: Option<u64>,
    force: bool,
    (meta_copies, version): (u8, u32),
    data: Option<&str>,
    json: bool,
) -> Result<()> {
    if let Some(url) = data {
        crest_store::fs::objects::parse_data_url(url).context("--data")?;
    }
    let exists = image.exists();
    // The image's lock first, before any byte is written (a wipe, a resize): an image a
    // server is serving is refused untouched.
    let opened = match (exists, size) {
        (true, _) => crest_store::disk::open_image(image),
        (false, Some(size)) => crest_store::disk::create_image(image, size),
        (false, None) => bail!("{} does not exist: give --size to create it", image.display()),
    };
    let (file, _) = opened.with_context(|| format!("opening {}", image.display()))?;
    if exists {
        check_overwrite(image, force)?;
        if let Some(size) = size.filter(|_| file.metadata().is_ok_and(|m| m.file_type().is_file())) {
            file.set_len(0)
                .and_then(|()| file.set_len(size))
                .with_context(|| format!("resizing {}", image.display()))?;
        }
    }
    let dev_size = crest_store::disk::device_size(&file).with_context(|| format!("sizing {}", image.display()))?;
    let disk = FileDisk::from_file(file, dev_size);
    Store::mkfs_in_format(Box::new(disk), &MkfsOptions { now: now(), fsid: None, seed: None, meta_copies }, version)
        .with_context(|| format!("creating a file system on {}", image.display()))?;
    let disk = FileDisk::open(image).with_context(|| format!("reopening {}", image.display()))?;
    let mut store = Store::open(Box::new(disk)).context("opening the new file system")?;
    if let Some(url) = data {
        store.set_data_store(url).context("recording the data URL")?;
        store.commit().context("recording the data URL")?;
    }
    let st = store.statfs();
    let fsid: String = store.fsid().iter().map(|b| format!("{b:02x}")).collect();
    if json {
        let v = serde_json::json!({
            "image": image.display().to_string(), "fsid": fsid,
            "block_size": st.block_size, "total_blocks": st.total_blocks, "free_blocks": st.free_blocks,
            "data": data,
        });
        println!("{v}");
    } else {
        println!(
            "created crest file system {fsid} on {}: {} blocks of {} bytes ({} MiB), {} free",
            image.display(),
            st.total_blocks,
            st.block_size,
            (st.total_blocks * u64::from(st.block_size)) >> 20,
            st.free_blocks
        );
        if let Some(url) = data {
            println!("file data of big files goes to {url}");
        }
    }
    Ok(())
}

/// Runs fsck (after `--repair`'s rewrites) and reports; returns the fsck(8) exit code.
/// With `json` exactly one JSON object goes to stdout whatever happens, so scripts can
/// always parse it.
fn fsck(image: &Path, json: bool, repair: bool) -> u8 {
    // (A repair that cannot even open the image leaves it to fsck to say what is wrong.)
    let (repaired, repair_error) = match repair.then(|| repair::repair(image)).transpose() {
        Ok(r) => (r, None),
        Err(e) => {
            if !json {
                eprintln!("crest: nothing repaired: {e:#}");
            }
            (None, Some(format!("{e:#}")))
        }
    };
    let fixed = repaired.as_ref().map_or(0, |r| r.repaired);
    let (code, report) = match fsck_report(image) {
        Ok(r) if r.is_clean() && fixed > 0 => (exit::FSCK_CORRECTED, r),
        Ok(r) if r.is_clean() => (exit::OK, r),
        Ok(r) => (exit::FSCK_UNCORRECTED, r),
        Err((code, e)) => {
            if json {
                let v = serde_json::json!({
                    "image": image.display().to_string(), "clean": false, "exit_code": code,
                    "error": format!("{e:#}"),
                });
                println!("{v}");
            } else {
                eprintln!("crest: {e:#}");
            }
            return code;
        }
    };
    if json {
        let v = serde_json::json!({
            "image": image.display().to_string(), "clean": report.is_clean(), "exit_code": code,
            "generation": report.generation, "problems": report.problems, "notes": report.notes,
            "inodes": report.inodes, "directories": report.directories, "nodes": report.nodes,
            "data_blocks": report.data_blocks, "used_blocks": report.used_blocks,
            "total_blocks": report.total_blocks,
            "repaired": repaired.as_ref().map(|r| r.fixed.clone()),
            "repaired_count": fixed, "repair_error": repair_error,
        });
        println!("{v}");
        return code;
    }
    if let Some(r) = &repaired {
        for f in &r.fixed {
            println!("repaired: {f}");
        }
        if r.repaired > r.fixed.len() as u64 {
            println!("repaired: {} more", r.repaired - r.fixed.len() as u64);
        }
    }
    for n in &report.notes {
        println!("note: {n}");
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
    println!(
        "{}: generation {}, {} inodes ({} directories), {} tree nodes, {} data blocks verified, {}/{} blocks used: {}",
        image.display(),
        report.generation,
        report.inodes,
        report.directories,
        report.nodes,
        report.data_blocks,
        report.used_blocks,
        report.total_blocks,
        if report.is_clean() { "clean".to_string() } else { format!("{} problems", report.problems.len()) }
    );
    code
}

/// The report, or the exit code and error when fsck could not run: a crest image with no
/// usable superblock is damage (4); an image that cannot be opened or read, or holds no
/// crest magic at all, is an operational error (8).
fn fsck_report(image: &Path) -> Result<check::Report, (u8, anyhow::Error)> {
    let op = |e: anyhow::Error| (exit::FSCK_OPERATIONAL, e);
    let file = std::fs::File::open(image).with_context(|| format!("opening {}", image.display())).map_err(op)?;
    let size = file_size(&file).with_context(|| format!("sizing {}", image.display())).map_err(op)?;
    let counted = progress::Counter::default();
    let disk = progress::Counted::new(ReadOnlyDisk { size, file }, &counted);
    let spinner =
        progress::Spinner::bytes(&format!("checking {}", image.display()), "read", &counted, progress::QUIET_FOR);
    let checked = check::fsck(Box::new(disk));
    spinner.done();
    let config = data_config_from_env().map_err(op)?;
    checked
        .map(|mut r| {
            objects::check(&mut r, config.as_ref());
            r
        })
        .map_err(|e| {
            let code = match e {
                crest_store::Error::BadImage(_) if looks_like_crest(image) => exit::FSCK_UNCORRECTED,
                _ => exit::FSCK_OPERATIONAL,
            };
            (code, anyhow::Error::new(e).context(format!("checking {}", image.display())))
        })
}

fn file_size(file: &std::fs::File) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        Ok(meta.len())
    } else {
        Ok(file.try_clone()?.seek(SeekFrom::End(0))?)
    }
}

/// fsck opens the image read-only and never writes.
struct ReadOnlyDisk {
    file: std::fs::File,
    size: u64,
}

impl crest_store::Disk for ReadOnlyDisk {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
    fn write_at(&mut self, offset: u64, _buf: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other(format!("fsck is read-only (write at {offset} refused)")))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn reader(&self, _offset: u64, _len: usize) -> std::io::Result<Option<crest_store::SharedReader>> {
        // (fsck reads on its own thread.)
        Ok(None)
    }
}

/// The arguments as clap should see them: called as `mount.fuse.crest` (mount(8) runs
/// `mount.fuse.crest SOURCE MOUNTPOINT [-o OPTIONS]` for `-t fuse.crest` and fstab), they
/// become `crest mount ...`.
fn arguments() -> (Vec<std::ffi::OsString>, bool) {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv0 = args.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default();
    let helper = argv0.ends_with("mount.fuse.crest") || argv0.ends_with("mount.crest");
    if helper {
        args.remove(0);
        // mount(8) may pass flags like -n (no mtab), -v (verbose), -s (sloppy) that
        // mean nothing here.
        args.retain(|a| a != "-n" && a != "-v" && a != "-s");
        args.splice(0..0, ["crest".into(), "mount".into()]);
    }
    (args, helper)
}

/// The exit code of a usage error: 16 for fsck (fsck(8)), 1 for the mount helper
/// (mount(8)), clap's 2 otherwise.
fn usage_exit(args: &[std::ffi::OsString], helper: bool) -> u8 {
    if helper {
        return exit::MOUNT_USAGE;
    }
    match args.iter().skip(1).find(|a| !a.to_string_lossy().starts_with('-')) {
        Some(sub) if sub == "fsck" => exit::FSCK_USAGE,
        _ => exit::USAGE,
    }
}

/// The exit code of a command that failed: mount(8)'s for mount and umount, fsck(8)'s
/// operational error for fsck, 1 for the rest (mkfs(8)).
fn failure_code(command: &Command) -> u8 {
    match command {
        Command::Mount { .. } | Command::Umount { .. } => exit::MOUNT_FAILURE,
        Command::Fsck { .. } => exit::FSCK_OPERATIONAL,
        _ => exit::FAILURE,
    }
}

/// The command line, with the configuration file under it (config.rs); on failure, says
/// why and returns the exit code. A broken file is a usage error: the command as given
/// cannot run, and nothing was started.
fn parse_cli(args: &[std::ffi::OsString], helper: bool) -> Result<Cli, u8> {
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command().try_get_matches_from(args).and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let (mut cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            // --help and --version are no errors (clap prints them to stdout).
            let code = if e.use_stderr() { usage_exit(args, helper) } else { exit::OK };
            let _ = e.print();
            return Err(code);
        }
    };
    match config::load(cli.config.as_deref()) {
        Ok(file) => config::apply(&mut cli, &matches, &file),
        Err(e) => {
            eprintln!("crest: {e:#}");
            return Err(usage_exit(args, helper));
        }
    }
    Ok(cli)
}

/// A server and a mount daemon outlive their terminal and are sent SIGHUP to reload
/// (`kill -HUP`): from the first instant of their lives the signal must not end them. The
/// server handles it once it serves (`serve`); until then it is ignored.
#[allow(unsafe_code)]
fn ignore_hangups() {
    // SAFETY: SIG_IGN runs no code of ours in a handler, and the process has one thread
    // here: nothing else is changing signal dispositions.
    if unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) } == libc::SIG_ERR {
        eprintln!("crest: cannot ignore SIGHUP: {}", std::io::Error::last_os_error());
    }
}

fn main() -> ExitCode {
    let (args, helper) = arguments();
    let cli = match parse_cli(&args, helper) {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    let Cli { command, log, state_dir, config } = cli;
    match command {
        Command::Serve { .. } => ignore_hangups(),
        // Blocked in every thread (they inherit it from this one, the only one yet): a
        // mount daemon's thread of its own takes it (`mount::reopen_log_on_hangup`); in
        // any other mount process it stays pending, harmless.
        Command::Mount { .. } => {
            let hup = nix::sys::signal::SigSet::from(nix::sys::signal::Signal::SIGHUP);
            if let Err(e) = hup.thread_block() {
                eprintln!("crest: cannot block SIGHUP: {e}");
            }
        }
        _ => {}
    }
    let failure = failure_code(&command);
    if let Err(e) = logging::init(&log) {
        eprintln!("crest: {e:#}");
        return ExitCode::from(failure);
    }
    let state = trust::state_dir(state_dir.as_ref());
    let result = match command {
        Command::Mkfs { image, size, force, metadata_copies, format_version, data, json } => {
            mkfs(&image, size, force, (metadata_copies, format_version), data.as_deref(), json)
        }
        Command::Upgrade { image } => upgrade(&image),
        Command::Fsck { image, json, repair } => return ExitCode::from(fsck(&image, json, repair)),
        Command::Mount {
            addr,
            mountpoint,
            options,
            foreground,
            timeout,
            ready_pipe,
            share_key,
            bind_of,
            log_path,
            insecure,
            token,
        } => {
            if let Some(path) = log_path {
                mount::reopen_log_on_hangup(path);
            }
            let voice = if helper { mount::Voice::Helper } else { mount::Voice::Crest };
            let req = mount::Request {
                addr: &addr,
                mountpoint: &mountpoint,
                options: options.as_deref(),
                foreground,
                timeout,
                ready_pipe,
                share_key: share_key.as_deref(),
                bind_of,
                voice,
                insecure,
                token: token.as_deref(),
                state: &state,
                log: &log,
                config: config.as_deref(),
            };
            mount::mount(&req)
        }
        Command::Join { addr, token } => join(&state, &addr, &token),
        Command::Scrub { server, insecure, restart, json } => {
            let done = mount::parse_addr(&server).and_then(|addr| {
                let tls = trust::client_tls(&state, &addr, insecure)?;
                dataset::scrub(&dataset::Target { addr: &addr, tls }, restart, json)
            });
            return match done {
                Ok(false) => ExitCode::from(exit::OK),
                Ok(true) => ExitCode::from(4),
                Err(e) => {
                    eprintln!("crest: {e:#}");
                    ExitCode::from(failure)
                }
            };
        }
        Command::Bench(args) => bench::bench(&args),
        Command::Status { mount: Some(dir), json, prometheus, .. } => {
            let format = match (json, prometheus) {
                (true, _) => status::Format::Json,
                (_, true) => status::Format::Prometheus,
                _ => status::Format::Table,
            };
            status::mount_status(&dir, format)
        }
        Command::Status { server, insecure, json, mount: None, .. } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            let cert = if insecure { None } else { crest_tls::Held::joined(&state, &addr)? };
            status::status(&dataset::Target { addr: &addr, tls }, cert.as_ref(), json)
        }),
        Command::Stats { server, insecure, interval, count, json } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            let every = std::time::Duration::try_from_secs_f64(interval)
                .map_err(|_| anyhow::anyhow!("--interval {interval}: not a number of seconds"))?;
            stats::stats(&dataset::Target { addr: &addr, tls }, every, count, json)
        }),
        Command::Send { snapshot, base, server, insecure } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            sendrecv::send(&dataset::Target { addr: &addr, tls }, &snapshot, base.as_deref())
        }),
        Command::Receive { dataset, force, server, insecure } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            sendrecv::receive(&dataset::Target { addr: &addr, tls }, &dataset, force)
        }),
        Command::Snapshot { cmd, server, insecure } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            dataset::run_snapshot(&dataset::Target { addr: &addr, tls }, cmd)
        }),
        Command::Dataset { cmd, server, insecure } => mount::parse_addr(&server).and_then(|addr| {
            let tls = trust::client_tls(&state, &addr, insecure)?;
            dataset::run(&dataset::Target { addr: &addr, tls }, cmd)
        }),
        Command::Token { cmd } => trust::token(&state, cmd),
        Command::Cert { cmd } => trust::cert(&state, cmd),
        Command::Umount { mountpoint, lazy } => mount::umount(&mountpoint, lazy, &state),
        Command::Serve {
            image,
            listen,
            commit_interval_ms,
            disk_io,
            insecure,
            max_sessions_per_client,
            metrics,
            io_threads,
            reads_elsewhere_from,
            client_cert_lifetime,
        } => trust::server_security(&state, &listen, insecure, client_cert_lifetime).and_then(|security| {
            if io_threads > MAX_IO_THREADS {
                anyhow::bail!("io-threads {io_threads}: at most {MAX_IO_THREADS}");
            }
            let options = crest_serve::Options {
                sessions_per_identity: max_sessions_per_client,
                metrics,
                release: format!("crest {}", version::short()),
                image: image.display().to_string(),
                io_threads,
                reads_elsewhere_from: (reads_elsewhere_from > 0).then_some(reads_elsewhere_from),
                data: data_config_from_env()?,
                ..Default::default()
            };
            let reread = || reread_serve(&args);
            serve(&image, &listen, commit_interval_ms, disk_io.into(), security, options, &reread)
        }),
        Command::Version { json } => {
            version::print(json);
            Ok(())
        }
        Command::Completions { shell } => helpfiles::completions(shell),
        Command::Man { dir } => helpfiles::man_pages(&dir).map(|pages| {
            println!("crest: wrote {} man pages to {}", pages.len(), dir.display());
        }),
    };
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("crest: {e:#}");
            ExitCode::from(failure)
        }
    }
}

/// The data store's endpoint and keys from the standard AWS variables, else from the
/// configuration file's `[data]`, if the keys are set: AWS_ACCESS_KEY_ID,
/// AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL
/// (else AWS's own for the region), AWS_REGION or AWS_DEFAULT_REGION.
fn data_config_from_env() -> Result<Option<crest_serve::DataConfig>> {
    let file = config::DATA.get().cloned().unwrap_or_default();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let or_file = |v: Option<String>, f: &Option<String>| v.or_else(|| f.clone().filter(|x| !x.is_empty()));
    let key = or_file(env("AWS_ACCESS_KEY_ID"), &file.access_key_id);
    let secret = or_file(env("AWS_SECRET_ACCESS_KEY"), &file.secret_access_key);
    let (Some(key), Some(secret)) = (key, secret) else {
        return Ok(None);
    };
    let region = or_file(env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")), &file.region)
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = or_file(env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")), &file.endpoint)
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let token = or_file(env("AWS_SESSION_TOKEN"), &file.session_token);
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        anyhow::bail!("AWS_ENDPOINT_URL {endpoint:?}: not an http(s) URL");
    }
    Ok(Some(crest_serve::DataConfig { endpoint, region, key, secret, token }))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20G"), Ok(20 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_size("-5M").is_err());
    }
}
