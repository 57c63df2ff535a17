//! POSIX ACLs as Linux passes them through xattrs (`system.posix_acl_access`,
//! `system.posix_acl_default`), and the rules that tie them to a file's mode.
//!
//! The kernel enforces ACLs itself (FUSE_POSIX_ACL) but leaves their bookkeeping to the
//! file system: an access ACL equivalent to the mode is stored as the mode alone, chmod
//! rewrites the access ACL's owner, mask (or group) and other entries, and a new inode
//! takes its parent's default ACL, masked by the mode asked for, instead of the umask.
//! The server applies these rules when it runs an operation and a client applies the same
//! ones to operations it answers itself under exclusive rights; both call this module, so
//! the two never disagree about a mode.

/// Xattr name of a file's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// Xattr name of a directory's default ACL (what new inodes inside inherit).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// `Attr::flags`: the inode has an access ACL.
pub const HAS_ACCESS: u32 = 1;
/// `Attr::flags`: the inode (a directory) has a default ACL.
pub const HAS_DEFAULT: u32 = 2;

/// Entry tags (linux/posix_acl.h).
pub const USER_OBJ: u16 = 0x01;
/// A named user.
pub const USER: u16 = 0x02;
/// The owning group.
pub const GROUP_OBJ: u16 = 0x04;
/// A named group.
pub const GROUP: u16 = 0x08;
/// The most a named user, a named group or the owning group is granted.
pub const MASK: u16 = 0x10;
/// Everyone else.
pub const OTHER: u16 = 0x20;

const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// The kernel refuses ACLs larger than a page (`fuse_set_acl`), so no valid one has more.
pub const MAX_ENTRIES: usize = (4096 - HEADER_BYTES) / ENTRY_BYTES;
const UNDEFINED_ID: u32 = u32::MAX;

/// Mode bits an ACL stands for (rwx of owner, group, other).
const RWX_UGO: u32 = 0o777;

/// Which flag bit an xattr name sets, if it is an ACL.
pub fn flag_of(name: &[u8]) -> u32 {
    match name {
        ACCESS => HAS_ACCESS,
        DEFAULT => HAS_DEFAULT,
        _ => 0,
    }
}

/// One entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `USER_OBJ` … `OTHER`.
    pub tag: u16,
    /// rwx as 4, 2, 1.
    pub perm: u16,
    /// uid or gid for `USER` and `GROUP`; ignored otherwise.
    pub id: u32,
}

/// Why a value is not a valid ACL (EINVAL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// Parses and validates an xattr value the way `posix_acl_from_xattr` and
/// `posix_acl_valid` do: version 2, whole entries, one owner, group and other entry,
/// named entries in increasing id order without repeats, a mask when any are named.
pub fn parse(value: &[u8]) -> Result<Vec<Entry>, Invalid> {
    if value.len() < HEADER_BYTES || !(value.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
        return Err(Invalid("ACL size is not a header and whole entries"));
    }
    let version = u32::from_le_bytes([value[0], value[1], value[2], value[3]]);
    if version != VERSION {
        return Err(Invalid("ACL version is not 2"));
    }
    let count = (value.len() - HEADER_BYTES) / ENTRY_BYTES;
    if count > MAX_ENTRIES {
        return Err(Invalid("ACL has more entries than a page holds"));
    }
    let entries: Vec<Entry> = value[HEADER_BYTES..]
        .chunks_exact(ENTRY_BYTES)
        .map(|e| Entry {
            tag: u16::from_le_bytes([e[0], e[1]]),
            perm: u16::from_le_bytes([e[2], e[3]]),
            id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
        })
        .map(|e| match e.tag {
            USER | GROUP => e,
            _ => Entry { id: UNDEFINED_ID, ..e },
        })
        .collect();
    validate(&entries)?;
    Ok(entries)
}

