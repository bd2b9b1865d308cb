"""`trainwise eval RUN`: rebuild a run's data and model from its config, load its weights, measure a split.

Writes RUN/eval/metrics.json (every metric, the warnings, which split and weights), a confusion-matrix CSV
(classification) and one CSV row per prediction. The latest evaluation of a run replaces the previous one;
metrics.json says which split and checkpoint it measured. Each split's metrics are also kept apart
(eval/metrics-<split>.json), so evaluating train after test does not lose the test result. A split that knows how to judge a model itself
(`dataset.evaluate_model`: a recommender's held-out queries, ranked against the whole catalogue in chunks)
is measured that way instead of by collecting every output.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Literal

from trainwise.atomic import atomic_write_json, atomic_write_text
from trainwise.errors import DataError, RunDirError
from trainwise.evaluate.metric_warnings import metric_warnings
from trainwise.evaluate.tasks import get_task
from trainwise.run import RunDir
from trainwise.run_trust import require_trust
from trainwise.runtime.model_state import StateMismatch, load_kept_state, saved_record

Checkpoint = Literal["best", "last", "final"]
SPLITS = ("train", "val", "test")

def eval_files(run: RunDir, split: str | None = None) -> dict[str, Path]:
    """The evaluation's files. metrics.json, the confusion matrix and the predictions are the latest
    evaluation's; with `split`, also that split's own metrics (`split_metrics`), kept when another split is
    evaluated after it, so the report can always show the held-out test split."""
    files = {"metrics": run.eval_metrics_path, "confusion_matrix": run.eval_confusion_path,
             "predictions": run.eval_predictions_path}
    if split is not None:
        files["split_metrics"] = _split_metrics_path(run, split)
    return files


def read_eval(run: RunDir, split: str | None = None) -> dict[str, Any] | None:
    """The run's latest evaluation (metrics.json), or with `split` the latest evaluation of that split;
    None when there is none. A run evaluated before splits were kept apart has only metrics.json: it
    counts for the split it names."""
    latest = _read_eval_file(run, run.eval_metrics_path)
    return latest if split is None else _split_eval(run, split, latest)


def read_evals(run: RunDir) -> dict[str, dict[str, Any]]:
    """{split: its latest evaluation} for every split evaluated, in the order test, val, train."""
    latest = _read_eval_file(run, run.eval_metrics_path)  # read once, not once per split
    found = {split: _split_eval(run, split, latest) for split in ("test", "val", "train")}
    return {split: evaluation for split, evaluation in found.items() if evaluation is not None}


def _split_eval(run: RunDir, split: str, latest: dict[str, Any] | None) -> dict[str, Any] | None:
    """`split`'s own file, else the latest evaluation (`latest`, already read) when it measured `split`."""
    path = _split_metrics_path(run, split)
    if path.is_file():
        return _read_eval_file(run, path)
    return latest if latest is not None and latest.get("split", "test") == split else None


def _split_metrics_path(run: RunDir, split: str) -> Path:
    if split not in SPLITS:
        raise DataError(f"--split {split!r}: choose one of {', '.join(SPLITS)}.")
    return run.eval_split_metrics_path(split)


