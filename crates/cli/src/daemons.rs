//! Finding a mount's daemon and waiting for it to end. The kernel lets go of a FUSE mount
//! at once, while its daemon still makes what it wrote durable and says goodbye to the
//! server: `crest umount` returns only when that is done, so that a server stopped or
//! restarted right after has no session left to wait for (or to restore from its record
//! and hold new work back for, its grace period).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long `crest umount` waits for a daemon to end: its goodbye waits up to 5 s for the
/// server to make its changes durable and 1 s for the goodbye's answer.
pub const GOODBYE_WAIT: Duration = Duration::from_secs(8);

/// The daemon that served the mount at `target` (as `mountinfo::resolve` gives it), asked
/// once it is unmounted: a mount daemon runs `crest mount … ADDR DIR`, its mount point
/// last, whether started in the background by `crest mount` or the mount helper, or in
/// the foreground. The newest such process: an older one serves a mount detached lazily
/// from the same place. Only processes named `crest` have their command line read (that
/// read can wait on a process stuck on a hung mount), and paths are compared as written,
/// never looked up.
pub fn serving(target: &Path) -> Option<u32> {
    crest_processes()
        .into_iter()
        .filter(|(pid, args)| mount_point_of(args).is_some_and(|dir| resolve_for(*pid, dir).as_deref() == Some(target)))
        .filter_map(|(pid, _)| Some((started(pid)?, pid)))
        .max()
        .map(|(_, pid)| pid)
}

/// Every other process named `crest`, with its arguments (only such processes have their
/// command line read: that read can wait on a process stuck on a hung mount).
fn crest_processes() -> Vec<(u32, Vec<Vec<u8>>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter(|&pid| std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_ascii_end() == b"crest"))
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect()))
        })
        .collect()
}

/// When process `pid` started (clock ticks since boot: /proc/PID/stat's 22nd field).
pub fn started(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The mount point a `crest mount` command line names: its last argument, if `mount` is
/// among the others.
fn mount_point_of(args: &[Vec<u8>]) -> Option<&Path> {
    let (last, rest) = args.split_last()?;
    rest.iter().skip(1).any(|a| a.as_slice() == b"mount").then(|| Path::new(OsStr::from_bytes(last)))
}

/// `dir` as process `pid` means it: relative to its working directory, `.` and trailing
/// slashes dropped, nothing looked up (any of it may be on a hung mount).
fn resolve_for(pid: u32, dir: &Path) -> Option<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?.join(dir)
    };
    std::path::absolute(abs).ok()
}

/// Waits until every process of `pids` has ended (or is a zombie nobody reaped), for at
/// most `limit`. Returns those still running.
pub fn wait_ended(pids: &[u32], limit: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let running: Vec<u32> = pids.iter().copied().filter(|&pid| running(pid)).collect();
        if running.is_empty() || start.elapsed() >= limit {
            return running;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may hold any byte.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else { return false };
    !matches!(stat.get(close + 2), Some(b'Z' | b'X') | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_command_line_names_its_mount_point_last() {
        let args = |line: &[u8]| -> Vec<Vec<u8>> {
            line.split(|&b| b == 0).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect()
        };
        let line = args(b"/usr/bin/crest\0mount\0--foreground\0--ready-pipe\0h:7410\0/mnt/with space\0");
        assert_eq!(mount_point_of(&line), Some(Path::new("/mnt/with space")));
        assert_eq!(mount_point_of(&args(b"crest\0-v\0mount\0h:1\0rel/dir\0")), Some(Path::new("rel/dir")));
        assert_eq!(mount_point_of(&args(b"crest\0serve\0/var/img\0")), None, "not a mount");
        assert_eq!(mount_point_of(&args(b"/bin/mount\0/mnt/x\0")), None, "mount only as the program");
        assert_eq!(mount_point_of(&args(b"")), None);
    }

    #[test]
    fn this_process_runs_and_an_unknown_one_does_not() {
        assert!(running(std::process::id()));
        assert!(!running(u32::MAX));
        assert!(wait_ended(&[u32::MAX], Duration::ZERO).is_empty());
        assert_eq!(wait_ended(&[std::process::id()], Duration::from_millis(20)), vec![std::process::id()]);
    }

    #[test]
    fn a_reaped_child_has_ended_and_an_unreaped_one_too() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Not waited for yet: a zombie once it exits, which counts as ended.
        assert!(wait_ended(&[pid], Duration::from_secs(5)).is_empty(), "a zombie is not running");
        child.wait().expect("reap");
        assert!(!running(pid));
    }

    #[test]
    fn a_relative_mount_point_is_resolved_against_the_process_directory() {
        let here = std::fs::read_link("/proc/self/cwd").expect("cwd");
        assert_eq!(resolve_for(std::process::id(), Path::new("m")), Some(here.join("m")));
        assert_eq!(resolve_for(std::process::id(), Path::new("./m/")), Some(here.join("m")));
        assert_eq!(
            resolve_for(std::process::id(), Path::new("/nonexistent-crest/m")),
            Some(PathBuf::from("/nonexistent-crest/m")),
            "nothing is looked up"
        );
    }

    #[test]
    fn a_process_start_time_is_read() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let (me, it) = (started(std::process::id()), started(child.id()));
        let _ = child.kill();
        let _ = child.wait();
        assert!(me.is_some() && it.is_some() && it >= me, "{me:?} {it:?}");
        assert_eq!(started(u32::MAX), None);
    }
}
