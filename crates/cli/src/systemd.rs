//! What `crest serve` tells systemd when it runs as a `Type=notify` service
//! (sd_notify(3)): READY=1 once it listens, RELOADING=1 / READY=1 around a SIGHUP
//! reload, STOPPING=1 as it shuts down, and WATCHDOG=1 every half `WatchdogSec` while its
//! store task answers — a server whose store thread is stuck stops feeding the watchdog,
//! and systemd restarts it. Without `NOTIFY_SOCKET` (not run by systemd) nothing is sent.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

/// Where systemd listens: `NOTIFY_SOCKET`, a path or (leading `@`) an abstract name.
fn socket() -> Option<String> {
    std::env::var("NOTIFY_SOCKET").ok().filter(|s| !s.is_empty())
}

/// Sends `state` (newline-separated `KEY=VALUE` lines); false if it could not go.
pub fn notify(state: &str) -> bool {
    socket().is_some_and(|to| notify_to(&to, state))
}

fn notify_to(to: &str, state: &str) -> bool {
    let Ok(sock) = UnixDatagram::unbound() else { return false };
    let sent = match to.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
        }
        None => sock.send_to(state.as_bytes(), PathBuf::from(to)),
    };
    if let Err(e) = &sent {
        tracing::warn!("cannot tell systemd {state:?}: {e}");
    }
    sent.is_ok()
}

/// How often to feed the watchdog: half of `WATCHDOG_USEC`, when it is meant for this
/// process (`WATCHDOG_PID` unset or ours).
pub fn watchdog_every() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_from(usec.as_deref(), pid.as_deref(), std::process::id()).filter(|_| socket().is_some())
}

fn watchdog_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.parse().ok()?;
    let ours = pid.is_none_or(|p| p.parse() == Ok(me));
    (usec > 0 && ours).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_notification_reaches_the_socket_systemd_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        assert!(notify_to(path.to_str().unwrap(), "READY=1\nSTATUS=serving"));
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        assert!(!notify_to(dir.path().join("nobody").to_str().unwrap(), "READY=1"), "no listener");
    }

    #[test]
    fn the_watchdog_is_fed_at_half_its_interval_and_only_for_this_process() {
        assert_eq!(watchdog_from(Some("4000000"), None, 7), Some(Duration::from_secs(2)));
        assert_eq!(watchdog_from(Some("4000000"), Some("7"), 7), Some(Duration::from_secs(2)));
        assert_eq!(watchdog_from(Some("4000000"), Some("8"), 7), None, "another process's");
        assert_eq!(watchdog_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_from(Some("soon"), None, 7), None);
        assert_eq!(watchdog_from(None, None, 7), None);
    }
}
