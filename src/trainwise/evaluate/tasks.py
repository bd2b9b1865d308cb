"""Evaluation tasks: how model outputs become metrics and prediction rows, one entry per kind of problem.

Built in: `classification` (logits [N, C]), `regression` ([N] or [N, 1]) and `ranking` (item scores [N, items],
target = index of the relevant item). A new kind of model registers its own with `register_task`; the
DataSpec's `task` names which one a run uses.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainwise.errors import ConfigError
from trainwise.evaluate.metrics import (MATRIX_MAX_CLASSES, as_numpy, classification_metrics, regression_metrics,
                                        softmax)
from trainwise.recsys.metrics import ranking_metrics, target_ranks

Rows = tuple[list[str], list[list[Any]]]  # header, rows


@dataclass(frozen=True)
class EvalTask:
    """`metrics(outputs, targets, class_names)` -> dict; `predictions(...)` -> (header, rows) for a CSV."""

    metrics: Callable[[Any, Any, Sequence[str] | None], dict[str, Any]]
    predictions: Callable[[Any, Any, Sequence[str] | None], Rows]


def _counted(outputs, targets):
    """Outputs [N, C] and targets [N] of the labels that count: per-position outputs [N, C, T...] are
    flattened (cross-entropy's layout), and targets of -100 (no label: padding, masked tokens) left out."""
    from trainwise.data.batch import IGNORE_INDEX  # here: a report that reads a run imports no torch

    outputs, targets = as_numpy(outputs), as_numpy(targets).astype(np.int64)
    if outputs.ndim > 2:
        outputs, targets = np.moveaxis(outputs, 1, -1).reshape(-1, outputs.shape[1]), targets.reshape(-1)
    counted = targets != IGNORE_INDEX
    return outputs[counted], targets[counted]


def _classification_metrics(outputs, targets, class_names):
    outputs, targets = _counted(outputs, targets)
    return classification_metrics(targets, softmax(outputs), class_names)


def _classification_rows(outputs, targets, class_names) -> Rows:
    outputs, targets = _counted(outputs, targets)
    probabilities = softmax(outputs)
    names = list(class_names) if class_names else [str(c) for c in range(probabilities.shape[1])]
    predicted = probabilities.argmax(1)
    each = len(names) <= MATRIX_MAX_CLASSES  # one probability column per class, while that stays readable
    header = ["index", "target", "predicted", "correct", "confidence"] + ([f"p_{n}" for n in names] if each else [])
    rows = [[i, names[t], names[p], int(t == p), round(float(probabilities[i, p]), 6),
             *((round(float(x), 6) for x in probabilities[i]) if each else ())]
            for i, (t, p) in enumerate(zip(targets, predicted))]
    return header, rows


def _regression_metrics(outputs, targets, class_names):
    return regression_metrics(targets, outputs)


def _regression_rows(outputs, targets, class_names) -> Rows:
    predictions = as_numpy(outputs).reshape(-1)
    targets = as_numpy(targets).reshape(-1)
    return ["index", "target", "prediction", "error"], [
        [i, float(t), float(p), float(p - t)] for i, (t, p) in enumerate(zip(targets, predictions))]


def _ranking_metrics(outputs, targets, class_names):
    return ranking_metrics(targets, outputs)


def _ranking_rows(outputs, targets, class_names) -> Rows:
    scores = as_numpy(outputs)
    ranks = target_ranks(targets, scores)
    top = np.argsort(-scores, axis=1)[:, :10]
    return ["index", "target", "target_rank", "top10"], [
        [i, int(t), int(r), " ".join(str(int(x)) for x in top[i])]
        for i, (t, r) in enumerate(zip(as_numpy(targets), ranks))]


TASKS: dict[str, EvalTask] = {
    "classification": EvalTask(_classification_metrics, _classification_rows),
    "regression": EvalTask(_regression_metrics, _regression_rows),
    "ranking": EvalTask(_ranking_metrics, _ranking_rows),
}


def register_task(name: str, task: EvalTask) -> None:
    TASKS[name] = task


def get_task(name: str) -> EvalTask:
    if name not in TASKS:
        raise ConfigError(f"no evaluation for task {name!r}; known tasks: {', '.join(sorted(TASKS))}. "
                          "Register one with trainwise.evaluate.tasks.register_task.")
    return TASKS[name]


def own_evaluation(dataset: Any) -> Callable[..., tuple[dict[str, Any], Rows]] | None:
    """How a split scores a model when it does so itself, or None (the task's metrics over predictions then):
    a recommender's held-out queries rank the whole catalogue (`dataset.evaluate_model`), a text split streams
    token metrics and generates (text/lm_eval.py). Called as `scorer(model, device=...)`."""
    hook = getattr(dataset, "evaluate_model", None)
    if hook is not None:
        return hook
    from trainwise.data.text.packing import PackedTextDataset

    if isinstance(dataset, PackedTextDataset):
        from trainwise.text.lm_eval import evaluate_language_model

        return lambda model, *, device: evaluate_language_model(model, dataset, device=device)
    return None
