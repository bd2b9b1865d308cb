"""One writer per run directory: an exclusive OS lock, held for the life of the writing process.

`flock` on a lock file inside the run directory. The kernel drops the lock when the process ends, SIGKILL
included, so a stale lock never needs cleaning up; on Linux, NFS carries flock through its lock manager, so
it works on NFS mounts that support locking. The lock file says who holds it (pid, host, start time), so a
second writer can say whom it is waiting for. Readers (eval, report, compare) never take it: `holder()`
tells them whether the run is still being written.

One process holds one lock per file however many RunDir objects write the run: flock conflicts between two
descriptors of the same process, and a process must not lock itself out (train, then resume, in one test).
layout.py calls this module for run directories, data/destination.py for `trainwise prepare`'s `--to` (whose
lock file sits beside the dataset and is removed when released: a lock taken on a file that was removed or
replaced meanwhile is taken again on the file now at the path, so removing it never lets two writers in).
"""
from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainwise.errors import RunDirWarning, RunInUseError

try:
    import fcntl
except ImportError:  # Windows has no flock: one writer per run is not enforced there
    fcntl = None  # type: ignore[assignment]

# A reader probing the lock holds it for microseconds; a writer retries this long before calling it busy.
_GRACE_S = 1.0
_BUSY = {errno.EAGAIN, errno.EACCES, getattr(errno, "EWOULDBLOCK", errno.EAGAIN)}
_UNSUPPORTED = {errno.ENOLCK, getattr(errno, "EOPNOTSUPP", errno.ENOLCK), errno.EINVAL}


@dataclass(frozen=True)
class Holder:
    """The process writing a run: what the lock file says about it."""

    pid: int | None
    host: str
    since: float | None  # seconds since the epoch

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "an unknown time"
        return f"pid {self.pid if self.pid is not None else '?'} on {self.host or '?'} since {when}"


@dataclass
class _Hold:
    fd: int
    holder: Holder
    users: int = 0


_holds: dict[str, _Hold] = {}
_guard = threading.Lock()


def acquire(lock_path: Path, run: Path, refuse: Callable[[Path, Holder], Exception] | None = None,
            wait_s: float | None = None) -> tuple[str, bool]:
    """Hold the lock of `run` (its lock file is `lock_path`); raise `refuse(run, holder)` (default: RunInUseError)
    when another process still holds it after `wait_s` seconds (default: a moment, for readers' brief probes).

    Returns (key, first): pass `key` to `release` once per `acquire`; `first` is True when this process did
    not hold the lock before (then nothing of this process is mid-write in the run).
    """
    key = os.path.realpath(lock_path)
    with _guard:
        hold = _holds.get(key)
        first = hold is None
        if hold is None:
            hold = _holds[key] = _take(lock_path, run, refuse or in_use, _GRACE_S if wait_s is None else wait_s)
        hold.users += 1
    return key, first


def release(key: str, *, remove: bool = False) -> None:
    """Give back one `acquire`; the lock goes when its last user gives it back (or the process ends). With
    `remove`, the last user deletes the lock file first (still holding it; see the module docstring)."""
    with _guard:
        hold = _holds.get(key)
        if hold is None:
            return
        hold.users -= 1
        if hold.users <= 0:
            del _holds[key]
            if remove:
                Path(key).unlink(missing_ok=True)
            if hold.fd >= 0:
                os.close(hold.fd)  # closing the descriptor drops the flock; the file stays for the next writer


def holder(lock_path: Path) -> Holder | None:
    """The live process writing the run, or None. Never waits and never takes the lock for long."""
    # Never open a second descriptor on a lock this process holds: NFS carries flock as a POSIX lock, and
    # closing any descriptor of the file drops every POSIX lock the process has on it.
    with _guard:
        hold = _holds.get(os.path.realpath(lock_path))
        if hold is not None:
            return hold.holder
    if fcntl is None:
        return None
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:  # no lock file: no writer of this trainwise version has opened the run
        return None
    try:
        if _try_lock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _read_holder(fd)
    finally:
        os.close(fd)


