//! `crest fsck` of an image that keeps file data in a data store: the bucket is listed
//! under the image's prefix and held against the image. An object the image references
//! and the bucket lacks is a problem (data lost); one the bucket holds and the image
//! neither references, grants nor has to delete is an orphan (a note that names it:
//! space leaked, nothing lost). Without the store's keys in the environment, a note says
//! the objects were not checked.

use crest_objects::Transfers;
use crest_serve::DataConfig;
use crest_server::objects::{parse_listing, DataAccess};
use crest_store::check::Report;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Orphans named one by one in the notes (the rest counted).
const NAMED: usize = 20;

fn now() -> crest_proto::Time {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    crest_proto::Time { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
}

/// Adds the data store's side to `report` (see the module doc).
pub fn check(report: &mut Report, config: Option<&DataConfig>) {
    let Some(store) = report.data_store.clone() else { return };
    let Some(config) = config else {
        report.notes.push(format!("file data in {}: objects not checked (no AWS_* keys set)", store.url));
        return;
    };
    let (under, listed) = match DataAccess::new(config, &store).and_then(|a| list(&a).map(|ids| (a, ids))) {
        Ok((a, ids)) => (a.keys_under().to_string(), ids),
        Err(e) => {
            report.problems.push(format!("cannot list the objects in {}: {e}", store.url));
            return;
        }
    };
    let missing: Vec<u64> = report.objects_referenced.difference(&listed).copied().collect();
    for id in &missing {
        report.problems.push(format!("object {id} is referenced but missing from {}", store.url));
    }
    let orphans: Vec<u64> = listed
        .iter()
        .filter(|id| !report.objects_referenced.contains(id) && !report.objects_pending.contains(id))
        .copied()
        .collect();
    if !orphans.is_empty() {
        let named: Vec<String> = orphans.iter().take(NAMED).map(|id| store.object_key(*id)).collect();
        let more = orphans.len().saturating_sub(NAMED);
        report.notes.push(format!(
            "{} orphan objects in {} (referenced by nothing: safe to delete): {}{}",
            orphans.len(),
            store.url,
            named.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ));
    }
    report.notes.push(format!(
        "{} objects in {} under {}: {} referenced, {} pending deletion or unmapped grants, {} orphans, {} missing",
        listed.len(),
        store.url,
        under,
        report.objects_referenced.len(),
        report.objects_pending.len(),
        orphans.len(),
        missing.len()
    ));
}

/// The ids of every object of the image the bucket holds.
fn list(access: &DataAccess) -> Result<BTreeSet<u64>, String> {
    let t = Transfers::new(Duration::from_secs(30));
    let mut ids = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let xml = t.get_text(&access.list_url(token.as_deref(), now())).map_err(|e| e.to_string())?;
        let (keys, next) = parse_listing(&xml)?;
        ids.extend(keys.iter().filter_map(|k| access.id_of_key(k)));
        match next {
            Some(n) if !keys.is_empty() => token = Some(n),
            _ => return Ok(ids),
        }
    }
}
