//! Where crest's log lines go and how they look. Every command takes `-v`/`-q` (which
//! lines) and `--log-file` (where); `CREST_LOG`, an `EnvFilter` directive string, wins
//! over both. Lines carry colour codes only when they go to a terminal: a file, a pipe or
//! a background mount's log must stay greppable. Under systemd (stderr is the journal, as
//! `JOURNAL_STREAM` says) a line is its message with a syslog priority prefix: journald
//! stamps the time itself and files the line under that priority.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable whose filter directives override `-v` and `-q`.
pub const ENV: &str = "CREST_LOG";

/// The logging flags every command takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log more of crest's lines: -v info, -vv debug, -vvv trace (default: warnings
    /// and errors).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Log errors only.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Append log lines to PATH (created with mode 0600) instead of standard error.
    #[arg(long, global = true, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

impl LogArgs {
    /// The filter directives `-v`/`-q` stand for. `crest` is a prefix of every crest
    /// crate's target (crest_serve, crest_fuse...), so -v reaches them all but leaves
    /// rustls, fuser and tokio at warnings, which would drown crest's lines at debug.
    pub fn directives(&self) -> String {
        match (self.quiet, self.verbose) {
            (true, _) => "error".to_string(),
            (false, 0) => "warn".to_string(),
            (false, 1) => "warn,crest=info".to_string(),
            (false, 2) => "warn,crest=debug".to_string(),
            (false, _) => "warn,crest=trace".to_string(),
        }
    }

    /// The flags again, for a process that must log as this one does (the background
    /// mount daemon; its log file is its stderr, so `--log-file` is not among them).
    pub fn level_args(&self) -> Vec<String> {
        if self.quiet {
            return vec!["-q".to_string()];
        }
        (0..self.verbose).map(|_| "-v".to_string()).collect()
    }
}

/// The filter: `CREST_LOG` when it is set, non-empty and parses, else `-v`/`-q`. A
/// `CREST_LOG` that does not parse is ignored with a word on stderr (the logger that
/// would carry a warning is what is being built).
fn filter(args: &LogArgs, env: Option<&str>) -> EnvFilter {
    if let Some(directives) = env.filter(|d| !d.trim().is_empty()) {
        match EnvFilter::try_new(directives) {
            Ok(f) => return f,
            Err(e) => eprintln!("crest: {ENV}={directives:?} ignored ({e}); using -v/-q"),
        }
    }
    EnvFilter::new(args.directives())
}

/// Opens `path` for appending, creating it readable by its owner only (log lines name
/// paths, peers and clients).
pub fn open_log_file(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening the log file {}", path.display()))
}

/// Swaps the installed logger's filter (`reload`).
type Reloader = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// How to change the installed logger's filter, once `init` has installed it.
static RELOAD: std::sync::OnceLock<Reloader> = std::sync::OnceLock::new();

/// Installs the logger for this process. Fails only if `--log-file` cannot be opened.
pub fn init(args: &LogArgs) -> Result<()> {
    let env = std::env::var(ENV).ok();
    let builder = tracing_subscriber::fmt().with_env_filter(filter(args, env.as_deref()));
    // A second logger (a test that runs main twice) is refused: the first one stays.
    let _ = match &args.log_file {
        Some(path) => {
            let writer = std::sync::Mutex::new(open_log_file(path)?);
            let b = builder.with_ansi(false).with_writer(writer).with_filter_reloading();
            keep(b.reload_handle());
            b.try_init()
        }
        None if stderr_is_journal() => {
            let b = builder.with_ansi(false).event_format(Journal).with_writer(std::io::stderr).with_filter_reloading();
            keep(b.reload_handle());
            b.try_init()
        }
        None => {
            let b = builder.with_ansi(colour_on_stderr()).with_writer(std::io::stderr).with_filter_reloading();
            keep(b.reload_handle());
            b.try_init()
        }
    };
    Ok(())
}

