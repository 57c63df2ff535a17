//! Keeping a joined host's certificate alive (`crest_tls::renewal`): `crest mount` renews
//! it before it mounts when a third of its life is left, a mount's daemon looks again at
//! start and at least hourly for as long as it runs (its reconnects present what is kept
//! now, `crest_tls::mount_config`), and `crest cert renew ADDR` does it now. Each shows
//! the certificate's life in the mount's status and warns in the log, once a day, when
//! less than 30 days are left.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use crest_tls::{unix_now, Held, Issued, Lifetime, Renewal, StateDir};

/// How long a renewal waits for its server.
const RENEWAL_WAIT: Duration = Duration::from_secs(30);
/// The longest a mount's daemon goes without looking at its certificate.
const LOOK_EVERY: Duration = Duration::from_secs(3600);
/// The shortest: looks are cheap, but never a loop.
const LOOK_AT_MOST_EVERY: Duration = Duration::from_secs(2);
/// How often the log warns that the certificate expires soon.
const WARN_EVERY: Duration = Duration::from_secs(86_400);

/// Renews the certificate kept for `addr` if it is due, or now if `force` (the server
/// judges whether it may be).
pub fn renew(state: &StateDir, addr: &str, force: bool) -> Result<Renewal> {
    let renewed = crest_tls::renew_joined(state, addr, force, |config, csr| {
        let req = crest_proto::Renew { magic: crest_proto::HELLO_MAGIC, version: crest_proto::PROTOCOL_VERSION, csr };
        let j = crest_net::renew(addr, config, req, RENEWAL_WAIT).map_err(|e| e.to_string())?;
        Ok(Issued { cert: j.cert, ca: j.ca, name: j.name })
    })?;
    if let Renewal::Renewed { old, new } = &renewed {
        tracing::info!(
            "{addr}: client certificate of {} renewed: {} replaces {}, {}",
            new.name,
            short(new),
            short(old),
            life_left(&new.lifetime, unix_now())
        );
    }
    Ok(renewed)
}

