//! Dependencies point one way: the client side links no part of the server. Read from
//! `cargo metadata` (the resolved graph, normal dependencies only: a test may start a
//! server), so a new `use` of the server from the client fails here, not in review.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// What each client-side crate must not reach, directly or through another crate.
const RULES: &[(&str, &[&str])] = &[
    ("crest-fuse", &["crest-server", "crest-serve", "crest-store", "io-uring"]),
    ("crest-net", &["crest-server", "crest-serve", "crest-store", "io-uring", "fuser"]),
    ("crest-client", &["crest-server", "crest-serve", "crest-store", "io-uring", "fuser", "tokio"]),
    ("crest-proto", &["crest-server", "crest-serve", "crest-store", "io-uring", "fuser", "tokio"]),
    // Credentials serve both sides, so they hold no part of either.
    ("crest-tls", &["crest-server", "crest-serve", "crest-store", "crest-net", "crest-fuse", "tokio", "fuser"]),
    // The byte stream both shells share holds no part of either, nor any credentials.
    (
        "crest-stream",
        &[
            "crest-server",
            "crest-serve",
            "crest-store",
            "crest-net",
            "crest-fuse",
            "crest-client",
            "crest-tls",
            "fuser",
        ],
    ),
    ("crest-server", &["tokio", "fuser", "crest-net", "crest-fuse"]),
    ("crest-store", &["tokio", "fuser", "crest-proto", "crest-net", "crest-fuse", "crest-server"]),
    // The simulators run the cores, never the shells around them.
    ("crest-sim", &["tokio", "fuser", "crest-net", "crest-fuse", "crest-serve"]),
];

/// The resolved graph: package id → (name, ids of its normal dependencies).
fn graph() -> HashMap<String, (String, Vec<String>)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    // (Only this platform's graph: the others' crates, such as windows-sys, need not be
    // downloaded to read it offline.)
    let rustc = Command::new("rustc").arg("-vV").output().expect("rustc -vV runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc names its host");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline", "--filter-platform", &host])
        .args(["--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id"), p["name"].as_str().expect("name")))
        .collect();
    let mut g = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let id = node["id"].as_str().expect("node id");
        let deps = node["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .filter(|d| d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null())))
            .map(|d| d["pkg"].as_str().expect("pkg").to_string())
            .collect();
        g.insert(id.to_string(), (names.get(id).copied().unwrap_or("?").to_string(), deps));
    }
    g
}

/// Names of every package `root` reaches through normal dependencies.
fn reaches(g: &HashMap<String, (String, Vec<String>)>, root: &str) -> BTreeSet<String> {
    let start: Vec<String> = g.iter().filter(|(_, (n, _))| n == root).map(|(id, _)| id.clone()).collect();
    assert!(!start.is_empty(), "no package {root} in the workspace");
    let mut seen = BTreeSet::new();
    let mut stack = start;
    let mut names = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        if let Some((name, deps)) = g.get(&id) {
            names.insert(name.clone());
            stack.extend(deps.iter().cloned());
        }
    }
    names.remove(root);
    names
}

#[test]
fn the_client_side_links_no_part_of_the_server() {
    let g = graph();
    let mut broken = Vec::new();
    for (krate, forbidden) in RULES {
        let reached = reaches(&g, krate);
        for f in *forbidden {
            if reached.contains(*f) {
                broken.push(format!("{krate} depends on {f}"));
            }
        }
    }
    assert!(broken.is_empty(), "dependency rules broken: {broken:?}");
}

#[test]
fn the_graph_reader_sees_what_is_there() {
    // A reader that found nothing would pass every rule: the CLI reaches both sides.
    let reached = reaches(&graph(), "crest");
    for name in ["crest-fuse", "crest-net", "crest-serve", "crest-server", "crest-store", "crest-proto", "tokio"] {
        assert!(reached.contains(name), "crest reaches {name}: {reached:?}");
    }
}
