//! File data in a data store's objects (`fs/objects.rs`), against a model: object writes
//! beside image writes, truncates, punches, snapshots and unlinks, the objects in a map
//! standing in for the bucket. After every round: fsck clean, every file and snapshot
//! reads as the model says (so no referenced object was deleted), and at the end, with
//! everything removed and the gone list emptied, the bucket is empty (nothing leaked).
//! Seeded: `CREST_OBJECTS_SEED` (printed).

mod common;
use common::*;
use crest_store::checksum::crc32c;
use crest_store::fs::objects::ObjectSource;
use crest_store::{Error, FallocateMode, FileKind, MemDisk, Part, Planned, SetAttr, Store, ROOT_INO};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

const BLOCK: usize = 4096;

/// The bucket: object id → bytes.
#[derive(Clone, Default)]
struct Bucket(Arc<Mutex<HashMap<u64, Vec<u8>>>>);

impl Bucket {
    fn get(&self, id: u64) -> Option<Vec<u8>> {
        self.0.lock().expect("bucket").get(&id).cloned()
    }
    fn put(&self, id: u64, data: Vec<u8>) {
        assert!(self.0.lock().expect("bucket").insert(id, data).is_none(), "object {id} written twice");
    }
    fn len(&self) -> usize {
        self.0.lock().expect("bucket").len()
    }
}

