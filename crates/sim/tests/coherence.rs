//! The coherence simulator's seeds: fixed ones and regression seeds, or what
//! `CREST_SIM_SEED` / `CREST_SIM_SEEDS` ask for (see `crest_sim::coherence`).

fn only_server_crashes() -> bool {
    std::env::var("CREST_SIM_SERVER_CRASHES").as_deref() == Ok("only")
}

#[test]
fn coherence_across_clients() {
    if only_server_crashes() {
        return;
    }
    crest_sim::coherence::run_seeds(false).unwrap_or_else(|report| panic!("{report}"));
}

/// The same with the server crashing now and then: the seeds draw their server crashes
/// apart, so seed S runs as `coherence_across_clients`' seed S until its first server
/// crash. `CREST_SIM_SERVER_CRASHES=only` runs random seeds (`CREST_SIM_SEEDS`) only here.
#[test]
fn coherence_across_server_crashes() {
    if std::env::var_os("CREST_SIM_SEEDS").is_some() && !only_server_crashes() {
        return;
    }
    crest_sim::coherence::run_seeds(true).unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn a_seed_replays_exactly() {
    // The server core, the store, the client cores and the simulator must take no input
    // but the seed (no clock, no hash-map order, no OS randomness in anything that decides
    // what happens).
    let run = || crest_sim::coherence::trace_hash(7, 1_000, true).unwrap_or_else(|r| panic!("{r}"));
    assert_eq!(run(), run(), "seed 7 ran differently twice");
}