def _read_eval_file(run: RunDir, path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        evaluation = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RunDirError(f"{path} is not valid JSON ({e}); run `trainwise eval {run.path}` again.") from None
    if not isinstance(evaluation, dict):
        raise RunDirError(f"{path} is not an evaluation (a JSON object); run `trainwise eval {run.path}` again.")
    return evaluation


def evaluate_run(run_dir: str | os.PathLike | RunDir, split: str = "test", checkpoint: Checkpoint = "best",
                 *, device: str = "auto", trust_code: bool = False) -> dict[str, Any]:
    """Measure `split` with the weights of `checkpoint` (best/last checkpoint, or `final` model.safetensors).
    A run made by someone else that names factories runs none of them without `trust_code`."""
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.device import resolve_device
    from trainwise.runtime.inference import predict

    run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    if split not in SPLITS:
        raise DataError(f"--split {split!r}: choose one of {', '.join(SPLITS)}.")
    run.remove_stale_temp_files()  # left by a writer killed mid-write; kept while a writer is live
    config = run.read_config()
    require_trust(run, config, trust_code=trust_code, command="eval")
    bundle = build_data(config)
    dataset = getattr(bundle, split)
    if dataset is None or len(dataset) == 0:
        raise DataError(f"the run's data has no {split} split (data.{split}_fraction is 0?); "
                        f"evaluate another with --split {'val' if split == 'test' else 'test'}.")
    model = build_model(config, bundle.spec)
    notes: list[str] = []
    state, step, weights = load_weights(run, checkpoint, notes)
    try:
        load_kept_state(model, state, saved_record(weights))
    except StateMismatch as e:
        raise RunDirError(f"{weights} does not fit the model built from {run.config_path}: "
                          f"{str(e).splitlines()[0]} Was config.yaml edited after training?") from None
    own_evaluation = getattr(dataset, "evaluate_model", None)
    if own_evaluation is not None:  # a recommender's held-out queries rank the whole catalogue, in chunks
        metrics, predictions = own_evaluation(model, device=resolve_device(device))
    else:
        outputs, targets = predict(model, dataset, device=resolve_device(device))
        task = get_task(bundle.spec.task)
        metrics = task.metrics(outputs, targets, bundle.spec.class_names)
        predictions = task.predictions(outputs, targets, bundle.spec.class_names)
    live = run.liveness_note()
    notes_found = [_note("checkpoint_fallback", n) for n in notes] + ([_note("run_in_progress", live)] if live else [])
    result = {"run": str(run.path), "split": split, "checkpoint": checkpoint, "weights": str(weights),
              "step": step, **metrics, "warnings": notes_found + metric_warnings(metrics)}
    result["files"] = {k: str(v) for k, v in _write_eval(run, result, predictions).items()}
    return result


def load_weights(run: RunDir, checkpoint: Checkpoint,
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
    from trainwise.train import read_checkpoint

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


def _final_weights(run: RunDir, notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
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


def _instead_of_best(run: RunDir, notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
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
        notes.append(f"{run.path} has no `best` checkpoint (the run had no validation, or its validation metric "
                     f"was never finite); evaluating the {fallback} weights {path.name}{at} instead.")
        notes.extend(fallback_notes)
    return state, step, path


def _load_sharded(run: RunDir, checkpoint: Checkpoint,
                  notes: list[str] | None) -> tuple[dict[str, Any], int | None, Path]:
    """`best` or `last` of a run whose checkpoints are torch.distributed.checkpoint directories (fsdp)."""
    from trainwise.train import read_checkpoint

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


def _note(kind: str, message: str) -> dict[str, Any]:
    return {"kind": kind, "severity": "warning", "message": message, "evidence": {}}


def _strip_wrappers(state: dict[str, Any]) -> dict[str, Any]:
    """torch.compile and DDP prefix parameter names; the rebuilt plain model has none."""
    out = {}
    for key, value in state.items():
        for prefix in ("_orig_mod.", "module."):
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def _write_eval(run: RunDir, result: dict[str, Any], predictions: tuple[list[str], list[list[Any]]]):
    files = eval_files(run, result["split"])
    atomic_write_json(files["split_metrics"], result)  # this split's, kept when another split follows
    atomic_write_json(files["metrics"], result)
    atomic_write_text(files["predictions"], _csv(*predictions))
    matrix = result.get("confusion_matrix")
    if matrix:
        header = ["true \\ predicted", *matrix["labels"]]
        rows = [[label, *counts] for label, counts in zip(matrix["labels"], matrix["counts"])]
        atomic_write_text(files["confusion_matrix"], _csv(header, rows))
    else:
        files.pop("confusion_matrix")
        eval_files(run)["confusion_matrix"].unlink(missing_ok=True)  # a stale one from another task
    return files


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
