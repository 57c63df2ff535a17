//! `crest completions SHELL` and `crest man DIR`: shell completions and man pages, both
//! made from the same clap definition as `--help`, so they cannot drift from it (and a
//! package can make them at build time from the binary it ships).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut script = Vec::new();
    // Into a buffer first: clap_complete panics on a failed write (a closed pipe), and a
    // failure here should be an error message like any other.
    clap_complete::generate(shell, &mut crate::Cli::command(), "crest", &mut script);
    std::io::stdout().write_all(&script).context("writing the completions")
}

/// Writes one roff page per command and subcommand into `dir` (created if missing):
/// crest.1, crest-mount.1, crest-dataset-create.1... Returns the paths written.
pub fn man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Built once at the top so that every subcommand knows its full name (crest-mount).
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    write_pages(cmd, dir, &mut written).with_context(|| format!("writing man pages to {}", dir.display()))?;
    Ok(written)
}

fn write_pages(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    written.push(clap_mangen::Man::new(cmd).manual("crest").generate_to(dir)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_for_every_command() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let pages = man_pages(dir.path())?;
        let names: Vec<String> =
            pages.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        for want in ["crest.1", "crest-mount.1", "crest-dataset-create.1", "crest-man.1"] {
            assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
        }
        let top = std::fs::read_to_string(dir.path().join("crest.1"))?;
        assert!(top.contains(".TH crest 1"), "no title line in {:?}", &top[..top.len().min(200)]);
        assert!(top.contains("CREST_LOG"), "the logging notes are missing from crest.1");
        Ok(())
    }
}