/// Before a mount of `addr`: renews the certificate kept for it if it is due. A failure
/// does not stop the mount (the certificate may still be valid for months); it is said,
/// louder when little is left.
pub fn before_mount(state: &StateDir, addr: &str) {
    let now = unix_now();
    match Held::joined(state, addr) {
        Ok(Some(held)) if held.lifetime.due(now) => match renew(state, addr, false) {
            Ok(_) => {}
            Err(e) => {
                let left = life_left(&held.lifetime, now);
                tracing::warn!("{addr}: cannot renew the client certificate of {} ({left}): {e:#}", held.name);
                if held.lifetime.left(now) < crest_tls::WARN_LEFT {
                    eprintln!("crest: WARNING: the certificate for {addr} {left}, and could not be renewed: {e:#}");
                }
            }
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("{addr}: cannot read the client certificate: {e}"),
    }
}

/// In a mount's daemon of `addr`: looks at the certificate kept for it now and then,
/// renews it when due, and keeps `status` up to date, for as long as the process runs.
pub fn spawn_keeper(state: &StateDir, addr: &str, status: crest_fuse::StatusExtra) {
    let (state, server) = (state.clone(), addr.to_string());
    let spawned = std::thread::Builder::new().name("crest-cert".into()).spawn(move || {
        let mut warned = None;
        while let Some(wait) = keep(&state, &server, &status, &mut warned) {
            std::thread::sleep(wait);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("{addr}: the client certificate will not be renewed while mounted: {e}");
    }
}

/// One look: publishes the certificate's life, warns if little is left (at most once per
/// `WARN_EVERY`), renews it if due; how long until the next look (None: the host no
/// longer holds a certificate for `addr`, nothing to keep).
fn keep(
    state: &StateDir,
    addr: &str,
    status: &crest_fuse::StatusExtra,
    warned: &mut Option<Instant>,
) -> Option<Duration> {
    let now = unix_now();
    let held = match Held::joined(state, addr) {
        Ok(Some(held)) => held,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!("{addr}: cannot read the client certificate: {e}");
            return Some(LOOK_EVERY / 12);
        }
    };
    status.set("client_certificate", describe_json(&held));
    let (mut held, mut failed) = (held, false);
    if held.lifetime.due(now) {
        match renew(state, addr, false) {
            Ok(Renewal::Renewed { new, .. }) => {
                status.set("client_certificate", describe_json(&new));
                held = new;
            }
            Ok(Renewal::NotDue(kept)) => held = kept,
            Err(e) => {
                tracing::warn!("{addr}: cannot renew the client certificate of {} yet: {e:#}", held.name);
                failed = true;
            }
        }
    }
    let left = held.lifetime.left(now);
    if left < crest_tls::WARN_LEFT && warned.is_none_or(|at: Instant| at.elapsed() >= WARN_EVERY) {
        tracing::warn!(
            "WARNING: the client certificate for {addr} ({}, {}) {}: mounts stop when it expires \
             unless it is renewed (crest cert renew {addr}) or the host joins again",
            held.name,
            short(&held),
            life_left(&held.lifetime, now)
        );
        *warned = Some(Instant::now());
    }
    Some(next_look(&held.lifetime, now, failed))
}

/// When to look again: when the certificate becomes due, or, after a renewal that failed,
/// after a thirtieth of its life; at most `LOOK_EVERY` from now, at least
/// `LOOK_AT_MOST_EVERY`.
fn next_look(life: &Lifetime, now: u64, failed: bool) -> Duration {
    let secs = if failed || life.due(now) { life.life() / 30 } else { life.renew_from() - now };
    Duration::from_secs(secs).clamp(LOOK_AT_MOST_EVERY, LOOK_EVERY)
}

/// The first 16 hex digits of a certificate's fingerprint, as `crest cert list` shows it.
pub fn short(held: &Held) -> String {
    held.fingerprint.hex()[..16].to_string()
}

/// "expires in 243 days (2027-03-01 14:05:09 UTC)", or "expired …".
pub fn life_left(life: &Lifetime, now: u64) -> String {
    if life.expires <= now {
        return format!("expired {}", crest_tls::utc(life.expires));
    }
    format!("expires in {} ({})", crate::trust::human_secs(life.left(now)), crest_tls::utc(life.expires))
}

/// One line of what a host keeps for a server it joined.
pub fn describe(held: &Held, now: u64) -> String {
    let when = if held.lifetime.due(now) {
        "renewal due".to_string()
    } else {
        format!("renewal from {}", crest_tls::utc(held.lifetime.renew_from()))
    };
    format!("{} ({}): {}, {when}", held.name, short(held), life_left(&held.lifetime, now))
}

/// The certificate as a mount's status and `crest status --json` show it.
pub fn describe_json(held: &Held) -> serde_json::Value {
    serde_json::json!({
        "server": held.addr,
        "name": held.name,
        "fingerprint": held.fingerprint.hex(),
        "issued": held.lifetime.issued,
        "expires": held.lifetime.expires,
        "renew_from": held.lifetime.renew_from(),
    })
}

/// `crest cert renew ADDR [--now]`: says what happened.
pub fn renew_command(state: &StateDir, addr: &str, now: bool) -> Result<()> {
    let joined = Held::joined(state, addr)?;
    if joined.is_none() {
        return Err(anyhow!("this host did not join {addr} (crest join {addr} TOKEN): there is nothing to renew"));
    }
    match renew(state, addr, now)? {
        Renewal::NotDue(held) => {
            println!("crest: {addr}: not due yet, nothing done (--now asks anyway): {}", describe(&held, unix_now()))
        }
        Renewal::Renewed { old, new } => {
            println!("crest: {addr}: renewed: {} replaces {}", describe(&new, unix_now()), short(&old));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_looks_when_renewal_opens_and_at_least_hourly() {
        let year = Lifetime { issued: 0, expires: 365 * 86_400 };
        assert_eq!(next_look(&year, 10, false), LOOK_EVERY, "months away: hourly");
        let from = year.renew_from();
        assert_eq!(next_look(&year, from - 60, false), Duration::from_secs(60), "at the moment it opens");
        assert_eq!(next_look(&year, from, true), LOOK_EVERY, "a failure: again within the hour");
        let minute = Lifetime { issued: 100, expires: 190 };
        assert_eq!(next_look(&minute, 100, false), Duration::from_secs(60));
        assert_eq!(next_look(&minute, 170, true), Duration::from_secs(3), "a thirtieth of a short life");
        assert_eq!(next_look(&minute, 159, false), LOOK_AT_MOST_EVERY, "never a loop");
    }
}
