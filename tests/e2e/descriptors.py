"""Permissions are checked when a file is opened, as on a local file system: a descriptor
then reads or writes for whoever uses it (a process that dropped its privileges after
opening, as daemons do; the kernel's writeback), and execute permission alone runs a
program; a caller's supplementary groups count on the server as in the kernel. The server
checks each open again (it trusts no client's kernel) and must not refuse what the open
allowed. Sizes and offsets are random (seed printed: CREST_E2E_SEED).
`descriptors.py A B`."""

import os
import random
import shutil
import subprocess

from mounts import a, b, check, read, run, use, write

NOBODY = 65534


def as_nobody(fn, groups=()):
    """Runs fn in a child that became nobody, in supplementary `groups` (descriptors opened
    before are kept). Returns None, or the error it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        msg = b""
        try:
            os.setgroups(list(groups))
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            fn()
        except BaseException as e:  # reported to the parent
            msg = repr(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return out.decode() or None


def main():
    seed = int(os.environ.get("CREST_E2E_SEED") or random.randrange(1 << 32))
    print(f"descriptors: seed {seed} (CREST_E2E_SEED={seed} replays)")
    rng = random.Random(seed)
    use("descriptors")
    os.makedirs(a(), exist_ok=True)
    os.chmod(a(), 0o755)
    secret = a("secret")
    write(secret, os.urandom(rng.randint(0, 9000)))
    os.chmod(secret, 0o600)
    check("nobody may not open root's 0600 file", as_nobody(lambda: os.close(os.open(secret, os.O_RDWR))) is not None)

    # Root opens it for writing, then becomes nobody and writes, extends, truncates.
    expect = bytearray(read(secret))
    fd = os.open(secret, os.O_WRONLY)
    writes = []
    for _ in range(rng.randint(1, 6)):
        off, n = rng.randint(0, 70000), rng.randint(1, 20000)
        writes.append((off, os.urandom(n)))
    size = rng.randint(1, 100000)

    def write_as_nobody():
        for off, data in writes:
            os.pwrite(fd, data, off)
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)

    err = as_nobody(write_as_nobody)
    check("nobody writes and allocates through root's descriptor", err is None, err)
    for off, data in writes:
        if len(expect) < off:
            expect.extend(bytes(off - len(expect)))
        expect[off : off + len(data)] = data
    if len(expect) < size:
        expect.extend(bytes(size - len(expect)))
    cut = rng.randint(0, len(expect))
    err = as_nobody(lambda: os.ftruncate(fd, cut))
    check("nobody truncates through root's descriptor", err is None, err)
    del expect[cut:]
    os.close(fd)
    seen = read(b("secret"))
    check("the other mount reads what nobody wrote", seen == bytes(expect), f"{len(seen)} bytes (want {len(expect)}), content differs")

    # Open for reading: nobody reads through it, and cannot write through it.
    fd = os.open(secret, os.O_RDONLY)

    def read_as_nobody():
        got = os.pread(fd, len(expect) + 1, 0)
        if got != bytes(expect):
            raise AssertionError(f"read {len(got)} bytes, not the {len(expect)} written")

    err = as_nobody(read_as_nobody)
    check("nobody reads through root's descriptor", err is None, err)
    err = as_nobody(lambda: os.pwrite(fd, b"x", 0))
    check("but not writes through one open for reading", err is not None and "(9," in err, err)
    os.close(fd)

    # Execute permission alone runs a program (the kernel opens it to execute).
    tool = a("tool")
    shutil.copyfile(shutil.which("true"), tool)
    os.chmod(tool, 0o711)
    res = as_nobody(lambda: subprocess.run([tool], check=True))
    check("nobody runs a program it may execute but not read", res is None, res)
    check("nobody cannot read it", as_nobody(lambda: read(tool)) is not None)

    # A supplementary group reaches the server (the client reads it from /proc).
    shared = a("shared")
    data = os.urandom(rng.randint(1, 5000))
    write(shared, data)
    os.chown(shared, 0, 4321)
    os.chmod(shared, 0o660)

    def rewrite_as_member():
        os.close(os.open(shared, os.O_WRONLY | os.O_TRUNC))
        write(shared, data[::-1])

    err = as_nobody(rewrite_as_member, groups=[4321])
    check("a supplementary group lets nobody rewrite a group-writable file", err is None, err)
    check("the other mount reads it", read(b("shared")) == data[::-1])
    check("without the group: refused", as_nobody(lambda: read(shared)) is not None)
    shutil.rmtree(a())


run(main)
