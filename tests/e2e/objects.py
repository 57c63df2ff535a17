#!/usr/bin/env python3
"""File data in a data store's objects, across two mounts of one server (issue 19).

usage: objects.py MOUNT_A MOUNT_B      (CREST_OBJECTS_SEED: the seed, printed)

Files of random sizes are written on A in pieces of random sizes (objects for the big
aligned ones, the image for the rest), overwritten in place by small and big writes,
truncated and punched; after each change B's next read must give exactly the model
(so the partial blocks the server merged, the located reads B fetched and checked, and
the recalls all line up). Then B rereads a file A rewrites in big pieces, and a shared
mapping on B sees A's object writes. Prints one line per check; exits 1 if any failed.
"""

import ctypes
import mmap
import os
import random
import time

from mounts import a, b, check, run, use

use("objects")
seed = int(os.environ.get("CREST_OBJECTS_SEED", time.time_ns() % 1_000_000_007))
print(f"CREST_OBJECTS_SEED={seed}")
rng = random.Random(seed)
MIB = 1 << 20


def pattern(n, salt):
    base = bytes((i * 131 + salt) % 251 for i in range(65_536))
    return (base * (n // len(base) + 1))[:n]


def pwrite(path, offset, data, piece):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        done = 0
        while done < len(data):
            n = min(piece, len(data) - done)
            os.pwrite(fd, data[done : done + n], offset + done)
            done += n
    finally:
        os.close(fd)


def punch(path, off, n):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_WRONLY)
    try:
        # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
        if libc.fallocate(fd, 3, ctypes.c_long(off), ctypes.c_long(n)) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")
    finally:
        os.close(fd)


def read_b(name):
    with open(b(name), "rb") as f:
        return f.read()


def same(name, model, what):
    got = read_b(name)
    diff = next((i for i, (x, y) in enumerate(zip(got, model)) if x != y), None)
    check(f"{what}: B reads {len(model)} bytes as written", got == model,
          f"read {len(got)} bytes, first difference at {diff}")
    return got == model


def files_round_trip():
    for i in range(4):
        size = rng.choice([MIB, 3 * MIB + 4096, 5 * MIB + rng.randrange(1, 4096), rng.randrange(MIB, 9 * MIB)])
        piece = rng.choice([MIB, 2 * MIB, 4 * MIB, 128 * 1024])
        data = pattern(size, i)
        pwrite(a(f"f{i}"), 0, data, piece)
        same(f"f{i}", data, f"file {i} of {size} bytes in pieces of {piece}")


def changes_in_place():
    name = "edited"
    model = bytearray(pattern(6 * MIB + 1234, 7))
    pwrite(a(name), 0, bytes(model), MIB)
    for step in range(24):
        kind = rng.randrange(5)
        size = len(model)
        if kind == 0:  # small write anywhere: the server merges the object's edge blocks
            off, n = rng.randrange(size + 5000), rng.randrange(1, 9000)
            data = pattern(n, step)
            pwrite(a(name), off, data, n)
            what = f"small write {off}+{n}"
        elif kind == 1:  # a big aligned write: a new object over part of older ones
            off = rng.randrange(0, size // 4096 + 64) * 4096
            n = rng.choice([MIB, 2 * MIB])
            data = pattern(n, 100 + step)
            pwrite(a(name), off, data, n)
            what = f"object write {off}+{n}"
        elif kind == 2:  # truncate
            new = rng.randrange(size + MIB)
            os.truncate(a(name), new)
            model = model[:new] + bytearray(max(0, new - len(model)))
            same(name, bytes(model), f"step {step}: truncate to {new}")
            continue
        elif kind == 3:  # punch a hole
            off, n = rng.randrange(size + 1), rng.randrange(1, 3 * MIB)
            punch(a(name), off, n)
            end = min(off + n, len(model))
            if off < end:
                model[off:end] = bytes(end - off)
            same(name, bytes(model), f"step {step}: punch {off}+{n}")
            continue
        else:  # an unaligned big write: goes to the image, merging with objects around it
            off, n = rng.randrange(1, size + 1), rng.randrange(MIB, 2 * MIB)
            data = pattern(n, 200 + step)
            pwrite(a(name), off, data, n)
            what = f"unaligned big write {off}+{n}"
        end = off + len(data)
        if end > len(model):
            model.extend(bytes(end - len(model)))
        model[off:end] = data
        if not same(name, bytes(model), f"step {step}: {what}"):
            return


def rewrites_seen_at_once():
    name = "rewritten"
    size = rng.randrange(2, 6) * MIB
    pwrite(a(name), 0, pattern(size, 0), MIB)
    for r in range(8):
        data = pattern(size, r + 1)
        pwrite(a(name), 0, data, rng.choice([MIB, 4 * MIB]))
        if not same(name, data, f"rewrite {r} of {size} bytes"):
            return


def shared_mapping_sees_objects():
    name = "mapped"
    size = 3 * MIB
    pwrite(a(name), 0, pattern(size, 1), MIB)
    fd = os.open(b(name), os.O_RDONLY)
    try:
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        first = m[:]
        pwrite(a(name), MIB, pattern(MIB, 9), MIB)
        # (A mapping is revalidated when the file is read again: a read through the
        # mapping after B's next open sees A's write.)
        fd2 = os.open(b(name), os.O_RDONLY)
        os.close(fd2)
        now = m[:]
        m.close()
    finally:
        os.close(fd)
    want = pattern(size, 1)[:MIB] + pattern(MIB, 9) + pattern(size, 1)[2 * MIB :]
    check("B's mapping read what A wrote first", first == pattern(size, 1))
    check("B's mapping sees A's object write after an open", now == want)


def main():
    os.makedirs(a(), exist_ok=True)
    files_round_trip()
    changes_in_place()
    rewrites_seen_at_once()
    shared_mapping_sees_objects()


run(main)
