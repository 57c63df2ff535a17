//! Records the git commit the `crest` binary is built from (`CREST_COMMIT`), so that
//! `crest --version` can name it: the first 12 hex digits of HEAD, "-dirty" when the
//! work tree differs from it. A build outside crest's own checkout (a tarball, a
//! registry download) says "unknown" rather than failing; a packager who knows the commit
//! sets `CREST_BUILD_COMMIT`, which wins.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CREST_BUILD_COMMIT");
    let commit = match std::env::var("CREST_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=CREST_COMMIT={commit}");
}

/// HEAD's commit with its "-dirty" mark, or None without git or outside crest's checkout.
fn git_commit() -> Option<String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let workspace = manifest.join("../..").canonicalize().ok()?;
    // Only crest's own repository counts: sources unpacked somewhere inside another
    // checkout (a home directory kept in git) must not name that one's commit.
    let top = PathBuf::from(git(&workspace, &["rev-parse", "--show-toplevel"])?).canonicalize().ok()?;
    if top != workspace {
        return None;
    }
    for path in watched(&workspace) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    // The full hash cut to 12, not --short=12: that one grows when a prefix is ambiguous,
    // and the output's form should not depend on the repository's size.
    let head = git(&workspace, &["rev-parse", "HEAD"])?;
    let hash = head.get(..12)?;
    // --no-optional-locks: a status that refreshed the index would change a watched file.
    let dirty = !git(&workspace, &["--no-optional-locks", "status", "--porcelain"])?.is_empty();
    Some(if dirty { format!("{hash}-dirty") } else { hash.to_string() })
}

/// What moves the answer: HEAD (a checkout), the ref it names (a commit; loose or
/// packed), the index, and the sources (an edit makes the build dirty). Cargo re-runs
/// this script only when one of them changes, and scans a directory recursively. Only
/// paths that exist are named: cargo re-runs on every build for one that does not.
fn watched(workspace: &Path) -> Vec<PathBuf> {
    let git_path = |p: &str| git(workspace, &["rev-parse", "--git-path", p]).map(|rel| workspace.join(rel));
    let mut paths: Vec<PathBuf> = ["HEAD", "index", "packed-refs"].iter().filter_map(|p| git_path(p)).collect();
    if let Some(head_ref) = git(workspace, &["symbolic-ref", "-q", "HEAD"]) {
        paths.extend(git_path(&head_ref));
    }
    paths.extend(["crates", "Cargo.toml", "Cargo.lock"].iter().map(|p| workspace.join(p)));
    paths.retain(|p| p.exists());
    paths
}

/// `git ARGS` run in `dir`: its trimmed output, or None if git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim_end().to_string())
}
