//! What `crest --version` and `crest version` say: the release, the commit it was built
//! from (build.rs), and the versions it speaks with others — the wire protocol (a server
//! and its clients must share one), the on-disk format and the send stream — so that an
//! administrator can tell which binaries can work together without reading the source.

use std::sync::OnceLock;

/// The release (the workspace's version).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");
/// The git commit: 12 hex digits, "-dirty" if the tree differed from it, or "unknown".
pub const COMMIT: &str = env!("CREST_COMMIT");

/// Protocol versions this binary speaks, oldest first: a server and a client work together
/// when their ranges meet (so either can be upgraded first).
pub fn protocols() -> Vec<u32> {
    (crest_proto::OLDEST_PROTOCOL_VERSION..=crest_proto::PROTOCOL_VERSION).collect()
}

/// `crest -V`: "0.1.0 (commit)".
pub fn short() -> &'static str {
    static SHORT: OnceLock<String> = OnceLock::new();
    SHORT.get_or_init(|| format!("{RELEASE} ({COMMIT})"))
}

/// `crest --version` and `crest version`: one "name: value" line each, after the
/// release that clap puts after "crest ".
pub fn long() -> &'static str {
    static LONG: OnceLock<String> = OnceLock::new();
    LONG.get_or_init(|| {
        format!(
            "{RELEASE}\ncommit: {COMMIT}\nprotocol: {} (speaks {} to {})\non-disk format: {} (opens {} to {})\nsend stream: {}",
            crest_proto::PROTOCOL_VERSION,
            crest_proto::OLDEST_PROTOCOL_VERSION,
            crest_proto::PROTOCOL_VERSION,
            crest_store::superblock::FORMAT_VERSION,
            crest_store::superblock::OLDEST_FORMAT_VERSION,
            crest_store::superblock::FORMAT_VERSION,
            crest_store::send::STREAM_VERSION,
        )
    })
}

/// `crest version [--json]`.
pub fn print(json: bool) {
    if json {
        let v = serde_json::json!({
            "version": RELEASE, "commit": COMMIT, "protocols": protocols(),
            "format": crest_store::superblock::FORMAT_VERSION,
            "formats_opened": [crest_store::superblock::OLDEST_FORMAT_VERSION, crest_store::superblock::FORMAT_VERSION],
            "send_stream": crest_store::send::STREAM_VERSION,
        });
        println!("{v}");
    } else {
        println!("crest {}", long());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_is_hex_or_unknown() {
        let hash = COMMIT.strip_suffix("-dirty").unwrap_or(COMMIT);
        let hex = hash.len() == 12 && hash.bytes().all(|c| c.is_ascii_hexdigit());
        assert!(hex || COMMIT == "unknown", "{COMMIT:?}");
    }

    #[test]
    fn long_names_every_version() {
        let long = long();
        assert!(long.starts_with(RELEASE));
        for line in [
            format!("commit: {COMMIT}"),
            format!(
                "protocol: {} (speaks {} to {})",
                crest_proto::PROTOCOL_VERSION,
                crest_proto::OLDEST_PROTOCOL_VERSION,
                crest_proto::PROTOCOL_VERSION
            ),
            format!(
                "on-disk format: {} (opens {} to {})",
                crest_store::superblock::FORMAT_VERSION,
                crest_store::superblock::OLDEST_FORMAT_VERSION,
                crest_store::superblock::FORMAT_VERSION
            ),
        ] {
            assert!(long.lines().any(|l| l == line), "no {line:?} in {long:?}");
        }
    }
}
