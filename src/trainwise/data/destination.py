"""Where `trainwise prepare` writes, and how it replaces a dataset without ever losing one.

A prepare never writes into `--to`. It builds the next version in a staging folder beside it (`.NAME.preparing`,
on the same filesystem, see shards.py's layout) and swaps it in with a rename only once it is complete (on
Linux one `renameat2(RENAME_EXCHANGE)`, so `--to` always holds a whole dataset; elsewhere two renames, and
the next prepare finishes or undoes a swap a crash cut between them). Until then the old dataset is untouched
and usable, and stays so after a failure, a crash or Ctrl-C. The staging folder holds the progress journal:
a rerun of the same job (same source and options) resumes there; another job, or --force, starts it afresh.

Prepare replaces only what is its own: a folder whose manifest.json says `format: trainwise-prepared` and
which holds no file but those that manifest lists as written by prepare. Anything else (someone else's
manifest.json, the user's own files, the source itself) is refused before anything is touched, and only the
files a manifest lists are ever deleted. One prepare writes a `--to` at a time: rundir/lock.py's lock, on a
file beside it (the folder itself is swapped), removed when the prepare ends.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainwise.data.prepare_job import ProgressJournal
from trainwise.data.shards import (FORMAT, MANIFEST, PROGRESS, WRITTEN, iter_files, lock_file, staging_dir,
                                   write_manifest)
from trainwise.errors import DataError
from trainwise.rundir import lock as run_lock
from trainwise.rundir.atomic import TEMP_SUFFIX, fsync_dir
from trainwise.rundir.lock import Holder

OLDER_SIDE_FOLDER = "tokenizer"  # data/text/token_shards.py's TOKENIZER_DIR: manifests before `written` did not list it
_SHOWN = 5


def check_destination(to: Path, source: Path) -> None:
    """Refuse (DataError, nothing touched) a `--to` that prepare must not replace: a file, a folder inside the
    source or holding it, or a non-empty folder that is not a dataset trainwise made or holds other files."""
    if to.exists() and not to.is_dir():
        raise DataError(f"--to {to}: exists and is not a directory.")
    place, origin = to.resolve(), source.resolve()
    if origin.is_relative_to(place):
        raise DataError(f"the source {source} is inside --to {to}: prepare replaces that whole folder, so the "
                        f"source would be lost. Nothing was touched. Move the source out of {to}, or prepare into "
                        "another folder.")
    if source.is_dir() and place.is_relative_to(origin):
        raise DataError(f"--to {to} is inside the source {source}; it would be read as data. Pick another place.")
    if Path.cwd().resolve().is_relative_to(place):
        raise DataError(f"--to {to} holds the current directory: prepare replaces that whole folder. Nothing was "
                        "touched. Run it from another directory, or prepare into a folder of its own.")
    if to.is_dir() and os.path.ismount(place):
        raise DataError(f"--to {to} is a mount point: prepare builds the new dataset beside it and swaps the two "
                        f"folders, which cannot cross filesystems. Nothing was touched. Give a folder inside it, "
                        f"e.g. {to / 'dataset'}.")
    if not to.is_dir() or not any(to.iterdir()):
        return
    own = own_files(to)
    if own is None:
        holds = _listed(sorted(_entries(to)))
        if (to / MANIFEST).is_file():
            raise DataError(f"--to {to}: its {MANIFEST} was not written by trainwise (no `format: {FORMAT}`), so "
                            f"the directory is not empty and is not a prepared dataset (it holds {holds}); refusing "
                            "to write into it. Nothing was touched. Give an empty or new directory.")
        older = (" Its .progress.jsonl says it is what an older trainwise left of an interrupted prepare: if so, "
                 "delete the folder yourself and prepare again." if (to / PROGRESS).is_file() else "")
        raise DataError(f"--to {to}: the directory is not empty and is not a prepared dataset (it holds {holds}); "
                        f"refusing to write into it. Nothing was touched. Give an empty or new directory.{older}")
    foreign = sorted(_entries(to) - own)
    if foreign:
        raise DataError(f"--to {to} is a prepared dataset, but it also holds {_listed(foreign)}, which trainwise "
                        "did not write, and prepare replaces the whole folder. Nothing was touched. Move "
                        f"{'it' if len(foreign) == 1 else 'them'} out of {to}, then run this again.")


def own_files(directory: Path) -> set[str] | None:
    """The files (relative, with `/`) prepare wrote into `directory`, as its manifest lists them, temporary
    files of an interrupted write included; None when its manifest is not a trainwise one."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    temporary = {name for name in _entries(directory) if _temporary(name)}
    listed = manifest.get(WRITTEN)
    if isinstance(listed, list):
        return {name for name in listed if isinstance(name, str) and _inside(name)} | {MANIFEST} | temporary
    names = {MANIFEST} | temporary | {name for name in _entries(directory / OLDER_SIDE_FOLDER, OLDER_SIDE_FOLDER)}
    try:
        names |= {entry["file"] for entry in iter_files(manifest) if _inside(entry["file"])}
    except (KeyError, TypeError, AttributeError):  # a damaged manifest: its shards are not deleted
        pass
    return names


