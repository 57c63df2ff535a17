//! Datasets over a real socket: created, listed, changed and destroyed by administrative
//! calls while sessions work in them; a session confined to its dataset whatever inode
//! numbers it sends (random ones, seeded and printed: `CREST_DATASET_SEED`).

use std::time::Duration;

use crest_net::{Client, ClientOptions};
use crest_nvlist::{NvList, Value};
use crest_proto::{self as p, Op, Reply};
use crest_store::{MemDisk, MkfsOptions, Store, Timespec};

fn store() -> Store {
    let disk = MemDisk::new(64 << 20);
    Store::mkfs(
        Box::new(disk.clone()),
        &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 },
    )
    .expect("mkfs");
    Store::open(Box::new(disk)).expect("open")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn admin(addr: &str, cmd: &str, args: &[(&str, Value)]) -> NvList {
    let mut l = NvList::new();
    l.add("cmd", Value::Str(cmd.into())).expect("add");
    for (k, v) in args {
        l.add(*k, v.clone()).expect("add");
    }
    let answer = crest_net::admin(addr, None, l.encode(), Duration::from_secs(30)).expect("admin call");
    NvList::decode(&answer).expect("an answer is a name-value list")
}

fn text_props(kv: &[(&str, &str)]) -> Value {
    let mut l = NvList::new();
    for (k, v) in kv {
        l.add(*k, Value::Str((*v).into())).expect("add");
    }
    Value::List(l)
}

fn mount(addr: &str, dataset: &str) -> Result<Client, crest_net::ClientError> {
    let opts = ClientOptions { dataset: dataset.into(), connect_timeout: Duration::from_secs(5), ..Default::default() };
    Client::connect(addr, opts)
}

fn create(c: &Client, parent: u64, name: &str) -> p::Attr {
    let op = Op::Create {
        parent,
        name: name.as_bytes().to_vec(),
        kind: p::FileType::Regular,
        mode: 0o644,
        rdev: 0,
        cred: p::Cred::default(),
    };
    match c.call_one(op) {
        Ok(Reply::Entry(a)) => a,
        other => panic!("create {name}: {other:?}"),
    }
}

fn listing(c: &Client) -> Vec<(Vec<u8>, u64)> {
    match c.call_one(Op::ReadDir { ino: 1, from_index: 0, limit: 1000 }) {
        Ok(Reply::Dir { items, .. }) => items.into_iter().map(|i| (i.name, i.attr.ino)).collect(),
        other => panic!("readdir: {other:?}"),
    }
}

fn errno(r: Result<Reply, p::OpError>) -> i32 {
    r.err().map_or(0, |e| e.errno)
}

