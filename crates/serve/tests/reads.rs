//! Reads run beside the store's thread (`Options::reads_elsewhere_from`), on a real image
//! file, with and without connection threads:
//! - while one connection rewrites a file whole, again and again (its old blocks freed
//!   and taken again: the image is small), readers on other connections each get one
//!   whole version per read, never older than the one they read before, and at the end
//!   the file's last version; the metrics page shows the reads ran elsewhere;
//! - a read that meets a bad block on another thread is read again on the store's, which
//!   answers EIO (and the server keeps serving), not the bad bytes;
//! - requests of several writes, some of whole blocks (summed where the request is
//!   decoded), read back as written: each write's sums are its own.
//!
//! Sizes, offsets and lengths are seeded (`CREST_READS_SEED`, printed).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crest_net::{Client, ClientOptions};
use crest_proto::{self as p, Op, Reply};
use crest_rng::Stream;
use crest_serve::{Options, Security, Serving};
use crest_store::{FileDisk, MkfsOptions, Store, Timespec};

fn seed() -> u64 {
    let seed = std::env::var("CREST_READS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    println!("CREST_READS_SEED={seed}");
    seed
}

/// A fresh image file of `mib` MiB, one metadata copy, served on loopback.
fn serve(dir: &tempfile::TempDir, mib: u64, io_threads: usize) -> (tokio::runtime::Runtime, Serving) {
    let path = dir.path().join("img");
    let opts = MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 1 };
    Store::mkfs(Box::new(FileDisk::create(&path, mib << 20).expect("create")), &opts).expect("mkfs");
    let store = Store::open(Box::new(FileDisk::open(&path).expect("open"))).expect("open store");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let options = Options {
        io_threads,
        metrics: Some("127.0.0.1:0".parse().expect("addr")),
        // (Lower than the default, so that the reads below of 128 KiB and up are planned.)
        reads_elsewhere_from: Some(64 * 1024),
        ..Options::default()
    };
    let serving =
        rt.block_on(crest_serve::start_with(store, "127.0.0.1:0", Security::Insecure, options)).expect("serve");
    (rt, serving)
}

fn create(client: &Client, name: &str) -> u64 {
    let op = Op::Create {
        parent: 1,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    };
    match client.call_one(op) {
        Ok(Reply::Entry(a)) => a.ino,
        r => panic!("create {name}: {r:?}"),
    }
}

/// Version `v` of the file: each byte says `v` and where it is.
fn version(v: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (v as u8) ^ ((i % 251) as u8)).collect()
}

/// The one version `d` (bytes from `offset`) is of, if it is one.
fn version_of(d: &[u8], offset: usize) -> Option<u8> {
    let v = *d.first()? ^ ((offset % 251) as u8);
    d.iter().enumerate().all(|(i, &b)| b == v ^ (((offset + i) % 251) as u8)).then_some(v)
}

/// A counter of the metrics page.
fn metric(addr: SocketAddr, line: &str) -> u64 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut page = String::new();
    let _ = s.read_to_string(&mut page);
    page.lines().find_map(|l| l.strip_prefix(line)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

fn readers_see_whole_versions_while_a_writer_rewrites(io_threads: usize) {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // 48 MiB: the writer rewrites ~300 MiB, so freed blocks are taken again and again.
    let (_rt, serving) = serve(&dir, 48, io_threads);
    let addr = serving.local_addr.to_string();
    let writer = Client::connect(&addr, ClientOptions::default()).expect("connect");
    let ino = create(&writer, "f");
    let size = (256 << 10) + rng.below(3 << 20) as usize;
    writer.call_one(Op::Write { ino, offset: 0, data: version(0, size) }).expect("write");
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (addr, done, mut rng) = (addr.clone(), done.clone(), rng.split());
            std::thread::spawn(move || {
                let client = Client::connect(&addr, ClientOptions::default()).expect("connect");
                let (mut last, mut reads) = (0u8, 0u32);
                while !done.load(Ordering::Relaxed) || reads < 20 {
                    let offset = rng.below(size as u64 - 1) as usize;
                    let len = (1 + rng.below(p::MAX_IO_BYTES as u64)).min((size - offset) as u64) as u32;
                    let d = match client.call_one(Op::Read { ino, offset: offset as u64, len }) {
                        Ok(Reply::Data(d)) => d,
                        other => panic!("seed {seed}: reader {r}: read {offset}+{len}: {other:?}"),
                    };
                    assert_eq!(d.len(), len as usize, "seed {seed}: reader {r}: read {offset}+{len} came short");
                    let v = version_of(&d, offset);
                    let Some(v) = v else { panic!("seed {seed}: reader {r}: read {offset}+{len} mixed versions") };
                    // (Versions count up from 0 and wrap at 256: the writer writes fewer.)
                    assert!(v >= last, "seed {seed}: reader {r}: version {v} after {last}");
                    (last, reads) = (v, reads + 1);
                }
                reads
            })
        })
        .collect();
    let versions = 100 + rng.below(50) as u32;
    for v in 1..=versions {
        writer.call_one(Op::Write { ino, offset: 0, data: version(v, size) }).expect("rewrite");
        // Commits free the blocks of older versions for reuse.
        if rng.below(2) == 0 {
            writer.call_one(Op::Fsync { ino }).expect("fsync");
        }
        if rng.below(4) == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
        }
    }
    done.store(true, Ordering::Relaxed);
    let reads: u32 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    let last = writer.call_one(Op::Read { ino, offset: 0, len: size as u32 });
    assert!(matches!(&last, Ok(Reply::Data(d)) if *d == version(versions, size)), "seed {seed}: the last version");
    let metrics = serving.metrics_addr.expect("metrics");
    let elsewhere = metric(metrics, "crest_planned_reads_total{on=\"elsewhere\"} ");
    println!("{reads} reads, {elsewhere} ran beside the store's thread, io threads {io_threads}");
    assert!(elsewhere > u64::from(reads) / 2, "seed {seed}: only {elsewhere} of {reads} reads ran elsewhere");
    assert_eq!(metric(metrics, "crest_planned_reads_total{on=\"again\"} "), 0, "seed {seed}: a plan failed");
}

