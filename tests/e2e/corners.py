"""POSIX and coherence corners on two mounts of one server (argv 1 and 2), each raced
in seeded rounds: O_APPEND records of uneven sizes from both mounts, a file unlinked or
renamed over while the other mount holds it open, and readdir while the other mount
renames. The seed is printed (CREST_E2E_SEED replays it); CREST_E2E_ROUNDS sets the
rounds per check (default 6)."""

import errno
import mmap
import multiprocessing
import os
import random
import signal
import stat
import time

from mounts import a, b, check, exists, read, run, use, write

SEED = int(os.environ.get("CREST_E2E_SEED") or random.SystemRandom().randrange(1 << 32))
ROUNDS = int(os.environ.get("CREST_E2E_ROUNDS") or 6)
print(f"corners: seed {SEED} (CREST_E2E_SEED={SEED} replays), {ROUNDS} rounds")


def record_size(rng):
    """1 B to 64 KiB, most not a divisor of 4096, many straddling a page."""
    kind = rng.random()
    if kind < 0.3:
        return rng.randint(1, 64)
    if kind < 0.6:
        return rng.randint(65, 4500)
    return rng.randint(4500, 65536)


def fill(writer, i):
    """Writers fill their records with disjoint byte ranges; a writer's consecutive
    records differ."""
    return bytes([writer * 32 + 0x21 + i % 31])


def plan(seed, writer, n):
    rng = random.Random(seed * 31 + writer)
    return [(record_size(rng), fill(writer, i), rng.random() < 0.2) for i in range(n)]


def append_records(path, seed, writer, n, start):
    rng = random.Random(seed + 1000 + writer)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    start.wait()
    for size, byte, pause in plan(seed, writer, n):
        if os.write(fd, byte * size) != size:
            os._exit(3)
        if pause:
            time.sleep(rng.random() / 2000)
    os.close(fd)
    os._exit(0)


def parse_records(data, plans):
    """Walks the file: each record must be the next one of the writer its first byte
    names, whole. Returns a problem or None."""
    nxt = [0] * len(plans)
    p = 0
    while p < len(data):
        w = (data[p] - 0x21) // 32
        if not 0 <= w < len(plans) or nxt[w] >= len(plans[w]):
            return f"byte {data[p]:#x} at {p} starts no expected record"
        size, byte, _ = plans[w][nxt[w]]
        if data[p : p + size] != byte * size:
            bad = next((i for i in range(size) if p + i >= len(data) or data[p + i] != byte[0]), size)
            return f"writer {w} record {nxt[w]} ({size} B at {p}) torn at +{bad}"
        nxt[w] += 1
        p += size
    missing = [(w, len(pl) - nxt[w]) for w, pl in enumerate(plans) if nxt[w] != len(pl)]
    return f"records missing (writer, count): {missing}" if missing else None


def appends_from_both_mounts():
    """Item: O_APPEND records from two mounts (and a second writer on the first) land
    whole, once, never interleaved."""
    ctx = multiprocessing.get_context("fork")
    bad = []
    for r in range(ROUNDS):
        seed = SEED + r
        n = random.Random(seed).randint(60, 200)
        write(a(f"app{r}"), b"")
        paths = [a(f"app{r}"), b(f"app{r}"), a(f"app{r}")]
        start = ctx.Event()
        ps = [ctx.Process(target=append_records, args=(p, seed, w, n, start)) for w, p in enumerate(paths)]
        for p in ps:
            p.start()
        start.set()
        for p in ps:
            p.join()
        codes = [p.exitcode for p in ps]
        plans = [plan(seed, w, n) for w in range(len(paths))]
        for side in (a, b):
            problem = "writer exit codes " + str(codes) if any(codes) else parse_records(read(side(f"app{r}")), plans)
            if problem:
                bad.append(f"round {r} (seed {seed}) read on {side.__name__}: {problem}")
        os.unlink(a(f"app{r}"))
    check("O_APPEND from two mounts: every record whole, once, in place", not bad, "; ".join(bad[:3]))


