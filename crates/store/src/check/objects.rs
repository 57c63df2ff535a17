//! fsck of the object-store items of the root tree (`fs/objects.rs`): the data URL, the
//! id counter, grants and the gone list, against the refcount items of object blocks.

use super::Checker;
use crate::engine::key::Key;
use crate::fs::keys::kind;
use crate::fs::objects::{object_of, parse_data_url, DataStore};
use std::collections::BTreeSet;

/// What the root tree says about objects.
#[derive(Default)]
pub(super) struct Seen {
    config: Option<DataStore>,
    next: Option<u64>,
    granted: BTreeSet<u64>,
    gone: BTreeSet<u64>,
}

impl Seen {
    pub(super) fn item(&mut self, c: &mut Checker, k: Key, v: &[u8]) {
        match k.kind {
            kind::OBJECT_CONFIG if k.offset == 0 && v.len() > 8 => {
                match std::str::from_utf8(&v[8..]).ok().filter(|u| parse_data_url(u).is_ok()) {
                    Some(url) => {
                        let store_id = crate::fs::inode::le_u64(v, 0);
                        self.config = Some(DataStore { url: url.to_string(), store_id });
                    }
                    None => c.problem(format!("root tree: bad data URL item {k:?}")),
                }
            }
            kind::OBJECT_NEXT if k.offset == 0 && v.len() == 8 => {
                self.next = Some(crate::fs::inode::le_u64(v, 0));
            }
            kind::OBJECT_GRANT if v.len() == 8 => {
                self.granted.insert(k.offset);
            }
            kind::OBJECT_GONE if v.is_empty() => {
                self.gone.insert(k.offset);
            }
            _ => c.problem(format!("root tree: bad object item {k:?}")),
        }
    }

    /// Every referenced object is below the counter and neither granted nor gone; no id
    /// is both granted and gone; object items exist only with a data URL.
    pub(super) fn finish(&self, c: &mut Checker, refs: &[(u64, u64, u32)]) {
        let referenced: BTreeSet<u64> = refs.iter().filter_map(|r| object_of(r.0)).map(|(id, _)| id).collect();
        let any = !referenced.is_empty() || !self.granted.is_empty() || !self.gone.is_empty() || self.next.is_some();
        if any && self.config.is_none() {
            c.problem("root tree: object items in an image with no data URL".into());
        }
        let next = self.next.unwrap_or(1);
        for id in referenced.iter().chain(&self.granted).chain(&self.gone) {
            if *id == 0 || *id >= next {
                c.problem(format!("object {id} is not below the next object id {next}"));
            }
        }
        for id in referenced.intersection(&self.gone) {
            c.problem(format!("object {id} is referenced and on the gone list"));
        }
        for id in referenced.intersection(&self.granted) {
            c.problem(format!("object {id} is referenced and still granted"));
        }
        for id in self.granted.intersection(&self.gone) {
            c.problem(format!("object {id} is granted and on the gone list"));
        }
        c.report.objects = referenced.len() as u64;
        c.report.objects_gone = self.gone.len() as u64;
        c.report.data_store = self.config.clone();
        c.report.objects_pending = self.granted.union(&self.gone).copied().collect();
        c.report.objects_referenced = referenced;
    }
}
