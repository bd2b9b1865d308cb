"""The learning-rate range test: the curve arithmetic on synthetic losses, then a real sweep on breast-cancer."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.check import lr_find as finder
from trainwise.diagnose import lr_curve
from trainwise.errors import ConfigError, RunDirError, TrainingError


def _synthetic_curve(steps: int = 100, best_lr: float = 1e-2):
    """A range test as it looks: flat at tiny rates, a valley in log-lr centred on `best_lr`, then a blow-up."""
    lrs = [lr_curve.lr_at(i, steps, 1e-6, 10.0) for i in range(steps)]
    losses = []
    for lr in lrs:
        distance = math.log10(lr / best_lr)  # decades from the valley's floor
        valley = 1.0 - 0.8 * math.exp(-distance ** 2 / 2)
        blow_up = 50.0 * max(0.0, distance - 0.5) ** 2
        losses.append(valley + blow_up)
    return lrs, losses


def test_the_sweep_is_exponential_from_min_to_max():
    lrs = [lr_curve.lr_at(i, 7, 1e-6, 1.0) for i in range(7)]
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1.0)
    ratios = [b / a for a, b in zip(lrs, lrs[1:])]
    assert ratios == pytest.approx([10.0] * 6)


def test_smoothing_is_bias_corrected():
    # without the correction the first values would be 0.1×, 0.19×... of a constant loss
    assert lr_curve.smooth([2.0, 2.0, 2.0], beta=0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert lr_curve.smooth([1.0, 3.0], beta=0.0) == [1.0, 3.0]
    smoothed = lr_curve.smooth([1.0, 0.0] * 20, beta=0.9)
    assert max(smoothed[10:]) - min(smoothed[10:]) < 0.2  # the zig-zag is averaged out


def test_divergence_is_the_first_point_past_four_times_the_best():
    assert lr_curve.divergence_index([1.0, 0.5, 0.3, 1.1, 1.3]) == 4  # 1.3 > 4 × 0.3; 1.1 is not
    assert lr_curve.divergence_index([1.0, 0.9, float("nan")]) == 2
    assert lr_curve.divergence_index([1.0, 0.9, 0.8]) is None


def test_the_suggestion_is_the_smoothed_minimum_over_ten_on_a_synthetic_curve():
    lrs, losses = _synthetic_curve(best_lr=1e-2)
    smoothed = lr_curve.smooth(losses, beta=0.0)
    suggestion = lr_curve.suggest_lr(lrs, smoothed)
    step = lrs[1] / lrs[0]  # one point of the sweep
    assert 1e-3 / step <= suggestion <= 1e-3 * step


def test_the_suggestion_ignores_noise_once_smoothed():
    lrs, losses = _synthetic_curve(best_lr=1e-3)
    noise = torch.Generator().manual_seed(0)
    noisy = [loss + 0.15 * float(torch.randn((), generator=noise)) for loss in losses]
    suggestion = lr_curve.suggest_lr(lrs, lr_curve.smooth(noisy))
    # the average lags the curve by a few points (to the right); with the noise, less than half a decade
    assert 1e-4 / 3 < suggestion < 1e-4 * 3


def test_default_steps_shrink_with_small_data():
    assert lr_curve.default_steps(steps_per_epoch=1000) == lr_curve.MAX_STEPS
    assert lr_curve.default_steps(steps_per_epoch=11) == 88
    assert lr_curve.default_steps(steps_per_epoch=2) == lr_curve.MIN_STEPS


def _breast_cancer():
    return tiny_config(model={"name": "mlp", "args": {"hidden": [32], "dropout": 0.0}})


def test_a_real_sweep_stops_on_divergence_and_writes_json_and_png(tmp_path):
    settings = lr_curve.SweepSettings(min_lr=1e-5, max_lr=100.0, steps=60)
    result = finder.lr_find_config(_breast_cancer(), settings)

    assert result.diverged and len(result.lrs) < 60 and result.lrs[-1] < settings.max_lr
    assert len(result.lrs) == len(result.losses) == len(result.smoothed)
    finite = [s for s in result.smoothed if math.isfinite(s)]
    assert min(finite) < 0.8 * result.smoothed[0]  # the loss did fall somewhere in the sweep
    lr_of_min = result.lrs[result.smoothed.index(min(finite))]
    assert result.suggestion == pytest.approx(lr_of_min / 10)
    assert result.override == f"optim.lr={result.suggestion:.3g}"

    out = tmp_path / "lr"
    json_path, png_path = finder.write_outputs(result, out)
    record = json.loads(json_path.read_text())
    assert record["suggestion"] == pytest.approx(result.suggestion) and record["override"] == result.override
    assert record["diverged"] is True and len(record["lrs"]) == len(record["losses"]) == len(record["smoothed"])
    assert record["context"] == {"optimizer": "adamw", "batch_size": 32, "precision": "fp32", "device": "cpu"}
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["lr_find.json", "lr_find.png"]  # no temporary files left


def test_the_sweep_trains_a_copy_and_leaves_the_model_alone():
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(128, 5)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    result = finder.sweep(model, data, config=tiny_config(), settings=lr_curve.SweepSettings(steps=20))
    assert len(result.lrs) <= 20
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_task_without_a_loss_is_refused_before_any_step():
    model = nn.Linear(5, 2)
    data = torch.utils.data.TensorDataset(torch.randn(64, 5), torch.zeros(64, dtype=torch.long))
    with pytest.raises(ConfigError, match="needs a loss"):
        finder.sweep(model, data, config=tiny_config(), task="embedding")
    frozen = nn.Linear(5, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        finder.sweep(frozen, data, config=tiny_config())


class _NaNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 2)

    def forward(self, x):
        return self.linear(x) * float("nan")


def test_a_loss_that_is_never_finite_is_a_clear_error():
    data = torch.utils.data.TensorDataset(torch.randn(64, 5), torch.zeros(64, dtype=torch.long))
    with pytest.raises(TrainingError, match="not finite"):
        finder.sweep(_NaNModel(), data, config=tiny_config(), settings=lr_curve.SweepSettings(steps=10))


@pytest.mark.parametrize("kwargs, message", [
    ({"min_lr": 1.0, "max_lr": 0.1}, "--min-lr < --max-lr"),
    ({"min_lr": 0.0}, "--min-lr < --max-lr"),
    ({"steps": 3}, "at least 10"),
])
def test_bad_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        lr_curve.SweepSettings(**kwargs).check()


def test_a_run_directory_takes_its_first_lr_range_test_without_overwrite(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    (run / "metrics.jsonl").write_text("")
    finder.refuse_out_dir(run, overwrite=False)  # the report then shows the test beside the run
    (run / "lr_find.json").write_text("{}")
    with pytest.raises(RunDirError, match="already holds files"):  # a second one replaces the first: say so
        finder.refuse_out_dir(run, overwrite=False)


def test_an_existing_out_dir_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds files"):
        finder.refuse_out_dir(tmp_path, overwrite=False)
    finder.refuse_out_dir(tmp_path, overwrite=True)
    finder.refuse_out_dir(tmp_path / "new", overwrite=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        finder.refuse_out_dir(tmp_path / "file", overwrite=True)
    with pytest.raises(RunDirError, match="cannot write there"):  # under a file: found before the sweep
        finder.refuse_out_dir(tmp_path / "file" / "lr", overwrite=False)
