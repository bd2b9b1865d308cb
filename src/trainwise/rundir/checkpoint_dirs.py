"""Checkpoints that are directories: torch.distributed.checkpoint writes one shard file per rank plus its
metadata, so a sharded (train.strategy=fsdp) checkpoint is a directory, made atomic at that level.

Every rank writes its part into a hidden partial directory; after a barrier the one writer renames it to
`step-<N>/` (a rename is atomic: a reader sees no directory or the whole one), then points `last` (and `best`)
at it. Hard links do not work for directories, so the pointers are symlinks, replaced by a rename as well.
Old steps are rotated out, never the one `last` or `best` names. layout.py spells the names; this module only
moves directories.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.rundir.atomic import atomic_write
from trainwise.errors import RunDirError
from trainwise.rundir.integrity import CheckpointChoice


def numbered(root: Path, prefix: str, suffix: str = "", keep: Callable[[Path], bool] = lambda p: True
             ) -> list[tuple[int, Path]]:
    """`PREFIX<step>SUFFIX` entries of `root` that `keep` accepts, as (step, path), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.glob(f"{prefix}*{suffix}"):
        digits = p.name[len(prefix):len(p.name) - len(suffix)]
        if digits.isdigit() and keep(p):
            found.append((int(digits), p))
    return sorted(found)

SHARDED_STATE_FILE = "trainer.pt"  # in each checkpoint directory: rank 0's part of the training state
_PARTIAL = ".partial"  # not atomic.TEMP_SUFFIX: the temp-file sweep unlinks files, and these are directories
_POINTERS = ("last", "best")


class CheckpointDirs:
    """The `step-<N>/` directories under `root`, each holding the shards and `state_file` (the small,
    rank-0 part of the training state). `writer` is called before each change (it takes the run's lock);
    None makes a read-only view, for the ranks that do not own the run directory."""

    def __init__(self, root: Path, prefix: str, state_file: str, writer: Callable[[], Any] | None):
        self.root, self.prefix, self.state_file, self._writer = root, prefix, state_file, writer

    def read_only(self) -> "CheckpointDirs":
        return CheckpointDirs(self.root, self.prefix, self.state_file, None)

    def path(self, step: int) -> Path:
        return self.root / f"{self.prefix}{step:08d}"

    def state_path(self, directory: Path) -> Path:
        return directory / self.state_file

    def partial(self, step: int) -> Path:
        """Where the ranks write the checkpoint of `step` before it is committed."""
        return self.root / f".{self.prefix}{step:08d}{_PARTIAL}"

    def steps(self) -> list[tuple[int, Path]]:
        """Committed step directories, oldest first."""
        return numbered(self.root, self.prefix, keep=lambda p: p.is_dir() and not p.is_symlink())

    def pointer(self, name: str) -> Path | None:
        """The step directory `last` or `best` names, or None (no pointer, or it names nothing)."""
        link = self.root / name
        if not link.is_symlink():
            return None
        target = self.root / os.readlink(link)
        return target if target.is_dir() else None

    def is_complete(self, directory: Path) -> bool:
        # the rename commits a checkpoint only once every part is written; this guards against hands
        return (directory / ".metadata").is_file() and self.state_path(directory).is_file()

    # ---- the writer ------------------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """Clear what a killed save left (no rank is writing now: the previous save ended in a barrier) and
        make the partial directory of `step`. Call on the writer before the barrier the ranks write after."""
        target = self.partial(step)
        if self._writer is None:
            return target
        self._writer()
        for leftover in self.root.glob(f".{self.prefix}*{_PARTIAL}") if self.root.is_dir() else ():
            shutil.rmtree(leftover, ignore_errors=True)
        target.mkdir(parents=True)
        return target

    def write_state(self, directory: Path, write: Callable[[Any], Any]) -> None:
        if self._writer is not None:
            atomic_write(self.state_path(directory), write)

    def commit(self, step: int, *, is_best: bool, keep_last: int) -> Path:
        """Rename the partial directory of `step` into place, point `last` (and `best`) at it, keep the newest
        `keep_last` (and whatever a pointer names). Call once every rank has written its part."""
        final = self.path(step)
        if self._writer is None:
            return final
        self._writer()
        partial = self.partial(step)
        if not self.is_complete(partial):
            raise RunDirError(f"{partial} is incomplete (no metadata or training state): a rank did not write "
                              "its part. The previous checkpoint is kept.")
        _fsync_tree(partial)
        if final.exists():  # the same step saved again (a resume that fell back past it): replace it whole
            old = self.root / f".{final.name}.old{_PARTIAL}"
            os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, final)
        _fsync_dir(self.root)
        for name in ("last", "best") if is_best else ("last",):
            self._point(name, final)
        if keep_last > 0:
            kept = {self.pointer(name) for name in _POINTERS}
            for _, old in self.steps()[:-keep_last]:
                if old not in kept:
                    shutil.rmtree(old, ignore_errors=True)
        return final

    def _point(self, name: str, target: Path) -> None:
        link = self.root / name
        temporary = self.root / f".{name}.{os.getpid()}{_PARTIAL}"
        temporary.unlink(missing_ok=True)
        os.symlink(target.name, temporary)  # relative: the run directory can be moved or copied
        os.replace(temporary, link)
        _fsync_dir(self.root)

    # ---- the reader ------------------------------------------------------------------------------
    def latest(self, run: Path) -> CheckpointChoice:
        """`last` when it names a complete checkpoint, else the newest complete step (with a notice)."""
        skipped = []
        last = self.pointer("last")
        if last is not None and self.is_complete(last):
            return CheckpointChoice(last, _step_of(last, self.prefix))
        if (self.root / "last").is_symlink():
            skipped.append(f"checkpoints/last ({os.readlink(self.root / 'last')}) is missing or incomplete")
        for step, path in reversed(self.steps()):
            if self.is_complete(path):
                return CheckpointChoice(path, step, tuple(skipped))
            skipped.append(f"{path.name} is incomplete")
        start_again = f"start it again with `trainwise train ... --out {run} --overwrite`"
        if not skipped:
            raise RunDirError(f"{run} has no checkpoint yet (it stopped before its first one); {start_again}.")
        raise RunDirError(f"{run} has no complete checkpoint: {'; '.join(skipped)}. {start_again}.")


def _step_of(directory: Path, prefix: str) -> int | None:
    digits = directory.name[len(prefix):]
    return int(digits) if digits.isdigit() else None


def _fsync_tree(directory: Path) -> None:
    # the shards were written by other processes too: flush them to disk before the rename makes them `last`
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