@contextmanager
def writing(to: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold `to`'s lock while prepare writes it; refused, naming the holder, when another process still holds
    it after `wait_s` seconds (default: a moment)."""
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
        key, _ = run_lock.acquire(lock_file(to), to, _busy, wait_s)
    except OSError as error:
        raise DataError(f"--to {to}: cannot write in {to.parent} ({error.strerror}). prepare builds the new dataset "
                        "beside --to and swaps it in, so it needs to write there; give a folder you can write "
                        "in.") from None
    try:
        _finish_a_cut_swap(to)
        yield
    finally:
        run_lock.release(key, remove=True)


def _busy(to: Path, holder: Holder) -> DataError:
    return DataError(f"--to {to} is being prepared by {holder.describe()}. One prepare writes a dataset at a time: "
                     "wait for it to finish (or stop it), then run this again. Nothing was touched.")


def open_staging(to: Path, fingerprint: str, recorded: dict[str, Any], *, fresh: bool) -> Path:
    """The staging folder for this job: an interrupted run's of the same job is kept (resume), any other
    leftover (another job's, or with `fresh`) is cleared first."""
    staging = staging_dir(to)
    journal = ProgressJournal(staging, fingerprint, recorded)
    if (staging.exists() or staging.is_symlink()) and (fresh or not journal.of_this_job()):
        _remove(staging)
    staging.mkdir(parents=True, exist_ok=True)
    if not journal.of_this_job():
        journal.start()
    return staging


def abandon(staging: Path) -> int:
    """After a failed or interrupted build: the staging folder is removed unless its journal records finished
    shards a rerun can resume from. Returns how many it keeps."""
    try:
        finished = len((staging / PROGRESS).read_text().splitlines()) - 1  # after the header line
    except OSError:
        finished = 0
    if finished <= 0:
        _remove(staging)
    return max(finished, 0)


def seal(staging: Path, manifest: dict[str, Any]) -> None:
    """Make the staging folder a complete dataset: temporary files of killed writes removed, the manifest
    written with every file in it listed as prepare's own, then the journal removed."""
    for path in list(staging.rglob("*")):
        if path.is_file() and _temporary(path.name):
            path.unlink()
    written = sorted(name for name in _entries(staging) if name not in (MANIFEST, PROGRESS))
    write_manifest(staging, {**manifest, WRITTEN: written + [MANIFEST]})
    (staging / PROGRESS).unlink(missing_ok=True)


def swap_in(staging: Path, to: Path) -> list[str]:
    """Put the sealed staging folder at `to`; the old dataset's own files are deleted after. Returns what to
    tell the user (files that appeared in `to` meanwhile, kept aside)."""
    if not to.exists() or (to.is_dir() and not any(to.iterdir())):
        if to.exists():
            to.rmdir()  # an empty folder (POSIX would rename over it; Windows would not)
        os.rename(staging, to)
        fsync_dir(to.parent)
        return []
    own = own_files(to) or set()
    if _exchange(staging, to):
        old = staging
    else:
        old = _aside(to)
        os.rename(to, old)
        try:
            os.rename(staging, to)
        except BaseException:
            os.rename(old, to)
            raise
    fsync_dir(to.parent)
    return _discard(old, own, to)


def _discard(old: Path, own: set[str], to: Path) -> list[str]:
    """Delete the replaced dataset's own files; whatever else is there is kept, moved to a visible name."""
    for name in own:
        path = old / name
        if path.is_file() or path.is_symlink():
            path.unlink()
    for folder in sorted((p for p in old.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(old.iterdir()):
        old.rmdir()
        return []
    kept = to.with_name(f"{to.name}.kept-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(old, kept)
    left = sorted(_entries(kept))
    return [f"{_listed(left)} appeared in {to} while it was being prepared and trainwise did not write "
            f"{'it' if len(left) == 1 else 'them'}: kept in {kept}."]


def _finish_a_cut_swap(to: Path) -> None:
    """A crash between the two renames of a swap without RENAME_EXCHANGE: put the old dataset back if the new
    one never arrived, else delete its own files (the new one is in place)."""
    old = _aside(to)
    if not old.is_dir():
        return
    if not to.exists():
        os.rename(old, to)
    else:
        _discard(old, own_files(old) or set(), to)


def _aside(to: Path) -> Path:
    return to.with_name(f".{to.name}.replaced")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system or filesystem
    cannot, and then nothing was changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _entries(directory: Path, prefix: str = "") -> set[str]:
    """Every file, link and empty folder (`name/`) under `directory`, relative, with `/`."""
    names = set()
    for root, folders, files in os.walk(directory):
        here = Path(prefix, Path(root).relative_to(directory))
        names |= {(here / name).as_posix() for name in files}
        names |= {(here / name).as_posix() for name in folders if os.path.islink(os.path.join(root, name))}
        if not folders and not files and Path(root) != directory:
            names.add(here.as_posix() + "/")
    return names


def _inside(name: str) -> bool:
    parts = Path(name).parts
    return bool(name) and not Path(name).is_absolute() and ".." not in parts and "\\" not in name


def _temporary(name: str) -> bool:
    name = name.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")

