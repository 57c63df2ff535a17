use std::sync::Arc;

use rustls::{ClientConnection, ServerConnection};

use super::*;
use crate::{
    cert_pem, certificate_request, client_config, join_config, mount_config, peer_fingerprint, renew_joined,
    Credentials, Renewal,
};

/// Runs a TLS handshake between the two ends in memory; the first error either side sees.
fn handshake(client: &mut ClientConnection, server: &mut ServerConnection) -> Result<(), rustls::Error> {
    for _ in 0..20 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            server.read_tls(&mut rd).map_err(|e| rustls::Error::General(e.to_string()))?;
            server.process_new_packets()?;
        }
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).map_err(|e| rustls::Error::General(e.to_string()))?;
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            client.read_tls(&mut rd).map_err(|e| rustls::Error::General(e.to_string()))?;
            client.process_new_packets()?;
        }
        if !client.is_handshaking() && !server.is_handshaking() && !client.wants_write() {
            return Ok(());
        }
    }
    Err(rustls::Error::General("handshake did not finish".into()))
}

fn connect(client: Arc<rustls::ClientConfig>, server: &Authority) -> (Result<(), rustls::Error>, ServerConnection) {
    connect_to(client, server.server_config().expect("server config"))
}

/// A connection to a server whose configuration (and so its TLS session cache) lives on,
/// as a running server's does.
fn connect_to(
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
) -> (Result<(), rustls::Error>, ServerConnection) {
    let name = rustls::pki_types::ServerName::try_from(crate::SERVER_NAME).expect("name");
    let mut c = ClientConnection::new(client, name).expect("client");
    let mut s = ServerConnection::new(server).expect("server");
    (handshake(&mut c, &mut s), s)
}

fn host() -> (tempfile::TempDir, Authority) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::new(tmp.path().join("state"));
    let auth = Authority::open(&dir).expect("authority");
    (tmp, auth)
}

/// A client joins with a token as `crest join` does; returns its credentials.
fn join(auth: &Authority, token: &str, name: &str) -> Result<Credentials, JoinError> {
    let (key_pem, csr) = certificate_request(name).expect("request");
    let issued = auth.redeem(token, name, &csr)?;
    Ok(Credentials {
        ca: issued.ca.into(),
        chain: vec![issued.cert.into()],
        key: crate::config::key_from_pem(&key_pem, "key").expect("key"),
        origin: "test".into(),
    })
}

#[test]
fn the_host_mounts_its_own_server_and_the_server_knows_who_it_is() {
    let (_tmp, auth) = host();
    let local = Credentials::local(auth.dir()).expect("read").expect("local credentials made");
    let (r, server) = connect(client_config(&local).expect("config"), &auth);
    r.expect("handshake");
    let fp = peer_fingerprint(&server).expect("a client certificate");
    assert_eq!(auth.admit(&fp), Ok(Admitted { name: "local".into(), local: true }));
    // Opening again keeps the same CA.
    let again = Authority::open(auth.dir()).expect("reopen");
    assert_eq!(again.ca_fingerprint(), auth.ca_fingerprint());
}

#[test]
fn connections_seal_with_aes_128_gcm() {
    let (_tmp, auth) = host();
    let local = Credentials::local(auth.dir()).expect("read").expect("local credentials made");
    let (r, server) = connect(client_config(&local).expect("config"), &auth);
    r.expect("handshake");
    let suite = server.negotiated_cipher_suite().expect("a suite").suite();
    assert_eq!(suite, rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
}

#[test]
fn a_token_joins_once_and_its_certificate_is_admitted_until_revoked() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, None).expect("token").encode();
    assert_eq!(auth.tokens().expect("tokens").len(), 1);
    let creds = join(&auth, &token, "laptop\n; rm -rf /").expect("join");
    assert!(join(&auth, &token, "again").is_err_and(|e| e.0.contains("used")), "a token is single-use");
    assert!(auth.tokens().expect("tokens").is_empty());

    let (r, server) = connect(client_config(&creds).expect("config"), &auth);
    r.expect("handshake");
    let fp = peer_fingerprint(&server).expect("certificate");
    let name = auth.admit(&fp).expect("admitted").name;
    let suffix = name.strip_prefix("laptoprm-rf-").expect("the asked name, cleaned, is a hint");
    assert!(suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");

    // Revoked by another process (the CLI): the server's view follows the file.
    let cli = Authority::open(auth.dir()).expect("cli");
    assert_eq!(cli.revoke(&name).expect("revoke").len(), 1);
    assert!(auth.admit(&fp).is_err_and(|e| e.contains("revoked")));
    assert!(auth.revoked().contains(&fp));
}

