"""Each evaluation task turns raw model outputs into metrics and prediction rows; new tasks plug in."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainwise.errors import ConfigError
from trainwise.evaluate.tasks import TASKS, EvalTask, get_task, register_task


def test_classification_from_logits():
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
    targets = torch.tensor([0, 1, 1])
    task = get_task("classification")
    assert task.metrics(logits, targets, ("no", "yes"))["accuracy"] == pytest.approx(2 / 3)
    header, rows = task.predictions(logits, targets, ("no", "yes"))
    assert header == ["index", "target", "predicted", "correct", "confidence", "p_no", "p_yes"]
    assert rows[2][:4] == [2, "yes", "no", 0] and rows[0][4] == pytest.approx(1 / (1 + np.exp(-2)), abs=1e-6)


def test_regression_rows_carry_the_error():
    header, rows = get_task("regression").predictions(torch.tensor([[1.5], [2.0]]), torch.tensor([1.0, 2.0]),
                                                      None)
    assert header[-1] == "error" and rows[0][-1] == pytest.approx(0.5)
    assert get_task("regression").metrics(torch.tensor([[1.5], [2.0]]), torch.tensor([1.0, 2.0]),
                                          None)["mae"] == pytest.approx(0.25)


def test_ranking_rows_give_the_rank_of_the_chosen_item():
    scores = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.1, 0.3]])
    header, rows = get_task("ranking").predictions(scores, torch.tensor([2, 0]), None)
    assert header == ["index", "target", "target_rank", "top10"]
    assert rows[0][2] == 2 and rows[0][3] == "1 2 0" and rows[1][2] == 1


def test_a_new_task_plugs_in_and_an_unknown_one_is_named(monkeypatch):
    monkeypatch.setitem(TASKS, "dummy", TASKS["regression"])
    assert get_task("dummy") is TASKS["regression"]
    register_task("echo", EvalTask(lambda o, t, n: {"task": "echo"}, lambda o, t, n: ([], [])))
    assert get_task("echo").metrics(None, None, None) == {"task": "echo"}
    TASKS.pop("echo")
    with pytest.raises(ConfigError, match="known tasks: classification, .*ranking.*register_task"):
        get_task("segmentation")
