//! The configuration file: `/etc/crest/crest.toml`, or the one `--config PATH` names.
//! It holds what would otherwise be typed on every `crest serve` and `crest mount` (and
//! in the service units that run them): `[serve]` and `[mount]` take the long flags of
//! those commands by name, `[log]` the level and file every command logs at, and
//! `state-dir` (outside any section) the global `--state-dir`.
//!
//! Precedence: a flag on the command line wins, then the file, then the built-in default.
//! Whether a flag was given is what clap's `ValueSource` says, not whether its value
//! differs from the default: `--listen 127.0.0.1:7410` must beat a file's other address
//! although it is the default address. A key the file does not know, or a value of the
//! wrong type, is an error naming the file, the key and the line (serde's
//! `deny_unknown_fields`, toml's spans): a misspelt key silently ignored would leave a
//! server listening where its administrator did not mean it to.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::parser::ValueSource;
use clap::ArgMatches;
use serde::Deserialize;

use crate::logging::LogArgs;
use crate::{Cli, Command, DiskIoArg};

/// Read when no `--config` is given; its absence means nothing is configured.
pub const DEFAULT_PATH: &str = "/etc/crest/crest.toml";

/// The whole file. Every key is optional: what is missing stays at the flag's default.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// `--state-dir` (`CREST_STATE_DIR` beats it, as it beats the built-in default).
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub serve: ServeSection,
    #[serde(default)]
    pub mount: MountSection,
    #[serde(default)]
    pub data: DataSection,
}

/// `[data]`: where the data store of an image made with `crest mkfs --data` is, and its
/// keys, for `crest serve` and `crest fsck` (docs/operations.md). The AWS_* variables,
/// where set, win over it. A file holding a secret should be readable by root alone.
#[derive(Deserialize, Debug, Default, PartialEq, Clone)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DataSection {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

/// The `[data]` section of the configuration file read at start (`apply`).
pub static DATA: std::sync::OnceLock<DataSection> = std::sync::OnceLock::new();

/// `[log]`, for every command.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogSection {
    /// What `-q`, (nothing), `-v`, `-vv`, `-vvv` say.
    pub level: Option<Level>,
    /// `--log-file`.
    pub file: Option<PathBuf>,
}

/// `[log] level`: the levels `-q` and `-v` choose between, by name.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    /// The `(quiet, verbose)` flags that mean this level.
    fn flags(self) -> (bool, u8) {
        match self {
            Level::Error => (true, 0),
            Level::Warn => (false, 0),
            Level::Info => (false, 1),
            Level::Debug => (false, 2),
            Level::Trace => (false, 3),
        }
    }
}

/// `[serve]`: `crest serve`'s flags. The image is no key: it is what a server is.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeSection {
    pub listen: Option<String>,
    pub commit_interval_ms: Option<u64>,
    pub disk_io: Option<DiskIoArg>,
    pub insecure: Option<bool>,
    pub max_sessions_per_client: Option<usize>,
    pub metrics: Option<std::net::SocketAddr>,
    pub io_threads: Option<usize>,
    pub reads_elsewhere_from: Option<u64>,
}

/// `[mount]`: `crest mount`'s flags. `options` is `-o` (a command line's `-o` replaces
/// it whole, as any flag replaces its key). `--foreground` and `--token` are no keys: how
/// one mount is started, and a single-use secret.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MountSection {
    pub options: Option<String>,
    pub timeout: Option<u64>,
    pub insecure: Option<bool>,
}

/// Parses the text of a configuration file; the error names the key and line.
pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
    toml::from_str(text)
}

/// Reads `--config PATH`, or the default file if there is one.
pub fn load(explicit: Option<&Path>) -> Result<Config> {
    let path = explicit.unwrap_or(Path::new(DEFAULT_PATH));
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
        Err(e) => return Err(anyhow!(e).context(format!("reading the configuration file {}", path.display()))),
    };
    let config: Config = parse(&text).with_context(|| format!("configuration file {}", path.display()))?;
    if config.data.secret_access_key.is_some() {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0);
        if mode & 0o077 != 0 {
            eprintln!(
                "crest: warning: {} holds the data store's secret key and others may read it (mode {:o}): chmod 600 it",
                path.display(),
                mode & 0o777
            );
        }
    }
    Ok(config)
}

/// True if the user set `id` (on the command line): the file must not change it then.
fn given(m: &ArgMatches, id: &str) -> bool {
    matches!(m.value_source(id), Some(s) if s != ValueSource::DefaultValue)
}

/// `*slot = file's value`, unless the command line gave `id` or the file has no value.
fn set<T: Clone>(slot: &mut T, file: Option<&T>, m: &ArgMatches, id: &str) {
    if let Some(v) = file.filter(|_| !given(m, id)) {
        *slot = v.clone();
    }
}