#[test]
fn expired_forged_and_foreign_tokens_are_refused() {
    let (_tmp, auth) = host();
    let (_tmp2, other) = host();
    let expired = auth.create_token(0, None).expect("token").encode();
    assert!(join(&auth, &expired, "x").is_err());
    assert!(auth.tokens().expect("tokens").is_empty(), "expired tokens are cleaned up");

    let good = auth.create_token(600, Some("named")).expect("token");
    let mut forged = good.clone();
    forged.secret[3] ^= 1;
    assert!(join(&auth, &forged.encode(), "x").is_err());
    let foreign = other.create_token(600, None).expect("token").encode();
    assert!(join(&auth, &foreign, "x").is_err_and(|e| e.0.contains("another server")));
    assert!(join(&auth, "crest1-garbage", "x").is_err());
    let creds = join(&auth, &good.encode(), "asked").expect("the real token still works");
    let (r, server) = connect(client_config(&creds).expect("config"), &auth);
    r.expect("handshake");
    assert_eq!(auth.admit(&peer_fingerprint(&server).expect("cert")).map(|a| a.name), Ok("named".into()));
}

/// The name the server gave the certificate `creds` holds.
fn name_of(auth: &Authority, creds: &Credentials) -> Admitted {
    let (r, server) = connect(client_config(creds).expect("config"), auth);
    r.expect("handshake");
    auth.admit(&peer_fingerprint(&server).expect("cert")).expect("admitted")
}

#[test]
fn a_joining_client_never_gets_the_hosts_own_name() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, None).expect("token").encode();
    let who = name_of(&auth, &join(&auth, &token, "local").expect("join"));
    assert!(who.name.starts_with("local-") && !who.local, "{who:?}");
    assert!(auth.create_token(600, Some("local")).is_err(), "no token names the host's own certificate");
}

