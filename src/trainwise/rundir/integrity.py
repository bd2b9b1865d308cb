"""Checksums of a run's large files: recorded as they are written, verified before they are loaded.

A checkpoint or the final weights with a few zeroed or overwritten bytes still load, as wrong numbers: a
resume would continue from them without a word and an evaluation would score noise. The ledger (a small
JSON file in the run directory, its name spelled by layout.py) holds the SHA-256 and size of every checkpoint
and of the final weights, hashed while they were written, so loading can refuse a damaged file by name and
a resume can fall back to the newest intact checkpoint.

A file the ledger does not know (a run from before checksums, or a crash between a write and its record)
is taken as it is: it cannot be verified, and torch/safetensors still refuse one cut short.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.rundir.atomic import Written, atomic_write_json
from trainwise.errors import DamagedFileError, DiskFullError, RunDirError, RunDirWarning

_CHUNK = 1 << 20


@dataclass(frozen=True)
class CheckpointChoice:
    """The checkpoint to load, and the newer ones passed over (each with why)."""

    path: Path
    step: int | None
    skipped: tuple[str, ...] = ()

    @property
    def notice(self) -> str | None:
        """One sentence for the person resuming, or None when `last` was intact."""
        if not self.skipped:
            return None
        at = f" (step {self.step})" if self.step is not None else ""
        return (f"{'; '.join(self.skipped)}. Using {self.path.name}{at} instead, the newest intact checkpoint; "
                "the steps after it are trained again.")


class Ledger:
    """{"version": 1, "files": {"checkpoints/last.pt": {"sha256": hex, "bytes": n}, ...}} at `path`."""

    def __init__(self, path: Path, root: Path):
        self.path, self.root = path, root

    def record(self, files: dict[Path, Written], drop: Iterable[Path] = ()) -> None:
        """Add (or replace) the entries of `files`, forget those of `drop`; one atomic write."""
        entries = self._entries()
        for path in drop:
            entries.pop(self.name(path), None)
        for path, written in files.items():
            entries[self.name(path)] = {"sha256": written.sha256, "bytes": written.size}
        atomic_write_json(self.path, {"version": 1, "files": entries})

    def problem(self, path: Path) -> str | None:
        """Why `path` is not the file that was written, or None (intact, or not recorded)."""
        entry = self._entries().get(self.name(path))
        if entry is None:
            return None
        name = self.name(path)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != entry["bytes"]:
            how = "cut short" if size < entry["bytes"] else "overwritten"
            return f"{name} is damaged: it is {size:,} bytes but {entry['bytes']:,} were written (it was {how})"
        digest = sha256_of(path)
        if digest != entry["sha256"]:
            return (f"{name} is damaged: its bytes changed after it was written (SHA-256 {digest[:12]}…, "
                    f"recorded {entry['sha256'][:12]}…)")
        return None

    def digest(self, path: Path) -> str | None:
        entry = self._entries().get(self.name(path))
        return entry["sha256"] if entry else None

    def name(self, path: Path) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    def _entries(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
            warnings.warn(f"{self.path} is damaged ({error}); checkpoints and weights cannot be verified until "
                          "the next checkpoint rewrites it.", RunDirWarning, stacklevel=3)
            return {}
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict):
            return {}
        return {k: v for k, v in files.items() if isinstance(v, dict) and isinstance(v.get("sha256"), str)
                and isinstance(v.get("bytes"), int)}


def newest_intact(run: Path, last: Path, steps: list[tuple[int, Path]], ledger: Ledger) -> CheckpointChoice:
    """`last` when it is intact, else the newest intact step checkpoint; RunDirError when there is none."""
    skipped: list[str] = []
    bad: set[tuple[int, int]] = set()  # damaged inodes: `last` is a hard link to a step checkpoint
    if last.exists():
        recorded = ledger.digest(last)
        twin = next(((s, p) for s, p in steps if _inode(p) == _inode(last)), None) or next(
            ((s, p) for s, p in steps if recorded and ledger.digest(p) == recorded), None)  # a copy, not a link
        problem = ledger.problem(last)
        if problem is None:
            return CheckpointChoice(last, twin[0] if twin else None)
        skipped.append(problem + (f" (it is the same file as {twin[1].name})" if twin and
                                  _inode(twin[1]) == _inode(last) else ""))
        bad.add(_inode(last))
    elif steps:
        skipped.append(f"{ledger.name(last)} is missing")
    for step, path in reversed(steps):
        if _inode(path) in bad:
            continue
        problem = ledger.problem(path)
        if problem is None:
            return CheckpointChoice(path, step, tuple(skipped))
        skipped.append(problem)
    start_again = f"start it again with `trainwise train ... --out {run} --overwrite`"
    if not skipped:
        raise RunDirError(f"{run} has no checkpoint yet (it stopped before its first one); {start_again}.")
    raise RunDirError(f"{run} has no intact checkpoint: {'; '.join(skipped)}. There is nothing safe to continue "
                      f"from; {start_again}.")


def free_space_warning(run: Path, existing: list[Path], checkpoint_bytes: int, keep_last: int) -> str | None:
    """See RunDir.check_free_space. Kept at once: `keep_last` step checkpoints, `best` once rotated out, and
    the one being written (`last` is a hard link, no space of its own); `existing` checkpoints (files, or
    directories of shards) are reused."""
    kept = keep_last + 2
    directory = next(p for p in (run, *run.parents) if p.is_dir())
    free = shutil.disk_usage(directory).free
    reusable = bytes_held(existing)
    needed = kept * checkpoint_bytes
    if free + reusable >= needed:
        return None
    mib = DiskFullError.mib
    return (f"{directory} has {mib(free)} MiB free, but this run keeps {kept} checkpoints of about "
            f"{mib(checkpoint_bytes)} MiB at once ({keep_last} kept, `best` and the one being written): "
            f"{mib(needed)} MiB. Training will stop with 'no space left' when the disk fills. Free some space, "
            "lower checkpoint.keep_last, or train onto a bigger disk (--out).")


def bytes_held(paths: Iterable[Path]) -> int:
    """The bytes the files at `paths` hold, a directory counting every file under it; a file reached twice
    (a hard link, or a directory named through a symlink) counts once."""
    sizes: dict[tuple[int, int], int] = {}
    for path in paths:
        files = (f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for file in files:
            try:
                st = file.stat()
            except FileNotFoundError:  # rotated out while we looked
                continue
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


def load_weights_file(path: Path, *, verified: bool) -> dict[str, Any]:
    """A safetensors file as tensors; DamagedFileError when it cannot be read or, unverified, holds NaN/Inf
    (a trained model never does: training stops at the first non-finite loss)."""
    import torch
    from safetensors.torch import load_file

    fix = "Evaluate a checkpoint instead (--checkpoint best or last)."
    try:
        state = load_file(path)
    except Exception as e:  # cut short, or not safetensors at all
        raise DamagedFileError(f"{path} cannot be read ({type(e).__name__}: {e}): it is damaged or cut short. "
                               f"{fix}") from None
    if not verified:
        broken = [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if broken:
            raise DamagedFileError(f"{path} holds NaN or infinite weights ({', '.join(broken[:3])}): it is "
                                   f"damaged. {fix}")
    return state


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _inode(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (-1, id(path))
    return (st.st_dev, st.st_ino)


def damaged_file_advice(run: Path, others: list[str], *, resumable: bool) -> str:
    """What to do about a damaged checkpoint or weights file: only what can work (resume falls back to an
    intact checkpoint unless the run completed; eval can take the weights still here)."""
    fixes = [f"`trainwise resume {run}` falls back to the newest intact checkpoint"] if resumable else []
    if others:
        fixes.append(f"`trainwise eval` can use other weights (--checkpoint {' or '.join(others)})")
    return "; ".join(fixes) + "." if fixes else "no other weights are left in this run: train it again."


def check_loadable(problem: str | None, what: str, fix: str) -> None:
    """Raise the error a loader shows for a damaged file (`problem` from `Ledger.problem`)."""
    if problem:
        raise DamagedFileError(f"{problem}. Loading {what} would give wrong numbers without any error, so it "
                               f"is refused. {fix}")


def disk_full_advice(run: Path) -> str:
    """What to do when a write into the run directory `run` found the disk full."""
    return (f"The partial file was removed; the run's earlier checkpoints are intact. Free some space (or "
            f"move {run} to a bigger disk), then continue with `trainwise resume {run}`.")


def config_not_text(path: Path, error: UnicodeDecodeError) -> DamagedFileError:
    """The error for a config.yaml whose bytes are not UTF-8 text (a damaged file, not a decoding traceback)."""
    return DamagedFileError(
        f"{path} is damaged: byte {error.object[error.start]:#04x} at offset {error.start} is not "
        "text (UTF-8). It holds the settings needed to rebuild the run's model and data: restore it "
        "from a copy, or from a run trained with the same recipe and overrides.")
