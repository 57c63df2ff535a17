"""POSIX ACLs and modes, differentially against the local kernel's ext4. Each seeded
round applies one sequence of operations both to a reference directory under /tmp
(ext4 with ACLs) and to a directory on the first mount (argv 1), with the same outcome
(success or the same error) required of each; half the time it then compares the
operation's path right away on either mount. At the end of the round it compares every
path's st_mode (setuid, setgid and sticky included), owner, group, size, symlink target
and raw ACL xattrs (access, and default on directories) between the reference, the
first mount, the second mount (argv 2: it must see exactly what the first made) and the
first again.

The operations: setfacl -m/-x/-b/-k/--set, with -d and -n, of random named users and
groups (sometimes dozens) and permissions, on files, directories and fifos; raw ACL
xattrs set (some invalid) and removed; chmod with setuid, setgid and sticky; chown and
chgrp; files (open and mknod), directories, fifos and symlinks made under random umasks
and modes, in directories with and without default ACLs (minimal ones too), nested, and
in setgid directories; root's writes; and as nobody (uid and gid 65534, no other groups,
no capabilities): writes, truncates, O_TRUNC opens and fallocates of setgid (and
setuid) files of another group or its own, chmod and setfacl of its own setgid files,
files and directories made in a shared (often setgid) directory, and reads and stats
the kernel allows or refuses by the ACLs. Some operations run on the second mount
(directories it makes, default ACLs, modes and owners it changes under the first's
feet). Each round ends by making things in a directory the first mount made in the
round (it holds it exclusively and creates in it locally) and in one the second mount
made (the first creates in it through the server).

The seed is printed (CREST_E2E_SEED replays it); CREST_E2E_ROUNDS sets the rounds
(default 6); CREST_E2E_VERBOSE=1 prints every round's operations; CREST_ACL_KNOWN=1 also
runs the operations that meet the known differences listed below."""

import ctypes
import errno
import os
import random
import shutil
import stat
import subprocess
import tempfile

from mounts import A, B, as_user, check, run

SEED = int(os.environ.get("CREST_E2E_SEED") or random.SystemRandom().randrange(1 << 32))
ROUNDS = int(os.environ.get("CREST_E2E_ROUNDS") or 6)
# Known differences from ext4, left out unless CREST_ACL_KNOWN=1:
# 1. (fixed: removexattr of an ACL the inode does not have succeeds, as on ext4.)
# 2. After mount 1 chowns a file mount 2 has looked at, a bare chmod(2) on mount 2 is
#    judged by the kernel against the old owner (setattr_prepare does not refresh
#    attributes): the new owner gets EPERM, the old one succeeds. Left out by looking at
#    the file (lstat, as chmod(1) and setfacl do) before nobody's chmod.
KNOWN = bool(os.environ.get("CREST_ACL_KNOWN"))
print(f"acls: seed {SEED} (CREST_E2E_SEED={SEED} replays), {ROUNDS} rounds" + (", known differences too" if KNOWN else ""))

NOBODY = 65534
IDS = [0, NOBODY] + list(range(1000, 1011))
BIG_IDS = IDS + list(range(2000, 2100))  # for ACLs of dozens of entries
ACCESS, DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
FALLOC_FL_KEEP_SIZE = 1

# ---------------------------------------------------------------------------------------
# ACL values: text for the log and the diffs, raw bytes for crafted setxattr calls.

TAGS = {1: "u", 2: "u", 4: "g", 8: "g", 0x10: "m", 0x20: "o"}
TAG_OF = {"u": 1, "U": 2, "g": 4, "G": 8, "m": 0x10, "o": 0x20}


def acl_text(raw):
    """'u::rw-,u:1000:r--,g::r-x,m::rwx,o::---'; anything the kernel would not hand
    out (it canonicalises what it returns) is shown raw as well."""
    if len(raw) < 4 or (len(raw) - 4) % 8:
        return "bad:" + raw.hex()
    parts = []
    canon = bytearray(raw[:4])
    for i in range(4, len(raw), 8):
        tag = int.from_bytes(raw[i : i + 2], "little")
        perm = int.from_bytes(raw[i + 2 : i + 4], "little")
        ident = int.from_bytes(raw[i + 4 : i + 8], "little")
        named = tag in (2, 8)
        rwx = "".join(c if perm & b else "-" for c, b in zip("rwx", (4, 2, 1)))
        parts.append(f"{TAGS.get(tag, hex(tag))}:{ident if named else ''}:{rwx}")
        canon += raw[i : i + 4] + (ident if named else 0xFFFFFFFF).to_bytes(4, "little")
    text = ",".join(parts)
    return text if bytes(canon) == raw and raw[:4] == b"\x02\0\0\0" else f"{text} raw={raw.hex()}"