#[test]
fn readers_see_whole_versions_while_a_writer_rewrites_one_thread() {
    readers_see_whole_versions_while_a_writer_rewrites(0);
}

#[test]
fn readers_see_whole_versions_while_a_writer_rewrites_io_threads() {
    readers_see_whole_versions_while_a_writer_rewrites(2);
}

#[test]
fn a_bad_block_met_elsewhere_is_answered_eio_by_the_store() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_rt, serving) = serve(&dir, 32, rng.below(3) as usize);
    let client = Client::connect(&serving.local_addr.to_string(), ClientOptions::default()).expect("connect");
    let ino = create(&client, "f");
    let blocks = 32 + rng.below(64) as usize;
    let data: Vec<u8> = (0..blocks)
        .flat_map(|b| {
            let mut v = vec![b as u8; 4096];
            v[..8].copy_from_slice(b"READSBAD");
            v[8..16].copy_from_slice(&(b as u64).to_le_bytes());
            v
        })
        .collect();
    client.call_one(Op::Write { ino, offset: 0, data: data.clone() }).expect("write");
    let bad = rng.below(blocks as u64);
    let path = dir.path().join("img");
    let img = std::fs::read(&path).expect("read image");
    let mut needle = b"READSBAD".to_vec();
    needle.extend(bad.to_le_bytes());
    let at = img.chunks_exact(4096).position(|b| b.starts_with(&needle)).expect("the block on disk");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).expect("open image");
        f.write_all_at(&[0xff ^ bad as u8], (at * 4096 + 100) as u64).expect("damage");
    }
    let r = client.call_one(Op::Read { ino, offset: 0, len: data.len() as u32 });
    // (A reply's data is named by its length: a failure must not print megabytes.)
    let summary = |r: &Result<Reply, p::OpError>| match r {
        Ok(Reply::Data(d)) => format!("{} bytes", d.len()),
        other => format!("{other:?}"),
    };
    assert!(matches!(&r, Err(e) if e.errno == 5), "seed {seed}: block {bad} bad: {}", summary(&r));
    // What does not touch it still reads, and the server serves on.
    let good = if bad >= 20 { 0..bad as usize * 4096 } else { (bad as usize + 1) * 4096..data.len() };
    let r = client.call_one(Op::Read { ino, offset: good.start as u64, len: good.len() as u32 });
    let ok = matches!(&r, Ok(Reply::Data(d)) if *d == data[good.clone()]);
    assert!(ok, "seed {seed}: around block {bad}: {}", summary(&r));
    let metrics = serving.metrics_addr.expect("metrics");
    assert_eq!(metric(metrics, "crest_planned_reads_total{on=\"again\"} "), 1, "seed {seed}");
}

#[test]
fn writes_summed_where_they_are_decoded_read_back_whole() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_rt, serving) = serve(&dir, 256, rng.below(3) as usize);
    let client = Client::connect(&serving.local_addr.to_string(), ClientOptions::default()).expect("connect");
    let files: Vec<u64> = (0..4).map(|i| create(&client, &format!("w{i}"))).collect();
    let mut models: Vec<Vec<u8>> = vec![Vec::new(); files.len()];
    for round in 0..80 {
        // One request of several writes: whole blocks (summed where decoded) and not, big
        // and small, so that each op's sums must be its own.
        let mut ops = Vec::new();
        for _ in 0..1 + rng.below(5) {
            let f = rng.below(files.len() as u64) as usize;
            let aligned = rng.below(3) != 0;
            let offset = if aligned { rng.below(64) * 4096 } else { rng.below(300_000) };
            // (Lengths of whole blocks repeat: sums of another op of the same length would fit.)
            let blocks = [16, 32, 1 + rng.below(100)][rng.below(3) as usize];
            let len = if aligned { blocks * 4096 } else { 1 + rng.below(200_000) } as usize;
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            let m = &mut models[f];
            if m.len() < offset as usize + len {
                m.resize(offset as usize + len, 0);
            }
            m[offset as usize..offset as usize + len].copy_from_slice(&data);
            ops.push(Op::Write { ino: files[f], offset, data });
        }
        let results = client.call(ops).expect("call");
        assert!(results.iter().all(Result::is_ok), "seed {seed}: round {round}: {results:?}");
    }
    for (f, model) in files.iter().zip(&models) {
        let mut got = Vec::new();
        while got.len() < model.len() {
            let len = (model.len() - got.len()).min(1 << 20) as u32;
            match client.call_one(Op::Read { ino: *f, offset: got.len() as u64, len }) {
                Ok(Reply::Data(d)) if !d.is_empty() => got.extend(d),
                r => panic!("seed {seed}: read of {f} at {}: {r:?}", got.len()),
            }
        }
        assert!(got == *model, "seed {seed}: file {f} reads other bytes");
    }
}