def held_here(lock_path: Path) -> bool:
    with _guard:
        return os.path.realpath(lock_path) in _holds


@contextmanager
def quiet(lock_path: Path) -> Iterator[bool]:
    """True inside when no process (this one included) is writing the run, and none can start meanwhile."""
    if fcntl is None or held_here(lock_path):
        yield False
        return
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only run directory: nothing there can be cleaned anyway
        yield False
        return
    try:
        locked = _try_lock(fd, fcntl.LOCK_EX)
        yield locked
    finally:
        os.close(fd)


def in_use(run: Path, other: Holder) -> RunInUseError:
    return RunInUseError(f"{run} is in use by {other.describe()}. One process writes a run at a time: wait for "
                         f"it to finish (or stop it), then try again. `trainwise report {run}` reads a live run.")


def liveness_note(run: Path, writer: Holder | None, steps: int | None = None, max_steps: int | None = None, *,
                  resumable: bool = True) -> str:
    """For a run whose summary says `running`: is it really (`writer` holds the lock), or was it killed?
    `steps` (of `max_steps`): how far its summary says it got; `resumable`: whether it left a checkpoint."""
    if writer is not None:
        return (f"{run} is still being trained (by {writer.describe()}): what is read now is a snapshot that "
                "changes as training goes on.")
    reached = f" at step {steps}" + (f" of {max_steps}" if max_steps else "") if steps is not None else ""
    killed = f"{run} was interrupted{reached}: it says it is running, but no process is writing it: it was killed"
    if not resumable:
        return (f"{killed} or crashed before its first checkpoint, so there is nothing to resume. Train it again "
                f"with `trainwise train RECIPE --out {run} --overwrite`.")
    return f"{killed} or crashed. Continue it from its last checkpoint with `trainwise resume {run}`."


def _take(lock_path: Path, run: Path, refuse: Callable[[Path, Holder], Exception], wait_s: float) -> _Hold:
    me = Holder(os.getpid(), socket.gethostname(), time.time())
    if fcntl is None:
        return _Hold(-1, me)
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while not _try_lock(fd, fcntl.LOCK_EX):
                if time.monotonic() >= deadline:
                    raise refuse(run, _read_holder(fd))
                time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        if _still_at(fd, lock_path):
            break
        os.close(fd)  # its last holder removed (or replaced) the file: lock the one at the path now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": me.pid, "host": me.host, "since": me.since}).encode(), 0)
        os.fsync(fd)  # another host reads it over NFS
    except BaseException:
        os.close(fd)
        raise
    return _Hold(fd, me)


def _still_at(fd: int, lock_path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(lock_path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in _BUSY:
            return False
        if error.errno in _UNSUPPORTED:  # e.g. NFS mounted with nolock: carry on, unguarded, and say so
            warnings.warn(f"cannot lock the run directory ({error.strerror}): its filesystem does "
                          "not support locks, so nothing stops two processes writing the same run.",
                          RunDirWarning, stacklevel=3)
            return True
        raise
    return True


def _read_holder(fd: int) -> Holder:
    for _ in range(3):  # the new holder writes its details just after taking the lock
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict):
            pid, host, since = info.get("pid"), info.get("host"), info.get("since")
            return Holder(pid if isinstance(pid, int) else None, host if isinstance(host, str) else "",
                          since if isinstance(since, (int, float)) else None)
        time.sleep(0.05)
    return Holder(None, "", None)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) inherits the descriptors. Closing its copies leaves the parent's
    # lock in place and lets the lock die with the parent, instead of lingering while a worker winds down.
    global _guard
    _guard = threading.Lock()
    for hold in _holds.values():
        if hold.fd >= 0:
            try:
                os.close(hold.fd)
            except OSError:
                pass
    _holds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
