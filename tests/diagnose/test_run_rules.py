"""Convergence and fit, diagnosed from run directories written through RunDir: each fault is found at its
step with its numbers, and a healthy run stays silent."""
from __future__ import annotations

import math

import pytest

from tests.diagnose.synthetic_run import GIB, codes, gpu_samples, make_run, only
from trainwise.diagnose.convergence import FLAT_MIN_DROP
from trainwise.findings import SEVERITY_ORDER
from trainwise.diagnose.run_rules import diagnose_run, live_findings
from trainwise.errors import RunDirError


def _diverging(step):
    return 0.1 + math.exp(-step / 80) if step < 200 else 0.1 + math.exp(-200 / 80) + (step - 200) / 100


FAULTS = {
    "loss_nonfinite": dict(train_loss=lambda s: float("nan") if s >= 300 else 0.1 + math.exp(-s / 80)),
    "loss_diverging": dict(train_loss=_diverging, grad_norm=lambda s: 60.0 if s == 210 else 1.0,
                           lr=lambda s: 3e-3),
    "loss_flat": dict(train_loss=lambda s: 0.69, val_loss=lambda s: 0.70),
    "loss_oscillating": dict(train_loss=lambda s: 0.6 + (0.3 if (s // 10) % 2 else 0.0) - s / 5000,
                             val_loss=lambda s: 0.7),
    "gradient_spikes": dict(grad_norm=lambda s: 40.0 if s == 300 else 1.0),
    "overfitting": dict(train_loss=lambda s: math.exp(-s / 80), val_loss=lambda s: 0.3 + (s - 200) ** 2 / 1e5,
                        overrides=["eval.early_stopping.enabled=false"]),
    "underfitting": dict(train_loss=lambda s: 0.69 * (0.75 + 0.25 * math.exp(-s / 100)), val_loss=lambda s: 0.56),
}


def test_a_healthy_run_has_no_findings(tmp_path):
    assert diagnose_run(make_run(tmp_path / "run", samples=gpu_samples(),
                                 summary={"device": "cuda:0", "precision": "bf16"})) == []


@pytest.mark.parametrize("code", FAULTS)
def test_each_fault_is_found_with_its_step_and_numbers(tmp_path, code):
    findings = diagnose_run(make_run(tmp_path / "run", **FAULTS[code]))
    finding = only(findings, code)
    assert finding.step is not None and finding.fixes and finding.title and finding.detail
    numbers = [v for v in finding.evidence.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers, f"{code} has no numbers in its evidence: {finding.evidence}"
    # worst first
    assert [SEVERITY_ORDER[f.severity] for f in findings] == sorted((SEVERITY_ORDER[f.severity] for f in findings),
                                                                   reverse=True)


def test_nonfinite_loss_is_an_error_at_its_step_and_silences_the_rest(tmp_path):
    findings = diagnose_run(make_run(tmp_path / "run", **FAULTS["loss_nonfinite"]))
    finding = only(findings, "loss_nonfinite")
    assert finding.severity == "error" and finding.step == 300 and finding.evidence["lr"] == 1e-3
    assert not {"loss_diverging", "loss_flat", "underfitting"} & set(codes(findings))


def test_diverging_names_the_turn_the_lr_and_the_gradient_spike(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["loss_diverging"])), "loss_diverging")
    assert finding.severity == "error" and 200 <= finding.step <= 260
    assert finding.evidence["lr_at_turn"] == 3e-3
    assert "0.003" in finding.fixes[0] and f"before step {finding.step}" in finding.fixes[0]
    assert finding.evidence["grad_norm_spikes"] == 1 and finding.evidence["largest_grad_spike"]["step"] == 210
    assert finding.evidence["grad_norm_max"] == 60.0 and finding.evidence["grad_norm_median"] == 1.0


def test_flat_loss_quotes_the_drop_and_the_lr_and_points_at_the_inputs(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["loss_flat"])), "loss_flat")
    assert finding.evidence["drop"] < FLAT_MIN_DROP and finding.evidence["lr"] == 1e-3
    assert finding.evidence["warmup_steps"] == 20 and finding.evidence["start_step"] == 30  # after the warmup
    assert any("trainwise lr-find" in fix for fix in finding.fixes)
    assert any("labels" in fix for fix in finding.fixes)
    assert "underfitting" not in codes(diagnose_run(make_run(tmp_path / "again", **FAULTS["loss_flat"])))


def test_a_loss_flat_only_during_warmup_is_not_flat(tmp_path):
    warm = make_run(tmp_path / "run", train_loss=lambda s: 0.69 if s <= 100 else 0.1 + 0.59 * math.exp(-(s - 100) / 50),
                    overrides=["schedule.warmup_steps=100"])
    assert "loss_flat" not in codes(diagnose_run(warm))


def test_oscillation_is_a_warning_with_the_swing(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["loss_oscillating"])), "loss_oscillating")
    assert finding.severity == "warn" and finding.evidence["direction_changes"] >= 30
    assert finding.evidence["mean_swing"] > 0.2 and finding.evidence["lr"] == 1e-3
    assert "loss_flat" not in codes(diagnose_run(make_run(tmp_path / "again", **FAULTS["loss_oscillating"])))


