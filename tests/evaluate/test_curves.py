"""Curve findings from metrics.jsonl records, through the names evaluation imports (the rules are the
diagnose stage's): each fires on the curve it names, and only there."""
from __future__ import annotations

import math

import numpy as np

from trainwise.diagnose.curve_analysis import analyse_curves
from trainwise.diagnose.curves import best_point


def _records(train_loss, val_loss, *, every=10, val_every=50, **val_extra):
    """train/val records as the trainer logs them, from functions of the step."""
    records = []
    for step in range(every, 501, every):
        records.append({"split": "train", "step": step, "loss": train_loss(step), "lr": 1e-3})
        if step % val_every == 0:
            extra = {k: f(step) for k, f in val_extra.items()}
            records.append({"split": "val", "step": step, "loss": val_loss(step), **extra})
    return records


def _kinds(analysis):
    return [f.code for f in analysis.findings]


def test_healthy_converging_run_has_no_findings():
    records = _records(lambda s: 0.1 + math.exp(-s / 60), lambda s: 0.15 + math.exp(-s / 60))
    analysis = analyse_curves(records)
    assert _kinds(analysis) == []
    assert analysis.best["step"] == 500


def test_overfitting_points_at_the_best_step_with_numbers():
    records = _records(lambda s: math.exp(-s / 80), lambda s: 0.3 + (s - 200) ** 2 / 1e5)
    [finding] = analyse_curves(records).findings
    assert finding.code == "overfitting" and finding.severity == "warn"
    assert finding.evidence["best_step"] == 200 and finding.evidence["evals_since_best"] == 6
    assert finding.evidence["gap_at_end"] > finding.evidence["gap_at_best"]
    assert "Stop at step 200" in finding.fixes[0] and "early_stopping" in finding.fixes[0]
    # with early stopping on, it was already handled: the advice changes and it is no longer a warning
    caught = analyse_curves(records, early_stopping=True).findings[0]
    assert caught.severity == "info" and "checkpoint `best`" in caught.fixes[0]


def test_val_loss_rising_while_train_loss_also_rises_is_not_called_overfitting():
    records = _records(lambda s: 0.2 + s / 1000, lambda s: 0.3 + (s - 200) ** 2 / 1e5)
    assert "overfitting" not in _kinds(analyse_curves(records))


def test_underfitting_fell_a_little_then_levelled_off():
    records = _records(lambda s: 0.69 * (0.75 + 0.25 * math.exp(-s / 100)), lambda s: 0.56)
    analysis = analyse_curves(records)
    assert _kinds(analysis) == ["underfitting"]
    finding = analysis.findings[0]
    assert 0.7 < finding.evidence["share_kept"] < 0.9 and "optim.lr" in finding.fixes[0]


def test_a_loss_that_does_not_fall_is_flat_not_underfitting():
    analysis = analyse_curves(_records(lambda s: 0.69 - s / 1e5, lambda s: 0.70))
    assert _kinds(analysis) == ["loss_flat"] and analysis.findings[0].evidence["drop"] < 0.1


def test_divergence_nonfinite_loss_is_an_error_at_its_step():
    records = _records(lambda s: float("nan") if s >= 300 else 1 / s, lambda s: 0.5)
    [finding] = [f for f in analyse_curves(records).findings if f.code == "loss_nonfinite"]
    assert finding.severity == "error" and finding.step == 300 and "optim.lr" in finding.fixes[0]


def test_divergence_loss_climbing_above_its_start():
    records = _records(lambda s: 1.0 - s / 500 if s < 200 else 0.6 + (s - 200) / 100, lambda s: 0.5)
    [finding] = [f for f in analyse_curves(records).findings if f.code == "loss_diverging"]
    assert finding.evidence["min_step"] <= 200 and finding.evidence["last_loss"] > finding.evidence["start_loss"]
    assert finding.evidence["lr_at_turn"] == 1e-3


def test_noisy_validation_zigzag():
    jitter = {50 * k: (0.08 if k % 2 else -0.08) for k in range(1, 11)}
    records = _records(lambda s: 0.5 - s / 2000, lambda s: 0.5 - s / 20000 + jitter[s])
    analysis = analyse_curves(records)
    assert "noisy_validation" in _kinds(analysis)
    finding = analysis.findings[_kinds(analysis).index("noisy_validation")]
    assert finding.evidence["direction_changes"] >= 7 and "val_fraction" in finding.fixes[0]


def test_best_point_follows_the_monitor_direction():
    accuracy = {50 * k: v for k, v in enumerate([0.5, 0.7, 0.9, 0.8, 0.85, 0.6, 0.6, 0.6, 0.6, 0.6], 1)}
    records = _records(lambda s: 1 / s, lambda s: 1 / s, accuracy=lambda s: accuracy[s])
    assert best_point(records, "val/accuracy") == {"metric": "val/accuracy", "value": 0.9, "step": 150}
    assert best_point(records, "val/loss")["step"] == 500
    assert best_point([], "val/loss") is None


def test_still_improving_suggests_training_longer():
    records = _records(lambda s: 2 * math.exp(-s / 300), lambda s: 2 * math.exp(-s / 300) + 0.1)
    analysis = analyse_curves(records)
    assert _kinds(analysis) == ["still_improving"]
    assert "max_steps" in analysis.findings[0].fixes[0]
    assert np.isfinite(analysis.to_dict()["best"]["value"])


def test_the_best_point_follows_the_config_s_lower_is_better_rule():
    """Curves, early stopping and ablations pick the best value the same way: config's `lower_is_better`."""
    from trainwise.config import EvalConfig
    from trainwise.evaluate.compare import EVAL_METRICS

    for metric in (*EVAL_METRICS, "loss", "median_rank", "macro_f1"):
        records = [{"split": "val", "step": s, metric: v} for s, v in ((10, 3.0), (20, 1.0), (30, 2.0))]
        expected = 20 if EvalConfig(monitor=f"val/{metric}").monitor_mode == "min" else 10
        assert best_point(records, f"val/{metric}")["step"] == expected, metric
    assert best_point([{"split": "val", "step": 1, "ece": 0.2}, {"split": "val", "step": 2, "ece": 0.1}],
                      "val/ece")["step"] == 2
