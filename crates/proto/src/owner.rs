//! Who owns a new inode: the one rule every side applies (the server to what it creates,
//! a mount to what it creates under its own rights, the simulator's model).

/// The set-group-ID bit.
pub const S_ISGID: u32 = 0o2000;

/// Group and mode of a new inode created with `mode` by a caller of group `caller_gid` in a
/// directory of mode `dir_mode` and group `dir_gid` (Linux's `inode_init_owner`): a
/// set-group-ID directory passes on its group, and to a new directory its set-group-ID bit
/// too; elsewhere the new inode takes the caller's group.
pub fn new_inode_group(dir_mode: u32, dir_gid: u32, caller_gid: u32, is_dir: bool, mode: u32) -> (u32, u32) {
    if dir_mode & S_ISGID != 0 {
        (dir_gid, if is_dir { mode | S_ISGID } else { mode })
    } else {
        (caller_gid, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setgid_directory_passes_on_its_group_and_to_directories_its_bit() {
        assert_eq!(new_inode_group(0o2775, 50, 7, false, 0o644), (50, 0o644));
        assert_eq!(new_inode_group(0o2775, 50, 7, true, 0o755), (50, 0o2755));
        assert_eq!(new_inode_group(0o0775, 50, 7, true, 0o755), (7, 0o755));
        assert_eq!(new_inode_group(0o0775, 50, 7, false, 0o2755), (7, 0o2755));
    }
}