def held_open_checks(fd, path_on_b, content, how):
    """What B's descriptor must still do after A removed the name. Returns problems."""
    out = []
    try:
        if os.pread(fd, len(content) + 10, 0) != content:
            out.append(f"{how}: read differs")
        st = os.fstat(fd)
        if st.st_nlink != 0:
            out.append(f"{how}: fstat nlink {st.st_nlink}")
        if st.st_size != len(content):
            out.append(f"{how}: fstat size {st.st_size} != {len(content)}")
        os.pwrite(fd, b"tail", len(content))
        if os.pread(fd, 4, len(content)) != b"tail":
            out.append(f"{how}: write not read back")
        os.fsync(fd)
        m = mmap.mmap(fd, len(content) + 4)
        if m[: len(content)] != content:
            out.append(f"{how}: mmap differs")
        m[0:1] = content[0:1]
        m.flush()
        m.close()
        if os.fstat(fd).st_size != len(content) + 4:
            out.append(f"{how}: size after write {os.fstat(fd).st_size}")
    except OSError as e:
        out.append(f"{how}: {e}")
    if exists(path_on_b) and how == "unlink":
        out.append(f"{how}: B still sees the name")
    return out


def removed_while_open_elsewhere():
    """Items: B holds a file open while A unlinks it or renames another over it; B's
    descriptor keeps working; the name's new file is the other one."""
    rng = random.Random(SEED + 77)
    bad = []
    for r in range(ROUNDS * 4):
        how = ("unlink", "rename-over")[r % 2]
        size = rng.choice([1, 100, 4095, 4097, 70_000, rng.randint(1, 300_000)])
        content = rng.randbytes(size)
        name = f"held{r}"
        write(a(name), content)
        os.stat(b(name))  # B knows the file (shared rights), as a reader would
        fd = os.open(b(name), os.O_RDWR)
        delay = rng.choice([0, 0, rng.random() / 1000, rng.random() / 20])
        if delay:
            time.sleep(delay)
        if how == "unlink":
            os.unlink(a(name))
        else:
            write(a(name + ".new"), b"replacement")
            os.rename(a(name + ".new"), a(name))
        problems = held_open_checks(fd, b(name), content, how)
        if how == "rename-over" and read(b(name)) != b"replacement":
            problems.append("rename-over: B does not read the replacement by name")
        try:
            os.close(fd)
        except OSError as e:
            problems.append(f"{how}: close: {e}")
        bad += [f"round {r} ({size} B, delay {delay * 1e3:.2f} ms) {p}" for p in problems]
        if exists(a(name)):
            os.unlink(a(name))
    check("a file removed by A stays usable through B's open descriptor", not bad, "; ".join(bad[:4]))


def renamed_over_on_one_mount():
    """fstests generic/035: rename over a file this mount holds open; fstat of it shows
    nlink 0 and its data stays readable (files and directories)."""
    bad = []
    for side in (a, b):
        write(side("r035a"), b"first")
        write(side("r035b"), b"second")
        fd = os.open(side("r035b"), os.O_RDONLY)
        os.rename(side("r035a"), side("r035b"))
        st = os.fstat(fd)
        if st.st_nlink != 0 or os.pread(fd, 10, 0) != b"second":
            bad.append(f"{side.__name__}: nlink {st.st_nlink}, data {os.pread(fd, 10, 0)!r}")
        os.close(fd)
        os.mkdir(side("r035d1"))
        os.mkdir(side("r035d2"))
        fd = os.open(side("r035d2"), os.O_RDONLY | os.O_DIRECTORY)
        os.rename(side("r035d1"), side("r035d2"))
        st = os.fstat(fd)
        if st.st_nlink != 0:
            bad.append(f"{side.__name__}: directory nlink {st.st_nlink}")
        os.close(fd)
        os.unlink(side("r035b"))
        os.rmdir(side("r035d2"))
    check("rename over an open file: fstat shows nlink 0, data readable", not bad, "; ".join(bad))


class Hung(Exception):
    pass


