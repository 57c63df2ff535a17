//! The server with connection threads of its own (`Options::io_threads`): TLS, framing
//! and encoding on a pool of threads, the store on its own one. What must hold as with
//! one thread: each connection's answers are its own and come in its order, a change still
//! waits for another connection's recall answer (which arrives on another thread), a
//! killed server loses nothing it acknowledged, and a shutdown commits.
//!
//! Sizes and offsets are random (seeded and printed: `CREST_THREADS_SEED=N` replays a run).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crest_net::{Client, ClientOptions};
use crest_proto::{self as p, Op, Reply};
use crest_rng::Stream;
use crest_serve::{Options, Security, Serving};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

const IO_THREADS: usize = 3;

fn fresh_disk() -> MemDisk {
    let disk = MemDisk::new(256 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    disk
}

/// The store on `disk`, committing only when asked, so a kill loses everything since.
fn open(disk: &MemDisk) -> Store {
    let mut s = Store::open(Box::new(disk.clone())).expect("open");
    s.set_policy(crest_store::CommitPolicy { max_dirty_nodes: 1 << 20, interval_ms: u64::MAX });
    s
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn serve(rt: &tokio::runtime::Runtime, store: Store, addr: &str) -> Serving {
    let options = Options { io_threads: IO_THREADS, ..Options::default() };
    rt.block_on(crest_serve::start_with(store, addr, Security::Insecure, options)).expect("serve")
}

fn seed() -> u64 {
    let seed = std::env::var("CREST_THREADS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("CREST_THREADS_SEED={seed}");
    seed
}

fn create(parent: u64, name: &str) -> Op {
    Op::Create {
        parent,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    }
}

fn read_all(client: &Client, ino: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let want = (len - out.len()).min(1 << 20) as u32;
        let r = client.call_one(Op::Read { ino, offset: out.len() as u64, len: want });
        let Ok(Reply::Data(d)) = r else { panic!("read of {ino} at {}: {r:?}", out.len()) };
        assert!(!d.is_empty(), "short read of {ino} at {} of {len}", out.len());
        out.extend_from_slice(&d);
    }
    out
}

#[test]
fn connections_on_io_threads_each_get_their_own_answers_in_order() {
    let seed = seed();
    let rt = rt();
    let serving = serve(&rt, open(&fresh_disk()), "127.0.0.1:0");
    let addr = serving.local_addr.to_string();
    // Each connection writes its own file in random pieces (some larger than a TLS record
    // or a read buffer, some a few bytes, at offsets that straddle both), reads pieces
    // back between writes, and keeps what the file must hold.
    let mut streams = Stream::from_seed_u64(seed);
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let addr = addr.clone();
            let mut rng = streams.split();
            std::thread::spawn(move || {
                let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
                let Ok(Reply::Entry(a)) = client.call_one(create(1, &format!("c{t}"))) else { panic!("create") };
                let mut model: Vec<u8> = Vec::new();
                for step in 0..40 {
                    if rng.below(3) == 0 && !model.is_empty() {
                        let off = rng.below(model.len() as u64) as usize;
                        let len = 1 + rng.below((model.len() - off) as u64) as usize;
                        let r = client.call_one(Op::Read { ino: a.ino, offset: off as u64, len: len as u32 });
                        let want = &model[off..off + len];
                        assert!(
                            matches!(&r, Ok(Reply::Data(d)) if d == want),
                            "seed {seed}: connection {t} step {step}: read {off}+{len}"
                        );
                        continue;
                    }
                    let off = rng.below(model.len() as u64 + 70_000) as usize;
                    let len = match rng.below(3) {
                        0 => 1 + rng.below(64),
                        1 => 1 + rng.below(20_000),
                        _ => 1 + rng.below(400_000),
                    } as usize;
                    let mut data = vec![0u8; len];
                    rng.fill_bytes(&mut data);
                    client.call_one(Op::Write { ino: a.ino, offset: off as u64, data: data.clone() }).expect("write");
                    if model.len() < off + len {
                        model.resize(off + len, 0);
                    }
                    model[off..off + len].copy_from_slice(&data);
                }
                (a.ino, model)
            })
        })
        .collect();
    let files: Vec<(u64, Vec<u8>)> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
    // Many threads on one connection: their calls interleave on the wire and each gets
    // its own answer.
    let shared = Arc::new(Client::connect(&addr, ClientOptions::default()).expect("connect"));
    let readers: Vec<_> = files
        .iter()
        .cloned()
        .map(|(ino, model)| {
            let c = shared.clone();
            std::thread::spawn(move || assert!(read_all(&c, ino, model.len()) == model, "seed {seed}: file {ino}"))
        })
        .collect();
    for r in readers {
        r.join().expect("reader");
    }
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    assert!(store.generation() > 1, "shutdown committed");
    let report = crest_store::check::fsck(store.close().expect("close")).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A recall goes out on the holder's connection and its answer comes back on it, each on
/// whichever connection thread runs that connection; the change waits for both. (A file:
/// a directory another session is changing is lent to no reader at all.)
#[test]
fn a_change_on_one_io_thread_waits_for_a_recall_answered_on_another() {
    let rt = rt();
    let serving = serve(&rt, open(&fresh_disk()), "127.0.0.1:0");
    let addr = serving.local_addr.to_string();
    let a = Client::connect(&addr, ClientOptions::default()).expect("connect a");
    let b = Arc::new(Client::connect(&addr, ClientOptions::default()).expect("connect b"));
    let mut recalls = b.take_recalls().expect("recalls");
    let Ok(Reply::Entry(f)) = a.call_one(create(1, "f")) else { panic!("create f") };
    for round in 0..5u64 {
        // b reads f's attributes: it holds them; a's write to f must wait for b to let go.
        b.call_one(Op::GetAttr { ino: f.ino }).expect("getattr");
        let dropped = Arc::new(AtomicBool::new(false));
        let holder = {
            let (b, dropped) = (b.clone(), dropped.clone());
            std::thread::spawn(move || {
                let r = recalls.recv_timeout(Duration::from_secs(10)).expect("a recall");
                assert!(r.inodes.contains(&f.ino), "{r:?}");
                std::thread::sleep(Duration::from_millis(30 * round + 5));
                dropped.store(true, Ordering::SeqCst);
                b.recall_done(r.recall_id);
                recalls
            })
        };
        let r = a.call_one(Op::Write { ino: f.ino, offset: round * 10, data: vec![round as u8; 10] });
        assert!(r.is_ok(), "{r:?}");
        assert!(dropped.load(Ordering::SeqCst), "round {round}: the write returned before the holder let go");
        recalls = holder.join().expect("holder");
    }
    rt.block_on(serving.shutdown()).expect("shutdown");
}

#[test]
fn a_killed_server_with_io_threads_loses_nothing_it_acknowledged() {
    let rt = rt();
    let disk = fresh_disk();
    let serving = serve(&rt, open(&disk), "127.0.0.1:0");
    let addr = serving.local_addr.to_string();
    let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let mut made = Vec::new();
    for i in 0..50 {
        let Ok(Reply::Entry(a)) = client.call_one(create(1, &format!("f{i}"))) else { panic!("create") };
        made.push(a.ino);
    }
    let store = rt.block_on(serving.kill()).expect("kill");
    drop(store.abandon());
    let serving = serve(&rt, open(&disk), &addr);
    for (i, ino) in made.iter().enumerate() {
        let r = client.call_one(Op::Lookup { parent: 1, name: format!("f{i}").into_bytes() });
        assert!(matches!(&r, Ok(Reply::Lookup { attr: Some(a), .. }) if a.ino == *ino), "f{i}: {r:?}");
    }
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    let report = crest_store::check::fsck(store.close().expect("close")).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}