fn validate(entries: &[Entry]) -> Result<(), Invalid> {
    // posix_acl_valid: tags in order, named ids ascending within their tag.
    let (mut user_obj, mut group_obj, mut other, mut mask, mut named) = (0, 0, 0, 0, 0);
    let mut last: Option<(u16, u32)> = None;
    for e in entries {
        if e.perm & !7 != 0 {
            return Err(Invalid("ACL permission beyond rwx"));
        }
        match e.tag {
            USER_OBJ => user_obj += 1,
            GROUP_OBJ => group_obj += 1,
            OTHER => other += 1,
            MASK => mask += 1,
            USER | GROUP => named += 1,
            _ => return Err(Invalid("unknown ACL tag")),
        }
        let key = (e.tag, if matches!(e.tag, USER | GROUP) { e.id } else { 0 });
        if last.is_some_and(|l| l >= key) {
            return Err(Invalid("ACL entries out of order or repeated"));
        }
        last = Some(key);
    }
    if user_obj != 1 || group_obj != 1 || other != 1 || mask > 1 || (named > 0 && mask == 0) {
        return Err(Invalid("ACL lacks an owner, group, other or needed mask entry"));
    }
    Ok(())
}

/// The xattr value of `entries`.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + entries.len() * ENTRY_BYTES);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

/// `posix_acl_equiv_mode`: the permission bits `entries` grant (the mask standing for the
/// group class), and whether the mode alone can say the same (no named entry, no mask).
pub fn equiv_mode(entries: &[Entry]) -> (u32, bool) {
    let mut mode = 0;
    let mut equivalent = true;
    for e in entries {
        let p = u32::from(e.perm & 7);
        match e.tag {
            USER_OBJ => mode |= p << 6,
            GROUP_OBJ => mode |= p << 3,
            OTHER => mode |= p,
            MASK => {
                mode = (mode & !0o070) | (p << 3);
                equivalent = false;
            }
            _ => equivalent = false,
        }
    }
    (mode, equivalent)
}

/// What setting an access ACL does (`posix_acl_update_mode`): the file's new mode, and
/// the value to store (`None`: the ACL is equivalent to the mode, so none is kept).
/// `kill_sgid`: the caller is neither in the file's group nor holds CAP_FSETID.
pub fn update_mode(mode: u32, entries: &[Entry], kill_sgid: bool) -> (u32, Option<Vec<u8>>) {
    let (bits, equivalent) = equiv_mode(entries);
    let mut mode = (mode & !RWX_UGO) | bits;
    if kill_sgid {
        mode &= !0o2000;
    }
    (mode, (!equivalent).then(|| encode(entries)))
}

/// What the server keeps of setting ACL xattr `name` to `value`: `None` when `name` is
/// not an ACL or `value` is not a valid one (the server refuses it); `Some(None)` when
/// nothing is stored (an access ACL equivalent to the mode); else the stored value.
pub fn kept(name: &[u8], value: &[u8]) -> Option<Option<Vec<u8>>> {
    let flag = flag_of(name);
    let entries = parse(value).ok().filter(|_| flag != 0)?;
    Some((flag == HAS_DEFAULT || !equiv_mode(&entries).1).then(|| encode(&entries)))
}

/// `__posix_acl_chmod`: the access ACL after a chmod to `mode`.
pub fn chmod(entries: &[Entry], mode: u32) -> Vec<Entry> {
    let has_mask = entries.iter().any(|e| e.tag == MASK);
    entries
        .iter()
        .map(|e| {
            let perm = match e.tag {
                USER_OBJ => (mode >> 6) & 7,
                OTHER => mode & 7,
                MASK => (mode >> 3) & 7,
                GROUP_OBJ if !has_mask => (mode >> 3) & 7,
                _ => return *e,
            };
            Entry { perm: perm as u16, ..*e }
        })
        .collect()
}

/// What a new inode gets: its permission bits, its access ACL and (directories) its
/// default ACL, as `posix_acl_create` decides. Without a default ACL in the parent, the
/// umask applies; with one, the ACL masks the mode asked for and the umask does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// Permission bits, setuid/setgid/sticky included (`0o7777`).
    pub mode: u32,
    /// Access ACL to store (`None` when equivalent to `mode`).
    pub access: Option<Vec<u8>>,
    /// Default ACL to store (directories inside a directory with one).
    pub default: Option<Vec<u8>>,
}

impl Inherited {
    /// The `Attr::flags` of an inode that got these ACLs.
    pub fn flags(&self) -> u32 {
        let mut f = 0;
        if self.access.is_some() {
            f |= HAS_ACCESS;
        }
        if self.default.is_some() {
            f |= HAS_DEFAULT;
        }
        f
    }
}

