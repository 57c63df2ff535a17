//! Who may talk to whom: `crest join`, `crest token`, `crest cert`, and how `serve` and
//! `mount` choose between mutual TLS (the default) and `--insecure`. Renewing a joined
//! host's certificate is `renew.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use crest_tls::{unix_now, Authority, Credentials, StateDir};

/// `crest token ...`
#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a single-use join token (printed on stdout) for another machine.
    Create {
        /// How long it may be redeemed: 30m, 1h, 2d... (at most 7d).
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: u64,
        /// The name the client's certificate gets, never issued before (default: a fresh
        /// name, the host name the client sends and 8 random hex digits).
        #[arg(long)]
        name: Option<String>,
    },
    /// List tokens not yet redeemed.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `crest cert ...`
#[derive(Subcommand, Debug)]
pub enum CertCmd {
    /// List the client certificates this host's CA issued (time left, and what each
    /// renewed), then those this host holds for servers it joined.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only the certificates this host holds for servers it joined.
        #[arg(long)]
        joined: bool,
    },
    /// Renew this host's certificate for a server it joined, if a third of its life or
    /// less is left (mounts do this themselves; this is for doing it now).
    Renew {
        /// The server: HOST[:PORT].
        addr: String,
        /// Ask even if more than a third is left (the server refuses it then).
        #[arg(long)]
        now: bool,
    },
    /// Revoke client certificates by name or fingerprint prefix (8+ hex digits); a
    /// connected client is disconnected within a second and its session ended.
    Revoke {
        /// Name or fingerprint prefix.
        who: String,
    },
}

/// Parses `30m`, `1h`, `2d`, `90s` or plain seconds; at most 7 days.
pub fn parse_ttl(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: expected a duration like 30m, 1h or 2d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h or d)")),
    };
    if secs == 0 || secs > 7 * 86_400 {
        return Err(format!("{s:?}: a token lives from 1 s to 7 days"));
    }
    Ok(secs)
}

/// The state directory: `--state-dir`, else the default for this user.
pub fn state_dir(flag: Option<&PathBuf>) -> StateDir {
    StateDir::new(flag.cloned().unwrap_or_else(StateDir::default_path))
}

pub fn token(dir: &StateDir, cmd: TokenCmd) -> Result<()> {
    let auth = Authority::open(dir).context("opening this host's certificate authority")?;
    match cmd {
        TokenCmd::Create { ttl, name } => {
            let token = auth.create_token(ttl, name.as_deref())?;
            println!("{}", token.encode());
            eprintln!(
                "crest: single-use, valid {}; on the joining machine, as root: crest join SERVER[:PORT] TOKEN \
                 (or crest mount SERVER DIR --token TOKEN)",
                human_secs(ttl)
            );
        }
        TokenCmd::List { json } => {
            let tokens = auth.tokens()?;
            if json {
                println!("{}", serde_json::to_string(&tokens)?);
            } else if tokens.is_empty() {
                println!("no tokens waiting");
            } else {
                let now = unix_now();
                for t in tokens {
                    let name = t.name.as_deref().unwrap_or("(fresh: HOSTNAME-XXXXXXXX)");
                    println!("{}  expires in {}  name {name}", t.id, human_secs(t.expires.saturating_sub(now)));
                }
            }
        }
    }
    Ok(())
}

pub fn cert(dir: &StateDir, cmd: CertCmd) -> Result<()> {
    match cmd {
        CertCmd::List { json, joined: true } => list_joined(dir, json),
        CertCmd::List { json, joined: false } => list_issued(dir, json),
        CertCmd::Renew { addr, now } => crate::renew::renew_command(dir, &crate::mount::parse_addr(&addr)?, now),
        CertCmd::Revoke { who } => {
            let auth = Authority::open(dir).context("opening this host's certificate authority")?;
            let gone = auth.revoke(&who)?;
            if gone.is_empty() {
                bail!("no live certificate is named {who:?} or has a fingerprint starting with it");
            }
            for c in gone {
                println!("revoked {} ({})", c.name, &c.fingerprint[..16]);
            }
            Ok(())
        }
    }
}

/// `crest cert list`: the certificates this host's CA issued (none if it has no CA: a host
/// that only mounts), then what it holds for servers it joined.
fn list_issued(dir: &StateDir, json: bool) -> Result<()> {
    let clients = match dir.read("ca.key")? {
        Some(_) => Authority::open(dir).context("opening this host's certificate authority")?.clients()?.clients,
        None => Vec::new(),
    };
    if json {
        println!("{}", serde_json::to_string(&clients)?);
        return Ok(());
    }
    let now = unix_now();
    let reg = crest_tls::Register { clients };
    for c in &reg.clients {
        let state = match c.revoked {
            Some(_) => "revoked".to_string(),
            None if c.expires <= now => "expired".to_string(),
            None if reg.renewed(c) => format!("renewed, valid {}", human_secs(c.expires - now)),
            None => format!("valid {}", human_secs(c.expires - now)),
        };
        println!("{}  {:<24} {:<22} {}", &c.fingerprint[..16], c.name, state, c.via);
    }
    let joined = joined_certificates(dir)?;
    if !joined.is_empty() {
        println!("held by this host for servers it joined:");
        for held in joined {
            println!("  {}  {}", held.addr, crate::renew::describe(&held, now));
        }
    }
    Ok(())
}

