#!/usr/bin/env python3
"""fcntl and flock locks across two mounts of one server (issue 4, item 6).

usage: locks.py MOUNT_A MOUNT_B [CREST ADDR SCRATCH_DIR]
       locks.py restart MOUNT_A MOUNT_B SIGNAL_DIR

A lock taken through mount A must exclude conflicting locks taken through mount B, and
must go away when its holder drops it: by unlocking, by closing the descriptor, by dying
(kill -9 of the process), and — given CREST, ADDR and an empty SCRATCH_DIR, where this
script mounts a third client — when the holder's whole client daemon is killed. Locks are
held by child processes of this script (`locks.py hold …`), driven over their stdin.
Prints one line per check; exits 1 if any failed.

`restart`: locks held through mount A must survive a restart of the server (kill -9 and
start again, done by the caller: this creates SIGNAL_DIR/restart-please and waits for
SIGNAL_DIR/restarted). After it, B's conflicting locks must still be refused (once the
mounts have reconnected and the grace period is over) until A's holders let go.
"""

import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

BASE = "locktest"
BUSY = (errno.EAGAIN, errno.EACCES)  # what a refused non-blocking lock returns
fails = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail and not cond else ""), flush=True)
    if not cond:
        fails.append(name)


# ---- the holder: a child process that takes one lock and waits for orders ----


def hold(path, mode, start, length):
    """`locks.py hold PATH MODE START LEN`: takes the lock, says "ready PID", then obeys
    "unlock", "close" and "exit" lines on stdin, answering each."""
    start, length = int(start), int(length)
    fd = os.open(path, os.O_RDONLY if mode in ("posix-sh", "flock-sh") else os.O_RDWR)
    if mode == "posix-ex":
        fcntl.lockf(fd, fcntl.LOCK_EX, length, start)
    elif mode == "posix-sh":
        fcntl.lockf(fd, fcntl.LOCK_SH, length, start)
    elif mode == "flock-ex":
        fcntl.flock(fd, fcntl.LOCK_EX)
    elif mode == "flock-sh":
        fcntl.flock(fd, fcntl.LOCK_SH)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "unlock":
            if mode.startswith("flock"):
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
        elif cmd == "close":
            os.close(fd)
        elif cmd == "exit":
            return
        print(f"{cmd} done", flush=True)


