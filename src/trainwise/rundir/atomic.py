"""Atomic file writes: a reader sees the old file or the whole new one, never half of either.

Write to a temporary file in the same directory, fsync it, rename it over the target, fsync the directory.
The bytes are hashed on their way to the file (no second read), so a caller can record a checksum. A write
that runs out of disk space removes its temporary file and raises `DiskFullError`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainwise.errors import DiskFullError

TEMP_SUFFIX = ".tmp"  # every temporary file is `.NAME.<random>.tmp` beside its target
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_MODE = _default_mode()  # mkstemp makes 0600 files; a written file should look like any other


@dataclass(frozen=True)
class Written:
    """A file written atomically: where, its SHA-256 (hex) and its size in bytes."""

    path: Path
    sha256: str
    size: int


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> Path:
    """Call `write(file)` on a temporary file, then move it to `path` atomically."""
    return atomic_write_digest(path, write, digest=False).path


def atomic_write_digest(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, what: str = "",
                        expected_bytes: int | None = None, advice: str = "", digest: bool = True) -> Written:
    """`atomic_write`, returning the checksum (unless not `digest`: "") and size of what was written.

    On a full disk: the temporary file is removed and `DiskFullError` says how much is free and how much
    `what` (default: the file's name) needs: `expected_bytes` when the caller knows, else `write` is run
    again into a sink that only counts (the error path pays for a second serialisation, not the usual one).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    hashing = None
    try:
        os.fchmod(fd, _MODE)
        with os.fdopen(fd, "wb") as f:
            hashing = _HashingFile(f, digest)
            write(hashing)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if _is_disk_full(error, hashing):
            attempted = hashing.attempted if hashing else 0
            needed = expected_bytes if expected_bytes is not None else _measure(write)
            raise DiskFullError(path.parent, shutil.disk_usage(path.parent).free, max(needed or 0, attempted),
                                what or path.name, at_least=needed is None, advice=advice) from error
        raise
    fsync_dir(path.parent)
    return Written(path, hashing.sha256, hashing.size)


def atomic_link(source: Path, target: Path, *, advice: str = "") -> None:
    """Point `target` at `source`'s file atomically: a hard link (no space used), or a copy where the
    filesystem has none. A copy on a full disk raises DiskFullError with its temporary file removed."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}{TEMP_SUFFIX}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError as error:
            if is_disk_full(error):
                raise
            shutil.copyfile(source, tmp)  # filesystems without hard links
        os.replace(tmp, target)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if is_disk_full(error):
            raise DiskFullError(target.parent, shutil.disk_usage(target.parent).free, source.stat().st_size,
                                f"a copy of {source.name} as {target.name}", advice=advice) from error
        raise


def remove_temp_files(directories: list[Path]) -> list[Path]:
    """Delete the temporary files in `directories`: only safe when nobody is writing there (a writer killed
    mid-write leaves its temporary file behind; its target still holds the previous version)."""
    removed = []
    for directory in directories:
        for path in directory.glob(f".*{TEMP_SUFFIX}") if directory.is_dir() else ():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def is_disk_full(error: BaseException) -> bool:
    """An OSError saying the disk (or the user's quota) is full."""
    return isinstance(error, OSError) and error.errno in _DISK_FULL


def _is_disk_full(error: BaseException, hashing: "_HashingFile | None") -> bool:
    # torch.save reports a failed write as RuntimeError("[enforce fail at inline_container.cc:...] unexpected
    # pos"), dropping the OSError; the wrapper saw it, and it is usually kept as the context too.
    if hashing is not None and hashing.error is not None and is_disk_full(hashing.error):
        return True
    seen = 0
    while error is not None and seen < 5:
        if is_disk_full(error):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _measure(write: Callable[[BinaryIO], Any]) -> int | None:
    """How many bytes `write` produces, written nowhere; None when it cannot be run again."""
    sink = _CountingSink()
    try:
        write(sink)  # type: ignore[arg-type]
    except Exception:
        return None
    return sink.size


class _CountingSink:
    def __init__(self):
        self.size = 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.size += n
        return n

    def flush(self) -> None:
        pass


class _HashingFile:
    """The temporary file as `write` sees it: bytes pass through, hashed and counted on the way."""

    def __init__(self, file: BinaryIO, digest: bool = True):
        self._file, self._hash = file, hashlib.sha256() if digest else None
        self.size = 0            # bytes accepted
        self.attempted = 0       # bytes asked for, including a write that failed
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data)
        self.attempted = self.size + view.nbytes
        try:
            written = self._file.write(view)
        except OSError as error:
            self.error = error
            raise
        if self._hash is not None:
            self._hash.update(view)
        self.size += view.nbytes
        return written

    def flush(self) -> None:
        self._file.flush()

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else ""


def atomic_write_directory(target: str | os.PathLike, write: Callable[[Path], Any]) -> list[Written]:
    """Call `write(tmp)` on a fresh directory beside `target`, sync its files, then put it at `target` in one
    rename (an existing `target` is moved aside first and removed after). What was written, by final path."""
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        written = []
        for file in sorted(p for p in tmp.rglob("*") if p.is_file()):
            with open(file, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
                os.fsync(f.fileno())
            written.append(Written(target / file.relative_to(tmp), digest, file.stat().st_size))
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        fsync_dir(target.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