/// `crest cert list --joined`.
fn list_joined(dir: &StateDir, json: bool) -> Result<()> {
    let joined = joined_certificates(dir)?;
    if json {
        let all: Vec<serde_json::Value> = joined.iter().map(crate::renew::describe_json).collect();
        println!("{}", serde_json::to_string(&all)?);
        return Ok(());
    }
    let now = unix_now();
    for held in joined {
        println!("{}  {}", held.addr, crate::renew::describe(&held, now));
    }
    Ok(())
}

/// The certificates this host holds for the servers it joined.
fn joined_certificates(dir: &StateDir) -> Result<Vec<crest_tls::Held>> {
    if !dir.usable()? {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for addr in Credentials::joined_servers(dir)? {
        out.extend(crest_tls::Held::joined(dir, &addr)?);
    }
    Ok(out)
}

/// `crest join ADDR TOKEN`: redeems the token at `addr` for a certificate and keeps it
/// for mounts of `addr`. `addr` is already completed (`host:port`).
pub fn join(dir: &StateDir, addr: &str, token: &str) -> Result<String> {
    let token = crest_tls::Token::parse(token).map_err(|e| anyhow!(e))?;
    let name = crest_proto::clip_client_name(&hostname());
    let (key_pem, csr) = crest_tls::certificate_request(&name)?;
    let req = crest_proto::Join {
        magic: crest_proto::HELLO_MAGIC,
        version: crest_proto::PROTOCOL_VERSION,
        token: token.encode(),
        name,
        csr,
    };
    let config = crest_tls::join_config(token.ca)?;
    let joined = crest_net::join(addr, config, req, Duration::from_secs(30)).map_err(|e| anyhow!(e))?;
    if crest_tls::Fingerprint::of(&joined.ca) != token.ca {
        bail!("{addr} sent a CA other than the one the token names");
    }
    Credentials::save_joined(
        dir,
        addr,
        &crest_tls::cert_pem(&joined.ca),
        &crest_tls::cert_pem(&joined.cert),
        &key_pem,
    )?;
    Ok(joined.name)
}

/// The TLS configuration a mount of `addr` uses (None: `--insecure`): for a server this
/// host joined, the certificate kept for it at each connection (renewed meanwhile or not).
pub fn client_tls(dir: &StateDir, addr: &str, insecure: bool) -> Result<Option<Arc<crest_tls::ClientConfig>>> {
    if insecure {
        return Ok(None);
    }
    Ok(Some(crest_tls::mount_config(dir, addr)?))
}

/// How `crest serve` secures connections: TLS with this host's authority (issuing client
/// certificates that live `client_lifetime` seconds if given, a year if not), or plaintext
/// on loopback only.
pub fn server_security(
    dir: &StateDir,
    listen: &str,
    insecure: bool,
    client_lifetime: Option<u64>,
) -> Result<crest_serve::Security> {
    if !insecure {
        let mut auth = Authority::open(dir).context("opening this host's certificate authority")?;
        if let Some(secs) = client_lifetime {
            auth.set_client_validity(secs)?;
            tracing::warn!("client certificates issued now live {secs} s (--client-cert-lifetime, for tests)");
        }
        return Ok(crest_serve::Security::Tls(Arc::new(auth)));
    }
    let addrs: Vec<std::net::SocketAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(listen).with_context(|| format!("resolving {listen}"))?.collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        bail!(
            "--insecure serves without encryption or authentication, so only on a loopback address \
             (127.0.0.1, ::1), not {listen}; drop --insecure to serve with TLS"
        );
    }
    eprintln!("crest: WARNING: --insecure: no encryption and no authentication; any local user can mount this");
    Ok(crest_serve::Security::Insecure)
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "client".into())
}

/// "243 days", "5 hours", "12 minutes", "40 s".
pub fn human_secs(s: u64) -> String {
    match s {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s if s >= 120 => format!("{} minutes", s / 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ttl;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("1h"), Ok(3600));
        assert_eq!(parse_ttl("30m"), Ok(1800));
        assert_eq!(parse_ttl("90"), Ok(90));
        assert_eq!(parse_ttl("7d"), Ok(7 * 86_400));
        for bad in ["", "0", "8d", "1w", "h", "-1h", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }
}
