//! End to end through a real kernel mount: an in-memory store served on loopback, mounted
//! with `spawn_mount` on a temporary directory, exercised with std::fs, then unmounted.
//! Needs root and /dev/fuse; skipped (with a note) without them.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

fn can_mount() -> bool {
    let root = fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    root && fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok()
}

fn mounted(dir: &std::path::Path) -> bool {
    let mounts = fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&*dir.to_string_lossy()) && l.contains("fuse.crest"))
}

#[test]
fn mount_by_fusermount_with_auto_unmount() {
    // As root the default; a failed test then leaves no mount behind.
    round_trip(&["auto_unmount"]);
}

#[test]
fn direct_mount() {
    round_trip(&["noauto_unmount"]);
}

fn round_trip(extra: &[&str]) {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1_700_000_000, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    let store = Store::open(Box::new(disk)).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let serving =
        rt.block_on(crest_serve::start(store, "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let client = crest_net::Client::connect(&addr, crest_net::ClientOptions::default()).expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().canonicalize().expect("canonical");
    let extra = extra.iter().map(|s| s.to_string()).collect();
    let opts = crest_fuse::MountOptions { fsname: addr.clone(), extra, ..Default::default() };
    let mut guard = crest_fuse::spawn_mount(client, &mnt, &opts).expect("mount");
    assert!(mounted(&mnt), "not in /proc/mounts as fuse.crest");

    // Files: create, write, read back, append, truncate, a write larger than one request.
    let f = mnt.join("a.txt");
    fs::write(&f, b"hello world").expect("write");
    assert_eq!(fs::read(&f).expect("read"), b"hello world");
    fs::OpenOptions::new().append(true).open(&f).and_then(|mut h| h.write_all(b"!")).expect("append");
    assert_eq!(fs::read_to_string(&f).expect("read"), "hello world!");
    fs::OpenOptions::new().write(true).open(&f).and_then(|h| h.set_len(5)).expect("truncate");
    assert_eq!(fs::read_to_string(&f).expect("read"), "hello");
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(mnt.join("big"), &big).expect("big write");
    let mut h = fs::File::open(mnt.join("big")).expect("open big");
    h.seek(SeekFrom::Start(1 << 20)).expect("seek");
    let mut part = vec![0u8; 4096];
    h.read_exact(&mut part).expect("read part");
    assert_eq!(part, big[1 << 20..(1 << 20) + 4096]);
    assert_eq!(fs::read(mnt.join("big")).expect("read big"), big);
    drop(h);

    // Attributes: chmod, times before the epoch (negative seconds, nonzero nanoseconds).
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).expect("chmod");
    let old = UNIX_EPOCH - Duration::from_millis(1300);
    fs::File::options().write(true).open(&f).and_then(|h| h.set_modified(old)).expect("utimes");
    let md = fs::metadata(&f).expect("stat");
    assert_eq!(md.mode() & 0o7777, 0o640);
    assert_eq!((md.mtime(), md.mtime_nsec()), (-2, 700_000_000));
    assert_eq!(md.modified().expect("mtime"), old);
    assert!(md.accessed().expect("atime") > SystemTime::UNIX_EPOCH);

    // Names: directories, a listing larger than one kernel buffer, renames, links.
    let d = mnt.join("d");
    fs::create_dir(&d).expect("mkdir");
    for i in 0..600 {
        fs::write(d.join(format!("entry-number-{i:04}")), b"").expect("create");
    }
    let mut names: Vec<String> = fs::read_dir(&d)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 600);
    assert_eq!(names[599], "entry-number-0599");
    fs::create_dir(d.join("sub")).expect("mkdir sub");
    fs::rename(d.join("sub"), mnt.join("moved")).expect("rename dir");
    fs::rename(&f, mnt.join("b.txt")).expect("rename file");
    assert!(!f.exists());
    fs::hard_link(mnt.join("b.txt"), mnt.join("c.txt")).expect("link");
    assert_eq!(fs::metadata(mnt.join("c.txt")).expect("stat").nlink(), 2);
    std::os::unix::fs::symlink("b.txt", mnt.join("s")).expect("symlink");
    assert_eq!(fs::read_link(mnt.join("s")).expect("readlink").to_str(), Some("b.txt"));
    assert_eq!(fs::read_to_string(mnt.join("s")).expect("follow"), "hello");

    // An unlinked file stays readable through its open descriptor.
    let mut open = fs::File::open(mnt.join("c.txt")).expect("open");
    // Busy: unmount refuses and changes nothing.
    let busy = guard.unmount().expect_err("unmount while a file is open");
    assert_eq!(busy.kind(), std::io::ErrorKind::ResourceBusy, "{busy}");
    assert!(mounted(&mnt) && !guard.is_finished());
    fs::remove_file(mnt.join("c.txt")).expect("unlink");
    fs::remove_file(mnt.join("b.txt")).expect("unlink");
    let mut s = String::new();
    open.read_to_string(&mut s).expect("read unlinked");
    assert_eq!(s, "hello");
    drop(open);

    // Errors arrive as errnos.
    assert_eq!(fs::read(mnt.join("nope")).expect_err("missing").raw_os_error(), Some(libc::ENOENT));
    assert_eq!(fs::remove_dir(&d).expect_err("not empty").raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(fs::create_dir(&d).expect_err("exists").raw_os_error(), Some(libc::EEXIST));
    fs::remove_dir_all(&d).expect("rm -r");
    assert!(fs::read_dir(&mnt).expect("readdir").all(|e| e.expect("entry").file_name() != "d"));

    // The kernel sends the last descriptor's release without waiting for it: under load
    // the mount can stay busy a moment after every file is closed.
    let mut tries = 0;
    loop {
        match guard.unmount() {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("unmount: {e}"),
        }
    }
    assert!(guard.is_finished());
    assert!(!mounted(&mnt), "still mounted");
    rt.block_on(serving.shutdown()).expect("shutdown");
}
