//! The client core answers xattr changes and reports errnos only within what the server
//! and its store accept: its copies of the store's limits, its record-size rule and its
//! errnos must be the store's. (The client links no store; this crate links both.)

use crest_client::local::{
    xattr_fits, xattr_record_bytes, XATTR_INLINE_MAX, XATTR_ITEM_BYTES, XATTR_LIST_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX,
};
use crest_proto::errno;
use crest_store::limits;

#[test]
fn xattr_limits_are_the_stores() {
    assert_eq!(XATTR_NAME_MAX, limits::XATTR_NAME_MAX);
    assert_eq!(XATTR_SIZE_MAX, limits::XATTR_SIZE_MAX);
    assert_eq!(XATTR_LIST_MAX, limits::XATTR_LIST_MAX);
    assert_eq!(XATTR_INLINE_MAX, limits::XATTR_INLINE_MAX);
    assert_eq!(XATTR_ITEM_BYTES, limits::MAX_ITEM_BYTES);
    assert_eq!(crest_client::NAME_MAX, limits::NAME_MAX);
    for name_len in [1, 10, 254, 255] {
        for value_len in [0, 1, 1000, 1529, 1530, 1773, 1774, 1775, 1783, 1784, 1785, 65_535, 65_536] {
            assert_eq!(
                xattr_record_bytes(name_len, value_len),
                crest_store::fs::xattr::record_bytes(name_len, value_len),
                "name {name_len} value {value_len}"
            );
        }
    }
}

#[test]
fn xattr_fits_agrees_with_the_store() {
    // Whatever the writeback rule accepts, the store takes: random inodes of small and big
    // xattrs (a few names in a small pool, so lists fill), each change tried on both.
    let mut rng = crest_rng::Stream::from_seed_u64(0x7a77);
    for round in 0..20 {
        let disk = crest_store::MemDisk::new(64 << 20);
        let opts =
            crest_store::MkfsOptions { now: crest_store::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 };
        crest_store::Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
        let mut st = crest_store::Store::open(Box::new(disk)).expect("open");
        let now = crest_store::Timespec::new(2, 0);
        let ino = st.create(1, b"f", crest_store::FileKind::Regular, 0o644, 0, 0, 0, now).expect("create").ino;
        let mut held = std::collections::BTreeMap::new();
        for _ in 0..300 {
            let mut name = format!("user.{}-", rng.below(400)).into_bytes();
            name.resize(name.len() + rng.below(if round % 2 == 0 { 250 } else { 8 }) as usize, b'n');
            name.truncate(XATTR_NAME_MAX);
            let len = [rng.below(40), 1700 + rng.below(200), rng.below(70_000)][rng.below(3) as usize] as usize;
            let fits = xattr_fits(&held, &name, len);
            let stored = st.setxattr(ino, &name, &vec![7; len], now);
            // Exact both ways: refused only for what the store refuses too.
            assert_eq!(fits, stored.is_ok(), "name of {} bytes, value of {len}: {stored:?}", name.len());
            if stored.is_ok() {
                held.insert(name, vec![7; len]);
            }
        }
    }
}

#[test]
fn the_wire_errnos_are_the_stores() {
    use crest_store::Error as E;
    let cases = [
        (E::NotFound(String::new()), errno::ENOENT),
        (E::Exists(String::new()), errno::EEXIST),
        (E::NotEmpty(1), errno::ENOTEMPTY),
        (E::NotDir(1), errno::ENOTDIR),
        (E::IsDir(1), errno::EISDIR),
        (E::NameTooLong { len: 300, max: 255 }, errno::ENAMETOOLONG),
        (E::Invalid(String::new()), errno::EINVAL),
        (E::NoSpace(String::new()), errno::ENOSPC),
        (E::NoXattr(1), errno::ENODATA),
        (E::TooBig(String::new()), errno::E2BIG),
        (E::Range(String::new()), errno::ERANGE),
        (E::FileTooBig(String::new()), errno::EFBIG),
        (E::TooManyLinks(1), errno::EMLINK),
        (E::NotSupported(String::new()), errno::EOPNOTSUPP),
        (E::NotPermitted(String::new()), errno::EPERM),
    ];
    for (e, want) in cases {
        assert_eq!(e.errno(), want, "{e}");
    }
}