def listing(path, limit_s):
    def hung(*_):
        raise Hung()

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with os.scandir(path) as it:
            return [e.name for e in it]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def rename_churn(dirpath, seed, n, stop):
    rng = random.Random(seed)
    names = [f"m{i}" for i in range(n)]
    while not stop.is_set():
        i = rng.randrange(n)
        new = f"m{i}.{rng.randrange(1 << 20)}"
        try:
            os.rename(os.path.join(dirpath, names[i]), os.path.join(dirpath, new))
            names[i] = new
        except OSError as e:
            if e.errno != errno.ENOENT:
                os._exit(3)
    os._exit(0)


def readdir_while_renaming():
    """fstests generic/736 across mounts: every listing ends, names no entry twice, and
    names each entry that was present throughout exactly once."""
    ctx = multiprocessing.get_context("fork")
    bad = []
    for r in range(ROUNDS):
        seed = SEED + 500 + r
        rng = random.Random(seed)
        n_moving, n_stable = rng.randint(50, 400), rng.randint(20, 400)
        os.mkdir(a(f"rd{r}"))
        for i in range(n_stable):
            write(a(f"rd{r}", f"s{i}"), b"")
        for i in range(n_moving):
            write(a(f"rd{r}", f"m{i}"), b"")
        stable = {f"s{i}" for i in range(n_stable)}
        stop = ctx.Event()
        churn = ctx.Process(target=rename_churn, args=(a(f"rd{r}"), seed, n_moving, stop))
        churn.start()
        try:
            for lister in (b, a, b):
                names = listing(lister(f"rd{r}"), 20)
                dup = len(names) - len(set(names))
                missing = stable - set(names)
                if dup or missing:
                    bad.append(f"round {r} (seed {seed}, on {lister.__name__}): {dup} names twice, missing {sorted(missing)[:3]}")
        except Hung:
            bad.append(f"round {r} (seed {seed}): a listing did not end in 20 s")
        finally:
            stop.set()
            churn.join()
        if churn.exitcode:
            bad.append(f"round {r}: renamer failed")
        for name in os.listdir(a(f"rd{r}")):
            os.unlink(a(f"rd{r}", name))
        os.rmdir(a(f"rd{r}"))
    check("readdir while the other mount renames: ends, no name twice, none missed", not bad, "; ".join(bad[:3]))