/// `posix_acl_create` + `posix_acl_create_masq` for a new inode with requested `mode`
/// (permission bits), the creator's `umask` and the parent's default ACL value if any.
/// Symlinks never take an ACL. A parent default ACL that does not parse (only a damaged
/// store holds one) is treated as absent.
pub fn inherit(parent_default: Option<&[u8]>, is_dir: bool, is_symlink: bool, mode: u32, umask: u32) -> Inherited {
    let mode = mode & 0o7777;
    if is_symlink {
        return Inherited { mode, access: None, default: None };
    }
    let parsed = parent_default.and_then(|v| parse(v).ok());
    let Some(mut acl) = parsed else {
        return Inherited { mode: mode & !(umask & 0o777), access: None, default: None };
    };
    let default = is_dir.then(|| encode(&acl));
    let mut m = mode;
    let mut equivalent = true;
    for e in acl.iter_mut() {
        match e.tag {
            USER_OBJ => {
                e.perm &= ((m >> 6) & 7) as u16;
                m &= (u32::from(e.perm) << 6) | !0o700;
            }
            OTHER => {
                e.perm &= (m & 7) as u16;
                m &= u32::from(e.perm) | !0o007;
            }
            USER | GROUP | MASK => equivalent = false,
            _ => {}
        }
    }
    let class = if acl.iter().any(|e| e.tag == MASK) { MASK } else { GROUP_OBJ };
    if let Some(e) = acl.iter_mut().find(|e| e.tag == class) {
        e.perm &= ((m >> 3) & 7) as u16;
        m &= (u32::from(e.perm) << 3) | !0o070;
    }
    Inherited { mode: m, access: (!equivalent).then(|| encode(&acl)), default }
}

/// `permits`' `mode` may carry this bit (Linux's `S_IFDIR`) to say the object is a
/// directory: uid 0 may then search it whatever its x bits.
pub const S_IFDIR: u32 = 0o040_000;

/// Read, in `permits`' `want`.
pub const MAY_READ: u32 = 4;
/// Write, in `permits`' `want`.
pub const MAY_WRITE: u32 = 2;
/// Execute, or search a directory, in `permits`' `want`.
pub const MAY_EXEC: u32 = 1;

/// The POSIX.1e access check (Linux's `generic_permission`: `acl_permission_check` and
/// `posix_acl_permission`, then the capabilities of uid 0): whether `caller` may do all of
/// `want` (`MAY_READ | MAY_WRITE | MAY_EXEC`) to an object of permission bits `mode`
/// (`S_IFDIR` added for a directory), owner `owner` and group `group`, whose access ACL,
/// if it has one, is `acl`.
///
/// uid 0 may always read and write, and execute when any x bit is set in `mode` or the
/// object is a directory (search). Without an ACL the classic class applies: the owner's
/// bits if the caller owns the object, else the group's if the caller is in its group,
/// else the other bits. With one, the owner entry for the owner, a named user entry for
/// that user, else the owning group and named group entries the caller is in (any one
/// granting all of `want` does), else the other entry; named users and every group entry
/// are limited by the mask. An ACL without an owner or other entry (not one `parse`
/// accepts) grants nothing. As in Linux's `acl_permission_check`, the ACL is not looked
/// at when the mode's group bits (the mask) grant nothing: the caller is then judged by
/// the mode alone, so a named group entry does not refuse what the other bits grant.
pub fn permits(mode: u32, owner: u32, group: u32, acl: Option<&[Entry]>, caller: &crate::Caller, want: u32) -> bool {
    let want = want & 7;
    if caller.uid == 0 {
        return want & MAY_EXEC == 0 || mode & S_IFDIR != 0 || mode & 0o111 != 0;
    }
    match acl {
        None => {
            let class = if caller.uid == owner {
                mode >> 6
            } else if caller.in_group(group) {
                mode >> 3
            } else {
                mode
            };
            class & want == want
        }
        Some(entries) if mode & 0o070 != 0 => acl_permits(entries, owner, group, caller, want),
        Some(_) => permits(mode, owner, group, None, caller, want),
    }
}