def acl_raw(entries):
    """Bytes of [(tag letter, perm, id)]: 'u' owner, 'U' named user, 'g' group, 'G'
    named group, 'm' mask, 'o' other."""
    out = (2).to_bytes(4, "little")
    for tag, perm, ident in entries:
        named = tag in "UG"
        out += TAG_OF[tag].to_bytes(2, "little") + perm.to_bytes(2, "little")
        out += (ident if named else 0xFFFFFFFF).to_bytes(4, "little")
    return out


def err_name(e):
    return errno.errorcode.get(e, str(e))


# ---------------------------------------------------------------------------------------
# Operations. One is a tuple (mount, kind, args...): `mount` says which crest mount runs it
# (1 or 2); the reference runs every operation in its one directory. `execute` returns
# the outcome ('ok' or an error), which must be the same on both sides.


def as_nobody(fn):
    """Runs fn in a child that has become nobody (uid and gid 65534, no supplementary
    groups, no capabilities). Returns 'ok' or the errno's name."""
    return as_user(NOBODY, NOBODY, fn)


def with_umask(umask, fn):
    old = os.umask(umask)
    try:
        fn()
    finally:
        os.umask(old)


def outcome(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return err_name(e.errno)


def make(path, kind, mode, umask, target=None):
    """Makes one node under `umask` (in this process, whichever user it is)."""

    def go():
        if kind == "open":
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
        elif kind == "mknod":
            os.mknod(path, stat.S_IFREG | mode)
        elif kind == "mkdir":
            os.mkdir(path, mode)
        elif kind == "fifo":
            os.mkfifo(path, mode)
        elif kind == "symlink":
            os.symlink(target, path)
        else:
            raise ValueError(kind)

    with_umask(umask, go)


def write_at(path, off, n, flags=0):
    fd = os.open(path, os.O_WRONLY | flags)
    try:
        os.pwrite(fd, bytes([0x41 + off % 26]) * n, off)
    finally:
        os.close(fd)


def fallocate(path, off, n, mode):
    fd = os.open(path, os.O_WRONLY)
    try:
        if libc.fallocate(fd, mode, off, n) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)


def python_action(path, kind, args):
    """The action of an operation that is a system call or two; None if it is not one."""
    if kind in ("open", "mknod", "mkdir", "fifo"):
        mode, umask = args
        return lambda: make(path, kind, mode, umask)
    if kind == "symlink":
        (target,) = args
        return lambda: make(path, "symlink", 0, 0o022, target)
    if kind == "chmod":
        (mode,) = args
        return lambda: os.chmod(path, mode)
    if kind == "chown":
        uid, gid = args
        return lambda: os.chown(path, uid, gid, follow_symlinks=False)
    if kind == "write":
        off, n = args
        return lambda: write_at(path, off, n)
    if kind == "truncate":
        (size,) = args
        return lambda: os.truncate(path, size)
    if kind == "read":
        return lambda: os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    if kind == "stat":
        return lambda: os.lstat(path)
    if kind == "otrunc":
        return lambda: os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
    if kind == "fallocate":
        off, n, mode = args
        return lambda: fallocate(path, off, n, mode)
    if kind == "setxattr":
        name, value = args
        return lambda: os.setxattr(path, name, value, follow_symlinks=False)
    if kind == "removexattr":
        (name,) = args
        return lambda: os.removexattr(path, name, follow_symlinks=False)
    return None


