#!/usr/bin/env python3
"""Writeback of namespace operations (issue 4): rename, link, setxattr/removexattr and
create+unlink pairs answered by the mount that holds everything involved exclusively.

usage: writeback_ops.py MOUNT_A MOUNT_B

Each scenario works in a fresh directory A makes (A holds it and what it creates in it
exclusively, so A answers these calls itself and ships them later). A's answers are
checked; then B's *very next* system call must see exactly the result: names, link
counts, sizes, modes, xattrs, and the times A reported (A's writeback carries A's clock,
so the server stores exactly what A answered). B's look takes A's rights away, so each
scenario starts afresh. Prints one line per check; exits 1 if any failed.
"""

import ctypes
import errno
import os

from mounts import A, B, a, b, check, exists, fails, read, run, use, write  # noqa: F401

use("wbops")
libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE = 1
AT_FDCWD = -100


def errno_of(f, *args):
    try:
        f(*args)
        return 0
    except OSError as e:
        return e.errno


def renameat2(old, new, flags):
    r = libc.renameat2(AT_FDCWD, old.encode(), AT_FDCWD, new.encode(), flags)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old)


def shape(st):
    """What must agree between A's answer and the server's (B's)."""
    return (st.st_ino, st.st_mode, st.st_nlink, st.st_size, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns)


def same(name, a_paths, b_paths):
    """A's stats (taken first, answered from A's writeback state) equal B's (the server's)."""
    mine = [shape(os.lstat(p)) for p in a_paths]
    theirs = [shape(os.lstat(p)) for p in b_paths]
    check(name, mine == theirs, f"A {mine} vs B {theirs}")


counter = [0]


def fresh():
    counter[0] += 1
    d = f"s{counter[0]:02d}"
    os.mkdir(a(d))
    return d


