//! `crest mount`, `crest umount` and the `mount.fuse.crest` helper, behaving as mount(8)
//! and umount(8) users expect: mistakes in the address or options are reported before
//! anything starts, a mount is reported only once it exists (the background daemon says
//! so on a pipe), a peer that is no crest server is named as such, and `umount` touches
//! only crest mounts.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::mountinfo::{self, CREST_FSTYPE};

/// The port `crest serve` listens on by default, and so the one `crest mount host` uses.
pub fn default_port() -> u16 {
    crate::DEFAULT_LISTEN.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(7410)
}

/// Checks a server address and completes it: `host:port`, `host` (the default port),
/// `[v6]:port`, `[v6]` or a bare IPv6 address. Returns `host:port` as connect takes it.
pub fn parse_addr(addr: &str) -> Result<String> {
    let bad = |why: &str| anyhow!("bad server address {addr:?}: {why} (expected HOST[:PORT], e.g. server:7410)");
    if addr.is_empty() {
        return Err(bad("empty"));
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
        v6.parse::<std::net::Ipv6Addr>().map_err(|_| bad("not an IPv6 address in [ ]"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
        };
        (format!("[{v6}]"), port)
    } else if addr.matches(':').count() > 1 {
        // Several colons and no brackets: only a bare IPv6 address makes sense.
        let v6: std::net::Ipv6Addr = addr.parse().map_err(|_| bad("IPv6 addresses with a port go in [ ]"))?;
        (format!("[{v6}]"), None)
    } else {
        let (h, p) = match addr.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (addr, None),
        };
        let ok = !h.is_empty()
            && h.len() <= 253
            && h.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_'));
        if !ok {
            return Err(bad("the host name may hold only letters, digits, '.', '-' and '_'"));
        }
        (h.to_string(), p)
    };
    let port = match port {
        None => default_port(),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(bad(&format!("port {p:?} is not a number from 1 to 65535"))),
        },
    };
    Ok(format!("{host}:{port}"))
}

/// Splits `-o` options and checks their syntax (`name` or `name=value`, no blanks or
/// control characters): a typo must fail before a daemon starts. Which options crest
/// knows is crest-fuse's business (it warns about the others and goes on).
pub fn parse_options(options: Option<&str>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for o in options.unwrap_or("").split(',').filter(|o| !o.is_empty()) {
        let name = o.split_once('=').map_or(o, |(n, _)| n);
        let name_ok = !name.is_empty()
            && name.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'));
        if !name_ok || o.chars().any(|c| c.is_whitespace() || c.is_control()) {
            bail!(
                "bad mount option {o:?} in -o {:?}: options are NAME or NAME=VALUE, comma-separated",
                options.unwrap_or("")
            );
        }
        out.push(o.to_string());
    }
    Ok(out)
}

/// How `crest mount` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Voice {
    /// `crest mount`: says where it mounted.
    Crest,
    /// `mount.fuse.crest`: silent on success, like every mount(8) helper.
    Helper,
}

/// What `crest mount` was asked.
pub struct Request<'a> {
    pub addr: &'a str,
    pub mountpoint: &'a Path,
    pub options: Option<&'a str>,
    pub foreground: bool,
    pub timeout: u64,
    /// Set in the daemon `mount_in_background` starts: report readiness on stdout.
    pub ready_pipe: bool,
    /// Set in a daemon that others may share (`share.rs`): its sharing key.
    pub share_key: Option<&'a str>,
    /// Set in the watcher of a bind mount: the daemon whose mount it is.
    pub bind_of: Option<u32>,
    pub voice: Voice,
    /// Plaintext, for a server run `--insecure` (also `-o insecure`).
    pub insecure: bool,
    /// A join token to redeem first, unless this host joined the server already.
    pub token: Option<&'a str>,
    /// Where the credentials are.
    pub state: &'a crest_tls::StateDir,
    /// How much to log, and where (the background daemon logs alike).
    pub log: &'a crate::logging::LogArgs,
    /// `--config`, handed on to the background daemon so that it reads the same file.
    pub config: Option<&'a Path>,
}

