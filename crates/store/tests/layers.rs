//! The store's layers stay apart (the rule is written in `src/engine/mod.rs` and
//! `src/fs/mod.rs`):
//! - a module of the engine (`src/engine/`) names nothing of the crate outside the engine
//!   but `crate::error`, `crate::limits` and the `Disk` trait: not the schema
//!   (`crate::fs`, `crate::sessions`, the `crate::key` facade that carries the schema's
//!   kinds), not `crate::store` or `crate::check`, not a disk back-end;
//! - no module of the engine or of the schema (`src/fs/`, `src/sessions.rs`) names a
//!   concrete disk back-end (`MemDisk`, `FileDisk`, `PoolDisk`, `UringDisk`, `DiskIo`, the
//!   crash-test disks), only the `Disk` trait.
//!
//! The test reads the sources. Comments and literals are blanked out, then every path that
//! starts at `crate::`, `super::` or `self::` (use trees with `{…}` groups expanded) is
//! resolved to a path from the crate root, taking the file's module and any inline `mod`
//! blocks into account, and checked; identifiers naming a back-end type are refused
//! wherever they appear.

use std::fs;
use std::path::{Path, PathBuf};

/// Crate-root modules (and root re-exports) the engine may name.
const ENGINE_MAY_NAME: &[&str] = &["engine", "error", "limits", "Error", "Result"];
/// The items of `crate::disk` the engine and the schema may name: the trait and the
/// reader its `reader` returns.
const DISK_TRAIT: &[&[&str]] = &[&["disk", "Disk"], &["disk", "SharedReader"]];
/// Concrete back-ends by their names at the crate root (re-exports).
const BACKENDS: &[&str] = &["MemDisk", "FileDisk", "PoolDisk", "UringDisk", "DiskIo", "crash"];
/// Back-end type names refused as identifiers in any position (glob imports included).
const BACKEND_TYPES: &[&str] =
    &["MemDisk", "FileDisk", "PoolDisk", "UringDisk", "DiskIo", "RecordingDisk", "FailingDisk"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layer {
    Engine,
    Schema,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file, from the crate root (`src/engine/key.rs` →
/// `["engine", "key"]`, `src/engine/mod.rs` → `["engine"]`, `src/lib.rs` → `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let last = segs.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        segs.push(stem.to_string());
    }
    segs
}

/// `src` with comments, string and character literals replaced by spaces (newlines kept,
/// so line numbers still match).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        if at(0) == '/' && at(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
                out.push(' ');
            }
        } else if at(0) == '/' && at(1) == '*' {
            let mut depth = 0;
            loop {
                let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
                if i >= c.len() {
                    break;
                }
                if at(0) == '/' && at(1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if at(0) == '*' && at(1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if (at(0) == 'r' || (at(0) == 'b' && at(1) == 'r'))
            && !c.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let s = if at(0) == 'b' { 2 } else { 1 };
                let mut k = s;
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            // Raw string: r"…", r#"…"#, br"…".
            let mut k = if at(0) == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(k) == '#' {
                hashes += 1;
                k += 1;
            }
            i += k + 1;
            out.push_str(&" ".repeat(k + 1));
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                    out.push_str(&" ".repeat(hashes + 1));
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(0) == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if at(0) == '\'' && (at(1) == '\\' || at(2) == '\'') {
            // A character literal ('x', '\n', '\u{1F600}'); a lifetime has no closing quote.
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

fn ident_at(c: &[char], i: usize) -> (String, usize) {
    let mut j = i;
    while j < c.len() && (is_ident(c[j]) || (j == i && c[j] == '*')) {
        if c[j] == '*' {
            return ("*".into(), j + 1);
        }
        j += 1;
    }
    (c[i..j].iter().collect(), j)
}

/// Reads the rest of a path or use tree after `prefix::`, pushing every full path.
fn expand(c: &[char], i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut i = skip_ws(c, i);
    if c.get(i) == Some(&'{') {
        i += 1;
        loop {
            i = skip_ws(c, i);
            match c.get(i) {
                None => return i,
                Some('}') => return i + 1,
                Some(',') => i += 1,
                Some(_) => {
                    let before = i;
                    i = expand(c, i, prefix, out);
                    if i == before {
                        i += 1;
                    }
                }
            }
        }
    }
    let (name, j) = ident_at(c, i);
    if name.is_empty() {
        out.push(prefix.to_vec());
        return i;
    }
    let mut path = prefix.to_vec();
    path.push(name);
    let k = skip_ws(c, j);
    if c.get(k) == Some(&':') && c.get(k + 1) == Some(&':') {
        let k = skip_ws(c, k + 2);
        if c.get(k) == Some(&'<') {
            out.push(path);
            return k;
        }
        return expand(c, k, &path, out);
    }
    out.push(path);
    // `name as alias`: skip the alias.
    let (word, after) = ident_at(c, k);
    if word == "as" {
        let (_, end) = ident_at(c, skip_ws(c, after));
        return end;
    }
    j
}

/// Every path in `code` rooted at `crate`, `super` or `self`, resolved from the crate
/// root, with its line: `module` is the file's module path.
fn crate_paths(code: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let c: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut depth = 0usize;
    // Inline modules open: (name, brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
        }
        if ch == '{' {
            depth += 1;
            if let Some(name) = pending_mod.take() {
                inline.push((name, depth));
            }
            i += 1;
            continue;
        }
        if ch == '}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if ch == ';' {
            pending_mod = None;
        }
        if !is_ident(ch) || (i > 0 && is_ident(c[i - 1])) {
            i += 1;
            continue;
        }
        let (word, j) = ident_at(&c, i);
        if word == "mod" {
            let (name, _) = ident_at(&c, skip_ws(&c, j));
            pending_mod = Some(name);
            i = j;
            continue;
        }
        let k = skip_ws(&c, j);
        let rooted = matches!(word.as_str(), "crate" | "super" | "self")
            && c.get(k) == Some(&':')
            && c.get(k + 1) == Some(&':')
            && !(i > 0 && c[i - 1] == '$');
        if !rooted {
            i = j;
            continue;
        }
        let mut here: Vec<String> = module.to_vec();
        here.extend(inline.iter().map(|(n, _)| n.clone()));
        let mut raw = Vec::new();
        let end = expand(&c, k + 2, &[word], &mut raw);
        for p in raw {
            let mut abs = here.clone();
            let mut rest = p.as_slice();
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "crate" => abs.clear(),
                    "super" => {
                        abs.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            abs.extend(rest.iter().cloned());
            found.push((line, abs));
        }
        line += c[i..end.max(i)].iter().filter(|&&x| x == '\n').count();
        i = end.max(j);
    }
    found
}

/// Why `path` (from the crate root) may not be named by a module of `layer`, if it may not.
fn refused(layer: Layer, path: &[String]) -> Option<&'static str> {
    let first = path.first().map(String::as_str).unwrap_or("");
    let is_disk_trait =
        DISK_TRAIT.iter().any(|t| path.len() == t.len() && path.iter().zip(t.iter()).all(|(a, b)| a == b));
    if first == "disk" && !is_disk_trait {
        return Some("names `crate::disk` beyond the `Disk` trait (a concrete back-end)");
    }
    if BACKENDS.contains(&first) {
        return Some("names a concrete disk back-end");
    }
    if layer == Layer::Engine && !is_disk_trait && !ENGINE_MAY_NAME.contains(&first) {
        return Some("the engine names a module outside the engine (schema, store, check…)");
    }
    None
}

/// Every violation in one file's source, as `file:line: path: why`.
fn violations(name: &str, module: &[String], layer: Layer, src: &str) -> Vec<String> {
    let code = strip(src);
    let mut v = Vec::new();
    for (line, path) in crate_paths(&code, module) {
        if let Some(why) = refused(layer, &path) {
            v.push(format!("{name}:{line}: crate::{}: {why}", path.join("::")));
        }
    }
    for (n, text) in code.lines().enumerate() {
        let c: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < c.len() {
            if is_ident(c[i]) && (i == 0 || !is_ident(c[i - 1])) {
                let (word, j) = ident_at(&c, i);
                if BACKEND_TYPES.contains(&word.as_str()) {
                    v.push(format!("{name}:{}: {word}: names a concrete disk back-end", n + 1));
                }
                i = j.max(i + 1);
            } else {
                i += 1;
            }
        }
    }
    v
}

fn layer_of(rel: &Path) -> Option<Layer> {
    if rel.starts_with("engine") {
        Some(Layer::Engine)
    } else if rel.starts_with("fs") || rel == Path::new("sessions.rs") {
        Some(Layer::Schema)
    } else {
        None
    }
}

#[test]
fn engine_and_schema_keep_to_their_layers() {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = Vec::new();
    let mut problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        let Some(layer) = layer_of(rel) else { continue };
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let name = format!("src/{}", rel.display());
        problems.extend(violations(&name, &module_of(rel), layer, &text));
        checked.push((name, layer));
    }
    // Guard against checking nothing (a moved folder, a wrong path).
    for must in ["src/engine/mod.rs", "src/engine/btree.rs", "src/engine/pager.rs", "src/fs/mod.rs", "src/fs/ops.rs"] {
        assert!(checked.iter().any(|(n, _)| n == must), "{must} was not checked; checked: {checked:?}");
    }
    assert!(checked.iter().filter(|(_, l)| *l == Layer::Engine).count() >= 8, "engine files: {checked:?}");
    // And against a reader that sees no paths: the pager's own imports must be found.
    let pager = strip(&fs::read_to_string(src.join("engine/pager.rs")).expect("pager.rs"));
    let seen = crate_paths(&pager, &["engine".into(), "pager".into()]);
    for want in [&["disk", "Disk"][..], &["engine", "alloc", "Allocator"], &["error", "Result"]] {
        assert!(seen.iter().any(|(_, p)| p == want), "{want:?} not among the pager's paths {seen:?}");
    }
    assert!(problems.is_empty(), "layer rule broken:\n{}", problems.join("\n"));
}

// ---- the checker itself ----------------------------------------------------------------

fn engine_file(src: &str) -> Vec<String> {
    violations("src/engine/x.rs", &["engine".into(), "x".into()], Layer::Engine, src)
}

fn schema_file(src: &str) -> Vec<String> {
    violations("src/fs/x.rs", &["fs".into(), "x".into()], Layer::Schema, src)
}

#[test]
fn checker_refuses_the_schema_and_the_store_in_the_engine() {
    for bad in [
        "use crate::fs::inode::Inode;",
        "use crate::store::Store;",
        "use crate::sessions;",
        "use crate::check::fsck;",
        "use crate::key::kind;",
        "use crate::Store;",
        "use super::super::fs;",
        "use crate::{error::Error, fs::keys::kind};",
        "use crate::{\n    engine::key::Key,\n    store::{self, FS_TREE_ID},\n};",
        "fn f() -> u64 { crate::store::MAX_INO }",
        "mod tests { use super::super::super::fs::ops; }",
    ] {
        assert!(!engine_file(bad).is_empty(), "not refused in the engine: {bad}");
    }
    assert_eq!(engine_file("use crate::{error::Error, fs::keys::kind};").len(), 1);
}

#[test]
fn checker_refuses_back_ends_in_engine_and_schema() {
    for bad in [
        "use crate::disk::MemDisk;",
        "use crate::disk::{Disk, FileDisk};",
        "use crate::crash::RecordingDisk;",
        "use crate::disk::crash::FailingDisk;",
        "use crate::disk::*;",
        "use crate::*; fn f() { let _ = MemDisk::new(4096); }",
        "use crate::UringDisk;",
    ] {
        assert!(!engine_file(bad).is_empty(), "not refused in the engine: {bad}");
        assert!(!schema_file(bad).is_empty(), "not refused in the schema: {bad}");
    }
}

#[test]
fn checker_accepts_what_the_layers_may_use() {
    let engine_ok = "//! Never `crate::fs` or MemDisk (a comment).\n\
        use std::fs::File;\n\
        use crate::disk::Disk;\n\
        use crate::engine::node::{BlockPtr, Node};\n\
        use crate::error::{Error, Result};\n\
        use super::key::Key;\n\
        use self::inner::X;\n\
        fn f() -> usize { let _ = \"crate::fs::ops MemDisk\"; let _ = 'x'; crate::limits::BLOCK_SIZE }\n\
        fn g<'a>(s: &'a str) -> &'a str { s }\n\
        mod inner { pub struct X; }\n\
        #[cfg(test)]\nmod tests { use super::*; }";
    assert_eq!(engine_file(engine_ok), Vec::<String>::new());
    let schema_ok = "use crate::disk::Disk;\nuse crate::engine::key::Key;\nuse crate::fs::keys::kind;\n\
        use crate::store::Store;\nuse crate::limits::{BLOCK_SIZE, NAME_MAX as MAX};";
    assert_eq!(schema_file(schema_ok), Vec::<String>::new());
    // In `engine/mod.rs`, `super` is the crate root.
    assert!(!violations("src/engine/mod.rs", &["engine".into()], Layer::Engine, "use super::fs;").is_empty());
    assert!(violations("src/engine/mod.rs", &["engine".into()], Layer::Engine, "use self::key::Key;").is_empty());
}
