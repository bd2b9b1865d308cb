"""Diagnosis that knows the task: chance is what the task says (issue 26), and a rule that cannot know is silent."""
from __future__ import annotations

import math

import pytest

from trainwise.diagnose.task_profile import (TaskProfile, check_monitor, classification_profile, click_profile,
                                         language_model_profile, next_item_profile)
from trainwise.diagnose.convergence import convergence_findings
from trainwise.errors import ConfigError


def _records(train_losses, val: dict, every=25):
    records = []
    for i, loss in enumerate(train_losses, start=1):
        records.append({"split": "train", "step": i * every, "epoch": 0, "loss": loss, "lr": 1e-3, "grad_norm": 1.0})
    records.append({"split": "val", "step": len(train_losses) * every, "epoch": 0, **val})
    return records


def test_a_healthy_sampled_softmax_recommender_is_not_at_chance():
    # the real run of issue 26: sampled loss 7.38 -> 5.54, balanced accuracy 0.003 (which read as "ln 343")
    losses = [7.38, 6.9, 6.4, 6.1, 5.9, 5.8, 5.75, 5.72, 5.71, 5.714, 5.71, 5.714]
    records = _records(losses, {"loss": 8.1, "accuracy": 0.0056, "balanced_accuracy": 0.0029, "ndcg@10": 0.031})
    task = next_item_profile(12_102, sampled=1000)
    assert task.chance_loss == pytest.approx(math.log(1001))
    assert "loss_at_chance" not in {f.code for f in convergence_findings(records, task=task)}


def test_without_a_task_the_chance_rule_is_silent():
    records = _records([3.1, 2.9] + [2.303] * 10, {"loss": 2.303, "balanced_accuracy": 0.1})
    assert convergence_findings(records) == [] or all(f.code != "loss_at_chance"
                                                       for f in convergence_findings(records))
    assert [f.code for f in convergence_findings(records, task=classification_profile(10))] == ["loss_at_chance"]


def test_a_recommender_at_chance_is_named_with_its_own_chance():
    chance = math.log(1001)
    records = _records([8.5, 7.9] + [chance * 1.001] * 10, {"loss": 9.4, "ndcg@10": 0.0003})
    [finding] = convergence_findings(records, task=next_item_profile(12_102, sampled=1000))
    assert finding.code == "loss_at_chance"
    assert "1,000 negatives" in finding.title and finding.evidence["chance_loss"] == pytest.approx(chance)
    assert "classes" not in finding.evidence and finding.evidence["ndcg@10"] == 0.0003


def test_a_model_that_never_left_chance_is_flat_not_at_chance():
    records = _records([2.303 * (1 + 0.001 * (i % 3)) for i in range(12)], {"loss": 2.303, "balanced_accuracy": 0.1})
    assert [f.code for f in convergence_findings(records, task=classification_profile(10))] == ["loss_flat"]


def test_a_click_model_chance_is_the_entropy_of_the_click_rate():
    task = click_profile(4)
    assert task.chance_loss == pytest.approx(-(0.2 * math.log(0.2) + 0.8 * math.log(0.8)))
    learning = _records([0.69, 0.6, 0.55, 0.52, 0.5, 0.5, 0.5, 0.5], {"loss": 0.5, "balanced_accuracy": 0.71})
    assert "loss_at_chance" not in {f.code for f in convergence_findings(learning, task=task)}


def test_the_language_model_has_a_place_chance_is_ln_vocabulary():
    task = language_model_profile(50_257)
    assert task.chance_loss == pytest.approx(math.log(50_257)) and "perplexity" in task.metrics
    assert TaskProfile.from_dict(task.to_dict()) == task


def test_a_loss_stuck_at_exactly_zero_with_zero_gradients_is_an_error():
    records = [{"split": "train", "step": s, "epoch": 0, "loss": 0.0, "lr": 1e-3, "grad_norm": 0.0}
               for s in (10, 20, 30, 40)]
    [finding] = convergence_findings(records)
    assert finding.code == "loss_zero" and finding.severity == "error" and "regression" in finding.fixes[0]


def test_a_monitor_typo_says_what_was_meant():
    with pytest.raises(ConfigError, match="Did you mean val/accuracy"):
        check_monitor("val/acc", classification_profile(10).metrics)
    with pytest.raises(ConfigError, match="val/ndcg@10"):
        check_monitor("val/ndcg", next_item_profile(100).metrics)
    check_monitor("val/ndcg@10", next_item_profile(100).metrics)


def test_the_regression_as_classification_crash_is_explained():
    from trainwise.diagnose.explain import explain

    log = ('Traceback (most recent call last):\n  File "/x/trainwise/train/evaluation.py", line 60, in headline_metrics\n'
           "    recalls = [float(correct[targets == c].float().mean()) for c in targets.unique()]\n"
           "IndexError: The shape of the mask [200, 1] at index 1 does not match the shape of the indexed tensor "
           "[200] at index 1\n")
    finding = explain(log)
    assert finding.code == "shape_mismatch" and "(N, 1)" in finding.title
    assert "regression" in " ".join(finding.fixes)


def test_check_refuses_a_monitor_typo_before_any_step(capsys):
    from tests.conftest import invoke

    result = invoke(capsys, "check", "breast-cancer", "eval.monitor=val/acc", "telemetry.enabled=false")
    assert result.returncode == 2 and "Did you mean val/accuracy" in result.stderr


def test_validation_measures_what_each_recommender_is_judged_by():
    import torch

    from trainwise.runtime.inference import headline_metrics

    scores = torch.tensor([[5.0, 1.0, 0.0], [0.0, 1.0, 5.0]])  # the target ranked first, then last
    metrics = headline_metrics(scores, torch.tensor([0, 0]), "next_item", lambda o, t: torch.tensor(1.0))
    assert metrics["hr@10"] == 1.0 and metrics["ndcg@10"] == pytest.approx((1 + 1 / math.log2(4)) / 2)
    clicks = torch.tensor([[0.0, 2.0], [0.0, -1.0], [0.0, 1.0], [0.0, 0.5]])
    metrics = headline_metrics(clicks, torch.tensor([1, 0, 1, 0]), "click", lambda o, t: torch.tensor(0.5))
    assert metrics["auc"] == 1.0 and "balanced_accuracy" in metrics