/// Takes `KEY=VALUE` out of `opts` (the last one wins): `parse`'s value, or an error
/// saying `want` when one does not parse.
fn take_option<T>(
    opts: &mut Vec<String>,
    key: &str,
    want: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    let (mut found, mut err) = (None, None);
    opts.retain(|o| {
        let Some(v) = o.strip_prefix(key).and_then(|r| r.strip_prefix('=')) else { return true };
        match parse(v) {
            Some(t) => found = Some(t),
            None => err = Some(format!("bad mount option {o:?}: {key}={want}")),
        }
        false
    });
    match err {
        Some(e) => Err(anyhow!(e)),
        None => Ok(found),
    }
}

/// `-o timeout=SECONDS` (fstab's way to say `--timeout`), taken out of `opts`: how long
/// a file operation waits for an absent server before failing (ETIMEDOUT).
/// Takes every `flag` out of `opts`: true if there was one.
fn take_flag(opts: &mut Vec<String>, flag: &str) -> bool {
    let before = opts.len();
    opts.retain(|o| o != flag);
    opts.len() != before
}

fn take_timeout(opts: &mut Vec<String>) -> Result<Option<u64>> {
    take_option(opts, "timeout", "SECONDS, a whole number above 0", |v| v.parse::<u64>().ok().filter(|&t| t > 0))
}

/// `-o metrics=ADDR`, taken out of `opts`: where the mount's daemon answers Prometheus
/// scrapes (`mount_metrics.rs`).
fn take_metrics(opts: &mut Vec<String>) -> Result<Option<std::net::SocketAddr>> {
    take_option(opts, "metrics", "IP:PORT", |v| v.parse().ok())
}

/// `-o dataset=NAME`, taken out of `opts`: the dataset to mount (the server's default one
/// without it).
fn take_dataset(opts: &mut Vec<String>) -> Result<Option<String>> {
    take_option(opts, "dataset", "NAME", |v| {
        (!v.is_empty() && v.len() <= crest_proto::MAX_DATASET_NAME_BYTES).then(|| v.to_string())
    })
}

