//! Tools for crest's headline benchmark (`bench/headline.sh`):
//!
//! - [`proxy`]: a TCP proxy that adds a fixed delay to each direction with microsecond
//!   precision (an emulated LAN round trip without netem), for crest's and sshfs's
//!   connections alike;
//! - [`pingpong`]: a raw TCP echo server and ping-pong client, the floor a request round
//!   trip is compared against;
//! - [`metabench`]: creates, stats and unlinks of many files in one directory;
//! - [`flood`]: hostile loads over the raw wire protocol and the honest probe timed beside
//!   them (`bench/hostile.sh`, issue 43);
//! - [`stats`]: percentiles of latency samples and a lock-free microsecond histogram.
//!
//! Everything here is plain threads and blocking sockets: tokio's timer has a 1 ms
//! granularity, far coarser than the 100 µs one-way delays the proxy must add.

pub mod flood;
pub mod metabench;
pub mod pingpong;
pub mod proxy;
pub mod stats;

/// Client options for a server at `addr`: plaintext with `insecure` (a server run
/// `--insecure`), else mutual TLS with this host's own certificate, as `crest mount` uses
/// on the server's host.
pub fn client_options(addr: &str, insecure: bool) -> anyhow::Result<crest_net::ClientOptions> {
    let tls = if insecure {
        None
    } else {
        let dir = crest_tls::StateDir::new(crest_tls::StateDir::default_path());
        let creds = crest_tls::Credentials::for_server(&dir, addr)?;
        Some(crest_tls::client_config(&creds)?)
    };
    Ok(crest_net::ClientOptions { tls, ..Default::default() })
}

/// Asks the kernel to wake this thread's sleeps as close to their deadline as it can
/// (Linux timer slack: 50 µs by default, which would blur a 100 µs delay). Threads started
/// afterwards from this thread inherit the setting. Best effort: failure is ignored.
pub fn tighten_timer_slack() {
    let _ = nix::sys::prctl::set_timerslack(1);
}

/// Parses a comma-separated list of message sizes: `4,64,1024`, `1K` and `1KiB` allowed.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let p = p.trim();
            let (num, mult) = if let Some(n) = p.strip_suffix("KiB").or_else(|| p.strip_suffix('K')) {
                (n, 1024)
            } else {
                (p.strip_suffix('B').unwrap_or(p), 1)
            };
            match num.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n * mult),
                _ => Err(format!("bad message size {p:?} (want e.g. 4,64,1K)")),
            }
        })
        .collect()
}

/// A list of message sizes on a command line (`--sizes 4,64,1K`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

impl std::str::FromStr for Sizes {
    type Err = String;
    fn from_str(s: &str) -> Result<Sizes, String> {
        parse_sizes(s).map(Sizes)
    }
}

/// Formats a byte count the way the reports print message sizes (`4 B`, `1 KiB`).
pub fn size_label(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_sizes("4,64,1024"), Ok(vec![4, 64, 1024]));
        assert_eq!(parse_sizes("4B, 1K,2KiB"), Ok(vec![4, 1024, 2048]));
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("x").is_err());
        assert_eq!(size_label(1024), "1 KiB");
        assert_eq!(size_label(64), "64 B");
    }
}
