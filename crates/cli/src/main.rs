//! `crest`, the one binary: the top of the data path for administrators. Today it
//! creates images (`mkfs`) and checks them (`fsck`); `serve` and `mount` arrive with the
//! server and client crates. Output is for people by default and JSON with `--json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use crest_store::{check, DiskIo, FileDisk, MkfsOptions, Store, Timespec};

#[derive(Parser, Debug)]
#[command(name = "crest", version, about = "crest: a coherent remote file system")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// Overwrite an existing crest file system.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
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
    },
    /// Mount a crest server on a directory (in the background unless --foreground).
    Mount {
        /// Server address (host:port).
        addr: String,
        /// Directory to mount on.
        mountpoint: PathBuf,
        /// Mount options, comma-separated (ro, allow_other, noexec, remount, ...).
        #[arg(short = 'o')]
        options: Option<String>,
        /// Stay in the foreground (logs to stderr).
        #[arg(long, short = 'f')]
        foreground: bool,
        /// Seconds a file operation waits for an absent server before failing.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Unmount a crest mount.
    Umount {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// Check every checksum and structural invariant of an image (read-only).
    Fsck {
        /// Image file or block device.
        image: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn mount(addr: &str, mountpoint: &Path, options: Option<&str>, foreground: bool, timeout: u64) -> Result<()> {
    let opts: Vec<String> = options.unwrap_or("").split(',').filter(|o| !o.is_empty()).map(str::to_string).collect();
    if opts.iter().any(|o| o == "remount") {
        // Options of a live FUSE mount are the kernel's business; accept the request.
        eprintln!("crest: {} remounted", mountpoint.display());
        return Ok(());
    }
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    if !foreground {
        return mount_in_background(addr, mountpoint, options, timeout);
    }
    let client_opts = crest_net::ClientOptions {
        client_name: format!("{}:{}", hostname(), mountpoint.display()),
        op_timeout: std::time::Duration::from_secs(timeout),
        ..Default::default()
    };
    let client = crest_net::Client::connect(addr, client_opts).with_context(|| format!("connecting to {addr}"))?;
    let mut mopts = crest_fuse::MountOptions { fsname: addr.to_string(), ..Default::default() };
    for o in opts {
        match o.as_str() {
            "ro" => mopts.read_only = true,
            "rw" => mopts.read_only = false,
            "allow_other" => mopts.allow_other = true,
            _ => mopts.extra.push(o),
        }
    }
    crest_fuse::mount_blocking(client, mountpoint, &mopts)
        .with_context(|| format!("mounting on {}", mountpoint.display()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "client".into())
}

fn is_mounted(mountpoint: &Path) -> bool {
    let Ok(canon) = mountpoint.canonicalize() else { return false };
    std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(&*canon.to_string_lossy())))
        .unwrap_or(false)
}

/// Re-runs `crest mount --foreground` detached (own process group, output to a log file)
/// and returns once the mount is there, or with the child's error.
fn mount_in_background(addr: &str, mountpoint: &Path, options: Option<&str>, timeout: u64) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the crest binary")?;
    let log_dir = std::env::temp_dir();
    let canon = mountpoint.canonicalize()?;
    let log = log_dir.join(format!("crest-mount{}.log", canon.display().to_string().replace('/', "_")));
    let log_file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg("--timeout").arg(timeout.to_string()).arg(addr).arg(&canon);
    if let Some(o) = options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .process_group(0)
        .spawn()
        .context("starting the mount process")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if is_mounted(&canon) {
            println!(
                "crest: {addr} mounted on {} (log: {}); unmount with: crest umount {}",
                canon.display(),
                log.display(),
                canon.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let msg = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("mount failed ({status}): {}", msg.trim());
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            bail!("mount did not appear within 20 s (log: {})", log.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn umount(mountpoint: &Path) -> Result<()> {
    let ok = std::process::Command::new("fusermount3").arg("-u").arg(mountpoint).status().is_ok_and(|s| s.success())
        || std::process::Command::new("umount").arg(mountpoint).status().is_ok_and(|s| s.success());
    if !ok {
        bail!("could not unmount {}", mountpoint.display());
    }
    Ok(())
}

/// `crest serve --disk-io`: the image backend (benches/diskio.rs in crest-store measures them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
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

/// Where `crest serve` listens unless told otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:7410";

fn serve(image: &Path, listen: &str, commit_interval_ms: u64, disk_io: DiskIo) -> Result<()> {
    let disk = open_disk(image, disk_io)?;
    let mut store =
        Store::open_keeping_orphans(disk).with_context(|| format!("opening the file system on {}", image.display()))?;
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
        let serving =
            crest_net::server::start(store, listen).await.with_context(|| format!("listening on {listen}"))?;
        eprintln!("crest: serving {} on {}", image.display(), serving.local_addr);
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("crest: shutting down: finishing requests and committing");
        let store = serving.shutdown().await.context("committing at shutdown")?;
        eprintln!("crest: {} closed cleanly at generation {}", image.display(), store.generation());
        Ok(())
    })
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

fn looks_like_crest(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    let mut magic = [0u8; 8];
    crest_store::limits::SUPERBLOCK_OFFSETS.iter().any(|off| {
        f.seek(SeekFrom::Start(off + 32)).is_ok()
            && f.read_exact(&mut magic).is_ok()
            && magic == crest_store::superblock::MAGIC
    })
}

fn mkfs(image: &Path, size: Option<u64>, force: bool, json: bool) -> Result<()> {
    let exists = image.exists();
    if exists && looks_like_crest(image) && !force {
        bail!("{} already holds a crest file system; pass --force to overwrite it", image.display());
    }
    let disk = match (exists, size) {
        (_, Some(size)) => FileDisk::create(image, size),
        (true, None) => FileDisk::open(image),
        (false, None) => bail!("{} does not exist: give --size to create it", image.display()),
    }
    .with_context(|| format!("opening {}", image.display()))?;
    Store::mkfs(Box::new(disk), &MkfsOptions { now: now(), fsid: None })
        .with_context(|| format!("creating a file system on {}", image.display()))?;
    let disk = FileDisk::open(image).with_context(|| format!("reopening {}", image.display()))?;
    let store = Store::open(Box::new(disk)).context("opening the new file system")?;
    let st = store.statfs();
    let fsid: String = store.fsid().iter().map(|b| format!("{b:02x}")).collect();
    if json {
        let v = serde_json::json!({
            "image": image.display().to_string(), "fsid": fsid,
            "block_size": st.block_size, "total_blocks": st.total_blocks, "free_blocks": st.free_blocks,
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
    }
    Ok(())
}

fn fsck(image: &Path, json: bool) -> Result<bool> {
    let file = std::fs::File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let disk = ReadOnlyDisk { size: file_size(&file)?, file };
    let report = check::fsck(Box::new(disk)).with_context(|| format!("checking {}", image.display()))?;
    if json {
        let v = serde_json::json!({
            "image": image.display().to_string(), "clean": report.is_clean(), "generation": report.generation,
            "problems": report.problems, "notes": report.notes, "inodes": report.inodes,
            "directories": report.directories, "nodes": report.nodes, "data_blocks": report.data_blocks,
            "used_blocks": report.used_blocks, "total_blocks": report.total_blocks,
        });
        println!("{v}");
    } else {
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
    }
    Ok(report.is_clean())
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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("CREST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    // Called as mount.fuse.crest by mount(8): SOURCE MOUNTPOINT [-o OPTIONS].
    let argv0 = std::env::args().next().unwrap_or_default();
    let cli = if argv0.ends_with("mount.fuse.crest") || argv0.ends_with("mount.crest") {
        let mut args: Vec<String> = std::env::args().skip(1).collect();
        // mount(8) may pass `-o opts` anywhere and flags like -n/-v we don't need.
        args.retain(|a| a != "-n" && a != "-v" && a != "-s");
        Cli::parse_from(std::iter::once("crest".to_string()).chain(std::iter::once("mount".to_string())).chain(args))
    } else {
        Cli::parse()
    };
    let result = match cli.command {
        Command::Mkfs { image, size, force, json } => mkfs(&image, size, force, json).map(|()| true),
        Command::Fsck { image, json } => fsck(&image, json),
        Command::Mount { addr, mountpoint, options, foreground, timeout } => {
            mount(&addr, &mountpoint, options.as_deref(), foreground, timeout).map(|()| true)
        }
        Command::Umount { mountpoint } => umount(&mountpoint).map(|()| true),
        Command::Serve { image, listen, commit_interval_ms, disk_io } => {
            serve(&image, &listen, commit_interval_ms, disk_io.into()).map(|()| true)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("crest: {e:#}");
            ExitCode::from(2)
        }
    }
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