/// Keeps how to swap the filter of the logger `handle` belongs to (each writer makes a
/// logger of another type: the handle is kept behind a closure).
fn keep<S>(handle: tracing_subscriber::reload::Handle<EnvFilter, S>)
where
    S: Subscriber + Send + Sync + 'static,
    EnvFilter: tracing_subscriber::Layer<S>,
{
    let _ = RELOAD.set(Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())));
}

/// Logs from now on at `args`' level (a reloaded configuration file), unless `CREST_LOG`
/// says otherwise: it wins, as at start. The directives in force.
pub fn reload(args: &LogArgs) -> Result<String, String> {
    let env = std::env::var(ENV).ok().filter(|d| !d.trim().is_empty());
    if let Some(directives) = env {
        return Ok(format!("{ENV}={directives}"));
    }
    let reload = RELOAD.get().ok_or("no logger installed")?;
    reload(EnvFilter::new(args.directives()))?;
    Ok(args.directives())
}

/// Colour only for a person at a terminal, and not if they asked for none
/// (https://no-color.org: NO_COLOR set and non-empty).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// True if stderr is the journal: systemd sets JOURNAL_STREAM to its "device:inode", and
/// only a match counts, since the variable is inherited by everything a service starts,
/// whatever its stderr (a background mount's is its log file).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(var) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = var.to_str().and_then(|v| v.split_once(':')) else { return false };
    let stat = std::io::stderr().as_fd().try_clone_to_owned().map(File::from).and_then(|f| f.metadata());
    stat.is_ok_and(|m| dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()))
}

/// A journal line: `<PRIORITY>target: message fields`, the priority as syslog numbers it
/// (sd-daemon(3)), so `journalctl -p warning` finds crest's warnings.
struct Journal;

impl<S, N> FormatEvent<S, N> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let meta = event.metadata();
        write!(writer, "<{}>{}: ", syslog_priority(*meta.level()), meta.target())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// syslog's priority for a tracing level: err, warning, info, debug.
fn syslog_priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(verbose: u8, quiet: bool) -> LogArgs {
        LogArgs { verbose, quiet, log_file: None }
    }

    #[test]
    fn levels() {
        assert_eq!(args(0, false).directives(), "warn");
        assert_eq!(args(0, true).directives(), "error");
        assert_eq!(args(1, false).directives(), "warn,crest=info");
        assert_eq!(args(2, false).directives(), "warn,crest=debug");
        assert_eq!(args(7, false).directives(), "warn,crest=trace");
        assert_eq!(args(2, false).level_args(), ["-v", "-v"]);
        assert_eq!(args(0, true).level_args(), ["-q"]);
        assert!(args(0, false).level_args().is_empty());
    }

    #[test]
    fn crest_log_wins_unless_unusable() {
        let quiet = args(0, true);
        assert_eq!(filter(&quiet, Some("crest_serve=debug")).to_string(), "crest_serve=debug");
        assert_eq!(filter(&quiet, None).to_string(), "error");
        assert_eq!(filter(&quiet, Some(" ")).to_string(), "error");
        assert_eq!(filter(&quiet, Some("crest=notalevel")).to_string(), "error");
    }

    #[test]
    fn log_file_is_private_and_appended() -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("crest.log");
        std::io::Write::write_all(&mut open_log_file(&path)?, b"one\n")?;
        std::io::Write::write_all(&mut open_log_file(&path)?, b"two\n")?;
        assert_eq!(std::fs::read_to_string(&path)?, "one\ntwo\n");
        assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
        Ok(())
    }

    #[test]
    fn priorities() {
        assert_eq!(syslog_priority(Level::ERROR), 3);
        assert_eq!(syslog_priority(Level::WARN), 4);
        assert_eq!(syslog_priority(Level::INFO), 6);
        assert_eq!(syslog_priority(Level::TRACE), 7);
    }
}
