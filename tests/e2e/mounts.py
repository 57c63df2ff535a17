"""What the two-mount coherence scripts share: the two mounts (argv 1 and 2), paths on
each under one base directory (`use`), checks that print a line and record failures,
and small file helpers. `finish()` prints the count and exits 1 if any check failed."""

import os
import sys

A, B = sys.argv[1], sys.argv[2]
fails = []
_base = ["."]


def use(base):
    """Every later `a()`/`b()` path lies under `base` on its mount."""
    _base[0] = base


def a(*p):
    return os.path.join(A, _base[0], *p)


def b(*p):
    return os.path.join(B, _base[0], *p)


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail and not cond else ""))
    if not cond:
        fails.append(name)


def exists(p):
    try:
        os.lstat(p)
        return True
    except FileNotFoundError:
        return False


def read(p):
    with open(p, "rb") as f:
        return f.read()


def write(p, data, mode="wb"):
    with open(p, mode) as f:
        f.write(data)


def as_user(uid, gid, fn):
    """Runs fn in a child that has become uid/gid with no supplementary groups and (not
    root) no capabilities, as `setpriv --reuid --regid --clear-groups`; uid 0 stays
    root. Returns 'ok' or the name of the errno fn raised."""
    import errno

    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if uid != 0:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            fn()
        except OSError as e:
            code = 10 + min(e.errno or 0, 200)
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "ok"
    return errno.errorcode.get(code - 10, str(code - 10)) if code >= 10 else f"exit {code}"


def run(main):
    """Runs `main`; an exception fails the check it happened in. Then exits."""
    try:
        main()
    except Exception as e:
        import traceback

        traceback.print_exc()
        fails.append(f"exception: {e}")
    print(f"{len(fails)} failed")
    sys.exit(1 if fails else 0)