/// Puts the file's values under the command line's: `m` is what clap parsed `cli` from.
pub fn apply(cli: &mut Cli, m: &ArgMatches, file: &Config) {
    let _ = DATA.set(file.data.clone());
    apply_log(&mut cli.log, m, &file.log);
    // CREST_STATE_DIR sits between flag and file, as environment variables usually do
    // (and the test suites rely on it to keep their credentials to themselves).
    let env_state = std::env::var_os("CREST_STATE_DIR").is_some_and(|v| !v.is_empty());
    if !env_state {
        set(&mut cli.state_dir, file.state_dir.clone().map(Some).as_ref(), m, "state_dir");
    }
    match (&mut cli.command, m.subcommand()) {
        (
            Command::Serve {
                listen,
                commit_interval_ms,
                disk_io,
                insecure,
                max_sessions_per_client,
                metrics,
                io_threads,
                reads_elsewhere_from,
                ..
            },
            Some((_, sub)),
        ) => {
            let f = &file.serve;
            set(io_threads, f.io_threads.as_ref(), sub, "io_threads");
            set(reads_elsewhere_from, f.reads_elsewhere_from.as_ref(), sub, "reads_elsewhere_from");
            set(max_sessions_per_client, f.max_sessions_per_client.as_ref(), sub, "max_sessions_per_client");
            set(metrics, f.metrics.map(Some).as_ref(), sub, "metrics");
            set(listen, f.listen.as_ref(), sub, "listen");
            set(commit_interval_ms, f.commit_interval_ms.as_ref(), sub, "commit_interval_ms");
            set(disk_io, f.disk_io.as_ref(), sub, "disk_io");
            set(insecure, f.insecure.as_ref(), sub, "insecure");
        }
        (Command::Mount { options, timeout, insecure, .. }, Some((_, sub))) => {
            let f = &file.mount;
            set(options, f.options.clone().map(Some).as_ref(), sub, "options");
            set(timeout, f.timeout.as_ref(), sub, "timeout");
            set(insecure, f.insecure.as_ref(), sub, "insecure");
        }
        _ => {}
    }
}