def held_write(path, other, off, n):
    """Writes through one descriptor twice; in between, the file gets capabilities
    through `other` (the other mount's path to it): the kernel of the writing mount,
    which took the file to have nothing to lose at the first write, does not look again."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"h" * n, off)
        os.setxattr(other, "security.capability", CAPS, follow_symlinks=False)
        os.pwrite(fd, b"i" * n, off + n)
    finally:
        os.close(fd)


def execute(root, op, other_root=None):
    """Runs `op` with paths under `root` (and `other_root`: the other mount's, for an
    operation that uses both); returns its outcome."""
    _mount, who, kind, rel, *args = op
    if kind == "held-write":
        path, other = os.path.join(root, rel), os.path.join(other_root or root, rel)
        return outcome(lambda: held_write(path, other, *args))
    if kind == "setfacl":
        cmd = (SETPRIV if who == "nobody" else []) + ["setfacl", *args[0], rel]
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        return "ok" if r.returncode == 0 else f"setfacl exit {r.returncode}"
    action = python_action(os.path.join(root, rel), kind, args)
    return as_nobody(action) if who == "nobody" else outcome(action)


def describe(op):
    mount, who, kind, rel, *args = op
    if kind == "setfacl":
        text = "setfacl " + " ".join(args[0]) + f" {rel}"
    elif kind in ("open", "mknod", "mkdir", "fifo"):
        text = f"{kind} {rel} mode {args[0]:04o} umask {args[1]:03o}"
    elif kind in ("chmod",):
        text = f"chmod {args[0]:04o} {rel}"
    elif kind == "setxattr":
        value = capabilities_text(args[1]) if args[0] == "security.capability" else acl_text(args[1])
        text = f"setxattr {rel} {args[0]} {value}"
    else:
        text = f"{kind} {rel} " + " ".join(str(a) for a in args)
    return f"[m{mount}] " + ("(as nobody) " if who == "nobody" else "") + text.rstrip()


# ---------------------------------------------------------------------------------------
# What is compared.


def xattr(path, name):
    try:
        return acl_text(os.getxattr(path, name, follow_symlinks=False))
    except OSError as e:
        return "-" if e.errno == errno.ENODATA else err_name(e.errno)


# cap_net_bind_service+ep, as setcap writes it (VFS_CAP_REVISION_2).
CAPS = (0x02000001).to_bytes(4, "little") + (1 << 10).to_bytes(4, "little") + bytes(12)


def capabilities_text(raw):
    return "cap_net_bind_service+ep" if raw == CAPS else "bad:" + raw.hex()


def capabilities(path):
    try:
        return capabilities_text(os.getxattr(path, "security.capability", follow_symlinks=False))
    except OSError as e:
        return "-" if e.errno == errno.ENODATA else err_name(e.errno)


def record(path):
    """What must match of one path (None: it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    rec = {"mode": f"{st.st_mode:07o}", "uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISREG(st.st_mode):
        rec["size"] = st.st_size
        rec["caps"] = capabilities(path)
    if stat.S_ISLNK(st.st_mode):
        rec["target"] = os.readlink(path)
    else:
        rec["acl"] = xattr(path, ACCESS)
    if stat.S_ISDIR(st.st_mode):
        rec["default acl"] = xattr(path, DEFAULT)
    return rec


def snapshot(top):
    """path (relative to top, '.' for top) -> what must match."""
    out = {}

    def visit(rel):
        path = os.path.join(top, rel)
        rec = out[os.path.normpath(rel)] = record(path)
        if rec and stat.S_ISDIR(int(rec["mode"], 8)):
            for name in sorted(os.listdir(path)):
                visit(os.path.join(rel, name))

    visit(".")
    return out


def differences(want, got, got_name):
    out = []
    for path in sorted(set(want) | set(got)):
        w, g = want.get(path), got.get(path)
        if w is None or g is None:
            if w is not None or g is not None:
                out.append(f"{path}: exists on {got_name if w is None else 'ext4'} only")
            continue
        for k in sorted(set(w) | set(g)):
            if w.get(k) != g.get(k):
                out.append(f"{path} {k}: ext4 {w.get(k)}, {got_name} {g.get(k)}")
    return out


# ---------------------------------------------------------------------------------------
# The random parts.


def rwx(rng):
    return "".join(c if rng.random() < 0.5 else "-" for c in "rwx")


def acl_spec(rng, n, base_entries=True, ids=IDS):
    """A setfacl -m list: named users and groups, sometimes owner, group, mask, other."""
    parts = []
    for _ in range(n):
        k = rng.random()
        if k < 0.35:
            parts.append(f"u:{rng.choice(ids)}:{rwx(rng)}")
        elif k < 0.7:
            parts.append(f"g:{rng.choice(ids)}:{rwx(rng)}")
        elif base_entries:
            parts.append(f"{rng.choice('ugmo')}::{rwx(rng)}")
    return ",".join(parts) or f"u:{rng.choice(ids)}:{rwx(rng)}"


def minimal_spec(rng):
    return f"u::{rwx(rng)},g::{rwx(rng)},o::{rwx(rng)}"


def full_spec(rng):
    """A whole ACL for --set: minimal, or with named entries (setfacl adds the mask)."""
    spec = minimal_spec(rng)
    if rng.random() < 0.6:
        spec += "," + acl_spec(rng, rng.randint(1, 4), base_entries=False)
        if rng.random() < 0.5:
            spec += f",m::{rwx(rng)}"
    return spec


def perm_bits(rng):
    return rng.choice([0o644, 0o666, 0o600, 0o755, 0o777, 0o640, 0o660, 0o700, 0o444, 0o750, 0o711, 0o670, 0o604])


def file_mode(rng):
    """Permission bits a node is made or chmodded with: often plain, often with setuid,
    setgid or sticky, sometimes anything."""
    if rng.random() < 0.25:
        return rng.randrange(0o10000)
    return rng.choice([0, 0, 0, 0o2000, 0o4000, 0o6000, 0o1000]) | perm_bits(rng)


def dir_mode(rng):
    if rng.random() < 0.2:
        return rng.randrange(0o10000)
    return rng.choice([0, 0, 0, 0o2000, 0o1000, 0o3000]) | rng.choice([0o755, 0o777, 0o775, 0o750, 0o700, 0o711, 0o751, 0o705])


def umask(rng):
    return rng.choice([0o022, 0o022, 0o002, 0o077, 0o027, 0, 0o777, 0o007, rng.randrange(0o1000)])


def random_acl_entries(rng, valid):
    """A raw ACL for setxattr: usually valid (sorted, a mask when named), else broken."""
    entries = [("u", rng.randrange(8), 0)]
    for ident in sorted(rng.sample(IDS, rng.randint(0, 3))):
        entries.append(("U", rng.randrange(8), ident))
    entries.append(("g", rng.randrange(8), 0))
    for ident in sorted(rng.sample(IDS, rng.randint(0, 3))):
        entries.append(("G", rng.randrange(8), ident))
    if len(entries) > 2 or rng.random() < 0.3:
        entries.append(("m", rng.randrange(8), 0))
    entries.append(("o", rng.randrange(8), 0))
    if not valid:
        how = rng.randrange(3)
        if how == 0 and len(entries) > 3:
            entries.remove(next(e for e in entries if e[0] == "m") if any(e[0] == "m" for e in entries) else entries[0])
        elif how == 1:
            entries.reverse()
        else:
            entries = entries[1:]
    return entries


class Round:
    """One round: a tree under r<n>, the model of what exists, the ops run so far."""

    def __init__(self, r, ref_root, m1_root, m2_root):
        self.seed = f"{SEED}-{r}"
        self.rng = random.Random(self.seed)
        self.check_rng = random.Random(self.seed + "-checks")
        self.roots = {0: ref_root, 1: m1_root, 2: m2_root}
        self.base = f"r{r}"
        self.pub = f"{self.base}/pub"
        self.kinds = {}  # rel path -> 'd', 'f', 'p' (fifo), 'l' (symlink)
        self.log = []
        self.count = 0
        self.refused = 0
        self.failure = None

    # -- running ------------------------------------------------------------------------

    def do(self, op):
        """Runs op on the reference and on its mount; their outcomes must be equal.
        Returns the outcome, or None once the round has failed."""
        if self.failure:
            return None
        mount, rel = op[0], op[3]
        before = record(os.path.join(self.roots[0], rel))
        want = execute(self.roots[0], op)
        got = execute(self.roots[mount], op, self.roots[3 - mount])
        after = record(os.path.join(self.roots[0], rel))
        change = ""
        if before and after and before["mode"] != after["mode"] and op[2] != "chmod":
            change = f" [mode {before['mode'][-4:]} -> {after['mode'][-4:]}]"
        line = f"{len(self.log) + 1:3} {describe(op)} -> {want}{change}"
        self.log.append(line + ("" if got == want else f" (crest: {got})"))
        if got != want:
            self.failure = [f"operation {len(self.log)} ({describe(op)}): ext4 {want}, mount {mount} {got}"]
            return None
        self.refused += want != "ok"
        # Half the time, the path as it is right after the operation, on either mount
        # (the other half leaves the mounts' caches as the operations left them).
        if self.check_rng.random() < 0.5:
            look = self.check_rng.choice([1, 2])
            self.log[-1] += f" (then looked at on m{look})"
            diffs = differences({rel: after}, {rel: record(os.path.join(self.roots[look], rel))}, f"mount {look}")
            if diffs:
                self.failure = [f"right after operation {len(self.log)}: {d}" for d in diffs]
                return None
        made = {"open": "f", "mknod": "f", "mkdir": "d", "fifo": "p", "symlink": "l"}.get(op[2])
        if want == "ok" and made:
            self.kinds[rel] = made
        return want

    def name(self, parent, prefix):
        self.count += 1
        return f"{parent}/{prefix}{self.count}"

    # -- choosing -----------------------------------------------------------------------

    def pick(self, kinds, exclude=()):
        paths = [p for p, k in self.kinds.items() if k in kinds and p not in exclude]
        if not paths:
            return None
        # Recent paths more often: nesting grows.
        return paths[min(len(paths) - 1, int(len(paths) * (1 - self.rng.random() ** 2)))]

    def pick_dir(self):
        return self.pick("d")

    def pick_changeable(self, kinds="fd"):
        """A path whose mode and access ACL random operations may change: not the round's
        base or the shared directory (nobody must be able to reach and make things)."""
        return self.pick(kinds, exclude=(self.base, self.pub))

    # -- operations ---------------------------------------------------------------------

    def create(self, mount, parent, who="root"):
        rng = self.rng
        kind = rng.choice(["open", "open", "open", "mknod", "mkdir", "mkdir", "fifo", "symlink"])
        if who == "nobody" and kind in ("mknod", "symlink"):
            kind = "open"
        prefix = {"open": "f", "mknod": "n", "mkdir": "d", "fifo": "p", "symlink": "l"}[kind]
        rel = self.name(parent, prefix)
        if kind == "symlink":
            return self.do((mount, who, "symlink", rel, rng.choice(["f1", "../x", "/etc/passwd", "a" * rng.randint(1, 200)])))
        mode = dir_mode(rng) if kind == "mkdir" else file_mode(rng)
        return self.do((mount, who, kind, rel, mode, umask(rng)))

    def setfacl(self, mount, rel, is_dir, who="root"):
        rng = self.rng
        k = rng.random()
        if is_dir and k < 0.3:
            if rng.random() < 0.3:
                args = ["-d", "--set", minimal_spec(rng)]  # a minimal default ACL is stored as is
            else:
                args = (["-n"] if rng.random() < 0.15 else []) + ["-d", "-m", acl_spec(rng, rng.randint(1, 4))]
        elif k < 0.6:
            n = rng.randint(1, 4) if rng.random() < 0.9 else rng.randint(10, 40)  # big ones too
            args = (["-n"] if rng.random() < 0.2 else []) + ["-m", acl_spec(rng, n, ids=IDS if n < 10 else BIG_IDS)]
        elif k < 0.7:
            args = ["--set", full_spec(rng)]
        elif k < 0.82:
            which = rng.choice(["u", "g"])
            args = (["-d"] if is_dir and rng.random() < 0.3 else []) + ["-x", f"{which}:{rng.choice(IDS)}"]
        elif k < 0.9:
            args = ["-b"]
        elif is_dir:
            args = ["-k"]
        else:
            args = ["-m", f"m::{rwx(rng)}"]
        return self.do((mount, who, "setfacl", rel, args))

    def raw_acl(self, mount, rel, is_dir):
        rng = self.rng
        name = DEFAULT if is_dir and rng.random() < 0.4 else ACCESS
        if rng.random() < 0.2:
            return self.do((mount, "root", "removexattr", rel, name))
        value = acl_raw(random_acl_entries(rng, valid=rng.random() < 0.8))
        return self.do((mount, "root", "setxattr", rel, name, value))

    def chown(self, mount, rel):
        rng = self.rng
        uid, gid = rng.choice([(rng.choice(IDS), -1), (-1, rng.choice(IDS)), (rng.choice(IDS), rng.choice(IDS))])
        return self.do((mount, "root", "chown", rel, uid, gid))

    def setgid_dir(self, mount):
        """A setgid directory of some group with (often) a default ACL; things made in it
        take its group, directories keep setgid."""
        rng = self.rng
        d = self.name(self.pick_dir() or self.base, "sg")
        self.do((mount, "root", "mkdir", d, dir_mode(rng), umask(rng)))
        self.do((mount, "root", "chown", d, -1, rng.choice(IDS)))
        self.do((mount, "root", "chmod", d, 0o2000 | rng.choice([0o755, 0o775, 0o777, 0o750, 0o1777])))
        if rng.random() < 0.5:
            self.do((mount, "root", "setfacl", d, ["-d", "-m", acl_spec(rng, rng.randint(1, 3))]))
        elif rng.random() < 0.4:
            self.setfacl(mount, d, True)
        for _ in range(rng.randint(2, 5)):
            inside = [p for p, k in self.kinds.items() if k == "d" and p.startswith(d + "/")]
            self.create(rng.choice([1, 1, 2]), rng.choice([d] + inside))

    def sgid_kill(self):
        """As nobody: write, truncate, O_TRUNC or fallocate a setgid (often also setuid)
        file; or change its own setgid file's ACL or mode. Outside the file's group and
        without CAP_FSETID, setgid must go exactly as ext4 drops it."""
        rng = self.rng
        if rng.random() < 0.75 or not self.pick("f"):
            f = self.name(self.pub, "s")
            self.do((1, "root", "open", f, 0o644, 0o022))
            if rng.random() < 0.5:
                self.do((1, "root", "write", f, 0, rng.randint(1, 5000)))
        else:
            f = self.pick("f")
        own = rng.random() < 0.3
        group = rng.choice([1000, 1003, 1010, 0, NOBODY] if not own else [1000, 1005, 0, NOBODY])
        self.do((1, "root", "chown", f, NOBODY if own else 0, group))
        mode = rng.choice([0o2666, 0o6666, 0o2676, 0o2777, 0o6777, 0o2766, 0o4666, 0o2646, 0o2660, 0o2606, 0o666])
        self.do((1, "root", "chmod", f, mode))
        if rng.random() < 0.3:
            self.do((1, "root", "setfacl", f, ["-m", f"u:{NOBODY}:{rng.choice(['rw-', 'rwx', 'r--'])}"]))
        if rng.random() < 0.4:
            # File capabilities: every write, truncate, fallocate or chown takes them away.
            # Often a mount has written the file first (its kernel then takes the file to
            # have nothing to lose and leaves it all to the daemon), and the capabilities
            # come from the other mount.
            m = rng.choice([1, 2])
            if rng.random() < 0.5:
                # (A kernel never takes a setuid or setgid file to have nothing to lose.)
                self.do((1, "root", "chmod", f, rng.choice([0o666, 0o646, 0o664, 0o755])))
            if rng.random() < 0.6:
                self.do((m, "root", "write", f, rng.randint(0, 4000), rng.randint(1, 100)))
            self.do((3 - m if rng.random() < 0.6 else m, "root", "setxattr", f, "security.capability", CAPS))
            if rng.random() < 0.5:
                self.do((m, "root", "held-write", f, rng.randint(0, 4000), rng.randint(1, 100)))
            if rng.random() < 0.5:
                who = rng.choice(["root", "nobody"])
                if rng.random() < 0.7:
                    self.do((m, who, "write", f, rng.randint(0, 4000), rng.randint(1, 100)))
                else:
                    self.do((m, who, "truncate", f, rng.randint(0, 9000)))
        for _ in range(rng.choice([1, 1, 2, 3])):
            self.nobody_changes(f, own)

    def nobody_changes(self, f, own):
        rng = self.rng
        if own:
            action = rng.choice(["setfacl", "setfacl", "chmod", "write", "truncate"])
        else:
            action = rng.choice(["write", "write", "truncate", "otrunc", "fallocate", "fallocate"])
        mount = rng.choice([1, 1, 1, 2])
        if action == "setfacl":
            args = rng.choice([["-m", acl_spec(rng, rng.randint(1, 3))], ["--set", full_spec(rng)], ["-b"], ["-m", f"m::{rwx(rng)}"]])
            self.do((mount, "nobody", "setfacl", f, args))
        elif action == "chmod":
            if not KNOWN:
                os.lstat(os.path.join(self.roots[mount], f))  # known difference 2 (see KNOWN)
            self.do((mount, "nobody", "chmod", f, rng.choice([0o2666, 0o2777, 0o6755, 0o2640]) | rng.choice([0, 0o1000])))
        elif action == "write":
            self.do((mount, "nobody", "write", f, rng.randint(0, 9000), rng.randint(1, 3000)))
        elif action == "truncate":
            self.do((mount, "nobody", "truncate", f, rng.choice([0, rng.randint(1, 20000)])))
        elif action == "otrunc":
            self.do((mount, "nobody", "otrunc", f))
        else:
            self.do((mount, "nobody", "fallocate", f, rng.randint(0, 8192), rng.randint(1, 70000), rng.choice([0, 0, FALLOC_FL_KEEP_SIZE])))

    def random_op(self):
        rng = self.rng
        k = rng.random()
        mount = 2 if rng.random() < 0.12 else 1
        if k < 0.25:
            return self.create(mount, self.pick_dir())
        if k < 0.40:
            rel = self.pick_changeable("fdp")
            if rel is None:
                return self.create(mount, self.base)
            return self.setfacl(mount, rel, self.kinds[rel] == "d")
        if k < 0.46:
            # Default ACLs on any directory, the base and the shared one too.
            d = self.pick_dir()
            return self.do((mount, "root", "setfacl", d, ["-d", "-m", acl_spec(rng, rng.randint(1, 3))]))
        if k < 0.55:
            rel = self.pick_changeable("fdp")
            if rel is None:
                return None
            return self.do((mount, "root", "chmod", rel, dir_mode(rng) if self.kinds[rel] == "d" else file_mode(rng)))
        if k < 0.61:
            rel = self.pick_changeable("fdpl")
            return rel and self.chown(mount, rel)
        if k < 0.65:
            rel = self.pick_changeable("fd")
            return rel and self.raw_acl(mount, rel, self.kinds[rel] == "d")
        if k < 0.7:
            rel = self.pick("f")
            return rel and self.do((mount, "root", "write", rel, rng.randint(0, 5000), rng.randint(1, 3000)))
        if k < 0.83:
            return self.sgid_kill()
        if k < 0.87:
            # nobody makes things in the shared directory (setgid, default ACL, umask).
            return self.create(mount, self.pub, who="nobody")
        if k < 0.9:
            # The kernel judges nobody's access by the ACLs on the way and on the file.
            rel = self.pick("fdp")
            return rel and self.do((mount, "nobody", rng.choice(["read", "stat"]), rel))
        if k < 0.95:
            # The second mount makes a directory, maybe with a default ACL; the first
            # makes things in it.
            d = self.name(self.pick_dir(), "m2d")
            self.do((2, "root", "mkdir", d, dir_mode(rng), umask(rng)))
            if rng.random() < 0.6:
                self.do((2, "root", "setfacl", d, ["-d", "-m", acl_spec(rng, rng.randint(1, 3))]))
            return self.create(1, d)
        return self.setgid_dir(mount)

    def setup(self):
        rng = self.rng
        self.do((rng.choice([1, 2]), "root", "mkdir", self.base, 0o755, 0))
        self.do((1, "root", "mkdir", self.pub, rng.choice([0o777, 0o1777]), 0))
        if rng.random() < 0.5:
            self.do((1, "root", "chown", self.pub, -1, rng.choice(IDS)))
            self.do((1, "root", "chmod", self.pub, 0o2777 | rng.choice([0, 0o1000])))
        if rng.random() < 0.5:
            self.do((1, "root", "setfacl", self.pub, ["-d", "-m", acl_spec(rng, rng.randint(1, 3))]))

    def held_and_remote(self):
        """Things made in a directory the first mount made in this round (it holds it
        exclusively and creates locally) and in one the second mount made (the first
        creates through the server); nested directories pass default ACLs on."""
        rng = self.rng
        for maker in (1, 2):
            d = self.name(self.base, "held" if maker == 1 else "remote")
            self.do((maker, "root", "mkdir", d, dir_mode(rng) | rng.choice([0, 0o700]), umask(rng)))
            if rng.random() < 0.4:
                self.do((maker, "root", "chown", d, -1, rng.choice(IDS)))
                self.do((maker, "root", "chmod", d, 0o2000 | dir_mode(rng)))
            if rng.random() < 0.5:
                self.do((maker, "root", "setfacl", d, ["-d", "-m", acl_spec(rng, rng.randint(1, 4))]))
            if rng.random() < 0.2:
                self.do((maker, "root", "setfacl", d, ["-d", "--set", minimal_spec(rng)]))
            sub = self.name(d, "sub")
            self.do((1, "root", "mkdir", sub, dir_mode(rng), umask(rng)))
            for _ in range(rng.randint(4, 10)):
                dirs = [p for p, k in self.kinds.items() if k == "d" and (p == d or p.startswith(d + "/"))]
                self.create(1, rng.choice(dirs or [d]))


STATS = dict.fromkeys(["ops", "nobody", "on mount 2", "refused", "paths", "with an access ACL", "with a default ACL", "setgid"], 0)


def run_round(r, ref_top, top1, top2):
    rnd = Round(r, ref_top, top1, top2)
    shutil.rmtree(os.path.join(top1, rnd.base), ignore_errors=True)  # a failed run's, kept
    rnd.setup()
    for _ in range(rnd.rng.randint(20, 60)):
        if rnd.failure:
            break
        rnd.random_op()
    if not rnd.failure:
        rnd.held_and_remote()
    if not rnd.failure:
        ref = snapshot(os.path.join(ref_top, rnd.base))
        # The first mount, the second, then the first again (after the second's look
        # recalled what the first held).
        for top, name in ((top1, "mount 1"), (top2, "mount 2"), (top1, "mount 1 after mount 2 looked")):
            diffs = differences(ref, snapshot(os.path.join(top, rnd.base)), name)
            if diffs:
                rnd.failure = diffs
                break
    if rnd.failure or os.environ.get("CREST_E2E_VERBOSE"):
        print(f"round {r} (seed {SEED}, CREST_E2E_SEED={SEED} replays) {'failed; ' if rnd.failure else ''}its {len(rnd.log)} operations:")
        for line in rnd.log:
            print("   " + line)
        if rnd.failure:
            print("differences:")
            for line in rnd.failure[:30]:
                print("   " + line)
            if len(rnd.failure) > 30:
                print(f"   ... {len(rnd.failure) - 30} more")
    ops = len(rnd.log)
    STATS["ops"] += ops
    STATS["nobody"] += sum("(as nobody)" in l for l in rnd.log)
    STATS["on mount 2"] += sum("[m2]" in l for l in rnd.log)
    STATS["refused"] += rnd.refused
    if not rnd.failure:
        for rec in ref.values():
            STATS["paths"] += 1
            STATS["with an access ACL"] += rec.get("acl", "-") != "-"
            STATS["with a default ACL"] += rec.get("default acl", "-") not in ("-", None)
            STATS["setgid"] += int(rec["mode"], 8) & 0o2000 != 0
    check(f"round {r}: {ops} operations, modes and ACLs as on ext4, the same on both mounts", not rnd.failure, (rnd.failure or [""])[0])
    shutil.rmtree(os.path.join(ref_top, rnd.base), ignore_errors=True)
    if not rnd.failure:
        shutil.rmtree(os.path.join(top1, rnd.base))
    return rnd


def main():
    ref_top = tempfile.mkdtemp(prefix="crest-acl-ref.", dir="/tmp")
    try:
        os.chmod(ref_top, 0o755)  # nobody must reach in
        probe = subprocess.run(["setfacl", "-m", "u:1000:r", ref_top], capture_output=True, text=True)
        if probe.returncode != 0 or xattr(ref_top, ACCESS) == "-":
            check("the reference directory under /tmp takes ACLs", False, probe.stderr.strip())
            return
        subprocess.run(["setfacl", "-b", ref_top], check=True)
        top1, top2 = os.path.join(A, "acl"), os.path.join(B, "acl")
        os.makedirs(top1, exist_ok=True)
        os.chmod(top1, 0o755)
        for r in range(ROUNDS):
            run_round(r, ref_top, top1, top2)
        print("acls: " + ", ".join(f"{v} {k}" for k, v in STATS.items()))
    finally:
        shutil.rmtree(ref_top, ignore_errors=True)


run(main)