#[test]
fn a_session_is_confined_to_its_dataset_and_datasets_are_managed_while_in_use() {
    let rt = rt();
    let serving =
        rt.block_on(crest_serve::start(store(), "127.0.0.1:0", crest_serve::Security::Insecure)).expect("serve");
    let addr = serving.local_addr.to_string();
    let made =
        admin(&addr, "dataset.create", &[("name", Value::Str("a".into())), ("props", text_props(&[("quota", "64K")]))]);
    assert!(made.get_u64("id").is_some(), "{made:?}");
    let bad = admin(&addr, "dataset.create", &[("name", Value::Str("a/b".into()))]);
    assert_eq!(bad.get_u64("errno"), Some(22), "a bad name is refused: {bad:?}");
    assert!(admin(&addr, "no.such", &[]).get_str("error").is_some());
    let garbage = crest_net::admin(&addr, None, vec![0xff; 40], Duration::from_secs(5)).expect("answered");
    assert!(NvList::decode(&garbage).expect("list").get_str("error").is_some(), "garbage is answered, not fatal");

    let main = mount(&addr, "").expect("mount the default dataset");
    let a = mount(&addr, "a").expect("mount dataset a");
    assert!(mount(&addr, "nope").is_err(), "a dataset that does not exist is refused");
    let fm = create(&main, 1, "in-main");
    let fa = create(&a, 1, "in-a");
    assert_ne!(fm.ino >> 40, fa.ino >> 40, "different inode ranges");
    let Ok(Reply::Attr(root_a)) = a.call_one(Op::GetAttr { ino: 1 }) else { panic!("a's root") };
    let Ok(Reply::Attr(root_m)) = main.call_one(Op::GetAttr { ino: 1 }) else { panic!("main's root") };
    assert_eq!(root_a.ino, 1, "a session sees its dataset's root as inode 1");
    assert_ne!(root_a.generation, root_m.generation, "and it is another directory");
    assert_eq!(listing(&a), vec![(b"in-a".to_vec(), fa.ino)]);
    assert_eq!(listing(&main), vec![(b"in-main".to_vec(), fm.ino)]);

    // Whatever numbers a session sends, it reaches nothing outside its dataset.
    let seed: u64 = std::env::var("CREST_DATASET_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("CREST_DATASET_SEED={seed}");
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let before = listing(&main);
    let Ok(Reply::Attr(fm_before)) = main.call_one(Op::GetAttr { ino: fm.ino }) else { panic!("getattr") };
    for i in 0..400 {
        let victim = match next() % 4 {
            0 => fm.ino,
            1 => next() % 16,
            2 => (next() % 4) << 40 | (next() % 8),
            _ => next(),
        };
        let ops = [
            Op::GetAttr { ino: victim },
            Op::Write { ino: victim, offset: 0, data: b"x".to_vec() },
            Op::SetAttr { ino: victim, set: p::SetAttr { mode: Some(0o777), ..Default::default() } },
            Op::Unlink { parent: victim, name: b"in-main".to_vec() },
            Op::Link { ino: victim, parent: 1, name: format!("l{i}").into_bytes() },
            Op::Rename {
                parent: victim,
                name: b"in-main".to_vec(),
                new_parent: 1,
                new_name: b"got".to_vec(),
                flags: 0,
            },
        ];
        for op in ops {
            let r = a.call_one(op.clone());
            if let Ok(Reply::Attr(at) | Reply::Entry(at)) = &r {
                assert!(at.ino == 1 || at.ino >> 40 == fa.ino >> 40, "seed {seed}: {op:?} reached {at:?}");
            }
        }
    }
    assert_eq!(listing(&main), before, "seed {seed}: the default dataset is untouched");
    let Ok(Reply::Attr(fm_after)) = main.call_one(Op::GetAttr { ino: fm.ino }) else { panic!("getattr") };
    assert_eq!(fm_after, fm_before, "seed {seed}: its file too");

    // Quota and readonly, over the wire.
    let big = a.call_one(Op::Write { ino: fa.ino, offset: 0, data: vec![7; 100 * 1024] });
    assert_eq!(errno(big), 122, "EDQUOT beyond the quota");
    a.call_one(Op::Write { ino: fa.ino, offset: 0, data: vec![7; 32 * 1024] }).expect("within the quota");
    let Ok(Reply::StatFs(st)) = a.call_one(Op::StatFs) else { panic!("statfs") };
    assert_eq!(st.total_blocks, 16, "statfs shows the quota");
    let set =
        admin(&addr, "dataset.set", &[("name", Value::Str("a".into())), ("props", text_props(&[("readonly", "on")]))]);
    assert!(set.get("error").is_none(), "{set:?}");
    assert_eq!(errno(a.call_one(Op::Write { ino: fa.ino, offset: 0, data: b"y".to_vec() })), 30, "EROFS once readonly");
    main.call_one(Op::Write { ino: fm.ino, offset: 0, data: b"y".to_vec() }).expect("the default dataset is not");

    // Destroy: refused while mounted, per name; done once the session ended.
    let names = Value::Strs(vec!["a".into(), "nope".into(), "default".into()]);
    let r = admin(&addr, "dataset.destroy", &[("names", names.clone())]);
    let results = r.get_list("results").expect("results").clone();
    assert!(results.get_str("a").is_some_and(|e| e.contains("mounted")), "{results:?}");
    assert!(
        results.get_str("nope").is_some_and(|e| e != "ok") && results.get_str("default").is_some_and(|e| e != "ok")
    );
    drop(a);
    let r = admin(&addr, "dataset.destroy", &[("names", Value::Strs(vec!["a".into()]))]);
    assert_eq!(r.get_list("results").and_then(|l| l.get_str("a")), Some("ok"), "{r:?}");
    let list = admin(&addr, "dataset.list", &[]);
    let Some(Value::Lists(all)) = list.get("datasets") else { panic!("{list:?}") };
    assert_eq!(all.iter().filter_map(|d| d.get_str("name")).collect::<Vec<_>>(), ["default"]);
    assert!(mount(&addr, "a").is_err(), "a destroyed dataset cannot be mounted");
    assert_eq!(listing(&main), before, "the default dataset is intact");
    drop(main);
    let store = rt.block_on(serving.shutdown()).expect("shutdown");
    let report = crest_store::check::fsck(store.close().expect("close")).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}