def renames():
    # same directory
    d = fresh()
    write(a(d, "f"), b"data-f")
    os.rename(a(d, "f"), a(d, "g"))
    check("rename: A no longer sees the old name", not exists(a(d, "f")))
    check("rename: A reads the new name", read(a(d, "g")) == b"data-f")
    st_a = [shape(os.lstat(a(d))), shape(os.lstat(a(d, "g")))]
    check("rename: B lists exactly the new name", os.listdir(b(d)) == ["g"], str(os.listdir(b(d))))
    check("rename: B's stats equal A's", st_a == [shape(os.lstat(b(d))), shape(os.lstat(b(d, "g")))],
          f"{st_a} vs {[shape(os.lstat(b(d))), shape(os.lstat(b(d, 'g')))]}")

    # across directories
    d = fresh()
    os.mkdir(a(d, "x"))
    os.mkdir(a(d, "y"))
    write(a(d, "x", "f"), b"moving")
    os.rename(a(d, "x", "f"), a(d, "y", "f2"))
    check("rename across: A sees it moved", not exists(a(d, "x", "f")) and read(a(d, "y", "f2")) == b"moving")
    paths = [(d,), (d, "x"), (d, "y"), (d, "y", "f2")]
    st_a = [shape(os.lstat(a(*p))) for p in paths]
    check("rename across: B's very next listing", os.listdir(b(d, "x")) == [] and os.listdir(b(d, "y")) == ["f2"])
    st_b = [shape(os.lstat(b(*p))) for p in paths]
    check("rename across: B's stats equal A's", st_a == st_b, f"{st_a} vs {st_b}")

    # over an existing file that has another link (the victim keeps one)
    d = fresh()
    write(a(d, "f"), b"winner")
    write(a(d, "g"), b"loser!!")
    os.link(a(d, "g"), a(d, "g2"))
    os.rename(a(d, "f"), a(d, "g"))
    check("rename over: A reads the moved file", read(a(d, "g")) == b"winner")
    check("rename over: the replaced file keeps its other link",
          os.lstat(a(d, "g2")).st_nlink == 1 and read(a(d, "g2")) == b"loser!!")
    paths = [(d,), (d, "g"), (d, "g2")]
    st_a = [shape(os.lstat(a(*p))) for p in paths]
    check("rename over: B lists g and g2", sorted(os.listdir(b(d))) == ["g", "g2"], str(os.listdir(b(d))))
    st_b = [shape(os.lstat(b(*p))) for p in paths]
    check("rename over: B's stats equal A's", st_a == st_b, f"{st_a} vs {st_b}")
    check("rename over: B reads both", read(b(d, "g")) == b"winner" and read(b(d, "g2")) == b"loser!!")

    # over an existing file with no other link (it goes)
    d = fresh()
    write(a(d, "f"), b"1")
    write(a(d, "g"), b"22")
    os.rename(a(d, "f"), a(d, "g"))
    st_a = shape(os.lstat(a(d, "g")))
    check("rename over last link: B sees one file", os.listdir(b(d)) == ["g"])
    check("rename over last link: B's stat equals A's", shape(os.lstat(b(d, "g"))) == st_a)

    # a directory across parents: nlinks and ".."
    d = fresh()
    os.mkdir(a(d, "p1"))
    os.mkdir(a(d, "p2"))
    os.mkdir(a(d, "p1", "sub"))
    write(a(d, "p1", "sub", "inside"), b"in")
    os.rename(a(d, "p1", "sub"), a(d, "p2", "sub"))
    check("rename dir: A's '..' is the new parent",
          os.stat(a(d, "p2", "sub") + "/..").st_ino == os.stat(a(d, "p2")).st_ino)
    check("rename dir: A's link counts", (os.lstat(a(d, "p1")).st_nlink, os.lstat(a(d, "p2")).st_nlink) == (2, 3))
    paths = [(d,), (d, "p1"), (d, "p2"), (d, "p2", "sub"), (d, "p2", "sub", "inside")]
    st_a = [shape(os.lstat(a(*p))) for p in paths]
    check("rename dir: B's '..' is the new parent",
          os.stat(b(d, "p2", "sub") + "/..").st_ino == os.stat(b(d, "p2")).st_ino)
    st_b = [shape(os.lstat(b(*p))) for p in paths]
    check("rename dir: B's stats equal A's", st_a == st_b, f"{st_a} vs {st_b}")
    check("rename dir: B reads inside", read(b(d, "p2", "sub", "inside")) == b"in")

    # a directory over an empty one, and onto a non-empty one (refused, by the server)
    d = fresh()
    os.mkdir(a(d, "e1"))
    os.mkdir(a(d, "e2"))
    os.mkdir(a(d, "full"))
    write(a(d, "full", "x"), b"x")
    check("rename dir over non-empty: ENOTEMPTY", errno_of(os.rename, a(d, "e1"), a(d, "full")) in (errno.ENOTEMPTY, errno.EEXIST))
    os.rename(a(d, "e1"), a(d, "e2"))
    st_a = [shape(os.lstat(a(d))), shape(os.lstat(a(d, "e2")))]
    check("rename dir over empty: B lists e2 and full", sorted(os.listdir(b(d))) == ["e2", "full"])
    check("rename dir over empty: B's stats equal A's", st_a == [shape(os.lstat(b(d))), shape(os.lstat(b(d, "e2")))])

    # RENAME_NOREPLACE
    d = fresh()
    write(a(d, "f"), b"f")
    write(a(d, "taken"), b"t")
    renameat2(a(d, "f"), a(d, "free"), RENAME_NOREPLACE)
    check("noreplace: onto a taken name fails with EEXIST",
          errno_of(renameat2, a(d, "free"), a(d, "taken"), RENAME_NOREPLACE) == errno.EEXIST)
    check("noreplace: B sees free and taken", sorted(os.listdir(b(d))) == ["free", "taken"])
    check("noreplace: B reads both", read(b(d, "free")) == b"f" and read(b(d, "taken")) == b"t")

    # many renames in a row, then B lists once
    d = fresh()
    for i in range(100):
        write(a(d, f"n{i}"), str(i).encode())
    for i in range(100):
        os.rename(a(d, f"n{i}"), a(d, f"m{i}"))
    for i in range(0, 100, 2):
        os.rename(a(d, f"m{i}"), a(d, f"m{i + 1}"))
    listing = sorted(os.listdir(b(d)))
    want = sorted(f"m{i}" for i in range(1, 100, 2))
    check("rename chain: B lists the result", listing == want, f"{len(listing)} names")
    bad = [i for i in range(1, 100, 2) if read(b(d, f"m{i}")) != str(i - 1).encode()]
    check("rename chain: B reads each survivor's content", not bad, str(bad[:5]))


def links():
    d = fresh()
    write(a(d, "f"), b"linked")
    os.mkdir(a(d, "other"))
    os.link(a(d, "f"), a(d, "h"))
    os.link(a(d, "f"), a(d, "other", "h2"))
    check("link: A counts 3 links", os.lstat(a(d, "f")).st_nlink == 3)
    check("link onto an existing name: EEXIST", errno_of(os.link, a(d, "f"), a(d, "h")) == errno.EEXIST)
    paths = [(d,), (d, "other"), (d, "f"), (d, "h"), (d, "other", "h2")]
    st_a = [shape(os.lstat(a(*p))) for p in paths]
    check("link: B lists the names", sorted(os.listdir(b(d))) == ["f", "h", "other"])
    st_b = [shape(os.lstat(b(*p))) for p in paths]
    check("link: B's stats equal A's", st_a == st_b, f"{st_a} vs {st_b}")
    check("link: B reads through the link", read(b(d, "other", "h2")) == b"linked")

    # link then unlink of the original
    d = fresh()
    write(a(d, "f"), b"x")
    os.link(a(d, "f"), a(d, "h"))
    os.unlink(a(d, "f"))
    st_a = shape(os.lstat(a(d, "h")))
    check("link+unlink: B sees one name", os.listdir(b(d)) == ["h"])
    check("link+unlink: B's stat equals A's", shape(os.lstat(b(d, "h"))) == st_a)


