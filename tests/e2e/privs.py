"""setuid and setgid after a write, differentially against the local kernel's ext4: every
road a change of a file's data can take through crest must drop the bits exactly as ext4
does (the kernel's `file_remove_privs` / `setattr_should_drop_suidgid`).

Each case makes a file with some mode and owner, then has one writer change it one way,
and compares the mode the reference (a directory under /tmp) ends with against what both
crest mounts show. The cases cross:
- who makes the file and where: the writing mount in a directory it made (it holds both
  exclusively and answers the write itself), the writing mount in a directory the other
  made, or the other mount (the write goes to the server);
- the writer: nobody owning the file, nobody not owning it (group other, or its own
  group), root (CAP_FSETID keeps the bits);
- the change: megabytes written in order (a dataset on objects takes them there), write, pwrite after a first write through the same descriptor, O_DIRECT
  write, O_APPEND write, fallocate (allocate, keep-size, punch, zero range), truncate,
  ftruncate, open with O_TRUNC, copy_file_range into it;
- the mode: setuid and setgid with and without group-exec, and other bits.

Sizes and offsets are random (seed printed; CREST_E2E_SEED replays; CREST_E2E_ROUNDS sets
how many random cases follow the systematic ones, default 40)."""

import ctypes
import itertools
import mmap
import os
import random
import shutil
import stat
import sys
import tempfile

from mounts import A, B, as_user, check, run

NOBODY = 65534
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
FALLOC_FL_ZERO_RANGE = 16
SEED = os.environ.get("CREST_E2E_SEED") or str(random.randrange(1 << 32))
ROUNDS = int(os.environ.get("CREST_E2E_ROUNDS", "40"))
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]

CHANGES = ["big", "write", "rewrite", "direct", "append", "falloc", "falloc-keep", "punch", "zero", "truncate", "ftruncate", "otrunc", "copy"]
MODES = [0o4777, 0o6777, 0o2777, 0o2767, 0o4755 | 0o022, 0o6707, 0o2757 | 0o020, 0o4766]