#[test]
fn a_token_holder_cannot_choose_its_identity() {
    let (_tmp, auth) = host();
    // The administrator's hosts, joined with named tokens.
    let ops = auth.create_token(600, Some("ops")).expect("token").encode();
    assert_eq!(name_of(&auth, &join(&auth, &ops, "whatever").expect("join")).name, "ops");
    let mut seen = vec!["ops".to_string()];
    // Holders of unnamed tokens asking for those names, or the same name again and again,
    // each get a name of their own.
    for asked in ["ops", "ops", "build7", "local", "", "ops-00000000", &"x".repeat(200)] {
        let token = auth.create_token(600, None).expect("token").encode();
        let got = name_of(&auth, &join(&auth, &token, asked).expect("join")).name;
        assert!(!seen.contains(&got), "{got:?} issued twice");
        assert!(got.len() <= 64 && got != "ops" && got != "build7", "asked {asked:?}, got {got:?}");
        seen.push(got);
    }
    // A name once issued is never promised again, revoked or not.
    assert!(auth.create_token(600, Some("ops")).is_err_and(|e| e.to_string().contains("already issued")));
    auth.revoke("ops").expect("revoke");
    assert!(auth.create_token(600, Some("ops")).is_err(), "a revoked name stays its key's");
    // Nor do two pending tokens promise one name.
    auth.create_token(600, Some("build8")).expect("token");
    assert!(auth.create_token(600, Some("build8")).is_err());
    // Names an administrator types are checked, not silently changed.
    for bad in ["", "a b", "x/y", "évé", &"n".repeat(65)] {
        assert!(auth.create_token(600, Some(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn a_named_token_is_refused_if_its_name_was_issued_meanwhile() {
    let (_tmp, auth) = host();
    let first = auth.create_token(600, Some("build9")).expect("token").encode();
    // Another process's register edit (a restored backup, a hand edit) issues the name.
    let mut reg = auth.clients().expect("register");
    let mut rec = reg.clients[0].clone();
    rec.name = "build9".into();
    rec.fingerprint = "00".repeat(32);
    reg.clients.push(rec);
    reg.save(auth.dir()).expect("save");
    assert!(join(&auth, &first, "x").is_err_and(|e| e.0.contains("issued meanwhile")));
}

#[test]
fn a_certificate_of_another_host_does_not_get_in() {
    let (_tmp, auth) = host();
    let (_tmp2, other) = host();
    let foreign = Credentials::local(other.dir()).expect("read").expect("local");
    // Trusting our CA but presenting the other host's certificate: the server's
    // verifier refuses it during the handshake.
    let mixed = Credentials { ca: Credentials::local(auth.dir()).expect("r").expect("l").ca, ..foreign };
    let (r, _) = connect(client_config(&mixed).expect("config"), &auth);
    assert!(r.is_err(), "a certificate from another CA must fail the handshake");
    // And a client pinning the other CA refuses this server.
    let theirs = Credentials::local(other.dir()).expect("read").expect("local");
    let (r, _) = connect(client_config(&theirs).expect("config"), &auth);
    assert!(r.is_err(), "the server must chain to the pinned CA");
}

#[test]
fn a_joining_client_authenticates_the_server_by_the_tokens_fingerprint() {
    let (_tmp, auth) = host();
    let (_tmp2, other) = host();
    let (r, server) = connect(join_config(auth.ca_fingerprint()).expect("config"), &auth);
    r.expect("the right server");
    assert_eq!(peer_fingerprint(&server), None, "a joining client shows no certificate");
    let (r, _) = connect(join_config(other.ca_fingerprint()).expect("config"), &auth);
    assert!(r.is_err_and(|e| e.to_string().contains("not the one the token names")));
}

#[test]
fn certificates_survive_pem() {
    let (_tmp, auth) = host();
    let ca = Credentials::local(auth.dir()).expect("r").expect("l").ca;
    assert_eq!(crate::config::cert_from_pem(&cert_pem(&ca), "x").expect("parse").as_ref(), ca.as_ref());
}

const ADDR: &str = "server:7410";

/// A client host that joined `auth` with `token` as `crest join` does: its state
/// directory, holding the credentials under `ADDR`.
fn joined_host(auth: &Authority, token: &str, tmp: &tempfile::TempDir) -> StateDir {
    let dir = StateDir::new(tmp.path().join("client"));
    let (key_pem, csr) = certificate_request("laptop").expect("request");
    let issued = auth.redeem(token, "laptop", &csr).expect("join");
    Credentials::save_joined(&dir, ADDR, &cert_pem(&issued.ca), &cert_pem(&issued.cert), &key_pem).expect("save");
    dir
}

/// A renewal as the network would carry it: a connection made with `config`, on which the
/// server renews the certificate the handshake presented.
fn exchange(auth: &Authority) -> impl FnOnce(Arc<rustls::ClientConfig>, Vec<u8>) -> Result<Issued, String> + '_ {
    move |config, csr| {
        let (r, server) = connect(config, auth);
        r.map_err(|e| e.to_string())?;
        let fp = peer_fingerprint(&server).ok_or("no client certificate")?;
        auth.renew(&fp, &csr).map_err(|e| e.0)
    }
}

/// Makes the register say the certificate `fp` (hex) has `left` seconds of a 300 s life
/// left, as if it had been issued earlier.
fn age(auth: &Authority, fp: &str, left: u64) {
    let mut reg = auth.clients().expect("register");
    let r = reg.clients.iter_mut().find(|r| r.fingerprint == fp).expect("issued");
    r.expires = unix_now() + left;
    r.issued = r.expires - 300;
    reg.save(auth.dir()).expect("save");
}

#[test]
fn client_certificates_live_as_long_as_the_server_says() {
    let (_tmp, mut auth) = host();
    assert!(auth.set_client_validity(MIN_CLIENT_VALIDITY - 1).is_err());
    assert!(auth.set_client_validity(CLIENT_VALIDITY + 1).is_err());
    auth.set_client_validity(90).expect("90 s");
    let token = auth.create_token(600, None).expect("token").encode();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = joined_host(&auth, &token, &tmp);
    let held = crate::Held::joined(&dir, ADDR).expect("read").expect("joined");
    assert_eq!(held.lifetime.life(), 90);
    // The register records the life the certificate states: client and server judge a
    // renewal by the same dates.
    let reg = auth.clients().expect("register");
    let r = reg.clients.iter().find(|r| r.fingerprint == held.fingerprint.hex()).expect("registered");
    assert_eq!((r.issued, r.expires), (held.lifetime.issued, held.lifetime.expires));
    assert!(r.issued.abs_diff(unix_now()) <= 2, "issued now, though valid from an hour ago");
}

#[test]
fn a_joined_host_renews_when_a_third_is_left_and_keeps_its_name() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, Some("build7")).expect("token").encode();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = joined_host(&auth, &token, &tmp);
    let old = crate::Held::joined(&dir, ADDR).expect("read").expect("joined");
    assert_eq!(old.name, "build7");
    // A year's certificate, just issued: nothing to do, and the server refuses it early.
    assert_eq!(renew_joined(&dir, ADDR, false, exchange(&auth)).expect("look"), Renewal::NotDue(old.clone()));
    let early = renew_joined(&dir, ADDR, true, exchange(&auth));
    assert!(matches!(&early, Err(Error::Renewal(e)) if e.contains("too early")), "{early:?}");
    assert_eq!(auth.clients().expect("register").clients.len(), 2, "nothing issued");

    // With a third of its life left (the register's dates are the server's judge), it is
    // renewed for the same name, and the host keeps the new certificate and key.
    age(&auth, &old.fingerprint.hex(), 99);
    let done = renew_joined(&dir, ADDR, true, exchange(&auth)).expect("renewed");
    let Renewal::Renewed { old: was, new } = done else { panic!("not renewed: {done:?}") };
    assert_eq!(was, old);
    assert_eq!(new.name, "build7");
    assert_ne!(new.fingerprint, old.fingerprint);
    assert_eq!(new.lifetime.life(), CLIENT_VALIDITY);
    assert_eq!(crate::Held::joined(&dir, ADDR).expect("read"), Some(new.clone()));
    let reg = auth.clients().expect("register");
    let r = reg.clients.iter().find(|r| r.fingerprint == new.fingerprint.hex()).expect("registered");
    assert_eq!((r.name.as_str(), r.via.clone()), ("build7", format!("renewal of {}", &old.fingerprint.hex()[..16])));
    assert!(!dir.path().join("joined/.next-server_7410").exists(), "nothing left of the replacement");
    let creds = Credentials::joined(&dir, ADDR).expect("read").expect("joined");
    assert_eq!(name_of(&auth, &creds), Admitted { name: "build7".into(), local: false });
    // The old certificate stays valid until it expires.
    assert_eq!(auth.admit(&old.fingerprint).map(|a| a.name), Ok("build7".into()));
    // The new one is not due for months.
    assert!(matches!(renew_joined(&dir, ADDR, false, exchange(&auth)), Ok(Renewal::NotDue(_))));

    // Revoking the name revokes both; a revoked certificate renews nothing.
    assert_eq!(auth.revoke("build7").expect("revoke").len(), 2);
    age(&auth, &new.fingerprint.hex(), 50);
    let refused = renew_joined(&dir, ADDR, true, exchange(&auth));
    assert!(refused.is_err(), "{refused:?}");
    let issued = auth.clients().expect("register").clients.len();
    let (_, csr) = certificate_request("x").expect("request");
    assert!(auth.renew(&new.fingerprint, &csr).is_err_and(|e| e.0.contains("revoked")));
    assert_eq!(auth.clients().expect("register").clients.len(), issued, "nothing issued");
}

#[test]
fn a_renewal_cannot_choose_its_name_nor_mint_certificates() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, None).expect("token").encode();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = joined_host(&auth, &token, &tmp);
    let old = crate::Held::joined(&dir, ADDR).expect("read").expect("joined");
    age(&auth, &old.fingerprint.hex(), 99);
    // The request asks for the administrator's names: the server signs the old name.
    let mut successors = Vec::new();
    for asked in ["ops", "local", "build7"] {
        let (_, csr) = certificate_request(asked).expect("request");
        let issued = auth.renew(&old.fingerprint, &csr).expect("renewed");
        assert_eq!(issued.name, old.name);
        assert_eq!(crate::cert_name(&issued.cert).expect("name"), old.name, "asked {asked:?}");
        let admitted = auth.admit(&Fingerprint::of(&issued.cert)).expect("admitted");
        assert_eq!(admitted, Admitted { name: old.name.clone(), local: false });
        successors.push(Fingerprint::of(&issued.cert));
    }
    // Renewed again and again, one certificate has one live successor: the last.
    let live: Vec<bool> = successors.iter().map(|fp| auth.admit(fp).is_ok()).collect();
    assert_eq!(live, [false, false, true]);
    // The host's own certificate is not renewed over the network.
    let local = Credentials::local(auth.dir()).expect("read").expect("local");
    let (r, server) = connect(client_config(&local).expect("config"), &auth);
    r.expect("handshake");
    let (_, csr) = certificate_request("local").expect("request");
    let own = auth.renew(&peer_fingerprint(&server).expect("cert"), &csr);
    assert!(own.is_err_and(|e| e.0.contains("host's own")));
    // Nor an unknown certificate, nor a request that is no request.
    assert!(auth.renew(&Fingerprint([7; 32]), &csr).is_err_and(|e| e.0.contains("not issued")));
    assert!(auth.renew(&old.fingerprint, b"junk").is_err_and(|e| e.0.contains("request")));
}

