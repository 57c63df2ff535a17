//! Many small metadata operations in one directory: create (open `O_CREAT|O_EXCL`, close),
//! stat (`lstat`), unlink, each over `count` files named `f000000`, `f000001`, ….

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A phase of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Create every file (empty).
    Create,
    /// `lstat` every file.
    Stat,
    /// Unlink every file.
    Unlink,
}

impl Phase {
    /// The phase's name as printed and as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::Unlink => "unlink",
        }
    }

    /// Parses `create`, `stat` or `unlink`.
    pub fn parse(s: &str) -> Option<Phase> {
        [Phase::Create, Phase::Stat, Phase::Unlink].into_iter().find(|p| p.name() == s)
    }
}

/// The path of file `i` in `dir`, its name led by `prefix` (several writers in one
/// directory each take their own).
pub fn file_name(dir: &Path, prefix: &str, i: usize) -> PathBuf {
    dir.join(format!("{prefix}f{i:06}"))
}

/// Runs one phase over files `0..count`; returns how long it took. With `sync`, a
/// `syncfs` of the directory's file system ends the phase (and is timed), like the
/// `sync -f` after an untar. Stops at the first failure, naming the file.
pub fn run_phase(dir: &Path, prefix: &str, phase: Phase, count: usize, sync: bool) -> io::Result<Duration> {
    let named = |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    let t = Instant::now();
    for i in 0..count {
        let p = file_name(dir, prefix, i);
        match phase {
            Phase::Create => {
                OpenOptions::new().write(true).create_new(true).open(&p).map_err(|e| named(&p, e))?;
            }
            Phase::Stat => {
                fs::symlink_metadata(&p).map_err(|e| named(&p, e))?;
            }
            Phase::Unlink => fs::remove_file(&p).map_err(|e| named(&p, e))?,
        }
    }
    if sync {
        let d = File::open(dir).map_err(|e| named(dir, e))?;
        nix::unistd::syncfs(&d).map_err(|e| named(dir, io::Error::from(e)))?;
    }
    Ok(t.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip() {
        let dir = std::env::temp_dir().join(format!("crest-metabench-test.{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("mkdir");
        for phase in [Phase::Create, Phase::Stat, Phase::Unlink] {
            run_phase(&dir, "", phase, 50, phase != Phase::Stat).expect("phase");
            run_phase(&dir, "m2-", phase, 20, false).expect("phase, prefixed");
        }
        assert_eq!(fs::read_dir(&dir).expect("readdir").count(), 0);
        // Stat of files that are gone fails and names the file.
        let e = run_phase(&dir, "", Phase::Stat, 1, false).expect_err("missing");
        assert!(e.to_string().contains("f000000"), "{e}");
        fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(Phase::parse("stat"), Some(Phase::Stat));
        assert_eq!(Phase::parse("x"), None);
    }
}