def rename_each_as_read():
    """fstests generic/736 on each mount: rename every entry just read in the directory
    being read; the listing ends after each entry once."""
    bad = []
    for side in (a, b):
        n = random.Random(SEED + 900).randint(1000, 3000)
        d = side("r736")
        os.mkdir(d)
        for i in range(n):
            write(os.path.join(d, f"f{i}"), b"")
        seen = 0
        try:
            def hung(*_):
                raise Hung()

            signal.signal(signal.SIGALRM, hung)
            signal.setitimer(signal.ITIMER_REAL, 60)
            with os.scandir(d) as it:
                for e in it:
                    seen += 1
                    if seen > n:
                        break
                    os.rename(e.path, e.path + "_r")
        except Hung:
            bad.append(f"{side.__name__}: no end in 60 s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if seen != n:
            bad.append(f"{side.__name__}: {seen} entries read of {n}")
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
    check("rename each entry as it is read: the listing ends, each once", not bad, "; ".join(bad))


def mappings_across_mounts():
    """mmap across mounts: A's shared writable mapping is seen by B's read() and B's
    mapping once A's msync returns (and after munmap); B's write() is seen by A's mapping
    once it returns. Sizes and offsets vary (pages straddled, files not page multiples)."""
    rng = random.Random(SEED + 1300)
    bad = []
    for r in range(ROUNDS * 2):
        size = rng.choice([1, 4095, 4097, 12288, rng.randint(2, 200_000)])
        name = f"map{r}"
        base = rng.randbytes(size)
        write((a if r % 2 else b)(name), base)
        fa = os.open(a(name), os.O_RDWR)
        fb = os.open(b(name), os.O_RDWR)
        ma = mmap.mmap(fa, size)
        mb = mmap.mmap(fb, size, prot=mmap.PROT_READ)
        want = bytearray(base)
        if r % 2 == 0 and bytes(mb[:]) != bytes(want):
            bad.append(f"round {r}: B's mapping differs before any change")
        # Odd rounds start with the unsynced case, right after the opens (the server may
        # not know of A's open yet: its client sends it behind).
        shift = 2 if r % 2 else 0
        for step in range(9):
            off = rng.randrange(size)
            n = rng.randint(1, min(size - off, 9000))
            data = rng.randbytes(n)
            kind = (step + shift) % 3
            if kind == 0:
                ma[off : off + n] = data
                want[off : off + n] = data
                ma.flush()
                how = "A's mapping, msync"
            elif kind == 1:
                os.pwrite(fb, data, off)
                want[off : off + n] = data
                how = "B's write()"
            else:
                # A dirties its mapping and does not msync; B writes near it (the same
                # page, often): A's page must reach the server before B's write, not
                # over it.
                ma[off : off + n] = data
                want[off : off + n] = data
                off2 = max(0, min(size - 1, off + rng.randint(-200, n + 200)))
                n2 = rng.randint(1, min(size - off2, 300))
                data2 = rng.randbytes(n2)
                os.pwrite(fb, data2, off2)
                want[off2 : off2 + n2] = data2
                how = f"A's mapping unsynced, then B's write() of {n2} B at {off2}"
            got_b = os.pread(fb, size, 0)
            if got_b != bytes(want):
                bad.append(f"round {r} ({size} B) step {step} ({how}, {n} B at {off}): B's read differs")
            if bytes(mb[:]) != bytes(want):
                bad.append(f"round {r} ({size} B) step {step} ({how}, {n} B at {off}): B's mapping differs")
            if bytes(ma[:]) != bytes(want):
                bad.append(f"round {r} ({size} B) step {step} ({how}, {n} B at {off}): A's mapping differs")
        off = rng.randrange(size)
        ma[off : off + 1] = b"Z"
        want[off] = ord("Z")
        ma.close()  # munmap: the kernel writes the page back before the release
        os.close(fa)
        if os.pread(fb, size, 0) != bytes(want):
            bad.append(f"round {r}: B's read misses A's last mapped write after munmap and close")
        mb.close()
        os.close(fb)
        os.unlink(a(name))
    check("shared mappings across mounts: coherent at msync, munmap and every recall", not bad, "; ".join(bad[:4]))


def rename_whiteout():
    """renameat2(RENAME_WHITEOUT) (overlayfs's): the old name becomes a whiteout, a
    character device 0:0, seen so from both mounts; with RENAME_EXCHANGE it is EINVAL."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def renameat2(old, new, flags):
        if libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    bad = []
    write(a("wo-src"), b"moved")
    write(a("wo-dst"), b"replaced")
    renameat2(a("wo-src"), a("wo-dst"), 4)
    for side in (a, b):
        st = os.lstat(side("wo-src"))
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != 0:
            bad.append(f"{side.__name__}: old name is {stat.filemode(st.st_mode)} rdev {st.st_rdev}")
        if read(side("wo-dst")) != b"moved":
            bad.append(f"{side.__name__}: new name reads {read(side('wo-dst'))!r}")
    try:
        renameat2(a("wo-dst"), a("wo-src"), 4 | 2)
        bad.append("whiteout with exchange succeeded")
    except OSError as e:
        if e.errno != errno.EINVAL:
            bad.append(f"whiteout with exchange: errno {e.errno}")
    os.unlink(a("wo-src"))
    os.unlink(a("wo-dst"))
    check("rename with RENAME_WHITEOUT leaves a whiteout", not bad, "; ".join(bad))


def main():
    use("corners")
    os.makedirs(a(), exist_ok=True)
    only = os.environ.get("CREST_CORNERS_ONLY", "")
    for f in (appends_from_both_mounts, removed_while_open_elsewhere, renamed_over_on_one_mount, readdir_while_renaming, rename_each_as_read, mappings_across_mounts, rename_whiteout):
        if only in f.__name__:
            f()


run(main)