def falloc(fd, mode, off, n):
    if libc.fallocate(fd, mode, off, n) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def change(path, how, off, n):
    """One change of `path`'s data, as the caller."""
    data = bytes([0x61 + off % 26]) * n
    if how == "direct":
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 8192)  # page-aligned, as O_DIRECT wants
            buf.write(b"d" * 8192)
            os.pwrite(fd, buf, (off // 4096) * 4096)
        finally:
            os.close(fd)
        return
    if how == "big":
        # Megabytes in order from the start: where the data store takes a mount's writes
        # (a dataset on objects), its own road.
        with open(path, "r+b", buffering=0) as f:
            for i in range(1 + n % 4):
                f.write(bytes([0x30 + i]) * (1 << 20))
        return
    if how == "otrunc":
        os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
        return
    if how == "truncate":
        os.truncate(path, off + n)
        return
    flags = os.O_WRONLY | (os.O_APPEND if how == "append" else 0)
    fd = os.open(path, flags)
    try:
        if how in ("write", "append"):
            os.write(fd, data) if how == "append" else os.pwrite(fd, data, off)
        elif how == "rewrite":
            os.pwrite(fd, data, off)
            os.pwrite(fd, data, off + n)
        elif how == "ftruncate":
            os.ftruncate(fd, off)
        elif how == "falloc":
            falloc(fd, 0, off, n)
        elif how == "falloc-keep":
            falloc(fd, FALLOC_FL_KEEP_SIZE, off, n)
        elif how == "punch":
            falloc(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, n)
        elif how == "zero":
            falloc(fd, FALLOC_FL_ZERO_RANGE, off, n)
        elif how == "copy":
            src = os.open(os.path.join(os.path.dirname(path), "..", "src"), os.O_RDONLY)
            try:
                os.copy_file_range(src, fd, n, 0, off)
            finally:
                os.close(src)
        else:
            raise ValueError(how)
    finally:
        os.close(fd)


def prepare(path, mode, owner, group, size):
    """Makes the file as root, fills it, gives it owner, group and mode."""
    with open(path, "wb") as f:
        f.write(b"x" * size)
    if (owner, group) != (0, 0):
        os.chown(path, owner, group)
    os.chmod(path, mode)


def made_by_writer(path, mode, size, how, off, length):
    """As the writer (nobody): creates the file, fills it, sets the mode through the same
    descriptor, then changes it, the file's first change of data perhaps through that
    descriptor too."""

    def go():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            if size:
                os.write(fd, b"x" * size)
            os.fchmod(fd, mode)
            if how == "write":
                os.pwrite(fd, b"w" * length, off)
                return
        finally:
            os.close(fd)
        if how != "write":
            change(path, how, off, length)

    return go


libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
AT_FDCWD = -100
STATX_MODE = 0x2


def mode_of(path):
    """The mode as the kernel holds it: a statx that asks for the mode alone is answered
    from the kernel's cached inode, as exec and the next write's own check are (a full
    stat would refresh a cache the size and times left stale)."""
    buf = ctypes.create_string_buffer(256)
    if libc.statx(AT_FDCWD, os.fsencode(path), 0, STATX_MODE, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return stat.S_IMODE(int.from_bytes(buf.raw[0x1C:0x1E], "little"))  # struct statx's stx_mode


def one(case, ref, roots, n):
    """Runs one case; returns a failure's text or None."""
    maker, writer_mount, who, how, mode, size, off, length = case
    owner, group = {"owner": (NOBODY, NOBODY), "other": (0, 0), "member": (0, NOBODY), "root": (NOBODY, 0), "creator": (NOBODY, NOBODY)}[who]
    uid, gid = (0, 0) if who == "root" else (NOBODY, NOBODY)
    name = f"c{n}"
    ref_path = os.path.join(ref, name)
    if who == "creator":
        make_on = writer_mount if maker != "other" else 3 - writer_mount
        sub = f"shared{writer_mount}" if maker == "shared" else f"held{writer_mount}"
        path = os.path.join(roots[writer_mount], sub, name)
        want = as_user(NOBODY, NOBODY, made_by_writer(ref_path, mode, size, how, off, length))
        got = as_user(NOBODY, NOBODY, made_by_writer(path, mode, size, how, off, length))
        if want != got:
            return f"{case}: ext4 {want}, crest {got}"
        if want != "ok":
            return f"{case}: {want} on ext4 and crest (the case cannot run here)"
        want_mode = mode_of(ref_path)
        for m in (writer_mount, 3 - writer_mount):
            got_mode = mode_of(os.path.join(roots[m], sub, name))
            if got_mode != want_mode:
                return f"{case}: mode {oct(mode)} became {oct(want_mode)} on ext4, {oct(got_mode)} seen on mount {m}"
        return None
    prepare(ref_path, mode, owner, group, size)
    # maker: "held" (the writing mount, in a directory it made), "shared" (the writing mount,
    # in the other's directory), "other" (the other mount, in the writer's directory).
    make_on = writer_mount if maker != "other" else 3 - writer_mount
    sub = f"shared{writer_mount}" if maker == "shared" else f"held{writer_mount}"
    dirs = {1: os.path.join(roots[1], sub), 2: os.path.join(roots[2], sub)}
    prepare(os.path.join(dirs[make_on], name), mode, owner, group, size)
    want = as_user(uid, gid, lambda: change(ref_path, how, off, length))
    got = as_user(uid, gid, lambda: change(os.path.join(dirs[writer_mount], name), how, off, length))
    if want != got:
        return f"{case}: ext4 {want}, crest {got}"
    want_mode = mode_of(ref_path)
    for m in (writer_mount, 3 - writer_mount):
        got_mode = mode_of(os.path.join(dirs[m], name))
        if got_mode != want_mode:
            return f"{case}: mode {oct(mode)} became {oct(want_mode)} on ext4, {oct(got_mode)} seen on mount {m}"
    return None


def main():
    print(f"privs.py seed {SEED}")
    rng = random.Random(SEED)
    base = "privs"
    roots = {1: os.path.join(A, base), 2: os.path.join(B, base)}
    shutil.rmtree(roots[1], ignore_errors=True)
    os.mkdir(roots[1], 0o755)
    # held<m>: made by mount m (it holds it and answers creates and writes in it itself);
    # shared<m>: made by the other mount, written in by mount m.
    for m in (1, 2):
        for d in (os.path.join(roots[m], f"held{m}"), os.path.join(roots[3 - m], f"shared{m}")):
            os.mkdir(d)
            os.chmod(d, 0o777)
    top = tempfile.mkdtemp(prefix="crest-privs-")
    os.chmod(top, 0o755)
    ref = os.path.join(top, "ref")
    os.mkdir(ref)
    os.chmod(ref, 0o777)
    for src in (os.path.join(top, "src"), os.path.join(roots[1], "src")):
        with open(src, "wb") as f:
            f.write(bytes(range(256)) * 1024)
        os.chmod(src, 0o644)
    try:
        cases = []

        def random_case(maker, who, how, mode):
            size = rng.choice([0, 1, rng.randint(2, 5000), rng.randint(5000, 300000)])
            off = rng.choice([0, rng.randint(0, 9000), rng.randint(0, 200000)])
            length = rng.choice([1, rng.randint(2, 4096), rng.randint(4096, 140000)])
            return (maker, rng.choice([1, 2]), who, how, mode, size, off, length)

        for maker, who, how in itertools.product(["held", "shared", "other"], ["owner", "other", "member", "root", "creator"], CHANGES):
            cases.append(random_case(maker, who, how, rng.choice(MODES)))
        for _ in range(ROUNDS):
            cases.append(random_case(rng.choice(["held", "shared", "other"]), rng.choice(["owner", "other", "member", "root", "creator"]), rng.choice(CHANGES), rng.choice(MODES)))
        failures = []
        for n, case in enumerate(cases):
            f = one(case, ref, roots, n)
            if f:
                failures.append(f)
        for f in failures[:20]:
            print("  " + f)
        check(f"setuid/setgid after {len(cases)} changes as on ext4 (seed {SEED})", not failures, f"{len(failures)} differ")
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(roots[1], ignore_errors=True)


if __name__ == "__main__":
    run(main)