#[test]
fn a_mount_reconnects_with_the_certificate_renewed_meanwhile() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, None).expect("token").encode();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = joined_host(&auth, &token, &tmp);
    let old = crate::Held::joined(&dir, ADDR).expect("read").expect("joined");
    // One configuration for the mount's life, as `crest mount` makes it, and one for the
    // server's.
    let config = mount_config(&dir, ADDR).expect("config");
    let server_config = auth.server_config().expect("server config");
    let presented = |config: &Arc<rustls::ClientConfig>| {
        let (r, server) = connect_to(config.clone(), server_config.clone());
        r.expect("handshake");
        peer_fingerprint(&server).expect("cert")
    };
    assert_eq!(presented(&config), old.fingerprint);
    assert_eq!(presented(&config), old.fingerprint, "again");
    age(&auth, &old.fingerprint.hex(), 99);
    let Renewal::Renewed { new, .. } = renew_joined(&dir, ADDR, true, exchange(&auth)).expect("renew") else {
        panic!("not renewed")
    };
    // The next connection presents the new certificate (not a resumed session of the old).
    assert_eq!(presented(&config), new.fingerprint);
    // The host's own certificate serves a server it did not join.
    let local = mount_config(auth.dir(), ADDR).expect("config");
    assert_eq!(auth.admit(&presented(&local)).map(|a| a.local), Ok(true));
}
