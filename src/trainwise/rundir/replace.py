"""What `--overwrite` may replace, and how.

`--overwrite` is the one place trainwise deletes files that the command did not make itself, so it deletes only
what is recognisably a trainwise run: a directory holding nothing but the names a run directory has (layout.py
spells them), with the records a run writes. It never replaces a place that holds the user's other work, whatever
is in it: a filesystem root, the home directory, the working directory or a parent of it, a prepared dataset,
the data the run trains on or a folder around it, or the recipe file's folder.

The old run is renamed to a sibling before anything is deleted and removed only once the new run directory
exists and is locked: a crash in between leaves the old run beside the new one, never neither.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import yaml

from trainwise.rundir.atomic import TEMP_SUFFIX
from trainwise.errors import RunDirError

# A config.yaml written by trainwise holds every section (every default filled in); a user's own config.yaml
# alone in a folder is not taken for a run.
_RUN_CONFIG_SECTIONS = frozenset({"model", "data", "optim", "schedule", "train", "eval", "checkpoint", "telemetry"})
_MANIFEST = "manifest.json"  # what `trainwise prepare` writes at the top of a prepared dataset
_SHOWN = 5


def refuse_replacing(path: Path, run_entries: frozenset[str], lock_name: str, inputs: Iterable[Path]) -> None:
    """Raise RunDirError (exit 2, nothing touched) unless the non-empty directory `path` is a run that
    `--overwrite` may replace. `run_entries`: the top-level names a run directory has; `inputs`: the files and
    folders this run reads (its data, its recipe file)."""
    place = protected_place(path, inputs)
    if place is not None:
        raise RunDirError(f"--overwrite refused: {path} is {place}. Nothing was touched. --overwrite replaces only "
                          "an earlier trainwise run; choose another --out (e.g. runs/NAME).")
    foreign = foreign_entries(path, run_entries, lock_name)
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else "")
        raise RunDirError(f"--overwrite refused: {path} is not a trainwise run; it holds {shown}. Nothing was "
                          "touched. --overwrite replaces only an earlier run's directory; choose another --out, "
                          "or move those files away first.")


def protected_place(path: Path, inputs: Iterable[Path] = ()) -> str | None:
    """Why `path` must never be replaced, in the user's words, or None."""
    target = path.resolve()
    cwd = Path.cwd().resolve()
    if target == Path(target.anchor):
        return "a filesystem root"
    if target == Path.home().resolve():
        return "your home directory"
    if target == cwd:
        return "the current directory"
    if cwd.is_relative_to(target):
        return f"a parent of the current directory ({cwd})"
    if (target / _MANIFEST).is_file():
        return f"a prepared dataset (it has {_MANIFEST})"
    for given in inputs:
        source = Path(given).resolve()
        if source == target or source.is_relative_to(target):
            return f"where this run's input {given} is"
        if target.is_relative_to(source):
            return f"inside this run's input {given}"
    return None


def foreign_entries(path: Path, run_entries: frozenset[str], lock_name: str) -> list[str]:
    """The top-level entries of `path` that are not a run's, sorted; [] for a run (or the remains of one: only
    its lock and temporary files). A config.yaml alone counts as a run only when it is a resolved trainwise
    config."""
    names = sorted(entry.name for entry in path.iterdir())
    foreign = [name for name in names if name not in run_entries and not _temporary(name)]
    if foreign:
        return foreign
    kept = {name for name in names if name != lock_name and not _temporary(name)}
    if kept == {"config.yaml"} and not _resolved_config(path / "config.yaml"):
        return ["config.yaml (not one trainwise wrote)"]
    return []


def move_aside(path: Path) -> Path:
    """Rename the run at `path` to a new sibling and return it; RunDirError when it cannot be moved (then
    nothing was deleted)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.replaced-{stamp}-{os.getpid()}")
    try:
        path.rename(aside)
    except OSError as error:
        raise RunDirError(f"--overwrite: could not move the old run {path} aside to {aside.name} ({error}). "
                          "Nothing was deleted. Choose another --out, or remove the old run yourself.") from None
    return aside


def remove_aside(aside: Path) -> str | None:
    """Delete the old run once the new one exists; a sentence for the user when it could not be deleted."""
    try:
        shutil.rmtree(aside)
    except OSError as error:
        return f"the replaced run was kept at {aside}: it could not be deleted ({error}); remove it yourself."
    return None


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _resolved_config(path: Path) -> bool:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return isinstance(loaded, dict) and _RUN_CONFIG_SECTIONS <= set(loaded)