/// `posix_acl_permission`.
fn acl_permits(entries: &[Entry], owner: u32, group: u32, caller: &crate::Caller, want: u32) -> bool {
    let grants = |e: &Entry| u32::from(e.perm) & want == want;
    let mask = entries.iter().find(|e| e.tag == MASK).map_or(7, |e| u32::from(e.perm));
    let masked = |e: &Entry| u32::from(e.perm) & mask & want == want;
    if caller.uid == owner {
        return entries.iter().find(|e| e.tag == USER_OBJ).is_some_and(grants);
    }
    if let Some(e) = entries.iter().find(|e| e.tag == USER && e.id == caller.uid) {
        return masked(e);
    }
    let mut found = false;
    for e in entries {
        let member = match e.tag {
            GROUP_OBJ => caller.in_group(group),
            GROUP => caller.in_group(e.id),
            _ => false,
        };
        if member {
            found = true;
            if grants(e) {
                return masked(e);
            }
        }
    }
    !found && entries.iter().find(|e| e.tag == OTHER).is_some_and(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn minimal(u: u16, g: u16, o: u16) -> Vec<Entry> {
        vec![e(USER_OBJ, u, 0), e(GROUP_OBJ, g, 0), e(OTHER, o, 0)]
    }

    fn named() -> Vec<Entry> {
        vec![e(USER_OBJ, 7, 0), e(USER, 6, 1000), e(GROUP_OBJ, 5, 0), e(MASK, 7, 0), e(OTHER, 4, 0)]
    }

    fn canon(v: Vec<Entry>) -> Vec<Entry> {
        v.into_iter().map(|x| if matches!(x.tag, USER | GROUP) { x } else { Entry { id: UNDEFINED_ID, ..x } }).collect()
    }

    #[test]
    fn encode_then_parse_round_trips() {
        for acl in [minimal(6, 4, 0), named()] {
            assert_eq!(parse(&encode(&acl)), Ok(canon(acl)));
        }
    }

    #[test]
    fn invalid_acls_are_refused() {
        let bad: Vec<Vec<u8>> = vec![
            vec![],
            vec![2, 0, 0, 0, 1],
            {
                let mut v = encode(&minimal(7, 5, 5));
                v[0] = 1;
                v
            },
            encode(&[e(USER_OBJ, 7, 0), e(OTHER, 4, 0)]),
            encode(&[e(USER_OBJ, 7, 0), e(USER, 6, 5), e(GROUP_OBJ, 5, 0), e(OTHER, 4, 0)]),
            encode(&[
                e(USER_OBJ, 7, 0),
                e(USER, 6, 5),
                e(USER, 6, 5),
                e(GROUP_OBJ, 5, 0),
                e(MASK, 7, 0),
                e(OTHER, 0, 0),
            ]),
            encode(&[e(GROUP_OBJ, 5, 0), e(USER_OBJ, 7, 0), e(OTHER, 4, 0)]),
            encode(&[e(USER_OBJ, 8, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 4, 0)]),
            encode(&[e(USER_OBJ, 7, 0), e(0x40, 5, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 4, 0)]),
        ];
        for v in bad {
            assert!(parse(&v).is_err(), "{v:?} accepted");
        }
    }

    #[test]
    fn a_minimal_acl_is_the_mode_alone() {
        let (mode, stored) = update_mode(0o100_2644, &minimal(7, 5, 1), false);
        assert_eq!((mode, stored), (0o100_2751, None));
        let (mode, stored) = update_mode(0o2644, &minimal(7, 5, 1), true);
        assert_eq!((mode, stored), (0o751, None), "setgid goes for a caller outside the group");
    }

    #[test]
    fn the_mask_stands_for_the_group_class() {
        let acl = named();
        let (mode, stored) = update_mode(0o600, &acl, false);
        assert_eq!(mode, 0o774);
        assert_eq!(stored.as_deref().map(parse), Some(Ok(canon(acl))));
    }

    #[test]
    fn chmod_rewrites_owner_mask_and_other() {
        let after = chmod(&named(), 0o751);
        assert_eq!(after[0].perm, 7);
        assert_eq!(after[1].perm, 6, "named entries stay");
        assert_eq!(after[2].perm, 5, "the group entry stays under a mask");
        assert_eq!(after[3].perm, 5);
        assert_eq!(after[4].perm, 1);
        let plain = chmod(&minimal(7, 7, 7), 0o640);
        assert_eq!(plain.iter().map(|e| e.perm).collect::<Vec<_>>(), vec![6, 4, 0]);
    }

    #[test]
    fn without_a_default_acl_the_umask_applies() {
        let i = inherit(None, false, false, 0o666, 0o022);
        assert_eq!(i, Inherited { mode: 0o644, access: None, default: None });
    }

    #[test]
    fn a_default_acl_masks_the_mode_instead_of_the_umask() {
        let default = encode(&named());
        let f = inherit(Some(&default), false, false, 0o666, 0o077);
        assert_eq!(f.mode, 0o664, "owner rw, mask rw (from the mode), other r");
        let access = f.access.as_deref().map(parse);
        assert_eq!(
            access,
            Some(Ok(canon(vec![
                e(USER_OBJ, 6, 0),
                e(USER, 6, 1000),
                e(GROUP_OBJ, 5, 0),
                e(MASK, 6, 0),
                e(OTHER, 4, 0)
            ])))
        );
        assert_eq!(f.default, None, "files take no default ACL");
        let d = inherit(Some(&default), true, false, 0o777, 0o077);
        assert_eq!(d.mode, 0o774);
        assert_eq!(d.default, Some(encode(&canon(named()))), "directories pass it on");
        let l = inherit(Some(&default), false, true, 0o777, 0o077);
        assert_eq!(l, Inherited { mode: 0o777, access: None, default: None }, "symlinks take none, nor the umask");
    }

    #[test]
    fn kept_says_what_the_server_stores() {
        for acl in [minimal(6, 4, 0), named()] {
            let v = encode(&acl);
            assert_eq!(kept(ACCESS, &v), Some(update_mode(0o644, &canon(acl.clone()), false).1));
            assert_eq!(kept(DEFAULT, &v), Some(Some(encode(&canon(acl)))), "a default ACL is kept as it is");
        }
        assert_eq!(kept(ACCESS, &encode(&minimal(6, 4, 0))), Some(None));
        assert_eq!(kept(b"user.x", &encode(&named())), None);
        assert_eq!(kept(ACCESS, b"junk"), None);
    }

    #[test]
    fn a_minimal_default_acl_gives_no_access_acl() {
        let default = encode(&minimal(7, 5, 0));
        let f = inherit(Some(&default), false, false, 0o2666, 0o022);
        assert_eq!(f, Inherited { mode: 0o2640, access: None, default: None });
    }

    fn who(uid: u32, gid: u32, groups: &[u32]) -> crate::Caller {
        crate::Caller { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn without_an_acl_one_class_decides() {
        let owner = who(10, 20, &[]);
        let member = who(11, 30, &[20]);
        let stranger = who(12, 30, &[31]);
        // 0o604: the owner reads and writes, the group nothing, others read.
        assert!(permits(0o604, 10, 20, None, &owner, MAY_READ | MAY_WRITE));
        assert!(!permits(0o604, 10, 20, None, &member, MAY_READ), "the group class, not other, applies");
        assert!(permits(0o604, 10, 20, None, &stranger, MAY_READ));
        assert!(!permits(0o604, 10, 20, None, &stranger, MAY_WRITE));
        // 0o070: the owner is refused even though the group may.
        assert!(!permits(0o070, 10, 20, None, &who(10, 20, &[]), MAY_READ));
        assert!(permits(0o070, 10, 20, None, &member, MAY_READ | MAY_WRITE | MAY_EXEC));
        assert!(permits(0o640, 10, 20, None, &who(13, 99, &[5, 20]), MAY_READ), "a supplementary group counts");
        assert!(permits(0o600, 10, 20, None, &owner, 0), "asking for nothing is always granted");
    }

    #[test]
    fn root_reads_and_writes_anything_and_executes_what_someone_may() {
        let root = crate::Caller::ROOT;
        assert!(permits(0, 10, 20, None, &root, MAY_READ | MAY_WRITE));
        assert!(!permits(0o666, 10, 20, None, &root, MAY_EXEC));
        assert!(permits(0o001, 10, 20, None, &root, MAY_EXEC));
        assert!(permits(S_IFDIR, 10, 20, None, &root, MAY_READ | MAY_WRITE | MAY_EXEC), "search any directory");
        let nothing = [e(USER_OBJ, 0, 0), e(GROUP_OBJ, 0, 0), e(OTHER, 0, 0)];
        assert!(permits(0, 10, 20, Some(&nothing), &root, MAY_READ | MAY_WRITE));
    }

    #[test]
    fn named_users_and_groups_are_limited_by_the_mask() {
        // owner rw, user 1000 rw, group r, group 50 rwx, mask r, other none.
        let acl =
            [e(USER_OBJ, 6, 0), e(USER, 6, 1000), e(GROUP_OBJ, 4, 0), e(GROUP, 7, 50), e(MASK, 4, 0), e(OTHER, 0, 0)];
        let acl = Some(&acl[..]);
        assert!(permits(0o640, 10, 20, acl, &who(10, 1, &[]), MAY_WRITE), "the owner is not masked");
        assert!(permits(0o640, 10, 20, acl, &who(1000, 1, &[]), MAY_READ));
        assert!(!permits(0o640, 10, 20, acl, &who(1000, 1, &[]), MAY_WRITE), "masked");
        assert!(!permits(0o640, 10, 20, acl, &who(1000, 50, &[]), MAY_READ | MAY_WRITE), "the user entry decides");
        assert!(permits(0o640, 10, 20, acl, &who(7, 2, &[50]), MAY_READ));
        assert!(!permits(0o640, 10, 20, acl, &who(7, 2, &[50]), MAY_WRITE), "group 50's w is masked");
        assert!(permits(0o640, 10, 20, acl, &who(7, 20, &[]), MAY_READ));
        assert!(!permits(0o640, 10, 20, acl, &who(7, 3, &[]), MAY_READ), "others get nothing");
        // A matching group that grants nothing shuts other out.
        let acl2 = [e(USER_OBJ, 6, 0), e(GROUP_OBJ, 0, 0), e(GROUP, 2, 60), e(MASK, 7, 0), e(OTHER, 4, 0)];
        assert!(!permits(0o674, 10, 20, Some(&acl2), &who(7, 20, &[]), MAY_READ));
        assert!(!permits(0o674, 10, 20, Some(&acl2), &who(7, 60, &[]), MAY_READ));
        assert!(permits(0o674, 10, 20, Some(&acl2), &who(7, 60, &[]), MAY_WRITE));
        assert!(permits(0o674, 10, 20, Some(&acl2), &who(7, 61, &[]), MAY_READ));
        // Any one of the caller's groups granting all of want will do.
        let acl3 =
            [e(USER_OBJ, 6, 0), e(GROUP_OBJ, 4, 0), e(GROUP, 2, 60), e(GROUP, 6, 61), e(MASK, 7, 0), e(OTHER, 0, 0)];
        assert!(permits(0o674, 10, 20, Some(&acl3), &who(7, 20, &[60, 61]), MAY_READ | MAY_WRITE));
        assert!(!permits(0o674, 10, 20, Some(&acl3), &who(7, 20, &[60]), MAY_READ | MAY_WRITE), "not by adding up");
        // With the mask empty (the mode's group bits clear) Linux does not look at the
        // ACL: a matching group entry no longer shuts other out.
        let acl4 = [e(USER_OBJ, 6, 0), e(GROUP_OBJ, 7, 0), e(GROUP, 0, 60), e(MASK, 0, 0), e(OTHER, 6, 0)];
        assert!(permits(0o606, 10, 20, Some(&acl4), &who(7, 60, &[]), MAY_READ | MAY_WRITE));
        assert!(!permits(0o606, 10, 20, Some(&acl4), &who(7, 20, &[]), MAY_READ), "the owning group: its bits");
        assert!(!permits(0o777, 10, 20, Some(&[]), &who(10, 20, &[]), MAY_READ), "a broken ACL grants nothing");
    }

    /// xorshift64*.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The check as acl(5) words it ("ACCESS CHECK ALGORITHM"), the classic mode check
    /// as chmod(1) words it: a reference written apart from `permits`. Linux looks at
    /// the ACL only when the group class bits of the mode are not all clear.
    fn reference(mode: u32, owner: u32, group: u32, acl: Option<&[Entry]>, c: &crate::Caller, want: u32) -> bool {
        if c.uid == 0 {
            return want & 1 == 0 || mode & S_IFDIR != 0 || mode & 0o111 != 0;
        }
        let has = |perm: u32| perm & want == want;
        let Some(acl) = acl.filter(|_| (mode >> 3) & 7 != 0) else {
            let (u, g, o) = ((mode >> 6) & 7, (mode >> 3) & 7, mode & 7);
            return if c.uid == owner {
                has(u)
            } else if c.gid == group || c.groups.contains(&group) {
                has(g)
            } else {
                has(o)
            };
        };
        let tagged = |tag: u16| acl.iter().filter(move |x| x.tag == tag);
        let mask = tagged(MASK).next().map(|m| u32::from(m.perm));
        let with_mask = |perm: u32| has(perm) && mask.is_none_or(has);
        if c.uid == owner {
            return tagged(USER_OBJ).any(|x| has(x.perm.into()));
        }
        if let Some(u) = tagged(USER).find(|x| x.id == c.uid) {
            return with_mask(u.perm.into());
        }
        let mine = |g: u32| c.gid == g || c.groups.contains(&g);
        let groups: Vec<u32> = tagged(GROUP_OBJ)
            .filter(|_| mine(group))
            .chain(tagged(GROUP).filter(|x| mine(x.id)))
            .map(|x| u32::from(x.perm))
            .collect();
        if !groups.is_empty() {
            // The first that grants decides (entries are in order); none: refused.
            return groups.iter().find(|&&p| has(p)).is_some_and(|&p| with_mask(p));
        }
        tagged(OTHER).any(|x| has(x.perm.into()))
    }

    #[test]
    fn permits_agrees_with_the_written_algorithm() {
        let seed = std::env::var("CREST_PROTO_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        });
        eprintln!("CREST_PROTO_SEED={seed}");
        let mut st = seed | 1;
        let ids = [0u32, 1, 2, 3, 1000];
        for _ in 0..20_000 {
            let mut r = || next(&mut st);
            let pick = |x: u64| ids[(x % ids.len() as u64) as usize];
            let mode = (r() as u32 & 0o7777) | if r() % 4 == 0 { S_IFDIR } else { 0 };
            let (owner, group) = (pick(r()), pick(r()));
            let groups: Vec<u32> = (0..r() % 3).map(|_| pick(r())).collect();
            let caller = crate::Caller { uid: pick(r()), gid: pick(r()), groups };
            let want = r() as u32 & 7;
            let acl = (r() % 3 != 0).then(|| {
                let mut v = vec![e(USER_OBJ, (mode >> 6) as u16 & 7, 0)];
                let mut named = false;
                for (tag, id) in [(USER, 1), (USER, 2), (USER, 1000), (GROUP, 1), (GROUP, 3), (GROUP, 1000)] {
                    if r() % 3 == 0 {
                        v.push(e(tag, r() as u16 & 7, id));
                        named = true;
                    }
                }
                // The mode's group bits are the mask, or (no mask) the owning group's.
                let masked = named || r() % 2 == 0;
                v.push(e(GROUP_OBJ, if masked { r() as u16 & 7 } else { (mode >> 3) as u16 & 7 }, 0));
                if masked {
                    v.push(e(MASK, (mode >> 3) as u16 & 7, 0));
                }
                v.push(e(OTHER, mode as u16 & 7, 0));
                v.sort_by_key(|x| (x.tag, x.id));
                parse(&encode(&v)).expect("a valid ACL")
            });
            let got = permits(mode, owner, group, acl.as_deref(), &caller, want);
            let want_ref = reference(mode, owner, group, acl.as_deref(), &caller, want);
            assert_eq!(got, want_ref, "seed {seed}: mode {mode:o} {owner}:{group} {acl:?} {caller:?} want {want}");
            // An ACL the mode alone can say grants what the mode does.
            let minimal = [
                e(USER_OBJ, (mode >> 6) as u16 & 7, 0),
                e(GROUP_OBJ, (mode >> 3) as u16 & 7, 0),
                e(OTHER, mode as u16 & 7, 0),
            ];
            assert_eq!(
                permits(mode, owner, group, Some(&minimal), &caller, want),
                permits(mode, owner, group, None, &caller, want),
                "seed {seed}: minimal ACL of mode {mode:o}"
            );
        }
    }
}