impl ObjectSource for Bucket {
    fn read(&mut self, id: u64, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let o = self.get(id).ok_or_else(|| std::io::Error::other(format!("no object {id}")))?;
        let at = offset as usize;
        Ok(o.get(at..at + len).ok_or_else(|| std::io::Error::other("short object"))?.to_vec())
    }
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn seed() -> u64 {
    let s = std::env::var("CREST_OBJECTS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("CREST_OBJECTS_SEED={s}");
    s
}

/// Uploads `data` as a fresh object and maps it at `offset` of `ino`.
fn put_object(s: &mut Store, bucket: &Bucket, session: u64, ino: u64, offset: u64, data: &[u8]) {
    let id = s.grant_objects(session, 1).expect("grant")[0];
    let mut padded = data.to_vec();
    padded.resize(data.len().div_ceil(BLOCK) * BLOCK, 0);
    let csums: Vec<u32> = padded.chunks(BLOCK).map(crc32c).collect();
    bucket.put(id, padded);
    s.map_object(session, ino, offset, data.len() as u64, id, &csums, t(5)).expect("map object");
}

/// Reads a whole file as a client would: located parts fetched from the bucket and
/// checked against their checksums.
fn read_all(s: &mut Store, bucket: &Bucket, ino: u64) -> Result<Vec<u8>, String> {
    let size = s.getattr(ino).map_err(|e| e.to_string())?.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let at = out.len() as u64;
        match s.plan_read(ino, at, 1 << 20, u64::MAX).map_err(|e| e.to_string())? {
            Planned::Read(b) => out.extend(b),
            Planned::Located(l) => {
                assert_eq!(l.offset, at);
                let mut buf = vec![0u8; l.len as usize];
                for p in l.parts {
                    match p {
                        Part::Bytes { at, data } => buf[at as usize..at as usize + data.len()].copy_from_slice(&data),
                        Part::Object { file_at, id, block, csums } => {
                            let o = bucket.get(id).ok_or(format!("object {id} is gone but still mapped"))?;
                            let bytes = &o[block as usize * BLOCK..(block as usize + csums.len()) * BLOCK];
                            for (i, c) in csums.iter().enumerate() {
                                if crc32c(&bytes[i * BLOCK..(i + 1) * BLOCK]) != *c {
                                    return Err(format!("object {id} block {}: checksum", block as usize + i));
                                }
                            }
                            let from = at.max(file_at);
                            let to = (at + l.len).min(file_at + bytes.len() as u64);
                            buf[(from - at) as usize..(to - at) as usize]
                                .copy_from_slice(&bytes[(from - file_at) as usize..(to - file_at) as usize]);
                        }
                    }
                }
                out.extend(buf);
            }
            Planned::Elsewhere(p) => out.extend(p.run().ok_or("plan failed")?),
        }
    }
    Ok(out)
}

/// Deletes what the gone list names from the bucket (what the server's collector does).
fn collect(s: &mut Store, bucket: &Bucket) -> usize {
    let ids = s.gone_objects(1000).expect("gone");
    for id in &ids {
        bucket.0.lock().expect("bucket").remove(id);
    }
    s.objects_deleted(&ids).expect("deleted");
    ids.len()
}

fn new_store(disk: &MemDisk, bucket: &Bucket) -> Store {
    let mut s = open(disk);
    s.set_object_source(Box::new(bucket.clone()));
    s
}

fn check_all(
    s: &mut Store,
    bucket: &Bucket,
    files: &BTreeMap<u64, Vec<u8>>,
    snaps: &[(u64, BTreeMap<u64, Vec<u8>>)],
    ctx: &str,
) {
    for (ino, want) in files {
        let got = read_all(s, bucket, *ino).unwrap_or_else(|e| panic!("{ctx}: inode {ino}: {e}"));
        assert!(
            got == *want,
            "{ctx}: inode {ino}: {} bytes read, {} expected, first difference at {:?}",
            got.len(),
            want.len(),
            got.iter().zip(want).position(|(a, b)| a != b)
        );
    }
    for (id, view) in snaps {
        s.set_view(Some(*id));
        for (ino, want) in view {
            let got = read_all(s, bucket, *ino).unwrap_or_else(|e| panic!("{ctx}: snapshot {id} inode {ino}: {e}"));
            assert!(got == *want, "{ctx}: snapshot {id} inode {ino} differs");
        }
        s.set_view(None);
    }
}

#[test]
fn object_extents_follow_the_model_and_nothing_referenced_is_deleted_or_leaked() {
    let seed = seed();
    for round in 0..3u64 {
        let mut r = Rng(seed.wrapping_add(round).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let disk = fresh(48);
        let bucket = Bucket::default();
        let mut s = new_store(&disk, &bucket);
        let url = s.set_data_store("s3://crest-test/some/prefix").expect("data store");
        assert!(s.set_data_store("s3://other").is_err(), "a second data URL");
        assert_eq!(url.object_key(3), format!("some/prefix/crest/{:016x}/0000000000000003", url.store_id));
        s.commit().expect("commit");
        let session = 77;
        let mut files: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut names: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut snaps: Vec<(u64, BTreeMap<u64, Vec<u8>>)> = Vec::new();
        let mut snap_names: Vec<String> = Vec::new();
        for step in 0..160 {
            let ctx = format!("seed {seed} round {round} step {step}");
            if files.len() < 3 || r.below(12) == 0 {
                let name = format!("f{step}").into_bytes();
                let ino = s.create(ROOT_INO, &name, FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
                files.insert(ino, Vec::new());
                names.insert(ino, name);
            }
            let inos: Vec<u64> = files.keys().copied().collect();
            let ino = inos[r.below(inos.len() as u64) as usize];
            let size = files[&ino].len() as u64;
            let fill = (step % 250 + 1) as u8;
            match r.below(9) {
                0..=2 => {
                    // An object over whole blocks, or running to (past) the end.
                    let offset = r.below(size / BLOCK as u64 + 8) * BLOCK as u64;
                    let blocks = 1 + r.below(80);
                    let mut len = blocks * BLOCK as u64;
                    let cut = r.below(BLOCK as u64 - 1);
                    if offset + len - cut >= size && r.below(2) == 0 {
                        len -= cut;
                    }
                    let data: Vec<u8> = (0..len).map(|i| fill ^ (i % 251) as u8).collect();
                    put_object(&mut s, &bucket, session, ino, offset, &data);
                    let f = files.get_mut(&ino).expect("file");
                    if f.len() < (offset + len) as usize {
                        f.resize((offset + len) as usize, 0);
                    }
                    f[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                }
                3 | 4 => {
                    // A small write anywhere: edges inside objects are merged by the store.
                    let offset = r.below(size + 9000);
                    let data = vec![fill; 1 + r.below(9000) as usize];
                    s.write(ino, offset, &data, t(6)).unwrap_or_else(|e| panic!("{ctx}: write: {e}"));
                    let f = files.get_mut(&ino).expect("file");
                    let end = offset as usize + data.len();
                    if f.len() < end {
                        f.resize(end, 0);
                    }
                    f[offset as usize..end].copy_from_slice(&data);
                }
                5 => {
                    let new = r.below(size + 20_000);
                    s.setattr(ino, &SetAttr { size: Some(new), ..Default::default() }, t(7))
                        .unwrap_or_else(|e| panic!("{ctx}: truncate: {e}"));
                    files.get_mut(&ino).expect("file").resize(new as usize, 0);
                }
                6 => {
                    let offset = r.below(size + 1);
                    let len = r.below(300_000);
                    let punch = FallocateMode { keep_size: true, punch_hole: true, ..FallocateMode::default() };
                    s.fallocate(ino, offset, len, punch, t(8)).unwrap_or_else(|e| panic!("{ctx}: punch: {e}"));
                    let f = files.get_mut(&ino).expect("file");
                    let end = (offset + len).min(f.len() as u64) as usize;
                    if (offset as usize) < end {
                        f[offset as usize..end].fill(0);
                    }
                }
                7 => {
                    if snaps.len() < 3 && r.below(2) == 0 {
                        let name = format!("{}@s{step}", crest_store::datasets::DEFAULT_NAME);
                        let id = s.create_snapshots(std::slice::from_ref(&name)).expect("snapshot")[0];
                        snaps.push((id, files.clone()));
                        snap_names.push(name);
                    } else if !snaps.is_empty() {
                        let i = r.below(snaps.len() as u64) as usize;
                        s.destroy_snapshot(&snap_names.remove(i)).expect("destroy");
                        snaps.remove(i);
                    }
                }
                _ => {
                    if files.len() > 1 {
                        s.unlink(ROOT_INO, &names[&ino], t(9)).expect("unlink");
                        files.remove(&ino);
                        names.remove(&ino);
                    }
                }
            }
            if step % 10 == 9 {
                s.commit().expect("commit");
                collect(&mut s, &bucket);
                check_all(&mut s, &bucket, &files, &snaps, &ctx);
                assert_clean(&disk);
            }
            if step % 40 == 39 {
                s.commit().expect("commit");
                drop(s);
                s = new_store(&disk, &bucket);
                check_all(&mut s, &bucket, &files, &snaps, &format!("{ctx} after reopen"));
            }
        }
        // Grants never mapped (a client killed mid-upload) go when their session ends.
        let ids = s.grant_objects(session, 5).expect("grant");
        for id in &ids {
            bucket.put(*id, vec![1; BLOCK]);
        }
        assert!(
            matches!(
                s.map_object(session + 1, *files.keys().next().expect("a file"), 0, 1, ids[0], &[0], t(9)),
                Err(Error::NotPermitted(_))
            ),
            "an id granted to another session mapped"
        );
        assert_eq!(s.release_grants(session).expect("release"), 5);
        // Everything removed: the bucket ends empty.
        for name in std::mem::take(&mut snap_names) {
            s.destroy_snapshot(&name).expect("destroy");
        }
        for name in names.values() {
            s.unlink(ROOT_INO, name, t(10)).expect("unlink");
        }
        // (Big files are freed a step each tick after their unlink.)
        for k in 0..200 {
            s.tick(k).expect("tick");
        }
        s.commit().expect("commit");
        while collect(&mut s, &bucket) > 0 {
            s.commit().expect("commit");
        }
        let report = assert_clean(&disk);
        assert_eq!((report.objects, report.objects_gone), (0, 0), "seed {seed} round {round}");
        assert_eq!(bucket.len(), 0, "seed {seed} round {round}: objects leaked");
    }
}

#[test]
fn a_gone_object_waits_for_the_commit_that_made_it_gone() {
    let disk = fresh(16);
    let bucket = Bucket::default();
    let mut s = new_store(&disk, &bucket);
    s.set_data_store("s3://crest-test").expect("data store");
    let ino = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    put_object(&mut s, &bucket, 1, ino, 0, &vec![3; 3 * BLOCK]);
    s.commit().expect("commit");
    put_object(&mut s, &bucket, 1, ino, 0, &vec![4; 3 * BLOCK]);
    assert_eq!(s.gone_objects(10).expect("gone"), Vec::<u64>::new(), "deletable before its commit");
    s.commit().expect("commit");
    assert_eq!(s.gone_objects(10).expect("gone"), vec![1]);
    // Not yet deleted when the server stops: the list survives and is served again.
    drop(s);
    let mut s = new_store(&disk, &bucket);
    assert_eq!(s.gone_objects(10).expect("gone"), vec![1]);
    assert_eq!(collect(&mut s, &bucket), 1);
    assert_eq!(read_all(&mut s, &bucket, ino).expect("read"), vec![4; 3 * BLOCK]);
}

#[test]
fn objects_are_refused_without_a_data_url_and_with_bad_ones() {
    let disk = fresh(16);
    let mut s = open(&disk);
    assert!(s.grant_objects(1, 1).is_err());
    for bad in ["http://x/y", "s3://", "s3://A", "s3://ok-bucket/../x", "s3://b b"] {
        assert!(s.set_data_store(bad).is_err(), "{bad} accepted");
    }
    s.set_data_store("s3://ok-bucket").expect("good URL");
    assert!(s.grant_objects(1, 0).is_err() && s.grant_objects(1, 65).is_err());
    for _ in 0..4 {
        s.grant_objects(1, 64).expect("grant");
    }
    assert!(matches!(s.grant_objects(1, 1), Err(Error::Busy(_))), "more than 256 unmapped");
    assert!(s.grant_objects(2, 1).is_ok(), "another session is not limited by the first");
}
