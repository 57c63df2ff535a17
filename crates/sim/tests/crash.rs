//! The crash simulator's seeds: fixed ones and regression seeds, or what
//! `CREST_CRASH_SEED` / `CREST_CRASH_SEEDS` ask for (see `crest_sim::crash`).

#[test]
fn acknowledged_changes_survive_server_crashes() {
    let summary = crest_sim::crash::run_seeds().unwrap_or_else(|report| panic!("{report}"));
    println!("{summary}");
}

#[test]
fn a_seed_replays_exactly() {
    assert_eq!(crest_sim::crash::run_seed(7), crest_sim::crash::run_seed(7));
}