pub fn mount(req: &Request) -> Result<()> {
    let mut opts = parse_options(req.options)?;
    let timeout = take_timeout(&mut opts)?.unwrap_or(req.timeout);
    let dataset = take_dataset(&mut opts)?;
    let metrics = take_metrics(&mut opts)?;
    let insecure = take_flag(&mut opts, "insecure") || req.insecure;
    let own_session = take_flag(&mut opts, crate::share::OWN_SESSION);
    let unknown = crest_fuse::unknown_options(&opts);
    if !unknown.is_empty() {
        bail!(
            "unknown mount option{} {}: see `crest mount --help` (crest.suid and crest.dev ask \
             for setuid files and devices through mount(8), which keeps suid and dev from helpers)",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.iter().map(|o| format!("{o:?}")).collect::<Vec<_>>().join(", ")
        );
    }
    let req = &Request { timeout, insecure, ..*req };
    let addr = parse_addr(req.addr)?;
    if let Some(daemon) = req.bind_of {
        return watch_bind(daemon, req.mountpoint);
    }
    if opts.iter().any(|o| o == "remount") {
        remount(req.mountpoint, &opts)?;
        if req.voice == Voice::Crest {
            eprintln!("crest: {} remounted", req.mountpoint.display());
        }
        return Ok(());
    }
    let target = req.mountpoint.canonicalize().with_context(|| format!("mount point {}", req.mountpoint.display()))?;
    if !target.is_dir() {
        bail!("mount point {} is not a directory", req.mountpoint.display());
    }
    if let Some(m) = mountinfo::mount_at(&mountinfo::read()?, &target) {
        bail!("{} is already mounted ({} from {}); unmount it first", target.display(), m.fstype, m.source);
    }
    // An unknown host fails here, at once, rather than in the daemon.
    std::net::ToSocketAddrs::to_socket_addrs(&addr).with_context(|| format!("resolving {addr}"))?;
    if let Some(token) = req.token.filter(|_| !insecure) {
        if crest_tls::Credentials::joined(req.state, &addr)?.is_none() {
            let name = crate::trust::join(req.state, &addr, token)?;
            eprintln!("crest: joined {addr} as {name:?}");
        }
    }
    // (A failure is no reason not to mount: the certificate may be valid for months yet.
    // Not again in the daemon `crest mount` starts: its renewer looks at once, beside
    // the mount, which a server that does not answer would otherwise hold up.)
    if !insecure && !req.ready_pipe {
        crate::renew::before_mount(req.state, &addr);
    }
    // Missing credentials fail here too.
    let tls = crate::trust::client_tls(req.state, &addr, insecure)?;
    // Mounts agreeing on this share one daemon (not one asking for a session of its own,
    // nor one serving metrics of its own); only root may bind-mount.
    let shared = !own_session && metrics.is_none();
    let key = crate::share::key(&addr, dataset.as_deref(), insecure, req.timeout, req.state.path(), &opts);
    if shared && req.share_key.is_none() && nix::unistd::geteuid().is_root() {
        if let Some((daemon, dir, device)) =
            crate::share::find_daemon(req.state, &key, &fsname(&addr, dataset.as_deref()))
        {
            return share_mount(req, &addr, daemon, (&dir, &device), &target);
        }
    }
    if !req.foreground {
        return mount_in_background(&addr, &target, req, shared.then_some(key.as_str()));
    }
    let mut ready = if req.ready_pipe { Some(take_ready_pipe()?) } else { None };
    // (Bound before the mount: a port in use fails the mount, said on the pipe.)
    let metrics = match metrics.map(std::net::TcpListener::bind).transpose() {
        Ok(l) => l,
        Err(e) => {
            let e = anyhow!(e).context(format!("metrics at {}", metrics.map(|a| a.to_string()).unwrap_or_default()));
            if let Some(mut pipe) = ready {
                let _ = writeln!(pipe, "{e:#}");
            }
            return Err(e);
        }
    };
    let share = req.share_key.map(|k| (req.state, k));
    // A mount of a server this host joined keeps its certificate alive (`renew.rs`).
    let status = crest_fuse::StatusExtra::default();
    if tls.is_some() && crest_tls::Credentials::joined(req.state, &addr).is_ok_and(|c| c.is_some()) {
        crate::renew::spawn_keeper(req.state, &addr, status.clone());
    }
    let served = serve_mount(&addr, &target, (opts, dataset, metrics, status), (req.timeout, share), tls, &mut ready);
    if let (Err(e), Some(mut pipe)) = (&served, ready) {
        // The parent is waiting: it prints this and exits non-zero. The pipe may be
        // gone already (the parent died); the error still goes to the log.
        let _ = writeln!(pipe, "{e:#}");
    }
    served
}

/// The daemon's end of the readiness pipe: the parent hands it over as stdout. It is
/// taken as a descriptor of its own (close-on-exec), and stdout is pointed at the log
/// (stderr) so that nothing else holds the pipe open: neither a later print nor a child
/// such as fusermount3, which inherits stdout and lives as long as the mount.
fn take_ready_pipe() -> Result<std::fs::File> {
    use std::os::fd::AsFd;
    let fd = std::io::stdout().as_fd().try_clone_to_owned().context("taking the readiness pipe")?;
    nix::unistd::dup2_stdout(std::io::stderr()).context("pointing stdout at the log")?;
    Ok(std::fs::File::from(fd))
}

