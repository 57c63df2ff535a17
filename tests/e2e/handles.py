"""File handles across mounts (fstests generic/426 467 477 756 777): a handle made on one
mount opens the same file on the other, also after the kernel dropped its inodes and
after the other mount's daemon was restarted (unmount, mount); a handle of a removed
file gives ESTALE. `handles.py A B make STATE` makes the files and handles and checks
them; `handles.py A B check STATE` checks the saved handles again (run after a remount)."""

import ctypes
import errno
import json
import os
import sys

from mounts import A, B, a, b, check, run, use

libc = ctypes.CDLL(None, use_errno=True)
MAX_HANDLE_SZ = 128


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ)]


def handle_of(path):
    fh = FileHandle()
    fh.handle_bytes = MAX_HANDLE_SZ
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(-100, path.encode(), ctypes.byref(fh), ctypes.byref(mount_id), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return {"type": fh.handle_type, "bytes": bytes(fh.f_handle[: fh.handle_bytes]).hex()}


def open_by(mount, h, flags=os.O_RDONLY):
    fh = FileHandle()
    raw = bytes.fromhex(h["bytes"])
    fh.handle_bytes = len(raw)
    fh.handle_type = h["type"]
    ctypes.memmove(fh.f_handle, raw, len(raw))
    mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), flags)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return fd
    finally:
        os.close(mfd)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def opens_as(mount, h, want):
    """None if the handle opens `want` (file bytes, or None for a directory), else why not."""
    try:
        fd = open_by(mount, h)
    except OSError as e:
        return f"errno {e.errno} ({e.strerror})"
    try:
        if want is None:
            return None if os.path.isdir(f"/proc/self/fd/{fd}") else "not a directory"
        got = os.pread(fd, len(want) + 1, 0)
        return None if got == want else f"reads {got[:20]!r}"
    finally:
        os.close(fd)


def stale(mount, h):
    try:
        os.close(open_by(mount, h))
        return False
    except OSError as e:
        return e.errno == errno.ESTALE


def main():
    use("handles")
    phase, state = sys.argv[3], sys.argv[4]
    if phase == "make":
        os.makedirs(a("d", "sub"), exist_ok=True)
        with open(a("d", "f"), "wb") as f:
            f.write(b"handle me")
        with open(a("gone"), "wb") as f:
            f.write(b"x")
        hs = {"f": handle_of(a("d", "f")), "d": handle_of(a("d", "sub")), "gone": handle_of(a("gone"))}
        for mount, name in ((A, "same mount"), (B, "other mount")):
            check(f"handle opens the file ({name})", opens_as(mount, hs["f"], b"handle me") is None, opens_as(mount, hs["f"], b"handle me"))
            drop_caches()
            check(f"handle opens the file, inodes dropped ({name})", opens_as(mount, hs["f"], b"handle me") is None, opens_as(mount, hs["f"], b"handle me"))
            check(f"handle opens the directory ({name})", opens_as(mount, hs["d"], None) is None, opens_as(mount, hs["d"], None))
        os.unlink(b("gone"))
        drop_caches()
        check("handle of a removed file: ESTALE (other mount)", stale(B, hs["gone"]))
        check("handle of a removed file: ESTALE (same mount)", stale(A, hs["gone"]))
        with open(state, "w") as f:
            json.dump(hs, f)
    else:
        with open(state) as f:
            hs = json.load(f)
        check("handle opens the file after a remount", opens_as(B, hs["f"], b"handle me") is None, opens_as(B, hs["f"], b"handle me"))
        check("handle opens the directory after a remount", opens_as(B, hs["d"], None) is None, opens_as(B, hs["d"], None))
        check("removed file's handle still ESTALE after a remount", stale(B, hs["gone"]))


run(main)
