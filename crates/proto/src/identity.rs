//! Whom a server takes a client host's callers for: the one mapping the server applies
//! before every permission check, and a mount consults before it answers a change itself
//! (the kernel judged that change with the caller's own ids).

use serde::{Deserialize, Serialize};

use crate::message::{Caller, MAX_CALLER_GROUPS};

/// How a server maps the callers of one client host before it checks their permissions
/// (docs/security.md, "Export policies"): ids first (`uid_map`, `gid_map`), then
/// squashing (`all_squash`, `root_squash`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityMap {
    /// uid 0 acts as `anon_uid`, gid 0 as `anon_gid`, and group 0 is dropped.
    pub root_squash: bool,
    /// Everyone acts as `anon_uid`:`anon_gid`, without supplementary groups.
    pub all_squash: bool,
    /// The uid squashed callers get.
    pub anon_uid: u32,
    /// The gid squashed callers get.
    pub anon_gid: u32,
    /// Client uid → server uid; ids not named stay as they are.
    pub uid_map: Vec<(u32, u32)>,
    /// Client gid → server gid (primary and supplementary groups), as `uid_map`.
    pub gid_map: Vec<(u32, u32)>,
    /// The server keeps the set-user-ID bit, and set-group-ID on files, that callers set
    /// (else it drops them): where not, a mount answers no change that sets them.
    pub allow_setid: bool,
    /// The server makes character and block devices for root (else it refuses): where
    /// not, a mount answers no such create.
    pub allow_devices: bool,
}

/// The most entries of each of `IdentityMap`'s id maps a client takes a welcome's map
/// for: beyond, it answers no caller's change itself.
pub const MAX_ID_MAP_ENTRIES: usize = 4096;

impl IdentityMap {
    /// The caller a request runs as on the server. Supplementary groups beyond
    /// `MAX_CALLER_GROUPS` are dropped (a request naming more is refused before this).
    pub fn map(&self, caller: &Caller) -> Caller {
        let look = |map: &[(u32, u32)], id: u32| map.iter().find(|(from, _)| *from == id).map_or(id, |(_, to)| *to);
        let mut c = Caller {
            uid: look(&self.uid_map, caller.uid),
            gid: look(&self.gid_map, caller.gid),
            groups: caller.groups.iter().take(MAX_CALLER_GROUPS).map(|&g| look(&self.gid_map, g)).collect(),
        };
        if self.all_squash {
            c = Caller { uid: self.anon_uid, gid: self.anon_gid, groups: Vec::new() };
        }
        if self.root_squash {
            if c.uid == 0 {
                c.uid = self.anon_uid;
            }
            if c.gid == 0 {
                c.gid = self.anon_gid;
            }
            c.groups.retain(|&g| g != 0);
        }
        c
    }

    /// Whether the server keeps `mode` as a caller sets it on an inode (`dir`: a
    /// directory, whose set-group-ID bit is always kept).
    pub fn keeps_mode(&self, mode: u32, dir: bool) -> bool {
        const S_ISUID: u32 = 0o4000;
        const S_ISGID: u32 = 0o2000;
        let setid = if dir { S_ISUID } else { S_ISUID | S_ISGID };
        self.allow_setid || mode & setid == 0
    }

    /// Whether the server takes every caller for who it is (`MAX_CALLER_GROUPS` allowing).
    pub fn is_identity(&self) -> bool {
        !self.root_squash && !self.all_squash && self.uid_map.is_empty() && self.gid_map.is_empty()
    }

    /// Whether the server takes `caller` for who it is (its ids, its groups): then a
    /// permission check made with the caller's own ids is the one the server makes.
    pub fn keeps(&self, caller: &Caller) -> bool {
        if self.is_identity() {
            return caller.groups.len() <= MAX_CALLER_GROUPS;
        }
        if self.uid_map.len() > MAX_ID_MAP_ENTRIES || self.gid_map.len() > MAX_ID_MAP_ENTRIES {
            return false;
        }
        self.map(caller) == *caller
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn root_squash_keeps_everyone_but_root_and_group_zero() {
        let m = IdentityMap { root_squash: true, anon_uid: 65534, anon_gid: 65534, ..IdentityMap::default() };
        assert!(m.keeps(&caller(1000, 1000, &[4, 27])));
        assert!(!m.keeps(&caller(0, 0, &[])), "root");
        assert!(!m.keeps(&caller(1000, 0, &[])), "group 0");
        assert!(!m.keeps(&caller(1000, 1000, &[0])), "group 0 among the supplementary ones");
        assert_eq!(m.map(&caller(0, 5, &[0, 6])), caller(65534, 5, &[6]));
    }

    #[test]
    fn all_squash_keeps_only_who_it_squashes_to() {
        let m = IdentityMap { all_squash: true, anon_uid: 7, anon_gid: 8, ..IdentityMap::default() };
        assert!(!m.keeps(&caller(1000, 1000, &[])));
        assert!(!m.keeps(&caller(7, 8, &[9])), "its groups are dropped");
        assert!(m.keeps(&caller(7, 8, &[])));
    }

    #[test]
    fn id_maps_keep_the_ids_they_do_not_name_or_name_to_themselves() {
        let m =
            IdentityMap { uid_map: vec![(1000, 2000), (5, 5)], gid_map: vec![(100, 200)], ..IdentityMap::default() };
        assert!(!m.keeps(&caller(1000, 1, &[])));
        assert!(m.keeps(&caller(5, 1, &[])));
        assert!(!m.keeps(&caller(6, 100, &[])));
        assert!(!m.keeps(&caller(6, 1, &[100])));
        assert!(m.keeps(&caller(0, 0, &[0])), "no squashing: root is root");
    }

    #[test]
    fn a_map_too_long_to_judge_keeps_nobody() {
        let long: Vec<(u32, u32)> = (0..=MAX_ID_MAP_ENTRIES as u32).map(|i| (i + 100_000, i)).collect();
        assert!(!IdentityMap { uid_map: long.clone(), ..IdentityMap::default() }.keeps(&caller(1, 1, &[])));
        assert!(!IdentityMap { gid_map: long, ..IdentityMap::default() }.keeps(&caller(1, 1, &[])));
    }

    #[test]
    fn setid_bits_are_kept_only_where_allowed() {
        let strict = IdentityMap::default();
        assert!(strict.keeps_mode(0o755, false) && strict.keeps_mode(0o2755, true), "plain modes, setgid directories");
        assert!(
            !strict.keeps_mode(0o4755, false) && !strict.keeps_mode(0o2755, false) && !strict.keeps_mode(0o4755, true)
        );
        let open = IdentityMap { allow_setid: true, ..IdentityMap::default() };
        assert!(open.keeps_mode(0o6755, false) && open.keeps_mode(0o4755, true));
    }

    #[test]
    fn too_many_groups_are_never_judged_here() {
        let groups: Vec<u32> = (1..=MAX_CALLER_GROUPS as u32 + 1).collect();
        assert!(!IdentityMap::default().keeps(&caller(1, 1, &groups)));
        assert!(IdentityMap::default().keeps(&caller(1, 1, &groups[..MAX_CALLER_GROUPS])));
    }
}
