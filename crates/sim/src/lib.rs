//! crest's deterministic simulator. It runs the real server core (`crest_server::Server`
//! over a `Store` on a `MemDisk`) and the real client core (`crest_client::conn::Connection`,
//! its cache and local-answer rules) of every client, on virtual time, every choice drawn
//! from one seed, so a seed replays exactly (`cargo run --release -p crest-sim --
//! coherence SEED`): caching clients of several processes under network faults, client
//! crashes, and server crashes after a commit or between commits; every answer checked
//! against a reference model of the file system, coherence across clients included
//! (`coherence`).

pub mod coherence;

/// A number from the environment (none when the variable is unset).
pub(crate) fn env_u64(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map(Some).map_err(|_| format!("{name}={v}: not a number")),
        Err(_) => Ok(None),
    }
}

/// The seeds a run takes: `$one` alone if set, else `$many` random ones (drawn from the
/// OS, so each run tries new ones; each is printed as it runs), else `fixed`.
pub(crate) fn seeds(one: &str, many: &str, fixed: impl Iterator<Item = u64>) -> Result<Vec<u64>, String> {
    Ok(if let Some(s) = env_u64(one)? {
        vec![s]
    } else if let Some(n) = env_u64(many)? {
        let mut buf = [0u8; 8];
        crest_rng::os_random_bytes(&mut buf).map_err(|e| format!("no entropy for random seeds: {e}"))?;
        let mut r = crest_rng::Stream::from_seed_u64(u64::from_le_bytes(buf));
        (0..n).map(|_| r.next_u64()).collect()
    } else {
        fixed.collect()
    })
}
