"""A run's status as readers see it: what its summary says, whether a process still writes it, and what to
tell a user who points a new run at a directory that already holds one.

A killed run cannot rewrite its summary, so `running` alone does not say the run is alive: the run's lock
(lock.py) does. Only layout.py calls this module; RunDir passes itself (as a `RunView`: this module does not
import layout.py) or the summary's path, so file names stay spelled in layout.py alone.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

from trainwise.errors import RunDirError
from trainwise.rundir import lock as run_lock, replace as run_replace

Status = Literal["running", "completed", "stopped", "failed"]  # what the writer records in summary.json
ReadStatus = Literal["running", "interrupted", "completed", "stopped", "failed", "unknown"]  # RunDir.status()


class RunView(Protocol):
    """What this module asks of a run directory (RunDir is one)."""
    path: Path

    @property
    def lock_path(self) -> Path: ...
    @property
    def summary_path(self) -> Path: ...
    def read_summary(self) -> dict[str, Any]: ...
    def live_writer(self) -> Any: ...
    def has_checkpoint(self) -> bool: ...
    def entry_names(self) -> Any: ...


def read_summary(path: Path, problem: Callable[[str], None]) -> dict[str, Any]:
    """The summary at `path`, or {} when there is none yet or it is damaged (then reported to `problem`):
    the status and timings are then unknown, but metrics, checkpoints and weights can still be read."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        summary = f"not valid JSON: {e}"
    if not isinstance(summary, dict):
        why = summary if isinstance(summary, str) else "not a JSON object"
        problem(f"{path} is damaged ({why}); the run's status, steps and timings are unknown. A resume "
                "rewrites it.")
        return {}
    return summary


def status(run: RunView) -> ReadStatus:
    """The summary's status, `interrupted` when it says `running` but no process is writing the run (killed
    or crashed: `trainwise resume` continues it), `unknown` when there is no readable summary."""
    recorded = run.read_summary().get("status")
    if recorded == "running" and run.live_writer() is None:
        return "interrupted"
    return recorded if recorded in ("running", "completed", "stopped", "failed") else "unknown"


def liveness_note(run: RunView) -> str | None:
    """A sentence for readers when the summary says `running`: still training, or interrupted (killed
    mid-run: no process writes it), with the step it reached and the command that continues it."""
    summary = run.read_summary()
    if summary.get("status") != "running":
        return None
    return run_lock.liveness_note(run.path, run.live_writer(), summary.get("steps"), summary.get("max_steps"),
                                  resumable=run.has_checkpoint())


def refuse_existing(run: RunView, *, overwrite: bool, inputs: Iterable[Path] = ()) -> None:
    """Raise when creating a run at `run.path` would replace files the user did not ask to replace: a
    file, a run another process is writing (even with `overwrite`), any earlier files without it, and with it
    anything that is not an earlier run or is a place `--overwrite` never replaces (replace.py; `inputs`:
    the files and folders the new run reads)."""
    path, lock = run.path, run.lock_path
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} exists and is not a directory; choose another --out.")
    holder = run_lock.holder(lock) if path.is_dir() and not run_lock.held_here(lock) else None
    if holder is not None:
        raise run_lock.in_use(path, holder)
    holds_files = path.is_dir() and any(p.name != lock.name for p in path.iterdir())
    if holds_files and overwrite:
        run_replace.refuse_replacing(path, run.entry_names(), lock.name, inputs)
    if holds_files and not overwrite:
        recorded = run.read_summary().get("status") if run.summary_path.is_file() else None
        if recorded == "completed":
            advice = ("It holds a completed run, which cannot be resumed. Choose another --out "
                      "for a new run, or pass --overwrite to replace it.")
        elif run.has_checkpoint():
            advice = (f"Continue it with `trainwise resume {path}`, choose another --out, or pass --overwrite "
                      "to replace it.")
        elif run_replace.foreign_entries(path, run.entry_names(), lock.name):
            advice = "It is not a trainwise run: choose another --out (--overwrite replaces only an earlier run)."
        else:
            advice = "Choose another --out, or pass --overwrite to replace it."
        raise RunDirError(f"{path} already holds files (a previous run?). Nothing was touched.\n{advice}")