/// `[log]`: `level` stands for `-q`/`-v`, so either flag on the command line beats it.
fn apply_log(log: &mut LogArgs, m: &ArgMatches, file: &LogSection) {
    if let Some(level) = file.level.filter(|_| !given(m, "verbose") && !given(m, "quiet")) {
        (log.quiet, log.verbose) = level.flags();
    }
    set(&mut log.log_file, file.file.clone().map(Some).as_ref(), m, "log_file");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// `args` parsed as `crest` would, with `file` applied.
    fn cli(args: &[&str], file: &str) -> Result<Cli> {
        let m = Cli::command().try_get_matches_from(std::iter::once("crest").chain(args.iter().copied()))?;
        let mut cli = Cli::from_arg_matches(&m)?;
        apply(&mut cli, &m, &parse(file)?);
        Ok(cli)
    }

    const SERVE: &str =
        "state-dir = \"/file/state\"\n[serve]\nlisten = \"127.0.0.1:9999\"\ninsecure = true\ndisk-io = \"sync\"\ncommit-interval-ms = 7\n\
         max-sessions-per-client = 9\nio-threads = 5\n";

    #[test]
    fn parses_every_key() -> Result<()> {
        let text = "state-dir = \"/srv/state\"\n[log]\nlevel = \"debug\"\nfile = \"/var/log/crest.log\"\n\
                    [serve]\nlisten = \"0.0.0.0:7410\"\ncommit-interval-ms = 100\ndisk-io = \"pool\"\ninsecure = false\n\
                    max-sessions-per-client = 1000\nmetrics = \"127.0.0.1:9477\"\nio-threads = 3\n\
                    reads-elsewhere-from = 131072\n\
                    [mount]\noptions = \"ro,noatime\"\ntimeout = 30\ninsecure = true\n";
        let c = parse(text)?;
        assert_eq!(c.state_dir, Some(PathBuf::from("/srv/state")));
        assert_eq!(c.log, LogSection { level: Some(Level::Debug), file: Some("/var/log/crest.log".into()) });
        assert_eq!(c.serve.listen.as_deref(), Some("0.0.0.0:7410"));
        assert_eq!(
            (c.serve.commit_interval_ms, c.serve.disk_io, c.serve.insecure),
            (Some(100), Some(DiskIoArg::Pool), Some(false))
        );
        assert_eq!(c.serve.max_sessions_per_client, Some(1000));
        assert_eq!(c.serve.metrics, Some("127.0.0.1:9477".parse()?));
        assert_eq!(c.serve.io_threads, Some(3));
        assert_eq!(c.serve.reads_elsewhere_from, Some(131072));
        assert_eq!(
            c.mount,
            MountSection { options: Some("ro,noatime".into()), timeout: Some(30), insecure: Some(true) }
        );
        assert_eq!(parse("")?, Config::default());
        Ok(())
    }

    fn serve_of(cli: &Cli) -> (&str, u64, DiskIoArg, bool, usize, usize) {
        match &cli.command {
            Command::Serve {
                listen,
                commit_interval_ms,
                disk_io,
                insecure,
                max_sessions_per_client,
                io_threads,
                ..
            } => (listen, *commit_interval_ms, *disk_io, *insecure, *max_sessions_per_client, *io_threads),
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn flag_beats_file_beats_default() -> Result<()> {
        let none = cli(&["serve", "img"], "")?;
        let io = crest_serve::default_io_threads();
        assert_eq!(serve_of(&none), (crate::DEFAULT_LISTEN, 5000, DiskIoArg::Uring, false, 256, io));
        let file = cli(&["serve", "img"], SERVE)?;
        assert_eq!(serve_of(&file), ("127.0.0.1:9999", 7, DiskIoArg::Sync, true, 9, 5));
        // Given on the command line, the default values still win over the file's.
        let args = [
            "serve",
            "img",
            "--listen",
            crate::DEFAULT_LISTEN,
            "--disk-io",
            "uring",
            "--commit-interval-ms",
            "5000",
            "--max-sessions-per-client",
            "256",
            "--io-threads",
            "0",
        ];
        let flags = cli(&args, SERVE)?;
        assert_eq!(serve_of(&flags), (crate::DEFAULT_LISTEN, 5000, DiskIoArg::Uring, true, 256, 0));
        let state = cli(&["serve", "img", "--state-dir", "/flag/state"], SERVE)?;
        assert_eq!(state.state_dir, Some(PathBuf::from("/flag/state")));
        // (Without the flag, CREST_STATE_DIR beats the file: only checked where it is unset.)
        if std::env::var_os("CREST_STATE_DIR").is_none() {
            assert_eq!(file.state_dir, Some(PathBuf::from("/file/state")));
        }
        Ok(())
    }

    #[test]
    fn mount_keys() -> Result<()> {
        let file = "[mount]\noptions = \"ro\"\ntimeout = 30\ninsecure = true\n";
        let of = |c: &Cli| match &c.command {
            Command::Mount { options, timeout, insecure, .. } => (options.clone(), *timeout, *insecure),
            other => panic!("not mount: {other:?}"),
        };
        assert_eq!(of(&cli(&["mount", "h", "/mnt"], "")?), (None, 120, false));
        assert_eq!(of(&cli(&["mount", "h", "/mnt"], file)?), (Some("ro".into()), 30, true));
        assert_eq!(
            of(&cli(&["mount", "-o", "rw", "--timeout", "120", "h", "/mnt"], file)?),
            (Some("rw".into()), 120, true)
        );
        // [serve] keys reach no other command.
        assert_eq!(of(&cli(&["mount", "h", "/mnt"], SERVE)?), (None, 120, false));
        Ok(())
    }

    #[test]
    fn log_level_and_file() -> Result<()> {
        let file = "[log]\nlevel = \"debug\"\nfile = \"/f.log\"\n";
        let of = |c: &Cli| (c.log.quiet, c.log.verbose, c.log.log_file.clone());
        assert_eq!(of(&cli(&["fsck", "img"], file)?), (false, 2, Some("/f.log".into())));
        // Flags after the command, too (they are global).
        assert_eq!(of(&cli(&["fsck", "img", "-q", "--log-file", "/g"], file)?), (true, 0, Some("/g".into())));
        assert_eq!(of(&cli(&["-v", "fsck", "img"], file)?), (false, 1, Some("/f.log".into())));
        assert_eq!(of(&cli(&["fsck", "img"], "[log]\nlevel = \"error\"")?), (true, 0, None));
        Ok(())
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[serve]\nlisten = \"127.0.0.1:1\"\nlisten-on = \"0.0.0.0:1\"\n";
        let e = parse(text).map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("line 3") && e.contains("listen-on"), "{e}");
        let e = parse("verbose = 2\n").map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("line 1") && e.contains("verbose"), "{e}");
        let e = parse("[daemon]\nx = 1\n").map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("line 1") && e.contains("daemon"), "{e}");
    }

    #[test]
    fn wrong_type_names_key_and_line() {
        for (text, line) in [
            ("[mount]\n\ntimeout = \"30\"\n", "line 3"),
            ("[serve]\ninsecure = \"yes\"\n", "line 2"),
            ("[serve]\ndisk-io = \"floppy\"\n", "line 2"),
            ("[log]\nlevel = \"loud\"\n", "line 2"),
            ("[serve]\nlisten = \n", "line 2"),
        ] {
            let e = parse(text).map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn missing_files() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("none.toml");
        let e = load(Some(&path)).map(|_| ()).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("none.toml"), "{e}");
        std::fs::write(&path, "[serve]\nlisten = 1\n")?;
        let e = load(Some(&path)).map(|_| ()).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("none.toml") && e.contains("line 2") && e.contains("listen"), "{e}");
        Ok(())
    }
}