/// Connects, mounts, says "ok" on the readiness pipe once the kernel has the mount (and
/// closes it: the parent reads to its end), and serves until it is unmounted. Before
/// that, the pipe stays with the caller, to say what went wrong.
fn serve_mount(
    addr: &str,
    target: &Path,
    (opts, dataset, metrics, status): (
        Vec<String>,
        Option<String>,
        Option<std::net::TcpListener>,
        crest_fuse::StatusExtra,
    ),
    (timeout, share): (u64, Option<(&crest_tls::StateDir, &str)>),
    tls: Option<std::sync::Arc<crest_tls::ClientConfig>>,
    ready: &mut Option<std::fs::File>,
) -> Result<()> {
    let client_opts = crest_net::ClientOptions {
        client_name: format!("{}:{}", crate::trust::hostname(), target.display()),
        dataset: dataset.clone().unwrap_or_default(),
        op_timeout: Duration::from_secs(timeout),
        tls,
        ..Default::default()
    };
    let client = crest_net::Client::connect(addr, client_opts).map_err(|e| anyhow!(e))?;
    let fsname = fsname(addr, dataset.as_deref());
    // A snapshot never changes: the kernel refuses changes before they reach the server.
    let snapshot = dataset.as_deref().is_some_and(|d| d.contains('@'));
    let mut mopts = crest_fuse::MountOptions { fsname, read_only: snapshot, status, ..Default::default() };
    for o in opts {
        match o.as_str() {
            "ro" => mopts.read_only = true,
            "rw" => mopts.read_only = false,
            "allow_other" => mopts.allow_other = true,
            _ => mopts.extra.push(o),
        }
    }
    // spawn_mount returns once the mount exists (fuser's session is mounted then).
    let guard =
        crest_fuse::spawn_mount(client, target, &mopts).with_context(|| format!("mounting on {}", target.display()))?;
    // Other mounts of this host with the same key bind this one (`share.rs`): registered
    // before `crest mount` hears "ok", so a mount made the moment it returns finds it.
    let entry = share.and_then(|(state, key)| {
        crate::share::register(state, key, target)
            .inspect_err(|e| tracing::warn!("this mount will not be shared: {e:#}"))
            .ok()
    });
    if let Some(mut pipe) = ready.take() {
        // Best effort: a parent that died meanwhile changes nothing for the mount.
        let _ = pipe.write_all(b"ok\n");
    }
    tracing::info!("{addr} mounted on {}", target.display());
    if let Some(listener) = metrics {
        crate::mount_metrics::spawn(listener, target.to_path_buf());
    }
    let served = guard.join().with_context(|| format!("serving {}", target.display()));
    if let Some(entry) = entry {
        crate::share::unregister(&entry);
    }
    served
}

/// Where the background daemon of a mount logs: the `log` directory of the state
/// directory, closed to other users (a predictable name in a shared /tmp would let anyone
/// plant a link there and have root write through it).
fn log_path(state: &crest_tls::StateDir, target: &Path) -> Result<PathBuf> {
    let dir = state.create("log")?;
    Ok(dir.join(format!("crest-mount{}.log", target.display().to_string().replace('/', "_"))))
}

