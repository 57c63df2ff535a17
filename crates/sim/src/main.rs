//! Replays one seed of the simulator, as a failure report says:
//! `crest-sim [coherence] SEED [--steps N] [--server-crashes]`.
//! The coherence simulator's mode variables (`CREST_SIM_OUTAGES`, `CREST_SIM_LEASE`,
//! `CREST_SIM_TOMBSTONES`, `CREST_SIM_GRANT`, `CREST_SIM_TRACE`) apply as in the tests.

use std::process::ExitCode;

const USAGE: &str = "usage: crest-sim [coherence] SEED [--steps N] [--server-crashes]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(report) => {
            eprintln!("{report}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<String, String> {
    let number = |s: &str| s.parse::<u64>().map_err(|_| format!("{s:?} is not a number\n{USAGE}"));
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        // (`coherence` may be left out: there is one simulator.)
        ["coherence", seed, rest @ ..] | [seed, rest @ ..] => {
            let (mut steps, mut crashes) = (crest_sim::coherence::DEFAULT_STEPS, false);
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match *a {
                    "--server-crashes" => crashes = true,
                    "--steps" => steps = number(it.next().ok_or(USAGE)?)? as usize,
                    other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
                }
            }
            crest_sim::coherence::run_seed(number(seed)?, steps, crashes)
        }
        _ => Err(USAGE.into()),
    }
}