class Holder:
    def __init__(self, path, mode, start=0, length=0):
        self.p = subprocess.Popen(
            [sys.executable, __file__, "hold", path, mode, str(start), str(length)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.read_line(10)
        if not line.startswith("ready"):
            raise RuntimeError(f"holder {mode} on {path} did not get its lock: {line!r}")
        self.pid = int(line.split()[1])

    def read_line(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        return self.p.stdout.readline().strip() if r else ""

    def order(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        got = self.read_line(10)
        if got != f"{cmd} done":
            raise RuntimeError(f"holder did not {cmd}: {got!r}")

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()

    def end(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("exit\n")
                self.p.stdin.flush()
                self.p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


# ---- probes through the other mount ----


def try_posix(path, kind, start=0, length=0):
    """True when a non-blocking fcntl lock is granted (it is dropped again at once)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
        return True
    except OSError as e:
        if e.errno in BUSY:
            return False
        raise
    finally:
        os.close(fd)


def try_flock(path, kind):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in BUSY:
            return False
        raise
    finally:
        os.close(fd)


FLOCK = "hhqqi"  # struct flock on 64-bit Linux: type, whence, start, len, pid


def getlk(path, typ, start=0, length=0):
    """F_GETLK: (type, start, len, pid) of a conflicting lock, or type F_UNLCK."""
    fd = os.open(path, os.O_RDWR)
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK, typ, os.SEEK_SET, start, length, 0))
    finally:
        os.close(fd)
    t, _, s, n, pid = struct.unpack(FLOCK, got)
    return t, s, n, pid


def until(cond, seconds):
    """Polls `cond` for up to `seconds`; returns the time it took, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def blocked_until_released(path_b, lock_b, release, name):
    """Starts a blocking lock on B (`lock_b(fd)`), checks it still waits after 0.5 s, runs
    `release`, and checks B got the lock only after that, and soon."""
    fd = os.open(path_b, os.O_RDWR)
    got = {}

    def waiter():
        try:
            lock_b(fd)
            got["at"] = time.monotonic()
        except OSError as e:
            got["error"] = e

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    t.join(0.5)
    waiting = t.is_alive()
    released_at = time.monotonic()
    release()
    t.join(10)
    os.close(fd)  # drops B's lock (and unblocks nothing: B is the waiter)
    ok = waiting and "at" in got and got["at"] >= released_at
    lag = got.get("at", 0) - released_at
    print(f"     B got the lock {lag * 1000:.1f} ms after the release")
    check(name, ok and lag < 1.0, f"waiting after 0.5 s: {waiting}, result {got}, lag {lag:.3f} s")
    return lag


# ---- the checks ----


def posix_locks(a, b):
    pa, pb = a("posix"), b("posix")
    with open(pa, "wb") as f:
        f.write(b"x" * 4096)
    h = Holder(pa, "posix-ex", 0, 100)
    try:
        check("fcntl: a write lock on A refuses a write lock on B", not try_posix(pb, fcntl.LOCK_EX, 50, 10))
        check("fcntl: a write lock on A refuses a read lock on B", not try_posix(pb, fcntl.LOCK_SH, 99, 1))
        check("fcntl: bytes past A's range are free on B", try_posix(pb, fcntl.LOCK_EX, 100, 100))
        t, s, n, pid = getlk(pb, fcntl.F_WRLCK)
        check(
            "fcntl: F_GETLK on B names A's lock and holder",
            (t, s, n, pid) == (fcntl.F_WRLCK, 0, 100, h.pid),
            f"got type {t} start {s} len {n} pid {pid}, holder {h.pid}",
        )
        t, *_ = getlk(pb, fcntl.F_WRLCK, 100, 0)
        check("fcntl: F_GETLK past A's range finds nothing", t == fcntl.F_UNLCK, f"type {t}")
        h.order("unlock")
        check("fcntl: A's unlock frees the range for B", try_posix(pb, fcntl.LOCK_EX, 0, 0))
    finally:
        h.end()

    h = Holder(pa, "posix-sh", 0, 0)
    try:
        check("fcntl: read locks on A and B coexist", try_posix(pb, fcntl.LOCK_SH))
        check("fcntl: A's read lock refuses a write lock on B", not try_posix(pb, fcntl.LOCK_EX))
        # The holder's descriptor is read-only: its close, too, must drop the lock.
        h.order("close")
        check("fcntl: closing A's read-only descriptor frees the file", try_posix(pb, fcntl.LOCK_EX))
    finally:
        h.end()

    h = Holder(pa, "posix-ex", 0, 0)
    try:
        blocked_until_released(
            pb,
            lambda fd: fcntl.lockf(fd, fcntl.LOCK_EX),
            lambda: h.order("unlock"),
            "fcntl: a blocking lock on B waits until A unlocks",
        )
    finally:
        h.end()

    h = Holder(pa, "posix-ex", 0, 0)
    try:
        blocked_until_released(
            pb,
            lambda fd: fcntl.lockf(fd, fcntl.LOCK_EX),
            lambda: h.order("close"),
            "fcntl: a blocking lock on B waits until A closes its descriptor",
        )
    finally:
        h.end()

    h = Holder(pa, "posix-ex", 0, 0)
    h.kill()
    check("fcntl: kill -9 of the holder on A frees the lock at once", try_posix(pb, fcntl.LOCK_EX))


def flock_locks(a, b):
    pa, pb = a("flock"), b("flock")
    open(pa, "wb").close()
    h = Holder(pa, "flock-ex")
    try:
        check("flock: LOCK_EX on A refuses LOCK_EX on B", not try_flock(pb, fcntl.LOCK_EX))
        check("flock: LOCK_EX on A refuses LOCK_SH on B", not try_flock(pb, fcntl.LOCK_SH))
        check("flock: flock and fcntl locks do not meet (as on Linux)", try_posix(pb, fcntl.LOCK_EX))
        blocked_until_released(
            pb,
            lambda fd: fcntl.flock(fd, fcntl.LOCK_EX),
            lambda: h.order("unlock"),
            "flock: a blocking flock on B waits until A unlocks",
        )
    finally:
        h.end()

    h = Holder(pa, "flock-sh")
    try:
        check("flock: LOCK_SH on A and B coexist", try_flock(pb, fcntl.LOCK_SH))
        check("flock: LOCK_SH on A refuses LOCK_EX on B", not try_flock(pb, fcntl.LOCK_EX))
        h.order("close")
        # flock locks end at the release of the open file, which the kernel sends
        # asynchronously after close returns: allow it a moment.
        took = until(lambda: try_flock(pb, fcntl.LOCK_EX), 5)
        check("flock: closing A's descriptor frees the file", took is not None, "still locked after 5 s")
    finally:
        h.end()

    h = Holder(pa, "flock-ex")
    h.kill()
    took = until(lambda: try_flock(pb, fcntl.LOCK_EX), 5)
    check("flock: kill -9 of the holder on A frees the lock", took is not None, "still locked after 5 s")


def waiters_can_be_interrupted(a, b):
    """A process waiting for a lock on B is a local F_SETLKW: a signal interrupts it and
    kill -9 ends it, although the daemon is the one waiting."""
    pa, pb = a("wait"), b("wait")
    open(pa, "wb").close()
    h = Holder(pa, "posix-ex")
    try:
        code = (
            "import fcntl, os, signal, sys\n"
            "def alarm(*_): raise TimeoutError\n"
            "signal.signal(signal.SIGALRM, alarm)\n"
            "signal.alarm(1)\n"
            f"fd = os.open({pb!r}, os.O_RDWR)\n"
            "try:\n"
            "    fcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "except TimeoutError:\n"
            "    sys.exit(3)\n"
        )
        t0 = time.monotonic()
        try:
            rc = subprocess.run([sys.executable, "-c", code], timeout=10).returncode
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        check("wait: a signal interrupts a blocked lock", rc == 3 and took < 3, f"exit {rc} after {took:.1f} s")

        p = subprocess.Popen([sys.executable, "-c", f"import fcntl\nfcntl.lockf(open({pb!r}, 'r+'), fcntl.LOCK_EX)"])
        time.sleep(0.5)
        p.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        try:
            p.wait(timeout=10)
            gone = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            gone = None
        check("wait: kill -9 ends a process blocked on a lock", gone is not None and gone < 2, f"after {gone}")
        check("wait: the killed waiter took no lock", not try_posix(pb, fcntl.LOCK_EX))
    finally:
        h.end()
    check("wait: the lock is free once its holder goes", try_posix(pb, fcntl.LOCK_EX))


def killed_client(crest, addr, scratch, b):
    """The holder's whole client daemon dies: the server drops its locks a few seconds
    later (once the session has been disconnected long enough), and B gets them."""
    subprocess.run([crest, "mount", "-o", "own_session", addr, scratch], check=True, stdout=subprocess.DEVNULL)
    try:
        pc = os.path.join(scratch, BASE, "client")
        open(pc, "wb").close()
        hp, hf = Holder(pc, "posix-ex"), Holder(pc, "flock-ex")
        pb = b("client")
        check("killed client: its locks hold first", not try_posix(pb, fcntl.LOCK_EX) and not try_flock(pb, fcntl.LOCK_EX))
        daemons = subprocess.run(["pgrep", "-f", f"crest mount .*{scratch}"], capture_output=True, text=True).stdout.split()
        if not daemons:
            check("killed client: found its daemon", False)
            return
        for pid in daemons:
            os.kill(int(pid), signal.SIGKILL)
        took = until(lambda: try_posix(pb, fcntl.LOCK_EX) and try_flock(pb, fcntl.LOCK_EX), 10)
        print(f"     locks of the killed client freed after {took if took is None else round(took, 2)} s")
        check("killed client: its locks are freed within a few seconds", took is not None and took < 5, f"{took}")
        for h in (hp, hf):
            h.kill()
    finally:
        subprocess.run(["umount", "-l", scratch], stderr=subprocess.DEVNULL)


def survive_restart(a, b, signals):
    """A's fcntl write lock on bytes 0..99 and its flock lock, across a server restart."""
    pa, pb = a("restart"), b("restart")
    with open(pa, "wb") as f:
        f.write(b"x" * 4096)
    hp, hf = Holder(pa, "posix-ex", 0, 100), Holder(pa, "flock-ex")
    try:
        check("restart: A's locks hold before", not try_posix(pb, fcntl.LOCK_EX, 50, 10) and not try_flock(pb, fcntl.LOCK_EX))
        open(os.path.join(signals, "restart-please"), "w").close()
        if until(lambda: os.path.exists(os.path.join(signals, "restarted")), 60) is None:
            check("restart: the server was restarted", False, "no signal within 60 s")
            return
        # B's first try goes out while the mounts reconnect; it waits for the grace period
        # at most (the server holds other work until A has taken its locks again).
        t0 = time.monotonic()
        busy = not try_posix(pb, fcntl.LOCK_EX, 50, 10)
        print(f"     B's first try after the restart was answered after {time.monotonic() - t0:.2f} s")
        check("restart: A's fcntl lock refuses B's after the server restarted", busy)
        check("restart: A's flock lock refuses B's after the server restarted", not try_flock(pb, fcntl.LOCK_EX))
        t, s, n, pid = getlk(pb, fcntl.F_WRLCK)
        check(
            "restart: F_GETLK on B still names A's lock and holder",
            (t, s, n, pid) == (fcntl.F_WRLCK, 0, 100, hp.pid),
            f"got type {t} start {s} len {n} pid {pid}, holder {hp.pid}",
        )
        check("restart: bytes past A's range are free on B", try_posix(pb, fcntl.LOCK_EX, 100, 100))
        hp.order("unlock")
        check("restart: A's fcntl unlock frees the range for B", try_posix(pb, fcntl.LOCK_EX, 0, 100))
        check("restart: A's flock lock still holds", not try_flock(pb, fcntl.LOCK_EX))
        hf.order("unlock")
        check("restart: A's flock unlock frees the file for B", try_flock(pb, fcntl.LOCK_EX))
    finally:
        hp.end()
        hf.end()


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "hold":
        return hold(*sys.argv[2:6])
    restart = len(sys.argv) >= 2 and sys.argv[1] == "restart"
    if restart:
        del sys.argv[1]
    A, B = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(A, BASE), exist_ok=True)

    def a(*p):
        return os.path.join(A, BASE, *p)

    def b(*p):
        return os.path.join(B, BASE, *p)

    try:
        if restart:
            survive_restart(a, b, sys.argv[3])
            print(f"{len(fails)} failed")
            sys.exit(1 if fails else 0)
        posix_locks(a, b)
        flock_locks(a, b)
        waiters_can_be_interrupted(a, b)
        if len(sys.argv) >= 6:
            killed_client(sys.argv[3], sys.argv[4], sys.argv[5], b)
    except Exception as e:  # a crash is a failure of the check it happened in
        import traceback

        traceback.print_exc()
        fails.append(f"exception: {e}")
    print(f"{len(fails)} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
