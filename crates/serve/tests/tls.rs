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
    serving_limited(host, crest_serve::Options::default().sessions_per_identity)
}

/// `serve`, with at most `sessions` sessions per client identity.
fn serving_limited(host: &Host, sessions: usize) -> (tokio::runtime::Runtime, crest_serve::Serving) {
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    let store = Store::open(Box::new(disk)).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let security = crest_serve::Security::Tls(host.auth.clone());
    let options = crest_serve::Options { sessions_per_identity: sessions, ..Default::default() };
    let serving = rt.block_on(crest_serve::start_with(store, "127.0.0.1:0", security, options)).expect("serve");
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
    join_as(addr, token, "joiner")
}

/// `join`, asking for the name `asked` (in the request and the join message both).
fn join_as(addr: SocketAddr, token: &str, asked: &str) -> Result<Credentials, ClientError> {
    let t = crest_tls::Token::parse(token).expect("token");
    let (key_pem, csr) = crest_tls::certificate_request(asked).expect("request");
    let req =
        p::Join { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, token: token.into(), name: asked.into(), csr };
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
        dataset: String::new(),
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
    let creds = join(addr, &h.auth.create_token(600, Some("joiner")).expect("token").encode()).expect("join");
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

/// A client that says it calls as whoever `who` holds.
fn as_anyone(addr: SocketAddr, creds: &Credentials) -> (Client, Arc<std::sync::Mutex<p::Caller>>) {
    let c = connect(addr, creds).expect("connect");
    let who = Arc::new(std::sync::Mutex::new(p::Caller::ROOT));
    let w = who.clone();
    c.set_caller_source(Box::new(move || w.lock().expect("caller").clone()));
    (c, who)
}

fn caller(uid: u32) -> p::Caller {
    p::Caller { uid, gid: uid, groups: Vec::new() }
}

fn create(parent: u64, name: &str, kind: p::FileType, mode: u32, uid: u32) -> Op {
    Op::Create { parent, name: name.into(), kind, mode, rdev: 0, cred: p::Cred { uid, gid: uid, umask: 0 } }
}

fn errno(r: Result<Reply, p::OpError>) -> i32 {
    match r {
        Ok(r) => panic!("allowed: {r:?}"),
        Err(e) => e.errno,
    }
}

fn entry(r: Result<Reply, p::OpError>) -> p::Attr {
    match r {
        Ok(Reply::Entry(a) | Reply::Attr(a)) => a,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_joined_host_claiming_any_uid_cannot_exceed_its_policy() {
    let h = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    // Root on the server's own host (trusted) lays out users' files.
    let (local, _) = as_anyone(addr, &Credentials::local(&h.dir).expect("read").expect("local"));
    let secret = entry(local.call_one(create(1, "secret", p::FileType::Regular, 0o600, 1000)));
    local.call_one(Op::Write { ino: secret.ino, offset: 0, data: b"alice's".to_vec() }).expect("write");
    let home = entry(local.call_one(create(1, "home", p::FileType::Directory, 0o700, 1000)));
    let rootfile = entry(local.call_one(create(1, "rootfile", p::FileType::Regular, 0o644, 0)));
    let public = entry(local.call_one(create(1, "pub", p::FileType::Directory, 0o777, 0)));

    let creds = join(addr, &h.auth.create_token(600, None).expect("token").encode()).expect("join");
    let (m, as_m) = as_anyone(addr, &creds);
    for uid in [0, 2000] {
        *as_m.lock().expect("caller") = caller(uid);
        assert_eq!(errno(m.call_one(Op::Read { ino: secret.ino, offset: 0, len: 64 })), 13, "read as {uid}");
        let w = Op::Write { ino: secret.ino, offset: 0, data: b"mallory".to_vec() };
        assert_eq!(errno(m.call_one(w)), 13, "write as {uid}");
        let chown = p::SetAttr { uid: Some(uid), ..Default::default() };
        assert_eq!(errno(m.call_one(Op::SetAttr { ino: secret.ino, set: chown })), 1, "chown as {uid}");
        let old = p::SetAttr { mtime: Some(p::SetTime::At(p::Time { sec: 0, nsec: 0 })), ..Default::default() };
        assert_eq!(errno(m.call_one(Op::SetAttr { ino: rootfile.ino, set: old })), 1, "utimes 1970 as {uid}");
        let lock = Op::SetLock {
            ino: secret.ino,
            owner: 1,
            start: 0,
            end: p::LOCK_TO_EOF,
            kind: p::LockKind::Write,
            flock: false,
            pid: 1,
        };
        assert_eq!(errno(m.call_one(lock)), 13, "lock as {uid}");
        assert_eq!(
            errno(m.call_one(Op::Lookup { parent: home.ino, name: b"x".to_vec() })),
            13,
            "look in 0700 as {uid}"
        );
        let dev = Op::Create {
            parent: public.ino,
            name: format!("dev{uid}").into(),
            kind: p::FileType::CharDevice,
            mode: 0o666,
            rdev: 0x0501,
            cred: p::Cred::default(),
        };
        assert_eq!(errno(m.call_one(dev)), 1, "device node as {uid}");
        // A setuid program claimed for root: the file is the caller's (root squashed to
        // nobody), and not setuid.
        let planted = entry(m.call_one(create(public.ino, &format!("sh{uid}"), p::FileType::Regular, 0o4755, 0)));
        assert_eq!((planted.uid, planted.mode & 0o7000), (if uid == 0 { 65534 } else { uid }, 0), "{planted:?}");
        let chmod = p::SetAttr { mode: Some(0o4755), ..Default::default() };
        m.call_one(Op::SetAttr { ino: planted.ino, set: chmod }).expect("chmod of its own file");
        let after = entry(local.call_one(Op::GetAttr { ino: planted.ino }));
        assert_eq!(after.mode & 0o7000, 0, "setuid refused by the policy");
    }
    // Writeback stamped with a clock far off: the server's clock is used.
    *as_m.lock().expect("caller") = caller(2000);
    let mine = entry(m.call_one(create(public.ino, "mine", p::FileType::Regular, 0o644, 2000)));
    let (tx, rx) = std::sync::mpsc::channel();
    let w = vec![Op::Write { ino: mine.ino, offset: 0, data: b"x".to_vec() }];
    let done: crest_net::Completion = Box::new(move |r| {
        let _ = tx.send(r.is_ok());
    });
    m.async_permit(64).submit(w, p::Time { sec: 0, nsec: 0 }, done).expect("submit");
    m.flush_writeback();
    assert!(rx.recv_timeout(HANG_GUARD).expect("answered"), "the write itself is allowed");
    let stamped = entry(local.call_one(Op::GetAttr { ino: mine.ino }));
    assert!(stamped.mtime.sec > 1_000_000_000, "mtime from 1970 kept: {:?}", stamped.mtime);
    // The honest side lost nothing.
    let Ok(Reply::Data(d)) = local.call_one(Op::Read { ino: secret.ino, offset: 0, len: 64 }) else { panic!() };
    assert_eq!(d, b"alice's");
}

#[test]
fn an_export_policy_makes_a_host_read_only() {
    let h = host();
    h.dir.write("exports.json", br#"{"clients": {"joiner": {"read_only": true}}}"#).expect("exports");
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let creds = join(addr, &h.auth.create_token(600, Some("joiner")).expect("token").encode()).expect("join");
    let c = connect(addr, &creds).expect("connect");
    assert!(works(&c), "it reads");
    assert_eq!(errno(c.call_one(create(1, "x", p::FileType::Regular, 0o644, 0))), 30);
    // An edit that does not parse is refused: the policies before it stay in force, for
    // this host and for the server's own.
    h.dir.write("exports.json", b"{ nonsense").expect("exports");
    let again = connect(addr, &creds).expect("a host still connects");
    assert_eq!(errno(again.call_one(create(1, "y", p::FileType::Regular, 0o644, 0))), 30, "and is still read-only");
    let local = connect(addr, &Credentials::local(&h.dir).expect("read").expect("local")).expect("local");
    let got = local.call_one(Op::GetAttr { ino: 1 });
    assert!(matches!(got, Ok(Reply::Attr(_) | Reply::AttrOnly(_))), "{got:?}");
}

#[test]
fn only_the_datasets_a_policy_lists_are_mounted_and_only_admins_administer() {
    use crest_nvlist::{NvList, Value};
    let h = host();
    h.dir.write("exports.json", br#"{"clients": {"joiner": {"datasets": ["shared"]}}}"#).expect("exports");
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let local = Credentials::local(&h.dir).expect("read").expect("made by the authority");
    let admin = |creds: &Credentials, cmd: &str, name: &str| {
        let mut l = NvList::new();
        l.add("cmd", Value::Str(cmd.into())).expect("add");
        l.add("name", Value::Str(name.into())).expect("add");
        let tls = Some(crest_tls::client_config(creds).expect("config"));
        crest_net::admin(&addr.to_string(), tls, l.encode(), HANG_GUARD)
    };
    for ds in ["shared", "private"] {
        let answer = admin(&local, "dataset.create", ds).expect("the host's own certificate administers");
        assert!(NvList::decode(&answer).expect("answer").get("error").is_none());
    }
    let creds = join(addr, &h.auth.create_token(600, Some("joiner")).expect("token").encode()).expect("join");
    match admin(&creds, "dataset.create", "mine") {
        Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("admin"), "{reason}"),
        other => panic!("a joined host administered: {other:?}"),
    }
    let mount = |ds: &str| {
        let opts = ClientOptions {
            tls: Some(crest_tls::client_config(&creds).expect("config")),
            connect_timeout: Duration::from_secs(5),
            dataset: ds.into(),
            ..Default::default()
        };
        Client::connect(&addr.to_string(), opts)
    };
    let c = mount("shared").expect("a listed dataset");
    assert!(works(&c));
    for ds in ["private", "", "shared@x"] {
        match mount(ds) {
            Err(ClientError::Refused { .. }) => {}
            other => panic!("dataset {ds:?}: {:?}", other.map(|_| "mounted")),
        }
    }
}

#[test]
fn a_reload_reaches_connected_hosts_policies_and_the_per_client_limit() {
    let h = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let creds = join(addr, &h.auth.create_token(600, Some("joiner")).expect("token").encode()).expect("join");
    let c = connect(addr, &creds).expect("connect");
    // (Root squashed by the joined policy: the root directory refuses it, 13, until it is
    // read-only, 30.)
    assert_eq!(errno(c.call_one(create(1, "before", p::FileType::Regular, 0o644, 0))), 13);
    // Made read-only while connected: after the reload its session is put out, connects
    // again, and its hello takes the new policy.
    h.dir.write("exports.json", br#"{"clients": {"joiner": {"read_only": true}}}"#).expect("exports");
    serving.reload(crest_serve::Reload::default()).expect("the policies file is valid");
    let start = Instant::now();
    let mut last = 0;
    for i in 0.. {
        last = errno(c.call_one(create(1, &format!("after-{i}"), p::FileType::Regular, 0o644, 0)));
        if last == 30 || start.elapsed() > HANG_GUARD {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(last, 30, "still writable {:?} after the reload", start.elapsed());
    assert!(works(&c), "it still reads");
    // One connection per client from now on: a second one is refused.
    serving.reload(crest_serve::Reload { sessions_per_identity: Some(1) }).expect("reloaded");
    match connect(addr, &creds) {
        Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("already"), "{reason}"),
        other => panic!("a second connection: {:?}", other.map(|_| "connected")),
    }
    assert!(works(&c), "the first goes on");
}

#[test]
fn a_token_holder_asking_for_another_hosts_name_gets_neither_its_rights_nor_its_sessions() {
    use crest_nvlist::{NvList, Value};
    let h = host();
    h.dir
        .write("exports.json", br#"{"clients": {"ops": {"admin": true}, "build7": {"root_squash": false}}}"#)
        .expect("exports");
    let (_rt, serving) = serving_limited(&h, 2);
    let addr = serving.local_addr;
    // The real build7, joined with a token its administrator named.
    let build7 = join(addr, &h.auth.create_token(600, Some("build7")).expect("token").encode()).expect("join");
    for asked in ["ops", "build7"] {
        let token = h.auth.create_token(600, None).expect("token").encode();
        let creds = join_as(addr, &token, asked).expect("join");
        let mut l = NvList::new();
        l.add("cmd", Value::Str("dataset.create".into())).expect("add");
        l.add("name", Value::Str(format!("by-{asked}"))).expect("add");
        let tls = Some(crest_tls::client_config(&creds).expect("config"));
        match crest_net::admin(&addr.to_string(), tls, l.encode(), HANG_GUARD) {
            Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("admin"), "{reason}"),
            other => panic!("a token holder asking for {asked:?} administered: {other:?}"),
        }
        // Filling the sessions of the name it asked for fills only its own.
        let mine: Vec<Client> = (0..2).map(|_| connect(addr, &creds).expect("its own sessions")).collect();
        assert!(connect(addr, &creds).is_err(), "its own limit holds");
        let (c, who) = as_anyone(addr, &build7);
        *who.lock().expect("caller") = caller(0);
        let made = c.call_one(create(1, &format!("root-of-build7-{asked}"), p::FileType::Regular, 0o600, 0));
        assert_eq!(entry(made).uid, 0, "the real build7 mounts, its root unsquashed");
        drop((mine, c));
    }
}

/// Asks `addr` to renew the certificate of `creds`, with a request for a key made for it
/// that names `asked`: the new credentials, or the refusal.
fn renew(addr: SocketAddr, creds: &Credentials, asked: &str) -> Result<Credentials, ClientError> {
    let (key_pem, csr) = crest_tls::certificate_request(asked).expect("request");
    let req = p::Renew { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, csr };
    let config = crest_tls::client_config(creds).expect("config");
    let j = crest_net::renew(&addr.to_string(), config, req, HANG_GUARD)?;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::new(tmp.path().join("s"));
    Credentials::save_joined(&dir, "x", &crest_tls::cert_pem(&j.ca), &crest_tls::cert_pem(&j.cert), &key_pem)
        .expect("save");
    Ok(Credentials::joined(&dir, "x").expect("read").expect("saved"))
}

/// Makes the register say the certificate of `creds` has a third of its life left.
fn age(h: &Host, creds: &Credentials) {
    let fp = crest_tls::Fingerprint::of(&creds.chain[0]).hex();
    let mut reg = h.auth.clients().expect("register");
    let r = reg.clients.iter_mut().find(|r| r.fingerprint == fp).expect("issued");
    r.expires = crest_tls::unix_now() + 100;
    r.issued = r.expires - 300;
    reg.save(&h.dir).expect("save");
}

fn refused(r: Result<Credentials, ClientError>) -> String {
    match r {
        Err(ClientError::Refused { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_joined_host_renews_its_certificate_for_its_own_name_only_when_due() {
    let h = host();
    let (_rt, serving) = serve(&h);
    let addr = serving.local_addr;
    let token = h.auth.create_token(600, Some("build7")).expect("token").encode();
    let creds = join(addr, &token).expect("join");
    // Just issued: too early.
    assert!(refused(renew(addr, &creds, "build7")).contains("too early"));
    // Without a certificate there is nothing to renew.
    let csr = crest_tls::certificate_request("ops").expect("request").1;
    let anon = ClientMessage::Renew(p::Renew { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, csr });
    match anonymous(addr, h.auth.ca_fingerprint(), &anon) {
        Some(ServerMessage::Refused { reason, .. }) => assert!(reason.contains("no client certificate"), "{reason}"),
        other => panic!("a renewal without a certificate got {other:?}"),
    }

    // A third of its life left: renewed, under its own name whatever the request asks.
    age(&h, &creds);
    let next = renew(addr, &creds, "ops").expect("renewed");
    assert_eq!(crest_tls::cert_name(&next.chain[0]).expect("name"), "build7");
    let c = connect(addr, &next).expect("the renewed certificate gets in");
    assert!(works(&c));
    let reg = h.auth.clients().expect("register");
    let r = reg.clients.last().expect("recorded");
    let old = crest_tls::Fingerprint::of(&creds.chain[0]).hex();
    assert_eq!((r.name.as_str(), r.via.clone()), ("build7", format!("renewal of {}", &old[..16])));
    // The old one still gets in until it expires.
    assert!(works(&connect(addr, &creds).expect("the old certificate")));

    // Revoked (by name: both), neither is renewed nor gets in.
    assert_eq!(h.auth.revoke("build7").expect("revoke").len(), 2);
    age(&h, &next);
    assert!(refused(renew(addr, &next, "build7")).contains("revoked"));
}