def xattrs():
    d = fresh()
    f = a(d, "f")
    write(f, b"x")
    check("xattr: none at first", os.listxattr(f) == [] and errno_of(os.getxattr, f, "user.a") == errno.ENODATA)
    os.setxattr(f, "user.a", b"v1", os.XATTR_CREATE)
    check("xattr: XATTR_CREATE of an existing one: EEXIST",
          errno_of(os.setxattr, f, "user.a", b"v9", os.XATTR_CREATE) == errno.EEXIST)
    check("xattr: XATTR_REPLACE of a missing one: ENODATA",
          errno_of(os.setxattr, f, "user.b", b"v9", os.XATTR_REPLACE) == errno.ENODATA)
    os.setxattr(f, "user.b", b"bee")
    os.setxattr(f, "user.a", b"v2", os.XATTR_REPLACE)
    os.setxattr(f, "user.c", b"")
    os.setxattr(f, "user.gone", b"soon")
    os.removexattr(f, "user.gone")
    check("xattr: removing a missing one: ENODATA", errno_of(os.removexattr, f, "user.gone") == errno.ENODATA)
    check("xattr: A lists them", sorted(os.listxattr(f)) == ["user.a", "user.b", "user.c"], str(os.listxattr(f)))
    check("xattr: A reads them",
          (os.getxattr(f, "user.a"), os.getxattr(f, "user.b"), os.getxattr(f, "user.c")) == (b"v2", b"bee", b""))
    st_a = shape(os.lstat(f))
    check("xattr: B lists them", sorted(os.listxattr(b(d, "f"))) == ["user.a", "user.b", "user.c"])
    check("xattr: B reads them",
          [os.getxattr(b(d, "f"), n) for n in ("user.a", "user.b", "user.c")] == [b"v2", b"bee", b""])
    check("xattr: B's stat (ctime) equals A's", shape(os.lstat(b(d, "f"))) == st_a, f"{st_a} vs {shape(os.lstat(b(d, 'f')))}")
    check("xattr: B finds the removed one gone", errno_of(os.getxattr, b(d, "f"), "user.gone") == errno.ENODATA)

    # on a directory, values up to Linux's 64 KiB, and a name list past what the server
    # takes (the server decides: ENOSPC)
    d = fresh()
    os.setxattr(a(d), "user.dir", b"on a dir")
    big = bytes(i % 251 for i in range(65536))
    os.setxattr(a(d), "user.big", big)
    os.setxattr(a(d), "user.big2", big)
    r = errno_of(os.setxattr, a(d), "user.huge", b"h" * 65537)
    check("xattr: larger than Linux takes is refused at once: E2BIG", r == errno.E2BIG, str(r))
    filled = 0
    while filled < 1000 and errno_of(os.setxattr, a(d), "user.fill-" + "x" * 240 + str(filled), b"f") == 0:
        filled += 1
    r = errno_of(os.setxattr, a(d), "user.fill-" + "x" * 240 + str(filled), b"f")
    check("xattr: names past 64 KiB of list: ENOSPC", r == errno.ENOSPC and filled > 200, f"{r} after {filled}")
    check("xattr: A reads all after a synchronous one", os.getxattr(a(d), "user.big") == big and os.getxattr(a(d), "user.big2") == big)
    st_a = shape(os.lstat(a(d)))
    check("xattr on a dir: B reads them", os.getxattr(b(d), "user.dir") == b"on a dir" and os.getxattr(b(d), "user.big2") == big)
    check("xattr on a dir: B's stat equals A's", shape(os.lstat(b(d))) == st_a)


def pairs():
    d = fresh()
    for i in range(50):
        write(a(d, f"t{i}"), b"temporary" * i)
        os.chmod(a(d, f"t{i}"), 0o600)
        os.unlink(a(d, f"t{i}"))
        os.mkdir(a(d, f"m{i}"))
        os.rmdir(a(d, f"m{i}"))
    write(a(d, "kept"), b"kept")
    st_a = [shape(os.lstat(a(d))), shape(os.lstat(a(d, "kept")))]
    check("create+unlink, mkdir+rmdir: B lists only what was kept", os.listdir(b(d)) == ["kept"], str(os.listdir(b(d))))
    check("pairs: B's stats equal A's", st_a == [shape(os.lstat(b(d))), shape(os.lstat(b(d, "kept")))])


def main():
    os.makedirs(a(), exist_ok=True)
    renames()
    links()
    xattrs()
    pairs()
    # Everything A did is on the server, and B can take it all apart.
    for d in sorted(os.listdir(b())):
        for root, dirs, files in os.walk(b(d), topdown=False):
            for n in files:
                os.unlink(os.path.join(root, n))
            for n in dirs:
                os.rmdir(os.path.join(root, n))
        os.rmdir(b(d))
    os.rmdir(b())
    check("cleanup: A sees everything gone", not exists(a()))


run(main)
