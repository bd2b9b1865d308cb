"""A run's weights, read: `load_weights`, the weights of `best`, `last` or `final` for evaluation and the
recommender, verified, from a checkpoint file or a sharded checkpoint directory, with no engine involved.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainwise.errors import RunDirError
from trainwise.rundir.checkpoint_files import read_checkpoint

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir

Checkpoint = Literal["best", "last", "final"]


def load_weights(run: "RunDir", checkpoint: Checkpoint,
                 notes: list[str] | None = None) -> tuple[dict[str, Any], int | None, Path]:
    """(state_dict, optimizer step it was saved at, file) for `best`, `last` or `final`, verified against
    their checksums. A damaged or missing `last` falls back to the newest intact step checkpoint, saying so
    in `notes`; damaged `best` or final weights are refused (DamagedFileError). A run without a `best` (no
    finite validation metric) gives its last weights instead, with a note. Sharded (fsdp) checkpoint
    directories are read whole, in this one process."""
    if checkpoint == "final":
        return _final_weights(run, notes)
    if checkpoint not in ("best", "last"):
        raise RunDirError(f"--checkpoint {checkpoint!r}: choose best, last or final (model.safetensors).")
    if run.checkpoint_dirs.steps():  # train.strategy=fsdp: each checkpoint is a directory of shards
        return _load_sharded(run, checkpoint, notes)
    path = run.checkpoint_path(checkpoint)
    if checkpoint == "last" and run.step_checkpoints():
        choice = run.latest_intact_checkpoint()
        path = choice.path
        if choice.notice and notes is not None:
            notes.append(choice.notice)
    elif not path.is_file():
        if checkpoint == "best":
            return _instead_of_best(run, notes)
        have = [name for name, there in (("best", run.checkpoint_path("best")), ("final", run.model_path))
                if there.is_file()]
        raise RunDirError(f"{run.path} has no `last` checkpoint ({path} is missing). "
                          + (f"Available: --checkpoint {' / '.join(have)}." if have else
                             "It holds no weights at all: did training start?"))
    else:
        run.verify(path)
    saved = read_checkpoint(path)
    return _strip_wrappers(saved["model"]), saved.get("step"), path


def _final_weights(run: "RunDir", notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
    """The weights of the run's last optimizer step. model.safetensors holds them, except when early stopping
    restored the best step's weights into it: then the last checkpoint, written at the final step, does."""
    summary = run.read_summary()
    if not summary.get("restored_best"):
        state = _strip_wrappers(run.read_model())
        return state, _saved_step(run.model_path, summary.get("steps")), run.model_path
    final_step = summary.get("steps")
    fallback_notes: list[str] = []
    try:
        state, step, path = load_weights(run, "last", fallback_notes)
    except RunDirError:
        step = None
    if step is None or step != final_step:
        best = (summary.get("best") or {}).get("step")
        raise RunDirError(f"the final weights of {run.path} (step {final_step}) are gone: model.safetensors holds "
                          f"the best step's ({best}), restored by early stopping, and the last checkpoint, which held "
                          "the final step's, is missing or damaged. Evaluate --checkpoint best (step "
                          f"{best}) or --checkpoint last (the newest intact checkpoint).")
    if notes is not None:
        notes.extend(fallback_notes)
    return state, step, path


def _saved_step(model_path: Path, default: int | None) -> int | None:
    """The optimizer step model.safetensors was saved at, as its metadata records it."""
    from safetensors import safe_open

    try:
        with safe_open(str(model_path), framework="pt") as weights:
            step = (weights.metadata() or {}).get("step")
    except Exception:  # unreadable metadata: read_model has already vouched for the tensors
        return default
    return int(step) if step is not None and step.isdigit() else default


def _instead_of_best(run: "RunDir", notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
    """No `best` checkpoint (no validation, or its metric was never finite, e.g. all NaN): the last checkpoint,
    else the final weights, with a note saying so."""
    has_last = bool(run.step_checkpoints() or run.checkpoint_path("last").is_file() or run.checkpoint_dirs.steps())
    if not has_last and not run.model_path.is_file():
        raise RunDirError(f"{run.path} has no `best` checkpoint and holds no weights at all: did training start?")
    fallback: Checkpoint = "last" if has_last else "final"
    fallback_notes: list[str] = []
    state, step, path = load_weights(run, fallback, fallback_notes)
    if notes is not None:
        at = f" (step {step})" if step is not None else ""
        used = weights_used(run, "best", path)
        what = "the best step's weights, restored by early stopping," if used == "best" else f"the {used} weights"
        notes.append(f"{run.path} has no `best` checkpoint ({_why_no_best(run)}); evaluating {what} {path.name}{at} "
                     "instead.")
        notes.extend(fallback_notes)
    return state, step, path


def _why_no_best(run: "RunDir") -> str:
    """Why a run has no `best` checkpoint: it never had one, or the one its summary records is gone."""
    best = run.read_summary().get("best") or {}
    if best.get("step") is None:
        return "the run had no validation, or its validation metric was never finite"
    value = best.get("value")
    shown = f", {best.get('metric', 'the metric')} {value:.4g}" if isinstance(value, (int, float)) else ""
    return (f"the summary records one at step {best['step']}{shown}, but it is not in {run.checkpoints_dir}: "
            "the folder was removed or emptied")


def weights_used(run: "RunDir", requested: Checkpoint, path: Path) -> Checkpoint:
    """Which weights `path` truly holds when `requested` was asked for: best, last or final."""
    if path == run.model_path:
        restored = bool(run.read_summary().get("restored_best"))
        return "best" if requested == "best" and restored else "final"
    if requested == "best" and path not in (run.checkpoint_path("best"), run.checkpoint_dirs.pointer("best")):
        return "last"
    return requested


def _load_sharded(run: "RunDir", checkpoint: Checkpoint,
                  notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
    """`best` or `last` of a run whose checkpoints are torch.distributed.checkpoint directories (fsdp)."""
    dirs = run.checkpoint_dirs
    if checkpoint == "last":
        choice = dirs.latest(run.path)  # an incomplete `last` falls back to the newest complete step
        directory = choice.path
        if choice.notice and notes is not None:
            notes.append(choice.notice)
    else:
        directory = dirs.pointer("best")
        if directory is None:
            return _instead_of_best(run, notes)
        if not dirs.is_complete(directory):
            raise RunDirError(f"{directory} (checkpoints/best) is incomplete: it has no metadata or training "
                              "state. Evaluate other weights: --checkpoint last or final.")
    step = read_checkpoint(dirs.state_path(directory)).get("step")
    return _strip_wrappers(_read_sharded_model(directory)), step, directory


def _read_sharded_model(directory: Path) -> dict[str, Any]:
    """The whole model of a sharded checkpoint, in this one process: DCP reassembles every rank's part into
    tensors of the global shapes and dtypes its metadata records."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(directory)
    prefix = "model."  # the checkpoint holds {"model": ..., "optimizer": ...}, flattened with dots
    state = {name[len(prefix):]: torch.empty(meta.size, dtype=meta.properties.dtype)
             for name, meta in reader.read_metadata().state_dict_metadata.items()
             if name.startswith(prefix) and isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # one process, on purpose: no process group to join
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        dcp.load({"model": state}, storage_reader=reader, no_dist=True)
    return state


def _strip_wrappers(state: dict[str, Any]) -> dict[str, Any]:
    """torch.compile and DDP prefix parameter names; the rebuilt plain model has none."""
    out = {}
    for key, value in state.items():
        for prefix in ("_orig_mod.", "module."):
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out
