"""Where a checkpoint file is written, and its format: a versioned dict of tensors and plain values, written with
`torch.save` and read with `weights_only=True`, so loading a checkpoint never unpickles arbitrary objects.

What goes into one is the engine's (train/recovery/checkpoint.py); `save` writes it atomically into the run directory
with its checksum, points `last`/`best` at it and rotates old ones (RunDir.save_checkpoint calls it; sharded
checkpoint directories are checkpoint_dirs.py's); `read_checkpoint` reads one back, for the engine's resume
and for evaluation alike."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from trainwise.errors import RunDirError
from trainwise.rundir.atomic import atomic_link, atomic_write_digest
from trainwise.rundir.checkpoint_dirs import CheckpointDirs
from trainwise.rundir.integrity import CheckpointChoice, Ledger, disk_full_advice

FORMAT_VERSION = 1


class CheckpointRun(Protocol):
    """What this module asks of a run directory (RunDir is one; layout.py, which spells the names, calls `save`
    with itself, so this module does not import it)."""
    path: Path

    @property
    def checksums_path(self) -> Path: ...
    @property
    def checkpoint_dirs(self) -> CheckpointDirs: ...
    def checkpoint_path(self, name: Literal["last", "best"] | int) -> Path: ...
    def step_checkpoints(self) -> list[tuple[int, Path]]: ...
    def latest_intact_checkpoint(self) -> CheckpointChoice: ...


def save(run: CheckpointRun, step: int, write, *, is_best: bool, keep_last: int) -> Path:
    """Write the checkpoint of `step` (`write(file)`, see checkpoint_writer) atomically with its checksum,
    point `last` (and `best`) at it, keep the newest `keep_last`."""
    advice = disk_full_advice(run.path)
    written = atomic_write_digest(run.checkpoint_path(step), write, what="a checkpoint", advice=advice)
    links = [run.checkpoint_path("last")] + ([run.checkpoint_path("best")] if is_best else [])
    rotated = [old for _, old in run.step_checkpoints()[:-keep_last]] if keep_last > 0 else []
    # Recorded before linking: a crash in between leaves `last` failing its check, and a resume falls
    # back to this step's file, which is the same checkpoint.
    Ledger(run.checksums_path, run.path).record({p: written for p in [written.path, *links]}, drop=rotated)
    for link in links:
        atomic_link(written.path, link, advice=advice)
    for old in rotated:
        old.unlink(missing_ok=True)  # `last`/`best` are hard links: their data stays
    return written.path


def checkpoint_writer(state: dict[str, Any]):
    """A `write(file)` callable for RunDir.save_checkpoint, which hashes the bytes as they are written and
    may call it a second time, into a counting sink, to say how much space a checkpoint needs."""
    import torch  # readers of a run (report, compare) never load torch for this module

    payload = {"format_version": FORMAT_VERSION, **state}
    return lambda f: torch.save(payload, f)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file. It is not verified here: choose it with RunDir.latest_intact_checkpoint()
    or check it with RunDir.verify(path) first (a few changed bytes still load, as wrong numbers)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise RunDirError(f"no checkpoint at {path}. A run writes one after each evaluation, every "
                          "checkpoint.every_steps, and when it stops.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file or a foreign pickle
        raise RunDirError(f"{path} cannot be read as a trainwise checkpoint ({type(e).__name__}: {e}).") from None
    if not isinstance(state, dict):
        raise RunDirError(f"{path} is not a trainwise checkpoint (it holds a {type(state).__name__}).")
    if state.get("format_version") != FORMAT_VERSION:
        raise RunDirError(f"{path} has checkpoint format {state.get('format_version')!r}; this trainwise reads "
                          f"format {FORMAT_VERSION}.")
    return state


def read_checkpoint_header(run_dir: CheckpointRun, path: Path, sharded: bool) -> dict[str, Any]:
    """A checkpoint's small entries (step, config, config_hash; a checkpoint from before config hashes has
    no `config`) without reading its tensors: the state file of a sharded checkpoint, or the file mapped."""
    import torch

    if sharded:
        state = read_checkpoint(run_dir.checkpoint_dirs.state_path(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # an old-style (non-zip) file cannot be mapped: read it whole, with read's messages
            state = None
        if not isinstance(state, dict):
            state = read_checkpoint(path)
    return {key: state.get(key) for key in ("step", "config", "config_hash")}


def resume_checkpoint(run_dir: CheckpointRun, *, sharded: bool) -> CheckpointChoice:
    """The one rule for the checkpoint a resume continues from, asked by `trainwise resume` (to check the
    config before building anything) and by the engine's Checkpointer (to load it): `last`, or the newest step
    whose checksum verifies; for sharded runs, the newest complete directory. RunDirError when there is none
    to trust."""
    if sharded:
        return run_dir.checkpoint_dirs.latest(run_dir.path)
    return run_dir.latest_intact_checkpoint()
