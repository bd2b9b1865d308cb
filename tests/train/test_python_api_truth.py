"""The Python API tells the truth (issue 26): float targets mean regression, a run records what it really
trained, a monitor typo fails before step 1, and the CLI says what it cannot redo for such a run."""
from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import RunDir, Trainer
from trainwise.config import config_from_dict
from trainwise.errors import ConfigError

CONFIG = {"train": {"max_steps": 40, "batch_size": 32, "log_every": 10, "device": "cpu"},
          "optim": {"lr": 0.05}, "telemetry": {"enabled": False}, "eval": {"every_steps": 20}}


def _regression_data(n=200):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=generator)
    return TensorDataset(x, y)


def test_float_targets_with_one_output_train_as_regression_and_validate(tmp_path):
    torch.manual_seed(0)
    run = RunDir.create(tmp_path / "r")
    summary = Trainer(nn.Linear(4, 1), _regression_data(), val_data=_regression_data(64), run_dir=run,
                      config=config_from_dict(CONFIG)).fit()
    train = [r for r in run.read_metrics() if r["split"] == "train"]
    assert train[0]["loss"] > 0 and train[-1]["loss"] < train[0]["loss"] / 2 and train[-1]["grad_norm"] > 0
    assert summary["status"] == "completed" and "mae" in summary["final"] and summary["task"]["kind"] == "regression"


def test_a_run_made_from_python_records_its_own_model_and_data_and_no_sanity_check(tmp_path):
    run = RunDir.create(tmp_path / "r")
    Trainer(nn.Linear(4, 1), _regression_data(), val_data=_regression_data(64), run_dir=run,
            config=config_from_dict(CONFIG)).fit()
    config = yaml.safe_load(run.config_path.read_text())
    assert config["model"]["name"] == "python:torch.nn.modules.linear.Linear"
    assert config["data"]["name"] == "python:torch.utils.data.dataset.TensorDataset"
    assert config["data"]["args"] == {"train_samples": 200, "val_samples": 64}
    assert config["train"]["sanity"] is False


def test_the_cli_says_it_cannot_rebuild_a_python_run(tmp_path):
    from trainwise.evaluate.run_eval import evaluate_run

    run = RunDir.create(tmp_path / "r")
    Trainer(nn.Linear(4, 1), _regression_data(), run_dir=run, config=config_from_dict(CONFIG)).fit()
    with pytest.raises(ConfigError, match="trained from Python.*cannot build them again"):
        evaluate_run(run.path)


def test_a_monitor_typo_fails_before_step_1_with_the_name_meant(tmp_path):
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    with pytest.raises(ConfigError, match="did you mean val/accuracy|Did you mean val/accuracy"):
        Trainer(nn.Linear(4, 3), TensorDataset(x, y), val_data=TensorDataset(x, y), run_dir=RunDir(tmp_path / "r"),
                config=config_from_dict({**CONFIG, "eval": {"monitor": "val/acc"}}))
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_the_report_of_a_python_run_says_what_the_cli_can_and_cannot_redo(tmp_path):
    from trainwise.evaluate.report import write_report

    run = RunDir.create(tmp_path / "r")
    Trainer(nn.Linear(4, 1), _regression_data(), run_dir=run, config=config_from_dict(CONFIG)).fit()
    for fmt in ("md", "html"):
        text = write_report(run, fmt=fmt).read_text()
        assert "Trained from Python on your own model (torch.nn.modules.linear.Linear)" in text
        assert "No test evaluation yet" not in text and "train samples 200" in text
