//! Mutual TLS against a real server: who gets in, who may only join, and that a revoked
//! client is put out while an honest one beside it goes on.
//!
//! The waits here are guards against a hang, never the measure of a result.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crest_net::{Client, ClientError, ClientOptions};
use crest_proto::{self as p, ClientMessage, Op, Reply, ServerMessage};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};
use crest_tls::{Authority, Credentials, StateDir};

const HANG_GUARD: Duration = Duration::from_secs(30);

struct Host {
    _tmp: tempfile::TempDir,
    dir: StateDir,
    auth: Arc<Authority>,
}

fn host() -> Host {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::new(tmp.path().join("state"));
    let auth = Arc::new(Authority::open(&dir).expect("authority"));
    Host { _tmp: tmp, dir, auth }
}

/// A TLS server on a fresh image, on a runtime of its own.
fn serve(host: &Host) -> (tokio::runtime::Runtime, crest_serve::Serving) {
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(Box::new(disk.clone()), &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None })
        .expect("mkfs");
    let store = Store::open(Box::new(disk)).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let security = crest_serve::Security::Tls(host.auth.clone());
    let serving = rt.block_on(crest_serve::start(store, "127.0.0.1:0", security)).expect("serve");
    (rt, serving)
}

fn connect(addr: SocketAddr, creds: &Credentials) -> Result<Client, ClientError> {
    let opts = ClientOptions {
        tls: Some(crest_tls::client_config(creds).expect("config")),
        connect_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    Client::connect(&addr.to_string(), opts)
}

fn works(c: &Client) -> bool {
    matches!(c.call_one(Op::GetAttr { ino: 1 }), Ok(Reply::Attr(_)))
}

/// Joins `addr` with `token` as `crest join` does: the credentials, or the refusal.
fn join(addr: SocketAddr, token: &str) -> Result<Credentials, ClientError> {
    let t = crest_tls::Token::parse(token).expect("token");
    let (key_pem, csr) = crest_tls::certificate_request("joiner").expect("request");
    let req = p::Join {
        magic: p::HELLO_MAGIC,
        version: p::PROTOCOL_VERSION,
        token: token.into(),
        name: "joiner".into(),
        csr,
    };
    let j = crest_net::join(&addr.to_string(), crest_tls::join_config(t.ca).expect("config"), req, HANG_GUARD)?;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::new(tmp.path().join("s"));
    Credentials::save_joined(&dir, "x", &crest_tls::cert_pem(&j.ca), &crest_tls::cert_pem(&j.cert), &key_pem)
        .expect("save");
    Ok(Credentials::joined(&dir, "x").expect("read").expect("saved"))
}

fn hello() -> ClientMessage {
    ClientMessage::Hello(p::Hello {
        magic: p::HELLO_MAGIC,
        version: p::PROTOCOL_VERSION,
        client_name: "raw".into(),
        resume: None,
    })
}

/// Sends `m` on a TLS connection that shows no certificate; the server's one answer.
fn anonymous(addr: SocketAddr, ca: crest_tls::Fingerprint, m: &ClientMessage) -> Option<ServerMessage> {
    let config = crest_tls::join_config(ca).expect("config");
    let name = rustls::pki_types::ServerName::try_from(crest_tls::SERVER_NAME).expect("name");
    let conn = rustls::ClientConnection::new(config, name).expect("client");
    let sock = TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut buf = Vec::new();
    p::encode_frame(m, &mut buf).expect("encode");
    tls.write_all(&buf).expect("send");
    let mut decoder = p::FrameDecoder::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some(m)) = decoder.poll_message::<ServerMessage>() {
            return Some(m);
        }
        match tls.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => decoder.handle_bytes(&chunk[..n]),
        }
    }
}

#[test]
fn the_hosts_own_certificate_gets_in_and_a_connection_without_one_may_only_join() {
    let h = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let local = Credentials::local(&h.dir).expect("read").expect("made by the authority");
    let c = connect(addr, &local).expect("the host's own certificate");
    assert!(works(&c));

    // No certificate: a hello is refused, with what to do.
    match anonymous(addr, h.auth.ca_fingerprint(), &hello()) {
        Some(ServerMessage::Refused { reason, .. }) => assert!(reason.contains("join"), "{reason}"),
        other => panic!("a hello without a certificate got {other:?}"),
    }

    // Plaintext to a TLS server: never a session.
    let mut raw = TcpStream::connect(addr).expect("connect");
    raw.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
    let mut buf = Vec::new();
    p::encode_frame(&hello(), &mut buf).expect("encode");
    raw.write_all(&buf).expect("send");
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    let mut d = p::FrameDecoder::new();
    d.handle_bytes(&got);
    assert!(!matches!(d.poll_message::<ServerMessage>(), Ok(Some(ServerMessage::Welcome(_)))));
    assert!(works(&c), "the honest client goes on");
}

#[test]
fn a_token_joins_once_and_certificates_of_other_hosts_are_refused() {
    let h = host();
    let other = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;

    let token = h.auth.create_token(600, None).expect("token").encode();
    let creds = join(addr, &token).expect("join");
    let c = connect(addr, &creds).expect("the joined certificate");
    assert!(works(&c));
    match join(addr, &token) {
        Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("used"), "{reason}"),
        other => panic!("a second join with one token: {other:?}"),
    }
    let foreign = other.auth.create_token(600, None).expect("token").encode();
    assert!(matches!(join(addr, &foreign), Err(ClientError::Untrusted { .. })), "pins the other host's CA");

    // The other host's own certificate, trusting this server's CA: refused in the handshake.
    let theirs = Credentials::local(&other.dir).expect("read").expect("local");
    let mixed = Credentials { ca: creds.ca.clone(), ..theirs };
    match connect(addr, &mixed) {
        Err(ClientError::Untrusted { detail, .. }) => assert!(detail.contains("crest join"), "{detail}"),
        other => panic!("a foreign certificate: {:?}", other.map(|_| "connected")),
    }
    // A client pinning the other host's CA does not trust this server.
    let theirs = Credentials::local(&other.dir).expect("read").expect("local");
    assert!(matches!(connect(addr, &theirs), Err(ClientError::Untrusted { .. })));
}

#[test]
fn a_revoked_client_is_put_out_and_kept_out_while_another_goes_on() {
    let h = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let local = connect(addr, &Credentials::local(&h.dir).expect("read").expect("local")).expect("local");
    let creds = join(addr, &h.auth.create_token(600, None).expect("token").encode()).expect("join");
    let joined = connect(addr, &creds).expect("joined");
    assert!(works(&joined));

    // Revoked by another process, as `crest cert revoke` does.
    let cli = Authority::open(&h.dir).expect("cli");
    assert_eq!(cli.revoke("joiner").expect("revoke").len(), 1);
    let start = Instant::now();
    loop {
        match joined.call_one(Op::GetAttr { ino: 1 }) {
            Err(e) if e.errno == 107 => break,
            _ if start.elapsed() > HANG_GUARD => panic!("the revoked client is still served"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    match connect(addr, &creds) {
        Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("revoked"), "{reason}"),
        other => panic!("a revoked certificate connected again: {:?}", other.map(|_| "connected")),
    }
    assert!(works(&local), "the other client goes on");
}
