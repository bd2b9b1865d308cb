"""`trainwise compare RUN RUN...`: what differs between runs' configs, and what it did to their metrics."""
from __future__ import annotations

import os
from typing import Any

import yaml

from trainwise.errors import RunDirError
from trainwise.evaluate.run_eval import read_evals
from trainwise.rundir.layout import RunDir

# scalar evaluation metrics worth a row, in this order, when present
EVAL_METRICS = ("accuracy", "balanced_accuracy", "roc_auc", "pr_auc", "ece", "log_loss",
                "mae", "rmse", "r2", "mrr", "hr@10", "ndcg@10")
_IGNORED_KEYS = {"name"}  # a label, not a setting


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}; lists stay whole values."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def compare_runs(paths: list[str | os.PathLike]) -> dict[str, Any]:
    """{"runs": [...], "config_differences": {key: [value per run]}, "metrics": {row: [value per run]},
    "notes": [a sentence per run still training or interrupted]}."""
    if not paths:
        raise RunDirError("give at least one run directory to compare.")
    runs = [RunDir.open(p) for p in paths]
    configs = [flatten(_raw_config(run)) for run in runs]
    keys = sorted(set().union(*configs) - _IGNORED_KEYS)
    missing = object()
    differences = {k: [c.get(k, missing) for c in configs] for k in keys}
    differences = {k: [None if v is missing else v for v in values]
                   for k, values in differences.items() if len({repr(v) for v in values}) > 1}
    rows = [_metric_row(run) for run in runs]
    metric_names = list(dict.fromkeys(name for row in rows for name in row))
    return {
        "runs": [str(run.path) for run in runs],
        "names": _labels(runs),
        "config_differences": differences,
        "metrics": {name: [row.get(name) for row in rows] for name in metric_names},
        # a run still training, or interrupted (killed mid-run) with the command that continues it
        "notes": [note for note in (run.liveness_note() for run in runs) if note],
    }


def _raw_config(run: RunDir) -> dict[str, Any]:
    """The run's config.yaml as written (not validated: runs of older versions still compare)."""
    try:
        raw = yaml.safe_load(run.read_config_text()) or {}
    except yaml.YAMLError as e:
        raise RunDirError(f"{run.config_path} is damaged: not valid YAML ({e}). Compare without this run, or "
                          "restore its config.yaml from a copy.") from None
    if not isinstance(raw, dict):
        raise RunDirError(f"{run.config_path} is damaged: it holds a {type(raw).__name__}, not the sections of "
                          "a config. Compare without this run, or restore its config.yaml from a copy.")
    return raw


def _metric_row(run: RunDir) -> dict[str, Any]:
    summary = run.read_summary()
    row: dict[str, Any] = {"status": run.status(), "steps": summary.get("steps")}  # `interrupted`: killed mid-run
    best = summary.get("best") or {}
    if best.get("metric"):
        row[f"best {best['metric']}"] = best.get("value")
        row["best step"] = best.get("step")
    for key, value in (summary.get("final") or {}).items():
        if key not in ("step", "epoch", "time", "split") and isinstance(value, (int, float)):
            row[f"final val/{key}"] = value
    for split, evaluation in read_evals(run).items():  # each split evaluated, test first
        for key in EVAL_METRICS:
            if isinstance(evaluation.get(key), (int, float)):
                row[f"{split}/{key}"] = evaluation[key]
        if "macro" in evaluation:
            row[f"{split}/macro_f1"] = evaluation["macro"]["f1"]
        row[f"{split} warnings"] = len(evaluation.get("warnings", []))
    timings = summary.get("timings") or {}
    if timings.get("wall_s") is not None:
        row["wall_s"] = timings["wall_s"]
    return row


def _labels(runs: list[RunDir]) -> list[str]:
    """Column labels: the directory name, with its parent when names repeat (variant/seed0 ...)."""
    names = [run.path.name for run in runs]
    if len(set(names)) == len(names):
        return names
    return [f"{run.path.parent.name}/{run.path.name}" for run in runs]
