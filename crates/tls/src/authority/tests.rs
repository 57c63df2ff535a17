use std::sync::Arc;

use rustls::{ClientConnection, ServerConnection};

use super::*;
use crate::{cert_pem, certificate_request, client_config, join_config, peer_fingerprint, Credentials};

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
    let name = rustls::pki_types::ServerName::try_from(crate::SERVER_NAME).expect("name");
    let mut c = ClientConnection::new(client, name).expect("client");
    let mut s = ServerConnection::new(server.server_config().expect("server config")).expect("server");
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
    assert_eq!(auth.admit(&fp).map(|a| a.name), Ok("laptoprm-rf".into()), "the name is cleaned");

    // Revoked by another process (the CLI): the server's view follows the file.
    let cli = Authority::open(auth.dir()).expect("cli");
    assert_eq!(cli.revoke("laptoprm-rf").expect("revoke").len(), 1);
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

#[test]
fn a_joining_client_never_gets_the_hosts_own_name() {
    let (_tmp, auth) = host();
    let token = auth.create_token(600, None).expect("token").encode();
    let creds = join(&auth, &token, "local").expect("join");
    let (r, server) = connect(client_config(&creds).expect("config"), &auth);
    r.expect("handshake");
    let who = auth.admit(&peer_fingerprint(&server).expect("cert")).expect("admitted");
    assert_eq!(who, Admitted { name: "local-joined".into(), local: false });
    let token = auth.create_token(600, Some("local")).expect("token").encode();
    let creds = join(&auth, &token, "x").expect("join");
    let (r, server) = connect(client_config(&creds).expect("config"), &auth);
    r.expect("handshake");
    assert!(!auth.admit(&peer_fingerprint(&server).expect("cert")).expect("admitted").local);
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
