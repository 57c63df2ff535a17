"""A nearly full file system: what a call reports is what the server has.

Usage: full.py MOUNT fill   -- fill the image to a little below full, then create files
                               and directories (seeded sizes) until one call fails with
                               ENOSPC; record every name whose calls all succeeded
       full.py MOUNT check  -- after a remount: every recorded name is there, whole

Files are created in a directory made by this mount (held whole, so creates are
normally answered by the mount itself and written back): near full, a create that the
server will refuse must fail at the call, not vanish after it succeeded.
CREST_FULL_SEED=S replays a seed.
"""
import errno
import json
import os
import random
import sys

mnt, mode = sys.argv[1], sys.argv[2]
record = os.path.join(mnt, "..", os.path.basename(mnt) + ".full.json")

if mode == "fill":
    seed = int(os.environ.get("CREST_FULL_SEED", random.randrange(1 << 32)))
    print(f"CREST_FULL_SEED={seed}")
    rng = random.Random(seed)
    d = os.path.join(mnt, "d")
    os.mkdir(d)
    st = os.statvfs(mnt)
    # Room for a few files, or for many (the space runs short while creates are written back).
    left = rng.randrange(64, rng.choice([1024, 24 * 1024])) * 1024
    fd = os.open(os.path.join(mnt, "spc"), os.O_CREAT | os.O_WRONLY, 0o600)
    os.posix_fallocate(fd, 0, max(4096, st.f_bavail * st.f_frsize - left))
    os.close(fd)
    made, failed = {}, None
    for i in range(200_000):
        name = f"f{i}"
        path = os.path.join(d, name)
        size = rng.choice([0, 1, 100, 1000, 1025, 4096, 5000, rng.randrange(1, 40_000)])
        data = bytes([i % 251]) * size
        try:
            if rng.randrange(8) == 0:
                os.mkdir(path)
                made[name] = -1
            else:
                with open(path, "wb") as f:
                    f.write(data)
                made[name] = size
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            failed = (name, str(e))
            # The failed call may have left the name (a create that stood, a write that
            # did not); it is not recorded either way.
            break
    if failed is None:
        print("FAIL: never ran out of space")
        sys.exit(1)
    print(f"{len(made)} names made, then {failed[0]}: {failed[1]}")
    os.sync()
    with open(record, "w") as f:
        json.dump(made, f)
elif mode == "check":
    with open(record) as f:
        made = json.load(f)
    d = os.path.join(mnt, "d")
    present = set(os.listdir(d))
    bad = []
    for name, size in made.items():
        path = os.path.join(d, name)
        if name not in present:
            bad.append(f"{name}: gone")
        elif size < 0:
            if not os.path.isdir(path):
                bad.append(f"{name}: not a directory")
        else:
            i = int(name[1:])
            with open(path, "rb") as f:
                got = f.read()
            if got != bytes([i % 251]) * size:
                bad.append(f"{name}: {len(got)} bytes, wanted {size}")
    if bad:
        print(f"FAIL: {len(bad)} of {len(made)} names whose calls succeeded are wrong: {bad[:10]}")
        sys.exit(1)
    print(f"all {len(made)} names whose calls succeeded are there, whole")
else:
    sys.exit(f"unknown mode {mode}")
