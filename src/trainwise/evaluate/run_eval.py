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
from typing import Any

from trainwise.rundir.atomic import atomic_write_json, atomic_write_text
from trainwise.errors import DataError, RunDirError
from trainwise.evaluate.metric_warnings import metric_warnings
from trainwise.evaluate.tasks import get_task, own_evaluation as dataset_evaluation
from trainwise.rundir.layout import RunDir
from trainwise.rundir.weights import Checkpoint, load_weights, weights_used
from trainwise.rundir.trust import require_trust

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
                 *, device: str = "auto", trust_code: bool = False, before: bool = False) -> dict[str, Any]:
    """Measure `split` with the weights of `checkpoint` (best/last checkpoint, or `final` model.safetensors).
    A run made by someone else that names factories runs none of them without `trust_code`. `before`: also
    measure the model as config.yaml builds it, before the run's weights go in (`result["before"]`: model.hf's
    own weights with LoRA adapters at zero, or the seeded random initialisation), on the same split."""
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.device import resolve_device
    from trainwise.runtime.model_state import StateMismatch, load_kept_state, saved_record

    run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    if split not in SPLITS:
        raise DataError(f"--split {split!r}: choose one of {', '.join(SPLITS)}.")
    run.remove_stale_temp_files()  # left by a writer killed mid-write; kept while a writer is live
    config = run.read_config()
    require_trust(run, config, trust_code=trust_code, command="eval")
    bundle = build_data(config)
    dataset = getattr(bundle, split)
    if dataset is None or len(dataset) == 0:
        others = [name for name in ("test", "val", "train") if name != split and getattr(bundle, name) is not None
                  and len(getattr(bundle, name))]
        raise DataError(f"the run's data has no {split} split (data.{split}_fraction is 0, or `trainwise prepare` "
                        "held out none of a small table); evaluate another: "
                        + " or ".join(f"--split {name}" for name in others) + ".")
    if run.tokenizer_dir().is_dir():  # data re-prepared with another tokenizer: said as such, before shapes clash
        from trainwise.text.run_checks import check_kept_tokenizer

        check_kept_tokenizer(run.tokenizer_dir(), bundle.spec.tokenizer_fingerprint, config.data.path)
    model = build_model(config, bundle.spec)
    notes: list[str] = []
    state, step, weights = load_weights(run, checkpoint, notes)
    untrained = _untrained_scores(model, dataset, bundle.spec, resolve_device(device)) if before else None
    try:
        load_kept_state(model, state, saved_record(weights))
    except StateMismatch as e:
        raise RunDirError(f"{weights} does not fit the model built from {run.config_path}: "
                          f"{str(e).splitlines()[0]} Was config.yaml edited after training?") from None
    metrics, predictions, answers = _measure(run, config, model, dataset, bundle.spec, split, resolve_device(device))
    if untrained is not None:
        if metrics.get("finetune"):  # the base's answers were scored beside the tuned ones
            untrained["exact_match"] = metrics["finetune"]["base_exact_match"]
        metrics["before"] = untrained
    live = run.liveness_note()
    notes_found = [_note("checkpoint_fallback", n) for n in notes] + ([_note("run_in_progress", live)] if live else [])
    result = {"run": str(run.path), "split": split, "checkpoint": weights_used(run, checkpoint, weights),
              "requested_checkpoint": checkpoint, "weights": str(weights), "step": step, **metrics,
              "warnings": notes_found + metric_warnings(metrics)}
    result["files"] = {k: str(v) for k, v in _write_eval(run, result, predictions).items()}
    run.eval_answers_path.unlink(missing_ok=True)  # a stale one from another checkpoint or split
    if answers is not None:
        atomic_write_text(run.eval_answers_path, "".join(json.dumps(row) + "\n" for row in answers))
        result["files"]["answers"] = str(run.eval_answers_path)
    return result


def _measure(run: RunDir, config: Any, model: Any, dataset: Any, spec: Any, split: str, device: Any):
    """(metrics, the predictions table, a fine-tune's every held-out answer or None) of the run's model."""
    from trainwise.evaluate.finetune import instruction_evaluation
    from trainwise.runtime.inference import predict

    own_evaluation = dataset_evaluation(dataset)
    if own_evaluation is None:
        outputs, targets = predict(model, dataset, device=device)
        task = get_task(spec.task)
        return (task.metrics(outputs, targets, spec.class_names),
                task.predictions(outputs, targets, spec.class_names), None)
    # a text split, or a recommender's held-out queries ranking the whole catalogue in chunks
    metrics, predictions = own_evaluation(model, device=device)
    tuned = instruction_evaluation(run.tokenizer_dir(), config, model, split, device=device)
    if not tuned:
        return metrics, predictions, None
    # a fine-tune on instruction data: exact match on held-out prompts, base vs tuned answers
    metrics["generations"] = tuned.pop("generations")  # held-out prompts through the template
    answers = tuned.pop("all_answers")
    metrics["finetune"] = tuned
    return metrics, predictions, answers


def _untrained_scores(model: Any, dataset: Any, spec: Any, device: Any) -> dict[str, Any]:
    """The headline metrics of the model before the run's weights are loaded into it (`eval --before`)."""
    if spec.task == "causal_lm":  # loss, perplexity, token accuracy; no generations (they need no repeating)
        from trainwise.text.lm_eval import split_token_metrics

        return {"task": "causal_lm", **split_token_metrics(model, dataset, device=device)}
    own_evaluation = dataset_evaluation(dataset)
    if own_evaluation is not None:
        metrics, _ = own_evaluation(model, device=device)
    else:
        from trainwise.runtime.inference import predict

        outputs, targets = predict(model, dataset, device=device)
        metrics = get_task(spec.task).metrics(outputs, targets, spec.class_names)
    return {key: value for key, value in metrics.items() if not isinstance(value, list)}


def _note(kind: str, message: str) -> dict[str, Any]:
    return {"kind": kind, "severity": "warning", "message": message, "evidence": {}}


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