/// A fresh log file at `path`: the old one is removed, and the new one is created, never
/// opened through a link or over a file that appeared meanwhile.
fn create_log(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(anyhow!(e).context(format!("removing the old log {}", path.display())));
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

/// How long `crest mount` waits for its daemon's word: a connect gives up after 10 s
/// (ClientOptions::connect_timeout), a handshake after 10 s more.
const READY_WAIT: Duration = Duration::from_secs(60);

/// Re-runs `crest mount --foreground` detached (own process group, log file as stderr:
/// `--log-file`, appended to, or a fresh one in the state directory), its stdout a pipe
/// on which it writes "ok" once the kernel has the mount or why it failed; returns when
/// that word comes (or the daemon dies without one). The daemon logs at this command's
/// level, and without colour codes (its stderr is no terminal).
fn mount_in_background(addr: &str, target: &Path, req: &Request, share_key: Option<&str>) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the crest binary")?;
    let (log, log_file) = open_daemon_log(req, target)?;
    // What the daemon writes starts here (a --log-file may hold older runs).
    let log_start = log_file.metadata().map_or(0, |m| m.len());
    let (reader, writer) = std::io::pipe().context("creating the readiness pipe")?;
    let mut cmd = std::process::Command::new(exe);
    // The mount point stays the last argument (tests find the daemon by it).
    cmd.arg("mount").arg("--foreground").arg("--ready-pipe").arg("--timeout").arg(req.timeout.to_string());
    if let Some(key) = share_key {
        cmd.arg("--share-key").arg(key);
    }
    cmd.arg("--log-path").arg(&log);
    cmd.arg("--state-dir").arg(req.state.path());
    cmd.args(req.log.level_args());
    // What the file said is among the flags above already; the daemon reads it again
    // for what is not (its [log] file), and must read this one, not the default.
    if let Some(config) = req.config {
        cmd.arg("--config").arg(config);
    }
    if req.insecure {
        cmd.arg("--insecure");
    }
    if let Some(o) = req.options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(addr).arg(target);
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(log_file)
        .process_group(0)
        .spawn()
        .context("starting the mount daemon")?;
    // Our copy of the write end must go, or the read below never sees the daemon die.
    drop(cmd);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // "ok" is one line; an error message is read to the end (the daemon exits).
        let mut reader = std::io::BufReader::new(reader);
        let mut word = String::new();
        let r = reader.read_line(&mut word).and_then(|_| {
            if word.trim() != "ok" {
                reader.read_to_string(&mut word)?;
            }
            Ok(word)
        });
        let _ = tx.send(r);
    });
    let word = match rx.recv_timeout(READY_WAIT) {
        Ok(r) => r.context("reading the mount daemon's readiness pipe")?,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no word from the mount daemon within {} s (log: {})", READY_WAIT.as_secs(), log.display());
        }
    };
    if word.trim() == "ok" {
        if req.voice == Voice::Crest {
            println!(
                "crest: {addr} mounted on {} (log: {}); unmount with: crest umount {}",
                target.display(),
                log.display(),
                shell_quote(&target.display().to_string())
            );
        }
        return Ok(());
    }
    // It failed: it said why, or died without a word (then its log says).
    let status = child.wait().context("waiting for the mount daemon")?;
    if !word.trim().is_empty() {
        bail!("{}", word.trim());
    }
    let msg = std::fs::read(&log).unwrap_or_default();
    let msg = String::from_utf8_lossy(msg.get(log_start as usize..).unwrap_or_default());
    bail!("the mount daemon exited ({status}) without mounting: {}", msg.trim())
}

