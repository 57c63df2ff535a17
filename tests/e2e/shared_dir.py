"""Several mounts change one directory at once (issue 18: a shared directory degrades
gracefully). One process per mount creates, writes, renames and unlinks names of its own
in one directory, in a seeded random order with random pauses (0-3 ms, sometimes a
burst of none), and now and then lists the directory from its mount: its own names must
be exactly the ones it has (another mount's changes never hide or resurrect one), and
any file of another mount's it reads (under a read lock) is gone or one whole version of
it (new versions are renamed over the old, or written in place under a write lock). At the end every mount lists the directory: all see the same
names, the union of what each process kept, and every file holds what its last writer
wrote.

    shared_dir.py SEED OPS DIR_ON_MOUNT1 DIR_ON_MOUNT2 ...   (the same directory on each)
"""

import fcntl
import os
import random
import sys
import time
from multiprocessing import Process, Queue


def content(label):
    """A file's data names itself: a header line, then filler made from it, of a length
    (empty to a few pages) that also comes from it; `whole` checks any read of it."""
    n = (sum(label.encode()) * 37) % 9000
    head = f"{label}:{n}\n".encode()
    return head + (label.encode() * (n // len(label) + 1))[:n]


def whole(data):
    """True when `data` is all of one version of some file (no mix of two, nothing cut)."""
    head, _, _ = data.partition(b"\n")
    label = head.rsplit(b":", 1)[0].decode(errors="replace")
    return bool(label) and data == content(label)


def peek(rng, i, d, fails, step):
    """Reads a file another mount is changing: gone (renamed, unlinked) or whole."""
    others = [n for n in os.listdir(d) if n.startswith("m") and not n.startswith(f"m{i}-")]
    if not others:
        return
    name = rng.choice(others)
    try:
        with open(os.path.join(d, name), "rb") as f:
            fcntl.lockf(f, fcntl.LOCK_SH)
            data = f.read()
    except FileNotFoundError:
        return
    # (Empty: created a moment ago, its data not yet written.)
    if data and not whole(data):
        fails.append(f"mount {i} step {step}: {name} reads {len(data)} bytes, not one whole version: {data[:40]!r}")


def worker(seed, ops, i, d, out):
    rng = random.Random(seed * 1000 + i)
    mine = {}  # name -> content
    fails = []
    serial = 0
    for step in range(ops):
        roll = rng.random()
        if roll < 0.08:
            peek(rng, i, d, fails, step)
        elif roll < 0.5 or len(mine) < 5:
            serial += 1
            name = f"m{i}-{serial}"
            data = content(name)
            with open(os.path.join(d, name), "xb") as f:
                f.write(data)
            mine[name] = data
        elif roll < 0.7:
            old = rng.choice(sorted(mine))
            serial += 1
            new = f"m{i}-r{serial}"
            os.rename(os.path.join(d, old), os.path.join(d, new))
            mine[new] = mine.pop(old)
        elif roll < 0.85:
            name = rng.choice(sorted(mine))
            os.unlink(os.path.join(d, name))
            del mine[name]
        elif roll < 0.95:
            name = rng.choice(sorted(mine))
            # A new version goes in whole: written under a name of its own and renamed
            # over, or rewritten in place under a write lock (readers take a read lock).
            data = content(f"{name}.v{step}")
            if rng.random() < 0.5:
                tmp = os.path.join(d, f"t{i}-{step}")
                with open(tmp, "xb") as f:
                    f.write(data)
                os.rename(tmp, os.path.join(d, name))
            else:
                with open(os.path.join(d, name), "r+b") as f:
                    fcntl.lockf(f, fcntl.LOCK_EX)
                    f.truncate(0)
                    f.write(data)
                    f.flush()
                    fcntl.lockf(f, fcntl.LOCK_UN)
            mine[name] = data
        else:
            seen = {n for n in os.listdir(d) if n.startswith(f"m{i}-")}
            if seen != set(mine):
                fails.append(
                    f"mount {i} step {step}: its own names differ: missing {sorted(set(mine) - seen)[:5]}, "
                    f"extra {sorted(seen - set(mine))[:5]}"
                )
        if rng.random() < 0.7:
            # (Short sleeps spread the changes across milliseconds; the rest come in bursts.)
            time.sleep(rng.random() * 0.003)
    out.put((i, mine, fails))


def main():
    seed, ops, dirs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    print(f"shared_dir: seed {seed}, {ops} operations per mount, {len(dirs)} mounts")
    out = Queue()
    procs = [Process(target=worker, args=(seed, ops, i, d, out)) for i, d in enumerate(dirs)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    fails = []
    if any(p.exitcode != 0 for p in procs):
        fails.append(f"a worker died: exit codes {[p.exitcode for p in procs]}")
    want = {}
    for i, mine, f in results:
        fails.extend(f)
        want.update(mine)
    for i, d in enumerate(dirs):
        seen = set(os.listdir(d))
        if seen != set(want):
            fails.append(
                f"mount {i} lists {len(seen)} names, want {len(want)}: missing {sorted(set(want) - seen)[:5]}, "
                f"extra {sorted(seen - set(want))[:5]}"
            )
        # Every file's data, read from a mount that did not write most of them.
        for name, data in sorted(want.items())[i :: len(dirs)]:
            try:
                with open(os.path.join(d, name), "rb") as f:
                    got = f.read()
            except OSError as e:
                fails.append(f"mount {i} cannot read {name}: {e}")
                continue
            if got != data:
                fails.append(f"mount {i} reads {name}: {len(got)} bytes, want {len(data)}")
    for f in fails[:20]:
        print("FAIL", f)
    print(f"shared_dir: {len(want)} names kept; {len(fails)} failures (seed {seed})")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
