"""Classification with a vocabulary's worth of classes: no C x C matrix, top confusions, -100 left out."""
from __future__ import annotations

import numpy as np
import torch

from trainwise.evaluate.tasks import get_task


def test_many_classes_give_top_confusions_and_no_matrix():
    classes, n = 5000, 400
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(0, classes, (n,), generator=g)
    outputs = torch.randn(n, classes, generator=g)
    outputs[torch.arange(n), targets] += 10  # right, but for the rows below
    outputs[:30, 7] += 100  # thirty rows predicted as class 7
    task = get_task("classification")
    metrics = task.metrics(outputs, targets, None)
    assert "confusion_matrix" not in metrics
    top = metrics["top_confusions"][0]
    assert top["predicted"] == "7" and top["count"] == max(c["count"] for c in metrics["top_confusions"])
    assert metrics["accuracy"] >= 1 - 30 / n
    header, rows = task.predictions(outputs, targets, None)
    assert len(header) == 5 and len(rows) == n  # no 5,000 probability columns


def test_per_token_targets_with_minus_100_are_left_out():
    outputs = torch.randn(4, 3, 6)  # [N, classes, positions], cross-entropy's layout
    targets = outputs.argmax(1)
    targets[:, :2] = -100
    metrics = get_task("classification").metrics(outputs, targets, None)
    assert metrics["samples"] == 16 and metrics["accuracy"] == 1.0
    assert "confusion_matrix" in metrics  # three classes: the matrix is small