/// Opens the daemon's log `path` again at each SIGHUP (blocked in every thread since
/// `main`: this thread takes it), as its standard error and output: after logrotate moved
/// the file, the daemon writes to a new one at the same path.
pub fn reopen_log_on_hangup(path: PathBuf) {
    use nix::sys::signal::{SigSet, Signal};
    let spawned = std::thread::Builder::new().name("log-reopen".into()).spawn(move || {
        let hup = SigSet::from(Signal::SIGHUP);
        while hup.wait().is_ok() {
            match crate::logging::open_log_file(&path) {
                Ok(mut file) => {
                    // Said in the file whatever the log level: why it starts here.
                    let _ = writeln!(file, "crest: SIGHUP: log file opened again (pid {})", std::process::id());
                    // (Replacing the descriptors is atomic: a line being written goes
                    // whole to one file or the other.)
                    let moved = nix::unistd::dup2_stderr(&file).and_then(|()| nix::unistd::dup2_stdout(&file));
                    if let Err(e) = moved {
                        tracing::warn!("SIGHUP: cannot write to {} again: {e}", path.display());
                    }
                }
                Err(e) => tracing::warn!("SIGHUP: cannot open the log again: {e:#}"),
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("SIGHUP will not reopen the log: {e}");
    }
}

/// What a mount of `addr` (and `dataset`) shows as its source in the mount table.
fn fsname(addr: &str, dataset: Option<&str>) -> String {
    match dataset {
        Some(d) => format!("{addr}/{d}"),
        None => addr.to_string(),
    }
}

/// The log of a background process for the mount at `target`: `--log-file` (appended
/// to), or a fresh one in the state directory.
fn open_daemon_log(req: &Request, target: &Path) -> Result<(PathBuf, std::fs::File)> {
    Ok(match &req.log.log_file {
        Some(path) => (path.clone(), crate::logging::open_log_file(path)?),
        None => {
            let path = log_path(req.state, target)?;
            let file = create_log(&path)?;
            (path, file)
        }
    })
}

/// Mounts `target` as a bind mount of the running daemon's mount at `dir` (`share.rs`),
/// then watches it: in the foreground here, else in a detached watcher process.
fn share_mount(req: &Request, addr: &str, daemon: u32, (dir, device): (&Path, &str), target: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    crate::share::bind(dir, target, device)?;
    let said = format!(
        "crest: {addr} mounted on {}, sharing the session of {} (daemon pid {daemon}); unmount with: crest umount {}",
        target.display(),
        dir.display(),
        shell_quote(&target.display().to_string())
    );
    if req.foreground {
        eprintln!("{said}");
        return crate::share::watch(daemon, target, device);
    }
    let started = (|| {
        let exe = std::env::current_exe().context("finding the crest binary")?;
        let (log, log_file) = open_daemon_log(req, target)?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("mount").arg("--foreground").arg("--bind-of").arg(daemon.to_string()).arg("--log-path").arg(log);
        cmd.arg("--state-dir").arg(req.state.path()).args(req.log.level_args());
        // (The mount point stays the last argument: `crest umount` waits for this process.)
        cmd.arg(addr).arg(target);
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .context("starting the bind mount's watcher")
    })();
    if let Err(e) = started {
        let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
        return Err(e);
    }
    if req.voice == Voice::Crest {
        println!("{said}");
    }
    Ok(())
}

/// The watcher of the bind mount at `mountpoint` of daemon `daemon`.
fn watch_bind(daemon: u32, mountpoint: &Path) -> Result<()> {
    let target = mountpoint.canonicalize().with_context(|| format!("mount point {}", mountpoint.display()))?;
    match mountinfo::mount_at(&mountinfo::read()?, &target) {
        Some(m) if m.fstype == CREST_FSTYPE => crate::share::watch(daemon, &target, &m.device),
        _ => bail!("{} is no crest mount to watch", target.display()),
    }
}

/// `s` quoted for a shell when it needs it (a mount point with spaces).
fn shell_quote(s: &str) -> String {
    if s.bytes().all(|c| c.is_ascii_alphanumeric() || b"/._-+:@%".contains(&c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Unmounts a crest mount (`lazy`: detach it now even if busy, as `umount -l`). Anything
/// that is not a fuse.crest mount is refused: `crest umount` must never take down a
/// tmpfs or a disk because of a wrong path.
pub fn umount(mountpoint: &Path, lazy: bool, state: &crest_tls::StateDir) -> Result<()> {
    let target = mountinfo::resolve(mountpoint)?;
    let Some(m) = mountinfo::mount_at(&mountinfo::read()?, &target) else {
        bail!("{} is not mounted", target.display());
    };
    if m.fstype != CREST_FSTYPE {
        bail!(
            "{} is a {} mount (from {}), not a crest one ({CREST_FSTYPE}); crest umount leaves it alone",
            target.display(),
            m.fstype,
            m.source
        );
    }
    let mut tries = Vec::new();
    for (tool, flag) in [("fusermount3", "-z"), ("umount", "-l")] {
        let mut cmd = std::process::Command::new(tool);
        if tool == "fusermount3" {
            cmd.arg("-u");
        }
        if lazy {
            cmd.arg(flag);
        }
        match cmd.arg("--").arg(&target).output() {
            Ok(out) if out.status.success() => {
                // (A lazy unmount leaves the daemon serving whoever still uses the mount,
                // and so does one that leaves a bind mount of it, `share.rs`; after the last
                // directory of a shared mount, its daemon ends, and the watcher of this
                // directory if it was a bind mount.)
                let others = mountinfo::read().is_ok_and(|ms| ms.iter().any(|x| x.device == m.device));
                let daemons: Vec<u32> = if lazy || others {
                    Vec::new()
                } else {
                    let shared = crate::share::daemon_of_device(state, &m.device);
                    crate::daemons::serving(&target).into_iter().chain(shared).collect()
                };
                for pid in crate::daemons::wait_ended(&daemons, crate::daemons::GOODBYE_WAIT) {
                    eprintln!(
                        "crest: the daemon of {} (pid {pid}) is still ending its session after {} s",
                        target.display(),
                        crate::daemons::GOODBYE_WAIT.as_secs()
                    );
                }
                return Ok(());
            }
            Ok(out) => tries.push(format!("{tool}: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => tries.push(format!("{tool}: {e}")),
        }
    }
    bail!("could not unmount {}: {}", target.display(), tries.join("; "))
}

/// `-o remount,…` of a live crest mount: the kernel keeps its flags (`ro` is enforced
/// there, EROFS before anything reaches the daemon), so they change with mount(2)'s
/// MS_REMOUNT; every flag not named keeps its current value (MS_REMOUNT sets them all).
fn remount(mountpoint: &Path, opts: &[String]) -> Result<()> {
    use nix::mount::MsFlags;
    use nix::sys::statvfs::{statvfs, FsFlags};
    let target = mountpoint.canonicalize().with_context(|| format!("mount point {}", mountpoint.display()))?;
    let Some(m) = mountinfo::mount_at(&mountinfo::read()?, &target) else {
        bail!("{} is not mounted", target.display());
    };
    if m.fstype != "fuse.crest" {
        bail!("{} is a {} mount, not crest's", target.display(), m.fstype);
    }
    let now = statvfs(&target).with_context(|| format!("statfs {}", target.display()))?.flags();
    let kept = [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ];
    // A mount sharing its file system with others (`share.rs`) changes only its own flags
    // (MS_BIND: the superblock's, `sync` among them, stay as they are for all of them).
    let shared = mountinfo::read()?.iter().filter(|x| x.device == m.device).count() > 1;
    let mut flags = if shared { MsFlags::MS_REMOUNT | MsFlags::MS_BIND } else { MsFlags::MS_REMOUNT };
    for (st, ms) in kept {
        if now.contains(st) {
            flags |= ms;
        }
    }
    for o in opts {
        let (on, off) = match o.as_str() {
            "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
            "async" => (MsFlags::empty(), MsFlags::MS_SYNCHRONOUS),
            "noatime" => (MsFlags::MS_NOATIME, MsFlags::MS_RELATIME | MsFlags::MS_STRICTATIME),
            "relatime" | "atime" => (MsFlags::MS_RELATIME, MsFlags::MS_NOATIME | MsFlags::MS_STRICTATIME),
            "strictatime" => (MsFlags::MS_STRICTATIME, MsFlags::MS_NOATIME | MsFlags::MS_RELATIME),
            "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
            "diratime" => (MsFlags::empty(), MsFlags::MS_NODIRATIME),
            _ => continue,
        };
        flags = (flags | on) & !off;
    }
    nix::mount::mount(Some(m.source.as_str()), &target, Some("fuse.crest"), flags, None::<&str>)
        .with_context(|| format!("remounting {}", target.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let p = |s: &str| parse_addr(s).map_err(|e| e.to_string());
        assert_eq!(p("server:7410").ok().as_deref(), Some("server:7410"));
        assert_eq!(p("127.0.0.1:1").ok().as_deref(), Some("127.0.0.1:1"));
        assert_eq!(p("server").ok(), Some(format!("server:{}", default_port())));
        assert_eq!(default_port(), 7410);
        assert_eq!(p("[::1]:99").ok().as_deref(), Some("[::1]:99"));
        assert_eq!(p("[::1]").ok().as_deref(), Some("[::1]:7410"));
        assert_eq!(p("fe80::1").ok().as_deref(), Some("[fe80::1]:7410"));
        for bad in
            ["", ":7410", "host:", "host:0", "host:65536", "host:x", "ho st:1", "a:b:c", "[::1", "[zz]:1", "[::1]x"]
        {
            assert!(p(bad).is_err(), "{bad:?} accepted");
        }
        assert!(p("host:99999").is_err_and(|e| e.contains("port \"99999\"")));
    }

    #[test]
    fn options() {
        assert_eq!(parse_options(None).ok(), Some(vec![]));
        assert_eq!(parse_options(Some("ro,,allow_other,x-systemd.automount,comment=a")).ok().map(|v| v.len()), Some(4));
        for bad in ["ro, rw", "=x", "ro,a b", "bad\u{7}"] {
            assert!(parse_options(Some(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/mnt/x"), "/mnt/x");
        assert_eq!(shell_quote("/mnt/a b"), "'/mnt/a b'");
        assert_eq!(shell_quote("/it's"), r"'/it'\''s'");
    }
}
