//! `crest fsck --repair`: rewrites every bad copy of a superblock, tree node or data block
//! (of `copies=2` files) from its good twin, offline. The image is opened as the server
//! opens it (exclusively locked, so not while it is served); reads that meet a bad copy
//! already use and rewrite from its twin, then every copy of everything is checked
//! (`Store::repair_all`, a whole scrub at once). Nothing is committed: the repairs put
//! back the bytes a block should hold, so the generation on disk stays the one that was
//! there.

use std::path::Path;

use anyhow::{Context, Result};
use crest_store::{FileDisk, Store};

use crate::progress;

/// What the repair did.
pub struct Repaired {
    /// Copies rewritten, all told.
    pub repaired: u64,
    /// The first few of them, described.
    pub fixed: Vec<String>,
}

/// Repairs `image` in place; fsck then reports what is left.
pub fn repair(image: &Path) -> Result<Repaired> {
    let disk = FileDisk::open(image).with_context(|| format!("opening {} to repair it", image.display()))?;
    let counted = progress::Counter::default();
    let disk = progress::Counted::new(disk, &counted);
    let _spinner = progress::Spinner::bytes(
        &format!("repairing {}", image.display()),
        "read and written",
        &counted,
        progress::QUIET_FOR,
    );
    let mut store = Store::open_keeping_orphans(Box::new(disk))
        .with_context(|| format!("opening {} (no usable generation to repair from)", image.display()))?;
    let on_open = store.stats().repaired;
    let st = store.repair_all().context("repairing bad copies")?;
    let mut fixed = st.fixed;
    if on_open > 0 {
        fixed.insert(0, format!("{on_open} node copies rewritten from their twins while opening"));
    }
    drop(store.abandon());
    Ok(Repaired { repaired: st.repaired + on_open, fixed })
}