def test_a_gradient_spike_is_measured_against_the_running_median(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["gradient_spikes"])), "gradient_spikes")
    assert finding.step == 300 and finding.evidence["first_spike"]["ratio"] == pytest.approx(40.0)
    # a gradient norm that only drifts upwards (3× over the run) is not a spike
    drift = make_run(tmp_path / "drift", grad_norm=lambda s: 1.0 + 2 * s / 500)
    assert "gradient_spikes" not in codes(diagnose_run(drift))


def test_overfitting_names_the_turn_the_gap_and_early_stopping_first(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["overfitting"])), "overfitting")
    assert finding.severity == "warn" and finding.step == 200 and finding.evidence["best_step"] == 200
    assert finding.evidence["gap_at_end"] > finding.evidence["gap_at_best"]
    assert [w for fix in finding.fixes for w in ("early_stopping", "augment", "weight_decay", "more examples")
            if w in fix] == ["early_stopping", "augment", "weight_decay", "more examples"]
    # the breast-cancer recipe has early stopping on: then it was handled, and only worth knowing
    caught = only(diagnose_run(make_run(tmp_path / "caught", **{**FAULTS["overfitting"], "overrides": []})),
                  "overfitting")
    assert caught.severity == "info" and "checkpoint `best`" in caught.fixes[0]


def test_val_loss_rising_with_train_loss_is_not_overfitting(tmp_path):
    run = make_run(tmp_path / "run", train_loss=lambda s: 0.2 + s / 1000, val_loss=lambda s: 0.3 + (s - 200) ** 2 / 1e5)
    assert "overfitting" not in codes(diagnose_run(run))


def test_underfitting_a_loss_that_fell_a_little_and_levelled_off(tmp_path):
    finding = only(diagnose_run(make_run(tmp_path / "run", **FAULTS["underfitting"])), "underfitting")
    assert 0.7 < finding.evidence["share_kept"] < 0.9 and finding.evidence["end_val_loss"] == 0.56
    assert finding.step == finding.evidence["plateau_from_step"] and "optim.lr" in finding.fixes[0]


def test_unknown_dir_and_run_without_metrics_are_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        diagnose_run(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()
    run = make_run(tmp_path / "run")
    run.metrics_path.unlink()
    before = sorted(p.name for p in run.path.iterdir())
    with pytest.raises(RunDirError, match="no metrics yet"):
        diagnose_run(run.path)
    assert sorted(p.name for p in run.path.iterdir()) == before


def test_live_findings_use_the_same_rules_on_the_records_in_hand(tmp_path):
    run = make_run(tmp_path / "run", **FAULTS["loss_diverging"])
    records = run.read_metrics()
    assert "loss_diverging" in codes(live_findings(records))
    healthy = make_run(tmp_path / "healthy", val_loss=lambda s: 2 * math.exp(-s / 300) + 0.1).read_metrics()
    assert live_findings(healthy) == []  # "still improving" is for the end of a run, not the middle
    leak = gpu_samples(name="", ram=lambda s: 8 * GIB + s * 20 * 2**20)
    assert codes(live_findings(records[:10], leak)) == ["memory_leak"]


def _chance_run(path, *, spike: bool, accuracy: float):
    from trainwise.diagnose.task_profile import classification_profile
    from trainwise.recipes import load_recipe
    from trainwise.rundir.layout import RunDir

    run = RunDir.create(path, overwrite=True)
    run.write_config(load_recipe("digits", ["train.max_steps=120", "schedule.warmup_steps=0"]))
    run.write_summary({"status": "completed", "task": classification_profile(10).to_dict()})
    for step in range(5, 125, 5):
        loss = 1260.0 if spike and step == 5 else (2.303 if step > 10 else 3.2)
        run.log_metrics({"split": "train", "step": step, "epoch": 0, "loss": loss * (1 + 0.001 * (step % 3)),
                         "lr": 0.3, "grad_norm": 0.1})
        if step % 20 == 0:
            run.log_metrics({"split": "val", "step": step, "epoch": 0, "loss": 2.303, "accuracy": accuracy,
                             "balanced_accuracy": accuracy})
    return run


def test_a_classifier_stuck_at_chance_after_an_lr_spike_is_named(tmp_path):
    from trainwise.diagnose.run_rules import diagnose_run

    found = {f.code: f for f in diagnose_run(_chance_run(tmp_path / "r", spike=True, accuracy=0.1))}
    finding = found["loss_at_chance"]
    assert finding.severity == "error" and finding.evidence["classes"] == 10
    assert finding.evidence["peak_loss"] > 1000 and finding.evidence["peak_step"] == 5
    assert "blew the weights up" in finding.detail and "optim.lr" in finding.fixes[0]


def test_a_classifier_that_learns_is_not_at_chance(tmp_path):
    from trainwise.diagnose.run_rules import diagnose_run

    codes = {f.code for f in diagnose_run(_chance_run(tmp_path / "r", spike=True, accuracy=0.9))}
    assert "loss_at_chance" not in codes
